"""Lesson 8's "taking the NVFP4 recipe apart": each recipe's gradient of the course model against the exact
FP32 one, over several trained models, and the facts, phrases and table that say what removing each piece did
(with the sign and the range over models, so that no sentence claims more than every model showed)."""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..glue import Prose, and_list
from ..models import CourseSetup, course_setup
from ..mx.linear import block_recipe, convert_to_block_scaled
from ..tables import MarkdownTable, markdown_table

REFERENCE = "nvfp4"

# each piece of the NVFP4 recipe, by the recipe that removes it, and how a sentence names it (the order the
# lesson discusses them in)
PIECES: dict[str, str] = {"nvfp4_no_hp_last": "the high-precision last block", "nvfp4_no_2d": "square weight blocks",
                          "nvfp4_no_rht": "the Hadamard transform", "nvfp4_no_sr": "stochastic rounding"}

# the verdicts of PieceEffect.verdict
HELPS, HELPS_ON_AVERAGE, HELPS_SOMEWHERE = "helps", "helps on average", "helps somewhere"
HURTS, HURTS_ON_AVERAGE, HURTS_SOMEWHERE = "hurts", "hurts on average", "hurts somewhere"
MIXED, NOISE = "mixed", "noise"

# a difference counts, in either direction, when it exceeds this many of its standard errors over the draws
NOISE_SIGMAS = 2.0


@dataclass(frozen=True)
class PieceEffect:
    """What removing one piece of a recipe did to the gradient error: ``per_model[s][b]``, the error without the
    piece minus the error with it, in percentage points, for model ``s`` on its batch ``b`` (positive: the
    piece brought the gradient closer); ``noise[s][b]``, the standard error of that difference over the
    stochastic-rounding draws (points; 0 where neither recipe rounds stochastically)."""

    per_model: tuple[tuple[float, ...], ...]
    noise: tuple[tuple[float, ...], ...]

    def __post_init__(self) -> None:
        if not self.per_model or not all(self.per_model):
            raise ValueError("a PieceEffect needs at least one model with at least one batch")
        if [len(m) for m in self.noise] != [len(m) for m in self.per_model]:
            raise ValueError("a PieceEffect needs one noise value per model and batch")

    @property
    def lo(self) -> float:
        return min(min(m) for m in self.per_model)

    @property
    def hi(self) -> float:
        return max(max(m) for m in self.per_model)

    @property
    def model_means(self) -> tuple[float, ...]:
        return tuple(sum(m) / len(m) for m in self.per_model)

    @property
    def mean(self) -> float:
        """The mean over every model and batch (points)."""
        values = [v for m in self.per_model for v in m]
        return sum(values) / len(values)

    @property
    def largest(self) -> float:
        """The largest difference in size (points)."""
        return max(abs(self.lo), abs(self.hi))

    def _signs(self) -> tuple[list[list[int]], list[int]]:
        """+1, -1 or 0 (within :data:`NOISE_SIGMAS` standard errors) per model and batch, and per model's
        mean."""
        def sign(value: float, noise: float) -> int:
            return 1 if value > NOISE_SIGMAS * noise else -1 if value < -NOISE_SIGMAS * noise else 0
        batches = [[sign(v, n) for v, n in zip(m, ns)] for m, ns in zip(self.per_model, self.noise)]
        models = [sign(mean, noise) for mean, noise in zip(self.model_means, self.model_noise)]
        return batches, models

    @property
    def model_noise(self) -> tuple[float, ...]:
        """The standard error of each model's mean over its batches (points), from the batches' own."""
        return tuple(math.sqrt(sum(n * n for n in ns)) / len(ns) for ns in self.noise)

    @property
    def model_signs(self) -> tuple[int, ...]:
        """Per model, the sign of its mean beyond :data:`NOISE_SIGMAS` of :attr:`model_noise` (+1: the piece
        helped, -1: it hurt, 0: within the noise)."""
        return tuple(self._signs()[1])

    def models_where(self, sign: int) -> tuple[int, ...]:
        """The indices of the models where a batch or the model's mean differs with ``sign`` (+1: the piece
        helped, -1: it hurt) beyond the noise."""
        batches, models = self._signs()
        return tuple(s for s, (b, m) in enumerate(zip(batches, models)) if sign in b or m == sign)

    @property
    def verdict(self) -> str:
        """Beyond the draw-to-draw noise (:data:`NOISE_SIGMAS` standard errors): :data:`HELPS` / :data:`HURTS`
        on every batch of every model; :data:`HELPS_ON_AVERAGE` / :data:`HURTS_ON_AVERAGE` on every model's
        mean, not every batch; :data:`MIXED` when both signs occur (see :attr:`mixed_between`);
        :data:`HELPS_SOMEWHERE` / :data:`HURTS_SOMEWHERE` when only one sign occurs, but not on every model;
        :data:`NOISE` when no difference exceeds the noise."""
        batches, models = self._signs()
        for up, every, average in ((1, HELPS, HELPS_ON_AVERAGE), (-1, HURTS, HURTS_ON_AVERAGE)):
            if all(b == up for m in batches for b in m):
                return every
            if all(m == up for m in models):
                return average
        helped, hurt = self.models_where(1), self.models_where(-1)
        if helped and hurt:
            return MIXED
        return HELPS_SOMEWHERE if helped else HURTS_SOMEWHERE if hurt else NOISE

    @property
    def ever_hurts(self) -> bool:
        """Whether some batch or some model's mean was worse with the piece, beyond the noise."""
        return bool(self.models_where(-1))

    @property
    def mixed_between(self) -> str:
        """``"models"`` when the models' means disagree in sign beyond the noise; ``"batches of models"`` when
        the piece helped on one model and hurt on another only on single batches (the means do not disagree);
        else ``"batches"`` (both signs only within one model)."""
        if {1, -1} <= set(self.model_signs):
            return "models"
        helped, hurt = self.models_where(1), self.models_where(-1)
        return "batches of models" if any(a != b for a in helped for b in hurt) else "batches"


