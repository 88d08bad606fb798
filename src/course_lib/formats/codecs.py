"""Floating-point formats defined by their bits, and exact codecs for them.

Every format in the registry is described only by

* its number of exponent bits and mantissa (fraction) bits,
* whether it has a sign bit,
* its special-value convention (``"ieee"``: the all-ones exponent holds inf and NaN;
  ``"fn"``: finite, only the all-ones code of each sign is NaN, no inf; ``"finite"``: every code is a
  number, no inf and no NaN),
* whether the all-zeros exponent holds subnormals (and zero), and
* its rounding and overflow rules.

Every property (largest finite value, smallest normal and subnormal, epsilon, decimal digits, binades of
dynamic range, number of finite values) is *derived* from those few facts, never typed in; the tests
check the derived values against ``torch.finfo`` and ``ml_dtypes.finfo``.

The codecs (:func:`decode`, :func:`round_to_format`, :func:`encode`) work elementwise on numpy arrays
and torch tensors (on any device) of millions of values.

Rounding rules implemented (each checked against a real implementation in ``tests/test_formats.py``):

* round to nearest, ties to even, with gradual underflow through the subnormals, for every signed format;
* E8M0 (the MX block scale) rounds to the nearest power of two with ties *up*, which is what both
  ``torch.float8_e8m0fnu`` and ``ml_dtypes.float8_e8m0fnu`` do; it has no zero and no sign, so zero,
  negative numbers and NaN become NaN (ml_dtypes' rule; torch instead maps zero to the smallest value and
  drops the sign), positive values below its smallest value become the smallest value, and values that
  round above its largest become NaN. One known difference: for float32 *subnormal* inputs strictly
  between 2**-127 and 1.5 * 2**-127, torch and ml_dtypes return 2**-126, while the nearest power of two,
  which this module returns, is 2**-127;
* overflow: ``"inf"`` (IEEE formats), ``"saturate"`` (clamp to ±max; the default for FP8 E4M3 and the MX
  element formats), or ``"nan"``. For E4M3, torch 2.13 saturates (inf too) while older torch and
  ml_dtypes return NaN; pass ``overflow="nan"`` to get the latter;
* the FP6 and FP4 formats have no inf and no NaN (OCP MX v1.0): infinities saturate to ±max, as
  overflow does there (and as torchao's and ml_dtypes' casts do), and NaN raises ``ValueError``: it has
  no code, and torchao (1.5) and ml_dtypes (-0) would each turn it silently into a number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from .arrays import ArrayLike, like_input, to_tensor

Specials = Literal["ieee", "fn", "finite"]
Overflow = Literal["inf", "saturate", "nan"]
Rounding = Literal["nearest_even", "nearest_away", "toward_zero"]

_SPECIALS = ("ieee", "fn", "finite")
_OVERFLOWS = ("inf", "saturate", "nan")
_ROUNDINGS = ("nearest_even", "nearest_away", "toward_zero")


@dataclass(frozen=True)
class FloatFormat:
    """A binary floating-point format, described by its bits and conventions only.

    Attributes
    ----------
    name: display name, e.g. ``"FP16"``.
    exponent_bits, mantissa_bits: field widths in bits (the mantissa excludes the implicit leading 1).
    specials: ``"ieee"``, ``"fn"`` or ``"finite"`` (see the module docstring).
    signed: whether there is a sign bit (E8M0 has none).
    subnormals: whether the all-zeros exponent field encodes zero and subnormals (E8M0: no, it is the
        smallest power of two).
    rounding: the tie rule used when rounding to the nearest value.
    overflow: what a value beyond the largest finite value becomes by default.
    torch_dtype: the name of the matching ``torch`` dtype, if torch has one.
    ml_dtypes_name: the name of the matching ``ml_dtypes`` type, if any.
    aliases: other names that :func:`get_format` accepts.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    specials: Specials = "ieee"
    signed: bool = True
    subnormals: bool = True
    rounding: Rounding = "nearest_even"
    overflow: Overflow = "inf"
    torch_dtype: str | None = None
    ml_dtypes_name: str | None = None
    aliases: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.exponent_bits, int) or not 1 <= self.exponent_bits <= 11:
            raise ValueError(f"exponent_bits must be an int in 1..11, got {self.exponent_bits!r}")
        if not isinstance(self.mantissa_bits, int) or not 0 <= self.mantissa_bits <= 52:
            raise ValueError(f"mantissa_bits must be an int in 0..52, got {self.mantissa_bits!r}")
        if self.specials not in _SPECIALS:
            raise ValueError(f"specials must be one of {_SPECIALS}, got {self.specials!r}")
        if self.overflow not in _OVERFLOWS:
            raise ValueError(f"overflow must be one of {_OVERFLOWS}, got {self.overflow!r}")
        if self.rounding not in _ROUNDINGS:
            raise ValueError(f"rounding must be one of {_ROUNDINGS}, got {self.rounding!r}")
        if self.specials == "finite" and self.overflow != "saturate":
            raise ValueError("a format with no inf and no NaN can only saturate on overflow")
        if self.specials == "ieee" and self.mantissa_bits == 0:
            raise ValueError(f"{self.name}: IEEE-style specials need a mantissa bit, since NaN is the all-ones "
                             "exponent with a non-zero mantissa; with no mantissa bits there is no NaN code "
                             "(use specials='fn' for a format whose only special is NaN)")
        if self.max_exponent < self.min_exponent:
            raise ValueError(f"{self.name}: {self.exponent_bits} exponent bit(s) with specials="
                             f"{self.specials!r} leave no binade of normal numbers, so the derived range "
                             "would not match the codes; add an exponent bit")
        if self.max_exponent > 1023 or self.min_exponent - self.mantissa_bits < -1074:
            raise ValueError(f"{self.name}: its largest binade or finest spacing lies beyond float64's, in "
                             "which the codecs compute exactly; drop an exponent or mantissa bit")
        if self.signed and not self.subnormals:
            raise ValueError(f"{self.name}: a signed format without subnormals has no code for zero (the "
                             "all-zeros exponent would be its smallest binade, as E8M0's is), yet the codecs "
                             "round small values to zero; keep subnormals=True (only an unsigned scale "
                             "format such as E8M0 goes without)")

    # ---- layout -------------------------------------------------------------------------------------
    @property
    def sign_bits(self) -> int:
        return 1 if self.signed else 0

    @property
    def bits(self) -> int:
        """Total width in bits."""
        return self.sign_bits + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def min_exponent(self) -> int:
        """Unbiased exponent of the smallest normal binade."""
        return (1 if self.subnormals else 0) - self.bias

    @property
    def max_exponent(self) -> int:
        """Unbiased exponent of the largest binade that holds a finite value."""
        top = 2**self.exponent_bits - 1
        if self.specials == "ieee" or (self.specials == "fn" and self.mantissa_bits == 0):
            top -= 1  # the all-ones exponent holds no finite value
        return top - self.bias

    # ---- derived properties -------------------------------------------------------------------------
    @property
    def max_finite(self) -> float:
        m = self.mantissa_bits
        if self.specials == "fn" and m > 0:
            top_significand = 2.0 - 2.0 ** (1 - m)  # all-ones mantissa is NaN in the top binade
        else:
            top_significand = 2.0 - 2.0**-m
        return math.ldexp(top_significand, self.max_exponent)

    @property
    def min_normal(self) -> float:
        return math.ldexp(1.0, self.min_exponent)

    @property
    def min_subnormal(self) -> float:
        """Smallest positive value (equals :attr:`min_normal` for a format without subnormals)."""
        if self.subnormals and self.mantissa_bits > 0:
            return math.ldexp(1.0, self.min_exponent - self.mantissa_bits)
        return self.min_normal

    @property
    def min_value(self) -> float:
        """Most negative finite value (the smallest positive one for an unsigned format)."""
        return -self.max_finite if self.signed else self.min_subnormal

    @property
    def epsilon(self) -> float:
        """Distance from 1 to the next larger value."""
        return math.ldexp(1.0, -self.mantissa_bits)

    @property
    def decimal_digits(self) -> float:
        """Significant decimal digits, ``(mantissa_bits + 1) * log10(2)``."""
        return (self.mantissa_bits + 1) * math.log10(2.0)

    @property
    def precision(self) -> int:
        """Whole decimal digits resolved, numpy's ``finfo.precision``: ``floor(-log10(eps))``."""
        return int(math.floor(-math.log10(self.epsilon)))

    @property
    def resolution(self) -> float:
        """``10 ** -precision``, as ``torch.finfo.resolution`` reports it."""
        return 10.0 ** -self.precision

    @property
    def binades(self) -> float:
        """Dynamic range in powers of two, ``log2(max_finite / min_subnormal)``."""
        return math.log2(self.max_finite / self.min_subnormal)

    @property
    def normal_binades(self) -> float:
        """Dynamic range of the normal numbers, ``log2(max_finite / min_normal)``."""
        return math.log2(self.max_finite / self.min_normal)

    @property
    def n_nonfinite_codes(self) -> int:
        signs = 2 if self.signed else 1
        if self.specials == "ieee":
            return signs * 2**self.mantissa_bits
        if self.specials == "fn":
            return signs
        return 0

    @property
    def n_finite_codes(self) -> int:
        """Bit patterns that decode to a finite number (+0 and -0 count as two)."""
        return 2**self.bits - self.n_nonfinite_codes

    @property
    def has_inf(self) -> bool:
        return self.specials == "ieee"

    @property
    def has_nan(self) -> bool:
        return self.specials != "finite"

    def torch_dtype_or_none(self) -> torch.dtype | None:
        """The torch dtype of this format if the installed torch has it (feature-detected)."""
        return getattr(torch, self.torch_dtype, None) if self.torch_dtype else None

    def ml_dtype_or_none(self):
        """The ml_dtypes scalar type of this format if the installed ml_dtypes has it."""
        if not self.ml_dtypes_name:
            return None
        try:
            import ml_dtypes
        except ImportError:  # pragma: no cover - ml_dtypes is a pinned requirement
            return None
        return getattr(ml_dtypes, self.ml_dtypes_name, None)

    def properties(self) -> dict[str, object]:
        """The derived properties as a plain dict (for tables and records)."""
        return {
            "format": self.name,
            "bits": self.bits,
            "sign": self.sign_bits,
            "exponent": self.exponent_bits,
            "mantissa": self.mantissa_bits,
            "bias": self.bias,
            "max_finite": self.max_finite,
            "min_normal": self.min_normal,
            "min_subnormal": self.min_subnormal,
            "epsilon": self.epsilon,
            "decimal_digits": self.decimal_digits,
            "binades": self.binades,
            "finite_values": self.n_finite_codes,
            "inf": self.has_inf,
            "nan": self.has_nan,
        }


