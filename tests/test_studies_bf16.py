"""Lesson 5's facts, phrases, tables and errata rows (studies.bf16_prose), each computed from a result built by
hand with known numbers."""

import dataclasses
import math

import pytest
import torch

from course_lib.bf16 import Advice, precision_advice
from course_lib.glue import Prose
from course_lib.hardware import DATASHEET_PEAKS, GPUPeaks
from course_lib.studies.loss_scaling_prose import forward_nan_where
from course_lib.studies import bf16_prose as P
from course_lib.studies.bf16 import FP16FineTune, Parity, UpdateComparison
from course_lib.tables import MarkdownTable

NAN = float("nan")
NEAREST, MASTER = "BF16, round to nearest (no master)", "BF16 + FP32 master weights"
STOCHASTIC, KAHAN = "BF16, stochastic rounding", "BF16, Kahan-compensated"


def test_format_facts_read_the_format_tables():
    facts = P.format_facts()
    # BF16 keeps 7 mantissa bits, FP16 10: epsilons 2^-7 and 2^-10
    # FP16's largest finite value: (2 - 2^-10) * 2^15
    assert facts == {"eps_ratio": 8.0, "extra_bits": 3, "half_ulp_lo": 512, "half_ulp_hi": 256, "bf16_mantissa": 7,
                     "fmt_fp16_max": 65504.0, "fmt_fp16_inf": 65520.0}
    # torch's own cast: just below the boundary rounds down to max, the boundary itself goes to inf
    below = torch.nextafter(torch.tensor(65520.0), torch.tensor(0.0))
    assert below.to(torch.float16).item() == 65504.0
    assert torch.tensor(65520.0).to(torch.float16).isinf().item()
    assert isinstance(facts["eps_ratio"], float) and all(
        isinstance(facts[k], int) for k in ("extra_bits", "half_ulp_lo", "half_ulp_hi", "bf16_mantissa"))


def test_exercise_facts_are_bf16_spacings_and_fp16s_maximum():
    assert P.exercise_facts() == {"ex_spacing_1": 2.0 ** -7, "ex_spacing_below_1": 2.0 ** -8,
                                  "ex_lr_needed": 2.0 ** -8, "ex_lr_down": 2.0 ** -9, "ex_spacing_256": 2.0,
                                  "ex_fp16_max": 65504.0}


def _parity():
    return Parity(("fp32", "bf16_autocast"), (0, 1), {"fp32": (1.0, 3.0), "bf16_autocast": (1.5, 2.7)}, {})


def test_parity_table_shows_mean_spread_and_every_seed():
    table = P.parity_table(_parity())
    assert isinstance(table, MarkdownTable)
    assert table.splitlines() == [
        "| recipe | final loss (mean of the last 5 steps), mean over seeds | std. dev. over seeds | per seed |",
        "|---|---|---|---|",
        "| `fp32` | 2.0000 | 1.4142 | 1.0000, 3.0000 |",          # std. dev. sqrt(2)
        "| `bf16_autocast` | 2.1000 | 0.8485 | 1.5000, 2.7000 |"]  # sqrt(0.72)


def test_parity_facts_compare_means_spreads_and_seeds():
    facts = P.parity_facts(_parity())
    assert set(facts) == {"parity_fp32", "parity_bf16_autocast", "parity_seeds", "parity_max_gap",
                          "parity_max_spread", "parity_max_paired", "parity_steps", "parity_tail", "parity_verdict"}
    assert (facts["parity_steps"], facts["parity_tail"]) == (0, 5)     # no curves kept: the tail it was given
    three = dataclasses.replace(_parity(), curves={"fp32": (3.0, 2.0, 1.0)}, tail=4)
    assert (P.parity_facts(three)["parity_steps"], P.parity_facts(three)["parity_tail"]) == (3, 3)   # every step
    assert facts["parity_fp32"] == 2.0 and facts["parity_bf16_autocast"] == pytest.approx(2.1)
    assert facts["parity_seeds"] == 2
    assert facts["parity_max_gap"] == pytest.approx(0.1)
    assert facts["parity_max_spread"] == pytest.approx(math.sqrt(2))
    assert facts["parity_max_paired"] == pytest.approx(0.5)       # seed 0: 1.5 against 1.0
    with pytest.raises(ValueError, match="'fp32' recipe"):
        P.parity_facts(Parity(("bf16_autocast",), (0,), {"bf16_autocast": (1.0,)}, {}))


