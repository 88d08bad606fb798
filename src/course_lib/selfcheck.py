"""The first command to run on a new machine, a GPU above all: every code path of the course, tiny.

Usage::

    python -m course_lib.selfcheck              # on the default device (cuda if there is one)
    python -m course_lib.selfcheck --device cpu
    python -m course_lib.selfcheck --only fp8   # the checks whose name contains "fp8"

It trains every precision recipe of :mod:`course_lib.train` the device supports for a few steps, runs
every FP8 linear recipe forward and backward (through ``torch._scaled_mm`` too where it runs), and runs
every registered experiment at the small size with training capped at a few steps. It prints one row per
check (name, seconds, ok / skipped / FAILED with the reason) and exits with status 1 if any check failed.
Nothing is written to ``results/``: records come from ``python -m course_lib.record``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from dataclasses import dataclass
from typing import Callable

import torch

from .device import SizeProfile, describe_hardware, select_device
from .experiments import EXPERIMENTS, get_experiment, record_output
from .fp8 import FP8_LINEAR_RECIPES, Fp8Linear
from .hardware import format_unsupported_reason
from .jsonable import from_jsonable, to_jsonable
from .train import RECIPES, get_recipe, run_recipe

SMOKE_STEPS = 5   # training steps per run: enough to pass warm-up and take optimizer steps


@dataclass(frozen=True)
class CheckResult:
    """One check: ``status`` is ``"ok"``, ``"skipped"`` (with the reason) or ``"failed"`` (with the error)."""

    name: str
    status: str
    seconds: float
    message: str = ""


class _Skip(Exception):
    """Raised by a check the device cannot run; its message says why."""


def _recipe_check(name: str, profile: SizeProfile, device: torch.device) -> Callable[[], str]:
    def check() -> str:
        reason = get_recipe(name).unsupported_reason(device)
        if reason:
            raise _Skip(reason)
        history = run_recipe(name, profile, device, steps=SMOKE_STEPS)
        finite = [x for x in history.losses if math.isfinite(x)]
        if name != "fp16_autocast_no_scaler" and len(finite) != len(history.losses):
            raise RuntimeError(f"non-finite loss in {len(history.losses) - len(finite)} of {len(history.losses)} steps")
        return f"{len(history.losses)} steps, last loss {history.losses[-1]:.3f}"
    return check


def _fp8_check(recipe: str, device: torch.device) -> Callable[[], str]:
    def check() -> str:
        torch.manual_seed(0)
        linear = torch.nn.Linear(64, 64).to(device)
        x = torch.randn(4, 16, 64, device=device)
        results = {}
        backends = ["simulated"]
        why_not = format_unsupported_reason("fp8", device)
        if recipe in ("tensorwise", "delayed", "unscaled") and why_not is None:
            backends.append("scaled_mm")
        for backend in backends:
            layer = Fp8Linear.from_linear(linear, recipe=recipe, backend=backend, block=32)
            xb = x.clone().requires_grad_()
            out = layer(xb)
            out.square().mean().backward()
            for what, t in (("output", out), ("input gradient", xb.grad), ("weight gradient", layer.weight.grad)):
                if t is None or not bool(torch.isfinite(t).all()):
                    raise RuntimeError(f"{backend}: {what} is missing or not finite")
            results[backend] = out.detach()
        ref = linear(x).detach()
        rel = float((results["simulated"] - ref).norm() / ref.norm())
        limit = 0.3 if recipe == "unscaled" else 0.1
        if not rel < limit:
            raise RuntimeError(f"simulated output differs from FP32 by {rel:.3f} (more than {limit})")
        note = f"relative error against FP32 {rel:.3f}"
        if "scaled_mm" in results:
            gap = float((results["scaled_mm"] - results["simulated"]).norm() / results["simulated"].norm())
            if not gap < 1e-2:
                raise RuntimeError(f"torch._scaled_mm and the simulation differ by {gap:.2e}")
            note += f"; _scaled_mm against the simulation {gap:.1e}"
        elif recipe in ("tensorwise", "delayed", "unscaled"):
            note += f"; _scaled_mm not run ({why_not})"
        return note
    return check


def _experiment_check(name: str, profile: SizeProfile, device: torch.device) -> Callable[[], str]:
    def check() -> str:
        if get_experiment(name).requires_cuda and device.type != "cuda":
            raise _Skip("needs a CUDA GPU")
        output = record_output(name, profile, device)
        text = json.dumps(to_jsonable({"parameters": output.parameters, "values": output.values}), allow_nan=False)
        # what a record stores must read back into the type the lesson draws from
        result_type = get_experiment(name).result_type
        from_jsonable(result_type, json.loads(text)["values"]["result"])
        return f"{len(text):,} bytes of JSON, read back as {getattr(result_type, '__name__', 'a dict')}"
    return check


def build_checks(device: torch.device | str, *, size: str = "small") -> list[tuple[str, Callable[[], str]]]:
    """Every check, in order: precision recipes, FP8 linear recipes, registered experiments."""
    device = torch.device(device)
    profile = SizeProfile(size, forced=True, max_steps=SMOKE_STEPS)
    checks = [(f"recipe {r}", _recipe_check(r, profile, device)) for r in RECIPES]
    checks += [(f"fp8 linear {r}", _fp8_check(r, device)) for r in FP8_LINEAR_RECIPES]
    checks += [(f"experiment {e}", _experiment_check(e, profile, device)) for e in sorted(EXPERIMENTS)]
    return checks


def run_checks(checks, *, progress: Callable[[str], None] | None = None) -> list[CheckResult]:
    """Run each ``(name, check)``; a check's exception is its failure, never the end of the run."""
    results = []
    for name, check in checks:
        if progress:
            progress(f"{name} ...")
        start = time.perf_counter()
        try:
            message, status = check(), "ok"
        except _Skip as skip:
            message, status = str(skip), "skipped"
        except Exception as exc:  # report and go on: one broken path must not hide the others
            lines = traceback.format_exception_only(type(exc), exc)
            message, status = lines[-1].strip(), "failed"
        results.append(CheckResult(name, status, time.perf_counter() - start, message))
    return results