FORMATS: dict[str, FloatFormat] = {
    f.name: f
    for f in (
        FloatFormat("FP32", 8, 23, torch_dtype="float32", aliases=("float32", "float", "single")),
        FloatFormat("TF32", 8, 10, aliases=("tensorfloat32",)),
        FloatFormat("BF16", 8, 7, torch_dtype="bfloat16", ml_dtypes_name="bfloat16",
                    aliases=("bfloat16",)),
        FloatFormat("FP16", 5, 10, torch_dtype="float16", aliases=("float16", "half")),
        FloatFormat("FP8 E4M3", 4, 3, specials="fn", overflow="saturate",
                    torch_dtype="float8_e4m3fn", ml_dtypes_name="float8_e4m3fn",
                    aliases=("e4m3", "fp8_e4m3", "float8_e4m3fn", "e4m3fn")),
        FloatFormat("FP8 E5M2", 5, 2, torch_dtype="float8_e5m2", ml_dtypes_name="float8_e5m2",
                    aliases=("e5m2", "fp8_e5m2", "float8_e5m2")),
        FloatFormat("E8M0", 8, 0, specials="fn", signed=False, subnormals=False,
                    rounding="nearest_away", overflow="nan", torch_dtype="float8_e8m0fnu",
                    ml_dtypes_name="float8_e8m0fnu", aliases=("float8_e8m0fnu", "mx_scale")),
        FloatFormat("FP6 E2M3", 2, 3, specials="finite", overflow="saturate",
                    ml_dtypes_name="float6_e2m3fn", aliases=("e2m3", "fp6_e2m3", "float6_e2m3fn")),
        FloatFormat("FP6 E3M2", 3, 2, specials="finite", overflow="saturate",
                    ml_dtypes_name="float6_e3m2fn", aliases=("e3m2", "fp6_e3m2", "float6_e3m2fn")),
        FloatFormat("FP4 E2M1", 2, 1, specials="finite", overflow="saturate",
                    ml_dtypes_name="float4_e2m1fn", aliases=("e2m1", "fp4", "fp4_e2m1", "float4_e2m1fn")),
    )
}