def test_paired_verdict_reads_the_signs_seed_by_seed_not_the_spread():
    def parity(**finals):
        return Parity(tuple(finals), (0, 1, 2), finals, {})
    mixed = parity(fp32=(2.0, 3.0, 4.0), bf16_autocast=(2.1, 2.9, 4.0))
    assert P.paired_verdict(mixed) == ("and no recipe kept one side of FP32 over the three seeds: at this length the "
                                       "recipes have not come apart")
    # FP16 without a scaler is said to keep up only where it ran
    with_fp16 = parity(fp32=(2.0, 3.0, 4.0), fp16_autocast_no_scaler=(2.1, 2.9, 4.0))
    assert P.paired_verdict(with_fp16).endswith("have not come apart. On a run this short even FP16 without a "
                                                "scaler can keep up")
    # above FP32 in every seed by far less than the spread over seeds: still a sign, and said as a hint
    sided = parity(fp32=(2.0, 3.0, 4.0), bf16_autocast=(2.001, 3.002, 4.003), fp16_autocast_scaler=(1.9, 2.9, 3.95))
    assert P.paired_verdict(sided) == (
        "and `bf16_autocast` ended above FP32's in every seed (+0.001 to +0.003) and `fp16_autocast_scaler` ended "
        "below FP32's in every seed (-0.1 to -0.05): three seeds land on one side by chance alone one time in 4, so "
        "each is a hint to test with more seeds, not yet a difference")
    assert P.paired_verdict(parity(fp32=(2.0, 3.0, 4.0), bf16_autocast=(2.001, 3.002, 4.003))).endswith(
        "one time in 4, so it is a hint to test with more seeds, not yet a difference")
    # a difference four decimals would print as +0.0000 keeps its digits
    tiny = parity(fp32=(2.0, 3.0, 4.0), bf16_autocast=(2.000003, 3.0009, 4.00002))
    assert "(+3e-06 to +0.0009)" in P.paired_verdict(tiny)
    # a NaN seed or a single seed says nothing about a sign
    assert "no recipe kept" in P.paired_verdict(parity(fp32=(2.0, 3.0, 4.0), bf16_autocast=(2.1, NAN, 4.1)))
    assert "no recipe kept" in P.paired_verdict(Parity(("fp32", "x"), (0,), {"fp32": (1.0,), "x": (2.0,)}, {}))
    with pytest.raises(ValueError, match="'fp32' recipe"):
        P.paired_verdict(parity(bf16_autocast=(1.0, 2.0, 3.0)))


def _recorded_parity(no_scaler=(3.1, 3.2, 3.3), scaler=(NAN, 2.9, NAN)):
    return Parity(("fp32", "fp16_autocast_scaler", "fp16_autocast_no_scaler"), (0, 1, 2),
                  {"fp32": (2.5, 2.6, 2.7), "fp16_autocast_scaler": scaler, "fp16_autocast_no_scaler": no_scaler}, {})


