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

from .matmul import (
    DTYPE_LABELS,
    CapabilityProbe,
    CPUPeakEstimate,
    MatmulPoint,
    MatmulSweep,
    capability_probe,
    cpu_peak_estimate,
    matmul_flops,
    matmul_operands,
    matmul_sweep,
    measure_copy_bandwidth,
    measure_matmul,
    torch_timer_matmul_seconds,
)
from .roofline import (
    OpCost,
    RooflineRow,
    attainable_tflops,
    datasheet_markdown,
    model_flops_per_token,
    roofline_rows,
    transformer_op_costs,
)
from .timing import CudaEventTimer, HostTimer, SizeLimit, Timing, make_timer, time_function

__all__ = [
    "Timing",
    "HostTimer",
    "CudaEventTimer",
    "make_timer",
    "time_function",
    "DTYPE_LABELS",
    "matmul_flops",
    "matmul_operands",
    "MatmulPoint",
    "measure_matmul",
    "MatmulSweep",
    "matmul_sweep",
    "SizeLimit",
    "torch_timer_matmul_seconds",
    "measure_copy_bandwidth",
    "CapabilityProbe",
    "capability_probe",
    "CPUPeakEstimate",
    "cpu_peak_estimate",
    "attainable_tflops",
    "OpCost",
    "transformer_op_costs",
    "model_flops_per_token",
    "datasheet_markdown",
    "RooflineRow",
    "roofline_rows",
]
