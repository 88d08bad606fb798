import dataclasses
import io
import math

import matplotlib.pyplot as plt
import numpy as np
import pytest

from course_lib import plots
from course_lib.formats import list_formats
from course_lib.studies.formats import measure_training_magnitudes


def test_bit_layout_draws_one_cell_per_bit():
    fig = plots.plot_bit_layouts(["FP16", "FP8 E4M3"])
    ax = fig.axes[0]
    cells = [p for p in ax.patches if p.get_gid() != "field-label"]
    assert len(cells) == 16 + 8
    # a patch as tall as a cell behind each multi-bit field's label (E5, M10, E4, M3), none behind "S"
    behind = [p for p in ax.patches if p.get_gid() == "field-label"]
    assert len(behind) == 4 and all(p.get_height() == cells[0].get_height() for p in behind)
    labels = {t.get_text() for t in ax.texts}
    assert {"FP16", "FP8 E4M3", "E5", "M10", "16 bits"} <= labels


def test_ranges_figure_has_log_axis_and_tensor_rows(small_profile):
    mags = measure_training_magnitudes(small_profile, steps=2)
    fig = plots.plot_format_ranges(["FP16", "BF16"], mags)
    formats_ax, tensors_ax = fig.axes
    assert formats_ax.get_xscale() == "log" and tensors_ax.get_xscale() == "log"
    assert [t.get_text() for t in formats_ax.get_yticklabels()] == ["FP16", "BF16"]
    assert "Adam second moment" in [t.get_text() for t in tensors_ax.get_yticklabels()]
    # the tensors' panel is zoomed to their span, far narrower than the formats' range
    lo, hi = tensors_ax.get_xlim()
    assert hi / lo < 1e40 and formats_ax.get_xlim()[1] / formats_ax.get_xlim()[0] > 1e70
    # stacked, each panel the figure's full width; the tensors' axis starts 2**12 below the lowest of FP16's
    # smallest subnormal and the medians, and what reaches further is cut there, with a triangle
    assert formats_ax.get_position().y0 > tensors_ax.get_position().y1
    medians = [h.quantile(0.5) for h in mags.histograms.values()]
    assert lo == pytest.approx(min(medians + [2.0**-24]) / 2**12)
    cut = [ln for ln in tensors_ax.get_lines() if ln.get_marker() == "<"]
    assert len(cut) == sum(h.min_nonzero < lo for h in mags.histograms.values())
    two = plots.plot_format_ranges(["FP16"], mags, recorded=("GPU", mags))
    assert any("(GPU)" in t.get_text() for t in two.axes[1].get_yticklabels())
    assert len(plots.plot_format_ranges(["FP16"]).axes) == 1
    # FP16's limits cross both panels: one legend names them, under both
    assert [t.get_text() for t in two.legends[0].get_texts()] == [
        "FP16 smallest subnormal", "FP16 smallest normal", "FP16 largest value"]
    assert_legends_clear_of_panels(two)


def test_spacing_figure_one_curve_per_format():
    fig = plots.plot_relative_spacing(["FP32", "FP16"])
    ax = fig.axes[0]
    assert [ln.get_label() for ln in ax.get_lines() if not ln.get_label().startswith("_")] == ["FP32", "FP16"]
    assert len(plots.plot_relative_spacing().axes[0].get_legend().get_texts()) == len(list_formats())
    # TF32 shares FP16's mantissa width: the later of the two is dashed and narrower, so both show
    lines = {ln.get_label(): ln for ln in plots.plot_relative_spacing(["TF32", "FP16"]).axes[0].get_lines()}
    assert lines["FP16 (dashed)"].get_linestyle() == "--" and lines["TF32"].get_linestyle() == "-"
    assert lines["FP16 (dashed)"].get_linewidth() < lines["TF32"].get_linewidth()


def test_gradient_histograms_drawn_to_be_compared_share_both_axes():
    import torch

    early, late = torch.full((100,), 2.0**-10), torch.full((100,), 2.0**-30)
    one = plots.plot_gradient_histogram(late, "FP16", share_with=[early]).axes[0]
    two = plots.plot_gradient_histogram(early, "FP16", share_with=[late]).axes[0]
    assert one.get_xlim() == two.get_xlim() and one.get_ylim() == two.get_ylim()
    alone = plots.plot_gradient_histogram(early, "FP16").axes[0]
    assert alone.get_xlim()[0] > one.get_xlim()[0]          # alone, its axis does not reach 2**-30
    with pytest.raises(TypeError, match="share_with"):
        plots.plot_gradient_histogram(early, "FP16", share_with=late)


def test_layer_figure_shades_where_fp16_flushes_to_zero():
    import torch
    from course_lib.gradients import GradientCapture, LayerGradient

    layers = tuple(LayerGradient(f"l{i}", "activation", i, torch.full((10,), v), 10)
                   for i, v in enumerate((1e-9, 1e-3)))
    fig = plots.plot_layer_gradients(GradientCapture(layers, 1.0), "FP16")
    assert "flushed to 0 in FP16 (at or below 2.98e-08)" in [t.get_text() for t in fig.legends[0].get_texts()]
    assert fig.axes[0].get_xlim()[0] < 1e-9 / 2
    assert fig.axes[0].get_xlim()[1] > 1e-3 * 2                # room past the widest bar: none cut at the frame


def test_spacing_figure_draws_a_shared_smallest_normal_once_in_the_first_formats_colour():
    from matplotlib.colors import to_hex

    ax = plots.plot_relative_spacing(["FP16", "FP8 E5M2"]).axes[0]
    normals = [ln for ln in ax.get_lines() if ln.get_label().startswith("_") and ln.get_linestyle() == ":"]
    assert [to_hex(ln.get_color()) for ln in normals] == [to_hex(plots.format_colour("FP16"))]


def test_a_format_has_one_colour_in_every_figure():
    from matplotlib.colors import to_hex

    # the same formats in different orders and company: each keeps its registry colour
    ranges = plots.plot_format_ranges(["FP8 E4M3", "FP16"]).axes[0]
    assert {to_hex(p.get_facecolor()) for p in ranges.patches} == {
        to_hex(plots.format_colour("FP8 E4M3")), to_hex(plots.format_colour("FP16"))}
    lines = plots.plot_relative_spacing(["FP16", "BF16"]).axes[0].get_lines()
    spacing = {ln.get_label(): to_hex(ln.get_color()) for ln in lines if not ln.get_label().startswith("_")}
    assert spacing == {"FP16": to_hex(plots.format_colour("FP16")), "BF16": to_hex(plots.format_colour("BF16"))}
    colours = [plots.format_colour(f) for f in list_formats()]
    assert len(set(colours)) == len(colours)           # every registered format its own colour
    assert plots.format_colour("fp16") == plots.format_colour("FP16")
    from course_lib.formats import FloatFormat

    mine = FloatFormat("E3M4 mine", 3, 4)              # not registered: a palette colour by its name, stably
    assert plots.format_colour(mine) in plots.FORMAT_COLOURS and plots.format_colour(mine) == plots.format_colour(mine)
    with pytest.raises(ValueError, match="unknown format"):
        plots.format_colour("FP7")


def test_unknown_format_is_an_error():
    with pytest.raises(ValueError, match="unknown format"):
        plots.plot_bit_layouts(["FP7"])


