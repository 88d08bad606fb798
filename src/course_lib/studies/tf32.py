"""TF32 and PyTorch's float32 matmul precision switch (lesson 6): what each setting does to an FP32 product on
this device, measured, and what a recorded GPU run says TF32 buys against FP32 and against BF16 autocast."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..formats import get_format
from ..glue import Prose
from ..hardware import MATMUL_PRECISIONS, float32_matmul_precision
from ..results import RecordedResult
from ..tables import MarkdownTable, markdown_table
from .performance import ThroughputStudy

# torch.set_float32_matmul_precision's settings: full FP32, TF32 (or better), BF16 (or better)
PRECISIONS = tuple(MATMUL_PRECISIONS)


def matmul_precision_errors(device: torch.device | str, *, n: int = 256, seed: int = 0) -> dict[str, float]:
    """The largest relative difference (to the largest entry of the exact product) between an ``n`` x ``n``
    FP32 product computed under each of :data:`PRECISIONS` and under "highest", on ``device``. The setting
    in force before the call comes back afterwards."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(n, n, generator=gen).to(device)
    b = torch.randn(n, n, generator=gen).to(device)
    products = {}
    for precision in PRECISIONS:
        with float32_matmul_precision(precision):
            products[precision] = (a @ b).double()
    exact = products["highest"]
    scale = float(exact.abs().max())
    return {p: float((products[p] - exact).abs().max()) / scale for p in PRECISIONS}


def format_facts() -> dict[str, object]:
    """TF32's exponent and mantissa bits and FP32's mantissa bits, from the course's format table."""
    tf32, fp32 = get_format("TF32"), get_format("FP32")
    return {"tf32_exp_bits": tf32.exponent_bits, "tf32_man_bits": tf32.mantissa_bits,
            "fp32_man_bits": fp32.mantissa_bits}


def precision_table(errors: Mapping[str, float]) -> MarkdownTable:
    """:func:`matmul_precision_errors` as a table: each setting, what it allows, and its largest difference."""
    allows = {"highest": "full FP32", "high": "TF32 (or better)", "medium": "BF16 (or better)"}
    unknown = sorted(set(errors) - set(allows))
    if unknown:
        raise ValueError(f"unknown matmul precision settings {unknown}")
    return markdown_table(["setting", "products in", "largest difference from \"highest\""],
                          [(f"`{p}`", allows[p], "none" if e == 0 else f"{e:.1e} of the largest entry")
                           for p, e in errors.items()])


def precision_phrase(errors: Mapping[str, float]) -> Prose:
    """What the "high" (TF32) and "medium" (BF16) settings did to an FP32 product here, from
    :func:`matmul_precision_errors`: no change at all, or a difference of the given size."""
    missing = [p for p in ("high", "medium") if p not in errors]
    if missing:
        raise ValueError(f"errors lack the settings {missing}")

    def effect(p: str, unit: str) -> str:
        e = errors[p]
        return (f'"{p}" gives the same bits as "highest" (this device has no {unit} path for FP32 products)'
                if e == 0 else f'"{p}" moves the product by up to {e:.1e} of its largest entry ({unit} products)')

    return Prose(effect("high", "TF32") + "; " + effect("medium", "BF16"))


def tf32_recorded_note(record: RecordedResult, *, tie: float = 0.05) -> Prose:
    """What a recorded ``training_throughput`` study says about TF32: its token rate over FP32's with TF32
    off, and BF16 autocast's over TF32's, eager and compiled, each with the seeds behind it (one seed: no seed
    noise measured); a ratio within ``tie`` of 1 is called a tie."""
    study = record.result
    if not isinstance(study, ThroughputStudy):
        raise TypeError(f"expected a recorded ThroughputStudy, got {type(study).__name__}")
    if not 0 <= tie < 1:
        raise ValueError(f"tie must lie in [0, 1), got {tie!r}")
    table = study.table()
    rows = {(r["recipe"], r["compiled"]): r["tokens_per_s"] for r in table}
    seeds = {(r["recipe"], r["compiled"]): r["seeds"] for r in table}
    if ("tf32", False) not in rows or ("fp32", False) not in rows or ("bf16_autocast", False) not in rows:
        return Prose("")
    parts = [f"On the recorded **{record.label}**, TF32 alone ran {rows[('tf32', False)] / rows[('fp32', False)]:.2f} "
             "times as many tokens per second as FP32 with TF32 off (eager)"]
    for compiled, mode in ((False, "eager"), (True, "compiled")):
        if ("tf32", compiled) in rows and ("bf16_autocast", compiled) in rows:
            ratio = rows[("bf16_autocast", compiled)] / rows[("tf32", compiled)]
            verdict = ("tied TF32" if abs(ratio - 1) <= tie else "was faster than TF32" if ratio > 1 else
                       "was slower than TF32")
            n_tf32, n_bf16 = seeds[("tf32", compiled)], seeds[("bf16_autocast", compiled)]
            how = ("one seed per recipe, so no seed noise was measured for it" if n_tf32 == n_bf16 == 1 else
                   f"medians over {n_tf32} seeds per recipe" if n_tf32 == n_bf16 else
                   f"medians over {n_tf32} and {n_bf16} seeds" + (": one seed has no seed noise measured"
                                                                   if min(n_tf32, n_bf16) == 1 else ""))
            parts.append(f"{mode}, BF16 autocast {verdict} ({ratio:.2f}x its token rate; {how})")
    return Prose("; ".join(parts) + ". Compare mixed precision with TF32, not only with FP32 with TF32 off: on "
                 "such a GPU each is one setting away.")
