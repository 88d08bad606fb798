"""Lesson 6's facts, phrases, tables and errata rows (studies.performance_prose) and the helpers added to
studies.performance, each computed from measurements and results built by hand with known numbers."""

import dataclasses
import math

import pytest

from course_lib.bench import (
    CPUPeakEstimate,
    MatmulPoint,
    MatmulSweep,
    OpCost,
    RooflineRow,
    Timing,
    roofline_rows,
    transformer_op_costs,
)
from course_lib.device import SizeProfile
from course_lib.glue import Prose, percent_text
from course_lib.hardware import DATASHEET_PEAKS, GPUPeaks
from course_lib.memory import MemoryBreakdown
from course_lib.models import gpt_config_for
from course_lib.results import Provenance, Record, RecordedResult, describe_records
from course_lib.studies import performance_errata as E
from course_lib.studies import memory_prose as M
from course_lib.studies import performance_prose as P
from course_lib.studies import timing_prose as T
from course_lib.studies.performance import (
    ActivationSweep,
    MatmulPointSummary,
    MatmulThroughput,
    ProfiledStep,
    ProfiledSteps,
    RecipeRun,
    ThroughputStudy,
    TimerCrossCheck,
    TrainingMemory,
    roofline_speedups,
)
from course_lib.tables import MarkdownTable

H100_LABEL = "NVIDIA H100 80GB HBM3 (sm 9.0)"


def _record(experiment, values, parameters=None, device_name="NVIDIA H100 80GB HBM3", cc="9.0"):
    provenance = Provenance(device_name, "cuda", "2.11", "2026-01-01T00:00:00+00:00", "cmd", "abc", "3.12",
                            compute_capability=cc)
    rec = Record(experiment, parameters or {}, values, provenance, schema_version=1)
    # lesson 6's composite experiments read back as their values; a study is passed as the typed result
    return RecordedResult(rec, values)


def _point(dtype, n, seconds):
    return MatmulPoint(dtype, n, n, n, Timing((seconds,), 0))


def _tflops(n, seconds):
    return 2 * n ** 3 / seconds / 1e12


# ---- timing ------------------------------------------------------------------------------------------

def test_timing_facts_from_three_measurements():
    first = MatmulPoint("fp32", 4, 4, 4, Timing((0.001, 0.002, 0.003), 1))
    facts = P.timing_facts([first, _point("fp32", 4, 0.004)], timer_seconds=0.0025)
    phrases = {k: facts.pop(k) for k in ("t_vs_timer", "t_spread_vs_quartiles")}
    assert facts == pytest.approx({
        "t_n": 4, "t_median_ms": 2.0, "t_q25_ms": 1.5, "t_q75_ms": 2.5, "t_repeats": 3,
        "t_tflops": 128 / 0.002 / 1e12, "t_min_ms": 2.0, "t_max_ms": 4.0, "t_runs_spread": 100.0})
    assert isinstance(facts["t_repeats"], int) and all(isinstance(p, Prose) for p in phrases.values())
    # 20% below Timer is inside the medians' 100% spread; the 4 ms repeat lies beyond the quartiles' 2.5 ms
    assert phrases["t_vs_timer"].startswith("within 20.0% of") and "(lower)" in phrases["t_vs_timer"]
    assert "agree" in phrases["t_vs_timer"] and "the 100.0% by which its own 2" in phrases["t_vs_timer"]
    assert phrases["t_spread_vs_quartiles"].startswith("wider than the quartiles")
    # 10% above Timer's median with repeats 100% apart: within the medians' spread, never judged by quartiles
    assert P.timing_facts([first, _point("fp32", 4, 0.004)], 0.002 / 1.1)["t_vs_timer"].startswith("within 10.0%")
    # two medians 1% apart: a 60% gap lies beyond that spread, however wide one measurement's quartiles are
    beyond = P.timing_facts([first, _point("fp32", 4, 0.00202)], timer_seconds=0.00125)["t_vs_timer"]
    assert beyond.startswith("60.0% higher") and "the 1.0% by which its own 2 repeated medians" in beyond
    assert "reads consistently higher than Timer here, by about 60.0%" in beyond
    with pytest.raises(ValueError, match="at least two measured points"):
        P.timing_facts([first], 0.001)
    with pytest.raises(ValueError, match="timer_seconds must be positive"):
        P.timing_facts([first, first], 0.0)


def test_timing_percentages_are_of_the_printed_medians():
    # 1.1638 ms against Timer's 1.0004 ms is 16.3% apart; printed to 3 decimals (1.164 and 1.000), 16.4%: the
    # page gives what a reader computes from what it prints
    first = MatmulPoint("fp32", 4, 4, 4, Timing((1.1638e-3,), 1))
    facts = P.timing_facts([first, _point("fp32", 4, 1.1638e-3)], timer_seconds=1.0004e-3)
    assert facts["t_vs_timer"].startswith("16.4% higher") and facts["t_median_ms"] == pytest.approx(1.1638)
    # a product of microseconds rounds to 0.000 ms: then the unrounded medians decide
    tiny = MatmulPoint("fp32", 4, 4, 4, Timing((2e-7,), 1))
    assert P.timing_facts([tiny, _point("fp32", 4, 2e-7)], timer_seconds=1e-7)["t_vs_timer"].startswith("100.0% higher")


def test_the_sweeps_point_of_the_timed_product_widens_the_noise_when_it_drifted():
    repeats = [_point("fp32", 4, t) for t in (1.301e-3, 1.300e-3, 1.281e-3)]
    def sweep(t):
        return MatmulSweep("cpu", (_point("fp32", 4, t), _point("bf16", 4, 1e-3)), {})

    # the review's numbers: repeats 1.281 to 1.301 ms (1.6%), the sweep's 1.160 ms: 12.2% from the slowest
    drift = T.sweep_drift(repeats, sweep(1.16e-3))
    assert drift["noise_pct"] == pytest.approx(100 * (1.301 / 1.16 - 1))
    assert drift["sweep_drift"] == (
        "The sweep timed the timing section's product (FP32, n = 4) at a median of 1.160 ms, outside the 1.281 to "
        "1.301 ms of that section's repeats: all four medians lie 12.2% apart, more than the 1.6% of the repeats in "
        "a row. This machine's speed drifted between the two sections, so the page reads every later difference of "
        "medians against that 12.2%.")
    inside = T.sweep_drift(repeats, sweep(1.29e-3))
    assert inside["noise_pct"] == pytest.approx(100 * (1.301 / 1.281 - 1))
    assert inside["sweep_drift"].endswith("inside the range of that section's repeats, so the page reads a "
                                          "difference of medians against their 1.6%.")
    # no point of that product in the sweep: the repeats alone, and no sentence
    none = T.sweep_drift(repeats, MatmulSweep("cpu", (_point("bf16", 4, 1e-3),), {}))
    assert none["sweep_drift"] == "" and none["noise_pct"] == pytest.approx(100 * (1.301 / 1.281 - 1))
    with pytest.raises(ValueError, match="at least two"):
        T.sweep_drift(repeats[:1], sweep(1e-3))
    with pytest.raises(ValueError, match="all be of one product"):
        T.sweep_drift([repeats[0], _point("fp32", 8, 1e-3)], sweep(1e-3))


