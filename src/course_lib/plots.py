"""Figures. Each function takes results (or formats) and returns a matplotlib ``Figure``; none shows it."""

from __future__ import annotations

import math
import re

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .formats import FloatFormat, get_format, list_formats, spacing

# Colour-blind-safe (Okabe-Ito) colours for sign, exponent and mantissa; readable on light and dark.
SIGN_COLOUR = "#D55E00"
EXPONENT_COLOUR = "#0072B2"
MANTISSA_COLOUR = "#009E73"
TENSOR_COLOUR = "#555555"   # measured tensors: grey, so they never share a format's colour
LIMIT_COLOUR = "#D55E00"
FORMAT_COLOURS = ["#000000", "#999999", "#0072B2", "#D55E00", "#CC79A7", "#E69F00", "#56B4E9",
                  "#009E73", "#F0E442", "#882255"]


FIGURE_DPI = 150   # rendered at 1.5x the usual 100 dpi: the book scales images to its column, so text stays sharp


def _finish(fig: Figure) -> Figure:
    """Lay out and detach from pyplot: the caller displays or glues the figure; Jupyter's inline backend
    must not show it a second time at the end of the cell, and no figure piles up in pyplot's registry.
    The figure's dpi is set to :data:`FIGURE_DPI`, which the notebook's PNG uses."""
    fig.tight_layout()
    plt.close(fig)
    fig.set_dpi(FIGURE_DPI)   # after close(), which restores the figure's original dpi
    return fig


def _formats(formats) -> list[FloatFormat]:
    return list_formats() if formats is None else [get_format(f) for f in formats]


def plot_bit_layouts(formats=None) -> Figure:
    """One row per format: its sign, exponent and mantissa bits as coloured cells, drawn from the registry."""
    fmts = _formats(formats)
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
                ax.text(x + n / 2, y + 0.5, f"{letter}{n}" if n > 1 else letter, ha="center", va="center",
                        color="white", fontsize=8, fontweight="bold")
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
    return _finish(fig)


def plot_format_ranges(formats=None, magnitudes=None, *, recorded=None, limits_of="FP16") -> Figure:
    """Representable magnitudes of every format on one log axis, with a model's tensors placed on it.

    ``magnitudes``: a :class:`~course_lib.magnitudes.TrainingMagnitudes` measured live (optional);
    ``recorded``: an optional ``(label, TrainingMagnitudes)`` from a GPU record, drawn beside it.
    Formats: light bar = subnormal range, dark bar = normal range. Tensors: thick bar = 1st to 99th
    percentile of the non-zero magnitudes, thin line = smallest to largest, dot = median.
    ``limits_of``: a format whose smallest subnormal, smallest normal and largest value are drawn as
    vertical lines across the figure (None for none).
    """
    fmts = _formats(formats)
    tensor_sets = []
    if magnitudes is not None:
        tensor_sets.append(("this run", magnitudes))
    if recorded is not None:
        tensor_sets.append(recorded)
    n_tensor_rows = sum(len(m.histograms) for _, m in tensor_sets)
    if n_tensor_rows:
        # two panels: the formats over their whole range, the tensors on an axis zoomed to their own span
        # (on one shared axis, 10^-45..10^38, the tensors were squeezed into a few millimetres)
        fig, (ax, tax) = plt.subplots(1, 2, figsize=(12, 0.34 * max(len(fmts), n_tensor_rows) + 2.4),
                                      gridspec_kw={"width_ratios": [1, 1.25]})
    else:
        fig, ax = plt.subplots(figsize=(8.5, 0.32 * len(fmts) + 1.6))
        tax = None
    labels = []
    for i, f in enumerate(fmts):
        y = len(fmts) - 1 - i
        colour = FORMAT_COLOURS[i % len(FORMAT_COLOURS)]
        if f.min_subnormal < f.min_normal:
            ax.plot([f.min_subnormal, f.min_normal], [y, y], color=colour, lw=7, alpha=0.35,
                    solid_capstyle="butt")
        ax.plot([f.min_normal, f.max_finite], [y, y], color=colour, lw=7, solid_capstyle="butt")
        labels.append((y, f.name))
    ax.set_yticks([p for p, _ in labels], [t for _, t in labels])
    ax.set_ylim(-0.8, len(fmts) - 0.2)
    ax.set_title("Representable magnitudes\n(light: subnormal, dark: normal)", fontsize=11)
    axes = [ax]
    if tax is not None:
        tlabels = []
        y = n_tensor_rows - 1
        spans = []
        for set_label, mags in tensor_sets:
            for kind, hist in mags.histograms.items():
                lo, p1, p50, p99, hi = (hist.quantile(q) for q in (0.0, 0.01, 0.5, 0.99, 1.0))
                if not math.isnan(lo):
                    tax.plot([lo, hi], [y, y], color="#555555", lw=1.2)
                    tax.plot([p1, p99], [y, y], color=TENSOR_COLOUR, lw=7, solid_capstyle="butt")
                    tax.plot([p50], [y], "o", color="white", mec="black", ms=5)
                    spans += [lo, hi]
                # a GPU record's label, e.g. "NVIDIA H100 80GB HBM3 (sm 9.0)", shortened to fit beside the bars
                short = re.sub(r"\s*\(sm [\d.]+\)", "", re.sub(r"^NVIDIA ", "", set_label))
                suffix = f" ({short})" if len(tensor_sets) > 1 else ""
                tlabels.append((y, f"{kind}{suffix}"))
                y -= 1
        tax.set_yticks([p for p, _ in tlabels], [t for _, t in tlabels])
        tax.set_ylim(-0.8, n_tensor_rows - 0.2)
        if spans:
            tax.set_xlim(min(spans) / 8, max(spans) * 8)
        tax.set_title("A real model's tensors\n(bar: 1st-99th percentile, line: min-max, dot: median)", fontsize=11)
        axes.append(tax)
    if limits_of is not None:
        lim = get_format(limits_of)
        for target in axes:
            for value, style, what in ((lim.min_subnormal, ":", "smallest subnormal"),
                                       (lim.min_normal, "--", "smallest normal"),
                                       (lim.max_finite, "-", "largest value")):
                target.axvline(value, color=LIMIT_COLOUR, lw=1.0, ls=style, label=f"{lim.name} {what}")
        axes[0].legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), fontsize=8, ncol=2, frameon=False)
    for target in axes:
        target.set_xscale("log", base=10)
        target.set_xlabel("magnitude |x| (log scale)")
        target.grid(axis="x", alpha=0.3)
    return _finish(fig)


