"""Mixed precision across processes: the course's training loop under ``torch.distributed``, for real.

Two ways to start the same worker code:

* ``torchrun --nproc-per-node 2 -m course_lib.distributed --recipe bf16_autocast --steps 20`` (env://
  rendezvous, so the same command scales to several machines; NCCL when every rank has its own GPU, gloo on
  the CPU otherwise);
* :func:`launch_local` for the lesson and the tests: it starts N local processes with the same
  environment torchrun sets, collects each rank's history, and always cleans up: a failing rank's error is
  reported, the others are stopped (collectives time out, and the launcher kills what is left).

Each rank trains the course model (:func:`course_lib.train.train`, unchanged) on its slice of the global
batch, so a data-parallel run sees exactly the batches of a single-process run (:func:`single_process_run`)
and computes the same mean gradient, up to rounding. Wrappers: ``ddp`` (DistributedDataParallel, one
GradScaler per rank, optional gradient-compression hook), ``fsdp`` (FSDP2 ``fully_shard`` with a
``MixedPrecisionPolicy``; a plain or a sharded-aware scaler) and ``manual`` (gradients all-reduced by hand
after the loss scale was checked locally: the pitfall).

:func:`simulate_all_reduce` reproduces a ring all-reduce in 16-bit arithmetic in one process (checked bit for
bit against gloo's), and :func:`reduction_precision_study` measures the error of the reduced gradient
against the number of ranks.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

WRAPPERS = ("ddp", "fsdp", "manual")
COMM_HOOKS = ("fp16", "bf16")
SCALERS = ("auto", "plain", "sharded", "none")
REDUCE_ORDERS = ("ring", "tree")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEFAULT_TIMEOUT_S = 180.0   # the whole launch; collectives time out sooner (see DistRun.collective_timeout_s)


def _dtype(name: str | None, what: str) -> torch.dtype | None:
    if name is None:
        return None
    if name not in _DTYPES:
        raise ValueError(f"{what} must be one of {', '.join(_DTYPES)} (or None), got {name!r}")
    return _DTYPES[name]


@dataclass(frozen=True)
class DistRun:
    """One data-parallel training run (every rank runs the same ``DistRun``).

    ``recipe``: a :data:`course_lib.train.RECIPES` name (autocast, parameter dtype, GradScaler).
    ``wrapper``: ``ddp``, ``fsdp`` or ``manual`` (see the module's docstring).
    ``comm_hook``: DDP only: compress gradients to ``fp16`` or ``bf16`` for the all-reduce.
    ``param_dtype`` / ``reduce_dtype``: FSDP only: the ``MixedPrecisionPolicy`` (``"bfloat16"``, ...).
    ``scaler``: ``auto`` (the recipe's GradScaler), ``plain`` (``torch.amp.GradScaler``), ``sharded``
    (``ShardedGradScaler``) or ``none``.
    ``plant_inf``: ``(rank, step)``: that rank's gradient gets an inf at that step: before the reduction
    under ``ddp`` and ``manual`` (an overflow in that rank's backward), in the rank's own shard after the
    reduce-scatter under ``fsdp`` (an overflow in the reduction of the part it owns).
    ``fail_rank``: that rank raises at its first step (to test that a failure is reported, not hung on).
    """

    name: str
    recipe: str = "bf16_autocast"
    wrapper: str = "ddp"
    steps: int = 8
    seed: int = 0
    lr: float = 3e-3
    comm_hook: str | None = None
    param_dtype: str | None = None
    reduce_dtype: str | None = None
    scaler: str = "auto"
    plant_inf: tuple[int, int] | None = None
    fail_rank: int | None = None
    collective_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        from .train import get_recipe

        if not isinstance(self.name, str) or not self.name or not self.name.replace("_", "").isalnum():
            raise ValueError(f"a run's name must be a non-empty identifier (letters, digits, _), got {self.name!r}")
        get_recipe(self.recipe)
        if self.wrapper not in WRAPPERS:
            raise ValueError(f"wrapper must be one of {WRAPPERS}, got {self.wrapper!r}")
        for key in ("steps", "seed"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{key} must be a non-negative int, got {value!r}")
        if self.comm_hook is not None and (self.comm_hook not in COMM_HOOKS or self.wrapper != "ddp"):
            raise ValueError(f"comm_hook must be None or one of {COMM_HOOKS}, and only with wrapper 'ddp'; got "
                             f"{self.comm_hook!r} with {self.wrapper!r}")
        _dtype(self.param_dtype, "param_dtype")
        _dtype(self.reduce_dtype, "reduce_dtype")
        if self.wrapper != "fsdp" and (self.param_dtype or self.reduce_dtype):
            raise ValueError("param_dtype and reduce_dtype are FSDP's MixedPrecisionPolicy: use them with "
                             "wrapper 'fsdp' (DDP runs take their precision from the recipe)")
        if self.wrapper == "fsdp" and get_recipe(self.recipe).param_dtype != torch.float32:
            raise ValueError("under FSDP the sharded parameters stay FP32 and the policy's param_dtype sets the "
                             f"compute dtype: use an FP32-weight recipe, not {self.recipe!r}")
        if self.scaler not in SCALERS:
            raise ValueError(f"scaler must be one of {SCALERS}, got {self.scaler!r}")
        if self.plant_inf is not None:
            if (len(self.plant_inf) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                                for v in self.plant_inf)):
                raise ValueError(f"plant_inf must be (rank, step) with non-negative ints, got {self.plant_inf!r}")
            object.__setattr__(self, "plant_inf", tuple(self.plant_inf))
        if self.fail_rank is not None and (isinstance(self.fail_rank, bool) or not isinstance(self.fail_rank, int)
                                           or self.fail_rank < 0):
            raise ValueError(f"fail_rank must be None or a non-negative int, got {self.fail_rank!r}")
        if not (self.collective_timeout_s > 0 and math.isfinite(self.collective_timeout_s)):
            raise ValueError(f"collective_timeout_s must be positive, got {self.collective_timeout_s}")

    def check_world_size(self, world_size: int) -> None:
        for what, pair in (("plant_inf", self.plant_inf), ("fail_rank", (self.fail_rank, 0))):
            if pair is not None and pair[0] is not None and pair[0] >= world_size:
                raise ValueError(f"{what} names rank {pair[0]}, but the world has ranks 0..{world_size - 1}")


@dataclass(frozen=True)
class RankHistory:
    """What one rank recorded in one run: per step its local loss (its slice of the batch), loss scale,
    skipped or not, gradient norm; its final parameters (the full FP32 vector, gathered under FSDP); and
    the bytes this rank holds of parameters, gradients and optimizer state (its shard under FSDP)."""

    run: str
    rank: int
    world_size: int
    backend: str
    device: str
    losses: tuple[float, ...]
    scales: tuple[float, ...]
    skipped: tuple[bool, ...]
    grad_norms: tuple[float, ...]
    final_params: torch.Tensor
    held_bytes: dict[str, int]
    seconds: float


@dataclass(frozen=True)
class DistributedResult:
    """Every rank's :class:`RankHistory` per run, in rank order."""

    world_size: int
    backend: str
    runs: dict[str, tuple[RankHistory, ...]]
    seconds: float
    all_reduced: dict[str, torch.Tensor] = field(default_factory=dict)

    def all_reduce_mismatches(self) -> dict[str, int]:
        """Per dtype, how many of the real all-reduce's outputs differ from :func:`simulate_all_reduce`'s
        ring order on the same inputs (:func:`reduce_check_inputs`): 0 means bit for bit."""
        inputs = reduce_check_inputs(self.world_size)
        return {name: int((simulate_all_reduce(inputs, _DTYPES[name], "ring") != real).sum())
                for name, real in self.all_reduced.items()}

    def ranks(self, run: str) -> tuple[RankHistory, ...]:
        if run not in self.runs:
            raise ValueError(f"no run named {run!r}; ran: {', '.join(self.runs)}")
        return self.runs[run]

    def mean_losses(self, run: str) -> tuple[float, ...]:
        """The loss of the global batch per step: the mean of the ranks' losses on equal slices."""
        hs = self.ranks(run)
        return tuple(sum(h.losses[i] for h in hs) / len(hs) for i in range(len(hs[0].losses)))

    def skipped_steps(self, run: str) -> dict[int, tuple[int, ...]]:
        """Per rank, the steps its optimizer skipped."""
        return {h.rank: tuple(i for i, s in enumerate(h.skipped) if s) for h in self.ranks(run)}

    def param_gap_between_ranks(self, run: str) -> float:
        """Largest absolute difference of any final parameter between rank 0 and another rank (0.0: the
        replicas agree bit for bit; NaN when a rank's weights are not finite)."""
        hs = self.ranks(run)
        gaps = [float((h.final_params - hs[0].final_params).abs().max()) for h in hs[1:]]
        return max(gaps, default=0.0)


class _RankSlice:
    """Rank ``rank``'s equal slice of each global batch of ``sampler`` (same ``batch`` interface)."""

    def __init__(self, sampler, rank: int, world_size: int):
        if sampler.batch_size % world_size:
            raise ValueError(f"the global batch of {sampler.batch_size} sequences does not split evenly over "
                             f"{world_size} ranks")
        self.sampler, self.rank, self.per_rank = sampler, rank, sampler.batch_size // world_size

    def batch(self, step: int, device):
        x, y = self.sampler.batch(step, device)
        rows = slice(self.rank * self.per_rank, (self.rank + 1) * self.per_rank)
        return x[rows], y[rows]


def _setup(run: DistRun, profile, device: torch.device):
    from .models import course_setup

    return course_setup(profile, device, steps=run.steps, default_steps=(run.steps, run.steps), seed=run.seed)


def _flat(params) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in params])


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _held_bytes(state) -> dict[str, int]:
    def nbytes(ts) -> int:
        return sum(_local(t).numel() * _local(t).element_size() for t in ts if t is not None)

    opt_state = [v for s in state.optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor) and v.dim() > 0]
    return {"parameters": nbytes(state.params), "gradients": nbytes(p.grad for p in state.params),
            "optimizer_state": nbytes(opt_state),
            "master_weights": nbytes(state.masters) if state.masters is not None else 0}


