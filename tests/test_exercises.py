import math

import pytest

from course_lib.exercises import check_format_property


def test_correct_answers_pass_including_rounded_decimals():
    assert check_format_property("FP8 E5M2", "max_finite", 57344).correct
    assert check_format_property("FP16", "min_subnormal", 6e-8).correct
    assert check_format_property("FP8 E4M3", "min_subnormal", 2**-9).correct


@pytest.mark.parametrize("fmt,prop,answer,hint", [
    ("FP8 E5M2", "max_finite", 114688, "holds only inf and NaN"),
    ("FP8 E4M3", "max_finite", 240, "only the all-ones code is NaN"),
    ("FP16", "min_subnormal", 2**-14, "smallest *normal*"),
    ("FP16", "min_normal", 2**-24, "smallest *subnormal*"),
    ("FP16", "epsilon", 2**-11, "half an epsilon"),
    ("FP16", "max_finite", 32768, "largest power of two"),
    ("FP16", "max_finite", 12345, "Write out the bits"),
    ("FP16", "max_finite", None, "Set your value"),
    ("FP16", "max_finite", "65504", "Give a number"),
])
def test_wrong_answers_are_explained(fmt, prop, answer, hint):
    fb = check_format_property(fmt, prop, answer)
    assert not fb.correct and hint in fb.message
    assert fb._repr_markdown_().startswith("**Not yet.**")
    assert "Not quite" not in fb.message and "No answer yet" not in fb.message   # "Not yet." says it once


def test_unknown_property():
    with pytest.raises(ValueError, match="prop must be one of"):
        check_format_property("FP16", "colour", 1)


def test_check_op_bound_explains_with_the_ridge():
    from course_lib.exercises import check_op_bound

    # H100-like ceilings: ridge = 989.5e3 / 3350 ~ 295 FLOP/B
    assert check_op_bound(1e12, 1e9, 989.5, 3350.0, "compute").correct          # 1000 FLOP/B
    wrong = check_op_bound(5e6, 4e6, 989.5, 3350.0, "compute")                  # 1.25 FLOP/B: softmax-like
    assert not wrong.correct and "memory-bound" in wrong.message and "ridge" in wrong.message
    assert not check_op_bound(1, 1, 1, 1, None).correct
    assert "not 'fast'" in check_op_bound(1, 1, 1, 1, "fast").message
    with pytest.raises(ValueError, match="bandwidth_gbs"):
        check_op_bound(1, 1, 1, 0, "memory")


def test_check_bytes_per_parameter_names_the_slip():
    from course_lib.exercises import check_bytes_per_parameter

    assert check_bytes_per_parameter("fp32", 16).correct
    assert "gradients" in check_bytes_per_parameter("fp32", 12).message
    autocast_slip = check_bytes_per_parameter("bf16_autocast", 4 + 2 + 4 + 8)
    assert not autocast_slip.correct and "no persistent 16-bit copy" in autocast_slip.message
    master = check_bytes_per_parameter("bf16_master", 12)
    assert not master.correct and "master weights" in master.message
    assert check_bytes_per_parameter("bf16_master", 20).correct
    with pytest.raises(ValueError, match="unknown recipe"):
        check_bytes_per_parameter("fp64", 8)
    # SGD with momentum: one moment in the optimizer's dtype (FP32 weights 4, gradients 4, momentum 4)
    assert check_bytes_per_parameter("bf16_autocast", 12, optimizer="sgd_momentum").correct
    two = check_bytes_per_parameter("bf16_autocast", 16, optimizer="sgd_momentum")
    assert not two.correct and "SGD with momentum keeps one" in two.message
    assert "left out the momentum" in check_bytes_per_parameter("fp32", 8, optimizer="sgd_momentum").message
    assert "no persistent 16-bit copy" in check_bytes_per_parameter("bf16_autocast", 14,
                                                                    optimizer="sgd_momentum").message
    assert check_bytes_per_parameter("bf16_master", 16, optimizer="sgd_momentum").correct   # 2 + 2 + 4 + 4 + 4
    with pytest.raises(ValueError, match="optimizer must be one of"):
        check_bytes_per_parameter("fp32", 16, optimizer="adam")


