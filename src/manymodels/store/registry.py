"""The model registry: what a store holds, read back as DataFrames and models."""

from __future__ import annotations

import functools
import json
import pickle
from collections.abc import Hashable
from pathlib import Path, PurePath
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..engine.messages import FAILURE_STATUSES, Status
from ..inputs.keys import (
    decode_key,
    decode_keys,
    key_column,
    key_parts,
    latest_per_group,
)
from . import artifacts, database, drivers, taskblocks
from .deletion import delete_run
from .keylookups import KeyLookups, find_row
from .lazymodels import ModelMap, StoredModel
from .opening import OpenedIndex
from .wholefiles import write_whole

_TASK_COLUMNS = ["status", "attempts", "duration_s", "started_at", "worker", "reused_from",
                 "error", "artifact", "size"]
#: The columns a store's results add beside a run's keys and metrics: these,
#: and ``resumed`` and ``resumed_from``, which the public ``mm.Store`` adds
#: from the run's checkpoint record. What a reader tells the store's own
#: columns from the metrics by, not a metric's name.
STORE_RESULT_COLUMNS = frozenset({"run_id", *_TASK_COLUMNS, "resumed", "resumed_from"})

#: What a lookup by key reads: the model, and why it was or was not reused.
_LOOKUP_COLUMNS = ["key", "status", "artifact", "reused_from", "code_hash", "params_hash",
                   "data_hash", "shared_hash"]


def run_number(run: Any) -> int:
    """A run id as given: a whole number (a NumPy one too), never a bool, a
    float or text, which ``int()`` would have read as another run."""
    import numbers

    if isinstance(run, bool) or not isinstance(run, numbers.Integral):
        raise TypeError(f"run must be a run id (a whole number, see Store.runs()), got {run!r}")
    if not -2**63 <= run < 2**63:
        raise ValueError(f"store has no run {run!r}")
    return int(run)


