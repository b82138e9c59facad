"""Evaluation: how good is each group's model on rows it has not seen.

``mm.train(fit, source, evaluate=splitter)`` wraps ``fit`` in
:class:`~manymodels.evaluation.windowed.Evaluated`, which runs inside each
task, on its worker: it splits the group's rows by the splitter
(:func:`holdout`, :func:`kfold`, or a time-series :func:`backtest`), calls
``fit`` on each window's training rows only, scores
``model.predict(test[features])`` against ``test[target]`` with the named
metrics (:mod:`manymodels.evaluation.metrics`), averages the windows, and
keeps a model fitted once more on all rows (``final_model="all_rows"``, the
default) or the last window's (``final_model="last_window"``). Nothing but
the task's own rows moves: a million groups evaluate as they train, in
parallel, with no driver-side loop. This module holds the splitters, checked
in the driver; :mod:`manymodels.evaluation.windowed` runs them in the task.

A task's averaged metrics become columns of ``run.results``; the per-window
scores travel with them under :data:`WINDOWS` (so the store keeps them in the
task's row, at no cost to a run without evaluation) and make
``run.evaluation``. A group too short for the splitter is not an error: its
model is fitted on all rows and its ``eval_skipped`` column says why.
"""

from __future__ import annotations

import decimal
import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..engine.options import positive_int
from . import metrics as _metrics
from .timetext import check_text_time_values

#: The metrics key under which a task's per-window scores travel and are stored.
WINDOWS = "__windows__"
#: The column that says why a group was not evaluated.
SKIPPED = "eval_skipped"


class TooShort(ValueError):
    """A group has too few rows for the splitter (recorded, not raised)."""


