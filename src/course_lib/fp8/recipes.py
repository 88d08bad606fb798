"""The FP8 scaling recipes, one granularity each of a scale per block: current (per tensor), static, rowwise,
blockwise (DeepSeek-V3) and delayed (Transformer Engine's amax history); and their quantisation error."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..formats import rounds_past_max
from .casts import (
    Fp8Tensor,
    amax_to_scale,
    as_2d,
    block_amax,
    cast_blocks,
    check_finite_amax,
    check_nonempty,
    expand_blocks,
    fp8_format,
    fp8_max,
    nonfinite_error,
    resolve_block,
)

_FP32_MAX = float(torch.finfo(torch.float32).max)


class ScalingRecipe:
    """One way of choosing FP8 scales. Subclasses define :meth:`block_for` (the granularity) and, where the
    scale is not ``fp8_max / amax``, :meth:`scale_from_amax`; all share scale/quantize/dequantize.

    ``fmt``: ``"e4m3"`` or ``"e5m2"``. Tensors of any rank are treated as 2-D ``[rows, last dim]``.
    """

    name = "recipe"
    fmt: str

    def block_for(self, shape: tuple[int, ...]) -> tuple[int, int]:  # pragma: no cover - abstract
        raise NotImplementedError

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """The FP32 scales this recipe would use for ``x``, one per block (shape ``[rows/br, cols/bc]``)."""
        x2 = as_2d(x).detach()
        check_nonempty(x, f"{type(self).__name__}.scale")
        return self.scale_from_amax(block_amax(x2, self.block_for(tuple(x2.shape))))

    def quantize(self, x: torch.Tensor) -> Fp8Tensor:
        """``x`` as FP8 codes and scales (raises ValueError for inf/NaN input)."""
        x2 = as_2d(x).detach()
        check_nonempty(x, f"{type(self).__name__}.quantize")
        block = self.block_for(tuple(x2.shape))
        amax = block_amax(x2, block)
        check_finite_amax(amax, source=x2)
        return cast_blocks(x2, self.scale_from_amax(amax), block, self.fmt)

    def scale_from_amax(self, amax: torch.Tensor) -> torch.Tensor:
        """Scales from per-block amaxes (the recipes that compute them from the tensor itself)."""
        return amax_to_scale(amax, self.fmt, power_of_two=getattr(self, "power_of_two", False))

    def dequantize(self, q: Fp8Tensor) -> torch.Tensor:
        return q.dequantize()

    def round_trip(self, x: torch.Tensor) -> torch.Tensor:
        """``dequantize(quantize(x))`` in FP32, shaped like ``x``."""
        return self.quantize(x).dequantize().reshape(x.shape)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.describe()})"

    def describe(self) -> str:
        return self.fmt


class CurrentScaling(ScalingRecipe):
    """Per-tensor *current* (dynamic) scaling: ``scale = fp8_max / amax(x)`` from this very tensor.

    torchao's ``tensorwise`` recipe and Transformer Engine's ``Float8CurrentScaling``. Costs one extra pass
    over the tensor (the amax) before the cast."""

    name = "current"

    def __init__(self, fmt: str = "e4m3", *, power_of_two: bool = False):
        self.fmt, self.power_of_two = fp8_format(fmt), bool(power_of_two)

    def block_for(self, shape):
        return tuple(shape)

    def describe(self):
        return f"{self.fmt}{', power of two' if self.power_of_two else ''}"


class StaticScaling(ScalingRecipe):
    """A fixed scale (1.0: no scaling at all), the control that shows why FP8 needs scales."""

    name = "static"

    def __init__(self, fmt: str = "e4m3", scale: float = 1.0):
        self.fmt = fp8_format(fmt)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (
                math.isfinite(scale) and scale > 0):
            raise ValueError(f"a static FP8 scale must be a positive finite number, got {scale!r}")
        self.value = float(scale)

    def block_for(self, shape):
        return tuple(shape)

    def scale_from_amax(self, amax):
        return torch.full_like(amax, self.value)

    def describe(self):
        return f"{self.fmt}, scale {self.value:g}"


class RowwiseScaling(ScalingRecipe):
    """One scale per row (``axis=-1``: reduce along the last dimension) or per column (``axis=0``).

    torchao's ``rowwise`` recipe: E4M3 everywhere, scales rounded down to powers of two (``power_of_two``,
    default True), so scaling itself adds no rounding error."""

    name = "rowwise"

    def __init__(self, fmt: str = "e4m3", *, axis: int = -1, power_of_two: bool = True):
        self.fmt, self.power_of_two = fp8_format(fmt), bool(power_of_two)
        if axis not in (-1, 1, 0):
            raise ValueError(f"axis is -1 (one scale per row) or 0 (one per column), got {axis!r}")
        self.axis = -1 if axis == 1 else axis

    def block_for(self, shape):
        return (1, shape[1]) if self.axis == -1 else (shape[0], 1)

    def describe(self):
        return f"{self.fmt}, {'rows' if self.axis == -1 else 'columns'}" + \
            (", power of two" if self.power_of_two else "")


class BlockwiseScaling(ScalingRecipe):
    """One scale per ``block`` = ``(rows, cols)`` tile: DeepSeek-V3 uses 1 x 128 tiles for activations and
    gradients (128 x 1 where the product reduces over rows) and 128 x 128 blocks for weights, E4M3, FP32
    scales. Each block dimension must divide the tensor's (ValueError otherwise)."""

    name = "blockwise"

    def __init__(self, fmt: str = "e4m3", *, block: tuple[int, int] = (1, 128), power_of_two: bool = False):
        self.fmt, self.power_of_two = fp8_format(fmt), bool(power_of_two)
        if (not isinstance(block, (tuple, list)) or len(block) != 2
                or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in block)):
            raise ValueError(f"block must be two positive ints (rows, cols), got {block!r}")
        self.block = (int(block[0]), int(block[1]))

    def block_for(self, shape):
        return resolve_block(self.block, shape)

    def describe(self):
        return f"{self.fmt}, {self.block[0]} x {self.block[1]} blocks"


