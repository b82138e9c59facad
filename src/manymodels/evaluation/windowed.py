"""Evaluation inside the task: all windows of one group and candidate at once.

A task of ``train(..., evaluate=...)`` orders its group's rows once (a
backtest: by time; left as they are when ``groups(..., order_by=time)``
sorted them already) and every window is a view of them: slices of the
arrays for ``format="numpy"``, a slice of the one frame otherwise, never a
frame copied per window. The feature rows a model predicts from are taken
out once per group too, and the metrics of all windows are computed at once
from their predictions end to end
(:func:`manymodels.evaluation.metrics.window_scores`). The task reports its
windows as one table of columns (:mod:`.windowtable`), a backtest's with the
times, actuals and forecasts of all its windows, which make
``run.forecasts``. A forecaster (a model with
``forecast(h)``, or ``predict(h)`` as statsforecast's and sktime's models:
see :mod:`.horizons`) is scored on its ``h`` steps for the window's ``h``
time steps instead of ``predict`` of
the test rows' features. Successive halving
(:mod:`manymodels.evaluation.halving`) runs on the same windows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from . import metrics as _metrics
from .horizons import horizon_call
from .splitters import SKIPPED, WINDOWS, Splitter, TooShort, column, row_count
from .timetext import check_text_times
from .windowrows import WindowLayout, model_and_metrics
from .windowtable import DATED, FIELDS, TEXT, mean_scores

#: What each window's row (and a task's averaged scores) holds beside the
#: metrics: a metric function's score of one of these names is refused.
WINDOW_FIELDS = frozenset({*FIELDS, SKIPPED, WINDOWS})


class GroupWindows:
    """One group's rows, ordered once, and its windows as views of them.

    Raises :class:`~manymodels.evaluation.splitters.TooShort` when the group
    has too few rows for the splitter."""

    def __init__(self, splitter: Splitter, rows: Any) -> None:
        self.splitter = splitter
        self.rows = splitter.prepare(rows)
        self.windows = splitter.windows(self.rows)
        self.numpy = isinstance(self.rows, dict)
        self.n = row_count(self.rows)
        self.features = splitter.feature_columns(self.rows)
        self.y = column(self.rows, splitter.target)
        self.named = [m for m in splitter.metrics if isinstance(m, str)]
        self.vectorised = [m for m in self.named if m != "log_loss"]
        self.mase = "mase" in self.vectorised  # (scaled by each window's training target)
        self.forecasts = splitter.forecasts and splitter.time is not None
        self.callables = [m for m in splitter.metrics if callable(m)]
        self.log_loss = "log_loss" in self.named
        self._X: Any = None
        self._layouts: dict[tuple[int, ...], WindowLayout] = {}

    def part(self, positions: Any) -> Any:
        """The rows at ``positions`` (a slice: a view), numbered from 0."""
        if self.numpy:
            return {name: values[positions] for name, values in self.rows.items()}
        return _renumbered(self.rows.iloc[positions])

    def train_rows(self, number: int) -> Any:
        return self.part(self.windows[number][0])

    def _features(self, positions: Any) -> Any:
        """What ``predict`` is given: the test rows' feature columns (a
        frame, or for ``format="numpy"`` a 2-D array of them), taken out of
        the group's rows once."""
        if self._X is None:
            if self.numpy:
                columns = [self.rows[name] for name in self.features]
                self._X = np.column_stack(columns) if columns else np.empty((self.n, 0))
            elif self.features:
                self._X = self.rows[self.features]
            else:  # no feature columns (a forecaster's): the rows' number alone
                import pandas as pd

                self._X = pd.DataFrame(index=pd.RangeIndex(self.n))
        if self.numpy:
            return self._X[positions]
        return _renumbered(self._X.iloc[positions])

    def predict(self, model: Any, number: int) -> tuple[np.ndarray | None, dict[str, float]]:
        """``model``'s predictions on window ``number``'s test rows (None when
        no metric or forecast needs them), and its scores computed per
        window: ``log_loss`` (on ``predict_proba``) and the callable metrics."""
        test = self.windows[number][1]
        scores: dict[str, float] = {}
        predicted = None
        if model is None:  # (a bare AttributeError on None said nothing of fit)
            raise TypeError(f"fit returned no model for window {number} (None, or a "
                            "metrics dict alone): evaluate= scores a model's predictions")
        if self.vectorised or self.forecasts:
            forecast = horizon_call(model) if self.splitter.time else None
            if forecast is not None:
                predicted = self._forecast(forecast, test)
            else:
                predicted = _one_per_row(self._asked(model.predict, test, number), model,
                                         self.y[test].shape[0], number)
        if self.log_loss:
            scores["log_loss"] = self._log_loss(model, test, number)
        if self.callables:
            rows = self.part(test)
            answered: dict[str, Callable[..., Any]] = {}  # score name -> its function
            for metric in self.callables:
                own = self._own_scores(metric, metric(model, rows))
                _refuse_a_score_twice(own, answered, metric)
                scores.update(own)
        return predicted, scores

    def _log_loss(self, model: Any, test: Any, number: int) -> float | None:
        """``log_loss`` of window ``number`` on its test rows whose actual is
        known, as every other metric is scored (None: no actual). A missing
        actual matched none of the model's classes, so each one added a row
        of loss 34.5 (probability 1e-15) to the window's mean."""
        proba = self._asked(model.predict_proba, test, number)
        actual = self.y[test]
        known = _metrics.known_actuals(actual)
        if known is None:
            return _metrics.log_loss(actual, proba, model.classes_)
        if not known.any():
            return None
        return _metrics.log_loss(actual[known], np.asarray(proba)[known], model.classes_)

    def _asked(self, method: Callable[[Any], Any], test: Any, number: int) -> Any:
        """``method`` (``predict``, ``predict_proba``) of the test rows'
        features. With no feature columns it is given rows of no columns,
        which a model fitted on features refuses in its own words
        ("at least one array or dtype is required"): that error names
        ``features=`` too, and the way out."""
        if self.features:
            return method(self._features(test))
        try:
            return method(self._features(test))
        except (ValueError, TypeError, KeyError, IndexError) as exc:  # (not retry_on's)
            owner = type(getattr(method, "__self__", method)).__name__
            given = ("features=[]" if self.splitter.features is not None else
                     "no column but the key, time and target columns")
            raise ValueError(
                f"{owner}.{getattr(method, '__name__', 'predict')} raised "
                f"{type(exc).__name__} ({exc}) on window {number}'s test rows, given no "
                f"feature column: evaluate= has none ({given}); name the columns the "
                "model predicts from in features="
                + (", or return a forecaster from fit (forecast(h))"
                   if self.splitter.time else "")) from exc

    def _own_scores(self, metric: Callable[..., Any], answer: Any) -> dict[str, float]:
        """A metric function's answer as ``{name: float}`` (None: undefined there);
        anything else is refused naming the function."""
        from collections.abc import Mapping

        name = getattr(metric, "__name__", type(metric).__name__)
        if not isinstance(answer, Mapping):
            raise TypeError(f"metric function {name} returned {type(answer).__name__}: give "
                            "a dict of score name -> number")
        scores = {}
        for key, value in answer.items():
            key = str(key)
            if key in self.named:
                raise ValueError(f"metric function {name} returned a score named {key!r}, "
                                 "which metrics= computes itself: name it otherwise")
            if key in WINDOW_FIELDS:
                raise ValueError(f"metric function {name} returned a score named {key!r}, "
                                 "a column each window has already: name it otherwise")
            try:
                if isinstance(value, (str, bytes)):  # float() would read "0.5"
                    raise TypeError
                scores[key] = None if value is None else float(value)  # None: undefined
            except (TypeError, ValueError):
                raise TypeError(f"metric function {name} returned {key!r}: "
                                f"{type(value).__name__}, not a number") from None
        return scores

    def _forecast(self, forecast: Callable[[int], Any], test: Any) -> np.ndarray:
        """A forecaster's ``forecast(h)`` for a window of ``h`` time steps, one
        value a step (or statsforecast's ``{"mean": ...}``), given to each of
        the step's rows: no feature rows are made for it."""
        times = column(self.rows, self.splitter.time)[test]
        starts = np.concatenate(([0], np.flatnonzero(times[1:] != times[:-1]) + 1))
        h = len(starts)
        values = forecast(h)
        if isinstance(values, dict) and "mean" in values:
            values = values["mean"]
        values = np.asarray(values).reshape(-1)
        if len(values) != h:
            owner = type(getattr(forecast, "__self__", forecast)).__name__
            method = getattr(forecast, "__name__", "forecast")
            raise ValueError(f"{owner}.{method}({h}) returned "
                             f"{len(values)} values, not one per time step")
        if h == len(times):
            return values
        return np.repeat(values, np.diff(np.concatenate((starts, [len(times)]))))

    def layout(self, numbers: tuple[int, ...]) -> WindowLayout:
        """What windows ``numbers`` are for every candidate of the group (made
        for the first, kept for the next: their test rows, the actuals and
        times end to end, packed once)."""
        made = self._layouts.get(numbers)
        if made is None:
            made = self._layouts[numbers] = WindowLayout(self, numbers)
        return made

    def table(self, numbers: list[int], predictions: list[Any],
              scores: list[dict[str, float]]) -> dict[str, Any]:
        """Windows ``numbers`` as one windows table (:mod:`.windowtable`):
        the named metrics of all of them computed at once, each window's own
        scores, and for a backtest the forecasts of all of them end to end."""
        layout = self.layout(tuple(numbers))
        predicted = None
        if predictions and all(p is not None for p in predictions):
            if all(type(p) is np.ndarray and p.ndim == 1 for p in predictions):
                predicted = predictions[0] if len(predictions) == 1 else np.concatenate(
                    predictions)
            else:
                predicted = np.concatenate([np.asarray(p).reshape(-1) for p in predictions])
        table: dict[str, Any] = {"window": list(numbers), "cutoff": list(layout.cutoffs),
                                 "n_train": list(layout.n_train), "n_test": list(layout.sizes)}
        if layout.dated_cutoffs:
            table[DATED] = [True] * len(numbers)
        elif layout.text_cutoffs:
            table[TEXT] = [True] * len(numbers)
        vectorised = _metrics.window_score_lists(
            self.vectorised, layout.y, predicted, layout.bounds,
            layout.trains if self.mase else []) if self.vectorised else {}
        for name in self.named:  # in the order they were asked for
            values = vectorised.get(name)
            table[name] = values if values is not None else [own[name] for own in scores]
        if any(scores):
            for name in dict.fromkeys(name for own in scores for name in own):
                if name not in table:
                    table[name] = [own.get(name) for own in scores]
        if self.forecasts:
            rows = layout.forecast_rows(predicted)
            if rows is not None:
                table["rows"] = rows
        return table


