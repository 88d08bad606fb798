"""Lesson 8: what made a block-scaled run's loss jump above BF16's at one step. The run is retrained from its
seed to that step, its loss there is taken again with exact products on the same weights, and its last k steps
are replayed with exact products (from the block-scaled run's own weights and optimizer state k steps before),
so that the jump can be placed: in that step's rounding, in the last update, or built over many steps."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from ..glue import Prose
from ..mx import BLOCK_RECIPES, exact_products
from ..mx.linear import convert_to_block_scaled
from ..train import TrainState, evaluate, train
from .fp8 import Fp8Training, converted_state
from .microscaling import widest_step_gap
from .training_prose import BASELINE

#: a replay "closes" the gap when it brings the loss at least this far from the run's back towards the baseline's
CLOSED_SHARE = 0.5


@dataclass(frozen=True)
class GapReplay:
    """The widest one-step gap of a block-scaled training run (:func:`widest_step_gap`), replayed.

    ``recorded``: the run's loss at ``step`` in the result; ``baseline``: the baseline's there; ``as_run``: the
    loss at ``step`` of the run retrained from its seed (the same number, on a deterministic machine);
    ``exact_forward``: that loss with exact products on the same weights; ``replays``: ``(k, loss at step)``
    when the last ``k`` steps before ``step`` ran with exact products instead (``k == step``: an FP32 run from
    the same initial weights)."""

    recipe: str
    seed: int
    step: int
    baseline: float
    recorded: float
    as_run: float
    exact_forward: float
    replays: tuple[tuple[int, float], ...]

    @property
    def gap(self) -> float:
        return self.as_run - self.baseline

    def closes(self, loss: float) -> bool:
        """Whether ``loss`` at the step is at least :data:`CLOSED_SHARE` of the gap back towards the baseline."""
        return loss - self.baseline <= (1 - CLOSED_SHARE) * self.gap


def replay_lengths(step: int, dense: int = 16) -> tuple[int, ...]:
    """How many of the last steps before ``step`` to replay: every count from 1 to ``dense``, then 32, 64,
    ... below ``step``, and ``step`` itself (every step, from the initial weights); none at step 0."""
    for name, value in (("step", step), ("dense", dense)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    lengths = list(range(1, min(dense, step - 1) + 1))
    k = 32
    while k < step:
        if k > dense:
            lengths.append(k)
        k *= 2
    return tuple(lengths + [step] if step else lengths)


def _loss_at(state: TrainState, sampler, step: int) -> float:
    """The loss :func:`course_lib.train.train` logs at ``step``, without a step."""
    acc = state.config.accumulation_steps
    return evaluate(state, sampler, acc, start=step * acc)


def replay_widest_gap(result: Fp8Training, profile, device: torch.device | str = "cpu", *,
                      baseline: str = BASELINE, lr: float = 3e-3) -> GapReplay:
    """Find ``result``'s widest one-step gap above ``baseline`` and replay it (see :class:`GapReplay`). ``lr``
    must be the one ``result`` trained with (:func:`block_scaled_training`'s default)."""
    _, recipe, i, step = widest_step_gap(result, baseline)
    if recipe not in BLOCK_RECIPES:
        raise ValueError(f"the widest gap is in {recipe!r}, not a block-scaled recipe ({', '.join(BLOCK_RECIPES)})")
    seed = result.seeds[i]
    state, sampler = converted_state(recipe, lambda m: convert_to_block_scaled(m, recipe, seed=seed), profile,
                                     device, steps=result.steps, seed=seed, lr=lr)
    lengths = replay_lengths(step)
    starts = {step - k for k in lengths}
    snapshots = {}
    for s in range(step):
        if s in starts:
            snapshots[s] = copy.deepcopy(state.state_dict())
        train(state, sampler, steps=1)
    as_run = _loss_at(state, sampler, step)
    with exact_products(state.model):
        exact_forward = _loss_at(state, sampler, step)
    replays = []
    for k in lengths:
        state.load_state_dict(copy.deepcopy(snapshots[step - k]))
        with exact_products(state.model):
            train(state, sampler, steps=k)
        replays.append((k, _loss_at(state, sampler, step)))
    return GapReplay(recipe, seed, step, result.curves[baseline][i][step], result.curves[recipe][i][step],
                     as_run, exact_forward, tuple(replays))


def replay_sentence(r: GapReplay) -> Prose:
    """What the replays say about where the jump came from, each clause from the numbers."""
    where = f"`{r.recipe}`'s loss at step {r.step} (seed {r.seed})"
    again = abs(r.as_run - r.recorded) <= 0.05 * abs(r.recorded - r.baseline)
    text = (f"Retrained from its seed, {where} came out at {r.as_run:.3f} " +
            ("as in the run above. " if again else f"against {r.recorded:.3f} in the run above: this machine did not repeat the "
             "run exactly, and what follows is about the retrained one. "))
    if r.gap <= 0:
        return Prose(text + "The retrained run was not above BF16 there, so there is no jump to place.")
    if r.step == 0:
        return Prose(text + f"At step 0 every run starts from the same weights, so the gap there is that forward "
                     f"pass's rounding alone (with exact products: {r.exact_forward:.3f}).")
    if not r.closes(r.exact_forward):
        text += (f"With exact products on the same weights it is {r.exact_forward:.3f}, still "
                 f"{r.exact_forward - r.baseline:+.3f} from BF16's: the jump is in the weights the run had reached, "
                 "not in that step's rounding of the forward pass.")
    else:
        return Prose(text + f"With exact products on the same weights it is {r.exact_forward:.3f}: most of the jump "
                     "is that step's rounding of the forward pass, not the weights.")
    if not r.replays:
        return Prose(text)
    first = next((k for k, loss in r.replays if r.closes(loss)), None)
    one = dict(r.replays).get(1)
    if first == 1:
        text += f" With only the last step's products exact, the loss there is {one:.3f}"
        open_again = [(k, loss) for k, loss in r.replays if not r.closes(loss)]
        if not open_again:
            return Prose(text + ": the last update, made from block-scaled gradients, made most of the jump.")
        worst_k, worst = max(open_again, key=lambda kl: kl[1])
        verb = "does" if len(open_again) == 1 else "do"
        # a replay that lands beyond the run as it ran widened the gap: say so, not only that it did not close it
        widened = (f", beyond the run as it ran, {r.as_run:.3f}: it widened the gap" if worst > r.as_run else "")
        return Prose(text + f", but {len(open_again)} of the {len(r.replays) - 1} longer replays {verb} not close "
                     f"half the gap (the last {worst_k} steps exact: {worst:.3f}{widened}): the loss at this step moves far "
                     "with small changes to the weights, whatever the arithmetic, so one replay cannot pin the jump "
                     "on the last update.")
    if one is not None:
        text += f" With the last step's products exact it is still {one:.3f}."
    if first is None:
        return Prose(text + f" No replay closed half the gap, not even an FP32 run from the same seed "
                     f"({r.replays[-1][1]:.3f}): at this step the FP32 trajectory, too, is that far from BF16's, so "
                     "the jump measures how far two runs that round differently drift apart here, not a fault of "
                     f"`{r.recipe}`.")
    losses = dict(r.replays)
    steps_back = [(losses[k] - losses[k + 1], k) for k in losses if k + 1 in losses]
    drop, k = max(steps_back) if steps_back else (0.0, 0)
    if drop >= (1 - CLOSED_SHARE) * r.gap:
        text += (f" The largest change from one more exact step is step {r.step - k - 1}'s: replayed from step "
                 f"{r.step - k} on, the loss there is {losses[k]:.3f}; from step {r.step - k - 1} on, "
                 f"{losses[k + 1]:.3f}.")
    longer = [k for k, _ in r.replays if k > first]
    still = [k for k, loss in r.replays if k > first and not r.closes(loss)]
    text += f" The shortest replay to close half the gap is the last {first} steps"
    if still:
        text += (f", and {len(still)} of the {len(longer)} longer ones do not: where the run stood at step "
                 f"{r.step} depended on many of the steps before it, each nudging the weights, not on one step's "
                 "rounding.")
    else:
        text += (": the jump was built over those steps, not made by one step's rounding." if not longer else
                 ", and every longer one does too: the jump was built over those steps, not made by one step's "
                 "rounding.")
    return Prose(text)
