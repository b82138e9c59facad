"""Prediction on the engine: each group's new rows through its stored model.

``Store.predict`` plans the rows to predict as ``mm.groups(table, by=...)``
and runs them through :func:`manymodels.train`'s backends, like training:
the table is sorted by key once and shared with the workers; each task is one
group, whose worker loads the group's model from the store (SHA-256 checked,
cached per worker: a fallback model is loaded once per worker, not per
group) and predicts its rows. The driver only lays the answers back in the
input's row order, one NumPy scatter for all groups, where the serial loop
it replaces looked up, loaded and sliced group by group.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..engine.execution import metrics_dict
from ..engine.messages import Status
from ..inputs.keys import TypedKeys, encode_key
from ..store.database import StoreIntegrityError

#: A group's ``source`` when its stored model failed its SHA-256 check: the
#: driver raises :class:`~manymodels.StoreIntegrityError` (a task's exception
#: reaches the driver as text, and a tampered model is no ordinary failure).
CORRUPT = "corrupt"
#: Predictions whose measured cost for all groups, in the driver, stays below
#: this many seconds run there (serial backend): starting workers would cost
#: more than they save. Above it they run on worker processes.
PARALLEL_ABOVE_S = 0.5
#: How many groups are predicted in the driver to measure that cost (the
#: first one warms imports and caches and is not counted).
PROBE_GROUPS = 3


def _open_store(path: str) -> Any:
    from ..store import Store

    return Store(path, read_only=True)


class GroupPredictor:
    """The task run per group: load its model, predict its rows. Returns the
    predictions (as the task's "model") and where they came from (a metric)."""

    def __init__(self, by: list[str], features: list[str] | None, method: str,
                 fn: Callable[[Any, Any], Any] | None, fallback: str | None) -> None:
        self.by, self.features, self.method = by, features, method
        self.fn, self.fallback = fn, fallback
        self._models: dict[str, Any] = {}  # per worker: digest -> model

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_models": {}}

    def _model(self, store: Any, digest: str, what: str) -> Any:
        model = self._models.get(digest)
        if model is None:
            from ..store.lazymodels import StoredModel

            model = self._models[digest] = StoredModel(store, digest, what).load()
        return model

    def __call__(self, rows: Any, artifacts: dict[str, str], resource: Any, key: Any) -> Any:
        # rows: the group's columns as NumPy arrays, or (with fn) a DataFrame;
        # key: the group's key as the driver planned it (artifacts' keys are
        # those), not as this worker reads it from its rows
        numpy = isinstance(rows, dict)
        key = key if len(self.by) > 1 else (key,)
        digest = artifacts.get(encode_key(key))
        if digest is not None:
            origin = "group"
        elif self.fallback is not None:
            digest, origin = self.fallback, "fallback"
        else:
            return {"source": "none"}
        named = f"key {key[0] if len(key) == 1 else key!r}"
        try:
            model = self._model(resource, digest, named if origin == "group"
                                else f"the fallback model (asked for {named})")
        except StoreIntegrityError as exc:  # told by its type in the driver, not as text
            return {"source": CORRUPT, "error": str(exc)}
        n = len(rows[self.by[0]]) if numpy else len(rows)
        if self.fn is not None:
            values = self.fn(model, rows)
        else:
            names = self.features or list(getattr(model, "feature_names_in_", [])) or [
                c for c in rows if c not in self.by]
            values = _call(model, self.method, rows, names)
        values = np.asarray(values)
        if len(values) != n:
            raise ValueError(f"the prediction of group {key!r} has {len(values)} rows for "
                             f"its {n} rows")
        return values, {"source": origin}


def _plain_estimator(model: Any) -> bool:
    """A scikit-learn estimator that reads its features by position (not a
    pipeline or column transformer, which may select columns by name)."""
    module = type(model).__module__
    return module.startswith("sklearn.") and not module.startswith(
        ("sklearn.pipeline", "sklearn.compose"))


#: scikit-learn regressors whose ``predict`` is ``X @ coef_.T + intercept_``
#: after validation (``LinearModel.predict``; they override it for its docstring).
_LINEAR = ("LinearRegression", "Ridge", "RidgeCV", "Lasso", "LassoCV", "ElasticNet",
           "ElasticNetCV")


def _linear_predict(model: Any) -> bool:
    """Whether ``model`` is exactly one of :data:`_LINEAR` (not a subclass,
    which may predict otherwise), with dense coefficients."""
    kind = type(model)
    return (kind.__module__.startswith("sklearn.linear_model.") and kind.__name__ in _LINEAR
            and isinstance(getattr(model, "coef_", None), np.ndarray))


def _call(model: Any, method: str, columns: dict[str, np.ndarray], names: list[str]) -> Any:
    """``model.<method>`` of a group's feature columns. A model fitted on a
    DataFrame gets one, except a plain scikit-learn estimator: it gets the
    same columns, in its ``feature_names_in_`` order, as one NumPy array,
    which skips its DataFrame validation (most of a small group's cost)."""
    import pandas as pd

    named = hasattr(model, "feature_names_in_")
    if method == "predict" and _linear_predict(model) and (
            not named or list(model.feature_names_in_) == names):
        # scikit-learn's LinearModel.predict, the same product, minus ~50 us
        # of validation per call (a group of 5 rows costs ~5 us)
        X = np.column_stack([np.asarray(columns[c], dtype=float) for c in names])
        return X @ model.coef_.T + model.intercept_
    if not named:
        return getattr(model, method)(np.column_stack([columns[c] for c in names]))
    if _plain_estimator(model) and list(model.feature_names_in_) == names:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="X does not have valid feature names")
            return getattr(model, method)(np.column_stack([columns[c] for c in names]))
    return getattr(model, method)(pd.DataFrame({c: columns[c] for c in names}))


