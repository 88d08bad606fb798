"""Figures. Each function takes results (or formats) and returns a matplotlib ``Figure``; none shows it."""

from __future__ import annotations

from .distributed import plot_rank_scales, plot_reduction_precision
from .formats import plot_bit_layouts, plot_format_ranges, plot_relative_spacing, plot_rounding_error_vs_magnitude
from .fp8 import (
    plot_accumulation,
    plot_delayed_spike,
    plot_fp8_speedup,
    plot_fp8_training,
    plot_outlier_sweep,
    plot_scaling_lab,
)
from .loss_scaling import plot_qk_growth, plot_scale_fidelity, plot_scale_sweep, plot_scale_traces
from .microscaling import plot_block_sizes, plot_gap_replay, plot_gradient_fidelity
from .monitoring import plot_dashboard, plot_recovery, plot_underflow_trend
from .performance import (
    plot_activation_sweep,
    plot_loss_against_time,
    plot_matmul_throughput,
    plot_memory_breakdown,
    plot_roofline,
    plot_throughput,
)
from .style import (
    EXPONENT_COLOUR,
    FIGURE_DPI,
    FORMAT_COLOURS,
    LIMIT_COLOUR,
    MANTISSA_COLOUR,
    SIGN_COLOUR,
    TENSOR_COLOUR,
    finish_figure,
    format_colour,
    fp8_colour,
    plot_runs,
    plot_seeded_runs,
    quantiles,
    recipe_colour,
    resolve_formats,
)
from .underflow import plot_gradient_histogram, plot_layer_gradients

__all__ = [
    "SIGN_COLOUR",
    "EXPONENT_COLOUR",
    "MANTISSA_COLOUR",
    "TENSOR_COLOUR",
    "LIMIT_COLOUR",
    "FORMAT_COLOURS",
    "FIGURE_DPI",
    "finish_figure",
    "resolve_formats",
    "quantiles",
    "plot_runs",
    "fp8_colour",
    "format_colour",
    "recipe_colour",
    "plot_seeded_runs",
    "plot_bit_layouts",
    "plot_format_ranges",
    "plot_relative_spacing",
    "plot_rounding_error_vs_magnitude",
    "plot_gradient_histogram",
    "plot_layer_gradients",
    "plot_scale_sweep",
    "plot_scale_fidelity",
    "plot_scale_traces",
    "plot_qk_growth",
    "plot_matmul_throughput",
    "plot_roofline",
    "plot_throughput",
    "plot_loss_against_time",
    "plot_memory_breakdown",
    "plot_activation_sweep",
    "plot_scaling_lab",
    "plot_outlier_sweep",
    "plot_delayed_spike",
    "plot_fp8_training",
    "plot_accumulation",
    "plot_fp8_speedup",
    "plot_block_sizes",
    "plot_gradient_fidelity",
    "plot_gap_replay",
    "plot_recovery",
    "plot_underflow_trend",
    "plot_dashboard",
    "plot_reduction_precision",
    "plot_rank_scales",
]
