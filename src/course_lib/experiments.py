"""The registry: every experiment of the course, once, with its parameters per size profile.

A lesson and ``python -m course_lib.record`` run an experiment the same way: :func:`run_experiment` calls
the registered study with the registry's parameters for the profile and returns the study's typed result.
A record stores ``to_jsonable(result)``; :meth:`Experiment.load` reads a record back into the same type
(records written before that format, schema version 1, through the experiment's ``legacy`` reader), so one
figure or table function draws the live run and the recorded one. Records are never edited.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import torch

from .device import SizeProfile, describe_hardware
from .formats import TF32Check, tf32_matmul_check
from .jsonable import from_jsonable, to_jsonable
from .models import profile_model
from .results import (
    NO_COURSE_MODEL,
    SCHEMA_VERSION,
    Record,
    RecordedResult,
    capture_provenance,
    load_records,
    save_record,
)
from .studies.amp import AutocastOps, autocast_ops
from .studies.bf16 import Parity, UpdateComparison, compare_bf16_updates, convergence_parity
from .studies.data_loading import DataLoading, data_loading
from .studies.fp16_divergence import Fp16Divergence, fp16_divergence
from .studies.ladder import ScaleLadder, ladder_sizes, scale_ladder
from .studies.lesson_times import (
    LESSON_ENV,
    RECORD_COMMAND_ENV,
    RECORD_DIR_ENV,
    LessonTimes,
    lesson_times,
    lesson_times_parameters,
)
from .studies.distributed import DataParallelStudy, ReductionStudy, data_parallel_study, reduction_precision_study
from .studies.formats import TrainingMagnitudes, measure_training_magnitudes
from .studies.fp8 import (
    Fp8LinearSpeed,
    Fp8ScalingLab,
    Fp8Training,
    capture_linear_tensors,
    fp8_linear_speed,
    fp8_training,
    lab_block,
    scaling_lab_study,
)
from .studies.fp8_speed import Fp8CompiledSpeed, compiled_speed_parameters, fp8_compiled_speed
from .studies.fp8_speed_prose import ONE_PASS_CASTS_SINCE
from .studies.clipping import SpikyRuns, clipping_sizes, spiky_clipping_runs
from .studies.loss_scaling import FlightRecording, record_grad_scaler_run
from .studies.microscaling import (
    EmulationCost,
    MxBlockStudy,
    block_scaled_training,
    emulation_step_ratio,
    mx_block_study,
)
from .studies.monitoring import MonitorFaults, MonitorOverhead, monitor_faults, monitor_overhead
from .studies.monitoring_prose import BATCHED_MONITOR_SINCE
from .studies.performance import (
    MatmulThroughput,
    ProfiledSteps,
    ThroughputStudy,
    TrainingMemory,
    matmul_throughput,
    profiled_steps,
    training_memory,
    training_throughput,
)
from .studies.underflow import UnderflowStatistics, train_and_capture, underflow_statistics
from .train import runnable_recipes


Parameters = Callable[[SizeProfile, torch.device], dict[str, Any]]


def _no_parameters(profile: SizeProfile, device: torch.device) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class ExperimentOutput:
    """What one run gives a record: the parameters it ran with and its values (``{"result": ...}``)."""

    parameters: dict[str, Any]
    values: dict[str, Any]


@dataclass(frozen=True)
class CodeChange:
    """A change to the code an experiment times or counts, made on ``since`` (ISO date): records dated before
    it measured the earlier code, which ``what`` describes ("... timed ...")."""

    since: str
    what: str

    def __post_init__(self) -> None:
        try:
            date.fromisoformat(self.since)
        except (TypeError, ValueError):
            raise ValueError(f"since must be an ISO date such as '2026-11-25', got {self.since!r}") from None
        if not self.what:
            raise ValueError("a code change must say what changed")


@dataclass(frozen=True)
class Experiment:
    """A registered experiment: ``study(profile, device, **parameters(profile, device))`` returns a
    ``result_type``; ``legacy(parameters, values)`` turns a version-1 record into that type's JSON form;
    ``code_changes`` are the changes to the measured code that make older records of it records of older
    code."""

    name: str
    description: str
    study: Callable[..., Any]
    result_type: Any
    parameters: Parameters = _no_parameters
    requires_cuda: bool = False
    legacy: Callable[[dict, dict], Any] | None = None
    code_changes: tuple[CodeChange, ...] = ()

    def older_code(self, record: Record | RecordedResult) -> list[str]:
        """What changed in the measured code since ``record`` of this experiment was made: the ``what`` of
        each of :attr:`code_changes` its date precedes (empty for a record of today's code)."""
        rec = record.record if isinstance(record, RecordedResult) else record
        if rec.experiment != self.name:
            raise ValueError(f"a {rec.experiment!r} record is not a {self.name!r} record")
        return [c.what for c in self.code_changes if rec.provenance.date[:10] < c.since]

    def parameters_for(self, profile: SizeProfile, device: torch.device | str) -> dict[str, Any]:
        """The registry's parameters for ``profile`` on ``device`` (the recipes it runs depend on it)."""
        if not isinstance(profile, SizeProfile):
            raise TypeError(f"profile must be a SizeProfile, got {type(profile).__name__}")
        return dict(self.parameters(profile, torch.device(device)))

    def run(self, profile: SizeProfile, device: torch.device | str) -> Any:
        device = torch.device(device)
        if self.requires_cuda and device.type != "cuda":
            raise ValueError(f"experiment {self.name!r} needs a CUDA GPU; this run's device is {device.type}")
        return self.study(profile, device, **self.parameters_for(profile, device))

    def load(self, record: Record) -> Any:
        """The result a record holds, as ``result_type``; ``ValueError`` naming what does not fit."""
        if record.experiment != self.name:
            raise ValueError(f"a {record.experiment!r} record is not a {self.name!r} result")
        if record.schema_version >= SCHEMA_VERSION:
            if set(record.values) != {"result"}:
                raise ValueError(f"{record.path}: values must hold just 'result', got {sorted(record.values)}")
            data = record.values["result"]
        elif self.legacy is not None:
            try:
                data = self.legacy(record.parameters, record.values)
            except (KeyError, TypeError, IndexError) as exc:
                raise ValueError(f"{record.path}: not a {self.name!r} record ({exc!r})") from None
        else:
            raise ValueError(f"{record.path}: {self.name!r} has no reader for schema version "
                             f"{record.schema_version}")
        return from_jsonable(self.result_type, data)


EXPERIMENTS: dict[str, Experiment] = {}


def register(name: str, description: str, *, result_type: Any, parameters: Parameters = _no_parameters,
             requires_cuda: bool = False, legacy: Callable[[dict, dict], Any] | None = None,
             code_changes: tuple[CodeChange, ...] = ()):
    """Decorator registering a study function ``(profile, device, **parameters) -> result_type``."""
    def wrap(study: Callable[..., Any]) -> Callable[..., Any]:
        if name in EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is registered twice")
        EXPERIMENTS[name] = Experiment(name, description, study, result_type, parameters, requires_cuda, legacy,
                                       tuple(code_changes))
        return study
    return wrap


def get_experiment(name: str) -> Experiment:
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}") from None


