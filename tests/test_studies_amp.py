"""Lesson 4's facts, phrases, tables and errata, each computed from a result built by hand with known numbers."""

import types

import pytest
import torch

from course_lib.amp import AutocastTrace, OpEvent
from course_lib.glue import Prose
from course_lib.results import Provenance, Record, RecordedResult
from course_lib.studies import amp as A
from course_lib.tables import MarkdownTable
from course_lib.train import RECIPES, History

LISTS = {"lower precision": frozenset({"mm", "addmm"}), "fp32": frozenset({"layer_norm", "exp"}),
         "fp32 (via dtype argument)": frozenset({"softmax", "sum"}), "promote": frozenset({"cat"})}


def test_setup_facts_are_inline_code():
    facts = A.setup_facts("cpu", torch.bfloat16)
    assert facts == {"amp_dtype": "`torch.bfloat16`", "device_type": "`cpu`"}
    assert all(isinstance(v, Prose) for v in facts.values())
    with pytest.raises(TypeError, match="amp_dtype must be a torch.dtype"):
        A.setup_facts("cpu", "bfloat16")


def test_trace_facts_count_distinct_ops_and_cast_calls():
    events = (OpEvent("_to_copy", ("float32",), ("bfloat16",), "forward"),
              OpEvent("_to_copy", ("float32",), ("bfloat16",), "forward"),
              OpEvent("mm", ("bfloat16", "bfloat16"), ("bfloat16",), "forward"),
              OpEvent("add", ("float32", "bfloat16"), ("float32",), "forward"),
              OpEvent("mm", ("bfloat16", "bfloat16"), ("bfloat16",), "backward"))
    assert A.trace_facts(AutocastTrace("cpu", "bfloat16", events)) == {"n_ops": 3, "n_backward_ops": 1, "n_casts": 2}


def test_policy_lists_markdown_lists_each_policy_sorted():
    assert A.policy_lists_markdown({"fp32": frozenset({"exp", "cos"}), "promote": frozenset({"cat"})}) == (
        "- **fp32** (2 ops): `cos`, `exp`\n- **promote** (1 ops): `cat`")


def _provenance():
    return Provenance("NVIDIA H100 80GB HBM3", "cuda", "2.11", "2026-01-01T00:00:00+00:00", "cmd", "abc", "3.12",
                      compute_capability="9.0")


def test_sensitive_ops_table_adds_the_recorded_column_only_with_a_record():
    live = {"matmul output": "bfloat16", "exp": "bfloat16"}
    table = A.sensitive_ops_table(live, "cpu", LISTS, [])
    assert isinstance(table, MarkdownTable)
    assert table.splitlines() == ["| op | output dtype here (cpu) | torch's CUDA list |", "|---|---|---|",
                                  "| matmul output | bfloat16 | lower precision |", "| exp | bfloat16 | fp32 |"]
    ops = {"matmul output": "float16", "exp": "float32"}
    record = RecordedResult(Record("autocast_trace", {}, {}, _provenance()), A.AutocastOps("float16", (), (), ops))
    assert A.sensitive_ops_table(live, "cpu", LISTS, [record]).splitlines() == [
        "| op | output dtype here (cpu) | torch's CUDA list | recorded on NVIDIA H100 80GB HBM3 (sm 9.0) |",
        "|---|---|---|---|",
        "| matmul output | bfloat16 | lower precision | float16 |", "| exp | bfloat16 | fp32 | float32 |"]
    with pytest.raises(TypeError, match="expected a recorded AutocastOps, got dict"):
        A.sensitive_ops_table(live, "cpu", LISTS, [RecordedResult(Record("x", {}, {}, _provenance()), {})])


def test_exceptions_table_shows_code_and_dtype():
    assert A.exceptions_table({"a @ b": "bfloat16", "acc.add_(a @ b)": "float32"}).splitlines() == [
        "| code, run under autocast | result dtype |", "|---|---|", "| `a @ b` | bfloat16 |",
        "| `acc.add_(a @ b)` | float32 |"]


