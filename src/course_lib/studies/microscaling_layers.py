"""Lesson 8's per-layer look at one result of "taking the NVFP4 recipe apart": where the gradient error goes
when a recipe keeps its last transformer block in high precision (MXFP4 against MXFP4 with the last block in
FP32), layer by layer, beside the error of the forward pass's output probabilities; and what share of a
model's linear layers a recipe keeps in high precision."""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..device import SizeProfile
from ..fp8 import QuantizedLinear
from ..glue import Prose, and_list
from ..models import build_gpt, gpt_config_for
from ..mx.linear import block_recipe, convert_to_block_scaled
from ..tables import MarkdownTable, markdown_table
from .microscaling_pieces import trained_fp32_model


def layer_group(name: str) -> str:
    """The layer a parameter belongs to in the breakdown: ``"blocks.1"`` for every parameter of transformer
    block 1 (``"blocks.1.attn.qkv.weight"``), else the first part of its name (``"head.weight"``: ``"head"``)."""
    if not isinstance(name, str):
        raise TypeError(f"a parameter name must be a string, got {type(name).__name__}")
    parts = name.split(".")
    if not name or not all(parts):
        raise ValueError(f"not a parameter name: {name!r}")
    return ".".join(parts[:2]) if parts[0] == "blocks" and len(parts) > 2 else parts[0]


def squared_error_by_group(exact: Mapping[str, torch.Tensor],
                           approx: Mapping[str, torch.Tensor]) -> dict[str, tuple[float, float]]:
    """Per :func:`layer_group`, in the order the groups first appear in ``exact``: ``(sum of (approx - exact)
    squared, sum of exact squared)`` over its parameters' gradients (float64). Both mappings must name the same
    parameters, each with tensors of one shape."""
    if set(exact) != set(approx):
        raise ValueError(f"the gradients name different parameters: {sorted(set(exact) ^ set(approx))}")
    if not exact:
        raise ValueError("no gradients to compare")
    sums: dict[str, tuple[float, float]] = {}
    for name, g in exact.items():
        q = approx[name]
        if not isinstance(g, torch.Tensor) or not isinstance(q, torch.Tensor):
            raise TypeError(f"the gradients of {name!r} must be tensors")
        if g.shape != q.shape:
            raise ValueError(f"{name!r}: exact gradient of shape {tuple(g.shape)}, the other {tuple(q.shape)}")
        g64, q64 = g.detach().double(), q.detach().double()
        err, norm = sums.get(layer_group(name), (0.0, 0.0))
        sums[layer_group(name)] = (err + float(((q64 - g64) ** 2).sum()), norm + float((g64 ** 2).sum()))
    return sums


Grid = tuple[tuple[tuple[float, ...], ...], ...]   # [model][batch][group]


