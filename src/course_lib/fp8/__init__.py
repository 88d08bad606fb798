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

from .accumulation import AccumulationStudy, accumulation_error
from .casts import (
    AMAX_FLOOR,
    E4M3,
    E5M2,
    Fp8Tensor,
    amax_to_scale,
    as_2d,
    block_amax,
    cast_blocks,
    cast_saturating,
    check_finite_amax,
    check_nonempty,
    expand_blocks,
    fp8_dtype,
    fp8_format,
    fp8_max,
    native_cast_saturates,
    nonfinite_error,
    resolve_block,
)
from .linear import (
    FP8_LINEAR_RECIPES,
    Fp8Linear,
    LinearScaling,
    QuantizedLinear,
    convert_to_fp8,
    exact_products,
    fp8_matmul,
    linear_scaling,
    replace_linears,
    torchao_float8,
)
from .recipes import (
    BlockwiseScaling,
    CurrentScaling,
    DelayedScaling,
    QuantizationError,
    RowwiseScaling,
    ScalingRecipe,
    StaticScaling,
    quantization_error,
)
from .roofline import LAUNCH_SECONDS, Fp8LinearEstimate, cast_kernel_kinds, kernel_counts, predict_fp8_linear

__all__ = [
    "AMAX_FLOOR",
    "fp8_format",
    "fp8_dtype",
    "fp8_max",
    "native_cast_saturates",
    "cast_saturating",
    "cast_blocks",
    "Fp8Tensor",
    "expand_blocks",
    "as_2d",
    "check_finite_amax",
    "check_nonempty",
    "nonfinite_error",
    "block_amax",
    "amax_to_scale",
    "resolve_block",
    "E4M3",
    "E5M2",
    "ScalingRecipe",
    "CurrentScaling",
    "StaticScaling",
    "RowwiseScaling",
    "BlockwiseScaling",
    "DelayedScaling",
    "QuantizationError",
    "quantization_error",
    "fp8_matmul",
    "LinearScaling",
    "linear_scaling",
    "exact_products",
    "QuantizedLinear",
    "replace_linears",
    "Fp8Linear",
    "convert_to_fp8",
    "torchao_float8",
    "FP8_LINEAR_RECIPES",
    "AccumulationStudy",
    "accumulation_error",
    "LAUNCH_SECONDS",
    "Fp8LinearEstimate",
    "predict_fp8_linear",
    "cast_kernel_kinds",
    "kernel_counts",
]
