"""TF32 and PyTorch's float32 matmul precision switch (lesson 6): what each setting allows on each backend (read
back from torch), what it does to an FP32 product on this device, measured, and what a recorded GPU run says TF32
buys against FP32 and against BF16 autocast."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..formats import get_format, round_to_format
from ..glue import Prose
from ..hardware import MATMUL_PRECISIONS, float32_matmul_precision
from ..results import RecordedResult
from ..tables import MarkdownTable, markdown_table
from .performance import ThroughputStudy

# torch.set_float32_matmul_precision's settings: full FP32, TF32 (or better), BF16 (or better)
PRECISIONS = tuple(MATMUL_PRECISIONS)

# the backends with a per-backend FP32 matmul switch (torch.backends.<backend>.matmul.fp32_precision): cuBLAS
# on NVIDIA GPUs, oneDNN on CPUs
BACKENDS = {"cuda": "CUDA (cuBLAS)", "mkldnn": "CPU (oneDNN)"}

# a per-backend fp32_precision value -> the narrowest format it allows inside an FP32 product
FORMAT_OF_PRECISION = {"ieee": "FP32", "tf32": "TF32", "bf16": "BF16"}

# the narrower formats a setting can allow, each measured by a product of operands rounded to it
REDUCED_FORMATS = ("TF32", "BF16")


def backend_precisions(precision: str) -> dict[str, str]:
    """The per-backend ``fp32_precision`` ("ieee", "tf32" or "bf16") that ``precision`` (one of
    :data:`PRECISIONS`) sets, by backend of :data:`BACKENDS`, read back from torch inside
    ``hardware.float32_matmul_precision`` (so the setting in force comes back afterwards). A torch without a
    backend's switch (before 2.9) gets the mapping torch 2.9+ uses, ``hardware.MATMUL_PRECISIONS``."""
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    out = dict(MATMUL_PRECISIONS[precision])
    with float32_matmul_precision(precision):
        for backend in BACKENDS:
            switch = getattr(getattr(torch.backends, backend, None), "matmul", None)
            if switch is not None and hasattr(switch, "fp32_precision"):
                out[backend] = str(switch.fp32_precision)
    return out


def allowed_formats() -> dict[str, dict[str, str]]:
    """For each setting of :data:`PRECISIONS`, the narrowest format it allows inside an FP32 product on each
    backend ("FP32", "TF32" or "BF16"), from :func:`backend_precisions`."""
    return {p: {b: FORMAT_OF_PRECISION.get(v, v) for b, v in backend_precisions(p).items()} for p in PRECISIONS}


def device_backend(device: torch.device | str) -> str:
    """The backend of :data:`BACKENDS` whose switch governs FP32 products on ``device``: "cuda" on a CUDA
    device, "mkldnn" on a CPU."""
    kind = torch.device(device).type
    if kind not in ("cuda", "cpu"):
        raise ValueError(f"device must be a CUDA device or the CPU, got {kind!r}")
    return "cuda" if kind == "cuda" else "mkldnn"


def _operands(device: torch.device | str, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, n, generator=gen).to(device), torch.randn(n, n, generator=gen).to(device)


def _largest_difference(product: torch.Tensor, exact: torch.Tensor) -> float:
    return float((product.double() - exact).abs().max()) / float(exact.abs().max())


def matmul_precision_errors(device: torch.device | str, *, n: int = 256, seed: int = 0) -> dict[str, float]:
    """The largest relative difference (to the largest entry of the exact product) between an ``n`` x ``n``
    FP32 product computed under each of :data:`PRECISIONS` and under "highest", on ``device``. The setting
    in force before the call comes back afterwards."""
    a, b = _operands(device, n, seed)
    products = {}
    for precision in PRECISIONS:
        with float32_matmul_precision(precision):
            products[precision] = (a @ b).double()
    exact = products["highest"]
    return {p: _largest_difference(products[p], exact) for p in PRECISIONS}


def rounded_operand_errors(device: torch.device | str, *, n: int = 256, seed: int = 0) -> dict[str, float]:
    """For each of :data:`REDUCED_FORMATS` ("TF32", "BF16"), what a product in that format would differ by:
    the same operands as :func:`matmul_precision_errors`, rounded to the format (``round_to_format``) and
    multiplied in full FP32 (sums in FP32, as tensor cores keep them), against the "highest" product; the
    same relative measure, so the two can be compared."""
    a, b = _operands(device, n, seed)
    with float32_matmul_precision("highest"):
        exact = (a @ b).double()
        return {f: _largest_difference(torch.as_tensor(round_to_format(a, f)) @ torch.as_tensor(round_to_format(b, f)),
                                       exact) for f in REDUCED_FORMATS}


def format_facts() -> dict[str, object]:
    """TF32's exponent and mantissa bits and FP32's mantissa bits, from the course's format table."""
    tf32, fp32 = get_format("TF32"), get_format("FP32")
    return {"tf32_exp_bits": tf32.exponent_bits, "tf32_man_bits": tf32.mantissa_bits,
            "fp32_man_bits": fp32.mantissa_bits}


