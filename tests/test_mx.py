"""Block-scaled formats (course_lib.mx) against hand-worked blocks from the spec's rules, against torch's
storage dtypes, and against torchao's reference MX and NVFP4 code bit for bit."""

import math
import re

import pytest
import torch
import torch.utils._python_dispatch
import torch.utils._pytree

from course_lib import mx
from course_lib.studies import microscaling as mx_studies
from course_lib.formats import all_values, decode, encode, round_to_format, spacing

E4M3_VALUES = torch.tensor(sorted({abs(v) for v in all_values("e4m3").tolist() if math.isfinite(v)}))
E2M1_VALUES = torch.tensor(sorted({abs(v) for v in all_values("e2m1").tolist()}))


def _block(amax: float, n: int = 32, fill: float = 0.01) -> torch.Tensor:
    """One row: a block of ``n`` values whose largest magnitude is ``amax`` (at position 0)."""
    x = torch.full((1, n), fill)
    x[0, 0] = amax
    return x


# ---- MX: the spec's rules, worked by hand ----------------------------------------------------------------

def test_floor_can_saturate_the_largest_element_and_rceil_cannot():
    # E4M3: emax 8. amax 1000: floor(log2 1000) = 9, so FLOOR's scale is 2**(9-8) = 2 and 1000/2 = 500 > 448
    q = mx.BlockScaling("e4m3", 32, mode="floor").quantize(_block(1000.0))
    assert float(q.block_scales[0, 0]) == 2.0
    assert float(q.elements[0, 0]) == 448.0 and q.saturated == 1
    # RCEIL: ceil(log2(1000/448)) = 2, scale 4, 1000/4 = 250 rounds to E4M3's 256 (spacing 16 there)
    q = mx.BlockScaling("e4m3", 32, mode="rceil").quantize(_block(1000.0))
    assert float(q.block_scales[0, 0]) == 4.0
    assert float(q.elements[0, 0]) == 256.0 and q.saturated == 0
    # CEIL: ceil(log2 1000) - 8 = 2 as well
    assert float(mx.BlockScaling("e4m3", 32, mode="ceil").quantize(_block(1000.0)).block_scales[0, 0]) == 4.0


def test_fp4_blocks_by_hand():
    # E2M1: emax 2. amax 7: FLOOR scale 2**(2-2) = 1, 7 saturates to 6; RCEIL: ceil(log2(7/6)) = 1, 7/2 = 3.5
    # is a tie between 3 (code 0b101) and 4 (0b110): to even, 4
    floor = mx.BlockScaling("e2m1", 32, mode="floor").quantize(_block(7.0))
    assert float(floor.block_scales[0, 0]) == 1.0 and float(floor.elements[0, 0]) == 6.0
    rceil = mx.BlockScaling("e2m1", 32, mode="rceil").quantize(_block(7.0))
    assert float(rceil.block_scales[0, 0]) == 2.0 and float(rceil.elements[0, 0]) == 4.0
    assert float(rceil.dequantize()[0, 0]) == 8.0
    # amax 5 with FLOOR: scale 1, 5 is a tie between 4 (0b110) and 6 (0b111): to even, 4
    assert float(mx.BlockScaling("e2m1", 32, mode="floor").quantize(_block(5.0)).elements[0, 0]) == 4.0
    # EVEN: amax 7.5 rounds (half up, one mantissa bit) to 8 first, so the scale is 2**(3-2) = 2
    assert float(mx.BlockScaling("e2m1", 32, mode="even").quantize(_block(7.5)).block_scales[0, 0]) == 2.0
    assert float(mx.BlockScaling("e2m1", 32, mode="floor").quantize(_block(7.5)).block_scales[0, 0]) == 1.0


def test_zero_block_gets_the_smallest_scale_and_zero_elements():
    x = torch.zeros(2, 32)
    x[1] = torch.linspace(-1, 1, 32)
    for mode in mx.SCALE_MODES:
        q = mx.BlockScaling("e4m3", 32, mode=mode).quantize(x)
        assert float(q.block_scales[0, 0]) == 2.0**-127
        assert torch.equal(q.dequantize()[0], torch.zeros(32))
        assert int(q.scale_codes().view(torch.uint8)[0, 0]) == 0


def test_e8m0_exponents_clamp_and_validate():
    amax = torch.tensor([0.0, 2.0**-140, 1.0, 3e38])
    e = mx.e8m0_exponents(amax, "e4m3", "floor")
    assert e.tolist() == [-127, -127, -8, 127 - 8]
    with pytest.raises(ValueError, match="non-negative"):
        mx.e8m0_exponents(torch.tensor([-1.0]), "e4m3")
    with pytest.raises(ValueError, match="unknown scale mode"):
        mx.e8m0_exponents(torch.tensor([1.0]), "e4m3", "nearest")


