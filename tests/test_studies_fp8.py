"""Lesson 7's facts, phrases, tables and errata (course_lib.studies.fp8_prose) and the small studies the lesson
calls (course_lib.studies.fp8), each against results built by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from torch import nn

from course_lib import tables
from course_lib.fp8 import QuantizationError
from course_lib.fp8.accumulation import AccumulationStudy
from course_lib.fp8.roofline import Fp8LinearEstimate, predict_fp8_linear
from course_lib.glue import Prose, count_word
from course_lib.hardware import DATASHEET_PEAKS, GPUPeaks
from course_lib.results import Provenance, Record, RecordedResult
from course_lib.device import SizeProfile
from course_lib.studies import fp8 as fp8_studies
from course_lib.studies import fp8_prose, training_prose
from course_lib.studies.fp8 import Fp8LinearSpeed, Fp8Training, LinearTensors, OutlierSweep, ScalingLab, SpikeRun
from course_lib.studies.performance import MatmulPointSummary, MatmulThroughput
from course_lib.tables import MarkdownTable

COURSE = "FP8 course layer (_scaled_mm, tensorwise, eager)"


def qe(relative_error: float, *, flushed: float = 0.0, bits: float = 5.0, saturated: float = 0.0):
    return QuantizationError("r", relative_error, saturated, flushed, bits, 16)


def gpu(bf16: float | None = 100.0, fp8: float | None = 250.0) -> GPUPeaks:
    return GPUPeaks("Test GPU", "9.0", {"fp32": 10.0, "tf32": None, "bf16": bf16, "fp16": bf16, "fp8": fp8},
                    1000.0, "test")


def training(curves: dict[str, tuple[tuple[float, ...], ...]], steps: int = 12) -> Fp8Training:
    return Fp8Training(tuple(curves), (0, 1, 2), steps, 32, curves)


def flat(*finals: float, length: int = 16, peak: float | None = None) -> tuple[tuple[float, ...], ...]:
    """Constant loss curves (one per seed) ending at ``finals``; with ``peak``, the first seed's step 10."""
    runs = [[f] * length for f in finals]
    if peak is not None:
        runs[0][10] = peak
    return tuple(tuple(r) for r in runs)


# ---- formats and tensors --------------------------------------------------------------------------------

def test_format_facts_are_e4m3_and_e5m2s_limits():
    facts = fp8_prose.format_facts()
    assert facts["e4m3_max"] == 448.0 and facts["e5m2_max"] == 57344.0
    assert facts["e4m3_tiny"] == 2.0 ** -9 and facts["e5m2_tiny"] == 2.0 ** -16
    assert facts["e4m3_eps"] == 0.125 and facts["e5m2_eps"] == 0.25
    assert facts["e4m3_binades"] == pytest.approx(math.log2(448 / 2 ** -9), rel=1e-12)
    assert facts["e5m2_binades"] == pytest.approx(math.log2(57344 / 2 ** -16), rel=1e-12)
    # written exactly, in superscript digits: glued Markdown renders no $-math
    assert (facts["e4m3_tiny_text"], facts["e4m3_eps_text"], facts["e5m2_eps_text"]) == ("2⁻⁹", "2⁻³", "2⁻²")
    assert isinstance(facts["e5m2_tiny_text"], Prose) and facts["e5m2_tiny_text"] == "2⁻¹⁶"
    assert not any("$" in str(v) for v in facts.values())
    assert len(facts) == 12


def test_describe_tensors_lines():
    t = {"a": torch.tensor([[0.0, 1.0], [-3.0, 2.0]]), "bb": torch.tensor([4.0])}
    assert fp8_studies.describe_tensors(t, name_width=3) == (
        "a   shape (2, 2)  median |x| 1.00e+00  max |x| 3.00e+00\n"
        "bb  shape (1,)  median |x| 4.00e+00  max |x| 4.00e+00")
    # zeros left out: the median of 1, 2, 3 is 2; the order of the statistics follows ``stats``
    assert fp8_studies.describe_tensors({"a": t["a"]}, name_width=1, stats=("max", "median"), nonzero_only=True) == (
        "a shape (2, 2)  max |x| 3.00e+00  median |x| 2.00e+00")


@pytest.mark.parametrize("kwargs, match", [({"tensors": {}}, "at least one"),
                                           ({"stats": ("mean",)}, "stats"), ({"stats": ()}, "stats")])
