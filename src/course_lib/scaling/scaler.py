"""A dynamic loss scaler written from scratch (checked bit for bit against ``torch.amp.GradScaler``), replays
of a scale schedule, and GradScaler's defaults."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Literal

import torch

# torch.amp.GradScaler's defaults (checked against the installed torch in the tests)
DEFAULT_INIT_SCALE = 2.0**16


DEFAULT_GROWTH_FACTOR = 2.0


DEFAULT_BACKOFF_FACTOR = 0.5


DEFAULT_GROWTH_INTERVAL = 2000


SCALER_ARGS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval")


def check_scaler_args(init_scale, growth_factor, backoff_factor, growth_interval) -> None:
    """Refuse scaler settings that make no sense, naming the argument and its value.

    Stricter than ``torch.amp.GradScaler``, which refuses only ``growth_factor <= 1`` and
    ``backoff_factor >= 1`` (with an AssertionError) and silently accepts a zero, negative, infinite or NaN
    scale, a scale whose float32 inverse overflows, a backoff factor <= 0 and a growth interval < 1."""
    for name, value in (("init_scale", init_scale), ("growth_factor", growth_factor),
                        ("backoff_factor", backoff_factor)):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{name} must be a real number, got {value!r} ({type(value).__name__})")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value!r}")
    if not init_scale > 0:
        raise ValueError(f"init_scale must be > 0, got {init_scale!r}")
    scale32 = _to_float32(float(init_scale))
    if not math.isfinite(scale32) or scale32 == 0.0:
        raise ValueError(f"init_scale={init_scale!r} rounds to {scale32} in float32, where the scale is kept")
    inverse = float(torch.tensor(scale32, dtype=torch.float64).reciprocal().to(torch.float32))
    if not math.isfinite(inverse):
        raise ValueError(f"init_scale={init_scale!r} is too small: its inverse overflows float32 (the "
                         f"scale must be at least about 2.9e-39), so unscaling would turn gradients into "
                         f"inf and NaN")
    if growth_factor <= 1.0:
        raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
    if not 0.0 < backoff_factor < 1.0:
        raise ValueError(f"backoff_factor must lie in (0, 1), got {backoff_factor!r}")
    if isinstance(growth_interval, bool) or not isinstance(growth_interval, numbers.Integral):
        raise TypeError(f"growth_interval must be an int (steps), got {growth_interval!r} "
                        f"({type(growth_interval).__name__})")
    if growth_interval < 1:
        raise ValueError(f"growth_interval must be a positive int (steps), got {growth_interval!r}")


def _to_float32(x: float) -> float:
    """Round a Python float (float64) to the nearest float32, as storing it in a float32 tensor does."""
    return float(torch.tensor(x, dtype=torch.float64).to(torch.float32))


@dataclass
class _OptimizerRecord:
    """What one optimizer did since the last ``update()``: unscaled (and maybe stepped); ``found_inf`` is
    None when none of its parameters had a gradient to check."""

    stage: Literal["unscaled", "stepped"]
    found_inf: bool | None


def _gradients_to_unscale(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's gradients, as GradScaler finds them (the values of a sparse gradient)."""
    grads = []
    for group_index, group in enumerate(optimizer.param_groups):
        for index, param in enumerate(group["params"]):
            grad = param.grad
            if grad is None:
                continue
            if grad.dtype == torch.float16:
                # GradScaler refuses these with the same message: the parameters (and so the gradients) must
                # stay FP32 under mixed precision; unscaling in FP16 would underflow again.
                raise ValueError("Attempting to unscale FP16 gradients. Keep the model's parameters in FP32 "
                                 "(autocast handles the FP16 compute); do not call model.half().")
            if not grad.dtype.is_floating_point:
                # GradScaler's unscale kernel is "not implemented" for these (NotImplementedError)
                raise TypeError(f"cannot unscale the gradient of parameter {index} in param group "
                                f"{group_index}: its dtype is {grad.dtype}, and loss scaling needs "
                                f"floating-point gradients")
            grads.append(grad._values() if grad.is_sparse else grad)
    return grads


def _check_optimizer(optimizer) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")


