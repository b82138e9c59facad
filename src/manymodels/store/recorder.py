"""Writing one run into the store, from the driver, in batched transactions.

The scheduler tells the recorder each finished task; the recorder commits at
least once a second and at the end, so a driver killed at any moment loses at
most the last second of results, and never leaves a row that points at a
missing artifact (artifacts are written before the rows that name them, in the
same transaction or earlier).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

from ..execution import pickle_any
from . import database

COMMIT_EVERY_S = 1.0


def encode_key(parts: tuple) -> str:
    return json.dumps(list(parts), default=str)


def _encode_metrics(metrics: dict | None) -> str | None:
    return json.dumps(metrics, default=repr) if metrics else None


@dataclass
class ReusedTask:
    run_id: int
    artifact: str | None
    size: int | None
    metrics: dict | None
    duration_s: float | None


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
        self._last_commit = time.monotonic()

    def begin(self, reuse: bool) -> dict[int, ReusedTask]:
        """Create the run's row and record the tasks whose models are reused."""
        reused = self._find_reusable() if reuse else {}
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            cursor = conn.execute(
                "INSERT INTO runs(started_at, status, backend, workers, source, fit, tasks, "
                "key_columns, param_columns, code_detail) VALUES (?,?,?,?,?,?,?,?,?,?)",
                (time.time(), "running", self.backend, self.workers, self.source,
                 self.fit_name, len(self.plan.tasks), json.dumps(self.plan.key_columns),
                 json.dumps(self.plan.param_columns), json.dumps(self.code_detail)))
            self.run_id = cursor.lastrowid
            conn.executemany(
                "INSERT INTO tasks(run_id, task_index, key, identity, code_hash, params_hash, "
                "data_hash, shared_hash, status, attempts, duration_s, metrics, artifact, size, "
                "reused_from) VALUES (?,?,?,?,?,?,?,?,'ok',0,?,?,?,?,?)",
                [(self.run_id, index, encode_key(self.plan.key_rows[index]),
                  *self.identities[index], hit.duration_s, _encode_metrics(hit.metrics),
                  hit.artifact, hit.size, hit.run_id) for index, hit in reused.items()])
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        return reused

    def _find_reusable(self) -> dict[int, ReusedTask]:
        by_identity: dict[str, list[int]] = {}
        for index, parts in enumerate(self.identities):
            by_identity.setdefault(parts[0], []).append(index)
        found: dict[str, ReusedTask] = {}
        names = list(by_identity)
        for start in range(0, len(names), 500):
            chunk = names[start:start + 500]
            rows = self.conn.execute(
                "SELECT identity, run_id, artifact, size, metrics, duration_s FROM tasks "
                f"WHERE status = 'ok' AND identity IN ({','.join('?' * len(chunk))}) "
                "ORDER BY run_id", chunk).fetchall()
            for identity, run_id, artifact, size, metrics, duration in rows:
                if artifact is None and metrics is None:
                    continue
                found[identity] = ReusedTask(  # the latest run wins
                    run_id, artifact, size, json.loads(metrics) if metrics else None, duration)
        return {i: found[name] for name, indices in by_identity.items() if name in found
                for i in indices}

    def task_finished(self, index: int) -> None:
        self._pending.append(index)

    def flush(self, records: Any, force: bool = False) -> None:
        """Commit the finished tasks, at most once a second unless ``force``."""
        now = time.monotonic()
        if not self._pending or (not force and now - self._last_commit < COMMIT_EVERY_S):
            return
        rows = []
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            for index in self._pending:
                artifact = size = None
                error = records.error[index]
                model = records.model[index]
                if records.status[index] == "ok" and model is not None:
                    try:
                        artifact, size = database.write_artifact(
                            conn, self.store.path, pickle_any(model))
                    except Exception as exc:
                        error = f"the model could not be pickled into the store: {exc!r}"
                rows.append((
                    self.run_id, index, encode_key(self.plan.key_rows[index]),
                    *self.identities[index], records.status[index], records.attempts[index],
                    _nan_to_none(records.duration_s[index]),
                    _nan_to_none(records.started_at[index]), records.worker[index],
                    _encode_metrics(records.metrics[index]), error, artifact, size))
            conn.executemany(
                "INSERT OR REPLACE INTO tasks(run_id, task_index, key, identity, code_hash, "
                "params_hash, data_hash, shared_hash, status, attempts, duration_s, "
                "started_at, worker, metrics, error, artifact, size) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        self._pending.clear()
        self._last_commit = now

    def finish(self, records: Any, status: str, wall_s: float, summary: Any) -> None:
        """Record unfinished tasks as cancelled and close the run's row."""
        for index, state in enumerate(records.status):
            if state == "cancelled":
                self._pending.append(index)
        self.flush(records, force=True)
        self.conn.execute(
            "UPDATE runs SET finished_at=?, status=?, ok=?, failed=?, reused=?, wall_s=? "
            "WHERE run_id=?",
            (time.time(), status, summary.ok, summary.failed, summary.reused, wall_s,
             self.run_id))


def _nan_to_none(value: float) -> float | None:
    return None if value != value else value
