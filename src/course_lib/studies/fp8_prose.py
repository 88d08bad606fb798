"""Lesson 7's facts, phrases and tables: what the FP8 studies measured, under the names the prose glues."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..formats import get_format
from ..formats.tables import exact_number
from ..fp8.accumulation import AccumulationStudy
from ..fp8.roofline import Fp8LinearEstimate, predict_fp8_linear
from ..glue import Prose, and_list, count_word, power_of_two_text
from ..hardware import DATASHEET_PEAKS, GPUPeaks
from ..tables import MarkdownTable, markdown_table
from .fp8 import (
    CURRENT_SCALING_CAST,
    DEEPSEEK_TILE,
    KNOWN_SCALE_CAST,
    TORCH_CAST,
    Fp8Training,
    LinearTensors,
    OutlierSweep,
    ScalingLab,
    SpikeRun,
)
from .fp8_recorded import percent_text
# lesson 7's speed prose lives in .fp8_speed_prose; the lesson and its tests take it from here too
from .fp8_speed_prose import (  # noqa: F401
    BF16_LAYER, COURSE_LAYER, ONE_PASS_CASTS_SINCE, bf16_slower_than_larger, compiled_prediction_note,
    compiled_speed_facts, compiled_speed_table, course_layer_note, crossing_phrase, fp8_bound, fp8_pays_note,
    fp8_pays_takeaway, gpu_pointer, layer_profile_facts, layer_profile_table, linear_record_note,
    linear_speed_facts, linear_speed_table, product_ratios, recorded_linear_speed_summary,
    recorded_linear_speed_table, speed_limits_note, speedup_facts
)
from .training_prose import BASELINE, loss_differences


def format_facts() -> dict[str, object]:
    """Largest finite value, smallest subnormal, epsilon and binades of E4M3 and E5M2
    (``e4m3_max``, ``e4m3_tiny``, ``e4m3_eps``, ``e4m3_binades``, and the same for ``e5m2``), and the smallest
    subnormal and epsilon written exactly, as powers of two in superscript digits (``e4m3_tiny_text``,
    ``e4m3_eps_text``, ... : 2⁻⁹, :func:`~course_lib.glue.power_of_two_text`; glued Markdown renders no
    ``$`` math)."""
    facts: dict[str, object] = {}
    for name in ("e4m3", "e5m2"):
        f = get_format(name)
        facts.update({f"{name}_max": f.max_finite, f"{name}_tiny": f.min_subnormal, f"{name}_eps": f.epsilon,
                      f"{name}_binades": f.binades, f"{name}_tiny_text": Prose(_power_text(f.min_subnormal)),
                      f"{name}_eps_text": Prose(_power_text(f.epsilon))})
    return facts


def _power_text(value: float) -> str:
    """A power of two in superscript digits (2⁻⁹); any other value as the format tables write it."""
    mantissa, exponent = math.frexp(value)
    return power_of_two_text(exponent - 1) if mantissa == 0.5 else exact_number(value)


def tensor_facts(tensors: LinearTensors) -> dict[str, object]:
    """The captured layer and its training steps, the output gradient's median magnitude, and the share
    (percent) of its values below E4M3's smallest subnormal."""
    grad = tensors.grad_output
    below = float((grad.abs() < get_format("e4m3").min_subnormal).float().mean())
    return {"lab_steps": tensors.steps, "lab_layer": tensors.layer, "grad_median": float(grad.abs().median()),
            "grad_below_e4m3": 100 * below}


def lab_facts(lab: ScalingLab) -> dict[str, object]:
    """The scaling lab on the gradient (percent flushed without and with a per-tensor scale; relative error
    in percent and effective bits of per-tensor E4M3 and E5M2), and the range of relative errors (percent)
    of every scaled E4M3 recipe on every tensor."""
    grad = lab.errors["gradient"]
    e4, e5 = grad["per tensor, E4M3"], grad["per tensor, E5M2"]
    fine = [e.relative_error for t in lab.tensors for r, e in lab.errors[t].items()
            if "E4M3" in r and "no scaling" not in r]
    return {"lab_grad_flushed_unscaled": 100 * grad["no scaling (E4M3)"].flushed,
            "lab_grad_flushed_scaled": 100 * e4.flushed, "lab_e4m3_err": 100 * e4.relative_error,
            "lab_e5m2_err": 100 * e5.relative_error, "lab_bits_e4m3": e4.effective_bits,
            "lab_bits_e5m2": e5.effective_bits, "lab_fine_lo": 100 * min(fine), "lab_fine_hi": 100 * max(fine)}


