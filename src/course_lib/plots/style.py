"""What every figure shares: colours (colour-blind safe, one per format and per recipe), resolution, the
finishing touches, and the loss-curve plots several lessons use."""

from __future__ import annotations

import math
import textwrap

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text
from matplotlib.ticker import MaxNLocator

from ..formats import FloatFormat, get_format, list_formats

# Colour-blind-safe (Okabe-Ito) colours for sign, exponent and mantissa; readable on light and dark.
SIGN_COLOUR = "#D55E00"


EXPONENT_COLOUR = "#0072B2"


MANTISSA_COLOUR = "#009E73"


TENSOR_COLOUR = "#555555"   # measured tensors: grey, so they never share a format's colour


LIMIT_COLOUR = "#D55E00"

# plot_runs' legend entry for the rings on skipped steps: each ring is drawn in its run's colour, so the key's
# ring is in none of them
RING_LABEL = "skipped step (ring in its run's colour)"
RING_KEY_COLOUR = "#000000"


FORMAT_COLOURS = ["#000000", "#999999", "#0072B2", "#D55E00", "#CC79A7", "#E69F00", "#56B4E9",
                  "#009E73", "#F0E442", "#882255"]


FIGURE_DPI = 150   # rendered at 1.5x the usual 100 dpi: the book scales images to its column, so text stays sharp


# The book scales every figure to its text column: 672 px in a 1280-px window, 7 inches at the browser's 96 px
# per inch, where a point of text reads at 1.33 px. A figure wider than this many inches is shrunk more, and
# its text with it: finish_figure enlarges such a figure's text in proportion, so that a label reads at the
# same size on the page whatever the figure's width (at 8.5 inches, the old value, 10-point ticks read at 11 px
# and 8-point legends at 9 px).
COLUMN_INCHES = 7.0


def scale_text_to_column(fig: Figure, column_inches: float = COLUMN_INCHES) -> float:
    """Multiply the size of every text in ``fig`` (titles, labels, ticks, legends, annotations) by the
    figure's width over ``column_inches`` when it is wider, so that its text reads as large on the page as a
    figure of the column's width. Returns the factor (1 for a figure no wider than the column)."""
    if not (isinstance(column_inches, (int, float)) and math.isfinite(column_inches) and column_inches > 0):
        raise ValueError(f"column_inches must be a positive number, got {column_inches!r}")
    factor = max(1.0, fig.get_figwidth() / column_inches)
    if factor == 1.0:
        return factor
    ticks: set[Text] = set()
    for ax in fig.axes:
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            default = Text(text="", fontsize=plt.rcParams["xtick.labelsize" if name == "x" else "ytick.labelsize"])
            for which, labels in (("major", axis.get_majorticklabels()), ("minor", axis.get_minorticklabels())):
                ticks.update(labels)
                size = float((labels[0] if labels else default).get_fontsize())
                # tick_params, not the labels: ticks made at draw time take their size from here
                ax.tick_params(axis="x" if name == "x" else "y", which=which, labelsize=size * factor)
    for text in fig.findobj(match=Text):
        if isinstance(text, Text) and text not in ticks:
            text.set_fontsize(float(text.get_fontsize()) * factor)
    return factor


# The smallest text a figure may carry, in points at the column's width (12 px on the page): a legend or a
# note set smaller reads too small.
MIN_FONT_POINTS = 9.0


def enforce_min_font(fig: Figure, points: float = MIN_FONT_POINTS) -> int:
    """Raise every text of ``fig`` smaller than ``points`` to ``points``; returns how many were raised."""
    raised = 0
    for text in fig.findobj(match=Text):
        if isinstance(text, Text) and text.get_text() and float(text.get_fontsize()) < points:
            text.set_fontsize(points)
            raised += 1
    return raised


def finish_figure(fig: Figure) -> Figure:
    """Lay out and detach from pyplot: the caller displays or glues the figure; Jupyter's inline backend
    must not show it a second time at the end of the cell, and no figure piles up in pyplot's registry.
    No text is smaller than :data:`MIN_FONT_POINTS`, and text is enlarged for figures wider than the book's
    column (:func:`scale_text_to_column`); the figure's dpi is set to :data:`FIGURE_DPI`, which the
    notebook's PNG uses."""
    enforce_min_font(fig)
    scale_text_to_column(fig)
    # a legend of the whole figure sits along its bottom edge (fig.legend(loc="lower center")): the panels
    # are laid out above it, however many rows it takes, so that it covers no tick label
    bottom = 0.0
    if fig.legends:
        height = max(legend.get_window_extent().height for legend in fig.legends)   # pixels at fig.dpi
        bottom = min(0.5, height / (fig.get_figheight() * fig.dpi) + 0.01)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    plt.close(fig)
    fig.set_dpi(FIGURE_DPI)   # after close(), which restores the figure's original dpi
    return fig


