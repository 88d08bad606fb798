"""Lesson 3's facts, phrases, tables and errata, each computed from a result built by hand with known numbers."""

import dataclasses
import math

import pytest

from course_lib.glue import Prose
from course_lib.gradients import ScaleSweep
from course_lib.results import Provenance, Record, RecordedResult
from course_lib.scaling import (AUTOCAST_PITFALLS_DTYPE, DEMO_ACCUMULATION, NO_SCALER_PITFALLS, PITFALLS, Finding,
                                PitfallDemo, ScalerDefaults, replay_scale_schedule, run_pitfall_demo)
from course_lib.studies import loss_scaling_prose as P
from course_lib.studies.loss_scaling import FlightRecording, ScaleFidelity, ScalingRun, adam_update_change
from course_lib.tables import MarkdownTable

DEFAULTS = ScalerDefaults(65536.0, 2.0, 0.5, 2000)


# ---- the sweep -------------------------------------------------------------------------------------------

def _sweep():
    # dyadic fractions, so every percentage below is exact
    return ScaleSweep("FP16", (0.5, 1.0, 2.0, 4.0, 8.0), survive=(0.25, 0.75, 0.998046875, 1.0, 0.5),
                      overflow=(0.0, 0.0, 0.0, 0.0, 0.5), flushed=(0.75, 0.25, 0.001953125, 0.0, 0.0),
                      subnormal=(0.25, 0.5, 0.125, 0.0, 0.0))


def test_sweep_facts_read_scale_1_the_initial_scale_and_both_plateaus():
    facts = P.sweep_facts(_sweep(), 2.0)
    assert facts == {"survive_at_1": 75.0, "survive_best": 100.0, "init_scale_log2": 1,
                     "survive_init": 99.8046875, "normal_at_1": 25.0, "normal_init": 87.3046875,
                     "plateau_lo": 1, "plateau_hi": 2, "normal_lo": 2, "normal_hi": 2, "normal_best": 100.0,
                     "plateau_range": "2\u00b9 to 2\u00b2", "normal_range": "2\u00b2 to 2\u00b2",
                     "normal_best_at": "2\u00b2", "init_scale_text": "2\u00b9",
                     "survive_best_text": "**100.00%**", "survive_init_text": "**99.80%**",
                     "normal_init_text": "**87.30%**", "normal_best_text": "**100.00%**"}
    assert P.power_of_two_text(-126) == "2\u207b\u00b9\u00b2\u2076" and P.power_of_two_text(16) == "2\u00b9\u2076"
    with pytest.raises(TypeError, match="exponent must be an int"):
        P.power_of_two_text(2.0)
    assert all(type(facts[k]) is int for k in ("init_scale_log2", "plateau_lo", "plateau_hi", "normal_lo", "normal_hi"))


def test_sweep_facts_need_scale_1_and_the_initial_scale_among_the_swept_ones():
    with pytest.raises(ValueError, match="init_scale 65536 is not among the swept scales"):
        P.sweep_facts(_sweep(), 65536.0)
    no_one = dataclasses.replace(_sweep(), scales=(0.5, 2.0, 4.0, 8.0, 16.0))
    with pytest.raises(ValueError, match="scale 1 is not among"):
        P.sweep_facts(no_one, 2.0)


def test_power_of_two_names_the_exponent():
    # superscripts, as the page's prose writes powers of two; a fractional exponent keeps the caret
    assert P.power_of_two(2.0**-3) == "2\u207b\u00b3"
    assert P.power_of_two(2.0**24) == "2\u00b2\u2074"
    assert P.power_of_two(3.0) == "2^1.58496"
    with pytest.raises(ValueError, match="positive"):
        P.power_of_two(0.0)


# ---- the scaler -------------------------------------------------------------------------------------------

def test_agreement_facts_take_the_smallest_count():
    facts = P.agreement_facts({"steps": 10, "scale": 10, "growth_tracker": 9, "skip": 10, "gradients": 10})
    assert facts == {"agree_steps": 10, "agree_all": 9}
    with pytest.raises(ValueError, match="'steps'"):
        P.agreement_facts({"scale": 3})


