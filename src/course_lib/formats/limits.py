"""Where a format's largest value stops: the one definition of overflow that the FP8 and MX saturation counts,
the gradient monitor and the underflow summaries share."""

from __future__ import annotations

import torch

from .codecs import FloatFormat, encode, get_format

_BOUNDARIES: dict[FloatFormat, tuple[float, bool]] = {}


def overflow_boundary(fmt: str | FloatFormat) -> tuple[float, bool]:
    """Where rounding to nearest carries a magnitude past ``fmt``'s largest finite value: ``(top, tie_over)``.

    ``top`` is max plus half the spacing of its binade, halfway to the next value the grid would hold. Above
    it a value rounds past max (to inf, NaN, or the clamp of a saturating cast); below it, to max or less;
    on it is a tie, which goes to the neighbour with an even last mantissa bit (away from zero for a
    ``nearest_away`` format). ``tie_over``: whether the tie goes past max. Max's last bit is odd for every
    IEEE-style format and FP6/FP4 (65520, 61440, 7.75, 30 and 7 overflow FP16, E5M2, E2M3, E3M2 and E2M1),
    even for E4M3, whose all-ones top mantissa is NaN (464 rounds down to 448, as torch's cast and
    :func:`course_lib.formats.round_to_format` do). Read once per format, from the format's own code of max.
    The one definition of overflow the FP8 and MX saturation counts and the gradient monitor use."""
    f = get_format(fmt)
    if f not in _BOUNDARIES:
        if f.rounding == "toward_zero":
            raise ValueError(f"{f.name} rounds toward zero: no value rounds past its max, which is the "
                             "boundary of a format that rounds to nearest")
        top = f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
        max_code = int(encode(torch.tensor([f.max_finite], dtype=torch.float64), f)[0])
        _BOUNDARIES[f] = top, f.rounding == "nearest_away" or max_code % 2 == 1
    return _BOUNDARIES[f]


def rounds_past_max(magnitude: torch.Tensor, fmt: str | FloatFormat) -> torch.Tensor:
    """Which non-negative ``magnitude`` values round past ``fmt``'s max (:func:`overflow_boundary`): one
    comparison per element. Exact when ``magnitude`` holds the values the cast rounds (FP32 products
    for the FP8 and MX casts), since ``top`` is exact in float32 for every format narrower than FP32."""
    top, tie_over = overflow_boundary(fmt)
    return magnitude >= top if tie_over else magnitude > top