def test_timer_comparison_judges_the_gap_by_the_repeated_medians_spread():
    # the review's numbers: 4.6% apart, repeated medians 1.2% apart (one measurement's quartiles 8.1%)
    beyond = P.timer_comparison(4.6, 1.2, 3)
    assert beyond.startswith("4.6% higher than the median of PyTorch's own `torch.utils.benchmark.Timer` on the "
                             "same shape, more than the 1.2% by which its own 3 repeated medians of this product "
                             "spread (given below), the noise of a median here: every repeated median lies higher "
                             "than Timer's, so the harness reads consistently higher than Timer here, by about 4.6%")
    assert "agree" not in beyond and "8.1" not in beyond
    # the reason offered fits the sign: synchronising per call and rotating buffers can only slow the harness
    assert "A possible reason, not measured here: the harness synchronises around every call" in beyond
    assert "one reused buffer that can stay in a warmer cache" in beyond
    lower = P.timer_comparison(-4.6, 1.2, 3)
    assert "reads consistently lower than Timer here, by about 4.6%" in lower
    assert "possible reason" not in lower and "do not explain this gap" in lower
    within = P.timer_comparison(-1.0, 1.2, 3)
    assert within.startswith("within 1.0% of") and "(lower)" in within
    assert within.endswith("the 1.2% by which its own 3 repeated medians of this product spread (given below), "
                           "the noise of a median here: the two tools agree within this machine's noise")
    assert "cache" not in within and "consistently" not in within
    assert "agree" in P.timer_comparison(1.2, 1.2, 3)
    # every repeated median on one side: said, as a lean one Timer measurement cannot tell from noise
    assert P.timer_comparison(3.0, 11.5, 3, one_side=True).endswith(
        "the two tools agree within this machine's noise, though all 3 repeated medians lie higher than Timer's, a "
        "lean that one Timer measurement cannot tell from noise")
    assert "lean" not in P.timer_comparison(3.0, 11.5, 3)
    with pytest.raises(ValueError, match="spread_pct"):
        P.timer_comparison(1.0, float("nan"), 3)
    with pytest.raises(ValueError, match="diff_pct"):
        P.timer_comparison(float("inf"), 1.0, 3)
    with pytest.raises(ValueError, match="measurements"):
        P.timer_comparison(1.0, 1.0, 1)


def test_spread_against_quartiles_compares_the_widths():
    assert P.spread_against_quartiles(1.0, 2.0, 1.0, 2.0).startswith("inside")
    # wider than the quartiles: the contaminated run's 1.56 vs 16 ms medians against tight quartiles
    assert P.spread_against_quartiles(1.56, 16.0, 1.5, 1.7).startswith("wider")
    assert P.spread_against_quartiles(0.9, 2.0, 1.0, 2.0).startswith("wider")
    # a narrower range that pokes out of the quartiles is not "wider"
    shifted = P.spread_against_quartiles(1.05, 1.12, 1.0, 1.1)
    assert shifted.startswith("no wider") and "not inside" in shifted
    # bimodal quartiles (1.56 to 16 ms) cover repeats 33.5% apart: the opposite is said
    assert P.spread_against_quartiles(3.0, 4.005, 1.56, 16.0).startswith("inside")
    with pytest.raises(ValueError, match="low_median <= high_median"):
        P.spread_against_quartiles(2.0, 1.0, 1.0, 2.0)


def _matmul(points=(), cross=None, cross_check_n=4096) -> MatmulThroughput:
    """A recorded matmul_throughput: ``points`` as (dtype, n, TFLOP/s); timings irrelevant here."""
    return MatmulThroughput((256,), cross_check_n, tuple(MatmulPointSummary(d, n, t, 1.0, 1.0, 1.0, 3)
                                                         for d, n, t in points), {}, cross or {}, 100.0)


def test_recorded_cross_check_compares_the_harness_with_torch_timer():
    record = _record("matmul_throughput", _matmul(cross={"fp32": TimerCrossCheck(0.002, 0.001),
                                                          "bf16": TimerCrossCheck(0.0002, 0.0002)}))
    assert P.recorded_cross_check(record).splitlines() == [
        f"Recorded on **{H100_LABEL}** at n = 4096:", "",
        "| dtype | harness median (ms) | torch Timer median (ms) | harness against Timer |", "|---|---|---|---|",
        "| fp32 | 2.0000 | 1.0000 | +100.0% |", "| bf16 | 0.2000 | 0.2000 | +0.0% |"]


# ---- matmul sweep ------------------------------------------------------------------------------------

SECONDS = {("fp32", 511): 0.004, ("fp32", 512): 0.002, ("bf16", 511): 0.003, ("bf16", 512): 0.0005,
           ("fp16", 511): 0.004, ("fp16", 512): 0.004}


def _sweep(skipped=None):
    return MatmulSweep("cpu", tuple(_point(d, n, s) for (d, n), s in SECONDS.items()),
                       {"tf32": "no tensor cores"} if skipped is None else skipped)


def test_measured_tflops_and_panels_with_and_without_a_record():
    live = P.measured_tflops(_sweep())
    assert list(live) == ["fp32", "bf16", "fp16"]
    assert live["bf16"] == {511: _tflops(511, 0.003), 512: _tflops(512, 0.0005)}
    panels, peaks = P.matmul_panels(_sweep(), "live")
    assert panels == {"live": live} and peaks == {}
    record = _record("matmul_throughput", _matmul([("bf16", 8192, 700.0)]))
    panels, peaks = P.matmul_panels(_sweep(), "live", record)
    assert panels[f"recorded: {H100_LABEL}"] == {"bf16": {8192: 700.0}}
    # the H100 SXM5 entry: no plain TF32-less gap, every dtype has a peak
    assert peaks == {f"recorded: {H100_LABEL}": {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5,
                                                 "fp8": 1979.0}}


def test_matmul_facts_at_the_largest_aligned_and_misaligned_sizes():
    estimate = CPUPeakEstimate(cores=2, clock_ghz=2.6, vector_lanes=16, fma_units=2)   # 0.3328 TFLOP/s
    facts = P.matmul_facts(_sweep(), (511, 512), estimate)
    best = _tflops(512, 0.002)
    assert facts == {"live_big": 512, "live_odd": 511, "live_fp32_big": best, "live_fp32_odd": _tflops(511, 0.004),
                     "live_bf16_ratio": "**4.00**", "live_fp16_ratio": "**0.50**",
                     "cpu_estimate": ("A CPU has no datasheet figure here; cores x clock x FLOPs per cycle (2 x 2.60 "
                                      "GHz x 64, assuming 2 FMA units of 16 FP32 lanes) estimates its FP32 peak at "
                                      f"0.33 TFLOP/s, and the best FP32 product here reached "
                                      f"{percent_text(best / 0.3328)} of that estimate."),
                     "live_odd_16bit": "BF16 and FP16 ran at 0.17 and 0.99 times their own throughput at the "
                                       "aligned size: misalignment slowed BF16 and FP16",
                     "skipped": "TF32 (no tensor cores)"}
    # this CPU's case: the 16-bit products faster at n - 1, and a mixed one
    assert P.misaligned_16bit_phrase({"bf16": 1.31, "fp16": 1.5}).endswith(
        "1.31 and 1.50 times their own throughput at the aligned size: misalignment did not slow them here")
    assert P.misaligned_16bit_phrase({"bf16": 0.5, "fp16": 1.5}).endswith("misalignment slowed only BF16")
    # a slowdown inside the noise of a repeated median does not count
    assert P.misaligned_16bit_phrase({"bf16": 0.49, "fp16": 0.93}, noise_pct=22.2).endswith(
        "misalignment slowed only BF16 beyond the 22.2% the medians of one product moved here (FP16 lost less "
        "than that)")
    assert P.misaligned_16bit_phrase({"bf16": 0.95, "fp16": 0.93}, noise_pct=22.2).endswith(
        "neither slowed beyond the 22.2% the medians of one product moved here")
    assert P.misaligned_16bit_phrase({"bf16": 0.5, "fp16": 0.5}, noise_pct=10.0).endswith(
        "misalignment slowed BF16 and FP16 beyond the 10.0% the medians of one product moved here")
    with pytest.raises(ValueError, match="noise_pct"):
        P.misaligned_16bit_phrase({"bf16": 0.5}, noise_pct=-1.0)
    for bad in ({}, {"bf16": math.nan}, {"bf16": 0.0}):
        with pytest.raises(ValueError, match="positive finite throughput ratios"):
            P.misaligned_16bit_phrase(bad)
    above = P.cpu_estimate_sentence(CPUPeakEstimate(cores=1, clock_ghz=0.001, vector_lanes=4, fma_units=1), best)
    assert "More than 100% means the estimate is too low" in above
    assert "too low" not in facts["cpu_estimate"]
    plain = P.matmul_facts(_sweep(skipped={}), (511, 512), None)
    assert plain["cpu_estimate"] == "" and plain["skipped"] == "none"
    with pytest.raises(ValueError, match="a multiple of 8 and a size that is not one"):
        P.matmul_facts(_sweep(), (512,), None)
    no_fp16 = MatmulSweep("cpu", tuple(p for p in _sweep().points if p.dtype != "fp16"), {})
    with pytest.raises(ValueError, match="did not run fp16"):
        P.matmul_facts(no_fp16, (511, 512), None)


