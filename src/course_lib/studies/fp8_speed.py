"""Lesson 7's speed studies: where the course's FP8 layer spends its time (``torch.profiler``, self time by
stage), and FP8 against BF16 where it is built for speed: torchao's float8 training layers under
``torch.compile``, for square linear layers and a Llama-like block, with the roofline's prediction beside
each measurement. The sentences and tables the lesson glues from them are in :mod:`.fp8_prose`."""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn as nn
import torch.nn.functional as F

from ..bench import time_function
from ..bench.profiling import profiler_activities, quiet_native_stderr, self_time_us
from ..fp8.linear import Fp8Linear, torchao_float8
from ..fp8.roofline import predict_fp8_linear
from ..hardware import DATASHEET_PEAKS, GPUPeaks, find_gpu_peaks, scaled_mm_unsupported_reason

# ---- where the course layer's time goes ----------------------------------------------------------------

LAYER_GROUPS = ("amax", "scale", "cast", "matmul", "other")

# the course's functions an operator is called from, by group (the nearest one on the Python stack decides)
_GROUP_OF_FUNCTION = {"block_amax": "amax", "check_finite_amax": "amax", "amax_to_scale": "scale",
                      "scale_from_amax": "scale", "_scaled_mm_inverse": "scale", "_materialised": "scale",
                      "cast_saturating": "cast", "cast_blocks": "cast"}
_MATMUL_OPS = {"aten::_scaled_mm", "aten::mm", "aten::matmul", "aten::addmm", "aten::bmm"}
_FP8_FRAME = re.compile(r"course_lib[/\\]fp8[/\\]\w+\.py\(\d+\): (\w+)")


def operator_group(op: str, function: str | None) -> str:
    """The group (:data:`LAYER_GROUPS`) of one profiled operator ``op`` (an ``aten::`` name) called from the
    course function ``function`` (the nearest :mod:`course_lib.fp8` frame above it, or None): a matrix
    product is ``matmul`` wherever it is called; the rest follows the function (the amax and its finite
    check, the scale from the amax, the scaled cast); anything else (autograd, views, bias) is ``other``."""
    if op in _MATMUL_OPS:
        return "matmul"
    return _GROUP_OF_FUNCTION.get(function or "", "other")


def grouped_self_times(events, device_type: str) -> dict[str, float]:
    """Self time (us) of the ``aten::`` operators among profiler ``events``, summed by :func:`operator_group`
    (the group of each from its nearest :mod:`course_lib.fp8` Python frame, found through ``cpu_parent``)."""
    totals = dict.fromkeys(LAYER_GROUPS, 0.0)
    for (group, _), us in self_times_by_operator(events, device_type).items():
        totals[group] += us
    return totals


def self_times_by_operator(events, device_type: str) -> dict[tuple[str, str], float]:
    """Self time (us) of each ``aten::`` operator among profiler ``events``, keyed by (its
    :func:`operator_group`, its name): what :func:`grouped_self_times` sums, one operator at a time."""
    totals: dict[tuple[str, str], float] = {}
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        parent, function = event.cpu_parent, None
        while parent is not None and function is None:
            match = _FP8_FRAME.search(parent.name)
            function = match.group(1) if match else None
            parent = parent.cpu_parent
        key = (operator_group(event.name, function), event.name)
        totals[key] = totals.get(key, 0.0) + self_time_us(event, device_type)
    return totals


@dataclass(frozen=True)
class Fp8LayerProfile:
    """Where one forward + backward of the course's FP8 layer spends its time: profiler self time (us,
    averaged over ``steps`` steps) per group of :data:`LAYER_GROUPS`, and the same BF16 ``nn.Linear``'s
    total self time measured the same way. ``[tokens, features] @ [features, features]``; GPU kernel time
    on a GPU, CPU time elsewhere. ``other_ops``: the operators of the ``other`` group, name to self time
    (us per step)."""

    device: str
    tokens: int
    features: int
    recipe: str
    backend: str
    steps: int
    self_us: dict[str, float]
    bf16_us: float
    other_ops: dict[str, float] = field(default_factory=dict)

    @property
    def total_us(self) -> float:
        return sum(self.self_us.values())

    def share(self, group: str) -> float:
        """The group's share of the layer's profiled time (0 to 1)."""
        if group not in LAYER_GROUPS:
            raise ValueError(f"unknown group {group!r}; the groups are {LAYER_GROUPS}")
        return self.self_us[group] / self.total_us if self.total_us > 0 else 0.0


