"""Lesson 8's recipe mechanisms on one layer: the Hadamard transform on the weight-gradient product and the
bias of round-to-nearest against stochastic rounding."""

import math

import pytest
import torch

from course_lib import mx
from course_lib.studies import microscaling as ms
from course_lib.studies import microscaling_mechanisms as mm


def heavy_tailed(rows: int, cols: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen) * torch.rand(rows, cols, generator=gen).pow(4) * 10


def test_hadamard_effect_matches_the_recipe_and_keeps_the_product():
    g, x = heavy_tailed(256, 8, 0), heavy_tailed(256, 12, 1)
    e = mm.hadamard_effect(g, x)
    assert e.identity_error < 1e-6                       # H H^T = I: the transform alone changes nothing
    # the plain product is NVFP4 along the tokens, computed independently here
    q = mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True)
    plain = q.round_trip(g.t().contiguous()).double() @ q.round_trip(x.t().contiguous()).double().t()
    exact = g.double().t() @ x.double()
    assert e.plain_product == pytest.approx(float((plain - exact).norm() / exact.norm()), rel=1e-9)
    # with the transform: the recipe's signs (seed 0) on groups of 16 tokens, both operands
    h = mx.random_hadamard_matrix(mx.random_signs(16, 0))
    g_h, x_h = mx.hadamard_groups(g.t().contiguous(), h), mx.hadamard_groups(x.t().contiguous(), h)
    rht = q.round_trip(g_h).double() @ q.round_trip(x_h).double().t()
    assert e.rht_product == pytest.approx(float((rht - exact).norm() / exact.norm()), rel=1e-9)
    assert e.rht_product != e.plain_product
    better = mm.HadamardEffect(16, 0.1, 0.1, 0.06, 0.12, 0.09, 0.03, 1e-8)
    assert "quantised in blocks along the tokens as the weight-gradient product reads them" in \
        mm.hadamard_sentence(better)
    assert "changes each operand's own error by at most 2.0 points (gradient 10.0% without, 12.0% with" in \
        mm.hadamard_sentence(better)
    assert "lowered the error of their product, the weight gradient, from 6.0% to 3.0% (2.0 times lower)" in \
        mm.hadamard_sentence(better)
    # the numbers a reader checks are the printed ones: 9.64 - 8.66 is 0.98 but prints as 9.6 - 8.7 = 0.9;
    # 7.54 / 3.16 is 2.39 but prints as 7.5 / 3.2 = 2.34 (the lesson's case)
    printed = mm.hadamard_sentence(mm.HadamardEffect(16, 0.0866, 0.2, 0.0754, 0.0964, 0.2, 0.0316, 1e-8))
    assert "by at most 0.9 points (gradient 8.7% without, 9.6% with" in printed
    assert "from 7.5% to 3.2% (2.3 times lower)" in printed
    worse = mm.HadamardEffect(16, 0.1, 0.1, 0.02, 0.1, 0.1, 0.03, 1e-8)
    assert "raised the error of their product, the weight gradient, from 2.0% to 3.0%." in mm.hadamard_sentence(worse)
    # it says how this measurement differs from the recipe's whole-model ablation
    assert "rounds both operands to nearest" in mm.hadamard_sentence(worse)
    assert mm.hadamard_takeaway(better) == ("the Hadamard transform leaves the product unchanged and lowered one "
                                            "layer's weight-gradient error (6.0% to 3.0%, both operands rounded to "
                                            "nearest)")
    assert "and raised one layer's" in mm.hadamard_takeaway(worse)


def test_hadamard_effect_rejects_bad_input():
    with pytest.raises(TypeError, match="torch.Tensor"):
        mm.hadamard_effect([[1.0]], torch.ones(16, 2))
    with pytest.raises(ValueError, match="multiple of 16"):
        mm.hadamard_effect(torch.ones(15, 2), torch.ones(15, 2))
    with pytest.raises(ValueError, match="same number of tokens"):
        mm.hadamard_effect(torch.ones(16, 2), torch.ones(32, 2))
    with pytest.raises(ValueError, match="all-zero"):
        mm.hadamard_effect(torch.zeros(16, 2), torch.ones(16, 2))


