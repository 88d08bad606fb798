"""Lesson 1's explorer against course_lib.formats, bit for bit, in Chromium.

js/codecs.js ports the codecs (round_to_format, encode, decode, bit_string, explain_value, neighbours) and
js/page.js reads typed numbers; the tests below run them in a real page on many values per format (random
float64 and float32 bit patterns, every value of each format up to 16 bits with the ties between them and
the floats on either side of each tie, the overflow thresholds, the subnormal edges) and compare each result
with Python's. Floats cross between Python and the page as float64 bytes (base64; little-endian, as numpy
and every browser's typed arrays are here), since JSON would lose -0, inf and NaN. Two NaNs agree whatever
their bits: a page cannot keep a NaN's sign or payload, so NaN inputs are the positive quiet NaN on both
sides. Each test counts the values it compared and the agreements, per function and format; the counts are
printed at the end of the module's run (pytest's terminal, with or without -s).

Then the explorer itself: typed numbers, flipped bits, bad input, and check_in_page (the book's check).
"""

import base64
import json
import math
from decimal import ROUND_HALF_UP, Decimal, localcontext

import numpy as np
import pytest

from course_lib import formats as F
from course_lib.widgets.formats import STORED_DIGITS, check_in_page, format_explorer
from course_lib.widgets.page import bundle

NAMES = list(F.FORMATS)
EXPOSE = ("decode", "roundToFormat", "encode", "bitString", "explainValue", "neighbours", "roundingBin",
          "overflowThreshold", "parseNumber", "codeKind", "describeKind", "formatNote", "storedCell", "STORED_DIGITS")
ROUNDINGS = ("nearest_even", "nearest_away", "toward_zero")
OVERFLOWS = ("inf", "saturate", "nan")

# Moving arrays of float64 in and out of the page, and running one function over one.
HELPERS = """
globalThis.courseTest = {
  floats(text) { const bin = atob(text); const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Float64Array(bytes.buffer); },
  text(array) { const bytes = new Uint8Array(array.buffer); let s = "";
    for (let i = 0; i < bytes.length; i += 0x8000) s += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
    return btoa(s); },
};
"""
ROUND_JS = """([text, name, options]) => {
  const xs = courseTest.floats(text), n = xs.length;
  const stored = new Float64Array(n), codes = new Float64Array(n), failed = [];
  for (let i = 0; i < n; i++) {
    try { stored[i] = courseLib.roundToFormat(xs[i], name, options); codes[i] = courseLib.encode(xs[i], name, options); }
    catch (error) { stored[i] = NaN; codes[i] = -1; failed.push(i); }
  }
  return [courseTest.text(stored), courseTest.text(codes), failed];
}"""
CODES_JS = """([text, name]) => {
  const codes = courseTest.floats(text), n = codes.length;
  const values = new Float64Array(n), below = new Float64Array(n), above = new Float64Array(n), bits = [];
  const none = 12345.5;   // no format holds it: stands for "no neighbour" (null)
  for (let i = 0; i < n; i++) {
    values[i] = courseLib.decode(codes[i], name);
    const near = courseLib.neighbours(codes[i], name);
    below[i] = near.below ?? none; above[i] = near.above ?? none;
    bits.push(courseLib.bitString(codes[i], name));
  }
  return [courseTest.text(values), courseTest.text(below), courseTest.text(above), bits.join(",")];
}"""
NONE = 12345.5

TALLY: dict[tuple[str, str], list[int]] = {}


def count(function: str, fmt: str, agree: np.ndarray) -> None:
    """Add a comparison's values and agreements to the tally."""
    entry = TALLY.setdefault((function, fmt), [0, 0])
    entry[0] += int(agree.size)
    entry[1] += int(agree.sum())


def to_text(x) -> str:
    return base64.b64encode(np.ascontiguousarray(x, dtype="<f8").tobytes()).decode()