def test_describe_tensors_refuses_bad_input(kwargs, match):
    args = {"tensors": {"a": torch.ones(2)}, "name_width": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        fp8_studies.describe_tensors(**args)
    with pytest.raises(TypeError, match="not a tensor"):
        fp8_studies.describe_tensors({"a": [1.0]}, name_width=2)


def test_tensor_facts():
    grad = torch.tensor([[1e-4, 1e-3], [1.0, 2e-3]])     # two of four below E4M3's 2**-9 = 0.00195
    t = LinearTensors("blocks.0.fc", 30, torch.ones(2, 2), torch.ones(2, 2), grad, (1.0,))
    assert fp8_prose.tensor_facts(t) == {"lab_steps": 30, "lab_layer": "blocks.0.fc",
                                         "grad_median": float(torch.tensor(1e-3)), "grad_below_e4m3": 50.0}


def test_lab_facts():
    errors = {
        "activation": {"no scaling (E4M3)": qe(0.9), "per tensor, E4M3": qe(0.02), "per tensor, E5M2": qe(0.04),
                       "1 x 32 tiles, E4M3": qe(0.01)},
        "gradient": {"no scaling (E4M3)": qe(1.0, flushed=1.0), "per tensor, E4M3": qe(0.03, flushed=0.25, bits=5.25),
                     "per tensor, E5M2": qe(0.05, bits=4.5), "1 x 32 tiles, E4M3": qe(0.0625)},
    }
    lab = ScalingLab(("activation", "gradient"), tuple(errors["gradient"]), errors)
    assert fp8_prose.lab_facts(lab) == {
        "lab_grad_flushed_unscaled": 100.0, "lab_grad_flushed_scaled": 25.0, "lab_e4m3_err": 100 * 0.03,
        "lab_e5m2_err": 100 * 0.05, "lab_bits_e4m3": 5.25, "lab_bits_e5m2": 4.5,
        "lab_fine_lo": 100 * 0.01, "lab_fine_hi": 6.25}


def sweep() -> OutlierSweep:
    flushed = {"per tensor, E4M3": (0.0, 0.125, 0.5), "per row (token), E4M3": (0.0, 0.0, 0.25),
               "per column (channel), E4M3": (0.0, 0.0, 0.0), "1 x 32 tiles, E4M3": (0.0, 0.0, 0.0625)}
    return OutlierSweep(0, (1.0, 1e3, 1e5), {k: (0.0, 0.0, 0.0) for k in flushed}, flushed)


def test_outlier_facts():
    assert fp8_prose.outlier_facts(sweep(), 32) == {"out_factor_1e3": 1e3, "out_factor_1e5": 1e5,
                                                    "out_tensor_1e3": 12.5, "out_tensor_1e5": 50.0,
                                                    "out_row_1e5": 25.0, "out_tile_1e5": 6.25, "out_col_1e5": 0.0}
    short = OutlierSweep(0, (1.0, 1e3), {}, {})
    with pytest.raises(ValueError, match="no factor 100000"):
        fp8_prose.outlier_facts(short, 32)


def spike_run(spike_at: int = 2, keys=("current", "delayed, max of 2", "delayed, most recent")) -> SpikeRun:
    #          step:  0     1     2 (spike)  3     4     5
    rel = {"current": (0.02, 0.02, 0.03, 0.02, 0.02, 0.02),
           "delayed, max of 2": (0.02, 0.0625, 0.75, 0.125, 0.5, 0.02),
           "delayed, most recent": (0.0,) * 6}
    sat = {"current": (0.0, 0.0, 0.0, 0.0, 0.0, 0.0), "delayed, max of 2": (0.0, 0.0, 0.5, 0.0, 0.0, 0.0),
           "delayed, most recent": (0.0,) * 6}
    return SpikeRun(spike_at, 50.0, (1.0,) * 6, {k: sat[k] for k in keys}, {k: (0.0,) * 6 for k in keys},
                    {k: rel[k] for k in keys})


def test_spike_facts_reads_the_history_length_from_the_recipe():
    # a history of 2 holds the spike's amax for the two steps after it (3 and 4: 0.125 and 0.5), not step 5
    assert fp8_prose.spike_facts(spike_run()) == {
        "spike_bumps": "", "spike_factor": 50.0, "spike_at": 2, "spike_history": 2, "spike_sat_delayed": 50.0, "spike_err_delayed": 75.0,
        "spike_err_current": 3.0, "spike_sat_current": 0.0, "spike_after_max": 50.0, "spike_before": 6.25}


def test_recent_bumps_note_ties_each_bump_to_the_amax_growing():
    run = spike_run(spike_at=0)
    recent = "delayed, most recent"
    # steps 2..5 after the spike at 0; step 4 errs 4x the others' and its amax grew 1.2x
    bumped = dataclasses.replace(run, amax=(50.0, 1.0, 1.0, 1.0, 1.2, 1.0),
                                 relative_error={**run.relative_error, recent: (0.9, 0.9, 0.02, 0.02, 0.08, 0.02)},
                                 saturated={**run.saturated, recent: (0.0, 0.0, 0.0, 0.0, 0.001, 0.0)})
    note = fp8_prose.recent_bumps_note(bumped)
    assert note.startswith('Later, the "most recent" line\'s error rises at step 4, more than 10% above '
                           "its median (step 4: the amax grew 1.20x over the step before, and 0.10% of the values "
                           "saturated).")
    assert "too large for a tensor that has grown" in note
    assert fp8_prose.recent_bumps_note(run) == ""            # flat: nothing to explain
    with pytest.raises(ValueError, match="no recipe"):
        fp8_prose.recent_bumps_note(spike_run(keys=("current", "delayed, max of 2")))


def test_spike_facts_refuses_a_spike_without_neighbours_or_a_max_history():
    with pytest.raises(ValueError, match="step before and after"):
        fp8_prose.spike_facts(spike_run(spike_at=0))
    with pytest.raises(ValueError, match="delayed, max of N"):
        fp8_prose.spike_facts(spike_run(keys=("current", "delayed, most recent")))


def test_margin_facts_compare_the_spike_and_the_quiet_steps():
    plain = spike_run()
    key = "delayed, max of 2"
    # with a margin: nothing saturates at the spike; quiet steps (0 and 1) err 0.05 and 0.1 against 0.02 and 0.0625
    margin = dataclasses.replace(plain, saturated={**plain.saturated, key: (0.0,) * 6},
                                 relative_error={**plain.relative_error, key: (0.05, 0.1, 0.1, 0.1, 0.1, 0.1)},
                                 flushed={**plain.flushed, key: (0.01, 0.03, 0.0, 0.0, 0.0, 0.0)})
    facts = fp8_prose.margin_facts(plain, margin, 6)
    verdict = facts.pop("ex_m_verdict")
    assert facts.pop("ex_m_sat_text") == "none"
    assert facts == pytest.approx({"ex_m_margin": 6, "ex_m_sat0": 50.0, "ex_m_sat": 0.0,
                                   "ex_m_err0": 4.125, "ex_m_err": 7.5, "ex_m_flush0": 0.0, "ex_m_flush": 2.0})
    assert verdict.startswith("E4M3's range absorbs the margin")          # 7.5 <= 2 * 4.125
    worse = dataclasses.replace(margin, relative_error={**margin.relative_error, key: (0.2,) * 6})
    assert "more than doubled" in fp8_prose.margin_facts(plain, worse, 6)["ex_m_verdict"]
    same = dataclasses.replace(margin, relative_error={**margin.relative_error, key: (0.02, 0.0625, 0, 0, 0, 0)},
                               saturated={**plain.saturated, key: (0.0, 0.0, 0.00012, 0.0, 0.0, 0.0)})
    facts = fp8_prose.margin_facts(plain, same, 6)
    assert facts["ex_m_verdict"].endswith("did not change at these decimals") and facts["ex_m_sat_text"] == "0.012%"
    with pytest.raises(ValueError, match="same tensors"):
        fp8_prose.margin_facts(plain, dataclasses.replace(margin, factor=10.0), 6)
    with pytest.raises(ValueError, match="quiet steps before it"):
        fp8_prose.margin_facts(spike_run(spike_at=0), spike_run(spike_at=0), 6)


# ---- casts, backends, torchao ----------------------------------------------------------------------------

def test_cast_cost_table_and_facts():
    times = {fp8_studies.TORCH_CAST: 0.002, fp8_studies.KNOWN_SCALE_CAST: 0.003,
             fp8_studies.CURRENT_SCALING_CAST: 0.0045}
    table = fp8_prose.cast_cost_table(times)
    assert isinstance(table, MarkdownTable)
    assert table == ("|  | ms | x torch cast | x scale known |\n|---|---|---|---|\n| torch cast | 2.00 | 1.00 | 0.67 |\n"
                     "| scale known (scale, saturate, cast) | 3.00 | 1.50 | 1.00 |\n"
                     "| current scaling (amax, then cast) | 4.50 | 2.25 | 1.50 |\n")
    # both timings, each against its own yardsticks: the prose's second ratio is on the page
    both = fp8_prose.cast_cost_table(times, {**times, fp8_studies.CURRENT_SCALING_CAST: 0.0054}).splitlines()
    assert both[2] == "| torch cast, first | 2.00 | 1.00 | 0.67 |"
    assert both[-1] == "| current scaling (amax, then cast), again | 5.40 | 2.70 | 1.80 |"
    known, current = fp8_studies.KNOWN_SCALE_CAST, fp8_studies.CURRENT_SCALING_CAST
    # the known-scale cast's two timings print as 3.00 and 2.70 ms (11% apart), current scaling's as 4.50 and
    # 4.40 (2%): the noise is the larger, of the printed values, and names its cast
    facts = fp8_prose.cast_cost_facts(times, {**times, known: 0.0027, current: 0.0044}, device="cpu")
    phrase, where, note = facts.pop("cost_phrase"), facts.pop("cost_where"), facts.pop("cost_device_note")
    assert facts == pytest.approx({"cost_current": 1.5, "cost_noise": 100 / 9})
    assert phrase.startswith("takes 1.50 and 1.63 times as long as the cast with a known scale in the two timings "
                             "(the table shows both), each more than the 11% by which the two timings of either "
                             f"cast differed at most ({known}): that is the price of the extra pass")
    # torch's own cast is not in the ratio: how far its timings moved does not hide the two casts' difference
    torch_moved = fp8_prose.cast_cost_facts({**times, fp8_studies.TORCH_CAST: 0.0019},
                                            {**times, fp8_studies.TORCH_CAST: 0.0011, known: 0.00302}, device="cpu")
    assert torch_moved["cost_noise"] == pytest.approx(100 * (3.02 / 3.00 - 1))
    assert "price of the extra pass" in torch_moved["cost_phrase"]
    # a pair's percentage is the same whichever of its timings comes first
    swapped = fp8_prose.cast_cost_facts({**times, known: 0.0027, current: 0.0044}, times, device="cpu")
    assert swapped["cost_noise"] == pytest.approx(facts["cost_noise"])
    # a CPU timing says so where it is quoted, and that a GPU's cast costs differently
    assert where == "Here (on this CPU)" and isinstance(where, Prose)
    assert note.startswith("A GPU's cast is bound by memory bandwidth") and "this CPU timing" in note
    gpu_run = fp8_prose.cast_cost_facts(times, times, device=torch.device("cuda", 0))
    assert (gpu_run["cost_where"], gpu_run["cost_device_note"]) == ("Here (on this GPU)", "")
    assert fp8_prose.cast_cost_facts(times, times, device="mps")["cost_where"] == "Here (on this mps device)"
    within = fp8_prose.cast_cost_facts({**times, current: 0.00305}, {**times, known: 0.0031, current: 0.00305},
                                       device="cpu")["cost_phrase"]
    assert "does not show" in within and "price" not in within
    # beyond the noise in one timing only (1.20 against 1.05, noise 10%): no verdict
    mixed = fp8_prose.cast_cost_facts({**times, current: 0.0036}, {**times, known: 0.0033, current: 0.003465},
                                      device="cpu")["cost_phrase"]
    assert mixed.startswith("takes 1.20 and 1.05 times") and "do not settle" in mixed and "price" not in mixed
    # faster with the extra pass, beyond the 3% noise: not the pass
    faster = fp8_prose.cast_cost_facts({**times, current: 0.0027}, {**times, known: 0.0031, current: 0.0027},
                                       device="cpu")
    assert "cannot cause" in faster["cost_phrase"]
    # a noise below 1% keeps its digits: it never prints as 0%
    small = fp8_prose.cast_cost_facts(times, {**times, known: 0.003 / 1.004}, device="cpu")["cost_phrase"]
    assert "more than the 0.33% by which" in small
    with pytest.raises(ValueError, match="again lacks"):
        fp8_prose.cast_cost_facts(times, {}, device="cpu")
    with pytest.raises(ValueError, match="device must name"):
        fp8_prose.cast_cost_facts(times, times, device=None)


def test_time_scaled_casts_times_the_three_casts():
    times = fp8_studies.time_scaled_casts("cpu", n=1000, budget_s=0.01)
    assert list(times) == [fp8_studies.TORCH_CAST, fp8_studies.KNOWN_SCALE_CAST, fp8_studies.CURRENT_SCALING_CAST]
    assert all(isinstance(v, float) and v > 0 for v in times.values())
    with pytest.raises(ValueError, match="positive int"):
        fp8_studies.time_scaled_casts("cpu", n=0)


def test_backend_facts_and_torchao_agreement_phrases():
    assert fp8_prose.backend_facts("rowwise", True) == {"backend_recipe": "`rowwise`", "backends_same": "**identical**"}
    facts = fp8_prose.backend_facts("tensorwise", False)
    assert facts == {"backend_recipe": "`tensorwise`", "backends_same": "**different**"}
    assert all(isinstance(v, Prose) for v in facts.values())
    assert fp8_prose.torchao_agreement(True) == "**bit for bit**"
    assert fp8_prose.torchao_agreement(False) == "**not exactly**"
    assert isinstance(fp8_prose.torchao_agreement(True), Prose)


def test_output_and_gradients_of_a_linear_layer():
    layer = nn.Linear(3, 2)
    with torch.no_grad():
        layer.weight.copy_(torch.tensor([[1.0, 2.0, 3.0], [-1.0, 0.0, 1.0]]))
        layer.bias.copy_(torch.tensor([0.5, -0.5]))
    x = torch.tensor([[1.0, 1.0, 1.0], [2.0, 0.0, -1.0]])
    out, x_grad, w_grad = fp8_studies.output_and_gradients(nn.Sequential(layer), x)
    assert torch.equal(out, torch.tensor([[6.5, -0.5], [-0.5, -3.5]]))
    assert torch.equal(x_grad, torch.tensor([[0.0, 2.0, 4.0], [0.0, 2.0, 4.0]]))      # ones @ W
    assert torch.equal(w_grad, torch.tensor([[3.0, 1.0, 0.0], [3.0, 1.0, 0.0]]))      # ones^T @ x
    assert x.grad is None and not x.requires_grad
    layer.zero_grad()
    _, x_grad, _ = fp8_studies.output_and_gradients(layer, x, loss=lambda y: y.square().sum())
    assert torch.equal(x_grad, 2 * torch.tensor([[6.5, -0.5], [-0.5, -3.5]]) @ layer.weight.detach())
    with pytest.raises(ValueError, match="exactly one weight"):
        fp8_studies.output_and_gradients(nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2)), x)