def test_growth_facts_replay_the_interval():
    assert P.growth_facts(ScalerDefaults(65536.0, 2.0, 0.5, 7)) == {"growth_interval": 7, "steps_to_double": 7}


# ---- the flight recorder ------------------------------------------------------------------------------------

def _recording(losses, scales, skipped, growth_interval=10):
    n = len(losses)
    return FlightRecording(tuple(losses), tuple(scales), tuple(skipped), (0,) * n, (1.0,) * n, 65536.0, 2.0, 0.5,
                           growth_interval, "cpu")


def test_flight_facts_count_steps_and_skips_and_read_the_last_scale():
    rec = _recording([3.0, 2.9, 2.8, 2.7], [65536.0, 65536.0, 32768.0, 131072.0], [False, False, True, False])
    facts = P.flight_facts(rec)
    assert facts == {"rec_steps": 4, "rec_skipped": 1, "rec_interval": 10, "rec_final_log2": 17,
                     "rec_final_scale": "2\u00b9\u2077"}
    assert type(facts["rec_skipped"]) is int
    with pytest.raises(ValueError, match="no step"):
        P.flight_facts(_recording([], [], []))
    with pytest.raises(ValueError, match="no log2"):
        P.flight_facts(_recording([1.0], [0.0], [True]))


def test_nan_collapse_note_covers_finite_all_skipped_and_partly_skipped_runs():
    assert P.nan_collapse_note(_recording([3.0, 2.0], [4.0, 4.0], [False, False])) == ""
    collapsed = _recording([3.0, 2.0, math.nan, math.nan, math.nan], [4.0, 2.0, 1.0, 2.0**-148, 2.0**-149],
                           [False, True, True, True, True])
    note = P.nan_collapse_note(collapsed)
    assert isinstance(note, Prose)
    assert note == (
        "The recorded full-size run did not end well. It skipped 1 step before step 2; from step 2 on, its loss "
        "was NaN (the forward pass itself produced non-finite values in FP16) at every step, all 3 of the 3 steps "
        "from step 2 on were skipped, and the scale halved at each skipped step down to 1.4e-45, the smallest "
        "positive float32 number, before reaching zero at step 5; the recorder stops there. Loss scaling protects the backward pass from "
        "underflow, and the scaler skips a step and backs off when the scaled gradients overflow; neither repairs "
        "a non-finite forward pass ({doc}`05_bf16_vs_fp16` records the "
        "same failure over seeds). " + P.forward_nan_where())
    # the caveat points at where the operation is located, and names the suspect without claiming it
    assert P.forward_nan_where().startswith("Lesson 5's {ref}`fp16-divergence` trains the course model with FP16 "
                                            "and a GradScaler toward such a failure (at a higher learning rate")
    assert P.forward_nan_where(on_lesson_5=True).startswith("The section below, {ref}`fp16-divergence`, trains")
    assert "{doc}`04_amp`" in P.forward_nan_where() and "no verdict on FP16 autocast" in P.forward_nan_where()
    partly = _recording([3.0, math.inf, 2.0], [4.0, 4.0, 2.0], [False, True, False])
    assert ("from step 1 on, its loss was not finite (the forward pass itself produced non-finite values in FP16) "
            "at every step but step 2, whose loss was 2 at scale 2\u00b9 and which was not skipped; 1 of the 2 steps "
            "from step 1 on were skipped, and the scale halved at each skipped step down to 2 before reaching zero "
            "at step 3;") in P.nan_collapse_note(partly)
    # a finite step among the NaN ones is named, with its scale and whether it was skipped (the H100 record's 1021)
    revived = _recording([3.0, math.nan, 2.5, math.nan], [4.0, 2.0, 0.5, 0.5], [False, True, True, True])
    assert ("its loss was NaN (the forward pass itself produced non-finite values in FP16) at every step but step "
            "2, whose loss was 2.5 at scale 2\u207b\u00b9 and which was skipped; all 3 of the 3 steps from step 1 "
            "on were skipped") in P.nan_collapse_note(revived)


