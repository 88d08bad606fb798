// Lesson 1's explorer: type a number and see how every format stores it; pick a format and click its bits.
import { FORMATS, getFormat, decode, encode, bitString, explainValue, neighbours, roundingBin, overflowThreshold, pow2 } from "./codecs.js";
import { make, exact, approx, parseNumber } from "./page.js";

const FIELDS = ["sign", "exponent", "mantissa"];

/** What code `code` of a format is: "zero", "negative zero", "subnormal", "normal", "largest" (largest
 *  finite), "smallest" (E8M0's, which has no zero), "+infinity", "-infinity" or "NaN". */
export function codeKind(code, fmt) {
  const f = getFormat(fmt);
  const v = decode(code, f);
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "+infinity" : "-infinity";
  if (v === 0) return Object.is(v, -0) ? "negative zero" : "zero";
  const a = Math.abs(v);
  if (a === f.maxFinite) return "largest";
  if (!f.signed && a === f.minSubnormal) return "smallest";
  return a < f.minNormal ? "subnormal" : "normal";
}

/** The field of each bit of a code, most significant first. */
function fieldsOf(f) {
  return [...Array(f.signed ? 1 : 0).fill("sign"), ...Array(f.exponentBits).fill("exponent"),
    ...Array(f.mantissaBits).fill("mantissa")];
}

/** How the format spends its special codes and what overflow does, as the format defines them. */
export function formatNote(fmt) {
  const f = getFormat(fmt);
  const ones = (n) => "1".repeat(n);
  const layout = `${f.signed ? "1 sign, " : "no sign, "}${f.exponentBits} exponent (bias ${f.bias}), ` +
    `${f.mantissaBits} mantissa bit${f.mantissaBits === 1 ? "" : "s"}`;
  if (f.specials === "ieee") {
    return `${f.name}: ${layout}. IEEE: exponent ${ones(f.exponentBits)} holds ±inf (mantissa 0) and NaN; ` +
      `numbers from ±${exact(overflowThreshold(f))} round to ±inf.`;
  }
  if (f.specials === "fn" && f.signed) {
    return `${f.name}: ${layout}. No infinity; NaN only at S ${ones(f.exponentBits)} ${ones(f.mantissaBits)}; ` +
      `larger numbers and ±inf saturate to ±${exact(f.maxFinite)}.`;
  }
  if (f.specials === "fn") {
    return `${f.name}: ${layout}: the powers of two 2^${f.minExponent} to 2^${f.maxExponent}. No zero, no ` +
      `subnormals; NaN only at ${ones(f.exponentBits)}; zero, negatives and numbers from ${overflowThreshold(f) / pow2(f.maxExponent)}·2^${f.maxExponent} give NaN.`;
  }
  return `${f.name}: ${layout}. No infinity and no NaN (every code is a number); larger numbers and ±inf ` +
    `saturate to ±${exact(f.maxFinite)}; NaN has no code.`;
}

/** A sentence on code `code`: its kind, and what rounds to or saturates at it (in the code's own sign). */
export function describeKind(code, fmt) {
  const f = getFormat(fmt);
  const kind = codeKind(code, f);
  if (kind === "subnormal") return "subnormal (exponent field 0: no implicit leading 1)";
  if (kind === "largest") {
    const negative = decode(code, f) < 0;
    if (f.overflow === "saturate") {
      return negative ? "most negative finite: more negative numbers and -inf saturate to it"
        : "largest finite: larger numbers and inf saturate to it";
    }
    const threshold = overflowThreshold(f);
    const beyond = f.overflow === "inf" ? exact(negative ? -Infinity : Infinity) : "NaN";
    return `${negative ? "most negative" : "largest"} finite: from ${exact(negative ? -threshold : threshold)} ` +
      `${negative ? "down" : "up"}, numbers round to ${beyond}`;
  }
  if (kind === "smallest") return `smallest value (${f.name} has no zero): smaller positive numbers round up to it`;
  if (kind === "NaN") {
    if (f.specials === "ieee") return "exponent all ones, mantissa not 0";
    return f.signed ? `one of ${f.name}'s two NaN codes (no infinity)` : `${f.name}'s only NaN code`;
  }
  return kind;
}

