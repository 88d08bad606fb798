import pytest
import torch
import torch.nn.functional as F

from course_lib.amp import autocast_op_lists, classify, cuda_policy, trace_autocast


def test_tracer_sees_the_dtypes_autocast_chose():
    a = torch.randn(8, 8)
    b = torch.randn(8, 8, requires_grad=True)

    def step():
        h = a @ b                                  # autocast: lower precision
        s = torch.softmax(h, dim=-1)               # CPU: stays in its input's dtype
        n = F.layer_norm(h.float(), (8,))          # explicit FP32 input stays FP32
        return (s.float().sum() + n.sum())

    trace = trace_autocast(step, device_type="cpu", dtype=torch.bfloat16)
    assert trace.dtype_of("mm") == ("bfloat16",)
    assert trace.dtype_of("_softmax") == ("bfloat16",)
    assert trace.dtype_of("native_layer_norm")[0] == "float32"
    assert any(e.phase == "backward" for e in trace.events)
    rows = {r["op"]: r for r in trace.op_table()}
    assert rows["mm"]["runs_in"] == "low precision" and rows["_to_copy"]["runs_in"] == "cast"
    with pytest.raises(ValueError, match="did not run"):
        trace.dtype_of("conv2d")


def test_tracer_bad_input():
    with pytest.raises(ValueError, match="autocast dtype"):
        trace_autocast(lambda: None, dtype=torch.float32)
    with pytest.raises(ValueError, match="device_type"):
        trace_autocast(lambda: None, device_type="tpu")
    with pytest.raises(ValueError, match="scalar loss"):
        trace_autocast(lambda: torch.ones(3, requires_grad=True) * 2)


def test_cuda_lists_from_the_installed_header():
    lists = autocast_op_lists()
    assert {"mm", "linear", "bmm", "addmm"} <= lists["lower precision"]
    assert {"exp", "layer_norm", "mse_loss"} <= lists["fp32"]
    assert {"softmax", "sum", "log_softmax"} <= lists["fp32 (via dtype argument)"]
    assert {"addcmul", "dot", "index_put"} <= lists["promote"]
    assert cuda_policy("_softmax", lists) == "fp32 (via dtype argument)"
    assert cuda_policy("native_layer_norm", lists) == "fp32"
    assert cuda_policy("view", lists) == "-"
    assert cuda_policy("nll_loss_forward", lists) == cuda_policy("nll_loss", lists) == "fp32"


def test_cpu_autocast_runs_the_loss_in_fp32_through_cross_entropy_not_log_softmax():
    # lesson 4: the course model's loss is FP32 on the CPU because cross_entropy is on CPU autocast's FP32 list
    import torch.nn.functional as F

    logits, target = torch.randn(4, 8).bfloat16(), torch.randint(0, 8, (4,))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.log_softmax(logits, -1).dtype == torch.bfloat16
        assert F.cross_entropy(logits, target).dtype == torch.float32
    assert classify("add", ("float32", "bfloat16"), ("float32",)) == "fp32"
    with pytest.raises(FileNotFoundError):
        autocast_op_lists("/nonexistent/autocast_mode.h")


def test_a_hand_written_norm_needs_the_disabled_region():
    from course_lib.amp import autocast_op_lists, cuda_policy, fp16_square_limit, sensitive_norm_demo

    limit = fp16_square_limit()
    below = torch.tensor(limit, dtype=torch.float16).nextafter(torch.tensor(0.0, dtype=torch.float16))
    assert limit == 256.0 and torch.isfinite(below * below) and limit**2 > torch.finfo(torch.float16).max

    r = sensitive_norm_demo("cpu")
    assert r["activations dtype"] == "float16" and r["naive norm dtype"] == "float16"
    # every row holding a value whose FP16 square overflows is zeroed, and only those rows
    assert 0 < r["rows the naive norm set to zero"] == r["rows holding a value of that size or more"] < r["rows"]
    assert r["largest error, naive"] > 1 and r["largest error, in autocast(enabled=False)"] < 1e-6
    # the demo holds on a GPU too: none of its ops is on CUDA's lists (exp, sum and log would be)
    lists = autocast_op_lists()
    assert [cuda_policy(op, lists) for op in ("mul", "mean", "sqrt", "div")] == ["-"] * 4
    assert cuda_policy("exp", lists) != "-"
    # lesson 4's sentence: torch's own norms are on the FP32 list, and pow (its exercise) too
    assert [cuda_policy(op, lists) for op in ("rms_norm", "layer_norm", "pow")] == ["fp32"] * 3
    with pytest.raises(ValueError, match="rows must be a positive int"):
        sensitive_norm_demo("cpu", rows=0)


