"""Lesson 2's studies: gradients captured over FP32 training, naive FP16 against FP32, and a BF16 model
run in FP16; and the facts, phrases, tables and errata the lesson's prose glues from them."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..data import BatchSampler, load_corpus
from ..device import SizeProfile
from ..formats import get_format, round_to_format, spacing
from ..glue import Prose, and_list, bold
from ..gradients import (UNDERFLOW_FORMATS, GradientCapture, UnderflowSummary, capture_gradients, summarize_underflow,
                         summary_markdown, underflow_table)
from ..models import build_gpt, course_setup, gpt_config_for
from ..overflow import MatmulOverflow, SoftmaxOverflow
from ..results import RecordedResult, describe_records
from ..tables import MarkdownTable, markdown_table

@dataclass(frozen=True)
class CapturedTraining:
    """FP32 training of the course model with gradient captures at chosen steps."""

    losses: tuple[float, ...]
    captures: dict[int, GradientCapture]


def train_and_capture(profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                      capture_at: tuple[int, ...] | None = None, seed: int = 0, lr: float = 3e-3) -> CapturedTraining:
    """Train the course GPT in FP32 with AdamW; capture every layer's gradients at ``capture_at`` steps
    (default: the first and the last)."""
    setup = course_setup(profile, device, steps=steps, default_steps=(150, 400), seed=seed)
    steps, device, sampler = setup.steps, setup.device, setup.sampler
    if steps < 1:
        raise ValueError(f"steps must be a positive int, got {steps!r}")
    capture_at = (0, steps - 1) if capture_at is None else tuple(capture_at)
    if any(not 0 <= s < steps for s in capture_at):
        raise ValueError(f"capture steps must lie in 0..{steps - 1}, got {capture_at}")
    model = setup.model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses, captures = [], {}
    for step in range(steps):
        x, y = sampler.batch(step, device)
        if step in capture_at:
            cap = capture_gradients(model, lambda m: m(x, y)[1])
            captures[step] = cap
            losses.append(cap.loss)
        else:
            opt.zero_grad(set_to_none=True)
            _, loss = model(x, y)
            loss.backward()
            losses.append(float(loss.detach()))
        opt.step()
    return CapturedTraining(tuple(losses), captures)


@dataclass(frozen=True)
class NaiveFP16Comparison:
    """The same training runs in FP32 and with the model cast to FP16 (``.half()``, no loss scaling), over
    seeds (``curves[run][i]`` for ``seeds[i]``, one value per step).

    ``zero_grad_fraction``: per step, the share of parameter-gradient entries that are exactly zero.
    ``unchanged_fraction``: per step, the share of entries whose gradient was not zero but whose stored
    weight came out of the optimizer step unchanged (the update rounded away: lesson 5's stagnation).
    ``moment_underflow``: per step, the share of entries whose Adam second moment (``exp_avg_sq``, the
    squared gradient's running mean, stored in the parameter's dtype) is zero while the first moment is
    not: the squared gradient underflowed, and the update's denominator fell to ``eps``.
    ``update_size``: per step, the mean ``|change of a weight|`` divided by the learning rate.
    """

    steps: int
    seeds: tuple[int, ...]
    adam_eps: float
    curves: dict[str, tuple[tuple[float, ...], ...]]
    zero_grad_fraction: dict[str, tuple[tuple[float, ...], ...]]
    unchanged_fraction: dict[str, tuple[tuple[float, ...], ...]]
    moment_underflow: dict[str, tuple[tuple[float, ...], ...]]
    update_size: dict[str, tuple[tuple[float, ...], ...]]

    @property
    def recipes(self) -> tuple[str, ...]:
        return tuple(self.curves)

    def final(self, run: str, tail: int = 5) -> tuple[float, ...]:
        """Per seed, the mean loss over the last ``tail`` steps."""
        return tuple(sum(c[-tail:]) / len(c[-tail:]) for c in self.curves[run])

    def mean_over_steps(self, attribute: str, run: str, first: int | None = None) -> tuple[float, ...]:
        """Per seed, the mean of a per-step attribute (see the class) over all steps, or the ``first`` ones."""
        names = ("zero_grad_fraction", "unchanged_fraction", "moment_underflow", "update_size")
        if attribute not in names:
            raise ValueError(f"attribute must be one of {names}, got {attribute!r}")
        return tuple(sum(c[:first]) / len(c[:first]) for c in getattr(self, attribute)[run])


NAIVE_RUNS = (("FP32", torch.float32), ("FP16 (.half(), no scaling)", torch.float16))


def compare_naive_fp16(profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                       seeds=(0, 1, 2), lr: float = 3e-3, adam_eps: float = 1e-4) -> NaiveFP16Comparison:
    """Train the course GPT in FP32 and cast to FP16 with no scaler, from the same initialisation and on the
    same batches for each seed.

    Adam's ``eps`` is set to a value FP16 can hold (the default 1e-8 rounds to zero in FP16, a second,
    separate failure) so that the comparison isolates what FP16's range and precision do.
    """
    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints, got {seeds!r}")
    curves: dict[str, list] = {label: [] for label, _ in NAIVE_RUNS}
    zeros: dict[str, list] = {label: [] for label, _ in NAIVE_RUNS}
    unchanged: dict[str, list] = {label: [] for label, _ in NAIVE_RUNS}
    moments: dict[str, list] = {label: [] for label, _ in NAIVE_RUNS}
    sizes: dict[str, list] = {label: [] for label, _ in NAIVE_RUNS}
    n_steps = 0
    for seed in seeds:
        setup = course_setup(profile, device, steps=steps, default_steps=(40, 250), seed=seed)
        n_steps, dev, sampler = setup.steps, setup.device, setup.sampler
        for label, dtype in NAIVE_RUNS:
            model = setup.model(seed).to(dtype)
            params = [p for p in model.parameters() if p.requires_grad]
            opt = torch.optim.AdamW(params, lr=lr, eps=adam_eps, weight_decay=0.0)
            run_losses, run_zeros, run_unchanged, run_moments, run_sizes = [], [], [], [], []
            for step in range(n_steps):
                x, y = sampler.batch(step, dev)
                opt.zero_grad(set_to_none=True)
                _, loss = model(x, y)
                loss.backward()
                with_grad = [p for p in params if p.grad is not None]
                grads = [p.grad for p in with_grad if p.grad is not None]
                before = [p.detach().clone() for p in with_grad]
                n = sum(p.numel() for p in with_grad)
                run_zeros.append(sum(int((g == 0).sum()) for g in grads) / n)
                run_losses.append(float(loss.detach().float()))
                opt.step()
                run_unchanged.append(sum(int(((g != 0) & (p.detach() == b)).sum())
                                         for p, g, b in zip(with_grad, grads, before)) / n)
                run_moments.append(sum(int(((opt.state[p]["exp_avg_sq"] == 0) & (opt.state[p]["exp_avg"] != 0)).sum())
                                       for p in with_grad) / n)
                run_sizes.append(sum(float((p.detach().float() - b.float()).abs().sum())
                                     for p, b in zip(with_grad, before)) / n / lr)
            for store, values in ((curves, run_losses), (zeros, run_zeros), (unchanged, run_unchanged),
                                  (moments, run_moments), (sizes, run_sizes)):
                store[label].append(tuple(values))
    freeze = lambda d: {k: tuple(v) for k, v in d.items()}  # noqa: E731
    return NaiveFP16Comparison(n_steps, seeds, adam_eps, freeze(curves), freeze(zeros), freeze(unchanged),
                               freeze(moments), freeze(sizes))


@dataclass(frozen=True)
class LayerUnderflow:
    """One layer's :class:`~course_lib.gradients.UnderflowSummary` in one format."""

    layer: str
    summary: UnderflowSummary


