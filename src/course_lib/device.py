"""The one place that decides where experiments run and how big they are.

* :func:`select_device`: CUDA when available, else the CPU.
* :func:`size_profile`: ``"full"`` on a GPU, ``"small"`` on the CPU; the environment variable
  ``COURSE_SIZE=small|full`` overrides it. Experiments size themselves with :meth:`SizeProfile.pick`.
* :func:`describe_hardware`: the one-line description every lesson shows at its top.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import TypeVar

import torch

from .bench.matmul import capability_probe

PROFILES = ("small", "full")
SIZE_ENV_VAR = "COURSE_SIZE"

T = TypeVar("T")


def select_device() -> torch.device:
    """``cuda`` when a CUDA GPU is visible, otherwise ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class SizeProfile:
    """How big the experiments are: ``"small"`` (CPU, seconds) or ``"full"`` (GPU).

    ``forced`` is true when the ``COURSE_SIZE`` environment variable chose the profile.
    """

    name: str
    forced: bool = False
    max_steps: int | None = None   # a cap on every training run's steps (the self-check's smoke runs)

    def __post_init__(self) -> None:
        if self.name not in PROFILES:
            raise ValueError(f"size profile must be one of {PROFILES}, got {self.name!r}")
        if self.max_steps is not None and (isinstance(self.max_steps, bool) or not isinstance(self.max_steps, int)
                                           or self.max_steps < 1):
            raise ValueError(f"max_steps must be None or a positive int, got {self.max_steps!r}")

    def pick(self, *, small: T, full: T) -> T:
        """The value for this profile, e.g. ``profile.pick(small=200, full=5000)`` training steps."""
        return small if self.name == "small" else full

    @property
    def is_small(self) -> bool:
        return self.name == "small"


def size_profile(device: torch.device | str | None = None) -> SizeProfile:
    """The size profile: ``COURSE_SIZE`` if set, else ``full`` on CUDA and ``small`` elsewhere."""
    env = os.environ.get(SIZE_ENV_VAR)
    if env is not None and env.strip() != "":
        value = env.strip().lower()
        if value not in PROFILES:
            raise ValueError(
                f"environment variable {SIZE_ENV_VAR}={env!r} is not a size profile; use one of {PROFILES}"
            )
        return SizeProfile(value, forced=True)
    dev = torch.device(device) if device is not None else select_device()
    return SizeProfile("full" if dev.type == "cuda" else "small")


def _cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _probe(name: str) -> bool | None:
    """Call a private torch CPU-capability probe if this torch has it (feature detection)."""
    fn = getattr(getattr(torch._C, "_cpu", None), name, None)
    if fn is None:
        return None
    try:
        return bool(fn())
    except Exception:  # pragma: no cover - a probe that exists but fails counts as unknown
        return None


@dataclass(frozen=True)
class HardwareInfo:
    """What the experiments run on.

    ``native_bf16`` / ``native_fp16``: whether the hardware has instructions for low-precision matrix
    arithmetic (on a CPU: AVX512-BF16/AMX or AVX512-FP16/AMX-FP16 flags; on a GPU: compute capability 8.0+
    for BF16, 7.0+ for FP16 tensor cores). ``None`` where it cannot be told. Having the instruction does
    not make a dtype fast: :func:`course_lib.bench.capability_probe` measures that, and the banner shows it.
    """

    device_type: str
    name: str
    compute_capability: str | None
    cpu_capability: str | None
    native_bf16: bool | None
    native_fp16: bool | None
    profile: SizeProfile
    torch_version: str
    cuda_version: str | None

    @property
    def summary(self) -> str:
        """One line for the top of a lesson."""
        def yn(flag: bool | None) -> str:
            return "unknown" if flag is None else ("yes" if flag else "no")

        if self.device_type == "cuda":
            hw = f"GPU {self.name} (compute capability {self.compute_capability}, CUDA {self.cuda_version})"
            units = "tensor cores"
        else:
            cap = f", {self.cpu_capability}" if self.cpu_capability else ""
            hw = f"CPU {self.name}{cap}"
            units = "instructions"
        forced = f", set by {SIZE_ENV_VAR}" if self.profile.forced else ""
        return (f"{hw}; BF16 {units}: {yn(self.native_bf16)}, FP16 {units}: {yn(self.native_fp16)}; "
                f"torch {self.torch_version}; size profile '{self.profile.name}'{forced}")

    @property
    def caveat(self) -> str:
        """What a reader must know about the numbers on this page, given where it ran."""
        parts = []
        if self.profile.is_small:
            parts.append("Experiments on this page ran at reduced size (the 'small' profile).")
        if self.device_type != "cuda":
            parts.append("Timings measured here are CPU timings, not GPU timings: what the course says of a GPU's "
                         "speed comes only from recorded GPU runs. A CPU's BF16 or FP16 instructions speed up a "
                         "product only where torch's kernels use them: the measured speeds say whether they do.")
        return " ".join(parts)

    def banner_markdown(self, *, measure: bool = True) -> str:
        """Markdown for the top of a lesson: the hardware line, what was measured of its matmul speed per
        dtype (``measure``: run the cached capability probe), and, where it applies, the caveat."""
        text = f"**Ran on:** {self.summary}."
        if measure:
            text += (" Measured here, by a short probe when the page ran (on a shared machine these speeds vary from "
                     f"page to page): {capability_probe(self.device_type).summary()}.")
        return text + (f"\n\n*{self.caveat}*" if self.caveat else "")


