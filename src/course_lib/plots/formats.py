"""Figures of lesson 1 (and lesson 5's rounding error): bit layouts, ranges against measured magnitudes,
relative spacing."""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from ..formats import get_format, round_to_format, spacing
from .style import (
    EXPONENT_COLOUR,
    LIMIT_COLOUR,
    MANTISSA_COLOUR,
    SIGN_COLOUR,
    TENSOR_COLOUR,
    finish_figure,
    format_colour,
    resolve_formats,
)


def plot_bit_layouts(formats=None) -> Figure:
    """One row per format: its sign, exponent and mantissa bits as coloured cells, drawn from the registry."""
    fmts = resolve_formats(formats)
    width = max(f.bits for f in fmts)
    fig, ax = plt.subplots(figsize=(8, 0.36 * len(fmts) + 1.0))
    for row, f in enumerate(fmts):
        y = len(fmts) - 1 - row
        fields = [("S", f.sign_bits, SIGN_COLOUR), ("E", f.exponent_bits, EXPONENT_COLOUR),
                  ("M", f.mantissa_bits, MANTISSA_COLOUR)]
        x = 0
        for letter, n, colour in fields:
            for i in range(n):
                ax.add_patch(Rectangle((x + i, y + 0.1), 0.92, 0.8, facecolor=colour, edgecolor="white"))
            if n:
                # centred on the field's cells, on a patch of its colour as tall as a cell: a label over the
                # white gap between two cells lost the strokes that fell in it, and a patch only as tall as
                # the text left the gap showing above and below it
                label = f"{letter}{n}" if n > 1 else letter
                centre, half = x + (n - 0.08) / 2, min(0.3 * len(label) + 0.1, (n - 0.08) / 2)
                if n > 1:
                    ax.add_patch(Rectangle((centre - half, y + 0.1), 2 * half, 0.8, facecolor=colour,
                                           edgecolor="none", gid="field-label"))
                ax.text(centre, y + 0.5, label, ha="center", va="center", color="white", fontsize=8,
                        fontweight="bold")
            x += n
        ax.text(-0.6, y + 0.5, f.name, ha="right", va="center", fontsize=10)
        ax.text(width + 0.6, y + 0.5, f"{f.bits} bits", ha="left", va="center", fontsize=9)
    ax.set_xlim(-6.5, width + 4)
    ax.set_ylim(-0.2, len(fmts) + 0.2)
    ax.axis("off")
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in (SIGN_COLOUR, EXPONENT_COLOUR, MANTISSA_COLOUR)]
    ax.legend(handles, ["sign", "exponent", "mantissa (fraction)"], loc="upper center",
              bbox_to_anchor=(0.5, 0.0), ncol=3, frameon=False)
    ax.set_title("Bit layout of each format (one cell per bit)")
    return finish_figure(fig)