class DelayedScaling(ScalingRecipe):
    """Per-tensor *delayed* scaling, Transformer Engine's ``DelayedScaling`` rule.

    The scale used for a tensor at step *t* comes from the amaxes of earlier steps, kept in a history of
    ``amax_history_len`` values (default 1024): ``amax_compute_algo="max"`` takes the largest in the history,
    ``"most_recent"`` the last one. ``scale = fp8_max / amax / 2**margin``, in FP32 as TE's default, fused
    update computes it (``delayed_scaling.cu``): ``scaled_max = fp8_max * 2**-margin``, then
    ``scaled_max / amax``, each rounded to FP32, the amax read as FP32. A quotient that overflows FP32 (a
    tiny amax) gives FP32's max; an amax that is zero or not finite in FP32 keeps the previous scale. (TE's
    unfused Python update, ``NVTE_UNFUSED_FP8_UPDATE=1``, divides by the margin last, so where
    ``fp8_max / amax`` alone overflows it gives FP32's max, not a scale below it.) The first step uses
    scale 1. ``margin``: an exponent in -126..126, where ``2**margin`` and ``2**-margin`` are normal FP32.

    Stateful: each :meth:`quantize` casts with the current scale, then records the tensor's amax and
    updates the scale for the next step (TE updates once per iteration; here one tensor, one call).
    """

    name = "delayed"

    def __init__(self, fmt: str = "e4m3", *, amax_history_len: int = 1024, amax_compute_algo: str = "max",
                 margin: int = 0):
        self.fmt = fp8_format(fmt)
        if isinstance(amax_history_len, bool) or not isinstance(amax_history_len, int) or amax_history_len < 1:
            raise ValueError(f"amax_history_len must be a positive int, got {amax_history_len!r}")
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo must be 'max' or 'most_recent', got {amax_compute_algo!r}")
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not -126 <= margin <= 126:
            # beyond, 2**-margin is 0 or inf in FP32 (or overflows Python's float), and so is every scale
            raise ValueError(f"margin must be a number in -126..126 (a power-of-two exponent), got {margin!r}")
        self.amax_history_len, self.amax_compute_algo, self.margin = amax_history_len, amax_compute_algo, margin
        self.history: list[float] = []
        self.current_scale = 1.0

    def block_for(self, shape):
        return tuple(shape)

    def scale(self, x):
        return torch.full((1, 1), self.current_scale, dtype=torch.float32, device=x.device)

    def next_scale(self, history: list[float] | None = None, previous: float | None = None) -> float:
        """The scale TE's rule gives from an amax ``history`` (default: this recipe's)."""
        history = self.history if history is None else history
        previous = self.current_scale if previous is None else previous
        if not history:
            return previous
        amax = max(history) if self.amax_compute_algo == "max" else history[-1]
        # TE's history is FP32: an amax that is finite and non-zero only in float64 keeps the scale there too
        amax32 = torch.tensor(amax, dtype=torch.float32)
        if not (bool(torch.isfinite(amax32)) and float(amax32) > 0):
            return previous
        scaled_max = torch.tensor(fp8_max(self.fmt), dtype=torch.float32) * torch.tensor(2.0 ** -self.margin,
                                                                                       dtype=torch.float32)
        # tensor by tensor: torch computes a Python number over a tensor as its reciprocal times the number,
        # which rounds twice
        scale = float(scaled_max / amax32)
        # TE: a scale that overflows FP32 (a tiny amax) becomes FP32's max
        return scale if math.isfinite(scale) else _FP32_MAX

    def observe(self, amax: float) -> None:
        """Record one step's amax and update the scale for the next step."""
        self.history.append(float(amax))
        if len(self.history) > self.amax_history_len:
            del self.history[0]
        self.current_scale = self.next_scale()

    def quantize(self, x):
        x2 = as_2d(x).detach()
        check_nonempty(x, f"{type(self).__name__}.quantize")
        amax = float(block_amax(x2, tuple(x2.shape)))
        if not math.isfinite(amax):
            # TE keeps the previous scale; casting the tensor itself would give NaN codes
            self.observe(amax)
            raise nonfinite_error(x2, "the tensor holds inf or NaN: delayed scaling keeps its previous scale "
                                      "(as Transformer Engine does) but the tensor cannot be cast")
        q = cast_blocks(x2, self.scale(x2), tuple(x2.shape), self.fmt)
        self.observe(amax)
        return q

    def reset(self) -> None:
        self.history, self.current_scale = [], 1.0

    def describe(self):
        return f"{self.fmt}, history {self.amax_history_len}, {self.amax_compute_algo}, margin {self.margin}"