def _provenance():
    return Provenance("NVIDIA H100 80GB HBM3", "cuda", "2.11", "2026-01-01T00:00:00+00:00", "cmd", "abcdef", "3.12",
                      compute_capability="9.0", cuda_version="13.0")


def _flight_record(rec):
    values = {"recording": {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(rec).items()}}
    return RecordedResult(Record("scaler_flight_recording", {}, values, _provenance()), rec)


def test_recorded_flight_is_shown_beside_a_run_off_the_gpu_only():
    rec = _recording([3.0, 2.0], [4.0, 8.0], [False, False])
    records = [_flight_record(rec)]
    assert P.recorded_flight_beside(records, "cpu") == rec
    assert P.recorded_flight_beside(records, "cuda") is None
    assert P.recorded_flight_beside([], "cpu") is None
    bad = RecordedResult(Record("fp8_training", {}, {}, _provenance()), {"curves": {}})
    with pytest.raises(TypeError, match="expected a recorded FlightRecording, got dict"):
        P.recorded_flight_beside([bad], "cpu")


def test_recorded_flight_text_adds_the_collapse_note_only_when_the_run_collapsed():
    line = ("- **NVIDIA H100 80GB HBM3 (sm 9.0)**: torch 2.11, CUDA 13.0, 2026-01-01T00:00:00+00:00, commit "
            "`abcdef`, command `cmd`")
    finite = _recording([3.0, 2.0], [4.0, 8.0], [False, False])
    assert P.recorded_flight_text([_flight_record(finite)], finite) == line
    assert P.recorded_flight_text([_flight_record(finite)], None) == line
    collapsed = _recording([3.0, math.nan], [4.0, 2.0], [False, True])
    text = P.recorded_flight_text([_flight_record(collapsed)], collapsed)
    assert text == line + "\n\n" + P.nan_collapse_note(collapsed)
    assert P.recorded_flight_text([], None) == ("*Not recorded on a GPU yet: `python -m course_lib.record "
                                                "scaler_flight_recording --out results/` records it.*")


def test_replay_facts_say_whether_the_replay_reproduced_the_recording():
    rec = _recording([1.0, 1.0, 1.0], [4.0, 4.0, 8.0], [False, False, False], growth_interval=2)
    same = replay_scale_schedule([math.inf] * 3, init_scale=4.0, growth_interval=2)
    assert P.replay_facts(same, rec) == {"replay_matches": True}
    other = replay_scale_schedule([math.inf] * 3, init_scale=4.0, growth_interval=3)
    assert P.replay_facts(other, rec) == {"replay_matches": False}


def _static(label, scale, skipped):
    n = len(skipped)
    return ScalingRun(label, (1.0,) * n, (scale,) * n, tuple(skipped))


def test_replay_leniency_compares_the_first_step_with_the_static_run_at_the_same_scale():
    big = 2.0 ** 24
    # the replay takes step 0 (threshold above 2**24), skips step 1, then steps at 2**23
    lenient = replay_scale_schedule([2.0 ** 24.5, big, math.inf, math.inf], init_scale=big, growth_interval=5)
    runs = [_static("static 2\u2070", 1.0, [False] * 3), _static("static 2\u00b2\u2074", big, [True] * 3)]
    text = P.replay_leniency(lenient, runs)
    assert isinstance(text, Prose)
    assert text.startswith("On that first step the static 2\u00b2\u2074 run overflowed, while the replay")
    assert "too lenient" in text
    assert "the replay stepped 1 time at 2\u00b2\u2074 or above" in text
    assert "the static 2\u00b2\u2074 run never stepped in its 3 steps" in text
    # when both skip the first step, the text says they agree
    strict = replay_scale_schedule([1.0, math.inf], init_scale=big, growth_interval=5)
    assert "agree: both skipped it" in P.replay_leniency(strict, runs)
    # a replay may also be stricter than the static run
    calm = [_static("static 2\u00b2\u2074", big, [False, True])]
    assert "the replay at an initial scale of 2\u00b2\u2074 skipped, while" in P.replay_leniency(strict, calm)


