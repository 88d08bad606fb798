"""Lesson 3's loss-scale explorer (course_lib.widgets.loss_scale, js/loss_scale_explorer.js): the cells the
gradients travel as, the page's counts and shares against summarize_underflow and sweep_loss_scale (every
power-of-two scale from 2**-30 to 2**60, every signed format, shares compared by their float64 bits), the
controls, bad input, and the book check's check_in_page."""

import math
import struct

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.colors import to_hex, to_rgb

from course_lib.formats import get_format, list_formats
from course_lib.gradients import capture_gradients, sweep_loss_scale
from course_lib.models import DeepMLP, regression_batch
from course_lib.plots import plot_scale_sweep
from course_lib.widgets.loss_scale import (
    CLASSES,
    check_in_page,
    gradient_cells,
    loss_scale_explorer,
    rounding_edges,
    shares_from_config,
)
from course_lib.widgets.page import bundle

SIGNED = [f.name for f in list_formats() if f.signed]
SCALES = list(range(-30, 61))


@pytest.fixture(scope="module")
def gradients() -> torch.Tensor:
    """Real activation gradients of a deep MLP (their magnitudes span many binades), float32."""
    mlp = DeepMLP(width=48, depth=12)
    x, y = regression_batch(48, 32, step=0)
    return capture_gradients(mlp, lambda m: ((m(x) - y) ** 2).mean()).all_values("activation")


def boundary_values(fmt: str) -> torch.Tensor:
    """Every rounding edge of ``fmt`` and its float64 neighbours, both signs, times 2**j (j in -40..40): at
    some scale each lands exactly on an edge (ties included). Plus zeros, which the explorer leaves out."""
    edges = np.array(rounding_edges(fmt))
    around = np.concatenate([edges, np.nextafter(edges, 0), np.nextafter(edges, np.inf),
                             edges * (1 + 2.0**-30), edges * (1 - 2.0**-30)])
    scaled = np.concatenate([around * 2.0**j for j in range(-40, 41)])
    return torch.tensor(np.concatenate([scaled, -scaled[::3], [0.0, -0.0]]), dtype=torch.float64)


def hex64(x: float) -> str:
    return struct.pack(">d", x).hex()


JS_SHARES = """([config, ks]) => ks.map((k) => {
  const s = courseLib.sharesAt(config, k);
  const hex = (x) => { const d = new DataView(new ArrayBuffer(8)); d.setFloat64(0, x);
    return d.getBigUint64(0).toString(16).padStart(16, "0"); };
  return { counts: s.counts, flushed: hex(s.flushed), subnormal: hex(s.subnormal), overflow: hex(s.overflow),
           survive: hex(s.survive), normal: hex(s.normal) };
})"""


@pytest.fixture(scope="module")
def js_page(chromium):
    page = chromium.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content("<!doctype html><html><body></body></html>")
    page.add_script_tag(content=bundle("loss_scale_explorer.js", expose=("sharesAt", "classify", "parseScale", "COLOURS")),
                        type="module")
    page.wait_for_function("() => globalThis.courseLib")
    yield page
    page.close()
    assert not errors, errors


def test_rounding_edges_come_from_the_format():
    assert rounding_edges("FP16") == (2.0**-25, 2.0**-14 - 2.0**-25, 65504.0, 65520.0)
    assert rounding_edges("FP8 E4M3") == (2.0**-10, 2.0**-6 - 2.0**-10, 448.0, 464.0)
    assert rounding_edges("BF16")[-1] == get_format("BF16").max_finite + 2.0**(127 - 8)


def test_cells_hold_every_non_zero_value_in_ascending_order(gradients):
    values = torch.cat([gradients, torch.zeros(5)])
    nonzero, zeros, cells = gradient_cells(values, "FP16")
    assert (nonzero, zeros) == (int((gradients != 0).sum()), 5 + int((gradients == 0).sum()))
    assert sum(c[0] for c in cells) == nonzero
    assert all(0 < lo <= hi for _, lo, hi in cells)
    assert all(a[2] < b[1] for a, b in zip(cells, cells[1:]))
    # a few hundred cells stand for the values: the size does not grow with the number of gradients
    assert len(cells) < 400


