"""A precision check-up for a model the course did not write: one call, or ``python -m course_lib.checkup``.

:func:`checkup` takes a function that builds the model, a loss function and a batch, and runs a few training
steps in each precision recipe the device supports (FP32, BF16 autocast, FP16 autocast with GradScaler),
watched by :class:`course_lib.monitor.GradientHealthMonitor`. It reports which ops autocast ran in which
dtype, what FP16 would do to each layer's outputs and gradients, the loss scale the gradients allow, and a
recommendation with the measurements behind it.

Command line: ``python -m course_lib.checkup package.module:factory`` where ``factory()`` returns
``(model, loss_fn, batch)``; ``loss_fn(model, batch)`` returns a scalar loss.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from .amp import trace_autocast
from .device import select_device
from .formats import get_format
from .monitor import Alert, GradientHealthMonitor, gradient_stats
from .scaling import ScalerAudit
from .tables import markdown_table
from .train import RECIPES, get_recipe, recipe_autocast

CHECKUP_RECIPES = ("fp32", "bf16_autocast", "fp16_autocast_scaler")
_VIEW_OPS = frozenset({"view", "_unsafe_view", "t", "transpose", "permute", "expand", "reshape", "detach", "alias",
                       "squeeze", "unsqueeze", "slice", "select", "split", "split_with_sizes", "clone", "contiguous",
                       "flatten", "as_strided", "unbind"})


@dataclass(frozen=True)
class RecipeCheck:
    """One recipe's few steps: ``unsupported`` (why the device cannot run it, or None), per-step losses,
    skipped steps, the scaler's final scale (None without one), median seconds per step, alerts, and each
    step's seconds."""

    recipe: str
    unsupported: str | None
    losses: tuple[float, ...]
    skipped: int
    final_scale: float | None
    seconds_per_step: float
    alerts: tuple[Alert, ...]
    step_seconds: tuple[float, ...] = ()

    @property
    def finite(self) -> bool:
        return bool(self.losses) and all(math.isfinite(v) for v in self.losses)


@dataclass(frozen=True)
class LayerRisk:
    """What FP16 would do to one layer: shares of its output values that overflow or land in the
    subnormals (from an FP32 forward), and of its weight gradient that would flush at scale 1."""

    layer: str
    output_overflow: float
    output_subnormal: float
    grad_flush: float


@dataclass(frozen=True)
class Checkup:
    """The check-up's findings; :meth:`markdown` renders them as a report."""

    device: str
    autocast_ops: tuple[dict, ...]
    recipes: dict[str, RecipeCheck]
    layers: tuple[LayerRisk, ...]
    grad_amax: float
    max_fp16_scale: float
    recommendation: str
    reasons: tuple[str, ...]
    findings: tuple = ()
    loop_audited: bool = False

    def markdown(self) -> str:
        lines = [f"**Recommendation: {self.recommendation}** (on {self.device})", ""]
        lines += [f"- {r}" for r in self.reasons]
        if self.loop_audited:
            lines += ["", "Your training step, run under the pitfall detector: " + (
                "no pitfall found." if not self.findings else "")]
            lines += [f"- **{f.pitfall}** (iteration {f.iteration}): {f.message}" for f in self.findings]
        rows = []
        for r in self.recipes.values():
            if r.unsupported:
                rows.append((r.recipe, f"no: {r.unsupported}", "", "", "", "", ""))
                continue
            scale = "" if r.final_scale is None else f"{r.final_scale:g}"
            rows.append((r.recipe, "yes", f"{r.losses[0]:.4g}", f"{r.losses[-1]:.4g}", str(r.skipped), scale,
                         f"{r.seconds_per_step:.3g}"))
        lines += ["", markdown_table(("recipe", "runs here", "first loss", "last loss", "skipped", "final scale",
                                      "s/step"), rows).rstrip("\n")]
        risky = [x for x in self.layers if x.output_overflow or x.grad_flush > 0.01]
        if risky:
            lines += ["", markdown_table(
                ("layer", "FP16: outputs overflowing", "outputs subnormal", "weight gradient flushed (scale 1)"),
                [(f"`{x.layer}`", f"{100 * x.output_overflow:.2f}%", f"{100 * x.output_subnormal:.2f}%",
                  f"{100 * x.grad_flush:.1f}%") for x in risky]).rstrip("\n")]
        else:
            lines += ["", "No layer at FP16 risk: no output overflows FP16, and no layer's weight gradient loses "
                          "more than 1% to flushing at scale 1."]
        lines += [f"The largest gradient value, {self.grad_amax:.3g}, allows an FP16 loss scale of at most "
                  f"{self.max_fp16_scale:g}."]

        def ops(kind: str) -> list[str]:
            # ops that only move or view data run in whatever dtype they are given: not autocast's choice
            return sorted(r["op"] for r in self.autocast_ops if r["runs_in"] == kind and r["op"] not in _VIEW_OPS)
        low, high, mixed = ops("low precision"), ops("fp32"), ops("mixed")
        lines += ["", f"Under autocast, computing ops that ran in low precision: {', '.join(low) or 'none'}; in FP32: "
                      f"{', '.join(high) or 'none'}" + (f"; mixed (low-precision output, FP32 statistics): "
                                                          f"{', '.join(mixed)}" if mixed else "") + "."]
        return "\n".join(lines)

    def _repr_markdown_(self) -> str:
        return self.markdown()


