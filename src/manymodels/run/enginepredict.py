"""``Store.predict(spark_df)``: new rows that live in an engine, predicted by
its executors, answered as the engine's own table.

::

    driver                         the engine (each executor's Python worker)
    ──────                         ───────────────────────────────────────────
    run, by, features, fallback    one shuffle by key (Spark's groupBy, Dask's
    key -> model digest (text) ──► shuffle, Ray Data's groupby), then per group:
    output type (one model read)   its key -> digest -> model, loaded from the
                                   store (SHA-256 checked, cached per process)
    the engine's DataFrame   ◄──── the group's rows + ``prediction`` (+ ``source``)
    (lazy: nothing collected)

The driver holds metadata only: the table of which model answers which key,
never a row. The store must sit on a path every executor sees (a shared
file system, or the one machine of a local session). An engine's DataFrame
has no row order or labels to align a Series with, so the answer is the
input's rows with a ``prediction`` column (and ``source`` with
``with_source=True``), in the engine's order. A group with no model and no
fallback gets a null prediction and source ``"none"``; the engine's own job
is what runs it, so a group whose model fails raises there, with the
group's key in the message.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..inputs.engineframes import (
    EngineFrame,
    engine_of,
    refuse_labels_not_text,
    refuse_nested_keys,
    stand_ins,
)
from ..inputs.keys import TypedKeys, decode_key
from ..inputs.tables import plain_scalar
from ..store.database import INDEX_NAME, StoreIntegrityError
from .predictchecks import check_schema_key_types

#: A Python worker of the engine keeps this many loaded models (a group's
#: model is used once per shuffle, the fallback model by many groups).
MODELS_PER_WORKER = 256

#: per engine worker process: store path -> (the version it was read at, the open store)
_STORES: dict[str, tuple[str | None, Any]] = {}


def store_version(store: Any) -> str | None:
    """What the driver read of ``store``, for the engine's workers to tell it
    from another at the same path: a store on an object store's published
    index; a local store's index file (its device, inode, times, size) and
    its first run's start. A worker's open store keeps reading the index file
    it opened, even once that was removed and a new store made at the path
    (whose file may even have the same inode)."""
    if store._remote is not None:
        return store._version
    info = os.stat(Path(store.path) / INDEX_NAME)
    first = store._conn.execute("SELECT min(run_id), min(started_at) FROM runs").fetchone()
    return (f"{info.st_dev}:{info.st_ino}:{info.st_mtime_ns}:{info.st_ctime_ns}:"
            f"{info.st_size}:{first[0]}:{first[1]!r}")


class EngineGroupPredictor:
    """What each executor calls on one group's rows (a pandas DataFrame)."""

    def __init__(self, store_path: str, predictor: Any, artifacts: dict[str, str],
                 with_source: bool, version: str | None = None) -> None:
        # predictor: grouppredictor.GroupPredictor, whose model cache and call of
        # the model this shares with Store.predict of a table on the driver;
        # version: store_version of the store the driver read (an executor's
        # copy of an older published index is brought to it; a local store
        # is opened again)
        self.store_path, self.predictor, self.with_source = store_path, predictor, with_source
        self.version = version
        self.by, self.fallback, self.artifacts = predictor.by, predictor.fallback, artifacts
        self._typed: TypedKeys | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_typed": None}

    def _store(self) -> Any:
        version, store = _STORES.get(self.store_path, (None, None))
        if store is not None and version != self.version:
            if store._remote is not None:
                store._refresh()
            else:  # let go, not closed: another thread of a Dask worker may be reading it
                store = None
        if store is None:
            from ..store import Store

            store = Store(self.store_path, read_only=True)
        _STORES[self.store_path] = (self.version, store)
        return store

    def _digest(self, parts: tuple) -> tuple[str | None, str]:
        if self._typed is None:
            self._typed = TypedKeys(self.artifacts)
        digest = self._typed.find(parts)
        if digest is not None:
            return digest, "group"
        return (self.fallback, "fallback") if self.fallback is not None else (None, "none")

    def __call__(self, rows: Any) -> Any:
        if rows.empty:
            return self._answer(rows, np.empty(0), "none")
        parts = tuple(plain_scalar(rows[column].iloc[0]) for column in self.by)  # as keys
        digest, origin = self._digest(parts)
        if digest is None:
            return self._answer(rows, np.full(len(rows), np.nan), origin)
        named = f"key {parts[0] if len(parts) == 1 else parts!r}"
        models = self.predictor._models
        if len(models) >= MODELS_PER_WORKER and digest not in models:
            models.pop(next(iter(models)))
        try:
            model = self.predictor._model(self._store(), digest, named if origin == "group"
                                          else f"the fallback model (asked for {named})")
            if self.predictor.fn is None:
                columns = {name: rows[name].to_numpy() for name in rows.columns}
                values = self.predictor.values(model, columns, parts)
            else:
                values = self.predictor.values(model, rows.reset_index(drop=True), parts)
        except StoreIntegrityError:
            raise
        except Exception as exc:  # the engine's error names the group
            raise RuntimeError(f"predicting group {named}: {type(exc).__name__}: {exc}") from exc
        return self._answer(rows, values, origin)

    def _answer(self, rows: Any, values: np.ndarray, origin: str) -> Any:
        answer = rows.copy()
        answer["prediction"] = list(values) if values.ndim > 1 else values
        if self.with_source:
            answer["source"] = origin
        return answer


