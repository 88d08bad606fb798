"""Figures of lesson 9: a recovered run, underflow over a run, the monitor's dashboard."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import matplotlib.transforms as mtransforms
import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import NullLocator

from .loss_scaling import scale_tick_exponents
from .style import LIMIT_COLOUR, finish_figure, recipe_colour


def plot_recovery(demo) -> Figure:
    """Loss, loss scale and skipped steps against the optimizer step for the run without recovery (grey)
    and with it (colour) of a :class:`~course_lib.studies.monitoring.RecoveryDemo`; the fault's start and each rollback
    marked. A rolled-back run steps back along the x axis, so its line doubles back where it rolled back."""
    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(8.5, 7.8), sharex=True,
                                           gridspec_kw={"height_ratios": [2, 1.4, 0.8]})
    runs = (("FP16 + GradScaler, no recovery", demo.without, "#777777"),
            ("with recovery (rolls back, continues in BF16)", demo.with_recovery, "#0072B2"))
    for j, (label, log, colour) in enumerate(runs):
        steps = np.asarray(log.steps)
        losses = np.asarray(log.losses, dtype=float)
        scales = np.asarray(log.scales, dtype=float)
        shown = np.where(np.isfinite(losses), losses, np.nan)
        skipped_mask = np.asarray(log.skipped, dtype=bool)
        # a rollback starts a new segment at the step it went back to: the steps of the segment before from
        # there on were abandoned (hollow diamonds, above the grey run they may lie on; faint ticks in the
        # skipped panel); the steps kept and the run that continued are solid, joined across the rollback
        cuts = [0] + [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]] + [len(steps)]
        kept = np.zeros(len(steps), dtype=bool)
        for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            resumed_at = steps[b] if b < len(steps) else np.inf
            kept[a:b] = steps[a:b] < resumed_at
        solid = dict(color=colour, lw=2.6 if j == 0 else 1.6, ms=3, zorder=2 + j)
        # hollow diamonds, larger than the runs' dots: the abandoned steps can lie exactly on the grey run
        faded = dict(color=colour, ms=8, mfc="none", mew=1.6, ls="none", alpha=0.8, zorder=5)
        order = np.flatnonzero(kept)
        top.plot(steps[order], shown[order], "o-", label=label, **solid)
        # a scale holds for its whole step and changes between steps: drawn as a staircase, so that a fall
        # shows at the step that first used the lower scale, not as a slope from the step before
        mid.plot(steps[order], scales[order], "o-", drawstyle="steps-post", **solid)
        for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            gone = [i for i in range(a, b) if not kept[i]]
            if not gone:
                continue
            first = not any(not kept[i] for i in range(cuts[0], a))
            top.plot(steps[gone], shown[gone], "D", label="abandoned attempt, rolled back" if first else None,
                     **faded)
            mid.plot(steps[gone], scales[gone], "D", **faded)
            abandoned_skips = [i for i in gone if skipped_mask[i]]
            bottom.plot(steps[abandoned_skips], np.full(len(abandoned_skips), j), "|", color=colour, ms=14,
                        mew=2.4, alpha=0.35, zorder=3)
        bad = steps[~np.isfinite(losses)]
        if len(bad):
            # a non-finite loss has no height: mark it along the top of the panel
            top.plot(bad, np.full(len(bad), 1.0), "x", color=colour, ms=6, mew=1.6,
                     transform=top.get_xaxis_transform(), clip_on=False,
                     label=("no recovery" if j == 0 else "recovery") + ": loss inf/NaN")
        skipped = steps[skipped_mask & kept]
        # above the fault's line, which runs through the same step
        bottom.plot(skipped, np.full(len(skipped), j), "|", color=colour, ms=14, mew=2.4, zorder=3)
    for ax in (top, mid, bottom):
        ax.axvline(demo.fault_at, color=LIMIT_COLOUR, ls="--", lw=1.2, zorder=1)
        ax.grid(alpha=0.3)
    for e in demo.events:
        top.annotate(f"alert at step {e.step}: rolled back to {e.rolled_back_to},\ncontinued in {e.recipe}",
                     xy=(e.step, 0.85), xycoords=top.get_xaxis_transform(), xytext=(8, 0),
                     textcoords="offset points", fontsize=8, va="center")
    top.text(demo.fault_at, top.get_ylim()[0], " fault starts", color=LIMIT_COLOUR, fontsize=8, va="bottom")
    top.set_ylabel("loss\n(x along the top: inf or NaN)")
    handles, labels = top.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False)   # under the panels: covers no data
    mid.set_yscale("log", base=2)
    # labelled from the runs' starting scale (GradScaler's default), not from wherever the log locator lands
    mid.set_yticks([2.0**e for e in scale_tick_exponents([demo.without.scales, demo.with_recovery.scales],
                                                          most=5)])
    mid.yaxis.set_minor_locator(NullLocator())
    end = float(demo.without.scales[-1]) if len(demo.without.scales) else math.nan
    if math.isfinite(end) and end > 0 and end < min(mid.get_yticks()):
        # the no-recovery run's last scale lies below the lowest tick: name it where the line ends
        mid.annotate(f"{end:g}", xy=(demo.without.steps[-1], end), xytext=(5, 0), textcoords="offset points",
                     fontsize=8, va="center", color="#555555", annotation_clip=False)
    mid.set_ylabel("loss scale (log2)")
    bottom.set_yticks([0, 1], ["no recovery", "recovery"])
    bottom.set_ylim(-0.6, 1.6)
    bottom.set_ylabel("skipped")
    bottom.set_xlabel("optimizer step")
    return finish_figure(fig)


def plot_underflow_trend(trend, *, top_n: int = 6) -> Figure:
    """Left: per parameter (the ``top_n`` with the largest share at any point), the share of its gradient
    an unscaled low-precision format would flush to zero, against the step. Right: the loss."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5.4), gridspec_kw={"width_ratios": [1.5, 1]})
    ranked = sorted(trend.flush.items(), key=lambda kv: -max(kv[1]))[:top_n]
    _ranked_lines(left, trend.steps, ranked)
    left.set_xlabel("optimizer step")
    left.set_ylabel(f"gradient values {trend.fmt}\nwould flush (%)")
    left.grid(alpha=0.3)
    # under the panels, where it covers no line (inside the panel it hid lines that cross its middle)
    handles, labels = left.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2, frameon=False)
    right.plot(np.arange(len(trend.losses)), trend.losses, color="#000000", lw=1.6)
    right.set_xlabel("optimizer step")
    right.set_ylabel("loss")
    right.grid(alpha=0.3)
    return finish_figure(fig)


