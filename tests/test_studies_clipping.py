"""Lesson 3's clipping section: the clipping mechanisms against torch and against hand-computed values, the
runs and single-step measurements on small settings, and every phrase from results built by hand."""

import dataclasses
import inspect
import math

import pytest
import torch

from course_lib.device import SizeProfile
from course_lib.glue import Prose
from course_lib.models import regression_batch
from course_lib.scaling import clipping as CM
from course_lib.studies import clipping as C
from course_lib.studies import clipping_prose as CP
from course_lib.tables import MarkdownTable


def _param(weight, grad):
    p = torch.nn.Parameter(torch.tensor(weight, dtype=torch.float32))
    p.grad = torch.tensor(grad, dtype=torch.float32)
    return p


# ---- the mechanisms ---------------------------------------------------------------------------------------

def test_unitwise_norm_is_per_output_row_for_matrices_and_whole_for_vectors():
    x = torch.randn(5, 3, 2, generator=torch.Generator().manual_seed(0))
    expected = torch.linalg.vector_norm(x.reshape(5, -1), dim=1).reshape(5, 1, 1)
    torch.testing.assert_close(CM.unitwise_norm(x), expected)
    v = torch.tensor([3.0, 4.0])
    assert float(CM.unitwise_norm(v)) == 5.0
    with pytest.raises(TypeError, match="tensor"):
        CM.unitwise_norm([3.0, 4.0])


def test_agc_caps_each_unit_at_a_fraction_of_its_weight_norm():
    # row 0: weight norm 5, grad norm 1 > 0.1 * 5 -> scaled to 0.5; row 1: weight norm 10, grad norm 0.5 -> kept
    w = _param([[3.0, 4.0], [6.0, 8.0]], [[0.6, 0.8], [0.3, 0.4]])
    clipped = CM.adaptive_clip_grad_([w], clipping=0.1)
    assert clipped == 1
    torch.testing.assert_close(w.grad, torch.tensor([[0.3, 0.4], [0.3, 0.4]]))


def test_agc_floors_a_zero_weight_at_eps_and_treats_a_vector_as_one_unit():
    bias = _param([0.0, 0.0], [3.0, 4.0])   # norm 5 against 0.05 * max(0, 1e-3) = 5e-5
    assert CM.adaptive_clip_grad_([bias], clipping=0.05) == 1
    assert float(bias.grad.norm()) == pytest.approx(0.05 * CM.AGC_EPS, rel=1e-5)
    torch.testing.assert_close(bias.grad / bias.grad.norm(), torch.tensor([0.6, 0.8]))   # direction kept
    no_grad = torch.nn.Parameter(torch.ones(2))
    assert CM.adaptive_clip_grad_([no_grad]) == 0 and no_grad.grad is None
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="clipping"):
            CM.adaptive_clip_grad_([bias], clipping=bad)
    with pytest.raises(TypeError, match="eps"):
        CM.adaptive_clip_grad_([bias], eps="small")


def test_per_tensor_clipping_matches_torch_on_each_tensor_alone():
    gen = torch.Generator().manual_seed(1)
    params = [_param(torch.zeros(4).tolist(), (torch.randn(4, generator=gen) * s).tolist()) for s in (0.1, 10.0)]
    theirs = [_param(torch.zeros(4).tolist(), p.grad.tolist()) for p in params]
    for q in theirs:
        torch.nn.utils.clip_grad_norm_([q], 1.0)
    assert CM.clip_per_tensor_norm_(params, 1.0) == 1   # only the large one
    for p, q in zip(params, theirs):
        torch.testing.assert_close(p.grad, q.grad)
    assert float(params[1].grad.norm()) == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(ValueError, match="max_norm"):
        CM.clip_per_tensor_norm_(params, 0.0)