class _AfterBackward:
    """The loop's monitor slot, used to plant an inf in this rank's own gradient shard (FSDP)."""

    def __init__(self, params, step: int | None):
        self.params, self.step = params, step

    def after_backward(self, step: int, *, scale: float) -> None:
        if step == self.step:
            with torch.no_grad():
                g = next(p.grad for p in self.params if p.grad is not None)
                _local(g).view(-1)[0] = math.inf

    def after_step(self, *_args, **_kwargs) -> None:
        pass


def _plant_before_reduction(model: torch.nn.Module, step_of) -> None:
    """An inf in this rank's gradient of the first parameter, before DDP all-reduces it (a tensor hook runs
    as the gradient is produced, ahead of the reducer)."""
    first = next(p for p in model.parameters() if p.requires_grad)

    def hook(grad: torch.Tensor) -> torch.Tensor:
        if step_of():
            grad = grad.clone()
            grad.view(-1)[0] = math.inf
        return grad

    first.register_hook(hook)


def _backend_of(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def cast_compress_hook(dtype: torch.dtype):
    """A DDP communication hook that all-reduces each gradient bucket in ``dtype``: cast, divide by the
    world size, sum, cast back into the FP32 bucket. The arithmetic of torch's ``fp16_compress_hook`` and
    ``bf16_compress_hook``, written out because torch registers its BF16 hook only with NCCL 2.10+."""
    import torch.distributed as dist

    def hook(process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(group.size())   # divided first, as torch's hooks do

        def decompress(fut):
            return buffer.copy_(fut.value()[0])

        return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)

    hook.__name__ = f"cast_compress_hook_{dtype}".replace("torch.", "")
    return hook


def compress_hook(name: str, *, backend: str):
    """DDP's gradient-compression hook ``name`` (``fp16`` or ``bf16``): torch's own where it registers on
    ``backend`` (FP16 always, BF16 with NCCL), else :func:`cast_compress_hook` with the same arithmetic."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if name == "fp16":
        return default_hooks.fp16_compress_hook
    if name == "bf16":
        return default_hooks.bf16_compress_hook if backend == "nccl" else cast_compress_hook(torch.bfloat16)
    raise ValueError(f"comm hook must be one of {COMM_HOOKS}, got {name!r}")


def _make_scaler(run: DistRun, device: torch.device, recipe_wants: bool):
    kind = run.scaler if run.scaler != "auto" else ("plain" if recipe_wants else "none")
    if kind == "sharded":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type, enabled=(kind == "plain"))


def _train_rank(run: DistRun, profile, device: torch.device, rank: int, world_size: int) -> tuple[Any, Any]:
    """Train ``run`` as rank ``rank`` of ``world_size`` (world_size 1: no process group needed)."""
    from .train import History, TrainConfig, TrainState, get_recipe, train

    recipe = get_recipe(run.recipe, device)
    setup = _setup(run, profile, device)
    sampler: Any = _RankSlice(setup.sampler, rank, world_size) if world_size > 1 else setup.sampler
    model = setup.model(run.seed)
    config = TrainConfig(steps=setup.steps, lr=run.lr)
    step_counter = {"step": 0}
    plant_step = run.plant_inf[1] if run.plant_inf is not None and run.plant_inf[0] == rank else None
    monitor = None
    if run.wrapper == "ddp" and world_size > 1:
        from torch.nn.parallel import DistributedDataParallel as DDP

        model.to(device=device, dtype=recipe.param_dtype)
        if plant_step is not None:
            _plant_before_reduction(model, lambda: step_counter["step"] == plant_step)
        wrapped = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        if run.comm_hook is not None:
            wrapped.register_comm_hook(None, compress_hook(run.comm_hook, backend=_backend_of(device)))
        state = TrainState(wrapped, recipe, config, device)
    elif run.wrapper == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        model.to(device)
        policy = MixedPrecisionPolicy(param_dtype=_dtype(run.param_dtype, "param_dtype"),
                                      reduce_dtype=_dtype(run.reduce_dtype, "reduce_dtype"))
        for block in model.blocks:
            fully_shard(block, mp_policy=policy)
        fully_shard(model, mp_policy=policy)
        state = TrainState(model, recipe, config, device)
        if plant_step is not None:
            monitor = _AfterBackward(state.params, plant_step)
    else:   # "manual", or a single process
        if plant_step is not None:
            _plant_before_reduction(model, lambda: step_counter["step"] == plant_step)
        state = TrainState(model, recipe, config, device)
    state.scaler = _make_scaler(run, device, recipe.grad_scaler)
    if run.fail_rank == rank:
        raise RuntimeError(f"planted failure on rank {rank} (DistRun.fail_rank)")
    history = History(recipe.name)
    if run.wrapper == "manual" and world_size > 1:
        _train_manual(state, sampler, history, world_size, step_counter)
    else:
        while state.step < config.steps:
            step_counter["step"] = state.step
            train(state, sampler, steps=1, history=history, monitor=monitor)
    return state, history


def _train_manual(state, sampler, history, world_size: int, step_counter: dict) -> None:
    """Data parallelism written by hand, in the wrong order: each rank unscales (and so checks its own
    gradients for inf) first and all-reduces after. Its scaler decides on what it saw alone."""
    import torch.distributed as dist

    from .train import recipe_autocast, step_optimizers

    def all_reduce_mean(_opt) -> None:   # the pitfall: after the scaler has looked
        for p in state.params:
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)

    model, scaler = state.model, state.scaler
    while state.step < state.config.steps:
        step_counter["step"] = state.step
        state.optimizer.zero_grad(set_to_none=True)
        x, y = sampler.batch(state.step, state.device)
        with recipe_autocast(state.recipe, state.device):
            _, loss = model(x, y)
        scaler.scale(loss).backward()
        scale = scaler.get_scale() if scaler.is_enabled() else 1.0
        result = step_optimizers(scaler, [state.optimizer], clip_norm=state.config.clip_norm,
                                 after_unscale=all_reduce_mean)
        history.losses.append(float(loss.detach().float()))
        history.grad_norms.append(result.grad_norms[0])
        history.scales.append(scale)
        history.skipped.append(not result.ran[0])
        state.step += 1


def _final_params(state) -> torch.Tensor:
    full = []
    for p in state.params:
        full.append(p.full_tensor() if hasattr(p, "full_tensor") else p)
    masters = state.masters if state.masters is not None else full
    return _flat(masters)


def _rank_history(run: DistRun, state, history, *, rank: int, world_size: int, backend: str,
                  seconds: float) -> RankHistory:
    return RankHistory(run=run.name, rank=rank, world_size=world_size, backend=backend, device=str(state.device),
                       losses=tuple(history.losses), scales=tuple(history.scales),
                       skipped=tuple(history.skipped), grad_norms=tuple(history.grad_norms),
                       final_params=_final_params(state), held_bytes=_held_bytes(state),
                       seconds=seconds)


def single_process_run(run: DistRun, profile, device: torch.device | str = "cpu") -> RankHistory:
    """The same run in one process on the whole global batch: what a data-parallel run should match."""
    device = torch.device(device)
    if run.plant_inf is not None or run.fail_rank is not None:
        raise ValueError("a single-process reference has no ranks to plant an inf or a failure in")
    recipe, scaler = run.recipe, run.scaler
    if run.wrapper == "fsdp":
        # FSDP computes in the policy's param_dtype from FP32 shards, the optimizer updating the FP32 copy:
        # in one process that is BF16 weights with FP32 master weights
        if run.param_dtype == "bfloat16":
            recipe = "bf16_master"
        elif run.param_dtype not in (None, "float32"):
            raise ValueError(f"no single-process recipe computes like FSDP with param_dtype {run.param_dtype!r}")
        scaler = "plain" if run.scaler == "sharded" else run.scaler
    start = time.perf_counter()
    solo = DistRun(**{**asdict(run), "recipe": recipe, "wrapper": "manual", "comm_hook": None,
                      "param_dtype": None, "reduce_dtype": None, "scaler": scaler})
    state, history = _train_rank(solo, profile, device, 0, 1)
    return _rank_history(run, state, history, rank=0, world_size=1, backend="none",
                         seconds=time.perf_counter() - start)


# ---- the worker (torchrun or launch_local) ----------------------------------------------------------

def _choose_backend(requested: str, local_world_size: int) -> str:
    if requested not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {requested!r}")
    if requested != "auto":
        return requested
    every_rank_has_a_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size
    return "nccl" if every_rank_has_a_gpu else "gloo"


def _worker(runs: list[DistRun], *, size: str, backend: str, out: Path | None, max_steps: int | None,
            reduce_check: bool = False) -> int:
    """The body of one rank: join the group, train every run, write one JSON (and one .pt) per run."""
    from datetime import timedelta

    import torch.distributed as dist

    from .device import SizeProfile

    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = _choose_backend(backend, local_world)
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))  # ranks share the machine's cores
    timeout = max((r.collective_timeout_s for r in runs), default=DistRun("x").collective_timeout_s)
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    profile = SizeProfile(size, forced=True, max_steps=max_steps)
    try:
        for run in runs:
            run.check_world_size(world_size)
            start = time.perf_counter()
            state, history = _train_rank(run, profile, device, rank, world_size)
            record = _rank_history(run, state, history, rank=rank, world_size=world_size, backend=backend,
                                   seconds=time.perf_counter() - start)
            if out is not None:
                _save_rank_history(record, out)
            if rank == 0:
                print(_summary_line(record), flush=True)
            dist.barrier()
        if reduce_check and out is not None:
            _reduce_check(rank, world_size, out)
    finally:
        dist.destroy_process_group()
    return 0


REDUCE_CHECK_VALUES = 4096
REDUCE_CHECK_DTYPES = ("bfloat16", "float16")


def reduce_check_inputs(world_size: int, n: int = REDUCE_CHECK_VALUES, seed: int = 0) -> torch.Tensor:
    """``[world_size, n]`` FP32 values, one row per rank, magnitudes spread over about 2^-12..2^6 with both
    signs: the inputs of the all-reduce check (within FP16's normal range, so no rank's input flushes)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(world_size, n, generator=gen) * torch.exp2(torch.randint(-12, 6, (world_size, n),
                                                                               generator=gen).float())


def _reduce_check(rank: int, world_size: int, out: Path) -> None:
    import torch.distributed as dist

    inputs = reduce_check_inputs(world_size)
    for name in REDUCE_CHECK_DTYPES:
        t = inputs[rank].to(_DTYPES[name])
        dist.all_reduce(t)
        if rank == 0:
            torch.save(t, out / f"all_reduce.{name}.pt")


def _summary_line(h: RankHistory) -> str:
    skipped = [i for i, s in enumerate(h.skipped) if s]
    return (f"[{h.run}] rank 0 of {h.world_size} ({h.backend}, {h.device}): {len(h.losses)} steps, "
            f"loss {h.losses[0]:.4f} -> {h.losses[-1]:.4f}, skipped {skipped or 'none'}, {h.seconds:.1f} s")


def _save_rank_history(h: RankHistory, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in asdict(h).items() if k != "final_params"}
    torch.save(h.final_params, out / f"{h.run}.rank{h.rank}.pt")
    (out / f"{h.run}.rank{h.rank}.json").write_text(json.dumps(meta))


def _load_rank_history(out: Path, run: str, rank: int) -> RankHistory:
    meta = json.loads((out / f"{run}.rank{rank}.json").read_text())
    params = torch.load(out / f"{run}.rank{rank}.pt", weights_only=True)
    for key in ("losses", "scales", "skipped", "grad_norms"):
        meta[key] = tuple(meta[key])
    return RankHistory(final_params=params, **meta)


# ---- the local launcher --------------------------------------------------------------------------------

class DistributedRunError(RuntimeError):
    """A rank failed (its error is in the message) or the launch ran past its timeout."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def launch_local(runs, *, world_size: int = 2, size: str = "small", backend: str = "auto",
                 timeout_s: float = DEFAULT_TIMEOUT_S, max_steps: int | None = None,
                 reduce_check: bool = False) -> DistributedResult:
    """Start ``world_size`` local processes running ``python -m course_lib.distributed`` with torchrun's
    environment (env:// rendezvous on 127.0.0.1), train every run in ``runs`` in them, and return each rank's
    history. Any rank that fails ends the launch with :class:`DistributedRunError` carrying its error; the
    other ranks are given a few seconds to exit and are then killed, as is everything at ``timeout_s``.
    ``reduce_check``: after the runs, all-reduce :func:`reduce_check_inputs` in BF16 and FP16 and keep the
    results (see :meth:`DistributedResult.all_reduce_mismatches`); ``runs`` may then be empty."""
    runs = [runs] if isinstance(runs, DistRun) else list(runs)
    if (not runs and not reduce_check) or not all(isinstance(r, DistRun) for r in runs):
        raise TypeError("runs must be a DistRun or a non-empty sequence of DistRun")
    if len({r.name for r in runs}) != len(runs):
        raise ValueError("every run in one launch needs its own name")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
        raise ValueError(f"world_size must be an int of at least 2 (a data-parallel run), got {world_size!r}")
    if size not in ("small", "full"):
        raise ValueError(f"size must be 'small' or 'full', got {size!r}")
    if not (timeout_s > 0 and math.isfinite(timeout_s)):
        raise ValueError(f"timeout_s must be positive, got {timeout_s}")
    for r in runs:
        r.check_world_size(world_size)
    chosen = _choose_backend(backend, world_size)
    if runs:
        from .device import SizeProfile

        batch = _setup(runs[0], SizeProfile(size), torch.device("cpu")).sampler.batch_size
        if batch % world_size:
            raise ValueError(f"the global batch of {batch} sequences does not split evenly over {world_size} ranks")
    with tempfile.TemporaryDirectory(prefix="course_dist_") as tmp:
        out = Path(tmp)
        plan = out / "plan.json"
        plan.write_text(json.dumps([asdict(r) for r in runs]))
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()),
               "WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size)}
        args = [sys.executable, "-m", "course_lib.distributed", "--plan", str(plan), "--out", str(out),
                "--size", size, "--backend", chosen]
        if max_steps is not None:
            args += ["--max-steps", str(max_steps)]
        if reduce_check:
            args += ["--reduce-check"]
        start = time.perf_counter()
        procs, logs = [], []
        for rank in range(world_size):
            log = open(out / f"rank{rank}.log", "w+")
            logs.append(log)
            procs.append(subprocess.Popen(args, env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                          stdout=log, stderr=subprocess.STDOUT))
        try:
            failed = _wait(procs, start, timeout_s)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()
        if failed is not None:
            rank, code = failed
            text = (out / f"rank{rank}.log").read_text(errors="replace").strip().splitlines()
            plain = [line.split("]: ", 1)[1] if line.startswith("[rank") and "]: " in line else line
                     for line in text]
            errors = [line for line in plain if line and not line[0].isspace() and "Error: " in line]
            what = "ran past the launch timeout" if code is None else f"exited with status {code}"
            headline = f": {errors[-1]}" if errors else ""
            tail = "\n".join(plain[-15:])
            raise DistributedRunError(f"rank {rank} of {world_size} {what}{headline}\nits last output:\n{tail}")
        collected = {r.name: tuple(_load_rank_history(out, r.name, k) for k in range(world_size)) for r in runs}
        reduced = {name: torch.load(out / f"all_reduce.{name}.pt", weights_only=True)
                   for name in (REDUCE_CHECK_DTYPES if reduce_check else ())}
        return DistributedResult(world_size, chosen, collected, time.perf_counter() - start, reduced)


def _wait(procs, start: float, timeout_s: float, grace_s: float = 5.0) -> tuple[int, int | None] | None:
    """Wait for every process; the first rank that fails (rank, exit status), or (rank, None) on timeout."""
    first_failure: tuple[int, int | None] | None = None
    failed_at = None
    while True:
        codes = [p.poll() for p in procs]
        for rank, code in enumerate(codes):
            if code not in (None, 0) and first_failure is None:
                first_failure, failed_at = (rank, code), time.perf_counter()
        if all(c is not None for c in codes):
            return first_failure
        now = time.perf_counter()
        if failed_at is not None and now - failed_at > grace_s:
            return first_failure       # the others are stuck on the dead rank: the caller kills them
        if now - start > timeout_s:
            return first_failure or (next(i for i, c in enumerate(codes) if c is None), None)
        time.sleep(0.05)


# ---- reduction precision, simulated ---------------------------------------------------------------------

def simulate_all_reduce(values: torch.Tensor, dtype: torch.dtype, order: str = "ring") -> torch.Tensor:
    """The sum over ranks of ``values`` (shape ``[ranks, n]``) as an all-reduce computes it in ``dtype``:
    every partial sum rounded to ``dtype``.

    ``ring``: a ring reduce-scatter: the vector is cut into one chunk per rank, and chunk ``c`` is summed
    one rank after another, ranks ``c-1, c-2, ..., c`` (mod N), as gloo's ring does (checked bit for bit).
    ``tree``: ranks summed in pairs, then pairs of pairs (log2 N additions deep).
    """
    if not isinstance(values, torch.Tensor) or values.dim() != 2 or values.shape[0] < 1:
        raise ValueError("values must be a [ranks, n] tensor with at least one rank")
    if order not in REDUCE_ORDERS:
        raise ValueError(f"order must be one of {REDUCE_ORDERS}, got {order!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    v = values.to(dtype)
    n_ranks = v.shape[0]
    if order == "tree":
        parts = list(v)
        while len(parts) > 1:
            parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        return parts[0]
    chunk = -(-v.shape[1] // n_ranks)      # gloo's chunks: ceil(n / N) values, the last one shorter
    chunk_of = torch.arange(v.shape[1]) // chunk
    acc = None
    for k in range(n_ranks):   # the k-th addend of every value: chunk c adds ranks c-1, c-2, ..., c
        addend = v.gather(0, ((chunk_of - 1 - k) % n_ranks)[None, :])[0]
        acc = addend if acc is None else acc + addend
    assert acc is not None
    return acc


@dataclass(frozen=True)
class ReductionStudy:
    """How far the data-parallel mean gradient lands from the exact (FP64) mean, per world size.

    ``errors[label]``: the relative L2 error of the whole gradient (what plain SGD sees); ``off_share[label]``:
    the share of the exact mean's non-zero entries that came out off by more than ``tolerance`` of their
    own size (what Adam, which scales each entry by its own history, sees). Tuples align with
    ``world_sizes``. ``floor`` / ``floor_off_share``: the exact mean rounded once to BF16, which no BF16
    reduction can beat. Each rank's gradient comes from ``per_rank_sequences`` sequences of its own.
    """

    world_sizes: tuple[int, ...]
    errors: dict[str, tuple[float, ...]]
    off_share: dict[str, tuple[float, ...]]
    floor: tuple[float, ...]
    floor_off_share: tuple[float, ...]
    tolerance: float
    n_values: int
    per_rank_sequences: int
    median_abs_gradient: float

    def at(self, label: str, world_size: int) -> tuple[float, float]:
        """``(relative L2 error, share off by more than the tolerance)`` of ``label`` at ``world_size``."""
        if label not in self.errors:
            raise ValueError(f"no variant {label!r}; known: {', '.join(self.errors)}")
        if world_size not in self.world_sizes:
            raise ValueError(f"world size {world_size} was not run; ran {self.world_sizes}")
        i = self.world_sizes.index(world_size)
        return self.errors[label][i], self.off_share[label][i]


# label: (dtype of the reduction, order, what is divided before the sum: "N", "sqrtN" (FSDP2) or "none")
REDUCTION_VARIANTS = {
    "FP32, ring": (torch.float32, "ring", "none"),
    "BF16, ring": (torch.bfloat16, "ring", "none"),
    "BF16, tree": (torch.bfloat16, "tree", "none"),
    "FP16, ring, /N first (DDP hook)": (torch.float16, "ring", "N"),
    "FP16, ring, /~sqrt(N) first (FSDP2)": (torch.float16, "ring", "sqrtN"),
}


def fsdp2_predivide(n: int) -> int:
    """The power of two FSDP2 divides an FP16 gradient by before reducing over ``n`` ranks (the rest of
    ``n`` is divided after): about sqrt(n), so neither the sum overflows nor the parts underflow."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    pre = 1
    while n % pre == 0 and n / pre > pre:
        pre *= 2
    return pre


def per_rank_gradients(profile, device: torch.device | str, n_ranks: int, *, seed: int = 0,
                       sequences: int = 2) -> torch.Tensor:
    """``[n_ranks, n_params]`` FP32 gradients of the course model at its initialisation, each rank's from
    its own ``sequences`` sequences (distinct batches), as the ranks of a data-parallel step hold them."""
    from .models import course_setup

    for name, value in (("n_ranks", n_ranks), ("sequences", sequences)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    setup = course_setup(profile, device, steps=0, default_steps=(0, 0), seed=seed)
    if sequences > setup.sampler.batch_size:
        raise ValueError(f"sequences must be at most the batch size {setup.sampler.batch_size}, got {sequences}")
    model = setup.model(seed)
    grads = []
    for r in range(n_ranks):
        x, y = setup.sampler.batch(r, setup.device)
        model.zero_grad(set_to_none=True)
        model(x[:sequences], y[:sequences])[1].backward()
        grads.append(_flat(p.grad for p in model.parameters()))
    return torch.stack(grads)


def reduce_mean(grads: torch.Tensor, variant: str) -> torch.Tensor:
    """The mean over ranks of ``grads`` (``[ranks, n]``) as the reduction ``variant`` (a key of
    :data:`REDUCTION_VARIANTS`) computes it, returned in FP64 for comparison."""
    if variant not in REDUCTION_VARIANTS:
        raise ValueError(f"unknown reduction {variant!r}; known: {', '.join(REDUCTION_VARIANTS)}")
    dtype, order, divide = REDUCTION_VARIANTS[variant]
    n = grads.shape[0]
    pre = {"none": 1, "N": n, "sqrtN": fsdp2_predivide(n)}[divide]
    return simulate_all_reduce((grads.double() / pre).float(), dtype, order).double() / (n / pre)


def reduction_precision_study(profile, device: torch.device | str = "cpu", *,
                              world_sizes=(2, 4, 8, 16, 32, 64, 128), seed: int = 0, sequences: int = 2,
                              tolerance: float = 0.01) -> ReductionStudy:
    """The mean of N ranks' real gradients reduced as each of :data:`REDUCTION_VARIANTS` does, against FP64."""
    world_sizes = tuple(world_sizes)
    if not world_sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in world_sizes):
        raise ValueError(f"world_sizes must be ints of at least 2, got {world_sizes!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be between 0 and 1, got {tolerance}")
    grads = per_rank_gradients(profile, device, max(world_sizes), seed=seed, sequences=sequences).cpu()

    def measure(got: torch.Tensor, exact: torch.Tensor) -> tuple[float, float]:
        nonzero = exact != 0
        rel = (got - exact).abs()[nonzero] / exact.abs()[nonzero]
        return float((got - exact).norm() / exact.norm()), float((rel > tolerance).double().mean())

    errors: dict[str, list[float]] = {k: [] for k in REDUCTION_VARIANTS}
    off: dict[str, list[float]] = {k: [] for k in REDUCTION_VARIANTS}
    floor, floor_off = [], []
    for n in world_sizes:
        exact = grads[:n].double().mean(0)
        e, o = measure(exact.to(torch.bfloat16).double(), exact)
        floor.append(e)
        floor_off.append(o)
        for label in REDUCTION_VARIANTS:
            e, o = measure(reduce_mean(grads[:n], label), exact)
            errors[label].append(e)
            off[label].append(o)
    return ReductionStudy(world_sizes, {k: tuple(v) for k, v in errors.items()},
                          {k: tuple(v) for k, v in off.items()}, tuple(floor), tuple(floor_off), tolerance,
                          int(grads.shape[1]), sequences, float(grads.abs().median()))


# ---- the lesson's study: every run of lesson 10 in one launch ---------------------------------------------

PARITY_RECIPES = ("fp32", "bf16_autocast", "fp16_autocast_scaler")
# the scaler cases: (wrapper, scaler); each plants an inf in rank 1's gradient at PLANT_STEP
SCALER_CASES = {
    "DDP, GradScaler per rank": ("ddp", "auto"),
    "by hand, unscale before the all-reduce": ("manual", "plain"),
    "by hand, unscale before, ShardedGradScaler": ("manual", "sharded"),
    "FSDP2 (FP16 compute), plain GradScaler": ("fsdp", "plain"),
    "FSDP2 (FP16 compute), ShardedGradScaler": ("fsdp", "sharded"),
}
FSDP_POLICIES = {
    "FSDP2, FP32 (no policy)": (None, None),
    "FSDP2, BF16 params, FP32 reduce": ("bfloat16", "float32"),
    "FSDP2, BF16 params, BF16 reduce": ("bfloat16", "bfloat16"),
}
HOOKS = {"DDP FP32, FP32 all-reduce": None, "DDP FP32, FP16 hook": "fp16", "DDP FP32, BF16 hook": "bf16"}
PLANT_RANK = 1


def _run_name(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label.lower()).strip("_")


def lesson_runs(steps: int, *, plant_step: int) -> dict[str, DistRun]:
    """Every data-parallel run of lesson 10, by label (see :func:`data_parallel_study`)."""
    runs: dict[str, DistRun] = {}
    for recipe in PARITY_RECIPES:
        runs[f"DDP {recipe}"] = DistRun(_run_name(f"ddp {recipe}"), recipe=recipe, steps=steps)
    for label, (wrapper, scaler) in SCALER_CASES.items():
        extra: dict[str, Any] = ({"param_dtype": "float16", "recipe": "fp32"} if wrapper == "fsdp"
                                 else {"recipe": "fp16_autocast_scaler"})
        runs[label] = DistRun(_run_name(label), wrapper=wrapper, scaler=scaler, steps=steps,
                              plant_inf=(PLANT_RANK, plant_step), **extra)
    for label, (param, reduce) in FSDP_POLICIES.items():
        runs[label] = DistRun(_run_name(label), recipe="fp32", wrapper="fsdp", param_dtype=param,
                              reduce_dtype=reduce, steps=steps)
    for label, hook in HOOKS.items():
        if hook is not None:
            runs[label] = DistRun(_run_name(label), recipe="fp32", comm_hook=hook, steps=steps)
    return runs


@dataclass(frozen=True)
class ScalerCase:
    """One planted-inf run: per rank, the steps it skipped and its loss scale per step; whether the
    replicas (DDP, by hand) still agree, and whether every rank's weights are finite."""

    skipped: dict[int, tuple[int, ...]]
    scales: dict[int, tuple[float, ...]]
    replicas_agree: bool | None        # None under FSDP, where each rank holds other parameters
    weights_finite: dict[int, bool]
    non_finite_weights: dict[int, int] = field(default_factory=dict)   # how many, per rank
    final_losses: dict[int, float] = field(default_factory=dict)       # each rank's loss at the last step


@dataclass(frozen=True)
class DataParallelStudy:
    """What lesson 10 shows, from one launch of ``world_size`` processes plus single-process references.

    ``parity[recipe]``: ``(largest |loss gap| at any step, largest |weight gap|)`` between the data-parallel
    run and the same run in one process; ``curves[recipe]``: ``(data-parallel losses, single losses)``.
    ``eval_losses[label]``: final weights evaluated in FP32 on held-out batches (FSDP policies, DDP hooks,
    and the FP32 DDP run as ``"DDP fp32"``). ``held_bytes[label]``: rank 0's bytes of parameters,
    gradients and optimizer state. ``all_reduce_mismatches``: the real all-reduce against the simulation.
    """

    world_size: int
    backend: str
    device: str
    size: str
    steps: int
    plant_step: int
    n_params: int
    parity: dict[str, tuple[float, float]]
    curves: dict[str, tuple[tuple[float, ...], tuple[float, ...]]]
    scaler_cases: dict[str, ScalerCase]
    eval_losses: dict[str, float]
    held_bytes: dict[str, dict[str, int]]
    hook_weight_gaps: dict[str, float]
    all_reduce_mismatches: dict[str, int]
    seconds: float


def fp32_eval_of(flat_params: torch.Tensor, profile, *, seed: int = 0, batches: int = 4) -> float:
    """The course model with the FP32 weights ``flat_params`` (as :class:`RankHistory` keeps them),
    evaluated in FP32 on ``batches`` held-out (validation split) batches."""
    from .data import BatchSampler
    from .models import course_setup

    setup = course_setup(profile, "cpu", steps=0, default_steps=(0, 0), seed=seed)
    model = setup.model(seed)
    params = list(model.parameters())
    if flat_params.numel() != sum(p.numel() for p in params):
        raise ValueError(f"{flat_params.numel()} values do not fit the course model's "
                         f"{sum(p.numel() for p in params)} parameters")
    torch.nn.utils.vector_to_parameters(flat_params.float(), params)
    val = BatchSampler(setup.sampler.corpus, setup.sampler.batch_size, setup.config.context, seed=seed,
                       split="val")
    with torch.no_grad():
        losses = [float(model(*val.batch(i))[1]) for i in range(batches)]
    return sum(losses) / len(losses)


def data_parallel_study(profile, device: torch.device | str = "cpu", *, world_size: int = 2,
                        steps: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> DataParallelStudy:
    """Lesson 10's runs: DDP against one process for three recipes, the scaler with an inf planted on one
    rank (DDP, by hand in the wrong order, FSDP2), FSDP2's mixed precision policies, DDP's compression
    hooks, and the real all-reduce against :func:`simulate_all_reduce`; all in one launch of
    ``world_size`` local processes (NCCL on GPUs when every rank has one, else gloo on the CPU)."""
    from .device import SizeProfile

    if not isinstance(profile, SizeProfile):
        raise TypeError(f"profile must be a SizeProfile, got {type(profile).__name__}")
    backend = _choose_backend("auto", world_size)
    if backend == "gloo":
        # processes on the CPU (no GPU per rank): the small size whatever the profile, and the references
        # on the CPU too, so that they compute like the ranks
        profile = SizeProfile("small", forced=profile.forced, max_steps=profile.max_steps)
        device = "cpu"
    steps = profile.pick(small=8, full=200) if steps is None else steps
    if profile.max_steps is not None:
        steps = min(steps, profile.max_steps)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 2:
        raise ValueError(f"steps must be an int of at least 2 (an inf is planted at step steps // 2), got {steps!r}")
    plant_step = steps // 2
    runs = lesson_runs(steps, plant_step=plant_step)
    result = launch_local(list(runs.values()), world_size=world_size, size=profile.name, backend=backend,
                          timeout_s=timeout_s, reduce_check=True)
    device = torch.device(device)
    parity, curves = {}, {}
    for recipe in PARITY_RECIPES:
        run = runs[f"DDP {recipe}"]
        single = single_process_run(run, profile, device)
        dp = result.mean_losses(run.name)
        curves[recipe] = (dp, single.losses)
        parity[recipe] = (max(abs(a - b) for a, b in zip(dp, single.losses)),
                          float((result.ranks(run.name)[0].final_params - single.final_params).abs().max()))
    cases = {}
    for label in SCALER_CASES:
        hs = result.ranks(runs[label].name)
        wrapper = runs[label].wrapper
        gap = result.param_gap_between_ranks(runs[label].name)
        cases[label] = ScalerCase(
            skipped=result.skipped_steps(runs[label].name), scales={h.rank: h.scales for h in hs},
            replicas_agree=None if wrapper == "fsdp" else gap == 0.0,
            weights_finite={h.rank: bool(torch.isfinite(h.final_params).all()) for h in hs},
            non_finite_weights={h.rank: int((~torch.isfinite(h.final_params)).sum()) for h in hs},
            final_losses={h.rank: h.losses[-1] for h in hs})
    evals, held, hook_gaps = {}, {}, {}
    ddp_fp32 = result.ranks(runs["DDP fp32"].name)[0]
    for label in ("DDP fp32", *FSDP_POLICIES, *[k for k, v in HOOKS.items() if v is not None]):
        h = ddp_fp32 if label in ("DDP fp32", "DDP FP32, FP32 all-reduce") else result.ranks(runs[label].name)[0]
        evals[label] = fp32_eval_of(h.final_params, profile)
        held[label] = h.held_bytes
        if label in HOOKS:
            hook_gaps[label] = float((h.final_params - ddp_fp32.final_params).abs().max())
    return DataParallelStudy(world_size=world_size, backend=result.backend,
                             device=result.ranks(runs["DDP fp32"].name)[0].device, size=profile.name, steps=steps,
                             plant_step=plant_step, n_params=int(ddp_fp32.final_params.numel()),
                             parity=parity, curves=curves, scaler_cases=cases, eval_losses=evals, held_bytes=held,
                             hook_weight_gaps=hook_gaps, all_reduce_mismatches=result.all_reduce_mismatches(),
                             seconds=result.seconds)


# ---- the command line (torchrun) --------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="torchrun --nproc-per-node N -m course_lib.distributed",
        description="Train the course model data-parallel with a precision recipe (one process per rank).")
    p.add_argument("--recipe", default="bf16_autocast", help="a course_lib.train recipe (default bf16_autocast)")
    p.add_argument("--wrapper", choices=WRAPPERS, default="ddp", help="ddp (default), fsdp or manual")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--comm-hook", choices=COMM_HOOKS, default=None, help="DDP gradient compression")
    p.add_argument("--param-dtype", choices=tuple(_DTYPES), default=None, help="FSDP policy's param_dtype")
    p.add_argument("--reduce-dtype", choices=tuple(_DTYPES), default=None, help="FSDP policy's reduce_dtype")
    p.add_argument("--scaler", choices=SCALERS, default="auto")
    p.add_argument("--size", choices=("small", "full"), default=None,
                   help="size profile (default: full on GPUs, small on the CPU)")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto",
                   help="auto: NCCL when every local rank has a GPU, else gloo on the CPU")
    p.add_argument("--out", type=Path, default=None, help="folder for each rank's history (JSON + .pt)")
    p.add_argument("--max-steps", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--plan", type=Path, default=None, help=argparse.SUPPRESS)   # launch_local's runs
    p.add_argument("--reduce-check", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        print("course_lib.distributed runs as one rank of a group: start it with torchrun "
              "(torchrun --nproc-per-node 2 -m course_lib.distributed ...), or call launch_local() from Python",
              file=sys.stderr)
        return 2
    try:
        if args.plan is not None:
            runs = [DistRun(**{**d, "plant_inf": tuple(d["plant_inf"]) if d["plant_inf"] else None})
                    for d in json.loads(args.plan.read_text())]
        else:
            runs = [DistRun("cli", recipe=args.recipe, wrapper=args.wrapper, steps=args.steps, seed=args.seed,
                            lr=args.lr, comm_hook=args.comm_hook, param_dtype=args.param_dtype,
                            reduce_dtype=args.reduce_dtype, scaler=args.scaler)]
    except ValueError as exc:
        print(f"course_lib.distributed: {exc}", file=sys.stderr)
        return 2
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ["WORLD_SIZE"]))
    size = args.size or ("full" if _choose_backend(args.backend, local_world) == "nccl" else "small")
    return _worker(runs, size=size, backend=args.backend, out=args.out, max_steps=args.max_steps,
                   reduce_check=args.reduce_check)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["DistRun", "RankHistory", "DistributedResult", "DistributedRunError", "launch_local",
           "single_process_run", "simulate_all_reduce", "reduction_precision_study", "per_rank_gradients",
           "ReductionStudy", "REDUCTION_VARIANTS", "reduce_mean", "fsdp2_predivide", "reduce_check_inputs",
           "cast_compress_hook", "compress_hook", "data_parallel_study", "DataParallelStudy", "ScalerCase",
           "lesson_runs", "fp32_eval_of"]
