"""Lesson 6's first section, timing a matrix product: the harness's repeated medians against one
measurement's quartiles and against ``torch.utils.benchmark.Timer``, live and recorded."""

from __future__ import annotations

import math
from collections.abc import Sequence

from ..bench import CapabilityProbe, MatmulPoint, MatmulSweep
from ..glue import Prose, and_list, count_word, ratio_text
from ..results import RecordedResult
from ..tables import markdown_table
from .performance import MatmulThroughput


# ---- timing a matrix product -------------------------------------------------------------------------

def _printed_ms(seconds: Sequence[float]) -> list[float]:
    """Milliseconds to three decimals, as the page prints medians, so that percentages of them are a reader's
    own; unrounded where one would print as 0.000 (a GPU's product of microseconds)."""
    printed = [round(1e3 * s, 3) for s in seconds]
    return printed if min(printed) > 0 else [1e3 * s for s in seconds]


def timing_facts(points: Sequence[MatmulPoint], timer_seconds: float) -> dict[str, object]:
    """The first of ``points`` (repeated measurements of one product, at least two): its size, median and
    quartiles (ms), repeats and TFLOP/s; the range of the medians over all of them (ms, and how far apart in
    %), and a phrase that says whether that range is wider than the first measurement's quartiles; and the
    first median against ``torch.utils.benchmark.Timer``'s, ``timer_seconds``, as a phrase that judges the gap
    against the spread of the repeated medians (a difference of medians is judged by how far a median moves,
    not by how far single calls spread). Both percentages are of the medians as the page prints them (ms, three
    decimals)."""
    if len(points) < 2:
        raise ValueError("timing_facts needs at least two measured points: their medians' spread is the noise "
                         "a median's gap is judged by")
    if not timer_seconds > 0:
        raise ValueError(f"timer_seconds must be positive, got {timer_seconds!r}")
    point = points[0]
    t = point.timing
    medians = [p.timing.median for p in points]
    *medians, timer_seconds = (ms / 1e3 for ms in _printed_ms([*medians, timer_seconds]))
    spread = 100 * (max(medians) / min(medians) - 1)
    return {"t_n": point.n, "t_median_ms": 1e3 * t.median, "t_q25_ms": 1e3 * t.q25, "t_q75_ms": 1e3 * t.q75,
            "t_repeats": t.repeats, "t_tflops": point.tflops,
            "t_min_ms": 1e3 * min(medians), "t_max_ms": 1e3 * max(medians), "t_runs_spread": spread,
            "t_vs_timer": timer_comparison(100 * (medians[0] / timer_seconds - 1), spread, len(points),
                                           one_side=all(m > timer_seconds for m in medians)
                                           or all(m < timer_seconds for m in medians)),
            "t_spread_vs_quartiles": spread_against_quartiles(min(medians), max(medians), t.q25, t.q75)}


