"""Lesson 5's located failure: the course model trained with FP16 autocast and a GradScaler until its loss
turns non-finite, the largest attention product ``q . k`` of every layer on the way, and the failing step
re-run under lesson 9's locator (with ``ops=True``: the operation is named) and with the same weights
computed other ways: q scaled before the product, fused attention, BF16, FP32."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from ..device import SizeProfile
from ..models import ATTENTION_KINDS, CausalSelfAttention, course_setup, set_attention
from ..monitor.locator import NonFiniteLocator, NonFiniteReport

FP16_MAX = float(torch.finfo(torch.float16).max)

# the failing step's weights, run again: (label, attention, autocast dtype or None for FP32)
REPLAYS = (("FP16 with attention written out (as trained)", "explicit", torch.float16),
           ("FP16 with q scaled first", "scaled_first", torch.float16),
           ("FP16 with fused attention (SDPA)", "sdpa", torch.float16),
           ("BF16 with attention written out", "explicit", torch.bfloat16),
           ("FP32 with attention written out", "explicit", None))


@dataclass(frozen=True)
class DivergenceRun:
    """One FP16 + GradScaler run with ``attention`` from ``seed``: the loss per step until it stopped
    (``first_nonfinite`` is the step whose loss was not finite, where the run stopped; None: all finite),
    and, at ``probe_steps``, each attention layer's largest ``|q . k|`` over the positions the causal mask
    keeps, before the ``1/sqrt(d)`` scale (``qk_max[layer]``), computed in FP32 from the FP16 q and k."""

    seed: int
    attention: str
    losses: tuple[float, ...]
    first_nonfinite: int | None
    probe_steps: tuple[int, ...]
    qk_max: dict[str, tuple[float, ...]]

    def peaks(self) -> list[float]:
        """Per probed step, the largest finite ``|q . k|`` over the layers (NaN where no layer's was finite:
        upstream of it the forward had already failed)."""
        columns = zip(*self.qk_max.values()) if self.qk_max else ([] for _ in self.probe_steps)
        return [max((v for v in column if math.isfinite(v)), default=math.nan) for column in columns]


@dataclass(frozen=True)
class Fp16Divergence:
    """The runs (every ``attentions`` kind from every seed, ``steps`` at most each, AdamW at ``lr``, ``q . k``
    probed every ``probe_every`` steps, ``batch_size`` sequences per step; None in a result built without
    it), and the
    first failing run's failing step re-run: what the op-level locator named (``located``; None when no
    run failed or the re-run was finite) and the loss of that batch from those weights per :data:`REPLAYS`
    label (``replays``)."""

    lr: float
    steps: int
    probe_every: int
    runs: tuple[DivergenceRun, ...]
    located_seed: int | None
    located_step: int | None
    located: NonFiniteReport | None
    replays: dict[str, float]
    batch_size: int | None = None


class _QKProbe:
    """Forward hooks on every attention layer's QKV projection: when armed, the largest ``|q . k|`` over the
    causal positions, before the scale, kept on the device and read back once, at the end of a run."""

    def __init__(self, model: torch.nn.Module):
        self.values: list[torch.Tensor] = []
        self.armed = False
        self.names: list[str] = []
        self._handles = []
        for name, module in model.named_modules():
            if isinstance(module, CausalSelfAttention):
                self.names.append(name)
                self._handles.append(module.qkv.register_forward_hook(self._hook(module)))

    def _hook(self, attn: CausalSelfAttention):
        def hook(_module, _inputs, out):
            if not self.armed:
                return
            # in FP32 with autocast off: the probe must not overflow where it measures an overflow
            with torch.no_grad(), torch.autocast(out.device.type, enabled=False):
                b, t, three_c = out.shape
                c = three_c // 3
                q, k, _ = out.detach().float().split(c, dim=2)
                q, k = (z.view(b, t, attn.n_heads, c // attn.n_heads).transpose(1, 2) for z in (q, k))
                scores = (q @ k.transpose(-2, -1)).abs().masked_fill(~attn.mask[:t, :t], 0.0)
                self.values.append(scores.amax())
        return hook

    def read(self) -> list[float]:
        values = torch.stack(self.values).tolist() if self.values else []
        self.values.clear()
        return values

    def close(self) -> None:
        for h in self._handles:
            h.remove()


def _check(lr: float, steps: int, seeds: Sequence[int], attentions: Sequence[str], probe_every: int,
           batch_size: int | None) -> None:
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size < 1):
        raise ValueError(f"batch_size must be None or a positive int, got {batch_size!r}")
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    for name, value in (("steps", steps), ("probe_every", probe_every)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints, got {seeds!r}")
    bad = [a for a in attentions if a not in ATTENTION_KINDS]
    if not attentions or bad:
        raise ValueError(f"attentions must name kinds of {ATTENTION_KINDS}, got {tuple(attentions)!r}")


def _replays(model, x, y, device: torch.device) -> tuple[NonFiniteReport | None, dict[str, float]]:
    """The failing batch from the failing weights: under the op-level locator, then per :data:`REPLAYS`."""
    with torch.no_grad():
        with NonFiniteLocator(model, ops=True) as locator:
            with torch.autocast(device.type, dtype=torch.float16):
                model(x, y)
        losses = {}
        for label, attention, dtype in REPLAYS:
            set_attention(model, attention)
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                losses[label] = float(model(x, y)[1])
    return locator.report, losses


def fp16_divergence(profile: SizeProfile, device: torch.device | str = "cpu", *, lr: float = 3e-3,
                    steps: int | None = None, seeds: Sequence[int] = (0,),
                    attentions: Sequence[str] = ("explicit", "sdpa"), probe_every: int = 10,
                    batch_size: int | None = None) -> Fp16Divergence:
    """Train the course model with FP16 autocast, AdamW at ``lr`` and a ``torch.amp.GradScaler`` with its
    defaults (the loop of :func:`~course_lib.studies.loss_scaling.record_grad_scaler_run`) from each seed
    with each attention kind, for ``steps`` or until a loss is not finite; probe ``q . k`` every
    ``probe_every`` steps and at the last, on ``batch_size`` sequences per step (None: the profile's, the
    course model's usual batch). The first failing run's failing step (the weights that produced
    it, since nothing updated them since) is re-run as :func:`_replays` does."""
    setup = course_setup(profile, device, steps=steps, default_steps=(300, 2000), seed=0)
    steps, device = setup.steps, setup.device
    _check(lr, steps, seeds, attentions, probe_every, batch_size)
    batch_size = setup.sampler.batch_size if batch_size is None else batch_size
    runs: list[DivergenceRun] = []
    located_seed = located_step = located = None
    replays: dict[str, float] = {}
    for attention in attentions:
        for seed in seeds:
            sampler = replace(course_setup(profile, device, steps=steps, default_steps=(1, 1), seed=seed).sampler,
                              batch_size=batch_size)
            model = set_attention(setup.model(seed), attention)
            opt = torch.optim.AdamW(model.parameters(), lr=lr)
            scaler = torch.amp.GradScaler(device.type)
            probe = _QKProbe(model)
            losses, probed, failed = [], [], None
            try:
                for step in range(steps):
                    x, y = sampler.batch(step, device)
                    probe.armed = armed = step % probe_every == 0 or step == steps - 1
                    with torch.autocast(device.type, dtype=torch.float16):
                        _, loss = model(x, y)
                    value = float(loss.detach())
                    losses.append(value)
                    if not math.isfinite(value):
                        failed = step
                        if not armed:   # the failing step is always probed
                            probe.armed = True
                            with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16):
                                model(x, y)
                        probed.append(step)
                        break
                    if armed:
                        probed.append(step)
                    opt.zero_grad(set_to_none=True)
                    scaler.scale(loss).backward()
                    scaler.step(opt)
                    scaler.update()
                values = probe.read()
            finally:
                probe.close()
            n = len(probe.names)
            qk = {name: tuple(values[i::n]) for i, name in enumerate(probe.names)}
            runs.append(DivergenceRun(seed, attention, tuple(losses), failed, tuple(probed), qk))
            if failed is not None and located_step is None:
                located_seed, located_step = seed, failed
                located, replays = _replays(model, x, y, device)
    return Fp16Divergence(float(lr), steps, probe_every, tuple(runs), located_seed, located_step, located,
                          replays, batch_size)
