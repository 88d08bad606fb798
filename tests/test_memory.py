import pytest
import torch

from course_lib import memory as M
from course_lib.studies import performance as performance_studies
from course_lib.device import SizeProfile


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
