"""The registry: each experiment's parameters per profile fit its study, a record reads back into the
study's result type (records written before that format through their legacy readers, checked against the
hand-written converters they replace), and a bad record is refused by name."""

import dataclasses
import inspect
import json
import math

import pytest
import torch

from course_lib import experiments as E
from course_lib.device import SizeProfile
from course_lib.jsonable import from_jsonable, to_jsonable
from course_lib.results import Record, capture_provenance, load_record, load_records, save_record
from course_lib.studies.bf16 import Parity

SMALL, FULL = SizeProfile("small"), SizeProfile("full")


@pytest.mark.parametrize("name", sorted(E.EXPERIMENTS))
@pytest.mark.parametrize("profile", [SMALL, FULL], ids=["small", "full"])
def test_parameters_fit_the_study_and_are_jsonable(name, profile):
    exp = E.EXPERIMENTS[name]
    params = exp.parameters_for(profile, "cpu")
    json.dumps(to_jsonable(params), allow_nan=False)
    inspect.signature(exp.study).bind(profile, torch.device("cpu"), **params)   # TypeError if they do not fit


def test_records_of_experiments_without_the_course_model_name_none(monkeypatch):
    from course_lib.results import NO_COURSE_MODEL
    assert NO_COURSE_MODEL <= set(E.EXPERIMENTS)
    fake = dataclasses.replace(E.get_experiment("clipping_runs"), study=lambda profile, device, **k: None)
    monkeypatch.setitem(E.EXPERIMENTS, "clipping_runs", fake)
    assert "course_model" not in E.record_output("clipping_runs", SMALL, "cpu").parameters


def test_lessons_sizes_are_the_registrys():
    """What the lessons used to pass themselves, now the registry's small profile (the lessons' numbers do
    not move), and the full size since its re-size to a wider model for fewer steps."""
    p = lambda name, profile: E.get_experiment(name).parameters_for(profile, "cpu")  # noqa: E731
    assert p("fp8_training", SMALL) == {"steps": 25} and p("fp8_training", FULL) == {"steps": 150}
    assert p("mx_training", SMALL)["recipes"] == ("bf16_autocast", "mxfp8", "mxfp4", "nvfp4")
    # at full size too: the ablations are recorded one recipe per command (the GPU session), not in the lesson
    assert p("mx_training", FULL) == {"recipes": ("bf16_autocast", "mxfp8", "mxfp4", "nvfp4"), "steps": 150}
    assert p("convergence_parity", SMALL) == {"seeds": (0, 1, 2), "steps": 12}
    assert p("convergence_parity", FULL) == {"seeds": (0, 1, 2), "steps": 120}
    assert p("monitor_overhead", SMALL) == {"everies": (1, 10), "steps": 10, "rounds": 6}
    assert p("scaler_flight_recording", SMALL) == {"growth_interval": 10} and p("scaler_flight_recording", FULL) == {}
    throughput = p("training_throughput", SMALL)
    assert throughput["recipes"] == ("fp32", "bf16_autocast", "fp16_autocast_scaler")   # a CPU has no TF32
    assert throughput["seeds"] == (0, 1) and throughput["steps"] == 16 and throughput["compiled"] == ()


def test_parameters_for_refuses_a_profile_that_is_not_one():
    with pytest.raises(TypeError, match="SizeProfile"):
        E.get_experiment("fp8_training").parameters_for("small", "cpu")
    with pytest.raises(ValueError, match="unknown experiment 'nope'"):
        E.run_experiment("nope", SMALL, "cpu")


def test_gpu_only_experiment_is_refused_on_the_cpu():
    with pytest.raises(ValueError, match="needs a CUDA GPU"):
        E.run_experiment("autocast_trace", SMALL, "cpu")


RECORDED = sorted({r.experiment for r in load_records()})


@pytest.mark.parametrize("name", RECORDED)
def test_every_recorded_gpu_result_reads_back_into_its_type(name):
    exp = E.get_experiment(name)
    for rec in load_records(name):
        result = exp.load(rec)
        if isinstance(exp.result_type, type):
            assert isinstance(result, exp.result_type)


def _nan_equal(a, b):
    return json.dumps(to_jsonable(a), sort_keys=True) == json.dumps(to_jsonable(b), sort_keys=True)


