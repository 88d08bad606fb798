"""Lesson 7's speed studies (course_lib.studies.fp8_speed), their prose (fp8_prose) and figure (plots.fp8):
the profiler breakdown of the course's FP8 layer and torchao float8 against BF16, compiled on a GPU. Nothing
here asserts a speed: the studies run tiny on the CPU, and the sentences are checked on results built by hand."""

from __future__ import annotations

import dataclasses
import warnings
from types import SimpleNamespace

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.figure import Figure

from course_lib import hardware
from course_lib.bench import profiling
from course_lib.device import SizeProfile
from course_lib.fp8.roofline import predict_fp8_linear
from course_lib.glue import Prose
from course_lib.hardware import DATASHEET_PEAKS
from course_lib.jsonable import from_jsonable, to_jsonable
from course_lib.plots.fp8 import plot_fp8_compiled_speed
from course_lib.studies import fp8_prose
from course_lib.studies import fp8_speed
from course_lib.studies.fp8_speed import (
    BF16,
    BF16_EAGER,
    COURSE_EAGER,
    LAYER_GROUPS,
    Fp8CompiledSpeed,
    Fp8LayerProfile,
)

TW, RW = fp8_speed.torchao_name("tensorwise"), fp8_speed.torchao_name("rowwise")


def speed(*, device="cpu", linear=None, block=None, skipped=None, compiled=False, block_width=64) -> Fp8CompiledSpeed:
    linear = linear if linear is not None else {BF16: {64: 1.0, 128: 2.0}, TW: {64: 2.0, 128: 1.0},
                                                COURSE_EAGER: {64: 4.0, 128: 8.0}}
    block = block if block is not None else {BF16: 3.0, TW: 6.0}
    return Fp8CompiledSpeed(device, compiled, "torch.compile" if compiled else "eager", 64, (64, 128), block_width,
                            1, 32, linear, block, skipped or {}, "H100 SXM5",
                            {"tensorwise": {64: 0.3, 128: 0.5}}, {"tensorwise": 0.4})


def layer_profile(device="cpu", **self_us) -> Fp8LayerProfile:
    times = {"amax": 10.0, "scale": 5.0, "cast": 20.0, "matmul": 60.0, "other": 5.0, **self_us}
    return Fp8LayerProfile(device, 64, 64, "tensorwise", "scaled_mm", 2, times, 50.0)


# ---- the profiler breakdown ------------------------------------------------------------------------------

def test_operator_groups():
    assert fp8_speed.operator_group("aten::_scaled_mm", "fp8_matmul") == "matmul"
    assert fp8_speed.operator_group("aten::mm", None) == "matmul"
    assert fp8_speed.operator_group("aten::aminmax", "block_amax") == "amax"
    assert fp8_speed.operator_group("aten::isfinite", "check_finite_amax") == "amax"
    assert fp8_speed.operator_group("aten::reciprocal", "amax_to_scale") == "scale"
    assert fp8_speed.operator_group("aten::reciprocal", "_scaled_mm_inverse") == "scale"
    assert fp8_speed.operator_group("aten::_to_copy", "cast_saturating") == "cast"
    assert fp8_speed.operator_group("aten::mul", "cast_blocks") == "cast"
    assert fp8_speed.operator_group("aten::add", "forward") == "other"
    assert fp8_speed.operator_group("aten::add", None) == "other"


def test_self_time_is_kernel_time_on_a_gpu_and_cpu_time_elsewhere():
    new = SimpleNamespace(self_device_time_total=7.0, self_cpu_time_total=3.0)
    old = SimpleNamespace(self_cuda_time_total=5.0, self_cpu_time_total=3.0)
    assert profiling.self_time_us(new, "cuda") == 7.0
    assert profiling.self_time_us(old, "cuda") == 5.0       # an older torch's field name
    assert profiling.self_time_us(new, "cpu") == 3.0
    assert len(profiling.profiler_activities(torch.device("cuda"))) == 2
    assert len(profiling.profiler_activities(torch.device("cpu"))) == 1


