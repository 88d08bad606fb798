"""Lesson 1's studies: the codecs against PyTorch's casts, the magnitudes of the course model's weights,
activations, gradients and Adam moments, and the facts, phrases and errata the lesson's prose glues."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn as nn

from ..device import SizeProfile
from ..formats import (TF32_SCALE_EXPONENTS, FloatFormat, TF32Check, all_values, bit_string, encode, get_format,
                       round_to_format, spacing)
from ..glue import Prose
from ..magnitudes import HistogramAccumulator, LogHistogram, log2_histogram
from ..models import GPTConfig, course_setup
from ..results import RecordedResult, describe_records
from ..tables import markdown_table


@dataclass(frozen=True)
class TrainingMagnitudes:
    """Magnitudes of every kind of tensor in a training step of the course model.

    ``histograms`` maps each of :data:`TENSOR_KINDS` to its :class:`LogHistogram`, measured after
    ``steps`` steps of FP32 AdamW training, on one more batch.
    """

    histograms: dict[str, LogHistogram]
    steps: int
    config: GPTConfig
    batch_size: int
    final_loss: float
    device: str
    loss_history: tuple[float, ...] = field(default=())

    def quantiles(self, kind: str, qs: tuple[float, ...] = (0.0, 0.01, 0.5, 0.99, 1.0)) -> tuple[float, ...]:
        if kind not in self.histograms:
            raise ValueError(f"unknown tensor kind {kind!r}; known: {', '.join(self.histograms)}")
        return tuple(self.histograms[kind].quantile(q) for q in qs)


def measure_training_magnitudes(
    profile: SizeProfile,
    device: torch.device | str = "cpu",
    *,
    steps: int | None = None,
    seed: int = 0,
    lr: float = 3e-3,
) -> TrainingMagnitudes:
    """Train the course model in FP32 with AdamW, then histogram every kind of tensor on one step.

    Sizes come from ``profile`` (model shape, batch size, default number of steps).
    """
    setup = course_setup(profile, device, steps=steps, default_steps=(60, 300), seed=seed)
    steps, device, cfg, sampler = setup.steps, setup.device, setup.config, setup.sampler
    batch_size = sampler.batch_size
    model = setup.model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for step in range(steps):
        x, y = sampler.batch(step, device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))

    acts, act_grads = HistogramAccumulator(), HistogramAccumulator()

    def hook(_module: nn.Module, _inputs, output: torch.Tensor) -> None:
        acts.add(output)
        output.register_hook(lambda g: act_grads.add(g))

    handles = [m.register_forward_hook(hook) for m in model.modules()
               if isinstance(m, (nn.Linear, nn.LayerNorm, nn.Embedding))]
    try:
        x, y = sampler.batch(steps, device)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
    finally:
        for h in handles:
            h.remove()
    params = [p for p in model.parameters()]
    weight_grads = log2_histogram([p.grad for p in params if p.grad is not None])
    weights = log2_histogram([p.detach() for p in params])
    opt.step()
    states = [opt.state[p] for p in params if p in opt.state]
    histograms = {
        "weights": weights,
        "activations": acts.result(),
        "activation gradients": act_grads.result(),
        "weight gradients": weight_grads,
        "Adam first moment": log2_histogram([s["exp_avg"] for s in states]),
        "Adam second moment": log2_histogram([s["exp_avg_sq"] for s in states]),
    }
    return TrainingMagnitudes(histograms=histograms, steps=steps, config=cfg, batch_size=batch_size,
                              final_loss=float(loss.detach()), device=str(device),
                              loss_history=tuple(losses))



def recorded_magnitudes_beside(records: Sequence[RecordedResult], device_type: str
                               ) -> tuple[str, TrainingMagnitudes] | None:
    """The first recorded GPU run, ``(hardware label, magnitudes)``, to draw beside a live run that is not on
    a GPU; None when there is no record or the live run is itself on a GPU."""
    if not records or device_type == "cuda":
        return None
    if not isinstance(records[0].result, TrainingMagnitudes):
        raise TypeError(f"expected recorded TrainingMagnitudes, got {type(records[0].result).__name__}")
    return records[0].label, records[0].result


# ---- the codecs against PyTorch ----------------------------------------------------------------------

def codec_agreement_with_torch(fmt: str | FloatFormat, n: int = 1_000_000, seed: int = 0) -> float:
    """Share (0 to 1) of ``n`` random values on which :func:`~course_lib.formats.round_to_format` equals
    PyTorch's own cast to ``fmt``. The values have random signs and log2-magnitudes uniform from two binades
    below the format's smallest subnormal to one above its largest finite value, so every binade, the
    subnormals, underflow and overflow are all drawn."""
    f = get_format(fmt)
    dtype = f.torch_dtype_or_none()
    if dtype is None:
        raise ValueError(f"{f.name} has no torch dtype to compare with")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    gen = torch.Generator().manual_seed(seed)
    log2_mag = torch.empty(n).uniform_(np.log2(f.min_subnormal) - 2, np.log2(f.max_finite) + 1, generator=gen)
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    x = sign * torch.exp2(log2_mag)
    mine = round_to_format(x, f)
    theirs = x.to(dtype).float()
    return float((mine == theirs).double().mean())


def agreement_facts(agreement: dict[str, float]) -> dict[str, object]:
    """The smallest of :func:`codec_agreement_with_torch`'s shares over formats, in percent (``agree_min``)."""
    if not agreement:
        raise ValueError("agreement holds no format")
    return {"agree_min": min(agreement.values()) * 100}


