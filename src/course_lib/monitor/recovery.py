"""Recovery: checkpoints that survive a crash, keeping one module in FP32, and a training run that rolls back
to its last good checkpoint and continues under a safer recipe (layer 3: it drives the training loop)."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..device import restore_rng_states
from ..train import History, TrainState, get_recipe, train
from .faults import ModuleWrapper, wrap_submodule
from .health import ALERT_KINDS, Alert, GradientHealthMonitor


def save_checkpoint_atomic(state: dict, path: str | Path) -> Path:
    """Write ``state`` with ``torch.save`` to a temporary file in the same folder, flush it to disk, then
    rename it over ``path``: readers see the old checkpoint or the new one, never half of one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _checkpoint(state) -> dict:
    return state.state_dict()   # with every random state a rollback restores (device.rng_states)


@dataclass(frozen=True)
class RecoveryPolicy:
    """What to do when the run goes wrong: on an alert of a kind in ``triggers``, roll back to the
    last good checkpoint (model, optimizer, scheduler, the CPU's and, when CUDA is in use, every CUDA
    device's random state; written every ``checkpoint_every`` steps that
    ended finite and not skipped) and continue with the ``fallback`` recipe (BF16's range does not overflow
    where FP16's does), or, with ``keep_fp32`` (module names), continue with the same recipe but those
    modules computed in FP32. At most ``max_recoveries`` times: after each rollback the monitor is re-armed,
    so a fault that survives the safer recipe triggers the next recovery."""

    fallback: str = "bf16_autocast"
    keep_fp32: tuple[str, ...] = ()
    triggers: tuple[str, ...] = ("scale_collapse", "skipped_run", "non_finite_loss", "non_finite_gradient")
    checkpoint_every: int = 5
    max_recoveries: int = 1

    def __post_init__(self) -> None:
        unknown = [t for t in self.triggers if t not in ALERT_KINDS]
        if unknown:
            raise ValueError(f"unknown alert kind {unknown[0]!r}; kinds: {', '.join(ALERT_KINDS)}")
        if isinstance(self.keep_fp32, str) or not all(isinstance(n, str) and n for n in self.keep_fp32):
            raise ValueError(f"keep_fp32 must be a tuple of module names, got {self.keep_fp32!r}")
        for name in ("checkpoint_every", "max_recoveries"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "checkpoint_every" else 0):
                raise ValueError(f"{name} must be a {'positive' if name == 'checkpoint_every' else 'non-negative'} "
                                 f"int, got {v!r}")


class Fp32Island(ModuleWrapper):
    """Runs ``module`` in FP32 inside an autocast region: autocast off, floating inputs cast to FP32 (what
    "keep this layer in FP32" means; lesson 4)."""

    def forward(self, *args, **kwargs):
        device_type = next((p.device.type for p in self.module.parameters()), "cpu")
        cast = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        with torch.autocast(device_type, enabled=False):
            return self.module(*cast, **kwargs)


def keep_in_fp32(model: nn.Module, name: str) -> Fp32Island:
    """Wrap the submodule ``name`` of ``model`` (in place) in an :class:`Fp32Island`."""
    return wrap_submodule(model, name, Fp32Island)


@dataclass(frozen=True)
class RecoveryEvent:
    """A rollback: the ``alert`` that triggered it at ``step``, the checkpoint step it went back to, and the
    recipe the run continued with."""

    step: int
    rolled_back_to: int
    alert: Alert
    recipe: str


@dataclass
class RecoveredRun:
    """The run's final state, its history (every step run, including those rolled back), the monitor that
    watched it and the recoveries made."""

    state: object
    history: object
    monitor: GradientHealthMonitor
    events: list[RecoveryEvent]


def train_with_recovery(state, sampler, checkpoint_path: str | Path, *, policy: RecoveryPolicy | None = None,
                        monitor: GradientHealthMonitor | None = None, steps: int | None = None) -> RecoveredRun:
    """Train ``state`` (a :class:`course_lib.train.TrainState`) to ``config.steps`` (or ``steps`` more),
    one optimizer step at a time under ``monitor``, checkpointing atomically to ``checkpoint_path``, and
    recovering by ``policy`` when a trigger alert is raised."""
    policy = policy if policy is not None else RecoveryPolicy()
    if not isinstance(policy, RecoveryPolicy):
        raise TypeError("policy must be a RecoveryPolicy")
    monitor = monitor if monitor is not None else GradientHealthMonitor(state.model)
    get_recipe(policy.fallback, state.device)   # refuse an unknown or unsupported fallback before training
    named = dict(state.model.named_modules())
    missing = [n for n in policy.keep_fp32 if n not in named]
    if missing:
        raise ValueError(f"no module named {missing[0]!r} to keep in FP32")
    end = state.config.steps if steps is None else state.step + steps
    history = History(state.recipe.name)
    events: list[RecoveryEvent] = []
    save_checkpoint_atomic(_checkpoint(state), checkpoint_path)
    while state.step < end:
        seen = len(monitor.alerts)
        train(state, sampler, steps=1, history=history, monitor=monitor)
        triggered = [a for a in monitor.alerts[seen:] if a.kind in policy.triggers]
        if triggered and len(events) < policy.max_recoveries:
            saved = torch.load(Path(checkpoint_path), weights_only=False)
            state.model.load_state_dict(saved["model"])
            if policy.keep_fp32:
                # same recipe, the named modules in FP32; the parameters (and their optimizer state) are the
                # same objects, so the old optimizer and scaler continue
                for name in policy.keep_fp32:
                    keep_in_fp32(state.model, name)
                state.optimizer.load_state_dict(saved["optimizer"])
                state.scheduler.load_state_dict(saved["scheduler"])
                state.scaler.load_state_dict(saved["scaler"])
                fresh, label = state, f"{state.recipe.name} with {', '.join(policy.keep_fp32)} in FP32"
            else:
                recipe = get_recipe(policy.fallback, state.device)
                fresh = TrainState(state.model, recipe, state.config, state.device)
                fresh.optimizer.load_state_dict(saved["optimizer"])
                fresh.scheduler.load_state_dict(saved["scheduler"])
                label = recipe.name
            fresh.step = int(saved["step"])
            restore_rng_states(saved)
            events.append(RecoveryEvent(state.step - 1, fresh.step, triggered[0], label))
            monitor.rearm()   # the same fault after the rollback must trigger the next recovery
            state = fresh
            continue
        ok = not history.skipped[-1] and math.isfinite(history.losses[-1]) and not triggered
        if ok and state.step % policy.checkpoint_every == 0:
            save_checkpoint_atomic(_checkpoint(state), checkpoint_path)
    return RecoveredRun(state, history, monitor, events)
