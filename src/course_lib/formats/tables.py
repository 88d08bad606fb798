"""Single values explained in every format (bits, stored value, error) and the formats' property tables."""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from ..tables import MarkdownTable, markdown_table
from .codecs import FloatFormat, decode, encode, get_format, list_formats, round_to_format


def bit_string(code: int, fmt: str | FloatFormat) -> str:
    """``"0 01111 0000000000"``: sign, exponent and mantissa fields of one code, space separated."""
    f = get_format(fmt)
    if not isinstance(code, (int, np.integer)) or isinstance(code, bool):
        raise TypeError(f"code must be an int, got {type(code).__name__}")
    if not 0 <= code < 2**f.bits:
        raise ValueError(f"{f.name} codes lie in 0..{2**f.bits - 1}, got {code}")
    s = format(int(code), f"0{f.bits}b")
    parts = []
    if f.signed:
        parts.append(s[0])
    parts.append(s[f.sign_bits:f.sign_bits + f.exponent_bits])
    if f.mantissa_bits:
        parts.append(s[f.sign_bits + f.exponent_bits:])
    return " ".join(parts)


@dataclass(frozen=True)
class ValueInFormat:
    """One number as a format stores it."""

    format: str
    value: float          # the input
    stored: float         # the value after rounding
    code: int | None      # the bit pattern (None when the format cannot hold the result, e.g. NaN in FP4)
    bits: str             # the bit pattern as "s eeeee mmmmmmmmmm"
    abs_error: float
    rel_error: float


def explain_value(value: float, formats: list[str | FloatFormat] | None = None) -> list[ValueInFormat]:
    """How ``value`` is stored in each format: bits, stored value, absolute and relative error."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"value must be a real number, got {type(value).__name__}")
    value = float(value)
    rows = []
    for f in (list_formats() if formats is None else [get_format(x) for x in formats]):
        if math.isnan(value) and not f.has_nan:
            rows.append(ValueInFormat(f.name, value, math.nan, None, "-", math.nan, math.nan))
            continue  # no code holds it (FP6, FP4): shown as "-", not as a number
        stored = float(round_to_format(np.array([value]), f)[0])
        code = int(encode(np.array([value]), f)[0])
        bits = bit_string(code, f)
        if math.isfinite(stored) and math.isfinite(value):
            abs_err = abs(stored - value)
            rel_err = abs_err / abs(value) if value != 0 else 0.0
        else:
            abs_err = rel_err = math.nan if not (stored == value) else 0.0
        rows.append(ValueInFormat(f.name, value, stored, code, bits, abs_err, rel_err))
    return rows


def neighbours(code: int, fmt: str | FloatFormat) -> tuple[float | None, float | None]:
    """The values next to code ``code``'s value, ``(below, above)``: the nearest values the format holds
    (infinities included, NaN not) on each side, or None where there is none. Both zeros have the smallest
    subnormals of either sign as neighbours. The rounding bin of the value ends halfway to each (beside
    infinity: at the overflow threshold, the largest finite value plus half its spacing)."""
    f = get_format(fmt)
    bit_string(code, f)   # the same checks on code: an int within the format's codes
    code = int(code)
    magnitudes = 2 ** (f.bits - 1) if f.signed else 2**f.bits
    magnitude = code % magnitudes
    # one decode for the code and the codes on either side (clipped to the format's codes; unused there)
    before, value, after = (float(v) for v in decode(np.array([max(code - 1, 0), code, min(code + 1, 2**f.bits - 1)]), f))
    if math.isnan(value):
        return None, None
    away = after if magnitude + 1 < magnitudes and not math.isnan(after) else None
    if magnitude > 0:
        toward = None if math.isnan(before) else before
    elif f.signed:
        toward = f.min_subnormal if math.copysign(1.0, value) < 0 else -f.min_subnormal
    else:
        toward = None
    return (away, toward) if math.copysign(1.0, value) < 0 else (toward, away)


def _num(x: float) -> str:
    """Scientific with four significant digits outside [0.01, 1e5); inside, up to six (so that 65504 and 448
    read in full): one style per magnitude, whatever a value's digits."""
    if math.isinf(x):
        return "inf"
    if x != 0 and (abs(x) >= 1e5 or abs(x) < 1e-2):
        return f"{x:.3e}"
    return f"{x:.6g}"


