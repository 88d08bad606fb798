"""Lesson 9's facts, phrases, tables and errata, each computed from a result built by hand with known numbers."""

import math

import pytest
import torch

from course_lib.bench.timing import Timing
from course_lib.checkup import Checkup
from course_lib.device import SizeProfile
from course_lib.glue import Prose
from course_lib.monitor import Alert, MatmulStats, MonitorLog, NonFiniteReport, TensorSummary
from course_lib.monitor.recovery import RecoveryEvent
from course_lib.results import Provenance, Record, RecordedResult
from course_lib.scaling.pitfalls import Finding
from course_lib.studies import monitoring as M
from course_lib.studies import monitoring_prose as P
from course_lib.tables import MarkdownTable


def _alert(step, kind, layer, message="m"):
    return Alert(step, kind, layer, message)


def _trend(alerts=()):
    flush = {
        "head:grad_output": (0.0, 0.25, 0.5),
        "blocks.0.attn.qkv:grad_output": (0.125, 0.75, 0.25),
        "blocks.1.attn.qkv:grad_output": (0.0, 0.5, 0.375),
        "blocks.0.attn.qkv.bias": (0.375, 0.25, 0.25),
        "blocks.1.attn.qkv.bias": (0.125, 0.5, 0.25),
    }
    return M.UnderflowTrend("FP16", (0, 5, 10), flush, (5.5, 4.0, 3.25, 2.75), tuple(alerts))


def test_alert_table_lists_each_alert_and_says_when_there_is_none():
    table = M.alert_table([_alert(5, "underflow", "head:grad_output", "head: 22% would flush")])
    assert isinstance(table, MarkdownTable)
    assert table.splitlines() == ["| step | alert | gradient | message |", "|---|---|---|---|",
                                  "| 5 | underflow | `head:grad_output` | head: 22% would flush |"]
    assert M.alert_table([]) == "No alerts." and isinstance(M.alert_table([]), MarkdownTable)


def test_underflow_trend_facts_name_the_growing_gradient_the_biases_and_the_qkv_peak():
    alerts = [_alert(0, "underflow", "blocks.0.attn.qkv.bias"), _alert(0, "underflow", "blocks.1.attn.qkv.bias"),
              _alert(10, "underflow", "head:grad_output"), _alert(3, "non_finite_loss", None)]
    facts = M.underflow_trend_facts(_trend(alerts))
    assert facts == {
        "trend_steps": 4, "trend_every": 5, "trend_grow_name": "`head:grad_output`", "trend_grow_first": 0.0, "trend_grow_last": 50.0,
        "trend_grow_alert": "at step 10", "trend_loss_first": 5.5, "trend_loss_last": 2.75,
        "trend_bias": "`blocks.0.attn.qkv.bias` and `blocks.1.attn.qkv.bias`", "trend_bias_share": 50.0,
        "trend_bias_shares": "up to 37.5% of their values at step 0, and 50.0% at their peak, step 5",
        "trend_qkv_name": "`blocks.0.attn.qkv:grad_output`", "trend_qkv_first": 12.5, "trend_qkv_first_step": 0,
        "trend_qkv_peak": 75.0, "trend_qkv_peak_step": 5, "trend_qkv_last": 25.0,
        "trend_threshold": pytest.approx(10.0), "trend_default_threshold": 25.0,   # the run's, the monitor's
    }
    for name in ("trend_grow_name", "trend_grow_alert", "trend_bias", "trend_bias_shares", "trend_qkv_name"):
        assert isinstance(facts[name], Prose)
    assert type(facts["trend_steps"]) is int and type(facts["trend_grow_last"]) is float


def test_underflow_trend_facts_without_alerts_say_so():
    facts = M.underflow_trend_facts(_trend())
    assert facts["trend_grow_alert"] == "not at all"
    assert facts["trend_bias"] == "no bias" and facts["trend_bias_share"] == 0.0


def test_one_alerted_bias_whose_share_is_largest_at_the_first_step_has_no_later_peak():
    facts = M.underflow_trend_facts(_trend([_alert(0, "underflow", "blocks.0.attn.qkv.bias")]))
    assert facts["trend_bias_shares"] == "37.5% of its values at step 0"
    assert facts["trend_bias_share"] == 37.5


def test_underflow_trend_facts_refuse_a_trend_without_a_qkv_output_gradient():
    trend = M.UnderflowTrend("FP16", (0,), {"head:grad_output": (0.5,)}, (1.0,), ())
    with pytest.raises(ValueError, match="qkv:grad_output"):
        M.underflow_trend_facts(trend)
    with pytest.raises(ValueError, match="no sampled gradients"):
        M.underflow_trend_facts(M.UnderflowTrend("FP16", (), {}, (), ()))


@pytest.mark.parametrize("alerts, sentence", [
    ([], "It raised no other alert."),
    ([_alert(0, "underflow", "blocks.1.attn.qkv.bias"), _alert(0, "underflow", "blocks.0.attn.qkv.bias")],
     "Its 2 other alerts were underflow alerts on `blocks.0.attn.qkv.bias` and `blocks.1.attn.qkv.bias` at "
     "step 0, the key biases of the first section again."),
    ([_alert(10, "underflow", "head.weight"), _alert(9, "underflow", "blocks.0.attn.qkv.bias")],
     "Its 2 other alerts were underflow alerts on `blocks.0.attn.qkv.bias` and `head.weight` at steps 9 and 10."),
    ([_alert(4, "scale_collapse", None)], "Its other alert was a scale_collapse alert on the run at step 4."),
    ([_alert(4, "scale_collapse", None), _alert(5, "underflow", "head.weight")],
     "Its 2 other alerts were scale_collapse on the run and underflow on `head.weight` at steps 4 and 5."),
])
def test_other_alerts_sentence(alerts, sentence):
    assert M.other_alerts_sentence(alerts) == sentence


def test_dead_layer_facts_take_the_first_zero_gradient_alert_and_the_losses_around_the_death():
    log = MonitorLog(steps=[0, 1, 2, 3, 4], losses=[5.0, 4.5, 4.0, 3.5, 3.0], sampled_steps=[0, 3])
    alerts = (_alert(4, "zero_gradients", "blocks.1.ln2.weight"), _alert(3, "zero_gradients", "blocks.1.fc.bias"),
              _alert(0, "underflow", "blocks.0.attn.qkv.bias"))
    facts = M.dead_layer_facts(M.DeadLayerRun("blocks.1.fc", 2, log, alerts))
    assert facts == {
        "dead_every": 3, "dead_layer": "`blocks.1.fc`", "dead_at": 2, "dead_alert_step": 3,
        "dead_alert_layers": "`blocks.1.fc.bias`, `blocks.1.ln2.weight`", "dead_loss_at": 4.5, "dead_loss_end": 3.0,
        "dead_other_alerts": "Its other alert was an underflow alert on `blocks.0.attn.qkv.bias` at step 0, the key "
                             "bias of the first section again.",
    }


