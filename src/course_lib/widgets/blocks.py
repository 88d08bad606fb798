"""Lesson 8's explorer: one block of 32 values with an outlier to drag, quantised as MXFP8, MXFP4 (FLOOR or
RCEIL) or NVFP4 (``js/block_explorer.js``). The JavaScript ports :meth:`course_lib.mx.BlockScaling.quantize`
(its FP32 steps reproduced with ``Math.fround``); :func:`quantize_block` is the Python it is checked against,
bit for bit, in tests/test_widgets_blocks.py and in the built book (:func:`check_in_page`).

What the explorer assumes: the 32 values are the whole tensor. An MX format gives them one E8M0 scale (one
block of 32); NVFP4 makes them two blocks of 16, each with its E4M3 scale, under one FP32 tensor scale
computed from these 32 values (``amax / (448 * 6)``, as :class:`~course_lib.mx.BlockScaling` does for any
tensor), so the outlier's block and the other block can be compared.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..mx import BlockScaling, block_error
from .page import Explorer

BLOCK_SIZE = 32

# display name -> the library's scaling; the JavaScript holds the same table (BLOCK_FORMATS), and the tests
# check every entry against this one
BLOCK_FORMATS: dict[str, BlockScaling] = {
    "MXFP8 FLOOR": BlockScaling("e4m3", 32, mode="floor"),
    "MXFP8 RCEIL": BlockScaling("e4m3", 32, mode="rceil"),
    "MXFP4 FLOOR": BlockScaling("e2m1", 32, mode="floor"),
    "MXFP4 RCEIL": BlockScaling("e2m1", 32, mode="rceil"),
    "NVFP4": BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True),
}

DEFAULT_SEED = 0
# the top of the outlier's slider (and of a drag), log2 of its magnitude, as js/block_explorer.js has it: every
# stored value stays finite in FP32 below it (MXFP4 RCEIL stores about 2**127.81 and up as 4 * 2**126 = inf)
OUTLIER_LOG2_MAX = 127.75


def default_block() -> list[float]:
    """The explorer's default values: 32 draws from a standard normal (``torch.randn``, seed 0), in FP32."""
    generator = torch.Generator().manual_seed(DEFAULT_SEED)
    return torch.randn(BLOCK_SIZE, generator=generator).tolist()


def block_format(name: str) -> str:
    """The explorer's name for a block format (see :data:`BLOCK_FORMATS`; case and spaces are forgiven)."""
    if not isinstance(name, str):
        raise TypeError(f"format must be a name such as 'MXFP4 RCEIL', not {type(name).__name__}")
    key = " ".join(name.upper().replace("_", " ").split())
    if key not in BLOCK_FORMATS:
        raise ValueError(f"unknown block format {name!r}; known: {', '.join(BLOCK_FORMATS)}")
    return key


@dataclass(frozen=True)
class QuantizedBlock:
    """One block of 32 values quantised by the library, as the explorer shows it.

    ``values``: the inputs in FP32 (float64 holding FP32 values). ``scale_codes`` / ``scales``: one per
    block (MX: one E8M0 code, the unbiased exponent + 127, and its power of two; NVFP4: two E4M3 codes and
    values). ``tensor_scale``: NVFP4's FP32 tensor scale (1.0 for MX). ``element_codes`` / ``elements``: each
    element's bit pattern and value in the element format; ``dequantised``: element times its block's scale
    (times the tensor scale), in FP32. ``saturated``: how many elements the clamp at the element format's
    largest value changed; ``flushed``: how many non-zero values became 0. ``relative_error``: the block's
    relative L2 error, :func:`~course_lib.mx.block_error` (FP32 dequantisation, float64 norms, in torch); ``other_error``: the same
    without the outlier (``nan`` when no outlier was named)."""

    format: str
    values: tuple[float, ...]
    scale_codes: tuple[int, ...]
    scales: tuple[float, ...]
    tensor_scale: float
    element_codes: tuple[int, ...]
    elements: tuple[float, ...]
    dequantised: tuple[float, ...]
    saturated: int
    flushed: int
    relative_error: float
    other_error: float


def _as_block(values: Any) -> torch.Tensor:
    if isinstance(values, torch.Tensor):
        t = values.detach().to("cpu")
        if not t.is_floating_point():
            t = t.double()
    else:
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) and not hasattr(values, "__array__"):
            raise TypeError(f"values must be a sequence of {BLOCK_SIZE} numbers, not {type(values).__name__}")
        items = list(values.tolist() if hasattr(values, "tolist") else values)
        for v in items:
            if isinstance(v, bool) or not isinstance(v, numbers.Real):
                raise TypeError(f"values must be numbers, got {v!r}")
        t = torch.tensor([float(v) for v in items], dtype=torch.float64)
    if t.numel() != BLOCK_SIZE:
        raise ValueError(f"a block holds {BLOCK_SIZE} values, got {t.numel()} (shape {tuple(t.shape)})")
    return t.reshape(BLOCK_SIZE)


