"""The lesson timer (course_lib.studies.lesson_times) on tiny lessons written into a temporary course folder:
a real jupytext read and a real nbclient kernel, never the course's own lessons."""

from __future__ import annotations

import pytest

from course_lib.device import SizeProfile
from course_lib.jsonable import from_jsonable, to_jsonable
from course_lib.results import load_records
from course_lib.studies.lesson_times import (
    RECORD_COMMAND_ENV,
    RECORD_DIR_ENV,
    LessonTime,
    LessonTimes,
    find_lessons_dir,
    lesson_names,
    lesson_times,
    time_lesson,
)

HEADER = """---
jupytext:
  text_representation:
    extension: .md
    format_name: myst
    format_version: 0.13
kernelspec:
  display_name: Python 3
  language: python
  name: python3
---

# A tiny lesson

"""


def _cell(source: str, tags: str = "") -> str:
    return "```{code-cell} ipython3\n" + (f":tags: [{tags}]\n\n" if tags else "") + source + "\n```\n\n"


@pytest.fixture
def course(tmp_path):
    (tmp_path / "_config.yml").write_text("title: x\n")
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    # the kernel sees the profile in its environment, runs in the lesson's folder, and a raises-exception cell
    # does not fail the lesson
    (lessons / "01_ok.md").write_text(HEADER + _cell("import os\nsize = os.environ['COURSE_SIZE']")
                                      + "Some prose.\n\n" + _cell("assert size == 'full', size")
                                      + _cell("from pathlib import Path\nassert Path('01_ok.md').is_file()")
                                      + _cell("1 / 0", tags="raises-exception"))
    (lessons / "02_broken.md").write_text(HEADER + _cell("x = 1") + _cell("y = 2\nraise KeyError('planted')")
                                          + _cell("never = True"))
    (lessons / "03_slow.md").write_text(HEADER + _cell("import time") + _cell("time.sleep(60)"))
    return tmp_path


FULL = SizeProfile("full", forced=True)


def test_lessons_are_found_beside_the_book_config(course):
    assert find_lessons_dir(course / "lessons") == (course / "lessons").resolve()
    assert lesson_names(course / "lessons") == ("01_ok", "02_broken", "03_slow")
    with pytest.raises(ValueError, match="no course checkout"):
        find_lessons_dir(course.parent)


def test_a_passing_and_a_failing_lesson(course):
    result = lesson_times(FULL, "cpu", lessons=["01_ok", "02_broken"], limit_s=120, folder=course / "lessons")
    ok, broken = result.lessons
    assert (result.profile, result.device_type) == ("full", "cpu")
    assert ok.passed and ok.error == "" and ok.failing_cell is None and ok.code_cells == 4
    assert ok.seconds > 0 and 1 <= ok.slowest_cell <= 4 and 0 <= ok.slowest_cell_seconds <= ok.seconds
    assert not broken.passed and broken.failing_cell == 2 and broken.code_cells == 3
    assert broken.failing_line == "y = 2" and broken.error == "KeyError: 'planted'"
    assert result.failed == ("02_broken",)
    assert result.total_seconds == pytest.approx(ok.seconds + broken.seconds)
    assert result.over_target(0.0) == ("01_ok", "02_broken") and result.over_target(1e9) == ()
    # a record reads back into the same type
    assert from_jsonable(LessonTimes, to_jsonable(result)) == result


def test_a_lesson_past_its_limit_stops_and_fails(course):
    slow = time_lesson(course / "lessons" / "03_slow.md", FULL, limit_s=2, device_type="cpu")
    assert not slow.passed and slow.failing_cell == 2 and slow.failing_line == "time.sleep(60)"
    assert slow.error == "stopped at the limit of 2 s"
    assert slow.seconds < 50   # stopped, not waited out (the sleep is 60 s)


def test_the_small_profile_reaches_the_kernel(course):
    result = lesson_times(SizeProfile("small"), "cpu", lessons=["01_ok"], limit_s=120, folder=course / "lessons")
    only = result.lessons[0]
    assert not only.passed and only.failing_cell == 2 and only.error == "AssertionError: small"


def test_bad_requests_are_refused(course):
    folder = course / "lessons"
    with pytest.raises(ValueError, match=r"unknown lessons \['04_none'\]"):
        lesson_times(FULL, "cpu", lessons=["04_none"], limit_s=10, folder=folder)
    with pytest.raises(ValueError, match="non-empty list"):
        lesson_times(FULL, "cpu", lessons="01_ok", limit_s=10, folder=folder)
    with pytest.raises(ValueError, match="must not repeat"):
        lesson_times(FULL, "cpu", lessons=["01_ok", "01_ok"], limit_s=10, folder=folder)
    with pytest.raises(TypeError, match="SizeProfile"):
        lesson_times("full", "cpu", lessons=["01_ok"], limit_s=10, folder=folder)
    with pytest.raises(ValueError, match="limit_s"):
        time_lesson(folder / "01_ok.md", FULL, limit_s=0)
    with pytest.raises(ValueError, match="no lesson at"):
        time_lesson(folder / "09_gone.md", FULL, limit_s=10)


def test_a_lesson_records_what_it_runs_where_the_gpu_session_asks(course, tmp_path, monkeypatch):
    """With RECORD_DIR_ENV in the environment (as the GPU session sets it for a lessons step), run_experiment
    in the lesson's kernel saves a record whose provenance names the command and the lesson; without, none."""
    lesson = course / "lessons" / "04_records.md"
    lesson.write_text(HEADER + _cell("from course_lib.device import SizeProfile\n"
                                     "from course_lib.experiments import run_experiment\n"
                                     "rec = run_experiment('scaler_flight_recording', SizeProfile('small'), 'cpu')")
                      + _cell("assert type(rec).__name__ == 'FlightRecording', rec"))
    out = tmp_path / "records"
    assert time_lesson(lesson, FULL, limit_s=120, device_type="cpu").passed
    assert not out.exists()
    monkeypatch.setenv(RECORD_DIR_ENV, str(out))
    monkeypatch.setenv(RECORD_COMMAND_ENV, "python -m course_lib.record lesson_times --out x")
    timed = time_lesson(lesson, FULL, limit_s=120, device_type="cpu")
    assert timed.passed, timed.error
    (record,) = load_records(results_dir=out)
    assert record.experiment == "scaler_flight_recording" and record.parameters["size"] == "small"
    assert record.provenance.command == ("python -m course_lib.record lesson_times --out x (executing "
                                         "lessons/04_records.md: run_experiment('scaler_flight_recording'))")


def test_a_lesson_time_is_a_frozen_record():
    t = LessonTime(lesson="01_x", seconds=1.0, passed=True, code_cells=1)
    with pytest.raises(AttributeError):
        t.seconds = 2.0   # type: ignore[misc]
