"""The store's writer thread: finished tasks committed off the driver's loop.

The driver's main loop feeds workers and reads their results; at a million
models, writing each one's row and artifact there was the whole cost of a run
with a store. So the recorder hands the writer, at least once a second, the
finished tasks as plain rows (the models already pickled, by the workers when
they are processes), and the writer commits each hand-over in one transaction
on its own SQLite connection: the small models in packs (one BLOB
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..engine.metriccolumns import metrics_texts
from ..engine.metricpacks import MetricsPack
from ..engine.modelfiles import ModelFile
from ..engine.partpacks import ModelPack, distinct_objects
from ..identity.hashing import TaskIdentities
from ..inputs.objectstores import shown
from . import artifacts, database, packs, taskblocks

#: Finished tasks as the recorder hands them over: columns by name, each a
#: list in the same order (``task_index``, ``status``, ``attempts``,
#: ``duration_s``, ``started_at``, ``worker``, ``metrics``, ``error``) and
#: ``model``: each task's model as :class:`manymodels.engine.messages.Pickled` bytes,
#: the :class:`~manymodels.engine.partpacks.ModelPack` a worker sent it in, the
#: :class:`~manymodels.engine.modelfiles.ModelFile` a worker wrote, or None.
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


class StoreWriter:
    """Commits the tasks of one run, in the order handed over, on a thread.

    ``keys`` and ``identities``: every task's encoded key and identity
    columns, made once for the run (the keys may be given as the function
    that makes them: a run whose every task is reused never does); a
    hand-over's rows take theirs by task index (see
    :func:`.taskblocks.task_columns`)."""

    def __init__(self, folder: Path, files: Path | str, run_id: int,
                 keys: pa.Array | Callable[[], pa.Array], identities: TaskIdentities,
                 on_committed: Callable[[list[ModelPack], list[int]], None] | None = None
                 ) -> None:
        #: the index's folder, and where the model files go (the same folder,
        #: or an object store's URI: :mod:`.remote`)
        self.folder, self.files, self.run_id = folder, files, run_id
        #: Told what a transaction committed: the packs whose every task it
        #: holds, and the task indices of its other rows with a model.
        self.on_committed = on_committed
        self._keys, self.identities = keys, identities
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
                conn = database.connect(self.folder)
        except Exception as exc:  # the store cannot even be opened again
            self.error = exc if isinstance(exc, database.StoreError) else database.write_error(
                self.files, exc, "the store's writer could not open it")
        while True:
            handover = self._queue.get()
            try:
                if handover is None:
                    return
                if self.error is None and conn is not None:
                    with WRITING:
                        whole, others = self._commit(conn, handover)
                    if self.on_committed is not None:
                        self.on_committed(whole, others)
            except BaseException as exc:
                if conn is not None:
                    with WRITING:
                        database.rollback_quietly(conn)
                if isinstance(exc, database.StoreError):  # (its folder gone: _commit)
                    self.error = exc
                    continue
                error = database.busy_or_write_error(  # (busy: another process's long gc)
                    self.files, exc,
                    f"{len(handover['task_index'])} finished task(s) could not be recorded")
                if conn is not None and self._run_deleted(conn):
                    error = database.StoreError(
                        f"run {self.run_id} was deleted from the store {shown(str(self.files))!r} "
                        "while it ran (Store.delete(..., force=True)): its finished tasks "
                        "cannot be recorded, and nothing of it is kept")
                error.__cause__ = exc
                self.error = error
            finally:
                self._queue.task_done()
                if handover is None and conn is not None:
                    with WRITING:
                        conn.close()

    def _run_deleted(self, conn: sqlite3.Connection) -> bool:
        """Whether the run's row is gone (a failed commit's cause, then)."""
        try:
            with WRITING:
                return conn.execute("SELECT 1 FROM runs WHERE run_id = ?",
                                    (self.run_id,)).fetchone() is None
        except sqlite3.Error:
            return False

    @property
    def keys(self) -> pa.Array:
        if callable(self._keys):
            self._keys = self._keys()
        return self._keys

    def _commit(self, conn: sqlite3.Connection, handover: Handover
                ) -> tuple[list[ModelPack], list[int]]:
        """Write a hand-over in one transaction; return what it committed:
        the packs all of whose tasks it holds, and the task indices of the
        other rows that have a model."""
        if self.files == self.folder:  # (a local store: its folder removed meanwhile?)
            database.refuse_gone(conn, self.folder)
        conn.execute("BEGIN IMMEDIATE")
        tasks = np.asarray(handover["task_index"], dtype=np.int64)  # once: 100,000 ints
        artifact, size, written, located, whole = self._write_models(conn, tasks,
                                                                     handover["model"])
        rows = pa.array(tasks)
        prefixes = self.identities.prefixes
        metric_packs: list[MetricsPack] = []
        taskblocks.insert(conn, self.run_id, taskblocks.table({
            **taskblocks.task_columns(self.keys, self.identities, rows),
            "status": handover["status"], "attempts": handover["attempts"],
            "duration_s": handover["duration_s"], "started_at": handover["started_at"],
            "worker": handover["worker"],
            "metrics": metrics_texts(handover["metrics"], tasks, metric_packs),
            "error": handover["error"], "artifact": artifact, "size": size, **located}),
            None if prefixes is None else prefixes[tasks], written)
        conn.execute("COMMIT")
        for pack in metric_packs:  # their text is in the store now
            pack.drop_texts()
        others = ~size.is_null().to_numpy(zero_copy_only=False)  # has a model
        for _, positions in whole:
            others[positions] = False
        return [pack for pack, _ in whole], tasks[others].tolist()

    def _write_models(self, conn: sqlite3.Connection, tasks: np.ndarray, models: list[Any]
                      ) -> tuple[pa.Array, pa.Array, np.ndarray, dict[str, pa.Array],
                                 list[tuple[ModelPack, np.ndarray]]]:
        """Write a hand-over's models (inside the caller's transaction); return
        each row's ``artifact`` (a large model's SHA-256; null where packed or
        no model) and ``size`` (null where no model) columns, the packs
        written (see :func:`.packs.write_packs`), the packed models'
        locators as their parts (see :data:`.packs.LOCATOR_COLUMNS`), and
        the packs workers sent whose every task is one of these rows, each
        with its rows (no other task's slot names such a pack).

        The packs workers sent (:class:`ModelPack`) are written whole, their
        bytes as they came; a small model pickled in the driver joins one more
        pack; a large one is an artifact of its own (see :mod:`.artifacts`),
        whose file its worker may have written (only its row is written here)."""
        # one pass in C over the rows: the few distinct objects they name (the
        # packs, shared by all the tasks of a part; None), each classified once
        count = len(models)
        first, which = distinct_objects(models)
        by_object = np.argsort(which, kind="stable")
        bounds = np.searchsorted(which[by_object], np.arange(len(first) + 1))
        sent: list[tuple[ModelPack, np.ndarray]] = []
        small_objects: list[int] = []  # models pickled in the driver, by object number
        small: list[bytes] = []
        large_objects: list[int] = []
        large: list[str] = []
        large_sizes: list[int] = []
        for number, row in enumerate(first.tolist()):
            model = models[row]
            if model is None:
                continue
            if type(model) is ModelPack:
                sent.append((model, by_object[bounds[number]:bounds[number + 1]]))
            elif type(model) is ModelFile:  # its worker wrote it: its row alone
                large_objects.append(number)
                large.append(artifacts.record_model_file(conn, self.files, model))
                large_sizes.append(model.size)
            elif len(model.data) < artifacts.SMALL_ARTIFACT:
                small_objects.append(number)
                small.append(model.data)
            else:
                large_objects.append(number)
                large.append(artifacts.write_artifact(conn, self.files, model.data,
                                                      model.sha256)[0])
                large_sizes.append(len(model.data))
        at = np.full(count, -1, dtype=np.int64)  # each row's place in the locators
        sizes = np.zeros(count, dtype=np.int64)
        located = 0
        tasks = np.asarray(tasks, dtype=np.int64)
        whole: list[tuple[ModelPack, np.ndarray]] = []
        for pack, rows in sent:
            order = np.argsort(pack.indices, kind="stable")
            wanted = tasks[rows]
            within = order[np.minimum(np.searchsorted(pack.indices, wanted, sorter=order),
                                      len(order) - 1)]
            if not (pack.indices[within] == wanted).all():
                raise RuntimeError("a task's model is not in the pack its outcome named")
            at[rows] = located + within
            sizes[rows] = pack.sizes[within]
            located += len(pack)
            if len(rows) == len(pack) and (np.bincount(within, minlength=len(pack)) == 1).all():
                whole.append((pack, rows))  # each of the pack's tasks once
        packed = [pack for pack, _ in sent]
        # a Pickled model: every row that names it gets its place
        object_at = np.full(len(first), -1, dtype=np.int64)
        object_size = np.zeros(len(first), dtype=np.int64)
        if small:  # one more pack, of the models pickled here
            packed.append(ModelPack().seal(tasks[first[small_objects]].tolist(), small))
            object_at[small_objects] = located + np.arange(len(small))
            object_size[small_objects] = packed[-1].sizes
            located += len(small)
        packed_count = located  # places below are packed models, from here large ones
        if large:
            object_at[large_objects] = located + np.arange(len(large))
            object_size[large_objects] = large_sizes
        if small or large:
            plain = object_at[which] >= 0
            at[plain] = object_at[which][plain]
            sizes[plain] = object_size[which][plain]
        written = np.zeros((0, 2), dtype=np.int64)
        missing = at < 0
        in_pack = ~missing & (at < packed_count)
        located_columns: dict[str, pa.Array] = {}
        if packed:
            # each pack's bytes as they came, a row (or more) of their own: not
            # joined first (a second copy of every model, in fresh pages)
            pieces = [packs.write_packs(conn, pack.data, pack.part_sizes(), pack.template)
                      for pack in packed]
            pack_of, offsets, written = (np.concatenate(column) for column in zip(*pieces))
            digests = np.frombuffer(b"".join(pack.digests for pack in packed),
                                    dtype=np.uint8).reshape(-1, 32)
            located_columns = packs.locator_columns(digests, pack_of, offsets, at, in_pack)
        is_large = ~missing & ~in_pack
        artifact = pa.array(large, pa.string()).take(
            pa.array(at - packed_count, mask=~is_large)) if large else pa.nulls(count, pa.string())
        return (artifact, pa.array(sizes, pa.int64(), mask=missing), written, located_columns,
                whole)
