"""Lesson 7's studies: the course model's tensors under every scaling recipe, the outlier sweep, delayed scaling
against a spike, the cost of current scaling's cast, FP8 training over seeds, and the predicted and measured
speed of FP8 linear layers. The facts and tables the lesson glues from them are in :mod:`.fp8_prose`."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn as nn

from ..bench import SizeLimit, time_function
from ..data import BatchSampler
from ..fp8.casts import as_2d, cast_saturating
from ..fp8.linear import Fp8Linear, convert_to_fp8, torchao_float8
from ..fp8.recipes import (
    BlockwiseScaling,
    CurrentScaling,
    DelayedScaling,
    QuantizationError,
    RowwiseScaling,
    ScalingRecipe,
    StaticScaling,
    quantization_error,
)
from ..fp8.roofline import Fp8LinearEstimate, predict_fp8_linear
from ..hardware import GPUPeaks
from ..models import course_setup
from ..mx import BLOCK_RECIPES
from ..results import RecordedResult
from ..train import RECIPES, TrainConfig, TrainState, get_recipe, train


@dataclass(frozen=True)
class LinearTensors:
    """The three tensors an FP8 linear layer casts, taken from the course model after ``steps`` steps of
    FP32 training: its input activation ``[tokens, in]``, its weight ``[out, in]``, and the gradient of the
    loss with respect to its output ``[tokens, out]``."""

    layer: str
    steps: int
    activation: torch.Tensor
    weight: torch.Tensor
    grad_output: torch.Tensor
    losses: tuple[float, ...]


def capture_linear_tensors(profile, device: torch.device | str = "cpu", *, layer: str = "blocks.0.fc",
                           steps: int | None = None, seed: int = 0, lr: float = 3e-3) -> LinearTensors:
    """Train the course GPT in FP32 for ``steps`` steps, then record one linear layer's input, weight and
    output gradient on the next batch."""
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 200), seed=seed)
    model = setup.model(seed)
    modules = dict(model.named_modules())
    if layer not in modules or not isinstance(modules[layer], nn.Linear):
        linears = [n for n, m in modules.items() if isinstance(m, nn.Linear)]
        raise ValueError(f"{layer!r} is not a linear layer of the course model; choose one of {linears}")
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for step in range(setup.steps):
        x, y = setup.sampler.batch(step, setup.device)
        opt.zero_grad(set_to_none=True)
        loss = model(x, y)[1]
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    seen: dict[str, torch.Tensor] = {}
    target = modules[layer]
    h1 = target.register_forward_hook(lambda m, inp, out: seen.__setitem__("activation", inp[0].detach()))
    h2 = target.register_full_backward_hook(lambda m, gin, gout: seen.__setitem__("grad", gout[0].detach()))
    try:
        x, y = setup.sampler.batch(setup.steps, setup.device)
        model(x, y)[1].backward()
    finally:
        h1.remove()
        h2.remove()
    act, grad = seen["activation"], seen["grad"]
    return LinearTensors(layer, setup.steps, act.reshape(-1, act.shape[-1]).cpu().float(),
                         target.weight.detach().cpu().float().clone(), grad.reshape(-1, grad.shape[-1]).cpu().float(),
                         tuple(losses))


def with_outlier_channel(activation: torch.Tensor, *, channel: int = 0, factor: float = 100.0) -> torch.Tensor:
    """A copy of ``activation`` ``[tokens, channels]`` with one channel multiplied by ``factor``: the
    'outlier features' of large language models, where a few channels are far larger than the rest."""
    if activation.dim() != 2:
        raise ValueError(f"activation must be [tokens, channels], got shape {tuple(activation.shape)}")
    if not 0 <= channel < activation.shape[1]:
        raise ValueError(f"channel {channel} is outside 0..{activation.shape[1] - 1}")
    out = activation.clone()
    out[:, channel] *= factor
    return out


def lab_recipes(block: int = 128) -> dict[str, ScalingRecipe]:
    """The recipes the lesson's scaling lab compares, by display name (stateless: delayed scaling is
    studied over time in :func:`delayed_spike`)."""
    return {
        "no scaling (E4M3)": StaticScaling("e4m3"),
        "per tensor, E4M3": CurrentScaling("e4m3"),
        "per tensor, E5M2": CurrentScaling("e5m2"),
        "per row (token), E4M3": RowwiseScaling("e4m3", axis=-1),
        "per column (channel), E4M3": RowwiseScaling("e4m3", axis=0),
        f"1 x {block} tiles, E4M3": BlockwiseScaling("e4m3", block=(1, block)),
        f"{block} x {block} blocks, E4M3": BlockwiseScaling("e4m3", block=(block, block)),
    }


@dataclass(frozen=True)
class ScalingLab:
    """``errors[tensor][recipe]``: the :class:`QuantizationError` of each recipe on each tensor."""

    tensors: tuple[str, ...]
    recipes: tuple[str, ...]
    errors: dict[str, dict[str, QuantizationError]]


def scaling_lab(tensors: dict[str, torch.Tensor], recipes: dict[str, ScalingRecipe]) -> ScalingLab:
    """Every recipe on every tensor. A recipe whose blocks do not tile a tensor raises ValueError."""
    if not tensors or not recipes:
        raise ValueError("scaling_lab needs at least one tensor and one recipe")
    errors = {t: {r: quantization_error(x, recipe, label=r) for r, recipe in recipes.items()}
              for t, x in tensors.items()}
    return ScalingLab(tuple(tensors), tuple(recipes), errors)


@dataclass(frozen=True)
class SpikeRun:
    """Per step of a tensor sequence with one amax spike: the amax, and per recipe the share saturated,
    the share flushed to zero and the relative error."""

    spike_at: int
    factor: float
    amax: tuple[float, ...]
    saturated: dict[str, tuple[float, ...]]
    flushed: dict[str, tuple[float, ...]]
    relative_error: dict[str, tuple[float, ...]]


SPIKE_GAINS = (0.8, 1.2)   # the range of delayed_spike's step-to-step gain


def spike_gains(steps: int, seed: int = 0) -> list[float]:
    """:func:`delayed_spike`'s gain per step: uniform in :data:`SPIKE_GAINS`, drawn in float32 from ``seed``
    (the explorer of lesson 7 replays these same gains)."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    gen = torch.Generator().manual_seed(seed)
    lo, hi = SPIKE_GAINS
    return [float(g) for g in lo + (hi - lo) * torch.rand(steps, generator=gen)]