@pytest.mark.parametrize("element", list(mx.MX_ELEMENTS))
@pytest.mark.parametrize("mode", mx.SCALE_MODES)
def test_elements_lie_on_the_grid_and_blocks_within_range(element, mode):
    torch.manual_seed(0)
    x = torch.randn(8, 64) * torch.exp(2 * torch.randn(8, 64))
    q = mx.BlockScaling(element, 32, mode=mode).quantize(x)
    f = mx.element_format(element)
    grid = torch.tensor(sorted({abs(v) for v in all_values(f).tolist() if math.isfinite(v)}))
    assert torch.isin(q.elements.abs(), grid).all()
    assert q.scales.shape == (8, 2)
    # each scale is a power of two
    assert torch.equal(torch.frexp(q.scales)[0], torch.full_like(q.scales, 0.5))
    if mode in ("rceil", "ceil"):
        assert q.saturated == 0


# ---- NVFP4 --------------------------------------------------------------------------------------------

def test_nvfp4_two_level_scale_by_hand():
    # tensor amax 2688 = 448 * 6 gives a tensor scale of exactly 1; a block with amax 3 gets E4M3(3/6) = 0.5
    x = torch.zeros(1, 32)
    x[0, 0] = 2688.0
    x[0, 16] = 3.0
    x[0, 17] = 1.25     # 1.25 / 0.5 = 2.5, a tie between 2 (0b100) and 3 (0b101): to even, 2
    q = mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True).quantize(x)
    assert q.tensor_scale == 1.0
    assert q.block_scales.tolist() == [[448.0, 0.5]]
    assert q.dequantize()[0, [0, 16, 17]].tolist() == [2688.0, 3.0, 1.0]


def test_without_a_tensor_scale_small_blocks_flush():
    """E4M3 block scales bottom out at 2**-6 (torchao clamps to E4M3's smallest normal): a gradient-sized
    block (1e-5) then quantises to zero; the FP32 tensor scale brings it back."""
    torch.manual_seed(1)
    g = torch.randn(16, 64) * 1e-5
    alone = mx.block_error(g, mx.BlockScaling("e2m1", 16, scale_format="e4m3"))
    both = mx.block_error(g, mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True))
    assert alone.flushed == 1.0 and alone.relative_error == 1.0
    assert both.flushed < 0.2 and both.relative_error < 0.2


def test_square_weight_blocks_quantise_a_matrix_and_its_transpose_alike():
    torch.manual_seed(2)
    w = torch.randn(64, 32) * torch.exp(torch.randn(64, 32))
    two_d = mx.BlockScaling("e2m1", 16, block_rows=16, scale_format="e4m3", tensor_scale=True)
    assert torch.equal(two_d.round_trip(w).t(), two_d.round_trip(w.t().contiguous()))
    one_d = mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True)
    assert not torch.equal(one_d.round_trip(w).t(), one_d.round_trip(w.t().contiguous()))


# ---- storage ------------------------------------------------------------------------------------------

def test_fp4_packing_round_trips_every_pair_of_codes():
    codes = torch.cartesian_prod(torch.arange(16), torch.arange(16)).reshape(1, -1)
    packed = mx.pack_fp4(codes)
    if hasattr(torch, "float4_e2m1fn_x2"):
        assert packed.dtype == torch.float4_e2m1fn_x2
    raw = packed.view(torch.uint8)
    assert raw.shape == (1, 256) and sorted(raw.reshape(-1).tolist()) == list(range(256))
    assert int(raw[0, 1]) == 0x10      # codes (0, 1): the first in the low nibble, as torch's header says
    assert torch.equal(mx.unpack_fp4(packed), codes)


def test_packed_fp4_of_a_quantised_tensor_decodes_to_its_elements():
    torch.manual_seed(3)
    x = torch.randn(4, 32)
    q = mx.BlockScaling("e2m1", 32, mode="rceil").quantize(x)
    codes = mx.unpack_fp4(mx.pack_fp4(q.element_codes()))
    assert torch.equal(torch.as_tensor(decode(codes, "e2m1")).float(), q.elements)


def test_scale_codes_round_trip_through_torch_storage_dtypes():
    torch.manual_seed(4)
    x = torch.randn(8, 64) * 1e3
    mxq = mx.BlockScaling("e4m3", 32, mode="floor").quantize(x)
    assert mxq.scale_codes().dtype == torch.float8_e8m0fnu
    assert torch.equal(mxq.scale_codes().float(), mxq.block_scales)
    nv = mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True).quantize(x)
    assert nv.scale_codes().dtype == torch.float8_e4m3fn
    assert torch.equal(nv.scale_codes().float(), nv.block_scales)
    assert mxq.storage_bits_per_element == 8 + 8 / 32 and nv.storage_bits_per_element == 4 + 8 / 16


# ---- the recipe's pieces --------------------------------------------------------------------------------

def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
    gen = torch.Generator().manual_seed(0)
    x = torch.linspace(-6, 6, 241)
    draws = torch.stack([mx.stochastic_round(x, "e2m1", generator=gen) for _ in range(4000)])
    lower = torch.tensor([float(E2M1_VALUES[E2M1_VALUES <= v].max()) for v in x.abs()])
    upper = torch.tensor([float(E2M1_VALUES[E2M1_VALUES >= v].min()) for v in x.abs()])
    assert ((draws.abs() == lower) | (draws.abs() == upper)).all()
    assert (draws * x >= 0).all()        # the sign is kept (a value may round to zero)
    # mean within 5 standard errors of x (the spread of one draw is at most half the gap)
    gap = upper - lower
    assert ((draws.mean(0) - x).abs() <= 5 * (gap / 2) / math.sqrt(4000) + 1e-6).all()
    # round to nearest is biased on the same inputs: the test can tell the two apart
    assert float(round_to_format(torch.tensor([2.4]), "e2m1")[0]) == 2.0
    assert abs(float(torch.stack([mx.stochastic_round(torch.tensor([2.4]), "e2m1", generator=gen)
                                  for _ in range(4000)]).mean()) - 2.4) < 0.05