def test_grouping_follows_the_nearest_course_frame():
    def event(name, parent=None, us=0.0):
        return SimpleNamespace(name=name, cpu_parent=parent, self_cpu_time_total=us)

    quantize = event("src/course_lib/fp8/recipes.py(44): quantize")
    amax_fn = event("src/course_lib/fp8/casts.py(230): block_amax", quantize)
    cast_fn = event("src/course_lib/fp8/casts.py(70): cast_saturating", quantize)
    to = event("aten::to", cast_fn, 1.0)
    events = [quantize, amax_fn, cast_fn, event("aten::aminmax", amax_fn, 4.0), to,
              event("aten::_to_copy", to, 2.0), event("aten::mm", quantize, 8.0), event("aten::sum", None, 16.0)]
    assert fp8_speed.grouped_self_times(events, "cpu") == {"amax": 4.0, "scale": 0.0, "cast": 3.0, "matmul": 8.0,
                                                           "other": 16.0}


def test_profile_of_the_course_layer_covers_every_stage():
    p = fp8_speed.profile_fp8_layer("cpu", features=32, tokens=32, steps=1)
    assert set(p.self_us) == set(LAYER_GROUPS)
    for group in ("amax", "scale", "cast", "matmul"):
        assert p.self_us[group] > 0, group
    assert p.bf16_us > 0 and p.total_us == pytest.approx(sum(p.self_us.values()))
    assert sum(p.share(g) for g in LAYER_GROUPS) == pytest.approx(1.0)
    assert from_jsonable(Fp8LayerProfile, to_jsonable(p)) == p
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8_speed.profile_fp8_layer("cpu", features=24, tokens=32)
    with pytest.raises(ValueError, match="steps"):
        fp8_speed.profile_fp8_layer("cpu", steps=0)
    with pytest.raises(ValueError, match="unknown group"):
        p.share("casts")


def test_profile_uses_the_simulated_backend_where_scaled_mm_does_not_run(monkeypatch):
    monkeypatch.setattr(hardware, "_scaled_mm_runs", lambda device: "no _scaled_mm (test)")
    p = fp8_speed.profile_fp8_layer("cpu", features=16, tokens=16, steps=1)
    assert p.backend == "simulated" and p.self_us["matmul"] > 0


def test_profile_facts_per_device():
    cpu = fp8_prose.layer_profile_facts(layer_profile(), cpu_kernel="reference")
    assert "It has no FP8 matrix unit: `_scaled_mm` converts the codes back to FP32 and multiplies there." \
        in cpu["prof_verdict"]
    onednn = fp8_prose.layer_profile_facts(layer_profile(), cpu_kernel="onednn")["prof_verdict"]
    assert "torch hands the products whose operands share one FP8 format and per-tensor scales (the forward's) " \
        "to oneDNN's FP8 software kernel" in onednn
    # by default the kernel is this CPU's, measured
    from course_lib import hardware
    assert fp8_prose.layer_profile_facts(layer_profile())["prof_verdict"] == fp8_prose.layer_profile_facts(
        layer_profile(), cpu_kernel=hardware.cpu_fp8_kernel())["prof_verdict"]
    assert cpu["prof_matmul_pct"] == pytest.approx(60.0) and cpu["prof_rest_pct"] == pytest.approx(40.0)
    assert cpu["prof_vs_bf16"] == pytest.approx(2.0)
    assert "CPU" in cpu["prof_verdict"] and "numerics reference" not in cpu["prof_verdict"]
    gpu = fp8_prose.layer_profile_facts(layer_profile("cuda:0"))
    assert "numerics reference" in gpu["prof_verdict"] and "torchao" in gpu["prof_verdict"]
    fast = fp8_prose.layer_profile_facts(layer_profile("cuda:0", matmul=5.0, cast=1.0))
    assert "not slower" in fast["prof_verdict"]
    table = fp8_prose.layer_profile_table(layer_profile())
    assert "| matmul | 60 | 60.0% |" in table and "BF16 nn.Linear, total | 50" in table
    with pytest.raises(ValueError, match="no time"):
        fp8_prose.layer_profile_facts(Fp8LayerProfile("cpu", 1, 1, "t", "s", 1, dict.fromkeys(LAYER_GROUPS, 0.0), 1.0))
    assert cpu["prof_other"] == ""   # no operators listed: nothing to say about them
    listed = dataclasses.replace(layer_profile(), other_ops={"aten::copy_": 3.0, "aten::t": 1.0, "aten::view": 0.0})
    other = fp8_prose.layer_profile_facts(listed)["prof_other"]
    assert other.startswith('The group "other" (5.0%) holds every operator called outside')
    assert other.endswith("here the largest: `copy_` 3.0% and `t` 1.0% of the layer's time.")


