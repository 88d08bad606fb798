"""Lesson 9's phrases on what watching costs (judged against the timing's own noise), on the monitor in the
reader's own loop, on the skip exercise, and the lesson's errata, computed from the results of
studies.monitoring, from the monitor's log and from the recorded GPU runs."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..glue import Prose
from ..monitor.health import MonitorLog, step_was_skipped
from ..results import RecordedResult
from ..tables import MarkdownTable, markdown_table
from .monitoring import MonitorOverhead, NanHunt, RecoveryDemo, anomaly_function, skipped_after_fault

# an overhead against the timing's noise: a cost (every round beyond the noise), one within the noise, one
# beyond it overall but not in every round (unresolved), or a shorter step in every round (which a monitor
# cannot cause: it only adds work)
OVERHEAD_VERDICTS = ("cost", "within noise", "unresolved", "faster")


def _code(name: str | None) -> str:
    return f"`{name}`"


def _and(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _signed(pct: float) -> str:
    """``+4%``, ``-3%``; a value that rounds to zero is ``+0%``, never ``-0%``."""
    text = f"{pct:+.0f}%"
    return "+0%" if text == "-0%" else text


def _range(cost: MonitorOverhead, every: int) -> str:
    """Single rounds' overheads, lowest to highest: ``"+30% to +45%"``."""
    lo, hi = cost.overhead_range(every)
    return f"{_signed(100 * lo)} to {_signed(100 * hi)}"


def _beyond(cost: MonitorOverhead, every: int) -> str:
    """In how many rounds the overhead was beyond the noise in its own direction: ``"4 of 6"``."""
    noise, overall = cost.noise(), cost.overhead(every)
    each = cost.round_overheads(every)
    count = sum(o > noise if overall > 0 else o < -noise for o in each)
    return f"{count} of {len(each)}"


def _interval_name(every: int) -> str:
    return "none" if every == 0 else "every step" if every == 1 else f"every {every} steps"


def overhead_table(cost: MonitorOverhead) -> MarkdownTable:
    """Milliseconds per step with no monitor and with each sampling interval, and the overhead over none."""
    return markdown_table(["monitor", "step (ms)", "overhead"], [
        (_interval_name(k), f"{1e3 * v:.1f}", "" if k == 0 else f"{100 * cost.overhead(k):+.1f}%")
        for k, v in cost.seconds.items()])


def _check_intervals(cost: MonitorOverhead) -> None:
    missing = [k for k in (0, 1, 10) if k not in cost.seconds]
    if missing:
        raise ValueError(f"the overhead run lacks sampling intervals {missing} (0: no monitor)")


def _rule(rounds: int) -> str:
    """The rounds an overhead must clear the noise in: all of them, or, from five rounds on, all but one (one
    burst of load on a shared machine can hit any block)."""
    return "every round" if rounds < 5 else "every round but at most one"


def overhead_verdict(cost: MonitorOverhead, every: int) -> str:
    """One of :data:`OVERHEAD_VERDICTS` for sampling every ``every`` steps: a cost only when the overhead, and
    that of every single round (all but one, from five rounds on), is larger than
    :meth:`MonitorOverhead.noise`, the unmonitored loop's own median change between rounds; a shorter step
    only when they are all shorter by more than it."""
    noise = cost.noise()
    each = cost.round_overheads(every)
    needed = len(each) - (1 if len(each) >= 5 else 0)
    overall = cost.overhead(every)
    if overall > noise and sum(o > noise for o in each) >= needed:
        return "cost"
    if overall < -noise and sum(o < -noise for o in each) >= needed:
        return "faster"
    return "within noise" if abs(overall) <= noise else "unresolved"


def _clause(cost: MonitorOverhead, every: int) -> str:
    """What watching every ``every`` steps did to the mean step, judged against the noise (a sentence's end)."""
    pct, rule = 100 * cost.overhead(every), _rule(len(cost.round_overheads(every)))
    return {
        "cost": f"made the mean step {pct:.0f}% longer: a cost",
        "within noise": f"changed the mean step time by {_signed(pct)}, within that noise: no cost this run can tell "
                        "from zero",
        "unresolved": f"changed the mean step time by {_signed(pct)}, more than that noise overall but only in "
                      f"{_beyond(cost, every)} rounds (it takes {rule}): no cost this run can tell from zero",
        "faster": f"made the mean step {-pct:.0f}% shorter, by more than that noise in {rule}; a monitor only adds "
                  "work, so the machine's load changed during the run",
    }[overhead_verdict(cost, every)]


