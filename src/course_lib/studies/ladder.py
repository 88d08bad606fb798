"""Lesson 6's model ladder (``scale_ladder``): where mixed precision starts to pay as the model grows.

The course model at its small and full sizes and GPT-2 small, medium and large shapes, each trained for a
few timed steps per precision recipe (FP32 with TF32 off, TF32, BF16 and FP16 autocast, FP8 through
torchao's tensorwise and rowwise recipes), eager and ``torch.compile``d, on random token ids (speed, not
learning). Beside every measurement, and for every rung that does not run here, the FLOP, byte and roofline
models predict step time, tokens/s, MFU and memory for a named device: a GPU's datasheet, or this CPU's
measured matmul throughput and copy bandwidth. Predicted and measured values live in separate fields.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..bench.matmul import capability_probe, measure_copy_bandwidth
from ..bench.roofline import gpt_matmul_parameters, model_flops_per_token, roofline_step_seconds
from ..bench.timing import make_timer, time_function
from ..device import SizeProfile, describe_hardware, peak_allocated_bytes
from ..fp8 import predict_fp8_linear, torchao_float8
from ..glue import ratio_text
from ..hardware import (
    DATASHEET_PEAKS,
    find_gpu_peaks,
    format_unsupported_reason,
    scaled_mm_unsupported_reason,
    tf32_matmuls,
)
from ..memory import activation_bytes, autocast_weight_copy_bytes, estimate_training_memory
from ..models import GPTConfig, TinyGPT, build_gpt, count_parameters, gpt_config_for
from ..train import TrainConfig, TrainState, get_recipe, recipe_autocast

GPT2_VOCAB = 50304   # GPT-2's 50,257 tokens padded to a multiple of 64

# name -> (shape, sequences per step); GPT-2 shapes tie the head to the embedding, as GPT-2 does
RUNGS: dict[str, tuple[GPTConfig, int]] = {
    "course_small": (gpt_config_for(SizeProfile("small")), 16),
    "course_full": (gpt_config_for(SizeProfile("full")), 64),
    "gpt2_small": (GPTConfig(d_model=768, n_layers=12, n_heads=12, context=1024, vocab_size=GPT2_VOCAB,
                             tied_head=True), 8),
    "gpt2_medium": (GPTConfig(d_model=1024, n_layers=24, n_heads=16, context=1024, vocab_size=GPT2_VOCAB,
                              tied_head=True), 8),
    "gpt2_large": (GPTConfig(d_model=1280, n_layers=36, n_heads=20, context=1024, vocab_size=GPT2_VOCAB,
                             tied_head=True), 8),
}

LADDER_RECIPES = ("fp32", "tf32", "bf16_autocast", "fp16_autocast_scaler", "fp8_tensorwise", "fp8_rowwise")
_FP8_RECIPES = {"fp8_tensorwise": "tensorwise", "fp8_rowwise": "rowwise"}
# the matmul dtype of each recipe's projections and of its other products, and its bytes per activation
_RECIPE_DTYPES = {"fp32": ("fp32", "fp32", 4), "tf32": ("tf32", "tf32", 4), "bf16_autocast": ("bf16", "bf16", 2),
                  "fp16_autocast_scaler": ("fp16", "fp16", 2), "fp8_tensorwise": ("fp8", "bf16", 2),
                  "fp8_rowwise": ("fp8", "bf16", 2)}


def recipe_element_bytes(recipe: str) -> int:
    """Bytes per activation element the roofline counts for ``recipe`` (:data:`LADDER_RECIPES`): 4 for FP32 and
    TF32, 2 for the 16-bit and FP8 recipes. Every activation is counted at that width, as pure 16-bit storage
    has them; autocast keeps layer norm, softmax and the loss in FP32, so its real bytes are a little more and
    the prediction is its ceiling."""
    if recipe not in _RECIPE_DTYPES:
        raise ValueError(f"recipe must be one of {list(_RECIPE_DTYPES)}, got {recipe!r}")
    return _RECIPE_DTYPES[recipe][2]


def _check_names(names: Sequence[str], known: Sequence[str], what: str) -> None:
    if isinstance(names, str):
        raise TypeError(f"{what} is a sequence of names, not one string")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {', '.join(known)}")


def rung_config(rung: str, *, sdpa: bool = False) -> GPTConfig:
    """The model shape of ``rung`` (a key of :data:`RUNGS`), with fused attention when ``sdpa``."""
    _check_names([rung], list(RUNGS), "rung")
    return dataclasses.replace(RUNGS[rung][0], attention="sdpa" if sdpa else "explicit")


def base_recipe(recipe: str) -> str:
    """The course recipe (``train.RECIPES``) a ladder recipe trains with: FP8 recipes run their remaining
    products under BF16 autocast."""
    _check_names([recipe], LADDER_RECIPES, "recipe")
    return "bf16_autocast" if recipe in _FP8_RECIPES else recipe


def recipe_unsupported_reason(recipe: str, device: torch.device | str) -> str | None:
    """Why ``device`` does not run ladder ``recipe``, or None. FP8 needs BF16, ``torch._scaled_mm`` (with row
    scales for rowwise), torchao, and an FP8 product measured faster than BF16's here: where it is slower it
    is emulated, and its time says nothing about FP8 hardware."""
    device = torch.device(device)
    why = get_recipe(base_recipe(recipe)).unsupported_reason(device)
    if why or recipe not in _FP8_RECIPES:
        return why
    why = format_unsupported_reason("fp8", device) or scaled_mm_unsupported_reason(
        device, row_scales=recipe == "fp8_rowwise")
    if why:
        return why
    # Emulated FP8 computes in a wider format, so it cannot beat that format's product; beating BF16 alone is
    # not enough (a CPU whose BF16 product is itself emulated runs FP8 through FP32 faster than BF16).
    probe = capability_probe(device)
    fp8 = probe.tflops.get("fp8")
    wider = [] if fp8 is None else [d for d in ("bf16", "fp32") if (t := probe.tflops.get(d)) is not None and fp8 < t]
    if fp8 is not None and wider:
        d = max(wider, key=probe.tflops.__getitem__)
        return (f"FP8 products measured {ratio_text(fp8 / probe.tflops[d])} times {d.upper()}'s throughput here "
                f"(n={probe.n}): emulated, so their time says nothing about FP8 hardware")
    try:
        float8_converter(recipe)
    except ImportError as exc:  # torchao is optional on a GPU image
        return str(exc)
    return None


def float8_converter(recipe: str):
    """A function converting a model's linear layers (the output head excepted, as torchao's users and the
    course's FP8 lessons leave it) to torchao's ``Float8Linear`` with the FP8 ladder ``recipe``'s scaling;
    ImportError where torchao does not import (:func:`course_lib.fp8.torchao_float8`)."""
    _check_names([recipe], list(_FP8_RECIPES), "FP8 recipe")
    return torchao_float8(_FP8_RECIPES[recipe], skip=("head",))


def random_batches(vocab_size: int, batch: int, seq_len: int, device: torch.device | str, *, seed: int = 0,
                   count: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of random token ids ``[batch, seq_len]`` (inputs and next-token targets) drawn on
    ``device`` by a seeded generator: what timing needs, without a corpus."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(count):
        ids = torch.randint(vocab_size, (batch, seq_len + 1), generator=gen, device=device)
        out.append((ids[:, :-1], ids[:, 1:]))
    return out


# ---- results ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RungFacts:
    """A rung's shape, its trainable parameters counted from the built module (``n_params``), its matmul
    weights and training FLOPs per token (the FLOP model), and the sequences per step it runs at."""

    name: str
    d_model: int
    n_layers: int
    n_heads: int
    context: int
    vocab_size: int
    tied_head: bool
    attention: str
    batch_size: int
    n_params: int
    matmul_params: int
    flops_per_token: float

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.context


@dataclass(frozen=True)
class LadderRun:
    """One measured (rung, recipe, eager or compiled): the timed steps (seconds), the first call's time
    (compilation included when compiled) and, on a GPU, the allocator's peak over the run (bytes)."""

    rung: str
    recipe: str
    compiled: bool
    step_seconds: tuple[float, ...]
    first_call_seconds: float
    peak_memory_bytes: int | None = None

    @property
    def median_step_seconds(self) -> float:
        return statistics.median(self.step_seconds)

    @property
    def step_quartiles(self) -> tuple[float, float]:
        q = statistics.quantiles(self.step_seconds, n=4) if len(self.step_seconds) > 1 else [self.step_seconds[0]] * 3
        return q[0], q[2]

    @property
    def compile_seconds(self) -> float | None:
        """First compiled call minus a steady step; None for an eager run."""
        return self.first_call_seconds - self.median_step_seconds if self.compiled else None


