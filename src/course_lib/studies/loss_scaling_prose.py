"""Lesson 3's facts, phrases, tables and errata: what the loss-scaling studies measured, under the names the prose glues."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..glue import Prose, and_list, bold, count_word, percent_places, plural, power_of_two_text
from ..gradients import ScaleSweep
from ..results import RecordedResult, describe_records
from ..scaling import (
    AUTOCAST_PITFALLS_DTYPE,
    DEFAULT_GROWTH_INTERVAL,
    DEMO_ACCUMULATION,
    DEMO_BACKOFF,
    DEMO_INIT_SCALE,
    DEMO_WIDTH,
    NO_SCALER_PITFALLS,
    OLD_GPU_CAPABILITY,
    PITFALLS,
    PitfallDemo,
    ScalerDefaults,
    ScaleTrace,
    replay_scale_schedule,
    steps_to_double,
)
from ..tables import MarkdownTable, markdown_table
from .loss_scaling import NOISE_FLOOR, FlightRecording, ScaleFidelity, ScalingRun, adam_update_change

CORRECT_LOOP = "correct loop"   # the name run_pitfall_demo(None) gives the loop without a mistake
# one statement of what clipping before unscale_ does, for every place of the page that says it
CLIP_BEFORE_UNSCALE_SHRINK = ("when the scaled norm *S* \u00d7 norm exceeds `max_norm` (otherwise nothing is "
                              "clipped), each step's update shrinks by a factor of *S* \u00d7 min(norm, "
                              "`max_norm`)/`max_norm`, which is the scale *S* itself only when the true norm "
                              "exceeds `max_norm`, and less when it does not.")
SMALLEST_FLOAT32 = 2.0 ** -149


def power_of_two(scale: float) -> str:
    """A loss scale as 2 with a superscript exponent (2\u00b2\u2074), the notation of the page's prose; a scale
    that is no power of two shows its fractional exponent as ``2^k`` (``k`` with ``:g``)."""
    if not scale > 0:
        raise ValueError(f"a loss scale is positive, got {scale!r}")
    exponent = math.log2(scale)
    return power_of_two_text(int(exponent)) if exponent == int(exponent) else f"2^{exponent:g}"


def _index_of(scales: Sequence[float], scale: float, what: str) -> int:
    if scale not in scales:
        raise ValueError(f"{what} {scale:g} is not among the swept scales")
    return list(scales).index(scale)


# ---- what a scale does to the gradients ---------------------------------------------------------------

def sweep_facts(sweep: ScaleSweep, init_scale: float, tolerance: float = 0.005) -> dict[str, object]:
    """Percent of non-zero gradients that survive (``survive_*``) and survive as normal numbers
    (``normal_*``) at scale 1, at ``init_scale`` (GradScaler's starting scale) and at the best scale; the
    log2 ends of the plateaus within ``tolerance`` (a fraction) of the best (``plateau_lo``/``_hi``,
    ``normal_lo``/``_hi``), and ``init_scale_log2``; the same as text with superscripts (``plateau_range``,
    ``normal_range``: "2\u2075 to 2\u00b2\u2076"; ``normal_best_at``, the scale of the best normal share;
    ``init_scale_text``). Both 1 and ``init_scale`` must be swept scales."""
    at_1 = _index_of(sweep.scales, 1.0, "scale")
    at_init = _index_of(sweep.scales, init_scale, "init_scale")
    plateau_lo, plateau_hi = sweep.plateau(tolerance)
    normal_lo, normal_hi = sweep.plateau(tolerance, normal=True)
    return {
        "survive_at_1": sweep.survive[at_1] * 100,
        "survive_best": max(sweep.survive) * 100,
        "init_scale_log2": int(round(math.log2(init_scale))),
        "survive_init": sweep.survive[at_init] * 100,
        "normal_at_1": sweep.survive_normal[at_1] * 100,
        "normal_init": sweep.survive_normal[at_init] * 100,
        "plateau_lo": int(math.log2(plateau_lo)),
        "plateau_hi": int(math.log2(plateau_hi)),
        "normal_lo": int(math.log2(normal_lo)),
        "normal_hi": int(math.log2(normal_hi)),
        "normal_best": max(sweep.survive_normal) * 100,
        # as text too: a share just under 100% must not print as 100.00% beside the explorer's 99.998%
        **{f"{k}_text": Prose(bold(percent_places(100 * v))) for k, v in (
            ("survive_best", max(sweep.survive)), ("survive_init", sweep.survive[at_init]),
            ("normal_init", sweep.survive_normal[at_init]), ("normal_best", max(sweep.survive_normal)))},
        "plateau_range": Prose(f"{power_of_two_text(int(math.log2(plateau_lo)))} to "
                               f"{power_of_two_text(int(math.log2(plateau_hi)))}"),
        "normal_range": Prose(f"{power_of_two_text(int(math.log2(normal_lo)))} to "
                              f"{power_of_two_text(int(math.log2(normal_hi)))}"),
        "normal_best_at": Prose(power_of_two_text(int(math.log2(
            sweep.scales[max(range(len(sweep.scales)), key=lambda i: sweep.survive_normal[i])])))),
        "init_scale_text": Prose(power_of_two_text(int(round(math.log2(init_scale))))),
    }


# ---- the scaler from scratch ---------------------------------------------------------------------------

def agreement_facts(agreement: Mapping[str, int]) -> dict[str, object]:
    """From :func:`~course_lib.scaling.compare_with_grad_scaler`'s counts: the steps compared
    (``agree_steps``) and the steps on which every quantity agreed (``agree_all``, the smallest count)."""
    if "steps" not in agreement:
        raise ValueError("agreement lacks the 'steps' count of compare_with_grad_scaler")
    return {"agree_steps": agreement["steps"], "agree_all": min(agreement.values())}


def growth_facts(defaults: ScalerDefaults) -> dict[str, object]:
    """The installed GradScaler's default ``growth_interval`` and the clean steps a replay of the rule
    needs before the scale first grows (``steps_to_double``)."""
    return {"growth_interval": defaults.growth_interval,
            "steps_to_double": steps_to_double(defaults.growth_interval)}


# ---- the flight recorder -------------------------------------------------------------------------------

def flight_facts(recording: FlightRecording) -> dict[str, object]:
    """Steps recorded, steps skipped, the growth interval it ran with, and log2 of the last scale used."""
    if not recording.scales:
        raise ValueError("the flight recording holds no step")
    if not recording.scales[-1] > 0:
        raise ValueError(f"the last recorded scale is {recording.scales[-1]!r}: it has no log2")
    return {"rec_steps": recording.steps, "rec_skipped": sum(recording.skipped),
            "rec_interval": recording.growth_interval,
            "rec_final_log2": int(round(math.log2(recording.scales[-1]))),
            "rec_final_scale": Prose(power_of_two_text(int(round(math.log2(recording.scales[-1])))))}


def nan_collapse_note(recording: FlightRecording) -> Prose:
    """What a recording whose loss turned non-finite went through: the steps skipped before, the steps
    skipped after, and the scale it halved down to; an empty phrase when every loss was finite."""
    losses = recording.losses
    first_nan = next((i for i, loss in enumerate(losses) if not math.isfinite(loss)), None)
    if first_nan is None:
        return Prose("")
    skipped_after = sum(recording.skipped[first_nan:])
    remaining = recording.steps - first_nan
    every = "all " if skipped_after == remaining else ""
    before = sum(recording.skipped[:first_nan])
    smallest = ", the smallest positive float32 number," if recording.scales[-1] == SMALLEST_FLOAT32 else ""
    finite = [i for i in range(first_nan, recording.steps) if math.isfinite(losses[i])]
    rest = [i for i in range(first_nan, recording.steps) if i not in finite]
    kind = "NaN" if all(math.isnan(losses[i]) for i in rest) else "not finite"
    how = (f"from step {first_nan} on, its loss was {kind} (the forward pass itself produced non-finite values in "
           f"FP16) at every step")
    if finite:
        how += " but " + and_list([
            f"step {i}, whose loss was {losses[i]:.3g} at scale "
            f"{power_of_two_text(round(math.log2(recording.scales[i])))} and which was "
            f"{'skipped' if recording.skipped[i] else 'not skipped'}" for i in finite]) + ";"
    else:
        how += ","
    return Prose(
        f"The recorded full-size run did not end well. It skipped {plural(before, 'step')} before step {first_nan}; "
        f"{how} {every}{skipped_after} of the {remaining} steps from step {first_nan} on were skipped, and the "
        f"scale halved at each skipped step down to {recording.scales[-1]:.3g}{smallest} before reaching zero at step "
        f"{recording.steps}; the recorder stops there. Loss scaling protects the backward pass from underflow, "
        f"and the scaler skips a step and backs off when the scaled gradients overflow; neither repairs a non-finite "
        f"forward pass ({{doc}}`05_bf16_vs_fp16` records the same "
        f"failure over seeds). " + forward_nan_where())


def forward_nan_where(*, on_lesson_5: bool = False) -> Prose:
    """Said wherever a recorded FP16 run's forward pass turned non-finite: where the operation is named (lesson
    5's section; ``on_lesson_5``: the section below), and why one model failing is no verdict on FP16."""
    where = ("The section below, {ref}`fp16-divergence`," if on_lesson_5
             else "Lesson 5's {ref}`fp16-divergence`")
    return Prose(
        where + " trains the course model with FP16 and a GradScaler toward such a failure (at a higher learning "
        "rate, so that it can fail within the steps a lesson can afford) and, where a run of its small CPU proxy "
        "fails, names the operation that overflowed. The course "
        "model forms attention's $q k^\\top$ in FP16 before its $1/\\sqrt{d}$ scale, an order that overflows "
        "where PyTorch's fused attention does not ({doc}`04_amp` shows it), so one model written this way going "
        "NaN is no verdict on FP16 autocast for GPTs in general.")


def recorded_flight_beside(records: Sequence[RecordedResult], device_type: str) -> FlightRecording | None:
    """The first recorded GPU flight recording, to show beside a live run that is not on a GPU; None on a
    GPU (the live run is then the full-size one) or when nothing is recorded."""
    if not records or device_type == "cuda":
        return None
    if not isinstance(records[0].result, FlightRecording):
        raise TypeError(f"expected a recorded FlightRecording, got {type(records[0].result).__name__}")
    return records[0].result


def recorded_flight_text(records: Sequence[RecordedResult], recorded: FlightRecording | None) -> Prose:
    """The recorded runs' provenance lines (:func:`~course_lib.results.describe_records`), followed by
    :func:`nan_collapse_note` of the recording shown beside the live run, if one is shown and collapsed."""
    text = describe_records(list(records), "scaler_flight_recording")
    note = nan_collapse_note(recorded) if recorded is not None else ""
    return Prose(text + "\n\n" + note if note else text)


def replay_facts(replayed: ScaleTrace, recording: FlightRecording) -> dict[str, object]:
    """Whether replaying the recorded settings reproduced the recorded scales step for step
    (``replay_matches``)."""
    return {"replay_matches": replayed.scales == recording.scales}


def _scale_text(scale: float) -> str:
    """A loss scale in prose: 2 with a superscript exponent for a power of two, else the number."""
    return power_of_two(scale) if math.log2(scale) == int(math.log2(scale)) else f"{scale:g}"


def _changed_settings(trace: ScaleTrace, reference: ScaleTrace) -> str:
    """How ``trace``'s scaler settings differ from ``reference``'s, in words ("an initial scale of 2\u00b2\u2074
    instead of 2\u00b9\u2076")."""
    changes = []
    if trace.init_scale != reference.init_scale:
        changes.append(f"an initial scale of {_scale_text(trace.init_scale)} instead of "
                       f"{_scale_text(reference.init_scale)}")
    if trace.growth_interval != reference.growth_interval:
        changes.append(f"growth every {trace.growth_interval} clean steps instead of {reference.growth_interval}")
    if trace.backoff_factor != reference.backoff_factor:
        changes.append(f"a back-off factor of {trace.backoff_factor:g} instead of {reference.backoff_factor:g}")
    if trace.growth_factor != reference.growth_factor:
        changes.append(f"a growth factor of {trace.growth_factor:g} instead of {reference.growth_factor:g}")
    return and_list(changes) if changes else "the same settings"


def skips_before_first_growth(trace: ScaleTrace) -> int:
    """Skipped steps before the scale first grows (all of them if it never grows): the cost of the start."""
    first_growth = next((i for i in range(1, len(trace.scales)) if trace.scales[i] > trace.scales[i - 1]),
                        len(trace.scales))
    return sum(trace.skipped[:first_growth])


def _skips_text(trace: ScaleTrace) -> str:
    start = skips_before_first_growth(trace)
    later = trace.n_skipped - start
    if trace.n_skipped == 0:
        return "skipped no step"
    if later == 0 or start == 0:
        when = "before the scale first grew" if later == 0 else "after the scale had grown"
        return f"skipped {plural(trace.n_skipped, 'step')}, {'all ' if trace.n_skipped > 1 else ''}{when}"
    return f"skipped {plural(start, 'step')} before the scale first grew and {later} after it had grown"


def what_if_sentence(traces: Mapping[str, ScaleTrace], *, reference: str = "as recorded") -> Prose:
    """What the what-if replays did on the same stream: the ``reference`` replay (keyed by its label) and
    each other one, named by how its settings differ, with the scale it ended at and the steps it skipped
    before the scale first grew and after; then which settings skipped fewest steps and which ended highest."""
    if reference not in traces:
        raise ValueError(f"the replays lack the {reference!r} one to compare against")
    for label, trace in traces.items():
        if not trace.scales or not trace.scales[-1] > 0:
            raise ValueError(f"the {label!r} replay has no positive final scale")
    ref = traces[reference]
    settings = {label: "the recorded settings" if label == reference else _changed_settings(t, ref)
                for label, t in traces.items()}
    clauses = [("the recorded settings ended at" if label == reference else
                f"with {settings[label]}, the replay ended at") + f" {_scale_text(t.scales[-1])} and {_skips_text(t)}"
               for label, t in traces.items()]
    text = f"Over the same {plural(len(ref.scales), 'step')}, " + "; ".join(clauses) + "."
    if len(traces) > 1:
        fewest = min(t.n_skipped for t in traces.values())
        highest = max(t.scales[-1] for t in traces.values())
        text += (f" The fewest skips came with "
                 f"{and_list([settings[k] for k, t in traces.items() if t.n_skipped == fewest])}, the highest "
                 f"final scale with {and_list([settings[k] for k, t in traces.items() if t.scales[-1] == highest])}.")
    return Prose(text)


# ---- static against dynamic ----------------------------------------------------------------------------

def _trained(runs: Sequence[ScalingRun]) -> list[ScalingRun]:
    trained = [r for r in runs if r.n_skipped < len(r.losses)]
    if not trained:
        raise ValueError("no run trained: every run skipped every step")
    return trained


def static_facts(runs: Sequence[ScalingRun]) -> dict[str, object]:
    """Skipped steps of the largest static scale (``static_big_skipped``), steps per run, the spread of the
    final losses and the largest gap between losses at any one step over the runs that trained (nats per
    byte), and a phrase naming the runs that never trained (``static_never``, empty if none)."""
    static = [r for r in runs if r.label.startswith("static")]
    if not static:
        raise ValueError("no static run among the runs")
    trained = _trained(runs)
    finals = [r.losses[-1] for r in trained]
    never = [r.label for r in runs if r.n_skipped == len(r.losses)]
    return {
        "static_big_skipped": max(static, key=lambda r: r.scales[0]).n_skipped,
        "static_steps": len(runs[0].losses),
        "static_spread": max(finals) - min(finals),
        "static_max_step_gap": max(max(c) - min(c) for c in zip(*(r.losses for r in trained))),
        "static_never": Prose(f"{' and '.join(never)} skipped every step and never trained." if never else ""),
    }


def replay_leniency(replay: ScaleTrace, runs: Sequence[ScalingRun]) -> Prose:
    """Check a what-if ``replay`` against the static run at its initial scale, on step 0: the one step
    where a static run and the flight recording share weights and batch (both start from the course
    model's weights for the same seed and draw the same batch 0). Later steps are not comparable: the
    runs' weights part after the first step. Says how many of the replay's steps stepped at the initial
    scale or above, where the static run stepped on none if it skipped them all."""
    if not replay.scales:
        raise ValueError("the replay has no steps")
    matching = [r for r in runs if r.scales and r.scales[0] == replay.init_scale and r.label.startswith("static")]
    if not matching:
        raise ValueError(f"no static run at the replay's initial scale {replay.init_scale:g}")
    static, scale = matching[0], _scale_text(replay.init_scale)
    stepped_high = sum(1 for sc, sk in zip(replay.scales, replay.skipped) if sc >= replay.init_scale and not sk)
    taken = len(static.skipped) - static.n_skipped
    static_steps = "never stepped" if taken == 0 else f"stepped {plural(taken, 'time')}"
    if static.skipped[0] and not replay.skipped[0]:
        first = (f"On that first step the {static.label} run overflowed, while the replay at an initial scale "
                 f"of {scale} took it: its threshold, from the activation gradients alone, was too lenient")
    elif static.skipped[0] == replay.skipped[0]:
        first = (f"On that first step the {static.label} run and the replay at an initial scale of {scale} "
                 f"agree: both {'skipped' if static.skipped[0] else 'took'} it")
    else:
        first = (f"On that first step the replay at an initial scale of {scale} skipped, while the "
                 f"{static.label} run took it")
    return Prose(f"{first}. Over its {plural(len(replay.scales), 'step')}, the replay stepped "
                 f"{plural(stepped_high, 'time')} at {scale} or above; the {static.label} run "
                 f"{static_steps} in its {plural(len(static.skipped), 'step')}. After the first step the comparison no longer "
                 f"holds: the recording trained, so its later steps saw other weights than the static run.")


def static_runs_table(runs: Sequence[ScalingRun]) -> MarkdownTable:
    """One row per run: its label, skipped steps of all steps, and its final loss (nats per byte)."""
    return markdown_table(["run", "skipped steps", "final loss"],
                          [(r.label, f"{r.n_skipped} of {len(r.losses)}", f"{r.losses[-1]:.3f}") for r in runs])


# ---- gradient fidelity ---------------------------------------------------------------------------------

def median_errors(fid: ScaleFidelity) -> dict[float, float]:
    """Per scale whose gradients did not overflow, the median relative error over the parameters (the
    upper median for an even count)."""
    return {sc: sorted(fid.error[sc].values())[len(fid.names) // 2] for sc in fid.scales if not fid.overflowed[sc]}


def fidelity_table(fid: ScaleFidelity) -> MarkdownTable:
    """Per loss scale: the median and the largest relative gradient error (percent, with the parameter)
    and the largest share of entries lost (percent); a scale that overflowed says so."""
    med = median_errors(fid)
    rows = []
    for sc in fid.scales:
        if fid.overflowed[sc]:
            rows.append((power_of_two(sc), "overflow: inf gradients", "-", "-"))
            continue
        name, worst = fid.worst(sc)
        rows.append((power_of_two(sc), f"{100 * med[sc]:.3f}%", f"{100 * worst:.3f}% (`{name}`)",
                     _lost_share(fid, sc)))
    return markdown_table(["loss scale", "median error over parameters", "largest error (parameter)",
                           "largest share of entries lost"], rows)


def fidelity_facts(fid: ScaleFidelity, within: float = 1.25) -> dict[str, object]:
    """The worst gradient error without a scale (``fid_worst_1``) and at the scale with the smallest worst
    error (``fid_best``, ``fid_worst_best``), the ratio of their median errors, the scales whose median
    error is within ``within`` times the best one's (``fid_plateau``; ``fid_within`` in percent) and how
    far apart their medians are (``fid_median_gap``, the largest over the smallest, in percent), the
    scales that overflowed, and the run's steps and batches. Scale 1 must be measured without overflow."""
    if not within >= 1:
        raise ValueError(f"within is a factor of at least 1, got {within!r}")
    med = median_errors(fid)
    if 1.0 not in med:
        raise ValueError("scale 1 is not a measured scale without overflow: nothing to compare against")
    best = min(med, key=lambda sc: fid.worst(sc)[1])
    name_1, worst_1 = fid.worst(1.0)
    plateau = [sc for sc in med if med[sc] <= within * med[best]]
    overflowed = [power_of_two(sc) for sc in fid.scales if fid.overflowed[sc]]
    return {
        "fid_steps": fid.steps,
        "fid_worst_1": Prose(f"{100 * worst_1:.1f}% (`{name_1}`)"),
        "fid_worst_best": Prose(f"{100 * fid.worst(best)[1]:.2f}%"),
        "fid_best": Prose(power_of_two(best)),
        "fid_median_ratio": med[1.0] / med[best],
        "fid_within": 100 * (within - 1),
        "fid_median_gap": 100 * (max(med[sc] for sc in plateau) / min(med[sc] for sc in plateau) - 1),
        "fid_batches": fid.batches,
        "fid_plateau": Prose(" and ".join(power_of_two(sc) for sc in plateau)),
        "fid_overflow": Prose(", ".join(overflowed) or "none"),
        "fid_noise": noise_note(fid),
        "fid_noise_floor": Prose(power_of_two_text(int(math.log2(NOISE_FLOOR)))),
        "fid_lost_by_scale": lost_by_scale(fid),
    }


def _lost_share(fid: ScaleFidelity, scale: float) -> str:
    """The largest share of a parameter's entries lost at ``scale``, as the fidelity table prints it."""
    return f"{100 * max(fid.lost[scale].values()):.3f}%"


def lost_by_scale(fid: ScaleFidelity) -> Prose:
    """Per scale that did not overflow, the largest share of a parameter's entries lost to underflow, as the
    fidelity table's last column prints it: "0.500% at 2\u2070, 0.125% at 2\u2078 and 0.000% at 2\u00b9\u2076";
    scales with equal shares grouped ("0.000% at 2\u00b9\u2076 and 2\u00b2\u2074 alike")."""
    shares: dict[str, list[str]] = {}
    for sc in fid.scales:
        if not fid.overflowed[sc]:
            shares.setdefault(_lost_share(fid, sc), []).append(power_of_two(sc))
    if not shares:
        raise ValueError("every scale overflowed: no share of lost entries was measured")
    return Prose(and_list([f"{share} at {and_list(scales)}" + (" alike" if len(scales) > 1 else "")
                           for share, scales in shares.items()]))


def noise_note(fid: ScaleFidelity) -> Prose:
    """What "entries lost" left out as FP32's rounding noise (:attr:`ScaleFidelity.noise`): per parameter, the
    entries per batch (averaged over the batches, so a fraction can appear), and why a key bias's gradient
    is such noise."""
    if not fid.noise:
        return Prose("No FP32 entry was that small here")
    listed = and_list([f"{count:g} of `{name}`" for name, count in fid.noise.items()])
    keys = any(name.endswith("qkv.bias") for name in fid.noise)
    averaged = f", averaged over {plural(fid.batches, 'batch', 'batches')}" if fid.batches > 1 else ""
    return Prose(f"Left out here, in entries per batch{averaged}: {listed}" + (
        ". Attention's query-key-value bias holds the key bias, whose gradient is zero in exact arithmetic (a "
        "bias added to every key shifts all of a query's scores by one amount, which softmax ignores): FP32 "
        "computes it as rounding noise" if keys else ""))


# ---- pitfalls ------------------------------------------------------------------------------------------

def _correct_loop(demos: Sequence[PitfallDemo]) -> PitfallDemo:
    for d in demos:
        if d.name == CORRECT_LOOP:
            return d
    raise ValueError("the demos hold no correct loop (run_pitfall_demo(None)) to compare against")


def _ratio_text(ratio: float) -> str:
    """Three significant digits, trailing zeros kept (0.900, 1.30, 8.47e-07), as the prose glues them
    (``#.3g``); 0 as 0."""
    return "0" if ratio == 0 else f"{ratio:#.3g}"


def pitfall_table(demos: Sequence[PitfallDemo]) -> MarkdownTable:
    """One row per demo: whether the audit caught exactly its planted mistake (or what it found instead),
    what GradScaler raised, optimizer and scheduler steps, and how far the weights moved against the
    correct loop (``-`` for the autocast pitfalls, whose weights are not compared)."""
    correct = _correct_loop(demos)
    rows = []
    for d in demos:
        found = [f.pitfall for f in d.findings]
        caught = "nothing" if not found else ("yes" if found == [d.name] else ", ".join(found))
        moved = "-" if d.name in AUTOCAST_PITFALLS_DTYPE else _ratio_text(d.update_norm / correct.update_norm)
        rows.append((d.name, caught, (d.error or "-").split(":")[0], d.optimizer_steps, d.scheduler_steps, moved))
    # short headers, so that the table fits the page's column (the prose says what each means)
    return markdown_table(["planted mistake", "caught", "raised", "steps", "LR steps", "moved / correct"], rows)


def _first_step_ratio(demo: PitfallDemo, correct: PitfallDemo) -> float:
    """The norm of the gradient ``demo``'s first optimizer step stepped on, against the correct loop's."""
    if not demo.step_grad_norms or not correct.step_grad_norms or correct.step_grad_norms[0] <= 0:
        raise ValueError(f"{demo.name!r} and the correct loop need a first optimizer step with a gradient")
    return demo.step_grad_norms[0] / correct.step_grad_norms[0]


def _kept_pct(demo: PitfallDemo) -> float:
    """How far the weights moved, summed over the optimizer steps, as a percentage of the moves SGD asked
    for (learning rate times gradient norm): below 100 where float32 rounding ate part of the steps."""
    asked = sum(demo.step_requested)
    if not asked > 0 or len(demo.step_moved) != len(demo.step_requested):
        raise ValueError(f"{demo.name!r} has no optimizer step that asked the weights to move")
    return 100.0 * sum(demo.step_moved) / asked


def pitfall_setting_facts() -> dict[str, object]:
    """The pitfall demo loop's settings as the page names them: micro-batches per step (``pit_micro``, a
    word), the autocast loops' width (``pit_width``), the compute capability the old-GPU row fakes
    (``pit_capability``, ``"7.5"``), how many rows run without a scaler (``pit_no_scaler``, a word), and the FP32
    loops' GradScaler: its initial scale and back-off factor as powers of two (``pit_init_scale``,
    ``pit_backoff``)."""
    major, minor = OLD_GPU_CAPABILITY
    return {"pit_micro": count_word(DEMO_ACCUMULATION), "pit_width": DEMO_WIDTH,
            "pit_capability": f"{major}.{minor}", "pit_no_scaler": count_word(len(NO_SCALER_PITFALLS)),
            "pit_init_scale": Prose(power_of_two_text(round(math.log2(DEMO_INIT_SCALE)))),
            "pit_backoff": Prose(power_of_two_text(round(math.log2(DEMO_BACKOFF))))}


def pitfall_facts(demos: Sequence[PitfallDemo]) -> dict[str, object]:
    """How far the weights moved against the correct loop when clipping before unscaling (``clip_ratio``;
    with ``clip_inv_scale``, 1/S, the first step's gradient-norm ratio ``clip_grad_ratio``, and the share of
    the requested SGD moves the weights kept, ``clip_kept_pct`` and ``correct_kept_pct``),
    when stepping the scheduler on a skipped step (``sched_ratio``) and with the scaler disabled
    (``disabled_ratio``, with its optimizer steps ``disabled_steps``, where present), log2 of the scale the
    clipping demo ended at, and the optimizer steps of the per-micro-batch demo (with how far its weights moved,
    ``micro_ratio``) and of the correct loop."""
    correct = _correct_loop(demos)
    by_name = {d.name: d for d in demos}
    missing = [n for n in ("clip_before_unscale", "scheduler_on_skipped_step", "update_every_microbatch")
               if n not in by_name]
    if missing:
        raise ValueError(f"the demos lack {', '.join(missing)}")
    clip = by_name["clip_before_unscale"]
    return {
        "clip_ratio": clip.update_norm / correct.update_norm,
        "clip_scale_log2": int(math.log2(clip.final_scale)),
        "clip_scale": Prose(power_of_two_text(int(math.log2(clip.final_scale)))),
        "clip_shrink": Prose(CLIP_BEFORE_UNSCALE_SHRINK),
        # the formula is per step and about the gradient; the weights' move also passes float32 rounding
        "clip_inv_scale": 1.0 / clip.final_scale,
        "clip_grad_ratio": _first_step_ratio(clip, correct),
        "clip_kept_pct": _kept_pct(clip),
        "correct_kept_pct": _kept_pct(correct),
        "sched_ratio": by_name["scheduler_on_skipped_step"].update_norm / correct.update_norm,
        "micro_steps": by_name["update_every_microbatch"].optimizer_steps,
        "micro_ratio": by_name["update_every_microbatch"].update_norm / correct.update_norm,
        "correct_steps": correct.optimizer_steps,
        **({"disabled_steps": by_name["disabled_scaler"].optimizer_steps,
            "disabled_ratio": by_name["disabled_scaler"].update_norm / correct.update_norm}
           if "disabled_scaler" in by_name else {}),
    }


def pitfall_fixes() -> Prose:
    """A Markdown list: each pitfall the audit knows, what its finding means and the fix."""
    return Prose("\n".join(f"- **{name}**: {text}" for name, text in PITFALLS.items()))


# ---- errata and exercises ------------------------------------------------------------------------------

def scaling_errata(defaults: ScalerDefaults, *, default_steps: int, default_scale: float, fast_steps: int,
                   fast_scale: float, clip_ratio: float, refusal: str | None) -> list[tuple[str, str]]:
    """The errata rows (claim, measured): the real GradScaler's scale after ``default_steps`` clean steps
    at its defaults (fewer than ``growth_interval``) and after ``fast_steps`` clean steps with
    ``growth_interval=1``; the clipping demo's ``clip_ratio`` (weights moved against the correct loop);
    and torch's ``refusal`` of ``growth_factor=1.0`` (None if the installed torch accepts it)."""
    if not 0 <= default_steps < defaults.growth_interval:
        raise ValueError(f"default_steps must be fewer than the growth interval ({defaults.growth_interval}) "
                         f"for the scale to be unchanged, got {default_steps!r}")
    if not (default_scale > 0 and fast_scale > 0):
        raise ValueError(f"scales are positive, got {default_scale!r} and {fast_scale!r}")
    init = power_of_two(defaults.init_scale)
    static = (f"torch refuses it: \"{refusal.rstrip('.')}\"" if refusal is not None
              else "The installed torch accepts it, and the scale then never grows")
    return [
        ("GradScaler doubles the scale after every step without overflow.",
         f"It grows only after `growth_interval` (default {defaults.growth_interval}) clean steps in a row: "
         f"after {default_steps} clean steps the real GradScaler's scale is still {default_scale:g}."),
        (f"The loss scale is capped at {power_of_two(2.0 ** 16)}.",
         f"There is no cap: with `growth_interval=1`, {fast_steps} clean steps take the real GradScaler from "
         f"{init} to {power_of_two(fast_scale)}. {init} is only the default initial scale."),
        ("Clipping before unscaling does nothing, or produces NaN.",
         f"It clips the still-scaled gradients to `max_norm`, so once unscaled their norm is `max_norm`/*S* "
         f"instead of min(norm, `max_norm`), a step up to *S* times too small (the pitfalls section gives the "
         f"factor). The weights moved {_ratio_text(clip_ratio)} times as far as in the correct loop (pitfalls "
         f"table above)."),
        ("For static loss scaling, use `GradScaler(growth_factor=1.0)`.",
         f"{static}. Multiply the loss by a constant and divide the gradients by it before the step, or give "
         f"GradScaler a `growth_interval` longer than the run (it still backs off after an overflow)."),
    ]


def exercise_facts(*, overflow_step: int = 2, answer_step: int = 4005) -> dict[str, object]:
    """The growth exercise replayed at GradScaler's defaults with one overflow at ``overflow_step``: the
    scale right after the back-off, after one growth interval of clean steps, and at ``answer_step``; and
    how much one Adam step changes under a scale of 1024 (``ex_adam_diff``, a fraction of the update)."""
    back = overflow_step + 1 + DEFAULT_GROWTH_INTERVAL
    if overflow_step < 0 or back > answer_step:
        raise ValueError(f"answer_step ({answer_step}) must come at least one growth interval after the "
                         f"overflow at step {overflow_step} (>= 0)")
    growth = replay_scale_schedule([0.0 if i == overflow_step else math.inf for i in range(answer_step + 1)])
    return {
        "ex_growth_after_backoff": growth.scales[overflow_step + 1],
        "ex_growth_back": growth.scales[back],
        "ex_growth_answer": growth.scales[answer_step],
        "ex_adam_diff": adam_update_change(1024.0),
    }
