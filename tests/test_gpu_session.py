"""The GPU session (course_lib.gpu_session): the plan against the registry and the committed records, estimates
and resumption read from records, and `run` on a GPU faked by monkeypatching torch's CUDA queries, with the
experiment runner stubbed (it writes a record as `python -m course_lib.record` would; nothing real runs)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import course_lib.experiments as E
import course_lib.gpu_session as G
from course_lib.results import Provenance, Record, load_records, save_record
from course_lib.studies.lesson_times import LessonTimes, lesson_names, lesson_times, lesson_times_parameters

H200 = "NVIDIA H200"
_clock = iter(range(10**6))


def _record(experiment, seconds, *, device=H200, overrides=None, lessons=None, size="full", device_type="cuda",
            model="today's"):
    gpu = device_type == "cuda"
    if model == "today's":   # what record_output stores: the course model, unless the experiment trains none
        model = None if experiment in G.NO_COURSE_MODEL else G.FULL_MODEL
    minute = next(_clock)
    prov = Provenance(device_name=device, device_type=device_type, torch_version="2.11.0",
                      date=f"2026-12-01T{minute // 60 % 24:02d}:{minute % 60:02d}:00+00:00",
                      command=f"python -m course_lib.record {experiment}", git_commit="abc", python_version="3.12.3",
                      compute_capability="9.0" if gpu else None, cuda_version="13.0" if gpu else None)
    values = {"result": {"profile": size, "device_type": device_type,
                         "lessons": [{"lesson": n, "seconds": s, "passed": True, "code_cells": 1}
                                     for n, s in (lessons or {}).items()]}}
    parameters = {"profile": size, "size": size, "seconds": seconds, **({"course_model": model} if model else {}),
                  **({"overrides": overrides} if overrides else {})}
    return Record(experiment=experiment, parameters=parameters, values=values, provenance=prov)


def _save(folder, *records):
    for r in records:
        save_record(r, folder, log_text="log\n")
    return load_records(results_dir=folder)


@pytest.fixture
def registered(monkeypatch):
    """The registry with lesson_times in it, as the snippet in the report registers it."""
    if "lesson_times" not in E.EXPERIMENTS:
        monkeypatch.setitem(E.EXPERIMENTS, "lesson_times", E.Experiment(
            "lesson_times", "lesson wall times", lesson_times, LessonTimes, lesson_times_parameters,
            requires_cuda=True))
    return E.EXPERIMENTS


def test_the_plan_covers_every_registered_experiment_and_lesson(registered):
    records = load_records()   # the committed records: estimates come from their durations
    lessons = lesson_names()
    parts = G.plan_parts(lessons, records)
    assert G.plan_problems(parts, records, sorted(registered), lessons) == []
    # the experiment parts keep their H100 durations inside a part
    first = G.estimate(G.Step("convergence_parity"), records)
    assert first.source.startswith("NVIDIA") and first.seconds > 60


def test_a_new_experiment_unplanned_is_a_problem(registered, monkeypatch):
    lessons = lesson_names()
    records = load_records()
    parts = G.plan_parts(lessons, records)
    names = [*registered, "a_new_experiment"]
    assert G.plan_problems(parts, records, names, lessons) == [
        "experiment 'a_new_experiment' is registered but neither planned nor skipped"]
    assert G.plan_problems(parts, records, names, lessons, skipped={**G.SKIPPED, "a_new_experiment": "needs 8 GPUs"}) == []
    assert G.plan_problems(parts, records, names, lessons, skipped={**G.SKIPPED, "a_new_experiment": " "}) == [
        "experiment 'a_new_experiment' is skipped without a reason"]
    assert G.plan_problems(parts, records, [*registered], lessons, skipped={**G.SKIPPED, "fp8_compiled_speed": "x"}) == [
        "experiment 'fp8_compiled_speed' is both planned and skipped"]
    # pieces of one experiment with different overrides are fine; the same piece twice is not
    ladder = [G.Part(90, (G.Step("scale_ladder", {"rungs": ["a"]}),)), G.Part(91, (G.Step("scale_ladder", {"rungs": ["b"]}),))]
    assert G.plan_problems([*parts, *ladder], records, registered, lessons) == []
    twice = [*parts, *ladder, G.Part(92, (G.Step("scale_ladder", {"rungs": ["a"]}),))]
    assert G.plan_problems(twice, records, registered, lessons) == ['step scale_ladder {"rungs": ["a"]} is planned more than once']
    unregistered = [*parts, G.Part(93, (G.Step("not_registered"),))]
    assert G.plan_problems(unregistered, records, [*registered], lessons) == [
        "experiment 'not_registered' is planned but not registered"]


def test_lessons_are_each_timed_once_and_parts_stay_under_the_limit(registered):
    records = load_records()
    parts = G.plan_parts(["01_a", "02_b", "03_c", "04_d"], records)
    lesson_parts = [p for p in parts if p.steps[0].experiment == "lesson_times"]
    # never timed, each lesson counts its limit and a kernel's start: two fit a part
    assert G.DEFAULT_LESSON_S == 250.0
    assert [list(p.steps[0].overrides["lessons"]) for p in lesson_parts] == [["01_a", "02_b"], ["03_c", "04_d"]]
    assert G.plan_problems(parts, records, sorted(registered), ["01_a", "02_b", "03_c"]) == [
        "'04_d' is timed but is no lesson"]
    assert G.plan_problems(parts, records, sorted(registered), ["01_a", "02_b", "03_c", "04_d", "05_e"]) == [
        "lesson '05_e' is not timed"]
    again = [*parts, G.Part(99, (G.lesson_step(["02_b"]),))]
    assert G.plan_problems(again, records, sorted(registered), ["01_a", "02_b", "03_c", "04_d"]) == [
        "lesson '02_b' is timed 2 times"]
    slow = [G.Part(1, tuple(G.Step(n) for n in ("a", "b", "c", "d")))]
    assert G.plan_problems(slow, [], ["a", "b", "c", "d"], []) == ["part 1 is estimated at 720 s, over 540 s"]
    # a lesson estimated over the limit gets a part of its own, which is not a problem of the plan
    alone = [G.Part(1, (G.lesson_step(["01_a"]),))]
    long = _record("lesson_times", 900.0, overrides={"lessons": ["01_a"]}, lessons={"01_a": 900.0})
    assert G.plan_problems(alone, [long], ["lesson_times"], ["01_a"]) == []


def test_estimates_come_from_records_this_gpus_first(tmp_path):
    records = _save(tmp_path, _record("fp8_training", 300.0, device="NVIDIA H100 80GB HBM3"),
                    _record("fp8_training", 200.0),
                    _record("fp8_training", 10.0, size="small"),
                    _record("fp8_training", 5.0, device="cpu", device_type="cpu"),
                    _record("scale_ladder", 400.0, overrides={"rungs": ["big"]}),
                    _record("lesson_times", 99.0, overrides={"lessons": ["01_a", "02_b"]},
                            lessons={"01_a": 30.0, "02_b": 60.0}))
    assert G.estimate(G.Step("fp8_training"), records, H200) == G.Estimate(200.0, H200)
    assert G.estimate(G.Step("fp8_training"), records, "NVIDIA H100 80GB HBM3").seconds == 300.0
    assert G.estimate(G.Step("mx_training"), records, H200) == G.Estimate(G.DEFAULT_STEP_S, "default")
    assert G.estimate(G.Step("scale_ladder", {"rungs": ["big"]}), records).seconds == 400.0
    assert G.estimate(G.Step("scale_ladder", {"rungs": ["small"]}), records).source == "default"
    both = G.estimate(G.lesson_step(["02_b", "03_c"]), records, H200)
    assert both == G.Estimate(60.0 + G.DEFAULT_LESSON_S, f"{H200}, default")
    # packing by those estimates: 30 + 60 s fit with default-estimated lessons up to the limit
    parts = G.plan_parts(["01_a", "02_b", "03_c", "04_d", "05_e"], records, H200)
    lesson_parts = parts[:len(parts) - len(G.EXPERIMENT_PARTS) - len(G.RERECORD_PARTS)]
    assert [list(p.steps[0].overrides["lessons"]) for p in lesson_parts] == [
        ["01_a", "02_b", "03_c"], ["04_d", "05_e"]]


def test_done_is_read_from_this_gpus_full_size_records(tmp_path):
    records = _save(tmp_path, _record("fp8_training", 1.0, device="NVIDIA H100 80GB HBM3"),
                    _record("mx_training", 1.0, size="small"),
                    _record("data_loading", 1.0),
                    _record("scale_ladder", 1.0, overrides={"rungs": ["a"]}),
                    _record("lesson_times", 1.0, overrides={"lessons": ["01_a"]}, lessons={"01_a": 1.0}),
                    _record("monitor_faults", 1.0, model=None),
                    _record("underflow_statistics", 1.0, model={**G.FULL_MODEL, "d_model": 384}),
                    _record("clipping_runs", 1.0, model=None),   # trains an MLP: no course model to match
                    _record("lesson_times", 1.0, overrides={"lessons": ["03_c"]}, lessons={"03_c": 1.0}, model=None))
    assert G.pending(G.Step("data_loading"), records, H200) is None
    # made at an earlier full profile (no course model stored, or another): to be recorded again, and its time
    # still serves as an estimate
    assert G.pending(G.Step("monitor_faults"), records, H200) == G.Step("monitor_faults")
    assert G.pending(G.Step("underflow_statistics"), records, H200) == G.Step("underflow_statistics")
    assert G.pending(G.Step("clipping_runs"), records, H200) is None
    assert G.pending(G.lesson_step(["03_c"]), records, H200) == G.lesson_step(["03_c"])
    assert G.estimate(G.Step("monitor_faults"), records, H200) == G.Estimate(1.0, H200)
    assert G.pending(G.Step("fp8_training"), records, H200) == G.Step("fp8_training")   # another GPU's
    assert G.pending(G.Step("mx_training"), records, H200) == G.Step("mx_training")     # small size
    assert G.pending(G.Step("data_loading"), records, None) == G.Step("data_loading")  # no GPU here
    assert G.pending(G.Step("scale_ladder", {"rungs": ["a"]}), records, H200) is None
    assert G.pending(G.Step("scale_ladder", {"rungs": ["b"]}), records, H200) is not None
    # a lessons step: only the lessons not yet timed on this GPU, whichever record timed them
    assert G.pending(G.lesson_step(["01_a", "02_b"]), records, H200) == G.lesson_step(["02_b"])
    assert G.pending(G.lesson_step(["01_a"]), records, H200) is None
    text = G.plan_text([G.Part(1, (G.Step("data_loading"), G.Step("fp8_training")))], records, H200)
    assert text.splitlines()[:4] == [f"GPU: {H200}", "part 1: about 0.0 min, 1/2 steps done",
                                     f"  [done] data_loading: 1 s ({H200})",
                                     "  [to do] fp8_training: 1 s (NVIDIA H100 80GB HBM3)"]


def test_a_step_runs_as_a_record_command():
    step = G.Step("scale_ladder", {"rungs": ("gpt2-small",), "steps": 5})
    assert step.record_args("out") == ["scale_ladder", "--out", "out", "--param", 'rungs=["gpt2-small"]',
                                       "--param", "steps=5"]
    assert step.label == 'scale_ladder rungs=["gpt2-small"] steps=5'
    with pytest.raises(ValueError, match="names an experiment"):
        G.Step("")
    with pytest.raises(TypeError, match="mapping"):
        G.Step("x", [("a", 1)])


def _fake_runner(calls, *, fail=()):
    """Stands in for `python -m course_lib.record ARGS`: writes the record it would, with the estimate's time."""
    def run(args, timeout_s):
        calls.append(args)
        name, out = args[0], args[2]
        if name in fail:
            return 1
        overrides = {a.split("=", 1)[0]: json.loads(a.split("=", 1)[1]) for a in args[4::2] if "=" in a}
        lessons = {n: 10.0 for n in overrides.get("lessons", [])}
        save_record(_record(name, 12.0, overrides=overrides, lessons=lessons), out, log_text="log\n")
        return 0
    return run


