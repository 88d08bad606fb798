"""The debugging procedure as one call: FP32, the failing autocast step, the non-finite locator, the operands
the format loses, and BF16, with a verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from .locator import NonFiniteLocator
from .matmul_stats import matmul_stats


@dataclass(frozen=True)
class Diagnosis:
    """The answers of the debugging procedure for one failing model: ``steps`` as (question, answer)
    pairs in order, and the ``verdict``."""

    steps: tuple[tuple[str, str], ...]
    verdict: str

    def markdown(self) -> str:
        lines = [f"{i}. **{q}** {a}" for i, (q, a) in enumerate(self.steps, 1)]
        return "\n".join(lines + ["", f"**Verdict:** {self.verdict}"])

    def _repr_markdown_(self) -> str:
        return self.markdown()


def _one_step(model: nn.Module, loss_fn, batch, device: torch.device, dtype: torch.dtype | None):
    from contextlib import nullcontext

    model.zero_grad(set_to_none=True)
    ctx = torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext()
    with ctx:
        loss = loss_fn(model, batch)
    loss.float().backward()
    grads_finite = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
    return float(loss.detach().float()), grads_finite


def diagnose(build_model, loss_fn, batch, *, dtype: torch.dtype = torch.float16,
             device: torch.device | str = "cpu") -> Diagnosis:
    """Run the debugging procedure on a model whose training fails under autocast with ``dtype``:
    (1) one step in FP32; (2) one step under the autocast; (3) the locator on that step; (4) which operands
    of which products the format loses (:func:`matmul_stats`); (5) one step under BF16 autocast. Each
    answer is measured; ``build_model()`` returns a fresh model each time."""
    device = torch.device(device)
    if dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    name = "FP16" if dtype == torch.float16 else "BF16"
    steps: list[tuple[str, str]] = []
    loss32, ok32 = _one_step(build_model().to(device), loss_fn, batch, device, None)
    fp32_fine = math.isfinite(loss32) and ok32
    steps.append(("Does it fail in FP32 too?", f"No: loss {loss32:.4g}, every gradient finite." if fp32_fine else
                  f"Yes (loss {loss32}, gradients {'finite' if ok32 else 'not finite'}): not a precision problem."))
    if not fp32_fine:
        return Diagnosis(tuple(steps), "fix the model, the data or the learning rate first: FP32 fails too")
    low_loss, low_ok = _one_step(build_model().to(device), loss_fn, batch, device, dtype)
    fails = not (math.isfinite(low_loss) and low_ok)
    steps.append((f"Does it fail under {name} autocast?", f"Yes: loss {low_loss}, gradients "
                  f"{'finite' if low_ok else 'not finite'}." if fails else f"No: loss {low_loss:.4g}."))
    model = build_model().to(device)
    with NonFiniteLocator(model) as locator:
        from contextlib import nullcontext

        with torch.autocast(device.type, dtype=dtype) if dtype is not None else nullcontext():
            loss = loss_fn(model, batch)
        loss.float().backward()
    steps.append(("Where is the first non-finite value?", locator.report.describe() if locator.report else
                  "Nowhere in this step."))
    worst = max(matmul_stats(build_model().to(device), lambda m: loss_fn(m, batch), name),
                key=lambda r: r.overflow + r.flush)
    if worst.overflow + worst.flush == 0:
        answer = (f"None: no linear layer's input or weight overflows or flushes in {name}; what fails happens "
                  "inside a module (see 3).")
    else:
        answer = (f"`{worst.layer}` {worst.operand}: {100 * worst.overflow:.2f}% of its values overflow, "
                  f"{100 * worst.flush:.2f}% flush.")
    steps.append((f"Does {name} lose any product operand?", answer))
    bf_loss, bf_ok = _one_step(build_model().to(device), loss_fn, batch, device, torch.bfloat16)
    bf_fine = math.isfinite(bf_loss) and bf_ok
    steps.append(("Does BF16 autocast run it?", f"Yes: loss {bf_loss:.4g}, every gradient finite." if bf_fine else
                  f"No (loss {bf_loss})."))
    if not fails:
        verdict = f"{name} runs this step; look at later steps (the monitor's log) or the loop (ScalerAudit)"
    elif locator.report is not None and bf_fine:
        verdict = (f"{'an' if name == 'FP16' else 'a'} {name} overflow in `{locator.report.module}` "
                   f"({locator.report.phase} pass): train in BF16, or keep that module in FP32 "
                   f"(`monitor.keep_in_fp32(model, {locator.report.module!r})`: autocast off, FP32 inputs)")
    elif locator.report is not None:
        verdict = f"a non-finite value made in `{locator.report.module}` that BF16 does not fix: a bug there"
    else:
        verdict = "non-finite outside the hooked modules: check the loss function and the data"
    return Diagnosis(tuple(steps), verdict)
