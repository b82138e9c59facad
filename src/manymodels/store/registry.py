"""The model registry: what a store holds, read back as DataFrames and models."""

from __future__ import annotations

import json
import pickle
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from . import database
from .recorder import encode_key

_TASK_COLUMNS = ["status", "attempts", "duration_s", "worker", "reused_from", "error",
                 "artifact", "size"]
_PARTS = ("code", "params", "data", "shared")


def _key_parts(key: Hashable) -> tuple:
    return key if isinstance(key, tuple) else (key,)


class StoredModel:
    """A model in a store, loaded (and checked) on first use."""

    __slots__ = ("digest", "store", "what")

    def __init__(self, store: Store, digest: str, what: str) -> None:
        self.store, self.digest, self.what = store, digest, what

    def load(self) -> Any:
        data = database.read_artifact(self.store._conn, self.store.path, self.digest, self.what)
        return pickle.loads(data)


class ModelMap(Mapping):
    """Key -> model; models kept in a store are loaded when first asked for."""

    def __init__(self, items: dict[Hashable, Any]) -> None:
        self._items = items

    def __getitem__(self, key: Hashable) -> Any:
        value = self._items[key]
        if isinstance(value, StoredModel):
            value = self._items[key] = value.load()
        return value

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __repr__(self) -> str:
        return f"<{len(self)} models>"


