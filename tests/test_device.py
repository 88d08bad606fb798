import pytest
import torch

from course_lib import device as D


def test_profile_follows_device_without_override():
    assert D.size_profile("cpu").name == "small"
    assert D.size_profile("cuda").name == "full"
    assert not D.size_profile("cpu").forced


@pytest.mark.parametrize("value,expected", [("full", "full"), ("small", "small"), (" FULL ", "full")])
def test_environment_overrides_profile(monkeypatch, value, expected):
    monkeypatch.setenv("COURSE_SIZE", value)
    profile = D.size_profile("cpu")
    assert profile.name == expected and profile.forced


def test_invalid_environment_value_is_a_clear_error(monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "huge")
    with pytest.raises(ValueError, match="COURSE_SIZE='huge' is not a size profile"):
        D.size_profile()


def test_pick_and_validation():
    assert D.SizeProfile("small").pick(small=1, full=2) == 1
    assert D.SizeProfile("full").pick(small=1, full=2) == 2
    with pytest.raises(ValueError, match="size profile must be one of"):
        D.SizeProfile("medium")


def test_select_device_matches_cuda_availability():
    assert D.select_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_cpu_description_says_sizes_are_reduced_and_timings_are_cpu():
    hw = D.describe_hardware("cpu")
    assert hw.device_type == "cpu" and hw.compute_capability is None
    assert hw.summary.startswith("CPU ")
    assert "size profile 'small'" in hw.summary
    assert "not GPU timings" in hw.caveat and "reduced size" in hw.caveat
    assert hw.summary in hw.banner_markdown(measure=False)
    banner = hw.banner_markdown()
    assert "Measured here, by a short probe" in banner and "page to page): matmul speed against FP32" in banner
    assert "fast" not in banner


def test_gpu_description_from_compute_capability(monkeypatch):
    class Props:
        name, major, minor = "Tesla V100-SXM2-16GB", 7, 0

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: Props())
    hw = D.describe_hardware("cuda")
    assert hw.device_type == "cuda" and hw.compute_capability == "7.0" and hw.profile.name == "full"
    assert hw.native_fp16 and not hw.native_bf16
    assert "BF16 tensor cores: no, FP16 tensor cores: yes" in hw.summary and hw.caveat == ""


def test_forced_profile_is_named_in_summary(monkeypatch):
    monkeypatch.setenv("COURSE_SIZE", "full")
    hw = D.describe_hardware("cpu")
    assert "'full', set by COURSE_SIZE" in hw.summary
    assert "reduced size" not in hw.caveat and "not GPU timings" in hw.caveat


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without CUDA")
def test_asking_for_cuda_without_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        D.describe_hardware("cuda")


def test_unsupported_device_type():
    with pytest.raises(ValueError, match="unsupported device type 'meta'"):
        D.describe_hardware("meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_description():  # pragma: no cover - runs on the GPU machine
    hw = D.describe_hardware("cuda")
    assert hw.compute_capability and hw.summary.startswith("GPU ")


def test_unknown_device_string_is_a_clear_error():
    with pytest.raises(ValueError, match="unsupported device 'tpu'"):
        D.describe_hardware("tpu")
