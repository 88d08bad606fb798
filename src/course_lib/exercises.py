"""Auto-checked exercises: functions that check a reader's answer and explain what is wrong."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .amp import cuda_policy
from .distributed import simulate_all_reduce
from .formats import FloatFormat, get_format, round_to_format, spacing
from .fp8 import DelayedScaling, fp8_max
from .glue import plural
from .memory import bytes_per_parameter
from .monitor import step_was_skipped
from .mx import BlockScaling, e8m0_exponents, element_format
from .scaling import replay_scale_schedule

CHECKABLE_PROPERTIES = ("max_finite", "min_normal", "min_subnormal", "epsilon")


@dataclass(frozen=True)
class Feedback:
    """The verdict on one answer: ``correct`` and a message for the reader (Markdown)."""

    correct: bool
    message: str

    def _repr_markdown_(self) -> str:
        # words, not emoji: an emoji shows as an empty box where no emoji font is installed
        return ("**Right.** " if self.correct else "**Not yet.** ") + self.message

    def __str__(self) -> str:
        return self._repr_markdown_()


def _close(a: float, b: float, rel: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rel * abs(b)


def _likely_mistakes(f: FloatFormat, prop: str) -> list[tuple[float, str]]:
    """(wrong value, explanation) pairs for the usual slips when deriving ``prop`` of ``f`` by hand."""
    truth = getattr(f, prop)
    out: list[tuple[float, str]] = []
    for specials in ("ieee", "fn", "finite"):
        if specials == f.specials:
            continue
        try:
            other = dataclasses.replace(f, specials=specials, overflow="saturate")
        except ValueError:
            continue
        value = getattr(other, prop)
        if value != truth:
            rule = {"ieee": "the all-ones exponent holds only inf and NaN (IEEE style)",
                    "fn": "only the all-ones code is NaN and there is no inf ('fn' style)",
                    "finite": "every code is a finite number"}
            out.append((value, f"that would be right if {rule[specials]}; in {f.name}, "
                               f"{rule[f.specials]}."))
    if prop == "max_finite":
        out.append((2.0 ** f.max_exponent, "that is the largest power of two; the largest value also has "
                                           "its mantissa bits set (times 1.11...1 in binary)."))
    if prop == "min_subnormal":
        out.append((f.min_normal, "that is the smallest *normal* value; subnormals (exponent field 0) "
                                  "go lower, down to one unit of the last mantissa bit."))
    if prop == "min_normal":
        out.append((f.min_subnormal, "that is the smallest *subnormal*; the smallest normal has exponent "
                                     "field 1 and an implicit leading 1."))
    if prop == "epsilon":
        out.append((2.0 ** -(f.mantissa_bits + 1), "that is half an epsilon (the largest rounding error "
                                                   "near 1, the 'unit roundoff'); epsilon is the gap "
                                                   "from 1 to the next value."))
    out.append((truth * 2, "off by a factor of 2: check the bias, 2**(exponent_bits-1) - 1 = "
                           f"{f.bias}, and that the exponent field is biased, not two's complement."))
    out.append((truth / 2, "off by a factor of 2: check the bias, 2**(exponent_bits-1) - 1 = "
                           f"{f.bias}, and which exponent field values are usable."))
    return out


def check_format_property(fmt: str | FloatFormat, prop: str, answer, *, rel_tol: float = 1e-2) -> Feedback:
    """Check a reader's value for a property of a format, e.g. ``("FP8 E5M2", "max_finite", 57344)``.

    An answer within ``rel_tol`` (relative) counts as correct, so a rounded decimal like ``6e-8`` passes;
    a wrong answer that matches a typical slip gets an explanation of that slip.
    """
    f = get_format(fmt)
    if prop not in CHECKABLE_PROPERTIES:
        raise ValueError(f"prop must be one of {CHECKABLE_PROPERTIES}, got {prop!r}")
    truth = getattr(f, prop)
    if answer is None or answer is ...:
        return Feedback(False, f"Set your value for the {prop.replace('_', ' ')} of "
                               f"{f.name} and run the cell again.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"Give a number (int or float), not {type(answer).__name__}.")
    answer = float(answer)
    if _close(answer, truth, rel_tol):
        exact = "" if answer == truth else f" (exactly {truth!r})"
        return Feedback(True, f"Correct: the {prop.replace('_', ' ')} of {f.name} is {answer:g}{exact}.")
    for wrong, why in _likely_mistakes(f, prop):
        if _close(answer, wrong, rel_tol):
            return Feedback(False, f"{answer:g}: {why}")
    return Feedback(False, f"{answer:g} is not the {prop.replace('_', ' ')} of {f.name}. "
                           f"Write out the bits: {f.sign_bits} sign, {f.exponent_bits} exponent "
                           f"(bias {f.bias}) and {f.mantissa_bits} mantissa bits.")


def check_op_bound(flops: float, bytes_moved: float, peak_tflops: float, bandwidth_gbs: float, answer) -> Feedback:
    """Check whether a reader classified an operation as ``"compute"``- or ``"memory"``-bound correctly on
    a device with ``peak_tflops`` and ``bandwidth_gbs``, and explain with the ridge point."""
    for name, v in (("flops", flops), ("bytes_moved", bytes_moved), ("peak_tflops", peak_tflops),
                    ("bandwidth_gbs", bandwidth_gbs)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    if answer is None or answer is ...:
        return Feedback(False, "No answer yet: set `answer` to \"compute\" or \"memory\" and run the cell again.")
    if answer not in ("compute", "memory"):
        return Feedback(False, f"Answer \"compute\" or \"memory\", not {answer!r}.")
    intensity = flops / bytes_moved
    ridge = peak_tflops * 1e3 / bandwidth_gbs
    truth = "compute" if intensity >= ridge else "memory"
    why = (f"its intensity is {intensity:.3g} FLOPs per byte and the ridge of this device is "
           f"{ridge:.3g} FLOPs per byte (peak {peak_tflops:g} TFLOP/s over {bandwidth_gbs:g} GB/s)")
    if answer == truth:
        return Feedback(True, f"Correct: {truth}-bound, since {why}.")
    hint = (" Moving the bytes takes longer than the arithmetic: a faster dtype helps only by moving fewer "
            "bytes." if truth == "memory" else " The arithmetic takes longer than moving the bytes: a dtype "
            "with a higher peak helps.")
    return Feedback(False, f"Not quite: {why}, so it is {truth}-bound.{hint}")


OPTIMIZERS = ("adamw", "sgd_momentum")


def check_bytes_per_parameter(recipe: str, answer, *, optimizer: str = "adamw") -> Feedback:
    """Check a reader's persistent bytes per parameter for a recipe with ``optimizer`` (AdamW, or SGD with
    momentum: one moment instead of AdamW's two, kept in the same dtype), explaining the usual slips."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    parts = bytes_per_parameter(recipe)
    adamw_state = parts["optimizer_state"]
    if optimizer == "sgd_momentum":
        parts["optimizer_state"] = adamw_state // 2
    truth = sum(parts.values())
    if answer is None or answer is ...:
        return Feedback(False, f"No answer yet: set your bytes per parameter for `{recipe}` and run the cell again.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"Give a number of bytes, not {type(answer).__name__}.")
    listing = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in parts.items() if v)
    if answer == truth:
        return Feedback(True, f"Correct: {truth} bytes per parameter ({listing}).")
    slips = []
    if answer == truth - parts["gradients"]:
        slips.append("you left out the gradients, which live from backward until the optimizer step")
    if parts["master_weights"] and answer == truth - parts["master_weights"]:
        slips.append("you left out the FP32 master weights")
    if parts["master_weights"] and answer == truth - 2 * parts["master_weights"]:
        slips.append("you left out the FP32 master weights and their FP32 gradient (a gradient, beside the "
                     "BF16 one)")
    if answer == truth - parts["optimizer_state"]:
        slips.append("you left out AdamW's two moments" if optimizer == "adamw" else "you left out the momentum")
    if optimizer == "sgd_momentum" and answer == truth + adamw_state - parts["optimizer_state"]:
        slips.append("you counted AdamW's two moments: SGD with momentum keeps one, in the same dtype")
    if "autocast" in recipe:
        if answer in (truth + 2, truth + 4):  # a persistent 16-bit weight copy, and 16-bit gradients too
            slips.append("autocast keeps no persistent 16-bit copy of the weights and no 16-bit gradients: "
                         "weights and gradients stay FP32, and the 16-bit weight copies live only during "
                         "forward and backward")
    detail = "; ".join(slips) if slips else f"count each piece: {listing}"
    return Feedback(False, f"Not quite: {answer:g}. {detail[0].upper() + detail[1:]}.")


