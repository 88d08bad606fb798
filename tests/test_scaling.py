"""The teaching loss scaler against torch.amp.GradScaler, side by side, bit for bit."""

import math
import re

import pytest
import torch

from course_lib.device import SizeProfile
from course_lib.scaling import (
    TeachingLossScaler,
    grad_scaler_defaults,
    grad_scaler_refusal,
    replay_scale_schedule,
    scale_after_clean_steps,
    steps_to_double,
)
from course_lib.studies.loss_scaling import record_grad_scaler_run


class CountingSGD(torch.optim.SGD):
    def __init__(self, params):
        super().__init__(params, lr=0.01)
        self.calls = 0

    def step(self, closure=None):
        self.calls += 1
        return super().step(closure)


def gradient_stream(n_steps, seed=0):
    """Per-step multipliers c (the loss is sum(p * c), so the gradient is c): ordinary values over many
    binades, planted inf, NaN, and values that overflow float32 once scaled."""
    gen = torch.Generator().manual_seed(seed)
    stream = []
    for step in range(n_steps):
        c = torch.randn(2, 37, generator=gen) * torch.exp2(torch.randint(-30, 5, (2, 37), generator=gen).float())
        if step % 11 == 3:
            c[0, 5] = math.inf
        if step % 13 == 7:
            c[1, 2] = math.nan
        if step % 17 == 9:
            c[1, 0] = 1e36  # finite, but times the scale it overflows float32
        stream.append(c)
    return stream


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3),
    dict(init_scale=1000.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=2),
    dict(init_scale=3.0e38, growth_factor=2.0, backoff_factor=0.5, growth_interval=1),  # growth would overflow
])
def test_teaching_scaler_matches_grad_scaler_bit_for_bit(kwargs):
    grad_dtype = torch.float32
    params_real = [torch.nn.Parameter(torch.zeros(2, 37, dtype=grad_dtype))]
    params_mine = [torch.nn.Parameter(torch.zeros(2, 37, dtype=grad_dtype))]
    real, mine = torch.amp.GradScaler("cpu", **kwargs), TeachingLossScaler(**kwargs)
    opt_real, opt_mine = CountingSGD(params_real), CountingSGD(params_mine)
    for step, c in enumerate(gradient_stream(60)):
        for opt, params, scale_fn in ((opt_real, params_real, real.scale), (opt_mine, params_mine, mine.scale_loss)):
            opt.zero_grad(set_to_none=True)
            loss = (params[0].float() * c.float()).sum()
            scale_fn(loss).backward()
        assert torch.equal(params_real[0].grad.view(torch.int32), params_mine[0].grad.view(torch.int32))
        real.unscale_(opt_real)
        found_inf = mine.unscale_(opt_mine)
        g_real, g_mine = params_real[0].grad, params_mine[0].grad
        same = (g_real == g_mine) | (torch.isnan(g_real) & torch.isnan(g_mine))
        assert bool(same.all()), f"unscaled gradients differ at step {step}"
        calls = opt_real.calls
        real.step(opt_real)
        assert mine.step(opt_mine) == (opt_real.calls > calls) != found_inf, f"skip decision differs at {step}"
        real.update()
        mine.update()
        state = real.state_dict()
        assert mine.scale == state["scale"], f"scale differs at step {step}"
        assert mine.growth_tracker == state["_growth_tracker"], f"growth tracker differs at step {step}"
        assert torch.equal(params_real[0].data, params_mine[0].data)
    assert opt_real.calls == opt_mine.calls


def test_both_refuse_fp16_gradients():
    """A model cast to .half() has FP16 gradients: unscaling them in FP16 would lose what the scale saved."""
    p = torch.nn.Parameter(torch.ones(3, dtype=torch.float16))
    real = torch.amp.GradScaler("cpu")
    real.scale(p.float().sum()).backward()
    assert p.grad.dtype == torch.float16
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        real.unscale_(torch.optim.SGD([p], lr=0.1))
    with pytest.raises(ValueError, match="Attempting to unscale FP16 gradients"):
        TeachingLossScaler().unscale_(torch.optim.SGD([p], lr=0.1))


