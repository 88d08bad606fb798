"""The short training runs lessons 7 and 8 compare with BF16 autocast (:class:`~course_lib.studies.fp8.Fp8Training`):
each seed's final loss against BF16's from the same seed, which recipes kept one sign, how much a few seeds can
tell, and what the page's run is beside a recorded GPU run."""

from __future__ import annotations

from collections.abc import Sequence

from ..glue import Prose, and_list, count_word, one_sign_odds
from ..tables import MarkdownTable, markdown_table
from .fp8 import FINAL_TAIL, Fp8Training

BASELINE = "bf16_autocast"


def check_training(result: object) -> Fp8Training:
    """``result`` itself when it is an :class:`Fp8Training`; TypeError naming what it is otherwise."""
    if not isinstance(result, Fp8Training):
        raise TypeError(f"expected an Fp8Training (the result of fp8_training or mx_training), got "
                        f"{type(result).__name__}")
    return result


def loss_differences(result: Fp8Training, baseline: str = BASELINE) -> dict[str, tuple[float, ...]]:
    """Per recipe, each seed's final loss minus ``baseline``'s from the same seed."""
    check_training(result)
    if baseline not in result.recipes:
        raise ValueError(f"baseline {baseline!r} did not run; recipes: {result.recipes}")
    base = result.final(baseline)
    return {r: tuple(a - b for a, b in zip(result.final(r), base)) for r in result.recipes}


def final_loss_table(result: Fp8Training, baseline: str = BASELINE) -> MarkdownTable:
    """One row per recipe: its final loss per seed, and minus ``baseline``'s from the same seed."""
    diffs = loss_differences(result, baseline)
    return markdown_table(["recipe", f"final loss per seed (mean of the last {min(FINAL_TAIL, result.steps)} steps)",
                           "minus BF16 (same seed)"],
                          # four decimals: a gap below 0.0005 printed "-0.000", a sign the reader could not see
                          [[r, ", ".join(f"{v:.3f}" for v in result.final(r)),
                            ", ".join(f"{d:+.4f}" for d in diffs[r])] for r in result.recipes])


def seed_consistency(above: Sequence[str], below: Sequence[str], mixed: Sequence[str]) -> Prose:
    """Which recipes ended above the baseline in every seed, below it in every seed, or changed sign (names
    in code font: the sentence may start with one)."""
    def code(names: Sequence[str]) -> str:
        return and_list([f"`{n}`" for n in names])
    return Prose((f"{code(above)} ended above BF16 in every seed; " if above else "")
                 + (f"{code(below)} ended below it in every seed; " if below else "")
                 + (f"{code(mixed)} changed sign from seed to seed." if mixed else
                    "no scaled recipe changed sign."))


def seed_facts(result: Fp8Training) -> dict[str, object]:
    """How many seeds each recipe ran (in words, ``train_seeds``), the steps a final loss averages
    (``train_tail``), and how often a recipe no different from BF16 would keep one sign over that many seeds
    by chance (``train_sign_chance``: a sentence)."""
    n = len(check_training(result).seeds)
    if n < 1:
        raise ValueError("the training ran no seed")
    # "weak" below six seeds: by chance one time in 16 or more often, more than the usual 5% level
    if n == 1:
        chance = "With one seed every recipe ends on one side of BF16, so this is no evidence"
    else:
        chance = (f"With {count_word(n)} seeds, a recipe no different from BF16 would still end on the same side "
                  f"of it in every seed one time in {count_word(one_sign_odds(n))}, so this is "
                  f"{'weak ' if n < 6 else ''}evidence")
    return {"train_seeds": Prose(count_word(n)), "train_tail": min(FINAL_TAIL, result.steps),
            "train_sign_chance": Prose(chance)}


def recorded_training_note(recorded: bool, *, full_size: bool = False) -> Prose:
    """What this page's run is beside the recorded GPU run: at the full profile (``full_size``) the same
    experiment, else short runs of a small model; and whether a record exists."""
    if full_size:
        return Prose("This page ran the full-size experiment; "
                     + ("the recorded GPU run below is the same experiment on the GPU that recorded it." if recorded
                        else "no GPU run of it is recorded yet (the command is below)."))
    if recorded:
        return Prose("These are short runs of a small model; the recorded GPU run below trains the full-size "
                     "model longer.")
    return Prose("These are short runs of a small model; no longer GPU run is recorded yet (the command is "
                 "below).")


def fp8_training_facts(result: Fp8Training, *, recorded: bool, full_size: bool = False,
                       unscaled: str = "unscaled", skip_steps: int = 10) -> dict[str, object]:
    """Steps, BF16's mean final loss, the unscaled recipe's mean gap to BF16, the range of the scaled
    recipes' per-seed gaps, which recipes kept one sign, and the worst loss after ``skip_steps`` steps of
    the unscaled recipe and of BF16."""
    diffs = loss_differences(result)
    bf16 = result.final(BASELINE)
    scaled = [r for r in result.recipes if r not in (BASELINE, unscaled)]
    if not scaled or unscaled not in result.recipes:
        raise ValueError(f"need {unscaled!r} and at least one scaled recipe beside {BASELINE!r}")
    above = [r for r in scaled if min(diffs[r]) > 0]
    below = [r for r in scaled if max(diffs[r]) < 0]
    mixed = [r for r in scaled if r not in above and r not in below]
    return {"train_steps": result.steps, "train_bf16": sum(bf16) / len(bf16),
            "train_unscaled_gap": sum(diffs[unscaled]) / len(diffs[unscaled]),
            "train_scaled_lo": min(min(diffs[r]) for r in scaled),
            "train_scaled_hi": max(max(diffs[r]) for r in scaled),
            "train_consistent": seed_consistency(above, below, mixed),
            "train_unscaled_peak": max(max(c[skip_steps:]) for c in result.curves[unscaled]),
            "train_bf16_peak": max(max(c[skip_steps:]) for c in result.curves[BASELINE]),
            "train_skip": skip_steps, "train_recorded_note": recorded_training_note(recorded, full_size=full_size),
            **seed_facts(result)}