class TeachingLossScaler:
    """A dynamic loss scaler with GradScaler's exact arithmetic, written for reading.

    The state is two numbers: ``scale`` (a float32 value, kept here as a Python float that is always
    exactly representable in float32) and ``growth_tracker`` (clean steps since the last change). Between
    two ``update()`` calls it also remembers, per optimizer, as GradScaler does, whether that optimizer's
    gradients were unscaled, whether they held an inf or NaN, and whether it stepped: several optimizers
    share one scaler, each unscaled once and skipped on its own overflow, and ``update()`` backs off when
    any of them overflowed.
    """

    def __init__(self, init_scale: float = DEFAULT_INIT_SCALE, growth_factor: float = DEFAULT_GROWTH_FACTOR,
                 backoff_factor: float = DEFAULT_BACKOFF_FACTOR,
                 growth_interval: int = DEFAULT_GROWTH_INTERVAL):
        check_scaler_args(init_scale, growth_factor, backoff_factor, growth_interval)
        self.scale = _to_float32(float(init_scale))
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.growth_tracker = 0
        self._optimizers: dict[int, _OptimizerRecord] = {}  # by id(optimizer), as in GradScaler

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

    def unscale_(self, optimizer: torch.optim.Optimizer) -> bool:
        """Divide ``optimizer``'s gradients by the scale in place; return True when any held inf or NaN.

        Once per optimizer between updates, as in GradScaler: a second call would divide by the scale again.
        """
        _check_optimizer(optimizer)
        record = self._optimizers.get(id(optimizer))
        if record is not None and record.stage == "stepped":
            raise RuntimeError("unscale_() is being called after step(); unscale an optimizer's gradients "
                               "before its step, once per update().")
        if record is not None:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last "
                               "update(). A second call would divide its gradients by the scale again.")
        grads = _gradients_to_unscale(optimizer)
        inverse = self.inverse_scale()
        found_inf = None if not grads else False
        for g in grads:
            if not bool(torch.isfinite(g).all()):
                found_inf = True
            g.mul_(inverse.to(g.device))
        self._optimizers[id(optimizer)] = _OptimizerRecord("unscaled", found_inf)
        return bool(found_inf)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Run ``optimizer.step()`` unless its gradients held an inf or NaN; return whether it ran.

        Unscales the gradients first unless :meth:`unscale_` already did for this optimizer."""
        _check_optimizer(optimizer)
        record = self._optimizers.get(id(optimizer))
        if record is not None and record.stage == "stepped":
            raise RuntimeError("step() has already been called since the last update().")
        if record is None:
            self.unscale_(optimizer)
            record = self._optimizers[id(optimizer)]
        if record.found_inf is None:
            raise ValueError("step(): none of the optimizer's parameters has a gradient to unscale and check "
                             "(GradScaler: 'No inf checks were recorded for this optimizer'); run backward() "
                             "on the scaled loss first")
        ran = not record.found_inf
        if ran:
            optimizer.step()
        record.stage = "stepped"
        return ran

    def _overflow_since_update(self, found_inf: bool | None) -> bool:
        """Whether any optimizer's gradients held an inf or NaN since the last update (GradScaler sums the
        found_inf flags of every optimizer it unscaled), or ``found_inf`` itself in a replay."""
        if found_inf is not None:
            if not isinstance(found_inf, bool):
                raise TypeError(f"found_inf must be a bool or None, got {type(found_inf).__name__}")
            if self._optimizers:
                raise ValueError("found_inf was given, but optimizers were unscaled since the last update(): "
                                 "update() combines their overflows itself; pass found_inf only when "
                                 "replaying recorded steps")
            return found_inf
        checked = [r.found_inf for r in self._optimizers.values() if r.found_inf is not None]
        if not checked:
            raise RuntimeError("update() found no gradients checked since the last update() (GradScaler: "
                               "'No inf checks were recorded prior to update'): call step(optimizer) for "
                               "each optimizer first, or pass found_inf when replaying recorded steps")
        return any(checked)

    def update(self, found_inf: bool | None = None) -> None:
        """Back off after an overflow; grow after ``growth_interval``
        consecutive clean steps.

        An overflow is an inf or NaN in the gradients of any optimizer
        unscaled since the last update; a replay of recorded steps, which
        has no gradients, passes ``found_inf`` instead."""
        found_inf = self._overflow_since_update(found_inf)
        self._optimizers.clear()
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
        # the constructor's checks: a loaded state must not make a scaler that could not be built
        check_scaler_args(state["scale"], state["growth_factor"], state["backoff_factor"], state["growth_interval"])
        tracker = state["_growth_tracker"]
        if isinstance(tracker, bool) or not isinstance(tracker, numbers.Integral) or tracker < 0:
            raise ValueError(f"_growth_tracker must be a non-negative int (clean steps), got {tracker!r}")
        self.scale = _to_float32(float(state["scale"]))
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self.growth_tracker = int(state["_growth_tracker"])
        self._optimizers.clear()


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
    targets CUDA and, on a machine without a GPU, warns and disables itself)."""
    s = torch.amp.GradScaler(device)
    return ScalerDefaults(s.get_scale(), s.get_growth_factor(), s.get_backoff_factor(),
                          s.get_growth_interval())


