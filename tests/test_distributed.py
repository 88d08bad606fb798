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
from course_lib.distributed.reduce import reduce_check_plan, ring_chunks
from course_lib.distributed.worker import ProgressMarks
from course_lib.studies import distributed as distributed_studies
from course_lib.device import SizeProfile


@pytest.fixture(scope="module")
def study():
    """One launch of every lesson-10 run at 4 steps (inf planted at step 2), shared by the tests below."""
    return distributed_studies.data_parallel_study(SizeProfile("small"), steps=4)


# ---- the simulation of the all-reduce ----------------------------------------------------------------------

AWKWARD_SIZES = (1, 2, 3, 5, 7, 9, 33, 1000, 4096, 4097)


def _ceil_n_over_ranks_ring(values, dtype):
    """The ring order with chunks of ceil(n / ranks) values, as simulate_all_reduce once had it (not gloo's)."""
    v = values.to(dtype)
    ranks, n = v.shape
    chunk_of = torch.arange(n) // -(-n // ranks)
    acc = v.gather(0, ((chunk_of - 1) % ranks)[None, :])[0]
    for k in range(1, ranks):
        acc = acc + v.gather(0, ((chunk_of - 1 - k) % ranks)[None, :])[0]
    return acc


def test_simulated_ring_matches_gloos_all_reduce_bit_for_bit():
    # one launch of 3 ranks all-reduces on a group of 2 and on all 3, lengths that split unevenly into chunks
    dtypes = ("bfloat16", "float16", "float32")
    result = D.launch_local([], world_size=3, reduce_check=True, reduce_check_sizes=AWKWARD_SIZES,
                            reduce_check_dtypes=dtypes)
    cases = result.all_reduce_mismatches_by_case()
    assert len(cases) == len(dtypes) * 2 * len(AWKWARD_SIZES)
    assert {case: count for case, count in cases.items() if count} == {}
    assert result.all_reduce_mismatches() == dict.fromkeys(dtypes, 0)
    # the check can fail: chunks of ceil(n / ranks) values put some values in another chunk, summed in another
    # order, and gloo's results show it (at 3 ranks; at 2 every order is one addition)
    wrong = {}
    for name in dtypes:
        offset = 0
        for ranks, n in reduce_check_plan(3, AWKWARD_SIZES):
            real = result.all_reduced[name][offset:offset + n]
            offset += n
            inputs = D.reduce_check_inputs(ranks, n)
            wrong[name, ranks, n] = int((_ceil_n_over_ranks_ring(inputs, D.DTYPES_BY_NAME[name]) != real).sum())
    assert wrong["bfloat16", 3, 7] == wrong["float16", 3, 7] == wrong["float32", 3, 7] == 1
    assert not any(count for (_, ranks, _), count in wrong.items() if ranks == 2)


def test_ring_chunks_are_gloos_segments_not_ceil_n_over_ranks():
    # gloo cuts n values into 2 segments per rank (more past 1 MiB a segment) of ceil(n / segments) values
    assert ring_chunks(7, 3, 2) == ((0, 4), (4, 7), (7, 7))
    assert ring_chunks(4096, 3, 2) == ((0, 1366), (1366, 2732), (2732, 4096))
    assert ring_chunks(4097, 2, 4) == ((0, 2050), (2050, 4097))
    # 7 MiB of FP32 on 3 ranks: 9 segments of 203,891 values; these boundaries were measured on gloo (torch
    # 2.13) with the probe below, where ceil(n / 6) segments would put them at 611,672 and 1,223,344
    assert ring_chunks(1_835_013, 3, 4) == ((0, 611_673), (611_673, 1_223_346), (1_223_346, 1_835_013))
    assert ring_chunks(5, 1, 2) == ((0, 5),) and ring_chunks(0, 3, 2) == ((0, 0),) * 3
    # the probe: 1 on rank c and half an ulp of 1 on the others sums to 1 + ulp exactly on chunk c (where the
    # two halves are added first) and to 1 on the other chunks
    for dtype, half_ulp in ((torch.bfloat16, 2.0 ** -8), (torch.float16, 2.0 ** -11), (torch.float32, 2.0 ** -24)):
        for n in (2, 7, 9, 33):
            for c, (start, stop) in enumerate(ring_chunks(n, 3, torch.tensor([], dtype=dtype).element_size())):
                probe = torch.full((3, n), half_ulp)
                probe[c] = 1.0
                hit = D.simulate_all_reduce(probe, dtype) != 1
                assert hit.nonzero().flatten().tolist() == list(range(start, stop)), (dtype, n, c)


