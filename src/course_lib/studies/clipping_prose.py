"""What lesson 3's clipping section says of its runs (``studies.clipping``): facts, phrases and tables from
the measured results, each a tested function."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from ..glue import Prose, and_list, power_of_two_text
from ..tables import MarkdownTable, markdown_table
from ..scaling.clipping import AGC_EPS
from .clipping import (
    AGC,
    EDITS,
    GLOBAL_NORM,
    NO_CLIPPING,
    NO_SPIKES,
    PER_TENSOR,
    PER_VALUE,
    SIZES,
    EditOrder,
    OverflowStep,
    SpikyRuns,
)

def _log2(scale: float) -> int:
    return int(round(math.log2(scale)))


def _spread(values: Sequence[float]) -> tuple[float, float, float]:
    return sum(values) / len(values), min(values), max(values)   # mean, lowest, highest over seeds


def compare_ranges(values: Sequence[float], reference: Sequence[float]) -> str:
    """``"above"`` when every value lies above every reference value, ``"below"`` when every one lies
    below, else ``"within"``: with a few seeds, only ranges that do not overlap say more than seed noise.
    A non-finite value (a run that diverged) counts as above."""
    if not values or not reference:
        raise ValueError("compare_ranges needs at least one value on each side")
    big = [v if math.isfinite(v) else math.inf for v in values]
    ref = [v if math.isfinite(v) else math.inf for v in reference]
    if min(big) > max(ref):
        return "above"
    if max(big) < min(ref):
        return "below"
    return "within"


def range_relation(values: Sequence[float], reference: Sequence[float]) -> str:
    """Where ``values`` lie against ``reference`` over seeds: ``"above"`` or ``"below"`` every reference
    value (:func:`compare_ranges`), ``"inside"`` its range (lowest to highest, ends included), or else
    ``"overlapping"``: the ranges share values but some value lies outside the reference's range."""
    verdict = compare_ranges(values, reference)
    if verdict != "within":
        return verdict
    lo, hi = min(reference), max(reference)
    return "inside" if all(lo <= v <= hi for v in values) else "overlapping"


def seed_ratio_facts(without: Sequence[float], clipped: Sequence[float]) -> dict[str, object]:
    """Seed by seed (same batches and initial weights), the final loss without clipping over the same seed's
    with global-norm clipping: lowest and highest ratio (``clip_seed_ratio_lo``/``_hi``, over the seeds
    where both are finite) and a sentence (``clip_seed_ratios``). Per seed, not a ratio of means: one
    seed's large loss would carry a mean, and the body compares ranges over seeds."""
    if len(without) != len(clipped) or not without:
        raise ValueError(f"need one final loss per seed on each side, got {len(without)} and {len(clipped)}")
    pairs = [(a, b) for a, b in zip(without, clipped) if math.isfinite(a) and math.isfinite(b) and b > 0]
    diverged = sum(1 for a in without if not math.isfinite(a))
    tail = f"; {diverged} of {len(without)} seeds without clipping diverged" if diverged else ""
    if not pairs:
        return {"clip_seed_ratio_lo": math.nan, "clip_seed_ratio_hi": math.nan,
                "clip_seed_ratios": Prose(f"No seed ended with a finite loss on both sides{tail}.")}
    ratios = [a / b for a, b in pairs]
    lo, hi = min(ratios), max(ratios)
    span = f"{lo:.2g} times" if len(ratios) == 1 or f"{lo:.2g}" == f"{hi:.2g}" else f"{lo:.2g} to {hi:.2g} times"
    side = "" if lo > 1 or hi < 1 else ", above it in some seeds and below in others"
    return {"clip_seed_ratio_lo": lo, "clip_seed_ratio_hi": hi, "clip_seed_ratios": Prose(
        f"Seed by seed (same batches, same initial weights), the final held-out loss without clipping was {span} "
        f"the same seed's with global-norm clipping{side}{tail}.")}


# the rules as a sentence names them (the study's labels name them in tables and legends)
RULE_PHRASES = {GLOBAL_NORM: "global-norm clipping", PER_VALUE: "per-value clipping",
                PER_TENSOR: "per-tensor-norm clipping", AGC: "AGC"}