/** "[a, b)": the numbers that round to code `code` (ties on the side roundToFormat puts them). */
function binText(code, f) {
  const bin = roundingBin(code, f);
  if (bin === null) return "";
  const low = bin.low === -Infinity ? "-inf" : exact(bin.low), high = bin.high === Infinity ? "inf" : exact(bin.high);
  return `${bin.lowIn ? "[" : "("}${low}, ${high}${bin.highIn ? "]" : ")"}`;
}

export const STORED_DIGITS = 12;   // the narrow formats' values of everyday numbers in full (0.0999755859375), and the table fits ~680 px

/** A stored value for the table: its shortest exact text when that has at most STORED_DIGITS significant
 *  digits, else the value rounded to them (as toPrecision rounds: ties away from zero), in the same notation,
 *  and "…"; the exact text goes in a tooltip and in data-exact either way, for readers and check_in_page. */
export function storedCell(x) {
  const full = exact(x);
  const cell = make("td", { className: "num", dataset: { role: "stored", exact: full } });
  const rounded = Number.isFinite(x) ? Number(x.toPrecision(STORED_DIGITS)) : x;
  if (!Number.isFinite(x) || rounded === x) cell.textContent = full;   // -0, inf, NaN and short values
  else {
    cell.textContent = `${exact(rounded)}…`;
    cell.title = `exactly ${full}`;
  }
  return cell;
}

/** The code's fields as coloured spans "s eeeee mmmmmmmmmm" (bitString's text). */
function fieldSpans(bits, f) {
  const names = FIELDS.filter((name) => name !== "sign" || f.signed).filter((name) => name !== "mantissa" || f.mantissaBits);
  return bits.split(" ").flatMap((part, i) => [...(i ? [" "] : []), make("span", { className: names[i], text: part })]);
}