def quantize_block(values: Any, format: str, *, outlier_index: int | None = None) -> QuantizedBlock:
    """Quantise 32 values (numbers, rounded to FP32 first as the library does) as one tensor in ``format``
    with :class:`~course_lib.mx.BlockScaling`, and measure the error with :func:`~course_lib.mx.block_error`
    (with ``outlier_index``: also without that element).

    Raises ValueError for inf or NaN among the values (in FP32: beyond about 3.4e38 too), as the library does,
    and, as the library does, where NVFP4's own arithmetic breaks down (a tensor whose largest magnitude is
    below about 8e-36: ``1 / tensor_scale`` overflows FP32)."""
    name = block_format(format)
    x = _as_block(values).float().reshape(1, BLOCK_SIZE)
    if outlier_index is not None:
        _check_index(outlier_index)
    scaling = BLOCK_FORMATS[name]
    q = scaling.quantize(x)            # refuses inf and NaN, and NVFP4 tensors too small for its tensor scale
    back = q.dequantize()[0]
    scale_codes = q.scale_codes().view(torch.uint8)[0].tolist()   # E8M0 or E4M3 bit patterns
    whole = block_error(x, scaling)
    other = block_error(x, scaling, skip_columns=(outlier_index,)) if outlier_index is not None else None
    nonzero = x[0] != 0
    return QuantizedBlock(
        name, tuple(x[0].tolist()), tuple(int(c) for c in scale_codes), tuple(q.block_scales[0].tolist()),
        float(q.tensor_scale), tuple(q.element_codes()[0].tolist()), tuple(q.elements[0].tolist()),
        tuple(back.tolist()), q.saturated, int(((back == 0) & nonzero).sum()), whole.relative_error,
        other.relative_error if other is not None else math.nan)


def _check_index(outlier_index: Any) -> int:
    if isinstance(outlier_index, bool) or not isinstance(outlier_index, int):
        raise TypeError(f"outlier_index must be an int, not {type(outlier_index).__name__}")
    if not 0 <= outlier_index < BLOCK_SIZE:
        raise ValueError(f"outlier_index must lie in 0..{BLOCK_SIZE - 1}, got {outlier_index}")
    return outlier_index


def block_explorer(values: Any = None, *, outlier_index: int = 5, outlier: float | None = None,
                   format: str = "MXFP4 RCEIL") -> Explorer:
    """One block of 32 values, one of them an outlier to drag (or type, or slide), quantised in the page as
    MXFP8 or MXFP4 (E8M0 scale by FLOOR or RCEIL) or NVFP4: the block scale(s), each element's code, what
    each value becomes, the error, and how many values flush to zero as the outlier raises the scale.

    ``values``: 32 finite numbers (a list, array or tensor; rounded to FP32), default :func:`default_block`.
    ``outlier_index``: the element that is the outlier (0..31). ``outlier``: its starting value (default:
    twice the block's largest magnitude as given (at most 2**127.75), to three significant digits, so that the explorer
    starts with few values flushed and dragging the outlier up shows the damage grow; it replaces
    ``values[outlier_index]``). ``format``: one of :data:`BLOCK_FORMATS`. NVFP4 treats the 32 values as two
    blocks of 16 under one FP32 tensor scale (this module's docstring says why)."""
    name = block_format(format)
    _check_index(outlier_index)
    x = _as_block(default_block() if values is None else values).float().double()
    if not bool(torch.isfinite(x).all()):
        raise ValueError("values must be finite numbers within FP32's range (about 3.4e38): the block formats "
                         "cannot scale inf or NaN")
    if outlier is None:
        largest = float(x.abs().max())
        start = float(f"{min(2 * largest, 2.0**OUTLIER_LOG2_MAX):.3g}") if largest > 0 else 1.0
    else:
        if isinstance(outlier, bool) or not isinstance(outlier, (int, float)):
            raise TypeError(f"outlier must be a number, not {type(outlier).__name__}")
        start = float(outlier)
        if not math.isfinite(start) or abs(start) > torch.finfo(torch.float32).max:
            raise ValueError(f"outlier must be finite within FP32's range (about 3.4e38), got {outlier}")
    text = str(int(start)) if start.is_integer() and abs(start) < 1e15 else repr(start)
    config = {"values": x.tolist(), "outlierIndex": outlier_index, "outlier": text,
              "format": name, "formats": list(BLOCK_FORMATS)}
    return Explorer("block_explorer.js", config, "Block scaling explorer")