# ---- the formats' properties -------------------------------------------------------------------------

def format_facts() -> dict[str, object]:
    """The registry's properties the prose quotes: FP16's, BF16's, FP32's and TF32's limits, epsilons,
    binades, decimal digits, finite codes and bit counts, the FP8 maxima, and the bit pattern
    (``fp16_max_bits``, Markdown) and unbiased exponent of FP16's largest finite value."""
    fp32, tf32, bf16, fp16 = (get_format(n) for n in ("FP32", "TF32", "BF16", "FP16"))
    e4m3, e5m2 = get_format("FP8 E4M3"), get_format("FP8 E5M2")
    max_code = int(encode(np.array([fp16.max_finite]), fp16)[0])
    return {
        "fp16_max": fp16.max_finite, "fp16_min_normal": fp16.min_normal,
        "fp16_min_subnormal": fp16.min_subnormal, "fp16_eps": fp16.epsilon,
        "bf16_max": bf16.max_finite, "bf16_eps": bf16.epsilon, "fp32_max": fp32.max_finite,
        "e4m3_max": e4m3.max_finite, "e5m2_max": e5m2.max_finite,
        "fp16_binades": fp16.binades, "bf16_binades": bf16.binades,
        "fp16_digits": fp16.decimal_digits, "bf16_digits": bf16.decimal_digits,
        "fp16_finite": fp16.n_finite_codes, "bf16_finite": bf16.n_finite_codes,
        "fp16_mantissa_bits": fp16.mantissa_bits, "bf16_mantissa_bits": bf16.mantissa_bits,
        "tf32_mantissa_bits": tf32.mantissa_bits, "tf32_bits": tf32.bits,
        "fp16_max_bits": Prose(f"`{bit_string(max_code, fp16)}`"),
        "fp16_max_exponent": fp16.max_exponent,
    }


TF32_RULES = {"nearest_even": "round to nearest, ties to even", "nearest_away": "round to nearest, ties away",
              "toward_zero": "truncation (toward zero)"}


def tf32_verdict(check: TF32Check) -> str:
    """The sentence a TF32 check ends on: the rule every element matches (and what that says about the
    tensor cores), or the closest rule when none matches every element."""
    unknown = set(check.agreement) - set(TF32_RULES)
    if not check.agreement or unknown:
        raise ValueError(f"agreement must map rounding rules among {tuple(TF32_RULES)}, got {check.agreement!r}")
    best = check.best_rule
    if not check.bit_exact:
        return f"No rule matches every element; the closest is {TF32_RULES[best]}."
    codec = ", the rule the course's TF32 codec uses" if best == "nearest_even" else ""
    truncate = "truncate" if best == "toward_zero" else "do not truncate"
    return f"Every element matches **{TF32_RULES[best]}**{codec}; on this GPU the tensor cores {truncate} FP32 inputs."