def run_experiment(name: str, profile: SizeProfile, device: torch.device | str) -> Any:
    """Run a registered experiment with the registry's parameters for ``profile``; its typed result.
    Refuses clearly when it needs a GPU and ``device`` is not one. Where the environment names a folder in
    :data:`RECORD_DIR_ENV`, the run is also saved there as a record with its raw log."""
    out = os.environ.get(RECORD_DIR_ENV, "").strip()
    if not out:
        return get_experiment(name).run(profile, device)
    command = os.environ.get(RECORD_COMMAND_ENV, "").strip() or "a lesson executed with " + RECORD_DIR_ENV
    lesson = os.environ.get(LESSON_ENV, "").strip()
    where = f"lessons/{lesson}" if lesson else "a lesson"
    return record_experiment(name, profile, device, out=out,
                             command=f"{command} (executing {where}: run_experiment({name!r}))")[1]


def record_output(name: str, profile: SizeProfile, device: torch.device | str, *,
                  overrides: dict[str, Any] | None = None) -> ExperimentOutput:
    """Run a registered experiment for a record: its parameters (with the profile's name and, unless it is one
    of :data:`course_lib.results.NO_COURSE_MODEL`, the course model's shape at that profile,
    :func:`course_lib.models.profile_model`) and values.
    ``overrides`` replace some of the registry's parameters (``record --param``; checked by the caller)."""
    exp = get_experiment(name)
    if overrides:
        base = exp.parameters
        exp = dataclasses.replace(exp, parameters=lambda p, d: {**base(p, d), **overrides})
    model = {} if name in NO_COURSE_MODEL else {"course_model": profile_model(profile)}
    parameters = {"profile": profile.name, **model, **exp.parameters_for(profile, device)}
    return ExperimentOutput(parameters=to_jsonable(parameters), values={"result": exp.run(profile, device)})


