"""Figures of lesson 7: scaling recipes' error, the outlier sweep, delayed scaling against a spike, FP8
training, accumulation error and the predicted speed-up."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import FixedLocator, FuncFormatter, LogLocator, NullLocator

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
    fig, (left, right) = plt.subplots(1, 2, figsize=(8.5, 4.2))
    for j, recipe in enumerate(sweep.relative_error):
        style = dict(color=fp8_colour(recipe, j), lw=1.8, ms=4, label=recipe, marker="o", ls=["-", "--"][j % 2])
        left.plot(sweep.factors, np.asarray(sweep.flushed[recipe]) * 100, **style)
        right.plot(sweep.factors, sweep.relative_error[recipe], **style)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel(f"outlier channel {sweep.channel}'s size, x (log)")
        ax.grid(alpha=0.3, which="both")
    left.set_ylabel("other channels' values\nflushed to zero (%)")
    right.set_yscale("log")
    label_log_axis(right.yaxis)
    right.set_ylabel("relative error of\nthe other channels (log)")
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=9, loc="lower center", ncol=3, frameon=False)
    return finish_figure(fig)


def label_log_axis(axis) -> None:
    """Label a log axis at 1, 2 and 5 times each power of ten (plain numbers), so that an axis spanning
    less than two decades still labels its data region, not only one or two powers of ten."""
    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(lambda v, _: ""))


def tick_floor(value: float) -> float:
    """The largest of 1, 2 and 5 times a power of ten at or below ``value`` (> 0): where a log axis labelled
    by :func:`label_log_axis` must start for a label to sit at or below its lowest point."""
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ValueError(f"tick_floor needs a positive finite number, got {value!r}")
    power = 10.0 ** math.floor(math.log10(value))
    return next(s * power for s in (5, 2, 1) if s * power <= value * (1 + 1e-12))


SATURATION_LINEAR_PCT = 0.1   # the spike figure's saturated share: linear up to this percentage, log above


def plot_delayed_spike(run) -> Figure:
    """Three panels over steps: the tensor's amax (log), each recipe's share of saturated values, and each
    recipe's relative error (log)."""
    fig, (top, middle, bottom) = plt.subplots(3, 1, figsize=(8.5, 7), sharex=True,
                                              gridspec_kw={"height_ratios": [1, 1.3, 1.3]})
    steps = np.arange(len(run.amax))
    top.plot(steps, run.amax, "o-", color=TENSOR_COLOUR, ms=3, lw=1.2)
    top.set_yscale("log")
    label_log_axis(top.yaxis)
    top.set_ylabel("amax (log)")
    styles = ["-", "--", ":"]
    for j, recipe in enumerate(run.saturated):
        # the first recipe wide and pale underneath, so that where the others lie on it (0% saturated on
        # every quiet step) it still shows around them
        style = dict(ls=styles[j % 3], marker="o", ms=3, color=fp8_colour(recipe, j), label=recipe,
                     **(dict(lw=5, alpha=0.45, zorder=1) if j == 0 else dict(lw=1.8, zorder=2 + j)))
        middle.plot(steps, np.asarray(run.saturated[recipe]) * 100, **style)
        bottom.plot(steps, run.relative_error[recipe], **style)
    # a log axis above SATURATION_LINEAR_PCT (linear below, so that 0% still draws): a fraction of a percent
    # saturated on a later step lies visibly off zero beside a spike's share near 100%
    middle.set_yscale("symlog", linthresh=SATURATION_LINEAR_PCT, linscale=0.5)
    middle.set_ylim(0, 150)
    middle.yaxis.set_major_locator(FixedLocator([0, SATURATION_LINEAR_PCT, 1, 10, 100]))
    middle.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    middle.yaxis.set_minor_locator(NullLocator())
    middle.set_ylabel(f"values saturated\n(%, log above {SATURATION_LINEAR_PCT:g})")
    bottom.set_ylabel("relative error (log)")
    bottom.set_yscale("log")
    label_log_axis(bottom.yaxis)
    bottom.set_xlabel("step")
    # each log panel starts at a labelled tick, so that the quiet steps' level can be read off the axis
    top.set_ylim(bottom=tick_floor(float(np.min(run.amax))))
    bottom.set_ylim(bottom=tick_floor(min(e for errs in run.relative_error.values() for e in errs if e > 0)))
    middle.legend(fontsize=9, loc="upper right")
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
    fig, axes = plt.subplots(1, len(studies), figsize=(min(8.5, 5.6 * len(studies)), 4.4), squeeze=False,
                             sharey=True)
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
        ax.set_title(f"rounding: {title}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
    axes[0][0].set_ylabel("relative error of the sum (log)\nline: median, bar: max")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=9, loc="lower center", ncol=min(3, len(labels)) or 1, frameon=False)
    return finish_figure(fig)


