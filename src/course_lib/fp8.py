"""FP8: scaling recipes, FP8 linear layers for training, accumulation precision, and when FP8 pays.

An FP8 tensor is a pair: FP8 codes and FP32 scales. Quantising multiplies by the scale and casts with
saturation; dequantising multiplies the codes by the inverse scale, which is exactly what
``torch._scaled_mm`` does with its ``scale_a``/``scale_b`` arguments (checked bit for bit in the tests).

Every recipe here is one granularity of the same idea, a scale per *block* of a 2-D tensor:

==========================  ==========================  =================================================
recipe                      block                       as in
==========================  ==========================  =================================================
:class:`CurrentScaling`     the whole tensor            torchao ``tensorwise``; TE ``Float8CurrentScaling``
:class:`DelayedScaling`     the whole tensor, scale     Transformer Engine ``DelayedScaling``
                            from an amax history
:class:`RowwiseScaling`     one row (or column)         torchao ``rowwise`` (power-of-two scales)
:class:`BlockwiseScaling`   1 x 128 tiles or 128 x 128  DeepSeek-V3
                            blocks
:class:`StaticScaling`      the whole tensor, fixed     (a control: FP8 with no scaling at all)
==========================  ==========================  =================================================

Scales follow torchao's convention: ``scale = fp8_max / amax`` (the amax floored at 1e-12, so an all-zero
tensor or block gets a large finite scale instead of 0/0, and its codes stay zero), optionally rounded
*down* to a power of two. The casts are torch's own (``Tensor.to(torch.float8_*)``) with an explicit clamp
to ±max first: torch 2.13 saturates E4M3 on overflow but older torch returns NaN, and no torch saturates
E5M2 (it rounds to inf). The tests check these casts against the course's software codec
(:mod:`course_lib.formats`) bit for bit.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import TypeVar

import torch
import torch.nn as nn

from .formats import get_format

E4M3 = "FP8 E4M3"
E5M2 = "FP8 E5M2"
AMAX_FLOOR = 1e-12   # torchao's EPS: the smallest amax a scale is computed from
_CHUNK = 1 << 18     # elements per chunk when casting: keeps the FP32 temporary in cache


# ---- formats and casts ------------------------------------------------------------------------------

def fp8_format(fmt: str) -> str:
    """The canonical name (``"FP8 E4M3"`` or ``"FP8 E5M2"``) of an FP8 training format, or ValueError."""
    if not isinstance(fmt, str):
        raise TypeError(f"an FP8 format is given by name ('e4m3' or 'e5m2'), not {type(fmt).__name__}")
    try:
        name = get_format(fmt).name
    except ValueError:
        name = None
    if name not in (E4M3, E5M2):
        raise ValueError(f"unknown FP8 format {fmt!r}: FP8 training uses 'e4m3' or 'e5m2'")
    return name


def fp8_dtype(fmt: str) -> torch.dtype:
    """The torch dtype of an FP8 format (``torch.float8_e4m3fn`` or ``torch.float8_e5m2``)."""
    name = fp8_format(fmt)
    dtype = get_format(name).torch_dtype_or_none()
    if dtype is None:  # pragma: no cover - every supported torch has both
        raise RuntimeError(f"this torch has no dtype for {name}")
    return dtype


def fp8_max(fmt: str) -> float:
    """Largest finite value of the format: 448 (E4M3) or 57344 (E5M2)."""
    return get_format(fp8_format(fmt)).max_finite


_SATURATES: dict[tuple[str, str], bool] = {}


def native_cast_saturates(fmt: str, device: torch.device | str = "cpu") -> bool:
    """Whether this torch's own cast to ``fmt`` already saturates overflow (and inf) to ±max, measured once
    per format and device type. True for E4M3 in torch 2.13; False in older torch and for E5M2 (inf)."""
    name, dev = fp8_format(fmt), torch.device(device)
    key = (name, dev.type)
    if key not in _SATURATES:
        big = fp8_max(name)
        probe = torch.tensor([2 * big, -2 * big, 3e38, math.inf, -math.inf], device=dev)
        back = probe.to(fp8_dtype(name)).float().cpu()
        _SATURATES[key] = bool((back == torch.tensor([big, -big, big, big, -big])).all())
    return _SATURATES[key]


def cast_saturating(x: torch.Tensor, fmt: str, scale: float | torch.Tensor = 1.0) -> torch.Tensor:
    """``x * scale`` (one scale for the whole tensor) cast to FP8: round to nearest even, saturate at ±max.

    The product is formed in FP32 in chunks, so a large tensor needs no FP32 temporary of its own size
    (allocating one costs more than the cast itself)."""
    dtype, big = fp8_dtype(fmt), fp8_max(fmt)
    clamp_free = native_cast_saturates(fmt, x.device)
    if x.numel() <= _CHUNK:
        y = x.float() * scale   # in FP32, as torchao does: a BF16 product would round before the cast
        return (y if clamp_free else y.clamp_(-big, big)).to(dtype)
    flat = x.reshape(-1)
    out = torch.empty(flat.shape, dtype=dtype, device=x.device)
    buffer = torch.empty(min(flat.numel(), _CHUNK), dtype=torch.float32, device=x.device)
    for start in range(0, flat.numel(), _CHUNK):
        stop = min(start + _CHUNK, flat.numel())
        chunk = buffer[: stop - start]
        if flat.dtype == torch.float32:
            torch.mul(flat[start:stop], scale, out=chunk)
        else:
            chunk.copy_(flat[start:stop]).mul_(scale)
        out[start:stop].copy_(chunk if clamp_free else chunk.clamp_(-big, big))
    return out.reshape(x.shape)


def _row_slices(rows: int, cols: int, br: int):
    """Row slices ``(first_row, last_row, first_block, last_block)`` of about ``_CHUNK`` elements that never
    cross a block boundary: whole row-blocks when they are small, parts of one row-block when not."""
    per_block = br * cols
    if per_block <= _CHUNK:
        step = _CHUNK // per_block
        for first in range(0, rows // br, step):
            last = min(first + step, rows // br)
            yield first * br, last * br, first, last
    else:
        step = max(1, _CHUNK // max(1, cols))
        for b in range(rows // br):
            for r in range(b * br, (b + 1) * br, step):
                yield r, min(r + step, (b + 1) * br), b, b + 1


def _cast_blocks(x2: torch.Tensor, scales: torch.Tensor, block: tuple[int, int], fmt: str) -> Fp8Tensor:
    """Cast a 2-D tensor with one scale per block, a cache-sized slice of rows at a time."""
    rows, cols = x2.shape
    br, bc = block
    if (br, bc) == (rows, cols):
        return Fp8Tensor(cast_saturating(x2, fmt, scales.reshape(())), scales, (br, bc), fmt)
    dtype, big = fp8_dtype(fmt), fp8_max(fmt)
    clamp_free = native_cast_saturates(fmt, x2.device)
    if rows * cols <= _CHUNK:
        y = x2.float() * expand_blocks(scales, block, (rows, cols))
        return Fp8Tensor((y if clamp_free else y.clamp_(-big, big)).to(dtype), scales, (br, bc), fmt)
    out = torch.empty((rows, cols), dtype=dtype, device=x2.device)
    buffer = torch.empty(min(rows * cols, max(_CHUNK, cols)), dtype=torch.float32, device=x2.device)
    for r0, r1, b0, b1 in _row_slices(rows, cols, br):
        s = scales[b0:b1]
        if b1 - b0 > 1 and br > 1:
            s = s.repeat_interleave(br, 0)
        chunk = buffer[: (r1 - r0) * cols]
        if bc > 1 and bc != cols:
            # 1 x bc tiles: view the slice as rows of bc elements, one scale each
            torch.mul(x2[r0:r1].reshape(-1, cols // bc, bc), s.reshape(-1, cols // bc, 1) if s.shape[0] == r1 - r0
                      else s.reshape(1, cols // bc, 1), out=chunk.view(-1, cols // bc, bc))
        else:
            torch.mul(x2[r0:r1], s, out=chunk.view(r1 - r0, cols))
        out[r0:r1].copy_((chunk if clamp_free else chunk.clamp_(-big, big)).view(r1 - r0, cols))
    return Fp8Tensor(out, scales, (br, bc), fmt)


# ---- scaled FP8 tensors -----------------------------------------------------------------------------

@dataclass(frozen=True)
class Fp8Tensor:
    """FP8 codes ``data`` (2-D, ``[rows, cols]``) and FP32 ``scales``, one per block of ``block`` =
    ``(block_rows, block_cols)`` elements, shaped ``[rows / block_rows, cols / block_cols]``.

    The represented value of element ``(i, j)`` is ``data[i, j] * (1 / scales[i // br, j // bc])``.
    """

    data: torch.Tensor
    scales: torch.Tensor
    block: tuple[int, int]
    fmt: str
    # the FP32 dequantised values, computed once (converting FP8 codes to FP32 is slow on a CPU, and a
    # per-tensor-scaled operand serves two products)
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The represented values: codes times the inverse scale of their block (FP32 arithmetic)."""
        return self.values().to(dtype, copy=True)

    def values(self) -> torch.Tensor:
        """The dequantised FP32 values, shared with later calls (do not modify in place)."""
        if "values" not in self._cache:
            inverse = expand_blocks(self.scales.reciprocal(), self.block, self.data.shape)
            self._cache["values"] = self.data.float() * inverse
        return self._cache["values"]

    def t(self) -> "Fp8Tensor":
        """The transpose (codes and scales transposed; no requantisation)."""
        cache = {"values": self._cache["values"].t()} if "values" in self._cache else {}
        return Fp8Tensor(self.data.t(), self.scales.t(), (self.block[1], self.block[0]), self.fmt, cache)

    @property
    def per_tensor(self) -> bool:
        return tuple(self.block) == tuple(self.data.shape)


def expand_blocks(per_block: torch.Tensor, block: tuple[int, int], shape) -> torch.Tensor:
    """One value per block (``[rows/br, cols/bc]``) made to broadcast against a ``shape`` tensor (expanded
    along a dimension only where a block spans several but not all of its elements)."""
    rows, cols = shape
    br, bc = block
    if (br, bc) == (rows, cols):
        return per_block.reshape(())
    v = per_block.reshape(rows // br, cols // bc)
    if 1 < br < rows or (br == rows and v.shape[0] != 1):
        v = v.repeat_interleave(br, 0)
    if 1 < bc < cols:
        v = v.repeat_interleave(bc, 1)
    return v


def _as_2d(x: torch.Tensor, what: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{what} must be floating point, got {x.dtype}")
    if x.dim() == 0:
        return x.reshape(1, 1)
    if x.dim() == 1:
        return x.reshape(1, -1)
    return x.reshape(-1, x.shape[-1])


def _check_finite(amax: torch.Tensor) -> None:
    """Refuse a tensor whose block amaxes show an inf or a NaN."""
    if not bool(torch.isfinite(amax).all()):
        raise ValueError("the tensor holds inf or NaN: a scale computed from it would be 0 or NaN, and every "
                         "value would quantise to 0 or NaN (find the overflow first; lesson 9)")


def block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``max |x|`` over each ``block`` of a 2-D tensor, shape ``[rows / br, cols / bc]`` (FP32)."""
    rows, cols = x.shape
    br, bc = block
    if (br, bc) == (rows, cols):
        lo, hi = torch.aminmax(x)
        return torch.maximum(-lo, hi).float().reshape(1, 1)
    if rows * cols <= _CHUNK:
        tiles = x.abs().view(rows // br, br, cols // bc, bc)
        return (tiles.amax(dim=3) if bc > 1 else tiles.squeeze(3)).amax(dim=1).float()
    out = torch.full((rows // br, cols // bc), 0.0, dtype=torch.float32, device=x.device)
    buffer = torch.empty(min(rows * cols, max(_CHUNK, cols)), dtype=x.dtype, device=x.device)
    for r0, r1, b0, b1 in _row_slices(rows, cols, br):
        part = torch.abs(x[r0:r1], out=buffer[: (r1 - r0) * cols].view(r1 - r0, cols))
        if bc == cols and b1 - b0 == r1 - r0:
            amax = part.amax(dim=1, keepdim=True)
        else:
            # two reductions, the contiguous one first: much faster than one over dims (1, 3)
            tiles = part.view(b1 - b0, -1, cols // bc, bc)
            amax = (tiles.amax(dim=3) if bc > 1 else tiles.squeeze(3)).amax(dim=1)
        torch.maximum(out[b0:b1], amax.float(), out=out[b0:b1])
    return out


def amax_to_scale(amax: torch.Tensor, fmt: str, *, power_of_two: bool = False) -> torch.Tensor:
    """``fp8_max / max(amax, 1e-12)`` in FP32 (computed in float64, as torchao does), optionally rounded
    down to a power of two. Never 0/0: an all-zero block gets a large finite scale."""
    big = fp8_max(fmt)
    scale = (big / torch.clamp(amax.to(torch.float64), min=AMAX_FLOOR)).to(torch.float32)
    if power_of_two:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def _resolve_block(block: tuple[int, int], shape: tuple[int, ...]) -> tuple[int, int]:
    """A block with -1 meaning 'the whole dimension', checked to tile the shape exactly."""
    rows, cols = shape
    br = rows if block[0] == -1 else block[0]
    bc = cols if block[1] == -1 else block[1]
    if rows % br or cols % bc:
        raise ValueError(f"block {br} x {bc} does not tile a {rows} x {cols} tensor: each block dimension "
                         "must divide the tensor's (pad the tensor or choose a smaller block)")
    return br, bc


# ---- recipes ----------------------------------------------------------------------------------------

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
        x2 = _as_2d(x).detach()
        return self.scale_from_amax(block_amax(x2, self.block_for(tuple(x2.shape))))

    def quantize(self, x: torch.Tensor) -> Fp8Tensor:
        """``x`` as FP8 codes and scales (raises ValueError for inf/NaN input)."""
        x2 = _as_2d(x).detach()
        block = self.block_for(tuple(x2.shape))
        amax = block_amax(x2, block)
        _check_finite(amax)
        return _cast_blocks(x2, self.scale_from_amax(amax), block, self.fmt)

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
        return _resolve_block(self.block, shape)

    def describe(self):
        return f"{self.fmt}, {self.block[0]} x {self.block[1]} blocks"


class DelayedScaling(ScalingRecipe):
    """Per-tensor *delayed* scaling, Transformer Engine's ``DelayedScaling`` rule.

    The scale used for a tensor at step *t* comes from the amaxes of earlier steps, kept in a history of
    ``amax_history_len`` values (default 1024): ``amax_compute_algo="max"`` takes the largest in the history,
    ``"most_recent"`` the last one. ``scale = fp8_max / amax / 2**margin``. A step whose amax is zero or not
    finite keeps the previous scale. The first step uses scale 1.

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
        if isinstance(margin, bool) or not isinstance(margin, (int, float)) or not math.isfinite(margin):
            raise ValueError(f"margin must be a finite number (a power-of-two exponent), got {margin!r}")
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
        if not (math.isfinite(amax) and amax > 0):
            return previous
        scale = float(torch.tensor(fp8_max(self.fmt) / amax / 2.0 ** self.margin, dtype=torch.float32))
        # TE: a scale that overflows FP32 (a tiny amax) becomes FP32's max
        return scale if math.isfinite(scale) else float(torch.finfo(torch.float32).max)

    def observe(self, amax: float) -> None:
        """Record one step's amax and update the scale for the next step."""
        self.history.append(float(amax))
        if len(self.history) > self.amax_history_len:
            del self.history[0]
        self.current_scale = self.next_scale()

    def quantize(self, x):
        x2 = _as_2d(x).detach()
        amax = float(block_amax(x2, tuple(x2.shape)))
        if not math.isfinite(amax):
            # TE keeps the previous scale; casting the tensor itself would give NaN codes
            self.observe(amax)
            raise ValueError("the tensor holds inf or NaN: delayed scaling keeps its previous scale (as "
                             "Transformer Engine does) but the tensor cannot be cast")
        q = _cast_blocks(x2, self.scale(x2), tuple(x2.shape), self.fmt)
        self.observe(amax)
        return q

    def reset(self) -> None:
        self.history, self.current_scale = [], 1.0

    def describe(self):
        return f"{self.fmt}, history {self.amax_history_len}, {self.amax_compute_algo}, margin {self.margin}"


# ---- error metrics ----------------------------------------------------------------------------------

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
    x2 = _as_2d(x).detach().float()
    q = recipe.quantize(x2)
    back = q.dequantize()
    err = float(torch.linalg.vector_norm(back - x2))
    norm = float(torch.linalg.vector_norm(x2))
    rel = err / norm if norm > 0 else 0.0
    # saturated: |x| * scale would round above max (beyond max + half its spacing), so the clamp changed it;
    # the block's own amax lands on max (give or take the scale's FP32 rounding) and does not count
    f = get_format(q.fmt)
    boundary = f.max_finite + 2.0 ** (math.floor(math.log2(f.max_finite)) - f.mantissa_bits) / 2
    scaled = x2.abs() * expand_blocks(q.scales, q.block, x2.shape)
    saturated = float((scaled >= boundary).float().mean())
    nonzero = x2 != 0
    flushed = float(((back == 0) & nonzero).sum()) / max(1, int(nonzero.sum()))
    bits = -math.log2(rel) if rel > 0 else math.inf
    return QuantizationError(label or repr(recipe), rel, saturated, flushed, bits, x2.numel())


# ---- FP8 linear layers ------------------------------------------------------------------------------

def _scaled_mm_inverse(q: Fp8Tensor, side: str) -> torch.Tensor:
    """``q``'s inverse scales in the shape ``torch._scaled_mm`` takes for operand ``side`` ("a": [M, 1]
    or a scalar; "b": [1, N] or a scalar), or ValueError for block scales it does not take."""
    rows, cols = q.data.shape
    inv = q.scales.reciprocal()
    if q.per_tensor:
        return inv.reshape(())
    if side == "a" and q.block == (1, cols):
        return inv.reshape(rows, 1)
    if side == "b" and q.block == (rows, 1):
        return inv.reshape(1, cols)
    raise ValueError(f"torch._scaled_mm takes one scale per tensor or per row/column, not {q.block[0]} x "
                     f"{q.block[1]} blocks: use backend='simulated'")


def fp8_matmul(a: Fp8Tensor, b: Fp8Tensor, *, backend: str = "simulated",
               out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``a @ b`` of two scaled FP8 tensors (``[M, K] @ [K, N]``), with the scales applied.

    ``backend="simulated"``: dequantise both (codes times inverse scales, in FP32) and multiply in FP32; runs
    anywhere, any block shape. ``backend="scaled_mm"``: ``torch._scaled_mm`` on the codes, per-tensor or
    row/column scales only. On the CPU the two agree bit for bit with torch's reference kernel (which
    dequantises the same way); where torch hands per-tensor FP8 products to oneDNN (CPUs with AMX), that
    kernel sums in its own order and agrees within FP32 summation error; on a GPU the FP8 tensor cores accumulate differently (see :func:`accumulation_error`), and per-row
    scales may take only a BF16 ``out_dtype`` (torchao asks for BF16 and casts back)."""
    if a.data.shape[1] != b.data.shape[0]:
        raise ValueError(f"inner dimensions differ: {tuple(a.data.shape)} @ {tuple(b.data.shape)}")
    if backend == "simulated":
        return (a.values() @ b.values()).to(out_dtype)
    if backend == "scaled_mm":
        if not hasattr(torch, "_scaled_mm"):  # pragma: no cover - torch 2.11+ has it
            raise ValueError("this torch has no torch._scaled_mm: use backend='simulated'")
        # _scaled_mm wants a row-major and b column-major
        b_col = b.data.t().contiguous().t()
        sa, sb = _scaled_mm_inverse(a, "a"), _scaled_mm_inverse(b, "b")
        if sa.dim() or sb.dim():
            from .hardware import scaled_mm_unsupported_reason

            why = scaled_mm_unsupported_reason(a.data.device, row_scales=True)
            if why is not None:
                raise ValueError(f"row/column scales need a _scaled_mm that takes them: {why}; use "
                                 f"backend='simulated'")
        if sa.dim() != sb.dim():
            # one operand per tensor, the other per row/column: _scaled_mm takes the row-wise form only
            sa = sa.expand(a.data.shape[0], 1).contiguous() if sa.dim() == 0 else sa
            sb = sb.expand(1, b.data.shape[1]).contiguous() if sb.dim() == 0 else sb
        return torch._scaled_mm(a.data.contiguous(), b_col, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    raise ValueError(f"backend must be 'simulated' or 'scaled_mm', got {backend!r}")


@dataclass
class LinearScaling:
    """The scaling of the six FP8 casts of one linear layer's three products.

    ``output = x @ w.T`` reduces over K: ``x`` and ``w`` scaled along their rows. ``grad_x = g @ w``
    reduces over N: ``g`` along rows, ``w`` along columns. ``grad_w = g.T @ x`` reduces over M: ``g`` and
    ``x`` along columns. A role given the *same* recipe object as another is cast once and reused (a
    per-tensor scale serves both products, as in torchao's tensorwise and Transformer Engine).
    ``grad_weight_high_precision``: compute ``grad_w`` from the unquantised tensors (torchao's
    ``rowwise_with_gw_hp``).
    """

    x: ScalingRecipe
    w: ScalingRecipe
    g: ScalingRecipe
    x_for_grad_w: ScalingRecipe
    w_for_grad_x: ScalingRecipe
    g_for_grad_w: ScalingRecipe
    grad_weight_high_precision: bool = False


def _rowwise_pair(fmt):
    return RowwiseScaling(fmt, axis=-1), RowwiseScaling(fmt, axis=0)


def linear_scaling(recipe: str, *, block: int = 128) -> LinearScaling:
    """Fresh per-layer scaling state for an FP8 training recipe:

    * ``"tensorwise"``: current per-tensor scaling, E4M3 forward, E5M2 gradients (torchao's default);
    * ``"rowwise"``: row/column scales rounded to powers of two, E4M3 everywhere (torchao);
    * ``"rowwise_with_gw_hp"``: rowwise, with the weight gradient in high precision (torchao);
    * ``"delayed"``: Transformer Engine's ``DelayedScaling`` defaults (history 1024, max, margin 0),
      HYBRID (E4M3 forward, E5M2 gradients);
    * ``"blockwise"``: DeepSeek-V3: E4M3, ``1 x block`` tiles for activations and gradients (``block x 1``
      where a product reduces over rows), ``block x block`` for weights;
    * ``"unscaled"``: E4M3 forward, E5M2 gradients, every scale 1: the control with no scaling.
    """
    x: ScalingRecipe
    w: ScalingRecipe
    g: ScalingRecipe
    if recipe == "tensorwise":
        x, w, g = CurrentScaling("e4m3"), CurrentScaling("e4m3"), CurrentScaling("e5m2")
        return LinearScaling(x, w, g, x, w, g)
    if recipe in ("rowwise", "rowwise_with_gw_hp"):
        (x, xc), (w, wc), (g, gc) = _rowwise_pair("e4m3"), _rowwise_pair("e4m3"), _rowwise_pair("e4m3")
        if recipe == "rowwise_with_gw_hp":
            # torchao: grad_x uses a per-tensor weight scale; grad_w runs in high precision
            return LinearScaling(x, w, g, xc, CurrentScaling("e4m3", power_of_two=True), gc,
                                 grad_weight_high_precision=True)
        return LinearScaling(x, w, g, xc, wc, gc)
    if recipe == "delayed":
        x, w, g = DelayedScaling("e4m3"), DelayedScaling("e4m3"), DelayedScaling("e5m2")
        return LinearScaling(x, w, g, x, w, g)
    if recipe == "blockwise":
        rows, cols = BlockwiseScaling("e4m3", block=(1, block)), BlockwiseScaling("e4m3", block=(block, 1))
        grows, gcols = BlockwiseScaling("e4m3", block=(1, block)), BlockwiseScaling("e4m3", block=(block, 1))
        w = BlockwiseScaling("e4m3", block=(block, block))
        return LinearScaling(rows, w, grows, cols, w, gcols)
    if recipe == "unscaled":
        x, w, g = StaticScaling("e4m3"), StaticScaling("e4m3"), StaticScaling("e5m2")
        return LinearScaling(x, w, g, x, w, g)
    raise ValueError(f"unknown FP8 linear recipe {recipe!r}; known: {', '.join(FP8_LINEAR_RECIPES)}")


FP8_LINEAR_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed", "blockwise", "unscaled")


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, scaling: LinearScaling, backend: str):
        xq = scaling.x.quantize(x2)
        wq = scaling.w.quantize(weight)
        out = fp8_matmul(xq, wq.t(), backend=backend)
        ctx.scaling, ctx.backend = scaling, backend
        ctx.xq, ctx.wq = xq, wq
        ctx.save_for_backward(x2, weight)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x2, weight = ctx.saved_tensors
        s, backend = ctx.scaling, ctx.backend
        g = grad_out.float()
        gq = s.g.quantize(g)
        # grad_x = g @ w: the weight scaled along columns (reused when one scale serves both products)
        wq = ctx.wq if s.w_for_grad_x is s.w else s.w_for_grad_x.quantize(weight)
        grad_x = fp8_matmul(gq, wq, backend=backend)
        if s.grad_weight_high_precision:
            grad_w = g.t() @ x2.float()
        else:
            gq_w = gq if s.g_for_grad_w is s.g else s.g_for_grad_w.quantize(g)
            xq_w = ctx.xq if s.x_for_grad_w is s.x else s.x_for_grad_w.quantize(x2)
            grad_w = fp8_matmul(gq_w.t(), xq_w, backend=backend)
        return grad_x.to(x2.dtype), grad_w.to(weight.dtype), None, None


_Q = TypeVar("_Q", bound="QuantizedLinear")


class QuantizedLinear(nn.Module):
    """The shell the course's emulated low-precision linear layers share: an FP32 master weight and bias
    initialised as ``nn.Linear`` does, the three products done by the subclass's :meth:`_product` on a 2-D
    FP32 input outside autocast, the bias added in FP32, and the output in the input's dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    @classmethod
    def from_linear(cls: type[_Q], linear: nn.Linear, **kwargs) -> _Q:
        """A layer of this kind with ``linear``'s weights, on its device (``kwargs`` go to the constructor)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(linear.weight)
            if linear.bias is not None and layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer.to(linear.weight.device)

    def _product(self, x2: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        with torch.autocast(x.device.type, enabled=False):
            out = self._product(x2.float())
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def replace_linears(model: nn.Module, make, *, skip: tuple[str, ...] = (),
                    keep_prefixes: tuple[str, ...] = ()) -> nn.Module:
    """Replace every plain ``nn.Linear`` of ``model`` (in place) by ``make(linear, index)`` (``index``
    counts the replaced layers in module order), except those whose qualified name is in ``skip`` or lies
    under a name in ``keep_prefixes``. Returns ``model``."""
    index = 0
    for name, module in list(model.named_modules()):
        if any(name == k or name.startswith(k + ".") for k in keep_prefixes):
            continue
        for child_name, child in list(module.named_children()):
            qualified = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and qualified not in skip:
                setattr(module, child_name, make(child, index))
                index += 1
    return model


class Fp8Linear(QuantizedLinear):
    """A drop-in ``nn.Linear`` whose three matrix products (forward, grad input, grad weight) take FP8
    operands scaled by an FP8 training ``recipe`` (see :func:`linear_scaling`). Weights stay in FP32 (the
    master copy); the bias is added in FP32. Output dtype: the input's."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: str = "tensorwise",
                 backend: str = "simulated", block: int = 128):
        if backend not in ("simulated", "scaled_mm"):
            raise ValueError(f"backend must be 'simulated' or 'scaled_mm', got {backend!r}")
        super().__init__(in_features, out_features, bias)
        self.recipe, self.backend, self.block = recipe, backend, block
        self.scaling = linear_scaling(recipe, block=block)

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        return _Fp8LinearFunction.apply(x2, self.weight, self.scaling, self.backend)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, recipe={self.recipe!r}, "
                f"backend={self.backend!r}")


def convert_to_fp8(model: nn.Module, recipe: str = "tensorwise", *, backend: str = "simulated",
                   block: int = 128, skip: tuple[str, ...] = ("head",)) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by an :class:`Fp8Linear` with the same weights,
    except modules whose qualified name is in ``skip`` (default: the output head, which torchao's users and
    Transformer Engine's examples usually keep in BF16). Returns ``model``."""
    linear_scaling(recipe, block=block)  # validate the name first
    return replace_linears(model, lambda linear, _: Fp8Linear.from_linear(linear, recipe=recipe, backend=backend,
                                                                          block=block), skip=skip)


# ---- accumulation precision -------------------------------------------------------------------------

def _keep_significant_bits(x: torch.Tensor, bits: int, rounding: str) -> torch.Tensor:
    """FP32 values rounded to ``bits`` significant bits (the implicit 1 included), exponent range kept."""
    drop = 24 - bits
    if drop <= 0:
        return x
    i = x.view(torch.int32)
    if rounding == "nearest_even":
        lsb = (i >> drop) & 1
        i = i + ((1 << (drop - 1)) - 1) + lsb   # carries into the exponent correctly for finite values
    return (i & ~((1 << drop) - 1)).view(torch.float32)


@dataclass(frozen=True)
class AccumulationStudy:
    """Relative error of long dot products against exact (float64) sums, per accumulator, over lengths K.

    ``errors[label]``: one (median, max) pair per K, over ``dots`` independent dot products of FP8 (E4M3)
    inputs. ``rounding``: how the limited accumulator drops bits (a model assumption, see the lesson)."""

    ks: tuple[int, ...]
    accumulator_bits: int
    promote_every: int
    rounding: str
    dots: int
    errors: dict[str, tuple[tuple[float, float], ...]]


def accumulation_error(ks=(128, 256, 512, 1024, 2048, 4096, 8192), *, accumulator_bits: int = 14,
                       promote_every: int = 128, dots: int = 64, rounding: str = "toward_zero",
                       seed: int = 0) -> AccumulationStudy:
    """Dot products of length K of non-negative FP8 inputs (``|N(0, 1)|`` cast to E4M3, so every product is
    exact in FP32), summed three ways: an FP32 accumulator; an accumulator keeping ``accumulator_bits``
    significant bits (DeepSeek-V3 reports about 14 on H800 FP8 tensor cores); and the same, with the partial
    sum added into an FP32 total every ``promote_every`` products (DeepSeek-V3's fix, N_C = 128)."""
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"ks must be positive lengths, got {ks}")
    if not isinstance(accumulator_bits, int) or not 2 <= accumulator_bits <= 24:
        raise ValueError(f"accumulator_bits must be an int in 2..24, got {accumulator_bits!r}")
    if not isinstance(promote_every, int) or promote_every < 1:
        raise ValueError(f"promote_every must be a positive int, got {promote_every!r}")
    if rounding not in ("toward_zero", "nearest_even"):
        raise ValueError(f"rounding must be 'toward_zero' or 'nearest_even', got {rounding!r}")
    gen = torch.Generator().manual_seed(seed)
    k_max = max(ks)
    a = torch.randn(dots, k_max, generator=gen).abs().to(torch.float8_e4m3fn).float()
    b = torch.randn(dots, k_max, generator=gen).abs().to(torch.float8_e4m3fn).float()
    products = a * b   # exact: 4-bit significands multiply into 8 bits
    exact = products.double().cumsum(dim=1)
    fp32 = torch.zeros(dots)
    limited = torch.zeros(dots)
    promoted_total, partial = torch.zeros(dots), torch.zeros(dots)
    labels = ("FP32 accumulator", f"{accumulator_bits}-bit accumulator",
              f"{accumulator_bits}-bit, promoted to FP32 every {promote_every}")
    out: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
    wanted = set(ks)
    for k in range(k_max):
        p = products[:, k]
        fp32 = fp32 + p
        limited = _keep_significant_bits(limited + p, accumulator_bits, rounding)
        partial = _keep_significant_bits(partial + p, accumulator_bits, rounding)
        if (k + 1) % promote_every == 0:
            promoted_total, partial = promoted_total + partial, torch.zeros(dots)
        if k + 1 in wanted:
            ref = exact[:, k]
            for label, value in zip(labels, (fp32, limited, promoted_total + partial)):
                rel = ((value.double() - ref).abs() / ref).tolist()
                rel.sort()
                out[label].append((rel[len(rel) // 2], rel[-1]))
    return AccumulationStudy(ks, accumulator_bits, promote_every, rounding, dots,
                             {label: tuple(v) for label, v in out.items()})


# ---- when FP8 pays: a roofline for one linear layer --------------------------------------------------

LAUNCH_SECONDS = 2e-6   # torchao's roofline: the least time any kernel takes (measured on an H100)


@dataclass(frozen=True)
class Fp8LinearEstimate:
    """Predicted time of one linear layer's forward and backward (three products), BF16 against FP8.

    Seconds. ``fp8_cast_s``: the extra memory traffic of computing scales and casting (the overhead that
    makes small shapes slower)."""

    m: int
    k: int
    n: int
    recipe: str
    bf16_s: float
    fp8_gemm_s: float
    fp8_cast_s: float

    @property
    def fp8_s(self) -> float:
        return self.fp8_gemm_s + self.fp8_cast_s

    @property
    def speedup(self) -> float:
        return self.bf16_s / self.fp8_s


def _gemm_seconds(m, k, n, bytes_in, peak_flops, bandwidth, gemm_eff, mem_eff):
    compute = 2 * m * k * n / peak_flops / gemm_eff
    traffic = (m * k + k * n) * bytes_in + m * n * 2   # output in BF16
    return max(compute, traffic / bandwidth / mem_eff, LAUNCH_SECONDS)


def _cast_kernels(numel: int, role: str, recipe: str, fuse: bool) -> list[float]:
    """Bytes moved by each scale-and-cast kernel of one operand (BF16 in, FP8 out), torchao's model."""
    bf16, f8 = 2, 1
    if recipe == "tensorwise":
        amax = 0 if fuse else bf16 * numel
        if role == "weight":
            return [amax, 0, bf16 * numel + f8 * numel, bf16 * numel + f8 * numel]
        return [amax, 0, bf16 * numel + 2 * f8 * numel]
    if recipe == "rowwise":
        if role == "weight":
            first = (0 if fuse else bf16 * numel) + f8 * numel
            return [first, 2 * bf16 * numel, bf16 * numel + f8 * numel]
        first = (0 if fuse else bf16 * numel) + f8 * numel + bf16 * numel
        return [first, bf16 * numel + f8 * numel]
    if recipe == "rowwise_with_gw_hp":
        if role == "weight":
            return [bf16 * numel + f8 * numel, 0, bf16 * numel + f8 * numel]
        return [(0 if fuse else bf16 * numel) + f8 * numel]
    raise ValueError(f"the roofline covers 'tensorwise', 'rowwise' and 'rowwise_with_gw_hp', not {recipe!r}")


def predict_fp8_linear(m: int, k: int, n: int, *, bf16_tflops: float, fp8_tflops: float, bandwidth_gbs: float,
                       recipe: str = "tensorwise", fuse_casts: bool = False, gemm_efficiency: float = 0.78,
                       memory_efficiency: float = 0.92) -> Fp8LinearEstimate:
    """Roofline estimate of an ``[m, k] @ [k, n]`` linear layer's forward + backward in BF16 and in FP8.

    Follows torchao's float8 roofline (``torchao.testing.training.roofline_utils``, checked equal in the
    tests): each product takes the longest of its compute time at ``gemm_efficiency`` x peak, its memory
    time at ``memory_efficiency`` x bandwidth, and a 2 us launch; FP8 adds the cast kernels' traffic
    (input and grad_output casts can fuse their read into the previous op: ``fuse_casts``). The default
    efficiencies are torchao's, measured on an H100."""
    for name, size in (("m", m), ("k", k), ("n", n)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    for name, value in (("bf16_tflops", bf16_tflops), ("fp8_tflops", fp8_tflops), ("bandwidth_gbs", bandwidth_gbs),
                        ("gemm_efficiency", gemm_efficiency), ("memory_efficiency", memory_efficiency)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    bw = bandwidth_gbs * 1e9
    bf16_peak, fp8_peak = bf16_tflops * 1e12, fp8_tflops * 1e12
    shapes = ((m, k, n), (m, n, k), (k, m, n))   # output, grad_input, grad_weight
    bf16 = sum(_gemm_seconds(*s, 2, bf16_peak, bw, gemm_efficiency, memory_efficiency) for s in shapes)
    fp8_shapes = shapes[:2] if recipe == "rowwise_with_gw_hp" else shapes
    gemm = sum(_gemm_seconds(*s, 1, fp8_peak, bw, gemm_efficiency, memory_efficiency) for s in fp8_shapes)
    if recipe == "rowwise_with_gw_hp":
        gemm += _gemm_seconds(*shapes[2], 2, bf16_peak, bw, gemm_efficiency, memory_efficiency)
    kernels = (_cast_kernels(m * k, "input", recipe, fuse_casts) + _cast_kernels(k * n, "weight", recipe, False)
               + _cast_kernels(m * n, "grad_output", recipe, fuse_casts))
    cast = sum(max(b / bw / memory_efficiency, LAUNCH_SECONDS) for b in kernels)
    return Fp8LinearEstimate(m, k, n, recipe, bf16, gemm, cast)


# ---- experiments on the course model ----------------------------------------------------------------

@dataclass(frozen=True)
class LinearTensors:
    """The three tensors an FP8 linear layer casts, taken from the course model after ``steps`` steps of
    FP32 training: its input activation ``[tokens, in]``, its weight ``[out, in]``, and the gradient of the
    loss with respect to its output ``[tokens, out]``."""

    layer: str
    steps: int
    activation: torch.Tensor
    weight: torch.Tensor
    grad_output: torch.Tensor
    losses: tuple[float, ...]


def capture_linear_tensors(profile, device: torch.device | str = "cpu", *, layer: str = "blocks.0.fc",
                           steps: int | None = None, seed: int = 0, lr: float = 3e-3) -> LinearTensors:
    """Train the course GPT in FP32 for ``steps`` steps, then record one linear layer's input, weight and
    output gradient on the next batch."""
    from .models import course_setup

    setup = course_setup(profile, device, steps=steps, default_steps=(30, 300), seed=seed)
    model = setup.model(seed)
    modules = dict(model.named_modules())
    if layer not in modules or not isinstance(modules[layer], nn.Linear):
        linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
        raise ValueError(f"{layer!r} is not a linear layer of the course model; choose one of {linears}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(setup.steps):
        x, y = setup.sampler.batch(step, setup.device)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    seen: dict[str, torch.Tensor] = {}
    target = modules[layer]
    h1 = target.register_forward_hook(lambda m, inp, out: seen.__setitem__("activation", inp[0].detach()))
    h2 = target.register_full_backward_hook(lambda m, gin, gout: seen.__setitem__("grad", gout[0].detach()))
    try:
        x, y = setup.sampler.batch(setup.steps, setup.device)
        model(x, y)[1].backward()
    finally:
        h1.remove()
        h2.remove()
    act, grad = seen["activation"], seen["grad"]
    return LinearTensors(layer, setup.steps, act.reshape(-1, act.shape[-1]).cpu().float(),
                         target.weight.detach().cpu().float().clone(), grad.reshape(-1, grad.shape[-1]).cpu().float(),
                         tuple(losses))


def with_outlier_channel(activation: torch.Tensor, *, channel: int = 0, factor: float = 100.0) -> torch.Tensor:
    """A copy of ``activation`` ``[tokens, channels]`` with one channel multiplied by ``factor``: the
    'outlier features' of large language models, where a few channels are far larger than the rest."""
    if activation.dim() != 2:
        raise ValueError(f"activation must be [tokens, channels], got shape {tuple(activation.shape)}")
    if not 0 <= channel < activation.shape[1]:
        raise ValueError(f"channel {channel} is outside 0..{activation.shape[1] - 1}")
    out = activation.clone()
    out[:, channel] *= factor
    return out


def lab_recipes(block: int = 128) -> dict[str, ScalingRecipe]:
    """The recipes the lesson's scaling lab compares, by display name (stateless: delayed scaling is
    studied over time in :func:`delayed_spike`)."""
    return {
        "no scaling (E4M3)": StaticScaling("e4m3"),
        "per tensor, E4M3": CurrentScaling("e4m3"),
        "per tensor, E5M2": CurrentScaling("e5m2"),
        "per row (token), E4M3": RowwiseScaling("e4m3", axis=-1),
        "per column (channel), E4M3": RowwiseScaling("e4m3", axis=0),
        f"1 x {block} tiles, E4M3": BlockwiseScaling("e4m3", block=(1, block)),
        f"{block} x {block} blocks, E4M3": BlockwiseScaling("e4m3", block=(block, block)),
    }


@dataclass(frozen=True)
class ScalingLab:
    """``errors[tensor][recipe]``: the :class:`QuantizationError` of each recipe on each tensor."""

    tensors: tuple[str, ...]
    recipes: tuple[str, ...]
    errors: dict[str, dict[str, QuantizationError]]


def scaling_lab(tensors: dict[str, torch.Tensor], recipes: dict[str, ScalingRecipe]) -> ScalingLab:
    """Every recipe on every tensor. A recipe whose blocks do not tile a tensor raises ValueError."""
    if not tensors or not recipes:
        raise ValueError("scaling_lab needs at least one tensor and one recipe")
    errors = {t: {r: quantization_error(x, recipe, label=r) for r, recipe in recipes.items()}
              for t, x in tensors.items()}
    return ScalingLab(tuple(tensors), tuple(recipes), errors)


@dataclass(frozen=True)
class SpikeRun:
    """Per step of a tensor sequence with one amax spike: the amax, and per recipe the share saturated,
    the share flushed to zero and the relative error."""

    spike_at: int
    factor: float
    amax: tuple[float, ...]
    saturated: dict[str, tuple[float, ...]]
    flushed: dict[str, tuple[float, ...]]
    relative_error: dict[str, tuple[float, ...]]


def delayed_spike(tensor: torch.Tensor, *, steps: int = 40, spike_at: int = 15, factor: float = 50.0,
                  amax_history_len: int = 16, margin: int = 0, fmt: str = "e4m3", seed: int = 0) -> SpikeRun:
    """Feed ``steps`` tensors through current and delayed scaling: step *t* is ``tensor`` times a gently
    varying gain (0.8..1.2, from ``seed``), and step ``spike_at`` is also multiplied by ``factor`` (a loss
    spike's activations). Delayed scaling runs with ``amax_compute_algo`` "max" and "most_recent"."""
    if not 0 <= spike_at < steps:
        raise ValueError(f"spike_at must lie in 0..{steps - 1}, got {spike_at}")
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a positive number, got {factor!r}")
    gen = torch.Generator().manual_seed(seed)
    gains = 0.8 + 0.4 * torch.rand(steps, generator=gen)
    recipes: dict[str, ScalingRecipe] = {
        "current": CurrentScaling(fmt),
        f"delayed, max of {amax_history_len}": DelayedScaling(fmt, amax_history_len=amax_history_len,
                                                              amax_compute_algo="max", margin=margin),
        "delayed, most recent": DelayedScaling(fmt, amax_history_len=amax_history_len,
                                               amax_compute_algo="most_recent", margin=margin),
    }
    sat: dict[str, list[float]] = {k: [] for k in recipes}
    flushed: dict[str, list[float]] = {k: [] for k in recipes}
    rel: dict[str, list[float]] = {k: [] for k in recipes}
    amaxes = []
    base = _as_2d(tensor).detach().float()
    for t in range(steps):
        x = base * float(gains[t]) * (factor if t == spike_at else 1.0)
        amaxes.append(float(x.abs().max()))
        for name, recipe in recipes.items():
            e = quantization_error(x, recipe)
            sat[name].append(e.saturated)
            flushed[name].append(e.flushed)
            rel[name].append(e.relative_error)
    return SpikeRun(spike_at, factor, tuple(amaxes), {k: tuple(v) for k, v in sat.items()},
                    {k: tuple(v) for k, v in flushed.items()}, {k: tuple(v) for k, v in rel.items()})


@dataclass(frozen=True)
class Fp8Training:
    """Loss curves of the course model per recipe and seed (``curves[recipe][i]`` for ``seeds[i]``)."""

    recipes: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    block: int
    curves: dict[str, tuple[tuple[float, ...], ...]]

    def final(self, recipe: str, tail: int = 5) -> tuple[float, ...]:
        """Per seed, the mean loss over the last ``tail`` steps."""
        return tuple(sum(c[-tail:]) / len(c[-tail:]) for c in self.curves[recipe])


def train_fp8(recipe: str, profile, device: torch.device | str = "cpu", *, steps: int | None = None,
              seed: int = 0, lr: float = 3e-3, block: int | None = None, backend: str = "simulated"):
    """Train the course GPT with FP8 linear layers (``recipe``, see :func:`linear_scaling`; every other op
    and the weights in FP32), or with a plain precision recipe of :mod:`course_lib.train` ("fp32",
    "bf16_autocast", ...). Same batches, same initial weights for the same seed. Returns the History."""
    from .models import course_setup
    from .train import RECIPES, TrainConfig, TrainState, get_recipe, train

    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(40, 1000), seed=seed)
    model = setup.model(seed)
    if recipe in RECIPES:
        precision = get_recipe(recipe, device)
    else:
        block = block if block is not None else profile.pick(small=32, full=128)
        convert_to_fp8(model, recipe, backend=backend, block=block)
        precision = get_recipe("fp32", device)
    state = TrainState(model, precision, TrainConfig(steps=setup.steps, lr=lr), device)
    return train(state, setup.sampler)


def fp8_training(profile, device: torch.device | str = "cpu", *,
                 recipes=("bf16_autocast", "tensorwise", "rowwise", "delayed", "blockwise", "unscaled"),
                 seeds=(0, 1, 2), steps: int | None = None, lr: float = 3e-3) -> Fp8Training:
    """Loss curves of :func:`train_fp8` for every recipe and seed."""
    if not recipes or not seeds:
        raise ValueError("fp8_training needs at least one recipe and one seed")
    curves, n_steps = seeded_curves(lambda recipe, seed: train_fp8(recipe, profile, device, steps=steps, seed=seed,
                                                                   lr=lr), recipes, seeds)
    return Fp8Training(tuple(recipes), tuple(seeds), n_steps, profile.pick(small=32, full=128), curves)


def seeded_curves(train_one, recipes, seeds) -> tuple[dict[str, tuple[tuple[float, ...], ...]], int]:
    """``train_one(recipe, seed)`` (a History) for every recipe and seed: the loss curves as
    ``curves[recipe][i]`` for ``seeds[i]``, and the number of steps a run took."""
    curves, n_steps = {}, 0
    for recipe in recipes:
        runs = []
        for seed in seeds:
            losses = tuple(train_one(recipe, seed).losses)
            runs.append(losses)
            n_steps = len(losses)
        curves[recipe] = tuple(runs)
    return curves, n_steps


@dataclass(frozen=True)
class OutlierSweep:
    """How an outlier channel of growing size damages the *other* channels, per recipe.

    ``relative_error[recipe][i]``: L2 relative error of the non-outlier channels at ``factors[i]``;
    ``flushed[recipe][i]``: the share of their non-zero values that became 0."""

    channel: int
    factors: tuple[float, ...]
    relative_error: dict[str, tuple[float, ...]]
    flushed: dict[str, tuple[float, ...]]


def outlier_sweep(activation: torch.Tensor, recipes: dict[str, ScalingRecipe], *,
                  factors=(1, 10, 100, 1e3, 1e4, 1e5, 1e6), channel: int = 0) -> OutlierSweep:
    """Quantise ``activation`` ``[tokens, channels]`` with one channel multiplied by each factor in turn,
    and measure the error of the remaining channels (the ones an outlier's scale is not chosen for)."""
    if not recipes:
        raise ValueError("outlier_sweep needs at least one recipe")
    factors = tuple(float(f) for f in factors)
    if not factors or any(not (math.isfinite(f) and f > 0) for f in factors):
        raise ValueError(f"factors must be positive numbers, got {factors}")
    rest = [c for c in range(activation.shape[1]) if c != channel]
    base = activation.detach().float()[:, rest]
    norm = float(torch.linalg.vector_norm(base))
    nonzero = max(1, int((base != 0).sum()))
    rel: dict[str, list[float]] = {name: [] for name in recipes}
    flushed: dict[str, list[float]] = {name: [] for name in recipes}
    for factor in factors:
        x = with_outlier_channel(activation.detach().float(), channel=channel, factor=factor)
        for name, recipe in recipes.items():
            back = recipe.round_trip(x)[:, rest]
            rel[name].append(float(torch.linalg.vector_norm(back - base)) / norm)
            flushed[name].append(float(((back == 0) & (base != 0)).sum()) / nonzero)
    return OutlierSweep(channel, factors, {k: tuple(v) for k, v in rel.items()},
                        {k: tuple(v) for k, v in flushed.items()})


# ---- measured speed ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Fp8LinearSpeed:
    """Median seconds of one linear layer's forward + backward (``[n, n] @ [n, n]``) per implementation
    and size; ``skipped[implementation]`` says why one did not run."""

    device: str
    sizes: tuple[int, ...]
    seconds: dict[str, dict[int, float]]
    skipped: dict[str, str]

    def speedup(self, implementation: str, baseline: str = "BF16 nn.Linear") -> dict[int, float]:
        return {n: self.seconds[baseline][n] / s for n, s in self.seconds.get(implementation, {}).items()
                if n in self.seconds.get(baseline, {})}


def _linear_implementations(n: int, device: torch.device):
    """(name, module, input dtype) for each implementation the speed study times, or (name, reason)."""
    base = nn.Linear(n, n, bias=False)
    out: list[tuple] = [("BF16 nn.Linear", copy.deepcopy(base).to(device, torch.bfloat16), torch.bfloat16),
           ("FP8 course layer (_scaled_mm, tensorwise, eager)",
            Fp8Linear.from_linear(base, recipe="tensorwise", backend="scaled_mm").to(device), torch.bfloat16)]
    try:
        import logging

        logging.getLogger("torchao").setLevel(logging.ERROR)
        from torchao.float8 import convert_to_float8_training
    except Exception as exc:  # torchao is optional on a GPU image
        out.append(("torchao Float8Linear (tensorwise, eager)", f"torchao does not import here ({exc})"))
    else:
        model = nn.Sequential(copy.deepcopy(base)).to(device, torch.bfloat16)
        convert_to_float8_training(model)
        out.append(("torchao Float8Linear (tensorwise, eager)", model, torch.bfloat16))
    return out


def fp8_linear_speed(sizes, device: torch.device | str, *, budget_s: float = 0.2) -> Fp8LinearSpeed:
    """Time forward + backward of a square linear layer in BF16 and in FP8 (the course's layer on
    ``torch._scaled_mm``, and torchao's when it imports), with :func:`course_lib.bench.time_function`."""
    from .bench import time_function

    device = torch.device(device)
    sizes = tuple(int(n) for n in sizes)
    if not sizes or any(n < 16 or n % 16 for n in sizes):
        raise ValueError(f"sizes must be multiples of 16 (FP8 matmuls need them), got {sizes}")
    seconds: dict[str, dict[int, float]] = {}
    skipped: dict[str, str] = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(n)
        x = torch.randn(n, n, generator=gen).to(device)
        grad = torch.randn(n, n, generator=gen).to(device)
        for entry in _linear_implementations(n, device):
            if len(entry) == 2:
                skipped[entry[0]] = entry[1]
                continue
            name, module, dtype = entry
            xi = x.to(dtype).requires_grad_(True)
            gi = grad.to(dtype)

            def step(module=module, xi=xi, gi=gi):
                out = module(xi)
                out.backward(gi.to(out.dtype))

            try:
                seconds.setdefault(name, {})[n] = time_function(step, device=device, budget_s=budget_s).median
            except (RuntimeError, ValueError) as exc:
                skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return Fp8LinearSpeed(str(device), sizes, seconds, skipped)
