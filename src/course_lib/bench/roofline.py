"""The roofline: attainable TFLOP/s from arithmetic intensity, peak and bandwidth; the FLOPs and bytes of each
operation of a transformer block; the model FLOPs per token behind MFU."""

from __future__ import annotations

from dataclasses import dataclass

from ..hardware import (
    DATASHEET_PEAKS,
    MATMUL_DTYPES,
)
from ..tables import markdown_table
from .matmul import matmul_flops


def attainable_tflops(intensity: float, peak_tflops: float, bandwidth_gbs: float) -> float:
    """The roofline: ``min(peak, intensity * bandwidth)`` in TFLOP/s, intensity in FLOPs per byte."""
    if not intensity > 0 or not peak_tflops > 0 or not bandwidth_gbs > 0:
        raise ValueError("intensity, peak and bandwidth must all be positive")
    return min(peak_tflops, intensity * bandwidth_gbs / 1e3)


@dataclass(frozen=True)
class OpCost:
    """FLOPs and the fewest bytes moved (each input read once, each output written once) of one operation
    of the model's forward pass, for one layer and one batch."""

    name: str
    flops: float
    bytes_moved: float

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / self.bytes_moved


def adamw_cost(n_params: int, param_bytes: int = 4) -> OpCost:
    """AdamW's update of ``n_params`` parameters: about 12 FLOPs each, and the parameters, gradients and two
    moments (``param_bytes`` each) read and the parameters and moments written (7 tensors' worth)."""
    return OpCost("AdamW step", 12 * n_params, 7 * n_params * param_bytes)


