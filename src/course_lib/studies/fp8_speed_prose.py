"""Lesson 7's sentences and tables on FP8 speed: predicted against measured, the course layer's profile,
torchao eager here and compiled on a GPU, and the notes that point at the GPU records. Split from
:mod:`.fp8_prose`, which re-exports them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from ..fp8.roofline import Fp8LinearEstimate, cast_kernel_kinds, predict_fp8_linear
from ..glue import Prose, and_list, count_word, ratio_text
from ..hardware import DATASHEET_PEAKS, GPUPeaks, cpu_fp8_kernel
from ..tables import MarkdownTable, markdown_table
from .fp8 import (
    Fp8LinearSpeed,
)
from .fp8_speed import (
    BF16,
    BF16_EAGER,
    BREAK_EVEN,
    COURSE_EAGER,
    LAYER_GROUPS,
    Fp8CompiledSpeed,
    Fp8LayerProfile,
    block_linear_shapes,
    shape_label,
    speed_class,
)

COURSE_LAYER = "FP8 course layer (_scaled_mm, tensorwise, eager)"
BF16_LAYER = "BF16 nn.Linear"


def product_ratios(measured: Mapping[str, Mapping[int, float]]) -> Mapping[int, float]:
    """The first recorded GPU's FP8/BF16 product ratios by size (``{}`` with none recorded)."""
    return next(iter(measured.values()), {})


def speedup_facts(estimates: Mapping[str, Sequence[Fp8LinearEstimate]],
                  measured: Mapping[str, Mapping[int, float]], gpu: GPUPeaks) -> dict[str, object]:
    """The unfused tensorwise roofline's speedup at 1024 and 16384 and the first size where it reaches 1
    (None if none does); the recorded product's ratio at 8192 (a phrase; its spread and the smaller sizes:
    :func:`~course_lib.studies.fp8_recorded.small_product_note`); the GPU's dense FP8 and BF16 peaks
    (TFLOP/s) and their ratio; and what limits the prediction at each size (``pred_limits``,
    :func:`speed_limits_note`)."""
    tw = estimates["tensorwise"]
    at = {e.m: e.speedup for e in tw}
    for n in (1024, 16384):
        if n not in at:
            raise ValueError(f"the tensorwise estimates have no M = {n}; they cover {sorted(at)}")
    rec = product_ratios(measured)
    fp8, bf16 = gpu.peak("fp8"), gpu.peak("bf16")
    if fp8 is None or bf16 is None:
        raise ValueError(f"{gpu.name} lists no BF16 or no FP8 tensor-core peak")
    crossing = next((e for e in tw if speed_class(e.speedup) != "slower"), None)
    return {"pred_1k": at[1024], "pred_16k": at[16384],
            "pred_breakeven": crossing.m if crossing else None,
            "pred_crossing": crossing_phrase(crossing.speedup if crossing else None),
            "rec_mm_8k": Prose(f"{rec[8192]:.2f}" if 8192 in rec else "not recorded"),
            "h100_fp8": fp8, "h100_bf16_peak": bf16, "peak_ratio": fp8 / bf16,
            "pred_limits": speed_limits_note(estimates, gpu)}


def _size_list(sizes: Sequence[int]) -> str:
    """Sizes as prose: "256", "256 and 512", or "256 to 2048" for three or more in a row."""
    if len(sizes) >= 3:
        return f"{sizes[0]} to {sizes[-1]}"
    return and_list([str(n) for n in sizes])


def fp8_bound(estimate: Fp8LinearEstimate) -> str:
    """What bounds most of an estimate's FP8 time: "kernel floor", "memory" or "compute" (the largest part
    of :attr:`~course_lib.fp8.Fp8LinearEstimate.fp8_bound_s`)."""
    parts = estimate.fp8_bound_s
    if not parts or sum(parts.values()) <= 0:
        raise ValueError("the estimate carries no split of its FP8 time (made by predict_fp8_linear)")
    return max(parts, key=lambda name: parts[name])