def test_norm_demo_facts_read_the_counts_and_errors():
    demo = {"activations dtype": "float16", "rows": 8, "smallest FP16 value whose FP16 square is inf": 256.0,
            "rows holding a value of that size or more": 3,
            "rows the naive norm set to zero": 3, "largest error, naive": 2.5,
            "largest error, in autocast(enabled=False)": 1e-7}
    assert A.norm_demo_facts(demo) == {"norm_rows": 8, "norm_square_limit": 256.0, "norm_big_rows": 3, "norm_zeroed": 3,
                                       "norm_err_naive": 2.5, "norm_err_safe": 1e-7}
    assert A.norm_demo_table(demo).splitlines()[2:] == [
        "| activations dtype | float16 |", "| rows | 8 |", "| smallest FP16 value whose FP16 square is inf | 256 |",
        "| rows holding a value of that size or more | 3 |", "| rows the naive norm set to zero | 3 |",
        "| largest error, naive | 2.5 |", "| largest error, in autocast(enabled=False) | 1e-07 |"]
    with pytest.raises(ValueError, match="lacks rows the naive norm set to zero"):
        A.norm_demo_facts({k: v for k, v in demo.items() if k != "rows the naive norm set to zero"})


def test_checkpoint_facts_say_identical_or_different():
    same = A.checkpoint_facts({"identical gradients": True, "output dtype": "bfloat16"})
    assert same == {"ckpt_identical": "identical, bit for bit"} and isinstance(same["ckpt_identical"], Prose)
    assert A.checkpoint_facts({"identical gradients": False}) == {"ckpt_identical": "**different**"}
    with pytest.raises(ValueError, match="identical gradients"):
        A.checkpoint_facts({})


def test_recipes_table_lists_every_recipe_and_why_the_cpu_cannot_run_tf32():
    lines = A.recipes_table("cpu").splitlines()
    assert lines[:3] == ["| recipe | what it does | runs here |", "|---|---|---|", "| `fp32` | FP32 everywhere | yes |"]
    assert len(lines) == 2 + len(RECIPES)
    assert lines[3] == f"| `tf32` | {RECIPES['tf32'].description} | no: {RECIPES['tf32'].unsupported_reason('cpu')} |"
    assert RECIPES["tf32"].unsupported_reason("cpu") not in (None, "yes")


def _histories():
    return {"fp32": History("fp32", losses=[3.5, 3.0], skipped=[False, False], tokens_per_second=[100.0, 300.0, 200.0]),
            "fp16_autocast_scaler": History("fp16_autocast_scaler", losses=[3.5, 3.25], skipped=[True, False],
                                            tokens_per_second=[1000.0, 50.0, 100.0])}


def test_recipe_results_table_labels_cpu_timings():
    assert A.recipe_results_table(_histories(), "cpu").splitlines() == [
        "| recipe | final loss | skipped steps | median tokens/s, CPU (not a GPU speed) |", "|---|---|---|---|",
        "| `fp32` | 3.000 | 0 | 200 |", "| `fp16_autocast_scaler` | 3.250 | 1 | 100 |"]
    assert A.recipe_results_table(_histories(), "cuda").splitlines()[0] == (
        "| recipe | final loss | skipped steps | median tokens/s, GPU |")


def test_recipe_facts_compare_median_throughputs():
    assert A.recipe_facts(_histories()) == {"recipe_speeds": "`fp16_autocast_scaler` 0.50"}
    with pytest.raises(ValueError, match="need fp32 and another recipe"):
        A.recipe_facts({"fp32": _histories()["fp32"]})
    with pytest.raises(ValueError, match="need fp32 and another recipe"):
        A.recipe_facts({"bf16": _histories()["fp32"], "fp16": _histories()["fp32"]})


