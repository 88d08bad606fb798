"""Lesson 4's production loop, run: the plain loops of the lesson run here against torch (two optimizers on one
scaler, accumulation, resuming, an FP32 module, TensorBoard), and the facts, phrases and tables computed from
results built by hand with known numbers, branch by branch."""

import io
import math

import pytest
import torch
import torch.nn.functional as F
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter

from course_lib.glue import Prose
from course_lib.monitor import GradientHealthMonitor, MonitorLog, gradient_stats, step_was_skipped
from course_lib.studies import production as P

CPU = torch.device("cpu")


# -- the plumbing ---------------------------------------------------------------------------------------


def test_tiny_regression_is_deterministic_and_checks_its_arguments():
    a, b = P.tiny_regression(batches=3, seed=0), P.tiny_regression(batches=3, seed=0)
    assert len(a.batches) == 3 and a.batches[0][0].shape == (8, 16) and a.batches[0][1].shape == (8, 16)
    assert all(torch.equal(x, y) for pa, pb in zip(a.batches, b.batches) for x, y in zip(pa, pb))
    assert not torch.equal(a.batches[0][0], P.tiny_regression(batches=1, seed=1).batches[0][0])
    assert not torch.equal(a.batches[0][0], a.batches[1][0])
    for bad in ({"batches": 0}, {"batches": True}, {"batches": 2, "width": 0}, {"batches": 2, "lr": -1.0},
                {"batches": 2, "lr": math.inf}):
        with pytest.raises(ValueError):
            P.tiny_regression(**bad)


def test_fresh_objects_start_as_a_training_script_does():
    task = P.tiny_regression(batches=1)
    (m0, opt, scaler), (m0_again, _, _), (m1, _, _) = task.fresh(0), task.fresh(0), task.fresh(1)
    assert all(torch.equal(p, q) for p, q in zip(m0.parameters(), m0_again.parameters()))
    assert not torch.equal(m0.layers[0].weight, m1.layers[0].weight)
    assert scaler.get_scale() == torch.amp.GradScaler("cpu").get_scale() == 2.0 ** 16
    assert isinstance(opt, torch.optim.AdamW) and opt.param_groups[0]["lr"] == task.lr
    assert opt.param_groups[0]["params"][0] is next(m0.parameters())


def test_full_batch_gradient_is_the_mean_of_the_micro_batch_gradients():
    """An identity of the mean loss over equal batches, in FP32: it fails if the batches are not concatenated
    or the loss is summed."""
    task = P.tiny_regression(batches=2)
    model, _, _ = task.fresh()
    weights = model.state_dict()
    full = task.gradients(weights, task.batches)
    halves = [task.gradients(weights, [b]) for b in task.batches]
    assert set(full) == {n for n, _ in model.named_parameters()}
    for name, g in full.items():
        torch.testing.assert_close(g, (halves[0][name] + halves[1][name]) / 2, rtol=1e-5, atol=1e-7)
    low = task.gradients(weights, task.batches, torch.bfloat16)
    assert all(g.dtype == torch.float32 for g in low.values())
    assert not all(torch.equal(low[n], full[n]) for n in full)    # autocast rounded something
    with pytest.raises(ValueError, match="empty"):
        task.gradients(weights, [])


def test_tiny_gan_is_seeded_and_leaves_the_callers_rng_alone():
    before = torch.random.get_rng_state()
    a, b = P.TinyGAN(seed=0), P.TinyGAN(seed=0)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert torch.equal(a.generator.weight, b.generator.weight)
    assert not torch.equal(a.generator.weight, P.TinyGAN(seed=1).generator.weight)
    real, noise = a.batch(3)
    assert real.shape == (16, 2) and noise.shape == (16, 4) and torch.equal(real, b.batch(3)[0])
    loss_d, loss_g = a.losses(0)
    assert loss_d.ndim == loss_g.ndim == 0 and math.isfinite(loss_d.item()) and loss_d.item() > 0
    loss_d.backward()
    assert a.generator.weight.grad is None      # the discriminator's loss sees detached generated points
    with pytest.raises(ValueError, match="noise_dim"):
        P.TinyGAN(noise_dim=0)


