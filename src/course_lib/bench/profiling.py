"""The profiler's plumbing, shared by every study that profiles (lesson 6's training step, lesson 7's FP8 layer).

* :func:`profiler_activities`: what ``torch.profiler`` records: CPU operators, and CUDA kernels on a GPU.
* :func:`self_time_us`: an operator's self time, from the field that holds it on this device and torch.
* :func:`quiet_native_stderr`: silences the C++ lines some torch builds print when the profiler starts.
"""

from __future__ import annotations

import contextlib
import os

import torch


def profiler_activities(device: torch.device | str) -> list:
    """What the profiler records on ``device``: CPU operators, and CUDA kernels on a GPU."""
    from torch.profiler import ProfilerActivity

    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])


def self_time_us(event, device_type: str) -> float:
    """An operator's self time in microseconds (its own time, without the operators it calls): its kernels'
    time on a GPU (``self_device_time_total``, ``self_cuda_time_total`` in an older torch), its CPU time
    otherwise. ``event``: a profiler event or a ``key_averages()`` row."""
    if device_type == "cuda":
        value = getattr(event, "self_device_time_total", None)
        return float(value if value is not None else event.self_cuda_time_total)
    return float(event.self_cpu_time_total)


@contextlib.contextmanager
def quiet_native_stderr():
    """Silence file descriptor 2 while the profiler starts and stops: some torch builds log
    ``profiler_start``/``profiler_stop`` lines from C++ there, which a notebook would show as output.
    Python-level errors still propagate as exceptions."""
    # fd 2 itself, not sys.stderr.fileno(): in a Jupyter kernel the latter is a copy of the terminal's
    # stderr, while the C++ code writes to fd 2, which the kernel captures into the notebook
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