def test_profile_lists_the_operators_of_the_other_group():
    profile = fp8_speed.profile_fp8_layer("cpu", features=32, tokens=32, steps=1)
    assert profile.other_ops and all(op.startswith("aten::") for op in profile.other_ops)
    assert sum(profile.other_ops.values()) == pytest.approx(profile.self_us["other"])


# ---- torchao compiled against BF16 -----------------------------------------------------------------------

def test_llama_block_shapes():
    assert fp8_speed.llama_hidden(4096) == 11008
    block = fp8_speed.LlamaBlock(64, head_dim=32)
    x = torch.randn(2, 8, 64)
    assert block(x).shape == x.shape
    assert sum(isinstance(m, torch.nn.Linear) for m in block.modules()) == len(fp8_speed.block_linear_shapes(64, 16))
    with pytest.raises(ValueError, match="head_dim"):
        fp8_speed.LlamaBlock(96, head_dim=64)


def test_prediction_is_the_roofline_summed_over_products():
    h100 = DATASHEET_PEAKS["H100 SXM5"]
    one = predict_fp8_linear(8192, 4096, 4096, bf16_tflops=989.5, fp8_tflops=1979.0, bandwidth_gbs=3350.0)
    assert fp8_speed.predicted_speedup(h100, [(8192, 4096, 4096)], "tensorwise") == pytest.approx(one.speedup)
    shapes = fp8_speed.block_linear_shapes(4096, 8192)
    parts = [predict_fp8_linear(*s, bf16_tflops=989.5, fp8_tflops=1979.0, bandwidth_gbs=3350.0) for s in shapes]
    assert fp8_speed.predicted_speedup(h100, shapes, "tensorwise") == pytest.approx(
        sum(p.bf16_s for p in parts) / sum(p.fp8_s for p in parts))
    with pytest.raises(ValueError, match="no BF16 or no FP8"):
        fp8_speed.predicted_speedup(DATASHEET_PEAKS["A100 SXM4 80GB"], shapes, "tensorwise")


def test_prediction_gpu_is_the_one_in_use(monkeypatch):
    assert fp8_speed.prediction_gpu("cpu").name == "H100 SXM5"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert fp8_speed.prediction_gpu("cuda:0").name == "H200 SXM"
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert fp8_speed.prediction_gpu("cuda") is None


def test_speed_ratios_and_baselines():
    s = speed()
    assert s.linear_speedup(TW) == {64: 0.5, 128: 2.0}
    assert s.linear_speedup(COURSE_EAGER) == {64: 0.25, 128: 0.25}      # no eager BF16: against BF16
    assert s.block_speedup(TW) == 0.5 and s.block_speedup(RW) is None
    eager = speed(linear={BF16: {64: 1.0}, BF16_EAGER: {64: 2.0}, COURSE_EAGER: {64: 4.0}})
    assert eager.baseline(COURSE_EAGER) == BF16_EAGER and eager.linear_speedup(COURSE_EAGER) == {64: 0.5}
    assert from_jsonable(Fp8CompiledSpeed, to_jsonable(s)) == s


def test_compiled_speed_runs_small_on_the_cpu_and_says_what_it_skipped(monkeypatch):
    monkeypatch.setattr(hardware, "_scaled_mm_rowwise_runs", lambda device: "per-tensor scales only (test)")
    result = fp8_speed.fp8_compiled_speed("cpu", sizes=(16,), tokens=16, block_width=32, block_seq=16,
                                          eager_reason="a test", budget_s=0.001)
    assert not result.compiled and result.mode == "eager: a test"
    assert set(result.linear_s) == {BF16, TW, COURSE_EAGER} and set(result.block_s) == {BF16, TW}
    assert result.skipped[RW] == "per-tensor scales only (test)"
    assert result.skipped[f"{RW} (block)"] == "per-tensor scales only (test)"
    assert result.predicted_for == "H100 SXM5" and set(result.predicted_linear) == {"tensorwise", "rowwise"}
    assert from_jsonable(Fp8CompiledSpeed, to_jsonable(result)) == result
    for bad in ({"sizes": (24,)}, {"sizes": ()}, {"tokens": 8}, {"block_width": 40}):
        with pytest.raises(ValueError):
            fp8_speed.fp8_compiled_speed("cpu", **{"sizes": (16,), "tokens": 16, **bad})


