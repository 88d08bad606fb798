"""One rank of a data-parallel run: the course's training loop under DDP, FSDP2 or a hand-written all-reduce,
with its scaler, and the history each rank reports back."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..device import SizeProfile
from ..models import course_setup
from ..train import History, TrainConfig, TrainState, get_recipe, recipe_autocast, step_optimizers, train
from .reduce import (
    COMM_HOOKS,
    REDUCE_CHECK_DTYPES,
    REDUCE_CHECK_VALUES,
    compress_hook,
    reduce_check_inputs,
    reduce_check_plan,
    simulate_all_reduce,
)
from .traffic import count_collective_bytes

WRAPPERS = ("ddp", "fsdp", "manual")


SCALERS = ("auto", "plain", "sharded", "none")


DTYPES_BY_NAME = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


DEFAULT_TIMEOUT_S = 180.0   # the whole launch; collectives time out sooner (see DistRun.collective_timeout_s)


def _dtype(name: str | None, what: str) -> torch.dtype | None:
    if name is None:
        return None
    if name not in DTYPES_BY_NAME:
        raise ValueError(f"{what} must be one of {', '.join(DTYPES_BY_NAME)} (or None), got {name!r}")
    return DTYPES_BY_NAME[name]


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
    ``hang_rank``: that rank stops at its first step and waits there until it is killed, so the others wait
    for it in their first collective (to test that a hang is reported with the rank that held it up).

    A recipe that autocasts and an FSDP ``param_dtype`` both set the compute dtype, so they must agree: a
    BF16 autocast recipe takes ``param_dtype`` BF16 or FP32, an FP16 one FP16 or FP32.
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
    hang_rank: int | None = None
    collective_timeout_s: float = 60.0

    def __post_init__(self) -> None:
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
        autocast = get_recipe(self.recipe).autocast_dtype
        if autocast is not None and _dtype(self.param_dtype, "param_dtype") not in (None, torch.float32, autocast):
            name = str(autocast).replace("torch.", "")
            raise ValueError(
                f"recipe {self.recipe!r} autocasts to {name} but FSDP's param_dtype is {self.param_dtype!r}: both "
                f"set the compute dtype and they disagree (autocast would recast the {self.param_dtype} parameters "
                f"to {name} for every matrix product, and torch's CPU layer_norm refuses the mix outright); use "
                f"param_dtype {name!r} or 'float32' (or none) with this recipe, or recipe 'fp32' with param_dtype "
                f"{self.param_dtype!r}")
        if self.scaler not in SCALERS:
            raise ValueError(f"scaler must be one of {SCALERS}, got {self.scaler!r}")
        if self.plant_inf is not None:
            if (len(self.plant_inf) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v < 0
                                                for v in self.plant_inf)):
                raise ValueError(f"plant_inf must be (rank, step) with non-negative ints, got {self.plant_inf!r}")
            object.__setattr__(self, "plant_inf", tuple(self.plant_inf))
        for key in ("fail_rank", "hang_rank"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ValueError(f"{key} must be None or a non-negative int, got {value!r}")
        if not (self.collective_timeout_s > 0 and math.isfinite(self.collective_timeout_s)):
            raise ValueError(f"collective_timeout_s must be positive, got {self.collective_timeout_s}")

    def check_world_size(self, world_size: int) -> None:
        for what, pair in (("plant_inf", self.plant_inf), ("fail_rank", (self.fail_rank, 0)),
                           ("hang_rank", (self.hang_rank, 0))):
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
    # bytes its all-gathers and reduce-scatters carried over the whole run (FSDP2; zero where DDP's C++ reducer
    # or a hand-written all_reduce communicates), counted by :func:`count_collective_bytes`
    collective_bytes: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DistributedResult:
    """Every rank's :class:`RankHistory` per run, in rank order. ``all_reduced``: per dtype, the real
    all-reduce's outputs of the check, one after another in the order of :func:`reduce_check_plan` over
    ``reduce_check_sizes``."""

    world_size: int
    backend: str
    runs: dict[str, tuple[RankHistory, ...]]
    seconds: float
    all_reduced: dict[str, torch.Tensor] = field(default_factory=dict)
    reduce_check_sizes: tuple[int, ...] = (REDUCE_CHECK_VALUES,)

    def all_reduce_mismatches_by_case(self) -> dict[tuple[str, int, int], int]:
        """Per ``(dtype, ranks, n)``, how many of the real all-reduce's outputs differ from
        :func:`simulate_all_reduce`'s ring order on the same inputs (:func:`reduce_check_inputs`)."""
        counts: dict[tuple[str, int, int], int] = {}
        for name, real in self.all_reduced.items():
            offset = 0
            for ranks, n in reduce_check_plan(self.world_size, self.reduce_check_sizes):
                simulated = simulate_all_reduce(reduce_check_inputs(ranks, n), DTYPES_BY_NAME[name], "ring")
                counts[(name, ranks, n)] = int((simulated != real[offset:offset + n]).sum())
                offset += n
            if offset != real.numel():
                raise ValueError(f"the {name} all-reduce check holds {real.numel()} values, its plan {offset}")
        return counts

    def all_reduce_mismatches(self) -> dict[str, int]:
        """Per dtype, how many of the real all-reduce's outputs differ from :func:`simulate_all_reduce`'s
        ring order on the same inputs, over every case of the check: 0 means bit for bit."""
        totals = dict.fromkeys(self.all_reduced, 0)
        for (name, _, _), count in self.all_reduce_mismatches_by_case().items():
            totals[name] += count
        return totals

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