@dataclass(frozen=True)
class StepUnderflow:
    """At one captured step: ``overall[kind][format]`` over all gradients of a kind (``"activation"``,
    ``"weight"``), and per layer for the activation gradients."""

    overall: dict[str, dict[str, UnderflowSummary]]
    per_layer_activation: tuple[LayerUnderflow, ...]


@dataclass(frozen=True)
class UnderflowStatistics:
    """The registered ``underflow_statistics``: the losses of the FP32 run and, per captured step, what each
    format would do to its gradients (a record keeps these, not the gradients)."""

    losses: tuple[float, ...]
    steps: dict[int, StepUnderflow]

    def summary_rows(self, kind: str = "activation") -> list[tuple[int, UnderflowSummary]]:
        """``(step, summary)`` per step and format, as :func:`~course_lib.gradients.summary_rows` gives for a
        live capture, for :func:`~course_lib.gradients.summary_markdown`."""
        if kind not in ("activation", "weight"):
            raise ValueError(f"kind must be 'activation' or 'weight', got {kind!r}")
        return [(step, s) for step, data in sorted(self.steps.items()) for s in data.overall[kind].values()]


def underflow_statistics(run: CapturedTraining) -> UnderflowStatistics:
    """Every format's :func:`~course_lib.gradients.summarize_underflow` of a run's captured gradients."""
    steps = {}
    for step, cap in sorted(run.captures.items()):
        overall = {kind: {f: summarize_underflow(cap.all_values(kind), f) for f in UNDERFLOW_FORMATS}
                   for kind in ("activation", "weight")}
        steps[step] = StepUnderflow(overall, tuple(LayerUnderflow(name, s) for name, s in underflow_table(cap)))
    return UnderflowStatistics(tuple(run.losses), steps)


