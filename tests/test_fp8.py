"""FP8 scaling recipes, casts and linear layers, checked against torch's casts, torch._scaled_mm and torchao."""

import copy
import logging
import math
import re
import sys

import numpy as np
import pytest
import torch
import torch.nn as nn

from course_lib import hardware as _hardware
from course_lib import fp8
from course_lib.fp8 import accumulation as fp8_accumulation
from course_lib.fp8 import casts as fp8_casts
from course_lib.studies import fp8 as fp8_studies
from course_lib.formats import get_format, list_formats, round_to_format
from course_lib.formats import overflow_boundary as formats_overflow_boundary
from course_lib.formats import rounds_past_max as formats_rounds_past_max

# torchao is the reference for some tests only: without it those skip, and the course's own FP8 code is still
# tested against torch's casts and torch._scaled_mm
try:
    from torchao.float8.config import ScalingGranularity
    from torchao.float8.float8_utils import tensor_to_scale
    TORCHAO_WHY_NOT = None
except ImportError as exc:     # pragma: no cover - torchao is in requirements.txt
    TORCHAO_WHY_NOT = f"torchao.float8 does not import: {exc}"
logging.getLogger("torchao").setLevel(logging.ERROR)
needs_torchao = pytest.mark.skipif(TORCHAO_WHY_NOT is not None, reason=str(TORCHAO_WHY_NOT))


def _edge_values(fmt: str) -> torch.Tensor:
    """Random float32 bit patterns plus every midpoint between neighbouring FP8 values and the overflow edge."""
    gen = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**31, 2**31 - 1, (200_000,), generator=gen, dtype=torch.int64).to(torch.int32)
    rnd = bits.view(torch.float32)
    rnd = rnd[torch.isfinite(rnd)]
    grid = torch.arange(256, dtype=torch.uint8).view(fp8.fp8_dtype(fmt)).float()
    grid = grid[torch.isfinite(grid)].unique()
    mids = (grid[1:] + grid[:-1]) / 2
    big = fp8.fp8_max(fmt)
    return torch.cat([rnd * 1e-30, rnd, grid, mids, torch.tensor([big, -big, 1.0001 * big, 3e38])])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_saturating_cast_matches_the_software_codec(fmt):
    """torch's cast (after the clamp) rounds exactly as the course's codec with saturation, bit for bit."""
    x = _edge_values(fmt)
    native = fp8.cast_saturating(x, fmt).float()
    codec = round_to_format(x, fmt, overflow="saturate")
    assert torch.equal(native, codec)


def test_native_saturation_is_measured():
    # E5M2 rounds overflow to inf in every torch: the clamp is needed there
    assert fp8.native_cast_saturates("e5m2") is False
    e4m3 = torch.tensor([1e4]).to(torch.float8_e4m3fn).float().item()
    assert fp8.native_cast_saturates("e4m3") is (e4m3 == 448.0)


def test_cast_is_chunked_but_identical(monkeypatch):
    x = torch.randn(3, 1000) * 300
    whole = fp8.cast_saturating(x, "e4m3", 1.5)
    monkeypatch.setattr(fp8_casts, "_CHUNK", 64)
    assert torch.equal(fp8.cast_saturating(x, "e4m3", 1.5).float(), whole.float())
    r = fp8.RowwiseScaling(axis=0).quantize(x)
    monkeypatch.setattr(fp8_casts, "_CHUNK", 1 << 18)
    assert torch.equal(fp8.RowwiseScaling(axis=0).quantize(x).data.float(), r.data.float())


def test_formats_and_errors():
    assert fp8.fp8_max("e4m3") == 448.0 and fp8.fp8_max("E5M2") == 57344.0
    with pytest.raises(ValueError, match="unknown FP8 format"):
        fp8.CurrentScaling("fp16")
    with pytest.raises(TypeError):
        fp8.fp8_format(torch.float16)
    with pytest.raises(ValueError, match="does not tile"):
        fp8.BlockwiseScaling(block=(1, 128)).quantize(torch.randn(4, 64))
    with pytest.raises(ValueError, match="two positive ints"):
        fp8.BlockwiseScaling(block=(0, 128))
    with pytest.raises(ValueError, match="inf or NaN"):
        fp8.CurrentScaling().quantize(torch.tensor([1.0, math.nan]))
    with pytest.raises(ValueError, match="inf or NaN"):
        fp8.BlockwiseScaling(block=(1, 2)).quantize(torch.tensor([[1.0, 2.0, math.inf, 0.0]]))
    with pytest.raises(ValueError, match="positive finite"):
        fp8.StaticScaling(scale=math.inf)
    with pytest.raises(ValueError, match="amax_compute_algo"):
        fp8.DelayedScaling(amax_compute_algo="mean")
    with pytest.raises(ValueError, match="unknown FP8 linear recipe"):
        fp8.linear_scaling("fp8_magic")
    with pytest.raises(TypeError, match="floating point"):
        fp8.CurrentScaling().quantize(torch.arange(4))


def test_scales_hand_worked():
    x = torch.tensor([[1.0, -2.0], [0.5, 0.25]])
    assert fp8.CurrentScaling().scale(x).item() == pytest.approx(224.0)
    rows = fp8.RowwiseScaling(power_of_two=False).scale(x).flatten().tolist()
    assert rows == [224.0, 896.0]
    # power of two rounds down: 448/2 = 224 -> 128; 448/0.5 = 896 -> 512
    assert fp8.RowwiseScaling().scale(x).flatten().tolist() == [128.0, 512.0]
    cols = fp8.RowwiseScaling(axis=0, power_of_two=False).scale(x).flatten().tolist()
    assert cols == [448.0, 224.0]
    assert fp8.CurrentScaling("e5m2").scale(x).item() == pytest.approx(57344.0 / 2)


def test_zero_tensor_and_zero_block_give_finite_scales_and_zero_codes():
    x = torch.zeros(4, 8)
    x[0, :4] = 3.0
    for recipe in (fp8.CurrentScaling(), fp8.RowwiseScaling(), fp8.BlockwiseScaling(block=(2, 4)),
                   fp8.DelayedScaling()):
        q = recipe.quantize(x)
        assert torch.isfinite(q.scales).all() and (q.scales > 0).all()
        assert torch.equal(q.dequantize(), x) or not isinstance(recipe, fp8.BlockwiseScaling)
        assert torch.isfinite(q.dequantize()).all()
    q = fp8.CurrentScaling().quantize(torch.zeros(5))
    assert torch.equal(q.dequantize(), torch.zeros(1, 5))