def plot_format_ranges(formats=None, magnitudes=None, *, recorded=None, limits_of="FP16") -> Figure:
    """Representable magnitudes of every format on one log axis, with a model's tensors placed on it.

    ``magnitudes``: a :class:`~course_lib.studies.formats.TrainingMagnitudes` measured live (optional);
    ``recorded``: an optional ``(label, TrainingMagnitudes)`` from a GPU record, drawn beside it.
    Formats: thin bar = subnormal range, thick bar = normal range. Tensors, in a second panel under the
    formats: thick bar = 1st to 99th percentile of the non-zero magnitudes, thin line = smallest to largest,
    dot = median. The tensors' axis starts 2**12 below the smallest of ``limits_of``'s smallest subnormal
    and the tensors' medians: a bar or line that reaches further left is cut at that edge and marked there
    with a triangle. ``limits_of``: a format whose smallest subnormal, smallest normal and largest value are
    drawn as vertical lines across both panels (None for none).
    """
    fmts = resolve_formats(formats)
    tensor_sets = []
    if magnitudes is not None:
        tensor_sets.append(("this run", magnitudes))
    if recorded is not None:
        tensor_sets.append(recorded)
    n_tensor_rows = sum(len(m.histograms) for _, m in tensor_sets)
    if n_tensor_rows:
        # two panels, one above the other so that each gets the figure's full width: the formats over their
        # whole range, the tensors on an axis zoomed to them (on one shared axis, 10^-45..10^38, the tensors
        # were squeezed into a few millimetres)
        fig, (ax, tax) = plt.subplots(2, 1, figsize=(8.5, 0.3 * (len(fmts) + n_tensor_rows) + 3.4),
                                      gridspec_kw={"height_ratios": [len(fmts) + 1.5, n_tensor_rows + 1.5]})
    else:
        fig, ax = plt.subplots(figsize=(8.5, 0.32 * len(fmts) + 1.6))
        tax = None
    labels = []
    for i, f in enumerate(fmts):
        y = len(fmts) - 1 - i
        colour = format_colour(f)
        # subnormal and normal told apart by height, not shade (a light black is another format's grey),
        # each outlined so that a pale colour still shows on white
        if f.min_subnormal < f.min_normal:
            ax.barh(y, f.min_normal - f.min_subnormal, left=f.min_subnormal, height=0.28, color=colour,
                    edgecolor="#333333", lw=0.6)
        ax.barh(y, f.max_finite - f.min_normal, left=f.min_normal, height=0.66, color=colour,
                edgecolor="#333333", lw=0.6)
        labels.append((y, f.name))
    ax.set_yticks([p for p, _ in labels], [t for _, t in labels], fontsize=10)
    ax.set_ylim(-0.8, len(fmts) - 0.2)
    ax.set_xlim(min(f.min_subnormal for f in fmts) / 30, max(f.max_finite for f in fmts) * 30)   # bars start at 0
    ax.set_title("Representable magnitudes (thin: subnormal, thick: normal)", fontsize=11)
    axes = [ax]
    if tax is not None:
        rows = []
        y = n_tensor_rows - 1
        for set_label, mags in tensor_sets:
            # a GPU record's label, e.g. "NVIDIA H100 80GB HBM3 (sm 9.0)", shortened to fit beside the bars
            short = re.sub(r"\s*\(sm [\d.]+\)", "", re.sub(r"^NVIDIA ", "", set_label))
            suffix = f" ({short})" if len(tensor_sets) > 1 else ""
            for kind, hist in mags.histograms.items():
                rows.append((y, f"{kind}{suffix}", tuple(hist.quantile(q) for q in (0.0, 0.01, 0.5, 0.99, 1.0))))
                y -= 1
        drawn = [q for _, _, q in rows if not math.isnan(q[0])]
        floor = min([q[2] for q in drawn] + ([get_format(limits_of).min_subnormal] if limits_of else []),
                    default=1.0) / 2.0**12
        top = max([q[4] for q in drawn] + ([get_format(limits_of).max_finite] if limits_of else []), default=1.0)
        for y, _, (lo, p1, p50, p99, hi) in rows:
            if math.isnan(lo):
                continue
            tax.plot([max(lo, floor), hi], [y, y], color="#555555", lw=1.2)
            if p99 > floor:
                tax.plot([max(p1, floor), p99], [y, y], color=TENSOR_COLOUR, lw=7, solid_capstyle="butt")
            tax.plot([p50], [y], "o", color="white", mec="black", ms=5)
            if lo < floor:   # cut at the axis' edge, and marked so
                tax.plot([floor], [y], "<", color="#555555", ms=7, clip_on=False)
        tax.set_yticks([p for p, _, _ in rows], [t for _, t, _ in rows], fontsize=10)
        tax.set_ylim(-0.8, n_tensor_rows - 0.2)
        tax.set_xlim(floor, top * 8)
        tax.set_title("A real model's tensors, non-zero values (bar: 1st-99th percentile,\n"
                      "line: min-max, dot: median; triangle: cut at the left edge)", fontsize=11)
        axes.append(tax)
    if limits_of is not None:
        lim = get_format(limits_of)
        for target in axes:
            for value, style, what in ((lim.min_subnormal, ":", "smallest subnormal"),
                                       (lim.min_normal, "--", "smallest normal"),
                                       (lim.max_finite, "-", "largest value")):
                target.axvline(value, color=LIMIT_COLOUR, lw=1.0, ls=style, label=f"{lim.name} {what}")
        # the lines cross every panel: one legend under them all
        fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=3, frameon=False, fontsize=10)
    for target in axes:
        target.set_xscale("log", base=10)
        target.set_xlabel("magnitude |x| (log scale)", fontsize=10)
        target.tick_params(axis="x", labelsize=10)
        target.grid(axis="x", alpha=0.3)
    return finish_figure(fig)


