"""Figures of lesson 6: matmul throughput, the roofline, training throughput, loss against time, memory."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
from matplotlib.transforms import offset_copy

from ..bench import attainable_tflops
from ..studies.performance import TARGET_WINDOW
from .style import FORMAT_COLOURS, finish_figure

_DTYPE_COLOURS = {"fp32": "#000000", "tf32": "#999999", "bf16": "#0072B2", "fp16": "#D55E00", "fp8": "#CC79A7"}
# a roofline's devices: hues no dtype of this lesson's figures uses, so that a ceiling is not read as a dtype
_DEVICE_COLOURS = ("#009E73", "#882255", "#999933", "#44AA99")


_DTYPE_NAMES = {"fp32": "FP32 (TF32 off)", "tf32": "TF32", "bf16": "BF16", "fp16": "FP16", "fp8": "FP8 E4M3"}


MISALIGNED_NUDGE = (0.15, 0.08)   # log2 units: the first dtype's offset to the left, then each next one's step


def misaligned_x(n: int, index: int) -> float:
    """Where the throughput figure draws the misaligned size ``n`` (n - 1 of an aligned size) for the
    ``index``-th dtype of its panel: to the left of ``n + 1`` by 0.15 log2 units plus 0.08 per dtype, so that
    no hollow marker sits on a filled one (the aligned sizes, a factor 2 apart) nor on another dtype's hollow
    marker, whatever the throughputs."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 8:
        raise ValueError(f"index must be an int from 0 to 7, got {index!r}")
    if n < 1:
        raise ValueError(f"n must be positive, got {n!r}")
    first, step = MISALIGNED_NUDGE
    return (n + 1) * 2 ** -(first + step * index)


def plot_matmul_throughput(panels: dict, *, peaks: dict | None = None) -> Figure:
    """Square-matmul throughput against size, one line per dtype, one panel per device.

    ``panels``: ``{title: {dtype: {n: TFLOP/s}}}``. Sizes that are not a multiple of 8 (misaligned) are
    drawn as hollow markers off the line. ``peaks``: ``{title: {dtype: TFLOP/s}}`` drawn as dashed lines.
    """
    if not panels:
        raise ValueError("nothing to plot: panels is empty")
    fig, axes = plt.subplots(1, len(panels), figsize=(8.5 if len(panels) == 1 else 11, 5.4), squeeze=False)
    for ax, (title, by_dtype) in zip(axes[0], panels.items()):
        # dtypes that share a peak (BF16 and FP16) draw it in turns, dash by dash, so each shows its colour
        here = {d: p for d in by_dtype if (p := (peaks or {}).get(title, {}).get(d))}
        sharing = {d: [e for e in here if here[e] == here[d]] for d in here}
        for j, (dtype, points) in enumerate(by_dtype.items()):
            colour = _DTYPE_COLOURS.get(dtype, "#555555")
            aligned = sorted((n, t) for n, t in points.items() if n % 8 == 0)
            odd = sorted((misaligned_x(n, j), t) for n, t in points.items() if n % 8)
            if aligned:
                ax.plot(*zip(*aligned), "o-", color=colour, lw=1.8, ms=4, label=_DTYPE_NAMES.get(dtype, dtype))
            if odd:
                ax.plot(*zip(*odd), "o", mfc="none", color=colour, ms=7, mew=1.5)
            if dtype in here:
                m, i = len(sharing[dtype]), sharing[dtype].index(dtype)
                ax.axhline(here[dtype], color=colour, lw=1, ls="--" if m == 1 else (4 * i, (4, 4 * (m - 1))))
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
        # two columns: three ran into the neighbouring panel's legend
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=2, frameon=False)
    return finish_figure(fig)