def delayed_spike(tensor: torch.Tensor, *, steps: int = 40, spike_at: int = 15, factor: float = 50.0,
                  amax_history_len: int = 16, margin: int = 0, fmt: str = "e4m3", seed: int = 0) -> SpikeRun:
    """Feed ``steps`` tensors through current and delayed scaling: step *t* is ``tensor`` times a gently
    varying gain (:func:`spike_gains`), and step ``spike_at`` is also multiplied by ``factor`` (a loss
    spike's activations). Delayed scaling runs with ``amax_compute_algo`` "max" and "most_recent"."""
    if not 0 <= spike_at < steps:
        raise ValueError(f"spike_at must lie in 0..{steps - 1}, got {spike_at}")
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"factor must be a positive number, got {factor!r}")
    gains = spike_gains(steps, seed)
    recipes: dict[str, ScalingRecipe] = {
        "current": CurrentScaling(fmt),
        f"delayed, max of {amax_history_len}": DelayedScaling(fmt, amax_history_len=amax_history_len,
                                                              amax_compute_algo="max", margin=margin),
        "delayed, most recent": DelayedScaling(fmt, amax_history_len=amax_history_len,
                                               amax_compute_algo="most_recent", margin=margin),
    }
    sat: dict[str, list[float]] = {k: [] for k in recipes}
    flushed: dict[str, list[float]] = {k: [] for k in recipes}
    rel: dict[str, list[float]] = {k: [] for k in recipes}
    amaxes = []
    base = as_2d(tensor).detach().float()
    for t in range(steps):
        x = base * gains[t] * (factor if t == spike_at else 1.0)
        amaxes.append(float(x.abs().max()))
        for name, recipe in recipes.items():
            e = quantization_error(x, recipe)
            sat[name].append(e.saturated)
            flushed[name].append(e.flushed)
            rel[name].append(e.relative_error)
    return SpikeRun(spike_at, factor, tuple(amaxes), {k: tuple(v) for k, v in sat.items()},
                    {k: tuple(v) for k, v in flushed.items()}, {k: tuple(v) for k, v in rel.items()})


