"""Figures of lesson 3: survival against the loss scale, gradient fidelity per scale, scale traces; and of
lesson 5: the attention product growing into FP16's limit."""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FormatStrFormatter, FuncFormatter, LogLocator, NullFormatter, NullLocator

from ..glue import power_of_two_text
from .style import FORMAT_COLOURS, finish_figure, recipe_colour


def plot_scale_sweep(sweep, *, marks: dict | None = None) -> Figure:
    """Fractions of non-zero gradients that survive, flush to zero and overflow against the loss scale."""
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    lo, hi = sweep.plateau()
    ax.axvspan(lo, hi, color="#009E73", alpha=0.08, label="within 0.5 points of the best survival")
    # wide, so that where the dashed normal-survival line runs on it the green still shows along both edges
    ax.plot(sweep.scales, np.array(sweep.survive) * 100, color="#009E73", lw=3.5, label="survive (all)")
    ax.plot(sweep.scales, np.array(sweep.survive_normal) * 100, color="#0072B2", lw=1.5, ls="--",
            label="survive as normal numbers (full FP16 precision)")
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
    # tall: the rotated parameter names take most of a short figure's height
    fig, ax = plt.subplots(figsize=(10, 6.4))
    x = np.arange(len(result.names))
    for j, sc in enumerate(result.scales):
        exponent = math.log2(sc)   # superscripts, as the lesson's prose writes a scale (2⁰, 2¹⁶)
        label = f"scale {power_of_two_text(int(exponent))}" if exponent == int(exponent) else f"scale {sc:g}"
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
    # under the axes and their tick labels: inside, it covered the unscaled line's largest errors
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=9, loc="lower center", ncol=2 if len(labels) == 4 else 3,
               frameon=False)   # four entries: two rows of two, not three and one
    return finish_figure(fig)


