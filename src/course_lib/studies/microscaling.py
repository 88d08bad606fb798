"""Lesson 8's studies: error against block size, scale choices and modes, MX and NVFP4 training over seeds,
and the NVFP4 recipe's pieces measured on the gradient."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..fp8 import QuantizationError, as_2d, block_amax, resolve_block
from ..models import course_setup
from ..mx.blocks import BlockScaling, block_error, e8m0_exponents, element_format, element_key
from ..mx.linear import block_recipe, convert_to_block_scaled
from ..train import RECIPES
from .fp8 import Fp8Training, seeded_curves, train_converted


@dataclass(frozen=True)
class BlockSizeStudy:
    """``errors[element][tensor][block]``: the :class:`QuantizationError` of E8M0-scaled blocks of each size
    (``"tensor"``: one scale for the whole tensor) on each tensor, for each scale mode."""

    elements: tuple[str, ...]
    tensors: tuple[str, ...]
    blocks: tuple[str, ...]
    mode: str
    errors: dict[str, dict[str, dict[str, QuantizationError]]]


def block_size_study(tensors: dict[str, torch.Tensor], *, elements=("e4m3", "e2m1"), blocks=(1, 16, 32, 64, -1),
                     mode: str = "rceil", skip_columns: dict[str, tuple[int, ...]] | None = None) -> BlockSizeStudy:
    """Relative error, saturation and flushing of MX quantisation (E8M0 scales, ``mode``) against the block
    size along the last dimension (``-1``: one scale for the whole tensor). ``skip_columns[name]``: columns
    of that tensor left out of its measures (see :func:`block_error`)."""
    skip_columns = skip_columns or {}
    if not tensors or not elements or not blocks:
        raise ValueError("block_size_study needs tensors, element formats and block sizes")
    labels = tuple("tensor" if b == -1 else str(b) for b in blocks)
    errors: dict[str, dict[str, dict[str, QuantizationError]]] = {}
    for element in elements:
        errors[element] = {}
        for t, x in tensors.items():
            errors[element][t] = {}
            for b, lab in zip(blocks, labels):
                scaling = BlockScaling(element, b, block_rows=-1 if b == -1 else 1, mode=mode)
                errors[element][t][lab] = block_error(x, scaling, label=lab, skip_columns=skip_columns.get(t, ()))
    return BlockSizeStudy(tuple(elements), tuple(tensors), labels, mode, errors)


def nvfp4_scale_choices() -> dict[str, BlockScaling]:
    """The FP4 block-scale choices the lesson compares, by display name."""
    return {
        "MXFP4: 1x32, E8M0 scale": BlockScaling("e2m1", 32, scale_format="e8m0", mode="rceil"),
        "1x16, E8M0 scale": BlockScaling("e2m1", 16, scale_format="e8m0", mode="rceil"),
        "1x16, E4M3 scale, no tensor scale": BlockScaling("e2m1", 16, scale_format="e4m3"),
        "NVFP4: 1x16, E4M3 scale + FP32 tensor scale": BlockScaling("e2m1", 16, scale_format="e4m3",
                                                                    tensor_scale=True),
        "1x16, exact FP32 scale (ideal)": BlockScaling("e2m1", 16, scale_format="fp32"),
    }


@dataclass(frozen=True)
class ModeComparison:
    """FLOOR against RCEIL scale selection on one tensor and element format: per mode the error, share of
    elements saturated and ``top_saturated``, the share of *all* blocks whose largest value the clamp changed
    (it scaled to at least max plus half the top spacing); ``examples``: a few blocks where the two modes
    choose different scales (amax, each mode's exponent and each mode's largest element)."""

    element: str
    block: int
    blocks_differ: float
    errors: dict[str, QuantizationError]
    top_saturated: dict[str, float]
    examples: tuple[dict[str, float], ...]


def compare_scale_modes(x: torch.Tensor, *, element: str = "e2m1", block: int = 32,
                        modes=("floor", "rceil"), n_examples: int = 4) -> ModeComparison:
    """Quantise ``x`` with each E8M0 scale ``mode`` and compare, block by block."""
    if len(modes) < 2:
        raise ValueError("compare_scale_modes needs two modes")
    x2 = as_2d(x, "x").detach().float()
    f = element_format(element)
    amax = block_amax(x2, resolve_block((1, block), tuple(x2.shape)))
    exps = {m: e8m0_exponents(amax, element, m) for m in modes}
    differ = exps[modes[0]] != exps[modes[1]]
    errors, top_sat, largest = {}, {}, {}
    for m in modes:
        scaling = BlockScaling(element, block, scale_format="e8m0", mode=m)
        errors[m] = block_error(x2, scaling, label=m)
        q = scaling.quantize(x2)
        # the element holding each block's amax, as stored (its magnitude)
        top = q.elements.abs().reshape(x2.shape[0], -1, block).amax(-1)
        largest[m] = top
        # the clamp changed the block's largest value: it scaled beyond max plus half the top spacing (below
        # that it rounds to max anyway)
        boundary = f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
        top_sat[m] = float(((amax / q.scales) >= boundary).float().mean())
    idx = torch.nonzero(differ.reshape(-1)).reshape(-1)[:n_examples]
    examples = []
    for i in idx.tolist():
        row = {"amax": float(amax.reshape(-1)[i])}
        for m in modes:
            row[f"{m} exponent"] = int(exps[m].reshape(-1)[i])
            row[f"{m} largest element"] = float(largest[m].reshape(-1)[i])
            row[f"{m} amax / scale"] = float(amax.reshape(-1)[i] / 2.0 ** int(exps[m].reshape(-1)[i]))
        examples.append(row)
    return ModeComparison(element_key(element), block, float(differ.float().mean()), errors, top_sat,
                          tuple(examples))


def train_block_scaled(recipe: str, profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                       seed: int = 0, lr: float = 3e-3):
    """Train the course GPT with block-scaled linear layers (``recipe``, see :func:`block_recipe`) or with a
    plain precision recipe (see :func:`~course_lib.studies.fp8.train_converted`). Returns the History."""
    return train_converted(recipe, lambda model: convert_to_block_scaled(model, recipe, seed=seed),
                           profile, device, steps=steps, seed=seed, lr=lr)


def block_scaled_training(profile, device: torch.device | str = "cpu", *,
                          recipes=("bf16_autocast", "mxfp8", "mxfp4", "nvfp4"), seeds=(0, 1, 2),
                          steps: int | None = None, lr: float = 3e-3):
    """Loss curves of :func:`train_block_scaled` per recipe and seed, as a
    :class:`course_lib.studies.fp8.Fp8Training` (``block``: NVFP4's 16)."""
    if not recipes or not seeds:
        raise ValueError("block_scaled_training needs at least one recipe and one seed")
    for r in recipes:
        if r not in RECIPES:
            block_recipe(r)
    curves, n_steps = seeded_curves(lambda recipe, seed: train_block_scaled(recipe, profile, device, steps=steps,
                                                                            seed=seed, lr=lr), recipes, seeds)
    return Fp8Training(tuple(recipes), tuple(seeds), n_steps, 16, curves)


@dataclass(frozen=True)
class GradientFidelity:
    """How far each recipe's gradient of the course model is from the exact FP32 gradient at the same
    weights and batch (relative L2 error over all parameters), on ``batches`` batches.

    ``single[recipe][b]``: on batch ``b``, the mean error of one gradient (of ``draws`` independent ones;
    they differ only where a recipe rounds stochastically). ``averaged[recipe][i]``: the error of the mean
    of ``ks[i]`` draws (over the disjoint groups of that many, and over batches; ``ks[0]`` = 1 equals the mean
    of ``single``): it falls like ``1/sqrt(k)`` for the part of the error
    that stochastic rounding makes unbiased, and levels off at the rest."""

    recipes: tuple[str, ...]
    steps: int
    batches: int
    ks: tuple[int, ...]
    single: dict[str, tuple[float, ...]]
    averaged: dict[str, tuple[float, ...]]


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters() if p.grad is not None])