def test_replay_leniency_needs_a_static_run_at_the_replays_initial_scale():
    replay = replay_scale_schedule([math.inf], init_scale=2.0 ** 24)
    with pytest.raises(ValueError, match="no static run at the replay's initial scale"):
        P.replay_leniency(replay, [_static("static 2\u2070", 1.0, [False])])


def test_what_if_sentence_names_each_setting_and_splits_its_skips_at_the_first_growth():
    # step 1 overflows at a scale of 3 or more, step 5 at 6 or more
    stream = [math.inf, 3.0, math.inf, math.inf, math.inf, 6.0, math.inf]
    traces = {"as recorded": replay_scale_schedule(stream, init_scale=4.0, growth_interval=2),
              "start low": replay_scale_schedule(stream, init_scale=2.0, growth_interval=2),
              "start high": replay_scale_schedule(stream, init_scale=16.0, growth_interval=2, backoff_factor=0.25),
              "grow late": replay_scale_schedule(stream, init_scale=4.0, growth_interval=4)}
    # recorded: 4, 4 (skip: 2), 2, 2 (grows: 4), 4, 4 (grows: 8), 8; skipped once, before growing
    # from 2: 2, 2 (grows: 4), 4, 4 (grows: 8), 8 (step 5 overflows: 4), 4; skipped once, after growing
    # from 16, backing off to a quarter: 16, 16 (skip: 4), 4, 4 (grows: 8), 8, 8 (skip: 2), 2
    # growing every 4 steps: 4, 4 (skip: 2), 2, 2, 2, 2 (grows: 4), 4
    assert [P.skips_before_first_growth(t) for t in traces.values()] == [1, 0, 1, 1]
    assert P.what_if_sentence(traces) == (
        "Over the same 7 steps, the recorded settings ended at 2\u00b3 and skipped 1 step, before the scale first "
        "grew; with an initial scale of 2\u00b9 instead of 2\u00b2, the replay ended at 2\u00b2 and skipped 1 step, "
        "after the scale had grown; with an initial scale of 2\u2074 instead of 2\u00b2 and a back-off factor of "
        "0.25 instead of 0.5, the replay ended at 2\u00b9 and skipped 1 step before the scale first grew and 1 "
        "after it had grown; with growth every 4 clean steps instead of 2, the replay ended at 2\u00b2 and skipped "
        "1 step, before the scale first grew. The fewest skips came with the recorded settings, an initial scale "
        "of 2\u00b9 instead of 2\u00b2 and growth every 4 clean steps instead of 2, the highest final scale with "
        "the recorded settings.")
    alone = P.what_if_sentence({"as recorded": traces["as recorded"]})
    assert alone == "Over the same 7 steps, the recorded settings ended at 2\u00b3 and skipped 1 step, before the " \
                    "scale first grew."
    clean = replay_scale_schedule([math.inf] * 3, init_scale=4.0, growth_interval=1)
    assert P.skips_before_first_growth(clean) == 0 and "skipped no step" in P.what_if_sentence({"as recorded": clean})
    with pytest.raises(ValueError, match="lack the 'as recorded'"):
        P.what_if_sentence({"start low": traces["start low"]})


# ---- static against dynamic ------------------------------------------------------------------------------------

def _runs(*, big_never_trains=True):
    big_skipped = (True, True, True) if big_never_trains else (True, False, False)
    return [ScalingRun("static 2\u2070", (3.0, 2.5, 2.0), (1.0,) * 3, (False,) * 3),
            ScalingRun("static 2\u00b2\u2074", (5.0, 5.0, 5.0), (2.0**24,) * 3, big_skipped),
            ScalingRun("dynamic (GradScaler)", (3.5, 2.5, 2.25), (65536.0,) * 3, (False,) * 3)]


def test_static_facts_measure_the_runs_that_trained_and_name_those_that_never_did():
    facts = P.static_facts(_runs())
    assert facts == {"static_big_skipped": 3, "static_steps": 3, "static_spread": 0.25, "static_max_step_gap": 0.5,
                     "static_never": "static 2\u00b2\u2074 skipped every step and never trained."}
    assert isinstance(facts["static_never"], Prose)
    trained = P.static_facts(_runs(big_never_trains=False))
    assert trained["static_never"] == "" and trained["static_big_skipped"] == 1
    assert trained["static_spread"] == 3.0 and trained["static_max_step_gap"] == 3.0


