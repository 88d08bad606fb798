"""Block scaling never waits on the host on an accelerator: a quantize, a dequantize and an emulated training
step's forward and backward read nothing back (the accelerator branch is run on the CPU by faking
``on_accelerator``), give the same bits as the CPU branch, and still refuse bad input (at the next
synchronisation, as the FP8 casts do)."""

import math

import pytest
import torch
from torch import nn

from course_lib import mx
from course_lib.fp8 import casts

pytestmark = pytest.mark.skipif(not hasattr(torch, "_assert_async"),
                                reason="this torch has no device-side assertion: the checks read the host")


class _HostReads:
    """Counts every way a tensor's values reach Python: item, tolist, float/int/bool/index, cpu, numpy."""

    names = ("item", "tolist", "__float__", "__int__", "__bool__", "__index__", "cpu", "numpy", "__array__")

    def __init__(self, monkeypatch):
        self.count = 0
        for name in self.names:
            monkeypatch.setattr(torch.Tensor, name, self._counting(getattr(torch.Tensor, name)))

    def _counting(self, original):
        def wrapper(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)
        return wrapper


_ON_ACCELERATOR = casts.on_accelerator


def _as_accelerator(monkeypatch, fake: bool) -> None:
    """Make the CPU take the accelerator branch (``fake``) or its own, in the FP8 casts that mx checks with."""
    decide = (lambda device: True) if fake else _ON_ACCELERATOR
    monkeypatch.setattr(casts, "on_accelerator", decide)


SCALINGS = {
    "mxfp8 floor": mx.BlockScaling("e4m3", 32, mode="floor"),
    "mxfp4 rceil": mx.BlockScaling("e2m1", 32, mode="rceil"),
    "mxfp6 even": mx.BlockScaling("e3m2", 32, mode="even"),
    "mxfp4 ceil": mx.BlockScaling("e2m1", 32, mode="ceil"),
    "e4m3 no tensor scale": mx.BlockScaling("e2m1", 16, scale_format="e4m3"),
    "nvfp4": mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True),
    "nvfp4 2-D": mx.BlockScaling("e2m1", 16, block_rows=16, scale_format="e4m3", tensor_scale=True),
    "nvfp4 SR": mx.BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True, stochastic=True),
    "fp32 scale": mx.BlockScaling("e2m1", 32, scale_format="fp32"),
}


def _rough(seed: int = 0, shape=(64, 256)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(3 * torch.randn(shape, generator=g))
    x[3] = 0.0                                          # zero blocks take the smallest scale
    return x


def _quantize(scaling, x):
    gen = torch.Generator().manual_seed(5) if scaling.stochastic else None
    q = scaling.quantize(x, generator=gen)
    return q, q.dequantize()


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.float().reshape(-1).view(torch.int32)


@pytest.mark.parametrize("name", list(SCALINGS))
def test_a_quantize_reads_nothing_back_on_an_accelerator_and_the_cpu_branch_does(monkeypatch, name):
    scaling, x = SCALINGS[name], _rough()
    _quantize(scaling, x)               # once untimed: the native-cast probe is measured once per device type
    _as_accelerator(monkeypatch, True)
    reads = _HostReads(monkeypatch)
    _quantize(scaling, x)
    assert reads.count == 0
    # the same counter sees the CPU branch's checks: the finite check, and NVFP4's reciprocal check
    _as_accelerator(monkeypatch, False)
    _quantize(scaling, x)
    assert reads.count >= (2 if scaling.tensor_scale else 1)


@pytest.mark.parametrize("name", list(SCALINGS))
def test_the_accelerator_branch_gives_the_cpu_branch_bits(monkeypatch, name):
    scaling = SCALINGS[name]
    for x in (_rough(1), _rough(2, (32, 512)) * 1e-30, torch.zeros(16, 64)):
        cpu_q, cpu_values = _quantize(scaling, x)
        _as_accelerator(monkeypatch, True)
        acc_q, acc_values = _quantize(scaling, x)
        _as_accelerator(monkeypatch, False)
        for ours, theirs in ((acc_q.elements, cpu_q.elements), (acc_q.scales, cpu_q.scales),
                             (acc_q.block_scales, cpu_q.block_scales), (acc_values, cpu_values),
                             (acc_q.tensor_scale, cpu_q.tensor_scale)):
            assert torch.equal(_bits(ours), _bits(theirs))
    assert isinstance(cpu_q.tensor_scale, torch.Tensor) and cpu_q.tensor_scale.dim() == 0


def test_the_tensor_scale_is_the_fp32_amax_over_448_times_6():
    x = _rough(3)
    q = SCALINGS["nvfp4"].quantize(x)
    assert q.tensor_scale.dtype == torch.float32
    assert torch.equal(q.tensor_scale, x.abs().max() / (448.0 * 6.0))
    assert float(SCALINGS["nvfp4"].quantize(torch.zeros(1, 16)).tensor_scale) == 1.0
    assert float(SCALINGS["mxfp8 floor"].quantize(x).tensor_scale) == 1.0


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32))


