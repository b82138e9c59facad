"""GPUs: which worker runs on which GPU, what a GPU failure of a task means,
and what a GPU worker does once when it starts.

Placement (:func:`place_gpus`) is a pure function of ``gpus_per_task`` and
the GPU ids, so that CPU-only CI tests it with declared ids (``gpus=[0, 1]``):

* a whole number ``n`` gives each worker ``n`` GPUs of its own (disjoint
  sets, ``len(ids) // n`` workers at most);
* a fraction ``1/k`` (0.5, 0.25, 0.125, ...) lets ``k`` workers share one
  GPU: ``len(ids) * k`` worker slots, slot ``i`` on GPU ``ids[i % len(ids)]``,
  so that however many of the slots are used, the workers spread evenly.

Each worker process sees only its own GPUs, through ``CUDA_VISIBLE_DEVICES``.

Failures (:func:`gpu_failure`) are recognised by the exception's class name,
module and message, never by importing a framework: PyTorch's, CuPy's,
JAX's and TensorFlow's out-of-memory errors make the task ``memory`` (only
that task is lost); an error that leaves the process's CUDA context unusable
(an illegal memory access, a device-side assert) makes the worker retire, to
be replaced by a fresh one.

This module imports nothing of manymodels and no framework at import time:
the worker side uses it too.
"""

from __future__ import annotations

import math
import numbers
import os
import re
import sys
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# -- placement ------------------------------------------------------------------

#: The most tasks that may share one GPU (each is a process with a CUDA context).
MAX_PER_GPU = 256