def test_static_facts_refuse_runs_that_never_trained_or_hold_no_static_run():
    never = [ScalingRun("static 2\u00b2\u2074", (5.0,), (2.0**24,), (True,))]
    with pytest.raises(ValueError, match="no run trained"):
        P.static_facts(never)
    with pytest.raises(ValueError, match="no static run"):
        P.static_facts([_runs()[2]])


def test_static_runs_table():
    table = P.static_runs_table(_runs())
    assert isinstance(table, MarkdownTable)
    assert table.splitlines() == ["| run | skipped steps | final loss |", "|---|---|---|",
                                  "| static 2\u2070 | 0 of 3 | 2.000 |", "| static 2\u00b2\u2074 | 3 of 3 | 5.000 |",
                                  "| dynamic (GradScaler) | 0 of 3 | 2.250 |"]


# ---- gradient fidelity -------------------------------------------------------------------------------------------

def _fidelity(overflow_at_1=False, top_overflows=True):
    scales = (1.0, 256.0, 65536.0, 2.0**24)
    nan = {"a": math.nan, "b": math.nan, "c": math.nan}
    error = {1.0: nan if overflow_at_1 else {"a": 0.01, "b": 0.04, "c": 0.02},
             256.0: {"a": 0.001, "b": 0.002, "c": 0.0015}, 65536.0: {"a": 0.0011, "b": 0.0025, "c": 0.0012},
             2.0**24: nan if top_overflows else {"a": 0.003, "b": 0.003, "c": 0.003}}
    lost = {1.0: {"a": 0.0, "b": 0.5, "c": 0.25}, 256.0: {"a": 0.0, "b": 0.125, "c": 0.0},
            65536.0: {"a": 0.0, "b": 0.0, "c": 0.0}, 2.0**24: {"a": 0.0, "b": 0.0, "c": 0.0}}
    return ScaleFidelity(scales, ("a", "b", "c"), 30, 2, error, lost,
                         {1.0: overflow_at_1, 256.0: False, 65536.0: False, 2.0**24: top_overflows})


def test_fidelity_facts_pick_the_best_scale_by_its_worst_error_and_the_plateau_by_medians():
    facts = P.fidelity_facts(_fidelity())
    assert facts == {"fid_steps": 30, "fid_worst_1": "4.0% (`b`)", "fid_worst_best": "0.20%", "fid_best": "2\u2078",
                     "fid_median_ratio": 0.02 / 0.0015, "fid_within": 25.0, "fid_batches": 2,
                     "fid_median_gap": pytest.approx(100 * (0.0015 / 0.0012 - 1)),
                     "fid_plateau": "2\u2078 and 2\u00b9\u2076", "fid_overflow": "2\u00b2\u2074", "fid_noise": "No FP32 entry was that small here",
                     "fid_noise_floor": "2\u207b\u00b2\u2074", "fid_lost_by_scale": "50.000% at 2\u2070, 12.500% at 2\u2078 and 0.000% at 2\u00b9\u2076"}
    assert all(isinstance(facts[k], Prose) for k in ("fid_worst_1", "fid_worst_best", "fid_best", "fid_plateau"))
    assert P.fidelity_facts(_fidelity(), within=1.0)["fid_plateau"] == "2\u2078 and 2\u00b9\u2076"   # 2^16's median is lower
    no_overflow = P.fidelity_facts(_fidelity(top_overflows=False))
    assert no_overflow["fid_overflow"] == "none" and no_overflow["fid_plateau"] == "2\u2078 and 2\u00b9\u2076"


