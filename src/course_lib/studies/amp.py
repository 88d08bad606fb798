"""Lesson 4's study: the autocast dtype trace of the course model's forward and backward, and the facts,
phrases and tables the lesson glues from what autocast did."""

from __future__ import annotations

import statistics
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from ..amp import AccumulatorDemo, AutocastTrace, cuda_policy, sensitive_ops_markdown, sensitive_ops_trace, trace_autocast
from ..device import SizeProfile
from ..glue import Prose, and_list, count_word, ratio_text
from ..memory import bytes_per_parameter
from ..models import course_setup
from ..results import RecordedResult
from ..tables import MarkdownTable, markdown_table
from ..train import RECIPES, History
from .bf16 import adamw_moment_dtype, update_rule_bytes


def trace_course_model(device: torch.device | str, dtype: torch.dtype | None = None, *, seed: int = 0) -> AutocastTrace:
    """Trace one forward and backward pass of the course GPT (small shape) under autocast on ``device``.

    ``dtype`` defaults to FP16 on CUDA and BF16 on the CPU (each device's usual autocast dtype)."""
    device = torch.device(device)
    dtype = dtype or (torch.float16 if device.type == "cuda" else torch.bfloat16)
    setup = course_setup(SizeProfile("small"), device, steps=1, default_steps=(1, 1), seed=seed)
    model = setup.model(seed)
    x, y = setup.sampler.batch(0, device)
    return trace_autocast(lambda: model(x, y)[1], device_type=device.type, dtype=dtype)


@dataclass(frozen=True)
class AutocastOps:
    """What autocast did to the course model on a device, in a form a record keeps: the autocast
    ``dtype`` (``"float16"``), :meth:`~course_lib.amp.AutocastTrace.op_table`'s rows for the forward and
    backward pass, and :func:`~course_lib.amp.sensitive_ops_trace` (op -> output dtype)."""

    dtype: str
    forward: tuple[dict[str, Any], ...]
    backward: tuple[dict[str, Any], ...]
    sensitive_ops: dict[str, str]


def autocast_ops(profile, device: torch.device | str) -> AutocastOps:
    """:func:`trace_course_model` (the small model's shape: dtypes do not depend on size) and the sensitive
    ops on ``device``, at its usual autocast dtype."""
    trace = trace_course_model(device)
    return AutocastOps(trace.dtype, tuple(trace.op_table("forward")), tuple(trace.op_table("backward")),
                       sensitive_ops_trace(device))


def _code(value: object) -> Prose:
    return Prose(f"`{value}`")


def setup_facts(device_type: str, amp_dtype: torch.dtype) -> dict[str, object]:
    """The device type and the autocast dtype this page runs with, as inline code (``device_type``,
    ``amp_dtype``, e.g. `` `torch.bfloat16` ``)."""
    if not isinstance(amp_dtype, torch.dtype):
        raise TypeError(f"amp_dtype must be a torch.dtype, got {type(amp_dtype).__name__}")
    return {"amp_dtype": _code(amp_dtype), "device_type": _code(device_type)}


def trace_facts(trace: AutocastTrace) -> dict[str, object]:
    """Distinct ops of the forward (``n_ops``) and of the backward (``n_backward_ops``), and the calls of
    the casts autocast inserted in the forward (``n_casts``)."""
    forward = trace.op_table("forward")
    return {"n_ops": len(forward), "n_backward_ops": len(trace.op_table("backward")),
            "n_casts": sum(r["calls"] for r in forward if r["runs_in"] == "cast")}


def policy_lists_markdown(lists: Mapping[str, frozenset[str]]) -> Prose:
    """A Markdown list: each CUDA autocast policy, how many ops it names, and the ops in alphabetical order."""
    return Prose("\n".join(f"- **{policy}** ({len(ops)} ops): " + ", ".join(f"`{o}`" for o in sorted(ops))
                           for policy, ops in lists.items()))