def _check(errors: Mapping[str, float], rounded: Mapping[str, float], allowed: Mapping[str, Mapping[str, str]],
           backend: str) -> None:
    unknown = sorted(set(errors) - set(PRECISIONS))
    if unknown:
        raise ValueError(f"unknown matmul precision settings {unknown}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    missing = [p for p in ("high", "medium") if p not in errors or p not in allowed or backend not in allowed[p]]
    if missing:
        raise ValueError(f"errors and allowed must both give the settings {missing} (allowed for {backend!r})")
    unrounded = sorted({allowed[p][backend] for p in ("high", "medium")} - set(rounded) - {"FP32"})
    if unrounded:
        raise ValueError(f"rounded must give the formats {unrounded}")


def precision_table(errors: Mapping[str, float], rounded: Mapping[str, float],
                    allowed: Mapping[str, Mapping[str, str]], backend: str) -> MarkdownTable:
    """:func:`matmul_precision_errors` beside :func:`rounded_operand_errors` as a table: each setting, the
    format it allows inside an FP32 product on each backend (``allowed``, from :func:`allowed_formats`), its
    measured difference from "highest" here, and the difference a product of operands rounded to the format
    it allows on this device's ``backend`` has."""
    _check(errors, rounded, allowed, backend)

    def diff(e: float) -> str:
        return "none" if e == 0 else f"{e:.1e}"

    def allows(p: str, b: str) -> str:
        f = allowed.get(p, {}).get(b, "-")
        return "full FP32 only" if f == "FP32" else f

    def in_format(p: str) -> str:
        f = allowed.get(p, {}).get(backend, "FP32")
        return f"{f}: {diff(rounded[f])}" if f in rounded else "-"

    return markdown_table(["setting", *(f"{name} allows" for name in BACKENDS.values()),
                           'measured difference from "highest" here',
                           f"a product in the format {BACKENDS[backend]} allows differs by"],
                          [(f"`{p}`", *(allows(p, b) for b in BACKENDS), diff(e), in_format(p))
                           for p, e in errors.items()])


def medium_phrase(allowed: Mapping[str, Mapping[str, str]]) -> Prose:
    """What "medium" allows on each backend against "high" (``allowed``, from :func:`allowed_formats`): where
    it allows what "high" allows, it says so, and where that holds on CUDA, that "medium" is "high" there."""
    for p in ("high", "medium"):
        if p not in allowed or any(b not in allowed[p] for b in BACKENDS):
            raise ValueError(f"allowed must give {p!r} for every backend of {list(BACKENDS)}")
    parts = []
    for backend, name in BACKENDS.items():
        medium, high = allowed["medium"][backend], allowed["high"][backend]
        allows = "full FP32 only" if medium == "FP32" else medium
        parts.append(f"{allows} in {name} products" + (', as "high" does' if medium == high else ""))
    gpu, gpu_high = allowed["medium"]["cuda"], allowed["high"]["cuda"]
    verdict = (f': on NVIDIA GPUs "medium" behaves as "high" does ({gpu}, not BF16)'
               if gpu == gpu_high and gpu != "BF16" else "")
    return Prose('"medium" allows ' + ", and ".join(parts) + verdict)


def precision_phrase(errors: Mapping[str, float], rounded: Mapping[str, float],
                     allowed: Mapping[str, Mapping[str, str]], backend: str, *, match: float = 0.1) -> Prose:
    """What the "high" and "medium" settings did to an FP32 product here (:func:`matmul_precision_errors`),
    judged against what a product in the format each allows on this device's ``backend`` (``allowed``, from
    :func:`allowed_formats`) differs by (:func:`rounded_operand_errors`): the same bits; a difference of at
    least ``match`` times the rounded product's, as products in that format would give; or a smaller one, so
    that this device's kernel did not compute products in that format. A setting allows the narrower format;
    the measurement says whether this device used it."""
    _check(errors, rounded, allowed, backend)
    if not 0 < match < 1:
        raise ValueError(f"match must lie in (0, 1), got {match!r}")

    def effect(p: str) -> str:
        f = allowed[p][backend]
        if f == "FP32":
            return f'"{p}" allows only full FP32 on {BACKENDS[backend]}' + (
                "" if errors[p] == 0 else f" (it moved the product by {errors[p]:.1e}: another kernel)")
        e, r = errors[p], rounded[f]
        against = f"the {r:.1e} by which a product of {f}-rounded operands differs"
        if e == 0:
            return (f'"{p}" gives the same bits as "highest" (where a product of {f}-rounded operands differs by '
                    f"{r:.1e}): this device's kernel computed full FP32 products under it")
        if e >= match * r:
            size = "about" if 0.8 <= e / r <= 1.25 else f"{e / r:.2g} times"
            return (f'"{p}" moves the product by up to {e:.1e} of its largest entry, {size} {against}: '
                    f"consistent with {f} products")
        return (f'"{p}" moves the product by up to {e:.1e} of its largest entry, far less than {against}: the '
                f"setting allows {f} inside the product, but this device's kernel did not compute {f} products "
                "here (a difference that small comes from another kernel: another summation order, or each FP32 "
                f"operand split into several {f} parts)")

    return Prose(effect("high") + "; " + effect("medium"))


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
