"""Writing one run into the store, from the driver, in batched transactions.

The scheduler tells the recorder each finished task; the recorder hands them
to the store's writer thread (:mod:`.writer`), committed at least once a
second and at the end, so a driver killed at any moment loses at
most the last second of results, and never leaves a row that points at a
missing artifact (artifacts are written before the rows that name them, in the
same transaction or earlier). Its start, the models it reuses and its row,
is :mod:`.runstart`'s.
"""

from __future__ import annotations

import collections
import ctypes
import itertools
import operator
import sqlite3
import time
from typing import Any

import numpy as np
import pyarrow as pa

from ..engine.dataplane import pickle_any
from ..engine.messages import Pickled
from ..engine.modelfiles import ModelFile
from ..engine.partpacks import ModelPack
from ..engine.records import CANCELLED_CODE, FAILED_CODE, OK_CODE, STATUS_NAMES
from ..identity.hashing import TaskIdentities
from ..inputs.objectstores import shown
from . import database
from .lazymodels import IN_STORE
from .runstart import RunStart
from .writer import StoreWriter

COMMIT_EVERY_S = 1.0
#: A hand-over holds at most about this many tasks: on many cores a second's
#: worth is hundreds of thousands, and the driver holds up to three of them
#: (two waiting, one being committed) with their models.
HANDOVER_TASKS = 20_000
#: Once every task has been handed to the workers: what finishes is handed
#: over this often, so the commit left after the last result is small.
TAIL_COMMIT_EVERY_S = 0.2
#: How a worker process sends a model it pickled: ready for the writer as it is.
_SENT = (Pickled, ModelPack, ModelFile)
#: What a hand-over's models may all be for none to need pickling here.
_READY = {*_SENT, type(None)}
#: How often, at most, the writer hands the memory freed since back to the
#: system (Arrow's pool and the C heap keep freed pages for reuse: ~80 MB of
#: a run of a million, more at ten).
RETURN_FREED_EVERY_S = 2.0
#: Status code -> its text, as Arrow takes it (the store keeps statuses as text).
_STATUS_TEXT = pa.array(STATUS_NAMES, pa.string())


def _taken(column: list, indices: list[int], runs: list[tuple[int, int]] | None = None
           ) -> list:
    """``column``'s items at ``indices``, as a list (gathered in C: a
    hand-over of a million tasks takes its models and metrics); by slices where
    ``runs`` (see :func:`_runs`) says the indices are a few runs of
    consecutive tasks."""
    if runs is not None:
        taken: list = []
        for start, stop in runs:
            taken += column[start:stop]
        return taken
    if len(indices) == 1:
        return [column[indices[0]]]
    return list(operator.itemgetter(*indices)(column)) if indices else []


def _runs(indices: np.ndarray) -> list[tuple[int, int]] | None:
    """``indices`` as ``(start, stop)`` runs of consecutive task numbers, in
    their order, when they are few (the parts of a table's groups finish
    whole, in order within a part); None when slicing would not pay."""
    if len(indices) < 64:
        return None
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    if len(breaks) * 32 > len(indices):
        return None
    starts = indices[np.r_[0, breaks]]
    stops = indices[np.r_[breaks - 1, len(indices) - 1]] + 1
    return list(zip(starts.tolist(), stops.tolist()))


def _handover_end(pending: list[int], start: int, models: list) -> int:
    """Where the hand-over of ``pending[start:]`` ends: after
    :data:`HANDOVER_TASKS` tasks, and then after the last task whose model
    is in the same pack as the one before (the writer writes a worker's pack
    whole with the hand-over that names it: one cut in two would be written
    twice)."""
    end = min(start + HANDOVER_TASKS, len(pending))
    if end < len(pending):
        last = models[pending[end - 1]]
        if type(last) is ModelPack:
            while end < len(pending) and models[pending[end]] is last:
                end += 1
    return end


try:  # glibc's malloc_trim: hands the heap's free pages back (none elsewhere)
    _TRIM: Any = ctypes.CDLL(None).malloc_trim
except (AttributeError, OSError, TypeError):  # (TypeError: Windows has no CDLL(None))
    _TRIM = None