def overhead_sentence(cost: MonitorOverhead) -> Prose:
    """Lesson 9's sentences on the monitor's cost: the noise (how far the unmonitored loop moved between
    rounds) and the rule, single rounds' ranges, then every step and every 10 steps judged."""
    _check_intervals(cost)
    noise, largest = cost.noise(), max(cost.round_changes())
    ranges = [_range(cost, e) for e in (1, 10)]
    return Prose(
        f"The unmonitored loop, timed once a round, moved by a median {100 * noise:.0f}% from one round to the "
        f"next on its own (at most {100 * largest:.0f}%): that is this run's noise, and an overhead counts as a "
        f"cost only where it exceeded that median in {_rule(len(cost.round_overheads(1)))}. Single rounds' "
        f"overheads ranged from {ranges[0]} (every step) and from {ranges[1]} (every 10 steps). So watching every "
        f"step {_clause(cost, 1)}; watching every 10 steps {_clause(cost, 10)}.")


def overhead_phrase(cost: MonitorOverhead, every: int, *, run: str = "this page's run") -> Prose:
    """What sampling every ``every`` steps cost in ``run``, judged against its noise, as a verb phrase for a
    takeaway (``"cost 8% in this page's run, more than its timing noise of 3% in every round"``)."""
    pct, n = 100 * cost.overhead(every), 100 * cost.noise()
    rule = _rule(len(cost.round_overheads(every)))
    return Prose({
        "cost": f"cost {pct:.0f}% in {run}, above the unmonitored loop's median round-to-round change ({n:.0f}%) "
                f"in {rule}",
        "within noise": f"cost nothing {run} could tell from its timing noise: {_signed(pct)}, where the "
                        f"unmonitored loop alone moved by a median {n:.0f}% between rounds",
        "unresolved": f"cost nothing {run} could tell from its timing noise: {_signed(pct)} overall, but more than "
                      f"the noise (the unmonitored loop's median {n:.0f}% between rounds) in only "
                      f"{_beyond(cost, every)} rounds",
        "faster": f"cost nothing measurable in {run}: its steps were {-pct:.0f}% shorter, more than the timing "
                  f"noise of {n:.0f}% in {rule}, which only a change in the machine's load explains",
    }[overhead_verdict(cost, every)])


def _judged(cost: MonitorOverhead, every: int) -> str:
    rule = _rule(len(cost.round_overheads(every)))
    return {"cost": f"beyond the timing noise in {rule}", "within noise": "within the timing noise",
            "unresolved": f"beyond the timing noise in only {_beyond(cost, every)} rounds",
            "faster": f"shorter by more than the timing noise in {rule}, so the load changed",
            }[overhead_verdict(cost, every)]