def speed_limits_note(estimates: Mapping[str, Sequence[Fp8LinearEstimate]], gpu: GPUPeaks) -> Prose:
    """What limits the unfused tensorwise prediction at each size, from the prediction's parts: where every
    FP8 kernel sits at the roofline's per-kernel floor (:data:`~course_lib.fp8.roofline.LAUNCH_SECONDS`), the
    floor and the kernel counts (and, where BF16's products sit at the floor too, that the prediction is
    their ratio), the same prediction without the floor (``launch_seconds=0``: FLOPs and bytes only), and
    whether the fused line coincides there; at the other sizes, what bounds most of FP8's time and the share
    the memory-bound kernels take. ``estimates``: :func:`~course_lib.studies.fp8.roofline_speedups`'s."""
    tw = list(estimates["tensorwise"])
    if not tw:
        raise ValueError("the tensorwise estimates are empty")
    bf16, fp8 = gpu.peak("bf16"), gpu.peak("fp8")
    if bf16 is None or fp8 is None:
        raise ValueError(f"{gpu.name} lists no BF16 or no FP8 tensor-core peak")
    floor = [e for e in tw if fp8_bound(e) == "kernel floor"]
    rest = [e for e in tw if fp8_bound(e) != "kernel floor"]
    rowwise = {e.m: e for e in estimates.get("rowwise", [])}
    fused = {e.m: e for e in estimates.get("tensorwise (casts fused)", [])}
    sentences = []
    if floor:
        one = floor[0]
        kinds = cast_kernel_kinds("tensorwise")
        what_casts = (f"{count_word(kinds['read'])} amax reductions of two kernels each (the second turns partial "
                      f"amaxes into a scale and moves no bytes in the model) and {count_word(kinds['write'])} casts "
                      "(kernels that write the products' FP8 operands, some two copies at once)"
                      if kinds["read"] == kinds["no bytes"] and 2 * kinds["read"] + kinds["write"] == one.fp8_kernels - 3
                      else f"{one.fp8_kernels - 3} scale-and-cast kernels")
        counts = (f"A BF16 layer runs {one.bf16_kernels} kernels, its three products; unfused tensorwise FP8 runs "
                  f"{one.fp8_kernels}: the products, {what_casts}")
        if one.m in rowwise:
            counts += f"; rowwise runs {rowwise[one.m].fp8_kernels}"
        launch_us = 1e6 * one.fp8_bound_s["kernel floor"] / one.fp8_kernels
        bare = [predict_fp8_linear(e.m, e.k, e.n, bf16_tflops=bf16, fp8_tflops=fp8, bandwidth_gbs=gpu.bandwidth_gbs,
                                   recipe="tensorwise", launch_seconds=0) for e in floor]
        without = and_list([f"{b.speedup:.2f} at {b.m}" for b in bare])
        below = [b.m for b in bare if b.speedup < 1]
        lower = [e.m for e, b in zip(floor, bare) if e.speedup < b.speedup]
        if len(below) == len(bare):
            cause = (f"In the prediction, the small FP8 layers' bytes and FLOPs alone already keep them below BF16: "
                     f"without the model's least time per kernel (`launch_seconds=0`) it would be {without}.")
        elif below:
            cause = (f"In the prediction, bytes and FLOPs alone keep the small FP8 layers below BF16 at "
                     f"{_size_list(below)}: without the model's least time per kernel (`launch_seconds=0`) it would "
                     f"be {without}.")
        else:
            cause = (f"In the prediction, bytes and FLOPs alone would not keep the small FP8 layers below BF16: "
                     f"without the model's least time per kernel (`launch_seconds=0`) it would be {without}.")
        where = _size_list([e.m for e in floor])
        floor_does = ("pulls the prediction lower there" if len(lower) == len(floor) else
                      f"pulls the prediction lower at {_size_list(lower)}" if lower else "changes nothing there")
        sentences.append(
            f"{cause} That floor, {launch_us:g} µs per kernel (torchao's figure for one kernel launch, an "
            f"assumption of the model), is what every FP8 kernel takes at {where}, and it {floor_does}. {counts}.")
        both = [e for e in floor if math.isclose(e.bf16_bound_s["kernel floor"], e.bf16_s)]
        if both:
            ratio = f"{both[0].bf16_kernels}/{both[0].fp8_kernels} = {both[0].speedup:.2f}"
            rw = rowwise.get(both[0].m)
            if rw is not None and math.isclose(rw.fp8_bound_s["kernel floor"], rw.fp8_s):
                ratio += f" ({rw.bf16_kernels}/{rw.fp8_kernels} = {rw.speedup:.2f} for rowwise)"
            sentences.append(f"Where BF16's products sit at the floor too ({_size_list([e.m for e in both])}), the "
                             f"prediction is just the ratio of kernel counts, {ratio}.")
        if fused and all(e.m in fused and math.isclose(fused[e.m].speedup, e.speedup) for e in floor):
            sentences.append("In this model, fusing the casts saves bytes, not kernels (a fused kernel still takes "
                             "the floor), so there the fused line lies on the unfused one.")
    groups: list[tuple[str, list[Fp8LinearEstimate]]] = []
    for e in rest:
        if groups and groups[-1][0] == fp8_bound(e):
            groups[-1][1].append(e)
        else:
            groups.append((fp8_bound(e), [e]))
    what = {"compute": "the products' arithmetic", "memory": "memory traffic (the casts' and the products' bytes)",
            "kernel floor": "the kernel floor"}
    for bound, group in groups:
        first, last = group[0], group[-1]
        where = f"from {first.m} on" if last is tw[-1] and len(group) > 1 else f"at {_size_list([e.m for e in group])}"
        shares = [f"{100 * e.fp8_bound_s['memory'] / e.fp8_s:.0f}%" for e in (first, last)]
        share = (f"{shares[0]} of it at {first.m}" if first is last else
                 f"{shares[0]} of it at {first.m} and {shares[1]} at {last.m}")
        sentences.append(f"{where[0].upper()}{where[1:]}, {what[bound]} takes most of FP8's predicted time; FP8's "
                         f"memory-bound kernels (mostly the casts) take {share}, which keeps the speedup below "
                         "the ratio of the peaks.")
    return Prose(" ".join(sentences))


