"""Lesson 7's facts, phrases and tables: what the FP8 studies measured, under the names the prose glues."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..formats import get_format
from ..formats.tables import exact_number
from ..fp8.accumulation import AccumulationStudy
from ..fp8.roofline import Fp8LinearEstimate, predict_fp8_linear
from ..glue import Prose, and_list, count_word, ratio_text
from ..hardware import DATASHEET_PEAKS, GPUPeaks
from ..tables import MarkdownTable, markdown_table
from .fp8 import (
    CURRENT_SCALING_CAST,
    DEEPSEEK_TILE,
    KNOWN_SCALE_CAST,
    TORCH_CAST,
    Fp8LinearSpeed,
    Fp8Training,
    LinearTensors,
    OutlierSweep,
    ScalingLab,
    SpikeRun,
)
from .fp8_recorded import percent_text
from .training_prose import BASELINE, loss_differences
from .fp8_speed import (BF16, BF16_EAGER, BREAK_EVEN, COURSE_EAGER, LAYER_GROUPS, Fp8CompiledSpeed, Fp8LayerProfile,
                        shape_label, speed_class)

COURSE_LAYER = "FP8 course layer (_scaled_mm, tensorwise, eager)"
BF16_LAYER = "BF16 nn.Linear"

def format_facts() -> dict[str, object]:
    """Largest finite value, smallest subnormal, epsilon and binades of E4M3 and E5M2
    (``e4m3_max``, ``e4m3_tiny``, ``e4m3_eps``, ``e4m3_binades``, and the same for ``e5m2``), and the smallest
    subnormal and epsilon written exactly, as the lesson's format tables write them (``e4m3_tiny_text``,
    ``e4m3_eps_text``, ... : powers of two, :func:`~course_lib.formats.tables.exact_number`)."""
    facts: dict[str, object] = {}
    for name in ("e4m3", "e5m2"):
        f = get_format(name)
        facts.update({f"{name}_max": f.max_finite, f"{name}_tiny": f.min_subnormal, f"{name}_eps": f.epsilon,
                      f"{name}_binades": f.binades, f"{name}_tiny_text": Prose(exact_number(f.min_subnormal)),
                      f"{name}_eps_text": Prose(exact_number(f.epsilon))})
    return facts


def tensor_facts(tensors: LinearTensors) -> dict[str, object]:
    """The captured layer and its training steps, the output gradient's median magnitude, and the share
    (percent) of its values below E4M3's smallest subnormal."""
    grad = tensors.grad_output
    below = float((grad.abs() < get_format("e4m3").min_subnormal).float().mean())
    return {"lab_steps": tensors.steps, "lab_layer": tensors.layer, "grad_median": float(grad.abs().median()),
            "grad_below_e4m3": 100 * below}


def lab_facts(lab: ScalingLab) -> dict[str, object]:
    """The scaling lab on the gradient (percent flushed without and with a per-tensor scale; relative error
    in percent and effective bits of per-tensor E4M3 and E5M2), and the range of relative errors (percent)
    of every scaled E4M3 recipe on every tensor."""
    grad = lab.errors["gradient"]
    e4, e5 = grad["per tensor, E4M3"], grad["per tensor, E5M2"]
    fine = [e.relative_error for t in lab.tensors for r, e in lab.errors[t].items()
            if "E4M3" in r and "no scaling" not in r]
    return {"lab_grad_flushed_unscaled": 100 * grad["no scaling (E4M3)"].flushed,
            "lab_grad_flushed_scaled": 100 * e4.flushed, "lab_e4m3_err": 100 * e4.relative_error,
            "lab_e5m2_err": 100 * e5.relative_error, "lab_bits_e4m3": e4.effective_bits,
            "lab_bits_e5m2": e5.effective_bits, "lab_fine_lo": 100 * min(fine), "lab_fine_hi": 100 * max(fine)}


def _factor_index(sweep: OutlierSweep, factor: float) -> int:
    if factor not in sweep.factors:
        raise ValueError(f"the outlier sweep has no factor {factor:g}; it ran {sweep.factors}")
    return sweep.factors.index(factor)


