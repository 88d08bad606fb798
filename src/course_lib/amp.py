"""What autocast really does: trace the dtype in and out of every op, and read torch's own op lists.

:func:`trace_autocast` runs a function (a forward and backward pass, say) under ``torch.autocast`` with a
``TorchDispatchMode`` that sees every ATen op *after* autocast has made its decision, so the dtypes it
records are the dtypes the kernels really ran in. :func:`autocast_op_lists` parses the CUDA policy lists
(lower precision, FP32, promote) from the installed ``torch/include/ATen/autocast_mode.h``.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from .tables import markdown_table

LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class OpEvent:
    """One ATen op call: its name (``mm``, ``_softmax``, ...), floating dtypes in and out, and the phase."""

    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    phase: str


def _float_dtypes(values) -> tuple[str, ...]:
    return tuple(str(t.dtype).replace("torch.", "") for t in tree_leaves(values)
                 if isinstance(t, torch.Tensor) and t.is_floating_point())


class _Recorder(TorchDispatchMode):
    def __init__(self, events: list, phase: list):
        super().__init__()
        self.events, self.phase = events, phase

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.events.append(OpEvent(func.overloadpacket.__name__, _float_dtypes((args, kwargs or {})),
                                   _float_dtypes(out), self.phase[0]))
        return out


@dataclass(frozen=True)
class AutocastTrace:
    """Every op a forward and backward pass ran, with dtypes; ``device_type`` and autocast ``dtype``."""

    device_type: str
    dtype: str
    events: tuple[OpEvent, ...]

    def op_table(self, phase: str = "forward") -> list[dict]:
        """One row per op name seen in ``phase``: the most common input and output dtype pattern, how
        often the op ran in all (``calls``), what that pattern says about where it ran (:func:`classify`),
        and ``patterns``: every (inputs, outputs, calls) pattern of the op, the most common first."""
        if phase not in ("forward", "backward"):
            raise ValueError(f"phase must be 'forward' or 'backward', got {phase!r}")
        by_op: dict[str, Counter] = {}
        for e in self.events:
            if e.phase == phase and e.inputs + e.outputs:
                by_op.setdefault(e.op, Counter())[(e.inputs, e.outputs)] += 1
        rows = []
        for op, patterns in by_op.items():
            (inputs, outputs), n = patterns.most_common(1)[0]
            rows.append({"op": op, "inputs": inputs, "outputs": outputs, "calls": sum(patterns.values()),
                         "runs_in": classify(op, inputs, outputs),
                         "patterns": tuple((i, o, c) for (i, o), c in patterns.most_common())})
        return rows

    def dtype_of(self, op: str, phase: str = "forward") -> tuple[str, ...]:
        """Output dtypes of the first call of ``op`` in ``phase`` (ValueError if it never ran)."""
        for e in self.events:
            if e.op == op and e.phase == phase:
                return e.outputs
        raise ValueError(f"op {op!r} did not run in the {phase} pass")


def classify(op: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> str:
    """What an op call's dtypes say about where it ran: ``"cast"`` (a dtype conversion), ``"low
    precision"`` (all float outputs FP16/BF16), ``"fp32"`` (all float outputs FP32), ``"mixed"``."""
    low = {"float16", "bfloat16"}
    if op in ("_to_copy", "to", "copy_"):
        return "cast"
    if not outputs:
        return "no float output"
    if all(o in low for o in outputs):
        return "low precision"
    if all(o == "float32" for o in outputs):
        return "fp32"
    return "mixed"