def _refuse_a_score_twice(own: dict[str, Any], answered: dict[str, Callable[..., Any]],
                          metric: Callable[..., Any]) -> None:
    """Refuse a score name that two metric functions answer (two of one
    ``__name__``, made by one factory, say): the later one's score replaced
    the earlier's, silently. ``answered`` maps each name so far to its
    function; ``metric``'s names are added."""
    for key in own:
        earlier = answered.get(key)
        if earlier is not None:
            raise ValueError(f"metric functions {_function_name(earlier)} and "
                             f"{_function_name(metric)} both returned a score named {key!r}: "
                             "one would replace the other; name them apart")
        answered[key] = metric


def _function_name(metric: Callable[..., Any]) -> str:
    return getattr(metric, "__name__", type(metric).__name__)


def _one_per_row(predicted: Any, model: Any, rows: int, number: int) -> np.ndarray:
    """``predict``'s answer for a window's ``rows`` test rows as one value a
    row (an ``(n, 1)`` array or a frame of one column is a column); any
    other length or shape is refused by name: it would be scored against
    another window's rows, or fail deep in the metrics."""
    values = np.asarray(predicted)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values.reshape(-1)
    if values.ndim != 1 or values.shape[0] != rows:
        got = "a scalar" if values.ndim == 0 else f"an array of shape {values.shape}"
        raise ValueError(f"{type(model).__name__}.predict returned {got} for window "
                         f"{number}'s {rows} test rows: give one prediction a row")
    return values