def outlier_facts(sweep: OutlierSweep, block: int) -> dict[str, object]:
    """Percent of the other channels flushed by an outlier channel 1,000x (per tensor) and 100,000x
    (per tensor, per row, per column, 1 x ``block`` tiles) larger than the rest."""
    i3, i5 = _factor_index(sweep, 1e3), _factor_index(sweep, 1e5)
    flushed = sweep.flushed
    return {"out_tensor_1e3": 100 * flushed["per tensor, E4M3"][i3],
            "out_tensor_1e5": 100 * flushed["per tensor, E4M3"][i5],
            "out_row_1e5": 100 * flushed["per row (token), E4M3"][i5],
            "out_tile_1e5": 100 * flushed[f"1 x {block} tiles, E4M3"][i5],
            "out_col_1e5": 100 * flushed["per column (channel), E4M3"][i5]}


def spike_gain_facts(gains: tuple[float, float]) -> dict[str, object]:
    """The range of the spike study's step-to-step gain (``studies.fp8.SPIKE_GAINS``) as ``spike_gain_lo``
    and ``spike_gain_hi``."""
    lo, hi = gains
    if not 0 < lo <= hi:
        raise ValueError(f"gains must be a range (lo, hi) with 0 < lo <= hi, got {gains!r}")
    return {"spike_gain_lo": lo, "spike_gain_hi": hi}


def spike_facts(spike: SpikeRun) -> dict[str, object]:
    """Delayed scaling (history reduced by "max") against current scaling at an amax spike: percent
    saturated and relative error (percent) at the spike, the worst error over the history that follows
    it, and the error the step before."""
    delayed = [k for k in spike.relative_error if k.startswith("delayed, max of ")]
    if len(delayed) != 1:
        raise ValueError(f"expected one 'delayed, max of N' recipe, got {delayed}")
    key, at = delayed[0], spike.spike_at
    history = int(key.removeprefix("delayed, max of "))
    if not 1 <= at < len(spike.amax) - 1:
        raise ValueError(f"the spike (step {at}) needs a step before and after it in {len(spike.amax)} steps")
    after = spike.relative_error[key][at + 1: at + history + 1]   # the steps whose history holds the spike
    return {"spike_factor": spike.factor, "spike_at": at, "spike_history": history,
            "spike_sat_delayed": 100 * spike.saturated[key][at],
            "spike_err_delayed": 100 * spike.relative_error[key][at],
            "spike_err_current": 100 * spike.relative_error["current"][at],
            "spike_sat_current": 100 * max(spike.saturated["current"]),
            "spike_after_max": 100 * max(after),
            "spike_before": 100 * spike.relative_error[key][at - 1]}


def margin_facts(plain: SpikeRun, with_margin: SpikeRun, margin: int) -> dict[str, object]:
    """The same spike cast by delayed scaling (history reduced by "max") without a margin (``plain``) and
    with ``margin`` (``with_margin``): percent saturated at the spike, and the quiet steps' (those before
    the spike) mean relative error and flushed share, in percent, each way; and a phrase on whether the
    margin's cost to the quiet steps stays small (their error at most doubles) or not."""
    keys = []
    for run in (plain, with_margin):
        delayed = [k for k in run.relative_error if k.startswith("delayed, max of ")]
        if len(delayed) != 1:
            raise ValueError(f"expected one 'delayed, max of N' recipe, got {delayed}")
        keys.append(delayed[0])
    if (plain.spike_at, plain.factor, plain.amax) != (with_margin.spike_at, with_margin.factor, with_margin.amax):
        raise ValueError("the two runs must cast the same tensors (same spike step, factor and amaxes)")
    at = plain.spike_at
    if at < 1:
        raise ValueError(f"the spike (step {at}) needs quiet steps before it")

    def quiet(values):
        return 100 * sum(values[:at]) / at

    err0, err = quiet(plain.relative_error[keys[0]]), quiet(with_margin.relative_error[keys[1]])
    verdict = ("E4M3's range absorbs the margin: the quiet steps' error did not double" if err <= 2 * err0 else
               "Here the margin costs the quiet steps: their error more than doubled")
    return {"ex_m_margin": margin,
            "ex_m_sat0": 100 * plain.saturated[keys[0]][at], "ex_m_sat": 100 * with_margin.saturated[keys[1]][at],
            "ex_m_err0": err0, "ex_m_err": err,
            "ex_m_flush0": quiet(plain.flushed[keys[0]]), "ex_m_flush": quiet(with_margin.flushed[keys[1]]),
            "ex_m_verdict": Prose(verdict)}