def test_check_delayed_scale():
    from course_lib.exercises import check_delayed_scale
    history = [2.0, 8.0, 4.0]
    assert check_delayed_scale(448 / 8, history).correct
    assert check_delayed_scale(448 / 8 / 4, history, margin=2).correct
    wrong = check_delayed_scale(448 / 4, history)
    assert not wrong.correct and "most recent" in wrong.message
    assert "inverse" in check_delayed_scale(8 / 448, history).message
    assert "margin" in check_delayed_scale(448 / 8, history, margin=1).message
    rolled = check_delayed_scale(448 / 8, history, amax_history_len=1)
    assert not rolled.correct and "rolled out" in rolled.message
    assert check_delayed_scale(448 / 4, history, amax_history_len=1).correct
    assert check_delayed_scale(448 / 4, history, amax_compute_algo="most_recent").correct
    # the lesson's history: the 9.0 has rolled out of a window of 4, so ignoring the window gives 448 / 9 / 2
    lesson = [9.0, 3.5, 7.0, 2.0, 1.0, 0.5]
    assert check_delayed_scale(448 / 7 / 2, lesson, margin=1, amax_history_len=4).correct
    ignored = check_delayed_scale(448 / 9 / 2, lesson, margin=1, amax_history_len=4)
    assert not ignored.correct and "rolled out" in ignored.message
    assert not check_delayed_scale(None, history).correct
    assert not check_delayed_scale("56", history).correct


def test_check_value_fate():
    from course_lib.exercises import check_value_fate
    assert check_value_fate(1e-7, "subnormal").correct
    assert "half the smallest subnormal" not in check_value_fate(1e-7, "subnormal").message
    wrong = check_value_fate(1e-7, "zero")
    assert not wrong.correct and "fewer significant bits" in wrong.message
    # a wrong guess gets a hint, never the stored value or the answer
    for guess in ("zero", "normal", "inf"):
        fb = check_value_fate(3e-8, guess)
        assert not fb.correct and "Hint:" in fb.message
        assert "5.96046e-08 as" not in fb.message and "stores" not in fb.message and "'subnormal'" not in fb.message
    assert check_value_fate(3e-8, "inf").message == (
        "FP16's smallest normal is 6.10352e-05, its smallest subnormal 5.96046e-08 and its largest value 65504. "
        "Where does 3e-08 fall? Hint: a value becomes inf only from half a spacing past the largest value on, "
        "65520.")
    assert check_value_fate(3e-8, " Subnormal\n").correct    # case and whitespace do not matter
    assert check_value_fate(3e-8, None).message == (
        "Set one of 'zero', 'subnormal', 'normal', 'inf' and run the cell again.")
    assert check_value_fate(1e-8, "zero").correct
    assert check_value_fate(65536.0, "inf").correct and check_value_fate(65504.0, "normal").correct
    assert check_value_fate(1000.0, "inf", "FP8 E4M3").correct   # saturation in a format with no inf
    assert not check_value_fate(1e-7, "tiny").correct
    with pytest.raises(ValueError):
        check_value_fate(float("nan"), "zero")


def test_check_scale_after_against_torch_grad_scaler():
    import torch

    from course_lib.exercises import check_scale_after
    # the real GradScaler, driven with planted inf gradients, gives the truth the checker uses
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3)
    overflow = {1, 5}
    for step in range(9):
        scaler.scale(p.sum())   # initialises the scale, as a loss would
        p.grad = torch.tensor([float("inf") if step in overflow else 1.0])
        scaler.step(opt)
        scaler.update()
    assert check_scale_after(scaler.get_scale(), 9, overflow, init_scale=8.0, growth_interval=3).correct
    wrong = check_scale_after(8.0 * 2**9, 9, overflow, init_scale=8.0, growth_interval=3)
    assert not wrong.correct and "does not grow every step" in wrong.message
    assert not check_scale_after(None, 3).correct
    with pytest.raises(ValueError):
        check_scale_after(1.0, -1)
    with pytest.raises(ValueError):
        check_scale_after(1.0, 3, growth_factor=1.0)


def test_check_scale_after_hints_every_wrong_answer_at_lesson_3_step():
    from course_lib.exercises import check_scale_after
    # lesson 3's exercise: growing every step would be 2**4004, far past float's range
    right = check_scale_after(131072.0, 4005, overflow_steps=(2,))
    assert right.correct   # halved at step 2, doubled after 2000 and again after 4000 clean steps
    for wrong in (65536, 32768, 262144, 1e300, float("inf"), 2**5000, 0.0, -1.0):
        feedback = check_scale_after(wrong, 4005, overflow_steps=(2,))
        assert not feedback.correct and feedback.message.count("Not quite") == 1
        assert "Rule:" in feedback.message and "131072" not in feedback.message   # a hint, not the answer
    assert "does not grow every step" in check_scale_after(1e300, 4005, overflow_steps=(2,)).message
    assert "runs of 2000 clean steps" in check_scale_after(32768, 4005, overflow_steps=(2,)).message
    assert "restarts at 0" in check_scale_after(262144, 4005, overflow_steps=(2,)).message


