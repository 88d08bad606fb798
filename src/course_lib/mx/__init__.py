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

from .blocks import (
    E8M0_BIAS,
    MX_ELEMENTS,
    SCALE_FORMATS,
    SCALE_MODES,
    BlockScaling,
    BlockTensor,
    block_error,
    e8m0_exponents,
    element_format,
    element_key,
    pack_fp4,
    stochastic_round,
    unpack_fp4,
)
from .linear import BLOCK_RECIPES, BlockLinear, BlockRecipe, block_recipe, convert_to_block_scaled, exact_products
from .nvfp4 import HADAMARD_SIZE, hadamard_groups, hadamard_matrix, random_hadamard, random_hadamard_matrix, random_signs

__all__ = [
    "exact_products",
    "MX_ELEMENTS",
    "SCALE_MODES",
    "SCALE_FORMATS",
    "E8M0_BIAS",
    "element_format",
    "element_key",
    "e8m0_exponents",
    "BlockScaling",
    "BlockTensor",
    "pack_fp4",
    "unpack_fp4",
    "block_error",
    "stochastic_round",
    "HADAMARD_SIZE",
    "hadamard_matrix",
    "random_signs",
    "random_hadamard",
    "random_hadamard_matrix",
    "hadamard_groups",
    "BlockRecipe",
    "block_recipe",
    "BLOCK_RECIPES",
    "BlockLinear",
    "convert_to_block_scaled",
]