def _run_recipe(recipe: str, model: nn.Module, loss_fn, batch, device: torch.device, steps: int,
                lr: float) -> RecipeCheck:
    reason = get_recipe(recipe).unsupported_reason(device)   # get_recipe(recipe, device) would raise it
    if reason:
        return RecipeCheck(recipe, reason, (), 0, None, math.nan, ())
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    scaler = torch.amp.GradScaler(device.type, enabled=recipe == "fp16_autocast_scaler")
    dtype = torch.float16 if recipe == "fp16_autocast_scaler" else (
        torch.bfloat16 if recipe == "bf16_autocast" else torch.float32)
    watch = GradientHealthMonitor(model, dtype=dtype if dtype != torch.float32 else torch.bfloat16, every=1)
    losses, skipped, times = [], 0, []
    for step in range(steps):
        start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with recipe_autocast(get_recipe(recipe), device):
            loss = loss_fn(model, batch)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError("loss_fn(model, batch) must return a scalar loss tensor")
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.scale(loss).backward()
        watch.after_backward(step, scale=scale)
        marker: list[bool] = []
        hook = opt.register_step_post_hook(lambda *_: marker.append(True))
        scaler.step(opt)
        hook.remove()
        scaler.update()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
        losses.append(float(loss.detach().float()))
        skipped += not marker
        watch.after_step(step, loss=losses[-1], scale=scale, skipped=not marker)
    final = scaler.get_scale() if scaler.is_enabled() else None
    return RecipeCheck(recipe, None, tuple(losses), skipped, final, sorted(times)[len(times) // 2],
                       tuple(watch.alerts), tuple(times))


def _to_device(batch, device: torch.device):
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if isinstance(batch, (tuple, list)):
        return type(batch)(_to_device(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: _to_device(v, device) for k, v in batch.items()}
    return batch


def _layer_risks(model: nn.Module, loss_fn, batch) -> tuple[tuple[LayerRisk, ...], float]:
    """FP32 forward and backward with hooks on every Linear/Conv layer's output; classify in FP16."""
    outputs: dict[str, torch.Tensor] = {}
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))]
    handles = [m.register_forward_hook(lambda mod, i, o, n=n: outputs.__setitem__(n, o.detach()))
               for n, m in layers]
    try:
        model.zero_grad(set_to_none=True)
        loss_fn(model, batch).backward()
    finally:
        for h in handles:
            h.remove()
    risks = []
    for name, m in layers:
        out = gradient_stats(name, outputs[name], "FP16") if name in outputs else None
        w = getattr(m, "weight", None)
        grad = gradient_stats(name, w.grad, "FP16") if w is not None and w.grad is not None else None
        risks.append(LayerRisk(name, out.overflow if out else 0.0, out.subnormal if out else 0.0,
                               grad.flush if grad else 0.0))
    amax = max((float(p.grad.abs().max()) for p in model.parameters() if p.grad is not None), default=0.0)
    return tuple(risks), amax


