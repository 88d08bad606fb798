"""Lesson 7's views of its GPU records (course_lib.studies.fp8_recorded) and the sentences that put them beside
the page's own runs (the unscaled recipe's seeds, the cast cost's device, the errata's outlier row, the
compiled-speed table's two halves in course_lib.studies.fp8_prose), each against results built by hand."""

from __future__ import annotations

import pytest

from course_lib.fp8 import QuantizationError
from course_lib.fp8.roofline import predict_fp8_linear
from course_lib.glue import Prose
from course_lib.gpu_session import Step
from course_lib.hardware import GPUPeaks
from course_lib.results import Provenance, Record, RecordedResult
from course_lib.studies import fp8_prose
from course_lib.studies import fp8_recorded as R
from course_lib.studies.fp8 import Fp8ScalingLab, Fp8Training, OutlierSweep, ScalingLab
from course_lib.studies.fp8_speed import BF16, COURSE_EAGER, Fp8CompiledSpeed, torchao_name
from course_lib.studies.performance import MatmulPointSummary, MatmulThroughput

RECIPES = ("no scaling (E4M3)", "per tensor, E4M3", "per tensor, E5M2", "per row (token), E4M3",
           "1 x 32 tiles, E4M3")


def qe(error: float, flushed: float = 0.0) -> QuantizationError:
    return QuantizationError("r", error, 0.0, flushed, 5.0, 16)


def lab(grad_flushed: tuple[float, float, float, float], errors=(0.02, 0.02, 0.022, 0.024)) -> ScalingLab:
    """A two-tensor lab; ``grad_flushed``: the gradient's flushed share per tensor E4M3, per tensor E5M2, per
    row, tiles; ``errors``: those recipes' relative error (the same on both tensors)."""
    grad = {"no scaling (E4M3)": qe(1.0, 1.0), **{r: qe(e, f) for r, e, f in zip(RECIPES[1:], errors, grad_flushed)}}
    act = {"no scaling (E4M3)": qe(0.03), **{r: qe(e) for r, e in zip(RECIPES[1:], errors)}}
    return ScalingLab(("activation", "gradient"), RECIPES, {"activation": act, "gradient": grad})


LIVE = lab((0.0006, 0.0, 0.0001, 0.00004))                # a few values in ten thousand: hardly matters
RECORDED = lab((0.114, 0.0103, 0.034, 0.028), errors=(0.0265, 0.0525, 0.0266, 0.025))


def record(experiment: str, result, parameters: dict | None = None) -> RecordedResult:
    provenance = Provenance("NVIDIA H100", "cuda", "2.11", "2026-01-01", "cmd", "abc", "3.12", compute_capability="9.0")
    return RecordedResult(Record(experiment, parameters or {}, {}, provenance), result)


# ---- formatting and provenance -------------------------------------------------------------------------------

@pytest.mark.parametrize("share, text", [(0.0, "0"), (0.114, "11.4"), (0.887, "88.7"), (1.0, "100"), (0.034, "3.4"),
                                         (0.0103, "1.0"), (0.00059, "0.059"), (0.0996, "9.96"), (0.0994, "9.9"), (0.36, "36.0"), (0.99951, "100")])
def test_percent_text_keeps_two_or_three_significant_figures(share, text):
    assert R.percent_text(share) == text


@pytest.mark.parametrize("share", [-0.01, 1.5])
def test_percent_text_refuses_a_share_outside_0_to_1(share):
    with pytest.raises(ValueError, match="0..1"):
        R.percent_text(share)


def test_record_where_names_the_gpu_and_the_course_models_width():
    model = {"d_model": 512, "n_layers": 8, "n_heads": 8, "context": 256, "batch": 64}
    assert R.record_where(record("fp8_scaling_lab", None, {"size": "full", "course_model": model})) == (
        "on NVIDIA H100 (sm 9.0), with the 512-wide course model")
    # a full-size record from before the model was stored ran the earlier, 384-wide one
    assert R.record_where(record("fp8_scaling_lab", None, {"size": "full"})) == (
        "on NVIDIA H100 (sm 9.0), with the 384-wide course model")
    assert R.record_where(record("fp8_scaling_lab", None)) == "on NVIDIA H100 (sm 9.0)"