def _matmul_record(device_name="NVIDIA H100 80GB HBM3", fp8=True):
    values = {"bf16": {256: 1.0, 8191: 151.0, 8192: 716.0}, "fp32": {256: 0.7, 8191: 40.0, 8192: 50.9}}
    if fp8:
        values["fp8"] = {256: 0.5, 8192: 1300.0}
    points = [(d, n, t) for d, by_n in values.items() for n, t in by_n.items()]
    return _record("matmul_throughput", _matmul(points), device_name=device_name)


def test_recorded_matmul_note_with_the_datasheet_and_fp8():
    record = _matmul_record()
    # 716 / 989.5 = 72%, 716 / 50.9 = 14.1, 1300 / 716 = 1.82, 1300 / 1979 = 66%, 716 / 151 = 4.7
    assert P.recorded_matmul_note(record) == (
        f"On the recorded **{H100_LABEL}**, BF16 reaches 716 TFLOP/s at n = 8192, 72% of the datasheet's dense "
        "989.5, 14.1 times FP32 with TF32 off (50.9 TFLOP/s). FP8 reaches 1300 TFLOP/s, 1.82 times BF16 and 66% of "
        "its dense peak. One element less, n = 8191, costs BF16 a factor of 4.7 (151 against 716 TFLOP/s): tensor "
        "cores want dimensions in multiples of 8 (16 bytes). At n = 256, BF16 gives 1.0 TFLOP/s against FP32's "
        "0.7: a small product is launch-bound, and a faster dtype buys little.\n\n" + describe_records([record]))


def test_recorded_matmul_note_without_a_datasheet_entry_or_fp8():
    note = P.recorded_matmul_note(_matmul_record("Some GPU", fp8=False))
    assert note.startswith("On the recorded **Some GPU (sm 9.0)**, BF16 reaches 716 TFLOP/s at n = 8192, 14.1 times "
                           "FP32 with TF32 off (50.9 TFLOP/s). One element less, n = 8191,")
    assert "FP8" not in note and "datasheet" not in note


# ---- roofline ----------------------------------------------------------------------------------------

def test_roofline_ceilings_and_facts():
    ceilings = P.roofline_ceilings(_sweep(), 30.0, "cpu")
    assert ceilings == {"H100 SXM5 BF16 (datasheet)": (989.5, 3350.0), "A100 BF16 (datasheet)": (312.0, 2039.0),
                        "this CPU, best measured (BF16)": (_tflops(512, 0.0005), 30.0)}
    ops = [OpCost("norm", 100.0, 1.0), OpCost("matmul", 1000.0, 1.0), OpCost("softmax", 5.0, 4.0)]
    facts = P.roofline_facts(ops, 30.0, DATASHEET_PEAKS["H100 SXM5"])
    assert facts == {"bandwidth": 30.0, "h100_ridge": pytest.approx(989.5e3 / 3350), "memory_bound": "norm, softmax"}
    no_bf16 = GPUPeaks("Old", "7.0", {"fp32": 1.0, "tf32": None, "bf16": None, "fp16": 2.0, "fp8": None}, 100.0, "x")
    with pytest.raises(ValueError, match="Old has no BF16 peak"):
        P.roofline_facts(ops, 30.0, no_bf16)


def test_roofline_speedups_wrap_roofline_rows_for_one_gpu():
    config, h100 = gpt_config_for(SizeProfile("full")), DATASHEET_PEAKS["H100 SXM5"]
    rows = roofline_speedups(config, h100, "tf32")
    expected = roofline_rows(512, 8, 256, 64, peak_high=494.5, peak_low=989.5, bandwidth_gbs=3350.0)
    assert list(rows.values()) == list(expected) and list(rows) == [r.name for r in expected]
    with pytest.raises(ValueError, match="V100 SXM2 lacks a tf32 or BF16 peak"):
        roofline_speedups(config, DATASHEET_PEAKS["V100 SXM2"], "tf32")


def _row(name, bound_high, bound_low, high, low):
    return RooflineRow(name, 1.0, 1.0, bound_high, bound_low, high, low)


# the mlp is memory-bound in TF32 and compute-bound in FP32: the table must tell the two baselines apart
VS_TF32 = {"norm": _row("norm", "memory", "memory", 2.0, 1.0), "mlp": _row("mlp", "memory", "compute", 3.0, 1.5),
           "AdamW step": _row("AdamW step", "memory", "memory", 1.0, 1.0)}
VS_FP32 = {"norm": _row("norm", "memory", "memory", 2.0, 1.0), "mlp": _row("mlp", "compute", "compute", 14.0, 1.0),
           "AdamW step": _row("AdamW step", "memory", "memory", 1.0, 1.0)}


def test_speedup_table_and_facts():
    assert P.speedup_table(VS_TF32, VS_FP32).splitlines() == [
        "| operation | bound in BF16 | bound in TF32 | BF16 over TF32 | bound in FP32 (TF32 off) "
        "| BF16 over FP32 (TF32 off) |", "|---|---|---|---|---|---|",
        "| norm | memory | memory | 2.00x | memory | 2.00x |", "| mlp | compute | memory | 2.00x | compute | 14.00x |",
        "| AdamW step | memory | memory | 1.00x | memory | 1.00x |"]
    assert P.speedup_facts(VS_TF32, VS_FP32) == {"mem_speedup": 2.0, "compute_speedup_fp32": 14.0,
                                                 "compute_speedup_tf32": 2.0}
    with pytest.raises(ValueError, match="same operations"):
        P.speedup_table(VS_TF32, {"norm": VS_FP32["norm"]})
    with pytest.raises(ValueError, match="memory-bound in both"):
        P.speedup_facts({"mlp": VS_TF32["mlp"]}, {"mlp": VS_FP32["mlp"]})


# ---- training throughput and time to target ------------------------------------------------------------

def _run(recipe, step_seconds, losses=(3.0, 2.0, 1.0), compiled=False, seed=0):
    # warm-up 1: the median step is taken over the later steps; 100 tokens per step
    return RecipeRun(recipe, seed, compiled, tuple(losses), (1.0, step_seconds, step_seconds), 100, 1)


def _study(peaks=None, compiled=True):
    runs = [_run("fp32", 0.5), _run("bf16_autocast", 0.25), _run("fp16_autocast_scaler", 0.4)]
    if compiled:
        runs.append(_run("fp32", 0.4, compiled=True))
    return ThroughputStudy("cpu", tuple(runs), 1e9, {"fp32": 1.0} if peaks is None else peaks, "a peak")


def test_throughput_facts_on_a_cpu_and_on_a_gpu():
    facts = P.throughput_facts(_study(), on_gpu=False)
    # 200, 400 and 250 tokens/s; FP32's MFU 200 * 1e9 / 1e12
    caveat = facts.pop("throughput_caveat")
    assert facts == {"tp_seeds": 1,          # every run is seed 0; the compiled run is not counted
                     "live_bf16_speed": "**2.00**", "live_fp16_speed": "**1.25**", "live_fp32_mfu": "**20.0%**",
                     "mfu_source": "a peak"}
    assert caveat.startswith("These are this machine's ratios only: they do not transfer to a GPU's tensor cores")
    # three denominators, each named
    assert "uses three measured ones" in caveat and "probe's FP32 product" in caveat
    assert "probe's fastest dtype" in caveat and "best median of this page's sweep" in caveat
    # a tiny MFU (a loaded CPU) keeps its digits instead of printing 0%
    tiny = P.throughput_facts(_study(peaks={"fp32": 60.0}), on_gpu=False)
    assert tiny["live_fp32_mfu"] == "**0.333%**"
    assert P.throughput_facts(_study(), on_gpu=True)["throughput_caveat"] == (
        "The live runs compile `fp32` with `torch.compile` (one seed, blue in the figure); `python -m "
        "course_lib.gpu_session` records every recipe compiled in the model ladder below.")
    two_seeds = dataclasses.replace(_study(), runs=_study().runs + (_run("fp32", 0.5, seed=1),))
    assert P.throughput_facts(two_seeds, on_gpu=False)["tp_seeds"] == 2
    eager_only = _study(compiled=False)
    assert P.throughput_facts(eager_only, on_gpu=True)["throughput_caveat"] == (
        "The live runs skip `torch.compile`; `python -m course_lib.record training_throughput` measures compiled "
        "runs too.")
    with pytest.raises(ValueError, match="no peak to measure FP32's MFU against"):
        P.throughput_facts(_study(peaks={}), on_gpu=False)
    with pytest.raises(ValueError, match="no eager run of fp16_autocast_scaler"):
        P.throughput_facts(ThroughputStudy("cpu", (_run("fp32", 0.5), _run("bf16_autocast", 0.25)), 1e9,
                                           {"fp32": 1.0}, ""), on_gpu=False)


