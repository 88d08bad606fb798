"""The model ladder (studies.ladder), its prose (studies.ladder_prose) and its figure."""

import dataclasses
import inspect
import types

import matplotlib
import pytest
import torch

from course_lib.bench.roofline import gpt_matmul_parameters, model_flops_per_token
from course_lib.device import SizeProfile
from course_lib.fp8.roofline import predict_fp8_linear
from course_lib.jsonable import from_jsonable, to_jsonable
from course_lib.models import TinyGPT
from course_lib.plots.performance import plot_scale_ladder
from course_lib.studies import ladder as LADDER
from course_lib.studies import ladder_prose as PROSE

matplotlib.use("Agg")
SMALL = SizeProfile("small")


@pytest.fixture(scope="module")
def small_ladder():
    """The study at its small registry size, run once."""
    return LADDER.scale_ladder(SMALL, "cpu", **LADDER.ladder_sizes(SMALL, "cpu"))


@pytest.mark.parametrize("sdpa", [False, True])
def test_rung_parameters_counted_from_the_module_match_the_shape(sdpa):
    expected = {"gpt2_small": 124_475_904}   # GPT-2 small with its vocabulary padded to 50,304 and a tied head
    for name in LADDER.RUNGS:
        facts = LADDER.rung_facts(name, sdpa=sdpa)
        cfg = LADDER.rung_config(name, sdpa=sdpa)
        assert facts.n_params == cfg.parameter_count()
        assert facts.n_params == expected.get(name, facts.n_params)
        with torch.device("meta"):
            model = TinyGPT(cfg)
        linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
        assert facts.matmul_params == linear == gpt_matmul_parameters(cfg.d_model, cfg.n_layers, cfg.vocab_size)
        assert facts.flops_per_token == model_flops_per_token(linear, cfg.n_layers, cfg.d_model, cfg.context)
        assert facts.attention == ("sdpa" if sdpa else "explicit")
    sizes = [LADDER.rung_facts(n).n_params for n in LADDER.RUNGS]
    assert sizes == sorted(sizes) and 7e8 < sizes[-1] < 8e8


def test_the_small_registry_run_measures_what_the_cpu_runs_and_says_why_not_the_rest(small_ladder):
    ladder = small_ladder
    params = LADDER.ladder_sizes(SMALL, "cpu")
    assert ladder.measured_rungs() == ["course_small"]
    ran = {(r.recipe, r.compiled) for r in ladder.runs}
    skipped = {(s.recipe, s.compiled): s.reason for s in ladder.skipped}
    assert ran | set(skipped) == {(r, c) for r in LADDER.LADDER_RECIPES for c in params["compile_modes"]}
    assert not ran & set(skipped)                          # nothing silently dropped, nothing twice
    assert {"fp32", "bf16_autocast", "fp16_autocast_scaler"} <= {r for r, _ in ran}
    assert "TF32 is a tensor-core mode of NVIDIA GPUs" in skipped[("tf32", False)]
    for run in ladder.runs:
        assert len(run.step_seconds) == params["steps"] and run.peak_memory_bytes is None
        assert ladder.tokens_per_second(run) == pytest.approx(16 * 64 / run.median_step_seconds)
        assert 0 < ladder.mfu(run) < 1 and run.compile_seconds is None
    # every rung predicted for the H200 and for this CPU, kept apart from the measurements
    assert "H100 SXM5" in ladder.predicted_devices() and ladder.own_prediction_device.startswith("this CPU")
    for rung in LADDER.RUNGS:
        assert ladder.prediction("H100 SXM5", rung, "tf32") is not None
        assert ladder.prediction(ladder.own_prediction_device, rung, "tf32") is None   # no TF32 on a CPU
    assert "fastest matmul throughput of the capability probe on this CPU" in ladder.reference_source
    assert "so these MFUs are shares of that measured rate, not of a peak" in ladder.reference_source
    assert from_jsonable(LADDER.ScaleLadder, to_jsonable(ladder)) == ladder