def _factor_index(sweep: OutlierSweep, factor: float) -> int:
    if factor not in sweep.factors:
        raise ValueError(f"the outlier sweep has no factor {factor:g}; it ran {sweep.factors}")
    return sweep.factors.index(factor)


def outlier_facts(sweep: OutlierSweep, block: int) -> dict[str, object]:
    """Percent of the other channels flushed by an outlier channel 1,000x (per tensor) and 100,000x
    (per tensor, per row, per column, 1 x ``block`` tiles) larger than the rest."""
    i3, i5 = _factor_index(sweep, 1e3), _factor_index(sweep, 1e5)
    flushed = sweep.flushed
    return {"out_factor_1e3": sweep.factors[i3], "out_factor_1e5": sweep.factors[i5],
            "out_tensor_1e3": 100 * flushed["per tensor, E4M3"][i3],
            "out_tensor_1e5": 100 * flushed["per tensor, E4M3"][i5],
            "out_row_1e5": 100 * flushed["per row (token), E4M3"][i5],
            "out_tile_1e5": 100 * flushed[f"1 x {block} tiles, E4M3"][i5],
            "out_col_1e5": 100 * flushed["per column (channel), E4M3"][i5]}


def spike_gain_facts(gains: tuple[float, float], *, spike: float | None = None) -> dict[str, object]:
    """The range of the spike study's step-to-step gain (``studies.fp8.SPIKE_GAINS``) as ``spike_gain_lo``
    and ``spike_gain_hi``; with a ``spike`` factor, the worst jump it can make over a history of quiet
    steps (every one at ``lo``, the spike step at ``hi``: ``spike_worst``) and the margin that absorbs it
    (``spike_worst_margin``)."""
    lo, hi = gains
    if not 0 < lo <= hi:
        raise ValueError(f"gains must be a range (lo, hi) with 0 < lo <= hi, got {gains!r}")
    facts: dict[str, object] = {"spike_gain_lo": lo, "spike_gain_hi": hi}
    if spike is not None:
        if not (math.isfinite(spike) and spike > 1):
            raise ValueError(f"spike must be a factor above 1, got {spike!r}")
        worst = spike * hi / lo
        facts.update({"spike_worst": worst, "spike_worst_margin": math.ceil(math.log2(worst))})
    return facts


def spike_facts(spike: SpikeRun) -> dict[str, object]:
    """Delayed scaling (history reduced by "max") against current scaling at an amax spike: percent
    saturated and relative error (percent) at the spike, the worst error over the history that follows
    it, and the error the step before."""
    delayed = [k for k in spike.relative_error if k.startswith("delayed, max of ")]
    if len(delayed) != 1:
        raise ValueError(f"expected one 'delayed, max of N' recipe, got {delayed}")
    key, at = delayed[0], spike.spike_at
    history = int(key.removeprefix("delayed, max of "))
    if not 1 <= at < len(spike.amax) - 1:
        raise ValueError(f"the spike (step {at}) needs a step before and after it in {len(spike.amax)} steps")
    after = spike.relative_error[key][at + 1: at + history + 1]   # the steps whose history holds the spike
    bumps = recent_bumps_note(spike) if "delayed, most recent" in spike.relative_error else Prose("")
    return {"spike_bumps": bumps,
            "spike_factor": spike.factor, "spike_at": at, "spike_history": history,
            "spike_sat_delayed": 100 * spike.saturated[key][at],
            "spike_err_delayed": 100 * spike.relative_error[key][at],
            "spike_err_current": 100 * spike.relative_error["current"][at],
            "spike_sat_current": 100 * max(spike.saturated["current"]),
            "spike_after_max": 100 * max(after),
            "spike_before": 100 * spike.relative_error[key][at - 1]}


