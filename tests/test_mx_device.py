"""NVFP4 emulation on the tensor's device: stochastic rounding draws where the gradient is, from a seeded
generator per layer and device, and the random Hadamard transform runs over every group in one product."""

import copy

import pytest
import torch

from course_lib import mx
from course_lib.mx.linear import BlockLinear


def per_group_reference(x, signs, inverse=False):
    """The transform one group at a time, in float64 (the exact value of each FP32 group's product)."""
    h = mx.hadamard_matrix(len(signs)).double()
    m = torch.diag(signs.double()) @ h
    m = m.t() if inverse else m
    n = len(signs)
    flat = x.double().reshape(-1, x.shape[-1])
    out = torch.stack([torch.cat([row[j:j + n] @ m for j in range(0, row.numel(), n)]) for row in flat])
    return out.reshape(x.shape)


def test_the_signed_matrix_is_the_diagonal_product_exactly():
    signs = mx.random_signs(16, seed=5)
    h = mx.hadamard_matrix(16)
    assert torch.equal(mx.random_hadamard_matrix(signs), torch.diag(signs) @ h)
    assert torch.equal(mx.random_hadamard_matrix(signs, inverse=True), (torch.diag(signs) @ h).t())
    with pytest.raises(ValueError, match="1-D"):
        mx.random_hadamard_matrix(torch.ones(4, 4))


@pytest.mark.parametrize("inverse", [False, True])
def test_the_batched_transform_is_exact_where_each_group_sum_is(inverse):
    """On values whose sums of ±v/4 are exact in FP32 (small integers), every group comes out bit for bit
    as the group alone, in float64, gives it; on random FP32 values within FP32's rounding of the sum."""
    signs = mx.random_signs(16, seed=1)
    g = torch.Generator().manual_seed(0)
    ints = torch.randint(-1000, 1000, (7, 48), generator=g).float()
    assert torch.equal(mx.random_hadamard(ints, signs, inverse=inverse).double(),
                       per_group_reference(ints, signs, inverse))
    x = torch.randn(5, 3, 64, generator=g) * 1e3
    ours = mx.random_hadamard(x, signs, inverse=inverse).double()
    exact = per_group_reference(x, signs, inverse)
    # 16 terms of at most |v|/4 each, summed in FP32: a few units in the last place of the largest term
    bound = 16 * 2.0**-24 * x.abs().double().reshape(5, 3, 4, 16).amax(-1, keepdim=True).expand(5, 3, 4, 16)
    assert bool(((ours - exact).abs() <= bound.reshape(5, 3, 64)).all())
    assert not torch.equal(ours, x.double())


def test_hadamard_groups_refuses_a_dimension_it_does_not_tile():
    with pytest.raises(ValueError, match="multiple of the transform size 16"):
        mx.hadamard_groups(torch.ones(3, 20), mx.hadamard_matrix(16))


def test_stochastic_rounding_draws_on_the_tensor_device():
    cpu = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="generator is on cpu but the tensor on meta"):
        mx.stochastic_round(torch.zeros(4, device="meta"), "e2m1", generator=cpu)
    # the draws are the generator's own uniforms, one per value: up where u * gap < x - lower neighbour
    x = torch.linspace(0.1, 5.9, 200)
    state = cpu.get_state()
    rounded = mx.stochastic_round(x, "e2m1", generator=cpu)
    u = torch.rand(200, generator=torch.Generator().set_state(state))
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    i = torch.searchsorted(grid, x, right=True) - 1
    lo, hi = grid[i], grid[i + 1]
    assert torch.equal(rounded, torch.where(u * (hi - lo) < x - lo, hi, lo))
    assert 0 < int((rounded == hi).sum()) < 200


def test_a_layer_has_one_seeded_generator_per_device():
    layer = BlockLinear(32, 16, recipe="nvfp4", seed=7)
    gen = layer.generator_for("cpu")
    assert gen is layer.generator_for(torch.device("cpu")) and gen.device == torch.device("cpu")
    assert torch.equal(torch.rand(5, generator=gen), torch.rand(5, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(layer.hadamard, mx.random_hadamard_matrix(mx.random_signs(16, 7)))


def _grads(seed, x, target_weight):
    layer = BlockLinear(32, 16, recipe="nvfp4", seed=seed)
    with torch.no_grad():
        layer.weight.copy_(target_weight)
    layer(x).square().sum().backward()
    return layer.weight.grad.clone(), x.grad.clone()


def test_stochastic_gradients_are_reproducible_for_a_seed_and_differ_between_seeds():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(16, 32, generator=g)
    x = torch.randn(64, 32, generator=g)
    runs = [_grads(seed, x.clone().requires_grad_(True), w) for seed in (3, 3, 4)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    assert not torch.equal(runs[0][0], runs[2][0])


def test_a_copied_layer_draws_what_the_original_would_have():
    layer = BlockLinear(32, 16, recipe="nvfp4", seed=2)
    layer.generator_for("cpu")
    twin = copy.deepcopy(layer)
    assert torch.equal(torch.rand(3, generator=layer.generator_for("cpu")),
                       torch.rand(3, generator=twin.generator_for("cpu")))
