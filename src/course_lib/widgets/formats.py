"""Lesson 1's explorer: every format's bits for a typed number, and bits to flip (``js/format_explorer.js``).

The page computes with ``js/codecs.js``, a port of :mod:`course_lib.formats` that
tests/test_widgets_formats.py checks against it bit for bit; :func:`check_in_page` checks one mounted
explorer in a built page the same way.
"""

from __future__ import annotations

import math
import time
from decimal import ROUND_HALF_UP, Decimal, localcontext

from ..formats import FloatFormat, bit_string, decode, encode, explain_value, get_format, list_formats
from .page import Explorer

# what check_in_page types: a number every format holds a code for (no NaN), and a second one in case the
# explorer already starts from the first
_PROBES = ("-3.14159", "6e-8")
_WAIT_S = 2.0   # the explorer redraws as the input event fires; a slow page gets this long
# significant digits the table shows of a stored value (js/format_explorer.js's STORED_DIGITS; the test checks
# they agree): a longer value is shown rounded with "…" after it, its exact text in data-exact and a tooltip
STORED_DIGITS = 12


def format_explorer(value: float | str = 0.1, format: str = "FP16", formats=None) -> Explorer:
    """Type a number and see how every format stores it (bits, stored value, absolute and relative error);
    pick a format (or click its row) and click its bits to flip them: the readout names the code (subnormal,
    largest finite, infinity, NaN as the format defines them), its neighbours and its rounding bin.

    ``value``: the number shown first (a float, or its text); ``format``: the format whose bits are shown
    first; ``formats``: the rows, in order (default: every registered format). The arithmetic is
    ``js/codecs.js``, a port of :mod:`course_lib.formats` checked against it bit for bit."""
    names = [f.name for f in (list_formats() if formats is None else [get_format(f) for f in formats])]
    start = get_format(format).name
    if start not in names:
        raise ValueError(f"format {start!r} is not among the explorer's formats {names}")
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise TypeError(f"value must be a number or its text, not {type(value).__name__}")
    return Explorer("format_explorer.js", {"value": str(value), "format": start, "formats": names},
                    "Number formats explorer")


def _same(shown: str, expected: float) -> bool:
    """Whether a number the page shows (JavaScript's shortest text, "inf", "NaN", "-0") is ``expected``,
    to the bit (any NaN matches NaN)."""
    try:
        value = float(shown)
    except ValueError:
        return False
    if math.isnan(expected):
        return math.isnan(value)
    return value == expected and math.copysign(1.0, value) == math.copysign(1.0, expected)


def _rounded(x: float, digits: int = STORED_DIGITS) -> float:
    """``x`` rounded to ``digits`` significant digits, ties away from zero, as JavaScript's toPrecision rounds
    (from the exact value of the double)."""
    with localcontext() as context:
        context.prec, context.rounding = digits, ROUND_HALF_UP
        return float(+Decimal(x))


def _same_stored(shown: str, expected: float) -> bool:
    """Whether the table's stored-value text is ``expected``: its exact text, or (ending in "…") ``expected``
    rounded to STORED_DIGITS significant digits, where that rounding changed it."""
    if not shown.endswith("…"):
        return _same(shown, expected)
    if not math.isfinite(expected) or expected == 0:
        return False
    try:
        value = float(shown[:-1])
    except ValueError:
        return False
    return value == _rounded(expected) != expected


def _close(shown: str, expected: float) -> bool:
    """Whether an error the page shows to three significant digits (or "-" for none) is ``expected``."""
    if math.isnan(expected):
        return shown == "-"
    try:
        value = float(shown)
    except ValueError:
        return False
    return abs(value - expected) <= 5e-3 * abs(expected)


def check_in_page(root, config: dict) -> list[str]:
    """Problems of one mounted format explorer in a rendered page ([] when it works).

    ``root``: a Playwright Locator for the explorer's ``div.course-explorer``; ``config``: the configuration
    it carries (:func:`format_explorer`'s). Types a number into it, waits for the table to change, and
    compares every row (bits, stored value: the exact one in data-exact and the one shown, rounded to
    STORED_DIGITS digits where longer; errors) and the readout of the selected format (its code and
    value) with :func:`course_lib.formats.explain_value`, :func:`~course_lib.formats.encode` and
    :func:`~course_lib.formats.decode`. A table that does not change is a problem: the explorer renders but
    does not respond."""
    if not isinstance(config, dict):
        raise TypeError(f"config must be the explorer's configuration (a dict), not {type(config).__name__}")
    try:
        names: list[str | FloatFormat] = [get_format(f).name for f in config.get("formats") or list_formats()]
    except (TypeError, ValueError) as error:
        return [f"the explorer's configuration names an unknown format: {error}"]
    typed = _PROBES[1] if str(config.get("value", "")).strip() == _PROBES[0] else _PROBES[0]
    number, values = root.locator("[data-role=number]"), root.locator("[data-role=values]")
    try:
        before = values.inner_text(timeout=_WAIT_S * 1000)
        number.fill(typed, timeout=_WAIT_S * 1000)
        deadline = time.monotonic() + _WAIT_S
        while values.inner_text() == before and time.monotonic() < deadline:
            time.sleep(0.05)
        if values.inner_text() == before:
            return [f"typing {typed} into the format explorer changed nothing: it renders but does not respond"]
        problems = []
        for row in explain_value(float(typed), names):
            cells = root.locator(f'tr[data-format="{row.format}"]')
            if cells.count() != 1:
                problems.append(f"{row.format}: no row in the table")
                continue
            shown = {role: cells.locator(f"[data-role={role}]").inner_text().strip()
                     for role in ("bits", "stored", "abs-error", "rel-error")}
            stored_exact = cells.locator("[data-role=stored]").get_attribute("data-exact") or ""
            if shown["bits"] != row.bits:
                problems.append(f"{row.format}: {typed} shows bits {shown['bits']}, Python's are {row.bits}")
            if not _same(stored_exact, row.stored):
                problems.append(f"{row.format}: {typed} has exact stored value {stored_exact!r}, Python's is {row.stored!r}")
            if not _same_stored(shown["stored"], row.stored):
                problems.append(f"{row.format}: {typed} shows stored value {shown['stored']}, Python's is {row.stored!r}")
            for role, expected in (("abs-error", row.abs_error), ("rel-error", row.rel_error)):
                if not _close(shown[role], expected):
                    problems.append(f"{row.format}: {typed} shows {role} {shown[role]}, Python's is {expected!r}")
        selected = get_format(root.locator("[data-role=format]").input_value())
        code = int(encode(float(typed), selected))
        shown_code = root.locator("[data-role=code]").inner_text().strip()
        if shown_code != bit_string(code, selected):
            problems.append(f"{selected.name}: the readout shows code {shown_code}, Python's is {bit_string(code, selected)}")
        shown_value = root.locator("[data-role=decoded]").inner_text().strip()
        if not _same(shown_value, float(decode(code, selected))):
            problems.append(f"{selected.name}: the readout shows value {shown_value}, Python decodes "
                            f"{float(decode(code, selected))!r}")
        return problems
    except Exception as error:   # a missing element or a crashed page is this explorer's problem
        return [f"format explorer check failed: {type(error).__name__}: {str(error).splitlines()[0][:200]}"]
