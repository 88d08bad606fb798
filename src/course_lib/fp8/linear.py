"""FP8 matrix products and linear layers: ``fp8_matmul`` (simulated or ``torch._scaled_mm``), the per-operand
scaling of torchao's recipes, :class:`Fp8Linear` and ``convert_to_fp8``; :class:`QuantizedLinear` is the
shell the block-scaled layers of :mod:`course_lib.mx` share."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.nn as nn

from ..hardware import scaled_mm_unsupported_reason
from .casts import Fp8Tensor
from .recipes import BlockwiseScaling, CurrentScaling, DelayedScaling, RowwiseScaling, ScalingRecipe, StaticScaling


def _scaled_mm_inverse(q: Fp8Tensor, side: str) -> torch.Tensor:
    """``q``'s inverse scales in the shape ``torch._scaled_mm`` takes for operand ``side`` ("a": [M, 1]
    or a scalar; "b": [1, N] or a scalar), or ValueError for block scales it does not take."""
    rows, cols = q.data.shape
    inv = q.scales.reciprocal()
    if q.per_tensor:
        return inv.reshape(())
    if side == "a" and q.block == (1, cols):
        return inv.reshape(rows, 1)
    if side == "b" and q.block == (rows, 1):
        return inv.reshape(1, cols)
    raise ValueError(f"torch._scaled_mm takes one scale per tensor or per row/column, not {q.block[0]} x "
                     f"{q.block[1]} blocks: use backend='simulated'")


def _materialised(scalar: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``scalar`` repeated into a fresh ``shape`` tensor with row-major strides. ``_scaled_mm`` checks
    ``stride(1) == 1``; an expanded scalar has strides 0, and ``.contiguous()`` does not copy a ``[1, 1]``
    expansion (one row of ``a``, one column of ``b``): a size-1 dimension's stride does not count."""
    return scalar.expand(shape).clone(memory_format=torch.contiguous_format)


