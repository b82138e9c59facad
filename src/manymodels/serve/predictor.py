"""One request's rows through their groups' models, as ``Store.predict``
predicts them: the same routing (each row to its group's model, else the
fallback, else none) and the same call of each model
(:class:`manymodels.run.grouppredictor.GroupPredictor`, whose loads come from the
server's bounded cache instead of a per-worker dict).

A request is checked whole before any model runs: every group's model is
found and loaded (a tampered one refused by name), and every column each
reads is there in each of its rows (a row without a model needs none); only
then do the models predict.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..inputs.keys import encode_key
from ..run.grouppredictor import CORRUPT, GroupPredictor, PredictionShapeError
from ..store import StoreIntegrityError
from .cache import ModelCache, NotHeld
from .catalog import Catalog, KeyTextError, shown_key, temporal, temporal_key
from .state import log

#: Rows grouped in a Python loop below this; pandas' groupby above it.
_LOOP_BELOW = 256


class RequestError(Exception):
    """A request refused before any model ran: its HTTP status and why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class Answer:
    """Per input row, in row order: the prediction and what answered it."""

    predictions: list[Any]
    source: list[str]
    run_id: int


class _ServedPredictor(GroupPredictor):
    """``GroupPredictor`` whose models come from the server's cache, pinned
    for the request: an eviction by another request cannot unload a model
    this one was checked against."""

    def __init__(self, catalog: Catalog, cache: ModelCache) -> None:
        super().__init__(catalog.by, catalog.features, "predict", None, catalog.fallback)
        self.cache, self.pinned = cache, {}

    def _model(self, store: Any, digest: str, what: str) -> Any:
        model = self.pinned.get(digest)
        if model is None:
            model = self.pinned[digest] = self.cache.get(store, digest, what)
        return model


def predict_rows(catalog: Catalog, cache: ModelCache, columns: Mapping[str, Any], n: int,
                 ordered: bool = True, held_only: bool = False) -> Answer:
    """``columns`` (name -> n values, in the request's column order) through
    ``catalog``'s models, read from the store it was read from.
    ``ordered``: whether the columns' order is the client's (an Arrow
    stream's; a JSON object's keys have none).
    ``held_only``: use only the models the cache holds and that predict
    quickly (:meth:`~.cache.ModelCache.quick`), raising
    :class:`~.cache.NotHeld` (before any model runs) where one is not.
    Raises :class:`RequestError` for what the request got wrong,
    :class:`~manymodels.StoreIntegrityError` for a tampered model."""
    partial = getattr(columns, "partial", {})
    missing = [c for c in catalog.by if c not in columns or c in partial]
    if missing:
        raise _missing(columns, missing[0], " (a group column)")
    if catalog.linear is not None:
        return _predict_linear(catalog, columns, n)
    groups = [(parts, rows, *catalog.find(parts))
              for parts, rows in _group_rows(_key_values(catalog, columns, held_only), n)]
    if held_only and not cache.quick([digest for *_, digest, _ in groups if digest]):
        raise NotHeld("a model of the request is not loaded yet, or is slow to predict")
    fell = [parts for parts, _, _, source in groups if source == "fallback"]
    if fell and held_only and not catalog.failures_known:
        raise NotHeld("the groups that failed in training are not read yet")
    for parts in fell:  # a group that failed in training: logged once a group and run
        said = catalog.fallback_for_failed(parts)
        if said:
            log.warning("%s (of %s)", said, catalog.store)
    predictor = _ServedPredictor(catalog, cache)
    store = catalog.store
    plan = []
    for parts, rows, digest, source in groups:
        lacking = _lacking(partial, rows)
        if digest is not None:
            named = f"key {shown_key(parts)}"
            what = named if source != "fallback" else f"the fallback model (asked for {named})"
            model = predictor._model(store, digest, what)
            _check_features(predictor, model, columns, ordered, rows, lacking)
        plan.append((parts, rows, digest, source, lacking))
    return _run_plan(catalog, predictor, store, columns, plan, n)


def _timed_call(predictor: _ServedPredictor, digest: str, *args: Any) -> Any:
    """``predictor(*args)``, its time noted against the model ``digest``
    (whether a later request may be answered on the event loop)."""
    started = time.perf_counter()
    done = predictor(*args)
    predictor.cache.timed(digest, time.perf_counter() - started)
    return done


def _lacking(partial: Mapping[str, np.ndarray], rows: Any) -> dict[str, bool]:
    """The columns some of ``rows`` lack (JSON rows), each -> whether all do."""
    if not partial:
        return {}
    rows = np.asarray(rows)
    found = {}
    for name, mask in partial.items():
        lacks = mask[rows]
        if lacks.any():
            found[name] = bool(lacks.all())
    return found


