"""Lesson 3's clipping section, measured: a small FP16-autocast run with planted outlier batches under
GradScaler, trained without clipping and with global-norm, per-value, per-tensor and adaptive (AGC) clipping
over a few seeds; single steps that measure gradient edits before and after ``unscale_`` and a step that
overflows. The mechanisms are ``scaling.clipping``; what the prose says of these runs, ``clipping_prose``."""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ..models import DeepMLP, regression_batch
from ..scaling.clipping import (
    adaptive_clip_grad_,
    check_positive,
    clip_per_tensor_norm_,
    global_grad_norm,
    scaled_step,
    tensor_norm,
)

NO_SPIKES = "no spikes, no clipping"
NO_CLIPPING = "no clipping"
GLOBAL_NORM = "global norm"
PER_VALUE = "per value"
PER_TENSOR = "per-tensor norm"
AGC = "adaptive (AGC)"
RULES = (NO_SPIKES, NO_CLIPPING, GLOBAL_NORM, PER_VALUE, PER_TENSOR, AGC)
MLP_DEPTH = 4   # layers of the runs' DeepMLP

# Each rule's threshold, in the units of what it bounds (the global gradient norm, each entry, each tensor's
# norm, each unit's gradient norm over its weight norm): chosen to bind on the spikes; how often each binds
# on ordinary steps is measured (SpikyRuns.changed_share).
DEFAULT_THRESHOLDS = {GLOBAL_NORM: 1.0, PER_VALUE: 0.1, PER_TENSOR: 0.5, AGC: 0.05}
# per size profile: training steps, steps between outlier batches, MLP width, seeds
SIZES = {"small": (200, 30, 32, (0, 1, 2)), "full": (300, 30, 128, (0, 1, 2, 3, 4))}


def make_clipper(rule: str, threshold: float) -> Callable[[list[torch.nn.Parameter]], object]:
    """The in-place gradient edit of one of :data:`RULES` (nothing for the two without clipping)."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; rules: {', '.join(RULES)}")
    threshold = check_positive("threshold", threshold)
    if rule == GLOBAL_NORM:
        return lambda params: torch.nn.utils.clip_grad_norm_(params, threshold)
    if rule == PER_VALUE:
        return lambda params: torch.nn.utils.clip_grad_value_(params, threshold)
    if rule == PER_TENSOR:
        return lambda params: clip_per_tensor_norm_(params, threshold)
    if rule == AGC:
        return lambda params: adaptive_clip_grad_(params, threshold)
    return lambda params: None


# ---- the spiky run ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class SpikyRuns:
    """FP16-autocast runs of a small MLP (SGD with momentum, ``torch.amp.GradScaler``) on a regression task
    whose batches at ``spike_steps`` have their targets multiplied by ``spike_factor`` (:data:`NO_SPIKES`:
    the same batches without them). Per rule and seed index, per step: ``losses`` (training loss),
    ``skipped`` (by the scaler), ``scales`` (used), ``grad_norms`` and ``step_norms`` (global norm of the
    unscaled gradients before and after the rule); ``finals``: loss on clean held-out batches after."""

    rules: tuple[str, ...]
    seeds: tuple[int, ...]
    spike_steps: tuple[int, ...]
    spike_factor: float
    thresholds: dict[str, float]
    losses: dict[str, tuple[tuple[float, ...], ...]]
    skipped: dict[str, tuple[tuple[bool, ...], ...]]
    scales: dict[str, tuple[tuple[float, ...], ...]]
    grad_norms: dict[str, tuple[tuple[float, ...], ...]]
    step_norms: dict[str, tuple[tuple[float, ...], ...]]
    finals: dict[str, tuple[float, ...]]
    width: int
    depth: int
    lr: float

    @property
    def steps(self) -> int:
        return len(self.losses[self.rules[0]][0])

    def passed_spikes(self, rule: str, seed_index: int) -> tuple[int, ...]:
        """The spike steps that the scaler did not skip in this run: they reached the optimizer."""
        return tuple(s for s in self.spike_steps if not self.skipped[rule][seed_index][s])

    def changed_share(self, rule: str) -> float:
        """Share of the ordinary (non-spike, not skipped) steps, over all seeds, on which the rule changed
        the gradient's global norm by more than one part in 10^4."""
        changed = total = 0
        for i in range(len(self.seeds)):
            for s, (before, after) in enumerate(zip(self.grad_norms[rule][i], self.step_norms[rule][i])):
                if s in self.spike_steps or self.skipped[rule][i][s]:
                    continue
                total += 1
                changed += abs(after - before) > 1e-4 * before
        return changed / total if total else math.nan


