"""Lesson 4's recipe comparison, where a skipped step and a run's sensitivity meet: :func:`perturbed_runs`
(FP32 trained again from slightly perturbed weights, a yardstick for how far one batch's loss moves when the
weights differ by an amount no arithmetic chose) and :func:`skip_note`, what the page can and cannot say a
skipped step cost."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..device import SizeProfile
from ..glue import Prose, and_list, count_word, power_of_two_text
from ..models import course_setup
from ..train import History, TrainConfig, TrainState, get_recipe, train


@dataclass(frozen=True)
class PerturbedRuns:
    """``recipe`` trained again from initial weights each multiplied by ``1 + scale * N(0, 1)``, one run per
    noise draw (``runs``, keyed by the draw's name): a yardstick for how far one batch's loss moves when the
    weights differ by an amount no arithmetic chose."""

    recipe: str
    scale: float
    runs: dict[str, History]


def perturbed_runs(profile: SizeProfile, device: torch.device | str = "cpu", *, steps: int, scale: float = 1e-4,
                   draws: int = 4, recipe: str = "fp32", seed: int = 0) -> PerturbedRuns:
    """Train ``recipe`` as :func:`~course_lib.train.run_recipe` trains it from ``seed`` (the same batches and
    loop), ``draws`` times, each from the initial weights multiplied elementwise by ``1 + scale * N(0, 1)``
    (the noise from a generator seeded with the draw's number, 1 to ``draws``). ``scale = 0`` is
    ``run_recipe``'s run, bit for bit."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale must be a finite number of at least 0, got {scale!r}")
    for name, value in (("draws", draws), ("steps", steps)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    device = torch.device(device)
    r = get_recipe(recipe, device)
    runs = {}
    for draw in range(1, draws + 1):
        setup = course_setup(profile, device, steps=steps, default_steps=(steps, steps), seed=seed)
        model = setup.model(seed)
        noise = torch.Generator().manual_seed(draw)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(1 + scale * torch.randn(p.shape, generator=noise).to(p.device, p.dtype))
        state = TrainState(model, r, TrainConfig(steps=setup.steps), device)
        runs[f"{recipe}, perturbed ({draw})"] = train(state, setup.sampler)
    return PerturbedRuns(recipe, float(scale), runs)


def _shared_rise(histories: Mapping[str, History], reference: str, controls: PerturbedRuns | None = None) -> str:
    """A sentence on the step where every autocast run's loss rose furthest above ``reference``'s together
    (the largest smallest gap) and fell back at the next step in the runs that skipped nothing; "" when no
    such step: fewer than two autocast runs, none without a skip, or no step where all are above. With
    ``controls`` (runs of ``reference`` itself from perturbed initial weights), what they did at that step:
    how many rose at least half as far as the smallest autocast rise there, the run's sensitivity."""
    ref = histories[reference]
    runs = {n: h for n, h in histories.items()
            if "autocast" in n and n != reference and len(h.losses) >= len(ref.losses)}
    clean = {n: h for n, h in runs.items() if not any(h.skipped)}
    if len(runs) < 2 or not clean or len(ref.losses) < 2:
        return ""

    def gap(run: History, t: int) -> float:
        return run.losses[t] - ref.losses[t]

    t = max(range(len(ref.losses) - 1), key=lambda i: min(gap(h, i) for h in runs.values()))
    low, high = min(gap(h, t) for h in runs.values()), max(gap(h, t) for h in runs.values())
    back = max(abs(gap(h, t + 1)) for h in clean.values())
    if not low > 0 or not back < min(gap(h, t) for h in clean.values()) / 2:
        return ""
    text = (f"At step {t} every autocast run's loss was above `{reference}`'s, by {low:+.3f} to {high:+.3f} ("
            + and_list([f"`{n}` {gap(h, t):+.3f}" for n, h in clean.items()])
            + f", which skipped nothing), and at step {t + 1} the autocast runs that skipped nothing were back "
              f"within {back:.3f} of it: a rise on one batch, shared by runs that never skipped")
    usable = {} if controls is None else {n: h for n, h in controls.runs.items() if len(h.losses) > t}
    if controls is None or controls.recipe != reference or not usable:
        return text + ", which this page does not explain further"
    at_t = [gap(h, t) for h in usable.values()]
    widest = max(abs(gap(h, i)) for h in usable.values() for i in range(min(len(h.losses), len(ref.losses))))
    roundoff = torch.finfo(torch.bfloat16).eps / 2
    text += (f". As a yardstick, `{reference}` itself, trained again from its initial weights each multiplied by "
             f"1 + {controls.scale:g} × N(0, 1) (a relative change of about {controls.scale:g}, against BF16's "
             f"unit roundoff of {roundoff:.2g}; {count_word(len(usable))} draws, no autocast), was "
             f"{and_list([f'{v:+.3f}' for v in at_t])} from its unperturbed run at step {t}, and up to "
             f"{widest:.3f} at any step")
    full, half = sum(v >= low for v in at_t), sum(v >= low / 2 for v in at_t)
    n = count_word(len(at_t))
    if full:
        said = f"{count_word(full)} of the {n} draws rose at step {t} as far as the smallest autocast rise or further"
        if half > full:
            said += f", and {count_word(half - full)} more at least half as far"
    elif half:
        said = f"{count_word(half)} of the {n} draws rose at step {t} at least half as far as the smallest autocast rise"
    else:
        return text + (": a perturbation this small does not set off the rise, which this page does not explain "
                       "further")
    return text + (f": {said}, with no autocast rounding at all. Around this step one batch's loss is sensitive "
                   "to small differences in the weights, and rounding is one source of such differences; with one "
                   "run per recipe, a recipe's own effect there cannot be told from that sensitivity")


def _skip_against_yardstick(name: str, run: History, reference: str, ref: History, step: int,
                            controls: PerturbedRuns | None, peers: Sequence[tuple[str, History]] = ()) -> str:
    """At ``step`` (the first loss after a skip): the skipping run's gap to ``reference`` against the widest gap
    of the yardstick's draws there, and, where it is beyond, the same at the skipped step itself (``step`` - 1,
    before the skip could act): a gap already beyond the yardstick there is not the skip's. Then ``peers``
    (runs of the same kind that skipped nothing) are the closer control: one that had drifted at least as far at
    the skipped step and was back within the yardstick at ``step`` points to the skip for the gap that stayed.
    "" without usable controls."""
    usable = [] if controls is None or controls.recipe != reference else [
        h for h in controls.runs.values() if len(h.losses) > step]
    if not usable or len(run.losses) <= step or len(ref.losses) <= step or step < 1:
        return ""

    def against(at: int) -> tuple[float, float]:
        return (max(abs(h.losses[at] - ref.losses[at]) for h in usable), run.losses[at] - ref.losses[at])

    yard, g = against(step)
    yard_before, g_before = against(step - 1)
    if abs(g) <= yard:
        verdict = ": within the yardstick, so this page cannot tell the skip's cost from the run's sensitivity"
    elif abs(g_before) > yard_before:
        verdict = (f", beyond the yardstick. But at step {step - 1}, before the skip could act, it was already "
                   f"{g_before:+.3f}, while the yardstick's draws were within {yard_before:.3f} of `{reference}` "
                   "there: the run had drifted apart before it skipped")
        back = [(n, p.losses[step - 1] - ref.losses[step - 1], p.losses[step] - ref.losses[step])
                for n, p in peers if len(p.losses) > step]
        back = [(n, before, after) for n, before, after in back if abs(before) >= abs(g_before) and abs(after) <= yard]
        if back:
            n, before, after = back[0]
            verdict += (f". `{n}` had drifted as far at step {step - 1} ({before:+.3f}) and skipped nothing, and at "
                        f"step {step} it was back within the yardstick ({after:+.3f}), while `{name}` stayed "
                        f"{g:+.3f}: compared with that run, which came back, the gap that stayed points to the skip "
                        "(one pair of runs, on one batch)")
        else:
            verdict += ", and this page cannot tell how much of the gap the skip caused"
    else:
        verdict = ": beyond the yardstick, so the skip's cost shows through the run's sensitivity"
    return (f". At step {step}, the first loss after the skip, the yardstick's draws were within {yard:.3f} of "
            f"`{reference}` and `{name}` was {g:+.3f}{verdict}")


def skip_note(histories: Mapping[str, History], reference: str = "fp32", *,
              clip_norm: float | None = TrainConfig.clip_norm, controls: PerturbedRuns | None = None
              ) -> dict[str, object]:
    """``recipe_skips``: which recipe runs skipped which steps (and at what loss scale), and what a skipped step
    does to the table's final loss (the last step's, one batch's). For the first skip of each run, where
    ``reference`` ran: its loss minus the reference's at the skipped step (measured before the update it did not
    take) and at the next step (the first loss after it), beside the same two numbers of every run with the
    same name prefix (``fp16``) that skipped nothing, so that a jump both show is not read as the skip's; a
    rise every autocast run shows at one step, where runs that skipped nothing show it too; and each run's
    unscaled gradient norms before clipping at the two steps. Those norms do not size the update: the runs
    clip at ``clip_norm`` (the course loop's default; None: no clipping) and AdamW moves each weight by about
    its learning rate (the runs' ``lrs`` at the skipped step) whatever the gradient's size. ``controls``
    (:func:`perturbed_runs` of ``reference``) say whether that shared rise is the run's sensitivity to any small
    difference in the weights."""
    if clip_norm is not None and not (isinstance(clip_norm, (int, float)) and clip_norm > 0
                                      and math.isfinite(clip_norm)):
        raise ValueError(f"clip_norm must be None or a positive finite number, got {clip_norm!r}")
    parts, step_lr = [], None
    for name, h in histories.items():
        steps = [i for i, s in enumerate(h.skipped) if s]
        if not steps:
            continue
        scales = and_list([power_of_two_text(int(round(math.log2(h.scales[i])))) for i in steps])
        text = (f"`{name}` skipped {'step' if len(steps) == 1 else 'steps'} {and_list([str(i) for i in steps])} "
                f"(its scaled gradients overflowed FP16 at a scale of {scales})")
        first, ref = steps[0], histories.get(reference)
        if len(getattr(h, "lrs", ())) > first:
            step_lr = h.lrs[first]
        if ref is not None and name != reference and first + 1 < min(len(h.losses), len(ref.losses)):
            def gaps(run: History) -> str:
                return (f"{run.losses[first] - ref.losses[first]:+.3f} and "
                        f"{run.losses[first + 1] - ref.losses[first + 1]:+.3f}")
            peers = [(n, r) for n, r in histories.items() if n != name and n.split("_")[0] == name.split("_")[0]
                     and not any(r.skipped) and first + 1 < len(r.losses)]
            text += (f". Its loss minus `{reference}`'s was {gaps(h)} at steps {first} and {first + 1}: a step's loss "
                     f"is measured before its update, so step {first + 1} is the first to miss the skipped one")
            if peers:
                text += " (" + and_list([f"`{n}`, which skipped nothing: {gaps(r)}" for n, r in peers]) + ")"
            text += f". A difference at step {first} cannot come from the skip"
            rise = _shared_rise(histories, reference, controls)
            if rise:
                text += ". " + rise
            text += _skip_against_yardstick(name, h, reference, ref, first + 1, controls, peers)
            runs = [(name, h), (reference, ref)] + peers
            if all(len(getattr(r, "grad_norms", ())) > first + 1 for _, r in runs):
                def norms(run: History) -> str:
                    at_skip = run.grad_norms[first]
                    return (f"{at_skip:.3g}" + (" (the overflow that made the skip)" if run is h
                                                and not math.isfinite(at_skip) else "")
                            + f" and {run.grad_norms[first + 1]:.3g}")
                text += (f". The unscaled gradient norms at steps {first} and {first + 1}, before clipping, were "
                         + "; ".join(f"`{n}` {norms(r)}" for n, r in runs))
        parts.append(text)
    if not parts:
        return {"recipe_skips": Prose("No run skipped a step here.")}
    clipping = ("" if clip_norm is None else
                f"every run clips its gradients to a norm of {clip_norm:g} before the optimizer's step, and ")
    rate = "its learning rate" + ("" if step_lr is None else f", {step_lr:g},")
    return {"recipe_skips": Prose(
        ". ".join(parts) + f". A gradient's norm does not size the update here: {clipping}AdamW moves each weight "
        f"by about {rate} whatever the gradient's size. A skipped step is a whole update missing, and the "
        "table's final loss (one step's loss, on one batch) may reflect it.")}
