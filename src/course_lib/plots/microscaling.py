"""Figures of lesson 8: error against block size, and the NVFP4 recipe's pieces on the gradient."""

from __future__ import annotations

import matplotlib.pyplot as plt
import matplotlib.ticker as mticker
import numpy as np
from matplotlib.figure import Figure

from .style import finish_figure, fp8_colour, recipe_colour

# tensors in lesson 8's block-size figure: colours the recipes of its later figures do not use
_TENSOR_COLOURS = {"activation": "#332288", "weight": "#8C6D31", "gradient": "#AA4499"}


def plot_block_sizes(study) -> Figure:
    """Relative error (log) of MX quantisation against block size, one panel per element format of a
    :class:`~course_lib.studies.microscaling.BlockSizeStudy`; one line per tensor, dashed for a tensor named "... + outlier"."""
    # each panel its own log range: FP8's errors would sit below the lowest labelled tick of FP4's
    fig, axes = plt.subplots(1, len(study.elements), figsize=(5.6 * len(study.elements), 4.4), squeeze=False)
    x = np.arange(len(study.blocks))
    for ax, element in zip(axes[0], study.elements):
        for j, tensor in enumerate(study.tensors):
            base = tensor.split(" +")[0]
            errs = [study.errors[element][tensor][b].relative_error for b in study.blocks]
            ax.plot(x, errs, "o-" if base == tensor else "s--", color=_TENSOR_COLOURS.get(base, recipe_colour(j)),
                    lw=1.8, ms=5, label=tensor)
        ax.set_xticks(x, ["1 (per element)" if b == "1" else ("whole tensor" if b == "tensor" else b)
                          for b in study.blocks])
        ax.set_yscale("log")
        ax.set_xlabel("elements per E8M0 scale (block along the last dimension)")
        ax.set_title(f"{element.upper()} elements, {study.mode.upper()} scales", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        lo, hi = ax.get_ylim()
        if hi / lo < 10:   # less than a decade: label the values, not just the decades
            ax.yaxis.set_minor_formatter(mticker.FormatStrFormatter("%.3g"))
            ax.yaxis.set_major_formatter(mticker.FormatStrFormatter("%.3g"))
    axes[0][0].set_ylabel("relative error ||q(x) - x|| / ||x|| (log)")
    axes[0][-1].legend(fontsize=8, loc="upper left")
    return finish_figure(fig)


def plot_gradient_fidelity(result, *, reference: str = "nvfp4") -> Figure:
    """Left: per recipe, the relative error of its gradient of the course model against the exact one (a
    dot per batch, a bar at the mean). Right: the error of the mean of k gradients against k, for the
    ``reference`` recipe (stochastic rounding) and, where present, the same recipe without it
    (``reference + "_no_sr"``), with ``1/sqrt(k)`` from the first point for comparison."""
    if reference not in result.single:
        raise ValueError(f"no recipe named {reference!r}; recipes: {', '.join(result.recipes)}")
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.4), gridspec_kw={"width_ratios": [1.4, 1]})
    colours = {r: fp8_colour(r, j) for j, r in enumerate(result.recipes)}
    for i, recipe in enumerate(result.recipes):
        errs = np.asarray(result.single[recipe]) * 100
        left.bar(i, errs.mean(), color=colours[recipe], alpha=0.35, width=0.7)
        left.plot([i] * len(errs), errs, "o", color=colours[recipe], ms=6)
    left.set_xticks(range(len(result.recipes)), result.recipes, rotation=30, ha="right")
    left.set_ylabel("gradient error vs exact FP32 (%)\n(dots: batches; bar: mean)")
    left.grid(alpha=0.3, axis="y")
    ks = np.asarray(result.ks)
    for recipe, label in ((reference, f"{reference} (stochastic rounding)"),
                          (reference + "_no_sr", f"{reference}_no_sr (round to nearest)")):
        if recipe in result.averaged:
            right.plot(ks, np.asarray(result.averaged[recipe]) * 100, "o-", color=colours[recipe], lw=1.8,
                       label=label)
    first = result.averaged[reference][0] * 100
    right.plot(ks, first / np.sqrt(ks), ":", color="#777777", label="1/sqrt(k) from the first point")
    right.set_xscale("log", base=2)
    right.set_xticks(ks, [str(k) for k in ks])
    right.set_ylim(bottom=0)
    right.set_xlabel("k, gradients averaged (log2 axis)")
    right.set_ylabel("error of the mean of k gradients (%)")
    right.grid(alpha=0.3)
    right.legend(fontsize=8, loc="lower left")
    return finish_figure(fig)