def compare_with_grad_scaler(n_steps: int = 200, *, seed: int = 0, **scaler_kwargs) -> dict[str, int]:
    """Run :class:`TeachingLossScaler` and ``torch.amp.GradScaler`` side by side on a random gradient
    stream with planted inf and NaN; count the steps on which scale, tracker, skip decision and unscaled
    gradients agree bit for bit. ``scaler_kwargs``: any of ``init_scale``, ``growth_factor``,
    ``backoff_factor``, ``growth_interval``, checked as :class:`TeachingLossScaler` checks them."""
    if isinstance(n_steps, bool) or not isinstance(n_steps, int):
        raise TypeError(f"n_steps must be an int, got {n_steps!r} ({type(n_steps).__name__})")
    if n_steps < 1:
        raise ValueError(f"n_steps must be >= 1, got {n_steps}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {seed!r} ({type(seed).__name__})")
    unknown = sorted(set(scaler_kwargs) - set(SCALER_ARGS))
    if unknown:
        raise TypeError(f"unknown scaler argument(s) {', '.join(unknown)}; known: {', '.join(SCALER_ARGS)}")
    mine = TeachingLossScaler(**scaler_kwargs)  # first: its checks are clear where GradScaler's assert
    real = torch.amp.GradScaler("cpu", **scaler_kwargs)
    gen = torch.Generator().manual_seed(seed)
    p_real, p_mine = torch.nn.Parameter(torch.zeros(64)), torch.nn.Parameter(torch.zeros(64))
    opt_real, opt_mine = torch.optim.SGD([p_real], lr=0.0), torch.optim.SGD([p_mine], lr=0.0)
    ran = []
    opt_real.register_step_post_hook(lambda *_: ran.append(True))
    agree = {"steps": 0, "scale": 0, "growth_tracker": 0, "skip": 0, "gradients": 0}
    for step in range(n_steps):
        c = torch.randn(64, generator=gen) * torch.exp2(torch.randint(-40, 10, (64,), generator=gen).float())
        if torch.rand((), generator=gen) < 0.05:
            c[3] = math.inf if step % 2 else math.nan
        opt_real.zero_grad(set_to_none=True)
        opt_mine.zero_grad(set_to_none=True)
        real.scale((p_real * c).sum()).backward()
        mine.scale_loss((p_mine * c).sum()).backward()
        real.unscale_(opt_real)
        found = mine.unscale_(opt_mine)
        g_real, g_mine = p_real.grad, p_mine.grad
        assert g_real is not None and g_mine is not None
        same_grads = bool(((g_real == g_mine) | (g_real.isnan() & g_mine.isnan())).all())
        n_ran = len(ran)
        real.step(opt_real)
        mine_ran = mine.step(opt_mine)
        real.update()
        mine.update()
        state = real.state_dict()
        agree["steps"] += 1
        agree["scale"] += int(state["scale"] == mine.scale)
        agree["growth_tracker"] += int(state["_growth_tracker"] == mine.growth_tracker)
        agree["skip"] += int((len(ran) > n_ran) == mine_ran == (not found))
        agree["gradients"] += int(same_grads)
    return agree


def scale_after_clean_steps(scaler: torch.amp.GradScaler, steps: int) -> float:
    """Run ``steps`` clean (finite) steps through a real ``torch.amp.GradScaler`` and return its scale.

    Each step scales a one-parameter loss, backpropagates, steps an SGD optimizer with learning rate 0 and
    updates the scaler, so only the scaler's own rule moves the scale: whether it grows after a clean
    step, and how often."""
    if not isinstance(scaler, torch.amp.GradScaler):
        raise TypeError(f"scaler must be a torch.amp.GradScaler, got {type(scaler).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.0)
    for _ in range(steps):
        scaler.scale(p.sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    return scaler.get_scale()


def grad_scaler_refusal(device: str = "cpu", **scaler_kwargs) -> str | None:
    """The message with which the installed ``torch.amp.GradScaler`` refuses ``scaler_kwargs`` (torch
    raises an AssertionError or a ValueError), or None when it accepts them."""
    try:
        torch.amp.GradScaler(device, **scaler_kwargs)
    except (AssertionError, ValueError) as exc:
        return str(exc)
    return None
