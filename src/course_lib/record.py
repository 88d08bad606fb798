"""Run named experiments at full size and record them with provenance.

Usage::

    python -m course_lib.record EXPERIMENT [EXPERIMENT ...] --out results/
    python -m course_lib.record --all --out results/
    python -m course_lib.record --list
    python -m course_lib.record scale_ladder --param 'rungs=["gpt2-small"]' --out results/

Each experiment writes ``results/<experiment>__<device>__<date>.json`` and the raw log of the run beside
it. Records are for real hardware measurements: on a machine without a GPU the command refuses unless
``--allow-cpu`` is given (the tests use that, writing into a temporary folder). ``--param KEY=JSON`` runs one
experiment with one of its parameters changed from the registry's; the record's parameters hold the value it ran
with and, under ``overrides``, what the command changed.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path

from .device import SizeProfile, describe_hardware, select_device
from .experiments import EXPERIMENTS, Experiment, get_experiment, record_command, record_experiment
from .tables import MarkdownTable, markdown_table
from .models import GPTConfig, gpt_config_for, profile_model
from .results import EARLIER_FULL_MODEL, EARLIER_FULL_UNTIL, Record, load_records


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m course_lib.record", description=__doc__.split("\n\n")[0])
    p.add_argument("experiments", nargs="*", help="names of registered experiments (see --list)")
    p.add_argument("--out", type=Path, default=Path("results"), help="folder for records (default: results)")
    p.add_argument("--size", choices=("small", "full"), default="full",
                   help="size profile to run at (default: full)")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--allow-cpu", action="store_true",
                   help="allow recording on a CPU (for tests; course records come from GPUs)")
    p.add_argument("--max-steps", type=int, default=None, metavar="N",
                   help="cap every training run at N steps (smoke runs and tests; not for course records)")
    p.add_argument("--param", action="append", default=[], metavar="KEY=JSON",
                   help="run with the registry's parameter KEY set to the JSON value (repeatable; one experiment "
                        "only), e.g. --param 'rungs=[\"gpt2-small\"]'")
    p.add_argument("--all", action="store_true", help="run every registered experiment this device can run")
    p.add_argument("--list", action="store_true", help="list the registered experiments and exit")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if args.list:
        for name in sorted(EXPERIMENTS):
            exp = EXPERIMENTS[name]
            print(f"{name}{' (needs CUDA)' if exp.requires_cuda else ''}: {exp.description}")
        return 0
    if args.all and args.experiments:
        print("give experiment names or --all, not both", file=sys.stderr)
        return 2
    if not args.experiments and not args.all:
        print("name at least one experiment (see --list), or give --all", file=sys.stderr)
        return 2
    try:
        for name in args.experiments:
            get_experiment(name)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    device = select_device() if args.device is None else args.device
    hw = describe_hardware(device)
    if hw.device_type != "cuda" and not args.allow_cpu:
        print("refusing to record on a CPU: course records are GPU measurements (use --allow-cpu for tests)",
              file=sys.stderr)
        return 2
    if args.all:
        args.experiments = [n for n in sorted(EXPERIMENTS)
                            if hw.device_type == "cuda" or not EXPERIMENTS[n].requires_cuda]
    if args.max_steps is not None and args.max_steps < 1:
        print("--max-steps must be a positive number of steps", file=sys.stderr)
        return 2
    profile = SizeProfile(args.size, forced=True, max_steps=args.max_steps)
    overrides: dict = {}
    if args.param:
        if args.all or len(args.experiments) != 1:
            print("--param changes one experiment's parameters: name exactly one experiment", file=sys.stderr)
            return 2
        try:
            overrides = parse_overrides(get_experiment(args.experiments[0]), args.param, profile, device)
        except ValueError as exc:
            print(str(exc), file=sys.stderr)
            return 2
    command = record_command(argv)
    status = 0
    for index, name in enumerate(args.experiments, 1):
        try:
            path, _ = record_experiment(name, profile, device, out=args.out, command=command, overrides=overrides,
                                        heading=f"experiment {index}/{len(args.experiments)}: {name}")
        except Exception:  # record nothing for a failed run, but keep going with the others
            print(f"[{time.strftime('%H:%M:%S')}] FAILED:\n" + traceback.format_exc(), flush=True)
            status = 1
            continue
        print(f"wrote {path}", flush=True)
    return status


def parse_overrides(exp: Experiment, items: list[str], profile: SizeProfile, device) -> dict:
    """``KEY=JSON`` items as parameter overrides for ``exp``: each KEY must be a keyword the study takes or a
    parameter the registry gives it at ``profile``, each value JSON; a JSON list stands for a tuple where the
    registry's value is one. ``ValueError`` naming what does not fit."""
    registry = exp.parameters_for(profile, device)
    taken = [q.name for q in list(inspect.signature(exp.study).parameters.values())[2:]
             if q.kind in (q.POSITIONAL_OR_KEYWORD, q.KEYWORD_ONLY)]
    allowed = sorted(set(taken) | set(registry))
    overrides: dict = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--param takes KEY=JSON, got {item!r}")
        if key not in allowed:
            raise ValueError(f"{exp.name!r} has no parameter {key!r}; its parameters: {', '.join(allowed) or 'none'}")
        if key in overrides:
            raise ValueError(f"--param {key} is given twice")
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"--param {key}: {text!r} is not JSON ({exc.msg}); quote strings, e.g. "
                             f"{key}='\"text\"'") from None
        if isinstance(value, list) and isinstance(registry.get(key), tuple):
            value = tuple(value)
        overrides[key] = value
    try:
        inspect.signature(exp.study).bind(profile, device, **{**registry, **overrides})
    except TypeError as exc:
        raise ValueError(f"{exp.name!r} does not take these parameters: {exc}") from None
    return overrides