def _normalise(name: str) -> str:
    return name.lower().replace(" ", "_").replace("-", "_")


_LOOKUP: dict[str, FloatFormat] = {}
for _f in FORMATS.values():
    for _n in (_f.name, *_f.aliases):
        _LOOKUP[_normalise(_n)] = _f


def get_format(fmt: str | FloatFormat | torch.dtype) -> FloatFormat:
    """Look a format up by name (case-insensitive, aliases allowed), torch dtype, or pass one through.

    >>> get_format("fp16").max_finite
    65504.0
    """
    if isinstance(fmt, FloatFormat):
        return fmt
    if isinstance(fmt, torch.dtype):
        for f in FORMATS.values():
            if f.torch_dtype_or_none() == fmt:
                return f
        raise ValueError(f"torch dtype {fmt} is not a floating-point format in the registry")
    if not isinstance(fmt, str):
        raise TypeError(f"a format is given by name, FloatFormat or torch.dtype, not {type(fmt).__name__}")
    try:
        return _LOOKUP[_normalise(fmt)]
    except KeyError:
        known = ", ".join(FORMATS)
        raise ValueError(f"unknown format {fmt!r}; known formats: {known}") from None


def list_formats(*names: str) -> list[FloatFormat]:
    """The registry's formats in their canonical order, or the named ones in the given order."""
    return [get_format(n) for n in names] if names else list(FORMATS.values())


