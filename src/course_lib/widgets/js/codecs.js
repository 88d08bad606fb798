// The course's number formats in JavaScript: a port of course_lib.formats.codecs (decode, round_to_format,
// encode), in float64 like the Python codec, so the explorers compute in the page what Python computes.
// tests/test_widgets_formats.py checks every function here against Python, bit for bit, in Chromium.

// name, exponent bits, mantissa bits, specials ("ieee": inf and NaN in the all-ones exponent; "fn": only the
// all-ones code of each sign is NaN; "finite": no inf, no NaN), signed, subnormals, rounding, overflow
const SPECS = [
  ["FP32", 8, 23, "ieee", true, true, "nearest_even", "inf"],
  ["TF32", 8, 10, "ieee", true, true, "nearest_even", "inf"],
  ["BF16", 8, 7, "ieee", true, true, "nearest_even", "inf"],
  ["FP16", 5, 10, "ieee", true, true, "nearest_even", "inf"],
  ["FP8 E4M3", 4, 3, "fn", true, true, "nearest_even", "saturate"],
  ["FP8 E5M2", 5, 2, "ieee", true, true, "nearest_even", "inf"],
  ["E8M0", 8, 0, "fn", false, false, "nearest_away", "nan"],
  ["FP6 E2M3", 2, 3, "finite", true, true, "nearest_even", "saturate"],
  ["FP6 E3M2", 3, 2, "finite", true, true, "nearest_even", "saturate"],
  ["FP4 E2M1", 2, 1, "finite", true, true, "nearest_even", "saturate"],
];

const SCRATCH = new DataView(new ArrayBuffer(8));

/** Exact 2**e for integer e in -1022..1023, built from float64 bits (as the Python codec's pow2). */
export function pow2(e) {
  SCRATCH.setBigUint64(0, BigInt(e + 1023) << 52n);
  return SCRATCH.getFloat64(0);
}

/** floor(log2(a)) of a finite non-negative float64, read off its exponent field (0 and subnormals: -1023). */
export function binade(a) {
  SCRATCH.setFloat64(0, a);
  return ((SCRATCH.getUint16(0) >> 4) & 0x7ff) - 1023;
}

function makeFormat([name, exponentBits, mantissaBits, specials, signed, subnormals, rounding, overflow]) {
  const bias = 2 ** (exponentBits - 1) - 1;
  const minExponent = (subnormals ? 1 : 0) - bias;
  let top = 2 ** exponentBits - 1;
  if (specials === "ieee" || (specials === "fn" && mantissaBits === 0)) top -= 1;
  const maxExponent = top - bias;
  const topSignificand = specials === "fn" && mantissaBits > 0 ? 2 - 2 ** (1 - mantissaBits) : 2 - 2 ** -mantissaBits;
  const minNormal = pow2(minExponent);
  return Object.freeze({
    name, exponentBits, mantissaBits, specials, signed, subnormals, rounding, overflow, bias, minExponent,
    maxExponent, bits: (signed ? 1 : 0) + exponentBits + mantissaBits,
    maxFinite: topSignificand * pow2(maxExponent), minNormal,
    minSubnormal: subnormals && mantissaBits > 0 ? pow2(minExponent - mantissaBits) : minNormal,
    hasInf: specials === "ieee", hasNan: specials !== "finite",
  });
}

export const FORMATS = SPECS.map(makeFormat);

/** A format by its name (as the Python registry spells it), or the format object itself. */
export function getFormat(fmt) {
  if (typeof fmt === "object" && fmt !== null && FORMATS.includes(fmt)) return fmt;
  const found = FORMATS.find((f) => f.name === fmt);
  if (!found) throw new Error(`unknown format ${JSON.stringify(fmt)}; known: ${FORMATS.map((f) => f.name).join(", ")}`);
  return found;
}

/** The value (float64) of bit pattern `code` (an integer in 0 .. 2**bits - 1). */
export function decode(code, fmt) {
  const f = getFormat(fmt);
  if (!Number.isInteger(code) || code < 0 || code >= 2 ** f.bits) {
    throw new Error(`${f.name} codes lie in 0..${2 ** f.bits - 1}, got ${code}`);
  }
  const m = f.mantissaBits, e = f.exponentBits;
  const man = code % 2 ** m;
  const exp = Math.floor(code / 2 ** m) % 2 ** e;
  const sign = f.signed && Math.floor(code / 2 ** (m + e)) % 2 === 1 ? -1 : 1;
  const frac = man / 2 ** m;
  const top = exp === 2 ** e - 1;
  if (f.specials === "ieee" && top) return man === 0 ? sign * Infinity : NaN;
  if (f.specials === "fn" && top && man === 2 ** m - 1) return NaN;
  const magnitude = f.subnormals && exp === 0 ? frac * pow2(f.minExponent) : (1 + frac) * pow2(exp - f.bias);
  return sign * magnitude;
}