@pytest.mark.parametrize("rule, torch_edit", [
    (C.GLOBAL_NORM, lambda ps: torch.nn.utils.clip_grad_norm_(ps, 0.5)),
    (C.PER_VALUE, lambda ps: torch.nn.utils.clip_grad_value_(ps, 0.5)),
    (C.PER_TENSOR, lambda ps: [torch.nn.utils.clip_grad_norm_([p], 0.5) for p in ps]),
    (C.AGC, lambda ps: CM.adaptive_clip_grad_(ps, 0.5)),
    (C.NO_CLIPPING, lambda ps: None),
    (C.NO_SPIKES, lambda ps: None),
])
def test_each_rule_edits_like_torch(rule, torch_edit):
    def params():
        gen = torch.Generator().manual_seed(2)
        return [_param(torch.randn(3, 2, generator=gen).tolist(), (torch.randn(3, 2, generator=gen) * 2).tolist())
                for _ in range(2)]

    ours, theirs, untouched = params(), params(), params()
    C.make_clipper(rule, 0.5)(ours)
    torch_edit(theirs)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.grad, b.grad)
    changed = any(not torch.equal(a.grad, u.grad) for a, u in zip(ours, untouched))
    assert changed == (rule not in (C.NO_CLIPPING, C.NO_SPIKES))   # gradients of norm ~4 exceed every 0.5


def test_make_clipper_refuses_unknown_rules_and_bad_thresholds():
    with pytest.raises(ValueError, match="unknown rule"):
        C.make_clipper("per row", 1.0)
    with pytest.raises(ValueError, match="threshold"):
        C.make_clipper(C.GLOBAL_NORM, -1.0)
    with pytest.raises(TypeError, match="threshold"):
        C.make_clipper(C.GLOBAL_NORM, True)


def test_global_grad_norm_matches_torch_and_is_zero_without_gradients():
    ps = [_param([0.0, 0.0], [3.0, 0.0]), _param([0.0], [4.0]), torch.nn.Parameter(torch.zeros(2))]
    assert CM.global_grad_norm(ps) == pytest.approx(float(torch.nn.utils.get_total_norm([p.grad for p in ps[:2]])))
    assert CM.global_grad_norm([torch.nn.Parameter(torch.zeros(2))]) == 0.0


def test_scaled_step_edits_the_true_gradients_and_steps_on_them():
    model = torch.nn.Linear(3, 1)
    x, y = torch.ones(4, 3), torch.zeros(4, 1)
    reference = torch.nn.Linear(3, 1)
    reference.load_state_dict(model.state_dict())
    torch.nn.functional.mse_loss(reference(x), y).backward()
    true = [p.grad.clone() for p in reference.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    before = [p.detach().clone() for p in model.parameters()]
    seen = []
    CM.scaled_step(scaler, opt, torch.nn.functional.mse_loss(model(x), y),
                  lambda ps: (seen.extend(p.grad.clone() for p in ps), [p.grad.mul_(0.5) for p in ps]))
    for g, t, w0, p in zip(seen, true, before, model.parameters()):
        torch.testing.assert_close(g, t)                          # the edit saw unscaled gradients
        torch.testing.assert_close(w0 - p.detach(), 0.1 * 0.5 * t)  # and the step used the edited ones
    # an inf loss: the step is skipped and the scale backs off
    w1 = [p.detach().clone() for p in model.parameters()]
    CM.scaled_step(scaler, opt, torch.nn.functional.mse_loss(model(x), y) * math.inf, lambda ps: None)
    assert all(torch.equal(a, p.detach()) for a, p in zip(w1, model.parameters()))
    assert scaler.get_scale() == 512.0


# ---- the runs ---------------------------------------------------------------------------------------------

def test_spiky_batch_multiplies_the_targets_only_at_the_spike_steps():
    x, y = regression_batch(8, 4, 3, seed=1)
    sx, sy = C.spiky_batch(8, 4, 3, 1, (3, 7), 300.0)
    assert torch.equal(sx, x) and torch.equal(sy, y * 300.0)
    ox, oy = C.spiky_batch(8, 4, 4, 1, (3, 7), 300.0)
    assert torch.equal(oy, regression_batch(8, 4, 4, seed=1)[1])


def test_one_cpu_thread_restores_the_thread_count_even_after_an_error():
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError):
        with C.one_cpu_thread(torch.device("cpu")):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with C.one_cpu_thread(torch.device("meta")):
        assert torch.get_num_threads() == before


