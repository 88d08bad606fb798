"""Lesson 6's studies: training throughput, MFU and time to a target per recipe, the profiled step, and memory
per recipe counted byte by byte."""

from __future__ import annotations

import gc
import statistics
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from ..bench.matmul import (
    MatmulSweep,
    capability_probe,
    matmul_sweep,
    measure_copy_bandwidth,
    measure_matmul,
    torch_timer_matmul_seconds,
)
from ..bench.profiling import profiler_activities, quiet_native_stderr, self_time_us
from ..bench.roofline import RooflineRow, model_flops_per_token, roofline_rows
from ..data import BatchSampler
from ..device import allocated_bytes
from ..hardware import MATMUL_DTYPES, GPUPeaks, find_gpu_peaks
from ..memory import MemoryBreakdown, saved_tensor_bytes, tensor_bytes
from ..models import GPTConfig, count_parameters, course_setup
from ..train import History, TrainConfig, TrainState, get_recipe, recipe_autocast, runnable_recipes, train


# the steps whose mean loss a run's time to a target is measured on (and the time-to-target figure draws)
TARGET_WINDOW = 5


@dataclass(frozen=True)
class RecipeRun:
    """One training run: per-step losses and wall seconds (steps after ``warmup_steps`` count for speed)."""

    recipe: str
    seed: int
    compiled: bool
    losses: tuple[float, ...]
    step_seconds: tuple[float, ...]
    tokens_per_step: int
    warmup_steps: int
    peak_memory_bytes: int | None = None

    @property
    def median_step_seconds(self) -> float:
        timed = self.step_seconds[self.warmup_steps:] or self.step_seconds
        return statistics.median(timed)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.median_step_seconds

    def seconds_to_loss(self, target: float, window: int = TARGET_WINDOW) -> float | None:
        """Wall seconds until the mean loss of the last ``window`` steps first falls to ``target`` (None:
        never). Warm-up steps (compilation included) count: they are time a user waits."""
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        elapsed = 0.0
        for i, seconds in enumerate(self.step_seconds):
            elapsed += seconds
            lo = max(0, i + 1 - window)
            if i + 1 >= window and sum(self.losses[lo:i + 1]) / (i + 1 - lo) <= target:
                return elapsed
        return None


@dataclass(frozen=True)
class ThroughputStudy:
    """Runs of several recipes and seeds on one device, with the model's FLOPs per token and, where known,
    the peak each recipe's dtype is measured against (TFLOP/s) and where that peak came from."""

    device: str
    runs: tuple[RecipeRun, ...]
    flops_per_token: float
    peaks: dict[str, float]
    peak_source: str

    def recipes(self) -> list[str]:
        return list(dict.fromkeys(r.recipe for r in self.runs))

    def runs_of(self, recipe: str, compiled: bool = False) -> list[RecipeRun]:
        return [r for r in self.runs if r.recipe == recipe and r.compiled == compiled]

    def mfu(self, run: RecipeRun) -> float | None:
        """Model FLOPs utilisation: achieved model FLOP/s over the peak of the recipe's dtype."""
        peak = self.peaks.get(run.recipe)
        if not peak:
            return None
        return run.tokens_per_second * self.flops_per_token / (peak * 1e12)

    def table(self) -> list[dict[str, Any]]:
        """One row per (recipe, compiled): median over seeds of step time, tokens/s, MFU; seed range."""
        rows = []
        for recipe in self.recipes():
            for compiled in (False, True):
                runs = self.runs_of(recipe, compiled)
                if not runs:
                    continue
                steps = [r.median_step_seconds for r in runs]
                mfus = [m for m in (self.mfu(r) for r in runs) if m is not None]
                rows.append({"recipe": recipe, "compiled": compiled, "seeds": len(runs),
                             "step_ms": 1e3 * statistics.median(steps),
                             "step_ms_range": (1e3 * min(steps), 1e3 * max(steps)),
                             "tokens_per_s": statistics.median(r.tokens_per_second for r in runs),
                             "tokens_per_s_range": (min(r.tokens_per_second for r in runs),
                                                    max(r.tokens_per_second for r in runs)),
                             "mfu": statistics.median(mfus) if mfus else None})
        return rows

    def time_to_target(self, target: float, compiled: bool = False,
                       window: int = TARGET_WINDOW) -> dict[str, list[float | None]]:
        """Per recipe, seconds to reach ``target`` for each seed (None where a run never did)."""
        return {recipe: [r.seconds_to_loss(target, window) for r in self.runs_of(recipe, compiled)]
                for recipe in self.recipes()}

    def target_loss(self, window: int = TARGET_WINDOW) -> float:
        """The highest final loss of any eager run (the sum of its last ``window`` losses over ``window``),
        so that every eager run reaches it: the target of :meth:`time_to_target`."""
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive int, got {window!r}")
        finals = [sum(r.losses[-window:]) / window for r in self.runs if not r.compiled]
        if not finals:
            raise ValueError("the study has no eager run to take a target from")
        return max(finals)

    def eager_curves(self) -> dict[str, list[tuple[tuple[float, ...], tuple[float, ...]]]]:
        """Per recipe, each eager run's (per-step wall seconds, per-step losses): loss against time."""
        curves: dict[str, list[tuple[tuple[float, ...], tuple[float, ...]]]] = {}
        for r in self.runs:
            if not r.compiled:
                curves.setdefault(r.recipe, []).append((r.step_seconds, r.losses))
        return curves


