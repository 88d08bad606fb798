"""Where a training step's memory goes, counted exactly, and a bytes-per-parameter model built on it.

:func:`account_training_memory` (in ``studies.performance``) runs one real training step of the course
model with a precision recipe and counts, byte for byte: weights, gradients, optimizer state, FP32
master weights, and the tensors the forward pass saves for backward (through
``torch.autograd.graph.saved_tensors_hooks``, each storage counted once), split into activations and
autocast's low-precision copies of the weights (a saved cast of a parameter, frozen or not, is a weight
copy, never an activation). On a GPU it also reads ``torch.cuda.max_memory_allocated`` for the step.
:func:`bytes_per_parameter` is the persistent part of that accounting per parameter, component by
component, and :func:`estimate_training_memory` scales it to any model size.
"""

from __future__ import annotations

import math
import numbers
import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

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
    GPU, the allocator's peak for the step (``measured_peak_bytes``, None elsewhere) and what the device held
    before the recipe's model was built, after a garbage collection (``baseline_bytes``: None elsewhere, and
    in records made before it was kept), which the peak includes."""

    recipe: str
    device: str
    n_params: int
    batch_size: int
    context: int
    components: dict[str, int]
    measured_peak_bytes: int | None = None
    baseline_bytes: int | None = None

    @property
    def total(self) -> int:
        return sum(self.components.values())

    @property
    def persistent(self) -> int:
        """What lives across steps: weights, gradients (until zeroed), optimizer state, masters."""
        return sum(self.components[k] for k in ("weights", "gradients", "optimizer_state", "master_weights"))

    def per_parameter(self) -> float:
        return self.persistent / self.n_params


class _ParameterCasts(TorchDispatchMode):
    """Records, below autograd and autocast, every dtype cast (``aten._to_copy``) whose input lives in a
    parameter's storage or in an earlier such cast: the storages of the weight copies, each with a weak
    reference to the copy, so that a copy freed and its memory reused by an activation is not mistaken
    for it (the reference is dead by then). Frozen parameters included: autocast casts them too, but their
    copies carry no autograd history to recognise them by."""

    def __init__(self, parameter_storages: set[tuple[Any, int]]):
        super().__init__()
        self.parameter_storages = parameter_storages
        self.copies: dict[tuple[Any, int], weakref.ref] = {}

    def is_copy(self, key: tuple[Any, int]) -> bool:
        ref = self.copies.get(key)
        return ref is not None and ref() is not None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and isinstance(args[0], torch.Tensor) \
                and isinstance(out, torch.Tensor) and out.untyped_storage().nbytes():
            source = _storage_key(args[0])
            if source in self.parameter_storages or self.is_copy(source):
                self.copies[_storage_key(out)] = weakref.ref(out)
        return out


def saved_tensor_bytes(model: torch.nn.Module, run_forward) -> tuple[int, int, Any]:
    """Bytes of the distinct storages saved for backward while ``run_forward()`` runs, split into
    ``(activations, weight_copies, output of run_forward)``.

    Parameters and buffers themselves are left out (weights are counted as weights). A saved tensor that
    is a dtype cast of a parameter (trainable or frozen), of such a cast, or a view of one, is a weight
    copy, not an activation: autocast casts each weight it feeds to a low-precision op and saves the copy
    when backward needs it (a frozen layer's copy too, when gradients flow through the layer to the layers
    before it). Each storage counts once, whatever the number of views of it that were saved.
    """
    excluded = {_storage_key(p) for p in model.parameters()} | {_storage_key(b) for b in model.buffers()}
    casts = _ParameterCasts({_storage_key(p) for p in model.parameters()})
    seen: dict[tuple[Any, int], tuple[int, bool]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        if key not in excluded and key not in seen:
            seen[key] = (t.untyped_storage().nbytes(), casts.is_copy(key))
        return t

    with casts, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run_forward()
    activations = sum(n for n, w in seen.values() if not w)
    copies = sum(n for n, w in seen.values() if w)
    return activations, copies, out


# ---- the bytes-per-parameter model -----------------------------------------------------------------------

# Persistent bytes per parameter with AdamW, per recipe, as torch.amp and the course's loop keep them:
# (weights, gradients, optimizer state, master weights). Every gradient tensor counts as a gradient:
# bf16_master keeps the BF16 gradient backward wrote into the model (2) and the FP32 copy of it that the
# loop hands the master (4), both alive from backward until the next step zeroes them; its masters are 4.
_BYTES_PER_PARAM = {
    "fp32": (4, 4, 8, 0),
    "tf32": (4, 4, 8, 0),
    "bf16_autocast": (4, 4, 8, 0),           # autocast keeps FP32 weights and gradients
    "fp16_autocast_scaler": (4, 4, 8, 0),
    "fp16_autocast_no_scaler": (4, 4, 8, 0),
    "bf16_pure": (2, 2, 4, 0),               # AdamW's moments follow the parameter dtype
    "bf16_master": (2, 2 + 4, 8, 4),         # BF16 and FP32 gradients; the FP32 master copy
}


def bytes_per_parameter(recipe: str) -> dict[str, int]:
    """Persistent bytes per parameter of a recipe with AdamW, by the components of
    :class:`MemoryBreakdown`: weights, gradients (all of them: ``bf16_master``'s BF16 gradient and its
    master's FP32 one), optimizer state and FP32 master weights, as the course's loop and ``torch.amp``
    keep them. Times the parameter count, these are the persistent components that
    ``studies.performance.account_training_memory`` counts."""
    if not isinstance(recipe, str):
        raise TypeError(f"recipe must be a recipe name (str), got {type(recipe).__name__} {recipe!r}")
    if recipe not in _BYTES_PER_PARAM:
        raise ValueError(f"unknown recipe {recipe!r}; known: {', '.join(_BYTES_PER_PARAM)}")
    w, g, o, m = _BYTES_PER_PARAM[recipe]
    return {"weights": w, "gradients": g, "optimizer_state": o, "master_weights": m}


def estimate_training_memory(n_params: float, recipe: str) -> dict[str, float]:
    """Persistent training memory in bytes for a model of ``n_params`` parameters (a positive, finite
    number; activations excluded: they depend on batch, sequence length and checkpointing, and are
    measured separately), per component of :func:`bytes_per_parameter` and in ``"total"``."""
    if isinstance(n_params, bool) or not isinstance(n_params, numbers.Real):
        raise TypeError(f"n_params must be a number of parameters, got {type(n_params).__name__} {n_params!r}")
    if not (math.isfinite(n_params) and n_params > 0):
        raise ValueError(f"n_params must be a positive finite number of parameters, got {n_params!r}")
    per = bytes_per_parameter(recipe)
    out = {k: float(v) * float(n_params) for k, v in per.items()}
    out["total"] = sum(out.values())
    return out


# ---- the activation-bytes model --------------------------------------------------------------------------

def _positive_ints(**values: Any) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def activation_bytes(*, batch: int, seq_len: int, d_model: int, n_heads: int, n_layers: int, vocab_size: int,
                     mlp_ratio: int = 4, attention: str = "explicit", autocast_bytes: int | None = None,
                     device_type: str = "cpu") -> int:
    """Bytes the course model's forward pass saves for backward (what :func:`saved_tensor_bytes` counts as
    activations), from its shape: ``batch`` sequences of ``seq_len`` tokens, ``attention`` ``"explicit"``
    (scores stored; ``"scaled_first"`` keeps the scaled q in place of q: the same bytes, except with one
    sequence or one head, where it keeps ``r d`` more) or ``"sdpa"``
    (fused: a log-sum-exp per row instead), in FP32 (``autocast_bytes`` None) or under a 16-bit autocast
    (``autocast_bytes=2``).

    Per block, with ``r = batch * seq_len`` rows and ``f = mlp_ratio * d_model``: the two layer norms'
    FP32 inputs (``2 r d``) and their mean and reciprocal deviation (``4 r`` floats); in the compute dtype
    the inputs of the four linear layers (``3d + f`` per row), Q, K and V (``3d``) and GELU's input
    (``f``); explicit attention keeps the softmax's output (``batch * n_heads * seq_len**2``; under CUDA
    autocast softmax runs in FP32 and the product with V keeps a 16-bit copy of it too: 6 bytes, on a CPU
    2) and the inverted causal mask (``seq_len**2`` bools). Outside the blocks: the final norm's input and
    statistics, the head's input, the FP32 log-softmax of the logits (``r * vocab_size``), the int64 token
    ids, positions and targets. Exact against :func:`saved_tensor_bytes` on a CPU; the CUDA softmax rule
    is torch's autocast op list (lesson 4's H100 trace: ``_softmax`` returns FP32), and a fused CUDA kernel may keep its output as well (``r * d`` more)."""
    _positive_ints(batch=batch, seq_len=seq_len, d_model=d_model, n_heads=n_heads, n_layers=n_layers,
                   vocab_size=vocab_size, mlp_ratio=mlp_ratio)
    if attention not in ("explicit", "scaled_first", "sdpa"):
        raise ValueError(f"attention must be 'explicit', 'scaled_first' or 'sdpa', got {attention!r}")
    if autocast_bytes not in (None, 2):
        raise ValueError(f"autocast_bytes must be None (FP32) or 2 (a 16-bit autocast), got {autocast_bytes!r}")
    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    r, d, t, f = batch * seq_len, d_model, seq_len, mlp_ratio * d_model
    e = 4 if autocast_bytes is None else autocast_bytes
    block = 2 * r * d * 4 + 4 * r * 4 + (6 * d + 2 * f) * r * e
    if attention != "sdpa":
        score_bytes = 4 if autocast_bytes is None else (4 + e if device_type == "cuda" else e)
        block += batch * n_heads * t * t * score_bytes + t * t
    else:
        block += batch * n_heads * t * 4
    if attention == "scaled_first" and (batch == 1 or n_heads == 1):
        # one sequence or one head: the head split is a free view, so Q, K and V stay views of the qkv output,
        # which is kept whole, and the scaled q is a tensor of its own beside it
        block += r * d * e
    outside = r * d * 4 + 2 * r * 4 + r * d * e + r * vocab_size * 4 + 8 * (2 * r + t) + 4
    return n_layers * block + outside


def autocast_weight_copy_bytes(*, d_model: int, n_layers: int, vocab_size: int, mlp_ratio: int = 4,
                               autocast_bytes: int = 2) -> int:
    """Bytes of the low-precision weight copies autocast saves for backward: every linear layer's weight
    matrix (four per block and the output head) at ``autocast_bytes`` per element."""
    _positive_ints(d_model=d_model, n_layers=n_layers, vocab_size=vocab_size, mlp_ratio=mlp_ratio,
                   autocast_bytes=autocast_bytes)
    d = d_model
    return autocast_bytes * (n_layers * (4 * d * d + 2 * d * mlp_ratio * d) + vocab_size * d)
