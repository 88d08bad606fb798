"""Lesson 10's bytes on the wire under FSDP2: what the lesson's own runs' collectives carried per parameter
and step (counted where FSDP2 calls ``torch.distributed``), against the arithmetic of
:func:`course_lib.distributed.traffic.sharded_step_bytes`, and what switching the reduction to BF16 can
save of a step whose communication is a given share; and how gloo's ring all-reduce cuts a vector into chunks."""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from ..distributed.reduce import ring_chunks
from ..distributed.traffic import sharded_step_bytes
from ..glue import Prose, bold, percent_text, sig3
from .distributed import FSDP_BF16_REDUCE, FSDP_FP32_REDUCE, FSDP_POLICIES, DataParallelStudy

# the study's FSDP2 run without a mixed precision policy
FSDP_NO_POLICY = next(label for label, dtypes in FSDP_POLICIES.items() if dtypes == (None, None))

# the exercise's premise: communication takes this share of a training step (a hypothetical job)
EXERCISE_COMM_SHARE = 0.3


def _per_step(study: DataParallelStudy, label: str) -> dict[str, float]:
    counted = study.collective_bytes.get(label)
    if not counted or set(counted) != {"all_gather", "reduce_scatter"}:
        raise ValueError(f"the study has no collective bytes for {label!r} (a record older than the count?)")
    return {kind: value / (study.n_params * study.steps) for kind, value in counted.items()}


def _saving(before: Mapping[str, float], after: Mapping[str, float]) -> float:
    return 1 - sum(after.values()) / sum(before.values())


def traffic_facts(study: DataParallelStudy, *, comm_share: float = EXERCISE_COMM_SHARE) -> dict[str, object]:
    """Lesson 10's facts of FSDP2's traffic: bytes per parameter and step rank 0 gathered without a policy
    and with BF16 parameters, and reduce-scattered in FP32 and in BF16, how many gathers per parameter that
    makes, the measured saving of the BF16 reduction and the model's for one and for two gathers per step,
    and each saving as a share of a step whose communication is ``comm_share``."""
    if isinstance(comm_share, bool) or not isinstance(comm_share, (int, float)) or not 0 < comm_share <= 1:
        raise ValueError(f"comm_share must be a share in (0, 1], got {comm_share!r}")
    fp32, bf16 = _per_step(study, FSDP_FP32_REDUCE), _per_step(study, FSDP_BF16_REDUCE)
    plain = _per_step(study, FSDP_NO_POLICY)
    two, four = (torch.empty((), dtype=d).element_size() for d in (torch.bfloat16, torch.float32))
    model = {g: (sharded_step_bytes(two, four, gathers=g), sharded_step_bytes(two, two, gathers=g)) for g in (1, 2)}
    saving = _saving(fp32, bf16)
    model_saving = {g: _saving(*pair) for g, pair in model.items()}
    return {
        "comm_share": Prose(percent_text(comm_share)),
        "gather_fp32_bpp": Prose(bold(sig3(plain["all_gather"]))),
        "gather_bpp": Prose(bold(sig3(fp32["all_gather"]))),
        "gathers": Prose(bold(f"{fp32['all_gather'] / two:.2f}")),
        "rs_fp32_bpp": Prose(bold(sig3(fp32["reduce_scatter"]))),
        "rs_bf16_bpp": Prose(bold(sig3(bf16["reduce_scatter"]))),
        "traffic_saving": Prose(bold(percent_text(saving))),
        "step_saving": Prose(bold(percent_text(saving * comm_share))),
        "model_once": Prose(f"{model[1][0]['reduce_scatter'] - model[1][1]['reduce_scatter']} of "
                            f"{sum(model[1][0].values())} bytes"),
        "model_once_share": Prose(percent_text(model_saving[1])),
        "model_twice": Prose(f"{model[2][0]['reduce_scatter'] - model[2][1]['reduce_scatter']} of "
                             f"{sum(model[2][0].values())}"),
        "model_twice_share": Prose(percent_text(model_saving[2])),
        "model_step_range": Prose(f"{percent_text(model_saving[2] * comm_share)} of the step when every "
                                  f"parameter is gathered twice, {percent_text(model_saving[1] * comm_share)} "
                                  "when each is gathered once"),
    }


def ring_chunk_facts(n: int = 7, ranks: int = 3, element_size: int = 4) -> dict[str, object]:
    """gloo's ring chunks of ``n`` values of ``element_size`` bytes on ``ranks`` ranks (:func:`ring_chunks`),
    against ``ceil(n / ranks)`` values each, as sizes in prose: the example the lesson gives."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")
    naive = [min(n, (i + 1) * math.ceil(n / ranks)) - min(n, i * math.ceil(n / ranks)) for i in range(ranks)]

    def sizes(values) -> Prose:
        values = [bold(v) for v in values]
        return Prose(", ".join(values[:-1]) + " and " + values[-1])

    return {"ring_n": n, "ring_ranks": ranks,
            "ring_gloo": sizes(end - start for start, end in ring_chunks(n, ranks, element_size)),
            "ring_naive": sizes(naive)}