function roundIntegral(s, rounding) {
  const whole = Math.trunc(s);   // s >= 0; s - whole is exact
  const fraction = s - whole;
  if (rounding === "toward_zero") return whole;
  if (rounding === "nearest_away") return fraction >= 0.5 ? whole + 1 : whole;
  if (fraction > 0.5 || (fraction === 0.5 && whole % 2 === 1)) return whole + 1;
  return whole;
}

const ROUNDINGS = ["nearest_even", "nearest_away", "toward_zero"];
const OVERFLOWS = ["inf", "saturate", "nan"];

/** `x` (a float64) rounded to the nearest value of the format, as round_to_format does for float64 input.
 *  options: {overflow, rounding}; defaults are the format's own. Throws for NaN in a format without NaN. */
export function roundToFormat(x, fmt, options = {}) {
  const f = getFormat(fmt);
  const overflow = options.overflow ?? f.overflow;
  const rounding = options.rounding ?? f.rounding;
  if (!OVERFLOWS.includes(overflow)) throw new Error(`overflow must be one of ${OVERFLOWS.join(", ")}, got ${overflow}`);
  if (!ROUNDINGS.includes(rounding)) throw new Error(`rounding must be one of ${ROUNDINGS.join(", ")}, got ${rounding}`);
  if (f.specials === "finite" && overflow !== "saturate") throw new Error(`${f.name} has no inf and no NaN: it can only saturate on overflow`);
  if (overflow === "inf" && !f.hasInf) throw new Error(`${f.name} has no infinity: use overflow "saturate" or "nan"`);
  if (typeof x !== "number") throw new TypeError(`roundToFormat needs a number, got ${typeof x}`);
  if (Number.isNaN(x)) {
    if (!f.hasNan) throw new Error(`${f.name} has no NaN: no code holds NaN`);
    return NaN;
  }
  const finite = Number.isFinite(x);
  const a = finite ? Math.abs(x) : 0;
  // beyond the largest binade its spacing is kept (a value there still rounds past the largest value), which
  // keeps 2**-quantum a float64: as round_to_format does
  const quantum = Math.min(Math.max(binade(a), f.minExponent), f.maxExponent) - f.mantissaBits;
  let r = roundIntegral(a * pow2(-quantum), rounding) * pow2(quantum);
  let beyond;
  if (rounding === "toward_zero" && overflow === "inf") {
    r = Math.min(r, f.maxFinite);    // rounding toward zero never makes a finite value infinite (IEEE 754, 7.4)
    beyond = !finite;
  } else {
    beyond = r > f.maxFinite || !finite;
  }
  if (beyond) r = { saturate: f.maxFinite, inf: Infinity, nan: NaN }[overflow];
  if (f.signed) return x < 0 || Object.is(x, -0) ? -r : r;
  if (finite && a < f.minSubnormal) r = f.minSubnormal;   // E8M0: no zero; tiny positives are its smallest value
  return x <= 0 ? NaN : r;                                  // zero and negatives have no code but NaN
}

/** The bit pattern of `x` after roundToFormat (NaN: the all-ones NaN, with the input's sign). */
export function encode(x, fmt, options = {}) {
  const f = getFormat(fmt);
  const r = roundToFormat(x, f, options);
  const m = f.mantissaBits, e = f.exponentBits;
  let code;
  if (Number.isNaN(r)) code = (2 ** e - 1) * 2 ** m + (2 ** m - 1);
  else if (!Number.isFinite(r)) code = (2 ** e - 1) * 2 ** m;
  else {
    const a = Math.abs(r);
    const b = Math.max(binade(a), f.minExponent);
    const normal = a >= f.minNormal;
    const significand = a * pow2(-b);
    code = (normal ? b + f.bias : 0) * 2 ** m + (normal ? significand - 1 : significand) * 2 ** m;
  }
  // a NaN result keeps the input's sign (a NaN input counts as positive: a page cannot see a NaN's sign)
  const negative = Number.isNaN(r) ? x < 0 || Object.is(x, -0) : r < 0 || Object.is(r, -0);
  return f.signed && negative ? code + 2 ** (m + e) : code;
}

/** "0 01111 0000000000": the sign, exponent and mantissa fields of a code, space separated. */
export function bitString(code, fmt) {
  const f = getFormat(fmt);
  if (!Number.isInteger(code) || code < 0 || code >= 2 ** f.bits) throw new Error(`${f.name} codes lie in 0..${2 ** f.bits - 1}, got ${code}`);
  const s = code.toString(2).padStart(f.bits, "0");
  const sign = f.signed ? 1 : 0;
  const parts = f.signed ? [s[0]] : [];
  parts.push(s.slice(sign, sign + f.exponentBits));
  if (f.mantissaBits) parts.push(s.slice(sign + f.exponentBits));
  return parts.join(" ");
}