def check_gpus_per_task(value: Any) -> tuple[float, int]:
    """``(gpus_per_task, k)``: ``k`` tasks share a GPU (``k`` = 1 for a whole
    number). Raises for anything but 0, a whole number or a fraction ``1/k``,
    saying what would fit."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Real) or not value >= 0
            or not math.isfinite(value)):
        raise ValueError(f"gpus_per_task must be 0, a whole number of GPUs or a fraction "
                         f"1/k such as 0.5 or 0.25, got {value!r}")
    if value == 0:
        return 0, 1
    if value >= 1:
        if float(value).is_integer():
            return int(value), 1
        low, high = math.floor(value), math.ceil(value)
        raise ValueError(f"gpus_per_task={value!r}: above one GPU, a task takes whole GPUs; "
                         f"use {low} or {high}")
    if value < 1 / MAX_PER_GPU:
        raise ValueError(f"gpus_per_task={value!r}: at most {MAX_PER_GPU} tasks share a GPU "
                         f"(gpus_per_task=1/{MAX_PER_GPU})")
    k = round(1 / value)
    if k >= 1 and abs(k * float(value) - 1) < 1e-6:
        return 1 / k, k
    fewer, more = math.floor(1 / value), math.ceil(1 / value)  # 1/more < value < 1/fewer
    raise ValueError(
        f"gpus_per_task={value!r} is not 1/k; use {_share(more)} ({more} per GPU) or "
        f"{_share(fewer)} ({fewer} per GPU), so that tasks share a GPU evenly")


def _share(k: int) -> str:
    value = 1 / k
    return f"{value:g}" if len(f"{value:g}") <= 6 else f"1/{k}"


def declared_gpus(gpus: Any) -> int | list[str] | None:
    """``gpus=``: ``None`` (detect), a count, or the ids themselves."""
    if gpus is None:
        return None
    if isinstance(gpus, numbers.Integral) and not isinstance(gpus, bool):
        if gpus < 0:
            raise ValueError(f"gpus must be a count >= 0 or a list of GPU ids, got {gpus!r}")
        return int(gpus)
    if isinstance(gpus, (str, bytes)) or not isinstance(gpus, Sequence):
        raise TypeError(f"gpus must be a count or a list of GPU ids such as [0, 1], "
                        f"got {gpus!r}")
    ids = []
    for gpu in gpus:
        if isinstance(gpu, bool) or not isinstance(gpu, (numbers.Integral, str)) or (
                isinstance(gpu, str) and (not gpu.strip() or "," in gpu)):
            raise TypeError(f"gpus must hold GPU ids (numbers, or names such as 'GPU-3f1c...'),"
                            f" got {gpu!r}")
        ids.append(str(gpu).strip())
    if len(set(ids)) != len(ids):
        raise ValueError(f"gpus lists a GPU twice: {list(gpus)!r}")
    return ids


def place_gpus(per_task: float, ids: Sequence[str], why_none: str = ""
               ) -> tuple[tuple[str, ...], ...]:
    """Per worker slot, the GPU ids it may use (see the module docstring).
    Raises, saying what would fit, when there are too few GPUs; ``why_none``
    says why none were found (detection's reason), for that error."""
    ids = [str(gpu) for gpu in ids]
    whole = per_task >= 1
    if not ids or (whole and len(ids) < per_task):
        listed = f" ({', '.join(ids)})" if ids else f" ({why_none})" if why_none else ""
        fits = (f"use gpus_per_task={len(ids)} at most, or a fraction such as 0.5 to share "
                "them; " if ids and whole else "")
        raise ValueError(
            f"gpus_per_task={per_task:g} but {len(ids)} GPU(s) are available{listed}: "
            f"{fits}declare them with gpus=N or gpus=[ids] if detection missed them")
    if whole:
        n = int(per_task)
        return tuple(tuple(ids[i * n:(i + 1) * n]) for i in range(len(ids) // n))
    k = round(1 / per_task)
    return tuple((ids[i % len(ids)],) for i in range(len(ids) * k))


# -- what a worker does once, when it starts -------------------------------------


@dataclass(frozen=True)
class GpuSetup:
    """Sent to GPU workers with the run: ``memory_fraction`` caps PyTorch's
    allocator on each visible GPU; ``warm`` creates the CUDA context (and
    cuBLAS's handle) before the first task (PyTorch was loaded in the driver,
    so ``fit`` uses it), so that its cost counts as the worker's start, not as
    the first task's time."""

    memory_fraction: float | None = None
    warm: bool = False


def check_memory_fraction(value: Any, per_gpu: int) -> float | None:
    """``gpu_memory_limit=``: a fraction of a GPU's memory, 0 < f <= 1. With
    ``per_gpu`` tasks sharing a GPU, caps above ``1/per_gpu`` add up to more
    than the device holds: allowed (tasks seldom peak together), with a warning."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise ValueError(f"gpu_memory_limit must be a fraction of a GPU's memory in (0, 1], "
                         f"got {value!r}")
    if value > 1 / per_gpu + 1e-9:
        warnings.warn(
            f"gpu_memory_limit={value:g} with {per_gpu} tasks per GPU: together they may ask "
            f"for {per_gpu * value:.2g}x the GPU's memory; {1 / per_gpu:.3g} or less keeps "
            "one task from starving the others", RuntimeWarning, stacklevel=5)
    return float(value)


def prepare_worker(setup: GpuSetup | None) -> None:
    """In a GPU worker, before its first task: cap PyTorch's allocator and
    create the CUDA context. Nothing where PyTorch or a GPU is missing."""
    if setup is None or (setup.memory_fraction is None and not setup.warm):
        return
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    for device in range(torch.cuda.device_count()):
        if setup.memory_fraction is not None:
            torch.cuda.set_per_process_memory_fraction(setup.memory_fraction, device)
        if setup.warm:  # the context, and cuBLAS's handle (a first matmul's 0.1-0.3 s)
            block = torch.ones(8, 8, device=f"cuda:{device}")
            (block @ block).sum().item()


# -- failures ----------------------------------------------------------------------

_OOM_CLASSES = {
    ("torch", "OutOfMemoryError"),  # torch.OutOfMemoryError, torch.cuda.OutOfMemoryError
    ("cupy", "OutOfMemoryError"),  # cupy.cuda.memory.OutOfMemoryError
    ("tensorflow", "ResourceExhaustedError"),
}
_XLA_CLASSES = ("XlaRuntimeError", "JaxRuntimeError")
_OOM_TEXT = ("CUDA out of memory", "CUDA error: out of memory", "CUBLAS_STATUS_ALLOC_FAILED",
             "cudaErrorMemoryAllocation", "CUDA_ERROR_OUT_OF_MEMORY")
#: CUDA errors after which the process's context is unusable ("sticky").
_BROKEN_TEXT = ("illegal memory access", "device-side assert", "unspecified launch failure",
                "misaligned address", "illegal instruction", "an illegal address",
                "uncorrectable ECC error", "hardware stack error", "invalid program counter",
                "cudaErrorIllegalAddress", "cudaErrorLaunchFailure", "cudaErrorAssert",
                "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED")
_DEVICE = re.compile(r"\bGPU (\d+)\b|\bcuda:(\d+)\b|\bdevice (\d+)\b")


@dataclass(frozen=True)
class GpuFailure:
    """What a GPU exception means: ``kind`` is ``"memory"`` (the task ran out
    of GPU memory) or ``"broken"`` (the worker's CUDA context is unusable)."""

    kind: str
    device: str | None  # the GPU's id as the machine numbers it (CUDA_VISIBLE_DEVICES)
    message: str

    def describe(self, replaced: bool = False) -> str:
        where = f" on GPU {self.device}" if self.device is not None else ""
        if self.kind == "memory":
            return f"GPU out of memory{where}: {self.message}"
        return (f"CUDA error{where} that leaves the worker's CUDA context unusable: "
                f"{self.message}" + ("; the worker was replaced" if replaced else ""))


def _classes(exc: BaseException) -> list[tuple[str, str]]:
    return [((cls.__module__ or "").split(".")[0], cls.__name__) for cls in type(exc).__mro__]


def gpu_failure(exc: BaseException) -> GpuFailure | None:
    """Classify ``exc`` (see the module docstring); ``None`` for any other error."""
    classes = _classes(exc)
    try:
        text = str(exc)
    except Exception:  # an exception whose message cannot be made
        return None
    cuda_related = any(module in ("torch", "cupy", "cupy_backends", "jax", "jaxlib",
                                  "tensorflow") for module, _ in classes) or "CUDA" in text
    kind = None
    if (any(c in _OOM_CLASSES for c in classes)
            or (any(name in _XLA_CLASSES for _, name in classes) and "RESOURCE_EXHAUSTED" in text)
            or (cuda_related and any(marker in text for marker in _OOM_TEXT))):
        kind = "memory"
    elif cuda_related and any(marker in text for marker in _BROKEN_TEXT):
        kind = "broken"
    if kind is None:
        return None
    return GpuFailure(kind, _device_named(text), _first_line(text) or type(exc).__name__)


def _device_named(text: str) -> str | None:
    """The GPU an error names, as the machine numbers it: the error counts the
    devices this process sees, ``CUDA_VISIBLE_DEVICES`` maps them back."""
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if part.strip()]
    match = _DEVICE.search(text)
    if match:
        local = int(next(group for group in match.groups() if group is not None))
        return visible[local] if local < len(visible) else str(local)
    return visible[0] if len(visible) == 1 else None


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:500]
    return ""


def release_cached_memory() -> None:
    """After a task ran out of GPU memory: give PyTorch's cached blocks back to
    the device, so that the tasks sharing it can have them."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_initialized():
                torch.cuda.empty_cache()
        except Exception:  # a broken context: the worker retires anyway
            pass