def record_command(args: Sequence[str]) -> str:
    """The command line ``python -m course_lib.record ARGS`` as a record's provenance names it."""
    return " ".join(["python -m course_lib.record", *map(shlex.quote, args)])


def record_experiment(name: str, profile: SizeProfile, device, *, out: str | Path, command: str,
                      overrides: dict | None = None, heading: str | None = None) -> tuple[Path, Any]:
    """Run registered experiment ``name`` at ``profile`` on ``device`` and save its record under ``out``, with
    provenance naming ``command`` and the raw log of the run beside it (the lines are printed as they are
    logged); the record's path and the typed result. An exception of the run propagates, and nothing is
    saved. Used by ``python -m course_lib.record`` and by :func:`run_experiment` where a lesson executed by
    the GPU session records what it runs (:data:`course_lib.studies.lesson_times.RECORD_DIR_ENV`)."""
    hw = describe_hardware(device)
    log = io.StringIO()

    def say(line: str) -> None:
        stamped = f"[{time.strftime('%H:%M:%S')}] {line}"
        print(stamped, flush=True)
        log.write(stamped + "\n")

    say(f"{heading or f'experiment: {name}'} on {hw.summary}")
    say(f"command: {command}")
    provenance = capture_provenance(command, device)
    start = time.perf_counter()
    output = record_output(name, profile, device, overrides=overrides)
    elapsed = time.perf_counter() - start
    say(f"finished in {elapsed:.1f} s")
    say("parameters: " + json.dumps(to_jsonable(output.parameters)))
    say("values: " + json.dumps(to_jsonable(output.values)))
    capped = {"max_steps": profile.max_steps} if profile.max_steps is not None else {}
    changed = {"overrides": to_jsonable(overrides)} if overrides else {}
    record = Record(experiment=name, parameters={**output.parameters, "size": profile.name,
                                                 "seconds": elapsed, **capped, **changed},
                    values=output.values, provenance=provenance)
    return save_record(record, out, log_text=log.getvalue()), output.values["result"]


def recorded_results(name: str, *, device_type: str | None = "cuda",
                     results_dir: Any = None) -> list[RecordedResult]:
    """Every record of experiment ``name`` (GPU records by default), newest first, with its typed result."""
    exp = get_experiment(name)
    return [RecordedResult(r, exp.load(r))
            for r in load_records(name, results_dir, device_type=device_type)]


def _legacy_key(key: str) -> Callable[[dict, dict], Any]:
    """A version-1 record whose ``values[key]`` already was ``to_jsonable(result)``."""
    return lambda parameters, values: values[key]


def _legacy_whole(parameters: dict, values: dict) -> Any:
    return values


# ---- lesson 1: number formats ----------------------------------------------------------------------

@register("model_magnitudes",
          "Magnitudes (log2 histograms) of weights, activations, gradients and Adam moments of the "
          "course model after FP32 AdamW training (lesson 1).",
          result_type=TrainingMagnitudes, legacy=_legacy_key("magnitudes"))
def _model_magnitudes(profile: SizeProfile, device: torch.device) -> TrainingMagnitudes:
    return measure_training_magnitudes(profile, device)