def timer_comparison(diff_pct: float, spread_pct: float, measurements: int, *, one_side: bool = False) -> Prose:
    """The harness's median against ``torch.utils.benchmark.Timer``'s, ``diff_pct`` percent apart (positive:
    the harness reads higher), judged against ``spread_pct``, how far apart the harness's ``measurements``
    repeated medians of the same product lie (the noise of a median, the right yardstick for a difference of
    medians). Within that spread the phrase says the two agree; beyond it, every repeated median lies on the
    same side of Timer's, so the harness reads consistently higher (or lower) by the gap, and a reason is
    offered only as a possibility and only where its sign fits: per-call synchronisation and rotated buffers
    can make the harness slower than Timer's blocks of calls on one reused buffer, never faster. ``one_side``:
    whether every repeated median lies on the same side of Timer's; within the spread it is then said, since
    one Timer measurement cannot tell such a lean from noise."""
    if not (math.isfinite(spread_pct) and spread_pct >= 0):
        raise ValueError(f"spread_pct must be a finite non-negative percentage, got {spread_pct!r}")
    if not math.isfinite(diff_pct):
        raise ValueError(f"diff_pct must be finite, got {diff_pct!r}")
    if isinstance(measurements, bool) or not isinstance(measurements, int) or measurements < 2:
        raise ValueError(f"measurements must be an int of at least 2, got {measurements!r}")
    side = "higher" if diff_pct >= 0 else "lower"
    timer = "the median of PyTorch's own `torch.utils.benchmark.Timer` on the same shape"
    noise = (f"the {spread_pct:.1f}% by which its own {measurements} repeated medians of this product spread "
             "(given below), the noise of a median here")
    if abs(diff_pct) <= spread_pct:
        lean = (f", though all {measurements} repeated medians lie {side} than Timer's, a lean that one Timer "
                "measurement cannot tell from noise" if one_side else "")
        return Prose(f"within {abs(diff_pct):.1f}% of {timer} ({side}), no more than {noise}: the two tools agree "
                     f"within this machine's noise{lean}")
    gap = (f"{abs(diff_pct):.1f}% {side} than {timer}, more than {noise}: every repeated median lies {side} "
           f"than Timer's, so the harness reads consistently {side} than Timer here, by about "
           f"{abs(diff_pct):.1f}%")
    if diff_pct > 0:
        return Prose(f"{gap}. A possible reason, not measured here: the harness synchronises around every call "
                     "and rotates over several fresh buffers, while Timer times blocks of calls on one reused "
                     "buffer that can stay in a warmer cache")
    return Prose(f"{gap}. The harness's per-call synchronisation and rotated buffers would make it slower than "
                 "Timer, not faster, so they do not explain this gap; the machine's load may have changed "
                 "between the two tools' measurements, which only repeating Timer too can tell apart")


def spread_against_quartiles(low_median: float, high_median: float, q25: float, q75: float) -> Prose:
    """Whether repeated measurements' medians (``low_median`` to ``high_median``) spread wider than one
    measurement's quartiles, ``q25`` to ``q75`` (all in seconds), as the end of a sentence: the widths are
    compared, and a narrower range that still lies partly outside the quartiles is said to be shifted."""
    if not (0 < low_median <= high_median and 0 < q25 <= q75):
        raise ValueError(f"need 0 < low_median <= high_median and 0 < q25 <= q75, got {low_median!r}, "
                         f"{high_median!r}, {q25!r}, {q75!r}")
    if high_median - low_median > q75 - q25:
        return Prose("wider than the quartiles of one measurement: a single measurement's quartiles understate "
                     "how much a repeat can move")
    if low_median < q25 or high_median > q75:
        return Prose("no wider than the quartiles of one measurement, though not inside them: the repeats moved "
                     "no more than one measurement varies, but the whole measurement can shift")
    return Prose("inside the quartiles of one measurement: on this run, one measurement's quartiles covered "
                 "the repeats")


def recorded_matmul(record: RecordedResult) -> MatmulThroughput:
    """A recorded ``matmul_throughput`` run's result (refused with ``TypeError`` where it is another kind)."""
    if not isinstance(record.result, MatmulThroughput):
        raise TypeError(f"expected a recorded MatmulThroughput, got {type(record.result).__name__}")
    return record.result


def recorded_cross_check(record: RecordedResult) -> Prose:
    """A recorded ``matmul_throughput`` run's check of the harness against ``torch.utils.benchmark.Timer``:
    per dtype, both medians (ms) and how far apart they are."""
    result = recorded_matmul(record)
    table = markdown_table(
        ("dtype", "harness median (ms)", "torch Timer median (ms)", "harness against Timer"),
        [(d, f"{1e3 * c.harness_s:.4f}", f"{1e3 * c.torch_timer_s:.4f}",
          f"{100 * (c.harness_s / c.torch_timer_s - 1):+.1f}%") for d, c in result.cross_check.items()])
    return Prose(f"Recorded on **{record.label}** at n = {result.cross_check_n}:\n\n" + table)