def _range_text(values: Sequence[float]) -> str:
    """Lowest to highest, four decimals: ranges that are compared must show where they part."""
    return f"{min(values):.4f} to {max(values):.4f}"


def _require(runs: SpikyRuns, *rules: str) -> None:
    missing = [r for r in rules if r not in runs.rules]
    if missing:
        raise ValueError(f"the runs lack {', '.join(missing)}; they have {', '.join(runs.rules)}")


def _ordinary_median(runs: SpikyRuns, rule: str) -> float:
    return statistics.median(n for i in range(len(runs.seeds)) for s, n in enumerate(runs.grad_norms[rule][i])
                             if s not in runs.spike_steps and not runs.skipped[rule][i][s])


def scaler_phrase(runs: SpikyRuns) -> Prose:
    """What the scaler did with the spikes of the runs without clipping: which it skipped (they overflowed
    FP16 at the scale of the time) and which reached the optimizer first."""
    _require(runs, NO_CLIPPING)
    firsts = {runs.passed_spikes(NO_CLIPPING, i)[:1] for i in range(len(runs.seeds))}
    if firsts == {()}:
        return Prose("The scaler skipped every spike: each overflowed FP16 at the scale of the time, so none "
                     "reached the optimizer, and clipping had nothing to stop.")
    if len(firsts) > 1:
        steps = sorted(f[0] for f in firsts if f)
        return Prose(f"The scaler skipped the first spikes, which overflowed FP16 at the scale of the time; "
                     f"which spike first fit under the lowered scale and reached the optimizer depended on the "
                     f"seed (steps {', '.join(map(str, steps))}).")
    step = firsts.pop()[0]
    skipped = [s for s in runs.spike_steps if s < step]
    scales = runs.scales[NO_CLIPPING][0]
    if len(skipped) > 1:
        lead = (f"In every seed the scaler skipped the first {len(skipped)} spikes: each overflowed FP16 at the "
                f"scale of the time (from {power_of_two_text(_log2(scales[skipped[0]]))} down to "
                f"{power_of_two_text(_log2(scales[skipped[-1]]))}), and each back-off halved the scale. ")
    else:
        lead = (f"In every seed the scaler skipped the first spike: it overflowed FP16 at the scale of the time "
                f"({power_of_two_text(_log2(scales[skipped[0]]))}), and the back-off halved the scale. " if skipped else "")
    return Prose(f"{lead}The spike at step {step} fit under {power_of_two_text(_log2(scales[step]))} and reached "
                 "the optimizer.")


def separated_ranges(above: Sequence[float], below: Sequence[float]) -> str:
    """Every seed without clipping (``above``) ended above every seed with it (``below``): whether that is
    beyond seed noise, by the size of the gap against the seeds' own spread, not by the count of seeds (three
    seeds a side separate by chance alone one time in ten). Beyond it when the nearest two final losses lie
    further apart than either rule's seeds do among themselves."""
    if not above or not below:
        raise ValueError("separated_ranges needs at least one final loss on each side")
    gap = min(above) - max(below)
    if not gap > 0:
        raise ValueError(f"the ranges are not separated: the lowest of `above` ({min(above):g}) is not above the "
                         f"highest of `below` ({max(below):g})")
    spread = max(max(above) - min(above), max(below) - min(below))
    chance = math.comb(len(above) + len(below), len(above)) // 2
    head = "every seed without clipping ended above every seed with it"
    if gap > spread:
        return (f"{head}, the nearest two {gap:.3g} apart, more than either rule's seeds lie apart among "
                f"themselves ({spread:.3g} at most): a difference beyond seed noise at this size")
    return (f"{head}, but the nearest two are only {gap:.3g} apart, within the {spread:.3g} either rule's seeds "
            f"span: so few seeds separate that far by chance alone one time in {chance}, so this is a hint, not "
            "yet a difference")


