"""Finding the first non-finite value: forward and backward hooks on every module, and the report naming the
module, the pass and its inputs; with ``ops=True``, also the operation inside the module's forward (a
``torch.overrides.TorchFunctionMode`` that checks every torch function's arguments and results)."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from .faults import unwrapped_name


@dataclass(frozen=True)
class TensorSummary:
    """Shape, dtype, largest finite magnitude and counts of NaN and inf of one tensor."""

    shape: tuple[int, ...]
    dtype: str
    max_abs: float
    nan: int
    inf: int


def _summary(t: torch.Tensor) -> TensorSummary:
    d = t.detach()
    finite = torch.isfinite(d)
    max_abs = float(d[finite].abs().max()) if bool(finite.any()) else math.nan
    return TensorSummary(tuple(d.shape), str(d.dtype).replace("torch.", ""), max_abs, int(torch.isnan(d).sum()),
                         int(torch.isinf(d).sum()))


def _nonfinite_argument(x) -> bool:
    """Whether ``x`` (a tensor, a Python float, or a container of them) holds an inf or a NaN."""
    if isinstance(x, torch.Tensor):
        return x.is_floating_point() and not bool(torch.isfinite(x).all())
    if isinstance(x, float):
        return not math.isfinite(x)
    if isinstance(x, (tuple, list)):
        return any(_nonfinite_argument(item) for item in x)
    if isinstance(x, dict):
        return any(_nonfinite_argument(item) for item in x.values())
    return False


def _op_name(func) -> str:
    """``matmul`` for ``Tensor.__matmul__``, ``softmax`` for ``torch.softmax``, ``linear`` for ``F.linear``."""
    name = getattr(func, "__name__", None) or str(func)
    return name.strip("_") or name


def _tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x] if x.is_floating_point() else []
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _tensors(item)]
    return []


@dataclass(frozen=True)
class NonFiniteReport:
    """The first module that produced a non-finite value: its qualified ``module`` name, ``phase``
    (``"forward"``: its output; ``"backward"``: the gradient it passed to its inputs), and summaries of what
    went in and came out (in backward: the gradient of its output, and of its inputs). ``op`` names the
    torch operation inside the module's forward (``"matmul"``, ``"linear"``, ``"softmax"``) when the locator
    watched operations; ``inputs`` and ``outputs`` are then that operation's tensors."""

    module: str
    phase: str
    inputs: tuple[TensorSummary, ...]
    outputs: tuple[TensorSummary, ...]
    op: str | None = None

    def describe(self) -> str:
        ins = "; ".join(f"{s.dtype}{list(s.shape)} max {s.max_abs:.3g}, {s.nan} NaN, {s.inf} inf" for s in self.inputs)
        outs = "; ".join(f"{s.dtype}{list(s.shape)} {s.nan} NaN, {s.inf} inf" for s in self.outputs)
        where = f"`{self.op}` in `{self.module}`" if self.op else f"`{self.module}`"
        return f"{where} in the {self.phase} pass: inputs {ins or 'none'} -> outputs {outs}"


class _FirstNonFiniteOp(TorchFunctionMode):
    """Checks every torch function called while active: the first whose arguments (tensors and Python
    floats) are all finite and whose result is not is kept, with the module ``where()`` names."""

    def __init__(self, where):
        super().__init__()
        self._where = where
        self.found: NonFiniteReport | None = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.found is not None:
            return func(*args, **kwargs)
        # arguments are checked before the call: an in-place op overwrites them
        # (a deliberate -inf, as in masked_fill(mask, float("-inf")), is a non-finite argument, so not a culprit)
        clean = not _nonfinite_argument(args) and not _nonfinite_argument(kwargs)
        summaries = tuple(_summary(t) for t in _tensors(args) + _tensors(kwargs)) if clean else ()
        out = func(*args, **kwargs)
        if clean:
            outs = _tensors(out)
            if any(not bool(torch.isfinite(t).all()) for t in outs):
                self.found = NonFiniteReport(self._where(), "forward", summaries,
                                             tuple(_summary(t) for t in outs), op=_op_name(func))
        return out


