"""Lesson 5's facts, phrases, tables and errata rows, computed from the studies' results (studies.bf16)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..bf16 import Advice
from ..formats import get_format, overflow_boundary, spacing
from ..glue import Prose, and_list, count_word, one_sign_odds, plural
from ..hardware import GPUPeaks
from ..memory import bytes_per_parameter
from ..tables import MarkdownTable, markdown_table
from .bf16 import (EVAL_BATCHES, UPDATE_LABELS, FP16FineTune, Parity, UpdateComparison, adamw_moment_dtype,
                   update_rule_bytes)
from .fp16_divergence import FP16_MAX, DivergenceRun, Fp16Divergence
from .loss_scaling_prose import forward_nan_where

REFERENCE = "FP32"
MASTER = "BF16 + FP32 master weights"
NEAREST = UPDATE_LABELS["nearest"]
KAHAN = UPDATE_LABELS["kahan"]


# ---- precision against range -------------------------------------------------------------------------

def format_facts() -> dict[str, object]:
    """BF16 against FP16 from the format tables: how much coarser BF16's epsilon is (``eps_ratio``), how
    many more mantissa bits FP16 keeps, BF16's mantissa bits, and the range 1/2^(m+2) to 1/2^(m+1) (as the
    denominators ``half_ulp_lo``, ``half_ulp_hi``) of an update, relative to the weight, that rounds away,
    FP16's largest finite value (``fmt_fp16_max``) and where a value overflows to inf (``fmt_fp16_inf``: from
    there up, :func:`course_lib.formats.overflow_boundary`; between the two, values round down to max)."""
    bf16, fp16 = get_format("BF16"), get_format("FP16")
    return {"eps_ratio": bf16.epsilon / fp16.epsilon,
            "extra_bits": fp16.mantissa_bits - bf16.mantissa_bits,
            "fmt_fp16_max": fp16.max_finite,
            "fmt_fp16_inf": overflow_boundary(fp16)[0],
            "half_ulp_lo": 2 ** (bf16.mantissa_bits + 2),
            "half_ulp_hi": 2 ** (bf16.mantissa_bits + 1),
            "bf16_mantissa": bf16.mantissa_bits}


def exercise_facts() -> dict[str, object]:
    """The numbers of the exercises' solutions: BF16's spacing at 1.0 (just above and below) and at 256, the
    learning rates below which an update of a weight at 1.0 rounds away (up and down), FP16's largest
    finite value."""
    spacing_1 = float(spacing(1.0, "BF16"))
    return {"ex_spacing_1": spacing_1,
            "ex_spacing_below_1": spacing_1 / 2,
            "ex_lr_needed": spacing_1 / 2,
            "ex_lr_down": spacing_1 / 4,
            "ex_spacing_256": float(spacing(256.0, "BF16")),
            "ex_fp16_max": get_format("FP16").max_finite}


# ---- convergence over seeds --------------------------------------------------------------------------

def parity_table(parity: Parity) -> MarkdownTable:
    """Per recipe: the mean final loss over seeds, its sample standard deviation and each seed's value."""
    return markdown_table(
        ("recipe", f"final loss (mean of the last {parity.final_steps} steps), mean over seeds",
         "std. dev. over seeds", "per seed"),
        [(f"`{r}`", f"{parity.mean(r):.4f}", f"{parity.spread(r):.4f}",
          ", ".join(f"{v:.4f}" for v in parity.final_losses[r])) for r in parity.recipes])


def parity_facts(parity: Parity) -> dict[str, object]:
    """``parity_<recipe>``: each recipe's mean final loss; the number of seeds, of steps per run and of final
    steps a final loss averages (``parity_tail``); the largest gap between two
    recipes' means (``parity_max_gap``), the largest standard deviation over seeds (``parity_max_spread``),
    the largest difference of any recipe from FP32 with the same seed (``parity_max_paired``) and
    :func:`paired_verdict` (``parity_verdict``)."""
    if "fp32" not in parity.final_losses:
        raise ValueError("parity_facts compares against FP32: the parity study must include the 'fp32' recipe")
    means = [parity.mean(r) for r in parity.recipes]
    return {**{f"parity_{r}": parity.mean(r) for r in parity.recipes},
            "parity_seeds": len(parity.seeds), "parity_steps": parity.steps,
            "parity_tail": parity.final_steps,
            "parity_max_gap": max(means) - min(means),
            "parity_max_spread": max(parity.spread(r) for r in parity.recipes),
            "parity_max_paired": max(abs(a - b) for r in parity.recipes
                                     for a, b in zip(parity.final_losses[r], parity.final_losses["fp32"])),
            "parity_verdict": paired_verdict(parity)}


