"""One command for a GPU machine: record every registered experiment and time every lesson, in parts.

Usage::

    python -m course_lib.gpu_session plan             # the parts, each step's estimate, what is done here
    python -m course_lib.gpu_session run --next       # the next unfinished parts, as many as fit ~9 minutes
    python -m course_lib.gpu_session run --part 3

A part is a list of steps; a step is one registered experiment, with parameter overrides where a part records
only a piece of it (``lesson_times`` a few lessons, say), run as ``python -m course_lib.record NAME --param
KEY=JSON``, so each step writes its own record and raw log. What is done is read from the records: a step is
done on this GPU when ``results/`` (or ``--out``) holds a full-size record of it from a GPU of this name, so a
fresh machine given the committed ``results/`` resumes where the last one stopped. A part's estimate is the
sum of its steps' durations in their newest GPU records (this GPU's first), or a stated default where none
exists. ``run`` stops before a step that would not finish inside ``--budget-s``.

The lessons run first: a lessons step executes each lesson at the full profile with the environment of
:func:`lesson_record_env`, so every registered experiment a page runs is recorded as it runs (with its own
provenance and raw log), and the experiment steps after them find those records and pass over them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .device import SizeProfile, describe_hardware, select_device
from .experiments import EXPERIMENTS, record_command
from .jsonable import to_jsonable
from .models import profile_model
from .mx import BLOCK_RECIPES
from .results import NO_COURSE_MODEL, Record, load_records
from .studies.fp8 import FP8_TRAINING_RECIPES
from .studies.ladder import LADDER_PIECES
from .studies.lesson_times import LESSON_LIMIT_S, RECORD_COMMAND_ENV, RECORD_DIR_ENV, lesson_names

PART_LIMIT_S = 540.0          # a part fits one 10-minute command with a minute to spare
RUN_BUDGET_S = 570.0          # what `run` may spend: 10 minutes less half a minute to install and pack up
DEFAULT_STEP_S = 180.0        # an experiment with no GPU record yet
DEFAULT_LESSON_S = LESSON_LIMIT_S + 10.0   # a lesson never timed on a GPU: its limit, and a kernel's start
LESSON_EXPERIMENT = "lesson_times"
FULL_MODEL = profile_model(SizeProfile("full"))   # a record of another course model is not done
MX_TRAINING_RECIPES = ("bf16_autocast", *BLOCK_RECIPES)


@dataclass(frozen=True)
class Step:
    """One run of ``python -m course_lib.record experiment`` with ``overrides`` (parameter name -> value)."""

    experiment: str
    overrides: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.experiment, str) or not self.experiment:
            raise ValueError(f"a step names an experiment, got {self.experiment!r}")
        if not isinstance(self.overrides, Mapping):
            raise TypeError(f"overrides must be a mapping of parameter name to value, got {self.overrides!r}")

    @property
    def key(self) -> tuple[str, str]:
        """What makes two steps the same run: the experiment and its overrides as JSON."""
        return self.experiment, json.dumps(to_jsonable(dict(self.overrides)), sort_keys=True)

    @property
    def label(self) -> str:
        extra = " ".join(f"{k}={json.dumps(to_jsonable(v))}" for k, v in self.overrides.items())
        return f"{self.experiment} {extra}".strip()

    def record_args(self, out: str | Path) -> list[str]:
        """The arguments of ``python -m course_lib.record`` that run this step into ``out``."""
        args = [self.experiment, "--out", str(out)]
        for k, v in self.overrides.items():
            args += ["--param", f"{k}={json.dumps(to_jsonable(v))}"]
        return args


def lesson_step(lessons: Sequence[str]) -> Step:
    return Step(LESSON_EXPERIMENT, {"lessons": list(lessons)})


# The experiment parts, by their H100 records' durations (seconds in brackets; "new" has no record yet and
# counts DEFAULT_STEP_S). An experiment recorded in pieces has one step per piece, with its overrides (the model
# ladder: studies.ladder.LADDER_PIECES). They come after the lessons (packed into parts by plan_parts), which
# record what their pages run, so most of these steps are done by then: first what no GPU has recorded yet
# (issue 20's ladder, FP8 and emulation costs, then the experiments with no record), then RERECORD_PARTS: the
# experiments recorded on an H100 before, again on this GPU.
EXPERIMENT_PARTS: tuple[tuple[Step, ...], ...] = (
    *(tuple(Step("scale_ladder", piece) for piece in LADDER_PIECES[i:i + 2])
      for i in range(0, len(LADDER_PIECES), 2)),                                       # new, new
    (Step("fp8_compiled_speed"), Step("fp8_linear_speed")),                             # new, 12
    (Step("fp16_divergence"),),   # new: up to 6 runs of 250 steps, the explicit ones stop at their first NaN
    (Step("mx_emulation_cost"), Step("monitor_overhead")),                              # new, 34
    (Step("data_loading"), Step("clipping_runs"), Step("bf16_update_stagnation")),      # new, new, new
    # FP8 training one recipe per step: all six at once run for about 40 minutes on an H100 (results/README.md)
    *(tuple(Step("fp8_training", {"recipes": [r]}) for r in FP8_TRAINING_RECIPES[i:i + 3]) for i in (0, 3)),
    (Step("data_parallel"), Step("reduction_precision")),                               # new, new
    # block-scaled training one recipe per step, as FP8's: at the old full size NVFP4's emulation alone took
    # 143 s for 10 steps x 3 seeds on an H100, before its random bits moved to the device (results/README.md)
    *(tuple(Step("mx_training", {"recipes": [r]}) for r in MX_TRAINING_RECIPES[i:i + 3]) for i in (0, 3, 6)),
    (Step("mx_block_study"),),                                                          # new
)
RERECORD_PARTS: tuple[tuple[Step, ...], ...] = (
    (Step("convergence_parity"), Step("tf32_matmul_rounding"), Step("autocast_trace"),  # 418, 1, 7
     Step("profiled_step"), Step("training_memory")),                                   # 9, 9
    (Step("underflow_statistics"), Step("scaler_flight_recording"), Step("matmul_throughput")),  # 306, 160, 52
    (Step("fp8_scaling_lab"), Step("training_throughput"), Step("monitor_faults")),    # 225, 204, 62
    (Step("model_magnitudes"),),                                                        # 106
)

# registered experiments the GPU session leaves out, with the reason (none since the full profile's re-size:
# mx_training and mx_block_study ran past a 10-minute command at the earlier full size)
SKIPPED: dict[str, str] = {}

# Steps that failed or ran past the budget, one JSON line each, written beside the new records and committed
# with them: `run --next` passes over a step that did so on this GPU (else every call would start the same
# step again), and `run --part N` tries it again.
ATTEMPTS_FILE = "gpu_session_attempts.jsonl"


@dataclass(frozen=True)
class Estimate:
    seconds: float
    source: str      # where the number comes from: a record's GPU, or "default"


@dataclass(frozen=True)
class Part:
    number: int
    steps: tuple[Step, ...]


def _gpu_full(records: Sequence[Record]) -> list[Record]:
    return [r for r in records if r.provenance.device_type == "cuda" and r.parameters.get("size") == "full"
            and r.parameters.get("max_steps") is None]


def _preferring(records: list[Record], device_name: str | None) -> list[Record]:
    """Newest first, this GPU's records before the others' (``records`` come newest first)."""
    return sorted(records, key=lambda r: r.provenance.device_name != device_name)


def _lesson_seconds(record: Record) -> dict[str, float]:
    try:
        return {t["lesson"]: float(t["seconds"]) for t in record.values["result"]["lessons"]}
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{record.path}: not a lesson_times record") from None


def estimate(step: Step, records: Sequence[Record], device_name: str | None = None) -> Estimate:
    """Seconds ``step`` should take: its newest full-size GPU record's (this GPU's first), else the default;
    a lessons step sums each lesson's newest time."""
    mine = _preferring([r for r in _gpu_full(records) if r.experiment == step.experiment], device_name)
    if step.experiment == LESSON_EXPERIMENT and "lessons" in step.overrides:
        total, sources = 0.0, set[str]()
        for lesson in step.overrides["lessons"]:
            timed = [(_lesson_seconds(r)[lesson], r.provenance.device_name) for r in mine
                     if lesson in _lesson_seconds(r)]
            seconds, source = timed[0] if timed else (DEFAULT_LESSON_S, "default")
            total, sources = total + seconds, sources | {source}
        return Estimate(total, ", ".join(sorted(sources)))
    for r in mine:
        if r.parameters.get("overrides", {}) == to_jsonable(dict(step.overrides)) and "seconds" in r.parameters:
            return Estimate(float(r.parameters["seconds"]), r.provenance.device_name)
    return Estimate(DEFAULT_STEP_S, "default")


