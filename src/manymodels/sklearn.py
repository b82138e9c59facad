"""A scikit-learn estimator that fits one model per group: ``GroupedEstimator``.

For people who think in ``fit``/``predict``: ``GroupedEstimator(Ridge(),
by="store")`` behaves as one estimator (``clone``, ``Pipeline``,
``GridSearchCV`` work) while manymodels fits a clone of ``Ridge()`` per store
in parallel. Rows of groups that were too small, that failed, or that were
never seen in ``fit`` go to a fallback model.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import BaseEstimator, MetaEstimatorMixin, clone, is_classifier
from sklearn.metrics import accuracy_score, r2_score
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_array, check_is_fitted, column_or_1d

from .keys import encode_key, key_parts
from .routing import group_positions, route_rows
from .tables import plain_scalar

_Y = "__manymodels_target__"
_GROUP = "__manymodels_group__"


def _fit_group(df: pd.DataFrame, estimator: Any, features: list, as_frame: bool) -> Any:
    X = df[features] if as_frame else df[features].to_numpy()
    return clone(estimator).fit(X, df[_Y].to_numpy())


def _plain_key(key: Any) -> Hashable:
    """A group key with NumPy scalars as Python values (as keys are stored)."""
    if isinstance(key, tuple):
        return tuple(plain_scalar(v) for v in key)
    return plain_scalar(key)


def _as_pandas_if_table(X: Any) -> Any:
    """polars and Arrow tables (which ``mm.groups`` accepts) as pandas frames."""
    module = type(X).__module__
    if (module.startswith("polars") or module.startswith("pyarrow")) and hasattr(
            X, "to_pandas"):
        return X.to_pandas()
    return X


class GroupedEstimator(MetaEstimatorMixin, BaseEstimator):
    """One clone of ``estimator`` per group of rows, with a fallback model.

    Parameters
    ----------
    estimator : a scikit-learn estimator, cloned for every group.
    by : the column(s) naming a row's group: names for a DataFrame, positions
        for an array. They are not passed to the per-group models.
    fallback : ``"global"`` (a clone of ``estimator`` fitted on all rows), an
        estimator (fitted on all rows), or ``"error"`` (predicting an unseen
        group raises). Used for unseen groups, groups smaller than
        ``min_group_size`` and groups whose fit failed.
    min_group_size : groups with fewer rows use the fallback.
    backend, workers : passed to :func:`manymodels.train`.

    Attributes
    ----------
    models_ : dict of group key -> fitted estimator.
    fallback_ : the fitted fallback, or None.
    group_sizes_ : dict of group key -> rows seen in ``fit``.
    failed_ : DataFrame of the groups whose fit failed (key, error).
    classes_ : for classifiers, every class seen in ``fit``.
    """

    def __init__(
        self,
        estimator: Any = None,
        by: str | int | Sequence[str] | Sequence[int] = 0,
        fallback: Any = "global",
        min_group_size: int = 1,
        backend: str = "processes",
        workers: int | None = None,
    ) -> None:
        self.estimator = estimator
        self.by = by
        self.fallback = fallback
        self.min_group_size = min_group_size
        self.backend = backend
        self.workers = workers

    # -- input handling ------------------------------------------------------------

    def _by_list(self) -> list:
        return list(self.by) if isinstance(self.by, (list, tuple)) else [self.by]

    def _allow_nan(self) -> bool:
        try:
            return bool(self.estimator.__sklearn_tags__().input_tags.allow_nan)
        except AttributeError:
            return False

    def _split(self, X: Any, fitting: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(key columns, feature columns) of X, checked against ``by``. Key
        columns may hold anything hashable (strings in an object array);
        feature columns get scikit-learn's own checks when X is an array."""
        by = self._by_list()
        X = _as_pandas_if_table(X)
        as_frame = isinstance(X, pd.DataFrame)
        if as_frame:
            frame = X
        else:
            array = None if hasattr(X, "toarray") else np.asarray(X)
            if array is None or array.ndim != 2:
                # scikit-learn's own message for 1-D, 0-D and sparse input
                check_array(X, dtype="numeric", ensure_all_finite=not self._allow_nan())
            keys_at = [b for b in by if isinstance(b, (int, np.integer))
                       and not isinstance(b, bool) and 0 <= b < array.shape[1]]
            if array.dtype.kind != "O":  # numeric: keys are checked as features are
                keys_at = []
            rest = [i for i in range(array.shape[1]) if i not in keys_at]
            if not rest:  # only key columns: scikit-learn's message for too few features
                check_array(array, dtype=None, ensure_min_features=len(by) + 1 if fitting else 1)
            checked = check_array(  # scikit-learn's checks of the features: numeric, finite
                array[:, rest], dtype="numeric",
                ensure_min_features=len(by) + 1 - len(keys_at) if fitting else 1,
                ensure_all_finite=not self._allow_nan()) if rest else array[:, :0]
            frame = pd.DataFrame(checked, columns=rest)
            for position in keys_at:
                column = array[:, position]
                if column.dtype.kind == "O":
                    bad = next((v for v in column if not isinstance(v, Hashable)
                                or isinstance(v, (dict, list, set))), None)
                    if bad is not None:
                        raise TypeError(f"by column {position}: a group key argument must be "
                                        f"a string or a number, got {type(bad).__name__}")
                frame[position] = column
            frame = frame[list(range(array.shape[1]))]
        if not fitting and frame.shape[1] != self.n_features_in_:
            raise ValueError(f"X has {frame.shape[1]} features, but GroupedEstimator is "
                             f"expecting {self.n_features_in_} features as input")
        missing = [b for b in by if b not in frame.columns]
        if missing:
            where = "columns" if as_frame else f"{frame.shape[1]} column positions"
            raise ValueError(f"by column {missing[0]!r} is not among X's {where}")
        features = [c for c in frame.columns if c not in by]
        if not features:
            raise ValueError("X has no feature columns besides the by columns")
        if fitting:
            self._as_frame = as_frame
            self.n_features_in_ = frame.shape[1]
            if as_frame:
                self.feature_names_in_ = np.asarray(frame.columns, dtype=object)
        return frame[by], frame[features]

    @staticmethod
    def _keys(keys: pd.DataFrame) -> list[Hashable]:
        if keys.shape[1] == 1:
            return [_plain_key(v) for v in keys.iloc[:, 0]]
        return [_plain_key(row) for row in keys.itertuples(index=False, name=None)]

    # -- fit -----------------------------------------------------------------------

    def fit(self, X: Any, y: Any) -> GroupedEstimator:
        import manymodels as mm

        if self.estimator is None:
            raise ValueError("GroupedEstimator needs an estimator, e.g. "
                             "GroupedEstimator(Ridge(), by='store')")
        if not isinstance(self.min_group_size, (int, np.integer)) or self.min_group_size < 1:
            raise ValueError(f"min_group_size must be an integer >= 1, "
                             f"got {self.min_group_size!r}")
        if not (self.fallback in ("global", "error") or hasattr(self.fallback, "fit")):
            raise ValueError(f"fallback must be 'global', 'error' or an estimator, "
                             f"got {self.fallback!r}")
        if y is None:
            raise ValueError("GroupedEstimator requires y to be passed, but the target y "
                             "is None")
        keys, features = self._split(X, fitting=True)
        y = column_or_1d(y, warn=True)
        if y.dtype.kind in "fc":  # scikit-learn's message for NaN or inf in y
            check_array(y, ensure_2d=False, dtype=None, input_name="y")
        if len(y) != len(features):
            raise ValueError(f"X has {len(features)} rows but y has {len(y)}")
        if len(y) == 0:
            raise ValueError("cannot fit on 0 samples")
        if is_classifier(self.estimator):
            self.classes_ = np.unique(y)

        group_keys = self._keys(keys)
        codes, uniques = pd.factorize(pd.Series(group_keys, dtype=object), use_na_sentinel=False)
        key_of = list(uniques)
        sizes = np.bincount(codes, minlength=len(key_of))
        self.group_sizes_ = {key_of[i]: int(n) for i, n in enumerate(sizes)}
        table = features.copy()
        table.columns = list(range(features.shape[1])) if not self._as_frame else table.columns
        feature_columns = list(table.columns)
        table[_Y] = y
        table[_GROUP] = codes
        table = table[sizes[codes] >= self.min_group_size]

        self.models_ = {}
        failures = []
        if len(table):
            run = mm.train(
                _fit_group, mm.groups(table, by=_GROUP),
                shared={"estimator": self.estimator, "features": feature_columns,
                        "as_frame": self._as_frame},
                backend=self.backend, workers=self.workers, progress=False)
            for code, model in run.models.items():
                self.models_[key_of[code]] = model
            for _, row in run.failed.iterrows():
                failures.append({"group": key_of[row[_GROUP]], "error": row["error"]})
        self.failed_ = pd.DataFrame(failures, columns=["group", "error"])
        if failures and not self.models_:
            raise RuntimeError(
                f"every group's fit failed ({len(failures)} groups); the first error:\n"
                f"{failures[0]['error']}")
        if failures:
            warnings.warn(f"{len(failures)} group(s) failed to fit and use the fallback; "
                          "see failed_", RuntimeWarning, stacklevel=2)

        self.fallback_ = None
        if self.fallback != "error":
            prototype = self.estimator if self.fallback == "global" else self.fallback
            X_all = features if self._as_frame else features.to_numpy()
            self.fallback_ = clone(prototype).fit(X_all, y)
        elif not self.models_:
            raise ValueError("no group could be fitted and fallback='error'")
        return self

    # -- predict -------------------------------------------------------------------

    def _route(self, X: Any, method: str) -> np.ndarray:
        check_is_fitted(self, "models_")
        keys, features = self._split(X, fitting=False)
        X_feat = features if self._as_frame else features.to_numpy()

        by_code = {encode_key(key_parts(k)): m for k, m in self.models_.items()}

        def model_of(key: Hashable) -> tuple[Any, str] | None:
            model = by_code.get(encode_key(key_parts(key)))  # one encoding: NaN finds NaN
            if model is not None:
                return model, "group"
            return None if self.fallback_ is None else (self.fallback_, "fallback")

        def call(model: Any, rows: np.ndarray) -> np.ndarray:
            part = X_feat.iloc[rows] if self._as_frame else X_feat[rows]
            values = np.asarray(getattr(model, method)(part))
            return self._align_proba(model, values) if method == "predict_proba" else values

        routed = route_rows(group_positions(keys), len(keys), model_of, call)
        if routed.unseen:
            raise ValueError(f"no model for group(s) {routed.unseen[:5]!r} and "
                             "fallback='error'")
        return routed.values

    def _align_proba(self, model: Any, proba: np.ndarray) -> np.ndarray:
        full = np.zeros((len(proba), len(self.classes_)))
        columns = np.searchsorted(self.classes_, model.classes_)
        full[:, columns] = proba
        return full

    def predict(self, X: Any) -> np.ndarray:
        """Each row predicted by its group's model (or the fallback)."""
        return self._route(X, "predict")

    @available_if(lambda self: hasattr(self.estimator, "predict_proba"))
    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities, columns in the order of ``classes_``."""
        return self._route(X, "predict_proba")

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy for classifiers, R^2 for regressors."""
        prediction = self.predict(X)
        if is_classifier(self.estimator):
            return float(accuracy_score(y, prediction, sample_weight=sample_weight))
        return float(r2_score(y, prediction, sample_weight=sample_weight))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        if self.estimator is not None:
            inner = self.estimator.__sklearn_tags__()
            tags.estimator_type = inner.estimator_type
            tags.classifier_tags = inner.classifier_tags
            tags.regressor_tags = inner.regressor_tags
            tags.target_tags.required = True
            tags.input_tags.sparse = False
            tags.input_tags.allow_nan = inner.input_tags.allow_nan
        return tags
