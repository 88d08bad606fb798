"""Lesson 10's studies: every two-process run of the lesson in one launch, and reduction error against the
number of ranks on real gradients; and what the lesson's prose, tables and errata say about them."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from ..data import BatchSampler
from ..device import SizeProfile
from ..distributed.launch import launch_local
from ..distributed.reduce import REDUCE_CHECK_VALUES, REDUCTION_VARIANTS, reduce_mean
from ..distributed.worker import (DEFAULT_TIMEOUT_S, DistRun, choose_backend, flatten_params, rank_threads,
                                  single_process_run)
from ..formats import get_format
from ..glue import Prose, bold, count_word, power_of_two_text
from ..memory import bytes_per_parameter
from ..models import course_setup, gpt_config_for
from ..tables import MarkdownTable, markdown_table


@dataclass(frozen=True)
class ReductionStudy:
    """How far the data-parallel mean gradient lands from the exact (FP64) mean, per world size.

    ``errors[label]``: the relative L2 error of the whole gradient (what plain SGD sees); ``off_share[label]``:
    the share of the exact mean's non-zero entries that came out off by more than ``tolerance`` of their
    own size. (Adam divides each entry by the root of its running mean of squared gradients, not by the
    entry itself: an entry whose ranks' gradients nearly cancel counts here in full while its update barely
    moves, so this share overstates what Adam's update feels.) Tuples align with
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
    model_values: int = 0   # the model's gradient entries, where ``n_values`` is a sample of them (0: all ran)

    def at(self, label: str, world_size: int) -> tuple[float, float]:
        """``(relative L2 error, share off by more than the tolerance)`` of ``label`` at ``world_size``."""
        if label not in self.errors:
            raise ValueError(f"no variant {label!r}; known: {', '.join(self.errors)}")
        if world_size not in self.world_sizes:
            raise ValueError(f"world size {world_size} was not run; ran {self.world_sizes}")
        i = self.world_sizes.index(world_size)
        return self.errors[label][i], self.off_share[label][i]


def per_rank_gradients(profile, device: torch.device | str, n_ranks: int, *, seed: int = 0,
                       sequences: int = 2, keep: torch.Tensor | None = None) -> torch.Tensor:
    """``[n_ranks, n_params]`` FP32 gradients of the course model at its initialisation, each rank's from
    its own ``sequences`` sequences (distinct batches), as the ranks of a data-parallel step hold them.
    ``keep``: indices into the flattened gradient; each rank's gradient is cut to them before the ranks are
    stacked, so a sample of a large model's gradient never needs the whole ``n_ranks x n_params``."""
    for name, value in (("n_ranks", n_ranks), ("sequences", sequences)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    setup = course_setup(profile, device, steps=0, default_steps=(0, 0), seed=seed)
    if sequences > setup.sampler.batch_size:
        raise ValueError(f"sequences must be at most the batch size {setup.sampler.batch_size}, got {sequences}")
    model = setup.model(seed)
    if keep is not None:
        total = sum(p.numel() for p in model.parameters())
        if keep.dtype != torch.int64 or keep.dim() != 1:
            raise TypeError(f"keep must be a 1-D int64 tensor of indices, got {keep.dtype} of shape {tuple(keep.shape)}")
        if len(keep) and not (0 <= int(keep.min()) and int(keep.max()) < total):
            raise ValueError(f"keep's indices must lie in 0..{total - 1} (the model's gradient entries)")
        keep = keep.to(setup.device)
    grads = []
    for r in range(n_ranks):
        x, y = setup.sampler.batch(r, setup.device)
        model.zero_grad(set_to_none=True)
        model(x[:sequences], y[:sequences])[1].backward()
        flat = flatten_params(p.grad for p in model.parameters())
        grads.append(flat if keep is None else flat[keep])
    return torch.stack(grads)


# The reductions are simulated on the CPU in FP64 and below: at the full profile 128 ranks' gradients of the
# 19M-parameter model would be 9.9 GB in FP32 (twice that in FP64), so a larger model is measured on a fixed
# random sample of its entries, each rank's gradient cut to it on the device before the ranks are stacked
# (the small profile's 136,960 run whole). The errors are per-entry statistics,
# and the ring and tree orders depend on a vector's length only through its chunks.
MAX_REDUCTION_VALUES = 1 << 20


def reduction_precision_study(profile, device: torch.device | str = "cpu", *,
                              world_sizes=(2, 4, 8, 16, 32, 64, 128), seed: int = 0, sequences: int = 2,
                              tolerance: float = 0.01, max_values: int = MAX_REDUCTION_VALUES) -> ReductionStudy:
    """The mean of N ranks' real gradients reduced as each of :data:`REDUCTION_VARIANTS` does, against FP64;
    on at most ``max_values`` gradient entries, the same random sample (from ``seed``) on every rank."""
    world_sizes = tuple(world_sizes)
    if not world_sizes or any(isinstance(n, bool) or not isinstance(n, int) or n < 2 for n in world_sizes):
        raise ValueError(f"world_sizes must be ints of at least 2, got {world_sizes!r}")
    if not 0 < tolerance < 1:
        raise ValueError(f"tolerance must be between 0 and 1, got {tolerance}")
    if isinstance(max_values, bool) or not isinstance(max_values, int) or max_values < 1:
        raise ValueError(f"max_values must be a positive int, got {max_values!r}")
    model_values = gpt_config_for(profile).parameter_count()   # the gradient's entries
    keep = None
    if model_values > max_values:   # each rank's gradient is cut to the sample where it is, before stacking
        keep = torch.randperm(model_values, generator=torch.Generator().manual_seed(seed))[:max_values].sort().values
    grads = per_rank_gradients(profile, device, max(world_sizes), seed=seed, sequences=sequences, keep=keep).cpu()

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
                          int(grads.shape[1]), sequences, float(grads.abs().median()),
                          model_values if model_values > grads.shape[1] else 0)


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
    ``split_parity``: ``(largest |loss gap|, largest |weight gap|)`` between the BF16 autocast data-parallel
    run and one process that cuts each batch into the ranks' slices and accumulates their gradients (the
    control that leaves out the communication); ``None`` where a record predates it.
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
    split_parity: tuple[float, float] | None = None
    # rank 0's bytes of all-gathers and reduce-scatters over the run, per FSDP2 label (empty in older records)
    collective_bytes: dict[str, dict[str, int]] = field(default_factory=dict)


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
    # the control: one process, each batch cut into the ranks' slices, their gradients accumulated, on as many
    # CPU threads as each rank had (another count can block, and round, a CPU product's sums differently)
    bf16_run = runs["DDP bf16_autocast"]
    split = single_process_run(bf16_run, profile, device, micro_batches=world_size,
                               threads=rank_threads(world_size) if device.type == "cpu" else None)
    split_parity = (max(abs(a - b) for a, b in zip(result.mean_losses(bf16_run.name), split.losses)),
                    float((result.ranks(bf16_run.name)[0].final_params - split.final_params).abs().max()))
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
    evals, held, hook_gaps, traffic = {}, {}, {}, {}
    ddp_fp32 = result.ranks(runs["DDP fp32"].name)[0]
    for label in ("DDP fp32", *FSDP_POLICIES, *[k for k, v in HOOKS.items() if v is not None]):
        h = ddp_fp32 if label in ("DDP fp32", "DDP FP32, FP32 all-reduce") else result.ranks(runs[label].name)[0]
        evals[label] = fp32_eval_of(h.final_params, profile)
        held[label] = h.held_bytes
        if label in FSDP_POLICIES:
            traffic[label] = h.collective_bytes
        if label in HOOKS:
            hook_gaps[label] = float((h.final_params - ddp_fp32.final_params).abs().max())
    return DataParallelStudy(world_size=world_size, backend=result.backend,
                             device=result.ranks(runs["DDP fp32"].name)[0].device, size=profile.name, steps=steps,
                             plant_step=plant_step, n_params=int(ddp_fp32.final_params.numel()),
                             parity=parity, curves=curves, scaler_cases=cases, eval_losses=evals, held_bytes=held,
                             hook_weight_gaps=hook_gaps, all_reduce_mismatches=result.all_reduce_mismatches(),
                             seconds=result.seconds, split_parity=split_parity, collective_bytes=traffic)