# ---- the scaling lab ------------------------------------------------------------------------------------------

def test_flush_matters_needs_a_percentage_point_and_a_factor_of_two():
    assert R.flush_matters(lab((0.01, 0.0, 0.02, 0.015)))           # 1 point apart, twice as many
    assert not R.flush_matters(lab((0.02, 0.0, 0.035, 0.03)))       # 1.5 points, but 1.75 times
    assert not R.flush_matters(lab((0.001, 0.0, 0.009, 0.005)))     # 9 times, but 0.8 points
    assert R.flush_matters(RECORDED) and not R.flush_matters(LIVE)
    with pytest.raises(ValueError, match="no tensor 'weight'"):
        R.flush_matters(LIVE, "weight")
    with pytest.raises(ValueError, match="no scaled E4M3 recipe"):
        R.flush_matters(ScalingLab(("gradient",), ("no scaling (E4M3)",), {"gradient": {"no scaling (E4M3)": qe(1.0)}}))


def test_granularity_note_separates_the_relative_error_from_the_flushed_share():
    assert R.granularity_note(LIVE) == (
        "On these tensors the granularity of the scales hardly moves the relative error. The share of the gradient "
        "flushed to zero runs from 0.0040% (1 x 32 tiles, E4M3) to 0.060% (per tensor, E4M3), 15 times as much and "
        "0.056 percentage points apart. The shares differ by less than 1 percentage point, so whatever their ratio, "
        "the granularity changes little of how much of the gradient is lost.")
    assert R.granularity_note(RECORDED) == (
        "On these tensors the granularity of the scales hardly moves the relative error. The share of the gradient "
        "flushed to zero does depend on it: from 2.8% (1 x 32 tiles, E4M3) to 11.4% (per tensor, E4M3), 4.1 times "
        "as much and 8.6 percentage points apart.")
    # 2% to 3% is more than the 25% the sentence calls "hardly"
    assert R.granularity_note(lab((0.0, 0.0, 0.0, 0.0), errors=(0.02, 0.05, 0.03, 0.025))).startswith(
        "On these tensors the granularity of the scales moves the relative error, from 2.0% to 3.0%.")


def test_lab_record_note_says_what_the_record_flushes():
    assert R.lab_record_note(None, "on X") == ""
    assert R.lab_record_note(RECORDED, "on X") == (
        "Recorded on X (tables after the outlier section), every scaled E4M3 recipe's relative error lies between "
        "2.5% and 2.7%, but the share of the gradient flushed to zero runs from 2.8% (1 x 32 tiles, E4M3) to 11.4% "
        "(per tensor, E4M3), 4.1 times as much and 8.6 percentage points apart; E5M2 with one scale flushes 1.0%. There the granularity of the scales decides how "
        "much of the gradient flushes, though not the relative error, which the largest values dominate.")
    same = R.lab_record_note(LIVE, "on X")
    assert ", and the share of the gradient flushed" in same and same.endswith(
        "percentage points apart; E5M2 with one scale flushes 0%. There, too, the shares lie under 1 percentage "
        "point apart: the granularity has no say in how much of the gradient is lost.")
    moved = lab((0.1, 0.0, 0.03, 0.02), errors=(0.02, 0.05, 0.03, 0.025))
    assert R.lab_record_note(moved, "on X").endswith("though the relative error moves too.")


def test_granularity_takeaway_says_where_the_flushed_share_depends_on_it():
    assert R.granularity_takeaway(LIVE, RECORDED) == (
        "every scaled recipe has about the same relative error, but the share of the gradient flushed to zero "
        "depends on the granularity in the full-size record")
    assert R.granularity_takeaway(LIVE) == (
        "every scaled recipe has about the same relative error, and flushes about as much of the gradient")
    assert R.granularity_takeaway(RECORDED, RECORDED).endswith("depends on the granularity here and in the "
                                                               "full-size record")
    moved = lab((0.0, 0.0, 0.0, 0.0), errors=(0.02, 0.05, 0.03, 0.025))
    assert R.granularity_takeaway(moved, RECORDED).startswith("the scaled recipes' relative errors differ, and ")