def test_check_autocast_policy():
    from course_lib.exercises import check_autocast_policy
    assert check_autocast_policy("matmul", "lower precision").correct
    assert check_autocast_policy("softmax", "fp32").correct
    assert check_autocast_policy("layer_norm", "fp32").correct
    mean = check_autocast_policy("mean", "fp32")
    assert not mean.correct and "none of CUDA autocast's lists" in mean.message
    assert check_autocast_policy("mean", "input dtype").correct
    assert not check_autocast_policy("matmul", "fp16").correct


def test_check_bf16_update():
    from course_lib.exercises import check_bf16_update
    assert check_bf16_update(1.0, 1e-3, False).correct          # spacing at 1 is 2**-7
    assert check_bf16_update(1.0, 1e-2, True).correct
    wrong = check_bf16_update(256.0, 0.5, True)
    assert not wrong.correct and "apart" in wrong.message
    assert not check_bf16_update(1.0, 1e-3, "no").correct


def test_check_mx_scale_explains_the_usual_slips():
    from course_lib.exercises import check_mx_scale

    # amax 7, E2M1: FLOOR 2**(2-2) = 1 (7 saturates to 6); RCEIL 2**ceil(log2(7/6)) = 2
    assert check_mx_scale(1, 7.0, element="e2m1", mode="floor").correct
    assert "saturates" in check_mx_scale(1, 7.0, mode="floor").message
    assert check_mx_scale(2, 7.0, element="e2m1", mode="rceil").correct
    wrong = check_mx_scale(2, 7.0, mode="floor")
    assert not wrong.correct and "RCEIL" in wrong.message
    assert "power of two" in check_mx_scale(7 / 6, 7.0, mode="rceil").message
    assert "inverse" in check_mx_scale(0.5, 7.0, mode="rceil").message
    assert not check_mx_scale(None, 7.0).correct and not check_mx_scale("1", 7.0).correct
    with pytest.raises(ValueError):
        check_mx_scale(1, 0.0)


def test_check_nvfp4_value_works_it_through():
    from course_lib.exercises import check_nvfp4_value

    # tensor scale 2688 / 2688 = 1; block scale E4M3(3 / 6) = 0.5; 1.3 / 0.5 = 2.6 -> 3; 3 * 0.5 = 1.5
    right = check_nvfp4_value(1.5, 1.3, block_amax=3.0, tensor_amax=2688.0)
    assert right.correct and "= 1.5" in right.message
    assert not check_nvfp4_value(1.3, 1.3, block_amax=3.0, tensor_amax=2688.0).correct
    assert not check_nvfp4_value(1.0, 1.3, block_amax=3.0, tensor_amax=2688.0).correct
    with pytest.raises(ValueError):
        check_nvfp4_value(1.0, 5.0, block_amax=3.0, tensor_amax=2688.0)


def test_check_first_nonfinite_names_the_maker_not_the_carriers():
    from course_lib.exercises import check_first_nonfinite

    trace = [("a", "forward", True, True), ("b", "forward", True, False), ("c", "forward", False, False),
             ("loss", "forward", False, False)]
    assert check_first_nonfinite("b", trace).correct
    assert "passed the non-finite value on" in check_first_nonfinite("c", trace).message
    assert "noticed" in check_first_nonfinite("loss", trace).message
    assert "finite" in check_first_nonfinite("a", trace).message
    assert not check_first_nonfinite(None, trace).correct and not check_first_nonfinite(3, trace).correct
    assert check_first_nonfinite("none", [("a", "forward", False, False)]).correct
    # whitespace around a name is not a mistake; a name the trace lacks is named as such
    assert check_first_nonfinite("  b\n", trace).correct
    stranger = check_first_nonfinite("blocks.9.fc", trace)
    assert not stranger.correct and "not a module in this trace" in stranger.message and "`b`" in stranger.message
    # a container fires after the modules inside it: finite in, non-finite out too, but later
    nested = trace[:2] + [("block", "forward", True, False)] + trace[2:]
    later = check_first_nonfinite("block", nested)
    assert not later.correct and "fired after `b`'s" in later.message
    with pytest.raises(ValueError):
        check_first_nonfinite("a", [])


