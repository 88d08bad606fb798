"""Data loading overlap (lesson 6): ``DataLoader`` workers preparing batches while the main process computes,
measured wherever the lesson runs; pinned memory and ``non_blocking`` host-to-device copies, measured where
a CUDA GPU exists and explained otherwise; and the facts, tables and phrases the lesson glues from them."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..bench.loading import WorkerOverlap, measure_worker_overlap
from ..bench.transfer import (
    COPY_KINDS,
    OVERLAP_KINDS,
    HostToDevice,
    LoaderPinning,
    check_loader_pinning,
    measure_host_to_device,
    transfer_unavailable_reason,
)
from ..device import SizeProfile
from ..glue import Prose, count_word, ratio_text
from ..results import RecordedResult, describe_records
from ..tables import MarkdownTable, markdown_table

EXPERIMENT = "data_loading"


@dataclass(frozen=True)
class DataLoading:
    """The ``data_loading`` experiment: the worker overlap (always), what ``DataLoader(pin_memory=True)`` did,
    and the host-to-device copies (``None`` where they cannot be made, with ``transfers_skipped`` saying why;
    ``""`` when they were measured)."""

    device: str
    overlap: WorkerOverlap
    loader_pinning: LoaderPinning
    transfers: HostToDevice | None
    transfers_skipped: str


def data_loading(profile: SizeProfile, device: torch.device | str, *, workers: Sequence[int], batches: int, runs: int,
                 batch_size: int, features: int, elements: int, prepare_rounds: int, compute_rounds: int,
                 compute_threads: int | None, copy_bytes: int, matmul_n: int, matmuls: int,
                 samples: int) -> DataLoading:
    """Run the experiment on ``device``: :func:`~course_lib.bench.loading.measure_worker_overlap` with the
    loader's parameters, :func:`~course_lib.bench.transfer.check_loader_pinning`, and, on a CUDA GPU,
    :func:`~course_lib.bench.transfer.measure_host_to_device` with ``copy_bytes``, ``matmul_n``, ``matmuls``
    and ``samples``; elsewhere the copies are not measured and the result says why."""
    if not isinstance(profile, SizeProfile):
        raise TypeError(f"profile must be a SizeProfile, got {type(profile).__name__}")
    device = torch.device(device)
    overlap = measure_worker_overlap(device, workers=workers, batches=batches, runs=runs, batch_size=batch_size,
                                     features=features, elements=elements, prepare_rounds=prepare_rounds,
                                     compute_size=features, compute_rounds=compute_rounds,
                                     compute_threads=compute_threads)
    reason = transfer_unavailable_reason(device)
    transfers = None if reason is not None else measure_host_to_device(
        device, n_bytes=copy_bytes, matmul_n=matmul_n, matmuls=matmuls, samples=samples)
    return DataLoading(str(device), overlap, check_loader_pinning(), transfers, reason or "")


# ---- the worker overlap ---------------------------------------------------------------------------------

def _ms_range(values: Sequence[float]) -> str:
    return f"{1e3 * min(values):.1f} to {1e3 * max(values):.1f}"


def overlap_table(result: DataLoading) -> MarkdownTable:
    """The worker overlap as a table: each time's median over runs and the range of the runs' medians (ms)."""
    o = result.overlap
    rows = [("prepare one batch, alone", o.seconds.prepare), ("compute one step, alone", o.seconds.compute)]
    rows += [(f"one step, {w} workers", o.seconds.step[w]) for w in o.workers]
    rows += [(f"first batch, {w} workers", o.seconds.first_batch[w]) for w in o.workers]
    return markdown_table(["time", "median (ms)", "range of the runs' medians (ms)"],
                          [(name, f"{1e3 * statistics.median(v):.1f}", _ms_range(v)) for name, v in rows])


def overlap_verdict(overlap: WorkerOverlap, workers: int) -> Prose:
    """Whether ``workers`` workers made a step faster beyond the runs' spread, and by how much of the
    preparation time; or that they did not, with the ranges that overlap."""
    ranges = (f"{_ms_range(overlap.seconds.step[workers])} ms with them against {_ms_range(overlap.seconds.step[0])} "
              "ms without, over the runs")
    if overlap.beyond_noise(workers):
        return Prose(f"the workers {_hid(overlap, workers)}, and every run with them was faster than every run "
                     f"without ({ranges})")
    if min(overlap.seconds.step[workers]) > max(overlap.seconds.step[0]):
        return Prose(f"slower in every run ({ranges}): here the workers cost more than they saved")
    return Prose(f"no faster beyond the noise, since the runs overlap ({ranges})")


def _hid(overlap: WorkerOverlap, workers: int, *, short: bool = False) -> str:
    """What the workers took off a step, as a verb phrase: a share of the preparation time, or, where they took
    off more than preparing a batch takes, how much, and (unless ``short``) that the step without them cost
    more than its two parts timed apart."""
    share = overlap.hidden_share(workers)
    if share <= 1:
        return f"hid {100 * share:.0f}% of the preparation time"
    saved, prepare = overlap.median_step(0) - overlap.median_step(workers), overlap.median_prepare
    text = f"took {1e3 * saved:.1f} ms off each step, more than preparing a batch alone takes ({1e3 * prepare:.1f} ms)"
    if short:
        return text
    apart = prepare + overlap.median_compute
    return (f"{text}: without them a step took {1e3 * overlap.median_step(0):.1f} ms, more than preparing and "
            f"computing timed apart ({1e3 * apart:.1f} ms), an excess the separate timings do not show, and the "
            "workers removed that too")


def no_gain_reason(overlap: WorkerOverlap, workers: int) -> Prose:
    """Why ``workers`` workers may not have made a step faster, when they did not (empty when they did): the
    cores they had beside the compute, and what they cost. Overlap needs a core that the compute leaves idle;
    on a small CPU the workers compete with the compute for the cores, which a GPU that computes does not."""
    if overlap.beyond_noise(workers):
        return Prose("")
    costs = ("and each worker is a process of its own, whose batches are handed back to the main process "
             "through shared memory, which costs time as well")
    if overlap.device.startswith("cuda"):
        return Prose("Overlap needs the preparation to be a real share of the step and cores left for the "
                     f"workers; here it did not show, {costs}.")
    threads, cores = overlap.compute_threads, overlap.host_cores
    if threads >= cores:
        room = (f"the compute already used all {cores} of this machine's cores, so the workers could only take "
                "cores from it, not run beside it")
    else:
        room = (f"the compute left {cores - threads} of this machine's {cores} cores to the workers, but the "
                "workers, the main process and the operating system compete for so few cores")
    return Prose(f"Overlap may not help on a CPU this small: {room}, {costs}. On a GPU, which computes while the "
                 "host's cores are free, the same loader can hide the preparation.")


def takeaway(overlap: WorkerOverlap, workers: int) -> Prose:
    """The lesson's takeaway on workers, as strong as the measurement: "measured here" only when ``workers``
    workers made every run faster than every run without."""
    claim = "Let `DataLoader` workers prepare the batches while the device computes"
    if overlap.beyond_noise(workers):
        return Prose(f"{claim} (measured here: {count_word(workers)} workers {_hid(overlap, workers, short=True)})")
    on_gpu = overlap.device.startswith("cuda")
    here = "on this machine's GPU" if on_gpu else "on this CPU"
    slower = min(overlap.seconds.step[workers]) > max(overlap.seconds.step[0])
    shown = f"{here} they made every step slower" if slower else f"{here} they gained nothing beyond the noise"
    if on_gpu:
        return Prose(f"{claim}, where the preparation is a real share of the step ({shown})")
    return Prose(f"{claim}, where cores are free for them ({shown}: workers compete with the compute for a "
                 "small CPU's cores)")


def startup_phrase(overlap: WorkerOverlap, workers: int) -> Prose:
    """What starting ``workers`` workers cost: the first batch's delay, and after how many steps the saving
    per step pays it back, when it shows in every run; else that it did not show."""
    if not overlap.startup_shows(workers):
        return Prose(f"Starting {workers} workers delayed the first batch by no more than the runs' spread.")
    startup = overlap.startup_seconds(workers)
    text = (f"Starting {workers} workers is a fixed cost: the first batch came {1e3 * startup:.0f} ms later than "
            "without them, once per pass over the data (each `iter(loader)` starts them afresh unless the loader "
            "has `persistent_workers=True`)")
    saving = overlap.median_step(0) - overlap.median_step(workers)
    if overlap.beyond_noise(workers) and saving > 0:
        text += f"; at {1e3 * saving:.1f} ms saved per step, that is paid back within {math.ceil(startup / saving)} steps"
    return Prose(text + ".")


def compute_placement(overlap: WorkerOverlap) -> Prose:
    """Where the compute ran and what it left the workers: the GPU, or how many of the host's cores."""
    if overlap.device.startswith("cuda"):
        return Prose("The compute ran on the GPU, leaving the host's cores to the workers.")
    threads, cores = overlap.compute_threads, overlap.host_cores
    if threads >= cores:
        return Prose(f"The compute ran on all {cores} of this machine's cores, leaving the workers none of their own.")
    rest = cores - threads
    left = "the other core" if rest == 1 else f"the other {rest} cores"
    return Prose(f"The compute ran on {threads} of this machine's {cores} cores, leaving {left} to the "
                 "workers, as a GPU that computes leaves the host's cores free.")