def test_steps_taken_counts_only_the_steps_that_ran():
    w = torch.nn.Parameter(torch.ones(3))
    opt, scaler = torch.optim.AdamW([w]), torch.amp.GradScaler("cpu")
    assert P.steps_taken(opt) == 0
    for grad in (1.0, math.inf, 1.0):
        scaler.scale((w * grad).sum()).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
    assert P.steps_taken(opt) == 2
    with pytest.raises(TypeError, match="SGD"):
        P.steps_taken(torch.optim.SGD([w], lr=0.1))


def test_weights_and_gradients_are_copies():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    model[1].weight.requires_grad_(False)
    model(torch.ones(1, 2)).sum().backward()
    snap = P.weights_and_gradients(model)
    assert set(snap.weights) == {"0.weight", "0.bias", "1.weight", "1.bias"}
    assert set(snap.gradients) == {"0.weight", "0.bias", "1.bias"}
    with torch.no_grad():
        model[0].weight.add_(1.0)
    model[0].weight.grad.zero_()
    assert not torch.equal(snap.weights["0.weight"], model[0].weight)
    assert snap.gradients["0.weight"].abs().sum() > 0
    with pytest.raises(TypeError, match="nn.Module"):
        P.weights_and_gradients({"w": torch.ones(1)})


# -- two optimizers, one scaler -------------------------------------------------------------------------


def _gan_loop(spike_at, steps=4, watch=None):
    """The lesson's loop; ``watch``: a step after which to return copies of both models' parameters."""
    gan, scaler = P.TinyGAN(CPU), torch.amp.GradScaler("cpu")
    seen = {}
    for step in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss_d, loss_g = gan.losses(step)
        spike = 1e38 if step == spike_at else 1.0
        scaler.scale(loss_d * spike).backward(inputs=gan.d_params)
        scaler.scale(loss_g).backward(inputs=gan.g_params)
        if step == watch:
            seen["before"] = [p.detach().clone() for p in gan.d_params + gan.g_params]
        scaler.step(gan.opt_d)
        scaler.step(gan.opt_g)
        scaler.update()
        gan.zero_grad()
        if step == watch:
            seen["after"] = [p.detach().clone() for p in gan.d_params + gan.g_params]
    return gan, scaler, seen


def test_one_overflowing_optimizer_skips_alone_and_the_scale_backs_off_once():
    gan, scaler, seen = _gan_loop(spike_at=2, watch=2)
    n_d = len(gan.d_params)
    assert (P.steps_taken(gan.opt_d), P.steps_taken(gan.opt_g)) == (3, 4)
    assert scaler.get_scale() == 2.0 ** 16 * scaler.get_backoff_factor()
    assert all(torch.equal(a, b) for a, b in zip(seen["before"][:n_d], seen["after"][:n_d]))   # D skipped
    assert not all(torch.equal(a, b) for a, b in zip(seen["before"][n_d:], seen["after"][n_d:]))
    # the generator's step at the spike is the step it takes when nothing overflows, bit for bit
    calm, calm_scaler, calm_seen = _gan_loop(spike_at=None, watch=2)
    assert all(torch.equal(a, b) for a, b in zip(seen["after"][n_d:], calm_seen["after"][n_d:]))
    assert (P.steps_taken(calm.opt_d), calm_scaler.get_scale()) == (4, 2.0 ** 16)


def _facts(**kw):
    args = dict(steps=4, d_steps=3, g_steps=4, initial_scale=65536.0, final_scale=32768.0, backoff_factor=0.5,
                growth_factor=2.0)
    return P.shared_scaler_facts(**{**args, **kw})


