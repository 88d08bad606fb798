"""Hardware facts, in one place: which device runs which number format, datasheet peaks, the TF32 switch.

* :data:`MIN_COMPUTE_CAPABILITY`: the NVIDIA compute capability each tensor-core format needs. Every
  "can this device run X" question in the course (a matmul dtype, a training recipe, the precision advice)
  is answered from this table by :func:`format_unsupported_reason`.
* :func:`scaled_mm_unsupported_reason`: whether ``torch._scaled_mm`` runs here, measured by running it.
* :data:`DATASHEET_PEAKS`: dense peaks (TFLOP/s) and bandwidth (GB/s) of common GPUs, each with its source.
* :func:`tf32_matmuls`: the switch for TF32 tensor cores in FP32 matrix products, and
  :func:`float32_matmul_precision` under it, which works beside either of torch's two APIs for it.
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from dataclasses import dataclass, field

import torch

MATMUL_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")

# The compute capability at which NVIDIA GPUs gain tensor cores for each format: FP16 with Volta (7.0), TF32
# and BF16 with Ampere (8.0), FP8 with Ada and Hopper (8.9). Below 8.0 torch still runs BF16, emulated
# (torch.cuda.is_bf16_supported() says True on 7.x), slower than FP32: the course counts it as unsupported.
MIN_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {"fp16": (7, 0), "tf32": (8, 0), "bf16": (8, 0),
                                                      "fp8": (8, 9)}


def check_matmul_dtype(dtype: str) -> None:
    """Refuse a matmul dtype name the course does not know (one of :data:`MATMUL_DTYPES`)."""
    if dtype not in MATMUL_DTYPES:
        raise ValueError(f"unknown matmul dtype {dtype!r}; known: {', '.join(MATMUL_DTYPES)}")


def gpu_compute_capability(device: torch.device | str) -> tuple[int, int] | None:
    """``(major, minor)`` of a CUDA device, None for any other device; a clear error when torch sees no GPU."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if not torch.cuda.is_available():
        raise ValueError("a CUDA device was asked for, but torch sees no CUDA GPU on this machine")
    major, minor = torch.cuda.get_device_capability(device)
    return int(major), int(minor)


def capability_unsupported_reason(fmt: str, compute_capability: tuple[int, int]) -> str | None:
    """Why a GPU of ``compute_capability`` has no tensor cores for ``fmt`` (a key of
    :data:`MIN_COMPUTE_CAPABILITY`, or ``"fp32"``), or None when it has them."""
    if fmt == "fp32":
        return None
    if fmt not in MIN_COMPUTE_CAPABILITY:
        raise ValueError(f"unknown format {fmt!r}; known: fp32, {', '.join(MIN_COMPUTE_CAPABILITY)}")
    need = MIN_COMPUTE_CAPABILITY[fmt]
    if tuple(compute_capability) >= need:
        return None
    have = f"{compute_capability[0]}.{compute_capability[1]}"
    if fmt == "bf16":
        return f"this GPU (compute capability {have}) has no native BF16"
    return (f"{fmt.upper()} needs compute capability {need[0]}.{need[1]} or newer; "
            f"this GPU has {have}")


def format_unsupported_reason(fmt: str, device: torch.device | str) -> str | None:
    """Why ``device`` cannot compute matrix products in ``fmt`` (one of :data:`MATMUL_DTYPES`), or None.

    On a GPU: the capability table, and for FP8 also whether ``torch._scaled_mm`` runs. On a CPU: no TF32
    mode; FP8 where ``torch._scaled_mm`` runs. Whether a supported format is also *fast* is measured
    (:func:`course_lib.bench.capability_probe`), never read from flags.
    """
    check_matmul_dtype(fmt)
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "torch sees no CUDA GPU on this machine"
        cc = gpu_compute_capability(device)
        assert cc is not None   # a CUDA device has one
        why = capability_unsupported_reason(fmt, cc)
        if why is None and fmt == "fp8":
            return scaled_mm_unsupported_reason(device)
        return why
    if device.type == "cpu":
        if fmt == "tf32":
            return "TF32 is a tensor-core mode of NVIDIA GPUs, so the course trains with it only there"
        if fmt == "fp8":
            return scaled_mm_unsupported_reason("cpu")
        return None
    raise ValueError(f"unsupported device type {device.type!r}: the course runs on 'cuda' or 'cpu'")



@functools.lru_cache(maxsize=None)
def _scaled_mm_runs(device_str: str) -> str | None:
    """None if a 16x16x16 FP8 ``torch._scaled_mm`` runs on this device, else why not (feature detection)."""
    if not hasattr(torch, "float8_e4m3fn") or not hasattr(torch, "_scaled_mm"):
        return "this torch has no float8_e4m3fn dtype or no torch._scaled_mm"
    try:
        a = torch.ones(16, 16, device=device_str).to(torch.float8_e4m3fn)
        b = torch.ones(16, 16, device=device_str).to(torch.float8_e4m3fn).t()
        one = torch.tensor(1.0, device=device_str)
        torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
    except Exception as exc:  # any failure means: not available here; say why
        return f"torch._scaled_mm does not run here ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})"
    return None