def profile_fp8_layer(device: torch.device | str, *, features: int = 256, tokens: int = 512,
                      recipe: str = "tensorwise", steps: int = 2, seed: int = 0) -> Fp8LayerProfile:
    """Profile ``steps`` forward + backward steps (after two warm-up steps) of :class:`~course_lib.fp8.Fp8Linear`
    with BF16 inputs and outputs (``io_dtype=torch.bfloat16``, no bias) on ``torch._scaled_mm`` (the simulated
    backend where it does not run), and of a BF16 ``nn.Linear`` of the same shape."""
    from torch.profiler import profile as torch_profile

    device = torch.device(device)
    for name, value in (("features", features), ("tokens", tokens), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    if features % 16 or tokens % 16:
        raise ValueError(f"features and tokens must be multiples of 16 (FP8 matmuls need them), got "
                         f"{features} and {tokens}")
    backend = "scaled_mm" if scaled_mm_unsupported_reason(device, row_scales=recipe != "tensorwise") is None \
        else "simulated"
    gen = torch.Generator().manual_seed(seed)
    base = nn.Linear(features, features, bias=False)
    x = torch.randn(tokens, features, generator=gen).to(device, torch.bfloat16).requires_grad_(True)
    grad = torch.randn(tokens, features, generator=gen).to(device, torch.bfloat16)
    layers = {"fp8": Fp8Linear.from_linear(base, recipe=recipe, backend=backend, io_dtype=torch.bfloat16),
              "bf16": copy.deepcopy(base).to(device, torch.bfloat16)}
    totals, other = {}, {}
    for name, layer in layers.items():
        for _ in range(2):
            layer(x).backward(grad)
        with quiet_native_stderr(), torch_profile(activities=profiler_activities(device), with_stack=True) as prof:
            for _ in range(steps):   # the profiler synchronises the GPU when it stops
                layer(x).backward(grad)
        by_op = self_times_by_operator(prof.events(), device.type)
        totals[name] = {g: sum(us for (group, _), us in by_op.items() if group == g) / steps for g in LAYER_GROUPS}
        other[name] = {op: us / steps for (group, op), us in by_op.items() if group == "other"}
    return Fp8LayerProfile(str(device), tokens, features, recipe, backend, steps, totals["fp8"],
                           sum(totals["bf16"].values()), other["fp8"])


# ---- torchao float8, compiled, against BF16 ------------------------------------------------------------

BF16 = "BF16"
BF16_EAGER = "BF16 (eager)"
COURSE_EAGER = "course FP8 layer, tensorwise (eager)"
TORCHAO_RECIPES = ("tensorwise", "rowwise")


BREAK_EVEN = 0.01
"""A speed ratio within this fraction of 1 (0.99 to 1.01) is break-even: neither faster nor slower."""


def speed_class(ratio: float) -> str:
    """``"faster"``, ``"break-even"`` or ``"slower"`` for a ratio of BF16's time over FP8's (above 1: FP8 is
    faster); within :data:`BREAK_EVEN` of 1 it is break-even."""
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and ratio > 0):
        raise ValueError(f"a speed ratio must be a positive finite number, got {ratio!r}")
    if abs(ratio - 1) <= BREAK_EVEN + 1e-12:   # 0.99 and 1.01 themselves, despite binary rounding
        return "break-even"
    return "faster" if ratio > 1 else "slower"


def shape_label(tokens: int, features: int) -> str:
    """A square linear layer's shape for a table or an axis: "64 tokens, 128→128 features"."""
    return f"{tokens} tokens, {features}→{features} features"


def torchao_name(recipe: str) -> str:
    return f"torchao {recipe}"


