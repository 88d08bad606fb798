"""Starting a group: ``launch_local`` runs N local processes with torchrun's variables and reports a failing
rank without hanging; ``main`` is the command line that torchrun starts."""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..device import SizeProfile
from .reduce import COMM_HOOKS, REDUCE_CHECK_DTYPES, REDUCE_CHECK_VALUES, reduce_check_plan
from .worker import (
    DEFAULT_TIMEOUT_S,
    DTYPES_BY_NAME,
    SCALERS,
    WRAPPERS,
    DistributedResult,
    DistRun,
    choose_backend,
    load_progress,
    load_rank_history,
    run_worker,
    setup_for_run,
)


class DistributedRunError(RuntimeError):
    """A rank failed (its error is in the message) or the launch ran past its timeout."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_local(runs, *, world_size: int = 2, size: str = "small", backend: str = "auto",
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_steps: int | None = None,
                 reduce_check: bool = False, reduce_check_sizes=(REDUCE_CHECK_VALUES,),
                 reduce_check_dtypes=REDUCE_CHECK_DTYPES) -> DistributedResult:
    """Start ``world_size`` local processes running ``python -m course_lib.distributed`` with torchrun's
    environment (env:// rendezvous on 127.0.0.1), train every run in ``runs`` in them, and return each rank's
    history. Any rank that fails ends the launch with :class:`DistributedRunError` carrying its error; the
    other ranks are given a few seconds to exit and are then killed, as is everything at ``timeout_s``; the
    error names the ranks still running and, from their progress marks, any that had not reached the point
    where the others wait. ``reduce_check``: after the runs, all-reduce :func:`reduce_check_inputs` of every
    length in ``reduce_check_sizes`` on the first 2, ..., ``world_size`` ranks in every dtype of
    ``reduce_check_dtypes`` and keep the results (see :meth:`DistributedResult.all_reduce_mismatches`);
    ``runs`` may then be empty."""
    runs = [runs] if isinstance(runs, DistRun) else list(runs)
    if (not runs and not reduce_check) or not all(isinstance(r, DistRun) for r in runs):
        raise TypeError("runs must be a DistRun or a non-empty sequence of DistRun")
    if len({r.name for r in runs}) != len(runs):
        raise ValueError("every run in one launch needs its own name")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int of at least 2 (a data-parallel run), got {world_size!r}")
    if size not in ("small", "full"):
        raise ValueError(f"size must be 'small' or 'full', got {size!r}")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    sizes, dtypes = tuple(reduce_check_sizes), tuple(reduce_check_dtypes)
    reduce_check_plan(world_size, sizes)                     # refuses empty or non-positive sizes
    if not dtypes or any(d not in DTYPES_BY_NAME for d in dtypes):
        raise ValueError(f"reduce_check_dtypes must name some of {', '.join(DTYPES_BY_NAME)}, got {dtypes!r}")
    for r in runs:
        r.check_world_size(world_size)
    chosen = choose_backend(backend, world_size)
    if runs:
        batch = setup_for_run(runs[0], SizeProfile(size), torch.device("cpu")).sampler.batch_size
        if batch % world_size:
            raise ValueError(f"the global batch of {batch} sequences does not split evenly over {world_size} ranks")
    with tempfile.TemporaryDirectory(prefix="course_dist_") as tmp:
        out = Path(tmp)
        plan = out / "plan.json"
        plan.write_text(json.dumps([asdict(r) for r in runs]))
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
               "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size)}
        args = [sys.executable, "-m", "course_lib.distributed", "--plan", str(plan), "--out", str(out),
                "--size", size, "--backend", chosen]
        if max_steps is not None:
            args += ["--max-steps", str(max_steps)]
        if reduce_check:
            args += ["--reduce-check", "--reduce-check-sizes", ",".join(map(str, sizes)),
                     "--reduce-check-dtypes", ",".join(dtypes)]
        start = time.perf_counter()
        procs, logs = [], []
        for rank in range(world_size):
            log = open(out / f"rank{rank}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(args, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                          stdout=log, stderr=subprocess.STDOUT))
        try:
            failed = _wait(procs, start, timeout_s)
            running = [rank for rank, p in enumerate(procs) if p.poll() is None]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()
        if failed or running:
            raise DistributedRunError(_diagnosis(out, world_size, failed, running, timeout_s))
        collected = {r.name: tuple(load_rank_history(out, r.name, k) for k in range(world_size)) for r in runs}
        reduced = {name: torch.load(out / f"all_reduce.{name}.pt", weights_only=True)
                   for name in (dtypes if reduce_check else ())}
        return DistributedResult(world_size, chosen, collected, time.perf_counter() - start, reduced, sizes)


def _wait(procs, start: float, timeout_s: float, grace_s: float = 5.0) -> dict[int, int]:
    """Wait for every process to exit, for ``grace_s`` after the first failure, or until ``timeout_s``; the
    ranks seen failing first ({rank: exit status}: several when they fail within one poll)."""
    first_failures: dict[int, int] = {}
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        if not first_failures:
            first_failures = {rank: code for rank, code in enumerate(codes) if code not in (None, 0)}
            failed_at = time.perf_counter() if first_failures else None
        if all(c is not None for c in codes):
            return first_failures
        now = time.perf_counter()
        if failed_at is not None and now - failed_at > grace_s:
            return first_failures      # the others are stuck on the dead rank: the caller kills them
        if now - start > timeout_s:
            return first_failures
        time.sleep(0.05)


def _ranks(ranks) -> str:
    ranks = list(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _diagnosis(out: Path, world_size: int, failed: dict[int, int], running: list[int], timeout_s: float) -> str:
    """The message of a failed or hung launch: the rank that failed first (the one furthest behind when
    several failed at once), else that the launch timed out; which ranks were still running; which of them
    had not reached the point where the others wait (by :class:`ProgressMarks`); one rank's last output."""
    marks = {rank: load_progress(out, rank) for rank in range(world_size)}
    index = {rank: (mark[0] if mark else 0) for rank, mark in marks.items()}

    def where(rank: int) -> str:
        mark = marks[rank]
        return repr(mark[1]) if mark else "no mark yet (before joining the group)"

    lines = []
    if failed:
        culprit = min(failed, key=lambda r: (index[r], r))
        error = _last_error(out, culprit)
        lines.append(f"rank {culprit} of {world_size} exited with status {failed[culprit]}"
                     f"{f': {error}' if error else ''}")
        if running:
            lines.append(f"{_ranks(running)} still running when the launch stopped them")
    else:
        culprit = running[0]
        lines.append(f"the launch ran past its timeout of {timeout_s:g} s with {_ranks(running)} of {world_size} "
                     "still running")
    furthest = max(index.values())
    behind = [r for r in running if index[r] < furthest]
    ahead = [r for r in range(world_size) if index[r] == furthest]
    if behind:
        culprit = behind[0]
        lines.append(f"{_ranks(behind)} had not reached {where(ahead[0])}, where {_ranks(ahead)} "
                     f"{'were' if len(ahead) > 1 else 'was'} (in a collective waiting for "
                     f"{'them' if len(behind) > 1 else 'it'}, most likely): "
                     + "; ".join(f"rank {r}'s last mark was {where(r)}" for r in behind))
    elif len(running) > 1:
        lines.append(f"every running rank was at the same point ({where(running[0])}): their progress marks "
                     "do not tell which one held the others up")
    elif running:
        lines.append(f"rank {running[0]}'s last mark was {where(running[0])}")
    output = _plain_log(out, culprit)[-15:]
    lines.append(f"rank {culprit}'s last output:" + ("\n" + "\n".join(output) if output else " none"))
    return "\n".join(lines)


def _plain_log(out: Path, rank: int) -> list[str]:
    text = (out / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
    return [line.split("]: ", 1)[1] if line.startswith("[rank") and "]: " in line else line for line in text]


def _last_error(out: Path, rank: int) -> str | None:
    errors = [line for line in _plain_log(out, rank) if line and not line[0].isspace() and "Error: " in line]
    return errors[-1] if errors else None


def _int_list(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def _name_list(text: str) -> tuple[str, ...]:
    names = tuple(text.split(","))
    if any(n not in DTYPES_BY_NAME for n in names):
        raise argparse.ArgumentTypeError(f"dtypes must be some of {', '.join(DTYPES_BY_NAME)}, got {text!r}")
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m course_lib.distributed",
        description="Train the course model data-parallel with a precision recipe (one process per rank).")
    p.add_argument("--recipe", default="bf16_autocast", help="a course_lib.train recipe (default bf16_autocast)")
    p.add_argument("--wrapper", choices=WRAPPERS, default="ddp", help="ddp (default), fsdp or manual")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--comm-hook", choices=COMM_HOOKS, default=None, help="DDP gradient compression")
    p.add_argument("--param-dtype", choices=tuple(DTYPES_BY_NAME), default=None, help="FSDP policy's param_dtype")
    p.add_argument("--reduce-dtype", choices=tuple(DTYPES_BY_NAME), default=None, help="FSDP policy's reduce_dtype")
    p.add_argument("--scaler", choices=SCALERS, default="auto")
    p.add_argument("--size", choices=("small", "full"), default=None,
                   help="size profile (default: full on GPUs, small on the CPU)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: NCCL when every local rank has a GPU, else gloo on the CPU")
    p.add_argument("--out", type=Path, default=None,
                   help="folder for each rank's history (JSON + .pt) and its latest progress mark")
    p.add_argument("--max-steps", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)   # launch_local's runs
    p.add_argument("--reduce-check", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--reduce-check-sizes", type=_int_list, default=(REDUCE_CHECK_VALUES,), help=argparse.SUPPRESS)
    p.add_argument("--reduce-check-dtypes", type=_name_list, default=REDUCE_CHECK_DTYPES, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("course_lib.distributed runs as one rank of a group: start it with torchrun "
              "(torchrun --nproc-per-node 2 -m course_lib.distributed ...), or call launch_local() from Python",
              file=sys.stderr)
        return 2
    try:
        if args.plan is not None:
            runs = [DistRun(**{**d, "plant_inf": tuple(d["plant_inf"]) if d["plant_inf"] else None})
                    for d in json.loads(args.plan.read_text())]
        else:
            runs = [DistRun("cli", recipe=args.recipe, wrapper=args.wrapper, steps=args.steps, seed=args.seed,
                            lr=args.lr, comm_hook=args.comm_hook, param_dtype=args.param_dtype,
                            reduce_dtype=args.reduce_dtype, scaler=args.scaler)]
    except ValueError as exc:
        print(f"course_lib.distributed: {exc}", file=sys.stderr)
        return 2
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    size = args.size or ("full" if choose_backend(args.backend, local_world) == "nccl" else "small")
    return run_worker(runs, size=size, backend=args.backend, out=args.out, max_steps=args.max_steps,
                      reduce_check=args.reduce_check, reduce_check_sizes=args.reduce_check_sizes,
                      reduce_check_dtypes=args.reduce_check_dtypes)