@functools.lru_cache(maxsize=None)
def _scaled_mm_rowwise_runs(device_str: str) -> str | None:
    """None if ``torch._scaled_mm`` takes one scale per row of ``a`` and per column of ``b`` on this device,
    else why not: torch 2.11's CPU kernel takes per-tensor scales only, torch 2.13's takes both."""
    why = _scaled_mm_runs(device_str)
    if why is not None:
        return why
    try:
        a = torch.ones(16, 16, device=device_str).to(torch.float8_e4m3fn)
        b = torch.ones(16, 16, device=device_str).to(torch.float8_e4m3fn).t()
        torch._scaled_mm(a, b, scale_a=torch.ones(16, 1, device=device_str),
                         scale_b=torch.ones(1, 16, device=device_str), out_dtype=torch.bfloat16)
    except Exception as exc:
        return (f"this torch's _scaled_mm takes per-tensor scales only here ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0][:120]})")
    return None


CPU_FP8_KERNELS = ("reference", "onednn")


@functools.lru_cache(maxsize=None)
def cpu_fp8_kernel() -> str | None:
    """Which kernel runs a per-tensor FP8 ``torch._scaled_mm`` on this CPU, found by running one: "reference"
    (torch's own: the codes converted to FP32 and multiplied there) where the product equals the one computed
    with oneDNN switched off, "onednn" where it differs (torch hands such products to oneDNN's FP8 kernel on
    some x86 CPUs, which sums in its own order), None where ``_scaled_mm`` does not run here."""
    if _scaled_mm_runs("cpu") is not None:
        return None
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(8, 512, generator=gen).to(torch.float8_e4m3fn)
    b = torch.randn(8, 512, generator=gen).to(torch.float8_e4m3fn).t()
    sa, sb = torch.tensor(0.37), torch.tensor(1.9)   # scales that are not powers of two: the order shows

    def product() -> torch.Tensor:
        return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.float32)

    with warnings.catch_warnings():   # torch warns about oneDNN's TF32 flag whenever the flags are set
        warnings.simplefilter("ignore", UserWarning)
        with torch.backends.mkldnn.flags(enabled=False):
            reference = product()
    return "reference" if torch.equal(product(), reference) else "onednn"


def cpu_fp8_note(kernel: str | None) -> str:
    """What a CPU's FP8 product time measures, for the kernel :func:`cpu_fp8_kernel` found."""
    if kernel == "onednn":
        return ("a CPU has no FP8 matrix unit: torch hands this product to oneDNN's FP8 software kernel here, so "
                "this times that kernel, not FP8 hardware")
    if kernel == "reference":
        return ("a CPU has no FP8 matrix unit: torch converts the codes to FP32 and multiplies there, so this "
                "times that conversion and an FP32 product, not FP8 hardware")
    raise ValueError(f"kernel must be one of {CPU_FP8_KERNELS}, got {kernel!r}")


def scaled_mm_unsupported_reason(device: torch.device | str, *, row_scales: bool = False) -> str | None:
    """Why ``torch._scaled_mm`` does not run on ``device`` (with ``row_scales``: with one scale per row and
    column, not only per tensor), or None when it does. Measured, not looked up."""
    return (_scaled_mm_rowwise_runs if row_scales else _scaled_mm_runs)(str(torch.device(device)))


@dataclass(frozen=True)
class GPUPeaks:
    """Dense datasheet peaks of one GPU (TFLOP/s per dtype; None where the GPU has no such unit) and its
    memory bandwidth (GB/s). ``source`` is a bibliography key; ``note`` says what the figures assume."""

    name: str
    compute_capability: str
    tflops: dict[str, float | None]
    bandwidth_gbs: float
    source: str
    note: str = ""
    match: tuple[str, ...] = field(default=())
    exclude: tuple[str, ...] = field(default=())

    def peak(self, dtype: str) -> float | None:
        check_matmul_dtype(dtype)
        return self.tflops.get(dtype)


def _peaks(name, cc, fp32, tf32, bf16, fp16, fp8, bandwidth, source, note="", match=(), exclude=()):
    return GPUPeaks(name, cc, {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16, "fp8": fp8},
                    bandwidth, source, note, match, exclude)