def _audit_loop(train_step, model: nn.Module, batch, device: torch.device, steps: int, lr: float) -> tuple:
    """Run the reader's ``train_step(model, batch, optimizer, scaler)`` ``steps`` times under
    :class:`course_lib.scaling.ScalerAudit` and return its findings (a GradScaler error ends the run and is
    a finding too)."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    scaler = torch.amp.GradScaler(device.type)
    with ScalerAudit(scaler, opt, model=model) as audit:
        try:
            for _ in range(steps):
                train_step(model, batch, opt, scaler)
        except (RuntimeError, ValueError):
            pass   # recorded as a finding where the detector knows the error
    return tuple(audit.findings)


def checkup(build_model: Callable[[], nn.Module], loss_fn, batch, *, device: torch.device | str | None = None,
            steps: int = 4, lr: float = 1e-3, recipes=CHECKUP_RECIPES, tolerance: float = 0.02,
            train_step: Callable | None = None) -> Checkup:
    """Run the check-up. ``build_model()`` returns a fresh model (every recipe starts from the same
    weights: the first model is copied); ``loss_fn(model, batch)`` returns a scalar loss; ``batch`` is
    whatever ``loss_fn`` takes (its tensors are moved to the device). ``tolerance``: the largest relative
    difference from FP32's last loss that counts as the same. ``train_step(model, batch, optimizer,
    scaler)``: one iteration of the reader's own loop (given a ``torch.amp.GradScaler`` for the device);
    when given, it runs ``steps`` times under the pitfall detector and its findings join the report."""
    if not callable(build_model) or not callable(loss_fn):
        raise TypeError("build_model and loss_fn must be callables")
    if train_step is not None and not callable(train_step):
        raise TypeError("train_step must be a callable (model, batch, optimizer, scaler)")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int of at least 2, got {steps!r}")
    unknown = [r for r in recipes if r not in RECIPES]
    if unknown or "fp32" not in recipes:
        raise ValueError(f"recipes must include 'fp32' and be known to course_lib.train; got {tuple(recipes)}")
    device = torch.device(device) if device is not None else select_device()
    base = build_model()
    if not isinstance(base, nn.Module):
        raise TypeError(f"build_model() must return an nn.Module, got {type(base).__name__}")
    base = base.to(device)
    batch = _to_device(batch, device)
    if not any(p.requires_grad for p in base.parameters()):
        raise ValueError("the model has no trainable parameters")
    with torch.no_grad():
        probe = loss_fn(copy.deepcopy(base), batch)
    if not isinstance(probe, torch.Tensor) or probe.numel() != 1:
        raise TypeError(f"loss_fn(model, batch) must return a scalar loss tensor, got "
                        f"{type(probe).__name__}{'' if not isinstance(probe, torch.Tensor) else list(probe.shape)}")
    trace_model = copy.deepcopy(base)

    ops = tuple(trace_autocast(lambda: loss_fn(trace_model, batch), device_type=device.type,
                               dtype=torch.bfloat16).op_table("forward"))
    layers, amax = _layer_risks(copy.deepcopy(base), loss_fn, batch)
    fp16 = get_format("FP16")
    max_scale = 2.0 ** math.floor(math.log2(fp16.max_finite / amax)) if amax > 0 else math.inf
    checks = {r: _run_recipe(r, copy.deepcopy(base), loss_fn, batch, device, steps, lr) for r in recipes}
    recommendation, reasons = _recommend(checks, layers, max_scale, tolerance)
    findings: tuple = ()
    if train_step is not None:
        findings = _audit_loop(train_step, copy.deepcopy(base), batch, device, steps, lr)
    return Checkup(str(device), ops, checks, layers, amax, max_scale, recommendation, tuple(reasons), findings,
                   train_step is not None)


def _recommend(checks: dict[str, RecipeCheck], layers, max_scale: float, tolerance: float) -> tuple[str, list[str]]:
    ref = checks["fp32"]
    if not ref.finite:
        return "fix the model first", ["FP32 training itself produced a non-finite loss: this is not a precision "
                                       "problem (check the learning rate, the data and the loss)."]
    target = ref.losses[-1]

    def close(r: RecipeCheck) -> bool:
        return r.finite and abs(r.losses[-1] - target) <= tolerance * max(abs(target), 1e-12)

    reasons: list[str] = []
    too_slow: list[str] = []   # recipes as accurate as FP32 that lost on speed alone

    def fast_enough(r: RecipeCheck, name: str) -> bool:
        # a recipe as accurate as FP32 but slower at every step after the first (the warm-up) is no gain here
        if not slower_every_step(r, ref):
            return True
        too_slow.append(r.recipe)
        reasons.append(f"{name} matched FP32, but every step after the first took longer than every FP32 step "
                       f"(median {r.seconds_per_step:.3g} s against {ref.seconds_per_step:.3g} s, "
                       f"{r.seconds_per_step / ref.seconds_per_step:.3g} times as long): this device computes it "
                       "more slowly than FP32, so here it would save memory, not time.")
        return False

    bf16 = checks.get("bf16_autocast")
    fp16 = checks.get("fp16_autocast_scaler")
    if bf16 is not None and bf16.unsupported is None:
        gap = bf16.losses[-1] - target if bf16.finite else math.nan
        reasons.append(f"BF16 autocast's last loss was {100 * gap / max(abs(target), 1e-12):+.3g}% from FP32's "
                       f"({target:.4g}; tolerance {100 * tolerance:g}%), with no loss scaler needed.")
        if close(bf16) and fast_enough(bf16, "BF16 autocast"):
            if fp16 is not None and fp16.unsupported is None:
                reasons.append(f"FP16 with GradScaler skipped {fp16.skipped} of {len(fp16.losses)} steps; BF16 has "
                               "FP32's range and needs no scaler.")
            return "bf16_autocast", reasons
    elif bf16 is not None:
        reasons.append(f"BF16 does not run here: {bf16.unsupported}.")
    if fp16 is not None and fp16.unsupported is None:
        overflow = [x.layer for x in layers if x.output_overflow > 0]
        reasons.append(f"FP16 with GradScaler skipped {fp16.skipped} of {len(fp16.losses)} steps, ending at scale "
                       f"{fp16.final_scale:g}; the largest gradient allows a scale of at most {max_scale:g}.")
        if overflow:
            reasons.append(f"In FP16, outputs of {', '.join(overflow[:4])} overflow: keep them in FP32 or use BF16.")
        if close(fp16) and not overflow and fast_enough(fp16, "FP16 with GradScaler"):
            return "fp16_autocast_scaler", reasons
    if too_slow:
        reasons.append("Run the check-up again on the hardware you will train on: there the answer can differ.")
    else:
        reasons.append("No low-precision recipe matched FP32 here: train in FP32, or find the layer that fails "
                       "with course_lib.monitor.")
    return "fp32", reasons


def slower_every_step(r: RecipeCheck, ref: RecipeCheck) -> bool:
    """Whether every step of ``r`` after the first took longer than every step of ``ref`` after the first
    (False where either has fewer than two such steps: too few to tell a slowdown from noise)."""
    mine, theirs = r.step_seconds[1:], ref.step_seconds[1:]
    return len(mine) >= 2 and len(theirs) >= 2 and min(mine) > max(theirs)


def _load_factory(spec: str):
    if ":" not in spec:
        raise ValueError(f"expected module:function, got {spec!r}")
    module_name, func_name = spec.split(":", 1)
    module = importlib.import_module(module_name)
    factory = getattr(module, func_name, None)
    if not callable(factory):
        raise ValueError(f"{module_name} has no callable {func_name!r}")
    return factory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.checkup", description=__doc__.split("\n\n")[0])
    parser.add_argument("factory", help="module:function returning (model, loss_fn, batch)")
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda when there is one)")
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args(argv)
    factory = _load_factory(args.factory)
    model, loss_fn, batch = factory()
    result = checkup(lambda: model, loss_fn, batch, device=args.device, steps=args.steps)
    print(result.markdown())
    return 0


if __name__ == "__main__":   # pragma: no cover - exercised through main() in the tests
    sys.exit(main())