# ---- decoding ---------------------------------------------------------------------------------------

def decode(codes: ArrayLike | int, fmt: str | FloatFormat) -> ArrayLike:
    """Values (float64) of bit patterns ``codes`` (non-negative integers below ``2**bits``).

    Returns the same kind of container (numpy or torch, same device) as ``codes``.
    """
    f = get_format(fmt)
    t, from_numpy = to_tensor(codes, what="codes")
    if t.is_floating_point() or t.is_complex() or t.dtype == torch.bool:
        raise TypeError(f"codes must be integers (bit patterns), got dtype {t.dtype}")
    c = t.to(torch.int64)
    if c.numel() and (int(c.min()) < 0 or int(c.max()) >= 2**f.bits):
        raise ValueError(f"{f.name} codes lie in 0..{2**f.bits - 1}; got values in "
                         f"{int(c.min())}..{int(c.max())}")
    m, e = f.mantissa_bits, f.exponent_bits
    man = c & (2**m - 1)
    exp = (c >> m) & (2**e - 1)
    sign = torch.where(((c >> (m + e)) & 1).bool(), -1.0, 1.0).to(torch.float64) if f.signed \
        else torch.ones_like(c, dtype=torch.float64)
    frac = man.to(torch.float64) / 2.0**m
    normal = torch.ldexp(1.0 + frac, (exp - f.bias).to(torch.float64))
    if f.subnormals:
        sub = frac * 2.0**f.min_exponent
        mag = torch.where(exp == 0, sub, normal)
    else:
        mag = normal
    out = sign * mag
    top = exp == 2**e - 1
    if f.specials == "ieee":
        out = torch.where(top & (man == 0), sign * math.inf, out)
        out = torch.where(top & (man != 0), torch.full_like(out, math.nan), out)
    elif f.specials == "fn":
        out = torch.where(top & (man == 2**m - 1), torch.full_like(out, math.nan), out)
    return like_input(out, from_numpy)


def all_values(fmt: str | FloatFormat) -> np.ndarray:
    """The value of every bit pattern of a format of at most 16 bits, indexed by code (float64)."""
    f = get_format(fmt)
    if f.bits > 16:
        raise ValueError(f"{f.name} has 2**{f.bits} codes; all_values is for formats of at most 16 bits")
    values = decode(np.arange(2**f.bits, dtype=np.int64), f)
    assert isinstance(values, np.ndarray)
    return values


# ---- rounding ---------------------------------------------------------------------------------------

def pow2(exponent: torch.Tensor) -> torch.Tensor:
    """Exact float64 powers of two ``2**exponent`` for int64 exponents in -1022..1023, built from bits."""
    return ((exponent + 1023) << 52).view(torch.float64)


def _pow2_from(exponent: torch.Tensor, lowest: int) -> torch.Tensor:
    """:func:`pow2` for exponents from ``lowest`` >= -1074 up: below -1022, 2**e is a float64 subnormal,
    which has no exponent field to build, so it is the exact product 2**-1022 * 2**(e + 1022)."""
    if lowest >= -1022:
        return pow2(exponent)
    return pow2(exponent.clamp(min=-1022)).mul_(pow2((exponent + 1022).clamp_(max=0)))


