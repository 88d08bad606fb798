"""Host-to-device copies (course_lib.bench.transfer): refused with torch's own reason where nothing can be pinned,
measured on a GPU, and what a DataLoader asked to pin does here.

The GPU measurement runs on this CPU with torch's CUDA calls replaced (``fake_cuda``): ``torch.cuda.is_available``,
``synchronize``, ``Stream`` and ``stream``, ``Tensor.pin_memory`` (a clone, remembered as pinned) and ``Tensor.to``
for a CUDA target (a CPU copy, remembered with its source memory, ``non_blocking`` and the stream in force).
Every CUDA-only line of ``measure_host_to_device`` runs; the copies it makes are checked, not their times.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import pytest
import torch

from course_lib.bench import matmul as matmul_module
from course_lib.bench import transfer as T


@dataclass
class FakeCuda:
    """What the replaced CUDA calls saw: each copy to the GPU as (source pinned?, non_blocking, stream)."""

    copies: list[tuple[bool, bool, object]] = field(default_factory=list)
    pinned: set[int] = field(default_factory=set)
    pins: int = 0
    syncs: int = 0
    streams: list[object] = field(default_factory=list)
    stream: object = None


@pytest.fixture
def fake_cuda(monkeypatch):
    fake = FakeCuda()
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, (str, torch.device)) and torch.device(target).type == "cuda":
            fake.copies.append((self.data_ptr() in fake.pinned, kwargs.get("non_blocking", False), fake.stream))
            if "device" in kwargs:
                kwargs["device"] = "cpu"
            else:
                args = ("cpu", *args[1:])
            return real_to(self, *args, **kwargs).clone()
        return real_to(self, *args, **kwargs)

    def pin_memory(self, device=None):
        fake.pins += 1
        out = self.clone()
        fake.pinned.add(out.data_ptr())
        return out

    class Stream:
        def __init__(self, device=None):
            fake.streams.append(self)

    @contextlib.contextmanager
    def stream(s):
        previous, fake.stream = fake.stream, s
        try:
            yield
        finally:
            fake.stream = previous

    def synchronize(device=None):
        fake.syncs += 1

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
    monkeypatch.setattr(torch.cuda, "Stream", Stream)
    monkeypatch.setattr(torch.cuda, "stream", stream)
    monkeypatch.setattr(torch.Tensor, "to", to)
    # nothing lives on the fake GPU: random operands are drawn on the CPU, as if they were on the device
    monkeypatch.setattr(matmul_module, "device_generator", lambda device, seed: torch.Generator().manual_seed(seed))
    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    return fake


def test_on_a_gpu_every_copy_is_made_as_its_kind_says(fake_cuda):
    result = T.measure_host_to_device("cuda", n_bytes=4096 * 4, matmul_n=16, matmuls=2, samples=3, warmup=1)
    s = result.seconds
    assert (result.device, result.n_bytes, result.matmul_n, result.matmuls, result.samples) == ("cuda", 16384, 16, 2, 3)
    assert list(s.copy) == list(s.host) == list(T.COPY_KINDS) and list(s.together) == list(T.OVERLAP_KINDS)
    every = [*s.copy.values(), *s.host.values(), s.pin, s.pin_then_copy, s.compute, *s.together.values()]
    assert all(math.isfinite(v) and v >= 0 for v in every)
    (side,) = fake_cuda.streams
    calls = iter(fake_cuda.copies)    # the matmul's operands are drawn on the device: no copy
    for memory, non_blocking in T.COPY_KINDS.values():     # warm-up and samples of each copy, in order
        assert [next(calls) for _ in range(4)] == [(memory == "pinned", non_blocking, None)] * 4
    assert [next(calls) for _ in range(4)] == [(True, True, None)] * 4   # pin_memory() then the copy
    for memory, on_side, _ in T.OVERLAP_KINDS.values():
        assert [next(calls) for _ in range(4)] == [(memory == "pinned", True, side if on_side else None)] * 4
    assert next(calls, None) is None
    assert fake_cuda.pins == 2 + 4 + 4 and fake_cuda.syncs > 0   # the two sources; pin alone; pin then copy


def _copies(**changes) -> T.HostToDevice:
    copy = {"pageable": 0.010, "pageable, non_blocking": 0.010, "pinned": 0.005, "pinned, non_blocking": 0.004}
    seconds = T.TransferSeconds(copy=copy, host={k: v / 2 for k, v in copy.items()}, pin=0.006, pin_then_copy=0.012,
                                compute=0.006, together={"pinned, side stream": 0.0065, "pageable, side stream": 0.016,
                                                         "pinned, same stream": 0.010})
    return T.HostToDevice("cuda", 40_000_000, 4096, 4, 10, seconds, **changes)


def test_bandwidth_and_overlap_from_the_medians():
    copies = _copies()
    assert copies.bandwidth_gbs("pinned, non_blocking") == pytest.approx(10.0)
    assert copies.apart_seconds("pinned, side stream") == pytest.approx(0.010)
    assert copies.overlap_share("pinned, side stream") == pytest.approx(0.875)   # 3.5 of the copy's 4 ms hidden
    assert copies.overlap_share("pinned, same stream") == pytest.approx(0.0)
    assert copies.overlap_share("pageable, side stream") == pytest.approx(0.0)
    with pytest.raises(ValueError, match="unknown copy 'pinned, async'"):
        copies.bandwidth_gbs("pinned, async")
    with pytest.raises(ValueError, match="unknown overlap 'pinned'"):
        copies.overlap_share("pinned")


def test_without_a_gpu_nothing_is_measured_and_torch_says_why(monkeypatch):
    refusal = T.pin_refusal()
    reason = T.transfer_unavailable_reason("cpu")
    if refusal is None:     # a machine with an accelerator pins; the CPU is still no destination
        assert reason == "the device is the CPU: a copy to it is no host-to-device copy"
    else:
        assert "Cannot access accelerator device" in refusal
        assert reason == (f"torch sees no GPU on this machine and refuses to pin memory without one (\"{refusal}\"), "
                          "and a copy to the CPU is no host-to-device copy")
    with pytest.raises(ValueError, match="cannot measure host-to-device copies: "):
        T.measure_host_to_device("cpu")
    monkeypatch.setattr(T, "pin_refusal", lambda: None)
    assert T.transfer_unavailable_reason("cpu") == "the device is the CPU: a copy to it is no host-to-device copy"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert T.transfer_unavailable_reason("cuda") == "a CUDA device was asked for, but torch sees no CUDA GPU"


@pytest.mark.parametrize("changes, message", [
    ({"n_bytes": 100}, "n_bytes must be an int of at least 4096"),
    ({"matmuls": 0}, "matmuls must be a positive int"),
    ({"samples": True}, "samples must be a positive int"),
    ({"warmup": -1}, "warmup must be a non-negative int"),
])
def test_bad_sizes_are_refused(fake_cuda, changes, message):
    with pytest.raises(ValueError, match=message):
        T.measure_host_to_device("cuda", **changes)


def test_a_loader_asked_to_pin_says_what_it_did():
    pinning = T.check_loader_pinning()
    if T.pin_refusal() is None:
        assert pinning == T.LoaderPinning("", True)
    else:   # no accelerator: torch warns and hands back ordinary memory
        assert not pinning.pinned and "pin_memory" in pinning.warning and "no accelerator" in pinning.warning