def paired_verdict(parity: Parity) -> Prose:
    """Whether any recipe's final loss kept one side of FP32's over the seeds (each seed pairs the two on the
    same weights and batches), and what that says: with no such recipe the recipes have not come apart."""
    if "fp32" not in parity.final_losses:
        raise ValueError("paired_verdict compares against FP32: the parity study must include the 'fp32' recipe")
    n = len(parity.seeds)
    sided = []
    for r in parity.recipes:
        d = [a - b for a, b in zip(parity.final_losses[r], parity.final_losses["fp32"])]
        if r != "fp32" and len(d) > 1 and all(math.isfinite(x) for x in d) and (min(d) > 0 or max(d) < 0):
            # two significant digits: a difference the table's four decimals round to 0.0000 still shows its sign
            sided.append(f"`{r}` ended {'above' if min(d) > 0 else 'below'} FP32's in every seed "
                         f"({min(d):+.2g} to {max(d):+.2g})")
    if not sided:
        keeps_up = (". On a run this short even FP16 without a scaler can keep up"
                    if "fp16_autocast_no_scaler" in parity.recipes else "")
        return Prose(f"and no recipe kept one side of FP32 over the {count_word(n)} seed{'s' * (n != 1)}: at this "
                     f"length the recipes have not come apart{keeps_up}")
    return Prose(f"and {and_list(sided)}: {_one_sign_by_chance(n)}, so {'each' if len(sided) > 1 else 'it'} is a "
                 "hint to test with more seeds, not yet a difference")


def _one_sign_by_chance(n: int) -> str:
    """How often ``n`` paired seeds all land on one side of FP32 by chance alone (either side:
    :func:`course_lib.glue.one_sign_odds`)."""
    return f"{count_word(n)} seeds land on one side by chance alone one time in {one_sign_odds(n)}"


def finite_final_losses(parity: Parity) -> dict[str, list[float]]:
    """Per recipe, the final losses of the seeds that ended finite (a NaN or infinite loss is left out)."""
    return {r: [v for v in parity.final_losses[r] if math.isfinite(v)] for r in parity.recipes}


def recorded_parity_table(parity: Parity) -> MarkdownTable:
    """A recorded parity run, per recipe: how many seeds ended finite, the mean and the range (max - min)
    of those seeds' final losses ("-" where there are none, or only one for the range)."""
    finite = finite_final_losses(parity)
    rows = []
    for r in parity.recipes:
        f = finite[r]
        rows.append((f"`{r}`", f"{len(f)} of {len(parity.final_losses[r])}",
                     f"{sum(f) / len(f):.4f}" if f else "-", f"{max(f) - min(f):.4f}" if len(f) > 1 else "-"))
    return markdown_table(("recipe", "seeds that ended finite", "final loss, mean of those",
                           "range over those seeds (max - min)"), rows)


def bf16_paired_note(parity: Parity, recipe: str = "bf16_autocast") -> Prose:
    """``recipe``'s mean final loss against FP32's, read seed by seed: its difference from FP32 on each seed
    (the same weights and batches), and whether those differences keep one sign. Empty when either recipe
    has a non-finite seed (the NaN notes speak to those) or only one seed."""
    if recipe not in parity.final_losses or "fp32" not in parity.final_losses:
        return Prose("")
    d = [a - b for a, b in zip(parity.final_losses[recipe], parity.final_losses["fp32"])]
    if len(d) < 2 or not all(math.isfinite(x) for x in d):
        return Prose("")
    n = len(d)
    gap = parity.mean(recipe) - parity.mean("fp32")
    diffs = and_list([f"{x:+.3f}" for x in d])
    if min(d) > 0 or max(d) < 0:
        verdict = (f"every seed on the same side ({_one_sign_by_chance(n)}): a hint to test with more seeds, not yet "
                   "a difference")
    else:
        verdict = (f"the mean's gap comes from seeds that disagree in sign, so `{recipe}` is not consistently "
                   f"{'behind' if gap > 0 else 'ahead of'} FP32")
    side = "above" if gap > 0 else "below"
    return Prose(f"`{recipe}`'s mean final loss is {abs(gap):.3f} {side} FP32's. Seed by seed (the same weights and "
                 f"batches for both recipes) the differences are {diffs}: {verdict}.")


def fp16_behind_note(parity: Parity) -> Prose:
    """The paragraph saying that FP16 without a scaler ended finite but behind FP32, when every finite seed
    of it ended above every finite FP32 seed; empty otherwise (or when either has no finite seed)."""
    finite = finite_final_losses(parity)
    f32, f16 = finite.get("fp32"), finite.get("fp16_autocast_no_scaler")
    if not f32 or not f16 or not min(f16) > max(f32):
        return Prose("")
    return Prose(f"At full size, FP16 without a scaler ended finite but behind: every seed's final loss "
                 f"({min(f16):.3f} to {max(f16):.3f}) is above every FP32 seed's ({min(f32):.3f} to "
                 f"{max(f32):.3f}). Unlike the short run above, the two recipes' ranges over seeds do not even overlap; "
                 "lesson 2 ({doc}`02_underflow_overflow`) measured the gradients that FP16 flushes to zero without a "
                 "scale. Finishing finite is not finishing well.")


