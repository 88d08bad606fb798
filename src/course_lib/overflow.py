"""Overflow in FP16, shown by running it, and the safe forms that avoid it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .formats import get_format


@dataclass(frozen=True)
class SoftmaxOverflow:
    """Softmax of ``logits`` in FP16: the naive ``exp(x)/sum(exp(x))`` against the safe forms."""

    logits: tuple[float, ...]
    exp_fp16: tuple[float, ...]          # exp(x) in FP16: inf past log(65504)
    naive_fp16: tuple[float, ...]        # exp(x) / sum(exp(x)) in FP16
    max_subtracted_fp16: tuple[float, ...]  # exp(x - max) / sum(...) in FP16: the log-sum-exp trick
    torch_softmax_fp16: tuple[float, ...]   # F.softmax on the FP16 tensor
    reference_fp64: tuple[float, ...]
    naive_cross_entropy_fp16: float      # -log(naive softmax[target])
    torch_cross_entropy_fp16: float      # F.cross_entropy on FP16 logits: its FP16 result is rounded
    largest_safe_exp_input: float        # log(FP16 max): exp overflows above it
    reference_cross_entropy_fp64: float  # -ln p[target] of the FP64 softmax: the exact cross-entropy
    target: int | None = None            # the index of the target logit (None: not recorded)


def softmax_overflow(logits=(2.0, 8.0, 12.0), target: int = 2, device: torch.device | str = "cpu") -> SoftmaxOverflow:
    """Run softmax and cross-entropy on ``logits`` in FP16, naively and safely."""
    if not 0 <= target < len(logits):
        raise ValueError(f"target must index the logits, got {target}")
    x = torch.tensor(logits, dtype=torch.float16, device=device)
    e = torch.exp(x)
    naive = e / e.sum()
    shifted = torch.exp(x - x.max())
    safe = shifted / shifted.sum()
    ref = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=0)
    naive_ce = -torch.log(naive[target])
    torch_ce = F.cross_entropy(x.float()[None].to(torch.float16), torch.tensor([target], device=device))
    as_tuple = lambda t: tuple(float(v) for v in t.float().cpu())  # noqa: E731
    return SoftmaxOverflow(tuple(float(v) for v in logits), as_tuple(e), as_tuple(naive), as_tuple(safe),
                           as_tuple(F.softmax(x, dim=0)), as_tuple(ref), float(naive_ce),
                           float(torch_ce), math.log(get_format("FP16").max_finite), float(-torch.log(ref[target])),
                           target)


@dataclass(frozen=True)
class MatmulOverflow:
    """A dot product whose exact value passes FP16's maximum, in several precisions."""

    n: int
    value: float
    exact: float
    results: dict[str, float]
    input_divisor: float = 16.0          # the FP16 row on scaled inputs divides each input by this
    scaled_fp16_output: float = math.nan  # that row's FP16 output, before the divisor squared is put back


def matmul_overflow(n: int = 4096, value: float = 4.5, device: torch.device | str = "cpu") -> MatmulOverflow:
    """``a @ b`` for ``a`` a ``1 x n`` row and ``b`` an ``n x 1`` column of ``value``: exact ``n*value**2``,
    computed in FP32, FP16, BF16, under autocast, and in FP16 on the inputs divided by 16 with the FP16
    output multiplied by 256 afterwards in FP32 (its label gives that FP16 output).

    Every input is an ordinary FP16 number; only the result is too large for FP16."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    device = torch.device(device)
    a32 = torch.full((1, n), value, device=device)
    b32 = torch.full((n, 1), value, device=device)
    results = {
        "FP32": float(a32 @ b32),
        "FP16": float((a32.half() @ b32.half()).float()),
        "BF16": float((a32.bfloat16() @ b32.bfloat16()).float()),
    }
    with torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16):
        results["autocast " + ("FP16" if device.type == "cuda" else "BF16")] = float((a32 @ b32).float())
    # FP16 cannot hold the result at all: the product of inputs scaled down by 16 fits, and the 16**2 is
    # multiplied back in FP32, outside FP16
    divisor = 16.0
    scaled_output = ((a32 / divisor).half() @ (b32 / divisor).half()).float()
    label = f"FP16 on inputs / {divisor:g} (output {float(scaled_output):g}), x {divisor**2:g} afterwards in FP32"
    results[label] = float(scaled_output * divisor**2)
    return MatmulOverflow(n, value, n * value * value, results, divisor, float(scaled_output))


