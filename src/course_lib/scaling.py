"""Dynamic loss scaling, from the inside.

:class:`TeachingLossScaler` is a from-scratch dynamic loss scaler written to be read. It reproduces
``torch.amp.GradScaler``'s arithmetic exactly (the tests run both side by side and compare the scale, the
growth tracker, the skip decisions and the unscaled gradients bit for bit):

* ``scale(loss)`` multiplies the loss by the current scale (a float32 number);
* ``unscale_(grads)`` multiplies every gradient by ``1/scale`` — the reciprocal computed in float64 and
  rounded to float32, as GradScaler does — and reports whether any gradient held an inf or NaN;
* ``step(optimizer, found_inf)`` calls the optimizer only when no inf/NaN was found (a skipped step);
* ``update(found_inf)``: after an overflow the scale is multiplied by ``backoff_factor`` and the growth
  tracker resets; after a clean step the tracker counts up, and only when it reaches ``growth_interval``
  (2000 by default) is the scale multiplied by ``growth_factor`` (and then only if the result is finite).
  The scale does **not** double after every clean step.
"""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Literal

import torch

# torch.amp.GradScaler's defaults (checked against the installed torch in the tests)
DEFAULT_INIT_SCALE = 2.0**16
DEFAULT_GROWTH_FACTOR = 2.0
DEFAULT_BACKOFF_FACTOR = 0.5
DEFAULT_GROWTH_INTERVAL = 2000


def _check_scaler_args(init_scale, growth_factor, backoff_factor, growth_interval) -> None:
    for name, value in (("init_scale", init_scale), ("growth_factor", growth_factor),
                        ("backoff_factor", backoff_factor)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise TypeError(f"{name} must be a finite number, got {value!r}")
    if init_scale <= 0:
        raise ValueError(f"init_scale must be positive, got {init_scale}")
    if growth_factor <= 1.0:
        raise ValueError(f"growth_factor must be > 1, got {growth_factor}")
    if not 0.0 < backoff_factor < 1.0:
        raise ValueError(f"backoff_factor must lie in (0, 1), got {backoff_factor}")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, int) or growth_interval < 1:
        raise ValueError(f"growth_interval must be a positive int, got {growth_interval!r}")


def _to_float32(x: float) -> float:
    """Round a Python float (float64) to the nearest float32, as storing it in a float32 tensor does."""
    return float(torch.tensor(x, dtype=torch.float64).to(torch.float32))


