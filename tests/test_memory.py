import math

import numpy as np
import pytest
import torch

from course_lib import memory as M
from course_lib.studies import performance as performance_studies
from course_lib.device import SizeProfile
from course_lib.train import RECIPES, runnable_recipes


def test_tensor_bytes():
    assert M.tensor_bytes(torch.zeros(3, 5, dtype=torch.bfloat16)) == 30
    with pytest.raises(TypeError, match="expected a tensor"):
        M.tensor_bytes([1, 2])


def test_saved_tensors_of_a_linear_layer_by_hand():
    model = torch.nn.Linear(8, 4, bias=False)
    x = torch.randn(3, 8, requires_grad=True)  # so that backward needs the weight as well as the input
    acts, copies, out = M.saved_tensor_bytes(model, lambda: model(x).sum())
    assert (acts, copies) == (3 * 8 * 4, 0)  # mm saves its input; the weight is a parameter, not counted
    with torch.autocast("cpu", dtype=torch.bfloat16):
        acts, copies, out = M.saved_tensor_bytes(model, lambda: model(x).float().sum())
    assert (acts, copies) == (3 * 8 * 2, 4 * 8 * 2)  # a BF16 input copy, and autocast's BF16 weight copy


def test_account_training_memory_is_exact_per_recipe():
    small = SizeProfile("small")
    fp32 = performance_studies.account_training_memory("fp32", small)
    n = fp32.n_params
    assert fp32.components["weights"] == 4 * n and fp32.components["gradients"] == 4 * n
    assert fp32.components["optimizer_state"] == 8 * n and fp32.components["autocast_weight_copies"] == 0
    assert fp32.per_parameter() == 16.0 and fp32.total == sum(fp32.components.values())
    bf16 = performance_studies.account_training_memory("bf16_autocast", small)
    assert bf16.persistent == fp32.persistent  # autocast keeps FP32 weights, gradients and moments
    assert bf16.components["autocast_weight_copies"] > 0
    assert bf16.components["activations"] < fp32.components["activations"]
    for recipe in ("bf16_pure", "bf16_master"):
        b = performance_studies.account_training_memory(recipe, small)
        assert b.per_parameter() == sum(M.bytes_per_parameter(recipe).values())
    assert fp32.measured_peak_bytes is None  # only a GPU's allocator reports a peak
    with pytest.raises(ValueError, match="exceeds the model's context"):
        performance_studies.account_training_memory("fp32", small, context=10_000)
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        performance_studies.account_training_memory("fp32", small, batch_size=0)


def test_bytes_per_parameter_and_estimate():
    assert sum(M.bytes_per_parameter("fp32").values()) == 16
    assert M.estimate_training_memory(7e9, "bf16_autocast")["total"] == 16 * 7e9
    assert M.estimate_training_memory(1000, "bf16_pure")["total"] == 8000
    with pytest.raises(ValueError, match="unknown recipe"):
        M.bytes_per_parameter("fp8")
    with pytest.raises(ValueError, match="n_params"):
        M.estimate_training_memory(-1, "fp32")


def test_activations_grow_linearly_and_checkpointing_cuts_them():
    sweep = performance_studies.activation_sweep("fp32", SizeProfile("small"), batches=(1, 2, 4), contexts=(32, 64))
    plain = {(b, t): n for b, t, ck, n in sweep.points if not ck}
    ckpt = {(b, t): n for b, t, ck, n in sweep.points if ck}
    # linear in the batch size, over a small fixed part (position indices and the like)
    assert plain[(4, 64)] - plain[(2, 64)] == pytest.approx(2 * (plain[(2, 64)] - plain[(1, 64)]), rel=5e-3)
    assert plain[(1, 64)] - (plain[(2, 64)] - plain[(1, 64)]) < 0.02 * plain[(1, 64)]
    assert all(ckpt[k] < plain[k] / 3 for k in plain)
    with pytest.raises(ValueError, match="must not exceed"):
        performance_studies.activation_sweep("fp32", SizeProfile("small"), contexts=(1000,))


