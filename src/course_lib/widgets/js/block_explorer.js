// Lesson 8's explorer: one block of 32 values with an outlier to drag, quantised as MXFP8, MXFP4 (FLOOR or
// RCEIL) or NVFP4. quantizeBlock ports course_lib.mx.BlockScaling.quantize operation by operation: the
// library computes in FP32 (torch), so every FP32 step here is rounded with Math.fround, and the element
// and scale roundings are codecs.js's. tests/test_widgets_blocks.py checks it against the library bit for bit.
import { getFormat, roundToFormat, roundsPastMax, encode, bitString, pow2, binade } from "./codecs.js";
import { make, exact, approx, parseNumber } from "./page.js";

export const BLOCK_SIZE = 32;
const E8M0_BIAS = 127;
const f32 = Math.fround;

// the same table as course_lib.widgets.blocks.BLOCK_FORMATS (the tests compare the two)
export const BLOCK_FORMATS = {
  "MXFP8 FLOOR": { element: "FP8 E4M3", block: 32, scale: "E8M0", mode: "floor" },
  "MXFP8 RCEIL": { element: "FP8 E4M3", block: 32, scale: "E8M0", mode: "rceil" },
  "MXFP4 FLOOR": { element: "FP4 E2M1", block: 32, scale: "E8M0", mode: "floor" },
  "MXFP4 RCEIL": { element: "FP4 E2M1", block: 32, scale: "E8M0", mode: "rceil" },
  "NVFP4": { element: "FP4 E2M1", block: 16, scale: "FP8 E4M3", mode: null },
};

const LABELS = {
  "MXFP8 FLOOR": "MXFP8: E4M3 elements, E8M0 scale by FLOOR (the OCP spec)",
  "MXFP8 RCEIL": "MXFP8: E4M3 elements, E8M0 scale by RCEIL (NVIDIA)",
  "MXFP4 FLOOR": "MXFP4: E2M1 elements, E8M0 scale by FLOOR (the OCP spec)",
  "MXFP4 RCEIL": "MXFP4: E2M1 elements, E8M0 scale by RCEIL (NVIDIA)",
  "NVFP4": "NVFP4: E2M1 elements, two blocks of 16, E4M3 scales, FP32 tensor scale",
};

/** ceil(log2(q)) of a positive finite number (frexp's exponent, less one for a power of two). */
function ceilLog2(q) {
  const b = binade(q);
  return q === pow2(b) ? b : b + 1;
}

/** The unbiased E8M0 exponent (-127..127) of a block with FP32 maximum magnitude `amax` (e8m0_exponents). */
export function e8m0Exponent(amax, element, mode) {
  const f = getFormat(element);
  if (!(amax > 0)) return -E8M0_BIAS;          // a zero block: the smallest scale
  let e;
  if (mode === "floor") e = binade(amax) - f.maxExponent;   // floor(log2 amax) - emax_elem
  else if (mode === "rceil") {
    const quotient = f32(amax / f.maxFinite);               // the FP32 quotient, rounded up to a power of two
    e = quotient > 0 ? ceilLog2(quotient) : -E8M0_BIAS;     // an underflowed quotient: the smallest scale
  } else throw new Error(`unknown scale mode ${mode}`);
  return Math.min(Math.max(e, -E8M0_BIAS), E8M0_BIAS);
}

const clamp = (v, lo, hi) => Math.min(Math.max(v, lo), hi);   // NaN stays NaN, as in torch.clamp

/** Relative L2 error of `back` against `x` (float64 sums), leaving out element `skip` (-1: none). */
function relativeError(x, back, skip) {
  let error = 0, norm = 0;
  for (let i = 0; i < x.length; i++) {
    if (i === skip) continue;
    const d = back[i] - x[i];
    error += d * d;
    norm += x[i] * x[i];
  }
  return norm > 0 ? Math.sqrt(error) / Math.sqrt(norm) : 0;
}

/** Quantise 32 numbers (rounded to FP32 first) as one tensor in block format `name` (BLOCK_FORMATS), as
 *  BlockScaling.quantize does. Throws an Error whose message explains inf or NaN among the values, and
 *  NVFP4's breakdown for a tensor whose largest magnitude is below about 8e-36 (NaN elements). */