# --- What lesson 10's prose, tables and errata say about these results ----------------------------------


def launch_line(study: DataParallelStudy) -> str:
    """One line on the launch: ranks, backend, rank device, steps per run and seconds for the launch."""
    return (f"{study.world_size} ranks, backend {study.backend}, each on {study.device}, "
            f"{study.steps} steps per run, {study.seconds:.1f} s for the launch")


def launch_facts(study: DataParallelStudy) -> dict[str, object]:
    """Lesson 10's facts of the launch: ranks, backend, device and size of the ranks, steps per run, the
    course model's parameter count and the launch's seconds."""
    return {
        "world": study.world_size,
        "backend": Prose(f"`{study.backend}`"),
        "rank_device": Prose(f"`{study.device}`"),
        "size": Prose(f"'{study.size}'"),
        "steps": study.steps,
        "n_params": Prose(bold(f"{study.n_params:,}")),
        "launch_s": study.seconds,
    }


def _need(mapping: Mapping[str, Any], keys, what: str) -> None:
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise ValueError(f"the study has no {what} {missing}; it has {list(mapping)}")


def _gap(value: float) -> str:
    return "0 (bit for bit)" if value == 0 else f"{value:.1e}"


def parity_table(study: DataParallelStudy) -> MarkdownTable:
    """Per recipe, the largest loss gap at any step and the largest weight gap between the data-parallel
    run and one process; then the control (one process on the ranks' slices of each batch, under BF16 autocast)
    against the data-parallel run, where the study ran it, and BF16 autocast against FP32 in one process (its
    loss gap; the weights are not compared), the two yardsticks the page reads the gaps by."""
    ranks = f"{study.world_size} ranks"
    rows = [(f"`{recipe}`: {ranks} against one process", _gap(loss), _gap(weight))
            for recipe, (loss, weight) in study.parity.items()]
    if study.split_parity is not None:
        loss, weight = study.split_parity
        rows.append((f"`bf16_autocast`: {ranks} against one process on the ranks' slices (the control)",
                     _gap(loss), _gap(weight)))
    if "fp32" in study.curves and "bf16_autocast" in study.curves:
        gap = max(abs(a - b) for a, b in zip(study.curves["bf16_autocast"][1], study.curves["fp32"][1]))
        rows.append(("one process: `bf16_autocast` against `fp32`", _gap(gap), "not compared"))
    return markdown_table(["runs compared", "largest loss gap at any step", "largest weight gap"], rows)