def gradient_fidelity(profile, device: torch.device | str = "cpu", *,
                      recipes=("mxfp8", "mxfp4", "mxfp4_hp_last", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht",
                               "nvfp4_no_2d", "nvfp4_no_hp_last"), draws: int = 8, batches: int = 3, steps: int | None = None,
                      seed: int = 0, lr: float = 3e-3) -> GradientFidelity:
    """Train the course GPT in FP32 for ``steps`` steps, then on each of the next ``batches`` batches compute
    the gradient exactly and ``draws`` times with each block-scaled ``recipe`` (a recipe without stochastic
    rounding gives the same gradient every time, so it is computed once per batch)."""
    import copy


    for name, v in (("draws", draws), ("batches", batches)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if not recipes:
        raise ValueError("gradient_fidelity needs at least one recipe")
    for r in recipes:
        block_recipe(r)
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 300), seed=seed)
    model = setup.model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(setup.steps):
        x, y = setup.sampler.batch(step, setup.device)
        opt.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
        opt.step()
    ks = tuple(k for k in (1, 2, 4, 8, 16, 32, 64) if k <= draws)
    single: dict[str, list[float]] = {r: [] for r in recipes}
    averaged: dict[str, list[list[float]]] = {r: [] for r in recipes}
    converted = {r: convert_to_block_scaled(copy.deepcopy(model), r, seed=seed) for r in recipes}
    for b in range(batches):
        x, y = setup.sampler.batch(setup.steps + b, setup.device)
        model.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
        exact = _flat_grad(model)
        norm = float(torch.linalg.vector_norm(exact))
        for recipe, m in converted.items():
            n = draws if block_recipe(recipe).stochastic_gradients else 1
            grads = []
            for _ in range(n):
                m.zero_grad(set_to_none=True)
                m(x, y)[1].backward()
                grads.append(_flat_grad(m))
            grads += [grads[0]] * (draws - n)
            stacked = torch.stack(grads)
            single[recipe].append(sum(float(torch.linalg.vector_norm(g - exact)) for g in grads) / draws / norm)
            # the error of the mean of k draws, averaged over the draws // k disjoint groups of k
            averaged[recipe].append([
                sum(float(torch.linalg.vector_norm(stacked[g * k:(g + 1) * k].mean(0) - exact))
                    for g in range(draws // k)) / (draws // k) / norm for k in ks])
    return GradientFidelity(tuple(recipes), setup.steps, batches, ks, {r: tuple(v) for r, v in single.items()},
                            {r: tuple(sum(col) / batches for col in zip(*v)) for r, v in averaged.items()})
