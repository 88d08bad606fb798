"""The monitor, the non-finite locator, atomic checkpoints and recovery, each proved on a planted fault."""

import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from course_lib import device as device_rng
from course_lib import monitor as mon
from course_lib.monitor import recovery
from course_lib.studies import monitoring as monitoring_studies
from course_lib.device import size_profile
from course_lib.formats import list_formats, round_to_format
from course_lib.gradients import summarize_underflow
from course_lib.models import course_setup


def _setup(steps=12):
    return course_setup(size_profile("cpu"), "cpu", steps=steps, default_steps=(steps, steps), seed=0)


# ---- gradient statistics --------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["FP16", "BF16"])
@pytest.mark.parametrize("scale", [1.0, 2.0**10])
def test_gradient_stats_classify_like_the_exact_codec(fmt, scale):
    from course_lib.formats import get_format

    f = get_format(fmt)
    g = torch.Generator().manual_seed(0)
    values = torch.randn(20000, generator=g, dtype=torch.float64) * torch.exp(8 * torch.randn(20000, generator=g,
                                                                                             dtype=torch.float64))
    # the rounding boundaries themselves, scaled back to gradients
    edges = torch.tensor([f.min_subnormal / 2, f.min_subnormal / 2 * (1 + 1e-9), f.min_normal - f.min_subnormal / 2,
                          f.min_normal, f.max_finite, f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2,
                          0.0], dtype=torch.float64) / scale
    values = torch.cat([values, edges, -edges])
    ours = mon.gradient_stats("p", values, fmt, scale)
    exact = summarize_underflow(values, fmt, scale)
    assert (ours.zero, ours.flush, ours.subnormal, ours.overflow) == pytest.approx(
        (exact.zero, exact.flushed, exact.subnormal, exact.overflow), abs=0)


def test_gradient_stats_count_non_finite_values():
    s = mon.gradient_stats("p", torch.tensor([1.0, math.nan, math.inf, 0.0]), "FP16")
    assert s.non_finite == 2 and s.zero == 0.25 and s.norm == 1.0


def _rounds_past_max(x: float, f) -> bool:
    """Whether round to nearest even carries ``x`` past ``f``'s max, from the codec alone: ``x / 2`` lies in
    the binade below max's, whose grid has the same last mantissa bits one binade down and holds the value
    above max / 2, so it rounds past max / 2 exactly when ``x`` rounds past max (the halving is exact)."""
    return float(round_to_format(torch.tensor([x / 2], dtype=torch.float64), f)[0]) > f.max_finite / 2


def _edges(f) -> list[float]:
    """Every rounding boundary the classes use, and the float64 on either side of each."""
    half = f.min_subnormal / 2
    top = f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
    points = [half, f.min_subnormal, f.min_normal - half, f.min_normal, f.max_finite, top]
    return [v for p in points for v in (math.nextafter(p, 0), p, math.nextafter(p, math.inf))] + [100 * f.max_finite]


@pytest.mark.parametrize("fmt", [f.name for f in list_formats() if f.signed])
@pytest.mark.parametrize("scale", [1.0, 2.0**10, 3.0])
def test_gradient_stats_classify_each_boundary_as_summarize_underflow_and_rounding_do(fmt, scale):
    f = next(f for f in list_formats() if f.name == fmt)
    for v in _edges(f):
        g = torch.tensor([v / scale, -v / scale], dtype=torch.float64)
        ours = mon.gradient_stats("p", g, f, scale)
        x = float(g[0]) * scale                      # the product both classify
        assert ours.overflow == float(_rounds_past_max(x, f)), (fmt, v)
        exact = summarize_underflow(g, f, scale)   # between max and the boundary (FP4's 6.5): both say no
        assert (ours.zero, ours.flush, ours.subnormal, ours.overflow) == (
            exact.zero, exact.flushed, exact.subnormal, exact.overflow), (fmt, v)


def test_gradient_stats_overflow_where_rounding_carries_past_max():
    # 464 = 448 + half of E4M3's top spacing: a tie that rounds to even, 448 (torch's cast agrees)
    assert float(torch.tensor([464.0]).to(torch.float8_e4m3fn).float()) == 448.0
    assert mon.gradient_stats("g", torch.tensor([464.0]), "e4m3").overflow == 0.0
    assert mon.gradient_stats("g", torch.tensor([464.0001]), "e4m3").overflow == 1.0
    # FP4 and FP6 have no inf and no NaN, and still overflow: their max (6, 7.5, 28) has an odd last bit
    assert mon.gradient_stats("g", torch.tensor([100.0]), "e2m1").overflow == 1.0
    assert mon.gradient_stats("g", torch.tensor([7.0, 6.99]), "e2m1").overflow == 0.5
    assert mon.gradient_stats("g", torch.tensor([7.75]), "e2m3").overflow == 1.0
    assert mon.gradient_stats("g", torch.tensor([30.0]), "e3m2").overflow == 1.0


