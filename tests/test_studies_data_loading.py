"""Data loading overlap (course_lib.studies.data_loading): the study on the CPU (the copies not measured, and why)
and on a GPU (torch's CUDA query replaced, the measurements recorded), the registry's parameters, the result
through JSON and a record, and the lesson's facts, phrases and tables from results built by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from course_lib import experiments as E
from course_lib.bench.loading import LoaderSeconds, WorkerOverlap
from course_lib.bench.transfer import HostToDevice, LoaderPinning, TransferSeconds, transfer_unavailable_reason
from course_lib.device import SizeProfile
from course_lib.glue import Prose
from course_lib.jsonable import from_jsonable, to_jsonable
from course_lib.results import Provenance, Record, RecordedResult
from course_lib.studies import data_loading as D

SMALL, FULL = SizeProfile("small"), SizeProfile("full")
TINY = dict(workers=(0, 1), batches=3, runs=2, batch_size=2, features=16, elements=64, prepare_rounds=2,
            compute_rounds=2, compute_threads=1, copy_bytes=1 << 14, matmul_n=16, matmuls=2, samples=3)
NO_GPU = ("torch sees no GPU on this machine and refuses to pin memory without one (\"Cannot access accelerator "
          "device when none is available.\"), and a copy to the CPU is no host-to-device copy")
UNPINNED = LoaderPinning("'pin_memory' argument is set as true but no accelerator is found, then device pinned "
                         "memory won't be used.", False)


def _overlap(step_with=(0.011, 0.010, 0.0105), first_with=(0.040, 0.038, 0.045), device="cpu", threads=1,
             step_without=(0.020, 0.021, 0.019)):
    seconds = LoaderSeconds(prepare=(0.010, 0.011, 0.009), compute=(0.009, 0.010, 0.0095),
                            step={0: step_without, 2: step_with},
                            first_batch={0: (0.011, 0.012, 0.010), 2: first_with})
    return WorkerOverlap(device, (0, 2), 10, 8, threads, 2, device == "cuda", True, seconds)


def _copies() -> HostToDevice:
    copy = {"pageable": 0.010, "pageable, non_blocking": 0.010, "pinned": 0.005, "pinned, non_blocking": 0.004}
    host = {"pageable": 0.009, "pageable, non_blocking": 0.009, "pinned": 0.005, "pinned, non_blocking": 0.00002}
    seconds = TransferSeconds(copy=copy, host=host, pin=0.006, pin_then_copy=0.012, compute=0.006,
                              together={"pinned, side stream": 0.0065, "pageable, side stream": 0.016,
                                        "pinned, same stream": 0.010})
    return HostToDevice("cuda", 40_000_000, 4096, 4, 10, seconds)


def _on_cpu(**overlap) -> D.DataLoading:
    return D.DataLoading("cpu", _overlap(**overlap), UNPINNED, None, NO_GPU)


def _on_gpu() -> D.DataLoading:
    return D.DataLoading("cuda", _overlap(device="cuda", threads=16), LoaderPinning("", True), _copies(), "")


def _record(result) -> RecordedResult:
    provenance = Provenance("NVIDIA H100 80GB HBM3", "cuda", "2.11", "2026-01-01T00:00:00+00:00", "cmd", "abc", "3.12",
                            compute_capability="9.0", cuda_version="13.0")
    return RecordedResult(Record("data_loading", {}, {"result": to_jsonable(result)}, provenance, schema_version=2),
                          result)


# ---- the study ------------------------------------------------------------------------------------------

def test_on_the_cpu_the_workers_are_measured_and_the_copies_are_not():
    result = D.data_loading(SMALL, "cpu", **TINY)
    assert result.device == "cpu" and result.transfers is None
    assert result.transfers_skipped == transfer_unavailable_reason("cpu") != ""
    assert result.overlap.workers == (0, 1) and result.overlap.compute_threads == 1 and result.overlap.same_batches
    back = from_jsonable(D.DataLoading, json.loads(json.dumps(to_jsonable(result), allow_nan=False)))
    assert back == result
    with pytest.raises(TypeError, match="profile must be a SizeProfile"):
        D.data_loading("small", "cpu", **TINY)


def test_on_a_gpu_the_copies_are_measured_with_the_registrys_sizes(monkeypatch):
    asked = {}

    def overlap(device, **kwargs):
        asked["overlap"] = (device, kwargs)
        return _overlap(device="cuda")

    def copies(device, **kwargs):
        asked["copies"] = (device, kwargs)
        return _copies()

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(D, "measure_worker_overlap", overlap)
    monkeypatch.setattr(D, "measure_host_to_device", copies)
    monkeypatch.setattr(D, "check_loader_pinning", lambda: LoaderPinning("", True))
    result = D.data_loading(FULL, "cuda", **{**TINY, "compute_threads": None})
    assert result == D.DataLoading("cuda", _overlap(device="cuda"), LoaderPinning("", True), _copies(), "")
    assert asked["copies"] == (torch.device("cuda"), {"n_bytes": 1 << 14, "matmul_n": 16, "matmuls": 2, "samples": 3})
    device, kwargs = asked["overlap"]
    assert device == torch.device("cuda") and kwargs["compute_size"] == kwargs["features"] == 16
    assert kwargs["compute_threads"] is None and kwargs["workers"] == (0, 1)


def test_the_registry_runs_it_small_on_a_cpu_and_full_on_a_gpu():
    exp = E.get_experiment("data_loading")
    assert exp.result_type is D.DataLoading and not exp.requires_cuda
    small, full = exp.parameters_for(SMALL, "cpu"), exp.parameters_for(FULL, "cuda")
    assert small["workers"] == full["workers"] == (0, 2)
    assert small["compute_threads"] == 1 and full["compute_threads"] is None   # a GPU computes; its host is free
    assert (small["batches"], small["runs"], full["batches"], full["runs"]) == (10, 3, 30, 5)
    assert small["copy_bytes"] < full["copy_bytes"] == 256 << 20


@pytest.mark.parametrize("result", [_on_cpu(), _on_gpu()], ids=["cpu", "gpu"])
def test_a_record_reads_back_into_the_result(result):
    rec = _record(result)
    assert E.get_experiment("data_loading").load(rec.record) == result


# ---- facts and phrases ------------------------------------------------------------------------------------

def test_facts_of_a_run_whose_workers_hid_the_preparation():
    facts = D.loading_facts(_on_cpu())
    assert {k: facts[k] for k in ("dl_workers", "dl_batch_size", "dl_runs")} == {"dl_workers": 2,
                                                                                 "dl_batch_size": 8, "dl_runs": 3}
    assert facts["dl_prepare_ms"] == pytest.approx(10.0) and facts["dl_compute_ms"] == pytest.approx(9.5)
    assert facts["dl_step0_ms"] == pytest.approx(20.0) and facts["dl_stepw_ms"] == pytest.approx(10.5)
    assert all(isinstance(facts[k], Prose) for k in ("dl_verdict", "dl_startup", "dl_compute_where", "dl_pinning"))
    assert facts["dl_verdict"] == ("the workers hid 95% of the preparation time, and every run with them was faster "
                                   "than every run without (10.0 to 11.0 ms with them against 19.0 to 21.0 ms "
                                   "without, over the runs)")
    assert facts["dl_startup"] == ("Starting 2 workers is a fixed cost: the first batch came 29 ms later than without "
                                   "them, once per pass over the data (each `iter(loader)` starts them afresh unless "
                                   "the loader has `persistent_workers=True`); at 9.5 ms saved per step, that is paid "
                                   "back within 4 steps.")
    assert facts["dl_compute_where"] == ("The compute ran on 1 of this machine's 2 cores, leaving the other core to the "
                                         "workers, as a GPU that computes leaves the host's cores free.")
    assert facts["dl_pinning"] == ("Asked explicitly for `pin_memory=True` (the experiment does, to show what happens), `DataLoader` warned \"'pin_memory' argument is "
                                   "set as true but no accelerator is found, then device pinned memory won't be "
                                   "used.\" and handed back unpinned batches.")
    with pytest.raises(TypeError, match="expected a DataLoading result"):
        D.loading_facts(_overlap())


def test_workers_that_took_off_more_than_the_preparation_say_so():
    # 30 ms a step without workers against 10 + 9.5 ms apart; 10.5 ms with them: 19.5 ms saved, 195% of 10 ms
    more = D.loading_facts(_on_cpu(step_without=(0.029, 0.030, 0.031)))
    assert more["dl_verdict"].startswith(
        "the workers took 19.5 ms off each step, more than preparing a batch alone takes (10.0 ms): without them a "
        "step took 30.0 ms, more than preparing and computing timed apart (19.5 ms), an excess the separate timings "
        "do not show, and the workers removed that too, and every run with them was faster")
    assert "%" not in more["dl_takeaway"] and "took 19.5 ms off each step, more than preparing a batch alone takes " \
        "(10.0 ms))" in more["dl_takeaway"]


def test_a_run_within_the_noise_or_slower_says_so():
    within = D.loading_facts(_on_cpu(step_with=(0.015, 0.0195, 0.016), first_with=(0.011, 0.020, 0.009)))
    assert within["dl_verdict"] == ("no faster beyond the noise, since the runs overlap (15.0 to 19.5 ms with them "
                                    "against 19.0 to 21.0 ms without, over the runs)")
    assert within["dl_startup"] == "Starting 2 workers delayed the first batch by no more than the runs' spread."
    slower = D.loading_facts(_on_cpu(step_with=(0.025, 0.024, 0.026)))
    assert slower["dl_verdict"].startswith("slower in every run (24.0 to 26.0 ms with them against")
    assert slower["dl_verdict"].endswith("here the workers cost more than they saved")
    assert "paid back" not in slower["dl_startup"]   # nothing saved, nothing paid back


def test_why_no_gain_and_the_takeaway_follow_the_measurement():
    gained = D.loading_facts(_on_cpu())
    assert gained["dl_no_gain"] == ""
    assert gained["dl_takeaway"] == ("Let `DataLoader` workers prepare the batches while the device computes "
                                     "(measured here: two workers hid 95% of the preparation time)")
    within = D.loading_facts(_on_cpu(step_with=(0.015, 0.0195, 0.016)))
    assert "measured here" not in within["dl_takeaway"]
    assert within["dl_takeaway"].endswith("where cores are free for them (on this CPU they gained nothing beyond "
                                          "the noise: workers compete with the compute for a small CPU's cores)")
    # one compute thread of two cores: the workers had one core; all cores: none
    assert within["dl_no_gain"].startswith("Overlap may not help on a CPU this small: the compute left 1 of this "
                                           "machine's 2 cores to the workers")
    all_cores = D.loading_facts(_on_cpu(step_with=(0.015, 0.0195, 0.016), threads=2))
    assert "already used all 2 of this machine's cores" in all_cores["dl_no_gain"]
    slower = D.loading_facts(_on_cpu(step_with=(0.025, 0.024, 0.026)))
    assert "they made every step slower" in slower["dl_takeaway"] and slower["dl_no_gain"]
    gpu_within = D.loading_facts(D.DataLoading("cuda", _overlap(step_with=(0.015, 0.0195, 0.016), device="cuda",
                                                                threads=16), LoaderPinning("", True), _copies(), ""))
    assert gpu_within["dl_takeaway"].endswith("(on this machine's GPU they gained nothing beyond the noise)")
    assert gpu_within["dl_no_gain"].startswith("Overlap needs the preparation to be a real share")


def test_where_the_compute_ran_and_what_the_loader_pinned():
    assert D.compute_placement(_overlap(device="cuda", threads=16)) == ("The compute ran on the GPU, leaving the "
                                                                        "host's cores to the workers.")
    assert D.compute_placement(_overlap(threads=2)) == ("The compute ran on all 2 of this machine's cores, leaving "
                                                        "the workers none of their own.")
    assert D.pinning_phrase(LoaderPinning("", True)) == ("Asked explicitly for `pin_memory=True` (the experiment does, to show what happens), `DataLoader` handed back "
                                                         "pinned batches.")
    assert D.pinning_phrase(LoaderPinning("", False)).endswith("gave no warning and handed back unpinned batches.")


# ---- tables and the copies' block ----------------------------------------------------------------------------

def test_the_overlap_table_has_every_time_in_ms():
    assert D.overlap_table(_on_cpu()).splitlines() == [
        "| time | median (ms) | range of the runs' medians (ms) |", "|---|---|---|",
        "| prepare one batch, alone | 10.0 | 9.0 to 11.0 |", "| compute one step, alone | 9.5 | 9.0 to 10.0 |",
        "| one step, 0 workers | 20.0 | 19.0 to 21.0 |", "| one step, 2 workers | 10.5 | 10.0 to 11.0 |",
        "| first batch, 0 workers | 11.0 | 10.0 to 12.0 |", "| first batch, 2 workers | 40.0 | 38.0 to 45.0 |"]


def test_the_copy_tables_and_summary():
    copies = _copies()
    assert D.copy_table(copies).splitlines()[2:] == [
        "| `.to(device)` from pageable memory | 9.00 | 10.00 | 4.0 |",
        "| `.to(device, non_blocking=True)` from pageable memory | 9.00 | 10.00 | 4.0 |",
        "| `.to(device)` from pinned memory | 5.00 | 5.00 | 8.0 |",
        "| `.to(device, non_blocking=True)` from pinned memory | 0.02 | 4.00 | 10.0 |",
        "| `x.pin_memory()` alone | 6.00 | 6.00 | 6.7 |",
        "| `x.pin_memory().to(device, non_blocking=True)` |  | 12.00 | 3.3 |"]
    assert D.concurrency_table(copies).splitlines()[2:] == [
        "| pinned, side stream | 6.50 | 10.00 | 88% |", "| pageable, side stream | 16.00 | 16.00 | 0% |",
        "| pinned, same stream | 10.00 | 10.00 | 0% |"]
    assert D.transfer_summary(copies) == (
        "A 38 MiB copy ran at 4.0 GB/s from pageable memory, the host waiting 9.00 ms of its 10.00 ms, and at 10.0 "
        "GB/s from pinned memory with `non_blocking=True`, `.to` returning after 0.02 ms of its 4.00 ms. Pinning "
        "right before the copy took 1.20 times as long as the plain copy from pageable memory. Issued behind 4 FP32 "
        "products taking 6.00 ms, the pinned `non_blocking` copy overlapped them by 88% on a stream of its own and "
        "by 0% on the products' stream (shares of the shorter of copy and compute).")


def test_the_copies_block_is_live_recorded_or_says_how_to_record():
    live = D.transfer_block(_on_gpu())
    assert live.startswith("Measured here: A 38 MiB copy") and "| pinned, side stream |" in live
    none = D.transfer_block(_on_cpu())
    assert none.startswith(f"*The copies were not measured here: {NO_GPU}.*")
    assert "`python -m course_lib.record data_loading --out results/`" in none
    rec = _record(_on_gpu())
    recorded = D.transfer_block(_on_cpu(), [rec])
    assert f"On the recorded **{rec.label}**, with the compute on the GPU, a step took 20.0 ms without workers and " \
           "10.5 ms with 2: the workers hid 95%" in recorded
    assert "| `.to(device)` from pageable memory |" in recorded and "torch 2.11" in recorded
    with pytest.raises(TypeError, match="expected a DataLoading result"):
        D.transfer_block(_copies())


def test_a_record_without_copies_says_why():
    note = D.recorded_note(_record(_on_cpu()))
    assert f"Its copies were not measured: {NO_GPU}." in note and "| `.to(device)`" not in note
    with pytest.raises(TypeError, match="expected a recorded DataLoading result"):
        D.recorded_note(dataclasses.replace(_record(_on_cpu()), result=_copies()))
