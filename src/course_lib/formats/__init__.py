"""Number formats from their bits: FP32, TF32, BF16, FP16, the FP8, FP6 and FP4 formats and E8M0.

``codecs``: the formats and exact encode/decode/round; ``arrays``: numpy or torch in, the same kind out;
``tables``: single values explained, property tables; ``tf32``: TF32 rounding checked against a GPU's own
TF32 matmul.
"""

from __future__ import annotations

from .arrays import like_input, to_tensor
from .codecs import (
    FORMATS,
    ArrayLike,
    FloatFormat,
    Overflow,
    Rounding,
    Specials,
    all_values,
    decode,
    encode,
    get_format,
    list_formats,
    narrow_format,
    native_cast_agrees,
    pow2,
    quantum32,
    round_magnitude32,
    round_to_format,
    spacing,
)
from .limits import overflow_boundary, rounds_past_max
from .tables import (
    ValueInFormat,
    bit_string,
    explain_value,
    explain_values_markdown,
    neighbours,
    properties_markdown,
)
from .tf32 import TF32_SCALE_EXPONENTS, TF32Check, tf32_matmul_check, tf32_rounding_agreement

__all__ = [
    "Specials",
    "Overflow",
    "Rounding",
    "ArrayLike",
    "to_tensor",
    "like_input",
    "FloatFormat",
    "FORMATS",
    "get_format",
    "list_formats",
    "decode",
    "all_values",
    "pow2",
    "round_to_format",
    "native_cast_agrees",
    "narrow_format",
    "quantum32",
    "round_magnitude32",
    "encode",
    "spacing",
    "overflow_boundary",
    "rounds_past_max",
    "bit_string",
    "ValueInFormat",
    "explain_value",
    "neighbours",
    "properties_markdown",
    "explain_values_markdown",
    "TF32Check",
    "TF32_SCALE_EXPONENTS",
    "tf32_rounding_agreement",
    "tf32_matmul_check",
]