def cast_cost_table(times: Mapping[str, float]) -> MarkdownTable:
    """Milliseconds per cast of :func:`~course_lib.studies.fp8.time_scaled_casts`, and each as a multiple
    of torch's own cast."""
    base = times[TORCH_CAST]
    return markdown_table(["", "ms", "x torch cast"], [[k, f"{1e3 * v:.2f}", f"{v / base:.2f}"]
                                                        for k, v in times.items()])


def cast_cost_facts(times: Mapping[str, float], again: Mapping[str, float], *, device: object) -> dict[str, object]:
    """``cost_current``: current scaling's time over the cast with a known scale in ``times``; ``cost_noise``:
    how far (%) the same casts' medians in a second timing, ``again``, moved at most; ``cost_phrase``, the
    sentence's verb phrase, which counts a difference within that noise as none; ``cost_where``, where the
    sentence's timing ran ("Here (on this CPU)", from ``device``, a torch device or its name); and
    ``cost_device_note``: off a GPU, that a GPU's cast costs differently."""
    for name, t in (("times", times), ("again", again)):
        missing = [k for k in (KNOWN_SCALE_CAST, CURRENT_SCALING_CAST) if k not in t]
        if missing:
            raise ValueError(f"{name} lacks the timing of {missing}")
    ratio = times[CURRENT_SCALING_CAST] / times[KNOWN_SCALE_CAST]
    noise = 100 * max(abs(times[k] / again[k] - 1) for k in (KNOWN_SCALE_CAST, CURRENT_SCALING_CAST))
    if 100 * (ratio - 1) > noise:
        phrase = (f"takes {ratio:.2f} times as long as the cast with a known scale, more than the {noise:.0f}% by "
                  "which two timings of the same cast differed: that is the price of the extra pass (an upper bound on it: "
                  "delayed scaling still records each amax, in the same pass on a GPU)")
    elif 100 * (1 - ratio) > noise:
        phrase = (f"takes {ratio:.2f} times as long as the cast with a known scale: less, which an extra pass "
                  f"cannot cause, by more than the {noise:.0f}% by which two timings of the same cast differed. The two "
                  "medians come from separate timed loops, so the machine's state between them, not the amax "
                  "pass, decided this difference")
    else:
        phrase = (f"takes {ratio:.2f} times as long as the cast with a known scale, within the {noise:.0f}% by which "
                  "two timings of the same cast differed: on this device the extra pass does not show")
    kind = str(device).split(":")[0]
    if not kind or kind == "None":
        raise ValueError(f"device must name where the casts were timed, got {device!r}")
    where = {"cpu": "CPU", "cuda": "GPU"}.get(kind, f"{kind} device")
    note = "" if kind == "cuda" else (
        "A GPU's cast is bound by memory bandwidth, not by arithmetic, so there the extra pass costs what its extra "
        f"read of the tensor costs in bandwidth, which this {where} timing does not measure.")
    return {"cost_current": ratio, "cost_noise": noise, "cost_phrase": Prose(phrase),
            "cost_where": Prose(f"Here (on this {where})"), "cost_device_note": Prose(note)}


def backend_facts(recipe: str, same: bool) -> dict[str, object]:
    """The recipe the two backends ran (as code) and whether their outputs and gradients were identical."""
    return {"backend_recipe": Prose(f"`{recipe}`"),
            "backends_same": Prose("**identical**" if same else "**different**")}


def tile_note(block: int, width: int) -> Prose:
    """This page's tile side ``block`` and why (the prose puts "here" before it): DeepSeek-V3's own where it
    divides the model's ``width``, a smaller one where it does not."""
    if block == DEEPSEEK_TILE:
        return Prose(f"the same {block}")
    if width % DEEPSEEK_TILE == 0:
        return Prose(f"{block}")
    return Prose(f"{block}, because {DEEPSEEK_TILE} does not divide the model's width of {width}")


