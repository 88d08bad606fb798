"""Lesson 9's phrases on what watching costs (judged against the timing's own noise), on the monitor in the
reader's own loop, on the skip exercise, and the lesson's errata, computed from the results of
studies.monitoring, from the monitor's log and from the recorded GPU runs."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import torch

from ..device import SizeProfile
from ..glue import Prose, and_list
from ..monitor.health import MonitorLog, step_was_skipped
from ..results import RecordedResult
from ..tables import MarkdownTable, markdown_table
from ..formats import get_format
from .monitoring import (
    MonitorOverhead,
    NanHunt,
    RecoveryDemo,
    UnderflowTrend,
    anomaly_function,
    growing_gradient,
    qkv_peak_gradient,
    skipped_after_fault,
)

# an overhead against the timing's noise: a cost (every round beyond the noise), one within the noise, one
# beyond it overall but not in every round (unresolved), or a shorter step in every round (which a monitor
# cannot cause: it only adds work)
OVERHEAD_VERDICTS = ("cost", "within noise", "unresolved", "faster")

# the most decimals a percentage gets when more are needed to tell an overhead's text from the noise's
_MAX_PERCENT_DECIMALS = 4


def _code(name: str | None) -> str:
    return f"`{name}`"


def _signed(pct: float, decimals: int = 0) -> str:
    """``+4%``, ``-3.5%`` (``decimals`` places); a value that rounds to zero reads ``+0%`` (``+0.0%``), never
    ``-0%``."""
    text = f"{pct:+.{decimals}f}%"
    return "+" + text[1:] if float(text[:-1]) == 0 else text


def _unsigned(pct: float, decimals: int) -> str:
    return f"{abs(pct):.{decimals}f}%"


def percent_decimals(cost: MonitorOverhead) -> int:
    """Decimals for the percentages of ``cost``'s table and sentences: one, or more where an overhead the prose
    compares with the noise (an interval's overall one, or the lowest or highest of a single round) would print
    as the noise's number while it differs from it (a reader shown "-4.0%, more than that noise of 4.0%" cannot
    check it); at most four (values equal to four decimals count as equal). One when the run kept no rounds."""
    try:
        noise = 100 * cost.noise()
    except ValueError:
        return 1
    shown = []
    for every in cost.seconds:
        if every:
            shown.append(cost.overhead(every))
            shown += cost.overhead_range(every) if cost.rounds.get(every) else ()
    top = _MAX_PERCENT_DECIMALS
    apart = [100 * abs(v) for v in shown if f"{100 * abs(v):.{top}f}" != f"{noise:.{top}f}"]
    return next(d for d in range(1, top + 1) if all(f"{v:.{d}f}" != f"{noise:.{d}f}" for v in apart))


def floor_decimals(value: float, decimals: int = 1) -> str:
    """``value`` rounded down to ``decimals`` places, for a lower bound ("at least 2.3 times" of 2.37, which
    ``:.1f`` would round up to a false 2.4); a value already exact at that many places (to 1e-9) keeps them."""
    factor = 10**decimals
    return f"{math.floor(round(value * factor, 9)) / factor:.{decimals}f}"


def _ms_decimals(seconds: Iterable[float]) -> int:
    """Decimals that give the shortest of these step times (seconds) four significant figures in milliseconds
    (10.55, 43.61, 8.400; one to four decimals), so that an overhead worked out from the printed times is the
    printed one to about its last decimal."""
    shortest = 1e3 * min(seconds)
    return 4 if shortest <= 0 else min(4, max(1, 3 - math.floor(math.log10(shortest))))


def _range(cost: MonitorOverhead, every: int, decimals: int) -> str:
    """Single rounds' overheads, lowest to highest: ``"+30.0% to +45.0%"``."""
    lo, hi = cost.overhead_range(every)
    return f"{_signed(100 * lo, decimals)} to {_signed(100 * hi, decimals)}"


def _beyond(cost: MonitorOverhead, every: int, noise_name: str = "the noise") -> str:
    """In how many rounds the step was longer (or, where the overhead is negative, shorter) by more than the
    noise, called ``noise_name``: ``"longer by more than the noise in only 4 of 6 rounds"``."""
    noise, overall = cost.noise(), cost.overhead(every)
    each = cost.round_overheads(every)
    count = sum(o > noise if overall > 0 else o < -noise for o in each)
    return (f"{'longer' if overall > 0 else 'shorter'} by more than {noise_name} in only {count} of {len(each)} "
            "rounds")