def pending(step: Step, records: Sequence[Record], device_name: str | None) -> Step | None:
    """What of ``step`` is still to run on the GPU named ``device_name``: None when its records are there (made
    at today's full profile: a record of an earlier course model does not count); for a lessons step, the
    lessons not yet timed on this GPU (in any such record)."""
    mine = [r for r in _gpu_full(records) if r.experiment == step.experiment
            and device_name is not None and r.provenance.device_name == device_name
            and r.parameters.get("course_model") == (None if step.experiment in NO_COURSE_MODEL else FULL_MODEL)]
    if step.experiment == LESSON_EXPERIMENT and "lessons" in step.overrides:
        timed = {lesson for r in mine for lesson in _lesson_seconds(r)}
        left = [lesson for lesson in step.overrides["lessons"] if lesson not in timed]
        return None if not left else (step if len(left) == len(step.overrides["lessons"]) else lesson_step(left))
    return None if any(covers(r, step) for r in mine) else step


def covers(record: Record, step: Step) -> bool:
    """Whether ``record`` (of ``step``'s experiment) ran what ``step`` runs: the same overrides, or, for a
    step that runs a few recipes (``recipes``), a record with otherwise the same overrides whose result
    trained every one of them (a lesson's run of all recipes covers the one-recipe pieces)."""
    have, wanted = record.parameters.get("overrides", {}), to_jsonable(dict(step.overrides))
    if have == wanted:
        return True
    if "recipes" not in wanted or {k: v for k, v in have.items() if k != "recipes"} != {
            k: v for k, v in wanted.items() if k != "recipes"}:
        return False
    result = record.values.get("result")
    ran = result.get("recipes") if isinstance(result, Mapping) else None
    return isinstance(ran, list) and set(wanted["recipes"]) <= set(ran)