def tf32_record_text(records: Sequence[RecordedResult]) -> Prose:
    """Markdown for the recorded ``tf32_matmul_rounding`` runs: the first record's share of elements equal
    to each rounding rule (a table, in percent), its verdict and the records' provenance; with no record, the
    command that makes one."""
    if not records:
        return Prose("No GPU has recorded this check yet: on a GPU, "
                     "`python -m course_lib.record tf32_matmul_rounding` runs it.")
    rec = records[0]
    check = rec.result
    if not isinstance(check, TF32Check):
        raise TypeError(f"expected a recorded TF32Check, got {type(check).__name__}")
    table = markdown_table(("rule", "elements equal"),
                           [(TF32_RULES[k], f"{100 * v:.4f}%") for k, v in check.agreement.items()])
    low, high = TF32_SCALE_EXPONENTS
    return Prose(f"Recorded on **{rec.label}** with a {check.n} x {check.n} matrix (standard normal values, each "
                 f"scaled by $2^k$ with $k$ from {low} to {high - 1}): the "
                 f"share of elements of `A @ I` (TF32 on) equal to A rounded by each rule.\n\n{table}\n"
                 f"{tf32_verdict(check)}\n\n{describe_records(records)}")


# ---- where a real model's numbers live -----------------------------------------------------------------

def magnitude_facts(magnitudes: TrainingMagnitudes) -> dict[str, object]:
    """What :func:`measure_training_magnitudes` found against FP16, percentages of all finite values of a
    kind, with exact zeros counted apart (as lesson 2's tables do: a zero is no value a cast loses), so the
    shares below a threshold count non-zero values only: activation gradients below FP16's smallest
    subnormal (``agrad_below_fp16``), below half of it (``agrad_flushed_fp16``, they round to zero) and in its
    subnormal range (``agrad_sub_fp16``); non-zero weight gradients below its smallest normal
    (``wgrad_sub_fp16``); Adam's second moment below its smallest subnormal (``v_below_fp16``); and the
    shares that are exactly zero (``agrad_zero``, ``v_zero``). Also the largest activation, the medians of
    the activation gradients and second moment, the training steps and the last loss (nats per byte)."""
    kinds = ("activations", "activation gradients", "weight gradients", "Adam second moment")
    missing = [k for k in kinds if k not in magnitudes.histograms]
    if missing:
        raise ValueError(f"magnitudes lack the histograms {missing}")
    fp16 = get_format("FP16")
    hist = magnitudes.histograms
    zero = {kind: _zero_share(hist[kind]) for kind in kinds}
    # fraction_below counts the zeros too; they are reported apart, so every share below is of non-zero values
    below = {kind: hist[kind].fraction_below(fp16.min_subnormal) - zero[kind] for kind in kinds}
    # below half the smallest subnormal a value rounds to zero (exactly half is a tie, which goes to zero too)
    flushed = hist["activation gradients"].fraction_below(fp16.min_subnormal / 2) - zero["activation gradients"]
    sub = {kind: hist[kind].fraction_below(fp16.min_normal) - zero[kind] - below[kind] for kind in kinds}
    return {
        "mag_steps": magnitudes.steps,
        "mag_loss": magnitudes.final_loss,
        "v_below_fp16": below["Adam second moment"] * 100,
        "agrad_below_fp16": below["activation gradients"] * 100,
        "agrad_flushed_fp16": flushed * 100,
        "agrad_sub_fp16": sub["activation gradients"] * 100,
        "wgrad_sub_fp16": (below["weight gradients"] + sub["weight gradients"]) * 100,
        "act_max": hist["activations"].max_abs,
        "v_median": hist["Adam second moment"].quantile(0.5),
        "agrad_median": hist["activation gradients"].quantile(0.5),
        "agrad_zero": zero["activation gradients"] * 100,
        "v_zero": zero["Adam second moment"] * 100,
    }


def _zero_share(h: LogHistogram) -> float:
    finite = h.total - h.nonfinite
    return h.zeros / finite if finite else math.nan


