"""course_lib.record: the status page's table of lessons executed by nbmake (executed_notebooks_markdown), from
notebooks written by hand with nbclient's timing metadata; and ``--param KEY=JSON`` on a fake registered
experiment."""

import json
from dataclasses import dataclass

import pytest

import course_lib.experiments as E
from course_lib.device import SizeProfile
from course_lib.record import NO_NBMAKE_RUNS, executed_notebooks_markdown, main, parse_overrides
from course_lib.results import load_records


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
    # never empty: IPython shows an empty Markdown as "<IPython.core.display.Markdown object>"
    assert executed_notebooks_markdown([plain]) == executed_notebooks_markdown([]) == NO_NBMAKE_RUNS
    assert "executed every page itself" in NO_NBMAKE_RUNS
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


# ---- python -m course_lib.record --param KEY=JSON ------------------------------------------------------


@dataclass(frozen=True)
class Ladder:
    rungs: tuple[str, ...]
    steps: int


def _ladder(profile, device, *, rungs, steps, **extra):
    assert isinstance(rungs, tuple), "a JSON list arrives as the tuple the registry gives"
    return Ladder(rungs=rungs, steps=steps)


@pytest.fixture
def ladder(monkeypatch):
    exp = E.Experiment("ladder", "a fake ladder", _ladder, Ladder,
                       lambda profile, device: {"rungs": ("tiny", "small"), "steps": profile.pick(small=3, full=9)})
    monkeypatch.setitem(E.EXPERIMENTS, "ladder", exp)
    return exp


def test_overrides_are_checked_against_the_study(ladder):
    small = SizeProfile("small")
    assert parse_overrides(ladder, ['rungs=["gpt2-small"]', "steps=5"], small, "cpu") == {
        "rungs": ("gpt2-small",), "steps": 5}
    with pytest.raises(ValueError, match=r"'ladder' has no parameter 'rung'; its parameters: rungs, steps"):
        parse_overrides(ladder, ['rung=["x"]'], small, "cpu")
    with pytest.raises(ValueError, match="is not JSON"):
        parse_overrides(ladder, ["rungs=[gpt2]"], small, "cpu")
    with pytest.raises(ValueError, match="takes KEY=JSON"):
        parse_overrides(ladder, ["rungs"], small, "cpu")
    with pytest.raises(ValueError, match="given twice"):
        parse_overrides(ladder, ["steps=1", "steps=2"], small, "cpu")


def test_a_study_without_that_keyword_refuses_it(monkeypatch):
    exp = E.Experiment("plain", "no parameters", lambda profile, device: Ladder((), 0), Ladder)
    with pytest.raises(ValueError, match="'plain' has no parameter 'steps'; its parameters: none"):
        parse_overrides(exp, ["steps=1"], SizeProfile("small"), "cpu")


def test_a_record_keeps_the_overridden_parameters(ladder, tmp_path, capsys):
    code = main(["ladder", "--out", str(tmp_path), "--allow-cpu", "--size", "small", "--param", 'rungs=["gpt2-small"]'])
    assert code == 0
    (record,) = load_records(results_dir=tmp_path)
    assert record.parameters["rungs"] == ["gpt2-small"] and record.parameters["steps"] == 3
    assert record.parameters["overrides"] == {"rungs": ["gpt2-small"]}
    assert record.values["result"] == {"rungs": ["gpt2-small"], "steps": 3}
    assert "--param 'rungs=[\"gpt2-small\"]'" in record.provenance.command
    # without --param the record says nothing of overrides
    assert main(["ladder", "--out", str(tmp_path / "plain"), "--allow-cpu", "--size", "small"]) == 0
    assert "overrides" not in load_records(results_dir=tmp_path / "plain")[0].parameters


def test_param_needs_exactly_one_experiment(ladder, tmp_path, capsys):
    assert main(["ladder", "autocast_trace", "--allow-cpu", "--out", str(tmp_path), "--param", "steps=1"]) == 2
    assert main(["--all", "--allow-cpu", "--out", str(tmp_path), "--param", "steps=1"]) == 2
    assert main(["ladder", "--allow-cpu", "--out", str(tmp_path), "--param", "nope=1"]) == 2
    err = capsys.readouterr().err
    assert "name exactly one experiment" in err and "has no parameter 'nope'" in err
    assert not list(tmp_path.iterdir())


def test_course_models_table_gives_each_profiles_model_and_the_earlier_full_one():
    from course_lib.device import SizeProfile
    from course_lib.models import gpt_config_for
    from course_lib.record import course_models_markdown
    from course_lib.results import EARLIER_FULL_MODEL

    rows = {line.split(" | ")[0].strip("| `"): line for line in course_models_markdown().splitlines()[2:]}
    full = gpt_config_for(SizeProfile("full"))
    assert rows["full"] == (f"| `full` | {full.d_model} | {full.n_layers} | {full.n_heads} | {full.context} | 64 | "
                            f"{full.parameter_count() / 1e6:.2f} M |")
    assert rows["small"].startswith("| `small` | 64 | 2 | 2 | 64 | 16 | ")
    earlier = rows["full` before 2026-11-25"]
    assert f"| {EARLIER_FULL_MODEL['d_model']} | {EARLIER_FULL_MODEL['n_layers']} |" in earlier
    from course_lib.models import GPTConfig
    shape = {k: EARLIER_FULL_MODEL[k] for k in ("d_model", "n_layers", "n_heads", "context")}
    assert earlier.endswith(f"| {GPTConfig(**shape).parameter_count() / 1e6:.2f} M |")
