"""The no-code job behind ``manymodels train``: one estimator per group of a
table, chosen by dotted name, evaluated on a holdout or by cross-validation,
with the best grid setting picked per group and refitted on all its rows."""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import itertools
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

#: name -> (function(y_true, y_pred), higher is better)
METRICS: dict[str, tuple[Callable[..., float], bool]] = {}
#: The metrics that compare class labels (the others compare numbers).
CLASSIFICATION_METRICS = ("accuracy", "f1", "balanced_accuracy")


def _metrics() -> dict[str, tuple[Callable[..., float], bool]]:
    if not METRICS:
        from sklearn import metrics as m

        METRICS.update({
            "r2": (m.r2_score, True),
            "mae": (m.mean_absolute_error, False),
            "mse": (m.mean_squared_error, False),
            "rmse": (lambda t, p: math.sqrt(m.mean_squared_error(t, p)), False),
            "mape": (m.mean_absolute_percentage_error, False),
            "accuracy": (m.accuracy_score, True),
            "f1": (lambda t, p: m.f1_score(t, p, average="weighted"), True),
            "balanced_accuracy": (m.balanced_accuracy_score, True),
        })
    return METRICS


def import_estimator(dotted: str) -> type:
    """The estimator class named ``package.module.Class``."""
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"--model must be a dotted name like sklearn.linear_model.Ridge, "
                         f"got {dotted!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for --model: {exc}") from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        raise ValueError(f"module {module_name!r} has no {class_name!r} (--model)")
    if not callable(getattr(cls, "fit", None)) or not callable(getattr(cls, "predict", None)):
        raise ValueError(f"--model {dotted!r} is not an estimator with fit and predict")
    return cls


