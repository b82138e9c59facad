"""Evaluation: how good is each group's model on rows it has not seen.

``mm.train(fit, source, evaluate=splitter)`` wraps ``fit`` in
:class:`Evaluated`, which runs inside each task, on its worker: it splits the
group's rows by the splitter (:func:`holdout`, :func:`kfold`, or a time-series
:func:`backtest`), calls ``fit`` on each window's training rows only, scores
``model.predict(test[features])`` against ``test[target]`` with the named
metrics (:mod:`manymodels.evaluation.metrics`), averages the windows, and refits on all
rows. Nothing but the task's own rows moves: a million groups evaluate as
they train, in parallel, with no driver-side loop.

A task's averaged metrics become columns of ``run.results``; the per-window
scores travel with them under :data:`WINDOWS` (so the store keeps them in the
task's row, at no cost to a run without evaluation) and make
``run.evaluation``. A group too short for the splitter is not an error: its
model is fitted on all rows and its ``eval_skipped`` column says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from . import metrics as _metrics

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
    refit: bool = True
    #: Columns never used as features: the key columns, bound by ``train``.
    exclude: tuple[str, ...] = field(default=(), repr=False)
    time: str | None = None

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
        return replace(self, exclude=tuple(key_columns))

    def feature_columns(self, rows: Any) -> list[str]:
        if self.features is not None:
            return list(self.features)
        skip = {self.target, self.time, *self.exclude}
        return [c for c in rows.columns if c not in skip]


def _check_common(target: Any, features: Any, metrics: Any) -> tuple:
    if not isinstance(target, str) or not target:
        raise TypeError(f"target must name the column to predict, got {target!r}")
    if features is not None:
        if isinstance(features, str) or not all(isinstance(f, str) for f in features):
            raise TypeError(f"features must be a list of column names, got {features!r}")
        features = tuple(features)
    if isinstance(metrics, str) or callable(metrics):
        metrics = [metrics]
    metrics = tuple(metrics)
    if not metrics:
        raise ValueError("metrics= needs at least one metric")
    for metric in metrics:
        if not callable(metric):
            _metrics.check_names([metric])
    return features, metrics


@dataclass(frozen=True)
class Holdout(Splitter):
    test_size: float = 0.2
    shuffle: bool = True
    seed: int = 0

    def windows(self, rows: Any) -> list[tuple[np.ndarray, np.ndarray, Any]]:
        n = len(rows)
        everything = np.arange(n)
        if self.test_size == 0:  # scores on the training rows: an in-sample fit
            return [(everything, everything, None)]
        n_test = math.ceil(self.test_size * n)
        if n_test < 1 or n - n_test < 1:
            raise TooShort(f"a holdout of {self.test_size} needs at least 2 rows, has {n}")
        order = np.random.default_rng(self.seed).permutation(n) if self.shuffle else everything
        return [(np.sort(order[n_test:]), np.sort(order[:n_test]), None)]


@dataclass(frozen=True)
class KFold(Splitter):
    k: int = 5
    shuffle: bool = True
    seed: int = 0

    def windows(self, rows: Any) -> list[tuple[np.ndarray, np.ndarray, Any]]:
        n = len(rows)
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

    def prepare(self, rows: Any) -> Any:
        """The rows sorted by time once (stable; not copied when already in
        order), so that every window is a slice of them."""
        order = np.argsort(rows[self.time].to_numpy(), kind="stable")
        if len(order) > 1 and not np.all(order[1:] > order[:-1]):
            rows = rows.iloc[order].reset_index(drop=True)
        return rows

    def windows(self, rows: Any) -> list[tuple[Any, Any, Any]]:
        """Expanding windows over the group's time steps (its distinct
        ``time`` values, in order): the last window tests the last
        ``horizon`` steps, each earlier one starts ``step`` steps before; each
        trains on every row strictly before its test rows. With one row per
        step, steps are rows, as in statsforecast's ``cross_validation``; with
        several (two stores' rows a day), a window tests every row of its
        days and never trains on any of them. The cutoff is the time of a
        window's last training step (as statsforecast's ``cutoff``)."""
        n, step = len(rows), self.step or self.horizon
        needed = self.horizon + (self.n_windows - 1) * step + 1
        times = rows[self.time]
        values = times.to_numpy()
        # the row where each step begins (the rows are sorted by time), and the end
        begins = np.concatenate(([0], np.flatnonzero(values[1:] != values[:-1]) + 1, [n]))
        steps = len(begins) - 1
        if steps < needed:
            have = (f"{needed} rows, has {n}" if steps == n else
                    f"{needed} distinct {self.time!r} values, has {steps} (in {n} rows)")
            raise TooShort(f"a backtest of {self.n_windows} window(s) of horizon "
                           f"{self.horizon} (step {step}) needs at least {have}")
        out = []
        for w in range(self.n_windows):
            first = steps - self.horizon - (self.n_windows - 1 - w) * step
            start, end = int(begins[first]), int(begins[first + self.horizon])
            out.append((slice(0, start), slice(start, end), _plain(times.iloc[start - 1])))
        return out


def _plain(value: Any) -> Any:
    """A cutoff as JSON keeps it: datetimes as ISO text, NumPy scalars as Python's."""
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return value.item() if isinstance(value, np.generic) else value


