"""Every experiment, run twice with the same seed on the CPU, gives the same results (issue: determinism).

Timings differ from run to run by nature; their fields are left out of the comparison, by name."""

import dataclasses
import json

import pytest
import torch

from course_lib.device import SizeProfile
from course_lib.experiments import EXPERIMENTS, get_experiment, run_experiment
from course_lib.results import to_jsonable

# experiments that measure time or speed: compared without their timing fields
TIMING_KEYS = {"seconds", "median_s", "q25_s", "q75_s", "repeats", "tflops", "step_seconds", "harness_s",
               "torch_timer_s", "copy_bandwidth_gbs", "tokens_per_s", "tokens_per_second", "mfu", "self_seconds",
               "self_cpu_time_total", "cpu_time_total", "cuda_time_total", "time_share", "share", "top",
               "cast_share", "table", "peak_memory_bytes", "time_to_target_s",
               "plain_s", "locator_s", "anomaly_s"}   # a NaN hunt's step times (monitor_faults)
# nothing but timings, or numbers derived from a timing (the model ladder's predictions for this CPU rest on its
# measured matmul throughput, and its skips quote the measured FP8/BF16 ratio)
SKIP = {"matmul_throughput", "fp8_linear_speed", "profiled_step", "monitor_overhead", "fp8_compiled_speed",
        "mx_emulation_cost", "scale_ladder"}


def _without_timing(value):
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def _one_seed_run(name, profile):
    """The registered experiment with its registry parameters, on its first seed only where it runs several:
    a run that is not reproducible shows on one seed, and the lessons run every seed anyway."""
    experiment = get_experiment(name)
    parameters = experiment.parameters_for(profile, "cpu")
    if len(parameters.get("seeds", ())) > 1:
        parameters["seeds"] = tuple(parameters["seeds"])[:1]
    return experiment.study(profile, torch.device("cpu"), **parameters)


@pytest.mark.parametrize("name", sorted(n for n, e in EXPERIMENTS.items() if not e.requires_cuda and n not in SKIP))
def test_experiment_is_deterministic(name):
    profile = SizeProfile("small", max_steps=5)
    first, second = (json.dumps(_without_timing(to_jsonable(_one_seed_run(name, profile))), sort_keys=True)
                     for _ in range(2))
    assert first == second


def test_the_one_seed_run_is_the_registered_run_cut_to_its_first_seed():
    profile = SizeProfile("small", max_steps=2)
    one = _one_seed_run("convergence_parity", profile)
    assert one.seeds == (0,) and one == dataclasses.replace(
        run_experiment("convergence_parity", profile, "cpu"), seeds=(0,),
        final_losses={k: v[:1] for k, v in one.final_losses.items()})