@register("tf32_matmul_rounding",
          "A float32 matmul A @ I with TF32 enabled, compared bit for bit with course_lib's TF32 rounding "
          "of A under each rounding rule (lesson 1).", requires_cuda=True, result_type=TF32Check,
          parameters=lambda profile, device: {"n": profile.pick(small=256, full=4096)},
          legacy=_legacy_key("check"))
def _tf32_matmul_rounding(profile: SizeProfile, device: torch.device, *, n: int) -> TF32Check:
    return tf32_matmul_check(n, device)


# ---- lessons 2 and 3: underflow, loss scaling -----------------------------------------------------

@register("underflow_statistics",
          "Per-format underflow/overflow fractions of the course model's activation and weight gradients, "
          "first and last step of FP32 training, per layer and overall (lesson 2).",
          result_type=UnderflowStatistics,
          legacy=lambda parameters, values: {"losses": values["losses"], "steps": {
              key.split("_", 1)[1]: data for key, data in values["captures"].items()}})
def _underflow_statistics(profile: SizeProfile, device: torch.device) -> UnderflowStatistics:
    return underflow_statistics(train_and_capture(profile, device))


@register("scaler_flight_recording",
          "A real torch.amp.GradScaler run of the course model with FP16 autocast: scale, skipped steps and "
          "growth tracker per step; GradScaler's defaults at full size, a growth interval of 10 on the small "
          "profile so that a short run grows as well as backs off (lesson 3).",
          result_type=FlightRecording, legacy=_legacy_key("recording"),
          parameters=lambda profile, device: profile.pick(small={"growth_interval": 10}, full={}))
def _scaler_flight_recording(profile: SizeProfile, device: torch.device, **parameters: Any) -> FlightRecording:
    return record_grad_scaler_run(profile, device, **parameters)


# ---- lesson 4: autocast -------------------------------------------------------------------------------

@register("clipping_runs",
          "An FP16-autocast MLP under GradScaler with planted outlier batches, trained without clipping and with "
          "global-norm, per-value, per-tensor and adaptive clipping over seeds: loss, skipped steps, scale and "
          "gradient norms per step, held-out loss (lesson 3).",
          result_type=SpikyRuns,
          parameters=lambda profile, device: {**clipping_sizes(profile), "spike_factor": 300.0, "lr": 0.05})
def _clipping_runs(profile: SizeProfile, device: torch.device, **parameters: Any) -> SpikyRuns:
    return spiky_clipping_runs(profile, device, **parameters)


@register("autocast_trace",
          "Dtypes in and out of every op of the course model's forward and backward under CUDA FP16 "
          "autocast, and of softmax/layer_norm/exp/sum on a low-precision input (lesson 4).",
          requires_cuda=True, result_type=AutocastOps,
          legacy=lambda parameters, values: {"dtype": parameters["dtype"], **values})
def _autocast_trace(profile: SizeProfile, device: torch.device) -> AutocastOps:
    return autocast_ops(profile, device)


# ---- lesson 5: BF16 against FP16 ----------------------------------------------------------------------

def _parity_legacy(parameters: dict, values: dict) -> dict[str, Any]:
    return {"recipes": list(values["final_losses"]), "seeds": parameters["seeds"],
            "final_losses": values["final_losses"], "curves": values["curves"]}


@register("convergence_parity",
          "Final training loss of FP32, FP16+GradScaler, BF16 and FP16-without-scaler on the course model "
          "over three seeds, with loss curves (lesson 5).", result_type=Parity, legacy=_parity_legacy,
          parameters=lambda profile, device: {"seeds": (0, 1, 2), "steps": profile.pick(small=12, full=120)})
def _convergence_parity(profile: SizeProfile, device: torch.device, **parameters: Any) -> Parity:
    return convergence_parity(profile, device, **parameters)


