"""Lesson 6's facts, phrases, tables and errata rows, computed from the measurements and studies' results
(studies.performance, course_lib.bench) and from the recorded GPU runs."""

from __future__ import annotations

import math

from collections.abc import Mapping, Sequence


from ..bench import (
    DTYPE_LABELS,
    CPUPeakEstimate,
    MatmulSweep,
    OpCost,
    RooflineRow,
    matmul_flops,
    model_flops_per_token,
)
from ..glue import Prose, and_list, bold, count_word, percent_text, ratio_text, sig3
from ..hardware import DATASHEET_PEAKS, MATMUL_DTYPES, GPUPeaks, find_gpu_peaks
from ..memory import MemoryBreakdown, bytes_per_parameter, estimate_training_memory
from ..models import GPTConfig
from ..results import RecordedResult, describe_records
from ..tables import MarkdownTable, markdown_table
from .timing_prose import (   # noqa: F401 - lesson 6 reads the timing section's facts from here too
    recorded_matmul,
    recorded_cross_check,
    spread_against_quartiles,
    timer_comparison,
    timing_facts,
)
from .bf16 import Parity
from .memory_prose import by_recipe, recorded_size
from .performance_errata import gpt2_rates_erratum, lower_precision_erratum, normalisation_erratum
from .performance import (
    bf16_ridge,
    measured_tflops,
    ProfiledStep,
    ProfiledSteps,
    ThroughputStudy,
)


# ---- matrix-multiply throughput per dtype ------------------------------------------------------------

def matmul_panels(sweep: MatmulSweep, live_title: str,
                  record: RecordedResult | None = None) -> tuple[dict[str, dict], dict[str, dict[str, float]]]:
    """The panels of the throughput figure (title to ``{dtype: {n: TFLOP/s}}``): the live sweep under
    ``live_title`` and, given a recorded ``matmul_throughput`` run, the recorded one; with the datasheet
    peaks (TFLOP/s per dtype) of the recorded GPU where the datasheet table knows it."""
    panels: dict[str, dict] = {live_title: measured_tflops(sweep)}
    peaks: dict[str, dict[str, float]] = {}
    if record is not None:
        title = f"recorded: {record.label}"
        panels[title] = recorded_matmul(record).tflops()
        entry = find_gpu_peaks(record.provenance.device_name)
        if entry:
            peaks[title] = {d: p for d in MATMUL_DTYPES if (p := entry.peak(d))}
    return panels, peaks


def cpu_estimate_sentence(estimate: CPUPeakEstimate | None, best_fp32_tflops: float | None) -> Prose:
    """The CPU's FP32 peak estimated from cores, clock and FMA units, and the share of it the best FP32
    product reached; empty without an estimate (a GPU, or a CPU whose clock cannot be read)."""
    if estimate is None:
        return Prose("")
    if best_fp32_tflops is None:
        raise ValueError("an FP32 throughput is needed to compare with the CPU's estimated peak")
    return Prose(f"A CPU has no datasheet figure here; cores x clock x FLOPs per cycle ({estimate.cores} x "
                 f"{estimate.clock_ghz:.2f} GHz x {estimate.flops_per_cycle}, assuming {estimate.fma_units} FMA "
                 f"units of {estimate.vector_lanes} FP32 lanes) estimates its FP32 peak at {estimate.tflops:.2f} "
                 f"TFLOP/s, and the best FP32 product here reached "
                 f"{percent_text(best_fp32_tflops / estimate.tflops)} of that estimate." + (" More than 100% means the estimate is too low, not that the product beat "
                                        "the hardware: it takes the clock /proc/cpuinfo reports, and a CPU can run "
                                        "faster than that." if best_fp32_tflops > estimate.tflops else ""))


