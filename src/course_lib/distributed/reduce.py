"""Gradient reductions as arithmetic: gloo's ring all-reduce order simulated bit for bit, the reduction variants
(FP32, BF16 ring and tree, FP16 divided by N or by FSDP2's split factor) and DDP's compression hooks."""

from __future__ import annotations

import torch

REDUCE_ORDERS = ("ring", "tree")


def _positive_int(value, what: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be an int of at least {minimum}, got {value!r}")
    return value


def cast_compress_hook(dtype: torch.dtype):
    """A DDP communication hook that all-reduces each gradient bucket in ``dtype``: cast to ``dtype``,
    divide by the world size in ``dtype``, sum, copy back into the FP32 bucket. The arithmetic of torch's
    ``fp16_compress_hook`` and ``bf16_compress_hook``, written out because DDP's ``register_comm_hook``
    refuses torch's ``bf16_compress_hook`` (a ``TypeError``) unless torch was built with CUDA or ROCm and
    NCCL 2.10 or newer, or runs on an XPU with XCCL."""
    import torch.distributed as dist

    def hook(process_group, bucket):
        group = process_group if process_group is not None else dist.group.WORLD
        buffer = bucket.buffer()
        compressed = buffer.to(dtype).div_(group.size())   # cast, then divided in dtype, as torch's hooks

        def decompress(fut):
            return buffer.copy_(fut.value()[0])

        return dist.all_reduce(compressed, group=group, async_op=True).get_future().then(decompress)

    hook.__name__ = f"cast_compress_hook_{dtype}".replace("torch.", "")
    return hook


def compress_hook(name: str, *, backend: str):
    """DDP's gradient-compression hook ``name`` (``fp16`` or ``bf16``): torch's own FP16 hook always; torch's
    BF16 hook with ``backend`` NCCL (where DDP accepts it: a CUDA or ROCm build with NCCL 2.10+), else
    :func:`cast_compress_hook` with the same arithmetic."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if name == "fp16":
        return default_hooks.fp16_compress_hook
    if name == "bf16":
        return default_hooks.bf16_compress_hook if backend == "nccl" else cast_compress_hook(torch.bfloat16)
    raise ValueError(f"comm hook must be one of {COMM_HOOKS}, got {name!r}")


REDUCE_CHECK_VALUES = 4096


REDUCE_CHECK_DTYPES = ("bfloat16", "float16")


def reduce_check_plan(world_size: int, sizes=(REDUCE_CHECK_VALUES,)) -> tuple[tuple[int, int], ...]:
    """The all-reduces of the check, as ``(ranks, n)``: every vector length of ``sizes`` on the first 2, 3,
    ..., ``world_size`` ranks (a launch of 3 ranks also checks a group of 2), in this order."""
    _positive_int(world_size, "world_size", 2)
    sizes = tuple(sizes)
    if not sizes:
        raise ValueError("the all-reduce check needs at least one vector length")
    for n in sizes:
        _positive_int(n, "each all-reduce check size", 1)
    return tuple((ranks, n) for ranks in range(2, world_size + 1) for n in sizes)


def reduce_check_inputs(world_size: int, n: int = REDUCE_CHECK_VALUES, seed: int = 0) -> torch.Tensor:
    """``[world_size, n]`` FP32 values, one row per rank, magnitudes spread over about 2^-12..2^6 with both
    signs: the inputs of the all-reduce check (within FP16's normal range, so no rank's input flushes)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(world_size, n, generator=gen) * torch.exp2(torch.randint(-12, 6, (world_size, n),
                                                                               generator=gen).float())


GLOO_MAX_SEGMENT_BYTES = 1024 * 1024   # gloo's AllreduceOptionsImpl::kMaxSegmentSize (torch leaves it as is)


def ring_chunks(n: int, ranks: int, element_size: int) -> tuple[tuple[int, int], ...]:
    """The ``[start, stop)`` of the values each rank's chunk holds in gloo's ring all-reduce of ``n`` values
    of ``element_size`` bytes over ``ranks`` ranks (chunk ``c``'s sum ends on rank ``c``).

    Gloo cuts the vector into segments, a multiple of ``ranks`` of them, at least two per rank and each at most
    :data:`GLOO_MAX_SEGMENT_BYTES`, every segment ``ceil(n / segments)`` values long; a rank's chunk is its run
    of consecutive segments. So a chunk is not ``ceil(n / ranks)`` values: 7 values on 3 ranks make chunks
    ``[0, 4)``, ``[4, 7)`` and an empty one."""
    _positive_int(n, "n", 0)
    _positive_int(ranks, "ranks", 1)
    _positive_int(element_size, "element_size", 1)
    if ranks == 1:
        return ((0, n),)
    max_segment = max(1, GLOO_MAX_SEGMENT_BYTES // element_size)   # in values, as gloo rounds it
    segments = -(-max(-(-n // max_segment), 2 * ranks) // ranks) * ranks
    chunk = (segments // ranks) * -(-n // segments)
    return tuple((min(c * chunk, n), min((c + 1) * chunk, n)) for c in range(ranks))


def simulate_all_reduce(values: torch.Tensor, dtype: torch.dtype, order: str = "ring") -> torch.Tensor:
    """The sum over ranks of ``values`` (shape ``[ranks, n]``) as an all-reduce computes it in ``dtype``:
    every partial sum rounded to ``dtype``.

    ``ring``: gloo's ring reduce-scatter: the vector is cut into one chunk per rank (:func:`ring_chunks`),
    and chunk ``c`` is summed one rank after another, ranks ``c-1, c-2, ..., c`` (mod N) (checked bit for bit
    against gloo's all-reduce).
    ``tree``: a pairwise tree: ranks summed in pairs, then pairs of pairs (log2 N additions deep). Not NCCL's
    tree algorithm, which chains the GPUs within a node and joins the nodes by a double binary tree.
    """
    if not isinstance(values, torch.Tensor) or values.dim() != 2 or values.shape[0] < 1:
        raise ValueError("values must be a [ranks, n] tensor with at least one rank")
    if order not in REDUCE_ORDERS:
        raise ValueError(f"order must be one of {REDUCE_ORDERS}, got {order!r}")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    v = values.to(dtype)
    n_ranks, n = v.shape
    if order == "tree":
        parts = list(v)
        while len(parts) > 1:
            parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
        return parts[0]
    chunk_of = torch.empty(n, dtype=torch.long)
    for c, (start, stop) in enumerate(ring_chunks(n, n_ranks, v.element_size())):
        chunk_of[start:stop] = c
    acc = None
    for k in range(n_ranks):   # the k-th addend of every value: chunk c adds ranks c-1, c-2, ..., c
        addend = v.gather(0, ((chunk_of - 1 - k) % n_ranks)[None, :])[0]
        acc = addend if acc is None else acc + addend
    assert acc is not None
    return acc


# label: (dtype of the reduction, order, what is divided before the sum: "N", "sqrtN" (FSDP2) or "none")
REDUCTION_VARIANTS = {
    "FP32, ring": (torch.float32, "ring", "none"),
    "BF16, ring": (torch.bfloat16, "ring", "none"),
    "BF16, pairwise tree": (torch.bfloat16, "tree", "none"),
    "FP16, ring, /N first (DDP hook)": (torch.float16, "ring", "N"),
    "FP16, ring, /~sqrt(N) first (FSDP2)": (torch.float16, "ring", "sqrtN"),
}


def fsdp2_predivide(n: int) -> int:
    """The power of two FSDP2 divides an FP16 gradient by before reducing over ``n`` ranks (the rest of
    ``n`` is divided after): about sqrt(n), so neither the sum overflows nor the parts underflow."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    pre = 1
    while n % pre == 0 and n / pre > pre:
        pre *= 2
    return pre


def reduce_mean(grads: torch.Tensor, variant: str) -> torch.Tensor:
    """The mean over ranks of ``grads`` (``[ranks, n]``) as the reduction ``variant`` (a key of
    :data:`REDUCTION_VARIANTS`) computes it, returned in FP64 for comparison.

    A variant that divides before the sum casts each rank's gradient to its dtype first and divides in that
    dtype, as torch's ``fp16_compress_hook`` (``buffer.to(float16).div_(world_size)``) and FSDP2 (which
    copies the gradients into a ``reduce_dtype`` buffer, divides it, and divides the reduced shard by the
    rest in ``reduce_dtype`` too) do. Variants that divide nothing before are divided after, in FP64."""
    if variant not in REDUCTION_VARIANTS:
        raise ValueError(f"unknown reduction {variant!r}; known: {', '.join(REDUCTION_VARIANTS)}")
    if not isinstance(grads, torch.Tensor) or grads.dim() != 2 or grads.shape[0] < 1:
        raise ValueError("grads must be a [ranks, n] tensor with at least one rank")
    dtype, order, divide = REDUCTION_VARIANTS[variant]
    n = grads.shape[0]
    if divide == "none":
        return simulate_all_reduce(grads.float(), dtype, order).double() / n
    pre = n if divide == "N" else fsdp2_predivide(n)
    total = simulate_all_reduce(grads.float().to(dtype).div_(pre), dtype, order)
    return (total if pre == n else total / (n / pre)).double()


COMM_HOOKS = ("fp16", "bf16")