# ---- training ----------------------------------------------------------------------------------------------

def fp8_result() -> Fp8Training:
    return training({"bf16_autocast": flat(3.0, 2.5, 2.0, peak=3.5),
                     "tensorwise": flat(3.25, 2.25, 2.0),      # -0.25 .. +0.25: changes sign
                     "rowwise": flat(3.125, 2.75, 2.5),        # above in every seed
                     "unscaled": flat(3.5, 3.0, 2.25, peak=7.5)})


def test_loss_differences_and_final_loss_table():
    result = fp8_result()
    diffs = training_prose.loss_differences(result)
    assert diffs["rowwise"] == (0.125, 0.25, 0.5) and diffs["bf16_autocast"] == (0.0, 0.0, 0.0)
    assert training_prose.final_loss_table(result) == (
        "| recipe | final loss per seed (mean of the last 5 steps) | minus BF16 (same seed) |\n|---|---|---|\n"
        "| bf16_autocast | 3.000, 2.500, 2.000 | +0.0000, +0.0000, +0.0000 |\n"
        "| tensorwise | 3.250, 2.250, 2.000 | +0.2500, -0.2500, +0.0000 |\n"
        "| rowwise | 3.125, 2.750, 2.500 | +0.1250, +0.2500, +0.5000 |\n"
        "| unscaled | 3.500, 3.000, 2.250 | +0.5000, +0.5000, +0.2500 |\n")
    # a gap under 0.0005 keeps its sign on the page (three decimals printed -0.000)
    tiny = training({"bf16_autocast": flat(3.0, 2.5, 2.0), "rowwise": flat(3.0, 2.5, 1.9998)})
    assert "| rowwise | 3.000, 2.500, 2.000 | +0.0000, +0.0000, -0.0002 |" in training_prose.final_loss_table(tiny)
    with pytest.raises(ValueError, match="baseline 'fp32' did not run"):
        training_prose.loss_differences(result, "fp32")