/** How `value` is stored in each format (explain_value): stored value, code, bits, absolute and relative
 *  error. A format without NaN cannot hold NaN: its row has code null and bits "-". */
export function explainValue(value, formats = FORMATS) {
  return formats.map((fmt) => {
    const f = getFormat(fmt);
    if (Number.isNaN(value) && !f.hasNan) {
      return { format: f.name, value, stored: NaN, code: null, bits: "-", absError: NaN, relError: NaN };
    }
    const stored = roundToFormat(value, f);
    const code = encode(value, f);
    let absError, relError;
    if (Number.isFinite(stored) && Number.isFinite(value)) {
      absError = Math.abs(stored - value);
      relError = value !== 0 ? absError / Math.abs(value) : 0;
    } else {
      absError = relError = stored === value ? 0 : NaN;
    }
    return { format: f.name, value, stored, code, bits: bitString(code, f), absError, relError };
  });
}

/** The values next to code `code`'s value, {below, above}: the nearest values the format holds (infinities
 *  included, NaN not) on each side, or null where there is none. Zero's neighbours are ±smallest subnormal. */
export function neighbours(code, fmt) {
  const f = getFormat(fmt);
  const value = decode(code, f);
  if (Number.isNaN(value)) return { below: null, above: null };
  const signBit = f.signed ? 2 ** (f.bits - 1) : 0;
  const magnitudeCode = code % (signBit || 2 ** f.bits);
  const step = (c) => { const v = c >= 0 && c < 2 ** f.bits ? decode(c, f) : NaN; return Number.isNaN(v) ? null : v; };
  // away from zero: the next magnitude code, same sign; toward zero: the previous one, or across zero
  const away = magnitudeCode + 1 < (signBit || 2 ** f.bits) ? step(code + 1) : null;
  let toward = null;
  if (magnitudeCode > 0) toward = step(code - 1);
  else if (f.signed) toward = Object.is(value, -0) ? f.minSubnormal : -f.minSubnormal;   // ±0: ∓smallest subnormal
  const negative = value < 0 || Object.is(value, -0);
  return negative ? { below: away, above: toward } : { below: toward, above: away };
}

/** The overflow threshold: the largest finite value plus half its spacing, where rounding to nearest leaves
 *  the finite values (to ±inf, NaN or, for a saturating format, back to the largest finite value). */
export function overflowThreshold(fmt) {
  const f = getFormat(fmt);
  return f.maxFinite + pow2(f.maxExponent - f.mantissaBits) / 2;
}

/** Whether rounding to nearest carries the magnitude `magnitude` past the largest finite value: beyond the
 *  overflow threshold, or on it when the tie goes up (the largest value's code is odd, as in every format but
 *  E4M3, or the format rounds ties away). course_lib.formats.rounds_past_max. */
export function roundsPastMax(magnitude, fmt) {
  const f = getFormat(fmt);
  const top = overflowThreshold(f);
  const tieOver = f.rounding === "nearest_away" || encode(f.maxFinite, f) % 2 === 1;
  return tieOver ? magnitude >= top : magnitude > top;
}

/** The rounding bin of code `code` under the format's own rules: the numbers roundToFormat turns into its
 *  value, {low, high, lowIn, highIn} (lowIn: whether low itself rounds to it; low -Infinity or high
 *  Infinity: unbounded, the infinities included when lowIn/highIn), or null for a NaN code. The ends lie
 *  halfway to the neighbours (beside the largest finite value: at the overflow threshold); whether a tie
 *  belongs to the bin is read off roundToFormat itself. */
export function roundingBin(code, fmt) {
  const f = getFormat(fmt);
  const value = decode(code, f);
  if (Number.isNaN(value)) return null;
  const { below, above } = neighbours(code, f);
  const edge = overflowThreshold(f);
  const end = (next, sign) => {                        // the bin's end on the side of `next` (sign: +1 above)
    if (Math.abs(value) === Infinity) return sign * value > 0 ? value : Math.sign(value) * edge;
    if (next === null) {
      if (sign < 0 && !f.signed) return 0;             // E8M0's smallest value: every smaller positive number
      return f.overflow === "saturate" ? sign * Infinity : sign * edge;
    }
    return Math.abs(next) === Infinity ? sign * edge : (value + next) / 2;
  };
  const low = end(below, -1), high = end(above, 1);
  const rounds = (x) => { try { return roundToFormat(x, f) === value; } catch { return false; } };
  return { low, high, lowIn: rounds(low), highIn: rounds(high) };
}
