import dataclasses
import json
import math

import pytest

from course_lib import record as R
from course_lib.device import SizeProfile
from course_lib.results import (Provenance, Record, RecordError, capture_provenance, describe_records,
                                load_record, load_records, save_record, to_jsonable)


def make_record(**prov_overrides):
    prov = dict(device_name="NVIDIA H200", device_type="cuda", torch_version="2.11.0",
                date="2026-11-21T10:00:00+00:00", command="python -m course_lib.record x",
                git_commit="abc123", python_version="3.12.3", compute_capability="9.0", cuda_version="13.0")
    prov.update(prov_overrides)
    return Record(experiment="demo", parameters={"n": 3}, values={"x": [1.0, math.inf, math.nan]},
                  provenance=Provenance(**prov))


def test_roundtrip_with_log(tmp_path):
    path = save_record(make_record(), tmp_path, log_text="raw output\n")
    assert path.name == "demo__nvidia-h200__20261121T100000.json"
    assert path.with_suffix(".log").read_text() == "raw output\n"
    back = load_record(path)
    assert back.experiment == "demo" and back.parameters == {"n": 3}
    assert back.values["x"][:2] == [1.0, math.inf] and math.isnan(back.values["x"][2])
    assert back.provenance.compute_capability == "9.0" and back.log_file == path.with_suffix(".log").name
    assert back.label == "NVIDIA H200 (sm 9.0)"
    json.loads(path.read_text())  # strict JSON: no NaN/Infinity literals


@pytest.mark.parametrize("field", ["device_name", "torch_version", "date", "command", "git_commit"])
def test_loading_refuses_missing_provenance(tmp_path, field):
    path = save_record(make_record(), tmp_path)
    data = json.loads(path.read_text())
    del data["provenance"][field]
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match=f"provenance lacks {field}"):
        load_record(path)


def test_gpu_record_needs_capability_and_cuda_version(tmp_path):
    with pytest.raises(RecordError, match="GPU record must give compute_capability"):
        save_record(make_record(compute_capability=None), tmp_path)


def test_missing_log_and_bad_json_are_errors(tmp_path):
    path = save_record(make_record(), tmp_path, log_text="x")
    path.with_suffix(".log").unlink()
    with pytest.raises(RecordError, match="raw log .* is missing"):
        load_record(path)
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(RecordError, match="not valid JSON"):
        load_record(bad)
    bad.write_text(json.dumps({"experiment": "x", "parameters": {}, "values": {}}))
    with pytest.raises(RecordError, match="lacks 'provenance'"):
        load_record(bad)


def test_load_records_filters_and_sorts(tmp_path):
    save_record(make_record(date="2026-01-01T00:00:00+00:00"), tmp_path)
    save_record(make_record(date="2026-02-01T00:00:00+00:00"), tmp_path)
    save_record(make_record(device_type="cpu", device_name="cpu box", compute_capability=None,
                            cuda_version=None), tmp_path)
    assert [r.provenance.date[:7] for r in load_records("demo", tmp_path, device_type="cuda")] == \
        ["2026-02", "2026-01"]
    assert len(load_records("demo", tmp_path)) == 3
    assert load_records("other", tmp_path) == []
    assert "NVIDIA H200" in describe_records(load_records("demo", tmp_path))
    assert "No recorded result" in describe_records([])


def test_a_record_says_the_size_it_ran_at():
    from course_lib.device import SizeProfile
    from course_lib.models import profile_model
    from course_lib.results import record_size_text
    plain = make_record()
    assert record_size_text(plain) == "" and describe_records([plain]).endswith("`python -m course_lib.record x`")
    old = dataclasses.replace(plain, parameters={"size": "full", "steps": 1000})
    assert record_size_text(old) == ("an earlier full profile, a narrower course model than today's (384 "
                                     "wide, 6 layers, 6 heads, context 256, batch 64; see {doc}`the setup page </book/setup>`)")
    assert describe_records([old]).endswith("`python -m course_lib.record x`; " + record_size_text(old))
    assert old.course_model == {"d_model": 384, "n_layers": 6, "n_heads": 6, "context": 256, "batch": 64}
    assert plain.course_model is None
    # an experiment that trains no course model names none, before the re-size or after
    sweep = dataclasses.replace(old, experiment="matmul_throughput")
    assert sweep.course_model is None and record_size_text(sweep) == "full profile"
    new = dataclasses.replace(plain, parameters={"profile": "full", "size": "full",
                                                 "course_model": profile_model(SizeProfile("full"))})
    assert record_size_text(new) == "full profile, course model 512 wide, 6 layers, 8 heads, context 256, batch 64"
    assert record_size_text(dataclasses.replace(plain, parameters={"size": "small"})) == "small profile"
    with pytest.raises(RecordError, match="course_model must name d_model"):
        record_size_text(dataclasses.replace(plain, parameters={"size": "full", "course_model": {"d_model": 8}}))


