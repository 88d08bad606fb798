"""Figures of lesson 3: survival against the loss scale, gradient fidelity per scale, scale traces."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .style import FORMAT_COLOURS, finish_figure, recipe_colour


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
    return finish_figure(fig)


def plot_scale_fidelity(result) -> Figure:
    """Relative error of each parameter's FP16-autocast gradient against FP32's (log scale), one line per
    loss scale of a :class:`~course_lib.studies.loss_scaling.ScaleFidelity`; a scale whose gradients overflowed is named
    in the legend without a line."""
    fig, ax = plt.subplots(figsize=(10, 4.6))
    x = np.arange(len(result.names))
    for j, sc in enumerate(result.scales):
        label = f"scale 2^{math.log2(sc):g}" if math.log2(sc) == int(math.log2(sc)) else f"scale {sc:g}"
        if result.overflowed[sc]:
            ax.plot([], [], " ", label=f"{label}: gradients overflowed (inf), no error to draw")
            continue
        ax.plot(x, [result.error[sc][n] for n in result.names], marker="o", ms=4, lw=1.4,
                color=recipe_colour(j), label=label)
    ax.set_yscale("log")
    ax.set_xticks(x, result.names, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("relative error of the gradient\n(FP16 autocast against FP32)")
    ax.set_title(f"Each parameter's gradient under each loss scale (after {result.steps} FP32 steps)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return finish_figure(fig)


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
    return finish_figure(fig)
