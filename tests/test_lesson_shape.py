"""The shape of each lesson's visible code (tools/lesson_cell_stats.py, read from the MyST source): a visible
cell is a few lines (at most ``MAX_LINES`` of code, blank and comment lines aside: the longest are the
training loops lesson 4 writes out in full, which read better whole than split), and none of its lines is wider than what the built book's code
cell shows at a 1280-px window (``WIDTH``), so no reader misses a comment beyond the edge. The browser check
measures the same width on the built page."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "lessons").glob("[0-9][0-9]_*.md"))
MAX_LINES = 13


def _tool():
    spec = importlib.util.spec_from_file_location("lesson_cell_stats", ROOT / "tools" / "lesson_cell_stats.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


stats = _tool()


def test_there_are_ten_lessons():
    assert len(LESSONS) == 10


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda p: p.stem)
def test_visible_cells_are_short_and_fit_the_page(lesson):
    row = stats.lesson_stats(lesson)
    assert row["max_lines"] <= MAX_LINES, row
    wide = [line for tags, src in stats.code_cells(lesson.read_text(encoding="utf-8"))
            if not tags & stats.HIDDEN_TAGS for line in stats.long_lines(src)]
    assert wide == [], f"{lesson.name}: {len(wide)} visible line(s) wider than {stats.WIDTH}: {wide[:3]}"


def test_the_checks_see_a_planted_long_line_and_long_cell(tmp_path):
    wide = "x = f(" + "a, " * 30 + ")"
    lesson = tmp_path / "99_planted.md"
    lesson.write_text("```{code-cell} ipython3\n" + wide + "\n```\n\n"
                      "```{code-cell} ipython3\n:tags: [hide-input]\n\n" + wide + "\n```\n\n"
                      "```{code-cell} ipython3\n" + "".join(f"v{i} = {i}\n" for i in range(MAX_LINES + 1)) + "```\n")
    row = stats.lesson_stats(lesson)
    assert row["long_lines"] == 1 and row["max_lines"] == MAX_LINES + 1 and row["visible_cells"] == 2