FINAL_TAIL = 5   # a run's final loss: the mean of its last this many steps (one step's loss is noisy)


@dataclass(frozen=True)
class Fp8Training:
    """Loss curves of the course model per recipe and seed (``curves[recipe][i]`` for ``seeds[i]``)."""

    recipes: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    block: int
    curves: dict[str, tuple[tuple[float, ...], ...]]

    def final(self, recipe: str, tail: int = FINAL_TAIL) -> tuple[float, ...]:
        """Per seed, the mean loss over the last ``tail`` steps."""
        return tuple(sum(c[-tail:]) / len(c[-tail:]) for c in self.curves[recipe])


def train_converted(recipe: str, convert, profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                    seed: int = 0, lr: float = 3e-3):
    """Train the course GPT from seed ``seed``: with a plain precision recipe of :mod:`course_lib.train` when
    ``recipe`` names one ("fp32", "bf16_autocast", ...), else in FP32 after ``convert(model)`` has swapped its
    linear layers for quantised ones (every other op and the weights stay FP32). Same batches, same initial
    weights for the same seed. Returns the History."""
    state, sampler = converted_state(recipe, convert, profile, device, steps=steps, seed=seed, lr=lr)
    return train(state, sampler)


def converted_state(recipe: str, convert, profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                    seed: int = 0, lr: float = 3e-3) -> tuple[TrainState, BatchSampler]:
    """What :func:`train_converted` trains, before its first step: the training state (model, optimizer,
    schedule) and the batch sampler, so that a study can step it itself (``train(state, sampler, steps=k)``)."""
    device = torch.device(device)
    setup = course_setup(profile, device, steps=steps, default_steps=(40, 150), seed=seed)
    model = setup.model(seed)
    if recipe in RECIPES:
        precision = get_recipe(recipe, device)
    else:
        convert(model)
        precision = get_recipe("fp32", device)
    return TrainState(model, precision, TrainConfig(steps=setup.steps, lr=lr), device), setup.sampler


def train_fp8(recipe: str, profile, device: torch.device | str = "cpu", *, steps: int | None = None,
              seed: int = 0, lr: float = 3e-3, block: int | None = None, backend: str = "simulated"):
    """Train the course GPT with FP8 linear layers (``recipe``, see :func:`linear_scaling`) or with a plain
    precision recipe (see :func:`train_converted`). Returns the History."""
    block = block if block is not None else profile.pick(small=32, full=128)
    return train_converted(recipe, lambda model: convert_to_fp8(model, recipe, backend=backend, block=block),
                           profile, device, steps=steps, seed=seed, lr=lr)


FP8_TRAINING_RECIPES = ("bf16_autocast", "tensorwise", "rowwise", "delayed", "blockwise", "unscaled")


def fp8_training(profile, device: torch.device | str = "cpu", *, recipes=FP8_TRAINING_RECIPES,
                 seeds=(0, 1, 2), steps: int | None = None, lr: float = 3e-3) -> Fp8Training:
    """Loss curves of :func:`train_fp8` for every recipe and seed."""
    if not recipes or not seeds:
        raise ValueError("fp8_training needs at least one recipe and one seed")
    curves, n_steps = seeded_curves(lambda recipe, seed: train_fp8(recipe, profile, device, steps=steps, seed=seed,
                                                                   lr=lr), recipes, seeds)
    return Fp8Training(tuple(recipes), tuple(seeds), n_steps, profile.pick(small=32, full=128), curves)


