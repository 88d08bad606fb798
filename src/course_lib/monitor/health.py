"""Gradient health: per-parameter (and per layer output) shares that are zero, flushed, subnormal or
overflowing in a format, the alerts they raise, and the monitor that samples them during training."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch
from torch import nn

from ..formats import FloatFormat, rounds_past_max
from ..gradients import signed_format
from .faults import unwrapped_name

ALERT_KINDS = ("zero_gradients", "underflow", "non_finite_gradient", "non_finite_loss", "scale_collapse",
               "skipped_run")


@dataclass(frozen=True)
class Thresholds:
    """When the monitor raises an alert.

    ``zero_fraction``: a parameter's share of gradient values that are exactly zero (0..1).
    ``underflow_fraction``: its share of non-zero values that would flush to zero in the training dtype at
    the current scale. ``min_scale``: a loss scale below this has collapsed (a run without a scaler reports
    1.0 and never alerts at the default).
    ``skipped_run``: this many consecutive skipped steps.
    """

    zero_fraction: float = 0.5
    underflow_fraction: float = 0.25
    min_scale: float = 1.0
    skipped_run: int = 5

    def __post_init__(self) -> None:
        for name in ("zero_fraction", "underflow_fraction"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise ValueError(f"{name} must be a share in (0, 1], got {v!r}")
        if isinstance(self.min_scale, bool) or not isinstance(self.min_scale, (int, float)) or not (
                self.min_scale > 0 and math.isfinite(self.min_scale)):
            raise ValueError(f"min_scale must be a positive finite number, got {self.min_scale!r}")
        if isinstance(self.skipped_run, bool) or not isinstance(self.skipped_run, int) or self.skipped_run < 1:
            raise ValueError(f"skipped_run must be a positive int, got {self.skipped_run!r}")


@dataclass(frozen=True)
class GradientStats:
    """One parameter's gradient at one step (true gradient: divided by the loss scale).

    Shares are of all its values: ``zero`` exactly zero; ``flush`` non-zero but zero once multiplied by the
    scale and rounded to the training dtype; ``subnormal`` landing in that dtype's subnormals; ``overflow``
    rounding past its largest value (:func:`course_lib.formats.overflow_boundary`). ``non_finite``: count of inf/NaN values. ``norm``: L2 norm (of finite ones)."""

    name: str
    numel: int
    zero: float
    flush: float
    subnormal: float
    overflow: float
    non_finite: int
    norm: float


def gradient_stats(name: str, grad: torch.Tensor, fmt: str | FloatFormat, scale: float = 1.0) -> GradientStats:
    """Classify the values of ``grad`` (a true gradient) as they would be stored in ``fmt`` after
    multiplying by ``scale`` (a positive finite number), rounding to nearest even: the classes of
    :func:`course_lib.gradients.summarize_underflow`, by comparison with the rounding boundaries, in float64.
    ``fmt`` must be signed (E8M0, unsigned, is refused as there)."""
    return gradient_stats_many([(name, grad)], fmt, scale)[0]


def gradient_stats_many(named: list[tuple[str, torch.Tensor]] | tuple[tuple[str, torch.Tensor], ...],
                        fmt: str | FloatFormat, scale: float = 1.0) -> tuple[GradientStats, ...]:
    """:func:`gradient_stats` of each ``(name, grad)``, computed on the gradients' device and brought to the
    host in one transfer per device (one ``tolist()`` of a ``[gradients, 6]`` float64 tensor: five counts,
    exact below 2**53, and the norm), so that a GPU waits for the host once per call, not once per statistic.
    The same arithmetic as one gradient at a time, so the same values bit for bit."""
    f = signed_format(fmt)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(f"scale must be a real number, got {type(scale).__name__} {scale!r}")
    if not (scale > 0 and math.isfinite(scale)):
        raise ValueError(f"scale must be a positive finite number, got {scale!r}")
    for name, grad in named:
        if not isinstance(grad, torch.Tensor):
            raise TypeError(f"the gradient of {name!r} must be a tensor, got {type(grad).__name__}")
    results: dict[int, GradientStats] = {}
    by_device: dict[torch.device, list[int]] = {}
    for i, (name, grad) in enumerate(named):
        if grad.numel() == 0:
            results[i] = GradientStats(name, 0, 0.0, 0.0, 0.0, 0.0, 0, 0.0)
        else:
            by_device.setdefault(grad.device, []).append(i)
    for indices in by_device.values():
        rows = _device_statistics([named[i][1] for i in indices], f, float(scale)).tolist()   # the one transfer
        for i, row in zip(indices, rows):
            name, n = named[i][0], named[i][1].numel()
            non_finite, zero, flush, subnormal, overflow, norm = row
            results[i] = GradientStats(name, n, zero / n, flush / n, subnormal / n, overflow / n, int(non_finite),
                                       norm)
    return tuple(results[i] for i in range(len(named)))


def _device_statistics(grads: list[torch.Tensor], f: FloatFormat, scale: float) -> torch.Tensor:
    """``[len(grads), 6]`` float64 on the gradients' device: per gradient its counts and
    the L2 norm of its finite values (counts of non-finite, zero, flushed, subnormal and overflowing
    values, in this order). The elementwise classes run once over all gradients concatenated; the
    norms per gradient, as one gradient alone would take them (a reduction's order depends on its input)."""
    finite_abs, finite = [], []
    for grad in grads:
        a = grad.detach().abs().double().flatten()
        ok = torch.isfinite(a)
        finite.append(ok)
        finite_abs.append(torch.where(ok, a, 0.0))
    norms = torch.stack([torch.linalg.vector_norm(a) for a in finite_abs])
    a, ok = torch.cat(finite_abs), torch.cat(finite)
    x = a * scale
    half_sub = f.min_subnormal / 2                      # at or below: rounds to zero (a tie goes to even, 0)
    classes = torch.stack([~ok, ok & (a == 0), (a > 0) & (x <= half_sub),
                           (x > half_sub) & (x < f.min_normal - half_sub), rounds_past_max(x, f)])
    # integer counts: exact in any order of summation
    counts = torch.stack([c.sum(1) for c in classes.split([g.numel() for g in grads], dim=1)])
    return torch.cat([counts.double(), norms[:, None]], 1)


@dataclass(frozen=True)
class Alert:
    """A threshold crossed: ``kind`` (one of :data:`ALERT_KINDS`), at optimizer ``step``, for ``layer``
    (a parameter name, or None for run-level alerts), with a message for the reader."""

    step: int
    kind: str
    layer: str | None
    message: str


@dataclass
class MonitorLog:
    """What the monitor saw: per step the loss, scale and skipped flag; per sampled step, each parameter's
    :class:`GradientStats`."""

    steps: list[int] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    sampled_steps: list[int] = field(default_factory=list)
    gradients: list[tuple[GradientStats, ...]] = field(default_factory=list)

    def layer_series(self, attribute: str = "zero") -> dict[str, list[float]]:
        """Per parameter, ``attribute`` of its stats at each sampled step."""
        series: dict[str, list[float]] = {}
        for stats in self.gradients:
            for s in stats:
                series.setdefault(s.name, []).append(getattr(s, attribute))
        return series


class GradientHealthMonitor:
    """Watches a model's gradients and a run's loss scale, and raises :class:`Alert` s.

    ``dtype``: the low-precision dtype gradients pass through (``torch.float16`` under FP16 autocast with a
    scaler, ``torch.bfloat16`` for BF16). ``every``: measure gradients every this many steps (1: every step;
    the run-level checks run every step). ``layers``: parameter names to watch (default: every parameter
    with ``requires_grad``; a name may leave out the ``.module`` segment of a wrapper such as a planted fault,
    as every name the monitor reports does). Each (kind, layer) alert is raised once, where first seen, until
    :meth:`rearm` (a run rolled back to a checkpoint is watched afresh). Embedding tables are not checked
    for zero gradients: the rows of tokens absent from a batch are zero by construction.

    ``activations``: also watch the gradient of every ``nn.Linear``'s *output* (named ``"<layer>:grad_output"``).
    Under autocast these are the low-precision tensors of the backward pass, where FP16 underflow happens; a
    parameter's ``.grad`` is stored in FP32 but was computed in FP16 and cast up, so what FP16 flushed is
    already zero there. Call :meth:`close` to remove the hooks."""

    def __init__(self, model: nn.Module, *, dtype: torch.dtype | str = torch.float16, every: int = 10,
                 thresholds: Thresholds | None = None, layers: tuple[str, ...] | None = None,
                 activations: bool = False):
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int, got {every!r}")
        # names as the reader's model gives them: a planted fault's or an FP32 island's ``.module`` left out
        params = [(unwrapped_name(model, n), p) for n, p in model.named_parameters() if p.requires_grad]
        if not params:
            raise ValueError("the model has no parameters that require gradients: nothing to monitor")
        if layers is not None:
            known = dict(params)
            known.update({n: p for n, p in model.named_parameters() if p.requires_grad})   # raw names too
            missing = [n for n in layers if n not in known]
            if missing:
                raise ValueError(f"no parameter named {missing[0]!r}; parameters: {', '.join(n for n, _ in params)}")
            params = [(unwrapped_name(model, n), known[n]) for n in layers]
        self.params = params
        self._sparse = {unwrapped_name(model, f"{mn}.{pn}" if mn else pn) for mn, m in model.named_modules()
                        if isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for pn, _ in m.named_parameters(recurse=False)}
        self.format = signed_format(dtype if isinstance(dtype, str) else str(dtype).replace("torch.", ""))
        self.every = every
        self.thresholds = thresholds if thresholds is not None else Thresholds()
        if not isinstance(self.thresholds, Thresholds):
            raise TypeError("thresholds must be a Thresholds")
        self.log = MonitorLog()
        self.alerts: list[Alert] = []
        self._raised: set[tuple[str, str | None]] = set()
        self._skipped_run = 0
        self._pending: list[tuple[str, int, float]] = []
        self.host_transfers = 0   # device-to-host copies of statistics so far: one per sampled step and device
        self._grad_outputs: dict[str, torch.Tensor] = {}
        self._handles: list = []
        if activations:
            for mname, m in model.named_modules():
                if isinstance(m, nn.Linear):
                    self._handles.append(m.register_full_backward_hook(self._hook_for(unwrapped_name(model, mname))))

    def _hook_for(self, name: str):
        def hook(module, grad_input, grad_output):
            self._keep_grad_output(name, grad_output)
        return hook

    def _keep_grad_output(self, name: str, grad_output) -> None:
        if grad_output and isinstance(grad_output[0], torch.Tensor):
            self._grad_outputs[name] = grad_output[0].detach()

    def close(self) -> None:
        """Remove the activation hooks (if any)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def rearm(self) -> None:
        """Forget which alerts were raised and the run of skipped steps, so that each can be raised again
        (``alerts`` and ``log`` keep what happened). Call it when the run is rolled back to a checkpoint."""
        self._raised.clear()
        self._skipped_run = 0

    def _alert(self, step: int, kind: str, layer: str | None, message: str) -> None:
        if (kind, layer) not in self._raised:
            self._raised.add((kind, layer))
            self.alerts.append(Alert(step, kind, layer, message))

    def should_sample(self, step: int) -> bool:
        return step % self.every == 0

    def after_backward(self, step: int, *, scale: float = 1.0) -> tuple[GradientStats, ...] | None:
        """Call after ``backward()`` (before the optimizer step), with the loss scale the gradients carry
        (1.0 without a scaler). Measures the gradients on sampled steps; returns their stats, or None."""
        if not self.should_sample(step):
            self._grad_outputs = {}
            return None
        if isinstance(scale, bool) or not (isinstance(scale, (int, float)) and scale >= 0 and math.isfinite(scale)):
            raise ValueError(f"scale must be a finite number >= 0, got {scale!r}")
        if scale == 0:
            # GradScaler halves its scale on every overflow and reaches 0.0 after a long enough run of them
            # (torch does not stop it); the gradients were multiplied by zero and say nothing about the true
            # ones. Nothing to classify: after_step raises scale_collapse.
            self._grad_outputs = {}
            self._pending = []
            self.log.sampled_steps.append(step)
            self.log.gradients.append(())
            return ()
        t = self.thresholds
        self._pending = []
        # every parameter's and output gradient's statistics in one batch: one transfer to the host per
        # device, not one per statistic (each of which would make the host wait for the GPU)
        named = [(name, p.grad.float() / scale) for name, p in self.params if p.grad is not None]
        n_params = len(named)
        # activation gradients carry the loss scale as they are: classify them as stored
        named += [(f"{name}:grad_output", g.float() / scale) for name, g in self._grad_outputs.items()]
        self.host_transfers += len({g.device for _, g in named if g.numel()})
        stats = gradient_stats_many(named, self.format, scale)
        for s in stats[:n_params]:
            name = s.name
            if s.non_finite:
                # an overflow the scaler will skip is the scaler working; alert in after_step only if the
                # step went ahead with it
                self._pending.append((name, s.non_finite, scale))
            if s.zero >= t.zero_fraction and name not in self._sparse:
                self._alert(step, "zero_gradients", name, f"{name}: {100 * s.zero:.0f}% of the gradient is exactly "
                            f"zero at step {step} (limit {100 * t.zero_fraction:.0f}%)")
            nonzero = 1.0 - s.zero
            if nonzero > 0 and s.flush / nonzero >= t.underflow_fraction:
                self._alert(step, "underflow", name, f"{name}: {100 * s.flush / nonzero:.0f}% of the non-zero "
                            f"gradient would flush to zero in {self.format.name} at scale {scale:g} (step {step})")
        for s in stats[n_params:]:
            nonzero = 1.0 - s.zero
            if nonzero > 0 and s.flush / nonzero >= t.underflow_fraction:
                self._alert(step, "underflow", s.name, f"{s.name}: {100 * s.flush / nonzero:.0f}% of the non-zero "
                            f"activation gradient would flush to zero in {self.format.name} at scale {scale:g} "
                            f"(step {step})")
        self._grad_outputs = {}
        result = tuple(stats)
        self.log.sampled_steps.append(step)
        self.log.gradients.append(result)
        return result

    def after_step(self, step: int, *, loss: float, scale: float = 1.0, skipped: bool = False) -> None:
        """Call once per optimizer step, after it (or after it was skipped)."""
        t = self.thresholds
        self.log.steps.append(step)
        self.log.losses.append(float(loss))
        self.log.scales.append(float(scale))
        self.log.skipped.append(bool(skipped))
        self._skipped_run = self._skipped_run + 1 if skipped else 0
        if self._skipped_run >= t.skipped_run:
            self._alert(step, "skipped_run", None, f"{self._skipped_run} consecutive skipped steps up to step {step}: "
                        "the scale keeps overflowing")
        if scale < t.min_scale:
            self._alert(step, "scale_collapse", None, f"loss scale {scale:g} at step {step} (limit {t.min_scale:g}): "
                        "the run is overflowing even without scaling")
        if not math.isfinite(float(loss)):
            self._alert(step, "non_finite_loss", None, f"the loss is {loss} at step {step}: the forward pass "
                        "overflowed or produced a NaN, which no loss scale can fix")
        if not skipped:
            for name, count, s in self._pending:
                self._alert(step, "non_finite_gradient", name, f"{name}: {count} inf/NaN gradient values reached "
                            f"the optimizer at step {step} (scale {s:g}); nothing skipped the step")
        self._pending = []

    def alerts_of(self, kind: str) -> list[Alert]:
        if kind not in ALERT_KINDS:
            raise ValueError(f"unknown alert kind {kind!r}; kinds: {', '.join(ALERT_KINDS)}")
        return [a for a in self.alerts if a.kind == kind]


def step_was_skipped(scale_before: float, scale_after: float) -> bool:
    """Whether a ``torch.amp.GradScaler`` skipped the optimizer step, from ``scaler.get_scale()`` read before
    and after ``scaler.update()``: True when the scale fell.

    ``update()`` multiplies the scale by ``backoff_factor`` (below 1; GradScaler refuses any other) exactly
    when ``scaler.step`` found an inf or NaN gradient and skipped the step; otherwise it keeps the scale, or
    multiplies it by ``growth_factor`` (above 1) after ``growth_interval`` good steps in a row. A disabled
    scaler reads 1.0 both times and never skips. With several optimizers on one scaler, a fall means at least
    one of them skipped; a loop that passes its own ``new_scale`` to ``update()`` cannot read skips this way. A scale of 0 cannot fall any further, so its change cannot tell: that is a
    ``ValueError`` (the monitor's ``scale_collapse`` alert has fired long before)."""
    values = {"scale_before": scale_before, "scale_after": scale_after}
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"{name} must be a number (scaler.get_scale()), got {type(v).__name__}")
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if scale_before == 0:
        raise ValueError("the scale was already 0: GradScaler cannot lower it further, so its change does not "
                         "say whether the step was skipped (the scale has collapsed)")
    return scale_after < scale_before