def test_recorded_seeds_phrase_counts_eager_and_compiled_seeds():
    two_seeds = dataclasses.replace(_study(), runs=_study().runs + (_run("fp32", 0.5, seed=1),))
    assert P.recorded_seeds_phrase(two_seeds) == "the recorded GPU run: two seeds eager, one seed compiled"
    assert P.recorded_seeds_phrase(_study(compiled=False)) == "the recorded GPU run: one seed eager"
    assert P.recorded_seeds_phrase(None) == "no GPU run is recorded yet"
    with pytest.raises(TypeError, match="ThroughputStudy"):
        P.recorded_seeds_phrase("a study")


def test_recorded_throughput_note_tabulates_eager_and_compiled_runs():
    study = _study(peaks={"fp32": 0.5, "bf16_autocast": 2.0})
    study = dataclasses.replace(study, peak_source="datasheet dense peaks of H100 SXM5")
    record = _record("training_throughput", study)
    note = P.recorded_throughput_note(record)
    assert note == (
        f"Recorded on **{H100_LABEL}** at full size (datasheet dense peaks of H100 SXM5; compiled runs: one seed). "
        "BF16 autocast runs 2.00 times as many tokens per second as FP32, yet it uses only 20.0% of the BF16 peak: "
        "a model of this size keeps the GPU busy with launches and memory-bound operations, not with matrix "
        "products. The two MFU columns divide the same FLOP rate by different peaks: each recipe's own dtype's, and "
        "the dense BF16 peak (2 TFLOP/s) for every recipe, as the ladder below and the literature do. They differ "
        "by the ratio of the peaks: of all the runs in the table, fp32 (compiled) has the highest MFU against its "
        "own peak, 50.0%; against the one BF16 peak the runs rank as their token rates do, bf16_autocast (eager) "
        "highest at 20.0% and fp32 (eager) at 10.0%.\n\n"
        # 1 GFLOP per token: FP32's 200 tokens/s are 40% of its 0.5 TFLOP/s and 10% of BF16's 2
        "| recipe | compiled | step (ms) | tokens/s | vs FP32 eager | MFU (own peak, TFLOP/s) | MFU (BF16 peak) |\n"
        "|---|---|---|---|---|---|---|\n"
        "| fp32 | no | 500.0 | 200 | 1.00x | 40.0% of 0.5 | 10.0% |\n"
        "| fp32 | yes | 400.0 | 250 | 1.25x | 50.0% of 0.5 | 12.5% |\n"
        "| bf16_autocast | no | 250.0 | 400 | 2.00x | 20.0% of 2 | 20.0% |\n"
        "| fp16_autocast_scaler | no | 400.0 | 250 | 1.25x | - | 12.5% |\n\n" + describe_records([record]))
    with pytest.raises(ValueError, match="with a BF16 peak"):
        P.recorded_throughput_note(_record("training_throughput", _study(peaks={"fp32": 0.5})))


def _time_study():
    ones, halves = (1.0,) * 5, (0.5,) * 5
    runs = (RecipeRun("fp32", 0, False, (5.0, 4.0, 3.0, 2.0, 1.0), ones, 100, 1),
            RecipeRun("bf16_autocast", 0, False, (5.0, 5.0, 4.0, 4.0, 3.0), halves, 100, 1),
            RecipeRun("fp32", 0, True, (9.0,) * 5, ones, 100, 1))
    return ThroughputStudy("recorded", runs, 1e9, {}, "")


def test_target_loss_and_eager_curves_leave_compiled_runs_out():
    study = _time_study()
    assert study.target_loss() == pytest.approx(4.2)          # bf16's last five: 21 / 5; fp32's: 3
    assert study.target_loss(window=2) == 3.5
    assert study.eager_curves() == {"fp32": [((1.0,) * 5, (5.0, 4.0, 3.0, 2.0, 1.0))],
                                    "bf16_autocast": [((0.5,) * 5, (5.0, 5.0, 4.0, 4.0, 3.0))]}
    with pytest.raises(ValueError, match="window must be a positive int"):
        study.target_loss(window=0)
    with pytest.raises(ValueError, match="no eager run"):
        ThroughputStudy("x", (study.runs[2],), 1e9, {}, "").target_loss()


def test_time_to_target_facts_and_the_recorded_note():
    facts = P.time_to_target_facts(4.2, {"fp32": [1.234, 2.0], "bf16_autocast": [0.5]})
    caveat = facts.pop("ttt_caveat")
    # three significant digits, so short CPU times keep their differences
    assert facts == {"target": 4.2, "ttt": "fp32 1.23 to 2.00 s, bf16_autocast 0.500 to 0.500 s",
                     "ttt_order": " `bf16_autocast` reached it before `fp32` in every seed (its slowest run "
                                  "before the fastest of `fp32`)."}
    # an order is said only where the ranges do not overlap
    assert P.time_to_target_order({"fp32": (1.0, 2.0), "bf16_autocast": (1.5, 1.8), "fp16_autocast_scaler": (
        2.5, 3.0)}) == (" The range of `bf16_autocast` overlaps that of `fp32`, so neither came first in every "
                        "seed; `fp16_autocast_scaler` reached it after `fp32` in every seed (its fastest run after "
                        "the slowest of `fp32`).")
    assert P.time_to_target_order({"fp32": (1.0, 2.0)}) == P.time_to_target_order({"bf16": (1.0, 2.0)}) == ""
    assert P.time_to_target_facts(4.2, {"fp32": [0.1504, 0.1538]})["ttt"] == "fp32 0.150 to 0.154 s"
    assert P.time_to_target_facts(4.2, {"fp32": [123.4]})["ttt"] == "fp32 123 to 123 s"
    assert caveat.startswith(" These are CPU times")
    assert P.time_to_target_facts(4.2, {"fp32": [1.0]}, on_gpu=True)["ttt_caveat"] == ""
    with pytest.raises(ValueError, match="not every run of fp32 reached the target"):
        P.time_to_target_facts(4.2, {"fp32": [1.0, None]})
    # the target, 4.2, is first reached at the fifth step by both: 5 s and 2.5 s
    assert P.recorded_time_to_target_note(_time_study()) == (
        "On the recorded GPU, to reach 4.200 (eager runs, range over 1 seed): fp32: 5.00 to 5.00 s; "
        "bf16_autocast: 2.50 to 2.50 s. Compiled runs are left out here: their first steps include compilation, "
        "which a compile cache warmed by the previous recipe shortens, so their times to target are not "
        "comparable with each other.")