def parse_value(text: str) -> Any:
    """``1.0`` -> 1.0, ``true`` -> True, ``none`` -> None, anything else a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError):
        return text.strip()


def parse_assignment(text: str, option: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise ValueError(f"{option} expects name=value, got {text!r}")
    return name.strip(), value


def constructor_parameters(cls: type) -> tuple[list[str], bool]:
    """The keyword parameters that ``cls(...)`` takes, and whether it also takes
    any other keyword (a ``**kwargs``, as LightGBM's and XGBoost's estimators do,
    passing unknown names on to their library)."""
    names: list[str] = []
    open_ended = False
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # a class defined in C: cannot tell
        return names, True
    for parameter in signature.parameters.values():
        if parameter.kind is parameter.VAR_KEYWORD:
            open_ended = True
        elif parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            names.append(parameter.name)
    if callable(getattr(cls, "get_params", None)):  # scikit-learn's own list, where it differs
        try:
            names += [n for n in cls().get_params(deep=False) if n not in names]
        except Exception:  # a constructor with required arguments
            pass
    return names, open_ended


def _invalid_parameter(estimator: Any) -> str | None:
    """scikit-learn's message for a parameter value that ``estimator`` declares
    invalid (a negative ``alpha``, an unknown ``solver``), or None."""
    if not hasattr(type(estimator), "_parameter_constraints"):
        return None
    try:
        from sklearn.utils._param_validation import InvalidParameterError
    except ImportError:  # pragma: no cover - an old scikit-learn
        return None
    try:
        estimator._validate_params()
    except InvalidParameterError as exc:
        return str(exc)
    except Exception:  # cannot tell before fitting: let fit say
        return None
    return None


def check_settings(dotted: str, params: dict[str, Any], grid: dict[str, list[Any]]) -> Any:
    """Refuse, before any work, a ``--param`` or ``--grid`` name that the
    estimator class ``dotted`` does not take, or a value that it rejects; return
    the estimator built with ``params`` and the first value of each grid list."""
    cls = import_estimator(dotted)
    names, open_ended = constructor_parameters(cls)
    if not open_ended:
        for option, given in (("--param", params), ("--grid", grid)):
            for name in given:
                if name in names:
                    continue
                close = difflib.get_close_matches(name, names, n=1)
                raise ValueError(
                    f"{option} {name!r}: {dotted} has no parameter {name!r}"
                    + (f"; did you mean {close[0]!r}?" if close else ".")
                    + f" Its parameters are: {', '.join(names) or '(none)'}")
    base = {**params, **{name: values[0] for name, values in grid.items() if values}}
    checks = [(None, base)] + [(f"--grid {name}={value!r}", {**base, name: value})
                               for name, values in grid.items() for value in values]
    first = None
    for option, setting in checks:
        call = f"{dotted}({', '.join(f'{k}={v!r}' for k, v in setting.items())})"
        try:
            estimator = cls(**setting)
        except Exception as exc:  # any constructor error is the user's to fix
            raise ValueError(f"{option + ': ' if option else ''}{call} cannot be built: "
                             f"{exc}") from exc
        problem = _invalid_parameter(estimator)
        if problem:
            raise ValueError(f"{option}: {problem}" if option else f"{call}: {problem}")
        first = estimator if first is None else first
    return first


def _package_version(dotted: str) -> str:
    from .hashing import _package_version as version_of

    return version_of(dotted) or dotted


class GroupModelTask:
    """The ``fit`` of ``manymodels train``: picklable, and its settings are part
    of the task identity (a store reuses a model only for the same settings)."""

    def __init__(self, model: str, target: str, features: list[str], params: dict[str, Any],
                 grid: dict[str, list[Any]], metrics: list[str], test_size: float | None,
                 cv: int | None, seed: int = 0) -> None:
        self.model, self.target, self.features = model, target, list(features)
        self.params, self.grid, self.metrics = dict(params), dict(grid), list(metrics)
        self.test_size, self.cv, self.seed = test_size, cv, seed
        self.version = _package_version(model)

    def settings(self) -> list[dict[str, Any]]:
        names = list(self.grid)
        return [dict(zip(names, combo)) for combo in itertools.product(*self.grid.values())] \
            or [{}]

    def build(self, setting: dict[str, Any]) -> Any:
        return import_estimator(self.model)(**{**self.params, **setting})

    def _score(self, setting: dict[str, Any], X: np.ndarray, y: np.ndarray) -> dict[str, float]:
        table = _metrics()
        if self.cv:
            from sklearn.model_selection import KFold

            folds = KFold(self.cv, shuffle=True, random_state=self.seed).split(X)
        else:
            from sklearn.model_selection import train_test_split

            train, test = train_test_split(np.arange(len(y)), test_size=self.test_size,
                                           random_state=self.seed)
            folds = [(train, test)]
        scores: dict[str, list[float]] = {name: [] for name in self.metrics}
        for train, test in folds:
            model = self.build(setting).fit(X[train], y[train])
            predicted = model.predict(X[test])
            for name in self.metrics:
                scores[name].append(float(table[name][0](y[test], predicted)))
        return {name: float(np.mean(values)) for name, values in scores.items()}

    def __call__(self, df: pd.DataFrame) -> tuple[Any, dict[str, Any]]:
        X = df[self.features].to_numpy()
        y = df[self.target].to_numpy()
        settings = self.settings()
        enough = len(y) >= max(2, self.cv or 0) and (self.cv or self.test_size)
        results: list[tuple[dict, dict]] = []
        if enough:
            results = [(setting, self._score(setting, X, y)) for setting in settings]
            first = self.metrics[0]
            higher = _metrics()[first][1]
            best_setting, best_scores = (max if higher else min)(
                results, key=lambda pair: pair[1][first])
        else:  # too few rows to hold any out: fit on all, no scores
            best_setting, best_scores = settings[0], {m: float("nan") for m in self.metrics}
        model = self.build(best_setting).fit(X, y)
        metrics: dict[str, Any] = dict(best_scores)
        metrics["rows"] = len(y)
        metrics.update({f"best_{name}": value for name, value in best_setting.items()})
        return model, metrics