@register("fp16_divergence",
          "The course model trained with FP16 autocast and GradScaler until its loss is not finite, its "
          "attention written out (q k^T, then the 1/sqrt(d) scale) against fused (SDPA), over seeds, with each "
          "layer's largest q.k on the way; the first failing step re-run under the op-level locator and with "
          "q scaled first, SDPA, BF16 and FP32 (lesson 5). Both profiles train at a higher learning rate than the "
          "course's other runs, so that the failure shows within the steps a lesson can afford; the small "
          "profile also on smaller batches, since a CPU without FP16 instructions multiplies in FP16 slowly.",
          result_type=Fp16Divergence,
          parameters=lambda profile, device: {"seeds": (0, 1, 2), **profile.pick(
              small={"lr": 0.1, "steps": 200, "batch_size": 4}, full={"lr": 1e-2, "steps": 250})})
def _fp16_divergence(profile: SizeProfile, device: torch.device, **parameters: Any) -> Fp16Divergence:
    return fp16_divergence(profile, device, **parameters)


@register("bf16_update_stagnation",
          "The course model with BF16 weights: round-to-nearest updates against FP32 master weights, "
          "Kahan compensation and stochastic rounding, with the share of lost updates (lesson 5).",
          result_type=UpdateComparison, parameters=lambda profile, device: {"seeds": (0, 1, 2)})
def _bf16_update_stagnation(profile: SizeProfile, device: torch.device, **parameters: Any) -> UpdateComparison:
    return compare_bf16_updates(profile, device, **parameters)


# ---- lesson 6: performance and memory -----------------------------------------------------------------

@register("matmul_throughput",
          "Square matmul throughput per dtype (FP32 with TF32 off, TF32, BF16, FP16, FP8 via _scaled_mm) over "
          "aligned and misaligned sizes, copy bandwidth, and a cross-check against "
          "torch.utils.benchmark.Timer (lesson 6).", result_type=MatmulThroughput,
          legacy=lambda parameters, values: {"sizes": parameters["sizes"], "cross_check_n": parameters["cross_check_n"],
                                             **values})
def _matmul_throughput(profile: SizeProfile, device: torch.device) -> MatmulThroughput:
    return matmul_throughput(profile, device)


def _throughput_parameters(profile: SizeProfile, device: torch.device) -> dict[str, Any]:
    # a CPU has no TF32 and a V100 or T4 no BF16: runnable_recipes keeps what this device runs
    return {"recipes": runnable_recipes(device, ("fp32", "tf32", "bf16_autocast", "fp16_autocast_scaler")),
            "seeds": profile.pick(small=(0, 1), full=(0, 1, 2)), "steps": profile.pick(small=16, full=60),
            "warmup_steps": 3, "compiled": ("bf16_autocast",) if device.type == "cuda" else ()}


def _throughput_legacy(parameters: dict, values: dict) -> dict[str, Any]:
    runs = [{"peak_memory_bytes": None, **run} for run in values["runs"]]
    return {"device": "recorded", "runs": runs, "flops_per_token": values["flops_per_token"],
            "peaks": values["peaks"], "peak_source": parameters.get("peak_source", "")}


@register("training_throughput",
          "Step time, tokens/s and MFU of the course model per precision recipe over seeds, eager and "
          "torch.compile on a GPU, with loss curves and per-step times for time-to-target (lesson 6).",
          result_type=ThroughputStudy, parameters=_throughput_parameters, legacy=_throughput_legacy)
def _training_throughput(profile: SizeProfile, device: torch.device, **parameters: Any) -> ThroughputStudy:
    return training_throughput(profile, device, **parameters)


@register("training_memory",
          "Memory of one training step of the course model per recipe, counted by component (weights, "
          "gradients, optimizer state, masters, autocast weight copies, saved activations) and, on a GPU, "
          "the allocator's peak for the step; activation bytes against batch and context (lesson 6).",
          result_type=TrainingMemory, legacy=_legacy_whole)
def _training_memory(profile: SizeProfile, device: torch.device) -> TrainingMemory:
    return training_memory(profile, device)


@register("scale_ladder",
          "Step time (median, quartiles), tokens/s, MFU against one reference peak (a GPU's dense BF16 datasheet "
          "peak), compile time and peak memory of the course model (small, full) and GPT-2 small/medium/large "
          "shapes per recipe (FP32, TF32, BF16 and FP16 autocast, FP8 tensorwise and rowwise via torchao), eager "
          "and compiled, beside the FLOP, byte and roofline models' predictions for every rung; the full ladder "
          "is recorded in pieces (studies.ladder.LADDER_PIECES) (lesson 6).",
          result_type=ScaleLadder, parameters=ladder_sizes)