@dataclass(frozen=True)
class ActivationOverflow:
    """A BF16 model with one large activation channel, run in BF16 and in FP16."""
    largest_activation_bf16: float
    loss_bf16: float
    loss_fp16: float
    nonfinite_fp16_outputs: int
    fp16_max: float
    fp16_outputs: int      # the output logits counted, finite or not


def bf16_model_in_fp16(channel_gain: float = 2.0**21, device: torch.device | str = "cpu", seed: int = 0) -> ActivationOverflow:
    """The course GPT (small shape) in BF16 with one residual channel amplified by ``channel_gain``,
    a stand-in for the very large activations some BF16-pretrained models develop, then run in FP16.

    The amplification is planted (and said so): a BF16 model never sees FP16's limit, so nothing in its
    training keeps activations below 65504."""
    device = torch.device(device)
    cfg = gpt_config_for(SizeProfile("small"))
    model = build_gpt(cfg, seed=seed, device=device)
    with torch.no_grad():
        model.blocks[0].out.weight[0].mul_(channel_gain)  # type: ignore[union-attr,index]  # one MLP output channel
    x, y = BatchSampler(load_corpus(100_000), 4, cfg.context, seed=seed).batch(0, device)
    largest = [0.0]
    hook = model.blocks[0].register_forward_hook(
        lambda _m, _i, out: largest.__setitem__(0, max(largest[0], float(out.detach().abs().float().max()))))
    try:
        with torch.no_grad():
            _, loss_bf16 = model.to(torch.bfloat16)(x, y)
            largest_bf16 = largest[0]
            logits16, loss_fp16 = model.to(torch.float16)(x, y)
    finally:
        hook.remove()
    return ActivationOverflow(largest_bf16, float(loss_bf16.float()), float(loss_fp16.float()),
                              int((~torch.isfinite(logits16)).sum()), get_format("FP16").max_finite, logits16.numel())


# ---- facts and phrases for the lesson's prose -----------------------------------------------------------

def capture_facts(run: CapturedTraining) -> dict[str, object]:
    """Percent of all activation gradients that FP16 flushes to zero at the first and last captured steps
    (``flush_first``, ``flush_last``); at the last step, the percent FP16 flushes, makes subnormal and keeps
    normal (``late_flushed``, ``late_subnormal``, ``late_normal``) and the percent BF16, FP8 E4M3 and FP8
    E5M2 flush (``late_*_flushed``); the steps trained (``n_steps``) and the last captured step."""
    if not run.captures:
        raise ValueError("the run captured no step")
    first, last = min(run.captures), max(run.captures)
    early = run.captures[first].all_values("activation")
    late = run.captures[last].all_values("activation")
    late_fp16 = summarize_underflow(late, "FP16")
    return {
        "flush_first": summarize_underflow(early, "FP16").flushed * 100,
        "flush_last": late_fp16.flushed * 100,
        "n_steps": len(run.losses),
        "last_step": last,
        "late_flushed": late_fp16.flushed * 100,
        "late_subnormal": late_fp16.subnormal * 100,
        "late_normal": late_fp16.normal * 100,
        "late_e4m3_flushed": summarize_underflow(late, "FP8 E4M3").flushed * 100,
        "late_bf16_flushed": summarize_underflow(late, "BF16").flushed * 100,
        "late_e5m2_flushed": summarize_underflow(late, "FP8 E5M2").flushed * 100,
    }


def _layer_kind(name: str) -> str:
    """``blocks.3.attn.qkv`` -> ``attn.qkv``; a layer outside the blocks keeps its name."""
    parts = name.split(".")
    return ".".join(parts[2:]) if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit() else name


