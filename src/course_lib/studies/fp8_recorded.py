"""Lesson 7's GPU records beside the page's own runs: the scaling lab and the outlier sweep as recorded at full
size (``fp8_scaling_lab``), one FP8 and one BF16 product's recorded time and spread per size
(``matmul_throughput``), and how the GPU session records FP8 training in pieces. Tables and sentences, each
computed from the record it describes; the page's own facts are in :mod:`.fp8_prose`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..fp8.roofline import LAUNCH_SECONDS
from ..glue import Prose, and_list, count_word, plural
from ..hardware import GPUPeaks
from ..results import RecordedResult
from ..tables import MarkdownTable, markdown_table
from .fp8 import Fp8ScalingLab, OutlierSweep, ScalingLab
from .performance import MatmulPointSummary, MatmulThroughput

# The granularity of the scales "matters" for what flushes when the scaled E4M3 recipes' flushed shares differ
# by at least this many percentage points and by a factor of two: below it, a few values in ten thousand.
FLUSH_MATTERS_POINTS = 1.0
# ... and it "hardly moves" the relative error when the largest is within this fraction of the smallest.
ERROR_SPREAD = 0.25
# A product "measures launch overhead" when its work at the datasheet peak would take less than this share
# of the time measured: the rest is the launch and the kernel's fixed costs, not the tensor cores.
LAUNCH_BOUND_SHARE = 0.1


def percent_text(share: float) -> str:
    """A share (0..1) as a percentage for prose: three significant figures from 10% up (11.4, 36.0), two
    below (3.4, 1.0, 0.059); exactly 0 and 1 as "0" and "100"."""
    if not 0 <= share <= 1:
        raise ValueError(f"a share must lie in 0..1, got {share!r}")
    x = 100 * share
    if x == 0 or x >= 99.95:
        return f"{x:.0f}"
    return f"{x:#.3g}" if x >= 9.95 else f"{x:#.2g}"   # "#": 1.0 and 36.0, not 1 and 36


def record_where(rec: RecordedResult) -> str:
    """Where a record ran, for a sentence that starts "Recorded ...": its GPU and, where the record names
    it, the course model's width ("on NVIDIA H100 (sm 9.0), with the 384-wide course model")."""
    model = rec.record.course_model
    width = f", with the {model['d_model']}-wide course model" if model and "d_model" in model else ""
    return f"on {rec.label}{width}"


def _scaled(lab: ScalingLab, fmt: str = "E4M3") -> list[str]:
    """The lab's recipes in format ``fmt`` that scale (all but the unscaled control)."""
    return [r for r in lab.recipes if fmt in r and "no scaling" not in r]


def _flushed(lab: ScalingLab, tensor: str) -> dict[str, float]:
    if tensor not in lab.errors:
        raise ValueError(f"the lab has no tensor {tensor!r}; it ran {lab.tensors}")
    recipes = _scaled(lab)
    if not recipes:
        raise ValueError(f"the lab ran no scaled E4M3 recipe; it ran {lab.recipes}")
    return {r: lab.errors[tensor][r].flushed for r in recipes}


def flush_matters(lab: ScalingLab, tensor: str = "gradient") -> bool:
    """Whether the scaled E4M3 recipes' shares of ``tensor`` flushed to zero differ by at least
    :data:`FLUSH_MATTERS_POINTS` percentage points and by a factor of two."""
    shares = _flushed(lab, tensor).values()
    lo, hi = min(shares), max(shares)
    return 100 * (hi - lo) >= FLUSH_MATTERS_POINTS and hi >= 2 * lo


def _error_range(lab: ScalingLab) -> tuple[float, float]:
    errors = [lab.errors[t][r].relative_error for t in lab.tensors for r in _scaled(lab)]
    return min(errors), max(errors)


