"""Figures of lesson 7: scaling recipes' error, the outlier sweep, delayed scaling against a spike, FP8
training, accumulation error and the predicted speed-up."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator

from .style import TENSOR_COLOUR, finish_figure, fp8_colour, plot_seeded_runs, recipe_colour
from ..studies.fp8 import FINAL_TAIL


def plot_scaling_lab(lab) -> Figure:
    """Relative error (log scale) of each recipe on each tensor of a :class:`~course_lib.fp8.ScalingLab`,
    one group of bars per tensor; a bar whose values were mostly flushed to zero is hatched and labelled."""
    tensors, recipes = lab.tensors, lab.recipes
    fig, ax = plt.subplots(figsize=(10, 4.8))
    width = 0.8 / len(recipes)
    floor = 1e-3
    for j, recipe in enumerate(recipes):
        colour = fp8_colour(recipe, j)
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
    ax.legend(fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False)
    return finish_figure(fig)


def plot_outlier_sweep(sweep) -> Figure:
    """Two panels against the size of one outlier channel, per recipe: the share of the other channels'
    values flushed to zero, and their relative error."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4))
    for j, recipe in enumerate(sweep.relative_error):
        style = dict(color=fp8_colour(recipe, j), lw=1.8, ms=4, label=recipe, marker="o", ls=["-", "--"][j % 2])
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
    return finish_figure(fig)


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
        style = dict(ls=styles[j % 3], marker="o", ms=3, color=fp8_colour(recipe, j), lw=1.8, label=recipe)
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
    return finish_figure(fig)


