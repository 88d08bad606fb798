"""Markdown tables for the lessons: the formatting lives here, so a lesson's cell shows what it computes.

``markdown_table(header, rows)`` returns a :class:`MarkdownTable`, a ``str`` that Jupyter displays as a
rendered table (``display(table)``) and that can be glued or printed as plain Markdown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class MarkdownTable(str):
    """Markdown text that Jupyter renders (``_repr_markdown_``)."""

    def _repr_markdown_(self) -> str:
        return str(self)


def _cell(value) -> str:
    text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def markdown_table(header: Sequence[str], rows: Iterable[Sequence]) -> MarkdownTable:
    """A Markdown table with ``header`` and one line per row; each row must have as many cells as the
    header (pipes inside a cell are escaped, newlines become spaces). Cells are shown with ``str``: format
    numbers before passing them, one style per column."""
    if isinstance(header, str) or not header:
        raise ValueError("header must be a non-empty sequence of column names, not a string")
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    for i, row in enumerate(rows):
        if isinstance(row, str):
            raise TypeError(f"row {i} is a string; give a sequence of cells")
        cells = list(row)
        if len(cells) != len(header):
            raise ValueError(f"row {i} has {len(cells)} cells, the header has {len(header)}")
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return MarkdownTable("\n".join(lines) + "\n")


def errata_table(rows: Iterable[Sequence[str]]) -> MarkdownTable:
    """The errata box's table: one row per claim, with what the page measured against it. ``rows`` are
    ``(claim, measured)`` pairs of Markdown text; an empty list is refused (a box with no claims)."""
    rows = [tuple(r) for r in rows]
    if not rows:
        raise ValueError("errata_table needs at least one (claim, measured) row")
    return markdown_table(("claim", "measured"), rows)


def ratio_text(ratio: float) -> str:
    """A speed ratio for prose: two decimals from 0.1 up, two significant digits below (0.0031, not 0.00)."""
    if not ratio > 0:
        raise ValueError(f"a speed ratio must be positive, got {ratio!r}")
    return f"{ratio:.2f}" if ratio >= 0.1 else f"{ratio:#.2g}"   # "#": 0.010, not 0.01