def test_rounding_bias_shows_stochastic_rounding_unbiased_and_nearest_not():
    x = torch.rand(4, 64, generator=torch.Generator().manual_seed(0)) * 5 + 0.1
    b = mm.rounding_bias(x, draws=64)
    assert b.ks == (1, 4, 16, 64)
    # nearest is the same every time: its error is mx's round trip's
    q = mm.nvfp4_scaling().round_trip(x).double()
    assert b.nearest == pytest.approx(float((q - x.double()).norm() / x.double().norm()))
    # the mean of stochastic copies converges well below nearest
    assert b.stochastic[-1] < b.nearest < b.stochastic[0]
    assert list(b.stochastic) == sorted(b.stochastic, reverse=True)
    assert 0 <= b.clamped < 1
    with pytest.raises(ValueError, match="draws"):
        mm.rounding_bias(x, draws=1)


def test_rounding_bias_sentence_reads_its_numbers():
    unbiased = mm.RoundingBias((1, 4, 16), (0.16, 0.08, 0.04), 0.1, 0.0)
    text = mm.rounding_bias_sentence(unbiased)
    assert "13.6" not in text and "16.0% off, more than rounding to nearest's 10.0%" in text
    assert "the mean of 16 copies is 4.0% off" in text and "no bias shows" in text and unbiased.bias_share == 1.0
    # the ratio from the printed errors: 1.5% / (13.6% / 16) = 1.76, where the unrounded ones give 1.71
    printed = mm.rounding_bias_sentence(mm.RoundingBias((1, 16, 256), (0.1364, 0.05, 0.01455), 0.1, 0.0))
    assert "13.6% off" in printed and "the mean of 256 copies is 1.5% off" in printed
    assert "(1.8 times what 1/sqrt(256) predicts)" in printed
    # the verdict is decided on the printed ratio: 1.0% / (10.5% / 16) = 1.52 prints 1.5, a bias, although the
    # unrounded errors give 0.98 / (10.49 / 16) = 1.49
    edge = mm.RoundingBias((1, 16, 256), (0.1049, 0.05, 0.0098), 0.2, 0.0)
    assert edge.bias_share < 1.5 and "(1.5 times what 1/sqrt(256) predicts): a bias remains" in \
        mm.rounding_bias_sentence(edge)
    assert "though some remains" in mm.rounding_takeaway(edge)
    biased = mm.RoundingBias((1, 4, 16), (0.16, 0.1, 0.08), 0.1, 0.025)
    assert biased.bias_share == pytest.approx(2.0)
    assert "a bias remains" in mm.rounding_bias_sentence(biased) and "2.5% of the values" in \
        mm.rounding_bias_sentence(biased)
    assert mm.rounding_takeaway(biased) == ("stochastic rounding reduces the rounding bias across steps, though "
                                            "some remains (the mean of 16 copies 8.0% off, against 10.0% for "
                                            "rounding to nearest)")
    assert mm.rounding_takeaway(unbiased).startswith("stochastic rounding shows no bias across steps")
    facts = mm.mechanism_facts(mm.HadamardEffect(16, 0.1, 0.1, 0.02, 0.1, 0.1, 0.01, 1e-8), unbiased)
    assert facts["rht_plain"] == pytest.approx(2.0) and facts["sr_k"] == 16 and facts["sr_mean"] == pytest.approx(4.0)


def test_outlier_ratio():
    act = torch.tensor([[1.0, -2.0], [0.5, 0.25]])
    out = act.clone()
    out[:, 0] *= 100
    assert ms.outlier_ratio({"activation": act, "activation + outlier": out}) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="needs the tensors"):
        ms.outlier_ratio({"activation": act})
    assert not math.isnan(ms.outlier_ratio({"activation": act, "activation + outlier": act}))