def plot_roofline(ops, ceilings: dict) -> Figure:
    """Roofline: attainable TFLOP/s against arithmetic intensity (FLOPs per byte) for each ceiling
    ``{label: (peak TFLOP/s, bandwidth GB/s)}``, with each operation (an ``OpCost``) placed at its
    intensity on the first ceiling's roof."""
    if not ceilings:
        raise ValueError("give at least one ceiling")
    fig, ax = plt.subplots(figsize=(8.5, 5))
    ai = np.logspace(-1, 4, 200)
    for i, (label, (peak, bw)) in enumerate(ceilings.items()):
        colour = _DEVICE_COLOURS[i % len(_DEVICE_COLOURS)]
        ax.plot(ai, [attainable_tflops(a, peak, bw) for a in ai], color=colour, lw=2,
                label=f"{label}: ridge {peak * 1e3 / bw:.0f} FLOP/B")
    first_peak, first_bw = next(iter(ceilings.values()))
    ridge = first_peak * 1e3 / first_bw
    # operations within 25% of each other's intensity share one label: closer, two labels overprint on the
    # log axis (283 and 302 FLOP/B did)
    groups: list[list] = []
    for op in sorted(ops, key=lambda o: o.intensity):
        same_side = bool(groups) and (op.intensity >= ridge) == (groups[-1][0].intensity >= ridge)
        if groups and same_side and op.intensity <= groups[-1][0].intensity * 1.25:
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
    keys = [f"{i + 1}: " + " / ".join(o.name for o in g) + (" (compute)" if g[0].intensity >= ridge else " (memory)")
            for i, g in enumerate(groups)]
    ax.plot([], [], "o", color="#000000", label="below the ridge: memory-bound")
    ax.plot([], [], "s", color="#000000", label="above the ridge: compute-bound")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOPs per byte moved, log scale)")
    ax.set_ylabel("attainable TFLOP/s (log scale)")
    ax.set_title("Roofline: the course model's operations (points on the first ceiling)", fontsize=10)
    ax.grid(alpha=0.3, which="both")
    # under the axes, ceilings and marks in the left column and the numbered operations in the right: inside
    # the axes the key covered a slow device's roof, and in the upper left an operation's mark
    handles, labels = ax.get_legend_handles_labels()
    blank = Line2D([], [], ls="none")   # no line sample: a padding row, or a key entry (its number says it all)
    rows = max(len(handles), len(keys))
    handles += [blank] * (rows - len(handles) + len(keys))
    labels += [""] * (rows - len(labels)) + keys
    fig.set_figheight(5 + 0.2 * rows)
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=2, frameon=False, handlelength=1.5)
    return finish_figure(fig)


def plot_throughput(panels: dict) -> Figure:
    """Tokens per second per recipe (median over seeds, bar) with the seeds' range (error bar); one panel
    per device. ``panels``: ``{title: [row, ...]}`` with rows as :meth:`ThroughputStudy.table` gives.
    Panels are stacked, each as tall as its rows need, so that the labels stay legible at page width."""
    heights = [max(2, len(rows)) for rows in panels.values()]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.5, 1.2 + 0.45 * sum(heights)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (title, rows) in zip(axes[:, 0], panels.items()):
        labels = [r["recipe"] + (" + compile" if r["compiled"] else "") for r in rows]
        values = np.array([r["tokens_per_s"] / 1e3 for r in rows])
        if all("tokens_per_s_range" in r for r in rows):
            lo = np.array([r["tokens_per_s_range"][0] / 1e3 for r in rows])
            hi = np.array([r["tokens_per_s_range"][1] / 1e3 for r in rows])
        else:  # rows recorded before the table carried a tokens/s range: derive it from the step times
            lo = np.array([v * r["step_ms"] / r["step_ms_range"][1] for v, r in zip(values, rows)])
            hi = np.array([v * r["step_ms"] / r["step_ms_range"][0] for v, r in zip(values, rows)])
        # each recipe in its dtype's colour, as in the matmul and time-to-target figures, light enough that the
        # black whiskers show across it; a compiled run hatched
        y = np.arange(len(rows))
        bars = ax.barh(y, values, color=[_DTYPE_COLOURS.get(r["recipe"].split("_")[0], "#999999") for r in rows],
                       alpha=0.55, edgecolor="#000000", linewidth=0.6)
        for bar, r in zip(bars, rows):
            bar.set_hatch("///" if r["compiled"] else "")
        # the seeds' range where there is one: a row of one seed (the compiled runs) has none to draw; a median
        # of an even number of seeds need not lie inside the range by more than rounding
        ranged = np.array([r.get("seeds", 2) > 1 for r in rows], dtype=bool)
        if ranged.any():
            ax.errorbar(values[ranged], y[ranged], fmt="none", ecolor="#000000", capsize=3, elinewidth=1,
                        xerr=[np.clip(values - lo, 0, None)[ranged], np.clip(hi - values, 0, None)[ranged]])
        ax.set_yticks(y, [f"{label} (1 seed)" if not one else label for label, one in zip(labels, ranged)],
                      fontsize=10)
        ax.invert_yaxis()
        ax.set_xlabel("thousand tokens/s (median; whiskers: range over seeds)"
                      + ("\nhatched: with torch.compile" if any(r["compiled"] for r in rows) else ""))
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="x")
    return finish_figure(fig)


TICK_POINTS = 9   # the length of a time-to-target tick, and the step between recipes' ticks (points)