def _binade(a: torch.Tensor) -> torch.Tensor:
    """floor(log2(a)) for finite non-negative float64 ``a``, read off the exponent field (int64).

    Zero and float64 subnormals give -1023; callers clamp to the format's smallest binade, far above.
    """
    return (a.view(torch.int64) >> 52) - 1023


def _round_magnitude(a: torch.Tensor, f: FloatFormat, rounding: Rounding) -> torch.Tensor:
    """Round finite non-negative float64 magnitudes onto the format's grid (no overflow handling).

    Beyond the largest binade its spacing is kept, which keeps the quantum a float64 whatever ``a`` is;
    such values still round above the largest value, for the caller's overflow rule."""
    exponent = torch.clamp_(_binade(a), f.min_exponent, f.max_exponent).sub_(f.mantissa_bits)
    quantum = _pow2_from(exponent, f.min_exponent - f.mantissa_bits)
    return _round_integral(a / quantum, rounding).mul_(quantum)  # both exact: quantum is a power of two


def _round_integral(scaled: torch.Tensor, rounding: Rounding) -> torch.Tensor:
    """Round non-negative floats to integers by ``rounding``, exactly, in place (returns ``scaled``).

    Half away from zero is ``trunc + (fraction >= 1/2)``, not ``floor(x + 1/2)``: that sum rounds, and
    for the float just below one half (``1/2 - 2**-25`` in float32, ``1/2 - 2**-54`` in float64: just
    below half the smallest subnormal, after scaling) it rounds up to 1, so ``floor`` would give 1, not
    0. The fraction ``x - trunc(x)`` is exact in binary floating point."""
    if rounding == "nearest_even":
        return scaled.round_()  # torch.round rounds half to even
    if rounding == "nearest_away":
        whole = scaled.trunc()
        return scaled.sub_(whole).ge_(0.5).add_(whole)
    return scaled.trunc_()


def round_to_format(
    x: ArrayLike | float,
    fmt: str | FloatFormat,
    *,
    overflow: Overflow | None = None,
    rounding: Rounding | None = None,
) -> ArrayLike:
    """Round float values to the nearest value representable in ``fmt``.

    ``x``: a floating-point numpy array or torch tensor (any device), or a Python float. Each value is
    rounded once, exactly (computed in float64), with gradual underflow through the subnormals.
    ``overflow``: ``"inf"``, ``"saturate"`` or ``"nan"``; default: the format's own rule.
    ``rounding``: ``"nearest_even"``, ``"nearest_away"`` or ``"toward_zero"``; default: the format's.

    Returns the same container kind and device; the dtype is float64 for float64 input (and long double,
    accepted only where float64 holds it exactly) and float32 otherwise (every value of every registered
    format fits in float32 exactly). NaN stays NaN; NaN in
    ``x`` raises ``ValueError`` for a format without NaN (FP6, FP4), where infinities saturate.
    """
    f = get_format(fmt)
    overflow = f.overflow if overflow is None else overflow
    rounding = f.rounding if rounding is None else rounding
    if overflow not in _OVERFLOWS:
        raise ValueError(f"overflow must be one of {_OVERFLOWS}, got {overflow!r}")
    if rounding not in _ROUNDINGS:
        raise ValueError(f"rounding must be one of {_ROUNDINGS}, got {rounding!r}")
    if f.specials == "finite" and overflow != "saturate":
        raise ValueError(f"{f.name} has no inf and no NaN: it can only saturate on overflow")
    if overflow == "inf" and not f.has_inf:
        raise ValueError(f"{f.name} has no infinity: use overflow='saturate' or 'nan'")
    t, from_numpy = to_tensor(x, what="x")
    if not t.is_floating_point():
        raise TypeError(f"round_to_format needs floating-point values, got dtype {t.dtype}")
    if not f.has_nan:
        # no code to hold it: torchao's FP4/FP6 casts silently give 1.5, ml_dtypes' give -0
        n_nan = int(torch.isnan(t).sum())
        if n_nan:
            raise ValueError(f"{f.name} has no NaN: cannot round NaN into it ({n_nan} of {t.numel()} values "
                             "are NaN); find where they come from, or mask them first")
    if t.dtype == torch.float32 and rounding == "nearest_even" and native_cast_agrees(f, overflow, rounding,
                                                                                      t.device):
        # torch's own cast rounds exactly like the codec here (measured once): 80-300x faster
        return like_input(t.to(f.torch_dtype_or_none()).to(torch.float32), from_numpy)
    return like_input(_round_software(t, f, overflow, rounding), from_numpy)