def parity_facts(study: DataParallelStudy) -> dict[str, object]:
    """Lesson 10's facts of DDP against one process: loss and weight gaps per recipe, the largest loss gap
    between BF16 autocast and FP32 in one process, how many times the BF16 data-parallel gap that is
    (``inf`` when that gap is zero), and what the control that splits the batch in one process showed."""
    _need(study.parity, PARITY_RECIPES, "parity recipes")
    _need(study.curves, ("fp32", "bf16_autocast"), "loss curves")
    precision_gap = max(abs(a - b) for a, b in zip(study.curves["bf16_autocast"][1], study.curves["fp32"][1]))
    dp_gap = study.parity["bf16_autocast"][0]
    return {
        "gap_fp32": study.parity["fp32"][0],
        "gap_bf16": dp_gap,
        "gap_fp16": study.parity["fp16_autocast_scaler"][0],
        "wgap_fp32": study.parity["fp32"][1],
        "wgap_bf16": study.parity["bf16_autocast"][1],
        "precision_gap": precision_gap,
        # the ratio of the two gaps as printed (two digits each), as a reader divides them
        "dp_vs_precision": float(f"{precision_gap:.1e}") / float(f"{dp_gap:.1e}") if dp_gap else math.inf,
        "split_sentence": split_sentence(study),
        "split_takeaway": split_takeaway(study),
    }