def survivors_behind_note(parity: Parity, recipe: str = "fp16_autocast_scaler") -> Prose:
    """For a ``recipe`` some of whose seeds ended non-finite: where the seeds that ended finite stand against
    FP32, when every one of them ended above every finite FP32 seed (each named, with its gap to FP32 on the
    same seed), and that a single survivor has no spread; empty otherwise."""
    finite = finite_final_losses(parity)
    if recipe not in finite or "fp32" not in finite:
        return Prose("")
    f32, survivors = finite["fp32"], finite[recipe]
    if not f32 or not survivors or len(survivors) == len(parity.final_losses[recipe]) or not min(survivors) > max(f32):
        return Prose("")
    named = [(seed, v, parity.final_losses["fp32"][i]) for i, (seed, v) in
             enumerate(zip(parity.seeds, parity.final_losses[recipe])) if math.isfinite(v)]
    listed = and_list([f"seed {seed} at {v:.3f}, {v - ref:+.3f} from FP32 with the same seed" for seed, v, ref in named])
    which = (f"The only `{recipe}` seed that ended finite" if len(named) == 1 else
             f"The {len(named)} `{recipe}` seeds that ended finite")
    caveat = (" One seed has no spread, so this says that run ended behind, not by how much the recipe does."
              if len(named) == 1 else "")
    return Prose(f"{which} ({listed}) ended above every FP32 seed ({min(f32):.3f} to {max(f32):.3f}).{caveat}")


def nan_seeds_note(parity: Parity) -> Prose:
    """The paragraph naming the recipes that ended with a NaN (or infinite) loss in some seeds, and why a
    loss scale cannot repair that; empty when every seed of every recipe ended finite."""
    finite = finite_final_losses(parity)
    failed = {r: len(parity.final_losses[r]) - len(finite[r]) for r in parity.recipes
              if len(finite[r]) < len(parity.final_losses[r])}
    if not failed:
        return Prose("")
    unscaled = "fp16_autocast_no_scaler"
    # the scaler's run failed where the unscaled one did not: a reader must not take the scaler for the cause
    survivor = ("" if "fp16_autocast_scaler" not in failed or unscaled in failed or unscaled not in finite else
                f"That `{unscaled}` ended finite in every seed does not make the scaler the cause: the scaler "
                "multiplies the loss after the forward pass, and cannot itself make a forward pass overflow. The two runs "
                "had different weights by then: with the gradients FP16 flushes to zero, the unscaled run trains "
                "more slowly, and its activations need not have grown to the values that overflowed. ")
    return Prose("At full size, " + ", ".join(f"`{r}` ended with a NaN loss in {n} of {len(parity.seeds)} seeds"
                                              for r, n in failed.items())
                 + ". The loss itself became NaN, so the forward pass produced non-finite values in FP16; a "
                 "loss scale acts on the backward pass only and cannot repair that ({doc}`03_loss_scaling` "
                 "shows the recorded scale collapsing after it). BF16 has the range to avoid it. " + survivor
                 + forward_nan_where(on_lesson_5=True))


def recorded_parity_note(parity: Parity, label: str, size: str = "") -> Prose:
    """A recorded parity run on ``label`` (the hardware) at ``size`` (:func:`course_lib.results.record_size_text`:
    said first, so that its numbers are read as that model's): its table, then the notes that apply to it."""
    parts = [f"On **{label}**{f' ({size})' if size else ''}:\n\n" + recorded_parity_table(parity).rstrip("\n"),
             bf16_paired_note(parity), fp16_behind_note(parity), nan_seeds_note(parity), survivors_behind_note(parity)]
    return Prose("\n\n".join(p for p in parts if p))


# ---- weight-update stagnation ------------------------------------------------------------------------

def eval_gaps(updates: UpdateComparison) -> dict[str, list[float]]:
    """Per update rule but FP32, each seed's held-out evaluation loss minus FP32's with the same seed."""
    if REFERENCE not in updates.eval_losses:
        raise ValueError(f"the update comparison has no {REFERENCE!r} run to compare against")
    ref = updates.eval_losses[REFERENCE]
    return {k: [b - a for a, b in zip(ref, updates.eval_losses[k])] for k in updates.recipes if k != REFERENCE}