def matmul_facts(sweep: MatmulSweep, sizes: Sequence[int], estimate: CPUPeakEstimate | None, *,
                 noise_pct: float = 0.0) -> dict[str, object]:
    """The sweep at its largest multiple of 8 (``live_big``) and its largest size that is not one
    (``live_odd``): FP32's TFLOP/s at both, BF16's and FP16's throughput over FP32's at ``live_big`` (as
    :func:`glue.ratio_text` writes a speed ratio, the rule of every ratio on lesson 6's page); the
    CPU estimate's sentence; the dtypes and sizes not run, and why. ``noise_pct``: see :func:`misaligned_16bit_phrase`."""
    live = measured_tflops(sweep)
    missing = [d for d in ("fp32", "bf16", "fp16") if d not in live]
    if missing:
        raise ValueError(f"the sweep did not run {', '.join(missing)}; its facts compare BF16 and FP16 with FP32")
    aligned, misaligned = [n for n in sizes if n % 8 == 0], [n for n in sizes if n % 8]
    if not aligned or not misaligned:
        raise ValueError(f"sizes need a multiple of 8 and a size that is not one, got {tuple(sizes)}")
    big, odd = max(aligned), max(misaligned)
    skipped = "; ".join([*(f"{DTYPE_LABELS[d]} ({why})" for d, why in sweep.skipped.items()),
                         *(f"{DTYPE_LABELS[d]} at {note}" for d, note in sweep.left_out.items())]) or "none"
    return {"live_big": big, "live_odd": odd,
            "live_fp32_big": live["fp32"][big], "live_fp32_odd": live["fp32"][odd],
            "live_bf16_ratio": Prose(bold(ratio_text(live["bf16"][big] / live["fp32"][big]))),
            "live_fp16_ratio": Prose(bold(ratio_text(live["fp16"][big] / live["fp32"][big]))),
            "cpu_estimate": cpu_estimate_sentence(estimate, sweep.best("fp32")),
            "live_odd_16bit": misaligned_16bit_phrase({d: live[d][odd] / live[d][big] for d in ("bf16", "fp16")},
                                                      noise_pct=noise_pct),
            "skipped": Prose(skipped)}


def misaligned_16bit_phrase(ratios: dict[str, float], *, noise_pct: float = 0.0) -> Prose:
    """BF16's and FP16's throughput at the misaligned size over their own at the aligned one (``ratios`` by
    dtype), and whether misalignment slowed them, said of this device: a slowdown counts only where the share
    of throughput lost exceeds ``noise_pct``, how far the medians of one product moved here
    (:func:`~course_lib.studies.timing_prose.sweep_drift`)."""
    if not ratios or any(not (isinstance(r, float | int) and math.isfinite(r) and r > 0) for r in ratios.values()):
        raise ValueError(f"ratios must map dtypes to positive finite throughput ratios, got {ratios!r}")
    if not (math.isfinite(noise_pct) and noise_pct >= 0):
        raise ValueError(f"noise_pct must be a finite non-negative percentage, got {noise_pct!r}")
    said = " and ".join(DTYPE_LABELS[d] for d in ratios)
    values = " and ".join(ratio_text(r) for r in ratios.values())
    slowed = [DTYPE_LABELS[d] for d, r in ratios.items() if 100 * (1 - r) > noise_pct]
    within = [DTYPE_LABELS[d] for d, r in ratios.items() if r < 1 and DTYPE_LABELS[d] not in slowed]
    noise = f" the {noise_pct:.1f}% the medians of one product moved here"
    verdict = ("misalignment did not slow them here" if not slowed and not within else
               f"neither slowed beyond{noise}" if not slowed else
               f"misalignment slowed {'' if len(slowed) == len(ratios) else 'only '}{' and '.join(slowed)}"
               + (f" beyond{noise}" if noise_pct else "")
               + (f" ({' and '.join(within)} lost less than that)" if within else ""))
    return Prose(f"{said} ran at {values} times their own throughput at the aligned size: {verdict}")


def recorded_matmul_note(record: RecordedResult) -> Prose:
    """What a recorded ``matmul_throughput`` sweep shows: BF16 at its largest size (against the datasheet
    peak where known, and against FP32), FP8 there, the cost of one element less than the largest aligned
    size with a misaligned neighbour, and the smallest size; then the record's provenance."""
    g = recorded_matmul(record).tflops()
    entry = find_gpu_peaks(record.provenance.device_name)
    bf16, fp32 = g["bf16"], g["fp32"]
    top, small = max(bf16), min(bf16)
    aligned = max(n for n in bf16 if n % 8 == 0 and n - 1 in bf16)
    first = f"On the recorded **{record.label}**, BF16 reaches {bf16[top]:.0f} TFLOP/s at n = {top}"
    bf16_peak = entry.peak("bf16") if entry else None
    if entry and bf16_peak:
        first += f", {100 * bf16[top] / bf16_peak:.0f}% of the datasheet's dense {bf16_peak:g}"
    first += f", {bf16[top] / fp32[top]:.1f} times FP32 with TF32 off ({fp32[top]:.1f} TFLOP/s)"
    lines = [first]
    if "fp8" in g and top in g["fp8"]:
        fp8 = g["fp8"][top]
        fp8_peak = entry.peak("fp8") if entry else None
        lines.append(f"FP8 reaches {fp8:.0f} TFLOP/s, {fp8 / bf16[top]:.2f} times BF16"
                     + (f" and {100 * fp8 / fp8_peak:.0f}% of its dense peak" if fp8_peak else ""))
    lines.append(f"One element less, n = {aligned - 1}, costs BF16 a factor of "
                 f"{bf16[aligned] / bf16[aligned - 1]:.1f} ({bf16[aligned - 1]:.0f} against "
                 f"{bf16[aligned]:.0f} TFLOP/s): tensor cores want dimensions in multiples of 8 (16 bytes)")
    lines.append(f"At n = {small}, BF16 gives {bf16[small]:.1f} TFLOP/s against FP32's "
                 f"{fp32[small]:.1f}: a small product is launch-bound, and a faster dtype buys little")
    return Prose(". ".join(lines) + ".\n\n" + describe_records([record]))