def training_size(parameters: Mapping[str, object]) -> str:
    """How much :func:`fp8_training` trains with the registry's ``parameters`` (recipes and seeds default to
    the function's): "6 recipes x 3 seeds x 400 steps"."""
    recipes, seeds = parameters.get("recipes", FP8_TRAINING_RECIPES), parameters.get("seeds", (0, 1, 2))
    steps = parameters.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise ValueError(f"the parameters must give a positive number of steps, got {steps!r}")
    def count(n: int, noun: str) -> str:
        return f"{n} {noun}{'' if n == 1 else 's'}"
    return (f"{count(len(recipes), 'recipe')} x {count(len(seeds), 'seed')} x "   # type: ignore[arg-type]
            f"{count(steps, 'step')}")


def merge_fp8_training(pieces: Sequence[Fp8Training]) -> Fp8Training:
    """One :class:`Fp8Training` from pieces recorded a few recipes at a time (the GPU session records one
    recipe per step, a few steps to a 10-minute part), newest first: each recipe's curves come from the newest piece that ran it,
    recipes in :data:`FP8_TRAINING_RECIPES` order. The pieces must share seeds, steps and block size."""
    if not pieces:
        raise ValueError("no fp8_training pieces to merge")
    first = pieces[0]
    for piece in pieces:
        if not isinstance(piece, Fp8Training):
            raise TypeError(f"expected Fp8Training pieces, got {type(piece).__name__}")
        if (piece.seeds, piece.steps, piece.block) != (first.seeds, first.steps, first.block):
            raise ValueError("fp8_training pieces differ in seeds, steps or block size "
                             f"({piece.seeds}, {piece.steps}, {piece.block} against {first.seeds}, {first.steps}, "
                             f"{first.block}): they are not one experiment")
    curves: dict[str, tuple[tuple[float, ...], ...]] = {}
    for piece in pieces:
        for recipe in piece.recipes:
            curves.setdefault(recipe, piece.curves[recipe])
    known = (*FP8_TRAINING_RECIPES, *BLOCK_RECIPES)
    order = [r for r in known if r in curves] + [r for r in curves if r not in known]
    return Fp8Training(tuple(order), first.seeds, first.steps, first.block, {r: curves[r] for r in order})


def merge_recorded_pieces(records: Sequence[RecordedResult]) -> tuple[str, Fp8Training] | None:
    """The newest record's GPU label and, merged (:func:`merge_fp8_training`), every piece recorded on that
    GPU at the same size as the newest (course model, seeds, steps, block); None without records. Pieces of
    an earlier full profile on the same GPU are left out, not merged into a mixed result."""
    if not records:
        return None
    newest = records[0]
    if not isinstance(newest.result, Fp8Training):
        raise TypeError(f"expected recorded Fp8Training pieces, got {type(newest.result).__name__}")

    def size(r: RecordedResult) -> tuple:
        return (r.record.course_model, r.result.seeds, r.result.steps, r.result.block)

    same = [r.result for r in records if r.label == newest.label and size(r) == size(newest)]
    return newest.label, merge_fp8_training(same)


def seeded_curves(train_one, recipes, seeds) -> tuple[dict[str, tuple[tuple[float, ...], ...]], int]:
    """``train_one(recipe, seed)`` (a History) for every recipe and seed: the loss curves as
    ``curves[recipe][i]`` for ``seeds[i]``, and the number of steps a run took."""
    curves, n_steps = {}, 0
    for recipe in recipes:
        runs = []
        for seed in seeds:
            losses = tuple(train_one(recipe, seed).losses)
            runs.append(losses)
            n_steps = len(losses)
        curves[recipe] = tuple(runs)
    return curves, n_steps


@dataclass(frozen=True)
class OutlierSweep:
    """How an outlier channel of growing size damages the *other* channels, per recipe.

    ``relative_error[recipe][i]``: L2 relative error of the non-outlier channels at ``factors[i]``;
    ``flushed[recipe][i]``: the share of their non-zero values that became 0."""

    channel: int
    factors: tuple[float, ...]
    relative_error: dict[str, tuple[float, ...]]
    flushed: dict[str, tuple[float, ...]]


