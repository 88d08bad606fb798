"""Figures of lesson 9: a recovered run, underflow over a run, the monitor's dashboard."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from .style import LIMIT_COLOUR, finish_figure, recipe_colour


def plot_recovery(demo) -> Figure:
    """Loss, loss scale and skipped steps against the optimizer step for the run without recovery (grey)
    and with it (colour) of a :class:`~course_lib.studies.monitoring.RecoveryDemo`; the fault's start and each rollback
    marked. A rolled-back run steps back along the x axis, so its line doubles back where it rolled back."""
    fig, (top, mid, bottom) = plt.subplots(3, 1, figsize=(10, 7.4), sharex=True,
                                           gridspec_kw={"height_ratios": [2, 1.4, 0.8]})
    runs = (("FP16 + GradScaler, no recovery", demo.without, "#777777"),
            ("with recovery (rolls back, continues in BF16)", demo.with_recovery, "#0072B2"))
    for j, (label, log, colour) in enumerate(runs):
        steps = np.asarray(log.steps)
        losses = np.asarray(log.losses, dtype=float)
        scales = np.asarray(log.scales, dtype=float)
        shown = np.where(np.isfinite(losses), losses, np.nan)
        # a rollback starts a new segment: the abandoned attempt faded, the run that continued solid
        cuts = [0] + [i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]] + [len(steps)]
        for k, (a, b) in enumerate(zip(cuts[:-1], cuts[1:])):
            last = k == len(cuts) - 2
            kw = dict(color=colour, lw=2.6 if j == 0 else 1.6, ms=3, zorder=2 + j, alpha=1.0 if last else 0.45)
            top.plot(steps[a:b], shown[a:b], "o-", label=label if last else None, **kw)
            mid.plot(steps[a:b], scales[a:b], "o-", **kw)
        bad = steps[~np.isfinite(losses)]
        if len(bad):
            # a non-finite loss has no height: mark it along the top of the panel
            top.plot(bad, np.full(len(bad), 1.0), "x", color=colour, ms=6, mew=1.6,
                     transform=top.get_xaxis_transform(), clip_on=False,
                     label=("no recovery" if j == 0 else "recovery") + ": loss inf/NaN")
        skipped = steps[np.asarray(log.skipped, dtype=bool)]
        bottom.plot(skipped, np.full(len(skipped), j), "|", color=colour, ms=14, mew=2)
    for ax in (top, mid, bottom):
        ax.axvline(demo.fault_at, color=LIMIT_COLOUR, ls="--", lw=1.2)
        ax.grid(alpha=0.3)
    for e in demo.events:
        top.annotate(f"alert at step {e.step}: rolled back to {e.rolled_back_to}, continued in {e.recipe}",
                     xy=(e.step, 0.85), xycoords=top.get_xaxis_transform(), xytext=(8, 0),
                     textcoords="offset points", fontsize=8, va="center")
    top.text(demo.fault_at, top.get_ylim()[0], " fault starts", color=LIMIT_COLOUR, fontsize=8, va="bottom")
    top.set_ylabel("loss\n(x along the top: inf or NaN)")
    top.legend(fontsize=8, loc="lower left")
    mid.set_yscale("log", base=2)
    mid.set_ylabel("loss scale (log2)")
    bottom.set_yticks([0, 1], ["no recovery", "recovery"])
    bottom.set_ylim(-0.6, 1.6)
    bottom.set_ylabel("skipped")
    bottom.set_xlabel("optimizer step")
    return finish_figure(fig)


def plot_underflow_trend(trend, *, top_n: int = 6) -> Figure:
    """Left: per parameter (the ``top_n`` with the largest share at any point), the share of its gradient
    an unscaled low-precision format would flush to zero, against the step. Right: the loss."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [1.5, 1]})
    ranked = sorted(trend.flush.items(), key=lambda kv: -max(kv[1]))[:top_n]
    for j, (name, series) in enumerate(ranked):
        left.plot(trend.steps, np.asarray(series) * 100, "o-", color=recipe_colour(j), lw=1.6, ms=3, label=name)
    left.set_xlabel("optimizer step")
    left.set_ylabel(f"gradient values {trend.fmt} would flush (%)")
    left.grid(alpha=0.3)
    left.legend(fontsize=7)
    right.plot(np.arange(len(trend.losses)), trend.losses, color="#000000", lw=1.6)
    right.set_xlabel("optimizer step")
    right.set_ylabel("loss")
    right.grid(alpha=0.3)
    return finish_figure(fig)


