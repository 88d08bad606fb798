"""One training loop for every precision recipe the course compares.

A :class:`Recipe` is a small declarative object (autocast dtype, parameter dtype, loss scaler, TF32,
FP32 master weights); :func:`train` is the single loop that runs any of them, with the production pieces
real loops need: gradient accumulation, clipping after unscaling, an LR schedule that does not advance on
skipped steps, checkpoint save/resume including the scaler's state, and evaluation under autocast. It uses
the ``torch.amp`` APIs with an explicit device type throughout.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .data import BatchSampler
from .device import peak_allocated_bytes, restore_rng_states, rng_states
from .hardware import capability_unsupported_reason, format_unsupported_reason, gpu_compute_capability, tf32_matmuls
from .models import course_setup


@dataclass(frozen=True)
class Recipe:
    """How one training run uses precision.

    ``autocast_dtype``: run the forward under ``torch.autocast`` with this dtype (None: no autocast).
    ``param_dtype``: the dtype the model's parameters are stored in.
    ``grad_scaler``: use ``torch.amp.GradScaler`` (dynamic loss scaling).
    ``tf32``: allow TF32 tensor cores for FP32 matrix products (CUDA, compute capability 8.0+).
    ``master_weights``: keep an FP32 copy of low-precision parameters; the optimizer updates the copy
    and the model receives it rounded.
    """

    name: str
    description: str
    autocast_dtype: torch.dtype | None = None
    param_dtype: torch.dtype = torch.float32
    grad_scaler: bool = False
    tf32: bool = False
    master_weights: bool = False

    def unsupported_reason(self, device: torch.device | str) -> str | None:
        """Why ``device`` cannot run this recipe, or None when it can (the rules of :mod:`course_lib.hardware`)."""
        device = torch.device(device)
        if device.type == "cuda":
            if not torch.cuda.is_available():
                return "torch sees no CUDA GPU on this machine"
            cc = gpu_compute_capability(device)
            assert cc is not None
            needs = ["tf32"] if self.tf32 else []
            if torch.bfloat16 in (self.autocast_dtype, self.param_dtype):
                needs.append("bf16")
            for fmt in needs:
                why = capability_unsupported_reason(fmt, cc)
                if why:
                    return why
            return None
        if device.type == "cpu":
            if self.tf32:
                return format_unsupported_reason("tf32", device)
            return None
        return f"unsupported device type {device.type!r}"


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("fp32", "FP32 everywhere"),
    Recipe("tf32", "FP32 storage, TF32 tensor cores for matrix products", tf32=True),
    Recipe("bf16_autocast", "FP32 weights, BF16 autocast", autocast_dtype=torch.bfloat16),
    Recipe("fp16_autocast_scaler", "FP32 weights, FP16 autocast, dynamic loss scaling",
           autocast_dtype=torch.float16, grad_scaler=True),
    Recipe("fp16_autocast_no_scaler", "FP32 weights, FP16 autocast, no loss scaling",
           autocast_dtype=torch.float16),
    Recipe("bf16_pure", "BF16 weights and optimizer state, no FP32 master copy", param_dtype=torch.bfloat16),
    Recipe("bf16_master", "BF16 weights and compute, FP32 master weights for the update",
           param_dtype=torch.bfloat16, master_weights=True),
)}


def get_recipe(recipe: str | Recipe, device: torch.device | str | None = None) -> Recipe:
    """A recipe by name; with ``device``, also refuse clearly one the device cannot run."""
    if isinstance(recipe, Recipe):
        r = recipe
    elif isinstance(recipe, str):
        if recipe not in RECIPES:
            raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(RECIPES)}")
        r = RECIPES[recipe]
    else:
        raise TypeError(f"a recipe is a name or a Recipe, not {type(recipe).__name__}")
    if device is not None:
        reason = r.unsupported_reason(device)
        if reason:
            raise ValueError(f"recipe {r.name!r} cannot run on {torch.device(device)}: {reason}")
    return r


def runnable_recipes(device: torch.device | str, wanted) -> tuple[str, ...]:
    """The recipes of ``wanted`` (names) that ``device`` runs, in the given order: a V100 or T4 has no BF16 or
    TF32, a CPU no TF32. Every experiment that compares recipes asks this, so none fails on an older GPU."""
    if isinstance(wanted, str):
        raise TypeError("wanted is a sequence of recipe names, not one string")
    return tuple(r for r in wanted if get_recipe(r).unsupported_reason(device) is None)


DEFAULT_LR = 3e-3   # AdamW's learning rate in the course's training runs


@dataclass(frozen=True)
class TrainConfig:
    """Loop settings. ``steps`` counts optimizer steps (each of ``accumulation_steps`` micro-batches)."""

    steps: int
    lr: float = DEFAULT_LR
    accumulation_steps: int = 1
    clip_norm: float | None = 1.0
    warmup_steps: int = 0
    schedule: str = "constant"        # or "cosine"
    weight_decay: float = 0.0
    eval_every: int = 0               # 0: no evaluation
    eval_batches: int = 2

    def __post_init__(self) -> None:
        for name in ("steps", "accumulation_steps", "warmup_steps", "eval_every", "eval_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        if self.accumulation_steps < 1:
            raise ValueError("accumulation_steps must be at least 1")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive finite number, got {self.lr}")
        if self.clip_norm is not None and not (self.clip_norm > 0 and math.isfinite(self.clip_norm)):
            raise ValueError(f"clip_norm must be None (no clipping) or a positive finite number, got "
                             f"{self.clip_norm}")


@dataclass
class History:
    """Per optimizer step: loss (mean over micro-batches), gradient norm (unscaled, before clipping), loss
    scale, skipped or not, learning rate, wall time, tokens per second; and peak memory (bytes, CUDA only)
    and evaluation losses ``(step, loss)``."""

    recipe: str
    losses: list[float] = field(default_factory=list)
    grad_norms: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    lrs: list[float] = field(default_factory=list)
    step_seconds: list[float] = field(default_factory=list)
    tokens_per_second: list[float] = field(default_factory=list)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    peak_memory_bytes: int | None = None


class TrainState:
    """Everything a run needs to continue: model, optimizer, scaler, scheduler, FP32 masters, step."""

    def __init__(self, model: torch.nn.Module, recipe: Recipe, config: TrainConfig, device: torch.device):
        self.model, self.recipe, self.config, self.device = model, recipe, config, device
        model.to(device=device, dtype=recipe.param_dtype)
        params = [p for p in model.parameters() if p.requires_grad]
        self.masters: list[torch.Tensor] | None
        if recipe.master_weights:
            self.masters = [p.detach().float().clone().requires_grad_(True) for p in params]
            opt_params = self.masters
        else:
            self.masters = None
            opt_params = list(params)
        self.params = params
        self.optimizer = torch.optim.AdamW(opt_params, lr=config.lr, weight_decay=config.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.scaler = torch.amp.GradScaler(device.type, enabled=recipe.grad_scaler)
        self.step = 0

    def _lr_factor(self, step: int) -> float:
        c = self.config
        if c.warmup_steps and step < c.warmup_steps:
            return (step + 1) / c.warmup_steps
        if c.schedule == "cosine":
            progress = min(1.0, (step - c.warmup_steps) / max(1, c.steps - c.warmup_steps))
            return 0.5 * (1 + math.cos(math.pi * progress))
        return 1.0

    def state_dict(self) -> dict:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "scaler": self.scaler.state_dict(),
                "masters": None if self.masters is None else [m.detach().clone() for m in self.masters],
                "step": self.step, "recipe": self.recipe.name, **rng_states()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("recipe") != self.recipe.name:
            raise ValueError(f"checkpoint is for recipe {state.get('recipe')!r}, not {self.recipe.name!r}")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        if self.masters is not None:
            with torch.no_grad():
                for m, saved in zip(self.masters, state["masters"]):
                    m.copy_(saved)
        self.step = int(state["step"])
        restore_rng_states({"rng": state["rng"], "cuda_rng": state.get("cuda_rng")})   # older checkpoints: CPU only


def save_checkpoint(state: TrainState, path: str | Path) -> Path:
    """Write the run's full state (including the scaler's scale and growth tracker) to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state.state_dict(), path)
    return path