def test_lab_table_gives_every_recipes_error_and_the_gradients_flushed_share():
    assert R.lab_table(RECORDED) == (
        "| recipe | activation error (%) | gradient error (%) | gradient flushed (%) |\n|---|---|---|---|\n"
        "| no scaling (E4M3) | 3.00 | 100.00 | 100 |\n"
        "| per tensor, E4M3 | 2.65 | 2.65 | 11.4 |\n"
        "| per tensor, E5M2 | 5.25 | 5.25 | 1.0 |\n"
        "| per row (token), E4M3 | 2.66 | 2.66 | 3.4 |\n"
        "| 1 x 32 tiles, E4M3 | 2.50 | 2.50 | 2.8 |\n")
    with pytest.raises(ValueError, match="no tensor 'weight'"):
        R.lab_table(RECORDED, flushed_of="weight")


def sweep(per_tensor=(0.0, 0.004, 0.36), block: int = 32) -> OutlierSweep:
    flushed = {"per tensor, E4M3": per_tensor, "per row (token), E4M3": (0.0, 0.002, 0.28),
               f"1 x {block} tiles, E4M3": (0.0, 0.0005, 0.094)}
    return OutlierSweep(0, (1.0, 1e3, 1e5), {k: (0.0,) * 3 for k in flushed}, flushed)


def test_sweep_table_and_outlier_record_note():
    assert R.sweep_table(sweep(), factors=(1e3, 1e5)) == (
        "| recipe | flushed at 1,000x (%) | flushed at 100,000x (%) |\n|---|---|---|\n"
        "| per tensor, E4M3 | 0.40 | 36.0 |\n| per row (token), E4M3 | 0.20 | 28.0 |\n"
        "| 1 x 32 tiles, E4M3 | 0.050 | 9.4 |\n")
    with pytest.raises(ValueError, match="no factor 10000"):
        R.sweep_table(sweep())                               # the default asks for 1e4 and 1e6 too
    recorded = sweep((0.0, 0.013, 0.887), block=128)
    assert R.outlier_record_note(sweep(), None, "on X", recorded_block=128) == ""
    assert R.outlier_record_note(sweep(), recorded, "on X", recorded_block=128) == (
        "Recorded on X (table below), one scale for the whole tensor flushes 1.3% of the other values at 1,000x "
        "(here 0.40%) and 88.7% at 100,000x (here 36.0%); at 100,000x per-row scales flush 28.0% there, 1 x 128 "
        "tiles 9.4%.")
    with pytest.raises(ValueError, match="lack the recipes"):
        R.outlier_record_note(sweep(), recorded, "on X", recorded_block=32)


def test_lab_record_heading_names_the_gpu_size_and_tiles():
    study = Fp8ScalingLab("blocks.0.fc", 300, 128, RECORDED, sweep(block=128))
    assert R.lab_record_heading(record("fp8_scaling_lab", study), "full profile") == (
        "**Recorded on NVIDIA H100 (sm 9.0)**, full profile: layer `blocks.0.fc` after 300 steps of FP32 "
        "training, 128-wide tiles. The lab (relative error, and the share of the gradient flushed to zero), then "
        "the outlier sweep (the share of the other channels flushed):")
    with pytest.raises(TypeError, match="Fp8ScalingLab"):
        R.lab_record_heading(record("fp8_scaling_lab", RECORDED), "full profile")


