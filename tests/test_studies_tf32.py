"""TF32 and the float32 matmul precision switch (course_lib.studies.tf32): the measurement on the CPU, the
phrases from errors given by hand, and the recorded note from a study built by hand."""

import pytest
import torch

from course_lib.glue import Prose
from course_lib.results import Provenance, Record, RecordedResult
from course_lib.studies import tf32 as T
from course_lib.studies.performance import RecipeRun, ThroughputStudy


def test_the_measurement_compares_each_setting_with_highest_and_restores_the_setting():
    before = torch.get_float32_matmul_precision()
    errors = T.matmul_precision_errors("cpu", n=64)
    assert list(errors) == ["highest", "high", "medium"] and errors["highest"] == 0.0
    assert torch.get_float32_matmul_precision() == before
    assert errors["high"] == 0.0        # a CPU has no TF32: "high" changes no bit
    # "medium" may change the kernel (oneDNN), but never by more than BF16-rounded operands would
    rounded = T.rounded_operand_errors("cpu", n=64)
    assert errors["medium"] <= 2 * rounded["BF16"]
    assert torch.get_float32_matmul_precision() == before
    with pytest.raises(ValueError, match="n must be a positive int"):
        T.matmul_precision_errors("cpu", n=0)


def test_rounded_operands_differ_by_their_format_s_rounding():
    rounded = T.rounded_operand_errors("cpu", n=64)
    # BF16 keeps 7 stored mantissa bits, TF32 10: BF16's product differs about 8 times as much
    assert list(rounded) == ["TF32", "BF16"]
    assert 1e-4 < rounded["BF16"] < 0.05 and 2 < rounded["BF16"] / rounded["TF32"] < 32
    with pytest.raises(ValueError, match="n must be a positive int"):
        T.rounded_operand_errors("cpu", n=True)


def test_medium_allows_tf32_on_cuda_and_bf16_only_on_onednn_read_back_from_torch():
    before = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.fp32_precision,
              torch.backends.mkldnn.matmul.fp32_precision)
    # torch 2.13's own mapping, read back: on NVIDIA GPUs "medium" is "high" (TF32)
    assert T.backend_precisions("medium") == {"cuda": "tf32", "mkldnn": "bf16"}
    assert T.backend_precisions("highest") == {"cuda": "ieee", "mkldnn": "ieee"}
    assert (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.fp32_precision,
            torch.backends.mkldnn.matmul.fp32_precision) == before
    allowed = T.allowed_formats()
    assert allowed == {"highest": {"cuda": "FP32", "mkldnn": "FP32"}, "high": {"cuda": "TF32", "mkldnn": "TF32"},
                       "medium": {"cuda": "TF32", "mkldnn": "BF16"}}
    assert T.medium_phrase(allowed) == ('"medium" allows TF32 in CUDA (cuBLAS) products, as "high" does, and '
                                        "BF16 in CPU (oneDNN) products: on NVIDIA GPUs \"medium\" behaves as \"high\" does "
                                        "(TF32, not BF16)")
    bf16_gpu = {**allowed, "medium": {"cuda": "BF16", "mkldnn": "BF16"}}
    assert T.medium_phrase(bf16_gpu) == '"medium" allows BF16 in CUDA (cuBLAS) products, and BF16 in CPU (oneDNN) products'
    assert T.device_backend("cpu") == "mkldnn" and T.device_backend(torch.device("cuda", 0)) == "cuda"
    with pytest.raises(ValueError, match="precision must be one of"):
        T.backend_precisions("low")
    with pytest.raises(ValueError, match="CUDA device or the CPU"):
        T.device_backend("meta")
    with pytest.raises(ValueError, match="allowed must give 'medium'"):
        T.medium_phrase({"high": allowed["high"]})


ALLOWED = {"highest": {"cuda": "FP32", "mkldnn": "FP32"}, "high": {"cuda": "TF32", "mkldnn": "TF32"},
           "medium": {"cuda": "TF32", "mkldnn": "BF16"}}
ROUNDED = {"TF32": 4e-4, "BF16": 4e-3}