def plot_relative_spacing(formats=None, *, lo: float = 1e-12, hi: float = 1e6, points: int = 4000) -> Figure:
    """Relative gap between neighbouring values, ``spacing(x)/x``, against magnitude, per format.

    Flat at about epsilon across the normal range; rising in the subnormal range, where the absolute gap
    stays fixed while x shrinks. Curves stop at each format's smallest subnormal and largest value.
    """
    fmts = _formats(formats)
    x = np.logspace(math.log10(lo), math.log10(hi), points)
    fig, ax = plt.subplots(figsize=(8.5, 5))
    for i, f in enumerate(fmts):
        mask = (x >= f.min_subnormal) & (x <= f.max_finite)
        if not mask.any():
            continue
        rel = spacing(x[mask], f) / x[mask]
        colour = FORMAT_COLOURS[i % len(FORMAT_COLOURS)]
        ax.step(x[mask], rel, where="post", color=colour, lw=1.4, label=f.name)
        if lo <= f.min_normal <= hi:
            ax.axvline(f.min_normal, color=colour, lw=0.8, ls=":", alpha=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("magnitude x (log scale)")
    ax.set_ylabel("relative spacing  ulp(x) / x  (log2 scale)")
    ax.set_title("Precision against magnitude: flat in the normal range,\n"
                 "worse below the smallest normal (dotted lines)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    return _finish(fig)


# ---- lesson 2: underflow and overflow --------------------------------------------------------------

def plot_gradient_histogram(values, fmt="FP16", *, loss_scale: float = 1.0, title: str | None = None,
                            ax=None) -> Figure:
    """Histogram of log2|g| (times ``loss_scale``) with the format's regions shaded and labelled with
    the measured fractions: flushed to zero, subnormal, normal, overflow. Exact zeros are counted apart."""
    from .gradients import summarize_underflow
    from .magnitudes import log2_histogram

    f = get_format(fmt)
    summary = summarize_underflow(values, f, loss_scale)
    scaled = values.detach().flatten().double() * loss_scale
    hist = log2_histogram(scaled)
    edges = hist.binade_edges
    counts = np.asarray(hist.counts, dtype=float)
    nz = np.flatnonzero(counts)
    if ax is None:
        fig, ax = plt.subplots(figsize=(8.5, 4.2))
    else:
        fig = ax.figure
    lo = min(edges[nz[0]] - 2, math.log2(f.min_subnormal) - 4) if nz.size else -30
    hi = max(edges[nz[-1]] + 3, math.log2(f.max_finite) + 2) if nz.size else 20
    flush_edge = math.log2(f.min_subnormal / 2)
    normal_lo, top = math.log2(f.min_normal), math.log2(f.max_finite)
    ax.axvspan(lo, flush_edge, color="#D55E00", alpha=0.15, lw=0)
    ax.axvspan(flush_edge, normal_lo, color="#E69F00", alpha=0.18, lw=0)
    ax.axvspan(normal_lo, top, color="#009E73", alpha=0.12, lw=0)
    ax.axvspan(top, hi, color="#CC79A7", alpha=0.18, lw=0)
    ax.bar(edges + 0.5, counts / max(hist.total, 1) * 100, width=0.9, color="#333333")
    ymax = max(counts.max() / max(hist.total, 1) * 100 * 1.35, 1.0) if nz.size else 1.0
    ax.set_ylim(0, ymax)
    y = ymax * 0.9
    labels = [((lo + flush_edge) / 2, f"flushed to 0\n{summary.flushed:.1%}"),
              ((flush_edge + normal_lo) / 2, f"subnormal\n{summary.subnormal:.1%}"),
              ((normal_lo + min(top, hi)) / 2, f"normal\n{summary.normal:.1%}"),
              ((top + hi) / 2, f"overflow\n{summary.overflow:.1%}")]
    for x, text in labels:
        if lo <= x <= hi:
            ax.text(x, y, text, ha="center", va="top", fontsize=8)
    ax.set_xlim(lo, hi)
    ax.set_xlabel(f"log2 |gradient x {loss_scale:g}|" if loss_scale != 1 else "log2 |gradient|")
    ax.set_ylabel("% of values")
    scale_text = f", loss scale {loss_scale:g}" if loss_scale != 1 else ""
    ax.set_title(title or f"Gradients against {f.name}'s regions{scale_text} (exact zeros: {summary.zero:.1%})")
    ax.grid(axis="y", alpha=0.3)
    return _finish(fig)


def plot_layer_gradients(capture, fmt="FP16", *, kind: str = "activation", title: str | None = None) -> Figure:
    """Per layer, in backward order, the 1st/50th/99th percentile of |gradient|, with the format's
    smallest normal and subnormal as lines: how gradients shrink going backwards."""
    f = get_format(fmt)
    layers = list(reversed(capture.of_kind(kind)))
    names, p1, p50, p99 = [], [], [], []
    for g in layers:
        v = g.values.abs()
        v = v[v > 0].double()
        q = _quantiles(v, (0.01, 0.5, 0.99))
        names.append(g.name)
        p1.append(q[0])
        p50.append(q[1])
        p99.append(q[2])
    fig, ax = plt.subplots(figsize=(8.5, 0.28 * len(names) + 1.8))
    y = np.arange(len(names))
    ax.hlines(y, p1, p99, color="#555555", lw=5)
    ax.plot(p50, y, "o", color="white", mec="black", ms=5, label="median")
    ax.axvline(f.min_normal, color=LIMIT_COLOUR, ls="--", lw=1, label=f"{f.name} smallest normal")
    ax.axvline(f.min_subnormal, color=LIMIT_COLOUR, ls=":", lw=1, label=f"{f.name} smallest subnormal")
    ax.set_yticks(y, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"|{kind} gradient| (bar: 1st to 99th percentile)")
    ax.set_ylabel("layer (top: last layer, where backpropagation starts)")
    ax.set_title(title or f"{kind.capitalize()} gradients layer by layer, going backwards")
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    return _finish(fig)


def _quantiles(values, qs) -> list[float]:
    """Quantiles of a 1-D tensor (numpy, so that any size works)."""
    if values.numel() == 0:
        return [math.nan] * len(qs)
    return [float(v) for v in np.quantile(values.cpu().numpy(), qs)]


def plot_runs(series: dict, *, ylabel: str, title: str, logy: bool = False, minus: str | None = None,
              smooth: int = 1) -> Figure:
    """Lines of per-step values, one per named run (loss curves, zero fractions, ...).

    ``minus``: the name of a run to subtract from every other (drawn as the zero line), to show
    differences too small to see on the raw curves; ``smooth``: moving-average window in steps."""
    if minus is not None and minus not in series:
        raise ValueError(f"no run named {minus!r} to subtract; runs: {', '.join(series)}")
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be a positive int, got {smooth!r}")

    def prepared(values):
        v = np.asarray(values, dtype=float)
        if minus is not None:
            v = v - np.asarray(series[minus], dtype=float)[: len(v)]
        if smooth > 1 and len(v) >= smooth:
            v = np.convolve(v, np.ones(smooth) / smooth, mode="valid")
        return v

    fig, ax = plt.subplots(figsize=(8.5, 4))
    if minus is not None:
        ax.axhline(0.0, color="#000000", lw=1, label=minus)
    for i, (label, raw) in enumerate(series.items()):
        if label == minus:
            continue
        values = prepared(raw)
        ax.plot(np.arange(len(values)) + (smooth - 1), values,
                color=FORMAT_COLOURS[(i + 2) % len(FORMAT_COLOURS)], lw=1.5, label=label)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _finish(fig)


# ---- lesson 3: loss scaling --------------------------------------------------------------------------

def plot_scale_sweep(sweep, *, marks: dict | None = None) -> Figure:
    """Fractions of non-zero gradients that survive, flush to zero and overflow against the loss scale."""
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    lo, hi = sweep.plateau()
    ax.axvspan(lo, hi, color="#009E73", alpha=0.08, label="within 0.5 points of the best survival")
    ax.plot(sweep.scales, np.array(sweep.survive) * 100, color="#009E73", lw=2, label="survive (all)")
    ax.plot(sweep.scales, np.array(sweep.survive_normal) * 100, color="#0072B2", lw=1.5, ls="--",
            label="survive as normal numbers (full precision)")
    ax.plot(sweep.scales, np.array(sweep.flushed) * 100, color="#E69F00", lw=1.5, label="flushed to zero")
    ax.plot(sweep.scales, np.array(sweep.overflow) * 100, color="#CC79A7", lw=1.5, label="overflow")
    for label, x in (marks or {}).items():
        ax.axvline(x, color="#555555", ls=":", lw=1)
        ax.text(x, 50, f" {label}", rotation=90, va="center", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("loss scale (log2 axis)")
    ax.set_ylabel("% of non-zero gradients")
    ax.set_title(f"What a loss scale does to the gradients in {sweep.format}")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3, frameon=False)  # off the data
    ax.grid(alpha=0.3)
    return _finish(fig)



def plot_scale_fidelity(result) -> Figure:
    """Relative error of each parameter's FP16-autocast gradient against FP32's (log scale), one line per
    loss scale of a :class:`~course_lib.scaling.ScaleFidelity`; a scale whose gradients overflowed is named
    in the legend without a line."""
    fig, ax = plt.subplots(figsize=(10, 4.6))
    x = np.arange(len(result.names))
    for j, sc in enumerate(result.scales):
        label = f"scale 2^{math.log2(sc):g}" if math.log2(sc) == int(math.log2(sc)) else f"scale {sc:g}"
        if result.overflowed[sc]:
            ax.plot([], [], " ", label=f"{label}: gradients overflowed (inf), no error to draw")
            continue
        ax.plot(x, [result.error[sc][n] for n in result.names], marker="o", ms=4, lw=1.4,
                color=_recipe_colour(j), label=label)
    ax.set_yscale("log")
    ax.set_xticks(x, result.names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("relative error of the gradient\n(FP16 autocast against FP32)")
    ax.set_title(f"Each parameter's gradient under each loss scale (after {result.steps} FP32 steps)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _finish(fig)

def plot_scale_traces(traces: dict, *, title: str = "Loss scale per step") -> Figure:
    """Scale per step (log2 axis) for one or more :class:`~course_lib.scaling.ScaleTrace`, skipped steps
    marked with crosses."""
    fig, ax = plt.subplots(figsize=(8.5, 4))
    markers = ["o", "x", "+", "^", "s"]
    for i, (label, trace) in enumerate(traces.items()):
        colour = FORMAT_COLOURS[(i + 2) % len(FORMAT_COLOURS)]
        steps = np.arange(len(trace.scales))
        # the first trace is drawn wide and underneath, so traces that coincide with it stay visible on top
        ax.step(steps, trace.scales, where="post", color=colour, lw=5 if i == 0 else 1.5,
                alpha=0.45 if i == 0 else 1.0, ls="-" if i < 2 else "--", zorder=1 if i == 0 else 2 + i,
                label=f"{label} ({trace.n_skipped} skipped)")
        skipped = np.flatnonzero(trace.skipped)
        ax.plot(skipped, np.array(trace.scales)[skipped], markers[i % len(markers)], color=colour,
                ms=11 if i == 0 else 7, mfc="none" if i == 0 else colour, mew=1.8, zorder=3 + i)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("training step")
    ax.set_ylabel("loss scale (log2 axis)")
    ax.set_title(title + " (markers: skipped steps)")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _finish(fig)


def plot_rounding_error_vs_magnitude(formats=("BF16", "FP16"), *, lo: float = 1e-9, hi: float = 1e6,
                                     n: int = 200_000, seed: int = 0) -> Figure:
    """The same log-uniform random values rounded to each format: relative rounding error against
    magnitude (binned median and maximum). Flat at about epsilon/4 (median) in the normal range; 100%
    where values flush to zero; undefined (not drawn) where they overflow."""
    from .formats import round_to_format

    rng = np.random.default_rng(seed)
    x = np.exp(rng.uniform(math.log(lo), math.log(hi), n))
    edges = np.logspace(math.log10(lo), math.log10(hi), 61)
    centres = np.sqrt(edges[:-1] * edges[1:])
    fig, ax = plt.subplots(figsize=(8.5, 4.5))
    for i, name in enumerate(formats):
        f = get_format(name)
        r = round_to_format(x, f, overflow="inf" if f.has_inf else "saturate")
        rel = np.abs(r - x) / x
        idx = np.digitize(x, edges) - 1
        med = np.full(len(centres), np.nan)
        top = np.full(len(centres), np.nan)
        for b in range(len(centres)):
            vals = rel[(idx == b) & np.isfinite(rel)]
            if vals.size:
                med[b], top[b] = np.median(vals), vals.max()
        colour = FORMAT_COLOURS[(i + 2) % len(FORMAT_COLOURS)]
        ax.plot(centres, med, color=colour, lw=2, label=f"{f.name} median")
        ax.plot(centres, top, color=colour, lw=1, ls="--", label=f"{f.name} max")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("magnitude of the value (log scale)")
    ax.set_ylabel("relative rounding error (log scale)")
    ax.set_title("Precision against range: the same values rounded to each format")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _finish(fig)


# ---- lesson 6: performance and memory ----------------------------------------------------------------

_DTYPE_COLOURS = {"fp32": "#000000", "tf32": "#999999", "bf16": "#0072B2", "fp16": "#D55E00", "fp8": "#CC79A7"}
_DTYPE_NAMES = {"fp32": "FP32 (TF32 off)", "tf32": "TF32", "bf16": "BF16", "fp16": "FP16", "fp8": "FP8 E4M3"}


def plot_matmul_throughput(panels: dict, *, peaks: dict | None = None) -> Figure:
    """Square-matmul throughput against size, one line per dtype, one panel per device.

    ``panels``: ``{title: {dtype: {n: TFLOP/s}}}``. Sizes that are not a multiple of 8 (misaligned) are
    drawn as hollow markers off the line. ``peaks``: ``{title: {dtype: TFLOP/s}}`` drawn as dashed lines.
    """
    if not panels:
        raise ValueError("nothing to plot: panels is empty")
    fig, axes = plt.subplots(1, len(panels), figsize=(8.5 if len(panels) == 1 else 11, 5.4), squeeze=False)
    for ax, (title, by_dtype) in zip(axes[0], panels.items()):
        for j, (dtype, points) in enumerate(by_dtype.items()):
            colour = _DTYPE_COLOURS.get(dtype, "#555555")
            aligned = sorted((n, t) for n, t in points.items() if n % 8 == 0)
            # misaligned sizes sit next to their aligned neighbour: nudge each dtype's marker sideways so
            # that dtypes with equal throughput do not hide each other
            odd = sorted((n * 2 ** (0.06 * (j - 2)), t) for n, t in points.items() if n % 8)
            if aligned:
                ax.plot(*zip(*aligned), "o-", color=colour, lw=1.8, ms=4, label=_DTYPE_NAMES.get(dtype, dtype))
            if odd:
                ax.plot(*zip(*odd), "o", mfc="none", color=colour, ms=7, mew=1.5)
            peak = (peaks or {}).get(title, {}).get(dtype)
            if peak:
                ax.axhline(peak, color=colour, ls="--", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("n (square n x n x n product, log2 axis)")
        ax.set_ylabel("TFLOP/s (log scale)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, which="both")
    for ax in axes[0]:
        ax.plot([], [], "o", mfc="none", color="#555555", label="misaligned n (n - 1)")
    if peaks:
        axes[0][-1].plot([], [], "--", color="#555555", label="datasheet dense peak")
    for ax in axes[0]:
        # below the axes, so that no line is covered
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=3, frameon=False)
    return _finish(fig)


def plot_roofline(ops, ceilings: dict) -> Figure:
    """Roofline: attainable TFLOP/s against arithmetic intensity (FLOPs per byte) for each ceiling
    ``{label: (peak TFLOP/s, bandwidth GB/s)}``, with each operation (an ``OpCost``) placed at its
    intensity on the first ceiling's roof."""
    from .bench import attainable_tflops

    if not ceilings:
        raise ValueError("give at least one ceiling")
    fig, ax = plt.subplots(figsize=(8.5, 5))
    ai = np.logspace(-1, 4, 200)
    for i, (label, (peak, bw)) in enumerate(ceilings.items()):
        colour = FORMAT_COLOURS[(i + 2) % len(FORMAT_COLOURS)]
        ax.plot(ai, [attainable_tflops(a, peak, bw) for a in ai], color=colour, lw=2,
                label=f"{label}: ridge at {peak * 1e3 / bw:.0f} FLOP/B")
    first_peak, first_bw = next(iter(ceilings.values()))
    ridge = first_peak * 1e3 / first_bw
    # operations of nearly the same intensity share one label, so labels do not overprint each other
    groups: list[list] = []
    for op in sorted(ops, key=lambda o: o.intensity):
        if groups and op.intensity <= groups[-1][0].intensity * 1.05:
            groups[-1].append(op)
        else:
            groups.append([op])
    for i, group in enumerate(groups):
        for op in group:
            marker = "s" if op.intensity >= ridge else "o"
            ax.plot(op.intensity, attainable_tflops(op.intensity, first_peak, first_bw), marker,
                    color="#000000", ms=6)
        x = group[0].intensity
        y = attainable_tflops(x, first_peak, first_bw)
        ax.annotate(str(i + 1), (x, y), textcoords="offset points", xytext=(-4, 7), ha="right", fontsize=9,
                    fontweight="bold")
    key = "\n".join(f"{i + 1}: " + " / ".join(o.name for o in g)
                    + (" (compute-bound)" if g[0].intensity >= ridge else " (memory-bound)")
                    for i, g in enumerate(groups))
    ax.text(0.98, 0.03, key, transform=ax.transAxes, ha="right", va="bottom", fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "#999999", "alpha": 0.9})
    ax.plot([], [], "o", color="#000000", label="op below the ridge: memory-bound")
    ax.plot([], [], "s", color="#000000", label="op above the ridge: compute-bound")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved, log scale)")
    ax.set_ylabel("attainable TFLOP/s (log scale)")
    ax.set_title("Roofline: the course model's operations (points on the first ceiling)", fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    ax.grid(alpha=0.3, which="both")
    return _finish(fig)


def plot_throughput(panels: dict) -> Figure:
    """Tokens per second per recipe (median over seeds, bar) with the seeds' range (error bar); one panel
    per device. ``panels``: ``{title: [row, ...]}`` with rows as :meth:`ThroughputStudy.table` gives."""
    fig, axes = plt.subplots(1, len(panels), figsize=(8.5 if len(panels) == 1 else 11, 4.2), squeeze=False)
    for ax, (title, rows) in zip(axes[0], panels.items()):
        labels = [r["recipe"] + (" + compile" if r["compiled"] else "") for r in rows]
        values = np.array([r["tokens_per_s"] / 1e3 for r in rows])
        if all("tokens_per_s_range" in r for r in rows):
            lo = np.array([r["tokens_per_s_range"][0] / 1e3 for r in rows])
            hi = np.array([r["tokens_per_s_range"][1] / 1e3 for r in rows])
        else:  # rows recorded before the table carried a tokens/s range: derive it from the step times
            lo = np.array([v * r["step_ms"] / r["step_ms_range"][1] for v, r in zip(values, rows)])
            hi = np.array([v * r["step_ms"] / r["step_ms_range"][0] for v, r in zip(values, rows)])
        colours = ["#0072B2" if r["compiled"] else "#999999" for r in rows]
        y = np.arange(len(rows))
        # a median of an even number of seeds need not lie inside the range by more than rounding
        ax.barh(y, values, color=colours, xerr=[np.clip(values - lo, 0, None), np.clip(hi - values, 0, None)],
                capsize=3)
        ax.set_yticks(y, labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("thousand tokens per second (median over seeds; bar: range)")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    return _finish(fig)


def plot_loss_against_time(panels: dict, *, target: dict | None = None) -> Figure:
    """Training loss against wall-clock seconds, one line per run, coloured by recipe; one panel per
    device. ``panels``: ``{title: {recipe: [(seconds, losses), ...]}}``; ``target``: ``{title: loss}``
    drawn as a horizontal line."""
    fig, axes = plt.subplots(1, len(panels), figsize=(8.5 if len(panels) == 1 else 11, 4.2), squeeze=False)
    recipes = list(dict.fromkeys(r for by_recipe in panels.values() for r in by_recipe))
    colours = {r: FORMAT_COLOURS[(i + 2) % len(FORMAT_COLOURS)] for i, r in enumerate(recipes)}
    for ax, (title, by_recipe) in zip(axes[0], panels.items()):
        for recipe, runs in by_recipe.items():
            colour = colours[recipe]  # one colour per recipe in every panel
            for j, (seconds, losses) in enumerate(runs):
                # a moving average over about a thirtieth of the run, so seeds stay distinguishable
                window = max(1, len(losses) // 30)
                smooth = np.convolve(np.asarray(losses, float), np.ones(window) / window, mode="valid")
                ax.plot(np.cumsum(seconds)[window - 1:], smooth, color=colour, lw=1.2, alpha=0.85,
                        label=f"{recipe} ({len(runs)} seeds)" if j == 0 else None)
        if target and title in target:
            ax.axhline(target[title], color="#555555", ls=":", lw=1.2, label="target loss")
        ax.set_xlabel("wall-clock seconds")
        ax.set_ylabel("training loss (moving average)")
        ax.set_title(title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    return _finish(fig)


_MEMORY_COLOURS = {"weights": "#0072B2", "gradients": "#56B4E9", "optimizer_state": "#009E73",
                   "master_weights": "#E69F00", "autocast_weight_copies": "#CC79A7", "activations": "#999999"}


def plot_memory_breakdown(breakdowns, *, title: str) -> Figure:
    """Stacked bars: bytes of each component per recipe (a :class:`~course_lib.memory.MemoryBreakdown`
    or its dict), with the allocator's measured peak as a black tick where there is one."""
    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    names = []
    for i, b in enumerate(breakdowns):
        comp = b["components"] if isinstance(b, dict) else b.components
        recipe = b["recipe"] if isinstance(b, dict) else b.recipe
        peak = b.get("measured_peak_bytes") if isinstance(b, dict) else b.measured_peak_bytes
        names.append(recipe)
        left = 0.0
        for key, colour in _MEMORY_COLOURS.items():
            value = comp.get(key, 0) / 2 ** 20
            ax.barh(i, value, left=left, color=colour, label=key.replace("_", " ") if i == 0 else None)
            left += value
        if peak:
            ax.plot([peak / 2 ** 20] * 2, [i - 0.4, i + 0.4], color="#000000", lw=2.5,
                    label="allocator peak (measured)" if i == 0 else None)
    ax.set_yticks(range(len(names)), names, fontsize=9)
    ax.invert_yaxis()
    ax.set_xlabel("MiB")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    ax.grid(alpha=0.3, axis="x")
    return _finish(fig)


def plot_activation_sweep(sweep) -> Figure:
    """Activation bytes saved for backward against batch size and against context, plain and with
    activation checkpointing of every block. ``sweep``: an ``ActivationSweep`` or its dict."""
    points = sweep["points"] if isinstance(sweep, dict) else sweep.points
    max_b = max(p[0] for p in points)
    max_t = max(p[1] for p in points)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for ck, colour, label in ((False, "#0072B2", "plain"), (True, "#D55E00", "checkpointed blocks")):
        by_b = sorted((p[0], p[3]) for p in points if p[1] == max_t and p[2] == ck)
        by_t = sorted((p[1], p[3]) for p in points if p[0] == max_b and p[2] == ck)
        ax1.plot([b for b, _ in by_b], [v / 2 ** 20 for _, v in by_b], "o-", color=colour, label=label)
        ax2.plot([t for t, _ in by_t], [v / 2 ** 20 for _, v in by_t], "o-", color=colour, label=label)
    ax1.set_xlabel(f"batch size (context {max_t})")
    ax2.set_xlabel(f"context length, tokens (batch {max_b})")
    for ax in (ax1, ax2):
        ax.set_ylabel("activations saved for backward (MiB)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _finish(fig)


# ---- lesson 7: FP8 ----------------------------------------------------------------------------------

# One colour per kind of FP8 scaling, the same in every lesson-7 figure, and one per block-scaled recipe in
# lesson 8 (matched on the label, first hit).
_FP8_COLOURS = (("nvfp4_no_sr", "#56B4E9"), ("nvfp4_no_rht", "#009E73"), ("nvfp4_no_2d", "#D55E00"),
                ("nvfp4_no_hp_last", "#882255"), ("nvfp4", "#E69F00"), ("mxfp8", "#0072B2"),
                ("mxfp4_hp_last", "#999933"), ("mxfp4", "#CC79A7"),
                ("no scaling", "#000000"), ("unscaled", "#000000"), ("e5m2", "#CC79A7"),
                ("per tensor", "#0072B2"), ("tensorwise", "#0072B2"), ("current", "#0072B2"),
                ("per row", "#E69F00"), ("rowwise", "#E69F00"), ("per column", "#56B4E9"),
                ("tiles", "#009E73"), ("blockwise", "#009E73"), ("blocks", "#882255"),
                ("most recent", "#AA4499"), ("delayed", "#D55E00"), ("bf16", "#777777"))


def _fp8_colour(label: str, j: int = 0) -> str:
    low = label.lower()
    for key, colour in _FP8_COLOURS:
        if key in low:
            return colour
    return _recipe_colour(j)


def _recipe_colour(j: int) -> str:
    # the Okabe-Ito colours after black and grey, one per recipe, never the limit colour
    palette = [c for c in FORMAT_COLOURS[2:] if c != LIMIT_COLOUR]
    return palette[j % len(palette)]


def plot_scaling_lab(lab) -> Figure:
    """Relative error (log scale) of each recipe on each tensor of a :class:`~course_lib.fp8.ScalingLab`,
    one group of bars per tensor; a bar whose values were mostly flushed to zero is hatched and labelled."""
    tensors, recipes = lab.tensors, lab.recipes
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(recipes)
    floor = 1e-3
    for j, recipe in enumerate(recipes):
        colour = _fp8_colour(recipe, j)
        for i, tensor in enumerate(tensors):
            e = lab.errors[tensor][recipe]
            x = i + (j - (len(recipes) - 1) / 2) * width
            flushed = e.flushed > 0.5
            ax.bar(x, max(e.relative_error, floor), width * 0.92, bottom=None, color=colour,
                   hatch="//" if flushed else None, edgecolor="#BBBBBB" if flushed else "white",
                   label=recipe if i == 0 else None)
            if flushed:
                ax.text(x, max(e.relative_error, floor) * 1.15, f"{100 * e.flushed:.0f}%\nflushed", ha="center",
                        va="bottom", fontsize=7)
    ax.set_xticks(range(len(tensors)), tensors)
    ax.set_yscale("log")
    ax.set_ylim(floor, 5)
    ax.set_ylabel("relative error ||q(x) - x|| / ||x|| (log)")
    ax.grid(alpha=0.3, axis="y", which="both")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    return _finish(fig)


def plot_outlier_sweep(sweep) -> Figure:
    """Two panels against the size of one outlier channel, per recipe: the share of the other channels'
    values flushed to zero, and their relative error."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    for j, recipe in enumerate(sweep.relative_error):
        style = dict(color=_fp8_colour(recipe, j), lw=1.8, ms=4, label=recipe, marker="o", ls=["-", "--"][j % 2])
        left.plot(sweep.factors, np.asarray(sweep.flushed[recipe]) * 100, **style)
        right.plot(sweep.factors, sweep.relative_error[recipe], **style)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel(f"outlier channel's size (channel {sweep.channel} x this, log)")
        ax.grid(alpha=0.3, which="both")
    left.set_ylabel("other channels' values flushed to zero (%)")
    right.set_yscale("log")
    right.set_ylabel("relative error of the other channels (log)")
    left.legend(fontsize=8, loc="upper left")
    return _finish(fig)


def plot_delayed_spike(run) -> Figure:
    """Three panels over steps: the tensor's amax (log), each recipe's share of saturated values, and each
    recipe's relative error (log)."""
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8.5, 7), sharex=True,
                                              gridspec_kw={"height_ratios": [1, 1.3, 1.3]})
    steps = np.arange(len(run.amax))
    top.plot(steps, run.amax, "o-", color=TENSOR_COLOUR, ms=3, lw=1.2)
    top.set_yscale("log")
    top.set_ylabel("amax (log)")
    styles = ["-", "--", ":"]
    for j, recipe in enumerate(run.saturated):
        style = dict(ls=styles[j % 3], marker="o", ms=3, color=_fp8_colour(recipe, j), lw=1.8, label=recipe)
        middle.plot(steps, np.asarray(run.saturated[recipe]) * 100, **style)
        bottom.plot(steps, run.relative_error[recipe], **style)
    middle.set_ylabel("values saturated (%)")
    bottom.set_ylabel("relative error (log)")
    bottom.set_yscale("log")
    bottom.set_xlabel("step")
    middle.legend(fontsize=8, loc="upper right")
    for ax in (top, middle, bottom):
        ax.grid(alpha=0.3, which="both")
        ax.axvline(run.spike_at, color=TENSOR_COLOUR, lw=0.8, ls=":")
    return _finish(fig)


def plot_fp8_training(result, *, reference: str = "bf16_autocast", tail: int = 5) -> Figure:
    """:func:`plot_seeded_runs` of an FP8 (or block-scaled) training result against BF16 autocast."""
    return plot_seeded_runs(result, reference=reference, tail=tail)


def plot_seeded_runs(result, *, reference: str, tail: int = 5, finals: dict | None = None,
                     final_label: str | None = None) -> Figure:
    """Left: loss curves per recipe (mean over seeds as a line, min-max over seeds as a band). Right: each
    seed's final loss (mean of the last ``tail`` steps) minus the ``reference`` recipe's from the same seed,
    one dot per seed. ``result`` has ``recipes``, ``curves[recipe][seed_index]`` and ``final(recipe, tail)``.
    ``finals`` (recipe -> one value per seed) replaces the final losses, ``final_label`` names them."""
    if reference not in result.curves:
        raise ValueError(f"no recipe named {reference!r}; recipes: {', '.join(result.curves)}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1.6, 1]})
    others = [r for r in result.recipes if r != reference]
    colours = {reference: "#777777", **{r: _fp8_colour(r, j) for j, r in enumerate(others)}}
    if len({colours[r] for r in others} | {colours[reference]}) < len(others) + 1:   # names the map cannot tell apart
        colours = {reference: "#777777", **{r: _recipe_colour(j) for j, r in enumerate(others)}}
    for recipe in result.recipes:
        runs = np.asarray(result.curves[recipe], dtype=float)
        x = np.arange(runs.shape[1])
        left.plot(x, runs.mean(axis=0), color=colours[recipe], lw=1.8 if recipe != reference else 2.2,
                  label=recipe)
        left.fill_between(x, runs.min(axis=0), runs.max(axis=0), color=colours[recipe], alpha=0.15, lw=0)
    left.set_xlabel("training step")
    left.set_ylabel("loss (line: mean over seeds; band: range)")
    left.grid(alpha=0.3)
    left.legend(fontsize=8, ncol=2)
    if finals is not None and set(result.recipes) - set(finals):
        raise ValueError(f"finals has no values for {', '.join(sorted(set(result.recipes) - set(finals)))}")
    final = (lambda r: finals[r]) if finals is not None else (lambda r: result.final(r, tail))
    ref_final = final(reference)
    for i, recipe in enumerate(others):
        diffs = [a - b for a, b in zip(final(recipe), ref_final)]
        right.plot([i] * len(diffs), diffs, "o", color=colours[recipe], ms=7, alpha=0.85)
    right.axhline(0.0, color="#000000", lw=1)
    right.set_xticks(range(len(others)), others, rotation=30, ha="right")
    right.set_ylabel(f"{final_label or 'final loss'} minus {reference}'s\n(same seed; one dot per seed)")
    right.grid(alpha=0.3, axis="y")
    return _finish(fig)


def plot_accumulation(studies) -> Figure:
    """Median relative error (bar up to the max) of K-long dot products against K, per accumulator; one
    panel per study (``{title: AccumulationStudy}``, e.g. one per rounding model). Exact sums (error 0)
    are left out of the log axis."""
    if not isinstance(studies, dict):
        studies = {studies.rounding.replace("_", " "): studies}
    fig, axes = plt.subplots(1, len(studies), figsize=(5.6 * len(studies), 4.4), squeeze=False, sharey=True)
    for ax, (title, study) in zip(axes[0], studies.items()):
        for j, (label, points) in enumerate(study.errors.items()):
            ks = np.array([k for k, p in zip(study.ks, points) if p[0] > 0])
            med = np.array([p[0] for p in points if p[0] > 0])
            top = np.array([p[1] for p in points if p[0] > 0])
            if len(ks):
                ax.errorbar(ks, med, yerr=[np.zeros_like(med), top - med], fmt="o-", color=_recipe_colour(j),
                            capsize=3, lw=1.8, ms=4, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("K, length of the dot product (log2)")
        ax.set_title(f"accumulator rounding: {title}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("relative error of the sum (log)\nline: median, bar: max")
    axes[0][0].legend(fontsize=8)
    return _finish(fig)


def plot_fp8_speedup(estimates: dict, *, measured: dict | None = None) -> Figure:
    """Predicted FP8/BF16 speedup of a linear layer's forward+backward against its size, one line per
    recipe (``estimates``: ``{label: [Fp8LinearEstimate, ...]}``, x axis: M = K = N). ``measured``:
    ``{label: {n: speedup}}`` drawn as markers (recorded GPU matmuls)."""
    fig, ax = plt.subplots(figsize=(8.5, 5))
    styles = ["-", "--", "-."]
    for j, (label, rows) in enumerate(estimates.items()):
        ax.plot([e.m for e in rows], [e.speedup for e in rows], styles[j % 3], color=_fp8_colour(label, j), lw=2,
                label=label)
    for j, (label, points) in enumerate((measured or {}).items()):
        ns = sorted(points)
        ax.plot(ns, [points[n] for n in ns], "s", mfc="none", color="#000000", ms=8, mew=1.5, label=label)
    ax.axhline(1.0, color=TENSOR_COLOUR, lw=1)
    ax.axhline(2.0, color="#777777", lw=1.2, ls=":", label="ratio of dense peaks (FP8 / BF16)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M = K = N (log2)")
    ax.set_ylabel("speedup of FP8 over BF16")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    return _finish(fig)


# ---- lesson 8: microscaling -------------------------------------------------------------------------

# tensors in lesson 8's block-size figure: colours the recipes of its later figures do not use
_TENSOR_COLOURS = {"activation": "#332288", "weight": "#8C6D31", "gradient": "#AA4499"}


def plot_block_sizes(study) -> Figure:
    """Relative error (log) of MX quantisation against block size, one panel per element format of a
    :class:`~course_lib.mx.BlockSizeStudy`; one line per tensor, dashed for a tensor named "... + outlier"."""
    # each panel its own log range: FP8's errors would sit below the lowest labelled tick of FP4's
    fig, axes = plt.subplots(1, len(study.elements), figsize=(5.6 * len(study.elements), 4.4), squeeze=False)
    x = np.arange(len(study.blocks))
    for ax, element in zip(axes[0], study.elements):
        for j, tensor in enumerate(study.tensors):
            base = tensor.split(" +")[0]
            errs = [study.errors[element][tensor][b].relative_error for b in study.blocks]
            ax.plot(x, errs, "o-" if base == tensor else "s--", color=_TENSOR_COLOURS.get(base, _recipe_colour(j)),
                    lw=1.8, ms=5, label=tensor)
        ax.set_xticks(x, ["1 (per element)" if b == "1" else ("whole tensor" if b == "tensor" else b)
                          for b in study.blocks])
        ax.set_yscale("log")
        ax.set_xlabel("elements per E8M0 scale (block along the last dimension)")
        ax.set_title(f"{element.upper()} elements, {study.mode.upper()} scales", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        lo, hi = ax.get_ylim()
        if hi / lo < 10:   # less than a decade: label the values, not just the decades
            ax.yaxis.set_minor_formatter(mticker.FormatStrFormatter("%.3g"))
            ax.yaxis.set_major_formatter(mticker.FormatStrFormatter("%.3g"))
    axes[0][0].set_ylabel("relative error ||q(x) - x|| / ||x|| (log)")
    axes[0][-1].legend(fontsize=8, loc="upper left")
    return _finish(fig)


def plot_gradient_fidelity(result, *, reference: str = "nvfp4") -> Figure:
    """Left: per recipe, the relative error of its gradient of the course model against the exact one (a
    dot per batch, a bar at the mean). Right: the error of the mean of k gradients against k, for the
    ``reference`` recipe (stochastic rounding) and, where present, the same recipe without it
    (``reference + "_no_sr"``), with ``1/sqrt(k)`` from the first point for comparison."""
    if reference not in result.single:
        raise ValueError(f"no recipe named {reference!r}; recipes: {', '.join(result.recipes)}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1.4, 1]})
    colours = {r: _fp8_colour(r, j) for j, r in enumerate(result.recipes)}
    for i, recipe in enumerate(result.recipes):
        errs = np.asarray(result.single[recipe]) * 100
        left.bar(i, errs.mean(), color=colours[recipe], alpha=0.35, width=0.7)
        left.plot([i] * len(errs), errs, "o", color=colours[recipe], ms=6)
    left.set_xticks(range(len(result.recipes)), result.recipes, rotation=30, ha="right")
    left.set_ylabel("gradient error vs exact FP32 (%)\n(dots: batches; bar: mean)")
    left.grid(alpha=0.3, axis="y")
    ks = np.asarray(result.ks)
    for recipe, label in ((reference, f"{reference} (stochastic rounding)"),
                          (reference + "_no_sr", f"{reference}_no_sr (round to nearest)")):
        if recipe in result.averaged:
            right.plot(ks, np.asarray(result.averaged[recipe]) * 100, "o-", color=colours[recipe], lw=1.8,
                       label=label)
    first = result.averaged[reference][0] * 100
    right.plot(ks, first / np.sqrt(ks), ":", color="#777777", label="1/sqrt(k) from the first point")
    right.set_xscale("log", base=2)
    right.set_xticks(ks, [str(k) for k in ks])
    right.set_ylim(bottom=0)
    right.set_xlabel("k, gradients averaged (log2 axis)")
    right.set_ylabel("error of the mean of k gradients (%)")
    right.grid(alpha=0.3)
    right.legend(fontsize=8, loc="lower left")
    return _finish(fig)


# ---- lesson 9: monitoring ----------------------------------------------------------------------------

def plot_recovery(demo) -> Figure:
    """Loss, loss scale and skipped steps against the optimizer step for the run without recovery (grey)
    and with it (colour) of a :class:`~course_lib.monitor.RecoveryDemo`; the fault's start and each rollback
    marked. A rolled-back run steps back along the x axis, so its line doubles back where it rolled back."""
    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(10, 7.4), sharex=True,
                                           gridspec_kw={"height_ratios": [2, 1.4, 0.8]})
    runs = (("FP16 + GradScaler, no recovery", demo.without, "#777777"),
            ("with recovery (rolls back, continues in BF16)", demo.with_recovery, "#0072B2"))
    for j, (label, log, colour) in enumerate(runs):
        steps = np.asarray(log.steps)
        losses = np.asarray(log.losses, dtype=float)
        scales = np.asarray(log.scales, dtype=float)
        shown = np.where(np.isfinite(losses), losses, np.nan)
        # a rollback starts a new segment: the abandoned attempt faded, the run that continued solid
        cuts = [0] + [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]] + [len(steps)]
        for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            last = k == len(cuts) - 2
            kw = dict(color=colour, lw=2.6 if j == 0 else 1.6, ms=3, zorder=2 + j, alpha=1.0 if last else 0.45)
            top.plot(steps[a:b], shown[a:b], "o-", label=label if last else None, **kw)
            mid.plot(steps[a:b], scales[a:b], "o-", **kw)
        bad = steps[~np.isfinite(losses)]
        if len(bad):
            # a non-finite loss has no height: mark it along the top of the panel
            top.plot(bad, np.full(len(bad), 1.0), "x", color=colour, ms=6, mew=1.6,
                     transform=top.get_xaxis_transform(), clip_on=False,
                     label=("no recovery" if j == 0 else "recovery") + ": loss inf/NaN")
        skipped = steps[np.asarray(log.skipped, dtype=bool)]
        bottom.plot(skipped, np.full(len(skipped), j), "|", color=colour, ms=14, mew=2)
    for ax in (top, mid, bottom):
        ax.axvline(demo.fault_at, color=LIMIT_COLOUR, ls="--", lw=1.2)
        ax.grid(alpha=0.3)
    for e in demo.events:
        top.annotate(f"alert at step {e.step}: rolled back to {e.rolled_back_to}, continued in {e.recipe}",
                     xy=(e.step, 0.85), xycoords=top.get_xaxis_transform(), xytext=(8, 0),
                     textcoords="offset points", fontsize=8, va="center")
    top.text(demo.fault_at, top.get_ylim()[0], " fault starts", color=LIMIT_COLOUR, fontsize=8, va="bottom")
    top.set_ylabel("loss\n(x along the top: inf or NaN)")
    top.legend(fontsize=8, loc="lower left")
    mid.set_yscale("log", base=2)
    mid.set_ylabel("loss scale (log2)")
    bottom.set_yticks([0, 1], ["no recovery", "recovery"])
    bottom.set_ylim(-0.6, 1.6)
    bottom.set_ylabel("skipped")
    bottom.set_xlabel("optimizer step")
    return _finish(fig)


def plot_underflow_trend(trend, *, top_n: int = 6) -> Figure:
    """Left: per parameter (the ``top_n`` with the largest share at any point), the share of its gradient
    an unscaled low-precision format would flush to zero, against the step. Right: the loss."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.5, 1]})
    ranked = sorted(trend.flush.items(), key=lambda kv: -max(kv[1]))[:top_n]
    for j, (name, series) in enumerate(ranked):
        left.plot(trend.steps, np.asarray(series) * 100, "o-", color=_recipe_colour(j), lw=1.6, ms=3, label=name)
    left.set_xlabel("optimizer step")
    left.set_ylabel(f"gradient values {trend.fmt} would flush (%)")
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    right.plot(np.arange(len(trend.losses)), trend.losses, color="#000000", lw=1.6)
    right.set_xlabel("optimizer step")
    right.set_ylabel("loss")
    right.grid(alpha=0.3)
    return _finish(fig)


def plot_dashboard(log, alerts=(), *, attribute: str = "zero", top_n: int = 4, mark_step: int | None = None) -> Figure:
    """A monitor's dashboard (a :class:`~course_lib.monitor.MonitorLog`): loss, loss scale and skipped
    steps per step, and per parameter (the ``top_n`` with the largest value at any point) the share of its
    gradient that is ``attribute`` ("zero", "flush", "subnormal") per sampled step; alerts marked where
    raised, and ``mark_step`` (a planted fault's start) as a dashed line."""
    fig, axes = plt.subplots(4, 1, figsize=(10, 8), sharex=True, gridspec_kw={"height_ratios": [1.6, 1, 0.6, 1.6]})
    loss_ax, scale_ax, skip_ax, layer_ax = axes
    steps = np.asarray(log.steps)
    losses = np.asarray(log.losses, dtype=float)
    loss_ax.plot(steps, np.where(np.isfinite(losses), losses, np.nan), color="#000000", lw=1.6)
    loss_ax.set_ylabel("loss")
    scale_ax.plot(steps, log.scales, color="#0072B2", lw=1.6)
    scale_ax.set_yscale("log", base=2)
    scale_ax.set_ylabel("loss scale")
    skipped = steps[np.asarray(log.skipped, dtype=bool)]
    skip_ax.plot(skipped, np.zeros(len(skipped)), "|", color="#D55E00", ms=14, mew=2)
    skip_ax.set_yticks([])
    skip_ax.set_ylabel("skipped")
    series = log.layer_series(attribute)
    ranked = sorted(series.items(), key=lambda kv: -max(kv[1]))[:top_n]
    styles = ["-", "--", "-.", ":"]
    for j, (name, values) in enumerate(ranked):
        # lines that coincide stay visible by their dashes and marker sizes
        layer_ax.plot(log.sampled_steps, np.asarray(values) * 100, marker="o", ls=styles[j % len(styles)],
                      color=_recipe_colour(j), lw=1.6, ms=3 + 1.5 * (len(ranked) - j - 1) / max(1, len(ranked) - 1),
                      label=name)
    layer_ax.set_ylabel(f"gradient values {attribute} (%)")
    layer_ax.set_xlabel("optimizer step")
    layer_ax.legend(fontsize=7, loc="center left")
    for ax in axes:
        ax.grid(alpha=0.3)
        if mark_step is not None:
            ax.axvline(mark_step, color=LIMIT_COLOUR, ls="--", lw=1.2)
    by_step: dict[int, list] = {}
    for a in alerts:
        by_step.setdefault(a.step, []).append(a)
    for step, group in sorted(by_step.items()):
        kinds = sorted({a.kind for a in group})
        text = "alert: " + ", ".join(kinds) + (f" ({len(group)} parameters)" if len(group) > 1 else
                                               f" ({group[0].layer})" if group[0].layer else "")
        layer_ax.annotate(text, xy=(step, 1.0), xycoords=layer_ax.get_xaxis_transform(), xytext=(6, -18),
                          textcoords="offset points", fontsize=7, va="top",
                          bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
        layer_ax.plot([step], [1.0], "v", color=LIMIT_COLOUR, ms=6, transform=layer_ax.get_xaxis_transform(),
                      clip_on=False)
    return _finish(fig)


def plot_reduction_precision(study) -> Figure:
    """Two panels against the number of ranks (log2 axis), one line per reduction of a
    :class:`~course_lib.distributed.ReductionStudy`: the relative L2 error of the reduced mean gradient (log
    scale, with one BF16 rounding of the exact mean as a dashed floor), and the share of entries off by more
    than the study's tolerance."""
    fig, (ax_err, ax_off) = plt.subplots(1, 2, figsize=(11, 5.0))
    n = list(study.world_sizes)
    styles = {"FP32": ("#000000", "-"), "BF16, ring": ("#D55E00", "-"), "BF16, tree": ("#D55E00", "--"),
              "/N first": ("#0072B2", "-"), "sqrt": ("#0072B2", ":")}
    for label in study.errors:
        colour, ls = next(v for k, v in styles.items() if k in label)
        ax_err.plot(n, study.errors[label], marker="o", ms=4, color=colour, ls=ls, label=label)
        ax_off.plot(n, [100 * v for v in study.off_share[label]], marker="o", ms=4, color=colour, ls=ls,
                    label=label)
    ax_err.plot(n, study.floor, color="#999999", ls="--", lw=1, label="exact mean rounded once to BF16")
    ax_err.set_yscale("log")
    ax_err.set_ylabel("relative error of the mean gradient\n(L2, against FP64)")
    ax_off.set_ylabel(f"entries off by more than {100 * study.tolerance:g}% (%)")
    for ax in (ax_err, ax_off):
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(v) for v in n])
        ax.set_xlabel("ranks (N)")
        ax.grid(alpha=0.3)
    ax_err.set_title("Whole gradient")
    ax_off.set_title("Entry by entry (what Adam sees)")
    handles, names = ax_err.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.13, 1, 1))
    plt.close(fig)
    fig.set_dpi(FIGURE_DPI)
    return fig


def plot_rank_scales(study, labels=None) -> Figure:
    """The loss scale per step of every rank, one panel per planted-inf case of a
    :class:`~course_lib.distributed.DataParallelStudy`; a cross marks each step a rank skipped, and a
    shaded column the step the inf was planted at."""
    labels = list(study.scaler_cases) if labels is None else list(labels)
    ncols = min(3, len(labels))
    nrows = -(-len(labels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 3.3 * nrows), sharey=True, squeeze=False)
    colours = ["#0072B2", "#D55E00", "#009E73", "#CC79A7"]
    for ax in axes.flat[len(labels):]:
        ax.set_visible(False)
    for ax, label in zip(axes.flat, labels):
        case = study.scaler_cases[label]
        ax.axvspan(study.plant_step - 0.4, study.plant_step + 0.4, color="#999999", alpha=0.25, lw=0)
        for j, (rank, scales) in enumerate(sorted(case.scales.items())):
            steps = np.arange(len(scales))
            ax.step(steps, scales, where="post", color=colours[j % 4], lw=2.2 - 0.8 * j, label=f"rank {rank}")
            skipped = list(case.skipped[rank])
            ax.plot(skipped, [scales[s] for s in skipped], "x", ms=9, mew=2, color=colours[j % 4])
        ax.set_yscale("log", base=2)
        ax.set_xlabel("step", fontsize=12)
        ax.set_title(label.replace(", ", ",\n", 1), fontsize=12)
        ax.tick_params(labelsize=11)
        ax.grid(alpha=0.3)
        bad = [r for r, ok in case.weights_finite.items() if not ok]
        if bad:
            ax.text(0.03, 0.05, f"rank {', '.join(map(str, bad))}: weights not finite", transform=ax.transAxes,
                    fontsize=11, color="black")
    for row in axes:
        row[0].set_ylabel("loss scale (x: step skipped)", fontsize=12)
    axes[0][0].legend(fontsize=11, loc="lower left")
    return _finish(fig)
