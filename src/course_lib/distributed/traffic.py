"""What a rank's sharded-training collectives carry, counted where they are called: FSDP2 gathers parameters
and reduce-scatters gradients through ``torch.distributed``'s Python functions, so wrapping those functions
(the package's names, which FSDP2 looks up at each call) counts every byte of every collective it starts.

The count is the size of the whole tensor each collective assembles or reduces (an all-gather's output, a
reduce-scatter's input), in the dtype it travels in. On a ring each rank sends and receives (N - 1)/N of that
per collective, the same fraction for both kinds, so ratios between runs are the wire's ratios too.
DDP's all-reduce is started from C++ (its reducer), not through these functions: it is not counted."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

# per kind: the names torch.distributed has had for it (FSDP2 calls the first on torch 2.13 and the second on
# older releases; where both exist the second calls the first inside torch, where no wrapper sits), and which
# positional argument is the whole tensor (an all-gather's output, a reduce-scatter's input)
COLLECTIVES = {"all_gather": (("all_gather_single", "all_gather_into_tensor"), 0, "output_tensor"),
               "reduce_scatter": (("reduce_scatter_single", "reduce_scatter_tensor"), 1, "input")}


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@contextmanager
def count_collective_bytes() -> Iterator[dict[str, int]]:
    """Inside the ``with`` block, every all-gather and reduce-scatter started through ``torch.distributed``
    adds its whole tensor's bytes to the yielded dict (``{"all_gather": ..., "reduce_scatter": ...}``).
    The functions are restored on leaving, also after an exception."""
    import torch.distributed as dist

    counts = {kind: 0 for kind in COLLECTIVES}
    saved: dict[str, object] = {}

    def counting(kind: str, fn, position: int, keyword: str):
        def counted(*args, **kwargs):
            whole = args[position] if len(args) > position else kwargs[keyword]
            counts[kind] += tensor_bytes(whole)
            return fn(*args, **kwargs)
        return counted

    try:
        for kind, (names, position, keyword) in COLLECTIVES.items():
            for name in names:
                if hasattr(dist, name):
                    saved[name] = getattr(dist, name)
                    setattr(dist, name, counting(kind, saved[name], position, keyword))
        yield counts
    finally:
        for name, fn in saved.items():
            setattr(dist, name, fn)


def sharded_step_bytes(param_bytes: int, reduce_bytes: int, *, gathers: int = 2) -> dict[str, int]:
    """Bytes per parameter one step of sharded data parallelism moves, as FSDP2 does it: the parameters
    gathered ``gathers`` times in their compute dtype (``param_bytes`` per element: once for the forward
    pass, again for the backward pass when they are freed after the forward, FSDP2's default for every
    module but the root) and the gradients reduce-scattered once in the reduction dtype (``reduce_bytes``)."""
    for value, what in ((param_bytes, "param_bytes"), (reduce_bytes, "reduce_bytes"), (gathers, "gathers")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{what} must be a positive int, got {value!r}")
    return {"all_gather": gathers * param_bytes, "reduce_scatter": reduce_bytes}