def test_check_ring_all_reduce_explains_order_and_rounding():
    from course_lib.exercises import check_ring_all_reduce

    values = [1.0, 2**-8, 2**-8, 2**-8]
    # ring from rank 3: (2^-8 + 2^-8) + 2^-8 = 3 * 2^-8, then + 1 = 1.01171875, a BF16 tie -> 1.015625
    right = check_ring_all_reduce(1.015625, values)
    assert right.correct and "1.015625" in right.message
    assert right.message.startswith("The ring adds") and "even last bit" in right.message
    exact = check_ring_all_reduce(1.01171875, values)
    assert not exact.correct and "exact sum" in exact.message
    # 1.0078125 is both the tree order ((1 + 2^-8) rounds to 1; 1 + 2^-7) and the ring truncated: both named
    both = check_ring_all_reduce(1.0078125, values)
    assert not both.correct and "tree order" in both.message and "truncated" in both.message
    rank0 = check_ring_all_reduce(1.0, values)   # 1 + 2^-8 is a tie that rounds back to 1, three times
    assert not rank0.correct and "adding from rank 0" in rank0.message
    # where the two slips part, each is named alone: on [1, 2^-9, 2^-8, 2^-8, 2^-8] the ring truncated gives
    # 1.0078125 and the tree 1.0; on [1, 2^-8, 2^-8] the tree gives 1.0 and truncating changes nothing
    cut = check_ring_all_reduce(1.0078125, [1.0, 2**-9, 2**-8, 2**-8, 2**-8])
    assert "truncated" in cut.message and "tree order" not in cut.message
    tree_only = check_ring_all_reduce(1.0, [1.0, 2**-8, 2**-8])
    assert "tree order" in tree_only.message and "truncated" not in tree_only.message
    assert "one at a time" in check_ring_all_reduce(2.0, values).message
    # an answer typed to fewer decimals is right when it rounds to the value there (1.015625 -> 1.0156)...
    typed = check_ring_all_reduce(1.0156, values)
    assert typed.correct and "4 decimals" in typed.message
    assert check_ring_all_reduce(1.016, values).correct
    # ...unless, at those decimals, it could be a neighbouring BF16 number (their spacing near 1 is 2^-7)
    coarse = check_ring_all_reduce(1.02, values)
    assert not coarse.correct and "more decimals" in coarse.message
    assert not check_ring_all_reduce(1.0157, values).correct   # off in the 4th decimal
    assert "number" in check_ring_all_reduce("1", values).message
    assert "No answer" in check_ring_all_reduce(None, values).message
    assert check_ring_all_reduce(1.01171875, values, fmt="FP16").correct   # FP16 holds it exactly
    with pytest.raises(ValueError, match="fmt"):
        check_ring_all_reduce(1.0, values, fmt="FP8")
    with pytest.raises(ValueError, match="at least 2"):
        check_ring_all_reduce(1.0, [1.0])


# the scale at the start of each of 7 steps and after the last update, from a GradScaler with
# growth_interval=3 whose steps 1 and 5 met an inf gradient (lesson 9's exercise)
SKIP_SCALES = [1024.0, 1024.0, 512.0, 512.0, 512.0, 1024.0, 512.0, 512.0]


def test_the_skip_exercises_scales_are_what_a_real_gradscaler_reads():
    import torch

    w = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    readings = []
    for step in range(7):
        optimizer.zero_grad()
        scaler.scale((w * w).sum()).backward()
        if step in (1, 5):
            w.grad[0] = math.inf
        readings.append(scaler.get_scale())
        scaler.step(optimizer)
        scaler.update()
    assert readings + [scaler.get_scale()] == SKIP_SCALES


def test_check_skipped_steps_explains_rises_flat_steps_and_the_off_by_one():
    from course_lib.exercises import check_skipped_steps

    right = check_skipped_steps([1, 5], SKIP_SCALES)
    assert right.correct and "Skipped: 1, 5." in right.message and "after step 4 is growth" in right.message
    assert check_skipped_steps((5, 1), SKIP_SCALES).correct                    # any order, any iterable of ints
    late = check_skipped_steps([2, 6], SKIP_SCALES)
    assert not late.correct and "the step that was skipped is the one before" in late.message
    rose = check_skipped_steps([1, 4, 5], SKIP_SCALES)
    assert not rose.correct and "rose after step 4" in rose.message
    flat = check_skipped_steps([1, 3, 5], SKIP_SCALES)
    assert not flat.correct and "did not change after step 3" in flat.message
    missed = check_skipped_steps([1], SKIP_SCALES)
    assert not missed.correct and "missed 1 skipped step:" in missed.message
    assert "not one of them" in check_skipped_steps([1, 7], SKIP_SCALES).message
    assert "No answer yet" in check_skipped_steps(None, SKIP_SCALES).message
    assert "list of ints" in check_skipped_steps("1, 5", SKIP_SCALES).message
    assert "list of ints" in check_skipped_steps([1.0, 5.0], SKIP_SCALES).message
    none = check_skipped_steps([], [8.0, 8.0, 16.0])
    assert none.correct and "never fell" in none.message
    for bad in ([1.0], [1.0, 0.0], [1.0, math.inf], "12", [True, 1.0]):
        with pytest.raises(ValueError, match="scales"):
            check_skipped_steps([0], bad)