export function quantizeBlock(values, name, outlierIndex = -1) {
  const spec = BLOCK_FORMATS[name];
  if (!spec) throw new Error(`unknown block format ${JSON.stringify(name)}; known: ${Object.keys(BLOCK_FORMATS).join(", ")}`);
  if (!Array.isArray(values) || values.length !== BLOCK_SIZE) throw new Error(`a block holds ${BLOCK_SIZE} values`);
  const x = values.map((v) => f32(v));
  const bad = x.findIndex((v) => !Number.isFinite(v));
  if (bad >= 0) {
    const why = Number.isNaN(x[bad]) ? "is NaN" : Number.isFinite(values[bad]) ? `(${exact(values[bad])}) is beyond FP32's range (about 3.4e38): in FP32 it is ${exact(x[bad])}` : `is ${exact(x[bad])}`;
    throw new Error(`element ${bad} ${why}; block formats have no way to scale inf or NaN (course_lib.mx refuses it too)`);
  }
  const f = getFormat(spec.element);
  const blocks = BLOCK_SIZE / spec.block;
  const blockOf = (i) => Math.floor(i / spec.block);
  const amaxes = Array.from({ length: blocks }, (_, b) => Math.max(...x.slice(b * spec.block, (b + 1) * spec.block).map(Math.abs)));
  let exponents = null, blockScales, scales, scaleCodes, tensorScale = 1;
  const scaled = new Array(BLOCK_SIZE);
  if (spec.scale === "E8M0") {
    exponents = amaxes.map((a) => e8m0Exponent(a, f, spec.mode));
    blockScales = exponents.map((e) => pow2(e));       // exact in FP32 (2**-127 is an FP32 subnormal)
    scales = blockScales;
    scaleCodes = exponents.map((e) => e + E8M0_BIAS);
    for (let i = 0; i < BLOCK_SIZE; i++) scaled[i] = f32(x[i] / scales[blockOf(i)]);
  } else {
    const e4m3 = getFormat(spec.scale);
    const tensorAmax = Math.max(...amaxes);
    tensorScale = tensorAmax > 0 ? f32(tensorAmax / (e4m3.maxFinite * f.maxFinite)) : 1;   // amax / (448 * 6)
    // torchao/NVIDIA: E4M3(block_amax / 6 / tensor_scale), clamped to E4M3's normal range first
    blockScales = amaxes.map((a) => roundToFormat(clamp(f32(f32(a / f.maxFinite) / tensorScale), e4m3.minNormal, e4m3.maxFinite), e4m3));
    scaleCodes = blockScales.map((s) => encode(s, e4m3));
    const inverse = f32(1 / tensorScale);
    if (!Number.isFinite(inverse)) {
      throw new Error(`${name} cannot scale this tensor: its largest magnitude ${approx(tensorAmax)} is too small ` +
        "for an FP32 tensor scale (its reciprocal overflows FP32, and every element would be NaN); course_lib.mx refuses it too");
    }
    const reciprocals = blockScales.map((s) => f32(inverse / s));
    scales = blockScales.map((s) => f32(tensorScale * s));
    for (let i = 0; i < BLOCK_SIZE; i++) scaled[i] = f32(x[i] * reciprocals[blockOf(i)]);
  }
  const big = f.maxFinite;
  const elements = scaled.map((s) => roundToFormat(clamp(s, -big, big), f));
  const dequantised = elements.map((e, i) => f32(e * scales[blockOf(i)]));
  return {
    name, spec, outlierIndex, values: x, amaxes, exponents, blockScales, scales, scaleCodes, tensorScale, scaled, elements, dequantised,
    elementCodes: elements.map((e) => encode(e, f)),
    saturated: scaled.map((s) => roundsPastMax(Math.abs(s), f)),   // where the clamp changes the value
    flushed: x.map((v, i) => v !== 0 && dequantised[i] === 0),
    relativeError: relativeError(x, dequantised, -1),
    otherError: outlierIndex >= 0 ? relativeError(x, dequantised, outlierIndex) : NaN,
  };
}

// ---- the display

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attributes)) {
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, String(v));
  }
  node.append(...children);
  return node;
}

