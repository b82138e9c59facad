"""What :func:`manymodels.linear` returns: every group's coefficients and
metrics as columns, and a prediction for new rows by group, vectorised."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ...inputs.keys import TypedKeys, encode_key, key_parts
from ...inputs.tables import exact_pandas, read_table
from .prepare import _column


@dataclass
class LinearResult:
    """One linear model per group, held as arrays (a million groups are a
    few arrays, not a million objects).

    ``coefficients``: the key columns, one column per feature (named as the
    feature) and ``intercept``. ``metrics``: the key columns, ``n`` (rows),
    ``status`` and, for least squares, in-sample ``r2`` and ``rmse`` (weighted
    when weights are given); for logistic, ``log_loss``, ``accuracy``,
    ``converged`` and ``iterations``. A group's ``status`` is ``ok``,
    ``rank_deficient`` (the least-norm solution, as scikit-learn's
    ``LinearRegression`` gives), ``no_weight`` (all its weights are 0: NaN
    coefficients), ``single_class`` (logistic, one class only: NaN
    coefficients, where scikit-learn refuses to fit) or ``not_converged``.
    With a store (``mm.linear(..., store=)``, or loaded by ``Store.linear``),
    ``metrics`` also has ``reused_from``: the run that fitted the group when it
    was copied from a saved result, ``<NA>`` when fitted by ``run_id`` itself.
    """

    family: str
    """``"ols"``, ``"wls"``, ``"ridge"`` or ``"logistic"``."""
    by: list[str]
    """The key columns."""
    features: list[str]
    """The feature columns, in the order of ``coef``'s columns."""
    target: str
    """The target column."""
    fit_intercept: bool
    """Whether the models have an intercept."""
    keys: pd.DataFrame
    """One row per group, its key columns: the groups' order in ``coef``."""
    coef: np.ndarray
    """The coefficients, an array of (groups, features)."""
    intercept: np.ndarray
    """The intercepts, an array of (groups,) (zeros without ``fit_intercept``)."""
    metrics: pd.DataFrame
    """One row per group: see the class's docstring."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds per step: ``prepare_s`` and ``fit_s``; with a store also
    ``hash_s``, ``load_s`` (the reused groups) and ``save_s``."""
    run_id: int | None = None
    """The store's run that saved it (``mm.linear(..., store=)``), else None."""
    _index: Any = field(default=None, repr=False)
    _why: Any = field(default=None, repr=False)  # (reason per group, text, source run)
    _typed: Any = field(default=None, repr=False)  # TypedKeys: encoded key -> group number

    def __len__(self) -> int:
        return len(self.keys)

    def __repr__(self) -> str:
        counts = {k: v for k, v in self.metrics["status"].value_counts().items() if v}
        return (f"LinearResult({self.family}, {len(self)} groups by {self.by}, "
                f"features={self.features}, status={counts})")

    @property
    def reused(self) -> int:
        """Groups copied from a saved result (``store=``) rather than fitted."""
        if "reused_from" not in self.metrics:
            return 0
        return int(self.metrics["reused_from"].notna().sum())

    @property
    def fitted(self) -> int:
        """Groups fitted by this call (all of them without a store)."""
        return len(self) - self.reused

    def why_not_reused(self, key: Any) -> str:
        """Say why group ``key`` was fitted rather than copied from the store:
        new, its rows changed, or no saved result had these options (and
        which option, or the model code, changed)."""
        where = self._key_index().get_indexer([key])[0]
        if where < 0:
            raise KeyError(f"this result has no group {key!r}")
        if self._why is None:  # not fitted with a store here: loaded from one, or none
            if self.run_id is None:
                return f"{key!r} was fitted: no store was given"
            origin = self.metrics["reused_from"].iloc[where]
            return (f"{key!r} was reused from run {origin}" if not pd.isna(origin) else
                    f"{key!r} was fitted in run {self.run_id}: its store's "
                    f"why_not_reused(key, run={self.run_id}) says why")
        reason, text, source = self._why
        code = int(reason[where])
        if code == 0:
            return f"{key!r} was reused from run {self.metrics['reused_from'].iloc[where]}"
        return f"{key!r} was fitted: " + (
            f"run {source} had no group {key!r}" if code == 1 else
            f"its rows changed since run {source}" if code == 2 else text)

    @property
    def coefficients(self) -> pd.DataFrame:
        """One row per group: its key columns, one column per feature (named
        as the feature) and ``intercept``; a table to read, where ``coef`` is
        the array the predictions use."""
        frame = self.keys.copy()
        for position, name in enumerate(self.features):
            frame[name] = self.coef[:, position]
        frame["intercept"] = self.intercept
        return frame

    def _key_index(self) -> pd.Index:
        if self._index is None:
            if len(self.by) == 1:
                self._index = pd.Index(self.keys[self.by[0]])
            else:
                self._index = pd.MultiIndex.from_frame(self.keys)
        return self._index

    def group_of(self, table: Any) -> np.ndarray:
        """Each row's group number in this result, -1 for a group it has no
        model for. A key is found as it is, or else (as ``Store.predict``
        finds an mm.train model) typed otherwise: a whole number as ``1``,
        ``1.0`` or ``"1"``, ``True`` as ``1``; a reader of a CSV or of a
        column with a missing value types them differently from the fit."""
        frame = exact_pandas(read_table(table).select(self.by))
        index = self._key_index()
        if len(self.by) == 1:
            group = index.get_indexer(_as_integers_where(frame[self.by[0]], index.dtype))
        else:
            exact = pd.DataFrame({name: _as_integers_where(frame[name], level.dtype)
                                  for name, level in zip(self.by, index.levels)})
            group = index.get_indexer(pd.MultiIndex.from_frame(exact))
        missed = group < 0
        if missed.any() and not self._typed_as_keys(frame):
            group[missed] = self._typed_groups(frame[missed])
        return group

    def _typed_as_keys(self, frame: pd.DataFrame) -> bool:
        """Whether every column of ``frame`` has its key column's own dtype
        (not objects): a key not found as it is then has no other typing that
        a stored key could have, and a million unseen keys cost no lookup."""
        kinds = [self.keys[name].dtype for name in self.by]
        return all(frame[name].dtype == kind and kind.kind != "O"
                   for name, kind in zip(self.by, kinds))

    def _typed_groups(self, frame: pd.DataFrame) -> np.ndarray:
        """The group of each row of ``frame`` (keys not found as they are)
        by the stored keys' typed lookup, each distinct key looked up once."""
        if self._typed is None:  # the keys indexed once, at the first miss
            self._typed = TypedKeys({encode_key(key_parts(key)): position
                                     for position, key in enumerate(self._key_index())})
        rows = (pd.Index(frame[self.by[0]]) if len(self.by) == 1
                else pd.MultiIndex.from_frame(frame))
        distinct = rows.unique()
        found = [self._typed.find(key_parts(key)) for key in distinct]
        groups = np.array([-1 if position is None else position for position in found],
                          dtype=np.intp)
        return groups[distinct.get_indexer(rows)]

    def decision_function(self, table: Any, unseen: str = "nan") -> np.ndarray:
        """``X @ coef + intercept`` of each row with its group's model (the
        linear predictor; for logistic, the log-odds)."""
        if unseen not in ("nan", "raise"):
            raise ValueError(f"unseen must be 'nan' or 'raise', got {unseen!r}")
        arrow = read_table(table)
        for role, names in (("by", self.by), ("feature", self.features)):
            for name in names:
                if name not in arrow.column_names:
                    raise ValueError(f"{role} column {name!r} is not in the table to predict; "
                                     f"its columns are {arrow.column_names}")
        group = self.group_of(arrow)
        missing = group < 0
        if missing.any() and unseen == "raise":
            row = int(np.flatnonzero(missing)[0])
            key = arrow.select(self.by).slice(row, 1).to_pylist()[0]
            raise KeyError(f"{int(missing.sum())} rows belong to groups with no model, the "
                           f"first (row {row}) to {key}")
        return self._linear_predictor(group, arrow)

    def _linear_predictor(self, group: np.ndarray, arrow: Any) -> np.ndarray:
        """``X @ coef + intercept`` of each row of ``arrow`` (its features)
        with the model of its group number in ``group`` (-1: NaN)."""
        missing = group < 0
        safe = np.where(missing, 0, group)
        out = self.intercept[safe]
        for position, name in enumerate(self.features):
            out = out + _column(arrow, name, "feature") * self.coef[safe, position]
        out[missing] = np.nan
        return out

    def predict_groups(self, group: np.ndarray, table: Any) -> np.ndarray:
        """As :meth:`predict`, but each row by the model of its group number
        in ``group`` (:meth:`group_of`'s; -1: NaN), ``table`` holding only
        the features: for a caller that looked the keys up itself, rows of
        several key types apart (one table cannot hold ``True`` beside
        ``1``, which both find the model of 1)."""
        arrow = read_table(table)
        for name in self.features:
            if name not in arrow.column_names:
                raise ValueError(f"feature column {name!r} is not in the table to predict; "
                                 f"its columns are {arrow.column_names}")
        return self._as_predicted(self._linear_predictor(np.asarray(group), arrow))

    def _as_predicted(self, out: np.ndarray) -> np.ndarray:
        """The linear predictor as a prediction: the class for logistic."""
        if self.family == "logistic":
            return np.where(np.isnan(out), np.nan, (out > 0).astype(np.float64))
        return out

    def predict(self, table: Any, unseen: str = "nan") -> np.ndarray:
        """Each row's prediction by its group's model, in the table's row
        order: the fitted value for least squares, the class (0.0 or 1.0) for
        logistic. A row of a group with no model is NaN (``unseen="nan"``),
        or a ``KeyError`` naming the first such group (``unseen="raise"``);
        a row of a group whose status gave NaN coefficients is NaN too."""
        return self._as_predicted(self.decision_function(table, unseen))

    def predict_proba(self, table: Any, unseen: str = "nan") -> np.ndarray:
        """Logistic only: each row's probability of class 1."""
        if self.family != "logistic":
            raise ValueError(f"predict_proba needs family='logistic', this is {self.family!r}")
        out = self.decision_function(table, unseen)
        return 0.5 * (1.0 + np.tanh(0.5 * out))


def _as_integers_where(values: pd.Series, keys: Any) -> pd.Series:
    """``values`` (float keys to look up) as integers where the keys are:
    pandas would compare them as floats, and 2**53 + 1 would find 2**53.
    A float that is no whole number finds no integer key."""
    if not (pd.api.types.is_integer_dtype(keys) and pd.api.types.is_float_dtype(values.dtype)):
        return values
    floats = values.to_numpy(dtype=float)
    whole = np.isfinite(floats) & (np.floor(floats) == floats) & (np.abs(floats) < 2.0**63)
    integers = np.zeros(len(floats), dtype=np.int64)
    integers[whole] = floats[whole].astype(np.int64)
    return pd.Series(pd.arrays.IntegerArray(integers, ~whole), index=values.index)
