"""The library's CUDA-only branches, reached on a machine without a GPU.

No GPU is available to this project's own machines, so every ``torch.cuda.*`` call and every
``device.type == "cuda"`` branch of ``course_lib`` is reached here by a test with torch's CUDA functions
replaced (``fake_gpu``): what torch reports for a given GPU (availability, compute capability, name), and
recorders for what a GPU would do (synchronize, the allocator's peak, CUDA events). ``monkeypatch.setattr``
insists that each replaced name exists in this torch, and a library call to any name not replaced reaches
the real CPU-only torch and fails, so a misspelt or wrong CUDA call in a CUDA-only branch fails a test.

Where each call site is reached (``file:function``, the call -> the test):

* device.py:select_device, ``torch.cuda.is_available`` -> test_default_device_and_size_on_a_gpu
* device.py:size_profile, ``dev.type == "cuda"`` (full size) -> test_default_device_and_size_on_a_gpu,
  test_device.py::test_profile_follows_device_without_override
* device.py:describe_hardware, ``is_available``/``current_device``/``get_device_properties``, the summary and
  caveat of a GPU -> test_describing_a_gpu_by_index, test_device.py::test_gpu_description_from_compute_capability;
  no GPU -> test_asking_for_a_gpu_without_one
* device.py:HardwareInfo.banner_markdown on a GPU, bench/matmul.py:capability_probe (n=4096 on a
  GPU), bench/matmul.py:_probe -> test_banner_on_a_gpu_measures_what_its_capability_allows
* hardware.py:format_unsupported_reason, ``is_available``/``get_device_capability`` ->
  test_bench.py::test_no_cuda_is_a_reason_not_a_crash, test_bench.py::test_dtype_support_on_gpus_from_compute_capability,
  and through the probe above
* bench/timing.py:make_timer/CudaEventTimer, ``torch.cuda.Event`` -> test_bench.py::test_cuda_event_timer_converts_milliseconds,
  test_time_function_on_a_gpu_uses_cuda_events
* studies/performance.py:_mfu_peaks, ``get_device_properties`` -> test_bench.py::test_mfu_peaks_on_a_gpu_come_from_the_datasheet
* bench/profiling.py:self_time_us and profiler_activities on a GPU (used by studies.performance's
  profile_training_step and studies.fp8_speed's profile_fp8_layer) -> test_profiler_self_time_field_on_a_gpu
* train.py:Recipe.unsupported_reason, ``is_available``/``get_device_capability`` ->
  test_train.py::test_recipes_refused_by_compute_capability_not_by_emulated_bf16,
  test_train.py::test_cuda_recipe_without_a_gpu_is_a_clear_error
* device.py:allocated_bytes, ``torch.cuda.memory_allocated`` (studies/performance.py:account_training_memory's
  baseline) -> test_studies_ladder.py::test_allocated_bytes_reads_the_allocator_on_a_gpu_only
* train.py:TrainState, ``GradScaler(device.type)``; train.py:train, ``reset_peak_memory_stats``,
  ``synchronize``, ``max_memory_allocated``, CUDA autocast -> test_training_loop_on_a_gpu
* checkup.py:_run_recipe, ``GradScaler(device.type)``, ``synchronize``, recipe refusal; checkup.py:_audit_loop,
  ``GradScaler(device.type)`` -> test_checkup_recipe_runs_on_a_gpu
* bf16.py:advice_for_this_machine on a GPU -> test_precision_advice_for_the_gpu_in_use
* experiments.py:run_experiment (a GPU-only experiment on a GPU; refused on a CPU: test_results.py),
  experiments.py:_tf32_matmul_rounding size -> test_gpu_only_experiment_runs_on_a_gpu_at_the_profiles_size
* experiments.py:_training_throughput, the recipes and compilation on a GPU ->
  test_training_throughput_experiment_runs_what_the_gpu_supports
* studies/performance.py:training_memory, profiled_steps and activation_sweep_recipe on a GPU without BF16 ->
  test_lesson6_experiments_run_only_what_a_v100_supports
* selfcheck.py:_experiment_check/_recipe_check on a GPU -> test_selfcheck_on_a_gpu; on a CPU ->
  test_selfcheck_skips_gpu_only_experiments_on_a_cpu
* record.py:main on a GPU (no refusal, ``--all`` includes GPU-only experiments), results.py:capture_provenance
  (CUDA version), results.py validation of a GPU record -> test_record_on_a_gpu
* scaling/pitfalls.py:ScalerAudit._on_autocast, ``is_available``/``get_device_capability`` ->
  test_bf16_autocast_is_flagged_only_below_compute_capability_8; the pitfall demos' patches of
  ``torch.cuda`` (disabled_scaler, bf16_without_native_support) ->
  test_scaling.py::test_each_detector_catches_its_planted_pitfall

Not reachable without a GPU, because the branch itself launches CUDA kernels or allocates CUDA memory
(they ran on an H100: the records under results/ and ``python -m course_lib.selfcheck`` there):

* formats/tf32.py:tf32_matmul_check (a TF32 matmul, then ``torch.cuda.synchronize``); its refusal on a CPU is
  tested in test_formats.py
* hardware.py:_scaled_mm_runs and bench/matmul.py:matmul_operands/measure_matmul on a GPU (FP8 ``torch._scaled_mm``, matmuls)
* studies/performance.py:profile_training_step's profile itself (``ProfilerActivity.CUDA`` around a CUDA training step)
* studies/performance.py:training_throughput with ``torch.compile`` on a GPU (the CUDA path of inductor)
* studies/amp.py:trace_course_model and amp.py:sensitive_ops_trace (FP16 autocast on CUDA tensors), overflow.py:matmul_overflow
  (an FP16 autocast matmul on CUDA)
* scaling/pitfalls.py:_autocast_enabled's fallback for torch before 2.4 (the course needs 2.11 or newer)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch

from course_lib import bench as B
from course_lib import experiments as EXPERIMENTS
from course_lib.bench import matmul as BM
from course_lib.bench import profiling
from course_lib.studies import performance as PERF
from course_lib import hardware as HW
from course_lib import device as D

H100 = ("NVIDIA H100 80GB HBM3", (9, 0))
A100 = ("NVIDIA A100-SXM4-80GB", (8, 0))
T4 = ("Tesla T4", (7, 5))
V100 = ("Tesla V100-SXM2-16GB", (7, 0))
PEAK_BYTES = 123_456_789


@dataclass
class FakeGpu:
    """What the replaced torch.cuda functions were asked: (function, device argument) in order."""

    name: str
    capability: tuple[int, int]
    calls: list[tuple[str, object]] = field(default_factory=list)

    def count(self, fn: str) -> int:
        return sum(1 for f, _ in self.calls if f == fn)

    def devices(self, fn: str) -> list:
        return [d for f, d in self.calls if f == fn]


class _FakeEvent:
    clock = [0.0]

    def __init__(self, enable_timing=False):
        assert enable_timing, "CUDA events time only with enable_timing=True"

    def record(self, stream=None):
        self.t = _FakeEvent.clock[0]

    def synchronize(self):
        pass

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


@pytest.fixture
def fake_gpu(monkeypatch):
    """``fake_gpu(name, (major, minor))``: torch reports that GPU as cuda:0 (CUDA 12.8) from then on."""
    def install(gpu=H100) -> FakeGpu:
        name, cc = gpu
        fake = FakeGpu(name, cc)

        def log(fn, result=None):
            def call(device=None, *args, **kwargs):
                fake.calls.append((fn, device))
                return result
            return call

        props = SimpleNamespace(name=name, major=cc[0], minor=cc[1], total_memory=80 << 30,
                                multi_processor_count=132)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)  # as torch says on a V100 too
        monkeypatch.setattr(torch.cuda, "get_device_capability", log("get_device_capability", cc))
        monkeypatch.setattr(torch.cuda, "get_device_properties", log("get_device_properties", props))
        monkeypatch.setattr(torch.cuda, "synchronize", log("synchronize"))
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", log("reset_peak_memory_stats"))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", log("max_memory_allocated", PEAK_BYTES))
        monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
        monkeypatch.setattr(torch.version, "cuda", "12.8")
        # torch's optimizers ask whether a CUDA graph is being captured whenever CUDA is available; on a
        # CUDA build of torch without a GPU (a plain Linux machine's `pip install torch`) the real query
        # fails with "driver version is insufficient"
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
        return fake

    # the probe caches are keyed by device name: no fake measurement may outlive the test, nor a real one
    # (on a GPU machine) leak into it
    caches = (BM._probe, HW._scaled_mm_runs)   # the cached functions, even where a test replaces one
    for cached in caches:
        cached.cache_clear()
    yield install
    for cached in caches:
        cached.cache_clear()


def _cpu_pinned(model: torch.nn.Module) -> torch.nn.Module:
    """The model stays on the CPU when asked to move to the (fake) GPU; its dtype still changes."""
    real_to = torch.nn.Module.to

    def to(*args, **kwargs):
        kwargs.pop("device", None)
        args = tuple(a for a in args if not isinstance(a, (torch.device, str)))
        return real_to(model, *args, **kwargs)

    model.to = to  # type: ignore[method-assign]
    return model


class _CpuBatches:
    """A course sampler that hands out CPU batches whatever device is asked for, and notes the device."""

    def __init__(self, sampler):
        self.sampler, self.devices = sampler, []

    def batch(self, step, device="cpu"):
        self.devices.append(torch.device(device))
        return self.sampler.batch(step, "cpu")


# ---- device.py ---------------------------------------------------------------------------------------

def test_default_device_and_size_on_a_gpu(fake_gpu):
    fake_gpu(H100)
    assert D.select_device() == torch.device("cuda")
    profile = D.size_profile()
    assert profile.name == "full" and not profile.forced
    hw = D.describe_hardware()
    assert hw.device_type == "cuda" and hw.name == H100[0] and hw.profile.name == "full"


def test_describing_a_gpu_by_index(fake_gpu, monkeypatch):
    gpu = fake_gpu(A100)
    hw = D.describe_hardware("cuda:1")
    assert gpu.devices("get_device_properties") == [1]   # the GPU asked for, not the current one
    assert hw.compute_capability == "8.0" and hw.cuda_version == "12.8" and hw.native_bf16 and hw.native_fp16
    assert hw.summary.startswith(f"GPU {A100[0]} (compute capability 8.0, CUDA 12.8); BF16 tensor cores: yes")
    assert hw.caveat == ""   # full size, GPU timings: nothing to warn about
    monkeypatch.setenv("COURSE_SIZE", "small")
    hw = D.describe_hardware("cuda")
    assert "reduced size" in hw.caveat and "not GPU timings" not in hw.caveat


def test_asking_for_a_gpu_without_one(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ValueError, match="torch sees no CUDA GPU"):
        D.describe_hardware("cuda")
    assert D.select_device() == torch.device("cpu")


def test_banner_on_a_gpu_measures_what_its_capability_allows(fake_gpu, monkeypatch):
    measured = []

    def fake_measure(dtype, m, n, k, device, **kw):
        measured.append((dtype, n, str(device)))
        return SimpleNamespace(tflops={"fp32": 15.0, "tf32": 120.0, "bf16": 240.0, "fp16": 240.0, "fp8": 480.0}[dtype])

    monkeypatch.setattr(BM, "measure_matmul", fake_measure)
    fake_gpu(V100)
    banner = D.describe_hardware().banner_markdown()
    assert banner.startswith(f"**Ran on:** GPU {V100[0]} (compute capability 7.0, CUDA 12.8)")
    assert banner.endswith("by a short probe when the page ran (on a shared machine these speeds vary from page to page): "
                           "matmul speed against FP32 at n=4096: FP16 x16.00.")   # a V100: FP16 only, at the GPU's size
    assert measured == [("fp32", 4096, "cuda"), ("fp16", 4096, "cuda")] * BM.PROBE_ROUNDS   # interleaved rounds
    probe = B.capability_probe("cuda")
    assert set(probe.unsupported) == {"tf32", "bf16", "fp8"} and "7.0" in probe.unsupported["bf16"]

    BM._probe.cache_clear()
    measured.clear()
    fake_gpu(H100)
    monkeypatch.setattr(HW, "_scaled_mm_runs", lambda device: None)   # FP8 runs on an H100
    assert B.capability_probe("cuda").summary() == ("matmul speed against FP32 at n=4096: "
                                              "TF32 x8.00, BF16 x16.00, FP16 x16.00, FP8 x32.00")
    assert [d for d, _, _ in measured] == list(HW.MATMUL_DTYPES) * BM.PROBE_ROUNDS


# ---- bench.py ----------------------------------------------------------------------------------------

def test_time_function_on_a_gpu_uses_cuda_events(fake_gpu):
    fake_gpu(H100)

    def kernel():
        _FakeEvent.clock[0] += 0.002   # what the events see: 2 ms of device time per call

    timing = B.time_function(kernel, device="cuda", warmup=1, min_repeats=3, max_repeats=3)
    assert timing.repeats == 3 and timing.median == pytest.approx(0.002)


def test_profiler_self_time_field_on_a_gpu():
    from torch.profiler import profile as torch_profile

    with torch_profile() as prof:
        torch.ones(4, 4) @ torch.ones(4, 4)
    event = prof.key_averages()[0]
    assert profiling.self_time_us(event, "cpu") == float(event.self_cpu_time_total)
    assert hasattr(event, "self_device_time_total")      # torch 2.11 and 2.13 name the GPU field so
    assert profiling.self_time_us(event, "cuda") == float(event.self_device_time_total)
    older = SimpleNamespace(self_cuda_time_total=5.0)   # a torch from before the rename
    assert profiling.self_time_us(older, "cuda") == 5.0
    assert len(profiling.profiler_activities("cuda")) == 2 and len(profiling.profiler_activities("cpu")) == 1


# ---- train.py ----------------------------------------------------------------------------------------

def test_training_loop_on_a_gpu(fake_gpu):
    from course_lib.models import course_setup
    from course_lib.train import TrainConfig, TrainState, get_recipe, train

    gpu = fake_gpu(H100)
    cuda = torch.device("cuda")
    setup = course_setup(D.SizeProfile("small"), "cpu", steps=3, default_steps=(3, 3), seed=0)
    model = _cpu_pinned(setup.model(0))
    seen = []
    model.register_forward_pre_hook(
        lambda m, a: seen.append((torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"))))
    state = TrainState(model, get_recipe("fp16_autocast_scaler", cuda), TrainConfig(steps=3), cuda)
    assert state.scaler.is_enabled() and state.scaler._device == "cuda"   # a GradScaler for the GPU
    batches = _CpuBatches(setup.sampler)
    history = train(state, batches)
    assert len(history.losses) == 3 and batches.devices == [cuda] * 3
    assert seen == [(True, torch.float16)] * 3   # the forward ran under CUDA autocast in FP16
    assert gpu.devices("reset_peak_memory_stats") == [cuda]
    assert gpu.devices("synchronize") == [cuda] * 3   # each step's time includes its kernels
    assert gpu.devices("max_memory_allocated") == [cuda] and history.peak_memory_bytes == PEAK_BYTES


# ---- checkup.py --------------------------------------------------------------------------------------

def test_checkup_recipe_runs_on_a_gpu(fake_gpu):
    from course_lib.checkup import _audit_loop, _run_recipe

    gpu = fake_gpu(H100)
    cuda = torch.device("cuda")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    x, y = torch.randn(16, 8), torch.randn(16, 1)

    def loss_fn(m, batch):
        return (m(batch[0]) - batch[1]).square().mean()

    check = _run_recipe("fp16_autocast_scaler", model, loss_fn, (x, y), cuda, steps=3, lr=1e-2)
    assert check.unsupported is None and len(check.losses) == 3 and check.final_scale == 2.0 ** 16
    assert gpu.devices("synchronize") == [cuda] * 3
    scalers = []
    _audit_loop(lambda m, b, opt, scaler: scalers.append(scaler), model, (x, y), cuda, steps=2, lr=1e-2)
    assert [s._device for s in scalers] == ["cuda", "cuda"]   # the reader's loop gets a GPU scaler

    fake_gpu(V100)
    refused = _run_recipe("bf16_autocast", model, loss_fn, (x, y), cuda, steps=3, lr=1e-2)
    assert refused.unsupported == "this GPU (compute capability 7.0) has no native BF16" and refused.losses == ()


# ---- bf16.py -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpu,recipe,fp8", [(H100, "bf16_autocast", True), (A100, "bf16_autocast", False),
                                             (T4, "fp16_autocast_scaler", False)])
def test_precision_advice_for_the_gpu_in_use(fake_gpu, gpu, recipe, fp8):
    from course_lib.bf16 import advice_for_this_machine

    fake_gpu(gpu)
    advice = advice_for_this_machine()
    assert advice.recipe == recipe and advice.device == gpu[0] and ("FP8" in advice.also) == fp8


# ---- experiments.py, selfcheck.py, record.py -----------------------------------------------------------

@pytest.fixture
def fake_tf32_check(monkeypatch):
    """tf32_matmul_check without the GPU matmul: notes the size and device it was asked for."""
    from course_lib import formats as F

    asked = []

    def check(n, device, *, seed=0):
        asked.append((n, torch.device(device)))
        return F.TF32Check(n=n, device=str(device), agreement={"nearest_even": 1.0, "nearest_away": 0.99,
                                                                "toward_zero": 0.5})

    monkeypatch.setattr(EXPERIMENTS, "tf32_matmul_check", check)
    return asked


def test_gpu_only_experiment_runs_on_a_gpu_at_the_profiles_size(fake_gpu, fake_tf32_check):
    from course_lib.experiments import run_experiment

    fake_gpu(H100)
    from course_lib.experiments import get_experiment

    out = run_experiment("tf32_matmul_rounding", D.SizeProfile("small"), "cuda")
    assert get_experiment("tf32_matmul_rounding").parameters_for(D.SizeProfile("small"), "cuda") == {"n": 256}
    assert out.device == "cuda"
    run_experiment("tf32_matmul_rounding", D.SizeProfile("full"), "cuda")
    assert fake_tf32_check == [(256, torch.device("cuda")), (4096, torch.device("cuda"))]


@pytest.mark.parametrize("gpu,recipes", [(H100, ["fp32", "tf32", "bf16_autocast", "fp16_autocast_scaler"]),
                                         (V100, ["fp32", "fp16_autocast_scaler"])])
def test_training_throughput_experiment_runs_what_the_gpu_supports(fake_gpu, monkeypatch, gpu, recipes):
    from course_lib.experiments import run_experiment

    fake_gpu(gpu)
    asked = {}

    def fake_study(profile, device, *, recipes, seeds, steps, warmup_steps, compiled):
        asked.update(device=device, recipes=list(recipes), compiled=compiled)
        return SimpleNamespace(peak_source="datasheet", flops_per_token=1.0, peaks={}, runs=(), table=lambda: [])

    monkeypatch.setattr(EXPERIMENTS, "training_throughput", fake_study)
    run_experiment("training_throughput", D.SizeProfile("small"), "cuda")
    assert asked == {"device": torch.device("cuda"), "recipes": recipes, "compiled": ("bf16_autocast",)}
    # the real study refuses up front a recipe the GPU cannot run (before any kernel): on a V100, asking
    # for TF32 (as this experiment did for every GPU) failed the whole experiment
    monkeypatch.undo()
    fake_gpu(V100)
    with pytest.raises(ValueError, match="recipe 'tf32' cannot run on cuda: TF32 needs compute capability 8.0"):
        PERF.training_throughput(D.SizeProfile("small"), "cuda", recipes=("fp32", "tf32"))


def test_selfcheck_on_a_gpu(fake_gpu, fake_tf32_check, capsys):
    from course_lib import selfcheck

    fake_gpu(V100)
    status = selfcheck.main(["--only", "recipe tf32", "recipe bf16_pure", "experiment tf32_matmul_rounding"])
    out = capsys.readouterr().out
    assert status == 0, out
    assert f"self-check on GPU {V100[0]} (compute capability 7.0, CUDA 12.8)" in out
    assert "skipped: TF32 needs compute capability 8.0 or newer; this GPU has 7.0" in out
    assert "skipped: this GPU (compute capability 7.0) has no native BF16" in out
    assert fake_tf32_check == [(256, torch.device("cuda"))] and "1 ok, 2 skipped, 0 failed" in out


def test_selfcheck_skips_gpu_only_experiments_on_a_cpu(capsys):
    from course_lib import selfcheck

    assert selfcheck.main(["--device", "cpu", "--only", "experiment tf32_matmul_rounding"]) == 0
    assert "skipped: needs a CUDA GPU" in capsys.readouterr().out


def test_record_on_a_gpu(fake_gpu, fake_tf32_check, monkeypatch, tmp_path, capsys):
    from course_lib import experiments as E
    from course_lib import record as R
    from course_lib.results import load_records

    fake_gpu(H100)
    monkeypatch.setenv("COURSE_GIT_COMMIT", "deadbeef")
    assert R.main(["tf32_matmul_rounding", "--size", "small", "--out", str(tmp_path)]) == 0   # no --allow-cpu
    (rec,) = load_records("tf32_matmul_rounding", tmp_path)
    p = rec.provenance
    assert (p.device_type, p.device_name, p.compute_capability, p.cuda_version) == ("cuda", H100[0], "9.0", "12.8")
    saved = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert saved["values"]["result"]["agreement"]["nearest_even"] == 1.0
    capsys.readouterr()

    def ok(profile, device):
        return {"device": str(device)}

    fake = {"cpu_ok": E.Experiment("cpu_ok", "anywhere", ok, dict),
            "gpu_only": E.Experiment("gpu_only", "GPU", ok, dict, requires_cuda=True)}
    monkeypatch.setattr(E, "EXPERIMENTS", fake)
    monkeypatch.setattr(R, "EXPERIMENTS", fake)
    assert R.main(["--all", "--size", "small", "--out", str(tmp_path / "all")]) == 0
    assert "experiment 2/2: gpu_only" in capsys.readouterr().out   # --all on a GPU includes GPU-only ones
    assert sorted(r.experiment for r in load_records(results_dir=tmp_path / "all")) == ["cpu_ok", "gpu_only"]


# ---- scaling.py --------------------------------------------------------------------------------------

@pytest.mark.parametrize("gpu,flagged", [(T4, True), (V100, True), (A100, False), (H100, False)])
def test_bf16_autocast_is_flagged_only_below_compute_capability_8(fake_gpu, gpu, flagged):
    from course_lib.scaling import ScalerAudit

    fake_gpu(gpu)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    with ScalerAudit(None, opt) as audit:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pass
    assert ("bf16_without_native_support" in [f.pitfall for f in audit.findings]) == flagged


@pytest.mark.parametrize("name, study, module", [("training_memory", "account_training_memory", "studies.performance"),
                                                 ("profiled_step", "profile_training_step", "studies.performance")])
def test_lesson6_experiments_run_only_what_a_v100_supports(fake_gpu, monkeypatch, name, study, module):
    import importlib

    from course_lib.experiments import run_experiment

    fake_gpu(V100)
    asked = []
    target = importlib.import_module(f"course_lib.{module}")
    monkeypatch.setattr(target, study, lambda recipe, *a, **k: asked.append(recipe) or {"recipe": recipe})
    if name == "training_memory":
        swept = []
        monkeypatch.setattr(target, "activation_sweep", lambda recipe, *a, **k: swept.append(recipe) or {})
    run_experiment(name, D.SizeProfile("small"), "cuda")
    assert asked == ["fp32", "fp16_autocast_scaler"]          # no BF16 on compute capability 7.0
    if name == "training_memory":
        assert swept == ["fp16_autocast_scaler"]
