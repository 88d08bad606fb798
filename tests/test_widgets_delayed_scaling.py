"""Lesson 7's delayed-scaling explorer (course_lib.widgets.delayed_scaling, js/delayed_scaling_explorer.js):
the subsample it embeds, the page's per-step amaxes, scales, saturated and flushed shares against
delayed_spike's (float64 bits) and its relative errors against torch's (1e-5: the library dequantises
in float32) and against a float64 recomputation (1e-12), over many settings; the controls, bad input, and
the book check's check_in_page."""

import json
import math
import random
import re

import pytest
import torch

from course_lib.fp8 import StaticScaling, as_2d, quantization_error
from course_lib.formats import get_format
from course_lib.studies.fp8 import delayed_spike
from course_lib.widgets.delayed_scaling import (
    check_in_page,
    compare_with_reference,
    config_values,
    delayed_scaling_explorer,
    spike_reference,
    subsample,
)
from course_lib.widgets.page import bundle


@pytest.fixture(scope="module")
def activation() -> torch.Tensor:
    """An activation-like [tokens, channels] tensor: channels of different sizes, one outlier channel, a few
    exact zeros and values so small that E4M3 flushes them."""
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(512, 64, generator=gen) * torch.exp(torch.randn(64, generator=gen))
    x[:, 5] *= 30
    x[::7, 9] = 0.0
    x[::5, 11] *= 1e-6
    return x


@pytest.fixture(scope="module")
def js_page(chromium):
    page = chromium.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content("<!doctype html><html><body></body></html>")
    page.add_script_tag(content=bundle("delayed_scaling_explorer.js", expose=("runSpike", "decodeValues", "castStats", "getFormat",
                                                                              "ticks", "tickText")),
                        type="module")
    page.wait_for_function("() => globalThis.courseLib")
    yield page
    page.close()
    assert not errors, errors


# every number goes back as its float64 bits (JSON would turn -0 into 0)
JS_RUN = """([config, s]) => {
  const run = courseLib.runSpike(courseLib.decodeValues(config.values), config.gains, {format: config.format,
    steps: config.steps, spikeAt: s.spike_at, factor: s.factor, history: s.amax_history_len, margin: s.margin});
  const dv = new DataView(new ArrayBuffer(8));
  const hex = (x) => { dv.setFloat64(0, x); return dv.getBigUint64(0).toString(16).padStart(16, "0"); };
  const recipes = {};
  for (const [name, r] of Object.entries(run.recipes)) {
    recipes[name] = Object.fromEntries(Object.entries(r).map(([k, v]) => [k, v.map(hex)]));
  }
  return { amax: run.amax.map(hex), recipes };
}"""


def from_hex(h: str) -> float:
    import struct

    return struct.unpack(">d", bytes.fromhex(h))[0]


def settings_to_try(steps: int = 40) -> list[dict]:
    edges = [dict(spike_at=15, factor=50.0, amax_history_len=16, margin=0),
             dict(spike_at=0, factor=1000.0, amax_history_len=1, margin=0),
             dict(spike_at=steps - 1, factor=1e6, amax_history_len=64, margin=10),
             dict(spike_at=1, factor=1.0, amax_history_len=2, margin=6),
             dict(spike_at=20, factor=1e-3, amax_history_len=5, margin=3),
             dict(spike_at=7, factor=37.3, amax_history_len=8, margin=1),      # not a float32: rounded to one
             dict(spike_at=30, factor=1 / 3, amax_history_len=40, margin=2)]
    rng = random.Random(3)
    return edges + [dict(spike_at=rng.randrange(steps), factor=10 ** rng.uniform(-3, 6),
                         amax_history_len=rng.randint(1, 64), margin=rng.randint(0, 10)) for _ in range(8)]