def test_lost_by_scale_gives_each_scales_largest_share_and_groups_equal_ones():
    # lost: 2^0 at most 50%, 2^8 12.5%, 2^16 0%; 2^24 overflowed and is left out
    assert P.lost_by_scale(_fidelity()) == "50.000% at 2\u2070, 12.500% at 2\u2078 and 0.000% at 2\u00b9\u2076"
    assert P.fidelity_facts(_fidelity())["fid_lost_by_scale"] == P.lost_by_scale(_fidelity())
    same = dataclasses.replace(_fidelity(top_overflows=False))
    assert P.lost_by_scale(same) == ("50.000% at 2\u2070, 12.500% at 2\u2078 and 0.000% at 2\u00b9\u2076 and "
                                    "2\u00b2\u2074 alike")
    every = dataclasses.replace(_fidelity(), overflowed={sc: True for sc in _fidelity().scales})
    with pytest.raises(ValueError, match="every scale overflowed"):
        P.lost_by_scale(every)


def test_noise_note_names_what_entries_lost_left_out_and_why_a_key_bias_is_noise():
    fid = dataclasses.replace(_fidelity(), noise={"blocks.0.attn.qkv.bias": 64.0, "b": 1.5})
    note = P.noise_note(fid)
    assert note.startswith("Left out here, in entries per batch, averaged over 2 batches: 64 of "
                           "`blocks.0.attn.qkv.bias` and 1.5 of `b`. ")
    assert "zero in exact arithmetic" in note
    assert P.noise_note(dataclasses.replace(_fidelity(), noise={"b": 2.0})) == (
        "Left out here, in entries per batch, averaged over 2 batches: 2 of `b`")
    one_batch = dataclasses.replace(_fidelity(), batches=1, noise={"b": 2.0})
    assert P.noise_note(one_batch) == "Left out here, in entries per batch: 2 of `b`"


def test_fidelity_facts_need_scale_1_without_overflow_and_a_factor_of_at_least_1():
    with pytest.raises(ValueError, match="scale 1"):
        P.fidelity_facts(_fidelity(overflow_at_1=True))
    with pytest.raises(ValueError, match="at least 1"):
        P.fidelity_facts(_fidelity(), within=0.5)


def test_fidelity_table_shows_medians_worst_parameters_losses_and_overflow():
    assert P.median_errors(_fidelity()) == {1.0: 0.02, 256.0: 0.0015, 65536.0: 0.0012}
    assert P.fidelity_table(_fidelity()).splitlines() == [
        "| loss scale | median error over parameters | largest error (parameter) | largest share of entries lost |",
        "|---|---|---|---|",
        "| 2\u2070 | 2.000% | 4.000% (`b`) | 50.000% |",
        "| 2\u2078 | 0.150% | 0.200% (`b`) | 12.500% |",
        "| 2\u00b9\u2076 | 0.120% | 0.250% (`b`) | 0.000% |",
        "| 2\u00b2\u2074 | overflow: inf gradients | - | - |",
    ]


# ---- pitfalls ----------------------------------------------------------------------------------------------------

def _demos():
    def found(name):
        return (Finding(name, 0, "m"),)
    return [
        # the gradient at 1/S of the correct loop's; the weights keep 3 of the 4 units SGD asked for
        PitfallDemo("clip_before_unscale", found("clip_before_unscale"), None, 3, 3, 0.25, 2.0**20,
                    step_grad_norms=(2.0**-20, 2.0**-20), step_requested=(2.0, 2.0), step_moved=(1.0, 2.0)),
        PitfallDemo("update_every_microbatch", found("update_every_microbatch"), None, 6, 3, 0.5, 2.0**15),
        PitfallDemo("scheduler_on_skipped_step", found("scheduler_on_skipped_step") + found("clip_before_unscale"),
                    None, 3, 4, 0.75, 2.0**15),
        PitfallDemo("unscale_twice", (), "RuntimeError: unscale_() has already been called", 0, 0, 0.0, 2.0**16),
        PitfallDemo("scaler_with_bf16", found("scaler_with_bf16"), None, 4, 4, 7.0, 65536.0),
        PitfallDemo("correct loop", (), None, 3, 3, 2.0, 2.0**15,
                    step_grad_norms=(1.0, 1.0), step_requested=(0.5, 0.5), step_moved=(0.5, 0.5)),
    ]