def llama_hidden(width: int, multiple_of: int = 256) -> int:
    """The SwiGLU hidden width of a Llama block: 8/3 of ``width``, rounded up to ``multiple_of`` (11008 for
    4096, as in Llama 2 7B)."""
    return -(-int(8 * width / 3) // multiple_of) * multiple_of


class LlamaBlock(nn.Module):
    """A Llama-like transformer block on ``[batch, seq, width]``: RMSNorm, causal attention through
    ``F.scaled_dot_product_attention`` (heads of ``head_dim``; no rotary embedding, which moves no matrix
    product), RMSNorm, SwiGLU MLP of :func:`llama_hidden` width; seven linear layers, no biases."""

    def __init__(self, width: int, *, head_dim: int = 128):
        super().__init__()
        if width % head_dim:
            raise ValueError(f"width {width} is not a multiple of head_dim {head_dim}")
        hidden = llama_hidden(width)
        self.heads, self.head_dim = width // head_dim, head_dim
        self.attn_norm, self.mlp_norm = nn.RMSNorm(width), nn.RMSNorm(width)
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))
        self.gate, self.up = nn.Linear(width, hidden, bias=False), nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        h = self.attn_norm(x)
        q, k, v = (proj(h).view(b, s, self.heads, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, w))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def block_linear_shapes(width: int, tokens: int) -> list[tuple[int, int, int]]:
    """``(M, K, N)`` of the seven products of a :class:`LlamaBlock`'s linear layers on ``tokens`` tokens."""
    hidden = llama_hidden(width)
    return [(tokens, width, width)] * 4 + [(tokens, width, hidden)] * 2 + [(tokens, hidden, width)]


def prediction_gpu(device: torch.device | str) -> GPUPeaks | None:
    """The GPU the roofline predicts for: the GPU in use (its datasheet entry; None if the course has none),
    or on another device the H100 SXM5 of the page's roofline section."""
    device = torch.device(device)
    if device.type == "cuda":
        return find_gpu_peaks(torch.cuda.get_device_name(device))
    return DATASHEET_PEAKS["H100 SXM5"]


def predicted_speedup(gpu: GPUPeaks, shapes: list[tuple[int, int, int]], recipe: str) -> float:
    """The roofline's BF16 time over its FP8 time (unfused casts) summed over products of ``shapes``."""
    bf16, fp8 = gpu.peak("bf16"), gpu.peak("fp8")
    if bf16 is None or fp8 is None:
        raise ValueError(f"{gpu.name} lists no BF16 or no FP8 tensor-core peak")
    estimates = [predict_fp8_linear(m, k, n, bf16_tflops=bf16, fp8_tflops=fp8, bandwidth_gbs=gpu.bandwidth_gbs,
                                    recipe=recipe) for m, k, n in shapes]
    return sum(e.bf16_s for e in estimates) / sum(e.fp8_s for e in estimates)


@dataclass(frozen=True)
class Fp8CompiledSpeed:
    """Median seconds of a forward + backward in BF16 and in FP8, per implementation: square linear layers
    ``[tokens, n] @ [n, n]`` for each n of ``sizes`` (``linear_s[impl][n]``) and a :class:`LlamaBlock` of
    ``block_width`` on ``block_batch x block_seq`` tokens (``block_s[impl]``; width 0: not run).

    ``compiled``: the BF16 and torchao models ran under ``torch.compile`` (else eager, ``mode`` says why);
    the course's layer and :data:`BF16_EAGER` always run eager. ``skipped[impl]``: why one did not run.
    ``predicted_linear[recipe][n]`` / ``predicted_block[recipe]``: the roofline's FP8 speedup (unfused casts,
    the block's seven products only) on ``predicted_for``'s datasheet figures."""

    device: str
    compiled: bool
    mode: str
    tokens: int
    sizes: tuple[int, ...]
    block_width: int
    block_batch: int
    block_seq: int
    linear_s: dict[str, dict[int, float]]
    block_s: dict[str, float]
    skipped: dict[str, str]
    predicted_for: str
    predicted_linear: dict[str, dict[int, float]]
    predicted_block: dict[str, float]

    def baseline(self, implementation: str) -> str:
        """The BF16 timing an implementation is compared with: eager BF16 for the eager course layer where
        it was timed, else :data:`BF16`."""
        return BF16_EAGER if implementation == COURSE_EAGER and BF16_EAGER in self.linear_s else BF16

    def linear_speedup(self, implementation: str) -> dict[int, float]:
        """BF16's time over the implementation's, per size (above 1: FP8 is faster)."""
        base = self.linear_s.get(self.baseline(implementation), {})
        return {n: base[n] / s for n, s in self.linear_s.get(implementation, {}).items() if n in base}

    def block_speedup(self, implementation: str) -> float | None:
        if implementation not in self.block_s or BF16 not in self.block_s:
            return None
        return self.block_s[BF16] / self.block_s[implementation]