def test_to_jsonable_rejects_unknown_objects():
    with pytest.raises(TypeError, match="cannot store a object"):
        to_jsonable(object())


def test_capture_provenance_needs_a_command(monkeypatch):
    monkeypatch.setenv("COURSE_GIT_COMMIT", "deadbeef")
    prov = capture_provenance("python -m x", "cpu")
    assert prov.git_commit == "deadbeef" and prov.device_type == "cpu" and prov.cuda_version is None
    with pytest.raises(ValueError, match="exact command"):
        capture_provenance("  ", "cpu")


def test_record_cli_writes_record_and_log(tmp_path, capsys):
    status = R.main(["model_magnitudes", "--size", "small", "--device", "cpu", "--allow-cpu",
                     "--out", str(tmp_path)])
    assert status == 0
    (rec,) = load_records("model_magnitudes", tmp_path)
    assert rec.provenance.command.startswith("python -m course_lib.record model_magnitudes")
    assert rec.parameters["size"] == "small" and rec.parameters["seconds"] > 0
    log = (tmp_path / rec.log_file).read_text()
    assert "experiment 1/1: model_magnitudes" in log and "finished in" in log
    from course_lib.experiments import get_experiment
    mags = get_experiment("model_magnitudes").load(rec)        # the record reads back as the lesson's type
    assert rec.schema_version == 2 and set(rec.values) == {"result"}
    assert mags.steps == rec.values["result"]["steps"] and mags.histograms["weights"].nonzero > 0


