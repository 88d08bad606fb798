"""Watching a mixed precision run: gradient health, non-finite values traced to their module, and recovery.

* :class:`GradientHealthMonitor` attaches to a training loop (:func:`course_lib.train.train` takes one, and
  a plain loop calls :meth:`~GradientHealthMonitor.after_backward` and
  :meth:`~GradientHealthMonitor.after_step`). Every ``every`` steps it measures, per parameter, the share
  of gradient values that are zero, that would flush to zero or land in the subnormals of the training
  dtype at the current loss scale, the non-finite count and the norm (all computed on the gradients'
  device and brought to the host in one transfer per sampled step); every step it records the loss, the
  scale and whether the step was skipped (in a plain loop with its own ``GradScaler``,
  :func:`step_was_skipped` reads that from the scale before and after ``scaler.update()``). Thresholds raise
  named :class:`Alert` s.
* :class:`NonFiniteLocator` hooks every module's forward and backward and names the first one that produced
  an inf or NaN, with its input and output statistics.
* :func:`save_checkpoint_atomic` writes a checkpoint so that a crash mid-write never replaces the last good
  one, and :class:`RecoveryPolicy` rolls a run back to it and switches FP16 to BF16 when the scale
  collapses or overflows persist.
"""

from __future__ import annotations

from .diagnose import Diagnosis, diagnose
from .faults import FAULT_KINDS, ModuleWrapper, PlantedFault, plant_fault, unwrapped_name
from .health import (
    ALERT_KINDS,
    Alert,
    GradientHealthMonitor,
    GradientStats,
    MonitorLog,
    Thresholds,
    gradient_stats,
    gradient_stats_many,
    step_was_skipped,
)
from .locator import NonFiniteLocator, NonFiniteReport, TensorSummary, anomaly_mode_raises
from .matmul_stats import MatmulStats, matmul_stats

__all__ = [
    "ALERT_KINDS",
    "Thresholds",
    "GradientStats",
    "gradient_stats",
    "gradient_stats_many",
    "Alert",
    "MonitorLog",
    "GradientHealthMonitor",
    "step_was_skipped",
    "TensorSummary",
    "NonFiniteReport",
    "NonFiniteLocator",
    "anomaly_mode_raises",
    "FAULT_KINDS",
    "ModuleWrapper",
    "PlantedFault",
    "unwrapped_name",
    "plant_fault",
    "MatmulStats",
    "matmul_stats",
    "Diagnosis",
    "diagnose",
]
