"""course_lib.distributed: real multi-process runs on the CPU with gloo (the same code NCCL runs on GPUs)."""

import math
import os
import subprocess
import sys
import time

import pytest
import torch

from course_lib import distributed as D
from course_lib.distributed import launch
from course_lib.studies import distributed as distributed_studies
from course_lib.device import SizeProfile


@pytest.fixture(scope="module")
def study():
    """One launch of every lesson-10 run at 4 steps (inf planted at step 2), shared by the tests below."""
    return distributed_studies.data_parallel_study(SizeProfile("small"), steps=4)


# ---- the simulation of the all-reduce ----------------------------------------------------------------------

def test_simulated_ring_matches_gloos_all_reduce_bit_for_bit():
    for world in (2, 3):
        result = D.launch_local([], world_size=world, reduce_check=True)
        assert result.all_reduce_mismatches() == {"bfloat16": 0, "float16": 0}


def test_ring_order_is_what_makes_the_simulation_match(study):
    # the check can fail: the tree order, or one rounding of the exact sum, disagrees with the real all-reduce
    # at 3 ranks (at 2 ranks every order is one addition)
    inputs = D.reduce_check_inputs(3)
    ring = D.simulate_all_reduce(inputs, torch.bfloat16, "ring")
    assert not torch.equal(ring, D.simulate_all_reduce(inputs, torch.bfloat16, "tree"))
    assert not torch.equal(ring, inputs.double().sum(0).to(torch.bfloat16))
    assert study.all_reduce_mismatches == {"bfloat16": 0, "float16": 0}


def test_simulate_all_reduce_rounds_every_partial_sum():
    one, tiny = 1.0, 2.0 ** -8    # in BF16, 1 + 2^-8 is a tie that rounds back to 1
    values = torch.tensor([[one], [tiny], [tiny]])
    # ring, chunk 0 of 3 ranks: ranks 2, 1, 0 -> (tiny + tiny) + 1 = 1 + 2^-7 exactly
    assert float(D.simulate_all_reduce(values, torch.bfloat16, "ring")) == 1 + 2.0 ** -7
    # tree: (1 + tiny) + tiny = 1 + tiny = 1: both halves rounded away
    assert float(D.simulate_all_reduce(values, torch.bfloat16, "tree")) == 1.0
    assert float(D.simulate_all_reduce(values, torch.float32, "ring")) == 1 + 2.0 ** -7
    single = torch.tensor([[3.0, -1.0]])
    assert torch.equal(D.simulate_all_reduce(single, torch.float16), single.half()[0])


def test_simulate_all_reduce_refuses_bad_input():
    with pytest.raises(ValueError, match=r"\[ranks, n\]"):
        D.simulate_all_reduce(torch.ones(3), torch.bfloat16)
    with pytest.raises(ValueError, match="order"):
        D.simulate_all_reduce(torch.ones(2, 3), torch.bfloat16, "butterfly")
    with pytest.raises(TypeError, match="floating-point"):
        D.simulate_all_reduce(torch.ones(2, 3), torch.int32)


def test_fsdp2_predivide_matches_torch():
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as C

    class Group:
        def __init__(self, n):
            self.n = n

        def size(self):
            return self.n

    for n in (1, 2, 3, 4, 8, 12, 64, 128, 1000):
        pre, post, *_ = C._get_gradient_divide_factors(Group(n), None, torch.float16)
        assert (pre or 1) == D.fsdp2_predivide(n), n
        assert math.isclose(post, n / D.fsdp2_predivide(n))
    with pytest.raises(ValueError):
        D.fsdp2_predivide(0)


def test_reduction_study_shows_ring_error_growing_and_tree_flat():
    s = distributed_studies.reduction_precision_study(SizeProfile("small"), world_sizes=(2, 32))
    ring, tree = s.off_share["BF16, ring"], s.off_share["BF16, tree"]
    assert ring[0] == tree[0]                 # two ranks: one addition, whatever the order
    assert ring[1] > 2 * tree[1]              # a long chain of BF16 additions
    assert s.errors["FP32, ring"][1] < 1e-5 < s.errors["BF16, ring"][1]
    # FP16 divided by N first loses small entries that FSDP2's ~sqrt(N) split keeps
    assert s.off_share["FP16, ring, /N first (DDP hook)"][1] > s.off_share["FP16, ring, /~sqrt(N) first (FSDP2)"][1]
    assert s.floor_off_share == (0.0, 0.0)    # one BF16 rounding is never off by 1%
    assert s.at("BF16, ring", 32) == (s.errors["BF16, ring"][1], ring[1])
    with pytest.raises(ValueError, match="world size"):
        s.at("BF16, ring", 4)
    with pytest.raises(ValueError, match="at least 2"):
        distributed_studies.reduction_precision_study(SizeProfile("small"), world_sizes=(1,))


