"""Lesson 8's two NVFP4 recipe mechanisms measured on one layer's tensors, where their purpose shows: the
random Hadamard transform on the weight-gradient product (:func:`hadamard_effect`), and the bias of
round-to-nearest against stochastic rounding (:func:`rounding_bias`); with the facts and sentences the lesson
glues. The whole-model gradient study is :mod:`course_lib.studies.microscaling_pieces`."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..glue import Prose
from ..mx.linear import nvfp4_scaling
from ..mx.nvfp4 import HADAMARD_SIZE, hadamard_groups, random_hadamard_matrix, random_signs


def _relative(approx: torch.Tensor, exact: torch.Tensor) -> float:
    exact = exact.double()
    return float(torch.linalg.vector_norm(approx.double() - exact) / torch.linalg.vector_norm(exact))


def _check_2d(name: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() != 2 or x.numel() == 0 or not bool(torch.isfinite(x).all()) or not bool((x != 0).any()):
        raise ValueError(f"{name} must be a non-empty, finite, not all-zero 2-D tensor; got shape {tuple(x.shape)}")
    return x.detach().float()


@dataclass(frozen=True)
class HadamardEffect:
    """The weight-gradient product ``gradient.T @ activation`` of one linear layer, its operands quantised to
    NVFP4 along the tokens as the recipe does, without (``plain_*``) and with (``rht_*``) the random Hadamard
    transform on groups of ``size`` tokens: the relative error of each operand (in its own basis) and of the
    product against the exact one (fractions); ``identity_error``: the product of the transformed operands
    without quantisation against the exact one (the transform alone, FP32 rounding only)."""

    size: int
    plain_gradient: float
    plain_activation: float
    plain_product: float
    rht_gradient: float
    rht_activation: float
    rht_product: float
    identity_error: float


def hadamard_effect(gradient: torch.Tensor, activation: torch.Tensor, *, seed: int = 0) -> HadamardEffect:
    """Quantise the two operands of ``gradient.T @ activation`` (``[tokens, out]`` and ``[tokens, in]``, the
    tokens a multiple of 16) to NVFP4 along the tokens and multiply, with and without the random Hadamard
    transform (signs from ``seed``) applied to both first."""
    g, x = _check_2d("gradient", gradient), _check_2d("activation", activation)
    if g.shape[0] != x.shape[0] or g.shape[0] % HADAMARD_SIZE:
        raise ValueError(f"gradient and activation need the same number of tokens, a multiple of {HADAMARD_SIZE}; "
                         f"got {g.shape[0]} and {x.shape[0]}")
    q = nvfp4_scaling()
    exact = g.double().t() @ x.double()
    g_t, x_t = g.t().contiguous(), x.t().contiguous()
    h = random_hadamard_matrix(random_signs(HADAMARD_SIZE, seed), device=g.device)
    g_h, x_h = hadamard_groups(g_t, h), hadamard_groups(x_t, h)
    errors = {}
    for name, (a, b) in {"plain": (g_t, x_t), "rht": (g_h, x_h)}.items():
        qa, qb = q.round_trip(a), q.round_trip(b)
        errors[name] = (_relative(qa, a), _relative(qb, b), _relative(qa.double() @ qb.double().t(), exact))
    return HadamardEffect(HADAMARD_SIZE, *errors["plain"], *errors["rht"],
                          _relative(g_h.double() @ x_h.double().t(), exact))


def _shown(fraction: float) -> float:
    """A fraction as the sentences print it: a percentage to one decimal."""
    return round(100 * fraction, 1)


def hadamard_sentence(effect: HadamardEffect) -> Prose:
    """What the transform did to each operand's own error and to the product's, in percent, and which way."""
    moved = ("lowered" if effect.rht_product < effect.plain_product else
             "raised" if effect.rht_product > effect.plain_product else "left")
    # the differences and the ratio are of the percentages as printed, so that a reader's arithmetic agrees
    plain_product, rht_product = _shown(effect.plain_product), _shown(effect.rht_product)
    ratio = plain_product / rht_product if rht_product > 0 else math.inf
    by = f" ({ratio:.1f} times lower)" if moved == "lowered" else ""
    moved_most = max(abs(_shown(effect.rht_gradient) - _shown(effect.plain_gradient)),
                     abs(_shown(effect.rht_activation) - _shown(effect.plain_activation)))
    return Prose(
        f"On this layer's gradient and activation, quantised in blocks along the tokens as the weight-gradient "
        f"product reads them, the transform changes each operand's own error by at most "
        f"{moved_most:.1f} points (gradient {100 * effect.plain_gradient:.1f}% without, {100 * effect.rht_gradient:.1f}% with; "
        f"activation {100 * effect.plain_activation:.1f}% and {100 * effect.rht_activation:.1f}%), and "
        f"{moved} the error of their product, the weight gradient, from {100 * effect.plain_product:.1f}% to "
        f"{100 * effect.rht_product:.1f}%{by}. Without quantisation the transformed product is the exact one to "
        f"{effect.identity_error:.0e} (FP32 rounding). This rounds both operands to nearest, on one layer's "
        "weight gradient alone; the recipe rounds the gradient operand stochastically, and a whole model's "
        "gradient also carries the other products' errors, which the transform does not touch.")


def hadamard_takeaway(effect: HadamardEffect) -> Prose:
    """The transform's measured effect in a clause, for the takeaways."""
    moved = ("lowered" if effect.rht_product < effect.plain_product else
             "raised" if effect.rht_product > effect.plain_product else "left")
    return Prose(f"the Hadamard transform leaves the product unchanged and {moved} one layer's weight-gradient "
                 f"error ({100 * effect.plain_product:.1f}% to {100 * effect.rht_product:.1f}%, both operands "
                 "rounded to nearest)")


