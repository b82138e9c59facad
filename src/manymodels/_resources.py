"""How many cores this process may really use, and how to keep BLAS/OpenMP from
oversubscribing them.

``os.cpu_count()`` lies inside containers and under ``taskset``: it counts the
machine's cores, not the ones this process may run on. Starting one worker per
counted core then oversubscribes the CPU. We take the smallest of the CPU
affinity mask and the cgroup CPU quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from pathlib import Path

#: Environment variables read by BLAS and OpenMP runtimes at import time.
THREAD_LIMIT_VARIABLES = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "BLIS_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
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


def thread_limit_environment(threads: int) -> dict[str, str]:
    """Environment entries that cap BLAS/OpenMP pools at ``threads`` threads."""
    return {name: str(threads) for name in THREAD_LIMIT_VARIABLES}


_UNITS = {
    "": 1, "B": 1,
    "K": 1000, "KB": 1000, "KIB": 1024,
    "M": 1000**2, "MB": 1000**2, "MIB": 1024**2,
    "G": 1000**3, "GB": 1000**3, "GIB": 1024**3,
    "T": 1000**4, "TB": 1000**4, "TIB": 1024**4,
}


def parse_bytes(value: int | float | str) -> int:
    """``2_000_000_000``, ``"2GB"``, ``"1.5 GiB"`` or ``"512M"`` as a byte count."""
    if isinstance(value, bool):
        raise TypeError("a memory size must be a number of bytes or a string like '2GB'")
    if isinstance(value, (int, float)):
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
    if size <= 0:
        raise ValueError(f"a memory size must be positive, got {value!r}")
    return int(size)


def visible_gpus(declared: int | None = None) -> list[str]:
    """The GPU ids this process may use: ``CUDA_VISIBLE_DEVICES`` when set, else
    what ``nvidia-smi -L`` lists; ``declared`` (``gpus=``) overrides the count,
    so that GPU scheduling can be planned (and tested) on any machine."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None and listed.strip() not in ("", "-1", "NoDevFiles"):
        ids = [part.strip() for part in listed.split(",") if part.strip()]
    else:
        ids = []
        if declared is None and shutil.which("nvidia-smi"):
            try:
                out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True,
                                     timeout=10).stdout
                ids = [str(i) for i, line in enumerate(out.splitlines())
                       if line.startswith("GPU ")]
            except (OSError, subprocess.SubprocessError):
                ids = []
    if declared is not None:
        ids = ids[:declared] if len(ids) >= declared else [str(i) for i in range(declared)]
    return ids