def split_takeaway(study: DataParallelStudy) -> Prose:
    """The control's outcome for the lesson's takeaways: what it reproduced, and the conclusion it allows."""
    if study.split_parity is None:
        return Prose("this record predates the control that splits the batch in one process")
    loss, weight = study.split_parity
    if loss == 0 and weight == 0:
        return Prose("one process that split each batch the same way reproduced the two-rank run bit for bit: "
                     "the gap comes from splitting the batch, not from the communication")
    return Prose(f"one process that split each batch the same way came within {bold(f'{loss:.1e}')} of the "
                 f"two-rank run in the loss")


def split_sentence(study: DataParallelStudy) -> Prose:
    """What the control (one process accumulating the ranks' slices of each batch, under BF16 autocast)
    showed against the data-parallel run: the same numbers bit for bit, or how far apart."""
    if study.split_parity is None:
        return Prose("This record predates the control that splits the batch in one process.")
    loss, weight = study.split_parity
    control = (f"A control separates the two: one process that cuts each batch into the same "
               f"{bold(study.world_size)} slices as the ranks and accumulates their gradients before each step, "
               f"with no communication at all,")
    if loss == 0 and weight == 0:
        return Prose(f"{control} reproduces the data-parallel run bit for bit, losses and weights: splitting the "
                     f"batch makes the whole difference.")
    return Prose(f"{control} ends within {bold(f'{loss:.1e}')} of the data-parallel run in the loss and "
                 f"{bold(f'{weight:.1e}')} in the weights.")


def skipped_text(case: ScalerCase) -> str:
    """The steps each rank skipped, ``"rank 0: 4; rank 1: none"``."""
    return "; ".join(f"rank {r}: {', '.join(map(str, s)) or 'none'}" for r, s in case.skipped.items())


def scaler_table(study: DataParallelStudy) -> MarkdownTable:
    """Per planted-inf set-up: the steps each rank skipped, whether the ranks' final scales agree, whether
    the replicas agree, and which ranks ended with non-finite weights."""
    agree = {True: "yes", False: "no", None: "n/a (sharded)"}
    rows = [(label, skipped_text(c), "yes" if len(set(c.scales.values())) == 1 else "no", agree[c.replicas_agree],
             ", ".join(f"rank {r}" for r, ok in c.weights_finite.items() if not ok) or "none")
            for label, c in study.scaler_cases.items()]
    return markdown_table(["set-up", "steps skipped", "scales agree", "replicas agree", "non-finite weights"], rows)


def corpus_byte_count(size: str, byte: int = 0) -> int:
    """How many times ``byte`` (0..255) occurs in the course's training text at ``size`` ('small' or 'full')."""
    if isinstance(byte, bool) or not isinstance(byte, int) or not 0 <= byte < 256:
        raise ValueError(f"byte must be an int in 0..255, got {byte!r}")
    corpus = course_setup(SizeProfile(size), "cpu", steps=0, default_steps=(0, 0)).sampler.corpus
    return int((corpus.tokens == byte).sum())