def test_predictions_follow_the_models():
    rung = LADDER.rung_facts("gpt2_small", sdpa=True)
    h200 = {"fp32": 67.0, "tf32": 494.5, "bf16": 989.5, "fp16": 989.5, "fp8": 1979.0}
    preds = {r: LADDER.predict(rung, r, "H200 SXM", tflops=h200, bandwidth_gbs=4800.0, reference_tflops=989.5)
             for r in LADDER.LADDER_RECIPES}
    assert preds["fp32"].step_seconds > preds["tf32"].step_seconds > preds["bf16_autocast"].step_seconds
    # FP8 adds lesson 7's cast traffic to its faster products: at GPT-2 small it is a wash, and it pays on
    # the larger rungs only (as torchao's float8 roofline says of small layers)
    casts = LADDER.fp8_cast_seconds(rung, "tensorwise", bf16_tflops=989.5, fp8_tflops=1979.0, bandwidth_gbs=4800.0)
    assert 0 < casts < preds["fp8_tensorwise"].step_seconds
    assert preds["fp8_tensorwise"].step_seconds - casts < preds["bf16_autocast"].step_seconds
    ratio = {}
    for name in ("course_full", "gpt2_small", "gpt2_large"):
        big = LADDER.rung_facts(name, sdpa=True)
        b, f = (LADDER.predict(big, r, "H200 SXM", tflops=h200, bandwidth_gbs=4800.0, reference_tflops=989.5)
                for r in ("bf16_autocast", "fp8_tensorwise"))
        ratio[name] = b.step_seconds / f.step_seconds
    assert ratio["course_full"] < 1 < ratio["gpt2_large"] and ratio["course_full"] < ratio["gpt2_small"] < ratio["gpt2_large"]
    p = preds["bf16_autocast"]
    assert p.tokens_per_second == pytest.approx(8 * 1024 / p.step_seconds)
    assert p.mfu == pytest.approx(p.tokens_per_second * rung.flops_per_token / 989.5e12)
    # memory: 16 bytes per parameter with AdamW, the activations and the 16-bit weight copies
    assert p.memory_bytes > 16 * rung.n_params and preds["fp32"].memory_bytes > 16 * rung.n_params
    assert LADDER.predict(rung, "tf32", "CPU", tflops={"fp32": 1.0, "bf16": 2.0}, bandwidth_gbs=10.0,
                          reference_tflops=2.0) is None


def test_the_ladders_fp8_prediction_has_no_launch_term():
    # the ladder's roofline counts FLOPs and bytes only: its FP8 casts are bytes over bandwidth, with no
    # floor per kernel, so doubling the bandwidth halves them at every size, however small
    kw = dict(bf16_tflops=989.5, fp8_tflops=1979.0)
    for name in ("course_small", "gpt2_large"):
        rung = LADDER.rung_facts(name, sdpa=True)
        casts = LADDER.fp8_cast_seconds(rung, "tensorwise", bandwidth_gbs=4800.0, **kw)
        assert LADDER.fp8_cast_seconds(rung, "tensorwise", bandwidth_gbs=9600.0, **kw) == pytest.approx(casts / 2)
    # course_small's casts take less than one 2 us launch per linear layer: torchao's floor is left out
    small = LADDER.rung_facts("course_small", sdpa=True)
    assert LADDER.fp8_cast_seconds(small, "rowwise", bandwidth_gbs=4800.0, **kw) < small.n_layers * 4 * 2e-6
    # a 16 x 16 x 16 tensorwise layer, casts not fused: input and grad_output move 512 + 1024 bytes each,
    # the weight 512 + 768 + 768; at 1 GB/s and 92% of it, and no launch
    est = predict_fp8_linear(16, 16, 16, bf16_tflops=1.0, fp8_tflops=2.0, bandwidth_gbs=1.0, launch_seconds=0.0)
    assert est.fp8_cast_s == pytest.approx(5120 / 0.92e9)
    # three products, each 8192 FLOPs at 78% of 1 TFLOP/s against 1536 bytes (two BF16 operands in, a
    # BF16 output) at 0.92 GB/s: memory-bound
    assert est.bf16_s == pytest.approx(3 * 1536 / 0.92e9)
    assert predict_fp8_linear(16, 16, 16, bf16_tflops=1.0, fp8_tflops=2.0, bandwidth_gbs=1e6).fp8_cast_s == (
        pytest.approx(10 * 2e-6))   # the default keeps torchao's floor: ten kernels, each at least 2 us
    with pytest.raises(ValueError, match="launch_seconds"):
        predict_fp8_linear(16, 16, 16, bf16_tflops=1.0, fp8_tflops=2.0, bandwidth_gbs=1.0, launch_seconds=-1.0)


