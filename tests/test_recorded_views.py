"""Lessons show GPU records beside live results: a record made by ``course_lib.record`` reads back, through
the registry, into what the lesson draws, and agrees with the run that made it."""

import math
import statistics

import pytest

from course_lib import record as R
from course_lib.experiments import get_experiment
from course_lib.results import load_records


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    out = tmp_path_factory.mktemp("records")
    # small, on the CPU (records for tests only; course records come from GPUs)
    assert R.main(["underflow_statistics", "scaler_flight_recording", "convergence_parity", "--size", "small",
                   "--max-steps", "6", "--device", "cpu", "--allow-cpu", "--out", str(out)]) == 0
    return {r.experiment: r for r in load_records(results_dir=out)}


def test_underflow_rows_roundtrip(records):
    from course_lib.device import SizeProfile
    from course_lib.studies.underflow import train_and_capture, underflow_statistics

    rec = records["underflow_statistics"]
    assert rec.parameters["max_steps"] == 6   # a capped run says so
    stats = get_experiment("underflow_statistics").load(rec)
    rows = stats.summary_rows()
    assert [s.format for _, s in rows] == ["FP16", "BF16", "FP8 E4M3", "FP8 E5M2"] * 2
    assert [step for step, _ in rows] == [0] * 4 + [5] * 4
    # the same seed run again in this process gives the summaries the record holds, bit for bit
    live = underflow_statistics(train_and_capture(SizeProfile("small", max_steps=6), "cpu"))
    assert live.summary_rows() == rows and live.summary_rows("weight") == stats.summary_rows("weight")
    with pytest.raises(ValueError, match="kind must be"):
        stats.summary_rows("bias")


def test_flight_recording_roundtrip(records):
    from course_lib.scaling import replay_scale_schedule

    rec = get_experiment("scaler_flight_recording").load(records["scaler_flight_recording"])
    assert rec.growth_interval == 10 and rec.steps == 6     # the small profile's registry parameters
    # replaying GradScaler's rule on the recorded overflow thresholds gives back the recorded scales
    replay = replay_scale_schedule(rec.overflow_thresholds(), init_scale=rec.init_scale,
                                   growth_interval=rec.growth_interval)
    assert replay.scales == rec.scales


def test_parity_roundtrip(records):
    parity = get_experiment("convergence_parity").load(records["convergence_parity"])
    assert parity.seeds == (0, 1, 2) and parity.recipes[0] == "fp32"
    for recipe in parity.recipes:
        finals = parity.final_losses[recipe]
        assert parity.spread(recipe) == pytest.approx(statistics.stdev(finals))
        # seed 0's final loss is the mean of its curve's last five steps (the study's tail)
        assert finals[0] == pytest.approx(sum(parity.curves[recipe][-5:]) / 5)
        assert all(math.isfinite(f) for f in finals)
