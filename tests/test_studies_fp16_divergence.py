"""Lesson 5's located FP16 failure: the study trains into a real overflow and names it, its probe measures
what it says, and the prose says what the result holds."""

import dataclasses
import math

import pytest
import torch

from course_lib import plots
from course_lib.device import SizeProfile
from course_lib.models import course_setup
from course_lib.monitor import NonFiniteReport, TensorSummary
from course_lib.studies import bf16_prose as P
from course_lib.studies.fp16_divergence import (
    FP16_MAX,
    REPLAYS,
    DivergenceRun,
    Fp16Divergence,
    _QKProbe,
    fp16_divergence,
)

SMALL = SizeProfile("small")


@pytest.fixture(scope="module")
def diverged():
    """One seed, written out and fused, at the lesson's small-profile rate and batch: the written-out run
    fails. On one thread, as under make unit's xdist workers: at this rate the run is chaotic, and a product
    summed in another order (two threads) takes it elsewhere (the fused run's largest q.k then stayed inside
    FP16's range)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fp16_divergence(SMALL, "cpu", lr=0.1, steps=200, seeds=(0,), probe_every=10, batch_size=4)
    finally:
        torch.set_num_threads(threads)


def test_the_written_out_run_fails_where_its_product_crosses_fp16s_range_and_the_fused_run_does_not(diverged):
    explicit, fused = diverged.runs
    assert diverged.probe_every == 10 and diverged.batch_size == 4
    assert (explicit.attention, fused.attention) == ("explicit", "sdpa")
    step = explicit.first_nonfinite
    assert step is not None and not math.isfinite(explicit.losses[-1]) and len(explicit.losses) == step + 1
    assert all(math.isfinite(v) for v in explicit.losses[:-1])
    assert explicit.probe_steps[-1] == step                       # the failing step is always probed
    assert all(s % 10 == 0 for s in explicit.probe_steps[:-1])
    peaks = [max(v for v in vs if math.isfinite(v)) for vs in zip(*explicit.qk_max.values())]
    assert peaks[-1] > FP16_MAX and all(p <= FP16_MAX for p in peaks[:-1])
    # the fused run trains on, its product past FP16's range
    assert fused.first_nonfinite is None and len(fused.losses) == diverged.steps
    assert max(max(vs) for vs in fused.qk_max.values()) > FP16_MAX


def test_the_failing_step_is_located_in_attentions_product_and_only_fp16_written_out_fails(diverged):
    r = diverged.located
    assert (diverged.located_seed, diverged.located_step) == (0, diverged.runs[0].first_nonfinite)
    assert r.op == "matmul" and r.module.endswith(".attn") and r.phase == "forward"
    assert r.inputs[0].shape[0] == diverged.batch_size                 # the study trained on the batch it names
    assert all(s.dtype == "float16" and s.inf == s.nan == 0 for s in r.inputs) and r.outputs[0].inf > 0
    assert list(diverged.replays) == [label for label, _, _ in REPLAYS]
    losses = list(diverged.replays.values())
    assert not math.isfinite(losses[0])
    fp32 = losses[-1]
    for label, loss in list(diverged.replays.items())[1:]:
        assert loss == pytest.approx(fp32, abs=0.02), label    # the same weights: the same loss, not NaN


def test_the_probe_is_the_largest_causal_product_before_the_scale():
    setup = course_setup(SMALL, "cpu", steps=1, default_steps=(1, 1), seed=0)
    model = setup.model(0)
    x, _ = setup.sampler.batch(0, "cpu")
    probe = _QKProbe(model)
    captured = {}
    attn = model.blocks[1].attn
    handle = attn.qkv.register_forward_hook(lambda m, i, o: captured.setdefault("qkv", o.detach()))
    probe.armed = True
    with torch.autocast("cpu", dtype=torch.float16):
        model(x)
    values = probe.read()
    probe.close()
    handle.remove()
    assert probe.names == ["blocks.0.attn", "blocks.1.attn"] and len(values) == 2
    c = model.blocks[1].attn.qkv.in_features
    q, k, _ = captured["qkv"].float().split(c, dim=2)
    b, t, _ = q.shape
    h = attn.n_heads
    q, k = (z.view(b, t, h, c // h).transpose(1, 2) for z in (q, k))
    scores = (q.double() @ k.double().transpose(-2, -1)).abs()
    causal = torch.tril(torch.ones(t, t, dtype=torch.bool))
    assert values[1] == pytest.approx(float(scores[..., causal].max()), rel=1e-6)
    assert not any(m._forward_hooks for m in model.modules())


@pytest.mark.parametrize("bad,match", [({"lr": 0.0}, "lr must be"), ({"lr": math.nan}, "lr must be"),
                                       ({"steps": 0}, "steps must be"), ({"seeds": ()}, "seeds must be"),
                                       ({"seeds": (0.5,)}, "seeds must be"), ({"probe_every": 0}, "probe_every"),
                                       ({"attentions": ("flash",)}, "attentions must"),
                                       ({"attentions": ()}, "attentions must"),
                                       ({"batch_size": 0}, "batch_size must"), ({"batch_size": 2.0}, "batch_size"),
                                       ({"batch_size": True}, "batch_size must")])
def test_bad_arguments_are_refused_by_name(bad, match):
    with pytest.raises(ValueError, match=match):
        fp16_divergence(SMALL, "cpu", **{"steps": 2, **bad})


def test_a_runs_peaks_are_the_largest_finite_product_over_layers_per_probe():
    run = DivergenceRun(0, "explicit", (1.0, math.nan), 1, (0, 1),
                        {"a": (3.0, 7.0e4), "b": (5.0, math.nan), "c": (math.nan, math.inf)})
    assert run.peaks() == [5.0, 7.0e4]
    both_gone = DivergenceRun(0, "explicit", (math.nan,), 0, (0,), {"a": (math.nan,), "b": (math.inf,)})
    assert math.isnan(both_gone.peaks()[0])


# ---- the prose, on results built by hand -------------------------------------------------------------

def _summary(max_abs, inf=0):
    return TensorSummary((2, 3), "float16", max_abs, 0, inf)


def _div(*, failed=True, located=True, fused_peak=1.5e5):
    explicit = DivergenceRun(0, "explicit", (3.0, 2.9, math.nan) if failed else (3.0, 2.9, 2.8),
                             2 if failed else None, (0, 2), {"blocks.0.attn": (10.0, 7.0e4 if failed else 900.0),
                                                            "blocks.1.attn": (5.0, math.nan if failed else 8.0)})
    fused = DivergenceRun(0, "sdpa", (3.0, 2.9, 2.8), None, (0, 2), {"blocks.0.attn": (10.0, fused_peak),
                                                                      "blocks.1.attn": (5.0, 6.0)})
    report = NonFiniteReport("blocks.0.attn", "forward", (_summary(90.0), _summary(81.8)), (_summary(1.0, 6),),
                             op="matmul") if failed and located else None
    replays = {label: (math.nan if i == 0 else 3.1) for i, (label, _, _) in enumerate(REPLAYS)} if failed else {}
    return Fp16Divergence(0.05, 3, 2, (explicit, fused), 0 if failed else None, 2 if failed else None, report,
                          replays)


def test_outcomes_and_location_are_said_from_the_result():
    div = _div()
    assert P.divergence_outcomes(div) == (
        "Over 3 steps at learning rate 0.05, the loss turned non-finite with attention written out "
        "(`q @ k.transpose(-2, -1)`, then the scale), in 1 of 1 seeds (at step 2); with fused attention (SDPA), in 0 of 1 seeds.")
    assert P.located_sentence(div) == (
        "Re-run from the weights that failed (seed 0, step 2), the locator names `matmul` in `blocks.0.attn`. "
        "Its inputs were finite (float16 [2, 3] with largest magnitude 90 and float16 [2, 3] with largest "
        "magnitude 81.8); its output held 6 infinities.")
    # an attention product's inputs: their dimensions said, q and k^T named where the shapes are (T, d) by (d, T)
    q, k = TensorSummary((16, 2, 64, 32), "float16", 90.0, 0, 0), TensorSummary((16, 2, 32, 64), "float16", 81.8, 0, 0)
    qk = dataclasses.replace(div, located=dataclasses.replace(div.located, inputs=(q, k)))
    assert ("(float16 [16, 2, 64, 32] with largest magnitude 90 and float16 [16, 2, 32, 64] with largest magnitude "
            "81.8): batch and attention heads first, then `q` (64 positions by a head dimension of 32) and "
            "`kᵀ` (32 by 64); its output") in P.located_sentence(qk)
    v = TensorSummary((16, 2, 64, 32), "float16", 3.0, 0, 0)
    att_v = dataclasses.replace(div, located=dataclasses.replace(div.located, inputs=(
        TensorSummary((16, 2, 64, 64), "float16", 1.0, 0, 0), v)))
    assert "3): batch and attention heads first, then the two matrices multiplied; its output" in P.located_sentence(att_v)
    assert P.located_sentence(_div(located=False)).startswith(
        "Re-run from the same weights, step 2 of seed 0 stayed finite under the locator")
    assert P.located_sentence(_div(failed=False)) == (
        "No run failed, so there is no step to locate; the largest |q · k| any run reached was 150,000, against "
        "FP16's largest value 65,504.")


def test_glued_prose_carries_no_tex_math():
    # glued Markdown lands where MathJax does not typeset it: a $...$ would show as raw LaTeX on the page
    div = _div()
    q, k = TensorSummary((16, 2, 64, 32), "float16", 90.0, 0, 0), TensorSummary((16, 2, 32, 64), "float16", 81.8, 0, 0)
    qk = dataclasses.replace(div, located=dataclasses.replace(div.located, inputs=(q, k)))
    scaled = dataclasses.replace(div, runs=div.runs + (dataclasses.replace(div.runs[1], attention="scaled_first"),))
    texts = [*P.divergence_facts(scaled, 3e-3, 16).values(), P.located_sentence(qk),
             P.located_sentence(_div(failed=False)), P.recorded_divergence_note(scaled, "NVIDIA H200"),
             P.proxy_sentence("small", False), P.proxy_sentence("small", True), P.proxy_sentence("full", False)]
    assert not [t for t in texts if isinstance(t, str) and ("$" in t or "\\" in t)]


def test_the_proxy_sentence_says_what_the_location_stands_for():
    small = P.proxy_sentence("small", False)
    assert "locates the failure of the proxy, not of the full-size record" in small
    assert "awaits a GPU recording of this study (`fp16_divergence`)" in small
    assert "The GPU record below locates the failure in a full-size run" in P.proxy_sentence("small", True)
    assert "awaits" not in P.proxy_sentence("small", True)
    assert P.proxy_sentence("full", False) == ("The table gives the failing batch's loss from those same weights, "
                                               "computed each way. These runs are the full-size study, so the "
                                               "operation named is where a full-size run failed.")
    assert small.startswith("The table gives the failing batch's loss from those same weights, computed each way.")
    # no run failed: no table to point at and nothing located, so the proxy stands for nothing
    unlocated = P.proxy_sentence("small", False, located=False)
    assert "The table" not in unlocated and "locates" not in unlocated
    assert "no failure of theirs was located here, so they say nothing about where the full-size record failed" \
        in unlocated
    assert P.proxy_sentence("full", True, located=False) == ("These runs are the full-size study; none was located "
                                                            "here.")
    with pytest.raises(TypeError, match="located must be a bool"):
        P.proxy_sentence("small", False, located=None)
    with pytest.raises(ValueError, match="size must be 'small' or 'full'"):
        P.proxy_sentence("medium", False)
    with pytest.raises(TypeError, match="recorded must be a bool"):
        P.proxy_sentence("small", 1)


def test_the_verdict_reports_products_against_fp16s_range():
    assert P.divergence_verdict(_div()) == (
        "The growth itself did no harm to runs that never hold the raw product in FP16: the one run with fused "
        "attention (SDPA) stayed finite and went past FP16's largest value, up to 150,000, 2.29 times it. At "
        "the failing step, the largest product (computed in FP32) was 70,000: above 65,504 in 1 of 1 failing "
        "runs.")
    low = P.divergence_verdict(_div(fused_peak=2000.0))
    assert low.startswith("The runs with fused attention (SDPA) stayed below FP16's largest value (at most 2,000)")
    table = P.replay_table(_div())
    assert "| FP16 with attention written out (as trained) | NaN |" in table and "| 3.1000 |" in table
    # no run failed: one row says so instead of a header over nothing
    none_failed = dataclasses.replace(_div(), replays={}, located=None, located_step=None, located_seed=None)
    assert P.replay_table(none_failed).splitlines()[2:] == ["| (no run failed: no step to compute again) | - |"]


def test_facts_and_the_recorded_note():
    div = _div()
    facts = P.divergence_facts(div, 3e-3)
    assert (facts["div_steps"], facts["div_seeds"], facts["fp16_max"]) == (3, 1, "65,504")
    assert facts["div_lr_text"] == ("The runs train at learning rate 0.05, 16.7 times the 0.003 of the course "
                                    "model's other runs (the parity runs above among them), so that the failure "
                                    "shows within the 3 steps a lesson can afford.")
    assert P.learning_rate_sentence(div, 0.05) == "The runs train at the course's usual learning rate, 0.05."
    assert P.learning_rate_sentence(div, 0.1) == ("The runs train at learning rate 0.05, 2 times below the 0.1 of "
                                                  "the course model's other runs (the parity runs above among "
                                                  "them).")
    assert facts["div_probe_every"] == 2
    # the batch is said only where the study's differs from the course's
    small = dataclasses.replace(div, batch_size=4)
    assert P.learning_rate_sentence(small, 0.05, 4) == P.learning_rate_sentence(small, 0.05)
    assert P.learning_rate_sentence(div, 0.05, 16) == P.learning_rate_sentence(div, 0.05)   # batch not recorded
    assert P.divergence_facts(small, 3e-3, 16)["div_lr_text"] == facts["div_lr_text"] + (
        " They take batches of 4 sequences, not the 16 of those runs, to keep the run short on a CPU, where FP16 "
        "products can be slow (the matmul speeds at the top of the page).")
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="course_batch must be None or a positive int"):
            P.learning_rate_sentence(small, 0.05, bad)
    assert facts["div_verdict"] == P.divergence_verdict(div)
    for bad in (0.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="course_lr must be a positive finite number"):
            P.divergence_facts(div, bad)
    note = P.recorded_divergence_note(div, "NVIDIA H200")
    assert note.startswith("On **NVIDIA H200**, over 3 steps at learning rate 0.05")
    assert "| FP16 with q scaled first | 3.1000 |" in note
    assert "|---|" not in P.recorded_divergence_note(_div(failed=False), "NVIDIA H200")   # no failure, no table


def test_the_figure_draws_a_line_per_run_and_fp16s_limit():
    fig = plots.plot_qk_growth(_div())
    ax = fig.axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert "seed 0, written out: loss not finite at step 2" in labels
    assert "seed 0, fused (SDPA)" in labels
    # readable at the book's column: a narrow figure whose legend and limit label are at least 10 points
    assert fig.get_figwidth() <= 6.5
    assert min(t.get_fontsize() for t in ax.get_legend().get_texts()) >= 10
    assert any("FP16's largest value, 65,504" in t.get_text() for t in ax.get_legend().get_texts())
    assert ax.get_yscale() == "log" and ax.get_ylim()[1] > FP16_MAX
    assert any(line.get_ydata()[0] == FP16_MAX for line in ax.get_lines() if len(line.get_ydata()) == 2
               and line.get_ydata()[0] == line.get_ydata()[1])