@dataclass(frozen=True)
class Splitter:
    """What every splitter shares; see :func:`holdout`, :func:`kfold`, :func:`backtest`."""

    target: str
    features: tuple[str, ...] | None = None
    metrics: tuple[Any, ...] = ("rmse", "mae")
    #: The kept model is fitted once more on all rows after the windows
    #: (``final_model="all_rows"``), else it is the last window's.
    refit: bool = True
    #: Columns never used as features: the key columns, bound by ``train``.
    exclude: tuple[str, ...] = field(default=(), repr=False)
    time: str | None = None
    #: A backtest's forecasts travel with each window's scores (``run.forecasts``).
    forecasts: bool = True

    def __getstate__(self) -> dict[str, Any]:
        """The pickled state (which the task identities hash) without the
        fields added since stores were first written, while they keep their
        defaults: a re-run of an older store still reuses its models."""
        state = dict(self.__dict__)
        for name, default in _ADDED_FIELDS.items():
            if state.get(name, default) == default:
                state.pop(name, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, default in _ADDED_FIELDS.items():
            object.__setattr__(self, name, default)
        for name, value in state.items():
            object.__setattr__(self, name, value)

    @property
    def final_model(self) -> str:
        """``"all_rows"`` or ``"last_window"``: which model a task keeps."""
        return "all_rows" if self.refit else "last_window"

    def windows(self, rows: Any) -> list[tuple[Any, Any, Any]]:
        """``(train positions, test positions, cutoff)`` per window, of the
        rows :meth:`prepare` returned (positions: an array or a slice)."""
        raise NotImplementedError

    def prepare(self, rows: Any) -> Any:
        """The group's rows as the windows index them (a backtest: by time)."""
        return rows

    # -- checked in the driver, before any work ------------------------------------

    def metric_names(self) -> list[str]:
        """The named metrics (a callable's names are known only when it runs)."""
        return [m for m in self.metrics if isinstance(m, str)]

    def bound(self, columns: Sequence[str], key_columns: Sequence[str]) -> Splitter:
        """This splitter checked against a table's ``columns``, with the key
        columns excluded from the default features."""
        where = f"its columns are {list(columns)}"
        if self.target not in columns:
            raise ValueError(f"evaluate: target column {self.target!r} is not in the table; "
                             + where)
        if self.time is not None and self.time not in columns:
            raise ValueError(f"evaluate: time column {self.time!r} is not in the table; "
                             + where)
        for name in self.features or ():
            if name not in columns:
                raise ValueError(f"evaluate: feature column {name!r} is not in the table; "
                                 + where)
        if self.target in (self.features or ()):
            raise ValueError(f"evaluate: the target {self.target!r} is also a feature")
        for argument, name, wanted in (("target", self.target, "the column to predict"),
                                       ("time", self.time, "the time column")):
            if name in key_columns:  # one value a group: nothing to predict, or to order by
                raise ValueError(f"evaluate: {argument}={name!r} is a key column of the "
                                 f"groups (by={list(key_columns)}), one value a group: name "
                                 f"{wanted}")
        keyed = next((name for name in self.features or () if name in key_columns), None)
        if keyed is not None:  # (the splitter is made before it knows the groups)
            raise ValueError(f"evaluate: features names {keyed!r}, a key column of the "
                             f"groups (by={list(key_columns)}): it holds one value a group, "
                             "which no model learns from; leave it out of features")
        return replace(self, exclude=tuple(key_columns))

    def feature_columns(self, rows: Any) -> list[str]:
        if self.features is not None:
            return list(self.features)
        skip = {self.target, self.time, *self.exclude}
        names = rows.keys() if isinstance(rows, dict) else rows.columns
        return [c for c in names if c not in skip]


#: Fields added to :class:`Splitter` after stores were written, with their defaults.
_ADDED_FIELDS = {"forecasts": True}


def row_count(rows: Any) -> int:
    """How many rows a group has: a frame's length, or a column's for
    ``format="numpy"`` (a dict of column name to array)."""
    if isinstance(rows, dict):
        return len(next(iter(rows.values()))) if rows else 0
    return len(rows)


def column(rows: Any, name: str) -> np.ndarray:
    """One column of a group's rows as a NumPy array (a view where it can be)."""
    values = rows[name]
    return values if isinstance(values, np.ndarray) else values.to_numpy()


def _final_model(final_model: str | None, refit: bool | None) -> bool:
    """``final_model=`` (or the deprecated ``refit=``) as the splitter's
    ``refit`` flag. statsforecast's ``refit=True`` refits per window, which
    every window here does; the old name read as that and is deprecated."""
    if refit is not None:
        if final_model is not None:
            raise ValueError("give final_model= only (refit= is its deprecated name)")
        warnings.warn("refit= is deprecated: it never meant statsforecast's refit (every "
                      "window is fitted on its own rows anyway); say final_model="
                      "'all_rows' (refit=True) or final_model='last_window' (refit=False)",
                      DeprecationWarning, stacklevel=3)
        if not isinstance(refit, bool):
            raise TypeError(f"refit must be True or False, got {refit!r}")
        return refit
    if final_model is None:
        return True
    if final_model not in ("all_rows", "last_window"):
        raise ValueError(f"final_model must be 'all_rows' (the kept model is fitted on all "
                         f"rows after the windows) or 'last_window', got {final_model!r}")
    return final_model == "all_rows"


def _flag(splitter: str, name: str, value: Any) -> bool:
    """``value`` as a flag, True or False (NumPy's too). Anything else is
    refused, naming the argument: ``bool("False")`` is True, so a
    ``shuffle="False"`` read from a config file shuffled a time series and
    scored its model on rows mixed with those it trained on."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise TypeError(f"{splitter}'s {name} must be True or False, got {value!r}")


def _check_common(target: Any, features: Any, metrics: Any) -> tuple:
    if not isinstance(target, str) or not target:
        raise TypeError(f"target must name the column to predict, got {target!r}")
    if features is not None:
        given = features
        if isinstance(features, str) or not isinstance(features, Iterable):
            raise TypeError(f"features must be a list of column names, got {given!r}")
        features = tuple(features)  # (a generator is read once)
        if not all(isinstance(f, str) for f in features):
            raise TypeError(f"features must be a list of column names, got {given!r}")
        twice = next((f for i, f in enumerate(features) if f in features[:i]), None)
        if twice is not None:
            raise ValueError(f"features names the column {twice!r} twice: name it once")
        if target in features:
            raise ValueError(f"features names the target {target!r}: the model would be "
                             "given the answer it is scored on; leave it out of features")
    if metrics is None:
        raise TypeError("metrics must name the metrics to compute (or be functions), got None")
    if isinstance(metrics, str) or callable(metrics):
        metrics = [metrics]
    metrics = tuple(metrics)
    if not metrics:
        raise ValueError("metrics= needs at least one metric")
    for metric in metrics:
        if not callable(metric):
            _metrics.check_names([metric])
    _refuse_a_metric_twice(metrics)
    return features, metrics


def _refuse_a_metric_twice(metrics: tuple[Any, ...]) -> None:
    """Refuse, naming it, a metric given twice (``["mae", "mae"]``, one
    function twice): its column would be computed twice and kept once, and
    a select= or a report counting metrics would count it twice. (Two
    functions answering the same score name are refused where they answer,
    :meth:`.windowed.GroupWindows.predict`: their names are known only then.)"""
    seen: list[Any] = []
    for metric in metrics:
        if any(metric is other or (isinstance(metric, str) and metric == other)
               for other in seen):
            name = metric if isinstance(metric, str) else getattr(
                metric, "__name__", type(metric).__name__)
            raise ValueError(f"metrics= names the metric {name!r} twice: name it once")
        seen.append(metric)


@dataclass(frozen=True)
class Holdout(Splitter):
    test_size: float = 0.2
    shuffle: bool = True
    seed: int = 0

    @property
    def final_model(self) -> str:
        """As :attr:`Splitter.final_model`; a holdout of nothing (``test_size=0``)
        trains its one window on all rows, which is what its model saw."""
        return "all_rows" if self.refit or not self.test_size else "last_window"

    def windows(self, rows: Any) -> list[tuple[np.ndarray, np.ndarray, Any]]:
        n = row_count(rows)
        everything = np.arange(n)
        if self.test_size == 0:  # scores on the training rows: an in-sample fit
            return [(everything, everything, None)]
        n_test = math.ceil(self.test_size * n)
        if n_test < 1 or n - n_test < 1:
            if n >= 2:  # (the test rows, rounded up, leave none to train on)
                raise TooShort(f"a holdout of {self.test_size} of {n} rows tests {n_test} "
                               f"(rounded up) and leaves {n - n_test} to train on")
            raise TooShort(f"a holdout of {self.test_size} needs at least 2 rows, has {n}")
        if not self.shuffle:  # the last rows, as scikit-learn's train_test_split holds out
            return [(everything[:n - n_test], everything[n - n_test:], None)]
        order = np.random.default_rng(self.seed).permutation(n)
        return [(np.sort(order[n_test:]), np.sort(order[:n_test]), None)]

    def __getstate__(self) -> dict[str, Any]:
        """As :meth:`Splitter.__getstate__`, and, unshuffled, a mark that the
        last rows are held out (they were the first): a store's unshuffled
        holdout models are evaluated again, rather than reused with scores of
        the first rows."""
        state = super().__getstate__()
        if not self.shuffle and self.test_size:
            state["held_out"] = "last rows"
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__({k: v for k, v in state.items() if k != "held_out"})


@dataclass(frozen=True)
class KFold(Splitter):
    k: int = 5
    shuffle: bool = True
    seed: int = 0

    def windows(self, rows: Any) -> list[tuple[np.ndarray, np.ndarray, Any]]:
        n = row_count(rows)
        if n < self.k:
            raise TooShort(f"{self.k}-fold cross-validation needs at least {self.k} rows, "
                           f"has {n}")
        order = np.random.default_rng(self.seed).permutation(n) if self.shuffle \
            else np.arange(n)
        folds = np.array_split(order, self.k)
        return [(np.sort(np.concatenate(folds[:i] + folds[i + 1:])), np.sort(fold), None)
                for i, fold in enumerate(folds)]


@dataclass(frozen=True)
class Backtest(Splitter):
    horizon: int = 1
    n_windows: int = 3
    step: int | None = None

    def __getstate__(self) -> dict[str, Any]:
        """As :meth:`Splitter.__getstate__`, and, where the kept model is
        fitted on all rows (``final_model="all_rows"``), a mark that it is
        fitted on them in time order (before, in the input's order): a store
        written before retrains those models once, rather than reuse a model
        fitted on unsorted rows. (The last window's model was always fitted
        on sorted rows: its identity stays.)"""
        state = super().__getstate__()
        if self.refit:
            state["final_fit"] = "in time order"
        return state

    def prepare(self, rows: Any) -> Any:
        """The rows sorted by time once (stable; not copied when already in
        order, as ``groups(..., order_by=time)`` leaves them), so that every
        window is a slice of them."""
        times = column(rows, self.time)
        missing = _missing_count(times)
        if missing:
            raise ValueError(f"evaluate: time column {self.time!r} has {missing} missing "
                             "value(s) in this group: a backtest cannot place them in time "
                             "(drop or fill them first)")
        check_text_time_values(times, self.time)
        if len(times) < 2 or _ascending(times):
            return rows
        order = np.argsort(times, kind="stable")
        if isinstance(rows, dict):
            return {name: values[order] for name, values in rows.items()}
        return rows.iloc[order].reset_index(drop=True)

    def windows(self, rows: Any) -> list[tuple[Any, Any, Any]]:
        """Expanding windows over the group's time steps (its distinct
        ``time`` values, in order): the last window tests the last
        ``horizon`` steps, each earlier one starts ``step`` steps before; each
        trains on every row strictly before its test rows. With one row per
        step, steps are rows, as in statsforecast's ``cross_validation``; with
        several (two stores' rows a day), a window tests every row of its
        days and never trains on any of them. The cutoff is the time of a
        window's last training step (as statsforecast's ``cutoff``)."""
        n, step = row_count(rows), self.step or self.horizon
        needed = self.horizon + (self.n_windows - 1) * step + 1
        values = column(rows, self.time)
        distinct = values[1:] != values[:-1]
        if distinct.all():  # one row per step: steps are rows
            begins, steps = None, n
        else:  # the row where each step begins (the rows are sorted by time), and the end
            begins = np.concatenate(([0], np.flatnonzero(distinct) + 1, [n])).tolist()
            steps = len(begins) - 1
        if steps < needed:
            have = (f"{needed} rows, has {n}" if steps == n else
                    f"{needed} distinct {self.time!r} values, has {steps} (in {n} rows)")
            raise TooShort(f"a backtest of {self.n_windows} window(s) of horizon "
                           f"{self.horizon} (step {step}) needs at least {have}")
        bounds = []
        for w in range(self.n_windows):
            first = steps - self.horizon - (self.n_windows - 1 - w) * step
            bounds.append((first, first + self.horizon) if begins is None
                          else (begins[first], begins[first + self.horizon]))
        cutoffs = plain_times(values[[start - 1 for start, _ in bounds]])
        return [(slice(0, start), slice(start, end), cutoff)
                for (start, end), cutoff in zip(bounds, cutoffs)]


def _missing_count(values: np.ndarray) -> int:
    """How many of a time column's values are missing (NaT, NaN, None, NA)."""
    if values.dtype.kind in "mM":
        return int(np.isnat(values).sum())
    if values.dtype.kind == "f":
        return int(np.isnan(values).sum())
    if values.dtype.kind == "O":
        import pandas as pd

        return int(pd.isna(values).sum())
    return 0


def _ascending(values: np.ndarray) -> bool:
    try:
        return bool((values[1:] >= values[:-1]).all())
    except TypeError:  # mixed objects: let the sort say
        return False


def plain_time(value: Any) -> Any:
    """A cutoff as JSON keeps it: datetimes as ISO text, NumPy scalars as Python's."""
    if isinstance(value, np.datetime64):
        import pandas as pd

        value = pd.Timestamp(value)
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):  # (an Arrow decimal column's) as a number
        number = float(value)              # where it is one exactly, else its text
        return number if decimal.Decimal(number) == value else str(value)
    return value.item() if isinstance(value, np.generic) else value