def exact_zero_text(stats: UnderflowStatistics, *, at_least: float = 0.01) -> str | None:
    """A paragraph on the last captured step's activation gradients that are exactly zero before any cast, by
    kind of layer, when they are at least ``at_least`` of all of them (None otherwise): which layers hold
    them, what in the model passes back an exact zero there, and which layers hold BF16's flushed values."""
    if not isinstance(stats, UnderflowStatistics):
        raise TypeError(f"stats must be UnderflowStatistics, got {type(stats).__name__}")
    if not 0 <= at_least <= 1:
        raise ValueError(f"at_least must be a share in [0, 1], got {at_least!r}")
    step = max(stats.steps)
    data = stats.steps[step]
    zero = data.overall["activation"]["FP16"].zero
    if zero < at_least or zero == 0:
        return None
    zeros: dict[str, list[float]] = {}
    bf16_flushed: set[str] = set()
    for row in data.per_layer_activation:
        kind = _layer_kind(row.layer)
        if row.summary.format == "FP16":
            zeros.setdefault(kind, []).append(row.summary.zero)
        elif row.summary.format == "BF16" and row.summary.flushed > 0:
            bf16_flushed.add(kind)
    holding = sorted(((k, v) for k, v in zeros.items() if max(v) > 0), key=lambda kv: -max(kv[1]))
    without = [f"`{k}`" for k in zeros if max(zeros[k]) == 0]
    where = and_list([f"the `{k}` layers ({value_span(v, '.0f')} of each such layer's activation gradients)"
                      for k, v in holding])
    causes = {"attn.qkv": "after `qkv`, the likely source is an attention softmax whose weights are exactly 0 or 1 "
                          "in FP32: it passes back an exact zero (its Jacobian vanishes)",
              "fc": "after `fc`, likely GELU, whose derivative is exactly zero in FP32 far below zero"}
    named = "; ".join(causes[k] for k, _ in holding if k in causes)
    text = (f"At step {step} of the recorded run, {zero * 100:.1f}% of the activation gradients are exactly zero "
            f"already in FP32, before any cast: they are in {where}")
    text += f", and {and_list(without)} hold none. " if without else ". "
    text += "No cast made them: the operation after the layer passed back zeros. "
    if named:
        text += named[0].upper() + named[1:] + ". "
    text += "The record keeps no attention weights or activations, so it cannot confirm these causes."
    bf16 = data.overall["activation"]["BF16"].flushed
    if bf16 > 0 and bf16_flushed:
        text += (f" BF16's {bf16 * 100:.2f}% flushed are in the same kinds of layer "
                 f"({and_list([f'`{k}`' for k in sorted(bf16_flushed)])}): values too small for BF16's smallest "
                 f"subnormal, {get_format('BF16').min_subnormal:.1e}, that FP32 holds only as subnormals.")
    return text


def recorded_underflow_texts(records: Sequence[RecordedResult]) -> tuple[str, ...]:
    """Markdown to show under the live table: the first recorded ``underflow_statistics`` run's table at full
    size, when there is a record, then the records' provenance."""
    texts = []
    if records:
        if not isinstance(records[0].result, UnderflowStatistics):
            raise TypeError(f"expected recorded UnderflowStatistics, got {type(records[0].result).__name__}")
        table = summary_markdown(records[0].result.summary_rows())
        texts.append(f"The same experiment recorded at full size on **{records[0].label}**:\n\n{table}")
        zeros = exact_zero_text(records[0].result)
        if zeros is not None:
            texts.append(zeros)
    texts.append("Recorded GPU runs (`python -m course_lib.record underflow_statistics`):\n\n"
                 + describe_records(records))
    return tuple(texts)


def value_span(values: Sequence[float], fmt: str, unit: str = "%", times: float = 100) -> Prose:
    """``lo-hi`` of ``values`` times ``times``, each formatted with ``fmt``, then ``unit``; a single value
    when both ends print the same (``"9.1%"``, ``"12.0-23.2%"``)."""
    if not values:
        raise ValueError("value_span needs at least one value")
    lo, hi = (format(times * v, fmt) for v in (min(values), max(values)))
    return Prose(f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}")


def _check_window(naive: NaiveFP16Comparison, tail: int, early: int) -> None:
    for name, value in (("tail", tail), ("early", early)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= naive.steps:
            raise ValueError(f"{name} must be an int of steps in 1..{naive.steps}, got {value!r}")


def naive_table(naive: NaiveFP16Comparison, *, tail: int, early: int) -> MarkdownTable:
    """One row per seed: the final loss (mean of the last ``tail`` steps) in FP16 minus FP32; the means over
    steps of the zero gradients and the updates rounded away (FP32 / FP16), in percent; and over the first
    ``early`` steps, the underflowed second moments (FP16, percent) and the mean step over the learning rate."""
    _check_window(naive, tail, early)
    fp32, fp16 = naive.recipes
    diffs = [b - a for a, b in zip(naive.final(fp32, tail), naive.final(fp16, tail))]
    zero32, zero16 = (naive.mean_over_steps("zero_grad_fraction", k) for k in (fp32, fp16))
    lost32, lost16 = (naive.mean_over_steps("unchanged_fraction", k) for k in (fp32, fp16))
    v16 = naive.mean_over_steps("moment_underflow", fp16, first=early)   # the window whose steps it explains
    step32, step16 = (naive.mean_over_steps("update_size", k, first=early) for k in (fp32, fp16))
    return markdown_table(
        ["seed", "final loss, FP16 minus FP32", "zero gradients (FP32 / FP16)", "updates rounded away (FP32 / FP16)",
         f"Adam entries with v = 0 but m ≠ 0, first {early} steps (FP16)",
         f"mean weight change / lr, first {early} steps (FP32 / FP16)"],
        [(s, f"{d:+.3f}", f"{100 * z32:.1f}% / {100 * z16:.1f}%", f"{100 * u32:.3f}% / {100 * u16:.2f}%",
          f"{100 * v:.0f}%", f"{a:.2f} / {b:.2f}")
         for s, d, z32, z16, u32, u16, v, a, b in zip(naive.seeds, diffs, zero32, zero16, lost32, lost16, v16,
                                                     step32, step16)])


def _sign_test(k: int, n: int) -> float:
    """Two-sided sign test: the chance that ``n`` fair coin flips split at least as unevenly as ``k`` of ``n``."""
    extreme = max(k, n - k)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(extreme, n + 1)) / 2**n)