def describe_hardware(device: torch.device | str | None = None) -> HardwareInfo:
    """Describe the device experiments use (default: :func:`select_device`)."""
    try:
        dev = torch.device(device) if device is not None else select_device()
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unsupported device {device!r}: the course runs on 'cuda' or 'cpu' ({exc})") from None
    profile = size_profile(dev)
    cuda_version = torch.version.cuda
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("a CUDA device was asked for, but torch sees no CUDA GPU")
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        major, minor = props.major, props.minor
        return HardwareInfo(
            device_type="cuda", name=props.name, compute_capability=f"{major}.{minor}",
            cpu_capability=None, native_bf16=(major, minor) >= (8, 0), native_fp16=(major, minor) >= (7, 0),
            profile=profile, torch_version=torch.__version__, cuda_version=cuda_version,
        )
    if dev.type != "cpu":
        raise ValueError(f"unsupported device type {dev.type!r}: the course runs on 'cuda' or 'cpu'")
    flags = _cpu_flags()
    bf16 = _probe("_is_avx512_bf16_supported")
    if bf16 is None and flags:
        bf16 = bool({"avx512_bf16", "amx_bf16"} & flags)
    amx = _probe("_is_amx_tile_supported")
    fp16 = _probe("_is_amx_fp16_supported")
    if fp16 is None and flags:
        fp16 = bool({"avx512_fp16", "amx_fp16"} & flags)
    if amx and bf16 is False:
        bf16 = True
    capability = None
    get_cap = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if get_cap is not None:
        capability = get_cap()
    return HardwareInfo(
        device_type="cpu", name=_cpu_model_name(), compute_capability=None, cpu_capability=capability,
        native_bf16=bf16, native_fp16=fp16, profile=profile, torch_version=torch.__version__,
        cuda_version=cuda_version,
    )


# ---- random states -------------------------------------------------------------------------------------

def _cuda_in_use() -> bool:
    # feature-detected: a torch without these functions, or without a GPU, has no CUDA random state to keep;
    # before CUDA is initialised nothing has drawn from its generators
    return (hasattr(torch.cuda, "get_rng_state_all") and hasattr(torch.cuda, "set_rng_state_all")
            and torch.cuda.is_available() and torch.cuda.is_initialized())


def rng_states() -> dict:
    """The random states a rollback restores: ``"rng"``, the CPU generator's (a byte tensor), and
    ``"cuda_rng"``, every CUDA device's (``torch.cuda.get_rng_state_all()``, one byte tensor per device), or
    None where CUDA is not in use. Dropout masks and random sampling on a GPU draw from the CUDA generators,
    so a rolled-back GPU run repeats its draws only with them restored too."""
    return {"rng": torch.random.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if _cuda_in_use() else None}


def restore_rng_states(saved: dict) -> None:
    """Set the CPU generator, and the CUDA generators where ``saved`` holds them, to what :func:`rng_states`
    returned."""
    if not isinstance(saved, dict) or "rng" not in saved:
        raise ValueError("saved must be a dict with the CPU random state under 'rng' (from rng_states())")
    cuda = saved.get("cuda_rng")
    if cuda is not None and not _cuda_in_use():
        raise ValueError("the checkpoint holds CUDA random states, but CUDA is not in use here")
    torch.random.set_rng_state(saved["rng"])
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def peak_allocated_bytes(device: torch.device | str, reset: bool = False) -> int | None:
    """On a GPU the allocator's peak (bytes) since the last reset (``reset``: start a new one, None
    returned); None on a CPU, where torch keeps no such counter."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if reset:
        torch.cuda.reset_peak_memory_stats(device)
        return None
    return int(torch.cuda.max_memory_allocated(device))


def allocated_bytes(device: torch.device | str) -> int | None:
    """On a GPU the bytes its allocator holds for live tensors now (``torch.cuda.memory_allocated``, every
    tensor on the device, whoever made it); None on a CPU, where torch keeps no such counter."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return int(torch.cuda.memory_allocated(device))
