"""Host-to-device copies: pageable against pinned memory, with and without ``non_blocking``, and whether a copy
overlaps with a matrix product.

A copy from pageable host memory goes through a pinned staging buffer the driver owns, and the host waits
while it is staged. A copy from pinned (page-locked) memory is a DMA the GPU runs by itself: with
``non_blocking=True`` the call returns at once, and on a stream of its own the copy runs while kernels run
on another. ``tensor.pin_memory()`` is itself a copy into pinned memory, so pinning right before each copy
adds a host copy to every transfer; ``DataLoader(pin_memory=True)`` with workers pins in a background thread
instead.

Pinning needs an accelerator: on a machine without one torch refuses it, so nothing here is measured there
and :func:`transfer_unavailable_reason` says why. Times are in seconds, sizes in bytes, bandwidth in GB/s
(10^9 bytes per second).
"""

from __future__ import annotations

import contextlib
import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader, TensorDataset

from .matmul import matmul_operands
from .timing import HostTimer, time_function

# (source memory, non_blocking) of each copy timed
COPY_KINDS = {"pageable": ("pageable", False), "pageable, non_blocking": ("pageable", True),
              "pinned": ("pinned", False), "pinned, non_blocking": ("pinned", True)}
# a copy issued behind the matmuls: (source memory, on a side stream?) and the copy timed alone it pairs with
OVERLAP_KINDS = {"pinned, side stream": ("pinned", True, "pinned, non_blocking"),
                 "pageable, side stream": ("pageable", True, "pageable, non_blocking"),
                 "pinned, same stream": ("pinned", False, "pinned, non_blocking")}


def pin_refusal() -> str | None:
    """What torch says when asked to pin a tensor here, or None when it pins."""
    try:
        torch.empty(1).pin_memory()
    except RuntimeError as exc:
        return str(exc).strip()
    return None


def transfer_unavailable_reason(device: torch.device | str) -> str | None:
    """Why host-to-device copies cannot be measured on ``device``, or None when they can (a CUDA device)."""
    device = torch.device(device)
    if device.type == "cuda":
        return None if torch.cuda.is_available() else "a CUDA device was asked for, but torch sees no CUDA GPU"
    refusal = pin_refusal()
    if refusal is not None:
        return (f"torch sees no GPU on this machine and refuses to pin memory without one (\"{refusal}\"), and a copy "
                "to the CPU is no host-to-device copy")
    return f"the device is the {device.type.upper()}: a copy to it is no host-to-device copy"


@dataclass(frozen=True)
class LoaderPinning:
    """What ``DataLoader(pin_memory=True)`` did here: the warning it gave ("" for none) and whether the
    batch it handed back was pinned."""

    warning: str
    pinned: bool