def outlier_sweep(activation: torch.Tensor, recipes: dict[str, ScalingRecipe], *,
                  factors=(1, 10, 100, 1e3, 1e4, 1e5, 1e6), channel: int = 0) -> OutlierSweep:
    """Quantise ``activation`` ``[tokens, channels]`` with one channel multiplied by each factor in turn,
    and measure the error of the remaining channels (the ones an outlier's scale is not chosen for)."""
    if not recipes:
        raise ValueError("outlier_sweep needs at least one recipe")
    factors = tuple(float(f) for f in factors)
    if not factors or any(not (math.isfinite(f) and f > 0) for f in factors):
        raise ValueError(f"factors must be positive numbers, got {factors}")
    rest = [c for c in range(activation.shape[1]) if c != channel]
    base = activation.detach().float()[:, rest]
    norm = float(torch.linalg.vector_norm(base))
    nonzero = max(1, int((base != 0).sum()))
    rel: dict[str, list[float]] = {name: [] for name in recipes}
    flushed: dict[str, list[float]] = {name: [] for name in recipes}
    for factor in factors:
        x = with_outlier_channel(activation.detach().float(), channel=channel, factor=factor)
        for name, recipe in recipes.items():
            back = recipe.round_trip(x)[:, rest]
            rel[name].append(float(torch.linalg.vector_norm(back - base)) / norm)
            flushed[name].append(float(((back == 0) & (base != 0)).sum()) / nonzero)
    return OutlierSweep(channel, factors, {k: tuple(v) for k, v in rel.items()},
                        {k: tuple(v) for k, v in flushed.items()})


DEEPSEEK_TILE = 128   # DeepSeek-V3's tile side: 1 x 128 activation tiles, 128 x 128 weight blocks


def lab_block(profile) -> int:
    """The tile side of the blockwise recipes: DeepSeek-V3's 128 at full size; 32 on the small model, whose
    width (64) 128 does not divide."""
    return profile.pick(small=32, full=DEEPSEEK_TILE)


def sweep_recipes(block: int) -> dict[str, ScalingRecipe]:
    """The outlier sweep's recipes: :func:`lab_recipes` without the E5M2 and unscaled controls."""
    return {k: v for k, v in lab_recipes(block).items() if "E5M2" not in k and "no scaling" not in k}


@dataclass(frozen=True)
class Fp8ScalingLab:
    """The registered ``fp8_scaling_lab``: every recipe's error on one linear layer's tensors after
    ``steps`` FP32 steps (``lab``) and the outlier-channel sweep over its activation (``sweep``), with
    ``block``-sized tiles."""

    layer: str
    steps: int
    block: int
    lab: ScalingLab
    sweep: OutlierSweep


def scaling_lab_study(tensors: LinearTensors, block: int) -> Fp8ScalingLab:
    """:func:`scaling_lab` with :func:`lab_recipes` on the activation, weight and output gradient, and
    :func:`outlier_sweep` with :func:`sweep_recipes` on the activation."""
    named = {"activation": tensors.activation, "weight": tensors.weight, "gradient": tensors.grad_output}
    return Fp8ScalingLab(tensors.layer, tensors.steps, block, scaling_lab(named, lab_recipes(block)),
                         outlier_sweep(tensors.activation, sweep_recipes(block)))


@dataclass(frozen=True)
class Fp8LinearSpeed:
    """Median seconds of one linear layer's forward + backward (``[n, n] @ [n, n]``) per implementation
    and size; ``skipped[implementation]`` says why one did not run, ``left_out[implementation]`` which of its
    sizes did not, and why (:class:`~course_lib.bench.SizeLimit`)."""

    device: str
    sizes: tuple[int, ...]
    seconds: dict[str, dict[int, float]]
    skipped: dict[str, str]
    left_out: dict[str, str] = field(default_factory=dict)

    def speedup(self, implementation: str, baseline: str = "BF16 nn.Linear") -> dict[int, float]:
        return {n: self.seconds[baseline][n] / s for n, s in self.seconds.get(implementation, {}).items()
                if n in self.seconds.get(baseline, {})}