def byte0_sentence(count: int) -> Prose:
    """Whether the embedding row of byte 0 (where the planted inf sits) is ever read in training: the
    placement, not the usual case, is what can keep stepping on an inf out of the loss."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise ValueError(f"count must be a non-negative int, got {count!r}")
    if count == 0:
        return Prose("That placement is what keeps the split silent: byte 0 never occurs in the training text, "
                     "so that row is never read and the inf never reaches the loss. An overflow in a weight "
                     "the forward pass uses would reach rank 0's loss within a step.")
    return Prose(f"Byte 0 occurs {bold(count)} times in the training text, so the loss stays finite only while "
                 f"no batch reads that row; an overflow in a weight the forward pass uses would reach the loss "
                 f"within a step.")


SCALER_DDP, SCALER_WRONG, SCALER_FSDP = ("DDP, GradScaler per rank", "by hand, unscale before the all-reduce",
                                         "FSDP2 (FP16 compute), plain GradScaler")


def scaler_facts(study: DataParallelStudy, *, byte0_count: int) -> dict[str, object]:
    """Lesson 10's facts of the planted-inf runs: the planted step, DDP's scale after it, the wrong-order
    loop's final scales, non-finite weights and last loss on rank 0, the FSDP2 run's other skipped steps,
    its initial scale, this torch's version, and whether byte 0 (``byte0_count`` occurrences) is read."""
    _need(study.scaler_cases, (SCALER_DDP, SCALER_WRONG, SCALER_FSDP), "scaler set-ups")
    ddp, wrong, fsdp = (study.scaler_cases[k] for k in (SCALER_DDP, SCALER_WRONG, SCALER_FSDP))
    initial = fsdp.scales[0][0]
    return {
        "plant_step": study.plant_step,
        "scaler_setups": count_word(len(study.scaler_cases)),
        "ddp_scale_after": ddp.scales[0][study.plant_step + 1],
        "wrong_scale0": wrong.scales[0][-1],
        "wrong_scale1": wrong.scales[1][-1],
        "wrong_bad_weights": wrong.non_finite_weights[0],
        "wrong_loss0": wrong.final_losses[0],
        "byte0_sentence": byte0_sentence(byte0_count),
        "fsdp_first_skip": Prose(", ".join(bold(s) for s in fsdp.skipped[0] if s != study.plant_step) or "none"),
        "torch_version": Prose(f"torch {torch.__version__}"),
        # plain text: a glued phrase inside a list item does not get its math typeset
        "initial_scale_log2": Prose(bold(f"{power_of_two_text(int(math.log2(initial)))} = {initial:g}")),
        "fp16_max": torch.finfo(torch.float16).max,
    }


def _bytes_per_parameter(study: DataParallelStudy, label: str) -> float:
    return sum(study.held_bytes[label].values()) / study.n_params


def fsdp_table(study: DataParallelStudy) -> MarkdownTable:
    """Per run (DDP FP32 and each FSDP2 policy, named by :data:`FSDP_TABLE_NAMES`: the parameters' dtype, then
    the reduction's): rank 0's KiB of parameters, gradients and optimizer state, bytes per parameter, and the
    final weights' FP32 evaluation loss."""
    labels = ["DDP fp32", *FSDP_POLICIES]
    _need(study.held_bytes, labels, "held bytes for")
    rows = []
    for label in labels:
        held = study.held_bytes[label]
        rows.append((FSDP_TABLE_NAMES[label], f"{held['parameters'] / 1024:.0f}", f"{held['gradients'] / 1024:.0f}",
                     f"{held['optimizer_state'] / 1024:.0f}", f"{_bytes_per_parameter(study, label):.1f}",
                     f"{study.eval_losses[label]:.5f}"))
    return markdown_table(["run: params / reduce", "params (KiB)", "grads (KiB)", "optimizer state (KiB)",
                           "bytes per param", "loss, FP32 eval."], rows)


# the FSDP table's names for its runs, short enough that its first column does not wrap on the page
FSDP_TABLE_NAMES = {"DDP fp32": "DDP: FP32", "FSDP2, FP32 (no policy)": "FSDP2: FP32",
                    "FSDP2, BF16 params, FP32 reduce": "FSDP2: BF16 / FP32",
                    "FSDP2, BF16 params, BF16 reduce": "FSDP2: BF16 / BF16"}


def fsdp_facts(study: DataParallelStudy) -> dict[str, object]:
    """Lesson 10's facts of FSDP2: bytes per parameter on a DDP rank and an FSDP2 rank, lesson 6's count for
    FP32 weights with AdamW, the spread of the policies' FP32 evaluation losses, whether FSDP2 without a
    policy ends with exactly DDP's loss, or how far from it, and how the BF16-reduce run's final loss
    compares with the FP32-reduce run's."""
    _need(study.held_bytes, ("DDP fp32", "FSDP2, FP32 (no policy)"), "held bytes for")
    _need(study.eval_losses, ("DDP fp32", *FSDP_POLICIES), "evaluation losses for")
    losses = [study.eval_losses[k] for k in FSDP_POLICIES]
    gap = abs(study.eval_losses["FSDP2, FP32 (no policy)"] - study.eval_losses["DDP fp32"])
    return {
        "ddp_bpp": _bytes_per_parameter(study, "DDP fp32"),
        "fsdp_bpp": _bytes_per_parameter(study, "FSDP2, FP32 (no policy)"),
        "lesson6_bpp": sum(bytes_per_parameter("fp32").values()),
        "policy_spread": max(losses) - min(losses),
        # FSDP2 reduce-scatters where DDP all-reduces: the same sums in another order can differ in the last bits
        "fsdp_equals_ddp": Prose("with exactly DDP's loss" if gap == 0 else
                                 f"within {bold(f'{gap:.1e}')} of DDP's loss (the two add the gradients in "
                                 f"another order)"),
        "reduce_compare": reduce_compare_sentence(study),
    }


