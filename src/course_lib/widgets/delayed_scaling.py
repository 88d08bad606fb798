"""Lesson 7's explorer: delayed scaling against an amax spike, with the history length, the margin, the spike's
size and its step to move (``js/delayed_scaling_explorer.js``).

The page recomputes :func:`course_lib.studies.fp8.delayed_spike` for every setting: the same tensors per
step (the activation times a gain, times the spike's factor at the spike), the same three recipes (current
scaling, and Transformer Engine's delayed scaling with its amax history reduced by "max" and by "most
recent", :class:`course_lib.fp8.DelayedScaling`), the same FP32 products and saturating FP8 casts. A
tensor of the course model has too many values to embed, so the explorer takes a deterministic subsample
(every k-th value, plus the largest magnitude, so every step's amax, and so every scale, is the whole
tensor's), and :func:`spike_reference` runs the Python on that same subsample. The scales, the saturated
and flushed shares agree exactly; the relative error to about 2e-8, because the library dequantises in
float32 before it takes the (float64) norms, where the page works in float64 throughout
(tests/test_widgets_delayed_scaling.py measures both against a float64 recomputation).
"""

from __future__ import annotations

import base64
import json
import math
import numbers

import numpy as np
import torch

from ..fp8 import DelayedScaling, amax_to_scale, as_2d, fp8_format
from ..studies.fp8 import SPIKE_GAINS, delayed_spike, spike_gains
from .page import Explorer

