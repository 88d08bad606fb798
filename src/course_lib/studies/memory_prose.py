"""Lesson 6's memory section: facts and tables from the counted training step (studies.performance's
``account_training_memory``), the memory model (course_lib.memory) and the recorded GPU runs."""

from __future__ import annotations

from collections.abc import Sequence

from ..glue import Prose, and_list
from ..memory import MemoryBreakdown, bytes_per_parameter, estimate_training_memory
from ..results import RecordedResult, describe_records
from ..tables import MarkdownTable, markdown_table
from .performance import ActivationSweep, TrainingMemory


def recorded_size(record: RecordedResult) -> str:
    """``at full size``, or for a record made before the full profile's re-size, that it ran the older,
    narrower course model (its width from the record), so that a recorded number is read as that model's."""
    if not record.record.earlier_full_model:
        return "at full size"
    model = record.record.course_model or {}
    return (f"at the full size of its day, the older {model.get('d_model', '?')}-wide course model (narrower "
            "than today's)")


def by_recipe(breakdowns: Sequence[MemoryBreakdown]) -> dict[str, MemoryBreakdown]:
    """The breakdowns by recipe name; ``ValueError`` naming any of FP32, BF16 autocast, pure BF16 and BF16 with
    FP32 masters that is missing."""
    by = {b.recipe: b for b in breakdowns}
    missing = [r for r in ("fp32", "bf16_autocast", "bf16_pure", "bf16_master") if r not in by]
    if missing:
        raise ValueError(f"no memory breakdown of {', '.join(missing)}")
    return by


def memory_facts(breakdowns: Sequence[MemoryBreakdown]) -> dict[str, object]:
    """BF16 autocast's activations over FP32's, its weight copies (KiB), and the persistent bytes per
    parameter of FP32, BF16 autocast, pure BF16 and BF16 with FP32 master weights."""
    by = by_recipe(breakdowns)
    autocast = by["bf16_autocast"]
    return {"act_ratio": autocast.components["activations"] / by["fp32"].components["activations"],
            "copies_kib": autocast.components["autocast_weight_copies"] / 1024,
            "bpp_fp32": by["fp32"].per_parameter(), "bpp_autocast": autocast.per_parameter(),
            "bpp_pure": by["bf16_pure"].per_parameter(), "bpp_master": by["bf16_master"].per_parameter()}


def recorded_memory_note(record: RecordedResult) -> Prose:
    """A recorded ``training_memory`` run: per recipe the counted bytes against the allocator's peak (MiB), and
    what the device held before the recipe where the record kept it; what the count leaves out; where a recipe
    that counts no more bytes than another peaked higher, that the record cannot say why (:func:`peak_inversions`);
    and the record's provenance."""
    if not isinstance(record.result, TrainingMemory):
        raise TypeError(f"expected a recorded TrainingMemory, got {type(record.result).__name__}")
    breakdowns = record.result.breakdowns
    for b in breakdowns:
        if b.measured_peak_bytes is None:
            raise ValueError(f"the recorded {b.recipe} step has no allocator peak (not a GPU record)")
    kept = all(b.baseline_bytes is not None for b in breakdowns)
    header = ("recipe", "counted (MiB)", "allocator peak (MiB)", "peak over counted",
              *(("on the device before (MiB)",) if kept else ()))

    def mib(n: int | None) -> str:
        return f"{(n or 0) / 2**20:,.0f}"
    rows = [(b.recipe, mib(b.total), mib(b.measured_peak_bytes), f"{(b.measured_peak_bytes or 0) / b.total:.2f}",
             *((mib(b.baseline_bytes),) if kept else ())) for b in breakdowns]
    table = markdown_table(header, rows)
    text = (f"Recorded on **{record.label}** {recorded_size(record)}: the counted bytes against "
            "`torch.cuda.max_memory_allocated` for the step. The peak is higher by what the count "
            "leaves out: temporaries such as the logits' gradient, the allocator's rounding and "
            "workspaces of the matrix libraries.")
    inversions = peak_inversions(breakdowns)
    if inversions:
        pairs = and_list([f"`{lo.recipe}` counts {'the same bytes as' if lo.total == hi.total else 'fewer bytes than'} "
                          f"`{hi.recipe}` but peaked higher "
                          f"({mib(lo.measured_peak_bytes)} against {mib(hi.measured_peak_bytes)} MiB)"
                          for lo, hi in inversions])
        why = ("The last column shows what was on the device, after a garbage collection, before each recipe: its "
               "peak includes that." if kept else
               "This record did not measure what was on the device before each recipe, so it cannot say how much "
               "of a peak was the step's own. Today's code collects garbage before each recipe and records what "
               "remains: records made with it have a last column for that.")
        text += (f" Here {pairs}. The allocator's peak counts every tensor on the GPU, not only this step's, so it "
                 f"can include tensors an earlier recipe left for the garbage collector. {why}")
    return Prose(text + "\n\n" + table.rstrip("\n") + "\n\n" + describe_records([record]))


def peak_inversions(breakdowns: Sequence[MemoryBreakdown]) -> list[tuple[MemoryBreakdown, MemoryBreakdown]]:
    """The pairs ``(a, b)`` of recipes where ``a`` counts no more bytes than ``b`` (fewer, or the same: FP16
    and BF16 autocast count alike) and yet its allocator peak is higher (steps without a peak left out), in the
    breakdowns' order."""
    peaked = [b for b in breakdowns if b.measured_peak_bytes is not None]
    return [(a, b) for a in peaked for b in peaked
            if a is not b and a.total <= b.total
            and a.measured_peak_bytes > b.measured_peak_bytes]  # type: ignore[operator]


def persistent_memory_table(recipes: Sequence[str], parameter_counts: Sequence[float]) -> MarkdownTable:
    """Per recipe, the persistent bytes per parameter with AdamW and the GB they come to for each of
    ``parameter_counts`` (activations excluded)."""
    return markdown_table(
        ("recipe", "bytes per parameter", *(f"{n / 1e9:g}B params (GB)" for n in parameter_counts)),
        [(r, sum(bytes_per_parameter(r).values()),
          *(f"{estimate_training_memory(n, r)['total'] / 1e9:,.0f}" for n in parameter_counts)) for r in recipes])


def persistent_memory_facts() -> dict[str, object]:
    """The persistent state of a 7B-parameter model under BF16 autocast with AdamW, in GB."""
    return {"gb_7b": estimate_training_memory(7e9, "bf16_autocast")["total"] / 1e9}


def activation_facts(sweep: ActivationSweep) -> dict[str, object]:
    """How many times less checkpointing keeps at the largest shape, and the share (%) of the bytes at the
    largest context that the quadratic (attention scores) term of the fit accounts for, with that context."""
    share, t_max = sweep.quadratic_share()
    return {"ckpt_ratio": sweep.checkpoint_ratio(), "quad_share": 100 * share, "quad_t": t_max}