def compiled_prediction_note(speed: Fp8CompiledSpeed) -> Prose:
    """Whether the roofline's predictions for ``speed``'s square layers rest on the per-kernel floor alone
    (every FP8 kernel of each recipe at the floor: the same prediction for every such shape), on
    ``speed.predicted_for``'s datasheet figures; "" where no shape does, or nothing was predicted."""
    gpu = DATASHEET_PEAKS.get(speed.predicted_for)
    if gpu is None or not speed.predicted_linear:
        return Prose("")
    bf16, fp8 = gpu.peak("bf16"), gpu.peak("fp8")
    if bf16 is None or fp8 is None:
        return Prose("")
    at_floor, counts = [], []
    for recipe in speed.predicted_linear:
        estimates = [predict_fp8_linear(speed.tokens, n, n, bf16_tflops=bf16, fp8_tflops=fp8,
                                        bandwidth_gbs=gpu.bandwidth_gbs, recipe=recipe) for n in speed.sizes]
        if all(fp8_bound(e) == "kernel floor" for e in estimates):
            at_floor.append(recipe)
            counts.append(f"{estimates[0].fp8_kernels} for {recipe}")
    if not at_floor:
        return Prose("")
    one = predict_fp8_linear(speed.tokens, speed.sizes[0], speed.sizes[0], bf16_tflops=bf16, fp8_tflops=fp8,
                             bandwidth_gbs=gpu.bandwidth_gbs)
    launch_us = 1e6 * one.fp8_bound_s["kernel floor"] / one.fp8_kernels
    return Prose(f"Each prediction for {and_list(at_floor)} stays the same from one layer size to the next here: at "
                 f"these shapes "
                 f"each FP8 kernel takes the roofline's {launch_us:g} µs floor, so they count kernels "
                 f"({one.bf16_kernels} for BF16 against {and_list(counts)}), not bytes or FLOPs.")


def crossing_phrase(ratio: float | None) -> Prose:
    """How the predicted speedup first stops losing to BF16, before "$M = K = N$ = <size>": "breaks even
    (1.00) at" for a ratio within :data:`BREAK_EVEN` of 1, "first passes 1 (1.25) at" above that; None (it
    never does) gives "stays below 1 up to"."""
    if ratio is None:
        return Prose("stays below 1 up to")
    kind = speed_class(ratio)
    if kind == "slower":
        raise ValueError(f"{ratio!r} is below break-even; pass the first ratio that is not")
    return Prose(f"breaks even ({ratio:.2f}) at" if kind == "break-even" else f"first passes 1 ({ratio:.2f}) at")


def _ms_cell(times: Mapping[int, float], n: int, unit: str = "") -> str:
    """A table cell of milliseconds, or "left out" where ``n`` was not timed (``Fp8LinearSpeed.left_out``)."""
    return f"{1e3 * times[n]:.3f}{unit}" if n in times else "left out"