def plot_fp8_training(result, *, reference: str = "bf16_autocast", tail: int = FINAL_TAIL) -> Figure:
    """:func:`plot_seeded_runs` of an FP8 (or block-scaled) training result against BF16 autocast."""
    return plot_seeded_runs(result, reference=reference, tail=tail)


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
                ax.errorbar(ks, med, yerr=[np.zeros_like(med), top - med], fmt="o-", color=recipe_colour(j),
                            capsize=3, lw=1.8, ms=4, label=label)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("K, length of the dot product (log2)")
        ax.set_title(f"accumulator rounding: {title}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("relative error of the sum (log)\nline: median, bar: max")
    axes[0][0].legend(fontsize=8)
    return finish_figure(fig)


def plot_fp8_speedup(estimates: dict, *, measured: dict | None = None) -> Figure:
    """Predicted FP8/BF16 speedup of a linear layer's forward+backward against its size, one line per
    recipe (``estimates``: ``{label: [Fp8LinearEstimate, ...]}``, x axis: M = K = N). ``measured``:
    ``{label: {n: speedup}}`` drawn as markers (recorded GPU matmuls)."""
    fig, ax = plt.subplots(figsize=(8.5, 5))
    styles = ["-", "--", "-."]
    for j, (label, rows) in enumerate(estimates.items()):
        ax.plot([e.m for e in rows], [e.speedup for e in rows], styles[j % 3], color=fp8_colour(label, j), lw=2,
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
    ax.legend(fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, frameon=False)
    return finish_figure(fig)


def plot_fp8_compiled_speed(speed, *, title: str | None = None) -> Figure:
    """FP8 against BF16 from a :class:`~course_lib.studies.fp8_speed.Fp8CompiledSpeed`: left, each FP8
    implementation's speed as a multiple of BF16's per square linear layer (markers of one shape per
    implementation, measured, nudged apart along x so that none hides another) beside the roofline's
    prediction per recipe (dashed lines, no markers); right, the same for the Llama-like block (markers
    measured, black lines predicted). One legend below both panels. Above the line at 1, FP8 is faster."""
    fig = plt.figure(figsize=(8.5, 5.8))
    grid = fig.add_gridspec(2, 2, width_ratios=[2.3, 1], height_ratios=[4, 0.85])
    left, right, key = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1]), fig.add_subplot(grid[1, :])
    names = [k for k in speed.linear_s if not k.startswith("BF16")]
    colours = {name: SPEED_COLOURS[j % len(SPEED_COLOURS)] for j, name in enumerate(
        dict.fromkeys([*(f"torchao {r}" for r in speed.predicted_linear), *names, *speed.block_s]))}
    markers = {name: SPEED_MARKERS[j % len(SPEED_MARKERS)] for j, name in enumerate(dict.fromkeys(
        [*names, *speed.block_s]))}
    values = [1.0]
    for j, name in enumerate(names):
        ratios = speed.linear_speedup(name)
        ns = sorted(ratios)
        values += [ratios[n] for n in ns]
        nudge = 2 ** (0.06 * (j - (len(names) - 1) / 2))   # a few percent along the log2 axis
        left.plot([n * nudge for n in ns], [ratios[n] for n in ns], marker=markers[name], color=colours[name],
                  lw=1.5, ms=8, mec="white", mew=1.0, label=f"{name}, measured")
    for recipe, predicted in speed.predicted_linear.items():
        ns = sorted(predicted)
        values += [predicted[n] for n in ns]
        left.plot(ns, [predicted[n] for n in ns], "--", color=colours[f"torchao {recipe}"], lw=1.5,
                  label=f"{recipe}, predicted ({speed.predicted_for})")
    left.set_xscale("log", base=2)
    left.set_xticks(list(speed.sizes), [str(n) for n in speed.sizes])
    left.minorticks_off()
    if speed.sizes:
        lo_n, hi_n = min(speed.sizes), max(speed.sizes)
        left.set_xlim(lo_n / 2 ** 0.3, hi_n * 2 ** 0.3)
    left.set_xlabel(f"features in → out, n → n (log2); {speed.tokens} tokens")
    left.set_ylabel("BF16 time / FP8 time (log)")
    left.set_title("square linear layers", fontsize=10)
    block = [k for k in speed.block_s if k != "BF16"]
    for j, name in enumerate(block):
        ratio = speed.block_speedup(name)
        values.append(ratio)
        right.plot([j], [ratio], markers[name], color=colours[name], ms=9, mec="white", mew=1.0)
        recipe = name.removeprefix("torchao ")
        if recipe in speed.predicted_block:
            values.append(speed.predicted_block[recipe])
            right.plot([j - 0.25, j + 0.25], [speed.predicted_block[recipe]] * 2, color="#000000", lw=2)
    if block:
        right.set_xticks(range(len(block)), [b.removeprefix("torchao ") for b in block])
        right.set_xlim(-0.6, len(block) - 0.4)
        right.set_xlabel("torchao recipe")
        right.set_title(f"Llama block, width {speed.block_width}", fontsize=10)
    else:
        right.text(0.5, 0.5, "no block timed", ha="center", va="center", transform=right.transAxes, fontsize=9)
        right.set_xticks([])
    lo, hi = min(values), max(values)
    for ax in (left, right):
        ax.axhline(1.0, color=TENSOR_COLOUR, lw=1)
        ax.set_yscale("log")
        ax.set_ylim(lo / 1.5, hi * 1.5)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))   # two labelled ticks at least
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
        ax.grid(alpha=0.3, which="major", axis="y")
    right.text(1.02, 1.0, "BF16", transform=right.get_yaxis_transform(), va="center", fontsize=9,
               color=TENSOR_COLOUR)
    handles, labels = left.get_legend_handles_labels()
    if block and speed.predicted_block:
        handles.append(Line2D([], [], color="#000000", lw=2))
        labels.append(f"Llama block, predicted ({speed.predicted_for})")
    key.axis("off")
    key.legend(handles, labels, loc="center", ncol=2, fontsize=9, frameon=False)
    fig.suptitle(title or f"FP8 against BF16, forward + backward: {speed.device.split(':')[0].upper()}, "
                 f"{speed.mode.split(':')[0]} (above 1: FP8 faster)", fontsize=11)
    return finish_figure(fig)


SPEED_MARKERS = ("o", "s", "^", "D", "v")
SPEED_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9")