class Store(OpenedIndex):
    """A crash-safe registry of runs and models in one directory, or on an
    object store.

    ``mm.train(..., store="models/")`` records every task there; a re-run with
    the same store reuses each finished model whose identity (code, parameters,
    data) is unchanged and trains only what changed. A store this user may
    only read (or ``read_only=True``) opens for reading. A path where there
    is no store makes nothing: reading it raises :class:`StoreError` naming
    the path, and a run given it makes the store (``read_only=False``: made
    at once).

    ``store="s3://bucket/models"`` (any location pyarrow's filesystems open)
    keeps the model files there, uploaded by the workers, and the index in a
    local copy that is published there whole (:mod:`.remote`).
    """

    def __init__(self, path: str | Path, read_only: bool | None = None) -> None:
        super().__init__(path, read_only)
        self._lookups = KeyLookups(kept=2)  # run_id -> its keys, sorted
        #: run_id -> (its blocks when counted, [ok, failed, reused]) of the runs
        #: unfinished when :meth:`runs` last read them (the others pruned there)
        self._counts: dict[int, tuple[tuple, list[int]]] = {}

    # -- runs ------------------------------------------------------------------

    def runs(self) -> pd.DataFrame:
        """One row per run: id, times, status, backend, counts, wall time.

        ``started_at`` and ``finished_at`` are timezone-aware UTC timestamps
        (``finished_at`` NaT while a run goes on, or when its driver died):
        the instants ``manymodels runs`` shows in local time, with its offset.
        ``.dt.tz_convert(zone)`` gives them in another zone,
        ``.dt.tz_localize(None)`` as naive UTC times.
        """
        # (not pandas' read_sql_query, which made the store's error that it was
        # closed by another thread meanwhile a pandas DatabaseError)
        cursor = self._conn.execute(
            "SELECT run_id, started_at, finished_at, status, backend, workers, source, fit, "
            "tasks, ok, failed, reused, wall_s FROM runs ORDER BY run_id")
        frame = pd.DataFrame.from_records(cursor.fetchall(), coerce_float=True, columns=[
            column[0] for column in cursor.description])
        for column in ("started_at", "finished_at"):  # kept as epoch seconds
            frame[column] = pd.to_datetime(frame[column].astype(float), unit="s",
                                           utc=True).dt.round("us")
        counts = ["ok", "failed", "reused"]
        unfinished = set()
        for row in frame.index[frame["ok"].isna()]:  # running, or its driver died
            run_id = int(frame.at[row, "run_id"])
            frame.loc[row, counts] = self._committed_counts(run_id)
            unfinished.add(run_id)
        for run_id in list(self._counts):  # ended since, or deleted: forgotten (a
            if run_id not in unfinished:  # long-lived server's store loses many runs)
                self._counts.pop(run_id, None)
        # whole numbers, whatever a running run's NULLs made of the columns
        # (floats beside ended runs, objects alone: 58.0 in csv, text in a table)
        if frame[counts].notna().all().all():
            frame[counts] = frame[counts].astype("int64")
        return frame

    def _committed_counts(self, run_id: int) -> list[int]:
        """A run's tasks committed so far: ok, failed, reused (read again only
        once it has new blocks)."""
        version = (run_id, *self._conn.execute(
            "SELECT count(*), max(block_id) FROM task_blocks WHERE run_id = ?",
            (run_id,)).fetchone())
        counts = self._counts.get(run_id)
        if counts is None or counts[0] != version:
            tasks = taskblocks.read_run(self._conn, run_id, ["status", "reused_from"],
                                        ordered=False)
            status = tasks["status"].to_numpy(zero_copy_only=False)
            failed = np.isin(status, [s.value for s in FAILURE_STATUSES])
            counts = self._counts[run_id] = (version, [
                int((status == "ok").sum()), int(failed.sum()),
                int(tasks["reused_from"].is_valid().to_numpy(zero_copy_only=False).sum())])
        return counts[1]

    def _run_row(self, run: int | None, ended: bool = False) -> tuple:
        """``run``'s id, key columns and grid columns; ``run`` None: the latest
        run's, or with ``ended`` the latest that has ended (what the readers
        of models take: a run still being written holds some groups' models
        and not yet others', as ``serve`` leaves it out)."""
        if run is not None:
            run = run_number(run)
        if run is None:
            row = self._conn.execute(
                "SELECT run_id, key_columns, param_columns FROM runs "
                + ("WHERE status != 'running' " if ended else "")
                + "ORDER BY run_id DESC LIMIT 1").fetchone()
            if row is None and ended and self._conn.execute(
                    "SELECT 1 FROM runs LIMIT 1").fetchone() is not None:
                raise ValueError(f"store {str(self)!r} holds no run that has ended yet: "
                                 "its runs are still being written (give run= to read one)")
            if row is None:
                raise ValueError(f"store {str(self)!r} holds no runs yet")
        else:
            row = self._conn.execute(
                "SELECT run_id, key_columns, param_columns FROM runs WHERE run_id = ?",
                (run,)).fetchone()
            if row is None:
                raise ValueError(f"store {str(self)!r} has no run {run!r}")
        return row[0], json.loads(row[1]), json.loads(row[2])

    def results(self, run: int | None = None) -> pd.DataFrame:
        """The results of a run (default: the latest), like ``Run.results``."""
        return self._results_and_floats(run)[0]

    def _results_and_floats(self, run: int | None) -> tuple[pd.DataFrame, list[str]]:
        """:meth:`results`, and its metric columns of floats (``1.0`` in any
        row): pandas holds an integer metric beside a failed task's NaN as
        floats too, which ``manymodels show`` prints as integers."""
        run_id, key_columns, _ = self._run_row(run)
        from ..engine.metriccolumns import metric_column_names, text_columns
        from ..evaluation.splitters import WINDOWS

        tasks = taskblocks.read_run(self._conn, run_id, ["key", "metrics", *_TASK_COLUMNS])
        keys = decode_keys(tasks["key"], len(key_columns))
        frame = pd.DataFrame(dict(zip(key_columns, map(key_column, keys))))
        for column in _TASK_COLUMNS:
            frame[column] = tasks[column].to_pylist()
        metrics = {name: values for name, values in text_columns(tasks["metrics"]).items()
                   if name != WINDOWS}  # per-window scores: Store.evaluation
        # run_id is inserted below, resumed and resumed_from by the public mm.Store
        names = metric_column_names(metrics, {*STORE_RESULT_COLUMNS, *frame.columns})
        for name, values in metrics.items():
            frame[names[name]] = values
        frame.insert(len(key_columns), "run_id", run_id)
        return frame, [names[name] for name, values in metrics.items()
                       if any(type(value) is float for value in values)]

    def _key_frame(self, run: int | None = None) -> pd.DataFrame:
        """The key columns of a run's tasks (what naming one task needs: the
        whole results frame of a million tasks is several seconds)."""
        run_id, key_columns, _ = self._run_row(run)
        if self._linear_run(run_id) is not None:
            return self.results(run_id)[key_columns]
        tasks = taskblocks.read_run(self._conn, run_id, ["key"])
        keys = decode_keys(tasks["key"], len(key_columns))
        return pd.DataFrame(dict(zip(key_columns, map(key_column, keys))), columns=key_columns)

    def evaluation(self, run: int | None = None) -> pd.DataFrame:
        """The per-window scores of a run (default: the latest) trained with
        ``evaluate=``, like ``Run.evaluation``."""
        from ..evaluation.tables import window_frame

        run_id, key_columns, _ = self._run_row(run)
        tasks = taskblocks.read_run(self._conn, run_id, ["key", "metrics"])
        return window_frame(key_columns, [decode_key(k) for k in tasks["key"].to_pylist()],
                            tasks["metrics"].to_pylist())

    def forecasts(self, run: int | None = None) -> pd.DataFrame:
        """Each backtest window's forecasts row by row, of a run (default: the
        latest), like ``Run.forecasts``: key columns, window, cutoff, time,
        actual and forecast."""
        from ..evaluation.tables import forecast_frame

        run_id, key_columns, _ = self._run_row(run)
        tasks = taskblocks.read_run(self._conn, run_id, ["key", "metrics"])
        return forecast_frame(key_columns, [decode_key(k) for k in tasks["key"].to_pylist()],
                              tasks["metrics"].to_pylist())

    def _forecast_steps(self, run_id: int, by: list[str]) -> dict[str, str]:
        """Each group's time step its backtest kept (see
        :func:`~manymodels.evaluation.tables.forecast_steps`)."""
        from ..evaluation.tables import forecast_steps

        _, key_columns, _ = self._run_row(run_id)
        tasks = taskblocks.read_run(self._conn, run_id, ["key", "metrics"])
        return forecast_steps(key_columns, [decode_key(k) for k in tasks["key"].to_pylist()],
                              tasks["metrics"].to_pylist(), by)

    def _task_row(self, key: Hashable, run: int | None, columns: list[str],
                  ended: bool = False) -> dict[str, Any]:
        """The task of ``key`` in ``run`` (``ended``: as :meth:`_run_row`):
        ``columns`` (of :data:`_LOOKUP_COLUMNS`) by name. The run's keys are
        read and sorted once, kept for the two runs last asked about until
        they gain a block: a loop over a million keys is a binary search
        each, not a read of the run each."""
        run_id, key_columns, _ = self._run_row(run, ended)
        version = (run_id, *self._conn.execute(
            "SELECT count(*), max(block_id) FROM task_blocks WHERE run_id = ?",
            (run_id,)).fetchone())
        lookup = self._lookups.get(run_id, version, lambda: taskblocks.read_run(
            self._conn, run_id, _LOOKUP_COLUMNS))
        parts = key_parts(key)
        if len(key_columns) == 1 and len(parts) != 1:  # one column whose values are tuples
            parts = (key,)
        row = find_row(lookup, parts)
        if row is None and len(key_columns) == 1 and isinstance(key, tuple) and len(key) == 1:
            # a one-column key whose value is a tuple of one, (3,): read first
            # as the value 3, given as a tuple; else as the value (3,)
            row = find_row(lookup, (key,))
        if row is None:
            raise KeyError(f"run {run_id} has no task with key {key!r}")
        return {name: lookup.tasks[name][row].as_py() for name in columns}

    def _run_artifacts(self, run_id: int) -> dict[int, str]:
        """Task index -> artifact of each model a run recorded."""
        tasks = _with_models(taskblocks.read_run(self._conn, run_id, ["status", "artifact"]))
        return dict(zip(tasks["task_index"].to_pylist(), tasks["artifact"].to_pylist()))

    def load(self, key: Hashable, run: int | None = None) -> Any:
        """The model of ``key`` in ``run`` (default: the latest run that has ended)."""
        row = self._task_row(key, run, ["status", "artifact"], ended=True)
        status, artifact = row["status"], row["artifact"]
        if status != Status.OK or artifact is None:
            raise KeyError(f"the task with key {key!r} has no model (status {status})")
        return StoredModel(self, artifact, f"key {key!r}").load()

    def models(self, run: int | None = None) -> ModelMap:
        """A lazy mapping key -> model of a run (default: the latest that has ended)."""
        run_id, key_columns, _ = self._run_row(run, ended=True)
        items: dict[Hashable, Any] = {}
        tasks = _with_models(taskblocks.read_run(self._conn, run_id,
                                                 ["key", "status", "artifact"]))
        for key, artifact in zip(tasks["key"].to_pylist(), tasks["artifact"].to_pylist()):
            parts = decode_key(key)
            item_key = parts[0] if len(parts) == 1 else parts
            items[item_key] = StoredModel(self, artifact, f"key {item_key!r}")
        return ModelMap(items)

    def _linear_run(self, run_id: int) -> Any:
        """The record of ``run_id`` when it is a run of another kind than one
        task per model (``mm.linear``'s single artifact), else None. The store
        knows no such kind: the public ``mm.Store`` (:mod:`manymodels.run.store`)
        adds them."""
        return None

    # -- using the models --------------------------------------------------------

    def attach(self, run: int, name: str, obj: Any) -> None:
        """Keep a run-level object (a fallback model, a configuration) with a run."""
        self._require_writable("attach")
        run_id, _, _ = self._run_row(run)
        data = pickle.dumps(obj, protocol=5)  # (before the lock: another driver's commits wait)
        with database.write_transaction(self._conn, self.root,
                                        f"attaching {name!r} to run {run_id}"):
            self._run_now(run_id)
            digest, _ = artifacts.write_artifact(self._conn, self.root, data)
            self._conn.execute("INSERT OR REPLACE INTO attachments VALUES (?, ?, ?)",
                               (run_id, name, digest))
        self._publish()

    def attached(self, name: str, run: int | None = None, default: Any = None) -> Any:
        """An object kept with :meth:`attach`, or ``default``."""
        run_id, _, _ = self._run_row(run)
        row = self._conn.execute("SELECT artifact FROM attachments WHERE run_id=? AND name=?",
                                 (run_id, name)).fetchone()
        if row is None:
            return default
        return StoredModel(self, row[0], f"attachment {name!r} of run {run_id}").load()

    def _model_artifacts(self, run: int | None) -> dict[str, str]:
        """Encoded key -> artifact of the models that ``predict`` may use: those
        of ``run``, or (``run`` None) each group's latest model in any run with
        the latest run's key columns (its key typed otherwise in a later run
        included): a re-run in which a group failed leaves that group its
        earlier model."""
        layers = []
        for run_id in self._model_runs(run):  # the latest run's last
            tasks = _with_models(taskblocks.read_run(self._conn, run_id,
                                                     ["key", "status", "artifact"]))
            layers.append(dict(zip(tasks["key"].to_pylist(), tasks["artifact"].to_pylist())))
        return layers[0] if len(layers) == 1 else latest_per_group(layers)

    def _model_runs(self, run: int | None) -> list[int]:
        """The runs whose models :meth:`_model_artifacts` reads, oldest first."""
        if run is not None:
            return [self._run_row(run)[0]]
        _, key_columns, _ = self._run_row(None, ended=True)
        return [run_id for (run_id,) in self._conn.execute(
            "SELECT run_id FROM runs WHERE key_columns = ? AND status != 'running' "
            "ORDER BY run_id", (json.dumps(key_columns),))]

    def _keys_without_model(self, run: int | None) -> dict[str, str]:
        """Encoded key -> status of the tasks of those runs that kept no
        model (failed, crashed..., or ended ok with metrics alone)."""
        statuses: dict[str, str] = {}
        for run_id in self._model_runs(run):
            tasks = taskblocks.read_run(self._conn, run_id, ["key", "status", "artifact"])
            tasks = tasks.filter(pc.invert(pc.and_(pc.equal(tasks["status"], Status.OK.value),
                                                    pc.is_valid(tasks["artifact"]))))
            statuses.update(zip(tasks["key"].to_pylist(), tasks["status"].to_pylist()))
        return statuses

    def _selection(self, run: int | None) -> dict | None:
        """The winners recorded by ``train(select=...)`` in ``run``, or None;
        ``run`` None: the latest run's, with each group's latest winner of
        the earlier runs that selected by the same columns (a re-run in
        which all of a group's candidates failed leaves it its winner, as
        :meth:`_model_artifacts` leaves a group its model)."""
        run_id, _, _ = self._run_row(run, ended=True)
        latest = self.attached("selection", run_id, default=None)
        if run is not None or latest is None:
            return latest
        layers = []
        for (earlier,) in self._conn.execute(
                "SELECT run_id FROM attachments WHERE name = 'selection' AND run_id < ? "
                "ORDER BY run_id", (run_id,)).fetchall():
            chosen = self.attached("selection", earlier, default=None)
            if chosen is not None and chosen.get("by") == latest.get("by"):
                layers.append(chosen["artifacts"])
        return {**latest, "artifacts": latest_per_group([*layers, latest["artifacts"]])}

    def _latest_attached_digest(self, name: str, run: int | None) -> str | None:
        """The artifact of the attachment ``name`` of ``run``, or (``run`` None)
        of the latest run with the latest run's key columns that has one."""
        if run is None:
            _, key_columns, _ = self._run_row(None, ended=True)
            row = self._conn.execute(
                "SELECT a.artifact FROM attachments a JOIN runs r ON r.run_id = a.run_id "
                "WHERE a.name = ? AND r.key_columns = ? AND r.status != 'running' "
                "ORDER BY a.run_id DESC LIMIT 1",
                (name, json.dumps(key_columns))).fetchone()
        else:
            run_id, _, _ = self._run_row(run)
            row = self._conn.execute(
                "SELECT artifact FROM attachments WHERE run_id = ? AND name = ?",
                (run_id, name)).fetchone()
        return None if row is None else row[0]

    def export(self, path: str | Path, run: int | None = None) -> Path:
        """Write a run's results (metrics as columns) to a Parquet file on
        this machine (``.parquet``, ``.pq`` or no suffix: another, a CSV's,
        is refused rather than given Parquet's bytes)."""
        return self._export_to(Path(_export_path(path)), run)

    def _export_to(self, path: Path, run: int | None = None) -> Path:
        """:meth:`export` to ``path`` whatever its name (the command line's
        temporary file for ``-o``, whose suffix it has checked)."""
        frame = self.results(run)
        for column in frame.columns:
            if frame[column].dtype == object:
                values = frame[column].dropna()
                if len(values) and not values.map(lambda v: isinstance(v, str)).all():
                    frame[column] = frame[column].map(
                        lambda v: None if v is None else str(v))
        write_whole(frame, path)
        return path

    # -- housekeeping --------------------------------------------------------------

    def delete(self, run: int, *, force: bool = False) -> None:
        """Forget a run (its artifacts stay until :meth:`gc`); the models later
        runs reused from it stay theirs, reusable (see :mod:`.deletion`).

        A run whose driver is still writing it is refused: the driver would
        go on committing rows that name no run, and a :meth:`gc` meanwhile
        would remove the models it had committed. ``force`` deletes it
        anyway: for a run of a driver on another machine that is gone (this
        machine cannot tell it from a live one; one on this machine that is
        gone reads ``interrupted`` once the store is opened again)."""
        self._require_writable("delete")
        if run is None:
            raise TypeError("delete needs the run to forget (a run id, see Store.runs()); "
                            "None would be the latest run")
        run_id, _, _ = self._run_row(run)
        conn = self._conn
        with database.write_transaction(conn, self.root, f"deleting run {run_id}"):
            status, driver = self._run_now(run_id)
            if status == "running" and not force and drivers.driver_alive(driver):
                raise database.StoreError(
                    f"run {run_id} of the store {str(self)!r} is still being written by "
                    f"its driver ({driver}): delete it once it has ended, or stop that "
                    "driver first (Store.delete(run, force=True) for a driver on another "
                    "machine that is gone)")
            delete_run(conn, run_id)  # what later runs reuse of it stays reusable
        self._publish()

    def _run_now(self, run_id: int) -> tuple[str, str | None]:
        """``run_id``'s status and driver, read inside the caller's write
        transaction: a run another process deleted since it was looked up
        is refused as one the store has not."""
        row = self._conn.execute("SELECT status, driver FROM runs WHERE run_id = ?",
                                 (run_id,)).fetchone()
        if row is None:
            raise ValueError(f"store {str(self)!r} has no run {run_id!r} (deleted meanwhile "
                             "by another process)")
        return row

    def gc(self) -> int:
        """Remove artifacts and packs no run references, and stray files; return
        how many models (and files) were removed (see :func:`.collect.collect`)."""
        from .collect import collect

        self._require_writable("gc")
        removed = collect(self._conn, self.root, self.path,
                          before_removing=functools.partial(self._publish, held=False))
        if self._remote is not None:  # indexes a failed publication left
            self._remote.collect_indexes()
        return removed

    def verify(self) -> pd.DataFrame:
        """Read every model and run-level object the store's runs name and
        check it against its SHA-256, like ``git fsck``; record the corrupt
        ones so the next run trains their tasks again instead of reusing
        them. Returns one row per task (or attachment) whose artifact is
        corrupt: ``run_id``, ``key``, ``attachment``, ``artifact``,
        ``problem`` (``missing``, ``unreadable``, ``truncated`` or
        ``modified``) and ``superseded`` (a later run holds a whole model for
        the key: trained again already); empty when every artifact is whole (see
        :mod:`.verify`). A store open for reading only is checked, not marked."""
        from .verify import verify_store

        if not self.read_only:
            self._require_writable("verify")
        found = verify_store(self._conn, self.root)
        self._publish()  # the marks, on an object store
        return found

    def integrity_check(self) -> str:
        """SQLite's own ``PRAGMA integrity_check`` ("ok" when sound)."""
        return self._conn.execute("PRAGMA integrity_check").fetchone()[0]

    # -- explaining reuse ------------------------------------------------------------

    def why_not_reused(self, key: Hashable, run: int | None = None) -> str:
        """Say why the task ``key`` of ``run`` (default: latest) was trained
        rather than reused: which part of its identity changed. Of a task
        that did not end ok it says what became of it first (cancelled: it
        never ran; failed, timed out...: the first line of its error), not
        that it "was trained"."""
        from .explain import why_not_reused

        return why_not_reused(self, key, run)


def _export_path(path: str | Path) -> str | Path:
    """An export's path (a ``file:`` URI: the path it names), refused before
    anything is read where it is not a local Parquet file's: an object
    store's URI (read as a local folder that does not exist) or another
    format's suffix (written as Parquet)."""
    from ..inputs.fileuris import local_location
    from ..inputs.objectstores import is_remote

    if not isinstance(path, (str, PurePath)):
        raise TypeError(f"export's path must be a file path, got {type(path).__name__}")
    path = local_location(path, "export's path")
    if is_remote(str(path)):
        raise ValueError(f"export writes a file on this machine, not {str(path)!r}: export "
                         "to a local file, then upload it")
    if Path(path).suffix.lower() not in ("", ".parquet", ".pq"):
        raise ValueError(f"export writes Parquet, not {Path(path).suffix!r} "
                         f"({str(path)!r}): name it .parquet (store.results().to_csv writes a "
                         "CSV)")
    return path


def _with_models(tasks: pa.Table) -> pa.Table:
    """The tasks that ended ok with a model."""
    return tasks.filter(pc.and_(pc.equal(tasks["status"], Status.OK.value),
                                pc.is_valid(tasks["artifact"])))
