"""The GPU self-check: every path runs, a failure is reported and sets the exit status."""

import dataclasses

from course_lib import selfcheck
from course_lib.experiments import EXPERIMENTS


def test_selfcheck_passes_on_a_subset(capsys):
    status = selfcheck.main(["--device", "cpu", "--only", "fp8 linear tensorwise", "recipe tf32", "recipe fp32"])
    out = capsys.readouterr().out
    assert status == 0
    assert "fp8 linear tensorwise" in out and "ok:" in out
    assert "recipe tf32" in out and "skipped: TF32" in out
    assert "2 ok, 1 skipped, 0 failed" in out


def test_a_failing_experiment_fails_the_selfcheck_and_the_others_still_run(monkeypatch, capsys):
    def broken(profile, device):
        raise RuntimeError("planted failure")

    monkeypatch.setitem(EXPERIMENTS, "model_magnitudes",
                        dataclasses.replace(EXPERIMENTS["model_magnitudes"], study=broken))
    status = selfcheck.main(["--device", "cpu", "--only", "experiment model_magnitudes", "fp8 linear rowwise"])
    out = capsys.readouterr().out
    assert status == 1
    assert "FAILED: RuntimeError: planted failure" in out
    assert "fp8 linear rowwise" in out and "1 failed" in out


def test_selfcheck_refuses_bad_arguments(capsys):
    assert selfcheck.main(["--device", "cpu", "--only", "no such check"]) == 2
    assert selfcheck.main(["--device", "tpu"]) == 2
    assert "cannot use device" in capsys.readouterr().err


def test_run_checks_reports_each_outcome():
    def skip():
        raise selfcheck._Skip("not here")

    def fail():
        raise ValueError("bad")

    results = selfcheck.run_checks([("a", lambda: "fine"), ("b", skip), ("c", fail)])
    assert [(r.name, r.status, r.message) for r in results] == [
        ("a", "ok", "fine"), ("b", "skipped", "not here"), ("c", "failed", "ValueError: bad")]
    assert "FAILED: ValueError: bad" in selfcheck.results_table(results)


def test_max_steps_caps_every_training_run():
    import pytest

    from course_lib.device import SizeProfile
    from course_lib.models import course_setup
    setup = course_setup(SizeProfile("small", max_steps=4), "cpu", steps=100, default_steps=(40, 1000))
    assert setup.steps == 4
    with pytest.raises(ValueError, match="max_steps"):
        SizeProfile("small", max_steps=0)