@pytest.mark.parametrize("above, below, mixed, sentence", [
    (["rowwise", "delayed"], [], ["tensorwise"],
     "`rowwise` and `delayed` ended above BF16 in every seed; `tensorwise` changed sign from seed to seed."),
    ([], ["blockwise"], [], "`blockwise` ended below it in every seed; no scaled recipe changed sign."),
    (["a"], ["b"], [], "`a` ended above BF16 in every seed; `b` ended below it in every seed; "
                       "no scaled recipe changed sign."),
    ([], [], ["a", "b"], "`a` and `b` changed sign from seed to seed."),
])
def test_seed_consistency(above, below, mixed, sentence):
    assert training_prose.seed_consistency(above, below, mixed) == sentence


def test_tile_note_says_why_the_tile_is_not_deepseeks():
    assert fp8_prose.tile_note(128, 512) == "the same 128"
    assert fp8_prose.tile_note(32, 64) == "32, because 128 is wider than the model's width of 64"
    assert fp8_prose.tile_note(64, 192) == "64, because 128 does not divide the model's width of 192"
    assert fp8_prose.tile_note(64, 256) == "64"
    assert fp8_studies.lab_block(SizeProfile("small")) == 32 and fp8_studies.lab_block(
        SizeProfile("full", forced=True)) == fp8_studies.DEEPSEEK_TILE


def test_recorded_training_note():
    assert training_prose.recorded_training_note(True) == (
        "These are short runs of a small model; the recorded GPU run below trains the full-size model longer.")
    assert training_prose.recorded_training_note(False) == (
        "These are short runs of a small model; no longer GPU run is recorded yet (the command is below).")
    assert training_prose.recorded_training_note(True, full_size=True) == (
        "This page ran the full-size experiment; the recorded GPU run below is the same experiment on the GPU "
        "that recorded it.")
    assert training_prose.recorded_training_note(False, full_size=True) == (
        "This page ran the full-size experiment; no GPU run of it is recorded yet (the command is below).")


@pytest.mark.parametrize("seeds, sentence", [
    ((0,), "With one seed every recipe ends on one side of BF16, so this is no evidence"),
    ((0, 1), "With two seeds, a recipe no different from BF16 would still end on the same side of it in every seed "
             "one time in two, so this is weak evidence"),
    ((0, 1, 2, 3, 4, 5), "With six seeds, a recipe no different from BF16 would still end on the same side of it in "
                         "every seed one time in 32, so this is evidence"),
])
def test_seed_facts_count_the_seeds(seeds, sentence):
    curves = {"bf16_autocast": tuple((3.0,) * 3 for _ in seeds)}
    facts = training_prose.seed_facts(Fp8Training(("bf16_autocast",), seeds, 3, 64, curves))
    assert facts == {"train_seeds": count_word(len(seeds)), "train_tail": 3, "train_sign_chance": sentence}
    with pytest.raises(ValueError, match="no seed"):
        training_prose.seed_facts(Fp8Training(("bf16_autocast",), (), 3, 64, {"bf16_autocast": ()}))


def test_fp8_training_facts():
    facts = training_prose.fp8_training_facts(fp8_result(), recorded=False)
    assert facts == {
        "train_steps": 12, "train_bf16": 2.5, "train_unscaled_gap": 1.25 / 3, "train_scaled_lo": -0.25,
        "train_scaled_hi": 0.5, "train_consistent": "`rowwise` ended above BF16 in every seed; `tensorwise` "
                                                    "changed sign from seed to seed.",
        "train_unscaled_peak": 7.5, "train_bf16_peak": 3.5, "train_skip": 10,
        "train_recorded_note": training_prose.recorded_training_note(False),
        "train_seeds": "three", "train_tail": 5,
        "train_sign_chance": "With three seeds, a recipe no different from BF16 would still end on the same "
                             "side of it in every seed one time in four, so this is weak evidence"}
    assert training_prose.fp8_training_facts(fp8_result(), recorded=True, full_size=True)["train_recorded_note"] == (
        training_prose.recorded_training_note(True, full_size=True))
    assert isinstance(facts["train_consistent"], Prose)
    with pytest.raises(ValueError, match="'unscaled' and at least one scaled recipe"):
        training_prose.fp8_training_facts(training({"bf16_autocast": flat(3.0, 2.5, 2.0),
                                               "rowwise": flat(3.0, 2.5, 2.0)}), recorded=True)


# ---- accumulation, speed ---------------------------------------------------------------------------------

def accumulation(rounding: str, worst: float, promoted: float) -> AccumulationStudy:
    return AccumulationStudy((128, 4096), 14, 128, rounding, 4, {
        "FP32 accumulator": ((0.0, 0.0), (0.0, 0.0)),
        "14-bit accumulator": ((0.0, 0.0), (0.001, worst)),
        "14-bit, promoted to FP32 every 128": ((0.0, 0.0), (0.0, promoted))})


def test_accumulation_facts_places_the_reported_figure():
    studies = {"toward_zero": accumulation("toward_zero", 0.0625, 0.001),
               "nearest_even": accumulation("nearest_even", 0.005, 0.0001)}
    assert fp8_prose.accumulation_facts(studies) == {
        "acc_toward_zero_4096": 6.25, "acc_toward_zero_promoted": 100 * 0.001,
        "acc_nearest_even_4096": 0.5, "acc_nearest_even_promoted": 100 * 0.0001,
        "acc_vs_deepseek": "lies between the two models' figures"}
    studies["toward_zero"] = accumulation("toward_zero", 0.015, 0.001)
    assert fp8_prose.accumulation_facts(studies)["acc_vs_deepseek"] == "lies outside both models' figures"
    with pytest.raises(ValueError, match="no K = 8192"):
        fp8_prose.accumulation_facts(studies, k=8192)


