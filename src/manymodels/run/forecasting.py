"""Forecasting h steps ahead: every group's kept model, on future rows made here.

``Store.forecast(h)`` (and ``run.forecast(h)``) finds each group's last
observed time and its frequency, makes the ``h`` time stamps after it (the
future rows: dates x series, which a statsforecast or sktime user otherwise
builds by hand) and sends them through :func:`.prediction.predict_groups`,
the engine ``Store.predict`` runs on: each worker loads its groups' models
from the store and calls, per group, the first of these the model has (read
from its class as a backtest reads it: :mod:`manymodels.evaluation.horizons`):

* ``forecast(h)`` (statsforecast's ``forecast(y, h)``, which needs the
  history, is not this one);
* ``predict(h)`` (statsforecast, pmdarima's ``n_periods``) or sktime's
  ``predict(fh)`` (given the steps ``1..h``);
* ``predict(X)``: the future rows as a DataFrame (key and time columns, and
  the feature columns of ``X_future=``).

Where the times come from: ``history=`` (a table with the key and time
columns, such as the one trained on), else the run's own table when the
driver holds it (``run.forecast``), else the run's backtest forecasts kept
in the store, whose last window ends at each group's last row.
"""

from __future__ import annotations

import ast
import re
import warnings
from typing import Any

import numpy as np

from ..evaluation.horizons import horizon_call
from ..evaluation.splitters import EVALUATION_ATTACHMENT


def _as_values(values: Any) -> np.ndarray:
    """A forecast as one value a step: statsforecast's ``{"mean": ...}``, a
    pandas Series or one-column frame, or an array."""
    if isinstance(values, dict) and "mean" in values:
        values = values["mean"]
    values = np.asarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    return values


class HorizonForecast:
    """``fn(model, rows)`` of :func:`.prediction.predict_groups`: one
    group's future rows (``h`` of them, in time order) to its forecast."""

    def __init__(self, by: list[str], time: str, features: list[str] | None) -> None:
        self.by, self.time, self.features = by, time, features

    def __call__(self, model: Any, rows: Any) -> np.ndarray:
        h = len(rows)
        call = horizon_call(model)  # (horizon_method is cached per class)
        if call is not None:
            values = _as_values(call(h))
            named = getattr(call, "__name__", "forecast")
        else:
            values = _as_values(model.predict(self.design(model, rows)))
            named = "predict"
        if len(values) != h:
            raise ValueError(f"{type(model).__name__}.{named} returned {len(values)} values "
                             f"for {h} future time steps")
        return values

    def design(self, model: Any, rows: Any) -> Any:
        """What ``predict(X)`` gets: the columns the model was fitted on when
        it names them, else ``X_future``'s features, else the key and time."""
        names = getattr(model, "feature_names_in_", None)
        if names is not None:
            missing = [c for c in names if c not in rows.columns]
            if missing:
                raise ValueError(f"the model needs feature column {missing[0]!r} for the "
                                 "future rows: pass X_future= with it")
            return rows[list(names)]
        problem = unnamed_features_problem(model, self.features)
        if problem:
            raise ValueError(f"the model {problem}")
        if self.features:
            X = rows[self.features]
            return X.to_numpy() if type(model).__module__.startswith("sklearn.") else X
        return rows[[*self.by, self.time]]


def unnamed_features_problem(model: Any, features: list[str] | None) -> str | None:
    """What is wrong with giving ``features`` (X_future's columns; None: no
    X_future, so the key and time columns) to a model fitted on arrays:
    one with ``n_features_in_`` but no ``feature_names_in_`` takes columns
    by position, and the key and time columns in place of its features
    predict numbers from a store number and a day, silently; None when
    the count fits (or the model counts no features)."""
    count = getattr(model, "n_features_in_", None)
    if count is None or getattr(model, "feature_names_in_", None) is not None:
        return None
    fitted = f"was fitted on {count} unnamed feature column(s) (arrays, no feature_names_in_)"
    if not features:
        return (f"{fitted}: it cannot predict from the future rows' key and time columns; "
                "pass X_future= (a table of the future rows with the key, time and its "
                "feature columns, in the order it was fitted on)")
    if len(features) != count:
        return (f"{fitted}, but X_future gives {len(features)}: {list(features)}; give "
                "X_future exactly its feature columns, in the order it was fitted on")
    return None