def update_gap_table(updates: UpdateComparison) -> MarkdownTable:
    """Per update rule: each seed's evaluation loss minus FP32's, and the range of those differences, to five
    decimals: the prose compares rules that end within a few 1e-5 of each other."""
    return markdown_table(("weights and update", "evaluation loss minus FP32's, per seed", "range"),
                          [(k, ", ".join(f"{d:+.5f}" for d in v), f"{min(v):+.5f} to {max(v):+.5f}")
                           for k, v in eval_gaps(updates).items()])


def lost_update_shares(updates: UpdateComparison, tail: int = 10) -> list[float]:
    """Per seed, the share of weights (0 to 1) whose non-zero update round-to-nearest lost, averaged over
    the last ``tail`` steps."""
    if isinstance(tail, bool) or not isinstance(tail, int) or tail < 1:
        raise ValueError(f"tail must be a positive int, got {tail!r}")
    return [sum(c[-tail:]) / tail for c in updates.lost_fraction[NEAREST]]


def update_lead(gaps: dict[str, list[float]]) -> Prose:
    """The opening sentence: round-to-nearest is the only rule apart from FP32 when every seed of it lies
    above every other rule's seeds and no other rule has all its seeds on one side of FP32."""
    others = [k for k in gaps if k != NEAREST]
    separates = min(gaps[NEAREST]) > max(max(gaps[k]) for k in others)
    apart = [k for k in others if min(gaps[k]) > 0 or max(gaps[k]) < 0]    # every seed on one side of FP32
    return Prose("Only plain round-to-nearest separates from FP32." if separates and not apart else
                 "Round-to-nearest separates from FP32 most clearly.")


def separation_phrase(gaps: dict[str, list[float]]) -> Prose:
    """Whether every seed of round-to-nearest lies above every seed of the other rules."""
    others = [k for k in gaps if k != NEAREST]
    separates = min(gaps[NEAREST]) > max(max(gaps[k]) for k in others)
    return Prose("every seed of it lies above every seed of every other rule" if separates else
                 "its seeds overlap those of the others")


def others_note(gaps: dict[str, list[float]]) -> Prose:
    """Each repair's largest distance from FP32 over seeds, against round-to-nearest's smallest gap, and
    whether the repairs' ranges over seeds all overlap."""
    others = [k for k in gaps if k != NEAREST]
    worst = {k: max(abs(d) for d in gaps[k]) for k in others}
    overlap = all(min(gaps[a]) <= max(gaps[b]) for a in others for b in others)
    # five decimals, as the table prints each seed: "within 0.0015" read wrong beside a printed +0.00153
    return Prose("; ".join(f"{k.replace('BF16, ', '').replace('BF16 + ', '')} within {v:.5f}"
                           for k, v in worst.items())
                 + f" in every seed: small against round-to-nearest's gap of at least {min(gaps[NEAREST]):.5f}"
                 + (", and their ranges over seeds overlap" if overlap else ""))


def kahan_master_note(gaps: dict[str, list[float]]) -> Prose:
    """How close Kahan compensation and FP32 master weights ended, seed by seed, and why: both keep the part of
    each update the BF16 weight could not hold. Empty where either is missing."""
    if KAHAN not in gaps or MASTER not in gaps:
        return Prose("")
    # from the gaps as the table prints them (five decimals), so that a reader who subtracts two printed
    # entries finds no larger distance than the sentence gives
    kahan, master = ([round(d, 5) for d in gaps[k]] for k in (KAHAN, MASTER))
    apart = max(abs(a - b) for a, b in zip(kahan, master))
    closer = ", closer than either is to FP32" if apart < min(abs(d) for d in (*kahan, *master)) else ""
    return Prose(f"Kahan compensation and FP32 master weights ended within {apart:.1e} of each other in every seed"
                 f"{closer}: both keep the part of each update the BF16 weight cannot hold "
                 "(in FP32, or in the BF16 compensation buffer), which is why they can end this close. The two runs "
                 "are separate code (torch's AdamW on an FP32 copy against "
                 "the course's `BF16AdamW`), not one run listed twice.")


