"""Lesson 6's sentences and tables about the model ladder (``scale_ladder``): where mixed precision starts to pay,
from the measured runs, and what the roofline predicts for the rungs that did not run; recorded GPU ladders
merged per device."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..glue import Prose, and_list, plural, sig3
from ..hardware import DATASHEET_PEAKS
from ..results import RecordedResult, describe_records
from ..tables import MarkdownTable, markdown_table
from .ladder import LADDER_PIECES, LADDER_RECIPES, LadderRun, ScaleLadder, merge_ladders, recipe_element_bytes
from .performance import ThroughputStudy

RECIPE_LABELS = {"fp32": "FP32", "tf32": "TF32", "bf16_autocast": "BF16", "fp16_autocast_scaler": "FP16",
                 "fp8_tensorwise": "FP8 tensorwise", "fp8_rowwise": "FP8 rowwise"}

# the first piece of the ladder on a GPU: the registry's full size (LADDER_PIECES[0] overrides nothing)
RECORD_COMMAND = "python -m course_lib.record scale_ladder --out results/"


def _check(ladder: ScaleLadder) -> None:
    if not isinstance(ladder, ScaleLadder):
        raise TypeError(f"expected a ScaleLadder, got {type(ladder).__name__}")


def _ms(seconds: float) -> str:
    return sig3(1e3 * seconds)


def _gib(n_bytes: float) -> str:
    return sig3(n_bytes / 2**30)


def baseline_recipe(ladder: ScaleLadder) -> str:
    """The recipe BF16 is compared with: TF32 where it ran (FP32's storage on tensor cores), else FP32."""
    _check(ladder)
    return "tf32" if any(r.recipe == "tf32" for r in ladder.runs) else "fp32"


def bf16_speedups(ladder: ScaleLadder, *, compiled: bool = False) -> dict[str, float]:
    """Per measured rung (in ladder order), the baseline's median step time over BF16 autocast's
    (:func:`baseline_recipe`; above 1: BF16 is faster), for ``compiled`` runs or eager ones."""
    base = baseline_recipe(ladder)
    out = {}
    for rung in ladder.measured_rungs():
        b, m = ladder.run_of(rung, base, compiled), ladder.run_of(rung, "bf16_autocast", compiled)
        if b is not None and m is not None:
            out[rung] = b.median_step_seconds / m.median_step_seconds
    return out


def mixed_precision_verdict(ladder: ScaleLadder, *, compiled: bool = False, margin: float = 1.1) -> Prose:
    """Where mixed precision starts to pay, from the measured runs: the smallest rung from which BF16 autocast
    is at least ``margin`` times faster than the baseline at every larger measured rung, and the rungs where
    it only ties (within ``margin`` either way) or loses."""
    if not margin > 1:
        raise ValueError(f"margin must exceed 1, got {margin!r}")
    ratios = bf16_speedups(ladder, compiled=compiled)
    base = RECIPE_LABELS[baseline_recipe(ladder)]
    mode = "compiled" if compiled else "eager"
    if not ratios:
        return Prose(f"No rung ran both BF16 autocast and {base} ({mode}) on {ladder.device_name}.")
    listed = ", ".join(f"{rung} {r:.3f}x" for rung, r in ratios.items())
    text = (f"Measured on {ladder.device_name} ({mode}), BF16 autocast's speed over {base}'s: {listed}. A rung "
            f"counts as paying when BF16 is at least {margin:g}x faster and the two recipes' step-time quartiles "
            f"do not overlap: a gain under {100 * (margin - 1):.0f}% is too small to be worth a change of recipe, "
            f"and one inside the quartiles is not told apart from the step-to-step noise.")
    names = list(ratios)
    # a ratio counts only where the two recipes' step-time quartiles do not overlap: otherwise it is noise
    apart = {n: _quartiles_apart(ladder.run_of(n, baseline_recipe(ladder), compiled),
                                 ladder.run_of(n, "bf16_autocast", compiled)) for n in names}
    pays = {n: ratios[n] >= margin and apart[n] for n in names}
    ties = [n for n in names if not apart[n] or 1 / margin < ratios[n] < margin]
    loses = [n for n in names if apart[n] and ratios[n] <= 1 / margin]
    start = next((i for i in range(len(names)) if all(pays[n] for n in names[i:])), None)
    if len(names) == 1:
        one = names[0]
        gap = _quartile_gap(ladder.run_of(one, baseline_recipe(ladder), compiled),
                            ladder.run_of(one, "bf16_autocast", compiled)) if apart[one] else ""
        text += (" One rung ran here, so this run cannot say where along the ladder mixed precision starts "
                 "to pay: " + (f"at {one} BF16 paid ({ratios[one]:.3f}x, step-time quartiles apart{gap})." if pays[one]
                               else f"at {one} BF16 was slower than {base}, beyond the step-time quartiles{gap}."
                               if one in loses else
                               f"at {one} BF16 was faster beyond the step-time quartiles{gap}, but by "
                               f"{ratios[one]:.3f}x, short of {margin:g}x." if apart[one] and ratios[one] > 1 else
                               f"at {one} BF16 was slower than {base} beyond the step-time quartiles{gap}, at "
                               f"{ratios[one]:.3f}x its speed, within {margin:g}x." if apart[one] else
                               f"at {one} BF16's step-time quartiles overlap {base}'s ({ratios[one]:.3f}x its speed): "
                               "no difference beyond the step-to-step noise."))
        ties = loses = []
    elif start is None:
        text += f" Mixed precision does not pay at any rung measured here (by {margin:g}x or more, beyond noise)."
    else:
        text += f" Mixed precision starts to pay at {names[start]} ({ratios[names[start]]:.3f}x)."
    if ties:
        text += (f" BF16 only ties {base} (within {margin:g}x, or within the step-time quartiles) at "
                 f"{', '.join(ties)}.")
    if loses:
        text += f" BF16 is slower than {base} at {', '.join(loses)}."
    if base == "FP32" and ladder.device == "cpu":
        text += " TF32 does not exist on a CPU, so FP32 is the baseline here."
    return Prose(text)


def _quartile_gap(a: LadderRun | None, b: LadderRun | None) -> str:
    """Where two runs' step-time quartiles part, to four digits (the table's three can make them look as if
    they touch): the faster run's upper quartile against the slower run's lower one."""
    if a is None or b is None:
        return ""
    fast, slow = sorted((a, b), key=lambda r: r.median_step_seconds)
    return (f": {RECIPE_LABELS[fast.recipe]}'s upper quartile {1e3 * fast.step_quartiles[1]:.4g} ms against "
            f"{RECIPE_LABELS[slow.recipe]}'s lower one {1e3 * slow.step_quartiles[0]:.4g} ms")


def _quartiles_apart(a: LadderRun | None, b: LadderRun | None) -> bool:
    """Whether two runs' step-time quartile ranges do not overlap (one run is faster beyond its noise)."""
    if a is None or b is None:
        return False
    (a25, a75), (b25, b75) = a.step_quartiles, b.step_quartiles
    return a75 < b25 or b75 < a25


def predicted_speedups(ladder: ScaleLadder, device: str, over: str = "tf32") -> dict[str, float]:
    """Per rung, the roofline's BF16 autocast speed over ``over`` on ``device`` (predicted step times)."""
    _check(ladder)
    out = {}
    for rung in ladder.rungs:
        b, m = ladder.prediction(device, rung.name, over), ladder.prediction(device, rung.name, "bf16_autocast")
        if b is not None and m is not None:
            out[rung.name] = b.step_seconds / m.step_seconds
    return out


# what the roofline's "BF16 autocast" counts, said wherever its prediction is quoted
PURE_BF16_NOTE = ("every activation counted at 16 bits, as pure BF16 stores them; autocast keeps layer norm and "
                  "softmax in FP32, so it gains less on those operations and this is its ceiling")


def why_the_ratio_stays(device: str, over: str) -> Prose:
    """Why the roofline's BF16 speed-up over ``over`` ("tf32" or "fp32") hardly moves with model size on
    ``device``: a compute-bound product gains the ratio of the peaks (given where :data:`DATASHEET_PEAKS` knows
    the device), a memory-bound operation the ratio of the bytes per element; when both are near 2, so is
    every mix of them, at every size."""
    if over not in ("tf32", "fp32"):
        raise ValueError(f"over must be 'tf32' or 'fp32', got {over!r}")
    wide, narrow = recipe_element_bytes(over), recipe_element_bytes("bf16_autocast")
    label = RECIPE_LABELS[over]
    bytes_part = f"a memory-bound operation the ratio of the bytes, {wide}/{narrow} = {wide / narrow:.2f}x"
    entry = DATASHEET_PEAKS.get(device)
    peaks = entry.tflops if entry is not None else {}
    low, high = peaks.get("bf16"), peaks.get(over)
    if not low or not high:
        return Prose(f"Against {label}, {bytes_part.replace('operation the', 'operation gains the')}; this device's peaks are not on the datasheet table, so "
                     "the ratio of its compute-bound products is left to the prediction itself.")
    ratio = low / high
    steady = abs(ratio - wide / narrow) <= 0.25 * wide / narrow
    return Prose(f"Against {label} on the {device}, a compute-bound product gains the ratio of the peaks, "
                 f"{low:,.1f}/{high:,.1f} = {ratio:.2f}x, and {bytes_part}"
                 + ("; both are near 2, so every mix of compute- and memory-bound operations lands near 2 too, "
                    "and growing the model, which shifts the mix towards products, hardly moves the ratio (the "
                    "optimizer step, FP32 in every recipe, pulls it a little below)."
                    if steady else "; the two differ, so the ratio moves as growing the model shifts the mix "
                    "towards products."))


def predicted_verdict(ladder: ScaleLadder, device: str) -> Prose:
    """What the roofline predicts for BF16 against TF32 (FP32 where the device has no TF32) on ``device``,
    rung by rung, what it counts (every activation at 16 bits: pure BF16, autocast's ceiling), why the ratio
    hardly moves with size (:func:`why_the_ratio_stays`), and that it is a bound with no launch or framework
    overhead."""
    over = "tf32" if predicted_speedups(ladder, device, "tf32") else "fp32"
    ratios = predicted_speedups(ladder, device, over)
    if not ratios:
        raise ValueError(f"the ladder has no BF16 and {over} predictions for {device!r}")
    listed = ", ".join(f"{rung} {r:.2f}x" for rung, r in ratios.items())
    return Prose(f"The roofline predicts BF16's speed over {RECIPE_LABELS[over]}'s on the {device} ({PURE_BF16_NOTE}): "
                 f"{listed}. {why_the_ratio_stays(device, over)} It counts FLOPs and bytes only, no kernel launches "
                 f"or framework overhead, so it is the most mixed precision can buy at each size; a measured ratio "
                 f"below it says that launches and memory-bound operations, not matrix products, set the step time.")


def prediction_lines_note(ladder: ScaleLadder, probe_n: int) -> Prose:
    """What the ladder figure's dashed lines are: on a datasheet GPU, ceilings (peaks and bandwidth, no
    launches); on the measuring CPU, estimates from the capability probe's rate of one square ``probe_n``
    product per dtype, which is no peak, so a measured run can beat its line: each run that did (eager or
    compiled, the rung and how many times its line's token rate) is named."""
    _check(ladder)
    if isinstance(probe_n, bool) or not isinstance(probe_n, int) or probe_n < 1:
        raise ValueError(f"probe_n must be a positive int, got {probe_n!r}")
    own = ladder.own_prediction_device
    gpus = [d for d in ladder.predicted_devices() if d != own or not own.startswith("this CPU")]
    text = (f"The dashed lines for the {and_list(gpus)} use datasheet peaks and bandwidth with no launches: "
            "ceilings." if gpus else "")
    if not own.startswith("this CPU"):
        return Prose(text)
    above = []
    for run in ladder.runs:
        p = ladder.prediction(own, run.rung, run.recipe)
        if p is not None and ladder.tokens_per_second(run) > p.tokens_per_second:
            above.append(f"{run_label(run)} at `{run.rung}`, {ladder.tokens_per_second(run) / p.tokens_per_second:.1f} "
                         "times its line")
    cpu = (f"The lines for {own} are estimates, not ceilings: a CPU has no datasheet, so each dtype's rate is the "
           f"capability probe's, one square product of n = {probe_n}, and the model's products have other shapes "
           "that a CPU's kernels can run faster or slower")
    cpu += (f"; measured runs above their line: {and_list(above)}." if above else
            "; no measured run lies above its line here.")
    return Prose(" ".join(t for t in (text, cpu) if t))


def where_it_ran(ladder: ScaleLadder) -> Prose:
    """Which rungs ran on which device, which are predictions and for which devices, and what was skipped."""
    _check(ladder)
    measured = ladder.measured_rungs()
    others = [d for d in ladder.predicted_devices() if d != ladder.own_prediction_device]
    predicted = [r.name for r in ladder.rungs if r.name not in measured]
    text = (f"Measured here on {ladder.device_name}: {and_list(measured) if measured else 'no rung'}. ")
    if predicted:
        text += (f"The {'rungs' if len(predicted) > 1 else 'rung'} {and_list(predicted)} did not run here: for them every number is a prediction of the FLOP, byte "
                 f"and roofline models" + (f" for the {', '.join(others)} (datasheet peaks)" if others else "") + ". ")
    if ladder.device == "cpu":
        text += ("These are CPU timings, not GPU timings; the notes under the measured table say why TF32 and FP8 "
                 "did not run here. ")
    if others:
        text += (f"The predictions for the {', '.join(others)} assume fused attention "
                 "(`scaled_dot_product_attention`), as the ladder runs on a GPU, and count FP8's casts to and from "
                 "FP8 around each linear layer (lesson 7's model). ")
    return Prose(text.strip())


def skip_notes(reasons: Sequence[str]) -> tuple[dict[str, str], str]:
    """A letter per distinct skip reason, in order of first appearance (``{reason: "a"}``), and the notes
    that go under a table: one line per letter, "(a) reason." (empty with no reason)."""
    letters: dict[str, str] = {}
    for reason in reasons:
        if reason not in letters:
            if len(letters) == 26:
                raise ValueError("more than 26 distinct skip reasons: too many to letter")
            letters[reason] = "abcdefghijklmnopqrstuvwxyz"[len(letters)]
    notes = "\n\n".join(f"({letter}) {reason.rstrip('.')}." for reason, letter in letters.items())
    return letters, notes


def measured_table(ladder: ScaleLadder) -> MarkdownTable:
    """The measured runs, one table per mode (eager, then compiled), so that each fits the page: per run, step
    time (median, quartiles), tokens/s, MFU against the reference peak, compile time (compiled runs), and
    the allocator's peak beside the byte model's prediction (GiB; "-" where not measured, as on a CPU). A
    skipped run is a row marked with a letter, its reason in a note under the tables (:func:`skip_notes`)."""
    _check(ladder)
    letters, notes = skip_notes([skip.reason for skip in ladder.skipped])
    parts = []
    for compiled in (False, True):
        rows = []
        for run in (r for r in ladder.runs if r.compiled == compiled):
            q25, q75 = run.step_quartiles
            predicted = ladder.prediction(ladder.own_prediction_device, run.rung, run.recipe)
            memory = ("-" if run.peak_memory_bytes is None else _gib(run.peak_memory_bytes)) + (
                "" if predicted is None else f" ({_gib(predicted.memory_bytes)})")
            rows.append((run.rung, RECIPE_LABELS[run.recipe], f"{_ms(run.median_step_seconds)} ({_ms(q25)}-{_ms(q75)})",
                         f"{ladder.tokens_per_second(run):,.0f}", f"{100 * ladder.mfu(run):.1f}%",
                         *(("-" if run.compile_seconds is None else f"{run.compile_seconds:.1f}",) if compiled else ()),
                         memory))
        for skip in (s for s in ladder.skipped if s.compiled == compiled):
            rows.append((skip.rung, RECIPE_LABELS[skip.recipe], f"skipped ({letters[skip.reason]})", "-", "-",
                         *(("-",) if compiled else ()), "-"))
        if rows:
            header = ("rung", "recipe", "step ms (quartiles)", "tokens/s", "MFU", *(("compile s",) if compiled else ()),
                      "GiB (predicted)")
            parts.append(f"**{'Compiled' if compiled else 'Eager'}:**\n\n" + markdown_table(header, rows))
    gib = (f"GiB: the allocator's peak (\"-\": not measured, as on a CPU) and, in parentheses, the byte model's "
           f"prediction for {ladder.own_prediction_device}, with the attention these runs used.")
    return MarkdownTable("\n".join(parts) + "\n" + gib + "\n" + ("\n" + notes + "\n" if notes else ""))


def predicted_table(ladder: ScaleLadder, device: str) -> MarkdownTable:
    """Per rung, the roofline's step time (ms) and MFU per recipe on ``device`` and the byte model's memory of
    BF16 autocast (GiB): predictions only ("-": the device lacks the recipe's dtype). Each recipe's cell is
    "ms (MFU)"; recipes predicted alike at every rung share a column; tokens per step go in the note under
    the table, so that the table fits the page."""
    _check(ladder)
    cells: dict[str, list[str]] = {}
    for recipe in LADDER_RECIPES:
        predictions = [ladder.prediction(device, rung.name, recipe) for rung in ladder.rungs]
        cells[recipe] = ["-" if p is None else f"{_ms(p.step_seconds)} ({100 * p.mfu:.0f}%)" for p in predictions]
    columns: dict[str, list[str]] = {}
    for recipe, column in cells.items():
        same = next((name for name, other in columns.items() if other == column), None)
        label = RECIPE_LABELS[recipe].replace("tensorwise", "tensor").replace("rowwise", "row")
        if same is None:
            columns[label] = column
        else:
            columns[f"{same} = {label}"] = columns.pop(same)
    rows = []
    for i, rung in enumerate(ladder.rungs):
        bf16 = ladder.prediction(device, rung.name, "bf16_autocast")
        rows.append((rung.name, f"{rung.n_params / 1e6:,.1f}", *(column[i] for column in columns.values()),
                     "-" if bf16 is None else _gib(bf16.memory_bytes)))
    table = markdown_table(("rung", "M params", *columns, "GiB (BF16)"), rows)
    tokens = and_list([f"{rung.name} {rung.tokens_per_step:,}" for rung in ladder.rungs])
    return MarkdownTable(table + f"\nPredicted for the {device}: each recipe's cell is the step's milliseconds "
                         f"(its MFU), from FLOPs and bytes only (FP8's casts counted as bytes), no kernel launches; "
                         f"GiB: the byte model's peak memory of BF16 autocast. Tokens per step: {tokens}.\n")


def merged_records(records: Sequence[RecordedResult]) -> dict[str, tuple[ScaleLadder, list[RecordedResult]]]:
    """Recorded ladders (newest first, as ``recorded_results`` gives them) merged per device name, the latest
    record winning per (rung, recipe, mode); each with the records it came from."""
    by_device: dict[str, list[RecordedResult]] = {}
    for rec in records:
        if not isinstance(rec.result, ScaleLadder):
            raise TypeError(f"expected recorded ScaleLadder results, got {type(rec.result).__name__}")
        by_device.setdefault(rec.result.device_name, []).append(rec)
    return {name: (merge_ladders([r.result for r in reversed(recs)]), recs) for name, recs in by_device.items()}


def recorded_ladder_block(records: Sequence[RecordedResult]) -> Prose:
    """The recorded GPU ladders, one part per device: where mixed precision starts to pay there (eager and
    compiled), the measured table and the records' provenance; with no record, the command that makes one."""
    merged = merged_records(records)
    if not merged:
        return Prose("No GPU record of `scale_ladder` exists yet, so every GPU number above is a prediction. "
                     f"On a GPU it is recorded in {len(LADDER_PIECES)} pieces of under ten minutes each (the rungs "
                     "eager, then each rung compiled: compilation takes most of the time), the first of them:"
                     "\n\n```bash\n" + RECORD_COMMAND + "\n```\n\nand all of them, resuming where the last "
                     "command stopped, by `python -m course_lib.gpu_session run --next` (see the end of this page).")
    parts = []
    for name, (ladder, recs) in merged.items():
        parts.append(f"**Recorded on {name}.** " + mixed_precision_verdict(ladder) + " "
                     + mixed_precision_verdict(ladder, compiled=True) + "\n\n" + measured_table(ladder).rstrip("\n")
                     + "\n\n" + describe_records(recs))
    return Prose("\n\n".join(parts))


def ladder_facts(ladder: ScaleLadder, device: str) -> dict[str, object]:
    """The lesson's glued facts: where the ladder ran, the measured and the predicted verdicts (for
    ``device``), the reference peak, and the parameter counts of the smallest and largest rung (millions)."""
    _check(ladder)
    return {"ladder_where": where_it_ran(ladder), "ladder_verdict": mixed_precision_verdict(ladder),
            "ladder_predicted": predicted_verdict(ladder, device), "ladder_reference": Prose(ladder.reference_source),
            "ladder_reference_tflops": ladder.reference_tflops,
            "ladder_params_small": ladder.rungs[0].n_params / 1e6, "ladder_params_large": ladder.rungs[-1].n_params / 1e6,
            "ladder_device": Prose(device)}


def run_label(run: LadderRun) -> str:
    """``"BF16, compiled"``: a run's recipe and mode, as figures and tables name it."""
    return f"{RECIPE_LABELS[run.recipe]}, {'compiled' if run.compiled else 'eager'}"


def page_rungs(parameters: dict) -> Prose:
    """What the page itself runs of the ladder, from the registry's ``parameters`` for a profile: how many
    rungs, which, and whether eager, compiled or both (``"2 rungs of the model ladder (`course_full` and
    `gpt2_small`), eagerly"``)."""
    rungs, modes = list(parameters["rungs"]), set(parameters["compile_modes"])
    how = "eagerly and compiled" if modes == {False, True} else ("compiled" if True in modes else "eagerly")
    return Prose(f"{plural(len(rungs), 'rung')} of the model ladder ({and_list([f'`{r}`' for r in rungs])}), {how}")


SPEEDUP_BY_SIZE_CLAIM = "Mixed precision speeds training up more the larger the model: up to 4x."


def speedup_by_size_erratum(ladder: ScaleLadder, device: str, studies: Mapping[str, ThroughputStudy],
                            ladder_records: Sequence[RecordedResult]) -> tuple[str, str]:
    """The circulating "speed-up by model size, up to 4x" against the roofline's BF16 autocast speed-up on
    ``device`` over FP32 (TF32 off) and over TF32 at the smallest and the largest rung, the measured eager
    speed-ups of each labelled throughput ``studies`` (``{label: ThroughputStudy}``), and whether a GPU has
    recorded the ladder (``ladder_records``)."""
    over_fp32, over_tf32 = predicted_speedups(ladder, device, "fp32"), predicted_speedups(ladder, device, "tf32")
    if not over_fp32:
        raise ValueError(f"the ladder has no BF16 and FP32 predictions for {device!r}")
    rungs = list(over_fp32)
    first, last = rungs[0], rungs[-1]
    text = ("A speed-up is one set-up's time over another's, and this claim names neither its baseline nor its "
            f"machine. For the {device}, the roofline (FLOPs and bytes only, so a ceiling; {PURE_BF16_NOTE}) puts "
            f"BF16 at "
            f"{over_fp32[first]:.2f}x FP32 with TF32 off for `{first}` and {over_fp32[last]:.2f}x for `{last}`")
    if over_tf32:
        lo, hi = min(over_tf32.values()), max(over_tf32.values())
        text += (f", and at {lo:.2f}x to {hi:.2f}x TF32 over the same sizes: against FP32 the ceiling grows with "
                 f"the model, against TF32 it barely moves")
    text += "."
    for label, study in studies.items():
        rows = {row["recipe"]: row for row in study.table() if not row["compiled"]}
        if "bf16_autocast" in rows and "fp32" in rows:
            rate = rows["bf16_autocast"]["tokens_per_s"]
            text += (f" Measured on {label}: BF16 autocast ran at {rate / rows['fp32']['tokens_per_s']:.2f}x "
                     f"FP32's token rate with TF32 off" + (f" and {rate / rows['tf32']['tokens_per_s']:.2f}x TF32's"
                                                           if "tf32" in rows else "") + " (eager).")
    text += (" The ladder's own GPU records are above." if ladder_records else
             " No GPU has recorded the ladder yet, so the growth with size is predicted here, not measured.")
    return SPEEDUP_BY_SIZE_CLAIM, text