def test_quadratic_share_recovers_a_known_fit():
    # bytes = 100*T + 1*T**2: at T = 64 the quadratic term is 4096 of 10496 bytes
    points = tuple((8, t, False, 100 * t + t * t) for t in (16, 32, 64)) + ((8, 64, True, 1),)
    share, t = performance_studies.ActivationSweep("fp32", points).quadratic_share()
    assert t == 64 and share == pytest.approx(4096 / 10496)
    with pytest.raises(ValueError, match="two contexts"):
        performance_studies.ActivationSweep("fp32", ((1, 16, False, 5),)).quadratic_share()


@pytest.mark.parametrize("n_params", [math.inf, -math.inf, math.nan, -1, 0, -7e9])
def test_estimate_refuses_a_parameter_count_that_is_not_positive_and_finite(n_params):
    with pytest.raises(ValueError, match=f"n_params must be a positive finite number of parameters, got {n_params}"):
        M.estimate_training_memory(n_params, "bf16_master")


@pytest.mark.parametrize("n_params", ["7e9", None, True, torch.tensor(10.0)])
def test_estimate_refuses_a_parameter_count_that_is_not_a_number(n_params):
    with pytest.raises(TypeError, match=f"n_params must be a number of parameters, got {type(n_params).__name__}"):
        M.estimate_training_memory(n_params, "fp32")


def test_estimate_refuses_an_unknown_recipe_and_takes_numpy_counts():
    with pytest.raises(ValueError, match="unknown recipe 'fp64'; known: fp32, "):
        M.estimate_training_memory(1000, "fp64")
    with pytest.raises(TypeError, match=r"recipe must be a recipe name \(str\), got list \['fp32'\]"):
        M.estimate_training_memory(1000, ["fp32"])
    assert M.estimate_training_memory(np.int64(1000), "bf16_master") == {
        "weights": 2000.0, "gradients": 6000.0, "optimizer_state": 8000.0, "master_weights": 4000.0,
        "total": 20000.0}


def test_measured_persistent_components_are_bytes_per_parameter_times_the_parameter_count():
    """Component by component, for every recipe this machine runs: the model's bytes per parameter files
    each byte where the measured accounting finds it (bf16_master: the model's BF16 gradient and the
    master's FP32 gradient are both gradients, 2 + 4; the FP32 master is 4)."""
    small = SizeProfile("small")
    recipes = runnable_recipes("cpu", RECIPES)
    assert "bf16_master" in recipes and len(recipes) == 6  # every recipe but TF32
    for recipe in recipes:
        b = performance_studies.account_training_memory(recipe, small)
        per = M.bytes_per_parameter(recipe)
        assert {k: b.components[k] for k in per} == {k: v * b.n_params for k, v in per.items()}, recipe
        assert b.persistent == M.estimate_training_memory(b.n_params, recipe)["total"]
    assert M.bytes_per_parameter("bf16_master") == {"weights": 2, "gradients": 6, "optimizer_state": 8,
                                                    "master_weights": 4}


