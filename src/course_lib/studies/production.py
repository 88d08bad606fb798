"""Lesson 4's production loop, run in the reader's own plain loops: the tiny models and batches those loops
train (:func:`tiny_regression`, :class:`TinyGAN`), what they read off torch's objects (:func:`steps_taken`,
:func:`weights_and_gradients`), and the facts, phrases and tables the lesson glues from what the loops did.

The loops themselves (two optimizers on one ``GradScaler``, gradient accumulation, resuming with the
scaler's state, an FP32 module under autocast, logging to TensorBoard) are in the lesson, where the reader
sees them; the tests run the same lines against torch."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..glue import Prose, plural
from ..models import DeepMLP, regression_batch
from ..monitor import MonitorLog
from ..tables import MarkdownTable, markdown_table

Batch = tuple[torch.Tensor, torch.Tensor]


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return value


def _non_negative_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return value


def _code(value: object) -> Prose:
    return Prose(f"`{value}`")


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


@dataclass(frozen=True)
class TinyRegression:
    """A small regression task for a plain loop: :class:`~course_lib.models.DeepMLP` (``width`` wide,
    ``depth`` layers) on fixed ``batches`` of (input, target) pairs from
    :func:`~course_lib.models.regression_batch`, on ``device``, trained by AdamW at ``lr``."""

    device: torch.device
    batches: tuple[Batch, ...]
    width: int
    depth: int
    lr: float

    def fresh(self, seed: int = 0) -> tuple[DeepMLP, torch.optim.AdamW, torch.amp.GradScaler]:
        """A new model (initial weights from ``seed``), its AdamW optimizer and a ``GradScaler`` with torch's
        defaults (initial scale 2**16), as a training script creates them at its start."""
        model = DeepMLP(self.width, self.depth, seed=seed).to(self.device)
        return model, torch.optim.AdamW(model.parameters(), lr=self.lr), torch.amp.GradScaler(self.device.type)

    def gradients(self, weights: Mapping[str, torch.Tensor], batches: Sequence[Batch],
                  dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The gradient of the mean squared error over all of ``batches`` at once (one full batch), at
        ``weights`` (a state dict), under autocast with ``dtype`` (None: in FP32, no autocast); per parameter
        name, in FP32."""
        if not batches:
            raise ValueError("batches is empty: a full batch needs at least one micro-batch")
        model = DeepMLP(self.width, self.depth).to(self.device)
        model.load_state_dict(dict(weights))
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] for b in batches])
        region = contextlib.nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)
        with region:
            loss = F.mse_loss(model(x), y)
        loss.backward()
        return {name: p.grad.detach().float().clone() for name, p in model.named_parameters() if p.grad is not None}