def rounding_takeaway(bias: RoundingBias) -> Prose:
    """What stochastic rounding did to the bias, in a clause: it reduces it (a bias remains) or none shows at
    the copies measured, by :attr:`RoundingBias.bias_share` as :func:`rounding_bias_sentence` decides."""
    k, mean, nearest = bias.ks[-1], 100 * bias.stochastic[-1], 100 * bias.nearest
    what = ("shows no bias across steps" if _printed_share(bias) < 1.5 else
            "reduces the rounding bias across steps, though some remains")
    return Prose(f"stochastic rounding {what} (the mean of {k} copies {mean:.1f}% off, against "
                 f"{nearest:.1f}% for rounding to nearest)")


@dataclass(frozen=True)
class RoundingBias:
    """One tensor quantised to NVFP4 many times: ``stochastic[i]``, the relative error of the mean of
    ``ks[i]`` stochastically rounded copies (fractions); ``nearest``, the relative error of rounding to
    nearest, which every copy repeats, so that it is also the error of their mean; ``clamped``, the share of
    the non-zero values that scale above E2M1's largest value, 6 (the E4M3 block scale is ``amax / 6``
    rounded to nearest, sometimes down), which stochastic rounding clamps to 6 every time: a bias it keeps."""

    ks: tuple[int, ...]
    stochastic: tuple[float, ...]
    nearest: float
    clamped: float

    @property
    def bias_share(self) -> float:
        """The mean of the most stochastic copies' error over what ``1/sqrt(k)`` from one copy predicts for
        unbiased rounding (about 1 when no bias shows; more when a bias remains)."""
        return self.stochastic[-1] / (self.stochastic[0] / math.sqrt(self.ks[-1]))