def test_amp_errata_state_the_measured_dtypes_and_the_deprecation():
    rows = A.amp_errata(mean_dtype=torch.bfloat16, softmax_dtype=torch.bfloat16, exp_dtype=torch.bfloat16,
                        weight_dtype=torch.float32, warnings_seen=["`torch.cuda.amp.autocast(args...)` is deprecated."],
                        lists=LISTS)
    assert [c for c, _ in rows] == ["`mean` stays in FP32 under autocast.", "Softmax runs in FP16/BF16 under autocast.",
                                    "Autocast converts the model's weights to FP16.",
                                    "Use `torch.cuda.amp.autocast()` and `torch.cuda.amp.GradScaler()`."]
    assert rows[0][1] == ("`mean` is on none of CUDA autocast's lists (torch's header gives it no policy), so it runs "
                          "in its input's dtype: the mean of a matmul's output under BF16 autocast here is "
                          "`torch.bfloat16`. On CUDA, autocast runs `sum` and `softmax` in FP32 (its list: fp32, via "
                          "dtype argument) and `layer_norm` too (fp32).")
    assert rows[1][1] == ("On CUDA it is on the FP32 list (fp32, via dtype argument); on the CPU it is not: here "
                          "`softmax` of a BF16 matmul output returns `torch.bfloat16` and `exp` returns "
                          "`torch.bfloat16` (CUDA: fp32).")
    assert rows[2][1] == ("The weights stay `torch.float32`; autocast makes a lower-precision copy of a weight when "
                          "an op first needs it and reuses it until the autocast region exits.")
    cached = A.amp_errata(mean_dtype=torch.bfloat16, softmax_dtype=torch.bfloat16, exp_dtype=torch.bfloat16,
                          weight_dtype=torch.float32, warnings_seen=[], lists=LISTS, casts=(1, 1))
    assert cached[2][1].endswith(": here 3 calls of one linear layer in one region cast its weight once, and a "
                                 "second region once more.")
    assert rows[3][1] == ("Deprecated: torch says \"`torch.cuda.amp.autocast(args...)` is deprecated\". "
                          "`torch.amp` takes the device type as an argument, so one code path serves CUDA, the CPU "
                          "and other devices.")
    both = A.amp_errata(mean_dtype=torch.bfloat16, softmax_dtype=torch.bfloat16, exp_dtype=torch.bfloat16,
                        weight_dtype=torch.float32, lists=LISTS,
                        warnings_seen=["autocast is deprecated.", "GradScaler is deprecated.",
                                       "autocast is deprecated."])
    assert both[3][1].startswith('Deprecated: torch says "autocast is deprecated" and "GradScaler is deprecated". ')
    quiet = A.amp_errata(mean_dtype=torch.float32, softmax_dtype=torch.float32, exp_dtype=torch.float32,
                         weight_dtype=torch.float32, warnings_seen=[], lists=LISTS)
    assert quiet[3][1].startswith("The installed torch does not warn about them. `torch.amp` takes")
    assert "here is `torch.float32`" in quiet[0][1]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_autocast_casts_a_weight_once_per_region(dtype):
    # measured with a dispatch mode: three calls in one region cast the weight once, a second region once more
    assert A.weight_casts("cpu", dtype) == (1, 1)
    assert A.weight_casts("cpu", dtype, calls=1) == (1, 1)
    with pytest.raises(ValueError, match="calls"):
        A.weight_casts("cpu", dtype, calls=0)


def test_amp_errata_refuse_dtypes_given_as_text():
    kwargs = dict(mean_dtype=torch.float32, softmax_dtype=torch.float32, exp_dtype=torch.float32,
                  weight_dtype=torch.float32, warnings_seen=[], lists=LISTS)
    with pytest.raises(TypeError, match="softmax_dtype must be a torch.dtype"):
        A.amp_errata(**{**kwargs, "softmax_dtype": "float32"})
    with pytest.raises(TypeError, match="sequence of messages"):
        A.amp_errata(**{**kwargs, "warnings_seen": "deprecated"})