def plot_dashboard(log, alerts=(), *, attribute: str = "zero", top_n: int = 4, mark_step: int | None = None) -> Figure:
    """A monitor's dashboard (a :class:`~course_lib.monitor.MonitorLog`): loss, loss scale and skipped
    steps per step, and per parameter (the ``top_n`` with the largest value at any point) the share of its
    gradient that is ``attribute`` ("zero", "flush", "subnormal") per sampled step; alerts marked where
    raised, and ``mark_step`` (a planted fault's start) as a dashed line."""
    fig, axes = plt.subplots(4, 1, figsize=(10, 8), sharex=True, gridspec_kw={"height_ratios": [1.6, 1, 0.6, 1.6]})
    loss_ax, scale_ax, skip_ax, layer_ax = axes
    steps = np.asarray(log.steps)
    losses = np.asarray(log.losses, dtype=float)
    loss_ax.plot(steps, np.where(np.isfinite(losses), losses, np.nan), color="#000000", lw=1.6)
    loss_ax.set_ylabel("loss")
    scale_ax.plot(steps, log.scales, color="#0072B2", lw=1.6)
    scale_ax.set_yscale("log", base=2)
    scale_ax.set_ylabel("loss scale")
    skipped = steps[np.asarray(log.skipped, dtype=bool)]
    skip_ax.plot(skipped, np.zeros(len(skipped)), "|", color="#D55E00", ms=14, mew=2)
    skip_ax.set_yticks([])
    skip_ax.set_ylabel("skipped")
    series = log.layer_series(attribute)
    ranked = sorted(series.items(), key=lambda kv: -max(kv[1]))[:top_n]
    styles = ["-", "--", "-.", ":"]
    for j, (name, values) in enumerate(ranked):
        # lines that coincide stay visible by their dashes and marker sizes
        layer_ax.plot(log.sampled_steps, np.asarray(values) * 100, marker="o", ls=styles[j % len(styles)],
                      color=recipe_colour(j), lw=1.6, ms=3 + 1.5 * (len(ranked) - j - 1) / max(1, len(ranked) - 1),
                      label=name)
    layer_ax.set_ylabel(f"gradient values {attribute} (%)")
    layer_ax.set_xlabel("optimizer step")
    layer_ax.legend(fontsize=7, loc="center left")
    for ax in axes:
        ax.grid(alpha=0.3)
        if mark_step is not None:
            ax.axvline(mark_step, color=LIMIT_COLOUR, ls="--", lw=1.2)
    by_step: dict[int, list] = {}
    for a in alerts:
        by_step.setdefault(a.step, []).append(a)
    for step, group in sorted(by_step.items()):
        kinds = sorted({a.kind for a in group})
        text = "alert: " + ", ".join(kinds) + (f" ({len(group)} parameters)" if len(group) > 1 else
                                               f" ({group[0].layer})" if group[0].layer else "")
        layer_ax.annotate(text, xy=(step, 1.0), xycoords=layer_ax.get_xaxis_transform(), xytext=(6, -18),
                          textcoords="offset points", fontsize=7, va="top",
                          bbox=dict(boxstyle="round,pad=0.2", fc="white", ec="none", alpha=0.8))
        layer_ax.plot([step], [1.0], "v", color=LIMIT_COLOUR, ms=6, transform=layer_ax.get_xaxis_transform(),
                      clip_on=False)
    return finish_figure(fig)