def test_exceptions_custom_function_and_checkpointing():
    from course_lib.amp import autocast_exceptions, checkpointing_demo, custom_function_demo

    ex = autocast_exceptions("cpu", torch.bfloat16)
    assert ex["a @ b (eligible op)"] == "bfloat16"
    assert ex["acc.add_(a @ b) (in-place into FP32)"] == "float32"
    assert ex["torch.mm(a, b, out=out)"] == "float32"
    assert ex["a.double() @ b.double()"] == "float64"
    # an explicit dtype= argument is honoured; .float() on a listed op's inputs is lowered again
    assert ex["torch.sum(a @ b, dtype=torch.float64)"] == "float64"
    assert ex["h.float() @ b, h = a @ b (cast up, lowered again)"] == "bfloat16"
    assert not any(k.startswith("torch.ones") for k in ex)
    assert ex["a @ b inside autocast(enabled=False)"] == "float32"
    custom = custom_function_demo("cpu", torch.bfloat16)
    assert list(custom) == ["activation before the op", "input inside forward (after cast_inputs)",
                            "autocast inside forward", "op output", "backward grad", "autocast inside backward"]
    assert custom["input inside forward (after cast_inputs)"] == "float32"
    assert custom["autocast inside forward"] == "False"
    assert custom["activation before the op"] == "bfloat16" and custom["op output"] == "float32"
    # custom_bwd runs the backward with the forward's autocast state: off, under cast_inputs
    assert custom["autocast inside backward"] == "False" and custom["backward grad"] == "float32"
    assert checkpointing_demo("cpu")["identical gradients"] is True


def test_amp_tables_have_one_row_per_op():
    import torch

    from course_lib.amp import autocast_op_lists, op_table_markdown, sensitive_ops_markdown
    from course_lib.studies.amp import trace_course_model

    lists = autocast_op_lists()
    trace = trace_course_model("cpu", torch.bfloat16)
    lines = op_table_markdown(trace, "forward", lists).splitlines()
    rows = trace.op_table("forward")
    # one line per dtype pattern: an op with several shows each, with its own calls
    assert lines[0].startswith("| op | calls |") and len(lines) == 2 + sum(len(r["patterns"]) for r in rows)
    assert len(lines) > 2 + len(rows)
    assert "| `_to_copy` (also) | 1 | bfloat16 | float32 | cast | - |" in lines      # the logits cast back up
    assert "| `add` (also) | 1 | float32, float32 | float32 | fp32 | - |" in lines
    assert all(r["calls"] == sum(c for _, _, c in r["patterns"]) for r in rows)
    with pytest.raises(TypeError, match="trace must be an AutocastTrace"):
        op_table_markdown(rows, "forward", lists)
    with pytest.raises(ValueError, match="phase must be"):
        trace.op_table("sideways")
    live = {"matmul output": "torch.bfloat16", "softmax": "torch.bfloat16"}
    table = sensitive_ops_markdown(live, "cpu", lists, recorded={"softmax": "torch.float32"}, recorded_label="GPU X")
    rows = table.splitlines()
    assert rows[0].endswith("recorded on GPU X |") and rows[2].endswith("| - |") and "torch.float32" in rows[3]
    assert "recorded on" not in sensitive_ops_markdown(live, "cpu", lists).splitlines()[0]


def test_fp32_accumulator_keeps_its_dtype_but_not_more_than_its_increments_precision():
    from course_lib.amp import fp32_accumulator_demo

    demo = fp32_accumulator_demo("cpu", torch.bfloat16, steps=16, size=8, seed=3)
    assert (demo.dtype, demo.acc_dtype, demo.steps) == ("bfloat16", "float32", 16)
    # FP32 throughout is exact to FP32's rounding; the FP32 buffer holds BF16-rounded products (about 2**-9
    # relative each); a BF16 buffer also rounds the running sum
    assert demo.error_fp32 < 1e-6 < 1e-4 < demo.error_fp32_buffer < demo.error_low_buffer
    # the FP32 buffer's sum is, bit for bit, the FP32 sum of the products autocast rounded to BF16
    g = torch.Generator().manual_seed(3)
    a, b = (torch.randn(16, 8, 8, generator=g) for _ in range(2))
    exact = (a.double() @ b.double()).sum(0)
    acc = torch.zeros(8, 8)
    for i in range(16):
        acc += (a[i].bfloat16() @ b[i].bfloat16()).float()
    rms = lambda t: float(t.pow(2).mean().sqrt())  # noqa: E731
    assert rms(acc.double() - exact) / rms(exact) == demo.error_fp32_buffer
    with pytest.raises(ValueError, match="dtype must be torch.float16 or torch.bfloat16"):
        fp32_accumulator_demo("cpu", torch.float32)
    with pytest.raises(ValueError, match="steps must be a positive int"):
        fp32_accumulator_demo("cpu", torch.bfloat16, steps=0)