def recorded_magnitude_note(live: TrainingMagnitudes, recorded: tuple[str, TrainingMagnitudes] | None, *,
                            size: str = "at full size") -> Prose:
    """What the GPU record (``recorded``: ``(label, magnitudes)``, as :func:`recorded_magnitudes_beside` gives,
    or None) found for the activation gradients against this page's run: its median, the shares below FP16's
    smallest subnormal, rounded to zero and exactly zero; and how much of the gap between the medians the
    tokens per batch explain (the loss is a mean over them, so every activation gradient carries a factor of
    one over their number). ``size``: the size the record ran at, after its steps (``"at full size"``, or for an
    older record :func:`course_lib.results.record_size_text`'s words). Empty without a record."""
    if recorded is None:
        return Prose("")
    label, rec = recorded
    if not isinstance(live, TrainingMagnitudes) or not isinstance(rec, TrainingMagnitudes):
        raise TypeError("live and the recorded run must be TrainingMagnitudes")
    f = magnitude_facts(rec)
    here, there = live.batch_size * live.config.context, rec.batch_size * rec.config.context
    token_ratio = there / here
    here_median = live.histograms["activation gradients"].quantile(0.5)
    median_ratio = here_median / rec.histograms["activation gradients"].quantile(0.5)
    text = (f"The GPU rows of the figure ({label}, after {rec.steps} steps {size}) sit further down: "
            f"the median of the non-zero activation gradients is {f['agrad_median']:.2g} (as this page's, "
            "log-interpolated within a histogram's bins of one power of two, so two digits); "
            f"{f['agrad_below_fp16']:.1f}% of the "
            f"activation gradients are non-zero values below FP16's smallest subnormal "
            f"({f['agrad_flushed_fp16']:.1f}% below half of it, so that they round to zero in FP16), and another "
            f"{f['agrad_zero']:.1f}% are exactly zero already. The loss is a mean over a batch's tokens, so "
            f"every activation gradient carries a factor of one over their number: {there:,} tokens per batch "
            f"there against {here:,} here, a factor of {token_ratio:.3g}, while the medians ({here_median:.2g} "
            f"here) differ by a factor of {_two_digits(median_ratio)}")
    if median_ratio > 1.5 * token_ratio:
        text += ("; the other differences between the runs (the model's size, the steps trained) presumably "
                 "account for the rest, which this page does not measure.")
    elif median_ratio * 1.5 >= token_ratio:
        text += ": the token count accounts for about all of it."
    else:
        text += ": less than the token count alone predicts; the other differences between the runs pull the "
        text += "other way."
    return Prose(text)


def _two_digits(x: float) -> str:
    """A positive ratio to two significant digits, written out: 2048 as 2,000, 197 as 200, 1.53 as 1.5."""
    return f"{float(f'{x:.2g}'):,.0f}" if x >= 10 else f"{x:.2g}"


# ---- precision -------------------------------------------------------------------------------------------

def lost_update_facts(base: float, sums: Mapping[float, float], one_plus_half_eps: float) -> dict[str, object]:
    """Glue for the lesson's BF16 sums: ``sums`` maps each update added to ``base`` to the BF16 result, and
    must hold one update below half the gap between BF16 values at ``base``, one exactly half (a tie, which
    rounds to the even neighbour) and one above (``bf16_update_below`` / ``_tie`` / ``_above`` and each sum,
    ``bf16_sum_below`` ...); ``one_plus_half_eps`` is the BF16 sum ``1 + eps/2``, the same tie at 1."""
    for name, value in (("base", base), ("one_plus_half_eps", one_plus_half_eps), *(
            (f"sums[{u!r}]", v) for u, v in sums.items())):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    half_gap = float(spacing(base, "BF16")) / 2
    kinds = {"below": [u for u in sums if abs(u) < half_gap], "tie": [u for u in sums if abs(u) == half_gap],
             "above": [u for u in sums if abs(u) > half_gap]}
    if any(len(updates) != 1 for updates in kinds.values()):
        raise ValueError(f"sums must hold one update below, one at and one above half the BF16 gap at {base:g} "
                         f"({half_gap:g}), got {sorted(sums)}")
    out: dict[str, object] = {"bf16_base": base, "bf16_gap": 2 * half_gap, "bf16_1_plus_half_eps": one_plus_half_eps,
                              "bf16_half_eps": get_format("BF16").epsilon / 2}
    for kind, (update,) in kinds.items():
        out[f"bf16_update_{kind}"], out[f"bf16_sum_{kind}"] = update, sums[update]
    return out


# ---- errata and exercises ------------------------------------------------------------------------------

