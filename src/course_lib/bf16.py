"""BF16 against FP16: update stagnation and its fixes, and which format a device should train in.

* :func:`stochastic_round_bf16`: round FP32 to BF16 up or down at random, with probability proportional
  to the distance, so that the rounding is unbiased on average.
* :class:`BF16AdamW`: AdamW for BF16 parameters with FP32 optimizer state, whose update is written back
  to the BF16 weights by round-to-nearest, stochastic rounding, or Kahan-compensated summation.
* :func:`precision_advice`: the recipe a device should use, from its compute capability (tested for
  V100, A100 and H100), not typed into a table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .hardware import capability_unsupported_reason

UPDATE_RULES = ("nearest", "stochastic", "kahan")


def stochastic_round_bf16(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Round an FP32 tensor to BF16 stochastically: each value goes to one of its two BF16 neighbours,
    the upper with probability equal to its distance from the lower over the gap. Exact BF16 values, inf
    and NaN are unchanged. Implemented on the bits: add a uniform random 16-bit integer to the FP32 bit
    pattern and truncate the low 16 bits."""
    if not isinstance(x, torch.Tensor) or x.dtype != torch.float32:
        raise TypeError("stochastic_round_bf16 takes a float32 tensor")
    bits = x.contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator)
    rounded = ((bits + noise) & ~0xFFFF).view(torch.float32)
    keep = ~torch.isfinite(x)
    return torch.where(keep, x, rounded).to(torch.bfloat16)


