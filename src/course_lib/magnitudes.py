"""Where a real model's numbers live: magnitudes of weights, activations, gradients and Adam moments.

Magnitudes are summarised as histograms of ``log2|x|`` with one bin per binade (power of two), counted
exactly over every element on the device the model runs on, so the full-size GPU model needs no copy of
its activations. Percentiles are read off the histogram (interpolated within a binade).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np
import torch

# Binades covered: 2**-160 (below every format's smallest subnormal except FP32's 2**-149) to 2**130.
LOG2_LO = -160
LOG2_HI = 130


@dataclass(frozen=True)
class LogHistogram:
    """Counts of ``floor(log2|x|)`` per binade, plus exact zeros, non-finite values, min and max.

    ``counts[i]`` counts values with ``2**(LOG2_LO+i) <= |x| < 2**(LOG2_LO+i+1)``; values below the range
    land in the first bin and above it in the last.
    """

    counts: tuple[int, ...]
    zeros: int
    nonfinite: int
    min_nonzero: float
    max_abs: float

    @property
    def total(self) -> int:
        return sum(self.counts) + self.zeros + self.nonfinite

    @property
    def nonzero(self) -> int:
        return sum(self.counts)

    @property
    def binade_edges(self) -> np.ndarray:
        """log2 of the left edge of each bin."""
        return np.arange(LOG2_LO, LOG2_LO + len(self.counts))

    def quantile(self, q: float) -> float:
        """Approximate ``q``-quantile of ``|x|`` over the finite non-zero values (log-interpolated)."""
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"q must lie in [0, 1], got {q}")
        n = self.nonzero
        if n == 0:
            return math.nan
        if q == 0.0:
            return self.min_nonzero
        if q == 1.0:
            return self.max_abs
        cum = np.cumsum(self.counts)
        target = q * n
        i = int(np.searchsorted(cum, target, side="left"))
        before = cum[i - 1] if i > 0 else 0
        within = (target - before) / self.counts[i]
        value = 2.0 ** (LOG2_LO + i + within)
        return float(min(max(value, self.min_nonzero), self.max_abs))

    def fraction_below(self, threshold: float) -> float:
        """Fraction of all finite values (zeros included) with ``|x| < threshold``, to binade accuracy.

        Exact when ``threshold`` is a power of two within the bins' range, at most the smallest non-zero
        magnitude (0 gives 0) or above the largest (inf gives 1). NaN when there is no finite value;
        ``ValueError`` for a negative or NaN threshold.
        """
        if isinstance(threshold, bool) or not isinstance(threshold, numbers.Real):
            raise TypeError(f"threshold must be a real number, got {type(threshold).__name__}")
        if not threshold >= 0:
            raise ValueError(f"threshold is a magnitude, so it must be >= 0 (not NaN), got {threshold}")
        finite = self.total - self.nonfinite
        if finite == 0:
            return math.nan
        # exact answers beyond the recorded extremes, where the edge bins (clamped) would only approximate
        if threshold == 0:
            return 0.0
        if threshold > self.max_abs:
            return 1.0
        if threshold <= self.min_nonzero:
            return self.zeros / finite
        k = math.floor(math.log2(threshold))
        idx = min(max(k - LOG2_LO, 0), len(self.counts))
        below: float = self.zeros + sum(self.counts[:idx])
        if 0 <= k - LOG2_LO < len(self.counts) and threshold != 2.0**k:
            frac = (math.log2(threshold) - k)
            below += self.counts[k - LOG2_LO] * frac
        return below / finite


class HistogramAccumulator:
    """Accumulates a :class:`LogHistogram` over many tensors, on their own device."""

    def __init__(self) -> None:
        self.counts: torch.Tensor | None = None
        self.zeros = 0
        self.nonfinite = 0
        self.min_nonzero = math.inf
        self.max_abs = 0.0

    def add(self, tensor: torch.Tensor) -> None:
        # float64 stays float64: in float32 its magnitudes beyond float32's range would count as inf or 0
        x = tensor.detach().abs().flatten()
        x = x.to(torch.promote_types(x.dtype, torch.float32))
        finite = torch.isfinite(x)
        self.nonfinite += int((~finite).sum())
        x = x[finite]
        nz = x[x > 0]
        self.zeros += int(x.numel() - nz.numel())
        if nz.numel() == 0:
            return
        self.min_nonzero = min(self.min_nonzero, float(nz.min()))
        self.max_abs = max(self.max_abs, float(nz.max()))
        # frexp's exponent is exact floor(log2) + 1, subnormals included
        _, e = torch.frexp(nz)
        idx = torch.clamp(e.to(torch.int64) - 1 - LOG2_LO, 0, LOG2_HI - LOG2_LO - 1)
        counts = torch.bincount(idx, minlength=LOG2_HI - LOG2_LO)
        self.counts = counts if self.counts is None else self.counts + counts

    def result(self) -> LogHistogram:
        counts = (tuple(int(c) for c in self.counts.cpu().tolist()) if self.counts is not None
                  else (0,) * (LOG2_HI - LOG2_LO))
        return LogHistogram(counts=counts, zeros=self.zeros, nonfinite=self.nonfinite,
                            min_nonzero=self.min_nonzero if self.min_nonzero < math.inf else math.nan,
                            max_abs=self.max_abs)


def log2_histogram(tensors: torch.Tensor | list[torch.Tensor]) -> LogHistogram:
    """A :class:`LogHistogram` of all elements of one tensor or a list of tensors."""
    if isinstance(tensors, torch.Tensor):
        tensors = [tensors]
    if not isinstance(tensors, (list, tuple)) or not all(isinstance(t, torch.Tensor) for t in tensors):
        raise TypeError("log2_histogram takes a tensor or a list of tensors")
    acc = HistogramAccumulator()
    for t in tensors:
        if not (t.is_floating_point()):
            raise TypeError(f"log2_histogram needs floating-point tensors, got {t.dtype}")
        acc.add(t)
    return acc.result()


TENSOR_KINDS = ("weights", "activations", "activation gradients", "weight gradients",
                "Adam first moment", "Adam second moment")