@dataclass(frozen=True)
class LayerBreakdown:
    """Where the gradient error sits, layer by layer, with ``recipes`` = (without, with): the same recipe
    without and with ``kept`` (a layer group, :func:`layer_group`) in high precision, on models trained from
    ``seeds``. ``relative[recipe][s][b][g]``: the relative error (||error|| / ||exact||) of the gradient of
    ``groups[g]`` for model ``s`` on its batch ``b``; ``share[s][b][g]``: that group's share of the exact
    gradient's squared norm (they sum to 1); ``output[recipe][s][b]``: the relative error of the forward
    pass's output probabilities (the softmax of the logits)."""

    recipes: tuple[str, str]
    kept: str
    seeds: tuple[int, ...]
    groups: tuple[str, ...]
    relative: dict[str, Grid]
    share: Grid
    output: dict[str, tuple[tuple[float, ...], ...]]

    def __post_init__(self) -> None:
        if len(self.recipes) != 2 or self.recipes[0] == self.recipes[1]:
            raise ValueError(f"a LayerBreakdown compares two recipes, got {self.recipes!r}")
        if self.kept not in self.groups:
            raise ValueError(f"the kept group {self.kept!r} is not one of the groups {self.groups}")
        shape = [[len(b) for b in m] for m in self.share]
        if not shape or not all(shape) or any(n != len(self.groups) for m in shape for n in m):
            raise ValueError("share needs one value per group, on at least one batch of each model")
        for r in self.recipes:
            if [[len(b) for b in m] for m in self.relative.get(r, ())] != shape:
                raise ValueError(f"relative[{r!r}] must have share's shape")
            if [len(m) for m in self.output.get(r, ())] != [len(m) for m in shape]:
                raise ValueError(f"output[{r!r}] needs one value per model and batch")
        if len(self.seeds) != len(shape):
            raise ValueError("one seed per model")

    @property
    def n_batches(self) -> int:
        """Model-and-batch pairs measured."""
        return sum(len(m) for m in self.share)

    def _pairs(self, values: Mapping[str, Sequence[Sequence]]) -> list[tuple]:
        without, with_ = (values[r] for r in self.recipes)
        return [(a, b) for ma, mb in zip(without, with_) for a, b in zip(ma, mb)]

    def total(self, recipe: str) -> tuple[float, ...]:
        """The whole gradient's relative error per model and batch (in order): the square root of the sum
        over groups of share times relative error squared."""
        return tuple(math.sqrt(sum(s * e * e for s, e in zip(shares, errs)))
                     for ms, me in zip(self.share, self.relative[recipe]) for shares, errs in zip(ms, me))

    def higher_with_kept(self, group: str | None = None, *, lower: bool = False) -> int:
        """On how many batches the error was higher (``lower``: lower) with ``kept`` in high precision: of
        ``group``'s gradient, of the whole gradient (``"total"``), or (None) of the output probabilities."""
        if group is None:
            pairs = self._pairs(self.output)
        elif group == "total":
            pairs = list(zip(*(self.total(r) for r in self.recipes)))
        else:
            g = self._index(group)
            pairs = [(a[g], b[g]) for a, b in self._pairs(self.relative)]
        return sum((b < a) if lower else (b > a) for a, b in pairs)

    def mean_relative(self, recipe: str, group: str) -> float:
        g = self._index(group)
        return sum(b[g] for m in self.relative[recipe] for b in m) / self.n_batches

    def mean_share(self, group: str) -> float:
        g = self._index(group)
        return sum(b[g] for m in self.share for b in m) / self.n_batches

    def rise_shares(self) -> dict[str, float] | None:
        """Each group's part of the rise in the whole gradient's squared relative error, summed over batches,
        from ``without`` to ``with`` (share times the change in its squared error; the parts sum to 1); None
        when the summed squared error did not rise."""
        without, with_ = self.recipes
        parts = [sum(s[g] * (b[g] ** 2 - a[g] ** 2)
                     for ms, ma, mb in zip(self.share, self.relative[without], self.relative[with_])
                     for s, a, b in zip(ms, ma, mb)) for g in range(len(self.groups))]
        rise = sum(parts)
        return None if rise <= 0 else {name: p / rise for name, p in zip(self.groups, parts)}

    def _index(self, group: str) -> int:
        if group not in self.groups:
            raise ValueError(f"no layer group {group!r}; groups: {', '.join(self.groups)}")
        return self.groups.index(group)


