"""Named metrics: how a model's predictions on held-out rows are scored.

One table, used by ``mm.train(..., evaluate=...)`` and by ``manymodels
train``: a name maps to a function of the true values, the predictions (and,
for ``mase``, the training target) and to whether higher is better, which is
what ``select=`` needs to pick a group's best candidate. They are plain NumPy,
so that a worker scoring a 28-row window spends microseconds, not the
milliseconds of a validating library call.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: ``fn(y_true, y_pred, y_train)``: a float.
MetricFn = Callable[[np.ndarray, np.ndarray, np.ndarray], float]


def _float(values: Any) -> np.ndarray:
    return np.asarray(values, dtype=float).reshape(-1)


def rmse(y: Any, p: Any, train: Any = None) -> float:
    return float(np.sqrt(np.mean((_float(y) - _float(p)) ** 2)))


def mse(y: Any, p: Any, train: Any = None) -> float:
    return float(np.mean((_float(y) - _float(p)) ** 2))


def mae(y: Any, p: Any, train: Any = None) -> float:
    return float(np.mean(np.abs(_float(y) - _float(p))))


def mape(y: Any, p: Any, train: Any = None) -> float:
    """Mean absolute percentage error as a fraction (0.1 is 10 %); a true zero
    divides by machine epsilon, as scikit-learn does."""
    y, p = _float(y), _float(p)
    return float(np.mean(np.abs(y - p) / np.maximum(np.abs(y), np.finfo(float).eps)))


def smape(y: Any, p: Any, train: Any = None) -> float:
    """Symmetric MAPE, ``mean(2 |y - p| / (|y| + |p|))`` in [0, 2]; 0/0 counts 0."""
    y, p = _float(y), _float(p)
    scale = np.abs(y) + np.abs(p)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale == 0, 0.0, 2 * np.abs(y - p) / scale)
    return float(np.mean(ratio))


def mase(y: Any, p: Any, train: Any = None) -> float:
    """Mean absolute scaled error: the MAE over the in-sample MAE of the naive
    one-step forecast of the training target (season 1), as in Hyndman &
    Koehler (2006). NaN when the training target is too short or constant."""
    if train is None:
        return float("nan")
    scale = naive_scale(train)
    return float(mae(y, p) / scale) if scale == scale else float("nan")


def naive_scale(history: Any) -> float:
    """The MAE of the naive one-step forecast of ``history``: the mean
    absolute difference of its neighbours both known (a missing value, a gap
    in the series, leaves out its two differences, as pandas' mean skips
    them, rather than making every window's ``mase`` undefined); NaN where
    no such pair is, or all are equal (a flat history)."""
    differences = np.abs(np.diff(_float(history)))
    known = differences[~np.isnan(differences)]
    scale = float(np.mean(known)) if len(known) else 0.0
    return scale if scale > 0 else float("nan")


def r2(y: Any, p: Any, train: Any = None) -> float:
    y, p = _float(y), _float(p)
    if len(y) < 2:  # undefined on one row (scikit-learn's NaN, with a warning)
        return float("nan")
    total = np.sum((y - y.mean()) ** 2)
    residual = np.sum((y - p) ** 2)
    if total == 0:
        return 1.0 if residual == 0 else 0.0  # scikit-learn's convention
    return float(1 - residual / total)


def accuracy(y: Any, p: Any, train: Any = None) -> float:
    return float(np.mean(np.asarray(y).reshape(-1) == np.asarray(p).reshape(-1)))


def _f1(y: Any, p: Any, train: Any = None) -> float:
    from sklearn.metrics import f1_score

    return float(f1_score(y, p, average="weighted"))


def _balanced_accuracy(y: Any, p: Any, train: Any = None) -> float:
    from sklearn.metrics import balanced_accuracy_score

    return float(balanced_accuracy_score(y, p))


def log_loss(y: Any, proba: Any, classes: Any) -> float:
    """Cross-entropy of the true labels under ``predict_proba``'s columns
    (``classes``, the model's ``classes_``); a label the model never saw
    scores as probability 1e-15."""
    proba = np.asarray(proba, dtype=float)
    classes = np.asarray(classes)
    y = np.asarray(y).reshape(-1)
    order = np.argsort(classes)
    found = np.searchsorted(classes, y, sorter=order)
    found = np.clip(found, 0, len(classes) - 1)
    column = order[found]
    known = classes[column] == y
    chosen = np.where(known, proba[np.arange(len(y)), column], 0.0)
    return float(-np.mean(np.log(np.clip(chosen, 1e-15, 1.0))))


#: name -> (function, higher is better). ``log_loss`` is scored on
#: ``predict_proba`` (see :func:`score`), every other on ``predict``.
METRICS: dict[str, tuple[Callable[..., float], bool]] = {
    "rmse": (rmse, False),
    "mse": (mse, False),
    "mae": (mae, False),
    "mape": (mape, False),
    "smape": (smape, False),
    "mase": (mase, False),
    "r2": (r2, True),
    "accuracy": (accuracy, True),
    "f1": (_f1, True),
    "balanced_accuracy": (_balanced_accuracy, True),
    "log_loss": (log_loss, False),
}
#: The metrics that compare class labels (the others compare numbers).
CLASSIFICATION_METRICS = ("accuracy", "f1", "balanced_accuracy", "log_loss")


def higher_is_better(name: str) -> bool | None:
    """Whether a larger ``name`` is better; None for a name not in the table."""
    found = METRICS.get(name)
    return None if found is None else found[1]


def direction(metric: str, given: str | None, how: str) -> bool:
    """Whether a higher ``metric`` is better: ``given`` (``"min"`` or ``"max"``)
    when the user said so, else this module's table. A name the table does not
    know is refused before any work, naming the metric and ``how`` to give its
    direction: a guess (by the words in the name, or "lower is better") picks
    the worst model silently when it is wrong, as for an ``auc`` or a
    ``val_accuracy`` that ``fit`` reports."""
    if given is not None:
        if given not in ("min", "max"):
            raise ValueError(f"the direction of metric {metric!r} must be 'min' or 'max', "
                             f"got {given!r}")
        return given == "max"
    higher = higher_is_better(metric)
    if higher is None:
        raise ValueError(f"metric {metric!r}: manymodels does not know whether higher or lower "
                         f"is better (it knows {', '.join(METRICS)}); say which, e.g. {how}")
    return higher


def check_names(names: list[str], option: str = "metrics") -> None:
    """Refuse a metric name not in the table, naming the option at fault."""
    for name in names:
        if name not in METRICS:
            raise ValueError(f"unknown metric {name!r} in {option}=; choose from "
                             f"{', '.join(METRICS)} (or pass a function "
                             "score(model, test_rows) -> dict)")


def score(names: list[str], model: Any, X: Any, y: Any, y_train: Any) -> dict[str, float]:
    """Each named metric of ``model`` on the rows ``X`` with truth ``y``;
    ``predict`` (and ``predict_proba`` for ``log_loss``) called once."""
    scores: dict[str, float] = {}
    predicted = None
    for name in names:
        fn = METRICS[name][0]
        if name == "log_loss":
            scores[name] = fn(y, model.predict_proba(X), model.classes_)
            continue
        if predicted is None:
            predicted = np.asarray(model.predict(X))
        scores[name] = fn(y, predicted, y_train)
    return scores


#: The metrics :func:`window_scores` computes for all windows at once.
_SUMS = {"mse", "rmse", "mae", "mape", "smape", "mase", "r2", "accuracy"}
#: Those of them computed from the errors (``y - predicted``, as floats).
_ERRORS = _SUMS - {"accuracy"}
#: The named metrics that compare numbers: a target of text has none to give.
NUMERIC_METRICS = frozenset(_ERRORS)


def window_scores(names: list[str], y: np.ndarray, predicted: np.ndarray, bounds: np.ndarray,
                  train_targets: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Each named metric of every window at once: ``y`` and ``predicted`` are
    the windows' test rows end to end, window ``w`` at
    ``bounds[w]:bounds[w + 1]`` (none empty); ``train_targets[w]`` its
    training target (for ``mase``). Sums over windows are one
    ``np.add.reduceat`` each; ``f1`` and ``balanced_accuracy`` (scikit-learn's)
    go window by window. ``log_loss`` is not here: it needs probabilities."""
    starts, counts = bounds[:-1], bounds[1:] - bounds[:-1]
    out: dict[str, np.ndarray] = {}
    if not _ERRORS.isdisjoint(names):
        y_float = y if y.dtype == np.float64 else _float(y)
        p_float = predicted if predicted.dtype == np.float64 else _float(predicted)
        error = y_float - p_float
    reduce = np.add.reduceat
    for name in names:
        if name in ("mse", "rmse"):
            if "mse" not in out:
                out["mse"] = reduce(error * error, starts) / counts
            if name == "rmse":
                out["rmse"] = np.sqrt(out["mse"])
        elif name in ("mae", "mase"):
            if "mae" not in out:
                out["mae"] = reduce(np.abs(error), starts) / counts
            if name == "mase":
                out["mase"] = out["mae"] / _naive_scales(train_targets)
        elif name == "mape":
            ratio = np.abs(error) / np.maximum(np.abs(y_float), np.finfo(float).eps)
            out[name] = reduce(ratio, starts) / counts
        elif name == "smape":
            scale = np.abs(y_float) + np.abs(p_float)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = np.where(scale == 0, 0.0, 2 * np.abs(error) / scale)
            out[name] = reduce(ratio, starts) / counts
        elif name == "r2":
            centred = y_float - np.repeat(reduce(y_float, starts) / counts, counts)
            total = reduce(centred ** 2, starts)
            residual = reduce(error ** 2, starts)
            with np.errstate(divide="ignore", invalid="ignore"):
                out[name] = np.where(counts < 2, np.nan, np.where(
                    total == 0, np.where(residual == 0, 1.0, 0.0), 1 - residual / total))
        elif name == "accuracy":
            same = np.asarray(y).reshape(-1) == np.asarray(predicted).reshape(-1)
            out[name] = reduce(same.astype(float), starts) / counts
            known = known_actuals(np.asarray(predicted).reshape(-1))
            if known is not None:  # a missing prediction: NaN, as every metric scores it
                out[name][reduce((~known).astype(np.int64), starts) > 0] = np.nan
        else:
            fn = METRICS[name][0]
            out[name] = np.array([_label_score(fn, y[a:b], predicted[a:b])
                                  for a, b in zip(starts, bounds[1:])])
    return {name: out[name] for name in names}


def _label_score(fn: Callable[..., float], y: np.ndarray, predicted: np.ndarray) -> float:
    """scikit-learn's ``fn`` of one window; NaN where a prediction is missing
    (a failed forecast), as every other metric scores it: scikit-learn
    raised "Input y_pred contains NaN", failing the whole group."""
    if known_actuals(np.asarray(predicted)) is not None:
        return float("nan")
    return fn(y, predicted)


def window_score_lists(names: list[str], y: np.ndarray, predicted: np.ndarray,
                       bounds: np.ndarray, train_targets: list[np.ndarray]
                       ) -> dict[str, list[float | None]]:
    """:func:`window_scores` as lists, a window's score None where it is
    undefined whatever the forecast: ``r2`` of fewer than two rows, ``mase``
    of a flat history, any score of a window with no actual. A test row
    whose actual is missing is not scored (as statsforecast's evaluation
    skips it). So NaN is left to a forecast that failed (a NaN prediction
    of a known actual), which :func:`.windowtable.mean_scores` does not
    average away: a candidate that forecast NaN on its worst window would
    otherwise have it left out and win."""
    windows = len(bounds) - 1
    known = known_actuals(y)
    if known is not None:
        kept = np.add.reduceat(known.astype(np.int64), bounds[:-1]) if len(y) else np.zeros(0)
        kept = np.where(np.diff(bounds) > 0, kept, 0)
    else:
        kept = np.diff(bounds)
    scored = np.flatnonzero(kept > 0)
    lists: dict[str, list[float | None]] = {name: [None] * windows for name in names}
    if not len(scored):
        return lists
    if known is not None:
        y, predicted = y[known], predicted[known]
        bounds = np.concatenate(([0], np.cumsum(kept[scored])))
        train_targets = [train_targets[w] for w in scored] if train_targets else []
    scores = window_scores(names, y, predicted, bounds, train_targets)
    undefined = {"r2": kept[scored] < 2,
                 "mase": np.isnan(_naive_scales(train_targets)) if "mase" in names else None}
    for name, values in scores.items():
        target = lists[name]
        flags = undefined.get(name)
        for position, window in enumerate(scored.tolist()):
            if flags is None or not flags[position]:
                target[window] = float(values[position])
    return lists


def known_actuals(y: np.ndarray) -> np.ndarray | None:
    """Which test rows have an actual (None: all of them, the usual case)."""
    if y.dtype.kind == "f":
        missing = np.isnan(y)
    elif y.dtype == object:
        import pandas as pd

        missing = np.asarray(pd.isna(y), dtype=bool)
    else:
        return None
    return ~missing if missing.any() else None


def _naive_scales(train_targets: list[np.ndarray]) -> np.ndarray:
    """:func:`mase`'s scale per window (NaN where it is 0 or undefined)."""
    return np.array([naive_scale(history) for history in train_targets], dtype=float)
