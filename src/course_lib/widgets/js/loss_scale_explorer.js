// Lesson 3's explorer: move the loss scale 2^k and see the shares of the gradients that survive the cast as
// normal or subnormal numbers, flush to zero or overflow. The gradients arrive as cells (loss_scale.py's
// gradient_cells): a count and the smallest and largest magnitude of values that share a class at every
// power-of-two scale. Each cell's two ends are classified here with the codec's rounding, as
// course_lib.gradients.summarize_underflow classifies every value; the shares are formed as
// sweep_loss_scale forms them, so they equal Python's to the bit.
import { getFormat, roundToFormat, roundsPastMax, pow2 } from "./codecs.js";
import { make, exact, percent } from "./page.js";

export const CLASSES = ["normal", "subnormal", "flushed", "overflow"];

/** What casting |a| * 2^log2Scale to format f does, as summarize_underflow says: "overflow" (beyond the
 *  largest finite value: rounds to inf, or NaN where there is no inf; rounds past the largest value in a
 *  format without either), "flushed" (rounds to zero), "subnormal" or "normal". `a` is a positive magnitude. */
export function classify(a, log2Scale, fmt) {
  const f = getFormat(fmt);
  const scaled = a * pow2(log2Scale);   // exact: a power of two only moves the exponent
  const r = roundToFormat(scaled, f, { overflow: f.hasInf ? "inf" : f.hasNan ? "nan" : "saturate" });
  if (f.hasNan ? !Number.isFinite(r) : roundsPastMax(scaled, f)) return "overflow";
  if (r === 0) return "flushed";
  return r < f.minNormal ? "subnormal" : "normal";
}

/** Counts per class of the configuration's non-zero gradients at scale 2^log2Scale. Throws if a cell's two
 *  ends fall in different classes (its values could not all share one). */
export function countsAt(config, log2Scale) {
  const f = getFormat(config.format);
  const counts = { normal: 0, subnormal: 0, flushed: 0, overflow: 0 };
  for (const [count, smallest, largest] of config.cells) {
    const kind = classify(smallest, log2Scale, f);
    const other = classify(largest, log2Scale, f);
    if (kind !== other) {
      throw new Error(`the cell from ${exact(smallest)} to ${exact(largest)} is both ${kind} and ${other} at 2^${log2Scale}: ` +
        `its data was not cut at ${f.name}'s rounding edges`);
    }
    counts[kind] += count;
  }
  return counts;
}

/** The counts and the shares of the non-zero gradients, formed as sweep_loss_scale forms them (ScaleSweep):
 *  flushed, subnormal, overflow = count / n; survive = 1 - (flushed + overflow); normal = survive - subnormal. */
export function sharesAt(config, log2Scale) {
  const counts = countsAt(config, log2Scale);
  const n = config.nonzero;
  const flushed = counts.flushed / n, subnormal = counts.subnormal / n, overflow = counts.overflow / n;
  const survive = 1 - (flushed + overflow);
  return { counts, flushed, subnormal, overflow, survive, normal: survive - subnormal };
}

// Lesson 3's figure's colours (course_lib.plots.loss_scaling.plot_scale_sweep; the test reads them off the
// figure): normal, flushed, overflow and "survive (all)" as its lines are drawn; subnormal, which the figure
// does not draw (survive minus normal), in the lighter blue of the same palette.
export const COLOURS = { flushed: "#E69F00", subnormal: "#56B4E9", normal: "#0072B2", overflow: "#CC79A7", survive: "#009E73" };
const LABELS = {
  normal: "survive as normal numbers", subnormal: "survive as subnormals (fewer significant bits)",
  flushed: "flush to zero", overflow: "overflow",
};

/** Read a typed loss scale: a power of two, as 65536, 2^16, 2**16 or 0.25. Returns {log2} or {error}. */
export function parseScale(text, lo, hi) {
  const t = String(text).trim();
  if (t === "") return { error: "type a loss scale, a power of two such as 65536 or 2^16" };
  let k;
  const power = /^2\s*(\^|\*\*)\s*([+-]?\d+)$/.exec(t);
  if (power) k = Number(power[2]);
  else {
    if (!/^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/.test(t)) {
      return { error: `"${t.slice(0, 40)}" is not a loss scale: write a power of two such as 65536, 2^16 or 0.25` };
    }
    const x = Number(t);
    if (!(x > 0) || !Number.isFinite(x)) return { error: `${t.slice(0, 40)} is not a positive finite scale` };
    k = Math.round(Math.log2(x));
    if (k < -1022 || k > 1023) return { error: `${t.slice(0, 40)} is far outside this explorer's range, 2^${lo} to 2^${hi}` };
    if (pow2(k) !== x) {
      return { error: `${t.slice(0, 40)} is not a power of two: loss scales are powers of two (GradScaler's are), ` +
        "and this explorer counts exactly for those" };
    }
  }
  if (!(k >= lo && k <= hi)) return { error: `2^${k} is outside this explorer's range, 2^${lo} to 2^${hi}` };
  return { log2: k };
}

/** A share as a percentage; survive - subnormal can come out a hair below zero (-2e-17), shown as 0.00%.
 *  Two decimals, more where two would round a share short of all to 100.00% (34 gradients lost of a
 *  million) or a share above none to 0.00%: a reader must not see "all" or "none" where some are lost. */
