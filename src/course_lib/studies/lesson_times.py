"""How long each lesson takes to execute, at a size profile: the experiment ``lesson_times``.

Each lesson (MyST Markdown with a jupytext header, in ``lessons/``) is read by jupytext into a notebook and
executed by nbclient in a fresh kernel whose environment sets ``COURSE_SIZE`` to the profile, in the lesson's
own folder (as the book executes it). Its wall time runs from the kernel's start to the last cell's reply; a
lesson that raises, or runs past its limit, is recorded as failed with the code cell where it stopped. The
course's target for one H100/H200 at the full profile is at most 3 minutes a lesson and 25 for the book.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import torch

from ..device import PROFILES, SIZE_ENV_VAR, SizeProfile

# the targets at the full profile on one H100/H200, seconds
LESSON_TARGET_S = 180.0
# A lesson is stopped here at the full profile: far enough past the target to show by how much, and short
# enough that a lesson that runs for an hour (lesson 8 before its re-size) still leaves a record of where it was.
LESSON_LIMIT_S = 240.0
BOOK_TARGET_S = 25 * 60.0

# Set by the GPU session (course_lib.gpu_session) for a lessons step: every experiment a lesson runs
# (course_lib.experiments.run_experiment) is also recorded into RECORD_DIR_ENV's folder, its provenance naming
# RECORD_COMMAND_ENV's command and the lesson (LESSON_ENV, set here per lesson), so that executing the book on a
# GPU records what its pages run instead of running it twice.
RECORD_DIR_ENV = "COURSE_RECORD_DIR"
RECORD_COMMAND_ENV = "COURSE_RECORD_COMMAND"
LESSON_ENV = "COURSE_LESSON"


@dataclass(frozen=True)
class LessonTime:
    """One lesson's execution: ``seconds`` of wall time (kernel start to the last reply, or to where it
    stopped), whether every cell ran, and, where one did not, the code cell (1-based, among code cells), its
    first line and the error."""

    lesson: str
    seconds: float
    passed: bool
    code_cells: int
    failing_cell: int | None = None
    failing_line: str = ""
    error: str = ""
    slowest_cell: int | None = None
    slowest_cell_seconds: float = 0.0


@dataclass(frozen=True)
class LessonTimes:
    """Lessons executed at one size profile (``profile``) on ``device_type``, in the order run."""

    profile: str
    device_type: str
    lessons: tuple[LessonTime, ...]

    @property
    def total_seconds(self) -> float:
        return sum(t.seconds for t in self.lessons)

    @property
    def failed(self) -> tuple[str, ...]:
        return tuple(t.lesson for t in self.lessons if not t.passed)

    def over_target(self, target_s: float = LESSON_TARGET_S) -> tuple[str, ...]:
        """The lessons that took longer than ``target_s`` seconds."""
        return tuple(t.lesson for t in self.lessons if t.seconds > target_s)


def find_lessons_dir(start: str | Path | None = None) -> Path:
    """The course's ``lessons/`` folder: beside ``_config.yml`` in ``start`` (default: the working directory,
    then the checkout this package is installed from) or a folder above it."""
    here = Path(start if start is not None else Path.cwd()).resolve()
    # without a start, the checkout this package sits in (src/course_lib/studies/) is the last resort
    last = () if start is not None else (Path(__file__).resolve().parents[3],)
    for folder in (here, *here.parents, *last):
        if (folder / "_config.yml").is_file() and (folder / "lessons").is_dir():
            return folder / "lessons"
    raise ValueError(f"no course checkout (a folder with _config.yml and lessons/) at or above {here}")


def lesson_names(folder: str | Path | None = None) -> tuple[str, ...]:
    """The lessons in ``folder`` (default :func:`find_lessons_dir`), by name (file stem), in order."""
    folder = Path(folder) if folder is not None else find_lessons_dir()
    return tuple(sorted(p.stem for p in folder.glob("*.md")))


def _seconds(execution: dict, start: str, end: str) -> float | None:
    if start not in execution or end not in execution:
        return None
    parse = [datetime.fromisoformat(execution[k].replace("Z", "+00:00")) for k in (start, end)]
    return (parse[1] - parse[0]).total_seconds()


def _where_it_stopped(code_cells: list) -> int | None:
    """1-based index of the code cell that raised, else of the one that started and never replied."""
    for number, cell in enumerate(code_cells, 1):
        if any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return number
    for number, cell in enumerate(code_cells, 1):
        execution = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in execution and "shell.execute_reply" not in execution:
            return number
    return None


def time_lesson(path: str | Path, profile: SizeProfile, *, limit_s: float, device_type: str = "cuda") -> LessonTime:
    """Execute one lesson at ``profile`` and time it; at most ``limit_s`` seconds for the whole lesson
    (a lesson past it stops and counts as failed). ``device_type="cpu"`` hides every GPU from the kernel."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no lesson at {path}")
    if not isinstance(profile, SizeProfile):
        raise TypeError(f"profile must be a SizeProfile, got {type(profile).__name__}")
    if isinstance(limit_s, bool) or not isinstance(limit_s, (int, float)) or not limit_s > 0:
        raise ValueError(f"limit_s must be a positive number of seconds, got {limit_s!r}")
    # Imported here, not with the module: jupytext and nbclient import nbformat's JSON-schema checker, about
    # 2 s, and every lesson imports course_lib.experiments, which imports this module.
    import jupytext  # type: ignore[import-untyped]
    from nbclient import NotebookClient  # type: ignore[import-untyped]
    from nbclient.exceptions import (  # type: ignore[import-untyped]
        CellExecutionError,
        CellTimeoutError,
        DeadKernelError,
    )

    nb = jupytext.read(path)
    env = {**os.environ, SIZE_ENV_VAR: profile.name, LESSON_ENV: path.name}
    if device_type == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    start = time.monotonic()
    deadline = start + float(limit_s)
    client = NotebookClient(nb, timeout=None, record_timing=True, kernel_name="python3",
                            timeout_func=lambda cell: max(1, int(deadline - time.monotonic()) + 1),
                            resources={"metadata": {"path": str(path.parent.resolve())}})
    error = ""
    try:
        client.execute(env=env)
    except CellTimeoutError:
        error = f"stopped at the limit of {limit_s:g} s"
    except CellExecutionError as exc:
        error = f"{exc.ename}: {exc.evalue}"
    except DeadKernelError as exc:
        error = f"the kernel died: {exc}"
    seconds = time.monotonic() - start
    code = [c for c in nb.cells if c.cell_type == "code"]
    failing = _where_it_stopped(code) if error else None
    durations = [_seconds(c.get("metadata", {}).get("execution", {}), "iopub.execute_input",
                          "shell.execute_reply") for c in code]
    timed = [(d, i) for i, d in enumerate(durations, 1) if d is not None]
    slowest_s, slowest = max(timed) if timed else (0.0, None)
    line = code[failing - 1].source.strip().splitlines()[0][:100] if failing and code[failing - 1].source.strip() \
        else ""
    return LessonTime(lesson=path.stem, seconds=seconds, passed=not error, code_cells=len(code),
                      failing_cell=failing, failing_line=line, error=error[:500], slowest_cell=slowest,
                      slowest_cell_seconds=slowest_s)


