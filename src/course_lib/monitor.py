"""Watching a mixed precision run: gradient health, non-finite values traced to their module, and recovery.

* :class:`GradientHealthMonitor` attaches to a training loop (:func:`course_lib.train.train` takes one, and
  a plain loop calls :meth:`~GradientHealthMonitor.after_backward` and
  :meth:`~GradientHealthMonitor.after_step`). Every ``every`` steps it measures, per parameter, the share
  of gradient values that are zero, that would flush to zero or land in the subnormals of the training
  dtype at the current loss scale, the non-finite count and the norm; every step it records the loss, the
  scale and whether the step was skipped. Thresholds raise named :class:`Alert` s.
* :class:`NonFiniteLocator` hooks every module's forward and backward and names the first one that produced
  an inf or NaN, with its input and output statistics.
* :func:`save_checkpoint_atomic` writes a checkpoint so that a crash mid-write never replaces the last good
  one, and :class:`RecoveryPolicy` rolls a run back to it and switches FP16 to BF16 when the scale
  collapses or overflows persist.
"""

from __future__ import annotations

import math
import os
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from .formats import FloatFormat, get_format

ALERT_KINDS = ("zero_gradients", "underflow", "non_finite_gradient", "non_finite_loss", "scale_collapse",
               "skipped_run")