def test_ring_chunks_and_the_check_refuse_bad_input():
    for args, match in (((-1, 3, 2), "n must"), ((7, 0, 2), "ranks must"), ((7, 3, 0), "element_size must"),
                        ((True, 3, 2), "n must"), ((7.0, 3, 2), "n must")):
        with pytest.raises(ValueError, match=match):
            ring_chunks(*args)
    for kwargs, match in (({"reduce_check_sizes": ()}, "at least one"), ({"reduce_check_sizes": (4, 0)}, "size"),
                          ({"reduce_check_dtypes": ("int8",)}, "reduce_check_dtypes")):
        with pytest.raises(ValueError, match=match):
            D.launch_local([], reduce_check=True, **kwargs)
    assert D.simulate_all_reduce(torch.ones(3, 0), torch.bfloat16).shape == (0,)


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
    ring, tree = s.off_share["BF16, ring"], s.off_share["BF16, pairwise tree"]
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
    assert (s.n_values, s.model_values) == (136960, 0)   # the small model's gradient runs whole
    with pytest.raises(ValueError, match="max_values"):
        distributed_studies.reduction_precision_study(SizeProfile("small"), max_values=0)


def test_a_large_gradient_is_reduced_on_a_fixed_sample_of_its_entries():
    """The full profile's 19M entries x 128 ranks would be 9.9 GB: a sample, the same entries on every rank."""
    s = distributed_studies.reduction_precision_study(SizeProfile("small"), world_sizes=(2, 32), max_values=20_000)
    assert (s.n_values, s.model_values) == (20_000, 136960)
    again = distributed_studies.reduction_precision_study(SizeProfile("small"), world_sizes=(2, 32), max_values=20_000)
    assert again == s                                          # the same sample from the same seed
    ring, tree = s.off_share["BF16, ring"], s.off_share["BF16, pairwise tree"]
    assert ring[0] == tree[0] and ring[1] > 2 * tree[1]        # what the whole gradient shows, on the sample
    assert distributed_studies.reduction_facts(s)["n_values"] == ("a fixed random sample of **20,000** of the model's "
                                                                  "**136,960**")


def test_per_rank_gradients_cut_to_a_sample_equal_the_whole_gradients_columns():
    small = SizeProfile("small")
    whole = distributed_studies.per_rank_gradients(small, "cpu", 3)
    assert whole.shape == (3, distributed_studies.gpt_config_for(small).parameter_count())
    keep = torch.tensor([0, 5, 1000, whole.shape[1] - 1])
    assert torch.equal(distributed_studies.per_rank_gradients(small, "cpu", 3, keep=keep), whole[:, keep])
    with pytest.raises(ValueError, match="keep's indices must lie in"):
        distributed_studies.per_rank_gradients(small, "cpu", 2, keep=torch.tensor([whole.shape[1]]))
    with pytest.raises(TypeError, match="1-D int64"):
        distributed_studies.per_rank_gradients(small, "cpu", 2, keep=torch.tensor([0.0]))


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
    # the control: one process accumulating the two ranks' slices reproduces the BF16 two-rank run exactly,
    # where the whole batch in one process does not
    assert study.split_parity == (0.0, 0.0) and study.parity["bf16_autocast"][0] > 0


def test_single_process_run_cuts_the_batch_into_micro_batches():
    run = D.DistRun("split", recipe="fp32", steps=2)
    whole = D.single_process_run(run, SizeProfile("small"))
    split = D.single_process_run(run, SizeProfile("small"), micro_batches=2)
    assert len(split.losses) == 2 and split.losses != whole.losses   # the same batches, other sums
    assert max(abs(a - b) for a, b in zip(split.losses, whole.losses)) < 1e-5
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="micro_batches"):
            D.single_process_run(run, SizeProfile("small"), micro_batches=bad)