def exact_number(x: float) -> str:
    """``x`` written exactly, in one of two styles that read alike in a column: an integer below a million with
    thousands separators (``"57,344"``), otherwise ``m`` times a power of two as MyST math, ``m`` in [1, 2)
    and omitted when 1 (``"$2^{-9}$"``, ``"$1.9921875 \\times 2^{127}$"``); ``"inf"`` for infinity."""
    if math.isnan(x):
        raise ValueError("NaN has no exact value")
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e6:
        return f"{int(x):,}"
    m, e = math.frexp(abs(x))         # |x| = m * 2**e, m in [0.5, 1)
    mantissa, power = Decimal(2 * m), e - 1
    sign = "-" if x < 0 else ""
    return f"${sign}2^{{{power}}}$" if mantissa == 1 else f"${sign}{mantissa} \\times 2^{{{power}}}$"


# the properties table's columns, in two groups: where a format's values lie, and how finely and with which codes
_RANGE_COLUMNS = ("bits (S/E/M)", "bias", "max finite", "min normal", "min subnormal", "binades")
_PRECISION_COLUMNS = ("epsilon", "decimal digits", "finite values", "inf", "NaN")


def properties_markdown(formats=None, columns: str = "all", *, exact: bool = False) -> MarkdownTable:
    """A Markdown table of every derived property, one row per format (values from the registry).
    ``columns``: ``"all"``, ``"range"`` (bits, bias, extreme values, binades) or ``"precision"`` (epsilon,
    decimal digits, the count of finite values, whether inf and NaN exist): two narrower tables that fit a
    page's width where the whole one does not. ``exact``: the extreme values and epsilon written exactly
    (:func:`exact_number`: integers and powers of two) rather than to four significant digits."""
    groups = {"all": _RANGE_COLUMNS + _PRECISION_COLUMNS, "range": _RANGE_COLUMNS, "precision": _PRECISION_COLUMNS}
    if columns not in groups:
        raise ValueError(f"columns must be one of {sorted(groups)}, got {columns!r}")
    fmts = list_formats() if formats is None else [get_format(f) for f in formats]
    num = exact_number if exact else _num
    rows = []
    for f in fmts:
        cells = {"bits (S/E/M)": f"{f.bits} ({f.sign_bits}/{f.exponent_bits}/{f.mantissa_bits})", "bias": f.bias,
                 "max finite": num(f.max_finite), "min normal": num(f.min_normal),
                 # a format without subnormals (E8M0) has none: its min_subnormal is its smallest normal
                 "min subnormal": num(f.min_subnormal) if f.subnormals and f.mantissa_bits else "none",
                 "binades": f"{f.binades:.1f}", "epsilon": num(f.epsilon),
                 "decimal digits": f"{f.decimal_digits:.2f}", "finite values": f"{f.n_finite_codes:,}",
                 "inf": "yes" if f.has_inf else "no", "NaN": "yes" if f.has_nan else "no"}
        rows.append((f.name, *(cells[c] for c in groups[columns])))
    return markdown_table(("format", *groups[columns]), rows)


def explain_values_markdown(values, formats=None, labels=None) -> MarkdownTable:
    """A Markdown table of :func:`explain_value` for several numbers (the static explorer). ``labels``: how
    to name each number in the first column (e.g. ``"1/3"``, which 0.333333 would misstate); default: the
    number itself, to six significant digits."""
    values = list(values)
    if labels is None:
        labels = [_num(float(v)) for v in values]
    labels = [str(label) for label in labels]
    if len(labels) != len(values):
        raise ValueError(f"{len(labels)} labels for {len(values)} values")
    rows = []
    for v, label in zip(values, labels):
        for r in explain_value(v, formats):
            rel = "-" if math.isnan(r.rel_error) else f"{r.rel_error:.2e}"
            stored = "NaN" if math.isnan(r.stored) else _num(r.stored)
            rows.append((label, r.format, f"`{r.bits}`", stored, rel))
    return markdown_table(("number", "format", "bits (sign exponent mantissa)", "stored value", "relative error"),
                          rows)