def transformer_op_costs(d_model: int, n_heads: int, tokens_per_sequence: int, batch: int, *,
                         bytes_per_element: int, mlp_ratio: int = 4, param_bytes: int = 4) -> tuple[OpCost, ...]:
    """The main operations of one pre-norm transformer block's forward pass (and the AdamW update of its
    parameters), with FLOPs and minimal bytes at ``bytes_per_element`` per activation and weight element.

    Counted FLOPs: matmuls ``2*M*N*K``; softmax about 5 per element (max, subtract, exp, sum, divide);
    layer norm about 8 per element; GELU about 8 per element; AdamW about 12 per parameter. The AdamW
    bytes assume ``param_bytes``-byte parameters, gradients and two moments, each read and written.
    """
    for name, v in (("d_model", d_model), ("n_heads", n_heads), ("tokens_per_sequence", tokens_per_sequence),
                    ("batch", batch), ("bytes_per_element", bytes_per_element), ("mlp_ratio", mlp_ratio),
                    ("param_bytes", param_bytes)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    if d_model % n_heads:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({n_heads})")
    b, t, d, h, e = batch, tokens_per_sequence, d_model, n_heads, bytes_per_element
    rows, dh, f = b * t, d // n_heads, mlp_ratio * d_model

    def linear(name: str, k: int, n: int) -> OpCost:
        return OpCost(name, matmul_flops(rows, n, k), (rows * k + k * n + rows * n) * e)

    scores = b * h * t * t
    n_params = 3 * d * d + d * d + 2 * d * f + 4 * d
    return (
        OpCost("layer norm", 8 * rows * d, 2 * rows * d * e),
        linear("QKV projection", d, 3 * d),
        OpCost("attention scores QK^T", 2 * b * h * t * t * dh, (2 * b * h * t * dh + scores) * e),
        OpCost("softmax", 5 * scores, 2 * scores * e),
        OpCost("attention @ V", 2 * b * h * t * t * dh, (scores + 2 * b * h * t * dh) * e),
        linear("output projection", d, d),
        linear("MLP up", d, f),
        OpCost("GELU", 8 * rows * f, 2 * rows * f * e),
        linear("MLP down", f, d),
        adamw_cost(n_params, param_bytes),
    )


def model_flops_per_token(n_params_non_embedding: int, n_layers: int, d_model: int, context: int) -> float:
    """Training FLOPs per token: ``6 N`` for the matmuls with the parameters (forward 2N, backward 4N)
    plus ``12 * n_layers * context * d_model`` for attention's two products (PaLM's appendix B count,
    without the causal-mask halving)."""
    for name, v in (("n_params_non_embedding", n_params_non_embedding), ("n_layers", n_layers),
                    ("d_model", d_model), ("context", context)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return 6.0 * n_params_non_embedding + 12.0 * n_layers * context * d_model


def datasheet_markdown() -> str:
    """A Markdown table of :data:`DATASHEET_PEAKS` (dense TFLOP/s, bandwidth, source citation)."""
    def cell(v):
        return "-" if v is None else f"{v:,.1f}"

    table = markdown_table(
        ("GPU", "sm", "FP32", "TF32", "BF16", "FP16", "FP8", "GB/s", "source"),
        [(p.name, p.compute_capability, *(cell(p.tflops[d]) for d in MATMUL_DTYPES), f"{p.bandwidth_gbs:,.0f}",
          f"{{cite:p}}`{p.source}`") for p in DATASHEET_PEAKS.values()]).rstrip("\n")
    notes = "\n".join(f"- {p.name}: {p.note}." for p in DATASHEET_PEAKS.values() if p.note)
    return table + "\n\nTFLOP/s, dense; GB/s: memory bandwidth. Notes:\n\n" + notes


@dataclass(frozen=True)
class RooflineRow:
    """One operation on one device in two dtypes: intensity and predicted time in each, and the speed-up
    the lower precision gives it by the roofline."""

    name: str
    intensity_high: float
    intensity_low: float
    bound_high: str
    bound_low: str
    seconds_high: float
    seconds_low: float

    @property
    def speedup(self) -> float:
        return self.seconds_high / self.seconds_low


def roofline_rows(d_model: int, n_heads: int, context: int, batch: int, *, peak_high: float, peak_low: float,
                  bandwidth_gbs: float, bytes_high: int = 4, bytes_low: int = 2) -> tuple[RooflineRow, ...]:
    """Predicted time of each operation of a transformer block with ``bytes_high``-byte elements at
    ``peak_high`` TFLOP/s against ``bytes_low``-byte elements at ``peak_low``, on one memory system:
    time = FLOPs / attainable throughput. The optimizer step keeps FP32 state in both."""
    high = transformer_op_costs(d_model, n_heads, context, batch, bytes_per_element=bytes_high)
    low = transformer_op_costs(d_model, n_heads, context, batch, bytes_per_element=bytes_low)
    rows = []
    for h, lo in zip(high, low):
        if h.name == "AdamW step":
            lo = h  # the update runs on FP32 master weights and moments in every mixed-precision recipe
        th = h.flops / (attainable_tflops(h.intensity, peak_high, bandwidth_gbs) * 1e12)
        tl = lo.flops / (attainable_tflops(lo.intensity, peak_low, bandwidth_gbs) * 1e12)
        ridge_h, ridge_l = peak_high * 1e3 / bandwidth_gbs, peak_low * 1e3 / bandwidth_gbs
        rows.append(RooflineRow(h.name, h.intensity, lo.intensity,
                                "compute" if h.intensity >= ridge_h else "memory",
                                "compute" if lo.intensity >= ridge_l else "memory", th, tl))
    return tuple(rows)


def gpt_matmul_parameters(d_model: int, n_layers: int, vocab_size: int, mlp_ratio: int = 4) -> int:
    """Weights that take part in a matrix product per token of a GPT: four projections per block
    (``(4 + 2 * mlp_ratio) * d**2``) and the output head (``d * vocab_size``, tied to the embedding or
    not: its product runs either way). Biases, norms and embedding look-ups are left out (no matmul). The
    ``N`` of :func:`model_flops_per_token` for a model whose head counts."""
    for name, v in (("d_model", d_model), ("n_layers", n_layers), ("vocab_size", vocab_size),
                    ("mlp_ratio", mlp_ratio)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    return n_layers * (4 + 2 * mlp_ratio) * d_model * d_model + d_model * vocab_size


_LINEARS = ("QKV projection", "output projection", "MLP up", "MLP down")
_ATTENTION = ("attention scores QK^T", "softmax", "attention @ V")


def _seconds(op: OpCost, tflops: float, bandwidth_gbs: float) -> float:
    return op.flops / (attainable_tflops(op.intensity, tflops, bandwidth_gbs) * 1e12)


def roofline_step_seconds(d_model: int, n_heads: int, n_layers: int, seq_len: int, batch: int, vocab_size: int, *,
                          n_params: int, matmul_tflops: float, bandwidth_gbs: float, bytes_per_element: int,
                          linear_tflops: float | None = None, attention: str = "explicit",
                          mlp_ratio: int = 4) -> float:
    """The roofline's time (seconds) of one training step of a GPT: every operation of
    :func:`transformer_op_costs` in each of ``n_layers`` blocks, the output head's product and the
    cross-entropy, each at its attainable throughput (``matmul_tflops``, or ``linear_tflops`` for the four
    projections, e.g. FP8's peak; ``bandwidth_gbs``), times 3 for forward and backward (a product's
    backward is two products; an elementwise op's backward reads about twice what its forward does), plus
    AdamW over ``n_params`` FP32 parameters. ``attention="sdpa"``: the scores, softmax and ``@ V`` are one
    fused kernel that moves only Q, K, V and the output. No launch or framework overhead: a lower bound."""
    if attention not in ("explicit", "scaled_first", "sdpa"):
        raise ValueError(f"attention must be 'explicit', 'scaled_first' or 'sdpa', got {attention!r}")
    if isinstance(n_params, bool) or not isinstance(n_params, int) or n_params < 1:
        raise ValueError(f"n_params must be a positive int, got {n_params!r}")
    for name, v in (("matmul_tflops", matmul_tflops), ("bandwidth_gbs", bandwidth_gbs),
                    ("linear_tflops", matmul_tflops if linear_tflops is None else linear_tflops)):
        if not (isinstance(v, (int, float)) and v > 0):
            raise ValueError(f"{name} must be a positive number, got {v!r}")
    ops = transformer_op_costs(d_model, n_heads, seq_len, batch, bytes_per_element=bytes_per_element,
                               mlp_ratio=mlp_ratio)
    e, rows = bytes_per_element, batch * seq_len
    block = [o for o in ops if o.name != "AdamW step" and not (attention == "sdpa" and o.name in _ATTENTION)]
    if attention == "sdpa":
        block.append(OpCost("fused attention", sum(o.flops for o in ops if o.name in _ATTENTION),
                            4 * rows * d_model * e))
    forward = n_layers * sum(_seconds(o, linear_tflops if (linear_tflops and o.name in _LINEARS) else matmul_tflops,
                                      bandwidth_gbs) for o in block)
    head = OpCost("output head", matmul_flops(rows, vocab_size, d_model),
                  (rows * d_model + d_model * vocab_size + rows * vocab_size) * e)
    loss = OpCost("cross-entropy", 5 * rows * vocab_size, rows * vocab_size * (e + 4))
    forward += _seconds(head, matmul_tflops, bandwidth_gbs) + _seconds(loss, matmul_tflops, bandwidth_gbs)
    return 3 * forward + _seconds(adamw_cost(n_params), matmul_tflops, bandwidth_gbs)
