"""Running tasks inside a worker: the one piece of code every backend shares.

A worker (the driver itself, a thread, a process or a Ray task) builds an
:class:`Executor` from the run's :class:`RunContext` once, then runs batches
with it. The executor turns a task reference into ``fit``'s arguments, calls
``fit``, normalises what it returns, and turns any exception into a failed
outcome that carries the traceback: one bad task never costs the batch.

An outcome travels as a plain tuple (cheap to pickle, fast to unpickle)::

    (index, status, model, metrics, duration_s, started_at, error, retryable)

``retryable`` says that the exception is one of the run's ``retry_on`` types.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .tables import is_pandas_frame, plain_scalar

OK = "ok"
FAILED = "failed"
#: How often a worker sends the outcomes of a long batch so far: the driver
#: shows progress and records results without waiting for the batch to end.
FLUSH_EVERY_S = 0.25

#: ``(index, data reference, params)``: what a worker receives per task.
TaskRef = tuple[int, Any, "dict[str, Any] | None"]
Outcome = tuple[int, str, Any, dict, float, float, "str | None", bool]


@dataclass
class RunContext:
    """What every worker of a run needs, sent to each worker once."""

    fit: Callable[..., Any]
    kind: str  # "groups", "items" or "grid"
    format: str = "pandas"
    table: Any = None  # the sorted pyarrow Table, or the path of its shared-memory file
    shared: Any = None  # the shared= dict, or the path of its shared-memory file
    cpus_per_task: int = 1
    retry_on: tuple[type[BaseException], ...] = ()
    setup: Any = None  # a callable, or a dict of name -> callable, run once per worker
    reader: Any = None  # a tables.ParquetGroups when each batch reads its own groups
    column_labels: list | None = None  # labels of a pandas frame's columns, if not str
    driver_pid: int = field(default_factory=os.getpid)


@dataclass
class BatchPart:
    """Outcomes of part of a batch, as :meth:`Executor.run_in_parts` yields them."""

    outcomes: list[Outcome]
    busy_s: float  # running these tasks
    prepare_s: float  # preparing the batch (reading its rows): in its first part only
    last: bool  # the batch's final part
    running: int | None = None  # with part_before_each: the task about to start


def split_result(value: Any) -> tuple[Any, dict[str, Any]]:
    """``fit`` returns a model, ``(model, metrics)`` or a metrics dict alone."""
    if isinstance(value, Mapping):
        return None, _plain_metrics(value)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
        return value[0], _plain_metrics(value[1])
    return value, {}


def _plain_metrics(metrics: Mapping) -> dict[str, Any]:
    return {str(name): plain_scalar(value) for name, value in metrics.items()}


def run_setup(setup: Any) -> dict[str, Any]:
    """Build a worker's own resources: ``setup()`` is passed to ``fit`` as
    ``resource=``; a dict of name -> callable, each under its name."""
    if isinstance(setup, Mapping):
        return {name: make() for name, make in setup.items()}
    return {"resource": setup()}


def pickle_any(obj: Any) -> bytes:
    """Pickle ``obj`` with the standard pickler (fast), or with cloudpickle when
    it holds lambdas or classes defined in ``__main__``."""
    import pickle

    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:
        import cloudpickle

        return cloudpickle.dumps(obj, protocol=5)


def _range_index(length: int) -> Any:
    import pandas as pd

    return pd.RangeIndex(length)


class Executor:
    """Runs batches of tasks for one worker of one run."""

    def __init__(self, context: RunContext, table: Any = None, shared: dict | None = None):
        self.fit = context.fit
        self.kind = context.kind
        self.format = context.format
        self.retry_on = tuple(context.retry_on)
        self.table = table if table is not None else context.table
        self.shared = shared if shared is not None else (context.shared or {})
        if context.setup is not None:
            self.shared = {**self.shared, **run_setup(context.setup)}
        self.reader = context.reader
        self.labels = context.column_labels
        self.driver_pid = context.driver_pid
        self._materialize = self._group_materializer() if self.kind == "groups" else None
        # this batch's rows as one DataFrame, and where each group starts in it
        self._span: tuple[dict[tuple[int, int], int], Any] | None = None
        self._read: dict[tuple, Any] = {}  # key -> rows, of this batch, with a reader
        self._read_error: str | None = None

    def begin_batch(self, tasks: list[TaskRef]) -> None:
        """Convert the rows of a batch of pandas groups to pandas in one go.

        Converting Arrow to pandas costs far more per call than per row, so
        twenty-row groups one by one spend more time converting than fitting
        (about 0.4 ms a group). So the batch's rows are converted once: the
        span of the sorted table they lie in when they are dense in it (groups
        of equal size keep key order in the longest-first queue), else just
        their slices, gathered; each task gets a slice of the result.
        """
        self._span = None
        if self.reader is not None:
            self._read_error = None
            try:
                self._read = self.reader.read([task[1] for task in tasks])
            except Exception:  # each task fails with the reason when it looks for its rows
                self._read = {}
                self._read_error = traceback.format_exc()
            return
        if (self.kind != "groups" or self.format != "pandas" or len(tasks) < 2
                or is_pandas_frame(self.table)):
            return
        refs = dict.fromkeys(task[1] for task in tasks)  # a product source repeats groups
        first = min(offset for offset, _ in refs)
        end = max(offset + length for offset, length in refs)
        rows = sum(length for _, length in refs)
        if end - first <= 2 * rows:
            frame = self._to_pandas(self.table.slice(first, end - first))
            self._span = ({ref: ref[0] - first for ref in refs}, frame)
            return
        import pyarrow as pa

        starts, position = {}, 0
        for ref in refs:
            starts[ref] = position
            position += ref[1]
        pieces = pa.concat_tables([self.table.slice(offset, length) for offset, length in refs])
        self._span = (starts, self._to_pandas(pieces))

    def _pandas_group(self, ref: tuple[int, int]) -> Any:
        if self._span is not None:
            starts, frame = self._span
            start = starts.get(ref)
            if start is not None:
                group = frame.iloc[start:start + ref[1]]
                group.index = _range_index(ref[1])
                return group
        return self._to_pandas(self.table.slice(ref[0], ref[1]))

    def _to_pandas(self, rows: Any) -> Any:
        frame = rows.to_pandas()
        if self.labels is not None:
            frame.columns = self.labels
        return frame

    def _rows_read(self, ref: tuple[tuple, tuple[int, ...]]) -> Any:
        key = ref[0]
        rows = self._read.get(key)
        if rows is None:
            reason = self._read_error
            raise LookupError(f"the rows of group {key!r} could not be read"
                              + (f":\n{reason}" if reason else " (none match it any more)"))
        return rows

    def _group_materializer(self) -> Callable[[Any], Any]:
        table, fmt = self.table, self.format
        if is_pandas_frame(table):  # map_partitions over a pandas frame: views of it
            import pandas as pd

            if int(pd.__version__.split(".")[0]) < 3:  # no copy-on-write: fn could
                # write through a view into the caller's frame
                return lambda ref: table.iloc[ref[0]:ref[0] + ref[1]].copy()
            return lambda ref: table.iloc[ref[0]:ref[0] + ref[1]]
        if self.reader is not None:
            rows_of = self._rows_read
        else:
            def rows_of(ref: tuple[int, int]) -> Any:
                return table.slice(ref[0], ref[1])
        if fmt == "arrow":
            return rows_of
        if fmt == "pandas":
            if self.reader is None:
                return self._pandas_group

            def as_frame(ref: Any) -> Any:
                frame = rows_of(ref).to_pandas()
                frame.index = _range_index(len(frame))  # as the eager path's groups
                return frame
            return as_frame
        if fmt == "polars":
            import polars as pl

            return lambda ref: pl.from_arrow(rows_of(ref))
        if fmt == "numpy":
            def as_arrays(ref: Any) -> dict[str, Any]:
                rows = rows_of(ref)
                return {name: column.to_numpy()
                        for name, column in zip(self.labels or rows.column_names,
                                                rows.columns)}
            return as_arrays
        raise ValueError(f"unknown format {fmt!r}")

    def run_one(self, task: TaskRef) -> Outcome:
        index, data, params = task
        started_at = time.time()
        start = time.perf_counter()
        try:
            kwargs = {**params, **self.shared} if params else self.shared
            if self.kind == "groups":
                value = self.fit(self._materialize(data), **kwargs)
            elif self.kind == "items":
                value = self.fit(data, **kwargs)
            else:
                value = self.fit(**kwargs)
            model, metrics = split_result(value)
        except (Exception, SystemExit, KeyboardInterrupt) as exc:
            if isinstance(exc, KeyboardInterrupt) and self._in_drivers_main_thread():
                raise  # a real Ctrl-C (serial backend): it stops the run
            return (index, FAILED, None, {}, time.perf_counter() - start, started_at,
                    traceback.format_exc(), isinstance(exc, self.retry_on))
        return (index, OK, model, metrics, time.perf_counter() - start, started_at, None, False)

    def _in_drivers_main_thread(self) -> bool:
        """Ctrl-C reaches only the driver's main thread: a KeyboardInterrupt
        anywhere else (a worker thread, a worker process) was raised by the
        task itself, and fails that task alone."""
        return (os.getpid() == self.driver_pid
                and threading.current_thread() is threading.main_thread())

    def run_in_parts(
        self,
        tasks: list[TaskRef],
        *,
        on_start: Callable[[int], None] | None = None,
        flush_every_s: float | None = None,
        part_before_each: bool = False,
    ) -> Iterator[BatchPart]:
        """Run a batch's ``tasks`` in order, yielding their outcomes in parts.

        Every backend runs a batch through this one loop, so that they time
        the batch's preparation and its tasks alike. A part comes every
        ``flush_every_s`` seconds of running (the driver sees progress and
        frees memory within a long batch), or with ``part_before_each`` just
        before each task, naming it (the Ray backend's marked mode); the last
        part ends the batch. ``on_start(index)`` is called as each task starts.
        """
        start = time.perf_counter()
        self.begin_batch(tasks)
        begin = last_flush = time.perf_counter()
        prepare = begin - start
        outcomes: list[Outcome] = []
        for position, task in enumerate(tasks):
            if part_before_each:
                now = time.perf_counter()
                yield BatchPart(outcomes, now - begin, prepare, last=False, running=task[0])
                outcomes, begin, prepare = [], now, 0.0
            if on_start is not None:
                on_start(task[0])
            outcomes.append(self.run_one(task))
            if flush_every_s is not None and position + 1 < len(tasks):
                now = time.perf_counter()
                if now - last_flush > flush_every_s:
                    yield BatchPart(outcomes, now - begin, prepare, last=False)
                    outcomes, begin, last_flush, prepare = [], now, now, 0.0
        yield BatchPart(outcomes, time.perf_counter() - begin, prepare, last=True)

    def run_batch(self, tasks: list[TaskRef]) -> BatchPart:
        """Run ``tasks`` in order; all their outcomes in one part."""
        *_, whole = self.run_in_parts(tasks)
        return whole
