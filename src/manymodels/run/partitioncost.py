"""Whether splitting one table between workers can pay, for ``map_partitions``.

Splitting a table costs what the function alone does not: starting the
workers (a fork takes about a tenth of a second, a spawn a second or more),
sending each partition's output back and concatenating the outputs; and the
workers gain only the cores they get: on a machine already busy (its load
average) a CPU-bound function split in two ran slower than on the whole
frame. So, unless the caller said how to split, the function is timed on one
row (its cost per call) and on the table's first rows (1/400 of them, at most
5,000, doubled while that takes under 20 ms, up to 1%), which give its cost
per row and how much of it was on a core (the rest asleep or reading), and
how long its output takes to pickle and unpickle, all in seconds of its own:
the time its thread waited for a core, another program's, is left out (the
kernel's account of the thread, ``/proc/thread-self/schedstat``). Time on a
core is then shared fairly between the threads that want one (the load
average), the workers' too. The table is split only where that estimate
says the workers finish, all costs included, in at most :data:`GAIN_NEEDED`
of the time one process would take. Otherwise the function runs once, in
this process, on the whole table, as ``fn(table)`` would (the trials cost
about 1% of that).
"""

from __future__ import annotations

import os
import pickle
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ..engine.backends._process_start import FORK_UNSAFE_MODULES
from ..inputs.datareaders import FrameSlices, _arrow_as, _locked
from ..inputs.sources import PartitionSource
from ..machine import usable_cores
from ..planning.plan import asks_for_key
from .results import OK, Summary

#: Split only where the workers are estimated to take at most this share of
#: the time of one process: the estimate is rough, and a wrong split is slower
#: (on a 2-core machine at a load average of 6.5, one split estimated at 0.8x
#: took 2.8x the function's time on the whole frame).
GAIN_NEEDED = 0.7
#: Seconds to start the workers, in parallel: forked, or spawned (an interpreter
#: and its imports each).
FORK_START_S, SPAWN_START_S = 0.1, 1.5
#: Sending the outputs back and concatenating them, in times what pickling
#: and unpickling them costs (the bench's workload f, 2,000,000 x 50 floats:
#: 1.8 s split on 2 cores where the function took 1.9 s); a table not shared
#: by a fork is put into shared memory at this many bytes a second.
RETURN_TIMES_PICKLING, SHARE_BYTES_PER_S = 0.75, 2e9
#: Seconds a partition costs the scheduler and a worker beyond its work.
PER_PARTITION_S = 0.002
#: The first trial slice: ``TRIAL_FRACTION`` of the rows, at most ``TRIAL_MAX_ROWS``.
TRIAL_FRACTION, TRIAL_MAX_ROWS = 1 / 400, 5_000
#: The trial slice is doubled while the function takes less than this on it.
TRIAL_MIN_S = 0.02

#: The options a caller may give and still leave how to split to the cost model.
LEFT_TO_US = frozenset({"workers", "shared", "progress", "start_method"})


@dataclass
class PartitionSummary(Summary):
    """A ``map_partitions`` run's summary, with how the table was split and why."""

    split: str = ""

    def __str__(self) -> str:
        return f"{super().__str__()}\nsplit       {self.split}"


@dataclass
class SplitDecision:
    split: bool
    reason: str


@dataclass
class Trial:
    """``fn`` timed on ``rows`` rows, in seconds of its own: the wall time less
    the time its thread waited for a core (another program's, not its cost),
    of which ``on_core_s`` on a core (the rest asleep or reading); and the
    seconds of its output's pickling and unpickling, likewise."""

    rows: int
    seconds: float
    on_core_s: float
    pickling_s: float = 0.0


def _rows(source: PartitionSource, offset: int, length: int) -> Any:
    """Rows ``offset`` .. ``offset + length`` as ``fn`` receives them: of a
    pandas frame, as a worker's partition is (a view under copy-on-write, a
    copy without it: ``fn`` writing in place into a view of pandas < 3 would
    write into the caller's frame, in a trial or in the run on the whole
    table)."""
    table = source.table
    if source.format == "pandas" and not hasattr(table, "schema"):
        return FrameSlices(table).rows((offset, length))
    return _locked(_arrow_as(table.slice(offset, length), source.format))