def torchao_agreement(agree: bool) -> Prose:
    """How the course's quantisation compares with torchao's: "bit for bit" or "not exactly" (bold)."""
    return Prose("**bit for bit**" if agree else "**not exactly**")


def unscaled_seed_facts(result: Fp8Training, unscaled: str = "unscaled") -> dict[str, object]:
    """The ``unscaled`` recipe's final loss against BF16's, seed by seed: on which side of BF16 it ended in
    how many seeds, by how much in each, and whether every gap lies beyond the scaled recipes' (all but BF16
    and ``unscaled``) in every seed (``train_unscaled_seeds``, a sentence; ``train_unscaled_short``, a
    clause for the takeaways)."""
    diffs = loss_differences(result)
    scaled = [r for r in result.recipes if r not in (BASELINE, unscaled)]
    if unscaled not in diffs or not scaled:
        raise ValueError(f"need {unscaled!r} and at least one scaled recipe beside {BASELINE!r}")
    gaps, n = diffs[unscaled], len(result.seeds)
    lo, hi = min(min(diffs[r]) for r in scaled), max(max(diffs[r]) for r in scaled)
    above = sum(g > 0 for g in gaps)
    every = {1: "its one seed", 2: "both seeds"}.get(n, f"all {count_word(n)} seeds")
    side = (f"above BF16 in {every}" if above == n else f"below BF16 in {every}" if above == 0 else
            f"above BF16 in {count_word(above)} of {count_word(n)} seeds")
    out = [s for s, g in zip(result.seeds, gaps) if g > hi or g < lo]
    span = f"({lo:+.3f} to {hi:+.3f})"
    if len(out) == n:
        beyond, short = (f"each gap lies beyond every scaled recipe's in every seed {span}",
                         "beyond every scaled recipe's gap")
    elif out:
        which = ("seed " if len(out) == 1 else "seeds ") + and_list([str(s) for s in out])
        rest = n - len(out)
        beyond, short = (f"{count_word(len(out))} of them ({which}) {'lies' if len(out) == 1 else 'lie'} beyond the "
                         f"scaled recipes' range {span}, the other{'' if rest == 1 else 's'} within it",
                         "only partly beyond the scaled recipes' gaps")
    else:
        beyond, short = (f"every gap lies within the scaled recipes' range {span}",
                         "within the scaled recipes' gaps")
    seeds = and_list([str(s) for s in result.seeds])
    seeds = f"seed {seeds}" if n == 1 else f"seeds {seeds} in turn"
    return {"train_unscaled_seeds": Prose(
                f"FP8 without scales ended {side}, by {and_list([f'{g:+.3f}' for g in gaps])} ({seeds}): {beyond}."),
            "train_unscaled_short": Prose(f"unscaled FP8 ended {side}, {short}")}


# ---- accumulation and speed ----------------------------------------------------------------------------

def accumulation_facts(studies: Mapping[str, AccumulationStudy], *, k: int = 4096,
                       reported_percent: float = 2.0) -> dict[str, object]:
    """Per rounding model (``studies["toward_zero"]``, ``studies["nearest_even"]``): the largest relative
    error (percent) at length ``k`` of the limited accumulator, without and with promotion to FP32; and
    whether DeepSeek-V3's ``reported_percent`` lies between the two models' figures."""
    facts: dict[str, object] = {}
    worst = {}
    for rounding in ("toward_zero", "nearest_even"):
        s = studies[rounding]
        if k not in s.ks:
            raise ValueError(f"the {rounding} study has no K = {k}; it ran {s.ks}")
        i, bits = s.ks.index(k), s.accumulator_bits
        worst[rounding] = 100 * s.errors[f"{bits}-bit accumulator"][i][1]
        facts[f"acc_{rounding}_{k}"] = worst[rounding]
        promoted = s.errors[f"{bits}-bit, promoted to FP32 every {s.promote_every}"]
        facts[f"acc_{rounding}_promoted"] = 100 * promoted[i][1]
    between = worst["nearest_even"] < reported_percent < worst["toward_zero"]
    facts["acc_vs_deepseek"] = Prose("lies between the two models' figures" if between else
                                     "lies outside both models' figures")
    return facts


def product_ratios(measured: Mapping[str, Mapping[int, float]]) -> Mapping[int, float]:
    """The first recorded GPU's FP8/BF16 product ratios by size (``{}`` with none recorded)."""
    return next(iter(measured.values()), {})