def _interval_name(every: int) -> str:
    return "none" if every == 0 else "every step" if every == 1 else f"every {every} steps"


def overhead_table(cost: MonitorOverhead) -> MarkdownTable:
    """Milliseconds per step with no monitor and with each sampling interval (four significant figures), the
    overhead over none, and each round's overhead over the same round's unmonitored block, in the order
    they ran (to :func:`percent_decimals`, the decimals of the section's sentences): the verdicts count
    rounds, so the rounds are on the page."""
    decimals, ms = percent_decimals(cost), _ms_decimals(cost.seconds.values())

    def rounds(k: int) -> str:
        return "" if k == 0 or k not in cost.rounds else ", ".join(
            _signed(100 * o, decimals) for o in cost.round_overheads(k))
    return markdown_table(["monitor", "step (ms)", "overhead", "overhead in each round"], [
        (_interval_name(k), f"{1e3 * v:.{ms}f}", "" if k == 0 else _signed(100 * cost.overhead(k), decimals),
         rounds(k)) for k, v in cost.seconds.items()])


def _check_intervals(cost: MonitorOverhead) -> None:
    missing = [k for k in (0, 1, 10) if k not in cost.seconds]
    if missing:
        raise ValueError(f"the overhead run lacks sampling intervals {missing} (0: no monitor)")


def _rule(rounds: int) -> str:
    """The rounds an overhead must clear the noise in: all of them, or, from five rounds on, all but one (one
    burst of load on a shared machine can hit any block)."""
    return "every round" if rounds < 5 else "every round but at most one"


def _needed(rounds: int) -> int:
    """How many of ``rounds`` rounds an overhead must clear the noise in (:func:`_rule`)."""
    return rounds - (1 if rounds >= 5 else 0)


def overhead_verdict(cost: MonitorOverhead, every: int) -> str:
    """One of :data:`OVERHEAD_VERDICTS` for sampling every ``every`` steps: a cost only when the overhead, and
    that of every single round (all but one, from five rounds on), is larger than
    :meth:`MonitorOverhead.noise`, the unmonitored loop's own median change between rounds; a shorter step
    only when they are all shorter by more than it."""
    noise = cost.noise()
    each = cost.round_overheads(every)
    needed = _needed(len(each))
    overall = cost.overhead(every)
    if overall > noise and sum(o > noise for o in each) >= needed:
        return "cost"
    if overall < -noise and sum(o < -noise for o in each) >= needed:
        return "faster"
    return "within noise" if abs(overall) <= noise else "unresolved"


def _clause(cost: MonitorOverhead, every: int, decimals: int) -> str:
    """What watching every ``every`` steps did to the mean step, judged against the noise (a sentence's end)."""
    pct, rule = 100 * cost.overhead(every), _rule(len(cost.round_overheads(every)))
    signed, size = _signed(pct, decimals), _unsigned(pct, decimals)
    return {
        "cost": f"made the mean step {size} longer, a cost by that rule",
        "within noise": f"changed the mean step time by {signed}, within that noise: no cost this run can tell "
                        "from zero",
        "unresolved": f"changed the mean step time by {signed}, more than that noise overall, but the step was "
                      f"{_beyond(cost, every)}, where a cost must show in {_needed(len(cost.round_overheads(every)))}: "
                      "inconclusive, neither a cost by that rule nor shown to be free",
        "faster": f"made the mean step {size} shorter, by more than that noise in {rule}; a monitor only adds "
                  "work, so the machine's load changed during the run",
    }[overhead_verdict(cost, every)]


def overhead_sentence(cost: MonitorOverhead) -> Prose:
    """Lesson 9's sentences on the monitor's cost: the noise (how far the unmonitored loop moved between
    rounds) and the rule, single rounds' ranges, then every step and every 10 steps judged, every percentage
    to the table's decimals (:func:`percent_decimals`)."""
    _check_intervals(cost)
    noise, largest, d = cost.noise(), max(cost.round_changes()), percent_decimals(cost)
    ranges = [_range(cost, e, d) for e in (1, 10)]
    if overhead_verdict(cost, 1) == overhead_verdict(cost, 10) == "cost":     # one verdict, said once
        sizes = [_unsigned(100 * cost.overhead(e), d) for e in (1, 10)]
        verdict = (f"watching every step made the mean step {sizes[0]} longer and watching every 10 steps "
                   f"{sizes[1]} longer: both costs by that rule")
    else:
        verdict = f"watching every step {_clause(cost, 1, d)}; watching every 10 steps {_clause(cost, 10, d)}"
    return Prose(
        f"The unmonitored loop, timed once a round, moved by a median {_unsigned(100 * noise, d)} from one round to "
        f"the next on its own (at most {_unsigned(100 * largest, d)}): that is this run's noise, and an overhead "
        f"counts as a cost only where it exceeded that median in {_rule(len(cost.round_overheads(1)))}. Single "
        f"rounds' overheads ranged from {ranges[0]} (every step) and from {ranges[1]} (every 10 steps); the table "
        f"compares the medians over rounds, with and without the monitor, so its overhead need not lie in the middle "
        f"of that range. So {verdict}.")