def test_shared_scaler_facts_name_what_the_run_showed():
    facts = _facts()
    verdict = facts.pop("gan_verdict")
    assert facts == {"gan_steps": 4, "gan_d_steps": 3, "gan_g_steps": 4, "gan_scale_start": 65536.0,
                     "gan_scale_end": 32768.0, "gan_backoffs": 1}
    assert isinstance(verdict, Prose) and verdict.startswith("only the optimizer whose gradients overflowed")
    assert "nothing was tested" in _facts(d_steps=4, final_scale=65536.0)["gan_verdict"]
    assert "generator skipped 1 step too" in _facts(g_steps=3)["gan_verdict"]
    twice = _facts(final_scale=16384.0)
    assert twice["gan_backoffs"] == 2 and "not once per overflowing iteration" in twice["gan_verdict"]
    assert "skipped 2 steps and the generator none" in _facts(d_steps=2, final_scale=16384.0)["gan_verdict"]
    assert _facts(d_steps=4, final_scale=131072.0)["gan_backoffs"] == -1


def test_shared_scaler_facts_refuse_impossible_counts():
    for bad in ({"d_steps": 5}, {"g_steps": -1}, {"steps": 0}, {"backoff_factor": 2.0}, {"final_scale": 0.0}):
        with pytest.raises(ValueError):
            _facts(**bad)


# -- gradient accumulation ------------------------------------------------------------------------------


def _accumulate(divide=True, accumulation_steps=4):
    task = P.tiny_regression(CPU, batches=8)
    model, opt, scaler = task.fresh()
    kept = []
    for i, (x, y) in enumerate(task.batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss / accumulation_steps if divide else loss).backward()
        if (i + 1) % accumulation_steps == 0:
            scaler.unscale_(opt)
            kept.append(P.weights_and_gradients(model))
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    return task, opt, scaler, kept


def test_accumulated_gradient_is_the_full_batch_gradient_to_rounding():
    task, opt, scaler, kept = _accumulate()
    check = P.check_accumulation(kept, task, 4, torch.bfloat16)
    assert 0 < check.max_difference < 0.01 * check.largest_gradient
    assert 0 < check.autocast_error and check.accumulated_error <= 2 * check.autocast_error
    facts = P.accumulation_facts(check, micro_batches=8, accumulation_steps=4, optimizer_steps=P.steps_taken(opt),
                                 scaler_updates=scaler.state_dict()["_growth_tracker"])
    assert (facts["acc_optimizer_steps"], facts["acc_updates"], facts["acc_boundaries"]) == (2, 2, 2)
    assert facts["acc_verdict"].endswith("accumulating added no error beyond autocast's own rounding")
    assert facts["acc_update_verdict"] == "once per boundary"


def test_forgetting_the_division_is_caught():
    task, _, _, kept = _accumulate(divide=False)
    check = P.check_accumulation(kept, task, 4, torch.bfloat16)
    assert check.accumulated_error > 100 * check.autocast_error
    facts = P.accumulation_facts(check, micro_batches=8, accumulation_steps=4, optimizer_steps=2, scaler_updates=2)
    assert facts["acc_verdict"].startswith("**accumulating added error beyond")


def test_check_accumulation_refuses_what_it_cannot_compare():
    task, _, _, kept = _accumulate()
    with pytest.raises(ValueError, match="empty"):
        P.check_accumulation([], task, 4, torch.bfloat16)
    with pytest.raises(ValueError, match="need 12 batches"):
        P.check_accumulation(kept + kept[:1], task, 4, torch.bfloat16)
    odd = P.WeightsAndGradients(kept[0].weights, {"layers.0.weight": kept[0].gradients["layers.0.weight"]})
    with pytest.raises(ValueError, match="different parameters"):
        P.check_accumulation([odd], task, 4, torch.bfloat16)