def resolve_formats(formats) -> list[FloatFormat]:
    return list_formats() if formats is None else [get_format(f) for f in formats]


def quantiles(values, qs) -> list[float]:
    """Quantiles of a 1-D tensor (numpy, so that any size works)."""
    if values.numel() == 0:
        return [math.nan] * len(qs)
    return [float(v) for v in np.quantile(values.cpu().numpy(), qs)]


def plot_runs(series: dict, *, ylabel: str, title: str, logy: bool = False, minus: str | None = None,
              smooth: int = 1, controls: dict | None = None, controls_label: str = "controls",
              symlog: float | None = None, marks: dict | None = None) -> Figure:
    """Lines of per-step values, one per named run (loss curves, zero fractions, ...).

    ``minus``: the name of a run to subtract from every other (drawn as the zero line), to show
    differences too small to see on the raw curves; ``smooth``: moving-average window in steps;
    ``controls``: more runs, drawn thin and grey over the others (so that where they coincide the grey
    still shows) under one legend entry, ``controls_label``; ``symlog``: a y axis linear within
    ``±symlog`` and logarithmic beyond, so that a few late spikes do not flatten the small differences
    before them; ``marks``: per run, the steps to ring on its line (skipped steps) in its colour, under one
    legend entry, ``RING_LABEL``, whose ring is black: it stands for every run's rings."""
    if marks is not None:
        if not isinstance(marks, dict) or any(k not in series or k == minus for k in marks):
            raise ValueError(f"marks must map drawn runs to steps; runs: {', '.join(k for k in series if k != minus)}")
        for k, steps in marks.items():
            if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(series[k]) for i in steps):
                raise ValueError(f"marks of {k!r} must be steps 0 to {len(series[k]) - 1}, got {list(steps)!r}")
    if symlog is not None and (isinstance(symlog, bool) or not isinstance(symlog, (int, float))
                               or not 0 < symlog < math.inf):
        raise ValueError(f"symlog must be None or a positive finite threshold, got {symlog!r}")
    if logy and symlog is not None:
        raise ValueError("logy and symlog are two y scales: give one")
    if minus is not None and minus not in series:
        raise ValueError(f"no run named {minus!r} to subtract; runs: {', '.join(series)}")
    if controls is not None and (not isinstance(controls, dict) or not controls):
        raise ValueError("controls must be None or a non-empty dict of runs")
    if isinstance(smooth, bool) or not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be a positive int, got {smooth!r}")

    def prepared(values):
        v = np.asarray(values, dtype=float)
        if minus is not None:
            v = v - np.asarray(series[minus], dtype=float)[: len(v)]
        if smooth > 1 and len(v) >= smooth:
            v = np.convolve(v, np.ones(smooth) / smooth, mode="valid")
        return v

    fig, ax = plt.subplots(figsize=(8.5, 4 if symlog is None else 5.4))   # room for the legend under it
    if minus is not None:
        ax.axhline(0.0, color="#000000", lw=1, label=minus)
    # runs that agree for a while lie on top of each other: each has its own dash as well as its own colour,
    # and the earlier ones are drawn wider, so that a covered line still shows along both edges of the next
    for i, values in enumerate((controls or {}).values()):
        v = prepared(values)
        # small open circles on each step: a draw that coincides with a run's line still shows
        ax.plot(np.arange(len(v)) + (smooth - 1), v, color="#999999", lw=1.0, zorder=3, marker="o", ms=3.5,
                mfc="white", mec="#777777", mew=0.8, label=controls_label if i == 0 else None)
    drawn = [label for label in series if label != minus]
    dashes = ["-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1))]
    ringed = False
    for j, label in enumerate(drawn):
        values = prepared(series[label])
        # a course recipe has its own colour and dash in every figure; other runs take them in turn
        colour, dash = RECIPE_STYLES.get(label, (recipe_colour(j), dashes[j % len(dashes)]))
        ax.plot(np.arange(len(values)) + (smooth - 1), values, ls=dash,
                color=colour,   # never the reference's black, nor vermillion beside orange
                lw=1.4 + 1.2 * (len(drawn) - 1 - j) / max(1, len(drawn) - 1), label=label)
        shown = [i for i in (marks or {}).get(label, ()) if i >= smooth - 1]
        if shown:
            ax.plot(shown, values[np.asarray(shown) - (smooth - 1)], ls="none", marker="o", ms=11, mfc="none",
                    mec=colour, mew=1.8, zorder=5)
            ringed = True
    if logy:
        ax.set_yscale("log")
    if symlog is not None:
        ax.set_yscale("symlog", linthresh=symlog, linscale=1.0)
        ax.axhspan(-symlog, symlog, color="#000000", alpha=0.04, lw=0, zorder=0)   # where the axis is linear
        # plain decimal ticks (a symlog axis labels powers of ten, which read badly beside its linear part):
        # halves of the threshold inside it, then 2x, 5x, 10x ... the threshold out to the data
        lo, hi = ax.get_ylim()
        outer = [symlog * k * 10 ** d for d in range(6) for k in (1, 2, 5)]
        ticks = sorted({0.0, symlog / 2, -symlog / 2, *(t for t in outer if t <= hi), *(-t for t in outer if -t >= lo)})
        ax.set_yticks(ticks, [f"{t:+.3g}".replace("-", "\u2212") if t else "0" for t in ticks])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True, steps=[1, 2, 5, 10]))   # whole steps, round ticks
    ax.set_xlabel("training step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    handles, labels = ax.get_legend_handles_labels()
    if ringed:   # one legend entry for every run's rings, in no run's colour: each ring takes its run's
        handles.append(Line2D([], [], ls="none", marker="o", ms=11, mfc="none", mec=RING_KEY_COLOUR, mew=1.8))
        labels.append(RING_LABEL)
    if symlog is None:
        ax.legend(handles, labels, fontsize=8, handlelength=4)   # long enough samples to show each dash pattern
    else:   # a symlog axis has no empty corner: the legend goes under the axes, where it covers no line
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, handlelength=4, frameon=False)
    ax.grid(alpha=0.3)
    return finish_figure(fig)


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