def test_compiled_speed_compiles_bf16_and_torchao_but_not_the_eager_layers(monkeypatch):
    compiled, resets = [], []

    def fake_compile(model):
        compiled.append(type(model).__name__)
        return model

    monkeypatch.setattr(torch, "compile", fake_compile)
    monkeypatch.setattr(torch.compiler, "reset", lambda: resets.append(1))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    monkeypatch.setattr(fp8_speed, "prediction_gpu", lambda device: None)
    result = fp8_speed.fp8_compiled_speed("cpu", sizes=(16,), tokens=16, block_width=0, compile=True,
                                          budget_s=0.001)
    assert result.compiled and result.mode == "torch.compile"
    assert compiled == ["Linear", "Float8Linear", "Float8Linear"] and len(resets) == 3   # BF16, tensorwise, rowwise
    assert set(result.linear_s) == {BF16, TW, RW, COURSE_EAGER, BF16_EAGER}
    assert result.block_s == {} and "datasheet" in result.skipped["prediction"]


def test_a_failing_implementation_is_skipped_with_its_error(monkeypatch):
    monkeypatch.setattr(fp8_speed, "_torchao_converter", lambda: (None, "torchao does not import here (test)"))
    real = fp8_speed.time_function

    def failing(fn, *args, **kwargs):
        if failing.calls == 0:
            failing.calls += 1
            raise RuntimeError("out of memory (test)\nmore")
        return real(fn, *args, **kwargs)

    failing.calls = 0
    monkeypatch.setattr(fp8_speed, "time_function", failing)
    result = fp8_speed.fp8_compiled_speed("cpu", sizes=(16,), tokens=16, block_width=0, budget_s=0.001)
    assert result.skipped[BF16] == "RuntimeError: out of memory (test)"
    assert result.skipped[TW] == result.skipped[RW] == "torchao does not import here (test)"
    assert set(result.linear_s) == {COURSE_EAGER}


def test_registry_parameters_compile_on_a_gpu_only():
    full, small = SizeProfile("full"), SizeProfile("small")
    gpu = fp8_speed.compiled_speed_parameters(full, "cuda")
    assert gpu["compile"] and gpu["sizes"] == (4096, 8192) and gpu["block_width"] == 4096
    assert 8192 <= gpu["tokens"] <= 16384 and 8192 <= gpu["block_batch"] * gpu["block_seq"] <= 16384
    cpu = fp8_speed.compiled_speed_parameters(small, "cpu")
    assert not cpu["compile"] and "CPU" in cpu["eager_reason"] and max(cpu["sizes"]) <= 128


# ---- prose and figure ------------------------------------------------------------------------------------

def test_speed_classes_call_a_ratio_within_one_percent_of_1_break_even():
    assert [fp8_speed.speed_class(r) for r in (0.98, 0.99, 1.003, 1.01, 1.02)] == [
        "slower", "break-even", "break-even", "break-even", "faster"]
    for bad in (0.0, -1.0, float("nan"), float("inf"), "1"):
        with pytest.raises(ValueError, match="speed ratio"):
            fp8_speed.speed_class(bad)