def _run_plan(catalog: Catalog, predictor: _ServedPredictor, store: Any,
              columns: Mapping[str, Any], plan: list, n: int) -> Answer:
    predictions: list[Any] = [None] * n
    source = ["none"] * n
    for parts, rows, digest, origin, lacking in plan:
        if digest is None:
            continue
        group = {name: _take(values, rows) for name, values in columns.items()
                 if name not in lacking}
        key = parts if len(parts) > 1 else parts[0]
        try:
            done = _timed_call(predictor, digest, group, {encode_key(parts): digest}
                               if origin != "fallback" else {}, store, key)
        except PredictionShapeError:  # the model's fault: a 500, said and counted
            raise
        except (ValueError, TypeError, OverflowError) as exc:  # the rows' values, refused
            raise RequestError(400, f"the model of group {shown_key(parts)} refused its rows: "
                                    f"{exc}") from exc
        if isinstance(done, dict) and done.get("source") == CORRUPT:
            raise StoreIntegrityError(done["error"])
        values = done[0]
        listed = values.tolist() if isinstance(values, np.ndarray) else list(values)
        for position, value in zip(rows, listed):
            predictions[position] = _json_value(value)
            source[position] = origin
    return Answer(predictions, source, catalog.run_id)


def _check_features(predictor: GroupPredictor, model: Any, columns: Mapping[str, Any],
                    ordered: bool, rows: Any, lacking: Mapping[str, bool]) -> None:
    """Every column ``model`` reads is in each of its ``rows`` (the names
    ``GroupPredictor`` would give it; ``lacking``: the columns some of them
    lack -> whether all do). A model that names no features, of a run that
    recorded none, reads every column of its rows but the group's, in the
    request's order: a column only some of them have is refused, and so,
    for JSON rows, is more than one such column (the answer would depend on
    the order of the keys)."""
    names = predictor.features or list(getattr(model, "feature_names_in_", []))
    missing = [c for c in names if c not in columns or c in lacking]
    if missing:
        raise _missing(columns, missing[0], ", a feature of their group's model", rows)
    partly = [c for c, every in lacking.items() if not every]
    if not names and partly:
        raise _missing(columns, partly[0], ", a feature of their group's model", rows)
    if not names and not ordered:
        others = [c for c in columns if c not in predictor.by and c not in lacking]
        if len(others) > 1:
            raise RequestError(422, f"the rows' columns {others} are fed to a model that "
                                    "names no features in their order, and a JSON object's "
                                    "keys have none: send an Arrow IPC stream (its columns "
                                    "keep their order), or train from a DataFrame or with "
                                    "features named")


def _missing(columns: Mapping[str, Any], name: str, what: str,
             rows: Any = None) -> RequestError:
    """Column ``name`` missing from the rows, or from some of them (JSON
    rows): the first of ``rows`` (default: all) that lacks it is named."""
    mask = getattr(columns, "partial", {}).get(name)
    if mask is not None:
        among = np.arange(len(mask)) if rows is None else np.asarray(rows)
        row = int(among[mask[among]][0])
        return RequestError(422, f"row {row} has no column {name!r}{what}")
    return RequestError(422, f"the rows have no column {name!r}{what}")


def _key_values(catalog: Catalog, columns: Mapping[str, Any],
                held_only: bool = False) -> list[Any]:
    """The rows' group columns, as their models' keys are read: text in a
    column of datetimes or dates as ISO-8601 (JSON has neither), refused by
    column and row where it is not one. ``held_only``: raise
    :class:`~.cache.NotHeld` where the catalog's key kinds are to be read
    first (on the event loop, that read would hold up every request)."""
    found = []
    for name, kinds in zip(catalog.by, _kinds_if_text(catalog, columns, held_only)):
        values = columns[name]
        if kinds is not None and temporal(kinds):
            read = np.empty(len(values), dtype=object)
            for row, value in enumerate(values):
                try:
                    read[row] = temporal_key(value, kinds, name) if isinstance(
                        value, str) else value
                except KeyTextError as exc:
                    raise RequestError(422, f"row {row}: {exc}") from exc
            values = read
        found.append(values)
    return found


def _kinds_if_text(catalog: Catalog, columns: Mapping[str, Any],
                   held_only: bool = False) -> list[Any]:
    """Each group column's kinds (:attr:`Catalog.key_kinds`) where the rows
    give it text, else None: the kinds are read once a catalog, and only
    then (with ``held_only``, not here: :class:`~.cache.NotHeld`)."""
    texts = [isinstance(values, np.ndarray) and values.dtype == object and any(
        type(value) is str for value in values) for values in map(columns.get, catalog.by)]
    if not any(texts):
        return [None] * len(texts)
    if held_only and not catalog.kinds_known:
        raise NotHeld("the catalog's key kinds are not read yet")
    return [kinds if text else None for kinds, text in zip(catalog.key_kinds, texts)]