def test_a_spiky_run_clips_the_spikes_that_pass_and_the_scaler_skips_those_that_overflow():
    kw = dict(steps=40, spike_steps=(4, 8, 12, 16, 20, 24), spike_factor=300.0, threshold=1.0)
    clipped = C.train_spiky_run(C.GLOBAL_NORM, 0, **kw)
    free = C.train_spiky_run(C.NO_CLIPPING, 0, **kw)
    clean = C.train_spiky_run(C.NO_SPIKES, 0, **kw)
    # the first spikes overflow FP16 at GradScaler's initial scale: skipped, and the scale halves each time
    for run in (clipped, free):
        assert run["skipped"][4] and not math.isfinite(run["grad_norms"][4])
        assert run["scales"][5] == run["scales"][4] / 2 == 32768.0
    passed = [s for s in kw["spike_steps"] if not clipped["skipped"][s]]
    assert passed and not free["skipped"][passed[0]]   # the first spike that fits reaches the optimizer
    # clipped: every stepped gradient within max_norm, the passing spikes far above it before the clip
    assert all(clipped["step_norms"][s] <= 1.0 + 1e-5 for s in range(40) if not clipped["skipped"][s])
    assert min(clipped["grad_norms"][s] for s in passed) > 10.0
    stepped = [s for s in range(40) if not free["skipped"][s]]
    assert [free["grad_norms"][s] for s in stepped] == [free["step_norms"][s] for s in stepped]
    assert free["grad_norms"][passed[0]] > 10.0
    # the reference sees no outlier batch and never overflows; all three share weights and batches until step 4
    assert not any(clean["skipped"]) and max(clean["grad_norms"]) < 10.0
    assert clean["losses"][:4] == free["losses"][:4] == clipped["losses"][:4]
    assert clipped["final"] < free["final"]


def test_spiky_clipping_runs_sizes_from_the_profile_and_restores_threads():
    before = torch.get_num_threads()
    runs = C.spiky_clipping_runs(SizeProfile("small"), rules=(C.NO_CLIPPING, C.GLOBAL_NORM), seeds=(0,))
    assert torch.get_num_threads() == before
    assert runs.steps == 200 and runs.spike_steps == (30, 60, 90, 120, 150, 180) and runs.width == 32
    assert runs.thresholds == {C.GLOBAL_NORM: 1.0}
    assert set(runs.finals) == {C.NO_CLIPPING, C.GLOBAL_NORM} and len(runs.finals[C.GLOBAL_NORM]) == 1


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(rules=("per row",)), ValueError, "rules"),
    (dict(rules=()), ValueError, "rules"),
    (dict(seeds=()), ValueError, "seeds"),
    (dict(seeds=(True,)), ValueError, "seeds"),
    (dict(spike_factor=0.0), ValueError, "spike_factor"),
    (dict(spike_factor="big"), TypeError, "spike_factor"),
])
def test_spiky_clipping_runs_refuses_bad_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        C.spiky_clipping_runs(SizeProfile("small"), **kwargs)


# ---- single steps -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [2.0**16, 2.0**10])
def test_edits_after_unscale_do_what_they_should_and_before_it_are_divided_by_the_scale(scale):
    order = C.measure_edit_order(scale=scale)
    assert order.after == pytest.approx({name: 1.0 for name in C.EDITS}, rel=1e-5)
    n = order.true_norm
    expected_clip = min(1.0, 1.0 / (scale * n)) / min(1.0, 1.0 / n)
    assert order.before["clip_grad_norm_"] == pytest.approx(expected_clip, rel=1e-3)
    assert order.before["L2 penalty"] == pytest.approx(1 / scale, rel=1e-2)
    assert order.before["mask the first layer"] == pytest.approx(1.0, rel=1e-6)
    assert order.effective_threshold == 1.0 / scale
    assert order.step_over_grad == pytest.approx(1.0, rel=1e-5)
    assert order.grads_kept_by_step
    assert "already been called" in order.second_unscale_error
    assert 0.5 < order.adam_clip_before <= 1.0   # Adam divides the clip's factor out, all but epsilon
    with pytest.raises(ValueError, match="scale"):
        C.measure_edit_order(scale=-1.0)


def test_an_overflowed_step_is_clipped_to_nan_yet_skipped():
    step = C.measure_overflow_step()
    assert not math.isfinite(step.returned_norm)
    default = inspect.signature(torch.nn.utils.clip_grad_norm_).parameters["error_if_nonfinite"].default
    assert step.error_if_nonfinite_default is default is False
    assert not step.stepped and step.weights_unchanged
    assert step.scale_after == step.scale_before / 2
    assert "non-finite" in step.strict_error
    with pytest.raises(ValueError, match="stayed finite"):
        C.measure_overflow_step(scale=1.0, spike_factor=1.0)


# ---- phrases from hand-built results ------------------------------------------------------------------------

