import math

import pytest
import torch

from course_lib.device import SizeProfile
from course_lib.models import course_setup
from course_lib.train import (RECIPES, TrainConfig, TrainState, evaluate, get_recipe, load_checkpoint,
                              run_recipe, save_checkpoint, train)

SMALL = SizeProfile("small")
CPU_RECIPES = [name for name in RECIPES if name != "tf32"]


@pytest.mark.parametrize("name", CPU_RECIPES)
def test_every_recipe_lowers_the_loss(name):
    history = run_recipe(name, SMALL, steps=12)
    assert len(history.losses) == 12 and all(math.isfinite(v) for v in history.losses)
    assert sum(history.losses[-3:]) / 3 < history.losses[0] - 0.5


def test_recipe_errors_are_clear():
    with pytest.raises(ValueError, match="unknown recipe 'fp64'"):
        get_recipe("fp64")
    with pytest.raises(ValueError, match="recipe 'tf32' cannot run on cpu: TF32 is a tensor-core mode of NVIDIA GPUs, so the course trains with it only there"):
        get_recipe("tf32", "cpu")
    with pytest.raises(TypeError, match="a recipe is a name"):
        get_recipe(3)
    with pytest.raises(ValueError, match="accumulation_steps"):
        TrainConfig(steps=1, accumulation_steps=0)
    with pytest.raises(ValueError, match="schedule"):
        TrainConfig(steps=1, schedule="linear")


def _state(recipe, steps, model_seed=0, **kw):
    setup = course_setup(SMALL, "cpu", steps=steps, default_steps=(1, 1), seed=0)
    return TrainState(setup.model(model_seed), get_recipe(recipe), TrainConfig(steps=steps, **kw),
                      setup.device), setup


def test_scheduler_does_not_advance_on_skipped_steps():
    state, setup = _state("fp16_autocast_scaler", 4, warmup_steps=10)
    state.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)  # the first steps overflow FP16
    history = train(state, setup.sampler)
    skipped = sum(history.skipped)
    assert skipped >= 1
    assert state.scheduler.last_epoch == 4 - skipped
    # warmup: the LR grows only on steps that ran
    assert history.lrs[0] == history.lrs[skipped - 1]


def test_resume_from_checkpoint_reproduces_the_run(tmp_path):
    straight, setup = _state("fp16_autocast_scaler", 6)
    full = train(straight, setup.sampler)
    first, setup = _state("fp16_autocast_scaler", 6)
    train(first, setup.sampler, steps=3)
    path = save_checkpoint(first, tmp_path / "ckpt.pt")
    resumed, setup = _state("fp16_autocast_scaler", 6, model_seed=1)  # different init: the checkpoint must win
    load_checkpoint(resumed, path)
    assert resumed.scaler.get_scale() == first.scaler.get_scale() and resumed.step == 3
    rest = train(resumed, setup.sampler)
    assert rest.losses == full.losses[3:]
    with pytest.raises(ValueError, match="checkpoint is for recipe"):
        load_checkpoint(_state("fp32", 6)[0], path)


def test_bf16_without_master_weights_loses_small_updates():
    """With a small learning rate, AdamW's updates fall below half a BF16 ulp of most weights."""
    pure, setup = _state("bf16_pure", 1, lr=1e-5)
    before = [p.detach().clone() for p in pure.params]
    train(pure, setup.sampler)
    unchanged = sum(int((p == b).sum()) for p, b in zip(pure.params, before)) / sum(b.numel() for b in before)
    master, setup = _state("bf16_master", 1, lr=1e-5)
    masters_before = [m.detach().clone() for m in master.masters]
    train(master, setup.sampler)
    master_unchanged = sum(int((m == b).sum()) for m, b in zip(master.masters, masters_before)) / \
        sum(b.numel() for b in masters_before)
    assert unchanged > 0.5 and master_unchanged < 0.2
    assert master.params[0].dtype == torch.bfloat16 and master.masters[0].dtype == torch.float32


def test_accumulation_and_evaluation():
    state, setup = _state("bf16_autocast", 4, accumulation_steps=2, eval_every=2, eval_batches=1)
    val = type(setup.sampler)(setup.sampler.corpus, 4, setup.config.context, split="val")
    history = train(state, setup.sampler, val_sampler=val)
    assert len(history.losses) == 4 and [s for s, _ in history.eval_losses] == [2, 4]
    assert all(t > 0 for t in history.tokens_per_second) and history.peak_memory_bytes is None


def test_evaluate_from_a_step_is_the_loss_train_logs_there():
    # with accumulation, step 2's loss is the mean over batches 4 and 5; evaluate(start=4) takes it without a step
    state, setup = _state("fp32", 3, accumulation_steps=2)
    train(state, setup.sampler, steps=2)
    at_2 = evaluate(state, setup.sampler, 2, start=4)
    assert evaluate(state, setup.sampler, 2, start=4) == at_2 != evaluate(state, setup.sampler, 2)
    assert train(state, setup.sampler, steps=1).losses == [at_2]
    for kwargs in ({"start": -1}, {"start": 1.0}, {"batches": 0}, {"batches": True}):
        with pytest.raises(ValueError, match="start|batches"):
            evaluate(state, setup.sampler, **{"batches": 2, **kwargs})


