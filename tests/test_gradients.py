import math

import pytest
import torch

from course_lib.device import SizeProfile
from course_lib.gradients import capture_gradients, summarize_underflow, sweep_loss_scale, underflow_table
from course_lib.studies.underflow import compare_naive_fp16, train_and_capture
from course_lib.models import DeepMLP, regression_batch


def test_summary_fractions_on_hand_made_values():
    # FP16: 0 (zero), 2**-26 (flushes), 2**-20 (subnormal), 1.0 (normal), 1e5 (overflow)
    values = torch.tensor([0.0, 2.0**-26, 2.0**-20, 1.0, 1e5])
    s = summarize_underflow(values, "FP16")
    assert (s.zero, s.flushed, s.subnormal, s.overflow) == (0.2, 0.2, 0.2, 0.2)
    assert s.normal == pytest.approx(0.2) and s.lost == pytest.approx(0.4)
    scaled = summarize_underflow(values, "FP16", loss_scale=2.0**10)
    assert scaled.flushed == 0.0 and scaled.subnormal == 0.2  # 2**-26 * 2**10 = 2**-16 is subnormal
    bf16 = summarize_underflow(values, "BF16")
    assert bf16.flushed == bf16.subnormal == bf16.overflow == 0.0
    e4m3 = summarize_underflow(torch.tensor([1000.0, 1.0]), "FP8 E4M3")
    assert e4m3.overflow == 0.5  # E4M3 saturates by default; the summary still counts overflow


def test_half_the_smallest_subnormal_is_a_tie_to_zero():
    s = summarize_underflow(torch.tensor([2.0**-25, 2.0**-25 * 1.5]), "FP16")
    assert s.flushed == 0.5 and s.subnormal == 0.5


def test_capture_gets_every_linear_in_forward_order():
    mlp = DeepMLP(width=64, depth=5)
    x, y = regression_batch(64, 8, step=0)
    cap = capture_gradients(mlp, lambda m: ((m(x) - y) ** 2).mean())
    acts = cap.of_kind("activation")
    assert [g.name for g in acts] == [f"layers.{i}" for i in range(5)]
    assert [g.index for g in acts] == list(range(5))
    assert all(g.numel == 8 * 64 for g in acts)
    # the last layer's output gradient is d(mean squared error)/d(output) = 2 (out - y) / N
    out = mlp(x)
    torch.testing.assert_close(acts[-1].values, (2 * (out - y) / out.numel()).flatten().detach())
    assert len(cap.of_kind("weight")) == 5 and math.isfinite(cap.loss)


def test_deep_mlp_gradients_shrink_going_backwards():
    mlp = DeepMLP(width=64, depth=12)
    x, y = regression_batch(64, 64, step=0)
    acts = capture_gradients(mlp, lambda m: ((m(x) - y) ** 2).mean()).of_kind("activation")
    medians = [float(g.values.abs().median()) for g in acts]
    assert medians == sorted(medians) and medians[-1] > 100 * medians[0]


def test_subsampling_caps_values():
    model = torch.nn.Sequential(torch.nn.Linear(8, 512))
    cap = capture_gradients(model, lambda m: m(torch.ones(100, 8)).sum(), max_values_per_layer=1000)
    (act,) = cap.of_kind("activation")
    assert act.numel == 51200 and act.values.numel() <= 1000


def test_sweep_and_table():
    values = torch.tensor([2.0**-30, 2.0**-10, 2.0**5])
    sweep = sweep_loss_scale(values, [1.0, 2.0**10, 2.0**20], "FP16")
    assert sweep.flushed[0] == pytest.approx(1 / 3) and sweep.flushed[1] == 0.0
    assert sweep.overflow[2] == pytest.approx(1 / 3) and sweep.survive[1] == 1.0
    run = train_and_capture(SizeProfile("small"), steps=2)
    assert set(run.captures) == {0, 1} and len(run.losses) == 2
    rows = underflow_table(run.captures[1], ("FP16", "BF16"))
    assert len(rows) == 2 * len(run.captures[1].of_kind("activation"))


def test_naive_fp16_loses_gradients_and_updates_that_fp32_keeps():
    result = compare_naive_fp16(SizeProfile("small"), steps=6, seeds=(0, 1))
    fp32, fp16 = result.recipes
    assert result.seeds == (0, 1) and all(len(c) == 6 for r in result.curves.values() for c in r)
    for z32, z16 in zip(result.mean_over_steps("zero_grad_fraction", fp32),
                        result.mean_over_steps("zero_grad_fraction", fp16)):
        assert z16 > z32
    for u32, u16 in zip(result.mean_over_steps("unchanged_fraction", fp32),
                        result.mean_over_steps("unchanged_fraction", fp16)):
        assert u16 > 2 * u32      # FP16's spacing is 2**13 times FP32's: far more updates round away
    # Adam's second moment (g**2, kept in FP16) underflows, the denominator falls to eps, the steps grow
    for m32, m16, s32, s16 in zip(result.mean_over_steps("moment_underflow", fp32),
                                  result.mean_over_steps("moment_underflow", fp16),
                                  result.mean_over_steps("update_size", fp32, first=3),
                                  result.mean_over_steps("update_size", fp16, first=3)):
        assert m16 > 0.1 > m32 and s16 > 2 * s32
    # the same seed gives both runs the same initial model and batches: equal first losses up to FP16 rounding
    for a, b in zip(result.curves[fp32], result.curves[fp16]):
        assert abs(a[0] - b[0]) < 0.02 and all(math.isfinite(v) for v in a + b)
    assert len(result.final(fp16, tail=3)) == 2
    with pytest.raises(ValueError, match="seeds"):
        compare_naive_fp16(SizeProfile("small"), steps=2, seeds=())
    with pytest.raises(ValueError, match="attribute"):
        result.mean_over_steps("zeros", fp16)


