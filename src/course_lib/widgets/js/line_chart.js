// Small SVG line charts for the explorers, drawn without any library: panels stacked over one shared x axis
// (steps), each with its own y axis (linear, or log10 where values span decades), a legend, and a marked x.
// Text and axes use currentColor, so the chart follows the page's light or dark theme.

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attributes = {}, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, String(value));
  node.append(...children);
  return node;
}

/** Tick values for an axis from lo to hi: powers of ten (with 2 and 5 between them when the range spans
 *  under two decades; every second or third power where it spans many) on a log axis, round steps on a linear one. A log axis too short for two of those
 *  (0.0178 to 0.0316 holds only 0.02) gets round linear steps instead (0.02, 0.025, 0.03), so that every
 *  axis has at least two labelled ticks to read a scale from. */
export function ticks(lo, hi, log) {
  if (!(hi > lo)) return [lo];
  if (log) {
    const decades = logTicks(lo, hi);
    return decades.length >= 2 ? decades : ticks(lo, hi, false).filter((v) => v > 0);
  }
  const raw = (hi - lo) / 4;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * magnitude).find((s) => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

function logTicks(lo, hi) {
  const first = Math.floor(Math.log10(lo)), last = Math.ceil(Math.log10(hi));
  const mantissas = last - first <= 2 ? [1, 2, 5] : [1];
  const every = Math.ceil((last - first + 1) / 7);   // over 7 decades: every second (or third) one labelled
  const out = [];
  for (let e = first; e <= last; e++) {
    if (((e % every) + every) % every) continue;   // keep 1 = 10**0 among them
    for (const m of mantissas) {
      const v = m * 10 ** e;
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) out.push(v);
    }
  }
  return out;
}

/** A tick's text, to three significant digits: 0.001 as "1e-3", 0.0025 as "2.5e-3", 20000 as "2e4", plain
 *  between 0.01 and 9999. */
export function tickText(v) {
  if (v === 0) return "0";
  const rounded = Number(v.toPrecision(3));
  const a = Math.abs(rounded);
  if (a >= 0.01 && a < 1e4) return String(rounded);
  return rounded.toExponential().replace("e+", "e");
}

/** An SVG element: `panels` stacked, each {label, log, min?, max?, series: [{name, colour, dash, values}]}
 *  over x = 0 .. n-1; `xLabel` under the last panel; `markX` a dotted vertical line (or null); `legend`
 *  [{name, colour, dash}] above the first panel. Points not finite, or not positive on a log axis, are
 *  left out (the line breaks there). Every point carries a <title> with its value, for a hover. */
export function lineChart({ panels, xLabel, markX = null, legend = [], width = 720, panelHeight = 130 }) {
  const left = 64, right = 12, top = legend.length ? 26 : 8, gap = 14, bottom = 36;
  const height = top + panels.length * panelHeight + (panels.length - 1) * gap + bottom;
  const n = Math.max(...panels.flatMap((p) => p.series.map((s) => s.values.length)));
  const x = (i) => left + (n > 1 ? (i / (n - 1)) * (width - left - right) : 0);
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img",
    style: `max-width: ${width}px; font-size: 11px; font-family: sans-serif; overflow: visible;` });
  let lx = left;
  for (const item of legend) {
    root.append(svg("line", { x1: lx, x2: lx + 26, y1: 10, y2: 10, stroke: item.colour, "stroke-width": 2,
      "stroke-dasharray": item.dash ?? "" }));
    const text = svg("text", { x: lx + 31, y: 14, fill: "currentColor" }, item.name);
    root.append(text);
    lx += 40 + 6.2 * item.name.length;
  }
  panels.forEach((panel, p) => {
    const y0 = top + p * (panelHeight + gap), y1 = y0 + panelHeight;
    const values = panel.series.flatMap((s) => s.values).filter((v) => Number.isFinite(v) && (!panel.log || v > 0));
    let lo = panel.min ?? (values.length ? Math.min(...values) : 0);
    let hi = panel.max ?? (values.length ? Math.max(...values) : 1);
    if (panel.log) {
      if (!(lo > 0)) lo = hi > 0 ? hi / 10 : 1;
      if (!(hi > lo)) { lo /= 2; hi = lo * 4; }
      // widen to the quarter decades around the values
      lo = 10 ** (Math.floor(Math.log10(lo) * 4) / 4);
      hi = 10 ** (Math.ceil(Math.log10(hi) * 4) / 4);
    } else if (!(hi > lo)) { hi = lo + 1; }
    const scale = panel.log ? (v) => (Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))
      : (v) => (v - lo) / (hi - lo);
    const y = (v) => y1 - scale(v) * panelHeight;
    root.append(svg("rect", { x: left, y: y0, width: width - left - right, height: panelHeight, fill: "none",
      stroke: "currentColor", "stroke-opacity": 0.5 }));
    for (const t of ticks(lo, hi, panel.log)) {
      root.append(svg("line", { x1: left, x2: width - right, y1: y(t), y2: y(t), stroke: "currentColor",
        "stroke-opacity": 0.12 }));
      root.append(svg("text", { x: left - 4, y: y(t) + 4, "text-anchor": "end", fill: "currentColor" }, tickText(t)));
    }
    const label = svg("text", { x: 12, y: (y0 + y1) / 2, "text-anchor": "middle", fill: "currentColor",
      transform: `rotate(-90 12 ${(y0 + y1) / 2})` }, panel.label);
    root.append(label);
    if (markX !== null) {
      root.append(svg("line", { x1: x(markX), x2: x(markX), y1: y0, y2: y1, stroke: "currentColor",
        "stroke-dasharray": "2 3", "stroke-opacity": 0.7 }));
    }
    for (const s of panel.series) {
      const ok = (v) => Number.isFinite(v) && (!panel.log || v > 0);
      let d = "";
      s.values.forEach((v, i) => {
        if (!ok(v)) return;
        d += `${d && ok(s.values[i - 1]) ? "L" : "M"}${x(i).toFixed(1)},${y(v).toFixed(1)}`;
      });
      root.append(svg("path", { d, fill: "none", stroke: s.colour, "stroke-width": 1.8, "stroke-dasharray": s.dash ?? "" }));
      s.values.forEach((v, i) => {
        if (!ok(v)) return;
        root.append(svg("circle", { cx: x(i).toFixed(1), cy: y(v).toFixed(1), r: 2.2, fill: s.colour },
          svg("title", {}, `${s.name}, step ${i}: ${s.format ? s.format(v) : tickText(v)}`)));
      });
    }
    if (p === panels.length - 1) {
      for (const t of ticks(0, n - 1, false)) {
        if (!Number.isInteger(t)) continue;
        root.append(svg("text", { x: x(t), y: y1 + 14, "text-anchor": "middle", fill: "currentColor" }, String(t)));
      }
      root.append(svg("text", { x: (left + width - right) / 2, y: y1 + 30, "text-anchor": "middle", fill: "currentColor" }, xLabel));
    }
  });
  return root;
}