def test_run_differences():
    fig = plots.plot_runs({"ref": [1.0, 2.0, 3.0], "b": [1.5, 2.5, 3.5]}, ylabel="y", title="t", minus="ref")
    lines = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "b"]
    assert list(lines[0].get_ydata()) == [0.5, 0.5, 0.5]
    # runs that coincide stay visible: each its own dash, the earlier ones wider; whole steps on the axis
    fig = plots.plot_runs({"ref": [1.0] * 5, "a": [1.0] * 5, "b": [1.0] * 5, "c": [1.0] * 5}, ylabel="y",
                          title="t", minus="ref")
    runs = [ln for ln in fig.axes[0].get_lines() if ln.get_label() in "abc"]
    assert len({ln.get_linestyle() for ln in runs}) == 3
    assert runs[0].get_linewidth() > runs[1].get_linewidth() > runs[2].get_linewidth()
    assert all(float(t).is_integer() for t in fig.axes[0].get_xticks())
    with pytest.raises(ValueError, match="no run named"):
        plots.plot_runs({"a": [1.0]}, ylabel="y", title="t", minus="z")
    # controls: thin grey lines over the runs, minus the reference too, under one legend entry
    fig = plots.plot_runs({"ref": [1.0, 2.0], "a": [1.0, 2.5]}, ylabel="y", title="t", minus="ref",
                          controls={"c1": [1.0, 2.25], "c2": [1.5, 2.0]}, controls_label="nudged")
    grey = [ln for ln in fig.axes[0].get_lines() if ln.get_color() == "#999999"]
    assert [list(ln.get_ydata()) for ln in grey] == [[0.0, 0.25], [0.5, 0.0]]
    assert all(ln.get_zorder() > 2 and ln.get_linewidth() < 1.4 for ln in grey)
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()].count("nudged") == 1
    with pytest.raises(ValueError, match="controls must be None or a non-empty dict"):
        plots.plot_runs({"a": [1.0]}, ylabel="y", title="t", controls={})


def test_run_marks_ring_skipped_steps_on_the_runs_own_line():
    fig = plots.plot_runs({"ref": [1.0, 2.0, 3.0, 4.0], "a": [1.0, 2.5, 3.0, 4.0], "b": [1.0, 2.0, 3.5, 4.0]},
                          ylabel="y", title="t", minus="ref", marks={"a": [1], "b": [2, 3]})
    rings = [ln for ln in fig.axes[0].get_lines() if ln.get_marker() == "o" and ln.get_linestyle() == "None"]
    # at the step, on the run's line (its difference from ref), in the run's colour
    assert [(list(ln.get_xdata()), list(ln.get_ydata())) for ln in rings] == [([1], [0.5]), ([2, 3], [0.5, 0.0])]
    runs = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert rings[0].get_markeredgecolor() == runs["a"].get_color()
    # one legend entry stands for every run's rings, in none of the runs' colours
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()].count(plots.style.RING_LABEL) == 1
    (key,) = [h for h, t in zip(legend.legend_handles, legend.get_texts()) if t.get_text() == plots.style.RING_LABEL]
    assert key.get_marker() == "o" and key.get_markeredgecolor() not in {runs["a"].get_color(), runs["b"].get_color()}
    # a symlog figure puts the legend under the axes, with the same entry; no marks, no entry
    low = plots.plot_runs({"ref": [1.0, 2.0], "a": [1.0, 9.0]}, ylabel="y", title="t", minus="ref", symlog=0.1,
                          marks={"a": [1]})
    assert [t.get_text() for t in low.legends[0].get_texts()] == ["ref", "a", plots.style.RING_LABEL]
    plain = plots.plot_runs({"a": [1.0, 2.0]}, ylabel="y", title="t")
    assert plots.style.RING_LABEL not in [t.get_text() for t in plain.axes[0].get_legend().get_texts()]
    # with smoothing, a step before the first smoothed point has no point to ring
    fig = plots.plot_runs({"a": [1.0, 2.0, 3.0]}, ylabel="y", title="t", smooth=2, marks={"a": [0, 2]})
    (ring,) = [ln for ln in fig.axes[0].get_lines() if ln.get_linestyle() == "None"]
    assert list(ring.get_xdata()) == [2] and list(ring.get_ydata()) == [2.5]
    for bad, match in (({"z": [0]}, "marks must map drawn runs"), ({"ref": [0]}, "marks must map drawn runs"),
                       ({"a": [4]}, r"marks of 'a' must be steps 0 to 3"), ({"a": [True]}, "marks of 'a'")):
        with pytest.raises(ValueError, match=match):
            plots.plot_runs({"ref": [1.0] * 4, "a": [1.0] * 4}, ylabel="y", title="t", minus="ref", marks=bad)


def test_run_differences_on_a_symlog_axis_keep_small_differences_readable():
    fig = plots.plot_runs({"ref": [1.0] * 4, "a": [1.01, 0.98, 1.0, 1.4]}, ylabel="y", title="t", minus="ref",
                          symlog=0.05)
    ax = fig.axes[0]
    assert ax.get_yscale() == "symlog"
    ticks = list(ax.get_yticks())
    # halves of the threshold inside the linear band, then the threshold's 1, 2, 5 multiples to the data's top
    assert {0.0, 0.025, -0.025, 0.05, 0.1, 0.25} <= {round(t, 6) for t in ticks} and max(ticks) <= ax.get_ylim()[1]
    assert {"+0.025", "\u22120.025"} <= {t.get_text() for t in ax.get_yticklabels()}   # a true minus sign
    assert fig.legends and ax.get_legend() is None           # the legend under the axes, covering no line
    for bad in (0, -1.0, math.inf, True, "0.1"):
        with pytest.raises(ValueError, match="symlog must be None or a positive finite threshold"):
            plots.plot_runs({"a": [1.0]}, ylabel="y", title="t", symlog=bad)
    with pytest.raises(ValueError, match="two y scales"):
        plots.plot_runs({"a": [1.0]}, ylabel="y", title="t", logy=True, symlog=0.1)


def test_throughput_plot_takes_single_seed_rows_and_old_records():
    from course_lib import plots

    one = {"recipe": "fp32", "compiled": True, "seeds": 1, "step_ms": 3.3, "step_ms_range": (3.3, 3.3),
           "tokens_per_s": 1e6 / 3.3, "tokens_per_s_range": (1e6 / 3.3, 1e6 / 3.3), "mfu": None}
    old = {k: v for k, v in one.items() if k != "tokens_per_s_range"}  # a record from before the range existed
    fig = plots.plot_throughput({"a": [one], "b": [old]})
    assert len(fig.axes) == 2
    # one seed has no range: no whiskers, and its label says so
    assert fig.axes[0].containers[1:] == [] and fig.axes[0].get_yticklabels()[0].get_text() == "fp32 + compile (1 seed)"
    three = {**one, "compiled": False, "seeds": 3, "tokens_per_s_range": (2e5, 4e5)}
    fig = plots.plot_throughput({"a": [three, one]})
    bars, whiskers = fig.axes[0].containers
    assert len(bars) == 2 and len(whiskers.lines[2][0].get_segments()) == 1   # one range, for the 3-seed row
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["fp32", "fp32 + compile (1 seed)"]
    # each bar in its dtype's colour, as lesson 6's other figures draw that dtype; a compiled run hatched
    from matplotlib.colors import to_hex
    bf16 = {**three, "recipe": "bf16_autocast"}
    (bars, _) = plots.plot_throughput({"a": [bf16, one]}).axes[0].containers
    assert [to_hex(b.get_facecolor(), keep_alpha=False) for b in bars] == ["#0072b2", "#000000"]
    assert [b.get_hatch() for b in bars] in (["", "///"], [None, "///"])