def _step(model, x):
    """One emulated training step's forward and backward; the input and weight gradients."""
    x = x.clone().requires_grad_(True)
    model(x).square().mean().backward()
    return [x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("recipe", ["nvfp4", "mxfp8", "mxfp4", "nvfp4_no_2d"])
def test_a_training_step_reads_nothing_back_on_an_accelerator_and_gives_the_cpu_bits(monkeypatch, recipe):
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    _step(mx.convert_to_block_scaled(_model(), recipe, skip=()), x)     # warm-up
    cpu_grads = _step(mx.convert_to_block_scaled(_model(), recipe, skip=()), x)
    _as_accelerator(monkeypatch, True)
    model = mx.convert_to_block_scaled(_model(), recipe, skip=())
    assert sum(isinstance(m, mx.BlockLinear) for m in model.modules()) == 2
    reads = _HostReads(monkeypatch)
    acc_grads = _step(model, x)
    assert reads.count == 0
    assert all(torch.equal(_bits(a), _bits(c)) for a, c in zip(acc_grads, cpu_grads))
    # the counter sees the CPU branch's reads in the same step
    _as_accelerator(monkeypatch, False)
    _step(mx.convert_to_block_scaled(_model(), recipe, skip=()), x)
    assert reads.count >= 5          # a finite check per quantize: two forward, three or more backward


def test_bad_input_still_fails_on_an_accelerator_at_the_assertion(monkeypatch):
    _as_accelerator(monkeypatch, True)
    reads = _HostReads(monkeypatch)
    bad = torch.randn(4, 32)
    bad[1, 3] = math.nan
    with pytest.raises(RuntimeError, match="inf or NaN"):
        mx.BlockScaling("e4m3", 32).quantize(bad)
    with pytest.raises(RuntimeError, match="inf or NaN"):
        SCALINGS["nvfp4"].quantize(torch.full((1, 16), math.inf))
    # a tensor too small for an FP32 tensor scale: its reciprocal overflows
    with pytest.raises(RuntimeError, match="too small for an FP32 tensor scale"):
        SCALINGS["nvfp4"].quantize(torch.full((1, 16), 1e-37))
    with pytest.raises(RuntimeError, match="E2M1 has no NaN"):
        mx.stochastic_round(torch.tensor([1.0, math.nan]), "e2m1", generator=torch.Generator().manual_seed(0))
    # infinities saturate in stochastic rounding: not an error there
    out = mx.stochastic_round(torch.tensor([math.inf, -math.inf]), "e2m1", generator=torch.Generator())
    assert torch.equal(out, torch.tensor([6.0, -6.0]))
    assert reads.count == 0
    # and on the CPU, at once, as ValueError
    _as_accelerator(monkeypatch, False)
    with pytest.raises(ValueError, match="too small for an FP32 tensor scale"):
        SCALINGS["nvfp4"].quantize(torch.full((1, 16), 1e-37))
    with pytest.raises(ValueError, match="has no NaN"):
        mx.stochastic_round(torch.tensor([1.0, math.nan]), "e2m1", generator=torch.Generator().manual_seed(0))