def plot_loss_against_time(panels: dict, *, target: dict | None = None, times: dict | None = None,
                           window: int = TARGET_WINDOW) -> Figure:
    """Training loss against wall-clock seconds, one line per run, coloured by recipe; one panel per
    device. ``panels``: ``{title: {recipe: [(seconds, losses), ...]}}``; ``target``: ``{title: loss}``
    drawn as a horizontal line; ``times``: ``{title: {recipe: [seconds or None per run]}}``, each run's time to
    the target, marked on the target line. Each curve is the mean of the last ``window`` steps' losses, the
    measure :meth:`~course_lib.studies.performance.RecipeRun.seconds_to_loss` uses with the same ``window``
    (both default to :data:`~course_lib.studies.performance.TARGET_WINDOW`), so a run's tick sits where its
    curve first reaches the line."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    # panels one above the other, each the column's full width: side by side, each legend covered a panel's
    # curves or, below the axes, ran into the other panel's legend
    fig, axes = plt.subplots(len(panels), 1, figsize=(8.5, 4.2 * len(panels)), squeeze=False)
    recipes = list(dict.fromkeys(r for by_recipe in panels.values() for r in by_recipe))
    # one colour per recipe in every panel: its dtype's, as in the matmul figure (FP32 black, TF32 grey, BF16
    # blue, FP16 vermillion), and its own dash, since seeds of recipes that run alike overlap
    dashes = ["-", "--", "-.", ":"]
    styles = {r: (_DTYPE_COLOURS.get(r.split("_")[0], FORMAT_COLOURS[(i + 2) % len(FORMAT_COLOURS)]),
                  dashes[i % len(dashes)]) for i, r in enumerate(recipes)}
    for ax, (title, by_recipe) in zip(axes[:, 0], panels.items()):
        for recipe, runs in by_recipe.items():
            colour, ls = styles[recipe]
            for j, (seconds, losses) in enumerate(runs):
                # the trailing mean the time to the target is measured on, from the first full window
                w = min(window, len(losses))
                smooth = np.convolve(np.asarray(losses, float), np.ones(w) / w, mode="valid")
                ax.plot(np.cumsum(seconds)[w - 1:], smooth, color=colour, ls=ls, lw=1.2, alpha=0.85,
                        label=f"{recipe} ({len(runs)} seeds)" if j == 0 else None)
            reached = [t for t in ((times or {}).get(title, {}).get(recipe) or []) if t is not None]
            if reached and target and title in target:
                # each recipe's ticks at their own height about the line (TICK_POINTS apart, a tick's length),
                # so that runs of different recipes that reach the target together stay visible
                shift = TICK_POINTS * (recipes.index(recipe) - (len(recipes) - 1) / 2)
                ax.plot(reached, [target[title]] * len(reached), "|", color=colour, ms=TICK_POINTS, mew=2.2,
                        zorder=4, transform=offset_copy(ax.transData, fig=fig, y=shift, units="points"))
        if target and title in target:
            ax.axhline(target[title], color="#555555", ls="-", lw=0.8, zorder=0, label="target loss")
            if times and title in times:
                ax.plot([], [], "|", color="#555555", ms=10, mew=2, label="time to target (each run)")
        ax.set_xlabel("wall-clock seconds")
        ax.xaxis.set_major_locator(MaxNLocator(5))   # "0.000 0.025 ..." ran into each other on a fast run
        ax.set_ylabel(f"training loss\n(mean of the last {window} steps)")
        ax.set_title(title, fontsize=10)
        # upper right: the curves fall from the upper left, and a full-width panel leaves that corner empty
        ax.legend(fontsize=8, loc="upper right")
        ax.grid(alpha=0.3)
    return finish_figure(fig)


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
    return finish_figure(fig)


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
    return finish_figure(fig)


_LADDER_COLOURS = {"fp32": "#000000", "tf32": "#999999", "bf16_autocast": "#0072B2", "fp16_autocast_scaler": "#D55E00",
                   "fp8_tensorwise": "#CC79A7", "fp8_rowwise": "#009E73"}
_LADDER_LABELS = {"fp32": "FP32", "tf32": "TF32", "bf16_autocast": "BF16 autocast", "fp16_autocast_scaler": "FP16 autocast",
                  "fp8_tensorwise": "FP8 tensorwise", "fp8_rowwise": "FP8 rowwise"}


# the dash of each recipe's predicted line in the ladder figure (none solid: solid is nothing here)
_PREDICTED_DASHES = [(0, (5, 2)), (0, (1.5, 1.5)), (0, (7, 2, 1.5, 2)), (0, (3, 1)), (0, (9, 2, 1.5, 2, 1.5, 2)),
                     (0, (2, 3))]


def plot_scale_ladder(ladder, *, devices=None) -> Figure:
    """Tokens per second (top) and MFU (bottom) against parameters, log axes, one column per device of the
    ladder's predictions (``devices``: a subset, in order). Lines: the roofline's prediction per recipe
    (dashed, each recipe its own dash; a bound without launch overhead); filled markers: measured runs (circles eager, squares
    compiled), drawn only in the column of the device that measured them. ``ladder``: a ``ScaleLadder``."""
    devices = list(devices) if devices is not None else ladder.predicted_devices()
    if not devices:
        raise ValueError("the ladder has no predictions to draw")
    unknown = [d for d in devices if d not in ladder.predicted_devices()]
    if unknown:
        raise ValueError(f"no predictions for {unknown}; the ladder predicts {ladder.predicted_devices()}")
    fig, axes = plt.subplots(2, len(devices), figsize=(8.5 if len(devices) == 1 else 11, 8.5), squeeze=False,
                             sharex=True)
    params = {r.name: r.n_params for r in ladder.rungs}
    for col, device in enumerate(devices):
        top, bottom = axes[0][col], axes[1][col]
        predicted = {recipe: sorted((params[p.rung], p.tokens_per_second, p.mfu) for p in ladder.predictions
                                    if p.device == device and p.recipe == recipe) for recipe in _LADDER_COLOURS}
        # recipes the roofline cannot tell apart (BF16 and FP16 share a peak on most GPUs, and it knows no FP8
        # scaling granularity) get one line, named for all of them, instead of lines hidden under each other
        same: dict[tuple, list[str]] = {}
        for recipe in _LADDER_COLOURS:
            if predicted[recipe]:
                same.setdefault(tuple(predicted[recipe]), []).append(recipe)
        for j, (recipe, colour) in enumerate(_LADDER_COLOURS.items()):
            preds = predicted[recipe]
            if preds and same[tuple(preds)][0] == recipe:
                xs, rates, mfus = zip(*preds)
                label = " and ".join(_LADDER_LABELS[r] for r in same[tuple(preds)])
                # each recipe its own dash, earlier ones wider: predictions that nearly agree (FP32 and FP16 on a
                # CPU) run along each other and both stay visible
                style = dict(color=colour, ls=_PREDICTED_DASHES[j % len(_PREDICTED_DASHES)], lw=2.2 - 0.25 * j)
                top.plot(xs, rates, label=f"{label} (predicted)", **style)
                bottom.plot(xs, [100 * m for m in mfus], **style)
            if device != ladder.own_prediction_device:
                continue
            # measured marks of one rung sit side by side (a few percent apart along the log axis), so that
            # equal speeds do not hide one recipe's mark under another's
            shift = 1.12 ** (j - (len(_LADDER_COLOURS) - 1) / 2)
            for compiled, marker in ((False, "o"), (True, "s")):
                runs = [r for r in ladder.runs if r.recipe == recipe and r.compiled == compiled]
                if runs:
                    marks = [params[r.rung] * shift for r in runs]
                    top.plot(marks, [ladder.tokens_per_second(r) for r in runs], marker, color=colour, ms=7,
                             mec="white", mew=0.8,
                             label=f"{_LADDER_LABELS[recipe]}, {'compiled' if compiled else 'eager'} (measured)")
                    bottom.plot(marks, [100 * ladder.mfu(r) for r in runs], marker, color=colour, ms=7, mec="white",
                                mew=0.8)
        kind = "measured here and predicted" if device == ladder.own_prediction_device else "predicted only"
        top.set_title(f"{device}\n({kind})", fontsize=10)
        top.set_ylabel("tokens/s")
        # short: a long label ran past the panel into the top panel's label and the figure's edge
        bottom.set_ylabel("MFU (%)")
        bottom.set_xlabel("parameters (log)")
        for ax in (top, bottom):
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(alpha=0.3, which="both")
        # MFU may span less than a decade: label 1, 2 and 5 of each decade, so at least two ticks carry numbers
        bottom.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        bottom.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        handles, labels = top.get_legend_handles_labels()
        # one entry per row: two columns of long entries ran into the other column's legend
        # long line samples (handlelength), so that the recipes' dash patterns can be told apart in the legend
        bottom.legend(handles, labels, fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=1,
                      frameon=False, title=f"{device}:", title_fontsize=9, handlelength=4)
    fig.align_ylabels(axes[:, 0])
    return finish_figure(fig)