def update_facts(updates: UpdateComparison, tail: int = 10) -> dict[str, object]:
    """The stagnation section's numbers and phrases: the run's settings, the master-weight run's training
    loss against FP32's over the last ``tail`` steps, the loss level and BF16's spacing there, the share of
    lost updates, and round-to-nearest's and the repairs' evaluation gaps from FP32."""
    for label in (REFERENCE, MASTER, NEAREST):
        if label not in updates.curves:
            raise ValueError(f"the update comparison has no {label!r} run")
    gaps = eval_gaps(updates)
    others = [k for k in gaps if k != NEAREST]
    if not others:
        raise ValueError("the update comparison needs at least one rule besides round-to-nearest")
    train_gap = [b - a for a, b in zip(updates.final(REFERENCE, tail), updates.final(MASTER, tail))]
    final_master = updates.final(MASTER, tail)
    loss_level = sum(final_master) / len(final_master)
    lost = lost_update_shares(updates, tail)
    return {
        "eval_batches": EVAL_BATCHES,
        "upd_lr": updates.lr, "upd_steps": updates.steps, "upd_tail": tail, "upd_seeds": len(updates.seeds),
        "train_gap_master": Prose(f"{min(train_gap):+.4f} to {max(train_gap):+.4f}"),
        "loss_level": loss_level,
        "bf16_spacing_at_loss": Prose(f"1/{1 / float(spacing(loss_level, 'BF16')):.0f}"),
        "lost_nearest": Prose(f"{100 * min(lost):.1f}-{100 * max(lost):.1f}%"),
        "gap_nearest": Prose(f"{min(gaps[NEAREST]):+.3f} to {max(gaps[NEAREST]):+.3f}"),
        "gap_others": Prose(f"{min(min(gaps[k]) for k in others):+.5f} and "     # the table's five decimals
                            f"{max(max(gaps[k]) for k in others):+.5f}"),
        "upd_lead": update_lead(gaps),
        "upd_separates": separation_phrase(gaps),
        "upd_others_note": others_note(gaps),
        "upd_kahan_master": kahan_master_note(gaps),
    }


def update_memory_facts() -> dict[str, object]:
    """``upd_memory``: the bytes per parameter each way of keeping BF16 weights costs, measured: lesson 5's
    ``BF16AdamW`` (FP32 moments) with stochastic rounding and with Kahan compensation, against ``bf16_pure``
    (torch's AdamW, whose moments take the parameter's dtype, measured) and ``bf16_master``
    (:func:`course_lib.memory.bytes_per_parameter`)."""
    pure, master = (sum(bytes_per_parameter(r).values()) for r in ("bf16_pure", "bf16_master"))
    stochastic, kahan = (sum(update_rule_bytes(r).values()) for r in ("stochastic", "kahan"))
    moments = str(adamw_moment_dtype(torch.bfloat16)).replace("torch.", "")
    return {"upd_memory": Prose(
        f"With BF16 weights and gradients that makes {stochastic} bytes per parameter with stochastic rounding "
        f"and {kahan} with Kahan compensation (its BF16 buffer), against {pure} for the `bf16_pure` recipe, "
        f"whose torch AdamW keeps `{moments}` moments for BF16 weights, and {master} for `bf16_master`")}


# ---- a BF16 model fine-tuned in FP16 -----------------------------------------------------------------

def finetune_table(ft: FP16FineTune) -> MarkdownTable:
    """Per step of the fine-tuning: the loss, the loss scale and whether the step was skipped."""
    return markdown_table(("step", "loss", "scale", "skipped"),
                          [(i, _loss_text(loss), f"{scale:,g}", "yes" if skipped else "no")
                           for i, (loss, scale, skipped) in enumerate(zip(ft.losses, ft.scales, ft.skipped))])


def _loss_text(loss: float) -> str:
    """A loss for a table: three decimals, or ``NaN``, ``inf``, ``-inf`` where it is not finite."""
    if math.isnan(loss):
        return "NaN"
    return f"{loss:.3f}" if math.isfinite(loss) else ("inf" if loss > 0 else "-inf")


def finetune_facts(ft: FP16FineTune) -> dict[str, object]:
    """Steps run, steps skipped, the loss scale at the first and the last step, and ``ft_skipped_text``:
    "All 8 steps were skipped" or "5 of 8 steps were skipped"."""
    skipped, steps = sum(ft.skipped), len(ft.losses)
    if steps == 0:
        raise ValueError("the fine-tuning ran no steps")
    text = (f"All {plural(steps, 'step')} were skipped" if skipped == steps and steps > 1
            else f"{skipped} of {plural(steps, 'step')} {'was' if skipped == 1 else 'were'} skipped")
    return {"ft_steps": steps, "ft_skipped": skipped, "ft_skipped_text": Prose(text),
            "ft_scale_first": ft.scales[0], "ft_scale_last": ft.scales[-1]}


def finetune_comparison_table(fp16: FP16FineTune, bf16: FP16FineTune) -> MarkdownTable:
    """The loss per step of the FP16 fine-tuning beside the BF16 one (same weights and batches)."""
    if len(fp16.losses) != len(bf16.losses):
        raise ValueError(f"the runs have {len(fp16.losses)} and {len(bf16.losses)} steps; compare equal runs")
    return markdown_table(("step", "loss, FP16 + GradScaler", "loss, BF16 autocast"),
                          [(i, _loss_text(a), _loss_text(b)) for i, (a, b) in enumerate(zip(fp16.losses, bf16.losses))])


