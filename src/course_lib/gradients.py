"""Capturing real gradients and asking what each low-precision format would do to them.

* :func:`capture_gradients` runs one forward and backward pass with hooks on every ``nn.Linear`` and
  keeps, per layer, the gradient of its output (the *activation gradient*) and of its weight.
* :func:`summarize_underflow` says, for a tensor of gradients, a format and a loss scale, which fraction
  is already zero, which would flush to zero, which would become subnormal and which would overflow,
  using :func:`course_lib.formats.round_to_format` (no second copy of any format's limits).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
import torch.nn as nn

from .formats import FloatFormat, get_format, round_to_format, rounds_past_max
from .tables import MarkdownTable, markdown_table

UNDERFLOW_FORMATS = ("FP16", "BF16", "FP8 E4M3", "FP8 E5M2")


@dataclass(frozen=True)
class LayerGradient:
    """Gradients of one layer: ``kind`` is ``"activation"`` or ``"weight"``; ``values`` is float32 on the
    CPU, flattened (a deterministic subsample when the layer has more than the cap)."""

    name: str
    kind: str
    index: int          # position of the layer in the forward pass (0 = first)
    values: torch.Tensor
    numel: int          # elements before subsampling


@dataclass(frozen=True)
class GradientCapture:
    """Every ``nn.Linear``'s activation and weight gradients from one backward pass."""

    layers: tuple[LayerGradient, ...]
    loss: float

    def of_kind(self, kind: str) -> list[LayerGradient]:
        if kind not in ("activation", "weight"):
            raise ValueError(f"kind must be 'activation' or 'weight', got {kind!r}")
        return [g for g in self.layers if g.kind == kind]

    def all_values(self, kind: str) -> torch.Tensor:
        return torch.cat([g.values for g in self.of_kind(kind)])


