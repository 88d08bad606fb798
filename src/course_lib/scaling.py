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
from dataclasses import dataclass

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

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * scale``; backpropagating it gives gradients ``scale`` times too large."""
        if not isinstance(loss, torch.Tensor):
            raise TypeError(f"loss must be a torch.Tensor, got {type(loss).__name__}")
        return loss * torch.tensor(self.scale, dtype=torch.float32, device=loss.device)

    def inverse_scale(self) -> torch.Tensor:
        """``1/scale``: the reciprocal computed in float64, then rounded to float32 (as GradScaler does)."""
        return torch.tensor(1.0 / self.scale, dtype=torch.float64).to(torch.float32)

    def unscale_(self, grads: list[torch.Tensor]) -> bool:
        """Divide the gradients by the scale in place; return True when any of them holds inf or NaN."""
        if not isinstance(grads, (list, tuple)) or not all(isinstance(g, torch.Tensor) for g in grads):
            raise TypeError("grads must be a list of tensors")
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
        return found_inf

    def step(self, optimizer: torch.optim.Optimizer, found_inf: bool) -> bool:
        """Run ``optimizer.step()`` unless an inf/NaN was found; return whether it ran."""
        if found_inf:
            return False
        optimizer.step()
        return True

    def update(self, found_inf: bool) -> None:
        """Back off after an overflow; grow after ``growth_interval`` consecutive clean steps."""
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
        if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold < 0:
            raise ValueError(f"overflow thresholds are non-negative numbers, got {threshold!r}")
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
    """Train the course model with FP16 autocast and a real ``torch.amp.GradScaler``; log every step."""
    from .data import BatchSampler, load_corpus
    from .device import SizeProfile
    from .models import build_gpt, gpt_config_for

    if not isinstance(profile, SizeProfile):
        raise TypeError(f"profile must be a SizeProfile, got {type(profile).__name__}")
    _check_scaler_args(init_scale, growth_factor, backoff_factor, growth_interval)
    steps = profile.pick(small=60, full=2000) if steps is None else steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    device = torch.device(device)
    cfg = gpt_config_for(profile)
    sampler = BatchSampler(load_corpus(profile.pick(small=1_000_000, full=20_000_000)),
                           profile.pick(small=16, full=64), cfg.context, seed=seed)
    model = build_gpt(cfg, seed=seed, device=device)
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