class Store:
    """A crash-safe registry of runs and models in one directory.

    ``mm.train(..., store="models/")`` records every task there; a re-run with
    the same store reuses each finished model whose identity (code, parameters,
    data) is unchanged and trains only what changed.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = database.prepare_directory(Path(path))
        self._conn = database.connect(self.path)

    def close(self) -> None:
        self._conn.close()

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    # -- runs ------------------------------------------------------------------

    def runs(self) -> pd.DataFrame:
        """One row per run: id, times, status, backend, counts, wall time."""
        return pd.read_sql_query(
            "SELECT run_id, started_at, finished_at, status, backend, workers, source, fit, "
            "tasks, ok, failed, reused, wall_s FROM runs ORDER BY run_id", self._conn)

    def _run_row(self, run: int | None) -> tuple:
        if run is None:
            row = self._conn.execute(
                "SELECT run_id, key_columns, param_columns FROM runs "
                "ORDER BY run_id DESC LIMIT 1").fetchone()
            if row is None:
                raise ValueError(f"store {str(self.path)!r} holds no runs yet")
        else:
            row = self._conn.execute(
                "SELECT run_id, key_columns, param_columns FROM runs WHERE run_id = ?",
                (int(run),)).fetchone()
            if row is None:
                raise ValueError(f"store {str(self.path)!r} has no run {run!r}")
        return row[0], json.loads(row[1]), json.loads(row[2])

    def results(self, run: int | None = None) -> pd.DataFrame:
        """The results of a run (default: the latest), like ``Run.results``."""
        run_id, key_columns, _ = self._run_row(run)
        rows = self._conn.execute(
            f"SELECT key, metrics, {', '.join(_TASK_COLUMNS)} FROM tasks WHERE run_id = ? "
            "ORDER BY task_index", (run_id,)).fetchall()
        keys = [json.loads(r[0]) for r in rows]
        frame = pd.DataFrame({c: [k[i] for k in keys] for i, c in enumerate(key_columns)})
        for position, column in enumerate(_TASK_COLUMNS):
            frame[column] = [r[2 + position] for r in rows]
        metrics = [json.loads(r[1]) if r[1] else {} for r in rows]
        names: dict[str, None] = {}
        for m in metrics:
            names.update(dict.fromkeys(m))
        for name in names:
            column = name if name not in frame.columns else f"metric_{name}"
            frame[column] = [m.get(name) for m in metrics]
        frame.insert(len(key_columns), "run_id", run_id)
        return frame

    def _task_row(self, key: Hashable, run: int | None, columns: str) -> tuple:
        run_id, _, _ = self._run_row(run)
        row = self._conn.execute(
            f"SELECT {columns} FROM tasks WHERE run_id = ? AND key = ?",
            (run_id, encode_key(_key_parts(key)))).fetchone()
        if row is None:
            raise KeyError(f"run {run_id} has no task with key {key!r}")
        return row

    def load(self, key: Hashable, run: int | None = None) -> Any:
        """The model of ``key`` in ``run`` (default: the latest run)."""
        status, artifact = self._task_row(key, run, "status, artifact")
        if status != "ok" or artifact is None:
            raise KeyError(f"the task with key {key!r} has no model (status {status})")
        return StoredModel(self, artifact, f"key {key!r}").load()

    def models(self, run: int | None = None) -> ModelMap:
        """A lazy mapping key -> model of a run (default: the latest)."""
        run_id, key_columns, _ = self._run_row(run)
        items: dict[Hashable, Any] = {}
        for key, artifact in self._conn.execute(
            "SELECT key, artifact FROM tasks WHERE run_id = ? AND status = 'ok' AND "
            "artifact IS NOT NULL ORDER BY task_index", (run_id,)):
            parts = tuple(json.loads(key))
            item_key = parts[0] if len(parts) == 1 else parts
            items[item_key] = StoredModel(self, artifact, f"key {item_key!r}")
        return ModelMap(items)

    # -- using the models --------------------------------------------------------

    def predict(self, table: Any, by: str | list[str], method: str = "predict",
                features: list[str] | None = None, run: int | None = None) -> pd.Series:
        """Predict each row of ``table`` with its group's model.

        Returns a Series aligned with ``table``'s rows; rows of a group with no
        model are NaN. ``features`` defaults to the model's
        ``feature_names_in_``, else every column but the ``by`` columns.
        """
        from ..tables import read_table

        frame = table if isinstance(table, pd.DataFrame) else read_table(table).to_pandas()
        by_columns = [by] if isinstance(by, str) else list(by)
        missing = [c for c in by_columns if c not in frame.columns]
        if missing:
            raise ValueError(f"by column {missing[0]!r} is not in the table")
        models = self.models(run)
        out = pd.Series(float("nan"), index=frame.index, dtype=object)
        grouper = by_columns[0] if len(by_columns) == 1 else by_columns
        for key, rows in frame.groupby(grouper, sort=False, dropna=False).groups.items():
            if key not in models:
                continue
            model = models[key]
            names = features or list(getattr(model, "feature_names_in_", [])) or [
                c for c in frame.columns if c not in by_columns]
            values = getattr(model, method)(frame.loc[rows, names])
            out.loc[rows] = list(values) if getattr(values, "ndim", 1) > 1 else values
        try:
            return out.astype(float)
        except (TypeError, ValueError):
            return out

    def export(self, path: str | Path, run: int | None = None) -> Path:
        """Write a run's results (metrics as columns) to a Parquet file."""
        frame = self.results(run)
        for column in frame.columns:
            if frame[column].dtype == object:
                values = frame[column].dropna()
                if len(values) and not values.map(lambda v: isinstance(v, str)).all():
                    frame[column] = frame[column].map(
                        lambda v: None if v is None else str(v))
        path = Path(path)
        frame.to_parquet(path, index=False)
        return path

    # -- housekeeping --------------------------------------------------------------

    def delete(self, run: int) -> None:
        """Forget a run (its artifacts stay until :meth:`gc`)."""
        run_id, _, _ = self._run_row(run)
        self._conn.execute("BEGIN IMMEDIATE")
        self._conn.execute("DELETE FROM tasks WHERE run_id = ?", (run_id,))
        self._conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
        self._conn.execute("COMMIT")

    def gc(self) -> int:
        """Remove artifacts no run references, and stray files; return how many."""
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            dead = conn.execute(
                "SELECT sha256, path FROM artifacts WHERE sha256 NOT IN "
                "(SELECT artifact FROM tasks WHERE artifact IS NOT NULL)").fetchall()
            conn.executemany("DELETE FROM artifacts WHERE sha256 = ?", [(d,) for d, _ in dead])
            known = {p for (p,) in conn.execute(
                "SELECT path FROM artifacts WHERE path IS NOT NULL")}
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        removed = len(dead)
        for file in (self.path / "artifacts").rglob("*"):
            relative = file.relative_to(self.path).as_posix()
            if file.is_file() and relative not in known:
                file.unlink(missing_ok=True)
                removed += relative not in {p for _, p in dead if p}
        conn.execute("VACUUM")
        return removed

    def integrity_check(self) -> str:
        """SQLite's own ``PRAGMA integrity_check`` ("ok" when sound)."""
        return self._conn.execute("PRAGMA integrity_check").fetchone()[0]

    # -- explaining reuse ------------------------------------------------------------

    def why_not_reused(self, key: Hashable, run: int | None = None) -> str:
        """Say why the task ``key`` of ``run`` (default: latest) was trained
        rather than reused: which part of its identity changed."""
        run_id, _, _ = self._run_row(run)
        row = self._task_row(key, run_id, "reused_from, code_hash, params_hash, data_hash, "
                                          "shared_hash, status")
        if row[0] is not None:
            return f"{key!r} was reused from run {row[0]}"
        before = self._conn.execute(
            "SELECT run_id, code_hash, params_hash, data_hash, shared_hash, status FROM tasks "
            "WHERE key = ? AND run_id < ? ORDER BY (status = 'ok') DESC, run_id DESC LIMIT 1",
            (encode_key(_key_parts(key)), run_id)).fetchone()
        if before is None:
            return f"{key!r} was trained: no earlier run in this store has this key"
        changed = [name for name, now, then in zip(_PARTS, row[1:5], before[1:5])
                   if now != then]
        if changed:
            described = {
                "code": "the code of fit (or of a module it uses, or a package version)",
                "params": "its parameters", "data": "its data", "shared": "the shared objects",
            }
            return (f"{key!r} was trained: since run {before[0]}, "
                    + ", ".join(described[c] for c in changed) + " changed")
        if before[5] != "ok":
            return f"{key!r} was trained: in run {before[0]} it ended {before[5]!r}"
        return f"{key!r} was trained: reuse was turned off (reuse=False)"