def test_single_process_run_takes_the_ranks_thread_count_and_gives_it_back():
    run = D.DistRun("threads", recipe="fp32", steps=1)
    before = torch.get_num_threads()
    seen = []
    real = D.worker._train_rank
    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(D.worker, "_train_rank", spy)
        D.single_process_run(run, SizeProfile("small"), threads=1)
        D.single_process_run(run, SizeProfile("small"))
    assert seen == [1, before] and torch.get_num_threads() == before
    assert D.worker.rank_threads(1) == max(1, os.cpu_count() or 1)
    assert D.worker.rank_threads(10**6) == 1
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            D.single_process_run(run, SizeProfile("small"), threads=bad)
        with pytest.raises(ValueError, match="local_world"):
            D.worker.rank_threads(bad)


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


def test_a_hanging_rank_is_named_not_the_rank_waiting_for_it():
    # rank 1 stops before its first step; rank 0 waits for it in the step's all-reduce. The launch times out
    # and names every rank still running, and rank 1 as the one that had not reached the collective
    with pytest.raises(D.DistributedRunError) as caught:
        D.launch_local(D.DistRun("stall", recipe="fp32", steps=3, hang_rank=1), timeout_s=25)
    message = str(caught.value)
    assert message.startswith("the launch ran past its timeout of 25 s with ranks 0, 1 of 2 still running\n")
    assert "rank 1 had not reached 'run stall: step 0', where rank 0 was (in a collective waiting for it" in message
    assert "rank 1's last mark was 'run stall: setting up'" in message
    assert "rank 1's last output:" in message


def test_fsdp_collectives_carry_the_policy_dtypes_bytes(study):
    # counted where FSDP2 calls torch.distributed: every parameter reduce-scattered once a step in reduce_dtype;
    # gathered in param_dtype once for the forward and, for the blocks (freed after the forward), again for
    # the backward, while the root module keeps its parameters
    setup = D.setup_for_run(D.DistRun("x"), SizeProfile("small"), torch.device("cpu"))
    model = setup.model(0)
    n, in_blocks = (sum(p.numel() for p in ps) for ps in (model.parameters(), model.blocks.parameters()))
    assert n == study.n_params and 0 < in_blocks < n
    for label, (param, reduce) in distributed_studies.FSDP_POLICIES.items():
        size = {None: 4, "float32": 4, "bfloat16": 2}
        assert study.collective_bytes[label] == {"all_gather": size[param] * (n + in_blocks) * study.steps,
                                                 "reduce_scatter": size[reduce] * n * study.steps}, label


def test_collective_bytes_are_counted_passed_on_and_the_functions_restored(monkeypatch):
    import torch.distributed as dist

    calls = []
    for name in ("all_gather_single", "reduce_scatter_single"):
        monkeypatch.setattr(dist, name, lambda *a, _name=name, **k: calls.append(_name) or "work", raising=False)
    before = (dist.all_gather_single, dist.reduce_scatter_single)
    with pytest.raises(RuntimeError, match="inside"):
        with D.count_collective_bytes() as counted:
            assert dist.all_gather_single(torch.empty(6, dtype=torch.bfloat16), torch.empty(3)) == "work"
            dist.reduce_scatter_single(output=torch.empty(2), input=torch.empty(4, dtype=torch.float64))
            dist.all_gather_single(torch.empty(2, 5), torch.empty(5), group=None)
            raise RuntimeError("inside")
    assert counted == {"all_gather": 6 * 2 + 10 * 4, "reduce_scatter": 4 * 8}
    assert calls == ["all_gather_single", "reduce_scatter_single", "all_gather_single"]
    assert (dist.all_gather_single, dist.reduce_scatter_single) == before