def test_the_errata_row_on_outliers_quotes_the_record_beside_the_page():
    overflow = fp8_prose.OverflowCasts("2.11", 448.0, "0.5", 448.0, float("inf"))
    estimates = {"tensorwise": [predict_fp8_linear(n, n, n, bf16_tflops=100.0, fp8_tflops=200.0, bandwidth_gbs=1000.0)
                                for n in (1024, 16384)]}
    rows = fp8_prose.fp8_errata_rows(overflow, sweep(), block=32, estimates=estimates, measured={},
                                     recorded_sweep=sweep((0.0, 0.013, 0.887), block=128), recorded_where="on X")
    assert rows[4][1] == (
        "In E4M3 it copes with a lot: a 1,000x outlier channel flushed 0.40% of the other values of this page's "
        "activation (1.3% recorded on X); it is at 100,000x that 36.0% (88.7% recorded) go. Per-token scales help "
        "little (the outlier section above); 1 x 32 tiles flush fewer, 9.4% at 100,000x, but not none.")
    # a record where 1,000x already flushes 5% or more: per-tensor scaling copes with small outliers only
    worse = fp8_prose.fp8_errata_rows(overflow, sweep(), block=32, estimates=estimates, measured={},
                                      recorded_sweep=sweep((0.0, 0.06, 0.9), block=128), recorded_where="on X")
    assert worse[4][1].startswith("In E4M3 it copes with small outliers only: ")


# ---- one product, recorded ------------------------------------------------------------------------------------

def point(dtype: str, n: int, median_us: float, q25_us: float, q75_us: float) -> MatmulPointSummary:
    return MatmulPointSummary(dtype, n, 2 * n ** 3 / (median_us * 1e-6) / 1e12, median_us * 1e-6, q25_us * 1e-6,
                              q75_us * 1e-6, 100)


GPU = GPUPeaks("Test GPU", "9.0", {"fp32": 10.0, "tf32": None, "bf16": 100.0, "fp16": 100.0, "fp8": 200.0},
               1000.0, "test")
# 256 and 512 are launch-bound on GPU (at the peaks they would take 0.34/0.17 and 2.7/1.3 us); 1024 is not
# (21/11 us against about 40 measured). FP8 is faster beyond the spread at 256, slower at 512, within it at 1024.
THROUGHPUT = MatmulThroughput((256, 512, 1024, 2048), 1024, (
    point("bf16", 256, 30.0, 28.0, 33.6), point("fp8", 256, 25.0, 24.0, 27.5),
    point("bf16", 512, 30.0, 29.0, 31.0), point("fp8", 512, 40.0, 38.0, 42.0),
    point("bf16", 1024, 40.0, 38.0, 42.0), point("fp8", 1024, 44.0, 41.0, 48.0),
    point("fp32", 256, 50.0, 49.0, 51.0), point("bf16", 2048, 300.0, 290.0, 310.0)), {}, {}, 1000.0)


def test_ratio_spread_pairs_the_quartiles():
    mid, lo, hi = R.ratio_spread(point("bf16", 256, 30.0, 28.0, 33.6), point("fp8", 256, 25.0, 24.0, 27.5))
    assert (mid, lo, hi) == pytest.approx((1.2, 28.0 / 27.5, 33.6 / 24.0))


def test_launch_bound_sizes_compare_the_datasheet_peaks_with_the_time_measured():
    assert R.launch_bound_sizes(THROUGHPUT, GPU) == (256, 512)
    with pytest.raises(ValueError, match="no peak"):
        R.launch_bound_sizes(THROUGHPUT, GPUPeaks("No FP8", "8.0", {"bf16": 100.0, "fp8": None}, 1000.0, "test"))


def test_product_spread_table_gives_medians_quartiles_and_the_peaks_time():
    assert R.product_spread_table(THROUGHPUT, GPU) == (
        "| n | BF16 (us) | FP8 (us) | BF16 time / FP8 time | at Test GPU's peaks: BF16 / FP8 (us) |\n"
        "|---|---|---|---|---|\n"
        "| 256 | 30.0 (28.0-33.6) | 25.0 (24.0-27.5) | 1.20 (1.02-1.40) | 0.34 / 0.17 |\n"
        "| 512 | 30.0 (29.0-31.0) | 40.0 (38.0-42.0) | 0.75 (0.69-0.82) | 2.7 / 1.3 |\n"
        "| 1024 | 40.0 (38.0-42.0) | 44.0 (41.0-48.0) | 0.91 (0.79-1.02) | 21 / 11 |\n")
    with pytest.raises(TypeError, match="MatmulThroughput"):
        R.product_spread_table({}, GPU)