def speedup_facts(estimates: Mapping[str, Sequence[Fp8LinearEstimate]],
                  measured: Mapping[str, Mapping[int, float]], gpu: GPUPeaks) -> dict[str, object]:
    """The unfused tensorwise roofline's speedup at 1024 and 16384 and the first size where it reaches 1
    (None if none does); the recorded product's ratio at 8192 (a phrase; its spread and the smaller sizes:
    :func:`~course_lib.studies.fp8_recorded.small_product_note`); the GPU's dense FP8 and BF16 peaks
    (TFLOP/s) and their ratio."""
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
            "h100_fp8": fp8, "h100_bf16_peak": bf16, "peak_ratio": fp8 / bf16}


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


def linear_speed_table(speed: Fp8LinearSpeed) -> MarkdownTable:
    """Milliseconds of each implementation's forward and backward per size."""
    names = list(speed.seconds)
    return markdown_table(["n", *names], [[n, *(f"{1e3 * speed.seconds[k][n]:.3f} ms" for k in names)]
                                          for n in speed.sizes])


def linear_speed_facts(speed: Fp8LinearSpeed) -> dict[str, object]:
    """The course's FP8 layer's speed as a multiple of BF16's (range over sizes), the device, and what a
    reader should make of these timings there."""
    ratios = list(speed.speedup(COURSE_LAYER).values())
    if not ratios:
        raise ValueError(f"{COURSE_LAYER!r} has no timing next to {BF16_LAYER!r}")
    device = speed.device.split(":")[0]
    note = ("A CPU has no FP8 arithmetic: `_scaled_mm` converts the codes back to FP32 first, so FP8 can only "
            "cost time here, and these timings say nothing about a GPU." if device != "cuda" else
            "These are eager layers: each cast is a separate kernel, the overhead the roofline charges.")
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
        [[n, f"{1e3 * base[n]:.3f}", *(f"{1e3 * speed.seconds[k][n]:.3f}" for k in others),
          *(f"{base[n] / speed.seconds[k][n]:.2f}" for k in others)] for n in base])


