"""Lesson 4's study: the autocast dtype trace of the course model's forward and backward."""

from __future__ import annotations

import torch

from ..amp import AutocastTrace, trace_autocast
from ..device import SizeProfile
from ..models import course_setup


def trace_course_model(device: torch.device | str, dtype: torch.dtype | None = None, *, seed: int = 0) -> AutocastTrace:
    """Trace one forward and backward pass of the course GPT (small shape) under autocast on ``device``.

    ``dtype`` defaults to FP16 on CUDA and BF16 on the CPU (each device's usual autocast dtype)."""
    device = torch.device(device)
    dtype = dtype or (torch.float16 if device.type == "cuda" else torch.bfloat16)
    setup = course_setup(SizeProfile("small"), device, steps=1, default_steps=(1, 1), seed=seed)
    model = setup.model(seed)
    x, y = setup.sampler.batch(0, device)
    return trace_autocast(lambda: model(x, y)[1], device_type=device.type, dtype=dtype)