def last_block_breakdown(profile, device: torch.device | str = "cpu", *, without: str = "mxfp4",
                         with_: str = "mxfp4_hp_last", seeds=(0, 1, 2), batches: int = 2, steps: int | None = None,
                         lr: float = 3e-3) -> LayerBreakdown:
    """On the models and batches of :func:`~course_lib.studies.microscaling_pieces.gradient_fidelity` (the
    same training, the same measured batches), each recipe's gradient split by :func:`layer_group` against the
    exact FP32 one, and the error of the output probabilities. ``with_`` must keep exactly one more last block
    in high precision than ``without``; neither may round stochastically (one gradient per batch)."""
    r_without, r_with = block_recipe(without), block_recipe(with_)
    if r_with.high_precision_last != r_without.high_precision_last + 1:
        raise ValueError(f"{with_!r} must keep exactly one more last block in high precision than {without!r}")
    if r_without.stochastic_gradients or r_with.stochastic_gradients:
        raise ValueError("the breakdown takes recipes that round to nearest (one gradient per batch)")
    if isinstance(batches, bool) or not isinstance(batches, int) or batches < 1:
        raise ValueError(f"batches must be a positive int, got {batches!r}")
    if not seeds:
        raise ValueError("last_block_breakdown needs at least one seed")
    relative: dict[str, list] = {without: [], with_: []}
    output: dict[str, list] = {without: [], with_: []}
    share: list = []
    groups: tuple[str, ...] = ()
    kept = ""
    for seed in seeds:
        setup, model = trained_fp32_model(profile, device, seed=seed, steps=steps, lr=lr)
        kept = f"blocks.{len(getattr(model, 'blocks')) - r_with.high_precision_last}"
        converted = {r: convert_to_block_scaled(copy.deepcopy(model), r, seed=seed) for r in (without, with_)}
        per: dict[str, list] = {without: [], with_: []}
        out: dict[str, list] = {without: [], with_: []}
        shares = []
        for b in range(batches):
            x, y = setup.sampler.batch(setup.steps + b, setup.device)
            grads, probs = {}, {}
            for name, m in (("exact", model), *converted.items()):
                m.zero_grad(set_to_none=True)
                logits, loss = m(x, y)
                loss.backward()
                grads[name] = {n: p.grad for n, p in m.named_parameters() if p.grad is not None}
                probs[name] = logits.detach().double().softmax(-1)
            exact_norm = float(torch.linalg.vector_norm(probs["exact"]))
            for r in (without, with_):
                sums = squared_error_by_group(grads["exact"], grads[r])
                groups = tuple(sums)
                per[r].append(tuple(math.sqrt(e / n) if n > 0 else 0.0 for e, n in sums.values()))
                out[r].append(float(torch.linalg.vector_norm(probs[r] - probs["exact"])) / exact_norm)
            total = sum(n for _, n in sums.values())
            shares.append(tuple(n / total for _, n in sums.values()))
        for r in (without, with_):
            relative[r].append(tuple(per[r]))
            output[r].append(tuple(out[r]))
        share.append(tuple(shares))
    return LayerBreakdown((without, with_), kept, tuple(seeds), groups, {r: tuple(v) for r, v in relative.items()},
                          tuple(share), {r: tuple(v) for r, v in output.items()})


def _of(count: int, n: int) -> str:
    return f"{count} of {n}"


def layer_breakdown_table(bd: LayerBreakdown) -> MarkdownTable:
    """One row per layer group, then the whole gradient and the output probabilities: the group's share of the
    exact gradient's squared norm (mean over batches), each recipe's relative error (mean over batches), on
    how many batches the error was higher with the kept block in high precision, and the group's part of the
    rise in the summed squared error (:meth:`LayerBreakdown.rise_shares`, computed batch by batch, so not from
    the means beside it; blank where the summed error did not rise)."""
    without, with_ = bd.recipes
    n = bd.n_batches
    rise = bd.rise_shares()
    rows = [(f"`{g}`" + (f" (in FP32 in `{with_}`)" if g == bd.kept else ""), f"{100 * bd.mean_share(g):.1f}%",
             f"{100 * bd.mean_relative(without, g):.1f}%", f"{100 * bd.mean_relative(with_, g):.1f}%",
             _of(bd.higher_with_kept(g), n), f"{100 * rise[g]:.0f}%" if rise else "") for g in bd.groups]
    totals = [sum(bd.total(r)) / n for r in bd.recipes]
    rows.append(("whole gradient", "100%", f"{100 * totals[0]:.1f}%", f"{100 * totals[1]:.1f}%",
                 _of(bd.higher_with_kept("total"), n), "100%" if rise else ""))
    outputs = [sum(v for m in bd.output[r] for v in m) / n for r in bd.recipes]
    rows.append(("output probabilities (forward pass)", "", f"{100 * outputs[0]:.2f}%", f"{100 * outputs[1]:.2f}%",
                 _of(bd.higher_with_kept(None), n), ""))
    return markdown_table(["layer", "share of the exact gradient (squared norm)", f"error, `{without}`",
                           f"error, `{with_}`", f"batches where `{with_}`'s error is higher",
                           "part of the rise in squared error"], rows)