def naive_facts(naive: NaiveFP16Comparison, *, tail: int, early: int) -> dict[str, object]:
    """What the naive FP16 comparison measured, under the names the prose glues: the steps, ``tail`` and
    ``early`` windows and seeds; in how many seeds FP16 ended higher (``naive_worse``), how likely so even a
    split is by chance (``naive_sign_chance``, a two-sided sign test) and by how much (``naive_diff_range``); the spans over seeds of the zero gradients, updates rounded away, underflowed
    second moments and early step sizes (``*_range``); how many of the ``early`` steps after the first
    update had FP16's loss below FP32's (``naive_lead``; step 0 is left out, the same weights in both runs),
    the largest first-step gap (``naive_start_gap``) and how many steps of the whole run after the first
    update had FP16 below (``naive_below``); and the Adam ``eps`` both ran with."""
    _check_window(naive, tail, early)
    fp32, fp16 = naive.recipes
    seeds = range(len(naive.seeds))
    diffs = [b - a for a, b in zip(naive.final(fp32, tail), naive.final(fp16, tail))]
    worse = sum(d > 0 for d in diffs)
    lost32 = naive.mean_over_steps("unchanged_fraction", fp32)
    # from step 1: step 0's loss is the same weights in both runs, apart only by FP16's arithmetic
    lead_steps = naive.curves[fp32][0][1:early + 1]
    lead = [sum(b < a for a, b in zip(naive.curves[fp32][i][1:early + 1], naive.curves[fp16][i][1:early + 1]))
            for i in seeds]
    below = [sum(b < a for a, b in zip(naive.curves[fp32][i][1:], naive.curves[fp16][i][1:])) for i in seeds]
    start_gap = max(abs(naive.curves[fp16][i][0] - naive.curves[fp32][i][0]) for i in seeds)
    return {
        "naive_steps": naive.steps,
        "naive_tail": tail,
        "naive_seeds": len(naive.seeds),
        "naive_early": early,
        "naive_eps": naive.adam_eps,
        "naive_worse": Prose(f"in {'every one' if worse == len(diffs) else worse} of the {len(diffs)} seeds"),
        # a two-sided sign test: how often a coin would give a split at least this lopsided
        "naive_sign_chance": _sign_test(worse, len(diffs)),
        "naive_diff_range": Prose(f"{min(diffs):+.3f} to {max(diffs):+.3f}"),
        "zero32_range": value_span(naive.mean_over_steps("zero_grad_fraction", fp32), ".1f"),
        "zero16_range": value_span(naive.mean_over_steps("zero_grad_fraction", fp16), ".1f"),
        "lost16_range": value_span(naive.mean_over_steps("unchanged_fraction", fp16), ".2f"),
        # below 1e-5 the three-decimal percentages would all print 0.000%
        "lost32_range": Prose("under 0.001%") if max(lost32) < 1e-5 else value_span(lost32, ".3f"),
        "v16_range": value_span(naive.mean_over_steps("moment_underflow", fp16, first=early), ".0f"),
        "step32_range": value_span(naive.mean_over_steps("update_size", fp32, first=early), ".2f", "", 1),
        "step16_range": value_span(naive.mean_over_steps("update_size", fp16, first=early), ".2f", "", 1),
        "naive_lead": Prose(f"FP16's loss was below FP32's at {value_span(lead, 'd', '', 1)} of the {len(lead_steps)} "
                            f"steps after the first update (steps 1 to {len(lead_steps)}) of each seed"),
        "naive_start_gap": Prose(f"{start_gap:.3f}"),
        "naive_below": Prose(f"and after the first update FP16's loss was below FP32's at {value_span(below, 'd', '', 1)} of "
                             f"the {naive.steps - 1} steps of a seed" if max(below) else
                             "and after the first update FP16's loss was never below FP32's"),
    }


def installed_adam_defaults() -> tuple[float, float]:
    """The installed torch's AdamW defaults ``(eps, beta2)``, read from an optimizer built with them."""
    defaults = torch.optim.AdamW([torch.zeros(1, requires_grad=True)]).defaults
    return defaults["eps"], defaults["betas"][1]