def plan_parts(lessons: Sequence[str], records: Sequence[Record], device_name: str | None = None,
               *, limit_s: float = PART_LIMIT_S) -> list[Part]:
    """``lessons`` packed in order into parts of at most ``limit_s`` estimated seconds (a lesson estimated
    above the limit gets a part of its own), then the experiment parts, then the parts that record again what
    an H100 recorded before. The lessons come first: each records the experiments it runs (see
    :func:`lesson_record_env`), so those experiments' steps are done when their turn comes."""
    groups: list[list[str]] = []
    used = limit_s
    for lesson in lessons:
        seconds = estimate(lesson_step([lesson]), records, device_name).seconds
        if used + seconds > limit_s:
            groups.append([])
            used = 0.0
        groups[-1].append(lesson)
        used += seconds
    parts = [*((lesson_step(g),) for g in groups), *EXPERIMENT_PARTS, *RERECORD_PARTS]
    return [Part(i, tuple(steps)) for i, steps in enumerate(parts, 1)]


def plan_problems(parts: Sequence[Part], records: Sequence[Record], registered: Sequence[str],
                  lessons: Sequence[str], *, skipped: Mapping[str, str] = SKIPPED,
                  limit_s: float = PART_LIMIT_S) -> list[str]:
    """What is wrong with a plan, one sentence each (empty when nothing): a registered experiment neither
    planned nor skipped with a reason, a step planned twice or naming no registered experiment, a lesson
    not timed exactly once, a part estimated over ``limit_s``."""
    problems = []
    steps = [s for p in parts for s in p.steps]
    planned = {s.experiment for s in steps}
    for name in sorted(set(registered) - planned - set(skipped)):
        problems.append(f"experiment {name!r} is registered but neither planned nor skipped")
    for name in sorted(set(skipped) & planned):
        problems.append(f"experiment {name!r} is both planned and skipped")
    for name, reason in skipped.items():
        if not reason.strip():
            problems.append(f"experiment {name!r} is skipped without a reason")
    for name in sorted(planned - set(registered)):
        problems.append(f"experiment {name!r} is planned but not registered")
    keys = [s.key for s in steps]
    for key in sorted({k for k in keys if keys.count(k) > 1}):
        problems.append(f"step {key[0]} {key[1]} is planned more than once")
    timed = [lesson for s in steps if s.experiment == LESSON_EXPERIMENT for lesson in s.overrides.get("lessons", [])]
    for lesson in sorted(set(lessons) - set(timed)):
        problems.append(f"lesson {lesson!r} is not timed")
    for lesson in sorted(set(timed) - set(lessons)):
        problems.append(f"{lesson!r} is timed but is no lesson")
    for lesson in sorted({t for t in timed if timed.count(t) > 1}):
        problems.append(f"lesson {lesson!r} is timed {timed.count(lesson)} times")
    for part in parts:
        seconds = sum(estimate(s, records).seconds for s in part.steps)
        if seconds > limit_s and not (len(part.steps) == 1 and part.steps[0].experiment == LESSON_EXPERIMENT
                                      and len(part.steps[0].overrides.get("lessons", [])) == 1):
            problems.append(f"part {part.number} is estimated at {seconds:.0f} s, over {limit_s:.0f} s")
    return problems