class ProgressMarks:
    """Where one rank is: numbered marks at points every rank passes in the same order (joining the group,
    each run's set-up and steps, the barriers), the latest written to :func:`progress_path` when ``out`` is
    given. Two ranks with the same number are at the same point; when a launch hangs, a running rank with a
    lower number than the others had not reached the collective they wait in."""

    def __init__(self, out: Path | None, rank: int):
        self.path = None if out is None else progress_path(out, rank)
        self.index = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def __call__(self, where: str) -> None:
        self.index += 1
        if self.path is not None:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps({"index": self.index, "where": where}))
            tmp.replace(self.path)      # atomic: the launcher never reads half a mark


def progress_path(out: Path, rank: int) -> Path:
    return Path(out) / f"rank{rank}.progress"


def load_progress(out: Path, rank: int) -> tuple[int, str] | None:
    """Rank ``rank``'s latest :class:`ProgressMarks` mark in ``out``: (number, where), or None before its first."""
    path = progress_path(out, rank)
    if not path.exists():
        return None
    mark = json.loads(path.read_text())
    return int(mark["index"]), str(mark["where"])


def setup_for_run(run: DistRun, profile, device: torch.device):
    return course_setup(profile, device, steps=run.steps, default_steps=(run.steps, run.steps), seed=run.seed)


def flatten_params(params) -> torch.Tensor:
    return torch.cat([p.detach().float().reshape(-1).cpu() for p in params])


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _held_bytes(state) -> dict[str, int]:
    def nbytes(ts) -> int:
        return sum(_local(t).numel() * _local(t).element_size() for t in ts if t is not None)

    opt_state = [v for s in state.optimizer.state.values() for v in s.values()
                 if isinstance(v, torch.Tensor) and v.dim() > 0]
    masters = state.masters if state.masters is not None else []
    # bf16_master keeps an FP32 gradient on each master beside the BF16 one (memory.bytes_per_parameter
    # counts it under gradients too)
    return {"parameters": nbytes(state.params),
            "gradients": nbytes(p.grad for p in state.params) + nbytes(m.grad for m in masters),
            "optimizer_state": nbytes(opt_state), "master_weights": nbytes(masters)}


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


def _make_scaler(run: DistRun, device: torch.device, recipe_wants: bool):
    kind = run.scaler if run.scaler != "auto" else ("plain" if recipe_wants else "none")
    if kind == "sharded":
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type, enabled=(kind == "plain"))


