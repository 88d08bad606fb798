import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from course_lib import bench as B
from course_lib.studies import performance as PERF
from course_lib.studies import performance_prose as PERF_PROSE
from course_lib import models as MODELS
from course_lib import hardware as HW
from course_lib.device import SizeProfile


class FakeClock:
    """A clock that advances only when the timed function runs, by a scripted duration per call."""

    def __init__(self, durations):
        self.now, self.durations, self.calls, self.syncs = 0.0, list(durations), 0, 0

    def clock(self):
        return self.now

    def sync(self):
        self.syncs += 1

    def work(self, *args):
        self.now += self.durations[min(self.calls, len(self.durations) - 1)]
        self.calls += 1
        self.args_seen = getattr(self, "args_seen", []) + [args]


def test_harness_with_a_fake_clock_median_spread_syncs_and_rotation():
    durations = [9.0, 9.0] + [0.1, 0.3, 0.2, 0.4, 0.5] + [0.2] * 100  # two warm-ups, then timed calls
    fake = FakeClock(durations)
    timer = B.HostTimer(clock=fake.clock, synchronize=fake.sync)
    t = B.time_function(fake.work, [(0,), (1,), (2,)], warmup=2, budget_s=0.5, min_repeats=5, max_repeats=50,
                        timer=timer)
    # the first timed call took 0.1 s, so a 0.5 s budget gives 5 repeats; warm-ups are never timed
    assert t.repeats == 5 and t.warmup == 2
    assert t.samples == pytest.approx((0.1, 0.3, 0.2, 0.4, 0.5))
    assert t.median == pytest.approx(0.3) and t.q25 == pytest.approx(0.2) and t.q75 == pytest.approx(0.4)
    assert t.relative_spread == pytest.approx(0.2 / 0.3)
    assert fake.syncs == 2 * 5  # a synchronisation before and after every timed call
    assert [a[0] for a in fake.args_seen] == [0, 1, 2, 0, 1, 2, 0]  # buffers taken in turn


def test_harness_repeats_are_clamped_to_bounds():
    fake = FakeClock([1e-6])
    t = B.time_function(fake.work, warmup=0, budget_s=1.0, max_repeats=40,
                        timer=B.HostTimer(fake.clock, fake.sync))
    assert t.repeats == 40
    slow = FakeClock([10.0])
    assert B.time_function(slow.work, warmup=0, budget_s=1.0, min_repeats=3,
                           timer=B.HostTimer(slow.clock, slow.sync)).repeats == 3


def test_harness_bad_input():
    with pytest.raises(TypeError, match="callable"):
        B.time_function(3)
    with pytest.raises(TypeError, match="argument tuples"):
        B.time_function(print, [[1]])
    with pytest.raises(ValueError, match="budget_s"):
        B.time_function(print, budget_s=0)
    with pytest.raises(ValueError, match="min_repeats"):
        B.time_function(print, min_repeats=0)
    with pytest.raises(ValueError, match="unsupported device type"):
        B.make_timer("meta")
    with pytest.raises(ValueError, match="at least one sample"):
        B.Timing((), 0)


def test_cuda_event_timer_converts_milliseconds(monkeypatch):
    class FakeEvent:
        clock = [0.0]

        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            self.t = FakeEvent.clock[0]

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.t - self.t) * 1e3

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    timer = B.make_timer("cuda")
    assert isinstance(timer, B.CudaEventTimer)

    def work():
        FakeEvent.clock[0] += 0.25

    assert timer.time_call(work) == pytest.approx(0.25)


def test_matmul_flops_is_2mnk():
    assert B.matmul_flops(2, 3, 4) == 48
    assert B.matmul_flops(4096, 4096, 4096) == 2 * 4096 ** 3
    assert B.matmul_flops(8, 1, 1024) != 2 * 8 * 1 ** 2  # the 2mn^2 shortcut is wrong when k != n
    with pytest.raises(ValueError, match="k must be a positive int"):
        B.matmul_flops(1, 1, 0)