@dataclass(frozen=True)
class LadderSkip:
    """A (rung, recipe, compiled) that did not run, and why."""

    rung: str
    recipe: str
    compiled: bool
    reason: str


@dataclass(frozen=True)
class LadderPrediction:
    """The models' prediction for one (rung, recipe) on a named device: the roofline's step time (a lower
    bound: no launch overhead), tokens/s and MFU from it, and the byte model's training memory (persistent
    state, activations and autocast's weight copies)."""

    device: str
    rung: str
    recipe: str
    step_seconds: float
    tokens_per_second: float
    mfu: float
    memory_bytes: float


@dataclass(frozen=True)
class ScaleLadder:
    """The registered ``scale_ladder``: rungs, measured runs and skips on ``device_name``, and the models'
    predictions. MFU divides by one reference peak (``reference_tflops``, from ``reference_source``)."""

    device: str
    device_name: str
    rungs: tuple[RungFacts, ...]
    runs: tuple[LadderRun, ...]
    skipped: tuple[LadderSkip, ...]
    reference_tflops: float
    reference_source: str
    predictions: tuple[LadderPrediction, ...]
    own_prediction_device: str = ""   # the device of ``predictions`` that is the measuring one ("": none)

    def rung(self, name: str) -> RungFacts:
        for r in self.rungs:
            if r.name == name:
                return r
        raise ValueError(f"no rung {name!r} in this ladder; it has {', '.join(r.name for r in self.rungs)}")

    def tokens_per_second(self, run: LadderRun) -> float:
        return self.rung(run.rung).tokens_per_step / run.median_step_seconds

    def mfu(self, run: LadderRun) -> float:
        """Achieved model FLOP/s over the one reference peak."""
        return self.tokens_per_second(run) * self.rung(run.rung).flops_per_token / (self.reference_tflops * 1e12)

    def measured_rungs(self) -> list[str]:
        return [r.name for r in self.rungs if any(run.rung == r.name for run in self.runs)]

    def run_of(self, rung: str, recipe: str, compiled: bool = False) -> LadderRun | None:
        return next((r for r in self.runs if (r.rung, r.recipe, r.compiled) == (rung, recipe, compiled)), None)

    def prediction(self, device: str, rung: str, recipe: str) -> LadderPrediction | None:
        return next((p for p in self.predictions if (p.device, p.rung, p.recipe) == (device, rung, recipe)), None)

    def predicted_devices(self) -> list[str]:
        return list(dict.fromkeys(p.device for p in self.predictions))