# Dense tensor-core peaks (plain FP32: the non-tensor rate) from NVIDIA's datasheets and whitepapers (see
# the bibliography). Where a datasheet prints only "with sparsity" figures, the dense figure is half of it.
# GeForce cards: FP16/BF16/FP8 with FP32 accumulation (what training uses), half their FP16-accumulate rate.
DATASHEET_PEAKS: dict[str, GPUPeaks] = {p.name: p for p in (
    _peaks("V100 SXM2", "7.0", 15.7, None, None, 125.0, None, 900.0, "nvidia2020ampere",
           match=("V100", "SXM2")),
    _peaks("T4", "7.5", 8.1, None, None, 65.0, None, 320.0, "nvidia2018t4", match=("Tesla T4",)),
    _peaks("A100 SXM4 80GB", "8.0", 19.5, 156.0, 312.0, 312.0, None, 2039.0, "nvidia2021a100",
           note="sparse figures are twice these (FP16 624 is the sparse figure)", match=("A100", "SXM4", "80GB")),
    _peaks("L4", "8.9", 30.3, 60.0, 121.0, 121.0, 242.5, 300.0, "nvidia2023l4",
           note="halved from the datasheet's sparse figures; accumulate precision not stated",
           match=("NVIDIA L4",)),
    _peaks("RTX 3090", "8.6", 35.6, 35.6, 71.0, 71.0, None, 936.0, "nvidia2021ga102",
           note="FP16/BF16 with FP32 accumulation; 142 with FP16 accumulation", match=("RTX 3090",)),
    _peaks("RTX 4090", "8.9", 82.6, 82.6, 165.2, 165.2, 330.3, 1008.0, "nvidia2023ada",
           note="with FP32 accumulation; FP8 330.3 as corrected in whitepaper v2.02", match=("RTX 4090",)),
    _peaks("H100 SXM5", "9.0", 67.0, 494.5, 989.5, 989.5, 1979.0, 3350.0, "nvidia2023h100",
           note="halved from the datasheet's sparse figures", match=("H100", "HBM3")),
    _peaks("H200 SXM", "9.0", 67.0, 494.5, 989.5, 989.5, 1979.0, 4800.0, "nvidia2024h200",
           note="halved from the sparse figures; same compute as H100 SXM, more bandwidth",
           match=("H200",), exclude=("NVL",)),
    _peaks("B200 (HGX)", "10.0", 75.0, 1100.0, 2250.0, 2250.0, 4500.0, 7700.0, "nvidia2025blackwell",
           note="HGX B200 per GPU (1,000 W), halved from sparse figures; FP4 dense 9,000", match=("B200",)),
)}


def find_gpu_peaks(device_name: str) -> GPUPeaks | None:
    """The datasheet entry whose match strings all occur in ``device_name`` (e.g. torch's device name)."""
    name = device_name.lower()
    for peaks in DATASHEET_PEAKS.values():
        if (peaks.match and all(s.lower() in name for s in peaks.match)
                and not any(s.lower() in name for s in peaks.exclude)):
            return peaks
    return None


# torch.set_float32_matmul_precision's settings -> the per-backend switches that torch 2.9 added for them
# (torch.backends.<backend>.matmul.fp32_precision), as torch itself maps them
MATMUL_PRECISIONS: dict[str, dict[str, str]] = {
    "highest": {"cuda": "ieee", "mkldnn": "ieee"},
    "high": {"cuda": "tf32", "mkldnn": "tf32"},
    "medium": {"cuda": "tf32", "mkldnn": "bf16"},
}


def _per_backend_switches() -> dict[str, object]:
    """The ``matmul`` switches of torch 2.9's per-backend FP32 precision API that this torch has, by backend."""
    out = {}
    for backend in ("cuda", "mkldnn"):
        switch = getattr(getattr(torch.backends, backend, None), "matmul", None)
        if switch is not None and hasattr(switch, "fp32_precision"):
            out[backend] = switch
    return out


@contextlib.contextmanager
def float32_matmul_precision(precision: str):
    """Within the block, FP32 matrix products run at ``precision`` (one of :data:`MATMUL_PRECISIONS`:
    "highest" is full FP32, "high" allows TF32, "medium" allows TF32 on CUDA and BF16 in oneDNN CPU products); everything comes back afterwards.

    The block works whichever API the caller used before it. Where the caller mixed the legacy
    ``set_float32_matmul_precision`` with torch 2.9's per-backend ``fp32_precision`` switches, torch refuses to
    read the legacy setting (a RuntimeError): the block then sets and restores the per-backend switches only.
    """
    if precision not in MATMUL_PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(MATMUL_PRECISIONS)}, got {precision!r}")
    switches = _per_backend_switches()
    saved = {backend: switch.fp32_precision for backend, switch in switches.items()}  # type: ignore[attr-defined]
    try:
        legacy: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:   # the legacy and per-backend APIs were mixed: torch will not read the legacy one
        legacy = None
    try:
        if legacy is not None:
            torch.set_float32_matmul_precision(precision)
        else:
            for backend, switch in switches.items():
                switch.fp32_precision = MATMUL_PRECISIONS[precision][backend]  # type: ignore[attr-defined]
        yield
    finally:
        if legacy is not None:
            torch.set_float32_matmul_precision(legacy)
        for backend, switch in switches.items():   # after the legacy call, which overwrites them
            switch.fp32_precision = saved[backend]  # type: ignore[attr-defined]


@contextlib.contextmanager
def tf32_matmuls(enabled: bool):
    """Within the block, FP32 matrix products use TF32 tensor cores (``enabled``) or full FP32; the previous
    setting comes back afterwards. The training loop's switch for the ``tf32`` recipe and the TF32 matmuls."""
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    with float32_matmul_precision("high" if enabled else "highest"):
        yield