def roofline_speedups(config: GPTConfig, gpu: GPUPeaks, over: str, *, batch: int = 64) -> dict[str, RooflineRow]:
    """The roofline's prediction, per operation of one block of a model shaped like ``config``, of BF16
    (2-byte elements at ``gpu``'s BF16 peak) against ``over`` (a dtype of :data:`MATMUL_DTYPES` with 4-byte
    elements, e.g. ``"tf32"`` or ``"fp32"``) on ``gpu``'s memory bandwidth, at ``batch`` sequences."""
    high, low = gpu.peak(over), gpu.peak("bf16")
    if high is None or low is None:
        raise ValueError(f"the datasheet entry of {gpu.name} lacks a {over} or BF16 peak")
    rows = roofline_rows(config.d_model, config.n_heads, config.context, batch, peak_high=high, peak_low=low,
                         bandwidth_gbs=gpu.bandwidth_gbs)
    return {r.name: r for r in rows}


def recipe_matmul_dtype(recipe: str) -> str:
    """The dtype a recipe's matrix products run in (one of :data:`MATMUL_DTYPES`), read off the recipe."""
    r = get_recipe(recipe)
    if r.tf32:
        return "tf32"
    dtype = r.autocast_dtype or r.param_dtype
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def training_throughput(profile, device: torch.device | str = "cpu", *,
                        recipes: Sequence[str] = ("fp32", "bf16_autocast", "fp16_autocast_scaler"),
                        seeds: Sequence[int] = (0, 1), steps: int | None = None, warmup_steps: int = 3,
                        compiled: Sequence[str] = (), lr: float = 3e-3) -> ThroughputStudy:
    """Train the course model with each recipe from each seed, timing every step (``course_lib.train``).

    MFU peaks: on a GPU in :data:`DATASHEET_PEAKS`, its datasheet figure for the recipe's dtype; on a CPU,
    the FP32 matmul rate measured here (capability probe) for every recipe. The recipes named in
    ``compiled`` (each one of ``recipes``) also run once under ``torch.compile``, from the first seed.
    """
    device = torch.device(device)
    if not seeds:
        raise ValueError("seeds must not be empty")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative int, got {warmup_steps!r}")
    for recipe in recipes:
        get_recipe(recipe, device)
    if isinstance(compiled, str) or not set(compiled) <= set(recipes):
        raise ValueError(f"compiled must name some of the recipes {tuple(recipes)}, got {compiled!r}")
    runs = []
    flops_per_token = 0.0
    for mode in (False, True):
        for recipe in (compiled if mode else recipes):
            for seed in (seeds[:1] if mode else seeds):  # compiled: one seed (compilation is slow)
                setup = course_setup(profile, device, steps=steps, default_steps=(30, 60), seed=seed)
                if setup.steps <= warmup_steps:
                    raise ValueError(f"steps ({setup.steps}) must exceed warmup_steps ({warmup_steps})")
                model = setup.model(seed)
                cfg = setup.config
                _, non_emb = count_parameters(model)
                flops_per_token = model_flops_per_token(non_emb, cfg.n_layers, cfg.d_model, cfg.context)
                state = TrainState(model, get_recipe(recipe, device), TrainConfig(steps=setup.steps, lr=lr), device)
                if mode:
                    state.model = torch.compile(state.model)  # type: ignore[assignment]
                history = train(state, setup.sampler)
                runs.append(RecipeRun(recipe, seed, mode, tuple(history.losses), tuple(history.step_seconds),
                                      setup.sampler.batch_size * cfg.context, warmup_steps,
                                      history.peak_memory_bytes))
    peaks, source = _mfu_peaks(device, recipes)
    return ThroughputStudy(str(device), tuple(runs), flops_per_token, peaks, source)


