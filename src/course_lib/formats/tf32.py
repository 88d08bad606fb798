"""TF32 checked against the hardware: a GPU's TF32 matmul ``A @ I`` compared with the codec's TF32 rounding
under each rounding rule."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..hardware import tf32_matmuls
from .codecs import Rounding, round_to_format


@dataclass(frozen=True)
class TF32Check:
    """How a TF32 matmul ``A @ I`` compares, bit for bit, with rounding ``A`` to TF32 in software.

    ``agreement`` maps each rounding rule to the fraction of elements whose bits match exactly.
    """

    n: int
    device: str
    agreement: dict[str, float]

    @property
    def best_rule(self) -> str:
        return max(self.agreement, key=lambda rule: self.agreement[rule])

    @property
    def bit_exact(self) -> bool:
        return self.agreement[self.best_rule] == 1.0


def tf32_rounding_agreement(a: torch.Tensor, product: torch.Tensor) -> dict[str, float]:
    """Fraction of elements of ``product`` equal bit for bit to ``a`` rounded to TF32, per rounding rule."""
    if not isinstance(a, torch.Tensor) or not isinstance(product, torch.Tensor):
        raise TypeError("a and product must be torch tensors")
    if a.dtype != torch.float32 or product.dtype != torch.float32:
        raise TypeError(f"a and product must be float32, got {a.dtype} and {product.dtype}")
    if a.shape != product.shape:
        raise ValueError(f"shapes differ: {tuple(a.shape)} vs {tuple(product.shape)}")
    got = product.contiguous().view(torch.int32)
    out: dict[str, float] = {}
    rule: Rounding
    for rule in ("nearest_even", "nearest_away", "toward_zero"):
        rounded = round_to_format(a, "TF32", rounding=rule)
        assert isinstance(rounded, torch.Tensor)
        want = rounded.contiguous().view(torch.int32)
        out[rule] = float((got == want).double().mean())
    return out


# the check's matrix: standard normal values, each scaled by 2**k with k drawn from range(*TF32_SCALE_EXPONENTS)
TF32_SCALE_EXPONENTS = (-20, 20)


def tf32_matmul_check(n: int, device: torch.device | str, *, seed: int = 0) -> TF32Check:
    """Multiply a random ``n x n`` float32 matrix (standard normal values scaled by powers of two, see
    :data:`TF32_SCALE_EXPONENTS`) by the identity with TF32 on.

    With TF32 enabled, the tensor cores see the inputs rounded to TF32; the identity and the float32
    accumulation are exact, so the product *is* A as the hardware rounded it. Needs a CUDA GPU.
    """
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError("tf32_matmul_check needs a CUDA device: TF32 is a GPU tensor-core format")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    gen = torch.Generator().manual_seed(seed)
    normal = torch.randn(n, n, generator=gen)   # drawn first, then the exponents: the generator's order
    a = normal * torch.exp2(torch.randint(*TF32_SCALE_EXPONENTS, (n, n), generator=gen).float())
    a = a.to(device)
    eye = torch.eye(n, device=device)
    with tf32_matmuls(True):   # allow TF32 tensor cores for float32 matmuls
        product = a @ eye
        torch.cuda.synchronize(device)
    return TF32Check(n=n, device=str(device), agreement=tf32_rounding_agreement(a, product))