def test_sharded_step_bytes_and_its_bad_input():
    assert D.sharded_step_bytes(2, 4, gathers=1) == {"all_gather": 2, "reduce_scatter": 4}
    assert D.sharded_step_bytes(2, 2) == {"all_gather": 4, "reduce_scatter": 2}
    for bad in ({"param_bytes": 0}, {"reduce_bytes": 2.0}, {"gathers": True}):
        args = {"param_bytes": 2, "reduce_bytes": 4, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            D.sharded_step_bytes(args["param_bytes"], args["reduce_bytes"], gathers=args.get("gathers", 2))


def _marks(out, where_by_rank):
    for rank, wheres in where_by_rank.items():
        progress = ProgressMarks(out, rank)
        for where in wheres:
            progress(where)
        (out / f"rank{rank}.log").write_text("")


def test_launch_diagnosis_reads_the_progress_marks(tmp_path):
    setup, step0 = ["joining the process group", "run r: setting up"], ["run r: step 0"]
    # a collective timed out on rank 0 while rank 1 never came: rank 0 exited, rank 1 is still running
    _marks(tmp_path, {0: setup + step0, 1: setup})
    (tmp_path / "rank0.log").write_text("[rank0]: RuntimeError: [gloo] Timed out waiting 2000ms for recv\n")
    message = launch._diagnosis(tmp_path, 2, {0: 1}, [1], 180.0)
    assert message.splitlines()[:3] == [
        "rank 0 of 2 exited with status 1: RuntimeError: [gloo] Timed out waiting 2000ms for recv",
        "rank 1 still running when the launch stopped them",
        "rank 1 had not reached 'run r: step 0', where rank 0 was (in a collective waiting for it, most likely): "
        "rank 1's last mark was 'run r: setting up'"]
    # two ranks seen failing in one poll: the one further behind failed first, the other lost its peer
    assert launch._diagnosis(tmp_path, 2, {0: 1, 1: 1}, [], 180.0).startswith("rank 1 of 2 exited with status 1\n")
    # ranks at the same mark: the launcher says it cannot tell
    _marks(tmp_path, {0: setup + step0, 1: setup + step0, 2: setup})
    message = launch._diagnosis(tmp_path, 3, {}, [0, 1, 2], 5.0)
    assert "rank 2 had not reached 'run r: step 0', where ranks 0, 1 were (in a collective waiting for it" in message
    _marks(tmp_path, {0: setup, 1: setup})
    message = launch._diagnosis(tmp_path, 2, {}, [0, 1], 5.0)
    assert "every running rank was at the same point ('run r: setting up')" in message


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
    ({"wrapper": "fsdp", "recipe": "fp16_autocast_scaler", "param_dtype": "bfloat16"},
     "autocasts to float16 but FSDP's param_dtype is 'bfloat16'"),
    ({"wrapper": "fsdp", "recipe": "bf16_autocast", "param_dtype": "float16"},
     "autocasts to bfloat16 but FSDP's param_dtype is 'float16'"),
    ({"hang_rank": -1}, "hang_rank"),
    ({"scaler": "dynamic"}, "scaler"),
    ({"plant_inf": (1,)}, "plant_inf"),
    ({"collective_timeout_s": 0}, "collective_timeout_s"),
])
def test_dist_run_refuses_bad_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        D.DistRun("x", **kwargs)


def test_fsdp_takes_a_param_dtype_that_agrees_with_the_autocast():
    for recipe, param_dtype in (("fp16_autocast_scaler", "float16"), ("fp16_autocast_scaler", "float32"),
                                ("bf16_autocast", "bfloat16"), ("fp32", "float16"), ("fp32", "bfloat16")):
        D.DistRun("x", wrapper="fsdp", recipe=recipe, param_dtype=param_dtype)


def test_cli_refuses_fp16_autocast_with_bf16_fsdp_params_before_joining(monkeypatch, capsys):
    # this command used to train until torch's CPU layer_norm refused the BF16 weight of an FP16 activation
    import torch.distributed as dist

    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "init_process_group", lambda *a, **k: pytest.fail("the rank joined a group"))
    assert D.main(["--recipe", "fp16_autocast_scaler", "--wrapper", "fsdp", "--param-dtype", "bfloat16",
                   "--reduce-dtype", "float32"]) == 2
    err = capsys.readouterr().err
    assert "autocasts to float16 but FSDP's param_dtype is 'bfloat16'" in err and "param_dtype 'float16'" in err


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
    with pytest.raises(ValueError, match="single-process"):
        D.single_process_run(D.DistRun("x", hang_rank=1), SizeProfile("small"))
    with pytest.raises(ValueError, match="hang_rank names rank 2"):
        D.launch_local(D.DistRun("x", hang_rank=2), world_size=2)


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