def test_fp16_against_parity_record_says_the_runs_differ_and_where_the_parity_run_failed():
    from course_lib.studies.bf16 import Parity

    nan = math.nan
    scaler = "fp16_autocast_scaler"
    ones = (1.0,) * 4
    study = ThroughputStudy("recorded", (RecipeRun(scaler, 0, False, (5.0, 4.0, 3.0, 2.0), ones, 100, 1),
                                         RecipeRun(scaler, 1, False, (5.0, 4.0, 3.5, 2.5), ones, 100, 1)), 1e9, {}, "")

    def parity(curve, finals=(nan, 2.9, nan)):
        return _record("convergence_parity", Parity((scaler,), (0, 1, 2), {scaler: finals}, {scaler: curve}))
    late = P.fp16_against_parity_record(study, parity((3.0,) * 6 + (nan,) * 4))
    assert late == ("Every eager `fp16_autocast_scaler` run of this record stayed finite over its 4 steps, yet the "
                    "parity record in {doc}`05_bf16_vs_fp16`, on " + H100_LABEL + ", ended that recipe with a NaN "
                    "loss in 2 of 3 seeds. They are different runs: the parity runs trained 10 steps, and seed 0, "
                    "whose curve the record keeps, first failed at step 6 (counting from 0), after the last step "
                    "these runs trained.")
    early = P.fp16_against_parity_record(study, parity((3.0,) * 2 + (nan,) * 8))
    assert "first failed at step 2 (counting from 0), within the steps these runs trained, where this record's " \
           "seeds did not fail." in early
    assert "does not say at which step" in P.fp16_against_parity_record(study, parity((3.0,) * 10, (2.9, nan, 3.0)))
    # nothing to reconcile: no parity record, no NaN seed there, or a failed run in this record too
    assert P.fp16_against_parity_record(study, None) == ""
    assert P.fp16_against_parity_record(study, parity((3.0,) * 10, (2.9, 2.8, 3.0))) == ""
    broken = ThroughputStudy("recorded", (RecipeRun(scaler, 0, False, (5.0, nan), (1.0, 1.0), 100, 1),), 1e9, {}, "")
    assert P.fp16_against_parity_record(broken, parity((3.0,) * 6 + (nan,) * 4)) == ""
    with pytest.raises(TypeError, match="recorded convergence_parity"):
        P.fp16_against_parity_record(study, _record("training_throughput", study))
    with pytest.raises(TypeError, match="expected a recorded ThroughputStudy, got dict"):
        P.fp16_against_parity_record({"runs": []}, None)


# ---- profiler ----------------------------------------------------------------------------------------

STEPS = {"fp32": ProfiledStep("fp32", "cpu", (("aten::mm", 1780.0, 19), ("aten::copy_", 430.0, 154)), 2000.0, 100.0),
         "bf16_autocast": ProfiledStep("bf16_autocast", "cpu", (("aten::mm", 1250.0, 19),), 2000.0, 500.0)}


def test_top_ops_table_and_cast_facts():
    table = P.top_ops_table(STEPS)
    assert isinstance(table, MarkdownTable)
    assert table.splitlines() == ["| recipe | operator | self time (ms) | calls |", "|---|---|---|---|",
                                  "| fp32 | `aten::mm` | 1.78 | 19 |", "| fp32 | `aten::copy_` | 0.43 | 154 |",
                                  # the casts the prose quotes: _to_copy's self time added to copy_'s, listed or not
                                  "| fp32 | casts: `aten::_to_copy` + `aten::copy_` | 0.10 | - |",
                                  "| bf16_autocast | `aten::mm` | 1.25 | 19 |",
                                  "| bf16_autocast | casts: `aten::_to_copy` + `aten::copy_` | 0.50 | - |"]
    facts = P.cast_facts(STEPS)
    assert facts == {"cast_fp32": 5.0, "cast_bf16": 25.0, "cast_fp32_ms": 0.1, "cast_bf16_ms": 0.5,
                     "cast_verdict": P.cast_verdict(STEPS["fp32"], STEPS["bf16_autocast"])}
    assert facts["cast_verdict"].startswith("autocast adds 0.40 ms (20.0 points) of casts and copies, the price")
    with pytest.raises(ValueError, match="profiled bf16_autocast step"):
        P.cast_facts({"fp32": STEPS["fp32"]})


def test_cast_verdict_follows_time_and_share():
    def step(total, cast):
        return ProfiledStep("r", "cpu", (), total, cast)
    # more cast time and a larger share: the price shows
    assert P.cast_verdict(step(2000, 100), step(2000, 500)).startswith("autocast adds 0.40 ms (20.0 points)")
    assert P.cast_verdict(step(2000, 100), step(2000, 500)).endswith(
        "(one profiled step per recipe: a single measurement, with no repeat to show its noise)")
    # more cast time, but a slower step around it: the share did not grow
    assert "share did not" in P.cast_verdict(step(2000, 100), step(20000, 500))
    # no more cast time than FP32's own copies (the reverse a loaded CPU can show): not the price
    reverse = P.cast_verdict(step(2000, 150), step(2000, 100))
    assert reverse.startswith("on this machine autocast's conversions took no longer than FP32's own copies (0.10 "
                              "against 0.15 ms)")
    assert "does not show there" in reverse and "price it pays" not in reverse
    # within the margin counts as no more; the sentence names the machine it describes
    assert P.cast_verdict(step(2000, 100), step(2000, 105), where="that GPU").startswith(
        "on that GPU autocast's conversions took no more than 10% longer")
    with pytest.raises(ValueError, match="margin"):
        P.cast_verdict(step(1, 1), step(1, 1), margin=0.5)


def test_recorded_profile_note_names_cast_shares_and_top_three():
    ops = (("aten::mm", 9.0, 1), ("aten::copy_", 8.0, 1), ("aten::bmm", 7.0, 1), ("aten::add", 6.0, 1))
    record = _record("profiled_step", ProfiledSteps((ProfiledStep("fp32", "cuda", ops, 1000.0, 52.0),
                                                     ProfiledStep("bf16_autocast", "cuda", ops[1:], 1000.0, 253.0))))
    assert P.recorded_profile_note(record) == (
        f"On the recorded **{H100_LABEL}** (CUDA time), casts take fp32 5.2%, bf16_autocast 25.3% of the operator "
        "time. There, autocast adds 0.20 ms (20.1 points) of casts and copies, the price it pays for converting "
        "weights and activations on the fly (one profiled step per recipe: a single measurement, with no repeat "
        "to show its noise). Top three operators: fp32: `aten::mm`, `aten::copy_`, `aten::bmm`; bf16_autocast: `aten::copy_`, "
        "`aten::bmm`, `aten::add`.\n\n" + describe_records([record]))
    # where the GPU's casts grew in time but not in share, the sentence names that GPU, not this machine
    grew = _record("profiled_step", ProfiledSteps((ProfiledStep("fp32", "cuda", ops, 1000.0, 100.0),
                                                   ProfiledStep("bf16_autocast", "cuda", ops, 4000.0, 200.0))))
    assert "on that GPU the low-precision operators, not the casts, are the cost" in P.recorded_profile_note(grew)


# ---- memory ------------------------------------------------------------------------------------------

def _breakdown(recipe, weights, grads, state, masters, copies, activations):
    components = {"weights": weights, "gradients": grads, "optimizer_state": state, "master_weights": masters,
                  "autocast_weight_copies": copies, "activations": activations}
    return MemoryBreakdown(recipe, "cpu", 10, 1, 1, components)


BREAKDOWNS = [_breakdown("fp32", 40, 40, 80, 0, 0, 1000), _breakdown("bf16_autocast", 40, 40, 80, 0, 2048, 600),
              _breakdown("bf16_pure", 20, 20, 40, 0, 0, 600), _breakdown("bf16_master", 20, 60, 80, 40, 0, 600)]


def test_memory_facts_per_parameter_and_transient():
    assert M.memory_facts(BREAKDOWNS) == {"act_ratio": 0.6, "copies_kib": 2.0, "bpp_fp32": 16.0,
                                          "bpp_autocast": 16.0, "bpp_pure": 8.0, "bpp_master": 20.0}
    with pytest.raises(ValueError, match="no memory breakdown of bf16_master"):
        M.memory_facts(BREAKDOWNS[:3])


