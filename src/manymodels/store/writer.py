"""The store's writer thread: finished tasks committed off the driver's loop.

The driver's main loop feeds workers and reads their results; at a million
models, writing each one's row and artifact there was the whole cost of a run
with a store. So the recorder hands the writer, at least once a second, the
finished tasks as plain rows (the models already pickled, by the workers when
they are processes), and the writer commits each hand-over in one transaction
on its own SQLite connection: the small models joined into packs (one BLOB
row each, see :mod:`.packs`), the tasks' rows as one columnar block (one
row of ``task_blocks``, see :mod:`.taskblocks`). A
driver killed at any moment still loses at most the last second; a failed
write (a full disk) is rolled back whole and kept as a :class:`StoreError`
that the recorder raises on the driver's next hand-over.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pyarrow as pa

from ..execution import metrics_json
from ..hashing import TaskIdentities
from . import artifacts, database, packs, taskblocks

#: Finished tasks as the recorder hands them over: columns by name, each a
#: list in the same order (``task_index``, ``status``, ``attempts``,
#: ``duration_s``, ``started_at``, ``worker``, ``metrics``, ``error``) and
#: ``model``: each task's model as :class:`manymodels.messages.Pickled` bytes,
#: or None.
Handover = dict


#: Held while the writer talks to SQLite. A fork waits for it (a process
#: backend forks replacement workers mid-run): a child must not inherit
#: SQLite's global mutexes locked by the writer thread, or a ``fit`` that
#: opens a database of its own would wait on them for ever.
WRITING = threading.Lock()


def _release_after_fork() -> None:
    if WRITING.locked():
        WRITING.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=WRITING.acquire, after_in_parent=_release_after_fork,
                        after_in_child=_release_after_fork)


def encode_all_metrics(all_metrics: Sequence[dict | str | None]) -> list[str | None]:
    """Metrics as the store keeps them: JSON text (:func:`~manymodels.execution.metrics_json`;
    worker processes send theirs encoded already)."""
    return [metrics if type(metrics) is str else metrics_json(metrics)
            for metrics in all_metrics]


class StoreWriter:
    """Commits the tasks of one run, in the order handed over, on a thread.

    ``keys`` and ``identities``: every task's encoded key and identity
    columns, made once for the run; a hand-over's rows take theirs by task
    index (see :func:`.taskblocks.task_columns`)."""

    def __init__(self, root: Path, run_id: int, keys: pa.Array, identities: TaskIdentities,
                 on_committed: Callable[[list[int]], None] | None = None) -> None:
        self.root, self.run_id = root, run_id
        #: Told the task indices whose models a transaction committed.
        self.on_committed = on_committed
        self.keys, self.identities = keys, identities
        #: The first write that failed, as the error the driver raises.
        self.error: database.StoreError | None = None
        # Two hand-overs at most wait: when the writer falls behind, the driver
        # waits for it, so a killed driver still loses only the last second or two.
        self._queue: queue.Queue[Handover | None] = queue.Queue(maxsize=2)
        self._thread = threading.Thread(target=self._loop, name="manymodels-store-writer",
                                        daemon=True)
        self._thread.start()

    def put(self, handover: Handover) -> None:
        self._queue.put(handover)

    def wait(self) -> None:
        """Until every task handed over is committed (or the write failed)."""
        self._queue.join()

    def close(self) -> None:
        """End the thread (a second call, after an error, does nothing)."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def _loop(self) -> None:
        conn = None
        try:
            with WRITING:
                conn = database.connect(self.root)
        except Exception as exc:  # the store cannot even be opened again
            self.error = exc if isinstance(exc, database.StoreError) else database.write_error(
                self.root, exc, "the store's writer could not open it")
        while True:
            handover = self._queue.get()
            try:
                if handover is None:
                    return
                if self.error is None and conn is not None:
                    with WRITING:
                        self._commit(conn, handover)
                    if self.on_committed is not None:
                        self.on_committed([index for index, model in zip(
                            handover["task_index"], handover["model"]) if model is not None])
            except BaseException as exc:
                if conn is not None:
                    with WRITING:
                        database.rollback_quietly(conn)
                error = database.write_error(
                    self.root, exc,
                    f"{len(handover['task_index'])} finished task(s) could not be recorded")
                error.__cause__ = exc
                self.error = error
            finally:
                self._queue.task_done()
                if handover is None and conn is not None:
                    with WRITING:
                        conn.close()

    def _commit(self, conn: sqlite3.Connection, handover: Handover) -> None:
        conn.execute("BEGIN IMMEDIATE")
        models = handover["model"]
        stored_as: list[str | None] = [None] * len(models)
        sizes: list[int | None] = [None] * len(models)
        small_rows, small_digests, small_data = [], [], []
        for row, model in enumerate(models):
            if model is not None:
                data = model.data
                artifact = model.sha256 or artifacts.sha256(data)
                size = sizes[row] = len(data)
                if size >= artifacts.SMALL_ARTIFACT:
                    artifacts.write_artifact(conn, self.root, data, artifact)
                    stored_as[row] = artifact
                else:  # packed below; the row learns its locator then
                    small_rows.append(row)
                    small_digests.append(artifact)
                    small_data.append(data)
        if small_rows:
            for row, locator in zip(small_rows, packs.write_packs(conn, small_digests,
                                                                  small_data)):
                stored_as[row] = locator
        rows = pa.array(handover["task_index"], pa.int64())
        prefixes = self.identities.prefixes
        taskblocks.insert(conn, self.run_id, taskblocks.table({
            **taskblocks.task_columns(self.keys, self.identities, rows),
            "status": handover["status"], "attempts": handover["attempts"],
            "duration_s": handover["duration_s"], "started_at": handover["started_at"],
            "worker": handover["worker"], "metrics": encode_all_metrics(handover["metrics"]),
            "error": handover["error"], "artifact": stored_as, "size": sizes}),
            None if prefixes is None else prefixes[rows.to_numpy()])
        conn.execute("COMMIT")
