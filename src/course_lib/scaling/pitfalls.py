"""Loss-scaling pitfalls caught as they happen: an auditor that watches a real GradScaler loop (clipping
before unscale_, a scaler with BF16, evaluation without autocast, ...), and each pitfall planted in a demo."""

from __future__ import annotations

import math
import types
from dataclasses import dataclass
from typing import Literal

import torch

PITFALLS = {
    "disabled_scaler": "GradScaler is disabled: created without a device on a machine without CUDA (it "
                       "targets 'cuda' by default, warns once, when created, that CUDA is not available, "
                       "and then does nothing). Pass the device: "
                       "torch.amp.GradScaler('cpu') or torch.amp.GradScaler('cuda').",
    "clip_before_unscale": "Gradients were clipped (or their norm measured) while still scaled: the "
                           "threshold applied to gradients `scale` times too large. Call "
                           "scaler.unscale_(optimizer) before clipping or measuring them.",
    "update_every_microbatch": "scaler.step/update ran before all micro-batches of an accumulation window "
                               "were scaled and backpropagated: with gradient accumulation, scale every "
                               "micro-batch's loss but step and update only once per window.",
    "scheduler_on_skipped_step": "The LR scheduler stepped on an iteration whose optimizer step was skipped "
                                 "(inf/NaN gradients). Step the scheduler only when the optimizer stepped: "
                                 "compare scaler.get_scale() before and after update(), or use an optimizer "
                                 "step hook.",
    "unscale_twice": "scaler.unscale_(optimizer) was called twice for the same optimizer before update(): "
                     "the second call would divide its gradients by the scale again. GradScaler refuses it "
                     "(each of several optimizers may be unscaled once).",
    "fp16_params": "The model's parameters are FP16 (model.half()), so their gradients are FP16 and "
                   "GradScaler refuses to unscale them. Keep parameters in FP32 and let autocast run the "
                   "FP16 compute.",
    "fp16_autocast_without_scaler": "backward() ran on a loss computed under FP16 autocast without "
                                    "GradScaler: small gradients flush to zero in FP16 (lesson 2). Scale the "
                                    "loss with torch.amp.GradScaler(device), or use BF16.",
    "scaler_with_bf16": "GradScaler scaled a loss computed under BF16 autocast: BF16 has FP32's range, so "
                        "scaling buys nothing and costs a pass over the gradients. Drop the scaler for BF16.",
    "eval_without_autocast": "A warning more than a mistake: the model was evaluated (eval mode) without "
                             "the autocast it was trained under, so the evaluation measures a different "
                             "numeric model than the one trained. Often harmless; evaluate under the same "
                             "autocast, or check once that the two agree.",
    "mixed_autocast_dtypes": "One iteration ran parts of the model under FP16 autocast and parts under "
                             "BF16 autocast: two formats, two failure modes, and FP16's needs a scaler. "
                             "Use one low-precision dtype (and autocast(enabled=False) for FP32 parts).",
    "unaligned_matmul": "A linear layer's input or output width is not a multiple of 8: on a GPU, FP16/BF16 "
                        "tensor cores want multiples of 8 (lesson 6 measures the cost of misalignment). Pad "
                        "the width where the layer is large; a 1- or 10-wide output head costs little.",
    "bf16_without_native_support": "BF16 autocast on a GPU below compute capability 8.0: it has no BF16 "
                                   "tensor cores (torch.cuda.is_bf16_supported() still says True there, and "
                                   "BF16 runs without them). Use FP16 with GradScaler there.",
}


LOW_PRECISION_DTYPES = (torch.float16, torch.bfloat16)


def _autocast_enabled(device_type: str) -> bool:
    try:
        return bool(torch.is_autocast_enabled(device_type))
    except TypeError:  # pragma: no cover - torch before 2.4 has no device argument
        return bool(torch.is_autocast_enabled() if device_type == "cuda" else torch.is_autocast_cpu_enabled())


@dataclass(frozen=True)
class Finding:
    """One pitfall detected, where first seen: ``iteration`` is the number of ``update()`` calls before it."""

    pitfall: str
    iteration: int
    message: str


