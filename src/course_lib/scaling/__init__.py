"""Dynamic loss scaling, from the inside.

:class:`TeachingLossScaler` is a from-scratch dynamic loss scaler written to be read. It reproduces
``torch.amp.GradScaler``'s arithmetic exactly (the tests run both side by side and compare the scale, the
growth tracker, the skip decisions and the unscaled gradients bit for bit):

* ``scale(loss)`` multiplies the loss by the current scale (a float32 number);
* ``unscale_(optimizer)`` multiplies the optimizer's gradients by ``1/scale`` — the reciprocal computed in
  float64 and rounded to float32, as GradScaler does — and reports whether any held an inf or NaN. It may
  be called once per optimizer between updates; several optimizers can share one scaler, as they share a
  GradScaler;
* ``step(optimizer)`` unscales the optimizer's gradients if that was not done yet, and calls the optimizer
  only when its own gradients held no inf/NaN (otherwise the step is skipped);
* ``update()``: after an overflow in any optimizer's gradients since the last update (a replay of
  recorded steps passes ``found_inf`` instead) the scale is multiplied by ``backoff_factor`` and the growth
  tracker resets; after a clean step the tracker counts up, and only when it reaches ``growth_interval``
  (2000 by default) is the scale multiplied by ``growth_factor`` (and then only if the result is finite).
  The scale does **not** double after every clean step.
"""

from __future__ import annotations

from .pitfalls import (
    AUTOCAST_PITFALLS_DTYPE,
    DEMO_ACCUMULATION,
    DEMO_BACKOFF,
    DEMO_INIT_SCALE,
    DEMO_WIDTH,
    LOW_PRECISION_DTYPES,
    NO_SCALER_PITFALLS,
    OLD_GPU_CAPABILITY,
    PITFALLS,
    Finding,
    PitfallDemo,
    ScalerAudit,
    run_pitfall_demo,
)
from .scaler import (
    DEFAULT_BACKOFF_FACTOR,
    DEFAULT_GROWTH_FACTOR,
    DEFAULT_GROWTH_INTERVAL,
    DEFAULT_INIT_SCALE,
    ScalerDefaults,
    ScaleTrace,
    TeachingLossScaler,
    compare_with_grad_scaler,
    grad_scaler_defaults,
    grad_scaler_refusal,
    replay_scale_schedule,
    scale_after_clean_steps,
    steps_to_double,
)

__all__ = [
    "DEFAULT_INIT_SCALE",
    "DEFAULT_GROWTH_FACTOR",
    "DEFAULT_BACKOFF_FACTOR",
    "DEFAULT_GROWTH_INTERVAL",
    "TeachingLossScaler",
    "ScaleTrace",
    "replay_scale_schedule",
    "steps_to_double",
    "ScalerDefaults",
    "grad_scaler_defaults",
    "grad_scaler_refusal",
    "scale_after_clean_steps",
    "compare_with_grad_scaler",
    "PITFALLS",
    "LOW_PRECISION_DTYPES",
    "Finding",
    "ScalerAudit",
    "PitfallDemo",
    "run_pitfall_demo",
    "AUTOCAST_PITFALLS_DTYPE",
    "DEMO_ACCUMULATION",
    "DEMO_BACKOFF",
    "DEMO_INIT_SCALE",
    "DEMO_WIDTH",
    "NO_SCALER_PITFALLS",
    "OLD_GPU_CAPABILITY",
]
