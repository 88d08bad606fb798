"""course_lib.jsonable: results go to JSON and come back as the same typed objects, old records included."""

import json
import math
from dataclasses import dataclass, field
from typing import Literal

import pytest

from course_lib.jsonable import from_jsonable, to_jsonable
from course_lib.magnitudes import LogHistogram
from course_lib.models import GPTConfig
from course_lib.results import load_records
from course_lib.studies.formats import TrainingMagnitudes
from course_lib.studies.loss_scaling import FlightRecording

GPT_FIELDS_ADDED = {"attention": "explicit", "tied_head": False}


@dataclass(frozen=True)
class Inner:
    x: float
    tag: Literal["a", "b"] = "a"


@dataclass(frozen=True)
class Outer:
    name: str
    steps: int
    curve: tuple[float, ...]
    pair: tuple[int, str]
    by_step: dict[int, Inner]
    maybe: float | None
    flags: list[bool] = field(default_factory=list)


def _outer() -> Outer:
    return Outer("run", 3, (1.0, math.inf, math.nan), (2, "b"), {0: Inner(0.5), 10: Inner(-math.inf, "b")},
                 None, [True, False])


def test_round_trip_through_json_text_rebuilds_the_same_object():
    back = from_jsonable(Outer, json.loads(json.dumps(to_jsonable(_outer()), allow_nan=False)))
    want = _outer()
    assert back.name == want.name and back.steps == 3 and back.pair == (2, "b") and back.flags == [True, False]
    assert back.curve[:2] == (1.0, math.inf) and math.isnan(back.curve[2]) and isinstance(back.curve, tuple)
    assert back.by_step == {0: Inner(0.5), 10: Inner(-math.inf, "b")} and back.maybe is None


def test_missing_field_with_default_takes_it():
    assert from_jsonable(Inner, {"x": 2}) == Inner(2.0, "a")
    assert isinstance(from_jsonable(Inner, {"x": 2}).x, float)


@pytest.mark.parametrize("data, match", [
    ({"x": "two"}, r"Inner.x: expected float, got 'two'"),
    ({"x": 1.0, "tag": "c"}, r"Inner.tag: expected one of \('a', 'b'\)"),
    ({"x": 1.0, "y": 2}, r"Inner has no field 'y'"),
    ({}, r"Inner needs field 'x'"),
    ([1.0], r"Inner: expected an object for Inner"),
    ({"x": True}, r"expected float, got True"),
])
def test_what_does_not_fit_is_named_with_its_path(data, match):
    with pytest.raises(ValueError, match=match):
        from_jsonable(Inner, data)


def test_nested_errors_give_the_full_path():
    data = to_jsonable(_outer())
    data["by_step"]["10"]["x"] = [1]
    with pytest.raises(ValueError, match=r"Outer.by_step\['10'\].x: expected float"):
        from_jsonable(Outer, data)
    data = to_jsonable(_outer())
    data["by_step"] = {"ten": {"x": 1.0}}
    with pytest.raises(ValueError, match="key 'ten' is not an int"):
        from_jsonable(Outer, data)
    data = to_jsonable(_outer())
    data["pair"] = [1, "a", 3]
    with pytest.raises(ValueError, match=r"Outer.pair: expected 2 items, got 3"):
        from_jsonable(Outer, data)
    data = to_jsonable(_outer())
    data["steps"] = 2.5
    with pytest.raises(ValueError, match=r"Outer.steps: expected int, got 2.5"):
        from_jsonable(Outer, data)


def test_a_type_it_cannot_build_is_a_type_error():
    with pytest.raises(TypeError, match="cannot build"):
        from_jsonable(complex, 1)


def test_course_results_round_trip():
    mags = TrainingMagnitudes({"weights": LogHistogram((1, 2, 3), 4, 0, 1e-6, math.inf)}, 10, GPTConfig(d_model=128),
                              8, 2.5, "cpu", (3.0, 2.5))
    assert from_jsonable(TrainingMagnitudes, json.loads(json.dumps(to_jsonable(mags)))) == mags


@pytest.mark.parametrize("experiment, key, cls", [
    ("model_magnitudes", "magnitudes", TrainingMagnitudes),
    ("scaler_flight_recording", "recording", FlightRecording),
])
def test_recorded_gpu_results_read_back_and_write_out_the_same(experiment, key, cls):
    records = load_records(experiment)
    assert records, f"results/ should hold a {experiment} record"
    for record in records:
        result = from_jsonable(cls, record.values[key])
        assert isinstance(result, cls)
        raw = dict(record.values[key])
        if "config" in raw:   # GPTConfig fields added since the record (fused attention, a tied head): defaults
            assert not set(GPT_FIELDS_ADDED) & set(raw["config"])
            raw["config"] = {**raw["config"], **GPT_FIELDS_ADDED}
        assert json.dumps(to_jsonable(result), sort_keys=True) == json.dumps(to_jsonable(raw), sort_keys=True)