def _runs(finals, *, skipped=None, scales=None, grad_norms=None, losses=None, step_norms=None):
    """Two seeds, 8 steps, spikes at steps 2 and 5; ``finals`` per rule; the rest per rule, or defaults:
    nothing skipped, scale 8, gradient norm 1 (10 at the spikes), loss 1 (2 on step 6), unchanged norms."""
    rules = tuple(finals)

    def per(value, default):
        return {r: tuple(tuple(row) for row in (value or {}).get(r, default(r))) for r in rules}

    gn = per(grad_norms, lambda r: [[10.0 if s in (2, 5) else 1.0 for s in range(8)]] * 2)
    return C.SpikyRuns(rules, (0, 1), (2, 5), 300.0, {r: t for r, t in C.DEFAULT_THRESHOLDS.items() if r in rules},
                       per(losses, lambda r: [[2.0 if s == 6 else 1.0 for s in range(8)]] * 2),
                       per(skipped, lambda r: [[False] * 8] * 2), per(scales, lambda r: [[8.0] * 8] * 2), gn,
                       per(step_norms, lambda r: gn[r]), {r: tuple(v) for r, v in finals.items()}, 32, 4, 0.05)


BASE = {C.NO_SPIKES: (1.0, 1.2), C.NO_CLIPPING: (3.0, 4.0), C.GLOBAL_NORM: (1.1, 1.3)}


def test_compare_ranges():
    assert CP.compare_ranges([3.0, 4.0], [1.0, 2.0]) == "above"
    assert CP.compare_ranges([0.1, 0.2], [1.0, 2.0]) == "below"
    assert CP.compare_ranges([1.5, 3.0], [1.0, 2.0]) == "within"
    assert CP.compare_ranges([math.nan, 5.0], [1.0, 2.0]) == "above"
    with pytest.raises(ValueError, match="at least one"):
        CP.compare_ranges([], [1.0])


def test_range_relation_tells_inside_from_overlapping():
    assert CP.range_relation([1.1, 1.2], [1.0, 1.2]) == "inside"     # the ends count as inside
    assert CP.range_relation([1.1, 1.3], [1.0, 1.2]) == "overlapping"
    assert CP.range_relation([0.9, 1.1], [1.0, 1.2]) == "overlapping"
    assert CP.range_relation([1.3, 1.4], [1.0, 1.2]) == "above"
    assert CP.range_relation([0.1, 0.2], [1.0, 1.2]) == "below"
    with pytest.raises(ValueError, match="at least one"):
        CP.range_relation([1.0], [])


def test_passed_spikes_and_changed_share():
    skipped = {C.GLOBAL_NORM: [[False, False, True, False, False, False, False, True]] * 2}
    step_norms = {C.GLOBAL_NORM: [[1.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0]] * 2}
    runs = _runs(BASE, skipped=skipped, step_norms=step_norms)
    assert runs.passed_spikes(C.GLOBAL_NORM, 0) == (5,)
    # ordinary stepped steps: 0, 1, 3, 4, 6 per seed; the norm changed on step 1 only
    assert runs.changed_share(C.GLOBAL_NORM) == pytest.approx(1 / 5)
    assert runs.steps == 8


def test_scaler_phrase_branches():
    every = {C.NO_CLIPPING: [[False, False, True, False, False, True, False, False]] * 2}
    assert "skipped every spike" in CP.scaler_phrase(_runs(BASE, skipped=every))
    by_seed = {C.NO_CLIPPING: [[False] * 8, [False, False, True, False, False, False, False, False]]}
    assert "depended on the seed (steps 2, 5)" in CP.scaler_phrase(_runs(BASE, skipped=by_seed))
    first_skipped = {C.NO_CLIPPING: [[False, False, True, False, False, False, False, False]] * 2}
    scales = {C.NO_CLIPPING: [[8.0, 8.0, 8.0, 4.0, 4.0, 4.0, 4.0, 4.0]] * 2}
    text = CP.scaler_phrase(_runs(BASE, skipped=first_skipped, scales=scales))
    assert isinstance(text, Prose)
    assert text == ("In every seed the scaler skipped the first spike: it overflowed FP16 at the scale of the "
                    "time (2\u00b3), and the back-off halved the scale. The spike at step 5 fit under 2\u00b2 and reached "
                    "the optimizer.")
    two = {C.NO_CLIPPING: [[False, False, True, False, False, True, False, False]] * 2}
    runs = dataclasses.replace(_runs(BASE, skipped=two, scales={C.NO_CLIPPING: [[8.0] * 3 + [4.0] * 5] * 2}),
                               spike_steps=(2, 5, 7))
    assert CP.scaler_phrase(runs).startswith("In every seed the scaler skipped the first 2 spikes: each overflowed "
                                            "FP16 at the scale of the time (from 2\u00b3 down to 2\u00b2)")
    assert CP.scaler_phrase(_runs(BASE)) == "The spike at step 2 fit under 2\u00b3 and reached the optimizer."


