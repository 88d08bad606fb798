"""Figures of lesson 10: reduction error against the number of ranks, and each rank's loss scale."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.artist import Artist
from matplotlib.figure import Figure

from .style import finish_figure

# the reduction figure's width (inches): the book scales a figure to its column (about 672 px), so at this
# width a 10-point label is about 15 px tall on the page, against 11 px for a figure as wide as the column
REDUCTION_FIGURE_INCHES = 6.0


def plot_reduction_precision(study) -> Figure:
    """Two panels, stacked, against the number of ranks (log2 axis), one line per reduction of a
    :class:`~course_lib.studies.distributed.ReductionStudy`: the relative L2 error of the reduced mean gradient (log
    scale, with one BF16 rounding of the exact mean as a dashed floor, top panel only: one rounding is never off
    by the tolerance, so the bottom panel has no floor), and below it the share of entries off by more than the
    study's tolerance. Narrower than the book's column and stacked, so that the book, which scales it to the
    column, shows its text larger than a side-by-side figure's. The two FP16 reductions' lines can coincide:
    one is drawn with small filled circles, the other with larger hollow ones around them, so both show."""
    fig, (ax_err, ax_off) = plt.subplots(2, 1, figsize=(REDUCTION_FIGURE_INCHES, 8.2), sharex=True)
    n = list(study.world_sizes)
    styles = {"FP32": ("#000000", "-"), "BF16, ring": ("#D55E00", "-"), "tree": ("#D55E00", "--"),
              "/N first": ("#0072B2", "-"), "sqrt": ("#0072B2", ":")}
    for j, label in enumerate(study.errors):
        colour, ls = next(v for k, v in styles.items() if k in label)
        # a dotted line is drawn with hollow markers (no fill) larger than the solid line's filled ones: where
        # the two coincide (the FP16 reductions' whole-vector errors) each filled circle shows inside a ring
        hollow = ls == ":"
        kw = dict(marker="o", ms=9 if hollow else 4, color=colour, ls=ls, label=label, zorder=2 + j,
                  mfc="none" if hollow else colour, mew=1.5 if hollow else 1.0)
        ax_err.plot(n, study.errors[label], **kw)
        ax_off.plot(n, [100 * v for v in study.off_share[label]], **kw)
    ax_err.plot(n, study.floor, color="#999999", ls="--", lw=1, label="exact mean rounded once to BF16 (top only)")
    ax_err.set_yscale("log")
    ax_err.set_ylabel("relative error of the mean gradient\n(L2, against FP64)")
    ax_off.set_ylabel(f"entries off by more than {100 * study.tolerance:g}% (%)")
    for ax in (ax_err, ax_off):
        ax.set_xscale("log", base=2)
        ax.set_xticks(n, [str(v) for v in n])
        ax.tick_params(labelbottom=True)
        ax.grid(alpha=0.3)
    ax_off.set_xlabel("ranks (N)")
    ax_err.set_title("Whole gradient")
    ax_off.set_title("Entry by entry")
    handles, names = ax_err.get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=2, frameon=False, handlelength=2.6, columnspacing=1.2)
    return finish_figure(fig)


def plot_rank_scales(study, labels=None) -> Figure:
    """The loss scale per step of every rank, one panel per planted-inf case of a
    :class:`~course_lib.studies.distributed.DataParallelStudy`; a filled circle marks a step every rank
    skipped, a mark of the rank's own shape (x, +, ...) a step only some ranks skipped, and a shaded column
    the step the inf was planted at. Two panels a row, 6.4 inches wide, so that the book, which scales a
    figure to its column (about 672 px), shows its 11-point text about 16 px tall. The legend names only the
    marks some panel draws."""
    labels = list(study.scaler_cases) if labels is None else list(labels)
    ncols = min(2, len(labels))
    nrows = -(-len(labels) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.2 * ncols, 2.9 * nrows), sharey=True, squeeze=False)
    colours = ["#0072B2", "#D55E00", "#009E73", "#CC79A7"]
    dashes = ["-", (0, (4, 2)), ":", "-."]   # a later rank dashed over an earlier one: both show where they agree
    for ax in axes.flat[len(labels):]:
        ax.set_visible(False)
    for ax, label in zip(axes.flat, labels):
        case = study.scaler_cases[label]
        ax.axvspan(study.plant_step - 0.4, study.plant_step + 0.4, color="#999999", alpha=0.25, lw=0,
                   label="the step the inf was planted at")
        ranks = sorted(case.scales)
        by_all = sorted(set.intersection(*(set(case.skipped[r]) for r in ranks)))
        for j, rank in enumerate(ranks):
            scales = case.scales[rank]
            steps = np.arange(len(scales))
            ax.step(steps, scales, where="post", color=colours[j % 4], lw=2.4 - 0.6 * j, ls=dashes[j % 4],
                    label=f"rank {rank}")
            # a mark of the rank's own shape where only some ranks skipped; a step every rank skipped gets
            # one filled circle below, which no overlap of x and + could be mistaken for
            alone = [s for s in case.skipped[rank] if s not in by_all]
            ax.plot(alone, [scales[s] for s in alone], "x+12"[j % 4], ms=10 - 1.5 * j, mew=2,
                    color=colours[j % 4], label=f"only rank {rank} skipped the step")
        first = case.scales[ranks[0]]
        ax.plot(by_all, [first[s] for s in by_all], "o", ms=8, color="black", mfc="black", zorder=5,
                label="every rank skipped the step")
        ax.set_yscale("log", base=2)
        ax.set_xlabel("step", fontsize=12)
        ax.set_title(textwrap.fill(label, 28), fontsize=11)
        ax.tick_params(labelsize=11)
        ax.grid(alpha=0.3)
        bad = [r for r, ok in case.weights_finite.items() if not ok]
        if bad:
            ax.text(0.03, 0.05, f"rank {', '.join(map(str, bad))}: weights not finite", transform=ax.transAxes,
                    fontsize=11, color="black")
    for row in axes:
        row[0].set_ylabel("loss scale", fontsize=12)
    # every kind of mark some panel draws, once: an entry for a mark no panel shows would only puzzle
    shown: dict[str, Artist] = {}
    for ax in axes.flat[:len(labels)]:
        for handle, name in zip(*ax.get_legend_handles_labels()):
            drawn = not hasattr(handle, "get_xdata") or len(handle.get_xdata()) > 0
            if drawn and name not in shown:
                shown[name] = handle
    handles, names = list(shown.values()), list(shown)
    spare = [ax for ax in axes.flat[len(labels):]]
    if spare:   # an empty slot of the grid holds the legend
        spare[0].set_visible(True)
        spare[0].axis("off")
        spare[0].legend(handles, names, loc="center", fontsize=11, frameon=False)
    else:
        fig.legend(handles, names, loc="lower center", ncol=2, fontsize=11, frameon=False)
    return finish_figure(fig)