def test_gradient_stats_refuse_a_bad_scale_and_an_unsigned_format():
    g = torch.ones(3)
    for bad in (-1.0, math.nan, math.inf, 0.0):
        with pytest.raises(ValueError, match="positive finite"):
            mon.gradient_stats("g", g, "FP16", bad)
    for bad in (True, "2", None):
        with pytest.raises(TypeError, match="real number"):
            mon.gradient_stats("g", g, "FP16", bad)
    for fmt in ("E8M0", torch.float8_e8m0fnu):
        with pytest.raises(ValueError, match="unsigned format"):
            mon.gradient_stats("g", g, fmt)
        with pytest.raises(ValueError, match="unsigned format"):
            summarize_underflow(g, fmt)
    with pytest.raises(ValueError, match="unsigned format"):
        mon.GradientHealthMonitor(nn.Linear(2, 2), dtype=torch.float8_e8m0fnu)


# ---- the monitor ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("recipe,dtype,steps", [("bf16_autocast", torch.bfloat16, 20),
                                                ("fp16_autocast_scaler", torch.float16, 10)])
def test_a_healthy_run_raises_no_alert(recipe, dtype, steps):
    from course_lib.train import TrainConfig, TrainState, get_recipe, train

    setup = _setup(steps)
    model = setup.model(0)
    watch = mon.GradientHealthMonitor(model, dtype=dtype, every=2)
    state = TrainState(model, get_recipe(recipe, "cpu"), TrainConfig(steps=steps), torch.device("cpu"))
    train(state, setup.sampler, monitor=watch)
    assert watch.alerts == []
    assert watch.log.steps == list(range(steps)) and watch.log.sampled_steps == list(range(0, steps, 2))
    assert len(watch.log.gradients[0]) == len(list(model.parameters()))


def test_a_dead_layer_is_named():
    from course_lib.train import TrainConfig, TrainState, get_recipe, train

    setup = _setup(3)
    model = setup.model(0)
    mon.plant_fault(model, "blocks.1.fc", "dead")
    watch = mon.GradientHealthMonitor(model, every=1)
    state = TrainState(model, get_recipe("fp32", "cpu"), TrainConfig(steps=3), torch.device("cpu"))
    train(state, setup.sampler, monitor=watch)
    dead = {a.layer for a in watch.alerts_of("zero_gradients")}
    # named as the model names them, without the planted fault's `.module`
    assert "blocks.1.fc.weight" in dead and not any(n.startswith("blocks.0") or ".module" in n for n in dead)


def test_underflow_is_flagged_at_a_small_scale_and_not_at_a_large_one():
    model = nn.Linear(8, 8)
    model.weight.grad = torch.full((8, 8), 1e-9)
    model.bias.grad = torch.full((8,), 1e-2)
    watch = mon.GradientHealthMonitor(model, every=1)
    watch.after_backward(0, scale=1.0)
    assert [a.layer for a in watch.alerts_of("underflow")] == ["weight"]
    calm = mon.GradientHealthMonitor(model, every=1)
    model.weight.grad = torch.full((8, 8), 1e-9 * 2.0**16)   # the same gradient, carrying a scale of 2**16
    calm.after_backward(0, scale=2.0**16)
    assert calm.alerts_of("underflow") == []


def test_gradient_overflow_the_scaler_skips_is_not_an_alert():
    model = nn.Linear(2, 2)
    model.weight.grad = torch.tensor([[math.inf, 1.0], [1.0, 1.0]])
    model.bias.grad = torch.ones(2)
    watch = mon.GradientHealthMonitor(model, every=1)
    watch.after_backward(0, scale=2.0**16)
    watch.after_step(0, loss=1.0, scale=2.0**16, skipped=True)
    assert watch.alerts == []
    watch.after_backward(1, scale=2.0**15)
    watch.after_step(1, loss=1.0, scale=2.0**15, skipped=False)     # went ahead with an inf: alert
    assert [(a.kind, a.layer) for a in watch.alerts] == [("non_finite_gradient", "weight")]



def test_a_scale_torch_drove_to_zero_is_monitored_not_refused():
    # The first H100 run of monitor_faults died here: a run that overflows on every step halves GradScaler's
    # scale until it is 0.0 (torch does not stop it), and the monitor refused that scale.
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**-149)
    watch = mon.GradientHealthMonitor(model, every=1)
    seen = []
    for step in range(2):
        opt.zero_grad()
        scaler.scale(model(torch.full((1, 2), math.inf)).sum()).backward()
        seen.append([(s.name, s.non_finite) for s in watch.after_backward(step, scale=scaler.get_scale())])
        scaler.step(opt)
        scaler.update()
        watch.after_step(step, loss=math.inf, scale=scaler.get_scale(), skipped=True)
    assert scaler.get_scale() == 0.0
    # step 0: the inf input makes all four weight gradients non-finite (the bias's stay finite); step 1 already
    # ran at scale 2^-150, which rounds to 0 in float32: nothing to classify
    assert seen == [[("weight", 4), ("bias", 0)], []]
    assert watch.after_backward(2, scale=0.0) == ()        # nothing to classify: gradients times zero
    assert "scale_collapse" in [a.kind for a in watch.alerts]
    for bad in (-1.0, math.inf, math.nan, True):
        with pytest.raises(ValueError, match="finite number >= 0"):
            watch.after_backward(3, scale=bad)