def plot_fp8_speedup(estimates: dict, *, measured: dict | None = None) -> Figure:
    """Predicted FP8/BF16 speedup of a linear layer's forward+backward against its size, one line per
    recipe (``estimates``: ``{label: [Fp8LinearEstimate, ...]}``, x axis: M = K = N). ``measured``:
    ``{label: {n: speedup}}`` drawn as markers (recorded GPU matmuls)."""
    fig, ax = plt.subplots(figsize=(7, 5.2))
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
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, [label.replace(": ", ":\n", 1) for label in labels], fontsize=10, loc="lower center",
               ncol=2, frameon=False)
    return finish_figure(fig)


def plot_fp8_compiled_speed(speed, *, title: str | None = None) -> Figure:
    """FP8 against BF16 from a :class:`~course_lib.studies.fp8_speed.Fp8CompiledSpeed`, as BF16's time over
    FP8's (above the line at 1, FP8 is faster). Top row, measured on the study's device: each FP8
    implementation per square linear layer (markers of one shape per implementation, nudged apart along x
    so that none hides another) and on the Llama-like block. Bottom row, the roofline's prediction for
    ``speed.predicted_for`` (dashed lines per recipe; black bars for the block): kept apart from the
    measurements, which may come from another device. One legend below the panels."""
    fig = plt.figure(figsize=(8.5, 7.6))
    grid = fig.add_gridspec(2, 2, width_ratios=[2.3, 1])
    left, right = fig.add_subplot(grid[0, 0]), fig.add_subplot(grid[0, 1])
    p_left, p_right = fig.add_subplot(grid[1, 0], sharex=left), fig.add_subplot(grid[1, 1])
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
        p_left.plot(ns, [predicted[n] for n in ns], "--", color=colours[f"torchao {recipe}"], lw=1.8,
                    label=f"{recipe}, predicted")
    block = [k for k in speed.block_s if k != "BF16"]
    for j, name in enumerate(block):
        ratio = speed.block_speedup(name)
        values.append(ratio)
        right.plot([j], [ratio], markers[name], color=colours[name], ms=9, mec="white", mew=1.0)
    recipes = [r for r in speed.predicted_linear if r in speed.predicted_block]
    for j, recipe in enumerate(recipes):
        values.append(speed.predicted_block[recipe])
        p_right.plot([j - 0.25, j + 0.25], [speed.predicted_block[recipe]] * 2,
                     color=colours[f"torchao {recipe}"], lw=2.5)
    for ax in (left, p_left):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(speed.sizes), [str(n) for n in speed.sizes])
        ax.minorticks_off()
        if speed.sizes:
            lo_n, hi_n = min(speed.sizes), max(speed.sizes)
            ax.set_xlim(lo_n / 2 ** 0.3, hi_n * 2 ** 0.3)
        ax.set_ylabel("BF16 time / FP8 time (log)")
    p_left.set_xlabel(f"features in → out, n → n (log2); {speed.tokens} tokens")
    where = speed.device.split(":")[0].upper()
    left.set_title(f"measured on {where}, {speed.mode.split(':')[0]}: linear layers", fontsize=10)
    p_left.set_title(f"predicted for {speed.predicted_for or 'no GPU'}: linear layers", fontsize=10)
    for ax, labels, what in ((right, [b.removeprefix("torchao ") for b in block], "timed"),
                             (p_right, recipes, "predicted")):
        if labels:
            ax.set_xticks(range(len(labels)), labels)
            ax.set_xlim(-0.6, len(labels) - 0.4)
            ax.set_title(f"Llama block, width {speed.block_width}", fontsize=10)
        else:
            ax.text(0.5, 0.5, f"no block {what}", ha="center", va="center", transform=ax.transAxes, fontsize=9)
            ax.set_xticks([])
    p_right.set_xlabel("torchao recipe")
    lo, hi = min(values), max(values)
    for ax in (left, right, p_left, p_right):
        ax.axhline(1.0, color=TENSOR_COLOUR, lw=1)
        ax.set_yscale("log")
        ax.set_ylim(lo / 1.5, hi * 1.5)
        label_log_axis(ax.yaxis)
        ax.grid(alpha=0.3, which="major", axis="y")
    handles, labels = left.get_legend_handles_labels()
    more, more_labels = p_left.get_legend_handles_labels()
    fig.legend(handles + more, labels + more_labels, loc="lower center", ncol=2, fontsize=9, frameon=False)
    fig.suptitle(title or "FP8 against BF16, forward + backward (above 1: FP8 faster)", fontsize=11)
    return finish_figure(fig)


SPEED_MARKERS = ("o", "s", "^", "D", "v")
SPEED_COLOURS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9")