def trace_autocast(fn, *, device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> AutocastTrace:
    """Run ``fn()`` under ``torch.autocast(device_type, dtype)``, recording every op.

    ``fn`` returns a scalar loss (for a backward pass, which is traced with phase ``"backward"``) or None.
    Autocast applies to the forward only, as in training; the backward runs outside it, like real code.
    """
    if dtype not in LOW_PRECISION:
        raise ValueError(f"autocast dtype must be torch.float16 or torch.bfloat16, got {dtype}")
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    events: list[OpEvent] = []
    phase = ["forward"]
    with _Recorder(events, phase):
        with torch.autocast(device_type, dtype=dtype):
            loss = fn()
        if loss is not None:
            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                raise ValueError("fn must return a scalar loss tensor or None")
            phase[0] = "backward"
            loss.backward()
    return AutocastTrace(device_type, str(dtype).replace("torch.", ""), tuple(events))


# ---- torch's own lists -------------------------------------------------------------------------------

AUTOCAST_HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
_LISTS = {"lower precision": "AT_FORALL_LOWER_PRECISION_FP", "fp32": "AT_FORALL_FP32",
          "fp32 (via dtype argument)": "AT_FORALL_FP32_SET_OPT_DTYPE", "promote": "AT_FORALL_PROMOTE"}


def autocast_op_lists(header: str | Path = AUTOCAST_HEADER) -> dict[str, frozenset[str]]:
    """The CUDA autocast policy lists from torch's ``autocast_mode.h``: policy -> op names.

    ``"fp32 (via dtype argument)"`` holds ops such as ``softmax`` and ``sum`` that autocast runs in FP32
    by passing ``dtype=torch.float32`` to them."""
    path = Path(header)
    if not path.is_file():
        raise FileNotFoundError(f"torch's autocast header is not at {path}")
    text = path.read_text(encoding="utf-8")
    out = {}
    for policy, macro in _LISTS.items():
        m = re.search(rf"#define {macro}\(_\)((?:.*\\\n)*.*)", text)
        if m is None:
            raise ValueError(f"{macro} not found in {path}")
        out[policy] = frozenset(re.findall(r"_\((\w+)", m.group(1)))
    return out


def cuda_policy(op: str, lists: dict[str, frozenset[str]] | None = None) -> str:
    """Which CUDA autocast list names ``op``, or ``"-"``: a kernel's name is matched to the list entry of the op
    that calls it, ignoring leading underscores, ``native_`` and a ``_forward`` suffix (``_log_softmax`` is
    ``log_softmax``, ``nll_loss_forward`` is ``nll_loss``)."""
    lists = autocast_op_lists() if lists is None else lists
    bare = op.lstrip("_").replace("native_", "")
    names = {op, op.lstrip("_"), op.replace("native_", ""), bare.removesuffix("_forward")}
    for policy, ops in lists.items():
        if names & ops:
            return policy
    return "-"


# ---- what autocast does not touch ---------------------------------------------------------------------

def _name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def autocast_exceptions(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> dict[str, str]:
    """Output dtypes of cases autocast leaves alone, each run under ``torch.autocast``.

    Keys: an eligible matmul (for contrast), an in-place op on an FP32 tensor, a matmul with ``out=``, an op
    given an explicit ``dtype=`` argument (``sum``, which CUDA autocast otherwise runs in FP32), a matmul on
    an autocast output cast up with ``.float()`` (autocast lowers it again: only a ``dtype=`` argument is
    honoured), a
    matmul inside ``autocast(enabled=False)``, and a matmul on FP64 inputs (autocast only touches FP32
    inputs of eligible ops).
    """
    device = torch.device(device_type)
    a = torch.randn(4, 4, device=device)
    b = torch.randn(4, 4, device=device)
    out = torch.empty(4, 4, device=device)
    acc = torch.zeros(4, 4, device=device)
    with torch.autocast(device_type, dtype=dtype):
        h = a @ b   # an eligible op's output: already in the low-precision dtype
        result = {
            "a @ b (eligible op)": _name(a @ b),
            "acc.add_(a @ b) (in-place into FP32)": _name(acc.add_(a @ b)),
            "torch.mm(a, b, out=out)": _name(torch.mm(a, b, out=out)),
            "torch.sum(a @ b, dtype=torch.float64)": _name(torch.sum(a @ b, dtype=torch.float64)),
            "h.float() @ b, h = a @ b (cast up, lowered again)": _name(h.float() @ b),
            "a.double() @ b.double()": _name(a.double() @ b.double()),
        }
        with torch.autocast(device_type, enabled=False):
            result["a @ b inside autocast(enabled=False)"] = _name(a @ b)
    return result


@dataclass(frozen=True)
class AccumulatorDemo:
    """A running sum of ``steps`` matrix products ``a[i] @ b[i]`` (:func:`fp32_accumulator_demo`): each
    ``error_*`` is the sum's RMS error against the exact (FP64) sum, relative to the exact sum's RMS.
    ``acc_dtype``: the FP32 buffer's dtype after the in-place adds under autocast."""

    dtype: str
    acc_dtype: str
    steps: int
    error_fp32_buffer: float     # FP32 buffer, products under autocast (each rounded to ``dtype``)
    error_low_buffer: float      # a buffer in ``dtype`` itself, the same products
    error_fp32: float            # FP32 buffer and FP32 products (autocast off)


def fp32_accumulator_demo(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16, *, steps: int = 64,
                          size: int = 32, seed: int = 0) -> AccumulatorDemo:
    """Sum ``steps`` products of random ``size x size`` matrices into a buffer with ``acc.add_(a @ b)``: an
    FP32 buffer under autocast (it stays FP32, but each product arrives rounded to ``dtype``), a buffer in
    ``dtype`` (each add rounds the running sum too), and FP32 throughout, each against the exact sum."""
    if dtype not in LOW_PRECISION:
        raise ValueError(f"dtype must be torch.float16 or torch.bfloat16, got {dtype!r}")
    for name, value in (("steps", steps), ("size", size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    device = torch.device(device_type)
    g = torch.Generator().manual_seed(seed)
    a, b = (torch.randn(steps, size, size, generator=g).to(device) for _ in range(2))
    exact = (a.double() @ b.double()).sum(0)

    def error(acc: torch.Tensor) -> float:
        return float((acc.double() - exact).pow(2).mean().sqrt() / exact.pow(2).mean().sqrt())

    acc, low, ref = (torch.zeros(size, size, device=device, dtype=d) for d in (torch.float32, dtype, torch.float32))
    with torch.autocast(device_type, dtype=dtype):
        for i in range(steps):
            acc.add_(a[i] @ b[i])
            low.add_(a[i] @ b[i])
    for i in range(steps):
        ref.add_(a[i] @ b[i])
    return AccumulatorDemo(_name(torch.ones(1, dtype=dtype)), _name(acc), steps, error(acc), error(low), error(ref))


def make_fp32_function(device_type: str):
    """A custom autograd function ``y = x ** 2`` (computed in FP32 under autocast) for ``device_type``."""
    seen: dict[str, str] = {}

    class Square(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type=device_type, cast_inputs=torch.float32)
        def forward(ctx, x):
            seen["input inside forward (after cast_inputs)"] = _name(x)
            seen["autocast inside forward"] = str(torch.is_autocast_enabled(device_type))
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @torch.amp.custom_bwd(device_type=device_type)
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            seen["backward grad"] = _name(grad)
            # custom_bwd restores the autocast state the forward ran with (off, under cast_inputs)
            seen["autocast inside backward"] = str(torch.is_autocast_enabled(device_type))
            return 2 * x * grad

    return Square, seen


def custom_function_demo(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16) -> dict[str, str]:
    """Run :func:`make_fp32_function`'s op on a low-precision activation under autocast."""
    square, seen = make_fp32_function(device_type)
    w = torch.randn(4, 4, device=device_type, requires_grad=True)
    x = torch.randn(4, 4, device=device_type)
    with torch.autocast(device_type, dtype=dtype):
        h = x @ w                       # low precision
        seen["activation before the op"] = _name(h)
        y = square.apply(h)
        seen["op output"] = _name(y)
    y.float().sum().backward()
    return dict(seen)   # in the order things happened: the activation, the forward, its output, the backward


def checkpointing_demo(device_type: str = "cpu", dtype: torch.dtype = torch.bfloat16, seed: int = 0) -> dict[str, object]:
    """Gradients of a small block with and without activation checkpointing under autocast.

    Checkpointing re-runs the forward during backward; torch restores the autocast state for the
    recomputation, so the gradients must be identical, bit for bit."""
    from torch.utils.checkpoint import checkpoint

    gen = torch.Generator().manual_seed(seed)
    block = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    block = block.to(device_type)
    x = torch.randn(32, 64, generator=gen).to(device_type)
    grads = {}
    for label, use_ckpt in (("plain", False), ("checkpointed", True)):
        block.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=dtype):
            y = checkpoint(block, x, use_reentrant=False) if use_ckpt else block(x)
        y.float().pow(2).mean().backward()
        grads[label] = [p.grad.clone() for p in block.parameters() if p.grad is not None]
    identical = all(torch.equal(a, b) for a, b in zip(grads["plain"], grads["checkpointed"]))
    return {"identical gradients": identical, "output dtype": _name(y)}


def sensitive_ops_trace(device: torch.device | str, dtype: torch.dtype | None = None) -> dict[str, str]:
    """Output dtype of softmax, layer_norm, exp and sum applied under autocast to a low-precision
    activation (the output of a matmul) on ``device``: where CPU and CUDA autocast differ."""
    device = torch.device(device)
    dtype = dtype or (torch.float16 if device.type == "cuda" else torch.bfloat16)
    a = torch.randn(8, 8, device=device)
    with torch.autocast(device.type, dtype=dtype):
        h = a @ a
        return {"matmul output": _name(h), "softmax": _name(torch.softmax(h, -1)),
                "layer_norm": _name(torch.nn.functional.layer_norm(h, (8,))),
                "exp": _name(torch.exp(h)), "sum": _name(h.sum())}


def fp16_square_limit() -> float:
    """The smallest positive FP16 value whose square, computed in FP16, is infinite: every finite positive
    FP16 bit pattern squared, the first that overflows."""
    values = torch.arange(1, 0x7C00, dtype=torch.int16).view(torch.float16)   # 0x7C00 is FP16's +inf
    return float(values[torch.isinf(values * values)][0])


def sensitive_norm_demo(device_type: str = "cpu", rows: int = 8, width: int = 32, seed: int = 0) -> dict[str, float | int | str]:
    """A hand-written RMS norm, ``h / sqrt(mean(h * h))``, on activations made under FP16 autocast: computed
    as written, and inside an ``autocast(enabled=False)`` region on FP32 copies (``h.float()``).

    ``h`` comes from a matrix product, so autocast makes it FP16 on every device. ``*``, ``mean`` and
    ``sqrt`` are on none of autocast's lists, on CUDA or on the CPU, so they run in FP16 as well: the square
    of a value of :func:`fp16_square_limit` or more is inf in FP16, its row's mean is inf, and the naive norm
    divides that whole row to zero.
    Row ``i``'s activations are about ``2**(i + 3)`` in size, so the later rows cross the limit. Returns the counts
    and each version's largest error against the same norm of the same FP16 ``h`` computed in FP64."""
    for name, value in (("rows", rows), ("width", width)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(rows, width, generator=gen) * torch.exp2(torch.arange(rows) + 3.0)[:, None]).to(device_type)
    w = (torch.randn(width, width, generator=gen) / width**0.5).to(device_type)
    with torch.autocast(device_type, dtype=torch.float16):
        h = a @ w
        naive = h / torch.sqrt((h * h).mean(-1, keepdim=True))
        with torch.autocast(device_type, enabled=False):
            hf = h.float()
            safe = hf / torch.sqrt((hf * hf).mean(-1, keepdim=True))
    hd = h.double()
    reference = hd / torch.sqrt((hd * hd).mean(-1, keepdim=True))
    limit = fp16_square_limit()
    return {"activations dtype": _name(h), "naive norm dtype": _name(naive), "rows": rows,
            "smallest FP16 value whose FP16 square is inf": limit,
            "rows holding a value of that size or more": int((h.abs() >= limit).any(-1).sum()),
            "rows the naive norm set to zero": int((naive == 0).all(-1).sum()),
            "largest error, naive": float((naive.double() - reference).abs().max()),
            "largest error, in autocast(enabled=False)": float((safe.double() - reference).abs().max())}


def op_table_markdown(trace, phase: str = "forward", lists: dict[str, frozenset[str]] | None = None):
    """:meth:`AutocastTrace.op_table` of ``phase`` as a Markdown table, with each op's CUDA policy: one row
    per dtype pattern an op ran with (its calls with that pattern), so that an op that ran with several
    patterns (a cast down and a cast up) shows each; the op's later rows name it "(also)"."""
    if not isinstance(trace, AutocastTrace):
        raise TypeError(f"trace must be an AutocastTrace (from trace_autocast), got {type(trace).__name__}")
    lists = autocast_op_lists() if lists is None else lists
    rows = []
    for r in trace.op_table(phase):
        policy = cuda_policy(r["op"], lists)
        for k, (inputs, outputs, calls) in enumerate(r["patterns"]):
            rows.append((f"`{r['op']}`" + (" (also)" if k else ""), calls, ", ".join(inputs), ", ".join(outputs),
                         classify(r["op"], inputs, outputs), policy))
    return markdown_table(["op", "calls", "input dtypes", "output dtypes", "ran in", "torch's CUDA list"], rows)


def sensitive_ops_markdown(live: dict[str, str], device_type: str, lists: dict[str, frozenset[str]] | None = None,
                           recorded: dict[str, str] | None = None, recorded_label: str = ""):
    """:func:`sensitive_ops_trace` output as a table: dtype here, CUDA's policy, and a recorded GPU's dtype."""
    lists = autocast_op_lists() if lists is None else lists
    op_name = {"matmul output": "mm"}      # the other keys are op names already
    header = ["op", f"output dtype here ({device_type})", "torch's CUDA list"]
    if recorded is not None:
        header.append(f"recorded on {recorded_label}")
    rows = [[op, dtype, cuda_policy(op_name.get(op, op), lists)] + ([recorded.get(op, "-")] if recorded is not None
                                                                    else []) for op, dtype in live.items()]
    return markdown_table(header, rows)