@dataclass(frozen=True)
class QuantizationError:
    """How well one recipe represents one tensor.

    ``relative_error``: ``||dequant - x|| / ||x||`` (L2). ``saturated``: share of elements whose scaled
    magnitude would round above the format's max (the clamp changed them). ``flushed``: share of non-zero elements that became 0.
    ``effective_bits``: ``-log2(relative_error)``, the signal-to-error ratio in bits (E4M3's 3 stored
    mantissa bits give about 5 at best, by this measure).
    """

    recipe: str
    relative_error: float
    saturated: float
    flushed: float
    effective_bits: float
    numel: int


def quantization_error(x: torch.Tensor, recipe: ScalingRecipe, *, label: str | None = None) -> QuantizationError:
    """Quantise ``x`` with ``recipe`` (a stateful recipe advances one step) and measure the damage."""
    if not isinstance(recipe, ScalingRecipe):
        raise TypeError(f"recipe must be a ScalingRecipe, got {type(recipe).__name__}")
    x2 = as_2d(x).detach()
    q = recipe.quantize(x2)     # before the FP32 copy: a float64 value beyond FP32's range is no inf
    x2 = x2.float()
    back = q.dequantize()
    # in float64: a float32 norm sums in float32 (off by about 1e-7 relative at 4k values, 4e-5 at 1M) and
    # its squares overflow above about 1.8e19
    err = float(torch.linalg.vector_norm(back.double() - x2.double()))
    norm = float(torch.linalg.vector_norm(x2.double()))
    rel = err / norm if norm > 0 else 0.0
    # saturated: the FP32 product |x| * scale the cast rounds would round past max, so the clamp changed
    # it; the block's own amax lands on max (give or take the scale's FP32 rounding) and does not count
    scaled = x2.abs() * expand_blocks(q.scales, q.block, x2.shape)
    saturated = float(rounds_past_max(scaled, q.fmt).float().mean())
    nonzero = x2 != 0
    flushed = float(((back == 0) & nonzero).sum()) / max(1, int(nonzero.sum()))
    bits = -math.log2(rel) if rel > 0 else math.inf
    return QuantizationError(label or repr(recipe), rel, saturated, flushed, bits, x2.numel())