const WIDTH = 720, HEIGHT = 282, LEFT = 52, RIGHT = 8, TOP = 14, PLOT = 200;
const SLOT = (WIDTH - LEFT - RIGHT) / BLOCK_SIZE;
// the outlier's blue and orange: darker than the other bars', and at least 3:1 against both the book's light
// background (white: 4.2 and 4.3) and its dark one (rgb(41, 49, 61): 3.2 and 3.1); the flushed red and the
// saturated purple too (light surface #f3f4f5: 3.6 and 3.9; dark surface #29313d: 3.3 and 3.1)
const COLOURS = { positive: "#6baed6", negative: "#fd8d3c", outlier: "#3182bd", outlierNegative: "#d94801",
  stored: "currentColor", flushed: "#e8443a", saturated: "#9467bd", band: "rgba(116, 196, 118, 0.25)", axis: "#888",
  grid: "rgba(128, 128, 128, 0.3)" };   // readable on the book's light and dark backgrounds

/** Text for a magnitude's binade: 2^k. */
function powerLabel(k) {
  return svg("text", {}, "2", svg("tspan", { dy: -5, "font-size": 10, text: String(k) }));
}

// The slider's and the drag's top, log2 of the outlier: 2**127.75 (about 2.86e38) keeps every stored value
// finite in FP32; above about 2**127.81 MXFP4 RCEIL stores the outlier as 4 * 2**126 = 2**128, which is inf.
export const OUTLIER_LOG2_MAX = 127.75;
const OUTLIER_LOG2_MIN = -30;

/** Axis range (log2 of magnitudes) that shows every value, stored value and the scale's range. */
function axisRange(result) {
  const f = getFormat(result.spec.element);
  const logs = [];
  for (const v of [...result.values, ...result.dequantised]) if (v !== 0 && Number.isFinite(v)) logs.push(Math.log2(Math.abs(v)));
  for (const s of result.scales) if (s > 0) logs.push(Math.log2(s * f.minSubnormal), Math.log2(s * f.maxFinite));
  let lo = Math.floor(Math.min(...logs)) - 1, hi = Math.ceil(Math.max(...logs)) + 3;
  if (hi - lo < 12) lo = hi - 12;
  return [lo, hi];
}

/** A relative error as a percentage; "infinite" where a stored value overflowed FP32 (never "inf%"). */
function errorText(error) {
  return Number.isFinite(error) ? `${approx(100 * error)}%` : "infinite";
}

/** The sentence on all 32 values' error: ||error|| / ||block||, with the outlier's part in it named, and any
 *  stored value that overflowed FP32 (an element times its scale at 2**128 or beyond) said so. */
function wholeText(result) {
  const x = result.values;
  const norm = x.reduce((s, v) => s + v * v, 0);     // float64: no overflow for FP32 values
  const index = result.outlierIndex;
  const share = norm > 0 && index >= 0 ? x[index] * x[index] / norm : 0;
  const parts = [`All ${BLOCK_SIZE} values: ‖error‖ / ‖block‖ = ${errorText(result.relativeError)}`];
  const overflowed = result.dequantised.findIndex((d) => !Number.isFinite(d));
  if (overflowed >= 0) {
    const b = Math.floor(overflowed / result.spec.block);
    const scale = result.exponents ? [" × 2", make("sup", { text: String(result.exponents[b]) })] : [` × ${exact(result.scales[b])}`];
    parts.push(`: element ${overflowed}'s stored value, ${exact(result.elements[overflowed])}`, ...scale,
      ", is beyond FP32's largest value (about 3.4e38) and overflows to inf; the outlier is too close to FP32's top for this scale.");
  } else if (share >= 0.5) {
    parts.push(`, a ratio dominated by the outlier (it is ${approx(100 * share)}% of ‖block‖²), so it says little about the others.`);
  } else {
    parts.push(".");
  }
  return parts;
}

/** The details table: one row per element; a flushed or saturated element's row tinted, its stored value
 *  marked (× flushed to 0, ⊤ saturated). */
