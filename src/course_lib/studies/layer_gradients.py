"""Lesson 2's layer-by-layer view of activation gradients: how they shrink through a deep MLP against a
format's smallest values, and where the course GPT's residual stream keeps them up."""

from __future__ import annotations

from ..formats import get_format
from ..glue import Prose
from ..gradients import GradientCapture, summarize_underflow


def layer_facts(capture: GradientCapture, fmt: str = "FP16") -> dict[str, object]:
    """For a capture of a stack of layers: percent of the first and the last layer's activation gradients
    ``fmt`` flushes to zero (``mlp_first_flushed``, ``mlp_last_flushed``), the last layer's median
    ``|gradient|`` over the first's (``mlp_ratio``, and as a plain number for the prose, ``mlp_ratio_text``),
    the number of layers (``mlp_layers``), how many layers' medians lie below ``fmt``'s smallest normal
    (``mlp_below_normal``), and for how many layers from the first on, without a break, the median is at or
    below half its smallest subnormal, where a cast gives zero (``mlp_zero_medians``)."""
    acts = capture.of_kind("activation")
    if not acts:
        raise ValueError("the capture holds no activation gradient")
    f = get_format(fmt)
    medians = [float(a.values.abs().double().median()) for a in acts]
    leading = next((i for i, m in enumerate(medians) if m > f.min_subnormal / 2), len(medians))
    return {
        "mlp_first_flushed": summarize_underflow(acts[0].values, fmt).flushed * 100,
        "mlp_last_flushed": summarize_underflow(acts[-1].values, fmt).flushed * 100,
        "mlp_ratio": (ratio := float(acts[-1].values.abs().median() / acts[0].values.abs().median())),
        # a plain number in the prose, never 6.66e+04
        "mlp_ratio_text": Prose(f"{ratio:,.0f}" if ratio >= 100 else f"{ratio:.3g}"),
        "mlp_layers": len(acts),
        "mlp_below_normal": sum(m < f.min_normal for m in medians),
        "mlp_zero_medians": leading,
    }


# the course GPT's layers whose output is added to the residual stream: they receive its gradient
RESIDUAL_WRITERS = (".attn.proj", ".out")


def gpt_layer_facts(capture: GradientCapture) -> dict[str, object]:
    """For a capture of the course GPT: its number of blocks (``gpt_blocks``), the largest over the smallest
    median ``|gradient|`` of the layers that write into the residual stream (``gpt_writer_spread``), a phrase
    placing the other block layers (``qkv``, ``fc``) against them (``gpt_inner_place``), and the head's median
    with a phrase placing it (``gpt_head_median``, ``gpt_head_place``)."""
    medians = {}
    for g in capture.of_kind("activation"):
        v = g.values.abs()
        v = v[v > 0]
        if v.numel():
            medians[g.name] = float(v.double().median())
    writers = [n for n in medians if n.startswith("blocks.") and n.endswith(RESIDUAL_WRITERS)]
    inner = [n for n in medians if n.startswith("blocks.") and n not in writers]
    if not writers or not inner or "head" not in medians:
        raise ValueError(f"not a capture of the course GPT: it needs block layers and a head, got {sorted(medians)}")
    low, high = min(medians[n] for n in writers), max(medians[n] for n in writers)
    inner_low = sum(medians[n] < low for n in inner)
    inner_place = (f"all {len(inner)} have a lower median than any layer that writes into the stream"
                   if inner_low == len(inner) else
                   f"{inner_low} of {len(inner)} have a lower median than any layer that writes into the stream")
    head = medians["head"]
    head_place = "the lowest of all" if head <= min(medians.values()) else "not the lowest"
    return {"gpt_blocks": len({n.split(".")[1] for n in writers}), "gpt_writer_spread": high / low,
            "gpt_inner_place": Prose(inner_place), "gpt_head_median": head, "gpt_head_place": Prose(head_place)}
