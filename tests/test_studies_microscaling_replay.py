"""Lesson 8's replay of the widest one-step gap, and the switch it uses (exact_products)."""

import math

import pytest
import torch
from torch import nn

from course_lib import mx, plots
from course_lib.device import size_profile
from course_lib.fp8 import Fp8Linear
from course_lib.glue import Prose
from course_lib.studies import microscaling_replay as R
from course_lib.studies.fp8 import Fp8Training
from course_lib.studies.microscaling import train_block_scaled

PROFILE = size_profile("cpu")


def _layers():
    torch.manual_seed(0)
    linear = nn.Linear(64, 32)
    return linear, mx.BlockLinear.from_linear(linear, recipe="mxfp4"), Fp8Linear.from_linear(linear)


@pytest.mark.parametrize("which", [1, 2])
def test_exact_products_gives_the_plain_fp32_product_and_its_gradients(which):
    linear, *quantised = _layers()
    layer = quantised[which - 1]
    model = nn.Sequential(layer)
    x = torch.randn(2, 16, 64)
    quantised_out = layer(x)
    with mx.exact_products(model) as same:
        assert same is model
        xe = x.clone().requires_grad_(True)
        out = layer(xe)
        out.square().sum().backward()
    # the same ops as the layer's exact path: an FP32 product, then the bias
    xr = x.clone().requires_grad_(True)
    w, b = linear.weight.detach().clone().requires_grad_(True), linear.bias.detach().clone().requires_grad_(True)
    ref = (xr.reshape(-1, 64) @ w.t() + b).reshape(2, 16, 32)
    ref.square().sum().backward()
    assert torch.equal(out, ref)
    assert torch.equal(xe.grad, xr.grad) and torch.equal(layer.weight.grad, w.grad)
    assert torch.equal(layer.bias.grad, b.grad)
    # outside the block the layer quantises again, as before
    assert not torch.equal(quantised_out, ref.detach()) and torch.equal(layer(x), quantised_out)
    assert "exact" not in layer.__dict__


def test_exact_products_restores_the_layers_after_an_error_and_refuses_a_non_module():
    _, layer, _ = _layers()
    layer.exact = False
    with pytest.raises(RuntimeError, match="inside"):
        with mx.exact_products(layer):
            assert layer.exact
            raise RuntimeError("inside")
    assert layer.__dict__["exact"] is False
    with pytest.raises(TypeError, match="nn.Module"):
        with mx.exact_products([layer]):
            pass


def test_replay_lengths():
    assert R.replay_lengths(0) == ()
    assert R.replay_lengths(1) == (1,)
    assert R.replay_lengths(3) == (1, 2, 3)
    assert R.replay_lengths(15) == tuple(range(1, 16))
    assert R.replay_lengths(40) == (*range(1, 17), 32, 40)
    assert R.replay_lengths(100, dense=4) == (1, 2, 3, 4, 32, 64, 100)
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="step"):
            R.replay_lengths(bad)
    with pytest.raises(ValueError, match="dense"):
        R.replay_lengths(5, dense=-1)


def test_replay_widest_gap_retrains_the_run_and_ends_on_the_fp32_run():
    # hand-built curves put the widest gap at mxfp4, seed 0, step 2; the replay retrains that run for real
    curves = {"bf16_autocast": ((9.0, 9.0, 1.0, 9.0),), "mxfp4": ((9.0, 9.0, 5.0, 9.0),)}
    result = Fp8Training(("bf16_autocast", "mxfp4"), (0,), 4, 16, curves)
    replay = R.replay_widest_gap(result, PROFILE, "cpu")
    assert (replay.recipe, replay.seed, replay.step, replay.baseline, replay.recorded) == ("mxfp4", 0, 2, 1.0, 5.0)
    run = train_block_scaled("mxfp4", PROFILE, "cpu", steps=4, seed=0)
    assert replay.as_run == run.losses[2]          # the same run, retrained: the same loss, bit for bit
    assert [k for k, _ in replay.replays] == [1, 2]
    # every step exact from the initial weights is the FP32 run (the layers' product differs from nn.Linear's
    # fused one only in rounding)
    fp32 = train_block_scaled("fp32", PROFILE, "cpu", steps=4, seed=0)
    assert replay.replays[-1][1] == pytest.approx(fp32.losses[2], abs=1e-4)
    assert replay.replays[-1][1] != pytest.approx(replay.as_run, abs=1e-4)
    assert math.isfinite(replay.exact_forward) and replay.exact_forward != replay.as_run
    with pytest.raises(ValueError, match="not a block-scaled recipe"):
        R.replay_widest_gap(Fp8Training(("bf16_autocast", "fp32"), (0,), 4, 16,
                                        {"bf16_autocast": curves["bf16_autocast"], "fp32": curves["mxfp4"]}),
                            PROFILE, "cpu")


def test_a_gap_at_step_zero_has_nothing_to_replay():
    curves = {"bf16_autocast": ((1.0, 9.0, 9.0),), "mxfp8": ((5.0, 9.0, 9.0),)}
    replay = R.replay_widest_gap(Fp8Training(("bf16_autocast", "mxfp8"), (0,), 3, 16, curves), PROFILE, "cpu")
    assert replay.step == 0 and replay.replays == ()
    with pytest.raises(ValueError, match="step 0"):
        plots.plot_gap_replay(replay)


