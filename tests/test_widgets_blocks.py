"""Lesson 8's block explorer (course_lib.widgets.blocks, js/block_explorer.js): its JavaScript quantises
blocks in Chromium exactly as course_lib.mx does (scale codes and values, element codes and values, stored
values, bit for bit; saturated and flushed counts exactly; the error as the library's to FP32 rounding and as
a float64 sum of the library's values to 1e-12), it responds to typing, dragging and the keyboard, shows bad
input as a message, and its browser check passes on a working explorer and fails on a dead one."""

import math
import struct

import numpy as np
import pytest
import torch

from course_lib import mx
from course_lib.widgets import bundle
from course_lib.widgets.blocks import (
    BLOCK_FORMATS,
    BLOCK_SIZE,
    OUTLIER_LOG2_MAX,
    QuantizedBlock,
    block_explorer,
    block_format,
    check_in_page,
    default_block,
    quantize_block,
)

F32_MAX = float(torch.finfo(torch.float32).max)
F32_TINY = 2.0**-149


def _hex(v: float) -> str:
    return struct.pack(">d", v).hex()


def _from_hex(h: str) -> float:
    return struct.unpack(">d", bytes.fromhex(h))[0]


def _f32_next(v: float, direction: float) -> float:
    return float(np.nextafter(np.float32(v), np.float32(direction)))