def overhead_phrase(cost: MonitorOverhead, every: int, *, run: str = "this page's run") -> Prose:
    """What sampling every ``every`` steps cost in ``run``, judged against its noise, as a verb phrase
    (``"cost 8.0% in the run, beyond its timing noise of 3.0% in every round"``), to the table's decimals."""
    pct, d = 100 * cost.overhead(every), percent_decimals(cost)
    n, rule = _unsigned(100 * cost.noise(), d), _rule(len(cost.round_overheads(every)))
    return Prose({
        "cost": f"cost {_unsigned(pct, d)} in {run}, beyond its timing noise of {n} in {rule}",
        "within noise": f"cost nothing {run} could separate from its timing noise ({_signed(pct, d)}, within the "
                        f"noise of {n})",
        "unresolved": f"was neither shown to cost time nor shown to be free in {run} ({_signed(pct, d)}, "
                      f"{_beyond(cost, every, f'the noise of {n}')})",
        "faster": f"cost nothing measurable in {run} (its steps were {_unsigned(pct, d)} shorter, beyond the timing "
                  f"noise of {n} in {rule}, which only a change in the machine's load explains)",
    }[overhead_verdict(cost, every)])


def _judged(cost: MonitorOverhead, every: int) -> str:
    rule = _rule(len(cost.round_overheads(every)))
    return {"cost": f"beyond the timing noise in {rule}", "within noise": "within the timing noise",
            "unresolved": _beyond(cost, every, "the timing noise"),
            "faster": f"shorter by more than the timing noise in {rule}, so the load changed",
            }[overhead_verdict(cost, every)]


def overhead_facts(cost: MonitorOverhead) -> dict[str, object]:
    """Lesson 9's facts of a :class:`MonitorOverhead` run with intervals 1 and 10 and two rounds or more: the
    overhead of each and the noise (percent), the ranges over single rounds (``"+30.0% to +45.0%"``) and the
    section's sentences (:func:`overhead_sentence`)."""
    _check_intervals(cost)
    d = percent_decimals(cost)
    return {
        "cost_every1": 100 * cost.overhead(1),
        "cost_every10": 100 * cost.overhead(10),
        "cost_noise": 100 * cost.noise(),
        "cost_range10": Prose(_range(cost, 10, d)),
        "cost_range1": Prose(_range(cost, 1, d)),
        "cost_sentence": overhead_sentence(cost),
    }


def recorded_step_seconds(recorded: RecordedResult) -> dict[int, float]:
    """A recorded ``monitor_overhead`` run's seconds per step by sampling interval (0: no monitor)."""
    seconds = dict(recorded.result.seconds)
    missing = [k for k in (0, 1, 10) if k not in seconds]
    if missing:
        raise ValueError(f"the record lacks sampling intervals {missing}")
    return seconds


def _has_rounds(recorded: RecordedResult) -> bool:
    """Whether a record kept its per-round times (version-1 records kept only the medians)."""
    rounds = recorded.result.rounds
    return len(rounds.get(0, ())) >= 2 and all(len(rounds.get(k, ())) >= 1 for k in (1, 10))


# the day the monitor began to bring its statistics to the host in one transfer per sampled step (commit 0e8e43e);
# records of it before then do not say how many transfers it made
BATCHED_MONITOR_SINCE = "2026-11-25"


def before_batching(recorded: RecordedResult) -> bool:
    """Whether a ``monitor_overhead`` record measured the earlier monitor, which brought each statistic of each
    parameter back to the host with a ``float()`` of its own (``tests/test_monitor_batched.py`` counts them on
    that code): records that do not say how many transfers the monitor made per sampled step."""
    return recorded.result.transfers_per_sample is None