def _torchao_converter() -> tuple[Callable | None, str | None]:
    """torchao's float8 conversion as ``convert(model, recipe)`` (:func:`course_lib.fp8.torchao_float8`), or
    why it does not import."""
    try:
        torchao_float8()
    except ImportError as exc:  # torchao is optional on a GPU image
        return None, str(exc)
    return (lambda model, recipe: torchao_float8(recipe)(model)), None


def recipe_unsupported_reason(device: torch.device | str, recipe: str) -> str | None:
    """Why torchao's ``recipe`` cannot run on ``device`` (its ``_scaled_mm``), or None."""
    if recipe not in TORCHAO_RECIPES:
        raise ValueError(f"recipe must be one of {TORCHAO_RECIPES}, got {recipe!r}")
    return scaled_mm_unsupported_reason(device, row_scales=recipe != "tensorwise")


def _models(make: Callable[[], nn.Linear] | Callable[[], nn.Module], device: torch.device, *, course: bool) -> dict[str, nn.Module | str]:
    """The BF16 model and its FP8 versions by implementation name (a string: why it cannot run)."""
    base = make().to(device, torch.bfloat16)
    models: dict[str, nn.Module | str] = {BF16: base}
    convert, why_not = _torchao_converter()
    for recipe in TORCHAO_RECIPES:
        why = why_not or recipe_unsupported_reason(device, recipe)
        models[torchao_name(recipe)] = why if why else convert(copy.deepcopy(base), recipe)  # type: ignore[misc]
    if course:
        why = scaled_mm_unsupported_reason(device)
        linear = copy.deepcopy(base).float()
        assert isinstance(linear, nn.Linear), "the course layer replaces one nn.Linear"
        models[COURSE_EAGER] = why if why else Fp8Linear.from_linear(linear, backend="scaled_mm",
                                                                    io_dtype=torch.bfloat16)
    return models


def _time_forward_backward(model: Callable, x: torch.Tensor, grad: torch.Tensor, device: torch.device,
                           budget_s: float, warmup: int) -> float:
    def step():
        model(x).backward(grad)
    return time_function(step, device=device, budget_s=budget_s, warmup=warmup, min_repeats=3).median