# ---- the roofline --------------------------------------------------------------------------------------

def roofline_ceilings(sweep: MatmulSweep, bandwidth_gbs: float,
                      device_type: str) -> dict[str, tuple[float, float]]:
    """The roofline figure's ceilings, label to (TFLOP/s, GB/s): the H100's and the A100's datasheet BF16
    peaks and bandwidths, and this device's best measured product with its measured copy bandwidth, labelled
    with the dtype that reached it (on a CPU without BF16 instructions it is FP32's)."""
    live = measured_tflops(sweep)
    if not live:
        raise ValueError("the sweep measured no dtype")
    h100, a100 = DATASHEET_PEAKS["H100 SXM5"], DATASHEET_PEAKS["A100 SXM4 80GB"]
    best, dtype = max((v, d) for d in live if (v := sweep.best(d)) is not None)
    return {"H100 SXM5 BF16 (datasheet)": (h100.peak("bf16") or 0.0, h100.bandwidth_gbs),
            "A100 BF16 (datasheet)": (a100.peak("bf16") or 0.0, a100.bandwidth_gbs),
            f"this {device_type.upper()}, best measured ({dtype.upper()})": (best, bandwidth_gbs)}


def roofline_facts(ops: Sequence[OpCost], bandwidth_gbs: float, gpu: GPUPeaks) -> dict[str, object]:
    """This device's copy bandwidth (GB/s), ``gpu``'s BF16 ridge point (FLOPs per byte) and the operations
    whose intensity lies below it (memory-bound there), in order."""
    ridge = bf16_ridge(gpu)
    return {"bandwidth": bandwidth_gbs, "h100_ridge": ridge,
            "memory_bound": Prose(", ".join(o.name for o in ops if o.intensity < ridge))}


def speedup_table(vs_tf32: Mapping[str, RooflineRow], vs_fp32: Mapping[str, RooflineRow]) -> MarkdownTable:
    """Per operation, where it is bound in BF16, in TF32 and in FP32 with TF32 off, and the roofline's BF16
    speed-up over each wider one (a column per baseline, so that TF32's bound explains its speed-up)."""
    if set(vs_tf32) != set(vs_fp32):
        raise ValueError("the two predictions must cover the same operations")
    return markdown_table(
        ("operation", "bound in BF16", "bound in TF32", "BF16 over TF32", "bound in FP32 (TF32 off)",
         "BF16 over FP32 (TF32 off)"),
        [(name, r.bound_low, r.bound_high, f"{r.speedup:.2f}x", vs_fp32[name].bound_high,
          f"{vs_fp32[name].speedup:.2f}x") for name, r in vs_tf32.items()])


def speedup_facts(vs_tf32: Mapping[str, RooflineRow], vs_fp32: Mapping[str, RooflineRow]) -> dict[str, object]:
    """The largest predicted speed-up of an operation memory-bound in both dtypes (the optimizer step left
    out: its state stays FP32), and the largest of any operation over TF32 and over FP32."""
    both_memory = [r.speedup for r in vs_tf32.values() if r.bound_low == r.bound_high == "memory"
                   and r.name != "AdamW step"]
    if not both_memory:
        raise ValueError("no operation is memory-bound in both dtypes")
    return {"mem_speedup": max(both_memory),
            "compute_speedup_fp32": max(r.speedup for r in vs_fp32.values()),
            "compute_speedup_tf32": max(r.speedup for r in vs_tf32.values())}


# ---- training throughput, time to a target -------------------------------------------------------------

def _seeds_overlap(a: Mapping, b: Mapping) -> bool | None:
    """Whether two eager rows' token rates over seeds (``tokens_per_s_range``) share a point; None where either
    ran one seed, whose range is no spread."""
    if min(a["seeds"], b["seeds"]) < 2:
        return None
    (a_lo, a_hi), (b_lo, b_hi) = a["tokens_per_s_range"], b["tokens_per_s_range"]
    return a_lo <= b_hi and b_lo <= a_hi


def _eager_rows(study: ThroughputStudy) -> dict[str, dict]:
    rows = {row["recipe"]: row for row in study.table() if not row["compiled"]}
    missing = [r for r in ("fp32", "bf16_autocast", "fp16_autocast_scaler") if r not in rows]
    if missing:
        raise ValueError(f"the study has no eager run of {', '.join(missing)}")
    return rows