def bf16_fix_facts(fixed: FP16FineTune) -> dict[str, object]:
    """How many steps of the BF16 fine-tuning had a finite loss, and its first and last loss."""
    return {"fix_finite": sum(1 for v in fixed.losses if math.isfinite(v)),
            "fix_first": fixed.losses[0], "fix_last": fixed.losses[-1]}


# ---- which format on which device, errata ------------------------------------------------------------

def advice_table(advice: Sequence[Advice]) -> MarkdownTable:
    """One row per device: the recipe to train with, why, and what else it offers ("-": nothing)."""
    return markdown_table(("device", "train with", "why", "also available"),
                          [(a.device, f"`{a.recipe}`", a.why, ", ".join(a.also) or "-") for a in advice])


def bf16_errata_rows(rtx3090: GPUPeaks, advice_3090: Advice, ft: FP16FineTune, updates: UpdateComparison,
                     tail: int = 10) -> list[tuple[str, str]]:
    """Lesson 5's errata, (claim, what was measured) pairs: the RTX 3090's BF16 and FP16 rates from its
    datasheet entry ``rtx3090`` and the course's advice for it, ``advice_3090``; the skipped steps of the FP16
    fine-tuning ``ft``; the share of updates plain BF16 lost over the last ``tail`` steps of ``updates``."""
    bf16_peak, fp16_peak = rtx3090.peak("bf16"), rtx3090.peak("fp16")
    if bf16_peak is None or fp16_peak is None:
        raise ValueError(f"the datasheet entry of {rtx3090.name} lacks its BF16 or FP16 peak")
    lost = lost_update_shares(updates, tail)
    return [
        ("An RTX 3090 should train in FP16; BF16 is for the A100 and H100.",
         f"The {rtx3090.name} has compute capability {rtx3090.compute_capability}, with BF16 tensor cores at the same "
         f"dense rate as FP16 ({bf16_peak:g} against {fp16_peak:g} TFLOP/s with FP32 "
         f"accumulation); the course's rule gives `{advice_3090.recipe}` for it."),
        ("A BF16 model can be fine-tuned in FP16 with a GradScaler.",
         f"Not when its activations exceed FP16's range: on lesson 2's stand-in for such a model (untrained, with "
         f"one residual channel amplified past FP16's range), all {sum(ft.skipped)} of {len(ft.losses)} steps "
         f"were skipped above, while BF16 autocast ran every step with a finite loss. A real pretrained model need "
         f"not have such a channel: check its largest activations first (exercise below)."),
        ("Pure BF16 training (no FP32 copy of the weights) loses nothing.",
         f"At the stagnation section's learning rate, {updates.lr:g}, with BF16 weights updated by round to "
         f"nearest (the optimizer's moments in FP32: only the weights lack the FP32 copy), "
         f"{100 * min(lost):.1f}-{100 * max(lost):.1f}% of the weights did not change at a step (average over the "
         f"last {tail} steps) although their update was not zero; see the stagnation section."),
    ]


# ---- the FP16 failure, located -----------------------------------------------------------------------

# plain text and code spans, no $...$ math: these phrases are glued as Markdown, and a glued phrase lands in
# an element MathJax skips, so math in it would show as raw LaTeX
ATTENTION_NAMES = {"explicit": "attention written out (`q @ k.transpose(-2, -1)`, then the scale)",
                   "scaled_first": "`q` scaled before the product", "sdpa": "fused attention (SDPA)"}


def divergence_outcomes(div: Fp16Divergence) -> Prose:
    """Per attention kind, in how many seeds the loss turned non-finite and at which steps."""
    kinds = list(dict.fromkeys(run.attention for run in div.runs))
    parts = []
    for kind in kinds:
        runs = [run for run in div.runs if run.attention == kind]
        failed = [run for run in runs if run.first_nonfinite is not None]
        where = (f" (at step{'s' if len(failed) > 1 else ''} "
                 + and_list([str(run.first_nonfinite) for run in failed]) + ")") if failed else ""
        parts.append(f"with {ATTENTION_NAMES[kind]}, in {len(failed)} of {len(runs)} seeds{where}")
    return Prose(f"Over {div.steps} steps at learning rate {div.lr:g}, the loss turned non-finite "
                 + "; ".join(parts) + ".")