def recent_bumps_note(spike: SpikeRun, *, recipe: str = "delayed, most recent", above: float = 1.1) -> Prose:
    """Why ``recipe``'s error rises at quiet steps after the spike: the steps (past the one right after the
    spike, which carries the spike's own amax) where its relative error exceeds ``above`` times its median
    over those steps, each with the amax's growth over the step before (a scale from an older amax is too
    large for a grown tensor, so its largest values saturate) and the share saturated. "" where none does."""
    if recipe not in spike.relative_error:
        raise ValueError(f"the run has no recipe {recipe!r}; it ran {list(spike.relative_error)}")
    if not above > 1:
        raise ValueError(f"above must exceed 1, got {above!r}")
    steps = range(spike.spike_at + 2, len(spike.amax))
    errors = [spike.relative_error[recipe][t] for t in steps]
    if not errors:
        return Prose("")
    ordered = sorted(errors)
    median = ordered[len(ordered) // 2]
    bumps = [t for t in steps if spike.relative_error[recipe][t] > above * median]
    if not bumps:
        return Prose("")
    parts = [f"step {t}: the amax grew {spike.amax[t] / spike.amax[t - 1]:.2f}x over the step before, and "
             f"{percent_text(spike.saturated[recipe][t])}% of the values saturated" for t in bumps]
    grew = all(spike.amax[t] > spike.amax[t - 1] for t in bumps)
    why = (" A scale from the previous step's amax is too large for a tensor that has grown since, so its largest "
           "values saturate; a history reduced by \"max\" keeps headroom from earlier, larger steps." if grew else "")
    name = recipe.removeprefix("delayed, ")
    where = f"step {bumps[0]}" if len(bumps) == 1 else f"steps {and_list([str(t) for t in bumps])}"
    return Prose(f"Later, the \"{name}\" line's error rises at {where}, more than "
                 f"{100 * (above - 1):.0f}% above its median ({'; '.join(parts)}).{why}")


def margin_facts(plain: SpikeRun, with_margin: SpikeRun, margin: int) -> dict[str, object]:
    """The same spike cast by delayed scaling (history reduced by "max") without a margin (``plain``) and
    with ``margin`` (``with_margin``): percent saturated at the spike, and the quiet steps' (those before
    the spike) mean relative error and flushed share, in percent, each way; and a phrase on whether the
    margin's cost to the quiet steps stays small (their error at most doubles) or not."""
    keys = []
    for run in (plain, with_margin):
        delayed = [k for k in run.relative_error if k.startswith("delayed, max of ")]
        if len(delayed) != 1:
            raise ValueError(f"expected one 'delayed, max of N' recipe, got {delayed}")
        keys.append(delayed[0])
    if (plain.spike_at, plain.factor, plain.amax) != (with_margin.spike_at, with_margin.factor, with_margin.amax):
        raise ValueError("the two runs must cast the same tensors (same spike step, factor and amaxes)")
    at = plain.spike_at
    if at < 1:
        raise ValueError(f"the spike (step {at}) needs quiet steps before it")

    def quiet(values):
        return 100 * sum(values[:at]) / at

    err0, err = quiet(plain.relative_error[keys[0]]), quiet(with_margin.relative_error[keys[1]])
    # judged at the two decimals the page prints the errors to, so that the verdict reads true beside them
    verdict = ("E4M3's range absorbs the margin: the quiet steps' error did not change at these decimals"
               if f"{err:.2f}" == f"{err0:.2f}" else
               "E4M3's range absorbs the margin: the quiet steps' error did not double" if err <= 2 * err0 else
               "Here the margin costs the quiet steps: their error more than doubled")
    sat = 100 * with_margin.saturated[keys[1]][at]
    return {"ex_m_margin": margin,
            "ex_m_sat0": 100 * plain.saturated[keys[0]][at], "ex_m_sat": sat,
            "ex_m_sat_text": Prose("none" if sat == 0 else f"{sat:.2g}%"),
            "ex_m_err0": err0, "ex_m_err": err,
            "ex_m_flush0": quiet(plain.flushed[keys[0]]), "ex_m_flush": quiet(with_margin.flushed[keys[1]]),
            "ex_m_verdict": Prose(verdict)}


def cast_cost_table(times: Mapping[str, float], again: Mapping[str, float] | None = None) -> MarkdownTable:
    """Milliseconds per cast of :func:`~course_lib.studies.fp8.time_scaled_casts`, and each as a multiple
    of torch's own cast and of the cast with a known scale (the prose's yardstick); with ``again``, a second
    timing of the same casts, both timings, each with its ratios."""
    rows = []
    for label, t in ((None, times),) if again is None else (("first", times), ("again", again)):
        base, known = t[TORCH_CAST], t.get(KNOWN_SCALE_CAST)
        rows += [[k if label is None else f"{k}, {label}", f"{1e3 * v:.2f}", f"{v / base:.2f}",
                  "" if known is None else f"{v / known:.2f}"] for k, v in t.items()]
    return markdown_table(["", "ms", "x torch cast", "x scale known"], rows)


def cast_cost_facts(times: Mapping[str, float], again: Mapping[str, float], *, device: object) -> dict[str, object]:
    """``cost_current``: current scaling's time over the cast with a known scale in ``times``; ``cost_noise``:
    how far (%) the two medians of the known-scale cast or of current scaling, in ``times`` and in a second
    timing, ``again``, lay apart at most (the larger over the smaller, as the table prints them); ``cost_phrase``, the
    sentence's verb phrase, which counts a difference within that noise as none; ``cost_where``, where the
    sentence's timing ran ("Here (on this CPU)", from ``device``, a torch device or its name); and
    ``cost_device_note``: off a GPU, that a GPU's cast costs differently."""
    for name, t in (("times", times), ("again", again)):
        missing = [k for k in (KNOWN_SCALE_CAST, CURRENT_SCALING_CAST) if k not in t]
        if missing:
            raise ValueError(f"{name} lacks the timing of {missing}")
    ratio = times[CURRENT_SCALING_CAST] / times[KNOWN_SCALE_CAST]
    ratios = (ratio, again[CURRENT_SCALING_CAST] / again[KNOWN_SCALE_CAST])
    # the two casts the ratio compares, each timed twice, as the table prints them (ms, two decimals): the larger
    # of each pair over the smaller, so that a reader gets the same percentage whichever timing they start from.
    # Torch's own cast is not in the ratio, so how far its timings moved is not this ratio's noise.
    shown = {k: sorted((round(1e3 * times[k], 2), round(1e3 * again[k], 2)))
             for k in (KNOWN_SCALE_CAST, CURRENT_SCALING_CAST)}
    moves = {k: 100 * (hi / lo - 1) if lo > 0 else 100 * abs(again[k] / times[k] - 1) for k, (lo, hi) in shown.items()}
    worst = max(moves, key=lambda k: moves[k])
    noise = moves[worst]
    # two significant digits below 10%, so that a nonzero noise never reads 0%
    noise_text = f"{noise:.2g}" if noise < 10 else f"{noise:.0f}"
    took = (f"takes {ratios[0]:.2f} and {ratios[1]:.2f} times as long as the cast with a known scale in the two "
            "timings (the table shows both)")
    differed = f"the {noise_text}% by which the two timings of either cast differed at most ({worst})"
    # a verdict only where both timings agree on it: each ratio beyond the noise, on the same side
    if min(ratios) - 1 > noise / 100:
        phrase = (f"{took}, each more than {differed}: that is the price of the extra pass (an upper bound on it: "
                  "delayed scaling still records each amax, in the same pass on a GPU)")
    elif 1 - max(ratios) > noise / 100:
        phrase = (f"{took}: less, which an extra pass cannot cause, each by more than {differed}. The medians "
                  "come from separate timed loops, so the machine's state between them, not the amax pass, decided "
                  "this difference")
    elif all(abs(r - 1) <= noise / 100 for r in ratios):
        phrase = f"{took}, within {differed}: on this device the extra pass does not show"
    else:
        phrase = (f"{took}: one ratio lies beyond {differed}, the other within it, so these timings do not settle "
                  "what the extra pass costs on this device")
    kind = str(device).split(":")[0]
    if not kind or kind == "None":
        raise ValueError(f"device must name where the casts were timed, got {device!r}")
    where = {"cpu": "CPU", "cuda": "GPU"}.get(kind, f"{kind} device")
    note = "" if kind == "cuda" else (
        "A GPU's cast is bound by memory bandwidth, not by arithmetic, so there the extra pass costs what its extra "
        f"read of the tensor costs in bandwidth, which this {where} timing does not measure.")
    return {"cost_current": ratio, "cost_noise": noise, "cost_phrase": Prose(phrase),
            "cost_where": Prose(f"Here (on this {where})"), "cost_device_note": Prose(note)}


def backend_facts(recipe: str, same: bool) -> dict[str, object]:
    """The recipe the two backends ran (as code) and whether their outputs and gradients were identical."""
    return {"backend_recipe": Prose(f"`{recipe}`"),
            "backends_same": Prose("**identical**" if same else "**different**")}


def tile_note(block: int, width: int) -> Prose:
    """This page's tile side ``block`` and why (the prose puts "here" before it): DeepSeek-V3's own where it
    divides the model's ``width``, a smaller one where it does not."""
    if block == DEEPSEEK_TILE:
        return Prose(f"the same {block}")
    if width % DEEPSEEK_TILE == 0:
        return Prose(f"{block}")
    if DEEPSEEK_TILE > width:
        return Prose(f"{block}, because {DEEPSEEK_TILE} is wider than the model's width of {width}")
    return Prose(f"{block}, because {DEEPSEEK_TILE} does not divide the model's width of {width}")


def torchao_agreement(agree: bool) -> Prose:
    """How the course's quantisation compares with torchao's: "bit for bit" or "not exactly" (bold)."""
    return Prose("**bit for bit**" if agree else "**not exactly**")


def unscaled_seed_facts(result: Fp8Training, unscaled: str = "unscaled") -> dict[str, object]:
    """The ``unscaled`` recipe's final loss against BF16's, seed by seed: on which side of BF16 it ended in
    how many seeds, by how much in each, and whether every gap lies beyond the scaled recipes' (all but BF16
    and ``unscaled``) in every seed (``train_unscaled_seeds``, a sentence; ``train_unscaled_short``, a
    clause for the takeaways)."""
    diffs = loss_differences(result)
    scaled = [r for r in result.recipes if r not in (BASELINE, unscaled)]
    if unscaled not in diffs or not scaled:
        raise ValueError(f"need {unscaled!r} and at least one scaled recipe beside {BASELINE!r}")
    gaps, n = diffs[unscaled], len(result.seeds)
    lo, hi = min(min(diffs[r]) for r in scaled), max(max(diffs[r]) for r in scaled)
    above = sum(g > 0 for g in gaps)
    every = {1: "its one seed", 2: "both seeds"}.get(n, f"all {count_word(n)} seeds")
    side = (f"above BF16 in {every}" if above == n else f"below BF16 in {every}" if above == 0 else
            f"above BF16 in {count_word(above)} of {count_word(n)} seeds")
    out = [s for s, g in zip(result.seeds, gaps) if g > hi or g < lo]
    span = f"({lo:+.3f} to {hi:+.3f})"
    if len(out) == n:
        beyond, short = (f"each gap lies beyond every scaled recipe's in every seed {span}",
                         "beyond every scaled recipe's gap")
    elif out:
        which = ("seed " if len(out) == 1 else "seeds ") + and_list([str(s) for s in out])
        rest = n - len(out)
        beyond, short = (f"{count_word(len(out))} of them ({which}) {'lies' if len(out) == 1 else 'lie'} beyond the "
                         f"scaled recipes' range {span}, the other{'' if rest == 1 else 's'} within it",
                         "only partly beyond the scaled recipes' gaps")
    else:
        beyond, short = (f"every gap lies within the scaled recipes' range {span}",
                         "within the scaled recipes' gaps")
    seeds = and_list([str(s) for s in result.seeds])
    seeds = f"seed {seeds}" if n == 1 else f"seeds {seeds} in turn"
    return {"train_unscaled_seeds": Prose(
                f"FP8 without scales ended {side}, by {and_list([f'{g:+.3f}' for g in gaps])} ({seeds}): {beyond}."),
            "train_unscaled_short": Prose(f"unscaled FP8 ended {side}, {short}")}


# ---- accumulation and speed ----------------------------------------------------------------------------

def accumulation_facts(studies: Mapping[str, AccumulationStudy], *, k: int = 4096,
                       reported_percent: float = 2.0) -> dict[str, object]:
    """Per rounding model (``studies["toward_zero"]``, ``studies["nearest_even"]``): the largest relative
    error (percent) at length ``k`` of the limited accumulator, without and with promotion to FP32; and
    whether DeepSeek-V3's ``reported_percent`` lies between the two models' figures."""
    facts: dict[str, object] = {}
    worst = {}
    for rounding in ("toward_zero", "nearest_even"):
        s = studies[rounding]
        if k not in s.ks:
            raise ValueError(f"the {rounding} study has no K = {k}; it ran {s.ks}")
        i, bits = s.ks.index(k), s.accumulator_bits
        worst[rounding] = 100 * s.errors[f"{bits}-bit accumulator"][i][1]
        facts[f"acc_{rounding}_{k}"] = worst[rounding]
        promoted = s.errors[f"{bits}-bit, promoted to FP32 every {s.promote_every}"]
        facts[f"acc_{rounding}_promoted"] = 100 * promoted[i][1]
    between = worst["nearest_even"] < reported_percent < worst["toward_zero"]
    facts["acc_vs_deepseek"] = Prose("lies between the two models' figures" if between else
                                     "lies outside both models' figures")
    return facts


COPES_BELOW = 0.05   # per-tensor scaling "copes" with a 1,000x outlier that flushes less than this share

@dataclass(frozen=True)
class OverflowCasts:
    """What unscaled casts past a format's largest value give: 1000 to E4M3 (max 448) in torch and in
    ml_dtypes, and a million to E5M2 (max 57344) in torch; with the versions that did it."""

    torch_version: str
    torch_e4m3_1000: float
    ml_dtypes_version: str
    ml_dtypes_e4m3_1000: float
    torch_e5m2_1e6: float


def fp8_errata_rows(overflow: OverflowCasts, sweep: OutlierSweep, *, block: int,
                    estimates: Mapping[str, Sequence[Fp8LinearEstimate]],
                    measured: Mapping[str, Mapping[int, float]], recorded_sweep: OutlierSweep | None = None,
                    recorded_where: str = "") -> list[tuple[str, str]]:
    """Lesson 7's errata, (claim, what was measured) pairs: datasheet peaks of the L4, the RTX 4090 and the
    H100; the recorded product ratio at 8192 and the roofline's largest layer; ``overflow``; and the outlier
    sweep's per-tensor flushing at 1,000x and 100,000x, here and, with ``recorded_sweep``, as recorded
    (``recorded_where``: see :func:`~course_lib.studies.fp8_recorded.record_where`). It "copes with a lot"
    while a 1,000x outlier flushes under :data:`COPES_BELOW` of the other values in both."""
    l4, rtx, h100 = DATASHEET_PEAKS["L4"], DATASHEET_PEAKS["RTX 4090"], DATASHEET_PEAKS["H100 SXM5"]
    h100_fp8, h100_bf16 = h100.peak("fp8"), h100.peak("bf16")
    if h100_fp8 is None or h100_bf16 is None:
        raise ValueError("the H100's datasheet entry lacks its FP8 or BF16 peak")
    largest = estimates["tensorwise"][-1]
    rec = product_ratios(measured)
    flushed = sweep.flushed["per tensor, E4M3"]
    i3, i5 = _factor_index(sweep, 1e3), _factor_index(sweep, 1e5)
    at_1e3, at_1e5, there = flushed[i3], flushed[i5], ("", "")
    tiles = sweep.flushed[f"1 x {block} tiles, E4M3"][i5]
    if recorded_sweep is not None:
        shares = recorded_sweep.flushed["per tensor, E4M3"]
        r3, r5 = shares[_factor_index(recorded_sweep, 1e3)], shares[_factor_index(recorded_sweep, 1e5)]
        there = (f" ({percent_text(r3)}% recorded {recorded_where})", f" ({percent_text(r5)}% recorded)")
        at_1e3 = max(at_1e3, r3)
    copes = "In E4M3 it copes with a lot" if at_1e3 < COPES_BELOW else "In E4M3 it copes with small outliers only"
    return [
        ("FP8 needs Hopper.",
         f"Ada GPUs (compute capability 8.9) have FP8 tensor cores: the L4's datasheet lists {l4.peak('fp8'):g} "
         f"dense FP8 TFLOP/s and the RTX 4090's {rtx.peak('fp8'):g} (with FP32 accumulation); Transformer Engine "
         "supports FP8 on 8.9 {cite:p}`nvidia_te`. (Blockwise scaling in software, DeepSeek-V3's tiles and blocks, "
         "was built for 9.0 (Hopper) kernels {cite:p}`deepseek2024v3`; among NVIDIA GPUs, hardware block-scaled "
         "(MX) products need Blackwell: compute capability 10.x (B200, B300) or 12.0 and 12.1 (sm_120, sm_121: "
         "GeForce and DGX Spark); AMD's CDNA4 has them too, {doc}`08_microscaling`.)"),
        ("FP8 training is 4-6x faster than BF16.",
         f"The dense FP8 peak is {h100_fp8 / h100_bf16:.1f}x BF16's ({h100_fp8:g} against {h100_bf16:g} TFLOP/s on "
         f"an H100); one recorded H100 product reached {rec.get(8192, float('nan')):.2f}x; the roofline above "
         f"predicts {largest.speedup:.2f}x for a {largest.m}-wide layer with its casts. End to end, torchao "
         "reports up to 1.5x (405B parameters, 512 GPUs) and about 1.25x (8B, 8 GPUs) {cite:p}`torchao_float8`; "
         "Transformer Engine's Llama tutorial reports 226 ms per FP8 step: 1.39x against Hugging Face's BF16 "
         "model (315 ms), and 1.12x against its own BF16 model (252 ms) {cite:p}`nvidia_te_llama`."),
        ("An FP8 overflow becomes NaN.",
         f"It depends on the library and the format. This torch ({overflow.torch_version}) casts 1000 to E4M3 as "
         f"{overflow.torch_e4m3_1000:g} (it saturates); ml_dtypes ({overflow.ml_dtypes_version}) gives "
         f"{overflow.ml_dtypes_e4m3_1000:g}; torchao's source notes that torch 2.11 and older do not saturate "
         f"either. E5M2 rounds a million to {overflow.torch_e5m2_1e6:g}. FP8 recipes clamp to ±max before the "
         "cast, so none of this reaches a product."),
        ("Gradients always use E5M2.",
         "Transformer Engine's HYBRID and torchao's tensorwise do; torchao's rowwise recipes and DeepSeek-V3 use "
         "E4M3 everywhere, relying on finer scales for range {cite:p}`deepseek2024v3`."),
        ("Per-tensor scaling cannot cope with outlier channels.",
         f"{copes}: a 1,000x outlier channel flushed {percent_text(flushed[i3])}% of the other values of this "
         f"page's activation{there[0]}; it is at 100,000x that {percent_text(at_1e5)}%{there[1]} go. "
         f"Per-token scales help little (the outlier section above); 1 x {block} tiles flush fewer, "
         f"{percent_text(tiles)}% at 100,000x, but not none."),
    ]


def exercise_facts(gpu: GPUPeaks, *, spike: float = 50.0) -> dict[str, object]:
    """The exercises' answers: the roofline for a 4096 x 4096 x 1024 layer on ``gpu`` (speedup, percent of
    the FP8 time spent casting, the products' own gain), its operands' sizes (millions of elements), and
    the delayed-scaling margin that absorbs a ``spike``-fold jump, with its headroom."""
    bf16, fp8 = gpu.peak("bf16"), gpu.peak("fp8")
    if bf16 is None or fp8 is None:
        raise ValueError(f"{gpu.name} lists no BF16 or no FP8 tensor-core peak")
    if not (math.isfinite(spike) and spike > 1):
        raise ValueError(f"spike must be a factor above 1, got {spike!r}")
    layer = predict_fp8_linear(4096, 4096, 1024, bf16_tflops=bf16, fp8_tflops=fp8, bandwidth_gbs=gpu.bandwidth_gbs)
    margin = math.ceil(math.log2(spike))
    return {"ex_speedup": layer.speedup, "ex_cast_share": 100 * layer.fp8_cast_s / layer.fp8_s,
            "ex_gemm_gain": layer.bf16_s / layer.fp8_gemm_s, "ex_elems_x": 4096 * 4096 / 1e6,
            "ex_elems_w": 4096 * 1024 / 1e6, "ex_margin": margin, "ex_headroom": 2 ** margin}

