"""When FP8 pays: a roofline prediction of one linear layer's forward and backward time in BF16 and in FP8
(after torchao's predictor), casts included, fused or not."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

LAUNCH_SECONDS = 2e-6   # torchao's roofline: the least time any kernel takes (measured on an H100)


@dataclass(frozen=True)
class Fp8LinearEstimate:
    """Predicted time of one linear layer's forward and backward (three products), BF16 against FP8.

    Seconds. ``fp8_cast_s``: the extra memory traffic of computing scales and casting (the overhead that
    makes small shapes slower). ``bf16_kernels``, ``fp8_kernels``: how many kernels each runs (products,
    and for FP8 each scale-and-cast kernel); ``bf16_bound_s``, ``fp8_bound_s``: each one's time split by
    what bounds its kernels, ``{"kernel floor": s, "memory": s, "compute": s}`` (each kernel counted under
    the largest of its launch floor, its memory time and its compute time)."""

    m: int
    k: int
    n: int
    recipe: str
    bf16_s: float
    fp8_gemm_s: float
    fp8_cast_s: float
    bf16_kernels: int = 0
    fp8_kernels: int = 0
    bf16_bound_s: Mapping[str, float] = field(default_factory=dict)
    fp8_bound_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def fp8_s(self) -> float:
        return self.fp8_gemm_s + self.fp8_cast_s

    @property
    def speedup(self) -> float:
        return self.bf16_s / self.fp8_s


BOUNDS = ("kernel floor", "memory", "compute")   # what can bound one kernel's time in the roofline


def _gemm_seconds(m, k, n, bytes_in, peak_flops, bandwidth, gemm_eff, mem_eff, launch) -> tuple[str, float]:
    """(what bounds it, seconds) of one product."""
    compute = 2 * m * k * n / peak_flops / gemm_eff
    traffic = (m * k + k * n) * bytes_in + m * n * 2   # output in BF16
    return _bound(launch, traffic / bandwidth / mem_eff, compute)


def _bound(launch: float, memory: float, compute: float = 0.0) -> tuple[str, float]:
    """The largest of a kernel's launch floor, memory time and compute time, with its name (ties go to the
    floor, then memory: a kernel at the floor is bound by it)."""
    name, seconds = max(zip(BOUNDS, (launch, memory, compute)), key=lambda item: (item[1], -BOUNDS.index(item[0])))
    return name, seconds


def _by_bound(kernels: list[tuple[str, float]]) -> dict[str, float]:
    return {name: sum(s for b, s in kernels if b == name) for name in BOUNDS}


def kernel_counts(recipe: str = "tensorwise") -> tuple[int, int]:
    """How many kernels the roofline charges one linear layer's forward and backward in BF16 and with
    ``recipe`` in FP8: three products each, and FP8's scale-and-cast kernels (the same number fused or not:
    fusing saves bytes, not kernels)."""
    casts = sum(len(_cast_kernels(1, role, recipe, False)) for role in ("input", "weight", "grad_output"))
    return 3, 3 + casts


def cast_kernel_kinds(recipe: str = "tensorwise") -> dict[str, int]:
    """How many of the scale-and-cast kernels the roofline charges ``recipe`` (unfused) do what, from the
    bytes each moves: ``"no bytes"`` (the second stage of an amax reduction, which turns partial amaxes into
    a scale), ``"read"`` (the first stage: reads the BF16 tensor, writes nothing the model counts) and
    ``"write"`` (casts and copies: write a new tensor)."""
    kinds = {"no bytes": 0, "read": 0, "write": 0}
    for role in ("input", "weight", "grad_output"):
        for moved in _cast_kernels(1, role, recipe, False):
            kinds["no bytes" if moved == 0 else "read" if moved == 2 else "write"] += 1
    return kinds


def _cast_kernels(numel: int, role: str, recipe: str, fuse: bool) -> list[float]:
    """Bytes moved by each scale-and-cast kernel of one operand (BF16 in, FP8 out), torchao's model."""
    bf16, f8 = 2, 1
    if recipe == "tensorwise":
        amax = 0 if fuse else bf16 * numel
        if role == "weight":
            return [amax, 0, bf16 * numel + f8 * numel, bf16 * numel + f8 * numel]
        return [amax, 0, bf16 * numel + 2 * f8 * numel]
    if recipe == "rowwise":
        if role == "weight":
            first = (0 if fuse else bf16 * numel) + f8 * numel
            return [first, 2 * bf16 * numel, bf16 * numel + f8 * numel]
        first = (0 if fuse else bf16 * numel) + f8 * numel + bf16 * numel
        return [first, bf16 * numel + f8 * numel]
    if recipe == "rowwise_with_gw_hp":
        if role == "weight":
            return [bf16 * numel + f8 * numel, 0, bf16 * numel + f8 * numel]
        return [(0 if fuse else bf16 * numel) + f8 * numel]
    raise ValueError(f"the roofline covers 'tensorwise', 'rowwise' and 'rowwise_with_gw_hp', not {recipe!r}")