def pinning_phrase(pinning: LoaderPinning) -> Prose:
    """What ``DataLoader(pin_memory=True)`` did here: pinned the batch, or warned and handed it back unpinned."""
    if pinning.pinned:
        return Prose("Asked explicitly for `pin_memory=True` (the experiment does, to show what happens), "
                     "`DataLoader` handed back pinned batches.")
    warned = f'warned "{pinning.warning}" and' if pinning.warning else "gave no warning and"
    return Prose(f"Asked explicitly for `pin_memory=True` (the experiment does, to show what happens), `DataLoader` "
                 f"{warned} handed back unpinned batches.")


def loading_facts(result: DataLoading) -> dict[str, object]:
    """The worker overlap's facts for the lesson (``dl_*``): the largest number of workers run, the batch size
    and the runs; the medians over runs of preparing a batch, computing a step, and a
    step without and with those workers (ms); and the verdict, start-up, compute placement and pinning
    phrases, why the workers may not have helped (``dl_no_gain``, empty when they did) and the takeaway
    (``dl_takeaway``), as strong as the measurement."""
    if not isinstance(result, DataLoading):
        raise TypeError(f"expected a DataLoading result, got {type(result).__name__}")
    o = result.overlap
    most = max(o.workers)
    return {"dl_workers": most, "dl_batch_size": o.batch_size, "dl_runs": len(o.seconds.prepare),
            "dl_prepare_ms": 1e3 * o.median_prepare, "dl_compute_ms": 1e3 * o.median_compute,
            "dl_step0_ms": 1e3 * o.median_step(0), "dl_stepw_ms": 1e3 * o.median_step(most),
            "dl_verdict": overlap_verdict(o, most), "dl_startup": startup_phrase(o, most),
            "dl_compute_where": compute_placement(o), "dl_pinning": pinning_phrase(result.loader_pinning),
            "dl_no_gain": no_gain_reason(o, most), "dl_takeaway": takeaway(o, most)}