def results_table(results: list[CheckResult]) -> str:
    """A plain-text table of the results, one row per check."""
    width = max(len(r.name) for r in results) if results else 10
    rows = [f"{'check':{width}s}  {'seconds':>7s}  result"]
    for r in results:
        label = {"ok": "ok", "skipped": "skipped", "failed": "FAILED"}[r.status]
        rows.append(f"{r.name:{width}s}  {r.seconds:7.2f}  {label}: {r.message}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.selfcheck", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    parser.add_argument("--size", choices=("small", "full"), default="small",
                        help="model size for the runs (default: small; training is capped at a few steps)")
    parser.add_argument("--only", nargs="*", default=None, metavar="TEXT",
                        help="run only the checks whose name contains one of these texts")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        device = torch.device(args.device) if args.device else select_device()
        hardware = describe_hardware(device)
    except (RuntimeError, ValueError) as exc:
        print(f"cannot use device {args.device!r}: {exc}", file=sys.stderr)
        return 2
    checks = build_checks(device, size=args.size)
    if args.only is not None:
        checks = [(n, c) for n, c in checks if any(text in n for text in args.only)]
        if not checks:
            print(f"no check matches {args.only}", file=sys.stderr)
            return 2
    print(f"course_lib self-check on {hardware.summary}", flush=True)
    start = time.perf_counter()
    results = run_checks(checks, progress=lambda line: print(f"  {line}", flush=True))
    print(results_table(results))
    failed = [r for r in results if r.status == "failed"]
    skipped = sum(r.status == "skipped" for r in results)
    print(f"{len(results) - len(failed) - skipped} ok, {skipped} skipped, {len(failed)} failed "
          f"in {time.perf_counter() - start:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