def formats_errata(ieee_e4m3: FloatFormat, finfo_tiny: float, smallest_fp16: float) -> list[tuple[str, str]]:
    """The errata rows (claim, measured): FP16's range, BF16's against FP32's, the largest E4M3 value
    against ``ieee_e4m3`` (E4M3 with IEEE specials), and ``torch.finfo(torch.float16).tiny`` (``finfo_tiny``)
    against the smallest positive FP16 value decoded from its bits (``smallest_fp16``)."""
    if not isinstance(ieee_e4m3, FloatFormat):
        raise TypeError(f"ieee_e4m3 must be a FloatFormat, got {type(ieee_e4m3).__name__}")
    if not (finfo_tiny > 0 and smallest_fp16 > 0):
        raise ValueError(f"finfo_tiny and smallest_fp16 are positive, got {finfo_tiny!r} and {smallest_fp16!r}")
    fp32, bf16, fp16, e4m3 = (get_format(n) for n in ("FP32", "BF16", "FP16", "FP8 E4M3"))
    return [
        ("FP16 covers roughly 1e-8 to 1e4.",
         f"Wrong at both ends. The top is {fp16.max_finite:,.0f}, above 1e4; at the bottom, the smallest "
         f"subnormal is {fp16.min_subnormal:.3e}, above 1e-8, and torch casts 1e-8 to FP16 as "
         f"{torch.tensor(1e-8).half().item():g}. Below the smallest normal, {fp16.min_normal:.3e}, values keep "
         "fewer significant bits the smaller they get."),
        ("BF16 has the same range as FP32.",
         f"Same smallest normal ({bf16.min_normal:.3e}) and nearly the same largest value "
         f"({bf16.max_finite:.4e} against {fp32.max_finite:.4e}), but its subnormals stop at "
         f"{bf16.min_subnormal:.2e}, not {fp32.min_subnormal:.2e}."),
        ("The largest FP8 E4M3 value is 240.",
         f"That is the IEEE-style E4M3 ({ieee_e4m3.max_finite:g}). The E4M3 format used for training "
         f"(OCP, NVIDIA, torch.float8_e4m3fn) gives up infinity and reaches {e4m3.max_finite:g}."),
        ("torch.finfo(torch.float16).tiny is the smallest positive FP16 number.",
         f"It is the smallest *normal* number, {finfo_tiny:.3e}; the smallest positive FP16 number is the "
         f"subnormal {smallest_fp16:.3e}, {finfo_tiny / smallest_fp16:.0f} times smaller. torch.finfo has no "
         "attribute for it."),
    ]


def overflow_rule_phrase(cast_of_overflow: float) -> Prose:
    """What a cast of an overflowing value gave, as a phrase: ``NaN``, or ``saturate to`` the value."""
    if isinstance(cast_of_overflow, bool) or not isinstance(cast_of_overflow, (int, float)):
        raise TypeError(f"cast_of_overflow must be a number, got {type(cast_of_overflow).__name__}")
    return Prose("NaN" if math.isnan(cast_of_overflow) else f"saturate to {cast_of_overflow:g}")


def exercise_facts(ieee_e4m3: FloatFormat, e4m3_cast_of_overflow: float, *, checked: FloatFormat
                   ) -> dict[str, object]:
    """The exercises' answers: FP16 values in [1, 2), E5M2's top exponent and significand, the checked
    exercise's format's (``checked``, one no table shows) bias, smallest normal exponent, mantissa bits and
    smallest subnormal, the IEEE-style E4M3's maximum, and the installed torch's E4M3 overflow rule from
    ``e4m3_cast_of_overflow`` (a cast of 1e4 to ``torch.float8_e4m3fn``)."""
    for name, value in (("ieee_e4m3", ieee_e4m3), ("checked", checked)):
        if not isinstance(value, FloatFormat):
            raise TypeError(f"{name} must be a FloatFormat, got {type(value).__name__}")
    e5m2 = get_format("FP8 E5M2")
    fp16_values = all_values("FP16")
    return {
        "fp16_count_1_2": int(((fp16_values >= 1) & (fp16_values < 2)).sum()),
        "e5m2_top_exp": e5m2.max_exponent,
        "e5m2_mantissa": 2 - 2.0 ** -e5m2.mantissa_bits,
        "checked_bias": checked.bias,
        "checked_min_exp": checked.min_exponent,
        "checked_m": checked.mantissa_bits,
        "checked_min_sub": checked.min_subnormal,
        "e4m3_ieee_max": ieee_e4m3.max_finite,
        "torch_e4m3_overflow": overflow_rule_phrase(e4m3_cast_of_overflow),
    }