def test_exercise_facts_name_the_ops_dtypes_and_the_master_copys_bytes():
    facts = A.exercise_facts(torch.bfloat16, LISTS, op="exp")
    # bf16_master keeps an FP32 master copy (4 bytes) and its FP32 gradient (4) beyond bf16_pure, and AdamW's
    # two moments in FP32 (8) instead of BF16 (4): 12 bytes per parameter more
    # bf16_pure's torch AdamW keeps BF16 moments (2 + 2 + 4 bytes); BF16AdamW keeps FP32 moments (2 + 2 + 8),
    # and Kahan compensation a BF16 buffer more (2)
    assert facts == {"ex_op_cpu": "`torch.bfloat16`", "ex_master_extra": 12,
                     "ex_op_cuda": "on CUDA's FP32 list, so it returns `float32`", "ex_pure_moments": "`bfloat16`",
                     "ex_pure_bytes": 8, "ex_master_bytes": 20, "ex_sr_bytes": 12, "ex_kahan_bytes": 14}
    assert isinstance(facts["ex_op_cpu"], Prose) and isinstance(facts["ex_op_cuda"], Prose)
    assert A.exercise_facts(torch.bfloat16, LISTS, op="view")["ex_op_cuda"] != facts["ex_op_cuda"]
    with pytest.raises(TypeError, match="op_dtype"):
        A.exercise_facts("bfloat16", LISTS)
    lists = {**LISTS, "fp32": LISTS["fp32"] | {"pow"}}
    facts = A.exercise_facts(torch.bfloat16, lists, pow_dtype=torch.float16)
    # CUDA's policy for pow is the checked exercise's answer: no fact gives it away
    assert facts["ex_pow_cpu"] == "`torch.float16`" and not any("pow" in k and "cuda" in k for k in facts)
    with pytest.raises(TypeError, match="pow_dtype"):
        A.exercise_facts(torch.bfloat16, LISTS, pow_dtype="float16")


def test_attention_order_facts_name_what_each_ordering_gave():
    facts = A.attention_order_facts(64, 45.25, False, True)
    verdict = facts.pop("attn_verdict")
    assert facts == {"attn_head_dim": 64, "attn_raw": 64 * 45.25 ** 2, "attn_fp16_max": torch.finfo(torch.float16).max,
                     "attn_scaled": 64 * 45.25 ** 2 / 8, "attn_headroom": 8.0}
    assert verdict.startswith("the course model's ordering overflows")
    assert "do not separate" not in verdict
    assert "does not separate them" in A.attention_order_facts(64, 1.0, True, True)["attn_verdict"]
    assert "against expectation" in A.attention_order_facts(64, 1.0, True, False)["attn_verdict"]
    assert "both orderings overflow" in A.attention_order_facts(64, 1.0, False, False)["attn_verdict"]
    with pytest.raises(ValueError, match="head_dim"):
        A.attention_order_facts(0, 1.0, True, True)