def _model_size(recorded: RecordedResult) -> str:
    """The model a record timed, from its size profile: ``"the full-size model"``, or for a record made before
    the full profile's re-size, the older, narrower model of its day (its width from the record)."""
    profile = recorded.record.parameters.get("profile")
    if profile is None:
        return "a model size the record does not give"
    if recorded.record.earlier_full_model:
        width = (recorded.record.course_model or {}).get("d_model", "?")
        return f"the full-size model of its day (the older {width}-wide course model, narrower than today's)"
    return "the full-size model" if profile == "full" else f"the {profile!r} profile's model"


def _recorded_noise(recorded: RecordedResult, decimals: int) -> str:
    """The record's noise and its judgement of every 10 steps, for a parenthesis, or that it kept none."""
    if not _has_rounds(recorded):
        return "noise not recorded"
    cost = recorded.result
    return f"every 10 steps {_judged(cost, 10)}; noise {_unsigned(100 * cost.noise(), decimals)}"


def _recorded_monitor(recorded: RecordedResult) -> str:
    """Which monitor a record timed, as a phrase after "with"."""
    return ("the older monitor that read each statistic back separately" if before_batching(recorded)
            else "the monitor on this page")


def _model_phrase(profile: SizeProfile) -> str:
    return "the full-size model" if profile.name == "full" else f"the {profile.name} model"


def hunt_timing_note(hunt: NanHunt, device: torch.device | str, profile: SizeProfile) -> Prose:
    """What the hunt's step timings were: one step of which model, on which kind of device, median of how
    many (a CPU's timing is called one)."""
    kind = torch.device(device).type
    where = "this CPU" if kind == "cpu" else f"this page's {kind.upper()}"
    return Prose(f"one step of {_model_phrase(profile)} on {where}, median of {hunt.repeats}")


def live_timing_note(device: torch.device | str, profile: SizeProfile) -> Prose:
    """What the live overhead run timed: a CPU (labelled as such, never a GPU's number) or this page's GPU, and
    the model size ``profile`` gave it."""
    kind = torch.device(device).type
    model = _model_phrase(profile)
    if kind == "cpu":
        return Prose(f"These are CPU timings of {model} on a shared machine, where a statistic's trip to the host "
                     "costs nothing: they say nothing about a GPU's overhead.")
    return Prose(f"These are timings of {model} on this page's {kind.upper()} device.")


def recorded_overhead_facts(records: Sequence[RecordedResult]) -> dict[str, object]:
    """``gpu_cost``, lesson 9's paragraph on the monitor's cost on a GPU, from the first recorded
    ``monitor_overhead`` run (milliseconds per step and percent over none, judged against the record's noise
    where it kept its rounds, and which monitor it timed), or what to measure when there is no record."""
    if not records:
        return {"gpu_cost": Prose(
            "On a GPU the statistics run on the GPU and come back to the host once per sampled step, where the "
            "host waits for the GPU: measure it there (`monitor_overhead` below) before choosing an interval.")}
    rec = records[0]
    s = recorded_step_seconds(rec)
    d, ms = percent_decimals(rec.result), _ms_decimals(s.values())
    o1, o10 = _signed(100 * (s[1] / s[0] - 1), d), _signed(100 * (s[10] / s[0] - 1), d)
    if not _has_rounds(rec):
        judged = (f"The record keeps one median per setting and not its rounds, so it cannot say how much of the "
                  f"{o10} every 10 steps is noise.")
    else:
        judged = (f"Its unmonitored loop moved by a median {_unsigned(100 * rec.result.noise(), d)} between "
                  f"rounds: every 10 steps is {_judged(rec.result, 10)} there.")
    if before_batching(rec):
        how = ("This record is of the monitor as it was before this page's: it brought each statistic of each "
               "parameter back to the host with a `float()` of its own (`tests/test_monitor_batched.py` counts "
               "them on that code), each a wait for the GPU, so the GPU could not run ahead of Python on a sampled "
               "step (the record does not separate that from the arithmetic). The monitor on this page computes "
               "them where the gradients are and moves them to the host once per sampled step; until a record of "
               "it says what that leaves, sample every 10 steps or less often.")
    else:
        n = rec.result.transfers_per_sample
        how = (f"The statistics run on the GPU and came back to the host in {n:g} transfer"
               f"{'' if n == 1 else 's'} per sampled step there.")
    return {"gpu_cost": Prose(
        f"Recorded on {rec.label} with {_model_size(rec)}: {1e3 * s[0]:.{ms}f} ms a step without a monitor, "
        f"{1e3 * s[1]:.{ms}f} ms watched every step ({o1}) and {1e3 * s[10]:.{ms}f} ms every 10 steps ({o10}). "
        f"{judged} {how}")}


