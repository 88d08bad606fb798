"""Lesson 5's studies: convergence of the recipes over seeds, BF16 weight-update stagnation and its repairs,
a model with activations only BF16 holds (lesson 2's planted stand-in), fine-tuned in FP16."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..bf16 import UPDATE_RULES, BF16AdamW
from ..data import BatchSampler, load_corpus
from ..device import SizeProfile
from ..models import build_gpt, course_setup, gpt_config_for
from ..train import TrainConfig, TrainState, get_recipe, run_recipe, train


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


@dataclass(frozen=True)
class UpdateComparison:
    """Training curves of the course model with BF16 weights under each way of applying the update, against
    FP32, over seeds: ``curves[label][i]`` for ``seeds[i]``; ``lost_fraction[label][i][t]``: the share of
    weights whose non-zero update was lost at step t (the BF16AdamW runs only)."""

    lr: float
    seeds: tuple[int, ...]
    steps: int
    curves: dict[str, tuple[tuple[float, ...], ...]]
    lost_fraction: dict[str, tuple[tuple[float, ...], ...]]
    eval_losses: dict[str, tuple[float, ...]]

    @property
    def recipes(self) -> tuple[str, ...]:
        return tuple(self.curves)

    def final(self, label: str, tail: int = 10) -> tuple[float, ...]:
        """Per seed, the mean training loss over the last ``tail`` steps (computed in the run's own precision:
        a BF16 run's loss is itself rounded, see ``eval_losses``)."""
        return tuple(sum(c[-tail:]) / len(c[-tail:]) for c in self.curves[label])


EVAL_BATCHES = 4


@torch.no_grad()
def fp32_eval_loss(model: torch.nn.Module, sampler, device, steps) -> float:
    """The mean loss of ``model``'s weights as stored, evaluated in FP32 arithmetic (on a copy) on the
    sampler's batches at ``steps``: one yardstick for runs whose own losses were computed in different
    precisions."""
    import copy

    twin = copy.deepcopy(model).float().eval()
    losses = [float(twin(*sampler.batch(step, device))[1]) for step in steps]
    return sum(losses) / len(losses)


def _host(values: list[torch.Tensor]) -> list:
    """0-d device tensors as Python numbers, in one transfer."""
    return torch.stack(values).tolist() if values else []


UPDATE_LABELS = {"nearest": "BF16, round to nearest (no master)", "stochastic": "BF16, stochastic rounding",
                 "kahan": "BF16, Kahan-compensated"}


def update_rule_bytes(rule: str) -> dict[str, int]:
    """Persistent bytes per parameter of a BF16 weight trained with :class:`~course_lib.bf16.BF16AdamW`'s
    ``rule``, measured after one step on a small BF16 parameter: the weight, its gradient, and the optimizer
    state the step left (its FP32 moments and, for ``"kahan"``, the BF16 compensation buffer; per-parameter
    counters are not per-weight bytes). Keys as :func:`course_lib.memory.bytes_per_parameter`'s."""
    if rule not in UPDATE_RULES:
        raise ValueError(f"rule must be one of {UPDATE_RULES}, got {rule!r}")
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    weight.grad = torch.ones_like(weight)
    opt = BF16AdamW([weight], update_rule=rule)
    opt.step()
    state = [t for t in opt.state[weight].values() if isinstance(t, torch.Tensor) and t.shape == weight.shape]
    return {"weights": weight.element_size(), "gradients": weight.grad.element_size(),
            "optimizer_state": sum(t.element_size() for t in state), "master_weights": 0}


def adamw_moment_dtype(param_dtype: torch.dtype) -> torch.dtype:
    """The dtype of the moments ``torch.optim.AdamW`` keeps for a parameter of ``param_dtype``, measured
    after one step (torch keeps them in the parameter's dtype: BF16 moments for ``bf16_pure``)."""
    if not isinstance(param_dtype, torch.dtype) or not param_dtype.is_floating_point:
        raise TypeError(f"param_dtype must be a floating torch.dtype, got {param_dtype!r}")
    weight = torch.nn.Parameter(torch.ones(4, dtype=param_dtype))
    weight.grad = torch.ones_like(weight)
    opt = torch.optim.AdamW([weight])
    opt.step()
    return opt.state[weight]["exp_avg"].dtype


def compare_bf16_updates(profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                         lr: float = 3e-4, seeds=(0, 1, 2)) -> UpdateComparison:
    """Train the course GPT, per seed from one initialisation and on the same batches: FP32 (reference),
    BF16 weights with FP32 master weights, and BF16 weights updated by :class:`BF16AdamW` with each update
    rule."""
    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints, got {seeds!r}")
    curves: dict[str, list] = {}
    lost: dict[str, list] = {}
    evals: dict[str, list] = {}
    n_steps = 0
    for seed in seeds:
        setup = course_setup(profile, device, steps=steps, default_steps=(45, 80), seed=seed)
        n_steps = setup.steps
        held_out = range(n_steps, n_steps + EVAL_BATCHES)      # batches no run trained on
        for label, recipe in (("FP32", "fp32"), ("BF16 + FP32 master weights", "bf16_master")):
            state = TrainState(setup.model(seed), get_recipe(recipe),
                               TrainConfig(steps=setup.steps, lr=lr, clip_norm=None), setup.device)
            curves.setdefault(label, []).append(tuple(train(state, setup.sampler).losses))
            evals.setdefault(label, []).append(fp32_eval_loss(state.model, setup.sampler, setup.device, held_out))
        for rule in UPDATE_RULES:
            model = setup.model(seed).to(torch.bfloat16)
            opt = BF16AdamW(model.parameters(), lr=lr, update_rule=rule, seed=seed)
            run_losses, run_lost = [], []   # device tensors, read back once after the run
            params = list(model.parameters())
            n = sum(p.numel() for p in params)
            for step in range(setup.steps):
                x, y = setup.sampler.batch(step, setup.device)
                opt.zero_grad(set_to_none=True)
                _, loss = model(x, y)
                loss.backward()
                opt.step()
                run_losses.append(loss.detach().float())
                run_lost.append(torch.stack([opt.state[p]["lost"] for p in params]).sum())
            curves.setdefault(UPDATE_LABELS[rule], []).append(tuple(_host(run_losses)))
            lost.setdefault(UPDATE_LABELS[rule], []).append(tuple(c / n for c in _host(run_lost)))
            evals.setdefault(UPDATE_LABELS[rule], []).append(fp32_eval_loss(model, setup.sampler, setup.device,
                                                                            held_out))
    return UpdateComparison(lr, seeds, n_steps, {k: tuple(v) for k, v in curves.items()},
                            {k: tuple(v) for k, v in lost.items()}, {k: tuple(v) for k, v in evals.items()})


@dataclass(frozen=True)
class Parity:
    """Final losses per recipe over several seeds (mean of the last ``tail`` steps of each run)."""

    recipes: tuple[str, ...]
    seeds: tuple[int, ...]
    final_losses: dict[str, tuple[float, ...]]
    curves: dict[str, tuple[float, ...]]   # the first seed's loss curve per recipe
    tail: int = 5                          # records made before the field used convergence_parity's default, 5

    @property
    def steps(self) -> int:
        """Steps per run (the length of the first seed's curves; 0 where none were kept)."""
        return max((len(c) for c in self.curves.values()), default=0)

    @property
    def final_steps(self) -> int:
        """How many last steps a final loss averaged: ``tail``, or every step of a shorter run."""
        return min(self.tail, self.steps) if self.steps else self.tail

    def mean(self, recipe: str) -> float:
        v = self.final_losses[recipe]
        return sum(v) / len(v)

    def spread(self, recipe: str) -> float:
        """Sample standard deviation over seeds (0 for a single seed)."""
        v = self.final_losses[recipe]
        if len(v) < 2:
            return 0.0
        m = self.mean(recipe)
        return math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1))


def convergence_parity(profile, device: torch.device | str = "cpu", *,
                       recipes=("fp32", "fp16_autocast_scaler", "bf16_autocast", "fp16_autocast_no_scaler"),
                       seeds=(0, 1, 2), steps: int | None = None, tail: int = 5, lr: float = 3e-3) -> Parity:
    """Train the course model with each recipe from each seed (model init and batches both follow it)."""
    if tail < 1:
        raise ValueError(f"tail must be at least 1, got {tail}")
    if not seeds or not recipes:
        raise ValueError("convergence_parity needs at least one seed and one recipe")
    finals: dict[str, tuple[float, ...]] = {}
    curves: dict[str, tuple[float, ...]] = {}
    for name in recipes:
        values = []
        for seed in seeds:
            h = run_recipe(name, profile, device, steps=steps, seed=seed, lr=lr)
            values.append(sum(h.losses[-tail:]) / len(h.losses[-tail:]))
            curves.setdefault(name, tuple(h.losses))
        finals[name] = tuple(values)
    return Parity(tuple(recipes), tuple(seeds), finals, curves, tail)