@pytest.mark.parametrize("fmt", SIGNED)
def test_page_counts_and_shares_equal_pythons_at_every_scale(js_page, gradients, fmt):
    """The JavaScript's counts (integers) and shares (float64 bits) against summarize_underflow's counts and
    sweep_loss_scale's shares, on real gradients and on every rounding edge of the format, for 91 scales."""
    compared = agreed = 0
    for values in (gradients, boundary_values(fmt)):
        config = loss_scale_explorer(values, fmt, log2_range=(-30, 60)).config
        js = js_page.evaluate(JS_SHARES, [config, SCALES])
        sweep = sweep_loss_scale(values, [2.0**k for k in SCALES], fmt)
        nonzero = values[values != 0]
        n = nonzero.numel()
        for i, k in enumerate(SCALES):
            python = {"flushed": sweep.flushed[i], "subnormal": sweep.subnormal[i], "overflow": sweep.overflow[i],
                      "survive": sweep.survive[i], "normal": sweep.survive_normal[i]}
            # the sweep's shares are summarize_underflow's count / n, correctly rounded: the counts read back
            counts = {c: round(python[c] * n) for c in ("flushed", "subnormal", "overflow")}
            counts["normal"] = n - sum(counts.values())
            for key, value in python.items():
                compared += 1
                agreed += js[i][key] == hex64(value)
            for key, value in counts.items():
                compared += 1
                agreed += js[i]["counts"][key] == value
            # and Python from the configuration alone (what check_in_page compares with) says the same
            from_config = shares_from_config(config, k)
            assert all(from_config[key] == value for key, value in python.items()), (fmt, k)
    assert agreed == compared, f"{fmt}: {compared - agreed} of {compared} values differ"


def test_classes_at_the_fp16_edges(js_page):
    # half the smallest subnormal ties to zero; a hair above it survives; 65520 overflows, 65519.99 does not
    got = js_page.evaluate("""() => [2 ** -25, 2 ** -25 * (1 + 2 ** -52), 2 ** -14 - 2 ** -25, 2 ** -14 - 2 ** -25 - 2 ** -40,
        65504, 65519.99, 65520, 1e300].map((a) => courseLib.classify(a, 0, "FP16"))""")
    assert got == ["flushed", "subnormal", "normal", "subnormal", "normal", "normal", "overflow", "overflow"]
    e4m3 = js_page.evaluate("() => [448, 464, 464.0001].map((a) => courseLib.classify(a, 0, 'FP8 E4M3'))")
    assert e4m3 == ["normal", "normal", "overflow"]   # 464 ties to 448 (even); above, it would round past max


def test_scale_text_parsing(js_page):
    got = js_page.evaluate("""() => ["65536", "2^16", "2**-3", " 0.25 ", "1", "", "abc", "3", "-4", "2^41", "1e400",
        "1e-400", "NaN", "2^"].map((t) => courseLib.parseScale(t, -4, 40))""")
    assert [g.get("log2") for g in got[:5]] == [16, 16, -3, -2, 0]
    assert all("error" in g for g in got[5:])
    assert "power of two" in got[7]["error"] and "outside" in got[9]["error"]


def read_rows(root):
    out = {}
    for kind in (*CLASSES, "survive"):
        row = root.locator(f"tr[data-class={kind}]")
        out[kind] = (float(row.get_attribute("data-share")), row.get_attribute("data-count"),
                     row.locator("[data-role=percent]").text_content())
    return out


def shown_share(share: float) -> str:
    """The explorer's percentage: two decimals, more where two would show a share short of all as 100.00%
    or a share above none as 0.00%."""
    s = 0.0 if -5e-5 < share < 0 else share
    for digits in range(2, 9):
        text = f"{100 * s:.{digits}f}"
        if not ((s < 1 and float(text) >= 100) or (s > 0 and float(text) <= 0)):
            break
    return text + "%"


def test_a_share_short_of_all_never_reads_100_percent(page_with):
    """One overflow among 100,001 gradients: two decimals would show 100.00% surviving and 0.00% overflowing."""
    values = torch.cat([torch.ones(100_000), torch.tensor([1e5])])
    page = page_with(loss_scale_explorer(values, "FP16", start=0).html())
    root = page.locator(".course-explorer")
    rows = read_rows(root)
    assert rows["survive"][2] == "99.999%" and rows["overflow"][2] == "0.001%"
    assert rows["flushed"][2] == "0.00%"   # none at all: two decimals are exact
    assert "99.999% of the 100,001 non-zero gradients survive" in root.locator("[data-role=readout]").text_content()
    assert shown_share(1.0) == "100.00%" and shown_share(-1e-17) == "0.00%"