FSDP_FP32_REDUCE, FSDP_BF16_REDUCE = "FSDP2, BF16 params, FP32 reduce", "FSDP2, BF16 params, BF16 reduce"


def reduce_compare_sentence(study: DataParallelStudy) -> Prose:
    """How the BF16-reduce FSDP2 run's final FP32-evaluated loss compares with the FP32-reduce run's, and why
    one short run of each cannot rank the two."""
    _need(study.eval_losses, (FSDP_FP32_REDUCE, FSDP_BF16_REDUCE), "evaluation losses for")
    fp32, bf16 = study.eval_losses[FSDP_FP32_REDUCE], study.eval_losses[FSDP_BF16_REDUCE]
    if bf16 == fp32:
        compare = "ends with exactly the FP32-reduce run's loss"
    else:
        # enough digits that the printed losses give the printed difference, to its two digits
        gap = f"{abs(bf16 - fp32):.1e}"
        d = next((d for d in range(5, 12) if f"{abs(round(bf16, d) - round(fp32, d)):.1e}" == gap), 12)
        compare = (f"ends {bold(gap)} {'lower' if bf16 < fp32 else 'higher'} than the "
                   f"FP32-reduce run ({bold(f'{bf16:.{d}f}')} against {bold(f'{fp32:.{d}f}')})")
    return Prose(f"The BF16-reduce run {compare}. That is one run of each, {bold(study.steps)} steps long, "
                 f"from one seed, with no spread measured: it cannot rank the two reductions.")


def all_reduce_check_facts(study: DataParallelStudy) -> dict[str, object]:
    """Whether the launch's real all-reduce matched :func:`simulate_all_reduce`, and how many values per
    rank it compared."""
    mismatches = sum(study.all_reduce_mismatches.values())
    return {
        "mismatch": Prose("matched it bit for bit" if mismatches == 0 else
                          f"differed from it in {bold(mismatches)} values"),
        "check_values": Prose(bold(f"{REDUCE_CHECK_VALUES:,}")),
    }


def off_percent(reduction: ReductionStudy, label: str, world_size: int) -> float:
    """Percent of entries that ``label`` got off by more than the tolerance at ``world_size`` ranks."""
    return 100 * reduction.at(label, world_size)[1]


def reduction_facts(reduction: ReductionStudy) -> dict[str, object]:
    """Lesson 10's facts of a :class:`ReductionStudy` (2 and its largest world size must have run): shares of
    entries off by more than the tolerance (percent) per variant, relative L2 errors, the BF16 floor, and the
    largest relative error (percent) of one rounding to BF16 (``bf16_round_max``)."""
    if 2 not in reduction.world_sizes:
        raise ValueError(f"the reduction study must include 2 ranks; ran {reduction.world_sizes}")
    n_max = reduction.world_sizes[-1]
    return {
        "n_max": n_max,
        "n_values": Prose(f"a fixed random sample of {bold(f'{reduction.n_values:,}')} of the model's "
                          f"{bold(f'{reduction.model_values:,}')}" if reduction.model_values
                          else bold(f"{reduction.n_values:,}")),
        "ring_off_2": off_percent(reduction, "BF16, ring", 2),
        "ring_off_max": off_percent(reduction, "BF16, ring", n_max),
        "tree_off_max": off_percent(reduction, "BF16, pairwise tree", n_max),
        "tree_off_peak": 100 * max(reduction.off_share["BF16, pairwise tree"]),
        "fp16n_off_max": off_percent(reduction, "FP16, ring, /N first (DDP hook)", n_max),
        "fp16s_off_max": off_percent(reduction, "FP16, ring, /~sqrt(N) first (FSDP2)", n_max),
        "ring_l2_max": reduction.at("BF16, ring", n_max)[0],
        "floor_l2": max(reduction.floor),
        "fp32_l2_max": reduction.at("FP32, ring", n_max)[0],
        "tol": 100 * reduction.tolerance,
        "per_rank_sequences": reduction.per_rank_sequences,
        # one rounding to nearest errs by at most half a unit in the last place: 2^-8 of a BF16 number's size
        "bf16_round_max": 100 * get_format("BF16").epsilon / 2,
    }


