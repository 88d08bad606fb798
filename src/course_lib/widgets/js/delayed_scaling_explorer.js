// Lesson 7's explorer: delayed scaling against an amax spike. A port of course_lib.studies.fp8.delayed_spike
// and the recipes it runs (course_lib.fp8.recipes): current scaling, scale = fp8_max / amax of this very
// tensor (amax_to_scale: in float64, then FP32); and Transformer Engine's DelayedScaling, where the scale for
// step t comes from the amaxes of earlier steps, a history of amax_history_len reduced by "max" or "most
// recent", scale = fp8_max / amax / 2^margin in FP32 (a step whose amax is zero or not finite keeps the
// previous scale, an FP32 overflow becomes FP32's max, the first step uses 1), as TE's DelayedScaling recipe
// and nvte_delayed_scaling_recipe_amax_and_scale_update define it. Every product is FP32 as in torch:
// Math.fround of the exact double product of two float32 values is torch's float32 product.
import { getFormat, roundToFormat, roundsPastMax } from "./codecs.js";
import { make, approx, percent, parseNumber } from "./page.js";
import { lineChart } from "./line_chart.js";

const FLOAT32_MAX = 3.4028234663852886e38;
const AMAX_FLOOR = 1e-12;   // course_lib.fp8.casts.AMAX_FLOOR (torchao's)

/** The float32 values of a base64 string of little-endian float32 bytes, as doubles. */
export function decodeValues(base64) {
  const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
  const view = new DataView(bytes.buffer);
  const out = new Float64Array(bytes.length / 4);
  for (let i = 0; i < out.length; i++) out[i] = view.getFloat32(4 * i, true);
  return out;
}

/** quantization_error of one per-tensor cast: x (float32 values) times scale s in FP32, cast to f with
 *  saturation, dequantised with the FP32 inverse scale. saturated: share with |x * s| rounding past the
 *  largest value (roundsPastMax) (float32 mean of 0/1: the float32 nearest count / n); flushed: share
 *  of the non-zero values that became 0 (float64); error: ||back - x|| / ||x||. torch sums the norms'
 *  float32 squares in float32; here they are summed in float64, so the error agrees to about 1e-6. */
export function castStats(x, normSquared, s, f) {
  const inverse = Math.fround(1 / s);
  let saturated = 0, flushed = 0, nonzero = 0, errorSquared = 0;
  for (let i = 0; i < x.length; i++) {
    const y = Math.fround(x[i] * s);
    const back = Math.fround(roundToFormat(y, f, { overflow: "saturate" }) * inverse);
    const d = Math.fround(back - x[i]);
    errorSquared += d * d;
    if (roundsPastMax(Math.abs(y), f)) saturated++;
    if (x[i] !== 0) {
      nonzero++;
      if (back === 0) flushed++;
    }
  }
  return { saturated: Math.fround(saturated / x.length), flushed: flushed / Math.max(1, nonzero),
    error: normSquared > 0 ? Math.sqrt(errorSquared) / Math.sqrt(normSquared) : 0 };
}

/** The scale TE's delayed rule gives from an amax history (oldest first), or `previous`. */
export function delayedScale(history, algorithm, previous, fmax, margin) {
  if (!history.length) return previous;
  const amax = algorithm === "max" ? Math.max(...history) : history[history.length - 1];
  if (!(Number.isFinite(amax) && amax > 0)) return previous;
  const scale = Math.fround(fmax / amax / 2 ** margin);
  return Number.isFinite(scale) ? scale : FLOAT32_MAX;
}

/** Names of the three recipes, as delayed_spike names them. */
export function recipeNames(history) {
  return ["current", `delayed, max of ${history}`, "delayed, most recent"];
}

/** delayed_spike on `values` (float32 as doubles): per step t the tensor values * gains[t] (times the spike's
 *  factor at spikeAt), its amax, and per recipe the scale used, saturated and flushed shares and error.
 *  `cache` (a Map, optional) keeps casts already done: a step's tensor and scale decide the result. */