function elementTable(result, index) {
  const f = getFormat(result.spec.element);
  const head = ["element", "value (FP32)", "value / scale", "code (bits)", "element value", "stored value"];
  const rows = result.values.map((v, i) => {
    const state = result.flushed[i] ? "flushed" : result.saturated[i] ? "saturated" : "";
    const marker = make("b", { text: state === "flushed" ? " ×" : state === "saturated" ? " ⊤" : "", dataset: { role: "marker" } });
    if (state) marker.style.color = state === "flushed" ? COLOURS.flushed : COLOURS.saturated;
    const stored = make("td", { className: "num", title: state === "flushed" ? "flushed to 0" : state === "saturated" ?
      `saturated: clamped at ${f.name}'s largest value, ${exact(f.maxFinite)}` : "" }, approx(result.dequantised[i], 5), marker);
    const row = make("tr", { dataset: { index: String(i), state } },
      make("td", { text: String(i) + (i === index ? " outlier" : ""), style: i === index ? "font-weight: 600" : "" }),
      make("td", { className: "num", text: approx(v, 5) }), make("td", { className: "num", text: approx(result.scaled[i], 5) }),
      make("td", {}, make("code", { text: bitString(result.elementCodes[i], f) })),
      make("td", { className: "num", text: exact(result.elements[i]) }), stored);
    if (state) row.style.background = state === "flushed" ? "rgba(232, 68, 58, 0.12)" : "rgba(148, 103, 189, 0.15)";
    return row;
  });
  return make("div", {},
    make("p", { className: "note", text: `Stored value: element value × scale. × (red row): flushed to 0; ⊤ (purple row): saturated, ` +
      `clamped at ${f.name}'s largest value, ${exact(f.maxFinite)}. Code: ${f.bits} bits, sign first.` }),
    make("table", {}, make("thead", {}, make("tr", {}, ...head.map((h) => make("th", { text: h })))), make("tbody", {}, ...rows)));
}