def float64_errors(config: dict, s: dict, reference: dict) -> dict[str, list[float]]:
    """The relative error of every step's cast, recomputed with the course's casts (StaticScaling at the
    scale the recipe used) and the norms summed in float64."""
    base = as_2d(config_values(config))
    gains = config["gains"]
    out: dict[str, list[float]] = {name: [] for name in reference["recipes"]}
    for t in range(config["steps"]):
        x = base * gains[t] * (s["factor"] if t == s["spike_at"] else 1.0)
        for name, series in reference["recipes"].items():
            back = StaticScaling(config["format"], scale=series["scale"][t]).round_trip(x)
            norm = float(torch.linalg.vector_norm(x.double()))
            out[name].append(float(torch.linalg.vector_norm((back - x).double())) / norm if norm > 0 else 0.0)
    return out


@pytest.mark.parametrize("fmt", ["e4m3", "e5m2"])
def test_every_step_agrees_with_python(js_page, activation, fmt):
    config = delayed_scaling_explorer(activation, fmt=fmt, max_values=2048).config
    exact_compared = exact_agreed = errors_compared = 0
    worst_torch = worst_float64 = 0.0
    for s in settings_to_try():
        js = js_page.evaluate(JS_RUN, [config, s])
        reference = spike_reference(config, **s)
        exact_compared += len(reference["amax"])
        exact_agreed += sum(from_hex(a) == b for a, b in zip(js["amax"], reference["amax"]))
        assert list(js["recipes"]) == list(reference["recipes"])
        f64 = float64_errors(config, s, reference)
        for name, series in reference["recipes"].items():
            mine = {k: [from_hex(h) for h in v] for k, v in js["recipes"][name].items()}
            for key in ("scale", "saturated", "flushed"):
                exact_compared += len(series[key])
                exact_agreed += sum(a == b for a, b in zip(mine[key], series[key]))
            for a, b, c in zip(mine["error"], series["error"], f64[name]):
                errors_compared += 1
                worst_torch = max(worst_torch, abs(a - b) / b if b else abs(a))
                worst_float64 = max(worst_float64, abs(a - c) / c if c else abs(a))
    assert exact_agreed == exact_compared, f"{exact_compared - exact_agreed} of {exact_compared} differ"
    assert worst_torch <= 1e-5 and worst_float64 <= 1e-12, (worst_torch, worst_float64)
    assert errors_compared == 15 * 40 * 3


JS_CAST = """([hexes, s, fmt]) => {
  const dv = new DataView(new ArrayBuffer(8));
  const x = hexes.map((h) => { dv.setBigUint64(0, BigInt("0x" + h)); return dv.getFloat64(0); });
  const r = courseLib.castStats(x, x.reduce((a, v) => a + v * v, 0), s, courseLib.getFormat(fmt));
  const hex = (v) => { dv.setFloat64(0, v); return dv.getBigUint64(0).toString(16).padStart(16, "0"); };
  return [hex(r.saturated), hex(r.flushed), hex(r.error)];
}"""


def edge_tensor(fmt: str, scale: float) -> torch.Tensor:
    """float32 values that the cast at ``scale`` puts on every edge: the saturation boundary (max plus half
    its spacing, a tie that rounds down to max in E4M3 and up in E5M2), the largest value, half the smallest
    subnormal (a tie to zero), the smallest subnormal and normal; each with its float32 neighbours, both
    signs, zeros of both signs, and random values over the whole range."""
    f = get_format(fmt)
    spacing = 2.0 ** (math.floor(math.log2(f.max_finite)) - f.mantissa_bits)
    edges = torch.tensor([f.max_finite + spacing / 2, f.max_finite, f.min_subnormal / 2, f.min_subnormal,
                          f.min_normal, f.min_normal - f.min_subnormal / 2], dtype=torch.float64) / scale
    edges = edges.float()
    around = torch.cat([edges, torch.nextafter(edges, torch.zeros_like(edges)),
                        torch.nextafter(edges, torch.full_like(edges, math.inf))])
    gen = torch.Generator().manual_seed(11)
    spread = torch.randn(500, generator=gen) * torch.exp2(torch.randint(-30, 20, (500,), generator=gen)) / scale
    return torch.cat([around, -around, torch.tensor([0.0, -0.0]), spread.float()])