def overhead_takeaway(cost: MonitorOverhead, records: Sequence[RecordedResult],
                      device: torch.device | str) -> Prose:
    """Lesson 9's takeaway on what watching costs: sampling every 10 steps in this page's run on ``device``,
    judged against its noise, then both intervals on the first recorded GPU run (which monitor it timed, and
    its noise), every percentage as its section prints it."""
    _check_intervals(cost)
    run = f"this page's {torch.device(device).type.upper()} run"
    live = f"Sampling every 10 steps {overhead_phrase(cost, 10, run=run)}."
    if not records:
        return Prose(live)
    rec = records[0]
    s, d = recorded_step_seconds(rec), percent_decimals(rec.result)
    return Prose(
        f"{live} On {rec.label}, with {_recorded_monitor(rec)}, watching every step changed the step time by "
        f"{_signed(100 * (s[1] / s[0] - 1), d)} and every 10 steps by {_signed(100 * (s[10] / s[0] - 1), d)} "
        f"({_recorded_noise(rec, d)}).")


# ---- the monitor in the reader's own loop ----------------------------------------------------------------

# torch's optimizers that count their steps in each parameter's state (SGD and LBFGS do not)
_COUNTING_OPTIMIZERS = tuple(getattr(torch.optim, name) for name in (
    "Adadelta", "Adagrad", "Adam", "AdamW", "Adamax", "ASGD", "NAdam", "RAdam", "RMSprop", "Rprop", "SparseAdam")
    if hasattr(torch.optim, name))


def optimizer_steps_taken(optimizer: torch.optim.Optimizer) -> int:
    """How many steps ``optimizer`` has taken, by its own counter (``"step"`` in each parameter's state), which
    a step that ``scaler.step`` skipped does not advance: 0 before the first step that ran. Only for the
    optimizers that keep that counter (Adam, AdamW and most others; not SGD)."""
    if not isinstance(optimizer, _COUNTING_OPTIMIZERS):
        raise TypeError(f"{type(optimizer).__name__} keeps no step counter in its state; use one of "
                        f"{', '.join(c.__name__ for c in _COUNTING_OPTIMIZERS)}")
    return max((int(state["step"]) for state in optimizer.state.values() if "step" in state), default=0)


def scaler_log_table(log: MonitorLog) -> MarkdownTable:
    """One row per step of a monitor's log: the loss, the loss scale its gradients carried and whether the
    step was skipped."""
    if not log.steps:
        raise ValueError("the log has no steps")
    return markdown_table(["step", "loss", "loss scale", "skipped"], [
        (step, f"{loss:.3f}", f"{scale:g}", "yes" if skipped else "no")
        for step, loss, scale, skipped in zip(log.steps, log.losses, log.scales, log.skipped)])


def _steps_phrase(steps: Sequence[int]) -> str:
    return ("step " if len(steps) == 1 else "steps ") + and_list([str(s) for s in steps])


def own_loop_sentence(log: MonitorLog, optimizer_steps: int) -> Prose:
    """What the reader's loop logged, checked against the optimizer's own step counter: which steps the
    monitor logged as skipped (read from the scale), and whether the optimizer took the rest and no more."""
    if not log.steps:
        raise ValueError("the log has no steps")
    if isinstance(optimizer_steps, bool) or not isinstance(optimizer_steps, int) or optimizer_steps < 0:
        raise ValueError(f"optimizer_steps must be a non-negative int, got {optimizer_steps!r}")
    skipped = [st for st, s in zip(log.steps, log.skipped) if s]
    ran = len(log.steps) - len(skipped)
    if not skipped:
        what = (f"No step was skipped: the scale never fell ({log.scales[0]:g} at the first step, "
                f"{log.scales[-1]:g} at the last)")
    else:
        what = (f"The scale fell after {_steps_phrase(skipped)}, so the monitor logged "
                f"{'it' if len(skipped) == 1 else 'them'} as skipped; the scale went from {log.scales[0]:g} at the "
                f"first step to {log.scales[-1]:g} at the last")
    took = f"it took {optimizer_steps} step{'' if optimizer_steps == 1 else 's'} in {len(log.steps)}"
    if optimizer_steps == ran:
        check = f"The optimizer's own step counter agrees: {took}."
    else:
        check = (f"The optimizer's own step counter disagrees: {took}, not {ran}, so the scale's change did not "
                 "tell every skip here.")
    return Prose(f"{what}. {check}")