def test_recipe_reasons_and_bad_input(monkeypatch):
    assert LADDER.base_recipe("fp8_rowwise") == "bf16_autocast"
    assert "TF32" in LADDER.recipe_unsupported_reason("tf32", "cpu")
    assert LADDER.recipe_unsupported_reason("fp32", "cpu") is None
    # FP8 slower than BF16 or FP32 (emulated in a wider format) is a reason naming the measured ratio against
    # the faster of the two; faster than both, the recipe runs. Probes are fixed: CPUs differ in which is faster.
    measured = LADDER.capability_probe("cpu")
    for tflops, reason in (({"fp32": 1.0, "bf16": 0.5, "fp8": 0.25}, "0.25 times FP32's"),
                           ({"fp32": 0.1, "bf16": 0.5, "fp8": 0.25}, "0.50 times BF16's"),
                           ({"fp32": 0.14, "bf16": 0.0024, "fp8": 0.052}, "0.37 times FP32's"),
                           ({"fp32": 0.5, "bf16": 1.0, "fp8": 2.0}, None)):
        probe = dataclasses.replace(measured, tflops=tflops)
        monkeypatch.setattr(LADDER, "capability_probe", lambda device, probe=probe: probe)
        why = LADDER.recipe_unsupported_reason("fp8_tensorwise", "cpu")
        assert why is None if reason is None else reason in why and "emulated" in why
    for kwargs, match in (({"rungs": ("gpt3",)}, "unknown rung"), ({"recipes": ("int8",)}, "unknown recipe"),
                          ({"rungs": "course_small"}, "not one string"), ({"steps": 0}, "steps must be"),
                          ({"compile_modes": ()}, "compile_modes"), ({"predict_for": ("A9000",)}, "datasheet GPU")):
        with pytest.raises((ValueError, TypeError), match=match):
            LADDER.scale_ladder(SMALL, "cpu", **kwargs)


def test_fp8_converter_swaps_every_linear_but_the_head():
    model = LADDER.build_gpt(LADDER.rung_config("course_small"))
    LADDER.float8_converter("fp8_rowwise")(model)
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if "Linear" in type(m).__name__}
    assert kinds.pop("head") == "Linear" and kinds and set(kinds.values()) == {"Float8Linear"}
    with pytest.raises(ValueError, match="unknown FP8 recipe"):
        LADDER.float8_converter("bf16_autocast")


def test_random_batches_are_seeded_next_token_pairs():
    a, b = LADDER.random_batches(100, 2, 8, "cpu", seed=1), LADDER.random_batches(100, 2, 8, "cpu", seed=1)
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(a, b))
    (x, y), _ = a
    assert x.shape == y.shape == (2, 8) and int(x.max()) < 100
    assert not torch.equal(a[0][0], a[1][0])


# ---- the CUDA-only branches, with torch's CUDA queries replaced --------------------------------------------

def test_reference_peak_on_a_gpu_is_its_dense_bf16_datasheet_peak(monkeypatch):
    class Props:
        name = "NVIDIA H200"

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Props())
    peak, source = LADDER.reference_peak(torch.device("cuda"))
    assert peak == 989.5 and "H200 SXM" in source and "BF16" in source
    Props.name = "NVIDIA Unknown"
    with pytest.raises(ValueError, match="no datasheet BF16 peak for NVIDIA Unknown"):
        LADDER.reference_peak(torch.device("cuda"))


def test_peak_allocated_bytes_reads_and_resets_the_allocator_on_a_gpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append(("reset", device)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: calls.append(("peak", device)) or 12345)
    cuda = torch.device("cuda")
    assert LADDER.peak_allocated_bytes(cuda, reset=True) is None
    assert LADDER.peak_allocated_bytes(cuda) == 12345
    assert calls == [("reset", cuda), ("peak", cuda)]
    assert LADDER.peak_allocated_bytes(torch.device("cpu")) is None


def test_allocated_bytes_reads_the_allocator_on_a_gpu_only(monkeypatch):
    from course_lib.device import allocated_bytes

    calls = []
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: calls.append(device) or 678)
    assert allocated_bytes("cuda") == 678 and calls == [torch.device("cuda")]
    assert allocated_bytes("cpu") is None and len(calls) == 1