def estimate(m: int, speedup: float) -> Fp8LinearEstimate:
    return Fp8LinearEstimate(m, m, m, "tensorwise", speedup, 0.75, 0.25,     # fp8_s = 1
                             3, 13, {"kernel floor": 0.0, "memory": 0.0, "compute": speedup},
                             {"kernel floor": 0.0, "memory": 0.25, "compute": 0.75})


ESTIMATES = {"tensorwise": [estimate(512, 0.5), estimate(1024, 0.75), estimate(2048, 1.25), estimate(16384, 2.0)]}
MEASURED = {"recorded GPU: _scaled_mm / BF16, one product, no casts": {1024: 0.91, 2048: 1.32, 8192: 1.8234}}


def test_speedup_facts_with_and_without_a_record():
    facts = fp8_prose.speedup_facts(ESTIMATES, MEASURED, gpu())
    assert facts.pop("pred_limits") == fp8_prose.speed_limits_note(ESTIMATES, gpu())
    assert facts == {"pred_1k": 0.75, "pred_16k": 2.0, "pred_breakeven": 2048,
                     "pred_crossing": "first passes 1 (1.25) at", "rec_mm_8k": "1.82",
                     "h100_fp8": 250.0, "h100_bf16_peak": 100.0, "peak_ratio": 2.5}
    none = fp8_prose.speedup_facts({"tensorwise": ESTIMATES["tensorwise"][:2] + [estimate(16384, 0.9)]}, {}, gpu())
    assert (none["pred_breakeven"], none["rec_mm_8k"]) == (None, "not recorded")
    assert none["pred_crossing"] == "stays below 1 up to"
    # the H100's model gives 1.003 at 2048: break-even, not "reaches 1"; 0.995 at 1024 is break-even too
    even = fp8_prose.speedup_facts({"tensorwise": [estimate(512, 0.5), estimate(1024, 0.995), estimate(2048, 1.003),
                                                   estimate(16384, 2.0)]}, {}, gpu())
    assert (even["pred_breakeven"], even["pred_crossing"]) == (1024, "breaks even (0.99) at")
    with pytest.raises(ValueError, match="no M = 16384"):
        fp8_prose.speedup_facts({"tensorwise": ESTIMATES["tensorwise"][:2]}, {}, gpu())
    with pytest.raises(ValueError, match="no BF16 or no FP8"):
        fp8_prose.speedup_facts(ESTIMATES, {}, gpu(fp8=None))


def test_speed_limits_note_names_the_kernel_floor_where_it_decides():
    h100 = DATASHEET_PEAKS["H100 SXM5"]
    note = fp8_prose.speed_limits_note(fp8_studies.roofline_speedups(h100, [256, 512, 1024, 2048, 16384]), h100)
    assert "2 µs per kernel (torchao's figure for one kernel launch, an assumption of the model)" in note
    assert "A BF16 layer runs 3 kernels" in note and "FP8 runs 13" in note and "rowwise runs 10" in note
    # the 10 scale-and-cast kernels, from the roofline's own list: 3 two-kernel amax reductions and 4 casts
    assert "three amax reductions of two kernels each" in note and "and four casts" in note
    assert "every FP8 kernel takes at 256 to 1024, and it pulls the prediction lower there" in note
    assert "(256 and 512), the prediction is just the ratio of kernel counts, 3/13 = 0.23 (3/10 = 0.30" in note
    # bytes and FLOPs alone already lose to BF16 there: the floor is not the only cause
    assert ("bytes and FLOPs alone already keep them below BF16: without the model's least time per kernel "
            "(`launch_seconds=0`) it would be 0.56 at 256, 0.56 at 512 and 0.76 at 1024") in note
    assert "In this model, fusing the casts saves bytes, not kernels" in note
    assert "fused line lies on the unfused one" in note
    assert "From 2048 on, the products' arithmetic takes most" in note and "$" not in note
    # without a floor there is nothing about kernels to say
    bare = {"tensorwise": [predict_fp8_linear(n, n, n, bf16_tflops=989.5, fp8_tflops=1979, bandwidth_gbs=3350,
                                              launch_seconds=0) for n in (256, 4096)]}
    plain = fp8_prose.speed_limits_note(bare, h100)
    assert "floor" not in plain and plain.startswith("At 256, memory traffic")
    assert "At 4096, the products' arithmetic" in plain
    with pytest.raises(ValueError, match="no split"):
        fp8_prose.speed_limits_note({"tensorwise": [Fp8LinearEstimate(8, 8, 8, "tensorwise", 1.0, 0.5, 0.5)]}, h100)


def test_crossing_phrase():
    assert fp8_prose.crossing_phrase(1.003) == "breaks even (1.00) at"
    assert fp8_prose.crossing_phrase(1.2) == "first passes 1 (1.20) at"
    assert fp8_prose.crossing_phrase(None) == "stays below 1 up to"
    with pytest.raises(ValueError, match="below break-even"):
        fp8_prose.crossing_phrase(0.9)


def test_roofline_speedups_are_the_roofline_per_variant():
    g = gpu()
    out = fp8_studies.roofline_speedups(g, [256, 4096])
    assert list(out) == ["tensorwise", "tensorwise (casts fused)", "rowwise"]
    assert out["tensorwise (casts fused)"][1] == predict_fp8_linear(
        4096, 4096, 4096, bf16_tflops=100.0, fp8_tflops=250.0, bandwidth_gbs=1000.0, fuse_casts=True)
    assert out["rowwise"][0] == predict_fp8_linear(256, 256, 256, bf16_tflops=100.0, fp8_tflops=250.0,
                                                   bandwidth_gbs=1000.0, recipe="rowwise")
    with pytest.raises(ValueError, match="no BF16 or no FP8"):
        fp8_studies.roofline_speedups(gpu(fp8=None), [256])


def record(experiment: str, result) -> RecordedResult:
    rec = Record(experiment, {}, {}, Provenance("NVIDIA H100", "cuda", "2.11", "2026-01-01", "cmd", "abc",
                                                "3.12", compute_capability="9.0"))
    return RecordedResult(rec, result)


def test_recorded_product_ratios():
    points = tuple(MatmulPointSummary(d, n, t, 1.0, 1.0, 1.0, 3) for d, n, t in (
        ("bf16", 256, 100.0), ("fp8", 256, 125.0), ("bf16", 512, 400.0), ("fp8", 1024, 900.0), ("fp32", 256, 50.0)))
    matmul = MatmulThroughput((256, 512, 1024), 512, points, {}, {}, 100.0)
    assert fp8_studies.recorded_product_ratios([record("matmul_throughput", matmul)]) == {
        "recorded NVIDIA H100 (sm 9.0): _scaled_mm / BF16, one product, no casts": {256: 1.25}}
    assert fp8_studies.recorded_product_ratios([]) == {}
    with pytest.raises(ValueError, match="no matmul throughput"):
        fp8_studies.recorded_product_ratios([record("fp8_training", {})])