def skip_exercise_facts(scales: Sequence[float]) -> dict[str, object]:
    """The skip exercise's answer from ``scales``, ``scaler.get_scale()`` read at the start of each step and
    once after the last ``update()``: the skipped steps and the steps after which the scale grew (phrases)."""
    values = [float(s) for s in scales]
    if len(values) < 2:
        raise ValueError("scales needs the reading before the first step and at least one more")
    skipped = [k for k in range(len(values) - 1) if step_was_skipped(values[k], values[k + 1])]
    grew = [k for k in range(len(values) - 1) if values[k + 1] > values[k]]
    return {"ex_skip_steps": Prose(_steps_phrase(skipped) if skipped else "no step"),
            "ex_skip_grew": Prose(_steps_phrase(grew) if grew else "no step"),
            "ex_skip_count": len(values) - 1}


# ---- errata ---------------------------------------------------------------------------------------------

# the errata's verdict on anomaly mode, from whether it raised on an inf and on a NaN gradient
_ANOMALY_LEAD = {(False, True): "It checks backward outputs for NaN only",
                 (True, True): "In this torch it raised on inf as well as NaN",
                 (True, False): "In this torch it raised on inf but not on NaN",
                 (False, False): "In this torch it raised on neither"}


def _forward_overflow_text(message: str | None) -> str:
    """What anomaly mode said of an FP16 overflow in the forward pass (its error's first line, or None)."""
    if message is None:
        return ("The recovery section's FP16 forward overflow, re-run for one step under it (the folded cell "
                "above this table), raised nothing: its infs never became a NaN in a backward output.")
    return (f"A forward overflow is flagged only if its infs later turn into a NaN in some backward output, and "
            f"then late, where that NaN appears: the recovery section's FP16 forward overflow, re-run for one "
            f"step under it (the folded cell above this table), was reported at {_code(anomaly_function(message) or message)}, not at the layer that "
            f"overflowed.")


def errata_rows(forward: NanHunt, demo: RecoveryDemo, cost: MonitorOverhead, records: Sequence[RecordedResult], *,
                inf_raises: bool, nan_raises: bool, overflow_anomaly: str | None) -> list[tuple[str, str]]:
    """Lesson 9's errata, (claim, what this page measured): the forward NaN hunt, the FP16 run without
    recovery, whether anomaly mode raised on an inf and on a NaN gradient, what it said of the recovery
    section's FP16 forward overflow (``overflow_anomaly``: its error's first line, None if it raised nothing;
    :func:`~course_lib.studies.monitoring.anomaly_on_forward_overflow`), and the monitor's overhead here,
    judged against the run's noise (and on the first recorded GPU run, if any)."""
    _check_intervals(cost)
    if forward.kind != "nan":
        raise ValueError(f"the anomaly-mode erratum needs the forward ('nan') hunt, got {forward.kind!r}")
    after = skipped_after_fault(demo)
    named = "nothing" if forward.report is None else _code(forward.report.module)
    noise, d = cost.noise(), percent_decimals(cost)
    o1, o10 = _signed(100 * cost.overhead(1), d), _signed(100 * cost.overhead(10), d)
    j1, j10 = _judged(cost, 1), _judged(cost, 10)
    # one judgement for both intervals is said once
    measured = (f"Every step: {o1} here; every 10 steps: {o10}; both {j1}" if j1 == j10 else
                f"Every step: {o1} here, {j1}; every 10 steps: {o10}, {j10}")
    recorded = ""
    if records:
        rec = records[0]
        s, rd = recorded_step_seconds(rec), percent_decimals(rec.result)
        r1, r10 = s[1] / s[0] - 1, s[10] / s[0] - 1
        recorded = (f" Recorded on {rec.label} with {_recorded_monitor(rec)}: {_signed(100 * r1, rd)} and "
                    f"{_signed(100 * r10, rd)} ({_recorded_noise(rec, rd)}).")
    return [
        ("`detect_anomaly` shows where a NaN came from.",
         f"Only from the backward pass. A NaN made in `{forward.layer}`'s forward output was reported as "
         f"{anomaly_function(forward.anomaly) or 'nothing'}, the backward function at the loss; the locator "
         f"named {named}."),
        ("GradScaler takes care of overflows.",
         f"Of overflows in the scaled gradients. An FP16 forward overflow made it skip {sum(after)} of "
         f"{len(after)} steps and drive the scale to {demo.without.scales[-1]:g}; the run never recovered on "
         "its own."),
        ("`detect_anomaly` catches overflows.",
         f"{_ANOMALY_LEAD[(inf_raises, nan_raises)]}: a backward pass whose gradient is inf "
         f"{'raised' if inf_raises else 'passed without an error'} under it here (`anomaly_mode_raises`, in the "
         f"folded cell above), one whose gradient is NaN "
         f"{'raised' if nan_raises else 'passed'}. {_forward_overflow_text(overflow_anomaly)}"),
        ("Gradient monitoring is too slow to leave on.",
         f"{measured} (the unmonitored loop alone moved by a median {_unsigned(100 * noise, d)} between "
         f"rounds).{recorded}"),
    ]