def test_accumulation_facts_branch_by_branch():
    same = P.accumulation_facts(P.AccumulationCheck(1e-4, 1e-4, 1e-4, 0.02), micro_batches=8, accumulation_steps=4,
                                optimizer_steps=2, scaler_updates=2)
    assert same["acc_relative"] == pytest.approx(5e-3) and same["acc_max_diff"] == 1e-4
    assert same["acc_error"] == same["acc_autocast_error"] == 1e-4
    assert isinstance(same["acc_verdict"], Prose) and same["acc_verdict"].startswith("the accumulated gradient is no")
    close = P.accumulation_facts(P.AccumulationCheck(1e-4, 2e-4, 1e-4, 0.02), micro_batches=8, accumulation_steps=4,
                                 optimizer_steps=2, scaler_updates=2)["acc_verdict"]
    assert close.startswith("the two errors are of one size")
    assert close.endswith("no error beyond autocast's own rounding")
    beyond = P.accumulation_facts(P.AccumulationCheck(1e-3, 3e-4, 1e-4, 0.02), micro_batches=8, accumulation_steps=4,
                                  optimizer_steps=2, scaler_updates=8)
    assert beyond["acc_verdict"].startswith("**accumulating added error beyond autocast's own rounding**")
    assert beyond["acc_update_verdict"] == "**not once per boundary**: 8 updates and 2 optimizer steps for 2 boundaries"
    off = P.accumulation_facts(P.AccumulationCheck(1e-9, 1e-9, 0.0, 0.02), micro_batches=4, accumulation_steps=4,
                               optimizer_steps=1, scaler_updates=1)
    assert "no yardstick" in off["acc_verdict"] and off["acc_update_verdict"] == "once per boundary"
    for bad in ({"micro_batches": 6}, {"accumulation_steps": 0}, {"scaler_updates": -1}):
        with pytest.raises(ValueError):
            P.accumulation_facts(P.AccumulationCheck(0, 0, 0, 1), **{**dict(micro_batches=8, accumulation_steps=4,
                                                                             optimizer_steps=2, scaler_updates=2),
                                                                      **bad})
    with pytest.raises(ValueError, match="finite"):
        P.accumulation_facts(P.AccumulationCheck(math.nan, 0, 0, 1), micro_batches=8, accumulation_steps=4,
                             optimizer_steps=2, scaler_updates=2)


# -- resuming -------------------------------------------------------------------------------------------


def _train_steps(model, opt, scaler, batches):
    log = []
    for x, y in batches:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y, reduction="sum")
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        log.append((loss.item(), scale, step_was_skipped(scale, scaler.get_scale())))
    return log


def _resume(restore_scaler, run, first, checkpoint, split):
    model, opt, scaler = run.fresh(seed=1)
    model.load_state_dict(checkpoint["model"])
    opt.load_state_dict(checkpoint["optimizer"])
    if restore_scaler:
        scaler.load_state_dict(checkpoint["scaler"])
    return first + _train_steps(model, opt, scaler, run.batches[split:])


def test_resuming_with_the_scalers_state_reproduces_the_run_and_without_it_skips_again():
    run, split = P.tiny_regression(CPU, batches=12, batch_size=64), 6
    whole = _train_steps(*run.fresh(), run.batches)
    model, opt, scaler = run.fresh()
    first = _train_steps(model, opt, scaler, run.batches[:split])
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict()}, buffer)
    buffer.seek(0)
    checkpoint = torch.load(buffer)
    resumed, forgot = _resume(True, run, first, checkpoint, split), _resume(False, run, first, checkpoint, split)
    assert resumed == whole                                      # losses, scales, skips: bit for bit
    assert any(s for _, _, s in whole[:split]) and whole[split][1] < 2.0 ** 16   # it had backed off
    assert forgot[split][1] == 2.0 ** 16 and forgot != whole
    facts = P.resume_facts(whole, resumed, forgot, split)
    assert facts["resume_identical"].startswith("identical, bit for bit")
    assert facts["forgot_extra_skips"] > 0 and facts["forgot_max_loss_diff"] > 0