def _displayed(root) -> dict[str, Any]:
    summary = root.locator("[data-role=summary]")
    codes = root.locator("[data-role=code]")
    return {
        "scale_codes": [int(c) for c in (summary.get_attribute("data-scale-codes") or "").split(",") if c],
        "element_codes": [int(codes.nth(i).get_attribute("data-code") or "-1") for i in range(codes.count())],
        "dequantised": [float(codes.nth(i).get_attribute("data-dequantised") or "nan") for i in range(codes.count())],
        "error": float(summary.get_attribute("data-error") or "nan"),
        "flushed": int(summary.get_attribute("data-flushed") or "-1"),
        "text": summary.inner_text(),
    }


def check_in_page(root, config: dict, *, timeout_ms: float = 5000) -> list[str]:
    """The browser check for one mounted block explorer: type a new outlier value (2**20 times the block's
    largest magnitude, or 2**-20 times near FP32's top), wait for the display to follow, and compare the
    scale codes, element codes, dequantised values, flushed count and error it shows with
    :func:`quantize_block` on the same values. ``root``: a Playwright Locator for the explorer's div. Returns
    the problems found (empty when all agree)."""
    problems: list[str] = []
    try:
        values = [float(v) for v in config["values"]]
        index = _check_index(config["outlierIndex"])
    except (KeyError, TypeError, ValueError) as error:
        return [f"block explorer: unusable configuration ({error!r})"]
    try:   # Playwright's errors (a missing element times out) are Exceptions; course_lib does not import it
        name = block_format(root.locator("[data-role=format]").input_value(timeout=timeout_ms))
        box = root.locator("[data-role=outlier]")
        box.input_value(timeout=timeout_ms)
    except Exception as error:
        return [f"block explorer: no format selector or outlier box to use ({type(error).__name__}: {error})"]
    finite = [abs(v) for i, v in enumerate(values) if i != index and math.isfinite(v)]
    amax = max(finite, default=0.0)
    # a new outlier far above the others (so the scale must change), well inside FP32 so that its stored
    # value cannot overflow (MXFP4 RCEIL stores amax near 2**128 as inf)
    target = amax * 2.0**20 if 0 < amax < 1e6 else (amax * 2.0**-20 if amax > 0 else 1000.0)
    text = f"{target:.3g}"
    if text == box.input_value():       # already showing it: waiting for it would prove nothing
        text = f"{2 * target:.3g}"
    try:
        box.fill(text, timeout=timeout_ms)
        root.locator(f'[data-role=summary][data-outlier-text="{text}"]').wait_for(timeout=timeout_ms)
    except Exception:   # Playwright's TimeoutError
        return [f"block explorer: typing {text} as the outlier changed nothing within {timeout_ms:.0f} ms"]
    values[index] = float(text)
    try:
        want = quantize_block(values, name, outlier_index=index)
        shown = _displayed(root)
    except Exception as error:   # the library refuses the block, or the page shows something unreadable
        return [f"block explorer ({name}, outlier {text}): cannot compare ({type(error).__name__}: {error})"]
    if shown["scale_codes"] != list(want.scale_codes):
        problems.append(f"block explorer ({name}, outlier {text}): scale codes {shown['scale_codes']}, "
                        f"Python {list(want.scale_codes)}")
    if str(want.scale_codes[0]) not in shown["text"]:
        problems.append(f"block explorer ({name}, outlier {text}): the readout does not show scale code "
                        f"{want.scale_codes[0]}: {shown['text'][:120]!r}")
    if shown["element_codes"] != list(want.element_codes):
        problems.append(f"block explorer ({name}, outlier {text}): element codes {shown['element_codes']}, "
                        f"Python {list(want.element_codes)}")
    if shown["dequantised"] != list(want.dequantised):
        problems.append(f"block explorer ({name}, outlier {text}): dequantised values differ from Python's")
    if shown["flushed"] != want.flushed:
        problems.append(f"block explorer ({name}, outlier {text}): {shown['flushed']} flushed, Python {want.flushed}")
    # the page sums the error in float64, the library in FP32 (torch): they agree to float32 rounding
    if math.isfinite(want.relative_error) and not math.isclose(shown["error"], want.relative_error, rel_tol=1e-5, abs_tol=1e-12):
        problems.append(f"block explorer ({name}, outlier {text}): error {shown['error']}, "
                        f"Python {want.relative_error}")
    return problems