def test_pitfall_table_says_what_was_caught_raised_and_how_far_the_weights_moved():
    assert P.pitfall_table(_demos()).splitlines() == [
        "| planted mistake | caught | raised | steps | LR steps | moved / correct |",
        "|---|---|---|---|---|---|",
        "| clip_before_unscale | yes | - | 3 | 3 | 0.125 |",
        "| update_every_microbatch | yes | - | 6 | 3 | 0.250 |",   # three digits, as the prose glues them
        "| scheduler_on_skipped_step | scheduler_on_skipped_step, clip_before_unscale | - | 3 | 4 | 0.375 |",
        "| unscale_twice | nothing | RuntimeError | 0 | 0 | 0 |",
        "| scaler_with_bf16 | yes | - | 4 | 4 | - |",
        "| correct loop | nothing | - | 3 | 3 | 1.00 |",
    ]


def test_pitfall_facts_compare_each_demo_with_the_correct_loop():
    facts = P.pitfall_facts(_demos())
    assert facts == {"clip_ratio": 0.125, "clip_scale_log2": 20, "clip_scale": "2\u00b2\u2070", "sched_ratio": 0.375, "micro_steps": 6,
                     "micro_ratio": 0.25, "correct_steps": 3, "clip_shrink": P.CLIP_BEFORE_UNSCALE_SHRINK,
                     "clip_inv_scale": 2.0**-20, "clip_grad_ratio": 2.0**-20, "clip_kept_pct": 75.0,
                     "correct_kept_pct": 100.0}
    # the shrink formula follows a colon: lower case, and it says when it applies
    assert P.CLIP_BEFORE_UNSCALE_SHRINK.startswith("when the scaled norm *S* \u00d7 norm exceeds `max_norm` "
                                                   "(otherwise nothing is clipped)")
    no_step = [dataclasses.replace(d, step_grad_norms=(), step_requested=(), step_moved=()) for d in _demos()]
    with pytest.raises(ValueError, match="need a first optimizer step"):
        P.pitfall_facts(no_step)
    # the disabled scaler never scales, so its planted overflow never happens: one more step than the correct loop
    disabled = PitfallDemo("disabled_scaler", (Finding("disabled_scaler", 0, "m"),), None, 4, 4, 2.5, 1.0)
    with_disabled = P.pitfall_facts([disabled, *_demos()])
    assert (with_disabled["disabled_steps"], with_disabled["disabled_ratio"]) == (4, 1.25)
    with pytest.raises(ValueError, match="no correct loop"):
        P.pitfall_facts(_demos()[:-1])
    with pytest.raises(ValueError, match="no correct loop"):
        P.pitfall_table(_demos()[:-1])
    with pytest.raises(ValueError, match="lack update_every_microbatch"):
        P.pitfall_facts([d for d in _demos() if d.name != "update_every_microbatch"])


def test_pitfall_fixes_list_every_pitfall_with_its_text():
    lines = P.pitfall_fixes().splitlines()
    assert len(lines) == len(PITFALLS)
    name, text = next(iter(PITFALLS.items()))
    assert lines[0] == f"- **{name}**: {text}"


# ---- errata and exercises -------------------------------------------------------------------------------------------

def test_scaling_errata_state_each_measurement():
    rows = P.scaling_errata(DEFAULTS, default_steps=10, default_scale=65536.0, fast_steps=20, fast_scale=2.0**36,
                            clip_ratio=8.473883580725116e-07, refusal="The growth factor must be > 1.0.")
    assert [c for c, _ in rows] == [
        "GradScaler doubles the scale after every step without overflow.", "The loss scale is capped at 2\u00b9\u2076.",
        "Clipping before unscaling does nothing, or produces NaN.",
        "For static loss scaling, use `GradScaler(growth_factor=1.0)`."]
    assert rows[0][1] == ("It grows only after `growth_interval` (default 2000) clean steps in a row: after 10 clean "
                          "steps the real GradScaler's scale is still 65536.")
    assert rows[1][1] == ("There is no cap: with `growth_interval=1`, 20 clean steps take the real GradScaler from "
                          "2\u00b9\u2076 to 2\u00b3\u2076. 2\u00b9\u2076 is only the default initial scale.")
    assert rows[2][1] == ("It clips the still-scaled gradients to `max_norm`, so once unscaled their norm is "
                          "`max_norm`/*S* instead of min(norm, `max_norm`), a step up to *S* times too small (the "
                          "pitfalls section gives the factor). The weights moved 8.47e-07 times as far as in the "
                          "correct loop (pitfalls table above).")
    assert rows[3][1] == ("torch refuses it: \"The growth factor must be > 1.0\". Multiply the loss by a constant and "
                          "divide the gradients by it before the step, or give GradScaler a `growth_interval` longer "
                          "than the run (it still backs off after an overflow).")
    accepted = P.scaling_errata(DEFAULTS, default_steps=10, default_scale=65536.0, fast_steps=20, fast_scale=2.0**36,
                                clip_ratio=0.5, refusal=None)
    assert accepted[3][1].startswith("The installed torch accepts it, and the scale then never grows. Multiply")