def test_run_part_stops_before_a_step_past_the_budget(tmp_path):
    calls, now = [], [0.0]
    part = G.Part(1, (G.Step("a"), G.Step("b"), G.Step("c")))

    def runner(args, timeout_s):
        now[0] += G.DEFAULT_STEP_S   # each step takes its estimate
        assert timeout_s == pytest.approx(500 - now[0] + G.DEFAULT_STEP_S)
        return _fake_runner(calls)(args, timeout_s)

    said = []
    status = G.run_part(part, results=tmp_path / "results", out=tmp_path / "out", device_name=H200, budget_s=500,
                        runner=runner, say=said.append, clock=lambda: now[0])
    assert status == "stopped" and [c[0] for c in calls] == ["a", "b"]
    assert said[-1] == "stopping before c: about 180 s, 140 s left of the budget"
    # the next call resumes: a and b are done, c runs
    now[0] = 0.0
    assert G.run_part(part, results=tmp_path / "results", out=tmp_path / "out", device_name=H200, budget_s=500,
                      runner=runner, say=said.append, clock=lambda: now[0]) == "done"
    assert [c[0] for c in calls] == ["a", "b", "c"] and said[-3:-1] == ["done already: a", "done already: b"]


def test_a_failing_step_does_not_stop_the_others(tmp_path):
    calls = []
    part = G.Part(1, (G.Step("a"), G.Step("b")))
    status = G.run_part(part, results=tmp_path, out=tmp_path, device_name=H200, budget_s=500,
                        runner=_fake_runner(calls, fail={"a"}), say=lambda line: None)
    assert status == "failed" and [c[0] for c in calls] == ["a", "b"]
    assert G.run_part(part, results=tmp_path, out=tmp_path, device_name=H200, budget_s=500,
                      runner=lambda a, t: 124, say=lambda line: None) == "stopped"