def test_run_level_alerts():
    watch = mon.GradientHealthMonitor(nn.Linear(2, 2), thresholds=mon.Thresholds(skipped_run=3, min_scale=1.0))
    for step in range(3):
        watch.after_step(step, loss=1.0, scale=2.0 ** (10 - step), skipped=True)
    assert [a.kind for a in watch.alerts] == ["skipped_run"] and watch.alerts[0].step == 2
    watch.after_step(3, loss=1.0, scale=1.0, skipped=False)      # 1.0: a run without a scaler, no alert
    assert [a.kind for a in watch.alerts] == ["skipped_run"]
    watch.after_step(4, loss=1.0, scale=0.5, skipped=False)
    watch.after_step(5, loss=math.nan, scale=0.5, skipped=False)
    assert [a.kind for a in watch.alerts] == ["skipped_run", "scale_collapse", "non_finite_loss"]
    with pytest.raises(ValueError, match="unknown alert kind"):
        watch.alerts_of("overflow")


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="no parameters"):
        mon.GradientHealthMonitor(nn.ReLU())
    with pytest.raises(ValueError, match="every"):
        mon.GradientHealthMonitor(nn.Linear(2, 2), every=0)
    with pytest.raises(ValueError, match="no parameter named"):
        mon.GradientHealthMonitor(nn.Linear(2, 2), layers=("weights",))
    with pytest.raises(TypeError):
        mon.GradientHealthMonitor("model")
    for bad in (dict(zero_fraction=0.0), dict(underflow_fraction=1.5), dict(min_scale=-1.0), dict(skipped_run=0)):
        with pytest.raises(ValueError):
            mon.Thresholds(**bad)
    with pytest.raises(ValueError, match="unknown fault"):
        mon.plant_fault(nn.Sequential(nn.Linear(2, 2)), "0", "explode")
    with pytest.raises(ValueError, match="no submodule"):
        mon.plant_fault(nn.Sequential(nn.Linear(2, 2)), "1", "nan")


# ---- the locator ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("layer", ["blocks.0.attn.qkv", "blocks.1.fc"])
@pytest.mark.parametrize("kind,phase", [("nan", "forward"), ("nan_backward", "backward")])
def test_the_locator_names_the_planted_layer(layer, kind, phase):
    setup = _setup(1)
    model = setup.model(0)
    mon.plant_fault(model, layer, kind)
    x, y = setup.sampler.batch(0, "cpu")
    with mon.NonFiniteLocator(model) as locator:
        model(x, y)[1].backward()
    assert locator.report is not None
    assert (locator.report.module, locator.report.phase) == (layer, phase)
    assert layer in locator.report.describe()


def test_the_locator_stays_quiet_on_a_healthy_step_and_removes_its_hooks():
    setup = _setup(1)
    model = setup.model(0)
    x, y = setup.sampler.batch(0, "cpu")
    with mon.NonFiniteLocator(model) as locator:
        model(x, y)[1].backward()
    assert locator.report is None
    assert all(not m._forward_hooks and not m._backward_hooks and not m._forward_pre_hooks
               for m in model.modules())


def _overflowing_attention(layer: int = 1):
    """The small course model with one attention layer's q and k so large that q @ k^T overflows FP16."""
    setup = _setup(1)
    model = setup.model(0)
    with torch.no_grad():
        model.blocks[layer].attn.qkv.weight.mul_(400)
    return model, setup.sampler.batch(0, "cpu")


def test_with_ops_the_locator_names_the_product_that_overflowed_fp16_inside_attention():
    model, (x, y) = _overflowing_attention()
    with mon.NonFiniteLocator(model, ops=True) as locator:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, y)[1]
    assert not torch.isfinite(loss)
    r = locator.report
    assert (r.op, r.module, r.phase) == ("matmul", "blocks.1.attn", "forward")
    assert [s.dtype for s in r.inputs] == ["float16", "float16"]
    assert all(s.nan == s.inf == 0 and s.max_abs < 65504 for s in r.inputs)   # q and k themselves fit
    assert r.outputs[0].inf > 0 and r.outputs[0].nan == 0                   # their product does not
    assert "`matmul` in `blocks.1.attn`" in r.describe()
    # without ops, the same step names the attention layer only (its softmax output, already NaN)
    with mon.NonFiniteLocator(model) as locator:
        with torch.autocast("cpu", dtype=torch.float16):
            model(x, y)
    assert (locator.report.module, locator.report.op) == ("blocks.1.attn", None)
    # in FP32 the same weights are finite: the overflow is FP16's range, not a bug in the model
    with mon.NonFiniteLocator(model, ops=True) as locator:
        assert torch.isfinite(model(x, y)[1])
    assert locator.report is None


