"""Accumulation precision: the error of a K-long dot product summed with a narrower accumulator (as FP8 tensor
cores do), against K."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def _keep_significant_bits(x: torch.Tensor, bits: int, rounding: str) -> torch.Tensor:
    """FP32 values rounded to ``bits`` significant bits (the implicit 1 included), exponent range kept."""
    drop = 24 - bits
    if drop <= 0:
        return x
    i = x.view(torch.int32)
    if rounding == "nearest_even":
        lsb = (i >> drop) & 1
        i = i + ((1 << (drop - 1)) - 1) + lsb   # carries into the exponent correctly for finite values
    return (i & ~((1 << drop) - 1)).view(torch.float32)


@dataclass(frozen=True)
class AccumulationStudy:
    """Relative error of long dot products against exact (float64) sums, per accumulator, over lengths K.

    ``errors[label]``: one (median, max) pair per K, over ``dots`` independent dot products of FP8 (E4M3)
    inputs. ``rounding``: how the limited accumulator drops bits (a model assumption, see the lesson)."""

    ks: tuple[int, ...]
    accumulator_bits: int
    promote_every: int
    rounding: str
    dots: int
    errors: dict[str, tuple[tuple[float, float], ...]]


def accumulation_error(ks=(128, 256, 512, 1024, 2048, 4096, 8192), *, accumulator_bits: int = 14,
                       promote_every: int = 128, dots: int = 64, rounding: str = "toward_zero",
                       seed: int = 0) -> AccumulationStudy:
    """Dot products of length K of non-negative FP8 inputs (``|N(0, 1)|`` cast to E4M3, so every product is
    exact in FP32), summed three ways: an FP32 accumulator; an accumulator keeping ``accumulator_bits``
    significant bits (DeepSeek-V3 reports about 14 on H800 FP8 tensor cores); and the same, with the partial
    sum added into an FP32 total every ``promote_every`` products (DeepSeek-V3's fix, N_C = 128)."""
    ks = tuple(int(k) for k in ks)
    if not ks or any(k < 1 for k in ks):
        raise ValueError(f"ks must be positive lengths, got {ks}")
    if not isinstance(accumulator_bits, int) or not 2 <= accumulator_bits <= 24:
        raise ValueError(f"accumulator_bits must be an int in 2..24, got {accumulator_bits!r}")
    if not isinstance(promote_every, int) or promote_every < 1:
        raise ValueError(f"promote_every must be a positive int, got {promote_every!r}")
    if rounding not in ("toward_zero", "nearest_even"):
        raise ValueError(f"rounding must be 'toward_zero' or 'nearest_even', got {rounding!r}")
    gen = torch.Generator().manual_seed(seed)
    k_max = max(ks)
    a = torch.randn(dots, k_max, generator=gen).abs().to(torch.float8_e4m3fn).float()
    b = torch.randn(dots, k_max, generator=gen).abs().to(torch.float8_e4m3fn).float()
    products = a * b   # exact: 4-bit significands multiply into 8 bits
    exact = products.double().cumsum(dim=1)
    fp32 = torch.zeros(dots)
    limited = torch.zeros(dots)
    promoted_total, partial = torch.zeros(dots), torch.zeros(dots)
    labels = ("FP32 accumulator", f"{accumulator_bits}-bit accumulator",
              f"{accumulator_bits}-bit, promoted to FP32 every {promote_every}")
    out: dict[str, list[tuple[float, float]]] = {label: [] for label in labels}
    wanted = set(ks)
    for k in range(k_max):
        p = products[:, k]
        fp32 = fp32 + p
        limited = _keep_significant_bits(limited + p, accumulator_bits, rounding)
        partial = _keep_significant_bits(partial + p, accumulator_bits, rounding)
        if (k + 1) % promote_every == 0:
            promoted_total, partial = promoted_total + partial, torch.zeros(dots)
        if k + 1 in wanted:
            ref = exact[:, k]
            for label, value in zip(labels, (fp32, limited, promoted_total + partial)):
                rel = ((value.double() - ref).abs() / ref).tolist()
                rel.sort()
                out[label].append((rel[len(rel) // 2], rel[-1]))
    return AccumulationStudy(ks, accumulator_bits, promote_every, rounding, dots,
                             {label: tuple(v) for label, v in out.items()})