def test_spike_facts_compute_the_jump_and_the_verdicts():
    facts = CP.spike_facts(_runs(BASE))
    # the spike at step 2 passed in both seeds: norm 10 against an ordinary median of 1; the loss before it
    # is 1 and the highest in the ten steps after is 2 (step 6; step 5 is a spike and left out)
    assert facts["clip_pass_step"] == 2 and facts["clip_spike_norm_ratio"] == 10.0
    assert facts["clip_loss_before"] == 1.0 and facts["clip_loss_peak"] == 2.0
    assert isinstance(facts["clip_jump"], Prose) and ("a gradient 10 times the median ordinary step's; the loss "
                                                      "went from 1.00 on the step before to a peak of 2 in the ten steps after (means over 2 seeds).") in facts["clip_jump"]
    assert (facts["clip_full_steps"], facts["clip_full_width"], facts["clip_full_seeds"]) == (300, 128, 5)
    assert (facts["clip_none_lo"], facts["clip_none_hi"], facts["clip_none_mean"]) == (3.0, 4.0, 3.5)
    # seed by seed, not a ratio of means: 3.0 / 1.1 and 4.0 / 1.3
    assert facts["clip_seed_ratio_lo"] == pytest.approx(3.0 / 1.1)
    assert facts["clip_seed_ratio_hi"] == pytest.approx(4.0 / 1.3)
    assert "was 2.7 to 3.1 times the same seed's with global-norm clipping." in facts["clip_seed_ratios"]
    assert "beyond seed noise" in facts["clip_verdict"]
    # (1.1, 1.3) overlaps the no-spike range (1.0, 1.2) without lying inside it: "within" would overstate it
    assert facts["clip_vs_ref"].startswith("overlapping the seed-to-seed range") and "seed noise" in facts["clip_vs_ref"]
    # the reference's range stands beside the words that name it, in four decimals
    assert "of the runs that saw no spikes at all (1.0000 to 1.2000), a difference" in facts["clip_vs_ref"]
    assert facts["clip_max_norm"] == 1.0 and facts["clip_steps"] == 8 and facts["clip_spikes"] == 2


def test_seed_ratio_facts_pair_seeds_and_say_when_they_disagree():
    # one seed's large loss would carry a ratio of means (8 / 1 over 1 / 1 gives 4.5 as a mean ratio)
    facts = CP.seed_ratio_facts([8.0, 1.2], [1.0, 1.0])
    assert (facts["clip_seed_ratio_lo"], facts["clip_seed_ratio_hi"]) == pytest.approx((1.2, 8.0))
    assert "was 1.2 to 8 times" in facts["clip_seed_ratios"]
    assert "some seeds and below" in CP.seed_ratio_facts([0.5, 2.0], [1.0, 1.0])["clip_seed_ratios"]
    diverged = CP.seed_ratio_facts([math.inf, 2.0], [1.0, 1.0])
    assert diverged["clip_seed_ratio_hi"] == 2.0 and "1 of 2 seeds without clipping diverged" in diverged["clip_seed_ratios"]
    with pytest.raises(ValueError, match="one final loss per seed"):
        CP.seed_ratio_facts([1.0], [1.0, 2.0])


@pytest.mark.parametrize("none, glob, verdict, vs_ref", [
    ((1.2, 1.5), (1.1, 1.3), "within seed noise", "overlapping"),
    ((0.5, 0.6), (1.1, 1.3), "clipping cost more", "overlapping"),
    ((3.0, 4.0), (1.05, 1.15), "beyond seed noise", "within the seed-to-seed range"),
    ((3.0, 4.0), (1.5, 1.6), "beyond seed noise", "above every seed"),
    ((3.0, 4.0), (0.5, 0.6), "beyond seed noise", "below every seed"),
])
def test_spike_facts_verdict_branches(none, glob, verdict, vs_ref):
    facts = CP.spike_facts(_runs({**BASE, C.NO_CLIPPING: none, C.GLOBAL_NORM: glob}))
    assert verdict in facts["clip_verdict"] and facts["clip_vs_ref"].startswith(vs_ref)


