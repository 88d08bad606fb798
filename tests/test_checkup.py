"""The precision check-up on models the course did not write: a torchvision-style CNN and a small
transformer built from torch.nn, a model that overflows FP16, and a broken one."""

import math
import sys
import textwrap

import pytest
import torch
from torch import nn

from course_lib.checkup import CHECKUP_RECIPES, checkup, main


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        nn.Flatten(), nn.Linear(16, 10))


def _classification(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def _images():
    g = torch.Generator().manual_seed(1)
    return torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)


def test_checkup_on_a_cnn():
    result = checkup(_cnn, _classification, _images(), device="cpu", steps=3)
    assert set(result.recipes) == set(CHECKUP_RECIPES)
    assert all(r.finite for r in result.recipes.values() if r.unsupported is None)
    assert {x.layer for x in result.layers} == {"0", "4", "9"}            # both convolutions and the head
    ops = {row["op"]: row["runs_in"] for row in result.autocast_ops}
    assert ops["convolution"] == "low precision"
    # the rule, from the measured losses: BF16 autocast ends within 2% of FP32's last loss, so it is chosen
    fp32_last, bf16_last = result.recipes["fp32"].losses[-1], result.recipes["bf16_autocast"].losses[-1]
    assert abs(bf16_last - fp32_last) <= 0.02 * abs(fp32_last)
    # ... unless this CPU computes BF16 more slowly than FP32 at every step (no BF16 instructions)
    want = _accurate_choice(result)
    assert result.recommendation == want
    assert result.reasons[0].startswith(f"BF16 autocast's last loss was {100 * (bf16_last - fp32_last) / fp32_last:+.3g}%")
    assert f"**Recommendation: {want}** (on cpu)" in result.markdown()
    assert result.max_fp16_scale == 2.0 ** math.floor(math.log2(65504 / result.grad_amax))


def _accurate_choice(result):
    """BF16 autocast where it runs as fast as FP32 here; FP32 where it is slower at every step (and FP16 too)."""
    from course_lib.checkup import slower_every_step

    ref = result.recipes["fp32"]
    if not slower_every_step(result.recipes["bf16_autocast"], ref):
        return "bf16_autocast"
    assert any(r.startswith("BF16 autocast matched FP32, but every step") for r in result.reasons)
    return "fp32" if slower_every_step(result.recipes["fp16_autocast_scaler"], ref) else "fp16_autocast_scaler"


def test_checkup_on_a_small_transformer():
    def build():
        torch.manual_seed(0)
        layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True, dropout=0.0)
        return nn.Sequential(nn.TransformerEncoder(layer, num_layers=2), nn.Linear(32, 1))

    x = torch.randn(8, 12, 32, generator=torch.Generator().manual_seed(2))
    result = checkup(build, lambda m, b: (m(b[0]).squeeze(-1) - b[1]).square().mean(), (x, torch.zeros(8, 12)),
                     device="cpu", steps=3)
    assert result.recipes["fp32"].finite
    assert any("linear" in x.layer for x in result.layers)
    assert result.recommendation == _accurate_choice(result)    # BF16 tracks FP32 within 2% on this CPU


def test_a_model_that_overflows_fp16_is_not_sent_to_fp16():
    def build():
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        with torch.no_grad():
            net[0].weight.mul_(1e5)          # outputs in the 1e5s: beyond FP16's 65504
        return net

    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(3))
    result = checkup(build, lambda m, b: m(b).square().mean() * 1e-12, x, device="cpu", steps=3,
                     recipes=("fp32", "fp16_autocast_scaler"))
    assert [x.layer for x in result.layers if x.output_overflow > 0] == ["0"]
    assert result.recommendation == "fp32"             # the only other recipe asked for
    assert any("overflow" in r for r in result.reasons)


def test_a_broken_model_is_not_a_precision_problem():
    result = checkup(lambda: nn.Linear(4, 1), lambda m, b: m(b).sum() * torch.nan, torch.ones(2, 4), device="cpu",
                     steps=2, recipes=("fp32",))
    assert result.recommendation == "fix the model first"