def plot_relative_spacing(formats=None, *, lo: float = 1e-12, hi: float = 1e6, points: int = 4000) -> Figure:
    """Relative gap between neighbouring values, ``spacing(x)/x``, against magnitude, per format.

    Flat at about epsilon across the normal range; rising in the subnormal range, where the absolute gap
    stays fixed while x shrinks. Curves stop at each format's smallest subnormal and largest value.
    """
    fmts = resolve_formats(formats)
    x = np.logspace(math.log10(lo), math.log10(hi), points)
    fig, ax = plt.subplots(figsize=(8.5, 5))
    for i, f in enumerate(fmts):
        mask = (x >= f.min_subnormal) & (x <= f.max_finite)
        if not mask.any():
            continue
        rel = spacing(x[mask], f) / x[mask]
        colour = format_colour(f)
        # formats with as many mantissa bits as an earlier one share its curve where both exist (TF32 and
        # FP16): the later one is dashed and narrower, so the earlier one shows along it
        shared = any(g.mantissa_bits == f.mantissa_bits for g in fmts[:i])
        ax.step(x[mask], rel, where="post", color=colour, lw=1.4 if shared else 2.4,
                ls=(0, (4, 2)) if shared else "-", label=f.name + (" (dashed)" if shared else ""))
        # formats that share a smallest normal (FP16 and E5M2) share its line, drawn once in the first one's
        # colour: drawn again it would cover the first in the later format's colour
        if lo <= f.min_normal <= hi and all(g.min_normal != f.min_normal for g in fmts[:i]):
            ax.axvline(f.min_normal, color=colour, lw=0.8, ls=":", alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("magnitude x (log scale)")
    ax.set_ylabel("relative spacing  ulp(x) / x  (log2 scale)")
    ax.set_title("Precision against magnitude: flat in the normal range,\n"
                 "worse below the smallest normal (dotted lines)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return finish_figure(fig)


def plot_rounding_error_vs_magnitude(formats=("BF16", "FP16"), *, lo: float = 1e-9, hi: float = 1e6,
                                     n: int = 200_000, seed: int = 0) -> Figure:
    """The same log-uniform random values rounded to each format: relative rounding error against
    magnitude (binned median and maximum). Flat at about epsilon/4 (median) in the normal range; 100%
    where values flush to zero; not drawn in a bin where any value overflows, with a dotted line at the
    format's largest finite value."""
    rng = np.random.default_rng(seed)
    x = np.exp(rng.uniform(math.log(lo), math.log(hi), n))
    edges = np.logspace(math.log10(lo), math.log10(hi), 61)
    centres = np.sqrt(edges[:-1] * edges[1:])
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    lowest = math.inf
    for name in formats:
        f = get_format(name)
        r = round_to_format(x, f, overflow="inf" if f.has_inf else "saturate")
        rel = np.abs(r - x) / x
        idx = np.digitize(x, edges) - 1
        med = np.full(len(centres), np.nan)
        top = np.full(len(centres), np.nan)
        for b in range(len(centres)):
            in_bin = rel[idx == b]
            # a bin that overflows in part is left out whole: its finite part is a narrow slice below the
            # format's largest value, drawn at a centre past it
            if in_bin.size and np.isfinite(in_bin).all():
                med[b], top[b] = np.median(in_bin), in_bin.max()
        colour = format_colour(f)
        lowest = min(lowest, np.nanmin(med))
        ax.plot(centres, med, color=colour, lw=2, label=f"{f.name} median")
        ax.plot(centres, top, color=colour, lw=1, ls="--", label=f"{f.name} max")
        if f.max_finite < hi:
            ax.axvline(f.max_finite, color=colour, lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    # down to the decade under the lowest median, so that every line lies above a labelled tick
    ax.set_ylim(bottom=10.0 ** math.floor(math.log10(lowest)) / 1.5)
    ax.set_xlabel("magnitude of the value (log scale)")
    ax.set_ylabel("relative rounding error (log scale)")
    ax.set_title("Precision against range: the same values rounded to each format")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return finish_figure(fig)