# ---- the faults recorded on a GPU, beside this page's run ------------------------------------------------

# the output gradient of the model's head: the gradient of the logits, (softmax - one-hot) / tokens per batch
LOGIT_GRADIENT = "head:grad_output"


def tokens_per_batch(model: Mapping[str, object] | None) -> int:
    """Tokens in one batch of the course model: ``context`` times ``batch`` of a course-model mapping
    (:func:`course_lib.models.profile_model`, or a record's ``course_model``)."""
    if model is None:
        raise ValueError("no course model given: the record does not say what it trained")
    sizes: list[int] = []
    for name in ("context", "batch"):
        try:
            value = model[name]
        except (KeyError, TypeError):
            raise ValueError(f"a course model names its context and batch, got {model!r}") from None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"the course model's {name} must be a positive int, got {value!r}")
        sizes.append(value)
    return sizes[0] * sizes[1]


def flushed_at(trend: UnderflowTrend, name: str, step: int) -> float:
    """The share of ``name``'s gradient an unscaled ``trend.fmt`` would flush at a sampled ``step``."""
    if name not in trend.flush:
        raise ValueError(f"the trend did not watch {name!r}")
    if step not in trend.steps:
        raise ValueError(f"step {step} was not sampled (sampled: {trend.steps[0]} to {trend.steps[-1]})")
    return trend.flush[name][trend.steps.index(step)]


def _shape(model: Mapping[str, object]) -> str:
    return f"{model['d_model']} wide, {model['n_layers']} blocks"


def recorded_trend_facts(live: UnderflowTrend, live_model: Mapping[str, object], records: Sequence[RecordedResult],
                         device: torch.device | str) -> dict[str, object]:
    """``rt_table`` and ``rt_sentence``: the live run's fastest-growing gradient and its attention ``qkv`` output
    gradient with the largest share (:func:`growing_gradient`, :func:`qkv_peak_gradient`), flushed at the first
    sampled step, at the last step both runs sampled and at each run's last, on this page's run (``device``,
    ``live_model``: its course model) and on the first recorded ``monitor_faults`` run; and what the tokens per
    batch change for the logit gradient (:data:`LOGIT_GRADIENT`), as far as those numbers go."""
    names = list(dict.fromkeys((growing_gradient(live), qkv_peak_gradient(live))))
    here = f"this page's {torch.device(device).type.upper()} run"
    if not records:
        return {"rt_table": MarkdownTable(""), "rt_sentence": Prose(
            "No GPU record of `monitor_faults` yet: `python -m course_lib.record monitor_faults` makes one.")}
    rec = records[0]
    recorded, rec_model = rec.result.underflow_trend, rec.record.course_model
    if rec_model is None:
        raise ValueError("the record does not say which course model it trained")
    shared = sorted(set(live.steps) & set(recorded.steps))
    if not shared:
        raise ValueError("the live run and the record share no sampled step")
    step, first = shared[-1], shared[0]
    # short run labels: a GPU's full name wraps the column into tall rows; the sentence below names it
    rec_kind = "GPU" if rec.provenance.device_type == "cuda" else rec.provenance.device_type.upper()
    runs = ((f"this page ({torch.device(device).type.upper()})", live, live_model),
            (f"record ({rec_kind})", recorded, rec_model))
    rows = [(_code(n), run, f"{tokens_per_batch(model):,}", f"{100 * flushed_at(t, n, first):.1f}%",
             f"{100 * flushed_at(t, n, step):.1f}%", f"{100 * t.flush[n][-1]:.1f}% (step {t.steps[-1]})")
            for n in names for run, t, model in runs]
    table = markdown_table(["gradient", "run", "tokens per batch", f"step {first}", f"step {step}",
                            "last sampled step"], rows)
    pairs = and_list([f"{100 * flushed_at(recorded, n, step):.1f}% of {_code(n)} there against "
                      f"{100 * flushed_at(live, n, step):.1f}% here" for n in names])
    text = (f"Recorded on {rec.label} with a model {_shape(rec_model)} and {tokens_per_batch(rec_model):,} tokens per "
            f"batch ({here}: {_shape(live_model)}, {tokens_per_batch(live_model):,} tokens), FP16 would flush "
            f"{pairs} at step {step}, the last step both sampled.")
    if LOGIT_GRADIENT in names:
        half = get_format(live.fmt).min_subnormal / 2
        t_live, t_rec = tokens_per_batch(live_model), tokens_per_batch(rec_model)
        larger = flushed_at(recorded, LOGIT_GRADIENT, step) > flushed_at(live, LOGIT_GRADIENT, step)
        text += (f" An entry of {_code(LOGIT_GRADIENT)} is a probability divided by the tokens in the batch (the loss "
                 f"is their mean), so it flushes when that probability is at most the tokens times {half:.3g}, half "
                 f"{live.fmt}'s smallest subnormal: {t_rec * half:.2g} there, {t_live * half:.2g} here, "
                 f"{t_rec / t_live:g} times " + ("higher" if t_rec > t_live else "lower") + " in the record. "
                 + ("That fits the record's larger share, but " if larger == (t_rec > t_live) else
                    "Yet the record's share is not the one that threshold predicts larger, and ")
                 + "the two runs differ in their models too, and neither measured the probabilities, so the record "
                 "does not say how much of the difference the batch explains.")
    qkv = qkv_peak_gradient(live)
    if qkv != LOGIT_GRADIENT:
        text += f" Why the record's share of {_code(qkv)} differs from this page's, the numbers here do not say."
    return {"rt_table": table, "rt_sentence": Prose(text)}