def _renumbered(frame: Any) -> Any:
    import pandas as pd

    frame.index = pd.RangeIndex(len(frame))
    return frame


def skipped_metrics(splitter: Splitter, reason: str) -> dict[str, Any]:
    """What a group too short for the splitter reports."""
    return {**{name: float("nan") for name in splitter.metric_names()}, SKIPPED: reason,
            WINDOWS: []}


def evaluate_group(fit: Callable[..., Any], group: GroupWindows, kwargs: dict[str, Any]
                   ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Fit ``fit`` on each window of ``group`` and score it: ``(the last
    window's model, its fit metrics, the windows table)``."""
    model, fit_metrics = None, {}
    predictions, scores = [], []
    for number in range(len(group.windows)):
        model, fit_metrics = model_and_metrics(fit(group.train_rows(number), **kwargs))
        predicted, own = group.predict(model, number)
        predictions.append(predicted)
        scores.append(own)
    return model, fit_metrics, group.table(list(range(len(group.windows))), predictions, scores)


def evaluate_rows(fit: Callable[..., Any], rows: Any, kwargs: dict[str, Any],
                  splitter: Splitter, group: GroupWindows | None = None
                  ) -> tuple[Any, dict[str, Any]]:
    """Evaluate one candidate on one group's ``rows`` (``group``: their
    windows, when already made); ``(model, metrics)`` with the averaged
    metrics and the per-window ones under :data:`WINDOWS`."""
    if group is None:
        try:
            group = GroupWindows(splitter, rows)
        except TooShort as exc:
            model, fit_metrics = model_and_metrics(fit(splitter.prepare(rows), **kwargs))
            return model, {**fit_metrics, **skipped_metrics(splitter, str(exc))}
    model, fit_metrics, windows = evaluate_group(fit, group, kwargs)
    if splitter.refit:  # on the rows as the windows saw them: a backtest's sorted by time
        model, fit_metrics = model_and_metrics(fit(group.rows, **kwargs))
    return model, {**fit_metrics, **mean_scores(windows), WINDOWS: windows}


def _address(values: np.ndarray) -> int:
    return values.ctypes.data  # (a third cheaper than __array_interface__'s dict)


def _same_arrays(rows: Any, other: Any, address: int) -> bool:
    """Whether two ``format="numpy"`` groups are views of the same memory:
    the same columns, each a read-only view of the same base array with the
    same shape, strides and dtype, the first at ``address`` (``other``'s
    first column's). ``other`` is held alive by the caller, so its memory
    cannot have been reused for other data. One address is asked for, not
    one a column (a microsecond or two each, a task's largest cost after
    its fits): the reader cuts every column of a group at the same rows of
    its batch (:class:`~manymodels.inputs.datareaders.ArrowSlices`), so the
    first column's place is the group's. Views of another base are never
    taken for the same rows (at worst, the windows are made again)."""
    if type(rows) is not dict or rows.keys() != other.keys():
        return False
    first = None
    for values, kept in zip(rows.values(), other.values()):
        if (type(values) is not np.ndarray or values.base is not kept.base
                or values.flags.writeable or values.shape != kept.shape
                or values.strides != kept.strides or values.dtype != kept.dtype):
            return False
        if first is None:
            first = values
    return first is not None and _address(first) == address


class Evaluated:
    """``fit`` evaluated by a splitter: what the executor calls when
    ``train`` is given ``evaluate=``. Picklable if ``fit`` is.

    The candidates of one group (``groups * grid``) run one after another
    on a worker: their group's windows are made once, for the first, and
    kept while the next task's rows are the same read-only arrays."""

    def __init__(self, fit: Callable[..., Any], splitter: Splitter) -> None:
        self.fit, self.splitter = fit, splitter
        self._last: tuple[Any, GroupWindows, int] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_last": None}

    def __call__(self, rows: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        last = self._last
        if last is not None and _same_arrays(rows, last[0], last[2]):
            return evaluate_rows(self.fit, rows, kwargs, self.splitter, last[1])
        self._last = None
        try:
            group = GroupWindows(self.splitter, rows)
        except TooShort as exc:
            model, fit_metrics = model_and_metrics(self.fit(self.splitter.prepare(rows),
                                                            **kwargs))
            return model, {**fit_metrics, **skipped_metrics(self.splitter, str(exc))}
        if type(rows) is dict and rows and all(type(v) is np.ndarray for v in rows.values()):
            self._last = (rows, group, _address(next(iter(rows.values()))))
        return evaluate_rows(self.fit, rows, kwargs, self.splitter, group)


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
    if base.format not in ("pandas", "numpy"):
        raise ValueError("evaluate= needs groups(..., format='pandas') or format='numpy', "
                         f"not {base.format!r}")
    # read_on_workers: the driver holds the key columns only, but the files'
    # schema names every column a group will have (what columns= reads)
    engine_frame = getattr(base, "engine_frame", None)
    schema = (engine_frame.schema if engine_frame is not None
              else base.table.schema if base.reader is None else base.reader.schema)
    if base.reader is not None and base.reader.columns is not None:
        schema = pa.schema([schema.field(name) for name in base.reader.columns])
    evaluate = evaluate.bound(schema.names, base.by)
    _check_numeric_target(schema.field(evaluate.target), evaluate.metric_names())
    if evaluate.time is not None:
        _check_sortable(schema.field(evaluate.time))
        if engine_frame is None and base.reader is None:  # the rows are here: look now
            _check_no_missing(base.table.column(evaluate.time), evaluate.time)
            check_text_times(base.table.column(evaluate.time), evaluate.time)
    return Evaluated(fit, evaluate), evaluate


def _check_sortable(field_: Any) -> None:
    import pyarrow.types as pat

    kind = field_.type
    if not (pat.is_temporal(kind) or pat.is_integer(kind) or pat.is_floating(kind)
            or pat.is_string(kind) or pat.is_large_string(kind) or pat.is_decimal(kind)):
        raise ValueError(f"evaluate: time column {field_.name!r} cannot be sorted (its type "
                         f"is {kind}); give a date, time or number column")


def _check_numeric_target(field_: Any, metrics: list[str]) -> None:
    """Refuse, before any work, a target of text scored by a metric that
    compares numbers (``rmse``, the default): every task failed on
    "could not convert string to float", naming neither."""
    import pyarrow.types as pat

    kind = field_.type
    if pat.is_dictionary(kind):
        kind = kind.value_type
    if not (pat.is_string(kind) or pat.is_large_string(kind)):
        return
    numeric = [name for name in metrics if name in _metrics.NUMERIC_METRICS]
    if numeric:
        raise ValueError(f"evaluate: the target {field_.name!r} holds text ({field_.type}), "
                         f"which metric {numeric[0]!r} cannot score (it compares numbers): "
                         "pass metrics= of labels (accuracy, f1, balanced_accuracy, "
                         "log_loss), or convert the column to numbers")


def _check_no_missing(times: Any, name: str) -> None:
    """Refuse, before any work, a time column with missing values (null, or
    NaN): a backtest cannot place their rows in time. (Rows read on the
    workers are checked by each task, which fails naming the column.)"""
    import pyarrow.compute as pc
    import pyarrow.types as pat

    missing = times.null_count
    if pat.is_floating(times.type):
        missing += pc.sum(pc.is_nan(times)).as_py() or 0
    if missing:
        raise ValueError(f"evaluate: time column {name!r} has {missing} missing value(s): "
                         "a backtest cannot place them in time (drop or fill them first)")


def evaluate_candidates(fit: Callable[..., Any], rows: Any, settings: list[dict[str, Any]],
                        splitter: Splitter, metric: str, higher: bool
                        ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Every setting of one group evaluated in one task on the same windows,
    the best by ``metric`` refitted on all rows: ``(model, its metrics, its
    setting)``. ``manymodels train`` tunes each group this way (one row per
    group); with a group too short to evaluate, the first setting is fitted."""
    splitter = replace(splitter, refit=False)
    try:
        group = GroupWindows(splitter, rows)
    except TooShort as exc:
        model, fit_metrics = model_and_metrics(fit(splitter.prepare(rows), **settings[0]))
        return model, {**fit_metrics, **skipped_metrics(splitter, str(exc))}, settings[0]
    scored = []
    for setting in settings:
        _, fit_metrics, windows = evaluate_group(fit, group, setting)
        metrics = {**fit_metrics, **mean_scores(windows), WINDOWS: windows}
        scored.append((metrics.get(metric, float("nan")), setting, metrics))
    ranked = [s for s in scored if s[0] == s[0]]  # not NaN
    _, setting, metrics = (max if higher else min)(ranked, key=lambda s: s[0]) if ranked \
        else scored[0]
    model, _ = model_and_metrics(fit(group.rows, **setting))
    return model, metrics, setting
