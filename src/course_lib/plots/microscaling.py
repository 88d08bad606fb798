"""Figures of lesson 8: error against block size, and the NVFP4 recipe's pieces on the gradient."""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
from matplotlib.figure import Figure

from .style import COLUMN_INCHES, finish_figure, fp8_colour, recipe_colour

# tensors in lesson 8's block-size figure: colours the recipes of its later figures do not use
_TENSOR_COLOURS = {"activation": "#332288", "weight": "#8C6D31", "gradient": "#AA4499"}


class _PercentTicks(mticker.Formatter):
    """Fractions as percentages, every tick of an axis with the same decimals: the fewest that write each tick
    in view exactly (2.60% beside 2.63%, not 2.6%), at most six."""

    ticks: tuple[float, ...] = ()

    def set_locs(self, locs):
        self.ticks = tuple(locs)

    def __call__(self, x, pos=None):
        lo, hi = sorted(self.axis.get_view_interval()) if self.axis is not None else (x, x)
        shown = [100 * v for v in self.ticks if lo <= v <= hi] or [100 * x]
        d = next((d for d in range(6) if all(abs(round(v, d) - v) <= 1e-9 * max(1.0, abs(v)) for v in shown)), 6)
        return f"{100 * x:.{d}f}%"


def plot_block_sizes(study) -> Figure:
    """Relative error (percent; a log axis where a panel's errors span a factor of two or more, else linear)
    of MX quantisation against block size, one panel per element format of a
    :class:`~course_lib.studies.microscaling.BlockSizeStudy`; one line per tensor, dashed for a tensor named "... + outlier"."""
    # each panel its own log range: FP8's errors would sit below the lowest labelled tick of FP4's
    fig, axes = plt.subplots(1, len(study.elements), figsize=(min(COLUMN_INCHES, 4.3 * len(study.elements)), 4.6),
                             squeeze=False)
    x = np.arange(len(study.blocks))
    for ax, element in zip(axes[0], study.elements):
        for j, tensor in enumerate(study.tensors):
            base = tensor.split(" +")[0]
            errs = [study.errors[element][tensor][b].relative_error for b in study.blocks]
            # the dashed line drawn last, open and larger: where it lies on its tensor's solid line, both show
            plain = base == tensor
            ax.plot(x, errs, "o-" if plain else "s--", color=_TENSOR_COLOURS.get(base, recipe_colour(j)),
                    lw=1.8 if plain else 1.4, ms=5 if plain else 10, mfc=None if plain else "none",
                    mew=1.5, label=tensor, zorder=2 if plain else 3)
        ax.set_xticks(x, ["1\n(per\nelement)" if b == "1" else ("whole\ntensor" if b == "tensor" else b)
                          for b in study.blocks])
        ax.set_xlim(-0.5, len(study.blocks) - 0.5)   # room for the outer ticks' labels inside the panel
        ax.set_xlabel("elements per E8M0 scale\n(categories, evenly spaced)")   # two lines: panels side by side
        ax.set_title(f"{element.upper()} elements, {study.mode.upper()} scales", fontsize=10)
        values = [e.relative_error for t in study.tensors for e in study.errors[element][t].values()]
        # a log axis only where the errors span a factor of two or more; ticks at 1, 1.5, 2, 3, 5 and 7 per
        # decade, in percent, so that every line's level reads off the axis
        logy = min(values) > 0 and max(values) / min(values) >= 2
        if logy:
            ax.set_yscale("log")
            ax.yaxis.set_major_locator(mticker.LogLocator(subs=(1.0, 1.5, 2.0, 3.0, 5.0, 7.0)))
            ax.yaxis.set_minor_formatter(mticker.NullFormatter())
        ax.yaxis.set_major_formatter(_PercentTicks())
        ax.set_ylabel("relative error ||q(x) - x|| / ||x||\n" + ("(%, log axis)" if logy else "(%, linear axis)"))
        ax.grid(alpha=0.3, which="both")
    # one legend for both panels (a tensor has the same colour and line in each), under them: inside a
    # panel it covered lines
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    return finish_figure(fig)


