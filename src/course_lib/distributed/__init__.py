"""Mixed precision across processes: the course's training loop under ``torch.distributed``, for real.

Two ways to start the same worker code:

* ``torchrun --nproc-per-node 2 -m course_lib.distributed --recipe bf16_autocast --steps 20`` (env://
  rendezvous, so the same command scales to several machines; NCCL when every rank has its own GPU, gloo on
  the CPU otherwise);
* :func:`launch_local` for the lesson and the tests: it starts N local processes with the same
  environment torchrun sets, collects each rank's history, and always cleans up: a failing rank's error is
  reported, the others are stopped (collectives time out, and the launcher kills what is left).

Each rank trains the course model (:func:`course_lib.train.train`, unchanged) on its slice of the global
batch, so a data-parallel run sees exactly the batches of a single-process run (:func:`single_process_run`)
and computes the same mean gradient, up to rounding. Wrappers: ``ddp`` (DistributedDataParallel, one
GradScaler per rank, optional gradient-compression hook), ``fsdp`` (FSDP2 ``fully_shard`` with a
``MixedPrecisionPolicy``; a plain or a sharded-aware scaler) and ``manual`` (gradients all-reduced by hand
after the loss scale was checked locally: the pitfall).

:func:`simulate_all_reduce` reproduces a ring all-reduce in 16-bit arithmetic in one process (checked bit for
bit against gloo's), and :func:`reduction_precision_study` measures the error of the reduced gradient
against the number of ranks.
"""

from __future__ import annotations

from .launch import DistributedRunError, build_parser, launch_local, main
from .reduce import (
    COMM_HOOKS,
    REDUCE_CHECK_DTYPES,
    REDUCE_CHECK_VALUES,
    REDUCE_ORDERS,
    REDUCTION_VARIANTS,
    cast_compress_hook,
    compress_hook,
    fsdp2_predivide,
    reduce_check_inputs,
    reduce_check_plan,
    reduce_mean,
    ring_chunks,
    simulate_all_reduce,
)
from .traffic import count_collective_bytes, sharded_step_bytes
from .worker import (
    DEFAULT_TIMEOUT_S,
    DTYPES_BY_NAME,
    SCALERS,
    WRAPPERS,
    DistributedResult,
    DistRun,
    RankHistory,
    choose_backend,
    flatten_params,
    ProgressMarks,
    load_progress,
    load_rank_history,
    run_worker,
    setup_for_run,
    shard_with_policy,
    rank_threads,
    single_process_run,
)

__all__ = [
    "REDUCE_ORDERS",
    "count_collective_bytes",
    "sharded_step_bytes",
    "cast_compress_hook",
    "compress_hook",
    "REDUCE_CHECK_VALUES",
    "REDUCE_CHECK_DTYPES",
    "reduce_check_inputs",
    "simulate_all_reduce",
    "ring_chunks",
    "reduce_check_plan",
    "ProgressMarks",
    "load_progress",
    "REDUCTION_VARIANTS",
    "fsdp2_predivide",
    "reduce_mean",
    "COMM_HOOKS",
    "WRAPPERS",
    "SCALERS",
    "DTYPES_BY_NAME",
    "DEFAULT_TIMEOUT_S",
    "DistRun",
    "RankHistory",
    "DistributedResult",
    "setup_for_run",
    "shard_with_policy",
    "flatten_params",
    "rank_threads",
    "single_process_run",
    "choose_backend",
    "run_worker",
    "load_rank_history",
    "DistributedRunError",
    "launch_local",
    "build_parser",
    "main",
]
