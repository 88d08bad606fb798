"""Gradient edits under a loss scaler: the step with its edit in the one right place (after ``unscale_``),
global-norm, per-tensor and adaptive (AGC) clipping, and the global gradient norm. Lesson 3 measures them
(``studies.clipping``); the tests check them against torch's clipping and hand-computed values."""

from __future__ import annotations

import math

import torch

AGC_EPS = 1e-3   # AGC's floor on a unit's weight norm (timm's and NFNets' default)

def check_positive(name: str, value) -> float:
    """``value`` as a float, or a TypeError/ValueError naming ``name`` unless it is a positive finite number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def tensor_norm(tensors) -> float:
    """The L2 norm of several tensors together, as one vector."""
    return float(torch.linalg.vector_norm(torch.cat([t.flatten() for t in tensors])))


def _with_grads(parameters) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(parameter, gradient) for each parameter that has a gradient."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    return [(p, p.grad) for p in parameters if p.grad is not None]



def unitwise_norm(x: torch.Tensor) -> torch.Tensor:
    """The norm AGC compares, per unit: for a tensor of two or more dimensions, the L2 norm of each slice
    along the first (output) dimension, shaped to broadcast against ``x`` (``[out, 1, ...]``); for a
    vector or a scalar, the norm of the whole tensor (as timm's ``adaptive_clip_grad`` does)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a tensor, got {type(x).__name__}")
    if x.ndim <= 1:
        return x.norm()
    return x.norm(dim=tuple(range(1, x.ndim)), keepdim=True)


def adaptive_clip_grad_(parameters, clipping: float = 0.01,
                        eps: float = AGC_EPS) -> int:
    """Adaptive gradient clipping (Brock et al., 2021, NFNets), in place:
    each unit's gradient is scaled down to at most ``clipping`` times the
    norm of that unit's weights (floored at ``eps``, so that a unit whose
    weights are zero can still move). Units as in :func:`unitwise_norm`.
    Returns how many units were clipped. Call it after ``scaler.unscale_``:
    it compares gradients with weights."""
    clipping = check_positive("clipping", clipping)
    eps = check_positive("eps", eps)
    clipped = 0
    with torch.no_grad():
        for p, grad in _with_grads(parameters):
            limit = clipping * unitwise_norm(p.detach()).clamp_min(eps)
            norm = unitwise_norm(grad)
            too_big = norm > limit
            clipped += int(too_big.sum())
            factor = limit / norm.clamp_min(1e-12)
            grad.mul_(torch.where(too_big, factor, torch.ones_like(norm)))
    return clipped


def clip_per_tensor_norm_(parameters, max_norm: float) -> int:
    """Clip each tensor's gradient to L2 norm ``max_norm`` on its own (``clip_grad_norm_`` per tensor);
    returns how many tensors were clipped."""
    max_norm = check_positive("max_norm", max_norm)
    clipped = 0
    for p, _ in _with_grads(parameters):
        clipped += int(float(torch.nn.utils.clip_grad_norm_([p], max_norm)) > max_norm)
    return clipped


def scaled_step(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer,
                loss: torch.Tensor, edit) -> None:
    """One training step under a loss scaler, with a gradient edit in its
    one right place."""
    params = [p for group in opt.param_groups for p in group["params"]]
    scaler.scale(loss).backward()
    scaler.unscale_(opt)  # from here on p.grad holds the true gradients
    edit(params)  # clip_grad_norm_, clip_grad_value_, AGC, a penalty, a mask
    # steps on the edited gradients; skips if unscale_ found an inf or NaN
    scaler.step(opt)
    scaler.update()


def global_grad_norm(parameters) -> float:
    """L2 norm of all gradients together (inf or nan when one is not finite; 0 with no gradient)."""
    grads = [g.detach().float() for _, g in _with_grads(parameters)]
    return tensor_norm(grads) if grads else 0.0