def _fmt_max(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def located_sentence(div: Fp16Divergence) -> Prose:
    """What re-running the first failing step found: the operation and module the locator named, with its
    inputs' largest magnitudes and the infinities it made; or that the re-run stayed finite; or that no run
    failed (with the largest product any run reached, against FP16's largest value)."""
    if div.located_step is None:
        peak = max((p for p in map(_peak, div.runs) if math.isfinite(p)), default=math.nan)
        return Prose(f"No run failed, so there is no step to locate; the largest |q · k| any run reached was "
                     f"{_fmt_max(peak)}, against FP16's largest value {_fmt_max(FP16_MAX)}.")
    if div.located is None:
        return Prose(f"Re-run from the same weights, step {div.located_step} of seed {div.located_seed} stayed "
                     "finite under the locator: the failure did not reproduce, so it is not located.")
    r = div.located
    ins = and_list([f"{s.dtype} {list(s.shape)} with largest magnitude {_fmt_max(s.max_abs)}" for s in r.inputs])
    made = sum(s.inf for s in r.outputs), sum(s.nan for s in r.outputs)
    what = and_list([plural(n, noun, many) for n, (noun, many) in zip(made, (("infinity", "infinities"),
                                                                           ("NaN", "NaNs"))) if n]) \
        or "non-finite values"
    op = f"`{r.op}` in `{r.module}`" if r.op else f"`{r.module}`"
    return Prose(f"Re-run from the weights that failed (seed {div.located_seed}, step {div.located_step}), the "
                 f"locator names {op}. Its inputs were finite ({ins}){_attention_shapes(r)}; its output held "
                 f"{what}.")


def _attention_shapes(report) -> str:
    """What the dimensions of an attention product's inputs are, where the locator named a ``matmul`` of two
    4-D tensors: batch and heads first, then the matrices; ``q @ k^T`` where the shapes are (T, d) by (d, T)
    with T != d (``att @ v`` is (T, T) by (T, d)); "" otherwise. Plain text, no math: it is glued."""
    shapes = [tuple(s.shape) for s in report.inputs]
    if report.op != "matmul" or len(shapes) != 2 or any(len(shape) != 4 for shape in shapes):
        return ""
    (_, _, t, d), (_, _, d2, t2) = shapes
    if (t, d) == (t2, d2) and t != d:
        return (f": batch and attention heads first, then `q` ({t} positions by a head dimension of {d}) and "
                f"`kᵀ` ({d} by {t})")
    return ": batch and attention heads first, then the two matrices multiplied"


def replay_table(div: Fp16Divergence) -> MarkdownTable:
    """The failing batch's loss from the failing weights, per way of computing it (``NaN`` or ``inf`` where
    it was not finite); one row that says so when no run failed."""
    rows = [(label, f"{loss:.4f}" if math.isfinite(loss) else str(loss).replace("nan", "NaN"))
            for label, loss in div.replays.items()]
    return markdown_table(("the failing step, computed as", "loss"),
                          rows or [("(no run failed: no step to compute again)", "-")])


def _peak(run: DivergenceRun) -> float:
    """A run's largest finite ``|q . k|`` over layers and probed steps."""
    return max((p for p in run.peaks() if math.isfinite(p)), default=math.nan)


def divergence_verdict(div: Fp16Divergence) -> Prose:
    """What the runs show beyond the outcomes: whether runs computed another way went past FP16's largest
    value and stayed finite, and the largest product of each failing written-out run at its failing step."""
    parts = []
    failed = [run for run in div.runs if run.first_nonfinite is not None]
    survivors = [run for run in div.runs if run.first_nonfinite is None and run.attention != "explicit"]
    if survivors:
        peaks = [_peak(run) for run in survivors]
        past = sum(p > FP16_MAX for p in peaks)
        kinds = and_list(sorted({ATTENTION_NAMES[r.attention] for r in survivors}))
        if past:
            n = len(survivors)
            if n == 1:
                which = f"the one run with {kinds} stayed finite and went past FP16's largest value"
            elif past == n:   # each run's peak printed: one just past the line shows as just past
                which = (f"all {count_word(n)} runs with {kinds} stayed finite, and all {count_word(n)} went past "
                         f"FP16's largest value (peaks {and_list([_fmt_max(p) for p in peaks])})")
            else:
                which = (f"all {count_word(n)} runs with {kinds} stayed finite, and {count_word(past)} of them went "
                         "past FP16's largest value")
            parts.append(f"The growth itself did no harm to runs that never hold the raw product in FP16: {which}, "
                         f"up to {_fmt_max(max(peaks))}, {max(peaks) / FP16_MAX:.3g} times it.")
        else:
            parts.append(f"The runs with {kinds} stayed below FP16's largest value (at most {_fmt_max(max(peaks))}),"
                         " so they do not show whether they would survive a larger product.")
    at_failure = [run.peaks()[-1] for run in failed if run.probe_steps and run.probe_steps[-1] == run.first_nonfinite]
    if at_failure:
        over = sum(v > FP16_MAX for v in at_failure)
        parts.append(f"At the failing step, the largest product (computed in FP32) was "
                     f"{and_list([_fmt_max(v) for v in at_failure])}: above {_fmt_max(FP16_MAX)} in {over} of "
                     f"{len(at_failure)} failing runs.")
    return Prose(" ".join(parts))


def learning_rate_sentence(div: Fp16Divergence, course_lr: float, course_batch: int | None = None) -> Prose:
    """The run's learning rate against ``course_lr``, the rate of the course's other training runs, and its
    batch against ``course_batch``, their batch (said only where the two differ; None: not said)."""
    if not (course_lr > 0 and math.isfinite(course_lr)):
        raise ValueError(f"course_lr must be a positive finite number, got {course_lr!r}")
    if course_batch is not None and (isinstance(course_batch, bool) or not isinstance(course_batch, int)
                                     or course_batch < 1):
        raise ValueError(f"course_batch must be None or a positive int, got {course_batch!r}")
    batch = ""
    if course_batch is not None and div.batch_size is not None and div.batch_size != course_batch:
        batch = (f" They take batches of {div.batch_size} sequences, not the {course_batch} of those runs, to keep "
                 "the run short on a CPU, where FP16 products can be slow (the matmul speeds at the top of the "
                 "page).")
    if div.lr == course_lr:
        return Prose(f"The runs train at the course's usual learning rate, {div.lr:g}.{batch}")
    how = f"{div.lr / course_lr:.3g} times" if div.lr > course_lr else f"{course_lr / div.lr:.3g} times below"
    why = (f", so that the failure shows within the {div.steps} steps a lesson can afford" if div.lr > course_lr
           else "")
    return Prose(f"The runs train at learning rate {div.lr:g}, {how} the {course_lr:g} of the course model's "
                 f"other runs (the parity runs above among them){why}.{batch}")


def proxy_sentence(size: str, recorded: bool, *, located: bool = True) -> Prose:
    """What the located failure stands for. At the ``size`` 'small' the live runs are a proxy (a smaller model,
    a higher learning rate, smaller batches), so what they locate is their own failure, not the full-size
    record's; ``recorded``: whether a GPU record of this study exists (its note then locates a full-size run).
    At 'full' the live runs are the full-size study itself. ``located``: whether the runs' failure was located
    (the table then gives the failing batch's loss computed each way); where not, there is nothing to stand
    for."""
    if size not in ("small", "full"):
        raise ValueError(f"size must be 'small' or 'full', got {size!r}")
    if not isinstance(recorded, bool):
        raise TypeError(f"recorded must be a bool, got {type(recorded).__name__}")
    if not isinstance(located, bool):
        raise TypeError(f"located must be a bool, got {type(located).__name__}")
    table = "The table gives the failing batch's loss from those same weights, computed each way. "
    if size == "full":
        return Prose(table + "These runs are the full-size study, so the operation named is where a full-size run "
                     "failed." if located else "These runs are the full-size study; none was located here.")
    where = ("The GPU record below locates the failure in a full-size run of this study." if recorded else
             "Which operation failed in the full-size runs recorded above is not shown: that awaits a GPU "
             "recording of this study (`fp16_divergence`).")
    if not located:
        return Prose("These runs are a small proxy on the CPU (the small course model, with the learning rate and "
                     "batch said below the figure), and no failure of theirs was located here, so they say nothing "
                     f"about where the full-size record failed. {where}")
    return Prose(table + "These runs are a small proxy on the CPU (the small course model, with the learning rate "
                 "and batch said below the figure), so this locates the failure of the proxy, not of the full-size "
                 f"record. {where}")


def divergence_facts(div: Fp16Divergence, course_lr: float, course_batch: int | None = None) -> dict[str, object]:
    """The run's learning rate and batch against the course's usual ones (``div_lr_text``), its steps, seeds and
    steps between probes, FP16's largest value, the outcomes, the located operation and the verdict as
    Markdown."""
    return {"div_lr_text": learning_rate_sentence(div, course_lr, course_batch), "div_probe_every": div.probe_every,
            "div_steps": div.steps, "div_seeds": len({run.seed for run in div.runs}),
            "fp16_max": f"{FP16_MAX:,.0f}",
            "div_outcomes": divergence_outcomes(div), "div_located": located_sentence(div),
            "div_verdict": divergence_verdict(div)}


def recorded_divergence_note(div: Fp16Divergence, label: str) -> Prose:
    """A recorded run on ``label`` (the hardware): its outcomes, what the locator named, and the re-run
    table when a step failed."""
    outcomes = divergence_outcomes(div)
    parts = [f"On **{label}**, " + outcomes[0].lower() + outcomes[1:], located_sentence(div),
             divergence_verdict(div)]
    if div.replays:
        parts.append(replay_table(div).rstrip("\n"))
    return Prose("\n\n".join(parts))
