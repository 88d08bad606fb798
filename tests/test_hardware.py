"""course_lib.hardware: the one table of capability rules, and what answers from it."""

import pytest
import torch

from course_lib import hardware as HW
from course_lib.bf16 import precision_advice
from course_lib.train import RECIPES, get_recipe, runnable_recipes

# NVIDIA's generations: Volta 7.0 and Turing 7.5 (FP16 tensor cores), Ampere 8.0/8.6 (TF32, BF16), Ada 8.9 and
# Hopper 9.0 (FP8), Blackwell 10.0 and 12.0
EXPECTED = {
    (6, 1): set(),
    (7, 0): {"fp16"},
    (7, 5): {"fp16"},
    (8, 0): {"fp16", "tf32", "bf16"},
    (8, 6): {"fp16", "tf32", "bf16"},
    (8, 9): {"fp16", "tf32", "bf16", "fp8"},
    (9, 0): {"fp16", "tf32", "bf16", "fp8"},
    (12, 0): {"fp16", "tf32", "bf16", "fp8"},
}


@pytest.mark.parametrize("cc", sorted(EXPECTED))
def test_capability_table_per_generation(cc):
    has = {f for f in HW.MIN_COMPUTE_CAPABILITY if HW.capability_unsupported_reason(f, cc) is None}
    assert has == EXPECTED[cc]
    assert HW.capability_unsupported_reason("fp32", cc) is None


def test_capability_reasons_name_the_gap():
    assert HW.capability_unsupported_reason("tf32", (7, 0)) == ("TF32 needs compute capability 8.0 or newer; "
                                                                "this GPU has 7.0")
    assert HW.capability_unsupported_reason("fp8", (8, 6)) == ("FP8 needs compute capability 8.9 or newer; "
                                                               "this GPU has 8.6")
    assert HW.capability_unsupported_reason("bf16", (7, 5)) == "this GPU (compute capability 7.5) has no native BF16"
    with pytest.raises(ValueError, match="unknown format 'fp64'"):
        HW.capability_unsupported_reason("fp64", (9, 0))


def test_matmul_dtype_names_are_checked():
    HW.check_matmul_dtype("bf16")
    with pytest.raises(ValueError, match="unknown matmul dtype 'half'"):
        HW.check_matmul_dtype("half")