# ---- merging records, the prose, the figure -----------------------------------------------------------------

def _synthetic(step_ms: dict, *, device_name="GPU X", stamp=0.0) -> LADDER.ScaleLadder:
    """A ladder whose (rung, recipe) runs take the given milliseconds (``stamp`` added, to tell ladders apart)."""
    rungs = tuple(LADDER.rung_facts(n) for n in LADDER.RUNGS)
    runs = tuple(LADDER.LadderRun(rung, recipe, False, (1e-3 * (ms + stamp),) * 3, 2e-3 * ms)
                 for (rung, recipe), ms in step_ms.items())
    preds = tuple(LADDER.LadderPrediction("GPU X", r.name, recipe, 1e-3, 1e6, 0.5, 1e9)
                  for r in rungs for recipe in ("tf32", "bf16_autocast"))
    return LADDER.ScaleLadder("cuda", device_name, rungs, runs, (), 989.5, "datasheet", preds, "GPU X")


def test_merge_keeps_the_latest_run_per_rung_and_recipe():
    old = _synthetic({("course_full", "tf32"): 24.0, ("course_full", "bf16_autocast"): 24.0}, stamp=0.0)
    new = _synthetic({("course_full", "tf32"): 24.0, ("gpt2_small", "tf32"): 80.0}, stamp=1.0)
    merged = LADDER.merge_ladders([old, new])
    assert merged.run_of("course_full", "tf32").median_step_seconds == pytest.approx(25e-3)     # the newer
    assert merged.run_of("course_full", "bf16_autocast").median_step_seconds == pytest.approx(24e-3)  # kept
    assert merged.measured_rungs() == ["course_full", "gpt2_small"]
    with pytest.raises(ValueError, match="different devices"):
        LADDER.merge_ladders([old, _synthetic({}, device_name="GPU Y")])
    with pytest.raises(ValueError, match="no ladders"):
        LADDER.merge_ladders([])


def test_verdict_says_where_mixed_precision_starts_to_pay_and_where_it_ties():
    ms = {("course_small", "tf32"): 5.0, ("course_small", "bf16_autocast"): 5.1,
          ("course_full", "tf32"): 24.4, ("course_full", "bf16_autocast"): 24.1,
          ("gpt2_small", "tf32"): 90.0, ("gpt2_small", "bf16_autocast"): 50.0,
          ("gpt2_medium", "tf32"): 250.0, ("gpt2_medium", "bf16_autocast"): 130.0}
    ladder = _synthetic(ms)
    assert PROSE.baseline_recipe(ladder) == "tf32"
    assert PROSE.bf16_speedups(ladder)["gpt2_small"] == pytest.approx(1.8)
    text = PROSE.mixed_precision_verdict(ladder)
    assert "starts to pay at gpt2_small (1.800x)" in text
    assert ("A rung counts as paying when BF16 is at least 1.1x faster and the two recipes' step-time quartiles do "
            "not overlap: a gain under 10% is too small") in text
    assert "only ties TF32 (within 1.1x, or within the step-time quartiles) at course_small, course_full" in text
    # a rung that pays, followed by one that does not, is no start
    worse = _synthetic({**ms, ("gpt2_medium", "bf16_autocast"): 250.0})
    assert "starts to pay at" not in PROSE.mixed_precision_verdict(worse)
    assert "does not pay at any rung" in PROSE.mixed_precision_verdict(worse)
    assert "No rung ran both" in PROSE.mixed_precision_verdict(ladder, compiled=True)
    with pytest.raises(ValueError, match="margin must exceed 1"):
        PROSE.mixed_precision_verdict(ladder, margin=1.0)