# one marker per model seed in the gradient-fidelity figure (repeats after four seeds)
_SEED_MARKERS = ("o", "s", "^", "D")


def plot_gradient_fidelity(result, *, reference: str = "nvfp4") -> Figure:
    """Three panels from a :class:`~course_lib.studies.microscaling_pieces.GradientFidelity`. Top: per
    recipe, the relative error of its gradient of the course model against the exact one (a marker per model
    and batch, its shape the model's seed; a bar at the mean). Middle: per piece of the ``reference``
    recipe that ran, the error without it minus with it (same model and batch, points; right of zero, the
    piece helped; a row per piece), and the same for MXFP4's high-precision last block. Bottom: the error of the mean of k
    gradients against k, for the ``reference`` recipe (stochastic rounding; a thin line per model, a thick one
    for their mean) and, where present, the same recipe without it (``reference + "_no_sr"``), with
    ``1/sqrt(k)`` from the first point for comparison. The panels stack, top to bottom, in that order."""
    if reference not in result.single:
        raise ValueError(f"no recipe named {reference!r}; recipes: {', '.join(result.recipes)}")
    # one panel per row, at the column's width, with text of 12 points: three panels side by side left
    # their labels at 7 to 8 pixels on the page
    with plt.rc_context(_LARGE_TEXT):
        fig = plt.figure(figsize=(COLUMN_INCHES, 14))
        grid = fig.add_gridspec(3, 1, height_ratios=(1.1, 1.0, 0.9))
        left, middle, right = (fig.add_subplot(grid[i, 0]) for i in range(3))
        return _draw_gradient_fidelity(fig, left, middle, right, result, reference)


_LARGE_TEXT: dict = {"font.size": 12, "axes.labelsize": 12, "xtick.labelsize": 12, "ytick.labelsize": 12,
               "legend.fontsize": 12}


def _draw_gradient_fidelity(fig, left, middle, right, result, reference: str) -> Figure:
    colours = {r: fp8_colour(r, j) for j, r in enumerate(result.recipes)}
    n_models = len(result.seeds)
    offsets = np.linspace(-0.22, 0.22, n_models) if n_models > 1 else np.zeros(1)

    def markers(ax, i, per_model, colour, across=False):
        for s, values in enumerate(per_model):
            at = [i + offsets[s]] * len(values)
            x, y = (values, at) if across else (at, values)
            ax.plot(x, y, _SEED_MARKERS[s % len(_SEED_MARKERS)], color=colour, ms=7, mfc="none", mew=1.4)

    for i, recipe in enumerate(result.recipes):
        per_model = [[100 * v for v in m] for m in result.single[recipe]]
        left.bar(i, np.mean([v for m in per_model for v in m]), color=colours[recipe], alpha=0.3, width=0.7)
        markers(left, i, per_model, colours[recipe])
    left.set_xticks(range(len(result.recipes)), result.recipes, rotation=30, ha="right")
    left.set_ylabel("gradient error vs exact FP32 (%)\nmarker: model and batch; bar: mean")
    left.set_ylim(bottom=0)
    left.grid(alpha=0.3, axis="y")
    for s, seed in enumerate(result.seeds):
        left.plot([], [], _SEED_MARKERS[s % len(_SEED_MARKERS)], color="#555555", mfc="none", mew=1.3,
                  label=f"model seed {seed}")
    # above the panel, where no marker can hide behind it
    left.legend(fontsize=12, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncols=n_models, frameon=False)

    # each bar is one piece of a recipe, named by what it is (the recipe without it is the other run)
    names = {"sr": "stochastic rounding", "rht": "Hadamard transform", "2d": "16x16 weight blocks",
             "hp_last": "high-precision last block"}
    pieces = [(f"{reference}_no_{p}", reference, f"{reference.upper()}: {names[p]}") for p in names]
    pieces.append(("mxfp4", "mxfp4_hp_last", f"MXFP4: {names['hp_last']}"))
    pieces = [(w, r, label) for w, r, label in pieces if w in result.single and r in result.single]
    # a row per piece, so that its name reads across instead of slanting under the panel
    for i, (without, with_, _) in enumerate(pieces):
        per_model = result.effect(without, with_).per_model
        middle.barh(i, np.mean([v for m in per_model for v in m]), color=colours[without], alpha=0.3, height=0.7)
        markers(middle, i, per_model, colours[without], across=True)
    middle.axvline(0, color="#555555", lw=1)
    middle.set_yticks(range(len(pieces)), [label.replace(": ", ":\n") for _, _, label in pieces])
    middle.tick_params(axis="y", length=0)   # a tick beside a two-line name read as an underscore after its first
    middle.set_ylim(len(pieces) - 0.5, -0.5)
    middle.set_xlabel("error without the piece minus with it (points; right of 0: the piece helped)")
    middle.grid(alpha=0.3, axis="x")

    ks = np.asarray(result.ks)
    for recipe, label in ((reference, f"{reference}\n(stochastic rounding)"),
                          (reference + "_no_sr", f"{reference}_no_sr\n(round to nearest)")):
        if recipe in result.averaged:
            for per_model in result.averaged[recipe]:
                right.plot(ks, np.asarray(per_model) * 100, "-", color=colours[recipe], lw=1.2, alpha=0.7)   # visible on white
            right.plot(ks, np.asarray(result.mean_averaged(recipe)) * 100, "o-", color=colours[recipe], lw=2,
                       label=label)
    first = result.mean_averaged(reference)[0] * 100
    right.plot(ks, first / np.sqrt(ks), ":", color="#777777", label="1/sqrt(k) from\nthe first point")
    right.set_xscale("log", base=2)
    right.set_xticks(ks, [str(k) for k in ks])
    right.set_ylim(bottom=0)
    right.set_xlabel("k, gradients averaged (log2 axis)")
    right.set_ylabel("error of the mean\nof k gradients (%)\nthin lines: one model")
    right.grid(alpha=0.3)
    # along the figure's bottom (finish_figure lays the panels out above it): it covers no line and leaves the
    # panels their width
    fig.legend(*right.get_legend_handles_labels(), fontsize=12, loc="lower center", ncols=3, frameon=False)
    return finish_figure(fig)


