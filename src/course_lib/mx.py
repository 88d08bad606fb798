"""Microscaling: block-scaled formats (MXFP8, MXFP6, MXFP4, NVFP4) emulated exactly, and training with them.

A *block-scaled* tensor stores narrow elements and one scale per small block of them; the value of an
element is ``element * scale`` (the OCP Microscaling spec's ``X * P_i``). This module implements

* **MX** (OCP Microscaling Formats spec v1.0): blocks of 32 along the reduction dimension, an E8M0 scale
  (a power of two, 2**-127 .. 2**127) per block, elements in FP8 E4M3 / E5M2, FP6 E2M3 / E3M2 or FP4 E2M1.
  The scale's exponent is chosen by one of four modes (torchao's ``ScaleCalculationMode``):

  - ``"floor"``: the spec's ``floor(log2(amax)) - emax_elem``. The block's largest element lands in
    ``[2**emax, 2**(emax+1))`` and *saturates* when that is above the element format's max (E4M3: 448 in
    [256, 512); E2M1: 6 in [4, 8)).
  - ``"rceil"``: ``ceil(log2(amax / max_elem))`` with the quotient in FP32 (NVIDIA's hardware rule, the
    ``cvt.rp.satfinite.ue8m0`` instruction; Transformer Engine and cuBLAS): never saturates.
  - ``"ceil"``: ``ceil(log2(amax)) - emax_elem``: never saturates, but can waste most of the top binade.
  - ``"even"``: ``floor`` after rounding ``amax`` to the element format's mantissa width (half up).

* **NVFP4** (NVIDIA, 2025): E2M1 elements in blocks of 16, an E4M3 scale per block and an FP32 scale per
  tensor: ``tensor_scale = amax / (448 * 6)``; ``block_scale = E4M3(block_amax / 6 / tensor_scale)``,
  clamped to E4M3's normal range ``[2**-6, 448]``; elements ``E2M1(x / (tensor_scale * block_scale))``.
  The arithmetic follows torchao's reference (``nvfp4_quantize``) operation by operation, so the codes
  agree bit for bit. 16 x 16 blocks (``block_rows=16``) for weights make a weight and its transpose
  quantise identically.

* The NVFP4 *training recipe*'s pieces, each switchable (:class:`BlockRecipe`): stochastic rounding of
  gradients (:func:`stochastic_round`), a random Hadamard transform (:func:`random_hadamard`) on both
  inputs of the weight-gradient product, 2-D weight blocks, and the last block(s) kept in high precision.

* Storage: element codes packed two per byte in ``torch.float4_e2m1fn_x2`` (first element in the low
  nibble, as PyTorch's header and torchao's ``pack_uint4`` define it), and scales in
  ``torch.float8_e8m0fnu`` / ``torch.float8_e4m3fn`` (:meth:`BlockTensor.scale_codes`, :func:`pack_fp4`).

Known differences from torchao (``tests/test_mx.py`` checks everything else bit for bit): for a block
whose E8M0 exponent clamps to -127 (``amax`` below about 2**-119 for E4M3), torchao divides by 2**-126
("floor" modes) or by 1.0 ("rceil") where this module divides by the scale itself, 2**-127. Only blocks
of values below about 1e-35 are affected.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from .formats import _narrow, _native_cast_agrees, _pow2, _round_magnitude32, encode, get_format, round_to_format
from .fp8 import QuantizationError, QuantizedLinear, _as_2d, _resolve_block, block_amax, replace_linears

MX_ELEMENTS = {"e4m3": "FP8 E4M3", "e5m2": "FP8 E5M2", "e2m3": "FP6 E2M3", "e3m2": "FP6 E3M2",
               "e2m1": "FP4 E2M1"}
SCALE_MODES = ("floor", "rceil", "ceil", "even")
SCALE_FORMATS = ("e8m0", "e4m3", "fp32")
E8M0_BIAS = 127
HADAMARD_SIZE = 16


def element_format(name: str):
    """The :class:`~course_lib.formats.FloatFormat` of an MX element format name (``"e4m3"``, ``"e5m2"``,
    ``"e2m3"``, ``"e3m2"``, ``"e2m1"``; the registry's full names are accepted too)."""
    if not isinstance(name, str):
        raise TypeError(f"element format must be a name such as 'e2m1', got {type(name).__name__}")
    key = name.lower().replace(" ", "").replace("fp8", "").replace("fp6", "").replace("fp4", "").strip("_")
    if key not in MX_ELEMENTS:
        raise ValueError(f"unknown MX element format {name!r}; known: {', '.join(MX_ELEMENTS)}")
    return get_format(MX_ELEMENTS[key])


def _elem_key(name: str) -> str:
    fmt = element_format(name)
    return next(k for k, v in MX_ELEMENTS.items() if v == fmt.name)


# ---- scales -----------------------------------------------------------------------------------------

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
        # round amax to the element's mantissa width, half up, by adding half a unit to its FP32 bits
        bits = safe.view(torch.int32)
        rounded = ((bits + (1 << (23 - f.mantissa_bits - 1))) & 0x7F800000).view(torch.float32)
        e = _floor_log2(torch.where(rounded > 0, rounded, safe)) - emax
    else:  # rceil: the FP32 quotient amax / max, rounded up to a power of two
        e = _ceil_log2(safe / f.max_finite)
    e = torch.where(positive, e, torch.full_like(e, -E8M0_BIAS))
    return e.clamp(-E8M0_BIAS, E8M0_BIAS)


def _pow2_f32(e: torch.Tensor) -> torch.Tensor:
    """Exact float32 ``2**e`` for int64 exponents in -127..127 (2**-127 is a float32 subnormal)."""
    return _pow2(e.to(torch.int64)).to(torch.float32)


# ---- block-scaled tensors ---------------------------------------------------------------------------

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
        return f"{_elem_key(self.element).upper()} {shape}, {scale} scale" + (", SR" if self.stochastic else "")

    def quantize(self, x: torch.Tensor, *, generator: torch.Generator | None = None) -> "BlockTensor":
        """Block-scale ``x`` (any rank, treated as 2-D ``[rows, last dim]``; FP32 arithmetic).

        Raises ValueError for inf/NaN in ``x`` or blocks that do not tile it, TypeError for a non-float
        ``x``, and ValueError when ``stochastic`` is set without a ``generator``."""
        x2 = _as_2d(x, "x").detach().float()
        rows, cols = x2.shape
        try:
            block = _resolve_block((self.block_rows, self.block), (rows, cols))
        except ValueError:
            raise ValueError(
                f"blocks of {self.block_rows} x {self.block} do not tile a {rows} x {cols} tensor: the last "
                f"dimension ({cols}) must be a multiple of {self.block} (and the rows of {self.block_rows}); "
                f"pad it with zeros to {math.ceil(cols / max(self.block, 1)) * max(self.block, 1)} (zeros "
                "do not change a block's amax) or choose another block size") from None
        amax = block_amax(x2, block)
        if not bool(torch.isfinite(amax).all()):
            raise ValueError("the tensor holds inf or NaN: MX and NVFP4 have no way to scale it (an MX block "
                             "with a NaN gets the NaN scale, every element NaN); find the overflow first")
        if self.stochastic and generator is None:
            raise ValueError("stochastic rounding needs a torch.Generator (generator=...)")
        f = element_format(self.element)
        big = f.max_finite
        tensor_scale = 1.0
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
                ts = (t_amax / (e4m3.max_finite * big)) if float(t_amax) > 0 else torch.ones((), device=x2.device)
                raw = raw / ts
                tensor_scale = float(ts)
            # torchao/NVIDIA: clamp to E4M3's normal range, then round to E4M3 (nearest even)
            block_scales = raw.clamp(e4m3.min_normal, e4m3.max_finite).to(torch.float8_e4m3fn).float()
            if self.tensor_scale:
                ts32 = torch.tensor(tensor_scale, dtype=torch.float32, device=x2.device)
                reciprocal = (1.0 / ts32) / block_scales
                scales = ts32 * block_scales
            else:
                reciprocal = 1.0 / block_scales
                scales = block_scales
            scaled = _apply(x2, reciprocal, block, torch.mul)
        else:  # ideal FP32 scale
            block_scales = torch.where(amax > 0, amax / big, torch.ones_like(amax))
            scales = block_scales
            scaled = _apply(x2, scales, block, torch.div)
        unclamped = scaled
        scaled = scaled.clamp(-big, big)
        native = f.torch_dtype_or_none()
        elements: torch.Tensor
        if self.stochastic:
            assert generator is not None
            elements = stochastic_round(scaled, self.element, generator=generator)
        elif native is not None and _native_cast_agrees(f, "saturate", "nearest_even", x2.device):
            elements = scaled.to(native).float()   # torch's FP8 cast rounds the same way
        elif _narrow(f):
            # finite and clamped already: only the rounding itself is left to do
            elements = _round_magnitude32(scaled.abs(), f, "nearest_even").copysign_(scaled)
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
    FP32 per-tensor scale (1.0 when there is none)."""

    elements: torch.Tensor
    scales: torch.Tensor
    block_scales: torch.Tensor
    tensor_scale: float
    block: tuple[int, int]
    scaling: BlockScaling
    _cache: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def saturated(self) -> int:
        """How many elements the clamp changed: scaled beyond the format's max plus half its top spacing
        (the block's own amax, landing on max give or take a rounding of its scale, does not count)."""
        if "saturated" not in self._cache:
            f = element_format(self.scaling.element)
            boundary = f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
            self._cache["saturated"] = int((self._cache.pop("unclamped").abs() >= boundary).sum())
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


# ---- the NVFP4 recipe's pieces ------------------------------------------------------------------------

def stochastic_round(x: torch.Tensor, element: str, *, generator: torch.Generator) -> torch.Tensor:
    """Round each value of ``x`` (FP32, already scaled into the element range) to one of its two neighbours
    in the element format, up with probability equal to its distance from the lower one over the gap: the
    expected result is ``x`` itself (unbiased). Values beyond the format's max saturate to it."""
    if not isinstance(generator, torch.Generator):
        raise TypeError("stochastic_round needs a torch.Generator")
    f = element_format(element)
    a = x.float().abs().clamp(max=f.max_finite)
    lo = _round_magnitude32(a, f, "toward_zero")          # the neighbour at or below, on the grid
    binade = (lo.view(torch.int32) >> 23) - 127
    ulp = ((binade.clamp(min=f.min_exponent) - f.mantissa_bits + 127) << 23).view(torch.float32)
    u = torch.rand(a.shape, generator=generator, device=generator.device).to(x.device)
    # up by one spacing with probability (a - lo) / spacing; a value on the grid never moves
    out = torch.where(u * ulp < a - lo, lo + ulp, lo)
    return torch.copysign(out, x.float())


def hadamard_matrix(n: int = HADAMARD_SIZE, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The orthonormal Sylvester-Hadamard matrix of order ``n`` (a power of two) on ``device`` (default the
    CPU): entries ±1/sqrt(n), symmetric, ``H @ H == I`` (exact in FP32 for n = 16: entries ±0.25)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard order must be a power of two, got {n!r}")
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def random_signs(n: int = HADAMARD_SIZE, seed: int = 0) -> torch.Tensor:
    """``n`` fixed random signs (±1, FP32) from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1


def random_hadamard(x: torch.Tensor, signs: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """The random Hadamard transform along the last dimension of ``x``, in independent groups of
    ``len(signs)``: each group ``v`` becomes ``v @ diag(signs) @ H`` (``inverse``: ``v @ H @ diag(signs)``).
    Orthogonal, so applied to both inputs of a product that reduces over this dimension it leaves the
    product unchanged, while it spreads an outlier over its group before quantisation."""
    n = signs.numel()
    if x.shape[-1] % n:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must be a multiple of the transform size {n}")
    signs = signs.to(device=x.device, dtype=torch.float32)
    m = torch.diag(signs) @ hadamard_matrix(n, device=x.device)
    if inverse:
        m = m.t()
    groups = x.float().reshape(*x.shape[:-1], x.shape[-1] // n, n)
    return (groups @ m).reshape(x.shape)


# ---- block-scaled linear layers ----------------------------------------------------------------------

@dataclass(frozen=True)
class BlockRecipe:
    """A block-scaled training recipe: how each operand of a linear layer's three products is scaled.

    ``activation``, ``weight``, ``gradient``: the :class:`BlockScaling` of each (blocks along the
    reduction dimension of each product). ``hadamard``: random Hadamard transform of both inputs of the
    weight-gradient product. ``stochastic_gradients``: round gradients stochastically. ``high_precision_last``:
    how many of the model's last transformer blocks keep their linear layers in high precision.
    """

    name: str
    activation: BlockScaling
    weight: BlockScaling
    gradient: BlockScaling
    hadamard: bool = False
    stochastic_gradients: bool = False
    high_precision_last: int = 0


def _mx(element: str, mode: str = "rceil") -> BlockScaling:
    return BlockScaling(element, 32, scale_format="e8m0", mode=mode)


def _nvfp4(block_rows: int = 1) -> BlockScaling:
    return BlockScaling("e2m1", 16, block_rows=block_rows, scale_format="e4m3", tensor_scale=True)


def block_recipe(name: str) -> BlockRecipe:
    """A training recipe by name:

    * ``"mxfp8"``: E4M3 everywhere, 1 x 32 blocks, E8M0 scales (RCEIL, as NVIDIA's hardware);
    * ``"mxfp4"``: E2M1 everywhere, 1 x 32 blocks, E8M0 scales (RCEIL), no other help;
    * ``"mxfp4_hp_last"``: MXFP4 with the last block in high precision (the control for NVFP4's choice);
    * ``"nvfp4"``: NVIDIA's NVFP4 recipe: 1 x 16 blocks for activations and gradients, 16 x 16 for weights,
      stochastic rounding of gradients, random Hadamard transform on the weight-gradient inputs, the last
      block in high precision;
    * ``"nvfp4_no_sr"``, ``"nvfp4_no_rht"``, ``"nvfp4_no_2d"``, ``"nvfp4_no_hp_last"``: the NVFP4 recipe with
      one piece removed.
    """
    if name == "mxfp8":
        return BlockRecipe(name, _mx("e4m3"), _mx("e4m3"), _mx("e4m3"))
    if name == "mxfp4":
        return BlockRecipe(name, _mx("e2m1"), _mx("e2m1"), _mx("e2m1"))
    if name == "mxfp4_hp_last":
        return BlockRecipe(name, _mx("e2m1"), _mx("e2m1"), _mx("e2m1"), high_precision_last=1)
    full = BlockRecipe("nvfp4", _nvfp4(), _nvfp4(16), _nvfp4(), hadamard=True, stochastic_gradients=True,
                       high_precision_last=1)
    if name == "nvfp4":
        return full
    if name == "nvfp4_no_sr":
        return replace(full, name=name, stochastic_gradients=False)
    if name == "nvfp4_no_rht":
        return replace(full, name=name, hadamard=False)
    if name == "nvfp4_no_2d":
        return replace(full, name=name, weight=_nvfp4(1))
    if name == "nvfp4_no_hp_last":
        return replace(full, name=name, high_precision_last=0)
    raise ValueError(f"unknown block-scaled recipe {name!r}; known: {', '.join(BLOCK_RECIPES)}")


BLOCK_RECIPES = ("mxfp8", "mxfp4", "mxfp4_hp_last", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht", "nvfp4_no_2d", "nvfp4_no_hp_last")


class _BlockLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, layer: "BlockLinear"):
        r = layer.recipe
        xq = r.activation.quantize(x2).dequantize()
        wq = r.weight.quantize(weight)
        ctx.layer, ctx.wq = layer, wq
        ctx.save_for_backward(x2, weight)
        return xq @ wq.dequantize().t()

    @staticmethod
    def backward(ctx, grad_out):
        x2, weight = ctx.saved_tensors
        layer: BlockLinear = ctx.layer
        r = layer.recipe
        g = grad_out.float()
        grad_scaling = replace(r.gradient, stochastic=r.stochastic_gradients)
        gen = layer.generator if r.stochastic_gradients else None
        # grad_x = g @ w reduces over the output features: g along its rows, w along its columns
        gq = grad_scaling.quantize(g, generator=gen).dequantize()
        if r.weight.block_rows == r.weight.block:
            w_cols = ctx.wq.dequantize()          # square 2-D blocks: the transpose quantises the same way
        else:
            w_cols = r.weight.quantize(weight.t().contiguous()).dequantize().t()
        grad_x = gq @ w_cols
        # grad_w = g.T @ x reduces over the tokens: both along the token dimension
        g_t, x_t = g.t().contiguous(), x2.t().contiguous()
        if r.hadamard:
            g_t, x_t = random_hadamard(g_t, layer.signs), random_hadamard(x_t, layer.signs)
        gq_t = grad_scaling.quantize(g_t, generator=gen).dequantize()
        xq_t = r.activation.quantize(x_t).dequantize()
        grad_w = gq_t @ xq_t.t()
        return grad_x.to(x2.dtype), grad_w.to(weight.dtype), None


class BlockLinear(QuantizedLinear):
    """A drop-in ``nn.Linear`` whose three products take block-scaled operands (exact emulation: the
    operands are quantised and dequantised, the product runs in FP32 as a block-scaled tensor core
    accumulates). Weights stay in FP32 (the master copy); the bias is added in FP32."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: str = "nvfp4",
                 seed: int = 0):
        super().__init__(in_features, out_features, bias)
        self.recipe = block_recipe(recipe)
        self.generator = torch.Generator().manual_seed(seed)
        self.register_buffer("signs", random_signs(HADAMARD_SIZE, seed), persistent=False)

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        return _BlockLinearFunction.apply(x2, self.weight, self)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, recipe={self.recipe.name!r}"


def convert_to_block_scaled(model: nn.Module, recipe: str = "nvfp4", *, seed: int = 0,
                            skip: tuple[str, ...] = ("head",)) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` (in place) by :class:`BlockLinear` ones, except those
    named in ``skip`` (default: the output head) and, where the recipe keeps the last
    ``high_precision_last`` transformer blocks in high precision, those blocks' layers. Returns ``model``."""
    r = block_recipe(recipe)
    n_blocks = len(getattr(model, "blocks", []))
    keep = tuple(f"blocks.{i}" for i in range(max(0, n_blocks - r.high_precision_last), n_blocks))
    return replace_linears(model, lambda linear, index: BlockLinear.from_linear(
        linear, recipe=recipe, seed=seed * 1000 + index), skip=skip, keep_prefixes=keep)


# ---- experiments --------------------------------------------------------------------------------------

def block_error(x: torch.Tensor, scaling: BlockScaling, *, label: str | None = None,
                skip_columns: tuple[int, ...] = ()) -> QuantizationError:
    """Quantise ``x`` with ``scaling`` and measure the damage (relative L2 error, share saturated, share of
    non-zero values flushed to zero, effective bits), as :func:`course_lib.fp8.quantization_error` does.
    ``skip_columns``: columns quantised with the rest but left out of the error and flushed share (to see
    what an outlier channel does to the *other* values)."""
    x2 = _as_2d(x, "x").detach().float()
    q = scaling.quantize(x2, generator=torch.Generator().manual_seed(0) if scaling.stochastic else None)
    back = q.dequantize()
    if skip_columns:
        keep = torch.ones(x2.shape[1], dtype=torch.bool, device=x2.device)
        keep[list(skip_columns)] = False
        x2, back = x2[:, keep], back[:, keep]
    norm = float(torch.linalg.vector_norm(x2))
    rel = float(torch.linalg.vector_norm(back - x2)) / norm if norm > 0 else 0.0
    nonzero = x2 != 0
    flushed = float(((back == 0) & nonzero).sum()) / max(1, int(nonzero.sum()))
    return QuantizationError(label or scaling.label, rel, q.saturated / q.elements.numel(), flushed,
                             -math.log2(rel) if rel > 0 else math.inf, x2.numel())


@dataclass(frozen=True)
class BlockSizeStudy:
    """``errors[element][tensor][block]``: the :class:`QuantizationError` of E8M0-scaled blocks of each size
    (``"tensor"``: one scale for the whole tensor) on each tensor, for each scale mode."""

    elements: tuple[str, ...]
    tensors: tuple[str, ...]
    blocks: tuple[str, ...]
    mode: str
    errors: dict[str, dict[str, dict[str, QuantizationError]]]


def block_size_study(tensors: dict[str, torch.Tensor], *, elements=("e4m3", "e2m1"), blocks=(1, 16, 32, 64, -1),
                     mode: str = "rceil", skip_columns: dict[str, tuple[int, ...]] | None = None) -> BlockSizeStudy:
    """Relative error, saturation and flushing of MX quantisation (E8M0 scales, ``mode``) against the block
    size along the last dimension (``-1``: one scale for the whole tensor). ``skip_columns[name]``: columns
    of that tensor left out of its measures (see :func:`block_error`)."""
    skip_columns = skip_columns or {}
    if not tensors or not elements or not blocks:
        raise ValueError("block_size_study needs tensors, element formats and block sizes")
    labels = tuple("tensor" if b == -1 else str(b) for b in blocks)
    errors: dict[str, dict[str, dict[str, QuantizationError]]] = {}
    for element in elements:
        errors[element] = {}
        for t, x in tensors.items():
            errors[element][t] = {}
            for b, lab in zip(blocks, labels):
                scaling = BlockScaling(element, b, block_rows=-1 if b == -1 else 1, mode=mode)
                errors[element][t][lab] = block_error(x, scaling, label=lab, skip_columns=skip_columns.get(t, ()))
    return BlockSizeStudy(tuple(elements), tuple(tensors), labels, mode, errors)


def nvfp4_scale_choices() -> dict[str, BlockScaling]:
    """The FP4 block-scale choices the lesson compares, by display name."""
    return {
        "MXFP4: 1x32, E8M0 scale": BlockScaling("e2m1", 32, scale_format="e8m0", mode="rceil"),
        "1x16, E8M0 scale": BlockScaling("e2m1", 16, scale_format="e8m0", mode="rceil"),
        "1x16, E4M3 scale, no tensor scale": BlockScaling("e2m1", 16, scale_format="e4m3"),
        "NVFP4: 1x16, E4M3 scale + FP32 tensor scale": BlockScaling("e2m1", 16, scale_format="e4m3",
                                                                    tensor_scale=True),
        "1x16, exact FP32 scale (ideal)": BlockScaling("e2m1", 16, scale_format="fp32"),
    }


@dataclass(frozen=True)
class ModeComparison:
    """FLOOR against RCEIL scale selection on one tensor and element format: per mode the error, share of
    elements saturated and ``top_saturated``, the share of *all* blocks whose largest value the clamp changed
    (it scaled to at least max plus half the top spacing); ``examples``: a few blocks where the two modes
    choose different scales (amax, each mode's exponent and each mode's largest element)."""

    element: str
    block: int
    blocks_differ: float
    errors: dict[str, QuantizationError]
    top_saturated: dict[str, float]
    examples: tuple[dict[str, float], ...]


def compare_scale_modes(x: torch.Tensor, *, element: str = "e2m1", block: int = 32,
                        modes=("floor", "rceil"), n_examples: int = 4) -> ModeComparison:
    """Quantise ``x`` with each E8M0 scale ``mode`` and compare, block by block."""
    if len(modes) < 2:
        raise ValueError("compare_scale_modes needs two modes")
    x2 = _as_2d(x, "x").detach().float()
    f = element_format(element)
    amax = block_amax(x2, _resolve_block((1, block), tuple(x2.shape)))
    exps = {m: e8m0_exponents(amax, element, m) for m in modes}
    differ = exps[modes[0]] != exps[modes[1]]
    errors, top_sat, largest = {}, {}, {}
    for m in modes:
        scaling = BlockScaling(element, block, scale_format="e8m0", mode=m)
        errors[m] = block_error(x2, scaling, label=m)
        q = scaling.quantize(x2)
        # the element holding each block's amax, as stored (its magnitude)
        top = q.elements.abs().reshape(x2.shape[0], -1, block).amax(-1)
        largest[m] = top
        # the clamp changed the block's largest value: it scaled beyond max plus half the top spacing (below
        # that it rounds to max anyway)
        boundary = f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
        top_sat[m] = float(((amax / q.scales) >= boundary).float().mean())
    idx = torch.nonzero(differ.reshape(-1)).reshape(-1)[:n_examples]
    examples = []
    for i in idx.tolist():
        row = {"amax": float(amax.reshape(-1)[i])}
        for m in modes:
            row[f"{m} exponent"] = int(exps[m].reshape(-1)[i])
            row[f"{m} largest element"] = float(largest[m].reshape(-1)[i])
            row[f"{m} amax / scale"] = float(amax.reshape(-1)[i] / 2.0 ** int(exps[m].reshape(-1)[i]))
        examples.append(row)
    return ModeComparison(_elem_key(element), block, float(differ.float().mean()), errors, top_sat,
                          tuple(examples))


def train_block_scaled(recipe: str, profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                       seed: int = 0, lr: float = 3e-3):
    """Train the course GPT with block-scaled linear layers (``recipe``, see :func:`block_recipe`; every other
    op and the weights in FP32) or with a plain precision recipe of :mod:`course_lib.train`
    (``"bf16_autocast"``, ...). Same batches and initial weights for the same seed. Returns the History."""
    from .models import course_setup
    from .train import RECIPES, TrainConfig, TrainState, get_recipe, train

    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(40, 1000), seed=seed)
    model = setup.model(seed)
    if recipe in RECIPES:
        precision = get_recipe(recipe, device)
    else:
        convert_to_block_scaled(model, recipe, seed=seed)
        precision = get_recipe("fp32", device)
    state = TrainState(model, precision, TrainConfig(steps=setup.steps, lr=lr), device)
    return train(state, setup.sampler)


def block_scaled_training(profile, device: torch.device | str = "cpu", *,
                          recipes=("bf16_autocast", "mxfp8", "mxfp4", "nvfp4"), seeds=(0, 1, 2),
                          steps: int | None = None, lr: float = 3e-3):
    """Loss curves of :func:`train_block_scaled` per recipe and seed, as a
    :class:`course_lib.fp8.Fp8Training` (``block``: NVFP4's 16)."""
    from .fp8 import Fp8Training, seeded_curves

    if not recipes or not seeds:
        raise ValueError("block_scaled_training needs at least one recipe and one seed")
    for r in recipes:
        from .train import RECIPES
        if r not in RECIPES:
            block_recipe(r)
    curves, n_steps = seeded_curves(lambda recipe, seed: train_block_scaled(recipe, profile, device, steps=steps,
                                                                            seed=seed, lr=lr), recipes, seeds)
    return Fp8Training(tuple(recipes), tuple(seeds), n_steps, 16, curves)


@dataclass(frozen=True)
class GradientFidelity:
    """How far each recipe's gradient of the course model is from the exact FP32 gradient at the same
    weights and batch (relative L2 error over all parameters), on ``batches`` batches.

    ``single[recipe][b]``: on batch ``b``, the mean error of one gradient (of ``draws`` independent ones;
    they differ only where a recipe rounds stochastically). ``averaged[recipe][i]``: the error of the mean
    of ``ks[i]`` draws (over the disjoint groups of that many, and over batches; ``ks[0]`` = 1 equals the mean
    of ``single``): it falls like ``1/sqrt(k)`` for the part of the error
    that stochastic rounding makes unbiased, and levels off at the rest."""

    recipes: tuple[str, ...]
    steps: int
    batches: int
    ks: tuple[int, ...]
    single: dict[str, tuple[float, ...]]
    averaged: dict[str, tuple[float, ...]]


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters() if p.grad is not None])


def gradient_fidelity(profile, device: torch.device | str = "cpu", *,
                      recipes=("mxfp8", "mxfp4", "mxfp4_hp_last", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht",
                               "nvfp4_no_2d", "nvfp4_no_hp_last"), draws: int = 8, batches: int = 3, steps: int | None = None,
                      seed: int = 0, lr: float = 3e-3) -> GradientFidelity:
    """Train the course GPT in FP32 for ``steps`` steps, then on each of the next ``batches`` batches compute
    the gradient exactly and ``draws`` times with each block-scaled ``recipe`` (a recipe without stochastic
    rounding gives the same gradient every time, so it is computed once per batch)."""
    import copy

    from .models import course_setup

    for name, v in (("draws", draws), ("batches", batches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not recipes:
        raise ValueError("gradient_fidelity needs at least one recipe")
    for r in recipes:
        block_recipe(r)
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 300), seed=seed)
    model = setup.model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(setup.steps):
        x, y = setup.sampler.batch(step, setup.device)
        opt.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
        opt.step()
    ks = tuple(k for k in (1, 2, 4, 8, 16, 32, 64) if k <= draws)
    single: dict[str, list[float]] = {r: [] for r in recipes}
    averaged: dict[str, list[list[float]]] = {r: [] for r in recipes}
    converted = {r: convert_to_block_scaled(copy.deepcopy(model), r, seed=seed) for r in recipes}
    for b in range(batches):
        x, y = setup.sampler.batch(setup.steps + b, setup.device)
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
        exact = _flat_grad(model)
        norm = float(torch.linalg.vector_norm(exact))
        for recipe, m in converted.items():
            n = draws if block_recipe(recipe).stochastic_gradients else 1
            grads = []
            for _ in range(n):
                m.zero_grad(set_to_none=True)
                m(x, y)[1].backward()
                grads.append(_flat_grad(m))
            grads += [grads[0]] * (draws - n)
            stacked = torch.stack(grads)
            single[recipe].append(sum(float(torch.linalg.vector_norm(g - exact)) for g in grads) / draws / norm)
            # the error of the mean of k draws, averaged over the draws // k disjoint groups of k
            averaged[recipe].append([
                sum(float(torch.linalg.vector_norm(stacked[g * k:(g + 1) * k].mean(0) - exact))
                    for g in range(draws // k)) / (draws // k) / norm for k in ks])
    return GradientFidelity(tuple(recipes), setup.steps, batches, ks, {r: tuple(v) for r, v in single.items()},
                            {r: tuple(sum(col) / batches for col in zip(*v)) for r, v in averaged.items()})