def _flush_range(lab: ScalingLab, tensor: str) -> str:
    shares = _flushed(lab, tensor)
    lo, hi = min(shares, key=shares.__getitem__), max(shares, key=shares.__getitem__)
    times = (f"{shares[hi] / shares[lo]:.2g} times as much" if shares[lo] > 0 else "none against some")
    points = 100 * (shares[hi] - shares[lo])
    return (f"{percent_text(shares[lo])}% ({lo}) to {percent_text(shares[hi])}% ({hi}), {times} and "
            f"{points:.2g} percentage points apart")


def granularity_note(lab: ScalingLab, *, tensor: str = "gradient") -> Prose:
    """What the granularity of the scales does on ``lab``'s tensors: to the relative error of the scaled
    E4M3 recipes (it "hardly moves" it within :data:`ERROR_SPREAD`), and to the share of ``tensor`` flushed
    to zero (see :func:`flush_matters`)."""
    lo, hi = _error_range(lab)
    errors = ("On these tensors the granularity of the scales hardly moves the relative error." if
              hi <= (1 + ERROR_SPREAD) * lo else
              f"On these tensors the granularity of the scales moves the relative error, from "
              f"{percent_text(lo)}% to {percent_text(hi)}%.")
    flushed = (f"The share of the {tensor} flushed to zero does depend on it: from {_flush_range(lab, tensor)}."
               if flush_matters(lab, tensor) else
               f"The share of the {tensor} flushed to zero runs from {_flush_range(lab, tensor)}. The "
               f"shares differ by less than {FLUSH_MATTERS_POINTS:g} percentage point, so whatever their ratio, the "
               f"granularity changes little of how much of the {tensor} is lost.")
    return Prose(f"{errors} {flushed}")


def lab_record_note(recorded: ScalingLab | None, where: str, *, tensor: str = "gradient") -> Prose:
    """The recorded lab, after the page's own (:func:`granularity_note`; ``where``: see :func:`record_where`):
    the scaled E4M3 recipes' relative errors there, the share of ``tensor`` they flush there, E5M2's, and
    whether at the record's size the granularity decides what flushes. ``""`` with no record."""
    if recorded is None:
        return Prose("")
    lo, hi = _error_range(recorded)
    e5 = [r for r in recorded.recipes if "E5M2" in r]
    e5_text = (f"; E5M2 with one scale flushes {percent_text(recorded.errors[tensor][e5[0]].flushed)}%"
               if e5 else "")
    if flush_matters(recorded, tensor):
        verdict = f"There the granularity of the scales decides how much of the {tensor} flushes, though "
        verdict += ("not the relative error, which the largest values dominate." if hi <= (1 + ERROR_SPREAD) * lo
                    else "the relative error moves too.")
    else:
        verdict = (f"There, too, the shares lie under {FLUSH_MATTERS_POINTS:g} percentage point apart: the "
                   f"granularity has no say in how much of the {tensor} is lost.")
    but = "but" if flush_matters(recorded, tensor) else "and"
    return Prose(f"Recorded {where} (tables after the outlier section), every scaled E4M3 recipe's relative "
                 f"error lies between {percent_text(lo)}% and {percent_text(hi)}%, {but} the share of the {tensor} "
                 f"flushed to zero runs from {_flush_range(recorded, tensor)}{e5_text}. {verdict}")


def granularity_takeaway(live: ScalingLab, recorded: ScalingLab | None = None, *,
                         tensor: str = "gradient") -> Prose:
    """The takeaway on granularity, from the page's lab and the recorded one: whether the scaled E4M3
    recipes' relative errors agree (within :data:`ERROR_SPREAD`) in both, and where the share of ``tensor``
    flushed to zero depends on the granularity (:func:`flush_matters`): here, as recorded, or nowhere."""
    labs = [lab for lab in (live, recorded) if lab is not None]
    same = all(hi <= (1 + ERROR_SPREAD) * lo for lo, hi in map(_error_range, labs))
    errors = ("every scaled recipe has about the same relative error" if same else
              "the scaled recipes' relative errors differ")
    matters = [where for where, lab in (("here", live), ("in the full-size record", recorded))
               if lab is not None and flush_matters(lab, tensor)]
    flushed = (f"{'but' if same else 'and'} the share of the {tensor} flushed to zero depends on the granularity "
               f"{and_list(matters)}" if matters else f"and flushes about as much of the {tensor}")
    return Prose(f"{errors}, {flushed}")


