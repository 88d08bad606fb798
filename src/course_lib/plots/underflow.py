"""Figures of lesson 2: gradient histograms against a format's regions, per layer."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure

from ..formats import get_format
from ..gradients import summarize_underflow
from ..magnitudes import log2_histogram
from .style import LIMIT_COLOUR, finish_figure, quantiles


def _histogram_extent(values, f, loss_scale: float) -> tuple[float, float, float]:
    """(lo, hi) of the log2 axis and the top of the % axis for one set of values."""
    hist = log2_histogram(values.detach().flatten().double() * loss_scale)
    edges, counts = hist.binade_edges, np.asarray(hist.counts, dtype=float)
    nz = np.flatnonzero(counts)
    if not nz.size:
        return -30, 20, 1.0
    return (min(edges[nz[0]] - 2, math.log2(f.min_subnormal) - 4), max(edges[nz[-1]] + 3, math.log2(f.max_finite) + 2),
            max(counts.max() / max(hist.total, 1) * 100 * 1.35, 1.0))


def plot_gradient_histogram(values, fmt="FP16", *, loss_scale: float = 1.0, title: str | None = None,
                            ax=None, share_with=()) -> Figure:
    """Histogram of log2|g| (times ``loss_scale``) with the format's regions shaded and labelled with
    the measured fractions: flushed to zero, subnormal, normal, overflow. Exact zeros are counted apart.
    ``share_with``: other tensors of values (say, another step's) whose figures are to be compared with this
    one: both axes then span them too, so that figures drawn with the same set share their axes."""
    f = get_format(fmt)
    if isinstance(share_with, torch.Tensor) or not all(isinstance(t, torch.Tensor) for t in share_with):
        raise TypeError("share_with must be a sequence of tensors")
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
    extents = [_histogram_extent(t, f, loss_scale) for t in (values, *share_with)]
    lo, hi = min(e[0] for e in extents), max(e[1] for e in extents)
    ymax = max(e[2] for e in extents)
    flush_edge = math.log2(f.min_subnormal / 2)
    normal_lo, top = math.log2(f.min_normal), math.log2(f.max_finite)
    ax.axvspan(lo, flush_edge, color="#D55E00", alpha=0.15, lw=0)
    ax.axvspan(flush_edge, normal_lo, color="#E69F00", alpha=0.18, lw=0)
    ax.axvspan(normal_lo, top, color="#009E73", alpha=0.12, lw=0)
    ax.axvspan(top, hi, color="#CC79A7", alpha=0.18, lw=0)
    if nz.size:
        ax.bar(edges + 0.5, counts / max(hist.total, 1) * 100, width=0.9, color="#333333")
    ax.set_ylim(0, ymax)
    y = ymax * 0.9
    labels = [((lo + flush_edge) / 2, f"flushed to 0\n{summary.flushed:.1%}"),
              ((flush_edge + normal_lo) / 2, f"subnormal\n{summary.subnormal:.1%}"),
              ((normal_lo + min(top, hi)) / 2, f"normal\n{summary.normal:.1%}"),
              ((top + hi) / 2, f"overflow\n{summary.overflow:.1%}")]
    for x, text in labels:
        if lo <= x <= hi:
            # centred on its region, but kept inside the axes where the region is at an edge
            where = (x - lo) / (hi - lo) if hi > lo else 0.5
            ha = "right" if where > 0.9 else "left" if where < 0.1 else "center"
            pad = 0.01 * (hi - lo)
            ax.text(hi - pad if ha == "right" else lo + pad if ha == "left" else x, y, text, ha=ha, va="top",
                    fontsize=8)
    ax.set_xlim(lo, hi)
    ax.set_xlabel(f"log2 |gradient x {loss_scale:g}|" if loss_scale != 1 else "log2 |gradient|")
    ax.set_ylabel("% of values")
    scale_text = f", loss scale {loss_scale:g}" if loss_scale != 1 else ""
    ax.set_title(title or f"Gradients against {f.name}'s regions{scale_text} (exact zeros: {summary.zero:.1%})")
    ax.grid(axis="y", alpha=0.3)
    return finish_figure(fig)


def plot_layer_gradients(capture, fmt="FP16", *, kind: str = "activation", title: str | None = None) -> Figure:
    """Per layer, in backward order, the 1st/50th/99th percentile of |gradient|, with the format's
    smallest normal and subnormal as lines: how gradients shrink going backwards."""
    f = get_format(fmt)
    layers = list(reversed(capture.of_kind(kind)))
    names, p1, p50, p99 = [], [], [], []
    for g in layers:
        v = g.values.abs()
        v = v[v > 0].double()
        q = quantiles(v, (0.01, 0.5, 0.99))
        names.append(g.name)
        p1.append(q[0])
        p50.append(q[1])
        p99.append(q[2])
    fig, ax = plt.subplots(figsize=(8.5, 0.28 * len(names) + 2.2))
    y = np.arange(len(names))
    ax.hlines(y, p1, p99, color="#555555", lw=5)
    ax.plot(p50, y, "o", color="white", mec="black", ms=5, label="median")
    ax.axvline(f.min_normal, color=LIMIT_COLOUR, ls="--", lw=1, label=f"{f.name} smallest normal")
    ax.axvline(f.min_subnormal, color=LIMIT_COLOUR, ls=":", lw=1, label=f"{f.name} smallest subnormal")
    # the flush-to-zero region, shaded as in the histogram: at or below half the smallest subnormal a cast
    # to the format gives 0 (the prose's "flush to zero" shares are read against this edge)
    flush_edge = f.min_subnormal / 2
    left = min(float(np.nanmin(p1)) if names else flush_edge, flush_edge) / 4
    ax.axvspan(left, flush_edge, color="#D55E00", alpha=0.15, lw=0,
               label=f"flushed to 0 in {f.name} (at or below {flush_edge:.3g})")
    # the right edge set too, with room past the widest bar: set_xlim(left=...) alone froze the right edge
    # where the autoscale stood, which cut the top percentile's bar at the frame
    right = max(float(np.nanmax(p99)) if names else f.min_normal, f.min_normal) * 3
    ax.set_xlim(left, right)
    ax.set_yticks(y, names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel(f"|{kind} gradient| (bar: 1st to 99th percentile)")
    ax.set_ylabel("layer (top: the last one)")   # short: a long label outgrew the axes
    ax.set_title(title or f"{kind.capitalize()} gradients layer by layer, going backwards")
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False)   # under the bars, covering none
    ax.grid(axis="x", alpha=0.3)
    return finish_figure(fig)
