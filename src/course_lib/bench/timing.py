"""A timing harness a reader can trust: warm-up, synchronisation (CUDA events on a GPU, a host clock around a
synchronised region elsewhere), repeats chosen from a time budget, median and quartiles (seconds), and
rotation over several input buffers so that caches are not what is measured."""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch


@dataclass(frozen=True)
class Timing:
    """Seconds per call of a timed function: every sample, with median and quartiles."""

    samples: tuple[float, ...]
    warmup: int

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a Timing needs at least one sample")

    @property
    def repeats(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the samples (linear interpolation), ``0 <= q <= 1``."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must lie in [0, 1], got {q}")
        s = sorted(self.samples)
        pos = q * (len(s) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    @property
    def q25(self) -> float:
        return self.quantile(0.25)

    @property
    def q75(self) -> float:
        return self.quantile(0.75)

    @property
    def relative_spread(self) -> float:
        """Interquartile range over the median: how noisy the measurement was."""
        return (self.q75 - self.q25) / self.median if self.median > 0 else math.inf


class HostTimer:
    """Times a call with a host clock around a synchronised region: ``sync(); t0; fn(); sync(); t1``.

    ``clock`` (seconds) and ``synchronize`` are injectable so the harness can be tested with a fake clock.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Callable[[], None] | None = None):
        self.clock = clock
        self.synchronize = synchronize if synchronize is not None else (lambda: None)

    def time_call(self, fn: Callable[[], Any]) -> float:
        self.synchronize()
        start = self.clock()
        fn()
        self.synchronize()
        return self.clock() - start


class CudaEventTimer:
    """Times a call with CUDA events recorded on the current stream around it (device time, seconds)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)

    def time_call(self, fn: Callable[[], Any]) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def make_timer(device: torch.device | str) -> HostTimer | CudaEventTimer:
    """CUDA events on a GPU; a host clock elsewhere (CPU work is synchronous)."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaEventTimer(device)
    if device.type == "cpu":
        return HostTimer()
    raise ValueError(f"unsupported device type {device.type!r}: the course times 'cuda' or 'cpu'")


def time_function(fn: Callable[..., Any], rotation: Sequence[tuple] = ((),), *, device: torch.device | str = "cpu",
                  warmup: int = 3, budget_s: float = 0.5, min_repeats: int = 5, max_repeats: int = 1000,
                  timer: HostTimer | CudaEventTimer | None = None) -> Timing:
    """Time ``fn(*args)`` with ``args`` taken in turn from ``rotation``, one sample per call.

    ``warmup`` untimed calls come first (kernel selection, caches, lazy initialisation). The number of
    timed calls is ``budget_s`` divided by the time of one call, clamped to ``[min_repeats, max_repeats]``.
    Pass several argument tuples in ``rotation`` (distinct buffers, random data) so that a buffer is not
    still in cache from the previous call.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    rotation = list(rotation)
    if not rotation or not all(isinstance(a, tuple) for a in rotation):
        raise TypeError("rotation must be a non-empty sequence of argument tuples")
    for name, value in (("warmup", warmup), ("min_repeats", min_repeats), ("max_repeats", max_repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(f"need 1 <= min_repeats <= max_repeats, got {min_repeats} and {max_repeats}")
    if not budget_s > 0 or not math.isfinite(budget_s):
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s}")
    timer = make_timer(device) if timer is None else timer
    calls = [0]

    def call() -> None:
        args = rotation[calls[0] % len(rotation)]
        calls[0] += 1
        fn(*args)

    for _ in range(warmup):
        call()
    samples = [timer.time_call(call)]
    per_call = max(samples[0], 1e-9)
    repeats = int(min(max_repeats, max(min_repeats, budget_s // per_call)))
    samples += [timer.time_call(call) for _ in range(repeats - 1)]
    return Timing(tuple(samples), warmup)


class SizeLimit:
    """Leaves out the sizes of a sweep that would take too long to time, by a forecast from the last size timed.

    A square product's work grows with the cube of its size ``n``, so one call at ``n`` is forecast as the
    median call at the last size timed times the cube of the size ratio, and a point as the seconds
    :func:`time_function` spends on such calls (``warmup`` of them, then ``budget_s`` or ``min_repeats`` calls,
    whichever takes longer). A size whose point is forecast past ``limit_s`` is left out; :attr:`note` says
    which sizes and why. ``limit_s=None`` leaves nothing out. The first size is always timed."""

    def __init__(self, limit_s: float | None, *, budget_s: float, warmup: int = 3, min_repeats: int = 5):
        if limit_s is not None and (isinstance(limit_s, bool) or not isinstance(limit_s, (int, float))
                                    or not limit_s > 0 or not math.isfinite(limit_s)):
            raise ValueError(f"limit_s must be a positive number of seconds or None, got {limit_s!r}")
        if not budget_s > 0 or not math.isfinite(budget_s):
            raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s}")
        for name, value, least in (("warmup", warmup, 0), ("min_repeats", min_repeats, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an int of at least {least}, got {value!r}")
        self.limit_s, self.budget_s, self.warmup, self.min_repeats = limit_s, budget_s, warmup, min_repeats
        self._last: tuple[int, float] | None = None      # (size, median seconds of one call) last timed
        self._left_out: list[int] = []
        self._why = ""

    def forecast_s(self, n: int) -> float | None:
        """Seconds a point at size ``n`` is forecast to take (None before any size is timed)."""
        if self._last is None:
            return None
        call = self._last[1] * (n / self._last[0]) ** 3
        return self.warmup * call + max(self.budget_s, self.min_repeats * call)

    def allows(self, n: int) -> bool:
        """Whether to time size ``n``; a size it refuses is remembered for :attr:`note`."""
        forecast = self.forecast_s(n)
        if self.limit_s is None or forecast is None or forecast <= self.limit_s:
            return True
        if not self._left_out and self._last is not None:
            last_n, call = self._last
            cube = (n / last_n) ** 3
            calls = (f"{self.warmup} warm-up and {self.min_repeats} timed calls"
                     if self.min_repeats * call * cube >= self.budget_s else
                     f"{self.warmup} warm-up calls and {self.budget_s:g} s of timed ones")
            # three digits for the call times, so that a reader's products of the printed numbers give the page's
            self._why = (f"one call at n = {last_n} took {call:.3g} s here, so one at n = {n} is forecast at "
                         f"{call * cube:.3g} s (the size ratio cubed, {cube:.3g}, times as long) and a point there, "
                         f"{calls}, at about {forecast:.2g} s, past the limit of {self.limit_s:g} s a point")
        self._left_out.append(n)
        return False

    def timed(self, n: int, timing: Timing) -> None:
        """Record that size ``n`` was timed as ``timing``: later forecasts start from it."""
        self._last = (n, timing.median)

    @property
    def note(self) -> str | None:
        """Which sizes were left out and why ("n = 256 and 512, left out because ..."), or None where none was."""
        if not self._left_out:
            return None
        sizes = [str(n) for n in self._left_out]
        listed = sizes[0] if len(sizes) == 1 else ", ".join(sizes[:-1]) + " and " + sizes[-1]
        larger = "; a larger size takes longer still" if len(sizes) > 1 else ""
        return f"n = {listed}, left out because {self._why}{larger}"