@dataclass(frozen=True)
class GradientFidelity:
    """How far each recipe's gradient of the course model is from the exact FP32 gradient at the same
    weights and batch (relative L2 error over all parameters), for models trained in FP32 for ``steps`` steps
    from each of ``seeds`` (weights and batch order), on ``batches`` batches each.

    ``single[recipe][s][b]``: for model ``seeds[s]`` on its batch ``b``, the mean error of one gradient (of
    ``draws`` independent ones; they differ only where a recipe rounds stochastically), and
    ``single_stderr[recipe][s][b]`` its standard error over the draws (0 without stochastic rounding).
    ``averaged[recipe][s][i]``: for model ``seeds[s]``, the error of the mean of ``ks[i]`` draws (over the
    disjoint groups of that many, and over its batches; ``ks[0]`` = 1 equals the mean of ``single``): it falls
    like ``1/sqrt(k)`` for the part of the error that stochastic rounding makes unbiased, and levels off at
    the rest."""

    recipes: tuple[str, ...]
    seeds: tuple[int, ...]
    steps: int
    batches: int
    draws: int
    ks: tuple[int, ...]
    single: dict[str, tuple[tuple[float, ...], ...]]
    single_stderr: dict[str, tuple[tuple[float, ...], ...]]
    averaged: dict[str, tuple[tuple[float, ...], ...]]

    def _known(self, recipe: str) -> None:
        if recipe not in self.single:
            raise ValueError(f"no recipe named {recipe!r}; recipes: {', '.join(self.recipes)}")

    def mean_error(self, recipe: str) -> float:
        """``recipe``'s error of one gradient, the mean over every model and batch (a fraction)."""
        self._known(recipe)
        values = [v for per_model in self.single[recipe] for v in per_model]
        return sum(values) / len(values)

    def mean_averaged(self, recipe: str) -> tuple[float, ...]:
        """``averaged[recipe]``, the mean over models, one value per ``ks``."""
        self._known(recipe)
        return tuple(sum(col) / len(col) for col in zip(*self.averaged[recipe]))

    def effect(self, without: str, with_: str = REFERENCE) -> PieceEffect:
        """The error of ``without`` minus that of ``with_``, in points, per model and batch, with its noise."""
        self._known(without)
        self._known(with_)
        return PieceEffect(tuple(tuple(100 * (a - b) for a, b in zip(m_without, m_with))
                                 for m_without, m_with in zip(self.single[without], self.single[with_])),
                           tuple(tuple(100 * math.hypot(a, b) for a, b in zip(m_without, m_with))
                                 for m_without, m_with in zip(self.single_stderr[without], self.single_stderr[with_])))


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.reshape(-1).double() for p in model.parameters() if p.grad is not None])


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def trained_fp32_model(profile, device: torch.device | str = "cpu", *, seed: int, steps: int | None = None,
                       lr: float = 3e-3) -> tuple[CourseSetup, nn.Module]:
    """The course GPT trained in FP32 with AdamW for ``steps`` steps (default 30 small, 200 full) from ``seed``
    (weights and batch order), and its setup: the model every recipe of :func:`gradient_fidelity` starts from.
    The batches after the training's, ``setup.steps + b``, are the ones it measures on."""
    setup = course_setup(profile, device, steps=steps, default_steps=(30, 200), seed=seed)
    model = setup.model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for step in range(setup.steps):
        x, y = setup.sampler.batch(step, setup.device)
        opt.zero_grad(set_to_none=True)
        model(x, y)[1].backward()
        opt.step()
    return setup, model