class ScalerAudit:
    """Watches a training loop that uses a real ``torch.amp.GradScaler`` and reports known pitfalls.

    Use as a context manager around the loop::

        with ScalerAudit(scaler, optimizer, scheduler=sched, accumulation_steps=4) as audit:
            ...  # the unchanged training loop
        audit.findings

    It wraps the scaler's methods, the gradient clipping and norm functions (also where the loop imported
    them by name: the wrapper sits on the function they call), ``torch.autocast``'s entry,
    ``Tensor.backward`` and the scheduler's ``step`` for the duration, and restores them on exit; with
    ``model`` it also watches the model's forward (train or eval mode, under autocast or not) and its layer
    widths. ``scaler`` may be None for a loop that has none. A GradScaler error inside the loop
    (``unscale_`` twice, FP16 gradients) is recorded as a finding and re-raised.
    """

    def __init__(self, scaler, optimizer, *, scheduler=None, accumulation_steps: int = 1, model=None):
        if scaler is not None and not isinstance(scaler, torch.amp.GradScaler):
            raise TypeError(f"scaler must be a torch.amp.GradScaler or None, got {type(scaler).__name__}")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if isinstance(accumulation_steps, bool) or not isinstance(accumulation_steps, int) or accumulation_steps < 1:
            raise ValueError(f"accumulation_steps must be a positive int, got {accumulation_steps!r}")
        self.scaler, self.optimizer, self.scheduler = scaler, optimizer, scheduler
        self.accumulation_steps = accumulation_steps
        self.findings: list[Finding] = []
        self._iteration = 0
        self._unscaled = False
        self._stepped = False
        self._scaled_since_update = 0
        self._saved: list[tuple[object, str, object]] = []
        self.model = model
        self._iter_dtypes: set = set()
        self._scaled_ids: set[int] = set()
        self._train_autocast = False
        self._handles: list = []

    def _new_iteration(self) -> None:
        self._iter_dtypes = set()
        self._scaled_ids = set()

    def _on_autocast(self, device_type: str, dtype) -> None:
        if dtype not in LOW_PRECISION_DTYPES:
            return
        self._iter_dtypes.add(dtype)
        if len(self._iter_dtypes) > 1:
            self._flag("mixed_autocast_dtypes")
        if (device_type == "cuda" and dtype == torch.bfloat16 and torch.cuda.is_available()
                and torch.cuda.get_device_capability() < (8, 0)):
            self._flag("bf16_without_native_support")
        if self.model is not None:
            for m in self.model.modules():
                if isinstance(m, torch.nn.Linear) and (m.in_features % 8 or m.out_features % 8):
                    self._flag("unaligned_matmul")
                    break

    def _flag(self, pitfall: str) -> None:
        if not any(f.pitfall == pitfall for f in self.findings):  # report each pitfall once, where first seen
            self.findings.append(Finding(pitfall, self._iteration, PITFALLS[pitfall]))

    def _patch(self, owner, name: str, wrapper) -> None:
        original = getattr(owner, name)
        self._saved.append((owner, name, owner.__dict__.get(name)))
        setattr(owner, name, wrapper(original))

    def __enter__(self) -> "ScalerAudit":
        if self.scaler is not None and not self.scaler.is_enabled():
            self._flag("disabled_scaler")
        audit = self

        def on_step(*_):
            audit._stepped = True
            if audit.scaler is None:
                audit._new_iteration()   # without a scaler, the optimizer step ends the iteration
        self._hook = self.optimizer.register_step_post_hook(on_step)

        def wrap_scale(original):
            def scale(outputs):
                audit._scaled_since_update += 1
                if audit._iter_dtypes and audit._iter_dtypes <= {torch.bfloat16} and audit.scaler.is_enabled():
                    audit._flag("scaler_with_bf16")
                result = original(outputs)
                if isinstance(result, torch.Tensor):
                    audit._scaled_ids.add(id(result))
                return result
            return scale

        def wrap_unscale(original):
            def unscale_(optimizer):
                try:
                    result = original(optimizer)
                except RuntimeError as exc:
                    if "already been called" in str(exc):
                        audit._flag("unscale_twice")
                    raise
                except ValueError as exc:
                    if "FP16 gradients" in str(exc):
                        audit._flag("fp16_params")
                    raise
                audit._unscaled = True
                return result
            return unscale_

        def wrap_step(original):
            def step(optimizer, *args, **kwargs):
                if audit._scaled_since_update < audit.accumulation_steps:
                    audit._flag("update_every_microbatch")
                try:
                    return original(optimizer, *args, **kwargs)
                except ValueError as exc:
                    if "FP16 gradients" in str(exc):
                        audit._flag("fp16_params")
                    raise
            return step

        def wrap_update(original):
            def update(*args, **kwargs):
                result = original(*args, **kwargs)
                audit._new_iteration()
                audit._iteration += 1
                audit._unscaled = False
                audit._scaled_since_update = 0
                audit._last_update_stepped = audit._stepped
                audit._stepped = False
                return result
            return update

        def wrap_clip(original):
            def clip(*args, **kwargs):
                if audit.scaler is not None and audit.scaler.is_enabled() and not audit._unscaled:
                    audit._flag("clip_before_unscale")
                return original(*args, **kwargs)
            return clip

        def wrap_autocast_enter(original):
            def enter(ac):
                result = original(ac)
                if getattr(ac, "_enabled", False):
                    audit._on_autocast(ac.device, ac.fast_dtype)
                return result
            return enter

        def wrap_backward(original):
            def backward(tensor, *args, **kwargs):
                scaled = (audit.scaler is not None and audit.scaler.is_enabled()
                          and id(tensor) in audit._scaled_ids)
                if torch.float16 in audit._iter_dtypes and not scaled:
                    audit._flag("fp16_autocast_without_scaler")
                return original(tensor, *args, **kwargs)
            return backward

        if self.scaler is not None:
            self._patch(self.scaler, "scale", wrap_scale)
            self._patch(self.scaler, "unscale_", wrap_unscale)
            self._patch(self.scaler, "step", wrap_step)
            self._patch(self.scaler, "update", wrap_update)
        for fn in ("clip_grad_norm_", "clip_grad_value_"):
            self._patch(torch.nn.utils, fn, wrap_clip)
        # a loop that did `from torch.nn.utils import clip_grad_norm_` holds the original function, which
        # computes the norm through a module-level helper: wrap that helper (where this torch has it)
        import torch.nn.utils.clip_grad as clip_module
        if hasattr(clip_module, "_get_total_norm"):
            self._patch(clip_module, "_get_total_norm", wrap_clip)
        self._patch(torch.autocast, "__enter__", wrap_autocast_enter)
        self._patch(torch.Tensor, "backward", wrap_backward)
        if self.model is not None:
            device_type = next((p.device.type for p in self.model.parameters()), "cpu")

            def watch_forward(module, args):
                on = _autocast_enabled(device_type)
                if module.training:
                    audit._train_autocast = audit._train_autocast or on
                elif audit._train_autocast and not on:
                    audit._flag("eval_without_autocast")
            self._handles.append(self.model.register_forward_pre_hook(watch_forward))
        if self.scheduler is not None:
            def wrap_sched(original):
                def step(*args, **kwargs):
                    if getattr(audit, "_last_update_stepped", True) is False and audit.scaler.is_enabled():
                        audit._flag("scheduler_on_skipped_step")
                    return original(*args, **kwargs)
                return step
            self._patch(self.scheduler, "step", wrap_sched)
        return self

    def __exit__(self, *exc) -> Literal[False]:
        for owner, name, previous in reversed(self._saved):
            if isinstance(owner, (type, types.ModuleType)):
                setattr(owner, name, previous)   # a class's or module's own attribute, put back
            elif previous is None:
                delattr(owner, name)  # back to the class's method
            else:  # pragma: no cover - an attribute that was already an instance override
                setattr(owner, name, previous)
        self._saved.clear()
        self._hook.remove()
        for h in self._handles:
            h.remove()
        self._handles.clear()
        return False

    @property
    def pitfalls(self) -> list[str]:
        return [f.pitfall for f in self.findings]


