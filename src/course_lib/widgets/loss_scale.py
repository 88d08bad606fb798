"""Lesson 3's explorer: move the loss scale and see which gradients survive the cast, as normal or subnormal
numbers, flush to zero or overflow (``js/loss_scale_explorer.js``).

The gradients are not embedded one by one. For a power-of-two scale 2**k the scaled value ``|v| * 2**k`` is
exact, and what the cast does to it (the classes of :func:`course_lib.gradients.summarize_underflow`) changes
only where ``|v| * 2**k`` crosses one of the format's rounding edges: half the smallest subnormal (which
rounds to zero, a tie to even), the midpoint between the largest subnormal and the smallest normal, the
largest finite value and the midpoint above it (where rounding overflows). Every edge is ``t * 2**j`` with a
significand ``t`` in [1, 2), so two values of the same binade whose significands lie on the same side of
every edge's ``t`` (or both equal it) share a class at every power-of-two scale. :func:`gradient_cells`
counts the gradients in those cells, with each cell's smallest and largest magnitude; the page classifies
both ends of every cell with the codec's own rounding (``js/codecs.js``) and refuses a cell whose ends
disagree, so the counts it shows are summarize_underflow's, exactly (tests/test_widgets_loss_scale.py
checks every scale from 2**-30 to 2**60 in four formats).
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

from ..formats import get_format, spacing
from ..gradients import summarize_underflow
from .page import Explorer

CLASSES = ("normal", "subnormal", "flushed", "overflow")
LOG2_LIMIT = 300   # scales stay within 2**±300, so |v| * scale is exact in float64 for any float32 gradient


def rounding_edges(fmt) -> tuple[float, ...]:
    """The magnitudes at which a cast to ``fmt`` changes what it does to a value (ascending): half the smallest
    subnormal, the midpoint between the largest subnormal and the smallest normal, the largest finite value
    and the midpoint above it. All derived from the format's limits, none typed in."""
    f = get_format(fmt)
    half_spacing_at_max = float(spacing(np.array([f.max_finite]), f)[0]) / 2
    return tuple(sorted({f.min_subnormal / 2, f.min_normal - f.min_subnormal / 2, f.max_finite,
                         f.max_finite + half_spacing_at_max}))