def test_stochastic_rounding_leaves_grid_values_alone_and_saturates():
    gen = torch.Generator().manual_seed(1)
    grid = torch.cat([E2M1_VALUES, -E2M1_VALUES])
    assert torch.equal(mx.stochastic_round(grid, "e2m1", generator=gen), grid)
    assert mx.stochastic_round(torch.tensor([9.0, -100.0]), "e2m1", generator=gen).tolist() == [6.0, -6.0]
    a = mx.stochastic_round(torch.linspace(0, 5, 50), "e4m3", generator=torch.Generator().manual_seed(7))
    b = mx.stochastic_round(torch.linspace(0, 5, 50), "e4m3", generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b) and torch.isin(a, E4M3_VALUES).all()
    with pytest.raises(TypeError, match="Generator"):
        mx.stochastic_round(grid, "e2m1", generator=None)


@pytest.mark.parametrize("element", ["e2m1", "e2m3", "e3m2", "e4m3", "e5m2"])
def test_stochastic_rounding_is_its_definition_draw_for_draw(element):
    # the definition, in values: the neighbour at or below (round toward zero), and up by the gap there
    # when u * gap < the distance to it, with u the generator's uniform draws in order
    f = mx.element_format(element)
    x = torch.cat([torch.randn(4000) * s for s in (1e-3, 0.3, 3.0, 100.0)]
                  + [torch.tensor([0.0, -0.0, 1e-45, -1e-45, f.max_finite, -f.max_finite, 1e30])])
    a = x.abs().clamp(max=f.max_finite)
    lo = round_to_format(a, f, rounding="toward_zero")
    gap = torch.as_tensor(spacing(lo, f)).float()
    u = torch.rand(x.shape, generator=torch.Generator().manual_seed(5))
    expected = torch.copysign(torch.where(u * gap < a - lo, lo + gap, lo), x)
    got = mx.stochastic_round(x, element, generator=torch.Generator().manual_seed(5))
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))   # signed zeros included


def test_stochastic_rounding_refuses_nan_where_the_element_format_has_none():
    g = torch.Generator().manual_seed(0)
    for element in ("e2m1", "e2m3", "e3m2"):
        f = mx.element_format(element)
        with pytest.raises(ValueError, match=f"{f.name} has no NaN"):
            mx.stochastic_round(torch.tensor([1.0, math.nan]), element, generator=g)
        assert mx.stochastic_round(torch.tensor([math.inf, -math.inf]), element, generator=g).tolist() == [
            f.max_finite, -f.max_finite]
    assert math.isnan(float(mx.stochastic_round(torch.tensor([math.nan]), "e4m3", generator=g)))


def test_hadamard_is_orthogonal_and_preserves_products():
    h = mx.hadamard_matrix(16)
    assert torch.equal(h @ h.t(), torch.eye(16))          # exact: entries are ±1/4
    signs = mx.random_signs(16, seed=3)
    assert set(signs.tolist()) == {-1.0, 1.0}
    torch.manual_seed(5)
    a, b = torch.randn(8, 64), torch.randn(6, 64)
    ra, rb = mx.random_hadamard(a, signs), mx.random_hadamard(b, signs)
    assert torch.allclose(mx.random_hadamard(ra, signs, inverse=True), a, rtol=0, atol=1e-6)
    assert torch.allclose(ra @ rb.t(), a @ b.t(), rtol=1e-5, atol=1e-5)
    # an outlier is spread over its group of 16
    spike = torch.zeros(1, 16)
    spike[0, 3] = 100.0
    assert torch.allclose(mx.random_hadamard(spike, signs).abs(), torch.full((1, 16), 25.0))
    with pytest.raises(ValueError, match="multiple of the transform size"):
        mx.random_hadamard(torch.randn(2, 24), signs)
    with pytest.raises(ValueError, match="power of two"):
        mx.hadamard_matrix(12)