def spike_facts(runs: SpikyRuns) -> dict[str, object]:
    """Part one's facts: the run's size; without clipping, the first spike that reached the optimizer
    (``clip_pass_step``, seed 0's), its gradient norm over the median ordinary step's
    (``clip_spike_norm_ratio``), the loss on the step before it and the highest in the 10 steps after
    (``clip_loss_before``, ``clip_loss_peak``; means over seeds); the final held-out losses' ranges without
    clipping, with global-norm clipping and without spikes, and the verdicts."""
    _require(runs, NO_SPIKES, NO_CLIPPING, GLOBAL_NORM)
    n = len(runs.seeds)
    passed = [runs.passed_spikes(NO_CLIPPING, i) for i in range(n)]
    facts: dict[str, object] = {
        "clip_steps": runs.steps, "clip_seeds": n, "clip_spikes": len(runs.spike_steps),
        "clip_spike_factor": runs.spike_factor, "clip_width": runs.width, "clip_depth": runs.depth,
        "clip_max_norm": runs.thresholds.get(GLOBAL_NORM, math.nan), "clip_scaler": scaler_phrase(runs),
    }
    full_steps, _, full_width, full_seeds = SIZES["full"]
    facts.update(clip_full_steps=full_steps, clip_full_width=full_width, clip_full_seeds=len(full_seeds),
                 clip_jump=Prose(""))
    hit = [(i, p[0]) for i, p in enumerate(passed) if p]
    if hit:
        losses = runs.losses[NO_CLIPPING]
        ratio = sum(runs.grad_norms[NO_CLIPPING][i][s] for i, s in hit) / len(hit) / _ordinary_median(runs, NO_CLIPPING)
        # the highest loss on an ordinary batch within 10 steps after the spike (momentum carries it on)
        peaks = [max((losses[i][t] for t in range(s + 1, min(s + 11, runs.steps)) if t not in runs.spike_steps),
                     default=math.nan) for i, s in hit]
        before, peak = sum(losses[i][s - 1] for i, s in hit) / len(hit), sum(peaks) / len(peaks)
        facts.update(clip_spike_norm_ratio=ratio, clip_pass_step=hit[0][1], clip_loss_before=before,
                     clip_loss_peak=peak, clip_jump=Prose(
                         f"The scaler is no defence against spikes: it skips only those that overflow at the scale "
                         f"of the moment, and each skip lowers the scale until one fits. Without clipping, the first "
                         f"spike to reach the optimizer carried a gradient {ratio:.0f} times the median ordinary "
                         f"step's; the loss went from {before:.2f} on the step before to a peak of {peak:.3g} in the "
                         f"ten steps after (means over {len(hit)} seeds)."))
    means = {}
    for key, rule in (("none", NO_CLIPPING), ("global", GLOBAL_NORM), ("ref", NO_SPIKES)):
        means[key], lo, hi = _spread(runs.finals[rule])
        facts.update({f"clip_{key}_mean": means[key], f"clip_{key}_lo": lo, f"clip_{key}_hi": hi})
    facts.update(seed_ratio_facts(runs.finals[NO_CLIPPING], runs.finals[GLOBAL_NORM]))
    verdict = compare_ranges(runs.finals[NO_CLIPPING], runs.finals[GLOBAL_NORM])
    facts["clip_verdict"] = Prose(
        separated_ranges(runs.finals[NO_CLIPPING], runs.finals[GLOBAL_NORM]) if verdict == "above" else
        "every seed without clipping ended below every seed with it: at this size clipping cost more than the "
        "spikes did" if verdict == "below" else
        "the two ranges overlap: at this size the difference is within seed noise, and this run cannot claim it")
    against_ref = compare_ranges(runs.finals[GLOBAL_NORM], runs.finals[NO_SPIKES])
    inside = min(runs.finals[NO_SPIKES]) <= min(runs.finals[GLOBAL_NORM]) and max(runs.finals[GLOBAL_NORM]) <= max(
        runs.finals[NO_SPIKES])
    ref = f"the runs that saw no spikes at all ({_range_text(runs.finals[NO_SPIKES])})"
    facts["clip_vs_ref"] = Prose({
        "within": f"within the seed-to-seed range of {ref}" if inside else
                  f"overlapping the seed-to-seed range of {ref}, a difference this run cannot tell from seed noise",
        "above": f"above every seed of {ref}: clipping bounded the damage without undoing it",
        "below": f"below every seed of {ref}"}[against_ref])
    return facts