def from_text(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f8").copy()


def same_bits(a, b) -> np.ndarray:
    """Elementwise: the same float64 bits, or both NaN."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a.view(np.uint64) == b.view(np.uint64)) | (np.isnan(a) & np.isnan(b))


def same_float(a: float, b: float) -> bool:
    """same_bits for two Python floats."""
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1.0, a) == math.copysign(1.0, b))


def unique(x) -> np.ndarray:
    """Distinct float64 values by their bits (-0 and 0 both kept), NaN made the positive quiet NaN."""
    x = np.asarray(x, dtype=np.float64).copy()
    x[np.isnan(x)] = np.nan
    return np.unique(x.view(np.uint64)).view(np.float64)


def around(x) -> list[float]:
    """x, and the floats on either side of it."""
    with np.errstate(over="ignore"):   # past float64's largest: inf
        return [x, float(np.nextafter(x, -math.inf)), float(np.nextafter(x, math.inf))]


def threshold(f) -> float:
    """The overflow threshold: the largest finite value plus half its spacing."""
    return f.max_finite + math.ldexp(1.0, f.max_exponent - f.mantissa_bits - 1)


def edges(f) -> np.ndarray:
    """Every boundary of f, both signs, with the floats on either side: largest finite, overflow threshold
    and the next power of two, smallest normal and subnormal, half the smallest subnormal (the value just
    below it must round to zero), zeros, infinities, NaN, and float64's own ends."""
    points = []
    for x in (f.max_finite, threshold(f), 2 * f.max_finite, math.ldexp(1.0, f.max_exponent + 1), f.min_normal,
              f.min_subnormal, f.min_subnormal / 2, 1.5 * f.min_subnormal, f.min_normal - f.min_subnormal / 2,
              1.0, 65520.0, 5e-324, 2.2250738585072014e-308, 1.7976931348623157e308):
        points += around(x) + around(-x)
    return np.array(points + [0.0, -0.0, math.inf, -math.inf, math.nan])


def grid_and_ties(f, rng) -> np.ndarray:
    """f's finite values, the midpoints between neighbours (the ties) and the floats on either side of each:
    every value for a format of up to 16 bits, a random 20,000 codes and their next codes above that."""
    if f.bits <= 16:
        grid = unique(F.all_values(f))
        grid = grid[np.isfinite(grid)]
        lower, upper = grid[:-1], grid[1:]
    else:
        codes = np.concatenate([rng.integers(0, 2**f.bits - 1, 20_000), [0, 1, 2**(f.bits - 1) - 2]])
        codes = codes[(codes + 1) % 2**(f.bits - 1) != 0]   # the next code has the same sign
        lower, upper = F.decode(codes, f), F.decode(codes + 1, f)
        keep = np.isfinite(lower) & np.isfinite(upper)
        lower, upper = lower[keep], upper[keep]
        grid = np.concatenate([lower, upper])
    ties = (lower + upper) / 2   # exact: adjacent values of a narrow format, halved in float64
    return np.concatenate([grid, ties, np.nextafter(ties, -math.inf), np.nextafter(ties, math.inf)])


@pytest.fixture(scope="module")
def values():
    """{"shared": values every format is tested on, format name: values for that format only}."""
    rng = np.random.default_rng(22)
    with np.errstate(invalid="ignore", over="ignore"):   # NaN bit patterns, nextafter past float64's largest
        return _values(rng)


def _values(rng):
    """The values fixture's work."""
    shared = [rng.integers(0, 2**64 - 1, 20_000, dtype=np.uint64, endpoint=True).view(np.float64),
              rng.integers(0, 2**32 - 1, 20_000, dtype=np.uint64, endpoint=True).astype(np.uint32)
              .view(np.float32).astype(np.float64),
              rng.standard_normal(5_000) * 10.0 ** rng.uniform(-45, 40, 5_000)]
    own = {}
    for f in F.list_formats():
        own[f.name] = grid_and_ties(f, rng)
        shared.append(edges(f))
        shared.append(rng.choice(own[f.name], min(own[f.name].size, 3_000), replace=False))
    out = {"shared": unique(np.concatenate(shared))}
    for name, x in own.items():
        out[name] = unique(np.concatenate([x, out["shared"]]))
    return out


@pytest.fixture(scope="module")
def js(chromium, request):
    """A page holding codecs.js, page.js and format_explorer.js (as the explorer bundles them), their
    functions published as globalThis.courseLib; prints the tally when the module's tests are done."""
    page = chromium.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content("<!doctype html><html><head><meta charset='utf-8'></head><body></body></html>")
    page.add_script_tag(content=bundle("format_explorer.js", expose=EXPOSE) + HELPERS, type="module")
    page.wait_for_function("() => globalThis.courseLib && globalThis.courseTest")
    yield page
    page.close()
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None and TALLY:
        with capture.global_and_fixture_disabled():   # pytest captures output during teardown
            reporter.write_line("")
            reporter.write_line("js/codecs.js and page.js against course_lib.formats: values compared, agreed")
            for (function, fmt), (compared, agreed) in sorted(TALLY.items()):
                reporter.write_line(f"  {function:<34} {fmt:<9} {compared:>9,} {agreed:>9,}")
    assert not errors, errors


def run_rounding(js, x, name, options):
    """JavaScript's roundToFormat and encode of each x: (stored, codes, indices of the values it refused)."""
    stored, codes, failed = js.evaluate(ROUND_JS, [to_text(x), name, options])
    return from_text(stored), from_text(codes), failed


def compare_rounding(js, x, f, function, **options):
    """roundToFormat and encode against round_to_format and encode on x; NaN into a format without NaN
    must be refused by both."""
    stored, codes, failed = run_rounding(js, x, f.name, options)
    nan = np.isnan(x)
    refused = np.zeros(x.size, bool)
    refused[failed] = True
    if f.has_nan:
        py = x
        assert not failed, (f.name, options, x[failed][:5])
    else:
        py = x[~nan]
        if nan.any():
            with pytest.raises(ValueError, match="has no NaN"):
                F.round_to_format(x[nan][:1], f, **options)
        count(function + " NaN refused", f.name, refused[nan])
        assert refused[nan].all() and not refused[~nan].any(), (f.name, options, x[refused & ~nan][:5])
        stored, codes = stored[~nan], codes[~nan]
    want_stored = F.round_to_format(py, f, **options)
    want_codes = F.encode(py, f, **options).astype(np.float64)
    agree_stored, agree_codes = same_bits(stored, want_stored), codes == want_codes
    count(function, f.name, agree_stored)
    count(function.replace("roundToFormat", "encode"), f.name, agree_codes)
    bad = ~(agree_stored & agree_codes)
    assert not bad.any(), [(v, s, w, c, d) for v, s, w, c, d in
                           zip(py[bad][:5], stored[bad], want_stored[bad], codes[bad], want_codes[bad])]


@pytest.mark.parametrize("name", NAMES)
def test_rounding_and_encoding_agree_bit_for_bit(js, values, name):
    f = F.get_format(name)
    compare_rounding(js, values[name], f, "roundToFormat")


@pytest.mark.parametrize("name", NAMES)
def test_rounding_rules_and_overflow_options_agree(js, values, name):
    """Every rounding and overflow option round_to_format takes: the same values where Python accepts the
    pair, the same refusal (an Error in the page, ValueError in Python) where it does not."""
    f = F.get_format(name)
    x = np.append(values["shared"][::3], math.nan)
    for overflow in OVERFLOWS:
        for rounding in ROUNDINGS:
            options = {"overflow": overflow, "rounding": rounding}
            try:
                F.round_to_format(np.array([1.0]), f, **options)
            except ValueError as error:
                refused = js.evaluate("""([name, options]) => { try { courseLib.roundToFormat(1, name, options); return null; }
                                         catch (error) { return error.message; } }""", [f.name, options])
                count("roundToFormat options refused", f.name, np.array([refused is not None]))
                assert refused is not None, (f.name, options, str(error))
                continue
            compare_rounding(js, x, f, "roundToFormat (options)", **options)


def test_just_below_half_the_smallest_subnormal_rounds_to_zero(js):
    """The issue's regression: the float just below half the smallest subnormal rounds to zero under every
    rounding rule (half away from zero computed as floor(x + 1/2) gave the smallest subnormal)."""
    for f in F.list_formats():
        if not f.signed:
            continue
        below_half = float(np.nextafter(f.min_subnormal / 2, 0.0))
        for rounding in ROUNDINGS:
            for sign in (1.0, -1.0):
                got = js.evaluate("([x, name, rounding]) => { const r = courseLib.roundToFormat(x, name, { rounding }); "
                                  "return Object.is(r, -0) ? '-0' : String(r); }", [sign * below_half, f.name, rounding])
                assert got == ("0" if sign > 0 else "-0"), (f.name, rounding, sign)
                assert float(F.round_to_format(np.array([sign * below_half]), f, rounding=rounding)[0]) == 0


def test_errors_for_what_a_format_cannot_hold(js):
    """NaN into FP4 and overflow "inf" for E4M3: the page throws where Python raises ValueError."""
    cases = [("FP4 E2M1", math.nan, {}), ("FP6 E2M3", math.nan, {}), ("FP8 E4M3", 1e6, {"overflow": "inf"}),
             ("E8M0", 1.0, {"overflow": "inf"}), ("FP4 E2M1", 1.0, {"overflow": "nan"}),
             ("FP16", 1.0, {"rounding": "up"}), ("FP16", 1.0, {"overflow": "wrap"})]
    for name, x, options in cases:
        with pytest.raises(ValueError):
            F.round_to_format(np.array([x]), name, **options)
        message = js.evaluate("""([text, name, options]) => { try { courseLib.roundToFormat(courseTest.floats(text)[0], name, options); return null; }
                                 catch (error) { return error.message; } }""", [to_text([x]), name, options])
        assert message, (name, x, options)
    assert "has no NaN" in js.evaluate("() => { try { courseLib.encode(NaN, 'FP4 E2M1'); } catch (e) { return e.message; } }")
    assert "unknown format" in js.evaluate("() => { try { courseLib.decode(0, 'FP17'); } catch (e) { return e.message; } }")
    assert "codes lie in 0..255" in js.evaluate("() => { try { courseLib.decode(256, 'E8M0'); } catch (e) { return e.message; } }")


def codes_of(f, rng) -> np.ndarray:
    """Every code of a format up to 16 bits; for TF32 and FP32, the first and last 2,000 codes of each sign
    (zeros, subnormals, the largest values, infinities, NaN) and 60,000 random ones."""
    if f.bits <= 16:
        return np.arange(2**f.bits, dtype=np.int64)
    half = 2 ** (f.bits - 1)
    ends = np.concatenate([np.arange(2000), half - 2000 + np.arange(4000), 2**f.bits - 2000 + np.arange(2000)])
    return np.concatenate([ends, rng.integers(0, 2**f.bits, 60_000)]).astype(np.int64)


@pytest.mark.parametrize("name", NAMES)
def test_decode_bit_strings_and_neighbours_agree_on_every_code(js, name):
    """decode and bitString on every code (TF32 and FP32: both ends of each sign and 60,000 random codes);
    neighbours on every code of the 8-bit and smaller formats and, for the wider ones, on both ends of each
    sign and 6,000 random codes (Python's neighbours runs one code at a time)."""
    f = F.get_format(name)
    rng = np.random.default_rng(7)
    codes = codes_of(f, rng)
    values, below, above, bits = js.evaluate(CODES_JS, [to_text(codes.astype(np.float64)), name])
    values, below, above, bits = from_text(values), from_text(below), from_text(above), bits.split(",")

    agree = same_bits(values, F.decode(codes, f))
    count("decode", name, agree)
    assert agree.all(), codes[~agree][:5]
    agree = np.array([b == F.bit_string(int(c), f) for b, c in zip(bits, codes)])
    count("bitString", name, agree)
    assert agree.all(), codes[~agree][:5]

    if f.bits <= 8:
        some = np.arange(codes.size)
    else:
        half = 2 ** (f.bits - 1)
        ends = np.flatnonzero((codes % half < 500) | (codes % half >= half - 500))
        some = np.unique(np.concatenate([ends, rng.integers(0, codes.size, 6_000)]))
    agree = np.empty(some.size, bool)
    for k, i in enumerate(some):
        py_below, py_above = F.neighbours(int(codes[i]), f)
        agree[k] = (same_float(below[i], NONE if py_below is None else py_below) and
                    same_float(above[i], NONE if py_above is None else py_above))
    count("neighbours", name, agree)
    assert agree.all(), codes[some[~agree]][:5]


@pytest.mark.parametrize("name", NAMES)
def test_explain_value_agrees_on_every_row(js, values, name):
    """explainValue's rows (stored value, code, bits, absolute and relative error) against explain_value,
    for every boundary of the format and 1,500 of its test values."""
    f = F.get_format(name)
    rng = np.random.default_rng(3)
    x = unique(np.concatenate([edges(f), rng.choice(values[name], 1_500, replace=False)]))
    rows = js.evaluate("""([text, name]) => [...courseTest.floats(text)].map((x) => {
        const r = courseLib.explainValue(x, [name])[0];
        return [courseTest.text(new Float64Array([r.stored, r.absError, r.relError])), r.code, r.bits]; })""",
                       [to_text(x), name])
    agree = []
    for value, (numbers, code, bits) in zip(x, rows):
        want = F.explain_value(float(value), [f])[0]
        stored, abs_error, rel_error = from_text(numbers)
        agree.append(bool(same_bits(stored, want.stored) and same_bits(abs_error, want.abs_error)
                          and same_bits(rel_error, want.rel_error)) and code == want.code and bits == want.bits)
    agree = np.array(agree)
    count("explainValue", name, agree)
    assert agree.all(), x[~agree][:5]


@pytest.mark.parametrize("name", [n for n in NAMES if F.get_format(n).bits <= 16])
def test_rounding_bins_are_exactly_what_rounds_to_each_code(js, name):
    """roundingBin (the readout's "numbers in [a, b) round to it") against round_to_format: each end rounds
    to the code's value exactly when the bin includes it, the float just inside always does, the float just
    outside never does; an unbounded end (saturation) takes float64's largest and the infinity too."""
    f = F.get_format(name)
    codes = np.arange(2**f.bits)
    bins = js.evaluate(
        """([n, name]) => { const lows = new Float64Array(n), highs = new Float64Array(n), ins = [];
            for (let c = 0; c < n; c++) { const b = courseLib.roundingBin(c, name);
              lows[c] = b ? b.low : NaN; highs[c] = b ? b.high : NaN; ins.push(b ? [b.lowIn, b.highIn] : null); }
            return [courseTest.text(lows), courseTest.text(highs), ins]; }""", [codes.size, name])
    lows, highs, ins = from_text(bins[0]), from_text(bins[1]), bins[2]
    v = F.decode(codes, f)
    finite_codes = ~np.isnan(v)
    assert [i is None for i in ins] == list(~finite_codes)
    v, lows, highs = v[finite_codes], lows[finite_codes], highs[finite_codes]
    low_in = np.array([i[0] for i in ins if i is not None])
    high_in = np.array([i[1] for i in ins if i is not None])

    def rounds_to_v(x):
        x = np.where(np.isnan(x), 0.0, x)
        return F.round_to_format(x, f) == v

    inward_low = np.where(np.isinf(lows), -np.finfo(np.float64).max, np.nextafter(lows, math.inf))
    inward_high = np.where(np.isinf(highs), np.finfo(np.float64).max, np.nextafter(highs, -math.inf))
    outward_low = np.where(np.isinf(lows), lows, np.nextafter(lows, -math.inf))
    outward_high = np.where(np.isinf(highs), highs, np.nextafter(highs, math.inf))
    agree = ((rounds_to_v(lows) == low_in) & (rounds_to_v(highs) == high_in) & rounds_to_v(inward_low)
             & rounds_to_v(inward_high) & (np.isinf(lows) | ~rounds_to_v(outward_low))
             & (np.isinf(highs) | ~rounds_to_v(outward_high)) & (lows <= v) & (v <= highs))
    count("roundingBin", name, agree)
    assert agree.all(), [(c, a, b) for c, a, b in zip(codes[finite_codes][~agree][:5], lows[~agree], highs[~agree])]


def python_kinds(codes, f) -> list[str]:
    """codeKind's names for codes, from Python's decode and the format's properties."""
    kinds = []
    for v in F.decode(np.asarray(codes, dtype=np.int64), f).tolist():
        if math.isnan(v):
            kinds.append("NaN")
        elif math.isinf(v):
            kinds.append("+infinity" if v > 0 else "-infinity")
        elif v == 0:
            kinds.append("negative zero" if math.copysign(1.0, v) < 0 else "zero")
        elif abs(v) == f.max_finite:
            kinds.append("largest")
        elif not f.signed and v == f.min_subnormal:
            kinds.append("smallest")
        else:
            kinds.append("subnormal" if abs(v) < f.min_normal else "normal")
    return kinds


@pytest.mark.parametrize("name", [n for n in NAMES if F.get_format(n).bits <= 16])
def test_code_kinds_on_every_code(js, name):
    f = F.get_format(name)
    kinds = js.evaluate("([n, name]) => Array.from({ length: n }, (_, c) => courseLib.codeKind(c, name))",
                        [2**f.bits, name])
    agree = np.array(kinds) == np.array(python_kinds(np.arange(2**f.bits), f))
    count("codeKind", name, agree)
    assert agree.all()


def test_stored_cells_round_long_values_and_keep_the_exact_one(js, values):
    """The table's stored-value cell (storedCell) on each format's stored values of its test values: the
    exact value in data-exact; whole when it has at most STORED_DIGITS significant digits, else rounded to
    them (toPrecision's rounding, ties away from zero) with "…" after it and the exact text as its tooltip."""
    assert js.evaluate("() => courseLib.STORED_DIGITS") == STORED_DIGITS
    rng = np.random.default_rng(5)
    shortened = 0
    for f in F.list_formats():
        x = rng.choice(values[f.name], 3_000, replace=False)
        stored = unique(F.round_to_format(x if f.has_nan else x[~np.isnan(x)], f))
        cells = js.evaluate("""(text) => [...courseTest.floats(text)].map((x) => { const td = courseLib.storedCell(x);
            return [td.textContent, td.dataset.exact, td.title, td.dataset.role]; })""", to_text(stored))
        agree = []
        for value, (text, exact, title, role) in zip(stored.tolist(), cells):
            rounded = significant(value, STORED_DIGITS) if math.isfinite(value) else value
            if same_float(rounded, value) or value == 0:
                shown_right = text == exact and title == ""
            else:
                shown_right = (text.endswith("…") and shown_number(text[:-1]) == rounded
                               and title == f"exactly {exact}")
            agree.append(role == "stored" and same_float(shown_number(exact), value) and shown_right)
            shortened += text.endswith("…")
        agree = np.array(agree)
        count("storedCell", f.name, agree)
        assert agree.all(), [(v, c) for v, c, a in zip(stored.tolist(), cells, agree) if not a][:5]
    assert shortened > 1_000   # FP32's values, mostly, and the narrow formats' subnormals


def test_the_largest_codes_say_what_overflow_does_in_their_own_sign(js):
    """The readout of the largest finite code of each sign: "larger numbers and inf saturate to it" or
    "from 65520 up, numbers round to inf", and for the negative one "more negative numbers and -inf" and
    "from -65520 down ... -inf"; the thresholds are Python's (max_finite + half a step), read back."""
    for f in F.list_formats():
        for sign in (1.0, -1.0) if f.signed else (1.0,):
            code = int(F.encode(np.array([sign * f.max_finite]), f)[0])
            text = js.evaluate("([code, name]) => courseLib.describeKind(code, name)", [code, f.name])
            first = "largest finite: " if sign > 0 else "most negative finite: "
            assert text.startswith(first), (f.name, sign, text)
            if f.overflow == "saturate":
                assert text == first + ("larger numbers and inf" if sign > 0 else "more negative numbers and -inf") + \
                    " saturate to it", (f.name, text)
                continue
            number, direction, beyond = text.removeprefix(first).removeprefix("from ").split(" ", 2)
            assert float(number) == sign * threshold(f), (f.name, text)
            assert direction == ("up," if sign > 0 else "down,"), (f.name, text)
            want = ("inf" if sign > 0 else "-inf") if f.has_inf else "NaN"
            assert beyond == f"numbers round to {want}", (f.name, text)


def test_format_notes_count_bits_in_the_singular_for_one(js):
    for f in F.list_formats():
        note = js.evaluate("(name) => courseLib.formatNote(name)", f.name)
        plural = "" if f.mantissa_bits == 1 else "s"
        assert f", {f.mantissa_bits} mantissa bit{plural}" in note and "1 mantissa bits" not in note, note
    assert "1 mantissa bit." in js.evaluate("() => courseLib.formatNote('FP4 E2M1')")


VALID_TEXTS = ["3.14159", "1e-45", "-0", ".5", "5.", "1E3", "inf", "-Infinity", "nan", "+inf", "INF", " 2.5 ",
               "0", "-0.0", "1e-8", "65520", "6e-8", "1.7976931348623157e308", "2.2250738585072014e-308",
               "4.9406564584124654e-324", "2.4703282292062328e-324", "9007199254740993", "0.1", "1e+3", "-.25e-2",
               "0e999", "0.000e-400"]
REFUSED_TEXTS = ["", "   ", "abc", "0x10", "1e400", "-1e400", "1_000", "1,5", "1e", "e5", "--1", "1.2.3", "nan1",
                 "infinity and beyond", "1e-400", "2.4703282292062327e-324"]


def random_decimal_texts(rng, n: int) -> list[str]:
    """Decimal texts of many shapes: up to 25 digits, a point anywhere or none, exponents -340..320."""
    texts = []
    for _ in range(n):
        digits = "".join(rng.choice(list("0123456789"), rng.integers(1, 26)))
        point = rng.integers(0, len(digits) + 1)
        mantissa = digits[:point] + "." + digits[point:] if rng.random() < 0.7 else digits
        exponent = f"{rng.choice(['e', 'E'])}{rng.integers(-340, 321)}" if rng.random() < 0.6 else ""
        sign = rng.choice(["", "-", "+"])
        text = sign + mantissa + exponent
        texts.append(text if text.strip(".+-eE") and mantissa != "." else "1")
    # the shortest texts of random doubles, and those texts with digits added (near-ties in decimal)
    for bits in rng.integers(0, 2**63 - 1, n // 4, dtype=np.int64):
        x = float(np.int64(bits).view(np.float64))
        if math.isfinite(x):
            texts += [repr(x), repr(x).replace("e", "00001e") if "e" in repr(x) else repr(x) + "00001"]
    return texts


def test_parse_number_agrees_with_float_and_refuses_what_it_cannot_read(js):
    """parseNumber against float() on decimal texts (hand-picked, then 4,000 random ones); the texts it
    refuses get a message: empty, words, hexadecimal, Python's digit separators (which float() accepts:
    the explorer refuses them, on purpose), and decimals beyond float64's range or below its smallest
    value, which float() would read as inf or 0."""
    rng = np.random.default_rng(11)
    texts = VALID_TEXTS + random_decimal_texts(rng, 4_000)
    results = js.evaluate("""(texts) => texts.map((t) => { const r = courseLib.parseNumber(t);
        return r.error !== undefined ? ["error", r.error] : ["value", courseTest.text(new Float64Array([r.value]))]; })""", texts)
    agree = []
    for text, (kind, result) in zip(texts, results):
        value = float(text)
        digits = text.strip().lower().split("e")[0]
        out_of_range = math.isinf(value) and "inf" not in text.lower()
        underflows = value == 0 and any(d in digits for d in "123456789")
        if out_of_range or underflows:
            agree.append(kind == "error" and ("range" in result or "smallest" in result))
        else:
            agree.append(kind == "value" and bool(same_bits(from_text(result)[0], value)))
    agree = np.array(agree)
    count("parseNumber", "-", agree)
    assert agree.all(), [t for t, a in zip(texts, agree) if not a][:5]
    assert all(kind == "value" for kind, _ in results[:len(VALID_TEXTS)])
    refused = js.evaluate("(texts) => texts.map((t) => courseLib.parseNumber(t).error ?? null)", REFUSED_TEXTS)
    count("parseNumber refuses", "-", np.array([bool(m) for m in refused]))
    assert all(refused), dict(zip(REFUSED_TEXTS, refused))
    assert "type a number" in refused[0] and "not a number" in refused[2] and "range" in refused[4]
    assert float("1_000") == 1000.0 and "not a number" in refused[6]


# ---- the explorer in a page ------------------------------------------------------------------------

def significant(x: float, digits: int = 3) -> float:
    """x to ``digits`` significant digits, ties away from zero, as toPrecision rounds it (page.js's approx,
    the table's long stored values)."""
    with localcontext() as context:
        context.prec, context.rounding = digits, ROUND_HALF_UP
        return float(+Decimal(x))


def assert_stored_cell(cell, stored: float, context) -> None:
    """A stored-value cell: the exact value in data-exact; shown whole when it has at most STORED_DIGITS
    significant digits, else rounded to them with "…" after, the exact text in the tooltip."""
    exact = cell.get_attribute("data-exact")
    assert same_bits(shown_number(exact), stored), (context, exact, stored)
    text = cell.inner_text().strip()
    rounded = significant(stored, STORED_DIGITS) if math.isfinite(stored) else stored
    if same_float(rounded, stored) or stored == 0:
        assert text == exact and not cell.get_attribute("title"), (context, text, exact)
    else:
        assert text.endswith("…") and shown_number(text[:-1]) == rounded, (context, text, rounded)
        assert cell.get_attribute("title") == f"exactly {exact}", context


def shown_number(text: str) -> float:
    return float(text.strip())


def assert_rows_equal_python(page, typed: str, names):
    for row in F.explain_value(float(typed), names):
        tr = page.locator(f'tr[data-format="{row.format}"]')
        cell = {role: tr.locator(f"[data-role={role}]").inner_text().strip()
                for role in ("bits", "stored", "abs-error", "rel-error")}
        if row.code is None:
            assert cell == {"bits": "-", "stored": "no code (no NaN)", "abs-error": "-", "rel-error": "-"}, (typed, row)
            continue
        assert cell["bits"] == row.bits, (typed, row)
        assert_stored_cell(tr.locator("[data-role=stored]"), row.stored, (typed, row))
        for role, want in (("abs-error", row.abs_error), ("rel-error", row.rel_error)):
            if math.isnan(want):
                assert cell[role] == "-", (typed, row, cell)
            else:
                assert shown_number(cell[role]) == significant(want), (typed, row, cell)


def test_typed_numbers_show_what_python_computes(page_with):
    page = page_with(format_explorer(0.1).html(), width=760)
    page.wait_for_selector("[data-mounted] [data-role=values] table")
    assert_rows_equal_python(page, "0.1", NAMES)
    for typed in ("3.14159", "65520", "65519.99", "1e-8", "-0", "nan", "inf", "-inf", "1e6", "448", "464",
                  "6e-8", "5e-324", "-1e-300", "1.5e300", "0.0625", "0.03125"):
        before = page.locator("[data-role=values]").inner_text()
        page.locator("[data-role=number]").fill(typed)
        assert page.locator("[data-role=values]").inner_text() != before, typed
        assert page.locator("[data-role=message]").inner_text() == ""
        assert_rows_equal_python(page, typed, NAMES)


def flip(code: int, position: int, bits: int) -> int:
    return code ^ (1 << (bits - 1 - position))


@pytest.mark.parametrize("name", NAMES)
def test_flipped_bits_decode_as_python_decodes(page_with, name):
    """Type 1, pick the format, click each bit in turn (left to right, then back), and after each click the
    readout shows Python's code, value and kind; a saturating format's largest value says it saturates."""
    f = F.get_format(name)
    page = page_with(format_explorer(1.0, "FP16").html(), width=760)
    page.wait_for_selector("[data-mounted] [data-role=bits] button")
    page.locator("[data-role=format]").select_option(name)
    code = int(F.encode(np.array([1.0]), f)[0])
    flipped = page.locator("[data-role=readout] [data-role=flipped]")
    assert flipped.count() == 0
    positions = list(range(f.bits)) + list(range(f.bits - 1, -1, -3))
    for position in positions:
        page.locator(f"[data-role=bits] button[data-position='{position}']").click()
        assert flipped.inner_text() == "(bits flipped: the table above still shows 1, the typed number)"
        code = flip(code, position, f.bits)
        assert page.locator("[data-role=code]").inner_text() == F.bit_string(code, f)
        assert same_bits(shown_number(page.locator("[data-role=decoded]").inner_text()),
                         float(F.decode(np.array([code]), f)[0])), (name, code)
        assert page.locator("[data-role=kind]").get_attribute("data-kind") == python_kinds([code], f)[0], (name, code)
    # the largest finite value and beyond: each format's own rule
    page.locator("[data-role=number]").fill("1e300")
    assert flipped.count() == 0   # a new number: its own code again
    kind = page.locator("[data-role=kind]")
    if f.has_inf:
        assert kind.get_attribute("data-kind") == "+infinity"
        assert f"[{F.bit_string(0, f)}" not in page.locator("[data-role=bin]").inner_text()
        page.locator("[data-role=number]").fill(repr(f.max_finite))
        assert "round to inf" in kind.inner_text() and repr(threshold(f)).removesuffix(".0") in kind.inner_text()
    elif f.overflow == "saturate":
        assert kind.get_attribute("data-kind") == "largest" and "saturate" in kind.inner_text()
        assert page.locator("[data-role=bin]").inner_text().endswith(", inf]")
    else:   # E8M0: overflow gives NaN, its only NaN code
        assert kind.get_attribute("data-kind") == "NaN" and "only NaN code" in kind.inner_text()
    note = page.locator("[data-role=note]").inner_text()
    assert note.startswith(name) and ("no NaN" in note if not f.has_nan else "NaN" in note)
    if f.has_nan:
        page.locator("[data-role=number]").fill("nan")
        assert kind.get_attribute("data-kind") == "NaN"
        assert page.locator("[data-role=decoded]").inner_text() == "NaN"


def test_formats_without_nan_show_no_code_and_rows_select_formats(page_with):
    page = page_with(format_explorer("nan", "FP4 E2M1").html(), width=760)
    page.wait_for_selector("[data-mounted] [data-role=values] table")
    assert page.locator('tr[data-format="FP4 E2M1"] [data-role=stored]').inner_text() == "no code (no NaN)"
    assert "has no NaN" in page.locator("[data-role=readout]").inner_text()
    assert page.locator("[data-role=bits] button").count() == 0
    page.locator('tr[data-format="FP8 E5M2"]').click()
    assert page.locator("[data-role=format]").input_value() == "FP8 E5M2"
    assert page.locator("[data-role=code]").inner_text() == "0 11111 11"
    assert page.locator('tr.selected').get_attribute("data-format") == "FP8 E5M2"


def test_bad_input_shows_a_message_and_the_explorer_keeps_working(page_with):
    page = page_with(format_explorer(2.5).html(), width=760)
    page.wait_for_selector("[data-mounted] [data-role=values] table")
    number, message = page.locator("[data-role=number]"), page.locator("[data-role=message]")
    table = page.locator("[data-role=values]").inner_text()
    for bad, why in (("", "type a number"), ("abc", "not a number"), ("1e400", "beyond float64's range"),
                     ("0x10", "not a number"), ("1_000", "not a number"), ("1e-400", "smallest")):
        number.fill(bad)
        assert why in message.inner_text() and "2.5" in message.inner_text(), bad
        assert number.get_attribute("aria-invalid") == "true"
        assert page.locator("[data-role=values]").inner_text() == table   # still 2.5's
        page.locator("[data-role=bits] button").first.click()              # the bits still flip
        assert page.locator("[data-role=flipped]").inner_text() == \
            "(bits flipped: the table above still shows 2.5, the last number read)"
    page.locator("[data-role=format]").select_option("BF16")
    assert page.locator("[data-role=code]").inner_text() == F.bit_string(int(F.encode(2.5, "BF16")), "BF16")
    number.fill("-7")
    assert message.inner_text() == "" and number.get_attribute("aria-invalid") is None
    assert_rows_equal_python(page, "-7", NAMES)


def test_an_explorer_that_starts_from_bad_text_says_so_and_still_flips_bits(page_with):
    page = page_with(format_explorer("abc", "FP8 E4M3").html())
    page.wait_for_selector("[data-mounted] [data-role=bits] button")
    assert "not a number" in page.locator("[data-role=message]").inner_text()
    assert page.locator("[data-role=values]").inner_text() == ""
    page.locator("[data-role=bits] button[data-position='1']").click()
    assert page.locator("[data-role=code]").inner_text() == "0 1000 000"
    assert page.locator("[data-role=flipped]").count() == 0   # no number read: the table is empty
    assert page.locator("[data-role=decoded]").inner_text() == "2"
    page.locator("[data-role=format]").select_option("FP16")
    assert page.locator("[data-role=code]").inner_text() == "0 00000 0000000000"


def test_the_table_fits_the_books_column_and_scrolls_if_it_ever_does_not(page_with):
    """In a 686 px box (the book's column at a 750 px window) the table fits for everyday numbers, rounded
    stored values (FP32's) and long subnormals alike; its wrapper scrolls sideways should a font be wider."""
    page = page_with(f"<div style='width: 686px'>{format_explorer(0.1).html()}</div>", width=750)
    page.wait_for_selector("[data-mounted] [data-role=values] table")
    values = page.locator("[data-role=values]")
    assert values.evaluate("(e) => getComputedStyle(e).overflowX") == "auto"
    for typed in ("0.1", "3.14159", "-1e9", "-6e-8", "-65519.99", "1e-40"):
        page.locator("[data-role=number]").fill(typed)
        width, room = values.evaluate("(e) => [e.querySelector('table').offsetWidth, e.clientWidth]")
        assert width <= room, (typed, width, room)


def test_a_few_formats_in_a_chosen_order(page_with):
    page = page_with(format_explorer(0.3333, "FP8 E4M3", ["BF16", "FP8 E4M3"]).html())
    page.wait_for_selector("[data-mounted] [data-role=values] table")
    rows = page.locator("[data-role=values] tbody tr")
    assert [rows.nth(i).get_attribute("data-format") for i in range(rows.count())] == ["BF16", "FP8 E4M3"]
    assert_rows_equal_python(page, "0.3333", ["BF16", "FP8 E4M3"])


# ---- check_in_page: the book's check of a rendered explorer ------------------------------------------

def mounted(page_with, explorer):
    page = page_with(explorer.html())
    page.wait_for_selector("[data-mounted] [data-role=values] table")
    root = page.locator(".course-explorer").first
    return page, root, json.loads(root.locator(".course-explorer-config").text_content())


@pytest.mark.parametrize("value", [0.1, "-3.14159", "nan"])
def test_check_in_page_passes_a_working_explorer(page_with, value):
    page, root, config = mounted(page_with, format_explorer(value, "FP8 E4M3"))
    assert check_in_page(root, config) == []


def test_check_in_page_reports_an_explorer_that_does_not_respond(page_with):
    page, root, config = mounted(page_with, format_explorer(0.1))
    page.evaluate("() => { const input = document.querySelector('[data-role=number]'); input.replaceWith(input.cloneNode(true)); }")
    problems = check_in_page(root, config)
    assert len(problems) == 1 and "changed nothing" in problems[0]


def test_check_in_page_reports_wrong_numbers(page_with):
    page, root, config = mounted(page_with, format_explorer(0.1))
    # a second listener, after the explorer's, spoils what it shows
    page.evaluate("""() => document.querySelector('[data-role=number]').addEventListener('input', () => {
        document.querySelector('tr[data-format="BF16"] [data-role=stored]').textContent = '3.14';
        document.querySelector('tr[data-format="FP32"] [data-role=stored]').dataset.exact = '-3.14159';
        document.querySelector('tr[data-format="TF32"] [data-role=stored]').textContent = '-3.14160156250…';
        document.querySelector('[data-role=decoded]').textContent = '1'; })""")
    problems = check_in_page(root, config)
    assert len(problems) == 4, problems
    assert problems[0].startswith("FP32: -3.14159 has exact stored value '-3.14159'")
    assert problems[1].startswith("TF32: -3.14159 shows stored value -3.14160156250…")   # whole, not rounded
    assert problems[2].startswith("BF16: -3.14159 shows stored value 3.14") and "readout shows value 1" in problems[3]


def test_check_in_page_reports_a_missing_explorer(page_with):
    page = page_with("<div class='course-explorer'></div>")
    problems = check_in_page(page.locator(".course-explorer"), {"formats": ["FP16"]})
    assert len(problems) == 1 and "check failed" in problems[0]
    assert check_in_page(page.locator(".course-explorer"), {"formats": ["FP17"]})[0].startswith(
        "the explorer's configuration names an unknown format")
    with pytest.raises(TypeError, match="config must be"):
        check_in_page(page.locator(".course-explorer"), None)