def test_bad_input_is_refused():
    x = torch.ones(2, 4)
    with pytest.raises(ValueError, match="steps"):
        checkup(lambda: nn.Linear(4, 1), lambda m, b: m(b).sum(), x, steps=1)
    with pytest.raises(ValueError, match="no trainable parameters"):
        checkup(lambda: nn.ReLU(), lambda m, b: m(b).sum(), x)
    with pytest.raises(TypeError, match="scalar loss"):
        checkup(lambda: nn.Linear(4, 1), lambda m, b: m(b), x, device="cpu", recipes=("fp32",))
    with pytest.raises(ValueError, match="recipes"):
        checkup(lambda: nn.Linear(4, 1), lambda m, b: m(b).sum(), x, recipes=("bf16_autocast",))
    with pytest.raises(TypeError, match="nn.Module"):
        checkup(lambda: "model", lambda m, b: m(b).sum(), x)


def test_the_command_line(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_model.py").write_text(textwrap.dedent("""
        import torch
        from torch import nn

        def factory():
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
            return model, lambda m, b: m(b).square().mean(), torch.randn(16, 4)
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["my_model:factory", "--device", "cpu", "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert "Recommendation" in out and "| fp32 | yes |" in out
    with pytest.raises(ValueError, match="module:function"):
        main(["my_model"])
    sys.modules.pop("my_model", None)


def test_without_bf16_the_recommendation_weighs_fp16():
    from course_lib.checkup import LayerRisk, RecipeCheck, _recommend

    fp32 = RecipeCheck("fp32", None, (2.0, 1.0), 0, None, 0.01, ())
    bf16 = RecipeCheck("bf16_autocast", "this GPU (compute capability 7.5) has no native BF16", (), 0, None,
                       math.nan, ())
    fp16 = RecipeCheck("fp16_autocast_scaler", None, (2.0, 1.005), 1, 32768.0, 0.01, ())
    calm = (LayerRisk("fc", 0.0, 0.0, 0.0),)
    choice, reasons = _recommend({"fp32": fp32, "bf16_autocast": bf16, "fp16_autocast_scaler": fp16}, calm,
                                 2.0**20, 0.02)
    assert choice == "fp16_autocast_scaler"
    assert any("compute capability 7.5" in r for r in reasons) and any("skipped 1 of 2" in r for r in reasons)
    hot = (LayerRisk("fc", 0.01, 0.0, 0.0),)
    choice, reasons = _recommend({"fp32": fp32, "bf16_autocast": bf16, "fp16_autocast_scaler": fp16}, hot,
                                 2.0**20, 0.02)
    assert choice == "fp32" and any("overflow" in r for r in reasons)


def test_the_readers_own_loop_is_audited():
    def clipping_too_early(model, batch, opt, scaler):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = _classification(model, batch)
        scaler.scale(loss).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)     # before unscale_
        scaler.step(opt)
        scaler.update()

    def correct(model, batch, opt, scaler):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = _classification(model, batch)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(opt)
        scaler.update()

    bad = checkup(_cnn, _classification, _images(), device="cpu", steps=2, recipes=("fp32",),
                  train_step=clipping_too_early)
    # the CNN's 10-class head is 10 wide: the width warning comes with both loops
    assert [f.pitfall for f in bad.findings] == ["unaligned_matmul", "clip_before_unscale"]
    assert "clip_before_unscale" in bad.markdown()
    good = checkup(_cnn, _classification, _images(), device="cpu", steps=2, recipes=("fp32",), train_step=correct)
    assert [f.pitfall for f in good.findings] == ["unaligned_matmul"]
    clean = checkup(lambda: nn.Sequential(nn.Linear(8, 8)), lambda m, b: m(b).square().mean(), torch.ones(4, 8),
                    device="cpu", steps=2, recipes=("fp32",),
                    train_step=lambda m, b, o, s: (o.zero_grad(), s.scale(m(b).square().mean()).backward(),
                                                   s.step(o), s.update()))
    assert clean.findings == () and "no pitfall found" in clean.markdown()
    with pytest.raises(TypeError, match="train_step"):
        checkup(_cnn, _classification, _images(), train_step="loop")


def _check(recipe, last, *, unsupported=None, seconds=(0.05, 0.01, 0.01, 0.01)):
    from course_lib.checkup import RecipeCheck

    losses = () if unsupported else (3.0, last)
    return RecipeCheck(recipe, unsupported, losses, 0, 1024.0 if "fp16" in recipe else None, seconds[len(seconds) // 2],
                       (), () if unsupported else seconds)


@pytest.mark.parametrize("bf16_seconds, fp16_seconds, want", [
    ((0.05, 0.04, 0.04, 0.04), (0.05, 0.01, 0.01, 0.01), "fp16_autocast_scaler"),   # BF16 slower at every step
    ((0.05, 0.04, 0.04, 0.04), (0.05, 0.03, 0.02, 0.03), "fp32"),                   # both slower
    ((0.05, 0.04, 0.009, 0.04), (0.05, 0.03, 0.02, 0.03), "bf16_autocast"),         # one BF16 step as fast: noise
    ((0.05, 0.04), (0.05, 0.03), "bf16_autocast"),                                 # one step after warm-up: no verdict
])
def test_an_accurate_recipe_slower_at_every_step_is_not_recommended(bf16_seconds, fp16_seconds, want):
    """FP32's steps take 0.01 s after a 0.05 s first step; the first step (warm-up) is left out."""
    from course_lib.checkup import LayerRisk, _recommend

    checks = {"fp32": _check("fp32", 2.0), "bf16_autocast": _check("bf16_autocast", 2.01, seconds=bf16_seconds),
              "fp16_autocast_scaler": _check("fp16_autocast_scaler", 2.0, seconds=fp16_seconds)}
    if len(bf16_seconds) == 2:
        checks["fp32"] = _check("fp32", 2.0, seconds=(0.05, 0.01))
    recommendation, reasons = _recommend(checks, [LayerRisk("head", 0.0, 0.0, 0.0)], 2.0**10, 0.02)
    assert recommendation == want
    slow = [r for r in reasons if "every step after the first took longer" in r]
    assert len(slow) == {"fp16_autocast_scaler": 1, "fp32": 2, "bf16_autocast": 0}[want]
    if slow:
        assert slow[0].startswith("BF16 autocast matched FP32") and "(median 0.04 s against 0.01 s, 4 times" in slow[0]
    assert not any(r.startswith("No low-precision recipe matched") for r in reasons)
    # the advice to run it again on the training hardware comes once, where speed decided against a recipe
    assert sum(r.startswith("Run the check-up again") for r in reasons) == (want == "fp32")
    # the FP16 skip count backs a BF16 recommendation only
    assert any(r.endswith("BF16 has FP32's range and needs no scaler.") for r in reasons) == (want == "bf16_autocast")


@pytest.mark.parametrize("bf16, fp16, overflow, want", [
    (_check("bf16_autocast", 2.01), _check("fp16_autocast_scaler", 2.0), False, "bf16_autocast"),
    (_check("bf16_autocast", 2.10), _check("fp16_autocast_scaler", 2.01), False, "fp16_autocast_scaler"),
    (_check("bf16_autocast", 2.10), _check("fp16_autocast_scaler", 2.01), True, "fp32"),
    (_check("bf16_autocast", 2.10), _check("fp16_autocast_scaler", 2.10), False, "fp32"),
    (_check("bf16_autocast", 0, unsupported="no BF16 on sm 7.0"), _check("fp16_autocast_scaler", 2.0), False,
     "fp16_autocast_scaler"),
])
def test_the_recommendation_rule(bf16, fp16, overflow, want):
    """FP32 ends at 2.0; tolerance 2%: BF16 first when close, FP16 when close and no layer overflows."""
    from course_lib.checkup import LayerRisk, _recommend

    layers = [LayerRisk("head", 0.01 if overflow else 0.0, 0.0, 0.0)]
    checks = {"fp32": _check("fp32", 2.0), "bf16_autocast": bf16, "fp16_autocast_scaler": fp16}
    recommendation, reasons = _recommend(checks, layers, 2.0**10, 0.02)
    assert recommendation == want
    assert any("BF16 does not run here: no BF16 on sm 7.0." == r for r in reasons) == bool(bf16.unsupported)
    assert any("outputs of head overflow" in r for r in reasons) == (overflow and want == "fp32")
