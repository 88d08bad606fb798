"""Block-scaled tensors (OCP Microscaling and NVFP4): element formats, E8M0 scale selection (FLOOR, RCEIL,
CEIL, EVEN), :class:`BlockScaling` and :class:`BlockTensor`, FP4 packing, stochastic rounding and the
quantisation error of a block scaling."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..formats import (encode, get_format, narrow_format, native_cast_agrees, pow2, quantum32, round_magnitude32,
                       round_to_format, rounds_past_max)
from ..fp8 import QuantizationError, as_2d, block_amax, check_finite_amax, check_nonempty, resolve_block

MX_ELEMENTS = {"e4m3": "FP8 E4M3", "e5m2": "FP8 E5M2", "e2m3": "FP6 E2M3", "e3m2": "FP6 E3M2",
               "e2m1": "FP4 E2M1"}


SCALE_MODES = ("floor", "rceil", "ceil", "even")


SCALE_FORMATS = ("e8m0", "e4m3", "fp32")


E8M0_BIAS = 127


def element_format(name: str):
    """The :class:`~course_lib.formats.FloatFormat` of an MX element format name (``"e4m3"``, ``"e5m2"``,
    ``"e2m3"``, ``"e3m2"``, ``"e2m1"``; the registry's full names are accepted too)."""
    if not isinstance(name, str):
        raise TypeError(f"element format must be a name such as 'e2m1', got {type(name).__name__}")
    key = name.lower().replace(" ", "").replace("fp8", "").replace("fp6", "").replace("fp4", "").strip("_")
    if key not in MX_ELEMENTS:
        raise ValueError(f"unknown MX element format {name!r}; known: {', '.join(MX_ELEMENTS)}")
    return get_format(MX_ELEMENTS[key])


def element_key(name: str) -> str:
    fmt = element_format(name)
    return next(k for k, v in MX_ELEMENTS.items() if v == fmt.name)


def _floor_log2(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) for positive float32 ``a`` (subnormals included), exact, int64."""
    _, e = torch.frexp(a)   # a = m * 2**e with m in [0.5, 1)
    return e.to(torch.int64) - 1


def _ceil_log2(a: torch.Tensor) -> torch.Tensor:
    """ceil(log2(a)) for positive float32 ``a``, exact, int64."""
    m, e = torch.frexp(a)
    return e.to(torch.int64) - (m == 0.5).to(torch.int64)


def e8m0_exponents(amax: torch.Tensor, element: str, mode: str = "floor") -> torch.Tensor:
    """The unbiased E8M0 exponents (int64, in -127..127) an MX block with these ``amax`` values gets.

    ``amax``: non-negative finite float32 block maxima. A zero block gets -127, the smallest scale."""
    if mode not in SCALE_MODES:
        raise ValueError(f"unknown scale mode {mode!r}; known: {', '.join(SCALE_MODES)}")
    a = amax.to(torch.float32)
    if bool((a < 0).any()) or not bool(torch.isfinite(a).all()):
        raise ValueError("amax must be finite and non-negative")
    return _e8m0_exponents(a, element_format(element), mode)


def _e8m0_exponents(a: torch.Tensor, f, mode: str) -> torch.Tensor:
    emax = f.max_exponent
    positive = a > 0
    safe = torch.where(positive, a, torch.ones_like(a))
    if mode == "floor":
        e = _floor_log2(safe) - emax
    elif mode == "ceil":
        e = _ceil_log2(safe) - emax
    elif mode == "even":
        # round amax to the element's mantissa width, half up, by adding half a unit to its FP32 bits, and
        # read the binade off the exponent field. The carry out of FP32's top binade (amax at or above
        # (2 - 2**-(m+1)) * 2**127) makes exponent field 255, binade 128: the rounded amax is 2**128, its
        # floor(log2) 128, and the scale 2**(128 - emax), as torchao's EVEN gives (read as a float, the
        # field is inf, whose frexp exponent is 0). A subnormal amax has field 0, binade -127 (at most
        # its true one): the scale clamps to 2**-127 either way.
        bits = safe.view(torch.int32).to(torch.int64)
        e = ((bits + (1 << (23 - f.mantissa_bits - 1))) >> 23) - 127 - emax
    else:  # rceil: the FP32 quotient amax / max, rounded up to a power of two
        quotient = safe / f.max_finite
        # below about max * 2**-150 the quotient underflows to 0, whose frexp exponent is 0: it takes the
        # smallest scale, as log2(0) = -inf does in torchao and cvt.rp.satfinite.ue8m0 does on hardware
        e = torch.where(quotient > 0, _ceil_log2(torch.where(quotient > 0, quotient, 1.0)), -E8M0_BIAS)
    e = torch.where(positive, e, torch.full_like(e, -E8M0_BIAS))
    return e.clamp(-E8M0_BIAS, E8M0_BIAS)


def _pow2_f32(e: torch.Tensor) -> torch.Tensor:
    """Exact float32 ``2**e`` for int64 exponents in -127..127 (2**-127 is a float32 subnormal)."""
    return pow2(e.to(torch.int64)).to(torch.float32)


def _apply(x2: torch.Tensor, per_block: torch.Tensor, block: tuple[int, int], op) -> torch.Tensor:
    """``op(x, s)`` with ``s`` the value of each element's block (``per_block``: ``[rows/br, cols/bc]``),
    by broadcasting over a 4-D view (no expanded copy of the scales)."""
    rows, cols = x2.shape
    br, bc = block
    out = op(x2.reshape(rows // br, br, cols // bc, bc), per_block.reshape(rows // br, 1, cols // bc, 1))
    return out.reshape(rows, cols)


@dataclass(frozen=True)
class BlockScaling:
    """How to block-scale a tensor.

    ``element``: element format (see :data:`MX_ELEMENTS`). ``block``: elements per block along the last
    (reduction) dimension; ``block_rows``: rows per block (1: ``1 x block`` vectors; 16 with ``block=16``:
    NVFP4's 2-D weight blocks); -1 in either means the whole dimension. ``scale_format``: ``"e8m0"`` (MX:
    a power of two chosen by ``mode``), ``"e4m3"`` (NVFP4: ``amax / max_elem`` rounded to E4M3) or
    ``"fp32"`` (``amax / max_elem`` kept exact: the ideal scale, for comparison). ``tensor_scale``: put an
    FP32 per-tensor scale under E4M3 block scales (NVFP4). ``stochastic``: round elements stochastically
    (needs a generator at :meth:`quantize`).
    """

    element: str = "e4m3"
    block: int = 32
    block_rows: int = 1
    scale_format: str = "e8m0"
    mode: str = "floor"
    tensor_scale: bool = False
    stochastic: bool = False

    def __post_init__(self) -> None:
        element_format(self.element)
        for name in ("block", "block_rows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not (v == -1 or v >= 1):
                raise ValueError(f"{name} must be a positive int or -1 (the whole dimension), got {v!r}")
        if self.scale_format not in SCALE_FORMATS:
            raise ValueError(f"unknown scale format {self.scale_format!r}; known: {', '.join(SCALE_FORMATS)}")
        if self.mode not in SCALE_MODES:
            raise ValueError(f"unknown scale mode {self.mode!r}; known: {', '.join(SCALE_MODES)}")
        if self.tensor_scale and self.scale_format != "e4m3":
            raise ValueError("a per-tensor FP32 scale goes under E4M3 block scales (NVFP4) only")

    @property
    def label(self) -> str:
        shape = (f"{self.block_rows}x{self.block}" if self.block_rows != 1 else f"1x{self.block}").replace(
            "-1", "all")
        scale = {"e8m0": f"E8M0 {self.mode}", "e4m3": "E4M3" + (" + FP32 tensor" if self.tensor_scale else ""),
                 "fp32": "FP32"}[self.scale_format]
        return f"{element_key(self.element).upper()} {shape}, {scale} scale" + (", SR" if self.stochastic else "")

    def quantize(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> "BlockTensor":
        """Block-scale ``x`` (any rank, treated as 2-D ``[rows, last dim]``; FP32 arithmetic).

        Raises ValueError for inf/NaN in ``x`` or blocks that do not tile it, TypeError for a non-float
        ``x``, and ValueError when ``stochastic`` is set without a ``generator``.

        Nothing is read back to the host: the scales stay tensors, and on an accelerator
        (:func:`course_lib.fp8.casts.on_accelerator`) the checks of the values (inf/NaN, a tensor scale
        whose reciprocal overflows) are queued on the device by :func:`course_lib.fp8.check_finite_amax`
        and fail at a later synchronisation (RuntimeError), where on the CPU they raise ValueError at once."""
        given = as_2d(x, "x").detach()
        check_nonempty(x, "BlockScaling.quantize")
        x2 = given.float()
        rows, cols = x2.shape
        try:
            block = resolve_block((self.block_rows, self.block), (rows, cols))
        except ValueError:
            raise ValueError(
                f"blocks of {self.block_rows} x {self.block} do not tile a {rows} x {cols} tensor: the last "
                f"dimension ({cols}) must be a multiple of {self.block} (and the rows of {self.block_rows}); "
                f"pad it with zeros to {math.ceil(cols / max(self.block, 1)) * max(self.block, 1)} (zeros "
                "do not change a block's amax) or choose another block size") from None
        amax = block_amax(x2, block)
        check_finite_amax(amax, "the tensor holds inf or NaN: MX and NVFP4 have no way to scale it (an MX block "
                                "with a NaN gets the NaN scale, every element NaN); find the overflow first",
                          source=given)
        if self.stochastic and generator is None:
            raise ValueError("stochastic rounding needs a torch.Generator (generator=...)")
        f = element_format(self.element)
        big = f.max_finite
        tensor_scale = torch.ones((), device=x2.device)
        if self.scale_format == "e8m0":
            exps = _e8m0_exponents(amax, f, self.mode)
            block_scales = _pow2_f32(exps)
            scales = block_scales
            scaled = _apply(x2, scales, block, torch.div)
        elif self.scale_format == "e4m3":
            e4m3 = get_format("e4m3")
            raw = amax / big
            if self.tensor_scale:
                t_amax = amax.max()
                # an FP32 0-d tensor, never a Python float: reading it would wait for the device
                tensor_scale = torch.where(t_amax > 0, t_amax / (e4m3.max_finite * big), 1.0)
                raw = raw / tensor_scale
            # torchao/NVIDIA: clamp to E4M3's normal range, then round to E4M3 (nearest even)
            block_scales = raw.clamp(e4m3.min_normal, e4m3.max_finite).to(torch.float8_e4m3fn).float()
            if self.tensor_scale:
                inverse = 1.0 / tensor_scale
                check_finite_amax(inverse, "the tensor's largest magnitude is too small for an FP32 tensor "
                                           "scale: its reciprocal overflows FP32 and every element would be "
                                           "NaN; multiply the tensor by a power of two first")
                reciprocal = inverse / block_scales
                scales = tensor_scale * block_scales
            else:
                reciprocal = 1.0 / block_scales
                scales = block_scales
            scaled = _apply(x2, reciprocal, block, torch.mul)
        else:  # ideal FP32 scale
            block_scales = torch.where(amax > 0, amax / big, torch.ones_like(amax))
            scales = block_scales
            scaled = _apply(x2, scales, block, torch.div)
        unclamped = scaled      # finite (checked above); each branch saturates it at the format's max
        native = f.torch_dtype_or_none()
        elements: torch.Tensor
        if self.stochastic:
            assert generator is not None
            # finite already: stochastic_round's NaN check has nothing to find; it clamps the magnitudes
            _check_generator(generator, scaled.device)
            elements = _stochastic_round_unchecked(scaled, f, generator)
        elif native is not None and native_cast_agrees(f, "saturate", "nearest_even", x2.device):
            elements = scaled.clamp(-big, big).to(native).float()   # torch's FP8 cast rounds the same way
        elif narrow_format(f):
            # finite already: only the saturation and the rounding itself are left to do
            elements = round_magnitude32(scaled.abs().clamp_(max=big), f, "nearest_even").copysign_(scaled)
        else:  # pragma: no cover - every MX element format is narrow
            elements = torch.as_tensor(round_to_format(scaled, f, overflow="saturate"))
        return BlockTensor(elements.reshape(rows, cols), scales, block_scales, tensor_scale, block, self,
                           {"unclamped": unclamped})

    def round_trip(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> torch.Tensor:
        """``dequantize(quantize(x))`` in FP32, shaped like ``x``."""
        return self.quantize(x, generator=generator).dequantize().reshape(x.shape)


@dataclass(frozen=True)
class BlockTensor:
    """A block-scaled 2-D tensor: ``elements`` (FP32 holding values of the element format, ``[rows,
    cols]``) and ``scales`` (FP32 multipliers, one per block, ``[rows/br, cols/bc]``: the block scale times
    the tensor scale). Value of element ``(i, j)``: ``elements[i, j] * scales[i // br, j // bc]``.

    ``block_scales``: the stored per-block scales (E8M0 or E4M3 values, or FP32), ``tensor_scale``: the
    FP32 per-tensor scale, a 0-d tensor on the elements' device (1.0 when there is none; ``float()`` it to
    read it, which waits for the device)."""

    elements: torch.Tensor
    scales: torch.Tensor
    block_scales: torch.Tensor
    tensor_scale: torch.Tensor
    block: tuple[int, int]
    scaling: BlockScaling
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def saturated(self) -> int:
        """How many elements the clamp changed: scaled values that round past the format's max
        (:func:`course_lib.formats.overflow_boundary`; the block's own amax, landing on max give or take a
        rounding of its scale, does not count)."""
        if "saturated" not in self._cache:
            f = element_format(self.scaling.element)
            self._cache["saturated"] = int(rounds_past_max(self._cache.pop("unclamped").abs(), f).sum())
        return self._cache["saturated"]

    def dequantize(self) -> torch.Tensor:
        """The represented values in FP32 (element times its block's scale, one FP32 product)."""
        if "values" not in self._cache:
            self._cache["values"] = _apply(self.elements, self.scales, self.block, torch.mul)
        return self._cache["values"]

    def scale_codes(self) -> torch.Tensor:
        """The block scales in their storage dtype: ``torch.float8_e8m0fnu`` (MX) or ``float8_e4m3fn``
        (NVFP4); FP32 scales are returned as they are."""
        fmt = self.scaling.scale_format
        if fmt == "e8m0":
            exps = _floor_log2(self.block_scales.clamp(min=2.0**-127))   # exact powers of two
            return (exps + E8M0_BIAS).to(torch.uint8).view(torch.float8_e8m0fnu)
        if fmt == "e4m3":
            return self.block_scales.to(torch.float8_e4m3fn)
        return self.block_scales

    def element_codes(self) -> torch.Tensor:
        """The element bit patterns (int64) in the element format."""
        codes = encode(self.elements, element_format(self.scaling.element))
        assert isinstance(codes, torch.Tensor)
        return codes

    @property
    def storage_bits_per_element(self) -> float:
        """Bits per element including the block scales (the per-tensor scale amortised away)."""
        f = element_format(self.scaling.element)
        scale_bits = {"e8m0": 8, "e4m3": 8, "fp32": 32}[self.scaling.scale_format]
        return f.bits + scale_bits / (self.block[0] * self.block[1])


def pack_fp4(codes: torch.Tensor) -> torch.Tensor:
    """Pack E2M1 codes (integers 0..15, last dimension even) two per byte as ``torch.float4_e2m1fn_x2``
    (or ``uint8`` where torch lacks that dtype): element ``2k`` in the low nibble, ``2k+1`` in the high."""
    if codes.dtype.is_floating_point or codes.dtype == torch.bool:
        raise TypeError(f"pack_fp4 takes integer codes 0..15, got dtype {codes.dtype}")
    if codes.dim() == 0 or codes.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even to pack two codes per byte, got {tuple(codes.shape)}")
    if bool((codes < 0).any()) or bool((codes > 15).any()):
        raise ValueError("FP4 codes must lie in 0..15")
    c = codes.to(torch.uint8)
    packed = c[..., 0::2] | (c[..., 1::2] << 4)
    dtype = getattr(torch, "float4_e2m1fn_x2", None)
    return packed.view(dtype) if dtype is not None else packed


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_fp4`: int64 codes, last dimension doubled."""
    raw = packed.view(torch.uint8) if packed.dtype != torch.uint8 else packed
    low, high = (raw & 0xF).to(torch.int64), (raw >> 4).to(torch.int64)
    return torch.stack([low, high], dim=-1).reshape(*raw.shape[:-1], raw.shape[-1] * 2)


def block_error(x: torch.Tensor, scaling: BlockScaling, *, label: str | None = None,
                skip_columns: tuple[int, ...] = ()) -> QuantizationError:
    """Quantise ``x`` with ``scaling`` and measure the damage (relative L2 error, share saturated, share of
    non-zero values flushed to zero, effective bits), as :func:`course_lib.fp8.quantization_error` does.
    ``skip_columns``: columns quantised with the rest but left out of the error and flushed share (to see
    what an outlier channel does to the *other* values)."""
    x2 = as_2d(x, "x").detach()
    gen = torch.Generator(device=x2.device).manual_seed(0) if scaling.stochastic else None
    q = scaling.quantize(x2, generator=gen)     # before the FP32 copy: a float64 value beyond FP32's range is no inf
    x2 = x2.float()
    back = q.dequantize()
    if skip_columns:
        keep = torch.ones(x2.shape[1], dtype=torch.bool, device=x2.device)
        keep[list(skip_columns)] = False
        x2, back = x2[:, keep], back[:, keep]
    # in float64: FP32 squares overflow above about 1.8e19 and vanish below about 1e-23
    norm = float(torch.linalg.vector_norm(x2.double()))
    rel = float(torch.linalg.vector_norm(back.double() - x2.double())) / norm if norm > 0 else 0.0
    nonzero = x2 != 0
    flushed = float(((back == 0) & nonzero).sum()) / max(1, int(nonzero.sum()))
    return QuantizationError(label or scaling.label, rel, q.saturated / q.elements.numel(), flushed,
                             -math.log2(rel) if rel > 0 else math.inf, x2.numel())


def stochastic_round(x: torch.Tensor, element: str, *, generator: torch.Generator) -> torch.Tensor:
    """Round each value of ``x`` (FP32, already scaled into the element range) to one of its two neighbours
    in the element format, up with probability equal to its distance from the lower one over the gap: the
    expected result is ``x`` itself (unbiased). Values beyond the format's max (infinities too) saturate to
    it; NaN raises ``ValueError`` for an element format without NaN (FP6, FP4) on the CPU, and on an
    accelerator fails at a later synchronisation (:func:`course_lib.fp8.check_finite_amax`: no host read)."""
    _check_generator(generator, x.device)
    f = element_format(element)
    if not f.has_nan:
        # |x| clamped to the max is finite exactly where x is not NaN (infinities saturate)
        check_finite_amax(x.float().abs().clamp(max=f.max_finite),
                          f"{f.name} has no NaN: cannot round NaN into it; find where it comes from first")
    return _stochastic_round_unchecked(x, f, generator)


def _check_generator(generator, device: torch.device) -> None:
    if not isinstance(generator, torch.Generator):
        raise TypeError("stochastic_round needs a torch.Generator")
    if torch.device(generator.device) != device:
        # drawing on one device and copying to another is slow (the host draws every bit of a GPU tensor)
        raise ValueError(f"the generator is on {generator.device} but the tensor on {device}: draw on the "
                         f"tensor's device, torch.Generator(device={str(device)!r}).manual_seed(seed)")


def _stochastic_round_unchecked(x: torch.Tensor, f, generator: torch.Generator) -> torch.Tensor:
    """:func:`stochastic_round` of ``x`` (NaN-free) into the narrow format ``f``, without its checks.

    In units of the grid's spacing at each value (a power of two, so every step is exact) the value is
    ``t``, its lower neighbour ``trunc(t)``, and it moves up one unit when a uniform draw ``u`` is below the
    fraction ``t - trunc(t)``: with that probability. Up by one unit is the next grid value even at the top
    of a binade (the binade above starts there)."""
    a = x.float().abs().clamp_(max=f.max_finite)
    quantum = quantum32(a, f)
    t = a.div_(quantum)
    lo = t.trunc()
    u = torch.rand(t.shape, generator=generator, device=x.device)
    up = torch.lt(u, t.sub_(lo), out=u)      # 1.0 or 0.0 in place: adding a bool tensor would convert it first
    return lo.add_(up).mul_(quantum).copysign_(x)