def _nbytes(output: Any) -> int:
    """An output's bytes, as its table or column holds them (0 where unknown)."""
    try:
        if hasattr(output, "memory_usage"):  # pandas
            usage = output.memory_usage(index=True, deep=False)
            return int(usage.sum() if hasattr(usage, "sum") else usage)
        if hasattr(output, "nbytes"):  # Arrow
            return int(output.nbytes)
        if hasattr(output, "estimated_size"):  # polars
            return int(output.estimated_size())
        if isinstance(output, dict):  # NumPy columns
            return int(sum(getattr(value, "nbytes", 0) for value in output.values()))
    except Exception:  # a size is an estimate: never a reason to fail
        pass
    return 0


def _thread_clocks() -> tuple[float, float, float]:
    """This thread's clocks: wall, on a core (its CPU time, exact), waiting for
    a core (the kernel's schedstat, brought up to date each time the thread
    gets a core back; where there is none, no wait)."""
    wall, on_core = time.perf_counter(), time.thread_time()
    try:
        with open("/proc/thread-self/schedstat") as stat:
            waiting = int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        waiting = 0.0
    return wall, on_core, waiting


def _own_seconds(work: Callable[[], Any]) -> tuple[float, float, Any]:
    """``work()``'s seconds, less those its thread waited for a core, and of
    them those on a core; and what it returned."""
    before = _thread_clocks()
    value = work()
    after = _thread_clocks()
    wall, on_core, waiting = (b - a for a, b in zip(before, after))
    return max(wall - waiting, on_core), on_core, value


def _timed(fn: Callable[..., Any], source: PartitionSource, length: int,
           shared: dict[str, Any]) -> tuple[Trial, Any]:
    data = _rows(source, 0, length)
    seconds, on_core, output = _own_seconds(lambda: fn(data, **shared))
    return Trial(length, seconds, on_core), output


def _trials(fn: Callable[..., Any], source: PartitionSource, first: int,
            shared: dict[str, Any]) -> tuple[float, Trial]:
    """``fn``'s cost per call (its fastest of three calls on one row, or its
    one call there where that takes :data:`TRIAL_MIN_S` or more: a fixed cost,
    such as loading a model, is paid again by every trial) and its trial on
    the table's first rows: ``first``, doubled while it takes under
    :data:`TRIAL_MIN_S` (a shorter time is mostly noise), up to 1% of the
    table; a trial still that short is run three times and the fastest kept."""
    per_call = _timed(fn, source, 1, shared)[0].seconds
    if per_call < TRIAL_MIN_S:
        per_call = min(per_call, *(_timed(fn, source, 1, shared)[0].seconds
                                   for _ in range(2)))
    trial, output = _timed(fn, source, first, shared)
    while trial.seconds < TRIAL_MIN_S and 2 * first <= source.num_rows // 100:
        first *= 2
        trial, output = _timed(fn, source, first, shared)
    if trial.seconds < TRIAL_MIN_S:
        for _ in range(2):
            again, output = _timed(fn, source, first, shared)
            trial = min(trial, again, key=lambda t: t.seconds)
    trial.pickling_s = _own_seconds(  # the output's way back, apart from fn's time
        lambda: pickle.loads(pickle.dumps(output, protocol=5)))[0]
    return per_call, trial


def _start_s(options: dict[str, Any]) -> float:
    """What starting the workers costs: forked where asked, or where the
    processes backend would fork them by itself (see its ``_spawn_reasons``)."""
    method = options.get("start_method", "auto")
    forks = method == "fork" or (method == "auto" and sys.platform.startswith("linux") and not
                                 any(name in sys.modules for name in FORK_UNSAFE_MODULES))
    return FORK_START_S if forks else SPAWN_START_S


def _runnable() -> float:
    """Threads wanting a core now, this one included: the load average."""
    try:
        return max(1.0, os.getloadavg()[0])
    except OSError:
        return 1.0


def _slowdown(runnable: float, cores: int) -> float:
    """How much longer a second of work takes when ``runnable`` threads share
    ``cores`` cores fairly (1 where each has one)."""
    return max(1.0, runnable / cores)