@dataclass(frozen=True)
class Thresholds:
    """When the monitor raises an alert.

    ``zero_fraction``: a parameter's share of gradient values that are exactly zero (0..1).
    ``underflow_fraction``: its share of non-zero values that would flush to zero in the training dtype at
    the current scale. ``min_scale``: a loss scale below this has collapsed (a run without a scaler reports
    1.0 and never alerts at the default).
    ``skipped_run``: this many consecutive skipped steps.
    """

    zero_fraction: float = 0.5
    underflow_fraction: float = 0.25
    min_scale: float = 1.0
    skipped_run: int = 5

    def __post_init__(self) -> None:
        for name in ("zero_fraction", "underflow_fraction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ValueError(f"{name} must be a share in (0, 1], got {v!r}")
        if isinstance(self.min_scale, bool) or not isinstance(self.min_scale, (int, float)) or not (
                self.min_scale > 0 and math.isfinite(self.min_scale)):
            raise ValueError(f"min_scale must be a positive finite number, got {self.min_scale!r}")
        if isinstance(self.skipped_run, bool) or not isinstance(self.skipped_run, int) or self.skipped_run < 1:
            raise ValueError(f"skipped_run must be a positive int, got {self.skipped_run!r}")


@dataclass(frozen=True)
class GradientStats:
    """One parameter's gradient at one step (true gradient: divided by the loss scale).

    Shares are of all its values: ``zero`` exactly zero; ``flush`` non-zero but zero once multiplied by the
    scale and rounded to the training dtype; ``subnormal`` landing in that dtype's subnormals; ``overflow``
    beyond its largest value. ``non_finite``: count of inf/NaN values. ``norm``: L2 norm (of finite ones)."""

    name: str
    numel: int
    zero: float
    flush: float
    subnormal: float
    overflow: float
    non_finite: int
    norm: float


def gradient_stats(name: str, grad: torch.Tensor, fmt: str | FloatFormat, scale: float = 1.0) -> GradientStats:
    """Classify the values of ``grad`` (a true gradient) as they would be stored in ``fmt`` after
    multiplying by ``scale`` (round to nearest even; the same classes as
    :func:`course_lib.gradients.summarize_underflow`, by comparison with the rounding boundaries, in float64)."""
    f = get_format(fmt)
    a = grad.detach().abs().double().flatten()
    n = a.numel()
    if n == 0:
        return GradientStats(name, 0, 0.0, 0.0, 0.0, 0.0, 0, 0.0)
    finite = torch.isfinite(a)
    non_finite = int(n - finite.sum())
    a = torch.where(finite, a, 0.0)
    x = a * float(scale)
    half_sub = f.min_subnormal / 2                      # at or below: rounds to zero (a tie goes to even, 0)
    top = f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2    # at or above: rounds past max
    zero = finite & (a == 0)
    flush = (a > 0) & (x <= half_sub)
    subnormal = (x > half_sub) & (x < f.min_normal - half_sub)
    overflow = x >= top if f.has_inf or f.has_nan else torch.zeros_like(x, dtype=torch.bool)
    return GradientStats(name, n, float(zero.sum()) / n, float(flush.sum()) / n, float(subnormal.sum()) / n,
                         float(overflow.sum()) / n, non_finite, float(torch.linalg.vector_norm(a)))


@dataclass(frozen=True)
class Alert:
    """A threshold crossed: ``kind`` (one of :data:`ALERT_KINDS`), at optimizer ``step``, for ``layer``
    (a parameter name, or None for run-level alerts), with a message for the reader."""

    step: int
    kind: str
    layer: str | None
    message: str


@dataclass
class MonitorLog:
    """What the monitor saw: per step the loss, scale and skipped flag; per sampled step, each parameter's
    :class:`GradientStats`."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    sampled_steps: list[int] = field(default_factory=list)
    gradients: list[tuple[GradientStats, ...]] = field(default_factory=list)

    def layer_series(self, attribute: str = "zero") -> dict[str, list[float]]:
        """Per parameter, ``attribute`` of its stats at each sampled step."""
        series: dict[str, list[float]] = {}
        for stats in self.gradients:
            for s in stats:
                series.setdefault(s.name, []).append(getattr(s, attribute))
        return series


class GradientHealthMonitor:
    """Watches a model's gradients and a run's loss scale, and raises :class:`Alert` s.

    ``dtype``: the low-precision dtype gradients pass through (``torch.float16`` under FP16 autocast with a
    scaler, ``torch.bfloat16`` for BF16). ``every``: measure gradients every this many steps (1: every step;
    the run-level checks run every step). ``layers``: parameter names to watch (default: every parameter
    with ``requires_grad``). Each (kind, layer) alert is raised once, where first seen. Embedding tables are
    not checked for zero gradients: the rows of tokens absent from a batch are zero by construction.

    ``activations``: also watch the gradient of every ``nn.Linear``'s *output* (named ``"<layer>:grad_output"``).
    Under autocast these are the low-precision tensors of the backward pass, where FP16 underflow happens; a
    parameter's ``.grad`` is stored in FP32 but was computed in FP16 and cast up, so what FP16 flushed is
    already zero there. Call :meth:`close` to remove the hooks."""

    def __init__(self, model: nn.Module, *, dtype: torch.dtype | str = torch.float16, every: int = 10,
                 thresholds: Thresholds | None = None, layers: tuple[str, ...] | None = None,
                 activations: bool = False):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no parameters that require gradients: nothing to monitor")
        if layers is not None:
            known = dict(params)
            missing = [n for n in layers if n not in known]
            if missing:
                raise ValueError(f"no parameter named {missing[0]!r}; parameters: {', '.join(known)}")
            params = [(n, known[n]) for n in layers]
        self.params = params
        self._sparse = {f"{mn}.{pn}" if mn else pn for mn, m in model.named_modules()
                        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for pn, _ in m.named_parameters(recurse=False)}
        self.format = get_format(dtype if isinstance(dtype, str) else str(dtype).replace("torch.", ""))
        self.every = every
        self.thresholds = thresholds if thresholds is not None else Thresholds()
        if not isinstance(self.thresholds, Thresholds):
            raise TypeError("thresholds must be a Thresholds")
        self.log = MonitorLog()
        self.alerts: list[Alert] = []
        self._raised: set[tuple[str, str | None]] = set()
        self._skipped_run = 0
        self._pending: list[tuple[str, int, float]] = []
        self._grad_outputs: dict[str, torch.Tensor] = {}
        self._handles: list = []
        if activations:
            for mname, m in model.named_modules():
                if isinstance(m, nn.Linear):
                    self._handles.append(m.register_full_backward_hook(self._hook_for(mname)))

    def _hook_for(self, name: str):
        def hook(module, grad_input, grad_output):
            self._keep_grad_output(name, grad_output)
        return hook

    def _keep_grad_output(self, name: str, grad_output) -> None:
        if grad_output and isinstance(grad_output[0], torch.Tensor):
            self._grad_outputs[name] = grad_output[0].detach()

    def close(self) -> None:
        """Remove the activation hooks (if any)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _alert(self, step: int, kind: str, layer: str | None, message: str) -> None:
        if (kind, layer) not in self._raised:
            self._raised.add((kind, layer))
            self.alerts.append(Alert(step, kind, layer, message))

    def should_sample(self, step: int) -> bool:
        return step % self.every == 0

    def after_backward(self, step: int, *, scale: float = 1.0) -> tuple[GradientStats, ...] | None:
        """Call after ``backward()`` (before the optimizer step), with the loss scale the gradients carry
        (1.0 without a scaler). Measures the gradients on sampled steps; returns their stats, or None."""
        if not self.should_sample(step):
            self._grad_outputs = {}
            return None
        if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and scale >= 0 and math.isfinite(scale)):
            raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
        if scale == 0:
            # GradScaler halves its scale on every overflow and reaches 0.0 after a long enough run of them
            # (torch does not stop it); the gradients were multiplied by zero and say nothing about the true
            # ones. Nothing to classify: after_step raises scale_collapse.
            self._grad_outputs = {}
            self._pending = []
            self.log.sampled_steps.append(step)
            self.log.gradients.append(())
            return ()
        t = self.thresholds
        stats = []
        self._pending = []
        for name, p in self.params:
            if p.grad is None:
                continue
            s = gradient_stats(name, p.grad.float() / scale, self.format, scale)
            stats.append(s)
            if s.non_finite:
                # an overflow the scaler will skip is the scaler working; alert in after_step only if the
                # step went ahead with it
                self._pending.append((name, s.non_finite, scale))
            if s.zero >= t.zero_fraction and name not in self._sparse:
                self._alert(step, "zero_gradients", name, f"{name}: {100 * s.zero:.0f}% of the gradient is exactly "
                            f"zero at step {step} (limit {100 * t.zero_fraction:.0f}%)")
            nonzero = 1.0 - s.zero
            if nonzero > 0 and s.flush / nonzero >= t.underflow_fraction:
                self._alert(step, "underflow", name, f"{name}: {100 * s.flush / nonzero:.0f}% of the non-zero "
                            f"gradient would flush to zero in {self.format.name} at scale {scale:g} (step {step})")
        for name, g in self._grad_outputs.items():
            # activation gradients carry the loss scale as they are: classify them as stored
            s = gradient_stats(f"{name}:grad_output", g.float() / scale, self.format, scale)
            stats.append(s)
            nonzero = 1.0 - s.zero
            if nonzero > 0 and s.flush / nonzero >= t.underflow_fraction:
                self._alert(step, "underflow", s.name, f"{s.name}: {100 * s.flush / nonzero:.0f}% of the non-zero "
                            f"activation gradient would flush to zero in {self.format.name} at scale {scale:g} "
                            f"(step {step})")
        self._grad_outputs = {}
        result = tuple(stats)
        self.log.sampled_steps.append(step)
        self.log.gradients.append(result)
        return result

    def after_step(self, step: int, *, loss: float, scale: float = 1.0, skipped: bool = False) -> None:
        """Call once per optimizer step, after it (or after it was skipped)."""
        t = self.thresholds
        self.log.steps.append(step)
        self.log.losses.append(float(loss))
        self.log.scales.append(float(scale))
        self.log.skipped.append(bool(skipped))
        self._skipped_run = self._skipped_run + 1 if skipped else 0
        if self._skipped_run >= t.skipped_run:
            self._alert(step, "skipped_run", None, f"{self._skipped_run} consecutive skipped steps up to step {step}: "
                        "the scale keeps overflowing")
        if scale < t.min_scale:
            self._alert(step, "scale_collapse", None, f"loss scale {scale:g} at step {step} (limit {t.min_scale:g}): "
                        "the run is overflowing even without scaling")
        if not math.isfinite(float(loss)):
            self._alert(step, "non_finite_loss", None, f"the loss is {loss} at step {step}: the forward pass "
                        "overflowed or produced a NaN, which no loss scale can fix")
        if not skipped:
            for name, count, s in self._pending:
                self._alert(step, "non_finite_gradient", name, f"{name}: {count} inf/NaN gradient values reached "
                            f"the optimizer at step {step} (scale {s:g}); nothing skipped the step")
        self._pending = []

    def alerts_of(self, kind: str) -> list[Alert]:
        if kind not in ALERT_KINDS:
            raise ValueError(f"unknown alert kind {kind!r}; kinds: {', '.join(ALERT_KINDS)}")
        return [a for a in self.alerts if a.kind == kind]


