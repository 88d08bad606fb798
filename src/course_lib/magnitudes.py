"""Where a real model's numbers live: magnitudes of weights, activations, gradients and Adam moments.

Magnitudes are summarised as histograms of ``log2|x|`` with one bin per binade (power of two), counted
exactly over every element on the device the model runs on, so the full-size GPU model needs no copy of
its activations. Percentiles are read off the histogram (interpolated within a binade).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from .device import SizeProfile
from .models import GPTConfig, course_setup

# Binades covered: 2**-160 (below every format's smallest subnormal except FP32's 2**-149) to 2**130.
LOG2_LO = -160
LOG2_HI = 130


@dataclass(frozen=True)
class LogHistogram:
    """Counts of ``floor(log2|x|)`` per binade, plus exact zeros, non-finite values, min and max.

    ``counts[i]`` counts values with ``2**(LOG2_LO+i) <= |x| < 2**(LOG2_LO+i+1)``; values below the range
    land in the first bin and above it in the last.
    """

    counts: tuple[int, ...]
    zeros: int
    nonfinite: int
    min_nonzero: float
    max_abs: float

    @property
    def total(self) -> int:
        return sum(self.counts) + self.zeros + self.nonfinite

    @property
    def nonzero(self) -> int:
        return sum(self.counts)

    @property
    def binade_edges(self) -> np.ndarray:
        """log2 of the left edge of each bin."""
        return np.arange(LOG2_LO, LOG2_LO + len(self.counts))

    def quantile(self, q: float) -> float:
        """Approximate ``q``-quantile of ``|x|`` over the finite non-zero values (log-interpolated)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must lie in [0, 1], got {q}")
        n = self.nonzero
        if n == 0:
            return math.nan
        if q == 0.0:
            return self.min_nonzero
        if q == 1.0:
            return self.max_abs
        cum = np.cumsum(self.counts)
        target = q * n
        i = int(np.searchsorted(cum, target, side="left"))
        before = cum[i - 1] if i > 0 else 0
        within = (target - before) / self.counts[i]
        value = 2.0 ** (LOG2_LO + i + within)
        return float(min(max(value, self.min_nonzero), self.max_abs))

    def fraction_below(self, threshold: float) -> float:
        """Fraction of all finite values (zeros included) with ``|x| < threshold``, to binade accuracy.

        Exact when ``threshold`` is a power of two.
        """
        finite = self.total - self.nonfinite
        if finite == 0:
            return math.nan
        k = math.floor(math.log2(threshold))
        idx = min(max(k - LOG2_LO, 0), len(self.counts))
        below: float = self.zeros + sum(self.counts[:idx])
        if 0 <= k - LOG2_LO < len(self.counts) and threshold != 2.0**k:
            frac = (math.log2(threshold) - k)
            below += self.counts[k - LOG2_LO] * frac
        return below / finite


class _HistogramAccumulator:
    """Accumulates a :class:`LogHistogram` over many tensors, on their own device."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None
        self.zeros = 0
        self.nonfinite = 0
        self.min_nonzero = math.inf
        self.max_abs = 0.0

    def add(self, tensor: torch.Tensor) -> None:
        x = tensor.detach().abs().float().flatten()
        finite = torch.isfinite(x)
        self.nonfinite += int((~finite).sum())
        x = x[finite]
        nz = x[x > 0]
        self.zeros += int(x.numel() - nz.numel())
        if nz.numel() == 0:
            return
        self.min_nonzero = min(self.min_nonzero, float(nz.min()))
        self.max_abs = max(self.max_abs, float(nz.max()))
        # exponent field of a float32 is exact floor(log2) for normal numbers; frexp handles subnormals
        _, e = torch.frexp(nz)
        idx = torch.clamp(e.to(torch.int64) - 1 - LOG2_LO, 0, LOG2_HI - LOG2_LO - 1)
        counts = torch.bincount(idx, minlength=LOG2_HI - LOG2_LO)
        self.counts = counts if self.counts is None else self.counts + counts

    def result(self) -> LogHistogram:
        counts = (tuple(int(c) for c in self.counts.cpu().tolist()) if self.counts is not None
                  else (0,) * (LOG2_HI - LOG2_LO))
        return LogHistogram(counts=counts, zeros=self.zeros, nonfinite=self.nonfinite,
                            min_nonzero=self.min_nonzero if self.min_nonzero < math.inf else math.nan,
                            max_abs=self.max_abs)


def log2_histogram(tensors: torch.Tensor | list[torch.Tensor]) -> LogHistogram:
    """A :class:`LogHistogram` of all elements of one tensor or a list of tensors."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("log2_histogram takes a tensor or a list of tensors")
    acc = _HistogramAccumulator()
    for t in tensors:
        if not (t.is_floating_point()):
            raise TypeError(f"log2_histogram needs floating-point tensors, got {t.dtype}")
        acc.add(t)
    return acc.result()


