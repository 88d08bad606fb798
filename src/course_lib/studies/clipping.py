"""Lesson 3's clipping section: a small FP16-autocast run with planted outlier batches under GradScaler,
trained without clipping and with global-norm, per-value, per-tensor and adaptive (AGC) clipping over a few
seeds; single steps that measure gradient edits before and after ``unscale_`` and a step that overflows;
and the facts and phrases the prose glues from them."""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..glue import Prose
from ..models import DeepMLP, regression_batch
from ..tables import MarkdownTable, markdown_table
from .fp8_prose import listed

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
AGC_EPS = 1e-3   # AGC's floor on a unit's weight norm (timm's and NFNets' default)
# per size profile: training steps, steps between outlier batches, MLP width, seeds
SIZES = {"small": (200, 30, 32, (0, 1, 2)), "full": (1000, 100, 128, (0, 1, 2, 3, 4))}


def _check_positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def _norm(tensors) -> float:
    return float(torch.linalg.vector_norm(torch.cat([t.flatten() for t in tensors])))


def _with_grads(parameters) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(parameter, gradient) for each parameter that has a gradient."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    return [(p, p.grad) for p in parameters if p.grad is not None]


# ---- the mechanisms --------------------------------------------------------------------------------------

def unitwise_norm(x: torch.Tensor) -> torch.Tensor:
    """The norm AGC compares, per unit: for a tensor of two or more dimensions, the L2 norm of each slice
    along the first (output) dimension, shaped to broadcast against ``x`` (``[out, 1, ...]``); for a
    vector or a scalar, the norm of the whole tensor (as timm's ``adaptive_clip_grad`` does)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if x.ndim <= 1:
        return x.norm()
    return x.norm(dim=tuple(range(1, x.ndim)), keepdim=True)


def adaptive_clip_grad_(parameters, clipping: float = 0.01, eps: float = AGC_EPS) -> int:
    """Adaptive gradient clipping (Brock et al., 2021, NFNets), in place: each unit's gradient is scaled
    down to at most ``clipping`` times the norm of that unit's weights (floored at ``eps``, so that a unit
    whose weights are zero can still move). Units as in :func:`unitwise_norm`. Returns how many units
    were clipped. Call it after ``scaler.unscale_``: it compares gradients with weights."""
    clipping, eps = _check_positive("clipping", clipping), _check_positive("eps", eps)
    clipped = 0
    with torch.no_grad():
        for p, grad in _with_grads(parameters):
            limit = clipping * unitwise_norm(p.detach()).clamp_min(eps)
            norm = unitwise_norm(grad)
            too_big = norm > limit
            clipped += int(too_big.sum())
            grad.mul_(torch.where(too_big, limit / norm.clamp_min(1e-12), torch.ones_like(norm)))
    return clipped


def clip_per_tensor_norm_(parameters, max_norm: float) -> int:
    """Clip each tensor's gradient to L2 norm ``max_norm`` on its own (``clip_grad_norm_`` per tensor);
    returns how many tensors were clipped."""
    max_norm = _check_positive("max_norm", max_norm)
    clipped = 0
    for p, _ in _with_grads(parameters):
        clipped += int(float(torch.nn.utils.clip_grad_norm_([p], max_norm)) > max_norm)
    return clipped


def make_clipper(rule: str, threshold: float) -> Callable[[list[torch.nn.Parameter]], object]:
    """The in-place gradient edit of one of :data:`RULES` (nothing for the two without clipping)."""
    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; rules: {', '.join(RULES)}")
    threshold = _check_positive("threshold", threshold)
    if rule == GLOBAL_NORM:
        return lambda params: torch.nn.utils.clip_grad_norm_(params, threshold)
    if rule == PER_VALUE:
        return lambda params: torch.nn.utils.clip_grad_value_(params, threshold)
    if rule == PER_TENSOR:
        return lambda params: clip_per_tensor_norm_(params, threshold)
    if rule == AGC:
        return lambda params: adaptive_clip_grad_(params, threshold)
    return lambda params: None


def scaled_step(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer, loss: torch.Tensor, edit) -> None:
    """One training step under a loss scaler, with a gradient edit in its one right place."""
    params = [p for group in opt.param_groups for p in group["params"]]
    scaler.scale(loss).backward()
    scaler.unscale_(opt)      # from here on p.grad holds the true gradients
    edit(params)              # clip_grad_norm_, clip_grad_value_, AGC, a penalty, a mask
    scaler.step(opt)          # steps on the edited gradients; skips if unscale_ found an inf or NaN
    scaler.update()


def global_grad_norm(parameters) -> float:
    """L2 norm of all gradients together (inf or nan when one is not finite; 0 with no gradient)."""
    grads = [g.detach().float() for _, g in _with_grads(parameters)]
    return _norm(grads) if grads else 0.0


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


def spiky_clipping_runs(profile, device: torch.device | str = "cpu", *, rules: Sequence[str] = RULES,
                        seeds: Sequence[int] | None = None, thresholds: Mapping[str, float] | None = None,
                        spike_factor: float = 300.0, lr: float = 0.05) -> SpikyRuns:
    """Train :func:`train_spiky_run` for every rule and seed, sized by the profile (:data:`SIZES`)."""
    unknown = [r for r in rules if r not in RULES]
    if unknown or not rules:
        raise ValueError(f"rules must be a non-empty selection of {', '.join(RULES)}; got {list(rules)!r}")
    steps, every, width, default_seeds = profile.pick(small=SIZES["small"], full=SIZES["full"])
    seeds = tuple(default_seeds if seeds is None else seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints, got {seeds!r}")
    spike_factor = _check_positive("spike_factor", spike_factor)
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
    scale, max_norm = _check_positive("scale", scale), _check_positive("max_norm", max_norm)
    penalty, lr = _check_positive("penalty", penalty), _check_positive("lr", lr)
    device = torch.device(device)
    model, batch = _first_step(seed, width, 1.0, device)
    w0 = [p.detach().clone() for p in model.parameters()]
    # the true gradients, from the same scaled FP16 backward, unscaled by hand in FP32
    (_fp16_loss(model, batch, device) * scale).backward()
    true = [p.grad.detach().float() * (1.0 / scale) for p in model.parameters()]
    true_norm = _norm(true)
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
                ratios[where][name] = _norm(seen) / (coef * true_norm)
            elif name == "L2 penalty":
                ratios[where][name] = _norm([g - q for g, q in zip(seen, plain)]) / (penalty * _norm(w0))
            else:
                ratios[where][name] = _norm([q - g for g, q in zip(seen[:2], plain[:2])]) / _norm(true[:2])
    adam = {where: _norm(one_step(edits["clip_grad_norm_"], where, torch.optim.Adam)[1])
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
                     _norm(plain_update) / (lr * _norm(plain)), kept_all, message, adam["before"] / adam["after"])


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
    scale, spike_factor = _check_positive("scale", scale), _check_positive("spike_factor", spike_factor)
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


# ---- what the prose says ----------------------------------------------------------------------------------

def _log2(scale: float) -> int:
    return int(round(math.log2(scale)))


def _spread(values: Sequence[float]) -> tuple[float, float, float]:
    return sum(values) / len(values), min(values), max(values)   # mean, lowest, highest over seeds


def compare_ranges(values: Sequence[float], reference: Sequence[float]) -> str:
    """``"above"`` when every value lies above every reference value, ``"below"`` when every one lies
    below, else ``"within"``: with a few seeds, only ranges that do not overlap say more than seed noise.
    A non-finite value (a run that diverged) counts as above."""
    if not values or not reference:
        raise ValueError("compare_ranges needs at least one value on each side")
    big = [v if math.isfinite(v) else math.inf for v in values]
    ref = [v if math.isfinite(v) else math.inf for v in reference]
    if min(big) > max(ref):
        return "above"
    if max(big) < min(ref):
        return "below"
    return "within"


def _require(runs: SpikyRuns, *rules: str) -> None:
    missing = [r for r in rules if r not in runs.rules]
    if missing:
        raise ValueError(f"the runs lack {', '.join(missing)}; they have {', '.join(runs.rules)}")


def _ordinary_median(runs: SpikyRuns, rule: str) -> float:
    return statistics.median(n for i in range(len(runs.seeds)) for s, n in enumerate(runs.grad_norms[rule][i])
                             if s not in runs.spike_steps and not runs.skipped[rule][i][s])


def scaler_phrase(runs: SpikyRuns) -> Prose:
    """What the scaler did with the spikes of the runs without clipping: which it skipped (they overflowed
    FP16 at the scale of the time) and which reached the optimizer first."""
    _require(runs, NO_CLIPPING)
    firsts = {runs.passed_spikes(NO_CLIPPING, i)[:1] for i in range(len(runs.seeds))}
    if firsts == {()}:
        return Prose("The scaler skipped every spike: each overflowed FP16 at the scale of the time, so none "
                     "reached the optimizer, and clipping had nothing to stop.")
    if len(firsts) > 1:
        steps = sorted(f[0] for f in firsts if f)
        return Prose(f"The scaler skipped the first spikes, which overflowed FP16 at the scale of the time; "
                     f"which spike first fit under the lowered scale and reached the optimizer depended on the "
                     f"seed (steps {', '.join(map(str, steps))}).")
    step = firsts.pop()[0]
    skipped = [s for s in runs.spike_steps if s < step]
    scales = runs.scales[NO_CLIPPING][0]
    if len(skipped) > 1:
        lead = (f"In every seed the scaler skipped the first {len(skipped)} spikes: each overflowed FP16 at the "
                f"scale of the time (from 2^{_log2(scales[skipped[0]])} down to 2^{_log2(scales[skipped[-1]])}), "
                f"and each back-off halved the scale. ")
    else:
        lead = (f"In every seed the scaler skipped the first spike: it overflowed FP16 at the scale of the time "
                f"(2^{_log2(scales[skipped[0]])}), and the back-off halved the scale. " if skipped else "")
    return Prose(f"{lead}The spike at step {step} fit under 2^{_log2(scales[step])} and reached the optimizer.")


def spike_facts(runs: SpikyRuns) -> dict[str, object]:
    """Part one's facts: the run's size; without clipping, the first spike that reached the optimizer
    (``clip_pass_step``, seed 0's), its gradient norm over the median ordinary step's
    (``clip_spike_norm_ratio``), the loss on the step before it and the highest in the 10 steps after
    (``clip_loss_before``, ``clip_loss_peak``; means over seeds); the final held-out losses' ranges without
    clipping, with global-norm clipping and without spikes, and the verdicts."""
    _require(runs, NO_SPIKES, NO_CLIPPING, GLOBAL_NORM)
    n = len(runs.seeds)
    passed = [runs.passed_spikes(NO_CLIPPING, i) for i in range(n)]
    facts: dict[str, object] = {
        "clip_steps": runs.steps, "clip_seeds": n, "clip_spikes": len(runs.spike_steps),
        "clip_spike_factor": runs.spike_factor, "clip_width": runs.width, "clip_depth": runs.depth,
        "clip_max_norm": runs.thresholds.get(GLOBAL_NORM, math.nan), "clip_scaler": scaler_phrase(runs),
    }
    full_steps, _, full_width, full_seeds = SIZES["full"]
    facts.update(clip_full_steps=full_steps, clip_full_width=full_width, clip_full_seeds=len(full_seeds),
                 clip_jump=Prose(""))
    hit = [(i, p[0]) for i, p in enumerate(passed) if p]
    if hit:
        losses = runs.losses[NO_CLIPPING]
        ratio = sum(runs.grad_norms[NO_CLIPPING][i][s] for i, s in hit) / len(hit) / _ordinary_median(runs, NO_CLIPPING)
        # the highest loss on an ordinary batch within 10 steps after the spike (momentum carries it on)
        peaks = [max((losses[i][t] for t in range(s + 1, min(s + 11, runs.steps)) if t not in runs.spike_steps),
                     default=math.nan) for i, s in hit]
        before, peak = sum(losses[i][s - 1] for i, s in hit) / len(hit), sum(peaks) / len(peaks)
        facts.update(clip_spike_norm_ratio=ratio, clip_pass_step=hit[0][1], clip_loss_before=before,
                     clip_loss_peak=peak, clip_jump=Prose(
                         f"The scaler is no defence against spikes: it skips only those that overflow at the scale "
                         f"of the moment, and each skip lowers the scale until one fits. Without clipping, the first "
                         f"spike to reach the optimizer carried a gradient {ratio:.0f} times the median ordinary "
                         f"step's; the loss went from {before:.2f} on the step before to a peak of {peak:.3g} in the "
                         f"ten steps after (means over {len(hit)} seeds)."))
    means = {}
    for key, rule in (("none", NO_CLIPPING), ("global", GLOBAL_NORM), ("ref", NO_SPIKES)):
        means[key], lo, hi = _spread(runs.finals[rule])
        facts.update({f"clip_{key}_mean": means[key], f"clip_{key}_lo": lo, f"clip_{key}_hi": hi})
    facts["clip_none_over_global"] = means["none"] / means["global"]
    verdict = compare_ranges(runs.finals[NO_CLIPPING], runs.finals[GLOBAL_NORM])
    facts["clip_verdict"] = Prose(
        "every seed without clipping ended above every seed with it, a difference beyond seed noise at this size"
        if verdict == "above" else
        "every seed without clipping ended below every seed with it: at this size clipping cost more than the "
        "spikes did" if verdict == "below" else
        "the two ranges overlap: at this size the difference is within seed noise, and this run cannot claim it")
    against_ref = compare_ranges(runs.finals[GLOBAL_NORM], runs.finals[NO_SPIKES])
    facts["clip_vs_ref"] = Prose({
        "within": "within the seed-to-seed range of the runs that saw no spikes at all",
        "above": "above every seed of the runs that saw no spikes: clipping bounded the damage without undoing it",
        "below": "below every seed of the runs that saw no spikes"}[against_ref])
    return facts


def rule_table(runs: SpikyRuns) -> MarkdownTable:
    """One row per rule: its threshold, the spikes that reached the optimizer (over all seeds), the
    median gradient norm the optimizer got on those steps, the share of ordinary steps the rule changed,
    and the final held-out loss (mean, and range over seeds)."""
    units = {GLOBAL_NORM: "norm of all gradients", PER_VALUE: "each entry", PER_TENSOR: "each tensor's norm",
             AGC: "each unit's norm / its weights' norm"}
    rows = []
    for rule in runs.rules:
        n = len(runs.seeds)
        at = sorted(runs.step_norms[rule][i][s] for i in range(n) for s in runs.passed_spikes(rule, i))
        reached = sum(len(runs.passed_spikes(rule, i)) for i in range(n))
        mean, lo, hi = _spread(runs.finals[rule])
        threshold = f"{runs.thresholds[rule]:g} ({units[rule]})" if rule in runs.thresholds else "-"
        spikes = "-" if rule == NO_SPIKES else f"{reached} of {n * len(runs.spike_steps)}"
        changed = "-" if rule in (NO_SPIKES, NO_CLIPPING) else f"{100 * runs.changed_share(rule):.0f}%"
        rows.append((rule, threshold, spikes, f"{at[len(at) // 2]:.3g}" if at and rule != NO_SPIKES else "-",
                     changed, f"{mean:.3f} ({lo:.3f} to {hi:.3f})"))
    return markdown_table(["rule", "threshold (bounds)", "spikes that reached the optimizer",
                           "median gradient norm stepped on at those spikes", "ordinary steps changed",
                           "final held-out loss: mean (range over seeds)"], rows)


def ranking_phrase(finals: Mapping[str, Sequence[float]]) -> Prose:
    """Which of these rules the seeds rank (final losses per seed): every seed of one below every seed of
    the other."""
    names = list(finals)
    ranked = [(a, b) for a in names for b in names if a != b and compare_ranges(finals[a], finals[b]) == "below"]
    if len(names) < 2:
        return Prose("")
    if not ranked:
        return Prose(f"Their ranges overlap, so these seeds do not rank {listed(names)} against each other.")
    return Prose(listed([f"{a} ended below {b}" for a, b in ranked]) + " in every seed; any other pair's "
                 "ranges overlap.")


def rule_facts(runs: SpikyRuns) -> dict[str, object]:
    """Part three's facts: each clipping rule's final loss against the runs without spikes
    (``clip_rules_verdict``, grouped as within, above or below their seed range), whether the seeds rank
    the rules that did not end above it (``clip_rules_ranking``), the largest gradient
    norm per-value clipping stepped on at a spike against global-norm clipping's threshold, and the share
    of ordinary steps AGC changed."""
    _require(runs, NO_SPIKES)
    groups: dict[str, list[str]] = {"within": [], "above": [], "below": []}
    for rule in runs.rules:
        if rule not in (NO_SPIKES, NO_CLIPPING):
            groups[compare_ranges(runs.finals[rule], runs.finals[NO_SPIKES])].append(rule)
    if not any(groups.values()):
        raise ValueError("the runs hold no clipping rule to compare")
    said = {"within": "within the seed range of the runs without spikes",
            "above": "above every seed of the runs without spikes",
            "below": "below every seed of the runs without spikes"}
    text = "; ".join(f"{listed(rules)} ended {said[k]}" for k, rules in groups.items() if rules) + "."
    facts: dict[str, object] = {"clip_rules_verdict": Prose(text[0].upper() + text[1:]), "clip_rules_ranking":
                                ranking_phrase({r: runs.finals[r] for r in groups["within"] + groups["below"]})}
    if PER_VALUE in runs.rules:
        at = [runs.step_norms[PER_VALUE][i][s] for i in range(len(runs.seeds))
              for s in runs.passed_spikes(PER_VALUE, i)]
        facts["clip_value_spike_norm"] = max(at) if at else math.nan
    if AGC in runs.rules:
        facts["clip_agc_changed"] = 100 * runs.changed_share(AGC)
        facts["clip_agc_floor"] = runs.thresholds[AGC] * AGC_EPS
    return facts


def edit_table(order: EditOrder) -> MarkdownTable:
    """Each edit's effect on the gradient stepped on, over the intended one, after and before ``unscale_``."""
    return markdown_table(["edit", "after unscale_ (changed / intended)", "before unscale_ (changed / intended)"],
                          [(name, f"{order.after[name]:.4g}", f"{order.before[name]:.3g}") for name in EDITS])


def order_facts(order: EditOrder, overflow: OverflowStep) -> dict[str, object]:
    """The order section's facts (edits before and after ``unscale_``, the step that overflowed)."""
    returned = "nan" if math.isnan(overflow.returned_norm) else f"{overflow.returned_norm:g}"
    return {
        "ord_scale_log2": _log2(order.scale), "ord_max_norm": order.max_norm, "ord_true_norm": order.true_norm,
        "ord_threshold": order.effective_threshold, "ord_clip_before": order.before["clip_grad_norm_"],
        "ord_penalty_before": order.before["L2 penalty"], "ord_step_over_grad": order.step_over_grad,
        "ord_kept": Prose("left the gradients exactly as `unscale_` and the edit had made them"
                          if order.grads_kept_by_step else "changed the gradients again"),
        "ord_second_unscale": Prose(f"`RuntimeError: {order.second_unscale_error}`"
                                    if order.second_unscale_error != "(no error)" else "no error"),
        "ex_adam_clip_before": order.adam_clip_before,
        "ovf_norm": Prose(f"`{returned}`"), "ovf_default": Prose(f"`{overflow.error_if_nonfinite_default}`"),
        "ovf_nan_pct": 100 * overflow.nan_share_after_clip,
        "ovf_outcome": Prose("skipped the step and the weights stayed bit-identical"
                             if not overflow.stepped and overflow.weights_unchanged else
                             "stepped, and the weights changed" if overflow.stepped else
                             "skipped the step, yet the weights changed"),
        "ovf_scale_after_log2": _log2(overflow.scale_after),
        "ovf_strict": Prose(f"`` RuntimeError: {overflow.strict_error.split('. ')[0]}. ``"
                            if overflow.strict_error != "(no error)" else "no error"),
    }
