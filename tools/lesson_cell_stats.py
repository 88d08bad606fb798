"""How a lesson's visible code reads: lines per visible cell and the share of them that is wiring.

    python tools/lesson_cell_stats.py lessons/*.md [--json]

A cell is *visible* when a reader sees its code without a click: no ``remove-cell``, ``remove-input``,
``hide-input`` or ``hide-cell`` tag. Lines are non-blank source lines. A statement is *wiring* when it
glues (``glue(...)``), displays Markdown built in the cell, builds a Markdown table by hand (a string
holding ``|---`` or starting ``"|``) or builds a sentence in an f-string (a literal part of four words or
more); all its lines count. The glue share is wiring lines over visible lines. A *long* line is wider than
``WIDTH`` characters, what a code cell of the built book shows at a 1280-px window without scrolling
sideways (a reader misses what lies beyond, often a comment).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import statistics
import sys
from pathlib import Path

HIDDEN_TAGS = {"remove-cell", "remove-input", "hide-input", "hide-cell"}
WIDTH = 77
CELL_RE = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```\s*$", re.S | re.M)


def code_cells(text: str) -> list[tuple[set[str], str]]:
    """(tags, source) of every code cell of a MyST lesson."""
    cells = []
    for match in CELL_RE.finditer(text):
        body = match.group(1)
        tags: set[str] = set()
        lines = body.split("\n")
        if lines and lines[0].startswith(":tags:"):
            tags = set(re.findall(r"[\w-]+", lines[0].split(":", 2)[2]))
            lines = lines[1:]
        elif lines and lines[0].strip() == "---":           # YAML metadata block
            end = lines.index("---", 1)
            meta = "\n".join(lines[1:end])
            tags = set(re.findall(r"[\w-]+", meta.split("tags:", 1)[1])) if "tags:" in meta else set()
            lines = lines[end + 1:]
        cells.append((tags, "\n".join(lines)))
    return cells


def _is_wiring(node: ast.AST, source: str) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            name = getattr(sub.func, "id", getattr(sub.func, "attr", ""))
            if name == "glue":
                return True
            if name == "display" and any(isinstance(a, ast.Call) and getattr(a.func, "id", "") == "Markdown"
                                         for a in sub.args):
                return True
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            if "|---" in sub.value or sub.value.lstrip().startswith("|"):
                return True
        if isinstance(sub, ast.JoinedStr):
            literal = " ".join(v.value for v in sub.values if isinstance(v, ast.Constant))
            if len(literal.split()) >= 4:
                return True
    return False


def cell_lines(source: str) -> tuple[int, int]:
    """(non-blank lines, of which wiring) of one cell's source."""
    lines = source.split("\n")
    nonblank = {i for i, line in enumerate(lines, 1) if line.strip() and not line.strip().startswith("#")}
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return len(nonblank), 0
    wiring: set[int] = set()
    for stmt in tree.body:
        if _is_wiring(stmt, source):
            wiring |= set(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return len(nonblank), len(wiring & nonblank)


def long_lines(source: str, width: int = WIDTH) -> list[str]:
    """The lines of one cell's source wider than ``width`` characters."""
    return [line for line in source.split("\n") if len(line) > width]


def lesson_stats(path: Path) -> dict:
    sources = [src for tags, src in code_cells(path.read_text(encoding="utf-8")) if not tags & HIDDEN_TAGS]
    visible = [cell_lines(src) for src in sources]
    lines = [n for n, _ in visible if n]
    total = sum(lines)
    wiring = sum(w for _, w in visible)
    return {"lesson": path.stem, "visible_cells": len(lines),
            "mean_lines": round(statistics.mean(lines), 1) if lines else 0.0,
            "max_lines": max(lines, default=0),
            "glue_share": round(wiring / total, 3) if total else 0.0,
            "long_lines": sum(len(long_lines(src)) for src in sources)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lessons", nargs="+", type=Path)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = [lesson_stats(p) for p in sorted(args.lessons)]
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"| lesson | visible cells | mean lines | max lines | glue share | lines over {WIDTH} characters |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['lesson']} | {r['visible_cells']} | {r['mean_lines']} | {r['max_lines']} | "
              f"{r['glue_share']:.0%} | {r['long_lines']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