def gradient_fidelity(profile, device: torch.device | str = "cpu", *,
                      recipes=("mxfp8", "mxfp4", "mxfp4_hp_last", "nvfp4", "nvfp4_no_sr", "nvfp4_no_rht",
                               "nvfp4_no_2d", "nvfp4_no_hp_last"), seeds=(0, 1, 2), draws: int = 4,
                      batches: int = 2, steps: int | None = None, lr: float = 3e-3) -> GradientFidelity:
    """For each of ``seeds``, train the course GPT in FP32 for ``steps`` steps from that seed (weights and
    batch order), then on each of its next ``batches`` batches compute the gradient exactly and ``draws`` times
    with each block-scaled ``recipe`` (a recipe without stochastic rounding gives the same gradient every time,
    so it is computed once per batch). Every recipe starts from the same trained weights: a deep copy of the
    FP32 model, its linear layers converted."""
    _positive_int("draws", draws)
    _positive_int("batches", batches)
    if not recipes:
        raise ValueError("gradient_fidelity needs at least one recipe")
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"gradient_fidelity needs at least one seed, each once; got {seeds!r}")
    for s in seeds:
        if isinstance(s, bool) or not isinstance(s, int):
            raise TypeError(f"seeds must be ints, got {s!r}")
    stochastic = {r: block_recipe(r).stochastic_gradients for r in recipes}
    ks = tuple(k for k in (1, 2, 4, 8, 16, 32, 64) if k <= draws)
    single: dict[str, list[tuple[float, ...]]] = {r: [] for r in recipes}
    stderr: dict[str, list[tuple[float, ...]]] = {r: [] for r in recipes}
    averaged: dict[str, list[tuple[float, ...]]] = {r: [] for r in recipes}
    n_steps = 0
    for seed in seeds:
        setup, model = trained_fp32_model(profile, device, seed=seed, steps=steps, lr=lr)
        n_steps = setup.steps
        converted = {r: convert_to_block_scaled(copy.deepcopy(model), r, seed=seed) for r in recipes}
        per_batch: dict[str, list[float]] = {r: [] for r in recipes}
        per_batch_se: dict[str, list[float]] = {r: [] for r in recipes}
        per_k: dict[str, list[list[float]]] = {r: [] for r in recipes}
        for b in range(batches):
            x, y = setup.sampler.batch(setup.steps + b, setup.device)
            model.zero_grad(set_to_none=True)
            model(x, y)[1].backward()
            exact = _flat_grad(model)
            norm = float(torch.linalg.vector_norm(exact))
            for recipe, m in converted.items():
                n = draws if stochastic[recipe] else 1
                # the forward pass rounds to nearest, so it is the same for every draw: run it once and draw
                # only the backward pass, whose stochastic rounding advances each layer's generator
                loss = m(x, y)[1]
                grads = []
                for i in range(n):
                    m.zero_grad(set_to_none=True)
                    loss.backward(retain_graph=i < n - 1)
                    grads.append(_flat_grad(m))
                errors = [float(torch.linalg.vector_norm(g - exact)) / norm for g in grads]
                per_batch[recipe].append(sum(errors) / n)
                per_batch_se[recipe].append(
                    math.sqrt(sum((e - per_batch[recipe][-1]) ** 2 for e in errors) / (n - 1) / n) if n > 1 else 0.0)
                grads += [grads[0]] * (draws - n)
                stacked = torch.stack(grads)
                # the error of the mean of k draws, averaged over the draws // k disjoint groups of k
                per_k[recipe].append([
                    sum(float(torch.linalg.vector_norm(stacked[g * k:(g + 1) * k].mean(0) - exact))
                        for g in range(draws // k)) / (draws // k) / norm for k in ks])
        for r in recipes:
            single[r].append(tuple(per_batch[r]))
            stderr[r].append(tuple(per_batch_se[r]))
            averaged[r].append(tuple(sum(col) / batches for col in zip(*per_k[r])))
    return GradientFidelity(tuple(recipes), tuple(seeds), n_steps, batches, draws, ks,
                            {r: tuple(v) for r, v in single.items()}, {r: tuple(v) for r, v in stderr.items()},
                            {r: tuple(v) for r, v in averaged.items()})


# ---- table and facts --------------------------------------------------------------------------------------

def fidelity_table(fidelity: GradientFidelity) -> MarkdownTable:
    """One row per recipe, one column per model seed and batch: the mean error of one gradient (percent)."""
    return markdown_table(
        ["recipe", *(f"seed {s}, batch {b}" for s in fidelity.seeds for b in range(fidelity.batches))],
        [[r, *(f"{100 * v:.1f}%" for per_model in fidelity.single[r] for v in per_model)]
         for r in fidelity.recipes])


def fidelity_difference_table(fidelity: GradientFidelity, reference: str = REFERENCE) -> MarkdownTable:
    """One row per recipe other than ``reference`` and model seed; per batch, the recipe's error minus
    ``reference``'s on the same batch (percentage points) and the noise it must exceed to count,
    :data:`NOISE_SIGMAS` standard errors over the stochastic-rounding draws (for a recipe without stochastic
    rounding, the reference's own noise; "none" where neither recipe rounds stochastically)."""
    batches = range(fidelity.batches)
    rows = []
    for r in fidelity.recipes:
        if r == reference:
            continue
        e = fidelity.effect(r, reference)
        for s, ds, ns in zip(fidelity.seeds, e.per_model, e.noise):
            rows.append([r, str(s), *(v for d, n in zip(ds, ns) for v in (
                f"{d:+.2f}", f"{NOISE_SIGMAS * n:.2f}" if n > 0 else "none"))])
    return markdown_table(
        ["recipe", "model seed", *(h for b in batches for h in (
            f"batch {b}: minus {reference.upper()} (points)", f"batch {b}: noise ({NOISE_SIGMAS:g} s.e.)"))],
        rows)


def _models(n: int) -> str:
    return f"{n} model{'s' if n != 1 else ''}"


def effect_range(effect: PieceEffect) -> str:
    """``"-2.10 to +7.40 points"``."""
    return f"{effect.lo:+.2f} to {effect.hi:+.2f} points"


def _mixed(effect: PieceEffect) -> str:
    return {"models": "the model", "batches": "the batch",
            "batches of models": "the batch, on different models (no two models' means lie on opposite sides of "
                                 "zero beyond the noise)"}[effect.mixed_between]


def _disagreeing(effect: PieceEffect) -> str:
    """What a mixed effect's average is over, as the sign disagreed: models, or batches (of one or several)."""
    return {"models": "models", "batches": "batches",
            "batches of models": "batches of different models"}[effect.mixed_between]


def _model_names(effect: PieceEffect, seeds: Sequence[int] | None) -> list[str]:
    """The models as the page's tables name them ("model seed 0"), else counted from 1."""
    if seeds is not None and len(seeds) != len(effect.per_model):
        raise ValueError(f"{len(seeds)} seeds for {len(effect.per_model)} models")
    return [f"model seed {x}" for x in seeds] if seeds is not None else [f"model {i + 1}"
                                                                       for i in range(len(effect.per_model))]


def _signs_by_model(effect: PieceEffect, *, plural: bool = False, seeds: Sequence[int] | None = None) -> str:
    """Plainly, where a mixed effect lowered the error and where it raised it: "lower error with it on model
    seed 0, higher on model seed 2" (a model where a batch or its mean lies beyond the noise)."""
    names = _model_names(effect, seeds)
    it = "them" if plural else "it"
    lower, higher = (and_list([names[i] for i in effect.models_where(sign)]) for sign in (1, -1))
    return f"lower error with {it} on {lower}, higher on {higher}"


def _some(effect: PieceEffect, sign: int) -> str:
    return f"{len(effect.models_where(sign))} of {_models(len(effect.per_model))}"


def _the_others(effect: PieceEffect, sign: int) -> str:
    """The models left over, in words: "the other" where one is, else "the others"."""
    return "the other" if len(effect.per_model) - len(effect.models_where(sign)) == 1 else "the others"


def verdict_phrase(effect: PieceEffect) -> str:
    """The sign of an effect over models and batches, said of the error with the piece, beyond the
    draw-to-draw noise."""
    return {HELPS: "lower with it on every batch of every model",
            HELPS_ON_AVERAGE: "lower with it on average for each model, though not on every batch",
            HELPS_SOMEWHERE: f"lower with it on {_some(effect, 1)}, within the draw-to-draw noise on "
                             f"{_the_others(effect, 1)}",
            HURTS: "higher with it on every batch of every model",
            HURTS_ON_AVERAGE: "higher with it on average for each model, though not on every batch",
            HURTS_SOMEWHERE: f"higher with it on {_some(effect, -1)}, within the draw-to-draw noise on "
                             f"{_the_others(effect, -1)}",
            MIXED: f"the sign depends on {_mixed(effect)}",
            NOISE: "within the draw-to-draw noise on every batch"}[effect.verdict]


def piece_sentence(subject: str, effect: PieceEffect, reference_error: float, *, plural: bool = False,
                   seeds: Sequence[int] | None = None) -> Prose:
    """What removing ``subject`` (a piece of the recipe, as the sentence starts with it) did to the gradient
    error, from the sign of ``effect`` over models and batches beyond the draw-to-draw noise; "a little" (and
    "only", with the share it is of that error) when its largest difference is under a tenth of
    ``reference_error``, the full recipe's own error
    (percent). ``seeds`` name the models as the page's tables do (see :func:`model_means_phrase`)."""
    s = "" if plural else "s"
    small = effect.largest < reference_error / 10
    # the share of the printed values (points to two decimals, the error to one), as a reader divides them
    share = float(f"{effect.largest:.2f}") / float(f"{reference_error:.1f}") if reference_error >= 0.05 else 0.0
    tenth = f", at most {100 * share:.2g}% of the full recipe's {reference_error:.1f}% error" if small else ""
    span = f"without {'them' if plural else 'it'}, {effect_range(effect)}{tenth}"
    verdict = effect.verdict
    if verdict in (MIXED, NOISE):
        lower = subject[0].lower() + subject[1:]
        # where only single batches of different models disagree, say plainly which models went which way (the
        # models' means below do not show it)
        plain = (f": {_signs_by_model(effect, plural=plural, seeds=seeds)}"
                 if effect.mixed_between == "batches of models" else "")
        how = (f"and the sign depends on {_mixed(effect)}{plain}; "
               f"{model_means_phrase(effect, plural=plural, seeds=seeds)}"
               if verdict == MIXED else "within the draw-to-draw noise of stochastic rounding on every batch")
        return Prose(f"Without {lower}, the error changes by {'only ' if small else ''}{effect_range(effect)}"
                     f"{tenth}, {how}: no consistent effect.")
    verb = "help" if verdict in (HELPS, HELPS_ON_AVERAGE, HELPS_SOMEWHERE) else "hurt"
    where = {HELPS: "on every batch of every model", HURTS: "on every batch of every model",
             HELPS_ON_AVERAGE: "on average for each model, though not on every batch",
             HURTS_ON_AVERAGE: "on average for each model, though not on every batch",
             HELPS_SOMEWHERE: f"on {_some(effect, 1)} and are within the draw-to-draw noise on "
                              f"{_the_others(effect, 1)}",
             HURTS_SOMEWHERE: f"on {_some(effect, -1)} and are within the draw-to-draw noise on "
                              f"{_the_others(effect, -1)}"}[verdict]
    if not plural:
        where = where.replace(" are within", " is within")
    return Prose(f"{subject} {verb}{s}{' a little' if small else ''} {where} ({span}).")


def model_means_phrase(effect: PieceEffect, *, plural: bool = False, seeds: Sequence[int] | None = None) -> str:
    """Each model's mean difference with :data:`NOISE_SIGMAS` of its standard errors, and which means lie
    beyond them (the page's rule for a difference that counts), with what the piece did there. Models are
    named by their ``seeds`` ("model seed 0", as the tables and figures name them), else counted from 1."""
    names = _model_names(effect, seeds)
    sigmas = f"{NOISE_SIGMAS:g} standard errors"
    means = ", ".join(f"{m:+.2f} ± {NOISE_SIGMAS * n:.2f}" for m, n in zip(effect.model_means, effect.model_noise))
    it = "them" if plural else "it"
    beyond = [(names[i], sign) for i, sign in enumerate(effect.model_signs) if sign]
    if not beyond:
        return f"per model the mean is {means} ({sigmas}), and no model's mean lies beyond its noise"
    which = and_list([f"{name} ({'lower' if sign > 0 else 'higher'} error with {it})" for name, sign in beyond])
    only = "only " if len(beyond) < len(effect.per_model) else ""
    return f"per model the mean is {means} ({sigmas}), beyond the noise {only}for {which}"


def largest_piece(fidelity: GradientFidelity) -> str | None:
    """The recipe (of :data:`PIECES` that ran) whose removal moved the error the most in size on average over
    models and batches, or None when none ran."""
    ran = [r for r in PIECES if r in fidelity.recipes]
    if not ran or REFERENCE not in fidelity.recipes:
        return None
    return max(ran, key=lambda r: abs(fidelity.effect(r).mean))


def last_block_sentence(fidelity: GradientFidelity) -> Prose:
    """What the high-precision last block did to NVFP4's gradient and to MXFP4's (``mxfp4`` against
    ``mxfp4_hp_last``), whether it was the largest piece, and whether keeping a block in high precision always
    brought the gradient closer."""
    nv = fidelity.effect("nvfp4_no_hp_last")
    mx = fidelity.effect("mxfp4", "mxfp4_hp_last")
    text = str(piece_sentence("The high-precision last block", nv, 100 * fidelity.mean_error(REFERENCE),
                              seeds=fidelity.seeds))
    largest = largest_piece(fidelity)
    if largest == "nvfp4_no_hp_last":
        text += (f" On average over models and batches its effect ({nv.mean:+.2f} points) is the largest of the "
                 "pieces'" + (f", an average over {_disagreeing(nv)} that disagree in sign." if nv.verdict == MIXED
                              else "."))
    elif largest is not None:
        text += (f" On average over models and batches ({nv.mean:+.2f} points) it is not the largest piece: "
                 f"{PIECES[largest]} is ({fidelity.effect(largest).mean:+.2f}).")
    without, with_ = 100 * fidelity.mean_error("mxfp4"), 100 * fidelity.mean_error("mxfp4_hp_last")
    moved = "raised" if with_ > without else "lowered" if with_ < without else "left"
    text += (f" The same choice made for MXFP4 {moved} its error from {without:.1f}% to {with_:.1f}% on average "
             f"(without the block in high precision minus with it, {effect_range(mx)}: {verdict_phrase(mx)}).")
    if nv.ever_hurts or mx.ever_hurts:
        text += (" Keeping a block in high precision did not always bring the gradient closer; the per-layer "
                 "breakdown below looks at where the error went.")
    else:
        text += (" Keeping the last block in high precision never made the gradient worse, in either recipe, "
                 "beyond the draw-to-draw noise.")
    return Prose(text)


def stochastic_rounding_sentence(fidelity: GradientFidelity) -> Prose:
    """What stochastic rounding did to a single gradient (from the sign over models and batches) and to the
    mean of the most draws, against rounding to nearest."""
    e = fidelity.effect("nvfp4_no_sr")
    if e.verdict == HELPS:
        text = (f"Stochastic rounding makes even a single gradient closer, on every batch of every model (without "
                f"it, {effect_range(e)}).")
    elif e.verdict == HELPS_ON_AVERAGE:
        text = (f"Stochastic rounding makes a single gradient closer on average for each model, though not on "
                f"every batch (without it, {effect_range(e)}).")
    else:
        text = (f"Stochastic rounding makes a *single* gradient no better (without it, {effect_range(e)}: "
                f"{verdict_phrase(e)}): it trades bias for variance.")
    k = fidelity.ks[-1]
    if k == 1:
        return Prose(text + " With one draw per batch, this run does not measure the average of draws.")
    curve = fidelity.mean_averaged(REFERENCE)
    first, last = 100 * curve[0], 100 * curve[-1]
    nearest = 100 * fidelity.mean_error("nvfp4_no_sr")
    ideal = first / math.sqrt(k)
    # compared as displayed: 10.7% beside 10.7% is level, whatever the digits after
    shown_last, shown_nearest = round(last, 1), round(nearest, 1)
    relation = ("below" if shown_last < shown_nearest else "level with" if shown_last == shown_nearest else
                "not below")
    text += (f" Averaging {k} draws brings the error of the mean from {first:.1f}% to {last:.1f}%, {relation} the "
             f"{nearest:.1f}% of one gradient rounded to nearest")
    # how much of the way to independent draws' 1/sqrt(k) the average went (the displayed ends are rounded)
    share = (first - last) / (first - ideal)
    target = f"the {ideal:.1f}% that 1/sqrt(k) would reach"
    text += (f", no closer to {target}" if share <= 0 else f", {100 * share:.0f}% of the way to {target}")
    if share < 0.5:
        text += (": what remains is the error of the operands that are rounded to nearest (the forward pass's, "
                 "and the weights and activations in the backward products), so averaging a few draws of one "
                 "gradient shows little of what stochastic rounding is for.")
    else:
        text += "."
    return Prose(text)


def pieces_takeaway(fidelity: GradientFidelity) -> Prose:
    """One clause per verdict: which pieces helped or hurt on every batch, on average or on some models, which
    changed sign, and which stayed within the draw-to-draw noise; stochastic rounding apart, with both numbers,
    when it did not help a single gradient but its average of draws beat one gradient rounded to nearest."""
    groups: dict[str, list[str]] = {}
    sr_average_only = False
    for recipe, name in PIECES.items():
        if recipe not in fidelity.recipes:
            continue
        verdict = fidelity.effect(recipe).verdict
        if recipe == "nvfp4_no_sr" and verdict not in (HELPS, HELPS_ON_AVERAGE) and fidelity.ks[-1] > 1 \
                and fidelity.mean_averaged(REFERENCE)[-1] < fidelity.mean_error("nvfp4_no_sr"):
            sr_average_only = True
            continue
        groups.setdefault(verdict, []).append(name)
    words = {HELPS: "helped on every batch of every model", HELPS_ON_AVERAGE: "helped on average for each model",
             HELPS_SOMEWHERE: "helped on some models and hurt on none",
             HURTS: "hurt on every batch of every model", HURTS_ON_AVERAGE: "hurt on average for each model",
             HURTS_SOMEWHERE: "hurt on some models and helped on none"}
    clauses = [f"{and_list(groups[v])} {words[v]}" for v in words if v in groups]
    if MIXED in groups:
        between = {fidelity.effect(r).mixed_between for r, name in PIECES.items() if name in groups[MIXED]}
        clauses.append(f"the effect of {and_list(groups[MIXED])} changed sign from "
                       + ("model to model" if between == {"models"} else "batch to batch (the models' means do "
                          "not disagree beyond the noise)" if "models" not in between else
                          "model to model or batch to batch"))
    if NOISE in groups:
        clauses.append(f"{and_list(groups[NOISE])} made no difference beyond the draw-to-draw noise")
    if sr_average_only:
        k = fidelity.ks[-1]
        clauses.append(f"stochastic rounding did not make one gradient closer, and the mean of {k} of its draws was "
                       f"{100 * fidelity.mean_averaged(REFERENCE)[-1]:.1f}% off against "
                       f"{100 * fidelity.mean_error('nvfp4_no_sr'):.1f}% for one gradient rounded to nearest")
    if not clauses:
        raise ValueError("none of the NVFP4 recipe's pieces ran")
    return Prose(f"over {_models(len(fidelity.seeds))}, " + and_list(clauses))


def fidelity_facts(fidelity: GradientFidelity) -> dict[str, object]:
    """What ran (``gf_models``, ``gf_seeds``, ``gf_batches``, ``gf_draws``, ``gf_steps``) and how many standard
    errors a difference must exceed to count (``gf_sigmas``); per recipe
    (``gf_<recipe>``) the mean gradient error in percent and (``gf_d_<recipe>_lo``/``_hi``) the range of its
    difference from NVFP4's in points over models and batches; NVFP4's error for one draw and for the mean of
    the most draws (``gf_k_last``), averaged over models; and the sentences :func:`last_block_sentence`
    (``gf_last_block``), :func:`piece_sentence` for square blocks and the Hadamard transform (``gf_2d``,
    ``gf_rht``), :func:`stochastic_rounding_sentence` (``gf_sr``) and :func:`pieces_takeaway`
    (``gf_takeaway``)."""
    facts: dict[str, object] = {
        "gf_models": len(fidelity.seeds), "gf_seeds": Prose(and_list([str(s) for s in fidelity.seeds])),
        "gf_batches": fidelity.batches, "gf_draws": fidelity.draws, "gf_steps": fidelity.steps,
        "gf_sigmas": NOISE_SIGMAS}
    for r in fidelity.recipes:
        facts[f"gf_{r}"] = 100 * fidelity.mean_error(r)
        if REFERENCE in fidelity.recipes:
            e = fidelity.effect(r)
            facts[f"gf_d_{r}_lo"], facts[f"gf_d_{r}_hi"] = e.lo, e.hi
    if REFERENCE in fidelity.recipes:
        curve = fidelity.mean_averaged(REFERENCE)
        facts.update({"gf_avg_first": 100 * curve[0], "gf_avg_last": 100 * curve[-1], "gf_k_last": fidelity.ks[-1]})
        reference_error = 100 * fidelity.mean_error(REFERENCE)
        if {"nvfp4_no_hp_last", "mxfp4", "mxfp4_hp_last"} <= set(fidelity.recipes):
            facts["gf_last_block"] = last_block_sentence(fidelity)
        if "nvfp4_no_2d" in fidelity.recipes:
            facts["gf_2d"] = piece_sentence("Square weight blocks", fidelity.effect("nvfp4_no_2d"), reference_error,
                                            plural=True, seeds=fidelity.seeds)
        if "nvfp4_no_rht" in fidelity.recipes:
            facts["gf_rht"] = piece_sentence("The Hadamard transform", fidelity.effect("nvfp4_no_rht"),
                                             reference_error, seeds=fidelity.seeds)
        if "nvfp4_no_sr" in fidelity.recipes:
            facts["gf_sr"] = stochastic_rounding_sentence(fidelity)
        if any(r in fidelity.recipes for r in PIECES):
            facts["gf_takeaway"] = pieces_takeaway(fidelity)
    return facts