def test_controls_change_the_shown_shares_to_pythons(page_with, gradients):
    page = page_with(loss_scale_explorer(gradients, "FP16").html())
    root = page.locator(".course-explorer")
    readout = root.locator("[data-role=readout]")
    sweep = sweep_loss_scale(gradients, [2.0**k for k in range(-4, 41)], "FP16")

    def check(k):
        rows = read_rows(root)
        i = k + 4
        assert rows["survive"][0] == sweep.survive[i] and rows["normal"][0] == sweep.survive_normal[i]
        assert rows["flushed"][0] == sweep.flushed[i] and rows["overflow"][0] == sweep.overflow[i]
        assert rows["subnormal"][0] == sweep.subnormal[i]
        assert rows["survive"][2] == shown_share(sweep.survive[i])
        assert f"2^{k}" in readout.text_content()

    assert readout.get_attribute("data-log2") == "0"
    check(0)
    before = read_rows(root)
    root.locator("[data-role=double]").click()
    page.wait_for_selector("[data-role=readout][data-log2='1']")
    assert read_rows(root) != before
    check(1)
    root.locator("[data-role=log2-scale]").press("End")          # the slider, from the keyboard
    page.wait_for_selector("[data-role=readout][data-log2='40']")
    check(40)
    assert root.locator("[data-role=double]").is_disabled()
    root.locator("[data-role=scale-text]").fill("2^16")          # GradScaler's initial scale
    page.wait_for_selector("[data-role=readout][data-log2='16']")
    check(16)
    assert root.locator("[data-role=log2-scale]").input_value() == "16"


@pytest.mark.parametrize("text, says", [("", "type a loss scale"), ("abc", "not a loss scale"),
                                        ("3", "not a power of two"), ("2^41", "outside"), ("1e400", "not a positive"),
                                        ("-8", "not a loss scale"), ("0", "not a positive")])
def test_bad_scale_text_shows_a_message_and_keeps_the_last_scale(page_with, gradients, text, says):
    page = page_with(loss_scale_explorer(gradients, "FP16", start=5).html())
    root = page.locator(".course-explorer")
    root.locator("[data-role=scale-text]").fill(text)
    assert says in root.locator("[data-role=message]").text_content()
    assert root.locator("[data-role=message]").text_content().endswith("; still showing 2^5")
    assert root.locator("[data-role=readout]").get_attribute("data-log2") == "5"
    root.locator("[data-role=scale-text]").fill("64")
    assert root.locator("[data-role=message]").text_content() == ""
    assert root.locator("[data-role=readout]").get_attribute("data-log2") == "6"


def test_check_in_page_passes_a_working_explorer_and_catches_a_dead_or_wrong_one(page_with, gradients):
    explorer = loss_scale_explorer(gradients, "FP16", log2_range=(0, 20), start=20)
    page = page_with(explorer.html())
    root = page.locator(".course-explorer")
    assert check_in_page(root, explorer.config) == []           # at the top of the range: it halves
    assert root.locator("[data-role=readout]").get_attribute("data-log2") == "19"
    assert check_in_page(root, explorer.config) == []           # and now it doubles
    wrong = {**explorer.config, "cells": [[c[0] + 1, *c[1:]] if i == 0 else c
                                          for i, c in enumerate(explorer.config["cells"])]}
    assert any("in Python" in p for p in check_in_page(root, wrong))
    # a page whose buttons lost their listeners renders but does not respond
    page.evaluate("""() => document.querySelectorAll('[data-role=double], [data-role=halve]')
        .forEach((b) => b.replaceWith(b.cloneNode(true)))""")
    assert "unusable configuration" in check_in_page(root, {"format": "FP16"})[0]
    problems = check_in_page(root, explorer.config, timeout_ms=500)
    assert len(problems) == 1 and "does not respond" in problems[0]


