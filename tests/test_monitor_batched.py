"""The monitor's statistics computed on the device in one batch: the same values, bit for bit, as the
per-parameter computation it replaced (kept here as the reference), and one transfer to the host per
sampled step."""

import math

import pytest
import torch
from torch import nn

from course_lib import monitor as mon
from course_lib.formats import get_format


def reference_gradient_stats(name, grad, fmt, scale=1.0):
    """The monitor's former computation: one gradient at a time, each statistic a float() of its own."""
    f = get_format(fmt)
    a = grad.detach().abs().double().flatten()
    n = a.numel()
    if n == 0:
        return mon.GradientStats(name, 0, 0.0, 0.0, 0.0, 0.0, 0, 0.0)
    finite = torch.isfinite(a)
    non_finite = int(n - finite.sum())
    a = torch.where(finite, a, 0.0)
    x = a * float(scale)
    half_sub = f.min_subnormal / 2
    top = f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
    zero = finite & (a == 0)
    flush = (a > 0) & (x <= half_sub)
    subnormal = (x > half_sub) & (x < f.min_normal - half_sub)
    overflow = x >= top if f.has_inf or f.has_nan else torch.zeros_like(x, dtype=torch.bool)
    return mon.GradientStats(name, n, float(zero.sum()) / n, float(flush.sum()) / n, float(subnormal.sum()) / n,
                             float(overflow.sum()) / n, non_finite, float(torch.linalg.vector_norm(a)))


def bits(stats):
    """Every field, floats by their exact repr (so 0.0 and -0.0, or two neighbouring doubles, differ)."""
    return [tuple(repr(v) if isinstance(v, float) else v for v in vars(s).values()) for s in stats]


def varied_gradients(seed=0):
    """Gradients that exercise every class: zeros, subnormals of FP16 and BF16, values at the rounding
    boundaries, inf and NaN, huge values, half-precision storage, an empty tensor and a scalar."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.randn(4000, generator=g) * torch.exp(12 * torch.randn(4000, generator=g))
    boundaries = torch.tensor([get_format(f).min_subnormal * k for f in ("FP16", "BF16") for k in (0.25, 0.5, 1, 3)]
                              + [65504.0, 65520.0, 3e38, -1e-45, 0.0, -0.0])
    with_non_finite = torch.randn(300, generator=g)
    with_non_finite[::7] = math.inf
    with_non_finite[3::11] = -math.inf
    with_non_finite[5::13] = math.nan
    return [
        ("zeros", torch.zeros(64, 32)),
        ("mostly_zero", torch.where(torch.rand(500, generator=g) < 0.8, 0.0, torch.randn(500, generator=g))),
        ("wide", wide.reshape(40, 100)),
        ("boundaries", boundaries),
        ("non_finite", with_non_finite),
        ("fp16_stored", (torch.randn(257, generator=g) * 1e-6).half()),
        ("bf16_stored", (torch.randn(33, 7, generator=g) * 1e-30).bfloat16()),
        ("float64", torch.randn(100, generator=g, dtype=torch.float64) * 1e-300),
        ("empty", torch.zeros(0)),
        ("scalar", torch.tensor(1e-8)),
        ("all_nan", torch.full((5,), math.nan)),
    ]


@pytest.mark.parametrize("fmt", ["FP16", "BF16", "FP8 E4M3", "FP8 E5M2"])
@pytest.mark.parametrize("scale", [1.0, 2.0**-3, 2.0**12, 65536.0 * 3, 0.7])
def test_the_batch_gives_the_per_gradient_values_bit_for_bit(fmt, scale):
    named = varied_gradients()
    ours = mon.gradient_stats_many(named, fmt, scale)
    reference = [reference_gradient_stats(n, g, fmt, scale) for n, g in named]
    assert bits(ours) == bits(reference)
    # and one at a time through the public single-gradient function
    assert bits(mon.gradient_stats(n, g, fmt, scale) for n, g in named) == bits(reference)


def test_the_batch_is_not_trivially_equal():
    """The comparison above can fail: the varied gradients give different statistics per class."""
    stats = mon.gradient_stats_many(varied_gradients(), "FP16", 1.0)
    by_name = {s.name: s for s in stats}
    assert by_name["zeros"].zero == 1.0 and by_name["non_finite"].non_finite > 0
    assert by_name["wide"].flush > 0 and by_name["wide"].subnormal > 0 and by_name["wide"].overflow > 0
    assert by_name["empty"].numel == 0 and by_name["all_nan"].non_finite == 5
    assert len({s.norm for s in stats}) > 5


def test_a_non_tensor_gradient_is_refused():
    with pytest.raises(TypeError, match="'w'"):
        mon.gradient_stats_many([("w", [1.0, 2.0])], "FP16")


class _Transfers:
    """Counts every way a tensor's values reach Python: item, tolist, float/int/bool/index, cpu, numpy."""

    names = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy", "__array__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.names:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original))

    def _counting(self, original):
        def wrapper(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)
        return wrapper


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(6))
        self.emb = nn.Embedding(10, 8)

    def forward(self, idx):
        h = self.emb(idx)
        for layer in self.layers:
            h = torch.relu(layer(h))
        return h.sum()