def load_checkpoint(state: TrainState, path: str | Path) -> TrainState:
    """Restore ``state`` (built with the same model shape, recipe and config) from ``path``."""
    state.load_state_dict(torch.load(Path(path), weights_only=False))
    return state


def recipe_autocast(recipe: Recipe, device: torch.device):
    if recipe.autocast_dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=recipe.autocast_dtype)


def evaluate(state: TrainState, sampler: BatchSampler, batches: int = 2, *, start: int = 0) -> float:
    """Mean loss over ``batches`` batches of ``sampler`` (from batch ``start`` on), in eval mode, under the
    recipe's autocast. With ``start = step * accumulation_steps`` and ``batches = accumulation_steps`` it is
    the loss :func:`train` logs at ``step``, taken without a step."""
    for name, value, least in (("batches", batches, 1), ("start", start, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ValueError(f"{name} must be an int of at least {least}, got {value!r}")
    state.model.eval()
    total = 0.0
    with torch.no_grad(), recipe_autocast(state.recipe, state.device), tf32_matmuls(state.recipe.tf32):
        for i in range(start, start + batches):
            x, y = sampler.batch(i, state.device)
            total += float(state.model(x, y)[1].float())
    state.model.train()
    return total / batches


def train(state: TrainState, sampler: BatchSampler, *,
          steps: int | None = None,
          val_sampler: BatchSampler | None = None,
          history: History | None = None, monitor=None) -> History:
    """Run ``steps`` optimizer steps (default: up to ``config.steps``)
    from ``state.step`` on.

    Batches are ``sampler.batch(step * accumulation_steps + micro)``, so
    a resumed run sees exactly the batches the uninterrupted run would
    have seen. ``monitor``: a
    :class:`course_lib.monitor.GradientHealthMonitor`, called after each
    backward and each step.
    """
    recipe, config, device = state.recipe, state.config, state.device
    history = History(recipe.name) if history is None else history
    end = config.steps if steps is None else state.step + steps
    peak_allocated_bytes(device, reset=True)
    model, opt, scaler = state.model, state.optimizer, state.scaler
    n_micro = config.accumulation_steps
    with tf32_matmuls(recipe.tf32):
        while state.step < end:
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            for p in state.params:
                p.grad = None
            loss_sum = 0.0
            tokens = 0
            for micro in range(n_micro):
                x, y = sampler.batch(state.step * n_micro + micro, device)
                with recipe_autocast(recipe, device):
                    _, loss = model(x, y)
                scaler.scale(loss / n_micro).backward()
                loss_sum += float(loss.detach().float())
                tokens += x.numel()
            if state.masters is not None:
                for m, p in zip(state.masters, state.params):
                    m.grad = None if p.grad is None else p.grad.float()
            scale = scaler.get_scale() if scaler.is_enabled() else 1.0
            if monitor is not None:
                monitor.after_backward(state.step, scale=scale)
            result = step_optimizers(scaler, [opt],
                                     clip_norm=config.clip_norm)
            ran, norm = result.ran[0], result.grad_norms[0]
            if ran:
                state.scheduler.step()  # never on a skipped step
                if state.masters is not None:
                    with torch.no_grad():
                        for m, p in zip(state.masters, state.params):
                            # rounds the FP32 master to the model's dtype
                            p.copy_(m)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            elapsed = time.perf_counter() - start
            history.losses.append(loss_sum / n_micro)
            history.grad_norms.append(float(norm))
            history.scales.append(scale)
            history.skipped.append(not ran)
            history.lrs.append(opt.param_groups[0]["lr"])
            history.step_seconds.append(elapsed)
            history.tokens_per_second.append(
                tokens / elapsed if elapsed > 0 else math.nan)
            if monitor is not None:
                monitor.after_step(state.step, loss=history.losses[-1],
                                   scale=scale, skipped=not ran)
            state.step += 1
            if (val_sampler is not None and config.eval_every
                    and state.step % config.eval_every == 0):
                history.eval_losses.append((state.step, evaluate(
                    state, val_sampler, config.eval_batches)))
    history.peak_memory_bytes = peak_allocated_bytes(device)  # None: CPU
    return history


@dataclass(frozen=True)
class StepResult:
    """Per optimizer: whether its step ran, and its gradient norm (unscaled, before clipping)."""

    ran: tuple[bool, ...]
    grad_norms: tuple[float, ...]


def step_optimizers(scaler: torch.amp.GradScaler, optimizers, *,
                    clip_norm: float | None = None,
                    after_unscale=None) -> StepResult:
    """One step of one or several optimizers sharing one GradScaler
    (GAN-style): unscale each, clip each, step each, then update the scale
    once. Each optimizer is skipped on its own inf/NaN; the scale backs off
    if any of them overflowed. A disabled scaler makes this a plain
    clip-and-step. ``after_unscale(optimizer)``, if given, runs between
    unscaling and clipping (after the scaler has looked for inf/NaN):
    :mod:`course_lib.distributed` reduces gradients there to show that
    order's pitfall."""
    if not optimizers:
        raise ValueError("step_optimizers needs at least one optimizer")
    max_norm = clip_norm if clip_norm is not None else math.inf
    ran, norms = [], []
    for opt in optimizers:
        marker: list[bool] = []
        hook = opt.register_step_post_hook(
            lambda *_: marker.append(True))
        try:
            # before clipping, so the threshold applies to true gradients
            scaler.unscale_(opt)
            if after_unscale is not None:
                after_unscale(opt)
            params = [p for g in opt.param_groups for p in g["params"]
                      if p.grad is not None]
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            scaler.step(opt)
        finally:
            hook.remove()
        ran.append(bool(marker))
        norms.append(float(norm))
    scaler.update()  # once per iteration, however many optimizers
    return StepResult(tuple(ran), tuple(norms))


def run_recipe(recipe: str | Recipe, profile, device: torch.device | str = "cpu", *, steps: int | None = None,
               seed: int = 0, lr: float = 3e-3, **config_kwargs) -> History:
    """Train the course GPT from seed ``seed`` with ``recipe`` at the profile's size; return the history."""
    device = torch.device(device)
    r = get_recipe(recipe, device)
    setup = course_setup(profile, device, steps=steps, default_steps=(40, 300), seed=seed)
    state = TrainState(setup.model(seed), r, TrainConfig(steps=setup.steps, lr=lr, **config_kwargs), device)
    return train(state, setup.sampler)