def _significands(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x = m * 2**e`` with ``m`` in [1, 2), for positive float64 ``x`` (exact: frexp only moves the point)."""
    mantissa, exponent = np.frexp(x)
    return mantissa * 2.0, exponent.astype(np.int64) - 1


def _check_format(fmt):
    f = get_format(fmt)
    if not f.signed:
        raise ValueError(f"fmt {f.name!r} is unsigned: it cannot hold signed gradients; use a signed format "
                         "such as 'FP16' or 'FP8 E5M2'")
    return f


def gradient_cells(values: torch.Tensor, fmt="FP16") -> tuple[int, int, list[list]]:
    """``(non-zero count, zero count, cells)`` of ``values``: each cell ``[count, smallest, largest]``
    (magnitudes, float64) holds the non-zero values of one binade whose significands lie between the same
    two of :func:`rounding_edges`' significands (or on one of them). Cells are in ascending magnitude."""
    f = _check_format(fmt)
    if not isinstance(values, torch.Tensor) or not values.is_floating_point():
        raise TypeError("values must be a floating-point torch tensor (gradients), got "
                        f"{type(values).__name__}{'' if not isinstance(values, torch.Tensor) else ' ' + str(values.dtype)}")
    v = values.detach().flatten().to(torch.float64).cpu().numpy()
    bad = int((~np.isfinite(v)).sum())
    if bad:
        raise ValueError(f"values hold {bad} non-finite entries (inf or NaN); pass finite gradients")
    magnitudes = np.abs(v[v != 0])
    zeros = int(v.size - magnitudes.size)
    if magnitudes.size == 0:
        raise ValueError("values are all zero (or empty): there is nothing to scale")
    edges, _ = _significands(np.array(rounding_edges(f)))
    edges = np.unique(edges)
    m, e = _significands(magnitudes)
    below = np.searchsorted(edges, m, side="left")          # edges strictly below m
    on_edge = (below < edges.size) & (edges[np.minimum(below, edges.size - 1)] == m)
    cell = 2 * below + on_edge                               # 0, 1 (on edge 0), 2, 3 (on edge 1), ...
    key = (e - e.min()) * (2 * edges.size + 1) + cell
    order = np.lexsort((magnitudes, key))
    key, sorted_magnitudes = key[order], magnitudes[order]
    starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
    ends = np.r_[starts[1:], key.size]
    cells = [[int(b - a), float(sorted_magnitudes[a]), float(sorted_magnitudes[b - 1])] for a, b in zip(starts, ends)]
    return int(magnitudes.size), zeros, cells


def _check_log2(name: str, k) -> int:
    if isinstance(k, bool) or not isinstance(k, numbers.Integral):
        raise TypeError(f"{name} must be an integer power of two's exponent, got {type(k).__name__} {k!r}")
    if not -LOG2_LIMIT <= k <= LOG2_LIMIT:
        raise ValueError(f"{name} must lie in -{LOG2_LIMIT}..{LOG2_LIMIT} (a scale of 2**{k} is beyond any "
                         f"gradient's range), got {k}")
    return int(k)


def loss_scale_explorer(values: torch.Tensor, fmt="FP16", log2_range: tuple[int, int] = (-4, 40),
                        start: int = 0) -> Explorer:
    """A slider over the loss scale 2**k, k in ``log2_range``, starting at ``start``: the shares of the
    non-zero ``values`` (gradients) that survive the cast to ``fmt`` as normal or as subnormal numbers, flush
    to zero or overflow, as :func:`course_lib.gradients.sweep_loss_scale` computes them (zeros are left
    out, as there). The gradients travel as :func:`gradient_cells` (a few hundred cells, not the values)."""
    f = _check_format(fmt)
    if not isinstance(log2_range, (tuple, list)) or len(log2_range) != 2:
        raise TypeError(f"log2_range must be two integers (lowest, highest), got {log2_range!r}")
    lo, hi = (_check_log2("log2_range", k) for k in log2_range)
    if lo >= hi:
        raise ValueError(f"log2_range must go from a lower to a higher exponent, got {log2_range!r}")
    start = _check_log2("start", start)
    if not lo <= start <= hi:
        raise ValueError(f"start must lie in log2_range {lo}..{hi}, got {start}")
    nonzero, zeros, cells = gradient_cells(values, f)
    return Explorer("loss_scale_explorer.js", {"format": f.name, "log2Range": [lo, hi], "start": start,
                                               "nonzero": nonzero, "zeros": zeros, "cells": cells},
                    "Loss scale explorer")


def shares_from_config(config: dict, log2_scale: int) -> dict[str, float | int]:
    """What the explorer must show at scale 2**``log2_scale``, computed by Python from its configuration:
    the counts per class (``count_normal``, ...) and the shares as ``sweep_loss_scale`` forms them
    (``flushed``, ``subnormal``, ``overflow`` = count / non-zero count; ``survive`` = 1 - (flushed +
    overflow); ``normal`` = survive - subnormal).

    The cells are in ascending magnitude and a cast's class only rises with the magnitude (flushed,
    subnormal, normal, overflow), so :func:`~course_lib.gradients.summarize_underflow` of all the cells'
    smallest ends says how many of the first cells flush, and so on; of their largest ends, the same
    counts, unless a cell straddles an edge (ValueError)."""
    f = _check_format(config["format"])
    scale = 2.0 ** _check_log2("log2_scale", log2_scale)
    cells = config["cells"]
    runs = []
    for end in (1, 2):
        s = summarize_underflow(torch.tensor([c[end] for c in cells], dtype=torch.float64), f, scale)
        flushed, subnormal, overflow = (round(share * len(cells)) for share in (s.flushed, s.subnormal, s.overflow))
        runs.append({"flushed": flushed, "subnormal": subnormal, "normal": len(cells) - flushed - subnormal - overflow,
                     "overflow": overflow})
    if runs[0] != runs[1]:
        raise ValueError(f"at scale 2**{log2_scale} some cell's two ends fall in different classes ({runs[0]} of the "
                         f"smallest ends, {runs[1]} of the largest): the configuration was not cut at {f.name}'s "
                         "rounding edges")
    counts, first = {}, 0
    for kind in ("flushed", "subnormal", "normal", "overflow"):
        counts[kind] = sum(c[0] for c in cells[first:first + runs[0][kind]])
        first += runs[0][kind]
    n = config["nonzero"]
    flushed, subnormal, overflow = counts["flushed"] / n, counts["subnormal"] / n, counts["overflow"] / n
    survive = 1.0 - (flushed + overflow)
    return {**{f"count_{c}": counts[c] for c in CLASSES}, "flushed": flushed, "subnormal": subnormal,
            "overflow": overflow, "survive": survive, "normal": survive - subnormal}


def check_in_page(root, config: dict, *, timeout_ms: float = 5000) -> list[str]:
    """Drive one mounted loss-scale explorer in a built page (``root``: a Playwright Locator of its div):
    step the scale once with its x2 button (or /2 at the top of the range), wait for the readout to follow,
    and compare each class's count and share on the page with :func:`shares_from_config`. Returns the
    problems found (empty: the explorer responds and agrees with Python); ``timeout_ms`` bounds each wait."""
    problems: list[str] = []
    try:
        lo, hi = (_check_log2("log2Range", k) for k in config["log2Range"])
        shares_from_config(config, lo)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError) as error:
        return [f"loss-scale explorer: unusable configuration ({error!r})"]
    try:
        before = int(root.locator("[data-role=readout]").get_attribute("data-log2", timeout=timeout_ms))
    except Exception as error:   # Playwright's errors (a missing element times out); course_lib does not import it
        return [f"loss-scale explorer: no readout to read ({type(error).__name__}: {error})"]
    after = before + 1 if before < hi else before - 1
    try:
        root.locator("[data-role=double]" if after > before else "[data-role=halve]").click(timeout=timeout_ms)
        root.locator(f'[data-role=readout][data-log2="{after}"]').wait_for(timeout=timeout_ms)
    except Exception:   # Playwright's TimeoutError
        return [f"loss-scale explorer: the readout stayed at 2^{before} after a click on "
                f"{'x2' if after > before else '/2'} (the explorer does not respond)"]
    expected = shares_from_config(config, after)
    for kind in (*CLASSES, "survive"):
        row = root.locator(f"tr[data-class={kind}]")
        try:
            share = float(row.get_attribute("data-share", timeout=timeout_ms) or "nan")
            count = None if kind == "survive" else int(row.get_attribute("data-count", timeout=timeout_ms) or -1)
            shown = (row.locator("[data-role=percent]").text_content(timeout=timeout_ms) or "").strip()
        except Exception as error:   # Playwright's errors
            problems.append(f"loss-scale explorer: no readable row for {kind} ({type(error).__name__})")
            continue
        where = f"loss-scale explorer at 2^{after}"
        if share != expected[kind]:
            problems.append(f"{where}: {kind} share {share!r} on the page, {expected[kind]!r} in Python")
        if count is not None and count != expected[f"count_{kind}"]:
            problems.append(f"{where}: {count} {kind} values on the page, {expected[f'count_{kind}']} in Python")
        try:
            shown_percent = float(shown.rstrip("%"))
        except ValueError:
            shown_percent = math.nan
        if not abs(shown_percent - 100 * expected[kind]) <= 0.0051:
            problems.append(f"{where}: {kind} shows {shown!r}, Python has {100 * expected[kind]:.2f}%")
    return problems