@needs_torchao
@pytest.mark.parametrize("power_of_two", [False, True])
def test_scales_match_torchao(power_of_two):
    x = torch.randn(64, 96) * torch.logspace(-3, 2, 96)
    x[3] = 0.0
    for dtype, fmt in ((torch.float8_e4m3fn, "e4m3"), (torch.float8_e5m2, "e5m2")):
        ours = fp8.CurrentScaling(fmt, power_of_two=power_of_two).scale(x)
        theirs = tensor_to_scale(x, dtype, round_scales_to_power_of_2=power_of_two)
        assert torch.equal(ours.reshape(()), theirs)
        for axis in (-1, 0):
            ours = fp8.RowwiseScaling(fmt, axis=axis, power_of_two=power_of_two).scale(x)
            theirs = tensor_to_scale(x, dtype, scaling_granularity=ScalingGranularity.AXISWISE,
                                     axiswise_dim=axis, round_scales_to_power_of_2=power_of_two)
            assert torch.equal(ours, theirs)


@needs_torchao
def test_quantized_codes_match_torchao():
    from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic
    from torchao.float8.float8_training_tensor import LinearMMConfig
    x = torch.randn(32, 64) * 30
    ours = fp8.CurrentScaling().quantize(x)
    theirs = hp_tensor_to_float8_dynamic(x, torch.float8_e4m3fn, LinearMMConfig())
    assert torch.equal(ours.data.view(torch.uint8), theirs._data.view(torch.uint8))


def test_blockwise_scales_by_hand():
    x = torch.arange(1.0, 17.0).reshape(4, 4)
    q = fp8.BlockwiseScaling(block=(2, 2)).quantize(x)
    amax = torch.tensor([[6.0, 8.0], [14.0, 16.0]])
    assert torch.allclose(q.scales, 448.0 / amax)
    tiles = fp8.BlockwiseScaling(block=(1, 2)).scale(x)
    assert tiles.shape == (4, 2) and tiles[0].tolist() == pytest.approx([224.0, 112.0])


def test_outlier_channel_hurts_per_tensor_more_than_rowwise_scaling():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(256, 128, generator=gen) * 1e-3
    x[:, 5] *= 1e6   # one outlier column, beyond E4M3's 2**-9..448 range from the rest
    current = fp8.quantization_error(x, fp8.CurrentScaling())
    # scaled per token (row), the outlier still sets every row's scale; per column it is isolated
    rows = fp8.quantization_error(x, fp8.RowwiseScaling(axis=-1))
    cols = fp8.quantization_error(x, fp8.RowwiseScaling(axis=0))
    assert current.flushed > 0.5 and rows.flushed > 0.5 and cols.flushed == 0.0
    rest = torch.cat([x[:, :5], x[:, 6:]], 1)
    back = fp8.RowwiseScaling(axis=0).round_trip(x)
    assert float((torch.cat([back[:, :5], back[:, 6:]], 1) - rest).norm() / rest.norm()) < 0.05


def test_quantization_error_metrics():
    x = torch.tensor([[1.0, 1e-9, 0.0, 100.0]])
    e = fp8.quantization_error(x, fp8.StaticScaling())
    assert e.flushed == pytest.approx(1 / 3)   # 1e-9 -> 0; the zero does not count
    assert e.saturated == 0.0
    big = fp8.quantization_error(torch.tensor([1000.0, 1.0]), fp8.StaticScaling())
    assert big.saturated == 0.5
    exact = fp8.quantization_error(torch.tensor([1.0, 2.0]), fp8.StaticScaling())
    assert exact.relative_error == 0.0 and exact.effective_bits == math.inf
    with pytest.raises(TypeError):
        fp8.quantization_error(x, "current")


# ---- delayed scaling --------------------------------------------------------------------------------

def test_delayed_scaling_follows_transformer_engines_rule():
    d = fp8.DelayedScaling(amax_history_len=3, margin=1)
    assert d.current_scale == 1.0                      # TE's initial scale
    for amax, expected in ((2.0, 448 / 2 / 2), (8.0, 448 / 8 / 2), (1.0, 448 / 8 / 2), (0.5, 448 / 8 / 2),
                           (0.5, 448 / 1 / 2), (0.5, 448 / 0.5 / 2)):
        d.quantize(torch.tensor([amax, -amax / 2]))
        assert d.current_scale == pytest.approx(expected)
    d.quantize(torch.zeros(3))                         # amax 0 keeps the previous scale
    assert d.current_scale == pytest.approx(448 / 0.5 / 2)
    recent = fp8.DelayedScaling(amax_compute_algo="most_recent")
    for amax in (10.0, 1.0):
        recent.quantize(torch.tensor([amax]))
    assert recent.current_scale == pytest.approx(448.0)
    tiny = fp8.DelayedScaling()
    tiny.observe(1e-40)
    assert tiny.current_scale == torch.finfo(torch.float32).max


def test_delayed_scaling_uses_the_previous_scale_so_a_spike_saturates():
    d = fp8.DelayedScaling(amax_history_len=16)
    for _ in range(5):
        d.quantize(torch.linspace(-1, 1, 101))
    spike = torch.linspace(-100, 100, 101)
    err = fp8.quantization_error(spike, d)
    assert err.saturated > 0.9
    assert fp8.quantization_error(spike, fp8.CurrentScaling()).saturated == 0.0


def test_delayed_scaling_refuses_non_finite_but_keeps_its_scale():
    d = fp8.DelayedScaling()
    d.quantize(torch.tensor([4.0]))
    before = d.current_scale
    with pytest.raises(ValueError, match="previous scale"):
        d.quantize(torch.tensor([math.inf]))
    assert d.current_scale == before


def _te_fused_scale(fp8_max: float, amax: float, margin: float) -> np.float32:
    """Transformer Engine's default (fused) delayed-scaling update, in numpy's IEEE float32: ``scaled_max =
    fp8_max * 2**-margin``, then ``scaled_max / amax``; an inf becomes FP32's max (delayed_scaling.cu)."""
    with np.errstate(over="ignore"):
        scale = np.float32(fp8_max) * np.float32(2.0 ** -margin) / np.float32(amax)
    return np.finfo(np.float32).max if np.isinf(scale) else scale


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
@pytest.mark.parametrize("margin", [0, 1, 3, -2, 0.5])
def test_delayed_scale_is_transformer_engines_fp32_arithmetic_bit_for_bit(fmt, margin):
    d = fp8.DelayedScaling(fmt, margin=margin)
    g = np.random.default_rng(0)
    # ordinary amaxes, and tiny ones whose quotient overflows FP32 or lands just below its max
    amaxes = [*(10.0 ** g.uniform(-38, 38, 200)), 1e-36, 2e-36, 1.3e-36, 1e-40, 1.4e-45, 3.3e38]
    for amax in amaxes:
        got = d.next_scale([amax], 1.0)
        want = _te_fused_scale(fp8.fp8_max(fmt), amax, margin)
        assert np.float32(got) == got and np.float32(got).view(np.int32) == want.view(np.int32), (amax, got, want)