def hunt_timing_table(runs: Mapping[str, Mapping[str, NanHunt]]) -> MarkdownTable:
    """Per run (label to hunts by kind) and hunt, the healthy step timed beside it: milliseconds plain, under the
    locator and under anomaly mode, with each tool's overhead over plain."""
    def ms(seconds: float, plain: float | None = None) -> str:
        return f"{1e3 * seconds:.1f}" + ("" if plain is None else f" ({_signed(100 * (seconds / plain - 1))})")

    rows = [(run, f"beside the {'forward' if kind == 'nan' else 'backward'} fault", h.repeats, ms(h.plain_s),
             ms(h.locator_s, h.plain_s), ms(h.anomaly_s, h.plain_s))
            for run, hunts in runs.items() for kind, h in hunts.items()]
    if not rows:
        raise ValueError("no hunts to tabulate")
    return markdown_table(["run", "healthy step timed", "repeats (median)", "plain (ms)", "locator (ms)",
                           "anomaly mode (ms)"], rows)


def recorded_hunt_sentence(records: Sequence[RecordedResult]) -> Prose:
    """What the first recorded ``monitor_faults`` run's hunts say the two tools cost on its GPU: each tool's
    overhead in both timings of the same healthy step, how far the plain step itself moved between them, and
    how many times as long each tool made the step at the least (rounded down: a lower bound)."""
    if not records:
        return Prose("No GPU record of the hunts yet: `python -m course_lib.record monitor_faults` makes one.")
    rec = records[0]
    hunts = list(rec.result.nan_hunts.values())
    if not hunts:
        raise ValueError("the record holds no NaN hunts")
    loc = and_list([_signed(100 * (h.locator_s / h.plain_s - 1)) for h in hunts])
    ano = and_list([_signed(100 * (h.anomaly_s / h.plain_s - 1)) for h in hunts])
    plain = and_list([f"{1e3 * h.plain_s:.1f}" for h in hunts])
    least = min(min(h.locator_s, h.anomaly_s) / h.plain_s for h in hunts)
    model = rec.record.course_model
    size = f"one step of a model {_shape(model)}" if model is not None else f"one step of {_model_size(rec)}"
    return Prose(f"Recorded on {rec.label}, {size}: the locator added {loc} and anomaly mode {ano} in "
                 f"the {len(hunts)} timings of the same healthy step, whose plain time itself came out at {plain} ms "
                 f"(medians of {hunts[0].repeats}), so the percentages are rough; in every timing there, each tool made "
                 f"the step at least {floor_decimals(least)} times as long.")