# ---- the models' predictions -----------------------------------------------------------------------------

def rung_facts(rung: str, *, sdpa: bool = False, batch_size: int | None = None) -> RungFacts:
    """:class:`RungFacts` of ``rung``; the parameters are counted on a module built on the meta device (no
    memory), the FLOPs per token from :func:`~course_lib.bench.roofline.gpt_matmul_parameters`."""
    cfg = rung_config(rung, sdpa=sdpa)
    b = RUNGS[rung][1] if batch_size is None else batch_size
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise ValueError(f"batch_size must be a positive int, got {b!r}")
    with torch.device("meta"):
        n_params = count_parameters(TinyGPT(cfg))[0]
    matmul = gpt_matmul_parameters(cfg.d_model, cfg.n_layers, cfg.vocab_size, cfg.mlp_ratio)
    return RungFacts(rung, cfg.d_model, cfg.n_layers, cfg.n_heads, cfg.context, cfg.vocab_size, cfg.tied_head,
                     cfg.attention, b, n_params, matmul,
                     model_flops_per_token(matmul, cfg.n_layers, cfg.d_model, cfg.context))


def predicted_memory_bytes(rung: RungFacts, recipe: str, device_type: str = "cuda") -> float:
    """The byte model's training memory of ``rung`` with ``recipe``: persistent state with AdamW
    (:func:`~course_lib.memory.estimate_training_memory`), activations
    (:func:`~course_lib.memory.activation_bytes`) and, under autocast, the 16-bit weight copies. FP8 recipes
    are counted as BF16 autocast (torchao's saved FP8 copies are smaller: an upper bound)."""
    base = base_recipe(recipe)
    autocast = 2 if get_recipe(base).autocast_dtype is not None else None
    shape = dict(d_model=rung.d_model, n_layers=rung.n_layers, vocab_size=rung.vocab_size)
    acts = activation_bytes(batch=rung.batch_size, seq_len=rung.context, n_heads=rung.n_heads, attention=rung.attention,
                            autocast_bytes=autocast, device_type=device_type, **shape)
    copies = autocast_weight_copy_bytes(**shape) if autocast else 0
    return estimate_training_memory(rung.n_params, base)["total"] + acts + copies