def test_no_cuda_is_a_reason_not_a_crash(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert HW.format_unsupported_reason("bf16", "cuda") == "torch sees no CUDA GPU on this machine"


def test_dtype_support_on_cpu_and_refusals():
    assert HW.format_unsupported_reason("fp32", "cpu") is None
    assert "the course trains with it only there" in HW.format_unsupported_reason("tf32", "cpu")
    with pytest.raises(ValueError, match="unknown matmul dtype"):
        HW.format_unsupported_reason("fp64", "cpu")
    with pytest.raises(ValueError, match="cannot time tf32"):
        B.measure_matmul("tf32", 16, 16, 16, "cpu")
    with pytest.raises(ValueError, match="divisible by 16"):
        B.matmul_operands("fp8", 15, 16, 16, "cpu")


@pytest.mark.parametrize("cc, expect", [((7, 0), {"tf32", "bf16", "fp8"}), ((8, 0), {"fp8"}),
                                        ((8, 9), set()), ((9, 0), set())])
def test_dtype_support_on_gpus_from_compute_capability(monkeypatch, cc, expect):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    monkeypatch.setattr(HW, "_scaled_mm_runs", lambda device: None)
    refused = {d for d in HW.MATMUL_DTYPES if HW.format_unsupported_reason(d, "cuda")}
    assert refused == expect


def test_operands_are_random_distinct_buffers_and_fp8_is_the_real_product():
    fn, sets = B.matmul_operands("bf16", 32, 16, 48, "cpu", buffers=3)
    assert len(sets) == 3 and sets[0][0].dtype == torch.bfloat16 and sets[0][0].shape == (32, 48)
    assert not torch.equal(sets[0][0], sets[1][0]) and bool((sets[0][0] != 0).all())
    if HW.format_unsupported_reason("fp8", "cpu") is None:
        fn8, sets8 = B.matmul_operands("fp8", 32, 16, 48, "cpu", buffers=1)
        a, b, sa, sb = sets8[0]
        out = fn8(a, b, sa, sb)
        ref = (a.float() @ b.float()).to(torch.bfloat16)
        assert out.dtype == torch.bfloat16 and out.shape == (32, 16)
        assert torch.allclose(out.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_measure_matmul_and_sweep_on_cpu():
    p = B.measure_matmul("fp32", 64, 64, 64, "cpu", budget_s=0.01)
    assert p.flops == 2 * 64 ** 3 and p.tflops > 0 and p.timing.repeats >= 5
    sweep = B.matmul_sweep("cpu", (16, 17), dtypes=("fp32", "tf32", "fp8"), budget_s=0.005)
    assert "tf32" in sweep.skipped and set(sweep.tflops("fp32")) == {16, 17}
    if "fp8" not in sweep.skipped:
        assert set(sweep.tflops("fp8")) == {16}  # 17 is not divisible by 16: left out of FP8's line
    assert sweep.best("fp32") == max(sweep.tflops("fp32").values())
    with pytest.raises(ValueError, match="sizes must not be empty"):
        B.matmul_sweep("cpu", ())


def test_size_limit_forecasts_a_point_from_the_last_size_by_the_cube_and_names_what_it_leaves_out():
    limit = B.SizeLimit(2.0, budget_s=0.1, warmup=3, min_repeats=5)
    assert limit.allows(64) and limit.forecast_s(64) is None          # the first size is always timed
    limit.timed(64, B.Timing((0.01, 0.02, 0.03), warmup=3))           # median 0.02 s a call
    # at 128 a call is forecast at 0.02 * 8 = 0.16 s: 3 warm-up calls and 5 timed ones (0.8 s > the budget)
    assert limit.forecast_s(128) == pytest.approx(8 * 0.16)
    assert limit.allows(128)
    limit.timed(128, B.Timing((0.16,), warmup=3))
    assert limit.forecast_s(256) == pytest.approx(8 * 1.28) and not limit.allows(256) and not limit.allows(512)
    assert limit.note == ("n = 256 and 512, left out because one call at n = 128 took 0.16 s here, so one at "
                          "n = 256 is forecast at 1.28 s (the size ratio cubed, 8, times as long) and a point there, "
                          "3 warm-up and 5 timed calls, at about 10 s, past the limit of 2 s a point; a larger size "
                          "takes longer still")
    # a limit below the budget: the forecast point is warm-up calls plus the budget, and the sentence says so
    tight = B.SizeLimit(0.05, budget_s=0.1)
    tight.timed(16, B.Timing((1e-4,), warmup=3))
    assert not tight.allows(32) and tight.note.endswith(
        "a point there, 3 warm-up calls and 0.1 s of timed ones, at about 0.1 s, past the limit of 0.05 s a point")
    # a fast call costs the budget, not its repeats: forecast = warm-up calls + budget
    fast = B.SizeLimit(1.0, budget_s=0.1)
    fast.timed(16, B.Timing((1e-5,), warmup=3))
    assert fast.forecast_s(32) == pytest.approx(3 * 8e-5 + 0.1) and fast.allows(32) and fast.note is None
    free = B.SizeLimit(None, budget_s=0.1)                            # no limit: nothing is left out
    free.timed(16, B.Timing((100.0,), warmup=3))
    assert free.allows(4096) and free.note is None
    for bad in (0, -1.0, math.inf, math.nan, True, "2"):
        with pytest.raises(ValueError, match="limit_s must be a positive number"):
            B.SizeLimit(bad, budget_s=0.1)
    with pytest.raises(ValueError, match="budget_s must be a positive number"):
        B.SizeLimit(1.0, budget_s=0)
    for bad in ({"warmup": -1}, {"min_repeats": 0}, {"warmup": 1.5}, {"min_repeats": True}):
        with pytest.raises(ValueError, match="must be an int of at least"):
            B.SizeLimit(1.0, budget_s=0.1, **bad)


def test_the_sweep_leaves_out_the_sizes_forecast_past_its_point_limit_and_says_so():
    # a limit below the budget refuses every size after each dtype's first: the sweep says so per dtype
    sweep = B.matmul_sweep("cpu", (16, 32, 48), dtypes=("fp32", "bf16"), budget_s=0.002, point_limit_s=0.001)
    assert set(sweep.tflops("fp32")) == set(sweep.tflops("bf16")) == {16}
    assert set(sweep.left_out) == {"fp32", "bf16"}
    assert sweep.left_out["fp32"].startswith("n = 32 and 48, left out because one call at n = 16 took ")
    wide = B.matmul_sweep("cpu", (16, 32), dtypes=("fp32",), budget_s=0.002, point_limit_s=60.0)
    assert set(wide.tflops("fp32")) == {16, 32} and wide.left_out == {}
    # the prose names a dtype's left-out sizes beside the dtypes not run at all
    facts = PERF_PROSE.matmul_facts(B.MatmulSweep("cpu", tuple(
        B.MatmulPoint(d, n, n, n, B.Timing((1e-3,), 3)) for d in ("fp32", "bf16", "fp16") for n in (7, 8)),
        {"tf32": "no TF32 here"}, {"fp8": "n = 512, left out because it would take long"}), (7, 8), None)
    assert facts["skipped"] == ("TF32 (no TF32 here); FP8 E4M3 (_scaled_mm) at n = 512, left out because it "
                                "would take long")


def test_torch_timer_cross_check_runs():
    assert B.torch_timer_matmul_seconds("fp32", 64, "cpu", min_run_time=0.01) > 0


def test_capability_probe_is_measured_and_cached(monkeypatch):
    from course_lib.bench import matmul as BM
    monkeypatch.setattr(BM, "cpu_fp8_kernel", lambda: "reference")
    a = B.capability_probe("cpu", n=32)
    b = B.capability_probe("cpu", n=32)
    assert a is b and a.relative("fp32") == 1.0 and "tf32" in a.unsupported
    assert a.relative("tf32") is None and a.faster_than_fp32("tf32") is None
    assert "matmul speed against FP32 at n=32" in a.summary()
    slow = B.CapabilityProbe("cpu", 64, {"fp32": 1.0, "bf16": 2.345, "fp8": 0.0032}, {"tf32": "no TF32"})
    assert slow.summary() == ("matmul speed against FP32 at n=64: BF16 x2.35, FP8 x0.0032 (a CPU has no FP8 "
                              "matrix unit: torch converts the codes to FP32 and multiplies there, so this times "
                              "that conversion and an FP32 product, not FP8 hardware)")
    gpu = B.CapabilityProbe("cuda", 64, {"fp32": 1.0, "fp8": 4.0}, {})
    assert gpu.summary() == "matmul speed against FP32 at n=64: FP8 x4.00"
    # the lesson's table: every dtype tried, measured or why not, in one order
    assert slow.table().splitlines() == [
        "| dtype | TFLOP/s at n=64 | against FP32 | note |", "|---|---|---|---|",
        "| FP32 (TF32 off) | 1 | x1.00 |  |", "| TF32 | not measured |  | no TF32 |", "| BF16 | 2.35 | x2.35 |  |",
        "| FP8 E4M3 (_scaled_mm) | 0.0032 | x0.0032 | a CPU has no FP8 matrix unit: torch converts the codes "
        "to FP32 and multiplies there, so this times that conversion and an FP32 product, not FP8 hardware |"]
    # where torch hands the product to oneDNN (measured by hardware.cpu_fp8_kernel), the note says so
    monkeypatch.setattr(BM, "cpu_fp8_kernel", lambda: "onednn")
    assert slow.summary().endswith("(a CPU has no FP8 matrix unit: torch hands this product to oneDNN's FP8 "
                                   "software kernel here, so this times that kernel, not FP8 hardware)")
    assert gpu.table().splitlines()[-1] == "| FP8 E4M3 (_scaled_mm) | 4 | x4.00 |  |"
    # one rule for a ratio in the banner, the table and the prose (tables.ratio_text, glue's too)
    from course_lib import glue
    from course_lib.bench import matmul as BM
    assert glue.ratio_text is BM.ratio_text
    with pytest.raises(ValueError, match="no dtype"):
        B.CapabilityProbe("cpu", 64, {}, {}).table()


def test_capability_probe_keeps_each_dtypes_best_round_and_times_a_slow_product_once(monkeypatch):
    # a burst of load in the first round (FP32 80 times slower) does not set the line; FP8 emulated on a CPU
    # (one product longer than the budget) is timed once
    from course_lib.bench import matmul as BM
    rates = {"fp32": [0.005, 0.40, 0.39], "bf16": [0.93, 0.95, 0.94], "fp16": [0.30, 0.34, 0.33], "fp8": [1e-4]}
    calls = []

    def fake_measure(dtype, m, n, k, device, **kw):
        calls.append(dtype)
        return SimpleNamespace(tflops=rates[dtype][calls.count(dtype) - 1])

    monkeypatch.setattr(BM, "measure_matmul", fake_measure)
    monkeypatch.setattr(BM, "format_unsupported_reason", lambda dtype, device: "no TF32" if dtype == "tf32" else None)
    BM._probe.cache_clear()
    try:
        probe = B.capability_probe("cpu", n=256, budget_s=0.03)
    finally:
        BM._probe.cache_clear()
    assert probe.tflops == {"fp32": 0.40, "bf16": 0.95, "fp16": 0.34, "fp8": 1e-4}
    assert calls == ["fp32", "bf16", "fp16", "fp8"] + ["fp32", "bf16", "fp16"] * (BM.PROBE_ROUNDS - 1)


def test_capability_probe_goes_on_while_a_round_still_finds_a_dtype_faster(monkeypatch):
    # load easing off from the third round (FP32 still 4 times faster in the fourth): the probe goes on until
    # a round improves nothing by more than 20%, and stops at PROBE_MAX_ROUNDS whatever the load
    from course_lib.bench import matmul as BM
    calls = []

    def measure_with(rates):
        def fake_measure(dtype, m, n, k, device, **kw):
            calls.append(dtype)
            seq = rates[dtype]
            return SimpleNamespace(tflops=seq[min(calls.count(dtype), len(seq)) - 1])
        return fake_measure

    monkeypatch.setattr(BM, "format_unsupported_reason", lambda dtype, device: None if dtype in ("fp32", "bf16")
                        else "not here")
    for rates, rounds, best in (({"fp32": [0.005, 0.005, 0.1, 0.40, 0.41, 9.0], "bf16": [0.9]}, 5, 0.41),
                                ({"fp32": [0.005 * 1.3 ** i for i in range(20)], "bf16": [0.9]},
                                 BM.PROBE_MAX_ROUNDS, 0.005 * 1.3 ** (BM.PROBE_MAX_ROUNDS - 1))):
        calls.clear()
        monkeypatch.setattr(BM, "measure_matmul", measure_with(rates))
        BM._probe.cache_clear()
        try:
            probe = B.capability_probe("cpu", n=256, budget_s=0.03)
        finally:
            BM._probe.cache_clear()
        assert calls.count("fp32") == calls.count("bf16") == rounds
        assert probe.tflops["fp32"] == pytest.approx(best) and probe.tflops["bf16"] == 0.9


def test_copy_bandwidth_positive_and_bad_size():
    assert B.measure_copy_bandwidth("cpu", 1 << 20, budget_s=0.01) > 0
    with pytest.raises(ValueError, match="n_bytes"):
        B.measure_copy_bandwidth("cpu", 10)


def test_datasheet_peaks_are_dense_and_cited():
    a100 = HW.find_gpu_peaks("NVIDIA A100-SXM4-80GB")
    assert a100.peak("fp16") == 312.0 and a100.peak("fp8") is None  # 624 is the sparse figure
    h100 = HW.find_gpu_peaks("NVIDIA H100 80GB HBM3")
    assert h100.peak("fp8") == 1979.0 and h100.peak("bf16") == pytest.approx(989.5)
    assert HW.find_gpu_peaks("NVIDIA H200 NVL") is None and HW.find_gpu_peaks("NVIDIA H200").name == "H200 SXM"
    assert HW.find_gpu_peaks("NVIDIA GeForce RTX 4090").peak("fp8") == 330.3
    assert HW.find_gpu_peaks("Some Other GPU") is None
    bib = (Path(__file__).parents[1] / "book" / "references.bib").read_text()
    keys = set(re.findall(r"@\w+\{([^,]+),", bib))
    for entry in HW.DATASHEET_PEAKS.values():
        assert entry.source in keys, f"{entry.name}: source {entry.source} missing from the bibliography"
        assert entry.peak("fp32") and entry.bandwidth_gbs > 0


def test_roofline_and_op_costs_by_hand():
    assert B.attainable_tflops(10.0, 100.0, 2000.0) == pytest.approx(20.0)   # memory-bound: 10 FLOP/B * 2 TB/s
    assert B.attainable_tflops(1000.0, 100.0, 2000.0) == 100.0               # compute-bound
    with pytest.raises(ValueError):
        B.attainable_tflops(0.0, 1.0, 1.0)
    ops = {o.name: o for o in B.transformer_op_costs(64, 2, 16, 3, bytes_per_element=2)}
    rows = 3 * 16
    assert ops["QKV projection"].flops == 2 * rows * 64 * 192
    assert ops["QKV projection"].bytes_moved == (rows * 64 + 64 * 192 + rows * 192) * 2
    assert ops["softmax"].intensity == pytest.approx(5 / 4)   # 5 FLOPs per element, 2 bytes in + 2 out
    assert ops["AdamW step"].intensity < 1.0
    with pytest.raises(ValueError, match="divisible"):
        B.transformer_op_costs(64, 3, 16, 1, bytes_per_element=2)


def test_model_flops_per_token_and_parameter_count():
    from course_lib.models import GPTConfig, build_gpt

    assert B.model_flops_per_token(1000, 2, 64, 32) == 6000 + 12 * 2 * 32 * 64
    cfg = GPTConfig(d_model=64, n_layers=1, n_heads=2, context=16)
    total, non_emb = MODELS.count_parameters(build_gpt(cfg))
    d, f = 64, 256
    block = (3 * d * d + 3 * d) + (d * d + d) + (d * f + f) + (f * d + d) + 4 * d
    assert non_emb == block + 2 * d + d * 256 and total == non_emb + 256 * d + 16 * d


def test_recipe_run_time_to_loss_and_mfu_by_hand():
    run = PERF.RecipeRun("fp32", 0, False, (5.0, 4.0, 3.0, 2.0), (1.0, 0.5, 0.5, 0.5), 100, 1)
    assert run.median_step_seconds == 0.5 and run.tokens_per_second == 200
    assert run.seconds_to_loss(3.5, window=2) == pytest.approx(2.0)  # mean(4, 3) after 1 + 0.5 + 0.5 s
    assert run.seconds_to_loss(1.0, window=2) is None
    study = PERF.ThroughputStudy("cpu", (run,), flops_per_token=1e9, peaks={"fp32": 1.0}, peak_source="test")
    assert study.mfu(run) == pytest.approx(200 * 1e9 / 1e12)
    assert study.table()[0]["tokens_per_s"] == 200 and study.time_to_target(3.5, window=2)["fp32"] == [2.0]


def test_training_throughput_and_profiler_run_small():
    study = PERF.training_throughput(SizeProfile("small"), "cpu", recipes=("fp32", "bf16_autocast"), seeds=(0,),
                                  steps=4, warmup_steps=1)
    assert [r.recipe for r in study.runs] == ["fp32", "bf16_autocast"]
    assert all(len(r.losses) == 4 and math.isfinite(r.tokens_per_second) for r in study.runs)
    assert set(study.peaks) == {"fp32", "bf16_autocast"} and "measured" in study.peak_source
    with pytest.raises(ValueError, match="seeds"):
        PERF.training_throughput(SizeProfile("small"), "cpu", seeds=())
    with pytest.raises(ValueError, match="must exceed warmup_steps"):
        PERF.training_throughput(SizeProfile("small"), "cpu", recipes=("fp32",), seeds=(0,), steps=2, warmup_steps=3)
    with pytest.raises(ValueError, match="cannot run on cpu"):
        PERF.training_throughput(SizeProfile("small"), "cpu", recipes=("tf32",))
    for bad in ("fp32", ("bf16_autocast",)):
        with pytest.raises(ValueError, match="compiled must name some of the recipes"):
            PERF.training_throughput(SizeProfile("small"), "cpu", recipes=("fp32",), compiled=bad)


def test_training_throughput_compiles_only_the_recipes_named_from_one_seed(monkeypatch):
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model: compiled.append(model) or model)
    study = PERF.training_throughput(SizeProfile("small"), "cpu", recipes=("fp32", "bf16_autocast"), seeds=(0, 1),
                                     steps=3, warmup_steps=1, compiled=("bf16_autocast",))
    assert [(r.recipe, r.seed, r.compiled) for r in study.runs] == [
        ("fp32", 0, False), ("fp32", 1, False), ("bf16_autocast", 0, False), ("bf16_autocast", 1, False),
        ("bf16_autocast", 0, True)]
    assert len(compiled) == 1
    prof = PERF.profile_training_step("bf16_autocast", SizeProfile("small"), "cpu", top=5)
    names = [op[0] for op in prof.top_ops]
    assert len(names) == 5 and any(n in ("aten::mm", "aten::addmm", "aten::bmm") for n in names)
    assert 0 < prof.cast_fraction < 1


def test_mfu_peaks_on_a_gpu_come_from_the_datasheet(monkeypatch):
    class Props:
        name = "NVIDIA H100 80GB HBM3"

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    peaks, source = PERF._mfu_peaks(torch.device("cuda"), ("fp32", "bf16_autocast", "fp16_autocast_scaler"))
    assert peaks == {"fp32": 67.0, "bf16_autocast": 989.5, "fp16_autocast_scaler": 989.5}
    assert "H100 SXM5" in source
    Props.name = "NVIDIA Unknown"
    assert PERF._mfu_peaks(torch.device("cuda"), ("fp32",)) == ({}, "no datasheet entry for NVIDIA Unknown")


def test_cpu_peak_estimate_from_cpuinfo_text():
    text = "processor: 0\ncpu MHz\t\t: 2500.0\nflags\t\t: fpu avx2 fma avx512f\n"
    est = B.cpu_peak_estimate(text, cores=4)
    assert (est.vector_lanes, est.fma_units, est.flops_per_cycle) == (16, 2, 64)
    assert est.tflops == pytest.approx(4 * 2.5e9 * 64 / 1e12)
    assert B.cpu_peak_estimate("flags: avx2 fma\ncpu MHz: 1000", cores=1).vector_lanes == 8
    assert B.cpu_peak_estimate("flags: sse2", cores=1) is None  # no clock, no estimate
    with pytest.raises(ValueError, match="cores"):
        B.cpu_peak_estimate(text, cores=0)


def test_lesson6_experiments_run_on_the_cpu_at_small_size():
    from course_lib.experiments import run_experiment

    out = run_experiment("matmul_throughput", SizeProfile("small"), "cpu")
    assert set(out.tflops()) >= {"fp32", "bf16", "fp16"} and out.sizes == (64, 127, 128, 255, 256, 511, 512)
    assert all(set(by_n) == set(out.sizes) for d, by_n in out.tflops().items() if d != "fp8")
    assert "tf32" in out.skipped and out.copy_bandwidth_gbs > 0
    assert set(out.cross_check) == {"fp32", "bf16"} and out.cross_check_n == 512
    untimed = [n for n in out.sizes if n % 16 == 0 and n not in out.tflops().get("fp8", {})]
    assert not untimed or out.left_out["fp8"].startswith(f"n = {untimed[0]}")
    mem = run_experiment("training_memory", SizeProfile("small"), "cpu")
    assert [b.recipe for b in mem.breakdowns] == ["fp32", "bf16_autocast", "fp16_autocast_scaler", "bf16_pure",
                                                  "bf16_master"]
    assert mem.activation_sweep.recipe == "bf16_autocast"
    prof = run_experiment("profiled_step", SizeProfile("small"), "cpu")
    assert [s.recipe for s in prof.steps] == ["fp32", "bf16_autocast", "fp16_autocast_scaler"]


# ---- the ladder's FLOP and step-time models ---------------------------------------------------------------

def test_gpt_matmul_parameters_are_the_linear_weights_of_the_module():
    from course_lib.bench.roofline import gpt_matmul_parameters

    for cfg in (MODELS.GPTConfig(), MODELS.GPTConfig(d_model=128, n_layers=3, n_heads=4, mlp_ratio=2, tied_head=True)):
        model = MODELS.build_gpt(cfg)
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        assert gpt_matmul_parameters(cfg.d_model, cfg.n_layers, cfg.vocab_size, cfg.mlp_ratio) == linear
    with pytest.raises(ValueError, match="vocab_size must be a positive int"):
        gpt_matmul_parameters(64, 2, 0)


def test_roofline_step_time_is_three_passes_of_flops_when_compute_bound():
    from course_lib.bench.roofline import roofline_step_seconds

    d, h, layers, t, b, v, n = 256, 4, 2, 128, 8, 512, 2_000_000
    kw = dict(n_params=n, bytes_per_element=2)
    ops = B.transformer_op_costs(d, h, t, b, bytes_per_element=2)
    forward = layers * sum(o.flops for o in ops if o.name != "AdamW step") + 2 * b * t * d * v + 5 * b * t * v
    # with unlimited bandwidth every op runs at the peak: time is FLOPs over peak
    assert roofline_step_seconds(d, h, layers, t, b, v, matmul_tflops=100.0, bandwidth_gbs=1e12, **kw) == \
        pytest.approx((3 * forward + 12 * n) / 100e12)
    slow = roofline_step_seconds(d, h, layers, t, b, v, matmul_tflops=100.0, bandwidth_gbs=1000.0, **kw)
    assert slow > (3 * forward + 12 * n) / 100e12     # memory-bound ops take longer
    fused = roofline_step_seconds(d, h, layers, t, b, v, matmul_tflops=100.0, bandwidth_gbs=1000.0, attention="sdpa", **kw)
    assert fused < slow                               # no scores written and read
    fp8 = roofline_step_seconds(d, h, layers, t, b, v, matmul_tflops=100.0, linear_tflops=200.0, bandwidth_gbs=1e12, **kw)
    assert fp8 < roofline_step_seconds(d, h, layers, t, b, v, matmul_tflops=100.0, bandwidth_gbs=1e12, **kw)
    for bad, match in (({"attention": "flash"}, "attention must be"), ({"matmul_tflops": 0}, "matmul_tflops"),
                       ({"n_params": 0}, "n_params")):
        args = dict(matmul_tflops=100.0, bandwidth_gbs=1000.0, **kw)
        args.update(bad)
        with pytest.raises(ValueError, match=match):
            roofline_step_seconds(d, h, layers, t, b, v, **args)
