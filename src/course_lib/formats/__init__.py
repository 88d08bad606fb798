"""Number formats from their bits: FP32, TF32, BF16, FP16, the FP8, FP6 and FP4 formats and E8M0.

``codecs``: the formats and exact encode/decode/round; ``tables``: single values explained, property tables;
``tf32``: TF32 rounding checked against a GPU's own TF32 matmul.
"""

from __future__ import annotations

from .codecs import (
    Specials,
    Overflow,
    Rounding,
    ArrayLike,
    FloatFormat,
    FORMATS,
    get_format,
    list_formats,
    decode,
    all_values,
    pow2,
    round_to_format,
    native_cast_agrees,
    narrow_format,
    round_magnitude32,
    encode,
    spacing,
)
from .tables import bit_string, ValueInFormat, explain_value, properties_markdown, explain_values_markdown
from .tf32 import TF32Check, tf32_rounding_agreement, tf32_matmul_check

__all__ = [
    "Specials",
    "Overflow",
    "Rounding",
    "ArrayLike",
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
    "round_magnitude32",
    "encode",
    "spacing",
    "bit_string",
    "ValueInFormat",
    "explain_value",
    "properties_markdown",
    "explain_values_markdown",
    "TF32Check",
    "tf32_rounding_agreement",
    "tf32_matmul_check",
]