def check_model_inputs(model: Any, future: Any, described: str,
                       features: list[str] | None = None) -> None:
    """Refuse before any work a ``predict(X)`` model whose fitted feature
    columns the future rows lack, or that was fitted on another number of
    unnamed columns than ``features`` (X_future's) give (one model is
    loaded to ask)."""
    if horizon_call(model) is not None:
        return
    names = getattr(model, "feature_names_in_", None)
    missing = [c for c in (names if names is not None else []) if c not in future.columns]
    if missing:
        raise ValueError(
            f"the model of {described} predicts from rows and needs feature column "
            f"{missing[0]!r}, which the future rows lack: pass X_future= (a table of the "
            "future rows with the key, time and feature columns)")
    problem = unnamed_features_problem(model, features)
    if problem:
        raise ValueError(f"the model of {described} ({type(model).__name__}) {problem}")
    if not callable(getattr(model, "predict", None)):
        raise TypeError(f"the model of {described} ({type(model).__name__}) has neither "
                        "forecast(h), predict(h) nor predict(X)")


def check_horizon(h: Any) -> int:
    if isinstance(h, bool) or not isinstance(h, (int, np.integer)) or h < 1:
        raise ValueError(f"h must be a positive whole number of time steps, got {h!r}")
    return int(h)


_ORDER_BY = re.compile(r"order_by=(\[[^\]]*\])")


def time_column(source_text: str | None, time: str | None, run_id: int) -> str:
    """``time=``, else the one ``order_by`` column the run's groups were
    sorted by (as the store recorded its source)."""
    if time is not None:
        if not isinstance(time, str):
            raise TypeError(f"time must be a column name, got {time!r}")
        return time
    found = _ORDER_BY.search(source_text or "")
    columns = ast.literal_eval(found.group(1)) if found else []
    if len(columns) == 1:
        return str(columns[0])
    raise ValueError(
        f"pass time= (the time column): run {run_id}'s groups were not sorted by one "
        f"order_by column ({source_text!r}), which forecast would take as the time")


def group_columns(asked: list[str] | None, trained: list[str] | None,
                  run_keys: list[str], params: list[str]) -> list[str]:
    """The columns that name a group: ``by=`` (checked against the run's),
    else the run's group columns (its key columns but a grid's). A ``by=``
    of other columns is refused naming them (checked against the run's key
    columns where it recorded no ``by``: a store's run without one read its
    backtest forecasts by the wrong columns, and said it kept none)."""
    keyed = trained or [c for c in run_keys if c not in params]
    if asked is not None and keyed and sorted(asked) != sorted(keyed):
        raise ValueError(f"by={asked!r}, but the run's models are keyed by {keyed!r}")
    by = keyed or asked  # (the run's order: its models' keys are made in it)
    if not by:
        raise ValueError("forecast needs by= (the group columns)")
    return by


def group_models(artifacts: dict[str, str], keys: list[tuple]) -> list[str | None]:
    """Each group of ``keys``'s model (its artifact), or None."""
    from ..inputs.keys import TypedKeys

    typed = TypedKeys(artifacts)
    return [typed.find(parts) for parts in keys]


def without_models(times: Any, digests: list[str | None], store: Any, run: int | None,
                   by: list[str], run_keys: list[str]) -> list[int]:
    """The positions of the groups that have a model; a warning names the
    others, those that failed in training apart from those never trained
    (:func:`~manymodels.store.nomodel.without_model`, as ``Store.predict`` says them)."""
    from ..store.nomodel import without_model

    kept = [i for i, digest in enumerate(digests) if digest is not None]
    if len(kept) < len(digests):
        missing = [parts[0] if len(by) == 1 else parts  # as the store keys them
                   for parts, digest in zip(times.keys, digests) if digest is None]
        why = without_model(store, run, by, run_keys, missing) or f"e.g. {missing[:3]!r}"
        warnings.warn(f"{len(missing)} group(s) have no model in store {str(store)!r}: they "
                      f"are not forecast; {why}", RuntimeWarning, stacklevel=4)
    return kept


def without_times(artifacts: dict[str, str], keys: list[tuple], run_id: int) -> None:
    """Warn, naming them, of the groups with a model that the run's backtest
    forecasts hold no rows of (a group too short to backtest, or a model of
    an earlier run): their last time is unknown, and they are not forecast."""
    from ..inputs.keys import TypedKeys, decode_key, encode_key

    codes = {encode_key(parts): True for parts in keys}
    missing = [code for code in artifacts if code not in codes]  # (most are, as written)
    if missing:  # found however the backtest typed them (1 and 1.0)
        timed = TypedKeys(codes)
        missing = [code for code in missing if timed.find(decode_key(code)) is None]
    if missing:
        shown = [decode_key(code) for code in missing[:3]]
        shown = [parts[0] if len(parts) == 1 else parts for parts in shown]
        warnings.warn(f"{len(missing)} group(s) with a model (e.g. {shown!r}) have no rows in "
                      f"run {run_id}'s backtest forecasts to find their last time in: they "
                      "are not forecast; pass history= (a table with their key and time "
                      "columns) to forecast them", RuntimeWarning, stacklevel=4)