def test_recorded_memory_note_counts_against_the_allocator_peak():
    fp32 = MemoryBreakdown("fp32", "cuda", 10, 1, 1, {"weights": 2 ** 30, "activations": 2 ** 30}, 3 * 2 ** 30)
    record = _record("training_memory", TrainingMemory((fp32,), ActivationSweep("bf16_autocast", ())))
    note = M.recorded_memory_note(record)
    assert note.startswith(f"Recorded on **{H100_LABEL}** at full size: the counted bytes against "
                           "`torch.cuda.max_memory_allocated` for the step.")
    assert note.endswith("\n\n| recipe | counted (MiB) | allocator peak (MiB) | peak over counted |\n|---|---|---|---|\n"
                         "| fp32 | 2,048 | 3,072 | 1.50 |\n\n" + describe_records([record]))
    no_peak = dataclasses.replace(fp32, measured_peak_bytes=None)
    with pytest.raises(ValueError, match="no allocator peak"):
        M.recorded_memory_note(_record("training_memory", TrainingMemory((no_peak,), ActivationSweep("x", ()))))
    with pytest.raises(TypeError, match="expected a recorded MatmulThroughput, got dict"):
        P.recorded_cross_check(_record("matmul_throughput", {"cross_check": {}}))
    with pytest.raises(TypeError, match="expected a recorded TrainingMemory, got dict"):
        M.recorded_memory_note(_record("training_memory", {"breakdowns": []}))


def test_recorded_memory_note_says_when_fewer_counted_bytes_peaked_higher():
    mib = 2 ** 20
    pure = MemoryBreakdown("bf16_pure", "cuda", 10, 1, 1, {"weights": 1000 * mib}, 2192 * mib)
    master = MemoryBreakdown("bf16_master", "cuda", 10, 1, 1, {"weights": 1100 * mib}, 2108 * mib)
    fp32 = MemoryBreakdown("fp32", "cuda", 10, 1, 1, {"weights": 3000 * mib}, 3200 * mib)
    assert M.peak_inversions([fp32, pure, master]) == [(pure, master)]
    assert M.peak_inversions([fp32, master]) == M.peak_inversions([dataclasses.replace(pure, measured_peak_bytes=None),
                                                                   master]) == []
    # the same count (BF16 and FP16 autocast): only the one that peaked higher, and never a recipe with itself
    bf16 = MemoryBreakdown("bf16_autocast", "cuda", 10, 1, 1, {"weights": 2400 * mib}, 2679 * mib)
    fp16 = MemoryBreakdown("fp16_autocast_scaler", "cuda", 10, 1, 1, {"weights": 2400 * mib}, 2848 * mib)
    assert M.peak_inversions([bf16, fp16]) == [(fp16, bf16)]
    assert M.peak_inversions([bf16, dataclasses.replace(fp16, measured_peak_bytes=2679 * mib)]) == []
    assert ("Here `fp16_autocast_scaler` counts the same bytes as `bf16_autocast` but peaked higher (2,848 against "
            "2,679 MiB) and `bf16_pure` counts fewer bytes than `bf16_master`") in M.recorded_memory_note(
        _record("training_memory", TrainingMemory((bf16, fp16, pure, master), ActivationSweep("x", ()))))

    def note(*steps):
        return M.recorded_memory_note(_record("training_memory", TrainingMemory(steps, ActivationSweep("x", ()))))
    old = note(fp32, pure, master)
    assert ("Here `bf16_pure` counts fewer bytes than `bf16_master` but peaked higher (2,192 against 2,108 MiB). "
            "The allocator's peak counts every tensor on the GPU, not only this step's, so it can include tensors an "
            "earlier recipe left for the garbage collector. This record did not measure what was on the device "
            "before each recipe") in old
    assert "on the device before (MiB)" not in old
    # a record that kept each recipe's baseline shows it, and says what the column is
    kept = note(*(dataclasses.replace(b, baseline_bytes=(i + 1) * mib) for i, b in enumerate((fp32, pure, master))))
    assert "| on the device before (MiB) |" in kept and "| bf16_pure | 1,000 | 2,192 | 2.19 | 2 |" in kept
    assert "The last column shows what was on the device, after a garbage collection, before each recipe" in kept
    assert "Here" not in note(fp32, master)


def test_account_training_memory_collects_garbage_before_reading_what_the_device_holds(monkeypatch):
    from course_lib.studies import performance as perf

    order = []
    monkeypatch.setattr(perf.gc, "collect", lambda: order.append("collect") or 0)
    monkeypatch.setattr(perf, "allocated_bytes", lambda device: order.append("read") or 4096)
    b = perf.account_training_memory("fp32", SizeProfile("small"), "cpu", batch_size=2, context=16)
    assert order == ["collect", "read"] and b.baseline_bytes == 4096
    monkeypatch.undo()
    assert perf.account_training_memory("fp32", SizeProfile("small"), "cpu", batch_size=2,
                                        context=16).baseline_bytes is None   # a CPU keeps no such counter


def test_persistent_memory_table_and_facts():
    assert M.persistent_memory_table(("fp32", "bf16_pure"), (1e9, 7e9)).splitlines() == [
        "| recipe | bytes per parameter | 1B params (GB) | 7B params (GB) |", "|---|---|---|---|",
        "| fp32 | 16 | 16 | 112 |", "| bf16_pure | 8 | 8 | 56 |"]
    assert M.persistent_memory_facts() == {"gb_7b": 112.0}


def test_activation_facts_fit_the_quadratic_term_and_the_checkpoint_ratio():
    # bytes = 10 T + T^2 at batch 8; checkpointing keeps a quarter at the largest shape
    points = ((1, 64, False, 600), (1, 64, True, 150),
              *((8, t, False, 10 * t + t * t) for t in (16, 32, 64)), (8, 16, True, 100), (8, 64, True, 1184))
    facts = M.activation_facts(ActivationSweep("bf16_autocast", points))
    assert facts == {"ckpt_ratio": 4.0, "quad_share": pytest.approx(100 * 4096 / 4736), "quad_t": 64}
    with pytest.raises(ValueError, match=r"checkpointed point at \(8, 64\)"):
        ActivationSweep("x", ((8, 64, False, 10), (8, 32, True, 5))).checkpoint_ratio()


# ---- errata and exercises ------------------------------------------------------------------------------

def test_errata_rows_from_the_full_config_breakdowns_and_speeds():
    rows = P.performance_errata_rows(gpt_config_for(SizeProfile("full")), BREAKDOWNS, _study(), batch=64)
    assert [c for c, _ in rows] == [
        "The A100 does 624 TFLOP/s in FP16.", "A matmul costs 2mn² FLOPs.",
        "Mixed precision training with Adam needs 12 bytes per parameter.", "Mixed precision halves training memory.",
        "With AMP a 7B model keeps an FP16 copy of its weights and FP16 gradients.", "Lower precision is always faster.",
        "GPT-2 trains on an A100 at 15k/42k/40k tokens/s in FP32/FP16/BF16."]
    measured = [m for _, m in rows]
    assert measured[0] == ("624 is the figure with 2:4 structured sparsity; the dense FP16 peak is 312 TFLOP/s (and "
                           "156 for TF32).")
    # 64 x 256 tokens by 512, times 512 x 2048: 2 * 16384 * 2048 * 512
    assert measured[1] == ("[M, K] @ [K, N] costs 2MNK; for the course model's MLP up-projection at batch 64 (16384 x "
                           "512 @ 512 x 2048) that is 34,359,738,368, not 137,438,953,472.")
    assert measured[2].endswith("measured here 16 in all; BF16 weights with FP32 masters in the course's loop: 20.")
    assert measured[3] == ("Under torch.amp the persistent state is unchanged (16 bytes per parameter); only "
                           "activations shrink, here to 0.60 of FP32's.")
    assert "(2 KiB during a step of this page's model). For 7B parameters the persistent state is 112 GB." in measured[4]
    assert measured[5] == "On this machine FP16 autocast trains at 1.25 times FP32's speed."   # one seed: no range
    two_seeds = dataclasses.replace(_study(), runs=_study().runs + (_run("fp32", 0.3, seed=1),
                                                                    _run("fp16_autocast_scaler", 0.45, seed=1)))
    assert P.performance_errata_rows(gpt_config_for(SizeProfile("full")), BREAKDOWNS, two_seeds, batch=64)[5][1].endswith(
        "the two recipes' token rates over seeds overlap, so this run does not separate them.")
    cpu = P.performance_errata_rows(gpt_config_for(SizeProfile("full")), BREAKDOWNS, _study(), batch=64,
                                    device_label="this CPU", sweeps={"live": {"fp32": {8: 2.0}, "fp16": {8: 1.0}}},
                                    studies={"the recorded GPU": _study()})
    assert cpu[5][1] == ("On the recorded GPU, a whole BF16 autocast training step (eager) ran at 2.00 times FP32's "
                         "token rate. On this CPU FP16 autocast trains at 1.25 times FP32's speed (a CPU, so this is "
                         "not a GPU's figure). In the live sweep on this CPU (its FP8 product, an "
                         "emulation, not compared), FP16 ran at 0.50 times the throughput of FP32 (TF32 off) at n = 8: "
                         "fewer bits, slower product.")