def test_delayed_scale_of_a_tiny_amax_divides_by_the_margin_before_it_can_overflow():
    fp32_max = float(torch.finfo(torch.float32).max)
    # 448 / 1e-36 overflows FP32: FP32's max. With margin 1, TE's fused update divides 224 by the amax,
    # 2.24e38 (TE's unfused Python path, NVTE_UNFUSED_FP8_UPDATE=1, would overflow first and give FP32's max)
    assert fp8.DelayedScaling("e4m3").next_scale([1e-36], 1.0) == fp32_max
    scale = fp8.DelayedScaling("e4m3", margin=1).next_scale([1e-36], 1.0)
    assert scale == float(np.float32(224.0) / np.float32(1e-36)) and scale < fp32_max
    # the amax is read as FP32, as TE's history holds it: zero there, or inf there, keeps the previous scale
    assert fp8.DelayedScaling().next_scale([1e-46], 2.0) == 2.0
    assert fp8.DelayedScaling().next_scale([1e39], 2.0) == 2.0
    for bad in (127, -127, 1000, math.nan, math.inf):
        with pytest.raises(ValueError, match="margin"):
            fp8.DelayedScaling(margin=bad)


def _torch_rounds_past_max(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Which float32 values torch's own cast carries past the format's max. E5M2 rounds them to inf. torch
    2.13's E4M3 cast saturates, so ask it one binade lower, where the grid's last bits are the same and the
    value above max / 2 exists (240): x overflows exactly when x / 2 rounds above 224 (the halving is exact)."""
    if fmt == "e5m2":
        return torch.isinf(x.to(torch.float8_e5m2).float())
    return (x / 2).to(torch.float8_e4m3fn).float().abs() > 224.0


def _around(values) -> torch.Tensor:
    """Each value and the float32 on either side of it."""
    t = torch.tensor(values, dtype=torch.float32)
    return torch.cat([torch.nextafter(t, torch.zeros_like(t)), t, torch.nextafter(t, torch.full_like(t, math.inf))])


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_overflow_boundary_is_where_torchs_cast_overflows(fmt):
    top, _ = formats_overflow_boundary(fmt)
    big = fp8.fp8_max(fmt)
    x = _around([big, top, 1.5 * big, 2 * big, 1.0])
    assert torch.equal(formats_rounds_past_max(x, fmt), _torch_rounds_past_max(x, fmt))
    # and for every torch dtype the registry knows, IEEE-style ones by their inf
    for f in list_formats():
        dtype = f.torch_dtype_or_none()
        if f.has_inf and dtype is not None and dtype != torch.float32:
            t, _ = formats_overflow_boundary(f)
            y = _around([f.max_finite, t])
            assert torch.equal(formats_rounds_past_max(y, f), torch.isinf(y.to(dtype).float())), f.name
    assert formats_overflow_boundary("e4m3") == (464.0, False) and formats_overflow_boundary("e5m2") == (61440.0, True)
    with pytest.raises(ValueError, match="toward zero"):
        formats_overflow_boundary(get_format("fp16").__class__("FP16 RZ", 5, 10, rounding="toward_zero"))


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_the_saturated_share_is_what_torchs_cast_carries_past_max(fmt):
    f = get_format(fmt)
    big = f.max_finite
    top = big + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
    for v in _around([big, top, 2 * big]).tolist():
        x = torch.tensor([[v, 1.0]])
        want = float(_torch_rounds_past_max(torch.tensor([v]), fmt)) / 2
        assert fp8.quantization_error(x, fp8.StaticScaling(fmt)).saturated == want, v


def test_a_tie_at_the_top_that_rounds_to_max_is_not_saturated():
    # 464 = 448 + half of E4M3's top spacing ties to 448 (its last bit even), so nothing saturates
    assert fp8.quantization_error(torch.tensor([[464.0, 1.0]]), fp8.StaticScaling("e4m3")).saturated == 0.0


EMPTY_CASES = [(fp8.CurrentScaling(), (0,)), (fp8.StaticScaling(), (0,)), (fp8.DelayedScaling(), (0,)),
               (fp8.CurrentScaling(), (3, 0)), (fp8.RowwiseScaling(axis=0), (0, 4)), (fp8.RowwiseScaling(), (4, 0)),
               (fp8.BlockwiseScaling(), (2, 0)), (fp8.BlockwiseScaling(block=(1, 4)), (0, 8, 4))]


@pytest.mark.parametrize("recipe,shape", EMPTY_CASES)
def test_an_empty_tensor_is_refused_by_name(recipe, shape):
    name = type(recipe).__name__
    pattern = re.escape(f"{name}.quantize needs a non-empty tensor, got shape {tuple(shape)}")
    with pytest.raises(ValueError, match=pattern):
        recipe.quantize(torch.empty(shape))
    with pytest.raises(ValueError, match="needs a non-empty tensor"):
        fp8.quantization_error(torch.empty(shape), recipe)
    if name != "DelayedScaling":   # its scale is the one it holds, whatever the tensor
        with pytest.raises(ValueError, match=f"{name}.scale needs a non-empty tensor"):
            recipe.scale(torch.empty(shape))


@pytest.mark.parametrize("recipe", [fp8.CurrentScaling(), fp8.StaticScaling(), fp8.RowwiseScaling(),
                                    fp8.BlockwiseScaling(block=(1, 32)), fp8.DelayedScaling()],
                         ids=lambda r: type(r).__name__)
def test_float64_beyond_fp32s_range_is_not_called_inf_or_nan(recipe):
    x = torch.full((1, 32), 1e300, dtype=torch.float64)
    message = r"outside float32's range \(largest magnitude 1e\+300\)"
    with pytest.raises(ValueError, match=message):
        recipe.quantize(x)
    with pytest.raises(ValueError, match=message):
        fp8.quantization_error(x, recipe)
    x[0, 3] = math.inf      # now it does hold one
    with pytest.raises(ValueError, match="inf or NaN"):
        recipe.quantize(x)


def test_float64_beyond_fp32s_range_on_an_accelerator_names_both_causes(monkeypatch):
    monkeypatch.setattr(fp8_casts, "on_accelerator", lambda device: True)
    with pytest.raises(RuntimeError, match="or, being float64, values beyond FP32's range"):
        fp8.CurrentScaling().quantize(torch.full((2, 2), -1e300, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="inf or NaN") as float32_error:
        fp8.CurrentScaling().quantize(torch.tensor([1.0, math.inf]))
    assert "float64" not in str(float32_error.value)     # a float32 tensor's amax is inf only if it holds one


# ---- matmuls and linear layers ----------------------------------------------------------------------

# torch 2.11's CPU _scaled_mm takes per-tensor scales only (torch 2.13's takes rows too): feature-detected
ROWWISE_WHY_NOT = _hardware._scaled_mm_rowwise_runs("cpu")
needs_rowwise = pytest.mark.skipif(ROWWISE_WHY_NOT is not None, reason=str(ROWWISE_WHY_NOT))


def torch_reference_scaled_mm():
    """torch's own CPU _scaled_mm (dequantise in FP32 into row-major operands, then an FP32 matmul), which the
    simulation matches bit for bit. On an x86 CPU with AMX-INT8 torch hands FP8 products (both operands of
    one format) to oneDNN, whose kernel sums in its own order: that path is checked against the FP32 error
    bound below."""
    return torch.backends.mkldnn.flags(enabled=False)


# shapes [M, K, N] where the BLAS order depends on the operands' layout (one or two rows) or that are not
# multiples of 16, then random ones
ODD_SHAPES = [(1, 64, 3), (2, 54, 70), (2, 54, 35), (5, 40, 24), (13, 17, 9), (1, 1, 1), (1, 33, 1), (3, 1, 5),
              (64, 1, 1), (1, 200, 70)]


def _random_shapes(count: int, seed: int = 3):
    gen = torch.Generator().manual_seed(seed)
    return ODD_SHAPES + [tuple(int(v) for v in torch.randint(1, 90, (3,), generator=gen)) for _ in range(count)]


def _operands(kind: str, m: int, k: int, n: int, gen: torch.Generator):
    """``a`` [M, K] and ``b`` [K, N], quantised as the linear layer's products quantise them: ``b`` (and, for
    the "_transposed_a" kinds, ``a``) as the transpose of a row-major tensor, scaled along K."""
    a = torch.randn(m, k, generator=gen) * 3
    b = torch.randn(n, k, generator=gen) / 7
    if kind.startswith("rowwise"):
        pow2 = kind == "rowwise"
        qa, qb = (fp8.RowwiseScaling(power_of_two=pow2).quantize(a),
                  fp8.RowwiseScaling(power_of_two=pow2).quantize(b).t())
    elif kind == "mixed_e5m2_e4m3":
        qa, qb = fp8.CurrentScaling("e5m2").quantize(a), fp8.CurrentScaling("e4m3").quantize(b).t()
    else:
        recipe = fp8.CurrentScaling(power_of_two=kind == "tensorwise_pow2")
        qa, qb = recipe.quantize(a), recipe.quantize(b).t()
    if kind.endswith("_transposed_a"):
        qa = (fp8.RowwiseScaling(axis=0) if kind.startswith("rowwise") else fp8.CurrentScaling()).quantize(
            a.t().contiguous()).t()
    return qa, qb


@pytest.mark.parametrize("recipe", [fp8.CurrentScaling(), fp8.CurrentScaling(power_of_two=True),
                                    pytest.param(fp8.RowwiseScaling(), marks=needs_rowwise),
                                    pytest.param(fp8.RowwiseScaling(power_of_two=False), marks=needs_rowwise)])
def test_simulated_matmul_equals_scaled_mm_bit_for_bit(recipe):
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(48, 64, generator=gen) * 3
    b = torch.randn(32, 64, generator=gen) / 7
    qa = recipe.quantize(a)
    qb = (fp8.RowwiseScaling(axis=-1, power_of_two=recipe.power_of_two) if isinstance(recipe, fp8.RowwiseScaling)
          else recipe).quantize(b).t()
    sim = fp8.fp8_matmul(qa, qb, backend="simulated")
    with torch_reference_scaled_mm():
        real = fp8.fp8_matmul(qa, qb, backend="scaled_mm")
    assert torch.equal(sim, real)


@pytest.mark.parametrize("kind", ["tensorwise", "tensorwise_pow2", "mixed_e5m2_e4m3", "tensorwise_transposed_a",
                                  pytest.param("rowwise", marks=needs_rowwise),
                                  pytest.param("rowwise_exact", marks=needs_rowwise),
                                  pytest.param("rowwise_transposed_a", marks=needs_rowwise)])
def test_simulated_matmul_equals_scaled_mm_bit_for_bit_on_any_shape(kind):
    """Bit for bit on every shape, one-row and one-column operands included (the BLAS sums a few-row product
    in an order that depends on the operands' layout, so the simulation must lay them out as torch does)."""
    gen = torch.Generator().manual_seed(2)
    for m, k, n in _random_shapes(40):
        qa, qb = _operands(kind, m, k, n, gen)
        sim = fp8.fp8_matmul(qa, qb, backend="simulated")
        with torch_reference_scaled_mm():
            real = fp8.fp8_matmul(qa, qb, backend="scaled_mm")
        assert torch.equal(sim, real), f"{kind} {m} x {k} @ {k} x {n}: {int((sim != real).sum())} differ"


def test_scaled_mm_with_onednn_is_within_fp32_summation_error():
    """Whatever kernel this CPU's _scaled_mm uses, it sums the same products, so it differs from the simulation
    by FP32 rounding only. The simulation rounds K + 2 times per output (two dequantised operands, K - 1 sums,
    the product); oneDNN sums the exact code products (K - 1 roundings) and applies both inverse scales after
    (2 more): together at most (2K + 3) * 2^-24 * sum_k |a_ik b_kj| (first order). Zero on CPUs where torch
    keeps its reference kernel."""
    gen = torch.Generator().manual_seed(1)
    for m, k, n in [(48, 64, 32), *ODD_SHAPES]:
        qa, qb = _operands("tensorwise", m, k, n, gen)
        sim = fp8.fp8_matmul(qa, qb, backend="simulated")
        real = fp8.fp8_matmul(qa, qb, backend="scaled_mm")
        bound = (2 * k + 3) * 2.0**-24 * (qa.values().abs() @ qb.values().abs())
        assert torch.all((sim - real).abs() <= bound), f"{m} x {k} @ {k} x {n}"


def test_scaled_mm_refuses_block_scales():
    q = fp8.BlockwiseScaling(block=(1, 16)).quantize(torch.randn(16, 32))
    with pytest.raises(ValueError, match="simulated"):
        fp8.fp8_matmul(q, fp8.CurrentScaling().quantize(torch.randn(32, 16)), backend="scaled_mm")
    with pytest.raises(ValueError, match="backend"):
        fp8.fp8_matmul(q, q.t(), backend="cuda")
    with pytest.raises(ValueError, match="inner dimensions"):
        fp8.fp8_matmul(q, q, backend="simulated")


def _pair(recipe, backend="simulated", seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(64, 48)
    return lin, fp8.Fp8Linear.from_linear(lin, recipe=recipe, backend=backend, block=16)


def test_scaled_mm_refuses_row_scales_where_this_torch_cannot(monkeypatch):
    monkeypatch.setattr(_hardware, "_scaled_mm_rowwise_runs", lambda device: "per-tensor scales only (test)")
    q = fp8.RowwiseScaling().quantize(torch.randn(16, 32))
    qb = fp8.RowwiseScaling(axis=-1).quantize(torch.randn(16, 32)).t()
    with pytest.raises(ValueError, match="per-tensor scales only.*simulated"):
        fp8.fp8_matmul(q, qb, backend="scaled_mm")
    per_tensor = fp8.CurrentScaling().quantize(torch.randn(16, 32))
    assert fp8.fp8_matmul(per_tensor, per_tensor.t(), backend="scaled_mm").shape == (16, 16)


ROWWISE_RECIPES = ("rowwise", "rowwise_with_gw_hp")


@pytest.mark.parametrize("recipe", ["tensorwise", *[pytest.param(r, marks=needs_rowwise) for r in ROWWISE_RECIPES],
                                    "delayed", "unscaled"])
def test_fp8_linear_backends_agree_bit_for_bit(recipe):
    _, sim = _pair(recipe, "simulated")
    _, real = _pair(recipe, "scaled_mm")
    x = torch.randn(2, 8, 64)
    for _ in range(2):   # delayed scaling: a second step uses the recorded amax
        _assert_backends_equal(sim, real, x)


def _assert_backends_equal(sim, real, x):
    """The simulated layer and the _scaled_mm one (torch's reference kernel) give the same output, input
    gradient and weight gradient, bit for bit, for ``x``."""
    xs, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    ys = sim(xs)
    ys.pow(2).sum().backward()
    with torch_reference_scaled_mm():
        yr = real(xr)
        yr.pow(2).sum().backward()
    assert torch.equal(ys, yr)
    assert torch.equal(xs.grad, xr.grad)
    assert torch.equal(sim.weight.grad, real.weight.grad)


@pytest.mark.parametrize("recipe", ["tensorwise", *[pytest.param(r, marks=needs_rowwise) for r in ROWWISE_RECIPES]])
@pytest.mark.parametrize("tokens, in_features, out_features", [(1, 64, 48), (8, 64, 1), (8, 1, 48), (1, 1, 1)])
def test_fp8_linear_scaled_mm_takes_one_token_or_one_feature(recipe, tokens, in_features, out_features):
    """A one-row or one-column operand makes a row/column scale a single one: _scaled_mm still gets it as a
    [M, 1] / [1, N] tensor with unit stride (an expanded scalar has stride 0 and was refused), in the
    forward product and both gradients, bit for bit with the simulation."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(in_features, out_features)
    sim = fp8.Fp8Linear.from_linear(lin, recipe=recipe, backend="simulated")
    real = fp8.Fp8Linear.from_linear(lin, recipe=recipe, backend="scaled_mm")
    _assert_backends_equal(sim, real, torch.randn(tokens, in_features))


@pytest.mark.parametrize("recipe", fp8.FP8_LINEAR_RECIPES)
def test_fp8_linear_is_close_to_fp32_and_every_recipe_trains(recipe):
    lin, f8 = _pair(recipe)
    x = torch.randn(4, 16, 64)
    ref, out = lin(x), f8(x)
    rel = float((out - ref).detach().norm() / ref.detach().norm())
    assert rel < (0.2 if recipe == "unscaled" else 0.08)
    assert rel > 0  # it did quantise
    out.sum().backward()
    assert f8.weight.grad is not None and torch.isfinite(f8.weight.grad).all()


def test_gradients_use_e5m2_and_the_unscaled_control_flushes_them():
    _, f8 = _pair("unscaled")
    x = torch.randn(4, 64, requires_grad=True)
    (f8(x) * 1e-7).sum().backward()   # gradients far below E5M2's smallest subnormal (2**-16)
    assert torch.count_nonzero(x.grad) == 0
    _, scaled = _pair("tensorwise")
    x2 = torch.randn(4, 64, requires_grad=True)
    (scaled(x2) * 1e-7).sum().backward()
    assert torch.count_nonzero(x2.grad) == x2.numel()


def test_grad_weight_high_precision_matches_the_exact_product():
    _, f8 = _pair("rowwise_with_gw_hp")
    x = torch.randn(8, 64)
    g = torch.randn(8, 48)
    out = f8(x)
    out.backward(g)
    assert torch.allclose(f8.weight.grad, g.t() @ x, rtol=1e-5, atol=1e-6)


def _torchao_pair(recipe: str, emulate: bool = False):
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(64, 48, bias=False))
    theirs = copy.deepcopy(base)
    config = Float8LinearConfig.from_recipe_name(recipe)
    if emulate:
        import dataclasses
        config = dataclasses.replace(config, emulate=True)
    convert_to_float8_training(theirs, config=config)
    ours = fp8.convert_to_fp8(copy.deepcopy(base), recipe, backend="scaled_mm", skip=())
    return ours, theirs


@needs_torchao
@pytest.mark.parametrize("recipe", ["tensorwise", *[pytest.param(r, marks=needs_rowwise) for r in ROWWISE_RECIPES]])
def test_fp8_linear_matches_torchao_float8_training(recipe):
    """Our recipes reproduce torchao's Float8Linear: forward output and both gradients, bit for bit.

    One documented difference: with row-wise scales torchao asks ``torch._scaled_mm`` for a BF16 result
    (it has no FP32 output for row-wise scales on CUDA) and casts it back, so its FP32 layer's outputs
    are BF16-rounded; ours are rounded the same way here to compare."""
    ours, theirs = _torchao_pair(recipe)
    assert isinstance(ours[0], fp8.Fp8Linear) and type(theirs[0]).__name__ == "Float8Linear"
    x = torch.randn(32, 64) * 4
    g = torch.randn(32, 48) / 100
    xo, xt = x.clone().requires_grad_(), x.clone().requires_grad_()
    yo, yt = ours(xo), theirs(xt)
    as_torchao = (lambda t: t) if recipe == "tensorwise" else (lambda t: t.bfloat16().float())
    assert torch.equal(as_torchao(yo), yt)
    yo.backward(g)
    yt.backward(g)
    assert torch.equal(as_torchao(xo.grad), xt.grad)
    gw = ours[0].weight.grad if recipe == "rowwise_with_gw_hp" else as_torchao(ours[0].weight.grad)
    assert torch.equal(gw, theirs[0].weight.grad)


def test_convert_to_fp8_skips_the_head_and_validates():
    from course_lib.models import GPTConfig, build_gpt
    model = fp8.convert_to_fp8(build_gpt(GPTConfig()), "rowwise")
    kinds = {n: type(m).__name__ for n, m in model.named_modules()}
    assert kinds["head"] == "Linear" and kinds["blocks.0.fc"] == "Fp8Linear"
    with pytest.raises(ValueError, match="unknown FP8 linear recipe"):
        fp8.convert_to_fp8(build_gpt(GPTConfig()), "nope")
    with pytest.raises(ValueError, match="backend"):
        fp8.Fp8Linear(4, 4, backend="tensor cores")


# ---- accumulation and the roofline ------------------------------------------------------------------

def test_keep_significant_bits_matches_the_codec():
    from course_lib.formats import FloatFormat
    x = torch.randn(10_000) * 1e3
    acc14 = FloatFormat("acc14", 8, 13)
    assert torch.equal(fp8_accumulation._keep_significant_bits(x.clone(), 14, "nearest_even"), round_to_format(x, acc14))
    assert torch.equal(fp8_accumulation._keep_significant_bits(x.clone(), 14, "toward_zero"),
                       round_to_format(x, acc14, rounding="toward_zero"))


def test_accumulation_error_grows_with_k_and_promotion_bounds_it():
    s = fp8.accumulation_error((128, 1024, 4096), dots=16)
    limited = [m for m, _ in s.errors["14-bit accumulator"]]
    promoted = [m for m, _ in s.errors["14-bit, promoted to FP32 every 128"]]
    fp32 = [m for m, _ in s.errors["FP32 accumulator"]]
    assert limited[0] < limited[1] < limited[2]
    assert promoted[2] < limited[2] / 10 and max(fp32) < 1e-5
    assert s.errors["14-bit accumulator"][0] == s.errors["14-bit, promoted to FP32 every 128"][0]
    with pytest.raises(ValueError, match="accumulator_bits"):
        fp8.accumulation_error(accumulator_bits=30)
    with pytest.raises(ValueError, match="rounding"):
        fp8.accumulation_error(rounding="stochastic")


@needs_torchao
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp"])
@pytest.mark.parametrize("fuse", [False, True])
def test_roofline_matches_torchaos(monkeypatch, recipe, fuse):
    roofline = pytest.importorskip("torchao.testing.training.roofline_utils")
    specs = {"bf16_peak_tops": 989.5e12, "fp8_peak_tops": 1979e12, "peak_mem_bw_bytes_sec": 3350e9,
             "pct_achievable_gemm_tops": 0.78, "pct_achievable_mem_bw": 0.92}
    monkeypatch.setitem(roofline.gpu_name_to_specs, "Course GPU", specs)
    for m, k, n in ((256, 256, 256), (1024, 2048, 1024), (16384, 8192, 8192), (64, 4096, 128)):
        ours = fp8.predict_fp8_linear(m, k, n, bf16_tflops=989.5, fp8_tflops=1979, bandwidth_gbs=3350,
                                      recipe=recipe, fuse_casts=fuse)
        bf16 = float(roofline.get_gemm_time_sympy(m, k, n, torch.bfloat16, None, None, "Course GPU"))
        gemm = float(roofline.get_gemm_time_sympy(m, k, n, torch.float8_e4m3fn, recipe, None, "Course GPU"))
        cast = float(roofline.get_float8_mem_sympy(m, k, n, recipe, None, fuse, "Course GPU"))
        assert ours.bf16_s == pytest.approx(bf16, rel=1e-12)
        assert ours.fp8_gemm_s == pytest.approx(gemm, rel=1e-12)
        assert ours.fp8_cast_s == pytest.approx(cast, rel=1e-12)


def test_roofline_small_shapes_are_slower_and_large_approach_2x():
    kw = dict(bf16_tflops=989.5, fp8_tflops=1979, bandwidth_gbs=3350)
    assert fp8.predict_fp8_linear(512, 512, 512, **kw).speedup < 1
    big = fp8.predict_fp8_linear(16384, 16384, 16384, **kw).speedup
    assert 1.6 < big < 2
    with pytest.raises(ValueError, match="m must be"):
        fp8.predict_fp8_linear(0, 1, 1, **kw)
    with pytest.raises(ValueError, match="bandwidth"):
        fp8.predict_fp8_linear(1, 1, 1, bf16_tflops=1, fp8_tflops=2, bandwidth_gbs=-1)
    with pytest.raises(ValueError, match="roofline covers"):
        fp8.predict_fp8_linear(16, 16, 16, recipe="delayed", **kw)


def test_roofline_splits_each_time_by_what_bounds_its_kernels():
    kw = dict(bf16_tflops=989.5, fp8_tflops=1979, bandwidth_gbs=3350)
    assert fp8.kernel_counts("tensorwise") == (3, 13)
    assert fp8.kernel_counts("rowwise") == (3, 10)
    # tensorwise: per operand an amax read and a zero-byte second stage; casts: input, grad_output, weight twice
    assert fp8.cast_kernel_kinds("tensorwise") == {"no bytes": 3, "read": 3, "write": 4}
    assert sum(fp8.cast_kernel_kinds("rowwise").values()) == 10 - 3
    with pytest.raises(ValueError, match="covers"):
        fp8.cast_kernel_kinds("blockwise")
    small = fp8.predict_fp8_linear(256, 256, 256, **kw)
    # every kernel of both layers at the 2 us floor: the speedup is the ratio of kernel counts
    assert (small.bf16_kernels, small.fp8_kernels) == (3, 13)
    assert small.fp8_bound_s["kernel floor"] == pytest.approx(13 * fp8.LAUNCH_SECONDS)
    assert small.bf16_bound_s["kernel floor"] == pytest.approx(3 * fp8.LAUNCH_SECONDS)
    assert small.speedup == pytest.approx(3 / 13)
    # fusing saves bytes, not kernels: at the floor the fused prediction is the same
    fused = fp8.predict_fp8_linear(256, 256, 256, fuse_casts=True, **kw)
    assert fused.fp8_kernels == 13 and fused.speedup == pytest.approx(small.speedup)
    bare = fp8.predict_fp8_linear(256, 256, 256, launch_seconds=0, **kw)
    assert bare.fp8_bound_s["kernel floor"] == 0 and bare.speedup > 2 * small.speedup
    big = fp8.predict_fp8_linear(16384, 16384, 16384, **kw)
    assert big.fp8_bound_s["compute"] > big.fp8_bound_s["memory"] > 0
    for e in (small, fused, bare, big):
        assert sum(e.fp8_bound_s.values()) == pytest.approx(e.fp8_s)
        assert sum(e.bf16_bound_s.values()) == pytest.approx(e.bf16_s)
    with pytest.raises(ValueError, match="roofline covers"):
        fp8.kernel_counts("delayed")


# ---- experiments ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small():
    from course_lib.device import SizeProfile
    return SizeProfile("small")


def test_capture_linear_tensors_shapes_and_errors(small):
    t = fp8_studies.capture_linear_tensors(small, steps=2)
    assert t.activation.shape == (16 * 64, 64) and t.weight.shape == (256, 64)
    assert t.grad_output.shape == (16 * 64, 256) and len(t.losses) == 2
    # the output gradient of a mean loss over 1024 tokens is small: far below E4M3's smallest subnormal
    assert float(t.grad_output.abs().median()) < 2.0**-9
    with pytest.raises(ValueError, match="not a linear layer"):
        fp8_studies.capture_linear_tensors(small, layer="blocks.0.ln1", steps=1)


def test_lab_and_outlier_sweep(small):
    t = fp8_studies.capture_linear_tensors(small, steps=2)
    lab = fp8_studies.scaling_lab({"gradient": t.grad_output, "weight": t.weight}, fp8_studies.lab_recipes(32))
    assert lab.errors["gradient"]["no scaling (E4M3)"].flushed > 0.9
    assert lab.errors["gradient"]["per tensor, E4M3"].flushed < 0.01
    assert lab.errors["weight"]["per tensor, E5M2"].relative_error > lab.errors["weight"]["per tensor, E4M3"].relative_error
    with pytest.raises(ValueError, match="does not tile"):
        fp8_studies.scaling_lab({"weight": t.weight}, fp8_studies.lab_recipes(128))
    with pytest.raises(ValueError, match="at least one"):
        fp8_studies.scaling_lab({}, fp8_studies.lab_recipes(32))
    sweep = fp8_studies.outlier_sweep(t.activation, {"tensor": fp8.CurrentScaling(), "column": fp8.RowwiseScaling(axis=0)},
                              factors=(1, 1e6))
    assert sweep.flushed["tensor"][1] > 0.5 and sweep.flushed["column"][1] == sweep.flushed["column"][0]
    with pytest.raises(ValueError, match="outside"):
        fp8_studies.with_outlier_channel(t.activation, channel=64)


def test_delayed_spike_validates():
    with pytest.raises(ValueError, match="spike_at"):
        fp8_studies.delayed_spike(torch.ones(4, 4), steps=5, spike_at=5)
    run = fp8_studies.delayed_spike(torch.randn(8, 8), steps=6, spike_at=3, factor=100.0, amax_history_len=4)
    assert run.saturated["current"] == (0.0,) * 6
    assert run.saturated["delayed, max of 4"][3] > 0.5 and run.saturated["delayed, max of 4"][4] == 0.0


def test_fp8_training_runs_and_the_unscaled_control_learns_slower(small):
    res = fp8_studies.fp8_training(small, recipes=("tensorwise", "unscaled"), seeds=(0,), steps=30)
    assert res.steps == 30 and len(res.curves["tensorwise"][0]) == 30
    assert res.final("unscaled")[0] > res.final("tensorwise")[0] + 0.05
    with pytest.raises(ValueError, match="at least one"):
        fp8_studies.fp8_training(small, recipes=())


def test_fp8_experiments_run_small_on_the_cpu(small):
    import json

    from course_lib.experiments import run_experiment
    from course_lib.results import to_jsonable
    lab = run_experiment("fp8_scaling_lab", small, "cpu")
    json.dumps(to_jsonable(lab), allow_nan=False)
    assert lab.block == 32 and set(lab.lab.errors) == {"activation", "weight", "gradient"}
    speed = run_experiment("fp8_linear_speed", small, "cpu")
    assert speed.sizes == (64, 128, 256) and set(speed.seconds["BF16 nn.Linear"]) == {64, 128, 256}
    # a size an implementation was not timed at is named, with why (a CPU's software FP8 kernel is slow)
    for name, times in speed.seconds.items():
        untimed = [n for n in speed.sizes if n not in times]
        assert not untimed or speed.left_out[name].startswith(f"n = {untimed[0]}")
    with pytest.raises(ValueError, match="multiples of 16"):
        fp8_studies.fp8_linear_speed((100,), "cpu")


def test_low_precision_input_is_scaled_in_fp32(monkeypatch):
    x = (torch.randn(64, 64) * 3).bfloat16()
    for recipe in (fp8.CurrentScaling(), fp8.RowwiseScaling(), fp8.BlockwiseScaling(block=(1, 16))):
        assert torch.equal(recipe.quantize(x).data.view(torch.uint8), recipe.quantize(x.float()).data.view(torch.uint8))
    monkeypatch.setattr(fp8_casts, "_CHUNK", 256)   # the chunked path too
    assert torch.equal(fp8.cast_saturating(x, "e4m3", 3.3).view(torch.uint8),
                       fp8.cast_saturating(x.float(), "e4m3", 3.3).view(torch.uint8))


def test_scaled_mm_unsupported_reason_is_measured():
    assert _hardware.scaled_mm_unsupported_reason("cpu") == _hardware._scaled_mm_runs("cpu")
    assert _hardware.scaled_mm_unsupported_reason("cpu", row_scales=True) == ROWWISE_WHY_NOT
    assert _hardware.scaled_mm_unsupported_reason(torch.device("cpu"), row_scales=True) == ROWWISE_WHY_NOT


# ---- the accelerator path: whole-tensor casts, no host read-back, BF16 in and out --------------------------

VECTOR_RECIPES = [fp8.CurrentScaling("e4m3"), fp8.CurrentScaling("e5m2"), fp8.RowwiseScaling(axis=-1),
                  fp8.RowwiseScaling(axis=0), fp8.BlockwiseScaling(block=(1, 16)),
                  fp8.BlockwiseScaling(block=(16, 1)), fp8.BlockwiseScaling(block=(16, 16)), fp8.StaticScaling()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("recipe", VECTOR_RECIPES, ids=repr)
def test_whole_tensor_casts_equal_the_chunked_ones_bit_for_bit(monkeypatch, recipe, dtype):
    x = (torch.randn(96, 160, generator=torch.Generator().manual_seed(3)) * 50).to(dtype)
    x[5, 7] = 1e6    # saturates the blocks without their own scale
    monkeypatch.setattr(fp8_casts, "_CHUNK", 256)   # many chunks, rows split inside a block too
    chunked = recipe.quantize(x)
    chunked_amax = fp8.block_amax(x, recipe.block_for(tuple(x.shape)))

    def no_slicing(*args):
        raise AssertionError("the accelerator path sliced the tensor")

    monkeypatch.setattr(fp8_casts, "on_accelerator", lambda device: True)   # what a GPU tensor gets
    monkeypatch.setattr(fp8_casts, "_row_slices", no_slicing)
    whole = recipe.quantize(x)
    assert torch.equal(whole.data.view(torch.uint8), chunked.data.view(torch.uint8))
    assert torch.equal(whole.scales, chunked.scales)
    assert torch.equal(fp8.block_amax(x, recipe.block_for(tuple(x.shape))), chunked_amax)


def test_whole_tensor_saturating_cast_equals_the_chunked_one(monkeypatch):
    x = torch.randn(40, 100, generator=torch.Generator().manual_seed(1)) * 300
    monkeypatch.setattr(fp8_casts, "_CHUNK", 64)
    chunked = {fmt: fp8.cast_saturating(x, fmt, 7.0) for fmt in ("e4m3", "e5m2")}
    monkeypatch.setattr(fp8_casts, "on_accelerator", lambda device: True)
    for fmt, codes in chunked.items():
        assert torch.equal(fp8.cast_saturating(x, fmt, 7.0).view(torch.uint8), codes.view(torch.uint8))


def test_on_accelerator_is_the_device_type():
    assert fp8_casts.on_accelerator("cpu") is False
    assert fp8_casts.on_accelerator(torch.device("cuda", 0)) is True
    assert fp8_casts.on_accelerator("meta") is True


def test_finite_check_on_an_accelerator_is_queued_not_read_back(monkeypatch):
    monkeypatch.setattr(fp8_casts, "on_accelerator", lambda device: True)
    queued = []
    real = torch._assert_async
    monkeypatch.setattr(torch, "_assert_async", lambda flag, msg: queued.append((flag.clone(), msg)))
    # a host read-back of the flag would call Tensor.__bool__ (or .item()); on a GPU that waits for the queue
    monkeypatch.setattr(torch.Tensor, "__bool__", lambda self: pytest.fail("the check read the flag back"))
    bad = torch.tensor([[1.0, float("nan")], [2.0, 3.0]])
    fp8.check_finite_amax(torch.tensor([[1.0]]))
    fp8.check_finite_amax(bad)
    assert [bool(flag.item() != 0) for flag, _ in queued] == [True, False]
    assert queued[1][1] == fp8_casts.NONFINITE_MESSAGE
    monkeypatch.undo()
    # the real asynchronous assertion fails, on the CPU at once, with the same message
    monkeypatch.setattr(fp8_casts, "on_accelerator", lambda device: True)
    with pytest.raises(RuntimeError, match="inf or NaN"):
        fp8.CurrentScaling().quantize(torch.tensor([1.0, float("inf")]))
    assert real is torch._assert_async
    # a torch without it checks synchronously, as on the CPU
    monkeypatch.delattr(torch, "_assert_async")
    with pytest.raises(ValueError, match="inf or NaN"):
        fp8.check_finite_amax(bad)


@pytest.mark.parametrize("backend", ["simulated", "scaled_mm"])
@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise", "rowwise_with_gw_hp", "blockwise"])
def test_bf16_in_and_out_is_the_fp32_layer_rounded_to_bf16(recipe, backend):
    if backend == "scaled_mm" and recipe == "blockwise":
        pytest.skip("_scaled_mm takes no block scales")
    if backend == "scaled_mm" and recipe != "tensorwise" and ROWWISE_WHY_NOT is not None:
        pytest.skip(ROWWISE_WHY_NOT)
    torch.manual_seed(0)
    base = torch.nn.Linear(64, 48, bias=False)
    x = torch.randn(32, 64).bfloat16()
    with torch.backends.mkldnn.flags(enabled=False):
        layers = [fp8.Fp8Linear.from_linear(base, recipe=recipe, backend=backend, block=16, io_dtype=io)
                  for io in (None, torch.bfloat16)]
        plain, bf16 = (fp8_studies.output_and_gradients(layer, x, loss=lambda y: (y.float() ** 2).sum())
                       for layer in layers)
    assert plain[0].dtype == bf16[0].dtype == torch.bfloat16
    assert bf16[1].dtype == torch.bfloat16 and bf16[2].dtype == torch.float32
    for a, b in zip(plain, bf16):
        assert torch.equal(a, b)


def test_bf16_io_adds_the_bias_in_bf16_and_validates():
    torch.manual_seed(0)
    base = torch.nn.Linear(32, 16)
    layer = fp8.Fp8Linear.from_linear(base, io_dtype=torch.bfloat16)
    x = torch.randn(4, 8, 32)
    y = layer(x)
    assert y.dtype == torch.bfloat16 and y.shape == (4, 8, 16)
    no_bias = fp8.Fp8Linear.from_linear(torch.nn.Linear(32, 16, bias=False), io_dtype=torch.bfloat16)
    with torch.no_grad():
        no_bias.weight.copy_(base.weight)
    assert torch.equal(y, no_bias(x) + base.bias.detach().bfloat16())
    assert "io_dtype=torch.bfloat16" in repr(layer)
    with pytest.raises(ValueError, match="io_dtype"):
        fp8.Fp8Linear(32, 16, io_dtype=torch.float16)


def test_torchao_float8_converts_every_linear_but_the_skipped_with_the_recipes_config(monkeypatch):
    """The one way the course calls torchao's float8 training (the ladder, the compiled speed study, the
    eager layer comparison): its recipe's config, the skipped paths left alone, and a named ImportError."""
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    model = nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16))
    out = fp8.torchao_float8("rowwise", skip=("2",))(model)
    assert isinstance(out[0], Float8Linear) and type(out[2]) is nn.Linear
    assert out[0].config == Float8LinearConfig.from_recipe_name("rowwise")
    plain = fp8.torchao_float8()(nn.Sequential(nn.Linear(32, 32)))
    assert plain[0].config == Float8LinearConfig()          # tensorwise: torchao's default
    with pytest.raises(ValueError, match="recipe must be one of"):
        fp8.torchao_float8("blockwise")
    with pytest.raises(TypeError, match="tuple of module paths"):
        fp8.torchao_float8(skip="head")
    monkeypatch.setitem(sys.modules, "torchao.float8", None)   # as where torchao is not installed
    with pytest.raises(ImportError, match="torchao's float8 training does not import here"):
        fp8.torchao_float8()