TENSOR_KINDS = ("weights", "activations", "activation gradients", "weight gradients",
                "Adam first moment", "Adam second moment")


@dataclass(frozen=True)
class TrainingMagnitudes:
    """Magnitudes of every kind of tensor in a training step of the course model.

    ``histograms`` maps each of :data:`TENSOR_KINDS` to its :class:`LogHistogram`, measured after
    ``steps`` steps of FP32 AdamW training, on one more batch.
    """

    histograms: dict[str, LogHistogram]
    steps: int
    config: GPTConfig
    batch_size: int
    final_loss: float
    device: str
    loss_history: tuple[float, ...] = field(default=())

    def quantiles(self, kind: str, qs: tuple[float, ...] = (0.0, 0.01, 0.5, 0.99, 1.0)) -> tuple[float, ...]:
        if kind not in self.histograms:
            raise ValueError(f"unknown tensor kind {kind!r}; known: {', '.join(self.histograms)}")
        return tuple(self.histograms[kind].quantile(q) for q in qs)


def measure_training_magnitudes(
    profile: SizeProfile,
    device: torch.device | str = "cpu",
    *,
    steps: int | None = None,
    seed: int = 0,
    lr: float = 3e-3,
) -> TrainingMagnitudes:
    """Train the course model in FP32 with AdamW, then histogram every kind of tensor on one step.

    Sizes come from ``profile`` (model shape, batch size, default number of steps).
    """
    setup = course_setup(profile, device, steps=steps, default_steps=(60, 600), seed=seed)
    steps, device, cfg, sampler = setup.steps, setup.device, setup.config, setup.sampler
    batch_size = sampler.batch_size
    model = setup.model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        x, y = sampler.batch(step, device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))

    acts, act_grads = _HistogramAccumulator(), _HistogramAccumulator()

    def hook(_module: nn.Module, _inputs, output: torch.Tensor) -> None:
        acts.add(output)
        output.register_hook(lambda g: act_grads.add(g))

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Linear, nn.LayerNorm, nn.Embedding))]
    try:
        x, y = sampler.batch(steps, device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    params = [p for p in model.parameters()]
    weight_grads = log2_histogram([p.grad for p in params if p.grad is not None])
    weights = log2_histogram([p.detach() for p in params])
    opt.step()
    states = [opt.state[p] for p in params if p in opt.state]
    histograms = {
        "weights": weights,
        "activations": acts.result(),
        "activation gradients": act_grads.result(),
        "weight gradients": weight_grads,
        "Adam first moment": log2_histogram([s["exp_avg"] for s in states]),
        "Adam second moment": log2_histogram([s["exp_avg_sq"] for s in states]),
    }
    return TrainingMagnitudes(histograms=histograms, steps=steps, config=cfg, batch_size=batch_size,
                              final_loss=float(loss.detach()), device=str(device),
                              loss_history=tuple(losses))


def training_magnitudes_from_dict(data: dict) -> TrainingMagnitudes:
    """Rebuild a :class:`TrainingMagnitudes` from a record's ``values`` (see ``results.to_jsonable``)."""
    try:
        hists = {k: LogHistogram(counts=tuple(v["counts"]), zeros=v["zeros"], nonfinite=v["nonfinite"],
                                 min_nonzero=v["min_nonzero"], max_abs=v["max_abs"])
                 for k, v in data["histograms"].items()}
        return TrainingMagnitudes(histograms=hists, steps=data["steps"], config=GPTConfig(**data["config"]),
                                  batch_size=data["batch_size"], final_loss=data["final_loss"],
                                  device=data["device"], loss_history=tuple(data.get("loss_history", ())))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a TrainingMagnitudes record: {exc}") from None
