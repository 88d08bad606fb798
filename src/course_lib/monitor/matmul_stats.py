"""Per-matmul operand statistics: every linear layer's input and weight classified as a format would store them,
unscaled or with a per-tensor scale (Transformer Engine's per-GEMM debug statistics)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..formats import get_format
from .faults import unwrapped_name
from .health import gradient_stats


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
    # named as the reader's model names them: a planted fault's or an FP32 island's `.module` left out
    layers = [(unwrapped_name(model, n), m) for n, m in model.named_modules()
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