def _first_experiment_part(records=None) -> int:
    """The number of the plan's first experiment part, after the lessons' parts (as many as the lessons'
    estimates from ``records``, default the committed ones, need)."""
    parts = G.plan_parts(lesson_names(), load_records() if records is None else records)
    return len(parts) - len(G.EXPERIMENT_PARTS) - len(G.RERECORD_PARTS) + 1


@pytest.fixture
def fake_h200(monkeypatch):
    """torch's CUDA queries answering as an H200 would (the pattern of tests/test_cuda_branches.py)."""
    props = SimpleNamespace(name=H200, major=9, minor=0, total_memory=141 << 30, multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index=0: props)
    monkeypatch.setattr(torch.version, "cuda", "13.0")


def test_run_next_records_every_part_then_says_so(registered, fake_h200, monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(G, "run_record", _fake_runner(calls))
    results, out = tmp_path / "results", tmp_path / "out"
    results.mkdir()
    _save(results, _record("convergence_parity", 400.0))   # done in an earlier session on this GPU
    assert G.main(["run", "--next", "--results", str(results), "--out", str(out)]) == 0
    names = [c[0] for c in calls]
    # the lessons first (they record what they run), then what no GPU has recorded, what an H100 recorded last
    lessons_end = len(names) - names[::-1].index("lesson_times")
    assert set(names[:lessons_end]) == {"lesson_times"} and names[lessons_end] == "scale_ladder"
    assert "convergence_parity" not in names
    assert names.index("data_parallel") < names.index("tf32_matmul_rounding")
    assert sorted(set(names)) == sorted(set(registered) - {"convergence_parity"} - set(G.SKIPPED))
    timed = [lesson for c in calls if c[0] == "lesson_times" for lesson in json.loads(c[4].split("=", 1)[1])]
    assert timed == list(lesson_names())
    assert capsys.readouterr().out.splitlines()[-1] == f"parts with something left on {H200}: 0"
    assert G.main(["run", "--next", "--results", str(results), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"every part is done on {H200}"
    assert G.main(["plan", "--results", str(results), "--out", str(out)]) == 0
    assert "0/" not in capsys.readouterr().out


def test_run_one_part_and_refusals(registered, fake_h200, monkeypatch, tmp_path, capsys):
    calls = []
    monkeypatch.setattr(G, "run_record", _fake_runner(calls, fail={"scale_ladder"}))
    first = _first_experiment_part()
    assert G.main(["run", "--part", str(first + 2), "--results", str(tmp_path)]) == 1
    assert [c[0] for c in calls] == [s.experiment for s in G.EXPERIMENT_PARTS[2]]
    assert G.main(["run", "--part", "99", "--results", str(tmp_path)]) == 2
    assert "--part must be 1.." in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert G.main(["run", "--next", "--results", str(tmp_path)]) == 2
    assert "refusing to run on a CPU" in capsys.readouterr().err


def test_a_step_that_overran_or_failed_is_noted_passed_over_by_next_and_retried_by_part(
        registered, fake_h200, monkeypatch, tmp_path, capsys):
    """Without the note, every `run --next` would start the same overrunning step again and never reach the
    parts after it; `--part N` tries it again."""
    calls = []
    fake = _fake_runner(calls, fail={"fp8_linear_speed"})

    def runner(args, timeout_s):   # the first ladder piece runs past the budget; fp8_linear_speed fails
        if args[0] == "scale_ladder" and "--param" not in args:
            calls.append(args)
            return 124
        return fake(args, timeout_s)

    monkeypatch.setattr(G, "run_record", runner)
    results = tmp_path / "results"
    results.mkdir()
    assert G.main(["run", "--next", "--results", str(results)]) == 3          # stopped at the budget
    notes = G.read_attempts(results)
    assert [(n["step"], n["device"], n["outcome"]) for n in notes] == [("scale_ladder", H200, "overran")]
    assert "lesson_times" in [c[0] for c in calls]                              # the lessons ran first
    calls.clear()
    assert G.main(["run", "--next", "--results", str(results)]) == 1          # went on; one step failed
    out = capsys.readouterr().out
    first = _first_experiment_part(G._records(results))   # the lessons, timed now, fill fewer parts
    assert "passing over scale_ladder: overran on" in out and f"run --part {first} to try it again" in out
    assert ["scale_ladder"] not in [c[:1] for c in calls if "--param" not in c]
    assert "monitor_faults" in [c[0] for c in calls]                            # the later parts ran
    assert [n["outcome"] for n in G.read_attempts(results)] == ["overran", "failed (exit 1)"]
    # nothing else is left: --next says what failed before instead of starting it again
    assert G.main(["run", "--next", "--results", str(results)]) == 1
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"every part is done on {H200}, but for 2 step(s)") and "fp8_linear_speed" in last
    assert G.main(["plan", "--results", str(results)]) == 0
    assert "[to do; overran on " in capsys.readouterr().out
    # another GPU has no such note; --part retries here
    assert G.failed_before(G.Step("scale_ladder"), G.read_attempts(results), "another GPU") is None
    calls.clear()
    monkeypatch.setattr(G, "run_record", _fake_runner(calls))
    assert G.main(["run", "--part", str(first), "--results", str(results)]) == 0
    assert calls[0][0] == "scale_ladder" and "--param" not in calls[0]


def test_a_lessons_step_asks_its_lessons_to_record_what_they_run(tmp_path):
    env = G.lesson_record_env(G.lesson_step(["07_fp8"]).record_args(tmp_path / "out"))
    assert env == {G.RECORD_DIR_ENV: str((tmp_path / "out").resolve()),
                   G.RECORD_COMMAND_ENV: "python -m course_lib.record lesson_times --out "
                                         f"{tmp_path / 'out'} --param 'lessons=[\"07_fp8\"]'"}
    assert G.lesson_record_env(G.Step("fp8_training").record_args(tmp_path)) == {}
    assert G.lesson_record_env([]) == {}


def test_a_lessons_run_of_every_recipe_covers_the_one_recipe_pieces(tmp_path):
    """A lesson at the full profile trains every FP8 recipe in one run; the GPU session's one-recipe steps of
    fp8_training are then done. A piece that ran other recipes, or other overrides, does not count."""
    def trained(recipes, overrides=None):
        r = _record("fp8_training", 1.0, overrides=overrides)
        return Record(r.experiment, r.parameters, {"result": {"recipes": recipes, "seeds": [0]}}, r.provenance)

    whole = trained(["bf16_autocast", "tensorwise", "rowwise"])
    one = G.Step("fp8_training", {"recipes": ["rowwise"]})
    assert G.covers(whole, one) and G.covers(whole, G.Step("fp8_training", {"recipes": ["tensorwise", "rowwise"]}))
    assert not G.covers(whole, G.Step("fp8_training", {"recipes": ["delayed"]}))
    assert not G.covers(whole, G.Step("fp8_training", {"recipes": ["rowwise"], "steps": 10}))
    assert not G.covers(trained(["rowwise"], {"recipes": ["rowwise"], "steps": 10}), one)
    assert G.covers(trained(["rowwise"], {"recipes": ["rowwise"]}), one)
    # a result without a list of recipes covers only the same overrides
    plain = _record("scale_ladder", 1.0)
    assert G.covers(plain, G.Step("scale_ladder")) and not G.covers(plain, G.Step("scale_ladder", {"recipes": ["fp32"]}))
    records = _save(tmp_path, whole)
    assert G.pending(one, records, H200) is None
    assert G.pending(G.Step("fp8_training", {"recipes": ["delayed"]}), records, H200) is not None