def check_loader_pinning() -> LoaderPinning:
    """Ask a ``DataLoader`` (no workers) to pin a batch of a tiny dataset, and record what it did."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        (batch,) = next(iter(DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True)))
    messages = [str(w.message) for w in caught if "pin" in str(w.message).lower()]
    return LoaderPinning(messages[0] if messages else "", bool(batch.is_pinned()))


@dataclass(frozen=True)
class TransferSeconds:
    """Medians over the samples, seconds. ``copy[kind]``: ``.to(device)`` until the copy is done;
    ``host[kind]``: until ``.to`` returned to Python (the host's wait); ``pin``: ``x.pin_memory()`` of a
    pageable tensor; ``pin_then_copy``: ``x.pin_memory().to(device, non_blocking=True)`` until done;
    ``compute``: the matmuls alone; ``together[kind]``: the matmuls, then the copy issued behind them, until
    both are done."""

    copy: dict[str, float]
    host: dict[str, float]
    pin: float
    pin_then_copy: float
    compute: float
    together: dict[str, float]


@dataclass(frozen=True)
class HostToDevice:
    """Copies of ``n_bytes`` from the host to ``device`` and ``matmuls`` FP32 products of ``matmul_n``
    squared matrices, each timed ``samples`` times (medians in ``seconds``)."""

    device: str
    n_bytes: int
    matmul_n: int
    matmuls: int
    samples: int
    seconds: TransferSeconds

    def bandwidth_gbs(self, kind: str) -> float:
        """GB/s of the copy ``kind`` (a key of :data:`COPY_KINDS`), from the time until it was done."""
        if kind not in self.seconds.copy:
            raise ValueError(f"unknown copy {kind!r}; measured: {sorted(self.seconds.copy)}")
        return self.n_bytes / self.seconds.copy[kind] / 1e9

    def apart_seconds(self, kind: str) -> float:
        """The copy's time plus the matmuls' time, each measured alone, for an overlap ``kind``."""
        if kind not in OVERLAP_KINDS or kind not in self.seconds.together:
            raise ValueError(f"unknown overlap {kind!r}; measured: {sorted(self.seconds.together)}")
        return self.seconds.copy[OVERLAP_KINDS[kind][2]] + self.seconds.compute

    def overlap_share(self, kind: str) -> float:
        """The share of the shorter of copy and compute that ran hidden under the other when issued together
        (``kind`` of :data:`OVERLAP_KINDS`): 0 when together takes as long as apart, 1 when it takes only
        as long as the longer one."""
        apart = self.apart_seconds(kind)
        shorter = min(self.seconds.copy[OVERLAP_KINDS[kind][2]], self.seconds.compute)
        return (apart - self.seconds.together[kind]) / shorter


def _median_seconds(fn: Callable[[], object], samples: int, warmup: int, sync: Callable[[], None],
                    clock: Callable[[], float]) -> float:
    """Median seconds of ``fn()`` from a synchronised start to a synchronised end (the course's harness)."""
    timer = HostTimer(clock=clock, synchronize=sync)
    return time_function(fn, warmup=warmup, min_repeats=samples, max_repeats=samples, timer=timer).median


def _copy_seconds(sources: list[torch.Tensor], device: torch.device, non_blocking: bool, samples: int, warmup: int,
                  sync: Callable[[], None], clock: Callable[[], float]) -> tuple[float, float]:
    """Median seconds until ``.to`` returned and until the copy was done, rotating over ``sources``."""
    host, done = [], []
    for i in range(warmup + samples):
        sync()
        began = clock()
        copied = sources[i % len(sources)].to(device, non_blocking=non_blocking)
        returned = clock()
        sync()
        if i >= warmup:
            host.append(returned - began)
            done.append(clock() - began)
        del copied
    return statistics.median(host), statistics.median(done)


def measure_host_to_device(device: torch.device | str, *, n_bytes: int = 256 << 20, matmul_n: int = 4096,
                           matmuls: int = 4, samples: int = 10, warmup: int = 2) -> HostToDevice:
    """Time host-to-device copies of ``n_bytes`` (FP32 values) to a CUDA ``device`` from pageable and from
    pinned memory, with and without ``non_blocking``; ``pin_memory()`` alone and followed by the copy; and
    ``matmuls`` FP32 products of ``matmul_n`` squared matrices alone and with a copy issued behind them, on a
    side stream and on the same stream. ``ValueError`` where no such copy can be made
    (:func:`transfer_unavailable_reason`)."""
    reason = transfer_unavailable_reason(device)
    if reason is not None:
        raise ValueError(f"cannot measure host-to-device copies: {reason}")
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, int) or n_bytes < 4096:
        raise ValueError(f"n_bytes must be an int of at least 4096, got {n_bytes!r}")
    for name, value in (("matmuls", matmuls), ("samples", samples)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    device = torch.device(device)
    sync, clock = torch.cuda.synchronize, time.perf_counter
    gen = torch.Generator().manual_seed(0)
    pageable = [torch.randn(n_bytes // 4, generator=gen) for _ in range(2)]
    sources = {"pageable": pageable, "pinned": [t.pin_memory() for t in pageable]}
    matmul, operands = matmul_operands("fp32", matmul_n, matmul_n, matmul_n, device, buffers=1)
    side = torch.cuda.Stream(device)

    def compute() -> None:
        for _ in range(matmuls):
            matmul(*operands[0])

    def together(memory: str, on_side: bool) -> Callable[[], None]:
        def run() -> None:
            compute()   # queued on the current stream; the host moves on at once
            with torch.cuda.stream(side) if on_side else contextlib.nullcontext():
                sources[memory][0].to(device, non_blocking=True)
        return run

    copy, host = {}, {}
    for kind, (memory, non_blocking) in COPY_KINDS.items():
        host[kind], copy[kind] = _copy_seconds(sources[memory], device, non_blocking, samples, warmup, sync, clock)
    seconds = TransferSeconds(
        copy=copy, host=host,
        pin=_median_seconds(lambda: pageable[0].pin_memory(), samples, warmup, sync, clock),
        pin_then_copy=_median_seconds(lambda: pageable[0].pin_memory().to(device, non_blocking=True), samples,
                                      warmup, sync, clock),
        compute=_median_seconds(compute, samples, warmup, sync, clock),
        together={kind: _median_seconds(together(memory, on_side), samples, warmup, sync, clock)
                  for kind, (memory, on_side, _) in OVERLAP_KINDS.items()})
    return HostToDevice(str(device), n_bytes, matmul_n, matmuls, samples, seconds)