def _first_models(store: Any, artifacts: dict[str, str], fallback: str | None
                  ) -> dict[str, tuple[str, Any]]:
    """One group's stored model and the fallback, loaded (digest -> what it
    is the model of, the model): what the driver reads of the models to
    check them and type the answer, never more."""
    from ..store.lazymodels import StoredModel

    wanted = []
    for key, digest in itertools.islice(artifacts.items(), 1):
        parts = decode_key(key)
        wanted.append((digest, f"group {parts[0] if len(parts) == 1 else parts!r}"))
    if fallback is not None:
        wanted.append((fallback, "the fallback"))
    return {digest: (named, StoredModel(store, digest, named).load())
            for digest, named in wanted}


def output_kind(models: list[Any], method: str, fn: Callable | None) -> str:
    """What one prediction is: ``"float"``, ``"int"``, ``"str"`` or
    ``"vector"`` (a row of class probabilities or scores): an engine needs the
    answer's type before it runs. A classifier's ``predict`` gives its
    classes' type (``models``: one group's stored model and the fallback,
    read to know; where they disagree, text if either is text, else a float),
    ``predict_proba`` and ``decision_function`` a vector, anything else a
    number."""
    if fn is not None:
        return "float"
    if method in ("predict_proba", "predict_log_proba", "decision_function"):
        return "vector"
    if not models or method != "predict":
        return "float"
    kinds = set()
    for model in models:
        classes = getattr(model, "classes_", None)
        kind = "float" if classes is None else np.asarray(classes).dtype.kind
        kinds.add("int" if kind in "iub" else "str" if kind in "USO" else "float")
    return kinds.pop() if len(kinds) == 1 else "str" if "str" in kinds else "float"


def predict_engine_frame(store: Any, table: Any, predictor: Any, artifacts: dict[str, str],
                         with_source: bool) -> Any:
    """The engine's DataFrame of ``table``'s rows with their predictions by
    ``predictor`` (a ``grouppredictor.GroupPredictor``; see the module): checked
    here, run lazily by the engine."""
    from ..inputs.engineframes import _column_names

    engine = engine_of(table)
    by, features, fallback = predictor.by, predictor.features, predictor.fallback
    method, fn = predictor.method, predictor.fn
    columns = _column_names(table, engine)
    taken = [name for name in ("prediction", *(["source"] if with_source else []))
             if name in columns]
    missing = [c for c in [*by, *(features or [])] if c not in columns]
    if missing:
        raise ValueError(f"column {missing[0]!r} is not in the {engine} table to predict "
                         f"(its columns: {columns})")
    if taken:
        raise ValueError(f"the {engine} table to predict has a column {taken[0]!r}, which "
                         "the answer adds: rename it")
    refuse_labels_not_text(table, engine)
    refuse_nested_keys(table, engine, by)
    if not artifacts and fallback is None:
        raise ValueError(f"store {str(store)!r} has no model to predict with and no "
                         "fallback model")
    check_schema_key_types(by, EngineFrame(table, engine).schema, artifacts,
                           f"store {str(store)!r}")
    task = EngineGroupPredictor(store.reopened_as, predictor, artifacts, with_source,
                                store_version(store))
    models = {} if fn is not None else _first_models(store, artifacts, fallback)
    for named, model in models.values():  # a feature column the table lacks, a method
        predictor.check_model(model, columns, named)  # the models lack: said here
    kind = output_kind([model for _, model in models.values()], method, fn)
    return {"spark": _on_spark, "dask": _on_dask, "ray": _on_ray}[engine](table, by, task, kind)