@pytest.mark.parametrize("fmt", ["FP8 E4M3", "FP8 E5M2"])
def test_one_cast_at_every_edge_agrees_with_quantization_error(js_page, fmt):
    import struct

    for scale in (1.0, 0.125, float(torch.tensor(0.1).float()), float(torch.tensor(3.7).float()), 2.0**20):
        x = edge_tensor(fmt, scale)
        exact = [struct.pack(">d", float(v)).hex() for v in x.double()]
        saturated, flushed, error = (from_hex(h) for h in js_page.evaluate(JS_CAST, [exact, scale, fmt]))
        q = quantization_error(x, StaticScaling(fmt, scale=scale))
        assert (saturated, flushed) == (q.saturated, q.flushed), (fmt, scale)
        back = StaticScaling(fmt, scale=scale).round_trip(x)
        float64 = float(torch.linalg.vector_norm((back - x).double())) / float(torch.linalg.vector_norm(x.double()))
        assert abs(error - float64) <= 1e-12 * float64 and abs(error - q.relative_error) <= 1e-5 * q.relative_error
        assert 0 < q.saturated < 1 and q.flushed > 0     # the edges are really there


def test_subsample_keeps_the_largest_value_so_the_scales_are_the_whole_tensors(activation):
    small = subsample(activation, 1000)
    assert small.numel() <= 1000 and small.dtype == torch.float32
    assert float(small.abs().max()) == float(activation.abs().max())
    assert torch.equal(subsample(activation, 1000), small)            # deterministic
    assert torch.equal(subsample(activation[:10], 1000), activation[:10].flatten())
    whole = delayed_spike(activation, amax_history_len=16)
    part = delayed_spike(small, amax_history_len=16)
    assert part.amax == whole.amax
    config = delayed_scaling_explorer(activation, max_values=1000).config
    assert torch.equal(config_values(config), small)
    # the gains the page is given are delayed_spike's own: its amaxes follow from them
    assert spike_reference(config, spike_at=15, factor=50.0, amax_history_len=16, margin=0)["amax"] == list(whole.amax)


def shown(root) -> tuple[dict, dict]:
    chart = root.locator("[data-role=chart]")
    return json.loads(chart.get_attribute("data-settings")), json.loads(chart.get_attribute("data-series"))


def test_controls_redraw_with_pythons_numbers(page_with, activation):
    explorer = delayed_scaling_explorer(activation, max_values=1024)
    page = page_with(explorer.html())
    root = page.locator(".course-explorer")
    settings, series = shown(root)
    assert settings == {"history": 16, "margin": 0, "spikeAt": 15, "factor": 50}

    def agrees(settings, series):
        reference = spike_reference(explorer.config, spike_at=settings["spikeAt"], factor=settings["factor"],
                                    amax_history_len=settings["history"], margin=settings["margin"])
        return compare_with_reference(series, reference) == []

    assert agrees(settings, series)
    summary = root.locator("[data-role=summary]").text_content()
    root.locator("[data-role=margin]").press("ArrowRight")
    page.wait_for_selector("[data-role=chart][data-margin='1']")
    assert agrees(*shown(root)) and root.locator("[data-role=summary]").text_content() != summary
    root.locator("[data-role=history]").press("Home")
    root.locator("[data-role=spike-step]").press("ArrowLeft")
    root.locator("[data-role=factor]").fill("64")
    settings, series = shown(root)
    assert settings == {"history": 1, "margin": 1, "spikeAt": 14, "factor": 64}
    assert agrees(settings, series)
    assert "×64" in root.locator("[data-role=summary]").text_content()
    delayed = root.locator("tr[data-recipe='delayed, max of 1'] td")
    reference = spike_reference(explorer.config, spike_at=14, factor=64, amax_history_len=1, margin=1)
    saturated = reference["recipes"]["delayed, max of 1"]["saturated"][14]
    assert delayed.nth(2).text_content() == f"{100 * saturated:.2f}%"
    assert page.locator("[data-role=chart] svg path").count() == 9     # three recipes in three panels
    # the before-the-spike columns: error and flushed share per recipe, the flushed share with three decimals
    # always (0 too: "0.000%", never a "0%" beside "0.00519%")
    for name, series in reference["recipes"].items():
        cells = root.locator(f"tr[data-recipe='{name}'] td")
        quiet_flushed = sum(series["flushed"][:14]) / 14
        assert cells.nth(6).text_content() == f"{100 * quiet_flushed:.3f}%"


