"""Lesson 3's studies: a flight recording of a real GradScaler run, static against dynamic scaling, and the
gradient fidelity of each loss scale."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..glue import power_of_two_text
from ..models import course_setup
from ..scaling.scaler import (
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_GROWTH_INTERVAL,
    DEFAULT_INIT_SCALE,
    ScaleTrace,
    check_scaler_args,
)


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
    setup = course_setup(profile, device, steps=steps, default_steps=(60, 600), seed=seed)
    check_scaler_args(init_scale, growth_factor, backoff_factor, growth_interval)
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
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 250), seed=seed)
    steps, device, sampler = setup.steps, setup.device, setup.sampler
    interval = profile.pick(small=10, full=DEFAULT_GROWTH_INTERVAL) if dynamic_growth_interval is None \
        else dynamic_growth_interval
    for s in static_scales:
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not (s > 0 and math.isfinite(s)):
            raise ValueError(f"static loss scales must be positive finite numbers, got {s!r}")
    runs = []

    def name(scale: float) -> str:
        exponent = math.log2(scale)
        return f"static {power_of_two_text(int(exponent))}" if exponent == int(exponent) else f"static {scale:g}"

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
    entries that are non-zero in FP32, beyond its own rounding, and exactly zero under autocast;
    ``overflowed[scale]``: whether any gradient was inf/NaN on any batch (the step a scaler would skip; no
    error is measured then). ``noise[name]``: per batch, the FP32 entries that were non-zero but no larger
    than :data:`NOISE_FLOOR` times the parameter's largest, left out of ``lost``: rounding noise, such as the
    gradient of attention's key bias, zero in exact arithmetic (a bias added to every key shifts all of a
    query's scores by one amount, which softmax ignores)."""

    scales: tuple[float, ...]
    names: tuple[str, ...]
    steps: int
    batches: int
    error: dict[float, dict[str, float]]
    lost: dict[float, dict[str, float]]
    overflowed: dict[float, bool]
    noise: dict[str, float] = field(default_factory=dict)

    def worst(self, scale: float) -> tuple[str, float]:
        """The parameter with the largest error under ``scale``, and that error."""
        name = max(self.error[scale], key=lambda n: self.error[scale][n])
        return name, self.error[scale][name]


# an FP32 gradient entry no larger than this times its parameter's largest is FP32's rounding noise (2**-24,
# FP32's unit roundoff): "entries lost" leaves such entries out
NOISE_FLOOR = 2.0 ** -24


def scale_gradient_fidelity(profile, device: torch.device | str = "cpu", *,
                            scales=(1.0, 2.0**8, 2.0**16, 2.0**24), steps: int | None = None, batches: int = 2,
                            seed: int = 0, lr: float = 3e-3) -> ScaleFidelity:
    """Train the course GPT in FP32 for ``steps`` steps (gradients shrink as the loss falls), then, on
    ``batches`` batches it did not train on, compare each parameter's gradient from an FP16-autocast
    backward of ``loss * scale`` (divided by the scale afterwards) with the FP32 gradient. A training curve
    hides the few entries a scale loses to underflow; this shows what the scale does to the gradients
    themselves."""
    scales = tuple(float(sc) for sc in scales)
    if not scales or any(not (sc > 0 and math.isfinite(sc)) for sc in scales):
        raise ValueError(f"scales must be positive finite numbers, got {scales!r}")
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ValueError(f"batches must be a positive int, got {batches!r}")
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 200), seed=seed)
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
    noise = {n: 0.0 for n, _ in named}
    for b in range(batches):
        x, y = sampler.batch(setup.steps + b, dev)
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
        ref = {n: p.grad.detach().clone() for n, p in named if p.grad is not None}
        # entries above FP32's own rounding noise, per parameter: the ones "lost" counts
        real = {n: r.abs() > NOISE_FLOOR * r.abs().max() for n, r in ref.items()}
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
                lost[sc][n] += float(((g == 0) & real[n]).sum()) / max(1, int(real[n].sum())) / batches
        for n, r in ref.items():
            ref_sq[n] += float((r ** 2).sum()) / batches
            noise[n] += float(((r != 0) & ~real[n]).sum()) / batches
    names = tuple(n for n, _ in named if ref_sq[n] > 0)
    error = {sc: {n: math.nan if overflowed[sc] else math.sqrt(sq_err[sc][n] / ref_sq[n]) for n in names}
             for sc in scales}
    return ScaleFidelity(scales, names, setup.steps, batches, error,
                         {sc: {n: lost[sc][n] for n in names} for sc in scales}, overflowed,
                         {n: noise[n] for n in names if noise[n] > 0})



def adam_update_change(scale: float = 1024.0, *, size: int = 1000, seed: int = 0, lr: float = 1e-3) -> float:
    """How much one Adam step's update changes when every gradient is multiplied by ``scale``.

    Weights ``size`` normal draws (``seed``), gradients evenly spaced over [-1e-3, 1e-3]; returns the
    largest absolute difference between the scaled and the unscaled update, as a fraction of the largest
    entry of the unscaled update. Adam divides the scale out, so only its epsilon leaves a difference."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    if isinstance(size, bool) or not isinstance(size, int) or size < 2:
        raise ValueError(f"size must be an int of at least 2, got {size!r}")
    w0 = torch.randn(size, generator=torch.Generator().manual_seed(seed))
    updates = {}
    for c in (1.0, float(scale)):
        w = torch.nn.Parameter(w0.clone())
        opt = torch.optim.Adam([w], lr=lr)
        w.grad = c * torch.linspace(-1e-3, 1e-3, size)
        opt.step()
        updates[c] = w.detach() - w0
    return float((updates[float(scale)] - updates[1.0]).abs().max() / updates[1.0].abs().max())