def sensitive_ops_table(live: Mapping[str, str], device_type: str, lists: Mapping[str, frozenset[str]],
                        cuda_records: Sequence[RecordedResult]) -> MarkdownTable:
    """:func:`~course_lib.amp.sensitive_ops_markdown` of the live trace, with the first recorded CUDA
    trace's ``sensitive_ops`` as a last column when one is recorded."""
    if not cuda_records:
        return sensitive_ops_markdown(dict(live), device_type, dict(lists))
    first = cuda_records[0]
    if not isinstance(first.result, AutocastOps):
        raise TypeError(f"expected a recorded AutocastOps, got {type(first.result).__name__}")
    return sensitive_ops_markdown(dict(live), device_type, dict(lists), first.result.sensitive_ops, first.label)


def exceptions_table(exceptions: Mapping[str, str]) -> MarkdownTable:
    """:func:`~course_lib.amp.autocast_exceptions`' cases: the code (as inline code) and its result dtype."""
    return markdown_table(["code, run under autocast", "result dtype"], [(f"`{k}`", v) for k, v in exceptions.items()])


def norm_demo_table(demo: Mapping[str, object]) -> MarkdownTable:
    """:func:`~course_lib.amp.sensitive_norm_demo`'s result as a two-column table, errors to three digits."""
    return markdown_table(["", "value"], [(k, f"{v:.3g}" if isinstance(v, float) and k.startswith("largest error")
                                           else f"{v:g}" if isinstance(v, float) else v) for k, v in demo.items()])


def norm_demo_facts(demo: Mapping[str, object]) -> dict[str, object]:
    """From :func:`~course_lib.amp.sensitive_norm_demo`: its rows (``norm_rows``), the smallest FP16 value
    whose FP16 square overflows (``norm_square_limit``), the rows holding one that large (``norm_big_rows``), the rows the naive norm zeroed (``norm_zeroed``), and
    each version's largest error (``norm_err_naive``, ``norm_err_safe``)."""
    keys = {"norm_rows": "rows", "norm_square_limit": "smallest FP16 value whose FP16 square is inf",
            "norm_big_rows": "rows holding a value of that size or more",
            "norm_zeroed": "rows the naive norm set to zero", "norm_err_naive": "largest error, naive",
            "norm_err_safe": "largest error, in autocast(enabled=False)"}
    missing = [k for k in keys.values() if k not in demo]
    if missing:
        raise ValueError(f"not a sensitive_norm_demo result: it lacks {', '.join(missing)}")
    return {name: demo[key] for name, key in keys.items()}


def checkpoint_facts(ckpt: Mapping[str, object]) -> dict[str, object]:
    """Whether :func:`~course_lib.amp.checkpointing_demo`'s gradients matched (``ckpt_identical``, a phrase)."""
    if "identical gradients" not in ckpt:
        raise ValueError("not a checkpointing_demo result: it lacks 'identical gradients'")
    return {"ckpt_identical": Prose("identical, bit for bit" if ckpt["identical gradients"] else "**different**")}


def attention_order_facts(head_dim: int, entry: float, manual_finite: bool, fused_finite: bool) -> dict[str, object]:
    """The attention-order demonstration: FP16 query and key vectors of ``head_dim`` entries, all equal to
    ``entry``. Their raw product ``head_dim * entry**2`` against FP16's largest finite value, the product after
    the 1/sqrt(head_dim) scale, and a phrase on what the two orderings gave (``manual_finite``: softmax of
    ``q @ k^T`` scaled afterwards; ``fused_finite``: ``scaled_dot_product_attention``)."""
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 1:
        raise ValueError(f"head_dim must be a positive int, got {head_dim!r}")
    raw = head_dim * entry * entry
    fp16_max = torch.finfo(torch.float16).max
    if manual_finite and fused_finite:
        verdict = "both orderings stay finite here, so this input does not separate them"
    elif fused_finite:
        verdict = ("the course model's ordering overflows to inf and its softmax returns NaN, while "
                   "`scaled_dot_product_attention` stays finite")
    elif manual_finite:
        verdict = "the fused call overflows where the written-out ordering does not, against expectation"
    else:
        verdict = "both orderings overflow: this input is too large even after the scale"
    return {"attn_head_dim": head_dim, "attn_raw": raw, "attn_fp16_max": fp16_max,
            "attn_scaled": raw / head_dim ** 0.5, "attn_headroom": head_dim ** 0.5, "attn_verdict": Prose(verdict)}