export function runSpike(values, gains, settings, cache = null) {
  const { format, steps, spikeAt, factor, history, margin } = settings;
  const f = getFormat(format);
  const names = recipeNames(history);
  const out = { amax: [], recipes: Object.fromEntries(names.map((n) => [n, { scale: [], saturated: [], flushed: [], error: [] }])) };
  const x = new Float64Array(values.length);
  const seen = [];
  let maxScale = 1, recentScale = 1;
  for (let t = 0; t < steps; t++) {
    const gain = Math.fround(gains[t]);
    const spike = t === spikeAt ? Math.fround(factor) : 1;   // torch casts a Python float to float32 here
    let amax = 0, normSquared = 0;
    for (let i = 0; i < values.length; i++) {
      x[i] = Math.fround(Math.fround(values[i] * gain) * spike);
      amax = Math.max(amax, Math.abs(x[i]));
      normSquared += x[i] * x[i];
    }
    const current = Math.fround(f.maxFinite / Math.max(amax, AMAX_FLOOR));
    const scales = [current, maxScale, recentScale];
    scales.forEach((s, j) => {
      const key = `${format}|${t}|${gain}|${spike}|${s}`;
      let stats = cache?.get(key);
      if (!stats) {
        stats = castStats(x, normSquared, s, f);
        if (cache) {
          if (cache.size > 20000) cache.clear();
          cache.set(key, stats);
        }
      }
      const r = out.recipes[names[j]];
      r.scale.push(s);
      r.saturated.push(stats.saturated);
      r.flushed.push(stats.flushed);
      r.error.push(stats.error);
    });
    out.amax.push(amax);
    seen.push(amax);
    if (seen.length > history) seen.shift();
    maxScale = delayedScale(seen, "max", maxScale, f.maxFinite, margin);
    recentScale = delayedScale(seen, "most_recent", recentScale, f.maxFinite, margin);
  }
  return out;
}

/** Per recipe: at the spike (scale, saturated, error), the worst error after it, and the steps before it
 *  (mean error, mean flushed: summed in step order, as fp8_prose.margin_facts does), or null without any. */
export function summarize(run, spikeAt) {
  return Object.entries(run.recipes).map(([name, r]) => {
    const after = r.error.slice(spikeAt + 1);
    const mean = (a) => (spikeAt > 0 ? a.slice(0, spikeAt).reduce((s, v) => s + v, 0) / spikeAt : null);
    return { name, scale: r.scale[spikeAt], saturated: r.saturated[spikeAt], error: r.error[spikeAt],
      worstAfter: after.length ? Math.max(...after) : null, quietError: mean(r.error), quietFlushed: mean(r.flushed) };
  });
}

/** A flushed share (0..1) as a percentage with three decimals, zero included ("0.000%", "0.005%"), as the
 *  lesson's exercise prints it. */
export function flushedText(share) {
  return `${(100 * share).toFixed(3)}%`;
}

const FACTOR_NOTATION = /^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/;   // page.js's parseNumber's notation

/** Why the factor's text is not a factor in `range` ([lo, hi]), or undefined: page.js's parseNumber, with
 *  hints that suit a factor (positive, no sign). */
export function factorError(text, range) {
  const t = String(text).trim();
  if (t === "") return "type the spike's factor, e.g. 50";
  if (!FACTOR_NOTATION.test(t) && !/^[+-]?(inf|infinity|nan)$/i.test(t)) {
    return `"${t.slice(0, 40)}" is not a number: write it like 50, 0.5 or 1e3`;
  }
  const parsed = parseNumber(t);
  if (parsed.error !== undefined) return parsed.error;
  const [lo, hi] = range;
  if (!(parsed.value >= lo && parsed.value <= hi)) {
    return `the spike's factor must lie between ${lo} and ${hi} (a factor of 1 is no spike), got ${t}`;
  }
  return undefined;
}

const STYLE = [{ colour: "#0072B2", dash: "" }, { colour: "#D55E00", dash: "6 3" }, { colour: "#AA4499", dash: "2 2" }];

function slider(role, label, min, max, value, unit) {
  const input = make("input", { type: "range", min: String(min), max: String(max), step: "1", value: String(value),
    ariaLabel: label, dataset: { role } });
  const shown = make("b", { text: String(value) });
  input.addEventListener("input", () => { shown.textContent = input.value; });
  return { input, node: make("label", {}, `${label} `, shown, unit, " ", input) };
}