def _linear_implementations(n: int, device: torch.device):
    """(name, module, input dtype) for each implementation the speed study times, or (name, reason)."""
    base = nn.Linear(n, n, bias=False)
    out: list[tuple] = [("BF16 nn.Linear", copy.deepcopy(base).to(device, torch.bfloat16), torch.bfloat16),
           ("FP8 course layer (_scaled_mm, tensorwise, eager)",
            Fp8Linear.from_linear(base, recipe="tensorwise", backend="scaled_mm").to(device), torch.bfloat16)]
    try:
        convert = torchao_float8("tensorwise")
    except ImportError as exc:  # torchao is optional on a GPU image
        out.append(("torchao Float8Linear (tensorwise, eager)", str(exc)))
    else:
        model = convert(nn.Sequential(copy.deepcopy(base)).to(device, torch.bfloat16))
        out.append(("torchao Float8Linear (tensorwise, eager)", model, torch.bfloat16))
    return out


def fp8_linear_speed(sizes, device: torch.device | str, *, budget_s: float = 0.2,
                     point_limit_s: float | None = None) -> Fp8LinearSpeed:
    """Time forward + backward of a square linear layer in BF16 and in FP8 (the course's layer on
    ``torch._scaled_mm``, and torchao's when it imports), with :func:`course_lib.bench.time_function`.
    With ``point_limit_s``, an implementation's sizes forecast to take longer than that to time are left out
    (:class:`~course_lib.bench.SizeLimit`: a CPU's software FP8 kernel can take seconds a product)."""
    device = torch.device(device)
    sizes = tuple(int(n) for n in sizes)
    if not sizes or any(n < 16 or n % 16 for n in sizes):
        raise ValueError(f"sizes must be multiples of 16 (FP8 matmuls need them), got {sizes}")
    seconds: dict[str, dict[int, float]] = {}
    skipped: dict[str, str] = {}
    limits: dict[str, SizeLimit] = {}
    for n in sizes:
        gen = torch.Generator().manual_seed(n)
        x = torch.randn(n, n, generator=gen).to(device)
        grad = torch.randn(n, n, generator=gen).to(device)
        for entry in _linear_implementations(n, device):
            if len(entry) == 2:
                skipped[entry[0]] = entry[1]
                continue
            name, module, dtype = entry
            limit = limits.setdefault(name, SizeLimit(point_limit_s, budget_s=budget_s))
            if not limit.allows(n):
                continue
            xi = x.to(dtype).requires_grad_(True)
            gi = grad.to(dtype)

            def step(module=module, xi=xi, gi=gi):
                out = module(xi)
                out.backward(gi.to(out.dtype))

            try:
                timing = time_function(step, device=device, budget_s=budget_s)
            except (RuntimeError, ValueError) as exc:
                skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            else:
                seconds.setdefault(name, {})[n] = timing.median
                limit.timed(n, timing)
    left_out = {name: limit.note for name, limit in limits.items() if limit.note}
    return Fp8LinearSpeed(str(device), sizes, seconds, skipped, left_out)


def describe_tensors(tensors: Mapping[str, torch.Tensor], *, name_width: int, stats=("median", "max"),
                     nonzero_only: bool = False) -> str:
    """One line per tensor: its name (padded to ``name_width`` characters), shape, and the ``stats``
    ("median", "max") of its magnitudes, in that order; ``nonzero_only`` leaves exact zeros out of them."""
    if not tensors:
        raise ValueError("describe_tensors needs at least one tensor")
    unknown = [s for s in stats if s not in ("median", "max")]
    if unknown or not stats:
        raise ValueError(f"stats must be 'median' and/or 'max', got {tuple(stats)}")
    lines = []
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name!r} is a {type(t).__name__}, not a tensor")
        mags = (t[t != 0] if nonzero_only else t).abs()
        values = {"median": float(mags.median()), "max": float(mags.max())}
        lines.append(f"{name:{name_width}s} shape {tuple(t.shape)}  "
                     + "  ".join(f"{s} |x| {values[s]:.2e}" for s in stats))
    return "\n".join(lines)