def _blocks() -> list[tuple[str, list[float]]]:
    """(kind, 32 float64 values) for every case the issue lists, random and at the boundaries."""
    rng = np.random.default_rng(22)
    out: list[tuple[str, list[float]]] = []

    def base(scale=1.0):
        return list(rng.standard_normal(BLOCK_SIZE) * scale)

    for _ in range(120):
        out.append(("normal", base(10.0 ** rng.uniform(-8, 8))))
    for _ in range(80):
        t = rng.standard_t(1.5, BLOCK_SIZE) * 10.0 ** rng.uniform(-4, 4)
        out.append(("heavy-tailed", list(t)))
    for k in range(-70, 128, 4):                      # one outlier of 2**k (and just beside it) in a normal block
        for m in (1.0, 1 - 2.0**-24, 1 + 2.0**-23, 1.5, 1.75, 0.75 * 7 / 6):
            v = base()
            v[int(rng.integers(BLOCK_SIZE))] = float(rng.choice([-1, 1])) * min(m * 2.0**k, F32_MAX)
            out.append(("outlier 2^k", v))
    for k in range(-149, 128, 5):                     # amax exactly a power of two, and one FP32 step beside it
        for amax in (2.0**k, _f32_next(2.0**k, 0), _f32_next(2.0**k, math.inf)):
            v = list(rng.uniform(-1, 1, BLOCK_SIZE) * amax)
            v[int(rng.integers(BLOCK_SIZE))] = -amax if rng.random() < 0.5 else amax
            out.append(("amax at 2^k", v))
    for k in range(-120, 120, 23):                    # FLOOR's saturation and RCEIL's quotient edges
        for m in (6, 7, 448, 464, 480, 5.99, 7.01, 449, 463.9, 464.1, 3, 4, 256, 512):
            for amax in (m * 2.0**k, _f32_next(m * 2.0**k, 0), _f32_next(m * 2.0**k, math.inf)):
                v = list(rng.standard_normal(BLOCK_SIZE) * amax / 8)
                v[0] = amax
                out.append(("scale edges", v))
    top = [F32_MAX, 3.4e38, 1.9 * 2.0**127, 2.0**127, 1.5 * 2.0**127, 1.75 * 2.0**127, (2 - 2.0**-4) * 2.0**127,
           _f32_next(2.0**127, 0)]
    for amax in top:                                  # FP32's top binade (the issue's 126/120 case)
        out.append(("top binade", [amax] + [1.0] * (BLOCK_SIZE - 1)))
        out.append(("top binade", [-amax] + list(rng.uniform(-1, 1, BLOCK_SIZE - 1) * amax)))
    bottom = [F32_TINY, 3 * F32_TINY, 1e-40, 1.5 * 2.0**-127, 2.0**-126, 2.0**-121, 2.0**-118, 1e-36, 7e-36,
              7.9e-36, 8e-36, 1e-35, 1e-30]
    for amax in bottom:                               # subnormals, and NVFP4's breakdown near 8e-36
        out.append(("tiny", [amax] + [0.0] * (BLOCK_SIZE - 1)))
        out.append(("tiny", list(rng.uniform(-1, 1, BLOCK_SIZE) * amax)))
        out.append(("tiny", [amax] + list(rng.uniform(-1, 1, BLOCK_SIZE - 1) * amax)))
    out.append(("zeros", [0.0] * BLOCK_SIZE))
    out.append(("zeros", [-0.0] * BLOCK_SIZE))
    out.append(("zeros", [0.0, -0.0] * (BLOCK_SIZE // 2)))
    out.append(("zeros", [-0.0] * (BLOCK_SIZE - 1) + [1.0]))
    out.append(("zeros", [-1e-30] + [-0.0] * (BLOCK_SIZE - 1)))
    # ties after scaling: amax 6 (E2M1 scale 1) and 448 (E4M3 scale 1) with values halfway between grid points
    out.append(("ties", [6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -0.75, -2.5, -5.0] + [0.1] * 20))
    out.append(("ties", [448.0, 2.0**-10, 3 * 2.0**-10, 17.0, 19.0, 304.0, 336.0, 432.0, -2.0**-10, -17.0]
                + [0.3] * 22))
    out.append(("float64 inputs", [0.1 * (i + 1) for i in range(BLOCK_SIZE)]))
    for bad in (math.inf, -math.inf, math.nan, 1e39, -1e39, 3.4028235677973366e38):
        v = base()
        v[7] = bad
        out.append(("non-finite", v))
    v = base()
    v[3] = 3.4028235e38                               # rounds to FP32's max, not to inf: accepted
    out.append(("top binade", v))
    return out


# values travel as float64 bit patterns, 16 hex digits each, concatenated (exact, -0 included, and compact)
QUANTIZE_IN_PAGE = """([blocks, name]) => {
  const dv = new DataView(new ArrayBuffer(8));
  const fromHex = (h) => {
    dv.setUint32(0, parseInt(h.slice(0, 8), 16)); dv.setUint32(4, parseInt(h.slice(8), 16)); return dv.getFloat64(0); };
  const hex = (x) => { dv.setFloat64(0, x);
    return dv.getUint32(0).toString(16).padStart(8, "0") + dv.getUint32(4).toString(16).padStart(8, "0"); };
  return blocks.map(([hexes, index]) => {
    const values = Array.from({ length: hexes.length / 16 }, (_, i) => fromHex(hexes.slice(16 * i, 16 * i + 16)));
    let r;
    try { r = courseLib.quantizeBlock(values, name, index); }
    catch (e) { return { refused: e.message }; }
    return { scaleCodes: r.scaleCodes, blockScales: r.blockScales.map(hex).join(""), tensorScale: hex(r.tensorScale),
      codes: r.elementCodes, elements: r.elements.map(hex).join(""), dequantised: r.dequantised.map(hex).join(""),
      saturated: r.saturated.filter(Boolean).length, flushed: r.flushed.filter(Boolean).length,
      error: hex(r.relativeError), otherError: hex(r.otherError) };
  });
}"""


def _pack(values) -> str:
    return "".join(_hex(float(v)) for v in values)



@pytest.fixture
def library_page(page_with):
    page = page_with("")
    page.add_script_tag(content=bundle("block_explorer.js", expose=("quantizeBlock", "BLOCK_FORMATS")), type="module")
    page.wait_for_function("() => globalThis.courseLib !== undefined")
    return page


def _float64_error(q: QuantizedBlock, skip: int | None) -> float:
    keep = [i for i in range(BLOCK_SIZE) if i != skip]
    x = np.array([q.values[i] for i in keep])
    d = np.array([q.dequantised[i] for i in keep])
    with np.errstate(over="ignore", invalid="ignore"):
        norm = math.sqrt(float(np.sum(x * x)))
        return math.sqrt(float(np.sum((d - x) ** 2))) / norm if norm > 0 else 0.0


def _close(a: float, b: float, rel: float) -> bool:
    return a == b or (math.isfinite(a) and math.isfinite(b) and math.isclose(a, b, rel_tol=rel, abs_tol=1e-300))


def test_the_page_quantises_every_block_as_the_library_does(library_page):
    """Every block of :func:`_blocks` in every format: the page's scales, codes and stored values equal the
    library's bit for bit, refusals (inf, NaN, NVFP4's NaN breakdown) coincide, and the error agrees."""
    blocks = _blocks()
    indices = [int(np.argmax(np.abs(np.nan_to_num(np.array(v), nan=0.0, posinf=1e300, neginf=1e300))))
               for _, v in blocks]
    payload = [[_pack(v), i] for (_, v), i in zip(blocks, indices)]
    tally = {}
    for name in BLOCK_FORMATS:
        js = library_page.evaluate(QUANTIZE_IN_PAGE, [payload, name])
        blocks_agreed = elements_compared = elements_agreed = refused = library_errors = 0
        problems = []
        for (kind, v), index, got in zip(blocks, indices, js):
            try:
                want = quantize_block(v, name, outlier_index=index)
            except ValueError as error:
                refused += 1
                if "refused" not in got:
                    problems.append(f"{kind} {v[:2]}: Python refuses ({error}), the page does not")
                continue
            if "refused" in got:
                problems.append(f"{kind} {v[:2]}: the page refuses ({got['refused']}), Python does not")
                continue
            ok_elements = [got["codes"][i] == want.element_codes[i]
                           and got["elements"][16 * i:16 * i + 16] == _hex(want.elements[i])
                           and got["dequantised"][16 * i:16 * i + 16] == _hex(want.dequantised[i])
                           for i in range(BLOCK_SIZE)]
            elements_compared += BLOCK_SIZE
            elements_agreed += sum(ok_elements)
            same = (all(ok_elements) and got["scaleCodes"] == list(want.scale_codes)
                    and got["blockScales"] == _pack(want.scales) and got["tensorScale"] == _hex(want.tensor_scale)
                    and got["saturated"] == want.saturated and got["flushed"] == want.flushed)
            # the error: the page sums in float64; the same sum of the library's values agrees to 1e-12, and
            # the library's own block_error (FP32 dequantisation, float64 norms) to FP32 rounding, checked on
            # the blocks of ordinary magnitude
            error, other = _from_hex(got["error"]), _from_hex(got["otherError"])
            same = same and _close(error, _float64_error(want, None), 1e-12) and _close(other, _float64_error(want, index), 1e-12)
            amax = max(abs(x) for x in want.values)
            if 1e-15 < amax < 1e15 and math.isfinite(want.relative_error):
                library_errors += 1
                same = same and _close(error, want.relative_error, 1e-5) and _close(other, want.other_error, 1e-5)
            if same:
                blocks_agreed += 1
            elif len(problems) < 5:
                problems.append(f"{kind} {v[:3]}: page {got['scaleCodes']} {got['codes'][:6]} err {error}, "
                                f"Python {want.scale_codes} {want.element_codes[:6]} err {want.relative_error}")
        tally[name] = (len(blocks), blocks_agreed, refused, elements_compared, elements_agreed, library_errors)
        assert not problems, (name, problems)
        assert blocks_agreed + refused == len(blocks) and elements_agreed == elements_compared
    # the refusals are the non-finite blocks everywhere, plus NVFP4's tiny tensors
    assert tally["MXFP4 RCEIL"][2] == 6 and tally["NVFP4"][2] > 6
    assert all(t[3] > 30_000 for t in tally.values()), tally


def test_a_large_random_batch_of_mx_blocks_agrees(library_page):
    """2000 more random MX blocks (quantised by the library as one 2000 x 32 tensor, one block per row)."""
    n = 2000
    rng = np.random.default_rng(8)
    x = rng.standard_normal((n, BLOCK_SIZE)) * 10.0 ** rng.uniform(-30, 30, (n, 1))
    x[np.arange(n), rng.integers(0, BLOCK_SIZE, n)] *= 2.0 ** rng.integers(0, 40, n)
    x = np.clip(x, -F32_MAX, F32_MAX)
    payload = [[_pack(row), -1] for row in x]
    for name in ("MXFP8 FLOOR", "MXFP8 RCEIL", "MXFP4 FLOOR", "MXFP4 RCEIL"):
        q = BLOCK_FORMATS[name].quantize(torch.tensor(x))
        js = library_page.evaluate(QUANTIZE_IN_PAGE, [payload, name])
        scale_codes = q.scale_codes().view(torch.uint8)[:, 0].tolist()
        codes = q.element_codes().tolist()
        back = q.dequantize().double().tolist()
        agreed = sum(got["scaleCodes"] == [s] and got["codes"] == c and got["dequantised"] == _pack(b)
                     for got, s, c, b in zip(js, scale_codes, codes, back))
        assert agreed == n, (name, agreed)


def test_the_page_and_the_library_name_the_same_formats(library_page):
    js = library_page.evaluate("() => courseLib.BLOCK_FORMATS")
    assert list(js) == list(BLOCK_FORMATS)
    for name, scaling in BLOCK_FORMATS.items():
        spec = js[name]
        assert spec["element"] == mx.element_format(scaling.element).name and spec["block"] == scaling.block
        if scaling.scale_format == "e8m0":
            assert spec["scale"] == "E8M0" and spec["mode"] == scaling.mode
        else:
            assert spec["scale"] == "FP8 E4M3" and scaling.tensor_scale


def test_fp32_top_binade_gets_the_specs_scale():
    """The issue's earlier defect: amax in FP32's top binade with E2M1 must get scale 2**126 (RCEIL) and
    2**125 (FLOOR: floor(log2 1.9 * 2**127) - 2), not a wrapped small one."""
    block = [1.9 * 2.0**127] + [1.0] * 31
    assert quantize_block(block, "MXFP4 RCEIL").scale_codes == (126 + 127,)
    assert quantize_block(block, "MXFP4 FLOOR").scale_codes == (125 + 127,)
    assert quantize_block([3.4e38] + [1.0] * 31, "MXFP8 RCEIL").scale_codes == (120 + 127,)


def _explorer_page(page_with, width=1000, **kwargs):
    page = page_with(block_explorer(**kwargs).html(), width=width)
    page.wait_for_selector("[data-role=summary][data-scale-codes]")
    return page


def _shown(page):
    summary = page.locator("[data-role=summary]")
    codes = page.locator("[data-role=code]")
    return {"scale_codes": tuple(int(c) for c in summary.get_attribute("data-scale-codes").split(",")),
            "codes": tuple(int(codes.nth(i).get_attribute("data-code")) for i in range(codes.count())),
            "dequantised": tuple(float(codes.nth(i).get_attribute("data-dequantised")) for i in range(codes.count())),
            "flushed": int(summary.get_attribute("data-flushed")), "text": summary.inner_text()}


def _python(values, index, text, name):
    values = list(values)
    values[index] = float(text)
    return quantize_block(values, name, outlier_index=index)


def _assert_shows(page, values, index, name):
    text = page.locator("[data-role=outlier]").input_value()
    page.wait_for_selector(f'[data-role=summary][data-outlier-text="{text}"]')
    want = _python(values, index, text, name)
    shown = _shown(page)
    assert shown["scale_codes"] == want.scale_codes and shown["codes"] == want.element_codes
    assert shown["dequantised"] == want.dequantised and shown["flushed"] == want.flushed
    assert f"code {want.scale_codes[0]}" in shown["text"]
    return want


def test_typing_an_outlier_raises_the_scale_and_flushes_the_others(page_with):
    values = default_block()
    page = _explorer_page(page_with, outlier=2.0, format="MXFP4 RCEIL")
    before = _assert_shows(page, values, 5, "MXFP4 RCEIL")
    page.fill("[data-role=outlier]", "1000")
    after = _assert_shows(page, values, 5, "MXFP4 RCEIL")
    assert after.scale_codes[0] > before.scale_codes[0] and after.flushed > before.flushed
    assert f"{after.flushed - 0} of 31" in page.locator("[data-role=summary]").inner_text()
    for name in BLOCK_FORMATS:          # the format selector
        page.select_option("[data-role=format]", name)
        page.wait_for_function("(n) => document.querySelector('[data-role=summary]').textContent.includes("
                               "n === 'NVFP4' ? 'Tensor scale' : 'E8M0 code')", arg=name)
        want = _assert_shows(page, values, 5, name)
        assert len(want.scale_codes) == (2 if name == "NVFP4" else 1)


def test_dragging_the_outlier_changes_its_value(page_with):
    values = default_block()
    page = _explorer_page(page_with, outlier=3.0, format="MXFP8 FLOOR")
    box = page.locator("[data-role=outlier]")
    handle = page.locator("[data-role=handle]").bounding_box()
    x, y = handle["x"] + handle["width"] / 2, handle["y"] + handle["height"] / 2
    page.mouse.move(x, y)
    page.mouse.down()
    page.mouse.move(x, y - 40, steps=5)
    page.mouse.move(x, y - 80, steps=5)
    page.mouse.up()
    dragged = float(box.input_value())
    assert dragged > 3.0 * 4, dragged                 # 80 px up is several binades on this axis
    want = _assert_shows(page, values, 5, "MXFP8 FLOOR")
    assert want.values[5] == float(np.float32(dragged))
    # the slider followed the drag, to the nearest quarter binade
    assert abs(float(page.locator("[data-role=outlier-slider]").input_value()) - math.log2(dragged)) <= 0.125


def test_the_slider_moves_the_outlier_from_the_keyboard(page_with):
    values = default_block()
    page = _explorer_page(page_with, outlier=16.0, format="NVFP4")
    slider = page.locator("[data-role=outlier-slider]")
    assert slider.input_value() == "4"
    slider.focus()
    for _ in range(8):
        page.keyboard.press("ArrowRight")
    assert page.locator("[data-role=outlier]").input_value() == "64"   # two binades up: 2**6
    _assert_shows(page, values, 5, "NVFP4")


@pytest.mark.parametrize("text, message", [
    ("", "type a number"), ("abc", "is not a number"), ("inf", "is inf"), ("nan", "is NaN"),
    ("1e39", "beyond FP32's range"), ("-1e400", "beyond float64's range")])
def test_bad_outliers_show_a_message(page_with, text, message):
    page = _explorer_page(page_with, format="MXFP4 FLOOR")
    before = _shown(page)
    page.fill("[data-role=outlier]", text)
    shown = page.locator("[data-role=message]")
    assert message in shown.inner_text()
    assert page.locator("[data-role=outlier]").get_attribute("aria-invalid") == "true"
    assert _shown(page)["codes"] == before["codes"]     # the last good block stays on show
    page.fill("[data-role=outlier]", "3")
    assert shown.inner_text() == ""


def test_nvfp4_says_when_its_tensor_scale_breaks_down(page_with):
    values = [1e-37 * (i % 5) for i in range(BLOCK_SIZE)]   # zeros among tiny values: 0 x inf
    page = _explorer_page(page_with, values=values, outlier=2e-37, format="MXFP4 RCEIL")
    page.select_option("[data-role=format]", "NVFP4")
    assert "too small for an FP32 tensor scale" in page.locator("[data-role=message]").inner_text()
    with pytest.raises(ValueError, match="too small for an FP32 tensor scale"):
        quantize_block([2e-37] + values[1:], "NVFP4")


def test_the_constructor_refuses_bad_arguments():
    with pytest.raises(ValueError, match="a block holds 32 values, got 31"):
        block_explorer([1.0] * 31)
    with pytest.raises(TypeError, match="values must be numbers"):
        block_explorer(["1"] * 32)
    with pytest.raises(TypeError, match="values must be a sequence"):
        block_explorer("abc")
    with pytest.raises(ValueError, match="within FP32's range"):
        block_explorer([1e39] + [1.0] * 31)
    with pytest.raises(ValueError, match="within FP32's range"):
        block_explorer([math.nan] * 32)
    with pytest.raises(ValueError, match="outlier_index must lie in 0..31"):
        block_explorer(outlier_index=32)
    with pytest.raises(TypeError, match="outlier_index must be an int"):
        block_explorer(outlier_index=1.0)
    with pytest.raises(ValueError, match="unknown block format 'MXFP6'"):
        block_explorer(format="MXFP6")
    with pytest.raises(TypeError, match="format must be a name"):
        block_explorer(format=4)
    with pytest.raises(ValueError, match="outlier must be finite"):
        block_explorer(outlier=math.inf)
    with pytest.raises(TypeError, match="outlier must be a number"):
        block_explorer(outlier="7")
    assert block_format("mxfp4  rceil") == "MXFP4 RCEIL"
    # tensors, arrays and lists alike; the values arrive in FP32
    explorer = block_explorer(torch.full((4, 8), 0.1), outlier=3.0)
    assert explorer.config["values"][0] == float(np.float32(0.1)) and explorer.config["outlier"] == "3"
    assert block_explorer(np.ones(32)).config["outlier"] == "2"
    assert block_explorer([0.0] * 32).config["outlier"] == "1"
    assert block_explorer([F32_MAX] * 32).config["outlier"] == "2.86e+38"   # 2**127.75: the slider's top


def test_the_outlier_starts_at_twice_the_blocks_largest_value_so_few_values_flush():
    values = default_block()
    start = float(block_explorer(values).config["outlier"])
    assert start == float(f"{2 * max(abs(v) for v in values):.3g}")
    for name in BLOCK_FORMATS:        # the scale moves at most a binade or two from the block's own
        natural = quantize_block(values, name)
        at_start = _python(values, 5, str(start), name)
        dragged = _python(values, 5, str(100 * start), name)
        assert at_start.flushed <= natural.flushed + 5, name
        if "FP4" in name:             # E2M1's few binades: dragging it 100x up flushes many more
            assert dragged.flushed > at_start.flushed + 5, name


def test_quantize_block_refuses_what_the_library_refuses():
    with pytest.raises(ValueError, match="inf or NaN"):
        quantize_block([math.inf] + [1.0] * 31, "MXFP8 FLOOR")
    with pytest.raises(ValueError, match="a block holds 32 values"):
        quantize_block([1.0] * 16, "NVFP4")
    q = quantize_block([0.0] * 32, "MXFP4 RCEIL", outlier_index=0)
    assert q.scale_codes == (0,) and q.relative_error == 0.0 and q.other_error == 0.0 and q.flushed == 0


def test_check_in_page_passes_a_working_explorer_and_fails_a_dead_one(page_with):
    for name in ("MXFP4 FLOOR", "NVFP4"):
        explorer = block_explorer(format=name)
        page = page_with(explorer.html())
        page.wait_for_selector("[data-role=summary][data-scale-codes]")
        assert check_in_page(page.locator(".course-explorer").first, explorer.config) == []
    explorer = block_explorer()
    page = page_with(explorer.html())
    page.wait_for_selector("[data-role=summary][data-scale-codes]")
    # a widget that renders but does not respond: its text box replaced by a copy without listeners
    page.evaluate("() => { const box = document.querySelector('[data-role=outlier]'); box.replaceWith(box.cloneNode(true)); }")
    problems = check_in_page(page.locator(".course-explorer").first, explorer.config, timeout_ms=1000)
    assert len(problems) == 1 and "changed nothing" in problems[0]
    assert "unusable configuration" in check_in_page(page.locator(".course-explorer").first, {"values": [1.0]})[0]
    # an explorer that never mounted (its script failed): a problem, not a hang
    page = page_with('<div class="course-explorer" data-explorer="block_explorer"></div>')
    problems = check_in_page(page.locator(".course-explorer").first, explorer.config, timeout_ms=300)
    assert len(problems) == 1 and "no format selector" in problems[0]


def test_the_slider_stops_where_every_stored_value_is_still_finite(page_with):
    """The slider's top (and the drag's), 2**127.75: in every format the outlier's stored value is finite and
    so is the error; just above it MXFP4 RCEIL stores 4 * 2**126 = 2**128, inf."""
    values = default_block()
    page = _explorer_page(page_with, format="MXFP4 RCEIL")
    slider = page.locator("[data-role=outlier-slider]")
    assert float(slider.get_attribute("max")) == OUTLIER_LOG2_MAX
    slider.focus()
    page.keyboard.press("End")
    for name in BLOCK_FORMATS:
        page.select_option("[data-role=format]", name)
        want = _assert_shows(page, values, 5, name)
        assert all(math.isfinite(d) for d in want.dequantised), name
        text = page.locator("[data-role=summary]").inner_text()
        assert "inf" not in text and "infinite" not in text, (name, text)
    assert page.locator("[data-role=outlier]").input_value() == f"{2.0**OUTLIER_LOG2_MAX:.3g}"
    over = _python(values, 5, str(2.0 ** (OUTLIER_LOG2_MAX + 0.0625)), "MXFP4 RCEIL")
    assert over.dequantised[5] == math.inf           # why the slider stops there


def test_a_stored_value_that_overflows_fp32_is_explained_not_shown_as_inf_percent(page_with):
    values = default_block()
    page = _explorer_page(page_with, format="MXFP4 RCEIL")
    page.fill("[data-role=outlier]", "3.4e38")
    want = _assert_shows(page, values, 5, "MXFP4 RCEIL")
    assert want.dequantised[5] == math.inf           # the library overflows too: 4 * 2**126 = 2**128
    whole = page.locator("[data-role=summary] [data-role=whole]").inner_text()
    assert "infinite: element 5's stored value, 4 × 2126, is beyond FP32's largest value" in whole, whole
    text = page.locator("[data-role=summary]").inner_text()
    assert "inf%" not in text and "The 31 values beside the outlier: relative error 100%" in text


def test_the_summary_leads_with_the_other_values_and_names_the_ratio(page_with):
    values = default_block()
    for name in ("MXFP4 RCEIL", "NVFP4"):
        page = _explorer_page(page_with, format=name)
        page.fill("[data-role=outlier]", "1e4")
        want = _assert_shows(page, values, 5, name)
        others = page.locator("[data-role=summary] [data-role=others]").inner_text()
        assert others.startswith(f"The 31 values beside the outlier: relative error {_approx(100 * want.other_error)}%; "
                                 f"{want.flushed} of 31 non-zero values flushed to 0"), others
        whole = page.locator("[data-role=summary] [data-role=whole]").inner_text()
        assert whole.startswith("All 32 values: ‖error‖ / ‖block‖ = ") and "dominated by the outlier" in whole
        assert "for the block" not in page.locator("[data-role=summary]").inner_text()
    # a small outlier: the ratio is not the outlier's, and the page does not say it is
    page.fill("[data-role=outlier]", "0.01")
    assert "dominated" not in page.locator("[data-role=summary] [data-role=whole]").inner_text()


def _approx(x: float) -> str:
    """page.js's approx(x) for errors between 1e-4 and 1e6: three significant digits."""
    return f"{float(f'{x:.3g}'):g}"


def test_the_details_table_fits_the_column_and_marks_flushed_rows(page_with):
    values = default_block()
    page = _explorer_page(page_with, width=750, format="NVFP4")
    page.fill("[data-role=outlier]", "1e4")
    want = _assert_shows(page, values, 5, "NVFP4")
    page.locator("details summary").click()
    grid = page.locator("[data-role=elements]")
    assert grid.evaluate("e => getComputedStyle(e).overflowX") == "auto"
    client, scroll = grid.evaluate("e => [e.clientWidth, e.scrollWidth]")
    assert scroll <= client, (scroll, client)       # fits a 750 px page without scrolling
    heads = grid.locator("th").all_text_contents()
    assert heads == ["element", "value (FP32)", "value / scale", "code (bits)", "element value", "stored value"]
    rows = grid.locator("tbody tr")
    states = [rows.nth(i).get_attribute("data-state") for i in range(BLOCK_SIZE)]
    flushed = [v != 0 and d == 0 for v, d in zip(want.values, want.dequantised)]
    assert [s == "flushed" for s in states] == flushed and sum(flushed) == want.flushed
    for i in range(BLOCK_SIZE):
        stored = rows.nth(i).locator("td").nth(5).inner_text()
        assert stored.endswith(" ×") == flushed[i], (i, stored)


def _contrast(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    def luminance(rgb):
        c = [v / 255 for v in rgb]
        c = [v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4 for v in c]
        return 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2]
    la, lb = sorted((luminance(a), luminance(b)))
    return (lb + 0.05) / (la + 0.05)


def test_the_outlier_reads_on_light_and_dark_and_the_code_row_is_explained(page_with):
    page = _explorer_page(page_with, format="MXFP4 RCEIL")
    for value in ("3", "-3"):
        page.fill("[data-role=outlier]", value)
        page.wait_for_selector(f'[data-role=summary][data-outlier-text="{value}"]')
        fill = page.locator("[data-role=plot] rect[data-index='5']").get_attribute("fill")
        rgb = tuple(int(fill[i:i + 2], 16) for i in (1, 3, 5))
        assert _contrast(rgb, (255, 255, 255)) >= 3 and _contrast(rgb, (41, 49, 61)) >= 3, (value, fill)
    label = page.locator("[data-role=plot] text", has_text="outlier")
    assert label.get_attribute("fill") == "currentColor"
    # the chart's only key reads as text (the page's colour), not as the faint grey of the axis labels
    for key in (page.locator("[data-role=plot] text", has_text="tick: stored value"),
                page.locator("[data-role=code-legend]")):
        assert key.get_attribute("fill") == "currentColor"
    code = page.locator("[data-role=code-label]")
    assert code.text_content().startswith("code(hex)")
    assert "8 is −0" in code.locator("title").text_content()
    assert "8 is −0" in page.locator("[data-role=code-legend]").text_content()
    page.select_option("[data-role=format]", "MXFP8 FLOOR")
    assert "80 is −0" in page.locator("[data-role=code-legend]").text_content()