_NATIVE_AGREES: dict[tuple, bool] = {}


def _probe_values() -> torch.Tensor:
    """Float32 inputs that exercise every rounding rule: random bit patterns at every magnitude, each
    format's midpoints and overflow edges, infinities and NaN."""
    gen = torch.Generator().manual_seed(1234)
    bits = torch.randint(-2**31, 2**31 - 1, (1 << 16,), generator=gen, dtype=torch.int64).to(torch.int32)
    edges = [0.0, -0.0, math.inf, -math.inf, math.nan, 3e38, -3e38, 1e-45, -1e-45, 1.2 * 2.0**-127]
    for f in FORMATS.values():
        if f.bits <= 16 and f.signed:
            grid = torch.from_numpy(all_values(f)).to(torch.float32)
            grid = grid[torch.isfinite(grid)].unique()
            edges += ((grid[1:] + grid[:-1]) / 2).tolist()
            edges += [f.max_finite * 1.0625, -f.max_finite * 1.0625, f.max_finite * 1.5, f.min_subnormal / 2]
    return torch.cat([bits.view(torch.float32), torch.tensor(edges, dtype=torch.float32)])


def native_cast_agrees(f: FloatFormat, overflow: Overflow, rounding: Rounding, device: torch.device) -> bool:
    """Whether ``tensor.to(f's torch dtype)`` rounds float32 exactly as :func:`round_to_format` does with
    these rules, measured once per format, rule and device type on a probe of hard cases."""
    dtype = f.torch_dtype_or_none()
    if dtype is None or dtype == torch.float32:
        return False
    key = (f, overflow, rounding, device.type)
    if key not in _NATIVE_AGREES:
        probe = _probe_values().to(device)
        try:
            native = probe.to(dtype).to(torch.float32)
        except (RuntimeError, TypeError):
            _NATIVE_AGREES[key] = False
        else:
            software = _round_software(probe, f, overflow, rounding)
            same_nan = torch.equal(torch.isnan(native), torch.isnan(software))
            finite = ~torch.isnan(software)
            _NATIVE_AGREES[key] = bool(same_nan and torch.equal(native[finite].view(torch.int32),
                                                                 software[finite].view(torch.int32)))
    return _NATIVE_AGREES[key]


def narrow_format(f: FloatFormat) -> bool:
    """Whether every power of two the codec multiplies by for this format is a normal float32, so float32
    arithmetic rounds float32 input exactly as float64 would (the FP8, FP6 and FP4 formats)."""
    return f.signed and f.min_exponent - f.mantissa_bits > -100 and f.max_exponent < 100


def round_magnitude32(a: torch.Tensor, f: FloatFormat, rounding: Rounding) -> torch.Tensor:
    """:func:`_round_magnitude` for finite non-negative float32 ``a`` and a :func:`narrow_format` format."""
    quantum = quantum32(a, f)
    return _round_integral(a / quantum, rounding).mul_(quantum)   # both exact: quantum is a power of two


_EXPONENT_FIELD32 = 0x7F800000


def quantum32(a: torch.Tensor, f: FloatFormat) -> torch.Tensor:
    """The spacing of ``f``'s grid at each finite non-negative float32 ``a`` (float32, a power of two): its
    binade ``2**floor(log2 a)`` is ``a`` with its mantissa bits cleared, one bitwise AND; times ``2**-m``
    (``m`` mantissa bits) that is the spacing there, clamped to the format's binades: below the smallest
    (zero and subnormals, whose field is 0, included) the subnormal spacing, beyond the largest its spacing
    (the caller handles overflow). Three passes over ``a``, all exact. TypeError for any other dtype: the
    bits of a float64 read as int32 would give a wrong spacing, not an error."""
    if not isinstance(a, torch.Tensor) or a.dtype != torch.float32:
        raise TypeError(f"quantum32 takes a float32 tensor, got {getattr(a, 'dtype', type(a).__name__)}")
    binade = (a.view(torch.int32) & _EXPONENT_FIELD32).view(torch.float32)
    return binade.mul_(2.0 ** -f.mantissa_bits).clamp_(2.0 ** (f.min_exponent - f.mantissa_bits),
                                                        2.0 ** (f.max_exponent + 1 - f.mantissa_bits))


