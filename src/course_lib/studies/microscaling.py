"""Lesson 8's studies: error against block size, scale choices and modes, MX and NVFP4 training over seeds;
and the facts, phrases and tables the lesson glues. The NVFP4 recipe's pieces measured on the gradient are
:mod:`course_lib.studies.microscaling_pieces`."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from ..bench import time_function
from ..formats import all_values
from ..fp8 import QuantizationError, as_2d, block_amax, resolve_block
from ..glue import Prose, and_list, one_sign_odds, power_of_two_text
from ..models import course_setup
from ..mx.blocks import (
    BlockScaling,
    BlockTensor,
    block_error,
    e8m0_exponents,
    element_format,
    element_key,
    pack_fp4,
)
from ..mx.linear import block_recipe, convert_to_block_scaled
from ..tables import MarkdownTable, markdown_table
from ..train import RECIPES, TrainConfig, TrainState, get_recipe, train
from .fp8 import Fp8Training, capture_linear_tensors, seeded_curves, train_converted, with_outlier_channel
from .training_prose import BASELINE, check_training, loss_differences, seed_facts
# the pieces study lives in its own module; lesson 8 reaches its table and facts through this one
from .microscaling_mechanisms import RoundingBias
from .microscaling_pieces import GradientFidelity, gradient_fidelity
from .microscaling_pieces import (
    fidelity_difference_table as fidelity_difference_table,
    fidelity_facts as fidelity_facts,
    fidelity_table as fidelity_table,
)


@dataclass(frozen=True)
class BlockSizeStudy:
    """``errors[element][tensor][block]``: the :class:`QuantizationError` of E8M0-scaled blocks of each size
    (``"tensor"``: one scale for the whole tensor) on each tensor, for each scale mode."""

    elements: tuple[str, ...]
    tensors: tuple[str, ...]
    blocks: tuple[str, ...]
    mode: str
    errors: dict[str, dict[str, dict[str, QuantizationError]]]


def block_size_study(tensors: dict[str, torch.Tensor], *, elements=("e4m3", "e2m1"), blocks=(1, 16, 32, 64, -1),
                     mode: str = "rceil", skip_columns: dict[str, tuple[int, ...]] | None = None) -> BlockSizeStudy:
    """Relative error, saturation and flushing of MX quantisation (E8M0 scales, ``mode``) against the block
    size along the last dimension (``-1``: one scale for the whole tensor). ``skip_columns[name]``: columns
    of that tensor left out of its measures (see :func:`block_error`)."""
    skip_columns = skip_columns or {}
    if not tensors or not elements or not blocks:
        raise ValueError("block_size_study needs tensors, element formats and block sizes")
    labels = tuple("tensor" if b == -1 else str(b) for b in blocks)
    errors: dict[str, dict[str, dict[str, QuantizationError]]] = {}
    for element in elements:
        errors[element] = {}
        for t, x in tensors.items():
            errors[element][t] = {}
            for b, lab in zip(blocks, labels):
                scaling = BlockScaling(element, b, block_rows=-1 if b == -1 else 1, mode=mode)
                errors[element][t][lab] = block_error(x, scaling, label=lab, skip_columns=skip_columns.get(t, ()))
    return BlockSizeStudy(tuple(elements), tuple(tensors), labels, mode, errors)


def nvfp4_scale_choices() -> dict[str, BlockScaling]:
    """The FP4 block-scale choices the lesson compares, by display name."""
    return {
        "MXFP4: 1x32, E8M0 scale": BlockScaling("e2m1", 32, scale_format="e8m0", mode="rceil"),
        "1x16, E8M0 scale": BlockScaling("e2m1", 16, scale_format="e8m0", mode="rceil"),
        "1x16, E4M3 scale, no tensor scale": BlockScaling("e2m1", 16, scale_format="e4m3"),
        "NVFP4: 1x16, E4M3 scale + FP32 tensor scale": BlockScaling("e2m1", 16, scale_format="e4m3",
                                                                    tensor_scale=True),
        "1x16, exact FP32 scale (ideal)": BlockScaling("e2m1", 16, scale_format="fp32"),
    }


@dataclass(frozen=True)
class ModeComparison:
    """FLOOR against RCEIL scale selection on one tensor and element format: per mode the error, share of
    elements saturated and ``top_saturated``, the share of *all* blocks whose largest value the clamp changed
    (it scaled to at least max plus half the top spacing); ``examples``: a few blocks where the two modes
    choose different scales (amax, each mode's exponent and each mode's largest element)."""

    element: str
    block: int
    blocks_differ: float
    errors: dict[str, QuantizationError]
    top_saturated: dict[str, float]
    examples: tuple[dict[str, int | float], ...]   # exponents are ints, magnitudes floats


def compare_scale_modes(x: torch.Tensor, *, element: str = "e2m1", block: int = 32,
                        modes=("floor", "rceil"), n_examples: int = 4) -> ModeComparison:
    """Quantise ``x`` with each E8M0 scale ``mode`` and compare, block by block."""
    if len(modes) < 2:
        raise ValueError("compare_scale_modes needs two modes")
    x2 = as_2d(x, "x").detach().float()
    f = element_format(element)
    amax = block_amax(x2, resolve_block((1, block), tuple(x2.shape)))
    exps = {m: e8m0_exponents(amax, element, m) for m in modes}
    differ = exps[modes[0]] != exps[modes[1]]
    errors, top_sat, largest = {}, {}, {}
    for m in modes:
        scaling = BlockScaling(element, block, scale_format="e8m0", mode=m)
        errors[m] = block_error(x2, scaling, label=m)
        q = scaling.quantize(x2)
        # the element holding each block's amax, as stored (its magnitude)
        top = q.elements.abs().reshape(x2.shape[0], -1, block).amax(-1)
        largest[m] = top
        # the clamp changed the block's largest value: it scaled beyond max plus half the top spacing (below
        # that it rounds to max anyway)
        boundary = f.max_finite + 2.0 ** (f.max_exponent - f.mantissa_bits) / 2
        top_sat[m] = float(((amax / q.scales) >= boundary).float().mean())
    idx = torch.nonzero(differ.reshape(-1)).reshape(-1)[:n_examples]
    examples = []
    for i in idx.tolist():
        row = {"amax": float(amax.reshape(-1)[i])}
        for m in modes:
            row[f"{m} exponent"] = int(exps[m].reshape(-1)[i])
            row[f"{m} largest element"] = float(largest[m].reshape(-1)[i])
            row[f"{m} amax / scale"] = float(amax.reshape(-1)[i] / 2.0 ** int(exps[m].reshape(-1)[i]))
        examples.append(row)
    return ModeComparison(element_key(element), block, float(differ.float().mean()), errors, top_sat,
                          tuple(examples))


def train_block_scaled(recipe: str, profile, device: torch.device | str = "cpu", *, steps: int | None = None,
                       seed: int = 0, lr: float = 3e-3):
    """Train the course GPT with block-scaled linear layers (``recipe``, see :func:`block_recipe`) or with a
    plain precision recipe (see :func:`~course_lib.studies.fp8.train_converted`). Returns the History."""
    return train_converted(recipe, lambda model: convert_to_block_scaled(model, recipe, seed=seed),
                           profile, device, steps=steps, seed=seed, lr=lr)


def block_scaled_training(profile, device: torch.device | str = "cpu", *,
                          recipes=("bf16_autocast", "mxfp8", "mxfp4", "nvfp4"), seeds=(0, 1, 2),
                          steps: int | None = None, lr: float = 3e-3):
    """Loss curves of :func:`train_block_scaled` per recipe and seed, as a
    :class:`course_lib.studies.fp8.Fp8Training` (``block``: NVFP4's 16)."""
    if not recipes or not seeds:
        raise ValueError("block_scaled_training needs at least one recipe and one seed")
    for r in recipes:
        if r not in RECIPES:
            block_recipe(r)
    curves, n_steps = seeded_curves(lambda recipe, seed: train_block_scaled(recipe, profile, device, steps=steps,
                                                                            seed=seed, lr=lr), recipes, seeds)
    return Fp8Training(tuple(recipes), tuple(seeds), n_steps, 16, curves)



@dataclass(frozen=True)
class EmulationCost:
    """What an emulated block-scaled training step costs: per recipe (``baseline`` and ``recipe``), the
    median seconds of one optimizer step of the course model in each round (rounds alternate the two, so a
    change in the machine's load reaches both), and each round's timing quartiles (``q25``, ``q75``)."""

    recipe: str
    baseline: str
    seconds: dict[str, tuple[float, ...]]
    quartiles: dict[str, tuple[tuple[float, float], ...]]

    def round_ratios(self) -> list[float]:
        """Per round, the emulated step's median time over the baseline's (a ratio)."""
        return [e / b for e, b in zip(self.seconds[self.recipe], self.seconds[self.baseline])]

    @property
    def ratio(self) -> float:
        """The median of :meth:`round_ratios` (the upper one of an even count)."""
        ratios = sorted(self.round_ratios())
        return ratios[len(ratios) // 2]

    @property
    def ratio_range(self) -> tuple[float, float]:
        """The lowest and highest single round's ratio: how far the timing moved between rounds."""
        ratios = self.round_ratios()
        return min(ratios), max(ratios)


def emulation_step_ratio(profile, device: torch.device | str = "cpu", *, recipe: str = "nvfp4",
                         baseline: str = "bf16_autocast", rounds: int = 3, budget_s: float = 1.0,
                         seed: int = 0) -> EmulationCost:
    """Time one optimizer step of the course model (:func:`course_lib.train.train`, one step per call, with
    :func:`course_lib.bench.time_function`) with its linear layers block-scaled by ``recipe`` (exact
    emulation, :func:`convert_to_block_scaled`) and under the plain precision recipe ``baseline``, in
    ``rounds`` alternating rounds of about ``budget_s`` seconds each. A benchmark, not a test: on a CPU both
    run on the same cores and the ratio says nothing about a GPU's."""
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if baseline not in RECIPES:
        raise ValueError(f"baseline must be a precision recipe ({', '.join(RECIPES)}), got {baseline!r}")
    block_recipe(recipe)
    device = torch.device(device)
    setup = course_setup(profile, device, steps=None, default_steps=(10**6, 10**6), seed=seed)
    states = {}
    for name in (baseline, recipe):
        model = setup.model(seed)
        if name == recipe:
            convert_to_block_scaled(model, recipe, seed=seed)
        precision = get_recipe(baseline if name == baseline else "fp32", device)
        states[name] = TrainState(model, precision, TrainConfig(steps=setup.steps), device)
    seconds: dict[str, list[float]] = {baseline: [], recipe: []}
    quartiles: dict[str, list[tuple[float, float]]] = {baseline: [], recipe: []}
    for r in range(rounds):
        for name, state in states.items():
            timing = time_function(lambda state=state: train(state, setup.sampler, steps=1), device=device,
                                   warmup=2 if r == 0 else 1, budget_s=budget_s, min_repeats=3)
            seconds[name].append(timing.median)
            quartiles[name].append((timing.q25, timing.q75))
    return EmulationCost(recipe, baseline, {k: tuple(v) for k, v in seconds.items()},
                         {k: tuple(v) for k, v in quartiles.items()})

# how much larger lesson 8's outlier channel is than the activation's own (mx_lesson_tensors)
OUTLIER_FACTOR = 100.0
# the outlier channel of "activation + outlier" is left out of its measures: the other channels are the question
OUTLIER_SKIP: dict[str, tuple[int, ...]] = {"activation + outlier": (0,)}


def mx_lesson_tensors(profile, device: torch.device | str) -> dict[str, torch.Tensor]:
    """The tensors lesson 8 quantises: the course model's ``blocks.0.out`` input activation, weight and
    output gradient after FP32 training, and the activation with its channel 0 made :data:`OUTLIER_FACTOR`
    times larger (an outlier channel; :data:`OUTLIER_SKIP` measures the other channels)."""
    t = capture_linear_tensors(profile, device, layer="blocks.0.out")
    return {"activation": t.activation, "weight": t.weight, "gradient": t.grad_output,
            "activation + outlier": with_outlier_channel(t.activation, factor=OUTLIER_FACTOR)}


def scale_choice_errors(tensors: Mapping[str, torch.Tensor], skip_columns: Mapping[str, tuple[int, ...]] = OUTLIER_SKIP
                        ) -> dict[str, dict[str, QuantizationError]]:
    """``[tensor][choice]``: :func:`~course_lib.mx.block_error` of every :func:`nvfp4_scale_choices` entry."""
    return {t: {name: block_error(x, s, label=name, skip_columns=skip_columns.get(t, ()))
                for name, s in nvfp4_scale_choices().items()} for t, x in tensors.items()}


def scale_mode_comparisons(x: torch.Tensor, elements: Sequence[str] = ("e2m1", "e4m3")) -> dict[str, ModeComparison]:
    """:func:`compare_scale_modes` of ``x`` for each element format."""
    return {el: compare_scale_modes(x, element=el) for el in elements}


@dataclass(frozen=True)
class MxBlockStudy:
    """The registered ``mx_block_study`` on :func:`mx_lesson_tensors` of ``layer``: error against block size,
    the FP4 block-scale choices, FLOOR against RCEIL, and each NVFP4 piece's effect on the gradient."""

    layer: str
    block_sizes: BlockSizeStudy
    scale_choices: dict[str, dict[str, QuantizationError]]
    scale_modes: dict[str, ModeComparison]
    gradient_fidelity: GradientFidelity


def mx_block_study(profile, device: torch.device | str = "cpu") -> MxBlockStudy:
    """Lesson 8's block studies, each as the lesson runs it, on one set of captured tensors."""
    tensors = mx_lesson_tensors(profile, device)
    return MxBlockStudy("blocks.0.out", block_size_study(tensors, skip_columns=OUTLIER_SKIP),
                        scale_choice_errors(tensors), scale_mode_comparisons(tensors["activation"]),
                        gradient_fidelity(profile, device))


# ---- lesson 8's facts, phrases and tables ---------------------------------------------------------------

def mx_formats() -> dict[str, BlockScaling]:
    """The block-scaled formats lesson 8 lists, by display name (NVFP4 with its FP32 tensor scale)."""
    return {"MXFP8 (E4M3)": BlockScaling("e4m3", 32), "MXFP8 (E5M2)": BlockScaling("e5m2", 32),
            "MXFP6 (E2M3)": BlockScaling("e2m3", 32), "MXFP6 (E3M2)": BlockScaling("e3m2", 32),
            "MXFP4 (E2M1)": BlockScaling("e2m1", 32),
            "NVFP4 (E2M1)": BlockScaling("e2m1", 16, scale_format="e4m3", tensor_scale=True)}


def format_table(formats: Mapping[str, BlockScaling] | None = None) -> MarkdownTable:
    """Per format (default :func:`mx_formats`): elements per scale, the scale's format, the largest element,
    the number of non-zero element magnitudes, and the storage in bits per element, scale included."""
    rows = []
    for label, scaling in (formats if formats is not None else mx_formats()).items():
        f = element_format(scaling.element)
        grid = {abs(v) for v in all_values(f).tolist() if math.isfinite(v)}
        bits = scaling.quantize(torch.ones(1, scaling.block)).storage_bits_per_element
        rows.append([label, scaling.block, scaling.scale_format.upper(), f"{f.max_finite:g}", len(grid) - 1,
                     f"{bits:g}"])
    return markdown_table(["format", "elements per scale", "scale", "largest element", "non-zero magnitudes",
                           "bits per element, scale included"], rows)


def nvfp4_bits_per_element() -> float:
    """Bits per element of NVFP4: a 4-bit element plus an 8-bit E4M3 scale per 16 (the FP32 tensor scale
    left out, as negligible)."""
    return BlockScaling("e2m1", 16, scale_format="e4m3").quantize(torch.ones(1, 16)).storage_bits_per_element


def format_facts() -> dict[str, object]:
    """FP4 E2M1's largest and smallest non-zero magnitudes, and NVFP4's bits per element."""
    e2m1 = element_format("e2m1")
    return {"fp4_max": e2m1.max_finite, "fp4_min": e2m1.min_subnormal, "nvfp4_bits": nvfp4_bits_per_element()}


def _percent_errors(errors: Mapping[str, QuantizationError], labels) -> list[str]:
    return [f"{100 * errors[b].relative_error:.1f}%" for b in labels]


def _block_header(block: str) -> str:
    """A block size as a column header: ``"32 elements per scale"``, ``"one scale per tensor"``."""
    return "one scale per tensor" if block == "tensor" else f"{block} element{'' if block == '1' else 's'} per scale"


def percent_texts(*values: float) -> tuple[str, ...]:
    """Percentages (0 to 100) as text, all with the fewest decimals (none to three) at which no value strictly
    between 0 and 100 reads as 0% or 100%: ``(99.73, 98.94)`` reads ``("99.7%", "98.9%")``, not ``100%`` flushed
    beside an error of ``99%``."""
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise TypeError(f"a percentage must be a number, got {type(v).__name__}")
        if not 0 <= v <= 100:
            raise ValueError(f"a percentage must lie in [0, 100], got {v!r}")
    if not values:
        raise ValueError("percent_texts needs at least one value")
    d = next((d for d in range(3) if all(0 < float(f"{v:.{d}f}") < 100 for v in values if 0 < v < 100)), 3)
    return tuple(f"{v:.{d}f}%" for v in values)


def block_size_table(study: BlockSizeStudy, element: str = "e2m1") -> MarkdownTable:
    """Relative error per tensor (rows) and block size (columns) for ``element``."""
    if element not in study.errors:
        raise ValueError(f"the study has no {element!r} elements; it ran {study.elements}")
    return markdown_table([f"tensor ({element.upper()} elements)", *(_block_header(b) for b in study.blocks)],
                          [[t, *_percent_errors(study.errors[element][t], study.blocks)] for t in study.tensors])


def block_size_facts(study: BlockSizeStudy) -> dict[str, object]:
    """Percent relative error and flushed of E2M1 blocks of 1, 32 and the whole tensor on the activation and
    on the outlier activation's other channels; E4M3 blocks of 32 and one scale per tensor; E4M3's binades;
    and the outlier activation's flushed share and error with one scale per tensor as text that agrees
    (``blk_fp4_out_flushed_pct``, ``blk_fp4_out_tensor_pct``: :func:`percent_texts`); whether the E4M3
    panel's two activation lines coincide (``blk_fp8_outlier_lines``, :func:`outlier_lines_phrase`)."""
    fp4, fp8 = study.errors["e2m1"], study.errors["e4m3"]
    act, out = fp4["activation"], fp4["activation + outlier"]
    return {"blk_fp4_32": 100 * act["32"].relative_error, "blk_fp4_tensor": 100 * act["tensor"].relative_error,
            "blk_fp4_out_32": 100 * out["32"].relative_error,
            "blk_fp4_out_tensor": 100 * out["tensor"].relative_error,
            "blk_fp4_out_flushed": 100 * out["tensor"].flushed, "blk_fp4_out_flushed32": 100 * out["32"].flushed,
            "blk_fp8_32": 100 * fp8["activation"]["32"].relative_error,
            "blk_fp4_flushed32": 100 * act["32"].flushed, "blk_fp4_1": 100 * act["1"].relative_error,
            "e4m3_binades": element_format("e4m3").binades,
            # the span a clamped block scale has: from E4M3's smallest normal value to its largest
            "e4m3_normal_binades": math.log2(element_format("e4m3").max_finite / element_format("e4m3").min_normal),
            "blk_fp8_out_tensor": 100 * fp8["activation + outlier"]["tensor"].relative_error,
            "blk_sizes": block_sizes_phrase(study), **_flatness("blk_fp8", fp8),
            "blk_fp8_outlier_lines": outlier_lines_phrase(fp8["activation"], fp8["activation + outlier"]),
            **dict(zip(("blk_fp4_out_flushed_pct", "blk_fp4_out_tensor_pct"),
                       map(Prose, percent_texts(100 * out["tensor"].flushed, 100 * out["tensor"].relative_error))))}


def outlier_lines_phrase(plain: Mapping[str, QuantizationError], outlier: Mapping[str, QuantizationError]) -> Prose:
    """For the figure's caption: whether the activation's line and the outlier activation's (its other
    channels) coincide at every block size at the precision the table and axis show (two decimals of a
    percent), and why they can; where they coincide but the outlier's scale flushed more of the other
    channels' values to zero, how many, at most."""
    if set(plain) != set(outlier) or not plain:
        raise ValueError(f"both lines need the same block sizes, got {sorted(plain)} and {sorted(outlier)}")
    shown = all(f"{100 * plain[b].relative_error:.2f}" == f"{100 * outlier[b].relative_error:.2f}" for b in plain)
    if not shown:
        return Prose("In the E4M3 panel the dashed line and the solid activation line differ: the outlier's larger "
                     "scale pushes some of the other channels' values below E4M3's normal range.")
    grid = "In the E4M3 panel the dashed line lies on the solid activation line at every block size (to two " \
           "decimals of a percent): a power-of-two scale only shifts E4M3's grid"
    more = max(plain, key=lambda b: outlier[b].flushed - plain[b].flushed)   # where it flushed the most extra
    if outlier[more].flushed <= plain[more].flushed:
        return Prose(f"{grid}, and the outlier's larger scale pushes none of the other channels' values below "
                     "E4M3's range, so they round as they did without it.")
    a, b = percent_texts(100 * outlier[more].flushed, 100 * plain[more].flushed)
    return Prose(f"{grid}; the outlier's larger scale flushes a few more of the other channels' values to zero "
                 f"(at most {a} of them, with {'one scale per tensor' if more == 'tensor' else more + ' elements per scale'}, "
                 f"against {b} without it), too few to move the error at that precision.")


def block_sizes_phrase(study: BlockSizeStudy) -> Prose:
    """The block sizes a study ran, in words: ``1, 16, 32 and 64 elements per scale, and one scale per
    tensor``."""
    sizes = [b for b in study.blocks if b != "tensor"]
    whole = "tensor" in study.blocks
    if not sizes:
        return Prose("one scale per tensor only")
    return Prose(f"{and_list(sizes)} element{'' if sizes == ['1'] else 's'} per scale"
                 + (", and one scale per tensor" if whole else ""))


def _flatness(prefix: str, errors: Mapping[str, Mapping[str, QuantizationError]]) -> dict[str, object]:
    """The lowest and highest relative error (%) over every tensor and block size, and the most one tensor's
    error moves across block sizes (% of its smallest): how flat each line of the block-size figure is."""
    per_tensor = [[e.relative_error for e in by_block.values()] for by_block in errors.values()]
    if not per_tensor or not all(per_tensor):
        raise ValueError("no errors to compare")
    flat = max(100 * (max(v) / min(v) - 1) for v in per_tensor)
    verdict = ("the block size does not matter, the error is the element format's own rounding, and the lines "
               "differ only by tensor" if flat <= 5 else "the block size matters even with these elements")
    move = ("does not move (to within 0.01% of itself)" if flat < 0.01 else
            f"moves by at most {flat:.2f}% of itself")
    return {f"{prefix}_lo": 100 * min(min(v) for v in per_tensor), f"{prefix}_hi": 100 * max(max(v) for v in per_tensor),
            f"{prefix}_flat": flat, f"{prefix}_move": Prose(move), f"{prefix}_verdict": Prose(verdict)}


def scale_choice_table(errors: Mapping[str, Mapping[str, QuantizationError]]) -> MarkdownTable:
    """``errors[tensor][choice]``: one row per scale choice, the relative error on each tensor, and the
    share flushed to zero where it is more than half."""
    tensors = list(errors)
    if not tensors:
        raise ValueError("scale_choice_table needs at least one tensor")

    def cell(e: QuantizationError) -> str:
        return f"{100 * e.relative_error:.1f}%" + (f" ({100 * e.flushed:.0f}% flushed)" if e.flushed > 0.5 else "")

    return markdown_table(["scale", *tensors], [[name, *(cell(errors[t][name]) for t in tensors)]
                                                for name in errors[tensors[0]]])


def scale_choice_facts(errors: Mapping[str, Mapping[str, QuantizationError]],
                       gradient: torch.Tensor) -> dict[str, object]:
    """Percent error on the weight of each of :func:`nvfp4_scale_choices` but the one without tensor scale,
    which is measured on the gradient (percent flushed), beside NVFP4's on the gradient; and the gradient's
    median magnitude."""
    mx32, e8m0_16, no_tensor_scale, nvfp4, ideal = nvfp4_scale_choices()
    weight, grad = errors["weight"], errors["gradient"]
    return {"sc_mx32": 100 * weight[mx32].relative_error, "sc_e8m0_16": 100 * weight[e8m0_16].relative_error,
            "sc_nvfp4": 100 * weight[nvfp4].relative_error, "sc_ideal": 100 * weight[ideal].relative_error,
            "sc_noglobal_grad": 100 * grad[no_tensor_scale].flushed,
            "sc_nvfp4_grad": 100 * grad[nvfp4].relative_error, "grad_median": float(gradient.abs().median())}


def mode_examples_table(comparison: ModeComparison) -> MarkdownTable:
    """The example blocks of a FLOOR/RCEIL comparison: amax, and per mode the scale, amax over it and the
    stored largest element."""
    return markdown_table(
        ["block amax", "FLOOR scale", "amax / scale", "stored largest", "RCEIL scale", "amax / scale",
         "stored largest"],
        [[f"{r['amax']:.4g}", *(v for m in ("floor", "rceil") for v in (
            power_of_two_text(int(r[f'{m} exponent'])), f"{r[f'{m} amax / scale']:.3g}", f"{r[f'{m} largest element']:g}"))]
         for r in comparison.examples])


def mode_summary_table(modes: Mapping[str, ModeComparison]) -> MarkdownTable:
    """Per element format and mode: the share of blocks where the modes differ, the relative error over the
    whole tensor (every block, not only those where the modes differ), and the share of blocks whose largest
    value the clamp changes."""
    return markdown_table(
        ["elements", "blocks where the modes differ", "mode", "relative error (whole tensor)",
         "blocks whose largest value the clamp changes"],
        [[el.upper(), f"{100 * c.blocks_differ:.0f}%", m.upper(), f"{100 * c.errors[m].relative_error:.2f}%",
          f"{100 * c.top_saturated[m]:.0f}%"] for el, c in modes.items() for m in ("floor", "rceil")])


def lower_error_mode(comparison: ModeComparison) -> str:
    """"FLOOR" when FLOOR's relative error is the lower, else "RCEIL"."""
    floor, rceil = comparison.errors["floor"].relative_error, comparison.errors["rceil"].relative_error
    return "FLOOR" if floor < rceil else "RCEIL"


def mode_verdict(modes: Mapping[str, ModeComparison]) -> Prose:
    """Which rule has the lower error with E2M1 and with E4M3 elements, and whether one wins both."""
    fp4, fp8 = lower_error_mode(modes["e2m1"]), lower_error_mode(modes["e4m3"])
    return Prose(f"With E2M1 elements the lower error is {fp4}'s, with E4M3 elements {fp8}'s"
                 + (": neither rule wins everywhere." if fp4 != fp8 else "."))


def mode_facts(modes: Mapping[str, ModeComparison]) -> dict[str, object]:
    """Percent of E2M1 blocks where FLOOR and RCEIL differ; per element format the percent of blocks FLOOR
    saturates and each mode's relative error (percent); and :func:`mode_verdict`."""
    fp4, fp8 = modes["e2m1"], modes["e4m3"]
    return {"mode_differ_fp4": 100 * fp4.blocks_differ, "mode_sat_fp4": 100 * fp4.top_saturated["floor"],
            "mode_err_floor": 100 * fp4.errors["floor"].relative_error,
            "mode_err_rceil": 100 * fp4.errors["rceil"].relative_error,
            "mode_sat_fp8": 100 * fp8.top_saturated["floor"], "mode_verdict": mode_verdict(modes),
            "mode_err_fp8_floor": 100 * fp8.errors["floor"].relative_error,
            "mode_err_fp8_rceil": 100 * fp8.errors["rceil"].relative_error}


def same_bytes(ours: BlockTensor, scale: torch.Tensor, data: torch.Tensor) -> bool:
    """Whether another implementation's ``scale`` codes and packed FP4 ``data`` (two elements per byte) are
    byte for byte those of ``ours``."""
    return (torch.equal(scale.view(torch.uint8), ours.scale_codes().view(torch.uint8))
            and torch.equal(data.view(torch.uint8), pack_fp4(ours.element_codes()).view(torch.uint8)))


def same_side_sentence(consistent: Sequence[str]) -> Prose:
    """Which recipes ended on the same side of BF16 in every seed."""
    return Prose(and_list([f"`{r}`" for r in consistent]) + " ended on the same side of BF16 in every seed."
                 if consistent else "No recipe ended on the same side of BF16 in every seed.")


def nvfp4_against_mxfp4(differences: Sequence[float]) -> Prose:
    """NVFP4's final loss minus MXFP4's per seed, and whether the full recipe paid for itself."""
    if not differences:
        raise ValueError("nvfp4_against_mxfp4 needs at least one seed")
    n = len(differences)

    def chance(pays: str) -> str:   # one sign over n seeds, by chance alone
        return (f", one sign in all {n} seeds, which chance alone gives one time in {one_sign_odds(n)} (either sign "
                f"counted): at this size, weak evidence that the recipe {pays} for itself in the loss." if n > 1 else
                ": one seed, which cannot say whether the recipe pays for itself.")
    verdict = (": worse in every seed" + chance("does not pay") if min(differences) > 0 else
               ": better in every seed" + chance("pays") if max(differences) < 0 else ", no consistent difference.")
    return Prose(f"NVFP4, with every piece of its recipe, ended {', '.join(f'{d:+.3f}' for d in differences)} "
                 "against MXFP4 (same seeds)" + verdict)


def widest_step_gap(result: Fp8Training, baseline: str = BASELINE) -> tuple[float, str, int, int]:
    """Where a recipe's loss rose furthest above ``baseline``'s from the same seed at the same step:
    ``(gap, recipe, seed index, step)``, steps counted from 0; the first such place in recipe, seed and step
    order."""
    if baseline not in check_training(result).recipes:
        raise ValueError(f"no {baseline!r} run to compare with; recipes: {', '.join(result.recipes)}")
    gaps = [(a - b, r, i, t) for r in result.recipes if r != baseline for i in range(len(result.seeds))
            for t, (a, b) in enumerate(zip(result.curves[r][i], result.curves[baseline][i]))]
    if not gaps:
        raise ValueError(f"no recipe ran beside {baseline!r}")
    return max(gaps, key=lambda g: g[0])


def largest_step_gap(result: Fp8Training, baseline: str = BASELINE) -> Prose:
    """The place of :func:`widest_step_gap` (a spike the loss curves show; steps counted from 0, as the
    figure's axis; the same batch, since every run of a seed draws the same batches), the other recipes' gaps
    at that seed and step, and where that run's final loss ended against the baseline's.
    :mod:`course_lib.studies.microscaling_replay` looks for what made the jump."""
    gap, recipe, i, t = widest_step_gap(result, baseline)
    end = result.final(recipe)[i] - result.final(baseline)[i]
    others = [f"`{r}` {result.curves[r][i][t] - result.curves[baseline][i][t]:+.3f}" for r in result.recipes
              if r not in (recipe, baseline)]
    beside = f" At that step the other recipes from that seed were at {and_list(others)}." if others else ""
    return Prose(f"The widest gap at any one step: `{recipe}`, seed {result.seeds[i]}, at step {t}, "
                 f"{gap:+.3f} against BF16's loss from the same seed at that step, on the same batch (every run of "
                 f"a seed starts from the same weights and draws the same batches in the same order).{beside} That "
                 f"run ended {end:+.3f} from BF16's final loss.")


def block_scaled_training_facts(result: Fp8Training) -> dict[str, object]:
    """Steps; the spread of BF16's final loss over seeds; the range of every block-scaled recipe's per-seed
    gap to BF16; which recipes kept one side; NVFP4 against MXFP4; the widest gap at any one step."""
    diffs = loss_differences(result)
    bf16 = result.final(BASELINE)
    others = [r for r in result.recipes if r != BASELINE]
    if not others:
        raise ValueError(f"no block-scaled recipe ran beside {BASELINE!r}")
    consistent = [r for r in others if min(diffs[r]) > 0 or max(diffs[r]) < 0]
    return {"train_steps": result.steps, "train_seed_spread": max(bf16) - min(bf16),
            "train_lo": min(min(diffs[r]) for r in others), "train_hi": max(max(diffs[r]) for r in others),
            "train_consistent": same_side_sentence(consistent),
            "train_nvfp4_vs_mxfp4": nvfp4_against_mxfp4(
                [a - b for a, b in zip(result.final("nvfp4"), result.final("mxfp4"))]),
            "train_step_gap": largest_step_gap(result), **seed_facts(result)}


def emulation_note(capability: tuple[int, int] | None) -> Prose:
    """Where this page's block-scaled products ran: a GPU of compute ``capability``, or (None) a CPU."""
    if capability is None:
        return Prose("This page ran on a CPU: every block-scaled product above was emulated, its elements and "
                     "scales exactly, its sums in FP32.")
    major, minor = capability
    return Prose(f"This page ran on a GPU of compute capability {major}.{minor}; its products here were "
                 "emulated in FP32 either way.")


def mx_errata_rows(modes: ModeComparison, scale_errors: Mapping[str, Mapping[str, QuantizationError]],
                   fidelity: GradientFidelity, *, bias: RoundingBias,
                   torchao_agrees: bool) -> list[tuple[str, str]]:
    """Lesson 8's errata, (claim, what was measured) pairs, from the FLOOR/RCEIL comparison on the
    activation's FP4 blocks (``modes``), the scale choices' errors (``scale_errors[tensor][choice]``), the
    gradient fidelity study, the rounding-bias measurement on one tensor (``bias``), and whether the course's
    quantisation agreed with torchao's."""
    _, e8m0_16, no_tensor_scale, nvfp4, _ = nvfp4_scale_choices()
    rceil = modes.top_saturated["rceil"]
    averaged = fidelity.mean_averaged("nvfp4")
    sr_one, nearest_one = fidelity.mean_error("nvfp4"), fidelity.mean_error("nvfp4_no_sr")
    return [
        ("MX scales are chosen so that nothing overflows.",
         f"Under the spec's rule (FLOOR), the clamp to E2M1's largest value changes the largest value of "
         f"{100 * modes.top_saturated['floor']:.0f}% of this activation's FP4 blocks; under RCEIL, NVIDIA's rule, "
         + ("of none" if rceil == 0 else f"of {100 * rceil:.0f}%") + " {cite:p}`ocp2023mx,torchao_mx`."),
        ("NVFP4 is MXFP4 with smaller blocks.",
         f"The scale differs too: E4M3 rather than a power of two, under an FP32 tensor scale. Without the tensor "
         f"scale, {100 * scale_errors['gradient'][no_tensor_scale].flushed:.0f}% of the course model's gradient "
         f"flushes to zero; with it, the weight's error is {100 * scale_errors['weight'][nvfp4].relative_error:.1f}% "
         f"against {100 * scale_errors['weight'][e8m0_16].relative_error:.1f}% for E8M0 scales on the same "
         "16-element blocks."),
        ("Stochastic rounding makes each gradient more accurate.",
         ("Not each" if sr_one >= nearest_one else "Here it did, on average") + f": a single NVFP4 gradient was "
         f"{100 * sr_one:.1f}% off with it and {100 * nearest_one:.1f}% without, and the mean of "
         f"{fidelity.ks[-1]} draws {100 * averaged[-1]:.1f}%. What it reduces is bias, measured on one tensor: "
         f"the mean of {bias.ks[-1]} stochastically rounded copies of the gradient is "
         f"{100 * bias.stochastic[-1]:.1f}% off, where rounding to nearest stays {100 * bias.nearest:.1f}% off "
         "however often it is repeated."),
        ("FP4 training needs Blackwell.",
         "FP4 *speed* does; FP4 numerics run anywhere, as here: the elements and scales exactly, the sums in "
         "FP32, which a block-scaled tensor core is not documented to match. The course's emulation "
         + ("agrees with torchao's reference quantisation bit for bit." if torchao_agrees else
            "did not agree with torchao's reference quantisation on this page's check.")),
    ]


def outlier_ratio(tensors: Mapping[str, torch.Tensor]) -> float:
    """The largest magnitude of ``tensors["activation + outlier"]`` over that of ``tensors["activation"]``:
    how many times larger than the activation's own largest value the outlier channel's block scale is set."""
    missing = {"activation", "activation + outlier"} - set(tensors)
    if missing:
        raise ValueError(f"outlier_ratio needs the tensors {sorted(missing)}")
    plain = float(tensors["activation"].abs().max())
    if plain == 0:
        raise ValueError("the activation is all zeros")
    return float(tensors["activation + outlier"].abs().max()) / plain


def exercise_facts() -> dict[str, object]:
    """The exercises' answers: the E8M0 scale, the values over the scale, the E2M1 elements stored and the
    values represented, of an MXFP4 block of 0.9, -2.6, 0.1, 1.7 (and 28 zeros) with RCEIL and with FLOOR;
    MXFP8's bits per element, and NVFP4's with the training recipe's 16 x 16 weight blocks (one scale per 256 weights); NVFP4's (1 x 16 blocks) saving over BF16 and the
    gigabytes of a 7-billion-parameter model's weights in BF16 and in NVFP4 (1 x 16 and 16 x 16 blocks)."""
    block = torch.tensor([[0.9, -2.6, 0.1, 1.7] + [0.0] * 28])
    facts: dict[str, object] = {}
    for mode in ("rceil", "floor"):
        q = BlockScaling("e2m1", 32, mode=mode).quantize(block)
        facts[f"ex_{mode}_scale"] = float(q.block_scales[0, 0])
        facts[f"ex_{mode}_over"] = ", ".join(f"{v:.3g}" for v in (block[0, :4] / q.block_scales[0, 0]).tolist())
        facts[f"ex_{mode}_elements"] = ", ".join(f"{v:g}" for v in q.elements[0, :4].tolist())
        facts[f"ex_{mode}_values"] = ", ".join(f"{v:g}" for v in q.dequantize()[0, :4].tolist())
    nvfp4_bits = nvfp4_bits_per_element()
    square = BlockScaling("e2m1", 16, block_rows=16, scale_format="e4m3").quantize(torch.ones(16, 16))
    facts.update({"ex_bits_mxfp8": BlockScaling("e4m3", 32).quantize(torch.ones(1, 32)).storage_bits_per_element,
                  "ex_bits_nvfp4_16x16": square.storage_bits_per_element,
                  "ex_saving": 16 / nvfp4_bits, "ex_bf16_gb": 7e9 * 2 / 1e9, "ex_nvfp4_gb": 7e9 * nvfp4_bits / 8 / 1e9,
                  "ex_nvfp4_16x16_gb": 7e9 * square.storage_bits_per_element / 8 / 1e9})
    return facts