def test_scale_grows_only_after_growth_interval_clean_steps():
    defaults = grad_scaler_defaults("cpu")
    assert defaults.growth_interval == 2000 and defaults.init_scale == 2.0**16
    assert steps_to_double() == defaults.growth_interval
    trace = replay_scale_schedule([math.inf] * 10, init_scale=8.0, growth_interval=4)
    assert trace.scales == (8.0, 8.0, 8.0, 8.0, 16.0, 16.0, 16.0, 16.0, 32.0, 32.0)
    assert trace.growth_trackers == (1, 2, 3, 0, 1, 2, 3, 0, 1, 2)


def test_replay_backs_off_and_resets_tracker():
    trace = replay_scale_schedule([math.inf, 5.0, math.inf, 0.0], init_scale=8.0, growth_interval=2)
    assert trace.skipped == (False, True, False, True)
    assert trace.scales == (8.0, 8.0, 4.0, 4.0)
    assert trace.growth_trackers == (1, 0, 1, 0) and trace.n_skipped == 2 and trace.final_scale == 4.0


def test_flight_recorder_is_reproduced_by_replay():
    rec = record_grad_scaler_run(SizeProfile("small"), steps=25, init_scale=2.0**24, growth_interval=5)
    assert rec.steps == 25 and rec.skipped[0]  # 2**24 is far too large for FP16 gradients
    assert rec.scales[1] == rec.scales[0] / 2
    assert any(not s for s in rec.skipped)
    replay = replay_scale_schedule(rec.overflow_thresholds(), init_scale=rec.init_scale,
                                   growth_factor=rec.growth_factor, backoff_factor=rec.backoff_factor,
                                   growth_interval=rec.growth_interval)
    assert replay.scales == rec.scales and replay.skipped == rec.skipped
    assert replay.growth_trackers == rec.growth_trackers
    assert rec.as_trace().n_skipped == sum(rec.skipped)


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="growth_interval must be a positive int"):
        TeachingLossScaler(growth_interval=0)
    with pytest.raises(ValueError, match="backoff_factor must lie in"):
        TeachingLossScaler(backoff_factor=1.5)
    with pytest.raises(ValueError, match="growth_factor must be > 1"):
        TeachingLossScaler(growth_factor=1.0)
    with pytest.raises(ValueError, match="init_scale must be finite"):
        TeachingLossScaler(init_scale=math.inf)
    with pytest.raises(TypeError, match="loss must be a torch.Tensor"):
        TeachingLossScaler().scale_loss(1.0)
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer, got list"):
        TeachingLossScaler().unscale_([torch.zeros(3)])
    with pytest.raises(ValueError, match="non-negative numbers"):
        replay_scale_schedule([-1.0])
    with pytest.raises(TypeError, match="SizeProfile"):
        record_grad_scaler_run("small")


@pytest.mark.parametrize("pitfall", list(__import__("course_lib.scaling", fromlist=["x"]).PITFALLS))
def test_each_detector_catches_its_planted_pitfall(pitfall):
    from course_lib.scaling import run_pitfall_demo
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        demo = run_pitfall_demo(pitfall)
    assert [f.pitfall for f in demo.findings] == [pitfall]
    if pitfall in ("unscale_twice", "fp16_params"):
        assert demo.error is not None


def test_correct_loop_raises_no_finding_and_restores_everything():
    from course_lib.scaling import ScalerAudit, run_pitfall_demo

    clip = torch.nn.utils.clip_grad_norm_
    demo = run_pitfall_demo(None)
    assert demo.findings == () and demo.error is None
    assert demo.optimizer_steps == demo.scheduler_steps == 3  # the first, overflowing step is skipped
    assert torch.nn.utils.clip_grad_norm_ is clip
    scaler = torch.amp.GradScaler("cpu")
    with ScalerAudit(scaler, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)):
        assert "scale" in scaler.__dict__
    assert "scale" not in scaler.__dict__
    with pytest.raises(ValueError, match="unknown pitfall"):
        run_pitfall_demo("typo")
    with pytest.raises(TypeError, match="GradScaler"):
        ScalerAudit(object(), None)


def test_side_by_side_check_and_static_runs():
    from course_lib.scaling import compare_with_grad_scaler
    from course_lib.studies.loss_scaling import train_with_loss_scaling

    agree = compare_with_grad_scaler(120, growth_interval=3)
    assert set(agree.values()) == {120}
    runs = train_with_loss_scaling(SizeProfile("small"), static_scales=(1.0, 2.0**30), steps=3,
                                   dynamic_growth_interval=2)
    labels = [r.label for r in runs]
    assert labels == ["static 2\u2070", "static 2\u00b3\u2070", "dynamic (GradScaler)"]
    assert runs[1].n_skipped == 3 and runs[0].n_skipped == 0