def linear_speed_table(speed: Fp8LinearSpeed) -> MarkdownTable:
    """Milliseconds of each implementation's forward and backward per size ("left out" where a size was not
    timed: :func:`left_out_sentence` says why)."""
    names = list(speed.seconds)
    return markdown_table(["n", *names], [[n, *(_ms_cell(speed.seconds[k], n, " ms") for k in names)]
                                          for n in speed.sizes])


def left_out_sentence(left_out: Mapping[str, str]) -> str:
    """Which sizes of which implementation a speed study did not time, and why ("" where it timed them all)."""
    if not left_out:
        return ""
    return "Not timed: " + "; ".join(f"{name} at {note}" for name, note in left_out.items()) + "."


def faster_on_cpu_reason(bf16_relative: float | None, cpu_kernel: str | None = "reference") -> str:
    """Why FP8 can come out faster than BF16 on a CPU, which has no FP8 arithmetic: with ``bf16_relative``
    (this CPU's BF16 matmul throughput over its FP32's, :meth:`course_lib.bench.CapabilityProbe.relative`)
    below 1, BF16 is the slow side; otherwise only that it is not FP8 arithmetic. ``cpu_kernel``: which kernel
    ran the FP8 products (:func:`~course_lib.hardware.cpu_fp8_kernel`)."""
    if bf16_relative is not None and bf16_relative < 1:
        how = ("FP8 partly runs in oneDNN's FP8 kernel" if cpu_kernel == "onednn" else
               "FP8 is multiplied in FP32")
        return (f"Where FP8 came out faster, BF16 is the slow side: this CPU multiplies BF16 at "
                f"{ratio_text(bf16_relative)} times its FP32 rate (the banner's probe), and {how}.")
    return "Where FP8 came out faster, that is not FP8 arithmetic, which a CPU does not have."


def cpu_fp8_products(cpu_kernel: str | None) -> str:
    """How a CPU multiplied the FP8 layers' codes: torch's reference kernel converts them to FP32; where
    :func:`~course_lib.hardware.cpu_fp8_kernel` found oneDNN, torch hands it the per-tensor products with both
    operands in one FP8 format (a forward's) and converts the rest."""
    if cpu_kernel == "onednn":
        return ("torch hands the products whose operands share one FP8 format and per-tensor scales (the "
                "forward's) to oneDNN's FP8 software kernel, and multiplies the others in FP32 after converting "
                "their codes")
    return "`_scaled_mm` converts the codes back to FP32 and multiplies there"


def linear_speed_facts(speed: Fp8LinearSpeed, *, bf16_relative: float | None = None,
                       cpu_kernel: str | None = None) -> dict[str, object]:
    """The course's FP8 layer's speed as a multiple of BF16's (range over sizes), the device, and what a
    reader should make of these timings there (``bf16_relative``: see :func:`faster_on_cpu_reason`;
    ``cpu_kernel``: what runs FP8 products on the CPU that timed them, by default this one's,
    :func:`~course_lib.hardware.cpu_fp8_kernel`)."""
    ratios = list(speed.speedup(COURSE_LAYER).values())
    if not ratios:
        raise ValueError(f"{COURSE_LAYER!r} has no timing next to {BF16_LAYER!r}")
    device = speed.device.split(":")[0]
    if device != "cuda" and cpu_kernel is None:
        cpu_kernel = cpu_fp8_kernel()
    note = ("These are eager layers: each cast is a separate kernel, the overhead the roofline charges."
            if device == "cuda" else
            f"A CPU has no FP8 matrix unit: here {cpu_fp8_products(cpu_kernel)}, so these timings say nothing "
            "about a GPU." + (" " + faster_on_cpu_reason(bf16_relative, cpu_kernel) if max(ratios) > 1 else ""))
    if speed.left_out:
        note += " " + left_out_sentence(speed.left_out)
    return {"cpu_fp8_ratio": Prose(f"{ratio_text(min(ratios))} to {ratio_text(max(ratios))}"),
            "speed_device": device.upper(),
            "speed_note": Prose(note)}


def recorded_linear_speed_table(speed: Fp8LinearSpeed) -> MarkdownTable:
    """A recorded speed study: milliseconds per implementation and size, and BF16's time over each
    FP8 implementation's (above 1: FP8 is faster)."""
    base = speed.seconds[BF16_LAYER]
    others = [k for k in speed.seconds if k != BF16_LAYER]
    return markdown_table(
        ["n", f"{BF16_LAYER} (ms)", *(f"{k} (ms)" for k in others), *(f"{k}: BF16's time / its time" for k in others)],
        [[n, f"{1e3 * base[n]:.3f}", *(_ms_cell(speed.seconds[k], n) for k in others),
          *(f"{base[n] / speed.seconds[k][n]:.2f}" if n in speed.seconds[k] else "" for k in others)]
         for n in base])


