"""The NVFP4 recipe's random Hadamard transform: the 16 x 16 Hadamard matrix, random signs and the transform."""

from __future__ import annotations

import math

import torch

HADAMARD_SIZE = 16


def hadamard_matrix(n: int = HADAMARD_SIZE, *, device: torch.device | str | None = None) -> torch.Tensor:
    """The orthonormal Sylvester-Hadamard matrix of order ``n`` (a power of two) on ``device`` (default the
    CPU): entries ±1/sqrt(n), symmetric, ``H @ H == I`` (exact in FP32 for n = 16: entries ±0.25)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or n & (n - 1):
        raise ValueError(f"a Hadamard order must be a power of two, got {n!r}")
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(n)


def random_signs(n: int = HADAMARD_SIZE, seed: int = 0) -> torch.Tensor:
    """``n`` fixed random signs (±1, FP32) from ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2, (n,), generator=gen).float() * 2 - 1


def random_hadamard(x: torch.Tensor, signs: torch.Tensor, *, inverse: bool = False) -> torch.Tensor:
    """The random Hadamard transform along the last dimension of ``x``, in independent groups of
    ``len(signs)``: each group ``v`` becomes ``v @ diag(signs) @ H`` (``inverse``: ``v @ H @ diag(signs)``).
    Orthogonal, so applied to both inputs of a product that reduces over this dimension it leaves the
    product unchanged, while it spreads an outlier over its group before quantisation."""
    return hadamard_groups(x, random_hadamard_matrix(signs, device=x.device, inverse=inverse))


def random_hadamard_matrix(signs: torch.Tensor, *, device: torch.device | str | None = None,
                           inverse: bool = False) -> torch.Tensor:
    """``diag(signs) @ H`` (``inverse``: its transpose), FP32 on ``device``: row ``i`` of ``H`` times
    ``signs[i]``, which is what the product with a diagonal matrix computes, exactly (entries ±1/sqrt(n))."""
    if not isinstance(signs, torch.Tensor) or signs.dim() != 1:
        raise ValueError("signs must be a 1-D tensor of ±1")
    signs = signs.to(device=device, dtype=torch.float32)
    m = signs[:, None] * hadamard_matrix(signs.numel(), device=signs.device)
    return m.t() if inverse else m


def hadamard_groups(x: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """Every group of ``n = len(matrix)`` consecutive values along the last dimension of ``x`` times
    ``matrix`` (``[n, n]``), in FP32, as one batched product: ``x`` viewed as ``[..., groups, n]`` @ ``matrix``
    (no loop over the groups)."""
    n = matrix.shape[0]
    if x.shape[-1] % n:
        raise ValueError(f"the last dimension ({x.shape[-1]}) must be a multiple of the transform size {n}")
    groups = x.float().reshape(*x.shape[:-1], x.shape[-1] // n, n)
    return (groups @ matrix.to(device=x.device, dtype=torch.float32)).reshape(x.shape)