def throughput_facts(study: ThroughputStudy, *, on_gpu: bool) -> dict[str, object]:
    """BF16's and FP16's token rate over FP32's (eager runs, median over seeds, as :func:`glue.ratio_text`
    writes a speed ratio), FP32's MFU (as :func:`glue.percent_text` writes a share) and the peak
    it is measured against, the number of seeds of the eager runs, and the caveat that fits where the study
    ran (``on_gpu``) and whether it compiled."""
    rows = _eager_rows(study)
    fp32 = rows["fp32"]
    if fp32["mfu"] is None:
        raise ValueError("the study has no peak to measure FP32's MFU against")
    compiled = sorted({r.recipe for r in study.runs if r.compiled})
    if not on_gpu:
        caveat = ("These are this machine's ratios only: they do not transfer to a GPU's tensor cores. The live "
                  "runs skip `torch.compile` to keep the page quick; the recorded GPU runs "
                  "include it. A CPU has no datasheet peak, and this page uses three measured ones, each named "
                  "where it is used: the MFU above divides by the capability probe's FP32 product (the one named "
                  "above, measured once per process and reused); the "
                  "ladder's MFU divides by the probe's fastest dtype, which need not be FP32; and the roofline's "
                  "ceiling is the best median of this page's sweep. The probe keeps each dtype's best round and "
                  "the sweep each size's median, and on a shared machine the two can differ (the sentence after "
                  "the probe's table compares them at the probe's size): an MFU here is a share of one measured "
                  "rate, not of the machine's peak.")
    elif compiled:
        caveat = (f"The live runs compile {and_list([f'`{r}`' for r in compiled])} with `torch.compile` (one "
                  "seed, blue in the figure); `python -m course_lib.gpu_session` records every recipe compiled in the model "
                  "ladder below.")
    else:
        caveat = ("The live runs skip `torch.compile`; `python -m course_lib.record training_throughput` measures "
                  "compiled runs too.")
    return {"tp_seeds": len({r.seed for r in study.runs if not r.compiled}),
            "live_bf16_speed": Prose(bold(ratio_text(rows["bf16_autocast"]["tokens_per_s"] / fp32["tokens_per_s"]))),
            "live_fp16_speed": Prose(bold(ratio_text(rows["fp16_autocast_scaler"]["tokens_per_s"]
                                                     / fp32["tokens_per_s"]))),
            "live_fp32_mfu": Prose(bold(percent_text(fp32["mfu"]))),
            "mfu_source": Prose(study.peak_source),
            "throughput_caveat": Prose(caveat)}


def recorded_seeds_phrase(study: ThroughputStudy | None) -> Prose:
    """How many seeds the recorded GPU run trained each recipe, eager and compiled (``None``: no record)."""
    if study is None:
        return Prose("no GPU run is recorded yet")
    if not isinstance(study, ThroughputStudy):
        raise TypeError(f"expected a recorded ThroughputStudy, got {type(study).__name__}")

    def seeds(compiled: bool) -> str:
        n = len({r.seed for r in study.runs if r.compiled == compiled})
        return f"{count_word(n)} seed{'' if n == 1 else 's'}"
    compiled = any(r.compiled for r in study.runs)
    return Prose(f"the recorded GPU run: {seeds(False)} eager" + (f", {seeds(True)} compiled" if compiled else ""))


def recorded_throughput_note(record: RecordedResult) -> Prose:
    """A recorded ``training_throughput`` run: BF16's speed-up and MFU in a sentence, a table of every
    recipe, eager and compiled, and the record's provenance."""
    study = record.result
    if not isinstance(study, ThroughputStudy):
        raise TypeError(f"expected a recorded ThroughputStudy, got {type(study).__name__}")
    rows = {(r["recipe"], r["compiled"]): r for r in study.table()}
    base, bf16 = rows.get(("fp32", False)), rows.get(("bf16_autocast", False))
    if base is None or bf16 is None or bf16["mfu"] is None:
        raise ValueError("the recorded study needs eager fp32 and bf16_autocast runs, with a BF16 peak")
    ref_peak = study.peaks["bf16_autocast"]

    def against_bf16(r: dict) -> float:
        return r["tokens_per_s"] * study.flops_per_token / (ref_peak * 1e12)

    table = markdown_table(
        ("recipe", "compiled", "step (ms)", "tokens/s", "vs FP32 eager", "MFU (own peak, TFLOP/s)",
         "MFU (BF16 peak)"),
        [(recipe, "yes" if compiled else "no", f"{r['step_ms']:.1f}", f"{r['tokens_per_s']:,.0f}",
          f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x",
          f"{100 * r['mfu']:.1f}% of {peak:g}" if r["mfu"] is not None and (peak := study.peaks.get(recipe))
          else "-", f"{100 * against_bf16(r):.1f}%")
         for (recipe, compiled), r in rows.items()])
    # ranked over every row, eager and compiled, as the table below shows them
    own_best = max((k for k in rows if rows[k]["mfu"] is not None), key=lambda k: rows[k]["mfu"])
    ref_best = max(rows, key=lambda k: against_bf16(rows[k]))

    def named(key: tuple[str, bool]) -> str:
        return f"{key[0]} ({'compiled' if key[1] else 'eager'})"
    text = (f"Recorded on **{record.label}** {recorded_size(record)} ({study.peak_source}; compiled runs: one "
            f"seed). BF16 autocast runs {bf16['tokens_per_s'] / base['tokens_per_s']:.2f} times as many tokens "
            f"per second as FP32, yet it uses only {100 * bf16['mfu']:.1f}% of the BF16 peak: a model of this "
            f"size keeps the GPU busy with launches and memory-bound operations, not with matrix products. The "
            f"two MFU columns divide the same FLOP rate by different peaks: each recipe's own dtype's, and the "
            f"dense BF16 peak ({ref_peak:g} TFLOP/s) for every recipe, as the ladder below and the literature do. "
            f"They differ by the ratio of the peaks: of all the runs in the table, {named(own_best)} has the "
            f"highest MFU against its own peak, {100 * rows[own_best]['mfu']:.1f}%; against the one BF16 peak "
            f"the runs rank as their token rates do, {named(ref_best)} highest at "
            f"{100 * against_bf16(rows[ref_best]):.1f}% and fp32 (eager) at {100 * against_bf16(base):.1f}%.")
    return Prose(text + "\n\n" + table.rstrip("\n") + "\n\n" + describe_records([record]))