def _hooks_on_gloo_ranks(values, hooks):
    """Each hook of ``hooks`` run by ``len(values)`` real gloo ranks (threads of this process, each with its
    own ``ProcessGroupGloo`` over one store: fast, and the same all-reduce as separate processes), rank r's
    bucket holding ``values[r]``; per hook, each rank's bucket after the hook."""
    import datetime
    import threading

    import torch.distributed as dist

    class Bucket:
        def __init__(self, t):
            self.t = t

        def buffer(self):
            return self.t

    n = len(values)
    store = dist.HashStore()
    out = {name: [None] * n for name in hooks}
    errors = []

    def rank(r):
        try:
            group = dist.ProcessGroupGloo(dist.PrefixStore("hooks", store), r, n, datetime.timedelta(seconds=30))
            for name, hook in hooks.items():
                out[name][r] = hook(group, Bucket(values[r].clone())).wait()
        except Exception as e:   # noqa: BLE001 - reported below, in the test's thread
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return {name: torch.stack(buckets) for name, buckets in out.items()}


def test_cast_compress_hook_does_torchs_fp16_arithmetic_on_three_ranks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    values = D.reduce_check_inputs(3, 4097)   # 3 ranks: a division by 3 rounds, and the ring's order counts
    got = _hooks_on_gloo_ranks(values, {"torch": default_hooks.fp16_compress_hook,
                                        "ours": D.cast_compress_hook(torch.float16)})
    assert torch.equal(got["ours"], got["torch"])                  # bit for bit, on every rank
    assert all(torch.equal(got["torch"][r], got["torch"][0]) for r in range(3))
    # what the hook computes is reduce_mean's DDP-hook variant: cast to FP16, divide by N in FP16, ring sum
    assert torch.equal(got["torch"][0].double(), D.reduce_mean(values, "FP16, ring, /N first (DDP hook)"))
    # dividing in FP32 before the cast (one rounding, not two) is another result: the order is visible
    divided_first = D.simulate_all_reduce(values / 3, torch.float16, "ring").double()
    assert not torch.equal(got["torch"][0].double(), divided_first)
    with pytest.raises(ValueError, match="ranks, n"):
        D.reduce_mean(values[0], "FP32, ring")


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


def test_held_bytes_count_the_fp32_gradient_of_master_weights():
    from types import SimpleNamespace

    from course_lib.distributed import worker

    p = torch.zeros(10, dtype=torch.bfloat16)
    p.grad = torch.zeros(10, dtype=torch.bfloat16)
    m = torch.zeros(10)
    m.grad = torch.zeros(10)
    state = SimpleNamespace(params=[p], masters=[m], optimizer=SimpleNamespace(state={}))
    assert worker._held_bytes(state) == {"parameters": 20, "gradients": 20 + 40, "optimizer_state": 0,
                                          "master_weights": 40}
    plain = SimpleNamespace(params=[p], masters=None, optimizer=SimpleNamespace(state={}))
    assert worker._held_bytes(plain)["gradients"] == 20 and worker._held_bytes(plain)["master_weights"] == 0


def test_shard_with_policy_shards_every_block_under_one_policy(tmp_path):
    """The call lesson 10 shows, in a one-rank gloo group: every block and the root sharded, the parameters
    stored as FP32 shards and gathered in the policy's dtype for the forward."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from course_lib.models import GPTConfig, build_gpt

    with pytest.raises(TypeError, match="ModuleList of blocks"):
        D.shard_with_policy(torch.nn.Linear(2, 2))
    model = build_gpt(GPTConfig(vocab_size=16, context=8, d_model=64, n_layers=2, n_heads=2))
    with pytest.raises(TypeError, match="param_dtype must be None or a floating torch.dtype"):
        D.shard_with_policy(model, param_dtype="bfloat16")
    with pytest.raises(TypeError, match="reduce_dtype"):
        D.shard_with_policy(model, reduce_dtype=torch.int8)
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.FileStore(str(tmp_path / "store"), 1))
    try:
        D.shard_with_policy(model, param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        params = list(model.parameters())
        assert params and all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in params)
        logits = model(torch.randint(0, 16, (2, 8)))[0]
        assert logits.dtype == torch.bfloat16    # computed in the gathered BF16 parameters
        logits.float().sum().backward()
        assert all(isinstance(p.grad, DTensor) and p.grad.dtype == torch.float32 for p in params)
        # reduce_dtype on the wire: test_fsdp_collectives_carry_the_policy_dtypes_bytes, through the worker
    finally:
        dist.destroy_process_group()


def test_shard_with_policy_source_fits_the_page():
    """Lesson 10 prints this function's source in a code column about 77 characters wide."""
    import inspect

    assert max(len(line) for line in inspect.getsource(D.shard_with_policy).splitlines()) <= 77