def test_recorded_parity_note_has_table_and_both_notes():
    assert P.recorded_parity_note(_recorded_parity(), "H100", "an earlier full profile").startswith(
        "On **H100** (an earlier full profile):\n\n|")
    note = P.recorded_parity_note(_recorded_parity(), "H100 (sm 9.0)")
    assert isinstance(note, Prose)
    assert note == (
        "On **H100 (sm 9.0)**:\n\n"
        "| recipe | seeds that ended finite | final loss, mean of those | range over those seeds (max - min) |\n"
        "|---|---|---|---|\n"
        "| `fp32` | 3 of 3 | 2.6000 | 0.2000 |\n| `fp16_autocast_scaler` | 1 of 3 | 2.9000 | - |\n"
        "| `fp16_autocast_no_scaler` | 3 of 3 | 3.2000 | 0.2000 |\n\n"
        "At full size, FP16 without a scaler ended finite but behind: every seed's final loss (3.100 to 3.300) is "
        "above every FP32 seed's (2.500 to 2.700). Unlike the short run above, the two recipes' ranges over "
        "seeds do not even overlap; lesson 2 ({doc}`02_underflow_overflow`) measured the gradients that FP16 flushes to zero without a scale. "
        "Finishing finite is not finishing well.\n\n"
        "At full size, `fp16_autocast_scaler` ended with a NaN loss in 2 of 3 seeds. The loss itself became NaN, "
        "so the forward pass produced non-finite values in FP16; a loss scale acts on the backward pass only and "
        "cannot repair that ({doc}`03_loss_scaling` shows the recorded scale collapsing after it). BF16 has the "
        "range to avoid it. That `fp16_autocast_no_scaler` ended finite in every seed does not make the scaler the "
        "cause: the scaler multiplies the loss after the forward pass, and cannot itself make a forward pass overflow. The "
        "two runs had different weights by then: with the gradients FP16 flushes to zero, the unscaled run trains "
        "more slowly, and its activations need not have grown to the values that overflowed. "
        + forward_nan_where(on_lesson_5=True) + "\n\n"
        "The only `fp16_autocast_scaler` seed that ended finite (seed 1 at 2.900, +0.300 from FP32 with the same "
        "seed) ended above every FP32 seed (2.500 to 2.700). One seed has no spread, so this says that run ended "
        "behind, not by how much the recipe does.")


def test_survivors_behind_note_only_where_every_finite_seed_is_above_fp32():
    two = _recorded_parity(scaler=(2.8, 2.75, NAN))
    assert P.survivors_behind_note(two) == (
        "The 2 `fp16_autocast_scaler` seeds that ended finite (seed 0 at 2.800, +0.300 from FP32 with the same seed "
        "and seed 1 at 2.750, +0.150 from FP32 with the same seed) ended above every FP32 seed (2.500 to 2.700).")
    assert P.survivors_behind_note(_recorded_parity(scaler=(NAN, 2.65, NAN))) == ""      # inside FP32's range
    assert P.survivors_behind_note(_recorded_parity(scaler=(2.8, 2.9, 3.0))) == ""       # no seed failed
    assert P.survivors_behind_note(_recorded_parity(scaler=(NAN, NAN, NAN))) == ""       # no survivor
    assert P.survivors_behind_note(_parity()) == ""                                      # no such recipe


def _with_bf16(bf16):
    p = _recorded_parity()
    return Parity(p.recipes + ("bf16_autocast",), p.seeds, {**p.final_losses, "bf16_autocast": bf16}, {})


def test_bf16_paired_note_reads_the_mean_gap_seed_by_seed():
    # FP32 2.5, 2.6, 2.7: differences +0.2, -0.1, +0.05, a mean 0.05 above FP32 from seeds that disagree
    mixed = _with_bf16((2.7, 2.5, 2.75))
    assert P.bf16_paired_note(mixed) == (
        "`bf16_autocast`'s mean final loss is 0.050 above FP32's. Seed by seed (the same weights and batches for "
        "both recipes) the differences are +0.200, -0.100 and +0.050: the mean's gap comes from seeds that "
        "disagree in sign, so `bf16_autocast` is not consistently behind FP32.")
    assert P.bf16_paired_note(mixed) in P.recorded_parity_note(mixed, "X")
    below = P.bf16_paired_note(_with_bf16((2.4, 2.7, 2.6)))
    assert "0.000 below" not in below and "ahead of FP32" in below
    one_side = P.bf16_paired_note(_with_bf16((2.6, 2.7, 2.8)))
    assert one_side.endswith("every seed on the same side (three seeds land on one side by chance alone one time "
                             "in 4): a hint to test with more seeds, not yet a difference.")
    assert P.bf16_paired_note(_with_bf16((NAN, 2.7, 2.8))) == ""       # the NaN notes speak to that
    assert P.bf16_paired_note(_recorded_parity()) == ""                 # no BF16 run recorded