def test_record_all_runs_what_the_device_can_and_keeps_going_after_a_failure(tmp_path, capsys, monkeypatch):
    from course_lib import experiments as E

    def ok(profile, device):
        return {"x": 2.0}

    def broken(profile, device):
        raise RuntimeError("planted")

    fake = {"a_ok": E.Experiment("a_ok", "fine", ok, dict), "b_broken": E.Experiment("b_broken", "fails", broken, dict),
            "c_gpu": E.Experiment("c_gpu", "GPU only", ok, dict, requires_cuda=True),
            "d_ok": E.Experiment("d_ok", "fine", ok, dict)}
    monkeypatch.setattr(E, "EXPERIMENTS", fake)
    monkeypatch.setattr(R, "EXPERIMENTS", fake)
    status = R.main(["--all", "--size", "small", "--device", "cpu", "--allow-cpu", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 1 and "experiment 2/3: b_broken" in out and "c_gpu" not in out
    assert sorted(p.name.split("__")[0] for p in tmp_path.glob("*.json")) == ["a_ok", "d_ok"]
    assert R.main(["--all", "a_ok", "--out", str(tmp_path)]) == 2


def test_run_experiment_records_its_run_where_the_environment_names_a_folder(tmp_path, monkeypatch, capsys):
    """What a lesson's kernel does when the GPU session executes it (gpu_session.lesson_record_env): the run is
    saved as a record naming the session's command and the lesson, and the lesson gets the run's result."""
    from course_lib import experiments as E
    from course_lib.studies.lesson_times import LESSON_ENV, RECORD_COMMAND_ENV, RECORD_DIR_ENV

    calls = []

    def study(profile, device, *, width):
        calls.append((profile.name, width))
        return {"x": float(len(calls))}

    fake = E.Experiment("a_study", "fake", study, dict, parameters=lambda profile, device: {"width": 8})
    monkeypatch.setitem(E.EXPERIMENTS, "a_study", fake)
    assert E.run_experiment("a_study", SizeProfile("small"), "cpu") == {"x": 1.0}   # no folder named: no record
    assert list(tmp_path.glob("*")) == []
    monkeypatch.setenv(RECORD_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(RECORD_COMMAND_ENV, "python -m course_lib.record lesson_times --out x")
    monkeypatch.setenv(LESSON_ENV, "07_fp8.md")
    assert E.run_experiment("a_study", SizeProfile("full", forced=True), "cpu") == {"x": 2.0}
    assert calls == [("small", 8), ("full", 8)]
    (rec,) = load_records("a_study", tmp_path)
    assert rec.provenance.command == ("python -m course_lib.record lesson_times --out x "
                                      "(executing lessons/07_fp8.md: run_experiment('a_study'))")
    assert rec.values == {"result": {"x": 2.0}} and "overrides" not in rec.parameters
    assert rec.parameters["size"] == "full" and rec.parameters["width"] == 8 and rec.parameters["seconds"] >= 0
    assert "values: " in (tmp_path / rec.log_file).read_text()
    # a run that raises records nothing, and the lesson sees the error
    monkeypatch.setitem(E.EXPERIMENTS, "a_study", E.Experiment("a_study", "fake", lambda p, d: 1 / 0, dict))
    with pytest.raises(ZeroDivisionError):
        E.run_experiment("a_study", SizeProfile("small"), "cpu")
    assert len(load_records("a_study", tmp_path)) == 1


def test_record_cli_refusals(tmp_path, capsys):
    assert R.main(["model_magnitudes", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "refusing to record on a CPU" in capsys.readouterr().err
    assert R.main(["nope", "--out", str(tmp_path)]) == 2
    assert "unknown experiment 'nope'" in capsys.readouterr().err
    assert R.main([]) == 2
    # a GPU-only experiment on the CPU fails clearly and records nothing
    assert R.main(["tf32_matmul_rounding", "--size", "small", "--device", "cpu", "--allow-cpu",
                   "--out", str(tmp_path)]) == 1
    assert "needs a CUDA GPU" in capsys.readouterr().out
    assert list(tmp_path.glob("*.json")) == []
    assert R.main(["--list"]) == 0
    assert "tf32_matmul_rounding (needs CUDA)" in capsys.readouterr().out


def test_committed_results_all_load():
    """Every record committed under results/ must validate (provenance, raw log)."""
    from pathlib import Path
    folder = Path(__file__).resolve().parents[1] / "results"
    for rec in load_records(results_dir=folder):
        assert rec.provenance.device_type == "cuda"


def test_load_records_from_a_named_folder_that_does_not_exist(tmp_path):
    from course_lib.results import load_records

    with pytest.raises(ValueError, match="does not exist"):
        load_records("x", results_dir=tmp_path / "nope")


def test_schema_version_must_be_an_int(tmp_path):
    from course_lib.results import load_record

    path = save_record(make_record(), tmp_path)
    data = json.loads(path.read_text())
    data["schema_version"] = "1"
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="'schema_version' must be an int"):
        load_record(path)


def test_records_status_lists_every_experiment_and_its_records(tmp_path):
    from course_lib.experiments import EXPERIMENTS
    from course_lib.record import records_status_markdown

    import dataclasses

    save_record(dataclasses.replace(make_record(), experiment="model_magnitudes"), tmp_path)
    # a full-size record of the course model from before the re-size (no stored course_model) is marked
    save_record(dataclasses.replace(make_record(), experiment="convergence_parity", parameters={"size": "full"}),
                tmp_path)
    table = records_status_markdown(tmp_path)
    assert all(f"`{name}`" in table for name in EXPERIMENTS)
    assert "| `model_magnitudes` | no | NVIDIA H200 (sm 9.0), " in table
    assert "narrower" not in table.split("`model_magnitudes`")[1].split("\n")[0]
    assert ("| `convergence_parity` | no | NVIDIA H200 (sm 9.0), " in table and
            " (before 2026-11-25: the narrower course model) |" in table.split("`convergence_parity`")[1].split("\n")[0])
    assert "| `autocast_trace` | yes | not yet |" in table
    assert "record model_magnitudes --out" in describe_records([], "model_magnitudes")


def test_records_status_marks_records_of_code_changed_since(tmp_path):
    """A record dated before a registered change to the code it measured is flagged with what it measured;
    one made on or after the change's day is not."""
    import dataclasses

    from course_lib.experiments import get_experiment
    from course_lib.record import records_status_markdown

    change = get_experiment("monitor_overhead").code_changes[0]
    for day in ("2026-11-21", change.since):
        rec = dataclasses.replace(make_record(date=f"{day}T10:00:00+00:00"), experiment="monitor_overhead",
                                  parameters={"course_model": {}})
        save_record(rec, tmp_path / day)
    old_row = records_status_markdown(tmp_path / "2026-11-21").split("`monitor_overhead`")[1].split("\n")[0]
    new_row = records_status_markdown(tmp_path / change.since).split("`monitor_overhead`")[1].split("\n")[0]
    assert f"(older code: {change.what})" in old_row and "one transfer per sampled step" in old_row
    assert "older code" not in new_row and change.since in new_row
    # a record both of the narrower model and of older code says both in one parenthesis
    both = dataclasses.replace(make_record(), experiment="monitor_overhead", parameters={"profile": "full"})
    save_record(both, tmp_path / "both")
    row = records_status_markdown(tmp_path / "both").split("`monitor_overhead`")[1].split("\n")[0]
    assert row.endswith(f" (before 2026-11-25: the narrower course model; older code: {change.what}) |")


def _write_with_provenance(tmp_path, **changes):
    """A saved record whose provenance JSON is then edited: a field set to a value, or removed (``...``)."""
    path = save_record(make_record(), tmp_path)
    data = json.loads(path.read_text())
    for key, value in changes.items():
        if value is ...:
            del data["provenance"][key]
        else:
            data["provenance"][key] = value
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("device_type", ["tpu", "CUDA", "mps", "xpu"])
def test_loading_refuses_a_device_type_the_course_does_not_record(tmp_path, device_type):
    path = _write_with_provenance(tmp_path, device_type=device_type, compute_capability=None, cuda_version=None)
    with pytest.raises(RecordError, match=f"{path}: provenance device_type '{device_type}' is not one the course "
                                          r"records \('cuda' or 'cpu'\)"):
        load_record(path)
    with pytest.raises(RecordError, match=f"device_type '{device_type}'"):
        load_records(results_dir=tmp_path)
    with pytest.raises(RecordError, match=f"device_type '{device_type}'"):
        save_record(make_record(device_type=device_type, compute_capability=None, cuda_version=None), tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"torch_version": 2.11}, "provenance torch_version must be a non-empty string, got 2.11"),
    ({"git_commit": ""}, "provenance git_commit must be a non-empty string, got ''"),
    ({"python_version": None}, "provenance lacks python_version"),
    ({"date": "2026-11-21T10:00:00"}, "provenance date '2026-11-21T10:00:00' is not in UTC"),
    ({"date": "2026-11-21"}, "provenance date '2026-11-21' is not in UTC"),
    ({"date": "2026-11-21T10:00:00-05:00"}, "provenance date '2026-11-21T10:00:00-05:00' is not in UTC"),
    ({"date": "21/11/2026"}, "provenance date '21/11/2026' is not ISO 8601"),
    ({"compute_capability": 9.0}, "provenance compute_capability must be a non-empty string or null, got 9.0"),
    ({"compute_capability": "sm90"}, "provenance compute_capability 'sm90' is not 'major.minor'"),
    ({"cuda_version": 13}, "provenance cuda_version must be a non-empty string or null, got 13"),
    ({"hostname": ["vm"]}, r"provenance hostname must be a non-empty string or null, got \['vm'\]"),
    ({"device_type": "cpu"}, r"a cpu record gives compute_capability, cuda_version \('9.0', '13.0'\), which only a "
                             "GPU record has"),
])
def test_loading_refuses_provenance_of_the_wrong_type_or_form(tmp_path, changes, message):
    path = _write_with_provenance(tmp_path, **changes)
    with pytest.raises(RecordError, match=f"{path}: {message}"):
        load_record(path)


def test_loading_refuses_a_log_file_that_is_not_a_name(tmp_path):
    path = save_record(make_record(), tmp_path)
    data = json.loads(path.read_text())
    data["log_file"] = 5
    path.write_text(json.dumps(data))
    with pytest.raises(RecordError, match="'log_file' must be a file name .* got 5"):
        load_record(path)


def test_load_records_refuses_a_device_type_filter_the_course_does_not_record(tmp_path):
    save_record(make_record(), tmp_path)
    assert len(load_records(results_dir=tmp_path, device_type="cuda")) == 1
    with pytest.raises(ValueError, match="device_type must be one of 'cuda', 'cpu' .* got 'gpu'"):
        load_records(results_dir=tmp_path, device_type="gpu")  # it used to answer [], as if nothing were recorded