def test_the_cpu_page_says_what_ran_and_what_is_predicted(small_ladder):
    facts = PROSE.ladder_facts(small_ladder, "H100 SXM5")
    where = facts["ladder_where"]
    assert "Measured here on" in where and "course_small" in where
    assert "gpt2_large" in where and "prediction" in where and "H100 SXM5" in where
    assert "not GPU timings" in where and "fused attention" in where and "casts" in where
    assert "FP32 is the baseline" in facts["ladder_verdict"]
    assert "roofline predicts" in facts["ladder_predicted"] and "gpt2_large" in facts["ladder_predicted"]
    table = PROSE.measured_table(small_ladder)
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| rung")]
    assert len(rows) == len(small_ladder.runs) + len(small_ladder.skipped)
    assert table.startswith("**Eager:**") and "**Compiled:**" not in table     # the small ladder runs eagerly
    # a skip's reason is a lettered note under the table, not a wide cell
    for skip in small_ladder.skipped:
        assert skip.reason not in "\n".join(rows) and f"{skip.reason.rstrip('.')}." in table
    predicted = PROSE.predicted_table(small_ladder, "H100 SXM5")
    assert len([line for line in predicted.splitlines() if line.startswith("| ")]) == 1 + len(LADDER.RUNGS)
    assert "| BF16 = FP16 |" in predicted.splitlines()[0]      # the roofline cannot tell them apart
    assert "Tokens per step: course_small" in predicted
    assert "python -m course_lib.record scale_ladder" in PROSE.recorded_ladder_block([])


def test_plot_draws_measured_marks_only_where_they_were_measured(small_ladder):
    fig = plot_scale_ladder(small_ladder)
    devices = small_ladder.predicted_devices()
    assert len(fig.axes) == 2 * len(devices)
    own = devices.index(small_ladder.own_prediction_device)
    for col in range(len(devices)):
        top = fig.axes[col]          # subplots fill row by row: the top row first
        markers = [line for line in top.get_lines() if line.get_linestyle() == "None"]
        assert len(markers) == (len({(r.recipe, r.compiled) for r in small_ladder.runs}) if col == own else 0)
        assert top.get_xscale() == top.get_yscale() == "log"
    with pytest.raises(ValueError, match="no predictions for"):
        plot_scale_ladder(small_ladder, devices=["B300"])
    # recipes with the same predicted points share one line named for them all; every recipe keeps a name
    h200 = devices.index("H100 SXM5")
    dashed = [line for line in fig.axes[h200].get_lines() if line.get_linestyle() == "--"]
    labels = [line.get_label() for line in dashed]
    assert "BF16 autocast and FP16 autocast (predicted)" in labels
    assert "FP8 tensorwise (predicted)" in labels and "FP8 rowwise (predicted)" in labels   # casts differ
    assert len({tuple(line.get_ydata()) for line in dashed}) == len(dashed)
    # lines that nearly agree stay visible: each recipe's line has its own width (and dash)
    assert len({line.get_linewidth() for line in dashed}) == len(dashed)


def test_skip_notes_letter_each_distinct_reason_once():
    letters, notes = PROSE.skip_notes(["no TF32 here.", "FP8 is emulated", "no TF32 here."])
    assert letters == {"no TF32 here.": "a", "FP8 is emulated": "b"}
    assert notes == "(a) no TF32 here.\n\n(b) FP8 is emulated."
    assert PROSE.skip_notes([]) == ({}, "")
    with pytest.raises(ValueError, match="more than 26"):
        PROSE.skip_notes([str(i) for i in range(27)])


def test_the_ladder_pieces_cover_every_rung_recipe_and_mode_once():
    """The GPU session records the ladder in LADDER_PIECES: laid over the registry's full size, together they
    run every (rung, recipe, compiled) exactly once, and the first piece is the registry's own full size."""
    full = LADDER.ladder_sizes(SizeProfile("full"), "cpu")
    assert LADDER.LADDER_PIECES[0] == {}
    seen = []
    for piece in LADDER.LADDER_PIECES:
        assert set(piece) <= set(inspect.signature(LADDER.scale_ladder).parameters)
        params = {**full, **piece}
        seen += [(r, recipe, c) for r in params["rungs"] for recipe in params.get("recipes", LADDER.LADDER_RECIPES)
                 for c in params["compile_modes"]]
    assert sorted(seen) == sorted((r, recipe, c) for r in LADDER.RUNGS if r != "course_small"
                                  for recipe in LADDER.LADDER_RECIPES for c in (False, True))


