"""Measuring speed properly, and modelling it.

* A timing harness a reader can trust: warm-up, synchronisation (CUDA events on a GPU, a host clock around
  a synchronised region elsewhere), many repeats chosen from a time budget, median and quartiles, and
  rotation over several input buffers so that caches are not what is measured.
* Matrix-multiply throughput per dtype (FP32 with TF32 off, TF32, BF16, FP16, FP8 through
  ``torch._scaled_mm``) over a sweep of sizes, misaligned sizes included; copy bandwidth; a capability
  probe (this device's matmul throughput per dtype relative to FP32), cached per process.
* Datasheet peaks of common GPUs (dense figures, each with its source) and a roofline: which of the
  course model's operations are compute-bound and which memory-bound.
* Training throughput (tokens/s, step time, MFU) and time to a target loss per precision recipe.

FLOPs of a matrix product ``[M, K] @ [K, N]`` are ``2 * M * N * K`` (one multiply and one add per term).
Throughput is in TFLOP/s (10^12 floating-point operations per second), bandwidth in GB/s (10^9 bytes).
"""

from __future__ import annotations

import contextlib
import functools
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .train import _tf32

# ---- the timing harness ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Timing:
    """Seconds per call of a timed function: every sample, with median and quartiles."""

    samples: tuple[float, ...]
    warmup: int

    def __post_init__(self) -> None:
        if not self.samples:
            raise ValueError("a Timing needs at least one sample")

    @property
    def repeats(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the samples (linear interpolation), ``0 <= q <= 1``."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must lie in [0, 1], got {q}")
        s = sorted(self.samples)
        pos = q * (len(s) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        return s[lo] + (s[hi] - s[lo]) * (pos - lo)

    @property
    def q25(self) -> float:
        return self.quantile(0.25)

    @property
    def q75(self) -> float:
        return self.quantile(0.75)

    @property
    def relative_spread(self) -> float:
        """Interquartile range over the median: how noisy the measurement was."""
        return (self.q75 - self.q25) / self.median if self.median > 0 else math.inf


class HostTimer:
    """Times a call with a host clock around a synchronised region: ``sync(); t0; fn(); sync(); t1``.

    ``clock`` (seconds) and ``synchronize`` are injectable so the harness can be tested with a fake clock.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter,
                 synchronize: Callable[[], None] | None = None):
        self.clock = clock
        self.synchronize = synchronize if synchronize is not None else (lambda: None)

    def time_call(self, fn: Callable[[], Any]) -> float:
        self.synchronize()
        start = self.clock()
        fn()
        self.synchronize()
        return self.clock() - start


class CudaEventTimer:
    """Times a call with CUDA events recorded on the current stream around it (device time, seconds)."""

    def __init__(self, device: torch.device | str):
        self.device = torch.device(device)

    def time_call(self, fn: Callable[[], Any]) -> float:
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # elapsed_time is in milliseconds


def make_timer(device: torch.device | str) -> HostTimer | CudaEventTimer:
    """CUDA events on a GPU; a host clock elsewhere (CPU work is synchronous)."""
    device = torch.device(device)
    if device.type == "cuda":
        return CudaEventTimer(device)
    if device.type == "cpu":
        return HostTimer()
    raise ValueError(f"unsupported device type {device.type!r}: the course times 'cuda' or 'cpu'")


def time_function(fn: Callable[..., Any], rotation: Sequence[tuple] = ((),), *, device: torch.device | str = "cpu",
                  warmup: int = 3, budget_s: float = 0.5, min_repeats: int = 5, max_repeats: int = 1000,
                  timer: HostTimer | CudaEventTimer | None = None) -> Timing:
    """Time ``fn(*args)`` with ``args`` taken in turn from ``rotation``, one sample per call.

    ``warmup`` untimed calls come first (kernel selection, caches, lazy initialisation). The number of
    timed calls is ``budget_s`` divided by the time of one call, clamped to ``[min_repeats, max_repeats]``.
    Pass several argument tuples in ``rotation`` (distinct buffers, random data) so that a buffer is not
    still in cache from the previous call.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    rotation = list(rotation)
    if not rotation or not all(isinstance(a, tuple) for a in rotation):
        raise TypeError("rotation must be a non-empty sequence of argument tuples")
    for name, value in (("warmup", warmup), ("min_repeats", min_repeats), ("max_repeats", max_repeats)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if min_repeats < 1 or max_repeats < min_repeats:
        raise ValueError(f"need 1 <= min_repeats <= max_repeats, got {min_repeats} and {max_repeats}")
    if not budget_s > 0 or not math.isfinite(budget_s):
        raise ValueError(f"budget_s must be a positive number of seconds, got {budget_s}")
    timer = make_timer(device) if timer is None else timer
    calls = [0]

    def call() -> None:
        args = rotation[calls[0] % len(rotation)]
        calls[0] += 1
        fn(*args)

    for _ in range(warmup):
        call()
    samples = [timer.time_call(call)]
    per_call = max(samples[0], 1e-9)
    repeats = int(min(max_repeats, max(min_repeats, budget_s // per_call)))
    samples += [timer.time_call(call) for _ in range(repeats - 1)]
    return Timing(tuple(samples), warmup)


# ---- matrix products per dtype -------------------------------------------------------------------------

MATMUL_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
DTYPE_LABELS = {"fp32": "FP32 (TF32 off)", "tf32": "TF32", "bf16": "BF16", "fp16": "FP16",
                "fp8": "FP8 E4M3 (_scaled_mm)"}
_TORCH_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def matmul_flops(m: int, n: int, k: int) -> int:
    """Floating-point operations of ``[m, k] @ [k, n]``: ``2*m*n*k`` (not ``2*m*n**2``, which holds
    only when ``k == n``)."""
    for name, value in (("m", m), ("n", n), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return 2 * m * n * k


def _check_dtype_name(dtype: str) -> None:
    if dtype not in MATMUL_DTYPES:
        raise ValueError(f"unknown matmul dtype {dtype!r}; known: {', '.join(MATMUL_DTYPES)}")


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


def scaled_mm_unsupported_reason(device: torch.device | str, *, row_scales: bool = False) -> str | None:
    """Why ``torch._scaled_mm`` does not run on ``device`` (with ``row_scales``: with one scale per row and
    column, not only per tensor), or None when it does. Measured, not looked up."""
    return (_scaled_mm_rowwise_runs if row_scales else _scaled_mm_runs)(str(torch.device(device)))


def dtype_unsupported_reason(dtype: str, device: torch.device | str) -> str | None:
    """Why ``device`` cannot run matrix products in ``dtype``, or None when it can."""
    _check_dtype_name(dtype)
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return "torch sees no CUDA GPU on this machine"
        major, minor = torch.cuda.get_device_capability(device)
        if dtype == "tf32" and (major, minor) < (8, 0):
            return f"TF32 tensor cores need compute capability 8.0+; this GPU is {major}.{minor}"
        if dtype == "bf16" and (major, minor) < (8, 0):
            return f"BF16 tensor cores need compute capability 8.0+; this GPU is {major}.{minor} (emulated)"
        if dtype == "fp8":
            if (major, minor) < (8, 9):
                return f"FP8 tensor cores need compute capability 8.9+; this GPU is {major}.{minor}"
            return _scaled_mm_runs(str(device))
        return None
    if device.type == "cpu":
        if dtype == "tf32":
            return "TF32 is a tensor-core mode of NVIDIA GPUs; a CPU has none"
        if dtype == "fp8":
            return _scaled_mm_runs("cpu")
        return None
    raise ValueError(f"unsupported device type {device.type!r}: the course runs on 'cuda' or 'cpu'")


def matmul_operands(dtype: str, m: int, n: int, k: int, device: torch.device | str, *, buffers: int = 3,
                    seed: int = 0) -> tuple[Callable[..., torch.Tensor], list[tuple]]:
    """A matmul function for ``dtype`` and ``buffers`` distinct random operand sets for it.

    Operands are random normal values (never zeros: zeros can run faster on a GPU). FP8 operands are
    E4M3 with unit scales, ``b`` column-major as ``torch._scaled_mm`` requires, output in BF16.
    """
    _check_dtype_name(dtype)
    matmul_flops(m, n, k)
    if isinstance(buffers, bool) or not isinstance(buffers, int) or buffers < 1:
        raise ValueError(f"buffers must be a positive int, got {buffers!r}")
    device = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    sets: list[tuple[torch.Tensor, ...]] = []
    for _ in range(buffers):
        a = torch.randn(m, k, generator=gen)
        b = torch.randn(k, n, generator=gen)
        if dtype == "fp8":
            if m % 16 or n % 16 or k % 16:
                raise ValueError(f"FP8 torch._scaled_mm needs every dimension divisible by 16; got "
                                 f"m={m}, n={n}, k={k} (pad to a multiple of 16)")
            one = torch.tensor(1.0, device=device)
            sets.append((a.to(device).to(torch.float8_e4m3fn),
                         b.t().contiguous().to(device).to(torch.float8_e4m3fn).t(), one, one))
        else:
            sets.append((a.to(device, _TORCH_DTYPES[dtype]), b.to(device, _TORCH_DTYPES[dtype])))
    fn: Callable[..., torch.Tensor]
    if dtype == "fp8":
        def fn(a, b, sa, sb):
            return torch._scaled_mm(a, b, scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)
    else:
        fn = torch.matmul
    return fn, sets


@dataclass(frozen=True)
class MatmulPoint:
    """One measured matrix product: shape, dtype, timing, throughput (TFLOP/s, from the median)."""

    dtype: str
    m: int
    n: int
    k: int
    timing: Timing

    @property
    def flops(self) -> int:
        return matmul_flops(self.m, self.n, self.k)

    @property
    def tflops(self) -> float:
        return self.flops / self.timing.median / 1e12


def measure_matmul(dtype: str, m: int, n: int, k: int, device: torch.device | str, *, budget_s: float = 0.2,
                   buffers: int = 3, warmup: int = 3, seed: int = 0) -> MatmulPoint:
    """Time ``[m, k] @ [k, n]`` in ``dtype`` on ``device``; refuse clearly a dtype the device cannot run."""
    reason = dtype_unsupported_reason(dtype, device)
    if reason:
        raise ValueError(f"cannot time {dtype} matmuls on {torch.device(device)}: {reason}")
    fn, sets = matmul_operands(dtype, m, n, k, device, buffers=buffers, seed=seed)
    with _tf32(dtype == "tf32"):  # the training loop's switch: TF32 on only for the tf32 dtype
        timing = time_function(fn, sets, device=device, warmup=warmup, budget_s=budget_s)
    return MatmulPoint(dtype, m, n, k, timing)


@dataclass(frozen=True)
class MatmulSweep:
    """Square matmuls of several sizes in several dtypes on one device; ``skipped[dtype]`` says why a
    dtype was not run."""

    device: str
    points: tuple[MatmulPoint, ...]
    skipped: dict[str, str]

    def tflops(self, dtype: str) -> dict[int, float]:
        return {p.n: p.tflops for p in self.points if p.dtype == dtype}

    def best(self, dtype: str) -> float | None:
        values = self.tflops(dtype).values()
        return max(values) if values else None


def matmul_sweep(device: torch.device | str, sizes: Sequence[int], dtypes: Sequence[str] = MATMUL_DTYPES, *,
                 budget_s: float = 0.1, buffers: int = 3) -> MatmulSweep:
    """Throughput of square ``n x n x n`` products for every size and dtype the device supports.

    Sizes FP8 cannot take (not divisible by 16) are left out of its line only.
    """
    if not sizes:
        raise ValueError("sizes must not be empty")
    points, skipped = [], {}
    for dtype in dtypes:
        reason = dtype_unsupported_reason(dtype, device)
        if reason:
            skipped[dtype] = reason
            continue
        for n in sizes:
            if dtype == "fp8" and n % 16:
                continue
            points.append(measure_matmul(dtype, n, n, n, device, budget_s=budget_s, buffers=buffers))
    return MatmulSweep(str(torch.device(device)), tuple(points), skipped)


def torch_timer_matmul_seconds(dtype: str, n: int, device: torch.device | str, *, min_run_time: float = 0.2) -> float:
    """The median seconds of the same square product timed by ``torch.utils.benchmark.Timer``: a
    cross-check of :func:`measure_matmul` with PyTorch's own benchmark tool (one buffer, no rotation)."""
    import torch.utils.benchmark as tb

    reason = dtype_unsupported_reason(dtype, device)
    if reason:
        raise ValueError(f"cannot time {dtype} matmuls on {torch.device(device)}: {reason}")
    fn, sets = matmul_operands(dtype, n, n, n, device, buffers=1)
    with _tf32(dtype == "tf32"):  # the training loop's switch: TF32 on only for the tf32 dtype
        # Timer runs on one thread unless told otherwise; the harness uses torch's setting.
        measurement = tb.Timer(stmt="fn(*args)", globals={"fn": fn, "args": sets[0]},
                               num_threads=torch.get_num_threads()).blocked_autorange(
            min_run_time=min_run_time)
    return float(measurement.median)


# ---- bandwidth and the capability probe ----------------------------------------------------------------


def measure_copy_bandwidth(device: torch.device | str, n_bytes: int, *, budget_s: float = 0.2,
                           buffers: int = 2) -> float:
    """Device-memory bandwidth in GB/s from ``dst.copy_(src)`` of ``n_bytes``, counting bytes read plus
    bytes written (``2 * n_bytes`` per copy). Use a size well beyond the last-level cache."""
    if isinstance(n_bytes, bool) or not isinstance(n_bytes, int) or n_bytes < 4096:
        raise ValueError(f"n_bytes must be an int of at least 4096, got {n_bytes!r}")
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    sets = [(torch.empty(n_bytes // 4, device=device), torch.randn(n_bytes // 4, generator=gen).to(device))
            for _ in range(buffers)]
    timing = time_function(lambda dst, src: dst.copy_(src), sets, device=device, budget_s=budget_s)
    return 2 * (n_bytes // 4) * 4 / timing.median / 1e9


@dataclass(frozen=True)
class CapabilityProbe:
    """This device's matmul throughput per dtype at one size (TFLOP/s), measured, and why a dtype is
    missing. ``relative(d)``: throughput of ``d`` over FP32's (with TF32 off)."""

    device: str
    n: int
    tflops: dict[str, float]
    unsupported: dict[str, str]

    def relative(self, dtype: str) -> float | None:
        if dtype not in self.tflops or "fp32" not in self.tflops:
            return None
        return self.tflops[dtype] / self.tflops["fp32"]

    def faster_than_fp32(self, dtype: str, margin: float = 1.1) -> bool | None:
        """Whether ``dtype`` measured at least ``margin`` times FP32's throughput (None: not measured)."""
        r = self.relative(dtype)
        return None if r is None else r >= margin

    def summary(self) -> str:
        parts = []
        for d in ("tf32", "bf16", "fp16", "fp8"):
            r = self.relative(d)
            if r is not None:
                parts.append(f"{DTYPE_LABELS[d].split(' ')[0]} x{r:.2f}")
        return (f"matmul speed against FP32, measured here at n={self.n}: " + ", ".join(parts)) if parts \
            else "no low-precision matmul measured"


@functools.lru_cache(maxsize=8)
def _probe(device_str: str, n: int, budget_s: float) -> CapabilityProbe:
    tflops, unsupported = {}, {}
    for dtype in MATMUL_DTYPES:
        reason = dtype_unsupported_reason(dtype, device_str)
        if reason:
            unsupported[dtype] = reason
            continue
        tflops[dtype] = measure_matmul(dtype, n, n, n, device_str, budget_s=budget_s, buffers=2, warmup=2).tflops
    return CapabilityProbe(device_str, n, tflops, unsupported)


def capability_probe(device: torch.device | str | None = None, *, n: int | None = None,
                     budget_s: float = 0.03) -> CapabilityProbe:
    """Measure once per process (cached) how fast this device multiplies matrices in each dtype.

    Default size: 4096 on a GPU, 256 on a CPU (a fraction of a second there). Capability claims in the
    course come from this measurement, never from CPU flags.
    """
    from .device import select_device

    dev = torch.device(device) if device is not None else select_device()
    if n is None:
        n = 4096 if dev.type == "cuda" else 256
    matmul_flops(n, n, n)
    return _probe(str(dev), n, budget_s)


@dataclass(frozen=True)
class CPUPeakEstimate:
    """A CPU's FP32 peak estimated from cores x clock x FP32 FLOPs per cycle per core (an *estimate*:
    the clock read is the current one, and two FMA units per core are assumed)."""

    cores: int
    clock_ghz: float
    vector_lanes: int
    fma_units: int

    @property
    def flops_per_cycle(self) -> int:
        return 2 * self.vector_lanes * self.fma_units  # an FMA is two FLOPs per lane

    @property
    def tflops(self) -> float:
        return self.cores * self.clock_ghz * 1e9 * self.flops_per_cycle / 1e12


def cpu_peak_estimate(cpuinfo: str | None = None, cores: int | None = None) -> CPUPeakEstimate | None:
    """Estimate this CPU's FP32 peak from ``/proc/cpuinfo`` (or the text given): the clock ("cpu MHz"),
    the widest FP32 FMA vector (AVX-512: 16 lanes, AVX2 with FMA: 8, else 4) and ``cores`` (default: the
    threads torch uses). None where the clock cannot be read."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as fh:
                cpuinfo = fh.read()
        except OSError:
            return None
    mhz = flags = None
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz" and mhz is None:
            try:
                mhz = float(value)
            except ValueError:
                pass
        if key.strip() == "flags" and flags is None:
            flags = set(value.split())
    if not mhz:
        return None
    flags = flags or set()
    lanes = 16 if "avx512f" in flags else 8 if {"avx2", "fma"} <= flags else 4
    cores = torch.get_num_threads() if cores is None else cores
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ValueError(f"cores must be a positive int, got {cores!r}")
    return CPUPeakEstimate(cores, mhz / 1e3, lanes, 2)


# ---- datasheet peaks and the roofline -------------------------------------------------------------------


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
        _check_dtype_name(dtype)
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


def attainable_tflops(intensity: float, peak_tflops: float, bandwidth_gbs: float) -> float:
    """The roofline: ``min(peak, intensity * bandwidth)`` in TFLOP/s, intensity in FLOPs per byte."""
    if not intensity > 0 or not peak_tflops > 0 or not bandwidth_gbs > 0:
        raise ValueError("intensity, peak and bandwidth must all be positive")
    return min(peak_tflops, intensity * bandwidth_gbs / 1e3)


@dataclass(frozen=True)
class OpCost:
    """FLOPs and the fewest bytes moved (each input read once, each output written once) of one operation
    of the model's forward pass, for one layer and one batch."""

    name: str
    flops: float
    bytes_moved: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / self.bytes_moved


def transformer_op_costs(d_model: int, n_heads: int, tokens_per_sequence: int, batch: int, *,
                         bytes_per_element: int, mlp_ratio: int = 4, param_bytes: int = 4) -> tuple[OpCost, ...]:
    """The main operations of one pre-norm transformer block's forward pass (and the AdamW update of its
    parameters), with FLOPs and minimal bytes at ``bytes_per_element`` per activation and weight element.

    Counted FLOPs: matmuls ``2*M*N*K``; softmax about 5 per element (max, subtract, exp, sum, divide);
    layer norm about 8 per element; GELU about 8 per element; AdamW about 12 per parameter. The AdamW
    bytes assume ``param_bytes``-byte parameters, gradients and two moments, each read and written.
    """
    for name, v in (("d_model", d_model), ("n_heads", n_heads), ("tokens_per_sequence", tokens_per_sequence),
                    ("batch", batch), ("bytes_per_element", bytes_per_element), ("mlp_ratio", mlp_ratio),
                    ("param_bytes", param_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
    b, t, d, h, e = batch, tokens_per_sequence, d_model, n_heads, bytes_per_element
    rows, dh, f = b * t, d // n_heads, mlp_ratio * d_model

    def linear(name: str, k: int, n: int) -> OpCost:
        return OpCost(name, matmul_flops(rows, n, k), (rows * k + k * n + rows * n) * e)

    scores = b * h * t * t
    n_params = 3 * d * d + d * d + 2 * d * f + 4 * d
    return (
        OpCost("layer norm", 8 * rows * d, 2 * rows * d * e),
        linear("QKV projection", d, 3 * d),
        OpCost("attention scores QK^T", 2 * b * h * t * t * dh, (2 * b * h * t * dh + scores) * e),
        OpCost("softmax", 5 * scores, 2 * scores * e),
        OpCost("attention @ V", 2 * b * h * t * t * dh, (scores + 2 * b * h * t * dh) * e),
        linear("output projection", d, d),
        linear("MLP up", d, f),
        OpCost("GELU", 8 * rows * f, 2 * rows * f * e),
        linear("MLP down", f, d),
        OpCost("AdamW step", 12 * n_params, 7 * n_params * param_bytes),
    )


def model_flops_per_token(n_params_non_embedding: int, n_layers: int, d_model: int, context: int) -> float:
    """Training FLOPs per token: ``6 N`` for the matmuls with the parameters (forward 2N, backward 4N)
    plus ``12 * n_layers * context * d_model`` for attention's two products (PaLM's appendix B count,
    without the causal-mask halving)."""
    for name, v in (("n_params_non_embedding", n_params_non_embedding), ("n_layers", n_layers),
                    ("d_model", d_model), ("context", context)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return 6.0 * n_params_non_embedding + 12.0 * n_layers * context * d_model


# ---- training throughput and time to a target loss ------------------------------------------------------


def count_parameters(model: torch.nn.Module) -> tuple[int, int]:
    """``(all, non_embedding)`` trainable parameter counts (embedding tables excluded from the second)."""
    total = sum(p.numel() for p in model.parameters() if p.requires_grad)
    emb = sum(p.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding)
              for p in m.parameters() if p.requires_grad)
    return total, total - emb


@dataclass(frozen=True)
class RecipeRun:
    """One training run: per-step losses and wall seconds (steps after ``warmup_steps`` count for speed)."""

    recipe: str
    seed: int
    compiled: bool
    losses: tuple[float, ...]
    step_seconds: tuple[float, ...]
    tokens_per_step: int
    warmup_steps: int
    peak_memory_bytes: int | None = None

    @property
    def median_step_seconds(self) -> float:
        timed = self.step_seconds[self.warmup_steps:] or self.step_seconds
        return statistics.median(timed)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens_per_step / self.median_step_seconds

    def seconds_to_loss(self, target: float, window: int = 5) -> float | None:
        """Wall seconds until the mean loss of the last ``window`` steps first falls to ``target`` (None:
        never). Warm-up steps (compilation included) count: they are time a user waits."""
        if window < 1:
            raise ValueError(f"window must be at least 1, got {window}")
        elapsed = 0.0
        for i, seconds in enumerate(self.step_seconds):
            elapsed += seconds
            lo = max(0, i + 1 - window)
            if i + 1 >= window and sum(self.losses[lo:i + 1]) / (i + 1 - lo) <= target:
                return elapsed
        return None


@dataclass(frozen=True)
class ThroughputStudy:
    """Runs of several recipes and seeds on one device, with the model's FLOPs per token and, where known,
    the peak each recipe's dtype is measured against (TFLOP/s) and where that peak came from."""

    device: str
    runs: tuple[RecipeRun, ...]
    flops_per_token: float
    peaks: dict[str, float]
    peak_source: str

    def recipes(self) -> list[str]:
        return list(dict.fromkeys(r.recipe for r in self.runs))

    def runs_of(self, recipe: str, compiled: bool = False) -> list[RecipeRun]:
        return [r for r in self.runs if r.recipe == recipe and r.compiled == compiled]

    def mfu(self, run: RecipeRun) -> float | None:
        """Model FLOPs utilisation: achieved model FLOP/s over the peak of the recipe's dtype."""
        peak = self.peaks.get(run.recipe)
        if not peak:
            return None
        return run.tokens_per_second * self.flops_per_token / (peak * 1e12)

    def table(self) -> list[dict[str, Any]]:
        """One row per (recipe, compiled): median over seeds of step time, tokens/s, MFU; seed range."""
        rows = []
        for recipe in self.recipes():
            for compiled in (False, True):
                runs = self.runs_of(recipe, compiled)
                if not runs:
                    continue
                steps = [r.median_step_seconds for r in runs]
                mfus = [m for m in (self.mfu(r) for r in runs) if m is not None]
                rows.append({"recipe": recipe, "compiled": compiled, "seeds": len(runs),
                             "step_ms": 1e3 * statistics.median(steps),
                             "step_ms_range": (1e3 * min(steps), 1e3 * max(steps)),
                             "tokens_per_s": statistics.median(r.tokens_per_second for r in runs),
                             "tokens_per_s_range": (min(r.tokens_per_second for r in runs),
                                                    max(r.tokens_per_second for r in runs)),
                             "mfu": statistics.median(mfus) if mfus else None})
        return rows

    def time_to_target(self, target: float, compiled: bool = False, window: int = 5) -> dict[str, list[float | None]]:
        """Per recipe, seconds to reach ``target`` for each seed (None where a run never did)."""
        return {recipe: [r.seconds_to_loss(target, window) for r in self.runs_of(recipe, compiled)]
                for recipe in self.recipes()}


def recipe_matmul_dtype(recipe: str) -> str:
    """The dtype a recipe's matrix products run in (one of :data:`MATMUL_DTYPES`), read off the recipe."""
    from .train import get_recipe

    r = get_recipe(recipe)
    if r.tf32:
        return "tf32"
    dtype = r.autocast_dtype or r.param_dtype
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[dtype]


def training_throughput(profile, device: torch.device | str = "cpu", *,
                        recipes: Sequence[str] = ("fp32", "bf16_autocast", "fp16_autocast_scaler"),
                        seeds: Sequence[int] = (0, 1), steps: int | None = None, warmup_steps: int = 3,
                        compile_too: bool = False, lr: float = 3e-3) -> ThroughputStudy:
    """Train the course model with each recipe from each seed, timing every step (``course_lib.train``).

    MFU peaks: on a GPU in :data:`DATASHEET_PEAKS`, its datasheet figure for the recipe's dtype; on a CPU,
    the FP32 matmul rate measured here (capability probe) for every recipe. ``compile_too`` adds ``torch.compile`` runs of every recipe.
    """
    from .models import course_setup
    from .train import TrainConfig, TrainState, get_recipe, train

    device = torch.device(device)
    if not seeds:
        raise ValueError("seeds must not be empty")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps must be a non-negative int, got {warmup_steps!r}")
    for recipe in recipes:
        get_recipe(recipe, device)
    runs = []
    flops_per_token = 0.0
    for compiled in ((False, True) if compile_too else (False,)):
        for recipe in recipes:
            for seed in (seeds[:1] if compiled else seeds):  # compiled: one seed (compilation is slow)
                setup = course_setup(profile, device, steps=steps, default_steps=(30, 300), seed=seed)
                if setup.steps <= warmup_steps:
                    raise ValueError(f"steps ({setup.steps}) must exceed warmup_steps ({warmup_steps})")
                model = setup.model(seed)
                cfg = setup.config
                _, non_emb = count_parameters(model)
                flops_per_token = model_flops_per_token(non_emb, cfg.n_layers, cfg.d_model, cfg.context)
                state = TrainState(model, get_recipe(recipe, device), TrainConfig(steps=setup.steps, lr=lr), device)
                if compiled:
                    state.model = torch.compile(state.model)  # type: ignore[assignment]
                history = train(state, setup.sampler)
                runs.append(RecipeRun(recipe, seed, compiled, tuple(history.losses), tuple(history.step_seconds),
                                      setup.sampler.batch_size * cfg.context, warmup_steps,
                                      history.peak_memory_bytes))
    peaks, source = _mfu_peaks(device, recipes)
    return ThroughputStudy(str(device), tuple(runs), flops_per_token, peaks, source)


def _mfu_peaks(device: torch.device, recipes: Sequence[str]) -> tuple[dict[str, float], str]:
    if device.type == "cuda":
        name = torch.cuda.get_device_properties(device).name
        entry = find_gpu_peaks(name)
        if entry is None:
            return {}, f"no datasheet entry for {name}"
        peaks: dict[str, float] = {}
        for r in recipes:
            peak = entry.peak(recipe_matmul_dtype(r))
            if peak:
                peaks[r] = peak
        return peaks, f"datasheet dense peaks of {entry.name}"
    # A CPU has no datasheet peak per dtype; measure every recipe against one number, the FP32 matmul
    # rate measured here, so MFU reads "share of this machine's FP32 matmul rate" for all of them.
    probe = capability_probe(device)
    return ({r: probe.tflops["fp32"] for r in recipes},
            f"the FP32 matmul rate measured on this {device.type.upper()} at n={probe.n}")


# ---- the profiler: where a step's time goes ----------------------------------------------------------


@contextlib.contextmanager
def _quiet_native_stderr():
    """Silence file descriptor 2 while the profiler starts and stops: some torch builds log
    ``profiler_start``/``profiler_stop`` lines from C++ there, which a notebook would show as output.
    Python-level errors still propagate as exceptions."""
    import os

    # fd 2 itself, not sys.stderr.fileno(): in a Jupyter kernel the latter is a copy of the terminal's
    # stderr, while the C++ code writes to fd 2, which the kernel captures into the notebook
    fd = 2
    saved = os.dup(fd)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
        yield
    finally:
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


@dataclass(frozen=True)
class ProfiledStep:
    """The top operators of one training step by self time (microseconds), and the share spent in casts."""

    recipe: str
    device: str
    top_ops: tuple[tuple[str, float, int], ...]   # (name, self time in us, calls)
    total_us: float
    cast_us: float

    @property
    def cast_fraction(self) -> float:
        return self.cast_us / self.total_us if self.total_us > 0 else 0.0


def _self_time_attribute(device_type: str, event) -> str:
    """The field of a profiler average that holds an op's self time on ``device_type``: device (kernel)
    time on a GPU, under its older torch name where ``event`` lacks the newer one; CPU time otherwise."""
    if device_type != "cuda":
        return "self_cpu_time_total"
    return "self_device_time_total" if hasattr(event, "self_device_time_total") else "self_cuda_time_total"


def profile_training_step(recipe: str, profile, device: torch.device | str = "cpu", *, top: int = 8,
                          seed: int = 0) -> ProfiledStep:
    """Profile one training step (after two warm-up steps) of the course model with ``torch.profiler``.

    Times are self times (an op's own time, without the ops it calls): CUDA time on a GPU, CPU time
    otherwise. Casts are ``aten::_to_copy`` and ``aten::copy_``, the ops autocast adds.
    """
    from torch.profiler import ProfilerActivity, profile as torch_profile

    from .models import course_setup
    from .train import TrainConfig, TrainState, get_recipe, train

    device = torch.device(device)
    r = get_recipe(recipe, device)
    setup = course_setup(profile, device, steps=3, default_steps=(3, 3), seed=seed)
    state = TrainState(setup.model(seed), r, TrainConfig(steps=3), device)
    train(state, setup.sampler, steps=2)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with _quiet_native_stderr(), torch_profile(activities=activities) as prof:
        train(state, setup.sampler, steps=1)
    averages = prof.key_averages()
    attr = _self_time_attribute(device.type, averages[0])
    rows = [(e.key, float(getattr(e, attr)), int(e.count)) for e in averages]
    rows = [row for row in rows if row[1] > 0 and row[0].startswith("aten::")]
    rows.sort(key=lambda row: -row[1])
    total = sum(row[1] for row in rows)
    cast = sum(row[1] for row in rows if row[0] in ("aten::_to_copy", "aten::copy_"))
    return ProfiledStep(recipe, str(device), tuple(rows[:top]), total, cast)


# ---- tables and recorded results ---------------------------------------------------------------------


def datasheet_markdown() -> str:
    """A Markdown table of :data:`DATASHEET_PEAKS` (dense TFLOP/s, bandwidth, source citation)."""
    def cell(v):
        return "-" if v is None else f"{v:,.1f}"

    head = ("| GPU | sm | FP32 | TF32 | BF16 | FP16 | FP8 | GB/s | source |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
    table = head + "\n".join(
        f"| {p.name} | {p.compute_capability} | " + " | ".join(cell(p.tflops[d]) for d in MATMUL_DTYPES)
        + f" | {p.bandwidth_gbs:,.0f} | {{cite:p}}`{p.source}` |"
        for p in DATASHEET_PEAKS.values())
    notes = "\n".join(f"- {p.name}: {p.note}." for p in DATASHEET_PEAKS.values() if p.note)
    return table + "\n\nTFLOP/s, dense; GB/s: memory bandwidth. Notes:\n\n" + notes


@dataclass(frozen=True)
class RooflineRow:
    """One operation on one device in two dtypes: intensity and predicted time in each, and the speed-up
    the lower precision gives it by the roofline."""

    name: str
    intensity_high: float
    intensity_low: float
    bound_high: str
    bound_low: str
    seconds_high: float
    seconds_low: float

    @property
    def speedup(self) -> float:
        return self.seconds_high / self.seconds_low


def roofline_rows(d_model: int, n_heads: int, context: int, batch: int, *, peak_high: float, peak_low: float,
                  bandwidth_gbs: float, bytes_high: int = 4, bytes_low: int = 2) -> tuple[RooflineRow, ...]:
    """Predicted time of each operation of a transformer block with ``bytes_high``-byte elements at
    ``peak_high`` TFLOP/s against ``bytes_low``-byte elements at ``peak_low``, on one memory system:
    time = FLOPs / attainable throughput. The optimizer step keeps FP32 state in both."""
    high = transformer_op_costs(d_model, n_heads, context, batch, bytes_per_element=bytes_high)
    low = transformer_op_costs(d_model, n_heads, context, batch, bytes_per_element=bytes_low)
    rows = []
    for h, lo in zip(high, low):
        if h.name == "AdamW step":
            lo = h  # the update runs on FP32 master weights and moments in every mixed-precision recipe
        th = h.flops / (attainable_tflops(h.intensity, peak_high, bandwidth_gbs) * 1e12)
        tl = lo.flops / (attainable_tflops(lo.intensity, peak_low, bandwidth_gbs) * 1e12)
        ridge_h, ridge_l = peak_high * 1e3 / bandwidth_gbs, peak_low * 1e3 / bandwidth_gbs
        rows.append(RooflineRow(h.name, h.intensity, lo.intensity,
                                "compute" if h.intensity >= ridge_h else "memory",
                                "compute" if lo.intensity >= ridge_l else "memory", th, tl))
    return tuple(rows)


def sweep_from_values(points: Sequence[dict]) -> dict[str, dict[int, float]]:
    """``{dtype: {n: TFLOP/s}}`` from a recorded ``matmul_throughput``'s ``values["points"]``."""
    try:
        out: dict[str, dict[int, float]] = {}
        for p in points:
            out.setdefault(p["dtype"], {})[int(p["n"])] = float(p["tflops"])
        return out
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a matmul_throughput record's points: {exc}") from None


def study_from_values(parameters: dict, values: dict, device: str = "recorded") -> ThroughputStudy:
    """Rebuild a :class:`ThroughputStudy` from a recorded ``training_throughput`` experiment."""
    try:
        runs = tuple(RecipeRun(r["recipe"], int(r["seed"]), bool(r["compiled"]), tuple(r["losses"]),
                               tuple(r["step_seconds"]), int(r["tokens_per_step"]), int(r["warmup_steps"]),
                               r.get("peak_memory_bytes")) for r in values["runs"])
        return ThroughputStudy(device, runs, float(values["flops_per_token"]), dict(values["peaks"]),
                               str(parameters.get("peak_source", "")))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"not a training_throughput record: {exc}") from None