def test_recorded_parity_notes_are_left_out_when_they_do_not_apply():
    overlapping = _recorded_parity(no_scaler=(2.6, 2.8, 3.0), scaler=(2.5, 2.6, 2.7))
    assert P.fp16_behind_note(overlapping) == "" and P.nan_seeds_note(overlapping) == ""
    assert P.recorded_parity_note(overlapping, "X").endswith("| `fp16_autocast_no_scaler` | 3 of 3 | 2.8000 | 0.4000 |")
    all_nan = _recorded_parity(no_scaler=(NAN, NAN, math.inf), scaler=(2.5, 2.6, 2.7))
    assert P.fp16_behind_note(all_nan) == ""
    assert P.recorded_parity_table(all_nan).splitlines()[-1] == "| `fp16_autocast_no_scaler` | 0 of 3 | - | - |"
    assert P.nan_seeds_note(all_nan).startswith("At full size, `fp16_autocast_no_scaler` ended with a NaN loss in 3 "
                                                "of 3 seeds.")


def _updates(evals=None):
    curves = {"FP32": ((4.0, 3.0, 2.0), (4.0, 3.5, 2.5)), MASTER: ((4.0, 3.0, 2.5), (4.0, 3.5, 2.0)),
              NEAREST: ((4.0, 3.5, 3.0), (4.0, 3.5, 3.0)), STOCHASTIC: ((4.0, 3.0, 2.0), (4.0, 3.0, 2.0)),
              KAHAN: ((4.0, 3.0, 2.0), (4.0, 3.0, 2.0))}
    lost = {NEAREST: ((0.1, 0.4, 0.6), (0.2, 0.3, 0.5)), STOCHASTIC: ((0.0,) * 3,) * 2, KAHAN: ((0.0,) * 3,) * 2}
    evals = evals or {"FP32": (3.0, 3.0), MASTER: (3.001, 2.999), NEAREST: (3.05, 3.06),
                      STOCHASTIC: (3.002, 3.0), KAHAN: (2.999, 3.001)}
    return UpdateComparison(3e-4, (0, 1), 3, curves, lost, evals)


def test_update_gap_table_lists_each_rule_against_fp32():
    assert P.update_gap_table(_updates()).splitlines() == [
        "| weights and update | evaluation loss minus FP32's, per seed | range |", "|---|---|---|",
        f"| {MASTER} | +0.00100, -0.00100 | -0.00100 to +0.00100 |",
        f"| {NEAREST} | +0.05000, +0.06000 | +0.05000 to +0.06000 |",
        f"| {STOCHASTIC} | +0.00200, +0.00000 | +0.00000 to +0.00200 |",
        f"| {KAHAN} | -0.00100, +0.00100 | -0.00100 to +0.00100 |"]


def test_update_facts_from_a_hand_built_comparison():
    facts = P.update_facts(_updates(), tail=2)
    assert facts == {
        "eval_batches": 4, "upd_lr": 3e-4, "upd_steps": 3, "upd_tail": 2, "upd_seeds": 2,
        # last two steps: FP32 (2.5, 3.0), master (2.75, 2.75)
        "train_gap_master": "-0.2500 to +0.2500", "loss_level": 2.75,
        "bf16_spacing_at_loss": "1/64",                 # BF16 spacing in [2, 4): 2^(1-7)
        "lost_nearest": "40.0-50.0%",                   # (0.4 + 0.6) / 2 and (0.3 + 0.5) / 2
        "gap_nearest": "+0.050 to +0.060", "gap_others": "-0.00100 and +0.00200",
        "upd_lead": "Only plain round-to-nearest separates from FP32.",
        "upd_separates": "every seed of it lies above every seed of every other rule",
        "upd_others_note": "FP32 master weights within 0.00100; stochastic rounding within 0.00200; "
                           "Kahan-compensated within 0.00100 in every seed: small against round-to-nearest's "
                           "gap of at least 0.05000, and their ranges over seeds overlap",
        "upd_kahan_master": P.kahan_master_note({MASTER: [0.001, -0.001], KAHAN: [-0.001, 0.001]})}
    assert facts["upd_kahan_master"].startswith("Kahan compensation and FP32 master weights ended within 2.0e-03 of "
                                                "each other in every seed")
    assert all(isinstance(facts[k], Prose) for k in ("train_gap_master", "lost_nearest", "upd_lead", "gap_others"))
    with pytest.raises(ValueError, match="tail must be a positive int"):
        P.update_facts(_updates(), tail=0)


