"""One group's prediction by its stored model: load it (once per worker),
check what it is given, call it and shape its answer.

:class:`GroupPredictor` is what every way of predicting from a store calls
for a group: :mod:`.prediction` in chunks on the engine, :mod:`.enginepredict`
on an engine's own workers, and the server (:mod:`manymodels.serve.predictor`);
it calls only the checks of :mod:`.predictchecks` and the model call of
:mod:`.predictchunks`, never back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..inputs.keys import encode_key
from ..store.database import StoreIntegrityError
from ..store.lazymodels import StoredModel
from .predictchecks import check_feature_order, refusal
from .predictchunks import call_model

#: A group's ``source`` when its stored model failed its SHA-256 check: the
#: driver raises :class:`~manymodels.StoreIntegrityError` (a task's exception
#: reaches the driver as text, and a tampered model is no ordinary failure).
CORRUPT = "corrupt"
class PredictionShapeError(ValueError):
    """A model gave not one prediction per row: the model's fault, not its
    rows' (a server answers it 500, where a value its rows hold that the
    model refuses is the request's fault, 400)."""


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
            model = self._models[digest] = StoredModel(store, digest, what).load()
        return model

    def __call__(self, rows: Any, artifacts: dict[str, str], resource: Any, key: Any) -> Any:
        # rows: the group's columns as NumPy arrays, or (with fn) a DataFrame;
        # key: the group's key as the driver planned it (artifacts' keys are
        # those), not as this worker reads it from its rows
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
        return self.values(model, rows, key), {"source": origin}

    def feature_names(self, model: Any, columns: Any) -> list[str]:
        """The columns ``model`` is given: ``features``, else the model's
        ``feature_names_in_``, else every column of ``columns`` but the keys."""
        return self.features or list(getattr(model, "feature_names_in_", [])) or [
            c for c in columns if c not in self.by]

    def check_model(self, model: Any, columns: Any, named: str) -> list[str]:
        """The columns ``model`` (the model of ``named``) is given
        (:meth:`feature_names`). Refuses, naming the column or the method,
        what it cannot predict: a feature it was fitted on that is not among
        ``columns``, ``features`` other than a scikit-learn model's
        ``feature_names_in_`` (in their order), or a ``method`` it lacks.
        Checked on one model before any group runs, and on each group's own
        model, so that the error
        says what is wrong rather than the model's ``KeyError`` deep in a
        traceback."""
        if not callable(getattr(model, self.method, None)):
            raise ValueError(f"method={self.method!r}, but the model of {named} "
                             f"({type(model).__name__}) has no method {self.method!r}")
        names = self.feature_names(model, columns)
        check_feature_order(model, self.features, named)
        missing = [c for c in names if c not in columns]
        if missing:
            raise ValueError(f"column {missing[0]!r} is not in the table to predict: the "
                             f"model of {named} was fitted with it (its features: {names!r})")
        _check_unnamed_count(model, names, named)
        return names

    def values(self, model: Any, rows: Any, key: Any) -> np.ndarray:
        """``model``'s predictions of one group's ``rows`` (``key``: its key
        parts, for the message when their number is wrong)."""
        n = len(rows[self.by[0]]) if isinstance(rows, dict) else len(rows)
        if self.fn is not None:
            values = self.fn(model, rows)
        else:
            named = f"group {key[0] if len(key) == 1 else key!r}"
            names = self.check_model(model, rows, named)
            try:
                values = call_model(model, self.method, rows, names)
            except Exception as exc:  # a value it refuses: said naming its column
                refused = refusal(exc, rows, names, model)
                if refused is None:
                    raise
                raise refused from exc
        values = _row_values(values, rows)
        if values.ndim == 0:
            raise PredictionShapeError(f"the prediction of group {key!r} is one value "
                                       f"({values!r}), not one for each of its {n} rows")
        if len(values) != n:
            raise PredictionShapeError(f"the prediction of group {key!r} has {len(values)} "
                                       f"rows for its {n} rows")
        if values.ndim == 2 and values.shape[1] == 1 and self.method == "predict":
            values = values[:, 0]  # a column (a model fitted on a one-column frame's y)
        return values


def _check_unnamed_count(model: Any, names: list[str], named: str) -> None:
    """Refuse columns ``names`` for a model fitted on arrays (``n_features_in_``
    without ``feature_names_in_``) when their number is not its: it reads
    them by position, so an extra column (the target left in the table)
    failed deep in a matrix product, or in its own check, in every group."""
    count = getattr(model, "n_features_in_", None)
    if (not isinstance(count, (int, np.integer)) or len(names) == count
            or getattr(model, "feature_names_in_", None) is not None):
        return
    raise ValueError(f"the model of {named} was fitted on {count} unnamed feature column(s) "
                     f"(arrays, no feature_names_in_), but the table to predict gives "
                     f"{len(names)}: {names!r}; give it just its {count}, in the order it was "
                     "fitted on (it reads them by position; Store.predict's features= "
                     "names them)")


def _row_values(values: Any, rows: Any) -> np.ndarray:
    """A prediction as an array in the order of ``rows``: a pandas Series
    (or a one-column frame) whose labels are the rows' own, in another order
    (a forecaster that sorted them by time), is put back in the rows'
    order, as pandas would align it; any other, by position."""
    import pandas as pd

    if isinstance(values, pd.DataFrame) and values.shape[1] == 1:
        values = values.iloc[:, 0]
    if isinstance(values, pd.Series) and isinstance(rows, pd.DataFrame) and not (
            values.index.equals(rows.index)) and values.index.is_unique and len(
            values) == len(rows) and values.index.isin(rows.index).all():
        values = values.reindex(rows.index)
    return np.asarray(values)
