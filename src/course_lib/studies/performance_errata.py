"""Lesson 6's errata against popular speed claims, each from the page's own measurements and records: lower
precision is not always faster (the sweeps and a training step), tensor cores do not speed up normalisation
(the roofline), and what unsourced GPT-2 token rates would mean (FLOPs per token against datasheet peaks)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from ..bench import DTYPE_LABELS, MatmulSweep, OpCost, model_flops_per_token
from ..glue import and_list, ratio_text
from ..hardware import DATASHEET_PEAKS
from ..results import RecordedResult
from .performance import MatmulThroughput, ThroughputStudy, bf16_ridge, measured_tflops


# the widely repeated, unsourced GPT-2 small rates on an A100, tokens/s per recipe
GPT2_CLAIMED_RATES = {"fp32": 15_000, "fp16": 42_000, "bf16": 40_000}


def gpt2_rates_erratum(rates: Mapping[str, float] = GPT2_CLAIMED_RATES) -> tuple[str, str]:
    """The unsourced "GPT-2 on an A100 trains at 15k/42k/40k tokens/s in FP32/FP16/BF16", against what those
    rates mean: GPT-2 small's training FLOPs per token (12 layers, d = 768, context 1024, 85M non-embedding
    parameters), the TFLOP/s each rate implies, and the share of the A100's dense peak it would use."""
    a100 = DATASHEET_PEAKS["A100 SXM4 80GB"]
    d, layers, context = 768, 12, 1024
    flops = model_flops_per_token(12 * layers * d * d, layers, d, context)
    parts = []
    for dtype, rate in rates.items():
        peak = a100.peak(dtype)
        if peak is None:
            raise ValueError(f"the A100's datasheet entry has no {dtype} peak")
        parts.append(f"{rate / 1e3:g}k tokens/s in {dtype.upper()} is {rate * flops / 1e12:.1f} TFLOP/s, "
                     f"{100 * rate * flops / (peak * 1e12):.0f}% of the A100's dense {dtype.upper()} peak of {peak:g}")
    claim = ("GPT-2 trains on an A100 at " + "/".join(f"{r / 1e3:g}k" for r in rates.values()) + " tokens/s in "
             + "/".join(k.upper() for k in rates) + ".")
    return (claim, f"No measurement is cited for these. What they would mean: GPT-2 small costs "
                   f"{flops / 1e9:.2f} GFLOP per trained token (6N plus attention, the count above), so "
                   + "; ".join(parts) + ". Rates like these say as much about the set-up they leave out (batch, "
                   "sequence length, compile mode, whether TF32 was on) as about the precision. This page's own "
                   "rates are measured, with their settings, above.")


def normalisation_erratum(ops: Sequence[OpCost], gpu: str = "H100 SXM5") -> tuple[str, str]:
    """The claim that tensor cores speed up normalisation layers, against the course model's layer norm's
    arithmetic intensity (from ``ops``, the roofline's operations) and ``gpu``'s ridge point."""
    norm = next((o for o in ops if o.name == "layer norm"), None)
    if norm is None:
        raise ValueError("ops lack the 'layer norm' operation")
    ridge = bf16_ridge(DATASHEET_PEAKS[gpu])
    return ("Tensor cores speed up BatchNorm and the other layers too.",
            f"Tensor cores run matrix products only. A normalisation does a few FLOPs per element it reads and "
            f"writes: the course model's layer norm does {norm.intensity:.1f} FLOPs per byte, {ridge / norm.intensity:.0f} "
            f"times below the {gpu}'s ridge point ({ridge:.0f} FLOPs per byte, the roofline above), so it is "
            f"memory-bound: bandwidth, not arithmetic, sets its time, and a batch norm is no different.")