def test_a_ratio_inside_the_step_time_noise_is_a_tie_and_one_rung_locates_nothing():
    """1.8x with overlapping quartiles is no evidence; one measured rung cannot say where along the ladder
    mixed precision starts to pay (the CPU page's case)."""
    def run(rung, recipe, steps_ms):
        return LADDER.LadderRun(rung, recipe, False, tuple(1e-3 * ms for ms in steps_ms), 1e-3)

    base = _synthetic({})
    noisy = dataclasses.replace(base, runs=(run("gpt2_small", "tf32", (50, 90, 90, 130)),
                                            run("gpt2_small", "bf16_autocast", (30, 50, 50, 100)),
                                            run("gpt2_medium", "tf32", (250, 250, 251)),
                                            run("gpt2_medium", "bf16_autocast", (130, 131, 130))))
    assert PROSE.bf16_speedups(noisy)["gpt2_small"] == pytest.approx(1.8)
    text = PROSE.mixed_precision_verdict(noisy)
    assert "starts to pay at gpt2_medium" in text and "within the step-time quartiles) at gpt2_small" in text
    one = dataclasses.replace(base, runs=noisy.runs[2:])
    text = PROSE.mixed_precision_verdict(one)
    assert "One rung ran here, so this run cannot say where along the ladder" in text
    assert ("at gpt2_medium BF16 paid (1.923x, step-time quartiles apart: BF16's upper quartile 131 ms against "
            "TF32's lower one 250 ms).") in text
    one_noisy = dataclasses.replace(base, runs=noisy.runs[:2])
    assert "at gpt2_small BF16's step-time quartiles overlap TF32's (1.800x its speed): no difference beyond the " \
        "step-to-step noise." in PROSE.mixed_precision_verdict(one_noisy)
    # slower beyond the quartiles, but within the margin (this Xeon's 0.928x): said as slower, with its ratio
    slower = dataclasses.replace(base, runs=(run("gpt2_small", "tf32", (17.4, 18.0, 18.5)),
                                             run("gpt2_small", "bf16_autocast", (19.0, 19.4, 20.2))))
    assert "at gpt2_small BF16 was slower than TF32 beyond the step-time quartiles: TF32's upper quartile" in \
        PROSE.mixed_precision_verdict(slower)
    assert "x its speed, within 1.1x." in PROSE.mixed_precision_verdict(slower)
    # faster beyond the quartiles, but by less than the margin (the CPU page's 1.097x): said with its ratio
    short = dataclasses.replace(base, runs=(run("gpt2_small", "tf32", (10.9, 10.97, 11.0)),
                                            run("gpt2_small", "bf16_autocast", (9.9, 10.0, 10.1))))
    said = PROSE.mixed_precision_verdict(short)
    assert "at gpt2_small BF16 was faster beyond the step-time quartiles: BF16's upper quartile " in said
    assert "ms, but by 1.097x, short of 1.1x." in said


def test_the_page_says_which_rungs_it_runs_from_the_registry():
    full = LADDER.ladder_sizes(SizeProfile("full"), "cpu")
    assert PROSE.page_rungs(full) == "2 rungs of the model ladder (`course_full` and `gpt2_small`), eagerly"
    assert PROSE.page_rungs({"rungs": ["gpt2_large"], "compile_modes": [True]}) == (
        "1 rung of the model ladder (`gpt2_large`), compiled")
    assert PROSE.page_rungs({"rungs": ["a", "b", "c"], "compile_modes": [False, True]}).endswith(
        "(`a`, `b` and `c`), eagerly and compiled")


def test_speedup_by_size_erratum_separates_the_baselines_and_says_what_is_measured(small_ladder):
    claim, text = PROSE.speedup_by_size_erratum(small_ladder, "H100 SXM5", {}, [])
    assert claim == PROSE.SPEEDUP_BY_SIZE_CLAIM
    over_fp32 = PROSE.predicted_speedups(small_ladder, "H100 SXM5", "fp32")
    over_tf32 = PROSE.predicted_speedups(small_ladder, "H100 SXM5", "tf32")
    assert f"{over_fp32['course_small']:.2f}x FP32 with TF32 off for `course_small`" in text
    assert f"{over_fp32['gpt2_large']:.2f}x for `gpt2_large`" in text
    assert f"{min(over_tf32.values()):.2f}x to {max(over_tf32.values()):.2f}x TF32" in text
    assert text.endswith("so the growth with size is predicted here, not measured.")
    rows = [{"recipe": "fp32", "compiled": False, "tokens_per_s": 100.0},
            {"recipe": "tf32", "compiled": False, "tokens_per_s": 180.0},
            {"recipe": "bf16_autocast", "compiled": False, "tokens_per_s": 183.0},
            {"recipe": "bf16_autocast", "compiled": True, "tokens_per_s": 999.0}]
    study = types.SimpleNamespace(table=lambda: rows)
    measured = PROSE.speedup_by_size_erratum(small_ladder, "H100 SXM5", {"the recorded H100": study}, [])[1]
    assert ("Measured on the recorded H100: BF16 autocast ran at 1.83x FP32's token rate with TF32 off and 1.02x "
            "TF32's (eager).") in measured
    assert PROSE.speedup_by_size_erratum(small_ladder, "H100 SXM5", {}, ["a record"])[1].endswith(
        "The ladder's own GPU records are above.")
    with pytest.raises(ValueError, match="no BF16 and FP32 predictions"):
        PROSE.speedup_by_size_erratum(small_ladder, "B300", {}, [])


