"""FP8 casts and scaled FP8 tensors: the formats, saturating casts, block amax, amax-to-scale, and
:class:`Fp8Tensor` (codes plus one FP32 scale per block)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..formats import get_format

AMAX_FLOOR = 1e-12   # torchao's EPS: the smallest amax a scale is computed from


_CHUNK = 1 << 18     # elements per chunk when casting on a CPU: keeps the FP32 temporary in cache


def on_accelerator(device: torch.device | str) -> bool:
    """Whether FP8 casts on ``device`` run whole-tensor and without waiting on the host (any device but the
    CPU). A GPU runs one kernel per operation over the whole tensor: slicing it into ``_CHUNK`` pieces would
    launch hundreds of small kernels from a Python loop, and a finite check that reads a flag back to the host
    would stall every quantize. On the CPU, the cache-sized chunks are faster. Both give the same bits."""
    return torch.device(device).type != "cpu"


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

    The product is formed in FP32. On a CPU it goes in chunks, so a large tensor needs no FP32 temporary of
    its own size (allocating one costs more than the cast itself); on an accelerator in one pass (same bits)."""
    dtype, big = fp8_dtype(fmt), fp8_max(fmt)
    clamp_free = native_cast_saturates(fmt, x.device)
    if x.numel() <= _CHUNK or on_accelerator(x.device):
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


def cast_blocks(x2: torch.Tensor, scales: torch.Tensor, block: tuple[int, int], fmt: str) -> Fp8Tensor:
    """Cast a 2-D tensor with one scale per block: on a CPU a cache-sized slice of rows at a time, on an
    accelerator in one pass (see :func:`on_accelerator`)."""
    rows, cols = x2.shape
    br, bc = block
    if (br, bc) == (rows, cols):
        return Fp8Tensor(cast_saturating(x2, fmt, scales.reshape(())), scales, (br, bc), fmt)
    dtype, big = fp8_dtype(fmt), fp8_max(fmt)
    clamp_free = native_cast_saturates(fmt, x2.device)
    if rows * cols <= _CHUNK or on_accelerator(x2.device):
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


def as_2d(x: torch.Tensor, what: str = "x") -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{what} must be a torch tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{what} must be floating point, got {x.dtype}")
    if x.dim() == 0:
        return x.reshape(1, 1)
    if x.dim() == 1:
        return x.reshape(1, -1)
    # not -1: with a last dimension of 0 the row count would be ambiguous to reshape
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


NONFINITE_MESSAGE = ("the tensor holds inf or NaN: a scale computed from it would be 0 or NaN, and every value "
                     "would quantise to 0 or NaN (find the overflow first; lesson 9)")


def check_nonempty(x: torch.Tensor, who: str) -> None:
    """ValueError naming ``who`` (the public entry) for a tensor with no elements: it has no amax to scale
    from, and each recipe's reduction would fail with an error about its own internals instead."""
    if x.numel() == 0:
        raise ValueError(f"{who} needs a non-empty tensor, got shape {tuple(x.shape)}")


def nonfinite_error(source: torch.Tensor, message: str) -> ValueError:
    """The error for ``source`` whose FP32 amax is inf or NaN: ``message`` if it holds an inf or a NaN. A
    float64 tensor can hold neither and still have an FP32 amax of inf (a value beyond about 3.4e38): then
    the error says so. Called only once the check has failed, so the pass over ``source`` costs nothing on
    the way through."""
    if source.dtype == torch.float64 and source.numel() and bool(torch.isfinite(source).all()):
        largest = float(source.abs().max())
        return ValueError(f"the tensor holds values outside float32's range (largest magnitude {largest:.3g}) "
                          "but no inf or NaN: scales and casts work in FP32, where those values are inf; "
                          "scale the tensor into FP32's range (below about 3.4e38) first")
    return ValueError(message)


def check_finite_amax(amax: torch.Tensor, message: str = NONFINITE_MESSAGE, *,
                      source: torch.Tensor | None = None) -> None:
    """Refuse a tensor whose block amaxes show an inf or a NaN, with ``message`` (the caller's words for what
    a non-finite value means there). ``source``: the tensor the amaxes came from, when it may be float64,
    whose values beyond FP32's range give an amax of inf without holding one (see :func:`nonfinite_error`).

    On the CPU: ValueError, at once. On an accelerator (:func:`on_accelerator`) the check must not read a
    flag back to the host, which would wait for every kernel queued so far in each quantize: it is queued
    as ``torch._assert_async`` where this torch has it, and fails at a later synchronisation with a
    RuntimeError carrying the same message (on CUDA it also ends the process's CUDA context, as any device
    assertion does: an inf reaching an FP8 cast is a bug to find, not a state to recover from). A torch
    without it falls back to the synchronous check.

    The flag is ``max |amax| < inf`` (a NaN propagates through the max and compares false): three operations,
    where ``isfinite(amax).all()`` takes six (torch computes isfinite from four elementwise ones)."""
    if amax.numel() == 0:
        return
    finite = amax.abs().amax() < math.inf
    if on_accelerator(amax.device) and hasattr(torch, "_assert_async"):
        wide = source is not None and source.dtype == torch.float64
        # the queued message cannot look at the tensor, so it names both causes a float64 one may have
        torch._assert_async(finite, f"{message} (or, being float64, values beyond FP32's range)" if wide
                            else message)
        return
    if not bool(finite):
        raise nonfinite_error(source, message) if source is not None else ValueError(message)


def block_amax(x: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``max |x|`` over each ``block`` of a 2-D tensor, shape ``[rows / br, cols / bc]`` (FP32)."""
    rows, cols = x.shape
    br, bc = block
    if (br, bc) == (rows, cols):
        lo, hi = torch.aminmax(x)
        return torch.maximum(-lo, hi).float().reshape(1, 1)
    if rows * cols <= _CHUNK or on_accelerator(x.device):
        tiles = x.abs().reshape(rows // br, br, cols // bc, bc)
        return tiles.amax(dim=(1, 3)).float()    # one reduction over both block dimensions
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


def resolve_block(block: tuple[int, int], shape: tuple[int, ...]) -> tuple[int, int]:
    """A block with -1 meaning 'the whole dimension', checked to tile the shape exactly."""
    rows, cols = shape
    br = rows if block[0] == -1 else block[0]
    bc = cols if block[1] == -1 else block[1]
    if rows % br or cols % bc:
        raise ValueError(f"block {br} x {bc} does not tile a {rows} x {cols} tensor: each block dimension "
                         "must divide the tensor's (pad the tensor or choose a smaller block)")
    return br, bc


E4M3 = "FP8 E4M3"


E5M2 = "FP8 E5M2"
