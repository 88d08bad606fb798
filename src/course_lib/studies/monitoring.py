"""Lesson 9's studies: NaN hunts, an overflow recovered, underflow over a run, a dying layer, and what watching
costs; and what the lesson's prose and tables say about the faults (the overhead, the reader's own loop and
the errata: studies.monitoring_prose)."""

from __future__ import annotations

import math
import re
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..bench import time_function
from ..checkup import Checkup, slower_every_step
from ..formats import get_format
from ..glue import Prose, and_list
from ..models import course_setup
from ..monitor.faults import PlantedFault, plant_fault
from ..monitor.health import Alert, GradientHealthMonitor, MonitorLog, Thresholds
from ..monitor.locator import NonFiniteLocator, NonFiniteReport
from ..monitor.matmul_stats import MatmulStats
from ..monitor.recovery import RecoveryEvent, RecoveryPolicy, train_with_recovery
from ..tables import MarkdownTable, markdown_table
from ..train import TrainConfig, TrainState, get_recipe, train


@dataclass(frozen=True)
class NanHunt:
    """One planted fault hunted two ways. ``report``: what :class:`NonFiniteLocator` named (None: nothing);
    ``anomaly``: what ``torch.autograd.detect_anomaly`` said (its error's first line, or None when it raised
    nothing); seconds for one forward+backward plainly, under the locator and under anomaly mode (median
    of ``repeats``, on a healthy step)."""

    layer: str
    kind: str
    report: NonFiniteReport | None
    anomaly: str | None
    plain_s: float
    locator_s: float
    anomaly_s: float
    repeats: int = 5


def _step_seconds(fn, repeats: int, device: torch.device) -> float:
    """The median wall time of ``repeats`` calls of ``fn()``, timed by the course's harness
    (:func:`course_lib.bench.time_function`: CUDA events on a GPU, so a step's asynchronous kernels count)."""
    return time_function(fn, device=device, warmup=0, budget_s=1e-9, min_repeats=repeats,
                         max_repeats=repeats).median


def nan_hunt(profile, device: torch.device | str = "cpu", *, layer: str = "blocks.1.attn.qkv",
             kind: str = "nan_backward", repeats: int = 5, seed: int = 0) -> NanHunt:
    """Plant a ``kind`` fault (see :class:`PlantedFault`) in ``layer`` of the course model, run one step
    under the locator and one under anomaly mode, and time a healthy step each way."""
    import copy


    if kind not in ("nan", "nan_backward"):
        raise ValueError(f"kind must be 'nan' or 'nan_backward', got {kind!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int):
        raise TypeError(f"repeats must be an int, got {type(repeats).__name__}")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1 (the timings are a median of them), got {repeats}")
    setup = course_setup(profile, device, steps=1, default_steps=(1, 1), seed=seed)
    healthy = setup.model(seed)
    x, y = setup.sampler.batch(0, setup.device)

    def step(model):
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()

    def located():
        with NonFiniteLocator(healthy):
            step(healthy)

    def anomalous():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # anomaly mode warns that it is slow; the timing says how slow
            with torch.autograd.detect_anomaly(check_nan=True):
                step(healthy)

    step(healthy)   # warm-up
    plain_s = _step_seconds(lambda: step(healthy), repeats, setup.device)
    locator_s = _step_seconds(located, repeats, setup.device)
    anomaly_s = _step_seconds(anomalous, repeats, setup.device)

    faulty = copy.deepcopy(healthy)
    plant_fault(faulty, layer, kind)
    with NonFiniteLocator(faulty) as locator:
        step(faulty)
    faulty = copy.deepcopy(healthy)
    plant_fault(faulty, layer, kind)
    message = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=True):
                step(faulty)
    except RuntimeError as exc:
        message = str(exc).strip().splitlines()[0]
    return NanHunt(layer, kind, locator.report, message, plain_s, locator_s, anomaly_s, repeats)