def check_delayed_scale(answer, amax_history, *, margin: int = 0, fmt: str = "e4m3",
                        amax_compute_algo: str = "max", amax_history_len: int = 1024) -> Feedback:
    """Check the scale delayed scaling uses at the next step after the amaxes ``amax_history`` (oldest
    first), by Transformer Engine's rule as :class:`course_lib.fp8.DelayedScaling` implements it."""
    recipe = DelayedScaling(fmt, amax_history_len=amax_history_len, amax_compute_algo=amax_compute_algo,
                            margin=margin)
    history = [float(a) for a in amax_history]
    for amax in history:
        recipe.observe(amax)
    truth = recipe.current_scale
    if answer is None or answer is ...:
        return Feedback(False, "No answer yet: set your scale and run the cell again.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"Give a number, not {type(answer).__name__}.")
    kept = recipe.history
    used = max(kept) if amax_compute_algo == "max" else kept[-1]
    rule = f"{fp8_max(fmt):g} / {used:g} / 2**{margin} = {truth:.6g}"
    if _close(float(answer), truth, 1e-3):
        return Feedback(True, f"{rule}. The scale comes from the history, not from the tensor it casts.")
    slips = []
    if kept and _close(float(answer), fp8_max(fmt) / kept[-1] / 2.0**margin, 1e-3) and amax_compute_algo == "max":
        slips.append("that uses the most recent amax; with `amax_compute_algo='max'` it is the largest amax in "
                     "the history window")
    if _close(float(answer), fp8_max(fmt) / used, 1e-3) and margin:
        slips.append(f"the margin divides the scale by 2**{margin} more, leaving headroom for growth")
    if _close(float(answer), used / fp8_max(fmt), 1e-3):
        slips.append("that is the inverse: the scale multiplies the tensor up to the format's max, so it is "
                     "max / amax (its inverse is what dequantisation multiplies by)")
    if len(history) > amax_history_len and _close(float(answer), fp8_max(fmt) / max(history) / 2.0**margin, 1e-3):
        slips.append(f"the history keeps only the last {amax_history_len} amaxes; older ones have rolled out")
    detail = "; ".join(slips) if slips else "the rule is max / amax / 2**margin over the history window"
    return Feedback(False, f"Not quite: {answer:g}. {detail[0].upper() + detail[1:]}.")


FATES = ("zero", "subnormal", "normal", "inf")


def check_value_fate(value: float, answer, fmt: str | FloatFormat = "FP16") -> Feedback:
    """Check what becomes of ``value`` stored in ``fmt``: ``"zero"``, ``"subnormal"``, ``"normal"`` or
    ``"inf"`` (``"inf"`` also stands for saturation in formats without infinity)."""
    f = get_format(fmt)
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"value must be a finite number, got {value!r}")
    stored = float(round_to_format(float(value), f))
    magnitude = abs(stored)
    if math.isinf(stored) or (not f.has_inf and magnitude == f.max_finite and abs(value) > f.max_finite):
        truth = "inf"
    elif stored == 0.0:
        truth = "zero"
    elif magnitude < f.min_normal:
        truth = "subnormal"
    else:
        truth = "normal"
    if answer is None or answer is ...:
        return Feedback(False, f"Set one of {', '.join(map(repr, FATES))} and run the cell again.")
    if isinstance(answer, str):
        answer = answer.strip().lower()   # "Subnormal " is an answer, not a typo
    if answer not in FATES:
        return Feedback(False, f"Answer one of {', '.join(map(repr, FATES))}, not {answer!r}.")
    limits = (f"{f.name}'s smallest normal is {f.min_normal:.6g}, its smallest subnormal {f.min_subnormal:.6g} "
              f"and its largest value {f.max_finite:g}")
    if answer == truth:
        return Feedback(True, f"{f.name} stores {value:g} as {stored:.6g}; {limits}.")
    # a hint on what the guess would need, never the stored value or the right answer
    overflow_from = f.max_finite + float(spacing(f.max_finite, f)) / 2
    hint = {
        "zero": f"a value rounds to 0 only at or below half the smallest subnormal, {f.min_subnormal / 2:.6g}; "
                "between that and the smallest normal, values are kept, with fewer significant bits",
        "subnormal": f"subnormals hold values from half the smallest subnormal, {f.min_subnormal / 2:.6g} "
                     f"(exclusive), up to the smallest normal, {f.min_normal:.6g}",
        "normal": f"normal values run from the smallest normal, {f.min_normal:.6g}, to about the largest value",
        "inf": (f"a value becomes inf only from half a spacing past the largest value on, {overflow_from:g}"
                if f.has_inf else f"{f.name} has no inf: only values past its largest value saturate"),
    }[answer]
    return Feedback(False, f"{limits}. Where does {value:g} fall? Hint: {hint}.")