def _math_order_measurement(d=64):
    """Lesson 4's visible cell: FP32 vectors whose product is twice FP32's largest value, written out and
    through the math backend alone."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    big = torch.full((1, 1, 4, d), (2 * torch.finfo(torch.float32).max / d) ** 0.5)
    v = torch.randn(1, 1, 4, d)
    written = torch.softmax(big @ big.transpose(-2, -1) / d ** 0.5, dim=-1) @ v
    with sdpa_kernel(SDPBackend.MATH):
        math_only = torch.nn.functional.scaled_dot_product_attention(big, big, v)
    return torch.isfinite(written).all().item(), torch.isfinite(math_only).all().item()


def test_sdpas_math_backend_scales_before_the_product():
    # measured, as lesson 4 does it: the written-out order overflows, the math backend stays finite (it
    # multiplies q and k each by d**-0.25 first)
    written, math_only = _math_order_measurement()
    assert (written, math_only) == (False, True)
    facts = A.math_backend_order_facts(written, math_only)
    assert str(facts["attn_math_order"]).startswith("the written-out order overflows FP32 itself")
    # a backend that scaled after the product would overflow as the written-out order does: the phrase says so
    assert "does not scale before the product" in str(A.math_backend_order_facts(False, False)["attn_math_order"])
    assert "does not tell the orders apart" in str(A.math_backend_order_facts(True, True)["attn_math_order"])
    with pytest.raises(TypeError, match="written_finite"):
        A.math_backend_order_facts(torch.tensor(True), True)
    with pytest.raises(TypeError, match="math_finite"):
        A.math_backend_order_facts(True, 1)


def test_the_written_out_order_overflows_fp16_where_sdpa_does_not():
    """The lesson's demonstration, run: q . k is twice FP16's largest value before the 1/sqrt(d) scale."""
    import torch.nn.functional as F

    d = 64
    entry = (2 * torch.finfo(torch.float16).max / d) ** 0.5
    q = k = torch.full((1, 1, 4, d), entry, dtype=torch.float16)
    v = torch.ones(1, 1, 4, d, dtype=torch.float16)
    manual = torch.softmax((q @ k.transpose(-2, -1)) / d ** 0.5, dim=-1) @ v
    fused = F.scaled_dot_product_attention(q, k, v)
    assert not torch.isfinite(manual).all() and torch.isfinite(fused).all()
    assert torch.equal(fused, v)    # equal scores: the attention averages identical values


def test_sdpa_under_autocast_returns_the_autocast_dtype_on_the_cpu():
    assert A.sdpa_autocast_dtype("cpu", torch.bfloat16) == {"attn_sdpa_dtype": "`bfloat16`"}


def test_scaler_dtype_note_runs_the_loops_in_fp16_and_refuses_bf16():
    assert A.scaler_dtype_note(torch.float16, "cuda") == {"scaler_dtype_note": "Here they run with FP16 autocast, as there."}
    assert A.scaler_dtype_note(torch.float16, "cpu")["scaler_dtype_note"] == (
        "Here they run with FP16 autocast too, on this CPU: they show what each mechanism does, not how fast it "
        "runs (the recipe table above measured this machine's speeds).")
    with pytest.raises(ValueError, match="BF16 needs no scaler"):
        A.scaler_dtype_note(torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="loop_dtype"):
        A.scaler_dtype_note(torch.float32, "cpu")


def test_sdpa_backends_on_the_cpu_include_math_and_name_the_pick():
    found = A.sdpa_backends("cpu", torch.float32)
    assert found["runs"]["MATH"] is True
    if found["chosen"] is not None:            # this torch names its pick: it must be one that ran
        assert found["runs"][found["chosen"]] is True
    facts = A.sdpa_backend_facts({"runs": {"FLASH_ATTENTION": True, "EFFICIENT_ATTENTION": False, "MATH": True},
                                  "chosen": "FLASH_ATTENTION"})
    assert facts == {"attn_backends_run": "`FLASH_ATTENTION` and `MATH`", "attn_backend_chosen": "`FLASH_ATTENTION`",
                     "attn_backend_inputs": "`sdpa_backends`' causal inputs"}
    assert A.sdpa_backend_facts({"runs": {"MATH": True}, "chosen": None}) == {
        "attn_backends_run": "`MATH`", "attn_backend_chosen": "a kernel this torch does not name",
        "attn_backend_inputs": "`sdpa_backends`' causal inputs"}
    # the inputs it built are said from the result, not typed
    found = A.sdpa_backends("cpu", torch.bfloat16, head_dim=16, seq=4)
    assert (found["shape"], found["dtype"]) == ((1, 2, 4, 16), "bfloat16")
    assert A.sdpa_backend_facts(found)["attn_backend_inputs"] == (
        "`sdpa_backends`' causal `bfloat16` inputs: a batch of 1, two heads of 4 positions, head dimension 16")
    with pytest.raises(ValueError, match="head_dim must be a positive int"):
        A.sdpa_backends("cpu", torch.float32, head_dim=0)
    with pytest.raises(ValueError, match="no attention kernel ran"):
        A.sdpa_backend_facts({"runs": {"MATH": False}, "chosen": None})


def test_sdpa_backend_table_marks_what_ran_and_the_pick():
    table = A.sdpa_backend_table({"runs": {"FLASH_ATTENTION": True, "EFFICIENT_ATTENTION": False, "MATH": True},
                                  "chosen": "FLASH_ATTENTION"})
    assert table.splitlines() == ["| kernel | ran on these inputs | torch's pick when left to choose |",
                                  "|---|---|---|", "| `FLASH_ATTENTION` | yes | yes |",
                                  "| `EFFICIENT_ATTENTION` | no | no |", "| `MATH` | yes | no |"]
    # a torch that does not name its pick: "-", not "no"
    assert A.sdpa_backend_table({"runs": {"MATH": True}, "chosen": None}).splitlines()[2:] == ["| `MATH` | yes | - |"]
    with pytest.raises(ValueError, match="non-empty 'runs' mapping"):
        A.sdpa_backend_table({"runs": {}})


def test_math_backend_fp16_facts_say_what_the_flag_changes():
    assert A.math_backend_fp16_facts(False, [True, False]) == {"attn_math_fp16": (
        "`fp16_bf16_reduction_math_sdp_allowed()` returned `False`, so by default the math backend computes FP16 "
        "inputs in FP32; with the flag off it stayed finite although the scaled product is twice FP16's largest "
        "value, and with it on it overflowed. With the flag off, FP16 inputs get FP32's range; the order of the "
        "scale matters for FP32 inputs, and for FP16 ones only with the flag on")}
    assert "does not show what the flag changes" in A.math_backend_fp16_facts(False, [True, True])["attn_math_fp16"]
    with pytest.raises(TypeError, match="two bools"):
        A.math_backend_fp16_facts(False, [True])
    with pytest.raises(TypeError, match="flag_default must be a bool"):
        A.math_backend_fp16_facts(0, [True, False])


def test_torchs_math_backend_computes_fp16_in_fp32_unless_the_flag_allows_fp16():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    d = 64
    big = torch.full((1, 1, 4, d), (2 * 65504.0 * d ** 0.5 / d) ** 0.5, dtype=torch.float16)
    flag, finite = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed(), []
    try:
        for reduced in (False, True):
            torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(reduced)
            with sdpa_kernel(SDPBackend.MATH):
                out = torch.nn.functional.scaled_dot_product_attention(big, big, big)
            finite.append(bool(torch.isfinite(out).all()))
    finally:
        torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(flag)
    assert flag is False and finite == [True, False]


def test_pure_master_sentence_says_how_far_apart_the_two_ended():
    def run(*losses):
        return types.SimpleNamespace(losses=list(losses))

    note = A.pure_master_sentence({"bf16_pure": run(3.0, 2.75, 2.5), "bf16_master": run(3.0, 2.625, 2.48),
                                   "fp32": run(1.0)})
    assert note == ("In the 3-step runs above, `bf16_pure` and `bf16_master` differed by up to 0.125 in loss (at "
                    "step 1) and by 0.020 at the last step, so the last step alone says little. The effect of the "
                    "master weights needs small updates late in training, which a run this short does not reach.")
    assert A.pure_master_sentence({"bf16_pure": run(3.0)}) == ""                # bf16_master did not run
    assert A.pure_master_sentence({"bf16_pure": run(), "bf16_master": run(1.0)}) == ""


def test_accumulator_facts_read_both_runs():
    from course_lib.amp import AccumulatorDemo

    short = AccumulatorDemo("bfloat16", "float32", 64, 0.003, 0.0102, 1.8e-7)
    long = AccumulatorDemo("bfloat16", "float32", 256, 0.0027, 0.0189, 3e-7)
    facts = A.accumulator_facts(short, long)
    assert facts == {"ex_buf_dtype": "`float32`", "ex_buf_low": "`bfloat16`", "ex_buf_steps": 64,
                     "ex_buf_steps_long": 256, "ex_buf_fp32_buffer": pytest.approx(0.3),
                     "ex_buf_low_buffer": pytest.approx(1.02), "ex_buf_fp32": pytest.approx(1.8e-5),
                     "ex_buf_ratio": pytest.approx(3.4),
                     "ex_buf_growth": "The gap widens with the run's length: over 256 products the bfloat16 buffer "
                                      "is 1.89% off and the FP32 buffer 0.27%. A low-precision running sum loses "
                                      "more the longer it runs, since each add rounds a larger sum."}
    flat = AccumulatorDemo("bfloat16", "float32", 256, 0.0027, 0.011, 3e-7)
    assert A.accumulator_facts(short, flat)["ex_buf_growth"] == (
        "Here the run's length changed little: over 256 products the bfloat16 buffer is 1.10% off and the FP32 "
        "buffer 0.27%.")
    with pytest.raises(ValueError, match="must add more products"):
        A.accumulator_facts(long, short)
    with pytest.raises(TypeError, match="two AccumulatorDemo"):
        A.accumulator_facts(short, {"steps": 256})