BF16_NEIGHBOURS = 2   # how many larger sizes a BF16 time must exceed to be flagged as not the layer's


def bf16_slower_than_larger(speed: Fp8LinearSpeed, window: int = BF16_NEIGHBOURS) -> list[int]:
    """The sizes at which BF16's recorded time exceeds its time at each of the next ``window`` larger sizes
    (at each larger size, where fewer are recorded; the largest size is not judged): a smaller layer does less
    work, so such a timing measured something besides the layer (warm-up, clocks). One larger neighbour is not
    enough: at the small sizes, where launches dominate, neighbouring times differ by their noise."""
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be a positive int, got {window!r}")
    base = speed.seconds.get(BF16_LAYER, {})
    sizes = sorted(base)
    return [n for i, n in enumerate(sizes[:-1]) if all(base[n] > base[m] for m in sizes[i + 1:i + 1 + window])]


def recorded_linear_speed_summary(speed: Fp8LinearSpeed, label: str,
                                  measured: Mapping[str, Mapping[int, float]], date: str = "") -> Prose:
    """What a recorded speed study says about the course's FP8 layer on ``label``'s GPU, beside the recorded
    product ratios ``measured`` (see :func:`~course_lib.studies.fp8.recorded_product_ratios`); with the
    record's ``date`` (ISO) before :data:`ONE_PASS_CASTS_SINCE`, that it timed an older, slower version of the
    layer than this page's."""
    ratios = speed.speedup(COURSE_LAYER)
    if not ratios:
        raise ValueError(f"the record has no {COURSE_LAYER!r} timing next to {BF16_LAYER!r}")
    suspect = bf16_slower_than_larger(speed)
    ours = [r for n, r in ratios.items() if n not in suspect] or list(ratios.values())
    flag = ""
    if suspect:
        base = speed.seconds[BF16_LAYER]
        sizes = sorted(base)
        clauses = []
        for n in suspect:   # each against the sizes it was judged by
            nxt = sizes[sizes.index(n) + 1:sizes.index(n) + 1 + BF16_NEIGHBOURS]
            clauses.append(f"at n = {n} ({1e3 * base[n]:.3f} ms) it is longer than at {and_list([str(m) for m in nxt])} "
                           f"({and_list([f'{1e3 * base[m]:.3f}' for m in nxt])} ms)")
        left_out = (f"the range leaves {and_list([f'n = {n}' for n in suspect])} out" if len(ours) < len(ratios) else
                    "the range rests on it all the same, there being no other size")
        flag = (f" BF16's own time is suspect: {'; '.join(clauses)}, which a smaller layer's work cannot explain "
                f"(most likely warm-up or clocks during the first timing), so {left_out}.")
    rec = product_ratios(measured)
    product = (f", although one FP8 `_scaled_mm` product alone ran {rec[max(rec)]:.2f}x BF16's at n = "
               f"{max(rec)} (the recorded products above)" if rec else "")
    torchao = ("torchao did not import on the recording machine, so this record has no torchao layer."
               if any("torchao" in k for k in speed.skipped) else "")
    older = (" The record timed an older, slower version of the layer than this page's, from before the layer "
             "cast each tensor in one pass without waiting for the host to read its finiteness check."
             if date and date[:10] < ONE_PASS_CASTS_SINCE else "")
    every = "at every size it timed" if COURSE_LAYER in speed.left_out else "at every size"
    not_timed = f" {left_out_sentence(speed.left_out)}" if speed.left_out else ""
    return Prose(f"On {label} the course's FP8 layer ran at {min(ours):.2f} to {max(ours):.2f} times BF16's speed "
                 f"(below 1: slower), {every}{product}.{not_timed}{flag}{older} This record times the whole layer, forward and "
                 "backward, and does not say where the extra time goes; the layer is written for clarity (each "
                 "operand's amax, scale, clamp and cast as separate eager operations), not speed. Profile a layer "
                 f"before concluding anything about FP8 from it (`torch.profiler`, lesson 6). {torchao}")


# ---- where the course layer's time goes; torchao compiled --------------------------------------------