def holdout(test_size: float = 0.2, *, target: str, features: Sequence[str] | None = None,
            metrics: Sequence[Any] = ("rmse", "mae"), shuffle: bool = True, seed: int = 0,
            refit: bool = True) -> Holdout:
    """Hold out ``test_size`` of each group's rows (shuffled by ``seed``) to
    score its model; ``test_size=0`` scores the fit on its own training rows."""
    features, metrics = _check_common(target, features, metrics)
    if isinstance(test_size, bool) or not isinstance(test_size, (int, float)) or not (
            0 <= test_size < 1):
        raise ValueError(f"test_size must lie in [0, 1), got {test_size!r}")
    return Holdout(target=target, features=features, metrics=metrics, refit=refit,
                   test_size=float(test_size), shuffle=bool(shuffle), seed=int(seed))


def kfold(k: int = 5, *, target: str, features: Sequence[str] | None = None,
          metrics: Sequence[Any] = ("rmse", "mae"), shuffle: bool = True, seed: int = 0,
          refit: bool = True) -> KFold:
    """``k``-fold cross-validation within each group (shuffled by ``seed``)."""
    features, metrics = _check_common(target, features, metrics)
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"kfold needs k >= 2 folds, got {k!r}")
    return KFold(target=target, features=features, metrics=metrics, refit=refit, k=k,
                 shuffle=bool(shuffle), seed=int(seed))


def backtest(time: str, horizon: int, windows: int = 3, step: int | None = None, *,
             target: str, features: Sequence[str] | None = None,
             metrics: Sequence[Any] = ("rmse", "mae"), refit: bool = True) -> Backtest:
    """Expanding-window time-series cross-validation per group, as
    statsforecast's ``cross_validation``: sorted by ``time``, ``windows``
    cutoffs ``step`` time steps apart (default ``horizon``), each training on
    every row up to its cutoff and testing the next ``horizon`` time steps.

    ``horizon`` and ``step`` count time steps, the distinct values of
    ``time``, not rows: with one row per step they are the same (and the
    windows equal statsforecast's); a group with several rows per time (two
    rows a day) tests every row of its last ``horizon`` days, and trains only
    on rows strictly earlier, never on a day it tests."""
    features, metrics = _check_common(target, features, metrics)
    if not isinstance(time, str) or not time:
        raise TypeError(f"time must name the column to sort by, got {time!r}")
    for name, value in (("horizon", horizon), ("windows", windows)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 1):
        raise ValueError(f"step must be an integer >= 1, got {step!r}")
    return Backtest(target=target, features=features, metrics=metrics, refit=refit, time=time,
                    horizon=horizon, n_windows=windows, step=step)


# -- inside the task, on the worker ------------------------------------------------------


def score_window(splitter: Splitter, model: Any, test: Any, features: list[str],
                 y_train: Any) -> dict[str, float]:
    """The splitter's metrics of ``model`` on one window's ``test`` rows."""
    names = [m for m in splitter.metrics if isinstance(m, str)]
    scores = _metrics.score(names, model, test[features], test[splitter.target].to_numpy(),
                            y_train) if names else {}
    for metric in splitter.metrics:
        if callable(metric):
            scores.update({str(k): float(v) for k, v in dict(metric(model, test)).items()})
    return scores


def evaluate_rows(fit: Callable[..., Any], rows: Any, kwargs: dict[str, Any],
                  splitter: Splitter) -> tuple[Any, dict[str, Any]]:
    """Evaluate one candidate on one group's ``rows``; ``(model, metrics)``
    with the averaged metrics and the per-window ones under :data:`WINDOWS`."""
    from ..engine.execution import split_result

    features = splitter.feature_columns(rows)
    records: list[dict[str, Any]] = []
    model, fit_metrics, skipped = None, {}, None
    ordered = splitter.prepare(rows)
    try:
        windows = splitter.windows(ordered)
    except TooShort as exc:
        windows, skipped = [], str(exc)
    for number, (train, test, cutoff) in enumerate(windows):
        train_rows = ordered.iloc[train].reset_index(drop=True)
        test_rows = ordered.iloc[test].reset_index(drop=True)
        model, fit_metrics = split_result(fit(train_rows, **kwargs))
        scores = score_window(splitter, model, test_rows, features,
                              train_rows[splitter.target].to_numpy())
        records.append({"window": number, "cutoff": cutoff, "n_train": len(train_rows),
                        "n_test": len(test_rows), **scores})
    if splitter.refit or skipped is not None:
        model, fit_metrics = split_result(fit(rows, **kwargs))
    averaged: dict[str, Any] = {}
    for record in records:
        for name, value in record.items():
            if name not in ("window", "cutoff", "n_train", "n_test"):
                averaged.setdefault(name, []).append(value)
    metrics = {**fit_metrics, **{name: float(np.mean(v)) for name, v in averaged.items()}}
    if skipped is not None:
        metrics.update({name: float("nan") for name in splitter.metric_names()})
        metrics[SKIPPED] = skipped
    metrics[WINDOWS] = records
    return model, metrics