def test_dead_layer_facts_refuse_a_run_whose_death_was_not_seen():
    log = MonitorLog(steps=[0, 1, 2], losses=[3.0, 2.0, 1.0])
    with pytest.raises(ValueError, match="zero_gradients"):
        M.dead_layer_facts(M.DeadLayerRun("fc", 1, log, (_alert(0, "underflow", "x"),)))
    with pytest.raises(ValueError, match="before and from step 0"):
        M.dead_layer_facts(M.DeadLayerRun("fc", 0, log, (_alert(1, "zero_gradients", "fc.weight"),)))
    for sampled in ([], [0], [0, 1, 3]):    # no interval to name
        uneven = MonitorLog(steps=[0, 1, 2], losses=[3.0, 2.0, 1.0], sampled_steps=sampled)
        with pytest.raises(ValueError, match="no single interval"):
            M.dead_layer_facts(M.DeadLayerRun("fc", 1, uneven, (_alert(1, "zero_gradients", "fc.weight"),)))


def _report(module, phase):
    s = TensorSummary((2,), "float32", 1.0, 0, 0)
    return NonFiniteReport(module, phase, (s,), (s,))


OVERFLOW_ANOMALY = "Function 'LogSoftmaxBackward0' returned nan values in its 0th output."
FWD = M.NanHunt("blocks.1.fc", "nan", _report("blocks.1.fc", "forward"),
                "Function 'LogSoftmaxBackward0' returned nan values in its 0th output.", 0.01, 0.02, 0.05)
BWD = M.NanHunt("blocks.1.attn.qkv", "nan_backward", _report("blocks.1.attn.qkv", "backward"),
                "Function '_NanGradBackward' returned nan values in its 0th output.", 0.004, 0.005, 0.01)


def test_anomaly_function_reads_the_quoted_name():
    assert M.anomaly_function(FWD.anomaly) == "LogSoftmaxBackward0"
    assert M.anomaly_function("no quotes here") == "no quotes here"
    assert M.anomaly_function(None) is None


def test_nan_hunt_table_and_facts():
    quiet = M.NanHunt("fc", "nan", None, None, 1.0, 1.0, 1.0)
    assert M.nan_hunt_table([FWD, BWD, quiet]).splitlines() == [
        "| planted | in | the locator names | anomaly mode says |", "|---|---|---|---|",
        "| NaN in the forward pass | `blocks.1.fc` | `blocks.1.fc`, forward pass | "
        "Function 'LogSoftmaxBackward0' returned nan values in its 0th output. |",
        "| NaN in the backward pass | `blocks.1.attn.qkv` | `blocks.1.attn.qkv`, backward pass | "
        "Function '_NanGradBackward' returned nan values in its 0th output. |",
        "| NaN in the forward pass | `fc` | nothing | nothing |"]
    facts = M.nan_hunt_facts(FWD, BWD)
    assert facts == {"hunt_fwd_layer": "`blocks.1.fc`", "hunt_fwd_anomaly": "`LogSoftmaxBackward0`",
                     "hunt_locator_cost": 100 * (0.005 / 0.004 - 1), "hunt_anomaly_cost": 100 * (0.01 / 0.004 - 1),
                     "hunt_locator_costs": "+100% and +25%", "hunt_anomaly_costs": "+400% and +150%"}
    assert isinstance(facts["hunt_locator_costs"], Prose)
    assert M.nan_hunt_facts(quiet, BWD)["hunt_fwd_anomaly"] == "nothing"
    with pytest.raises(ValueError, match="'nan' and a 'nan_backward'"):
        M.nan_hunt_facts(BWD, FWD)


def _demo(events=True):
    without = MonitorLog(steps=[0, 1, 2, 3], losses=[5.0, 4.0, math.inf, math.inf], scales=[4.0, 4.0, 2.0, 0.5],
                         skipped=[False, False, True, True])
    recovered = MonitorLog(steps=[0, 1, 2, 1, 2, 3], losses=[5.0, 4.0, math.inf, 4.0, 3.5, 3.0])
    alert = _alert(2, "non_finite_loss", None)
    ev = (RecoveryEvent(2, 1, alert, "bf16_autocast"),) if events else ()
    return M.RecoveryDemo(1, 4, without, (alert, _alert(3, "scale_collapse", None), _alert(2, "non_finite_loss", None)),
                          recovered, ev)


def test_recovery_facts():
    facts = M.recovery_facts(_demo())
    assert facts == {
        "rec_threshold": 65504.0 / 2**24, "rec_fault_at": 1, "rec_steps": 4, "rec_skipped": 2, "rec_after": 3,
        "rec_final_scale": 0.5, "rec_alert_step": 2, "rec_alert_kind": "non_finite_loss", "rec_back_to": 1,
        "rec_final_loss": 3.0, "rec_start_loss": 5.0, "rec_alerts_without": "non_finite_loss, scale_collapse",
    }
    assert type(facts["rec_alert_kind"]) is str and isinstance(facts["rec_alerts_without"], Prose)
    with pytest.raises(ValueError, match="no recovery event"):
        M.recovery_facts(_demo(events=False))


# the unmonitored loop moves 10% between rounds 0 and 1: the noise; every step costs 25%, beyond it, and every
# 10 steps 5%, within it
COST = M.MonitorOverhead({0: 0.008, 1: 0.010, 10: 0.0084},
                         {0: (0.008, 0.0088, 0.008), 1: (0.0104, 0.0110, 0.010), 10: (0.0076, 0.0092, 0.0084)})


def test_noise_is_the_median_change_of_the_unmonitored_loop_between_rounds():
    assert COST.round_changes() == pytest.approx([0.1, 0.8 / 8.8])
    assert COST.noise() == pytest.approx(0.1)                       # of two, the upper median
    # one burst of load (the round at 2.0) moves two changes, not the median
    bursty = M.MonitorOverhead({0: 1.0}, {0: (1.0, 1.02, 1.0, 1.01, 2.0, 1.0)})
    assert max(bursty.round_changes()) == pytest.approx(2.0 / 1.01 - 1) and bursty.noise() == pytest.approx(0.02)
    with pytest.raises(ValueError, match="two rounds"):
        M.MonitorOverhead({0: 1.0}, {0: (1.0,)}).noise()
    with pytest.raises(ValueError, match="two rounds"):
        M.MonitorOverhead({0: 1.0}).noise()