def rounding_bias(x: torch.Tensor, *, draws: int = 256, seed: int = 0) -> RoundingBias:
    """Quantise ``x`` (2-D) to NVFP4 ``draws`` times with stochastic rounding (one generator from ``seed``) and
    once to nearest; the error of the running mean after each power of four copies, and at ``draws``."""
    x = _check_2d("x", x)
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 2:
        raise ValueError(f"draws must be an int of at least 2, got {draws!r}")
    gen = torch.Generator(device=x.device).manual_seed(seed)
    sr = nvfp4_scaling(stochastic=True)
    ks = sorted({4 ** i for i in range(8) if 4 ** i < draws} | {draws})
    total = torch.zeros_like(x, dtype=torch.float64)
    errors = []
    for k in range(1, draws + 1):
        total += sr.round_trip(x, generator=gen).double()
        if k in ks:
            errors.append(_relative(total / k, x))
    nearest = nvfp4_scaling().quantize(x)
    br, bc = nearest.block
    scales = nearest.scales.repeat_interleave(br, 0).repeat_interleave(bc, 1)
    nonzero = x != 0
    clamped = float(((x.abs() > 6 * scales) & nonzero).sum()) / max(1, int(nonzero.sum()))
    return RoundingBias(tuple(ks), tuple(errors), _relative(nearest.dequantize(), x), clamped)


def _printed_share(bias: RoundingBias) -> float:
    """:attr:`RoundingBias.bias_share` as a reader computes it from the two printed errors, one copy's and the
    mean's, to the one decimal the sentence prints: the number the verdict is decided on, so that a printed
    1.5 never comes with "no bias shows"."""
    k = bias.ks[-1]
    first, last = _shown(bias.stochastic[0]), _shown(bias.stochastic[-1])
    return round(last / (first / math.sqrt(k)) if first else bias.bias_share, 1)


def rounding_bias_sentence(bias: RoundingBias) -> Prose:
    """How the mean of stochastic copies approached the tensor, against rounding to nearest, and whether a
    bias showed (the mean's error, as printed, at least 1.5 times what ``1/sqrt(k)`` predicts from one copy)."""
    k, last, first = bias.ks[-1], 100 * bias.stochastic[-1], 100 * bias.stochastic[0]
    nearest = 100 * bias.nearest
    text = (f"One stochastically rounded copy of the gradient (in blocks along its features, as the input-gradient "
            f"product reads it) is {first:.1f}% off, "
            + ("more than" if first > nearest else "no more than") + f" rounding to nearest's {nearest:.1f}%; "
            f"the mean of {k} copies is {last:.1f}% off, while rounding to nearest stays {nearest:.1f}% off however "
            "many times it is repeated, since every copy is the same. ")
    share = _printed_share(bias)
    if share < 1.5:
        text += (f"The mean's error fell about as 1/sqrt(k) ({share:.1f} times what 1/sqrt({k}) predicts): "
                 "no bias shows at this many copies, where rounding to nearest's whole error is bias.")
    else:
        text += (f"The mean's error fell more slowly than 1/sqrt(k) ({share:.1f} times what 1/sqrt({k}) predicts): "
                 f"a bias remains, smaller than rounding to nearest's. {100 * bias.clamped:.1f}% of the values "
                 "scale above E2M1's largest value, 6 (the E4M3 block scale rounds amax / 6 to nearest, sometimes "
                 "down), and stochastic rounding clamps them to 6 every time.")
    return Prose(text)


def mechanism_facts(effect: HadamardEffect, bias: RoundingBias) -> dict[str, object]:
    """``rht_plain`` / ``rht_rht``: the weight-gradient product's error without and with the transform
    (percent), ``rht_sentence``; ``sr_one`` / ``sr_mean`` / ``sr_nearest`` (percent) and ``sr_k`` (copies) of
    :class:`RoundingBias`, and ``sr_bias_sentence``; ``rht_takeaway`` and ``sr_takeaway``, clauses for the
    takeaways."""
    return {"rht_plain": 100 * effect.plain_product, "rht_rht": 100 * effect.rht_product,
            "rht_sentence": hadamard_sentence(effect),
            "sr_one": 100 * bias.stochastic[0], "sr_mean": 100 * bias.stochastic[-1],
            "sr_nearest": 100 * bias.nearest, "sr_k": bias.ks[-1], "sr_bias_sentence": rounding_bias_sentence(bias),
            "rht_takeaway": hadamard_takeaway(effect), "sr_takeaway": rounding_takeaway(bias)}