def test_normalisation_erratum_places_layer_norm_below_the_ridge():
    ops = [OpCost("softmax", 5.0, 4.0), OpCost("layer norm", 8.0, 4.0)]
    rows = P.performance_errata_rows(gpt_config_for(SizeProfile("full")), BREAKDOWNS, _study(), batch=64, ops=ops)
    claim, measured = rows[-2]
    ridge = 989.5e3 / 3350.0      # the H100 SXM5's BF16 dense peak (GFLOP/s) over its bandwidth (GB/s)
    assert claim == "Tensor cores speed up BatchNorm and the other layers too."
    assert (f"layer norm does 2.0 FLOPs per byte, {ridge / 2:.0f} times below the H100 SXM5's ridge point "
            f"({ridge:.0f} FLOPs per byte") in measured
    assert len(P.performance_errata_rows(gpt_config_for(SizeProfile("full")), BREAKDOWNS, _study(), batch=64)) == 7
    with pytest.raises(ValueError, match="layer norm"):
        E.normalisation_erratum([OpCost("softmax", 5.0, 4.0)])


def test_gpt2_rates_erratum_turns_rates_into_flops_and_peak_shares():
    claim, measured = E.gpt2_rates_erratum()
    assert claim == "GPT-2 trains on an A100 at 15k/42k/40k tokens/s in FP32/FP16/BF16."
    flops = 6 * 12 * 12 * 768 ** 2 + 12 * 12 * 1024 * 768          # 6N + 12 L T d
    assert f"GPT-2 small costs {flops / 1e9:.2f} GFLOP per trained token" in measured
    assert (f"15k tokens/s in FP32 is {15e3 * flops / 1e12:.1f} TFLOP/s, {100 * 15e3 * flops / 19.5e12:.0f}% of the "
            "A100's dense FP32 peak of 19.5") in measured
    assert f"40k tokens/s in BF16 is {40e3 * flops / 1e12:.1f} TFLOP/s, {100 * 40e3 * flops / 312e12:.0f}%" in measured
    with pytest.raises(ValueError, match="no fp8 peak"):      # an A100 has no FP8 tensor cores
        E.gpt2_rates_erratum({"fp8": 1.0})
    with pytest.raises(ValueError, match="unknown matmul dtype 'int8'"):
        E.gpt2_rates_erratum({"int8": 1.0})


def test_slowest_lower_precision_orders_dtypes_by_bits():
    # FP8 below FP16 at 512 (0.5) is worse than BF16 below TF32 at 256 (0.9); BF16 against FP16 never counts
    sweep = {"fp32": {256: 1.0, 512: 5.0}, "tf32": {256: 2.0, 512: 8.0}, "bf16": {256: 1.8, 512: 9.0},
             "fp16": {256: 3.0, 512: 12.0}, "fp8": {256: 4.0, 512: 6.0}}
    assert E.slowest_lower_precision(sweep) == ("fp8", "fp16", 512, 0.5)
    assert E.slowest_lower_precision({"fp32": {8: 1.0}, "bf16": {8: 2.0}, "fp16": {8: 1.0}}) is None
    # sizes one dtype lacks are not compared
    assert E.slowest_lower_precision({"fp32": {8: 1.0}, "fp8": {16: 0.1}}) is None
    with pytest.raises(ValueError, match="unknown matmul dtypes"):
        E.slowest_lower_precision({"int8": {8: 1.0}})


def test_launch_bound_and_product_microseconds():
    sweep = {"fp16": {512: 5.0, 8192: 100.0}, "fp8": {512: 20.0, 8192: 100.0}}
    assert E.launch_bound(sweep, "fp16", 512) and not E.launch_bound(sweep, "fp8", 512)   # 5% and 20% of best
    assert not E.launch_bound(sweep, "fp16", 8192)
    assert E.launch_bound(sweep, "fp8", 512, share=0.25)
    with pytest.raises(ValueError, match="no fp16 product at n = 64"):
        E.launch_bound(sweep, "fp16", 64)
    with pytest.raises(ValueError, match="share"):
        E.launch_bound(sweep, "fp16", 512, share=1.0)
    assert E.product_microseconds(1000, 2.0) == pytest.approx(1000.0)      # 2e9 FLOPs at 2e12 FLOP/s: 1 ms
    with pytest.raises(ValueError, match="tflops must be positive"):
        E.product_microseconds(8, 0.0)


def test_a_gpu_sweeps_launch_bound_gap_is_not_blamed_on_the_bits():
    # FP8 at 0.6x FP16 at n = 512, where both reach under 10% of their best: launch-bound; at 8192 FP8 wins
    sweep = {"fp16": {512: 5.0, 8192: 100.0}, "fp8": {512: 3.0, 8192: 180.0}}
    assert E.slowest_lower_precision(sweep) == ("fp8", "fp16", 512, 0.6)
    assert E.slowest_lower_precision(sweep, skip_launch_bound=True) is None
    text = E.lower_precision_erratum(1.0, "this GPU", {"recorded X": sweep}, {})
    assert text.startswith(
        "In the recorded X sweep, FP8 E4M3 (_scaled_mm) ran at 0.60 times the throughput of FP16 at n = 512, but at "
        "that size both products are launch-bound (under 10% of its dtype's best throughput in the sweep): "
        "fixed per-call costs, not the bits, set its time (FP16 53.7 µs and FP8 E4M3 (_scaled_mm) 89.5 µs per "
        "product). Between pairs in which neither product was launch-bound, fewer bits were never slower.")
    # one of the pair launch-bound (FP16 at 512 reaches 11% of its best, FP8 3%): only that one is named
    one = {"fp16": {512: 11.0, 8192: 100.0}, "fp8": {512: 6.0, 8192: 180.0}}
    assert "but at that size the FP8 E4M3 (_scaled_mm) product is launch-bound (under 10%" in \
        E.lower_precision_erratum(1.0, "this GPU", {"recorded X": one}, {})
    # a compute-bound gap elsewhere is named after the launch-bound one
    slower = {"fp16": {512: 5.0, 8192: 100.0}, "fp8": {512: 3.0, 8192: 80.0}}
    assert ("Between pairs in which neither product was launch-bound, FP8 E4M3 (_scaled_mm) ran furthest below "
            "FP16 at n = 8192, at 0.80 times its throughput.") in E.lower_precision_erratum(1.0, "this GPU",
                                                                                   {"recorded X": slower}, {})
    # a CPU's live sweep has no launches to blame: its gap is reported as measured
    assert "fewer bits, slower product" in E.lower_precision_erratum(1.0, "this CPU", {"live": slower}, {})