def test_update_phrases_take_their_other_branches():
    apart = {NEAREST: [0.05, 0.06], MASTER: [-0.001, 0.001], KAHAN: [0.001, 0.002]}   # Kahan above FP32 in both
    assert P.update_lead(apart) == "Round-to-nearest separates from FP32 most clearly."
    overlapping = {NEAREST: [0.001, 0.06], MASTER: [-0.001, 0.002]}
    assert P.separation_phrase(overlapping) == "its seeds overlap those of the others"
    assert P.update_lead(overlapping) == "Round-to-nearest separates from FP32 most clearly."
    disjoint = {NEAREST: [0.05, 0.06], MASTER: [-0.003, -0.002], KAHAN: [0.001, 0.002]}
    assert P.others_note(disjoint) == ("FP32 master weights within 0.00300; Kahan-compensated within 0.00200 in "
                                       "every seed: small against round-to-nearest's gap of at least 0.05000")
    # the smallest gap is not rounded up past itself: 0.0446 is not "at least 0.045"
    assert "gap of at least 0.04460," in P.others_note({NEAREST: [0.0446, 0.06], MASTER: [0.001]})
    # with the table's five decimals: +0.00153 is not "within 0.0015"
    assert "stochastic rounding within 0.00153 " in P.others_note({NEAREST: [0.05], STOCHASTIC: [-0.0013, 0.00153]})
    assert P.kahan_master_note({NEAREST: [0.05], MASTER: [0.001]}) == ""
    near = P.kahan_master_note({MASTER: [-0.0006, -0.0002], KAHAN: [-0.00061, -0.00021]})
    assert near.startswith("Kahan compensation and FP32 master weights ended within 1.0e-05 of each other in every "
                           "seed, closer than either is to FP32: both keep")
    # the distance between printed entries: -0.00026 and -0.00023 are 3.0e-05 apart, although the unrounded
    # gaps (-0.000256, -0.000234) are 2.2e-05 apart
    printed = P.kahan_master_note({MASTER: [-0.000256, -0.0001], KAHAN: [-0.000234, -0.0001]})
    assert "within 3.0e-05 of each other" in printed
    # the hand-built comparison's gap (0.002) is not smaller than their distance from FP32 (0.001): not said
    assert "closer than" not in P.kahan_master_note({MASTER: [0.001, -0.001], KAHAN: [-0.001, 0.001]})


def test_update_facts_refuse_a_comparison_without_fp32():
    updates = _updates()
    no_fp32 = UpdateComparison(updates.lr, updates.seeds, updates.steps,
                               {k: v for k, v in updates.curves.items() if k != "FP32"}, updates.lost_fraction,
                               {k: v for k, v in updates.eval_losses.items() if k != "FP32"})
    with pytest.raises(ValueError, match="no 'FP32' run"):
        P.update_facts(no_fp32)


FT = FP16FineTune((NAN, NAN), (65536.0, 32768.0), (True, True))
FIXED = FP16FineTune((5.6, 5.55), (1.0, 1.0), (False, False))