# ---- finding the first non-finite value ------------------------------------------------------------------

@dataclass(frozen=True)
class TensorSummary:
    """Shape, dtype, largest finite magnitude and counts of NaN and inf of one tensor."""

    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    nan: int
    inf: int


def _summary(t: torch.Tensor) -> TensorSummary:
    d = t.detach()
    finite = torch.isfinite(d)
    max_abs = float(d[finite].abs().max()) if bool(finite.any()) else math.nan
    return TensorSummary(tuple(d.shape), str(d.dtype).replace("torch.", ""), max_abs, int(torch.isnan(d).sum()),
                         int(torch.isinf(d).sum()))


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x] if x.is_floating_point() else []
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    return []


@dataclass(frozen=True)
class NonFiniteReport:
    """The first module that produced a non-finite value: its qualified ``module`` name, ``phase``
    (``"forward"``: its output; ``"backward"``: the gradient it passed to its inputs), and summaries of what
    went in and came out (in backward: the gradient of its output, and of its inputs)."""

    module: str
    phase: str
    inputs: tuple[TensorSummary, ...]
    outputs: tuple[TensorSummary, ...]

    def describe(self) -> str:
        ins = "; ".join(f"{s.dtype}{list(s.shape)} max {s.max_abs:.3g}, {s.nan} NaN, {s.inf} inf" for s in self.inputs)
        outs = "; ".join(f"{s.dtype}{list(s.shape)} {s.nan} NaN, {s.inf} inf" for s in self.outputs)
        return f"`{self.module}` in the {self.phase} pass: inputs {ins or 'none'} -> outputs {outs}"