def test_with_ops_a_deliberate_infinity_is_not_a_culprit_and_the_mode_is_removed():
    setup = _setup(1)
    model = setup.model(0)      # the causal mask fills -inf on every step: passed in, so not reported
    x, y = setup.sampler.batch(0, "cpu")
    with mon.NonFiniteLocator(model, ops=True) as locator:
        with torch.autocast("cpu", dtype=torch.float16):
            model(x, y)[1].backward()
        assert torch._C._is_torch_function_mode_enabled()
    assert locator.report is None
    assert not torch._C._is_torch_function_mode_enabled()
    with pytest.raises(TypeError, match="ops must be a bool"):
        mon.NonFiniteLocator(model, ops=1)


@pytest.mark.parametrize("kind,phase,op", [("nan", "forward", None), ("nan_backward", "backward", None),
                                           ("overflow", "forward", "mul")])
def test_with_ops_planted_faults_are_still_named_by_layer(kind, phase, op):
    setup = _setup(1)
    model = setup.model(0)
    mon.plant_fault(model, "blocks.1.fc", kind)
    x, y = setup.sampler.batch(0, "cpu")
    with mon.NonFiniteLocator(model, ops=True) as locator:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x, y)[1]
        loss.backward()
    r = locator.report
    assert (r.module, r.phase, r.op) == ("blocks.1.fc", phase, op)


# ---- checkpoints ---------------------------------------------------------------------------------------

