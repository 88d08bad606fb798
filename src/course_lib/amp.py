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
        often it ran, and what autocast did: ``"lower precision"`` (FP32 in, low precision out),
        ``"fp32"`` (low precision in, FP32 out, or FP32 only), ``"low in, low out"``, ``"cast"``."""
        by_op: dict[str, Counter] = {}
        for e in self.events:
            if e.phase == phase and e.inputs + e.outputs:
                by_op.setdefault(e.op, Counter())[(e.inputs, e.outputs)] += 1
        rows = []
        for op, patterns in by_op.items():
            (inputs, outputs), n = patterns.most_common(1)[0]
            rows.append({"op": op, "inputs": inputs, "outputs": outputs, "calls": sum(patterns.values()),
                         "runs_in": classify(op, inputs, outputs)})
        return rows

    def dtype_of(self, op: str, phase: str = "forward") -> tuple[str, ...]:
        """Output dtypes of the first call of ``op`` in ``phase`` (ValueError if it never ran)."""
        for e in self.events:
            if e.op == op and e.phase == phase:
                return e.outputs
        raise ValueError(f"op {op!r} did not run in the {phase} pass")


def classify(op: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> str:
    """What an op call's dtypes say about where it ran."""
    low = {"float16", "bfloat16"}
    if op in ("_to_copy", "to", "copy_"):
        return "cast"
    if not outputs:
        return "no float output"
    if all(o in low for o in outputs):
        return "low precision"
    if all(o == "float32" for o in outputs):
        return "fp32" if any(i in low for i in inputs) or not inputs else "fp32"
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
    """Which CUDA autocast list names ``op`` (leading underscores and ``native_`` ignored), or ``"-"``."""
    lists = autocast_op_lists() if lists is None else lists
    names = {op, op.lstrip("_"), op.replace("native_", "")}
    for policy, ops in lists.items():
        if names & ops:
            return policy
    return "-"