def speed_evidence(sweep: MatmulSweep, device: torch.device | str,
                   recorded: Mapping[str, RecordedResult]) -> dict[str, object]:
    """The keyword arguments :func:`performance_errata_rows` takes for its speed erratum: the device's label,
    the live sweep and a recorded ``matmul_throughput`` one, and a recorded ``training_throughput`` study,
    from the lesson's ``recorded`` records by experiment name."""
    device = torch.device(device)
    live = measured_tflops(sweep)
    if device.type == "cpu":   # a CPU's FP8 product is an emulation: its slowness says nothing about fewer bits
        live = {dtype: points for dtype, points in live.items() if dtype != "fp8"}
    sweeps: dict[str, Mapping[str, Mapping[int, float]]] = {"live": live}
    studies: dict[str, ThroughputStudy] = {}
    if "matmul_throughput" in recorded:
        result = recorded["matmul_throughput"].result
        if not isinstance(result, MatmulThroughput):
            raise TypeError(f"expected a recorded MatmulThroughput, got {type(result).__name__}")
        sweeps[f"recorded {recorded['matmul_throughput'].label}"] = result.tflops()
    if "training_throughput" in recorded:
        result = recorded["training_throughput"].result
        if not isinstance(result, ThroughputStudy):
            raise TypeError(f"expected a recorded ThroughputStudy, got {type(result).__name__}")
        studies[f"the recorded {recorded['training_throughput'].label}"] = result
    return {"device_label": f"this {'GPU' if device.type == 'cuda' else 'CPU'}", "sweeps": sweeps, "studies": studies}


# bits of each matmul dtype's format (TF32's 19 of its 32 stored bits), to order them by precision
_FORMAT_BITS = {"fp32": 32, "tf32": 19, "bf16": 16, "fp16": 16, "fp8": 8}


# a GPU product that reaches less than this share of its dtype's best throughput in the same sweep is
# launch-bound: fixed per-call costs (the launch, the synchronisation), not its arithmetic, set its time
LAUNCH_BOUND_SHARE = 0.1


def launch_bound(tflops: Mapping[str, Mapping[int, float]], dtype: str, n: int,
                 share: float = LAUNCH_BOUND_SHARE) -> bool:
    """Whether ``dtype``'s product at size ``n`` in a GPU sweep ``{dtype: {n: TFLOP/s}}`` reached less than
    ``share`` of that dtype's best throughput in the sweep (:data:`LAUNCH_BOUND_SHARE`)."""
    if not 0 < share < 1:
        raise ValueError(f"share must lie in (0, 1), got {share!r}")
    points = tflops.get(dtype, {})
    if n not in points:
        raise ValueError(f"the sweep has no {dtype} product at n = {n}")
    return points[n] < share * max(points.values())


def product_microseconds(n: int, tflops: float) -> float:
    """The time of one ``n`` x ``n`` x ``n`` product (2n³ FLOPs) at ``tflops`` TFLOP/s, in microseconds."""
    if not tflops > 0:
        raise ValueError(f"tflops must be positive, got {tflops!r}")
    return 2 * n ** 3 / (tflops * 1e12) * 1e6


def slowest_lower_precision(tflops: Mapping[str, Mapping[int, float]], *,
                            skip_launch_bound: bool = False) -> tuple[str, str, int, float] | None:
    """In a sweep ``{dtype: {n: TFLOP/s}}``, the size where a dtype of fewer bits ran furthest below one of
    more bits: ``(lower, higher, n, lower's throughput over higher's)``, or None where fewer bits were never
    slower. ``skip_launch_bound``: leave out pairs where either product is :func:`launch_bound`."""
    unknown = sorted(set(tflops) - set(_FORMAT_BITS))
    if unknown:
        raise ValueError(f"unknown matmul dtypes {unknown}; known: {sorted(_FORMAT_BITS)}")
    worst = None
    for low, low_pts in tflops.items():
        for high, high_pts in tflops.items():
            if _FORMAT_BITS[low] >= _FORMAT_BITS[high]:
                continue
            for n in sorted(set(low_pts) & set(high_pts)):
                if skip_launch_bound and (launch_bound(tflops, low, n) or launch_bound(tflops, high, n)):
                    continue
                ratio = low_pts[n] / high_pts[n]
                if ratio < 1 and (worst is None or ratio < worst[3]):
                    worst = (low, high, n, ratio)
    return worst