def plain_times(values: np.ndarray) -> list[Any]:
    """Times as JSON keeps them (as :func:`plain_time`, at once)."""
    if values.dtype.kind == "M":  # ISO text as Timestamp.isoformat writes it, at C speed
        key = (values.dtype.str, values.tobytes())  # series share calendars: their
        made = _TIME_TEXTS.get(key)                  # cutoffs are written once
        if made is None:
            seconds = values.astype("datetime64[s]")
            whole = bool((seconds == values).all())
            made = np.datetime_as_string(seconds if whole else values).tolist()
            if len(_TIME_TEXTS) >= 4096:
                _TIME_TEXTS.clear()
            _TIME_TEXTS[key] = made
        return list(made)
    return [plain_time(v) for v in values] if values.dtype.kind == "O" else values.tolist()


#: Times written as text by :func:`plain_times`, by their dtype and bytes.
_TIME_TEXTS: dict[tuple[str, bytes], list[str]] = {}


def holdout(test_size: float = 0.2, *, target: str, features: Sequence[str] | None = None,
            metrics: Sequence[Any] = ("rmse", "mae"), shuffle: bool = True, seed: int = 0,
            final_model: str | None = None, refit: bool | None = None) -> Holdout:
    """Hold out ``test_size`` of each group's rows (shuffled by ``seed``; with
    ``shuffle=False`` its last rows, as scikit-learn's ``train_test_split``)
    to score its model; ``test_size=0`` scores the fit on its own training
    rows."""
    features, metrics = _check_common(target, features, metrics)
    if isinstance(test_size, bool) or not isinstance(test_size, (int, float)) or not (
            0 <= test_size < 1):
        raise ValueError(f"test_size must lie in [0, 1), got {test_size!r}")
    return Holdout(target=target, features=features, metrics=metrics,
                   refit=_final_model(final_model, refit),
                   test_size=float(test_size), shuffle=_flag("holdout", "shuffle", shuffle),
                   seed=positive_int("seed", seed, 0))


