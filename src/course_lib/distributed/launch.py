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
from .reduce import COMM_HOOKS, REDUCE_CHECK_DTYPES
from .worker import (
    DEFAULT_TIMEOUT_S,
    DTYPES_BY_NAME,
    SCALERS,
    WRAPPERS,
    DistributedResult,
    DistRun,
    choose_backend,
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
                 reduce_check: bool = False) -> DistributedResult:
    """Start ``world_size`` local processes running ``python -m course_lib.distributed`` with torchrun's
    environment (env:// rendezvous on 127.0.0.1), train every run in ``runs`` in them, and return each rank's
    history. Any rank that fails ends the launch with :class:`DistributedRunError` carrying its error; the
    other ranks are given a few seconds to exit and are then killed, as is everything at ``timeout_s``.
    ``reduce_check``: after the runs, all-reduce :func:`reduce_check_inputs` in BF16 and FP16 and keep the
    results (see :meth:`DistributedResult.all_reduce_mismatches`); ``runs`` may then be empty."""
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
            args += ["--reduce-check"]
        start = time.perf_counter()
        procs, logs = [], []
        for rank in range(world_size):
            log = open(out / f"rank{rank}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(args, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                          stdout=log, stderr=subprocess.STDOUT))
        try:
            failed = _wait(procs, start, timeout_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()
        if failed is not None:
            rank, code = failed
            text = (out / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
            plain = [line.split("]: ", 1)[1] if line.startswith("[rank") and "]: " in line else line
                     for line in text]
            errors = [line for line in plain if line and not line[0].isspace() and "Error: " in line]
            what = "ran past the launch timeout" if code is None else f"exited with status {code}"
            headline = f": {errors[-1]}" if errors else ""
            tail = "\n".join(plain[-15:])
            raise DistributedRunError(f"rank {rank} of {world_size} {what}{headline}\nits last output:\n{tail}")
        collected = {r.name: tuple(load_rank_history(out, r.name, k) for k in range(world_size)) for r in runs}
        reduced = {name: torch.load(out / f"all_reduce.{name}.pt", weights_only=True)
                   for name in (REDUCE_CHECK_DTYPES if reduce_check else ())}
        return DistributedResult(world_size, chosen, collected, time.perf_counter() - start, reduced)


def _wait(procs, start: float, timeout_s: float, grace_s: float = 5.0) -> tuple[int, int | None] | None:
    """Wait for every process; the first rank that fails (rank, exit status), or (rank, None) on timeout."""
    first_failure: tuple[int, int | None] | None = None
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0) and first_failure is None:
                first_failure, failed_at = (rank, code), time.perf_counter()
        if all(c is not None for c in codes):
            return first_failure
        now = time.perf_counter()
        if failed_at is not None and now - failed_at > grace_s:
            return first_failure       # the others are stuck on the dead rank: the caller kills them
        if now - start > timeout_s:
            return first_failure or (next(i for i, c in enumerate(codes) if c is None), None)
        time.sleep(0.05)


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
    p.add_argument("--out", type=Path, default=None, help="folder for each rank's history (JSON + .pt)")
    p.add_argument("--max-steps", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)   # launch_local's runs
    p.add_argument("--reduce-check", action="store_true", help=argparse.SUPPRESS)
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
                   reduce_check=args.reduce_check)