# the three ways of casting a BF16 tensor to FP8 that lesson 7 times against each other
TORCH_CAST = "torch cast"
KNOWN_SCALE_CAST = "scale known (scale, saturate, cast)"
CURRENT_SCALING_CAST = "current scaling (amax, then cast)"


def time_scaled_casts(device: torch.device | str, *, n: int = 10_000_000, budget_s: float = 0.3,
                      seed: int = 0) -> dict[str, float]:
    """Median seconds to cast ``n`` standard normal FP32 values to E4M3 three ways: torch's own cast (no
    scale, no saturation), :func:`~course_lib.fp8.cast_saturating` with a scale known in advance (delayed
    scaling's case), and :class:`~course_lib.fp8.CurrentScaling`, which reads the tensor for its amax first."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    device = torch.device(device)
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(device)
    known_scale = torch.tensor(100.0, device=device)
    casts = {
        TORCH_CAST: lambda: x.to(torch.float8_e4m3fn),
        KNOWN_SCALE_CAST: lambda: cast_saturating(x, "e4m3", known_scale),
        CURRENT_SCALING_CAST: lambda: CurrentScaling().quantize(x),
    }
    return {name: time_function(cast, device=device, budget_s=budget_s).median for name, cast in casts.items()}


def output_and_gradients(module: nn.Module, x: torch.Tensor, *,
                         loss=torch.sum) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """``module(x)`` and, after backpropagating ``loss(module(x))``, the gradients of ``x`` and of the
    module's one weight (a linear layer, or a container holding one): what two implementations of a layer
    must agree on. ``x`` itself is left untouched (a copy gets the gradient)."""
    weights = [w for m in module.modules() if isinstance(w := getattr(m, "weight", None), nn.Parameter)]
    if len(weights) != 1:
        raise ValueError(f"module must hold exactly one weight, found {len(weights)}")
    xb = x.detach().clone().requires_grad_()
    out = module(xb)
    loss(out).backward()
    return out.detach(), xb.grad, weights[0].grad


def roofline_speedups(gpu: GPUPeaks, sizes) -> dict[str, list[Fp8LinearEstimate]]:
    """:func:`~course_lib.fp8.predict_fp8_linear` for square layers ``M = K = N`` of each size on ``gpu``'s
    datasheet peaks and bandwidth: unfused tensorwise, tensorwise with fused casts, and rowwise."""
    bf16, fp8 = gpu.peak("bf16"), gpu.peak("fp8")
    if bf16 is None or fp8 is None:
        raise ValueError(f"{gpu.name} lists no BF16 or no FP8 tensor-core peak")
    return {f"{recipe}{' (casts fused)' if fuse else ''}": [
        predict_fp8_linear(n, n, n, bf16_tflops=bf16, fp8_tflops=fp8, bandwidth_gbs=gpu.bandwidth_gbs,
                           recipe=recipe, fuse_casts=fuse) for n in sizes]
        for recipe, fuse in (("tensorwise", False), ("tensorwise", True), ("rowwise", False))}


def recorded_product_ratios(records: Sequence[RecordedResult]) -> dict[str, dict[int, float]]:
    """From the newest ``matmul_throughput`` record (if any): one FP8 ``_scaled_mm`` product's TFLOP/s over
    one BF16 product's, per size n, under a label naming the GPU; ``{}`` with no record."""
    if not records:
        return {}
    rec = records[0]
    if rec.record.experiment != "matmul_throughput":
        raise ValueError(f"a {rec.record.experiment!r} record holds no matmul throughput")
    by_dtype = rec.result.tflops()     # a recorded studies.performance.MatmulThroughput
    bf16, fp8 = by_dtype.get("bf16", {}), by_dtype.get("fp8", {})
    return {f"recorded {rec.label}: _scaled_mm / BF16, one product, no casts": {
        n: fp8[n] / bf16[n] for n in fp8 if n in bf16}}
