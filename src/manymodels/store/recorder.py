"""Writing one run into the store, from the driver, in batched transactions.

The scheduler tells the recorder each finished task; the recorder hands them
to the store's writer thread (:mod:`.writer`), committed at least once a
second and at the end, so a driver killed at any moment loses at
most the last second of results, and never leaves a row that points at a
missing artifact (artifacts are written before the rows that name them, in the
same transaction or earlier).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..dataplane import pickle_any
from ..hashing import TaskIdentities
from ..keys import encode_keys
from ..messages import Pickled, Status
from ..partpacks import ModelPack
from ..tables import one_array
from . import artifacts, database, taskblocks
from .registry import IN_STORE
from .writer import StoreWriter

COMMIT_EVERY_S = 1.0
#: How a worker process sends a model it pickled: ready for the writer as it is.
_SENT = (Pickled, ModelPack)
#: What a hand-over's models may all be for none to need pickling here.
_READY = {*_SENT, type(None)}
#: Reused tasks' rows per block (see ``RunRecorder._insert_reused``).
_REUSED_BLOCK = 1 << 18
#: The columns a reused task takes from the task whose model it reuses.
_REUSED_COLUMNS = ("identity", "status", "reused_from", "error", "artifact", "size",
                   "metrics", "duration_s", "key")


def _same_tasks(wanted: pa.Array, candidates: pa.Array, task_index: pa.ChunkedArray,
                positions: np.ndarray) -> pa.Array | None:
    """Where each of ``wanted`` (every task's identity, in task order) is
    among ``candidates`` (an earlier run's trained tasks' identities, at
    ``positions`` of its rows, ``task_index`` their task numbers there; null
    where a task is not), when that run had the same tasks: each it trained
    then has its own identity at its own number, checked at once (a tenth of
    a hash join's time for an unchanged re-run of a million); None when not."""
    count = len(wanted)
    if len(candidates) > count or len(candidates) == 0:
        return None
    numbers = task_index.to_numpy()[positions] if len(positions) != len(task_index) \
        else task_index.to_numpy()
    if numbers.min() < 0 or numbers.max() >= count or np.bincount(numbers).max() != 1:
        return None  # not each task once
    if not pc.all(pc.equal(wanted.take(pa.array(numbers)), candidates)).as_py():
        return None
    at = np.zeros(count, dtype=np.int64)
    at[numbers] = np.arange(len(numbers))
    missing = None
    if len(numbers) < count:  # tasks that run did not train
        missing = np.ones(count, dtype=bool)
        missing[numbers] = False
    return pa.array(at, mask=missing)


class RunRecorder:
    """Records one run: its row in ``runs``, then its tasks as they finish."""

    def __init__(self, store: Any, plan: Any, identities: Callable[[], TaskIdentities],
                 code_detail: dict, *, fit_name: str, source: str, backend: str,
                 workers: int) -> None:
        self.store = store
        self.conn = store._conn
        self.plan = plan
        #: Makes every task's identity (see :meth:`_start_identities`).
        self._make_identities = identities
        self._identities: Future[TaskIdentities] = Future()
        self.code_detail = code_detail
        self.fit_name, self.source = fit_name, source
        self.backend, self.workers = backend, workers
        self.run_id: int | None = None
        self._pending: list[int] = []
        self._reused: pa.Table | None = None
        #: (run, tasks): every row that run trained is reused here, as it is
        self._same_as: tuple[int, int] | None = None
        self._keys: pa.Array | None = None
        self._last_commit = time.monotonic()
        self._writer: StoreWriter | None = None
        self._records: Any = None

    @property
    def identities(self) -> TaskIdentities:
        """Every task's identity (waiting for them when they are being made)."""
        return self._identities.result()

    def begin(self, reuse: bool) -> int:
        """Create the run's row and record the tasks whose models are reused
        (as blocks, like any finished task); return how many."""
        reuse = self._start_identities(reuse)
        self._keys = encode_keys(self.plan.key_rows, self.plan.key_table)
        reused = self._reused = self._find_reusable() if reuse else None
        # what the match read and dropped goes back to the system now: a
        # re-run of a million would otherwise hold it through the run
        pa.default_memory_pool().release_unused()
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self.run_id = database.insert_run(
                conn, backend=self.backend, workers=self.workers, source=self.source,
                fit=self.fit_name, tasks=len(self.plan.tasks),
                key_columns=self.plan.key_columns, param_columns=self.plan.param_columns,
                code_detail=self.code_detail)
            if self._same_as is not None:
                self._insert_same_as(*self._same_as)
            if reused is not None and reused.num_rows:
                self._insert_reused(reused.filter(pc.invert(reused["by_reference"])))
            conn.execute("COMMIT")
        except BaseException as exc:
            database.rollback_quietly(conn)
            if isinstance(exc, sqlite3.Error):
                raise database.write_error(self.store.path, exc, "the run could not start") \
                    from exc
            raise
        self._writer = StoreWriter(self.store.path, self.run_id, self._keys,
                                   self._identities, on_committed=self._forget_models)
        return 0 if reused is None else reused.num_rows

    def _start_identities(self, reuse: bool) -> bool:
        """Make the tasks' identities now, or, when no task could be reused
        (the store never trained a model, or ``reuse=False``) and hashing
        the data cannot fail, on a thread while the run goes: a million
        groups' rows take half a second to hash, which the workers would
        otherwise wait. The writer waits for them before its first commit.
        Return whether reuse is worth looking for."""
        reuse = reuse and (bool(self._runs_that_trained()) or self._has_legacy_rows())
        if reuse or not self.plan.data.hashing_cannot_fail():
            self._identities.set_result(self._make_identities())  # may refuse, before work
            return reuse

        def make() -> None:
            try:
                self._identities.set_result(self._make_identities())
            except BaseException as exc:  # the writer raises it as the store's error
                self._identities.set_exception(exc)

        threading.Thread(target=make, name="manymodels-identities", daemon=True).start()
        return False

    def _insert_same_as(self, source: int, tasks: int) -> None:
        """One block naming ``source``'s trained rows, every one reused here
        (see :meth:`_names_every_trained_row`): checked again inside this
        transaction, where no other driver can delete that run meanwhile."""
        status = self.conn.execute("SELECT status FROM runs WHERE run_id = ?",
                                   (source,)).fetchone()
        if status is None or status[0] == "running":
            raise database.StoreError(
                f"run {source}, whose models this run reuses, was deleted while the run "
                "started: start it again")
        taskblocks.insert_same_as(self.conn, self.run_id, source, tasks)

    def _insert_reused(self, reused: pa.Table) -> None:
        """The reused tasks' rows: blocks of at most 262,144 each (a million
        rows as one block held 540 MB while it was made and encoded; a
        quarter of that at a time)."""
        for start in range(0, reused.num_rows, _REUSED_BLOCK):
            part = reused.slice(start, _REUSED_BLOCK)
            taskblocks.insert(self.conn, self.run_id, taskblocks.table({
                **taskblocks.task_columns(self._keys, self.identities, part["task_index"]),
                "status": pa.repeat(pa.scalar("ok", pa.string()), part.num_rows),
                "attempts": np.zeros(part.num_rows, dtype=np.int64),
                "duration_s": part["duration_s"], "metrics": part["metrics"],
                "artifact": part["artifact"], "size": part["size"],
                "reused_from": part["reused_from"]}))
            pa.default_memory_pool().release_unused()

    def _find_reusable(self) -> pa.Table | None:
        """For each task, the latest task that trained its identity, if its
        model can still be loaded (its artifact is in the index, its file or
        pack there and whole, and no load found it corrupt), as a table:
        ``task_index`` (this run's), ``reused_from`` (the run that trained
        it), ``has_model``, ``metrics``, and, unless ``by_reference`` (see
        :meth:`_names_every_trained_row`), ``artifact``, ``size`` and
        ``duration_s``.

        The runs that trained something are read newest first, one columnar
        read and one vectorised match each, until every identity is found:
        an unchanged re-run reads one run. Stores written before task blocks
        are then looked up per identity, in the old ``tasks`` table."""
        self._same_as = None
        if not self.plan.tasks:
            return None
        names, prefixes = self.identities.identity, self.identities.prefixes
        left = np.arange(len(names))
        found: list[pa.Table] = []
        for run_id in self._runs_that_trained():
            if left.size == 0:
                break
            if not taskblocks.may_have_trained(self.conn, run_id, prefixes[left]):
                continue  # none of these identities is among what it trained
            trained = taskblocks.read_run(self.conn, run_id, _REUSED_COLUMNS,
                                          trained_only=True, ordered=False)
            positions = taskblocks.trained_rows(trained)
            if positions.size == 0:
                continue
            # only the identities are matched; the rest is taken for the matches alone
            candidates = trained["identity"] if positions.size == trained.num_rows else \
                trained["identity"].take(pa.array(positions))
            every = left.size == len(names)
            at = _same_tasks(names, candidates, trained["task_index"], positions) \
                if every else None
            if at is not None and self._names_every_trained_row(run_id, trained, positions, at):
                found.append(self._reused_by_reference(run_id, trained, positions, at))
                left = left[~at.is_valid().to_numpy(zero_copy_only=False)]
                continue
            if at is None:  # another plan: a hash join
                at = pc.index_in(names if every else names.take(pa.array(left)),
                                 value_set=candidates)
            hit = at.is_valid().to_numpy(zero_copy_only=False)
            if not hit.any():
                continue
            rows = trained.select(["artifact", "size", "metrics", "duration_s"]).take(
                pa.array(positions[at.drop_null().to_numpy()]))
            del trained
            loadable = self._loadable_mask(rows)
            matched = left[hit][loadable]
            if not loadable.all():
                rows = rows.filter(pa.array(loadable))
            found.append(pa.table({
                "task_index": pa.array(matched, pa.int64()),
                "reused_from": pa.repeat(pa.scalar(run_id, pa.int64()), len(matched)),
                "has_model": rows["artifact"].is_valid(),
                "by_reference": pa.repeat(pa.scalar(False), len(matched)),
                "artifact": rows["artifact"], "size": rows["size"],
                "metrics": rows["metrics"], "duration_s": rows["duration_s"]}))
            keep = np.ones(left.size, dtype=bool)
            keep[np.flatnonzero(hit)[loadable]] = False
            left = left[keep]
        if left.size and self._has_legacy_rows():
            found.append(self._legacy_reusable(left))
        found = [part for part in found if part.num_rows]
        if not found:
            return None
        return pa.concat_tables(found).combine_chunks()

    def _names_every_trained_row(self, run_id: int, trained: pa.Table, positions: np.ndarray,
                                 at: pa.Array) -> bool:
        """Whether this run may name ``run_id``'s trained rows instead of
        copying them (:func:`.taskblocks.insert_same_as`): each of them is
        one of this run's tasks at its own number (``at``, from
        :func:`_same_tasks`) with its own key, every one's model can be
        loaded, and that run has ended (no row of it will change)."""
        status = self.conn.execute("SELECT status FROM runs WHERE run_id = ?",
                                   (run_id,)).fetchone()
        if status is None or status[0] == "running":
            return False
        rows = pa.array(positions) if positions.size != trained.num_rows else None
        keys = trained["key"] if rows is None else trained["key"].take(rows)
        numbers = trained["task_index"].to_numpy()[positions]
        if not pc.all(pc.equal(self._keys.take(pa.array(numbers)), keys)).as_py():
            return False
        artifact = trained["artifact"] if rows is None else trained["artifact"].take(rows)
        return bool(self._loadable_mask(pa.table({
            "artifact": artifact,
            "metrics": trained["metrics"] if rows is None else trained["metrics"].take(rows),
        })).all())

    def _reused_by_reference(self, run_id: int, trained: pa.Table, positions: np.ndarray,
                             at: pa.Array) -> pa.Table:
        """The tasks reused from each row ``run_id`` trained, for the results
        of this run (its store names them: see :meth:`begin`)."""
        hit = at.is_valid().to_numpy(zero_copy_only=False)
        rows = pa.array(positions[at.drop_null().to_numpy()])
        count = len(rows)
        self._same_as = (run_id, count)
        return pa.table({
            "task_index": pa.array(np.flatnonzero(hit), pa.int64()),
            "reused_from": pa.repeat(pa.scalar(run_id, pa.int64()), count),
            "has_model": trained["artifact"].is_valid().take(rows),
            "by_reference": pa.repeat(pa.scalar(True), count),
            "artifact": pa.nulls(count, pa.string()), "size": pa.nulls(count, pa.int64()),
            "metrics": trained["metrics"].take(rows),
            "duration_s": pa.nulls(count, pa.float64())})

    def _runs_that_trained(self) -> list[int]:
        return [run_id for (run_id,) in self.conn.execute(
            "SELECT DISTINCT b.run_id FROM task_blocks b JOIN runs r ON r.run_id = b.run_id "
            "WHERE b.trained > 0 AND coalesce(r.backend, '') NOT LIKE 'mm.linear%' "
            "ORDER BY b.run_id DESC")]

    def _loadable_mask(self, rows: pa.Table) -> np.ndarray:
        """Which of ``rows`` left a model that can still be loaded, or metrics
        without a model."""
        artifact = rows["artifact"]
        if isinstance(artifact, pa.ChunkedArray) and artifact.num_chunks > 1:
            # a run's rows as read, a chunk a block: checked chunk by chunk, not copied
            loadable = np.concatenate([artifacts.loadable_mask(
                self.conn, self.store.path, chunk) for chunk in artifact.chunks])
        else:
            loadable = artifacts.loadable_mask(self.conn, self.store.path, one_array(artifact))
        no_model = ~artifact.is_valid().to_numpy(zero_copy_only=False)
        if no_model.any():
            loadable |= no_model & rows["metrics"].is_valid().to_numpy(zero_copy_only=False)
        return loadable

    def _has_legacy_rows(self) -> bool:
        return self.conn.execute("SELECT 1 FROM tasks LIMIT 1").fetchone() is not None

    def _legacy_reusable(self, left: np.ndarray) -> pa.Table:
        """What tasks ``left`` find in a store's rows written before blocks:
        the latest trained task per identity, one grouped query per 5,000."""
        by_identity: dict[str, list[int]] = {}
        for index, name in zip(left.tolist(),
                               self.identities.identity.take(pa.array(left)).to_pylist()):
            by_identity.setdefault(name, []).append(index)
        names = list(by_identity)
        rows: list[tuple] = []
        for start in range(0, len(names), 5000):  # SQLite takes 32766 parameters
            chunk = names[start:start + 5000]
            rows += self.conn.execute(
                "SELECT identity, MAX(run_id), artifact, size, metrics, duration_s FROM tasks "
                "WHERE status = 'ok' AND reused_from IS NULL AND error IS NULL AND identity IN "
                f"({','.join('?' * len(chunk))}) GROUP BY identity", chunk).fetchall()
        loadable = artifacts.loadable_artifacts(
            self.conn, self.store.path, {row[2] for row in rows if row[2] is not None})
        hits = [(index, *row[1:]) for row in rows
                if (row[2] in loadable if row[2] is not None else row[4] is not None)
                for index in by_identity[row[0]]]
        columns = list(zip(*hits)) if hits else [[]] * 6
        return pa.table({
            "task_index": pa.array(columns[0], pa.int64()),
            "reused_from": pa.array(columns[1], pa.int64()),
            "has_model": pa.array([artifact is not None for artifact in columns[2]], pa.bool_()),
            "by_reference": pa.repeat(pa.scalar(False), len(columns[0])),
            "artifact": pa.array(columns[2], pa.string()),
            "size": pa.array(columns[3], pa.int64()),
            "metrics": pa.array(columns[4], pa.string()),
            "duration_s": pa.array(columns[5], pa.float64())})

    def fill_reused(self, records: Any) -> int:
        """Fill in the results of the reused tasks (their models stay in the
        store, loaded when asked for); return how many."""
        reused = self._reused
        self._reused = None
        if reused is None:
            return 0
        ok = Status.OK.value
        indices = reused["task_index"].to_numpy()
        if len(indices) == records.size and (indices == np.arange(records.size)).all():
            # every task, in order (an unchanged re-run): whole columns at once
            records.status = [ok] * records.size
            records.reused_from = reused["reused_from"].to_pylist()
            records.metrics = reused["metrics"].to_pylist()
            in_store = reused["has_model"].to_numpy(zero_copy_only=False)
            records.model = np.where(in_store, IN_STORE, None).tolist()
            return reused.num_rows
        status, reused_from, metrics, model = (records.status, records.reused_from,
                                               records.metrics, records.model)
        for index, run, metric, artifact in zip(
                reused["task_index"].to_pylist(), reused["reused_from"].to_pylist(),
                reused["metrics"].to_pylist(), reused["has_model"].to_pylist()):
            status[index], reused_from[index], metrics[index] = ok, run, metric
            if artifact:  # this run's row names it: loaded from there
                model[index] = IN_STORE
        return reused.num_rows

    def _forget_models(self, indices: list[int]) -> None:
        """Called by the writer thread once these tasks' models are committed:
        the driver drops its copies (``run.models`` loads them from the store),
        so its memory does not grow with the number of models. Until then it
        keeps them, so a failed write still leaves every model in ``.run``."""
        model = self._records.model
        for index in indices:
            if model[index] is not None:
                model[index] = IN_STORE

    def task_finished(self, index: int) -> None:
        self._pending.append(index)

    def tasks_finished(self, indices: list[int]) -> None:
        self._pending.extend(indices)

    def flush(self, records: Any, force: bool = False) -> None:
        """Hand the finished tasks to the writer thread, at most once a second
        unless ``force`` (then wait until they are committed).

        A model not yet pickled (threads, serial, a large one) is pickled
        here: one that cannot be fails its own task (it could never be
        loaded). An error of the store itself (a full disk) is raised here as
        :class:`StoreError`; its transaction was rolled back whole, so no row
        is ever committed without its artifact.
        """
        self._records = records
        self._raise_write_error()
        now = time.monotonic()
        if self._pending and (force or now - self._last_commit >= COMMIT_EVERY_S):
            pending, self._pending = self._pending, []
            status_of, model_of = records.status, records.model
            statuses = [status_of[index] for index in pending]
            models = [model_of[index] for index in pending]
            ok = Status.OK.value
            if statuses.count(ok) == len(statuses) and set(map(type, models)) <= _READY:
                rows: Any = ()  # every model as a worker sent it (a million tasks' case)
            else:
                rows = range(len(models))
            for row in rows:
                model = models[row]
                if model is None or type(model) in _SENT and statuses[row] == ok:
                    continue
                if statuses[row] != ok:
                    models[row] = None
                    continue
                index = pending[row]
                try:
                    models[row] = Pickled(pickle_any(model))
                except Exception as exc:  # the task fails: its model could never be loaded
                    statuses[row] = status_of[index] = Status.FAILED.value
                    models[row] = model_of[index] = None
                    records.error[index] = (
                        f"the model could not be pickled into the store: {exc!r}")
            self._writer.put({
                "task_index": pending, "status": statuses, "model": models,
                "duration_s": records.duration_s[pending],
                "started_at": records.started_at[pending],
                **{name: [column[index] for index in pending] for name, column in (
                    ("attempts", records.attempts), ("worker", records.worker),
                    ("metrics", records.metrics), ("error", records.error))}})
            self._last_commit = now
        if force:
            self._writer.wait()
            self._raise_write_error()

    def _raise_write_error(self) -> None:
        if self._writer is not None and self._writer.error is not None:
            raise self._writer.error

    def finish(self, records: Any, status: str, run: Any) -> None:
        """Record unfinished tasks as cancelled and close the run's row."""
        for index, state in enumerate(records.status):
            if state == Status.CANCELLED:
                self._pending.append(index)
        self.flush(records, force=True)
        self._writer.close()
        summary = run.summary()  # after the flush: an unpicklable model failed its task
        try:
            self.conn.execute(
                "UPDATE runs SET finished_at=?, status=?, ok=?, failed=?, reused=?, wall_s=? "
                "WHERE run_id=?",
                (time.time(), status, summary.ok, summary.failed, summary.reused, run.wall_s,
                 self.run_id))
        except sqlite3.Error as exc:
            raise database.write_error(self.store.path, exc,
                                       "the run's end could not be recorded") from exc

    def abandon(self, records: Any = None) -> None:
        """After an error that ends the run (the store's own, or a backend's):
        commit what finished if the store still can, and mark the run
        ``failed`` (what was committed before stays usable)."""
        if self._writer is not None:
            if records is not None and self._writer.error is None:
                try:
                    self.flush(records, force=True)
                except Exception:  # the run is ending on an error already
                    pass
            self._writer.close()
            self._writer = None
        try:
            self.conn.execute("UPDATE runs SET finished_at=?, status='failed' WHERE run_id=?",
                              (time.time(), self.run_id))
        except sqlite3.Error:
            pass