def fp8_compiled_speed(device: torch.device | str, *, sizes=(256, 512), tokens: int = 512, block_width: int = 256,
                       block_batch: int = 1, block_seq: int = 256, compile: bool = False,
                       eager_reason: str = "", budget_s: float = 0.05, seed: int = 0) -> Fp8CompiledSpeed:
    """Time forward + backward of BF16 and torchao float8 (tensorwise, rowwise) square linear layers and a
    :class:`LlamaBlock`, each compiled (``compile``; the first calls of :func:`~course_lib.bench.time_function`'s
    warm-up compile) or eager (``eager_reason`` says why), and the course's layer eager beside the linear
    layers, with :func:`~course_lib.bench.time_function`. A recipe the device cannot run is recorded in
    ``skipped`` with the reason, as is one that fails."""
    device = torch.device(device)
    sizes = tuple(sizes)
    for n in (*sizes, tokens):
        if isinstance(n, bool) or not isinstance(n, int) or n < 16 or n % 16:
            raise ValueError(f"sizes and tokens must be ints, multiples of 16 (FP8 matmuls need them), got "
                             f"{sizes} and {tokens}")
    if not sizes:
        raise ValueError("fp8_compiled_speed needs at least one size")
    if block_width and (block_width % 16 or block_batch < 1 or block_seq < 1):
        raise ValueError(f"block_width must be 0 (no block) or a multiple of 16, with a positive batch and "
                         f"seq; got {block_width}, {block_batch}, {block_seq}")
    if compile and not hasattr(torch, "compile"):  # pragma: no cover - torch 2.11+ has it
        raise ValueError("this torch has no torch.compile")
    linear_s: dict[str, dict[int, float]] = {}
    block_s: dict[str, float] = {}
    skipped: dict[str, str] = {}
    gen = torch.Generator().manual_seed(seed)

    def run(name: str, model: nn.Module | str, x: torch.Tensor, grad: torch.Tensor, eager: bool) -> float | None:
        if isinstance(model, str):
            skipped[name] = model
            return None
        runnable: Callable = model
        if compile and not eager:
            torch.compiler.reset()   # a fresh cache per model: no recompilation limit across sizes
            runnable = torch.compile(model)
        try:
            # compiled: the first warm-up call compiles the forward and the backward, the next ones settle
            return _time_forward_backward(runnable, x.detach().requires_grad_(True), grad, device, budget_s,
                                          warmup=3 if compile else 2)
        except (RuntimeError, ValueError, AssertionError, NotImplementedError) as exc:
            skipped[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
            return None

    for n in sizes:
        x = torch.randn(tokens, n, generator=gen).to(device, torch.bfloat16)
        grad = torch.randn(tokens, n, generator=gen).to(device, torch.bfloat16)
        models = _models(lambda: nn.Linear(n, n, bias=False), device, course=True)
        if compile:
            models[BF16_EAGER] = copy.deepcopy(models[BF16])
        for name, model in models.items():
            seconds = run(name, model, x, grad, eager=name in (COURSE_EAGER, BF16_EAGER))
            if seconds is not None:
                linear_s.setdefault(name, {})[n] = seconds
    if block_width:
        shape = (block_batch, block_seq, block_width)
        x = torch.randn(*shape, generator=gen).to(device, torch.bfloat16)
        grad = torch.randn(*shape, generator=gen).to(device, torch.bfloat16)
        torch.manual_seed(seed)
        for name, model in _models(lambda: LlamaBlock(block_width, head_dim=min(128, block_width)), device,
                                   course=False).items():
            seconds = run(f"{name} (block)" if isinstance(model, str) else name, model, x, grad, eager=False)
            if seconds is not None:
                block_s[name] = seconds
    gpu = prediction_gpu(device)
    predicted_linear: dict[str, dict[int, float]] = {}
    predicted_block: dict[str, float] = {}
    if gpu is None:
        skipped["prediction"] = "the course has no datasheet figures for this GPU (hardware.DATASHEET_PEAKS)"
    else:
        for recipe in TORCHAO_RECIPES:
            predicted_linear[recipe] = {n: predicted_speedup(gpu, [(tokens, n, n)], recipe) for n in sizes}
            if block_width:
                predicted_block[recipe] = predicted_speedup(
                    gpu, block_linear_shapes(block_width, block_batch * block_seq), recipe)
    return Fp8CompiledSpeed(str(device), bool(compile), "torch.compile" if compile else f"eager: {eager_reason}"
                            if eager_reason else "eager", tokens, sizes, block_width, block_batch, block_seq,
                            linear_s, block_s, skipped, gpu.name if gpu else "", predicted_linear, predicted_block)


def compiled_speed_parameters(profile, device: torch.device | str) -> dict:
    """The registry's parameters of :func:`fp8_compiled_speed` for a size ``profile`` on ``device``: at full
    size, layers 4096 and 8192 wide on 16384 tokens and a 4096-wide Llama block on 2 x 4096 tokens (three
    shapes, each compiled for BF16 and two FP8 recipes; not yet timed on a GPU, where compiling takes most of
    the time, so the full size keeps two layer widths); small, layers of a few dozen features. Compiled on
    a GPU; eager elsewhere, where inductor's C++ compilation of each model takes longer than this whole
    study may take in a lesson."""
    compiled = torch.device(device).type == "cuda"
    return {"sizes": profile.pick(small=(64, 128), full=(4096, 8192)),
            "tokens": profile.pick(small=64, full=16384),
            "block_width": profile.pick(small=64, full=4096), "block_batch": profile.pick(small=1, full=2),
            "block_seq": profile.pick(small=32, full=4096), "compile": compiled,
            "eager_reason": "" if compiled else ("torch.compile on a CPU compiles C++ for every model, which takes "
                                                 "longer than this whole study may take in a lesson"),
            "budget_s": profile.pick(small=0.05, full=0.2)}