def _cost(base, every10):
    """A run whose every-step block always costs 50%, and whose every-10 block took ``every10`` (seconds per
    round) beside the unmonitored ``base``; the seconds are the medians, as monitor_overhead keeps them."""
    med = lambda v: sorted(v)[len(v) // 2]  # noqa: E731
    return M.MonitorOverhead({0: med(base), 1: 1.5 * med(base), 10: med(every10)},
                             {0: tuple(base), 1: tuple(1.5 * t for t in base), 10: tuple(every10)})


# the unmonitored loop moves 5% (1.0 -> 1.05); every 10 steps: +20% overall, but +0% in the first round
UNRESOLVED = _cost((1.0, 1.05, 1.0), (1.0, 1.26, 1.2))
# the unmonitored loop moves 1%; every 10 steps 20% shorter in every round
FASTER = _cost((0.010, 0.0101, 0.010), (0.008, 0.008, 0.008))


@pytest.mark.parametrize("cost, every, verdict", [
    (COST, 1, "cost"), (COST, 10, "within noise"), (UNRESOLVED, 10, "unresolved"), (UNRESOLVED, 1, "cost"),
    (FASTER, 10, "faster"),
])
def test_overhead_verdict_counts_a_cost_only_where_every_round_is_beyond_the_noise(cost, every, verdict):
    assert P.overhead_verdict(cost, every) == verdict and verdict in P.OVERHEAD_VERDICTS


def test_from_five_rounds_on_one_burst_of_load_is_tolerated():
    # six rounds; the unmonitored block of round 2 caught a burst (3.0 s), so that round's overhead is -65%
    base = (1.0, 1.01, 3.0, 1.01, 1.0, 1.01)
    one_burst = _cost(base, (1.05, 1.06, 1.05, 1.06, 1.05, 1.06))
    assert one_burst.noise() == pytest.approx(0.01) and min(one_burst.round_overheads(10)) < -0.6
    assert P.overhead_verdict(one_burst, 10) == "cost"
    assert P.overhead_phrase(one_burst, 10, run="the run") == (
        "cost 5.0% in the run, beyond its timing noise of 1.0% in every round but at most one")
    assert "counts as a cost only where it exceeded that median in every round but at most one." in (
        P.overhead_sentence(one_burst))
    two_low = _cost(base, (1.05, 1.06, 1.05, 1.0, 1.05, 1.06))        # and round 3 shows no cost at all
    assert P.overhead_verdict(two_low, 10) == "unresolved"
    both = P.errata_rows(FWD, _demo(), one_burst, [], inf_raises=False, nan_raises=True, overflow_anomaly=OVERFLOW_ANOMALY)[3][1]
    assert both.startswith("Every step: +50.0% here; every 10 steps: +5.0%; both beyond the timing noise in every "
                           "round but at most one (the unmonitored loop")
    assert P.overhead_sentence(one_burst).endswith(
        "So watching every step made the mean step 50.0% longer and watching every 10 steps 5.0% longer: both costs "
        "by that rule.")
    assert P.errata_rows(FWD, _demo(), two_low, [], inf_raises=False, nan_raises=True, overflow_anomaly=OVERFLOW_ANOMALY)[3][1].startswith(
        "Every step: +50.0% here, beyond the timing noise in every round but at most one; every 10 steps: +4.0%, "
        "longer by more than the timing noise in only 4 of 6 rounds (")
    # a range that rounds to zero reads +0.0%, not -0.0%
    assert P.overhead_facts(_cost((1.0, 1.05), (0.9996, 1.0504)))["cost_range10"] == "+0.0% to +0.0%"
    # of three rounds, all must clear the noise: here two of three do
    assert P.overhead_verdict(_cost((1.0, 1.01, 1.0), (1.05, 1.06, 1.0)), 10) == "unresolved"


def test_overhead_verdict_needs_the_rounds():
    with pytest.raises(ValueError, match="two rounds"):
        P.overhead_verdict(M.MonitorOverhead({0: 1.0, 1: 2.0, 10: 1.0}), 10)
    with pytest.raises(ValueError, match="every=5"):
        P.overhead_verdict(COST, 5)


def test_overhead_table_and_facts():
    # the shortest step to four significant figures; the overheads to the sentences' decimals
    assert P.overhead_table(COST).splitlines() == [
        "| monitor | step (ms) | overhead | overhead in each round |", "|---|---|---|---|", "| none | 8.000 |  |  |",
        "| every step | 10.000 | +25.0% | +30.0%, +25.0%, +25.0% |",           # each round over its own none
        "| every 10 steps | 8.400 | +5.0% | -5.0%, +4.5%, +5.0% |"]
    facts = P.overhead_facts(COST)
    assert facts["cost_every1"] == 100 * (0.010 / 0.008 - 1) and facts["cost_every10"] == 100 * (0.0084 / 0.008 - 1)
    assert facts["cost_noise"] == pytest.approx(10.0)
    assert facts["cost_range10"] == "-5.0% to +5.0%" and facts["cost_range1"] == "+25.0% to +30.0%"
    assert facts["cost_sentence"] == (
        "The unmonitored loop, timed once a round, moved by a median 10.0% from one round to the next on its own "
        "(at most 10.0%): that is this run's noise, and an overhead counts as a cost only where it exceeded that "
        "median in every round. Single rounds' overheads ranged from +25.0% to +30.0% (every step) and from -5.0% to "
        "+5.0% (every 10 steps); the table compares the medians over rounds, with and without the monitor, so its "
        "overhead need not lie in the middle of that range. So watching every step made the mean step 25.0% longer, a cost by that rule; "
        "watching every 10 "
        "steps changed the mean step time by +5.0%, within that noise: no cost this run can tell from zero.")
    assert all(isinstance(facts[k], Prose) for k in ("cost_sentence", "cost_range1", "cost_range10"))
    with pytest.raises(ValueError, match=r"intervals \[10\]"):
        P.overhead_facts(M.MonitorOverhead({0: 1.0, 1: 2.0}))


def test_overhead_sentence_for_an_unresolved_and_a_shorter_step():
    assert P.overhead_sentence(UNRESOLVED).endswith(
        "from +0.0% to +20.0% (every 10 steps); the table compares the medians over rounds, with and without the "
        "monitor, so its overhead need not lie in the middle of that range. So watching every step made the mean "
        "step 50.0% longer, a cost by "
        "that rule; "
        "watching every 10 steps changed the mean step time by +20.0%, more than that noise overall, but the step "
        "was longer by more than the noise in only 2 of 3 rounds, where a cost must show in 3: inconclusive, "
        "neither a cost by that rule nor shown to be free.")
    assert P.overhead_sentence(FASTER).endswith(
        "watching every 10 steps made the mean step 20.0% shorter, by more than that noise in every round; a "
        "monitor only adds work, so the machine's load changed during the run.")
    with pytest.raises(ValueError, match="two rounds"):
        P.overhead_sentence(M.MonitorOverhead({0: 1.0, 1: 2.0, 10: 1.0}))


@pytest.mark.parametrize("cost, every, phrase", [
    (COST, 1, "cost 25.0% in the run, beyond its timing noise of 10.0% in every round"),
    (COST, 10, "cost nothing the run could separate from its timing noise (+5.0%, within the noise of 10.0%)"),
    (UNRESOLVED, 10, "was neither shown to cost time nor shown to be free in the run (+20.0%, longer by more "
                     "than the noise of 5.0% in only 2 of 3 rounds)"),
    (FASTER, 10, "cost nothing measurable in the run (its steps were 20.0% shorter, beyond the timing noise of 1.0% "
                 "in every round, which only a change in the machine's load explains)"),
])
def test_overhead_phrase_for_each_verdict(cost, every, phrase):
    assert P.overhead_phrase(cost, every, run="the run") == phrase


def _record(seconds, rounds=None, transfers=None, parameters=None):
    prov = Provenance("NVIDIA H100 80GB HBM3", "cuda", "2.11", "2026-01-01T00:00:00+00:00", "cmd", "abc", "3.12",
                      compute_capability="9.0")
    values = {"seconds": seconds} if rounds is None else {"seconds": seconds, "rounds": rounds}
    record = Record("monitor_overhead", {"profile": "full"} if parameters is None else parameters, values, prov)
    result = M.MonitorOverhead({int(k): v for k, v in seconds.items()},
                               {int(k): tuple(v) for k, v in (rounds or {}).items()}, transfers)
    return RecordedResult(record, result)


REC = _record({"0": 0.04, "1": 0.09, "10": 0.044})


def test_recorded_overhead_facts_with_and_without_a_record():
    # a record of today's full-size model (it stores the model's shape) is that model, not "of its day"
    today = _record({"0": 0.04, "1": 0.09, "10": 0.044}, parameters={"profile": "full", "course_model": {
        "d_model": 512, "n_layers": 8, "n_heads": 8, "context": 256, "batch": 64}})
    assert P.recorded_overhead_facts([today])["gpu_cost"].startswith(
        "Recorded on NVIDIA H100 80GB HBM3 (sm 9.0) with the full-size model: 40.00 ms")
    facts = P.recorded_overhead_facts([REC])
    assert facts["gpu_cost"] == (
        "Recorded on NVIDIA H100 80GB HBM3 (sm 9.0) with the full-size model of its day (the older 384-wide course "
        "model, narrower than today's): 40.00 ms a step without a monitor, "
        "90.00 ms watched every step (+125.0%) and 44.00 ms every 10 steps (+10.0%). The record keeps one median per "
        "setting and not its rounds, so it cannot say how much of the +10.0% every 10 steps is noise. This record "
        "is of the monitor as it was before this page's: it brought each statistic of each parameter back to the "
        "host with a `float()` of its own (`tests/test_monitor_batched.py` counts them on that code), each a wait "
        "for the GPU, so the GPU could not run ahead of Python on a sampled step (the record does not separate that "
        "from the arithmetic). The monitor on this page computes them where the gradients are and moves them to the "
        "host once per sampled step; until a record of it says what that leaves, sample every 10 steps or less "
        "often.")
    assert P.before_batching(REC)
    batched = _record({"0": 0.04, "1": 0.046, "10": 0.0405}, transfers=1.0)
    assert not P.before_batching(batched)
    new = P.recorded_overhead_facts([batched])
    assert new["gpu_cost"].endswith("(+1.2%). The record keeps one median per setting and not its rounds, so it "
                                    "cannot say how much of the +1.2% every 10 steps is noise. The statistics run on "
                                    "the GPU and came back to the host in 1 transfer per sampled step there.")
    # the model size comes from the record's profile
    small = P.recorded_overhead_facts([_record({"0": 0.04, "1": 0.09, "10": 0.044}, parameters={"profile": "small"})])
    assert small["gpu_cost"].startswith("Recorded on NVIDIA H100 80GB HBM3 (sm 9.0) with the 'small' profile's model:")
    assert "with a model size the record does not give:" in P.recorded_overhead_facts(
        [_record({"0": 0.04, "1": 0.09, "10": 0.044}, parameters={})])["gpu_cost"]
    none = P.recorded_overhead_facts([])
    assert set(none) == set(facts) == {"gpu_cost"}
    assert none["gpu_cost"].startswith("On a GPU the statistics run on the GPU and come back to the host once per "
                                       "sampled step") and "measure it there" in none["gpu_cost"]
    assert all(isinstance(v, Prose) for v in (*facts.values(), *none.values()))
    with pytest.raises(ValueError, match=r"intervals \[1\]"):
        P.recorded_step_seconds(_record({"0": 1.0, "10": 1.0}))


def test_the_live_timing_note_labels_a_cpu_run_as_such():
    small, full = SizeProfile("small"), SizeProfile("full", forced=True)
    assert P.live_timing_note("cpu", small).startswith("These are CPU timings of the small model on a shared")
    assert "GPU's overhead" in P.live_timing_note(torch.device("cpu"), small)
    # a full-size run forced on a CPU is still a CPU's timing
    assert P.live_timing_note("cpu", full).startswith("These are CPU timings of the full-size model")
    assert P.live_timing_note("cuda:0", full) == "These are timings of the full-size model on this page's CUDA device."


def test_the_hunt_timing_note_names_the_model_the_device_and_the_repeats():
    small, full = SizeProfile("small"), SizeProfile("full", forced=True)
    hunt = M.NanHunt("fc", "nan_backward", None, None, 1.0, 1.0, 1.0, repeats=7)
    assert P.hunt_timing_note(hunt, "cpu", small) == "one step of the small model on this CPU, median of 7"
    assert P.hunt_timing_note(hunt, "cuda:0", full) == "one step of the full-size model on this page's CUDA, median of 7"
    assert M.NanHunt("fc", "nan", None, None, 1.0, 1.0, 1.0).repeats == 5   # a record from before the field


def test_hunt_step_timings_go_through_the_device_aware_harness(monkeypatch):
    calls = []
    seconds = M._step_seconds(lambda: calls.append("step"), 3, torch.device("cpu"))
    assert seconds >= 0 and calls == ["step"] * 3          # exactly `repeats` timed calls, no warm-up
    seen = {}

    def fake(fn, **kwargs):
        seen.update(kwargs)
        return Timing((0.3, 0.1, 0.2), 0)
    monkeypatch.setattr(M, "time_function", fake)
    # on CUDA the harness times with events, so the step's kernels count, not only their launch
    assert M._step_seconds(lambda: None, 3, torch.device("cuda", 0)) == 0.2
    assert seen["device"] == torch.device("cuda", 0) and seen["min_repeats"] == seen["max_repeats"] == 3


@pytest.mark.parametrize("repeats, error", [(0, ValueError), (2.0, TypeError), (True, TypeError)])
def test_nan_hunt_refuses_a_bad_repeat_count(repeats, error):
    with pytest.raises(error, match="repeats"):
        M.nan_hunt(SizeProfile("small"), "cpu", repeats=repeats)


# a record that kept its rounds: the unmonitored loop moved 2% between them; every 10 steps cost 10%, beyond it
ROUNDS_REC = _record({"0": 0.04, "1": 0.09, "10": 0.044},
                     {"0": [0.04, 0.0408], "1": [0.09, 0.09], "10": [0.044, 0.044]})


def test_recorded_overhead_facts_judge_a_record_that_kept_its_rounds():
    facts = P.recorded_overhead_facts([ROUNDS_REC])
    assert ("(+10.0%). Its unmonitored loop moved by a median 2.0% between rounds: every 10 steps is beyond the "
            "timing noise in every round there. This record") in facts["gpu_cost"]
    quiet = _record({"0": 0.04, "1": 0.09, "10": 0.0404}, {"0": [0.04, 0.0408], "1": [0.09, 0.09],
                                                           "10": [0.0404, 0.0404]})
    assert P.overhead_takeaway(COST, [quiet], "cpu").endswith(
        "every 10 steps by +1.0% (every 10 steps within the timing noise; noise 2.0%).")


def test_the_takeaway_names_the_run_the_monitor_and_the_noise():
    assert P.overhead_takeaway(COST, [REC], "cpu") == (
        "Sampling every 10 steps cost nothing this page's CPU run could separate from its timing noise (+5.0%, "
        "within the noise of 10.0%). On NVIDIA H100 80GB HBM3 (sm 9.0), with the older monitor that read each "
        "statistic back separately, watching every step changed the step time by +125.0% and every 10 steps by "
        "+10.0% (noise not recorded).")
    assert P.overhead_takeaway(UNRESOLVED, [ROUNDS_REC], torch.device("cuda", 0)) == (
        "Sampling every 10 steps was neither shown to cost time nor shown to be free in this page's CUDA run (+20.0%, "
        "longer by more than the noise of 5.0% in only 2 of 3 rounds). On NVIDIA H100 80GB HBM3 (sm 9.0), with the "
        "older monitor that read each statistic back separately, watching every step changed the step time by "
        "+125.0% and every 10 steps by +10.0% (every 10 steps beyond the timing noise in every round; noise 2.0%).")
    batched = _record({"0": 0.04, "1": 0.046, "10": 0.0405}, transfers=1.0)
    assert ", with the monitor on this page, watching every step changed the step time by +15.0% and every 10 " \
           "steps by +1.2% (noise not recorded)." in P.overhead_takeaway(COST, [batched], "cpu")
    assert P.overhead_takeaway(FASTER, [], "cpu") == (
        "Sampling every 10 steps cost nothing measurable in this page's CPU run (its steps were 20.0% shorter, "
        "beyond the timing noise of 1.0% in every round, which only a change in the machine's load explains).")
    assert isinstance(P.overhead_takeaway(COST, [], "cpu"), Prose)
    with pytest.raises(ValueError, match=r"intervals \[10\]"):
        P.overhead_takeaway(M.MonitorOverhead({0: 1.0, 1: 2.0}), [], "cpu")


# the unmonitored loop moves 4.00% between rounds; every 10 steps is 4.04% shorter overall: to one decimal both
# read 4.0%, so a sentence saying "-4.0%, more than that noise of 4.0%" could not be checked by its reader
CLOSE = _cost((1.0, 1.04, 1.0, 1.04, 1.0, 1.04), (0.94, 1.04 * 0.9596, 1.0, 1.06, 0.9596, 0.99))


def test_a_comparison_with_the_noise_prints_enough_decimals_to_be_checked():
    assert CLOSE.noise() == pytest.approx(0.04) and CLOSE.overhead(10) == pytest.approx(-0.0404)
    assert f"{100 * CLOSE.noise():.1f}" == f"{-100 * CLOSE.overhead(10):.1f}"      # the trap
    assert P.percent_decimals(CLOSE) == 2
    assert P.overhead_verdict(CLOSE, 10) == "unresolved"
    sentence = P.overhead_sentence(CLOSE)
    assert "moved by a median 4.00% from one round" in sentence
    assert sentence.endswith("changed the mean step time by -4.04%, more than that noise overall, but the step was "
                             "shorter by more than the noise in only 4 of 6 rounds, where a cost must show in 5: "
                             "inconclusive, neither a cost by that rule nor shown to be free.")
    assert [row.split(" | ")[:3] for row in P.overhead_table(CLOSE).splitlines()[2:]] == [
        ["| none", "1040.0", ""], ["| every step", "1560.0", "+50.00%"], ["| every 10 steps", "998.0", "-4.04%"]]
    assert "from -6.00% to +1.92% (every 10 steps)" in sentence
    assert "(-4.04%, shorter by more than the noise of 4.00% in only 4 of 6 rounds)" in P.overhead_takeaway(
        CLOSE, [], "cpu")
    assert "every 10 steps: -4.04%, shorter by more than the timing noise in only 4 of 6 rounds (the unmonitored " \
           "loop alone moved by a median 4.00% between rounds)" in P.errata_rows(
               FWD, _demo(), CLOSE, [], inf_raises=False, nan_raises=True, overflow_anomaly=OVERFLOW_ANOMALY)[3][1]
    # a single round's extreme counts too: the every-step rounds' lowest is +4.04% against a noise of 4.00%
    low_round = M.MonitorOverhead({0: 1.0, 1: 1.5, 10: 1.2}, {0: (1.0, 1.04, 1.0), 1: (1.5, 1.082016, 1.5),
                                                              10: (1.2, 1.2, 1.2)})
    assert min(low_round.round_overheads(1)) == pytest.approx(0.0404) and P.percent_decimals(low_round) == 2
    # equal values read equal (no decimals are added for them); values apart at one decimal keep one
    equal = _cost((1.0, 1.05, 1.0), (1.05, 1.05, 1.05))
    assert equal.overhead(10) == pytest.approx(equal.noise()) and P.percent_decimals(equal) == 1
    assert P.percent_decimals(COST) == 1
    # a run that kept no rounds has no noise to compare with
    assert P.percent_decimals(M.MonitorOverhead({0: 1.0, 1: 2.0, 10: 1.0})) == 1


def test_the_printed_step_times_give_the_printed_overhead():
    # the reviewer's page: 11.0 and 10.5 ms printed beside -4.1% (10.5 / 11.0 - 1 is -4.5%)
    cost = _cost((0.011, 0.01144, 0.011), (0.01055, 0.0112, 0.0100))
    rows = [r.split(" | ") for r in P.overhead_table(cost).splitlines()[2:]]
    none, every10 = float(rows[0][1]), float(rows[2][1])
    assert rows[2][1] == "10.55" and rows[2][2] == "-4.1%"
    assert f"{100 * (every10 / none - 1):+.1f}%" == rows[2][2]
    # four significant figures whatever the size: 0.5 ms, 43 ms, 1.2 s
    for base, text in ((0.0005, "0.5000"), (0.0436, "43.60"), (1.2, "1200.0")):
        assert P.overhead_table(_cost((base, base), (base, base))).splitlines()[2] == f"| none | {text} |  |  |"


def _mm(layer, operand, fmt, flush, subnormal):
    return MatmulStats(layer, operand, fmt, 1.0, 0.0, flush, subnormal, 0.0)


STATS = {
    "FP16": (_mm("fc", "input", "FP16", 0.0, 0.0), _mm("fc", "weight", "FP16", 0.001, 0.002)),
    "E4M3 unscaled": (_mm("fc", "input", "E4M3", 0.125, 0.25), _mm("fc", "weight", "E4M3", 0.25, 0.25)),
    "E4M3 per-tensor scale": (_mm("fc", "input", "E4M3", 0.0, 0.0001), _mm("fc", "weight", "E4M3", 0.0, 0.0)),
}


def test_matmul_table_and_facts():
    assert M.matmul_table(STATS).splitlines() == [
        "| layer | operand | FP16: lost or subnormal | E4M3 unscaled: lost or subnormal | "
        "E4M3 per-tensor scale: lost or subnormal |", "|---|---|---|---|---|",
        "| `fc` | input | 0.00% | 37.50% | 0.01% |", "| `fc` | weight | 0.30% | 50.00% | 0.00% |"]
    assert M.matmul_facts(STATS) == {"mm_worst_layer": "`fc` weight", "mm_worst_share": 50.0,
                                     "mm_fp16_max": 100 * (0.001 + 0.002), "mm_scaled_max": 100 * 0.0001}
    with pytest.raises(ValueError, match="other operands"):
        M.matmul_table({"a": STATS["FP16"], "b": STATS["FP16"][::-1]})
    with pytest.raises(ValueError, match="E4M3 per-tensor scale"):
        M.matmul_facts({k: v for k, v in STATS.items() if k != "E4M3 per-tensor scale"})
    with pytest.raises(ValueError, match="no views"):
        M.matmul_table({})


@pytest.mark.parametrize("findings, phrase", [
    ((), "nothing"),
    ((Finding("unaligned_matmul", 0, "A width is not a multiple of 8: pad it."),
      Finding("clip_before_unscale", 0, "Gradients were clipped (or measured) while still scaled: unscale first.")),
     "`unaligned_matmul` (a width is not a multiple of 8) and `clip_before_unscale` (gradients were clipped while "
     "still scaled)"),
])
def test_checkup_facts(findings, phrase):
    report = Checkup("cpu", (), {}, (), 0.1, 2.0**18, "fp32", (), findings, True)
    assert M.checkup_facts(report) == {"checkup_findings": phrase, "checkup_speed": ""}


def test_checkup_speed_says_each_recipes_step_time_and_which_one_speed_turned_down():
    from course_lib.checkup import RecipeCheck

    def check(name, steps, unsupported=None):
        median = sorted(steps)[len(steps) // 2] if steps else 0.0
        return RecipeCheck(name, unsupported, (1.0,) * len(steps), 0, None, median, (), tuple(steps))

    fp32 = check("fp32", (0.5, 0.010, 0.011, 0.010))
    fast_bf16 = check("bf16_autocast", (0.4, 0.009, 0.010, 0.009))
    slow_fp16 = check("fp16_autocast_scaler", (0.9, 0.39, 0.40, 0.41))

    def report(*checks):
        return Checkup("cpu", (), {c.recipe: c for c in checks}, (), 0.1, 2.0**18, "fp32", (), (), False)

    assert M.checkup_speed(report(fp32, fast_bf16, slow_fp16)) == (
        "Here the median step took `bf16_autocast` 0.91 times and `fp16_autocast_scaler` 37 times FP32's; "
        "`fp16_autocast_scaler` was slower than FP32 at every step after the first, so that rule turns it down on "
        "this device whatever its loss.")
    slow_bf16 = check("bf16_autocast", (0.9, 0.39, 0.40, 0.41))
    assert M.checkup_speed(report(fp32, slow_bf16, slow_fp16)).endswith(
        "`bf16_autocast` and `fp16_autocast_scaler` were slower than FP32 at every step after the first, so that rule "
        "turns them down on this device whatever their loss.")
    assert M.checkup_speed(report(fp32, fast_bf16)).endswith(
        "no recipe was slower than FP32 at every step after the first here, so speed turned none down.")
    # a recipe that did not run is not timed; nothing ran beside FP32: nothing to say
    assert M.checkup_speed(report(fp32, check("bf16_autocast", (), unsupported="no BF16 here"))) == ""
    assert M.checkup_speed(report(fast_bf16)) == ""


def test_errata_rows_say_what_was_measured_with_and_without_a_record():
    rows = P.errata_rows(FWD, _demo(), COST, [REC], inf_raises=False, nan_raises=True, overflow_anomaly=OVERFLOW_ANOMALY)
    assert [c for c, _ in rows] == ["`detect_anomaly` shows where a NaN came from.",
                                    "GradScaler takes care of overflows.", "`detect_anomaly` catches overflows.",
                                    "Gradient monitoring is too slow to leave on."]
    assert rows[0][1] == ("Only from the backward pass. A NaN made in `blocks.1.fc`'s forward output was reported "
                          "as LogSoftmaxBackward0, the backward function at the loss; the locator named `blocks.1.fc`.")
    assert rows[1][1] == ("Of overflows in the scaled gradients. An FP16 forward overflow made it skip 2 of 3 steps "
                          "and drive the scale to 0.5; the run never recovered on its own.")
    assert rows[2][1] == ("It checks backward outputs for NaN only: a backward pass whose gradient is inf passed "
                          "without an error under it here (`anomaly_mode_raises`, in the folded cell above), one whose "
                          "gradient is NaN raised. A forward overflow is flagged only if its infs later turn into a NaN "
                          "in some backward output, and then late, where that NaN appears: the recovery section's FP16 "
                          "forward overflow, re-run for one step under it (the folded cell above this table), was "
                          "reported at `LogSoftmaxBackward0`, not at the layer that overflowed.")
    silent = P.errata_rows(FWD, _demo(), COST, [], inf_raises=False, nan_raises=True, overflow_anomaly=None)
    assert silent[2][1].endswith("raised nothing: its infs never became a NaN in a backward output.")
    assert rows[3][1] == ("Every step: +25.0% here, beyond the timing noise in every round; every 10 steps: +5.0%, "
                          "within the timing noise (the unmonitored loop alone moved by a median 10.0% between rounds). "
                          "Recorded on NVIDIA H100 80GB HBM3 (sm 9.0) with the older monitor that read each statistic "
                          "back separately: +125.0% and +10.0% (noise not recorded).")
    batched = P.errata_rows(FWD, _demo(), COST, [_record({"0": 0.04, "1": 0.05, "10": 0.041}, transfers=1.0)],
                            inf_raises=False, nan_raises=True, overflow_anomaly=OVERFLOW_ANOMALY)
    assert batched[3][1].endswith("Recorded on NVIDIA H100 80GB HBM3 (sm 9.0) with the monitor on this page: +25.0% "
                                  "and +2.5% (noise not recorded).")
    other = P.errata_rows(M.NanHunt("fc", "nan", None, None, 1, 1, 1), _demo(), COST, [],
                          inf_raises=True, nan_raises=False, overflow_anomaly=OVERFLOW_ANOMALY)
    assert other[0][1].endswith("reported as nothing, the backward function at the loss; the locator named nothing.")
    assert other[2][1].startswith("In this torch it raised on inf but not on NaN: a backward pass whose gradient "
                                  "is inf raised under it here (`anomaly_mode_raises`, in the folded cell above), one "
                                  "whose gradient is NaN passed.")
    both = P.errata_rows(FWD, _demo(), COST, [], inf_raises=True, nan_raises=True, overflow_anomaly=OVERFLOW_ANOMALY)
    assert both[2][1].startswith("In this torch it raised on inf as well as NaN:")
    assert other[3][1] == ("Every step: +25.0% here, beyond the timing noise in every round; every 10 steps: +5.0%, "
                           "within the timing noise (the unmonitored loop alone moved by a median 10.0% between "
                           "rounds).")
    rounds = _record({"0": 0.04, "1": 0.09, "10": 0.044}, {"0": [0.04, 0.0408], "1": [0.09, 0.09], "10": [0.044, 0.044]})
    assert P.errata_rows(FWD, _demo(), COST, [rounds], inf_raises=False, nan_raises=True, overflow_anomaly=OVERFLOW_ANOMALY)[3][1].endswith(
        "+125.0% and +10.0% (every 10 steps beyond the timing noise in every round; noise 2.0%).")
    with pytest.raises(ValueError, match="forward"):
        P.errata_rows(BWD, _demo(), COST, [], inf_raises=False, nan_raises=True, overflow_anomaly=OVERFLOW_ANOMALY)


# ---- the monitor in the reader's own loop, and the skip exercise ---------------------------------------

def _loop_log(skipped, scales):
    n = len(skipped)
    return MonitorLog(steps=list(range(n)), losses=[5.0 - 0.1 * i for i in range(n)], scales=list(scales),
                      skipped=list(skipped))


@pytest.mark.parametrize("skipped, scales, taken, sentence", [
    ([True, True, False, False], [4.0, 2.0, 1.0, 1.0], 2,
     "The scale fell after steps 0 and 1, so the monitor logged them as skipped; the scale went from 4 at the "
     "first step to 1 at the last. The optimizer's own step counter agrees: it took 2 steps in 4."),
    ([False, True, False], [4.0, 4.0, 2.0], 2,
     "The scale fell after step 1, so the monitor logged it as skipped; the scale went from 4 at the first step "
     "to 2 at the last. The optimizer's own step counter agrees: it took 2 steps in 3."),
    ([False, False], [8.0, 8.0], 2,
     "No step was skipped: the scale never fell (8 at the first step, 8 at the last). The optimizer's own step "
     "counter agrees: it took 2 steps in 2."),
    ([False, False], [8.0, 8.0], 1,
     "No step was skipped: the scale never fell (8 at the first step, 8 at the last). The optimizer's own step "
     "counter disagrees: it took 1 step in 2, not 2, so the scale's change did not tell every skip here."),
])
def test_own_loop_sentence_checks_the_log_against_the_optimizer(skipped, scales, taken, sentence):
    assert P.own_loop_sentence(_loop_log(skipped, scales), taken) == sentence


def test_own_loop_sentence_and_table_refuse_bad_input():
    with pytest.raises(ValueError, match="no steps"):
        P.own_loop_sentence(MonitorLog(), 0)
    with pytest.raises(ValueError, match="optimizer_steps"):
        P.own_loop_sentence(_loop_log([False], [1.0]), -1)
    with pytest.raises(ValueError, match="optimizer_steps"):
        P.own_loop_sentence(_loop_log([False], [1.0]), True)
    with pytest.raises(ValueError, match="no steps"):
        P.scaler_log_table(MonitorLog())


def test_scaler_log_table_has_a_row_per_step():
    assert P.scaler_log_table(_loop_log([True, False], [4.0, 2.0])).splitlines() == [
        "| step | loss | loss scale | skipped |", "|---|---|---|---|", "| 0 | 5.000 | 4 | yes |", "| 1 | 4.900 | 2 | no |"]


def test_optimizer_steps_taken_reads_the_optimizers_own_counter():
    import torch

    w = torch.nn.Parameter(torch.ones(2))
    adam = torch.optim.AdamW([w], lr=0.1)
    assert P.optimizer_steps_taken(adam) == 0
    for _ in range(3):
        w.grad = torch.ones(2)
        adam.step()
    assert P.optimizer_steps_taken(adam) == 3
    with pytest.raises(TypeError, match="SGD keeps no step counter"):
        P.optimizer_steps_taken(torch.optim.SGD([w], lr=0.1))
    with pytest.raises(TypeError, match="no step counter"):
        P.optimizer_steps_taken("adam")


def test_skip_exercise_facts():
    facts = P.skip_exercise_facts([1024, 1024, 512, 512, 512, 1024, 512, 512])
    assert facts == {"ex_skip_steps": "steps 1 and 5", "ex_skip_grew": "step 4", "ex_skip_count": 7}
    assert isinstance(facts["ex_skip_steps"], Prose)
    assert P.skip_exercise_facts([2.0, 2.0]) == {"ex_skip_steps": "no step", "ex_skip_grew": "no step",
                                                 "ex_skip_count": 1}
    with pytest.raises(ValueError, match="at least one more"):
        P.skip_exercise_facts([2.0])


def test_monitor_faults_record_from_the_h100_reads_back_typed():
    """The version-1 record (hand-made values) of monitor_faults loads into MonitorFaults, and the facts the
    lesson draws from a live run come out of it too."""
    from course_lib.experiments import recorded_results

    (rec,) = recorded_results("monitor_faults")
    faults = rec.result
    assert isinstance(faults, M.MonitorFaults) and set(faults.nan_hunts) == {k for k, _ in M.NAN_HUNTS}
    forward = faults.nan_hunts["nan"]
    assert forward.layer == "blocks.1.fc" and forward.report.module == "blocks.1.fc"
    assert forward.plain_s == rec.record.values["nan_hunts"]["nan"]["seconds"]["plain"]
    facts = M.underflow_trend_facts(faults.underflow_trend)
    assert facts["trend_every"] == 5 and facts["trend_steps"] == len(rec.record.values["underflow_trend"]["losses"])


# ---- the locator's report, and the faults recorded on a GPU beside the live run ----------------------------------

def test_locator_report_table_names_a_backward_passs_tensors_as_gradients():
    arriving = TensorSummary((4, 6), "float32", 6.5e-4, 0, 0)
    passed = TensorSummary((4, 2), "float32", math.nan, 8, 0)
    table = M.locator_report_table(NonFiniteReport("blocks.1.attn.qkv", "backward", (arriving,), (passed,)))
    assert isinstance(table, MarkdownTable) and table.splitlines() == [
        "| `blocks.1.attn.qkv`, backward pass | dtype and shape | largest finite magnitude | NaN | inf |",
        "|---|---|---|---|---|",
        "| gradient arriving (of its output) | float32 [4, 6] | 0.00065 | 0 | 0 |",
        "| gradient passed back (of its input) | float32 [4, 2] | none finite | 8 | 0 |"]
    two = TensorSummary((2,), "float16", 3.0, 0, 1)
    forward = M.locator_report_table(NonFiniteReport("fc", "forward", (arriving, arriving), (two,), op="matmul"))
    assert forward.splitlines()[0].startswith("| `matmul` in `fc`, forward pass |")
    assert forward.splitlines()[2:] == ["| input 1 | float32 [4, 6] | 0.00065 | 0 | 0 |",
                                        "| input 2 | float32 [4, 6] | 0.00065 | 0 | 0 |",
                                        "| output | float16 [2] | 3 | 0 | 1 |"]
    assert M.locator_report_table(None) == "The locator found no non-finite value."
    with pytest.raises(ValueError, match="phase"):
        M.locator_report_table(NonFiniteReport("fc", "sideways", (), ()))


def test_growing_and_qkv_peak_gradients():
    assert M.growing_gradient(_trend()) == "head:grad_output"                      # 0 -> 50%
    assert M.qkv_peak_gradient(_trend()) == "blocks.0.attn.qkv:grad_output"        # 75% at step 5
    with pytest.raises(ValueError, match="no sampled gradients"):
        M.growing_gradient(M.UnderflowTrend("FP16", (), {}, (1.0,), ()))


SMALL_MODEL = {"d_model": 64, "n_layers": 2, "n_heads": 2, "context": 64, "batch": 16}
FULL_MODEL = {"d_model": 384, "n_layers": 6, "n_heads": 6, "context": 256, "batch": 64}


def _faults_record(trend, hunts=None, course_model=FULL_MODEL):
    prov = Provenance("NVIDIA H100 80GB HBM3", "cuda", "2.11", "2026-01-01T00:00:00+00:00", "cmd", "abc", "3.12",
                      compute_capability="9.0")
    parameters = {"profile": "full"} if course_model is None else {"profile": "full", "course_model": course_model}
    faults = M.MonitorFaults(trend, hunts if hunts is not None else {"nan": FWD, "nan_backward": BWD}, _demo())
    return RecordedResult(Record("monitor_faults", parameters, {}, prov), faults)


def test_tokens_per_batch_and_flushed_at():
    assert P.tokens_per_batch(SMALL_MODEL) == 1024 and P.tokens_per_batch(FULL_MODEL) == 16384
    for bad in (None, {"context": 64}, {"context": 64, "batch": 0}, {"context": 64.0, "batch": 2}, "model"):
        with pytest.raises(ValueError):
            P.tokens_per_batch(bad)
    assert P.flushed_at(_trend(), "head:grad_output", 5) == 0.25
    with pytest.raises(ValueError, match="did not watch"):
        P.flushed_at(_trend(), "fc:grad_output", 5)
    with pytest.raises(ValueError, match="step 7 was not sampled"):
        P.flushed_at(_trend(), "head:grad_output", 7)


def test_recorded_trend_facts_put_the_record_beside_the_live_run():
    # the record samples further (to step 15) and flushes more of the logit gradient at step 10, the last shared
    recorded = M.UnderflowTrend("FP16", (0, 5, 10, 15), {
        "head:grad_output": (0.0, 0.5, 0.75, 0.875), "blocks.0.attn.qkv:grad_output": (0.5, 1.0, 0.75, 0.5)},
        (5.5, 4.0, 3.0, 2.5, 2.0), ())
    facts = P.recorded_trend_facts(_trend(), SMALL_MODEL, [_faults_record(recorded)], "cpu")
    assert facts["rt_table"].splitlines() == [
        "| gradient | run | tokens per batch | step 0 | step 10 | last sampled step |", "|---|---|---|---|---|---|",
        "| `head:grad_output` | this page (CPU) | 1,024 | 0.0% | 50.0% | 50.0% (step 10) |",
        "| `head:grad_output` | record (GPU) | 16,384 | 0.0% | 75.0% | 87.5% (step 15) |",
        "| `blocks.0.attn.qkv:grad_output` | this page (CPU) | 1,024 | 12.5% | 25.0% | 25.0% (step 10) |",
        "| `blocks.0.attn.qkv:grad_output` | record (GPU) | 16,384 | 50.0% | 75.0% | 50.0% (step 15) |"]
    assert facts["rt_sentence"] == (
        "Recorded on NVIDIA H100 80GB HBM3 (sm 9.0) with a model 384 wide, 6 blocks and 16,384 tokens per batch "
        "(this page's CPU run: 64 wide, 2 blocks, 1,024 tokens), FP16 would flush 75.0% of `head:grad_output` there "
        "against 50.0% here and 75.0% of `blocks.0.attn.qkv:grad_output` there against 25.0% here at step 10, the "
        "last step both sampled. An entry of `head:grad_output` is a probability divided by the tokens in the batch "
        "(the loss is their mean), so it flushes when that probability is at most the tokens times 2.98e-08, half "
        "FP16's smallest subnormal: 0.00049 there, 3.1e-05 here, 16 times higher in the record. That fits the "
        "record's larger share, but the two runs differ in their models too, and neither measured the "
        "probabilities, so the record does not say how much of the difference the batch explains. Why the "
        "record's share of `blocks.0.attn.qkv:grad_output` differs from this page's, the numbers here do not say.")
    assert isinstance(facts["rt_sentence"], Prose) and isinstance(facts["rt_table"], MarkdownTable)
    # a record whose logit gradient flushes less, although its threshold is higher: no "fits"
    less = M.UnderflowTrend("FP16", (0, 5, 10), {"head:grad_output": (0.0, 0.0, 0.25),
                                                  "blocks.0.attn.qkv:grad_output": (0.5, 1.0, 0.75)}, (5.0,), ())
    text = P.recorded_trend_facts(_trend(), SMALL_MODEL, [_faults_record(less)], "cpu")["rt_sentence"]
    assert "Yet the record's share is not the one that threshold predicts larger, and the two runs" in text
    none = P.recorded_trend_facts(_trend(), SMALL_MODEL, [], "cpu")
    assert none["rt_table"] == "" and none["rt_sentence"].startswith("No GPU record of `monitor_faults` yet")
    apart = M.UnderflowTrend("FP16", (1, 2), {n: (0.0, 0.0) for n in _trend().flush}, (5.0,), ())
    with pytest.raises(ValueError, match="share no sampled step"):
        P.recorded_trend_facts(_trend(), SMALL_MODEL, [_faults_record(apart)], "cpu")
    with pytest.raises(ValueError, match="did not watch"):
        P.recorded_trend_facts(_trend(), SMALL_MODEL, [_faults_record(less.__class__(
            "FP16", (0, 5, 10), {"head:grad_output": (0.0, 0.0, 0.0)}, (5.0,), ()))], "cpu")


def test_hunt_timing_table_and_the_recorded_sentence():
    table = P.hunt_timing_table({"this page (CPU)": {"nan": FWD, "nan_backward": BWD}})
    assert table.splitlines() == [
        "| run | healthy step timed | repeats (median) | plain (ms) | locator (ms) | anomaly mode (ms) |",
        "|---|---|---|---|---|---|",
        "| this page (CPU) | beside the forward fault | 5 | 10.0 | 20.0 (+100%) | 50.0 (+400%) |",
        "| this page (CPU) | beside the backward fault | 5 | 4.0 | 5.0 (+25%) | 10.0 (+150%) |"]
    with pytest.raises(ValueError, match="no hunts"):
        P.hunt_timing_table({})
    assert P.recorded_hunt_sentence([_faults_record(_trend())]) == (
        "Recorded on NVIDIA H100 80GB HBM3 (sm 9.0), one step of a model 384 wide, 6 blocks: the locator added "
        "+100% and +25% and anomaly mode +400% and +150% in the 2 timings of the same healthy step, whose plain "
        "time itself came out at 10.0 and 4.0 ms (medians of 5), so the percentages are rough; in every timing "
        "there, each tool made the step at least 1.2 times as long.")
    assert P.recorded_hunt_sentence([]).startswith("No GPU record of the hunts yet")


@pytest.mark.parametrize("value, text", [
    (62.66 / 26.47, "2.3"), (2.4, "2.4"), (2.3, "2.3"), (2.39999, "2.3"), (1.0, "1.0"), (0.99, "0.9")])
def test_a_lower_bound_is_rounded_down(value, text):
    # 62.66 / 26.47 = 2.367...: ":.1f" prints 2.4, more than the bound; a value exact to one place keeps it
    assert P.floor_decimals(value) == text


def test_the_recorded_hunts_bound_is_rounded_down():
    # the H100 record's tightest case: 62.66 ms under the locator against 26.47 ms plain, 2.37 times
    slow = M.NanHunt("fc", "nan", None, None, 0.02647, 0.06266, 0.1)
    rec = _faults_record(_trend(), {"nan": slow, "nan_backward": slow})
    assert P.recorded_hunt_sentence([rec]).endswith("each tool made the step at least 2.3 times as long.")


def test_the_h100_record_beside_the_small_run():
    """The real record: the logit gradient 77% flushed at step 55 at full size, the locator +412% and +137%."""
    from course_lib.experiments import recorded_results

    (rec,) = recorded_results("monitor_faults")
    trend = rec.result.underflow_trend
    assert P.flushed_at(trend, "head:grad_output", 50) == pytest.approx(0.773, abs=5e-4)
    assert P.flushed_at(trend, "blocks.1.attn.qkv:grad_output", 50) == pytest.approx(0.971, abs=5e-4)
    assert P.tokens_per_batch(rec.record.course_model) == 64 * 256
    sentence = P.recorded_hunt_sentence([rec])
    assert "the locator added +412% and +137% and anomaly mode +899% and +334%" in sentence