def _time_ranges(times: Mapping[str, Sequence[float | None]]) -> dict[str, tuple[float, float]]:
    out = {}
    for name, v in times.items():
        reached = [s for s in v if s is not None]
        if not reached or len(reached) < len(v):
            raise ValueError(f"not every run of {name} reached the target")
        out[name] = (min(reached), max(reached))
    return out


def time_to_target_facts(target: float, times: Mapping[str, Sequence[float | None]], *,
                         on_gpu: bool = False) -> dict[str, object]:
    """The target loss and, per recipe, the range over seeds of the seconds to reach it (every run must);
    off a GPU (``on_gpu`` false), the caveat that these times come from CPU kernels."""
    ranges = _time_ranges(times)
    caveat = "" if on_gpu else (
        " These are CPU times: the 16-bit recipes ran on this CPU's kernels, not on a GPU's tensor cores, so "
        "their times say nothing about a GPU's (the matrix-product sweep above measured this CPU's 16-bit "
        "products against FP32's).")
    return {"target": target,
            "ttt": Prose(", ".join(f"{name} {sig3(lo)} to {sig3(hi)} s" for name, (lo, hi) in ranges.items())),
            "ttt_order": time_to_target_order(ranges), "ttt_caveat": Prose(caveat)}


def time_to_target_order(ranges: Mapping[str, tuple[float, float]], base: str = "fp32") -> Prose:
    """Each recipe's range of seconds to the target against ``base``'s: first or later in every seed only
    where the two ranges do not overlap, else no order (as a sentence; empty without ``base`` or others)."""
    if base not in ranges or len(ranges) < 2:
        return Prose("")
    lo, hi = ranges[base]
    parts = []
    for name, (a, b) in ranges.items():
        if name == base:
            continue
        parts.append(f"`{name}` reached it before `{base}` in every seed (its slowest run before the fastest of "
                     f"`{base}`)" if b < lo else
                     f"`{name}` reached it after `{base}` in every seed (its fastest run after the slowest of "
                     f"`{base}`)" if a > hi else
                     f"the range of `{name}` overlaps that of `{base}`, so neither came first in every seed")
    text = "; ".join(parts)
    return Prose(" " + text[0].upper() + text[1:] + ".")


def recorded_time_to_target_note(study: ThroughputStudy) -> Prose:
    """A recorded study's eager runs: per recipe whose every seed reached the study's target, the range of
    seconds to reach it, and why compiled runs are left out."""
    target = study.target_loss()
    times = study.time_to_target(target)
    parts = [f"{name}: {sig3(min(v))} to {sig3(max(v))} s" for name, v in _reached_ranges(times)]
    seeds = len({r.seed for r in study.runs if not r.compiled})
    return Prose(f"On the recorded GPU, to reach {target:.3f} (eager runs, range over {seeds} seed{'s' if seeds != 1 else ''}): "
                 + "; ".join(parts) + ". Compiled runs are left out here: their first steps include "
                 "compilation, which a compile cache warmed by the previous recipe shortens, so their "
                 "times to target are not comparable with each other.")