# ---- real runs -------------------------------------------------------------------------------------------

def test_two_process_ddp_matches_one_process(study):
    assert study.backend == "gloo" and study.world_size == 2
    loss_gap, weight_gap = study.parity["fp32"]
    assert loss_gap < 1e-5 and weight_gap < 1e-4        # only the order of FP32 sums differs
    for recipe in ("bf16_autocast", "fp16_autocast_scaler"):
        loss_gap, _ = study.parity[recipe]
        assert loss_gap < 2e-3, recipe                  # each rank's 16-bit weight gradient is rounded apart
    dp, single = study.curves["fp32"]
    assert len(dp) == len(single) == 4 and dp[-1] < dp[0]


def test_an_inf_on_one_rank_is_skipped_by_every_rank_under_ddp(study):
    case = study.scaler_cases["DDP, GradScaler per rank"]
    assert case.skipped == {0: (2,), 1: (2,)}
    assert case.scales[0] == case.scales[1] and case.scales[0][3] == case.scales[0][2] / 2
    assert case.replicas_agree and all(case.weights_finite.values())


def test_unscaling_before_the_all_reduce_splits_the_ranks(study):
    wrong = study.scaler_cases["by hand, unscale before the all-reduce"]
    assert wrong.skipped == {0: (), 1: (2,)}             # rank 0 never saw its own inf
    assert wrong.weights_finite == {0: False, 1: True}  # and stepped with the reduced inf
    assert wrong.non_finite_weights == {0: 1, 1: 0}       # one poisoned entry, a row the data never reads,
    assert all(math.isfinite(v) for v in wrong.final_losses.values())   # so the losses do not show it
    assert wrong.scales[0] != wrong.scales[1] and not wrong.replicas_agree
    fixed = study.scaler_cases["by hand, unscale before, ShardedGradScaler"]
    assert fixed.skipped == {0: (2,), 1: (2,)} and fixed.replicas_agree


def test_fsdp2_plain_grad_scaler_agrees_across_ranks(study):
    # DTensor gradients: torch reduces found_inf over the mesh, so a plain GradScaler sees rank 1's inf too
    for label in ("FSDP2 (FP16 compute), plain GradScaler", "FSDP2 (FP16 compute), ShardedGradScaler"):
        case = study.scaler_cases[label]
        assert 2 in case.skipped[0] and case.skipped[0] == case.skipped[1], label
        assert case.scales[0] == case.scales[1] and case.replicas_agree is None


def test_fsdp_holds_half_the_bytes_and_policies_train(study):
    ddp = sum(study.held_bytes["DDP fp32"].values())
    assert ddp == 16 * study.n_params                   # lesson 6's FP32 + AdamW: 16 bytes per parameter
    for label in distributed_studies.FSDP_POLICIES:
        assert sum(study.held_bytes[label].values()) == ddp // 2, label
        assert abs(study.eval_losses[label] - study.eval_losses["DDP fp32"]) < 0.01, label
    assert study.eval_losses["FSDP2, FP32 (no policy)"] == study.eval_losses["DDP fp32"]
    for label, gap in study.hook_weight_gaps.items():
        assert 0 < gap < 0.05, label                    # the hooks change the weights, a little


def test_a_failing_rank_is_reported_and_the_others_do_not_hang():
    start = time.perf_counter()
    with pytest.raises(D.DistributedRunError, match=r"rank 1 of 2 exited with status 1: RuntimeError: planted failure on rank 1"):
        D.launch_local(D.DistRun("boom", recipe="fp32", steps=3, fail_rank=1, collective_timeout_s=20))
    assert time.perf_counter() - start < 60


def test_launch_timeout_kills_every_rank():
    with pytest.raises(D.DistributedRunError, match="timeout"):
        D.launch_local(D.DistRun("slow", recipe="fp32", steps=50), timeout_s=0.5)