def layer_breakdown_sentence(bd: LayerBreakdown) -> Prose:
    """What the breakdown shows: on how many batches keeping the block in high precision raised the whole
    gradient's error and lowered the kept block's own; which other layers' gradients were further off on every
    batch, the group that carries most of the rise, the output probabilities; and, where the layers the choice
    did not change carry the rise, that this page does not explain it."""
    n, kept = bd.n_batches, f"`{bd.kept}`"
    higher = bd.higher_with_kept("total")
    own = bd.higher_with_kept(bd.kept, lower=True)
    start = (f"With {kept} in high precision, the whole gradient's error was higher on {_of(higher, n)} batches, "
             f"and {kept}'s own gradient was closer to the exact one on {_of(own, n)}.")
    if higher == 0:
        return Prose(start)
    everywhere = [f"`{g}`" for g in bd.groups if g != bd.kept and bd.higher_with_kept(g) == n]
    text = start + (f" The gradients of {and_list(everywhere)}, layers the choice leaves as they were, were further "
                    "from the exact ones on every batch." if everywhere else "")
    rise = bd.rise_shares()
    if rise is not None:
        top = max(rise, key=lambda g: rise[g])
        # the share to the table's decimals (layer_breakdown_table), so that the two read the same
        text += (f" `{top}`, {100 * bd.mean_share(top):.1f}% of the exact gradient's squared norm on average, "
                 f"carries {100 * rise[top]:.0f}% of the rise in the summed squared error.")
        if top != bd.kept:
            out = bd.higher_with_kept(None)
            text += (f" The forward pass's output probabilities were further from the exact ones on {_of(out, n)} "
                     f"batches with {kept} in high precision, which suggests that, quantised, its error partly cancelled "
                     "the error of the blocks before it in the forward pass instead of adding to it." if out == n else
                     f" The forward pass's output probabilities were further from the exact ones on only "
                     f"{_of(out, n)} batches with {kept} in high precision.")
            text += (f" Why the errors cancel, and why the gradient of `{top}` moved most, this page does not "
                     "show: at this size the result is unexplained, and a measurement, not a rule of thumb, says "
                     "which layers to keep." if out == n else
                     " This page does not explain where the extra error comes from: at this size the result is "
                     "unexplained.")
    return Prose(text)


def high_precision_share(model: nn.Module) -> tuple[int, int]:
    """``(kept, total)``: how many of ``model``'s linear layers are plain ``nn.Linear`` ones, which compute in
    the model's own precision, and how many linear layers it has, quantised ones (a
    :class:`~course_lib.fp8.QuantizedLinear`, such as :class:`~course_lib.mx.BlockLinear`) included."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected a torch module, got {type(model).__name__}")
    linears = [m for m in model.modules() if isinstance(m, (nn.Linear, QuantizedLinear))]
    if not linears:
        raise ValueError("the model has no linear layers")
    return sum(type(m) is nn.Linear for m in linears), len(linears)


# NVIDIA's figure, not a measurement of this course: the share of its 12B model's linear layers its NVFP4 recipe
# kept in BF16, in percent (nvidia2025nvfp4, "about 16%")
NVIDIA_HIGH_PRECISION_PERCENT = 16.0


def share_against_nvidia(share: float) -> Prose:
    """How a high-precision share (percent of the linear layers) compares with NVIDIA's
    (:data:`NVIDIA_HIGH_PRECISION_PERCENT`), and what that means for carrying a result over."""
    if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 <= share <= 100:
        raise ValueError(f"a share is a percentage in [0, 100], got {share!r}")
    ratio = share / NVIDIA_HIGH_PRECISION_PERCENT
    if 2 / 3 <= ratio <= 1.5:
        return Prose("the share here is close to theirs, though the models are not alike")
    size = f"{ratio:.1f} times theirs" if ratio > 1 else f"{1 / ratio:.1f} times smaller than theirs"
    return Prose(f"the share here is {size}, so what keeping the last block does at this size need not carry "
                 "over to their setting")


def high_precision_facts(profile: SizeProfile, recipe: str = "nvfp4") -> dict[str, object]:
    """``hp_kept``, ``hp_total`` and ``hp_share`` (percent): the linear layers of the course GPT at ``profile``
    that ``recipe`` leaves in high precision (:func:`high_precision_share` after
    :func:`~course_lib.mx.convert_to_block_scaled`: the recipe's last blocks and the output head); and
    ``hp_vs_nvidia``, :func:`share_against_nvidia`."""
    if not isinstance(profile, SizeProfile):
        raise TypeError(f"profile must be a SizeProfile, got {type(profile).__name__}")
    model = convert_to_block_scaled(build_gpt(gpt_config_for(profile)), recipe)
    kept, total = high_precision_share(model)
    return {"hp_kept": kept, "hp_total": total, "hp_share": 100 * kept / total,
            "hp_vs_nvidia": share_against_nvidia(100 * kept / total)}