export function mount(root, config) {
  const formats = (config.formats ?? FORMATS.map((f) => f.name)).map(getFormat);
  let format = getFormat(config.format ?? "FP16");
  let code = 0;
  let current = null;   // the last number read
  let flipped = false;  // whether the bits shown are the reader's flips, not the code of `current`
  const number = make("input", { type: "text", value: String(config.value ?? "0.1"), ariaLabel: "a number",
    spellcheck: false, dataset: { role: "number" } });
  const message = make("p", { className: "course-explorer-message format-message", dataset: { role: "message" }, role: "status" });
  const values = make("div", { className: "format-table-wrap", dataset: { role: "values" } });
  const picker = make("select", { ariaLabel: "format whose bits to flip", dataset: { role: "format" } },
    ...formats.map((f) => make("option", { value: f.name, text: f.name })));
  const note = make("p", { className: "note", dataset: { role: "note" } });
  const bits = make("div", { className: "format-bits", dataset: { role: "bits" } });
  const readout = make("div", { className: "readout", dataset: { role: "readout" } });

  function showCode() {
    const kinds = fieldsOf(format);
    const s = code.toString(2).padStart(format.bits, "0");
    const groups = FIELDS.filter((field) => kinds.includes(field)).map((field) => {
      const buttons = [...s].map((b, i) => [b, i]).filter(([, i]) => kinds[i] === field).map(([b, i]) => {
        const button = make("button", { type: "button", text: b, className: field,
          title: `${field} bit ${format.bits - 1 - i}: click to flip`, dataset: { position: String(i) } });
        button.addEventListener("click", () => flip(i));
        return button;
      });
      const n = buttons.length;
      return make("span", { className: "field" }, make("span", {}, ...buttons),
        make("small", { text: field === "exponent" ? `exponent (${n} bits, bias ${format.bias})` : `${field}${n > 1 ? ` (${n} bits)` : ""}` }));
    });
    bits.replaceChildren(...groups);
    const value = decode(code, format);
    const { below, above } = neighbours(code, format);
    const near = (v) => (v === null ? "none" : exact(v));
    const lines = [make("div", {}, `${format.name} `, make("code", { text: bitString(code, format), dataset: { role: "code" } }),
      ` (0x${code.toString(16)}) = `, make("b", { text: exact(value), dataset: { role: "decoded" } }), ": ",
      make("span", { text: describeKind(code, format), dataset: { role: "kind", kind: codeKind(code, format) } }))];
    if (!Number.isNaN(value)) {
      lines.push(make("div", { dataset: { role: "neighbours" } }, `next values: ${near(below)} below, ${near(above)} above; `,
        "numbers in ", make("span", { text: binText(code, format), dataset: { role: "bin" } }),
        value === 0 ? " round to a zero of their own sign" : " round to it"));
    }
    if (flipped && current !== null) {
      lines.push(make("div", { className: "note", dataset: { role: "flipped" },
        text: `(bits flipped: the table above still shows ${exact(current)}, the ` +
          `${number.hasAttribute("aria-invalid") ? "last number read" : "typed number"})` }));
    }
    readout.replaceChildren(...lines);
  }

  function flip(position) {
    // bit 0 is the leftmost (most significant); codes can exceed 2**31, so no bitwise operators
    const weight = 2 ** (format.bits - 1 - position);
    code = Math.floor(code / weight) % 2 === 1 ? code - weight : code + weight;
    flipped = true;
    showCode();
  }

  function showValues(x) {
    const rows = explainValue(x, formats).map((r, i) => {
      const none = r.code === null;
      const cells = [
        make("td", { text: r.format }),
        make("td", { dataset: { role: "bits" } }, none ? "-" : make("code", {}, ...fieldSpans(r.bits, formats[i]))),
        none ? make("td", { className: "num", text: "no code (no NaN)", dataset: { role: "stored" } }) : storedCell(r.stored),
        make("td", { className: "num", text: Number.isNaN(r.absError) ? "-" : approx(r.absError), dataset: { role: "abs-error" } }),
        make("td", { className: "num", text: Number.isNaN(r.relError) ? "-" : approx(r.relError), dataset: { role: "rel-error" } }),
      ];
      const tr = make("tr", { dataset: { format: r.format }, title: `click to flip ${r.format}'s bits below` }, ...cells);
      if (formats[i] === format) tr.className = "selected";
      tr.addEventListener("click", () => choose(formats[i]));
      return tr;
    });
    const head = make("tr", {}, ...["format", "bits: sign exponent mantissa", "stored value", "abs. error", "rel. error"]
      .map((h) => make("th", { text: h })));
    values.replaceChildren(make("table", { className: "format-table" }, make("thead", {}, head), make("tbody", {}, ...rows)));
  }

  function show(x) {
    flipped = false;
    showValues(x);
    note.textContent = formatNote(format);
    if (Number.isNaN(x) && !format.hasNan) {
      bits.replaceChildren();
      readout.replaceChildren(make("div", { dataset: { role: "kind", kind: "no code" },
        text: `${format.name} has no NaN: no code holds it (pick another format to flip bits)` }));
      return;
    }
    code = encode(x, format);
    showCode();
  }

  function showNumber() {
    const parsed = parseNumber(number.value);
    if (parsed.error !== undefined) {
      // the tables keep showing the last number read, and say so
      message.textContent = parsed.error + (current === null ? "" : `. Showing ${exact(current)}, the last number read.`);
      number.setAttribute("aria-invalid", "true");
      if (current === null) {   // nothing read yet: the bits of code 0 still flip
        note.textContent = formatNote(format);
        showCode();
      }
      return;
    }
    message.textContent = "";
    number.removeAttribute("aria-invalid");
    current = parsed.value;
    show(current);
  }

  function choose(f) {
    format = f;
    picker.value = f.name;
    if (current === null) { code = 0; showNumber(); }
    else show(current);
  }

  picker.value = format.name;
  number.addEventListener("input", showNumber);
  picker.addEventListener("change", () => choose(getFormat(picker.value)));
  root.append(
    make("label", {}, "number: ", number), message, values,
    make("label", {}, "flip the bits of ", picker, " (or click a row)"), note, bits, readout);
  showNumber();
}