def test_the_flushed_column_has_one_format_zero_included(page_with, activation):
    page = page_with(delayed_scaling_explorer(activation, max_values=1024, margin=6).html())
    column = page.locator("[data-role=table] tbody tr td:nth-child(7)").all_text_contents()
    assert len(column) == 3 and all(re.fullmatch(r"\d+\.\d{3}%", c) for c in column), column
    assert any(c != "0.000%" for c in column), column     # this activation flushes its tiny channel
    page = page_with(delayed_scaling_explorer(torch.linspace(0.5, 2.0, 4096).reshape(64, 64)).html())
    column = page.locator("[data-role=table] tbody tr td:nth-child(7)").all_text_contents()
    assert column == ["0.000%"] * 3        # nothing flushes: zero in the same format


def test_every_log_axis_has_two_labelled_ticks_at_least(js_page):
    """ticks() on a log axis: powers of ten, 2 and 5 between them, and where a range holds fewer than two
    of those (0.0178 to 0.0316, the relative error at margin 6), round linear steps; always two or more, in
    range, and with distinct labels."""
    rng = random.Random(3)
    quarter = [(10 ** (a / 4), 10 ** (b / 4)) for a in range(-40, 40, 3) for b in range(a + 1, a + 50, 2)]
    spans = quarter + [(lo, lo * 10 ** rng.uniform(0.25, 12)) for lo in (10 ** rng.uniform(-9, 6) for _ in range(300))]
    got = js_page.evaluate("(spans) => spans.map(([lo, hi]) => { const t = courseLib.ticks(lo, hi, true);"
                           " return [t, t.map(courseLib.tickText)]; })", spans)
    for (lo, hi), (t, labels) in zip(spans, got):
        assert len(t) >= 2 and len(set(labels)) == len(labels), (lo, hi, labels)
        assert all(lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9) for v in t), (lo, hi, t)
        assert len(t) <= 12, (lo, hi, labels)
    short = js_page.evaluate("() => courseLib.ticks(10 ** -1.75, 10 ** -1.5, true).map(courseLib.tickText)")
    assert short == ["0.02", "0.025", "0.03"]
    assert js_page.evaluate("() => [0.0025, 0.001, 20000, 0.5].map(courseLib.tickText)") == ["2.5e-3", "1e-3", "2e4", "0.5"]


def test_the_rendered_panels_label_two_ticks_at_least(page_with, activation):
    page = page_with(delayed_scaling_explorer(activation, max_values=1024).html())
    root = page.locator(".course-explorer")
    count = """() => [...document.querySelectorAll('[data-role=chart] svg rect')].map((r) => {
      const y0 = +r.getAttribute('y'), y1 = y0 + +r.getAttribute('height');
      return [...document.querySelectorAll('[data-role=chart] svg text[text-anchor=end]')]
        .filter((t) => +t.getAttribute('y') >= y0 - 1 && +t.getAttribute('y') <= y1 + 5).length; })"""
    for margin in range(11):
        page.wait_for_selector(f"[data-role=chart][data-margin='{margin}']")
        assert all(n >= 2 for n in page.evaluate(count)), (margin, page.evaluate(count))
        root.locator("[data-role=margin]").press("ArrowRight")