export function mount(root, config) {
  const values = decodeValues(config.values);
  if (values.length !== config.count) throw new Error(`expected ${config.count} values, found ${values.length}`);
  const f = getFormat(config.format);
  const cache = new Map();
  const settings = { format: f.name, steps: config.steps, spikeAt: config.spikeAt, factor: config.factor,
    history: config.history, margin: config.margin };
  const history = slider("history", "amax history", 1, config.historyMax, settings.history, " steps");
  const margin = slider("margin", "margin", 0, config.marginMax, settings.margin, "");
  const spikeAt = slider("spike-step", "spike at step", 0, config.steps - 1, settings.spikeAt, "");
  const factor = make("input", { type: "text", value: String(config.factor), ariaLabel: "the spike's factor",
    spellcheck: false, dataset: { role: "factor" } });
  factor.style.width = "6em";
  const message = make("p", { className: "course-explorer-message", dataset: { role: "message" }, role: "status" });
  const summary = make("p", { className: "readout", dataset: { role: "summary" } });
  const tableBox = make("div", { dataset: { role: "table" } });
  const chart = make("div", { dataset: { role: "chart" } });

  function draw() {
    const run = runSpike(values, config.gains, settings, cache);
    const names = Object.keys(run.recipes);
    const rows = summarize(run, settings.spikeAt);
    const [current, delayedMax] = rows;
    summary.replaceChildren(`At the spike (step ${settings.spikeAt}, ×${settings.factor}): ${delayedMax.name} saturates `,
      make("b", { text: percent(delayedMax.saturated) }), ` of the values (error ${approx(100 * delayedMax.error)}%); current scaling `,
      make("b", { text: percent(current.saturated) }), ` (error ${approx(100 * current.error)}%).` +
      (delayedMax.worstAfter === null ? "" : ` After the spike, ${delayedMax.name} reaches an error of up to ` +
        `${approx(100 * delayedMax.worstAfter)}%` + (delayedMax.quietError === null ? "." :
        ` (before it: ${approx(100 * delayedMax.quietError)}% on average).`)));
    const cell = (v, text) => (v === null ? "-" : text(v));
    const head = ["recipe", "scale at the spike", "saturated at the spike", "error at the spike", "worst error after it",
      "mean error before it", "mean flushed before it"];
    const th = (h) => {
      const node = make("th", { text: h });
      node.style.cssText = "white-space: normal; max-width: 6.5em; vertical-align: bottom;";
      return node;
    };
    tableBox.replaceChildren(make("table", {}, make("thead", {}, make("tr", {}, ...head.map(th))),
      make("tbody", {}, ...rows.map((r) => make("tr", { dataset: { recipe: r.name } },
        make("td", { text: r.name }), make("td", { className: "num", text: approx(r.scale, 4) }),
        make("td", { className: "num", text: percent(r.saturated) }),
        make("td", { className: "num", text: `${approx(100 * r.error)}%` }),
        make("td", { className: "num", text: cell(r.worstAfter, (v) => `${approx(100 * v)}%`) }),
        make("td", { className: "num", text: cell(r.quietError, (v) => `${approx(100 * v)}%`) }),
        make("td", { className: "num", text: cell(r.quietFlushed, flushedText) }))))));
    const series = (key, transform = (v) => v, format = undefined) => names.map((name, j) => ({
      name, ...STYLE[j], values: run.recipes[name][key].map(transform), format }));
    chart.replaceChildren(lineChart({
      legend: names.map((name, j) => ({ name, ...STYLE[j] })), xLabel: "step", markX: settings.spikeAt,
      panels: [
        { label: "scale (log)", log: true, series: series("scale", undefined, (v) => approx(v, 4)) },
        { label: "saturated (%)", log: false, min: 0, max: 100, series: series("saturated", (v) => 100 * v, (v) => `${approx(v)}%`) },
        { label: "relative error (log)", log: true, series: series("error", undefined, (v) => approx(v)) },
      ] }));
    chart.dataset.settings = JSON.stringify({ history: settings.history, margin: settings.margin,
      spikeAt: settings.spikeAt, factor: settings.factor });
    chart.dataset.margin = String(settings.margin);
    chart.dataset.series = JSON.stringify(run);
  }

  function readFactor() {
    const error = factorError(factor.value, config.factorRange);
    if (error !== undefined) {
      message.textContent = `${error}; the chart still shows ×${settings.factor}`;
      factor.setAttribute("aria-invalid", "true");
      return false;
    }
    message.textContent = "";
    factor.removeAttribute("aria-invalid");
    settings.factor = parseNumber(factor.value).value;
    return true;
  }

  history.input.addEventListener("input", () => { settings.history = Number(history.input.value); draw(); });
  margin.input.addEventListener("input", () => { settings.margin = Number(margin.input.value); draw(); });
  spikeAt.input.addEventListener("input", () => { settings.spikeAt = Number(spikeAt.input.value); draw(); });
  factor.addEventListener("input", () => { if (readFactor()) draw(); });
  root.append(
    make("div", {}, history.node, margin.node), make("div", {}, spikeAt.node, make("label", {}, "spike ×", factor)),
    message, summary, tableBox, chart,
    make("p", { text: `${f.name}; ${config.steps} steps, each the tensor times a gain in ${config.gainRange[0]}..${config.gainRange[1]}. Computed in this page ` +
      (config.count === config.of ? `on all ${config.of.toLocaleString("en-US")} of the tensor's values.` :
        `on ${config.count.toLocaleString("en-US")} of the tensor's ${config.of.toLocaleString("en-US")} values ` +
        "(every k-th, and the largest, so the amax and the scales are the whole tensor's).") }));
  draw();
}