def test_separated_ranges_judge_the_gap_against_the_seeds_spread():
    # the nearest two 1.9 apart against spreads of 1.0 and 0.2: beyond seed noise
    assert CP.separated_ranges([3.0, 4.0], [0.9, 1.1]) == (
        "every seed without clipping ended above every seed with it, the nearest two 1.9 apart, more than either "
        "rule's seeds lie apart among themselves (1 at most): a difference beyond seed noise at this size")
    # separated, but by less than the seeds spread: three seeds a side do that by chance one time in ten
    close = CP.separated_ranges([3.0, 3.5, 4.0], [2.1, 2.5, 2.9])
    assert "only 0.1 apart, within the 1 either rule's seeds span" in close
    assert "one time in 10, so this is a hint, not yet a difference" in close
    with pytest.raises(ValueError, match="at least one final loss on each side"):
        CP.separated_ranges([], [1.0])
    with pytest.raises(ValueError, match="not separated"):
        CP.separated_ranges([1.0, 2.0], [1.5])


def test_spike_facts_without_a_passing_spike_and_without_the_needed_rules():
    every = {C.NO_CLIPPING: [[False, False, True, False, False, True, False, False]] * 2}
    facts = CP.spike_facts(_runs(BASE, skipped=every))
    assert "clip_pass_step" not in facts and "clip_none_lo" in facts and facts["clip_jump"] == ""
    with pytest.raises(ValueError, match="lack global norm"):
        CP.spike_facts(_runs({C.NO_SPIKES: (1.0, 1.0), C.NO_CLIPPING: (2.0, 2.0)}))


def test_rule_table_and_rule_facts():
    finals = {**BASE, C.PER_VALUE: (2.0, 2.5), C.PER_TENSOR: (1.15, 1.25), C.AGC: (0.2, 0.3)}
    step_norms = {C.PER_VALUE: [[1.0, 1.0, 6.0, 1.0, 1.0, 7.0, 1.0, 1.0]] * 2,
                  C.AGC: [[0.5] * 8] * 2}
    runs = _runs(finals, step_norms=step_norms)
    table = CP.rule_table(runs)
    assert isinstance(table, MarkdownTable)
    row = next(line for line in table.splitlines() if line.startswith("| per value"))
    assert "0.1 (each entry)" in row and "4 of 4" in row and "| 7 |" in row and "| 2.0000 to 2.5000 |" in row
    assert table.splitlines()[0] == ("| rule | bound | spikes stepped on | median norm there | ordinary steps changed "
                                     "| final loss (seeds) |")
    agc = next(line for line in table.splitlines() if line.startswith("| adaptive"))
    assert "| 100% |" in agc
    facts = CP.rule_facts(runs)
    # global norm (1.1 to 1.3) and per-tensor (1.15 to 1.25) reach above the reference's 1.2: overlapping, not inside
    # four decimals: a range that pokes 0.0001 past the reference's shows it
    assert facts["clip_rules_verdict"] == (
        "The runs that saw no spikes ended with held-out losses of 1.0000 to 1.2000 over the seeds. Global-norm "
        "clipping (1.1000 to 1.3000, its highest seed 0.1 above) and per-tensor-norm clipping (1.1500 to 1.2500, its "
        "highest seed 0.05 above) overlapped that range and reached past it, a difference within seed noise; "
        "per-value clipping (2.0000 to 2.5000) ended above that range; AGC (0.2000 to 0.3000) ended below that range.")
    wider = CP.rule_facts(_runs({**BASE, C.GLOBAL_NORM: (0.9, 1.3)}))["clip_rules_verdict"]
    assert ("Global-norm clipping (0.9000 to 1.3000, its highest seed 0.1 above and its lowest seed 0.1 below) "
            "overlapped") in wider
    inside = CP.rule_facts(_runs({**BASE, C.GLOBAL_NORM: (1.0, 1.2)}))["clip_rules_verdict"]
    assert inside == ("The runs that saw no spikes ended with held-out losses of 1.0000 to 1.2000 over the seeds. "
                      "Global-norm clipping (1.0000 to 1.2000) ended inside that range.")
    just = CP.rule_facts(_runs({**BASE, C.GLOBAL_NORM: (1.0, 1.20011)}))["clip_rules_verdict"]
    assert "(1.0000 to 1.2001, its highest seed 0.00011 above)" in just
    # ranked among the rules that did not end above the reference: AGC below both of the others
    assert facts["clip_rules_ranking"] == ("AGC ended below global-norm clipping and AGC ended below "
                                           "per-tensor-norm clipping in every seed; any other pair's ranges overlap.")
    assert facts["clip_value_spike_norm"] == 7.0 and facts["clip_agc_changed"] == 100.0
    assert facts["clip_agc_floor"] == pytest.approx(0.05 * CM.AGC_EPS)
    assert (facts["clip_agc_eps"], facts["clip_agc_lambda"]) == (CM.AGC_EPS, 0.05)
    with pytest.raises(ValueError, match="no clipping rule"):
        CP.rule_facts(_runs({C.NO_SPIKES: (1.0, 1.0), C.NO_CLIPPING: (2.0, 2.0)}))