class NonFiniteLocator:
    """Context manager: hooks the forward and backward of every module of ``model`` and records the first
    (innermost, earliest) one whose output, or whose gradient with respect to its inputs, holds an inf or a
    NaN while its inputs did not. ``report`` is None when nothing went non-finite. ``modules`` restricts
    the check to the named modules."""

    def __init__(self, model: nn.Module, *, modules: tuple[str, ...] | None = None):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        named = dict(model.named_modules())
        if modules is None:
            # every module, containers included: hooks fire inner modules first, so the first module seen
            # with finite inputs and a non-finite output is the innermost one that made it (a container is
            # named when the culprit is an operation in its own forward, not a submodule)
            chosen = [(n or "(model)", m) for n, m in named.items()]
        else:
            missing = [n for n in modules if n not in named]
            if missing:
                raise ValueError(f"no module named {missing[0]!r}")
            chosen = [(n, named[n]) for n in modules]
        if not chosen:
            chosen = [("(model)", model)]
        self._chosen = chosen
        self._handles: list = []
        self.report: NonFiniteReport | None = None

    def _record(self, name: str, phase: str, ins, outs) -> None:
        if self.report is not None:
            return
        out_t = _tensors(outs)
        if not any(not bool(torch.isfinite(t).all()) for t in out_t):
            return
        in_t = _tensors(ins)
        if any(not bool(torch.isfinite(t).all()) for t in in_t):
            return   # it passed on a non-finite value; the culprit is upstream
        self.report = NonFiniteReport(name, phase, tuple(_summary(t) for t in in_t),
                                      tuple(_summary(t) for t in out_t))

    def __enter__(self) -> "NonFiniteLocator":
        # modules whose inputs need no gradient (an embedding's token ids) make torch warn that their full
        # backward hook sees only output gradients; expected here, and not the reader's concern
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for name, module in self._chosen:
            self._handles.append(module.register_forward_hook(
                lambda m, i, o, name=name: self._record(name, "forward", i, o)))
            self._handles.append(module.register_full_backward_hook(
                lambda m, gi, go, name=name: self._record(name, "backward", go, gi)))
        return self

    def __exit__(self, *exc) -> Literal[False]:
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._warnings.__exit__(None, None, None)
        return False


# ---- checkpoints that survive a crash, and recovery ----------------------------------------------------

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


@dataclass(frozen=True)
class RecoveryPolicy:
    """What to do when the run goes wrong: on the first alert of a kind in ``triggers``, roll back to the
    last good checkpoint (model, optimizer, scheduler, RNG; written every ``checkpoint_every`` steps that
    ended finite and not skipped) and continue with the ``fallback`` recipe (BF16's range does not overflow
    where FP16's does), or, with ``keep_fp32`` (module names), continue with the same recipe but those
    modules computed in FP32. At most ``max_recoveries`` times."""

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


