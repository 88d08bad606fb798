"""Overflow in FP16, shown by running it, and the safe forms that avoid it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .formats import get_format


@dataclass(frozen=True)
class SoftmaxOverflow:
    """Softmax of ``logits`` in FP16: the naive ``exp(x)/sum(exp(x))`` against the safe forms."""

    logits: tuple[float, ...]
    exp_fp16: tuple[float, ...]          # exp(x) in FP16: inf past log(65504)
    naive_fp16: tuple[float, ...]        # exp(x) / sum(exp(x)) in FP16
    max_subtracted_fp16: tuple[float, ...]  # exp(x - max) / sum(...) in FP16: the log-sum-exp trick
    torch_softmax_fp16: tuple[float, ...]   # F.softmax on the FP16 tensor
    reference_fp64: tuple[float, ...]
    naive_cross_entropy_fp16: float      # -log(naive softmax[target])
    torch_cross_entropy_fp16: float      # F.cross_entropy on FP16 logits (computed in FP32 under the hood)
    largest_safe_exp_input: float        # log(FP16 max): exp overflows above it


def softmax_overflow(logits=(2.0, 8.0, 12.0), target: int = 2, device: torch.device | str = "cpu") -> SoftmaxOverflow:
    """Run softmax and cross-entropy on ``logits`` in FP16, naively and safely."""
    if not 0 <= target < len(logits):
        raise ValueError(f"target must index the logits, got {target}")
    x = torch.tensor(logits, dtype=torch.float16, device=device)
    e = torch.exp(x)
    naive = e / e.sum()
    shifted = torch.exp(x - x.max())
    safe = shifted / shifted.sum()
    ref = torch.softmax(torch.tensor(logits, dtype=torch.float64), dim=0)
    naive_ce = -torch.log(naive[target])
    torch_ce = F.cross_entropy(x.float()[None].to(torch.float16), torch.tensor([target], device=device))
    as_tuple = lambda t: tuple(float(v) for v in t.float().cpu())  # noqa: E731
    return SoftmaxOverflow(tuple(float(v) for v in logits), as_tuple(e), as_tuple(naive), as_tuple(safe),
                           as_tuple(F.softmax(x, dim=0)), as_tuple(ref), float(naive_ce),
                           float(torch_ce), math.log(get_format("FP16").max_finite))


@dataclass(frozen=True)
class MatmulOverflow:
    """A dot product whose exact value passes FP16's maximum, in several precisions."""

    n: int
    value: float
    exact: float
    results: dict[str, float]


def matmul_overflow(n: int = 4096, value: float = 4.5, device: torch.device | str = "cpu") -> MatmulOverflow:
    """``a @ b`` for ``a`` a ``1 x n`` row and ``b`` an ``n x 1`` column of ``value``: exact ``n*value**2``.

    Every input is an ordinary FP16 number; only the result is too large for FP16."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    device = torch.device(device)
    a32 = torch.full((1, n), value, device=device)
    b32 = torch.full((n, 1), value, device=device)
    results = {
        "FP32": float(a32 @ b32),
        "FP16": float((a32.half() @ b32.half()).float()),
        "BF16": float((a32.bfloat16() @ b32.bfloat16()).float()),
    }
    with torch.autocast(device.type, dtype=torch.float16 if device.type == "cuda" else torch.bfloat16):
        results["autocast " + ("FP16" if device.type == "cuda" else "BF16")] = float((a32 @ b32).float())
    results["FP16, inputs scaled by 1/16"] = float(((a32 / 16).half() @ (b32 / 16).half()).float()) * 256
    return MatmulOverflow(n, value, n * value * value, results)


@dataclass(frozen=True)
class ActivationOverflow:
    """A BF16 model with one large activation channel, run in BF16 and in FP16."""

    largest_activation_bf16: float
    loss_bf16: float
    loss_fp16: float
    nonfinite_fp16_outputs: int
    fp16_max: float


def bf16_model_in_fp16(channel_gain: float = 2.0**21, device: torch.device | str = "cpu", seed: int = 0) -> ActivationOverflow:
    """The course GPT (small shape) in BF16 with one residual channel amplified by ``channel_gain``,
    a stand-in for the very large activations some BF16-pretrained models develop, then run in FP16.

    The amplification is planted (and said so): a BF16 model never sees FP16's limit, so nothing in its
    training keeps activations below 65504.
    """
    from .data import BatchSampler, load_corpus
    from .device import SizeProfile
    from .models import build_gpt, gpt_config_for

    device = torch.device(device)
    cfg = gpt_config_for(SizeProfile("small"))
    model = build_gpt(cfg, seed=seed, device=device)
    with torch.no_grad():
        model.blocks[0].out.weight[0].mul_(channel_gain)  # type: ignore[union-attr,index]  # one MLP output channel
    x, y = BatchSampler(load_corpus(100_000), 4, cfg.context, seed=seed).batch(0, device)
    largest = [0.0]
    hook = model.blocks[0].register_forward_hook(
        lambda _m, _i, out: largest.__setitem__(0, max(largest[0], float(out.detach().abs().float().max()))))
    try:
        with torch.no_grad():
            _, loss_bf16 = model.to(torch.bfloat16)(x, y)
            largest_bf16 = largest[0]
            logits16, loss_fp16 = model.to(torch.float16)(x, y)
    finally:
        hook.remove()
    return ActivationOverflow(largest_bf16, float(loss_bf16.float()), float(loss_fp16.float()),
                              int((~torch.isfinite(logits16)).sum()), get_format("FP16").max_finite)


@dataclass(frozen=True)
class FP16FineTune:
    """Fine-tuning the planted BF16 model with FP16 autocast and GradScaler: per step, loss, scale and
    whether the step was skipped."""

    losses: tuple[float, ...]
    scales: tuple[float, ...]
    skipped: tuple[bool, ...]


def finetune_bf16_model_in_fp16(steps: int = 8, channel_gain: float = 2.0**21, device: torch.device | str = "cpu",
                                seed: int = 0, recipe: str = "fp16_autocast_scaler") -> FP16FineTune:
    """The model of :func:`bf16_model_in_fp16`, fine-tuned with FP16 autocast and a GradScaler (or with
    another ``recipe`` of :mod:`course_lib.train`, e.g. ``"bf16_autocast"``, the fix).

    With FP16 the overflow is in the forward activations, not the gradients, so no loss scale can help:
    the loss is NaN at every step, every step is skipped and the scale only backs off."""
    from .data import BatchSampler, load_corpus
    from .device import SizeProfile
    from .models import build_gpt, gpt_config_for
    from .train import TrainConfig, TrainState, get_recipe, train

    device = torch.device(device)
    cfg = gpt_config_for(SizeProfile("small"))
    model = build_gpt(cfg, seed=seed, device=device)
    with torch.no_grad():
        model.blocks[0].out.weight[0].mul_(channel_gain)  # type: ignore[union-attr,index]
    sampler = BatchSampler(load_corpus(100_000), 4, cfg.context, seed=seed)
    state = TrainState(model, get_recipe(recipe, device),
                       TrainConfig(steps=steps, lr=1e-4, clip_norm=None), device)
    history = train(state, sampler)
    losses, scales, skipped = history.losses, history.scales, history.skipped
    return FP16FineTune(tuple(losses), tuple(scales), tuple(skipped))