def test_finetune_tables_and_facts():
    assert P.finetune_table(FT).splitlines() == ["| step | loss | scale | skipped |", "|---|---|---|---|",
                                                 "| 0 | NaN | 65,536 | yes |", "| 1 | NaN | 32,768 | yes |"]
    assert P.finetune_comparison_table(FT, FIXED).splitlines() == [
        "| step | loss, FP16 + GradScaler | loss, BF16 autocast |", "|---|---|---|",
        "| 0 | NaN | 5.600 |", "| 1 | NaN | 5.550 |"]
    assert P.finetune_facts(FT) == {"ft_steps": 2, "ft_skipped": 2, "ft_skipped_text": "All 2 steps were skipped",
                                    "ft_scale_first": 65536.0, "ft_scale_last": 32768.0}
    some = FP16FineTune((NAN, 2.5, math.inf), (65536.0, 32768.0, 32768.0), (True, False, False))
    assert P.finetune_facts(some)["ft_skipped_text"] == "1 of 3 steps was skipped"
    assert "| 1 | 2.500 | 32,768 | no |" in P.finetune_table(some) and "| 2 | inf |" in P.finetune_table(some)
    assert P.bf16_fix_facts(FIXED) == {"fix_finite": 2, "fix_first": 5.6, "fix_last": 5.55}
    assert P.bf16_fix_facts(FP16FineTune((1.0, math.inf, NAN), (1.0,) * 3, (False,) * 3))["fix_finite"] == 1
    with pytest.raises(ValueError, match="2 and 1 steps"):
        P.finetune_comparison_table(FT, FP16FineTune((1.0,), (1.0,), (False,)))


def test_advice_table_shows_a_dash_when_nothing_else_is_available():
    rows = [Advice("T4 (sm 7.5)", "fp16_autocast_scaler", "FP16 only"),
            Advice("H100", "bf16_autocast", "BF16 tensor cores", ("tf32 for FP32 matmuls", "FP8"))]
    assert P.advice_table(rows).splitlines() == [
        "| device | train with | why | also available |", "|---|---|---|---|",
        "| T4 (sm 7.5) | `fp16_autocast_scaler` | FP16 only | - |",
        "| H100 | `bf16_autocast` | BF16 tensor cores | tf32 for FP32 matmuls, FP8 |"]


def test_errata_rows_cite_the_datasheet_the_finetuning_and_the_lost_updates():
    rtx = DATASHEET_PEAKS["RTX 3090"]
    rows = P.bf16_errata_rows(rtx, precision_advice((8, 6), name="RTX 3090"), FT, _updates(), tail=2)
    assert [claim for claim, _ in rows] == ["An RTX 3090 should train in FP16; BF16 is for the A100 and H100.",
                                            "A BF16 model can be fine-tuned in FP16 with a GradScaler.",
                                            "Pure BF16 training (no FP32 copy of the weights) loses nothing."]
    assert rows[0][1] == ("The RTX 3090 has compute capability 8.6, with BF16 tensor cores at the same dense rate "
                          "as FP16 (71 against 71 TFLOP/s with FP32 accumulation); the course's rule gives "
                          "`bf16_autocast` for it.")
    assert rows[1][1] == ("Not when its activations exceed FP16's range: on lesson 2's stand-in for such a model "
                          "(untrained, with one residual channel amplified past FP16's range), all 2 of 2 steps were "
                          "skipped above, while BF16 autocast ran every step with a finite loss. A real pretrained "
                          "model need not have such a channel: check its largest activations first (exercise below).")
    assert rows[2][1] == ("At the stagnation section's learning rate, 0.0003, with BF16 weights updated by round to "
                          "nearest (the optimizer's moments in FP32: only the weights lack the FP32 copy), 40.0-50.0% "
                          "of the weights did not change at a step (average over the last 2 steps) although their "
                          "update was not zero; see the stagnation section.")
    no_bf16 = GPUPeaks("Old", "7.0", {"fp32": 1.0, "tf32": None, "bf16": None, "fp16": 2.0, "fp8": None}, 100.0, "x")
    with pytest.raises(ValueError, match="Old lacks its BF16 or FP16 peak"):
        P.bf16_errata_rows(no_bf16, precision_advice((7, 0)), FT, _updates())


