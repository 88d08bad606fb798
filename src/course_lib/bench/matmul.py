"""Matrix products per dtype (FP32 with TF32 off, TF32, BF16, FP16, FP8 through ``torch._scaled_mm``): FLOPs,
throughput over a sweep of sizes (misaligned ones included), copy bandwidth, and the capability probe (this
device's matmul speed per dtype against FP32, measured once per process). TFLOP/s are 10^12 FLOP/s, GB/s 10^9 B/s."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..hardware import (
    MATMUL_DTYPES,
    check_matmul_dtype,
    cpu_fp8_kernel,
    cpu_fp8_note,
    format_unsupported_reason,
    tf32_matmuls,
)
from ..tables import MarkdownTable, markdown_table, ratio_text
from .timing import SizeLimit, Timing, time_function

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


def device_generator(device: torch.device, seed: int) -> torch.Generator:
    """A generator seeded with ``seed`` on ``device``, where random operands are drawn."""
    return torch.Generator(device=device).manual_seed(seed)


def matmul_operands(dtype: str, m: int, n: int, k: int, device: torch.device | str, *, buffers: int = 3,
                    seed: int = 0) -> tuple[Callable[..., torch.Tensor], list[tuple]]:
    """A matmul function for ``dtype`` and ``buffers`` distinct random operand sets for it.

    Operands are random normal values drawn on ``device`` from ``seed`` (never zeros: zeros can run faster
    on a GPU). FP8 operands are
    E4M3 with unit scales, ``b`` column-major as ``torch._scaled_mm`` requires, output in BF16.
    """
    check_matmul_dtype(dtype)
    matmul_flops(m, n, k)
    if isinstance(buffers, bool) or not isinstance(buffers, int) or buffers < 1:
        raise ValueError(f"buffers must be a positive int, got {buffers!r}")
    device = torch.device(device)
    # drawn where they are used: on a GPU host, drawing 8192-square operands on the CPU took longer than timing
    gen = device_generator(device, seed)
    sets: list[tuple[torch.Tensor, ...]] = []
    for _ in range(buffers):
        a = torch.randn(m, k, generator=gen, device=gen.device)
        b = torch.randn(k, n, generator=gen, device=gen.device)
        if dtype == "fp8":
            if m % 16 or n % 16 or k % 16:
                # CUDA's kernel refuses other shapes; a CPU's runs them, but a timing must mean the same on both
                raise ValueError(f"FP8 products are timed with every dimension divisible by 16 (what CUDA's "
                                 f"torch._scaled_mm takes); got m={m}, n={n}, k={k} (pad to a multiple of 16)")
            one = torch.tensor(1.0, device=device)
            sets.append((a.to(torch.float8_e4m3fn), b.t().contiguous().to(torch.float8_e4m3fn).t(), one, one))
        else:
            sets.append((a.to(_TORCH_DTYPES[dtype]), b.to(_TORCH_DTYPES[dtype])))
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
    reason = format_unsupported_reason(dtype, device)
    if reason:
        raise ValueError(f"cannot time {dtype} matmuls on {torch.device(device)}: {reason}")
    fn, sets = matmul_operands(dtype, m, n, k, device, buffers=buffers, seed=seed)
    with tf32_matmuls(dtype == "tf32"):  # the training loop's switch: TF32 on only for the tf32 dtype
        timing = time_function(fn, sets, device=device, warmup=warmup, budget_s=budget_s)
    return MatmulPoint(dtype, m, n, k, timing)


@dataclass(frozen=True)
class MatmulSweep:
    """Square matmuls of several sizes in several dtypes on one device; ``skipped[dtype]`` says why a
    dtype was not run, ``left_out[dtype]`` which of its sizes were not and why (:class:`SizeLimit`)."""

    device: str
    points: tuple[MatmulPoint, ...]
    skipped: dict[str, str]
    left_out: dict[str, str] = field(default_factory=dict)

    def tflops(self, dtype: str) -> dict[int, float]:
        return {p.n: p.tflops for p in self.points if p.dtype == dtype}

    def best(self, dtype: str) -> float | None:
        values = self.tflops(dtype).values()
        return max(values) if values else None


def matmul_sweep(device: torch.device | str, sizes: Sequence[int], dtypes: Sequence[str] = MATMUL_DTYPES, *,
                 budget_s: float = 0.1, buffers: int = 3, point_limit_s: float | None = None) -> MatmulSweep:
    """Throughput of square ``n x n x n`` products for every size and dtype the device supports.

    Sizes FP8 cannot take (not divisible by 16) are left out of its line only. With ``point_limit_s``, a
    dtype's sizes whose timing is forecast to take longer than that are left out (:class:`SizeLimit`; a CPU's
    software FP8 kernel can take seconds a product), and ``left_out`` says so.
    """
    if not sizes:
        raise ValueError("sizes must not be empty")
    points, skipped, left_out = [], {}, {}
    for dtype in dtypes:
        reason = format_unsupported_reason(dtype, device)
        if reason:
            skipped[dtype] = reason
            continue
        limit = SizeLimit(point_limit_s, budget_s=budget_s)
        for n in sizes:
            if (dtype == "fp8" and n % 16) or not limit.allows(n):
                continue
            points.append(measure_matmul(dtype, n, n, n, device, budget_s=budget_s, buffers=buffers))
            limit.timed(n, points[-1].timing)
        if limit.note:
            left_out[dtype] = limit.note
    return MatmulSweep(str(torch.device(device)), tuple(points), skipped, left_out)


def torch_timer_matmul_seconds(dtype: str, n: int, device: torch.device | str, *, min_run_time: float = 0.2) -> float:
    """The median seconds of the same square product timed by ``torch.utils.benchmark.Timer``: a
    cross-check of :func:`measure_matmul` with PyTorch's own benchmark tool (one buffer, no rotation)."""
    import torch.utils.benchmark as tb

    reason = format_unsupported_reason(dtype, device)
    if reason:
        raise ValueError(f"cannot time {dtype} matmuls on {torch.device(device)}: {reason}")
    fn, sets = matmul_operands(dtype, n, n, n, device, buffers=1)
    with tf32_matmuls(dtype == "tf32"):  # the training loop's switch: TF32 on only for the tf32 dtype
        # Timer runs on one thread unless told otherwise; the harness uses torch's setting.
        measurement = tb.Timer(stmt="fn(*args)", globals={"fn": fn, "args": sets[0]},
                               num_threads=torch.get_num_threads()).blocked_autorange(
            min_run_time=min_run_time)
    return float(measurement.median)


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