class NonFiniteLocator:
    """Context manager: hooks the forward and backward of every module of ``model`` and records the first
    (innermost, earliest) one whose output, or whose gradient with respect to its inputs, holds an inf or a
    NaN while its inputs did not. ``report`` is None when nothing went non-finite. ``modules`` restricts
    the check to the named modules.

    ``ops=True`` also watches every torch operation of the forward pass (not the backward, which runs in
    autograd's engine) and names the first that turned finite arguments into a non-finite result, inside
    the innermost module running at the time. It reads every result back to the host, so it is for
    re-running one failing step, not for training."""

    def __init__(self, model: nn.Module, *, modules: tuple[str, ...] | None = None, ops: bool = False):
        if not isinstance(ops, bool):
            raise TypeError(f"ops must be a bool, got {type(ops).__name__}")
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
        named = dict(model.named_modules())
        if modules is None:
            # every module, containers included: hooks fire inner modules first, so the first module seen
            # with finite inputs and a non-finite output is the innermost one that made it (a container is
            # named when the culprit is an operation in its own forward, not a submodule)
            # (named without a wrapper's `.module`: a culprit inside a planted fault is named as the layer)
            chosen = [(unwrapped_name(model, n) or "(model)", m) for n, m in named.items()]
        else:
            missing = [n for n in modules if n not in named]
            if missing:
                raise ValueError(f"no module named {missing[0]!r}")
            chosen = [(n, named[n]) for n in modules]
        if not chosen:
            chosen = [("(model)", model)]
        self._chosen = chosen
        self._handles: list = []
        self._report: NonFiniteReport | None = None
        self._ops = ops
        self._stack: list[str] = []
        self._mode: _FirstNonFiniteOp | None = None

    @property
    def report(self) -> NonFiniteReport | None:
        """The first non-finite value's origin; in the forward pass, the operation's report when ``ops``
        found one (the module hooks name the module only)."""
        found = self._mode.found if self._mode is not None else None
        if found is not None and (self._report is None or self._report.phase == "forward"):
            return found
        return self._report

    def _record(self, name: str, phase: str, ins, outs) -> None:
        if phase == "forward" and self._stack:
            self._stack.pop()
        if self._report is not None:
            return
        out_t = _tensors(outs)
        if not any(not bool(torch.isfinite(t).all()) for t in out_t):
            return
        in_t = _tensors(ins)
        if any(not bool(torch.isfinite(t).all()) for t in in_t):
            return   # it passed on a non-finite value; the culprit is upstream
        self._report = NonFiniteReport(name, phase, tuple(_summary(t) for t in in_t),
                                       tuple(_summary(t) for t in out_t))

    def __enter__(self) -> "NonFiniteLocator":
        # modules whose inputs need no gradient (an embedding's token ids) make torch warn that their full
        # backward hook sees only output gradients; expected here, and not the reader's concern
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        self._stack.clear()
        for name, module in self._chosen:
            self._handles.append(module.register_forward_pre_hook(
                lambda m, i, name=name: self._stack.append(name)))
            self._handles.append(module.register_forward_hook(
                lambda m, i, o, name=name: self._record(name, "forward", i, o)))
            self._handles.append(module.register_full_backward_hook(
                lambda m, gi, go, name=name: self._record(name, "backward", go, gi)))
        if self._ops:
            self._mode = _FirstNonFiniteOp(lambda: self._stack[-1] if self._stack else "(outside the model)")
            self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> Literal[False]:
        if self._mode is not None and self._ops:
            self._mode.__exit__(None, None, None)
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._warnings.__exit__(None, None, None)
        return False


def anomaly_mode_raises(value: float) -> bool:
    """Whether ``torch.autograd.detect_anomaly(check_nan=True)`` raises on a backward pass whose gradient
    is ``value`` (e.g. ``math.inf`` or ``math.nan``)."""
    x = torch.ones(3, requires_grad=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with torch.autograd.detect_anomaly(check_nan=True):
                (x * value).sum().backward()
    except RuntimeError:
        return True
    return False
