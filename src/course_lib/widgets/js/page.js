// What every explorer shares: mounting into its output, small DOM helpers, number text in and out, and a
// clear message in place of a result when the input is bad (the page itself never breaks).

const STYLE_ID = "course-explorer-style";
const CSS = `
.course-explorer { font-size: 0.9rem; margin: 0.5em 0 1em; padding: 0.6em 0.8em; border-radius: 6px;
  border: 1px solid var(--pst-color-border, #ccc); color: var(--pst-color-text-base, inherit);
  background: var(--pst-color-surface, transparent); overflow-x: auto; }
.course-explorer label { margin-right: 1em; white-space: nowrap; }
.course-explorer input[type=text] { width: 12em; font-family: var(--pst-font-family-monospace, monospace); }
.course-explorer input, .course-explorer select, .course-explorer button { font-size: inherit;
  color: inherit; background: var(--pst-color-background, #fff); border: 1px solid var(--pst-color-border, #999);
  border-radius: 4px; padding: 0.1em 0.3em; }
.course-explorer button:disabled { opacity: 0.4; cursor: not-allowed; }
.course-explorer table { border-collapse: collapse; margin: 0.4em 0; }
.course-explorer th, .course-explorer td { white-space: nowrap; padding: 0.1em 0.8em 0.1em 0; text-align: left; }
.course-explorer td.num { font-variant-numeric: tabular-nums; }
.course-explorer code { white-space: nowrap; }
.course-explorer .course-explorer-message { color: var(--pst-color-danger, #b00020); font-weight: 600; min-height: 1.2em; }
.format-bits { display: flex; flex-wrap: wrap; gap: 0.2em 0.7em; margin: 0.3em 0; }
.format-bits .field { display: inline-flex; flex-direction: column; align-items: center; }
.format-bits small { font-size: 0.75em; opacity: 0.8; }
.format-bits button { width: 1.35em; padding: 0.15em 0; margin: 0 1px; font-family: monospace; cursor: pointer; }
.format-bits .sign, .format-table .sign { background: #f4c7c3; color: #000; }
.format-bits .exponent, .format-table .exponent { background: #c6dbef; color: #000; }
.format-bits .mantissa, .format-table .mantissa { background: #c7e9c0; color: #000; }
.format-table-wrap { overflow-x: auto; max-width: 100%; }
.course-explorer .format-table { font-size: 0.88em; }
.course-explorer .format-table th, .course-explorer .format-table td { padding-right: 0.6em; }
.format-table td code span { padding: 0 1px; border-radius: 2px; }
.format-table tr.selected td { font-weight: 600; }
.format-table tbody tr { cursor: pointer; }
.course-explorer .note { font-size: 0.85em; margin: 0.2em 0; opacity: 0.85; }
.course-explorer .readout { margin: 0.3em 0; }
.course-explorer .format-message { margin: 0.3em 0 0; }
.course-explorer .format-message:empty { display: none; }
`;

/** Mount `mount(element, config)` into every not yet mounted output of explorer `name` on the page. */
export function mountAll(name, mount) {
  if (!document.getElementById(STYLE_ID)) {
    const style = document.createElement("style");
    style.id = STYLE_ID;
    style.textContent = CSS;
    document.head.appendChild(style);
  }
  for (const element of document.querySelectorAll(`.course-explorer[data-explorer="${name}"]:not([data-mounted])`)) {
    element.dataset.mounted = "1";
    try {
      const config = JSON.parse(element.querySelector(".course-explorer-config").textContent);
      mount(element, config);
    } catch (error) {
      element.append(make("p", { className: "course-explorer-message", text: `this explorer failed to start: ${error.message}` }));
    }
  }
}

/** A new element: make("td", {className: "num", text: "1.5"}, child, ...). */
export function make(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "text") node.textContent = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key in node) node[key] = value;
    else node.setAttribute(key, value);
  }
  node.append(...children);
  return node;
}

/** A table with a header row and rows of cells (strings, or nodes); numbers' cells get class "num". */
export function table(headers, rows) {
  const head = make("tr", {}, ...headers.map((h) => make("th", { text: h })));
  const body = rows.map((cells) => make("tr", {}, ...cells.map((c) =>
    c instanceof Node ? make("td", {}, c) : make("td", { text: String(c), className: /^[-+\d.]/.test(String(c)) ? "num" : "" }))));
  return make("table", {}, make("thead", {}, head), make("tbody", {}, ...body));
}

/** The shortest text that reads back as the same double (JavaScript's own), "inf", "-inf" or "NaN". */
export function exact(x) {
  if (Number.isNaN(x)) return "NaN";
  if (x === Infinity) return "inf";
  if (x === -Infinity) return "-inf";
  if (Object.is(x, -0)) return "-0";
  return String(x);
}

/** `x` to `digits` significant digits ("1.23e-5" style below 1e-4 and from 1e6), for errors and shares. */
export function approx(x, digits = 3) {
  if (!Number.isFinite(x)) return exact(x);
  if (x === 0) return "0";
  const rounded = Number(x.toPrecision(digits));   // round first: 999552 is "1.00e6", not "1000000"
  const a = Math.abs(rounded);
  return a < 1e-4 || a >= 1e6 ? rounded.toExponential(digits - 1).replace(/e\+?/, "e") : String(rounded);
}

/** A share (0..1) as a percentage with two decimals, as the lessons print shares. */
export function percent(share) {
  return `${(100 * share).toFixed(2)}%`;
}

const DECIMAL = /^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/;
const SPECIAL = /^([+-]?)(inf|infinity|nan)$/i;

/** Read a number typed by a reader: decimal notation (1, -0.5, 3.14159, 6e-8), inf or nan. Returns
 *  {value} or {error: "why"}: empty text, words, and numbers beyond float64's range are refused. */
export function parseNumber(text) {
  const t = String(text).trim();
  if (t === "") return { error: "type a number, e.g. 0.1 or 6e-8" };
  const special = SPECIAL.exec(t);
  if (special) {
    if (special[2].toLowerCase() === "nan") return { value: NaN };
    return { value: special[1] === "-" ? -Infinity : Infinity };
  }
  if (!DECIMAL.test(t)) return { error: `"${t.slice(0, 40)}" is not a number: write it like 0.1, -2.5 or 6e-8` };
  const value = Number(t);
  if (!Number.isFinite(value)) return { error: `${t.slice(0, 40)} is beyond float64's range (about 1.8e308): type inf for infinity` };
  if (value === 0 && /[1-9]/.test(t.replace(/[eE].*$/, ""))) {
    return { error: `${t.slice(0, 40)} is below float64's smallest value (about 4.9e-324): it would be read as 0` };
  }
  return { value };
}