# ---- the host-to-device copies --------------------------------------------------------------------------

def copy_table(transfers: HostToDevice) -> MarkdownTable:
    """The copies as a table: how long the host waited in ``.to``, when the copy was done (ms) and GB/s; then
    ``pin_memory()`` alone and followed by the copy."""
    s = transfers.seconds
    gbs = lambda seconds: f"{transfers.n_bytes / seconds / 1e9:.1f}"  # noqa: E731
    rows = [(f"`.to(device{', non_blocking=True' if nb else ''})` from {memory} memory", f"{1e3 * s.host[kind]:.2f}",
             f"{1e3 * s.copy[kind]:.2f}", gbs(s.copy[kind])) for kind, (memory, nb) in COPY_KINDS.items()]
    rows += [("`x.pin_memory()` alone", f"{1e3 * s.pin:.2f}", f"{1e3 * s.pin:.2f}", gbs(s.pin)),
             ("`x.pin_memory().to(device, non_blocking=True)`", "", f"{1e3 * s.pin_then_copy:.2f}",
              gbs(s.pin_then_copy))]
    return markdown_table(["copy", "host waits (ms)", "done (ms)", "GB/s"], rows)


def concurrency_table(transfers: HostToDevice) -> MarkdownTable:
    """A copy issued behind the matmuls: together against apart (ms), and the share of the shorter one hidden."""
    s = transfers.seconds
    return markdown_table(["copy issued behind the matmuls", "together (ms)", "apart (ms)", "hidden"],
                          [(kind, f"{1e3 * s.together[kind]:.2f}", f"{1e3 * transfers.apart_seconds(kind):.2f}",
                            f"{100 * transfers.overlap_share(kind):.0f}%") for kind in OVERLAP_KINDS
                           if kind in s.together])