def adam_underflow_facts(default_eps: float, beta2: float) -> dict[str, object]:
    """Adam's default ``eps`` (``adam_default_eps``) and what FP16 stores for it (``eps_in_fp16``);
    ``1 - beta2`` (``adam_one_minus_beta2``), and the ``|g|`` below which ``(1 - beta2) g**2``, the squared
    gradient's share of the second moment, is below half FP16's smallest subnormal and rounds to zero
    (``v_underflow_g``, and its log2)."""
    if not default_eps > 0:
        raise ValueError(f"default_eps must be positive, got {default_eps!r}")
    if not 0 <= beta2 < 1:
        raise ValueError(f"beta2 must lie in [0, 1), got {beta2!r}")
    g_min = math.sqrt(get_format("FP16").min_subnormal / 2 / (1 - beta2))
    return {
        "adam_default_eps": default_eps,
        "eps_in_fp16": float(round_to_format(torch.tensor([default_eps]), "FP16")[0]),
        "adam_one_minus_beta2": round(1 - beta2, 12),
        "v_underflow_g": g_min,
        "v_underflow_log2": math.log2(g_min),
    }


def softmax_facts(sm: SoftmaxOverflow) -> dict[str, object]:
    """FP16's largest value, the largest input whose ``exp`` FP16 holds, the logits (Markdown), the
    cross-entropy from ``F.cross_entropy`` on the FP16 logits (``ce_fp16``), exactly from the FP64 softmax
    (``ce_fp64``) and that rounded to FP16 (``ce_exact_fp16``), whether the kernel rounded inside, and the
    target's logit (``sm_target``)."""
    exact_fp16 = float(torch.tensor(sm.reference_cross_entropy_fp64, dtype=torch.float16))
    off = abs(sm.torch_cross_entropy_fp16 / sm.reference_cross_entropy_fp64 - 1)
    rounding = ("the exact value rounded to FP16: only the result was rounded" if sm.torch_cross_entropy_fp16
                == exact_fp16 else f"{bold(f'{100 * off:.2g}%')} off. Rounding only the final result to FP16 "
                f"would give {bold(f'{exact_fp16:.4g}')}, so the kernel must round intermediate values to FP16 too")
    return {"fp16_max": get_format("FP16").max_finite, "exp_limit": sm.largest_safe_exp_input,
            "sm_logits": Prose(", ".join(f"{v:g}" for v in sm.logits)), "sm_target": f"{sm.logits[sm.target or 0]:g}",
            "ce_fp16": sm.torch_cross_entropy_fp16, "ce_fp64": sm.reference_cross_entropy_fp64,
            "ce_exact_fp16": exact_fp16, "ce_rounding": Prose(rounding)}


def overflow_edge_facts(values: Sequence[float], stored: Sequence[float]) -> dict[str, object]:
    """Where FP16 overflows, from two values and what a cast to FP16 stored for them (``stored``): the first
    must round down to FP16's largest finite value and the second, half a spacing past it, to inf. Glued as
    ``of_max``, ``of_below`` and ``of_below_stored`` (the first and what it became) and ``of_from``."""
    fp16 = get_format("FP16")
    if len(values) != 2 or len(stored) != 2:
        raise ValueError(f"values and stored must hold two numbers each, got {values!r} and {stored!r}")
    overflow_from = fp16.max_finite + float(spacing(fp16.max_finite, fp16)) / 2
    if not (values[1] == overflow_from and values[0] < overflow_from and stored[0] == fp16.max_finite
            and math.isinf(stored[1])):
        raise ValueError(f"expected a value that rounds to {fp16.max_finite:g} and {overflow_from:g}, which "
                         f"rounds to inf; got {values!r} stored as {stored!r}")
    return {"of_max": fp16.max_finite, "of_below": values[0], "of_below_stored": stored[0], "of_from": values[1]}


def recorded_bf16_flush_phrase(records: Sequence[RecordedResult]) -> Prose:
    """What BF16 flushes of the last captured step's activation gradients in the first recorded
    ``underflow_statistics`` run, as a clause to follow this page's figure; empty without a record."""
    if not records:
        return Prose("")
    stats = records[0].result
    if not isinstance(stats, UnderflowStatistics):
        raise TypeError(f"expected recorded UnderflowStatistics, got {type(stats).__name__}")
    step = max(stats.steps)
    flushed = stats.steps[step].overall["activation"]["BF16"].flushed
    return Prose(f", against {flushed * 100:.2f}% at step {step} of the run recorded on {records[0].label}, "
                 "in the table above")


