import math

import pytest
import torch

from course_lib.bf16 import (REFERENCE_GPUS, BF16AdamW, advice_for_this_machine, precision_advice,
                             stochastic_round_bf16)
from course_lib.formats import get_format, round_to_format


def test_stochastic_rounding_is_unbiased_and_picks_a_neighbour():
    x = torch.full((200_000,), 1.0 + 2.0**-10)  # an eighth of the way from 1 to the next BF16 value
    r = stochastic_round_bf16(x, torch.Generator().manual_seed(0)).float()
    assert set(r.unique().tolist()) == {1.0, 1.0 + 2.0**-7}
    assert r.mean().item() == pytest.approx(1.0 + 2.0**-10, abs=3e-5)
    exact = torch.tensor([1.0, -2.5, 0.0, math.inf, -math.inf])
    assert torch.equal(stochastic_round_bf16(exact).float(), exact)
    assert torch.isnan(stochastic_round_bf16(torch.tensor([math.nan]))).all()
    with pytest.raises(TypeError, match="float32"):
        stochastic_round_bf16(torch.ones(2, dtype=torch.float64))


def test_stochastic_rounding_matches_nearest_distribution_bounds():
    x = torch.randn(10_000) * 100
    r = stochastic_round_bf16(x, torch.Generator().manual_seed(1)).float().double()
    down = torch.from_numpy(__import__("numpy").asarray(
        round_to_format(x.double(), "BF16", rounding="toward_zero")))
    gap = torch.from_numpy(__import__("numpy").asarray(
        __import__("course_lib.formats", fromlist=["spacing"]).spacing(x.double(), "BF16")))
    assert bool(((r - down).abs() <= gap * (1 + 1e-12)).all())  # one of the two neighbours


@pytest.mark.parametrize("rule,expected_change", [("nearest", False), ("stochastic", True), ("kahan", True)])
def test_small_updates_survive_only_with_a_repair(rule, expected_change):
    w = torch.nn.Parameter(torch.ones(2000, dtype=torch.bfloat16))
    opt = BF16AdamW([w], lr=1e-4, update_rule=rule)
    for _ in range(100):
        w.grad = torch.ones_like(w)
        opt.step()
    target = 1.0 - 100 * 1e-4  # AdamW with a constant gradient moves by lr per step
    lost = opt.state[w]["lost"]   # a device tensor: counted without a read-back
    assert isinstance(lost, torch.Tensor)
    if rule != "kahan":   # Kahan's weight moves only on the steps its compensation reaches a BF16 spacing
        assert (int(lost) == 2000) == (rule == "nearest")
    moved = abs(w.float().mean().item() - 1.0)
    assert (moved > 0.5 * (1 - target)) == expected_change
    if expected_change:
        assert w.float().mean().item() == pytest.approx(target, abs=get_format("BF16").epsilon / 2)


def test_bf16_adamw_rejects_bad_input():
    with pytest.raises(ValueError, match="update_rule"):
        BF16AdamW([torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))], update_rule="round")
    p = torch.nn.Parameter(torch.ones(1))
    p.grad = torch.ones(1)
    with pytest.raises(TypeError, match="bfloat16 parameters"):
        BF16AdamW([p]).step()


def test_precision_advice_for_reference_gpus_and_cpus():
    advice = {name: precision_advice(cc, name=name) for name, cc in REFERENCE_GPUS}
    assert advice["V100"].recipe == "fp16_autocast_scaler"
    assert advice["A100"].recipe == "bf16_autocast" and "FP8" not in advice["A100"].also
    assert advice["H100"].recipe == "bf16_autocast" and "FP8" in advice["H100"].also
    assert precision_advice((6, 0)).recipe == "fp32"
    # a CPU is advised by its measured BF16 matmul speed, not by its flags
    assert precision_advice(None, cpu_bf16_speedup=1.9).recipe == "bf16_autocast"
    assert precision_advice(None, cpu_bf16_speedup=0.5).recipe == "fp32"
    assert precision_advice(None).recipe == "fp32"
    with pytest.raises(ValueError, match="positive ratio"):
        precision_advice(None, cpu_bf16_speedup=0.0)
    with pytest.raises(TypeError, match="compute_capability"):
        precision_advice("8.0")


