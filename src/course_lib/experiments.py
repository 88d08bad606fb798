"""The registry of named experiments that :mod:`course_lib.record` can run and record.

Each experiment is a function ``(profile, device) -> ExperimentOutput`` that calls the library function a
lesson uses, so the recorded result and the live result come from the same code. Lessons add theirs here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .device import SizeProfile


@dataclass(frozen=True)
class ExperimentOutput:
    """What one run produced: the parameters it ran with and the measured values (JSON-able)."""

    parameters: dict[str, Any]
    values: dict[str, Any]


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    run: Callable[[SizeProfile, torch.device], ExperimentOutput]
    requires_cuda: bool = False


EXPERIMENTS: dict[str, Experiment] = {}


def register(name: str, description: str, *, requires_cuda: bool = False):
    """Decorator adding an experiment function to :data:`EXPERIMENTS` under ``name``."""
    def wrap(fn: Callable[[SizeProfile, torch.device], ExperimentOutput]):
        if name in EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is registered twice")
        EXPERIMENTS[name] = Experiment(name, description, fn, requires_cuda)
        return fn
    return wrap


def get_experiment(name: str) -> Experiment:
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}") from None


def run_experiment(name: str, profile: SizeProfile, device: torch.device | str) -> ExperimentOutput:
    """Run a registered experiment; refuse clearly when it needs a GPU and ``device`` is not one."""
    exp = get_experiment(name)
    device = torch.device(device)
    if exp.requires_cuda and device.type != "cuda":
        raise ValueError(f"experiment {name!r} needs a CUDA GPU; this run's device is {device.type}")
    return exp.run(profile, device)


# ---- lesson 1: number formats ----------------------------------------------------------------------

@register("model_magnitudes",
          "Magnitudes (log2 histograms) of weights, activations, gradients and Adam moments of the "
          "course model after FP32 AdamW training (lesson 1).")
def _model_magnitudes(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    from .magnitudes import measure_training_magnitudes

    result = measure_training_magnitudes(profile, device)
    return ExperimentOutput(
        parameters={"profile": profile.name, "steps": result.steps, "batch_size": result.batch_size,
                    "config": result.config},
        values={"magnitudes": result},
    )


@register("tf32_matmul_rounding",
          "A float32 matmul A @ I with TF32 enabled, compared bit for bit with course_lib's TF32 rounding "
          "of A under each rounding rule (lesson 1).", requires_cuda=True)
def _tf32_matmul_rounding(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    from .formats import tf32_matmul_check

    n = profile.pick(small=256, full=4096)
    result = tf32_matmul_check(n, device)
    return ExperimentOutput(parameters={"n": n}, values={"check": result})


# ---- lessons 2 and 3: underflow, loss scaling -----------------------------------------------------

@register("underflow_statistics",
          "Per-format underflow/overflow fractions of the course model's activation and weight gradients, "
          "first and last step of FP32 training, per layer and overall (lesson 2).")
def _underflow_statistics(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    from .gradients import UNDERFLOW_FORMATS, summarize_underflow, train_and_capture, underflow_table

    run = train_and_capture(profile, device)
    values = {}
    for step, cap in run.captures.items():
        values[f"step_{step}"] = {
            "overall": {kind: {f: summarize_underflow(cap.all_values(kind), f) for f in UNDERFLOW_FORMATS}
                        for kind in ("activation", "weight")},
            "per_layer_activation": [{"layer": name, "summary": s} for name, s in underflow_table(cap)],
        }
    return ExperimentOutput(parameters={"profile": profile.name, "steps": len(run.losses)},
                            values={"losses": run.losses, "captures": values})


@register("scaler_flight_recording",
          "A real torch.amp.GradScaler run of the course model with FP16 autocast at GradScaler's "
          "defaults: scale, skipped steps and growth tracker per step (lesson 3).")
def _scaler_flight_recording(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    from .scaling import record_grad_scaler_run

    rec = record_grad_scaler_run(profile, device)
    return ExperimentOutput(parameters={"profile": profile.name, "steps": rec.steps,
                                        "init_scale": rec.init_scale, "growth_interval": rec.growth_interval},
                            values={"recording": rec})


# ---- lesson 4: autocast -------------------------------------------------------------------------------

@register("autocast_trace",
          "Dtypes in and out of every op of the course model's forward and backward under CUDA FP16 "
          "autocast, and of softmax/layer_norm/exp/sum on a low-precision input (lesson 4).",
          requires_cuda=True)
def _autocast_trace(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    from .amp import sensitive_ops_trace, trace_course_model

    trace = trace_course_model(device)
    return ExperimentOutput(parameters={"dtype": trace.dtype},
                            values={"forward": trace.op_table("forward"), "backward": trace.op_table("backward"),
                                    "sensitive_ops": sensitive_ops_trace(device)})


# ---- lesson 5: BF16 against FP16 ----------------------------------------------------------------------

@register("convergence_parity",
          "Final training loss of FP32, FP16+GradScaler, BF16 and FP16-without-scaler on the course model "
          "over three seeds, with loss curves and step times (lesson 5).")
def _convergence_parity(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    from .train import convergence_parity

    parity = convergence_parity(profile, device)
    return ExperimentOutput(parameters={"profile": profile.name, "seeds": parity.seeds},
                            values={"final_losses": parity.final_losses, "curves": parity.curves})


@register("bf16_update_stagnation",
          "The course model with BF16 weights: round-to-nearest updates against FP32 master weights, "
          "Kahan compensation and stochastic rounding, with the share of lost updates (lesson 5).")
def _bf16_update_stagnation(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    from .bf16 import compare_bf16_updates

    result = compare_bf16_updates(profile, device)
    return ExperimentOutput(parameters={"profile": profile.name, "lr": result.lr},
                            values={"losses": result.losses, "lost_fraction": result.lost_fraction})