def fp16_against_parity_record(study: ThroughputStudy, parity: RecordedResult | None,
                               recipe: str = "fp16_autocast_scaler") -> Prose:
    """Where lesson 5's ``convergence_parity`` record (``parity``) ended ``recipe`` with a NaN loss in some
    seeds while every eager run of it in the recorded ``study`` stayed finite: that they are different runs, how
    many steps each trained, and where the parity record's first seed, whose curve it keeps, failed. Empty
    where there is nothing to reconcile."""
    if not isinstance(study, ThroughputStudy):
        raise TypeError(f"expected a recorded ThroughputStudy, got {type(study).__name__}")
    if parity is None:
        return Prose("")
    result = parity.result
    if not isinstance(result, Parity):
        raise TypeError(f"parity must be a recorded convergence_parity (Parity), got {type(result).__name__}")
    runs = [r for r in study.runs if r.recipe == recipe and not r.compiled]
    failed = sum(not math.isfinite(v) for v in result.final_losses.get(recipe, ()))
    if not runs or not failed or not all(math.isfinite(v) for r in runs for v in r.losses):
        return Prose("")
    steps = max(len(r.losses) for r in runs)
    curve = result.curves.get(recipe, ())
    first = next((i for i, v in enumerate(curve) if not math.isfinite(v)), None)
    if first is None:
        when = "the record keeps the curve of a seed that did not fail, so it does not say at which step the others did"
    else:
        when = (f"seed {result.seeds[0]}, whose curve the record keeps, first failed at step {first:,} "
                + ("(counting from 0), after the last step these runs trained" if first >= steps else
                   "(counting from 0), within the steps these runs trained, where this record's seeds did not fail"))
    return Prose(f"Every eager `{recipe}` run of this record stayed finite over its {steps:,} steps, yet the parity "
                 f"record in {{doc}}`05_bf16_vs_fp16`, on {parity.label}, ended that recipe with a NaN loss in "
                 f"{failed} of {len(result.seeds)} seeds. They are different runs: the parity runs trained "
                 f"{result.steps:,} steps, and {when}.")


def _reached_ranges(times: Mapping[str, Sequence[float | None]]) -> list[tuple[str, list[float]]]:
    """The recipes whose every run reached the target, with their seconds."""
    return [(name, [s for s in v if s is not None]) for name, v in times.items() if v and None not in v]


# ---- where a step's time goes ------------------------------------------------------------------------

CAST_ROW = "casts: `aten::_to_copy` + `aten::copy_`"


def top_ops_table(steps: Mapping[str, ProfiledStep]) -> MarkdownTable:
    """Per recipe, its profiled step's top operators: self time (ms) and calls; then a row :data:`CAST_ROW`
    with the self times of ``aten::_to_copy`` and ``aten::copy_`` added, listed or not (the cast time the prose
    quotes; calls "-": the step keeps their sum only)."""
    rows: list[tuple[str, str, str, int | str]] = []
    for r, s in steps.items():
        rows += [(r, f"`{name}`", f"{us / 1e3:.2f}", calls) for name, us, calls in s.top_ops]
        rows.append((r, CAST_ROW, f"{s.cast_us / 1e3:.2f}", "-"))
    return markdown_table(("recipe", "operator", "self time (ms)", "calls"), rows)


def cast_facts(steps: Mapping[str, ProfiledStep]) -> dict[str, object]:
    """The share (%) and self time (ms) of operator time spent in casts, in FP32 and under BF16 autocast, and
    a phrase that says what the difference shows (:func:`cast_verdict`)."""
    if missing := [r for r in ("fp32", "bf16_autocast") if r not in steps]:
        raise ValueError(f"cast_facts needs a profiled {missing[0]} step")
    fp32, bf16 = steps["fp32"], steps["bf16_autocast"]
    return {"cast_fp32": 100 * fp32.cast_fraction, "cast_bf16": 100 * bf16.cast_fraction,
            "cast_fp32_ms": fp32.cast_us / 1e3, "cast_bf16_ms": bf16.cast_us / 1e3,
            "cast_verdict": cast_verdict(fp32, bf16)}


def cast_verdict(fp32: ProfiledStep, bf16: ProfiledStep, *, margin: float = 1.1,
                 where: str = "this machine") -> Prose:
    """What a BF16 autocast step's casts against an FP32 step's show: autocast's price where they take more time
    and a larger share (by ``margin``), else why not (``where``: the machine, as the sentence names it)."""
    if not margin >= 1:
        raise ValueError(f"margin must be at least 1, got {margin!r}")
    more_time = bf16.cast_us > margin * fp32.cast_us
    more_share = bf16.cast_fraction > margin * fp32.cast_fraction
    if more_time and more_share:
        return Prose(f"autocast adds {(bf16.cast_us - fp32.cast_us) / 1e3:.2f} ms "
                     f"({100 * (bf16.cast_fraction - fp32.cast_fraction):.1f} points) of casts and copies, the price "
                     "it pays for converting weights and activations on the fly (one profiled step per recipe: a "
                     "single measurement, with no repeat to show its noise)")
    if more_time:
        return Prose(f"autocast's conversions add time, but the step's other operators grew more, so their share "
                     f"did not: on {where} the low-precision operators, not the casts, are the cost")
    if bf16.cast_us <= fp32.cast_us:
        return Prose(f"on {where} autocast's conversions took no longer than FP32's own copies "
                     f"({bf16.cast_us / 1e3:.2f} against {fp32.cast_us / 1e3:.2f} ms), so the price of casting does "
                     "not show there")
    return Prose(f"on {where} autocast's conversions took no more than {100 * (margin - 1):.0f}% longer than "
                 "FP32's own copies, so the price of casting does not show there")