def softmax_table(sm: SoftmaxOverflow) -> MarkdownTable:
    """Each form of the softmax, one row per form and one column per logit, then the cross-entropies: naive,
    ``F.cross_entropy``'s FP16 result, and the exact ``-ln p`` from the FP64 softmax."""
    if not isinstance(sm, SoftmaxOverflow):
        raise TypeError(f"sm must be a SoftmaxOverflow, got {type(sm).__name__}")
    forms = (("exp(x), FP16", sm.exp_fp16), ("naive exp(x) / sum, FP16", sm.naive_fp16),
             ("exp(x - max) / sum, FP16", sm.max_subtracted_fp16), ("F.softmax, FP16", sm.torch_softmax_fp16),
             ("reference, FP64", sm.reference_fp64))
    rows = [(name, *(f"{v:.4g}" for v in values)) for name, values in forms]
    at = sm.target or 0    # one cross-entropy per target, in its logit's column (the first if unrecorded)
    rows += [(f"cross-entropy, target x = {sm.logits[at]:g}: {name}",
              *("" if i != at else f"{v:.4g}" for i in range(len(sm.logits))))
             for name, v in (("naive", sm.naive_cross_entropy_fp16), ("F.cross_entropy, FP16 result",
                             sm.torch_cross_entropy_fp16), ("reference: -ln p from FP64", sm.reference_cross_entropy_fp64))]
    return markdown_table(("computed as", *(f"x = {v:g}" for v in sm.logits)), rows)


def activation_overflow_table(act: ActivationOverflow) -> MarkdownTable:
    """The planted-activation model in BF16 and in FP16: its largest activation, loss and non-finite logits."""
    if not isinstance(act, ActivationOverflow):
        raise TypeError(f"act must be an ActivationOverflow, got {type(act).__name__}")
    fp16_largest = "inf" if act.largest_activation_bf16 > act.fp16_max else "(not measured)"
    return markdown_table(("quantity", "BF16", "FP16"), [
        ("largest activation", f"{act.largest_activation_bf16:,.0f}", f"{fp16_largest} (max {act.fp16_max:g})"),
        ("loss", f"{act.loss_bf16:.3f}", f"{act.loss_fp16:g}"),
        ("non-finite output logits", "(not counted)", f"{act.nonfinite_fp16_outputs:,}")])


def matmul_table(mm: MatmulOverflow) -> MarkdownTable:
    """The overflowing dot product's result in each precision it was computed in."""
    return markdown_table(("computed in", "result"), [(k, f"{v:g}") for k, v in mm.results.items()])


def matmul_facts(mm: MatmulOverflow) -> dict[str, object]:
    """The dot product's length, its terms' value and its exact result; the divisor of the inputs of the
    scaled FP16 row, its FP16 output and the factor put back afterwards (``mm_divisor``,
    ``mm_scaled_output``, ``mm_scale_back``)."""
    return {"mm_n": mm.n, "mm_value": mm.value, "mm_exact": mm.exact, "mm_divisor": mm.input_divisor,
            "mm_scaled_output": mm.scaled_fp16_output, "mm_scale_back": mm.input_divisor**2}


def activation_overflow_facts(act: ActivationOverflow) -> dict[str, object]:
    """The largest BF16 activation, the BF16 loss and the non-finite FP16 logits ("all 4,096", "7 of 4,096")."""
    n, total = act.nonfinite_fp16_outputs, act.fp16_outputs
    return {"act_bf16_max": act.largest_activation_bf16, "act_loss_bf16": act.loss_bf16,
            "act_nonfinite": Prose(f"all {n:,}" if n == total else f"{n:,} of {total:,}")}