def kfold(k: int = 5, *, target: str, features: Sequence[str] | None = None,
          metrics: Sequence[Any] = ("rmse", "mae"), shuffle: bool = True, seed: int = 0,
          final_model: str | None = None, refit: bool | None = None) -> KFold:
    """``k``-fold cross-validation within each group (shuffled by ``seed``)."""
    features, metrics = _check_common(target, features, metrics)
    k = positive_int("kfold's k (folds)", k, 2)
    return KFold(target=target, features=features, metrics=metrics,
                 refit=_final_model(final_model, refit), k=k,
                 shuffle=_flag("kfold", "shuffle", shuffle), seed=positive_int("seed", seed, 0))


#: The store attachment under which ``train`` keeps a backtest's time column,
#: for ``Store.forecast`` of groups that had no ``order_by``.
EVALUATION_ATTACHMENT = "evaluation"


def backtest(time: str, horizon: int, windows: int = 3, step: int | None = None, *,
             target: str, features: Sequence[str] | None = None,
             metrics: Sequence[Any] = ("rmse", "mae"), final_model: str | None = None,
             forecasts: bool = True, refit: bool | None = None) -> Backtest:
    """Expanding-window time-series cross-validation per group, as
    statsforecast's ``cross_validation``: sorted by ``time``, ``windows``
    cutoffs ``step`` time steps apart (default ``horizon``), each training on
    every row up to its cutoff and testing the next ``horizon`` time steps.

    ``horizon`` and ``step`` count time steps, the distinct values of
    ``time``, not rows: with one row per step they are the same (and the
    windows equal statsforecast's); a group with several rows per time (two
    rows a day) tests every row of its last ``horizon`` days, and trains only
    on rows strictly earlier, never on a day it tests.

    ``final_model`` says which model each task keeps: ``"all_rows"`` (the
    default: fitted once more on every row after the windows, the model to
    forecast with) or ``"last_window"`` (the last window's, no extra fit).
    Every window is always fitted on its own training rows, as
    statsforecast's ``refit=True``; ``refit=`` is this option's deprecated
    name. With ``forecasts`` (the default) each window's forecasts travel
    with its scores: ``run.forecasts`` has them row by row, as
    ``cross_validation`` returns them."""
    features, metrics = _check_common(target, features, metrics)
    if not isinstance(time, str) or not time:
        raise TypeError(f"time must name the column to sort by, got {time!r}")
    if time == target:
        raise ValueError(f"backtest: the time column {time!r} is also the target")
    horizon = positive_int("horizon", horizon, 1)
    windows = positive_int("windows", windows, 1)
    if step is not None:
        step = positive_int("step", step, 1)
    if not isinstance(forecasts, bool):
        raise TypeError(f"forecasts must be True or False, got {forecasts!r}")
    return Backtest(target=target, features=features, metrics=metrics,
                    refit=_final_model(final_model, refit), time=time, horizon=horizon,
                    n_windows=windows, step=step, forecasts=forecasts)