def test_precision_phrase_judges_each_setting_against_a_product_in_its_backend_s_format():
    same = T.precision_phrase({"highest": 0.0, "high": 0.0, "medium": 0.0}, ROUNDED, ALLOWED, "mkldnn")
    assert isinstance(same, Prose)
    assert same.startswith('"high" gives the same bits as "highest" (where a product of TF32-rounded operands '
                           "differs by 4.0e-04): this device's kernel computed full FP32 products under it")
    used = T.precision_phrase({"high": 3e-4, "medium": 4e-3}, ROUNDED, ALLOWED, "mkldnn")
    assert ('"high" moves the product by up to 3.0e-04 of its largest entry, 0.75 times the 4.0e-04 by which a '
            "product of TF32-rounded operands differs: consistent with TF32 products") in used
    assert "consistent with BF16 products" in used
    # a difference the size of the rounded product's is said to be about it, not "1 times" it
    near = T.precision_phrase({"high": 4.1e-4, "medium": 4e-3}, ROUNDED, ALLOWED, "mkldnn")
    assert '"high" moves the product by up to 4.1e-04 of its largest entry, about the 4.0e-04 by which' in near
    # on a GPU "medium" allows TF32, as "high" does: it is judged against TF32's product, never BF16's
    gpu = T.precision_phrase({"high": 3e-4, "medium": 3e-4}, ROUNDED, ALLOWED, "cuda")
    assert "BF16" not in gpu and gpu.count("consistent with TF32 products") == 2
    # the CPU the review read: "medium" moved the product by 6.3e-07, far below BF16's 4.3e-03
    unused = T.precision_phrase({"high": 0.0, "medium": 6.3e-7}, {"TF32": 5e-4, "BF16": 4.3e-3}, ALLOWED, "mkldnn")
    assert unused.endswith("far less than the 4.3e-03 by which a product of BF16-rounded operands differs: the setting "
                           "allows BF16 inside the product, but this device's kernel did not compute BF16 "
                           "products here (a difference that small comes from another kernel: another "
                           "summation order, or each FP32 operand split into several BF16 parts)")
    assert "BF16 products)" not in unused
    with pytest.raises(ValueError, match="both give the settings"):
        T.precision_phrase({"high": 0.0}, ROUNDED, ALLOWED, "cuda")
    with pytest.raises(ValueError, match="rounded must give the formats"):
        T.precision_phrase({"high": 0.0, "medium": 0.0}, {"TF32": 4e-4}, ALLOWED, "mkldnn")
    with pytest.raises(ValueError, match="backend must be one of"):
        T.precision_phrase({"high": 0.0, "medium": 0.0}, ROUNDED, ALLOWED, "xpu")
    with pytest.raises(ValueError, match="match"):
        T.precision_phrase({"high": 0.0, "medium": 0.0}, ROUNDED, ALLOWED, "cuda", match=1.5)


def test_precision_table_gives_each_backend_its_own_format():
    errors = {"highest": 0.0, "high": 0.0, "medium": 6.3e-7}
    table = T.precision_table(errors, ROUNDED, ALLOWED, "mkldnn")
    assert table.splitlines()[0] == ('| setting | CUDA (cuBLAS) allows | CPU (oneDNN) allows | measured difference '
                                     'from "highest" here | a product in the format CPU (oneDNN) allows differs by |')
    assert table.splitlines()[2:] == ["| `highest` | full FP32 only | full FP32 only | none | - |",
                                      "| `high` | TF32 | TF32 | none | TF32: 4.0e-04 |",
                                      "| `medium` | TF32 | BF16 | 6.3e-07 | BF16: 4.0e-03 |"]
    assert T.precision_table(errors, ROUNDED, ALLOWED, "cuda").splitlines()[-1] == \
        "| `medium` | TF32 | BF16 | 6.3e-07 | TF32: 4.0e-04 |"
    with pytest.raises(ValueError, match="unknown matmul precision"):
        T.precision_table({"low": 0.0, "high": 0.0, "medium": 0.0}, ROUNDED, ALLOWED, "cuda")


def _run(recipe, seconds, compiled=False, seed=0):
    return RecipeRun(recipe, seed, compiled, (3.0, 2.0), (1.0, seconds, seconds), 100, 1)


def _record(runs):
    provenance = Provenance("NVIDIA H100 80GB HBM3", "cuda", "2.11", "2026-01-01T00:00:00+00:00", "cmd", "abc", "3.12",
                            compute_capability="9.0", cuda_version="13.0")
    study = ThroughputStudy("cuda", tuple(runs), 1e9, {}, "")
    return RecordedResult(Record("training_throughput", {}, {}, provenance, schema_version=2), study)


def test_tf32_recorded_note_calls_a_tie_a_tie():
    # tokens/s: fp32 100/0.5 = 200, tf32 400, bf16 404 eager (a tie); compiled tf32 500, bf16 800
    rec = _record([_run("fp32", 0.5), _run("tf32", 0.25), _run("bf16_autocast", 100 / 404),
                   _run("tf32", 0.2, True), _run("bf16_autocast", 0.125, True)])
    note = T.tf32_recorded_note(rec)
    assert note.startswith(f"On the recorded **{rec.label}**, TF32 alone ran 2.00 times as many tokens")
    assert "; eager, BF16 autocast tied TF32 (1.01x its token rate; one seed per recipe, so no seed noise was " \
           "measured for it); compiled, BF16 autocast was faster than TF32 (1.60x its token rate; one seed per " \
           "recipe, so no seed noise was measured for it)." in note
    # three seeds eager, one compiled (the H100 record's shape): each ratio says what stands behind it
    three = _record([_run("fp32", 0.5), *(_run("tf32", 0.25, seed=s) for s in range(3)),
                     *(_run("bf16_autocast", 0.2, seed=s) for s in range(3)),
                     _run("tf32", 0.2, True), _run("bf16_autocast", 0.125, True)])
    assert "(1.25x its token rate; medians over 3 seeds per recipe)" in T.tf32_recorded_note(three)
    assert "(1.60x its token rate; one seed per recipe" in T.tf32_recorded_note(three)
    mixed = _record([_run("fp32", 0.5), _run("tf32", 0.25), _run("tf32", 0.25, seed=1), _run("bf16_autocast", 0.2)])
    assert "medians over 2 and 1 seeds: one seed has no seed noise measured)" in T.tf32_recorded_note(mixed)
    assert T.tf32_recorded_note(_record([_run("fp32", 0.5), _run("bf16_autocast", 0.25)])) == ""
    with pytest.raises(ValueError, match="tie must lie"):
        T.tf32_recorded_note(rec, tie=1.0)


def test_format_facts_come_from_the_format_table():
    assert T.format_facts() == {"tf32_exp_bits": 8, "tf32_man_bits": 10, "fp32_man_bits": 23}
