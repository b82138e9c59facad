"""Prediction on the engine: each group's new rows through its stored model.

``Store.predict`` plans the rows to predict as ``mm.groups(table, by=...)``
(sorted by key once) and runs them through :func:`manymodels.train`'s
backends, like training, in chunks of whole groups (:mod:`.predictchunks`:
a task per group cost more than a small model's prediction): a chunk's
worker loads each group's model from the store (SHA-256 checked; a
fallback model is loaded once per worker, not per group) and predicts its
rows (:mod:`.grouppredictor`: one group's load, checks and call). The
driver only lays the answers back in the input's row order, one NumPy
scatter for all groups.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from ..inputs.keys import TypedKeys, encode_keys
from ..store.database import StoreIntegrityError
from ..store.lazymodels import StoredModel
from ..store.nomodel import answered_by_fallback, failed_to_fallback, without_model
from .grouppredictor import GroupPredictor
from .predictchecks import check_key_types, near_keys, refuse_text_features
from .predictchunks import (
    CHUNK,
    CHUNKS_PER_WORKER,
    FALLBACK,
    GROUP,
    NONE,
    OWN,
    SOURCES,
    FailedProbe,
    GroupFailure,
    chunk_size,
    in_row_order,
    measure,
    run_chunks,
)

#: Predictions whose measured cost for all groups, in the driver, stays below
#: this many seconds run there (serial backend): starting workers would cost
#: more than they save. Above it they run on worker processes.
PARALLEL_ABOVE_S = 0.5
#: How many groups are predicted in the driver, as one chunk, to measure that
#: cost (after a first one, alone, that warms imports and caches).
PROBE_GROUPS = 3


def _open_store(path: str) -> Any:
    from ..store import Store

    return Store(path, read_only=True)


@dataclass
class Predicted:
    """Per input row: the prediction (None when no row had a model) and
    where it came from (:data:`.predictchunks.NONE`, ``OWN`` or ``FALLBACK``);
    the group keys that had no model, and those the fallback answered."""

    values: np.ndarray | None
    origin: np.ndarray
    unseen: list[Any]
    fallen: list[Any]  # the group keys the fallback model answered

    @property
    def source(self) -> np.ndarray:
        """Each row's source as text: ``"none"``, ``"group"`` or ``"fallback"``
        (made when asked for: a million rows' strings are not free)."""
        return SOURCES[self.origin]


class StoredGroups:
    """Each planned group's stored model, for a chunk's worker
    (:class:`.predictchunks.Groups`): by its number, its model's artifact
    (``digests``, an Arrow string array: null when it has none) or the
    fallback's, loaded from the worker's store (``resource``)."""

    def __init__(self, predictor: GroupPredictor, digests: list[str | None],
                 fallback: str | None, keys: pa.Table) -> None:
        self.predictor, self.fallback, self.keys = predictor, fallback, keys
        self.digests = pa.array(digests, pa.string())  # what a worker gets: a few buffers
        # in the driver, which probes a few groups: its own list of the digests,
        # and each key read alone; a worker lists both at its first group
        self._listed: tuple[list, list | None] | None = (digests, None)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_listed": None}

    def _lists(self) -> tuple[list, list | None]:
        # Python lists, read once: an Arrow scalar costs microseconds a group
        if self._listed is None:
            self._listed = (self.digests.to_pylist(),
                            list(zip(*(c.to_pylist() for c in self.keys.columns))))
        return self._listed

    def key(self, group: int) -> tuple:
        """Group ``group``'s key parts as planned (as the store keys them)."""
        keys = self._lists()[1]
        if keys is None:
            return tuple(column[group].as_py() for column in self.keys.columns)
        return keys[group]

    def predict(self, group: int, rows: Any, resource: Any) -> Any:
        digest = self._lists()[0][group]
        if digest is None and self.fallback is None:
            return None
        parts = self.key(group)
        named = parts[0] if len(parts) == 1 else parts  # "key 'a'": as a task's key is named
        try:
            if digest is not None:  # read once: a worker keeps only the fallback
                model = self.predictor._models.get(digest) or StoredModel(
                    resource, digest, _model_label(named)).load()
            else:
                model = self.predictor._model(resource, self.fallback,
                                              _model_label(named, fallback=True))
        except StoreIntegrityError as exc:  # told by its type in the driver, not as text
            return GroupFailure(group, str(exc), corrupt=True)
        return self.predictor.values(model, rows, parts)


def _digests_by_group(layout: Any, artifacts: dict[str, str]) -> list[str | None]:
    """The model of each planned group (by number), or None: the stored key
    equal to its key (encoded at once in Arrow where the keys allow), or else
    one that differs only in how a reader typed a whole number
    (:class:`~manymodels.inputs.keys.TypedKeys`: linear in the key columns,
    where trying each typing was exponential)."""
    texts = encode_keys(layout.keys, layout.key_table)
    found = [artifacts.get(text) for text in (
        texts.to_pylist() if hasattr(texts, "to_pylist") else texts)]
    if all(digest is not None for digest in found):
        return found
    typed = TypedKeys(artifacts)
    return [digest if digest is not None else typed.find(parts)
            for digest, parts in zip(found, layout.keys)]


def _model_label(key: Any, fallback: bool = False) -> str:
    """How an error names the model a group's prediction loads: its key's,
    or the fallback asked for in its place (an integrity error, say)."""
    return f"the fallback model (asked for key {key!r})" if fallback else f"key {key!r}"


def _check_first_model(store: Any, stored: StoredGroups, frame: Any) -> None:
    """Refuse before any group runs what the first group's model (or the
    fallback, when no group has one) cannot predict from ``frame``: a
    feature column it was fitted with that the table lacks, or a ``method``
    it does not have (:meth:`GroupPredictor.check_model`), or text in a
    feature column of a scikit-learn model that reads numbers, rather than
    every group failing on it with the model's own error. The model stays
    loaded for the probe of :func:`_chunking`."""
    predictor = stored.predictor
    if predictor.fn is not None:
        return
    digests = stored._lists()[0]
    group = next((i for i, digest in enumerate(digests) if digest is not None), None)
    digest = stored.fallback if group is None else digests[group]
    if digest is None:  # no row has a model: said once the groups ran
        return
    parts = stored.key(0 if group is None else group)
    key = parts[0] if len(parts) == 1 else parts
    named = f"group {key!r}" if group is not None else f"the fallback (asked for {key!r})"
    try:
        model = predictor._model(store, digest, _model_label(key, fallback=group is None))
    except StoreIntegrityError as exc:
        raise StoreIntegrityError(f"predicting {named}: {exc}") from exc
    names = predictor.check_model(model, frame.columns, named)
    refuse_text_features(model, frame, names, named)


def _chunking(stored: StoredGroups, layout: Any, as_rows: Callable[..., Any], store: Any,
              backend: str | None, workers: int | None) -> tuple[str, int]:
    """The backend (``backend``, else ``"serial"`` or ``"processes"`` from
    the measured cost of a prediction) and the groups a chunk. A few groups
    are predicted here first: when all groups at the cost of the slowest
    would take more than :data:`PARALLEL_ABOVE_S`, they go to worker
    processes. The number of groups alone misleads both ways: a forecaster
    whose ``predict`` takes 50 ms a group is worth workers at 20 groups, a
    linear model is not at 5,000. A group of the probe that fails
    (:class:`.predictchunks.FailedProbe`) is raised at once, as the run
    would raise it once its workers had started."""
    import os

    groups = len(layout.lengths)
    width = workers or os.cpu_count() or 1
    if backend is not None and backend != "serial":  # asked for: no probe
        return backend, max(1, -(-groups // (width * CHUNKS_PER_WORKER * 4)))
    resource = _open_store(store.reopened_as)
    try:
        each = measure(stored, layout.table, layout.offsets, layout.lengths, as_rows,
                       resource, PROBE_GROUPS)
    except FailedProbe:  # the run would fail on that group the same way, after starting workers
        raise
    except Exception:
        return backend or "processes", max(1, -(-groups // (width * CHUNKS_PER_WORKER)))
    finally:
        stored.predictor._models.clear()  # the workers load their own
        if hasattr(resource, "close"):
            resource.close()
    if backend is None:
        backend = "processes" if groups > 1 and each * groups > PARALLEL_ABOVE_S else "serial"
    return backend, chunk_size(groups, each, 1 if backend == "serial" else width)


def predict_groups(store: Any, frame: Any, by: list[str], artifacts: dict[str, str],
                   fallback: str | None, *, features: list[str] | None, method: str,
                   fn: Callable[[Any, Any], Any] | None, backend: str | None,
                   workers: int | None, progress: bool) -> Predicted:
    """Predict ``frame``'s rows group by group on the engine (see the module)."""
    from ..inputs.datareaders import _arrow_as
    from ..inputs.sources import groups
    from ..planning import plan as planning

    fmt = "pandas" if fn is not None else "numpy"
    source = groups(frame, by=by, format=fmt)
    layout = planning.group_layout(source)
    digests = _digests_by_group(layout, artifacts)
    stored = StoredGroups(GroupPredictor(by, features, method, fn, fallback), digests,
                          fallback, layout.key_table)
    check_key_types(by, layout.keys, [i for i, digest in enumerate(digests) if digest is None],
                    artifacts, f"store {str(store)!r}")
    _check_first_model(store, stored, frame)
    labels = source.column_labels

    def as_rows(table: Any, first: int, last: int) -> Any:  # groups first..last-1
        numbers = np.repeat(np.arange(first, last, dtype=np.int64), layout.lengths[first:last])
        table = table.append_column(GROUP, pa.array(numbers)).append_column(
            CHUNK, pa.array(np.zeros(len(numbers), dtype=np.int64)))
        return _arrow_as(table, fmt, [*labels, GROUP, CHUNK] if labels is not None else None)

    def describe(group: int) -> str:
        parts = stored.key(group)
        return repr(parts[0] if len(by) == 1 else parts)

    if workers == 1:
        backend = "serial"
    try:
        backend, per_chunk = _chunking(stored, layout, as_rows, store, backend, workers)
    except FailedProbe as exc:
        _raise_failures([exc.failure], describe)

    answers = run_chunks(layout.table, layout.lengths, stored, fmt=fmt, per_chunk=per_chunk,
                         labels=labels, backend=backend, workers=workers,
                         setup=functools.partial(_open_store, store.reopened_as),
                         progress=progress, describe=describe)
    _raise_failures([a for a in answers if isinstance(a, GroupFailure)], describe)
    origin = np.array([NONE if d is None else OWN for d in digests], dtype=np.int8)
    if fallback is not None:
        origin[origin == NONE] = FALLBACK
    unseen, fallen = ([layout.keys[i][0] if len(by) == 1 else layout.keys[i]
                       for i in np.flatnonzero(origin == kind).tolist()]
                      for kind in (NONE, FALLBACK))
    values, rows_origin = in_row_order(answers, origin, layout.lengths, layout.input_rows)
    return Predicted(values, rows_origin, unseen, fallen)


def _raise_failures(failures: list[GroupFailure], describe: Callable[[int], str]) -> None:
    """Raise for the groups whose prediction failed: a corrupt model as a
    :class:`~manymodels.StoreIntegrityError`, a value a model refused as a
    ``ValueError`` naming its column, any other failure as a
    ``RuntimeError`` (the error's message first, then the worker's traceback)."""
    corrupt = [f for f in failures if f.corrupt]
    if corrupt:
        others = f" (and {len(corrupt) - 1} other group(s))" if len(corrupt) > 1 else ""
        raise StoreIntegrityError(f"predicting group {describe(corrupt[0].group)}{others}: "
                                  + corrupt[0].error)
    if failures and failures[0].refused:
        raise ValueError(f"predicting group {describe(failures[0].group)}: {failures[0].error}")
    if failures:
        raise RuntimeError(f"predicting group {describe(failures[0].group)} failed: "
                           f"{failures[0].error}")


def _column_names(names: str | list[str] | None) -> list[str] | None:
    return None if names is None else [names] if isinstance(names, str) else list(names)


def _check_columns_argument(argument: str, names: Any) -> None:
    """Refuse ``by=`` or ``features=`` that is not a column name or a list
    of them (a set, a number: read as other columns, or letter by letter)."""
    if names is not None and not (isinstance(names, str) or (
            isinstance(names, (list, tuple)) and names and all(isinstance(c, str)
                                                               for c in names))):
        raise TypeError(f"{argument} must be a column name or a list of them, got {names!r}")


def predict_from_store(store: Any, table: Any, by: str | list[str] | None, method: str,
                       features: list[str] | None, run: int | None, fallback: bool,
                       with_source: bool, *, fn: Callable[[Any, Any], Any] | None,
                       backend: str | None, workers: int | None, progress: bool) -> Any:
    """:meth:`manymodels.Store.predict`: each group's rows through its model."""
    import pandas as pd

    from ..engine.options import check_switch
    from ..inputs.engineframes import engine_of, refuse_engine_frame
    from ..inputs.filereads import separator_hint
    from ..inputs.tables import exact_pandas, read_table

    check_switch("with_source", with_source)
    check_switch("fallback", fallback)
    _check_columns_argument("by", by)
    _check_columns_argument("features", features)
    if not isinstance(method, str):
        raise TypeError(f"method must be the name of the models' method, such as "
                        f"'predict', got {method!r}")
    run_id, run_keys, _ = store._run_row(run, ended=True)
    linear = store._linear_run(run_id)
    if linear is not None:  # (refused before any work, as the engine's table is)
        refuse_engine_frame(table, "predict's table", "an mm.linear run predicts its rows "
                            "on the driver, vectorised")
    # an mm.linear run records no train_config nor selection: its by is its key columns;
    # else run_id's (with no run=, the latest run that has ended, whose models are
    # read: a run still being written has no train_config yet)
    config = {} if linear is not None else store.attached("train_config", run_id,
                                                          default={}) or {}
    chosen = None if linear is not None else store._selection(run)
    asked = _column_names(by)
    # the columns the run's models are keyed by: a selection's groups, else the
    # run's own key columns (a grid's settings among them)
    trained = _column_names(config.get("by") or (chosen or {}).get("by")) or list(run_keys)
    if asked is not None and asked != trained:
        if sorted(asked) != sorted(trained):  # (other columns: other groups' models)
            raise ValueError(f"by={by!r}, but the models of run {run_id} are keyed by "
                             f"{trained!r}: no row could find its group's model (rename the "
                             "columns of the table to predict, leave by= out, or name "
                             "another run with run=)")
        asked = trained  # the same columns in another order: the keys are made in the run's
    by_columns = asked or trained
    if linear is not None:  # an mm.linear run: its result predicts, vectorised
        from ..models.linear.stored import predict_frame

        return predict_frame(store, linear, table, method, with_source,
                             features=_column_names(features), fn=fn)
    features = _column_names(features) or config.get("features")
    if fn is not None and not callable(fn):
        raise TypeError(f"fn must be a function of (model, rows), got {fn!r}")
    artifacts = chosen["artifacts"] if chosen else store._model_artifacts(run)
    backup = store._latest_attached_digest("fallback", run) if fallback else None
    if engine_of(table) is not None:  # its engine groups and predicts: nothing collected
        from .enginepredict import predict_engine_frame

        predicted = predict_engine_frame(store, table, GroupPredictor(
            by_columns, features, method, fn, backup), artifacts, with_source)
        # which groups the table holds is not known here (its engine predicts them
        # later): the run's failed groups the fallback would answer, said once
        fell = "" if backup is None else failed_to_fallback(store, run, by_columns,
                                                            list(run_keys), artifacts)
        if fell:
            warnings.warn(f"store {str(store)!r}{'' if run is None else f' of run {run}'}: "
                          f"{fell}", RuntimeWarning, stacklevel=2)
        return predicted
    frame = table if isinstance(table, pd.DataFrame) else exact_pandas(read_table(table))
    if frame.empty:
        raise ValueError("the table to predict has no rows")
    missing = [c for c in by_columns + list(features or []) if c not in frame.columns]
    if missing:
        raise ValueError(f"column {missing[0]!r} is not in the table to predict; its columns "
                         f"are {[str(c) for c in frame.columns]}"
                         + separator_hint(list(frame.columns)))
    routed = predict_groups(store, frame, by_columns, artifacts, backup, features=features,
                            method=method, fn=fn, backend=backend, workers=workers,
                            progress=progress)
    where = "" if run is None else f" of run {run}"
    why = "" if not routed.unseen else without_model(store, run, by_columns, list(run_keys),
                                                     routed.unseen)
    if routed.values is None:
        raise ValueError(
            f"no row of the table has a model in store {str(store)!r}{where}: none "
            f"of its {len(routed.unseen)} group(s) by {by_columns} (e.g. "
            f"{routed.unseen[:3]!r}) was trained ok, and there is no fallback model"
            + (f"; {why}" if why else ""))
    if routed.unseen:
        warnings.warn(
            f"{int((routed.origin == NONE).sum())} row(s) of {len(routed.unseen)} "
            f"group(s) have no model in store {str(store)!r}{where} and no fallback: "
            "their prediction is NaN; " + (why or f"e.g. {routed.unseen[:3]!r}")
            + near_keys(routed.unseen, artifacts, len(by_columns)),
            RuntimeWarning, stacklevel=2)
    fell = answered_by_fallback(store, run, by_columns, list(run_keys), routed.fallen)
    if fell:  # (a group never trained going to the fallback: what it is for, not said)
        warnings.warn(f"store {str(store)!r}{where}: {fell}", RuntimeWarning, stacklevel=2)
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