def lesson_times(profile: SizeProfile, device: torch.device | str, *, lessons: Sequence[str],
                 limit_s: float, folder: str | Path | None = None) -> LessonTimes:
    """Execute ``lessons`` (names as in :func:`lesson_names`) one after another at ``profile``, each in a fresh
    kernel limited to ``limit_s`` seconds, and time each. ``folder`` defaults to :func:`find_lessons_dir`."""
    if not isinstance(profile, SizeProfile) or profile.name not in PROFILES:
        raise TypeError(f"profile must be a SizeProfile, got {profile!r}")
    if isinstance(lessons, str) or not isinstance(lessons, Sequence) or not lessons:
        raise ValueError(f"lessons must be a non-empty list of lesson names, got {lessons!r}")
    folder = Path(folder) if folder is not None else find_lessons_dir()
    known = lesson_names(folder)
    unknown = [name for name in lessons if name not in known]
    if unknown:
        raise ValueError(f"unknown lessons {unknown}; {folder} holds {', '.join(known) or 'none'}")
    if len(set(lessons)) != len(lessons):
        raise ValueError(f"lessons must not repeat, got {list(lessons)}")
    device_type = torch.device(device).type
    return LessonTimes(profile=profile.name, device_type=device_type,
                       lessons=tuple(time_lesson(folder / f"{name}.md", profile, limit_s=limit_s,
                                                 device_type=device_type) for name in lessons))


def lesson_times_parameters(profile: SizeProfile, device: torch.device) -> dict[str, object]:
    """The registry's parameters: every lesson, each limited to :data:`LESSON_LIMIT_S` at the full profile
    (the failing cell then says where it was) and 10 minutes on the small one (a CPU); a smoke run
    (``profile.max_steps`` set, as in the self-check) times the first lesson only."""
    names = lesson_names()
    return {"lessons": names if profile.max_steps is None else names[:1],
            "limit_s": profile.pick(small=600.0, full=LESSON_LIMIT_S)}