def check_scale_after(answer, steps: int, overflow_steps=(), *, init_scale: float = 2.0**16,
                      growth_factor: float = 2.0, backoff_factor: float = 0.5, growth_interval: int = 2000) -> Feedback:
    """Check the loss scale a dynamic scaler (GradScaler's rule) uses at step ``steps`` (counting from 0)
    when the steps in ``overflow_steps`` overflow and the others do not."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be a non-negative int, got {steps!r}")
    if not (math.isfinite(init_scale) and init_scale > 0 and growth_factor > 1 and 0 < backoff_factor < 1):
        raise ValueError("init_scale must be positive and finite, growth_factor > 1 and 0 < backoff_factor < 1, "
                         f"got {init_scale!r}, {growth_factor!r}, {backoff_factor!r}")
    overflows = set(overflow_steps)
    trace = replay_scale_schedule([0.0 if i in overflows else math.inf for i in range(steps + 1)],
                                  init_scale=init_scale, growth_factor=growth_factor,
                                  backoff_factor=backoff_factor, growth_interval=growth_interval)
    truth = trace.scales[steps]
    if answer is None or answer is ...:
        return Feedback(False, "No answer yet: set the scale and run the cell again.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"Give a number, not {type(answer).__name__}.")
    try:
        value = float(answer)
    except OverflowError:   # an int past float's range: as wrong as inf, and must not crash the check
        value = math.inf if answer > 0 else -math.inf
    backoffs = sum(1 for i in overflows if i < steps)
    growths = round(math.log(truth / init_scale / backoff_factor**backoffs, growth_factor)) if truth > 0 else 0
    rule = (f"{backoffs} overflow(s) before step {steps} cut the scale by {backoff_factor:g}x each time, "
            f"and it grows by {growth_factor:g}x only after {growth_interval} overflow-free steps in a row")
    if _close(value, truth, 1e-9):
        return Feedback(True, f"{rule} ({growths} time(s) here): {truth:g}.")
    # compared in log space: growing every step gives init * growth**steps, far past float's range
    # for a few thousand steps (2**4004), so that scale is never formed as a number
    every_step_log = math.log(init_scale) + (steps - backoffs) * math.log(growth_factor)
    grew_every_step = value > 0 and abs(math.log(value) - every_step_log) <= 1e-9 * max(1.0, abs(every_step_log))
    slips = []
    if grew_every_step or value > truth * 4:
        slips.append("the scale does not grow every step: it grows once per `growth_interval` clean steps")
    if overflows and _close(value, truth / backoff_factor, 1e-9):
        slips.append("the growth counter restarts at 0 after an overflow")
    if 0 < value < truth:
        slips.append(f"count how many runs of {growth_interval} clean steps fit between the last overflow "
                     f"and step {steps}")
    detail = "; ".join(slips) or "replay the steps one by one"
    # the rule, not the replayed scale: a wrong guess should not be answered with the answer
    return Feedback(False, f"Not quite: {value:g}. {detail[0].upper() + detail[1:]}. Rule: {rule}.")


AUTOCAST_ANSWERS = ("lower precision", "fp32", "promote", "input dtype")


def check_autocast_policy(op: str, answer) -> Feedback:
    """Check which CUDA autocast policy torch applies to ``op``: ``"lower precision"``, ``"fp32"``,
    ``"promote"`` (widest input type) or ``"input dtype"`` (on no list: the op runs in its inputs' dtype).
    The truth is read from torch's own ``autocast_mode.h``."""
    policy = cuda_policy(op)
    truth = {"fp32 (via dtype argument)": "fp32", "-": "input dtype"}.get(policy, policy)
    if answer is None or answer is ...:
        return Feedback(False, f"No answer yet: set one of {', '.join(map(repr, AUTOCAST_ANSWERS))}.")
    if answer not in AUTOCAST_ANSWERS:
        return Feedback(False, f"Answer one of {', '.join(map(repr, AUTOCAST_ANSWERS))}, not {answer!r}.")
    where = {"lower precision": "on the lower-precision list (matmul-like, gains from tensor cores)",
             "fp32": "on the FP32 list" + (" (autocast passes it `dtype=torch.float32`)"
                                           if policy.startswith("fp32 (") else " (precision-sensitive)"),
             "promote": "on the promote list (runs in the widest of its inputs' types)",
             "input dtype": "on none of CUDA autocast's lists, so it runs in whatever dtype its inputs have"}[truth]
    if answer == truth:
        return Feedback(True, f"`{op}` is {where}.")
    return Feedback(False, f"Not quite: `{op}` is {where}.")


def check_bf16_update(weight: float, update: float, answer) -> Feedback:
    """Check whether adding ``update`` to a BF16 weight ``weight`` changes it (``answer``: True/False)."""
    import torch


    w = torch.tensor(float(weight), dtype=torch.bfloat16)
    after = w + torch.tensor(float(update), dtype=torch.bfloat16)
    truth = bool(after != w)
    if answer is None or answer is ...:
        return Feedback(False, "No answer yet: set True (the weight changes) or False and run the cell again.")
    if not isinstance(answer, bool):
        return Feedback(False, f"Answer True or False, not {answer!r}.")
    gap = float(spacing(float(w), "BF16"))
    facts = (f"the BF16 weight {float(w):g} has neighbours {gap:g} apart, so an update smaller than half of that "
             f"({gap / 2:g}) is rounded away; {update:g} gives {float(after):g}")
    if answer == truth:
        return Feedback(True, facts + ".")
    return Feedback(False, "Not quite: " + facts + ".")


def check_mx_scale(answer, block_amax: float, *, element: str = "e2m1", mode: str = "floor") -> Feedback:
    """Check the E8M0 scale (a power of two, e.g. ``0.5``) an MX block with largest magnitude ``block_amax``
    gets with ``element`` elements and scale ``mode`` (:func:`course_lib.mx.e8m0_exponents`)."""
    import torch


    f = element_format(element)
    if not (math.isfinite(block_amax) and block_amax > 0):
        raise ValueError(f"block_amax must be a positive number, got {block_amax!r}")
    exps = {m: int(e8m0_exponents(torch.tensor([block_amax]), element, m)[0]) for m in ("floor", "rceil")}
    truth = 2.0 ** exps[mode]
    if answer is None or answer is ...:
        return Feedback(False, "No answer yet: set your scale and run the cell again.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"Give a number (the scale, a power of two), not {type(answer).__name__}.")
    top = block_amax / truth
    fate = (f"saturates to {f.max_finite:g}" if top > f.max_finite else f"fits under {f.max_finite:g}")
    if _close(float(answer), truth, 1e-9):
        return Feedback(True, f"2**{exps[mode]} = {truth:g}. The block's largest value becomes {block_amax:g} / "
                              f"{truth:g} = {top:g}, which {fate}.")
    other = "rceil" if mode == "floor" else "floor"
    if _close(float(answer), 2.0 ** exps[other], 1e-9):
        rule = ("floor(log2(amax)) - emax" if mode == "floor" else "ceil(log2(amax / max))")
        return Feedback(False, f"{answer:g} is the {other.upper()} scale; {mode.upper()} uses {rule}, with "
                               f"emax = {f.max_exponent} and max = {f.max_finite:g} for {f.name}.")
    if _close(float(answer), block_amax / f.max_finite, 1e-6):
        return Feedback(False, f"{answer:g} is amax / max exactly, but an E8M0 scale is a power of two: "
                               "round its exponent as the mode says.")
    if _close(float(answer), 1 / truth, 1e-9):
        return Feedback(False, "That is the inverse: the E8M0 scale multiplies the stored elements back to "
                               "the values, so it is about amax / max, not max / amax.")
    return Feedback(False, f"Not quite: {answer:g}. Take floor(log2({block_amax:g})) = "
                           f"{math.floor(math.log2(block_amax))} and work from the mode's rule.")


def check_nvfp4_value(answer, value: float, block_amax: float, tensor_amax: float) -> Feedback:
    """Check what NVFP4 stores for ``value`` (dequantised) in a 1x16 block whose largest magnitude is
    ``block_amax``, in a tensor whose largest magnitude is ``tensor_amax``."""
    import torch


    if not (0 < abs(value) <= block_amax <= tensor_amax) or not math.isfinite(tensor_amax):
        raise ValueError("need 0 < |value| <= block_amax <= tensor_amax, all finite")
    x = torch.zeros(2, 16)
    x[0, 0], x[0, 1], x[1, 0] = block_amax, value, tensor_amax
    q = BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True).quantize(x)
    truth = float(q.dequantize()[0, 1])
    ts, bs = float(q.tensor_scale), float(q.block_scales[0, 0])
    if answer is None or answer is ...:
        return Feedback(False, "No answer yet: set your value and run the cell again.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"Give a number, not {type(answer).__name__}.")
    steps = (f"tensor scale {tensor_amax:g} / (448 * 6) = {ts:.6g}; block scale E4M3({block_amax:g} / 6 / "
             f"{ts:.6g}) = {bs:g}; {value:g} / ({ts:.6g} * {bs:g}) = {value / (ts * bs):.4g}, rounded to E2M1 = "
             f"{float(q.elements[0, 1]):g}; times {ts * bs:.6g} = {truth:.6g}")
    if _close(float(answer), truth, 1e-4):
        return Feedback(True, steps + ".")
    if _close(float(answer), value, 1e-6) and truth != value:
        return Feedback(False, f"{value:g} is the input; FP4 keeps only 8 magnitudes per block. Work it through.")
    return Feedback(False, f"Not quite: {answer:g}. Work it through: the tensor scale is amax / (448 * 6), the "
                           "block scale is the block amax / 6 over the tensor scale, rounded to E4M3; the element "
                           "is the value over both scales, rounded to the nearest E2M1 value (ties to even).")


def check_first_nonfinite(answer, trace) -> Feedback:
    """Check which module produced the first non-finite value, given a hook ``trace``: a list of
    ``(module, phase, inputs_finite, outputs_finite)`` in the order the hooks fired (the locator's rule: the
    first event whose inputs were finite and whose outputs were not)."""
    events = [tuple(e) for e in trace]
    if not events or any(len(e) != 4 for e in events):
        raise ValueError("trace must be a non-empty list of (module, phase, inputs_finite, outputs_finite)")
    culprit = next((e for e in events if e[2] and not e[3]), None)
    if answer is None or answer is ...:
        return Feedback(False, "No answer yet: name the module and run the cell again.")
    if not isinstance(answer, str):
        return Feedback(False, f"Give the module's name as a string, not {type(answer).__name__}.")
    answer = answer.strip()
    if culprit is None:
        return Feedback(answer.lower() in ("none", ""), "No event has finite inputs and non-finite outputs: "
                        "nothing in this trace produced the non-finite value (it came in from outside the "
                        "hooked modules).")
    if answer == culprit[0]:
        return Feedback(True, f"`{culprit[0]}` ({culprit[1]}): the first module whose inputs were finite and "
                              "whose outputs were not. Every later module only passed the non-finite value on.")
    names = [e[0] for e in events]
    if answer not in names:
        return Feedback(False, f"`{answer}` is not a module in this trace; its modules are "
                               f"{', '.join(f'`{n}`' for n in dict.fromkeys(names))}.")
    if answer == events[-1][0]:
        return Feedback(False, "The last module is where the non-finite value is noticed (the loss), not where "
                               "it was made.")
    first = events[names.index(answer)]
    if not first[2]:
        return Feedback(False, f"`{answer}` received a non-finite input already: it passed the non-finite value "
                               "on. Look for the first module whose inputs were all finite.")
    if first[3]:
        return Feedback(False, f"`{answer}`'s outputs were finite when its hook fired.")
    return Feedback(False, f"`{answer}` had finite inputs and non-finite outputs too, but its hook fired after "
                           f"`{culprit[0]}`'s: a module that contains another (a whole block) fires after the "
                           "modules inside it, so look for the first such event in firing order.")


def check_skipped_steps(answer, scales) -> Feedback:
    """Check which optimizer steps a ``torch.amp.GradScaler`` skipped, given ``scales``: ``scaler.get_scale()``
    read at the start of each step (step 0 first) and once more after the last ``update()``. A step was
    skipped exactly when the scale fell after it (:func:`course_lib.monitor.step_was_skipped`); a rise is the
    scale's growth after ``growth_interval`` good steps in a row, and the step ran."""
    values = list(scales) if not isinstance(scales, (str, bytes)) else []
    if len(values) < 2 or any(isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0)
                              for v in values):
        raise ValueError("scales must be two or more positive finite numbers: the scale at the start of each "
                         "step and after the last update")
    n = len(values) - 1
    truth = {k for k in range(n) if step_was_skipped(float(values[k]), float(values[k + 1]))}
    grew = {k for k in range(n) if values[k + 1] > values[k]}
    if answer is None or answer is ...:
        return Feedback(False, "No answer yet: list the skipped steps and run the cell again.")
    if isinstance(answer, (str, bytes)) or not hasattr(answer, "__iter__") or not all(
            isinstance(k, int) and not isinstance(k, bool) for k in answer):
        return Feedback(False, "Give the step numbers as a list of ints, for example `[0, 3]` (`[]` for none).")
    given = set(answer)
    named = ", ".join(str(k) for k in sorted(truth)) or "none"
    if given == truth:
        why = ("The scale fell after each of them: `update()` multiplies it by `backoff_factor` exactly when "
               "`step()` found an inf or NaN and skipped." if truth else "The scale never fell.")
        rise = (f" The rise after step {', '.join(str(k) for k in sorted(grew))} is growth after `growth_interval` "
                "good steps in a row: that step ran." if grew else "")
        return Feedback(True, f"Skipped: {named}. {why}{rise}")
    outside = sorted(k for k in given if not 0 <= k < n)
    if outside:
        return Feedback(False, f"There are {n} steps, 0 to {n - 1}; {outside[0]} is not one of them.")
    if truth and given == {k + 1 for k in truth}:
        return Feedback(False, "Each of those is the first step that *ran at* the lower scale. The reading after "
                               "step k's `update()` is the one at the start of step k + 1, so the step that was "
                               "skipped is the one before.")
    rose = sorted(given & grew)
    if rose:
        return Feedback(False, f"The scale rose after step {rose[0]}: GradScaler multiplies it by `growth_factor` "
                               "after `growth_interval` good steps in a row, so that step ran. Only a fall means a "
                               "skip.")
    flat = sorted(given - truth)
    if flat:
        return Feedback(False, f"The scale did not change after step {flat[0]}: no inf or NaN, the step ran.")
    missed = sorted(truth - given)
    return Feedback(False, f"You missed {len(missed)} skipped step{'s' if len(missed) > 1 else ''}: look for every "
                           "fall of the scale, not only the first.")


def check_ring_all_reduce(answer, values, fmt: str = "BF16") -> Feedback:
    """Check a reader's value for one entry of a ring all-reduce over ``len(values)`` ranks in ``fmt``
    (``BF16`` or ``FP16``): the entry lies in chunk 0, which the ring sums ranks N-1, N-2, ..., 0 in that
    order, rounding every partial sum (see :func:`course_lib.distributed.simulate_all_reduce`)."""
    import torch


    dtypes = {"BF16": torch.bfloat16, "FP16": torch.float16}
    if fmt not in dtypes:
        raise ValueError(f"fmt must be one of {', '.join(dtypes)}, got {fmt!r}")
    values = [float(v) for v in values]
    if len(values) < 2:
        raise ValueError("a reduction needs the values of at least 2 ranks")
    column = torch.tensor(values)[:, None]
    truth = float(simulate_all_reduce(column, dtypes[fmt], "ring"))
    if answer is None or answer is ...:
        return Feedback(False, "No answer yet: set a number and run the cell again.")
    if isinstance(answer, bool) or not isinstance(answer, (int, float)):
        return Feedback(False, f"Answer with a number, not {answer!r}.")
    order = " + ".join(f"{v:g}" for v in reversed(values))
    right = (f"The ring adds {order} left to right, rounding to {fmt} after each addition "
             f"(a tie to the number with an even last bit): {truth:.10g}.")
    if float(answer) == truth:
        return Feedback(True, right)
    dtype = dtypes[fmt]

    def chain(addends, truncate: bool) -> float:
        """Add ``addends`` one at a time in ``dtype``, each partial sum rounded to nearest or cut toward 0."""
        addends = [float(torch.tensor(v).to(dtype)) for v in addends]   # each rank's value in dtype first
        acc = torch.tensor(addends[0]).to(dtype)
        for v in addends[1:]:
            exact = float(acc) + v   # FP64: exact unless the two exponents lie far apart
            acc = torch.tensor(exact).to(dtype)
            if truncate and abs(float(acc)) > abs(exact):
                acc = torch.nextafter(acc, torch.zeros_like(acc))
        return float(acc)

    exact = math.fsum(values)
    tree = float(simulate_all_reduce(column, dtype, "tree"))
    truncated = chain(list(reversed(values)), truncate=True)
    rank0_first = chain(values, truncate=False)
    tree_hint = f"the pairwise tree order (ranks added in pairs from rank 0), where the ring starts from the last rank: {order}"
    cut_hint = (f"each partial sum cut off (truncated) instead of rounded to the nearest {fmt} number; a sum "
                f"halfway between two {fmt} numbers is a tie, which goes to the one with an even last bit")
    a = float(answer)
    # an answer typed to fewer decimals than the value has (1.0156 for 1.015625) is right when it rounds to
    # the value at the decimals typed, unless a slip's result rounds to the same answer there
    typed = repr(a)
    decimals = len(typed.split(".")[1]) if "." in typed and "e" not in typed else None
    slips = {exact, tree, truncated, rank0_first} - {truth}
    if decimals is not None and a not in slips:
        half_unit = 0.5 * 10.0 ** -decimals * (1 + 1e-9)
        t = torch.tensor(truth).to(dtype)
        # the typed answer must single out the value among its format's numbers, not only among the slips
        gap = min(abs(float(torch.nextafter(t, t + d)) - truth) for d in (1.0, -1.0))
        if abs(a - truth) <= half_unit:
            if half_unit < gap / 2 and not any(abs(a - v) <= half_unit for v in slips):
                return Feedback(True, f"Right to the {plural(decimals, 'decimal')} you gave. {right}")
            return Feedback(False, f"Close, but not precise enough: at {plural(decimals, 'decimal')}, {a:g} "
                                   f"could also be another {fmt} number. Give more decimals.")
    if a == exact and exact != truth:
        hint = (f"{exact:.10g} is the exact sum; in {fmt}, every partial sum is rounded to the nearest {fmt} "
                f"number (a tie to the one with an even last bit), the last one included")
    elif a == tree == truncated:
        hint = f"{a:.10g} is what two slips give here: {tree_hint}; or the ring's order with {cut_hint}"
    elif a == truncated:
        hint = f"{a:.10g} is the ring's order with {cut_hint}"
    elif a == tree:
        hint = f"{a:.10g} is {tree_hint}"
    elif a == rank0_first:
        hint = (f"{a:.10g} is what adding from rank 0 gives ({' + '.join(f'{v:g}' for v in values)}), where "
                f"each small value, added to a large partial sum alone, can round away; the ring starts from "
                f"the last rank ({order}), so the small values meet each other first")
    else:
        hint = f"add {order} one at a time, rounding to {fmt} after each addition"
    return Feedback(False, f"Not quite: {hint}.")