class TeachingLossScaler:
    """A dynamic loss scaler with GradScaler's exact arithmetic, written for reading.

    The state is two numbers: ``scale`` (a float32 value, kept here as a Python float that is always
    exactly representable in float32) and ``growth_tracker`` (clean steps since the last change).
    """

    def __init__(self, init_scale: float = DEFAULT_INIT_SCALE, growth_factor: float = DEFAULT_GROWTH_FACTOR,
                 backoff_factor: float = DEFAULT_BACKOFF_FACTOR,
                 growth_interval: int = DEFAULT_GROWTH_INTERVAL):
        _check_scaler_args(init_scale, growth_factor, backoff_factor, growth_interval)
        self.scale = _to_float32(float(init_scale))
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = growth_interval
        self.growth_tracker = 0
        self._unscaled = False  # unscale_ ran since the last update()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale``; backpropagating it gives gradients ``scale`` times too large."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        return loss * torch.tensor(self.scale, dtype=torch.float32, device=loss.device)

    def inverse_scale(self) -> torch.Tensor:
        """``1/scale``: the reciprocal computed in float64, then rounded to float32 (as GradScaler does).

        A scale that backed off all the way to 0.0 gives an infinite inverse, as in GradScaler: unscaling
        then turns every gradient into NaN (0 * inf) without reporting an overflow.
        """
        return torch.tensor(self.scale, dtype=torch.float64).reciprocal().to(torch.float32)

    def unscale_(self, grads: list[torch.Tensor]) -> bool:
        """Divide the gradients by the scale in place; return True when any of them holds inf or NaN."""
        if not isinstance(grads, (list, tuple)) or not all(isinstance(g, torch.Tensor) for g in grads):
            raise TypeError("grads must be a list of tensors")
        if self._unscaled:
            # GradScaler refuses a second unscale_ before update(): it would divide by the scale again
            raise RuntimeError("unscale_() has already been called since the last update(); a second call "
                               "would divide the gradients by the scale again.")
        if any(g.dtype == torch.float16 for g in grads):
            # GradScaler refuses these with the same message: the parameters (and so the gradients) must
            # stay FP32 under mixed precision; unscaling in FP16 would underflow again.
            raise ValueError("Attempting to unscale FP16 gradients. Keep the model's parameters in FP32 "
                             "(autocast handles the FP16 compute); do not call model.half().")
        found_inf = False
        for g in grads:
            if not bool(torch.isfinite(g).all()):
                found_inf = True
            g.mul_(self.inverse_scale().to(g.device))
        self._unscaled = True
        return found_inf

    def step(self, optimizer: torch.optim.Optimizer, found_inf: bool) -> bool:
        """Run ``optimizer.step()`` unless an inf/NaN was found; return whether it ran."""
        if found_inf:
            return False
        optimizer.step()
        return True

    def update(self, found_inf: bool) -> None:
        """Back off after an overflow; grow after ``growth_interval`` consecutive clean steps."""
        self._unscaled = False
        if found_inf:
            self.scale = _to_float32(self.scale * self.backoff_factor)
            self.growth_tracker = 0
            return
        clean_steps = self.growth_tracker + 1
        if clean_steps == self.growth_interval:
            grown = _to_float32(self.scale * self.growth_factor)
            if math.isfinite(grown):
                self.scale = grown
            self.growth_tracker = 0
        else:
            self.growth_tracker = clean_steps


    def state_dict(self) -> dict:
        """The scaler's state under the keys ``torch.amp.GradScaler.state_dict()`` uses."""
        return {"scale": self.scale, "growth_factor": self.growth_factor, "backoff_factor": self.backoff_factor,
                "growth_interval": self.growth_interval, "_growth_tracker": self.growth_tracker}

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` (or from a ``torch.amp.GradScaler``'s state dict)."""
        if not isinstance(state, dict):
            raise TypeError(f"state must be a dict, got {type(state).__name__}")
        missing = [k for k in ("scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker")
                   if k not in state]
        if missing:
            raise ValueError(f"scaler state lacks {', '.join(missing)}")
        self.scale = _to_float32(float(state["scale"]))
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self.growth_tracker = int(state["_growth_tracker"])
        self._unscaled = False


# ---- replaying a scale schedule -----------------------------------------------------------------------

@dataclass(frozen=True)
class ScaleTrace:
    """Per-step history of a dynamic loss scale: the scale each step used, whether it overflowed
    (and was skipped), and the growth tracker after the step."""

    scales: tuple[float, ...]
    skipped: tuple[bool, ...]
    growth_trackers: tuple[int, ...]
    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped)

    @property
    def final_scale(self) -> float:
        return self.scales[-1] if self.scales else self.init_scale


def replay_scale_schedule(
    overflow_threshold: list[float] | tuple[float, ...],
    *,
    init_scale: float = DEFAULT_INIT_SCALE,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR,
    growth_interval: int = DEFAULT_GROWTH_INTERVAL,
) -> ScaleTrace:
    """What a dynamic scaler would do on a recorded stream of steps ("what-if" replays).

    ``overflow_threshold[i]``: the smallest loss scale at which step ``i``'s gradients overflow (``inf``
    for a step that never overflows, ``0`` for one that always does, e.g. a NaN in the data). A step
    overflows when its scale is >= its threshold.
    """
    scaler = TeachingLossScaler(init_scale, growth_factor, backoff_factor, growth_interval)
    scales, skipped, trackers = [], [], []
    for threshold in overflow_threshold:
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not threshold >= 0:
            raise ValueError(f"overflow thresholds are non-negative numbers (inf allowed, NaN not), "
                             f"got {threshold!r}")
        overflow = scaler.scale >= threshold
        scales.append(scaler.scale)
        skipped.append(overflow)
        scaler.update(overflow)
        trackers.append(scaler.growth_tracker)
    return ScaleTrace(tuple(scales), tuple(skipped), tuple(trackers), float(init_scale),
                      float(growth_factor), float(backoff_factor), growth_interval)


def steps_to_double(growth_interval: int = DEFAULT_GROWTH_INTERVAL) -> int:
    """Clean steps the scale needs to grow once: ``growth_interval`` (checked by replaying)."""
    trace = replay_scale_schedule([math.inf] * (growth_interval + 1), growth_interval=growth_interval)
    for i, s in enumerate(trace.scales):
        if s > trace.init_scale:
            return i
    raise AssertionError("the scale never grew")  # pragma: no cover - replay always grows here


@dataclass(frozen=True)
class ScalerDefaults:
    """The defaults of the installed ``torch.amp.GradScaler``, read from a fresh instance."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int


def grad_scaler_defaults(device: str = "cpu") -> ScalerDefaults:
    """Read GradScaler's defaults from the installed torch (pass the device: without one GradScaler
    targets CUDA and silently disables itself on a machine without a GPU)."""
    s = torch.amp.GradScaler(device)
    return ScalerDefaults(s.get_scale(), s.get_growth_factor(), s.get_backoff_factor(),
                          s.get_growth_interval())


# ---- a flight recorder for a real GradScaler run --------------------------------------------------------

@dataclass(frozen=True)
class FlightRecording:
    """Per-step log of a real ``torch.amp.GradScaler`` run on the course model (FP16 autocast).

    ``scales[i]``: the scale step ``i`` used; ``skipped[i]``: the optimizer did not step (seen through an
    optimizer step hook, a public API); ``growth_trackers[i]``: GradScaler's tracker after its update
    (``state_dict()``); ``max_activation_grad[i]``: the largest finite unscaled magnitude of any FP16
    activation gradient in the backward pass (for what-if replays).
    """

    losses: tuple[float, ...]
    scales: tuple[float, ...]
    skipped: tuple[bool, ...]
    growth_trackers: tuple[int, ...]
    max_activation_grad: tuple[float, ...]
    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    device: str

    @property
    def steps(self) -> int:
        return len(self.losses)

    def overflow_thresholds(self, fmt_max: float = 65504.0) -> tuple[float, ...]:
        """Per step, the smallest scale at which it would overflow, for :func:`replay_scale_schedule`.

        Model: a step overflows when its largest activation gradient times the scale exceeds the FP16
        maximum. A step that did overflow gets at most the scale it overflowed at, so replaying the
        recorded parameters reproduces the recorded run.
        """
        out = []
        for m, scale, skipped in zip(self.max_activation_grad, self.scales, self.skipped):
            threshold = fmt_max / m if m > 0 else math.inf
            # an exact hit of fmt_max is still finite: overflow needs strictly more
            threshold = math.nextafter(threshold, math.inf)
            out.append(min(threshold, scale) if skipped else threshold)
        return tuple(out)

    def as_trace(self) -> ScaleTrace:
        return ScaleTrace(self.scales, self.skipped, self.growth_trackers, self.init_scale,
                          self.growth_factor, self.backoff_factor, self.growth_interval)


def record_grad_scaler_run(
    profile,
    device: torch.device | str = "cpu",
    *,
    steps: int | None = None,
    init_scale: float = DEFAULT_INIT_SCALE,
    growth_factor: float = DEFAULT_GROWTH_FACTOR,
    backoff_factor: float = DEFAULT_BACKOFF_FACTOR,
    growth_interval: int = DEFAULT_GROWTH_INTERVAL,
    lr: float = 3e-3,
    seed: int = 0,
) -> FlightRecording:
    """Train the course model with FP16 autocast and a real ``torch.amp.GradScaler``; log every step.

    The recording ends early if the scale collapses to zero (every step overflowed until repeated
    back-offs reached zero in float32, as happens when the forward pass itself is non-finite): from
    there on torch's scaler stays at zero and no later step can carry information.
    """
    from .models import course_setup

    setup = course_setup(profile, device, steps=steps, default_steps=(60, 2000), seed=seed)
    _check_scaler_args(init_scale, growth_factor, backoff_factor, growth_interval)
    steps, device, sampler = setup.steps, setup.device, setup.sampler
    model = setup.model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(device.type, init_scale=init_scale, growth_factor=growth_factor,
                                  backoff_factor=backoff_factor, growth_interval=growth_interval)
    stepped = []
    opt.register_step_post_hook(lambda *_: stepped.append(True))
    largest = [0.0]

    def watch(_module, _inputs, output):
        if isinstance(output, torch.Tensor) and output.requires_grad:
            def on_grad(g):
                finite = g[torch.isfinite(g)]
                if finite.numel():
                    largest[0] = max(largest[0], float(finite.abs().max()))
            output.register_hook(on_grad)

    handles = [m.register_forward_hook(watch) for m in model.modules() if isinstance(m, torch.nn.Linear)]
    losses, scales, skipped, trackers, maxima = [], [], [], [], []
    try:
        for step in range(steps):
            x, y = sampler.batch(step, device)
            with torch.autocast(device.type, dtype=torch.float16):
                _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            scale = scaler.get_scale()
            if scale == 0.0:
                break
            largest[0] = 0.0
            n_before = len(stepped)
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            losses.append(float(loss.detach()))
            scales.append(scale)
            skipped.append(len(stepped) == n_before)
            trackers.append(int(scaler.state_dict()["_growth_tracker"]))
            maxima.append(largest[0] / scale)
    finally:
        for h in handles:
            h.remove()
    return FlightRecording(tuple(losses), tuple(scales), tuple(skipped), tuple(trackers), tuple(maxima),
                           float(init_scale), float(growth_factor), float(backoff_factor), growth_interval,
                           str(device))


# ---- pitfalls: an auditor that watches a real GradScaler loop ----------------------------------------

PITFALLS = {
    "disabled_scaler": "GradScaler is disabled: created without a device on a machine without CUDA (it "
                       "targets 'cuda' by default and silently turns itself off). Pass the device: "
                       "torch.amp.GradScaler('cpu') or torch.amp.GradScaler('cuda').",
    "clip_before_unscale": "Gradients were clipped (or their norm measured) while still scaled: the "
                           "threshold applied to gradients `scale` times too large. Call "
                           "scaler.unscale_(optimizer) before clipping or measuring them.",
    "update_every_microbatch": "scaler.step/update ran before all micro-batches of an accumulation window "
                               "were scaled and backpropagated: with gradient accumulation, scale every "
                               "micro-batch's loss but step and update only once per window.",
    "scheduler_on_skipped_step": "The LR scheduler stepped on an iteration whose optimizer step was skipped "
                                 "(inf/NaN gradients). Step the scheduler only when the optimizer stepped: "
                                 "compare scaler.get_scale() before and after update(), or use an optimizer "
                                 "step hook.",
    "unscale_twice": "scaler.unscale_(optimizer) was called twice before update(): the second call would "
                     "divide the gradients by the scale again. GradScaler refuses it.",
    "fp16_params": "The model's parameters are FP16 (model.half()), so their gradients are FP16 and "
                   "GradScaler refuses to unscale them. Keep parameters in FP32 and let autocast run the "
                   "FP16 compute.",
    "fp16_autocast_without_scaler": "backward() ran on a loss computed under FP16 autocast without "
                                    "GradScaler: small gradients flush to zero in FP16 (lesson 2). Scale the "
                                    "loss with torch.amp.GradScaler(device), or use BF16.",
    "scaler_with_bf16": "GradScaler scaled a loss computed under BF16 autocast: BF16 has FP32's range, so "
                        "scaling buys nothing and costs a pass over the gradients. Drop the scaler for BF16.",
    "eval_without_autocast": "A warning more than a mistake: the model was evaluated (eval mode) without "
                             "the autocast it was trained under, so the evaluation measures a different "
                             "numeric model than the one trained. Often harmless; evaluate under the same "
                             "autocast, or check once that the two agree.",
    "mixed_autocast_dtypes": "One iteration ran parts of the model under FP16 autocast and parts under "
                             "BF16 autocast: two formats, two failure modes, and FP16's needs a scaler. "
                             "Use one low-precision dtype (and autocast(enabled=False) for FP32 parts).",
    "unaligned_matmul": "A linear layer's input or output width is not a multiple of 8: on a GPU, FP16/BF16 "
                        "tensor cores want multiples of 8 (lesson 6 measured the cost of misalignment). Pad "
                        "the width where the layer is large; a 1- or 10-wide output head costs little.",
    "bf16_without_native_support": "BF16 autocast on a GPU below compute capability 8.0: it has no BF16 "
                                   "tensor cores (torch.cuda.is_bf16_supported() still says True there, and "
                                   "BF16 runs without them). Use FP16 with GradScaler there.",
}

LOW_PRECISION_DTYPES = (torch.float16, torch.bfloat16)


def _autocast_enabled(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # pragma: no cover - torch before 2.4 has no device argument
        return bool(torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled())


@dataclass(frozen=True)
class Finding:
    """One pitfall detected, where first seen: ``iteration`` is the number of ``update()`` calls before it."""

    pitfall: str
    iteration: int
    message: str


class ScalerAudit:
    """Watches a training loop that uses a real ``torch.amp.GradScaler`` and reports known pitfalls.

    Use as a context manager around the loop::

        with ScalerAudit(scaler, optimizer, scheduler=sched, accumulation_steps=4) as audit:
            ...  # the unchanged training loop
        audit.findings

    It wraps the scaler's methods, the gradient clipping and norm functions (also where the loop imported
    them by name: the wrapper sits on the function they call), ``torch.autocast``'s entry,
    ``Tensor.backward`` and the scheduler's ``step`` for the duration, and restores them on exit; with
    ``model`` it also watches the model's forward (train or eval mode, under autocast or not) and its layer
    widths. ``scaler`` may be None for a loop that has none. A GradScaler error inside the loop
    (``unscale_`` twice, FP16 gradients) is recorded as a finding and re-raised.
    """

    def __init__(self, scaler, optimizer, *, scheduler=None, accumulation_steps: int = 1, model=None):
        if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
            raise TypeError(f"scaler must be a torch.amp.GradScaler or None, got {type(scaler).__name__}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be a positive int, got {accumulation_steps!r}")
        self.scaler, self.optimizer, self.scheduler = scaler, optimizer, scheduler
        self.accumulation_steps = accumulation_steps
        self.findings: list[Finding] = []
        self._iteration = 0
        self._unscaled = False
        self._stepped = False
        self._scaled_since_update = 0
        self._saved: list[tuple[object, str, object]] = []
        self.model = model
        self._iter_dtypes: set = set()
        self._scaled_ids: set[int] = set()
        self._train_autocast = False
        self._handles: list = []

    def _new_iteration(self) -> None:
        self._iter_dtypes = set()
        self._scaled_ids = set()

    def _on_autocast(self, device_type: str, dtype) -> None:
        if dtype not in LOW_PRECISION_DTYPES:
            return
        self._iter_dtypes.add(dtype)
        if len(self._iter_dtypes) > 1:
            self._flag("mixed_autocast_dtypes")
        if (device_type == "cuda" and dtype == torch.bfloat16 and torch.cuda.is_available()
                and torch.cuda.get_device_capability() < (8, 0)):
            self._flag("bf16_without_native_support")
        if self.model is not None:
            for m in self.model.modules():
                if isinstance(m, torch.nn.Linear) and (m.in_features % 8 or m.out_features % 8):
                    self._flag("unaligned_matmul")
                    break

    def _flag(self, pitfall: str) -> None:
        if not any(f.pitfall == pitfall for f in self.findings):  # report each pitfall once, where first seen
            self.findings.append(Finding(pitfall, self._iteration, PITFALLS[pitfall]))

    def _patch(self, owner, name: str, wrapper) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, owner.__dict__.get(name)))
        setattr(owner, name, wrapper(original))

    def __enter__(self) -> "ScalerAudit":
        if self.scaler is not None and not self.scaler.is_enabled():
            self._flag("disabled_scaler")
        audit = self

        def on_step(*_):
            audit._stepped = True
            if audit.scaler is None:
                audit._new_iteration()   # without a scaler, the optimizer step ends the iteration
        self._hook = self.optimizer.register_step_post_hook(on_step)

        def wrap_scale(original):
            def scale(outputs):
                audit._scaled_since_update += 1
                if audit._iter_dtypes and audit._iter_dtypes <= {torch.bfloat16} and audit.scaler.is_enabled():
                    audit._flag("scaler_with_bf16")
                result = original(outputs)
                if isinstance(result, torch.Tensor):
                    audit._scaled_ids.add(id(result))
                return result
            return scale

        def wrap_unscale(original):
            def unscale_(optimizer):
                try:
                    result = original(optimizer)
                except RuntimeError as exc:
                    if "already been called" in str(exc):
                        audit._flag("unscale_twice")
                    raise
                except ValueError as exc:
                    if "FP16 gradients" in str(exc):
                        audit._flag("fp16_params")
                    raise
                audit._unscaled = True
                return result
            return unscale_

        def wrap_step(original):
            def step(optimizer, *args, **kwargs):
                if audit._scaled_since_update < audit.accumulation_steps:
                    audit._flag("update_every_microbatch")
                try:
                    return original(optimizer, *args, **kwargs)
                except ValueError as exc:
                    if "FP16 gradients" in str(exc):
                        audit._flag("fp16_params")
                    raise
            return step

        def wrap_update(original):
            def update(*args, **kwargs):
                result = original(*args, **kwargs)
                audit._new_iteration()
                audit._iteration += 1
                audit._unscaled = False
                audit._scaled_since_update = 0
                audit._last_update_stepped = audit._stepped
                audit._stepped = False
                return result
            return update

        def wrap_clip(original):
            def clip(*args, **kwargs):
                if audit.scaler is not None and audit.scaler.is_enabled() and not audit._unscaled:
                    audit._flag("clip_before_unscale")
                return original(*args, **kwargs)
            return clip

        def wrap_autocast_enter(original):
            def enter(ac):
                result = original(ac)
                if getattr(ac, "_enabled", False):
                    audit._on_autocast(ac.device, ac.fast_dtype)
                return result
            return enter

        def wrap_backward(original):
            def backward(tensor, *args, **kwargs):
                scaled = (audit.scaler is not None and audit.scaler.is_enabled()
                          and id(tensor) in audit._scaled_ids)
                if torch.float16 in audit._iter_dtypes and not scaled:
                    audit._flag("fp16_autocast_without_scaler")
                return original(tensor, *args, **kwargs)
            return backward

        if self.scaler is not None:
            self._patch(self.scaler, "scale", wrap_scale)
            self._patch(self.scaler, "unscale_", wrap_unscale)
            self._patch(self.scaler, "step", wrap_step)
            self._patch(self.scaler, "update", wrap_update)
        for fn in ("clip_grad_norm_", "clip_grad_value_"):
            self._patch(torch.nn.utils, fn, wrap_clip)
        # a loop that did `from torch.nn.utils import clip_grad_norm_` holds the original function, which
        # computes the norm through a module-level helper: wrap that helper (where this torch has it)
        import torch.nn.utils.clip_grad as clip_module
        if hasattr(clip_module, "_get_total_norm"):
            self._patch(clip_module, "_get_total_norm", wrap_clip)
        self._patch(torch.autocast, "__enter__", wrap_autocast_enter)
        self._patch(torch.Tensor, "backward", wrap_backward)
        if self.model is not None:
            device_type = next((p.device.type for p in self.model.parameters()), "cpu")

            def watch_forward(module, args):
                on = _autocast_enabled(device_type)
                if module.training:
                    audit._train_autocast = audit._train_autocast or on
                elif audit._train_autocast and not on:
                    audit._flag("eval_without_autocast")
            self._handles.append(self.model.register_forward_pre_hook(watch_forward))
        if self.scheduler is not None:
            def wrap_sched(original):
                def step(*args, **kwargs):
                    if getattr(audit, "_last_update_stepped", True) is False and audit.scaler.is_enabled():
                        audit._flag("scheduler_on_skipped_step")
                    return original(*args, **kwargs)
                return step
            self._patch(self.scheduler, "step", wrap_sched)
        return self

    def __exit__(self, *exc) -> Literal[False]:
        for owner, name, previous in reversed(self._saved):
            if isinstance(owner, (type, types.ModuleType)):
                setattr(owner, name, previous)   # a class's or module's own attribute, put back
            elif previous is None:
                delattr(owner, name)  # back to the class's method
            else:  # pragma: no cover - an attribute that was already an instance override
                setattr(owner, name, previous)
        self._saved.clear()
        self._hook.remove()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False

    @property
    def pitfalls(self) -> list[str]:
        return [f.pitfall for f in self.findings]


@dataclass(frozen=True)
class PitfallDemo:
    """The outcome of running a small training loop with (or without) one planted mistake."""

    name: str
    findings: tuple[Finding, ...]
    error: str | None       # the exception GradScaler raised, if it raised one
    optimizer_steps: int
    scheduler_steps: int
    update_norm: float = 0.0  # how far the weights moved over the run (L2 norm of final minus initial)
    final_scale: float = 0.0  # the scaler's scale at the end


def run_pitfall_demo(name: str | None, *, iterations: int = 4, device: str = "cpu") -> PitfallDemo:
    """Run a small regression loop with GradScaler on ``device`` under :class:`ScalerAudit`, with the
    mistake ``name`` planted (one of :data:`PITFALLS`), or the correct loop when ``name`` is None.

    The loop: a linear model, MSE loss, SGD, a StepLR scheduler, gradient clipping, and accumulation over
    two micro-batches. The first iteration overflows on purpose (an enormous initial scale), so a skipped
    step happens in every run.
    """
    import warnings
    from unittest import mock

    if name is not None and name not in PITFALLS:
        raise ValueError(f"unknown pitfall {name!r}; known: {', '.join(PITFALLS)}")
    gen = torch.Generator().manual_seed(0)
    # the mistakes of autocast loops get an autocast loop, with layer widths a tensor core likes (except
    # the one about widths); the others keep the plain loop of lesson 3
    autocast_demo = name in AUTOCAST_PITFALLS_DTYPE
    with torch.random.fork_rng(devices=[]):  # the same initial weights in every demo, global RNG untouched
        torch.manual_seed(0)
        if name == "mixed_autocast_dtypes":
            model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8))
        elif autocast_demo and name != "unaligned_matmul":
            model = torch.nn.Linear(8, 8)
        else:
            model = torch.nn.Linear(8, 1)
    if name == "fp16_params":
        model = model.half()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    initial = [p.detach().float().clone() for p in model.parameters()]
    opt_steps: list[bool] = []
    opt.register_step_post_hook(lambda *_: opt_steps.append(True))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the no-device GradScaler warns that CUDA is missing
        if name == "disabled_scaler":
            # The mistake as it happens on a machine without CUDA: no device given, so GradScaler targets
            # 'cuda', finds no CUDA and turns itself off. On a GPU machine, hide CUDA from it for this one
            # construction, so the demo plants the same mistake everywhere.
            with mock.patch.object(torch.cuda, "is_available", return_value=False):
                scaler = torch.amp.GradScaler()
        elif autocast_demo:
            # FP16 gradients overflow at 65504, where FP32's overflow at 3.4e38: the autocast loops keep
            # GradScaler's defaults and a loss of about 1 (no planted first-step overflow)
            scaler = torch.amp.GradScaler(device)
        else:
            # the first step overflows (2**120 times a loss of about 1e4 exceeds float32's 3.4e38), then
            # the scale backs off to 2**20, where every later step is finite
            scaler = torch.amp.GradScaler(device, init_scale=2.0**120, backoff_factor=2.0**-100,
                                          growth_interval=1000)
    accumulation = 2
    sched_steps, error = [0], None
    no_scaler = name in ("fp16_autocast_without_scaler", "bf16_without_native_support")
    patches = []
    if name == "bf16_without_native_support":
        # what a GPU of compute capability 7.5 (a T4) reports, on any machine; only the autocast entry sees it
        # (torch.cuda.is_bf16_supported() says True there: BF16 runs, emulated)
        patches = [mock.patch.object(torch.cuda, "is_available", return_value=True),
                   mock.patch.object(torch.cuda, "is_bf16_supported", return_value=True),
                   mock.patch.object(torch.cuda, "get_device_capability", return_value=(7, 5))]
    for patch in patches:
        patch.start()
    audit = ScalerAudit(None if no_scaler else scaler, opt, scheduler=sched, accumulation_steps=accumulation,
                        model=model)
    try:
        audit.__enter__()
        try:
            for _ in range(iterations):
                opt.zero_grad(set_to_none=True)
                steps_before = len(opt_steps)
                for micro in range(accumulation):
                    x = torch.randn(16, 8, generator=gen).to(next(model.parameters()).dtype)
                    # large enough to overflow at 2**120, small enough that the unscaled gradient norm
                    # stays finite in float32 (at 1e20 its square would overflow and clipping zero it)
                    loss = ((_demo_forward(name, model, x).float() - 1.0) ** 2).mean() * (1.0 if autocast_demo
                                                                                            else 1e4)
                    if no_scaler:
                        (loss / accumulation).backward()
                        continue
                    scaler.scale(loss / accumulation).backward()
                    if name == "update_every_microbatch":  # otherwise a correct step: unscale, clip
                        scaler.unscale_(opt)
                        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                        scaler.step(opt)
                        scaler.update()
                if name == "update_every_microbatch":
                    # the loop steps its scheduler once per iteration when the optimizer stepped in it
                    if len(opt_steps) > steps_before:
                        sched.step()
                        sched_steps[0] += 1
                    continue
                if no_scaler:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    sched.step()
                    sched_steps[0] += 1
                    continue
                if name != "clip_before_unscale":
                    scaler.unscale_(opt)
                if name == "unscale_twice":
                    scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                before = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                skipped = scaler.get_scale() < before  # the public way to know the step was skipped
                if name == "scheduler_on_skipped_step" or not skipped:
                    sched.step()
                    sched_steps[0] += 1
                if name == "eval_without_autocast":
                    model.eval()
                    with torch.no_grad():
                        model(torch.randn(4, 8, generator=gen))   # evaluated without the training autocast
                    model.train()
        except (RuntimeError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
    finally:
        audit.__exit__(None, None, None)
        for patch in reversed(patches):
            patch.stop()
    moved = math.sqrt(sum(float(((p.detach().float() - p0) ** 2).sum())
                          for p, p0 in zip(model.parameters(), initial)))
    return PitfallDemo(name or "correct loop", tuple(audit.findings), error, len(opt_steps), sched_steps[0],
                       moved, float(scaler.get_scale()))


AUTOCAST_PITFALLS_DTYPE = {"fp16_autocast_without_scaler": torch.float16, "scaler_with_bf16": torch.bfloat16,
                   "eval_without_autocast": torch.float16, "mixed_autocast_dtypes": torch.float16,
                   "unaligned_matmul": torch.float16, "bf16_without_native_support": torch.bfloat16}


def _demo_forward(name, model, x):
    """The demo loop's forward: plain, or under the autocast its pitfall needs."""
    if name not in AUTOCAST_PITFALLS_DTYPE:
        return model(x)
    if name == "mixed_autocast_dtypes":
        with torch.autocast("cpu", dtype=torch.float16):
            h = model[0](x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model[1](h.float())
    device_type = "cuda" if name == "bf16_without_native_support" else "cpu"
    with torch.autocast(device_type, dtype=AUTOCAST_PITFALLS_DTYPE[name]):
        return model(x)


# ---- static against dynamic scaling on the real model -------------------------------------------------

@dataclass(frozen=True)
class ScalingRun:
    """One FP16-autocast training run: losses, scale per step, skipped steps."""

    label: str
    losses: tuple[float, ...]
    scales: tuple[float, ...]
    skipped: tuple[bool, ...]

    @property
    def n_skipped(self) -> int:
        return sum(self.skipped)


def train_with_loss_scaling(profile, device: torch.device | str = "cpu", *, static_scales=(1.0, 2.0**8, 2.0**24),
                            steps: int | None = None, dynamic_growth_interval: int | None = None,
                            seed: int = 0, lr: float = 3e-3) -> list[ScalingRun]:
    """Train the course GPT with FP16 autocast under each static loss scale and under GradScaler.

    Static scaling multiplies the loss by a fixed number, unscales the gradients and skips a step whose
    gradients are not finite, never changing the scale. Every run starts from the same weights and sees
    the same batches.
    """
    from .models import course_setup

    setup = course_setup(profile, device, steps=steps, default_steps=(30, 1000), seed=seed)
    steps, device, sampler = setup.steps, setup.device, setup.sampler
    interval = profile.pick(small=10, full=DEFAULT_GROWTH_INTERVAL) if dynamic_growth_interval is None \
        else dynamic_growth_interval
    for s in static_scales:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (s > 0 and math.isfinite(s)):
            raise ValueError(f"static loss scales must be positive finite numbers, got {s!r}")
    runs = []

    def name(scale: float) -> str:
        exponent = math.log2(scale)
        return f"static 2^{int(exponent)}" if exponent == int(exponent) else f"static {scale:g}"

    for label, static in [*((name(float(s)), float(s)) for s in static_scales), ("dynamic (GradScaler)", None)]:
        model = setup.model(seed)
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device.type, growth_interval=interval) if static is None else None
        losses, scales, skipped = [], [], []
        for step in range(steps):
            x, y = sampler.batch(step, device)
            with torch.autocast(device.type, dtype=torch.float16):
                _, loss = model(x, y)
            opt.zero_grad(set_to_none=True)
            if scaler is None:
                assert static is not None
                (loss * static).backward()
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                finite = all(bool(torch.isfinite(g).all()) for g in grads)
                if finite:
                    for g in grads:
                        g.div_(static)
                    opt.step()
                scales.append(static)
                skipped.append(not finite)
            else:
                scale = scaler.get_scale()
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                scales.append(scale)
                skipped.append(scaler.get_scale() < scale)
            losses.append(float(loss.detach()))
        runs.append(ScalingRun(label, tuple(losses), tuple(scales), tuple(skipped)))
    return runs



@dataclass(frozen=True)
class ScaleFidelity:
    """How close FP16-autocast gradients come to FP32's, per parameter, under each loss scale.

    ``error[scale][name]``: relative L2 error of the unscaled FP16-autocast gradient against the FP32
    gradient of the same weights and batch (mean over the batches); ``lost[scale][name]``: share of the
    entries that are non-zero in FP32 and exactly zero under autocast; ``overflowed[scale]``: whether any
    gradient was inf/NaN on any batch (the step a scaler would skip; no error is measured then)."""

    scales: tuple[float, ...]
    names: tuple[str, ...]
    steps: int
    batches: int
    error: dict[float, dict[str, float]]
    lost: dict[float, dict[str, float]]
    overflowed: dict[float, bool]

    def worst(self, scale: float) -> tuple[str, float]:
        """The parameter with the largest error under ``scale``, and that error."""
        name = max(self.error[scale], key=lambda n: self.error[scale][n])
        return name, self.error[scale][name]


def scale_gradient_fidelity(profile, device: torch.device | str = "cpu", *,
                            scales=(1.0, 2.0**8, 2.0**16, 2.0**24), steps: int | None = None, batches: int = 2,
                            seed: int = 0, lr: float = 3e-3) -> ScaleFidelity:
    """Train the course GPT in FP32 for ``steps`` steps (gradients shrink as the loss falls), then, on
    ``batches`` batches it did not train on, compare each parameter's gradient from an FP16-autocast
    backward of ``loss * scale`` (divided by the scale afterwards) with the FP32 gradient. Unlike a
    training curve under Adam, which divides the scale out of every update, this shows what the scale does
    to the gradients themselves."""
    from .models import course_setup

    scales = tuple(float(sc) for sc in scales)
    if not scales or any(not (sc > 0 and math.isfinite(sc)) for sc in scales):
        raise ValueError(f"scales must be positive finite numbers, got {scales!r}")
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ValueError(f"batches must be a positive int, got {batches!r}")
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 300), seed=seed)
    dev, sampler = setup.device, setup.sampler
    model = setup.model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(setup.steps):
        opt.zero_grad(set_to_none=True)
        model(*sampler.batch(step, dev))[1].backward()
        opt.step()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    sq_err = {sc: {n: 0.0 for n, _ in named} for sc in scales}
    lost = {sc: {n: 0.0 for n, _ in named} for sc in scales}
    overflowed = {sc: False for sc in scales}
    ref_sq = {n: 0.0 for n, _ in named}
    for b in range(batches):
        x, y = sampler.batch(setup.steps + b, dev)
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
        ref = {n: p.grad.detach().clone() for n, p in named if p.grad is not None}
        for sc in scales:
            model.zero_grad(set_to_none=True)
            with torch.autocast(dev.type, dtype=torch.float16):
                loss = model(x, y)[1]
            (loss * sc).backward()
            for n, p in named:
                if n not in ref:
                    continue
                g = p.grad.detach().float() / sc if p.grad is not None else torch.zeros_like(ref[n])
                if not bool(torch.isfinite(g).all()):
                    overflowed[sc] = True
                    continue
                sq_err[sc][n] += float(((g - ref[n]) ** 2).sum()) / batches
                nonzero = ref[n] != 0
                lost[sc][n] += float(((g == 0) & nonzero).sum()) / max(1, int(nonzero.sum())) / batches
        for n, r in ref.items():
            ref_sq[n] += float((r ** 2).sum()) / batches
    names = tuple(n for n, _ in named if ref_sq[n] > 0)
    error = {sc: {n: math.nan if overflowed[sc] else math.sqrt(sq_err[sc][n] / ref_sq[n]) for n in names}
             for sc in scales}
    return ScaleFidelity(scales, names, setup.steps, batches, error,
                         {sc: {n: lost[sc][n] for n in names} for sc in scales}, overflowed)

def compare_with_grad_scaler(n_steps: int = 200, *, seed: int = 0, **scaler_kwargs) -> dict[str, int]:
    """Run :class:`TeachingLossScaler` and ``torch.amp.GradScaler`` side by side on a random gradient
    stream with planted inf and NaN; count the steps on which scale, tracker, skip decision and unscaled
    gradients agree bit for bit."""
    gen = torch.Generator().manual_seed(seed)
    real, mine = torch.amp.GradScaler("cpu", **scaler_kwargs), TeachingLossScaler(**scaler_kwargs)
    p_real, p_mine = torch.nn.Parameter(torch.zeros(64)), torch.nn.Parameter(torch.zeros(64))
    opt_real = torch.optim.SGD([p_real], lr=0.0)
    ran = []
    opt_real.register_step_post_hook(lambda *_: ran.append(True))
    agree = {"steps": 0, "scale": 0, "growth_tracker": 0, "skip": 0, "gradients": 0}
    for step in range(n_steps):
        c = torch.randn(64, generator=gen) * torch.exp2(torch.randint(-40, 10, (64,), generator=gen).float())
        if torch.rand((), generator=gen) < 0.05:
            c[3] = math.inf if step % 2 else math.nan
        opt_real.zero_grad(set_to_none=True)
        p_mine.grad = None
        real.scale((p_real * c).sum()).backward()
        mine.scale_loss((p_mine * c).sum()).backward()
        real.unscale_(opt_real)
        g_real, g_mine = p_real.grad, p_mine.grad
        assert g_real is not None and g_mine is not None
        found = mine.unscale_([g_mine])
        same_grads = bool(((g_real == g_mine) | (g_real.isnan() & g_mine.isnan())).all())
        n_ran = len(ran)
        real.step(opt_real)
        real.update()
        mine.update(found)
        state = real.state_dict()
        agree["steps"] += 1
        agree["scale"] += int(state["scale"] == mine.scale)
        agree["growth_tracker"] += int(state["_growth_tracker"] == mine.growth_tracker)
        agree["skip"] += int((len(ran) == n_ran) == found)
        agree["gradients"] += int(same_grads)
    return agree


def flight_recording_from_dict(data: dict) -> FlightRecording:
    """Rebuild a :class:`FlightRecording` from a recorded ``scaler_flight_recording``'s ``values["recording"]``."""
    if not isinstance(data, dict):
        raise ValueError(f"not a scaler flight recording: expected a dict, got {type(data).__name__}")
    try:
        return FlightRecording(**{k: tuple(v) if isinstance(v, list) else v  # type: ignore[arg-type]
                                  for k, v in data.items()})
    except TypeError as exc:
        raise ValueError(f"not a scaler flight recording: {exc}") from None