def test_update_rule_bytes_and_adamws_moments_are_measured():
    from course_lib.memory import bytes_per_parameter
    from course_lib.studies.bf16 import adamw_moment_dtype, update_rule_bytes

    # BF16 weight and gradient, FP32 moments; Kahan adds its BF16 compensation buffer
    assert update_rule_bytes("stochastic") == {"weights": 2, "gradients": 2, "optimizer_state": 8,
                                               "master_weights": 0}
    assert update_rule_bytes("kahan")["optimizer_state"] == 10
    # torch's AdamW keeps moments in the parameter's dtype: bf16_pure's 4 bytes of optimizer state
    assert adamw_moment_dtype(torch.bfloat16) == torch.bfloat16 and adamw_moment_dtype(torch.float32) == torch.float32
    assert bytes_per_parameter("bf16_pure")["optimizer_state"] == 2 * torch.bfloat16.itemsize
    with pytest.raises(ValueError, match="rule must be one of"):
        update_rule_bytes("round-up")
    with pytest.raises(TypeError, match="floating torch.dtype"):
        adamw_moment_dtype(torch.int32)
    assert P.update_memory_facts() == {"upd_memory": (
        "With BF16 weights and gradients that makes 12 bytes per parameter with stochastic rounding and 14 with "
        "Kahan compensation (its BF16 buffer), against 8 for the `bf16_pure` recipe, whose torch AdamW keeps "
        "`bfloat16` moments for BF16 weights, and 20 for `bf16_master`")}


def test_divergence_prose_counts_in_words_and_writes_code_not_tex():
    from course_lib.monitor import NonFiniteReport, TensorSummary
    from course_lib.studies.fp16_divergence import DivergenceRun, Fp16Divergence

    def run(seed, kind, peak):
        return DivergenceRun(seed, kind, (3.0, 2.9, 2.8), None, (0, 2), {"blocks.0.attn": (10.0, peak)})

    fused = tuple(run(s, "sdpa", 150_000.0) for s in range(3))
    div = Fp16Divergence(0.05, 3, 2, fused, None, None, None, {})
    assert ("The growth itself did no harm to runs that never hold the raw product in FP16: all three runs with "
            "fused attention (SDPA) stayed finite, and all three went past FP16's largest value (peaks 150,000, "
            "150,000 and 150,000), up to 150,000") \
        in P.divergence_verdict(div)
    some = Fp16Divergence(0.05, 3, 2, fused[:2] + (run(2, "sdpa", 100.0),), None, None, None, {})
    assert "all three runs with fused attention (SDPA) stayed finite, and two of them went past" in \
        P.divergence_verdict(some)
    # glued Markdown lands where MathJax does not look: code, not TeX
    assert "$" not in P.ATTENTION_NAMES["explicit"] and "`q @ k.transpose(-2, -1)`" in P.ATTENTION_NAMES["explicit"]
    one_inf = TensorSummary((2, 3), "float16", 1.0, 0, 1)
    report = NonFiniteReport("blocks.0.attn", "forward", (TensorSummary((2, 3), "float16", 90.0, 0, 0),),
                             (one_inf,), op="matmul")
    located = Fp16Divergence(0.05, 3, 2, fused, 0, 2, report, {})
    assert P.located_sentence(located).endswith("its output held 1 infinity.")


def test_lessons_4_and_5_draw_each_recipe_in_one_colour_and_dash():
    from course_lib import plots

    def styles(names):
        fig = plots.plot_runs({n: [0.0, 1.0] for n in names}, minus="fp32", ylabel="loss", title="t")
        return {line.get_label(): (line.get_color(), line.get_linestyle())
                for line in fig.axes[0].get_lines() if line.get_label() != "fp32"}

    lesson4 = styles(["fp32", "bf16_autocast", "fp16_autocast_scaler", "fp16_autocast_no_scaler", "bf16_pure"])
    lesson5 = styles(["fp32", "fp16_autocast_scaler", "bf16_autocast", "fp16_autocast_no_scaler"])
    assert all(lesson4[n] == lesson5[n] for n in lesson5)
    assert lesson4["bf16_autocast"][:2] == ("#0072B2", "-") and lesson5["fp16_autocast_scaler"][:2] == ("#CC79A7", "--")
    assert len({colour for colour, _ in lesson4.values()}) == len(lesson4)