def _mfu_peaks(device: torch.device, recipes: Sequence[str]) -> tuple[dict[str, float], str]:
    if device.type == "cuda":
        name = torch.cuda.get_device_properties(device).name
        entry = find_gpu_peaks(name)
        if entry is None:
            return {}, f"no datasheet entry for {name}"
        peaks: dict[str, float] = {}
        for r in recipes:
            peak = entry.peak(recipe_matmul_dtype(r))
            if peak:
                peaks[r] = peak
        return peaks, f"datasheet dense peaks of {entry.name}"
    # A CPU has no datasheet peak per dtype; measure every recipe against one number, the FP32 matmul
    # rate measured here, so MFU reads "share of this machine's FP32 matmul rate" for all of them.
    probe = capability_probe(device)
    return ({r: probe.tflops["fp32"] for r in recipes},
            f"the FP32 matmul rate measured on this {device.type.upper()} at n={probe.n}")


@dataclass(frozen=True)
class ProfiledStep:
    """The top operators of one training step by self time (microseconds), and the share spent in casts."""

    recipe: str
    device: str
    top_ops: tuple[tuple[str, float, int], ...]   # (name, self time in us, calls)
    total_us: float
    cast_us: float

    @property
    def cast_fraction(self) -> float:
        return self.cast_us / self.total_us if self.total_us > 0 else 0.0


def profile_training_step(recipe: str, profile, device: torch.device | str = "cpu", *, top: int = 8,
                          seed: int = 0) -> ProfiledStep:
    """Profile one training step (after two warm-up steps) of the course model with ``torch.profiler``.

    Times are self times (an op's own time, without the ops it calls): CUDA time on a GPU, CPU time
    otherwise. Casts are ``aten::_to_copy`` and ``aten::copy_``, the ops autocast adds.
    """
    from torch.profiler import profile as torch_profile

    device = torch.device(device)
    r = get_recipe(recipe, device)
    setup = course_setup(profile, device, steps=3, default_steps=(3, 3), seed=seed)
    state = TrainState(setup.model(seed), r, TrainConfig(steps=3), device)
    train(state, setup.sampler, steps=2)
    with quiet_native_stderr(), torch_profile(activities=profiler_activities(device)) as prof:
        train(state, setup.sampler, steps=1)
    rows = [(e.key, self_time_us(e, device.type), int(e.count)) for e in prof.key_averages()]
    rows = [row for row in rows if row[1] > 0 and row[0].startswith("aten::")]
    rows.sort(key=lambda row: -row[1])
    total = sum(row[1] for row in rows)
    cast = sum(row[1] for row in rows if row[0] in ("aten::_to_copy", "aten::copy_"))
    return ProfiledStep(recipe, str(device), tuple(rows[:top]), total, cast)



# the recipes lesson 6 counts the memory of (those a device runs: train.runnable_recipes)
MEMORY_RECIPES = ("fp32", "bf16_autocast", "fp16_autocast_scaler", "bf16_pure", "bf16_master")


def activation_sweep_recipe(device: torch.device | str) -> str:
    """The low-precision recipe of the activation sweep: BF16 autocast, or FP16 where the device has no BF16
    (a V100 or T4)."""
    return "bf16_autocast" if get_recipe("bf16_autocast").unsupported_reason(device) is None \
        else "fp16_autocast_scaler"


def activation_sweep_sizes(profile) -> dict[str, Any]:
    """The batches and contexts of the activation sweep for ``profile``."""
    return {"batches": profile.pick(small=(1, 2, 4, 8), full=(8, 16, 32, 64)),
            "contexts": profile.pick(small=(16, 32, 64), full=(64, 128, 256))}