def transfer_summary(transfers: HostToDevice) -> Prose:
    """The copies in two sentences: pageable against pinned ``non_blocking`` (GB/s, the host's wait), pinning
    right before the copy against a plain copy, and the share of the pinned copy hidden behind the matmuls on a
    side stream and on the same stream."""
    s = transfers.seconds
    mib = transfers.n_bytes / 2 ** 20
    plain, fast = "pageable", "pinned, non_blocking"
    text = (f"A {mib:.0f} MiB copy ran at {transfers.bandwidth_gbs(plain):.1f} GB/s from pageable memory, the host "
            f"waiting {1e3 * s.host[plain]:.2f} ms of its {1e3 * s.copy[plain]:.2f} ms, and at "
            f"{transfers.bandwidth_gbs(fast):.1f} GB/s from pinned memory with `non_blocking=True`, `.to` returning "
            f"after {1e3 * s.host[fast]:.2f} ms of its {1e3 * s.copy[fast]:.2f} ms. Pinning right before the copy "
            f"took {ratio_text(s.pin_then_copy / s.copy[plain])} times as long as the plain copy from pageable "
            "memory")
    where = {"pinned, side stream": "on a stream of its own", "pinned, same stream": "on the products' stream"}
    hidden = [f"by {100 * transfers.overlap_share(kind):.0f}% {place}" for kind, place in where.items()
              if kind in s.together]
    if hidden:
        text += (f". Issued behind {transfers.matmuls} FP32 products taking {1e3 * s.compute:.2f} ms, the pinned "
                 f"`non_blocking` copy overlapped them {' and '.join(hidden)} (shares of the shorter of copy and "
                 "compute)")
    return Prose(text + ".")


def transfer_block(result: DataLoading, records: Sequence[RecordedResult] = ()) -> Prose:
    """Markdown for the copies: the live measurement (summary and tables) where it ran; otherwise why not,
    followed by the newest GPU record of ``data_loading`` (:func:`recorded_note`) or how to make one."""
    if not isinstance(result, DataLoading):
        raise TypeError(f"expected a DataLoading result, got {type(result).__name__}")
    if result.transfers is not None:
        t = result.transfers
        return Prose(f"Measured here: {transfer_summary(t)}\n\n{copy_table(t)}\n{concurrency_table(t)}")
    text = f"*The copies were not measured here: {result.transfers_skipped}.*\n\n"
    return Prose(text + (recorded_note(records[0]) if records else describe_records([], EXPERIMENT)))


def recorded_note(record: RecordedResult) -> Prose:
    """A recorded ``data_loading`` run: its worker overlap in a sentence, its copies (summary and tables), and
    its provenance."""
    result = record.result
    if not isinstance(result, DataLoading):
        raise TypeError(f"expected a recorded DataLoading result, got {type(result).__name__}")
    o = result.overlap
    most = max(o.workers)
    text = (f"On the recorded **{record.label}**, with the compute on the GPU, a step took "
            f"{1e3 * o.median_step(0):.1f} ms without workers and {1e3 * o.median_step(most):.1f} ms with {most}: "
            f"{overlap_verdict(o, most)}.")
    if result.transfers is None:
        text += f" Its copies were not measured: {result.transfers_skipped}."
    else:
        t = result.transfers
        text += f" {transfer_summary(t)}\n\n{copy_table(t)}\n{concurrency_table(t)}"
    return Prose(text + "\n\n" + describe_records([record]))