def fp8_matmul(a: Fp8Tensor, b: Fp8Tensor, *, backend: str = "simulated",
               out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """``a @ b`` of two scaled FP8 tensors (``[M, K] @ [K, N]``), with the scales applied.

    ``backend="simulated"``: dequantise both (codes times inverse scales, in FP32) into row-major ``[M, K]``
    and ``[K, N]`` operands and multiply them with ``torch.matmul``; runs anywhere, any block shape.
    ``backend="scaled_mm"``: ``torch._scaled_mm`` on the codes, per-tensor or row/column scales only.

    On the CPU the two agree bit for bit, on every shape, with torch's reference kernel
    (``_scaled_mm_out_cpu_emulated``): it dequantises the same way, makes both operands row-major and calls
    the same FP32 ``matmul``. The layout matters: the BLAS sums in an order that depends on it for some
    shapes (one or two rows, say). Where torch hands an FP8 product to oneDNN instead (x86 CPUs with
    AMX-INT8 and oneDNN enabled; seen for per-tensor scales with both operands in one FP8 format), that
    kernel sums the code products in its own order and applies the scales after, so it agrees only within
    FP32 rounding error (``torch.backends.mkldnn.flags(enabled=False)`` restores the reference). On a GPU
    the FP8 tensor cores accumulate differently (see :func:`accumulation_error`), and per-row scales may take
    only a BF16 ``out_dtype`` (torchao asks for BF16 and casts back)."""
    if a.data.shape[1] != b.data.shape[0]:
        raise ValueError(f"inner dimensions differ: {tuple(a.data.shape)} @ {tuple(b.data.shape)}")
    if backend == "simulated":
        # row-major operands, as torch's CPU reference kernel makes them: the summation order follows
        return torch.matmul(a.values().contiguous(), b.values().contiguous()).to(out_dtype)
    if backend == "scaled_mm":
        if not hasattr(torch, "_scaled_mm"):  # pragma: no cover - torch 2.11+ has it
            raise ValueError("this torch has no torch._scaled_mm: use backend='simulated'")
        # _scaled_mm wants a row-major and b column-major
        b_col = b.data.t().contiguous().t()
        sa, sb = _scaled_mm_inverse(a, "a"), _scaled_mm_inverse(b, "b")
        if sa.dim() or sb.dim():
            why = scaled_mm_unsupported_reason(a.data.device, row_scales=True)
            if why is not None:
                raise ValueError(f"row/column scales need a _scaled_mm that takes them: {why}; use "
                                 f"backend='simulated'")
        if sa.dim() != sb.dim():
            # one operand per tensor, the other per row/column: _scaled_mm takes the row-wise form only
            sa = _materialised(sa, (a.data.shape[0], 1)) if sa.dim() == 0 else sa
            sb = _materialised(sb, (1, b.data.shape[1])) if sb.dim() == 0 else sb
        return torch._scaled_mm(a.data.contiguous(), b_col, scale_a=sa, scale_b=sb, out_dtype=out_dtype)
    raise ValueError(f"backend must be 'simulated' or 'scaled_mm', got {backend!r}")


@dataclass
class LinearScaling:
    """The scaling of the six FP8 casts of one linear layer's three products.

    ``output = x @ w.T`` reduces over K: ``x`` and ``w`` scaled along their rows. ``grad_x = g @ w``
    reduces over N: ``g`` along rows, ``w`` along columns. ``grad_w = g.T @ x`` reduces over M: ``g`` and
    ``x`` along columns. A role given the *same* recipe object as another is cast once and reused (a
    per-tensor scale serves both products, as in torchao's tensorwise and Transformer Engine).
    ``grad_weight_high_precision``: compute ``grad_w`` from the unquantised tensors (torchao's
    ``rowwise_with_gw_hp``).
    """

    x: ScalingRecipe
    w: ScalingRecipe
    g: ScalingRecipe
    x_for_grad_w: ScalingRecipe
    w_for_grad_x: ScalingRecipe
    g_for_grad_w: ScalingRecipe
    grad_weight_high_precision: bool = False


def _rowwise_pair(fmt):
    return RowwiseScaling(fmt, axis=-1), RowwiseScaling(fmt, axis=0)


def linear_scaling(recipe: str, *, block: int = 128) -> LinearScaling:
    """Fresh per-layer scaling state for an FP8 training recipe:

    * ``"tensorwise"``: current per-tensor scaling, E4M3 forward, E5M2 gradients (torchao's default);
    * ``"rowwise"``: row/column scales rounded to powers of two, E4M3 everywhere (torchao);
    * ``"rowwise_with_gw_hp"``: rowwise, with the weight gradient in high precision (torchao);
    * ``"delayed"``: Transformer Engine's ``DelayedScaling`` defaults (history 1024, max, margin 0),
      HYBRID (E4M3 forward, E5M2 gradients);
    * ``"blockwise"``: DeepSeek-V3: E4M3, ``1 x block`` tiles for activations and gradients (``block x 1``
      where a product reduces over rows), ``block x block`` for weights;
    * ``"unscaled"``: E4M3 forward, E5M2 gradients, every scale 1: the control with no scaling.
    """
    x: ScalingRecipe
    w: ScalingRecipe
    g: ScalingRecipe
    if recipe == "tensorwise":
        x, w, g = CurrentScaling("e4m3"), CurrentScaling("e4m3"), CurrentScaling("e5m2")
        return LinearScaling(x, w, g, x, w, g)
    if recipe in ("rowwise", "rowwise_with_gw_hp"):
        (x, xc), (w, wc), (g, gc) = _rowwise_pair("e4m3"), _rowwise_pair("e4m3"), _rowwise_pair("e4m3")
        if recipe == "rowwise_with_gw_hp":
            # torchao: grad_x uses a per-tensor weight scale; grad_w runs in high precision
            return LinearScaling(x, w, g, xc, CurrentScaling("e4m3", power_of_two=True), gc,
                                 grad_weight_high_precision=True)
        return LinearScaling(x, w, g, xc, wc, gc)
    if recipe == "delayed":
        x, w, g = DelayedScaling("e4m3"), DelayedScaling("e4m3"), DelayedScaling("e5m2")
        return LinearScaling(x, w, g, x, w, g)
    if recipe == "blockwise":
        rows, cols = BlockwiseScaling("e4m3", block=(1, block)), BlockwiseScaling("e4m3", block=(block, 1))
        grows, gcols = BlockwiseScaling("e4m3", block=(1, block)), BlockwiseScaling("e4m3", block=(block, 1))
        w = BlockwiseScaling("e4m3", block=(block, block))
        return LinearScaling(rows, w, grows, cols, w, gcols)
    if recipe == "unscaled":
        x, w, g = StaticScaling("e4m3"), StaticScaling("e4m3"), StaticScaling("e5m2")
        return LinearScaling(x, w, g, x, w, g)
    raise ValueError(f"unknown FP8 linear recipe {recipe!r}; known: {', '.join(FP8_LINEAR_RECIPES)}")


class _Fp8LinearFunction(torch.autograd.Function):
    # out_dtype: the dtype of the output and of the input gradient (FP32 for the FP32 shell; BF16 for a layer
    # with BF16 inputs and outputs, as _scaled_mm writes it); the weight gradient is always FP32, the master's
    @staticmethod
    def forward(ctx, x2, weight, scaling: LinearScaling, backend: str, out_dtype: torch.dtype):
        xq = scaling.x.quantize(x2)
        wq = scaling.w.quantize(weight)
        out = fp8_matmul(xq, wq.t(), backend=backend, out_dtype=out_dtype)
        ctx.scaling, ctx.backend, ctx.out_dtype = scaling, backend, out_dtype
        ctx.xq, ctx.wq = xq, wq
        ctx.save_for_backward(x2, weight)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x2, weight = ctx.saved_tensors
        s, backend = ctx.scaling, ctx.backend
        # the codes do not depend on the gradient's dtype (every cast scales in FP32), so a BF16 gradient is
        # quantised as it comes, without an FP32 copy
        g = grad_out if grad_out.dtype == torch.bfloat16 else grad_out.float()
        gq = s.g.quantize(g)
        # grad_x = g @ w: the weight scaled along columns (reused when one scale serves both products)
        wq = ctx.wq if s.w_for_grad_x is s.w else s.w_for_grad_x.quantize(weight)
        grad_x = fp8_matmul(gq, wq, backend=backend, out_dtype=ctx.out_dtype)
        if s.grad_weight_high_precision:
            grad_w = g.float().t() @ x2.float()
        else:
            gq_w = gq if s.g_for_grad_w is s.g else s.g_for_grad_w.quantize(g)
            xq_w = ctx.xq if s.x_for_grad_w is s.x else s.x_for_grad_w.quantize(x2)
            grad_w = fp8_matmul(gq_w.t(), xq_w, backend=backend)
        return grad_x.to(x2.dtype), grad_w.to(weight.dtype), None, None, None


_Q = TypeVar("_Q", bound="QuantizedLinear")


class QuantizedLinear(nn.Module):
    """The shell the course's emulated low-precision linear layers share: an FP32 master weight and bias
    initialised as ``nn.Linear`` does, the three products done by the subclass's :meth:`_product` on a 2-D
    FP32 input outside autocast, the bias added in FP32, and the output in the input's dtype."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    @classmethod
    def from_linear(cls: type[_Q], linear: nn.Linear, **kwargs) -> _Q:
        """A layer of this kind with ``linear``'s weights, on its device (``kwargs`` go to the constructor)."""
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, **kwargs)
        with torch.no_grad():
            layer.weight.copy_(linear.weight)
            if linear.bias is not None and layer.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer.to(linear.weight.device)

    def _product(self, x2: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    #: when True (see :func:`exact_products`), the product runs in plain FP32, unquantised
    exact: bool = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        with torch.autocast(x.device.type, enabled=False):
            out = x2.float() @ self.weight.t() if self.exact else self._product(x2.float())
            if self.bias is not None:
                out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


@contextmanager
def exact_products(model: nn.Module) -> Iterator[nn.Module]:
    """Within the block, every :class:`QuantizedLinear` of ``model`` computes its three products in plain FP32
    (what the same weights give without quantisation: forward, and autograd's backward); on leaving, each
    layer is back as it was. Yields ``model``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"exact_products takes an nn.Module, got {type(model).__name__}")
    layers = [m for m in model.modules() if isinstance(m, QuantizedLinear)]
    before = [m.__dict__.get("exact") for m in layers]
    try:
        for m in layers:
            m.exact = True
        yield model
    finally:
        for m, b in zip(layers, before):
            if b is None:
                del m.exact
            else:
                m.exact = b


def replace_linears(model: nn.Module, make, *, skip: tuple[str, ...] = (),
                    keep_prefixes: tuple[str, ...] = ()) -> nn.Module:
    """Replace every plain ``nn.Linear`` of ``model`` (in place) by ``make(linear, index)`` (``index``
    counts the replaced layers in module order), except those whose qualified name is in ``skip`` or lies
    under a name in ``keep_prefixes``. Returns ``model``."""
    index = 0
    for name, module in list(model.named_modules()):
        if any(name == k or name.startswith(k + ".") for k in keep_prefixes):
            continue
        for child_name, child in list(module.named_children()):
            qualified = f"{name}.{child_name}" if name else child_name
            if type(child) is nn.Linear and qualified not in skip:
                setattr(module, child_name, make(child, index))
                index += 1
    return model


class Fp8Linear(QuantizedLinear):
    """A drop-in ``nn.Linear`` whose three matrix products (forward, grad input, grad weight) take FP8
    operands scaled by an FP8 training ``recipe`` (see :func:`linear_scaling`). Weights stay in FP32 (the
    master copy).

    ``io_dtype=None`` (default): the input is converted to FP32 first, the products write FP32, the bias is
    added in FP32, and the output takes the input's dtype. ``io_dtype=torch.bfloat16``: what a real FP8
    recipe does with BF16 activations: the input is cast to FP8 straight from BF16 (the same codes: every
    cast scales in FP32), the products write BF16 (``_scaled_mm``'s ``out_dtype``), the bias is added in
    BF16, the output and the input gradient are BF16 (the weight gradient stays FP32). Without a bias its
    output is the default layer's, rounded to BF16, bit for bit."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: str = "tensorwise",
                 backend: str = "simulated", block: int = 128, io_dtype: torch.dtype | None = None):
        if backend not in ("simulated", "scaled_mm"):
            raise ValueError(f"backend must be 'simulated' or 'scaled_mm', got {backend!r}")
        if io_dtype not in (None, torch.bfloat16):
            raise ValueError(f"io_dtype must be None (FP32 inside) or torch.bfloat16, got {io_dtype!r}")
        super().__init__(in_features, out_features, bias)
        self.recipe, self.backend, self.block, self.io_dtype = recipe, backend, block, io_dtype
        self.scaling = linear_scaling(recipe, block=block)

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        return _Fp8LinearFunction.apply(x2, self.weight, self.scaling, self.backend, torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.io_dtype is None:
            return super().forward(x)
        x2 = x.reshape(-1, x.shape[-1]).to(self.io_dtype)
        with torch.autocast(x.device.type, enabled=False):
            out = _Fp8LinearFunction.apply(x2, self.weight, self.scaling, self.backend, self.io_dtype)
            if self.bias is not None:
                out = out + self.bias.to(self.io_dtype)
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        io = "" if self.io_dtype is None else f", io_dtype={self.io_dtype}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, recipe={self.recipe!r}, "
                f"backend={self.backend!r}{io}")


def convert_to_fp8(model: nn.Module, recipe: str = "tensorwise", *, backend: str = "simulated",
                   block: int = 128, skip: tuple[str, ...] = ("head",)) -> nn.Module:
    """Replace every ``nn.Linear`` of ``model`` (in place) by an :class:`Fp8Linear` with the same weights,
    except modules whose qualified name is in ``skip`` (default: the output head, which torchao's users and
    Transformer Engine's examples usually keep in BF16). Returns ``model``."""
    linear_scaling(recipe, block=block)  # validate the name first
    return replace_linears(model, lambda linear, _: Fp8Linear.from_linear(linear, recipe=recipe, backend=backend,
                                                                          block=block), skip=skip)


FP8_LINEAR_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp", "delayed", "blockwise", "unscaled")


TORCHAO_FLOAT8_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")


def torchao_float8(recipe: str = "tensorwise", *, skip: tuple[str, ...] = ()) -> Callable[[nn.Module], nn.Module]:
    """torchao's float8 training conversion (``convert_to_float8_training`` with
    ``Float8LinearConfig.from_recipe_name(recipe)``) as one function of a model, which leaves the linear
    layers at the paths in ``skip`` (e.g. ``("head",)``) in high precision. torchao is imported here, and
    quietly (its CUDA kernels do not load on a CPU; its import registers an enum torch now warns about):
    ImportError, naming the cause, where it does not import (it is optional on a GPU image)."""
    if recipe not in TORCHAO_FLOAT8_RECIPES:
        raise ValueError(f"recipe must be one of {TORCHAO_FLOAT8_RECIPES}, got {recipe!r}")
    if isinstance(skip, str) or not all(isinstance(name, str) for name in skip):
        raise TypeError(f"skip is a tuple of module paths, got {skip!r}")
    logging.getLogger("torchao").setLevel(logging.ERROR)
    pytree_log = logging.getLogger("torch.utils._pytree")
    level = pytree_log.level
    pytree_log.setLevel(logging.ERROR)
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except Exception as exc:
        raise ImportError(f"torchao's float8 training does not import here ({type(exc).__name__}: {exc})") from exc
    finally:
        pytree_log.setLevel(level)
    config = Float8LinearConfig.from_recipe_name(recipe)
    keep = (lambda module, fqn: fqn not in skip) if skip else None

    def convert(model: nn.Module) -> nn.Module:
        return convert_to_float8_training(model, config=config, module_filter_fn=keep)
    return convert