def predict(rung: RungFacts, recipe: str, device: str, *, tflops: dict[str, float | None], bandwidth_gbs: float,
            reference_tflops: float, device_type: str = "cuda") -> LadderPrediction | None:
    """The roofline's step for ``rung`` and ``recipe`` on ``device`` with matmul throughput ``tflops`` per
    dtype (TFLOP/s; a datasheet's or measured) and ``bandwidth_gbs``; None where a dtype the recipe needs
    has no throughput there (TF32 on a CPU)."""
    linear, other, e = _RECIPE_DTYPES[recipe]
    linear_peak, other_peak = tflops.get(linear), tflops.get(other)
    if not linear_peak or not other_peak:
        return None
    step = roofline_step_seconds(rung.d_model, rung.n_heads, rung.n_layers, rung.context, rung.batch_size,
                                 rung.vocab_size, n_params=rung.n_params, matmul_tflops=other_peak,
                                 linear_tflops=linear_peak, bandwidth_gbs=bandwidth_gbs, bytes_per_element=e,
                                 attention=rung.attention)
    if recipe in _FP8_RECIPES:
        step += fp8_cast_seconds(rung, _FP8_RECIPES[recipe], bf16_tflops=other_peak, fp8_tflops=linear_peak,
                                 bandwidth_gbs=bandwidth_gbs)
    rate = rung.tokens_per_step / step
    return LadderPrediction(device, rung.name, recipe, step, rate, rate * rung.flops_per_token / (reference_tflops * 1e12),
                            predicted_memory_bytes(rung, recipe, device_type))


def fp8_cast_seconds(rung: RungFacts, recipe: str, *, bf16_tflops: float, fp8_tflops: float,
                     bandwidth_gbs: float) -> float:
    """Seconds a training step spends casting to FP8 around the linear layers that torchao converts (every
    block's four; the head stays BF16): input, weight and gradient casts of forward and backward, from
    lesson 7's model (:func:`course_lib.fp8.predict_fp8_linear`, torchao's float8 roofline; ``recipe``:
    "tensorwise" or "rowwise"). Bytes only: like the rest of the ladder's roofline it leaves out torchao's
    least time per kernel launch, so every recipe's prediction is a bound of the same kind."""
    m, d = rung.tokens_per_step, rung.d_model
    layer = sum(predict_fp8_linear(m, k, n, bf16_tflops=bf16_tflops, fp8_tflops=fp8_tflops,
                                   bandwidth_gbs=bandwidth_gbs, recipe=recipe, launch_seconds=0.0).fp8_cast_s
                for k, n in ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)))
    return rung.n_layers * layer