def _cpu_fp8_note() -> str:
    """What a CPU's FP8 "speed" is: torch's reference kernel (FP32 after a conversion) or oneDNN's FP8 kernel,
    whichever runs here (:func:`~course_lib.hardware.cpu_fp8_kernel`); neither is FP8 arithmetic."""
    return cpu_fp8_note(cpu_fp8_kernel())


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
        """One line, each low-precision dtype's matmul speed as a multiple of FP32's (x0.5: half as fast)."""
        parts = []
        for d in ("tf32", "bf16", "fp16", "fp8"):
            r = self.relative(d)
            if r is not None:
                # the course's one rule for a speed ratio (tables.ratio_text): two decimals from 0.1 up, two
                # significant digits below, so an emulated dtype's thousandth is not "x0.00"
                part = f"{DTYPE_LABELS[d].split(' ')[0]} x{ratio_text(r)}"
                if d == "fp8" and torch.device(self.device).type == "cpu":
                    part += f" ({_cpu_fp8_note()})"
                parts.append(part)
        return (f"matmul speed against FP32 at n={self.n}: " + ", ".join(parts)) if parts \
            else "no low-precision matmul measured"

    def table(self) -> MarkdownTable:
        """One row per dtype the probe tried, in :data:`DTYPE_LABELS`' order: TFLOP/s and speed against
        FP32 where measured, else why not (a CPU's FP8 row says which kernel it timed)."""
        rows = []
        for d, label in DTYPE_LABELS.items():
            if d in self.tflops:
                r = self.relative(d)
                note = _cpu_fp8_note() if d == "fp8" and torch.device(self.device).type == "cpu" else ""
                rows.append((label, f"{self.tflops[d]:.3g}", "" if r is None else f"x{ratio_text(r)}", note))
            elif d in self.unsupported:
                rows.append((label, "not measured", "", self.unsupported[d]))
        if not rows:
            raise ValueError("the probe measured no dtype")
        return markdown_table(["dtype", f"TFLOP/s at n={self.n}", "against FP32", "note"], rows)


PROBE_ROUNDS = 3          # at least this many rounds ...
PROBE_MAX_ROUNDS = 10     # ... and more, up to this many, while a round still finds a dtype 20% faster


@functools.lru_cache(maxsize=8)
def _probe(device_str: str, n: int, budget_s: float) -> CapabilityProbe:
    """Each supported dtype timed in interleaved rounds, its best round kept: a burst of load from another
    process during one short budget (on a 2-core machine, a busy core slowed FP32's threaded kernel 80-fold
    here) does not set the line. At least :data:`PROBE_ROUNDS` rounds; while the last round still beat some
    dtype's best by more than 20% (the load had not yet let up), more, up to :data:`PROBE_MAX_ROUNDS` (a
    burst through the first three rounds once made BF16 168 times FP32 on a lesson's banner). A product longer
    than the budget (FP8 emulated on a CPU, 0.4 s at n=256) is timed in the first round only: its repeats
    span seconds already, and rounds would add them."""
    tflops: dict[str, float] = {}
    unsupported = {}
    for dtype in MATMUL_DTYPES:
        reason = format_unsupported_reason(dtype, device_str)
        if reason:
            unsupported[dtype] = reason
    flops = matmul_flops(n, n, n)
    for r in range(PROBE_MAX_ROUNDS):
        improved = False
        for dtype in MATMUL_DTYPES:
            if dtype in unsupported or (r > 0 and flops > budget_s * tflops[dtype] * 1e12):   # one product > budget
                continue
            measured = measure_matmul(dtype, n, n, n, device_str, budget_s=budget_s, buffers=2, warmup=2).tflops
            improved |= r > 0 and measured > 1.2 * tflops[dtype]
            tflops[dtype] = max(tflops.get(dtype, 0.0), measured)
        if r + 1 >= PROBE_ROUNDS and not improved:
            break
    return CapabilityProbe(device_str, n, tflops, unsupported)


def capability_probe(device: torch.device | str, *, n: int | None = None,
                     budget_s: float = 0.03) -> CapabilityProbe:
    """Measure once per process (cached) how fast ``device`` multiplies matrices in each dtype.

    Default size: 4096 on a GPU, 256 on a CPU (a fraction of a second there). Capability claims in the
    course come from this measurement, never from CPU flags.
    """
    dev = torch.device(device)
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