# ---- lesson 7 -----------------------------------------------------------------------------------------

def test_fp8_figures_draw_their_data():
    import torch

    from course_lib import fp8
    from course_lib.studies import fp8 as fp8_studies

    x = torch.randn(64, 64)
    g = torch.randn(64, 64) * 1e-6
    lab = fp8_studies.scaling_lab({"x": x, "g": g}, fp8_studies.lab_recipes(32))
    ax = plots.plot_scaling_lab(lab).axes[0]
    assert len(ax.patches) == 2 * len(lab.recipes) and ax.get_yscale() == "log"
    assert any("flushed" in t.get_text() for t in ax.texts)   # the unscaled gradient is labelled
    sweep = fp8_studies.outlier_sweep(x, {"t": fp8.CurrentScaling()}, factors=(1, 10))
    fig = plots.plot_outlier_sweep(sweep)
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["t"] and fig.axes[1].get_yscale() == "log"
    run = fp8_studies.delayed_spike(x, steps=6, spike_at=2, amax_history_len=4)
    fig = plots.plot_delayed_spike(run)
    assert len(fig.axes) == 3
    assert len([ln for ln in fig.axes[1].get_lines() if not ln.get_label().startswith("_")]) == 3
    # both log panels start at a labelled tick at or below their lowest point, so the quiet level can be read
    lowest = {0: min(run.amax), 2: min(min(e) for e in run.relative_error.values())}
    for index, low in lowest.items():
        ax = fig.axes[index]
        fig.canvas.draw()
        lo, hi = ax.get_ylim()
        labelled = [y for t in ax.get_yticklabels() if t.get_text() and lo <= (y := t.get_position()[1]) <= hi]
        assert lo <= low and min(labelled) <= low, index
    # the saturated share: linear up to 0.1% and log above, so 0% draws and 0.2% lies visibly off it
    middle = fig.axes[1]
    assert middle.get_yscale() == "symlog" and middle.get_ylim()[0] == 0
    to_pixels = middle.transData.transform
    zero, fifth, hundred = (to_pixels((0, v))[1] for v in (0.0, 0.2, 100.0))
    assert (fifth - zero) > 0.1 * (hundred - zero)
    assert [plots.fp8.tick_floor(v) for v in (0.03, 0.02, 7.0, 1.0, 0.0099)] == [0.02, 0.02, 5.0, 1.0, 0.005]
    with pytest.raises(ValueError, match="positive"):
        plots.fp8.tick_floor(0.0)
    study = fp8.accumulation_error((128, 256), dots=4)
    fig = plots.plot_accumulation({"a": study, "b": study})
    assert len(fig.axes) == 2
    # the FP32 accumulator's exact sums (error 0) are left out, not drawn at a floor
    assert len(fig.axes[0].containers) == 2
    est = {"tw": [fp8.predict_fp8_linear(n, n, n, bf16_tflops=1, fp8_tflops=2, bandwidth_gbs=1) for n in (16, 32)]}
    labels = [ln.get_label() for ln in plots.plot_fp8_speedup(est, measured={"rec": {16: 1.2}}).axes[0].get_lines()]
    assert "tw" in labels and "rec" in labels


def test_fp8_training_figure_draws_differences_and_refuses_unknown_reference():
    from course_lib.studies.fp8 import Fp8Training

    res = Fp8Training(("a", "b"), (0, 1), 3, 32, {"a": ((3.0, 2.0, 1.0), (3.0, 2.0, 1.5)),
                                                  "b": ((3.0, 2.5, 1.2), (3.0, 2.0, 1.5))})
    fig = plots.plot_fp8_training(res, reference="a", tail=1)
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label() == "b")
    assert list(line.get_ydata()) == pytest.approx([3.0, 2.25, 1.35])
    dots = [ln for ln in fig.axes[1].get_lines() if ln.get_marker() == "o"]
    assert list(dots[0].get_xdata()) == pytest.approx([0.2, 0.0])   # a row per recipe, the difference across
    with pytest.raises(ValueError, match="no recipe"):
        plots.plot_fp8_training(res, reference="c")



def test_seeded_runs_take_other_finals_and_keep_colliding_names_apart():
    from course_lib.studies.fp8 import Fp8Training

    curves = {k: ((3.0, 2.0), (3.0, 2.5)) for k in ("FP32", "BF16 one", "BF16 two")}
    res = Fp8Training(tuple(curves), (0, 1), 2, 16, curves)
    fig = plots.plot_seeded_runs(res, reference="FP32", finals={"FP32": (1.0, 2.0), "BF16 one": (1.5, 2.0),
                                                                "BF16 two": (1.0, 1.0)}, final_label="eval")
    dots = [ln for ln in fig.axes[1].get_lines() if ln.get_marker() == "o"]
    assert [list(d.get_xdata()) for d in dots] == [[0.5, 0.0], [0.0, -1.0]]
    # each seed a step below the one before, centred on its row: equal values stay two dots
    step = plots.style.SEED_ROW_STEP
    assert [list(d.get_ydata()) for d in dots] == [[-step / 2, step / 2], [1 - step / 2, 1 + step / 2]]
    # the outermost dots (at -1.0 and +0.5) lie inside the panel with room to spare, not cut by its edges
    lo, hi = fig.axes[1].get_xlim()
    assert lo < -1.0 - 0.1 * 1.5 and hi > 0.5 + 0.1 * 1.5
    assert fig.axes[1].get_xlabel().startswith("eval minus FP32's")
    # each row named on one line inside the panel, above its dots (ticks carry no text)
    assert [t.get_text() for t in fig.axes[1].texts if t.get_gid() == "row-label"] == ["BF16 one", "BF16 two"]
    assert all(not t.get_text() for t in fig.axes[1].get_yticklabels())
    colours = {ln.get_label(): ln.get_color() for ln in fig.axes[0].get_lines()}
    assert len(set(colours.values())) == 3        # "bf16" in both names must not paint them alike
    assert [colours["BF16 one"], colours["BF16 two"]] == list(plots.style.SEEDED_COLOURS[:2])
    # lesson 5's four BF16 rules get four hues: not both of the palette's blues
    assert len({"#0072B2", "#56B4E9"} & set(plots.style.SEEDED_COLOURS[:4])) == 1
    # the reference is drawn wide and underneath, so a recipe that runs on it leaves it visible at its edges
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert lines["FP32"].get_linewidth() > 2 * lines["BF16 one"].get_linewidth()
    assert lines["FP32"].get_zorder() < lines["BF16 one"].get_zorder()
    with pytest.raises(ValueError, match="finals has no values for BF16 two"):
        plots.plot_seeded_runs(res, reference="FP32", finals={"FP32": (1.0, 2.0), "BF16 one": (1.0, 1.0)})