def decide(fn: Callable[..., Any], source: PartitionSource, workers: int,
           options: dict[str, Any]) -> SplitDecision:
    """Whether to split ``source`` between ``workers``; see the module's docstring.
    A function that fails on a trial slice is split, so that the failure is
    reported by partition, as ever."""
    rows = source.num_rows
    if workers < 2 or source.partitions < 2:
        return SplitDecision(False, "in-process, not split: one worker or one partition")
    first = max(1, min(TRIAL_MAX_ROWS, int(rows * TRIAL_FRACTION)))
    if 100 * first > rows:
        return SplitDecision(False, f"in-process, not split: the table has only {rows} rows")
    try:
        per_call, trial = _trials(fn, source, first, _keywords(fn, options))
    except Exception:
        return SplitDecision(True, "split: the function failed on a trial slice")
    scale = rows / trial.rows
    work = max(trial.seconds - per_call, 0.0) * scale  # fn's time per row, all rows
    # fn's time on a core is shared fairly with the other threads that want
    # one (the load average), the workers' as this process's; the rest
    # (asleep, reading) gains from every worker
    busy = min(1.0, trial.on_core_s / trial.seconds) if trial.seconds else 1.0
    cores, runnable = usable_cores(), _runnable()
    costs = (_start_s(options) + trial.pickling_s * scale * RETURN_TIMES_PICKLING
             + source.partitions * PER_PARTITION_S)
    if source.format != "pandas" or not hasattr(source.table, "iloc"):
        costs += _nbytes(source.table) / SHARE_BYTES_PER_S
    in_process = (per_call + work * busy) * _slowdown(runnable, cores) + work * (1 - busy)
    # the workers, and the driver collecting their outputs, each want a core
    crowded = _slowdown(runnable + workers - 1, cores)
    split = (work * busy / workers * crowded + work * (1 - busy) / workers
             + per_call * source.partitions / workers + costs * crowded)
    estimate = (f"the function takes about {in_process:.3g} s on the whole table in one "
                f"process (timed on {trial.rows} rows, {busy:.0%} of it on a core; load "
                f"average {runnable:.1f} on {cores} cores), about {split:.3g} s split between "
                f"{workers} workers, starting them and sending the outputs back included")
    if split <= GAIN_NEEDED * in_process:
        return SplitDecision(True, f"split into {source.partitions} partitions: {estimate}")
    return SplitDecision(False, f"in-process, not split: splitting cannot pay ({estimate})")


def _keywords(fn: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    """What ``fn`` is called with besides the rows, as ``train`` would call
    it on the one partition that the whole table is: the shared objects, and
    ``key=0`` when it asks for its key (unless a shared object is so named)."""
    shared = options.get("shared") or {}
    if "key" in shared or not asks_for_key(fn):
        return shared
    return {**shared, "key": 0}


def run_in_process(fn: Callable[..., Any], source: PartitionSource,
                   options: dict[str, Any], decision: SplitDecision,
                   began: float) -> tuple[Any, PartitionSummary]:
    """``fn`` on the whole table in this process, and the run's summary.
    A failure raises as a failed partition of a split run does."""
    data = _rows(source, 0, source.num_rows)
    start = time.perf_counter()
    try:
        output = fn(data, **_keywords(fn, options))
    except Exception as exc:
        import traceback

        raise RuntimeError(f"map_partitions: 1 task(s) failed; the first, 0, with:\n"
                           f"{traceback.format_exc()}") from exc
    task_s = time.perf_counter() - start
    wall = time.perf_counter() - began
    summary = PartitionSummary(tasks=1, ok=1, failed=0, statuses={OK.value: 1}, wall_s=wall,
                               task_time_s=task_s, workers=1, backend="serial",
                               utilization=task_s / wall if wall > 0 else 0.0, batches=1,
                               split=decision.reason)
    return output, summary


def with_split(summary: Summary, reason: str) -> PartitionSummary:
    """A split run's summary, saying how it was split and why."""
    return PartitionSummary(**asdict(summary), split=reason)


def attach_summary(result: Any, summary: Summary, table: Any) -> Any:
    """``result`` with the run's summary in a pandas result's ``attrs`` (a
    shallow copy where ``fn`` returned the caller's own frame)."""
    import pandas as pd

    if isinstance(result, (pd.DataFrame, pd.Series)):
        if result is table:
            result = result.copy(deep=False)
        result.attrs["summary"] = summary
    return result