def test_a_write_killed_halfway_leaves_the_last_good_checkpoint(tmp_path):
    path = tmp_path / "last_good.pt"
    recovery.save_checkpoint_atomic({"step": 1, "w": torch.ones(3)}, path)
    script = f"""
import os, torch
from course_lib import monitor
from course_lib.monitor import recovery
real_save = torch.save
def dying_save(obj, f, *a, **k):
    f.write(b"half a checkpoint")
    f.flush()
    os._exit(9)            # killed mid-write: no cleanup, no exception handling
torch.save = dying_save
recovery.save_checkpoint_atomic({{"step": 2, "w": torch.zeros(3)}}, {str(path)!r})
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert done.returncode == 9
    back = torch.load(path, weights_only=False)
    assert back["step"] == 1 and torch.equal(back["w"], torch.ones(3))
    # a plain torch.save to the same path would have left it corrupt
    with open(path, "wb") as fh:
        fh.write(b"half a checkpoint")
    with pytest.raises(Exception):
        torch.load(path, weights_only=False)


def test_an_interrupted_write_cleans_up_after_an_exception(tmp_path, monkeypatch):
    path = tmp_path / "ck.pt"
    recovery.save_checkpoint_atomic({"step": 1}, path)

    def failing_save(obj, f, *a, **k):
        f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(OSError):
        recovery.save_checkpoint_atomic({"step": 2}, path)
    monkeypatch.undo()
    assert torch.load(path, weights_only=False)["step"] == 1
    assert sorted(p.name for p in Path(tmp_path).iterdir()) == ["ck.pt"]


# ---- recovery -----------------------------------------------------------------------------------------

def _overflowing_run(tmp_path, *, recover: bool, steps: int = 14):
    from course_lib.train import TrainConfig, TrainState, get_recipe, train

    setup = _setup(steps)
    model = setup.model(0)
    mon.plant_fault(model, "blocks.0.fc", "overflow", after=4)
    state = TrainState(model, get_recipe("fp16_autocast_scaler", "cpu"), TrainConfig(steps=steps),
                       torch.device("cpu"))
    watch = mon.GradientHealthMonitor(model, every=5, thresholds=mon.Thresholds(skipped_run=4))
    if not recover:
        return train(state, setup.sampler, monitor=watch), watch, []
    run = recovery.train_with_recovery(state, setup.sampler, tmp_path / "ck.pt", monitor=watch,
                                  policy=recovery.RecoveryPolicy(checkpoint_every=2))
    return run.history, watch, run.events


def test_recovery_rolls_back_and_finishes_a_run_that_fails_without_it(tmp_path):
    history, watch, _ = _overflowing_run(tmp_path, recover=False)
    assert all(history.skipped[5:])                   # from the fault on, every step is skipped
    assert watch.alerts_of("skipped_run")
    history, watch, events = _overflowing_run(tmp_path, recover=True)
    # the first faulty step (the fault starts at the fifth forward, step 4) has an infinite loss
    assert len(events) == 1 and events[0].recipe == "bf16_autocast" and events[0].alert.kind == "non_finite_loss"
    assert events[0].step == 4
    assert events[0].rolled_back_to <= 4
    assert watch.log.steps[-1] == 13                   # it reached the end
    after = history.skipped[-(14 - events[0].rolled_back_to):]
    assert not any(after) and all(math.isfinite(v) for v in history.losses[-5:])


def test_recovery_policy_validates():
    with pytest.raises(ValueError, match="unknown alert kind"):
        recovery.RecoveryPolicy(triggers=("loss_spike",))
    with pytest.raises(ValueError, match="checkpoint_every"):
        recovery.RecoveryPolicy(checkpoint_every=0)


def test_the_lesson_experiments_run_small():
    profile = size_profile("cpu")
    hunt = monitoring_studies.nan_hunt(profile, layer="blocks.1.fc", kind="nan", repeats=1)
    assert hunt.report.module == "blocks.1.fc" and hunt.report.phase == "forward"
    assert hunt.anomaly is not None and "LogSoftmaxBackward" in hunt.anomaly     # where it surfaced, not where made
    demo = monitoring_studies.overflow_recovery(profile, steps=8, fault_at=3)
    assert all(demo.without.skipped[3:]) and len(demo.events) == 1
    assert demo.with_recovery.steps[-1] == 7 and not any(demo.with_recovery.skipped[-3:])
    with pytest.raises(ValueError, match="fault_at"):
        monitoring_studies.overflow_recovery(profile, steps=8, fault_at=8)
    cost = monitoring_studies.monitor_overhead(profile, steps=2, rounds=2)
    assert set(cost.seconds) == {0, 1, 10} and all(v > 0 for v in cost.seconds.values())
    assert cost.transfers_per_sample == 1.0       # the statistics reach the host once per sampled step
    assert all(len(v) == 2 for v in cost.rounds.values())
    assert cost.noise() == abs(cost.rounds[0][1] / cost.rounds[0][0] - 1)
    lo, hi = cost.overhead_range(1)
    each = [m / n - 1 for m, n in zip(cost.rounds[1], cost.rounds[0])]
    assert (lo, hi) == (min(each), max(each))
    with pytest.raises(ValueError, match="every=5"):
        cost.overhead_range(5)
    with pytest.raises(ValueError, match="kind"):
        monitoring_studies.nan_hunt(profile, kind="overflow")


def test_anomaly_mode_sees_nan_but_not_inf():
    assert mon.anomaly_mode_raises(math.nan) and not mon.anomaly_mode_raises(math.inf)


def test_anomaly_mode_flags_a_forward_overflow_late_at_the_loss():
    """The recovery section's FP16 forward overflow: anomaly mode, which checks backward outputs only, names
    the first backward function that returned a NaN (the loss's log-softmax), not the layer that overflowed;
    the same model without the fault raises nothing."""
    profile = size_profile("cpu")
    message = monitoring_studies.anomaly_on_forward_overflow(profile)
    assert message is not None and "LogSoftmaxBackward" in message and "fc" not in message
    from unittest import mock
    with mock.patch.object(monitoring_studies, "plant_fault"):   # no fault planted: a healthy FP16 step
        assert monitoring_studies.anomaly_on_forward_overflow(profile) is None


def test_matmul_stats_classify_each_operand_and_scaling_moves_them_into_range():
    setup = _setup(1)
    model = setup.model(0)
    x, y = setup.sampler.batch(0, "cpu")
    unscaled = mon.matmul_stats(model, lambda m: m(x, y), "FP8 E4M3")
    scaled = mon.matmul_stats(model, lambda m: m(x, y), "FP8 E4M3", scaled=True)
    linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
    assert [(r.layer, r.operand) for r in unscaled] == [(n, o) for n in linears for o in ("input", "weight")]
    weight = next(r for r in unscaled if r.layer == "blocks.0.fc" and r.operand == "weight")
    exact = mon.gradient_stats("w", model.blocks[0].fc.weight.detach(), "FP8 E4M3")
    assert (weight.flush, weight.subnormal) == (exact.flush, exact.subnormal) and weight.subnormal > 0.1
    assert max(r.flush + r.subnormal for r in scaled) < max(r.flush + r.subnormal for r in unscaled) / 10
    assert all(r.scale == 448.0 / float(model.get_submodule(r.layer).weight.abs().max())
               for r in scaled if r.operand == "weight")
    with pytest.raises(ValueError, match="no linear layers"):
        mon.matmul_stats(nn.ReLU(), lambda m: m(torch.ones(2)))


def test_a_dead_layer_is_flagged_while_the_loss_falls():
    run = monitoring_studies.dead_layer_run(size_profile("cpu"), steps=10, dies_at=4, every=2)
    zero = {a.layer: a.step for a in run.alerts if a.kind == "zero_gradients"}
    assert zero.get("blocks.1.fc.weight") == 4 and zero.get("blocks.1.fc.bias") == 4
    assert not any(layer.startswith("blocks.0") for layer in zero)
    assert run.log.losses[-1] < run.log.losses[4]
    with pytest.raises(ValueError, match="dies_at"):
        monitoring_studies.dead_layer_run(size_profile("cpu"), steps=10, dies_at=0)


def test_activation_gradients_are_watched_and_the_hooks_removed():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    watch = mon.GradientHealthMonitor(model, every=1, activations=True)
    x = torch.randn(16, 4)
    out = model(x)
    (out * 1e-9).sum().backward()          # an output gradient of 1e-9: FP16 flushes all of it
    stats = {s.name: s for s in watch.after_backward(0, scale=1.0)}
    assert stats["2:grad_output"].flush == 1.0 and stats["2:grad_output"].numel == 32
    assert any(a.layer == "2:grad_output" for a in watch.alerts_of("underflow"))
    watch.close()
    assert all(not m._backward_hooks for m in model.modules())
    assert watch.after_backward(1, scale=1.0) is not None and not any(
        s.name.endswith(":grad_output") for s in watch.log.gradients[-1])


def test_underflow_of_the_output_gradient_grows_as_training_goes_well():
    trend = monitoring_studies.underflow_trend(size_profile("cpu"), steps=60, every=20)
    head = trend.flush["head:grad_output"]
    assert head[-1] > head[0] + 0.02 and trend.losses[-1] < trend.losses[0]
    # the result keeps the threshold its alerts used; at 100% (every non-zero value flushed) none fires here
    assert trend.threshold == 0.1 and any(a.kind == "underflow" for a in trend.alerts)
    never = monitoring_studies.underflow_trend(size_profile("cpu"), steps=20, every=20, threshold=1.0)
    assert never.threshold == 1.0 and not any(a.kind == "underflow" for a in never.alerts)


def test_diagnose_walks_the_procedure_to_the_planted_overflow():
    setup = _setup(1)
    x, y = setup.sampler.batch(0, "cpu")

    def build():
        model = setup.model(0)
        mon.plant_fault(model, "blocks.0.fc", "overflow")
        return model

    result = mon.diagnose(build, lambda m, b: m(*b)[1], (x, y))
    answers = dict(result.steps)
    assert answers["Does it fail in FP32 too?"].startswith("No")
    assert answers["Does it fail under FP16 autocast?"].startswith("Yes")
    assert "`blocks.0.fc` in the forward pass" in answers["Where is the first non-finite value?"]
    assert answers["Does BF16 autocast run it?"].startswith("Yes")
    assert "blocks.0.fc" in result.verdict and "BF16" in result.verdict
    # the fix as code a reader can paste (Markdown would curl the quotes of plain text)
    assert "(`monitor.keep_in_fp32(model, 'blocks.0.fc')`: autocast off, FP32 inputs)" in result.verdict
    healthy = mon.diagnose(lambda: setup.model(0), lambda m, b: m(*b)[1], (x, y))
    assert "runs this step" in healthy.verdict
    with pytest.raises(ValueError, match="dtype"):
        mon.diagnose(build, lambda m, b: m(*b)[1], (x, y), dtype=torch.float32)


def test_recovery_can_keep_the_failing_layer_in_fp32_instead(tmp_path):
    from course_lib.train import TrainConfig, TrainState, get_recipe

    setup = _setup(10)
    model = setup.model(0)
    mon.plant_fault(model, "blocks.0.fc", "overflow", after=3)
    state = TrainState(model, get_recipe("fp16_autocast_scaler", "cpu"), TrainConfig(steps=10), torch.device("cpu"))
    run = recovery.train_with_recovery(state, setup.sampler, tmp_path / "ck.pt",
                                  policy=recovery.RecoveryPolicy(keep_fp32=("blocks.0.fc",), checkpoint_every=1))
    assert len(run.events) == 1 and run.events[0].recipe == "fp16_autocast_scaler with blocks.0.fc in FP32"
    assert isinstance(run.state.model.blocks[0].fc, recovery.Fp32Island)
    assert run.state.recipe.name == "fp16_autocast_scaler"
    assert not any(run.history.skipped[-5:]) and all(math.isfinite(v) for v in run.history.losses[-5:])
    with pytest.raises(ValueError, match="keep_fp32"):
        recovery.RecoveryPolicy(keep_fp32="blocks.0.fc")
    fresh = TrainState(setup.model(0), get_recipe("fp16_autocast_scaler", "cpu"), TrainConfig(steps=2),
                       torch.device("cpu"))
    with pytest.raises(ValueError, match="no module named"):
        recovery.train_with_recovery(fresh, setup.sampler, tmp_path / "x.pt",
                                policy=recovery.RecoveryPolicy(keep_fp32=("blocks.9.fc",)))


# ---- names without the wrappers' `.module` --------------------------------------------------------------

def test_names_leave_out_each_wrappers_module_segment():
    model = nn.Sequential(nn.Linear(2, 3), nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 1)))
    mon.plant_fault(model, "1.0", "dead")
    recovery.keep_in_fp32(model, "1.0")          # an island around the fault: two `.module` segments
    raw = [n for n, _ in model.named_parameters()]
    assert "1.0.module.module.weight" in raw
    assert [mon.unwrapped_name(model, n) for n in raw] == ["0.weight", "0.bias", "1.0.weight", "1.0.bias",
                                                           "1.1.weight", "1.1.bias"]
    assert mon.unwrapped_name(model, "1.0.module.module") == "1.0"     # a module's name too
    assert mon.unwrapped_name(model, "1.1.weight") == "1.1.weight"     # nothing wrapped: unchanged
    wrapped_root = recovery.Fp32Island(nn.Linear(2, 2))
    assert mon.unwrapped_name(wrapped_root, "module.bias") == "bias"
    watch = mon.GradientHealthMonitor(model, every=1, activations=True)
    assert [n for n, _ in watch.params] == ["0.weight", "0.bias", "1.0.weight", "1.0.bias", "1.1.weight", "1.1.bias"]
    model(torch.ones(4, 2, requires_grad=True)).sum().backward()
    names = [s.name for s in watch.after_backward(0)]
    watch.close()
    assert "1.0:grad_output" in names and not any(".module" in n for n in names)
    # `layers` takes either spelling and reports the reader's
    for spelling in ("1.0.weight", "1.0.module.module.weight"):
        assert [n for n, _ in mon.GradientHealthMonitor(model, layers=(spelling,)).params] == ["1.0.weight"]
    with pytest.raises(ValueError, match="no parameter named '1.0.module.weight'"):
        mon.GradientHealthMonitor(model, layers=("1.0.module.weight",))
    # the operand statistics and the locator name layers the same way
    assert [r.layer for r in mon.matmul_stats(model, lambda m: m(torch.ones(4, 2)))][::2] == ["0", "1.0", "1.1"]
    with torch.no_grad():
        model[1][0].module.module.weight.fill_(math.nan)     # a NaN made inside the wrapped layer itself
    with mon.NonFiniteLocator(model) as locator:
        model(torch.ones(4, 2))
    assert (locator.report.module, locator.report.phase) == ("1.0", "forward")
    with pytest.raises(TypeError, match="nn.Module"):
        mon.unwrapped_name("model", "x")
    with pytest.raises(TypeError, match="str"):
        mon.unwrapped_name(model, 3)
    with pytest.raises(TypeError, match="nn.Module"):
        mon.ModuleWrapper(lambda x: x)


# ---- a skipped step, read from the scale ---------------------------------------------------------------

def _scaler_step(scaler, model, optimizer, *, poison: bool):
    """One step of a reader's loop: backward, an inf planted in one gradient if ``poison``, step, update.
    Returns (skipped as the scale says, whether the optimizer actually stepped)."""
    steps_before = optimizer.state[model.weight]["step"].item() if optimizer.state else 0
    optimizer.zero_grad()
    scaler.scale((model(torch.ones(4, 3)) ** 2).mean()).backward()
    if poison:
        model.weight.grad[0, 0] = math.inf
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    stepped = (optimizer.state[model.weight]["step"].item() if optimizer.state else 0) > steps_before
    return mon.step_was_skipped(before, scaler.get_scale()), stepped


def test_a_fall_of_the_scale_is_a_skipped_step_and_nothing_else_is():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=2)
    weight = model.weight.detach().clone()
    # an inf gradient: torch skips the step (weights untouched, AdamW's counter unmoved) and halves the scale
    assert _scaler_step(scaler, model, optimizer, poison=True) == (True, False)
    assert torch.equal(model.weight.detach(), weight) and scaler.get_scale() == 2.0**7
    assert _scaler_step(scaler, model, optimizer, poison=False) == (False, True)     # a good step
    assert not torch.equal(model.weight.detach(), weight)
    assert _scaler_step(scaler, model, optimizer, poison=False) == (False, True)     # the scale grows: not a skip
    assert scaler.get_scale() == 2.0**8
    assert _scaler_step(scaler, model, optimizer, poison=True) == (True, False)
    off = torch.amp.GradScaler("cpu", enabled=False)                               # a disabled scaler never skips
    assert _scaler_step(off, model, optimizer, poison=False) == (False, True)


def test_the_lessons_plain_loop_logs_the_skipped_step():
    """The lesson's recipe: a reader's loop with its own GradScaler calls the monitor and reads the skip from
    the scale; the monitor's log agrees with what the optimizer did, and the skipped inf raises no alert."""
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    watch = mon.GradientHealthMonitor(model, every=1)
    stepped = []
    for step in range(4):
        optimizer.zero_grad()
        loss = (model(torch.ones(4, 3)) ** 2).mean()
        scaler.scale(loss).backward()
        if step == 2:
            model.bias.grad[0] = math.inf
        before = scaler.get_scale()
        watch.after_backward(step, scale=before)
        count = optimizer.state[model.weight]["step"].item() if optimizer.state else 0
        scaler.step(optimizer)
        scaler.update()
        stepped.append(optimizer.state[model.weight]["step"].item() > count)
        watch.after_step(step, loss=loss.item(), scale=before,
                         skipped=mon.step_was_skipped(before, scaler.get_scale()))
    assert watch.log.skipped == [False, False, True, False] == [not s for s in stepped]
    assert watch.log.scales == [2.0**8, 2.0**8, 2.0**8, 2.0**7]
    assert watch.log.gradients[2][1].non_finite == 1 and watch.alerts_of("non_finite_gradient") == []


@pytest.mark.parametrize("before, after, error", [
    (True, 1.0, TypeError), ("1", 1.0, TypeError), (1.0, None, TypeError),
    (-1.0, 1.0, ValueError), (1.0, math.inf, ValueError), (math.nan, 1.0, ValueError),
    (0.0, 0.0, ValueError),
])
def test_step_was_skipped_refuses_what_it_cannot_read(before, after, error):
    with pytest.raises(error, match="scale"):
        mon.step_was_skipped(before, after)


# ---- random states a rollback restores ------------------------------------------------------------------

def test_rng_states_without_cuda_hold_the_cpu_state_only():
    torch.manual_seed(3)
    saved = device_rng.rng_states()
    first = torch.rand(3)
    torch.rand(5)
    device_rng.restore_rng_states(saved)
    assert torch.equal(torch.rand(3), first)
    if not torch.cuda.is_available():
        assert saved["cuda_rng"] is None
        with pytest.raises(ValueError, match="CUDA is not in use"):
            device_rng.restore_rng_states({**saved, "cuda_rng": [torch.zeros(4, dtype=torch.uint8)]})
    with pytest.raises(ValueError, match="'rng'"):
        device_rng.restore_rng_states({"cuda_rng": None})


def test_a_rollback_restores_the_cuda_random_state_of_the_last_good_checkpoint(tmp_path, monkeypatch):
    """With CUDA in use (torch's queries replaced), every checkpoint keeps every device's CUDA random state and
    the rollback sets the one of the checkpoint it went back to, not the one at the failing step."""
    drawn, restored = [], []

    def get_rng_state_all():
        drawn.append([torch.tensor([len(drawn)], dtype=torch.uint8), torch.tensor([100 + len(drawn)], dtype=torch.uint8)])
        return drawn[-1]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)   # asked by the optimizers
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", get_rng_state_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    from course_lib.train import TrainConfig, TrainState, get_recipe

    setup = _setup(8)
    model = setup.model(0)
    mon.plant_fault(model, "blocks.0.fc", "overflow", after=5)
    state = TrainState(model, get_recipe("fp16_autocast_scaler", "cpu"), TrainConfig(steps=8), torch.device("cpu"))
    saves = []
    real_save = recovery.save_checkpoint_atomic
    monkeypatch.setattr(recovery, "save_checkpoint_atomic", lambda st, path: saves.append(st["step"]) or real_save(st, path))
    run = recovery.train_with_recovery(state, setup.sampler, tmp_path / "ck.pt",
                                       policy=recovery.RecoveryPolicy(checkpoint_every=2))
    assert len(run.events) == 1 and len(restored) == 1
    # a checkpoint at the start and after every 2 good steps; the fault's first step (5) rolls back to step 4's
    assert saves[:3] == [0, 2, 4] and run.events[0].step == 5 and run.events[0].rolled_back_to == 4
    assert len(drawn) == len(saves)                        # each checkpoint kept the CUDA states once
    assert [int(t) for t in restored[0]] == [int(t) for t in drawn[2]] == [2, 102]


