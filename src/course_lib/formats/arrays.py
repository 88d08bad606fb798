"""Array plumbing for the codecs: numpy arrays, Python numbers and torch tensors in, the same kind out."""

from __future__ import annotations

from typing import Union

import numpy as np
import torch

ArrayLike = Union[np.ndarray, torch.Tensor]


def to_tensor(x: ArrayLike | float | list, *, what: str) -> tuple[torch.Tensor, bool]:
    """Return (tensor, came_from_numpy). Python scalars and lists count as numpy input.

    Values are never rounded on the way in: float16 and the ml_dtypes types become float32, and long double
    becomes float64 only where every value fits float64 exactly; otherwise ``TypeError``, since rounding
    through float64 first and then to a format would round twice.
    """
    if isinstance(x, torch.Tensor):
        return x, False
    if isinstance(x, (float, int, list, tuple, np.generic)):
        x = np.asarray(x)
    if not isinstance(x, np.ndarray):
        raise TypeError(f"{what} must be a numpy array or torch tensor, got {type(x).__name__}")
    if x.dtype in (np.float32, np.float64) or x.dtype.kind in "iub":
        # (np.ascontiguousarray would turn a 0-d array into a 1-d one)
        return torch.from_numpy(x if x.flags.c_contiguous else x.copy()), True
    if x.dtype.kind == "f" and x.dtype.itemsize > 4:  # long double, whatever its width here
        with np.errstate(over="ignore"):  # beyond float64's range: counted as inexact just below
            as64 = x.astype(np.float64)
        inexact = int(np.count_nonzero((as64 != x) & ~np.isnan(x)))  # compared in long double: exact
        if inexact:
            raise TypeError(f"{what} has dtype {x.dtype}, and {inexact} of its {x.size} values are not float64 "
                            "values: going through float64 would round them twice; pass float64 or float32")
        return torch.from_numpy(as64), True
    if x.dtype.kind == "f" or x.dtype.kind == "V":
        # float16 and the ml_dtypes types (which numpy reports as kind 'V'): every value fits in float32
        return torch.from_numpy(x.astype(np.float32)), True
    raise TypeError(f"{what} has unsupported dtype {x.dtype}")


def like_input(t: torch.Tensor, numpy_input: bool) -> ArrayLike:
    """``t`` as numpy (on the host) if the input was numpy, else as is."""
    return t.cpu().numpy() if numpy_input else t
