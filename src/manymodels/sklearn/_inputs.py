"""GroupedEstimator's input: X split into its key columns and its features,
with scikit-learn's own checks and messages."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import numpy as np
import pandas as pd
from sklearn.utils.validation import _check_feature_names, _get_feature_names, check_array

from ..inputs.engineframes import refuse_engine_frame
from ..inputs.sourcechecks import named_twice
from ..inputs.tables import plain_scalar
from ._levels import GROUP, PARAM, W, Y


def plain_key(key: Any) -> Hashable:
    """A group key with NumPy scalars as Python values (as keys are stored)."""
    if isinstance(key, tuple):
        return tuple(plain_scalar(v) for v in key)
    return plain_scalar(key)


def as_pandas_if_table(X: Any) -> Any:
    """polars and Arrow tables (which ``mm.groups`` accepts) as pandas frames."""
    module = type(X).__module__
    if (module.startswith("polars") or module.startswith("pyarrow")) and hasattr(
            X, "to_pandas"):
        return X.to_pandas()
    return X


def by_list(by: Any) -> list:
    """``by`` as a list of columns: a sequence of them (a list, a tuple, a
    NumPy array or a pandas Index of names), or one column."""
    if isinstance(by, (list, tuple, np.ndarray, pd.Index, pd.Series)):
        return list(by)
    return [by]


def allow_nan(estimator: Any) -> bool:
    try:
        return bool(estimator.__sklearn_tags__().input_tags.allow_nan)
    except AttributeError:
        return False


def split_X(owner: Any, X: Any, fitting: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(key columns, feature columns) of X, checked against ``owner.by``. Key
    columns may hold anything hashable (strings in an object array); feature
    columns get scikit-learn's own checks when X is an array. X may hold the
    key columns alone (one baseline per group, e.g. a ``DummyRegressor``)."""
    by = by_list(owner.by)
    if not by:
        raise ValueError("by= names no column: give the column (or columns) whose values "
                         "key the groups")
    twice = named_twice(by)
    if twice is not None:
        raise ValueError(f"by= names column {twice!r} twice")
    refuse_engine_frame(X, "X", "a grouped estimator fits and predicts on rows in this "
                        "process, as scikit-learn does", "or train with mm.train(fit, "
                        "mm.groups(df, by=...)), which takes it as it is")
    X = as_pandas_if_table(X)
    as_frame = isinstance(X, pd.DataFrame)
    nan_ok = allow_nan(owner.estimator)
    if as_frame:
        frame = X
    else:
        named = [b for b in by if isinstance(b, str)]
        if named:  # checked first: its string keys would read as features that are no numbers
            raise ValueError(f"by column {named[0]!r} is a name, and X is an array without "
                             "column names: pass a DataFrame (or by= column positions)")
        _check_positions(by)
        array = None if hasattr(X, "toarray") else np.asarray(X)
        if array is None or array.ndim != 2:
            # scikit-learn's own message for 1-D, 0-D and sparse input
            check_array(X, dtype="numeric", ensure_all_finite=not nan_ok)
        outside = [b for b in by if isinstance(b, (int, np.integer)) and not isinstance(
            b, bool) and not 0 <= b < array.shape[1]]
        if outside and array.shape[1]:  # before its key column is checked as a feature
            raise ValueError(f"by column {outside[0]!r} is not among X's {array.shape[1]} "
                             f"column positions (0 to {array.shape[1] - 1}; a negative one "
                             "does not count from the end)")
        keys_at = [b for b in by if isinstance(b, (int, np.integer))
                   and not isinstance(b, bool)]
        if array.dtype.kind != "O":  # numeric: keys are checked as features are
            keys_at = []
        rest = [i for i in range(array.shape[1]) if i not in keys_at]
        if not rest:  # only key columns: scikit-learn's message for no rows or columns
            check_array(array, dtype=None, ensure_min_features=len(by))
        checked = check_array(  # scikit-learn's checks of the features: numeric, finite
            array[:, rest], dtype="numeric",
            ensure_min_features=max(1, len(by) - len(keys_at)) if fitting else 1,
            ensure_all_finite=not nan_ok) if rest else array[:, :0]
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
    if not fitting:  # scikit-learn's check and message, naming each column unseen or
        _check_feature_names(owner, X, reset=False)  # missing; models that read an
        # array (a pipeline's first step) would otherwise take reordered columns as they come
    if not fitting and frame.shape[1] != owner.n_features_in_:
        raise ValueError(f"X has {frame.shape[1]} features, but {type(owner).__name__} is "
                         f"expecting {owner.n_features_in_} features as input")
    missing = [b for b in by if b not in frame.columns]
    if missing:
        where = "columns" if as_frame else f"{frame.shape[1]} column positions"
        raise ValueError(f"by column {missing[0]!r} is not among X's {where}")
    if as_frame:
        _check_frame_columns(frame, by)
    # scikit-learn's rule, and its TypeError for names of text and numbers
    # mixed: a frame's names are feature names only when all are text
    names = _get_feature_names(frame) if as_frame and fitting else None
    features = [c for c in frame.columns if c not in by]
    if fitting:
        owner._as_frame = as_frame
        owner.n_features_in_ = frame.shape[1]
        if names is not None:
            owner.feature_names_in_ = names
    return frame[by], frame[features]


def _check_positions(by: list) -> None:
    """An array's by columns are integer positions: refuse, naming it, any
    other (a bool, a float) before X's columns are read as numbers."""
    for b in by:
        if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer)):
            raise ValueError(f"by column {b!r} is not a column position of X, an array: "
                             "give an integer (or pass a DataFrame to name columns)")


def _check_frame_columns(frame: pd.DataFrame, by: list) -> None:
    """Refuse, by name, what would group or fit X's rows wrong: a by column
    X has twice, a key that cannot be a group's (a list, a dict), a column
    named like one this package adds to fit the groups."""
    doubled = [b for b in by if (frame.columns == b).sum() > 1]
    if doubled:
        raise ValueError(f"X has two columns named {doubled[0]!r}, a by column")
    for name in by:
        column = frame[name]
        if column.dtype == object:
            try:
                pd.unique(column)  # (hashes each key once, in C)
            except TypeError:
                bad = next(v for v in column if not _hashable(v))
                raise TypeError(f"by column {name!r}: a group key must be a string or a "
                                f"number, got {type(bad).__name__}") from None
    reserved = [c for c in frame.columns if c in (Y, GROUP, W)
                or (isinstance(c, str) and c.startswith(PARAM))]
    if reserved:
        raise ValueError(f"X has a column named {reserved[0]!r}, a name the grouped "
                         "estimator gives its own columns while it fits: rename it")


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def feature_input(features: pd.DataFrame, as_frame: bool) -> Any:
    """What the per-group models take: the frame itself, or its array."""
    return features if as_frame else features.to_numpy()
