"""Numbers into a lesson's prose: one helper hands a result's named facts to myst-nb's ``glue``.

A study returns its facts as a mapping, name to value (a number the prose formats with ``{glue:text}`x:.2f```,
Markdown text for ``{glue:md}``, a figure for ``{glue:figure}``); a lesson's hidden cell calls
:func:`glue_facts` with it. Markdown text is wrapped so that Jupyter and the book render it, not quote it.
"""

from __future__ import annotations

import math

from collections.abc import Mapping, Sequence

from IPython.display import Markdown
from myst_nb import glue  # type: ignore[import-untyped]

from .tables import MarkdownTable, errata_table
from .tables import ratio_text as ratio_text   # re-exported: the lessons' prose takes it from glue


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``1 step``, ``2 steps``, ``0 steps``: ``count`` and ``noun``, plural (``many``, else ``noun + "s"``)
    unless the count is one."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, got {type(count).__name__}")
    return f"{count} {noun if count == 1 else (many or noun + 's')}"


_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
          "twelve")


def count_word(count: int) -> str:
    """A count as prose writes it: ``no``, ``one`` ... ``twelve`` in words, digits from 13 on."""
    if isinstance(count, bool) or not isinstance(count, int):
        raise TypeError(f"count must be an int, got {type(count).__name__}")
    if count < 0:
        raise ValueError(f"count must not be negative, got {count}")
    return _WORDS[count] if count < len(_WORDS) else str(count)


def one_sign_odds(n: int) -> int:
    """``k`` of "one time in k": how rarely ``n`` paired differences with no real effect behind them (each sign
    equally likely, the pairs independent) all land on one side, either side counted: ``2 / 2**n``, so
    ``2**(n - 1)``. One pair always has one sign (1)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n < 1:
        raise ValueError(f"n must be at least 1 (a pair to compare), got {n}")
    return 2 ** (n - 1)


def sig3(value: float) -> str:
    """Three significant digits, trailing zeros kept, and no exponent: 0.00725, 0.0130, 0.150, 2.90, 49.4,
    653; whole numbers from 100 on with separators (1,234). Zero and negative values as ``:g`` gives them."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"value must be a real number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"value must be finite, got {value!r}")
    if value <= 0:
        return f"{value:g}"
    rounded = float(f"{value:.3g}")   # 99.96 rounds to 100, which takes no decimals
    return f"{rounded:,.{max(0, 2 - math.floor(math.log10(rounded)))}f}"


def percent_text(fraction: float) -> str:
    """A share (0.003 of a whole) as a percentage with three significant digits (``0.300%``, ``20.0%``,
    ``153%``), so that a nonzero share never prints as ``0%``; exactly zero is ``0%``."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)):
        raise TypeError(f"fraction must be a real number, got {type(fraction).__name__}")
    if not (math.isfinite(fraction) and fraction >= 0):
        raise ValueError(f"a share must be finite and non-negative, got {fraction!r}")
    return "0%" if fraction == 0 else f"{sig3(100 * fraction)}%"


def percent_places(pct: float, places: int = 2) -> str:
    """A percentage (``99.998`` of 100) to ``places`` decimals, with more where fewer would print a share that
    is not 100% as ``100.00%`` or a nonzero one as ``0.00%`` (up to ten decimals)."""
    if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not (math.isfinite(pct) and 0 <= pct <= 100):
        raise ValueError(f"pct must be a percentage from 0 to 100, got {pct!r}")
    if isinstance(places, bool) or not isinstance(places, int) or places < 0:
        raise ValueError(f"places must be a non-negative int, got {places!r}")
    text = f"{pct:.{places}f}"
    while places < 10 and ((pct < 100 and float(text) >= 100) or (pct > 0 and float(text) == 0)):
        places += 1
        text = f"{pct:.{places}f}"
    return f"{text}%"


def bold(text: object) -> str:
    """A computed number inside glued Markdown (a :class:`Prose`), bold as ``{glue:text}`` shows a glued
    number, so that the book's rule "a number in bold was computed" holds for both."""
    if isinstance(text, str) and not text.strip():
        raise ValueError("bold needs something to show, got an empty string")
    return f"**{text}**"


def and_list(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``; an empty sequence is refused."""
    if isinstance(items, str) or not items:
        raise ValueError(f"and_list needs a non-empty sequence of phrases, got {items!r}")
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


class Prose(str):
    """A fact that is Markdown text (a phrase or a table) rather than a number: glued as Markdown."""


def glue_facts(facts: Mapping[str, object]) -> None:
    """Glue every fact under its name, out of sight (``display=False``); :class:`Prose` and Markdown tables
    are glued as Markdown. Raises ``TypeError`` for a name that is not a string and ``ValueError`` for an
    empty or spaced one, before gluing anything."""
    if not isinstance(facts, Mapping):
        raise TypeError(f"facts must be a mapping of name to value, not {type(facts).__name__}")
    for name in facts:
        if not isinstance(name, str):
            raise TypeError(f"fact names must be strings, got {name!r}")
        if not name or any(c.isspace() for c in name):
            raise ValueError(f"fact name {name!r} must be non-empty and without spaces (myst-nb refers to it)")
    for name, value in facts.items():
        if isinstance(value, (Prose, MarkdownTable)):
            value = Markdown(str(value))
        glue(name, value, display=False)


def glue_errata(name: str, rows: Sequence[tuple[str, str]]) -> None:
    """Glue a lesson's errata table (claim, what this page measured) under ``name`` for ``{glue:md}``."""
    glue_facts({name: errata_table(rows)})


_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def power_of_two_text(exponent: int) -> str:
    """``2`` with ``exponent`` as superscript digits (2\u00b9\u2076), for prose that a glued number cannot
    put inside a formula."""
    if isinstance(exponent, bool) or not isinstance(exponent, int):
        raise TypeError(f"exponent must be an int, got {type(exponent).__name__}")
    return "2" + str(exponent).translate(_SUPERSCRIPT)