def test_a_long_row_name_ends_inside_the_seeded_panel():
    # lesson 5's case: the zero line in the panel's left part, a long name starting right of it
    from course_lib.studies.fp8 import Fp8Training

    names = ("FP32", "BF16 + FP32 master weights", "BF16, round to nearest (no master)", "BF16, stochastic rounding",
             "BF16, Kahan-compensated")
    curves = {k: ((3.0, 2.0), (3.0, 2.5)) for k in names}
    finals = {"FP32": (1.0, 1.0), names[1]: (1.0, 1.0), names[2]: (1.045, 1.046), names[3]: (0.999, 1.001),
              names[4]: (1.0, 1.0)}
    fig = plots.plot_seeded_runs(Fp8Training(names, (0, 1), 2, 16, curves), reference="FP32", finals=finals,
                                 final_label="evaluation loss (FP32 arithmetic)")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    FigureCanvasAgg(fig)   # drawn as the page saves it
    fig.savefig(io.BytesIO(), format="png", bbox_inches="tight")
    renderer = fig.canvas.get_renderer()
    panel = fig.axes[1].get_window_extent(renderer)
    labels = [t for t in fig.axes[1].texts if t.get_gid() == "row-label"]
    assert len(labels) == 4 and all(t.get_window_extent(renderer).x1 <= panel.x1 + 1 for t in labels)

def assert_legends_clear_of_panels(fig):
    """Every figure-level legend lies below every panel, its labels and ticks included."""
    for legend in fig.legends:
        box = legend.get_window_extent()
        for ax in fig.axes:
            if ax.get_visible():
                assert box.y1 <= ax.get_tightbbox().y0 + 1, (ax.get_title(), box, ax.get_tightbbox())


def test_a_figure_legend_gets_room_under_the_panels():
    fig, axes = plt.subplots(1, 2, figsize=(8.5, 3))
    for i in range(7):
        axes[0].plot([0, 1], [i, i], label=f"a fairly long series name {i}")
    fig.legend(*axes[0].get_legend_handles_labels(), loc="lower center", ncol=2)
    plots.style.finish_figure(fig)
    assert_legends_clear_of_panels(fig)


def test_figures_render_at_high_resolution():
    import io

    from matplotlib.image import imread
    fig = plots.plot_relative_spacing(["FP16"])
    assert fig.dpi == plots.FIGURE_DPI
    from IPython.core.pylabtools import print_figure
    png = print_figure(fig, "png")   # what Jupyter and the book store
    width = imread(io.BytesIO(png)).shape[1]
    assert width >= fig.get_figwidth() * plots.FIGURE_DPI * 0.8


# ---- lesson 8 -----------------------------------------------------------------------------------------

def test_microscaling_figures_draw_their_data():
    import torch

    from course_lib.studies import microscaling as mx_studies

    torch.manual_seed(0)
    x = torch.randn(32, 64)
    outlier = x.clone()
    outlier[:, 0] *= 100.0
    study = mx_studies.block_size_study({"activation": x, "activation + outlier": outlier},
                                        elements=("e4m3", "e2m1"), blocks=(1, 32, -1), skip_columns={
                                            "activation + outlier": (0,)})
    fig = plots.plot_block_sizes(study)
    # E4M3's errors span less than a factor of two: a linear axis; E2M1's more: a log one, labelled in percent
    e4m3_errors = [e.relative_error for t in study.tensors for e in study.errors["e4m3"][t].values()]
    assert max(e4m3_errors) / min(e4m3_errors) < 2
    assert len(fig.axes) == 2 and fig.axes[0].get_yscale() == "linear" and fig.axes[1].get_yscale() == "log"
    fig.canvas.draw()
    for ax in fig.axes:
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
        assert len(labels) >= 3 and all(label.endswith("%") for label in labels)
        # one format per axis: every label with the same decimals (not 2.6% beside 2.63%)
        assert len({len(label.split(".")[1]) if "." in label else 0 for label in labels}) == 1, labels
        assert ax.get_xlim()[1] >= len(study.blocks) - 0.5   # room for the "whole tensor" label
        assert "evenly spaced" in ax.get_xlabel()
    assert "log axis" in fig.axes[1].get_ylabel() and "linear axis" in fig.axes[0].get_ylabel()
    lines = {ln.get_label(): ln for ln in fig.axes[1].get_lines()}
    assert lines["activation + outlier"].get_linestyle() == "--" and lines["activation"].get_linestyle() == "-"
    # the dashed line drawn over the solid one, open: where the two coincide both stay visible
    assert lines["activation + outlier"].get_zorder() > lines["activation"].get_zorder()
    assert lines["activation + outlier"].get_markerfacecolor() == "none"
    assert list(lines["activation"].get_ydata()) == pytest.approx(
        [study.errors["e2m1"]["activation"][b].relative_error for b in study.blocks])
    # one legend names the tensors of both panels, under them, overlapping neither
    assert [t.get_text() for t in fig.legends[0].get_texts()] == list(study.tensors)
    assert_legends_clear_of_panels(fig)
    # two models, two batches each; nvfp4_no_sr is nvfp4 without stochastic rounding
    fid = mx_studies.GradientFidelity(
        ("nvfp4", "nvfp4_no_sr"), (0, 1), 1, 2, 2, (1, 2),
        {"nvfp4": ((0.1, 0.2), (0.3, 0.2)), "nvfp4_no_sr": ((0.1, 0.3), (0.2, 0.25))},
        {"nvfp4": ((0.01, 0.01), (0.01, 0.01)), "nvfp4_no_sr": ((0.0, 0.0), (0.0, 0.0))},
        {"nvfp4": ((0.15, 0.1), (0.25, 0.2)), "nvfp4_no_sr": ((0.2, 0.2), (0.2, 0.2))})
    fig = plots.plot_gradient_fidelity(fid)
    left, middle, right = fig.axes
    assert len(left.patches) == 2
    assert left.patches[1].get_height() == pytest.approx(21.25)    # nvfp4_no_sr's mean over models and batches, %
    # a marker per model and batch, its shape the model's: nvfp4_no_sr's batches of model 0, then of model 1
    markers = [ln for ln in left.get_lines() if ln.get_label().startswith("_")]
    assert [list(ln.get_ydata()) for ln in markers[2:]] == [pytest.approx([10.0, 30.0]), pytest.approx([20.0, 25.0])]
    assert markers[2].get_marker() != markers[3].get_marker()
    assert [t.get_text() for t in left.get_legend().get_texts()] == ["model seed 0", "model seed 1"]
    # the middle panel: removing stochastic rounding, in points per model and batch, its bar at the mean
    assert [t.get_text() for t in middle.get_yticklabels()] == ["NVFP4:\nstochastic rounding"]
    assert middle.patches[0].get_width() == pytest.approx(1.25)     # a row per piece: the bar runs across
    assert [list(ln.get_xdata()) for ln in middle.get_lines() if ln.get_marker() not in ("None", "")] == [
        pytest.approx([0.0, 10.0]), pytest.approx([-10.0, 5.0])]
    right_lines = {ln.get_label(): list(ln.get_ydata()) for ln in right.get_lines()}
    assert right_lines["nvfp4\n(stochastic rounding)"] == pytest.approx([20.0, 15.0])
    assert right_lines["nvfp4_no_sr\n(round to nearest)"] == pytest.approx([20.0, 20.0])
    # one panel per row, and no text under 12 points: three side by side read at 7 to 8 pixels on the page
    assert left.get_position().y0 > middle.get_position().y0 > right.get_position().y0
    assert [t.get_text() for t in fig.legends[0].get_texts()][0] == "nvfp4\n(stochastic rounding)"
    assert_legends_clear_of_panels(fig)
    assert min(t.get_fontsize() for t in fig.findobj(plt.Text) if t.get_text()) >= 12
    with pytest.raises(ValueError, match="no recipe"):
        plots.plot_gradient_fidelity(fid, reference="mxfp4")


