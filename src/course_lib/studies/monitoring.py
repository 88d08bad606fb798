"""Lesson 9's studies: NaN hunts, an overflow recovered, underflow over a run, a dying layer, and what watching
costs."""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..formats import get_format
from ..models import course_setup
from ..monitor.faults import plant_fault
from ..monitor.health import Alert, GradientHealthMonitor, MonitorLog, Thresholds
from ..monitor.locator import NonFiniteLocator, NonFiniteReport
from ..monitor.recovery import RecoveryEvent, RecoveryPolicy, train_with_recovery
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


def _step_seconds(fn, repeats: int) -> float:
    import time

    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def nan_hunt(profile, device: torch.device | str = "cpu", *, layer: str = "blocks.1.attn.qkv",
             kind: str = "nan_backward", repeats: int = 5, seed: int = 0) -> NanHunt:
    """Plant a ``kind`` fault (see :class:`PlantedFault`) in ``layer`` of the course model, run one step
    under the locator and one under anomaly mode, and time a healthy step each way."""
    import copy


    if kind not in ("nan", "nan_backward"):
        raise ValueError(f"kind must be 'nan' or 'nan_backward', got {kind!r}")
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
    plain_s = _step_seconds(lambda: step(healthy), repeats)
    locator_s = _step_seconds(located, repeats)
    anomaly_s = _step_seconds(anomalous, repeats)

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
    return NanHunt(layer, kind, locator.report, message, plain_s, locator_s, anomaly_s)


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
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 300), seed=seed)
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


def underflow_trend(profile, device: torch.device | str = "cpu", *, steps: int | None = None, every: int = 5,
                    fmt: str = "FP16", threshold: float = 0.1, seed: int = 0) -> UnderflowTrend:
    """Train the course model in FP32 while a monitor asks what an unscaled ``fmt`` would flush."""
    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(60, 600), seed=seed)
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
                          tuple(watch.alerts))


@dataclass(frozen=True)
class MonitorOverhead:
    """Seconds per optimizer step (the mean over a block of steps, median over blocks) of the same run
    without a monitor and with one sampling every ``every`` steps (keys: 0 for none), and the overhead
    relative to none. Means, not medians of single steps: a median would never see the sampled steps."""

    seconds: dict[int, float]
    rounds: dict[int, tuple[float, ...]] = field(default_factory=dict)   # per round, the block's mean step

    def overhead(self, every: int) -> float:
        return self.seconds[every] / self.seconds[0] - 1.0

    def overhead_range(self, every: int) -> tuple[float, float]:
        """The lowest and highest overhead of a single round (each round's monitored block against the
        unmonitored block next to it): how much the timing moved from round to round."""
        if every not in self.rounds or 0 not in self.rounds:
            raise ValueError(f"no per-round times for every={every}")
        each = [m / n - 1.0 for m, n in zip(self.rounds[every], self.rounds[0])]
        return min(each), max(each)


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
    for _ in range(rounds):
        for every in (0, *everies):
            watch = GradientHealthMonitor(model, every=every) if every else None
            h = train(state, setup.sampler, steps=steps, monitor=watch)
            samples[every].append(sum(h.step_seconds) / len(h.step_seconds))
    return MonitorOverhead({k: sorted(v)[len(v) // 2] for k, v in samples.items()},
                           {k: tuple(v) for k, v in samples.items()})


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
    setup = course_setup(profile, device, steps=steps, default_steps=(40, 400), seed=seed)
    n = setup.steps
    dies_at = _step_in_run("dies_at", dies_at, n)
    model = setup.model(seed)
    plant_fault(model, layer, "dead", after=dies_at)
    watch = GradientHealthMonitor(model, every=every)
    state = TrainState(model, get_recipe("fp32", device), TrainConfig(steps=n), device)
    train(state, setup.sampler, monitor=watch)
    return DeadLayerRun(layer, dies_at, watch.log, tuple(watch.alerts))