def plot_gap_replay(replay) -> Figure:
    """A :class:`~course_lib.studies.microscaling_replay.GapReplay`: the loss at the replayed step against how
    many of the steps before it ran with exact products (log2 axis), beside the run as it ran, BF16's loss, and
    half-way between them (the line a replay must reach to close half the gap)."""
    if not replay.replays:
        raise ValueError("the replay has no replayed steps (its gap is at step 0)")
    ks = np.asarray([k for k, _ in replay.replays])
    losses = np.asarray([loss for _, loss in replay.replays])
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 4.2))
    colour = fp8_colour(replay.recipe)
    ax.axhline(replay.as_run, color=colour, ls="--", lw=1.5, label=f"{replay.recipe} as it ran")
    ax.axhline(replay.baseline, color=fp8_colour("bf16_autocast"), lw=3, label="BF16 autocast")
    ax.axhline((replay.as_run + replay.baseline) / 2, color="#777777", ls=":", lw=1.2, label="half the gap closed")
    ax.plot(ks, losses, "o-", color="#000000", lw=1.2, ms=5,
            label=f"{replay.recipe}, its last k steps replayed with exact products")
    labels = [str(k) if k in (1, 2, 4, 8, 16) or k >= 32 else "" for k in ks]
    labels[-1] = f"{ks[-1]}\n(all: an FP32 run)"
    ax.set_xscale("log", base=2)
    ax.set_xticks(ks, labels)
    ax.xaxis.set_minor_locator(mticker.NullLocator())
    ax.set_xlabel(f"k, steps before step {replay.step} replayed with exact products (log2 axis)")
    ax.set_ylabel(f"loss at step {replay.step}, seed {replay.seed}")
    ax.grid(alpha=0.3)
    # under the axes: the replays cross every level the lines mark
    ax.legend(fontsize=9, loc="upper center", bbox_to_anchor=(0.5, -0.3), ncols=2, frameon=False)
    return finish_figure(fig)