def reference_peak(device: torch.device | str) -> tuple[float, str]:
    """The one peak MFU divides by (TFLOP/s) and where it comes from: a GPU's dense BF16 datasheet peak;
    on a CPU (no datasheet) the fastest dtype's throughput in the capability probe, whose products are small:
    larger ones can run faster there, so the source says that such an MFU is a share of that rate, not of a
    peak."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_properties(device).name
        entry = find_gpu_peaks(name)
        peak = entry.peak("bf16") if entry else None
        if entry is None or peak is None:
            raise ValueError(f"no datasheet BF16 peak for {name}; add it to hardware.DATASHEET_PEAKS")
        return peak, f"the dense BF16 datasheet peak of the {entry.name}"
    probe = capability_probe(device)
    dtype = max((d for d in ("fp32", "bf16", "fp16") if d in probe.tflops), key=lambda d: probe.tflops[d])
    return probe.tflops[dtype], (f"the fastest matmul throughput of the capability probe on this CPU "
                                 f"({dtype.upper()} at n={probe.n}; a CPU has no datasheet peak, so these MFUs "
                                 f"are shares of that measured rate, not of a peak)")


# ---- the measurement ---------------------------------------------------------------------------------------

def measure_run(rung: RungFacts, recipe: str, device: torch.device, *, compiled: bool, steps: int,
                warmup: int = 2, seed: int = 0) -> LadderRun:
    """Time ``steps`` training steps (AdamW, the recipe's autocast and scaler from ``course_lib.train``) of
    a fresh model shaped like ``rung`` with :func:`~course_lib.bench.time_function`, after one timed first
    call (compilation, when ``compiled``) and ``warmup`` untimed ones."""
    cfg = rung_config(rung.name, sdpa=rung.attention == "sdpa")
    r = get_recipe(base_recipe(recipe), device)
    peak_allocated_bytes(device, reset=True)
    model = build_gpt(cfg, seed=seed, device=device)
    if recipe in _FP8_RECIPES:
        model = float8_converter(recipe)(model)
    state = TrainState(model, r, TrainConfig(steps=steps, clip_norm=None), device)
    forward = torch.compile(state.model) if compiled else state.model
    opt, scaler = state.optimizer, state.scaler

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        opt.zero_grad(set_to_none=True)
        with recipe_autocast(r, device):
            _, loss = forward(x, y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()

    batches = random_batches(cfg.vocab_size, rung.batch_size, cfg.context, device, seed=seed)
    timer = make_timer(device)
    with tf32_matmuls(r.tf32):
        first = timer.time_call(lambda: step(*batches[0]))
        timing = time_function(step, batches, device=device, warmup=warmup, budget_s=1.0, min_repeats=steps,
                               max_repeats=steps, timer=timer)
    peak = peak_allocated_bytes(device)
    if compiled:
        torch._dynamo.reset()   # compiled graphs hold the model; the next rung needs the memory back
    return LadderRun(rung.name, recipe, compiled, timing.samples, first, peak)


def scale_ladder(profile: SizeProfile, device: torch.device | str = "cpu", *, rungs: Sequence[str] = ("course_small",),
                 recipes: Sequence[str] = LADDER_RECIPES, compile_modes: Sequence[bool] = (False,),
                 sdpa: bool = False, steps: int = 5, warmup: int = 2, batch_size: int | None = None,
                 predict_for: Sequence[str] = ("H100 SXM5",)) -> ScaleLadder:
    """Measure every (rung of ``rungs``, recipe of ``recipes``, compile mode) this device runs (the rest
    skipped with the reason), and predict every rung of :data:`RUNGS` and recipe on this device and on each
    datasheet GPU of ``predict_for``. ``batch_size`` overrides each rung's sequences per step."""
    device = torch.device(device)
    _check_names(rungs, list(RUNGS), "rung")
    _check_names(recipes, LADDER_RECIPES, "recipe")
    _check_names(predict_for, list(DATASHEET_PEAKS), "datasheet GPU")
    if not compile_modes or any(not isinstance(c, bool) for c in compile_modes):
        raise ValueError(f"compile_modes must be a non-empty sequence of bools, got {compile_modes!r}")
    for name, v in (("steps", steps), ("warmup", warmup)):
        if isinstance(v, bool) or not isinstance(v, int) or v < (1 if name == "steps" else 0):
            raise ValueError(f"{name} must be a {'positive' if name == 'steps' else 'non-negative'} int, got {v!r}")
    facts = {name: rung_facts(name, sdpa=sdpa, batch_size=batch_size) for name in RUNGS}
    reference, source = reference_peak(device)
    runs, skipped = [], []
    for rung in rungs:
        for recipe in recipes:
            reason = recipe_unsupported_reason(recipe, device)
            for compiled in compile_modes:
                if reason:
                    skipped.append(LadderSkip(rung, recipe, compiled, reason))
                    continue
                runs.append(measure_run(facts[rung], recipe, device, compiled=compiled, steps=steps, warmup=warmup))
    hardware = describe_hardware(device)
    predictions = _predictions(facts.values(), device, hardware.name, reference, predict_for)
    own = predictions[0].device if predictions and (device.type == "cpu" or find_gpu_peaks(hardware.name)) else ""
    return ScaleLadder(str(device), hardware.name, tuple(facts.values()), tuple(runs), tuple(skipped), reference,
                       source, tuple(predictions), own)


def _predictions(facts, device: torch.device, device_name: str, reference: float,
                 predict_for: Sequence[str]) -> list[LadderPrediction]:
    targets: list[tuple[str, dict[str, float | None], float, str]] = []
    if device.type == "cuda":
        entry = find_gpu_peaks(device_name)
        if entry is not None:
            targets.append((entry.name, entry.tflops, entry.bandwidth_gbs, "cuda"))
    else:
        probe = capability_probe(device)
        targets.append((f"this CPU ({device_name})", dict(probe.tflops),
                        measure_copy_bandwidth(device, 64 << 20), "cpu"))
    own = targets[0][0] if targets else None
    for name in predict_for:
        if all(t[0] != name for t in targets):
            gpu = DATASHEET_PEAKS[name]
            targets.append((name, gpu.tflops, gpu.bandwidth_gbs, "cuda"))
    out = []
    # a datasheet GPU is predicted with fused attention, as the ladder runs on a GPU (LADDER_PIECES); the
    # measuring device with the attention it ran
    fused = [rung_facts(f.name, sdpa=True, batch_size=f.batch_size) for f in facts]
    for name, tflops, bandwidth, kind in targets:
        # MFU on a GPU against its own dense BF16 peak; on the measuring CPU against the reference measured here
        ref = reference if kind == "cpu" else (tflops.get("bf16") or max(v for v in tflops.values() if v))
        for rung in (facts if name == own else fused):
            for recipe in LADDER_RECIPES:
                if kind == "cpu" and recipe_unsupported_reason(recipe, device):
                    continue   # an emulated FP8 product's throughput predicts nothing worth drawing
                p = predict(rung, recipe, name, tflops=tflops, bandwidth_gbs=bandwidth, reference_tflops=ref,
                            device_type=kind)
                if p is not None:
                    out.append(p)
    return out


def merge_ladders(ladders: Sequence[ScaleLadder]) -> ScaleLadder:
    """Several ladders recorded on one device (e.g. one record per rung), oldest first, as one: for each
    (rung, recipe, compile mode) the latest ladder's run or skip wins, as do its rung facts and predictions."""
    ladders = list(ladders)
    if not ladders:
        raise ValueError("nothing to merge: no ladders given")
    if any(not isinstance(x, ScaleLadder) for x in ladders):
        raise TypeError("merge_ladders takes ScaleLadder results")
    names = {x.device_name for x in ladders}
    if len(names) > 1:
        raise ValueError(f"ladders from different devices do not merge: {sorted(names)}")
    outcomes: dict[tuple[str, str, bool], LadderRun | LadderSkip] = {}
    rungs: dict[str, RungFacts] = {}
    predictions: dict[tuple[str, str, str], LadderPrediction] = {}
    for ladder in ladders:
        for run in ladder.runs:
            outcomes[(run.rung, run.recipe, run.compiled)] = run
        for skip in ladder.skipped:
            outcomes[(skip.rung, skip.recipe, skip.compiled)] = skip
        rungs.update({r.name: r for r in ladder.rungs})
        predictions.update({(p.device, p.rung, p.recipe): p for p in ladder.predictions})
    last = ladders[-1]
    order = {name: i for i, name in enumerate(RUNGS)}
    return ScaleLadder(last.device, last.device_name, tuple(sorted(rungs.values(), key=lambda r: order.get(r.name, 99))),
                       tuple(v for v in outcomes.values() if isinstance(v, LadderRun)),
                       tuple(v for v in outcomes.values() if isinstance(v, LadderSkip)),
                       last.reference_tflops, last.reference_source, tuple(predictions.values()),
                       last.own_prediction_device)


def ladder_sizes(profile: SizeProfile, device: torch.device | str) -> dict[str, object]:
    """The registry's parameters of ``scale_ladder``: on the small profile the CPU's rung, eager, a few
    steps; on the full profile the course model and GPT-2 small, eager, with fused attention (what lesson 6
    runs on a GPU in about a minute). The other rungs and the compiled runs are recorded in the pieces of
    :data:`LADDER_PIECES`, which the lesson merges (:func:`merge_ladders`)."""
    device = torch.device(device)
    return profile.pick(
        small={"rungs": ("course_small",), "compile_modes": (False,), "sdpa": False, "steps": 5, "warmup": 1},
        full={"rungs": ("course_full", "gpt2_small"), "compile_modes": (False,), "sdpa": True, "steps": 20,
              "warmup": 3})


# The whole ladder on a GPU, as parameter overrides of the registry's full size (``record scale_ladder
# --param``), each piece one record that fits a 10-minute command: compiling a model takes 30-90 s, six
# recipes per rung, so the larger rungs compile in two pieces. The GPU session (course_lib.gpu_session)
# records them in this order.
LADDER_PIECES: tuple[dict[str, object], ...] = (
    {},
    {"rungs": ["gpt2_medium", "gpt2_large"]},
    {"rungs": ["course_full"], "compile_modes": [True]},
    {"rungs": ["gpt2_small"], "compile_modes": [True]},
    *({"rungs": [rung], "compile_modes": [True], "recipes": list(recipes)}
      for rung in ("gpt2_medium", "gpt2_large")
      for recipes in (("fp32", "tf32", "fp16_autocast_scaler"), ("bf16_autocast", "fp8_tensorwise", "fp8_rowwise"))),
)