def test_flight_recorder_ends_when_the_scale_collapses_to_zero():
    # lr=1e30 makes the weights overflow FP16 after the first step, so every later step overflows; a tiny
    # back-off takes the float32 scale to zero within a few steps (as a full-size GPU run once did over
    # ~160 halvings), and the recorder must stop there instead of dividing by a zero scale.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rec = record_grad_scaler_run(SizeProfile("small"), steps=20, lr=1e30, backoff_factor=2.0**-60)
    assert 2 <= rec.steps < 20
    assert all(s > 0 for s in rec.scales) and rec.skipped[-1]
    assert all(math.isfinite(m) for m in rec.max_activation_grad)


def test_teaching_scaler_at_zero_scale_matches_grad_scaler_bit_for_bit():
    # After enough back-offs the scale reaches 0.0; GradScaler then multiplies by an infinite inverse,
    # turns finite gradients into NaN and reports no overflow. The teaching scaler must do the same.
    import warnings

    torch.manual_seed(0)
    g = torch.randn(8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        real = torch.amp.GradScaler("cpu", init_scale=1.0)
    p = torch.nn.Parameter(torch.zeros(8))
    opt = torch.optim.SGD([p], lr=0.0)
    real.scale(p.sum())  # creates the scale tensor
    real._scale.fill_(0.0)
    real.scale((p * g).sum()).backward()
    real.unscale_(opt)
    found_real = bool(real._per_optimizer_states[id(opt)]["found_inf_per_device"][torch.device("cpu")])
    mine = TeachingLossScaler(init_scale=1.0)
    mine.scale = 0.0
    q = torch.nn.Parameter(torch.zeros(8))
    q.grad = (g * 0.0).clone()
    found_mine = mine.unscale_(torch.optim.SGD([q], lr=0.0))
    assert found_mine == found_real is False
    assert bool(torch.isnan(q.grad).all()) and bool(torch.isnan(p.grad).all())


def test_teaching_scaler_refuses_a_second_unscale_and_round_trips_its_state():
    s = TeachingLossScaler(init_scale=2.0**10, growth_interval=3)
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.ones(3)
    opt = torch.optim.SGD([p], lr=0.0)
    s.unscale_(opt)
    with pytest.raises(RuntimeError, match="already been called on this optimizer since the last update"):
        s.unscale_(opt)
    s.update()
    p.grad = torch.full((3,), math.inf)
    assert s.unscale_(opt)  # allowed again after update()
    s.update()
    state = s.state_dict()
    assert set(state) == set(torch.amp.GradScaler("cpu").state_dict())
    other = TeachingLossScaler()
    other.load_state_dict(state)
    assert other.state_dict() == state
    with pytest.raises(ValueError, match="lacks"):
        other.load_state_dict({"scale": 1.0})
    # a GradScaler's state loads; a state the constructor would refuse does not, and changes nothing
    real = torch.amp.GradScaler("cpu", init_scale=2.0**7, growth_interval=5).state_dict()
    other.load_state_dict(real)
    assert (other.scale, other.growth_interval) == (2.0**7, 5)
    for bad, message in (({"scale": -4.0}, "init_scale must be > 0"), ({"growth_factor": 0.5}, "growth_factor must be > 1"),
                         ({"backoff_factor": 2.0}, "backoff_factor must lie in"),
                         ({"growth_interval": 0}, "growth_interval must be a positive int"),
                         ({"_growth_tracker": -3}, "_growth_tracker must be a non-negative int")):
        with pytest.raises(ValueError, match=message):
            other.load_state_dict({**state, **bad})
        assert other.state_dict() == {**real, "_growth_tracker": 0}


def test_replay_and_flight_recording_bad_input():
    from course_lib.scaling import replay_scale_schedule
    from course_lib.jsonable import from_jsonable
    from course_lib.studies.loss_scaling import FlightRecording

    with pytest.raises(ValueError, match="NaN not"):
        replay_scale_schedule([1.0, math.nan])
    with pytest.raises(ValueError, match="expected an object for FlightRecording"):
        from_jsonable(FlightRecording, "x")


@pytest.mark.parametrize("bad", [0.0, -4.0, math.inf])
def test_static_scales_must_be_positive_and_finite(bad):
    from course_lib.studies.loss_scaling import train_with_loss_scaling

    with pytest.raises(ValueError, match="static loss scales must be positive finite"):
        train_with_loss_scaling(SizeProfile("small"), static_scales=(bad,), steps=1)


def test_pitfall_consequences_are_measured():
    import warnings

    from course_lib.scaling import run_pitfall_demo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        correct = run_pitfall_demo(None)
        clip = run_pitfall_demo("clip_before_unscale")
        micro = run_pitfall_demo("update_every_microbatch")
        sched = run_pitfall_demo("scheduler_on_skipped_step")
    assert correct.update_norm > 0 and correct.final_scale == 2.0 ** 20
    # clipping scaled gradients shrinks the update by a factor of the order of the scale
    assert clip.update_norm / correct.update_norm < 10 / clip.final_scale
    # per step the formula is exact for the gradient: 1/S of the correct loop's (here every true norm > max_norm)
    assert len(clip.step_grad_norms) == len(correct.step_grad_norms) == correct.optimizer_steps
    for c, g in zip(clip.step_grad_norms, correct.step_grad_norms):
        assert c / g == pytest.approx(1 / clip.final_scale, rel=1e-5)
    # the correct loop's weights move as far as SGD asks; the clipped loop's tiny steps lose part to rounding
    assert sum(correct.step_moved) == pytest.approx(sum(correct.step_requested), rel=1e-4)
    assert sum(clip.step_moved) < 0.95 * sum(clip.step_requested)
    assert micro.optimizer_steps == 2 * correct.optimizer_steps and micro.scheduler_steps > 0
    assert 0.85 < sched.update_norm / correct.update_norm < 0.95  # one StepLR decay (gamma 0.9) ahead
    assert run_pitfall_demo(None).update_norm == correct.update_norm  # same initial weights every time


def test_clipping_imported_by_name_is_still_caught():
    import torch.nn.utils.clip_grad as clip_module
    from torch.nn.utils import clip_grad_norm_   # the loop's own reference, which patching cannot replace

    from course_lib.scaling import ScalerAudit

    helper = getattr(clip_module, "_get_total_norm", None)
    if helper is None:  # pragma: no cover - a torch without the helper
        pytest.skip("this torch's clip_grad_norm_ has no module-level norm helper to watch")
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    with ScalerAudit(scaler, opt) as audit:
        scaler.scale(model(torch.randn(4, 8)).square().mean()).backward()
        clip_grad_norm_(model.parameters(), 1.0)         # before unscale_
        scaler.step(opt)
        scaler.update()
    assert audit.pitfalls == ["clip_before_unscale"]
    assert clip_module._get_total_norm is helper


def test_correct_autocast_loops_raise_nothing_and_everything_is_restored():
    from course_lib.scaling import ScalerAudit

    enter, backward = torch.autocast.__enter__, torch.Tensor.backward
    for dtype, use_scaler in ((torch.float16, True), (torch.bfloat16, False)):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu") if use_scaler else None
        with ScalerAudit(scaler, opt, model=model) as audit:
            for _ in range(3):
                opt.zero_grad()
                with torch.autocast("cpu", dtype=dtype):
                    loss = model(torch.randn(4, 8)).float().square().mean()
                if scaler is not None:
                    scaler.scale(loss).backward()
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    scaler.step(opt)
                    scaler.update()
                else:
                    loss.backward()
                    opt.step()
                model.eval()
                with torch.no_grad(), torch.autocast("cpu", dtype=dtype):
                    model(torch.randn(2, 8))
                model.train()
        assert audit.findings == [], (dtype, audit.pitfalls)
    assert torch.autocast.__enter__ is enter and torch.Tensor.backward is backward
    with pytest.raises(TypeError, match="nn.Module"):
        ScalerAudit(None, torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1), model="model")


