"""Planted faults for the lessons and the tests: a module wrapped to overflow, to emit NaN forward or backward,
or to die (zero output)."""

from __future__ import annotations

import torch
from torch import nn

FAULT_KINDS = ("overflow", "nan", "nan_backward", "dead")


class _NanGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * torch.nan


class ModuleWrapper(nn.Module):
    """A module that wraps one submodule, kept as ``self.module`` (a planted fault, an FP32 island). The
    wrapper adds a ``.module`` segment to the names of what it wraps; :func:`unwrapped_name` takes it out
    again, so the monitor reports a wrapped layer's parameters under the names the reader's model gives them."""

    def __init__(self, module: nn.Module):
        super().__init__()
        if not isinstance(module, nn.Module):
            raise TypeError(f"a wrapper wraps an nn.Module, got {type(module).__name__}")
        self.module = module


def unwrapped_name(model: nn.Module, name: str) -> str:
    """``name`` (of a parameter or a submodule of ``model``) without the ``.module`` segment that each
    :class:`ModuleWrapper` on its path adds: ``blocks.1.fc.module.weight`` -> ``blocks.1.fc.weight``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    wrappers = [n for n, m in model.named_modules() if isinstance(m, ModuleWrapper)]
    # innermost first, so that a wrapper around a wrapper loses both segments
    for wrapper in sorted(wrappers, key=len, reverse=True):
        inner = f"{wrapper}.module" if wrapper else "module"
        if name == inner or name.startswith(inner + "."):
            name = wrapper + name[len(inner):] if wrapper else name[len(inner) + 1:]
    return name


class PlantedFault(ModuleWrapper):
    """Wraps ``module``; from its ``after``-th forward call in training mode on, corrupts its output:

    * ``"overflow"``: multiplies by ``factor`` and divides again. Exact in FP32 and BF16 (a power of two),
      but in FP16 an output above 65504 / factor (about 0.004 for the default 2**24) becomes inf, and
      inf / factor stays inf: an activation that outgrew FP16;
    * ``"nan"``: sets one output element to NaN (a forward bug);
    * ``"nan_backward"``: leaves the output alone, but the gradient passed back through it is NaN;
    * ``"dead"``: multiplies the output by zero (a dead layer: its weights get zero gradient).
    """

    def __init__(self, module: nn.Module, kind: str, *, after: int = 0, factor: float = 2.0**24):
        super().__init__(module)
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault {kind!r}; kinds: {', '.join(FAULT_KINDS)}")
        if isinstance(after, bool) or not isinstance(after, int) or after < 0:
            raise ValueError(f"after must be a non-negative int, got {after!r}")
        self.kind, self.after, self.factor = kind, after, float(factor)
        self.calls = 0

    def forward(self, *args, **kwargs):
        out = self.module(*args, **kwargs)
        if not self.training:
            return out
        self.calls += 1
        if self.calls <= self.after:
            return out
        if self.kind == "overflow":
            return (out * self.factor) / self.factor
        if self.kind == "nan":
            out = out.clone()
            out.view(-1)[0] = torch.nan
            return out
        if self.kind == "nan_backward":
            return _NanGrad.apply(out)
        return out * 0.0


def wrap_submodule(model: nn.Module, name: str, wrap):
    """Replace the submodule ``name`` of ``model`` (in place) by ``wrap(submodule)``; return the wrapper."""
    modules = dict(model.named_modules())
    if name not in modules or not name:
        raise ValueError(f"no submodule named {name!r}")
    parent_name, _, child = name.rpartition(".")
    parent = modules[parent_name] if parent_name else model
    wrapper = wrap(modules[name])
    setattr(parent, child, wrapper)
    return wrapper


def plant_fault(model: nn.Module, name: str, kind: str, **kwargs) -> PlantedFault:
    """Replace the submodule ``name`` of ``model`` (in place) by a :class:`PlantedFault` around it."""
    return wrap_submodule(model, name, lambda m: PlantedFault(m, kind, **kwargs))