def plan_text(parts: Sequence[Part], records: Sequence[Record], device_name: str | None,
              attempts: Sequence[Mapping[str, Any]] = ()) -> str:
    """The plan as text: per part its estimate and steps, each with its estimate's source and whether the GPU
    named ``device_name`` has done it (or failed or overran it before: ``attempts``), then the experiments
    left out, with the reason."""
    lines = [f"GPU: {device_name or 'none here (nothing counts as done)'}"]
    total = 0.0
    for part in parts:
        estimates = [estimate(s, records, device_name) for s in part.steps]
        seconds = sum(e.seconds for e in estimates)
        total += seconds
        done = sum(pending(s, records, device_name) is None for s in part.steps)
        lines.append(f"part {part.number}: about {seconds / 60:.1f} min, {done}/{len(part.steps)} steps done")
        for s, e in zip(part.steps, estimates):
            mark = "done" if pending(s, records, device_name) is None else "to do"
            before = failed_before(s, attempts, device_name) if mark == "to do" else None
            mark = f"to do; {before}" if before else mark
            lines.append(f"  [{mark}] {s.label}: {e.seconds:.0f} s ({e.source})")
    lines.append(f"all parts: about {total / 60:.0f} min")
    lines += [f"left out: {name}: {reason}" for name, reason in SKIPPED.items()]
    return "\n".join(lines)


def read_attempts(*folders: Path) -> list[dict[str, Any]]:
    """Every failed or overrun step noted in :data:`ATTEMPTS_FILE` of ``folders`` (each line once)."""
    seen: dict[str, dict[str, Any]] = {}
    for folder in folders:
        path = folder / ATTEMPTS_FILE
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    seen.setdefault(line, json.loads(line))
    return list(seen.values())