class Fp32Island(nn.Module):
    """Runs ``module`` in FP32 inside an autocast region: autocast off, floating inputs cast to FP32 (what
    "keep this layer in FP32" means; lesson 4)."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        device_type = next((p.device.type for p in self.module.parameters()), "cpu")
        cast = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
        with torch.autocast(device_type, enabled=False):
            return self.module(*cast, **kwargs)


def keep_in_fp32(model: nn.Module, name: str) -> Fp32Island:
    """Wrap the submodule ``name`` of ``model`` (in place) in an :class:`Fp32Island`."""
    return _wrap_submodule(model, name, Fp32Island)


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
    from .train import History, TrainState, get_recipe, train

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
    save_checkpoint_atomic(state.state_dict(), checkpoint_path)
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
            torch.random.set_rng_state(saved["rng"])
            events.append(RecoveryEvent(state.step - 1, fresh.step, triggered[0], label))
            monitor._skipped_run = 0
            state = fresh
            continue
        ok = not history.skipped[-1] and math.isfinite(history.losses[-1]) and not triggered
        if ok and state.step % policy.checkpoint_every == 0:
            save_checkpoint_atomic(state.state_dict(), checkpoint_path)
    return RecoveredRun(state, history, monitor, events)


# ---- planted faults, for the lesson and the tests ------------------------------------------------------

FAULT_KINDS = ("overflow", "nan", "nan_backward", "dead")


class _NanGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * torch.nan


class PlantedFault(nn.Module):
    """Wraps ``module``; from its ``after``-th forward call in training mode on, corrupts its output:

    * ``"overflow"``: multiplies by ``factor`` and divides again. Exact in FP32 and BF16 (a power of two),
      but in FP16 an output above 65504 / factor (about 0.004 for the default 2**24) becomes inf, and
      inf / factor stays inf: an activation that outgrew FP16;
    * ``"nan"``: sets one output element to NaN (a forward bug);
    * ``"nan_backward"``: leaves the output alone, but the gradient passed back through it is NaN;
    * ``"dead"``: multiplies the output by zero (a dead layer: its weights get zero gradient).
    """

    def __init__(self, module: nn.Module, kind: str, *, after: int = 0, factor: float = 2.0**24):
        super().__init__()
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; kinds: {', '.join(FAULT_KINDS)}")
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"after must be a non-negative int, got {after!r}")
        self.module, self.kind, self.after, self.factor = module, kind, after, float(factor)
        self.calls = 0

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if not self.training:
            return out
        self.calls += 1
        if self.calls <= self.after:
            return out
        if self.kind == "overflow":
            return (out * self.factor) / self.factor
        if self.kind == "nan":
            out = out.clone()
            out.view(-1)[0] = torch.nan
            return out
        if self.kind == "nan_backward":
            return _NanGrad.apply(out)
        return out * 0.0


def _wrap_submodule(model: nn.Module, name: str, wrap):
    """Replace the submodule ``name`` of ``model`` (in place) by ``wrap(submodule)``; return the wrapper."""
    modules = dict(model.named_modules())
    if name not in modules or not name:
        raise ValueError(f"no submodule named {name!r}")
    parent_name, _, child = name.rpartition(".")
    parent = modules[parent_name] if parent_name else model
    wrapper = wrap(modules[name])
    setattr(parent, child, wrapper)
    return wrapper


def plant_fault(model: nn.Module, name: str, kind: str, **kwargs) -> PlantedFault:
    """Replace the submodule ``name`` of ``model`` (in place) by a :class:`PlantedFault` around it."""
    return _wrap_submodule(model, name, lambda m: PlantedFault(m, kind, **kwargs))


# ---- experiments for lesson 9 ---------------------------------------------------------------------------

@dataclass(frozen=True)
class NanHunt:
    """One planted fault hunted two ways. ``report``: what :class:`NonFiniteLocator` named (None: nothing);
    ``anomaly``: what ``torch.autograd.detect_anomaly`` said (its error's first line, or None when it raised
    nothing); seconds for one forward+backward plainly, under the locator and under anomaly mode (median
    of ``repeats``, on a healthy step)."""

    layer: str
    kind: str
    report: NonFiniteReport | None
    anomaly: str | None
    plain_s: float
    locator_s: float
    anomaly_s: float


def _step_seconds(fn, repeats: int) -> float:
    import time

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def nan_hunt(profile, device: torch.device | str = "cpu", *, layer: str = "blocks.1.attn.qkv",
             kind: str = "nan_backward", repeats: int = 5, seed: int = 0) -> NanHunt:
    """Plant a ``kind`` fault (see :class:`PlantedFault`) in ``layer`` of the course model, run one step
    under the locator and one under anomaly mode, and time a healthy step each way."""
    import copy

    from .models import course_setup

    if kind not in ("nan", "nan_backward"):
        raise ValueError(f"kind must be 'nan' or 'nan_backward', got {kind!r}")
    setup = course_setup(profile, device, steps=1, default_steps=(1, 1), seed=seed)
    healthy = setup.model(seed)
    x, y = setup.sampler.batch(0, setup.device)

    def step(model):
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()

    def located():
        with NonFiniteLocator(healthy):
            step(healthy)

    def anomalous():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # anomaly mode warns that it is slow; the timing says how slow
            with torch.autograd.detect_anomaly(check_nan=True):
                step(healthy)

    step(healthy)   # warm-up
    plain_s = _step_seconds(lambda: step(healthy), repeats)
    locator_s = _step_seconds(located, repeats)
    anomaly_s = _step_seconds(anomalous, repeats)

    faulty = copy.deepcopy(healthy)
    plant_fault(faulty, layer, kind)
    with NonFiniteLocator(faulty) as locator:
        step(faulty)
    faulty = copy.deepcopy(healthy)
    plant_fault(faulty, layer, kind)
    message = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=True):
                step(faulty)
    except RuntimeError as exc:
        message = str(exc).strip().splitlines()[0]
    return NanHunt(layer, kind, locator.report, message, plain_s, locator_s, anomaly_s)


def _step_in_run(name: str, step: int | None, n: int) -> int:
    """A fault's start step inside a run of ``n`` steps: a third of the way by default, else checked."""
    step = n // 3 if step is None else step
    if not 0 < step < n:
        raise ValueError(f"{name} must lie in 1..{n - 1}, got {step}")
    return step