def hook_table(study: DataParallelStudy) -> MarkdownTable:
    """Per DDP communication hook (and none): the FP32 evaluation loss and the largest weight gap to no hook."""
    rows = [(label, f"{study.eval_losses['DDP fp32'] if hook is None else study.eval_losses[label]:.5f}",
             "0" if hook is None else f"{study.hook_weight_gaps[label]:.1e}")
            for label, hook in HOOKS.items()]
    return markdown_table(["run", "loss, FP32 evaluation", "largest weight gap to no hook"], rows)


def hook_facts(study: DataParallelStudy) -> dict[str, object]:
    """The largest weight gap any hook made, and the largest change of the FP32 evaluation loss."""
    if not study.hook_weight_gaps:
        raise ValueError("the study ran no communication hook")
    return {
        "hook_gap_max": max(study.hook_weight_gaps.values()),
        "hook_loss_gap": max(abs(study.eval_losses[k] - study.eval_losses["DDP fp32"]) for k in study.hook_weight_gaps),
    }


def errata_rows(study: DataParallelStudy, reduction: ReductionStudy) -> list[tuple[str, str]]:
    """Lesson 10's errata, (claim, what this page measured): FSDP2 and DDP under a planted inf, a BF16 ring
    reduction at the largest world size against 2 ranks, and DDP's loss gaps to one process."""
    _need(study.parity, ("fp32", "bf16_autocast"), "parity recipes")
    n_max = reduction.world_sizes[-1]
    return [
        ("FP16 with FSDP needs `ShardedGradScaler`.",
         f"For FSDP1, whose gradient shards are plain tensors. Under FSDP2 a plain `GradScaler` skipped step "
         f"{study.plant_step} on every rank when one rank's shard held an inf ({torch.__version__}): DTensor "
         f"gradients reduce the found-inf flag."),
        ("Under DDP, the ranks' scalers must be synchronised.",
         f"DDP averages the gradients before the scaler looks at them: an inf on rank 1 made both ranks skip step "
         f"{study.plant_step}, with equal scales after it."),
        ("BF16 has FP32's range, so a BF16 all-reduce is safe.",
         f"The range is not the problem; precision is. Simulated in gloo's ring order on the course model's "
         f"gradients at initialisation, at {n_max} ranks "
         f"{off_percent(reduction, 'BF16, ring', n_max):.1f}% of the mean gradient's entries came out off by "
         f"more than {100 * reduction.tolerance:g}% of their own size, against "
         f"{off_percent(reduction, 'BF16, ring', 2):.1f}% at 2 ranks (a share that overstates what Adam's "
         f"updates feel: see the reduction section)."),
        ("Data parallelism computes exactly what one process computes.",
         f"In FP32 up to the order of sums (loss gap {study.parity['fp32'][0]:.1e}); under BF16 autocast the loss "
         f"gap was {study.parity['bf16_autocast'][0]:.1e}, and one process that split each batch the same way "
         f"{_split_errata(study)}."),
    ]


def _split_errata(study: DataParallelStudy) -> str:
    if study.split_parity is None:
        return "was not run for this record"
    loss, _ = study.split_parity
    return "matched the data-parallel run bit for bit" if loss == 0 else f"came within {loss:.1e} of it in the loss"