@dataclass(frozen=True)
class PitfallDemo:
    """The outcome of running a small training loop with (or without) one planted mistake."""

    name: str
    findings: tuple[Finding, ...]
    error: str | None       # the exception GradScaler raised, if it raised one
    optimizer_steps: int
    scheduler_steps: int
    update_norm: float = 0.0  # how far the weights moved over the run (L2 norm of final minus initial)
    final_scale: float = 0.0  # the scaler's scale at the end
    # per optimizer step: the L2 norm of the gradients it stepped on (after any unscaling), the move SGD
    # asked for (learning rate times that norm) and how far the float32 weights actually moved (L2 norms)
    step_grad_norms: tuple[float, ...] = ()
    step_requested: tuple[float, ...] = ()
    step_moved: tuple[float, ...] = ()


# the demo loop's settings (lesson 3 names them): micro-batches per optimizer step, the autocast loops' layer
# width (a multiple of 8, which tensor cores like), the compute capability the BF16-on-an-old-GPU row fakes
# (a T4's), and the rows that run without a scaler
DEMO_ACCUMULATION = 2
DEMO_WIDTH = 8
# the FP32 loops' GradScaler: the first step overflows (2**120 times a loss of about 1e4 exceeds float32's
# 3.4e38), then one back-off takes the scale to 2**20, where every later step is finite
DEMO_INIT_SCALE = 2.0 ** 120
DEMO_BACKOFF = 2.0 ** -100
OLD_GPU_CAPABILITY = (7, 5)
NO_SCALER_PITFALLS = ("fp16_autocast_without_scaler", "bf16_without_native_support")