def lab_table(lab: ScalingLab, *, flushed_of: str = "gradient") -> MarkdownTable:
    """One row per recipe: its relative error (%) on each tensor of ``lab``, and the share (%) of
    ``flushed_of`` flushed to zero."""
    if flushed_of not in lab.errors:
        raise ValueError(f"the lab has no tensor {flushed_of!r}; it ran {lab.tensors}")
    header = ["recipe", *(f"{t} error (%)" for t in lab.tensors), f"{flushed_of} flushed (%)"]
    return markdown_table(header, [[r, *(f"{100 * lab.errors[t][r].relative_error:.2f}" for t in lab.tensors),
                                    percent_text(lab.errors[flushed_of][r].flushed)] for r in lab.recipes])


def _factor_index(sweep: OutlierSweep, factor: float) -> int:
    if factor not in sweep.factors:
        raise ValueError(f"the outlier sweep has no factor {factor:g}; it ran {sweep.factors}")
    return sweep.factors.index(factor)


def sweep_table(sweep: OutlierSweep, factors: Sequence[float] = (1e3, 1e4, 1e5, 1e6)) -> MarkdownTable:
    """One row per recipe: the share (%) of the other channels' values flushed to zero with the outlier
    channel ``factors`` times larger."""
    at = [_factor_index(sweep, f) for f in factors]
    return markdown_table(["recipe", *(f"flushed at {f:,.0f}x (%)" for f in factors)],
                          [[r, *(percent_text(shares[i]) for i in at)] for r, shares in sweep.flushed.items()])


def outlier_record_note(live: OutlierSweep, recorded: OutlierSweep | None, where: str, *,
                        recorded_block: int) -> Prose:
    """The recorded outlier sweep beside the page's: per tensor at 1,000x and 100,000x there and here, and
    per row and in 1 x ``recorded_block`` tiles at 100,000x there. ``""`` with no record."""
    if recorded is None:
        return Prose("")
    rec3, rec5 = _factor_index(recorded, 1e3), _factor_index(recorded, 1e5)
    live3, live5 = _factor_index(live, 1e3), _factor_index(live, 1e5)
    tensor, row = "per tensor, E4M3", "per row (token), E4M3"
    tiles = f"1 x {recorded_block} tiles, E4M3"
    missing = [k for k in (tensor, row, tiles) if k not in recorded.flushed] + (
        [tensor] if tensor not in live.flushed else [])
    if missing:
        raise ValueError(f"the sweeps lack the recipes {missing}")
    there, here = recorded.flushed, live.flushed[tensor]
    return Prose(f"Recorded {where} (table below), one scale for the whole tensor flushes "
                 f"{percent_text(there[tensor][rec3])}% of the other values at 1,000x (here "
                 f"{percent_text(here[live3])}%) and {percent_text(there[tensor][rec5])}% at 100,000x (here "
                 f"{percent_text(here[live5])}%); at 100,000x per-row scales flush {percent_text(there[row][rec5])}% "
                 f"there, 1 x {recorded_block} tiles {percent_text(there[tiles][rec5])}%.")


def lab_record_heading(rec: RecordedResult, size: str) -> Prose:
    """The line over a recorded ``fp8_scaling_lab``'s tables: its GPU, ``size`` (the record's size, as
    :func:`~course_lib.results.record_size_text` says it), the layer, steps and tile side."""
    study = rec.result
    if not isinstance(study, Fp8ScalingLab):
        raise TypeError(f"expected a recorded Fp8ScalingLab, got {type(study).__name__}")
    return Prose(f"**Recorded on {rec.label}**, {size}: layer `{study.layer}` after {plural(study.steps, 'step')} "
                 f"of FP32 training, {study.block}-wide tiles. The lab (relative error, and the share of the "
                 "gradient flushed to zero), then the outlier sweep (the share of the other channels flushed):")