class BF16AdamW(torch.optim.Optimizer):
    """AdamW for BF16 parameters, with FP32 moments, and a choice of how the update reaches the weights.

    ``update_rule``: ``"nearest"`` (plain BF16 arithmetic: small updates round away), ``"stochastic"``
    (stochastic rounding: small updates survive on average), or ``"kahan"`` (a BF16 compensation buffer
    carries the part of each update the weight could not absorb into the next step).

    ``state["lost"]`` (per parameter) counts entries whose computed update was non-zero but whose BF16
    weight did not change at the last step.
    """

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, update_rule: str = "nearest", seed: int = 0):
        if update_rule not in UPDATE_RULES:
            raise ValueError(f"update_rule must be one of {UPDATE_RULES}, got {update_rule!r}")
        if not lr > 0:
            raise ValueError(f"lr must be positive, got {lr}")
        # the same checks torch.optim.AdamW makes
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2 and all(0.0 <= b < 1.0 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be non-negative, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be non-negative, got {weight_decay}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.update_rule = update_rule
        self.generator = torch.Generator().manual_seed(seed)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype != torch.bfloat16:
                    raise TypeError(f"BF16AdamW updates bfloat16 parameters, got {p.dtype}")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["m"] = torch.zeros_like(p, dtype=torch.float32)
                    state["v"] = torch.zeros_like(p, dtype=torch.float32)
                    if self.update_rule == "kahan":
                        state["compensation"] = torch.zeros_like(p)  # BF16, like the weights
                state["step"] += 1
                g = p.grad.float()
                state["m"].mul_(beta1).add_(g, alpha=1 - beta1)
                state["v"].mul_(beta2).addcmul_(g, g, value=1 - beta2)
                m_hat = state["m"] / (1 - beta1 ** state["step"])
                v_hat = state["v"] / (1 - beta2 ** state["step"])
                w = p.float()
                delta = -group["lr"] * (m_hat / (v_hat.sqrt() + group["eps"]) + group["weight_decay"] * w)
                if self.update_rule == "nearest":
                    new = (w + delta).to(torch.bfloat16)
                elif self.update_rule == "stochastic":
                    new = stochastic_round_bf16(w + delta, self.generator if p.device.type == "cpu" else None)
                else:
                    wanted = w + delta + state["compensation"].float()
                    new = wanted.to(torch.bfloat16)
                    state["compensation"] = (wanted - new.float()).to(torch.bfloat16)
                state["lost"] = int(((delta != 0) & (new == p)).sum())
                p.copy_(new)
        return loss


@dataclass(frozen=True)
class Advice:
    """What to train in on a device: ``recipe`` (a :mod:`course_lib.train` recipe name) and why."""

    device: str
    recipe: str
    why: str
    also: tuple[str, ...] = ()


# (name, compute capability) of the GPUs the lesson asks about
REFERENCE_GPUS = (("V100", (7, 0)), ("T4", (7, 5)), ("A100", (8, 0)), ("H100", (9, 0)))


def precision_advice(compute_capability: tuple[int, int] | None, *, cpu_bf16_speedup: float | None = None,
                     name: str = "") -> Advice:
    """The recipe to train in, from the hardware's capabilities.

    GPUs: compute capability 8.0 and newer have BF16 tensor cores (BF16 autocast, no scaler needed; TF32
    for FP32 products); 7.x have FP16 tensor cores only (FP16 autocast with GradScaler); 8.9 and newer add
    FP8 tensor cores. CPUs (``compute_capability`` None): decided by ``cpu_bf16_speedup``, BF16 matmul
    throughput over FP32's *measured* on that CPU (:func:`course_lib.bench.capability_probe`), never by
    its instruction flags: BF16 autocast where BF16 matmuls measured at least 1.1x FP32, else FP32.
    """
    if compute_capability is None:
        label = name or "CPU"
        if cpu_bf16_speedup is None:
            return Advice(label, "fp32", "BF16 speed on this CPU was not measured; FP32 is the safe default")
        if not cpu_bf16_speedup > 0:
            raise ValueError(f"cpu_bf16_speedup must be a positive ratio, got {cpu_bf16_speedup!r}")
        if cpu_bf16_speedup >= 1.1:
            return Advice(label, "bf16_autocast",
                          f"BF16 matmuls measured {cpu_bf16_speedup:.2f}x FP32's throughput here; a whole "
                          f"training step gains less ({{doc}}`06_performance_memory` measures it)")
        return Advice(label, "fp32", f"BF16 matmuls measured {cpu_bf16_speedup:.2f}x FP32's throughput here: "
                                     f"low precision brings no speed on this CPU")
    if (not isinstance(compute_capability, tuple) or len(compute_capability) != 2
            or not all(isinstance(v, int) for v in compute_capability)):
        raise TypeError(f"compute_capability is a (major, minor) tuple of ints, got {compute_capability!r}")
    label = name or f"GPU sm {compute_capability[0]}.{compute_capability[1]}"
    if capability_unsupported_reason("bf16", compute_capability) is None:
        also = ["tf32 for FP32 matmuls", "fp16_autocast_scaler"]
        if capability_unsupported_reason("fp8", compute_capability) is None:
            also.append("FP8")
        return Advice(label, "bf16_autocast", "BF16 tensor cores: FP32's range, so no loss scaling", tuple(also))
    if capability_unsupported_reason("fp16", compute_capability) is None:
        return Advice(label, "fp16_autocast_scaler", "FP16 tensor cores but no native BF16: FP16 needs "
                                                     "loss scaling for its narrow range")
    return Advice(label, "fp32", "no tensor cores: mixed precision saves memory but little time")


def advice_for_this_machine(device: torch.device | str | None = None) -> Advice:
    """:func:`precision_advice` for the detected hardware."""
    from .device import describe_hardware

    hw = describe_hardware(device)
    if hw.device_type == "cuda":
        major, minor = (int(v) for v in str(hw.compute_capability).split("."))
        return precision_advice((major, minor), name=hw.name)
    from .bench import capability_probe

    return precision_advice(None, cpu_bf16_speedup=capability_probe(hw.device_type).relative("bf16"), name=hw.name)


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


UPDATE_LABELS = {"nearest": "BF16, round to nearest (no master)", "stochastic": "BF16, stochastic rounding",
                 "kahan": "BF16, Kahan-compensated"}


def compare_bf16_updates(profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                         lr: float = 3e-4, seeds=(0, 1, 2)) -> UpdateComparison:
    """Train the course GPT, per seed from one initialisation and on the same batches: FP32 (reference),
    BF16 weights with FP32 master weights, and BF16 weights updated by :class:`BF16AdamW` with each update
    rule."""
    from .models import course_setup
    from .train import TrainConfig, TrainState, get_recipe, train

    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints, got {seeds!r}")
    curves: dict[str, list] = {}
    lost: dict[str, list] = {}
    evals: dict[str, list] = {}
    n_steps = 0
    for seed in seeds:
        setup = course_setup(profile, device, steps=steps, default_steps=(45, 400), seed=seed)
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
            run_losses, run_lost = [], []
            n = sum(p.numel() for p in model.parameters())
            for step in range(setup.steps):
                x, y = setup.sampler.batch(step, setup.device)
                opt.zero_grad(set_to_none=True)
                _, loss = model(x, y)
                loss.backward()
                opt.step()
                run_losses.append(float(loss.detach().float()))
                run_lost.append(sum(opt.state[p].get("lost", 0) for p in model.parameters()) / n)
            curves.setdefault(UPDATE_LABELS[rule], []).append(tuple(run_losses))
            lost.setdefault(UPDATE_LABELS[rule], []).append(tuple(run_lost))
            evals.setdefault(UPDATE_LABELS[rule], []).append(fp32_eval_loss(model, setup.sampler, setup.device,
                                                                            held_out))
    return UpdateComparison(lr, seeds, n_steps, {k: tuple(v) for k, v in curves.items()},
                            {k: tuple(v) for k, v in lost.items()}, {k: tuple(v) for k, v in evals.items()})