def _group_digests(keys: Any, artifacts: dict[str, str]) -> dict[str, str]:
    """The model of each group of ``keys`` (the plan's) that has one, by its
    encoded key: the stored key equal to it, or else one that differs only
    in how a reader typed a whole number (:class:`~manymodels.inputs.keys.TypedKeys`:
    linear in the key columns, where trying each typing was exponential)."""
    found: dict[str, str] = {}
    typed = TypedKeys(artifacts)
    for parts in keys:
        digest = typed.find(parts)
        if digest is not None:
            found[encode_key(parts)] = digest
    return found


@dataclass
class Predicted:
    """Per input row: the prediction (None when no row had a model) and its
    source; the group keys that had no model."""

    values: np.ndarray | None
    source: np.ndarray
    unseen: list[Any]


def choose_backend(task: GroupPredictor, layout: Any, source: Any, digests: dict[str, str],
                   store: Any, width: int) -> str:
    """``"serial"`` or ``"processes"`` from the measured cost of a prediction:
    a few groups are predicted here, and when all groups at the cost of the
    slowest measured one would take more than :data:`PARALLEL_ABOVE_S`, they
    go to worker processes. The number of groups alone misleads both ways:
    a forecaster whose ``predict`` takes 50 ms a group is worth workers at 20
    groups, a linear model is not at 5,000. A probe that fails leaves the
    error to the run itself, which names the group."""
    import time

    from ..inputs.datareaders import _arrow_as

    groups = len(layout.keys)
    if groups < 2:
        return "serial"
    resource = _open_store(str(store.path))
    fmt = "pandas" if task.fn is not None else "numpy"
    seconds = []
    try:
        for i in range(min(PROBE_GROUPS, groups)):
            rows = _arrow_as(layout.table.slice(int(layout.offsets[i]), int(layout.lengths[i])),
                             fmt, source.column_labels if fmt == "pandas" else None)
            key = tuple(layout.keys[i])
            begin = time.perf_counter()
            task(rows, digests, resource, key if width > 1 else key[0])
            seconds.append(time.perf_counter() - begin)
    except Exception:
        return "processes"  # the run says what failed, and where
    finally:
        task._models.clear()  # the workers load their own
        if hasattr(resource, "close"):
            resource.close()
    each = max(seconds[1:] or seconds)
    return "processes" if each * groups > PARALLEL_ABOVE_S else "serial"


def predict_groups(store: Any, frame: Any, by: list[str], artifacts: dict[str, str],
                   fallback: str | None, *, features: list[str] | None, method: str,
                   fn: Callable[[Any, Any], Any] | None, backend: str | None,
                   workers: int | None, progress: bool) -> Predicted:
    """Predict ``frame``'s rows group by group on the engine (see the module)."""
    from ..inputs.sources import groups
    from ..planning import plan as planning
    from .results import _loaded
    from .runner import train

    source = groups(frame, by=by, format="pandas" if fn is not None else "numpy")
    layout = planning.group_layout(source)
    task = GroupPredictor(by, features, method, fn, fallback)
    digests = _group_digests(layout.keys, artifacts)
    if backend is None:
        backend = "serial" if workers == 1 else choose_backend(
            task, layout, source, digests, store, len(by))
    run = train(task, source, shared={"artifacts": digests},
                setup=functools.partial(_open_store, str(store.path)), backend=backend,
                workers=workers, progress=progress)
    records = run._records
    corrupt = [i for i, status in enumerate(records.status) if status == Status.OK and metrics_dict(
        records.metrics[i], i)["source"] == CORRUPT]
    if corrupt:
        first = corrupt[0]
        key = layout.keys[first][0] if len(by) == 1 else layout.keys[first]
        others = f" (and {len(corrupt) - 1} other group(s))" if len(corrupt) > 1 else ""
        raise StoreIntegrityError(f"predicting group {key!r}{others}: "
                                  + metrics_dict(records.metrics[first], first)["error"])
    failed = [i for i, status in enumerate(records.status) if status != Status.OK]
    if failed:
        first = failed[0]
        raise RuntimeError(f"predicting group {layout.keys[first]!r} failed "
                           f"({len(failed)} group(s) in all): {records.error[first]}")
    n = len(frame)
    sorted_source = np.full(n, "none", dtype=object)
    pieces, unseen = [], []
    out: np.ndarray | None = None
    for index, (offset, length) in enumerate(zip(layout.offsets, layout.lengths)):
        origin = metrics_dict(records.metrics[index], index)["source"]
        if origin == "none":
            unseen.append(layout.keys[index][0] if len(by) == 1 else layout.keys[index])
            continue
        values = _loaded(records.model[index], index)
        pieces.append((int(offset), int(length), values))
        sorted_source[offset:offset + length] = origin
    if pieces:
        first = pieces[0][2]
        kind = np.result_type(*[p[2].dtype for p in pieces]) if all(
            p[2].dtype.kind != "O" for p in pieces) else np.dtype(object)
        if unseen and kind.kind in "iub":
            kind = np.dtype(float)
        elif unseen and kind.kind not in "fcO":
            kind = np.dtype(object)
        out = np.empty((n, *first.shape[1:]), dtype=kind)
        if unseen:
            out[sorted_source == "none"] = np.nan
        for offset, length, values in pieces:
            out[offset:offset + length] = values
    order = layout.input_rows
    if order is not None:  # back from key order to the input's row order
        inverse = np.empty_like(order)
        inverse[order] = np.arange(len(order))
        sorted_source = sorted_source[inverse]
        out = out[inverse] if out is not None else None
    return Predicted(out, sorted_source, unseen)