@pytest.mark.parametrize("text, says", [("", "type the spike's factor, e.g. 50"),
                                        ("abc", '"abc" is not a number: write it like 50, 0.5 or 1e3'),
                                        ("x-2", "write it like 50, 0.5 or 1e3"), ("0", "must lie between"),
                                        ("-3", "must lie between"), ("1e7", "must lie between"),
                                        ("1e400", "beyond float64"), ("nan", "must lie between")])
def test_a_bad_factor_shows_a_message_and_keeps_the_chart(page_with, activation, text, says):
    page = page_with(delayed_scaling_explorer(activation, max_values=512).html())
    root = page.locator(".course-explorer")
    before = shown(root)
    root.locator("[data-role=factor]").fill(text)
    message = root.locator("[data-role=message]").text_content()
    assert says in message and "-2.5" not in message     # no hint that a factor could be negative
    assert shown(root) == before
    root.locator("[data-role=factor]").fill("20")
    assert root.locator("[data-role=message]").text_content() == ""
    assert shown(root)[0]["factor"] == 20


def test_check_in_page_passes_a_working_explorer_and_catches_a_dead_or_wrong_one(page_with, activation):
    explorer = delayed_scaling_explorer(activation, max_values=512, margin=10)
    page = page_with(explorer.html())
    root = page.locator(".course-explorer")
    assert check_in_page(root, explorer.config) == []        # at the top: the margin steps down
    assert shown(root)[0]["margin"] == 9
    assert check_in_page(root, explorer.config) == []        # and now up
    wrong = {**explorer.config, "seed": 1}                    # other gains: other amaxes, other scales
    assert any("differ" in p for p in check_in_page(root, wrong))
    page.evaluate("() => { const s = document.querySelector('[data-role=margin]'); s.replaceWith(s.cloneNode(true)); }")
    assert "unusable configuration" in check_in_page(root, {"values": "%%"})[0]
    problems = check_in_page(root, explorer.config, timeout_ms=500)
    assert len(problems) == 1 and "did not follow" in problems[0]


def test_refuses_bad_arguments(activation):
    with pytest.raises(TypeError, match="must be a torch tensor"):
        delayed_scaling_explorer([1.0, 2.0])
    with pytest.raises(TypeError, match="floating point"):
        delayed_scaling_explorer(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="inf or NaN"):
        delayed_scaling_explorer(torch.tensor([1.0, math.nan]))
    with pytest.raises(ValueError, match="all zeros"):
        delayed_scaling_explorer(torch.zeros(4))
    with pytest.raises(ValueError, match="overflow float32"):
        delayed_scaling_explorer(torch.tensor([1e34]))
    with pytest.raises(ValueError, match="spike_at must lie in 0..39"):
        delayed_scaling_explorer(activation, spike_at=40)
    with pytest.raises(ValueError, match="amax_history_len must lie in 1..64"):
        delayed_scaling_explorer(activation, amax_history_len=0)
    with pytest.raises(TypeError, match="margin must be an integer"):
        delayed_scaling_explorer(activation, margin=1.5)
    with pytest.raises(ValueError, match="margin must lie in 0..10"):
        delayed_scaling_explorer(activation, margin=11)
    with pytest.raises(ValueError, match="factor"):
        delayed_scaling_explorer(activation, factor=math.inf)
    with pytest.raises(TypeError, match="factor must be a number"):
        delayed_scaling_explorer(activation, factor=True)
    with pytest.raises(ValueError, match="unknown FP8 format"):
        delayed_scaling_explorer(activation, fmt="e3m4")
    with pytest.raises(ValueError, match="steps must lie in 2..1000"):
        delayed_scaling_explorer(activation, steps=1)
    with pytest.raises(ValueError, match="max_values must lie in"):
        delayed_scaling_explorer(activation, max_values=1)