def test_ranking_phrase_branches():
    assert CP.ranking_phrase({"a": (1.0, 2.0)}) == ""
    assert CP.ranking_phrase({"a": (1.0, 2.0), "b": (3.0, 4.0), "c": (1.5, 3.5)}) == (
        "A ended below b in every seed; any other pair's ranges overlap.")
    assert "do not rank a and b" in CP.ranking_phrase({"a": (1.0, 2.0), "b": (1.5, 2.5)})


def _order(**changes):
    base = C.EditOrder(65536.0, 1.0, 0.01, 0.4, {n: 1.0 for n in C.EDITS},
                       {"clip_grad_norm_": 3.8e-5, "L2 penalty": 1.5e-5, "mask the first layer": 1.0},
                       1.0, True, "unscale_() has already been called on this optimizer since the last update().",
                       0.9)
    return dataclasses.replace(base, **changes)


def _overflow(**changes):
    base = C.OverflowStep(math.nan, False, 1.0, False, True, 65536.0, 32768.0,
                          "The total norm is non-finite, so it cannot be clipped. To disable this error, set it")
    return dataclasses.replace(base, **changes)


def test_edit_table_and_order_facts():
    table = CP.edit_table(_order())
    assert "| L2 penalty | 1 | 1.5e-05 |" in table
    facts = CP.order_facts(_order(), _overflow())
    assert facts["ord_scale_log2"] == 16 and facts["ord_threshold"] == 2.0**-16
    assert facts["ovf_norm"] == "`nan`" and facts["ovf_default"] == "`False`" and facts["ovf_nan_pct"] == 100.0
    assert facts["ovf_outcome"] == "skipped the step and the weights stayed bit-identical"
    assert facts["ovf_scale_after_log2"] == 15
    # no full stop inside the code: the lesson's sentence goes on after it
    assert facts["ovf_strict"] == "`` RuntimeError: The total norm is non-finite, so it cannot be clipped ``"
    assert facts["ord_second_unscale"].startswith("`RuntimeError: unscale_() has already")
    assert facts["ord_kept"].startswith("left the gradients exactly")
    assert facts["ex_adam_clip_before"] == 0.9


def test_order_facts_other_branches():
    facts = CP.order_facts(_order(grads_kept_by_step=False, second_unscale_error="(no error)"),
                          _overflow(returned_norm=math.inf, strict_error="(no error)", stepped=True,
                                    weights_unchanged=False))
    assert facts["ovf_norm"] == "`inf`" and facts["ovf_strict"] == "no error"
    assert facts["ord_second_unscale"] == "no error" and facts["ord_kept"] == "changed the gradients again"
    assert facts["ovf_outcome"] == "stepped, and the weights changed"
    odd = CP.order_facts(_order(), _overflow(weights_unchanged=False))
    assert odd["ovf_outcome"] == "skipped the step, yet the weights changed"


def test_the_registry_sizes_the_runs_and_a_step_cap_keeps_a_spike():
    from course_lib.device import SizeProfile
    from course_lib.experiments import get_experiment

    small = get_experiment("clipping_runs").parameters_for(SizeProfile("small"), "cpu")
    assert (small["steps"], small["every"], small["width"], small["seeds"]) == C.SIZES["small"][:3] + (C.SIZES["small"][3],)
    capped = C.clipping_sizes(SizeProfile("small", max_steps=5))
    assert capped["steps"] == 5 and capped["every"] == 2       # one outlier batch, at step 2
    with pytest.raises(ValueError, match="every must be a positive int"):
        C.spiky_clipping_runs(SizeProfile("small"), rules=(C.NO_CLIPPING,), every=0)