def test_compute_capability_of_a_device(monkeypatch):
    assert HW.gpu_compute_capability("cpu") is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        HW.gpu_compute_capability("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert HW.gpu_compute_capability("cuda") == (8, 9)


@pytest.mark.parametrize("cc", sorted(EXPECTED))
def test_recipes_and_advice_follow_the_same_table(monkeypatch, cc):
    """The training recipes and the precision advice answer from the table, so they agree with it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: cc)
    runnable = set(runnable_recipes("cuda", tuple(RECIPES)))
    needs = {r: {f for f, flag in (("tf32", RECIPES[r].tf32),
                                   ("bf16", torch.bfloat16 in (RECIPES[r].autocast_dtype, RECIPES[r].param_dtype)))
                 if flag} for r in RECIPES}
    assert runnable == {r for r, n in needs.items() if n <= EXPECTED[cc]}
    advice = precision_advice(cc)
    expected = "bf16_autocast" if "bf16" in EXPECTED[cc] else "fp16_autocast_scaler" if "fp16" in EXPECTED[cc] \
        else "fp32"
    assert advice.recipe == expected
    assert ("FP8" in advice.also) == ("fp8" in EXPECTED[cc])


def test_runnable_recipes_keeps_the_order_and_refuses_a_string():
    assert runnable_recipes("cpu", ("bf16_autocast", "tf32", "fp32")) == ("bf16_autocast", "fp32")
    with pytest.raises(TypeError, match="not one string"):
        runnable_recipes("cpu", "fp32")
    with pytest.raises(ValueError, match="unknown recipe 'fp64'"):
        runnable_recipes("cpu", ("fp64",))
    assert get_recipe("tf32").unsupported_reason("cpu") is not None


def test_tf32_switch_restores_the_previous_setting():
    torch.set_float32_matmul_precision("medium")
    try:
        with HW.tf32_matmuls(True):
            assert torch.get_float32_matmul_precision() == "high"
            with HW.tf32_matmuls(False):
                assert torch.get_float32_matmul_precision() == "highest"
            assert torch.get_float32_matmul_precision() == "high"
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision("highest")


@pytest.fixture
def fresh_matmul_precision():
    """Puts torch's matmul precision back as a new process has it: legacy "highest", per-backend "none"."""
    yield
    torch.set_float32_matmul_precision("highest")
    for switch in HW._per_backend_switches().values():
        switch.fp32_precision = "none"


def _backend_state() -> dict[str, str]:
    return {b: s.fp32_precision for b, s in HW._per_backend_switches().items()}


def test_precision_block_restores_the_per_backend_switches_too(fresh_matmul_precision):
    before = _backend_state()
    with HW.float32_matmul_precision("medium"):
        assert torch.get_float32_matmul_precision() == "medium"
        for backend, value in _backend_state().items():   # torch maps the legacy setting onto each backend
            assert value == HW.MATMUL_PRECISIONS["medium"][backend]
    assert _backend_state() == before
    assert torch.get_float32_matmul_precision() == "highest"


def test_precision_block_works_after_a_reader_mixed_the_two_apis(fresh_matmul_precision):
    switches = HW._per_backend_switches()
    if "cuda" not in switches:
        pytest.skip("this torch has no per-backend fp32_precision switches (before 2.9)")
    torch.set_float32_matmul_precision("highest")
    switches["cuda"].fp32_precision = "tf32"       # the new API, after the legacy one
    with pytest.raises(RuntimeError):
        torch.get_float32_matmul_precision()        # torch refuses: the state the block must survive
    before = _backend_state()
    with HW.tf32_matmuls(False):
        assert switches["cuda"].fp32_precision == "ieee"
        with HW.tf32_matmuls(True):
            assert _backend_state() == HW.MATMUL_PRECISIONS["high"]
        assert switches["cuda"].fp32_precision == "ieee"
    assert _backend_state() == before


def test_precision_block_refuses_an_unknown_setting():
    with pytest.raises(ValueError, match="precision must be one of"):
        with HW.float32_matmul_precision("tf32"):
            pass
    with pytest.raises(TypeError, match="enabled must be a bool"):
        with HW.tf32_matmuls(1):  # type: ignore[arg-type]
            pass


@pytest.mark.filterwarnings("ignore:TF32 acceleration on top of oneDNN")
def test_the_cpu_fp8_kernel_is_found_by_comparing_with_onednn_switched_off(monkeypatch):
    if HW.scaled_mm_unsupported_reason("cpu") is not None:
        pytest.skip("torch._scaled_mm does not run on this CPU")
    real = torch._scaled_mm
    found = HW.cpu_fp8_kernel.__wrapped__
    # what this CPU runs is one of the two, and with oneDNN off it is always torch's reference kernel
    assert found() in HW.CPU_FP8_KERNELS
    with torch.backends.mkldnn.flags(enabled=False):
        assert found() == "reference"

    def onednn_like(a, b, **kw):   # oneDNN sums in its own order: a last-bit difference while it is enabled
        out = real(a, b, **kw)
        return torch.nextafter(out, out + 1) if torch.backends.mkldnn.enabled else out

    monkeypatch.setattr(torch, "_scaled_mm", onednn_like)
    assert found() == "onednn"

    def reference_only(a, b, **kw):   # a CPU where torch keeps its own kernel whatever the flag says
        with torch.backends.mkldnn.flags(enabled=False):
            return real(a, b, **kw)

    monkeypatch.setattr(torch, "_scaled_mm", reference_only)
    assert found() == "reference"


def test_the_cpu_fp8_note_names_the_kernel_it_timed():
    assert "oneDNN's FP8 software kernel" in HW.cpu_fp8_note("onednn")
    assert "converts the codes to FP32" in HW.cpu_fp8_note("reference")
    for note in map(HW.cpu_fp8_note, HW.CPU_FP8_KERNELS):
        assert note.startswith("a CPU has no FP8 matrix unit") and note.endswith("not FP8 hardware")
    with pytest.raises(ValueError, match="kernel must be one of"):
        HW.cpu_fp8_note(None)


def test_no_cpu_fp8_kernel_where_scaled_mm_does_not_run(monkeypatch):
    monkeypatch.setattr(HW, "_scaled_mm_runs", lambda device: "no _scaled_mm here")
    assert HW.cpu_fp8_kernel.__wrapped__() is None