def _log(*entries):
    return [tuple(e) for e in entries]


WHOLE = _log((4.0, 8.0, True), (3.5, 4.0, False), (3.0, 4.0, False), (2.5, 4.0, False))


def test_resume_facts_branch_by_branch():
    forgot = _log(*WHOLE[:2], (3.0, 16.0, True), (2.75, 8.0, True))
    facts = P.resume_facts(WHOLE, list(WHOLE), forgot, 2)
    verdict = facts.pop("forgot_verdict")
    assert facts == {"resume_identical": "identical, bit for bit: the same loss, scale and skip at every step",
                     "resume_steps": 4, "resume_split": 2,
                     "resume_scale": 4.0, "forgot_scale": 16.0, "resume_skipped_after": 0, "forgot_skipped_after": 2,
                     "forgot_extra_skips": 2, "forgot_max_loss_diff": 0.25}
    assert verdict.startswith("the run without it skipped 2 more steps than")
    one_more = _log(*WHOLE[:2], (3.0, 16.0, True), (2.75, 8.0, False))
    assert "skipped 1 more step than" in P.resume_facts(WHOLE, WHOLE, one_more, 2)["forgot_verdict"]
    changed = _log(*WHOLE[:3], (2.5 + 2 ** -20, 4.0, False))
    assert P.resume_facts(WHOLE, changed, changed, 2)["resume_identical"].startswith("**different**")
    assert "skipped no extra step, but its losses differ" in P.resume_facts(WHOLE, WHOLE, changed, 2)["forgot_verdict"]
    same_losses = _log(*WHOLE[:2], (3.0, 16.0, False), (2.5, 16.0, False))
    assert "does not show the cost" in P.resume_facts(WHOLE, WHOLE, same_losses, 2)["forgot_verdict"]


def test_resume_table_and_its_checks():
    forgot = _log(*WHOLE[:2], (3.0, 16384.0, True), (2.75, 8192.0, False))
    assert P.resume_table(WHOLE, WHOLE, forgot, 2).splitlines() == [
        "| step | uninterrupted: loss at scale | resumed with the scaler's state | resumed without it |",
        "|---|---|---|---|",
        "| 2 | 3.0000 at 4 | 3.0000 at 4 | 3.0000 at 16,384 (skipped) |",
        "| 3 | 2.5000 at 4 | 2.5000 at 4 | 2.7500 at 8,192 |"]
    with pytest.raises(ValueError, match="different lengths"):
        P.resume_table(WHOLE, WHOLE[:3], WHOLE, 2)
    with pytest.raises(ValueError, match="inside the run"):
        P.resume_facts(WHOLE, WHOLE, WHOLE, 4)
    with pytest.raises(ValueError, match=r"\(loss, scale, skipped\)"):
        P.resume_facts(WHOLE, [e[:2] for e in WHOLE], WHOLE, 1)


# -- one module in FP32 ---------------------------------------------------------------------------------