def lower_precision_erratum(live_fp16_speed: float, device_label: str,
                            sweeps: Mapping[str, Mapping[str, Mapping[int, float]]],
                            studies: Mapping[str, ThroughputStudy], *, live_overlap: bool | None = None) -> str:
    """The evidence against "lower precision is always faster": FP16 autocast's measured speed over FP32's
    on ``device_label``, and whether the two recipes' token rates over seeds overlapped (``live_overlap``: then
    that ratio is within the run's noise); per labelled sweep, the product where fewer bits ran furthest below
    more (:func:`slowest_lower_precision`); per labelled study, BF16 autocast's eager token rate over TF32's
    (or FP32's, where TF32 did not run). Says so where a sweep shows no such product."""
    if not live_fp16_speed > 0:
        raise ValueError(f"live_fp16_speed must be positive, got {live_fp16_speed!r}")

    def sweep_part(label: str, tflops: Mapping[str, Mapping[int, float]]) -> str:
        where = f"the {label} sweep"
        on_cpu = label == "live" and "CPU" in device_label
        if on_cpu:   # speed_evidence leaves a CPU's emulated FP8 out
            where += f" on {device_label} (its FP8 product, an emulation, not compared)"
        worst = slowest_lower_precision(tflops)
        if worst is None:
            return f"In {where}, fewer bits were never slower."
        low, high, n, ratio = worst
        slower = (f"{DTYPE_LABELS[low]} ran at {ratio_text(ratio)} times the throughput of {DTYPE_LABELS[high]} "
                  f"at n = {n}")
        if on_cpu or not (launch_bound(tflops, low, n) or launch_bound(tflops, high, n)):
            return f"In {where}, {slower}: fewer bits, slower product."
        # a GPU's launch-bound product: fixed per-call costs, not its bits, set its time; named one by one, since
        # a pair counts as launch-bound where either product is
        times = and_list([f"{DTYPE_LABELS[d]} {product_microseconds(n, pts[n]):.1f} µs"
                          for d, pts in tflops.items() if n in pts])
        bound_names = [DTYPE_LABELS[d] for d in (low, high) if launch_bound(tflops, d, n)]
        which = ("both products are" if len(bound_names) == 2 else f"the {bound_names[0]} product is")
        text = (f"In {where}, {slower}, but at that size {which} launch-bound (under "
                f"{LAUNCH_BOUND_SHARE:.0%} of its dtype's best throughput in the sweep): fixed per-call costs, "
                f"not the bits, set its time ({times} per product).")
        bound = slowest_lower_precision(tflops, skip_launch_bound=True)
        if bound is None:
            return text + " Between pairs in which neither product was launch-bound, fewer bits were never slower."
        b_low, b_high, b_n, b_ratio = bound
        return (text + f" Between pairs in which neither product was launch-bound, {DTYPE_LABELS[b_low]} ran "
                f"furthest below {DTYPE_LABELS[b_high]} at n = {b_n}, at {ratio_text(b_ratio)} times its throughput.")

    # the GPU evidence (records) first; this machine's after it, a CPU's said to be one
    parts = [sweep_part(label, tflops) for label, tflops in sweeps.items() if label != "live"]
    for label, other in studies.items():
        rows = {row["recipe"]: row for row in other.table() if not row["compiled"]}
        base = "tf32" if "tf32" in rows else "fp32"
        if "bf16_autocast" in rows and base in rows:
            ratio = rows["bf16_autocast"]["tokens_per_s"] / rows[base]["tokens_per_s"]
            parts.append(f"On {label}, a whole BF16 autocast training step (eager) ran at {ratio:.2f} times "
                         f"{base.upper()}'s token rate.")
    noise = ("" if live_overlap is None else
             "; the two recipes' token rates over seeds overlap, so this run does not separate them" if live_overlap
             else "; the two recipes' token rates over seeds do not overlap")
    parts.append(f"On {device_label} FP16 autocast trains at {live_fp16_speed:.2f} times FP32's speed"
                 + (" (a CPU, so this is not a GPU's figure)" if "CPU" in device_label else "") + noise + ".")
    parts += [sweep_part(label, tflops) for label, tflops in sweeps.items() if label == "live"]
    return " ".join(parts)
