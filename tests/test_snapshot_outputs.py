"""tools/snapshot_outputs.py: glued values and displays read from an executed notebook, and changes found."""

import importlib.util
import json
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "snapshot_outputs.py"
spec = importlib.util.spec_from_file_location("snapshot_outputs", TOOL)
snap = importlib.util.module_from_spec(spec)
spec.loader.exec_module(snap)


def _notebook(path: Path, glued: str, table: str) -> Path:
    cells = [{"cell_type": "code", "outputs": [
        {"output_type": "display_data", "metadata": {"scrapbook": {"name": "ratio", "mime_prefix": "x"}},
         "data": {"application/papermill.record/text/plain": glued}},
        {"output_type": "display_data", "metadata": {}, "data": {"text/markdown": table}},
        {"output_type": "display_data", "metadata": {}, "data": {"image/png": "AAAA"}},
        {"output_type": "stream", "name": "stdout", "text": ["printed\n"]}]}]
    path.write_text(json.dumps({"cells": cells}), encoding="utf-8")
    return path


def test_snapshot_reads_glue_displays_and_counts_figures(tmp_path):
    out = snap.snapshot_notebook(_notebook(tmp_path / "a.ipynb", "1.25", "| a |\n|---|\n| 1 |"))
    assert out == {"glue": {"ratio": "1.25"}, "displays": ["| a |\n|---|\n| 1 |", "printed\n"], "figures": 1}


def test_differences_name_what_changed(tmp_path):
    before = {"01": snap.snapshot_notebook(_notebook(tmp_path / "a.ipynb", "1.25", "| a |"))}
    same = {"01": snap.snapshot_notebook(_notebook(tmp_path / "b.ipynb", "1.25", "| a |"))}
    after = {"01": snap.snapshot_notebook(_notebook(tmp_path / "c.ipynb", "1.26", "| b |"))}
    assert snap.differences(before, same) == {}
    assert snap.differences(before, after) == {"01": ["glue:ratio", "display-before:'| a |'",
                                                      "display-after:'| b |'"]}
    assert snap.differences(before, {}) == {"01": ["<lesson missing on one side>"]}


def test_trailing_whitespace_is_not_a_change_and_one_lesson_can_be_compared(tmp_path):
    before = {"01": snap.snapshot_notebook(_notebook(tmp_path / "a.ipynb", "x", "| a |")),
              "02": snap.snapshot_notebook(_notebook(tmp_path / "b.ipynb", "y", "| b |"))}
    after = {"01": snap.snapshot_notebook(_notebook(tmp_path / "c.ipynb", "x\n", "| a |\n"))}
    assert snap.differences(before, after) == {"02": ["<lesson missing on one side>"]}
    assert snap.differences(before, after, only_after=True) == {}
    changed = {"01": snap.snapshot_notebook(_notebook(tmp_path / "d.ipynb", "x", "| a | b |"))}
    assert snap.differences(before, changed, only_after=True) == {
        "01": ["display-before:'| a |'", "display-after:'| a | b |'"]}