def recorded_profile_note(record: RecordedResult) -> Prose:
    """A recorded ``profiled_step`` run: each recipe's cast share and top three operators, and provenance."""
    if not isinstance(record.result, ProfiledSteps):
        raise TypeError(f"expected recorded ProfiledSteps, got {type(record.result).__name__}")
    steps = record.result.steps
    parts = [f"{s.recipe} {100 * s.cast_fraction:.1f}%" for s in steps]
    tops = [f"{s.recipe}: " + ", ".join(f"`{op[0]}`" for op in s.top_ops[:3]) for s in steps]
    by = {s.recipe: s for s in steps}   # read as the page's own step is: on a GPU, the GPU's reading holds
    verdict = (" There, " + cast_verdict(by["fp32"], by["bf16_autocast"], where="that GPU") + "."
               if {"fp32", "bf16_autocast"} <= set(by) else "")
    return Prose(f"On the recorded **{record.label}** (CUDA time), casts take " + ", ".join(parts)
                 + " of the operator time." + verdict + " Top three operators: " + "; ".join(tops) + ".\n\n"
                 + describe_records([record]))


# ---- errata and exercises ------------------------------------------------------------------------------

def performance_errata_rows(config: GPTConfig, breakdowns: Sequence[MemoryBreakdown], study: ThroughputStudy,
                            *, batch: int = 64, device_label: str = "this machine",
                            sweeps: Mapping[str, Mapping[str, Mapping[int, float]]] | None = None,
                            studies: Mapping[str, ThroughputStudy] | None = None,
                            ops: Sequence[OpCost] = ()) -> list[tuple[str, str]]:
    """Lesson 6's errata, (claim, what was measured) pairs: the A100's dense FP16 and TF32 peaks; the FLOPs
    of the MLP up-projection of a model shaped like ``config`` at ``batch`` sequences, 2MNK against 2mn²;
    bytes per parameter from ``breakdowns`` and the memory model; whether lower precision was always faster,
    from ``study`` (live, on ``device_label``) and the labelled ``sweeps`` (``{dtype: {n: TFLOP/s}}``) and
    ``studies`` (:func:`lower_precision_erratum`)."""
    a100 = DATASHEET_PEAKS["A100 SXM4 80GB"]
    by = by_recipe(breakdowns)
    rows = _eager_rows(study)
    autocast = by["bf16_autocast"]
    m, d = batch * config.context, config.d_model
    bpp_amp = sum(bytes_per_parameter("bf16_autocast").values())
    speed = rows["fp16_autocast_scaler"]["tokens_per_s"] / rows["fp32"]["tokens_per_s"]
    return [
        ("The A100 does 624 TFLOP/s in FP16.",
         f"624 is the figure with 2:4 structured sparsity; the dense FP16 peak is {a100.peak('fp16'):g} TFLOP/s "
         f"(and {a100.peak('tf32'):g} for TF32)."),
        ("A matmul costs 2mn² FLOPs.",
         f"[M, K] @ [K, N] costs 2MNK; for the course model's MLP up-projection at batch {batch} "
         f"({m} x {d} @ {d} x {4 * d}) that is {matmul_flops(m, 4 * d, d):,}, not {2 * m * (4 * d) ** 2:,}."),
        ("Mixed precision training with Adam needs 12 bytes per parameter.",
         f"12 is only the FP32 optimizer state: master weights and Adam's two moments (ZeRO's K = 12 "
         f"{{cite:p}}`rajbhandari2020zero`). The weights and gradients come on top: 2 + 2 in ZeRO's FP16 scheme, "
         f"16 in all; under torch.amp there is no separate master copy, but the weights and gradients are FP32, "
         f"measured here {autocast.per_parameter():g} in all; BF16 weights with FP32 masters in the "
         f"course's loop: {by['bf16_master'].per_parameter():g}."),
        ("Mixed precision halves training memory.",
         f"Under torch.amp the persistent state is unchanged ({bpp_amp} bytes per parameter); only activations "
         f"shrink, here to {autocast.components['activations'] / by['fp32'].components['activations']:.2f} "
         f"of FP32's."),
        ("With AMP a 7B model keeps an FP16 copy of its weights and FP16 gradients.",
         f"torch.amp keeps FP32 weights and FP32 gradients; its 16-bit weight copies are made in the forward pass "
         f"and freed after backward ({autocast.components['autocast_weight_copies'] / 1024:.0f} KiB "
         f"during a step of this page's model). For 7B parameters the persistent state is "
         f"{estimate_training_memory(7e9, 'bf16_autocast')['total'] / 1e9:.0f} GB."),
        ("Lower precision is always faster.",
         lower_precision_erratum(speed, device_label, sweeps or {}, studies or {},
                                 live_overlap=_seeds_overlap(rows["fp16_autocast_scaler"], rows["fp32"]))),
        *([normalisation_erratum(ops)] if ops else []),
        gpt2_rates_erratum(),
    ]


