"""How many cores this process may really use, how to keep BLAS/OpenMP from
oversubscribing them, how much nicer than the driver a worker runs, memory
sizes as users write them, and the GPUs this process may use.

``os.cpu_count()`` lies inside containers and under ``taskset``: it counts the
machine's cores, not the ones this process may run on. Starting one worker per
counted core then oversubscribes the CPU. We take the smallest of the CPU
affinity mask and the cgroup CPU quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Environment variables read by BLAS and OpenMP runtimes at import time.
THREAD_LIMIT_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    # joblib's (loky's) cpu_count: what LightGBM's n_jobs=None and scikit-learn's
    # n_jobs=-1 size their threads by; else each worker took every core, and a
    # few workers' OpenMP threads spinning at their barriers took 70x as long
    "LOKY_MAX_CPU_COUNT",
)


def _cgroup_cpu_quota() -> float | None:
    v2 = Path("/sys/fs/cgroup/cpu.max")
    try:
        quota, period = v2.read_text().split()[:2]
        if quota != "max":
            return int(quota) / int(period)
        return None
    except (OSError, ValueError):
        pass
    try:
        quota = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
        if quota > 0 and period > 0:
            return quota / period
    except (OSError, ValueError):
        pass
    return None


def usable_cores() -> int:
    """The number of cores this process can actually run on (at least 1)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = _cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return max(1, cores)


#: How much nicer (lower in priority) than the driver a worker runs, unless
#: :data:`NICENESS_VARIABLE` says otherwise: none, as with every other pool.
#: A nicer worker yields to the driver, and to every other process on the
#: machine too: on 2 cores beside one busy process, 2,000 models of a file
#: each took 5.4-6.4 s at +5 against 3.3-4.7 s at 0 (three runs each). On a
#: machine left to the run, +5 pays where the driver is the bottleneck: on
#: 16 cores with 16 workers,
#: a million models with a store took 4.20-4.48 s against 5.18-5.65 s (the
#: driver's loop waited 0.67-0.81 s on its store writer, against 1.56-1.60 s).
WORKER_NICENESS = 0
#: The environment variable that sets how much nicer a worker runs: 0 to
#: run at the driver's priority, at most 19.
NICENESS_VARIABLE = "MANYMODELS_WORKER_NICENESS"


