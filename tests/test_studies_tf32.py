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
    assert errors["medium"] <= 2 * rounded["medium"]
    assert torch.get_float32_matmul_precision() == before
    with pytest.raises(ValueError, match="n must be a positive int"):
        T.matmul_precision_errors("cpu", n=0)


def test_rounded_operands_differ_by_their_format_s_rounding():
    rounded = T.rounded_operand_errors("cpu", n=64)
    # BF16 keeps 7 stored mantissa bits, TF32 10: BF16's product differs about 8 times as much
    assert 1e-4 < rounded["medium"] < 0.05 and 2 < rounded["medium"] / rounded["high"] < 32
    with pytest.raises(ValueError, match="n must be a positive int"):
        T.rounded_operand_errors("cpu", n=True)


ROUNDED = {"high": 4e-4, "medium": 4e-3}


def test_precision_phrase_judges_each_setting_against_a_product_in_its_format():
    same = T.precision_phrase({"highest": 0.0, "high": 0.0, "medium": 0.0}, ROUNDED)
    assert isinstance(same, Prose)
    assert same.startswith('"high" gives the same bits as "highest" (a product of TF32-rounded operands '
                           "differs by 4.0e-04): this device's kernel computed full FP32 products under it")
    used = T.precision_phrase({"high": 3e-4, "medium": 4e-3}, ROUNDED)
    assert ('"high" moves the product by up to 3.0e-04 of its largest entry, of the order of a product of '
            "TF32-rounded operands differs by 4.0e-04 (0.75 times that): consistent with TF32 products") in used
    assert "consistent with BF16 products" in used
    # the CPU the review read: "medium" moved the product by 6.3e-07, far below BF16's 4.3e-03
    unused = T.precision_phrase({"high": 0.0, "medium": 6.3e-7}, {"high": 5e-4, "medium": 4.3e-3})
    assert unused.endswith("far less than a product of BF16-rounded operands differs by 4.3e-03: the setting "
                           "allows BF16 inside the product, but this device's kernel did not compute BF16 "
                           "products here (a difference that small comes from another kernel: another "
                           "summation order, or each FP32 operand split into several BF16 parts)")
    assert "BF16 products)" not in unused
    with pytest.raises(ValueError, match="both give the settings"):
        T.precision_phrase({"high": 0.0}, ROUNDED)
    with pytest.raises(ValueError, match="match"):
        T.precision_phrase({"high": 0.0, "medium": 0.0}, ROUNDED, match=1.5)


def test_precision_table_sets_each_setting_beside_its_format_s_product():
    table = T.precision_table({"highest": 0.0, "high": 0.0, "medium": 6.3e-7}, ROUNDED)
    assert table.splitlines()[2:] == ["| `highest` | full FP32 only | none | - |",
                                      "| `high` | TF32 | none | 4.0e-04 |", "| `medium` | BF16 | 6.3e-07 | 4.0e-03 |"]
    with pytest.raises(ValueError, match="unknown matmul precision"):
        T.precision_table({"low": 0.0, "high": 0.0, "medium": 0.0}, ROUNDED)


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