@contextlib.contextmanager
def one_cpu_thread(device: torch.device):
    """On the CPU, run torch on one thread for the duration (restored after). These runs are thousands of
    kernels on 32-wide tensors: a parallel region's fork and join costs more than the arithmetic, many
    times more on a machine whose cores are shared (measured: 0.2 s against 5 to 15 s per run)."""
    if device.type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def spiky_batch(width: int, batch_size: int, step: int, seed: int, spike_steps: Iterable[int],
                spike_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The course's regression batch (:func:`~course_lib.models.regression_batch`), with its targets
    multiplied by ``spike_factor`` at the ``spike_steps``: an outlier batch, as corrupted labels make."""
    x, y = regression_batch(width, batch_size, step, seed=seed)
    return (x, y * spike_factor) if step in set(spike_steps) else (x, y)


def train_spiky_run(rule: str, seed: int, *, steps: int, spike_steps: Sequence[int], spike_factor: float,
                    threshold: float = 1.0, width: int = 32, depth: int = MLP_DEPTH, batch_size: int = 32,
                    lr: float = 0.05, eval_batches: int = 4, device: torch.device | str = "cpu") -> dict:
    """One run of :class:`SpikyRuns` (``rule`` one of :data:`RULES`): the per-step lists and the final
    held-out loss, under the names of :class:`SpikyRuns`' fields."""
    device = torch.device(device)
    clip = make_clipper(rule, threshold)
    spikes = () if rule == NO_SPIKES else tuple(spike_steps)
    model = DeepMLP(width, depth, init_std=1.0, seed=seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type)
    stepped: list[bool] = []
    opt.register_step_post_hook(lambda *_: stepped.append(True))
    out: dict[str, list] = {k: [] for k in ("losses", "skipped", "scales", "grad_norms", "step_norms")}
    norms: list[float] = []

    def edit(params):   # measure the true gradient's norm on either side of the rule
        norms.append(global_grad_norm(params))
        clip(params)
        norms.append(global_grad_norm(params))

    for step in range(steps):
        x, y = (t.to(device) for t in spiky_batch(width, batch_size, step, seed, spikes, spike_factor))
        with torch.autocast(device.type, dtype=torch.float16):
            pred = model(x)
        loss = F.mse_loss(pred.float(), y)
        opt.zero_grad(set_to_none=True)
        out["scales"].append(scaler.get_scale())
        n_before, norms[:] = len(stepped), []
        scaled_step(scaler, opt, loss, edit)
        out["skipped"].append(len(stepped) == n_before)
        out["losses"].append(float(loss.detach()))
        out["grad_norms"].append(norms[0])
        out["step_norms"].append(norms[1])
    with torch.no_grad():
        final = sum(float(F.mse_loss(model(x.to(device)), y.to(device))) for x, y in
                    (regression_batch(width, 256, 1_000_000 + b, seed=seed) for b in range(eval_batches)))
    return {**{k: tuple(v) for k, v in out.items()}, "final": final / eval_batches}


def clipping_sizes(profile) -> dict[str, Any]:
    """The runs' sizes for a size profile (:data:`SIZES`): ``steps``, ``every`` (steps between outlier
    batches), ``width`` and ``seeds``; a profile's ``max_steps`` caps the steps, keeping one spike."""
    steps, every, width, seeds = profile.pick(small=SIZES["small"], full=SIZES["full"])
    if profile.max_steps is not None and profile.max_steps < steps:
        steps = max(3, profile.max_steps)
        every = max(1, steps // 2)
    return {"steps": steps, "every": every, "width": width, "seeds": tuple(seeds)}


def spiky_clipping_runs(profile, device: torch.device | str = "cpu", *, rules: Sequence[str] = RULES,
                        seeds: Sequence[int] | None = None, thresholds: Mapping[str, float] | None = None,
                        spike_factor: float = 300.0, lr: float = 0.05, steps: int | None = None,
                        every: int | None = None, width: int | None = None) -> SpikyRuns:
    """Train :func:`train_spiky_run` for every rule and seed, sized by the profile (:func:`clipping_sizes`)
    unless ``steps``, ``every``, ``width`` or ``seeds`` say otherwise."""
    unknown = [r for r in rules if r not in RULES]
    if unknown or not rules:
        raise ValueError(f"rules must be a non-empty selection of {', '.join(RULES)}; got {list(rules)!r}")
    sizes = clipping_sizes(profile)
    chosen_sizes = {"steps": steps, "every": every, "width": width}
    for name, value in chosen_sizes.items():
        value = sizes[name] if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
        chosen_sizes[name] = value
    steps, every, width = (int(chosen_sizes[k] or 0) for k in ("steps", "every", "width"))
    seeds = tuple(sizes["seeds"] if seeds is None else seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints, got {seeds!r}")
    spike_factor = check_positive("spike_factor", spike_factor)
    chosen = {**DEFAULT_THRESHOLDS, **(thresholds or {})}
    spike_steps = tuple(range(every, steps - every // 2, every))
    with one_cpu_thread(torch.device(device)):
        runs = {r: [train_spiky_run(r, s, steps=steps, spike_steps=spike_steps, spike_factor=spike_factor,
                                    threshold=chosen.get(r, 1.0), width=width, lr=lr, device=device)
                    for s in seeds] for r in rules}
    field = lambda name: {r: tuple(run[name] for run in runs[r]) for r in rules}  # noqa: E731
    return SpikyRuns(tuple(rules), seeds, spike_steps, spike_factor,
                     {r: chosen[r] for r in rules if r in chosen}, field("losses"), field("skipped"),
                     field("scales"), field("grad_norms"), field("step_norms"), field("final"), width, MLP_DEPTH, lr)


# ---- single steps: the order of unscaling and editing, and a step that overflows --------------------------

def _first_step(seed: int, width: int, spike_factor: float, device: torch.device):
    """The spiky run's model at initialisation and its first batch, targets times ``spike_factor``."""
    x, y = spiky_batch(width, 32, 0, seed, (0,), spike_factor)
    return DeepMLP(width, MLP_DEPTH, init_std=1.0, seed=seed).to(device), (x.to(device), y.to(device))


def _fp16_loss(model: torch.nn.Module, batch, device: torch.device) -> torch.Tensor:
    with torch.autocast(device.type, dtype=torch.float16):
        pred = model(batch[0])
    return F.mse_loss(pred.float(), batch[1])


EDITS = ("clip_grad_norm_", "L2 penalty", "mask the first layer")


@dataclass(frozen=True)
class EditOrder:
    """One SGD step from the same weights and batch, each edit of :data:`EDITS` applied after ``unscale_``
    or before it. ``after``/``before[edit]``: what the edit changed in the gradient the optimizer used, over
    what it should change (the edit on the true gradient, by hand in FP32; for the clip, the norms).
    ``step_over_grad``: the plain step's update norm over ``lr`` times the unscaled gradient's (1/scale,
    had ``step`` unscaled again); ``grads_kept_by_step``: ``step`` left the unscaled gradients as they were;
    ``second_unscale_error``: GradScaler's answer to a second ``unscale_``; ``adam_clip_before``: with
    Adam, the first update's norm when clipping before ``unscale_`` over the correct order's."""

    scale: float
    max_norm: float
    penalty: float
    true_norm: float
    after: dict[str, float]
    before: dict[str, float]
    step_over_grad: float
    grads_kept_by_step: bool
    second_unscale_error: str
    adam_clip_before: float

    @property
    def effective_threshold(self) -> float:
        """The true-gradient norm that clipping before ``unscale_`` lets through unchanged."""
        return self.max_norm / self.scale


def measure_edit_order(*, scale: float = 2.0**16, max_norm: float = 1.0, penalty: float = 0.01,
                       lr: float = 0.05, seed: int = 0, width: int = 32,
                       device: torch.device | str = "cpu") -> EditOrder:
    """Measure :class:`EditOrder` on the spiky run's model at initialisation and its first (ordinary)
    batch, under a GradScaler at ``scale``. Compared on gradients, not weights: a penalty's share of one
    step is below FP32's resolution of the weights."""
    scale, max_norm = check_positive("scale", scale), check_positive("max_norm", max_norm)
    penalty, lr = check_positive("penalty", penalty), check_positive("lr", lr)
    device = torch.device(device)
    model, batch = _first_step(seed, width, 1.0, device)
    w0 = [p.detach().clone() for p in model.parameters()]
    # the true gradients, from the same scaled FP16 backward, unscaled by hand in FP32
    (_fp16_loss(model, batch, device) * scale).backward()
    true = [p.grad.detach().float() * (1.0 / scale) for p in model.parameters()]
    true_norm = tensor_norm(true)
    edits = {   # params[0:2] are the first layer's weight and bias
        "clip_grad_norm_": lambda ps: torch.nn.utils.clip_grad_norm_(ps, max_norm),
        "L2 penalty": lambda ps: [p.grad.add_(p.detach(), alpha=penalty) for p in ps],
        "mask the first layer": lambda ps: [p.grad.zero_() for p in ps[:2]],
    }
    coef = min(1.0, max_norm / (true_norm + 1e-6))   # clip_grad_norm_'s own rule

    def one_step(edit, where: str, optimizer=torch.optim.SGD):
        m = copy.deepcopy(model)
        m.zero_grad(set_to_none=True)
        opt = optimizer(m.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device.type, init_scale=scale)
        params = list(m.parameters())
        scaler.scale(_fp16_loss(m, batch, device)).backward()
        if where == "before":
            edit(params)
        scaler.unscale_(opt)
        if where == "after":
            edit(params)
        kept = [p.grad.detach().clone() for p in params]
        scaler.step(opt)
        scaler.update()
        seen = [p.grad.detach().clone() for p in params]   # step unscales in place when unscale_ came first
        same = where == "before" or all(torch.equal(k, g) for k, g in zip(kept, seen))
        return seen, [w - p.detach() for w, p in zip(w0, params)], same

    plain, plain_update, kept_all = one_step(lambda ps: None, "after")
    ratios: dict[str, dict[str, float]] = {"after": {}, "before": {}}
    for where in ("after", "before"):
        for name, edit in edits.items():
            seen, _, kept = one_step(edit, where)
            kept_all = kept_all and kept
            if name == "clip_grad_norm_":
                ratios[where][name] = tensor_norm(seen) / (coef * true_norm)
            elif name == "L2 penalty":
                ratios[where][name] = tensor_norm([g - q for g, q in zip(seen, plain)]) / (penalty * tensor_norm(w0))
            else:
                ratios[where][name] = tensor_norm([q - g for g, q in zip(seen[:2], plain[:2])]) / tensor_norm(true[:2])
    adam = {where: tensor_norm(one_step(edits["clip_grad_norm_"], where, torch.optim.Adam)[1])
            for where in ("after", "before")}
    scaler = torch.amp.GradScaler(device.type, init_scale=scale)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    model.zero_grad(set_to_none=True)
    scaler.scale(_fp16_loss(model, batch, device)).backward()
    scaler.unscale_(opt)
    try:
        scaler.unscale_(opt)
        message = "(no error)"
    except RuntimeError as err:
        message = str(err)
    return EditOrder(scale, max_norm, penalty, true_norm, ratios["after"], ratios["before"],
                     tensor_norm(plain_update) / (lr * tensor_norm(plain)), kept_all, message, adam["before"] / adam["after"])


@dataclass(frozen=True)
class OverflowStep:
    """A step whose scaled gradients overflowed FP16, clipped after ``unscale_``: the norm
    ``clip_grad_norm_`` returned, its ``error_if_nonfinite`` default (from the installed torch), the share
    of entries NaN after the clip, whether the optimizer stepped, whether the weights stayed bit-identical,
    the scale before and after ``update``, and what ``error_if_nonfinite=True`` raised instead."""

    returned_norm: float
    error_if_nonfinite_default: object
    nan_share_after_clip: float
    stepped: bool
    weights_unchanged: bool
    scale_before: float
    scale_after: float
    strict_error: str


def measure_overflow_step(*, scale: float = 2.0**16, spike_factor: float = 300.0, max_norm: float = 1.0,
                          seed: int = 0, width: int = 32, device: torch.device | str = "cpu") -> OverflowStep:
    """Clip and step on the spiky run's first outlier batch at ``scale`` (GradScaler's initial scale: in
    the run, this step overflowed). Raises ``ValueError`` if these settings do not overflow."""
    scale, spike_factor = check_positive("scale", scale), check_positive("spike_factor", spike_factor)
    device = torch.device(device)
    model, batch = _first_step(seed, width, spike_factor, device)
    scaler = torch.amp.GradScaler(device.type, init_scale=scale)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    stepped: list[bool] = []
    opt.register_step_post_hook(lambda *_: stepped.append(True))
    w0 = [p.detach().clone() for p in model.parameters()]
    params = list(model.parameters())
    scaler.scale(_fp16_loss(model, batch, device)).backward()
    scaler.unscale_(opt)
    if all(bool(torch.isfinite(p.grad).all()) for p in params):
        raise ValueError(f"the gradients stayed finite at scale {scale:g} and spike_factor {spike_factor:g}: "
                         f"no overflow to measure")
    probes = [torch.zeros_like(p) for p in params]
    for probe, p in zip(probes, params):
        probe.grad = p.grad.clone()
    try:
        torch.nn.utils.clip_grad_norm_(probes, max_norm, error_if_nonfinite=True)
        strict = "(no error)"
    except RuntimeError as err:
        strict = str(err)
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    nan_share = sum(int(p.grad.isnan().sum()) for p in params) / sum(p.numel() for p in params)
    scaler.step(opt)
    scaler.update()
    default = inspect.signature(torch.nn.utils.clip_grad_norm_).parameters["error_if_nonfinite"].default
    return OverflowStep(norm, default, nan_share, bool(stepped),
                        all(torch.equal(w, p.detach()) for w, p in zip(w0, params)), scale, scaler.get_scale(),
                        strict)
