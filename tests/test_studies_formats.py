"""Lesson 1's facts, phrases, tables and errata, each computed from hand-built results with known numbers,
and the codec-against-torch agreement run at a small size."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from course_lib.formats import FloatFormat, TF32Check, get_format, round_to_format
from course_lib.glue import Prose
from course_lib.magnitudes import LOG2_HI, LOG2_LO, LogHistogram
from course_lib.models import GPTConfig
from course_lib.experiments import get_experiment
from course_lib.results import Provenance, Record, RecordedResult
from course_lib.studies import formats as S

IEEE_E4M3 = dataclasses.replace(get_format("FP8 E4M3"), name="E4M3, IEEE-style", specials="ieee", overflow="inf")


# ---- the codecs against PyTorch ----------------------------------------------------------------------

def test_codec_agreement_with_torch_is_exact_for_fp16():
    assert S.codec_agreement_with_torch("FP16", n=20_000) == 1.0


def test_codec_agreement_with_torch_counts_the_values_a_wrong_rule_rounds_differently():
    # the same values, truncated by the codec against torch's round-to-nearest cast
    truncating = dataclasses.replace(get_format("FP16"), name="FP16, truncating", rounding="toward_zero")
    gen = torch.Generator().manual_seed(3)
    log2_mag = torch.empty(5_000).uniform_(np.log2(2.0**-24) - 2, np.log2(65504.0) + 1, generator=gen)
    x = torch.where(torch.rand(5_000, generator=gen) < 0.5, -1.0, 1.0) * torch.exp2(log2_mag)
    expected = float((round_to_format(x, "FP16", rounding="toward_zero") == round_to_format(x, "FP16"))
                     .double().mean())
    assert expected < 0.9   # the two rules really do differ on many of these values
    assert S.codec_agreement_with_torch(truncating, n=5_000, seed=3) == expected


def test_codec_agreement_with_torch_refuses_a_format_torch_lacks_and_a_bad_n():
    with pytest.raises(ValueError, match="FP6 E2M3 has no torch dtype"):
        S.codec_agreement_with_torch("FP6 E2M3", n=10)
    with pytest.raises(ValueError, match="n must be a positive int"):
        S.codec_agreement_with_torch("FP16", n=0)


def test_agreement_facts_take_the_smallest_share_in_percent():
    assert S.agreement_facts({"BF16": 1.0, "FP16": 0.5, "FP8 E4M3": 0.75}) == {"agree_min": 50.0}
    with pytest.raises(ValueError, match="no format"):
        S.agreement_facts({})


# ---- the formats' properties -------------------------------------------------------------------------

def test_format_facts_are_the_registry_properties_from_the_bits():
    facts = S.format_facts()
    bf16_max = (2 - 2.0**-7) * 2.0**127
    assert facts == {
        "fp16_max": 65504.0, "fp16_min_normal": 2.0**-14, "fp16_min_subnormal": 2.0**-24, "fp16_eps": 2.0**-10,
        "bf16_max": bf16_max, "bf16_eps": 2.0**-7, "fp32_max": (2 - 2.0**-23) * 2.0**127,
        "e4m3_max": 448.0, "e5m2_max": 57344.0,
        "fp16_binades": math.log2(65504.0 / 2.0**-24), "bf16_binades": math.log2(bf16_max / 2.0**-133),
        "fp16_digits": 11 * math.log10(2.0), "bf16_digits": 8 * math.log10(2.0),
        "fp16_finite": 2**16 - 2 * 2**10, "bf16_finite": 2**16 - 2 * 2**7,
        "fp16_mantissa_bits": 10, "bf16_mantissa_bits": 7, "tf32_mantissa_bits": 10, "tf32_bits": 19,
        "fp16_max_bits": "`0 11110 1111111111`", "fp16_max_exponent": 15,
    }
    assert isinstance(facts["fp16_max_bits"], Prose)
    # the prose formats these with {glue:text}: a float stays a float, a count an int
    assert type(facts["fp16_max"]) is float and type(facts["fp16_finite"]) is int


# ---- TF32 records ------------------------------------------------------------------------------------------

def _provenance():
    return Provenance("NVIDIA H100 80GB HBM3", "cuda", "2.11", "2026-01-01T00:00:00+00:00", "cmd", "abcdef", "3.12",
                      compute_capability="9.0", cuda_version="13.0")


@pytest.mark.parametrize("agreement, verdict", [
    ({"nearest_even": 1.0, "nearest_away": 0.99, "toward_zero": 0.5},
     "Every element matches **round to nearest, ties to even**, the rule the course's TF32 codec uses; on this "
     "GPU the tensor cores do not truncate FP32 inputs."),
    ({"nearest_even": 0.99, "nearest_away": 1.0, "toward_zero": 0.5},
     "Every element matches **round to nearest, ties away**; on this GPU the tensor cores do not truncate FP32 "
     "inputs."),
    ({"nearest_even": 0.5, "nearest_away": 0.5, "toward_zero": 1.0},
     "Every element matches **truncation (toward zero)**; on this GPU the tensor cores truncate FP32 inputs."),
    ({"nearest_even": 0.9, "nearest_away": 0.8, "toward_zero": 0.95},
     "No rule matches every element; the closest is truncation (toward zero)."),
])
def test_tf32_verdict_names_the_matching_rule_or_the_closest(agreement, verdict):
    assert S.tf32_verdict(TF32Check(64, "cuda", agreement)) == verdict


def test_tf32_verdict_refuses_an_unknown_rule():
    with pytest.raises(ValueError, match="rounding rules"):
        S.tf32_verdict(TF32Check(64, "cuda", {"stochastic": 1.0}))


def _recorded(experiment: str, parameters: dict, values: dict) -> RecordedResult:
    """A version-1 record (values as the H100 records hold them), read back through the registry."""
    rec = Record(experiment, parameters, values, _provenance(), schema_version=1)
    return RecordedResult(rec, get_experiment(experiment).load(rec))


def test_tf32_record_text_tabulates_the_first_record():
    values = {"check": {"n": 8, "device": "cuda",
                        "agreement": {"nearest_even": 1.0, "nearest_away": 0.75, "toward_zero": 0.5}}}
    text = S.tf32_record_text([_recorded("tf32_matmul_rounding", {"n": 8}, values)])
    assert text == (
        "Recorded on **NVIDIA H100 80GB HBM3 (sm 9.0)** with a 8 x 8 matrix (standard normal values, each scaled "
        "by $2^k$ with $k$ from -20 to 19): the share of "
        "elements of `A @ I` (TF32 on) equal to A rounded by each rule.\n\n"
        "| rule | elements equal |\n|---|---|\n| round to nearest, ties to even | 100.0000% |\n"
        "| round to nearest, ties away | 75.0000% |\n| truncation (toward zero) | 50.0000% |\n\n"
        "Every element matches **round to nearest, ties to even**, the rule the course's TF32 codec uses; on this "
        "GPU the tensor cores do not truncate FP32 inputs.\n\n"
        "- **NVIDIA H100 80GB HBM3 (sm 9.0)**: torch 2.11, CUDA 13.0, 2026-01-01T00:00:00+00:00, commit `abcdef`, "
        "command `cmd`")


def test_tf32_record_text_without_a_record_gives_the_command_and_refuses_a_foreign_record():
    assert S.tf32_record_text([]) == ("No GPU has recorded this check yet: on a GPU, "
                                      "`python -m course_lib.record tf32_matmul_rounding` runs it.")
    foreign = RecordedResult(Record("model_magnitudes", {}, {}, _provenance()), _magnitudes())
    with pytest.raises(TypeError, match="expected a recorded TF32Check, got TrainingMagnitudes"):
        S.tf32_record_text([foreign])


# ---- where a real model's numbers live -----------------------------------------------------------------

def _hist(counts_by_binade: dict[int, int], *, zeros: int = 0, min_nonzero: float, max_abs: float) -> LogHistogram:
    counts = [0] * (LOG2_HI - LOG2_LO)
    for binade, count in counts_by_binade.items():
        counts[binade - LOG2_LO] = count
    return LogHistogram(tuple(counts), zeros, 0, min_nonzero, max_abs)


def _magnitudes(**histograms) -> S.TrainingMagnitudes:
    return S.TrainingMagnitudes(histograms=histograms, steps=7, config=GPTConfig(), batch_size=2, final_loss=3.25,
                                device="cpu")


def _four_kinds() -> dict[str, LogHistogram]:
    return {
        # FP16: below 2**-25 flushes, below 2**-24 is below the smallest subnormal, below 2**-14 is subnormal
        "activation gradients": _hist({-26: 1, -25: 1, -20: 2, -10: 4}, min_nonzero=2.0**-26, max_abs=1.5 * 2.0**-10),
        "weight gradients": _hist({-30: 1, -20: 1, -5: 2}, min_nonzero=2.0**-30, max_abs=2.0**-5),
        "Adam second moment": _hist({-40: 3, -10: 1}, min_nonzero=2.0**-40, max_abs=1.5 * 2.0**-10),
        "activations": _hist({2: 1}, min_nonzero=6.5, max_abs=6.5),
    }


def test_magnitude_facts_place_each_kind_against_fp16():
    facts = S.magnitude_facts(_magnitudes(**_four_kinds()))
    assert facts == {
        "mag_steps": 7, "mag_loss": 3.25,
        "v_below_fp16": 75.0,            # 3 of 4 second moments below 2**-24
        "agrad_below_fp16": 25.0,        # 2 of 8
        "agrad_flushed_fp16": 12.5,      # 1 of 8 below 2**-25
        "agrad_sub_fp16": 25.0,          # 2 of 8 between 2**-24 and 2**-14
        "wgrad_sub_fp16": 50.0,          # 2 of 4 below 2**-14
        "act_max": 6.5,
        "v_median": 2.0 ** (-40 + 2 / 3),   # the 2nd of 4, two thirds into the binade of 3
        "agrad_median": 2.0**-19,           # the 4th of 8, at the top of the binade of 2**-20
        "agrad_zero": 0.0, "v_zero": 0.0,
    }
    kinds = _four_kinds()
    kinds["Adam second moment"] = _hist({-40: 3, -10: 1}, zeros=4, min_nonzero=2.0**-40, max_abs=1.5 * 2.0**-10)
    facts = S.magnitude_facts(_magnitudes(**kinds))
    # zeros are counted apart, as in lesson 2: 3 of 8 are non-zero and below, 4 of 8 are zero
    assert facts["v_zero"] == 50.0 and facts["v_below_fp16"] == 37.5
    kinds["activation gradients"] = _hist({-30: 1, -20: 3}, zeros=4, min_nonzero=2.0**-30, max_abs=1.5 * 2.0**-20)
    kinds["weight gradients"] = _hist({-20: 1, 0: 1}, zeros=2, min_nonzero=2.0**-20, max_abs=1.5)
    facts = S.magnitude_facts(_magnitudes(**kinds))
    assert (facts["agrad_zero"], facts["agrad_below_fp16"], facts["agrad_flushed_fp16"],
            facts["agrad_sub_fp16"], facts["wgrad_sub_fp16"]) == (50.0, 12.5, 12.5, 37.5, 25.0)


def test_recorded_magnitude_note_splits_the_gap_between_the_medians():
    live = _magnitudes(**_four_kinds())                                  # 2 x 64 tokens, median 2**-19
    kinds = _four_kinds()
    # the live binades shifted down by 11: the median is 2**-30, a factor 2**11 below; two exact zeros added
    kinds["activation gradients"] = _hist({-37: 1, -36: 1, -31: 2, -21: 4}, zeros=2, min_nonzero=2.0**-37,
                                          max_abs=1.5 * 2.0**-21)
    rec = S.TrainingMagnitudes(histograms=kinds, steps=600, config=GPTConfig(context=128), batch_size=16,
                               final_loss=1.5, device="cuda:0")                # 16 x 128 tokens: a factor 16
    note = S.recorded_magnitude_note(live, ("H100", rec))
    assert note.startswith("The GPU rows of the figure (H100, after 600 steps at full size) sit further down: the "
                           "median of the non-zero activation gradients is 9.3e-10 (as this page's, log-interpolated within a "
                           "histogram's bins of one power of two, so two digits); 40.0% of the activation gradients "
                           "are non-zero "
                           "values below FP16's smallest subnormal (40.0% below half of it, so that they round to "
                           "zero in FP16), and another 20.0% are exactly zero already.")
    assert ("2,048 tokens per batch there against 128 here, a factor of 16, while the medians (1.9e-06 here) differ "
            "by a factor of 2,000; the other differences between the runs (the model's size, the steps trained) presumably "
            "account for the rest, which this page does not measure.") in note
    same = S.TrainingMagnitudes(histograms=_four_kinds(), steps=600, config=GPTConfig(context=128), batch_size=16,
                                final_loss=1.5, device="cuda:0")
    assert S.recorded_magnitude_note(live, ("H100", same)).endswith(
        "a factor of 16, while the medians (1.9e-06 here) differ by a factor of 1: less than the token count alone predicts; the "
        "other differences between the runs pull the other way.")
    kinds["activation gradients"] = _hist({-30: 1, -29: 1, -24: 2, -14: 4}, min_nonzero=2.0**-30,
                                          max_abs=1.5 * 2.0**-14)                  # shifted by 4: a factor 16
    four = dataclasses.replace(rec, histograms=kinds)
    assert S.recorded_magnitude_note(live, ("H100", four)).endswith(
        "a factor of 16: the token count accounts for about all of it.")
    assert S.recorded_magnitude_note(live, None) == ""
    assert f"(H100, after {rec.steps} steps of an earlier full profile) sit" in S.recorded_magnitude_note(
        live, ("H100", rec), size="of an earlier full profile")
    assert f"(H100, after {rec.steps} steps at full size) sit" in S.recorded_magnitude_note(live, ("H100", rec))
    with pytest.raises(TypeError, match="TrainingMagnitudes"):
        S.recorded_magnitude_note(live, ("H100", {"histograms": {}}))


def test_magnitude_facts_name_the_missing_kinds():
    kinds = _four_kinds()
    del kinds["weight gradients"]
    with pytest.raises(ValueError, match="weight gradients"):
        S.magnitude_facts(_magnitudes(**kinds))


def test_recorded_magnitudes_beside_a_live_cpu_run_only():
    values = {"magnitudes": {
        "histograms": {"weights": {"counts": [0, 2], "zeros": 1, "nonfinite": 0, "min_nonzero": 0.5, "max_abs": 0.75}},
        "steps": 600, "config": dataclasses.asdict(GPTConfig(d_model=128)), "batch_size": 16, "final_loss": 1.5,
        "device": "cuda:0"}}
    records = [_recorded("model_magnitudes", {}, values)]
    label, recorded = S.recorded_magnitudes_beside(records, "cpu")
    assert label == "NVIDIA H100 80GB HBM3 (sm 9.0)"
    assert (recorded.steps, recorded.config.d_model, recorded.final_loss) == (600, 128, 1.5)
    assert recorded.histograms["weights"].counts == (0, 2)
    assert S.recorded_magnitudes_beside(records, "cuda") is None
    assert S.recorded_magnitudes_beside([], "cpu") is None


# ---- precision -------------------------------------------------------------------------------------------

def test_lost_update_facts_sort_the_updates_against_half_the_bf16_gap():
    big = torch.tensor(256.0, dtype=torch.bfloat16)
    sums = {u: (big + u).item() for u in (1.1, 0.9, 1.0)}
    facts = S.lost_update_facts(256.0, sums, 1.0)
    assert facts["bf16_gap"] == 2.0 and facts["bf16_half_eps"] == 2.0**-8
    assert (facts["bf16_update_below"], facts["bf16_sum_below"]) == (0.9, 256.0)
    assert (facts["bf16_update_tie"], facts["bf16_sum_tie"]) == (1.0, 256.0)     # the tie goes to the even 256
    assert (facts["bf16_update_above"], facts["bf16_sum_above"]) == (1.1, 258.0)
    with pytest.raises(ValueError, match="one update below, one at and one above half the BF16 gap at 256"):
        S.lost_update_facts(256.0, {0.5: 256.0, 0.9: 256.0, 1.1: 258.0}, 1.0)
    with pytest.raises(TypeError, match="one_plus_half_eps must be a number, got Tensor"):
        S.lost_update_facts(256.0, sums, torch.tensor(1.0))


# ---- errata and exercises ------------------------------------------------------------------------------

def test_formats_errata_quote_the_registry_and_the_measurements():
    rows = S.formats_errata(IEEE_E4M3, 2.0**-14, 2.0**-24)
    assert rows == [
        ("FP16 covers roughly 1e-8 to 1e4.",
         "Wrong at both ends. The top is 65,504, above 1e4; at the bottom, the smallest subnormal is 5.960e-08, "
         "above 1e-8, and torch casts 1e-8 to FP16 as 0. Below the smallest normal, 6.104e-05, values keep fewer "
         "significant bits the smaller they get."),
        ("BF16 has the same range as FP32.",
         "Same smallest normal (1.175e-38) and nearly the same largest value (3.3895e+38 against 3.4028e+38), but "
         "its subnormals stop at 9.18e-41, not 1.40e-45."),
        ("The largest FP8 E4M3 value is 240.",
         "That is the IEEE-style E4M3 (240). The E4M3 format used for training (OCP, NVIDIA, torch.float8_e4m3fn) "
         "gives up infinity and reaches 448."),
        ("torch.finfo(torch.float16).tiny is the smallest positive FP16 number.",
         "It is the smallest *normal* number, 6.104e-05; the smallest positive FP16 number is the subnormal "
         "5.960e-08, 1024 times smaller. torch.finfo has no attribute for it."),
    ]


def test_formats_errata_refuse_bad_measurements():
    with pytest.raises(TypeError, match="ieee_e4m3 must be a FloatFormat"):
        S.formats_errata("FP8 E4M3", 2.0**-14, 2.0**-24)
    with pytest.raises(ValueError, match="positive"):
        S.formats_errata(IEEE_E4M3, 2.0**-14, 0.0)


def test_overflow_rule_phrase_says_nan_or_saturation():
    assert S.overflow_rule_phrase(math.nan) == "NaN"
    assert S.overflow_rule_phrase(448.0) == "saturate to 448"
    assert isinstance(S.overflow_rule_phrase(448.0), Prose)
    with pytest.raises(TypeError, match="must be a number"):
        S.overflow_rule_phrase("448")


def test_exercise_facts_are_the_answers_from_the_bits():
    e3m4 = FloatFormat("E3M4, IEEE-style", exponent_bits=3, mantissa_bits=4)
    facts = S.exercise_facts(IEEE_E4M3, 448.0, checked=e3m4)
    # E3M4: bias 3, smallest normal 2**-2, four mantissa bits below it: smallest subnormal 2**-6
    assert facts == {"fp16_count_1_2": 2**10, "e5m2_top_exp": 15, "e5m2_mantissa": 1.75, "checked_bias": 3,
                     "checked_min_exp": -2, "checked_m": 4, "checked_min_sub": 2.0**-6, "e4m3_ieee_max": 240.0,
                     "torch_e4m3_overflow": "saturate to 448"}
    assert S.exercise_facts(IEEE_E4M3, math.nan, checked=e3m4)["torch_e4m3_overflow"] == "NaN"
    with pytest.raises(TypeError, match="ieee_e4m3 must be a FloatFormat"):
        S.exercise_facts(None, 448.0, checked=e3m4)
    with pytest.raises(TypeError, match="checked must be a FloatFormat"):
        S.exercise_facts(IEEE_E4M3, 448.0, checked="E3M4")