def math_backend_order_facts(written_finite: bool, math_finite: bool) -> dict[str, object]:
    """``attn_math_order``: a phrase saying what the lesson's measurement gave. FP32 query and key vectors whose
    raw product is twice FP32's largest value (no accumulator is wider) go through attention written out
    (product, then scale; ``written_finite``: its output stayed finite) and through
    ``scaled_dot_product_attention``'s math backend alone (``math_finite``)."""
    for name, value in (("written_finite", written_finite), ("math_finite", math_finite)):
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool (torch.isfinite(...).all().item()), got {value!r}")
    if math_finite and not written_finite:
        order = ("the written-out order overflows FP32 itself, while the math backend stays finite: it scales "
                 "before the product")
    elif math_finite:
        order = "both stay finite here, so this input does not tell the orders apart"
    else:
        order = "the math backend overflows too: here it does not scale before the product"
    return {"attn_math_order": Prose(order)}


def math_backend_fp16_facts(flag_default: bool, finite: Sequence[bool]) -> dict[str, object]:
    """``attn_math_fp16``: a phrase on what the math backend did with FP16 query and key vectors whose product
    *after* the 1/sqrt(d) scale is twice FP16's largest value. ``flag_default``: what
    ``torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()`` returned before the measurement;
    ``finite``: whether the output stayed finite with that flag set to False, then to True (the backend
    allowed to reduce in FP16)."""
    if not isinstance(flag_default, bool):
        raise TypeError(f"flag_default must be a bool, got {flag_default!r}")
    if isinstance(finite, (str, bytes)) or len(finite) != 2 or not all(isinstance(f, bool) for f in finite):
        raise TypeError(f"finite must be two bools (flag False, flag True), got {finite!r}")
    upcast, reduced = finite
    state = (f"`fp16_bf16_reduction_math_sdp_allowed()` returned `{flag_default}`, "
             + ("so by default the math backend computes FP16 inputs in FP32" if not flag_default else
                "so here the math backend is allowed to compute FP16 inputs in FP16"))
    if upcast and not reduced:
        outcome = ("with the flag off it stayed finite although the scaled product is twice FP16's largest "
                   "value, and with it on it overflowed. With the flag off, FP16 inputs get FP32's range; "
                   "the order of the scale matters for FP32 inputs, and for FP16 ones only with the flag on")
    elif upcast and reduced:
        outcome = "it stayed finite with the flag off and on, so this input does not show what the flag changes"
    elif reduced:
        outcome = "it overflowed with the flag off and stayed finite with it on, against expectation"
    else:
        outcome = "it overflowed with the flag off and on: this torch does not compute FP16 inputs in FP32 here"
    return {"attn_math_fp16": Prose(f"{state}; {outcome}")}


def sdpa_autocast_dtype(device_type: str, dtype: torch.dtype) -> dict[str, object]:
    """``attn_sdpa_dtype``: the dtype ``scaled_dot_product_attention`` returns for FP32 inputs under
    ``torch.autocast(device_type, dtype)``, measured, as code."""
    q = torch.randn(1, 1, 4, 8, device=device_type)
    with torch.autocast(device_type, dtype=dtype):
        out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    return {"attn_sdpa_dtype": _code(str(out.dtype).replace("torch.", ""))}