def recorded_linear_speed_summary(speed: Fp8LinearSpeed, label: str,
                                  measured: Mapping[str, Mapping[int, float]], date: str = "") -> Prose:
    """What a recorded speed study says about the course's FP8 layer on ``label``'s GPU, beside the recorded
    product ratios ``measured`` (see :func:`~course_lib.studies.fp8.recorded_product_ratios`); with the
    record's ``date`` (ISO) before :data:`ONE_PASS_CASTS_SINCE`, that it timed an older, slower version of the
    layer than this page's."""
    ours = list(speed.speedup(COURSE_LAYER).values())
    if not ours:
        raise ValueError(f"the record has no {COURSE_LAYER!r} timing next to {BF16_LAYER!r}")
    rec = product_ratios(measured)
    product = (f", although one FP8 `_scaled_mm` product alone ran {rec[max(rec)]:.2f}x BF16's at n = "
               f"{max(rec)} (the recorded products above)" if rec else "")
    torchao = ("torchao did not import on the recording machine, so this record has no torchao layer."
               if any("torchao" in k for k in speed.skipped) else "")
    older = (f" The record dates from {date[:10]}, before {ONE_PASS_CASTS_SINCE}: it timed an older, slower version "
             "of the layer than this page's, from before the layer cast each tensor in one pass without waiting for "
             "the host to read its finiteness check." if date and date[:10] < ONE_PASS_CASTS_SINCE else "")
    return Prose(f"On {label} the course's FP8 layer ran at {min(ours):.2f} to {max(ours):.2f} times BF16's speed "
                 f"(below 1: slower), at every size{product}.{older} This record times the whole layer, forward and "
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


def layer_profile_facts(profile: Fp8LayerProfile) -> dict[str, object]:
    """The profile's matrix-product share and what the rest (amax, scale, cast, other) takes, in percent;
    the FP8 layer's profiled time over BF16's; and what that makes the course layer on this device."""
    if profile.total_us <= 0 or profile.bf16_us <= 0:
        raise ValueError("the profile recorded no time for one of the layers")
    slower = profile.total_us / profile.bf16_us
    matmul = 100 * profile.share("matmul")
    casting = 100 - matmul
    if not profile.device.startswith("cuda"):
        verdict = (f"On this CPU the FP8 products themselves take {matmul:.0f}% of the layer's time: with no FP8 "
                   "arithmetic, `_scaled_mm` converts the codes back to wider floats first. The amax, scale and "
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
    return {"prof_matmul_pct": matmul, "prof_rest_pct": casting, "prof_vs_bf16": slower,
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

    header = ["shape", *(f"{base_name(b)} (ms)" for b in bases),
              *(f"{k}: x {base_name(speed.baseline(k))}" for k in fp8s),
              *(f"predicted {r} on {speed.predicted_for}: x BF16" for r in recipes)]
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


def compiled_speed_facts(speed: Fp8CompiledSpeed) -> dict[str, object]:
    """Where FP8 ran faster than BF16 in ``speed``, where it broke even (within :data:`BREAK_EVEN`) and where
    it was slower (by implementation and shape), how it ran (compiled or eager, device), and what a CPU run
    can say."""
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
        parts = [f"FP8 was faster than BF16 for {and_list(faster)}" if faster else "FP8 was faster than BF16 nowhere",
                 f"it broke even (within {100 * BREAK_EVEN:.0f}%) for {and_list(even)}" if even else "",
                 f"it was slower for {and_list(slower)}" if slower else ""]
        shown = "; ".join(p for p in parts if p) + "."
        if on_cpu and faster:
            shown += (" On a CPU a ratio above 1 can only be timing noise (these layers are tiny, and the machine "
                      "may be shared).")
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

COPES_BELOW = 0.05   # per-tensor scaling "copes" with a 1,000x outlier that flushes less than this share

@dataclass(frozen=True)
class OverflowCasts:
    """What unscaled casts past a format's largest value give: 1000 to E4M3 (max 448) in torch and in
    ml_dtypes, and a million to E5M2 (max 57344) in torch; with the versions that did it."""

    torch_version: str
    torch_e4m3_1000: float
    ml_dtypes_version: str
    ml_dtypes_e4m3_1000: float
    torch_e5m2_1e6: float


def fp8_errata_rows(overflow: OverflowCasts, sweep: OutlierSweep, *, block: int,
                    estimates: Mapping[str, Sequence[Fp8LinearEstimate]],
                    measured: Mapping[str, Mapping[int, float]], recorded_sweep: OutlierSweep | None = None,
                    recorded_where: str = "") -> list[tuple[str, str]]:
    """Lesson 7's errata, (claim, what was measured) pairs: datasheet peaks of the L4, the RTX 4090 and the
    H100; the recorded product ratio at 8192 and the roofline's largest layer; ``overflow``; and the outlier
    sweep's per-tensor flushing at 1,000x and 100,000x, here and, with ``recorded_sweep``, as recorded
    (``recorded_where``: see :func:`~course_lib.studies.fp8_recorded.record_where`). It "copes with a lot"
    while a 1,000x outlier flushes under :data:`COPES_BELOW` of the other values in both."""
    l4, rtx, h100 = DATASHEET_PEAKS["L4"], DATASHEET_PEAKS["RTX 4090"], DATASHEET_PEAKS["H100 SXM5"]
    h100_fp8, h100_bf16 = h100.peak("fp8"), h100.peak("bf16")
    if h100_fp8 is None or h100_bf16 is None:
        raise ValueError("the H100's datasheet entry lacks its FP8 or BF16 peak")
    largest = estimates["tensorwise"][-1]
    rec = product_ratios(measured)
    flushed = sweep.flushed["per tensor, E4M3"]
    i3, i5 = _factor_index(sweep, 1e3), _factor_index(sweep, 1e5)
    at_1e3, at_1e5, there = flushed[i3], flushed[i5], ("", "")
    if recorded_sweep is not None:
        shares = recorded_sweep.flushed["per tensor, E4M3"]
        r3, r5 = shares[_factor_index(recorded_sweep, 1e3)], shares[_factor_index(recorded_sweep, 1e5)]
        there = (f" ({percent_text(r3)}% recorded {recorded_where})", f" ({percent_text(r5)}% recorded)")
        at_1e3 = max(at_1e3, r3)
    copes = "In E4M3 it copes with a lot" if at_1e3 < COPES_BELOW else "In E4M3 it copes with small outliers only"
    return [
        ("FP8 needs Hopper.",
         f"Ada GPUs (compute capability 8.9) have FP8 tensor cores: the L4's datasheet lists {l4.peak('fp8'):g} "
         f"dense FP8 TFLOP/s and the RTX 4090's {rtx.peak('fp8'):g} (with FP32 accumulation); Transformer Engine "
         "supports FP8 on 8.9 {cite:p}`nvidia_te`. (Block-scaled FP8 recipes do need 9.0 or newer.)"),
        ("FP8 training is 4-6x faster than BF16.",
         f"The dense FP8 peak is {h100_fp8 / h100_bf16:.1f}x BF16's ({h100_fp8:g} against {h100_bf16:g} TFLOP/s on "
         f"an H100); one recorded H100 product reached {rec.get(8192, float('nan')):.2f}x; the roofline above "
         f"predicts {largest.speedup:.2f}x for a {largest.m}-wide layer with its casts. End to end, torchao "
         "reports up to 1.5x (405B parameters, 512 GPUs) and about 1.25x (8B, 8 GPUs) {cite:p}`torchao_float8`; "
         "Transformer Engine's Llama tutorial reports 1.39x against Hugging Face's BF16 model, and 252 against "
         "226 ms per step (1.12x) against its own BF16 {cite:p}`nvidia_te_llama`."),
        ("An FP8 overflow becomes NaN.",
         f"It depends on the library and the format. This torch ({overflow.torch_version}) casts 1000 to E4M3 as "
         f"{overflow.torch_e4m3_1000:g} (it saturates); ml_dtypes ({overflow.ml_dtypes_version}) gives "
         f"{overflow.ml_dtypes_e4m3_1000:g}; torchao's source notes that torch 2.11 and older do not saturate "
         f"either. E5M2 rounds a million to {overflow.torch_e5m2_1e6:g}. FP8 recipes clamp to ±max before the "
         "cast, so none of this reaches a product."),
        ("Gradients always use E5M2.",
         "Transformer Engine's HYBRID and torchao's tensorwise do; torchao's rowwise recipes and DeepSeek-V3 use "
         "E4M3 everywhere, relying on finer scales for range {cite:p}`deepseek2024v3`."),
        ("Per-tensor scaling cannot cope with outlier channels.",
         f"{copes}: a 1,000x outlier channel flushed {percent_text(flushed[i3])}% of the other values of this "
         f"page's activation{there[0]}; it is at 100,000x that {percent_text(at_1e5)}%{there[1]} go. "
         f"Per-token scales help little (the outlier section above); 1 x {block} tiles do."),
    ]


def exercise_facts(gpu: GPUPeaks, *, spike: float = 50.0) -> dict[str, object]:
    """The exercises' answers: the roofline for a 4096 x 4096 x 1024 layer on ``gpu`` (speedup, percent of
    the FP8 time spent casting, the products' own gain), its operands' sizes (millions of elements), and
    the delayed-scaling margin that absorbs a ``spike``-fold jump, with its headroom."""
    bf16, fp8 = gpu.peak("bf16"), gpu.peak("fp8")
    if bf16 is None or fp8 is None:
        raise ValueError(f"{gpu.name} lists no BF16 or no FP8 tensor-core peak")
    if not (math.isfinite(spike) and spike > 1):
        raise ValueError(f"spike must be a factor above 1, got {spike!r}")
    layer = predict_fp8_linear(4096, 4096, 1024, bf16_tflops=bf16, fp8_tflops=fp8, bandwidth_gbs=gpu.bandwidth_gbs)
    margin = math.ceil(math.log2(spike))
    return {"ex_speedup": layer.speedup, "ex_cast_share": 100 * layer.fp8_cast_s / layer.fp8_s,
            "ex_gemm_gain": layer.bf16_s / layer.fp8_gemm_s, "ex_elems_x": 4096 * 4096 / 1e6,
            "ex_elems_w": 4096 * 1024 / 1e6, "ex_margin": margin, "ex_headroom": 2 ** margin}