def test_small_product_note_says_what_launch_bound_sizes_measure_and_keeps_the_spread():
    assert R.small_product_note(THROUGHPUT, GPU, up_to=1024) == (
        "Up to n = 512 both products took 25 to 40 us whatever the size, where Test GPU's datasheet peaks would "
        "need at most 9% of that: those sizes measure launch overhead, not tensor cores, and a ratio there compares "
        "the two kernels' fixed costs. The roofline model of the figure above assumes 2 µs per kernel at least; these "
        "measured products "
        "took 12 to 20 times that (each timing includes the launch and the timer's own overhead): the model's floor "
        "is an assumption, and the small products measured here are slower still. Up to 1024, with the spread of both timings (BF16's time over FP8's, from "
        "their interquartile ranges), FP8's product was faster at 256 (1.02-1.40); slower at 512 (0.69-0.82); "
        "neither, within the spread, at 1024 (0.79-1.02). There the bare product itself is slower in FP8.")
    # without a slower size, and with no launch-bound size below up_to
    assert R.small_product_note(THROUGHPUT, GPU, up_to=256).endswith(
        "FP8's product was faster at 256 (1.02-1.40). So the bare product does not make small FP8 layers slow.")
    fast_gpu = GPUPeaks("Slow GPU", "9.0", {"bf16": 1.0, "fp8": 2.0}, 1000.0, "test")
    assert R.small_product_note(THROUGHPUT, fast_gpu, up_to=256).startswith("Up to 256, with the spread")
    assert R.small_product_note(THROUGHPUT, GPU, up_to=128) == "No product up to n = 128 is recorded."
    assert R.small_product_note(None, GPU).startswith("No product recorded on a GPU")
    assert R.small_product_note(THROUGHPUT, None).startswith("No product recorded on a GPU")


# ---- the GPU session's pieces ---------------------------------------------------------------------------------

def test_session_pieces_note_counts_recipes_steps_and_parts():
    parts = ((Step("other"), Step("fp8_training", {"recipes": ["a"]}), Step("fp8_training", {"recipes": ["b"]})),
             (Step("fp8_training", {"recipes": ["c"]}),), (Step("other"),))
    note = R.session_pieces_note(parts)
    assert isinstance(note, Prose) and note == (
        "The course's GPU script (`python -m course_lib.gpu_session`) splits it: it trains one recipe per run, each "
        "run a `course_lib.record` command that writes a record of its own, and groups up to two runs into a batch "
        "short enough for one ten-minute command (two batches; `python -m course_lib.gpu_session plan` lists "
        "them). This page merges the records made on one GPU.")
    even = ((Step("fp8_training", {"recipes": ["a", "b"]}), Step("fp8_training", {"recipes": ["c"]})),)
    assert "up to two recipes per run" in R.session_pieces_note(even)
    assert "groups two runs into a batch" in R.session_pieces_note(even) and "(one batch;" in R.session_pieces_note(even)
    with pytest.raises(ValueError, match="no part"):
        R.session_pieces_note(parts, "mx_training")
    with pytest.raises(ValueError, match="whole"):
        R.session_pieces_note(((Step("fp8_training"),),))


# ---- the unscaled recipe, seed by seed ---------------------------------------------------------------------------

def training(**finals: tuple[float, float, float]) -> Fp8Training:
    curves = {r: tuple((f,) * 12 for f in fs) for r, fs in finals.items()}
    return Fp8Training(tuple(curves), (0, 1, 2), 12, 32, curves)