def speed(device: str = "cpu", skipped: dict | None = None) -> Fp8LinearSpeed:
    return Fp8LinearSpeed(device, (64, 128), {"BF16 nn.Linear": {64: 0.001, 128: 0.002},
                                              COURSE: {64: 0.004, 128: 0.0025}}, skipped or {})


def test_linear_speed_table_and_facts():
    assert fp8_prose.linear_speed_table(speed()) == (
        f"| n | BF16 nn.Linear | {COURSE} |\n|---|---|---|\n| 64 | 1.000 ms | 4.000 ms |\n"
        "| 128 | 2.000 ms | 2.500 ms |\n")
    cpu = fp8_prose.linear_speed_facts(speed(), bf16_relative=0.02, cpu_kernel="reference")
    assert cpu == {"cpu_fp8_ratio": "0.25 to 0.80", "speed_device": "CPU", "speed_note": (
        "A CPU has no FP8 matrix unit: here `_scaled_mm` converts the codes back to FP32 and multiplies there, so "
        "these timings say nothing about a GPU.")}
    # a CPU where torch hands FP8 products to oneDNN (hardware.cpu_fp8_kernel) is told apart
    assert fp8_prose.linear_speed_facts(speed(), cpu_kernel="onednn")["speed_note"] == (
        "A CPU has no FP8 matrix unit: here torch hands the products whose operands share one FP8 format and "
        "per-tensor scales (the forward's) to oneDNN's FP8 software kernel, and multiplies the others in FP32 after "
        "converting their codes, so these timings say nothing about a GPU.")
    # FP8 faster than BF16 on a CPU: BF16 is the slow side where the probe measured it slower than FP32
    fast = Fp8LinearSpeed("cpu", (64, 128), {"BF16 nn.Linear": {64: 0.004, 128: 0.002},
                                             COURSE: {64: 0.001, 128: 0.0025}}, {})
    assert fp8_prose.linear_speed_facts(fast, bf16_relative=0.017, cpu_kernel="reference")["speed_note"].endswith(
        "Where FP8 came out faster, BF16 is the slow side: this CPU multiplies BF16 at 0.017 times its FP32 rate "
        "(the banner's probe), and FP8 is multiplied in FP32.")
    assert fp8_prose.linear_speed_facts(fast, bf16_relative=0.017, cpu_kernel="onednn")["speed_note"].endswith(
        "and FP8 partly runs in oneDNN's FP8 kernel.")
    # no _scaled_mm on this CPU (no kernel found): the simulated backend multiplies in FP32, not in oneDNN
    from course_lib.studies.fp8_speed_prose import faster_on_cpu_reason
    assert faster_on_cpu_reason(0.5, None).endswith("and FP8 is multiplied in FP32.")
    for unknown in (None, 1.5):
        assert fp8_prose.linear_speed_facts(fast, bf16_relative=unknown)["speed_note"].endswith(
            "Where FP8 came out faster, that is not FP8 arithmetic, which a CPU does not have.")
    gpu_facts = fp8_prose.linear_speed_facts(speed("cuda:0"))
    assert gpu_facts["speed_device"] == "CUDA"
    assert gpu_facts["speed_note"] == ("These are eager layers: each cast is a separate kernel, the overhead the "
                                       "roofline charges.")
    with pytest.raises(ValueError, match="has no timing"):
        fp8_prose.linear_speed_facts(Fp8LinearSpeed("cpu", (64,), {"BF16 nn.Linear": {64: 1.0}}, {}))


def test_recorded_linear_speed_table_and_summary():
    assert fp8_prose.recorded_linear_speed_table(speed()) == (
        f"| n | BF16 nn.Linear (ms) | {COURSE} (ms) | {COURSE}: BF16's time / its time |\n|---|---|---|---|\n"
        "| 64 | 1.000 | 4.000 | 0.25 |\n| 128 | 2.000 | 2.500 | 0.80 |\n")
    tail = ("This record times the whole layer, forward and backward, and does not say where the extra time goes; "
            "the layer is written for clarity (each operand's amax, scale, clamp and cast as separate eager "
            "operations), not speed. Profile a layer before concluding anything about FP8 from it "
            "(`torch.profiler`, lesson 6). ")
    with_product = fp8_prose.recorded_linear_speed_summary(
        speed(skipped={"torchao Float8Linear (tensorwise, eager)": "no torchao"}), "H100", MEASURED)
    assert with_product == (
        "On H100 the course's FP8 layer ran at 0.25 to 0.80 times BF16's speed (below 1: slower), at every size, "
        "although one FP8 `_scaled_mm` product alone ran 1.82x BF16's at n = 8192 (the recorded products above). "
        + tail + "torchao did not import on the recording machine, so this record has no torchao layer.")
    assert fp8_prose.recorded_linear_speed_summary(speed(), "H100", {}) == (
        "On H100 the course's FP8 layer ran at 0.25 to 0.80 times BF16's speed (below 1: slower), at every size. "
        + tail)
    # a record older than the one-pass casts says so in its own paragraph; a newer one does not
    older = fp8_prose.recorded_linear_speed_summary(speed(), "H100", {}, "2026-11-22T17:48:35+00:00")
    assert older == (
        "On H100 the course's FP8 layer ran at 0.25 to 0.80 times BF16's speed (below 1: slower), at every size. "
        "The record timed an older, slower version of the layer than this page's, from before the layer cast each "
        "tensor in one pass without waiting for the host to read its finiteness check. " + tail)
    assert fp8_prose.recorded_linear_speed_summary(speed(), "H100", {}, "2026-11-25T00:00:00") == (
        fp8_prose.recorded_linear_speed_summary(speed(), "H100", {}))


def test_a_size_left_out_shows_in_the_table_and_its_reason_in_the_note():
    why = "n = 128, left out because one call at n = 64 took 0.2 s here"
    cut = Fp8LinearSpeed("cpu", (64, 128), {"BF16 nn.Linear": {64: 0.001, 128: 0.002}, COURSE: {64: 0.004}}, {},
                         {COURSE: why})
    assert fp8_prose.linear_speed_table(cut) == (
        f"| n | BF16 nn.Linear | {COURSE} |\n|---|---|---|\n| 64 | 1.000 ms | 4.000 ms |\n"
        "| 128 | 2.000 ms | left out |\n")
    assert fp8_prose.linear_speed_facts(cut, cpu_kernel="reference")["speed_note"].endswith(
        f"say nothing about a GPU. Not timed: {COURSE} at {why}.")
    assert fp8_prose.linear_speed_facts(speed(), cpu_kernel="reference")["speed_note"].count("Not timed") == 0
    assert fp8_prose.recorded_linear_speed_table(dataclasses.replace(cut, device="cuda")).endswith(
        "| 128 | 2.000 | left out |  |\n")
    summary = fp8_prose.recorded_linear_speed_summary(dataclasses.replace(cut, device="cuda"), "H100", {})
    assert summary.startswith("On H100 the course's FP8 layer ran at 0.25 to 0.25 times BF16's speed (below 1: "
                              f"slower), at every size it timed. Not timed: {COURSE} at {why}. This record")


