"""How many cores this process may really use, and how to keep BLAS/OpenMP from
oversubscribing them.

``os.cpu_count()`` lies inside containers and under ``taskset``: it counts the
machine's cores, not the ones this process may run on. Starting one worker per
counted core then oversubscribes the CPU. We take the smallest of the CPU
affinity mask and the cgroup CPU quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``).

Also the driver's cyclic garbage collector, paused while a run's fits run in
other processes (:func:`collector_paused`).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import math
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

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


def worker_niceness() -> int:
    """How much nicer than the driver a worker runs: :data:`NICENESS_VARIABLE`
    when set (a whole number from 0 to 19, else a ValueError naming it),
    else :data:`WORKER_NICENESS`. The driver reads it before any worker starts."""
    text = os.environ.get(NICENESS_VARIABLE, "").strip()
    if not text:
        return WORKER_NICENESS
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise ValueError(f"{NICENESS_VARIABLE}={text!r}: give a whole number from 0 (the "
                         f"driver's priority) to 19 (the lowest); the default is "
                         f"{WORKER_NICENESS}")
    return value


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


# -- processes and the memory they hold ------------------------------------------
#
# Read from /proc where there is one (Linux); psutil elsewhere.


def process_table() -> dict[int, tuple[int, int]]:
    """``{pid: (parent pid, session id)}`` of every live process (zombies left
    out), from one pass over ``/proc``."""
    table: dict[int, tuple[int, int]] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return _psutil_process_table()
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as handle:
                stat = handle.read()
            # after "pid (comm) ": state ppid pgrp session ...
            state, ppid, _, session = stat[stat.rindex(b")") + 2:].split(None, 4)[:4]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if state not in (b"Z", b"X"):
            table[int(name)] = (int(ppid), int(session))
    return table


def _psutil_process_table() -> dict[int, tuple[int, int]]:
    import psutil

    table = {}
    for process in psutil.process_iter(["ppid", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            table[process.pid] = (process.info["ppid"], os.getsid(process.pid))
        except OSError:
            continue
    return table


def process_tree(root: int, table: dict[int, tuple[int, int]] | None = None) -> list[int]:
    """The live processes that belong to ``root``, a session leader, ``root``
    left out: its descendants, and every process of its session (a process
    whose parent exited stays in the session), with their descendants. A
    descendant that started a session of its own and was then orphaned (a
    daemon's double fork) is nobody's: it is not found."""
    table = process_table() if table is None else table
    children: dict[int, list[int]] = {}
    pending = []
    for pid, (ppid, session) in table.items():
        children.setdefault(ppid, []).append(pid)
        if session == root and pid != root:
            pending.append(pid)
    pending.extend(children.get(root, ()))
    seen, tree = {root}, []
    while pending:
        pid = pending.pop()
        if pid not in seen:
            seen.add(pid)
            tree.append(pid)
            pending.extend(children.get(pid, ()))
    return tree


def end_tree(root: int, *, with_root: bool) -> list[int]:
    """SIGKILL the processes of ``root``'s tree (:func:`process_tree`), and
    ``root`` itself ``with_root``, but for resource trackers
    (:func:`ends_by_itself`). Each is stopped first and the tree looked up
    again until no new one shows, so that none starts another meanwhile.
    Returns the processes signalled."""
    stopped: list[int] = []
    candidates = [root] if with_root else []
    for _ in range(8):
        for pid in candidates:
            try:
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            except OSError:
                pass
        tree = process_tree(root)
        candidates = [pid for pid in tree if pid not in stopped and not ends_by_itself(pid)]
        if not candidates:
            break
    for pid in stopped:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return stopped


def wait_for_exit(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for child ``pid`` to exit, without
    reaping it; whether it did. Woken by the exit itself (a pidfd, Linux
    5.3+), where a poll loop's sleeps add milliseconds to every run's end;
    elsewhere, False at once: the caller polls as before."""
    import select

    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux, an old kernel, or already reaped
        return False
    try:
        waiter = select.poll()
        waiter.register(fd, select.POLLIN)
        return bool(waiter.poll(max(0, int(timeout * 1000))))
    finally:
        os.close(fd)


def ends_by_itself(pid: int) -> bool:
    """Whether ``pid`` is a resource tracker (multiprocessing's, or loky's
    under joblib): once every process that holds its pipe is gone, it
    removes what they leaked (shared memory, semaphores, joblib's memory
    mapped folders under ``/dev/shm``), then exits. Killing it would leak them."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return b"resource_tracker import main" in handle.read()
    except OSError:
        return False


def memory_bound(pid: int) -> int:
    """A cheap upper bound (in bytes) of :func:`memory_held`: the process's
    resident anonymous and shared-memory pages and its swap, read from
    ``/proc/PID/status`` (tens of microseconds). Raises ``OSError`` once the
    process is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as handle:
            status = handle.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise
        return _psutil_rss(pid)
    total = 0
    for line in status.split(b"\n"):
        if line.startswith((b"RssAnon:", b"RssShmem:", b"VmSwap:")):
            total += int(line.split()[1])
    return total * 1024


def _psutil_rss(pid: int) -> int:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error as error:
        raise OSError(str(error)) from None


def memory_held(pid: int, exclude: str | None = None) -> int:
    """The memory (in bytes) that process ``pid`` holds, with pages it shares
    with others split between them (PSS): its anonymous memory (heap, stacks,
    the copy-on-write pages of private file mappings), its shared memory
    (shared anonymous mappings, ``memfd``, files under ``tmpfs`` such as
    ``/dev/shm``) and its swap. Not counted: the page cache of the regular
    files it maps (reclaimable, like the libraries it loaded) and the
    mappings of files whose path contains ``exclude`` (the run's read-only
    data plane).

    The kernel walks the process's page tables for this (milliseconds for a
    worker with NumPy and pandas loaded, more the more it maps): call it only
    when :func:`memory_bound` says it could matter. Raises ``OSError`` once
    the process is gone."""
    try:
        if exclude:
            with open(f"/proc/{pid}/maps", "rb") as handle:
                mapped = handle.read()  # no page walk: cheap
            if exclude.encode() in mapped:
                return _memory_held_by_mapping(pid, exclude.encode())
        with open(f"/proc/{pid}/smaps_rollup", "rb") as handle:
            rollup = handle.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise
        return _psutil_rss(pid)  # no /proc: not Linux
    fields = dict(_ROLLUP_FIELD.findall(rollup))
    if b"Pss_Anon" not in fields:  # Linux before 5.7
        return _memory_held_by_mapping(pid, exclude.encode() if exclude else None)
    return sum(int(fields.get(name, 0)) for name in (b"Pss_Anon", b"Pss_Shmem", b"SwapPss")) * 1024


_ROLLUP_FIELD = re.compile(rb"\n(\w+): +(\d+)")
#: In /proc/PID/smaps: a mapping's header line (its path), or a field that counts.
_SMAPS_LINE = re.compile(
    rb"\n(?:[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ \S+ *([^\n]*)|(Pss|Anonymous|SwapPss): +(\d+))"
)


def _memory_held_by_mapping(pid: int, skip: bytes | None) -> int:
    with open(f"/proc/{pid}/smaps", "rb") as handle:
        smaps = b"\n" + handle.read()
    shared = _shared_memory_mounts()
    total = 0
    counted: bytes | None = b"Pss"  # the field that counts in the current mapping
    for path, field, kib in _SMAPS_LINE.findall(smaps):
        if field:
            if field == counted or (field == b"SwapPss" and counted is not None):
                total += int(kib)
        elif not path.startswith(b"/"):  # anonymous, [heap], [stack], [anon:...]
            counted = b"Pss"
        elif skip is not None and skip in path:
            counted = None
        elif path.startswith(shared):
            counted = b"Pss"
        else:  # a regular file: only the pages written (copied) are the process's
            counted = b"Anonymous"
    return total * 1024


@functools.lru_cache(maxsize=1)
def _shared_memory_mounts() -> tuple[bytes, ...]:
    """Path prefixes of the mappings that are shared memory, not files: those
    of memory file systems (``tmpfs``, such as ``/dev/shm``), ``memfd``
    files, shared anonymous (``/dev/zero``) and System V segments."""
    prefixes = [b"/memfd:", b"/dev/zero", b"/SYSV", b"/dev/shm/"]
    try:
        with open("/proc/self/mounts", "rb") as handle:
            for line in handle:
                fields = line.split()
                if len(fields) > 2 and fields[2] in (b"tmpfs", b"ramfs", b"hugetlbfs"):
                    mount = fields[1].replace(b"\\040", b" ").rstrip(b"/")
                    if mount:  # a root file system in memory: its files are files
                        prefixes.append(mount + b"/")
    except OSError:
        pass
    return tuple(prefixes)


#: Whether :func:`collector_paused` has the collector off now: a worker forked
#: meanwhile turns its own back on (it runs user code).
COLLECTOR_PAUSED = False


@contextlib.contextmanager
def collector_paused(pause: bool) -> Iterator[None]:
    """Python's cyclic garbage collector off while a run plans and drives its
    tasks, when ``pause`` (its fits run in other processes), and as it was
    after. Each full pass walks every container object, and a million tasks'
    plan, results and outcomes are millions of them, all acyclic: a stored run
    of a million models made passes worth 4 s of its 27 (measured). Memory
    held in a cycle made meanwhile is freed by the first pass after the run.
    With threads or serial, ``fit`` runs in this process, so it stays on."""
    global COLLECTOR_PAUSED
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    COLLECTOR_PAUSED = True
    try:
        yield
    finally:
        COLLECTOR_PAUSED = False
        gc.enable()