def records_status_markdown(results_dir: str | Path | None = None) -> MarkdownTable:
    """Markdown table: every registered experiment, whether it needs CUDA, and the GPU records of it (a full-size
    record of the course model before its re-size marked as such: its model was narrower than today's; a record
    made before a change to the code it measured marked with what it measured instead)."""
    records = load_records(results_dir=results_dir, device_type="cuda") if results_dir is not None \
        else load_records(device_type="cuda")
    rows = []
    for name in sorted(EXPERIMENTS):
        mine = [r for r in records if r.experiment == name]
        where = "; ".join(f"{r.label}, {r.provenance.date[:10]}"
                          + _record_notes(r, EXPERIMENTS[name])
                          for r in mine) or "not yet"
        rows.append((f"`{name}`", "yes" if EXPERIMENTS[name].requires_cuda else "no", where))
    return markdown_table(("experiment", "needs CUDA", "recorded on a GPU"), rows)


def _record_notes(record: Record, experiment: Experiment) -> str:
    """What sets a record apart from one made today, in one parenthesis: the narrower course model, older code."""
    notes = ([f"before {EARLIER_FULL_UNTIL}: the narrower course model"] if record.earlier_full_model else []) + [
        f"older code: {what}" for what in experiment.older_code(record)]
    return f" ({'; '.join(notes)})" if notes else ""


def course_models_markdown() -> MarkdownTable:
    """Markdown table: the course model at each size profile (width, blocks, heads, context, sequences per step
    and parameters, counted from the shape), and the full profile's narrower shape that records made before
    :data:`EARLIER_FULL_UNTIL` trained (:data:`course_lib.results.EARLIER_FULL_MODEL`, counted the same way)."""
    rows = []
    for name in ("small", "full"):
        profile = SizeProfile(name)
        dims, params = profile_model(profile), gpt_config_for(profile).parameter_count()
        rows.append((f"`{name}`", dims["d_model"], dims["n_layers"], dims["n_heads"], dims["context"],
                     dims["batch"], f"{params / 1e6:.2f} M"))
    m = EARLIER_FULL_MODEL
    earlier = GPTConfig(d_model=m["d_model"], n_layers=m["n_layers"], n_heads=m["n_heads"], context=m["context"])
    rows.append((f"`full` before {EARLIER_FULL_UNTIL}", m["d_model"], m["n_layers"], m["n_heads"], m["context"],
                 m["batch"], f"{earlier.parameter_count() / 1e6:.2f} M"))
    return markdown_table(("profile", "width", "blocks", "heads", "context", "sequences per step", "parameters"),
                          rows)


def _iso(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


NO_NBMAKE_RUNS = ("This book build executed every page itself, the lessons included: the table below lists "
                  "them.")


def executed_notebooks_markdown(paths) -> str:
    """The execution of notebooks that nbclient (nbmake, in ``make test``) ran and saved: per notebook, when it
    started, its wall time from the first cell's start to the last cell's reply, its code cells, and whether
    any cell raised. Where no notebook carries nbclient's timing metadata (``make book`` executes the lessons
    itself), a sentence that says so and points to the book's own execution table: never an empty string,
    which IPython would display as the Markdown object's repr."""
    rows = []
    for path in paths:
        path = Path(path)
        try:
            nb = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"cannot read notebook {path}: {exc}") from exc
        cells = [c for c in nb.get("cells", []) if c.get("cell_type") == "code"]
        timed = [c["metadata"]["execution"] for c in cells
                 if {"iopub.execute_input", "shell.execute_reply"} <= set(c.get("metadata", {}).get("execution", {}))]
        if not timed:
            continue
        start = min(_iso(t["iopub.execute_input"]) for t in timed)
        end = max(_iso(t["shell.execute_reply"]) for t in timed)
        failed = any(o.get("output_type") == "error" for c in cells for o in c.get("outputs", []))
        rows.append((path.stem, start.strftime("%Y-%m-%d %H:%M UTC"), f"{(end - start).total_seconds():.1f}",
                     len(cells), "error" if failed else "ok"))
    if not rows:
        return NO_NBMAKE_RUNS
    return ("The lessons were executed as notebooks before this book was assembled (nbmake, in `make test`), so "
            "the book build did not execute them again. Their runs:\n\n"
            + markdown_table(("lesson", "started", "wall time (s)", "code cells", "status"), rows))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