def test_legacy_records_read_back_with_every_recorded_number():
    """Version-1 records, read by the legacy readers, hold exactly the numbers their JSON holds."""
    # GPTConfig fields added since (fused attention, a tied head) read back at their defaults
    added = {"attention": "explicit", "tied_head": False}
    for name, key in (("model_magnitudes", "magnitudes"), ("scaler_flight_recording", "recording")):
        (rec,) = E.recorded_results(name)
        raw = dict(rec.record.values[key])
        if "config" in raw:
            assert not set(added) & set(raw["config"])
            raw["config"] = {**raw["config"], **added}
        assert _nan_equal(rec.result, raw)
    (parity,) = E.recorded_results("convergence_parity")
    raw = parity.record.values
    assert parity.result.recipes == tuple(raw["final_losses"]) and list(parity.result.seeds) == [0, 1, 2]
    assert _nan_equal(parity.result.final_losses, raw["final_losses"]) and _nan_equal(parity.result.curves,
                                                                                        raw["curves"])
    (tp,) = E.recorded_results("training_throughput")
    raw = tp.record.values
    assert _nan_equal(tp.result.runs, raw["runs"]) and tp.result.flops_per_token == raw["flops_per_token"]
    assert tp.result.peaks == raw["peaks"] and tp.result.peak_source == tp.record.parameters["peak_source"]
    # the table the record stored is what the type computes (which has since gained a tokens/s range column)
    for stored, computed in zip(raw["table"], to_jsonable(tp.result.table()), strict=True):
        assert {k: computed[k] for k in stored} == stored


def test_fp8_speed_and_monitor_overhead_records_read_back():
    (speed,) = E.recorded_results("fp8_linear_speed")
    assert speed.result.sizes == tuple(speed.record.parameters["sizes"])
    assert speed.result.seconds["BF16 nn.Linear"][8192] == speed.record.values["seconds"]["BF16 nn.Linear"]["8192"]
    (cost,) = E.recorded_results("monitor_overhead")
    assert cost.result.seconds[10] == cost.record.values["seconds"]["10"] and cost.result.rounds == {}


def test_older_code_agrees_with_what_lessons_7_and_9_say_of_their_records():
    """The registry's code changes flag the same records as the lessons' own notes: lesson 9's monitor record
    without a transfer count, and lesson 7's layer record from before the one-pass casts."""
    from course_lib.studies.fp8_speed_prose import linear_record_note
    from course_lib.studies.monitoring_prose import before_batching

    for cost in E.recorded_results("monitor_overhead"):
        assert bool(E.get_experiment("monitor_overhead").older_code(cost)) == before_batching(cost)
    for speed in E.recorded_results("fp8_linear_speed"):
        flagged = linear_record_note(speed.label, speed.provenance.date) != "."
        assert bool(E.get_experiment("fp8_linear_speed").older_code(speed)) == flagged
    assert E.get_experiment("fp8_linear_speed").older_code(speed)      # the record in results/ is older
    with pytest.raises(ValueError, match="a 'monitor_overhead' record is not a 'fp8_linear_speed' record"):
        E.get_experiment("fp8_linear_speed").older_code(cost)


@pytest.mark.parametrize("since, what, message", [("25 Nov 2026", "x", "since must be an ISO date"),
                                                   (None, "x", "since must be an ISO date"),
                                                   ("2026-11-25", "", "must say what changed")])
def test_a_code_change_needs_a_date_and_a_description(since, what, message):
    with pytest.raises(ValueError, match=message):
        E.CodeChange(since, what)


def test_a_new_record_round_trips_into_the_result_type(tmp_path, monkeypatch):
    parity = Parity(("fp32", "bf16_autocast"), (0, 1), {"fp32": (2.0, 2.1), "bf16_autocast": (2.0, math.inf)},
                    {"fp32": (3.0, 2.0), "bf16_autocast": (3.0, 2.5)})
    fake = dataclasses.replace(E.get_experiment("convergence_parity"), study=lambda profile, device, **k: parity)
    monkeypatch.setitem(E.EXPERIMENTS, "convergence_parity", fake)
    out = E.record_output("convergence_parity", SMALL, "cpu")
    assert out.parameters == {"profile": "small", "seeds": [0, 1, 2], "steps": 12, "course_model": {
        "d_model": 64, "n_layers": 2, "n_heads": 2, "context": 64, "batch": 16}}
    monkeypatch.setenv("COURSE_GIT_COMMIT", "deadbeef")
    path = save_record(Record("convergence_parity", out.parameters, out.values,
                              capture_provenance("test", "cpu")), tmp_path)
    back = fake.load(load_record(path))
    assert back == dataclasses.replace(parity, final_losses={"fp32": (2.0, 2.1), "bf16_autocast": (2.0, math.inf)})
    assert E.recorded_results("convergence_parity", device_type="cpu", results_dir=tmp_path)[0].result == back