def sdpa_backends(device: torch.device | str, dtype: torch.dtype, *, head_dim: int = 64,
                  seq: int = 8) -> dict[str, object]:
    """Which of PyTorch's attention kernels run causal ``dtype`` inputs of ``head_dim`` on ``device`` (each
    tried alone under ``torch.nn.attention.sdpa_kernel``), and which one ``scaled_dot_product_attention``
    picks when left to choose (``None`` where this torch does not say), with the inputs' ``shape`` (batch 1,
    2 heads, ``seq`` positions, ``head_dim``) and ``dtype``:
    ``{"runs": {name: bool}, "chosen": name, "shape": (1, 2, seq, head_dim), "dtype": "bfloat16"}``."""
    for name, value in (("head_dim", head_dim), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    device = torch.device(device)
    q = torch.randn(1, 2, seq, head_dim, device=device, dtype=dtype)
    names = [n for n in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH") if hasattr(SDPBackend, n)]
    runs = {}
    for name in names:
        try:
            # a kernel that cannot run these inputs warns why before the call fails: the table says it
            with warnings.catch_warnings(), sdpa_kernel([getattr(SDPBackend, name)]):
                warnings.simplefilter("ignore")
                torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            runs[name] = True
        except RuntimeError:
            runs[name] = False
    chosen = None
    choice = getattr(torch, "_fused_sdp_choice", None)
    if choice is not None:
        index = int(choice(q, q, q, is_causal=True))
        chosen = next((n for n in names if int(getattr(SDPBackend, n)) == index), None)
    return {"runs": runs, "chosen": chosen, "shape": tuple(q.shape), "dtype": str(dtype).replace("torch.", "")}


def sdpa_backend_facts(backends: Mapping[str, object]) -> dict[str, object]:
    """``attn_backends_run``: the kernels that ran, as code; ``attn_backend_chosen``: the one picked, or a
    phrase saying this torch does not tell; ``attn_backend_inputs``: the inputs :func:`sdpa_backends` built
    (its shape and dtype, where the result has them)."""
    runs = backends["runs"]
    if not isinstance(runs, Mapping) or not any(runs.values()):
        raise ValueError(f"no attention kernel ran: {runs!r}")
    ran = [f"`{n}`" for n, ok in runs.items() if ok]
    chosen = backends["chosen"]
    return {"attn_backends_run": Prose(", ".join(ran[:-1]) + (" and " if len(ran) > 1 else "") + ran[-1]),
            "attn_backend_chosen": Prose(f"`{chosen}`" if chosen else "a kernel this torch does not name"),
            "attn_backend_inputs": _backend_inputs(backends)}


def accumulator_facts(short: AccumulatorDemo, long: AccumulatorDemo) -> dict[str, object]:
    """The FP32-buffer exercise's numbers, from two :func:`course_lib.amp.fp32_accumulator_demo` runs of
    ``short.steps`` and ``long.steps`` adds: the buffer's dtype after them, each buffer's RMS error in
    percent (``ex_buf_*``), the low-precision buffer's error over the FP32 buffer's (``ex_buf_ratio``), and
    what the longer run changed (``ex_buf_growth``, "widens" only where the rise shows)."""
    if not isinstance(short, AccumulatorDemo) or not isinstance(long, AccumulatorDemo):
        raise TypeError("accumulator_facts takes two AccumulatorDemo results")
    if not long.steps > short.steps or long.dtype != short.dtype:
        raise ValueError("the second run must add more products than the first, in the same dtype")
    return {"ex_buf_dtype": Prose(f"`{short.acc_dtype}`"), "ex_buf_low": Prose(f"`{short.dtype}`"),
            "ex_buf_steps": short.steps, "ex_buf_steps_long": long.steps,
            "ex_buf_fp32_buffer": 100 * short.error_fp32_buffer, "ex_buf_low_buffer": 100 * short.error_low_buffer,
            "ex_buf_fp32": 100 * short.error_fp32, "ex_buf_ratio": short.error_low_buffer / short.error_fp32_buffer,
            "ex_buf_growth": _buffer_growth(short, long)}


def _buffer_growth(short: AccumulatorDemo, long: AccumulatorDemo) -> Prose:
    # "grows" only where the low-precision buffer's error rose by a fifth or more and the FP32 buffer's did not
    lo = (f"over {long.steps} products the {short.dtype} buffer is {100 * long.error_low_buffer:.2f}% off and the "
          f"FP32 buffer {100 * long.error_fp32_buffer:.2f}%")
    if long.error_low_buffer > 1.2 * short.error_low_buffer and long.error_fp32_buffer < 1.2 * short.error_fp32_buffer:
        return Prose(f"The gap widens with the run's length: {lo}. A low-precision running sum loses more the "
                     "longer it runs, since each add rounds a larger sum.")
    return Prose(f"Here the run's length changed little: {lo}.")


def sdpa_backend_table(backends: Mapping[str, object]) -> MarkdownTable:
    """:func:`sdpa_backends`' result: per kernel, whether it ran the inputs and whether torch picks it."""
    runs = backends.get("runs")
    if not isinstance(runs, Mapping) or not runs:
        raise ValueError(f"backends must be sdpa_backends' result, with a non-empty 'runs' mapping; got {backends!r}")
    chosen = backends.get("chosen")
    return markdown_table(("kernel", "ran on these inputs", "torch's pick when left to choose"),
                          [(f"`{n}`", "yes" if ok else "no", "-" if chosen is None else "yes" if n == chosen else "no")
                           for n, ok in runs.items()])


def _backend_inputs(backends: Mapping[str, object]) -> Prose:
    shape, dtype = backends.get("shape"), backends.get("dtype")
    if not isinstance(shape, tuple) or len(shape) != 4 or dtype is None:
        return Prose("`sdpa_backends`' causal inputs")
    batch, heads, seq, head_dim = (int(n) for n in shape)
    return Prose(f"`sdpa_backends`' causal `{dtype}` inputs: a batch of {batch}, {count_word(heads)} heads of {seq} "
                 f"positions, head dimension {head_dim}")


def scaler_dtype_note(loop_dtype: torch.dtype, device_type: str) -> dict[str, object]:
    """``scaler_dtype_note``: which autocast dtype the production loops run with on ``device_type``. FP16, the
    dtype a GradScaler is for, on any device (off a GPU the loops show the mechanisms, not their speed, which
    lesson 4's recipe table measures); BF16 would be the pair lesson 3's pitfall detector flags."""
    if loop_dtype == torch.bfloat16:
        raise ValueError("the production loops pair autocast with a GradScaler: run them in torch.float16 "
                         "(BF16 needs no scaler; lesson 3's pitfall detector flags the pair)")
    if loop_dtype != torch.float16:
        raise ValueError(f"loop_dtype must be torch.float16, got {loop_dtype!r}")
    if device_type == "cuda":
        return {"scaler_dtype_note": Prose("Here they run with FP16 autocast, as there.")}
    return {"scaler_dtype_note": Prose(
        f"Here they run with FP16 autocast too, on this {device_type.upper()}: they show what each mechanism "
        "does, not how fast it runs (the recipe table above measured this machine's speeds).")}


def recipes_table(device: torch.device | str) -> MarkdownTable:
    """Every precision recipe: its name, what it does, and "yes" or "no:" and why ``device`` cannot run it."""
    return markdown_table(["recipe", "what it does", "runs here"],
                          [(f"`{r.name}`", r.description, f"no: {why}" if (why := r.unsupported_reason(device)) else "yes")
                           for r in RECIPES.values()])


def recipe_results_table(histories: Mapping[str, History], device_type: str) -> MarkdownTable:
    """Per recipe run: final loss (nats per byte), skipped steps, and median tokens per second (labelled a
    CPU speed off a GPU)."""
    timing = "GPU" if device_type == "cuda" else "CPU (not a GPU speed)"
    return markdown_table(["recipe", "final loss", "skipped steps", f"median tokens/s, {timing}"],
                          [(f"`{k}`", f"{h.losses[-1]:.3f}", sum(h.skipped), f"{statistics.median(h.tokens_per_second):,.0f}")
                           for k, h in histories.items()])


def recipe_facts(histories: Mapping[str, History]) -> dict[str, object]:
    """Each recipe's median tokens per second over FP32's (``recipe_speeds``, above 1: faster), in the table's
    order, as :func:`glue.ratio_text` writes a speed ratio."""
    if "fp32" not in histories or len(histories) < 2:
        raise ValueError(f"the recipe runs need fp32 and another recipe, got {sorted(histories)}")
    base = statistics.median(histories["fp32"].tokens_per_second)
    return {"recipe_speeds": Prose(and_list([f"`{k}` {ratio_text(statistics.median(h.tokens_per_second) / base)}"
                                             for k, h in histories.items() if k != "fp32"]))}


def weight_casts(device_type: str, dtype: torch.dtype, *, calls: int = 3) -> tuple[int, int]:
    """How often autocast casts a linear layer's weight, measured with a dispatch mode: ``calls`` calls in one
    autocast region, then one call in a second region. Autocast caches the cast of a leaf tensor that requires
    grad (a weight) until its region exits, so torch gives ``(1, 1)``."""
    if isinstance(calls, bool) or not isinstance(calls, int) or calls < 1:
        raise ValueError(f"calls must be a positive int, got {calls!r}")
    layer, x = torch.nn.Linear(8, 8, device=device_type), torch.randn(2, 8, device=device_type)
    counts = [0, 0]

    class _Count(TorchDispatchMode):
        region = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._to_copy.default and args[0].data_ptr() == layer.weight.data_ptr():
                counts[self.region] += 1
            return func(*args, **(kwargs or {}))

    with _Count() as mode:
        with torch.autocast(device_type, dtype=dtype):
            for _ in range(calls):
                layer(x)
        mode.region = 1
        with torch.autocast(device_type, dtype=dtype):
            layer(x)
    return counts[0], counts[1]


def amp_errata(*, mean_dtype: torch.dtype, softmax_dtype: torch.dtype, exp_dtype: torch.dtype,
               weight_dtype: torch.dtype, warnings_seen: Sequence[str],
               lists: Mapping[str, frozenset[str]] | None = None,
               casts: tuple[int, int] | None = None, calls: int = 3) -> list[tuple[str, str]]:
    """The errata rows (claim, measured): the dtypes of ``mean``, ``softmax`` and ``exp`` of a matmul's
    output under BF16 autocast on the CPU, a linear layer's weight dtype after running under autocast, how
    often its weight was cast (``casts``: :func:`weight_casts` for ``calls`` calls in one region, one in a
    second), and
    the warnings ``torch.cuda.amp.autocast()`` and ``torch.cuda.amp.GradScaler()`` gave (``warnings_seen``,
    messages, each quoted once); CUDA's policy for each op
    is read from ``lists`` (torch's header when None)."""
    for name, value in (("mean_dtype", mean_dtype), ("softmax_dtype", softmax_dtype), ("exp_dtype", exp_dtype),
                        ("weight_dtype", weight_dtype)):
        if not isinstance(value, torch.dtype):
            raise TypeError(f"{name} must be a torch.dtype, got {type(value).__name__}")
    if isinstance(warnings_seen, str):
        raise TypeError("warnings_seen is a sequence of messages, not one string")
    # a policy label such as "fp32 (via dtype argument)" goes inside parentheses: no nested ones
    policy = {op: cuda_policy(op, None if lists is None else dict(lists)).replace(" (", ", ").replace(")", "")
              for op in ("sum", "layer_norm", "softmax", "exp")}
    weight_cast_text = ("" if casts is None else
                        f"here {calls} calls of one linear layer in one region cast its weight "
                        f"{'once' if casts[0] == 1 else f'{casts[0]} times'}, and a second region "
                        f"{'once more' if casts[1] == 1 else f'{casts[1]} more times'}.")
    quoted = [f"\"{message.rstrip('.')}\"" for message in dict.fromkeys(warnings_seen)]
    deprecated = (f"Deprecated: torch says {' and '.join(quoted)}."
                  if quoted else "The installed torch does not warn about them.")
    return [
        ("`mean` stays in FP32 under autocast.",
         f"`mean` is on none of CUDA autocast's lists (torch's header gives it no policy), so it runs in its "
         f"input's dtype: the mean of a matmul's output under BF16 autocast here is `{mean_dtype}`. On CUDA, autocast "
         f"runs `sum` and `softmax` in FP32 (its list: {policy['sum']}) and `layer_norm` too ({policy['layer_norm']})."),
        ("Softmax runs in FP16/BF16 under autocast.",
         f"On CUDA it is on the FP32 list ({policy['softmax']}); on the CPU it is not: here `softmax` of a "
         f"BF16 matmul output returns `{softmax_dtype}` and `exp` returns `{exp_dtype}` (CUDA: {policy['exp']})."),
        ("Autocast converts the model's weights to FP16.",
         f"The weights stay `{weight_dtype}`; autocast makes a lower-precision copy of a weight when an op first "
         "needs it and reuses it until the autocast region exits"
         + (f": {weight_cast_text}" if weight_cast_text else ".")),
        ("Use `torch.cuda.amp.autocast()` and `torch.cuda.amp.GradScaler()`.",
         f"{deprecated} `torch.amp` takes the device type as an argument, "
         f"so one code path serves CUDA, the CPU and other devices."),
    ]


def cuda_policy_phrase(op: str, lists: Mapping[str, frozenset[str]] | None = None) -> Prose:
    """Where CUDA autocast's lists put ``op``, and what dtype that gives it, as a phrase: "on CUDA's FP32
    list, so it returns `float32`" (read from ``lists``, torch's header when None)."""
    if not isinstance(op, str) or not op:
        raise TypeError(f"op must be an op name (str), got {op!r}")
    policy = cuda_policy(op, None if lists is None else dict(lists))
    return Prose({
        "fp32": "on CUDA's FP32 list, so it returns `float32`",
        "fp32 (via dtype argument)": "on CUDA's FP32 list (autocast passes it `dtype=torch.float32`), so it "
                                     "returns `float32`",
        "lower precision": "on CUDA's lower-precision list, so it returns autocast's dtype",
        "promote": "on CUDA's promote list, so it returns the widest of its inputs' dtypes",
        "-": "on none of CUDA's lists, so it returns its input's dtype"}[policy])


def pure_master_sentence(histories: Mapping[str, History]) -> Prose:
    """How far apart ``bf16_pure`` and ``bf16_master`` were in the recipe runs: the largest loss gap at any
    step (and where), and the gap at the last step; "" when either did not run. One final step alone would
    say little: the two can end close after differing on the way."""
    pure, master = histories.get("bf16_pure"), histories.get("bf16_master")
    if pure is None or master is None or not pure.losses or not master.losses:
        return Prose("")
    steps = min(len(pure.losses), len(master.losses))
    gaps = [abs(p - m) for p, m in zip(pure.losses[:steps], master.losses[:steps])]
    widest = max(range(steps), key=gaps.__getitem__)
    return Prose(f"In the {steps}-step runs above, `bf16_pure` and `bf16_master` differed by up to "
                 f"{gaps[widest]:.3f} in loss (at step {widest}) and by {gaps[-1]:.3f} at the last step, so the last "
                 "step alone says little. The effect of the master weights needs small updates late in training, "
                 "which a run this short does not reach.")


def exercise_facts(op_dtype: torch.dtype, lists: Mapping[str, frozenset[str]] | None = None, *,
                   op: str = "log1p", pow_dtype: torch.dtype | None = None) -> dict[str, object]:
    """For the exercises: the dtype ``op`` (the first exercise's op, one the page's tables do not show)
    returned on a BF16 matmul output on the CPU (``ex_op_cpu``), where CUDA's lists put ``op``
    (``ex_op_cuda``, :func:`cuda_policy_phrase`), the bytes per parameter ``bf16_master`` keeps beyond
    ``bf16_pure`` (``ex_master_extra``), the dtype of ``bf16_pure``'s AdamW moments (``ex_pure_moments``),
    and the bytes per parameter of ``bf16_pure``, ``bf16_master`` and lesson 5's ``BF16AdamW`` with
    stochastic rounding and with Kahan compensation (``ex_pure_bytes``, ``ex_master_bytes``,
    ``ex_sr_bytes``, ``ex_kahan_bytes``); with ``pow_dtype`` (what ``pow`` of an FP16 autocast output
    returned on the CPU), that dtype (``ex_pow_cpu``). CUDA's policy for ``pow`` is the checked exercise's
    answer, so it is not among the facts."""
    if not isinstance(op_dtype, torch.dtype):
        raise TypeError(f"op_dtype must be a torch.dtype, got {type(op_dtype).__name__}")
    if pow_dtype is not None and not isinstance(pow_dtype, torch.dtype):
        raise TypeError(f"pow_dtype must be a torch.dtype, got {type(pow_dtype).__name__}")
    pure, master = (sum(bytes_per_parameter(r).values()) for r in ("bf16_pure", "bf16_master"))
    facts: dict[str, object] = {
        "ex_op_cpu": _code(op_dtype),
        "ex_master_extra": master - pure,
        "ex_op_cuda": cuda_policy_phrase(op, lists),
        "ex_pure_moments": _code(str(adamw_moment_dtype(torch.bfloat16)).replace("torch.", "")),
        "ex_pure_bytes": pure, "ex_master_bytes": master,
        "ex_sr_bytes": sum(update_rule_bytes("stochastic").values()),
        "ex_kahan_bytes": sum(update_rule_bytes("kahan").values()),
    }
    if pow_dtype is not None:
        facts["ex_pow_cpu"] = _code(pow_dtype)
    return facts