def _on_spark(frame: Any, by: list[str], task: EngineGroupPredictor, kind: str) -> Any:
    """``applyInPandas`` by key. A timestamp column travels as its instant in
    microseconds: Spark would hand the group its session time zone's wall
    clock, naive, which is no stored key (training stores UTC instants) and
    shows two instants of the hour a clock turns back alike; the group gets
    the UTC instants training's ``fit`` saw, and the answer the input's."""
    from pyspark.sql import functions, types

    value = {"float": types.DoubleType(), "int": types.LongType(),
             "str": types.StringType(), "vector": types.ArrayType(types.DoubleType())}[kind]
    names = list(frame.columns)
    stand = stand_ins(len(names))
    fields = [types.StructField(name, field.dataType, field.nullable)
              for name, field in zip(stand, frame.schema.fields)]
    fields.append(types.StructField("prediction", value, True))
    answered = [*names, "prediction"]
    if task.with_source:
        fields.append(types.StructField("source", types.StringType(), False))
        answered.append("source")

    instants = [name for name, field in zip(names, frame.schema.fields)
                if isinstance(field.dataType, types.TimestampType)]  # (not timestamp_ntz)

    def predict_group(rows: Any) -> Any:  # Spark reads a function's arity: (rows), no key
        import pandas as pd

        rows.columns = names
        for name in instants:
            rows[name] = pd.to_datetime(rows[name], unit="us", utc=True)
        answer = task(rows)
        answer.columns = [*stand, *answered[len(names):]]
        return answer

    keys = [stand[names.index(name)] for name in by]
    carried = frame.toDF(*stand)
    carried = carried.select(*[functions.unix_micros(carried[alias]).alias(alias)
                               if name in instants else carried[alias]
                               for alias, name in zip(stand, names)])
    grouped = carried.groupBy(*keys)
    return grouped.applyInPandas(predict_group, schema=types.StructType(fields)).toDF(*answered)


def _dask_meta(meta: Any, task: EngineGroupPredictor, kind: str) -> Any:
    """The answer's empty frame: integer classes as pandas' nullable ``Int64``,
    which holds the missing prediction of a row whose group has no model
    (int64 cannot: the partitions held floats where the meta said integers)."""
    import pandas as pd

    dtype = {"float": "float64", "int": "Int64", "str": "object", "vector": "object"}[kind]
    meta = meta.assign(prediction=pd.array([], dtype=dtype))
    return meta.assign(source=np.empty(0, dtype=object)) if task.with_source else meta


class _PartitionPredictor:
    """A Dask partition after the shuffle holds whole groups: each through the task."""

    def __init__(self, by: list[str], task: EngineGroupPredictor, meta: Any) -> None:
        self.by, self.task, self.meta = by, task, meta

    def __call__(self, part: Any) -> Any:
        import pandas as pd

        if part.empty:
            return self.meta
        answers = [self.task(rows) for _, rows in part.groupby(self.by, sort=False,
                                                                 dropna=False, observed=True)]
        return pd.concat(answers).astype(self.meta.dtypes.to_dict(), errors="ignore")


def _on_dask(frame: Any, by: list[str], task: EngineGroupPredictor, kind: str) -> Any:
    meta = _dask_meta(frame._meta, task, kind)
    shuffled = frame.shuffle(on=by)
    return shuffled.map_partitions(_PartitionPredictor(by, task, meta), meta=meta)


def _on_ray(dataset: Any, by: list[str], task: EngineGroupPredictor, kind: str) -> Any:
    """Ray Data's ``groupby().map_groups``, by the shuffle keys of the
    training's staging (a float key's NaN and null one group, a categorical
    key grouped by its values: ``ray_shuffle_keys``), which the group's rows
    lose before the model sees them."""
    from ..planning.staging import ray_shuffle_keys

    keyed, keys, added = ray_shuffle_keys(dataset, by)

    def predict_group(rows: Any) -> Any:  # Ray Data names its stages by the function
        return task(rows.drop(columns=list(added)))

    return keyed.groupby(keys if len(keys) > 1 else keys[0]).map_groups(
        predict_group, batch_format="pandas")
