"""The registry of named experiments that :mod:`course_lib.record` can run and record.

Each experiment is a function ``(profile, device) -> ExperimentOutput`` that calls the library function a
lesson uses, so the recorded result and the live result come from the same code. Lessons add theirs here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .amp import sensitive_ops_trace
from .bench import matmul_sweep, measure_copy_bandwidth, measure_matmul, torch_timer_matmul_seconds
from .device import SizeProfile
from .formats import tf32_matmul_check
from .gradients import UNDERFLOW_FORMATS, summarize_underflow, underflow_table
from .mx import BLOCK_RECIPES, block_error
from .studies.amp import trace_course_model
from .studies.bf16 import compare_bf16_updates, convergence_parity
from .studies.distributed import data_parallel_study, reduction_precision_study
from .studies.formats import measure_training_magnitudes
from .studies.fp8 import (
    capture_linear_tensors,
    fp8_linear_speed,
    fp8_training,
    lab_recipes,
    outlier_sweep,
    scaling_lab,
    with_outlier_channel,
)
from .studies.loss_scaling import record_grad_scaler_run
from .studies.microscaling import (
    block_scaled_training,
    block_size_study,
    compare_scale_modes,
    gradient_fidelity,
    nvfp4_scale_choices,
)
from .studies.monitoring import monitor_overhead, nan_hunt, overflow_recovery, underflow_trend
from .studies.performance import account_training_memory, activation_sweep, profile_training_step, training_throughput
from .studies.underflow import train_and_capture
from .train import get_recipe


@dataclass(frozen=True)
class ExperimentOutput:
    """What one run produced: the parameters it ran with and the measured values (JSON-able)."""

    parameters: dict[str, Any]
    values: dict[str, Any]


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    run: Callable[[SizeProfile, torch.device], ExperimentOutput]
    requires_cuda: bool = False


EXPERIMENTS: dict[str, Experiment] = {}


def register(name: str, description: str, *, requires_cuda: bool = False):
    """Decorator adding an experiment function to :data:`EXPERIMENTS` under ``name``."""
    def wrap(fn: Callable[[SizeProfile, torch.device], ExperimentOutput]):
        if name in EXPERIMENTS:
            raise ValueError(f"experiment {name!r} is registered twice")
        EXPERIMENTS[name] = Experiment(name, description, fn, requires_cuda)
        return fn
    return wrap


def get_experiment(name: str) -> Experiment:
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise ValueError(f"unknown experiment {name!r}; known: {', '.join(sorted(EXPERIMENTS))}") from None


def run_experiment(name: str, profile: SizeProfile, device: torch.device | str) -> ExperimentOutput:
    """Run a registered experiment; refuse clearly when it needs a GPU and ``device`` is not one."""
    exp = get_experiment(name)
    device = torch.device(device)
    if exp.requires_cuda and device.type != "cuda":
        raise ValueError(f"experiment {name!r} needs a CUDA GPU; this run's device is {device.type}")
    return exp.run(profile, device)


# ---- lesson 1: number formats ----------------------------------------------------------------------

@register("model_magnitudes",
          "Magnitudes (log2 histograms) of weights, activations, gradients and Adam moments of the "
          "course model after FP32 AdamW training (lesson 1).")
def _model_magnitudes(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    result = measure_training_magnitudes(profile, device)
    return ExperimentOutput(
        parameters={"profile": profile.name, "steps": result.steps, "batch_size": result.batch_size,
                    "config": result.config},
        values={"magnitudes": result},
    )


@register("tf32_matmul_rounding",
          "A float32 matmul A @ I with TF32 enabled, compared bit for bit with course_lib's TF32 rounding "
          "of A under each rounding rule (lesson 1).", requires_cuda=True)
def _tf32_matmul_rounding(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    n = profile.pick(small=256, full=4096)
    result = tf32_matmul_check(n, device)
    return ExperimentOutput(parameters={"n": n}, values={"check": result})


# ---- lessons 2 and 3: underflow, loss scaling -----------------------------------------------------

@register("underflow_statistics",
          "Per-format underflow/overflow fractions of the course model's activation and weight gradients, "
          "first and last step of FP32 training, per layer and overall (lesson 2).")
def _underflow_statistics(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    run = train_and_capture(profile, device)
    values = {}
    for step, cap in run.captures.items():
        values[f"step_{step}"] = {
            "overall": {kind: {f: summarize_underflow(cap.all_values(kind), f) for f in UNDERFLOW_FORMATS}
                        for kind in ("activation", "weight")},
            "per_layer_activation": [{"layer": name, "summary": s} for name, s in underflow_table(cap)],
        }
    return ExperimentOutput(parameters={"profile": profile.name, "steps": len(run.losses)},
                            values={"losses": run.losses, "captures": values})


@register("scaler_flight_recording",
          "A real torch.amp.GradScaler run of the course model with FP16 autocast at GradScaler's "
          "defaults: scale, skipped steps and growth tracker per step (lesson 3).")
def _scaler_flight_recording(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    rec = record_grad_scaler_run(profile, device)
    return ExperimentOutput(parameters={"profile": profile.name, "steps": rec.steps,
                                        "init_scale": rec.init_scale, "growth_interval": rec.growth_interval},
                            values={"recording": rec})


# ---- lesson 4: autocast -------------------------------------------------------------------------------

@register("autocast_trace",
          "Dtypes in and out of every op of the course model's forward and backward under CUDA FP16 "
          "autocast, and of softmax/layer_norm/exp/sum on a low-precision input (lesson 4).",
          requires_cuda=True)
def _autocast_trace(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    trace = trace_course_model(device)
    return ExperimentOutput(parameters={"dtype": trace.dtype},
                            values={"forward": trace.op_table("forward"), "backward": trace.op_table("backward"),
                                    "sensitive_ops": sensitive_ops_trace(device)})


# ---- lesson 5: BF16 against FP16 ----------------------------------------------------------------------

@register("convergence_parity",
          "Final training loss of FP32, FP16+GradScaler, BF16 and FP16-without-scaler on the course model "
          "over three seeds, with loss curves and step times (lesson 5).")
def _convergence_parity(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    parity = convergence_parity(profile, device)
    return ExperimentOutput(parameters={"profile": profile.name, "seeds": parity.seeds},
                            values={"final_losses": parity.final_losses, "curves": parity.curves})


@register("bf16_update_stagnation",
          "The course model with BF16 weights: round-to-nearest updates against FP32 master weights, "
          "Kahan compensation and stochastic rounding, with the share of lost updates (lesson 5).")
def _bf16_update_stagnation(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    result = compare_bf16_updates(profile, device)
    return ExperimentOutput(parameters={"profile": profile.name, "lr": result.lr, "seeds": list(result.seeds),
                                        "steps": result.steps},
                            values={"curves": {k: [list(c) for c in v] for k, v in result.curves.items()},
                                    "lost_fraction": {k: [list(c) for c in v] for k, v in result.lost_fraction.items()},
                                    "eval_losses": {k: list(v) for k, v in result.eval_losses.items()}})


# ---- lesson 6: performance and memory -----------------------------------------------------------------

def matmul_sweep_sizes(profile: SizeProfile) -> tuple[int, ...]:
    """Square sizes of the matmul sweep: powers of two with misaligned neighbours (one less)."""
    return profile.pick(small=(64, 127, 128, 255, 256, 511, 512),
                        full=(256, 512, 1024, 2048, 4095, 4096, 8191, 8192))


@register("matmul_throughput",
          "Square matmul throughput per dtype (FP32 with TF32 off, TF32, BF16, FP16, FP8 via _scaled_mm) over "
          "aligned and misaligned sizes, copy bandwidth, and a cross-check against "
          "torch.utils.benchmark.Timer (lesson 6).")
def _matmul_throughput(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    sizes = matmul_sweep_sizes(profile)
    sweep = matmul_sweep(device, sizes, budget_s=profile.pick(small=0.05, full=0.2))
    points = [{"dtype": p.dtype, "n": p.n, "tflops": p.tflops, "median_s": p.timing.median,
               "q25_s": p.timing.q25, "q75_s": p.timing.q75, "repeats": p.timing.repeats} for p in sweep.points]
    check_n = profile.pick(small=512, full=4096)
    cross = {}
    budget = profile.pick(small=0.1, full=0.5)
    for dtype in ("fp32", "bf16"):
        if dtype not in sweep.skipped:
            cross[dtype] = {"harness_s": measure_matmul(dtype, check_n, check_n, check_n, device,
                                                        budget_s=budget).timing.median,
                            "torch_timer_s": torch_timer_matmul_seconds(dtype, check_n, device,
                                                                        min_run_time=budget)}
    bandwidth = measure_copy_bandwidth(device, profile.pick(small=64 << 20, full=1 << 30))
    return ExperimentOutput(parameters={"sizes": list(sizes), "cross_check_n": check_n},
                            values={"points": points, "skipped": sweep.skipped, "cross_check": cross,
                                    "copy_bandwidth_gbs": bandwidth})


@register("training_throughput",
          "Step time, tokens/s and MFU of the course model per precision recipe over seeds, eager and "
          "torch.compile, with loss curves and per-step times for time-to-target (lesson 6).")
def _training_throughput(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    # the recipes this device runs: TF32 and BF16 need compute capability 8.0 (a V100 or T4 has FP16 only),
    # and a CPU has no TF32
    recipes = tuple(r for r in ("fp32", "tf32", "bf16_autocast", "fp16_autocast_scaler")
                    if get_recipe(r).unsupported_reason(device) is None)
    study = training_throughput(profile, device, recipes=recipes, seeds=(0, 1, 2),
                                compile_too=device.type == "cuda")
    return ExperimentOutput(
        parameters={"profile": profile.name, "recipes": list(recipes), "seeds": [0, 1, 2],
                    "peak_source": study.peak_source},
        values={"flops_per_token": study.flops_per_token, "peaks": study.peaks, "table": study.table(),
                "runs": [{"recipe": r.recipe, "seed": r.seed, "compiled": r.compiled, "losses": r.losses,
                          "step_seconds": r.step_seconds, "tokens_per_step": r.tokens_per_step,
                          "warmup_steps": r.warmup_steps, "peak_memory_bytes": r.peak_memory_bytes}
                         for r in study.runs]})


def _runnable(recipes: tuple[str, ...], device: torch.device) -> tuple[str, ...]:
    """The recipes ``device`` runs (a V100 or T4 has no BF16 or TF32; a CPU no TF32), in the given order."""
    return tuple(r for r in recipes if get_recipe(r).unsupported_reason(device) is None)


@register("training_memory",
          "Memory of one training step of the course model per recipe, counted by component (weights, "
          "gradients, optimizer state, masters, autocast weight copies, saved activations) and, on a GPU, "
          "the allocator's peak for the step; activation bytes against batch and context (lesson 6).")
def _training_memory(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    recipes = _runnable(("fp32", "bf16_autocast", "fp16_autocast_scaler", "bf16_pure", "bf16_master"), device)
    breakdowns = [account_training_memory(r, profile, device) for r in recipes]
    low = "bf16_autocast" if "bf16_autocast" in recipes else "fp16_autocast_scaler"   # a V100 or T4: FP16
    sweep = activation_sweep(low, profile, device,
                             batches=profile.pick(small=(1, 2, 4, 8), full=(8, 16, 32, 64)),
                             contexts=profile.pick(small=(16, 32, 64), full=(64, 128, 256)))
    return ExperimentOutput(parameters={"profile": profile.name, "recipes": list(recipes), "sweep_recipe": low},
                            values={"breakdowns": breakdowns, "activation_sweep": sweep})


@register("profiled_step",
          "torch.profiler's top operators (self time) of one training step of the course model in FP32, "
          "BF16 autocast and FP16 autocast, and the share of time spent in casts (lesson 6).")
def _profiled_step(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    recipes = _runnable(("fp32", "bf16_autocast", "fp16_autocast_scaler"), device)
    steps = [profile_training_step(r, profile, device, top=12) for r in recipes]
    return ExperimentOutput(parameters={"profile": profile.name, "recipes": list(recipes)}, values={"steps": steps})


# ---- lesson 7: FP8 ----------------------------------------------------------------------------------

def fp8_speed_sizes(profile: SizeProfile) -> tuple[int, ...]:
    """Square linear-layer sizes of the FP8 speed study."""
    return profile.pick(small=(64, 128, 256), full=(256, 512, 1024, 2048, 4096, 8192))


@register("fp8_linear_speed",
          "Forward+backward time of a square linear layer in BF16 and in FP8 (the course's layer on "
          "torch._scaled_mm, and torchao's Float8Linear when it imports), over sizes (lesson 7).")
def _fp8_linear_speed(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    sizes = fp8_speed_sizes(profile)
    speed = fp8_linear_speed(sizes, device, budget_s=profile.pick(small=0.05, full=0.3))
    return ExperimentOutput(parameters={"sizes": list(sizes)},
                            values={"seconds": {k: {str(n): s for n, s in v.items()} for k, v in speed.seconds.items()},
                                    "skipped": speed.skipped})


@register("fp8_training",
          "Loss curves of the course model with FP8 linear layers per scaling recipe (tensorwise, rowwise, "
          "delayed, blockwise, unscaled) against BF16 autocast, three seeds each (lesson 7).")
def _fp8_training(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    steps = profile.pick(small=40, full=400)
    result = fp8_training(profile, device, steps=steps)
    return ExperimentOutput(parameters={"profile": profile.name, "recipes": list(result.recipes),
                                        "seeds": list(result.seeds), "steps": result.steps, "block": result.block},
                            values={"curves": {k: [list(c) for c in v] for k, v in result.curves.items()}})


@register("fp8_scaling_lab",
          "Quantisation error, saturation and flush-to-zero of each FP8 scaling recipe on the course model's "
          "activation, weight and output gradient, and the outlier-channel sweep (lesson 7).")
def _fp8_scaling_lab(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    import dataclasses


    block = profile.pick(small=32, full=128)
    tensors = capture_linear_tensors(profile, device)
    lab = scaling_lab({"activation": tensors.activation, "weight": tensors.weight,
                       "gradient": tensors.grad_output}, lab_recipes(block))
    recipes = {k: v for k, v in lab_recipes(block).items() if "E5M2" not in k and "no scaling" not in k}
    sweep = outlier_sweep(tensors.activation, recipes)
    return ExperimentOutput(
        parameters={"profile": profile.name, "layer": tensors.layer, "steps": tensors.steps, "block": block},
        values={"errors": {t: {r: dataclasses.asdict(e) for r, e in d.items()} for t, d in lab.errors.items()},
                "outlier_sweep": dataclasses.asdict(sweep)})


# ---- lesson 8: microscaling -------------------------------------------------------------------------

def mx_lesson_tensors(profile: SizeProfile, device: torch.device) -> dict[str, torch.Tensor]:
    """The tensors lesson 8 quantises: the course model's ``blocks.0.out`` input activation, weight and
    output gradient after FP32 training, and the activation with its channel 0 made 100x larger (an outlier
    channel; measure the other channels with ``skip_columns={"activation + outlier": (0,)}``)."""
    t = capture_linear_tensors(profile, device, layer="blocks.0.out")
    return {"activation": t.activation, "weight": t.weight, "gradient": t.grad_output,
            "activation + outlier": with_outlier_channel(t.activation)}


@register("mx_block_study",
          "MX quantisation error against block size (E4M3 and E2M1 elements), the FP4 block-scale choices "
          "(E8M0, E4M3, with and without NVFP4's tensor scale), FLOOR against RCEIL scale selection, and each "
          "NVFP4 recipe piece's effect on the course model's gradient (lesson 8).")
def _mx_block_study(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    import dataclasses


    tensors = mx_lesson_tensors(profile, device)
    skip: dict[str, tuple[int, ...]] = {"activation + outlier": (0,)}
    study = block_size_study(tensors, skip_columns=skip)
    choices = {t: {name: dataclasses.asdict(block_error(x, s, label=name, skip_columns=skip.get(t, ())))
                   for name, s in nvfp4_scale_choices().items()} for t, x in tensors.items()}
    modes = {el: dataclasses.asdict(compare_scale_modes(tensors["activation"], element=el))
             for el in ("e4m3", "e2m1")}
    fidelity = gradient_fidelity(profile, device)
    return ExperimentOutput(
        parameters={"profile": profile.name, "layer": "blocks.0.out", "blocks": list(study.blocks)},
        values={"block_sizes": {el: {t: {b: dataclasses.asdict(e) for b, e in d.items()} for t, d in v.items()}
                                for el, v in study.errors.items()},
                "scale_choices": choices, "scale_modes": modes, "gradient_fidelity": dataclasses.asdict(fidelity)})


@register("mx_training",
          "Loss curves of the course model with MXFP8, MXFP4 and NVFP4 linear layers (exact emulation) against "
          "BF16 autocast, and the NVFP4 recipe with one piece removed at a time, three seeds each (lesson 8).")
def _mx_training(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    steps = profile.pick(small=40, full=400)
    result = block_scaled_training(profile, device, recipes=("bf16_autocast", *BLOCK_RECIPES), steps=steps)
    return ExperimentOutput(parameters={"profile": profile.name, "recipes": list(result.recipes),
                                        "seeds": list(result.seeds), "steps": result.steps},
                            values={"curves": {k: [list(c) for c in v] for k, v in result.curves.items()}})


# ---- lesson 9: monitoring and debugging ---------------------------------------------------------------

@register("monitor_faults",
          "Planted faults caught: a NaN in a forward and in a backward pass located by module (against "
          "torch.autograd.detect_anomaly), an FP16 overflow run with and without rollback-and-BF16 recovery, "
          "and the share of each gradient an unscaled FP16 would flush over an FP32 run (lesson 9).")
def _monitor_faults(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    import dataclasses


    hunts = {}
    for kind, layer in (("nan", "blocks.1.fc"), ("nan_backward", "blocks.1.attn.qkv")):
        h = nan_hunt(profile, device, layer=layer, kind=kind)
        hunts[kind] = {"layer": h.layer, "report": None if h.report is None else dataclasses.asdict(h.report),
                       "anomaly": h.anomaly,
                       "seconds": {"plain": h.plain_s, "locator": h.locator_s, "anomaly": h.anomaly_s}}
    demo = overflow_recovery(profile, device)
    trend = underflow_trend(profile, device)
    return ExperimentOutput(parameters={"profile": profile.name, "steps": demo.steps, "fault_at": demo.fault_at},
                            values={"nan_hunts": hunts, "recovery": dataclasses.asdict(demo),
                                    "underflow_trend": dataclasses.asdict(trend)})


@register("monitor_overhead",
          "Median optimizer-step time of the course model without a gradient monitor and with one sampling "
          "every step and every 10 steps, alternated within one run (lesson 9).")
def _monitor_overhead(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    result = monitor_overhead(profile, device, steps=profile.pick(small=20, full=50))
    return ExperimentOutput(parameters={"profile": profile.name, "everies": [1, 10]},
                            values={"seconds": {str(k): v for k, v in result.seconds.items()}})


# ---- lesson 10: across processes -----------------------------------------------------------------------

@register("data_parallel",
          "Two-process data parallelism (NCCL when every rank has a GPU, gloo on the CPU otherwise): DDP "
          "against one process for FP32, BF16 autocast and FP16 with GradScaler; an inf planted on one rank "
          "under DDP, a hand-written loop that unscales before the all-reduce, and FSDP2; FSDP2 mixed precision "
          "policies; DDP's FP16/BF16 compression hooks; the real all-reduce against the simulation (lesson 10).")
def _data_parallel(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    import dataclasses


    study = data_parallel_study(profile, device)
    values = dataclasses.asdict(study)
    parameters = {k: values.pop(k) for k in ("world_size", "backend", "device", "size", "steps", "plant_step")}
    return ExperimentOutput(parameters={"profile": profile.name, **parameters}, values=values)


@register("reduction_precision",
          "The data-parallel mean of N ranks' real course-model gradients, reduced in FP32, BF16 (ring and "
          "tree order) and FP16 (divided by N or by ~sqrt(N) first), against the FP64 mean, N = 2..128 "
          "(lesson 10).")
def _reduction_precision(profile: SizeProfile, device: torch.device) -> ExperimentOutput:
    import dataclasses


    study = reduction_precision_study(profile, device)
    return ExperimentOutput(parameters={"profile": profile.name, "world_sizes": list(study.world_sizes),
                                        "per_rank_sequences": study.per_rank_sequences},
                            values=dataclasses.asdict(study))
