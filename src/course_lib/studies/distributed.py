"""Lesson 10's studies: every two-process run of the lesson in one launch, and reduction error against the
number of ranks on real gradients."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ..data import BatchSampler
from ..device import SizeProfile
from ..distributed.launch import launch_local
from ..distributed.reduce import REDUCTION_VARIANTS, reduce_mean
from ..distributed.worker import DEFAULT_TIMEOUT_S, DistRun, choose_backend, flatten_params, single_process_run
from ..models import course_setup


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


def per_rank_gradients(profile, device: torch.device | str, n_ranks: int, *, seed: int = 0,
                       sequences: int = 2) -> torch.Tensor:
    """``[n_ranks, n_params]`` FP32 gradients of the course model at its initialisation, each rank's from
    its own ``sequences`` sequences (distinct batches), as the ranks of a data-parallel step hold them."""
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
        grads.append(flatten_params(p.grad for p in model.parameters()))
    return torch.stack(grads)


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
    if not isinstance(profile, SizeProfile):
        raise TypeError(f"profile must be a SizeProfile, got {type(profile).__name__}")
    backend = choose_backend("auto", world_size)
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