# ---- one product, recorded ---------------------------------------------------------------------------------

def _points(throughput: MatmulThroughput) -> dict[int, tuple[MatmulPointSummary, MatmulPointSummary]]:
    """BF16's and FP8's recorded point per size where both ran."""
    if not isinstance(throughput, MatmulThroughput):
        raise TypeError(f"expected a MatmulThroughput, got {type(throughput).__name__}")
    by = {(p.dtype, p.n): p for p in throughput.points}
    return {n: (by["bf16", n], by["fp8", n]) for n in throughput.sizes if ("bf16", n) in by and ("fp8", n) in by}


def ratio_spread(bf16: MatmulPointSummary, fp8: MatmulPointSummary) -> tuple[float, float, float]:
    """BF16's time over FP8's (above 1: FP8 is faster): from the medians, and the lowest and highest the two
    interquartile ranges allow (BF16's first quartile over FP8's third, and the reverse)."""
    return bf16.median_s / fp8.median_s, bf16.q25_s / fp8.q75_s, bf16.q75_s / fp8.q25_s


def _peak_us(n: int, tflops: float | None) -> float:
    if tflops is None or not tflops > 0:
        raise ValueError(f"the GPU lists no peak for this product (got {tflops!r})")
    return 2 * n ** 3 / (tflops * 1e12) * 1e6


def launch_bound_sizes(throughput: MatmulThroughput, gpu: GPUPeaks) -> tuple[int, ...]:
    """The sizes where both products' work at ``gpu``'s datasheet peaks would take less than
    :data:`LAUNCH_BOUND_SHARE` of their measured median times."""
    return tuple(n for n, (b, f) in _points(throughput).items()
                 if _peak_us(n, gpu.peak("bf16")) < LAUNCH_BOUND_SHARE * 1e6 * b.median_s
                 and _peak_us(n, gpu.peak("fp8")) < LAUNCH_BOUND_SHARE * 1e6 * f.median_s)


def product_spread_table(throughput: MatmulThroughput, gpu: GPUPeaks) -> MarkdownTable:
    """Per size where both ran: BF16's and FP8's recorded time (us, median and interquartile range), BF16's
    time over FP8's (median, and the range :func:`ratio_spread` allows), and what the products would take at
    ``gpu``'s datasheet peaks (us)."""
    def us(p: MatmulPointSummary) -> str:
        return f"{1e6 * p.median_s:.1f} ({1e6 * p.q25_s:.1f}-{1e6 * p.q75_s:.1f})"

    rows = []
    for n, (b, f) in _points(throughput).items():
        mid, lo, hi = ratio_spread(b, f)
        at_peak = [_peak_us(n, gpu.peak(d)) for d in ("bf16", "fp8")]
        rows.append([n, us(b), us(f), f"{mid:.2f} ({lo:.2f}-{hi:.2f})",
                     " / ".join(f"{t:,.0f}" if t >= 10 else f"{t:#.2g}" for t in at_peak)])
    return markdown_table(["n", "BF16 (us)", "FP8 (us)", "BF16 time / FP8 time",
                           f"at {gpu.name}'s peaks: BF16 / FP8 (us)"], rows)