def test_compiled_speed_table_and_facts():
    table = fp8_prose.compiled_speed_table(speed())
    assert table.splitlines()[0] == ("| shape | BF16 eager (ms) | torchao tensorwise: BF16 eager time / its time | course FP8 layer, "
                                     "tensorwise (eager): BF16 eager time / its time | predicted tensorwise on H100 SXM5: BF16 time / FP8 time "
                                     "(block: its seven linear products only) |")
    assert "| 64 tokens, 64→64 features | 1000.000 | 0.50 | 0.25 | 0.30 |" in table
    assert "| Llama block, width 64, 32 tokens | 3000.000 | 0.50 | - | 0.40 |" in table
    assert "BF16 time / FP8 time (block: its seven linear products only) |" in table.splitlines()[0]
    tiny = fp8_prose.compiled_speed_table(speed(linear={BF16: {64: 1.0}, TW: {64: 400.0}}))
    assert "| 64 tokens, 64→64 features | 1000.000 | 0.0025 |" in tiny      # two significant figures, not 0.00
    facts = fp8_prose.compiled_speed_facts(speed())
    assert facts["cs_verdict"].startswith("A CPU has **no FP8 tensor cores**") and facts["cs_faster_count"] == 1
    assert "This ran on a CPU" not in facts["cs_verdict"]
    assert "faster than BF16 in these runs: torchao tensorwise at 128 (2.00x)" in facts["cs_verdict"]
    assert facts["cs_verdict"].endswith("that is not FP8 arithmetic, which a CPU does not have.")
    slow_bf16 = fp8_prose.compiled_speed_facts(speed(), bf16_relative=0.5)["cs_verdict"]
    assert "BF16 is the slow side: this CPU multiplies BF16 at 0.50 times its FP32 rate" in slow_bf16
    gpu = fp8_prose.compiled_speed_facts(speed(device="cuda:0", compiled=True, skipped={RW: "no rows (test)"}))
    assert "tensor cores" not in gpu["cs_verdict"] and "noise" not in gpu["cs_verdict"]
    assert "torchao rowwise did not run: no rows (test)." in gpu["cs_verdict"]
    slow = fp8_prose.compiled_speed_facts(speed(linear={BF16: {64: 1.0}, TW: {64: 400.0}}, block={}))
    assert "slower than BF16 everywhere it ran: torchao tensorwise at 64 (0.0025x)" in slow["cs_verdict"]
    even = fp8_prose.compiled_speed_facts(speed(device="cuda", linear={BF16: {64: 1.003, 128: 1.0}, TW: {64: 1.0, 128: 2.0}},
                                                block={}))
    assert even["cs_faster_count"] == 0 and "faster than BF16 nowhere" in even["cs_verdict"]
    assert "broke even (within 1%) in these: torchao tensorwise at 64 (1.00x)" in even["cs_verdict"]
    assert "slower in these: torchao tensorwise at 128 (0.50x)" in even["cs_verdict"]
    with pytest.raises(ValueError, match="no FP8"):
        fp8_prose.compiled_speed_facts(speed(linear={BF16: {64: 1.0}}, block={}))


def test_compiled_prediction_note_says_when_predictions_only_count_kernels():
    note = fp8_prose.compiled_prediction_note(speed())   # 64 tokens of 64 and 128 features, on an H100
    assert "stays the same from one layer size to the next here" in note and "2 µs floor" in note
    assert "(3 for BF16 against 13 for tensorwise)" in note
    assert fp8_prose.compiled_prediction_note(dataclasses.replace(speed(), tokens=8192, sizes=(8192,))) == ""
    assert fp8_prose.compiled_prediction_note(dataclasses.replace(speed(), predicted_for="")) == ""


def test_compiled_table_shows_eager_bf16_where_the_course_layer_is_compared_with_it():
    s = speed(compiled=True, linear={BF16: {64: 1.0}, BF16_EAGER: {64: 2.0}, TW: {64: 0.5}, COURSE_EAGER: {64: 4.0}})
    header, _, row, *_ = fp8_prose.compiled_speed_table(s).splitlines()
    assert header.startswith("| shape | BF16 compiled (ms) | BF16 eager (ms) | torchao tensorwise: BF16 compiled time / its time "
                             "| course FP8 layer, tensorwise (eager): BF16 eager time / its time |")
    assert row.startswith("| 64 tokens, 64→64 features | 1000.000 | 2000.000 | 2.00 | 0.50 |")


