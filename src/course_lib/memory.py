"""Where a training step's memory goes, counted exactly, and a bytes-per-parameter model built on it.

:func:`account_training_memory` runs one real training step of the course model with a precision recipe
and counts, byte for byte: weights, gradients, optimizer state, FP32 master weights, and the tensors the
forward pass saves for backward (through ``torch.autograd.graph.saved_tensors_hooks``, each storage
counted once), split into activations and autocast's low-precision copies of the weights. On a GPU it
also reads ``torch.cuda.max_memory_allocated`` for the step. :func:`bytes_per_parameter` is the
persistent part of that accounting per parameter, and :func:`estimate_training_memory` scales it to any
model size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

COMPONENTS = ("weights", "gradients", "optimizer_state", "master_weights", "autocast_weight_copies",
              "activations")


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes of the tensor's elements (``numel * element_size``)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a tensor, got {type(t).__name__}")
    return t.numel() * t.element_size()


def _storage_key(t: torch.Tensor) -> tuple[Any, int]:
    s = t.untyped_storage()
    return (t.device, s.data_ptr())


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes per component of one training step (see :data:`COMPONENTS`), the batch it ran, and, on a
    GPU, the allocator's peak for the step (``measured_peak_bytes``, None elsewhere)."""

    recipe: str
    device: str
    n_params: int
    batch_size: int
    context: int
    components: dict[str, int]
    measured_peak_bytes: int | None = None

    @property
    def total(self) -> int:
        return sum(self.components.values())

    @property
    def persistent(self) -> int:
        """What lives across steps: weights, gradients (until zeroed), optimizer state, masters."""
        return sum(self.components[k] for k in ("weights", "gradients", "optimizer_state", "master_weights"))

    def per_parameter(self) -> float:
        return self.persistent / self.n_params


_VIEW_OR_CAST_NODES = frozenset({"ToCopyBackward0", "TBackward0", "ViewBackward0", "TransposeBackward0",
                                  "PermuteBackward0", "ExpandBackward0", "UnsafeViewBackward0"})


def _is_parameter_copy(t: torch.Tensor, param_ids: set[int]) -> bool:
    """Whether ``t`` is a cast (or a view of a cast) of a parameter: its autograd history leads, through
    casts and views only, to a parameter's gradient accumulator (how autocast's weight copies look)."""
    fn = t.grad_fn
    for _ in range(8):
        if fn is None:
            return False
        if type(fn).__name__ == "AccumulateGrad":
            return id(getattr(fn, "variable")) in param_ids
        nexts = [n for n, _ in fn.next_functions if n is not None]
        if type(fn).__name__ not in _VIEW_OR_CAST_NODES or len(nexts) != 1:
            return False
        fn = nexts[0]
    return False


def saved_tensor_bytes(model: torch.nn.Module, run_forward) -> tuple[int, int, Any]:
    """Bytes of the distinct storages saved for backward while ``run_forward()`` runs, split into
    ``(activations, weight_copies, output of run_forward)``.

    Parameters and buffers themselves are left out (weights are counted as weights). A saved tensor whose
    autograd history is a cast of a parameter is a low-precision weight copy (autocast casts each weight
    once per forward and saves the copy for backward). Each storage counts once, whatever the number of
    views of it that were saved.
    """
    excluded = {_storage_key(p) for p in model.parameters()} | {_storage_key(b) for b in model.buffers()}
    param_ids = {id(p) for p in model.parameters()}
    seen: dict[tuple[Any, int], tuple[int, bool]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in excluded and key not in seen:
            seen[key] = (t.untyped_storage().nbytes(), _is_parameter_copy(t, param_ids))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run_forward()
    activations = sum(n for n, w in seen.values() if not w)
    copies = sum(n for n, w in seen.values() if w)
    return activations, copies, out


# ---- the bytes-per-parameter model -----------------------------------------------------------------------

# Persistent bytes per parameter with AdamW, per recipe, as torch.amp and the course's loop keep them:
# (weights, gradients, optimizer state, master weights and their gradients).
_BYTES_PER_PARAM = {
    "fp32": (4, 4, 8, 0),
    "tf32": (4, 4, 8, 0),
    "bf16_autocast": (4, 4, 8, 0),           # autocast keeps FP32 weights and gradients
    "fp16_autocast_scaler": (4, 4, 8, 0),
    "fp16_autocast_no_scaler": (4, 4, 8, 0),
    "bf16_pure": (2, 2, 4, 0),               # AdamW's moments follow the parameter dtype
    "bf16_master": (2, 2, 8, 8),             # FP32 master copy plus its FP32 gradient
}


def bytes_per_parameter(recipe: str) -> dict[str, int]:
    """Persistent bytes per parameter of a recipe with AdamW: weights, gradients, optimizer state and
    master weights (with the master's own gradient), as the course's loop and ``torch.amp`` keep them."""
    if recipe not in _BYTES_PER_PARAM:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(_BYTES_PER_PARAM)}")
    w, g, o, m = _BYTES_PER_PARAM[recipe]
    return {"weights": w, "gradients": g, "optimizer_state": o, "master_weights": m}


def estimate_training_memory(n_params: float, recipe: str) -> dict[str, float]:
    """Persistent training memory in bytes for a model of ``n_params`` parameters (activations excluded:
    they depend on batch, sequence length and checkpointing, and are measured separately)."""
    if isinstance(n_params, bool) or not isinstance(n_params, (int, float)) or not n_params > 0:
        raise ValueError(f"n_params must be a positive number, got {n_params!r}")
    per = bytes_per_parameter(recipe)
    out = {k: float(v) * n_params for k, v in per.items()}
    out["total"] = sum(out.values())
    return out


