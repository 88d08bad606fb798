"""Lesson 2's studies: gradients captured over FP32 training, naive FP16 against FP32, and a BF16-trained model
run in FP16."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data import BatchSampler, load_corpus
from ..device import SizeProfile
from ..formats import get_format
from ..gradients import GradientCapture, UnderflowSummary, capture_gradients
from ..models import build_gpt, course_setup, gpt_config_for


@dataclass(frozen=True)
class CapturedTraining:
    """FP32 training of the course model with gradient captures at chosen steps."""

    losses: tuple[float, ...]
    captures: dict[int, GradientCapture]


def train_and_capture(profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                      capture_at: tuple[int, ...] | None = None, seed: int = 0, lr: float = 3e-3) -> CapturedTraining:
    """Train the course GPT in FP32 with AdamW; capture every layer's gradients at ``capture_at`` steps
    (default: the first and the last)."""
    setup = course_setup(profile, device, steps=steps, default_steps=(150, 3000), seed=seed)
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
        setup = course_setup(profile, device, steps=steps, default_steps=(40, 1000), seed=seed)
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


def summary_rows_from_record(values: dict, kind: str = "activation") -> list[tuple[int, UnderflowSummary]]:
    """The same rows from a recorded ``underflow_statistics`` experiment's ``values``."""
    try:
        rows = []
        for key, data in sorted(values["captures"].items(), key=lambda kv: int(kv[0].split("_")[1])):
            step = int(key.split("_")[1])
            for summary in data["overall"][kind].values():
                rows.append((step, UnderflowSummary(**summary)))
        return rows
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not an underflow_statistics record: {exc}") from None


@dataclass(frozen=True)
class ActivationOverflow:
    """A BF16 model with one large activation channel, run in BF16 and in FP16."""

    largest_activation_bf16: float
    loss_bf16: float
    loss_fp16: float
    nonfinite_fp16_outputs: int
    fp16_max: float


def bf16_model_in_fp16(channel_gain: float = 2.0**21, device: torch.device | str = "cpu", seed: int = 0) -> ActivationOverflow:
    """The course GPT (small shape) in BF16 with one residual channel amplified by ``channel_gain``,
    a stand-in for the very large activations some BF16-pretrained models develop, then run in FP16.

    The amplification is planted (and said so): a BF16 model never sees FP16's limit, so nothing in its
    training keeps activations below 65504.
    """
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
                              int((~torch.isfinite(logits16)).sum()), get_format("FP16").max_finite)