def layer_profile_table(profile: Fp8LayerProfile) -> MarkdownTable:
    """The course layer's profiled self time per group (us and share), and the BF16 layer's total."""
    rows = [[g, f"{profile.self_us[g]:,.0f}", f"{100 * profile.share(g):.1f}%"] for g in LAYER_GROUPS]
    rows.append(["FP8 layer, total", f"{profile.total_us:,.0f}", "100%"])
    rows.append(["BF16 nn.Linear, total", f"{profile.bf16_us:,.0f}", ""])
    return markdown_table(["group", "self time (us)", "share of the FP8 layer"], rows)


def layer_profile_facts(profile: Fp8LayerProfile, *, cpu_kernel: str | None = None) -> dict[str, object]:
    """The profile's matrix-product share and what the rest (amax, scale, cast, other) takes, in percent;
    the FP8 layer's profiled time over BF16's; and what that makes the course layer on this device
    (``cpu_kernel``: as :func:`linear_speed_facts`)."""
    if profile.total_us <= 0 or profile.bf16_us <= 0:
        raise ValueError("the profile recorded no time for one of the layers")
    slower = profile.total_us / profile.bf16_us
    matmul = 100 * profile.share("matmul")
    casting = 100 - matmul
    if not profile.device.startswith("cuda"):
        how = cpu_fp8_products(cpu_fp8_kernel() if cpu_kernel is None else cpu_kernel)
        verdict = (f"On this CPU the FP8 products themselves take {matmul:.0f}% of the layer's time. It has no "
                   f"FP8 matrix unit: {how}. The amax, scale and "
                   f"cast steps this breakdown is about, and the rest, take the other {casting:.0f}%; what they "
                   "cost on a GPU, only a GPU profile can say.")
    elif slower > 1:
        verdict = (f"The course's layer took {slower:.1f} times BF16's kernel time: the matrix products take "
                   f"{matmul:.0f}% of it, and the amax, scale, cast and other kernels {casting:.0f}%, each a "
                   "separate pass over memory. It is a **numerics reference** (its codes and products equal "
                   "torch's and torchao's bit for bit), not a fast layer: for speed, use torchao's "
                   "`convert_to_float8_training` under `torch.compile`, which fuses the amax and the casts.")
    else:
        verdict = (f"The course's layer took {slower:.2f} times BF16's kernel time (the products {matmul:.0f}%, "
                   f"the amax, scale, cast and other kernels {casting:.0f}%): in this profile it was not slower.")
    ops = sorted(profile.other_ops.items(), key=lambda item: -item[1])
    shown = [f"`{op.removeprefix('aten::')}` {100 * us / profile.total_us:.1f}%" for op, us in ops[:6] if us > 0]
    rest = len([us for _, us in ops if us > 0]) - len(shown)
    other = (f"The group \"other\" ({100 * profile.share('other'):.1f}%) holds every operator called outside the "
             "course's amax, scale and cast functions that is not a matrix product (dtype conversions of the BF16 "
             "input and output, transposes and copies that lay operands out for the products, autograd's "
             f"bookkeeping); here the largest: {and_list(shown)} of the layer's time"
             + (f", and {count_word(rest)} smaller {'one' if rest == 1 else 'ones'}." if rest else ".")
             if shown else "")
    return {"prof_other": Prose(other),
            "prof_matmul_pct": matmul, "prof_rest_pct": casting, "prof_vs_bf16": slower,
            "prof_device": profile.device.split(":")[0].upper(), "prof_tokens": profile.tokens,
            "prof_features": profile.features, "prof_verdict": Prose(verdict)}


def _fp8_implementations(speed: Fp8CompiledSpeed) -> list[str]:
    return [k for k in speed.linear_s if k not in (BF16, BF16_EAGER)]