class _NoDeviceMixing(torch.utils._python_dispatch.TorchDispatchMode):
    """Fails any op whose tensor arguments (beyond 0-d scalars) sit on more than one device."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        leaves = torch.utils._pytree.tree_flatten((args, kwargs))[0]
        devices = {a.device for a in leaves if isinstance(a, torch.Tensor) and a.dim() > 0}
        assert len(devices) <= 1, f"{func} mixes tensors on {devices}"
        return func(*args, **kwargs)


def test_hadamard_transform_stays_on_the_input_device():
    # The first GPU run of lesson 8's experiments failed here: the Hadamard matrix was built on the CPU and
    # multiplied with CUDA signs. Meta tensors stand in for a second device on a CPU-only machine.
    x, signs = torch.empty(8, 64, device="meta"), mx.random_signs(16).to("meta")
    with _NoDeviceMixing():
        assert mx.random_hadamard(x, signs).device.type == "meta"
        assert mx.random_hadamard(x, signs, inverse=True).device.type == "meta"
    assert mx.hadamard_matrix(16, device="meta").device.type == "meta"

# ---- layers and training ------------------------------------------------------------------------------

def test_block_linear_forward_and_gradients_are_the_quantised_products():
    torch.manual_seed(6)
    layer = mx.BlockLinear(64, 32, bias=False, recipe="mxfp8")
    x = torch.randn(64, 64, requires_grad=True)
    out = layer(x)
    r = layer.recipe
    expected = r.activation.round_trip(x.detach()) @ r.weight.round_trip(layer.weight.detach()).t()
    assert torch.equal(out, expected)
    g = torch.randn(64, 32)
    out.backward(g)
    gq = r.gradient.round_trip(g)
    w_cols = r.weight.round_trip(layer.weight.detach().t().contiguous()).t()
    assert torch.equal(x.grad, gq @ w_cols)
    grad_w = r.gradient.round_trip(g.t().contiguous()) @ r.activation.round_trip(x.detach().t().contiguous()).t()
    assert torch.equal(layer.weight.grad, grad_w)


def test_nvfp4_layer_gradients_track_the_exact_ones():
    torch.manual_seed(7)
    exact = torch.nn.Linear(64, 32)
    layer = mx.BlockLinear.from_linear(exact, recipe="nvfp4")
    x = torch.randn(64, 64)
    layer(x).square().mean().backward()
    exact(x).square().mean().backward()
    cos = torch.nn.functional.cosine_similarity(layer.weight.grad.reshape(-1), exact.weight.grad.reshape(-1), dim=0)
    assert float(cos) > 0.9


def test_conversion_keeps_the_head_and_the_last_block_where_the_recipe_says():
    from course_lib.device import size_profile
    from course_lib.models import course_setup

    setup = course_setup(size_profile("cpu"), "cpu", steps=1, default_steps=(1, 1), seed=0)
    for recipe, kept_block in (("nvfp4", True), ("nvfp4_no_hp_last", False), ("mxfp8", False)):
        model = mx.convert_to_block_scaled(setup.model(0), recipe)
        assert type(model.head) is torch.nn.Linear
        assert isinstance(model.blocks[0].fc, mx.BlockLinear)
        assert (type(model.blocks[-1].fc) is torch.nn.Linear) == kept_block


def _tiny_gpt(n_layers: int):
    from course_lib.models import GPTConfig, build_gpt

    g = torch.Generator().manual_seed(3)
    x, y = (torch.randint(0, 256, (2, 32), generator=g) for _ in range(2))
    return build_gpt(GPTConfig(n_layers=n_layers, context=32), seed=1), x, y


def test_a_high_precision_block_is_exact_fp32_and_removing_it_changes_only_that_block():
    import copy

    # one block: NVFP4's high-precision last block is the whole model, so its gradient is the FP32 one bit for
    # bit (it would not be if "high precision" rounded the block to BF16, or quantised any of it)
    model, x, y = _tiny_gpt(1)
    kept = mx.convert_to_block_scaled(copy.deepcopy(model), "nvfp4")
    assert not any(isinstance(m, mx.BlockLinear) for m in kept.modules())
    for m in (model, kept):
        m(x, y)[1].backward()
    for (name, p), q in zip(model.named_parameters(), kept.parameters()):
        assert torch.equal(p.grad, q.grad), name
    # two blocks: with and without the high-precision last block, the first block is quantised alike (same
    # layer seeds and Hadamard signs, same output bit for bit); only the last block differs
    model, x, y = _tiny_gpt(2)
    for with_hp, without_hp in (("nvfp4", "nvfp4_no_hp_last"), ("mxfp4_hp_last", "mxfp4")):
        a = mx.convert_to_block_scaled(copy.deepcopy(model), with_hp, seed=4)
        b = mx.convert_to_block_scaled(copy.deepcopy(model), without_hp, seed=4)
        for name in ("attn.qkv", "attn.proj", "fc", "out"):
            la, lb = a.blocks[0].get_submodule(name), b.blocks[0].get_submodule(name)
            assert la.seed == lb.seed and torch.equal(la.signs, lb.signs)
            assert la.generator_for(x.device).initial_seed() == lb.generator_for(x.device).initial_seed()
            assert type(a.blocks[1].get_submodule(name)) is torch.nn.Linear
            assert isinstance(b.blocks[1].get_submodule(name), mx.BlockLinear)
        outs = []
        for m in (a, b):
            h = m.tok_emb(x) + m.pos_emb(torch.arange(x.shape[1]))
            outs.append(m.blocks[0](h))
        assert torch.equal(outs[0], outs[1])


def test_drawing_only_the_backward_pass_gives_the_draws_of_whole_passes():
    import copy

    # gradient_fidelity runs the forward pass once and draws the backward pass: the forward rounds to nearest,
    # so the draws are those of whole passes from the same generators
    model, x, y = _tiny_gpt(2)
    once = mx.convert_to_block_scaled(copy.deepcopy(model), "nvfp4_no_hp_last", seed=2)
    whole = mx.convert_to_block_scaled(copy.deepcopy(model), "nvfp4_no_hp_last", seed=2)
    loss = once(x, y)[1]
    draws = []
    for i in range(2):
        for m in (once, whole):
            m.zero_grad(set_to_none=True)
        loss.backward(retain_graph=i == 0)
        whole(x, y)[1].backward()
        draws.append(once.blocks[0].fc.weight.grad.clone())
        for p, q in zip(once.parameters(), whole.parameters()):
            assert torch.equal(p.grad, q.grad)
    assert not torch.equal(draws[0], draws[1])      # stochastic rounding: the two draws differ


def test_gradient_fidelity_measures_every_model_and_batch():
    from course_lib.device import SizeProfile
    from course_lib.studies import microscaling_pieces as pieces

    recipes = ("mxfp4", "mxfp4_hp_last", "nvfp4", "nvfp4_no_sr")
    fid = pieces.gradient_fidelity(SizeProfile("small"), recipes=recipes, seeds=(0, 1), batches=1, draws=2, steps=1)
    assert (fid.recipes, fid.seeds, fid.steps, fid.batches, fid.draws, fid.ks) == (recipes, (0, 1), 1, 1, 2, (1, 2))
    for r in recipes:
        assert [len(m) for m in fid.single[r]] == [1, 1] and all(0 < v < 1 for m in fid.single[r] for v in m)
        for s in range(2):
            assert fid.averaged[r][s][0] == pytest.approx(fid.single[r][s][0])
    for r in ("mxfp4", "mxfp4_hp_last", "nvfp4_no_sr"):   # rounding to nearest: every draw is the same gradient
        assert fid.single_stderr[r] == ((0.0,), (0.0,))
        assert [a[1] for a in fid.averaged[r]] == pytest.approx([a[0] for a in fid.averaged[r]])
    # two stochastic draws differ, so their mean is strictly closer than the mean of their errors
    assert all(se[0] > 0 for se in fid.single_stderr["nvfp4"])
    assert all(a[1] < a[0] for a in fid.averaged["nvfp4"])
    assert fid.single["nvfp4"][0] != fid.single["nvfp4"][1]    # two models, two measurements
    for bad in ({"seeds": ()}, {"seeds": (0, 0)}, {"draws": 0}, {"batches": True}, {"recipes": ()}):
        with pytest.raises(ValueError):
            pieces.gradient_fidelity(SizeProfile("small"), steps=0, **bad)
    with pytest.raises(TypeError, match="seeds must be ints"):
        pieces.gradient_fidelity(SizeProfile("small"), steps=0, seeds=(0.5,))
    with pytest.raises(ValueError, match="unknown block-scaled recipe"):
        pieces.gradient_fidelity(SizeProfile("small"), steps=0, recipes=("nvfp3",))


def test_training_with_every_recipe_runs_and_learns():
    from course_lib.device import size_profile

    result = mx_studies.block_scaled_training(size_profile("cpu"), recipes=("mxfp4", "nvfp4"), seeds=(0,), steps=6)
    for recipe in result.recipes:
        curve = result.curves[recipe][0]
        assert all(math.isfinite(v) for v in curve) and curve[-1] < curve[0]
    with pytest.raises(ValueError, match="unknown block-scaled recipe"):
        mx_studies.block_scaled_training(size_profile("cpu"), recipes=("nvfp3",), seeds=(0,), steps=1)


def test_block_size_study_and_mode_comparison_show_their_effects():
    torch.manual_seed(8)
    act = torch.randn(64, 64)
    act[:, 0] *= 100.0                            # an outlier channel
    study = mx_studies.block_size_study({"activation": act}, elements=("e2m1",), blocks=(1, 32, -1))
    err = {b: study.errors["e2m1"]["activation"][b] for b in study.blocks}
    assert err["1"].relative_error < err["32"].relative_error < err["tensor"].relative_error
    assert err["tensor"].flushed > err["32"].flushed
    cmp = mx_studies.compare_scale_modes(torch.randn(64, 64) * 3, element="e2m1")
    assert cmp.top_saturated["rceil"] == 0.0 and cmp.top_saturated["floor"] > 0.0
    assert 0 < cmp.blocks_differ < 1
    for row in cmp.examples:
        assert row["rceil exponent"] == row["floor exponent"] + 1


# ---- bad input ----------------------------------------------------------------------------------------

def test_bad_input_is_refused_clearly():
    with pytest.raises(ValueError, match="pad it with zeros to 64"):
        mx.BlockScaling("e4m3", 32).quantize(torch.randn(4, 48))
    with pytest.raises(ValueError, match="inf or NaN"):
        mx.BlockScaling("e4m3", 32).quantize(torch.tensor([[math.nan] + [0.0] * 31]))
    with pytest.raises(ValueError, match="unknown MX element format"):
        mx.BlockScaling("e3m4", 32)
    with pytest.raises(ValueError, match="unknown scale mode"):
        mx.BlockScaling("e4m3", 32, mode="round")
    with pytest.raises(ValueError, match="block must be"):
        mx.BlockScaling("e4m3", 0)
    with pytest.raises(ValueError, match="E4M3 block scales"):
        mx.BlockScaling("e2m1", 32, tensor_scale=True)
    with pytest.raises(ValueError, match="generator"):
        mx.BlockScaling("e2m1", 16, stochastic=True).quantize(torch.randn(2, 16))
    with pytest.raises(TypeError, match="floating point"):
        mx.BlockScaling("e4m3", 32).quantize(torch.ones(2, 32, dtype=torch.int64))
    with pytest.raises(ValueError, match="even"):
        mx.pack_fp4(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="integer codes"):
        mx.pack_fp4(torch.zeros(2))
    with pytest.raises(ValueError, match="0..15"):
        mx.pack_fp4(torch.tensor([3, 16]))
    with pytest.raises(ValueError, match="unknown block-scaled recipe"):
        mx.block_recipe("nvfp8")


def _past_max(x: float, element: str) -> bool:
    """Whether the element format's round to nearest even carries ``x`` past its max: torch's own cast where
    torch has the format (E5M2 overflows to inf; torch 2.13's E4M3 saturates, so it is asked one binade
    lower, where x / 2 rounds above max / 2 exactly when x rounds above max), else the codec, asked the same
    way (FP6 and FP4 saturate too)."""
    f = mx.element_format(element)
    if element == "e5m2":
        return bool(torch.isinf(torch.tensor([x]).to(torch.float8_e5m2).float()))
    if element == "e4m3":
        return float(torch.tensor([x / 2]).to(torch.float8_e4m3fn).float()) > f.max_finite / 2
    return float(round_to_format(torch.tensor([x / 2]), f)[0]) > f.max_finite / 2


@pytest.mark.parametrize("element", ["e4m3", "e5m2", "e2m3", "e3m2", "e2m1"])
def test_saturated_counts_what_rounding_carries_past_the_elements_max(element):
    f = mx.element_format(element)
    top = f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
    # a block whose FLOOR scale is 1 (amax in [2**emax, 2**(emax + 1))): the elements are the values themselves
    amax = 2.0 ** f.max_exponent
    for v in (f.max_finite, top):
        for x in (math.nextafter(v, 0), v, math.nextafter(v, math.inf)):
            x = float(torch.tensor(x, dtype=torch.float32))
            q = mx.BlockScaling(element, 32).quantize(_block(x, fill=amax))
            assert float(q.scales[0, 0]) == 1.0
            assert q.saturated == int(_past_max(x, element)), (element, x)


def test_saturated_rounds_a_tie_at_the_top_to_even():
    # E4M3's 464 rounds down to 448 (even last bit), E2M1's 7 up past 6 (odd)
    assert mx.BlockScaling("e4m3", 32).quantize(_block(464.0, fill=256.0)).saturated == 0
    assert mx.BlockScaling("e2m1", 32).quantize(_block(7.0, fill=4.0)).saturated == 1


@pytest.mark.parametrize("scaling,shape", [
    (mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True), (0, 16)),
    (mx.BlockScaling("e4m3", 32), (0,)), (mx.BlockScaling("e4m3", 32), (4, 0)),
    (mx.BlockScaling("e2m1", 16, block_rows=16, scale_format="fp32"), (0, 32))])
def test_an_empty_tensor_is_refused_by_name(scaling, shape):
    with pytest.raises(ValueError, match=re.escape(f"BlockScaling.quantize needs a non-empty tensor, got shape "
                                                   f"{tuple(shape)}")):
        scaling.quantize(torch.empty(shape))
    with pytest.raises(ValueError, match="needs a non-empty tensor"):
        mx.block_error(torch.empty(shape), scaling)


@pytest.mark.parametrize("scaling", [mx.BlockScaling("e4m3", 32), mx.BlockScaling("e2m1", 16, scale_format="fp32"),
                                     mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True)],
                         ids=lambda s: s.label)
def test_float64_beyond_fp32s_range_is_not_called_inf_or_nan(scaling):
    x = torch.full((1, 32), 1e300, dtype=torch.float64)
    message = r"outside float32's range \(largest magnitude 1e\+300\)"
    with pytest.raises(ValueError, match=message):
        scaling.quantize(x)
    with pytest.raises(ValueError, match=message):
        mx.block_error(x, scaling)
    x[0, 0] = math.nan
    with pytest.raises(ValueError, match="inf or NaN"):
        scaling.quantize(x)


# ---- torchao, bit for bit -----------------------------------------------------------------------------

def _torchao_mx():
    pytest.importorskip("numpy")
    mx_tensor = pytest.importorskip("torchao.prototype.mx_formats.mx_tensor")
    config = pytest.importorskip("torchao.prototype.mx_formats.config")
    kernels = pytest.importorskip("torchao.prototype.mx_formats.kernels")
    return mx_tensor, config, kernels


def _rough(seed: int, shape=(64, 256)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape, generator=g))


@pytest.mark.parametrize("element", list(mx.MX_ELEMENTS))
@pytest.mark.parametrize("mode", mx.SCALE_MODES)
def test_mx_quantisation_equals_torchao_to_mx(element, mode):
    mx_tensor, config, kernels = _torchao_mx()
    dtypes = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2,
              "e2m3": "fp6_e2m3", "e3m2": "fp6_e3m2"}
    x = _rough(10)
    x[3, :32] = 0.0                                              # a zero block
    x[5, :32] = torch.linspace(-448 * 3, 448 * 3, 32)           # a block that saturates under FLOOR
    scale, data = mx_tensor.to_mx(x, dtypes[element], 32, config.ScaleCalculationMode(mode))
    q = mx.BlockScaling(element, 32, mode=mode).quantize(x)
    assert torch.equal(scale.view(torch.uint8), q.scale_codes().view(torch.uint8))
    if element in ("e4m3", "e5m2"):
        assert torch.equal(data.float(), q.elements)
    elif element == "e2m1":
        assert torch.equal(kernels.unpack_uint4(data.view(torch.uint8)).long(), q.element_codes())
        assert torch.equal(data.view(torch.uint8), mx.pack_fp4(q.element_codes()).view(torch.uint8))
    else:
        assert torch.equal(data.long(), q.element_codes())
    back = mx_tensor.to_dtype(data, scale, dtypes[element], 32, torch.float32)
    assert torch.equal(back, q.dequantize())


def _below32(value: float) -> float:
    """The float32 just below the float32 ``value``."""
    v = torch.tensor(value, dtype=torch.float32)
    return float(torch.nextafter(v, torch.zeros_like(v)))


def _edge_blocks(element: str, seed: int = 0) -> torch.Tensor:
    """One MX block of 32 per row: amax in FP32's top binade (the largest float32, 3.4e38, 1.9 * 2**127,
    2**127, and the element's EVEN carry threshold (2 - 2**-(m+1)) * 2**127 with the float just below), in
    the bottom (subnormal amax, the smallest normal and the float below it, amax whose scale clamps to
    2**-127), zero blocks (signed zeros) and random blocks; the other 31 values of a block are random
    signed fractions of its amax (zeros included)."""
    m = mx.element_format(element).mantissa_bits
    threshold = (2 - 2.0 ** -(m + 1)) * 2.0**127
    top = [torch.finfo(torch.float32).max, 3.4e38, 1.9 * 2.0**127, 2.0**127, threshold,
           _below32(threshold), 1.5 * 2.0**127]
    tiny = torch.finfo(torch.float32).smallest_normal
    bottom = [2.0**-149, 3 * 2.0**-149, 1e-40, 1.5 * 2.0**-127, _below32(tiny), tiny, 2.0**-121, 2.0**-118]
    g = torch.Generator().manual_seed(seed)
    amax = torch.tensor(top + bottom + [0.0] * 2 + [1.0] * 8, dtype=torch.float32)
    amax[-8:] = torch.exp2(torch.empty(8).uniform_(-60, 60, generator=g))
    signs = torch.where(torch.rand(amax.numel(), 31, generator=g) < 0.5, -1.0, 1.0)
    rest = torch.rand(amax.numel(), 31, generator=g) * signs
    rest[:, :4] = 0.0
    x = torch.cat([amax[:, None], amax[:, None] * rest], dim=1)
    x[len(top) + len(bottom), 1::2] = -0.0                       # a zero block of signed zeros
    return x[:, torch.randperm(32, generator=g)].contiguous()


def _torchao_codes(kernels, data: torch.Tensor, element: str) -> torch.Tensor:
    if element == "e2m1":
        return kernels.unpack_uint4(data.view(torch.uint8)).long()
    return data.view(torch.uint8).long() if element in ("e4m3", "e5m2") else data.long()


@pytest.mark.parametrize("element", list(mx.MX_ELEMENTS))
@pytest.mark.parametrize("mode", mx.SCALE_MODES)
def test_mx_edge_blocks_equal_torchao_to_mx(element, mode):
    """Scales and element codes bit for bit against torchao's ``to_mx`` on blocks with amax in FP32's top
    binade (where EVEN's rounded amax carries into 2**128), subnormal amax, zero and random blocks. In the
    blocks whose scale clamps to 2**-127, torchao divides by 2**-126 (RCEIL: by 1) and this module by the
    scale itself (the documented difference): both are checked against exact rounding there."""
    mx_tensor, config, kernels = _torchao_mx()
    dtypes = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2, "e2m1": torch.float4_e2m1fn_x2,
              "e2m3": "fp6_e2m3", "e3m2": "fp6_e3m2"}
    f = mx.element_format(element)
    x = _edge_blocks(element)
    scale, data = mx_tensor.to_mx(x, dtypes[element], 32, config.ScaleCalculationMode(mode))
    q = mx.BlockScaling(element, 32, mode=mode).quantize(x)
    assert torch.equal(scale.view(torch.uint8), q.scale_codes().view(torch.uint8))
    assert torch.equal(mx.e8m0_exponents(x.abs().amax(dim=1), element, mode) + 127,
                       scale.view(torch.uint8).flatten().long())
    theirs, mine = _torchao_codes(kernels, data, element), q.element_codes()
    smallest = (scale.view(torch.uint8) == 0).flatten()
    assert 0 < int(smallest.sum()) < x.shape[0]
    assert torch.equal(theirs[~smallest], mine[~smallest])
    divisor = 1.0 if mode == "rceil" else 2.0**-126
    assert torch.equal(theirs[smallest], encode(x[smallest].double() / divisor, f))
    assert torch.equal(mine[smallest], encode(x[smallest].double() * 2.0**127, f))
    back = mx_tensor.to_dtype(data, scale, dtypes[element], 32, torch.float32)
    assert torch.equal(back[~smallest], q.dequantize()[~smallest])


def test_even_scale_of_an_amax_in_the_top_binade_by_hand():
    """EVEN rounds amax to the element's mantissa width, half up: from the carry threshold
    (2 - 2**-(m+1)) * 2**127 up, amax rounds to 2**128 and the scale is 2**(128 - emax) (E4M3: 120, E2M1:
    126); just below, 2**(127 - emax). Every element of such a block keeps its value within rounding."""
    for element, emax in (("e4m3", 8), ("e5m2", 15), ("e2m3", 2), ("e3m2", 4), ("e2m1", 2)):
        m = mx.element_format(element).mantissa_bits
        threshold = (2 - 2.0 ** -(m + 1)) * 2.0**127
        amax = torch.tensor([3.4e38, torch.finfo(torch.float32).max, threshold, _below32(threshold)])
        assert mx.e8m0_exponents(amax, element, "even").tolist() == [128 - emax] * 3 + [127 - emax]
    assert mx.e8m0_exponents(torch.tensor([1.9 * 2.0**127]), "e2m1", "even").tolist() == [126]
    q = mx.BlockScaling("e2m1", 32, mode="even").quantize(_block(1.9 * 2.0**127, fill=2.0**126))
    assert q.saturated == 0 and q.elements[0, :2].tolist() == [4.0, 1.0]   # scale 2**126: 3.8 rounds to 4


@pytest.mark.parametrize("tensor_scale", [True, False])
def test_nvfp4_quantisation_equals_torchao(tensor_scale):
    _, _, kernels = _torchao_mx()
    nv = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")
    for seed in range(3):
        x = _rough(20 + seed)
        pts = nv.per_tensor_amax_to_scale(x.abs().max()) if tensor_scale else None
        scales, data = nv.nvfp4_quantize(x, 16, pts)
        q = mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=tensor_scale).quantize(x)
        assert torch.equal(scales.view(torch.uint8), q.scale_codes().view(torch.uint8))
        assert torch.equal(data.view(torch.uint8), mx.pack_fp4(q.element_codes()).view(torch.uint8))
        tensor = nv.NVFP4Tensor.to_nvfp4(x, per_tensor_scale=pts)
        assert torch.equal(tensor.dequantize(torch.float32), q.dequantize())


def test_skipped_columns_measure_what_an_outlier_does_to_the_others():
    torch.manual_seed(9)
    act = torch.randn(64, 256)
    act[:, 0] *= 1000.0
    whole = mx.BlockScaling("e2m1", -1, block_rows=-1, mode="rceil")
    others = mx.block_error(act, whole, skip_columns=(0,))
    everything = mx.block_error(act, whole)
    assert others.numel == 64 * 255 and others.flushed > 0.9 and others.relative_error > 0.9
    assert everything.relative_error < 0.2        # the outlier dominates the norm and quantises well
    # only the 31 other values of each row's first block share a scale with the outlier
    blocks = mx.block_error(act, mx.BlockScaling("e2m1", 32, mode="rceil"), skip_columns=(0,))
    assert blocks.relative_error < others.relative_error / 2


def test_nvfp4_refuses_a_tensor_too_small_for_its_fp32_tensor_scale_and_errors_span_fp32():
    from course_lib.mx import BlockScaling, block_error

    nvfp4 = BlockScaling(element="e2m1", scale_format="e4m3", block=16, tensor_scale=True)
    with pytest.raises(ValueError, match="too small for an FP32 tensor scale"):
        nvfp4.quantize(torch.full((1, 16), 1e-37))
    # the error of a block of huge (or tiny) values: FP32 norms would give NaN (or 0)
    mx_rule = BlockScaling(element="e2m1", block=32)
    for magnitude in (2.0**100, 2.0**-100):   # exact scalings: the same error, if the norms can hold it
        x = torch.linspace(1, 2, 32).reshape(1, 32) * magnitude
        rel = block_error(x, mx_rule).relative_error
        assert math.isfinite(rel) and rel == pytest.approx(block_error(x / magnitude, mx_rule).relative_error, rel=1e-6)


def test_nvfp4_scaling_is_the_recipes_format_and_rounds_stochastically_on_request():
    from course_lib.mx.linear import block_recipe, nvfp4_scaling

    recipe = block_recipe("nvfp4")
    assert (recipe.activation, recipe.weight) == (nvfp4_scaling(), nvfp4_scaling(16))
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    nearest = nvfp4_scaling().round_trip(x)
    assert torch.equal(nearest, nvfp4_scaling().round_trip(x))                   # round to nearest: one answer
    gen = torch.Generator().manual_seed(1)
    draws = [nvfp4_scaling(stochastic=True).round_trip(x, generator=gen) for _ in range(4)]
    assert any(not torch.equal(d, nearest) for d in draws)                      # stochastic: draws differ