def test_torchrun_entry_point_trains_two_ranks(tmp_path):
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    out = tmp_path / "out"
    proc = subprocess.run([torchrun, "--nproc-per-node", "2", "--master-port", str(launch._free_port()),
                           "-m", "course_lib.distributed", "--recipe", "bf16_autocast", "--steps", "2",
                           "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "[cli] rank 0 of 2 (gloo, cpu): 2 steps" in proc.stdout
    h0, h1 = (D.load_rank_history(out, "cli", r) for r in (0, 1))
    assert torch.equal(h0.final_params, h1.final_params) and h0.losses != h1.losses   # replicas, own slices


def test_entry_point_outside_torchrun_says_how_to_start_it(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    assert D.main(["--steps", "2"]) == 2
    assert "torchrun" in capsys.readouterr().err


# ---- clear errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    ({"recipe": "fp64"}, "unknown recipe"),
    ({"wrapper": "zero3"}, "wrapper"),
    ({"steps": -1}, "steps"),
    ({"comm_hook": "fp8"}, "comm_hook"),
    ({"comm_hook": "fp16", "wrapper": "fsdp"}, "comm_hook"),
    ({"reduce_dtype": "bfloat16"}, "FSDP"),
    ({"wrapper": "fsdp", "param_dtype": "float8"}, "param_dtype"),
    ({"wrapper": "fsdp", "recipe": "bf16_pure"}, "FP32-weight recipe"),
    ({"scaler": "dynamic"}, "scaler"),
    ({"plant_inf": (1,)}, "plant_inf"),
    ({"collective_timeout_s": 0}, "collective_timeout_s"),
])
def test_dist_run_refuses_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        D.DistRun("x", **kwargs)


def test_launch_refuses_bad_world_sizes_and_runs():
    run = D.DistRun("x", recipe="fp32", steps=1)
    for world in (1, 0, True, 2.0):
        with pytest.raises(ValueError, match="world_size"):
            D.launch_local(run, world_size=world)
    with pytest.raises(ValueError, match="rank 2"):
        D.launch_local(D.DistRun("x", plant_inf=(2, 0)), world_size=2)
    with pytest.raises(ValueError, match="does not split evenly"):
        D.launch_local(run, world_size=3)
    with pytest.raises(ValueError, match="own name"):
        D.launch_local([run, run])
    with pytest.raises(TypeError, match="DistRun"):
        D.launch_local(["fp32"])
    with pytest.raises(ValueError, match="backend"):
        D.launch_local(run, backend="mpi")
    with pytest.raises(ValueError, match="single-process"):
        D.single_process_run(D.DistRun("x", plant_inf=(1, 0)), SizeProfile("small"))


def test_backend_follows_the_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert D.choose_backend("auto", 2) == "nccl"
    assert D.choose_backend("auto", 4) == "gloo"      # not every rank would have its own GPU
    assert D.choose_backend("gloo", 2) == "gloo"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert D.choose_backend("auto", 2) == "gloo"


def test_compress_hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    assert D.compress_hook("fp16", backend="gloo") is default_hooks.fp16_compress_hook
    assert D.compress_hook("bf16", backend="nccl") is default_hooks.bf16_compress_hook
    ours = D.compress_hook("bf16", backend="gloo")
    assert ours.__name__ == "cast_compress_hook_bfloat16"   # torch refuses its own BF16 hook without NCCL
    with pytest.raises(ValueError):
        D.compress_hook("int8", backend="gloo")


def test_cast_compress_hook_does_torchs_fp16_arithmetic():
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    class Bucket:
        def __init__(self, t):
            self.t = t

        def buffer(self):
            return self.t

    values = D.reduce_check_inputs(1)[0]
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        theirs = default_hooks.fp16_compress_hook(None, Bucket(values.clone())).wait()
        ours = D.cast_compress_hook(torch.float16)(None, Bucket(values.clone())).wait()
    finally:
        dist.destroy_process_group()
    assert torch.equal(theirs, ours) and not torch.equal(ours, values)   # rounded through FP16, both alike


def test_worker_on_gpus_joins_nccl_on_its_own_gpu(monkeypatch):
    # the CUDA branch of a rank, up to the point where NCCL would start: each rank takes the GPU of its
    # local rank and joins an NCCL group (no GPU here, so init_process_group is stopped right there)
    import torch.distributed as dist

    calls = {}

    class Joined(Exception):
        pass

    def init(backend, timeout):
        calls["init"] = (backend, timeout.total_seconds())
        raise Joined

    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.setdefault("device", torch.device(d)))
    monkeypatch.setattr(dist, "init_process_group", init)
    with pytest.raises(Joined):
        D.run_worker([D.DistRun("x", collective_timeout_s=30)], size="small", backend="auto", out=None, max_steps=None)
    assert calls == {"device": torch.device("cuda", 1), "init": ("nccl", 30.0)}
