"""Block-scaled linear layers: the MXFP8, MXFP4 and NVFP4 recipes (and NVFP4 with one piece removed) and
:class:`BlockLinear` with ``convert_to_block_scaled``."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from ..fp8 import QuantizedLinear, exact_products as exact_products, replace_linears
from .blocks import BlockScaling
from .nvfp4 import HADAMARD_SIZE, hadamard_groups, random_hadamard_matrix, random_signs


@dataclass(frozen=True)
class BlockRecipe:
    """A block-scaled training recipe: how each operand of a linear layer's three products is scaled.

    ``activation``, ``weight``, ``gradient``: the :class:`BlockScaling` of each (blocks along the
    reduction dimension of each product). ``hadamard``: random Hadamard transform of both inputs of the
    weight-gradient product. ``stochastic_gradients``: round gradients stochastically. ``high_precision_last``:
    how many of the model's last transformer blocks keep their linear layers in high precision.
    """

    name: str
    activation: BlockScaling
    weight: BlockScaling
    gradient: BlockScaling
    hadamard: bool = False
    stochastic_gradients: bool = False
    high_precision_last: int = 0


def _mx(element: str, mode: str = "rceil") -> BlockScaling:
    return BlockScaling(element, 32, scale_format="e8m0", mode=mode)


def nvfp4_scaling(block_rows: int = 1, *, stochastic: bool = False) -> BlockScaling:
    """NVFP4: E2M1 elements in 1 x 16 blocks (``block_rows`` x 16 for the recipe's weights), E4M3 block
    scales and an FP32 tensor scale; ``stochastic``: elements rounded stochastically."""
    return BlockScaling("e2m1", 16, block_rows=block_rows, scale_format="e4m3", tensor_scale=True,
                        stochastic=stochastic)


def block_recipe(name: str) -> BlockRecipe:
    """A training recipe by name:

    * ``"mxfp8"``: E4M3 everywhere, 1 x 32 blocks, E8M0 scales (RCEIL, as NVIDIA's hardware);
    * ``"mxfp4"``: E2M1 everywhere, 1 x 32 blocks, E8M0 scales (RCEIL), no other help;
    * ``"mxfp4_hp_last"``: MXFP4 with the last block in high precision (the control for NVFP4's choice);
    * ``"nvfp4"``: NVIDIA's NVFP4 recipe: 1 x 16 blocks for activations and gradients, 16 x 16 for weights,
      stochastic rounding of gradients, random Hadamard transform on the weight-gradient inputs, the last
      block in high precision;
    * ``"nvfp4_no_sr"``, ``"nvfp4_no_rht"``, ``"nvfp4_no_2d"``, ``"nvfp4_no_hp_last"``: the NVFP4 recipe with
      one piece removed.
    """
    if name == "mxfp8":
        return BlockRecipe(name, _mx("e4m3"), _mx("e4m3"), _mx("e4m3"))
    if name == "mxfp4":
        return BlockRecipe(name, _mx("e2m1"), _mx("e2m1"), _mx("e2m1"))
    if name == "mxfp4_hp_last":
        return BlockRecipe(name, _mx("e2m1"), _mx("e2m1"), _mx("e2m1"), high_precision_last=1)
    full = BlockRecipe("nvfp4", nvfp4_scaling(), nvfp4_scaling(16), nvfp4_scaling(), hadamard=True, stochastic_gradients=True,
                       high_precision_last=1)
    if name == "nvfp4":
        return full
    if name == "nvfp4_no_sr":
        return replace(full, name=name, stochastic_gradients=False)
    if name == "nvfp4_no_rht":
        return replace(full, name=name, hadamard=False)
    if name == "nvfp4_no_2d":
        return replace(full, name=name, weight=nvfp4_scaling(1))
    if name == "nvfp4_no_hp_last":
        return replace(full, name=name, high_precision_last=0)
    raise ValueError(f"unknown block-scaled recipe {name!r}; known: {', '.join(BLOCK_RECIPES)}")


BLOCK_RECIPES = ("mxfp8", "mxfp4", "mxfp4_hp_last", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht", "nvfp4_no_2d", "nvfp4_no_hp_last")


class _BlockLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2, weight, layer: "BlockLinear"):
        r = layer.recipe
        xq = r.activation.quantize(x2).dequantize()
        wq = r.weight.quantize(weight)
        ctx.layer, ctx.wq = layer, wq
        ctx.save_for_backward(x2, weight)
        return xq @ wq.dequantize().t()

    @staticmethod
    def backward(ctx, grad_out):
        x2, weight = ctx.saved_tensors
        layer: BlockLinear = ctx.layer
        r = layer.recipe
        g = grad_out.float()
        grad_scaling = replace(r.gradient, stochastic=r.stochastic_gradients)
        gen = layer.generator_for(g.device) if r.stochastic_gradients else None
        # grad_x = g @ w reduces over the output features: g along its rows, w along its columns
        gq = grad_scaling.quantize(g, generator=gen).dequantize()
        if r.weight.block_rows == r.weight.block:
            w_cols = ctx.wq.dequantize()          # square 2-D blocks: the transpose quantises the same way
        else:
            w_cols = r.weight.quantize(weight.t().contiguous()).dequantize().t()
        grad_x = gq @ w_cols
        # grad_w = g.T @ x reduces over the tokens: both along the token dimension
        g_t, x_t = g.t().contiguous(), x2.t().contiguous()
        if r.hadamard:
            g_t, x_t = hadamard_groups(g_t, layer.hadamard), hadamard_groups(x_t, layer.hadamard)
        gq_t = grad_scaling.quantize(g_t, generator=gen).dequantize()
        xq_t = r.activation.quantize(x_t).dequantize()
        grad_w = gq_t @ xq_t.t()
        return grad_x.to(x2.dtype), grad_w.to(weight.dtype), None


class BlockLinear(QuantizedLinear):
    """A drop-in ``nn.Linear`` whose three products take block-scaled operands (exact emulation: the
    operands are quantised and dequantised, the product runs in FP32 as a block-scaled tensor core
    accumulates). Weights stay in FP32 (the master copy); the bias is added in FP32."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, recipe: str = "nvfp4",
                 seed: int = 0):
        super().__init__(in_features, out_features, bias)
        self.recipe = block_recipe(recipe)
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}
        signs = random_signs(HADAMARD_SIZE, seed)
        self.register_buffer("signs", signs, persistent=False)
        # diag(signs) @ H, built once; a buffer, so it moves with the layer
        self.register_buffer("hadamard", random_hadamard_matrix(signs), persistent=False)

    def generator_for(self, device: torch.device | str) -> torch.Generator:
        """The layer's stochastic-rounding generator on ``device``, seeded with the layer's seed when first
        asked for: the random bits are drawn where the gradient is (a GPU's generator on a GPU), and a run
        with the same seed on the same kind of device draws the same ones."""
        device = torch.device(device)
        if device not in self._generators:
            self._generators[device] = torch.Generator(device=device).manual_seed(self.seed)
        return self._generators[device]

    def _product(self, x2: torch.Tensor) -> torch.Tensor:
        return _BlockLinearFunction.apply(x2, self.weight, self)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, recipe={self.recipe.name!r}"


def convert_to_block_scaled(model: nn.Module, recipe: str = "nvfp4", *, seed: int = 0,
                            skip: tuple[str, ...] = ("head",)) -> nn.Module:
    """Replace the ``nn.Linear`` layers of ``model`` (in place) by :class:`BlockLinear` ones, except those
    named in ``skip`` (default: the output head) and, where the recipe keeps the last
    ``high_precision_last`` transformer blocks in high precision, those blocks' layers. Returns ``model``."""
    r = block_recipe(recipe)
    n_blocks = len(getattr(model, "blocks", []))
    keep = tuple(f"blocks.{i}" for i in range(max(0, n_blocks - r.high_precision_last), n_blocks))
    return replace_linears(model, lambda linear, index: BlockLinear.from_linear(
        linear, recipe=recipe, seed=seed * 1000 + index), skip=skip, keep_prefixes=keep)