def number_from_environment(variable: str, read: Callable[[str], Any],
                            valid: Callable[[Any], bool], default: Any, wanted: str) -> Any:
    """The number the environment variable ``variable`` sets (``read`` from
    its text, ``valid`` by its bounds), or ``default`` where it is unset or
    blank; a ValueError naming it, and saying ``wanted`` and the default,
    where its text is no such number. Settings read before any work starts."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        value = read(text)
    except ValueError:
        value = None
    if value is None or not valid(value):
        raise ValueError(f"{variable}={text!r}: give {wanted}; the default is {default:g}")
    return value


def worker_niceness() -> int:
    """How much nicer than the driver a worker runs: :data:`NICENESS_VARIABLE`
    when set (a whole number from 0 to 19, else a ValueError naming it),
    else :data:`WORKER_NICENESS`. The driver reads it before any worker starts."""
    return number_from_environment(
        NICENESS_VARIABLE, int, lambda value: 0 <= value <= 19, WORKER_NICENESS,
        "a whole number from 0 (the driver's priority) to 19 (the lowest)")


def thread_limit_environment(threads: int) -> dict[str, str]:
    """Environment entries that cap BLAS/OpenMP pools at ``threads`` threads."""
    return {name: str(threads) for name in THREAD_LIMIT_VARIABLES}


@contextlib.contextmanager
def thread_limits_in_environment(threads: int) -> Iterator[None]:
    """This process's :func:`thread_limit_environment` for the block, then
    as it was: tasks run in a process that is not theirs alone (the driver,
    an engine's worker) read ``LOKY_MAX_CPU_COUNT`` (joblib's ``cpu_count``,
    scikit-learn's ``n_jobs=-1``) and pass the limits on to the processes
    they start."""
    with _ENVIRONMENT_LOCK:  # (batches side by side in one process: threads)
        if not _ENVIRONMENT_HOLDERS:
            _ENVIRONMENT_BEFORE.clear()
            _ENVIRONMENT_BEFORE.update(
                {name: os.environ.get(name) for name in THREAD_LIMIT_VARIABLES})
        _ENVIRONMENT_HOLDERS.append(threads)
        os.environ.update(thread_limit_environment(threads))
    try:
        yield
    finally:
        with _ENVIRONMENT_LOCK:  # the last one out puts back what was there first
            _ENVIRONMENT_HOLDERS.remove(threads)
            if not _ENVIRONMENT_HOLDERS:
                for name, value in _ENVIRONMENT_BEFORE.items():
                    if value is None:
                        os.environ.pop(name, None)
                    else:
                        os.environ[name] = value


_ENVIRONMENT_LOCK = threading.Lock()
_ENVIRONMENT_HOLDERS: list[int] = []
_ENVIRONMENT_BEFORE: dict[str, str | None] = {}


_UNITS = {
    "": 1, "B": 1,
    "K": 1000, "KB": 1000, "KIB": 1024,
    "M": 1000**2, "MB": 1000**2, "MIB": 1024**2,
    "G": 1000**3, "GB": 1000**3, "GIB": 1024**3,
    "T": 1000**4, "TB": 1000**4, "TIB": 1024**4,
}


def parse_bytes(value: int | float | str) -> int:
    """``2_000_000_000``, ``"2GB"``, ``"1.5 GiB"`` or ``"512M"`` as a byte count."""
    import numbers

    if isinstance(value, bool):
        raise TypeError("a memory size must be a number of bytes or a string like '2GB'")
    if isinstance(value, numbers.Real):  # (NumPy's numbers too)
        size = float(value)
    elif isinstance(value, str):
        text = value.strip().upper().replace(" ", "")
        number = text.rstrip("KMGTIB")
        unit = text[len(number):]
        if unit not in _UNITS or not number:
            raise ValueError(f"cannot read memory size {value!r}; write e.g. '2GB' or '512MiB'")
        try:
            size = float(number) * _UNITS[unit]
        except ValueError:
            raise ValueError(
                f"cannot read memory size {value!r}; write e.g. '2GB' or '512MiB'"
            ) from None
    else:
        raise TypeError("a memory size must be a number of bytes or a string like '2GB'")
    if not size > 0 or size == float("inf"):  # NaN fails the first
        raise ValueError(f"a memory size must be a positive, finite number of bytes, "
                         f"got {value!r}")
    return int(size)


#: An entry of ``CUDA_VISIBLE_DEVICES`` that CUDA reads as a GPU: an index, or a
#: GPU's or MIG instance's UUID (as ``nvidia-smi -L`` prints them).
_CUDA_DEVICE_ID = re.compile(r"\d+|GPU-[0-9A-Za-z-]+|MIG-[0-9A-Za-z/-]+")


@dataclass(frozen=True)
class DetectedGpus:
    """The GPUs this process may use, and where they were read or, where there
    are none, why (``found``: for an error that says what is missing)."""

    ids: list[str]
    found: str
    limited_by_environment: bool = False  # CUDA_VISIBLE_DEVICES names them


def cuda_visible_ids(listed: str) -> list[str]:
    """The GPU ids in a ``CUDA_VISIBLE_DEVICES`` value, as CUDA reads it: its
    entries up to the first that is no GPU id ("0,-1,2" is GPU 0; "", "-1"
    and "none" hide every GPU, and so does "foo")."""
    ids = []
    for part in listed.split(","):
        entry = part.strip()
        if not _CUDA_DEVICE_ID.fullmatch(entry) or entry in ids:
            break
        ids.append(entry)
    return ids


def detect_gpus(ask_nvidia_smi: bool = True) -> DetectedGpus:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` lets this process use when it is set
    (an entry CUDA cannot read ends the list there, as in CUDA), else what
    ``nvidia-smi -L`` lists."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        ids = cuda_visible_ids(listed)
        if ids:
            return DetectedGpus(ids, f"CUDA_VISIBLE_DEVICES={listed!r}", True)
        return DetectedGpus([], f"CUDA_VISIBLE_DEVICES={listed!r} hides every GPU; CUDA "
                                "reads GPU numbers or GPU-/MIG- UUIDs, comma-separated")
    if not ask_nvidia_smi:
        return DetectedGpus([], "CUDA_VISIBLE_DEVICES is not set")
    if not shutil.which("nvidia-smi"):
        return DetectedGpus([], "no NVIDIA driver: nvidia-smi is not installed and "
                                "CUDA_VISIBLE_DEVICES is not set")
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return DetectedGpus([], f"nvidia-smi -L failed ({exc})")
    ids = [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]
    return DetectedGpus(ids, "nvidia-smi -L" if ids else "nvidia-smi -L lists no GPU")


def visible_gpus(declared: int | None = None) -> list[str]:
    """The GPU ids this process may use (:func:`detect_gpus`); ``declared``
    (``gpus=``) overrides the count, so that GPU scheduling can be planned
    (and tested) on any machine."""
    ids = detect_gpus(ask_nvidia_smi=declared is None).ids
    if declared is not None:
        ids = ids[:declared] if len(ids) >= declared else [str(i) for i in range(declared)]
    return ids