HISTORY_MAX = 64    # the history slider's top
MARGIN_MAX = 10     # the margin slider's top (2**10: headroom for a thousandfold spike)
FACTOR_RANGE = (1e-3, 1e6)
FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _int_in(name: str, value, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must lie in {lo}..{hi}, got {value}")
    return int(value)


def _factor(value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"factor must be a number, got {type(value).__name__} {value!r}")
    if not (math.isfinite(value) and FACTOR_RANGE[0] <= value <= FACTOR_RANGE[1]):
        raise ValueError(f"factor (the spike's size) must lie in {FACTOR_RANGE[0]:g}..{FACTOR_RANGE[1]:g}, got {value!r}")
    return float(value)


def subsample(tensor: torch.Tensor, max_values: int) -> torch.Tensor:
    """At most ``max_values`` float32 values of ``tensor`` (flattened): every k-th, plus the one of largest
    magnitude where the stride missed it, in their order (so the amax is the whole tensor's)."""
    flat = as_2d(tensor, "tensor").detach().float().flatten().cpu()
    max_values = _int_in("max_values", max_values, 2, 1 << 20)
    if flat.numel() <= max_values:
        return flat.clone()
    stride = -(-flat.numel() // (max_values - 1))
    index = torch.arange(0, flat.numel(), stride)
    largest = int(flat.abs().argmax())
    if largest % stride:
        index = torch.sort(torch.cat([index, torch.tensor([largest])])).values
    return flat[index].clone()


def delayed_scaling_explorer(tensor: torch.Tensor, *, steps: int = 40, spike_at: int = 15, factor: float = 50.0,
                             amax_history_len: int = 16, margin: int = 0, fmt: str = "e4m3", seed: int = 0,
                             max_values: int = 4096) -> Explorer:
    """Sliders for delayed scaling's history length (1..64), margin (0..10) and the spike's step, and the
    spike's factor to type: per step, each recipe's scale, saturated share and relative error, drawn, with
    a summary. The settings given start it; ``steps`` and ``seed`` are fixed, as in :func:`delayed_spike`.
    ``tensor`` travels as :func:`subsample` (at most ``max_values`` float32 values, base64)."""
    name = fp8_format(fmt)
    steps = _int_in("steps", steps, 2, 1000)
    spike_at = _int_in("spike_at", spike_at, 0, steps - 1)
    amax_history_len = _int_in("amax_history_len", amax_history_len, 1, HISTORY_MAX)
    margin = _int_in("margin", margin, 0, MARGIN_MAX)
    factor = _factor(factor)
    seed = _int_in("seed", seed, 0, 2**63 - 1)
    values = subsample(tensor, max_values)
    if not bool(torch.isfinite(values).all()):
        raise ValueError("tensor holds inf or NaN: delayed scaling cannot cast it (find the overflow first)")
    amax = float(values.abs().max())
    if amax == 0:
        raise ValueError("tensor is all zeros: there is nothing to scale")
    if amax * SPIKE_GAINS[1] * FACTOR_RANGE[1] >= FLOAT32_MAX:
        raise ValueError(f"tensor's largest magnitude, {amax:g}, times a spike of up to {FACTOR_RANGE[1]:g} would "
                         "overflow float32")
    data = base64.b64encode(values.numpy().astype("<f4").tobytes()).decode("ascii")
    config = {"format": name, "values": data, "count": values.numel(), "of": as_2d(tensor).numel(),
              "gains": spike_gains(steps, seed), "gainRange": list(SPIKE_GAINS), "seed": seed, "steps": steps, "spikeAt": spike_at, "factor": factor,
              "history": amax_history_len, "margin": margin, "historyMax": HISTORY_MAX, "marginMax": MARGIN_MAX,
              "factorRange": list(FACTOR_RANGE)}
    return Explorer("delayed_scaling_explorer.js", config, "Delayed scaling explorer")


def config_values(config: dict) -> torch.Tensor:
    """The float32 values an explorer's configuration carries."""
    return torch.from_numpy(np.frombuffer(base64.b64decode(config["values"]), dtype="<f4").astype(np.float32))


def spike_reference(config: dict, *, spike_at: int, factor: float, amax_history_len: int, margin: int) -> dict:
    """What the explorer must show for these settings, from Python: :func:`delayed_spike` on the
    configuration's values, and the scale each recipe used per step (current: :func:`amax_to_scale` of the
    step's amax; delayed: :class:`DelayedScaling`'s state as it observes the amaxes). Returns ``{"amax":
    [...], "recipes": {name: {"scale", "saturated", "flushed", "error"}}}``, one value per step."""
    steps = config["steps"]
    run = delayed_spike(config_values(config), steps=steps, spike_at=_int_in("spike_at", spike_at, 0, steps - 1),
                        factor=_factor(factor), amax_history_len=_int_in("amax_history_len", amax_history_len, 1,
                                                                         HISTORY_MAX),
                        margin=_int_in("margin", margin, 0, MARGIN_MAX), fmt=config["format"], seed=config["seed"])
    scales: dict[str, list[float]] = {}
    for name in run.saturated:
        if name == "current":
            scales[name] = [float(amax_to_scale(torch.tensor(a), config["format"])) for a in run.amax]
            continue
        recipe = DelayedScaling(config["format"], amax_history_len=amax_history_len, margin=margin,
                                amax_compute_algo="most_recent" if name.endswith("most recent") else "max")
        scales[name] = []
        for a in run.amax:
            scales[name].append(recipe.current_scale)
            recipe.observe(a)
    return {"amax": list(run.amax),
            "recipes": {name: {"scale": scales[name], "saturated": list(run.saturated[name]),
                               "flushed": list(run.flushed[name]), "error": list(run.relative_error[name])}
                        for name in run.saturated}}


ERROR_TOLERANCE = 1e-5   # relative: the library's float32 dequantisation against the page's float64 (module doc)


def compare_with_reference(shown: dict, expected: dict, what: str = "delayed-scaling explorer") -> list[str]:
    """Problems where ``shown`` (the page's per-step series) differs from :func:`spike_reference`'s: amaxes,
    scales, saturated and flushed shares exactly, errors to ``ERROR_TOLERANCE`` relative."""
    problems = []
    if shown.get("amax") != expected["amax"]:
        problems.append(f"{what}: the per-step amaxes differ from Python's")
    if list(shown.get("recipes", {})) != list(expected["recipes"]):
        return [*problems, f"{what}: recipes {list(shown.get('recipes', {}))} on the page, "
                           f"{list(expected['recipes'])} in Python"]
    for name, series in expected["recipes"].items():
        mine = shown["recipes"][name]
        for key in ("scale", "saturated", "flushed"):
            bad = [t for t, (a, b) in enumerate(zip(mine[key], series[key])) if a != b]
            if bad or len(mine[key]) != len(series[key]):
                problems.append(f"{what}, {name}: {key} differs from Python's at steps {bad[:5]}")
        bad = [t for t, (a, b) in enumerate(zip(mine["error"], series["error"]))
               if not abs(a - b) <= ERROR_TOLERANCE * abs(b)]
        if bad or len(mine["error"]) != len(series["error"]):
            problems.append(f"{what}, {name}: relative error differs from Python's beyond {ERROR_TOLERANCE:g} at "
                            f"steps {bad[:5]}")
    return problems


def check_in_page(root, config: dict, *, timeout_ms: float = 5000) -> list[str]:
    """Drive one mounted delayed-scaling explorer in a built page (``root``: a Playwright Locator of its
    div): move its margin slider one step with the keyboard, wait for the chart to follow, and compare
    every step it now shows with :func:`spike_reference`. Returns the problems found (empty: it responds
    and agrees with Python); ``timeout_ms`` bounds each wait."""
    try:
        config_values(config)
        margin_max = _int_in("marginMax", config["marginMax"], 0, MARGIN_MAX)
    except (KeyError, TypeError, ValueError) as error:
        return [f"delayed-scaling explorer: unusable configuration ({error!r})"]
    slider = root.locator("[data-role=margin]")
    chart = root.locator("[data-role=chart]")
    try:
        before = json.loads(chart.get_attribute("data-settings", timeout=timeout_ms) or "{}")
        key = "ArrowRight" if before["margin"] < margin_max else "ArrowLeft"
        slider.press(key, timeout=timeout_ms)
        after = {**before, "margin": before["margin"] + (1 if key == "ArrowRight" else -1)}
        root.locator(f"[data-role=chart][data-margin='{after['margin']}']").wait_for(timeout=timeout_ms)
    except Exception as error:   # Playwright's errors (a missing element times out); course_lib does not import it
        return [f"delayed-scaling explorer: the chart did not follow the margin slider ({type(error).__name__})"]
    settings = json.loads(chart.get_attribute("data-settings") or "{}")
    if settings != after:
        return [f"delayed-scaling explorer: settings {settings} on the page after the margin step, expected {after}"]
    shown = json.loads(chart.get_attribute("data-series") or "{}")
    try:
        expected = spike_reference(config, spike_at=after["spikeAt"], factor=after["factor"],
                                   amax_history_len=after["history"], margin=after["margin"])
    except (KeyError, TypeError, ValueError) as error:
        return [f"delayed-scaling explorer: Python cannot rerun the page's settings {after} ({error!r})"]
    return compare_with_reference(shown, expected)