def underflow_errata(*, stored_1e7: float, stored_1_2e7: float, stored_65536: float, overflow_from: float,
                     stored_layer_norm_eps: float, random_max: float, exp_max: float, exp_fp16_overflows: int,
                     exp_n: int, random_width: int, random_products: int) -> list[tuple[str, str]]:
    """The errata rows (claim, measured), from what FP16 stores for 1e-7, 1.2e-7, 65536 and 1e-5 (LayerNorm's
    eps), the smallest value that overflows FP16 (``overflow_from``), the largest ``|entry|`` of a random
    product of unit-variance inputs (``random_max``; ``random_width`` terms per dot product,
    ``random_products`` dot products), and ``exp`` of ``exp_n`` values of
    ``randn * 10``: its largest value in FP32 (``exp_max``) and how many overflow computed in FP16."""
    fp16, fp32 = get_format("FP16"), get_format("FP32")
    if not (math.isfinite(exp_max) and exp_max > 0) or not 0 <= exp_fp16_overflows <= exp_n:
        raise ValueError(f"exp_max must be a positive finite FP32 value and 0 <= exp_fp16_overflows <= exp_n, got "
                         f"{exp_max!r}, {exp_fp16_overflows!r} and {exp_n!r}")
    if not (stored_1e7 > 0 and stored_1_2e7 > 0 and stored_layer_norm_eps > 0):
        raise ValueError("FP16 stores 1e-7, 1.2e-7 and 1e-5 as positive numbers; got "
                         f"{stored_1e7!r}, {stored_1_2e7!r} and {stored_layer_norm_eps!r}")
    if not fp16.max_finite < overflow_from:
        raise ValueError(f"overflow_from must exceed FP16's largest value, got {overflow_from!r}")
    if min(random_width, random_products) < 1:
        raise ValueError(f"random_width and random_products must be >= 1, got {random_width!r}, {random_products!r}")
    return [
        ("1e-7 and 1.2e-7 become 0 in FP16.",
         f"Both become the subnormal {stored_1e7:.4g} (FP16's subnormals are {fp16.min_subnormal:.3g} apart, so "
         f"the two cannot be told apart: errors of {100 * abs(stored_1e7 - 1e-7) / 1e-7:.0f}% and "
         f"{100 * abs(stored_1_2e7 - 1.2e-7) / 1.2e-7:.1f}%). FP16 flushes to zero only at or below half its "
         f"smallest subnormal, {fp16.min_subnormal / 2:.3g} (half of it is a tie, which rounds to the even "
         "neighbour, zero): they lose precision, not their existence."),
        ("65536 fits in FP16 (it is close to the maximum).",
         f"FP16's largest value is {fp16.max_finite:,.0f}; 65536 rounds to {stored_65536}, "
         f"as does everything from {overflow_from:,.0f} (halfway between {fp16.max_finite:,.0f} and "
         f"{2 * 2 ** math.floor(math.log2(fp16.max_finite)):,.0f}, a tie that rounds up) on."),
        ("A 1024-wide matmul of unit values overflows FP16.",
         f"A {random_width}-term sum of ones is {random_width:,}. With random unit-variance inputs, sums grow like "
         f"the square root of the width: the largest of {random_products:,} such dot products here is "
         f"{random_max:.0f}, far below "
         f"{fp16.max_finite:,.0f}. Overflow needs large values (the planted activation of the BF16 "
         "model above, logits before an exponential) or long sums of them, not just width."),
        ("LayerNorm's eps (1e-5) underflows in FP16.",
         f"It is stored as {stored_layer_norm_eps:.5g}, a subnormal, not 0; and autocast runs `layer_norm` in "
         "FP32 on CUDA ({doc}`04_amp`)."),
        ("`torch.exp(torch.randn(1000) * 10)` can reach about 1e8 and overflows.",
         f"That tensor is FP32: the largest of its {exp_n:,} values here is {exp_max:.2g}, far above 1e8 and "
         f"far below FP32's largest value, {fp32.max_finite:.3g}, so nothing overflows. Computed in FP16 (largest "
         f"value {fp16.max_finite:,.0f}), {exp_fp16_overflows:,} of the {exp_n:,} overflow to inf."),
    ]


def exercise_facts(late: torch.Tensor, *, largest_sigmas: float) -> dict[str, object]:
    """The exercises' answers from the late activation gradients ``late``: percent of the non-zero ones FP16
    flushes as they are (``ex_flush_now``) and divided by 8 (``ex_flush_8x``, an 8 times larger batch);
    ``ex_sigmas``: ``largest_sigmas``, the standard deviations the largest of many random dot products
    measured, and ``ex_sqrt_k``, the width at which that many reach FP16's maximum; and FP8 E5M2's smallest
    subnormal, half of it, what it stores for 1e-5 and its error in percent (``ex_e5m2_*``); what FP16 stores
    for 1e-5, a subnormal there too, its error, and FP16's smallest normal (``ex_fp16_*``)."""
    if not (isinstance(largest_sigmas, (int, float)) and math.isfinite(largest_sigmas) and largest_sigmas > 0):
        raise ValueError(f"largest_sigmas must be a positive number, got {largest_sigmas!r}")
    if not isinstance(late, torch.Tensor) or not late.is_floating_point():
        raise TypeError("late must be a floating-point tensor of gradients")
    grads = late[late != 0].abs()
    if grads.numel() == 0:
        raise ValueError("late holds no non-zero gradient")
    fp16, e5m2 = get_format("FP16"), get_format("FP8 E5M2")
    stored, stored16 = (float(round_to_format(1e-5, f)) for f in (e5m2, fp16))
    # what the FP16 codec rounds to zero (ties included), as they are and divided by 8
    flushed = [100 * float((round_to_format(g, fp16) == 0).float().mean()) for g in (grads, grads / 8)]
    return {
        "ex_flush_now": flushed[0], "ex_flush_8x": flushed[1],
        "ex_sigmas": largest_sigmas, "ex_sqrt_k": (fp16.max_finite / largest_sigmas) ** 2,
        "ex_e5m2_tiny": e5m2.min_subnormal, "ex_e5m2_half_tiny": e5m2.min_subnormal / 2,
        "ex_e5m2_stored": stored, "ex_e5m2_err": 100 * abs(stored / 1e-5 - 1),
        "ex_fp16_stored": stored16, "ex_fp16_err": 100 * abs(stored16 / 1e-5 - 1), "ex_fp16_min_normal": fp16.min_normal}