class _SlicesInTurn:
    """Each global batch of ``sampler`` as ``parts`` micro-batches, the ranks' slices in rank order:
    micro-batch ``i`` is slice ``i % parts`` of global batch ``i // parts`` (the ``batch`` interface that
    :func:`course_lib.train.train` reads with ``accumulation_steps=parts``)."""

    def __init__(self, sampler, parts: int):
        self.slices = [_RankSlice(sampler, r, parts) for r in range(parts)]

    def batch(self, step: int, device):
        return self.slices[step % len(self.slices)].batch(step // len(self.slices), device)


def _train_rank(run: DistRun, profile, device: torch.device, rank: int, world_size: int,
                progress=None, micro_batches: int = 1, traffic: dict | None = None) -> tuple[Any, Any]:
    """Train ``run`` as rank ``rank`` of ``world_size`` (world_size 1: no process group needed); ``progress``
    (a :class:`ProgressMarks`) is told each step as it starts. ``micro_batches`` (one process only): each
    global batch cut into that many slices, as that many ranks would cut it, their gradients accumulated.
    ``traffic`` (a dict) receives the bytes of the steps' all-gathers and reduce-scatters."""
    progress = progress or (lambda where: None)
    recipe = get_recipe(run.recipe, device)
    setup = setup_for_run(run, profile, device)
    sampler: Any = _RankSlice(setup.sampler, rank, world_size) if world_size > 1 else setup.sampler
    if micro_batches > 1:
        sampler = _SlicesInTurn(setup.sampler, micro_batches)
    model = setup.model(run.seed)
    config = TrainConfig(steps=setup.steps, lr=run.lr, accumulation_steps=micro_batches)
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
        model.to(device)
        shard_with_policy(model, param_dtype=_dtype(run.param_dtype, "param_dtype"),
                          reduce_dtype=_dtype(run.reduce_dtype, "reduce_dtype"))
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
    while run.hang_rank == rank:   # planted hang (DistRun.hang_rank): the launcher's timeout ends it
        time.sleep(0.5)
    history = History(recipe.name)
    if run.wrapper == "manual" and world_size > 1:
        _train_manual(state, sampler, history, world_size, step_counter, lambda: progress(f"run {run.name}: "
                                                                                          f"step {state.step}"))
    else:
        with count_collective_bytes() as counted:
            while state.step < config.steps:
                step_counter["step"] = state.step
                progress(f"run {run.name}: step {state.step}")
                train(state, sampler, steps=1, history=history, monitor=monitor)
        if traffic is not None:
            traffic.update(counted)
    return state, history


def _train_manual(state, sampler, history, world_size: int, step_counter: dict, mark_step) -> None:
    """Data parallelism written by hand, in the wrong order: each rank unscales (and so checks its own
    gradients for inf) first and all-reduces after. Its scaler decides on what it saw alone."""
    import torch.distributed as dist


    def all_reduce_mean(_opt) -> None:   # the pitfall: after the scaler has looked
        for p in state.params:
            dist.all_reduce(p.grad)
            p.grad.div_(world_size)

    model, scaler = state.model, state.scaler
    while state.step < state.config.steps:
        step_counter["step"] = state.step
        mark_step()
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
    return flatten_params(masters)


def _rank_history(run: DistRun, state, history, *, rank: int, world_size: int, backend: str,
                  seconds: float, collective_bytes: dict[str, int]) -> RankHistory:
    return RankHistory(run=run.name, rank=rank, world_size=world_size, backend=backend, device=str(state.device),
                       losses=tuple(history.losses), scales=tuple(history.scales),
                       skipped=tuple(history.skipped), grad_norms=tuple(history.grad_norms),
                       final_params=_final_params(state), held_bytes=_held_bytes(state),
                       seconds=seconds, collective_bytes=dict(collective_bytes))


def rank_threads(local_world: int) -> int:
    """The CPU threads each of ``local_world`` CPU ranks on one machine uses: they share its cores."""
    if isinstance(local_world, bool) or not isinstance(local_world, int) or local_world < 1:
        raise ValueError(f"local_world must be a positive int, got {local_world!r}")
    return max(1, (os.cpu_count() or 1) // local_world)


def single_process_run(run: DistRun, profile, device: torch.device | str = "cpu", *,
                       micro_batches: int = 1, threads: int | None = None) -> RankHistory:
    """The same run in one process on the whole global batch: what a data-parallel run should match.

    ``micro_batches``: instead, each global batch cut into that many equal slices, as that many ranks cut it,
    and their gradients accumulated (each slice's loss divided by ``micro_batches``) before the step: a
    data-parallel step's arithmetic without the communication.

    ``threads``: CPU threads for the run (then restored), e.g. :func:`rank_threads`, so that a CPU product
    blocks its sums as a rank's did: a different thread count can round a matrix product differently."""
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches must be a positive int, got {micro_batches!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive int or None, got {threads!r}")
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _single_process_run(run, profile, device, micro_batches)
    finally:
        torch.set_num_threads(before)


def _single_process_run(run: DistRun, profile, device: torch.device | str, micro_batches: int) -> RankHistory:
    device = torch.device(device)
    if run.plant_inf is not None or run.fail_rank is not None or run.hang_rank is not None:
        raise ValueError("a single-process reference has no ranks to plant an inf, a failure or a hang in")
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
    state, history = _train_rank(solo, profile, device, 0, 1, micro_batches=micro_batches)
    return _rank_history(run, state, history, rank=0, world_size=1, backend="none",
                         seconds=time.perf_counter() - start, collective_bytes={})


def choose_backend(requested: str, local_world_size: int) -> str:
    if requested not in ("auto", "gloo", "nccl"):
        raise ValueError(f"backend must be 'auto', 'gloo' or 'nccl', got {requested!r}")
    if requested != "auto":
        return requested
    every_rank_has_a_gpu = torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size
    return "nccl" if every_rank_has_a_gpu else "gloo"


# lesson 10 prints this function's source: its lines stay short enough for the page's code column
def shard_with_policy(model: torch.nn.Module, *,
                      param_dtype: torch.dtype | None = None,
                      reduce_dtype: torch.dtype | None = None
                      ) -> torch.nn.Module:
    """FSDP2 as the course's runs apply it, in an initialised process
    group: every block, then the whole model, under one policy.

    param_dtype: the dtype parameters are gathered and computed in
    (None: their own). reduce_dtype: the dtype gradients are
    reduce-scattered in (None: param_dtype). The shards stay in the
    model's own dtype, which the optimizer updates."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    blocks = getattr(model, "blocks", None)
    if not isinstance(model, torch.nn.Module) or \
            not isinstance(blocks, torch.nn.ModuleList):
        raise TypeError("expected a model with a ModuleList of blocks, "
                        f"got {type(model).__name__}")
    for name, value in (("param_dtype", param_dtype),
                        ("reduce_dtype", reduce_dtype)):
        if value is not None and not (isinstance(value, torch.dtype)
                                      and value.is_floating_point):
            raise TypeError(f"{name} must be None or a floating "
                            f"torch.dtype, got {value!r}")
    policy = MixedPrecisionPolicy(param_dtype=param_dtype,
                                  reduce_dtype=reduce_dtype)
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    return model


def run_worker(runs: list[DistRun], *, size: str, backend: str, out: Path | None, max_steps: int | None,
               reduce_check: bool = False, reduce_check_sizes=(REDUCE_CHECK_VALUES,),
               reduce_check_dtypes=REDUCE_CHECK_DTYPES) -> int:
    """The body of one rank: join the group, train every run, write one JSON (and one .pt) per run, and
    its :class:`ProgressMarks` as it goes. ``reduce_check``: then all-reduce :func:`reduce_check_inputs`
    for every case of :func:`reduce_check_plan` in every dtype of ``reduce_check_dtypes``."""
    from datetime import timedelta

    import torch.distributed as dist


    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = choose_backend(backend, local_world)
    if backend == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        torch.set_num_threads(rank_threads(local_world))  # ranks share the machine's cores
    timeout = max((r.collective_timeout_s for r in runs), default=DistRun("x").collective_timeout_s)
    progress = ProgressMarks(out, rank)
    progress("joining the process group")
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout))
    profile = SizeProfile(size, forced=True, max_steps=max_steps)
    try:
        for run in runs:
            run.check_world_size(world_size)
            progress(f"run {run.name}: setting up")
            start = time.perf_counter()
            traffic: dict[str, int] = {}
            state, history = _train_rank(run, profile, device, rank, world_size, progress, traffic=traffic)
            record = _rank_history(run, state, history, rank=rank, world_size=world_size, backend=backend,
                                   seconds=time.perf_counter() - start, collective_bytes=traffic)
            if out is not None:
                _save_rank_history(record, out)
            if rank == 0:
                print(_summary_line(record), flush=True)
            progress(f"run {run.name}: at the barrier after its last step")
            dist.barrier()
        if reduce_check and out is not None:
            progress("the all-reduce check")
            _reduce_check(rank, world_size, out, reduce_check_sizes, reduce_check_dtypes)
        progress("done")
    finally:
        dist.destroy_process_group()
    return 0


def _reduce_check(rank: int, world_size: int, out: Path, sizes, dtypes) -> None:
    import torch.distributed as dist

    plan = reduce_check_plan(world_size, sizes)
    groups = {ranks: dist.new_group(list(range(ranks))) if ranks < world_size else None   # every rank calls it
              for ranks in sorted({r for r, _ in plan})}
    for name in dtypes:
        outputs = []
        for ranks, n in plan:
            if rank < ranks:
                t = reduce_check_inputs(ranks, n)[rank].to(DTYPES_BY_NAME[name])
                dist.all_reduce(t, group=groups[ranks])
                outputs.append(t)
        if rank == 0:
            torch.save(torch.cat(outputs), out / f"all_reduce.{name}.pt")


def _summary_line(h: RankHistory) -> str:
    skipped = [i for i, s in enumerate(h.skipped) if s]
    return (f"[{h.run}] rank 0 of {h.world_size} ({h.backend}, {h.device}): {len(h.losses)} steps, "
            f"loss {h.losses[0]:.4f} -> {h.losses[-1]:.4f}, skipped {skipped or 'none'}, {h.seconds:.1f} s")


def _save_rank_history(h: RankHistory, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meta = {k: v for k, v in asdict(h).items() if k != "final_params"}
    torch.save(h.final_params, out / f"{h.run}.rank{h.rank}.pt")
    (out / f"{h.run}.rank{h.rank}.json").write_text(json.dumps(meta))


def load_rank_history(out: Path, run: str, rank: int) -> RankHistory:
    meta = json.loads((out / f"{run}.rank{rank}.json").read_text())
    params = torch.load(out / f"{run}.rank{rank}.pt", weights_only=True)
    for key in ("losses", "scales", "skipped", "grad_norms"):
        meta[key] = tuple(meta[key])
    return RankHistory(final_params=params, **meta)