class _Fallback(torch.nn.Module):
    """The lesson's wrapper."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        with torch.autocast(x.device.type, enabled=False):
            return self.inner(x.float())


def test_the_fallback_runs_its_module_in_fp32_and_without_the_cast_torch_refuses():
    head, seen = torch.nn.Linear(16, 4), []
    head.register_forward_hook(lambda module, args, out: seen.append((args[0].dtype, out.dtype)))
    body, x = torch.nn.Linear(16, 16), torch.randn(8, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        outputs = [head(body(x)).dtype, _Fallback(head)(body(x)).dtype]   # what flows on after the module
        low = body(x)
        with torch.autocast("cpu", enabled=False), pytest.raises(RuntimeError, match="same dtype") as error:
            head(low)
    assert seen == [(torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)]
    assert outputs == [torch.bfloat16, torch.float32]
    facts = P.fallback_facts(seen, str(error.value))
    assert facts["fb_verdict"].startswith("the fallback ran the module in FP32")
    assert facts["fb_no_cast"].startswith("torch raised `mat1 and mat2 must have the same dtype")


def test_fallback_facts_and_table_branch_by_branch():
    b16, f32 = torch.bfloat16, torch.float32
    facts = P.fallback_facts([(b16, b16), (f32, f32)], "boom\n")
    assert facts == {"fb_plain_in": "`bfloat16`", "fb_plain_out": "`bfloat16`", "fb_in": "`float32`",
                     "fb_out": "`float32`",
                     "fb_verdict": ("the fallback ran the module in FP32, where autocast alone ran it in lower "
                                    "precision"),
                     "fb_no_cast": "torch raised `boom`"}
    assert all(isinstance(v, Prose) for v in facts.values())
    assert "changed nothing" in P.fallback_facts([(f32, f32), (f32, f32)], None)["fb_verdict"]
    assert P.fallback_facts([(b16, b16), (b16, f32)], None)["fb_verdict"] == (
        "**the fallback did not run the module in FP32**")
    assert P.fallback_facts([(b16, b16), (f32, f32)], None)["fb_no_cast"].startswith("torch raised no error")
    assert P.fallback_table([(b16, b16), (f32, f32)]).splitlines() == [
        "| the module, under autocast | its input | its output |", "|---|---|---|",
        "| as it is | `bfloat16` | `bfloat16` |", "| in the FP32 fallback | `float32` | `float32` |"]
    with pytest.raises(ValueError, match="two"):
        P.fallback_facts([(b16, b16)], None)
    with pytest.raises(ValueError, match="two hook records"):
        P.fallback_table([(b16, b16), (f32, f32), (f32, f32)])


# -- TensorBoard ----------------------------------------------------------------------------------------


def test_gradient_norm_is_the_norm_of_all_gradients_together():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    model(torch.randn(5, 3)).pow(2).sum().backward()
    stats = [gradient_stats(n, p.grad, "fp32") for n, p in model.named_parameters()]
    every = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert P.gradient_norm(stats) == pytest.approx(float(torch.linalg.vector_norm(every.double())), rel=1e-12)


def test_an_event_file_gives_back_what_the_loop_logged_rounded_to_fp32(tmp_path):
    """The lesson's claim about TensorBoard: every scalar comes back, as a 32-bit float."""
    task = P.tiny_regression(CPU, batches=3)
    model, opt, scaler = task.fresh()
    writer, norms = SummaryWriter(str(tmp_path)), []
    monitor = GradientHealthMonitor(model, dtype=torch.bfloat16, every=1)
    for step, (x, y) in enumerate(task.batches):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = F.mse_loss(model(x), y)
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        norms.append(P.gradient_norm(monitor.after_backward(step, scale=scale)))
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        monitor.after_step(step, loss=loss.item(), scale=scale, skipped=step_was_skipped(scale, scaler.get_scale()))
        for tag, value in (("loss", loss.item() / 3), ("scale", scale), ("grad_norm", norms[-1])):
            writer.add_scalar(tag, value, step)
    writer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    read_back = {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    assert read_back["loss"][1][1] == float(torch.tensor(monitor.log.losses[1] / 3, dtype=torch.float32))
    assert read_back["loss"][1][1] != monitor.log.losses[1] / 3          # it was rounded
    # the loss was logged divided by 3: the facts see it as a mismatch
    assert P.tensorboard_facts(read_back, monitor.log, norms)["tb_verdict"] == (
        "**the values read back differ from those logged** for `loss`")
    read_back["loss"] = [(s, float(torch.tensor(v, dtype=torch.float32))) for s, v in
                         zip(monitor.log.steps, monitor.log.losses)]
    assert P.tensorboard_facts(read_back, monitor.log, norms) == {
        "tb_tags": "`grad_norm`, `loss`, `scale`", "tb_steps": 3, "tb_values": 9,
        "tb_verdict": "each equal to the value logged, rounded to FP32"}


def _monitor_log():
    return MonitorLog(steps=[0, 1], losses=[0.5, 0.25], scales=[65536.0, 65536.0], skipped=[False, False])


def test_tensorboard_facts_branch_by_branch():
    read = {"loss": [(0, 0.5), (1, 0.25)], "scale": [(0, 65536.0), (1, 65536.0)], "grad_norm": [(0, 1.0), (1, 0.1)]}
    f32 = float(torch.tensor(0.1, dtype=torch.float32))
    assert P.tensorboard_facts({**read, "grad_norm": [(0, 1.0), (1, f32)]}, _monitor_log(), [1.0, 0.1])[
        "tb_verdict"] == "each equal to the value logged, rounded to FP32"
    # 0.1 itself is not what a 32-bit event file holds
    assert "differ" in P.tensorboard_facts(read, _monitor_log(), [1.0, 0.1])["tb_verdict"]
    lacking = P.tensorboard_facts({"loss": read["loss"]}, _monitor_log(), [1.0, f32])
    assert lacking["tb_verdict"] == "**the event file lacks** `grad_norm`, `scale`" and lacking["tb_values"] == 2
    with pytest.raises(TypeError, match="MonitorLog"):
        P.tensorboard_facts(read, {"losses": []}, [])
    with pytest.raises(ValueError, match="different numbers of steps"):
        P.tensorboard_facts(read, _monitor_log(), [1.0])


def test_scalars_table_one_row_per_step():
    table = P.scalars_table({"scale": [(0, 65536.0), (1, 32768.0), (2, 32768.0)], "loss": [(1, 0.123456), (2, 0.34)]})
    assert table.splitlines() == [
        "| step | `loss` | `scale` |", "|---|---|---|", "| 0 | - | 65,536 |", "| 1 | 0.1235 | 32,768 |",
        "| 2 | 0.3400 | 32,768 |"]   # four figures in every row, trailing zeros too
    with pytest.raises(ValueError, match="no scalars"):
        P.scalars_table({})


def test_accumulation_table_shows_each_difference_against_the_largest_entry():
    from course_lib.studies.production import AccumulationCheck, accumulation_table

    table = accumulation_table(AccumulationCheck(9.2e-05, 9.7e-05, 8.9e-05, 0.032))
    assert table.splitlines()[2:] == [
        "| accumulated against full batch, same autocast | 9.2e-05 | 0.29% |",
        "| accumulated against full batch in FP32 | 9.7e-05 | 0.30% |",
        "| full batch under autocast against FP32 (autocast's own rounding) | 8.9e-05 | 0.28% |"]


def test_the_accumulation_exercise_measures_what_its_solution_says():
    task = P.tiny_regression("cpu", batches=8)
    model, kept = P.run_accumulation(task, 4, torch.bfloat16)
    assert len(kept) == 2 and isinstance(model, torch.nn.Module)
    facts = P.undivided_accumulation_facts(task, 4, torch.bfloat16)
    assert facts["ex_acc_grad_ratio"] == pytest.approx(4.0, rel=1e-3)     # the sum of 4 micro-batch gradients
    assert facts["ex_acc_error_times"] > 100                               # far beyond autocast's rounding
    assert facts["ex_acc_error_pct"] == pytest.approx(300, rel=0.05)       # 4 times the gradient: off by 3 times
    assert 0 < facts["ex_acc_adamw_change_pct"] < 1                        # AdamW barely notices
    # the same loop as the test's own: the library's loop keeps the same gradients
    _, _, _, own = _accumulate(divide=False)
    _, library = P.run_accumulation(task, 4, torch.bfloat16, divide=False)
    assert all(torch.equal(own[0].gradients[k], library[0].gradients[k]) for k in own[0].gradients)
    with pytest.raises(ValueError, match="do not split into steps of 3"):
        P.run_accumulation(task, 3, torch.bfloat16)