def _scale_ladder(profile: SizeProfile, device: torch.device, **parameters: Any) -> ScaleLadder:
    return scale_ladder(profile, device, **parameters)


@register("profiled_step",
          "torch.profiler's top operators (self time) of one training step of the course model in FP32, "
          "BF16 autocast and FP16 autocast, and the share of time spent in casts (lesson 6).",
          result_type=ProfiledSteps, legacy=_legacy_whole, parameters=lambda profile, device: {"top": 12})
def _profiled_step(profile: SizeProfile, device: torch.device, *, top: int) -> ProfiledSteps:
    return profiled_steps(profile, device, top=top)


def _data_loading_parameters(profile: SizeProfile, device: torch.device) -> dict[str, Any]:
    # on a CPU the compute runs on one thread, leaving the other cores to the workers as a GPU's compute would
    return {"workers": (0, 2), "batches": profile.pick(small=10, full=30), "runs": profile.pick(small=3, full=5),
            "batch_size": 8, "features": 256, "elements": 20_000, "prepare_rounds": 75,
            "compute_rounds": 48, "compute_threads": 1 if device.type == "cpu" else None,
            "copy_bytes": profile.pick(small=16 << 20, full=256 << 20), "matmul_n": profile.pick(small=1024, full=4096),
            "matmuls": 4, "samples": profile.pick(small=5, full=10)}


@register("data_loading",
          "DataLoader workers against none: median step time of a loop whose batches cost CPU work to prepare, "
          "and the share of that work hidden behind the compute; what DataLoader(pin_memory=True) does here; on a "
          "GPU, host-to-device copies from pageable and pinned memory with and without non_blocking, the cost of "
          "pin_memory(), and a copy's overlap with matmuls (lesson 6).",
          result_type=DataLoading, parameters=_data_loading_parameters)
def _data_loading(profile: SizeProfile, device: torch.device, **parameters: Any) -> DataLoading:
    return data_loading(profile, device, **parameters)


# ---- lesson 7: FP8 ----------------------------------------------------------------------------------

def fp8_speed_sizes(profile: SizeProfile) -> tuple[int, ...]:
    """Square linear-layer sizes of the FP8 speed study."""
    return profile.pick(small=(64, 128, 256), full=(256, 512, 1024, 2048, 4096, 8192))


def _fp8_speed_legacy(parameters: dict, values: dict) -> dict[str, Any]:
    return {"device": "recorded", "sizes": parameters["sizes"], "seconds": values["seconds"],
            "skipped": values["skipped"]}


@register("fp8_linear_speed",
          "Forward+backward time of a square linear layer in BF16 and in FP8 (the course's layer on "
          "torch._scaled_mm, and torchao's Float8Linear when it imports), over sizes (lesson 7).",
          result_type=Fp8LinearSpeed, legacy=_fp8_speed_legacy,
          code_changes=(CodeChange(ONE_PASS_CASTS_SINCE, "timed the course FP8 layer from before it cast each "
                                   "tensor in one pass without waiting for the host to read its finiteness check"),),
          parameters=lambda profile, device: {"sizes": fp8_speed_sizes(profile),
                                              "budget_s": profile.pick(small=0.05, full=0.3),
                                              # seconds a size may be forecast to take: see SizeLimit
                                              "point_limit_s": profile.pick(small=5.0, full=60.0)})
def _fp8_linear_speed(profile: SizeProfile, device: torch.device, *, sizes: tuple[int, ...],
                      budget_s: float, point_limit_s: float | None = None) -> Fp8LinearSpeed:
    return fp8_linear_speed(sizes, device, budget_s=budget_s, point_limit_s=point_limit_s)


