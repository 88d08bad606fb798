"""The status page's table of lessons executed by nbmake (course_lib.record.executed_notebooks_markdown), from
notebooks written by hand with nbclient's timing metadata."""

import json

import pytest

from course_lib.record import executed_notebooks_markdown


def _cell(start, end, outputs=()):
    return {"cell_type": "code", "source": "", "outputs": list(outputs),
            "metadata": {"execution": {"iopub.execute_input": start, "shell.execute_reply": end}}}


def _write(path, cells):
    path.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    return path


def test_times_span_the_first_start_and_the_last_reply(tmp_path):
    ok = _write(tmp_path / "01_formats.ipynb", [_cell("2026-11-24T21:09:53.000Z", "2026-11-24T21:09:57.500Z"),
                                                {"cell_type": "markdown", "source": "", "metadata": {}},
                                                _cell("2026-11-24T21:10:20.000Z", "2026-11-24T21:10:25.250Z")])
    bad = _write(tmp_path / "02_x.ipynb", [_cell("2026-11-24T22:00:00Z", "2026-11-24T22:00:01Z",
                                                 [{"output_type": "error", "ename": "E", "evalue": "", "traceback": []}])])
    text = executed_notebooks_markdown([ok, bad])
    assert text.startswith("The lessons were executed as notebooks")
    assert text.splitlines()[-2:] == ["| 01_formats | 2026-11-24 21:09 UTC | 32.2 | 2 | ok |",
                                      "| 02_x | 2026-11-24 22:00 UTC | 1.0 | 1 | error |"]


def test_notebooks_without_timing_give_nothing(tmp_path):
    plain = _write(tmp_path / "a.ipynb", [{"cell_type": "code", "source": "", "outputs": [], "metadata": {}}])
    assert executed_notebooks_markdown([plain]) == ""
    assert executed_notebooks_markdown([]) == ""
    broken = tmp_path / "b.ipynb"
    broken.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read notebook"):
        executed_notebooks_markdown([broken])


def test_source_commit_prefers_the_environment_then_git(monkeypatch):
    from course_lib.results import GIT_COMMIT_ENV_VAR, source_commit

    monkeypatch.setenv(GIT_COMMIT_ENV_VAR, " abc123 \n")
    assert source_commit() == "abc123"
    monkeypatch.delenv(GIT_COMMIT_ENV_VAR)
    commit = source_commit()   # this checkout is a git repository: a 40-hex commit, maybe +dirty
    assert len(commit.removesuffix("+dirty")) == 40 and int(commit.removesuffix("+dirty"), 16) >= 0