def _group_rows(key_columns: list[Any], n: int) -> list[tuple[tuple, Any]]:
    """Each group's key parts and its rows' positions, groups in order of
    first row. Values of different types are different groups (``True``,
    ``1`` and ``1.0`` are equal in Python and in pandas): each row is looked
    up by its own value, as it would be alone."""
    if n < _LOOP_BELOW:
        groups: dict[tuple, tuple[tuple, list[int]]] = {}
        lists = [c.tolist() if isinstance(c, np.ndarray) else c for c in key_columns]
        for position, parts in enumerate(zip(*lists)):
            groups.setdefault((parts, tuple(map(type, parts))), (parts, []))[1].append(position)
        return list(groups.values())
    import pandas as pd

    # grouped by codes: pandas would make an object column of ints and a null floats;
    # an object column's values also by their types (pandas holds True == 1 == 1.0)
    codes = [pd.factorize(c, use_na_sentinel=False)[0] for c in key_columns]
    codes += [pd.factorize(pd.Series(c).map(type), use_na_sentinel=False)[0]
              for c in key_columns if _of_several_types(c)]
    found = pd.DataFrame(dict(enumerate(codes))).groupby(list(range(len(codes))),
                                                          sort=False).indices
    return [(tuple(_item(values[rows[0]]) for values in key_columns), rows)
            for rows in found.values()]


def _of_several_types(values: Any) -> bool:
    """Whether an object column holds values of several types (``True``
    beside ``1``): one pass in C, so that a column of text keys, the usual
    case, is not typed value by value."""
    import pandas as pd

    return (isinstance(values, np.ndarray) and values.dtype == object
            and pd.api.types.infer_dtype(values, skipna=True).startswith("mixed"))


def _item(value: Any) -> Any:
    """A NumPy scalar as Python's (as ``tolist()`` gives it)."""
    return value.item() if isinstance(value, np.generic) else value


def _take(values: Any, rows: Any) -> np.ndarray:
    return values[np.asarray(rows)] if isinstance(values, np.ndarray) else np.asarray(
        [values[i] for i in rows])


def _json_value(value: Any) -> Any:
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, list):
        return [_json_value(v) for v in value]
    return value


def _predict_linear(catalog: Catalog, columns: Mapping[str, Any], n: int) -> Answer:
    """An mm.linear run: its coefficient arrays, all rows at once. Only the
    rows of a group with a model need its features: the others are answered
    ``"none"``, as for any run."""
    import pandas as pd

    result = catalog.linear
    groups = _linear_groups(result, columns, n)
    seen = groups >= 0
    modelled = np.flatnonzero(seen)
    partial = getattr(columns, "partial", {})
    for name in result.features:
        lacking = name not in columns or (name in partial and partial[name][modelled].any())
        if lacking and len(modelled):
            raise _missing(columns, name, ", a feature of their group's model", modelled)
    predictions: list[Any] = [None] * n
    if len(modelled):
        # the groups found above (keys of several types looked up apart:
        # one table cannot hold true beside 1, which both find 1's model)
        frame = pd.DataFrame({name: _take(columns[name], modelled)
                              for name in result.features})
        try:
            values = result.predict_groups(groups[modelled], frame)
        except (ValueError, TypeError) as exc:
            raise RequestError(400, f"the rows' values were refused: {exc}") from exc
        for position, value in zip(modelled.tolist(), values.tolist()):
            predictions[position] = _json_value(value)
    return Answer(predictions, np.where(seen, "group", "none").tolist(), catalog.run_id)


def _linear_groups(result: Any, columns: Mapping[str, Any], n: int) -> np.ndarray:
    """Each row's group number in an mm.linear ``result`` (-1: none). Rows
    whose group columns hold values of different types (true beside 1, text
    beside a number) are looked up apart: such a column is not one Arrow
    type, and pandas holds True == 1. Each row as it would be alone."""
    import pandas as pd

    keys = {name: columns[name] for name in result.by}
    kinds = [pd.factorize(pd.Series(values).map(type))[0] for values in keys.values()
             if _of_several_types(values)]
    pattern = (pd.DataFrame(dict(enumerate(kinds))).groupby(list(range(len(kinds))),
                                                            sort=False).ngroup().to_numpy()
               if kinds else np.zeros(n, dtype=np.int64))
    found = np.full(n, -1, dtype=np.int64)
    for kind in np.unique(pattern).tolist():
        rows = np.flatnonzero(pattern == kind)
        whole = len(rows) == n
        try:
            found[rows] = result.group_of(pd.DataFrame(
                {name: values if whole else _take(values, rows) for name, values in keys.items()}))
        except (ValueError, TypeError, OverflowError) as exc:
            named = _unreadable(keys)
            raise RequestError(400, f"group column {named!r} holds a value that cannot be read "
                                    f"as a key: {exc}" if named else
                                    f"the rows' group columns {list(keys)} were refused: "
                                    f"{exc}") from exc
    return found


def _unreadable(keys: Mapping[str, Any]) -> str | None:
    """The first group column Arrow cannot read (a whole number past 64 bits,
    values of several types), if one."""
    import pyarrow as pa

    for name, values in keys.items():
        try:
            pa.array(list(values), from_pandas=True)
        except (pa.ArrowException, ValueError, TypeError, OverflowError):
            return name
    return None