def _ranked_lines(ax, steps, ranked) -> None:
    """One line per :func:`_identical_groups` group of ``ranked`` ``(name, shares)`` in percent, each in its own
    colour, marker and dash: two series that run close together stay apart where their colours would not. Each
    sampled value is held until the next sample (a step, not a slope: a straight line from 0% to 100% across
    an unsampled step drew 50% where nothing was measured)."""
    markers, dashes = ["o", "s", "^", "D", "v", "P"], ["-", "--", "-.", ":"]
    for j, (names, values) in enumerate(_identical_groups(ranked)):
        label = names[0] if len(names) == 1 else f"{len(names)} identical series:\n" + "\n".join(names)
        ax.plot(steps, np.asarray(values) * 100, marker=markers[j % len(markers)], ls=dashes[j % len(dashes)],
                color=recipe_colour(j), lw=1.6, ms=4, label=label, drawstyle="steps-post")


def _identical_groups(ranked):
    """``(names, values)`` groups of the ranked series, in rank order, each holding the series whose values are
    identical at every sampled step: drawn once, they cannot hide one another."""
    groups: list[tuple[list[str], list[float]]] = []
    for name, values in ranked:
        same = next((g for g in groups if np.array_equal(np.asarray(g[1]), np.asarray(values))), None)
        if same is None:
            groups.append(([name], values))
        else:
            same[0].append(name)
    return groups


def _note(ax, text: str) -> None:
    ax.text(0.99, 0.95, text, transform=ax.transAxes, ha="right", va="top", fontsize=8, color="#555555",
            bbox=dict(boxstyle="round,pad=0.25", fc="white", ec="#bbbbbb", alpha=0.9))