def test_convergence_parity_statistics():
    from course_lib.studies.bf16 import convergence_parity

    parity = convergence_parity(SMALL, recipes=("fp32", "bf16_autocast"), seeds=(0, 1), steps=3, tail=2)
    assert set(parity.final_losses) == {"fp32", "bf16_autocast"}
    v = parity.final_losses["fp32"]
    assert parity.mean("fp32") == pytest.approx(sum(v) / 2)
    assert parity.spread("fp32") == pytest.approx(abs(v[0] - v[1]) / math.sqrt(2))
    assert v[0] != v[1]  # different seeds, different runs
    with pytest.raises(ValueError, match="tail"):
        convergence_parity(SMALL, tail=0)


def test_two_optimizers_share_one_scaler():
    from course_lib.train import step_optimizers

    gen_model, disc_model = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    opt_g = torch.optim.SGD(gen_model.parameters(), lr=0.1)
    opt_d = torch.optim.SGD(disc_model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=2)
    for _ in range(2):
        for opt in (opt_g, opt_d):
            opt.zero_grad()
        x = torch.randn(8, 4)
        loss_d = disc_model(gen_model(x).detach()).pow(2).mean()
        loss_g = -disc_model(gen_model(x)).mean()
        scaler.scale(loss_d).backward()
        scaler.scale(loss_g).backward()
        assert step_optimizers(scaler, [opt_g, opt_d], clip_norm=1.0).ran == (True, True)
    assert scaler.get_scale() == 16.0  # two clean iterations, growth_interval 2: one growth, not two
    for opt in (opt_g, opt_d):
        opt.zero_grad()
    scaler.scale(gen_model(torch.full((1, 4), float("inf"))).sum() + disc_model(torch.ones(1, 4)).sum()).backward()
    assert step_optimizers(scaler, [opt_g, opt_d]).ran == (False, True)
    assert scaler.get_scale() == 8.0
    with pytest.raises(ValueError, match="at least one optimizer"):
        step_optimizers(scaler, [])


@pytest.mark.parametrize("cc, refused", [((7, 0), {"tf32", "bf16_autocast", "bf16_pure", "bf16_master"}),
                                         ((7, 5), {"tf32", "bf16_autocast", "bf16_pure", "bf16_master"}),
                                         ((8, 0), set()), ((9, 0), set())])
def test_recipes_refused_by_compute_capability_not_by_emulated_bf16(monkeypatch, cc, refused):
    from course_lib.train import RECIPES, get_recipe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # as torch says on a V100
    assert {name for name, r in RECIPES.items() if r.unsupported_reason("cuda")} == refused
    if refused:
        with pytest.raises(ValueError, match="cannot run on cuda"):
            get_recipe("bf16_autocast", "cuda")


def test_cuda_recipe_without_a_gpu_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        get_recipe("fp32", "cuda")


@pytest.mark.parametrize("kwargs, match", [({"clip_norm": -1.0}, "clip_norm"), ({"clip_norm": 0.0}, "clip_norm"),
                                           ({"lr": math.inf}, "lr must be"), ({"lr": math.nan}, "lr must be")])
def test_train_config_refuses_values_that_would_silently_misbehave(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(steps=1, **kwargs)


def test_convergence_parity_needs_seeds():
    from course_lib.studies.bf16 import convergence_parity

    with pytest.raises(ValueError, match="at least one seed"):
        convergence_parity(SizeProfile("small"), seeds=(), steps=1)


def test_step_optimizers_runs_after_unscale_between_unscaling_and_clipping():
    from course_lib.train import step_optimizers

    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=1.0)
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    (scaler.scale((w * torch.tensor([3.0, 4.0])).sum())).backward()   # true gradient (3, 4), norm 5
    seen = []
    result = step_optimizers(scaler, [opt], clip_norm=1.0, after_unscale=lambda o: seen.append(w.grad.clone()))
    assert torch.equal(seen[0], torch.tensor([3.0, 4.0]))       # already unscaled, not yet clipped
    assert result.ran == (True,) and result.grad_norms == (5.0,)


def test_a_checkpoint_keeps_the_cuda_random_states_where_cuda_is_in_use(monkeypatch):
    """TrainState's checkpoint holds every random state a resumed run draws from: the CPU's, and each CUDA
    device's where CUDA is in use (torch's queries replaced here); loading it sets them back."""
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [torch.tensor([7], dtype=torch.uint8)])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    state, _ = _state("fp32", 2)
    saved = state.state_dict()
    assert [int(t) for t in saved["cuda_rng"]] == [7]
    state.load_state_dict(saved)
    assert len(restored) == 1 and int(restored[0][0]) == 7


def test_the_loop_lesson_4_prints_fits_its_box():
    """Lesson 4 prints ``train`` and ``step_optimizers``: every line fits a 77-column code box, so the
    folded source does not scroll sideways."""
    import inspect

    from course_lib.train import step_optimizers, train
    for fn in (train, step_optimizers):
        assert max(len(line) for line in inspect.getsource(fn).splitlines()) <= 77, fn.__name__