# ---- lesson 9 -----------------------------------------------------------------------------------------

def test_monitoring_figures_draw_their_data():
    from course_lib import monitor as mon
    from course_lib.monitor import recovery
    from course_lib.studies import monitoring as monitoring_studies

    log_a = mon.MonitorLog(steps=[0, 1, 2], losses=[3.0, float("nan"), float("nan")], scales=[4.0, 2.0, 1.0],
                           skipped=[False, True, True])
    log_b = mon.MonitorLog(steps=[0, 1, 0, 1, 2], losses=[3.0, float("nan"), 3.0, 2.5, 2.0],
                           scales=[4.0, 4.0, 1.0, 1.0, 1.0], skipped=[False, True, False, False, False])
    alert = mon.Alert(1, "non_finite_loss", None, "m")
    demo = monitoring_studies.RecoveryDemo(1, 3, log_a, (alert,), log_b, (recovery.RecoveryEvent(1, 0, alert, "bf16_autocast"),))
    fig = plots.plot_recovery(demo)
    top = fig.axes[0]
    marks = [ln for ln in top.get_lines() if ln.get_marker() == "x"]
    assert len(marks) == 2 and list(marks[0].get_xdata()) == [1, 2]     # the no-recovery run's bad steps
    assert fig.axes[1].get_yscale() == "log"
    assert any("rolled back to 0" in t.get_text() for t in top.texts)
    # the abandoned attempt (steps 0-1 before the rollback to 0) is faded in every panel, the rest is not
    for ax in fig.axes:
        faded = [ln for ln in ax.get_lines() if (ln.get_alpha() or 1.0) < 1]
        assert [list(ln.get_xdata()) for ln in faded] == ([[1]] if ax is fig.axes[2] else [[0, 1]]), ax
    solid = [ln for ln in fig.axes[1].get_lines() if ln.get_color() == "#0072B2" and ln.get_alpha() is None]
    assert [list(ln.get_xdata()) for ln in solid] == [[0, 1, 2]]
    # scales drawn as a staircase: a fall shows at the first step that used the lower scale
    scale_lines = [ln for ln in fig.axes[1].get_lines() if ln.get_marker() == "o" and ln.get_linestyle() == "-"]
    assert scale_lines and all(ln.get_drawstyle() == "steps-post" for ln in scale_lines)
    assert "abandoned attempt, rolled back" in [t.get_text() for t in fig.legends[0].get_texts()]
    assert_legends_clear_of_panels(fig)   # the legend under the panels covers no step of either run
    assert not fig.axes[1].texts          # the last scale (1) has its tick
    # a last scale below the lowest tick is named where the line ends
    low = mon.MonitorLog(steps=[0, 1, 2], losses=[3.0, float("nan"), float("nan")], scales=[4.0, 2.0, 0.125],
                         skipped=[False, True, True])
    fig = plots.plot_recovery(monitoring_studies.RecoveryDemo(1, 3, low, (alert,), log_b, demo.events))
    assert min(fig.axes[1].get_yticks()) > 0.125 and [t.get_text() for t in fig.axes[1].texts] == ["0.125"]
    trend = monitoring_studies.UnderflowTrend("FP16", (0, 5), {"a": (0.1, 0.2), "b": (0.0, 0.0), "c": (0.3, 0.3)}, (3.0, 2.0), ())
    fig = plots.plot_underflow_trend(trend, top_n=2)
    assert [ln.get_label() for ln in fig.axes[0].get_lines()] == ["c", "a"]
    assert list(fig.axes[0].get_lines()[1].get_ydata()) == pytest.approx([10.0, 20.0])
    # series that run close together differ in marker and dash, not in colour alone
    c, a = fig.axes[0].get_lines()
    assert c.get_marker() != a.get_marker() and c.get_linestyle() != a.get_linestyle()
    # the legend sits under the panels, where it covers no line
    assert fig.axes[0].get_legend() is None and [t.get_text() for t in fig.legends[0].get_texts()] == ["c", "a"]
    assert_legends_clear_of_panels(fig)