def rule_table(runs: SpikyRuns) -> MarkdownTable:
    """One row per rule: its threshold (and what it bounds), the spikes that reached the optimizer (over all
    seeds), the median gradient norm the optimizer got on those steps, the share of ordinary steps the rule
    changed, and the final held-out loss's range over seeds (four decimals, as the prose compares them).
    Headers and cells are short, so that six columns fit the page."""
    units = {GLOBAL_NORM: "total norm", PER_VALUE: "each entry", PER_TENSOR: "tensor norm",
             AGC: "unit norm / weight norm"}
    rows = []
    for rule in runs.rules:
        n = len(runs.seeds)
        at = sorted(runs.step_norms[rule][i][s] for i in range(n) for s in runs.passed_spikes(rule, i))
        reached = sum(len(runs.passed_spikes(rule, i)) for i in range(n))
        threshold = f"{runs.thresholds[rule]:g} ({units[rule]})" if rule in runs.thresholds else "-"
        spikes = "-" if rule == NO_SPIKES else f"{reached} of {n * len(runs.spike_steps)}"
        changed = "-" if rule in (NO_SPIKES, NO_CLIPPING) else f"{100 * runs.changed_share(rule):.0f}%"
        rows.append((rule, threshold, spikes, f"{at[len(at) // 2]:.3g}" if at and rule != NO_SPIKES else "-",
                     changed, _range_text(runs.finals[rule])))
    return markdown_table(["rule", "bound", "spikes stepped on", "median norm there", "ordinary steps changed",
                           "final loss (seeds)"], rows)


def ranking_phrase(finals: Mapping[str, Sequence[float]]) -> Prose:
    """Which of these rules the seeds rank (final losses per seed): every seed of one below every seed of
    the other."""
    names = list(finals)
    ranked = [(a, b) for a in names for b in names if a != b and compare_ranges(finals[a], finals[b]) == "below"]
    if len(names) < 2:
        return Prose("")
    if not ranked:
        return Prose(f"Their ranges overlap, so these seeds do not rank "
                     f"{and_list([RULE_PHRASES.get(n, n) for n in names])} against each other.")
    said = [f"{RULE_PHRASES.get(a, a)} ended below {RULE_PHRASES.get(b, b)}" for a, b in ranked]
    return Prose(said[0][0].upper() + and_list(said)[1:] + " in every seed; any other pair's ranges overlap.")