def exercise_facts(ops: Sequence[OpCost], config: GPTConfig, *, batch: int) -> dict[str, object]:
    """The numbers of the exercises: a 7B model's FLOPs per token (GFLOP), its rate and MFU at 3,000
    tokens/s against the H100's dense and sparse BF16 peak; the FLOPs 4095 saves against 4096 (%); the
    vocabulary 50,257 padded to a multiple of 64; the A100's ridge point; the softmax's and the MLP
    up-projection's intensities among ``ops`` (FLOPs per byte), and the up-projection's shape
    ``[M, K] @ [K, N]`` for ``config`` at ``batch`` sequences (``ops`` must be that model's)."""
    by_name = {o.name: o for o in ops}
    for name in ("softmax", "MLP up"):
        if name not in by_name:
            raise ValueError(f"ops lack the {name!r} operation")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    m, k, n = batch * config.context, config.d_model, 4 * config.d_model
    if by_name["MLP up"].flops != matmul_flops(m, n, k):
        raise ValueError(f"ops' MLP up-projection is not {m} x {k} @ {k} x {n}: build ops for this config "
                         f"and batch {batch}")
    h100, a100, l4 = DATASHEET_PEAKS["H100 SXM5"], DATASHEET_PEAKS["A100 SXM4 80GB"], DATASHEET_PEAKS["L4"]
    h100_bf16, a100_bf16 = h100.peak("bf16"), a100.peak("bf16")
    if h100_bf16 is None or a100_bf16 is None:
        raise ValueError("the H100's or the A100's datasheet entry lacks its BF16 peak")
    flops = model_flops_per_token(6_500_000_000, 32, 4096, 4096)
    return {"ex_flops": flops / 1e9, "ex_rate": 3000 * flops / 1e12,
            "ex_mfu": 100 * 3000 * flops / (h100_bf16 * 1e12),
            "ex_mfu_sparse": 100 * 3000 * flops / (2 * h100_bf16 * 1e12),
            "h100_bf16": h100_bf16,
            "ex_fewer_flops": 100 * (1 - (4095 / 4096) ** 3),
            "ex_vocab": -(-50257 // 64) * 64,
            "a100_ridge": bf16_ridge(a100), "a100_bf16": a100_bf16, "a100_bw": a100.bandwidth_gbs,
            "ex_softmax_ai": by_name["softmax"].intensity, "ex_mlp_ai": by_name["MLP up"].intensity,
            "ex_mlp_m": m, "ex_mlp_k": k, "ex_mlp_n": n,
            "l4_ridge": bf16_ridge(l4), "l4_bf16": l4.peak("bf16"), "l4_bw": l4.bandwidth_gbs,
            "ex_mlp_l4": ridge_phrase(by_name["MLP up"].intensity, bf16_ridge(l4))}


def ridge_phrase(intensity: float, ridge: float, *, near: float = 0.05) -> Prose:
    """Which ceiling limits an operation of ``intensity`` FLOPs per byte on a roofline whose ridge is at
    ``ridge``, saying so when the two lie within ``near`` (a share) of each other, where the model cannot
    tell which limits it."""
    for name, v in (("intensity", intensity), ("ridge", ridge), ("near", near)):
        if isinstance(v, bool) or not isinstance(v, float | int) or not (math.isfinite(v) and v > 0):
            raise ValueError(f"{name} must be a positive finite number, got {v!r}")
    bound = "memory-bound" if intensity < ridge else "compute-bound"
    gap = abs(intensity / ridge - 1)
    if gap <= near:
        return Prose(f"{bound}, but only {100 * gap:.1f}% from the ridge, where the two ceilings meet: at the "
                     "ridge neither limit dominates, and a model this simple cannot say which one a real kernel "
                     "meets first")
    return Prose(f"{bound}, {100 * gap:.0f}% {'below' if intensity < ridge else 'above'} the ridge")