def small_product_note(throughput: MatmulThroughput | None, gpu: GPUPeaks | None, *, up_to: int = 2048) -> Prose:
    """What the recorded products up to ``up_to`` show: which sizes only measure launch overhead
    (:func:`launch_bound_sizes`) and how long both products took there, and at which sizes FP8's product
    was faster or slower than BF16's beyond the spread of the two timings (:func:`ratio_spread`). Without a
    record (``throughput`` None) or its GPU's datasheet peaks (``gpu`` None), a sentence that says so."""
    if throughput is None or gpu is None:
        return Prose("No product recorded on a GPU whose datasheet peaks the course knows is there to compare.")
    points = {n: p for n, p in _points(throughput).items() if n <= up_to}
    if not points:
        return Prose(f"No product up to n = {up_to} is recorded.")
    bound = [n for n in launch_bound_sizes(throughput, gpu) if n <= up_to]
    parts = []
    if bound:
        times = [1e6 * p.median_s for n in bound for p in points[n]]
        worst = max(max(_peak_us(n, gpu.peak("bf16")) / (1e6 * points[n][0].median_s),
                        _peak_us(n, gpu.peak("fp8")) / (1e6 * points[n][1].median_s)) for n in bound)
        parts.append(f"Up to n = {max(bound)} both products took {min(times):.0f} to {max(times):.0f} us whatever "
                     f"the size, where {gpu.name}'s datasheet peaks would need at most {100 * worst:.0f}% of that: "
                     "those sizes measure launch overhead, not tensor cores, and a ratio there compares the two "
                     "kernels' fixed costs.")
        floor_us = 1e6 * LAUNCH_SECONDS
        if min(times) > floor_us:
            parts.append(f"The roofline model of the figure above assumes {floor_us:g} µs per kernel at least; these "
                         "measured products "
                         f"took {min(times) / floor_us:.0f} to {max(times) / floor_us:.0f} times that (each timing "
                         "includes the launch and the timer's own overhead): the model's floor is an assumption, and "
                         "the small products measured here are slower still.")
    spread = {n: ratio_spread(*p) for n, p in points.items()}
    faster = [f"{n} ({lo:.2f}-{hi:.2f})" for n, (_, lo, hi) in spread.items() if lo > 1]
    slower = [f"{n} ({lo:.2f}-{hi:.2f})" for n, (_, lo, hi) in spread.items() if hi < 1]
    within = [f"{n} ({lo:.2f}-{hi:.2f})" for n, (_, lo, hi) in spread.items() if lo <= 1 <= hi]
    found = [f"faster at {and_list(faster)}" if faster else "",
             f"slower at {and_list(slower)}" if slower else "",
             f"neither, within the spread, at {and_list(within)}" if within else ""]
    parts.append(f"Up to {up_to}, with the spread of both timings (BF16's time over FP8's, from their interquartile "
                 "ranges), FP8's product was " + "; ".join(f for f in found if f) + ".")
    parts.append("So the bare product does not make small FP8 layers slow." if not slower else
                 "There the bare product itself is slower in FP8.")
    return Prose(" ".join(parts))


# ---- how the GPU session records FP8 training --------------------------------------------------------------

def session_pieces_note(parts: Sequence[Sequence[Any]], experiment: str = "fp8_training") -> Prose:
    """How the GPU session records ``experiment`` (``parts``: ``course_lib.gpu_session``'s parts, each a
    sequence of steps with ``experiment`` and ``overrides``): recipes per step, steps per part, parts."""
    mine = [[s for s in part if s.experiment == experiment] for part in parts]
    mine = [p for p in mine if p]
    if not mine:
        raise ValueError(f"no part of the GPU session records {experiment!r}")
    per_step = {len(s.overrides.get("recipes", ())) for p in mine for s in p}
    if 0 in per_step:
        raise ValueError(f"a step records {experiment!r} whole, not a few recipes: there are no pieces to count")
    sizes = {len(p) for p in mine}
    recipes = "one recipe" if per_step == {1} else f"up to {count_word(max(per_step))} recipes"
    runs = f"{'' if len(sizes) == 1 else 'up to '}{count_word(max(sizes))} run{'' if max(sizes) == 1 else 's'}"
    batches = f"{count_word(len(mine))} batch{'' if len(mine) == 1 else 'es'}"
    return Prose(f"The course's GPU script (`python -m course_lib.gpu_session`) splits it: it trains {recipes} per "
                 f"run, each run a `course_lib.record` command that writes a record of its own, and groups {runs} "
                 f"into a batch short enough for one ten-minute command ({batches}; `python -m "
                 "course_lib.gpu_session plan` lists them). This page merges the records made on one GPU.")