def test_loss_against_time_colours_recipes_by_dtype_and_dashes_each():
    runs = [((0.1, 0.1, 0.1), (3.0, 2.5, 2.0))] * 2
    fig = plots.plot_loss_against_time({"GPU": {"fp32": runs, "tf32": runs, "bf16_autocast": runs,
                                                "fp16_autocast_scaler": runs}}, target={"GPU": 2.2})
    first = {ln.get_label(): ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")}
    colours = {k.split(" ")[0]: ln.get_color() for k, ln in first.items() if k != "target loss"}
    assert colours == {"fp32": "#000000", "tf32": "#999999", "bf16_autocast": "#0072B2",
                       "fp16_autocast_scaler": "#D55E00"}
    styles = [ln.get_linestyle() for k, ln in first.items() if k != "target loss"]
    assert len(set(styles)) == 4 and first["target loss"].get_linewidth() < min(
        ln.get_linewidth() for k, ln in first.items() if k not in ("target loss",))
    # each run's measured time to the target is a tick on the target line, in its recipe's colour
    fig = plots.plot_loss_against_time({"GPU": {"fp32": runs}}, target={"GPU": 2.2},
                                       times={"GPU": {"fp32": [0.25, None]}})
    ticks = [ln for ln in fig.axes[0].get_lines() if ln.get_marker() == "|" and len(ln.get_xdata())]
    assert len(ticks) == 1 and list(ticks[0].get_xdata()) == [0.25] and list(ticks[0].get_ydata()) == [2.2]
    assert ticks[0].get_color() == "#000000"
    # two recipes that reach the target at the same time: both ticks visible, one above the other
    fig = plots.plot_loss_against_time({"CPU": {"fp32": runs, "bf16_autocast": runs}}, target={"CPU": 2.2},
                                       times={"CPU": {"fp32": [20.45], "bf16_autocast": [20.45]}})
    ticks = [ln for ln in fig.axes[0].get_lines() if ln.get_marker() == "|" and len(ln.get_xdata())]
    fig.canvas.draw()
    at = [ln.get_transform().transform((20.45, 2.2)) for ln in ticks]
    assert len(ticks) == 2 and at[0][0] == pytest.approx(at[1][0])
    gap = abs(at[0][1] - at[1][1]) * 72 / fig.dpi   # points
    assert gap >= ticks[0].get_markersize() - 1e-9


def test_loss_against_time_draws_the_measure_its_ticks_mark():
    from course_lib.studies.performance import RecipeRun

    # a noisy run: a single step dips below the target long before the mean of five steps does
    losses = (3.0, 2.9, 2.1, 2.8, 2.7, 2.6, 2.5, 2.3, 2.2, 2.1, 2.0, 2.0)
    run = RecipeRun("fp32", 0, False, losses, tuple([0.5] * len(losses)), 64, 0)
    target = 2.3
    reached = run.seconds_to_loss(target)
    fig = plots.plot_loss_against_time({"CPU": {"fp32": [(run.step_seconds, run.losses)]}}, target={"CPU": target},
                                       times={"CPU": {"fp32": [reached]}})
    curve = next(ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("fp32"))
    x, y = np.asarray(curve.get_xdata()), np.asarray(curve.get_ydata())
    assert x[np.flatnonzero(y <= target)[0]] == pytest.approx(reached)   # the tick sits where the curve crosses
    assert "mean of the last 5 steps" in fig.axes[0].get_ylabel()
    with pytest.raises(ValueError, match="window"):
        plots.plot_loss_against_time({"CPU": {}}, window=0)


def test_matmul_throughput_keeps_every_hollow_marker_off_the_filled_ones():
    import math

    from course_lib.plots.performance import misaligned_x
    dtypes = ("fp32", "bf16", "fp16", "fp8")
    # equal throughput for every dtype: the worst case for hiding
    panel = {d: {n: 1.0 for n in (64, 127, 128, 255, 256, 511, 512) if d != "fp8" or n % 8 == 0} for d in dtypes}
    fig = plots.plot_matmul_throughput({"live": panel})
    lines = [ln for ln in fig.axes[0].get_lines() if len(ln.get_xdata())]
    filled = [x for ln in lines if ln.get_markerfacecolor() != "none" for x in ln.get_xdata()]
    hollow = [x for ln in lines if ln.get_markerfacecolor() == "none" for x in ln.get_xdata()]
    assert len(hollow) == 9 and filled
    # at least 0.1 log2 units from every filled marker and from each other
    assert min(abs(math.log2(h) - math.log2(f)) for h in hollow for f in filled) >= 0.1
    assert min(abs(math.log2(a) - math.log2(b)) for i, a in enumerate(hollow) for b in hollow[i + 1:]) >= 0.05
    assert misaligned_x(127, 0) < 128 and misaligned_x(127, 3) > 64
    with pytest.raises(ValueError, match="index"):
        misaligned_x(127, 8)


def test_dashboard_draws_each_panel_and_groups_alerts():
    from course_lib import monitor as mon

    stats = lambda z: (mon.GradientStats("a", 4, z, 0, 0, 0, 0, 1.0), mon.GradientStats("b", 4, 0.0, 0, 0, 0, 0, 1.0))  # noqa: E731
    log = mon.MonitorLog(steps=[0, 1, 2, 3], losses=[3.0, 2.5, 2.0, 1.8], scales=[4.0, 2.0, 2.0, 2.0],
                         skipped=[False, True, False, False], sampled_steps=[0, 2],
                         gradients=[stats(0.0), stats(1.0)])
    alerts = (mon.Alert(2, "zero_gradients", "a", "m"), mon.Alert(2, "zero_gradients", "b", "m"))
    fig = plots.plot_dashboard(log, alerts, mark_step=2)
    assert len(fig.axes) == 4 and fig.axes[1].get_yscale() == "log"
    assert list(fig.axes[1].get_lines()[0].get_ydata()) == [4.0, 2.0, 2.0, 2.0]
    layer_lines = {ln.get_label(): ln for ln in fig.axes[3].get_lines() if not ln.get_label().startswith("_")}
    assert list(layer_lines["a"].get_ydata()) == pytest.approx([0.0, 100.0])
    assert list(layer_lines["b"].get_ydata()) == pytest.approx([0.0, 0.0])
    # two series that differ are told apart by marker and dash, not by colour alone
    assert layer_lines["a"].get_marker() != layer_lines["b"].get_marker()
    assert layer_lines["a"].get_linestyle() != layer_lines["b"].get_linestyle()
    assert [t.get_text() for t in fig.axes[3].texts] == ["alert: zero_gradients\n(2 parameters)"]
    # the alert's marker hangs inside the panel, under its top edge, not half above it
    marker = next(ln for ln in fig.axes[3].get_lines() if ln.get_marker() == "v" and ln.get_label().startswith("_"))
    fig.canvas.draw()
    top = fig.axes[3].get_window_extent().y1
    centre = marker.get_transform().transform((2, 1.0))[1]
    half = marker.get_markersize() / 2 * fig.dpi / 72
    assert centre + half <= top + 0.5
    assert list(fig.axes[2].get_lines()[0].get_xdata()) == [1]        # the skipped step
    # nothing left out, so no note: only the planted fault's line is named
    assert [t.get_text() for t in fig.axes[0].texts] == [" fault starts"]
    assert not plots.plot_dashboard(log, alerts).axes[0].texts


def test_dashboard_leaves_out_empty_panels_and_draws_identical_series_once():
    from course_lib import monitor as mon

    same = lambda z: tuple(mon.GradientStats(n, 4, z, 0, 0, 0, 0, 1.0) for n in ("a", "b", "c"))  # noqa: E731
    log = mon.MonitorLog(steps=[0, 1, 2], losses=[3.0, 2.5, 2.0], scales=[1.0] * 3, skipped=[False] * 3,
                         sampled_steps=[0, 2], gradients=[same(0.0), same(1.0)])
    fig = plots.plot_dashboard(log, top_n=3)
    # an unchanging scale and no skipped step get no panel of their own; a note on the loss panel says so
    assert len(fig.axes) == 2
    assert [t.get_text() for t in fig.axes[0].texts] == ["loss scale 1 at every step; no step skipped"]
    lines = [ln for ln in fig.axes[1].get_lines() if not ln.get_label().startswith("_")]
    assert len(lines) == 1 and lines[0].get_label() == "3 identical series:\na\nb\nc"
    assert list(lines[0].get_ydata()) == pytest.approx([0.0, 100.0])
    # a sample holds until the next one: no slope through the unsampled step 1 draws a value nobody measured
    assert lines[0].get_drawstyle() == "steps-post"
    skipping = mon.MonitorLog(steps=[0, 1], losses=[3.0, 3.0], scales=[2.0, 2.0], skipped=[True, False])
    fig = plots.plot_dashboard(skipping)
    assert len(fig.axes) == 3 and [t.get_text() for t in fig.axes[0].texts] == ["loss scale 2 at every step"]
    assert [t.get_text() for t in fig.axes[2].texts] == ["no gradients sampled"]
    with pytest.raises(ValueError, match="top_n"):
        plots.plot_dashboard(log, top_n=0)


def test_distributed_figures_draw_every_variant_and_rank():
    from course_lib.distributed import REDUCTION_VARIANTS
    from course_lib.studies.distributed import DataParallelStudy, ReductionStudy, ScalerCase

    n = (2, 8)
    study = ReductionStudy(n, {k: (1e-3, 2e-3) for k in REDUCTION_VARIANTS}, {k: (0.01, 0.2) for k in REDUCTION_VARIANTS},
                           (1e-3, 1e-3), (0.0, 0.0), 0.01, 10, 2, 1e-3)
    fig = plots.plot_reduction_precision(study)
    err, off = fig.axes
    assert len(err.lines) == len(REDUCTION_VARIANTS) + 1 and len(off.lines) == len(REDUCTION_VARIANTS)
    assert err.get_yscale() == "log" and off.lines[1].get_ydata()[1] == 20.0     # shares drawn in %
    assert_legends_clear_of_panels(fig)
    # the two FP16 lines can coincide: the dotted one's hollow circles are larger than the solid one's filled
    fp16 = {line.get_label(): line for line in err.lines if line.get_label().startswith("FP16")}
    solid, dotted = fp16["FP16, ring, /N first (DDP hook)"], fp16["FP16, ring, /~sqrt(N) first (FSDP2)"]
    assert dotted.get_markerfacecolor() == "none" and dotted.get_markersize() > 1.5 * solid.get_markersize()
    case = ScalerCase({0: (), 1: (1,)}, {0: (4.0, 4.0, 4.0), 1: (4.0, 4.0, 2.0)}, False, {0: False, 1: True})
    dp = DataParallelStudy(2, "gloo", "cpu", "small", 3, 1, 10, {}, {}, {"a": case, "b": case}, {}, {}, {}, {}, 0.0)
    fig = plots.plot_rank_scales(dp)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 5 - 3 and len(visible[0].lines) == 5   # per rank a step line and its own skips; all
    own, every = visible[0].lines[3], visible[0].lines[4]
    assert list(own.get_xdata()) == [1] and list(every.get_xdata()) == []   # rank 1 alone skipped step 1
    both = ScalerCase({0: (0, 2), 1: (0,)}, {0: (4.0, 2.0, 2.0), 1: (4.0, 2.0, 2.0)}, True, {0: True, 1: True})
    lines = plots.plot_rank_scales(dataclasses.replace(dp, scaler_cases={"both": both})).axes[0].lines
    # a step every rank skipped is one filled circle, not an x and a + drawn over each other
    assert list(lines[4].get_xdata()) == [0] and lines[4].get_marker() == "o"
    assert list(lines[1].get_xdata()) == [2] and list(lines[3].get_xdata()) == []
    assert any("rank 0: weights not finite" in t.get_text() for t in visible[0].texts)
    assert_legends_clear_of_panels(fig)
    five = plots.plot_rank_scales(dataclasses.replace(dp, scaler_cases={k: case for k in "abcde"}))
    assert five.get_figwidth() <= 6.5                   # two panels a row: readable at the book's column
    spare = [ax for ax in five.axes if ax.get_legend() is not None]
    assert len(spare) == 1 and not spare[0].axison      # the grid's empty slot holds the legend
    names = [t.get_text() for t in spare[0].get_legend().get_texts()]
    assert names[:2] == ["the step the inf was planted at", "rank 0"]
    # only rank 1 skipped alone and no step was skipped by all: the legend names only the marks drawn
    assert "only rank 1 skipped the step" in names and "only rank 0 skipped the step" not in names
    assert "every rank skipped the step" not in names


def test_wide_figures_get_text_that_reads_at_the_column_size():
    import matplotlib.pyplot as plt

    from course_lib.plots.style import COLUMN_INCHES, MIN_FONT_POINTS, finish_figure, scale_text_to_column

    fig, (left, right) = plt.subplots(1, 2, figsize=(2 * COLUMN_INCHES, 4))
    left.set_title("t", fontsize=10)
    left.plot([1, 2], label="a")
    left.legend(fontsize=8)
    right.set_yscale("log")
    right.plot([1, 100])
    finish_figure(fig)
    fig.canvas.draw()   # ticks made at draw time must take the scaled size too
    assert left.title.get_fontsize() == pytest.approx(20.0)
    # the legend's 8 points, raised to the floor first, then doubled
    assert left.get_legend().get_texts()[0].get_fontsize() == pytest.approx(2 * max(8.0, MIN_FONT_POINTS))
    sizes = [t.get_fontsize() for t in left.get_xticklabels() + right.get_yticklabels(minor=True)]
    assert sizes and sizes == pytest.approx([2 * plt.rcParams["font.size"]] * len(sizes))
    narrow, ax = plt.subplots(figsize=(COLUMN_INCHES / 2, 3))
    ax.set_title("n", fontsize=10)
    assert scale_text_to_column(narrow) == 1.0 and ax.title.get_fontsize() == 10.0
    with pytest.raises(ValueError, match="column_inches"):
        scale_text_to_column(narrow, 0)
    plt.close("all")


def test_no_figure_text_is_smaller_than_the_floor():
    import matplotlib.pyplot as plt

    from course_lib.plots.style import MIN_FONT_POINTS, finish_figure

    fig, ax = plt.subplots(figsize=(6, 3))
    ax.plot([1, 2], label="a line")
    ax.legend(fontsize=6)
    note = ax.text(0, 0, "a note", fontsize=7)
    title = ax.set_title("a title", fontsize=12)
    finish_figure(fig)
    assert ax.get_legend().get_texts()[0].get_fontsize() == MIN_FONT_POINTS == note.get_fontsize()
    assert title.get_fontsize() == 12   # larger text is left alone


def test_roofline_labels_nearby_operations_once():
    from course_lib.bench import OpCost

    ops = [OpCost("a", 1.0, 1.0), OpCost("b", 2.0, 1.0), OpCost("qkv", 283.0, 1.0), OpCost("mlp", 301.5, 1.0)]
    fig = plots.plot_roofline(ops, {"device": (1.0, 50.0)})
    ax = fig.axes[0]
    numbers = sorted(t.get_text() for t in ax.texts if t.get_text().isdigit())
    assert numbers == ["1", "2", "3"]                      # 283 and 301.5 share the third label
    key = [t.get_text() for t in fig.legends[0].get_texts() if t.get_text()[:1].isdigit()]
    assert key == ["1: a (memory)", "2: b (memory)", "3: qkv / mlp (compute)"]
    assert not [t for t in ax.texts if not t.get_text().isdigit()]   # nothing but the numbers inside the axes
    assert len([ln for ln in ax.get_lines() if ln.get_marker() in ("o", "s") and len(ln.get_xdata()) == 1]) == 4
    # two operations within 25% of each other but on both sides of the ridge (300) keep their own labels
    split = plots.plot_roofline([OpCost("qkv", 283.0, 1.0), OpCost("mlp", 301.5, 1.0)], {"device": (300.0, 1000.0)})
    key = [t.get_text() for t in split.legends[0].get_texts() if t.get_text()[:1].isdigit()]
    assert key == ["1: qkv (memory)", "2: mlp (compute)"]


def test_roofline_ceilings_use_no_dtypes_colour():
    from matplotlib.colors import to_hex

    from course_lib.plots.performance import _DTYPE_COLOURS

    fig = plots.plot_roofline([], {"this CPU": (1.0, 50.0), "A100": (312.0, 2039.0), "H100": (989.0, 3350.0)})
    roofs = {to_hex(ln.get_color()) for ln in fig.axes[0].get_lines() if len(ln.get_xdata()) > 1}
    assert len(roofs) == 3 and not roofs & {to_hex(c) for c in _DTYPE_COLOURS.values()}


def test_seeded_runs_dash_the_recipes_and_hatch_a_black_band():
    from types import SimpleNamespace

    from matplotlib.collections import PolyCollection

    curves = {"bf16_autocast": [[3.0, 2.0], [3.1, 2.1]], "tensorwise": [[3.0, 2.0], [3.0, 2.05]],
              "unscaled": [[3.0, 2.5], [3.2, 2.0]]}
    result = SimpleNamespace(recipes=tuple(curves), curves=curves,
                             final=lambda recipe, tail: [c[-1] for c in curves[recipe]])
    fig = plots.plot_fp8_training(result)
    left = fig.axes[0]
    styles = {ln.get_label(): ln.get_linestyle() for ln in left.get_lines()}
    assert styles == {"bf16_autocast": "-", "tensorwise": "--", "unscaled": "-."}   # the reference alone solid
    bands = [c for c in left.collections if isinstance(c, PolyCollection)]
    assert [b.get_hatch() for b in bands] == [None, None, "////"]   # only the black (unscaled) band


def test_clipping_runs_figure_draws_means_without_the_outliers_and_one_dot_per_seed():
    import math

    import numpy as np

    from course_lib.plots.loss_scaling import plot_clipping_runs
    from course_lib.studies import clipping as C

    rules = (C.NO_SPIKES, C.NO_CLIPPING, C.GLOBAL_NORM)
    losses = {r: ((1.0, 2.0, 100.0, 4.0), (3.0, 4.0, 300.0, 6.0)) for r in rules}
    skipped = {r: ((False,) * 4, (False,) * 4) for r in rules}
    skipped[C.NO_CLIPPING] = ((False, False, True, False), (False,) * 4)   # the spike passed in one seed only
    ones = {r: ((1.0,) * 4,) * 2 for r in rules}
    runs = C.SpikyRuns(rules, (0, 1), (2,), 300.0, {C.GLOBAL_NORM: 1.0}, losses, skipped, ones, ones, ones,
                       {C.NO_SPIKES: (0.1, 0.2), C.NO_CLIPPING: (0.9, math.nan), C.GLOBAL_NORM: (0.15, 0.25)}, 32, 4, 0.05)
    fig = plot_clipping_runs(runs, reference=C.NO_SPIKES)
    left, right = fig.axes
    line = next(ln for ln in left.get_lines() if ln.get_label() == C.GLOBAL_NORM)
    y = np.asarray(line.get_ydata(), dtype=float)
    assert list(y[[0, 1, 3]]) == [2.0, 3.0, 5.0] and math.isnan(y[2])   # the outlier's own loss left out
    # a triangle after the spike only where it passed in every seed: global norm yes, no clipping no
    triangles = [ln for ln in left.get_lines() if ln.get_marker() == "v" and len(ln.get_xdata())]
    assert [list(t.get_xdata()) for t in triangles] == [[3]]
    dots = [ln for ln in right.get_lines() if ln.get_marker() == "o"]
    assert [list(d.get_xdata()) for d in dots][2] == [0.15, 0.25] and len(dots) == 3
    assert list(dots[2].get_ydata()) == pytest.approx([1.94, 2.06])   # rule 2, its two seeds apart
    assert [t.get_text() for t in right.get_yticklabels()] == list(rules) and right.get_xscale() == "log"
    with pytest.raises(ValueError, match="unknown"):
        plot_clipping_runs(runs, ["per row"])
    with pytest.raises(ValueError, match="unknown"):
        plot_clipping_runs(runs, reference="per row")


def test_scale_traces_mark_skipped_steps_above_every_line_and_in_the_legend():
    from course_lib.scaling.scaler import ScaleTrace

    def trace(skipped):
        scales = tuple(2.0 ** (16 - sum(skipped[:i])) for i in range(len(skipped)))
        return ScaleTrace(scales, tuple(skipped), (0,) * len(skipped), 2.0**16, 2.0, 0.5, 2000)

    traces = {"GradScaler": trace([0, 1, 0, 1]), "replay": trace([0, 1, 0, 1]), "what if": trace([0, 0, 1, 0])}
    ax = plots.plot_scale_traces(traces).axes[0]
    lines = [ln for ln in ax.get_lines() if ln.get_linestyle() != "None"]
    marks = [ln for ln in ax.get_lines() if ln.get_linestyle() == "None"]
    assert len(lines) == len(marks) == 3
    assert [len(m.get_xdata()) for m in marks] == [2, 2, 1]
    assert min(m.get_zorder() for m in marks) > max(ln.get_zorder() for ln in lines)
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["GradScaler (2 skipped)", "replay (2 skipped)",
                                                          "what if (1 skipped)"]
    # each entry shows its trace's skip marker, not only its line
    assert [h.get_marker() for h in legend.legend_handles] == [m.get_marker() for m in marks]
    # the starting scale is labelled: ticks count from it, in steps that keep at most 8 over the range
    assert [round(math.log2(v)) for v in ax.get_yticks() if v > 0] == [15, 16]
    long = {"recorded": ScaleTrace((2.0**16,) * 3 + tuple(2.0 ** (15 - i) for i in range(172)), (0, 0, 0) + (1,) * 172,
                                   (0,) * 175, 2.0**16, 2.0, 0.5, 2000)}
    assert plots.loss_scaling.scale_tick_exponents([t.scales for t in long.values()]) == [-144, -112, -80, -48, -16, 16]
    crowded = [ln for ln in plots.plot_scale_traces(long).axes[0].get_lines() if ln.get_linestyle() == "None"]
    assert crowded[0].get_markersize() < 11     # 172 skips: smaller marks, so that they do not merge into a band
    with pytest.raises(ValueError, match="no positive finite scale"):
        plots.loss_scaling.scale_tick_exponents([(0.0, math.inf)])
    with pytest.raises(ValueError, match="most must be an int of at least 2"):
        plots.loss_scaling.scale_tick_exponents([(1.0, 2.0)], most=0)   # would never stop doubling its step


def test_rounding_error_figure_stops_fp16_below_its_overflow_and_marks_its_largest_value():
    fig = plots.plot_rounding_error_vs_magnitude(("BF16", "FP16"), n=20_000)
    ax = fig.axes[0]
    lines = {line.get_label(): line for line in ax.get_lines()}
    x, fp16 = (np.asarray(v, dtype=float) for v in lines["FP16 median"].get_data())
    half_bin = 10 ** (15 / 60 / 2)     # the bins are a quarter of a decade wide on 1e-9..1e6
    drawn = x[np.isfinite(fp16)]
    # every FP16 bin drawn lies wholly below the overflow point (65520), the partial bin is left out
    assert drawn.max() * half_bin <= 65520 and drawn.max() * half_bin * 10 ** 0.25 > 65520
    assert np.isfinite(np.asarray(lines["BF16 median"].get_data()[1], dtype=float)).all()
    verticals = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert verticals == [65504.0]      # FP16's largest finite value; BF16's lies off the axis
    # the axis reaches down to a labelled decade under FP16's median (about 1.6e-4): 1e-4 is a tick shown
    fig.canvas.draw()
    shown = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    assert min(shown) <= np.nanmin(fp16) and min(shown) == 1e-4
    plt.close(fig)


def test_a_peak_two_dtypes_share_is_drawn_in_both_colours():
    panel = {"fp32": {256: 10.0, 512: 12.0}, "bf16": {256: 20.0, 512: 30.0}, "fp16": {256: 21.0, 512: 31.0}}
    fig = plots.plot_matmul_throughput({"GPU": panel}, peaks={"GPU": {"fp32": 60.0, "bf16": 990.0, "fp16": 990.0}})
    ax = fig.axes[0]
    flat = [ln for ln in ax.get_lines() if len(set(ln.get_ydata())) == 1 and len(ln.get_ydata()) == 2]
    at_990 = [ln for ln in flat if ln.get_ydata()[0] == 990.0]
    # one line per dtype, in its own colour, dashes offset so that the two alternate along the line
    assert len(at_990) == 2 and len({ln.get_color() for ln in at_990}) == 2
    offsets = sorted(ln.get_dashes()[0] if hasattr(ln, "get_dashes") else ln._dash_pattern[0] for ln in at_990)
    assert offsets[0] != offsets[1]
    alone = [ln for ln in flat if ln.get_ydata()[0] == 60.0]
    assert len(alone) == 1 and alone[0].get_linestyle() == "--"