@register("fp8_compiled_speed",
          "Forward+backward time of BF16 against torchao float8 (tensorwise, rowwise) square linear layers "
          "(4096-8192 wide, 16384 tokens) and a Llama-like block (width 4096, 8192 tokens), under torch.compile "
          "on a GPU (eager on a CPU), with the course's FP8 layer eager beside them and the roofline's "
          "predicted ratio per shape (lesson 7).",
          result_type=Fp8CompiledSpeed, parameters=compiled_speed_parameters)
def _fp8_compiled_speed(profile: SizeProfile, device: torch.device, **parameters: Any) -> Fp8CompiledSpeed:
    return fp8_compiled_speed(device, **parameters)


@register("fp8_training",
          "Loss curves of the course model with FP8 linear layers per scaling recipe (tensorwise, rowwise, "
          "delayed, blockwise, unscaled) against BF16 autocast, three seeds each (lesson 7).",
          result_type=Fp8Training, parameters=lambda profile, device: {"steps": profile.pick(small=25, full=150)})
def _fp8_training(profile: SizeProfile, device: torch.device, *, steps: int) -> Fp8Training:
    return fp8_training(profile, device, steps=steps)


def _scaling_lab_legacy(parameters: dict, values: dict) -> dict[str, Any]:
    errors = values["errors"]
    lab = {"tensors": list(errors), "recipes": list(next(iter(errors.values()))), "errors": errors}
    return {"layer": parameters["layer"], "steps": parameters["steps"], "block": parameters["block"], "lab": lab,
            "sweep": values["outlier_sweep"]}


@register("fp8_scaling_lab",
          "Quantisation error, saturation and flush-to-zero of each FP8 scaling recipe on the course model's "
          "activation, weight and output gradient, and the outlier-channel sweep (lesson 7).",
          result_type=Fp8ScalingLab, legacy=_scaling_lab_legacy,
          parameters=lambda profile, device: {"block": lab_block(profile)})
def _fp8_scaling_lab(profile: SizeProfile, device: torch.device, *, block: int) -> Fp8ScalingLab:
    return scaling_lab_study(capture_linear_tensors(profile, device), block)


# ---- lesson 8: microscaling -------------------------------------------------------------------------

@register("mx_block_study",
          "MX quantisation error against block size (E4M3 and E2M1 elements), the FP4 block-scale choices "
          "(E8M0, E4M3, with and without NVFP4's tensor scale), FLOOR against RCEIL scale selection, and each "
          "NVFP4 recipe piece's effect on the course model's gradient, over three trained models (lesson 8).",
          result_type=MxBlockStudy)
def _mx_block_study(profile: SizeProfile, device: torch.device) -> MxBlockStudy:
    return mx_block_study(profile, device)


# Lesson 8 trains these live at both sizes. The ablations (the rest of mx.BLOCK_RECIPES) would take another
# 5 x 3 emulated runs, longer than the lesson's 3 minutes on a GPU alone, so the GPU session records every
# recipe as a piece of its own (``--param recipes=[...]``), which the page merges (fp8.merge_recorded_pieces).
MX_LESSON_RECIPES = ("bf16_autocast", "mxfp8", "mxfp4", "nvfp4")


@register("mx_training",
          "Loss curves of the course model with MXFP8, MXFP4 and NVFP4 linear layers (exact emulation) against "
          "BF16 autocast, three seeds each; with --param recipes=[...] also the NVFP4 recipe with one piece "
          "removed at a time and MXFP4 with a high-precision last block (mx.BLOCK_RECIPES; the GPU session "
          "records them one recipe per command) (lesson 8).", result_type=Fp8Training,
          parameters=lambda profile, device: {"recipes": MX_LESSON_RECIPES,
                                              "steps": profile.pick(small=25, full=150)})
def _mx_training(profile: SizeProfile, device: torch.device, **parameters: Any) -> Fp8Training:
    return block_scaled_training(profile, device, **parameters)


@register("mx_emulation_cost",
          "Seconds per optimizer step of the course model with NVFP4 linear layers (exact emulation) against "
          "BF16 autocast, alternated over rounds, and their ratio (lesson 8; the target on a GPU: at most 3x).",
          result_type=EmulationCost,
          parameters=lambda profile, device: {"rounds": profile.pick(small=3, full=5),
                                              "budget_s": profile.pick(small=1.0, full=3.0)})