def fp8_colour(label: str, j: int = 0) -> str:
    low = label.lower()
    for key, colour in _FP8_COLOURS:
        if key in low:
            return colour
    return recipe_colour(j)


def format_colour(fmt: str | FloatFormat) -> str:
    """One colour per registered format, the same in every figure (its place in the registry); a format the
    registry does not hold gets one by its name, stably."""
    name = fmt.name if isinstance(fmt, FloatFormat) else get_format(fmt).name
    names = [f.name for f in list_formats()]
    if name in names:
        return FORMAT_COLOURS[names.index(name) % len(FORMAT_COLOURS)]
    return FORMAT_COLOURS[sum(map(ord, name)) % len(FORMAT_COLOURS)]


# One colour and dash per recipe of course_lib.train, by name, the same in every figure (lesson 4's recipes,
# lesson 5's parity runs): Okabe-Ito colours, never the limit colour.
RECIPE_STYLES: dict[str, tuple[str, object]] = {
    "fp32": ("#000000", "-"), "bf16_autocast": ("#0072B2", "-"), "fp16_autocast_scaler": ("#CC79A7", "--"),
    "fp16_autocast_no_scaler": ("#E69F00", "-."), "bf16_pure": ("#56B4E9", ":"),
    "bf16_master": ("#009E73", (0, (5, 1, 1, 1, 1, 1))), "tf32": ("#882255", (0, (3, 1)))}


def recipe_colour(j: int) -> str:
    # the Okabe-Ito colours after black and grey, one per recipe, never the limit colour
    palette = [c for c in FORMAT_COLOURS[2:] if c != LIMIT_COLOUR]
    return palette[j % len(palette)]


SEED_ROW_STEP = 0.12   # plot_seeded_runs: how far below the previous seed's dot a seed's dot sits, in rows
# plot_seeded_runs' colours where the names do not tell the runs apart: the first four of different hues (the
# recipe palette puts its two blues three apart, and lesson 5's four BF16 rules are four)
SEEDED_COLOURS = ("#0072B2", "#E69F00", "#CC79A7", "#009E73", "#882255", "#56B4E9", "#F0E442")