def compiled_speed_table(speed: Fp8CompiledSpeed, columns: str = "all") -> MarkdownTable:
    """Per linear size and for the block: BF16's milliseconds (and eager BF16's, where the course's eager
    layer was compared with it), then each FP8 implementation's speed as a multiple of its BF16 baseline's
    (above 1: faster; two significant figures below 0.1) and the roofline's prediction per recipe ("-": not
    run). ``columns``: ``"all"``, ``"measured"`` (the times and ratios) or ``"predicted"`` (the roofline's):
    two narrower tables that fit a page's width where the whole one does not."""
    if columns not in ("all", "measured", "predicted"):
        raise ValueError(f"columns must be 'all', 'measured' or 'predicted', got {columns!r}")
    measured, predicted = columns != "predicted", columns != "measured"
    fp8s = _fp8_implementations(speed) if measured else []
    recipes = list(speed.predicted_linear) if predicted else []
    bases = [b for b in (BF16, BF16_EAGER) if b in speed.linear_s or b in speed.block_s] if measured else []

    def ratio(value: float | None) -> str:
        return ratio_text(value) if value is not None else "-"

    def ms(times: Mapping, key) -> str:
        return f"{1e3 * times[key]:.3f}" if key in times else "-"

    rows = []
    for n in speed.sizes:
        rows.append([shape_label(speed.tokens, n), *(ms(speed.linear_s.get(b, {}), n) for b in bases),
                     *(ratio(speed.linear_speedup(k).get(n)) for k in fp8s),
                     *(ratio(speed.predicted_linear[r].get(n)) for r in recipes)])
    if speed.block_width:
        tokens = speed.block_batch * speed.block_seq
        rows.append([f"Llama block, width {speed.block_width}, {tokens} tokens",
                     *(ms(speed.block_s, b) for b in bases),
                     *(ratio(speed.block_speedup(k)) for k in fp8s),
                     *(ratio(speed.predicted_block.get(r)) for r in recipes)])
    def base_name(b: str) -> str:
        return "BF16 compiled" if b == BF16 and speed.compiled else "BF16 eager"

    # the roofline times the block's linear products, not its attention, norms or activations
    only = (f" (block: its {count_word(len(block_linear_shapes(speed.block_width, 1)))} linear products only)"
            if speed.block_width and speed.predicted_block else "")
    header = ["shape", *(f"{base_name(b)} (ms)" for b in bases),
              *(f"{k}: {base_name(speed.baseline(k))} time / its time" for k in fp8s),
              *(f"predicted {r} on {speed.predicted_for}: BF16 time / FP8 time{only}" for r in recipes)]
    return markdown_table(header, rows)


def _by_speed(speed: Fp8CompiledSpeed) -> dict[str, list[str]]:
    """Each FP8 implementation's shapes, as "<implementation> at <n> (<ratio>x)", by :func:`speed_class`."""
    found: dict[str, list[str]] = {"faster": [], "break-even": [], "slower": []}
    for k in _fp8_implementations(speed):
        for n, r in speed.linear_speedup(k).items():
            found[speed_class(r)].append(f"{k} at {n} ({ratio_text(r)}x)")
        if (block := speed.block_speedup(k)) is not None:
            found[speed_class(block)].append(f"{k} on the block ({ratio_text(block)}x)")
    return found


def compiled_speed_facts(speed: Fp8CompiledSpeed, *, bf16_relative: float | None = None) -> dict[str, object]:
    """Where FP8 ran faster than BF16 in ``speed``, where it broke even (within :data:`BREAK_EVEN`) and where
    it was slower (by implementation and shape), how it ran (compiled or eager, device), and what a CPU run
    can say (``bf16_relative``: see :func:`faster_on_cpu_reason`)."""
    found = _by_speed(speed)
    faster, even, slower = found["faster"], found["break-even"], found["slower"]
    if not (faster or even or slower):
        raise ValueError("the study timed no FP8 implementation next to BF16")
    device = speed.device.split(":")[0]
    on_cpu = device != "cuda"
    where = ("A CPU has **no FP8 tensor cores** (as for the eager layers above): these timings say nothing "
             "about a GPU. " if on_cpu else "")
    if not faster and not even:
        shown = f"FP8 was slower than BF16 everywhere it ran: {and_list(slower)}."
    else:
        parts = [f"FP8 was faster than BF16 in these runs: {and_list(faster)}" if faster else
                 "FP8 was faster than BF16 nowhere",
                 f"it broke even (within {100 * BREAK_EVEN:.0f}%) in these: {and_list(even)}" if even else "",
                 f"it was slower in these: {and_list(slower)}" if slower else ""]
        shown = "; ".join(p for p in parts if p) + "."
        if on_cpu and faster:
            shown += " " + faster_on_cpu_reason(bf16_relative, cpu_fp8_kernel())
    skipped = "".join(f" {k} did not run: {why}." for k, why in speed.skipped.items())
    return {"cs_device": device.upper(), "cs_mode": Prose(speed.mode), "cs_tokens": speed.tokens,
            "cs_verdict": Prose(where + shown + skipped), "cs_faster_count": len(faster)}