def overhead_facts(cost: MonitorOverhead) -> dict[str, object]:
    """Lesson 9's facts of a :class:`MonitorOverhead` run with intervals 1 and 10 and two rounds or more: the
    overhead of each and the noise (percent), the ranges over single rounds (``"+30% to +45%"``), the
    section's sentences (:func:`overhead_sentence`) and the takeaway's phrase for every 10 steps."""
    _check_intervals(cost)
    noise = cost.noise()
    return {
        "cost_every1": 100 * cost.overhead(1),
        "cost_every10": 100 * cost.overhead(10),
        "cost_noise": 100 * noise,
        "cost_range10": Prose(_range(cost, 10)),
        "cost_range1": Prose(_range(cost, 1)),
        "cost_sentence": overhead_sentence(cost),
        "cost_every10_phrase": overhead_phrase(cost, 10),
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


def before_batching(recorded: RecordedResult) -> bool:
    """Whether a ``monitor_overhead`` record measured the earlier monitor, which brought each statistic of each
    parameter back to the host with its own ``float()`` (about six per parameter): records that do not say
    how many transfers the monitor made per sampled step."""
    return recorded.result.transfers_per_sample is None


def live_timing_note(device: torch.device | str) -> Prose:
    """What the live overhead run timed: a CPU (labelled as such, never a GPU's number) or this page's GPU."""
    kind = torch.device(device).type
    if kind == "cpu":
        return Prose("These are CPU timings of the small model on a shared machine, where a statistic's trip to "
                     "the host costs nothing: they say nothing about a GPU's overhead.")
    return Prose(f"These are timings on this page's {kind.upper()} device, at this page's model size.")


def recorded_overhead_facts(records: Sequence[RecordedResult]) -> dict[str, object]:
    """Lesson 9's phrases on the monitor's cost on a GPU, from the first recorded ``monitor_overhead`` run
    (milliseconds per step and percent over none, judged against the record's noise where it kept its rounds,
    and whether it measured the monitor before it batched its statistics), or what to measure when there is
    no record."""
    if not records:
        return {
            "gpu_cost": Prose("On a GPU the statistics run on the GPU and come back to the host once per sampled "
                              "step, where the host waits for the GPU: measure it there (`monitor_overhead` below) "
                              "before choosing an interval."),
            "gpu_cost_short": Prose(""),
            "gpu_cost_every1": Prose(""),
        }
    rec = records[0]
    s = recorded_step_seconds(rec)
    o1, o10 = s[1] / s[0] - 1, s[10] / s[0] - 1
    if not _has_rounds(rec):
        judged = (f"The record keeps one median per setting and not its rounds, so it cannot say how much of the "
                  f"{_signed(100 * o10)} every 10 steps is noise.")
        short = "a median whose noise the record does not keep"
    else:
        noise = rec.result.noise()
        judged = (f"Its unmonitored loop moved by a median {100 * noise:.0f}% between rounds: every 10 steps is "
                  f"{_judged(rec.result, 10)} there.")
        short = f"{_judged(rec.result, 10)} (noise {100 * noise:.0f}%)"
    old = before_batching(rec)
    if old:
        how = ("This record is of the monitor as it was before this page's: it brought every parameter's "
               "statistics back to the host one `float()` at a time, about six per parameter, each a wait for the "
               "GPU, so the GPU could not run ahead of Python on a sampled step (the record does not separate that "
               "from the arithmetic). The monitor on this page computes them where the gradients are and moves "
               "them to the host once per sampled step; until a record of it says what that leaves, sample every 10 "
               "steps or less often.")
        era = " (the monitor before it batched its statistics)"
    else:
        n = rec.result.transfers_per_sample
        how = (f"The statistics run on the GPU and came back to the host in {n:g} transfer"
               f"{'' if n == 1 else 's'} per sampled step there.")
        era = ""
    return {
        "gpu_cost": Prose(
            f"Recorded on {rec.label} with the full-size model: {1e3 * s[0]:.1f} ms a step without a monitor, "
            f"{1e3 * s[1]:.1f} ms watched every step ({_signed(100 * o1)}) and {1e3 * s[10]:.1f} ms every 10 steps "
            f"({_signed(100 * o10)}). {judged} {how}"),
        "gpu_cost_short": Prose(f"; {_signed(100 * o10)} recorded on {rec.label} with the full-size model{era}, "
                                f"{short}"),
        "gpu_cost_every1": Prose(f" (every step made the step {s[1] / s[0]:.1f}x as long there{era})"),
    }


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
    return ("step " if len(steps) == 1 else "steps ") + _and([str(s) for s in steps])


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


def errata_rows(forward: NanHunt, demo: RecoveryDemo, cost: MonitorOverhead, records: Sequence[RecordedResult], *,
                inf_raises: bool, nan_raises: bool) -> list[tuple[str, str]]:
    """Lesson 9's errata, (claim, what this page measured): the forward NaN hunt, the FP16 run without
    recovery, whether anomaly mode raised on an inf and on a NaN gradient, and the monitor's overhead here,
    judged against the run's noise (and on the first recorded GPU run, if any)."""
    _check_intervals(cost)
    if forward.kind != "nan":
        raise ValueError(f"the anomaly-mode erratum needs the forward ('nan') hunt, got {forward.kind!r}")
    after = skipped_after_fault(demo)
    named = "nothing" if forward.report is None else _code(forward.report.module)
    noise = cost.noise()
    o1, o10 = cost.overhead(1), cost.overhead(10)
    recorded = ""
    if records:
        s = recorded_step_seconds(records[0])
        r1, r10 = s[1] / s[0] - 1, s[10] / s[0] - 1
        judged = ("medians whose noise the record does not keep" if not _has_rounds(records[0]) else
                  f"every 10 steps {_judged(records[0].result, 10)} (noise {100 * records[0].result.noise():.0f}%)")
        era = " with the monitor before it batched its statistics" if before_batching(records[0]) else ""
        recorded = f" Recorded on {records[0].label}{era}: {_signed(100 * r1)} and {_signed(100 * r10)}, {judged}."
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
         f"{'raised' if inf_raises else 'passed without an error'} under it here, one whose gradient is NaN "
         f"{'raised' if nan_raises else 'passed'}; FP16 overflows to inf."),
        ("Gradient monitoring is too slow to leave on.",
         f"Every step: {_signed(100 * o1)} here, {_judged(cost, 1)}; every 10 steps: {_signed(100 * o10)}, "
         f"{_judged(cost, 10)} (the unmonitored loop alone moved by a median {100 * noise:.0f}% between "
         f"rounds).{recorded}"),
    ]