export function mount(root, config) {
  const base = config.values.map(Number);
  if (base.length !== BLOCK_SIZE) throw new Error(`the explorer needs ${BLOCK_SIZE} values, got ${base.length}`);
  const index = config.outlierIndex;
  const names = (config.formats ?? Object.keys(BLOCK_FORMATS)).filter((n) => n in BLOCK_FORMATS);
  if (!(config.format in BLOCK_FORMATS)) throw new Error(`unknown block format ${JSON.stringify(config.format)}`);
  let axis = null, dragging = false, last = null;

  const picker = make("select", { ariaLabel: "block format", dataset: { role: "format" } },
    ...names.map((n) => make("option", { value: n, text: LABELS[n], selected: n === config.format })));
  const box = make("input", { type: "text", value: String(config.outlier), spellcheck: false,
    ariaLabel: `value of element ${index}, the outlier`, dataset: { role: "outlier" } });
  const slider = make("input", { type: "range", min: OUTLIER_LOG2_MIN, max: OUTLIER_LOG2_MAX, step: 0.25, value: 0,
    ariaLabel: "log2 of the outlier's magnitude", dataset: { role: "outlier-slider" } });
  const message = make("p", { className: "course-explorer-message", role: "status", style: "margin: 0.2em 0",
    dataset: { role: "message" } });
  const picture = svg("svg", { viewBox: `0 0 ${WIDTH} ${HEIGHT}`, width: "100%", role: "img",
    "data-role": "plot", style: `max-width:${WIDTH}px; font-family:sans-serif; font-size:11px` });
  const summary = make("div", { className: "readout", dataset: { role: "summary" } });
  const details = make("details", {}, make("summary", { text: "each element: value, code, stored value" }));
  const grid = make("div", { dataset: { role: "elements" }, style: "overflow-x: auto; max-width: 100%" });
  details.append(grid);

  const outlierText = (v) => String(Number(v.toPrecision(3)));

  function syncSlider(v) {
    slider.value = String(v === 0 ? slider.min : clamp(Math.round(Math.log2(Math.abs(v)) * 4) / 4, OUTLIER_LOG2_MIN, OUTLIER_LOG2_MAX));
  }

  function draw(result) {
    const f = getFormat(result.spec.element);
    if (!dragging || axis === null) axis = axisRange(result);
    const [lo, hi] = axis;
    const y = (log) => TOP + PLOT * (hi - clamp(log, lo, hi)) / (hi - lo);
    const bottom = TOP + PLOT;
    const nodes = [];
    // the magnitudes each block's scale can hold, and half its smallest (below it, values round to 0)
    const perBlock = result.spec.block;
    result.scales.forEach((s, b) => {
      const x0 = LEFT + b * perBlock * SLOT, x1 = x0 + perBlock * SLOT;
      const top = y(Math.log2(s * f.maxFinite)), low = y(Math.log2(s * f.minSubnormal));
      nodes.push(svg("rect", { x: x0, y: top, width: x1 - x0, height: Math.max(0, low - top), fill: COLOURS.band }));
      const flushLine = y(Math.log2(s * f.minSubnormal / 2));
      nodes.push(svg("line", { x1: x0, x2: x1, y1: flushLine, y2: flushLine, stroke: COLOURS.flushed, "stroke-dasharray": "4 3", "stroke-width": 1 }));
      if (b > 0) nodes.push(svg("line", { x1: x0, x2: x0, y1: TOP, y2: bottom + 30, stroke: COLOURS.axis, "stroke-dasharray": "2 2" }));
    });
    // axis: a tick every `step` binades
    const step = [1, 2, 4, 5, 10, 20, 25, 50].find((s) => (hi - lo) / s <= 8);
    for (let k = Math.ceil(lo / step) * step; k <= hi; k += step) {
      nodes.push(svg("line", { x1: LEFT - 4, x2: WIDTH - RIGHT, y1: y(k), y2: y(k), stroke: COLOURS.grid, "stroke-width": 0.5 }));
      const label = powerLabel(k);
      label.setAttribute("x", LEFT - 6); label.setAttribute("y", y(k) + 4); label.setAttribute("text-anchor", "end");
      label.setAttribute("fill", COLOURS.axis);
      nodes.push(label);
    }
    nodes.push(svg("line", { x1: LEFT, x2: WIDTH - RIGHT, y1: bottom, y2: bottom, stroke: COLOURS.axis }));
    const hexWidth = Math.ceil(f.bits / 4);
    const hex = (code) => code.toString(16).padStart(hexWidth, "0");
    const minusZero = hex(2 ** (f.bits - 1));      // the sign bit alone: -0
    const codeHelp = `each element's ${f.bits}-bit ${f.name} code in hexadecimal: ${hex(0)} is +0, ${minusZero} is −0 ` +
      `(the sign bit alone: a negative value rounded to zero), ${hex(encode(f.maxFinite, f))} is the largest, ${exact(f.maxFinite)}. ` +
      "Red: the value was flushed to 0; purple: saturated. Hover a code for its bits.";
    nodes.push(svg("text", { x: LEFT - 6, y: bottom + 14, "text-anchor": "end", fill: COLOURS.axis, "font-size": 10,
      "data-role": "code-label" }, "code", svg("tspan", { x: LEFT - 6, dy: 11, text: "(hex)" }), svg("title", { text: codeHelp })));
    for (let i = 0; i < BLOCK_SIZE; i++) {
      const v = result.values[i], stored = result.dequantised[i];
      const cx = LEFT + (i + 0.5) * SLOT;
      const negative = v < 0 || Object.is(v, -0);
      const outlier = i === index;
      const colour = outlier ? (negative ? COLOURS.outlierNegative : COLOURS.outlier) : (negative ? COLOURS.negative : COLOURS.positive);
      const title = `element ${i}: ${exact(v)} → code ${bitString(result.elementCodes[i], f)} = ${exact(result.elements[i])} × scale = ${exact(stored)}` +
        (result.saturated[i] ? " (saturated)" : "") + (result.flushed[i] ? " (flushed to zero)" : "");
      if (v !== 0) {
        const top = y(Math.log2(Math.abs(v)));
        nodes.push(svg("rect", { x: cx - 6, y: top, width: 12, height: Math.max(1, bottom - top), fill: colour, "data-index": i,
          style: outlier ? "cursor:ns-resize; touch-action:none" : "" },
          svg("title", { text: title })));
      } else {
        nodes.push(svg("text", { x: cx, y: bottom - 3, "text-anchor": "middle", fill: COLOURS.axis, text: "0" }));
      }
      if (result.flushed[i]) {
        nodes.push(svg("text", { x: cx, y: bottom - 3, "text-anchor": "middle", fill: COLOURS.flushed, "font-weight": "bold", text: "×" }));
      } else if (stored !== 0) {
        const sy = y(Math.log2(Math.abs(stored)));
        nodes.push(svg("line", { x1: cx - 8, x2: cx + 8, y1: sy, y2: sy, stroke: result.saturated[i] ? COLOURS.saturated : COLOURS.stored, "stroke-width": 2.5,
          "pointer-events": "none" }));
      }
      const state = result.flushed[i] ? "flushed" : result.saturated[i] ? "saturated" : "";
      nodes.push(svg("text", { x: cx, y: bottom + 16, "text-anchor": "middle", "font-family": "monospace", "font-size": 10,
        fill: result.flushed[i] ? COLOURS.flushed : result.saturated[i] ? COLOURS.saturated : "currentColor",
        "data-role": "code", "data-index": i, "data-code": result.elementCodes[i], "data-dequantised": exact(stored),
        "data-state": state, text: hex(result.elementCodes[i]) }, svg("title", { text: title })));
    }
    // the outlier's handle: drag it up or down (or use the slider and the text box)
    const hv = result.values[index];
    const hy = hv === 0 ? bottom : y(Math.log2(Math.abs(hv)));
    const handle = svg("circle", { cx: LEFT + (index + 0.5) * SLOT, cy: hy, r: 8, fill: "#fff", stroke: COLOURS.outlier,
      "stroke-width": 2.5, style: "cursor:ns-resize; touch-action:none", "data-role": "handle" }, svg("title", { text: "drag the outlier up or down" }));
    nodes.push(handle);
    const hs = result.dequantised[index];
    if (hs !== 0 && !result.flushed[index]) {   // the outlier's stored value, drawn again over its handle
      const sy = y(Math.log2(Math.abs(hs)));
      nodes.push(svg("line", { x1: LEFT + (index + 0.5) * SLOT - 8, x2: LEFT + (index + 0.5) * SLOT + 8, y1: sy, y2: sy,
        stroke: result.saturated[index] ? COLOURS.saturated : COLOURS.stored, "stroke-width": 2.5, "pointer-events": "none" }));
    }
    nodes.push(svg("text", { x: LEFT + (index + 0.5) * SLOT, y: bottom + 30, "text-anchor": "middle", fill: "currentColor",
      "font-weight": "bold", text: "outlier" }));
    // the key in the page's text colour: the only key to the chart, it must read as text, not as a faint axis
    const legend = svg("text", { x: LEFT, y: HEIGHT - 18, fill: "currentColor" },
      "bars: |value| (blue +, orange −) · tick: stored value · ",
      svg("tspan", { fill: COLOURS.flushed, text: "× / red: flushed to 0" }), " · ",
      svg("tspan", { fill: COLOURS.saturated, text: "purple: saturated" }), " · green: what the scale can hold");
    nodes.push(legend, svg("text", { x: LEFT, y: HEIGHT - 4, fill: "currentColor", "data-role": "code-legend" },
      `code: the element's ${f.bits} bits in hex; ${minusZero} is −0 (the sign bit alone), what a negative value flushed to 0 keeps`,
      svg("title", { text: codeHelp })));
    picture.replaceChildren(...nodes);
  }

  function scaleText(result) {
    const f = getFormat(result.spec.element);
    if (result.spec.scale === "E8M0") {
      const e = result.exponents[0], code = result.scaleCodes[0];
      const rule = result.spec.mode === "floor" ? `FLOOR: ⌊log2 amax⌋ − ${f.maxExponent}` : `RCEIL: ⌈log2(amax / ${f.maxFinite})⌉`;
      return [`Block scale: E8M0 code ${code} (bits ${bitString(code, "E8M0")}) = 2`, make("sup", { text: String(e) }),
        ` = ${exact(result.scales[0])}, from amax ${approx(result.amaxes[0], 4)} by ${rule}.`];
    }
    const parts = [`Tensor scale (FP32): ${approx(result.tensorScale, 6)} = amax / 2688. Block scales (E4M3): `];
    result.scaleCodes.forEach((code, b) => {
      parts.push(`${b * 16}–${b * 16 + 15}: code ${code} (bits ${bitString(code, "FP8 E4M3")}) = ${exact(result.blockScales[b])}`,
        b === 0 ? "; " : ".");
    });
    return parts;
  }

  function show() {
    const name = picker.value;
    const parsed = parseNumber(box.value);
    if (parsed.error !== undefined) {
      message.textContent = `outlier: ${parsed.error}`;
      box.setAttribute("aria-invalid", "true");
      return;
    }
    const values = base.slice();
    values[index] = parsed.value;
    let result;
    try {
      result = quantizeBlock(values, name, index);
    } catch (error) {
      message.textContent = error.message;
      box.setAttribute("aria-invalid", "true");
      return;
    }
    message.textContent = "";
    box.removeAttribute("aria-invalid");
    last = result;
    if (!dragging) syncSlider(result.values[index]);
    draw(result);
    const f = getFormat(result.spec.element);
    const others = result.values.filter((v, i) => i !== index && v !== 0).length;
    const flushedOthers = result.flushed.filter((z, i) => z && i !== index).length;
    const saturated = result.saturated.filter(Boolean).length;
    summary.replaceChildren(
      make("p", {}, ...scaleText(result)),
      make("p", { dataset: { role: "others" } }, `The ${BLOCK_SIZE - 1} values beside the outlier: relative error `,
        make("b", { text: errorText(result.otherError) }), "; ",
        make("b", { text: `${flushedOthers} of ${others}` }), ` non-zero values flushed to 0 (below the dashed line: half of ${f.minSubnormal} × scale); ` +
        `${saturated} saturated.`),
      make("p", { dataset: { role: "whole" } }, ...wholeText(result)));
    Object.assign(summary.dataset, { scaleCodes: result.scaleCodes.join(","), error: exact(result.relativeError),
      otherError: exact(result.otherError), flushed: String(result.flushed.filter(Boolean).length),
      saturated: String(saturated), outlierText: box.value });
    grid.replaceChildren(elementTable(result, index));
  }

  // dragging the outlier: its height is log2 of its magnitude on the plot's axis (frozen while dragging)
  function dragTo(event) {
    const box_ = picture.getBoundingClientRect();
    const svgY = (event.clientY - box_.top) * HEIGHT / box_.height;
    const [lo, hi] = axis;
    const log = clamp(hi - (svgY - TOP) * (hi - lo) / PLOT, -149, OUTLIER_LOG2_MAX);
    const sign = last && (last.values[index] < 0 || Object.is(last.values[index], -0)) ? -1 : 1;
    box.value = outlierText(sign * 2 ** log);
    show();
  }
  picture.addEventListener("pointerdown", (event) => {
    const target = event.target;
    const onOutlier = target.getAttribute("data-role") === "handle" ||
      (target.tagName === "rect" && target.getAttribute("data-index") === String(index));
    if (!onOutlier) return;
    if (axis === null) return;
    dragging = true;
    picture.setPointerCapture(event.pointerId);
    event.preventDefault();
  });
  picture.addEventListener("pointermove", (event) => { if (dragging) dragTo(event); });
  const stop = (event) => {
    if (!dragging) return;
    dragging = false;
    if (picture.hasPointerCapture(event.pointerId)) picture.releasePointerCapture(event.pointerId);
    show();      // redraw on an axis that fits the new values
  };
  picture.addEventListener("pointerup", stop);
  picture.addEventListener("pointercancel", stop);

  slider.addEventListener("input", () => {
    const sign = last && last.values[index] < 0 ? -1 : 1;
    box.value = outlierText(sign * 2 ** Number(slider.value));
    show();
  });
  box.addEventListener("input", show);
  picker.addEventListener("change", show);
  root.append(
    make("div", {}, make("label", {}, "format: ", picker)),
    make("div", {}, make("label", {}, `outlier (element ${index}): `, box), make("label", {}, "log2 |outlier|: ", slider)),
    message, picture, summary, details);
  show();
}