def rule_facts(runs: SpikyRuns) -> dict[str, object]:
    """Part three's facts: each clipping rule's final loss against the runs without spikes
    (``clip_rules_verdict``, grouped as inside, overlapping, above or below their seed range, by
    :func:`range_relation`, each with its range), whether the seeds rank the rules that did not end above
    it (``clip_rules_ranking``), the largest gradient norm per-value clipping stepped on at a spike against
    global-norm clipping's threshold, and the share of ordinary steps AGC changed."""
    _require(runs, NO_SPIKES)
    ref = runs.finals[NO_SPIKES]
    groups: dict[str, list[str]] = {"inside": [], "overlapping": [], "above": [], "below": []}
    for rule in runs.rules:
        if rule not in (NO_SPIKES, NO_CLIPPING):
            groups[range_relation(runs.finals[rule], ref)].append(rule)
    if not any(groups.values()):
        raise ValueError("the runs hold no clipping rule to compare")

    def outside(rule: str) -> str:
        # how far an overlapping rule's seeds reach past the reference's range
        values = runs.finals[rule]
        parts = ([f"its highest seed {max(values) - max(ref):.2g} above"] if max(values) > max(ref) else []) + (
            [f"its lowest seed {min(ref) - min(values):.2g} below"] if min(values) < min(ref) else [])
        return ", " + " and ".join(parts)

    def listed(rules: list[str], group: str) -> str:
        return and_list([f"{RULE_PHRASES.get(rule, rule)} ({_range_text(runs.finals[rule])}"
                         f"{outside(rule) if group == 'overlapping' else ''})" for rule in rules])

    said = {"inside": "ended inside that range",
            "overlapping": "overlapped that range and reached past it, a difference within seed noise",
            "above": "ended above that range", "below": "ended below that range"}
    verdicts = "; ".join(f"{listed(rules, k)} {said[k]}" for k, rules in groups.items() if rules)
    text = (f"The runs that saw no spikes ended with held-out losses of {_range_text(ref)} over the seeds. "
            + verdicts[0].upper() + verdicts[1:] + ".")
    kept = groups["inside"] + groups["overlapping"] + groups["below"]
    facts: dict[str, object] = {"clip_rules_verdict": Prose(text), "clip_rules_ranking":
                                ranking_phrase({r: runs.finals[r] for r in kept})}
    if PER_VALUE in runs.rules:
        at = [runs.step_norms[PER_VALUE][i][s] for i in range(len(runs.seeds))
              for s in runs.passed_spikes(PER_VALUE, i)]
        facts["clip_value_spike_norm"] = max(at) if at else math.nan
    if AGC in runs.rules:
        facts["clip_agc_changed"] = 100 * runs.changed_share(AGC)
        facts["clip_agc_floor"] = runs.thresholds[AGC] * AGC_EPS
        facts["clip_agc_eps"], facts["clip_agc_lambda"] = AGC_EPS, runs.thresholds[AGC]
    return facts


def edit_table(order: EditOrder) -> MarkdownTable:
    """Each edit's effect on the gradient stepped on, over the intended one, after and before ``unscale_``."""
    return markdown_table(["edit", "after unscale_ (changed / intended)", "before unscale_ (changed / intended)"],
                          [(name, f"{order.after[name]:.4g}", f"{order.before[name]:.3g}") for name in EDITS])


def order_facts(order: EditOrder, overflow: OverflowStep) -> dict[str, object]:
    """The order section's facts (edits before and after ``unscale_``, the step that overflowed)."""
    returned = "nan" if math.isnan(overflow.returned_norm) else f"{overflow.returned_norm:g}"
    return {
        "ord_scale_log2": _log2(order.scale), "ord_scale": Prose(power_of_two_text(_log2(order.scale))),
        "ord_max_norm": order.max_norm, "ord_true_norm": order.true_norm,
        "ord_threshold": order.effective_threshold, "ord_clip_before": order.before["clip_grad_norm_"],
        "ord_penalty_before": order.before["L2 penalty"], "ord_step_over_grad": order.step_over_grad,
        "ord_kept": Prose("left the gradients exactly as `unscale_` and the edit had made them"
                          if order.grads_kept_by_step else "changed the gradients again"),
        "ord_second_unscale": Prose(f"`RuntimeError: {order.second_unscale_error}`"
                                    if order.second_unscale_error != "(no error)" else "no error"),
        "ex_adam_clip_before": order.adam_clip_before,
        "ovf_norm": Prose(f"`{returned}`"), "ovf_default": Prose(f"`{overflow.error_if_nonfinite_default}`"),
        "ovf_nan_pct": 100 * overflow.nan_share_after_clip,
        "ovf_outcome": Prose("skipped the step and the weights stayed bit-identical"
                             if not overflow.stepped and overflow.weights_unchanged else
                             "stepped, and the weights changed" if overflow.stepped else
                             "skipped the step, yet the weights changed"),
        "ovf_scale_after_log2": _log2(overflow.scale_after),
        "ovf_scale_after": Prose(power_of_two_text(_log2(overflow.scale_after))),
        # the message's first sentence, without its full stop: the lesson's sentence goes on after it
        "ovf_strict": Prose(f"`` RuntimeError: {overflow.strict_error.split('. ')[0].rstrip('.')} ``"
                            if overflow.strict_error != "(no error)" else "no error"),
    }