def _round_software(t: torch.Tensor, f: FloatFormat, overflow: Overflow, rounding: Rounding) -> torch.Tensor:
    """The exact codec: round onto the format's grid (any format, any rule), in float64, or in float32
    for float32 input and a narrow format (the same result: every step is exact, about 3x faster)."""
    out_dtype = torch.float64 if t.dtype == torch.float64 else torch.float32
    fast = t.dtype == torch.float32 and narrow_format(f)
    v = t if fast else t.to(torch.float64)
    finite = torch.isfinite(v)
    a = torch.where(finite, v.abs(), 0.0)
    r = round_magnitude32(a, f, rounding) if fast else _round_magnitude(a, f, rounding)

    big = f.max_finite
    if rounding == "toward_zero" and overflow == "inf":
        # Rounding toward zero never turns a finite value into infinity (IEEE 754, 7.4).
        r.clamp_(max=big)
        beyond = ~finite
    else:
        beyond = (r > big) | ~finite
    replacement = {"saturate": big, "inf": math.inf, "nan": math.nan}[overflow]
    r.masked_fill_(beyond, replacement)

    if f.signed:
        r = torch.copysign(r, v)
    else:
        # Unsigned scale format without zero (E8M0): tiny positives become its smallest value,
        # zero and negatives have no code but NaN.
        r.masked_fill_(finite & (a < f.min_subnormal), f.min_subnormal)
        r.masked_fill_(v <= 0, math.nan)
    r.masked_fill_(torch.isnan(v), math.nan)
    return r.to(out_dtype)


def encode(x: ArrayLike | float, fmt: str | FloatFormat, **round_kwargs) -> ArrayLike:
    """Bit patterns (int64) of ``x`` after :func:`round_to_format` (same keyword arguments).

    NaN is encoded as the format's all-ones NaN with the input's sign (payloads are not kept). A NaN
    cannot be encoded in a format that has none (FP6, FP4): :func:`round_to_format` raises ``ValueError``.
    """
    f = get_format(fmt)
    t, from_numpy = to_tensor(x, what="x")
    rounded = round_to_format(t, f, **round_kwargs)
    assert isinstance(rounded, torch.Tensor)
    r = rounded.to(torch.float64)
    m, e = f.mantissa_bits, f.exponent_bits
    nan = torch.isnan(r)
    a = torch.where(nan | torch.isinf(r), 0.0, r.abs())
    binade = torch.clamp(_binade(a), min=f.min_exponent)
    # a == binade's power of two times 1.fraction (normal) or 0.fraction (subnormal, binade clamped)
    is_normal = a >= f.min_normal
    exp_field = torch.where(is_normal, binade + f.bias, 0)
    significand = a / _pow2_from(binade, f.min_exponent)
    man_field = torch.where(is_normal, significand - 1.0, significand).mul_(2.0**m).to(torch.int64)
    code = (exp_field << m) | man_field
    all_ones = (2**e - 1) << m | (2**m - 1)
    if f.has_inf:
        code = torch.where(torch.isinf(r), torch.full_like(code, (2**e - 1) << m), code)
    if f.has_nan:
        code = torch.where(nan, torch.full_like(code, all_ones), code)
    if f.signed:
        negative = torch.signbit(torch.where(nan, t.to(torch.float64), r))  # a NaN keeps its input's sign
        code = code | (negative.to(torch.int64) << (m + e))
    return like_input(code, from_numpy)


def spacing(x: ArrayLike | float, fmt: str | FloatFormat) -> ArrayLike:
    """Gap between adjacent values of ``fmt`` around magnitude ``|x|`` (one unit in the last place).

    Below the smallest normal the gap is constant (the subnormal spacing), which is why the *relative*
    spacing ``spacing(x)/x`` grows there.
    """
    f = get_format(fmt)
    t, from_numpy = to_tensor(x, what="x")
    if not t.is_floating_point():
        raise TypeError(f"spacing needs floating-point values, got dtype {t.dtype}")
    a = t.to(torch.float64).abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    binade = torch.clamp(_binade(a), min=f.min_exponent)
    gap = _pow2_from(binade - f.mantissa_bits, f.min_exponent - f.mantissa_bits)
    return like_input(torch.where(torch.isfinite(t), gap, torch.full_like(gap, math.nan)), from_numpy)