def test_bad_input():
    with pytest.raises(TypeError, match="floating-point"):
        summarize_underflow(torch.tensor([1, 2]), "FP16")
    with pytest.raises(ValueError, match="loss_scale must be a positive"):
        summarize_underflow(torch.ones(2), "FP16", loss_scale=0)
    with pytest.raises(ValueError, match="1 non-finite entries"):
        summarize_underflow(torch.tensor([math.inf]), "FP16")
    with pytest.raises(ValueError, match="no nn.Linear"):
        capture_gradients(torch.nn.ReLU(), lambda m: torch.ones(1, requires_grad=True).sum())
    with pytest.raises(ValueError, match="capture steps"):
        train_and_capture(SizeProfile("small"), steps=3, capture_at=(5,))
    with pytest.raises(ValueError, match="all values are zero"):
        sweep_loss_scale(torch.zeros(3), [1.0])
    with pytest.raises(ValueError, match="depth must be a positive int"):
        DeepMLP(depth=0)


def test_summarize_underflow_refuses_infinite_scale_and_non_finite_values():
    import math

    import pytest
    import torch

    from course_lib.gradients import summarize_underflow

    with pytest.raises(ValueError, match="positive finite"):
        summarize_underflow(torch.randn(10), "FP16", loss_scale=math.inf)
    with pytest.raises(ValueError, match="2 non-finite entries"):
        summarize_underflow(torch.tensor([1.0, math.nan, math.inf]), "FP16")


def test_summarize_underflow_refuses_unsigned_formats_and_names_bad_input():
    import numpy as np

    from course_lib.formats import FloatFormat

    values = torch.tensor([-1.0, 0.0, 1e-30, 1.0])
    # E8M0 has no sign and no zero: -1 and 0 would have counted as "overflow" (NaN), 40% of the values
    for fmt, match in (("E8M0", "'E8M0' is an unsigned format \\(no sign bit, no zero\\)"),
                       (FloatFormat("U", 5, 2, signed=False), "'U' is an unsigned format \\(no sign bit\\)")):
        with pytest.raises(ValueError, match=match):
            summarize_underflow(values, fmt)
        with pytest.raises(ValueError, match="unsigned"):
            sweep_loss_scale(values, [1.0], fmt)
    for scale in (0, -1.0, math.inf, -math.inf, math.nan):
        with pytest.raises(ValueError, match=f"loss_scale must be a positive finite number, got {scale!r}"):
            summarize_underflow(values, "FP16", loss_scale=scale)
    for scale, kind in (("2", "str"), (True, "bool"), (torch.tensor(2.0), "Tensor"), (None, "NoneType")):
        with pytest.raises(TypeError, match=f"loss_scale must be a real number, got {kind}"):
            summarize_underflow(values, "FP16", loss_scale=scale)
    assert summarize_underflow(values, "FP16", np.float32(2.0)) == summarize_underflow(values, "FP16", 2.0)
    for bad, match in (([1.0], "got list"), (np.ones(2), "got ndarray"),
                       (torch.tensor([1, 2]), "got dtype torch.int64"),
                       (torch.tensor([1j]), "got dtype torch.complex64")):
        with pytest.raises(TypeError, match=f"values must be a floating-point torch tensor, {match}"):
            summarize_underflow(bad, "FP16")
    with pytest.raises(ValueError, match="values is empty"):
        summarize_underflow(torch.tensor([]), "FP16")
    with pytest.raises(ValueError, match="1 non-finite entries"):
        summarize_underflow(torch.tensor([1.0, math.nan]), "FP6 E2M3")


def test_sweep_splits_subnormal_survivors_and_reports_a_plateau():
    import pytest
    import torch

    from course_lib.formats import get_format

    fp16 = get_format("FP16")
    # half the values are normal in FP16 at scale 1, half are subnormal there and normal at scale 2**10
    values = torch.cat([torch.full((50,), 1.0), torch.full((50,), fp16.min_normal / 8)])
    sweep = sweep_loss_scale(values, [2.0 ** k for k in range(0, 16)], "FP16")
    assert sweep.survive[0] == 1.0 and sweep.subnormal[0] == 0.5 and sweep.survive_normal[0] == 0.5
    assert sweep.survive_normal[10] == 1.0
    lo, hi = sweep.plateau(0.005)
    assert lo == 1.0 and hi == 2.0 ** 15  # every scale here keeps every value: one wide plateau
    assert sweep.plateau(0.005, normal=True) == (2.0 ** 3, 2.0 ** 15)  # 2**-17 * 2**3 = 2**-14: normal
    with pytest.raises(ValueError, match="tolerance"):
        sweep.plateau(1.5)
