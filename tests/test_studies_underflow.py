"""Lesson 2's facts, phrases, tables and errata, each computed from hand-built results with known numbers."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from course_lib.glue import Prose
from course_lib.gradients import GradientCapture, LayerGradient, UnderflowSummary
from course_lib.overflow import MatmulOverflow, SoftmaxOverflow
from course_lib.results import Provenance, Record, RecordedResult
from course_lib.studies import layer_gradients as L
from course_lib.studies import underflow as S
from course_lib.tables import MarkdownTable


def _layer(name: str, kind: str, index: int, values) -> LayerGradient:
    t = torch.tensor(values, dtype=torch.float32)
    return LayerGradient(name, kind, index, t, t.numel())


# ---- captured gradients ----------------------------------------------------------------------------------

def _run() -> S.CapturedTraining:
    # weight gradients far below every format: they would change every fraction if they were counted
    weights = _layer("fc", "weight", 0, [2.0**-30] * 4)
    first = GradientCapture((_layer("fc", "activation", 0, [2.0**-26, 1.0, 1.0, 1.0]), weights), 3.0)
    # FP16 flushes 2**-26 (below 2**-25), keeps 2**-20 subnormal; E4M3 flushes below 2**-10, E5M2 below 2**-17
    last = GradientCapture((_layer("fc", "activation", 0, [2.0**-26, 2.0**-20]),
                            _layer("head", "activation", 1, [2.0**-12, 1.0]), weights), 2.0)
    return S.CapturedTraining(losses=(3.0, 2.75, 2.5, 2.25, 2.125, 2.0), captures={0: first, 5: last})


def test_capture_facts_read_the_first_and_last_activation_gradients_in_each_format():
    assert S.capture_facts(_run()) == {
        "flush_first": 25.0, "flush_last": 25.0, "n_steps": 6, "last_step": 5,
        "late_flushed": 25.0, "late_subnormal": 25.0, "late_normal": 50.0,
        "late_e4m3_flushed": 75.0, "late_bf16_flushed": 0.0, "late_e5m2_flushed": 50.0,
    }
    with pytest.raises(ValueError, match="captured no step"):
        S.capture_facts(S.CapturedTraining(losses=(1.0,), captures={}))


def _provenance():
    return Provenance("NVIDIA H100 80GB HBM3", "cuda", "2.11", "2026-01-01T00:00:00+00:00", "cmd", "abcdef", "3.12",
                      compute_capability="9.0", cuda_version="13.0")


PROVENANCE_LINE = ("- **NVIDIA H100 80GB HBM3 (sm 9.0)**: torch 2.11, CUDA 13.0, 2026-01-01T00:00:00+00:00, commit "
                   "`abcdef`, command `cmd`")


def test_recorded_underflow_texts_give_the_recorded_table_then_the_provenance():
    summary = {"format": "FP16", "loss_scale": 1.0, "count": 4, "zero": 0.0, "flushed": 0.25, "subnormal": 0.5,
               "overflow": 0.0}
    stats = S.UnderflowStatistics((), {0: S.StepUnderflow({"activation": {"FP16": UnderflowSummary(**summary)}}, ())})
    texts = S.recorded_underflow_texts([RecordedResult(Record("underflow_statistics", {}, {}, _provenance()), stats)])
    assert texts == (
        "The same experiment recorded at full size on **NVIDIA H100 80GB HBM3 (sm 9.0)**:\n\n"
        "| step | format | already zero | flushed to zero | subnormal | overflow |\n|---|---|---|---|---|---|\n"
        "| 0 | FP16 | 0.00% | 25.00% | 50.00% | 0.00% |\n",
        "Recorded GPU runs (`python -m course_lib.record underflow_statistics`):\n\n" + PROVENANCE_LINE,
    )


def _summary(fmt, zero=0.0, flushed=0.0):
    return UnderflowSummary(fmt, 1.0, 100, zero, flushed, 0.0, 0.0)


def _zero_stats(qkv_zeros=(0.85, 0.89), fc_zeros=(0.04, 0.44), bf16_fc=0.02):
    rows = []
    for i, (q, f) in enumerate(zip(qkv_zeros, fc_zeros)):
        for layer, zero, bf16 in ((f"blocks.{i}.attn.qkv", q, 0.0), (f"blocks.{i}.attn.proj", 0.0, 0.0),
                                  (f"blocks.{i}.fc", f, bf16_fc), (f"blocks.{i}.out", 0.0, 0.0)):
            rows += [S.LayerUnderflow(layer, _summary("FP16", zero, 0.5)),
                     S.LayerUnderflow(layer, _summary("BF16", zero, bf16))]
    rows += [S.LayerUnderflow("head", _summary("FP16")), S.LayerUnderflow("head", _summary("BF16"))]
    overall = {"FP16": _summary("FP16", 0.251, 0.7), "BF16": _summary("BF16", 0.251, 0.0054)}
    early = S.StepUnderflow({"activation": {"FP16": _summary("FP16", 0.0003)}}, ())
    return S.UnderflowStatistics((), {0: early, 2999: S.StepUnderflow({"activation": overall}, tuple(rows))})


def test_exact_zero_text_places_the_last_steps_zeros_by_kind_of_layer():
    assert S.exact_zero_text(_zero_stats()) == (
        "At step 2999 of the recorded run, 25.1% of the activation gradients are exactly zero already in FP32, "
        "before any cast: they are in the `attn.qkv` layers (85-89% of each such layer's activation gradients) "
        "and the `fc` layers (4-44% of each such layer's activation gradients), and `attn.proj`, `out` and `head` hold none. No cast made them: the operation after the "
        "layer passed back zeros. After `qkv`, the likely source is an attention softmax whose weights are "
        "exactly 0 or 1 in FP32: it passes back an exact zero (its Jacobian vanishes); after `fc`, likely GELU, "
        "whose derivative is exactly zero in FP32 far below zero. The record keeps no attention weights or "
        "activations, so it cannot confirm these causes. BF16's 0.54% flushed are in the same kinds of layer (`fc`): values too small for "
        "BF16's smallest subnormal, 9.2e-41, that FP32 holds only as subnormals.")
    # equal shares print once; nothing flushed in BF16, nothing said of it
    text = S.exact_zero_text(_zero_stats(qkv_zeros=(0.5, 0.5), fc_zeros=(0.0, 0.0), bf16_fc=0.0))
    assert "the `attn.qkv` layers (50% of each such layer's activation gradients), and `attn.proj`, `fc`, `out` and `head` hold none" in text
    assert "GELU" not in text and "BF16" not in text


def test_exact_zero_text_is_silent_below_its_threshold_and_refuses_bad_input():
    stats = _zero_stats()
    assert S.exact_zero_text(stats, at_least=0.3) is None
    last = stats.steps[2999]
    few = S.UnderflowStatistics((), {5: S.StepUnderflow({"activation": {"FP16": _summary("FP16", 0.002),
                                                                        "BF16": _summary("BF16", 0.002)}},
                                                        last.per_layer_activation)})
    assert S.exact_zero_text(few) is None
    with pytest.raises(TypeError, match="UnderflowStatistics"):
        S.exact_zero_text({"steps": {}})
    with pytest.raises(ValueError, match="at_least"):
        S.exact_zero_text(stats, at_least=2)


def test_recorded_underflow_texts_add_the_zero_paragraph_after_the_table():
    texts = S.recorded_underflow_texts([RecordedResult(Record("underflow_statistics", {}, {}, _provenance()),
                                                       _zero_stats())])
    assert len(texts) == 3 and texts[1] == S.exact_zero_text(_zero_stats())


def test_recorded_underflow_texts_without_a_record_say_so():
    assert S.recorded_underflow_texts([]) == (
        "Recorded GPU runs (`python -m course_lib.record underflow_statistics`):\n\n"
        "*No recorded result for this experiment yet.*",)


def test_layer_facts_compare_the_first_and_last_layer():
    capture = GradientCapture((_layer("l0", "activation", 0, [2.0**-26, 1.0, 1.0, 1.0]),
                               _layer("l0", "weight", 0, [8.0]),
                               _layer("l1", "activation", 1, [2.0, 4.0, 4.0])), 1.0)
    assert L.layer_facts(capture) == {"mlp_first_flushed": 25.0, "mlp_last_flushed": 0.0, "mlp_ratio": 4.0,
                                      "mlp_ratio_text": "4", "mlp_layers": 2, "mlp_below_normal": 0,
                                      "mlp_zero_medians": 0}
    # medians against FP16's smallest normal (2**-14) and half its smallest subnormal (2**-25), counted from the
    # first layer on for the zero medians: a later layer back at zero does not extend the run
    medians = [2.0**-26, 2.0**-25, 2.0**-20, 2.0**-26, 2.0**-14, 1.0]
    stack = GradientCapture(tuple(_layer(f"l{i}", "activation", i, [m]) for i, m in enumerate(medians)), 1.0)
    facts = L.layer_facts(stack)
    assert (facts["mlp_below_normal"], facts["mlp_zero_medians"], facts["mlp_layers"]) == (4, 2, 6)
    assert L.layer_facts(stack, "BF16")["mlp_below_normal"] == 0 and L.layer_facts(stack, "BF16")["mlp_zero_medians"] == 0
    deep = GradientCapture((_layer("l0", "activation", 0, [1e-6]), _layer("l1", "activation", 1, [0.0666])), 1.0)
    assert L.layer_facts(deep)["mlp_ratio_text"] == "66,600"   # a plain number, not 6.66e+04
    with pytest.raises(ValueError, match="no activation gradient"):
        L.layer_facts(GradientCapture((_layer("l0", "weight", 0, [1.0]),), 1.0))


def test_gpt_layer_facts_read_the_residual_writers_the_inner_layers_and_the_head():
    capture = GradientCapture((_layer("blocks.0.attn.qkv", "activation", 0, [1e-6, 0.0]),
                               _layer("blocks.0.attn.proj", "activation", 1, [2e-5]),
                               _layer("blocks.0.fc", "activation", 2, [3e-5]),
                               _layer("blocks.0.out", "activation", 3, [8e-5]),
                               _layer("blocks.1.out", "activation", 4, [4e-5]),
                               _layer("head", "activation", 5, [1e-8])), 1.0)
    facts = L.gpt_layer_facts(capture)
    assert facts["gpt_blocks"] == 2 and facts["gpt_writer_spread"] == pytest.approx(4.0)
    assert facts["gpt_inner_place"] == "1 of 2 have a lower median than any layer that writes into the stream"
    assert facts["gpt_head_median"] == pytest.approx(1e-8) and facts["gpt_head_place"] == "the lowest of all"
    with pytest.raises(ValueError, match="not a capture of the course GPT"):
        L.gpt_layer_facts(GradientCapture((_layer("l0", "activation", 0, [1.0]),), 1.0))


# ---- naive FP16 ----------------------------------------------------------------------------------------------

FP32, FP16 = "FP32", "FP16 (.half(), no scaling)"


def _naive() -> S.NaiveFP16Comparison:
    def per_seed(a, b):
        return {FP32: a, FP16: b}

    return S.NaiveFP16Comparison(
        steps=4, seeds=(0, 1), adam_eps=1e-4,
        curves=per_seed(((3.0, 2.5, 2.0, 1.5), (3.0, 2.0, 1.5, 1.0)),
                        ((2.9, 2.6, 2.25, 1.75), (3.0, 2.5, 2.0, 1.5))),
        zero_grad_fraction=per_seed(((0.125,) * 4, (0.125,) * 4), ((0.25,) * 4, (0.5,) * 4)),
        unchanged_fraction=per_seed(((0.0,) * 4, (0.0,) * 4), ((0.03,) * 4, (0.0625,) * 4)),
        # the last two steps are outside the early window: counting them would move every mean (below too)
        moment_underflow=per_seed(((0.0,) * 4, (0.0,) * 4), ((0.5, 0.5, 0.0, 0.0), (0.25, 0.25, 1.0, 1.0))),
        update_size=per_seed(((0.5, 0.5, 9.0, 9.0), (0.5, 0.5, 9.0, 9.0)), ((3.0, 3.0, 9.0, 9.0), (2.5, 2.5, 9.0, 9.0))),
    )


def test_naive_table_one_row_per_seed():
    table = S.naive_table(_naive(), tail=2, early=2)
    assert isinstance(table, MarkdownTable)
    assert table == (
        "| seed | final loss, FP16 minus FP32 | zero gradients (FP32 / FP16) | updates rounded away (FP32 / FP16) | "
        "Adam entries with v = 0 but m ≠ 0, first 2 steps (FP16) | mean weight change / lr, first 2 steps "
        "(FP32 / FP16) |\n"
        "|---|---|---|---|---|---|\n"
        "| 0 | +0.250 | 12.5% / 25.0% | 0.000% / 3.00% | 50% | 0.50 / 3.00 |\n"
        "| 1 | +0.500 | 12.5% / 50.0% | 0.000% / 6.25% | 25% | 0.50 / 2.50 |\n")


def test_naive_facts_summarise_the_seeds():
    facts = S.naive_facts(_naive(), tail=2, early=2)
    assert facts == {
        "naive_steps": 4, "naive_tail": 2, "naive_seeds": 2, "naive_early": 2, "naive_eps": 1e-4,
        "naive_worse": "in every one of the 2 seeds", "naive_sign_chance": 0.5,
        "naive_diff_range": "+0.250 to +0.500",
        "zero32_range": "12.5%", "zero16_range": "25.0-50.0%",
        "lost16_range": "3.00-6.25%", "lost32_range": "under 0.001%",
        "v16_range": "25-50%", "step32_range": "0.50", "step16_range": "2.50-3.00",
        # step 0 (2.9 against 3.0 in seed 0) is left out: the same weights, FP16's arithmetic alone
        "naive_lead": "FP16's loss was below FP32's at 0 of the 2 steps after the first update (steps 1 to 2) of "
                      "each seed",
        "naive_start_gap": "0.100",
        "naive_below": "and after the first update FP16's loss was never below FP32's",
    }
    assert all(isinstance(v, Prose) for k, v in facts.items() if k.endswith(("_range", "_worse", "_lead", "_gap",
                                                                               "_below")))


def test_naive_facts_other_branches():
    naive = _naive()
    # seed 1's FP16 run now ends below FP32 and is never above it; FP32 leaves 0.1% of updates unchanged
    curves = {FP32: naive.curves[FP32], FP16: (naive.curves[FP16][0], (2.5, 1.5, 1.0, 0.5))}
    unchanged = {FP32: ((0.001,) * 4, (0.0,) * 4), FP16: naive.unchanged_fraction[FP16]}
    facts = S.naive_facts(dataclasses.replace(naive, curves=curves, unchanged_fraction=unchanged), tail=2, early=2)
    assert facts["naive_worse"] == "in 1 of the 2 seeds" and facts["naive_sign_chance"] == 1.0
    assert S._sign_test(3, 3) == 0.25 and S._sign_test(9, 10) == pytest.approx(22 / 1024)
    assert facts["lost32_range"] == "0.000-0.100%"
    assert facts["naive_below"] == ("and after the first update FP16's loss was below FP32's at 0-3 of the 3 "
                                    "steps of a seed")
    assert facts["naive_lead"].startswith("FP16's loss was below FP32's at 0-2 of the 2 steps after")
    never = {FP32: naive.curves[FP32], FP16: tuple(tuple(v + 1 for v in c) for c in naive.curves[FP32])}
    facts = S.naive_facts(dataclasses.replace(naive, curves=never), tail=2, early=2)
    assert facts["naive_below"] == "and after the first update FP16's loss was never below FP32's"
    assert facts["naive_worse"] == "in every one of the 2 seeds"


def test_naive_windows_must_lie_within_the_run():
    with pytest.raises(ValueError, match="tail must be an int of steps in 1..4, got 0"):
        S.naive_facts(_naive(), tail=0, early=2)
    with pytest.raises(ValueError, match="early must be an int of steps in 1..4, got 5"):
        S.naive_table(_naive(), tail=2, early=5)


def test_value_span_prints_one_value_when_both_ends_agree():
    assert S.value_span([0.091, 0.0912], ".1f") == "9.1%"
    assert S.value_span([0.232, 0.12], ".1f") == "12.0-23.2%"
    assert S.value_span([0.36], ".2f", "", 1) == "0.36"
    with pytest.raises(ValueError, match="at least one value"):
        S.value_span([], ".1f")


def test_adam_underflow_facts():
    assert S.installed_adam_defaults() == (1e-8, 0.999)
    facts = S.adam_underflow_facts(1e-8, 0.999)
    g = facts["v_underflow_g"]
    assert facts == {"adam_default_eps": 1e-8, "eps_in_fp16": 0.0, "adam_one_minus_beta2": 0.001,
                     "v_underflow_g": g, "v_underflow_log2": math.log2(g)}
    # (1 - beta2) g**2 is half FP16's smallest subnormal at that g
    assert 0.001 * g**2 == pytest.approx(2.0**-25, rel=1e-12)
    assert S.adam_underflow_facts(1e-4, 0.999)["eps_in_fp16"] == float(np.float16(1e-4))
    with pytest.raises(ValueError, match="beta2 must lie in"):
        S.adam_underflow_facts(1e-8, 1.0)
    with pytest.raises(ValueError, match="default_eps must be positive"):
        S.adam_underflow_facts(0.0, 0.999)


# ---- overflow ------------------------------------------------------------------------------------------------

def test_softmax_matmul_and_activation_facts():
    sm = SoftmaxOverflow((1.0, 2.5), (2.7, 12.2), (0.2, 0.8), (0.2, 0.8), (0.2, 0.8), (0.2, 0.8), 0.2, 0.21,
                         11.09, 0.2014)
    facts = S.softmax_facts(sm)
    assert facts == {"fp16_max": 65504.0, "exp_limit": 11.09, "sm_logits": "1, 2.5", "sm_target": "1", "ce_fp16": 0.21,
                     "ce_fp64": 0.2014, "ce_exact_fp16": 0.201416015625,
                     "ce_rounding": "**4.3%** off. Rounding only the final result to FP16 would give **0.2014**, "
                                    "so the kernel must round intermediate values to FP16 too"}
    assert S.softmax_facts(dataclasses.replace(sm, target=1))["sm_target"] == "2.5"
    exact = dataclasses.replace(sm, torch_cross_entropy_fp16=0.201416015625)
    assert S.softmax_facts(exact)["ce_rounding"] == "the exact value rounded to FP16: only the result was rounded"
    mm = MatmulOverflow(4, 2.0, 16.0, {"FP32": 16.0, "FP16": math.inf}, 2.0, 4.0)
    assert S.matmul_table(mm) == "| computed in | result |\n|---|---|\n| FP32 | 16 |\n| FP16 | inf |\n"
    assert S.matmul_facts(mm) == {"mm_n": 4, "mm_value": 2.0, "mm_exact": 16.0, "mm_divisor": 2.0,
                                  "mm_scaled_output": 4.0, "mm_scale_back": 4.0}
    act = S.ActivationOverflow(200704.0, 5.59375, math.nan, 12, 65504.0, 4096)
    assert S.activation_overflow_facts(act) == {"act_bf16_max": 200704.0, "act_loss_bf16": 5.59375,
                                                "act_nonfinite": "12 of 4,096"}


def test_softmax_and_activation_tables_show_each_form_in_columns():
    sm = SoftmaxOverflow((1.0, 12.0), (2.718, math.inf), (0.0, math.nan), (1.7e-5, 1.0), (1.7e-5, 1.0),
                         (1.67e-5, 0.99998), math.nan, 1.67e-5, 11.09, 1.6e-5)
    assert S.softmax_table(sm).splitlines() == [
        "| computed as | x = 1 | x = 12 |", "|---|---|---|",
        "| exp(x), FP16 | 2.718 | inf |", "| naive exp(x) / sum, FP16 | 0 | nan |",
        "| exp(x - max) / sum, FP16 | 1.7e-05 | 1 |", "| F.softmax, FP16 | 1.7e-05 | 1 |",
        "| reference, FP64 | 1.67e-05 | 1 |",
        "| cross-entropy, target x = 1: naive | nan |  |",
        "| cross-entropy, target x = 1: F.cross_entropy, FP16 result | 1.67e-05 |  |",
        "| cross-entropy, target x = 1: reference: -ln p from FP64 | 1.6e-05 |  |"]
    # with its target recorded, each cross-entropy sits in the target logit's column
    assert S.softmax_table(dataclasses.replace(sm, target=1)).splitlines()[-3:] == [
        "| cross-entropy, target x = 12: naive |  | nan |",
        "| cross-entropy, target x = 12: F.cross_entropy, FP16 result |  | 1.67e-05 |",
        "| cross-entropy, target x = 12: reference: -ln p from FP64 |  | 1.6e-05 |"]
    act = S.ActivationOverflow(200704.0, 5.59375, math.nan, 12, 65504.0, 4096)
    assert S.activation_overflow_table(act).splitlines()[2:] == [
        "| largest activation | 200,704 | inf (max 65504) |", "| loss | 5.594 | nan |",
        "| non-finite output logits | (not counted) | 12 |"]
    small = S.ActivationOverflow(1000.0, 5.5, 5.5, 0, 65504.0, 4096)
    assert "| largest activation | 1,000 | (not measured) (max 65504) |" in S.activation_overflow_table(small)
    with pytest.raises(TypeError, match="SoftmaxOverflow"):
        S.softmax_table(act)
    with pytest.raises(TypeError, match="ActivationOverflow"):
        S.activation_overflow_table(sm)


# ---- errata and exercises --------------------------------------------------------------------------------------

def _errata(**changes):
    measured = dict(stored_1e7=2.0**-23, stored_1_2e7=2.0**-23, stored_65536=math.inf, overflow_from=65520.0,
                    stored_layer_norm_eps=float(np.float16(1e-5)), random_max=131.6, exp_max=8.7e13,
                    exp_fp16_overflows=160, exp_n=1000, random_width=1024, random_products=65536)
    return S.underflow_errata(**{**measured, **changes})


def test_underflow_errata_quote_the_measurements():
    assert _errata() == [
        ("1e-7 and 1.2e-7 become 0 in FP16.",
         "Both become the subnormal 1.192e-07 (FP16's subnormals are 5.96e-08 apart, so the two cannot be told "
         "apart: errors of 19% and 0.7%). FP16 flushes to zero only at or below half its smallest subnormal, "
         "2.98e-08 (half of it is a tie, which rounds to the even neighbour, zero): they lose precision, not their "
         "existence."),
        ("65536 fits in FP16 (it is close to the maximum).",
         "FP16's largest value is 65,504; 65536 rounds to inf, as does everything from 65,520 (halfway between 65,504 "
         "and 65,536, a tie that rounds up) on."),
        ("A 1024-wide matmul of unit values overflows FP16.",
         "A 1024-term sum of ones is 1,024. With random unit-variance inputs, sums grow like the square root of the "
         "width: the largest of 65,536 such dot products here is 132, far below 65,504. Overflow needs large values "
         "(the planted activation of the BF16 model above, logits before an exponential) or long sums of "
         "them, not just width."),
        ("LayerNorm's eps (1e-5) underflows in FP16.",
         "It is stored as 1.0014e-05, a subnormal, not 0; and autocast runs `layer_norm` in FP32 on CUDA "
         "({doc}`04_amp`)."),
        ("`torch.exp(torch.randn(1000) * 10)` can reach about 1e8 and overflows.",
         "That tensor is FP32: the largest of its 1,000 values here is 8.7e+13, far above 1e8 and far below FP32's "
         "largest value, 3.4e+38, so nothing overflows. Computed in FP16 (largest value 65,504), 160 of the 1,000 "
         "overflow to inf."),
    ]


def test_underflow_errata_refuse_impossible_measurements():
    with pytest.raises(ValueError, match="positive numbers"):
        _errata(stored_1e7=0.0)
    with pytest.raises(ValueError, match="overflow_from must exceed FP16's largest value"):
        _errata(overflow_from=65504.0)
    with pytest.raises(ValueError, match="exp_max must be a positive finite"):
        _errata(exp_max=math.inf)
    with pytest.raises(ValueError, match="exp_fp16_overflows <= exp_n"):
        _errata(exp_fp16_overflows=1001)
    with pytest.raises(ValueError, match="random_width and random_products must be >= 1"):
        _errata(random_products=0)


def test_exercise_facts_shift_the_late_gradients_three_binades():
    late = torch.tensor([0.0, 2.0**-26, 2.0**-24, 2.0**-22, 1.0])
    # of the 4 non-zero values 2**-26 flushes (below 2**-25); divided by 8, 2**-24 joins it, and so does
    # 2**-22, which lands on 2**-25 itself: a tie, rounded to the even neighbour, zero
    assert S.exercise_facts(late, largest_sigmas=4.0) == {
        "ex_flush_now": 25.0, "ex_flush_8x": 75.0, "ex_sigmas": 4.0, "ex_sqrt_k": (65504 / 4.0) ** 2,
        "ex_e5m2_tiny": 2.0**-16, "ex_e5m2_half_tiny": 2.0**-17, "ex_e5m2_stored": 2.0**-16,
        "ex_e5m2_err": pytest.approx(100 * (2.0**-16 / 1e-5 - 1)),   # 1e-5 lies above half of 2**-16: rounds up
        # in FP16 1e-5 is a subnormal too, 168 steps of 2**-24 (what torch's cast gives), 0.14% off
        "ex_fp16_stored": 168 * 2.0**-24, "ex_fp16_err": pytest.approx(100 * (168 * 2.0**-24 / 1e-5 - 1)),
        "ex_fp16_min_normal": 2.0**-14}
    assert float(torch.tensor(1e-5).half()) == 168 * 2.0**-24
    with pytest.raises(ValueError, match="no non-zero gradient"):
        S.exercise_facts(torch.zeros(3), largest_sigmas=4.0)
    with pytest.raises(TypeError, match="floating-point tensor"):
        S.exercise_facts(torch.tensor([1, 2]), largest_sigmas=4.0)
    with pytest.raises(ValueError, match="largest_sigmas"):
        S.exercise_facts(late, largest_sigmas=0.0)


def test_overflow_edge_facts_need_the_values_either_side_of_fp16s_overflow():
    assert S.overflow_edge_facts([65519.0, 65520.0], [65504.0, math.inf]) == {
        "of_max": 65504.0, "of_below": 65519.0, "of_below_stored": 65504.0, "of_from": 65520.0}
    with pytest.raises(ValueError, match="65520"):
        S.overflow_edge_facts([65504.0, 65536.0], [65504.0, math.inf])   # 65536 is not where overflow starts
    with pytest.raises(ValueError, match="two numbers"):
        S.overflow_edge_facts([65520.0], [math.inf])


def test_recorded_bf16_flush_phrase_names_the_step_and_the_record():
    assert S.recorded_bf16_flush_phrase([]) == ""
    record = Record("underflow_statistics", {}, {}, _provenance())
    assert S.recorded_bf16_flush_phrase([RecordedResult(record, _zero_stats())]) == (
        ", against 0.54% at step 2999 of the run recorded on NVIDIA H100 80GB HBM3 (sm 9.0), in the table above")
    with pytest.raises(TypeError, match="UnderflowStatistics"):
        S.recorded_bf16_flush_phrase([RecordedResult(record, 1.0)])
