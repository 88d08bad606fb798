import dataclasses
import math

from course_lib.overflow import matmul_overflow, softmax_overflow
from course_lib.device import SizeProfile
from course_lib.models import gpt_config_for
from course_lib.studies.underflow import activation_overflow_facts, bf16_model_in_fp16


def test_softmax_naive_overflows_and_safe_forms_match_reference():
    r = softmax_overflow((2.0, 8.0, 12.0), target=2)
    assert math.isinf(r.exp_fp16[2]) and math.isnan(r.naive_fp16[2]) and math.isnan(r.naive_cross_entropy_fp16)
    for safe in (r.max_subtracted_fp16, r.torch_softmax_fp16):
        assert all(abs(a - b) < 1e-3 for a, b in zip(safe, r.reference_fp64))
    assert abs(r.torch_cross_entropy_fp16 + math.log(r.reference_fp64[2])) < 1e-2
    # the exact value, ln(1 + e**-4 + e**-10); FP16's F.cross_entropy rounds it
    assert math.isclose(r.reference_cross_entropy_fp64, math.log(1 + math.exp(-4) + math.exp(-10)), rel_tol=1e-12)
    assert r.torch_cross_entropy_fp16 != r.reference_cross_entropy_fp64
    assert 11 < r.largest_safe_exp_input < 11.1
    assert r.target == 2 and softmax_overflow((2.0, 8.0, 12.0), target=0).target == 0


def test_matmul_overflows_only_in_fp16():
    r = matmul_overflow(4096, 4.5)
    assert r.exact == 82944.0 and math.isinf(r.results["FP16"])
    scaled = "FP16 on inputs / 16 (output 324), x 256 afterwards in FP32"   # FP16 holds 324, not 82944
    assert r.results["FP32"] == r.exact and r.results[scaled] == r.exact
    small = matmul_overflow(16, 4.5)
    assert small.results["FP16"] == small.exact


def test_planted_large_activation_breaks_fp16_not_bf16():
    r = bf16_model_in_fp16()
    assert r.largest_activation_bf16 > r.fp16_max
    assert math.isfinite(r.loss_bf16) and math.isnan(r.loss_fp16) and r.nonfinite_fp16_outputs > 0
    cfg = gpt_config_for(SizeProfile("small"))
    assert r.fp16_outputs == 4 * cfg.context * cfg.vocab_size   # every logit of the 4-sequence batch counted
    assert activation_overflow_facts(r)["act_nonfinite"] == (
        f"all {r.fp16_outputs:,}" if r.nonfinite_fp16_outputs == r.fp16_outputs
        else f"{r.nonfinite_fp16_outputs:,} of {r.fp16_outputs:,}")
    mild = bf16_model_in_fp16(channel_gain=1.0)
    assert math.isfinite(mild.loss_fp16) and mild.nonfinite_fp16_outputs == 0
    assert activation_overflow_facts(mild)["act_nonfinite"] == f"0 of {mild.fp16_outputs:,}"
    some = dataclasses.replace(r, nonfinite_fp16_outputs=7, fp16_outputs=4096)
    assert activation_overflow_facts(some)["act_nonfinite"] == "7 of 4,096"


def test_fp16_finetune_of_overflowing_model_skips_every_step():
    from course_lib.studies.bf16 import finetune_bf16_model_in_fp16

    ft = finetune_bf16_model_in_fp16(steps=3)
    assert all(ft.skipped) and all(math.isnan(v) for v in ft.losses)
    assert ft.scales == (65536.0, 32768.0, 16384.0)


def test_the_same_finetune_in_bf16_trains():
    from course_lib.studies.bf16 import finetune_bf16_model_in_fp16

    ft = finetune_bf16_model_in_fp16(steps=3, recipe="bf16_autocast")
    assert not any(ft.skipped) and all(math.isfinite(v) for v in ft.losses)