def anomaly_on_forward_overflow(profile, device: torch.device | str = "cpu", *, layer: str = "blocks.0.fc",
                                seed: int = 0) -> str | None:
    """One step of the course model under FP16 autocast with the overflow of :func:`overflow_recovery`
    planted in ``layer`` from the first step, run under ``torch.autograd.detect_anomaly(check_nan=True)``:
    the first line of anomaly mode's error (which names the first backward function that returned a NaN),
    or None if it raised nothing. Anomaly mode checks backward outputs only, so a forward overflow shows
    only where its NaN first comes out of a backward function."""
    setup = course_setup(profile, device, steps=1, default_steps=(1, 1), seed=seed)
    model = setup.model(seed)
    plant_fault(model, layer, "overflow")
    x, y = setup.sampler.batch(0, setup.device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")   # anomaly mode warns that it is slow
            with torch.autograd.detect_anomaly(check_nan=True):
                with torch.autocast(setup.device.type, dtype=torch.float16):
                    loss = model(x, y)[1]
                loss.backward()
    except RuntimeError as exc:
        return str(exc).strip().splitlines()[0]
    return None


def _step_in_run(name: str, step: int | None, n: int) -> int:
    """A fault's start step inside a run of ``n`` steps: a third of the way by default, else checked."""
    step = n // 3 if step is None else step
    if not 0 < step < n:
        raise ValueError(f"{name} must lie in 1..{n - 1}, got {step}")
    return step


@dataclass(frozen=True)
class RecoveryDemo:
    """The same FP16 run with an activation that outgrows FP16 at ``fault_at``, without and with recovery:
    the monitors' logs (step, loss, scale, skipped) and the recovery events."""

    fault_at: int
    steps: int
    without: MonitorLog
    without_alerts: tuple[Alert, ...]
    with_recovery: MonitorLog
    events: tuple[RecoveryEvent, ...]


def overflow_recovery(profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                      fault_at: int | None = None, layer: str = "blocks.0.fc", checkpoint_dir: str | Path | None = None,
                      seed: int = 0) -> RecoveryDemo:
    """Train the course model with FP16 autocast and GradScaler, with an overflow planted in ``layer`` from
    step ``fault_at``; once as it is, once under :func:`train_with_recovery`."""
    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 200), seed=seed)
    n = setup.steps
    fault_at = _step_in_run("fault_at", fault_at, n)
    logs: list[MonitorLog] = []
    alerts: list[tuple[Alert, ...]] = []
    events: tuple[RecoveryEvent, ...] = ()
    for recover in (False, True):
        model = setup.model(seed)
        plant_fault(model, layer, "overflow", after=fault_at)
        state = TrainState(model, get_recipe("fp16_autocast_scaler", device), TrainConfig(steps=n), device)
        watch = GradientHealthMonitor(model, dtype=torch.float16, every=max(1, n // 10))
        if recover:
            with tempfile.TemporaryDirectory() as tmp:
                folder = Path(checkpoint_dir) if checkpoint_dir is not None else Path(tmp)
                run = train_with_recovery(state, setup.sampler, folder / "last_good.pt", monitor=watch,
                                          policy=RecoveryPolicy(checkpoint_every=max(1, n // 10)))
            events = tuple(run.events)
        else:
            train(state, setup.sampler, monitor=watch)
        logs.append(watch.log)
        alerts.append(tuple(watch.alerts))
    return RecoveryDemo(fault_at, n, logs[0], alerts[0], logs[1], events)


@dataclass(frozen=True)
class UnderflowTrend:
    """Per sampled step of an FP32 run, per parameter and per linear layer's output gradient (named
    ``"<layer>:grad_output"``), the share of the gradient that would flush to zero in ``fmt`` without a loss
    scale (``flush[name][i]`` at ``steps[i]``), beside the loss per step."""

    fmt: str
    steps: tuple[int, ...]
    flush: dict[str, tuple[float, ...]]
    losses: tuple[float, ...]
    alerts: tuple[Alert, ...]
    threshold: float = 0.1   # the alert's share, lowered from the monitor's default (records before it: 0.1)


def underflow_trend(profile, device: torch.device | str = "cpu", *, steps: int | None = None, every: int = 5,
                    fmt: str = "FP16", threshold: float = 0.1, seed: int = 0) -> UnderflowTrend:
    """Train the course model in FP32 while a monitor asks what an unscaled ``fmt`` would flush."""
    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(60, 300), seed=seed)
    model = setup.model(seed)
    dtype = get_format(fmt).torch_dtype_or_none()
    watch = GradientHealthMonitor(model, dtype=fmt if dtype is None else dtype, every=every,
                                  thresholds=Thresholds(underflow_fraction=threshold), activations=True)
    state = TrainState(model, get_recipe("fp32", device), TrainConfig(steps=setup.steps), device)
    try:
        history = train(state, setup.sampler, monitor=watch)
    finally:
        watch.close()
    flush = {k: tuple(v) for k, v in watch.log.layer_series("flush").items()}
    return UnderflowTrend(get_format(fmt).name, tuple(watch.log.sampled_steps), flush, tuple(history.losses),
                          tuple(watch.alerts), threshold)


# lesson 9's two planted NaNs: (kind, layer), one made in a forward pass and one in a backward pass
NAN_HUNTS = (("nan", "blocks.1.fc"), ("nan_backward", "blocks.1.attn.qkv"))


@dataclass(frozen=True)
class MonitorFaults:
    """Lesson 9's faults, each in its own run: the monitor's ``underflow_trend`` over a healthy FP32 run,
    ``nan_hunts`` by kind (:data:`NAN_HUNTS`), and the FP16 overflow with and without ``recovery``."""

    underflow_trend: UnderflowTrend
    nan_hunts: dict[str, NanHunt]
    recovery: RecoveryDemo


def monitor_faults(profile, device: torch.device | str = "cpu") -> MonitorFaults:
    """Run :func:`underflow_trend`, a :func:`nan_hunt` per entry of :data:`NAN_HUNTS` and
    :func:`overflow_recovery`, each at its defaults (every 5 steps, FP16, 10% threshold for the trend)."""
    trend = underflow_trend(profile, device)
    hunts = {kind: nan_hunt(profile, device, layer=layer, kind=kind) for kind, layer in NAN_HUNTS}
    return MonitorFaults(trend, hunts, overflow_recovery(profile, device))


@dataclass(frozen=True)
class MonitorOverhead:
    """Seconds per optimizer step (the mean over a block of steps, median over blocks) of the same run
    without a monitor and with one sampling every ``every`` steps (keys: 0 for none), and the overhead
    relative to none. Means, not medians of single steps: a median would never see the sampled steps."""

    seconds: dict[int, float]
    rounds: dict[int, tuple[float, ...]] = field(default_factory=dict)   # per round, the block's mean step
    # the monitor's device-to-host transfers per sampled step (one since it batches its statistics); None
    # in records of the earlier monitor, which brought each statistic of each parameter back with a float() of
    # its own (tests/test_monitor_batched.py counts those on that code)
    transfers_per_sample: float | None = None

    def overhead(self, every: int) -> float:
        return self.seconds[every] / self.seconds[0] - 1.0

    def overhead_range(self, every: int) -> tuple[float, float]:
        """The lowest and highest overhead of a single round (each round's monitored block against the
        unmonitored block next to it): how much the timing moved from round to round."""
        each = self.round_overheads(every)
        return min(each), max(each)

    def round_overheads(self, every: int) -> list[float]:
        """Per round, the overhead of the block sampling every ``every`` steps over the unmonitored block of
        the same round (shares)."""
        if every not in self.rounds or 0 not in self.rounds or not self.rounds[every]:
            raise ValueError(f"no per-round times for every={every}")
        return [m / n - 1.0 for m, n in zip(self.rounds[every], self.rounds[0])]

    def round_changes(self) -> list[float]:
        """The unmonitored block's mean step time from one round to the next, as relative changes (shares;
        the same loop timed again, so what it moves by on its own). Needs two rounds or more."""
        base = self.rounds.get(0, ())
        if len(base) < 2:
            raise ValueError(f"the noise needs the unmonitored block timed in two rounds or more, got {len(base)}")
        return [abs(b / a - 1.0) for a, b in zip(base, base[1:])]

    def noise(self) -> float:
        """The timing's noise: the median of :meth:`round_changes` (the upper one of an even count), a share.
        A median, not the largest change, so that one burst of load on a shared machine does not hide every
        effect; an overhead counts as a cost only where every round exceeds it (lesson 9's prose)."""
        changes = sorted(self.round_changes())
        return changes[len(changes) // 2]


def monitor_overhead(profile, device: torch.device | str = "cpu", *, everies=(1, 10), steps: int = 20,
                     rounds: int = 3, seed: int = 0) -> MonitorOverhead:
    """Time optimizer steps of one run, alternating blocks of ``steps`` steps without a monitor and with a
    monitor at each sampling interval in ``everies`` (``rounds`` times, so drift affects all alike)."""
    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps * (len(everies) + 1) * rounds + 2,
                         default_steps=(10**6, 10**6), seed=seed)
    model = setup.model(seed)
    state = TrainState(model, get_recipe("fp32", device), TrainConfig(steps=setup.steps), device)
    train(state, setup.sampler, steps=2)   # warm-up
    samples: dict[int, list[float]] = {0: [], **{e: [] for e in everies}}
    transfers, sampled = 0, 0
    for _ in range(rounds):
        for every in (0, *everies):
            watch = GradientHealthMonitor(model, every=every) if every else None
            h = train(state, setup.sampler, steps=steps, monitor=watch)
            samples[every].append(sum(h.step_seconds) / len(h.step_seconds))
            if watch is not None:
                transfers, sampled = transfers + watch.host_transfers, sampled + len(watch.log.sampled_steps)
    return MonitorOverhead({k: sorted(v)[len(v) // 2] for k, v in samples.items()},
                           {k: tuple(v) for k, v in samples.items()}, transfers / sampled if sampled else None)


@dataclass(frozen=True)
class DeadLayerRun:
    """An FP32 run of the course model in which ``layer`` stops passing anything on from step ``dies_at``
    (its output multiplied by zero): the monitor's log and alerts."""

    layer: str
    dies_at: int
    log: MonitorLog
    alerts: tuple[Alert, ...]


def dead_layer_run(profile, device: torch.device | str = "cpu", *, layer: str = "blocks.1.fc",
                   steps: int | None = None, dies_at: int | None = None, every: int = 2,
                   seed: int = 0) -> DeadLayerRun:
    """Train the course model in FP32 under a monitor (sampling every ``every`` steps) while ``layer``
    dies at ``dies_at`` (default: a third of the way)."""
    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(40, 200), seed=seed)
    n = setup.steps
    dies_at = _step_in_run("dies_at", dies_at, n)
    model = setup.model(seed)
    plant_fault(model, layer, "dead", after=dies_at)
    watch = GradientHealthMonitor(model, every=every)
    state = TrainState(model, get_recipe("fp32", device), TrainConfig(steps=n), device)
    train(state, setup.sampler, monitor=watch)
    return DeadLayerRun(layer, dies_at, watch.log, tuple(watch.alerts))


# --- What lesson 9's prose and tables say about these results -------------------------------------------


def _code(name: str | None) -> str:
    return f"`{name}`"


def alert_table(alerts: Sequence[Alert]) -> MarkdownTable:
    """The monitor's alerts, one row each (step, kind, gradient, message); ``"No alerts."`` when empty."""
    if not alerts:
        return MarkdownTable("No alerts.")
    return markdown_table(["step", "alert", "gradient", "message"],
                          [(a.step, a.kind, _code(a.layer), a.message) for a in alerts])


def growing_gradient(trend: UnderflowTrend) -> str:
    """The watched gradient whose flushed share grew most from the first sampled step to the last."""
    if not trend.flush:
        raise ValueError("the trend has no sampled gradients or no losses")
    return max(trend.flush, key=lambda n: trend.flush[n][-1] - trend.flush[n][0])


def qkv_peak_gradient(trend: UnderflowTrend) -> str:
    """The attention ``qkv`` output gradient (a name ending ``qkv:grad_output``) with the largest flushed share
    at any sampled step."""
    qkv = [n for n in trend.flush if n.endswith("qkv:grad_output")]
    if not qkv:
        raise ValueError("the trend watched no attention qkv output gradient (names ending 'qkv:grad_output')")
    return max(qkv, key=lambda n: max(trend.flush[n]))


def _bias_facts(trend: UnderflowTrend, bias: Sequence[str]) -> dict[str, object]:
    """``trend_bias_share``, the largest share of the ``bias`` parameters' values flushed at any sampled step
    (percent), and ``trend_bias_shares``, a phrase on their largest share at the first sampled step and, where
    it is larger later, at its peak (``"up to 32.8% of their values at step 0, and 35.4% at their peak, step 5"``)."""
    if not bias:
        return {"trend_bias_share": 0.0, "trend_bias_shares": Prose("no share")}
    first = max(trend.flush[n][0] for n in bias)
    top, at = max((v, -i) for n in bias for i, v in enumerate(trend.flush[n]))
    their = "its" if len(bias) == 1 else "their"
    text = f"{'' if len(bias) == 1 else 'up to '}{100 * first:.1f}% of {their} values at step {trend.steps[0]}"
    if top > first:
        text += f", and {100 * top:.1f}% at {their} peak, step {trend.steps[-at]}"
    return {"trend_bias_share": 100 * top, "trend_bias_shares": Prose(text)}


def underflow_trend_facts(trend: UnderflowTrend) -> dict[str, object]:
    """Lesson 9's facts of an :class:`UnderflowTrend`: the gradient whose flushed share grew most (percent at
    the first and last sampled step, and the step its alert fired), the loss at the first and last step,
    the ``qkv.bias`` parameters that alerted (and their largest flushed share, percent, with a phrase on their
    shares at the first sampled step and at their peak), and the attention ``qkv`` output gradient with the
    largest flushed share (its share at the first sampled step, its peak, the step of the peak, its last share);
    ``trend_every``: the steps between two samples. Every share is of all the gradient's values, as the figure
    and the record's table give them (the alerts' messages count the non-zero values only)."""
    if not trend.losses:
        raise ValueError("the trend has no sampled gradients or no losses")
    growing, peak_name = growing_gradient(trend), qkv_peak_gradient(trend)
    first_alert = {a.layer: a.step for a in trend.alerts}
    bias = sorted(n for n in first_alert if n is not None and n.endswith("qkv.bias"))
    peak = trend.flush[peak_name]
    return {
        **_bias_facts(trend, bias),
        "trend_steps": len(trend.losses),
        "trend_every": trend.steps[1] - trend.steps[0] if len(trend.steps) > 1 else len(trend.losses),
        "trend_grow_name": Prose(_code(growing)),
        "trend_grow_first": 100 * trend.flush[growing][0],
        "trend_grow_last": 100 * trend.flush[growing][-1],
        "trend_grow_alert": Prose(f"at step {first_alert[growing]}" if growing in first_alert else "not at all"),
        "trend_threshold": 100 * trend.threshold,
        "trend_default_threshold": 100 * Thresholds().underflow_fraction,
        "trend_loss_first": trend.losses[0],
        "trend_loss_last": trend.losses[-1],
        "trend_bias": Prose(" and ".join(_code(n) for n in bias) or "no bias"),
        "trend_qkv_name": Prose(_code(peak_name)),
        "trend_qkv_first": 100 * peak[0],
        "trend_qkv_first_step": trend.steps[0],
        "trend_qkv_peak": 100 * max(peak),
        "trend_qkv_peak_step": trend.steps[peak.index(max(peak))],
        "trend_qkv_last": 100 * peak[-1],
    }


def other_alerts_sentence(alerts: Sequence[Alert]) -> Prose:
    """One sentence on the alerts a run raised besides the one the section is about; it names them as the
    first section's key-bias alerts when every one is on a ``qkv.bias``."""
    if not alerts:
        return Prose("It raised no other alert.")
    where = [a.layer if a.layer is not None else "the run" for a in alerts]
    kinds = {a.kind for a in alerts}
    if len(kinds) == 1:    # one kind: "underflow alerts on `a` and `b`"
        names = sorted(_code(w) if w != "the run" else w for w in where)
        what = f"{kinds.pop()} alert{'s' if len(alerts) > 1 else ''} on " + and_list(names)
    else:
        what = and_list(sorted(f"{a.kind} on {_code(w) if w != 'the run' else w}" for a, w in zip(alerts, where)))
    steps = sorted({a.step for a in alerts})
    when = ("at step " if len(steps) == 1 else "at steps ") + and_list([str(s) for s in steps])
    if all("qkv.bias" in (a.layer or "") for a in alerts):
        when += ", the key bias" + ("es" if len(alerts) > 1 else "") + " of the first section again"
    if len(alerts) == 1:
        return Prose(f"Its other alert was {'an' if what[0] in 'aeiou' else 'a'} {what} {when}.")
    return Prose(f"Its {len(alerts)} other alerts were {what} {when}.")


def dead_layer_facts(dead: DeadLayerRun) -> dict[str, object]:
    """Lesson 9's facts of a :class:`DeadLayerRun`: how often the monitor sampled (``dead_every``, steps), the
    layer, the step it died and the step of the first zero-gradient alert, the parameters so alerted, the
    loss at the last step before the death and at the end, and a sentence on the other alerts."""
    zero = [a for a in dead.alerts if a.kind == "zero_gradients"]
    if not zero:
        raise ValueError("the run raised no zero_gradients alert: the monitor did not see the layer die")
    before = [loss for st, loss in zip(dead.log.steps, dead.log.losses) if st < dead.dies_at]
    after = [loss for st, loss in zip(dead.log.steps, dead.log.losses) if st >= dead.dies_at]
    if not before or not after:
        raise ValueError(f"the log needs losses before and from step {dead.dies_at}")
    gaps = {b - a for a, b in zip(dead.log.sampled_steps, dead.log.sampled_steps[1:])}
    if len(gaps) != 1:
        raise ValueError(f"the log's sampled steps {dead.log.sampled_steps} have no single interval")
    return {
        "dead_every": gaps.pop(),
        "dead_layer": Prose(_code(dead.layer)),
        "dead_at": dead.dies_at,
        "dead_alert_step": min(zero, key=lambda a: a.step).step,
        "dead_alert_layers": Prose(", ".join(sorted(_code(a.layer) for a in zero))),
        "dead_loss_at": before[-1],
        "dead_loss_end": after[-1],
        "dead_other_alerts": other_alerts_sentence([a for a in dead.alerts if a.kind != "zero_gradients"]),
    }


def anomaly_function(message: str | None) -> str | None:
    """The autograd function an anomaly-mode error names (the first quoted name in ``"Function 'X'
    returned nan values ..."``); the whole message when it quotes none; None for no message."""
    if message is None:
        return None
    parts = message.split("'")
    return parts[1] if len(parts) > 2 else message


def nan_hunt_table(hunts: Iterable[NanHunt]) -> MarkdownTable:
    """One row per hunt: where the NaN was planted, what the locator named, what anomaly mode said."""
    rows = []
    for h in hunts:
        named = "nothing" if h.report is None else f"{_code(h.report.module)}, {h.report.phase} pass"
        rows.append((f"NaN in the {'forward' if h.kind == 'nan' else 'backward'} pass", _code(h.layer), named,
                     h.anomaly or "nothing"))
    return markdown_table(["planted", "in", "the locator names", "anomaly mode says"], rows)


def nan_hunt_facts(forward: NanHunt, backward: NanHunt) -> dict[str, object]:
    """Lesson 9's facts of the two hunts: the forward fault's layer and what anomaly mode named for it, and
    the cost of the locator and of anomaly mode on a healthy step (percent over a plain step, from the
    backward hunt's timings; ``hunt_locator_costs`` and ``hunt_anomaly_costs``: both hunts' timings of that
    step, forward then backward, as text)."""
    if forward.kind != "nan" or backward.kind != "nan_backward":
        raise ValueError(f"expected a 'nan' and a 'nan_backward' hunt, got {forward.kind!r} and {backward.kind!r}")
    named = anomaly_function(forward.anomaly)
    return {
        "hunt_fwd_layer": Prose(_code(forward.layer)),
        "hunt_fwd_anomaly": Prose(_code(named) if named else "nothing"),
        "hunt_locator_cost": 100 * (backward.locator_s / backward.plain_s - 1),
        "hunt_anomaly_cost": 100 * (backward.anomaly_s / backward.plain_s - 1),
        "hunt_locator_costs": Prose(and_list([_percent(h.locator_s / h.plain_s - 1) for h in (forward, backward)])),
        "hunt_anomaly_costs": Prose(and_list([_percent(h.anomaly_s / h.plain_s - 1) for h in (forward, backward)])),
    }


def _percent(share: float) -> str:
    return f"{100 * share:+.0f}%"


def locator_report_table(report: NonFiniteReport | None) -> MarkdownTable:
    """What :class:`NonFiniteLocator` saw at the module it names, one row per tensor: dtype and shape, largest
    finite magnitude, NaN and inf counts. In a backward pass the hook's inputs are the gradients arriving at the
    module (of its output) and its outputs the gradients it passes back (of its inputs); the rows say so."""
    if report is None:
        return MarkdownTable("The locator found no non-finite value.")
    if report.phase not in ("forward", "backward"):
        raise ValueError(f"a report's phase is 'forward' or 'backward', got {report.phase!r}")
    backward = report.phase == "backward"
    kinds = (("gradient arriving (of its output)", report.inputs), ("gradient passed back (of its input)",
                                                                     report.outputs)) if backward else \
        (("input", report.inputs), ("output", report.outputs))
    where = f"{_code(report.op)} in {_code(report.module)}" if report.op else _code(report.module)
    rows = [(f"{kind} {i + 1}" if len(tensors) > 1 else kind, f"{t.dtype} {list(t.shape)}", 
             f"{t.max_abs:.3g}" if math.isfinite(t.max_abs) else "none finite", t.nan, t.inf) for kind, tensors in kinds for i, t in enumerate(tensors)]
    return markdown_table([f"{where}, {report.phase} pass", "dtype and shape", "largest finite magnitude", "NaN",
                           "inf"], rows)


def skipped_after_fault(demo: RecoveryDemo) -> list[bool]:
    """Per step of the run without recovery from the fault on, whether the scaler skipped it."""
    return [s for step, s in zip(demo.without.steps, demo.without.skipped) if step >= demo.fault_at]


def recovery_facts(demo: RecoveryDemo) -> dict[str, object]:
    """Lesson 9's facts of a :class:`RecoveryDemo`: the FP16 value above which the planted fault overflows,
    the skipped steps and final scale without recovery, and the first rollback (step, alert, target) and the
    losses with recovery."""
    if not demo.events:
        raise ValueError("the recovered run has no recovery event: nothing rolled back")
    after = skipped_after_fault(demo)
    event = demo.events[0]
    return {
        "rec_threshold": get_format("FP16").max_finite / PlantedFault(torch.nn.Identity(), "overflow").factor,
        "rec_fault_at": demo.fault_at,
        "rec_steps": demo.steps,
        "rec_skipped": sum(after),
        "rec_after": len(after),
        "rec_final_scale": demo.without.scales[-1],
        "rec_alert_step": event.step,
        "rec_alert_kind": event.alert.kind,
        "rec_back_to": event.rolled_back_to,
        "rec_final_loss": demo.with_recovery.losses[-1],
        "rec_start_loss": demo.with_recovery.losses[0],
        "rec_alerts_without": Prose(", ".join(sorted({a.kind for a in demo.without_alerts}))),
    }


def _lost_share(row: MatmulStats) -> float:
    return row.flush + row.subnormal


def matmul_table(stats: Mapping[str, Sequence[MatmulStats]]) -> MarkdownTable:
    """Per linear layer and operand, the percent of its values lost or subnormal in each view (one column
    per key of ``stats``, in order); every view must list the same operands in the same order."""
    if not stats:
        raise ValueError("no views of the operands to tabulate")
    views = list(stats)
    first = stats[views[0]]
    for v in views[1:]:
        if [(r.layer, r.operand) for r in stats[v]] != [(r.layer, r.operand) for r in first]:
            raise ValueError(f"view {v!r} lists other operands than {views[0]!r}")
    rows = [(_code(r.layer), r.operand, *(f"{100 * _lost_share(stats[v][i]):.2f}%" for v in views))
            for i, r in enumerate(first)]
    return markdown_table(["layer", "operand", *(f"{v}: lost or subnormal" for v in views)], rows)


def matmul_facts(stats: Mapping[str, Sequence[MatmulStats]], *, fp16: str = "FP16",
                 unscaled: str = "E4M3 unscaled", scaled: str = "E4M3 per-tensor scale") -> dict[str, object]:
    """Lesson 9's facts of the operand views: the operand the unscaled E4M3 view loses most of (and its
    share, percent), and the largest share lost in the FP16 and the scaled E4M3 views (percent)."""
    missing = [k for k in (fp16, unscaled, scaled) if not stats.get(k)]
    if missing:
        raise ValueError(f"no operands for the views {missing}; have {list(stats)}")
    worst = max(stats[unscaled], key=_lost_share)
    return {
        "mm_worst_layer": Prose(f"{_code(worst.layer)} {worst.operand}"),
        "mm_worst_share": 100 * _lost_share(worst),
        "mm_fp16_max": 100 * max(_lost_share(r) for r in stats[fp16]),
        "mm_scaled_max": 100 * max(_lost_share(r) for r in stats[scaled]),
    }


def checkup_facts(report: Checkup) -> dict[str, object]:
    """The pitfalls the check-up's audit of the reader's loop found, each with the first clause of its message
    (``"`unaligned_matmul` (a linear layer's input or output width is not a multiple of 8)"``), as a phrase
    (``"nothing"`` if none)."""
    def gloss(message: str) -> str:   # its first clause, without asides in brackets (it goes inside brackets)
        first = re.sub(r"\s*\([^)]*\)", "", message.split(":")[0]).rstrip(".")
        return first[0].lower() + first[1:] if first else first
    found = [f"{_code(f.pitfall)} ({gloss(f.message)})" for f in report.findings]
    return {"checkup_findings": Prose(and_list(found) if found else "nothing"), "checkup_speed": checkup_speed(report)}


def checkup_speed(report: Checkup) -> Prose:
    """Each low-precision recipe that ran against FP32's median step time (the check-up's own timings), and
    which of them was slower at every step after the first (``checkup.slower_every_step``): the rule that
    can turn a recipe down on this device. Empty where FP32 or every other recipe did not run."""
    ref = report.recipes.get("fp32")
    ran = {name: c for name, c in report.recipes.items() if name != "fp32" and c.unsupported is None}
    if ref is None or not ran or not ref.seconds_per_step > 0:
        return Prose("")
    parts = [f"`{name}` {c.seconds_per_step / ref.seconds_per_step:.2g} times" for name, c in ran.items()]
    slow = [f"`{name}`" for name, c in ran.items() if slower_every_step(c, ref)]
    one = len(slow) == 1
    verdict = (f"{and_list(slow)} {'was' if one else 'were'} slower than FP32 at every step after the first, so that "
               f"rule turns {'it' if one else 'them'} down on this device whatever {'its' if one else 'their'} loss"
               if slow else
               "no recipe was slower than FP32 at every step after the first here, so speed turned none down")
    return Prose(f"Here the median step took {and_list(parts)} FP32's; {verdict}.")