def account_training_memory(recipe: str, profile, device: torch.device | str = "cpu", *,
                            batch_size: int | None = None, context: int | None = None,
                            seed: int = 0) -> MemoryBreakdown:
    """Run two training steps of the course model with ``recipe`` and count the second one's memory.

    Both steps run through :func:`course_lib.train.train`. The first creates the optimizer state; the
    second is counted: the tensors its forward pass saves for backward, its gradients, and the state that
    exists after its optimizer step; on a GPU, the allocator's peak during that step and what the
    device held before the recipe's model was built (which that peak includes). ``gradients`` holds
    every gradient tensor the loop keeps (``bf16_master``: the model's BF16 gradient and the FP32 copy of it
    that its master receives), ``master_weights`` the FP32 masters alone: the split of
    :func:`course_lib.memory.bytes_per_parameter`, which times ``n_params`` gives the persistent components.
    """
    device = torch.device(device)
    r = get_recipe(recipe, device)
    # the allocator's peak counts every tensor on the device: collect what an earlier recipe left for the
    # garbage collector, and keep what remains (the baseline, None on a CPU) beside the peak
    gc.collect()
    baseline = allocated_bytes(device)
    setup = course_setup(profile, device, steps=2, default_steps=(2, 2), seed=seed)
    cfg = setup.config
    b = setup.sampler.batch_size if batch_size is None else batch_size
    t = cfg.context if context is None else context
    for name, v in (("batch_size", b), ("context", t)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if t > cfg.context:
        raise ValueError(f"context {t} exceeds the model's context {cfg.context}")
    sampler = BatchSampler(setup.sampler.corpus, b, t, seed=seed)
    state = TrainState(setup.model(seed), r, TrainConfig(steps=2), device)
    train(state, sampler, steps=1)  # creates the optimizer state
    # the counted step runs through the course's one training loop; only the forward pass saves tensors
    # for backward, so the hook around the whole step sees exactly the forward's saved tensors
    history = History(r.name)
    activations, copies, _ = saved_tensor_bytes(state.model, lambda: train(state, sampler, steps=1,
                                                                          history=history))
    grads = sum(tensor_bytes(p.grad) for p in state.params if p.grad is not None)
    if state.masters is not None:
        grads += sum(tensor_bytes(m.grad) for m in state.masters if m.grad is not None)
    components = {
        "weights": sum(tensor_bytes(p) for p in state.params),
        "gradients": grads,
        "optimizer_state": sum(tensor_bytes(v) for st in state.optimizer.state.values()
                               for v in st.values() if isinstance(v, torch.Tensor) and v.dim() > 0),
        "master_weights": 0 if state.masters is None else sum(tensor_bytes(m) for m in state.masters),
        "autocast_weight_copies": copies,
        "activations": activations,
    }
    peak = history.peak_memory_bytes  # train() resets the allocator's peak at the start of the step
    n_params = sum(p.numel() for p in state.params)
    return MemoryBreakdown(r.name, str(device), n_params, b, t, components, peak, baseline)


@dataclass(frozen=True)
class ActivationSweep:
    """Bytes saved for backward against batch size and sequence length, with and without activation
    checkpointing of every block."""

    recipe: str
    points: tuple[tuple[int, int, bool, int], ...]   # (batch, context, checkpointed, bytes)

    def quadratic_share(self) -> tuple[float, int]:
        """Fit ``bytes(T) = a*T + c*T**2`` through the plain points at the largest batch; return the
        share of the ``T**2`` term (attention's scores) in the bytes at the largest context, and that
        context."""
        import numpy as np

        b = max(p[0] for p in self.points)
        pts = sorted((p[1], p[3]) for p in self.points if p[0] == b and not p[2])
        if len(pts) < 2:
            raise ValueError("the fit needs at least two contexts at the largest batch size")
        t = np.array([p[0] for p in pts], float)
        (a, c), *_ = np.linalg.lstsq(np.stack([t, t ** 2], 1), np.array([p[1] for p in pts], float), rcond=None)
        return float(c * t[-1] ** 2 / (a * t[-1] + c * t[-1] ** 2)), int(t[-1])

    def checkpoint_ratio(self) -> float:
        """At the largest (batch, context), plain activation bytes over checkpointed ones: how many times
        less checkpointing every block keeps."""
        largest = max(self.points, key=lambda p: (p[0], p[1]))
        plain = [p[3] for p in self.points if p[:2] == largest[:2] and not p[2]]
        ckpt = [p[3] for p in self.points if p[:2] == largest[:2] and p[2]]
        if not plain or not ckpt or not ckpt[0]:
            raise ValueError(f"the sweep lacks a plain and a non-empty checkpointed point at {largest[:2]}")
        return plain[0] / ckpt[0]


def activation_sweep(recipe: str, profile, device: torch.device | str = "cpu", *,
                     batches=(1, 2, 4, 8), contexts=(16, 32, 64), seed: int = 0) -> ActivationSweep:
    """Activation bytes (saved for backward, weight copies excluded) of the course model's forward pass
    over batch sizes (at the largest context) and contexts (at the largest batch), plain and with
    ``torch.utils.checkpoint`` around every block."""
    from torch.utils.checkpoint import checkpoint


    device = torch.device(device)
    r = get_recipe(recipe, device)
    setup = course_setup(profile, device, steps=1, default_steps=(1, 1), seed=seed)
    model = setup.model(seed).to(dtype=r.param_dtype)
    if max(contexts) > setup.config.context:
        raise ValueError(f"contexts must not exceed the model's context {setup.config.context}")
    points = []
    shapes = sorted({(b, max(contexts)) for b in batches} | {(max(batches), t) for t in contexts})
    for b, t in shapes:
        x, y = BatchSampler(setup.sampler.corpus, b, t, seed=seed).batch(0, device)
        for checkpointed in (False, True):
            def forward():
                with recipe_autocast(r, device):
                    if not checkpointed:
                        return model(x, y)[1]
                    pos = torch.arange(t, device=device)
                    h = model.tok_emb(x) + model.pos_emb(pos)
                    for block in model.blocks:
                        h = checkpoint(block, h, use_reentrant=False)
                    logits = model.head(model.ln_f(h))
                    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
            activations, _, loss = saved_tensor_bytes(model, forward)
            loss.backward()
            model.zero_grad(set_to_none=True)
            points.append((b, t, checkpointed, activations))
    return ActivationSweep(r.name, tuple(points))


@dataclass(frozen=True)
class TrainingMemory:
    """The registered ``training_memory``: one counted step per recipe the device runs
    (:data:`MEMORY_RECIPES`), and the activation bytes against batch and context."""

    breakdowns: tuple[MemoryBreakdown, ...]
    activation_sweep: ActivationSweep


def training_memory(profile, device: torch.device | str = "cpu") -> TrainingMemory:
    """:func:`account_training_memory` of every runnable memory recipe, and :func:`activation_sweep` of
    :func:`activation_sweep_recipe` at :func:`activation_sweep_sizes`."""
    breakdowns = tuple(account_training_memory(r, profile, device) for r in runnable_recipes(device, MEMORY_RECIPES))
    sweep = activation_sweep(activation_sweep_recipe(device), profile, device, **activation_sweep_sizes(profile))
    return TrainingMemory(breakdowns, sweep)


# the recipes whose training step the registered profiled_step profiles (those a device runs)
PROFILED_RECIPES = ("fp32", "bf16_autocast", "fp16_autocast_scaler")


@dataclass(frozen=True)
class ProfiledSteps:
    """The registered ``profiled_step``: :func:`profile_training_step` per runnable recipe."""

    steps: tuple[ProfiledStep, ...]


def profiled_steps(profile, device: torch.device | str = "cpu", *, recipes: Sequence[str] = PROFILED_RECIPES,
                   top: int = 12) -> ProfiledSteps:
    """One profiled training step per recipe of ``recipes`` that ``device`` runs, ``top`` operators each."""
    return ProfiledSteps(tuple(profile_training_step(r, profile, device, top=top)
                               for r in runnable_recipes(device, recipes)))


@dataclass(frozen=True)
class MatmulPointSummary:
    """One square product of a sweep as a record keeps it: dtype, size n, TFLOP/s (from the median) and
    the median, quartiles (seconds) and number of timed repeats."""

    dtype: str
    n: int
    tflops: float
    median_s: float
    q25_s: float
    q75_s: float
    repeats: int


@dataclass(frozen=True)
class TimerCrossCheck:
    """One product's median by the course's harness and by ``torch.utils.benchmark.Timer`` (seconds)."""

    harness_s: float
    torch_timer_s: float


@dataclass(frozen=True)
class MatmulThroughput:
    """The registered ``matmul_throughput``: the sweep over ``sizes`` per dtype (``skipped``: why a dtype did
    not run; ``left_out``: which of a dtype's sizes did not, and why), the harness against torch's Timer at
    ``cross_check_n``, and the copy bandwidth (GB/s)."""

    sizes: tuple[int, ...]
    cross_check_n: int
    points: tuple[MatmulPointSummary, ...]
    skipped: dict[str, str]
    cross_check: dict[str, TimerCrossCheck]
    copy_bandwidth_gbs: float
    left_out: dict[str, str] = field(default_factory=dict)

    def tflops(self) -> dict[str, dict[int, float]]:
        """``{dtype: {n: TFLOP/s}}``, as :func:`measured_tflops`-style panels of the throughput figure."""
        out: dict[str, dict[int, float]] = {}
        for p in self.points:
            out.setdefault(p.dtype, {})[p.n] = p.tflops
        return out


def matmul_sweep_sizes(profile) -> tuple[int, ...]:
    """Square sizes of the matmul sweep: powers of two with misaligned neighbours (one less)."""
    return profile.pick(small=(64, 127, 128, 255, 256, 511, 512),
                        full=(256, 512, 1024, 2048, 4095, 4096, 8191, 8192))


def matmul_sweep_budget(profile) -> float:
    """Seconds of timing per point of the matmul sweep."""
    return profile.pick(small=0.04, full=0.2)


def matmul_point_limit(profile) -> float:
    """Seconds a point of the matmul sweep may be forecast to take (:class:`~course_lib.bench.SizeLimit`):
    far above what any GPU or any 16-bit CPU product here needs, below a CPU's software FP8 kernel at the
    larger sizes, which can take seconds a product."""
    return profile.pick(small=1.5, full=60.0)


def matmul_throughput(profile, device: torch.device | str = "cpu") -> MatmulThroughput:
    """The sweep (:func:`~course_lib.bench.matmul_sweep` at :func:`matmul_sweep_sizes`), the harness against
    ``torch.utils.benchmark.Timer`` for FP32 and BF16, and the copy bandwidth."""
    device = torch.device(device)
    sizes = matmul_sweep_sizes(profile)
    sweep = matmul_sweep(device, sizes, budget_s=matmul_sweep_budget(profile),
                         point_limit_s=matmul_point_limit(profile))
    points = tuple(MatmulPointSummary(p.dtype, p.n, p.tflops, p.timing.median, p.timing.q25, p.timing.q75,
                                      p.timing.repeats) for p in sweep.points)
    check_n, budget = profile.pick(small=512, full=4096), profile.pick(small=0.1, full=0.5)
    cross = {dtype: TimerCrossCheck(measure_matmul(dtype, check_n, check_n, check_n, device,
                                                   budget_s=budget).timing.median,
                                    torch_timer_matmul_seconds(dtype, check_n, device, min_run_time=budget))
             for dtype in ("fp32", "bf16") if dtype not in sweep.skipped}
    bandwidth = measure_copy_bandwidth(device, profile.pick(small=64 << 20, full=1 << 30))
    return MatmulThroughput(sizes, check_n, points, dict(sweep.skipped), cross, bandwidth, dict(sweep.left_out))


def measured_tflops(sweep: MatmulSweep) -> dict[str, dict[int, float]]:
    """``{dtype: {n: TFLOP/s}}`` of the dtypes the sweep ran, in :data:`MATMUL_DTYPES` order."""
    return {d: sweep.tflops(d) for d in MATMUL_DTYPES if sweep.tflops(d)}


def bf16_ridge(gpu: GPUPeaks) -> float:
    """FLOPs per byte at which ``gpu``'s BF16 peak meets its memory bandwidth (its roofline's ridge point)."""
    peak = gpu.peak("bf16")
    if peak is None:
        raise ValueError(f"the datasheet entry of {gpu.name} has no BF16 peak")
    return peak * 1e3 / gpu.bandwidth_gbs