def run_pitfall_demo(name: str | None, *, iterations: int = 4,
                     device: str | torch.device = "cpu") -> PitfallDemo:
    """Run a small regression loop under :class:`ScalerAudit`, with the mistake ``name`` planted (one of
    :data:`PITFALLS`), or the correct loop when ``name`` is None, for ``iterations`` (>= 1) iterations.

    The loop: a linear model, MSE loss, SGD, a StepLR scheduler, gradient clipping, and accumulation over
    two micro-batches. The first iteration overflows on purpose (an enormous initial scale), so a skipped
    step happens in every run. The model and data stay on the CPU; ``device`` (``"cpu"`` or ``"cuda"``,
    the latter only where CUDA is available) is the device type GradScaler is created for.
    """
    import warnings
    from unittest import mock

    if name is not None and not isinstance(name, str):
        raise TypeError(f"name must be a pitfall name (str) or None, got {type(name).__name__}")
    if name is not None and name not in PITFALLS:
        raise ValueError(f"unknown pitfall {name!r}; known: {', '.join(PITFALLS)}")
    if isinstance(iterations, bool) or not isinstance(iterations, int):
        raise TypeError(f"iterations must be an int, got {iterations!r} ({type(iterations).__name__})")
    if iterations < 1:
        raise ValueError(f"iterations must be >= 1, got {iterations}")
    scaler_device = _scaler_device_type(device)
    gen = torch.Generator().manual_seed(0)
    # the mistakes of autocast loops get an autocast loop, with layer widths a tensor core likes (except
    # the one about widths); the others keep the plain loop of lesson 3
    autocast_demo = name in AUTOCAST_PITFALLS_DTYPE
    with torch.random.fork_rng(devices=[]):  # the same initial weights in every demo, global RNG untouched
        torch.manual_seed(0)
        if name == "mixed_autocast_dtypes":
            model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(DEMO_WIDTH, DEMO_WIDTH),
                                                         torch.nn.Linear(DEMO_WIDTH, DEMO_WIDTH))
        elif autocast_demo and name != "unaligned_matmul":
            model = torch.nn.Linear(DEMO_WIDTH, DEMO_WIDTH)
        else:
            model = torch.nn.Linear(DEMO_WIDTH, 1)
    if name == "fp16_params":
        model = model.half()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.9)
    initial = [p.detach().float().clone() for p in model.parameters()]
    opt_steps: list[bool] = []
    opt.register_step_post_hook(lambda *_: opt_steps.append(True))
    grad_norms: list[float] = []
    requested: list[float] = []
    moved_by_step: list[float] = []
    before_step: list[torch.Tensor] = []

    def _flat_params() -> torch.Tensor:
        return torch.cat([p.detach().float().flatten() for p in model.parameters()])

    def _before(optimizer, *_):
        grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
        norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads))
        grad_norms.append(norm)
        requested.append(optimizer.param_groups[0]["lr"] * norm)
        before_step[:] = [_flat_params()]

    def _after(*_):
        moved_by_step.append(float((_flat_params() - before_step[0]).norm()))

    opt.register_step_pre_hook(_before)
    opt.register_step_post_hook(_after)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the no-device GradScaler warns that CUDA is missing
        if name == "disabled_scaler":
            # The mistake as it happens on a machine without CUDA: no device given, so GradScaler targets
            # 'cuda', finds no CUDA, warns and does nothing. On a GPU machine, hide CUDA from it for this one
            # construction, so the demo plants the same mistake everywhere.
            with mock.patch.object(torch.cuda, "is_available", return_value=False):
                scaler = torch.amp.GradScaler()
        elif autocast_demo:
            # FP16 gradients overflow at 65504, where FP32's overflow at 3.4e38: the autocast loops keep
            # GradScaler's defaults and a loss of about 1 (no planted first-step overflow)
            scaler = torch.amp.GradScaler(scaler_device)
        else:
            scaler = torch.amp.GradScaler(scaler_device, init_scale=DEMO_INIT_SCALE, backoff_factor=DEMO_BACKOFF,
                                          growth_interval=1000)
    accumulation = DEMO_ACCUMULATION
    sched_steps, error = [0], None
    no_scaler = name in NO_SCALER_PITFALLS
    patches = []
    if name == "bf16_without_native_support":
        # what a GPU of compute capability 7.5 (a T4) reports, on any machine; only the autocast entry sees it
        # (torch.cuda.is_bf16_supported() says True there: BF16 runs, emulated)
        patches = [mock.patch.object(torch.cuda, "is_available", return_value=True),
                   mock.patch.object(torch.cuda, "is_bf16_supported", return_value=True),
                   mock.patch.object(torch.cuda, "get_device_capability", return_value=OLD_GPU_CAPABILITY)]
    for patch in patches:
        patch.start()
    audit = ScalerAudit(None if no_scaler else scaler, opt, scheduler=sched, accumulation_steps=accumulation,
                        model=model)
    try:
        audit.__enter__()
        try:
            for _ in range(iterations):
                opt.zero_grad(set_to_none=True)
                steps_before = len(opt_steps)
                for micro in range(accumulation):
                    x = torch.randn(16, DEMO_WIDTH, generator=gen).to(next(model.parameters()).dtype)
                    # large enough to overflow at 2**120, small enough that the unscaled gradient norm
                    # stays finite in float32 (at 1e20 its square would overflow and clipping zero it)
                    loss = ((_demo_forward(name, model, x).float() - 1.0) ** 2).mean() * (1.0 if autocast_demo
                                                                                            else 1e4)
                    if no_scaler:
                        (loss / accumulation).backward()
                        continue
                    scaler.scale(loss / accumulation).backward()
                    if name == "update_every_microbatch":  # otherwise a correct step: unscale, clip
                        scaler.unscale_(opt)
                        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                        scaler.step(opt)
                        scaler.update()
                if name == "update_every_microbatch":
                    # the loop steps its scheduler once per iteration when the optimizer stepped in it
                    if len(opt_steps) > steps_before:
                        sched.step()
                        sched_steps[0] += 1
                    continue
                if no_scaler:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    opt.step()
                    sched.step()
                    sched_steps[0] += 1
                    continue
                if name != "clip_before_unscale":
                    scaler.unscale_(opt)
                if name == "unscale_twice":
                    scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                before = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                skipped = scaler.get_scale() < before  # the public way to know the step was skipped
                if name == "scheduler_on_skipped_step" or not skipped:
                    sched.step()
                    sched_steps[0] += 1
                if name == "eval_without_autocast":
                    model.eval()
                    with torch.no_grad():
                        model(torch.randn(4, 8, generator=gen))   # evaluated without the training autocast
                    model.train()
        except (RuntimeError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
    finally:
        audit.__exit__(None, None, None)
        for patch in reversed(patches):
            patch.stop()
    moved = math.sqrt(sum(float(((p.detach().float() - p0) ** 2).sum())
                          for p, p0 in zip(model.parameters(), initial)))
    return PitfallDemo(name or "correct loop", tuple(audit.findings), error, len(opt_steps), sched_steps[0],
                       moved, float(scaler.get_scale()), tuple(grad_norms), tuple(requested),
                       tuple(moved_by_step))


AUTOCAST_PITFALLS_DTYPE = {"fp16_autocast_without_scaler": torch.float16, "scaler_with_bf16": torch.bfloat16,
                   "eval_without_autocast": torch.float16, "mixed_autocast_dtypes": torch.float16,
                   "unaligned_matmul": torch.float16, "bf16_without_native_support": torch.bfloat16}


def _scaler_device_type(device) -> str:
    """The device type a demo's GradScaler is created for: ``"cpu"``, or ``"cuda"`` where CUDA is
    available (elsewhere GradScaler would warn and disable itself, a different demo)."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a str or torch.device, got {type(device).__name__}")
    try:
        device_type = torch.device(device).type
    except RuntimeError as exc:
        raise ValueError(f"device {device!r} is not a device torch knows: {exc}") from None
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {str(device)!r}")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {str(device)!r} asks for CUDA, which is not available here (GradScaler "
                         f"would warn and disable itself); use 'cpu'")
    return device_type


def _demo_forward(name, model, x):
    """The demo loop's forward: plain, or under the autocast its pitfall needs."""
    if name not in AUTOCAST_PITFALLS_DTYPE:
        return model(x)
    if name == "mixed_autocast_dtypes":
        with torch.autocast("cpu", dtype=torch.float16):
            h = model[0](x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return model[1](h.float())
    device_type = "cuda" if name == "bf16_without_native_support" else "cpu"
    with torch.autocast(device_type, dtype=AUTOCAST_PITFALLS_DTYPE[name]):
        return model(x)
