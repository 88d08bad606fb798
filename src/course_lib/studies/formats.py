"""Lesson 1's study: the magnitudes of the course model's weights, activations, gradients and Adam moments."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..device import SizeProfile
from ..magnitudes import HistogramAccumulator, LogHistogram, log2_histogram
from ..models import GPTConfig, course_setup


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

    acts, act_grads = HistogramAccumulator(), HistogramAccumulator()

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