class Evaluated:
    """``fit`` evaluated by a splitter: what the executor calls when
    ``train`` is given ``evaluate=``. Picklable if ``fit`` is."""

    def __init__(self, fit: Callable[..., Any], splitter: Splitter) -> None:
        self.fit, self.splitter = fit, splitter

    def __call__(self, rows: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        return evaluate_rows(self.fit, rows, kwargs, self.splitter)


def prepare(fit: Callable[..., Any], source: Any, evaluate: Any
            ) -> tuple[Callable[..., Any], Splitter | None]:
    """``train``'s ``evaluate=`` checked against ``source`` before any work:
    the callable the workers run, and the splitter bound to the table."""
    if evaluate is None:
        return fit, None
    if not isinstance(evaluate, Splitter):
        raise TypeError("evaluate must be made by mm.holdout(), mm.kfold() or mm.backtest(), "
                        f"got {type(evaluate).__name__}")
    import pyarrow as pa

    from ..inputs.grids import ProductSource
    from ..inputs.sources import GroupSource

    base = source.base if isinstance(source, ProductSource) else source
    if not isinstance(base, GroupSource):
        raise ValueError("evaluate= needs a source made by mm.groups(...) (optionally times "
                         "a grid): it splits each group's rows")
    if base.format != "pandas":
        raise ValueError(f"evaluate= needs groups(..., format='pandas'), not {base.format!r}")
    # read_on_workers: the driver holds the key columns only, but the files'
    # schema names every column a group will have (what columns= reads)
    schema = base.table.schema if base.reader is None else base.reader.schema
    if base.reader is not None and base.reader.columns is not None:
        schema = pa.schema([schema.field(name) for name in base.reader.columns])
    evaluate = evaluate.bound(schema.names, base.by)
    if evaluate.time is not None:
        _check_sortable(schema.field(evaluate.time))
    return Evaluated(fit, evaluate), evaluate


def _check_sortable(field_: Any) -> None:
    import pyarrow.types as pat

    kind = field_.type
    if not (pat.is_temporal(kind) or pat.is_integer(kind) or pat.is_floating(kind)
            or pat.is_string(kind) or pat.is_large_string(kind) or pat.is_decimal(kind)):
        raise ValueError(f"evaluate: time column {field_.name!r} cannot be sorted (its type "
                         f"is {kind}); give a date, time or number column")


def window_frame(key_columns: list, key_rows: list[tuple], metrics: list[Any]) -> Any:
    """``run.evaluation``: the per-window records of every task, with its key."""
    import json

    import pandas as pd

    from ..engine.metriccolumns import texts_taken_out
    from ..engine.metricpacks import MetricsPack

    rows = []
    for parts, stored in zip(key_rows, texts_taken_out(metrics)):
        if type(stored) is MetricsPack:  # floats only: no windows
            continue
        if isinstance(stored, str):  # a reused task's: the store's JSON
            if WINDOWS not in stored:
                continue
            stored = json.loads(stored)
        for record in (stored or {}).get(WINDOWS) or ():
            rows.append({**dict(zip(key_columns, parts)), **record})
    if not rows:
        return pd.DataFrame(columns=[*key_columns, "window", "cutoff", "n_train", "n_test"])
    frame = pd.DataFrame(rows)
    cutoffs = frame["cutoff"].dropna()
    if len(cutoffs) and all(isinstance(c, str) and "T" in c for c in cutoffs):
        try:  # a datetime time column's cutoffs travel as ISO text
            frame["cutoff"] = pd.to_datetime(frame["cutoff"])
        except (ValueError, TypeError):
            pass
    return frame


def evaluate_candidates(fit: Callable[..., Any], rows: Any, settings: list[dict[str, Any]],
                        splitter: Splitter, metric: str, higher: bool
                        ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Every setting of one group evaluated in one task, the best by
    ``metric`` refitted on all rows: ``(model, its metrics, its setting)``.
    ``manymodels train`` tunes each group this way (one row per group); with
    a group too short to evaluate, the first setting is fitted."""
    quiet = replace(splitter, refit=False)
    scored, metrics = [], {}
    for setting in settings:
        _, metrics = evaluate_rows(fit, rows, setting, quiet)
        if SKIPPED in metrics:  # too short for every setting alike
            break
        scored.append((metrics.get(metric, float("nan")), setting, metrics))
    ranked = [s for s in scored if s[0] == s[0]]  # not NaN
    if ranked:
        _, setting, metrics = (max if higher else min)(ranked, key=lambda s: s[0])
    else:
        setting = settings[0]
        metrics = scored[0][2] if scored else metrics
    from ..engine.execution import split_result

    model, _ = split_result(fit(rows, **setting))
    return model, metrics, setting