function shareText(share) {
  const s = share < 0 && share > -5e-5 ? 0 : share;
  let digits = 2;
  const rounded = (d) => (100 * s).toFixed(d);
  while (digits < 8 && ((s < 1 && Number(rounded(digits)) >= 100) || (s > 0 && Number(rounded(digits)) <= 0))) {
    digits += 1;
  }
  return digits === 2 ? percent(s) : `${rounded(digits)}%`;
}

function scaleText(k) {
  return k >= 0 && k <= 53 ? String(pow2(k)) : `2^${k}`;
}

export function mount(root, config) {
  const f = getFormat(config.format);
  const [lo, hi] = config.log2Range;
  let k = config.start;
  const slider = make("input", { type: "range", min: String(lo), max: String(hi), step: "1", value: String(k),
    ariaLabel: "log2 of the loss scale", dataset: { role: "log2-scale" } });
  const halve = make("button", { type: "button", text: "÷2", title: "halve the scale", dataset: { role: "halve" } });
  const double = make("button", { type: "button", text: "×2", title: "double the scale", dataset: { role: "double" } });
  const typed = make("input", { type: "text", value: scaleText(k), ariaLabel: "loss scale",
    spellcheck: false, dataset: { role: "scale-text" } });
  typed.style.width = "11em";   // 2^40 = 1099511627776 in full
  const message = make("p", { className: "course-explorer-message", dataset: { role: "message" }, role: "status" });
  const readout = make("p", { className: "readout", dataset: { role: "readout" } });
  const bar = make("div", { dataset: { role: "bar" }, ariaHidden: "true" });
  bar.style.cssText = "display: flex; height: 1.1em; width: 100%; max-width: 600px; border: 1px solid #888; margin: 0.3em 0;";
  const rows = make("tbody");
  const grid = make("table", {}, make("thead", {}, make("tr", {},
    ...["", "what the cast does", "share", "gradients"].map((h) => make("th", { text: h })))), rows);

  function show() {
    let s;
    try {
      s = sharesAt(config, k);
    } catch (error) {
      message.textContent = `cannot count at 2^${k}: ${error.message}`;
      return;
    }
    slider.value = String(k);
    halve.disabled = k <= lo;
    double.disabled = k >= hi;
    const scale = pow2(k);
    readout.dataset.log2 = String(k);
    readout.replaceChildren("loss scale ", make("b", { text: `2^${k}` }), ` = ${exact(scale)}: `,
      make("b", { text: shareText(s.survive) }), ` of the ${config.nonzero.toLocaleString("en-US")} non-zero gradients survive the cast to ${f.name}, `,
      make("b", { text: shareText(s.normal) }), " as normal numbers");
    bar.replaceChildren(...["flushed", "subnormal", "normal", "overflow"].map((c) => {
      const part = make("span", { title: `${LABELS[c]}: ${shareText(s[c])}` });
      part.style.cssText = `width: ${Math.max(0, 100 * s[c])}%; background: ${COLOURS[c]};`;
      return part;
    }));
    const row = (kind, label, share, count, colour) => {
      const swatch = make("span", { ariaHidden: "true" });
      swatch.style.cssText = `display: inline-block; width: 0.9em; height: 0.9em; background: ${colour ?? "transparent"};`;
      return make("tr", { dataset: { class: kind, share: String(share), ...(count === null ? {} : { count: String(count) }) } },
        make("td", {}, swatch), make("td", { text: label }),
        make("td", { className: "num", text: shareText(share), dataset: { role: "percent" } }),
        make("td", { className: "num", text: count === null ? "" : count.toLocaleString("en-US") }));
    };
    rows.replaceChildren(
      ...CLASSES.map((c) => row(c, LABELS[c], s[c], s.counts[c], COLOURS[c])),
      row("survive", "survive in all (normal + subnormal)", s.survive, s.counts.normal + s.counts.subnormal, COLOURS.survive));
    rows.lastChild.style.fontWeight = "600";
  }

  function go(next, fromText = false) {
    k = Math.min(hi, Math.max(lo, next));
    message.textContent = "";
    typed.removeAttribute("aria-invalid");
    if (!fromText) typed.value = scaleText(k);
    show();
  }

  slider.addEventListener("input", () => go(Number(slider.value)));
  halve.addEventListener("click", () => go(k - 1));
  double.addEventListener("click", () => go(k + 1));
  typed.addEventListener("input", () => {
    const parsed = parseScale(typed.value, lo, hi);
    if (parsed.error !== undefined) {
      message.textContent = `${parsed.error}; still showing 2^${k}`;
      typed.setAttribute("aria-invalid", "true");
      return;
    }
    go(parsed.log2, true);
  });
  const zeros = config.zeros ? ` ${config.zeros.toLocaleString("en-US")} gradients that are exactly zero are left out.` : "";
  const noInf = f.hasInf ? "" : ` (no infinity: values that ${f.hasNan ? "round" : "lie"} beyond the largest finite value ` +
    "count as overflow, saturated or not)";
  root.append(
    make("label", {}, `loss scale 2^${lo} … 2^${hi}: `, slider), halve, " ", double, " ",
    make("label", {}, " or type one: ", typed), message, readout, bar, grid,
    make("p", { dataset: { role: "limits" }, text: `${f.name}: largest finite ${exact(f.maxFinite)}, smallest normal ` +
      `${exact(f.minNormal)}, smallest subnormal ${exact(f.minSubnormal)}${noInf}. A gradient g flushes to zero when ` +
      `|g × scale| is at most half the smallest subnormal, ${exact(f.minSubnormal / 2)} (that tie rounds to even: ` +
      `zero).${zeros}` }));
  show();
}