def scale_tick_exponents(runs, *, most: int = 8) -> list[int]:
    """Powers of two for a scale axis over ``runs`` (sequences of loss scales): every ``step``-th exponent
    counted from the first run's starting scale (so that the scale a run starts at is labelled), the smallest
    step of 1, 2, 4, ... that keeps at most ``most`` ticks over the runs' range."""
    if isinstance(most, bool) or not isinstance(most, int) or most < 2:
        raise ValueError(f"most must be an int of at least 2 ticks, got {most!r}")
    runs = [list(r) for r in runs]
    values = [v for r in runs for v in r if v > 0 and math.isfinite(v)]
    if not values:
        raise ValueError("the runs hold no positive finite scale")
    lo, hi = math.floor(math.log2(min(values))), math.ceil(math.log2(max(values)))
    first = runs[0]
    anchor = round(math.log2(first[0])) if first and first[0] > 0 and math.isfinite(first[0]) else hi
    step = 1
    while (hi - lo) // step + 1 > most:
        step *= 2
    return [e for e in range(anchor - step * ((anchor - lo) // step), hi + 1, step)]


def plot_scale_traces(traces: dict, *, title: str = "Loss scale per step") -> Figure:
    """Scale per step (log2 axis) for one or more :class:`~course_lib.scaling.ScaleTrace`, skipped steps
    marked with crosses."""
    fig, ax = plt.subplots(figsize=(8.5, 4))
    markers = ["o", "x", "+", "^", "s"]
    handles = []
    for i, (label, trace) in enumerate(traces.items()):
        colour = FORMAT_COLOURS[(i + 2) % len(FORMAT_COLOURS)]
        steps = np.arange(len(trace.scales))
        # the first trace is drawn wide and underneath, so traces that coincide with it stay visible on top
        line: dict[str, Any] = dict(color=colour, lw=5 if i == 0 else 1.5, alpha=0.45 if i == 0 else 1.0,
                                    ls="-" if i < 2 else "--")
        ax.step(steps, trace.scales, where="post", zorder=1 if i == 0 else 2 + i, **line)
        skipped = np.flatnonzero(trace.skipped)
        # skipped steps' markers on top of every line: drawn after all of them (zorder), opaque
        # smaller marks where skips crowd (a long run's collapse), so that single ones stay apart
        crowded = len(skipped) > 40
        marker: dict[str, Any] = dict(marker=markers[i % len(markers)], ms=(11 if i == 0 else 7) * (0.5 if crowded else 1),
                                      mfc="none" if i == 0 else colour, mec=colour, mew=1.2 if crowded else 1.8)
        ax.plot(skipped, np.array(trace.scales)[skipped], ls="none", zorder=10 + i, **marker)
        # the legend shows each trace's line with its skip marker, so a marker can be told by its legend entry
        handles.append(Line2D([], [], label=f"{label} ({trace.n_skipped} skipped)", **line, **marker))
    ax.set_yscale("log", base=2)
    ax.set_yticks([2.0**e for e in scale_tick_exponents([t.scales for t in traces.values()])])
    ax.yaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("training step")
    ax.set_ylabel("loss scale (log2 axis)")
    ax.set_title(title + " (markers: skipped steps)")
    # under the axes: inside, a long run's legend reached the falling scale's markers
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    ax.grid(alpha=0.3)
    return finish_figure(fig)


def plot_clipping_runs(runs, rules=None, *, reference: str | None = None) -> Figure:
    """Left: training loss per step of each rule of a :class:`~course_lib.studies.clipping.SpikyRuns`
    (mean over seeds as a line, range as a band, log axis), the outlier batches' own losses left out and
    their steps drawn as thin vertical lines; a triangle marks each spike that reached the optimizer in
    every seed of that rule. Right: each seed's final held-out loss per rule (one dot per seed), with the
    ``reference`` rule's range as a grey band (named in the panel's title)."""
    rules = list(runs.rules if rules is None else rules)
    unknown = [r for r in rules if r not in runs.rules] + ([reference] if reference not in (None, *runs.rules) else [])
    if unknown or not rules:
        raise ValueError(f"rules must be a non-empty selection of {', '.join(runs.rules)}; unknown: {unknown}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.8), gridspec_kw={"width_ratios": [1.5, 1]})
    # Okabe-Ito, without the yellow that thin lines and dots lose on white; by position, so that a rule keeps
    # its colour in a figure of the first few rules
    palette = ["#0072B2", "#CC79A7", "#E69F00", "#56B4E9", "#009E73", "#882255", "#D55E00"]
    colours = {r: ("#777777" if r == reference else palette[j % len(palette)]) for j, r in enumerate(rules)}
    for s in runs.spike_steps:
        left.axvline(s, color="#BBBBBB", lw=0.8, zorder=0)
    left.plot([], [], color="#BBBBBB", lw=0.8, label=f"outlier batch (targets x{runs.spike_factor:g})")
    for j, rule in enumerate(rules):
        curves = np.array(runs.losses[rule], dtype=float)
        curves[:, [s for s in runs.spike_steps if s < curves.shape[1]]] = np.nan   # the outlier's own loss
        x = np.arange(curves.shape[1])
        mean = curves.mean(axis=0)   # NaN at the spike steps: gaps in the line
        # the reference is drawn wide and underneath, so a rule that matches it stays visible on top
        left.plot(x, mean, color=colours[rule], lw=4.5 if rule == reference else 1.6,
                  alpha=0.6 if rule == reference else 1.0, zorder=1 if rule == reference else 2 + j,
                  ls="-" if j % 2 == 0 or rule == reference else "--", label=rule)
        left.fill_between(x, curves.min(axis=0), curves.max(axis=0), color=colours[rule],
                          alpha=0.15, lw=0)
        passed = [s for s in runs.spike_steps
                  if all(s in runs.passed_spikes(rule, i) for i in range(len(runs.seeds)))]
        if rule != reference and passed:
            marks = [s + 1 for s in passed if s + 1 < len(mean)]
            left.plot(marks, mean[marks], "v", color=colours[rule], ms=8, mec="#000000", mew=0.6)
    left.plot([], [], "v", color="#FFFFFF", mec="#000000", ms=8, label="after a spike that was stepped on")
    left.set_yscale("log")
    left.set_xlabel("training step")
    left.set_ylabel("training loss (MSE)")
    left.set_title("Loss per step (line: mean over seeds; band: range)", fontsize=10)
    left.grid(alpha=0.3)
    # under the panels, in type as large as the axes', so that it stays legible at page width
    fig.legend(*left.get_legend_handles_labels(), fontsize=10, loc="lower center", ncol=3, frameon=False)
    if reference is not None:
        ref = runs.finals[reference]
        right.axvspan(min(ref), max(ref), color="#777777", alpha=0.2, lw=0)
    for i, rule in enumerate(rules):
        finals = runs.finals[rule]
        # each seed a little lower than the one before, so that seeds with equal losses stay apart
        offsets = (np.arange(len(finals)) - (len(finals) - 1) / 2) * min(0.12, 0.5 / max(1, len(finals)))
        right.plot(finals, i + offsets, "o", color=colours[rule], ms=7, alpha=0.85)
    right.set_yticks(range(len(rules)), rules)
    right.set_ylim(len(rules) - 0.5, -0.5)   # first rule on top, as in the legend
    right.set_xscale("log")
    every = [v for r in rules for v in runs.finals[r] if math.isfinite(v)]
    if every:   # a margin wide enough to hold a labelled tick on each side
        right.set_xlim(min(every) / 1.3, max(every) * 1.3)
    right.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    right.xaxis.set_major_formatter(FormatStrFormatter("%g"))
    right.xaxis.set_minor_formatter(NullFormatter())
    right.set_xlabel("held-out loss after training (MSE)")
    band = f"\ngrey band: range of the {reference} runs" if reference is not None else ""
    right.set_title(f"After training (one dot per seed){band}", fontsize=10)
    right.grid(alpha=0.3, axis="x")
    return finish_figure(fig)


def plot_qk_growth(divergence) -> Figure:
    """The largest attention product ``|q . k|`` before the scale (the largest over layers) against the step,
    one line per run of a :class:`~course_lib.studies.fp16_divergence.Fp16Divergence` (colour: seed; solid:
    attention written out, dashed: any other kind), FP16's largest value as a line, and a cross where a
    run's loss turned non-finite, on a log axis. Narrow (6 inches) with one legend column: the book scales a figure to its
    column (about 672 px), where a 10-point label reads about 15 px tall."""
    fp16_max = float(np.finfo(np.float16).max)
    fig, ax = plt.subplots(figsize=(6.0, 5.6))
    seeds = sorted({run.seed for run in divergence.runs})
    styles = {"explicit": "-", "scaled_first": "-.", "sdpa": "--"}
    names = {"explicit": "written out", "scaled_first": "q scaled first", "sdpa": "fused (SDPA)"}
    for run in divergence.runs:
        peak = np.array(run.peaks(), dtype=float)
        colour = recipe_colour(seeds.index(run.seed))
        ax.plot(run.probe_steps, peak, color=colour, ls=styles[run.attention], lw=2,
                label=f"seed {run.seed}, {names[run.attention]}"
                      + ("" if run.first_nonfinite is None else f": loss not finite at step {run.first_nonfinite}"))
        if run.first_nonfinite is not None and len(peak) and np.isfinite(peak[-1]):
            ax.plot([run.first_nonfinite], [peak[-1]], "X", color=colour, ms=10, mec="#000000", mew=0.8,
                    alpha=0.9)
    ax.axhline(fp16_max, color="#000000", lw=1.2, label=f"FP16's largest value, {fp16_max:,.0f}")
    # a log axis: the products grow by orders of magnitude, and a run past FP16's range (a fused one can reach
    # several times it) would otherwise squash the written-out runs below the line
    ax.set_yscale("log")
    peaks = [p for run in divergence.runs for p in run.peaks() if np.isfinite(p) and p > 0]
    later = [p for run in divergence.runs for p in run.peaks()[1:] if np.isfinite(p) and p > 0]
    # from half the smallest product after the first probe: step 0's untrained products sit far below the rest
    ax.set_ylim(min(later or peaks or [fp16_max]) / 2, max([fp16_max, *peaks]) * 4)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    ax.tick_params(labelsize=10)
    ax.set_xlabel("training step", fontsize=11)
    ax.set_ylabel("largest |q . k| before the 1/sqrt(d) scale", fontsize=11)
    ax.set_title(f"Attention products (learning rate {divergence.lr:g})", fontsize=11)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=10, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=1, frameon=False)
    return finish_figure(fig)