def test_the_predicted_ratio_stays_near_two_because_peaks_and_bytes_both_give_two(small_ladder):
    # the H100's BF16 and TF32 peaks are 2x apart, as 4-byte and 2-byte elements are: every mix lands near 2
    h100 = PROSE.why_the_ratio_stays("H100 SXM5", "tf32")
    assert h100.startswith("Against TF32 on the H100 SXM5, a compute-bound product gains the ratio of the peaks, "
                           "989.5/494.5 = 2.00x, and a memory-bound operation the ratio of the bytes, 4/2 = 2.00x; "
                           "both are near 2")
    assert "hardly moves the ratio" in h100 and "launch" not in h100
    # against FP32 with TF32 off the peaks are 15x apart: the ratio moves with the mix
    assert "the two differ, so the ratio moves" in PROSE.why_the_ratio_stays("H100 SXM5", "fp32")
    cpu = PROSE.why_the_ratio_stays("this CPU (x)", "fp32")
    assert cpu.startswith("Against FP32, a memory-bound operation gains the ratio of the bytes, 4/2 = 2.00x; this "
                          "device's peaks are not on the datasheet table")
    with pytest.raises(ValueError, match="over must be"):
        PROSE.why_the_ratio_stays("H100 SXM5", "fp16")
    with pytest.raises(ValueError, match="recipe must be one of"):
        LADDER.recipe_element_bytes("int8")
    assert (LADDER.recipe_element_bytes("tf32"), LADDER.recipe_element_bytes("bf16_autocast")) == (4, 2)
    verdict = PROSE.predicted_verdict(small_ladder, "H100 SXM5")
    assert verdict.startswith("The roofline predicts BF16's speed over TF32's on the H100 SXM5 (every activation "
                              "counted at 16 bits, as pure BF16 stores them; autocast keeps layer norm and softmax "
                              "in FP32, so it gains less on those operations and this is its ceiling): ")
    assert "989.5/494.5 = 2.00x" in verdict and "no launch cost" not in verdict
    assert "autocast keeps layer norm and softmax in FP32" in PROSE.speedup_by_size_erratum(
        small_ladder, "H100 SXM5", {}, [])[1]


def test_prediction_lines_note_calls_cpu_lines_estimates_and_names_runs_above_them(small_ladder):
    own = small_ladder.own_prediction_device
    assert own.startswith("this CPU")

    def scaled(rate):
        return dataclasses.replace(small_ladder, predictions=tuple(
            dataclasses.replace(p, tokens_per_second=rate) if p.device == own else p
            for p in small_ladder.predictions))

    below = PROSE.prediction_lines_note(scaled(1e12), 256)
    assert below.startswith("The dashed lines for the H100 SXM5 use datasheet peaks and bandwidth with no "
                            "launches: ceilings.")
    assert (f"The lines for {own} are estimates, not ceilings: a CPU has no datasheet, so each dtype's rate is the "
            "capability probe's, one square product of n = 256") in below
    assert below.endswith("no measured run lies above its line here.")
    above = PROSE.prediction_lines_note(scaled(1.0), 256)
    run = small_ladder.runs[0]
    times = small_ladder.tokens_per_second(run)
    assert f"{PROSE.run_label(run)} at `{run.rung}`, {times:.1f} times its line" in above
    with pytest.raises(ValueError, match="probe_n"):
        PROSE.prediction_lines_note(small_ladder, 0)