def plot_dashboard(log, alerts=(), *, attribute: str = "zero", top_n: int = 4, mark_step: int | None = None) -> Figure:
    """A monitor's dashboard (a :class:`~course_lib.monitor.MonitorLog`): loss per step; the loss scale per
    step, in a panel of its own only when it changed, and skipped steps only when there were any (otherwise a
    note on the loss panel says so); and per parameter (the ``top_n`` with the largest value at any point) the
    share of its gradient that is ``attribute`` ("zero", "flush", "subnormal") per sampled step. Parameters
    whose series are identical share one line and one legend entry that names them all; the others differ
    in marker and dash. Alerts are marked where raised, and ``mark_step`` (a planted fault's start) as a
    dashed line."""
    if top_n < 1:
        raise ValueError(f"top_n must be a positive int, got {top_n!r}")
    steps = np.asarray(log.steps)
    scales = np.asarray(log.scales, dtype=float)
    skipped = steps[np.asarray(log.skipped, dtype=bool)] if len(log.skipped) else steps[:0]
    show_scale = len(scales) > 0 and np.unique(scales).size > 1
    show_skipped = len(skipped) > 0
    ratios = [1.6] + [1] * show_scale + [0.6] * show_skipped + [1.6]
    fig, axes = plt.subplots(len(ratios), 1, figsize=(10, 2 + 1.5 * sum(ratios)), sharex=True,
                             gridspec_kw={"height_ratios": ratios})
    axes = list(axes)
    loss_ax, layer_ax = axes[0], axes[-1]
    losses = np.asarray(log.losses, dtype=float)
    loss_ax.plot(steps, np.where(np.isfinite(losses), losses, np.nan), color="#000000", lw=1.6)
    loss_ax.set_ylabel("loss")
    absent = []
    if show_scale:
        scale_ax = axes[1]
        scale_ax.plot(steps, scales, color="#0072B2", lw=1.6)
        scale_ax.set_yscale("log", base=2)
        scale_ax.set_ylabel("loss scale")
    elif len(scales):
        absent.append(f"loss scale {scales[0]:g} at every step")
    if show_skipped:
        skip_ax = axes[-2]
        skip_ax.plot(skipped, np.zeros(len(skipped)), "|", color="#D55E00", ms=14, mew=2)
        skip_ax.set_yticks([])
        skip_ax.set_ylabel("skipped")
    else:
        absent.append("no step skipped")
    if absent:
        _note(loss_ax, "; ".join(absent))
    series = log.layer_series(attribute)
    ranked = sorted(series.items(), key=lambda kv: -max(kv[1]))[:top_n]
    _ranked_lines(layer_ax, log.sampled_steps, ranked)
    layer_ax.set_ylabel(f"gradient values {attribute} (%)")
    layer_ax.set_xlabel("optimizer step")
    if ranked:
        layer_ax.legend(fontsize=7, loc="best")
    else:
        _note(layer_ax, "no gradients sampled")
    for ax in axes:
        ax.grid(alpha=0.3)
        if mark_step is not None:
            ax.axvline(mark_step, color=LIMIT_COLOUR, ls="--", lw=1.2)
    if mark_step is not None:   # named once, at the foot of the first panel's line
        axes[0].text(mark_step, 0.0, " fault starts", color=LIMIT_COLOUR, fontsize=8, va="bottom",
                     transform=axes[0].get_xaxis_transform())
    by_step: dict[int, list] = {}
    for a in alerts:
        by_step.setdefault(a.step, []).append(a)
    for k, (step, group) in enumerate(sorted(by_step.items())):
        kinds = sorted({a.kind for a in group})
        text = "alert: " + ", ".join(kinds) + (f"\n({len(group)} parameters)" if len(group) > 1 else
                                               f"\n({group[0].layer})" if group[0].layer else "")
        # two lines each, and each alert lower than the one before (three levels, then again from the top), so
        # that neighbouring alerts do not collide
        layer_ax.annotate(text, xy=(step, 1.0), xycoords=layer_ax.get_xaxis_transform(), xytext=(6, -18 - 26 * (k % 3)),
                          textcoords="offset points", fontsize=7, va="top",
                          bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
        # the marker hangs from the panel's top edge: centred 4 points below it, a 6-point triangle is inside
        hang = mtransforms.offset_copy(layer_ax.get_xaxis_transform(), fig=fig, y=-4, units="points")
        layer_ax.plot([step], [1.0], "v", color=LIMIT_COLOUR, ms=6, transform=hang, clip_on=False)
    return finish_figure(fig)