def test_refuses_bad_arguments(gradients):
    with pytest.raises(TypeError, match="floating-point torch tensor"):
        loss_scale_explorer([1.0, 2.0])
    with pytest.raises(TypeError, match="floating-point torch tensor"):
        loss_scale_explorer(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="non-finite"):
        loss_scale_explorer(torch.tensor([1.0, math.nan]))
    with pytest.raises(ValueError, match="all zero"):
        loss_scale_explorer(torch.zeros(3))
    with pytest.raises(ValueError, match="unsigned"):
        loss_scale_explorer(gradients, "E8M0")
    with pytest.raises(ValueError, match="unknown format"):
        loss_scale_explorer(gradients, "FP17")
    with pytest.raises(ValueError, match="from a lower to a higher"):
        loss_scale_explorer(gradients, log2_range=(5, 5))
    with pytest.raises(TypeError, match="two integers"):
        loss_scale_explorer(gradients, log2_range=(1, 2, 3))
    with pytest.raises(TypeError, match="integer"):
        loss_scale_explorer(gradients, log2_range=(0.5, 3))
    with pytest.raises(ValueError, match=r"-300..300 .*got 400"):
        loss_scale_explorer(gradients, log2_range=(0, 400))
    with pytest.raises(ValueError, match="start must lie in"):
        loss_scale_explorer(gradients, start=41)
    with pytest.raises(TypeError, match="integer"):
        loss_scale_explorer(gradients, start=True)
    # half-precision gradients are read exactly, as float64
    half = gradients[:500].half()
    assert loss_scale_explorer(half).config["nonzero"] == int((half != 0).sum())


def rgb(colour: str) -> str:
    """A colour as the page's computed style writes it."""
    return "rgb({}, {}, {})".format(*(round(255 * c) for c in to_rgb(colour)))


def test_colours_are_the_lessons_figures(js_page, gradients, page_with):
    """The bar and the table's swatches colour each class as lesson 3's figure (plot_scale_sweep) draws its
    line: normal, flushed, overflow and survive (all); subnormal, which the figure does not draw, in a colour
    none of its lines use."""
    sweep = sweep_loss_scale(gradients[:2000], [2.0**k for k in range(-2, 3)], "FP16")
    figure = plot_scale_sweep(sweep)
    lines = {line.get_label(): to_hex(line.get_color()) for line in figure.axes[0].get_lines()}
    plt.close(figure)
    colours = {kind: to_hex(c) for kind, c in js_page.evaluate("() => courseLib.COLOURS").items()}
    assert colours["normal"] == lines["survive as normal numbers (full FP16 precision)"]
    assert colours["flushed"] == lines["flushed to zero"]
    assert colours["overflow"] == lines["overflow"]
    assert colours["survive"] == lines["survive (all)"]
    assert colours["subnormal"] not in lines.values()
    page = page_with(loss_scale_explorer(gradients, "FP16").html())
    root = page.locator(".course-explorer")
    for kind in (*CLASSES, "survive"):
        swatch = root.locator(f"tr[data-class={kind}] td span").first
        assert swatch.evaluate("(e) => getComputedStyle(e).backgroundColor") == rgb(colours[kind]), kind
    bar = root.locator("[data-role=bar] span")
    shown = [bar.nth(i).evaluate("(e) => getComputedStyle(e).backgroundColor") for i in range(bar.count())]
    assert shown == [rgb(colours[kind]) for kind in ("flushed", "subnormal", "normal", "overflow")]


def test_the_largest_scale_fits_its_box_and_spent_buttons_are_greyed(page_with, gradients):
    page = page_with(loss_scale_explorer(gradients, "FP16", start=40).html(), width=750)
    root = page.locator(".course-explorer")
    typed = root.locator("[data-role=scale-text]")
    assert typed.input_value() == "1099511627776"   # 2^40, every digit in view
    assert typed.evaluate("(e) => e.scrollWidth <= e.clientWidth")
    opacity = "(e) => Number(getComputedStyle(e).opacity)"
    assert root.locator("[data-role=double]").is_disabled() and root.locator("[data-role=double]").evaluate(opacity) < 0.6
    assert root.locator("[data-role=halve]").evaluate(opacity) == 1


@pytest.mark.parametrize("fmt", SIGNED)
def test_the_footer_says_where_flushing_starts(js_page, page_with, gradients, fmt):
    """The footer's flush edge is half the format's smallest subnormal: at it a value flushes (the tie rounds
    to even, zero), just above it it survives as a subnormal."""
    page = page_with(loss_scale_explorer(gradients[:500], fmt).html())
    text = page.locator("[data-role=limits]").text_content()
    edge = get_format(fmt).min_subnormal / 2
    shown = text.split("at most half the smallest subnormal, ", 1)[1].split(" ", 1)[0]
    assert float(shown) == edge, (fmt, text)
    above = float(np.nextafter(edge, math.inf))
    assert js_page.evaluate("([a, b, fmt]) => [courseLib.classify(a, 0, fmt), courseLib.classify(b, 0, fmt)]",
                            [edge, above, fmt]) == ["flushed", "subnormal"]