def test_what_the_page_may_say_about_fp8_paying():
    assert "prediction alone" in fp8_prose.fp8_pays_note(None)
    wins = fp8_prose.fp8_pays_note(speed(device="cuda"), "an H200")
    assert isinstance(wins, Prose) and "torchao tensorwise at 128" in wins and "an H200" in wins
    none = fp8_prose.fp8_pays_note(speed(device="cuda", linear={BF16: {64: 1.0}, TW: {64: 2.0}}, block={}), "X")
    assert "not faster than BF16 at any recorded shape" in none
    tie = speed(device="cuda", linear={BF16: {64: 1.005}, TW: {64: 1.0}}, block={})
    assert "not faster" in fp8_prose.fp8_pays_note(tie, "X")          # break-even is not a win
    assert fp8_prose.fp8_pays_takeaway(None) == "no GPU has measured that yet"
    assert fp8_prose.fp8_pays_takeaway(speed(device="cuda"), "X") == "on X torchao compiled beat BF16 at 1 of 3 shapes"
    assert "numerics reference" in fp8_prose.course_layer_note(None)
    assert "loops" not in fp8_prose.course_layer_note(None) and "this version" in fp8_prose.course_layer_note(None)
    assert "numerics reference" in fp8_prose.course_layer_note(speed(device="cuda"), "X")
    fast = speed(device="cuda", linear={BF16: {64: 1.0}, BF16_EAGER: {64: 2.0}, COURSE_EAGER: {64: 1.0}})
    assert "2.00 to 2.00 times eager BF16's" in fp8_prose.course_layer_note(fast, "X")


def test_references_to_the_compiled_section_say_whether_a_gpu_measured():
    assert fp8_prose.gpu_pointer(None) == "will measure it on a GPU, once recorded"
    assert fp8_prose.gpu_pointer(None, verb="time") == "will time it on a GPU, once recorded"
    assert fp8_prose.gpu_pointer(speed(device="cuda"), "an H200", verb="time") == "times it on an H200"
    with pytest.raises(ValueError, match="verb"):
        fp8_prose.gpu_pointer(None, verb="measures")
    assert fp8_prose.linear_record_note(None) == "."
    older = fp8_prose.linear_record_note("an H100", "2026-11-22T17:48:35")
    assert older.startswith("; the record above, on an H100,") and "older, slower version" in older
    # a record taken once the layer cast in one pass says nothing of the kind
    assert fp8_prose.linear_record_note("an H200", "2026-11-26T09:00:00") == "."


def test_compiled_speed_figure():
    for s in (speed(), speed(block={}, block_width=0)):
        with warnings.catch_warnings():
            warnings.simplefilter("error")     # a layout matplotlib cannot do warns; the page would show it
            fig = plot_fp8_compiled_speed(s)
        assert isinstance(fig, Figure)
        measured, right, predicted, _ = fig.axes
        # measurements on the top row, the roofline's predictions on the bottom one: never on one axis
        assert all(line.get_linestyle() != "--" for line in measured.get_lines())
        assert [line.get_linestyle() for line in predicted.get_lines()] == ["--", "-"]   # prediction, line at 1
        assert "measured on CPU" in measured.get_title() and "predicted for H100 SXM5" in predicted.get_title()
        texts = [t for ax in fig.axes for t in ax.texts + [ax.xaxis.label, ax.yaxis.label]]
        assert all(t.get_fontsize() >= 9 for t in texts if t.get_text())
        assert len(fig.legends) == 1 and all(t.get_fontsize() >= 9 for t in fig.legends[0].get_texts())
        fig.canvas.draw()
        box = fig.legends[0].get_window_extent()
        for ax in fig.axes:                        # below every panel, clear of their labels
            assert box.y1 < ax.get_tightbbox().y0
        plt.close(fig)


def test_compiled_speed_figure_keeps_coinciding_markers_apart():
    s = speed(linear={BF16: {64: 1.0, 128: 1.0}, TW: {64: 2.0, 128: 2.0}, COURSE_EAGER: {64: 2.0, 128: 2.0}})
    fig = plot_fp8_compiled_speed(s)
    measured = [line for line in fig.axes[0].get_lines() if line.get_marker() not in ("None", "", None)]
    assert len(measured) == 2 and measured[0].get_marker() != measured[1].get_marker()
    xs = [tuple(line.get_xdata()) for line in measured]
    assert xs[0] != xs[1] and all(abs(a / b - 1) < 0.1 for a, b in zip(*xs))   # nudged, not moved
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "tensorwise, predicted" in labels
    assert len(fig.axes[3].get_lines()) == 2      # the block's predicted bar and the line at 1
    plt.close(fig)