def _replay(replays, *, exact_forward=3.70, as_run=3.673, recorded=3.673):
    return R.GapReplay("mxfp4", 1, 15, 3.295, recorded, as_run, exact_forward, tuple(replays))


# the lesson's run on this machine, seed 1, step 15 (the dense part of it)
LESSON = [(1, 3.589), (2, 3.576), (3, 3.598), (4, 3.471), (5, 3.657), (6, 3.677), (7, 3.691), (8, 3.426),
          (9, 3.374), (10, 3.380), (11, 3.342), (12, 3.355), (13, 3.375), (14, 3.321), (15, 3.294)]


def test_replay_sentence_places_a_jump_built_over_many_steps():
    text = R.replay_sentence(_replay(LESSON))
    assert isinstance(text, Prose)
    assert text == (
        "Retrained from its seed, `mxfp4`'s loss at step 15 (seed 1) came out at 3.673 as in the run above. With exact products "
        "on the same weights it is 3.700, still +0.405 from BF16's: the jump is in the weights the run had reached, "
        "not in that step's rounding of the forward pass. With the last step's products exact it is still 3.589. "
        "The largest change from one more exact step is step 7's: replayed from step 8 on, the loss there is "
        "3.691; from step 7 on, 3.426. The shortest replay to close half the gap is the last 4 steps, and 3 of the "
        "11 longer ones do not: where the run stood at step 15 depended on many of the steps before it, each "
        "nudging the weights, not on one step's rounding.")


def test_replay_sentence_other_outcomes():
    # the forward pass's rounding at that step made most of it
    assert "most of the jump is that step's rounding of the forward pass" in R.replay_sentence(
        _replay(LESSON, exact_forward=3.30))
    # the last update made it
    last = R.replay_sentence(_replay([(1, 3.30), (2, 3.31), (15, 3.29)]))
    assert last.endswith("With only the last step's products exact, the loss there is 3.300: the last update, "
                         "made from block-scaled gradients, made most of the jump.")
    # the last step alone closes it, but longer replays land far off again: too sensitive to pin on one update
    touchy = R.replay_sentence(_replay([(1, 3.30), (2, 3.31), (5, 3.60), (11, 5.45), (15, 3.29)]))
    one_off = R.replay_sentence(_replay([(1, 3.30), (2, 3.31), (11, 5.45), (15, 3.29)]))
    assert "but 1 of the 3 longer replays does not close half the gap" in one_off
    assert touchy.endswith("With only the last step's products exact, the loss there is 3.300, but 2 of the 4 "
                           "longer replays do not close half the gap (the last 11 steps exact: 5.450, beyond the run "
                           "as it ran, 3.673: it widened the gap): the loss at "
                           "this step moves far with small changes to the weights, whatever the arithmetic, so one "
                           "replay cannot pin the jump on the last update.")
    # a replay that stays between the baseline and the run only failed to close it
    short = R.replay_sentence(_replay([(1, 3.30), (2, 3.31), (11, 3.60), (15, 3.29)]))
    assert "(the last 11 steps exact: 3.600): the loss" in short
    # nothing closes it, not even FP32: a drift between any two roundings
    none = R.replay_sentence(_replay([(1, 3.60), (2, 3.65), (15, 3.66)]))
    assert "No replay closed half the gap, not even an FP32 run from the same seed (3.660)" in none
    # monotone: every longer replay closes it too
    mono = R.replay_sentence(_replay([(1, 3.60), (2, 3.40), (3, 3.35), (15, 3.30)]))
    assert "the last 2 steps, and every longer one does too: the jump was built over those steps" in mono
    assert "largest change" not in R.replay_sentence(_replay([(1, 3.60), (2, 3.50), (3, 3.45), (15, 3.44)]))
    # a machine that did not repeat the run
    assert "against 3.900 in the run above: this machine did not repeat the run exactly" in R.replay_sentence(
        _replay(LESSON, recorded=3.9))
    # retrained below BF16: no jump
    assert R.replay_sentence(_replay(LESSON, as_run=3.2)).endswith("so there is no jump to place.")
    # a gap at step 0: only the forward pass
    step0 = R.GapReplay("mxfp8", 0, 0, 1.0, 5.0, 5.0, 5.0, ())
    assert R.replay_sentence(step0).endswith("At step 0 every run starts from the same weights, so the gap there "
                                             "is that forward pass's rounding alone (with exact products: 5.000).")


def test_plot_gap_replay_draws_the_replays_and_the_levels():
    fig = plots.plot_gap_replay(_replay(LESSON))
    ax = fig.axes[0]
    points = [line for line in ax.get_lines() if len(line.get_xdata()) == len(LESSON)]
    assert len(points) == 1 and list(points[0].get_ydata()) == [loss for _, loss in LESSON]
    levels = sorted(line.get_ydata()[0] for line in ax.get_lines() if line is not points[0])
    assert levels == pytest.approx([3.295, (3.673 + 3.295) / 2, 3.673])
    assert ax.get_xticklabels()[-1].get_text() == "15\n(all: an FP32 run)"