def test_scale_gradient_fidelity_shows_what_adam_hides():
    from course_lib.device import SizeProfile
    from course_lib.studies.loss_scaling import scale_gradient_fidelity

    fid = scale_gradient_fidelity(SizeProfile("small"), steps=30, batches=1, scales=(1.0, 2.0**16, 2.0**24))
    assert fid.overflowed == {1.0: False, 2.0**16: False, 2.0**24: True}
    assert all(math.isnan(v) for v in fid.error[2.0**24].values())
    # unscaled FP16 gradients are far worse than scaled ones, layer for layer at the worst and in the median
    assert fid.worst(1.0)[1] > 10 * fid.worst(2.0**16)[1]
    median = {sc: sorted(fid.error[sc].values())[len(fid.names) // 2] for sc in (1.0, 2.0**16)}
    assert median[1.0] > 3 * median[2.0**16]
    assert all(0.0 <= v <= 1.0 for d in fid.lost.values() for v in d.values())
    # the key biases' gradients, zero in exact arithmetic, are FP32 rounding noise: left out of "lost", counted
    assert set(fid.noise) == {"blocks.0.attn.qkv.bias", "blocks.1.attn.qkv.bias"}
    assert all(v == 64.0 for v in fid.noise.values())          # d_model = 64 key entries in each
    from course_lib import plots
    fig = plots.plot_scale_fidelity(fid)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert any("overflowed" in t for t in labels) and len(labels) == 3
    assert labels[0] == "scale 2\u2070" and labels[1] == "scale 2\u00b9\u2076"   # the prose's notation
    # the legend sits under the axes and their tick labels, off the data it would hide
    assert fig.axes[0].get_legend() is None
    assert fig.legends[0].get_window_extent().y1 <= fig.axes[0].get_tightbbox().y0 + 1
    for bad in (dict(scales=()), dict(scales=(0.0,)), dict(scales=(math.inf,)), dict(batches=0)):
        with pytest.raises(ValueError):
            scale_gradient_fidelity(SizeProfile("small"), steps=0, **bad)


def test_scale_after_clean_steps_runs_the_real_scalers_growth_rule():
    assert scale_after_clean_steps(torch.amp.GradScaler("cpu"), 10) == 2.0**16     # growth_interval 2000
    assert scale_after_clean_steps(torch.amp.GradScaler("cpu", growth_interval=1), 20) == 2.0**36
    assert scale_after_clean_steps(torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3), 7) == 32.0
    assert scale_after_clean_steps(torch.amp.GradScaler("cpu", init_scale=8.0), 0) == 8.0
    with pytest.raises(TypeError, match="GradScaler"):
        scale_after_clean_steps(TeachingLossScaler(), 3)
    with pytest.raises(ValueError, match="non-negative int"):
        scale_after_clean_steps(torch.amp.GradScaler("cpu"), -1)


def test_grad_scaler_refusal_returns_torchs_message_or_none():
    assert grad_scaler_refusal("cpu", growth_factor=1.0) == "The growth factor must be > 1.0."
    assert grad_scaler_refusal("cpu", backoff_factor=1.5) == "The backoff factor must be < 1.0."
    assert grad_scaler_refusal("cpu", growth_factor=2.0) is None


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality of two float tensors (NaN payloads and signed zeros included)."""
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}
    return a.dtype == b.dtype and torch.equal(a.detach().view(ints[a.dtype]), b.detach().view(ints[b.dtype]))


def three_optimizers():
    """Three parameter sets, each with its own kind of optimizer: float32 SGD with momentum, float64 Adam,
    and a sparse embedding with plain SGD (GradScaler unscales the values of a sparse gradient)."""
    torch.manual_seed(0)
    w_a = torch.nn.Parameter(torch.randn(2, 37))
    w_b = torch.nn.Parameter(torch.randn(3, 7, dtype=torch.float64))
    emb = torch.nn.Embedding(10, 4, sparse=True)
    opts = [torch.optim.SGD([w_a], lr=0.01, momentum=0.9), torch.optim.Adam([w_b], lr=0.01),
            torch.optim.SGD(emb.parameters(), lr=0.1)]
    return (w_a, w_b, emb), opts


def test_one_scaler_three_optimizers_matches_grad_scaler_bit_for_bit():
    """Several optimizers share one scaler, as in GradScaler: each is unscaled once per iteration
    (explicitly or inside step), skipped on its own inf/NaN alone, and update() backs off when any of
    them overflowed."""
    models = {kind: three_optimizers() for kind in ("real", "mine")}
    real = torch.amp.GradScaler("cpu", init_scale=2.0**12, growth_interval=3)
    mine = TeachingLossScaler(init_scale=2.0**12, growth_interval=3)
    ran: list[list[bool]] = [[], [], []]
    for i, opt in enumerate(models["real"][1]):
        opt.register_step_post_hook(lambda *_, i=i: ran[i].append(True))
    gen = torch.Generator().manual_seed(1)
    skipped_mine = [0, 0, 0]
    scales = set()
    for step in range(40):
        c_a = torch.randn(2, 37, generator=gen) * torch.exp2(torch.randint(-30, 5, (2, 37), generator=gen).float())
        c_b = torch.randn(3, 7, generator=gen, dtype=torch.float64)
        c_c, idx = torch.randn(5, 4, generator=gen), torch.randint(0, 10, (5,), generator=gen)
        if step % 7 == 3:
            c_a[0, 5] = math.inf   # only the first optimizer's gradients overflow
        if step % 11 == 5:
            c_b[1, 2] = math.nan   # only the second's
        if step % 13 == 8:
            c_c[2, 1] = 1e36       # only the third's: finite, but times the scale beyond float32
        if step == 21:
            c_a[1, 1], c_b[0, 0] = math.inf, math.inf   # two at once
        for kind, scale_fn in (("real", real.scale), ("mine", mine.scale_loss)):
            (w_a, w_b, emb), opts = models[kind]
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            scale_fn((w_a * c_a).sum() + (w_b * c_b).sum().float() + (emb(idx) * c_c).sum()).backward()
        opts_real, opts_mine = models["real"][1], models["mine"][1]
        found = {}
        for i in [0] + ([1] if step % 2 else []):   # the third is unscaled only inside step()
            real.unscale_(opts_real[i])
            found[i] = mine.unscale_(opts_mine[i])
            for p_real, p_mine in zip(opts_real[i].param_groups[0]["params"], opts_mine[i].param_groups[0]["params"]):
                g_real, g_mine = p_real.grad, p_mine.grad
                if g_real.is_sparse:
                    g_real, g_mine = g_real._values(), g_mine._values()
                assert same_bits(g_real, g_mine), f"optimizer {i}'s unscaled gradients differ at step {step}"
        for i in range(3):
            before = len(ran[i])
            real.step(opts_real[i])
            stepped = mine.step(opts_mine[i])
            assert stepped == (len(ran[i]) > before), f"optimizer {i}'s skip decision differs at step {step}"
            assert found.get(i, not stepped) == (not stepped)
            skipped_mine[i] += not stepped
        real.update()
        mine.update()
        state = real.state_dict()
        assert mine.scale == state["scale"], f"scale differs at step {step}"
        assert mine.growth_tracker == state["_growth_tracker"], f"growth tracker differs at step {step}"
        scales.add(mine.scale)
        for p_real, p_mine in zip(*(list(m[0][:2]) + [m[0][2].weight] for m in models.values())):
            assert same_bits(p_real, p_mine), f"parameters differ after step {step}"
    # each optimizer skipped its own overflows (not the others'), and the scale both backed off and grew
    assert skipped_mine == [40 - len(r) for r in ran] and len(set(skipped_mine)) == 3
    assert min(scales) < 2.0**12 < max(scales)


def test_unscale_and_step_refusals_match_grad_scaler():
    """What GradScaler refuses per optimizer between two updates, the teaching scaler refuses too: a
    second unscale_ (or an unscale_ after step) of the same optimizer, and a second step; another
    optimizer may still be unscaled and stepped."""
    for scaler in (torch.amp.GradScaler("cpu"), TeachingLossScaler()):
        scale = scaler.scale if isinstance(scaler, torch.amp.GradScaler) else scaler.scale_loss
        p, q = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
        opt_p, opt_q = torch.optim.SGD([p], lr=0.1), torch.optim.SGD([q], lr=0.1)
        scale(p.sum() + q.sum()).backward()
        scaler.unscale_(opt_p)
        scaler.unscale_(opt_q)   # a second optimizer in the same iteration: allowed
        with pytest.raises(RuntimeError, match=re.escape(
                "unscale_() has already been called on this optimizer since the last update().")):
            scaler.unscale_(opt_p)
        scaler.step(opt_p)
        with pytest.raises(RuntimeError, match=re.escape("unscale_() is being called after step()")):
            scaler.unscale_(opt_p)
        with pytest.raises(RuntimeError, match=re.escape("step() has already been called since the last update().")):
            scaler.step(opt_p)
        scaler.step(opt_q)
        scaler.update()
        assert torch.equal(p.detach(), torch.full((3,), 0.9)) and torch.equal(q.detach(), torch.full((2,), 0.9))
        scale(p.sum()).backward()
        scaler.unscale_(opt_p)   # allowed again after update()
    # what GradScaler only asserts, the teaching scaler explains
    mine, p = TeachingLossScaler(), torch.nn.Parameter(torch.ones(3))
    with pytest.raises(RuntimeError, match="no gradients checked since the last update"):
        mine.update()
    with pytest.raises(ValueError, match="none of the optimizer's parameters has a gradient"):
        mine.step(torch.optim.SGD([p], lr=0.1))
    p.grad = torch.ones(3)
    mine.unscale_(torch.optim.SGD([p], lr=0.1))
    with pytest.raises(ValueError, match="found_inf was given, but optimizers were unscaled"):
        mine.update(True)
    with pytest.raises(TypeError, match="found_inf must be a bool or None, got Tensor"):
        mine.update(torch.tensor(True))
    with pytest.raises(TypeError, match="optimizer must be a torch.optim.Optimizer, got Parameter"):
        mine.step(p)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(init_scale=1e-46), ValueError, r"init_scale=1e-46 rounds to 0.0 in float32"),
    (dict(init_scale=1e-39), ValueError, r"init_scale=1e-39 is too small: its inverse overflows float32"),
    (dict(init_scale=3.5e38), ValueError, r"init_scale=3.5e\+38 rounds to inf in float32"),
    (dict(init_scale=0.0), ValueError, r"init_scale must be > 0, got 0.0"),
    (dict(init_scale=-1.0), ValueError, r"init_scale must be > 0, got -1.0"),
    (dict(init_scale=math.nan), ValueError, r"init_scale must be finite, got nan"),
    (dict(init_scale="65536"), TypeError, r"init_scale must be a real number, got '65536' \(str\)"),
    (dict(init_scale=True), TypeError, r"init_scale must be a real number, got True \(bool\)"),
    (dict(growth_factor=0.5), ValueError, r"growth_factor must be > 1, got 0.5"),
    (dict(growth_factor=math.inf), ValueError, r"growth_factor must be finite, got inf"),
    (dict(growth_factor=None), TypeError, r"growth_factor must be a real number, got None"),
    (dict(backoff_factor=0.0), ValueError, r"backoff_factor must lie in \(0, 1\), got 0.0"),
    (dict(backoff_factor=-0.5), ValueError, r"backoff_factor must lie in \(0, 1\), got -0.5"),
    (dict(backoff_factor=1.0), ValueError, r"backoff_factor must lie in \(0, 1\), got 1.0"),
    (dict(growth_interval=0), ValueError, r"growth_interval must be a positive int \(steps\), got 0"),
    (dict(growth_interval=2.5), TypeError, r"growth_interval must be an int \(steps\), got 2.5 \(float\)"),
    (dict(growth_interval="3"), TypeError, r"growth_interval must be an int \(steps\), got '3' \(str\)"),
])
def test_constructor_and_side_by_side_check_refuse_bad_settings(kwargs, error, message):
    with pytest.raises(error, match=message):
        TeachingLossScaler(**kwargs)
    from course_lib.scaling import compare_with_grad_scaler
    with pytest.raises(error, match=message):   # before GradScaler asserts (or accepts the nonsense)
        compare_with_grad_scaler(3, **kwargs)


def test_grad_scaler_accepts_a_scale_without_a_finite_inverse():
    """Why the constructor refuses 1e-46: GradScaler accepts it, stores 0.0 in float32, and its first
    unscale_ turns every finite gradient into NaN without reporting an overflow."""
    real, p = torch.amp.GradScaler("cpu", init_scale=1e-46), torch.nn.Parameter(torch.ones(3))
    real.scale(p.sum()).backward()
    real.unscale_(torch.optim.SGD([p], lr=0.1))
    assert real.get_scale() == 0.0 and bool(torch.isnan(p.grad).all())
    assert TeachingLossScaler(init_scale=2.0**-126).inverse_scale().item() == 2.0**126   # a normal scale is fine


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.bool, torch.complex64])
def test_non_floating_gradients_are_a_clear_type_error(dtype):
    p = torch.zeros(3, dtype=dtype)
    p.grad = torch.ones(3, dtype=dtype)
    before = p.grad.clone()
    real = torch.amp.GradScaler("cpu")
    real.scale(torch.ones(()))
    with pytest.raises(NotImplementedError, match="not implemented for"):   # torch's kernel has none
        real.unscale_(torch.optim.SGD([p], lr=0.1))
    other = torch.nn.Parameter(torch.ones(2))
    other.grad = torch.full((2,), 4.0)
    opt = torch.optim.SGD([{"params": [other]}, {"params": [p]}], lr=0.1)
    with pytest.raises(TypeError, match=re.escape(f"parameter 0 in param group 1: its dtype is {dtype}")):
        TeachingLossScaler(init_scale=2.0).unscale_(opt)
    assert torch.equal(p.grad, before) and torch.equal(other.grad, torch.full((2,), 4.0))   # nothing unscaled


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(iterations=-1), ValueError, r"iterations must be >= 1, got -1"),
    (dict(iterations=0), ValueError, r"iterations must be >= 1, got 0"),
    (dict(iterations=2.0), TypeError, r"iterations must be an int, got 2.0 \(float\)"),
    (dict(iterations=True), TypeError, r"iterations must be an int, got True \(bool\)"),
    (dict(device="bogus"), ValueError, r"device 'bogus' is not a device torch knows"),
    (dict(device="meta"), ValueError, r"device must be 'cpu' or 'cuda', got 'meta'"),
    (dict(device=0), TypeError, r"device must be a str or torch.device, got int"),
])
def test_pitfall_demo_refuses_bad_arguments(kwargs, error, message):
    from course_lib.scaling import run_pitfall_demo

    with pytest.raises(error, match=message):
        run_pitfall_demo(None, **kwargs)


def test_pitfall_demo_refuses_bad_names_and_unavailable_cuda():
    from course_lib.scaling import run_pitfall_demo

    with pytest.raises(TypeError, match="name must be a pitfall name \\(str\\) or None, got list"):
        run_pitfall_demo(["unscale_twice"])
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="asks for CUDA, which is not available"):
            run_pitfall_demo(None, device="cuda")
    assert run_pitfall_demo(None, iterations=1, device=torch.device("cpu")).optimizer_steps == 0  # skipped


def test_side_by_side_check_refuses_unknown_arguments():
    from course_lib.scaling import compare_with_grad_scaler

    with pytest.raises(TypeError, match="unknown scaler argument\\(s\\) growth; known: init_scale"):
        compare_with_grad_scaler(3, growth=2.0)
    with pytest.raises(ValueError, match="n_steps must be >= 1, got 0"):
        compare_with_grad_scaler(0)
    with pytest.raises(TypeError, match="n_steps must be an int"):
        compare_with_grad_scaler(3.0)


def test_a_scaler_without_cuda_warns_when_created_then_does_nothing():
    """What the disabled-scaler pitfall says: torch warns (once, at construction) and the scaler then
    passes the loss through unscaled, with no further warning."""
    import warnings
    from unittest import mock

    from course_lib.scaling import PITFALLS
    with mock.patch.object(torch.cuda, "is_available", return_value=False):
        with warnings.catch_warnings(record=True) as made:
            warnings.simplefilter("always")
            scaler = torch.amp.GradScaler("cuda")
        with warnings.catch_warnings(record=True) as used:
            warnings.simplefilter("always")
            loss = scaler.scale(torch.tensor(3.0))
    assert [str(w.message) for w in made] == [
        "torch.cuda.amp.GradScaler is enabled, but CUDA is not available.  Disabling."]
    assert not scaler.is_enabled() and float(loss) == 3.0 and used == []
    assert "warns once" in PITFALLS["disabled_scaler"] and "silently" not in PITFALLS["disabled_scaler"]


def test_the_source_lesson_3_prints_fits_its_box_and_speaks_of_the_code():
    """Lesson 3 prints these three functions' source: lines fit a 77-column box, and the comments explain
    the code, not the page that prints it."""
    import inspect

    from course_lib.scaling import TeachingLossScaler
    from course_lib.scaling import clipping as clip_edits
    for fn in (TeachingLossScaler.update, clip_edits.scaled_step, clip_edits.adaptive_clip_grad_):
        source = inspect.getsource(fn)
        assert max(len(line) for line in source.splitlines()) <= 77, fn.__name__
        assert "lesson" not in source.lower(), fn.__name__
