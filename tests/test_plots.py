import pytest

from course_lib import plots
from course_lib.formats import list_formats
from course_lib.magnitudes import measure_training_magnitudes


def test_bit_layout_draws_one_cell_per_bit():
    fig = plots.plot_bit_layouts(["FP16", "FP8 E4M3"])
    ax = fig.axes[0]
    assert len(ax.patches) == 16 + 8
    labels = {t.get_text() for t in ax.texts}
    assert {"FP16", "FP8 E4M3", "E5", "M10", "16 bits"} <= labels


def test_ranges_figure_has_log_axis_and_tensor_rows(small_profile):
    mags = measure_training_magnitudes(small_profile, steps=2)
    fig = plots.plot_format_ranges(["FP16", "BF16"], mags)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    ticks = [t.get_text() for t in ax.get_yticklabels()]
    assert ticks[:2] == ["FP16", "BF16"] and "Adam second moment" in ticks
    two = plots.plot_format_ranges(["FP16"], mags, recorded=("GPU", mags))
    assert any("(GPU)" in t.get_text() for t in two.axes[0].get_yticklabels())


def test_spacing_figure_one_curve_per_format():
    fig = plots.plot_relative_spacing(["FP32", "FP16"])
    ax = fig.axes[0]
    assert [l.get_label() for l in ax.get_lines() if not l.get_label().startswith("_")] == ["FP32", "FP16"]
    assert len(plots.plot_relative_spacing().axes[0].get_legend().get_texts()) == len(list_formats())


def test_unknown_format_is_an_error():
    with pytest.raises(ValueError, match="unknown format"):
        plots.plot_bit_layouts(["FP7"])


def test_run_differences():
    fig = plots.plot_runs({"ref": [1.0, 2.0, 3.0], "b": [1.5, 2.5, 3.5]}, ylabel="y", title="t", minus="ref")
    lines = [l for l in fig.axes[0].get_lines() if l.get_label() == "b"]
    assert list(lines[0].get_ydata()) == [0.5, 0.5, 0.5]
    with pytest.raises(ValueError, match="no run named"):
        plots.plot_runs({"a": [1.0]}, ylabel="y", title="t", minus="z")


def test_throughput_plot_takes_single_seed_rows_and_old_records():
    from course_lib import plots

    one = {"recipe": "fp32", "compiled": True, "seeds": 1, "step_ms": 3.3, "step_ms_range": (3.3, 3.3),
           "tokens_per_s": 1e6 / 3.3, "tokens_per_s_range": (1e6 / 3.3, 1e6 / 3.3), "mfu": None}
    old = {k: v for k, v in one.items() if k != "tokens_per_s_range"}  # a record from before the range existed
    fig = plots.plot_throughput({"a": [one], "b": [old]})
    assert len(fig.axes) == 2