def note_attempt(out: Path, step: Step, device_name: str | None, outcome: str, seconds: float) -> None:
    """Append to ``out``/:data:`ATTEMPTS_FILE` that ``step`` ``outcome`` ("failed (exit N)" or "overran")
    on the GPU named ``device_name`` after ``seconds``."""
    out.mkdir(parents=True, exist_ok=True)
    line = {"step": step.label, "device": device_name, "outcome": outcome, "seconds": round(seconds, 1),
            "date": time.strftime("%Y-%m-%dT%H:%M:%S")}
    with (out / ATTEMPTS_FILE).open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(line) + "\n")


def failed_before(step: Step, attempts: Sequence[Mapping[str, Any]], device_name: str | None) -> str | None:
    """How ``step`` went wrong on the GPU named ``device_name`` before (the latest note), or None."""
    notes = [a for a in attempts if a.get("step") == step.label and a.get("device") == device_name]
    return f"{notes[-1]['outcome']} on {notes[-1]['date']}" if notes else None


def lesson_record_env(args: Sequence[str]) -> dict[str, str]:
    """The environment a ``python -m course_lib.record ARGS`` command adds for its run: for ``lesson_times``,
    the folder (its ``--out``) into which every experiment a lesson runs is also recorded, and the command
    that the records' provenance names (:data:`course_lib.studies.lesson_times.RECORD_DIR_ENV`); else none."""
    if not args or args[0] != LESSON_EXPERIMENT or "--out" not in args:
        return {}
    out = args[list(args).index("--out") + 1]
    return {RECORD_DIR_ENV: str(Path(out).resolve()),
            RECORD_COMMAND_ENV: record_command(args)}


def run_record(args: list[str], timeout_s: float) -> int:
    """Run ``python -m course_lib.record ARGS`` in a process of its own (with :func:`lesson_record_env`'s
    environment); its exit status (124 past ``timeout_s``)."""
    try:
        return subprocess.run([sys.executable, "-m", "course_lib.record", *args], timeout=timeout_s,
                              env={**os.environ, **lesson_record_env(args)}).returncode
    except subprocess.TimeoutExpired:
        return 124


def run_part(part: Part, *, results: Path, out: Path, device_name: str | None, budget_s: float,
             allow_cpu: bool = False, runner: Callable[[list[str], float], int] | None = None,
             say: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic,
             retry: bool = True) -> str:
    """Run what is pending of ``part`` on the GPU named ``device_name``, each step by ``runner``, writing
    records into ``out`` (``runner`` defaults to :func:`run_record`); stop before a step estimated to end
    past ``budget_s``. A step that fails or overruns is noted (:func:`note_attempt`); with ``retry`` False,
    a step noted before on this GPU is passed over. Returns "done", "failed" (a step exited non-zero or was
    passed over; the others still ran) or "stopped" (the budget)."""
    start, status = clock(), "done"
    runner = runner if runner is not None else run_record
    for step in part.steps:
        records = _records(results, out)
        todo = pending(step, records, device_name)
        if todo is None:
            say(f"done already: {step.label}")
            continue
        before = failed_before(step, read_attempts(results, out), device_name)
        if before is not None and not retry:
            say(f"passing over {step.label}: {before} (run --part {part.number} to try it again)")
            status = "failed"
            continue
        left = budget_s - (clock() - start)
        need = estimate(todo, records, device_name).seconds
        if need > left:
            say(f"stopping before {todo.label}: about {need:.0f} s, {left:.0f} s left of the budget")
            return "stopped"
        say(f"running {todo.label} (about {need:.0f} s)")
        began = clock()
        code = runner([*todo.record_args(out), *(["--allow-cpu"] if allow_cpu else [])], left)
        if code == 124:
            say(f"stopped {todo.label} at the budget, unrecorded")
            note_attempt(out, step, device_name, "overran", clock() - began)
            return "stopped"
        if code != 0:
            say(f"FAILED ({code}): {todo.label}")
            note_attempt(out, step, device_name, f"failed (exit {code})", clock() - began)
            status = "failed"
    return status