def plot_seeded_runs(result, *, reference: str, tail: int = 5, finals: dict | None = None,
                     final_label: str | None = None) -> Figure:
    """Left: loss curves per recipe (mean over seeds as a line, min-max over seeds as a band), the legend
    under them. Right: each seed's final loss (mean of the last ``tail`` steps) minus the ``reference``
    recipe's from the same seed, one dot per seed, a row per recipe (long recipe names read across, not
    slanted). ``result`` has ``recipes``, ``curves[recipe][seed_index]`` and ``final(recipe, tail)``.
    ``finals`` (recipe -> one value per seed) replaces the final losses, ``final_label`` names them."""
    if reference not in result.curves:
        raise ValueError(f"no recipe named {reference!r}; recipes: {', '.join(result.curves)}")
    if finals is not None and set(result.recipes) - set(finals):
        raise ValueError(f"finals has no values for {', '.join(sorted(set(result.recipes) - set(finals)))}")
    others = [r for r in result.recipes if r != reference]
    fig, (left, right) = plt.subplots(1, 2, figsize=(COLUMN_INCHES, 4.2 + 0.25 * len(result.recipes)),
                                      gridspec_kw={"width_ratios": [1.1, 1]})
    colours = {reference: "#777777", **{r: fp8_colour(r, j) for j, r in enumerate(others)}}
    if len({colours[r] for r in others} | {colours[reference]}) < len(others) + 1:   # names the map cannot tell apart
        colours = {reference: "#777777",
                   **{r: SEEDED_COLOURS[j % len(SEEDED_COLOURS)] for j, r in enumerate(others)}}
    # lines that lie on top of each other stay tellable apart by their dashes; a black recipe's band is
    # hatched, since a faint black fill reads as the reference's grey
    dashes = ["--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (8, 2)), (0, (3, 1, 1, 1))]
    for recipe in result.recipes:
        runs = np.asarray(result.curves[recipe], dtype=float)
        x = np.arange(runs.shape[1])
        style = "-" if recipe == reference else dashes[others.index(recipe) % len(dashes)]
        # the reference is drawn wide and underneath: where a recipe runs on it, it shows along both edges
        left.plot(x, runs.mean(axis=0), color=colours[recipe], lw=1.8 if recipe != reference else 4.5,
                  ls=style, label=recipe, zorder=2 if recipe != reference else 1.5)
        if colours[recipe] == "#000000":
            left.fill_between(x, runs.min(axis=0), runs.max(axis=0), facecolor="none", edgecolor="#000000",
                              hatch="////", lw=0, alpha=0.85)
        else:
            left.fill_between(x, runs.min(axis=0), runs.max(axis=0), color=colours[recipe], alpha=0.15, lw=0)
    left.set_xlabel("training step")
    left.set_ylabel("loss (line: mean over seeds;\nband: range)")
    left.grid(alpha=0.3)
    # under the axes, where it covers no curve and no label, one recipe per row for long names
    long_names = max(len(r) for r in result.recipes) > 16
    left.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1 if long_names else 2, frameon=False)
    final = (lambda r: finals[r]) if finals is not None else (lambda r: result.final(r, tail))
    ref_final = final(reference)
    for i, recipe in enumerate(others):
        diffs = [a - b for a, b in zip(final(recipe), ref_final)]
        # each seed a little lower than the one before: seeds that end close together (closer than a dot's
        # width on an axis another row stretches) stay one dot each
        rows = i + SEED_ROW_STEP * (np.arange(len(diffs)) - (len(diffs) - 1) / 2)
        right.plot(diffs, rows, "o", color=colours[recipe], ms=7, alpha=0.85, mec="white", mew=0.6)
    right.axvline(0.0, color="#000000", lw=1)
    right.margins(x=0.12)   # the outermost dots whole, not cut by the panel's edge
    # each row's name on one line inside the panel, above its dots: as tick labels beside the panel, long
    # names wrapped onto three lines and took the room the panel needed
    right.set_yticks(range(len(others)), [""] * len(others))
    right.tick_params(axis="y", length=0)
    # the names start just right of the zero line where it lies in the panel's left part, so that it crosses
    # none of them; elsewhere at the left edge, on an opaque patch
    lo, hi = right.get_xlim()
    zero = (0.0 - lo) / (hi - lo)
    start = zero + 0.02 if 0.0 <= zero < 0.45 else 0.02
    names = [right.text(start, i - 0.22, recipe, transform=right.get_yaxis_transform(), ha="left", va="bottom",
                        fontsize=9.5, color="#222222", gid="row-label", zorder=4,
                        bbox=dict(boxstyle="square,pad=0.1", facecolor="white", edgecolor="none"))
             for i, recipe in enumerate(others)]
    right.set_ylim(len(others) - 0.5, -0.75)   # the first recipe on top, as in the legend; room for its name
    # a name that would run past the panel's right edge ends at it instead, on its opaque patch
    fig.canvas.draw()
    edge = right.get_window_extent().x1
    for name in names:
        if name.get_window_extent().x1 > edge:
            name.set_x(0.98)
            name.set_horizontalalignment("right")
    right.set_xlabel(textwrap.fill(f"{final_label or 'final loss'} minus {reference}'s (same seed; one dot per "
                                   "seed, each seed a little lower)", 32, break_on_hyphens=False))
    right.grid(alpha=0.3, axis="x")
    return finish_figure(fig)