def test_a_record_of_another_experiment_or_shape_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_GIT_COMMIT", "deadbeef")
    prov = capture_provenance("test", "cpu")
    rec = load_record(save_record(Record("convergence_parity", {}, {"result": {}, "extra": 1}, prov), tmp_path))
    with pytest.raises(ValueError, match="values must hold just 'result'"):
        E.get_experiment("convergence_parity").load(rec)
    with pytest.raises(ValueError, match="is not a 'fp8_training' result"):
        E.get_experiment("fp8_training").load(rec)
    old = dataclasses.replace(rec, schema_version=1, values={"final_losses": {"fp32": [1.0]}})
    with pytest.raises(ValueError, match="not a 'convergence_parity' record"):
        E.get_experiment("convergence_parity").load(old)
    with pytest.raises(ValueError, match="has no reader for schema version 1"):
        E.get_experiment("fp8_training").load(dataclasses.replace(old, experiment="fp8_training"))


def test_fp8_scaling_lab_record_reads_back_typed():
    (rec,) = E.recorded_results("fp8_scaling_lab")
    raw, lab = rec.record.values, rec.result.lab
    assert rec.result.block == 128 and lab.tensors == ("activation", "weight", "gradient")
    assert (lab.errors["gradient"]["per tensor, E4M3"].relative_error
            == raw["errors"]["gradient"]["per tensor, E4M3"]["relative_error"])
    assert rec.result.sweep.relative_error == {k: tuple(v) for k, v in raw["outlier_sweep"]["relative_error"].items()}


def test_fp8_scaling_lab_study_is_the_lessons_two_calls():
    from course_lib.studies import fp8 as S

    g = torch.Generator().manual_seed(0)
    tensors = S.LinearTensors("blocks.0.fc", 3, torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g),
                              torch.randn(64, 64, generator=g) * 1e-4, (1.0,))
    study = S.scaling_lab_study(tensors, 32)
    named = {"activation": tensors.activation, "weight": tensors.weight, "gradient": tensors.grad_output}
    assert study.lab == S.scaling_lab(named, S.lab_recipes(32))
    assert study.sweep == S.outlier_sweep(tensors.activation, S.sweep_recipes(32))
    assert set(S.lab_recipes(32)) - set(S.sweep_recipes(32)) == {"no scaling (E4M3)", "per tensor, E5M2"}
    assert (S.lab_block(SMALL), S.lab_block(FULL)) == (32, 128)


def test_mx_block_study_is_the_lessons_calls_on_one_set_of_tensors(monkeypatch):
    from course_lib.studies import microscaling as S

    g = torch.Generator().manual_seed(1)
    act = torch.randn(32, 64, generator=g)
    tensors = {"activation": act, "activation + outlier": S.with_outlier_channel(act)}
    monkeypatch.setattr(S, "mx_lesson_tensors", lambda profile, device: tensors)
    monkeypatch.setattr(S, "gradient_fidelity", lambda profile, device: "fidelity")
    study = S.mx_block_study(SMALL, "cpu")
    assert study.block_sizes == S.block_size_study(tensors, skip_columns=S.OUTLIER_SKIP)
    assert _nan_equal(study.scale_choices["activation + outlier"], {
        name: S.block_error(tensors["activation + outlier"], s, label=name, skip_columns=(0,))
        for name, s in S.nvfp4_scale_choices().items()})
    assert list(study.scale_modes) == ["e2m1", "e4m3"] and study.gradient_fidelity == "fidelity"
    fid = S.GradientFidelity(("nvfp4",), (0, 1), 3, 2, 2, (1, 2), {"nvfp4": ((0.1, 0.2), (0.3, 0.1))},
                             {"nvfp4": ((0.01, 0.02), (0.0, 0.01))}, {"nvfp4": ((0.15, 0.12), (0.2, 0.1))})
    study = dataclasses.replace(study, gradient_fidelity=fid)
    back = from_jsonable(S.MxBlockStudy, json.loads(json.dumps(to_jsonable(study), allow_nan=False)))
    assert json.dumps(to_jsonable(back)) == json.dumps(to_jsonable(study))   # nan-safe equality
    assert isinstance(back.scale_modes["e2m1"], S.ModeComparison) and back.gradient_fidelity == fid