def _subsample(t: torch.Tensor, cap: int) -> torch.Tensor:
    flat = t.detach().flatten().float()
    if flat.numel() > cap:
        # every k-th element: deterministic, and unbiased for the magnitudes of a large tensor
        flat = flat[:: -(-flat.numel() // cap)]
    return flat.cpu().clone()


def capture_gradients(model: nn.Module, loss_fn, *, max_values_per_layer: int = 250_000) -> GradientCapture:
    """Run ``loss = loss_fn(model)``, backpropagate it, and keep every ``nn.Linear``'s gradients.

    ``loss_fn`` takes the model and returns a scalar loss tensor. The model's ``.grad`` fields are
    overwritten. Gradients are kept as they arrive (in the model's dtype), converted to float32.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    linears = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("the model has no nn.Linear layer to capture")
    act_grads: dict[str, torch.Tensor] = {}
    sizes: dict[str, int] = {}

    def make_hook(name: str):
        def hook(_module, _inputs, output):
            if output.requires_grad:
                def on_grad(g):
                    act_grads[name] = _subsample(g, max_values_per_layer)
                    sizes[name] = g.numel()
                output.register_hook(on_grad)
        return hook

    handles = [m.register_forward_hook(make_hook(name)) for name, m in linears]
    try:
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise ValueError("loss_fn must return a scalar tensor")
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    layers = []
    for i, (name, m) in enumerate(linears):
        if name in act_grads:
            layers.append(LayerGradient(name, "activation", i, act_grads[name], sizes[name]))
        if m.weight.grad is not None:
            layers.append(LayerGradient(name, "weight", i, _subsample(m.weight.grad, max_values_per_layer),
                                        m.weight.grad.numel()))
    return GradientCapture(tuple(layers), float(loss.detach()))


@dataclass(frozen=True)
class UnderflowSummary:
    """What casting ``loss_scale * gradients`` to ``format`` does, as fractions of all values.

    ``zero``: already exactly zero; ``flushed``: non-zero but rounds to zero; ``subnormal``: lands in the
    subnormal range (reduced precision); ``overflow``: beyond the largest finite value (inf, or NaN for a
    format without inf); ``normal``: the rest, stored with full relative precision.
    """

    format: str
    loss_scale: float
    count: int
    zero: float
    flushed: float
    subnormal: float
    overflow: float

    @property
    def normal(self) -> float:
        return 1.0 - self.zero - self.flushed - self.subnormal - self.overflow

    @property
    def lost(self) -> float:
        """Non-zero values that do not survive: flushed to zero or overflowed."""
        return self.flushed + self.overflow


def signed_format(fmt) -> FloatFormat:
    """The format ``fmt`` names, refused (ValueError) when it is unsigned: gradients have both signs, and an
    unsigned scale format such as E8M0 holds neither negatives nor zero."""
    f = get_format(fmt)
    if not f.signed:
        raise ValueError(f"fmt {f.name!r} is an unsigned format (no sign bit"
                         f"{'' if f.subnormals else ', no zero'}): it cannot represent signed gradients; "
                         "use a signed format such as 'FP16' or 'FP8 E4M3'")
    return f


def summarize_underflow(values: torch.Tensor, fmt: str | FloatFormat, loss_scale: float = 1.0) -> UnderflowSummary:
    """Fractions of ``values`` (any float tensor) that are zero, flush, go subnormal or overflow in ``fmt``
    after multiplying by ``loss_scale`` (computed exactly, in float64). ``fmt`` must be signed: gradients
    have both signs, and an unsigned scale format such as E8M0 holds neither negatives nor zero."""
    f = signed_format(fmt)
    if not isinstance(values, torch.Tensor):
        raise TypeError(f"values must be a floating-point torch tensor, got {type(values).__name__}")
    if not values.is_floating_point():
        raise TypeError(f"values must be a floating-point torch tensor, got dtype {values.dtype}")
    if isinstance(loss_scale, bool) or not isinstance(loss_scale, numbers.Real):
        raise TypeError(f"loss_scale must be a real number, got {type(loss_scale).__name__} {loss_scale!r}")
    if not loss_scale > 0 or not math.isfinite(loss_scale):
        raise ValueError(f"loss_scale must be a positive finite number, got {loss_scale!r}")
    v = values.detach().flatten().to(torch.float64)
    bad = int((~torch.isfinite(v)).sum())
    if bad:
        # dropping them silently would make the fractions describe fewer values than were passed
        raise ValueError(f"values hold {bad} non-finite entries (inf or NaN); summarise finite values "
                         "and count the non-finite ones separately")
    n = v.numel()
    if n == 0:
        raise ValueError("values is empty: there is nothing to summarise")
    scaled = v * float(loss_scale)
    r = round_to_format(scaled, f, overflow="inf" if f.has_inf else ("nan" if f.has_nan else "saturate"))
    assert isinstance(r, torch.Tensor)
    zero = v == 0
    # a format without NaN saturates: what overflows is what rounds past max (6.5 in FP4 rounds to 6)
    overflow = ~torch.isfinite(r) if f.has_nan else rounds_past_max(scaled.abs(), f)
    flushed = ~zero & (r == 0)
    subnormal = (r != 0) & torch.isfinite(r) & (r.abs() < f.min_normal)
    return UnderflowSummary(f.name, float(loss_scale), n, float(zero.double().mean()),
                            float(flushed.double().mean()), float(subnormal.double().mean()),
                            float(overflow.double().mean()))


def underflow_table(capture: GradientCapture, formats=UNDERFLOW_FORMATS, loss_scale: float = 1.0,
                    kind: str = "activation") -> list[tuple[str, UnderflowSummary]]:
    """``(layer name, summary)`` for every layer of ``kind`` and every format."""
    return [(g.name, summarize_underflow(g.values, f, loss_scale))
            for g in capture.of_kind(kind) for f in formats]


@dataclass(frozen=True)
class ScaleSweep:
    """Fractions of non-zero gradients per loss scale: ``survive`` (neither flush nor overflow), of which
    ``subnormal`` land in the subnormal range (kept, with fewer significant bits), ``overflow`` and
    ``flushed``."""

    format: str
    scales: tuple[float, ...]
    survive: tuple[float, ...]
    overflow: tuple[float, ...]
    flushed: tuple[float, ...]
    subnormal: tuple[float, ...]

    @property
    def survive_normal(self) -> tuple[float, ...]:
        """Fractions that survive as normal numbers, with full precision."""
        return tuple(a - b for a, b in zip(self.survive, self.subnormal))

    def plateau(self, tolerance: float = 0.005, *, normal: bool = False) -> tuple[float, float]:
        """The smallest and largest scale of the contiguous range around the best scale whose surviving
        fraction (``normal``: surviving as normal numbers) is within ``tolerance`` of the best. A single
        "best" scale is an arbitrary point of that range."""
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance must lie in [0, 1), got {tolerance}")
        values = self.survive_normal if normal else self.survive
        best = max(range(len(values)), key=lambda i: values[i])
        lo = hi = best
        while lo > 0 and values[lo - 1] >= values[best] - tolerance:
            lo -= 1
        while hi < len(values) - 1 and values[hi + 1] >= values[best] - tolerance:
            hi += 1
        return self.scales[lo], self.scales[hi]


def sweep_loss_scale(values: torch.Tensor, scales, fmt: str | FloatFormat = "FP16") -> ScaleSweep:
    """:func:`summarize_underflow` over many loss scales, as fractions of the *non-zero* values."""
    nonzero = values[values != 0]
    if nonzero.numel() == 0:
        raise ValueError("all values are zero: nothing to sweep")
    sums = [summarize_underflow(nonzero, fmt, float(s)) for s in scales]
    return ScaleSweep(get_format(fmt).name, tuple(float(s) for s in scales),
                      tuple(1.0 - s.lost for s in sums), tuple(s.overflow for s in sums),
                      tuple(s.flushed for s in sums), tuple(s.subnormal for s in sums))


# ---- summaries of several captured steps ------------------------------------------------------------


def summary_rows(captures: dict[int, GradientCapture], formats=UNDERFLOW_FORMATS,
                 kind: str = "activation") -> list[tuple[int, UnderflowSummary]]:
    """``(step, summary)`` per captured step and format, over all of a kind's gradients."""
    return [(step, summarize_underflow(cap.all_values(kind), f)) for step, cap in sorted(captures.items())
            for f in formats]


def summary_markdown(rows: list[tuple[int, UnderflowSummary]]) -> MarkdownTable:
    """A Markdown table of :func:`summary_rows` (live or recorded)."""
    return markdown_table(("step", "format", "already zero", "flushed to zero", "subnormal", "overflow"),
                          [(step, s.format, f"{s.zero:.2%}", f"{s.flushed:.2%}", f"{s.subnormal:.2%}",
                            f"{s.overflow:.2%}") for step, s in rows])