def tiny_regression(device: torch.device | str = "cpu", *, batches: int, batch_size: int = 8, width: int = 16,
                    depth: int = 3, lr: float = 1e-2, seed: int = 0) -> TinyRegression:
    """A :class:`TinyRegression` of ``batches`` batches of ``batch_size`` rows (the same ones for the same
    ``seed``): small enough that a plain loop of a few steps costs well under a second on a CPU."""
    for name, value in (("batches", batches), ("batch_size", batch_size), ("width", width), ("depth", depth)):
        _positive_int(name, value)
    if not (isinstance(lr, (int, float)) and not isinstance(lr, bool) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    device = torch.device(device)
    data = tuple((x.to(device), y.to(device)) for x, y in
                 (regression_batch(width, batch_size, step, seed=seed) for step in range(batches)))
    return TinyRegression(device, data, width, depth, float(lr))


class TinyGAN:
    """The smallest GAN with both halves: a linear generator (noise of ``noise_dim`` values -> 2-D points) and
    a discriminator (2-D point -> logit, one hidden layer of 8), an AdamW optimizer each (``opt_g``,
    ``opt_d``), and fixed batches of ``batch_size`` real points, drawn around (2, -1), and noise per step."""

    def __init__(self, device: torch.device | str = "cpu", *, seed: int = 0, batch_size: int = 16,
                 noise_dim: int = 4, lr: float = 1e-3):
        _positive_int("batch_size", batch_size)
        _positive_int("noise_dim", noise_dim)
        self.device, self.seed, self.batch_size, self.noise_dim = torch.device(device), seed, batch_size, noise_dim
        with torch.random.fork_rng(devices=[]):    # the initial weights come from seed, the caller's RNG is kept
            torch.manual_seed(seed)
            self.generator = nn.Linear(noise_dim, 2).to(self.device)
            self.discriminator = nn.Sequential(nn.Linear(2, 8), nn.Tanh(), nn.Linear(8, 1)).to(self.device)
        self.g_params = list(self.generator.parameters())
        self.d_params = list(self.discriminator.parameters())
        self.opt_g = torch.optim.AdamW(self.g_params, lr=lr)
        self.opt_d = torch.optim.AdamW(self.d_params, lr=lr)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Real points and generator noise for ``step`` (the same for the same seed and step)."""
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        real = torch.randn(self.batch_size, 2, generator=gen) + torch.tensor([2.0, -1.0])
        noise = torch.randn(self.batch_size, self.noise_dim, generator=gen)
        return real.to(self.device), noise.to(self.device)

    def losses(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(discriminator loss, generator loss) at ``step``: the discriminator's binary cross-entropy on real
        points (label 1) and detached generated ones (label 0), and the generator's on its points labelled 1."""
        real, noise = self.batch(step)
        fake = self.generator(noise)
        real_logit, fake_logit = self.discriminator(real), self.discriminator(fake.detach())
        loss_d = (F.binary_cross_entropy_with_logits(real_logit, torch.ones_like(real_logit))
                  + F.binary_cross_entropy_with_logits(fake_logit, torch.zeros_like(fake_logit)))
        fooled = self.discriminator(fake)
        return loss_d, F.binary_cross_entropy_with_logits(fooled, torch.ones_like(fooled))

    def zero_grad(self) -> None:
        self.opt_g.zero_grad(set_to_none=True)
        self.opt_d.zero_grad(set_to_none=True)


def steps_taken(optimizer: torch.optim.Optimizer) -> int:
    """How many steps an Adam or AdamW ``optimizer`` has taken: the ``step`` count it keeps per parameter
    (a step that ``GradScaler.step`` skipped never reaches the optimizer, so it does not count)."""
    if not isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)):
        raise TypeError(f"steps_taken reads Adam's or AdamW's step count, not {type(optimizer).__name__}'s")
    counts = {int(state["step"]) for state in optimizer.state.values() if "step" in state}
    if len(counts) > 1:
        raise ValueError(f"the parameters of this optimizer took different numbers of steps: {sorted(counts)}")
    return counts.pop() if counts else 0


@dataclass(frozen=True)
class WeightsAndGradients:
    """A model's parameters (a state dict) and their gradients (FP32, per parameter name) at one moment."""

    weights: dict[str, torch.Tensor]
    gradients: dict[str, torch.Tensor]