def _check_backtest_time(time: str, backtest_time: str | None, run_id: int) -> None:
    """Refuse a ``time=`` other than the backtest's where the last times are
    read from its forecasts (no ``history=``): their ``time`` column holds
    the backtest's times, which were given back as ``time=``'s, silently."""
    if backtest_time is not None and time != backtest_time:
        raise ValueError(
            f"time={time!r}, but run {run_id}'s backtest, whose forecasts hold each "
            f"group's last time when no history= is given, ran on the time column "
            f"{backtest_time!r}: leave time= out, or pass history= (a table with the "
            f"key columns and {time!r})")


def forecast_from_store(store: Any, h: int, by: str | list[str] | None, freq: Any,
                        run: int | None, *, time: str | None, history: Any, X_future: Any,
                        backend: str | None, workers: int | None, progress: bool) -> Any:
    """:meth:`manymodels.Store.forecast`: see the module."""
    import pandas as pd

    from ..store.lazymodels import StoredModel
    from . import futurerows
    from .prediction import _column_names, predict_groups

    h = check_horizon(h)
    run_id, run_keys, params = store._run_row(run, ended=True)
    if store._linear_run(run_id) is not None:
        raise ValueError(f"run {run_id} is an mm.linear run: it predicts rows with "
                         "Store.predict; forecast needs a model per group")
    runs = store.runs()
    source_text = runs.loc[runs["run_id"] == run_id, "source"]
    backtest = store.attached(EVALUATION_ATTACHMENT, run_id, default=None) or {}
    if backtest.get("final_model") == "last_window":
        raise ValueError(
            f"run {run_id} kept each group's last evaluation window's model "
            "(final_model='last_window'): fitted without that window's test rows (a "
            "backtest's: up to the group's last cutoff), it forecasts from what it saw, "
            "not from the group's last time; train with final_model='all_rows' (the "
            "default) to forecast")
    if time is None:  # the time column of the run's backtest, where it had one
        time = backtest.get("time")
    elif history is None:
        _check_backtest_time(time, backtest.get("time"), run_id)
    time = time_column(source_text.iloc[0] if len(source_text) else None, time, run_id)
    chosen = store._selection(run)
    # (run_id: with run None, the latest run that has ended, not one being written)
    config = store.attached("train_config", run_id, default={}) or {}
    by = group_columns(_column_names(by), _column_names(
        config.get("by") or (chosen or {}).get("by")), run_keys, params)
    if params and chosen is None:
        raise ValueError(f"run {run_id} kept a model per group and setting of {params}: "
                         "forecast needs one model per group (train with select=)")
    artifacts = chosen["artifacts"] if chosen else store._model_artifacts(run)
    if history is not None:
        last = futurerows.last_times_of_table(history, by, time, "history")
    else:
        last = futurerows.last_times_of_backtest(store.forecasts(run_id), by, time, run_id)
    digests = group_models(artifacts, last.keys)
    if history is None:
        without_times(artifacts, last.keys, run_id)
    kept = without_models(last, digests, store, run, by, list(run_keys))
    if not kept:
        raise ValueError(f"no group of the history has a model in store {str(store)!r} "
                         f"(run {run_id})")
    last = last.subset(kept)
    known = None if history is not None or freq is not None else group_models(
        store._forecast_steps(run_id, by), last.keys)
    try:
        steps = futurerows.steps(last, freq, known)
    except ValueError as exc:
        if history is not None or freq is not None:  # (a freq= refused is no inference's)
            raise
        raise ValueError(f"{exc} or history= (the backtest's forecasts hold only its "
                         "windows' times, too few, or too far apart, to tell it)") from None
    future = futurerows.future_rows(last, *steps, h)
    features = None
    if X_future is not None:
        future, features = futurerows.with_features(future, X_future, by, time)
    first = digests[kept[0]]
    described = f"group {last.named(0)!r}"
    check_model_inputs(StoredModel(store, first, described).load(), future, described,
                       features)
    routed = predict_groups(store, future, by, artifacts, None, features=None,
                            method="predict", fn=HorizonForecast(by, time, features),
                            backend=backend, workers=workers, progress=progress)
    if routed.values is None:  # the models were found here, but not by the engine's lookup
        raise ValueError(f"no group's model could be loaded from store {str(store)!r}")
    frame = future[[*by, time]].reset_index(drop=True)
    yhat = pd.Series(list(routed.values) if routed.values.ndim > 1 else routed.values)
    try:
        yhat = yhat.astype(float)
    except (TypeError, ValueError):  # a forecast of labels, say
        pass
    frame["yhat"] = yhat
    return frame
