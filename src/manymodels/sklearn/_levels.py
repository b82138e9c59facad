"""The levels of a group hierarchy: each prefix of ``by`` as a group code,
every level's rows stacked into one table (one ``train`` call fits them all),
and the blend of a chain of levels' models that shrinkage predicts with."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import clone

from ..inputs.tables import plain_scalar

Y = "__manymodels_target__"
GROUP = "__manymodels_group__"
W = "__manymodels_weight__"
#: The start of the reserved column of a routed fit parameter with a value
#: per row (:mod:`._fitparams`); the weights keep ``W``.
PARAM = "__manymodels_param_"


def fit_group(df: pd.DataFrame, estimator: Any, features: list, as_frame: bool,
              per_row: dict | None = None, constant: dict | None = None) -> Any:
    """A clone of ``estimator`` fitted on a group's rows, with each fit
    parameter of ``per_row`` (name -> (column, stacked): the weights in
    ``W``, a routed one in its ``PARAM`` column) as its rows' values and
    each of ``constant`` as it is."""
    X = df[features] if as_frame else df[features].to_numpy()
    kwargs = dict(constant or {})
    for name, (column, stacked) in (per_row or {}).items():
        values = df[column].to_numpy()
        kwargs[name] = np.stack(values) if stacked else values
    return clone(estimator).fit(X, df[Y].to_numpy(), **kwargs)


def level_codes(keys: pd.DataFrame, depth: int) -> tuple[np.ndarray, list[tuple]]:
    """Each row's group number among the prefixes of its key of length
    ``depth``, and each group's prefix (a tuple of plain values)."""
    columns = list(keys.columns[:depth])
    codes = keys.groupby(columns if depth > 1 else columns[0], sort=False,
                         dropna=False, observed=True).ngroup().to_numpy()
    first = np.unique(codes, return_index=True)[1]
    prefixes = [tuple(_one_nan(plain_scalar(v)) for v in row)
                for row in keys.iloc[first, :depth].itertuples(index=False, name=None)]
    return codes, prefixes


#: The one NaN a missing float key part is: a prefix of a deeper key must
#: find its own level's sizes and models in dicts, and two NaN objects are
#: neither equal nor (since Python 3.10) hashed alike.
_NAN = float("nan")


def _one_nan(value: Any) -> Any:
    return _NAN if isinstance(value, float) and value != value else value


def aligned(classes: np.ndarray, model: Any, scores: np.ndarray, missing: float) -> np.ndarray:
    """A model's class columns placed among ``classes`` (a group may have seen
    fewer classes; the others get ``missing``); a binary decision as two
    columns, -s and s. A model that saw one class gives it all: probability
    1 (``missing`` 0), or a decision of +inf (``missing`` -inf), whatever
    its own columns (HistGradientBoosting's are two, of a binary fit)."""
    if len(model.classes_) == 1:
        scores = np.full((len(scores), 1), 1.0 if missing == 0 else np.inf)
    elif scores.ndim == 1:
        scores = np.column_stack([-scores, scores])
    full = np.full((len(scores), len(classes)), missing)
    full[:, np.searchsorted(classes, model.classes_)] = scores
    return full


class Blend:
    """A chain of models whose predictions (a regressor's) or class
    probabilities (a classifier's, over ``classes``: a model that never saw a
    class gives it 0) are summed with fixed weights, as scikit-lego's
    HierarchicalRegressor and HierarchicalClassifier do."""

    def __init__(self, models: list, weights: np.ndarray, classes: np.ndarray | None) -> None:
        self.models, self.weights, self.classes_ = models, weights, classes

    def predict(self, X: Any) -> np.ndarray:
        return sum(w * np.asarray(m.predict(X), dtype=float)
                   for m, w in zip(self.models, self.weights))

    def predict_proba(self, X: Any) -> np.ndarray:
        return sum(w * aligned(self.classes_, m, np.asarray(m.predict_proba(X), dtype=float),
                                0.0)
                   for m, w in zip(self.models, self.weights))


def stack_levels(keys: pd.DataFrame, features: pd.DataFrame, y: np.ndarray,
                 carried: dict[str, np.ndarray], *, as_frame: bool, levels: Iterable[int],
                 min_group_size: int) -> tuple[pd.DataFrame, list, list[tuple], list[int]]:
    """Every level's groups of at least ``min_group_size`` rows in one table,
    each group numbered in ``GROUP``, with the ``carried`` columns (the
    weights', a routed parameter's: one value per row); the feature columns'
    names; each group number's prefix; and each prefix's row count."""
    table = features.copy()
    if not as_frame:
        table.columns = list(range(features.shape[1]))
    feature_columns = list(table.columns)
    table[Y] = y
    for column, values in carried.items():
        table[column] = values
    parts, key_of, sizes = [], [], []
    for level in levels:
        codes, prefixes = level_codes(keys, level)
        counts = np.bincount(codes, minlength=len(prefixes))
        keep = counts[codes] >= min_group_size
        parts.append(table[keep].assign(**{GROUP: codes[keep] + len(key_of)}))
        key_of.extend(prefixes)
        sizes.extend(int(n) for n in counts)
    stacked = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return stacked, feature_columns, key_of, sizes