def weights_and_gradients(model: nn.Module) -> WeightsAndGradients:
    """Copies of ``model``'s weights and of its parameters' current ``.grad`` (parameters without one are left
    out), for comparing later with a gradient computed another way."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    return WeightsAndGradients({k: v.detach().clone() for k, v in model.state_dict().items()},
                               {n: p.grad.detach().float().clone() for n, p in model.named_parameters()
                                if p.grad is not None})


# -- two optimizers, one scaler ------------------------------------------------------------------------


def shared_scaler_facts(*, steps: int, d_steps: int, g_steps: int, initial_scale: float, final_scale: float,
                        backoff_factor: float, growth_factor: float) -> dict[str, object]:
    """The two-optimizer run: ``steps`` iterations in which the discriminator's gradients overflowed once.
    The steps each optimizer took (``gan_steps``, ``gan_d_steps``, ``gan_g_steps``), the scale before and
    after (``gan_scale_start``, ``gan_scale_end``), the number of back-offs that turns one into the other
    (``gan_backoffs``; growths count negative), and a phrase on what that shows (``gan_verdict``)."""
    _positive_int("steps", steps)
    for name, value in (("d_steps", d_steps), ("g_steps", g_steps)):
        if _non_negative_int(name, value) > steps:
            raise ValueError(f"{name} ({value}) cannot exceed steps ({steps})")
    if not (0 < backoff_factor < 1 and growth_factor > 1):
        raise ValueError(f"GradScaler's backoff_factor is in (0, 1) and its growth_factor above 1, got "
                         f"{backoff_factor} and {growth_factor}")
    if not (initial_scale > 0 and final_scale > 0):
        raise ValueError(f"scales must be positive, got {initial_scale} and {final_scale}")
    ratio = final_scale / initial_scale
    backoffs = round(math.log(ratio) / math.log(backoff_factor)) if ratio <= 1 else -round(
        math.log(ratio) / math.log(growth_factor))
    d_skipped, g_skipped = steps - d_steps, steps - g_steps
    if d_skipped == 1 and g_skipped == 0 and backoffs == 1:
        verdict = ("only the optimizer whose gradients overflowed skipped its step, the other stepped, and the "
                   "shared scale backed off once for the iteration")
    elif d_skipped == 0:
        verdict = "the discriminator skipped no step: its spike did not overflow here, so nothing was tested"
    elif g_skipped:
        verdict = (f"the generator skipped {plural(g_skipped, 'step')} too, so its gradients overflowed as well and this "
                   "run does not separate the two")
    elif backoffs != d_skipped:
        verdict = (f"the scale changed by {plural(backoffs, 'back-off')} for {plural(d_skipped, 'skipped step')}: "
                   "**not once per overflowing iteration**")
    else:
        verdict = (f"the discriminator skipped {d_skipped} steps and the generator none; the scale backed off "
                   "once for each of those iterations")
    return {"gan_steps": steps, "gan_d_steps": d_steps, "gan_g_steps": g_steps, "gan_scale_start": initial_scale,
            "gan_scale_end": final_scale, "gan_backoffs": backoffs, "gan_verdict": Prose(verdict)}


# -- gradient accumulation ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccumulationCheck:
    """Accumulated gradients against full-batch ones, the largest absolute difference over every boundary and
    parameter: between the accumulated gradient and the full-batch gradient under the same autocast
    (``max_difference``); between the accumulated gradient and the full-batch gradient in FP32
    (``accumulated_error``); between the full-batch gradient under autocast and in FP32 (``autocast_error``:
    autocast's own rounding, the yardstick); and the largest absolute full-batch gradient entry
    (``largest_gradient``)."""

    max_difference: float
    accumulated_error: float
    autocast_error: float
    largest_gradient: float


def accumulation_table(check: AccumulationCheck) -> MarkdownTable:
    """:class:`AccumulationCheck` as a table: each largest absolute difference, and as a share of the largest
    full-batch gradient entry."""
    rows = [("accumulated against full batch, same autocast", check.max_difference),
            ("accumulated against full batch in FP32", check.accumulated_error),
            ("full batch under autocast against FP32 (autocast's own rounding)", check.autocast_error)]
    return markdown_table(["comparison", "largest difference", "of the largest gradient entry"],
                          [(name, f"{v:.2g}", f"{100 * v / check.largest_gradient:.2f}%") for name, v in rows])


def _max_abs_difference(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    if set(a) != set(b):
        raise ValueError(f"the gradients name different parameters: {sorted(set(a) ^ set(b))}")
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def check_accumulation(kept: Sequence[WeightsAndGradients], task: TinyRegression, accumulation_steps: int,
                       dtype: torch.dtype) -> AccumulationCheck:
    """Compare the gradient accumulated at each boundary (``kept[k]``: weights and unscaled gradients from
    :func:`weights_and_gradients`, taken at the ``k``-th boundary) with the gradient of the same weights on
    the boundary's ``accumulation_steps`` micro-batches of ``task`` as one batch, under autocast with
    ``dtype`` and in FP32."""
    _positive_int("accumulation_steps", accumulation_steps)
    if not kept:
        raise ValueError("kept is empty: keep the weights and gradients at each boundary")
    if len(kept) * accumulation_steps > len(task.batches):
        raise ValueError(f"{len(kept)} boundaries of {accumulation_steps} micro-batches need "
                         f"{len(kept) * accumulation_steps} batches; the task has {len(task.batches)}")
    difference = accumulated = rounding = largest = 0.0
    for k, snap in enumerate(kept):
        batches = task.batches[k * accumulation_steps:(k + 1) * accumulation_steps]
        full = task.gradients(snap.weights, batches, dtype)
        fp32 = task.gradients(snap.weights, batches, None)
        difference = max(difference, _max_abs_difference(snap.gradients, full))
        accumulated = max(accumulated, _max_abs_difference(snap.gradients, fp32))
        rounding = max(rounding, _max_abs_difference(full, fp32))
        largest = max(largest, max(float(g.abs().max()) for g in full.values()))
    return AccumulationCheck(difference, accumulated, rounding, largest)


def accumulation_facts(check: AccumulationCheck, *, micro_batches: int, accumulation_steps: int,
                       optimizer_steps: int, scaler_updates: int) -> dict[str, object]:
    """The accumulation run: ``micro_batches`` micro-batches, ``accumulation_steps`` per optimizer step, the
    steps the optimizer took and the ``update()`` calls the scaler counted. Facts: ``acc_micro``,
    ``acc_steps``, ``acc_boundaries``, ``acc_optimizer_steps``,
    ``acc_updates``, the differences of ``check`` (``acc_max_diff``, ``acc_relative``: that difference over
    the largest gradient entry, ``acc_error``, ``acc_autocast_error``) and two phrases: ``acc_verdict`` (whether the
    accumulated gradient is as close to the FP32 one as autocast's own rounding leaves the full-batch one,
    within a factor of 2) and ``acc_update_verdict``."""
    for name, value in (("micro_batches", micro_batches), ("accumulation_steps", accumulation_steps)):
        _positive_int(name, value)
    _non_negative_int("optimizer_steps", optimizer_steps)
    _non_negative_int("scaler_updates", scaler_updates)
    if micro_batches % accumulation_steps:
        raise ValueError(f"{micro_batches} micro-batches do not split into steps of {accumulation_steps}")
    values = (check.max_difference, check.accumulated_error, check.autocast_error, check.largest_gradient)
    if not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"an accumulation check holds finite non-negative differences, got {values}")
    boundaries = micro_batches // accumulation_steps
    if check.autocast_error == 0:
        verdict = ("autocast added no rounding here (was it on?), so there is no yardstick to judge the "
                   "difference by")
    elif check.accumulated_error <= check.autocast_error:
        verdict = ("the accumulated gradient is no further from the exact one than the full batch under autocast "
                   "is: accumulating added no error beyond autocast's own rounding")
    elif check.accumulated_error <= 2 * check.autocast_error:
        # two roundings of the same sums in different orders: either may land nearer the exact value
        verdict = ("the two errors are of one size (the accumulated one within twice the other: the same sums "
                   "rounded in different orders may land on either side), so accumulating added no error beyond "
                   "autocast's own rounding")
    else:
        verdict = ("**accumulating added error beyond autocast's own rounding**: is each micro-batch's loss "
                   "divided by the number of micro-batches?")
    if scaler_updates == optimizer_steps == boundaries:
        update_verdict = "once per boundary"
    else:
        update_verdict = (f"**not once per boundary**: {scaler_updates} updates and {optimizer_steps} optimizer "
                          f"steps for {boundaries} boundaries")
    return {"acc_micro": micro_batches, "acc_steps": accumulation_steps, "acc_boundaries": boundaries,
            "acc_optimizer_steps": optimizer_steps, "acc_updates": scaler_updates,
            "acc_max_diff": check.max_difference, "acc_error": check.accumulated_error,
            "acc_autocast_error": check.autocast_error,
            "acc_relative": check.max_difference / check.largest_gradient if check.largest_gradient else 0.0,
            "acc_verdict": Prose(verdict), "acc_update_verdict": Prose(update_verdict)}


def run_accumulation(task: TinyRegression, accumulation_steps: int, dtype: torch.dtype, *,
                     divide: bool = True) -> tuple[nn.Module, list[WeightsAndGradients]]:
    """The lesson's accumulation loop over all of ``task``'s micro-batches, from ``task.fresh()``: each loss
    under autocast with ``dtype``, divided by ``accumulation_steps`` (or not, with ``divide=False``: the
    exercise's slip), scaled and backpropagated; at each boundary ``unscale_``, keep the weights and
    gradients, ``step``, ``update``. Returns the trained model and what was kept at each boundary."""
    _positive_int("accumulation_steps", accumulation_steps)
    if len(task.batches) % accumulation_steps:
        raise ValueError(f"{len(task.batches)} micro-batches do not split into steps of {accumulation_steps}")
    model, opt, scaler = task.fresh()
    kept = []
    for i, (x, y) in enumerate(task.batches):
        with torch.autocast(task.device.type, dtype=dtype):
            loss = F.mse_loss(model(x), y)
        scaler.scale(loss / accumulation_steps if divide else loss).backward()
        if (i + 1) % accumulation_steps == 0:
            scaler.unscale_(opt)
            kept.append(weights_and_gradients(model))
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
    return model, kept


def undivided_accumulation_facts(task: TinyRegression, accumulation_steps: int, dtype: torch.dtype) -> dict[str, object]:
    """The accumulation exercise, measured: the loop run with and without dividing each micro-batch's loss,
    from the same initial weights. Facts: ``ex_acc_grad_ratio`` (the undivided gradient's norm over the
    divided one's at the first boundary), ``ex_acc_error_times`` (:func:`check_accumulation`'s error of the
    undivided run against FP32, in multiples of autocast's own rounding; ``ex_acc_error_pct``: the same error in
    percent of the largest full-batch gradient entry, as the lesson's table reports it), ``ex_acc_adamw_change_pct`` (the
    largest difference between the two runs' total weight updates under AdamW, in percent of the largest
    update)."""
    start = {k: v.clone() for k, v in task.fresh()[0].state_dict().items()}
    divided, kept_divided = run_accumulation(task, accumulation_steps, dtype)
    undivided, kept_undivided = run_accumulation(task, accumulation_steps, dtype, divide=False)

    def norm(gradients: Mapping[str, torch.Tensor]) -> float:
        return math.sqrt(sum(float(g.double().pow(2).sum()) for g in gradients.values()))

    ratio = norm(kept_undivided[0].gradients) / norm(kept_divided[0].gradients)
    check = check_accumulation(kept_undivided, task, accumulation_steps, dtype)
    if check.autocast_error == 0:
        raise ValueError("autocast added no rounding here, so there is no yardstick for the error")
    after_divided, after_undivided = divided.state_dict(), undivided.state_dict()
    update = max(float((after_divided[k] - start[k]).abs().max()) for k in start)
    change = max(float((after_undivided[k] - after_divided[k]).abs().max()) for k in start)
    return {"ex_acc_grad_ratio": ratio, "ex_acc_error_times": check.accumulated_error / check.autocast_error,
            "ex_acc_error_pct": 100 * check.accumulated_error / check.largest_gradient,
            "ex_acc_adamw_change_pct": 100 * change / update}


# -- resuming -------------------------------------------------------------------------------------------

StepLog = Sequence[tuple[float, float, bool]]


def _check_logs(split: int, runs: Mapping[str, StepLog]) -> int:
    lengths = {len(log) for log in runs.values()}
    if len(lengths) != 1:
        raise ValueError(f"the runs have different lengths: { {k: len(v) for k, v in runs.items()} }")
    n = lengths.pop()
    _positive_int("split", split)
    if split >= n:
        raise ValueError(f"split ({split}) must fall inside the run of {n} steps")
    for name, log in runs.items():
        if any(len(entry) != 3 for entry in log):
            raise ValueError(f"{name}: each step is (loss, scale, skipped)")
    return n


def resume_table(whole: StepLog, resumed: StepLog, forgot: StepLog, split: int) -> MarkdownTable:
    """Per step from ``split`` (the checkpoint) on: the loss and scale of the uninterrupted run, of the run
    resumed with the scaler's state, and of the one resumed without it (each step ``(loss, scale, skipped)``;
    a skipped step is marked)."""
    _check_logs(split, {"whole": whole, "resumed": resumed, "forgot": forgot})

    def cell(entry: tuple[float, float, bool]) -> str:
        loss, scale, skipped = entry
        return f"{loss:.4f} at {scale:,.0f}" + (" (skipped)" if skipped else "")

    return markdown_table(["step", "uninterrupted: loss at scale", "resumed with the scaler's state",
                           "resumed without it"],
                          [(i, cell(whole[i]), cell(resumed[i]), cell(forgot[i])) for i in range(split, len(whole))])


def resume_facts(whole: StepLog, resumed: StepLog, forgot: StepLog, split: int) -> dict[str, object]:
    """The resume runs (each step ``(loss, scale, skipped)``, checkpoint before step ``split``): a phrase on
    whether the resumed run equals the uninterrupted one, loss, scale and skip (``resume_identical``), the steps
    (``resume_steps``, ``resume_split``), the scale the uninterrupted run had at the checkpoint and the one the
    run without the scaler's state restarted from (``resume_scale``, ``forgot_scale``), the steps each
    skipped after the checkpoint (``resume_skipped_after``, ``forgot_skipped_after``, and the difference
    ``forgot_extra_skips``), the largest loss difference from the uninterrupted run after the checkpoint
    (``forgot_max_loss_diff``) and a phrase on what forgetting cost (``forgot_verdict``)."""
    n = _check_logs(split, {"whole": whole, "resumed": resumed, "forgot": forgot})
    identical = [tuple(a) for a in whole] == [tuple(b) for b in resumed]
    skipped_whole = sum(bool(e[2]) for e in whole[split:])
    skipped_forgot = sum(bool(e[2]) for e in forgot[split:])
    extra = skipped_forgot - skipped_whole
    loss_diff = max(abs(a[0] - b[0]) for a, b in zip(whole[split:], forgot[split:]))
    if extra > 0:
        verdict = (f"the run without it skipped {extra} more {'step' if extra == 1 else 'steps'} than the "
                   "uninterrupted run while its scale came back down, and its losses differ from there on")
    elif loss_diff > 0:
        verdict = "the run without it skipped no extra step, but its losses differ from the uninterrupted run's"
    else:
        verdict = ("the run without it matched the uninterrupted run here: no gradient overflowed at the "
                   "restarted scale, so this run does not show the cost")
    same = ("identical, bit for bit: the same loss, scale and skip at every step" if identical
            else "**different**: the resumed run did not continue where the uninterrupted one went")
    return {"resume_identical": Prose(same),
            "resume_steps": n, "resume_split": split, "resume_scale": whole[split][1], "forgot_scale": forgot[split][1],
            "resume_skipped_after": skipped_whole, "forgot_skipped_after": skipped_forgot,
            "forgot_extra_skips": extra, "forgot_max_loss_diff": loss_diff, "forgot_verdict": Prose(verdict)}


# -- one module in FP32 ---------------------------------------------------------------------------------


def fallback_table(seen: Sequence[tuple[torch.dtype, torch.dtype]]) -> MarkdownTable:
    """What the module saw under autocast, as its forward hook recorded it (``seen``: (input dtype, output
    dtype) per call, first without the FP32 fallback, then with it)."""
    if len(seen) != 2:
        raise ValueError(f"expected two hook records (without, with the fallback), got {len(seen)}")
    return markdown_table(["the module, under autocast", "its input", "its output"],
                          [(label, *(f"`{_dtype_name(d)}`" for d in s))
                           for label, s in zip(("as it is", "in the FP32 fallback"), seen)])


def fallback_facts(seen: Sequence[tuple[torch.dtype, torch.dtype]], no_cast_error: str | None) -> dict[str, object]:
    """The dtypes the module saw and produced without and with the fallback (``fb_plain_in``,
    ``fb_plain_out``, ``fb_in``, ``fb_out``, as code), a phrase on whether the fallback ran the module in FP32
    (``fb_verdict``), and what a disabled region without the ``.float()`` cast gave (``fb_no_cast``: torch's
    error message, or a phrase when it raised none)."""
    if len(seen) != 2:
        raise ValueError(f"expected two hook records (without, with the fallback), got {len(seen)}")
    (plain_in, plain_out), (fb_in, fb_out) = seen
    if fb_in == fb_out == torch.float32 and plain_out != torch.float32:
        verdict = "the fallback ran the module in FP32, where autocast alone ran it in lower precision"
    elif fb_in == fb_out == torch.float32:
        verdict = "the module ran in FP32 both ways: autocast did not lower it here, so the fallback changed nothing"
    else:
        verdict = "**the fallback did not run the module in FP32**"
    no_cast = (Prose(f"torch raised `{no_cast_error.strip()}`") if no_cast_error
               else Prose("torch raised no error: it ran the module on the low-precision input"))
    return {"fb_plain_in": _code(_dtype_name(plain_in)), "fb_plain_out": _code(_dtype_name(plain_out)),
            "fb_in": _code(_dtype_name(fb_in)), "fb_out": _code(_dtype_name(fb_out)), "fb_verdict": Prose(verdict),
            "fb_no_cast": no_cast}


# -- logging to TensorBoard ----------------------------------------------------------------------------


def gradient_norm(stats) -> float:
    """The L2 norm of all gradients together, from the monitor's per-parameter
    :class:`~course_lib.monitor.GradientStats` (their ``norm`` s: the true gradient's, finite values)."""
    return math.hypot(*(s.norm for s in stats))


def scalars_table(read_back: Mapping[str, Sequence[tuple[int, float]]]) -> MarkdownTable:
    """The scalars read back from an event file (tag -> (step, value) pairs), one row per step, one column
    per tag (whole numbers such as a loss scale in full, other values to 4 significant figures; a step a tag
    lacks is shown as -)."""
    if not read_back:
        raise ValueError("no scalars were read back: is the log directory the writer's?")
    tags = sorted(read_back)
    by_tag = {tag: dict(pairs) for tag, pairs in read_back.items()}
    steps = sorted({step for pairs in by_tag.values() for step in pairs})
    return markdown_table(["step", *(f"`{t}`" for t in tags)],
                          [(s, *(_scalar(by_tag[t][s]) if s in by_tag[t] else "-" for t in tags)) for s in steps])


def _scalar(value: float) -> str:
    # "#": trailing zeros kept, so that 0.34 reads 0.3400 beside its column's other four-figure values
    return f"{value:,.0f}" if math.isfinite(value) and value == int(value) and abs(value) >= 1 else f"{value:#.4g}"


def tensorboard_facts(read_back: Mapping[str, Sequence[tuple[int, float]]], log: MonitorLog,
                      norms: Sequence[float]) -> dict[str, object]:
    """Whether the event file holds what the loop logged: ``loss`` and ``scale`` as the monitor recorded
    them (``log``) and ``grad_norm`` (``norms``, per step), each compared with the value read back after
    rounding to FP32 (TensorBoard stores a scalar as a 32-bit float). Facts: the tags (``tb_tags``), the steps
    (``tb_steps``), the values read back (``tb_values``) and a phrase (``tb_verdict``)."""
    if not isinstance(log, MonitorLog):
        raise TypeError(f"log must be the monitor's MonitorLog, got {type(log).__name__}")
    logged = {"loss": list(log.losses), "scale": list(log.scales), "grad_norm": list(norms)}
    if len({len(v) for v in logged.values()}) != 1:
        raise ValueError("the monitor's log and the norms cover different numbers of steps")
    missing = sorted(set(logged) - set(read_back))
    steps = list(log.steps)
    mismatched = []
    for tag in sorted(set(logged) & set(read_back)):
        got = dict(read_back[tag])
        want = {s: float(torch.tensor(v, dtype=torch.float32)) for s, v in zip(steps, logged[tag])}
        if got != want:
            mismatched.append(tag)
    if missing:
        verdict = f"**the event file lacks** {', '.join(f'`{t}`' for t in missing)}"
    elif mismatched:
        verdict = f"**the values read back differ from those logged** for {', '.join(f'`{t}`' for t in mismatched)}"
    else:
        verdict = "each equal to the value logged, rounded to FP32"
    return {"tb_tags": Prose(", ".join(f"`{t}`" for t in sorted(read_back))), "tb_steps": len(steps),
            "tb_values": sum(len(v) for v in read_back.values()), "tb_verdict": Prose(verdict)}