def test_the_speed_study_leaves_out_the_fp8_sizes_forecast_past_its_limit():
    # a limit below the budget: each implementation is timed at its first size only, and the study says so
    run = fp8_studies.fp8_linear_speed((16, 32), "cpu", budget_s=0.002, point_limit_s=0.001)
    assert all(set(times) == {16} for times in run.seconds.values()) and set(run.left_out) == set(run.seconds)
    assert all(note.startswith("n = 32, left out because one call at n = 16 took ") for note in run.left_out.values())
    assert fp8_studies.fp8_linear_speed((16, 32), "cpu", budget_s=0.002).left_out == {}


def test_recorded_summary_flags_a_bf16_time_that_falls_with_size():
    # the H100 record's shape: BF16 slower at the smallest size than at every larger one
    odd = Fp8LinearSpeed("cuda", (256, 512, 1024), {"BF16 nn.Linear": {256: 0.000463, 512: 0.00029, 1024: 0.000297},
                                                   COURSE: {256: 0.00243, 512: 0.0048, 1024: 0.00495}}, {})
    assert fp8_prose.bf16_slower_than_larger(odd) == [256]
    assert fp8_prose.bf16_slower_than_larger(speed()) == []
    summary = fp8_prose.recorded_linear_speed_summary(odd, "H100", {})
    # the range leaves n = 256 (0.19) out: 0.06 to 0.06
    assert summary.startswith("On H100 the course's FP8 layer ran at 0.06 to 0.06 times BF16's speed")
    assert ("at n = 256 (0.463 ms) it is longer than at 512 and 1024 (0.290 and 0.297 ms)" in summary
            and "so the range leaves n = 256 out" in summary)
    # the H100 record's BF16 times: only 256 exceeds both of its next larger sizes (1024 exceeds 2048's
    # time but not 4096's: neighbouring noise, not a falling trend; 512 and the large sizes rise with size)
    h100_bf16 = {256: 0.000463, 512: 0.00029, 1024: 0.000297, 2048: 0.000271, 4096: 0.000729, 8192: 0.005117}
    record = Fp8LinearSpeed("cuda", tuple(h100_bf16), {"BF16 nn.Linear": h100_bf16,
                                                        COURSE: {n: 10 * t for n, t in h100_bf16.items()}}, {})
    assert fp8_prose.bf16_slower_than_larger(record) == [256]
    assert fp8_prose.bf16_slower_than_larger(record, window=1) == [256, 1024]
    assert "leaves n = 256 out" in fp8_prose.recorded_linear_speed_summary(record, "H100", {})
    with pytest.raises(ValueError, match="window must be a positive int"):
        fp8_prose.bf16_slower_than_larger(record, window=0)
    alone = Fp8LinearSpeed("cuda", (256, 512), {"BF16 nn.Linear": {256: 2.0, 512: 1.0}, COURSE: {256: 4.0}}, {})
    assert "0.50 to 0.50" in fp8_prose.recorded_linear_speed_summary(alone, "H100", {})
    assert "the range rests on it" in fp8_prose.recorded_linear_speed_summary(alone, "H100", {})


# ---- errata and exercises ----------------------------------------------------------------------------------

def test_fp8_errata_rows():
    overflow = fp8_prose.OverflowCasts("2.13.0+cpu", 448.0, "0.6.0", float("nan"), float("inf"))
    rows = fp8_prose.fp8_errata_rows(overflow, sweep(), block=32, estimates=ESTIMATES, measured=MEASURED)
    assert [c for c, _ in rows] == ["FP8 needs Hopper.", "FP8 training is 4-6x faster than BF16.",
                                    "An FP8 overflow becomes NaN.", "Gradients always use E5M2.",
                                    "Per-tensor scaling cannot cope with outlier channels."]
    l4, rtx = DATASHEET_PEAKS["L4"].peak("fp8"), DATASHEET_PEAKS["RTX 4090"].peak("fp8")
    assert rows[0][1] == (
        f"Ada GPUs (compute capability 8.9) have FP8 tensor cores: the L4's datasheet lists {l4:g} dense FP8 "
        f"TFLOP/s and the RTX 4090's {rtx:g} (with FP32 accumulation); Transformer Engine supports FP8 on 8.9 "
        "{cite:p}`nvidia_te`. (Blockwise scaling in software, DeepSeek-V3's tiles and blocks, was built for 9.0 "
        "(Hopper) kernels {cite:p}`deepseek2024v3`; among NVIDIA GPUs, hardware block-scaled (MX) products need "
        "Blackwell: compute capability 10.x (B200, B300) or 12.0 and 12.1 (sm_120, sm_121: GeForce and DGX "
        "Spark); AMD's CDNA4 has them too, {doc}`08_microscaling`.)")
    assert rows[1][1].startswith(
        "The dense FP8 peak is 2.0x BF16's (1979 against 989.5 TFLOP/s on an H100); one recorded H100 product "
        "reached 1.82x; the roofline above predicts 2.00x for a 16384-wide layer with its casts. End to end, ")
    assert rows[2][1] == (
        "It depends on the library and the format. This torch (2.13.0+cpu) casts 1000 to E4M3 as 448 (it "
        "saturates); ml_dtypes (0.6.0) gives nan; torchao's source notes that torch 2.11 and older do not saturate "
        "either. E5M2 rounds a million to inf. FP8 recipes clamp to ±max before the cast, so none of this reaches a "
        "product.")
    assert rows[4][1] == (
        "In E4M3 it copes with small outliers only: a 1,000x outlier channel flushed 12.5% of the other values of "
        "this page's activation; it is at 100,000x that 50.0% go. Per-token scales help little (the outlier "
        "section above); 1 x 32 tiles flush fewer, 6.2% at 100,000x, but not none.")
    unrecorded = fp8_prose.fp8_errata_rows(overflow, sweep(), block=32, estimates=ESTIMATES, measured={})
    assert "one recorded H100 product reached nanx;" in unrecorded[1][1]


