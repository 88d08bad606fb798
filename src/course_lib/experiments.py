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
