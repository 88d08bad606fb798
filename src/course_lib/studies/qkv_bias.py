"""Lesson 9's check of which third of the fused query-key-value bias FP16 would flush: the monitor flags the
whole ``attn.qkv.bias`` gradient, and the key third's gradient is zero in exact arithmetic (a key bias adds
the same amount to all of one query's scores, which the softmax ignores), so what FP32 computes there is
rounding noise. :func:`qkv_bias_thirds` measures the three thirds apart; :func:`qkv_thirds_sentence` says it."""

from __future__ import annotations

import torch

from ..device import SizeProfile
from ..glue import Prose
from ..models import course_setup
from ..monitor.health import gradient_stats_many

THIRDS = ("query", "key", "value")


def qkv_bias_thirds(profile: SizeProfile, device: torch.device | str = "cpu", *,
                    seed: int = 0) -> dict[str, dict[str, float]]:
    """One FP32 forward and backward pass of the course model at its initial weights (``seed``, its first
    batch). Per block, keyed by the parameter's name: for each third of ``attn.qkv.bias``'s gradient (query,
    key, value), the share of its values that are not zero but become zero when cast to FP16, the monitor's
    "would flush" (percent, of all the third's values), computed by the monitor's own
    :func:`~course_lib.monitor.health.gradient_stats_many`."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    setup = course_setup(profile, device, steps=1, default_steps=(1, 1), seed=seed)
    model = setup.model(seed)
    x, y = setup.sampler.batch(0, setup.device)
    model(x, y)[1].backward()
    biases = [(name, p.grad.detach()) for name, p in model.named_parameters()
              if name.endswith("attn.qkv.bias") and p.grad is not None]
    if not biases:
        raise ValueError("the course model has no attn.qkv.bias with a gradient")
    stats = gradient_stats_many([(f"{name} {part}", third) for name, grad in biases
                                 for part, third in zip(THIRDS, grad.chunk(3))], "FP16")
    return {name: {part: 100 * stats[3 * i + j].flush for j, part in enumerate(THIRDS)}
            for i, (name, _) in enumerate(biases)}


def qkv_thirds_sentence(shares: dict[str, dict[str, float]]) -> Prose:
    """Per block, the share FP16 would flush of each third, and whether the key third holds most of what
    flushes in every block (more than the query and value thirds together)."""
    if not shares or any(set(s) != set(THIRDS) for s in shares.values()):
        raise ValueError(f"shares must map each bias to its {', '.join(THIRDS)} shares, got {shares!r}")
    per = "; ".join(f"query {s['query']:.1f}%, key {s['key']:.1f}% and value {s['value']:.1f}% in `{name}`"
                    for name, s in shares.items())
    mostly = all(s["key"] > s["query"] + s["value"] for s in shares.values())
    where = "each" if len(shares) > 1 else "it"
    verdict = (f"what flushes in {where} is mostly the key third" if mostly else
               f"the key third does not hold most of what flushes in {'every one' if len(shares) > 1 else 'it'} here")
    return Prose(f"Split into its thirds at the initial weights (one FP32 forward and backward pass of the same "
                 f"course model, measured apart from the run above), the share FP16 would flush is {per}: {verdict}")