@pytest.mark.parametrize("ratio, want", [(1.9, "bf16_autocast"), (1.1, "bf16_autocast"), (1.09, "fp32"), (0.6, "fp32")])
def test_advice_for_this_cpu_follows_its_measured_bf16_speed(monkeypatch, ratio, want):
    """On a CPU the advice comes from the probe's measured BF16/FP32 matmul ratio (faked here), not flags."""
    from types import SimpleNamespace

    import course_lib.bf16 as B

    asked = []
    monkeypatch.setattr(B, "capability_probe", lambda device_type: asked.append(device_type) or SimpleNamespace(
        relative=lambda dtype: ratio if dtype == "bf16" else math.nan))
    advice = advice_for_this_machine("cpu")
    assert asked == ["cpu"] and advice.recipe == want and f"measured {ratio:.2f}x FP32's throughput" in advice.why


def test_compare_bf16_updates_runs_every_rule():
    from course_lib.studies.bf16 import compare_bf16_updates
    from course_lib.device import SizeProfile

    result = compare_bf16_updates(SizeProfile("small"), steps=3, seeds=(0, 1))
    assert len(result.curves) == 5 and set(result.lost_fraction) <= set(result.curves)
    assert result.seeds == (0, 1) and result.steps == 3
    assert all(len(v) == 2 and all(len(c) == 3 for c in v) for v in result.curves.values())
    assert all(0.0 <= f <= 1.0 for v in result.lost_fraction.values() for c in v for f in c)
    # one seed, one initialisation and one set of batches for every rule: equal first losses up to BF16
    first = [v[0][0] for v in result.curves.values()]
    assert max(first) - min(first) < 0.1      # a BF16 loss is itself rounded (spacing 1/32 near 5)
    ev = result.eval_losses
    assert set(ev) == set(result.curves) and all(len(v) == 2 and all(math.isfinite(x) for x in v) for v in ev.values())
    assert len(result.final("FP32", tail=2)) == 2
    with pytest.raises(ValueError, match="seeds"):
        compare_bf16_updates(SizeProfile("small"), steps=2, seeds=[])


@pytest.mark.parametrize("kwargs, match", [({"betas": (1.0, 0.9)}, "betas"), ({"betas": (0.9, -0.1)}, "betas"),
                                           ({"eps": -1.0}, "eps"), ({"weight_decay": -0.1}, "weight_decay")])
def test_bf16_adamw_refuses_what_torch_refuses(kwargs, match):
    import torch

    from course_lib.bf16 import BF16AdamW

    params = [torch.nn.Parameter(torch.zeros(2, dtype=torch.bfloat16))]
    with pytest.raises(ValueError, match=match):
        BF16AdamW(params, **kwargs)
    with pytest.raises(ValueError):
        torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], **kwargs)  # the same input torch refuses


def _stochastic_weights(seed: int) -> torch.Tensor:
    w = torch.nn.Parameter(torch.full((256,), 1.0, dtype=torch.bfloat16))
    opt = BF16AdamW([w], lr=1e-3, update_rule="stochastic", seed=seed)
    for _ in range(3):
        w.grad = torch.ones_like(w)
        opt.step()
    return w.detach().clone()


def test_bf16adamw_stochastic_rounding_repeats_seed_for_seed():
    assert torch.equal(_stochastic_weights(3), _stochastic_weights(3))
    assert not torch.equal(_stochastic_weights(3), _stochastic_weights(4))


def test_bf16adamw_seeds_a_generator_on_the_weights_device(monkeypatch):
    """On a GPU the random bits come from a generator on that GPU, seeded like the CPU's (it used to be the
    unseeded default one, so GPU runs did not repeat); faked here, as a CPU machine has no CUDA generator."""
    made = []

    class FakeGenerator:
        def __init__(self, device="cpu"):
            made.append(torch.device(device))

        def manual_seed(self, seed):
            self.seed = seed
            return self

    opt = BF16AdamW([torch.nn.Parameter(torch.ones(2, dtype=torch.bfloat16))], update_rule="stochastic", seed=7)
    monkeypatch.setattr(torch, "Generator", FakeGenerator)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    g = opt.generator_for(torch.device("cuda"))
    assert made == [torch.device("cuda", 0)] and g.seed == 7
    assert opt.generator_for("cuda:0") is g and made == [torch.device("cuda", 0)]   # one per device
    assert opt.generator_for("cpu") is opt.generator
