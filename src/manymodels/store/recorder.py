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
import time
from typing import Any

from ..dataplane import pickle_any
from ..keys import encode_key
from ..messages import Pickled, Status
from . import database
from .registry import IN_STORE
from .writer import StoreWriter

COMMIT_EVERY_S = 1.0
#: Identities looked up one by one to find the runs a re-run reads whole.
_SAMPLE = 200
_REUSED_COLUMNS = "identity, run_id, artifact, size, metrics, duration_s"


#: A trained task whose model a new task with the same identity reuses: a
#: plain tuple of :data:`_REUSED_COLUMNS` as SQLite returns it (a re-run
#: makes a million of them), its metrics as stored (JSON, decoded when the
#: results are read).
ReusedTask = tuple
_RUN, _ARTIFACT, _SIZE, _METRICS, _DURATION = 1, 2, 3, 4, 5


class RunRecorder:
    """Records one run: its row in ``runs``, then its tasks as they finish."""

    def __init__(self, store: Any, plan: Any, identities: list[tuple], code_detail: dict,
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
        self._reused: dict[int, ReusedTask] = {}
        self._last_commit = time.monotonic()
        self._writer: StoreWriter | None = None
        self._records: Any = None

    def begin(self, reuse: bool) -> dict[int, ReusedTask]:
        """Create the run's row and record the tasks whose models are reused."""
        reused = self._reused = self._find_reusable() if reuse else {}
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            self.run_id = database.insert_run(
                conn, backend=self.backend, workers=self.workers, source=self.source,
                fit=self.fit_name, tasks=len(self.plan.tasks),
                key_columns=self.plan.key_columns, param_columns=self.plan.param_columns,
                code_detail=self.code_detail)
            conn.executemany(
                "INSERT INTO tasks(run_id, task_index, key, identity, code_hash, params_hash, "
                "data_hash, shared_hash, status, attempts, duration_s, metrics, artifact, size, "
                "reused_from) VALUES (?,?,?,?,?,?,?,?,'ok',0,?,?,?,?,?)",
                [(self.run_id, index, encode_key(self.plan.key_rows[index]),
                  *self.identities[index], hit[_DURATION], hit[_METRICS],
                  hit[_ARTIFACT], hit[_SIZE], hit[_RUN]) for index, hit in reused.items()])
            conn.execute("COMMIT")
        except BaseException as exc:
            database.rollback_quietly(conn)
            if isinstance(exc, sqlite3.Error):
                raise database.write_error(self.store.path, exc, "the run could not start") \
                    from exc
            raise
        self._writer = StoreWriter(self.store.path, self.run_id, self.plan.key_rows,
                                   self.identities, on_committed=self._forget_models)
        return reused

    def _find_reusable(self) -> dict[int, ReusedTask]:
        """The latest task that trained each identity, if its model can still
        be loaded: its artifact is in the index (and its file is there,
        whole), and no load has found it corrupt.

        A re-run mostly finds its identities in the one or two runs that
        trained them. So a sample of identities says where to start, and the
        runs since then that trained tasks are read whole, each in one scan
        of its rows, a later run's task winning; what that leaves (new tasks,
        tasks last trained before, a corrupt artifact) is looked up per
        identity, one grouped query per 5,000 identities."""
        by_identity: dict[str, list[int]] = {}
        for index, parts in enumerate(self.identities):
            by_identity.setdefault(parts[0], []).append(index)
        names = list(by_identity)
        sample = names[::max(1, len(names) // _SAMPLE)]
        candidates: dict[str, ReusedTask] = {}
        for run_id in self._runs_to_read(min((hit[_RUN] for hit in self._latest_trained(sample)),
                                             default=None), len(names)):
            candidates.update({  # in run order: a later run's task wins
                hit[0]: hit for hit in self.conn.execute(
                    f"SELECT {_REUSED_COLUMNS} FROM tasks WHERE run_id = ? AND status = 'ok' "
                    "AND reused_from IS NULL AND error IS NULL", (run_id,)).fetchall()
                if hit[0] in by_identity})
        found = self._loadable(candidates)
        rest = [name for name in names if name not in found]
        if rest:
            found.update(self._loadable({hit[0]: hit for hit in self._latest_trained(rest)}))
        return {i: hit for name, hit in found.items() for i in by_identity[name]}

    def _runs_to_read(self, first: int | None, tasks: int) -> list[int]:
        """The runs from ``first`` on that may have trained tasks, oldest first:
        every one of them, so that each identity found there is found in the
        latest run that trained it, back to (not including) the latest run
        too large to read for a re-run of ``tasks`` tasks."""
        if first is None:
            return []
        runs: list[int] = []
        for run_id, size, ok, reused in self.conn.execute(
                "SELECT run_id, tasks, ok, reused FROM runs WHERE run_id >= ? "
                "AND coalesce(backend, '') NOT LIKE 'mm.linear%' ORDER BY run_id DESC",
                (first,)):
            if ok is not None and ok - (reused or 0) <= 0:
                continue  # it trained nothing
            if (size or 0) > 4 * tasks + 10_000:
                break  # cheaper looked up per identity than read whole
            runs.append(run_id)
        return runs[::-1]

    def _latest_trained(self, identities: list[str]) -> list[ReusedTask]:
        """The latest finished task that trained each of ``identities``."""
        rows: list[ReusedTask] = []
        for start in range(0, len(identities), 5000):  # SQLite takes 32766 parameters
            chunk = identities[start:start + 5000]
            rows += self.conn.execute(
                "SELECT identity, MAX(run_id), artifact, size, metrics, duration_s FROM tasks "
                "WHERE status = 'ok' AND reused_from IS NULL AND error IS NULL AND identity IN "
                f"({','.join('?' * len(chunk))}) GROUP BY identity", chunk).fetchall()
        return rows

    def _loadable(self, candidates: dict[str, ReusedTask]) -> dict[str, ReusedTask]:
        """Those of ``candidates`` that left a model or metrics, and whose
        artifact can still be loaded."""
        loadable = database.loadable_artifacts(
            self.conn, self.store.path,
            {hit[_ARTIFACT] for hit in candidates.values() if hit[_ARTIFACT] is not None})
        return {name: hit for name, hit in candidates.items()
                if hit[_ARTIFACT] in loadable
                or (hit[_ARTIFACT] is None and hit[_METRICS] is not None)}

    def fill_reused(self, records: Any) -> int:
        """Fill in the results of the reused tasks (their models stay in the
        store, loaded when asked for); return how many."""
        status, reused_from, metrics, model = (records.status, records.reused_from,
                                               records.metrics, records.model)
        ok = Status.OK.value
        for index, hit in self._reused.items():
            status[index], reused_from[index], metrics[index] = ok, hit[_RUN], hit[_METRICS]
            if hit[_ARTIFACT] is not None:  # this run's row names it: loaded from there
                model[index] = IN_STORE
        count = len(self._reused)
        self._reused = {}
        return count

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
            rows = []
            for index in self._pending:
                status, model = records.status[index], records.model[index]
                if status != Status.OK:
                    model = None
                elif model is not None and not isinstance(model, Pickled):
                    try:
                        model = Pickled(pickle_any(model))
                    except Exception as exc:
                        status = records.status[index] = Status.FAILED.value
                        records.model[index] = model = None
                        records.error[index] = (
                            f"the model could not be pickled into the store: {exc!r}")
                rows.append((index, status, records.attempts[index], records.duration_s[index],
                             records.started_at[index], records.worker[index],
                             records.metrics[index], records.error[index], model))
            self._writer.put(rows)
            self._pending = []
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

