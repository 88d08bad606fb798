"""DataLoader workers against compute (course_lib.bench.loading): the dataset, a tiny real measurement on the CPU
(its structure, not its times), the measures computed from hand-made times, the loop's CUDA branch with torch's
CUDA calls replaced, and bad inputs."""

from __future__ import annotations

import pytest
import torch

from course_lib.bench import loading as L

TINY = dict(batches=3, runs=2, batch_size=2, features=16, elements=64, prepare_rounds=2, compute_size=16,
            compute_rounds=2)


def test_items_are_the_same_whoever_prepares_them():
    data = L.ExpensiveDataset(items=4, features=8, elements=32, rounds=3)
    assert len(data) == 4 and data[1].shape == (8,) and data[1].dtype == torch.float32
    assert torch.equal(data[2], L.ExpensiveDataset(items=4, features=8, elements=32, rounds=3)[2])
    assert not torch.equal(data[1], data[2])
    with pytest.raises(IndexError, match="outside 0..3"):
        data[4]
    with pytest.raises(ValueError, match="features \\(64\\) cannot exceed elements \\(32\\)"):
        L.ExpensiveDataset(features=64, elements=32)
    with pytest.raises(ValueError, match="rounds must be a positive int"):
        L.ExpensiveDataset(rounds=0)


def test_a_small_run_on_the_cpu_has_every_time_and_restores_the_threads():
    before = torch.get_num_threads()
    result = L.measure_worker_overlap("cpu", workers=(0, 1), compute_threads=1, **TINY)
    assert torch.get_num_threads() == before
    assert (result.device, result.workers, result.batches, result.batch_size) == ("cpu", (0, 1), 3, 2)
    assert result.compute_threads == 1 and result.host_cores >= 1
    assert result.pinned is False and result.same_batches is True
    s = result.seconds
    assert len(s.prepare) == len(s.compute) == 2 and set(s.step) == set(s.first_batch) == {0, 1}
    assert all(len(v) == 2 and min(v) > 0 for v in (*s.step.values(), *s.first_batch.values()))
    assert isinstance(result.hidden_share(1), float) and isinstance(result.beyond_noise(1), bool)


def _overlap(step_with, first_with=(0.040, 0.038, 0.045)):
    seconds = L.LoaderSeconds(prepare=(0.010, 0.011, 0.009), compute=(0.009, 0.010, 0.0095),
                              step={0: (0.020, 0.021, 0.019), 2: step_with},
                              first_batch={0: (0.011, 0.012, 0.010), 2: first_with})
    return L.WorkerOverlap("cpu", (0, 2), 10, 8, 1, 2, False, True, seconds)


def test_the_measures_from_hand_made_times():
    fast = _overlap((0.011, 0.010, 0.0105))
    assert fast.median_step(2) == 0.0105 and fast.median_prepare == 0.010 and fast.median_compute == 0.0095
    assert fast.hidden_share(2) == pytest.approx(0.95) and fast.beyond_noise(2)
    assert fast.startup_seconds(2) == pytest.approx(0.029) and fast.startup_shows(2)
    overlapping = _overlap((0.015, 0.0195, 0.016), first_with=(0.011, 0.020, 0.009))
    assert not overlapping.beyond_noise(2) and not overlapping.startup_shows(2)
    with pytest.raises(ValueError, match="no run with 3 workers"):
        fast.median_step(3)


def test_on_a_gpu_the_batch_is_pinned_copied_without_blocking_and_each_step_synchronised(monkeypatch):
    copies, syncs = [], []
    real_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        if args and isinstance(args[0], torch.device) and args[0].type == "cuda":
            copies.append(kwargs.get("non_blocking", False))
            return real_to(self, "cpu", *args[1:], **kwargs)
        return real_to(self, *args, **kwargs)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: syncs.append(device))
    monkeypatch.setattr(torch.Tensor, "to", to)
    with pytest.warns(UserWarning, match="pin_memory"):   # a CPU-only torch cannot pin: the loader says so
        result = L.measure_worker_overlap("cuda", workers=(0, 1), **TINY)
    assert result.device == "cuda" and result.pinned is True
    # the operands and the compute's batch; then every loop batch, without blocking: 2 runs x 2 settings x 3
    assert copies == [False] * 3 + [True] * 12
    assert len(syncs) == 2 * 2 * TINY["batches"] + 2 * 2 * TINY["batches"]   # compute alone, and every loop step


@pytest.mark.parametrize("changes, error, message", [
    ({"workers": (1, 2)}, ValueError, "must start with 0"),
    ({"workers": (0, 0)}, ValueError, "each once"),
    ({"workers": (0,)}, ValueError, "at least one other count"),
    ({"workers": (0, -1)}, ValueError, "non-negative ints"),
    ({"workers": "02"}, TypeError, "sequence of ints"),
    ({"batches": 1}, ValueError, "batches must be at least 2"),
    ({"runs": 0}, ValueError, "runs must be a positive int"),
    ({"compute_threads": 0}, ValueError, "compute_threads must be a positive int"),
    ({"features": 8}, ValueError, "must equal compute_size"),
])
def test_bad_inputs_are_refused(changes, error, message):
    with pytest.raises(error, match=message):
        L.measure_worker_overlap("cpu", **{**TINY, **changes})


def test_an_unsupported_device_is_refused():
    with pytest.raises(ValueError, match="unsupported device type 'meta'"):
        L.measure_worker_overlap("meta", **TINY)