def _column_names(names: str | list[str] | None) -> list[str] | None:
    return None if names is None else [names] if isinstance(names, str) else list(names)


def predict_from_store(store: Any, table: Any, by: str | list[str] | None, method: str,
                       features: list[str] | None, run: int | None, fallback: bool,
                       with_source: bool, *, fn: Callable[[Any, Any], Any] | None,
                       backend: str | None, workers: int | None, progress: bool) -> Any:
    """:meth:`manymodels.Store.predict`: each group's rows through its model."""
    import pandas as pd

    from ..engine.options import check_switch
    from ..inputs.engineframes import refuse_engine_frame
    from ..inputs.tables import exact_pandas, read_table

    check_switch("with_source", with_source)
    check_switch("fallback", fallback)
    refuse_engine_frame(table, "predict's table", "predict returns a Series aligned with the "
                        "table's rows, made on the driver")
    if by is not None and not (isinstance(by, str) or (
            isinstance(by, (list, tuple)) and by and all(isinstance(c, str) for c in by))):
        raise TypeError(f"by must be a column name or a list of them, got {by!r}")
    linear = store._linear_run(store._run_row(run)[0])
    if linear is not None:  # an mm.linear run: its result predicts, vectorised
        from ..models.linear.stored import predict_frame

        return predict_frame(store, linear, table, method, with_source)
    config = store.attached("train_config", run, default={}) or {}
    chosen = store._selection(run)
    asked = _column_names(by)
    trained = _column_names(config.get("by") or (chosen or {}).get("by"))
    if asked is not None and trained is not None and asked != trained:
        raise ValueError(f"by={by!r}, but the run's models are keyed by {trained!r}: "
                         "no row could find its group's model (rename the columns of the "
                         "table to predict, or leave by= out)")
    by_columns = asked or trained
    if by_columns is None:
        raise ValueError("predict needs by= (the group columns)")
    features = features or config.get("features")
    frame = table if isinstance(table, pd.DataFrame) else exact_pandas(read_table(table))
    if frame.empty:
        raise ValueError("the table to predict has no rows")
    missing = [c for c in by_columns + list(features or []) if c not in frame.columns]
    if missing:
        raise ValueError(f"column {missing[0]!r} is not in the table to predict")
    if fn is not None and not callable(fn):
        raise TypeError(f"fn must be a function of (model, rows), got {fn!r}")
    artifacts = chosen["artifacts"] if chosen else store._model_artifacts(run)
    backup = store._latest_attached_digest("fallback", run) if fallback else None
    routed = predict_groups(store, frame, by_columns, artifacts, backup, features=features,
                            method=method, fn=fn, backend=backend, workers=workers,
                            progress=progress)
    where = "" if run is None else f" of run {run}"
    if routed.values is None:
        raise ValueError(
            f"no row of the table has a model in store {str(store.path)!r}{where}: none "
            f"of its {len(routed.unseen)} group(s) by {by_columns} (e.g. "
            f"{routed.unseen[:3]!r}) was trained ok, and there is no fallback model")
    if routed.unseen:
        warnings.warn(
            f"{int((routed.source == 'none').sum())} row(s) of {len(routed.unseen)} "
            f"group(s) (e.g. {routed.unseen[:3]!r}) have no model in store "
            f"{str(store.path)!r}{where} and no fallback: their prediction is NaN",
            RuntimeWarning, stacklevel=2)
    values = routed.values
    prediction = pd.Series(list(values) if values.ndim > 1 else values, index=frame.index)
    if prediction.dtype == object:
        try:
            prediction = prediction.astype(float)
        except (TypeError, ValueError):
            pass
    if with_source:
        return pd.DataFrame({"prediction": prediction, "source": routed.source},
                            index=frame.index)
    return prediction