def _mx_emulation_cost(profile: SizeProfile, device: torch.device, **parameters: Any) -> EmulationCost:
    return emulation_step_ratio(profile, device, **parameters)


# ---- lesson 9: monitoring and debugging ---------------------------------------------------------------

def _faults_legacy(parameters: dict, values: dict) -> dict[str, Any]:
    hunts = {kind: {"layer": h["layer"], "kind": kind, "report": h["report"], "anomaly": h["anomaly"],
                    "plain_s": h["seconds"]["plain"], "locator_s": h["seconds"]["locator"],
                    "anomaly_s": h["seconds"]["anomaly"]} for kind, h in values["nan_hunts"].items()}
    return {"underflow_trend": values["underflow_trend"], "nan_hunts": hunts, "recovery": values["recovery"]}


@register("monitor_faults",
          "Planted faults caught: a NaN in a forward and in a backward pass located by module (against "
          "torch.autograd.detect_anomaly), an FP16 overflow run with and without rollback-and-BF16 recovery, "
          "and the share of each gradient an unscaled FP16 would flush over an FP32 run (lesson 9).",
          result_type=MonitorFaults, legacy=_faults_legacy)
def _monitor_faults(profile: SizeProfile, device: torch.device) -> MonitorFaults:
    return monitor_faults(profile, device)


def _overhead_legacy(parameters: dict, values: dict) -> dict[str, Any]:
    return {"seconds": values["seconds"]}


@register("monitor_overhead",
          "Mean optimizer-step time of the course model without a gradient monitor and with one sampling "
          "every step and every 10 steps, alternated in blocks within one run (lesson 9).",
          result_type=MonitorOverhead, legacy=_overhead_legacy,
          code_changes=(CodeChange(BATCHED_MONITOR_SINCE, "timed the monitor when it read each statistic back "
                                   "on its own, before it brought them to the host in one transfer per sampled step"),),
          parameters=lambda profile, device: {"everies": (1, 10), "steps": profile.pick(small=10, full=50),
                                              "rounds": profile.pick(small=6, full=3)})
def _monitor_overhead(profile: SizeProfile, device: torch.device, **parameters: Any) -> MonitorOverhead:
    return monitor_overhead(profile, device, **parameters)


# ---- lesson 10: across processes -----------------------------------------------------------------------

@register("data_parallel",
          "Two-process data parallelism (NCCL when every rank has a GPU, gloo on the CPU otherwise): DDP "
          "against one process for FP32, BF16 autocast and FP16 with GradScaler; an inf planted on one rank "
          "under DDP, a hand-written loop that unscales before the all-reduce, and FSDP2; FSDP2 mixed precision "
          "policies; DDP's FP16/BF16 compression hooks; the real all-reduce against the simulation (lesson 10).",
          result_type=DataParallelStudy)
def _data_parallel(profile: SizeProfile, device: torch.device) -> DataParallelStudy:
    return data_parallel_study(profile, device)


@register("reduction_precision",
          "The data-parallel mean of N ranks' real course-model gradients, reduced in FP32, BF16 (ring and "
          "tree order) and FP16 (divided by N or by ~sqrt(N) first), against the FP64 mean, N = 2..128; "
          "a larger model's on a fixed random sample of 2^20 entries (lesson 10).", result_type=ReductionStudy)
def _reduction_precision(profile: SizeProfile, device: torch.device) -> ReductionStudy:
    return reduction_precision_study(profile, device)


# ---- the book: how long each lesson takes -------------------------------------------------------------

@register("lesson_times",
          "Wall time of executing each lesson as a notebook at the size profile (COURSE_SIZE in the kernel), "
          "whether every cell ran, and where a failing lesson stopped (the GPU session times a few lessons "
          "per record).", result_type=LessonTimes, parameters=lesson_times_parameters, requires_cuda=True)
def _lesson_times(profile: SizeProfile, device: torch.device, *, lessons: tuple[str, ...],
                  limit_s: float) -> LessonTimes:
    return lesson_times(profile, device, lessons=lessons, limit_s=limit_s)