# the day the course layer began to cast in one pass without a host read on a GPU (commit 2903698)
ONE_PASS_CASTS_SINCE = "2026-11-25"


def linear_record_note(label: str | None, date: str = "") -> Prose:
    """The end of the sentence that introduces the course layer's profile: with an ``fp8_linear_speed``
    record on ``label``'s GPU shown above, dated ``date`` (ISO), that it timed an older, slower version of
    the layer when it predates :data:`ONE_PASS_CASTS_SINCE`."""
    if not label or date[:10] >= ONE_PASS_CASTS_SINCE:
        return Prose(".")
    return Prose(f"; the record above, on {label}, was taken with an older, slower version of the layer.")


def course_layer_note(recorded: Fp8CompiledSpeed | None, label: str = "") -> Prose:
    """What the course's FP8 layer is for, from a recorded ``fp8_compiled_speed`` (its eager layer against
    eager BF16 on a GPU), or, with none recorded, from what is known without one."""
    if recorded is None or not recorded.linear_speedup(COURSE_EAGER):
        return Prose("No GPU has timed this version of the layer yet: until one does, treat it as a **numerics "
                     "reference**, exact against torch and torchao, and use torchao for speed.")
    ratios = recorded.linear_speedup(COURSE_EAGER)
    lo, hi = min(ratios.values()), max(ratios.values())
    role = ("a **numerics reference**, not a fast layer: for speed, use torchao"
            if speed_class(hi) == "slower" else
            "no slower than eager BF16 at some sizes, though torchao compiled remains the layer to train with")
    return Prose(f"On {label} the course's eager layer ran at {ratio_text(lo)} to {ratio_text(hi)} times eager "
                 f"BF16's speed: {role}.")


def gpu_pointer(recorded: Fp8CompiledSpeed | None, label: str = "", *, verb: str = "measure") -> Prose:
    """What the torchao-compiled section does with a claim, after a reference to it: "measures it on
    <label>" where a GPU run of ``fp8_compiled_speed`` exists, else "will measure it on a GPU, once recorded"
    (no parentheses: the page puts the phrase in some); ``verb`` is "measure" or "time"."""
    if verb not in ("measure", "time"):
        raise ValueError(f"verb must be 'measure' or 'time', got {verb!r}")
    if recorded is None:
        return Prose(f"will {verb} it on a GPU, once recorded")
    return Prose(f"{verb}s it on {label}")


def _torchao_wins(recorded: Fp8CompiledSpeed) -> tuple[list[str], int]:
    """The shapes where a torchao layer ran faster than BF16 (beyond break-even), and how many it ran."""
    ratios = {f"{k} at {n}": r for k in recorded.linear_s if k.startswith("torchao")
              for n, r in recorded.linear_speedup(k).items()}
    ratios.update({f"{k} on the block": r for k in recorded.block_s if k.startswith("torchao")
                   and (r := recorded.block_speedup(k)) is not None})
    return [shape for shape, r in ratios.items() if speed_class(r) == "faster"], len(ratios)


def fp8_pays_note(recorded: Fp8CompiledSpeed | None, label: str = "") -> Prose:
    """What the page may say about "FP8 pays for large layers": a GPU measurement of torchao compiled
    where one is recorded (which shapes ran faster than BF16), else that it rests on the roofline alone."""
    if recorded is None:
        return Prose("No GPU measurement of a fast FP8 layer is recorded yet: that FP8 pays for large layers "
                     "rests on the roofline's prediction alone.")
    wins, _ = _torchao_wins(recorded)
    if not wins:
        return Prose(f"On {label}, torchao's FP8 layers ({recorded.mode}) were not faster than BF16 at any "
                     "recorded shape: the prediction that FP8 pays for large layers is not borne out there.")
    return Prose(f"On {label}, torchao's FP8 layers ({recorded.mode}) ran faster than BF16 for {and_list(wins)}: "
                 "there the prediction is measured, elsewhere it is not.")


def fp8_pays_takeaway(recorded: Fp8CompiledSpeed | None, label: str = "") -> Prose:
    """:func:`fp8_pays_note` in a clause, for the takeaways."""
    if recorded is None:
        return Prose("no GPU has measured that yet")
    wins, ran = _torchao_wins(recorded)
    return Prose(f"on {label} torchao compiled beat BF16 at {len(wins)} of {ran} shapes")


# ---- errata and exercises ------------------------------------------------------------------------------