def test_exercise_facts():
    h100 = DATASHEET_PEAKS["H100 SXM5"]
    layer = predict_fp8_linear(4096, 4096, 1024, bf16_tflops=989.5, fp8_tflops=1979.0,
                               bandwidth_gbs=h100.bandwidth_gbs)
    assert fp8_prose.exercise_facts(h100) == {
        "ex_speedup": layer.speedup, "ex_cast_share": 100 * layer.fp8_cast_s / layer.fp8_s,
        "ex_gemm_gain": layer.bf16_s / layer.fp8_gemm_s, "ex_elems_x": 16.777216, "ex_elems_w": 4.194304,
        "ex_margin": 6, "ex_headroom": 64}
    assert fp8_prose.exercise_facts(h100, spike=64.0)["ex_margin"] == 6
    assert fp8_prose.exercise_facts(h100, spike=65.0)["ex_headroom"] == 128
    with pytest.raises(ValueError, match="no BF16 or no FP8"):
        fp8_prose.exercise_facts(DATASHEET_PEAKS["V100 SXM2"])
    with pytest.raises(ValueError, match="factor above 1"):
        fp8_prose.exercise_facts(h100, spike=0.5)


def test_ratio_text_keeps_two_significant_digits_below_a_tenth():
    assert [tables.ratio_text(r) for r in (1.234, 0.1, 0.0031, 0.000456)] == ["1.23", "0.10", "0.0031", "0.00046"]
    # two significant digits also where the second is a zero: 0.010 beside 0.0081, not 0.01
    assert [tables.ratio_text(r) for r in (0.01, 0.001, 0.0994)] == ["0.010", "0.0010", "0.099"]
    with pytest.raises(ValueError, match="positive"):
        tables.ratio_text(0.0)


def test_the_spikes_amax_stays_in_the_history_for_exactly_history_steps():
    from course_lib.fp8 import DelayedScaling

    recipe = DelayedScaling("e4m3", amax_history_len=2, amax_compute_algo="max")
    scales = []
    for amax in (1.0, 1.0, 50.0, 1.0, 1.0, 1.0):     # the spike at step 2
        scales.append(recipe.current_scale)           # the scale step t casts with
        recipe.observe(amax)
    assert [s == scales[2] for s in scales[3:]] == [False, False, True]   # steps 3 and 4 use the spike's amax


def test_spike_gains_are_the_studys_and_lie_in_their_range():
    from course_lib.studies import fp8 as S

    gains = S.spike_gains(40, seed=0)
    lo, hi = S.SPIKE_GAINS
    assert len(gains) == 40 and all(lo <= g <= hi for g in gains) and gains == S.spike_gains(40, seed=0)
    assert gains != S.spike_gains(40, seed=1)
    tensor = torch.ones(2, 2)
    run = S.delayed_spike(tensor, steps=40, spike_at=15, factor=50.0)
    # the amax of each step is the gain (times the spike's factor at the spike), to the float32 product
    assert [a / (50.0 if t == 15 else 1.0) for t, a in enumerate(run.amax)] == pytest.approx(gains, rel=1e-6)
    with pytest.raises(ValueError, match="steps must be a positive int"):
        S.spike_gains(0)
    assert fp8_prose.spike_gain_facts((0.8, 1.2)) == {"spike_gain_lo": 0.8, "spike_gain_hi": 1.2}
    with pytest.raises(ValueError, match="0 < lo <= hi"):
        fp8_prose.spike_gain_facts((1.2, 0.8))
    # a 50x spike over quiet steps all at 0.8, the spike step at 1.2: 75x, margin 7 (2**7 = 128 >= 75 > 64)
    worst = fp8_prose.spike_gain_facts((0.8, 1.2), spike=50.0)
    assert worst["spike_worst"] == pytest.approx(75.0) and worst["spike_worst_margin"] == 7
    with pytest.raises(ValueError, match="above 1"):
        fp8_prose.spike_gain_facts((0.8, 1.2), spike=0.5)


def test_fp8_training_pieces_merge_into_one_result_newest_first():
    """A GPU session records fp8_training one recipe per command; lesson 7 draws the pieces of one GPU as one."""
    def piece(recipes, value, seeds=(0, 1, 2), steps=4):
        return fp8_studies.Fp8Training(tuple(recipes), seeds, steps, 128,
                                       {r: tuple((value,) * steps for _ in seeds) for r in recipes})

    newest, older = piece(["unscaled", "tensorwise"], 2.0), piece(["tensorwise", "bf16_autocast"], 3.0)
    merged = fp8_studies.merge_fp8_training([newest, older])
    assert merged.recipes == ("bf16_autocast", "tensorwise", "unscaled")          # the registry's order
    assert merged.curves["tensorwise"] == newest.curves["tensorwise"]              # the newest piece wins
    assert merged.curves["bf16_autocast"] == older.curves["bf16_autocast"] and merged.steps == 4
    with pytest.raises(ValueError, match="differ in seeds, steps or block"):
        fp8_studies.merge_fp8_training([newest, piece(["rowwise"], 1.0, steps=5)])
    with pytest.raises(ValueError, match="no fp8_training pieces"):
        fp8_studies.merge_fp8_training([])
    # MX recipes keep the registry's order too
    mx = fp8_studies.merge_fp8_training([piece(["nvfp4"], 1.0), piece(["mxfp8", "bf16_autocast"], 1.0)])
    assert mx.recipes == ("bf16_autocast", "mxfp8", "nvfp4")


def test_recorded_pieces_merge_only_the_newest_gpus_at_its_size():
    from course_lib.results import Provenance, Record, RecordedResult

    def rec(gpu, recipes, steps=4, model=None):
        prov = Provenance(device_name=gpu, device_type="cuda", torch_version="2.11", date="2026-12-01", command="c",
                          git_commit="abc", python_version="3.12", compute_capability="9.0", cuda_version="13.0")
        result = fp8_studies.Fp8Training(tuple(recipes), (0,), steps, 128, {r: ((1.0,) * steps,) for r in recipes})
        params = {"size": "full", **({"course_model": model} if model else {})}
        return RecordedResult(Record("mx_training", params, {}, prov), result)

    new = {"d_model": 512, "n_layers": 6, "n_heads": 8, "context": 256, "batch": 64}
    records = [rec("H200", ["nvfp4"], model=new), rec("H100", ["mxfp8"], model=new), rec("H200", ["mxfp4"], model=new),
               rec("H200", ["mxfp8"], steps=400), rec("H200", ["bf16_autocast"], model=new)]
    label, merged = fp8_studies.merge_recorded_pieces(records)
    assert label == "H200 (sm 9.0)" and merged.recipes == ("bf16_autocast", "mxfp4", "nvfp4")
    assert fp8_studies.merge_recorded_pieces([]) is None
    with pytest.raises(TypeError, match="expected recorded Fp8Training pieces, got str"):
        fp8_studies.merge_recorded_pieces([RecordedResult(records[0].record, "not a result")])
    assert fp8_studies.training_size({"steps": 400}) == "6 recipes x 3 seeds x 400 steps"
    assert fp8_studies.training_size({"recipes": ("tensorwise",), "steps": 25}) == "1 recipe x 3 seeds x 25 steps"
    with pytest.raises(ValueError, match="positive number of steps"):
        fp8_studies.training_size({})