def test_unscaled_seed_facts_report_each_seed_and_the_scaled_range():
    base = {"bf16_autocast": (3.0, 3.0, 3.0), "tensorwise": (3.01, 2.99, 3.02)}
    beyond = fp8_prose.unscaled_seed_facts(training(**base, unscaled=(3.1, 3.2, 3.15)))
    assert beyond == {
        "train_unscaled_seeds": "FP8 without scales ended above BF16 in all three seeds, by +0.100, +0.200 and "
                                "+0.150 (seeds 0, 1 and 2 in turn): each gap lies beyond every scaled recipe's in every "
                                "seed (-0.010 to +0.020).",
        "train_unscaled_short": "unscaled FP8 ended above BF16 in all three seeds, beyond every scaled recipe's gap"}
    assert all(isinstance(v, Prose) for v in beyond.values())
    partly = fp8_prose.unscaled_seed_facts(training(**base, unscaled=(3.1, 3.01, 2.98)))
    assert partly["train_unscaled_seeds"].startswith("FP8 without scales ended above BF16 in two of three seeds, "
                                                     "by +0.100, +0.010 and -0.020")
    # +0.100 and -0.020 lie outside -0.010 to +0.020, +0.010 inside: the sentence names the seeds
    assert partly["train_unscaled_seeds"].endswith(
        "(seeds 0, 1 and 2 in turn): two of them (seeds 0 and 2) lie beyond the scaled recipes' range (-0.010 to "
        "+0.020), the other within it.")
    one = fp8_prose.unscaled_seed_facts(training(**base, unscaled=(3.1, 3.01, 3.0)))
    assert "one of them (seed 0) lies beyond the scaled recipes' range (-0.010 to +0.020), the others within it." in (
        one["train_unscaled_seeds"])
    within = fp8_prose.unscaled_seed_facts(training(**base, unscaled=(2.995, 2.999, 2.998)))
    assert within["train_unscaled_seeds"].endswith("every gap lies within the scaled recipes' range (-0.010 to +0.020).")
    assert within["train_unscaled_short"] == ("unscaled FP8 ended below BF16 in all three seeds, within the scaled "
                                              "recipes' gaps")
    with pytest.raises(ValueError, match="'unscaled'"):
        fp8_prose.unscaled_seed_facts(training(**base))
    with pytest.raises(ValueError, match="at least one scaled recipe"):
        fp8_prose.unscaled_seed_facts(training(bf16_autocast=(3.0,) * 3, unscaled=(3.1,) * 3))


# ---- the compiled-speed table, in two narrower halves -------------------------------------------------------------

def compiled() -> Fp8CompiledSpeed:
    tw = torchao_name("tensorwise")
    return Fp8CompiledSpeed("cpu", False, "eager", 64, (64,), 64, 1, 32,
                            {BF16: {64: 1.0}, tw: {64: 2.0}, COURSE_EAGER: {64: 4.0}}, {BF16: 3.0, tw: 6.0}, {},
                            "H100 SXM5", {"tensorwise": {64: 0.3}, "rowwise": {64: 0.4}},
                            {"tensorwise": 0.5, "rowwise": 0.6})


def test_compiled_speed_table_splits_into_measured_and_predicted_columns():
    speed = compiled()
    measured = fp8_prose.compiled_speed_table(speed, columns="measured")
    predicted = fp8_prose.compiled_speed_table(speed, columns="predicted")
    assert "predicted" not in measured and "(ms)" in measured.splitlines()[0]
    assert predicted == (
        "| shape | predicted tensorwise on H100 SXM5: BF16 time / FP8 time (block: its seven linear products only) | predicted "
        "rowwise on H100 SXM5: BF16 time / FP8 time (block: its seven linear products only) |\n"
        "|---|---|---|\n| 64 tokens, 64→64 features | 0.30 | 0.40 |\n| Llama block, width 64, 32 tokens | 0.50 | 0.60 |\n")
    # together, the two halves hold the whole table's columns, shape once
    whole = [line.split(" | ") for line in fp8_prose.compiled_speed_table(speed).splitlines() if "---" not in line]
    halves = [m.split(" | ") + p.split(" | ")[1:] for m, p in zip(measured.splitlines(), predicted.splitlines())
              if "---" not in m]
    assert [[c.strip("| ") for c in row] for row in whole] == [[c.strip("| ") for c in row] for row in halves]
    with pytest.raises(ValueError, match="columns must be"):
        fp8_prose.compiled_speed_table(speed, columns="some")