def sweep_drift(points: Sequence[MatmulPoint], sweep: MatmulSweep) -> dict[str, object]:
    """The timing section's product (``points``, its repeated measurements) against the sweep's point of the
    same dtype and size: ``noise_pct``, how far apart all those medians lay (the largest over the smallest, of the
    values as printed, ms to three decimals), the yardstick of every later difference of medians on the page;
    ``sweep_drift``, the sentence that says where it comes from (empty where the sweep has no such point)."""
    if len(points) < 2:
        raise ValueError("sweep_drift needs the timing section's repeated measurements, at least two")
    first = points[0]
    if any((p.dtype, p.m, p.n, p.k) != (first.dtype, first.m, first.n, first.k) for p in points):
        raise ValueError("the repeated measurements must all be of one product")
    repeats = _printed_ms([p.timing.median for p in points])
    spread = 100 * (max(repeats) / min(repeats) - 1)
    match = [p for p in sweep.points if (p.dtype, p.m, p.n, p.k) == (first.dtype, first.m, first.n, first.k)]
    if not match:
        return {"noise_pct": spread, "sweep_drift": Prose("")}
    (ms,) = _printed_ms([match[0].timing.median])
    every = [*repeats, ms]
    noise = 100 * (max(every) / min(every) - 1)
    start = (f"The sweep timed the timing section's product ({first.dtype.upper()}, n = {first.n}) at a median of "
             f"{ms:.3f} ms")
    if noise <= spread:
        text = (f"{start}, inside the range of that section's repeats, so the page reads a difference of medians "
                f"against their {spread:.1f}%.")
    else:
        text = (f"{start}, outside the {min(repeats):.3f} to {max(repeats):.3f} ms of that section's repeats: "
                f"all {count_word(len(every))} medians lie {noise:.1f}% apart, more than the {spread:.1f}% of the repeats in a row. This "
                f"machine's speed drifted between the two sections, so the page reads every later difference of "
                f"medians against that {noise:.1f}%.")
    return {"noise_pct": noise, "sweep_drift": Prose(text)}


def probe_against_sweep(probe: CapabilityProbe, sweep: MatmulSweep, *, noise_pct: float) -> Prose:
    """The capability probe's 16-bit speeds against FP32 beside the sweep's at the probe's size, where the sweep
    has it, and whether they differ by more than ``noise_pct`` (how far the medians of one product moved here,
    :func:`sweep_drift`): the probe keeps each dtype's best round, the sweep each size's median. Empty where the sweep
    has no point at the probe's size."""
    if not (math.isfinite(noise_pct) and noise_pct >= 0):
        raise ValueError(f"noise_pct must be a finite non-negative percentage, got {noise_pct!r}")
    n, fp32 = probe.n, sweep.tflops("fp32").get(probe.n)
    pairs: list[tuple[str, float, float]] = []
    for d in ("bf16", "fp16"):
        a, b = probe.relative(d), sweep.tflops(d).get(n)
        if a is not None and b is not None and fp32:
            pairs.append((d, a, b / fp32))
    if not pairs:
        return Prose("")
    listed = and_list([f"{d.upper()} {ratio_text(a)} in the probe and {ratio_text(b)} in the sweep"
                       for d, a, b in pairs])
    apart = [d.upper() for d, a, b in pairs if max(a, b) / min(a, b) > 1 + noise_pct / 100]
    verdict = (f"For {and_list(apart)} the two differ by more than the {noise_pct:.1f}% the medians of one "
               "product moved here: the probe keeps each dtype's best round (so that a burst of load cannot set "
               "the banner's line), the sweep each size's median, and on this machine a dtype's speed moved more "
               "than that between and within the measurements. A speed ratio measured here is good to that much, "
               "not to its last digit." if apart else
               f"The two agree within the {noise_pct:.1f}% the medians of one product moved here.")
    return Prose(f"At n = {n}, as multiples of FP32's throughput: {listed}. {verdict}")
