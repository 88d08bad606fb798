"""Lessons show GPU records beside live results: the converters from a record's JSON back to results."""

import pytest

from course_lib import record as R
from course_lib.results import load_records


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("records")
    # small, on the CPU (records for tests only; course records come from GPUs)
    assert R.main(["underflow_statistics", "scaler_flight_recording", "convergence_parity", "--size", "small",
                   "--max-steps", "6", "--device", "cpu", "--allow-cpu", "--out", str(out)]) == 0
    return {r.experiment: r for r in load_records(results_dir=out)}


def test_underflow_rows_roundtrip(records):
    from course_lib.gradients import summary_markdown
    from course_lib.studies.underflow import summary_rows_from_record

    assert records["underflow_statistics"].parameters["max_steps"] == 6   # a capped run says so
    rows = summary_rows_from_record(records["underflow_statistics"].values)
    assert {s.format for _, s in rows} == {"FP16", "BF16", "FP8 E4M3", "FP8 E5M2"}
    assert len({step for step, _ in rows}) == 2
    assert "| FP16 |" in summary_markdown(rows)
    with pytest.raises(ValueError, match="not an underflow_statistics record"):
        summary_rows_from_record({"captures": {"step_0": {}}})


def test_flight_recording_roundtrip(records):
    from course_lib.scaling import replay_scale_schedule
    from course_lib.studies.loss_scaling import flight_recording_from_dict

    rec = flight_recording_from_dict(records["scaler_flight_recording"].values["recording"])
    replay = replay_scale_schedule(rec.overflow_thresholds(), init_scale=rec.init_scale,
                                   growth_interval=rec.growth_interval)
    assert replay.scales == rec.scales and rec.steps == len(rec.losses)
    with pytest.raises(ValueError, match="not a scaler flight recording"):
        flight_recording_from_dict({"losses": []})


def test_parity_roundtrip(records):
    from course_lib.studies.bf16 import parity_from_dict

    r = records["convergence_parity"]
    parity = parity_from_dict(r.parameters, r.values)
    assert len(parity.seeds) == 3 and "fp32" in parity.final_losses and parity.spread("fp32") >= 0
    with pytest.raises(ValueError, match="not a convergence_parity record"):
        parity_from_dict({}, {})
