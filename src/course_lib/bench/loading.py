"""Data loading against compute: how much of a batch's preparation ``DataLoader`` workers hide.

With ``num_workers=0`` the main process prepares each batch and then computes on it, so a step costs both.
With workers, other processes prepare the next batches while the main process computes, and a step costs
the longer of the two (plus passing the batch between processes). :func:`measure_worker_overlap` times the
same loop both ways over a :class:`ExpensiveDataset`, whose items cost real CPU work to prepare, and reports
the medians over runs, each run's median, and the time to the first batch (the workers' start-up).
Times are in seconds.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, default_collate


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


class ExpensiveDataset(Dataset):
    """``items`` vectors of ``features`` float32 values whose preparation costs real CPU work: ``rounds``
    passes of ``x = sin(x) + x / 2`` over ``elements`` values in numpy (one thread, in whichever process
    prepares the item), standing in for decoding and augmenting a sample. Item ``i`` depends on ``i`` only,
    so every process prepares the same item."""

    def __init__(self, items: int = 16, features: int = 256, *, elements: int = 20_000, rounds: int = 75):
        self.items = _positive_int("items", items)
        self.features = _positive_int("features", features)
        self.elements = _positive_int("elements", elements)
        self.rounds = _positive_int("rounds", rounds)
        if features > elements:
            raise ValueError(f"features ({features}) cannot exceed elements ({elements})")

    def __len__(self) -> int:
        return self.items

    def __getitem__(self, index: int) -> torch.Tensor:
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.items:
            raise IndexError(f"index {index!r} is outside 0..{self.items - 1}")
        x = np.linspace(0.0, 1.0, self.elements, dtype=np.float32) * np.float32(index + 1)
        for _ in range(self.rounds):
            x = np.sin(x) + np.float32(0.5) * x
        return torch.from_numpy(x[: self.features].copy())


@dataclass(frozen=True)
class LoaderSeconds:
    """Seconds, one value per run (each run's median over its batches). ``prepare``: one batch prepared in
    the main process with nothing else running; ``compute``: one compute step alone; ``step[w]``: one step
    of the loop (wait for the batch, copy it to the device, compute) with ``w`` workers, the first step left
    out; ``first_batch[w]``: from ``iter(loader)`` to the first batch (with workers: their start-up too)."""

    prepare: tuple[float, ...]
    compute: tuple[float, ...]
    step: dict[int, tuple[float, ...]]
    first_batch: dict[int, tuple[float, ...]]


@dataclass(frozen=True)
class WorkerOverlap:
    """The same loop timed with each number of workers in ``workers`` (the first is 0, the baseline).

    ``compute_threads``: the threads the main process computed with; ``host_cores``: the cores this process
    may run on; ``pinned``: whether the loader pinned its batches (on a GPU); ``same_batches``: every setting
    delivered the same batches in the same order."""

    device: str
    workers: tuple[int, ...]
    batches: int
    batch_size: int
    compute_threads: int
    host_cores: int
    pinned: bool
    same_batches: bool
    seconds: LoaderSeconds

    def _check(self, workers: int) -> None:
        if workers not in self.workers:
            raise ValueError(f"no run with {workers!r} workers; measured: {self.workers}")

    def median_step(self, workers: int) -> float:
        """The median over runs of the step time with ``workers`` workers (seconds)."""
        self._check(workers)
        return statistics.median(self.seconds.step[workers])

    @property
    def median_prepare(self) -> float:
        return statistics.median(self.seconds.prepare)

    @property
    def median_compute(self) -> float:
        return statistics.median(self.seconds.compute)

    def hidden_share(self, workers: int) -> float:
        """The share of one batch's preparation time that ``workers`` workers took off the step: the step
        time without workers less the step time with them, over the preparation time (1: all of it)."""
        return (self.median_step(0) - self.median_step(workers)) / self.median_prepare

    def beyond_noise(self, workers: int) -> bool:
        """Whether every run with ``workers`` workers was faster than every run without (the ranges of the
        runs' medians do not overlap)."""
        self._check(workers)
        return max(self.seconds.step[workers]) < min(self.seconds.step[0])

    def startup_seconds(self, workers: int) -> float:
        """How much later the first batch arrived with ``workers`` workers than without (median over runs)."""
        self._check(workers)
        return statistics.median(self.seconds.first_batch[workers]) - statistics.median(self.seconds.first_batch[0])

    def startup_shows(self, workers: int) -> bool:
        """Whether the first batch came later with ``workers`` workers than without in every run."""
        self._check(workers)
        return min(self.seconds.first_batch[workers]) > max(self.seconds.first_batch[0])


def host_cores() -> int:
    """The CPU cores this process may run on (its affinity where the platform tells it)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)


def compute_step(batch: torch.Tensor, start: torch.Tensor, weight: torch.Tensor, rounds: int) -> torch.Tensor:
    """The stand-in for a training step: ``rounds`` products ``h = tanh(h @ weight)`` from ``start`` shifted
    by the batch's mean (``batch``: ``[batch_size, d]``, ``start``: ``[m, d]``, ``weight``: ``[d, d]``)."""
    h = start + batch.mean(dim=0)
    for _ in range(rounds):
        h = torch.tanh(h @ weight)
    return h


def _no_sync() -> None:
    """The CPU computes synchronously: a step is over when its call returns."""


def _synchronizer(device: torch.device) -> Callable[[], None]:
    # a GPU computes asynchronously: a step is over when its kernels are
    return torch.cuda.synchronize if device.type == "cuda" else _no_sync


def _time_loader(dataset: ExpensiveDataset, workers: int, batch_size: int, pin: bool, device: torch.device,
                 start: torch.Tensor, weight: torch.Tensor, rounds: int,
                 clock: Callable[[], float]) -> tuple[float, list[float], list[float]]:
    """One pass over ``dataset``: seconds to the first batch, seconds per step after the first, and each
    batch's sum (to compare what the settings delivered)."""
    sync = _synchronizer(device)
    loader = DataLoader(dataset, batch_size=batch_size, num_workers=workers, pin_memory=pin)
    sums, steps = [], []
    began = last = clock()
    first = None
    for batch in loader:
        if first is None:
            first = clock() - began
        sums.append(float(batch.sum()))
        compute_step(batch.to(device, non_blocking=pin), start, weight, rounds)
        sync()
        now = clock()
        steps.append(now - last)
        last = now
    assert first is not None   # the dataset holds at least two batches (checked by the caller)
    return first, steps[1:], sums


def measure_worker_overlap(device: torch.device | str, *, workers: Sequence[int] = (0, 2), batches: int = 10,
                           runs: int = 3, batch_size: int = 8, features: int = 256, elements: int = 20_000,
                           prepare_rounds: int = 75, compute_size: int = 256, compute_rounds: int = 48,
                           compute_threads: int | None = None, pin_memory: bool | None = None,
                           clock: Callable[[], float] = time.perf_counter) -> WorkerOverlap:
    """Time a loop over ``batches`` batches of an :class:`ExpensiveDataset` with each number of workers in
    ``workers`` (starting with 0), ``runs`` times, the settings interleaved within each run; and, per run,
    one batch's preparation alone and one compute step (:func:`compute_step` on ``[compute_size,
    compute_size]`` operands, ``compute_rounds`` products) alone.

    ``compute_threads``: the threads the main process computes with during the measurement (``None``: torch's
    setting; the setting in force comes back afterwards). ``pin_memory``: whether the loader pins its batches
    (default: on a CUDA device), which are then copied with ``non_blocking=True``. Each pass starts its
    workers afresh, as every epoch does without ``persistent_workers=True``.
    """
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device type {device.type!r}: the course runs on 'cuda' or 'cpu'")
    if isinstance(workers, (str, bytes)) or not isinstance(workers, Sequence):
        raise TypeError(f"workers must be a sequence of ints, got {type(workers).__name__}")
    workers = tuple(workers)
    if any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in workers):
        raise ValueError(f"workers must be non-negative ints, got {workers!r}")
    if len(workers) < 2 or workers[0] != 0 or len(set(workers)) != len(workers):
        raise ValueError(f"workers must start with 0 (the baseline) and name at least one other count, each once; "
                         f"got {workers!r}")
    batches, runs = _positive_int("batches", batches), _positive_int("runs", runs)
    if batches < 2:
        raise ValueError(f"batches must be at least 2 (the first step is left out), got {batches}")
    batch_size, compute_size = _positive_int("batch_size", batch_size), _positive_int("compute_size", compute_size)
    compute_rounds = _positive_int("compute_rounds", compute_rounds)
    if compute_threads is not None:
        _positive_int("compute_threads", compute_threads)
    if features != compute_size:
        raise ValueError(f"features ({features}) must equal compute_size ({compute_size}): a batch's mean shifts "
                         "the compute's operand")
    pin = device.type == "cuda" if pin_memory is None else bool(pin_memory)
    dataset = ExpensiveDataset(batches * batch_size, features, elements=elements, rounds=prepare_rounds)
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(compute_size, compute_size, generator=gen).to(device)
    weight = (torch.randn(compute_size, compute_size, generator=gen) / compute_size ** 0.5).to(device)
    sync = _synchronizer(device)
    prepare: list[float] = []
    compute: list[float] = []
    step: dict[int, list[float]] = {w: [] for w in workers}
    first_batch: dict[int, list[float]] = {w: [] for w in workers}
    delivered: dict[int, list[float]] = {}
    previous_threads = torch.get_num_threads()
    try:
        if compute_threads is not None:
            torch.set_num_threads(compute_threads)
        threads = torch.get_num_threads()
        batch = default_collate([dataset[i] for i in range(batch_size)]).to(device)
        for _ in range(runs):
            alone = []
            for b in range(batches):
                began = clock()
                default_collate([dataset[i] for i in range(b * batch_size, (b + 1) * batch_size)])
                alone.append(clock() - began)
            prepare.append(statistics.median(alone))
            alone = []
            for _ in range(batches):
                sync()
                began = clock()
                compute_step(batch, start, weight, compute_rounds)
                sync()
                alone.append(clock() - began)
            compute.append(statistics.median(alone))
            for w in workers:
                first, steps, sums = _time_loader(dataset, w, batch_size, pin, device, start, weight, compute_rounds,
                                                  clock)
                first_batch[w].append(first)
                step[w].append(statistics.median(steps))
                delivered.setdefault(w, sums)
    finally:
        torch.set_num_threads(previous_threads)
    same = all(sums == delivered[0] for sums in delivered.values())
    seconds = LoaderSeconds(tuple(prepare), tuple(compute), {w: tuple(s) for w, s in step.items()},
                            {w: tuple(s) for w, s in first_batch.items()})
    return WorkerOverlap(str(device), workers, batches, batch_size, threads, host_cores(), pin, same, seconds)