def _backward(model, scale=1.0):
    model.zero_grad(set_to_none=True)
    (model(torch.tensor([1, 2, 3])) * scale).backward()


def test_a_sampled_step_moves_the_statistics_to_the_host_once(monkeypatch):
    model = _Net()
    watch = mon.GradientHealthMonitor(model, every=1, activations=True)
    _backward(model)
    transfers = _Transfers(monkeypatch)
    stats = watch.after_backward(0)
    assert transfers.count == 1 and watch.host_transfers == 1
    assert len(stats) == len(list(model.parameters())) + 6       # every parameter and every linear's output
    # the counter sees the old way: a read of its own for each statistic, six or more per parameter
    transfers.count = 0
    [reference_gradient_stats(n, p.grad, "FP16") for n, p in model.named_parameters()]
    assert transfers.count >= 6 * len(list(model.parameters()))
    # a step that is not sampled moves nothing
    watch.every = 2
    transfers.count = 0
    watch.after_backward(1)
    assert transfers.count == 0 and watch.host_transfers == 1
    watch.close()


@pytest.mark.parametrize("scale", [1.0, 2.0**-20, 2.0**16])
def test_the_monitor_reports_and_alerts_as_the_per_parameter_code_did(scale):
    model = _Net()
    with torch.no_grad():
        model.layers[2].weight.zero_()                  # a dead layer: zero gradients downstream of it
        model.layers[4].weight.mul_(1e-6)               # tiny gradients that flush at small scales
    _backward(model, scale)
    model.layers[5].bias.grad[0] = math.inf             # an overflow that reaches the optimizer
    watch = mon.GradientHealthMonitor(model, every=1, thresholds=mon.Thresholds(underflow_fraction=0.05))
    stats = watch.after_backward(0, scale=scale)
    watch.after_step(0, loss=1.0, scale=scale)
    reference = [reference_gradient_stats(n, p.grad.float() / scale, "FP16", scale)
                 for n, p in model.named_parameters() if p.grad is not None]
    assert bits(stats) == bits(reference)
    t = watch.thresholds
    expected = {("non_finite_gradient", "layers.5.bias")}
    for s in reference:
        if s.zero >= t.zero_fraction and s.name != "emb.weight":
            expected.add(("zero_gradients", s.name))
        if s.zero < 1 and s.flush / (1 - s.zero) >= t.underflow_fraction:
            expected.add(("underflow", s.name))
    assert {(a.kind, a.layer) for a in watch.alerts if a.layer is not None} == expected
    assert any(kind == "zero_gradients" for kind, _ in expected)
    assert scale > 1 or any(kind == "underflow" for kind, _ in expected)