def _frozen_backbone_mlp():
    """A trainable input layer, a frozen two-layer backbone, a trainable head (fine-tuning the ends of a
    network: gradients flow through the frozen layers to the first one)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))
    for layer in (model[2], model[4]):
        layer.requires_grad_(False)
    return model


def test_a_frozen_layers_autocast_weight_copy_is_a_weight_copy_not_an_activation():
    model, x = _frozen_backbone_mlp(), torch.randn(8, 16)
    # FP32: each linear's input (the batch, then three ReLU outputs, each saved once by the ReLU and the next
    # linear) is an activation; the weights backward needs are the parameters themselves, not counted
    acts, copies, _ = M.saved_tensor_bytes(model, lambda: model(x).sum())
    assert (acts, copies) == (4 * 8 * (16 + 32 + 64 + 64), 0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        acts, copies, _ = M.saved_tensor_bytes(model, lambda: model(x).float().sum())
    # BF16: the same activations at 2 bytes; and the BF16 weight copies that backward needs to carry the
    # gradient to the layer before: both frozen layers' (64x32, 64x64) and the head's (4x64). The first
    # layer's copy is not saved (its input needs no gradient), nor any bias copy.
    assert acts == 2 * 8 * (16 + 32 + 64 + 64)                 # 2,816 bytes
    assert copies == 2 * (64 * 32 + 64 * 64 + 4 * 64)          # 12,800 bytes (the frozen 12,288 once counted
                                                               # as activations)


def test_a_freed_weight_copy_whose_memory_an_activation_reuses_is_not_a_weight_copy():
    # a frozen first layer fed an input without gradient: its BF16 weight copy is made, used, not saved and
    # freed, and the allocator may hand its 2,048 bytes to the next activation of that size
    model = torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False), torch.nn.ReLU(),
                                torch.nn.Linear(32, 32, bias=False))
    model[0].requires_grad_(False)
    x = torch.randn(32, 32)
    for _ in range(3):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            acts, copies, _ = M.saved_tensor_bytes(model, lambda: model(x).float().sum())
        assert (acts, copies) == (32 * 32 * 2, 0)  # the ReLU's output, saved by the ReLU and the head


# ---- the activation-bytes model against the counted saved tensors ------------------------------------------

def _counted(cfg, batch, seq_len, dtype):
    from course_lib.models import build_gpt

    model = build_gpt(cfg)
    gen = torch.Generator().manual_seed(0)
    x, y = (torch.randint(0, cfg.vocab_size, (batch, seq_len), generator=gen) for _ in range(2))

    def forward():
        if dtype is None:
            return model(x, y)[1]
        with torch.autocast("cpu", dtype=dtype):
            return model(x, y)[1]
    return M.saved_tensor_bytes(model, forward)[:2]


@pytest.mark.parametrize("attention", ["explicit", "scaled_first", "sdpa"])
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float16])
# (d_model, layers, heads, context, vocab, batch, seq_len, mlp_ratio); one sequence or one head makes the
# head split a free view, which changes what attention saves
@pytest.mark.parametrize("shape", [(64, 2, 2, 64, 256, 2, 64, 4), (128, 3, 4, 64, 256, 3, 48, 2),
                                   (64, 1, 2, 8, 16, 1, 8, 1), (64, 2, 1, 16, 32, 2, 16, 2)])
def test_activation_model_is_exact_against_the_counted_step(attention, dtype, shape):
    from course_lib.models import GPTConfig

    d, layers, heads, context, vocab, batch, t, ratio = shape
    cfg = GPTConfig(d_model=d, n_layers=layers, n_heads=heads, context=context, vocab_size=vocab,
                    mlp_ratio=ratio, attention=attention)
    activations, copies = _counted(cfg, batch, t, dtype)
    e = None if dtype is None else 2
    assert activations == M.activation_bytes(batch=batch, seq_len=t, d_model=d, n_heads=heads, n_layers=layers,
                                             vocab_size=vocab, mlp_ratio=ratio, attention=attention, autocast_bytes=e)
    assert copies == (0 if e is None else M.autocast_weight_copy_bytes(d_model=d, n_layers=layers, vocab_size=vocab,
                                                                       mlp_ratio=ratio))


def test_activation_model_cuda_softmax_rule_and_bad_input():
    shape = dict(batch=2, seq_len=64, d_model=64, n_heads=2, n_layers=1, vocab_size=256)
    cpu = M.activation_bytes(autocast_bytes=2, **shape)
    cuda = M.activation_bytes(autocast_bytes=2, device_type="cuda", **shape)
    assert cuda - cpu == 2 * 2 * 64 * 64 * 4          # the FP32 softmax output CUDA autocast keeps besides
    assert M.activation_bytes(device_type="cuda", **shape) == M.activation_bytes(**shape)   # FP32: no difference
    sdpa = M.activation_bytes(attention="sdpa", **shape)
    assert sdpa < M.activation_bytes(**shape)          # no scores stored
    with pytest.raises(ValueError, match="attention must be"):
        M.activation_bytes(attention="flash", **shape)
    with pytest.raises(ValueError, match="autocast_bytes"):
        M.activation_bytes(autocast_bytes=3, **shape)
    with pytest.raises(ValueError, match="device_type"):
        M.activation_bytes(device_type="tpu", **shape)
    with pytest.raises(ValueError, match="batch must be a positive int"):
        M.activation_bytes(**{**shape, "batch": 0})