def _records(*folders: Path) -> list[Record]:
    seen: dict[Path, Record] = {}
    for folder in folders:
        if folder.is_dir():
            for r in load_records(results_dir=folder):
                seen.setdefault(r.path.resolve() if r.path else Path(), r)
    return sorted(seen.values(), key=lambda r: r.provenance.date, reverse=True)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course_lib.gpu_session", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("plan", "run"):
        q = sub.add_parser(name)
        q.add_argument("--results", type=Path, default=Path("results"),
                       help="the committed records, read to tell what is done (default: results)")
        q.add_argument("--out", type=Path, default=None, help="folder new records go to (default: --results)")
        q.add_argument("--device-name", default=None,
                       help="count records of this GPU as done (default: this machine's GPU)")
    run = sub.choices["run"]
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--next", action="store_true", help="the first part with something left to do")
    which.add_argument("--part", type=int, metavar="N", help="part N of the plan")
    run.add_argument("--budget-s", type=float, default=RUN_BUDGET_S,
                     help=f"seconds: stop before a step estimated to end later (default {RUN_BUDGET_S:.0f})")
    run.add_argument("--allow-cpu", action="store_true", help="run on a CPU (tests only; passed to record)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    out = args.out if args.out is not None else args.results
    hw = describe_hardware(select_device())
    device_name = args.device_name or (hw.name if hw.device_type == "cuda" or args.command == "run" else None)
    records = _records(args.results, out)
    lessons = lesson_names()
    parts = plan_parts(lessons, records, device_name)
    problems = plan_problems(parts, records, sorted(EXPERIMENTS), lessons)
    if args.command == "plan":
        print(plan_text(parts, records, device_name, read_attempts(args.results, out)))
        print("\n".join(f"problem: {p}" for p in problems))
        return 1 if problems else 0
    if hw.device_type != "cuda" and not args.allow_cpu:
        print("refusing to run on a CPU: the session records GPU measurements", file=sys.stderr)
        return 2
    if args.part is not None and not 1 <= args.part <= len(parts):
        print(f"--part must be 1..{len(parts)}", file=sys.stderr)
        return 2
    attempts = read_attempts(args.results, out)
    todo = [p for p in parts if any(pending(s, records, device_name) and failed_before(s, attempts, device_name)
                                    is None for s in p.steps)]
    if args.next and not todo:
        passed = [s.label for p in parts for s in p.steps
                  if pending(s, records, device_name) and failed_before(s, attempts, device_name)]
        print(f"every part is done on {device_name}" + (
            f", but for {len(passed)} step(s) that failed or overran before ({ATTEMPTS_FILE}): "
            + "; ".join(passed) if passed else ""))
        return 1 if passed else 0
    # --next goes on into the following parts while the budget lasts: a short loan does as much as fits; it
    # passes over a step that failed or overran on this GPU before, which --part N tries again
    queue = todo if args.next else [parts[args.part - 1]]
    start, statuses = time.monotonic(), []
    for part in queue:
        left = args.budget_s - (time.monotonic() - start)
        print(f"part {part.number} of {len(parts)} on {device_name}, {left:.0f} s of the budget left", flush=True)
        status = run_part(part, results=args.results, out=out, device_name=device_name, budget_s=left,
                          allow_cpu=args.allow_cpu, say=lambda line: print(line, flush=True), retry=not args.next)
        print(f"part {part.number}: {status}", flush=True)
        statuses.append(status)
        if status == "stopped":
            break
    left_parts = sum(any(pending(s, _records(args.results, out), device_name) for s in p.steps) for p in parts)
    print(f"parts with something left on {device_name}: {left_parts}")
    return 3 if "stopped" in statuses else 1 if "failed" in statuses else 0

if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