def return_freed_memory() -> None:
    """Hand the memory the driver freed back to the system: Arrow's pool and
    (on glibc) the C heap keep it otherwise, and the driver's size is what
    a run of ten million must keep down."""
    pa.default_memory_pool().release_unused()
    if _TRIM is not None:
        _TRIM(0)


class RunRecorder:
    """Records one run: its row in ``runs``, then its tasks as they finish."""

    def __init__(self, store: Any, plan: Any, identities: TaskIdentities, code_detail: dict,
                 *, fit_name: str, source: str, backend: str, workers: int) -> None:
        self.store = store
        self.conn = store._conn
        self.plan = plan
        self.identities = identities
        self.code_detail = code_detail
        self.fit_name, self.source = fit_name, source
        self.backend, self.workers = backend, workers
        self.run_id: int | None = None
        self._pending: list[int] = []
        self._start: RunStart | None = None
        self._last_commit = self._last_returned = time.monotonic()
        self._writer: StoreWriter | None = None
        self._records: Any = None
        self._ended = False  # the run's end is recorded (finish, abandon)
        #: The run's CheckpointSpace, when its tasks' checkpoints go once
        #: their models are committed (set by the run layer).
        self.checkpoints: Any = None

    def begin(self, reuse: bool, verify: bool = False) -> int:
        """Create the run's row and record the tasks whose models are reused
        (:class:`.runstart.RunStart`); return how many."""
        self._start = RunStart(self.store, self.plan, self.identities, self.code_detail,
                               fit_name=self.fit_name, source=self.source,
                               backend=self.backend, workers=self.workers)
        reused = self._start.begin(reuse, verify)
        self.run_id = self._start.run_id
        self._writer = StoreWriter(self.store.path, self.store.root, self.run_id,
                                   lambda: self._start.keys, self.identities,
                                   on_committed=self._forget_models)
        return reused

    def fill_reused(self, records: Any) -> int:
        """Fill in the results of the reused tasks; return how many."""
        return self._start.fill_reused(records) if self._start is not None else 0

    def _forget_models(self, packs: list[ModelPack], indices: list[int]) -> None:
        """Called by the writer thread once these models are committed: the
        driver drops its copies (``run.models`` loads them from the store),
        so its memory does not grow with the number of models. Until then it
        keeps them, so a failed write still leaves every model in ``.run``.
        A pack whose every task was committed lets go of its bytes, its
        tasks' slots left naming it (one call a pack, not a slot set a
        task); the other tasks' slots are set to :data:`IN_STORE`."""
        if self.checkpoints is not None:  # here, on the writer's thread: off the driver's loop
            for pack in packs:  # (before release() lets go of its indices)
                self.checkpoints.drop(pack.indices)
            self.checkpoints.drop(indices)
        for pack in packs:
            pack.release()
        collections.deque(map(self._records.model.__setitem__, indices,
                              itertools.repeat(IN_STORE)), maxlen=0)  # in C
        now = time.monotonic()
        if now - self._last_returned >= RETURN_FREED_EVERY_S:  # (off the driver's loop too)
            self._last_returned = now
            return_freed_memory()

    def task_finished(self, index: int) -> None:
        self._pending.append(index)

    def tasks_finished(self, indices: list[int]) -> None:
        self._pending.extend(indices)

    def flush(self, records: Any, force: bool = False, tail: bool = False) -> None:
        """Hand the finished tasks to the writer thread, at most once a second
        (sooner when :data:`HANDOVER_TASKS` wait) unless ``force`` (then wait
        until they are committed).

        Workers pickle each model for a store themselves, on every backend
        (as ``fit`` returned it); one a backend hands over unpickled is
        pickled here: one that cannot be fails its own task (it could never
        be loaded). An error of the store itself (a full disk) is raised here as
        :class:`StoreError`; its transaction was rolled back whole, so no row
        is ever committed without its artifact.
        """
        self._records = records
        self._raise_write_error()
        now = time.monotonic()
        every = TAIL_COMMIT_EVERY_S if tail else COMMIT_EVERY_S
        whole = force or now - self._last_commit >= every
        if self._pending and (whole or len(self._pending) >= HANDOVER_TASKS):
            pending, self._pending = self._pending, []
            start = 0
            try:
                while start < len(pending):
                    end = _handover_end(pending, start, records.model)
                    if end - start < HANDOVER_TASKS and not whole:
                        break  # the rest waits for its second, or for more
                    self._hand_over(records, pending[start:end])
                    start = end
            finally:  # (a Ctrl-C meanwhile: what was not handed over stays pending)
                self._pending = pending[start:] + self._pending
            self._last_commit = now
        if force:
            self._writer.wait()
            self._raise_write_error()

    def _hand_over(self, records: Any, pending: list[int]) -> None:
        """Hand the tasks ``pending`` to the writer, as one hand-over."""
        order = np.array(pending, dtype=np.int64)
        runs = _runs(order)
        model_of = records.model
        codes, models = records.status_code[order], _taken(model_of, pending, runs)
        kinds = set(map(type, models))
        if (codes == OK_CODE).all() and kinds <= _READY and ModelFile not in kinds:
            rows: Any = ()  # every model as a worker sent it (a million tasks' case)
        else:
            rows = range(len(models))
        for row in rows:
            model = models[row]
            ok = codes[row] == OK_CODE
            if model is None:
                continue
            if not ok:
                models[row] = None
                continue
            index = pending[row]
            if type(model) is ModelFile and not model.intact():  # its task alone fails
                codes[row] = records.status_code[index] = FAILED_CODE
                models[row] = model_of[index] = None
                records.set_error(index, f"the model file {model.path} its worker wrote is not "
                                  f"in store {shown(model.root)!r} with its {model.size} bytes "
                                  "(removed since, or the store is not on a path every "
                                  "worker sees as the driver does)")
                continue
            if type(model) in _SENT:
                continue
            try:
                models[row] = Pickled(pickle_any(model))
            except KeyboardInterrupt:
                raise
            except BaseException as exc:  # the task fails: its model could never be loaded
                codes[row] = records.status_code[index] = FAILED_CODE
                models[row] = model_of[index] = None
                records.set_error(
                    index, f"the model could not be pickled into the store: {exc!r}")
        self._writer.put({
            "task_index": order, "model": models,
            "status": _STATUS_TEXT.take(pa.array(codes)),
            "duration_s": records.duration_s[order],
            "started_at": records.started_at[order],
            "attempts": records.attempts[order], "worker": records.worker[order],
            "metrics": _taken(records.metrics, pending, runs),
            "error": records.error_column(pending)})

    def _raise_write_error(self) -> None:
        if self._writer is not None and self._writer.error is not None:
            raise self._writer.error

    def finish(self, records: Any, status: str, run: Any) -> None:
        """Record unfinished tasks as cancelled and close the run's row."""
        self._pending.extend(np.flatnonzero(records.status_code == CANCELLED_CODE).tolist())
        self.flush(records, force=True)
        self._writer.close()
        if self.checkpoints is not None:  # those ok without a model too, now committed
            self.checkpoints.drop(np.flatnonzero(records.ok_mask()
                                                 & ~records.reused_mask()).tolist())
        summary = run.summary()  # after the flush: an unpicklable model failed its task
        try:
            self.conn.execute(
                "UPDATE runs SET finished_at=?, status=?, ok=?, failed=?, reused=?, wall_s=? "
                "WHERE run_id=?",
                (time.time(), status, summary.ok, summary.failed, summary.reused, run.wall_s,
                 self.run_id))
        except sqlite3.Error as exc:
            raise database.busy_or_write_error(self.store.root, exc,
                                               "the run's end could not be recorded") from exc
        self._ended = True

    def abandon(self, records: Any = None, status: str = "failed") -> None:
        """After an error that ends the run (the store's own, or a backend's,
        or a Ctrl-C before the scheduler started): commit what finished if
        the store still can, and mark the run ``status`` (what was committed
        before stays usable). A run whose end is recorded already (by
        :meth:`finish`, or an earlier abandon) is left as it is."""
        if self._ended:
            return
        self._ended = True
        if self._writer is not None:
            if records is not None and self._writer.error is None:
                try:
                    self.flush(records, force=True)
                except Exception:  # the run is ending on an error already
                    pass
            self._writer.close()
            self._writer = None
        try:
            self.conn.execute("UPDATE runs SET finished_at=?, status=? WHERE run_id=?",
                              (time.time(), status, self.run_id))
        except sqlite3.Error:
            pass