def test_a_fault_that_survives_the_fallback_triggers_the_next_recovery(tmp_path):
    # a NaN planted in the forward pass is NaN in BF16 too: after the first rollback the same alert
    # (non-finite loss, no layer) comes again, and must use the second recovery the policy allows
    from course_lib.train import TrainConfig, TrainState, get_recipe

    setup = _setup(8)
    model = setup.model(0)
    mon.plant_fault(model, "blocks.0.fc", "nan", after=3)
    state = TrainState(model, get_recipe("fp16_autocast_scaler", "cpu"), TrainConfig(steps=8), torch.device("cpu"))
    watch = mon.GradientHealthMonitor(model, every=1)
    run = recovery.train_with_recovery(state, setup.sampler, tmp_path / "ck.pt", monitor=watch,
                                       policy=recovery.RecoveryPolicy(max_recoveries=2, checkpoint_every=1))
    assert [e.alert.kind for e in run.events] == ["non_finite_loss", "non_finite_loss"]
    assert [e.recipe for e in run.events] == ["bf16_autocast", "bf16_autocast"]
    assert run.events[1].step == run.events[0].step == 3   # the fault fires again on the same step
    # the alert log keeps each: two that were recovered from, and a third with no recovery left
    assert len(watch.alerts_of("non_finite_loss")) == 3


def test_rearm_lets_each_alert_be_raised_again():
    model = nn.Linear(4, 2)
    watch = mon.GradientHealthMonitor(model, every=1)
    watch._alert(0, "non_finite_loss", None, "x")
    watch._alert(1, "non_finite_loss", None, "x")
    assert len(watch.alerts) == 1
    watch.rearm()
    watch._alert(2, "non_finite_loss", None, "x")
    assert [a.step for a in watch.alerts] == [0, 2]