def predict_fp8_linear(m: int, k: int, n: int, *, bf16_tflops: float, fp8_tflops: float, bandwidth_gbs: float,
                       recipe: str = "tensorwise", fuse_casts: bool = False, gemm_efficiency: float = 0.78,
                       memory_efficiency: float = 0.92,
                       launch_seconds: float = LAUNCH_SECONDS) -> Fp8LinearEstimate:
    """Roofline estimate of an ``[m, k] @ [k, n]`` linear layer's forward + backward in BF16 and in FP8.

    Follows torchao's float8 roofline (``torchao.testing.training.roofline_utils``, checked equal in the
    tests): each product takes the longest of its compute time at ``gemm_efficiency`` x peak, its memory
    time at ``memory_efficiency`` x bandwidth, and one launch; FP8 adds the cast kernels' traffic
    (input and grad_output casts can fuse their read into the previous op: ``fuse_casts``). The default
    efficiencies are torchao's, measured on an H100. ``launch_seconds``: the least time of any kernel,
    torchao's 2 us by default; 0 leaves launches out (FLOPs and bytes only, as lesson 6's ladder counts)."""
    for name, size in (("m", m), ("k", k), ("n", n)):
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"{name} must be a positive int, got {size!r}")
    for name, value in (("bf16_tflops", bf16_tflops), ("fp8_tflops", fp8_tflops), ("bandwidth_gbs", bandwidth_gbs),
                        ("gemm_efficiency", gemm_efficiency), ("memory_efficiency", memory_efficiency)):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not (isinstance(launch_seconds, (int, float)) and math.isfinite(launch_seconds) and launch_seconds >= 0):
        raise ValueError(f"launch_seconds must be a non-negative number, got {launch_seconds!r}")
    bw = bandwidth_gbs * 1e9
    bf16_peak, fp8_peak = bf16_tflops * 1e12, fp8_tflops * 1e12
    shapes = ((m, k, n), (m, n, k), (k, m, n))   # output, grad_input, grad_weight
    bf16 = [_gemm_seconds(*s, 2, bf16_peak, bw, gemm_efficiency, memory_efficiency, launch_seconds) for s in shapes]
    fp8_shapes = shapes[:2] if recipe == "rowwise_with_gw_hp" else shapes
    gemm = [_gemm_seconds(*s, 1, fp8_peak, bw, gemm_efficiency, memory_efficiency, launch_seconds) for s in fp8_shapes]
    if recipe == "rowwise_with_gw_hp":
        gemm.append(_gemm_seconds(*shapes[2], 2, bf16_peak, bw, gemm_efficiency, memory_efficiency, launch_seconds))
    kernels = (_cast_kernels(m * k, "input", recipe, fuse_casts) + _cast_kernels(k * n, "weight", recipe, False)
               + _cast_kernels(m * n, "grad_output", recipe, fuse_casts))
    cast = [_bound(launch_seconds, b / bw / memory_efficiency) for b in kernels]
    return Fp8LinearEstimate(m, k, n, recipe, sum(s for _, s in bf16), sum(s for _, s in gemm),
                             sum(s for _, s in cast), bf16_kernels=len(bf16), fp8_kernels=len(gemm) + len(cast),
                             bf16_bound_s=_by_bound(bf16), fp8_bound_s=_by_bound(gemm + cast))