def test_lower_precision_erratum_says_when_a_sweep_never_slows():
    text = E.lower_precision_erratum(0.8, "this GPU", {"recorded X": {"fp32": {8: 1.0}, "bf16": {8: 2.0}}}, {})
    assert text == ("In the recorded X sweep, fewer bits were never slower. On this GPU FP16 autocast trains at "
                    "0.80 times FP32's speed.")
    # the records lead; the live machine's evidence follows, a CPU's said to be one
    text = E.lower_precision_erratum(0.5, "this CPU", {"live": {"fp32": {8: 1.0}, "bf16": {8: 0.5}},
                                                      "recorded X": {"fp32": {8: 1.0}, "bf16": {8: 2.0}}}, {})
    assert text == ("In the recorded X sweep, fewer bits were never slower. On this CPU FP16 autocast trains at 0.50 "
                    "times FP32's speed (a CPU, so this is not a GPU's figure). In the live sweep on "
                    "this CPU (its FP8 product, an emulation, not compared), BF16 ran at 0.50 times the throughput of FP32 "
                    "(TF32 off) at n = 8: fewer bits, slower product.")
    with_tf32 = dataclasses.replace(_study(), runs=_study().runs + (_run("tf32", 0.25),))
    assert E.lower_precision_erratum(1.0, "this GPU", {}, {"G": with_tf32}).startswith(
        "On G, a whole BF16 autocast training step (eager) ran at 1.00 times TF32's token rate.")
    # the seeds' token rates: overlapping, the live ratio is said to be within the run's noise
    assert E.lower_precision_erratum(0.95, "this CPU", {}, {}, live_overlap=True) == (
        "On this CPU FP16 autocast trains at 0.95 times FP32's speed (a CPU, so this is not a GPU's figure); the two "
        "recipes' token rates over seeds overlap, so this run does not separate them.")
    assert E.lower_precision_erratum(0.9, "this GPU", {}, {}, live_overlap=False).endswith(
        "0.90 times FP32's speed; the two recipes' token rates over seeds do not overlap.")
    with pytest.raises(ValueError, match="live_fp16_speed"):
        E.lower_precision_erratum(0.0, "x", {}, {})


def test_speed_evidence_labels_live_and_recorded_runs():
    live = MatmulSweep("cpu", (_point("fp32", 8, 1e-6), _point("bf16", 8, 2e-6), _point("fp16", 8, 2e-6)), {})
    assert E.speed_evidence(live, "cpu", {}) == {
        "device_label": "this CPU", "sweeps": {"live": {
            "fp32": {8: _tflops(8, 1e-6)}, "bf16": {8: _tflops(8, 2e-6)}, "fp16": {8: _tflops(8, 2e-6)}}},
        "studies": {}}
    # a CPU's FP8 product is emulated: left out of the evidence, where a GPU's stays
    with_fp8 = MatmulSweep("cpu", live.points + (_point("fp8", 16, 1.0),), {})
    assert "fp8" not in E.speed_evidence(with_fp8, "cpu", {})["sweeps"]["live"]
    assert "fp8" in E.speed_evidence(with_fp8, "cuda", {})["sweeps"]["live"]
    recorded = {"matmul_throughput": _record("matmul_throughput", _matmul([("fp32", 256, 2.0), ("fp8", 256, 1.0)])),
                "training_throughput": _record("training_throughput", _study())}
    evidence = E.speed_evidence(live, "cuda", recorded)
    assert evidence["device_label"] == "this GPU"
    assert evidence["sweeps"][f"recorded {H100_LABEL}"] == {"fp32": {256: 2.0}, "fp8": {256: 1.0}}
    assert list(evidence["studies"]) == [f"the recorded {H100_LABEL}"]
    with pytest.raises(TypeError, match="expected a recorded ThroughputStudy"):
        E.speed_evidence(live, "cpu", {"training_throughput": _record("training_throughput", {"runs": []})})


def test_exercise_facts():
    config = gpt_config_for(SizeProfile("small"))
    m, k, n = 2 * config.context, config.d_model, 4 * config.d_model
    ops = [OpCost("softmax", 5.0, 4.0), OpCost("MLP up", 2 * m * n * k, 2 * m * n * k / 300)]
    flops = 6 * 6.5e9 + 12 * 32 * 4096 * 4096
    assert P.exercise_facts(ops, config, batch=2) == pytest.approx({
        "ex_flops": flops / 1e9, "ex_rate": 3000 * flops / 1e12, "ex_mfu": 100 * 3000 * flops / 989.5e12,
        "ex_mfu_sparse": 100 * 3000 * flops / (2 * 989.5e12), "h100_bf16": 989.5,
        "ex_fewer_flops": 100 * (1 - (4095 / 4096) ** 3), "ex_vocab": 50304, "a100_ridge": 312e3 / 2039,
        "a100_bf16": 312.0, "a100_bw": 2039.0, "ex_softmax_ai": 1.25, "ex_mlp_ai": 300.0,
        "ex_mlp_m": m, "ex_mlp_k": k, "ex_mlp_n": n, "l4_ridge": 121e3 / 300, "l4_bf16": 121.0, "l4_bw": 300.0,
        "ex_mlp_l4": "memory-bound, 26% below the ridge"})   # 300 against the L4's 403 FLOPs per byte
    assert P.ridge_phrase(399.6, 121e3 / 300).startswith("memory-bound, but only 0.9% from the ridge")
    assert P.ridge_phrase(600.0, 300.0) == "compute-bound, 100% above the ridge"
    for kwargs in ({"intensity": 1.0, "ridge": 0.0}, {"intensity": math.inf, "ridge": 1.0},
                   {"intensity": 1.0, "ridge": 1.0, "near": -0.1}):
        with pytest.raises(ValueError, match="must be a positive finite number"):
            P.ridge_phrase(**kwargs)
    # the shape comes from the model the ops were built for: the library's own ops agree
    real = transformer_op_costs(config.d_model, config.n_heads, config.context, 2, bytes_per_element=2)
    assert P.exercise_facts(real, config, batch=2)["ex_mlp_m"] == m
    with pytest.raises(ValueError, match="not .* build ops for this config"):
        P.exercise_facts(ops, config, batch=3)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        P.exercise_facts(ops, config, batch=0)
    with pytest.raises(ValueError, match="'MLP up'"):
        P.exercise_facts(ops[:1], config, batch=2)


def test_recorded_size_names_the_older_model_of_a_record_made_before_the_re_size():
    old = _record("training_throughput", _study(peaks={"fp32": 0.5, "bf16_autocast": 2.0}),
                  parameters={"size": "full"})
    assert M.recorded_size(old) == ("at the full size of its day, the older 384-wide course model (narrower than "
                                    "today's)")
    assert P.recorded_throughput_note(old).startswith("Recorded on **") and "older 384-wide" in \
        P.recorded_throughput_note(old)
    model = {"d_model": 512, "n_layers": 8, "n_heads": 8, "context": 256, "batch": 64}
    new = _record("training_throughput", _study(), parameters={"size": "full", "course_model": model})
    assert M.recorded_size(new) == "at full size"


def test_probe_against_sweep_reconciles_the_banner_with_the_sweep():
    from course_lib.bench import CapabilityProbe, MatmulPoint, MatmulSweep
    from course_lib.bench.timing import Timing
    from course_lib.studies import timing_prose as TP

    def point(dtype, n, seconds):
        return MatmulPoint(dtype, n, n, n, Timing((seconds,), 1))

    sweep = MatmulSweep("cpu", (point("fp32", 256, 2.0), point("bf16", 256, 1.36), point("fp16", 256, 2.5),
                                point("fp32", 512, 1.0)), {})
    probe = CapabilityProbe("cpu", 256, {"fp32": 1.0, "bf16": 2.83, "fp16": 0.83}, {})
    text = TP.probe_against_sweep(probe, sweep, noise_pct=22.2)
    assert text.startswith("At n = 256, as multiples of FP32's throughput: BF16 2.83 in the probe and 1.47 in the "
                           "sweep and FP16 0.83 in the probe and 0.80 in the sweep. For BF16 the two "
                           "differ by more than the 22.2% the medians of one product moved here")
    close = CapabilityProbe("cpu", 256, {"fp32": 1.0, "bf16": 1.5, "fp16": 0.8}, {})
    assert TP.probe_against_sweep(close, sweep, noise_pct=22.2).endswith(
        "The two agree within the 22.2% the medians of one product moved here.")
    assert TP.probe_against_sweep(CapabilityProbe("cpu", 128, probe.tflops, {}), sweep, noise_pct=1.0) == ""
    with pytest.raises(ValueError, match="noise_pct"):
        TP.probe_against_sweep(probe, sweep, noise_pct=math.nan)