def test_scaling_errata_refuse_a_check_that_reached_the_growth_interval():
    with pytest.raises(ValueError, match="fewer than the growth interval"):
        P.scaling_errata(DEFAULTS, default_steps=2000, default_scale=65536.0, fast_steps=20, fast_scale=2.0**36,
                         clip_ratio=0.5, refusal=None)
    with pytest.raises(ValueError, match="positive"):
        P.scaling_errata(DEFAULTS, default_steps=10, default_scale=0.0, fast_steps=20, fast_scale=2.0**36,
                         clip_ratio=0.5, refusal=None)


def test_exercise_facts_replay_one_overflow_and_measure_adam():
    facts = P.exercise_facts(overflow_step=2, answer_step=4005)
    assert facts == {"ex_growth_after_backoff": 32768.0, "ex_growth_back": 65536.0, "ex_growth_answer": 131072.0,
                     "ex_adam_diff": adam_update_change(1024.0)}
    assert P.exercise_facts(overflow_step=0, answer_step=2001)["ex_growth_back"] == 65536.0
    with pytest.raises(ValueError, match="growth interval after the overflow"):
        P.exercise_facts(overflow_step=2, answer_step=2002)


def test_adam_update_change_is_epsilons_share_only():
    assert adam_update_change(1.0) == 0.0
    # one Adam step moves each weight by lr * g / (|g| + eps) (bias-corrected moments of one step); the
    # smallest |g| of the evenly spaced gradients is half their spacing
    eps, g = 1e-8, 1e-3 / 999
    expected = (1024 * g / (1024 * g + eps) - g / (g + eps)) / (1e-3 / (1e-3 + eps))
    assert adam_update_change(1024.0) == pytest.approx(expected, rel=0.05)
    for bad in (0.0, math.inf, True, "2"):
        with pytest.raises(ValueError, match="scale"):
            adam_update_change(bad)
    with pytest.raises(ValueError, match="size"):
        adam_update_change(2.0, size=1)


def test_pitfall_setting_facts_name_the_loop_the_demos_run():
    assert P.pitfall_setting_facts() == {"pit_micro": "two", "pit_width": 8, "pit_capability": "7.5",
                                         "pit_no_scaler": "two", "pit_init_scale": "2\u00b9\u00b2\u2070",
                                         "pit_backoff": "2\u207b\u00b9\u2070\u2070"}
    # lesson 3's account of the clipping row's scale: the initial scale, backed off once at the planted skip
    from course_lib.scaling import DEMO_BACKOFF, DEMO_INIT_SCALE
    assert run_pitfall_demo("clip_before_unscale").final_scale == DEMO_INIT_SCALE * DEMO_BACKOFF
    # a step per micro-batch takes DEMO_ACCUMULATION times the correct loop's optimizer steps
    every_micro, correct = run_pitfall_demo("update_every_microbatch"), run_pitfall_demo(None)
    assert every_micro.optimizer_steps == DEMO_ACCUMULATION * correct.optimizer_steps
    # lesson 3 says the weights still move about as far (SGD's steps on halves add up to the step on the sum)
    assert 0.9 < every_micro.update_norm / correct.update_norm < 1.1
    # the rows without a scaler are the ones that say so, and both are autocast rows
    assert all(n in PITFALLS and n in AUTOCAST_PITFALLS_DTYPE for n in NO_SCALER_PITFALLS)
