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
    # "medium" may use BF16 products (oneDNN on CPUs with BF16 matrix units): then within BF16's rounding
    assert errors["medium"] == 0.0 or 1e-4 < errors["medium"] < 0.05
    with pytest.raises(ValueError, match="n must be a positive int"):
        T.matmul_precision_errors("cpu", n=0)


def test_precision_phrase_says_same_bits_or_the_difference():
    same = T.precision_phrase({"highest": 0.0, "high": 0.0, "medium": 0.0})
    assert isinstance(same, Prose)
    assert same == ('"high" gives the same bits as "highest" (this device has no TF32 path for FP32 products); '
                    '"medium" gives the same bits as "highest" (this device has no BF16 path for FP32 products)')
    moved = T.precision_phrase({"high": 1e-3, "medium": 4e-3})
    assert moved == ('"high" moves the product by up to 1.0e-03 of its largest entry (TF32 products); "medium" '
                     'moves the product by up to 4.0e-03 of its largest entry (BF16 products)')
    with pytest.raises(ValueError, match="lack the settings"):
        T.precision_phrase({"high": 0.0})


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


def test_precision_table_names_what_each_setting_allows():
    assert T.precision_table({"highest": 0.0, "high": 0.0, "medium": 0.0026}).splitlines()[2:] == [
        "| `highest` | full FP32 | none |", "| `high` | TF32 (or better) | none |",
        "| `medium` | BF16 (or better) | 2.6e-03 of the largest entry |"]
    with pytest.raises(ValueError, match="unknown matmul precision settings"):
        T.precision_table({"low": 0.0})


def test_format_facts_come_from_the_format_table():
    assert T.format_facts() == {"tf32_exp_bits": 8, "tf32_man_bits": 10, "fp32_man_bits": 23}