@dataclass(frozen=True)
class RecoveryDemo:
    """The same FP16 run with an activation that outgrows FP16 at ``fault_at``, without and with recovery:
    the monitors' logs (step, loss, scale, skipped) and the recovery events."""

    fault_at: int
    steps: int
    without: MonitorLog
    without_alerts: tuple[Alert, ...]
    with_recovery: MonitorLog
    events: tuple[RecoveryEvent, ...]


def overflow_recovery(profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                      fault_at: int | None = None, layer: str = "blocks.0.fc", checkpoint_dir: str | Path | None = None,
                      seed: int = 0) -> RecoveryDemo:
    """Train the course model with FP16 autocast and GradScaler, with an overflow planted in ``layer`` from
    step ``fault_at``; once as it is, once under :func:`train_with_recovery`."""
    from .models import course_setup
    from .train import TrainConfig, TrainState, get_recipe, train

    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 300), seed=seed)
    n = setup.steps
    fault_at = _step_in_run("fault_at", fault_at, n)
    logs: list[MonitorLog] = []
    alerts: list[tuple[Alert, ...]] = []
    events: tuple[RecoveryEvent, ...] = ()
    for recover in (False, True):
        model = setup.model(seed)
        plant_fault(model, layer, "overflow", after=fault_at)
        state = TrainState(model, get_recipe("fp16_autocast_scaler", device), TrainConfig(steps=n), device)
        watch = GradientHealthMonitor(model, dtype=torch.float16, every=max(1, n // 10))
        if recover:
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(checkpoint_dir) if checkpoint_dir is not None else Path(tmp)
                run = train_with_recovery(state, setup.sampler, folder / "last_good.pt", monitor=watch,
                                          policy=RecoveryPolicy(checkpoint_every=max(1, n // 10)))
            events = tuple(run.events)
        else:
            train(state, setup.sampler, monitor=watch)
        logs.append(watch.log)
        alerts.append(tuple(watch.alerts))
    return RecoveryDemo(fault_at, n, logs[0], alerts[0], logs[1], events)


@dataclass(frozen=True)
class UnderflowTrend:
    """Per sampled step of an FP32 run, per parameter and per linear layer's output gradient (named
    ``"<layer>:grad_output"``), the share of the gradient that would flush to zero in ``fmt`` without a loss
    scale (``flush[name][i]`` at ``steps[i]``), beside the loss per step."""

    fmt: str
    steps: tuple[int, ...]
    flush: dict[str, tuple[float, ...]]
    losses: tuple[float, ...]
    alerts: tuple[Alert, ...]


def underflow_trend(profile, device: torch.device | str = "cpu", *, steps: int | None = None, every: int = 5,
                    fmt: str = "FP16", threshold: float = 0.1, seed: int = 0) -> UnderflowTrend:
    """Train the course model in FP32 while a monitor asks what an unscaled ``fmt`` would flush."""
    from .models import course_setup
    from .train import TrainConfig, TrainState, get_recipe, train

    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(60, 600), seed=seed)
    model = setup.model(seed)
    dtype = get_format(fmt).torch_dtype_or_none()
    watch = GradientHealthMonitor(model, dtype=fmt if dtype is None else dtype, every=every,
                                  thresholds=Thresholds(underflow_fraction=threshold), activations=True)
    state = TrainState(model, get_recipe("fp32", device), TrainConfig(steps=setup.steps), device)
    try:
        history = train(state, setup.sampler, monitor=watch)
    finally:
        watch.close()
    flush = {k: tuple(v) for k, v in watch.log.layer_series("flush").items()}
    return UnderflowTrend(get_format(fmt).name, tuple(watch.log.sampled_steps), flush, tuple(history.losses),
                          tuple(watch.alerts))


@dataclass(frozen=True)
class MonitorOverhead:
    """Seconds per optimizer step (the mean over a block of steps, median over blocks) of the same run
    without a monitor and with one sampling every ``every`` steps (keys: 0 for none), and the overhead
    relative to none. Means, not medians of single steps: a median would never see the sampled steps."""

    seconds: dict[int, float]
    rounds: dict[int, tuple[float, ...]] = field(default_factory=dict)   # per round, the block's mean step

    def overhead(self, every: int) -> float:
        return self.seconds[every] / self.seconds[0] - 1.0

    def overhead_range(self, every: int) -> tuple[float, float]:
        """The lowest and highest overhead of a single round (each round's monitored block against the
        unmonitored block next to it): how much the timing moved from round to round."""
        if every not in self.rounds or 0 not in self.rounds:
            raise ValueError(f"no per-round times for every={every}")
        each = [m / n - 1.0 for m, n in zip(self.rounds[every], self.rounds[0])]
        return min(each), max(each)


def monitor_overhead(profile, device: torch.device | str = "cpu", *, everies=(1, 10), steps: int = 20,
                     rounds: int = 3, seed: int = 0) -> MonitorOverhead:
    """Time optimizer steps of one run, alternating blocks of ``steps`` steps without a monitor and with a
    monitor at each sampling interval in ``everies`` (``rounds`` times, so drift affects all alike)."""
    from .models import course_setup
    from .train import TrainConfig, TrainState, get_recipe, train

    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps * (len(everies) + 1) * rounds + 2,
                         default_steps=(10**6, 10**6), seed=seed)
    model = setup.model(seed)
    state = TrainState(model, get_recipe("fp32", device), TrainConfig(steps=setup.steps), device)
    train(state, setup.sampler, steps=2)   # warm-up
    samples: dict[int, list[float]] = {0: [], **{e: [] for e in everies}}
    for _ in range(rounds):
        for every in (0, *everies):
            watch = GradientHealthMonitor(model, every=every) if every else None
            h = train(state, setup.sampler, steps=steps, monitor=watch)
            samples[every].append(sum(h.step_seconds) / len(h.step_seconds))
    return MonitorOverhead({k: sorted(v)[len(v) // 2] for k, v in samples.items()},
                           {k: tuple(v) for k, v in samples.items()})


def anomaly_mode_raises(value: float) -> bool:
    """Whether ``torch.autograd.detect_anomaly(check_nan=True)`` raises on a backward pass whose gradient
    is ``value`` (e.g. ``math.inf`` or ``math.nan``)."""
    x = torch.ones(3, requires_grad=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=True):
                (x * value).sum().backward()
    except RuntimeError:
        return True
    return False


# ---- per-matmul statistics ------------------------------------------------------------------------------

@dataclass(frozen=True)
class MatmulStats:
    """One operand of one linear layer's product, as ``fmt`` would store it: the shares of its values that
    flush to zero (of all values; already-zero values are counted in ``zero``), land in the subnormals, or
    overflow, at ``scale`` (1, or the per-tensor current scale ``max / amax`` when scaled)."""

    layer: str
    operand: str
    fmt: str
    scale: float
    zero: float
    flush: float
    subnormal: float
    overflow: float


def matmul_stats(model: nn.Module, run_forward, fmt: str = "FP16", *, scaled: bool = False) -> tuple[MatmulStats, ...]:
    """Run ``run_forward(model)`` once with hooks on every linear layer (``nn.Linear`` and the course's FP8
    and block-scaled layers) and classify each layer's input and weight as ``fmt`` would store them:
    unscaled (as autocast casts), or ``scaled`` with a per-tensor current scale (as FP8 recipes do), in the
    manner of Transformer Engine's per-GEMM debug statistics."""
    f = get_format(fmt)
    layers = [(n, m) for n, m in model.named_modules()
              if isinstance(getattr(m, "weight", None), torch.Tensor) and m.weight.dim() == 2
              and "Linear" in type(m).__name__]
    if not layers:
        raise ValueError("the model has no linear layers")
    inputs: dict[str, torch.Tensor] = {}
    handles = [m.register_forward_hook(lambda mod, i, o, n=n: inputs.__setitem__(n, i[0].detach()))
               for n, m in layers]
    try:
        with torch.no_grad():
            run_forward(model)
    finally:
        for h in handles:
            h.remove()
    rows = []
    for name, m in layers:
        if name not in inputs:
            continue
        for operand, t in (("input", inputs[name]), ("weight", m.weight.detach())):
            amax = float(t.abs().max())
            scale = f.max_finite / amax if scaled and amax > 0 else 1.0
            s = gradient_stats(name, t.float(), f, scale)
            rows.append(MatmulStats(name, operand, f.name, scale, s.zero, s.flush, s.subnormal, s.overflow))
    return tuple(rows)


@dataclass(frozen=True)
class DeadLayerRun:
    """An FP32 run of the course model in which ``layer`` stops passing anything on from step ``dies_at``
    (its output multiplied by zero): the monitor's log and alerts."""

    layer: str
    dies_at: int
    log: MonitorLog
    alerts: tuple[Alert, ...]


def dead_layer_run(profile, device: torch.device | str = "cpu", *, layer: str = "blocks.1.fc",
                   steps: int | None = None, dies_at: int | None = None, every: int = 2,
                   seed: int = 0) -> DeadLayerRun:
    """Train the course model in FP32 under a monitor (sampling every ``every`` steps) while ``layer``
    dies at ``dies_at`` (default: a third of the way)."""
    from .models import course_setup
    from .train import TrainConfig, TrainState, get_recipe, train

    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(40, 400), seed=seed)
    n = setup.steps
    dies_at = _step_in_run("dies_at", dies_at, n)
    model = setup.model(seed)
    plant_fault(model, layer, "dead", after=dies_at)
    watch = GradientHealthMonitor(model, every=every)
    state = TrainState(model, get_recipe("fp32", device), TrainConfig(steps=n), device)
    train(state, setup.sampler, monitor=watch)
    return DeadLayerRun(layer, dies_at, watch.log, tuple(watch.alerts))


# ---- the diagnosis procedure, as one call -----------------------------------------------------------------

@dataclass(frozen=True)
class Diagnosis:
    """The answers of the debugging procedure for one failing model: ``steps`` as (question, answer)
    pairs in order, and the ``verdict``."""

    steps: tuple[tuple[str, str], ...]
    verdict: str

    def markdown(self) -> str:
        lines = [f"{i}. **{q}** {a}" for i, (q, a) in enumerate(self.steps, 1)]
        return "\n".join(lines + ["", f"**Verdict:** {self.verdict}"])

    def _repr_markdown_(self) -> str:
        return self.markdown()


def _one_step(model: nn.Module, loss_fn, batch, device: torch.device, dtype: torch.dtype | None):
    from contextlib import nullcontext

    model.zero_grad(set_to_none=True)
    ctx = torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
    with ctx:
        loss = loss_fn(model, batch)
    loss.float().backward()
    grads_finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
    return float(loss.detach().float()), grads_finite


def diagnose(build_model, loss_fn, batch, *, dtype: torch.dtype = torch.float16,
             device: torch.device | str = "cpu") -> Diagnosis:
    """Run the debugging procedure on a model whose training fails under autocast with ``dtype``:
    (1) one step in FP32; (2) one step under the autocast; (3) the locator on that step; (4) which operands
    of which products the format loses (:func:`matmul_stats`); (5) one step under BF16 autocast. Each
    answer is measured; ``build_model()`` returns a fresh model each time."""
    device = torch.device(device)
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    name = "FP16" if dtype == torch.float16 else "BF16"
    steps: list[tuple[str, str]] = []
    loss32, ok32 = _one_step(build_model().to(device), loss_fn, batch, device, None)
    fp32_fine = math.isfinite(loss32) and ok32
    steps.append(("Does it fail in FP32 too?", f"No: loss {loss32:.4g}, every gradient finite." if fp32_fine else
                  f"Yes (loss {loss32}, gradients {'finite' if ok32 else 'not finite'}): not a precision problem."))
    if not fp32_fine:
        return Diagnosis(tuple(steps), "fix the model, the data or the learning rate first: FP32 fails too")
    low_loss, low_ok = _one_step(build_model().to(device), loss_fn, batch, device, dtype)
    fails = not (math.isfinite(low_loss) and low_ok)
    steps.append((f"Does it fail under {name} autocast?", f"Yes: loss {low_loss}, gradients "
                  f"{'finite' if low_ok else 'not finite'}." if fails else f"No: loss {low_loss:.4g}."))
    model = build_model().to(device)
    with NonFiniteLocator(model) as locator:
        from contextlib import nullcontext

        with torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext():
            loss = loss_fn(model, batch)
        loss.float().backward()
    steps.append(("Where is the first non-finite value?", locator.report.describe() if locator.report else
                  "Nowhere in this step."))
    worst = max(matmul_stats(build_model().to(device), lambda m: loss_fn(m, batch), name),
                key=lambda r: r.overflow + r.flush)
    if worst.overflow + worst.flush == 0:
        answer = (f"None: no linear layer's input or weight overflows or flushes in {name}; what fails happens "
                  "inside a module (see 3).")
    else:
        answer = (f"`{worst.layer}` {worst.operand}: {100 * worst.overflow:.2f}% of its values overflow, "
                  f"{100 * worst.flush:.2f}% flush.")
    steps.append((f"Does {name} lose any product operand?", answer))
    bf_loss, bf_ok = _one_step(build_model().to(device), loss_fn, batch, device, torch.bfloat16)
    bf_fine = math.isfinite(bf_loss) and bf_ok
    steps.append(("Does BF16 autocast run it?", f"Yes: loss {bf_loss:.4g}, every gradient finite." if bf_fine else
                  f"No (loss {bf_loss})."))
    if not fails:
        verdict = f"{name} runs this step; look at later steps (the monitor's log) or the loop (ScalerAudit)"
    elif locator.report is not None and bf_fine:
        verdict = (f"{'an' if name == 'FP16' else 'a'} {name} overflow in `{locator.report.module}` "
                   f"({locator.report.phase} pass): train in BF16, or keep that module in FP32 "
                   f"(monitor.keep_in_fp32(model, {locator.report.module!r}): autocast off, FP32 inputs)")
    elif locator.report is not None:
        verdict = f"a non-finite value made in `{locator.report.module}` that BF16 does not fix: a bug there"
    else:
        verdict = "non-finite outside the hooked modules: check the loss function and the data"
    return Diagnosis(tuple(steps), verdict)
