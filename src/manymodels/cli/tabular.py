"""The no-code job behind ``manymodels train``: one estimator per group of a
table, chosen by dotted name, evaluated on a holdout or by cross-validation,
with the best grid setting picked per group and refitted on all its rows."""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import itertools
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:
    from ..run.results import Run

from ..evaluation.metrics import CLASSIFICATION_METRICS, METRICS
from .fallback import fallback_or_error
from .keychecks import by_column_warnings
from .tables import exception_line


class ArgumentError(ValueError):
    """An argument refused before any work, with the option at fault
    (``option``, e.g. ``"--target"``), so that the command line can say which
    of its options to fix while Python callers still catch a ValueError."""

    def __init__(self, message: str, option: str) -> None:
        super().__init__(message)
        self.option = option


def import_estimator(dotted: str) -> type:
    """The estimator class named ``package.module.Class``. A module that
    cannot be imported, whatever it raises (a RuntimeError or a SyntaxError
    in its code, not only an ImportError), is a ValueError of one line that
    names it: the command line says that, not a page of traceback."""
    module_name, _, class_name = dotted.rpartition(".")
    if not module_name:
        raise ValueError(f"--model must be a dotted name like sklearn.linear_model.Ridge, "
                         f"got {dotted!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import module {module_name!r} for --model: {exc}") from exc
    except Exception as exc:  # its code raised (or does not parse): its first line
        raise ValueError(f"cannot import module {module_name!r} for --model: importing it "
                         f"raised {exception_line(exc)}") from exc
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
    """``name=value`` as ``(name, value)``; ``option`` names the source in the error."""
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
    from ..identity.codehash import package_version as version_of

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

    def splitter(self) -> Any:
        """The evaluation of ``mm.train(evaluate=...)``: a shuffled holdout
        (``test_size`` 0 scores the fit on its own rows) or ``cv`` folds."""
        from ..evaluation.splitters import holdout, kfold

        common = {"target": self.target, "features": self.features,
                  "metrics": self.metrics, "seed": self.seed}
        return kfold(self.cv, **common) if self.cv else holdout(self.test_size, **common)

    def fit(self, df: pd.DataFrame, **setting: Any) -> Any:
        return self.build(setting).fit(df[self.features], df[self.target])

    def __call__(self, df: pd.DataFrame) -> tuple[Any, dict[str, Any]]:
        from ..evaluation.splitters import WINDOWS
        from ..evaluation.windowed import evaluate_candidates
        from ..models.linear.fastpath import precomputed  # fitted in batches by mm.linear

        done = precomputed(self, df)
        if done is not None:
            return done
        first = self.metrics[0]
        model, scores, setting = evaluate_candidates(
            self.fit, df, self.settings(), self.splitter(), first, METRICS[first][1])
        metrics: dict[str, Any] = {k: v for k, v in scores.items() if k != WINDOWS}
        metrics["rows"] = len(df)
        metrics.update({f"best_{name}": value for name, value in setting.items()})
        return model, metrics


@dataclass(frozen=True)
class TableRun:
    """What :func:`train_table` did: the run, the features and metrics it used,
    each metric's mean, and why no fallback model was kept (or None)."""

    run: Run
    features: list[str]
    metrics: list[str]
    means: dict[str, float]
    fallback_error: str | None = None
    path_note: str | None = None  # whether the batched linear fit (mm.linear) was used
    #: The columns that are neither keys, target nor features: with the
    #: features chosen (every numeric column), what was left out as not numeric
    left_out: tuple[str, ...] = ()


def _is_numeric(kind: Any) -> bool:
    import pyarrow.types as pat

    return (pat.is_integer(kind) or pat.is_floating(kind) or pat.is_boolean(kind)
            or pat.is_decimal(kind))


def _check_metrics(names: list[str], estimator: Any, model: str) -> None:
    """Refuse an unknown metric, or one that compares class labels for a regressor."""
    from sklearn.base import is_regressor

    unknown = [m for m in names if m not in METRICS]
    if unknown:
        raise ArgumentError(f"unknown metric {unknown[0]!r}; choose from "
                            f"{', '.join(METRICS)}", "--metrics")
    labels = [m for m in names if m in CLASSIFICATION_METRICS] if is_regressor(estimator) else []
    if labels:
        numbers = [m for m in METRICS if m not in CLASSIFICATION_METRICS]  # (all of them)
        raise ArgumentError(f"metric {labels[0]!r} compares class labels, but {model} is a "
                            f"regressor; use {', '.join(numbers[:-1])} or {numbers[-1]}",
                            "--metrics")


def _check_split(test_size: float | None, cv: int | None) -> float | None:
    """The holdout fraction to use (0.2 unless given, None with ``cv``)."""
    if test_size is not None and cv is not None:
        raise ArgumentError("give --test-size or --cv, not both", "--test-size/--cv")
    if cv is not None and cv < 2:
        raise ArgumentError(f"--cv needs at least 2 folds, got {cv}", "--cv")
    if cv is None:
        test_size = 0.2 if test_size is None else test_size
        if not 0 <= test_size < 1:  # 0: the training fit's own scores
            raise ArgumentError(f"--test-size must lie in [0, 1), got {test_size}",
                                "--test-size")
    return test_size


def _check_columns(table: Any, where: str, by: list[str], target: str,
                   features: Sequence[str] | None) -> list[str]:
    """The feature columns (given, or every numeric one but ``by`` and
    ``target``), refusing a column that is missing or of the wrong kind."""
    columns = table.column_names
    types = {f.name: f.type for f in table.schema}
    if target not in columns:
        raise ArgumentError(f"target column {target!r} is not in {where}; its columns are "
                            f"{columns}", "--target")
    if target in by:
        raise ArgumentError(f"target column {target!r} is also a --by column", "--target")
    if features is None:
        chosen = [c for c in columns if c not in by + [target] and _is_numeric(types[c])]
        if not chosen:
            raise ArgumentError("no numeric feature columns besides --by and --target",
                                "--features")
        return chosen
    chosen = list(features)
    missing = [c for c in chosen if c not in columns]
    if missing:
        raise ArgumentError(f"feature column {missing[0]!r} is not in {where}; its columns "
                            f"are {columns}", "--features")
    if target in chosen:
        raise ArgumentError(f"--target {target!r} is also a feature column", "--features")
    keys = [c for c in chosen if c in by]
    if keys:  # one value within each group: it tells the group's model nothing
        raise ArgumentError(f"feature column {keys[0]!r} is also a --by column, which has "
                            "one value within each group: leave it out of --features",
                            "--features")
    text = [c for c in chosen if not _is_numeric(types[c])]
    if text:
        raise ArgumentError(f"feature column {text[0]!r} is not numeric (its type is "
                            f"{types[text[0]]})", "--features")
    return chosen


#: The columns ``manymodels predict`` adds to its DATA's (a DATA holding one is refused).
PREDICTION_COLUMNS = ("prediction", "source")


def _check_predictable(by: list[str], features: list[str]) -> None:
    """Refuse a key or feature column that ``manymodels predict`` could never
    be given: one named as a column its output adds, which it refuses in
    its DATA (the models were trained, and no row could be predicted)."""
    for option, names in (("--by", by), ("--features", features)):
        taken = [name for name in names if name in PREDICTION_COLUMNS]
        if taken:
            raise ArgumentError(f"column {taken[0]!r} is a column manymodels predict adds to "
                                "its output, so it could not read it from its DATA: rename "
                                "it" + (", or leave it out of --features"
                                        if option == "--features" else ""), option)


def _with_reuse(path_note: str, reused: int, groups: int) -> str:
    """The fast path's note, saying which models the store gave: the batched
    fit runs before the store says what it holds, so that its "fitted and
    scored 8 of 8 groups" stood beside 7 models reused from the store."""
    if reused and reused == groups:
        return "every group's model reused from the store: none fitted"
    if reused and path_note.startswith("fast path:"):
        return f"{path_note}; the store's models kept for {reused:,} unchanged groups"
    return path_note


def _check_run_options(backend: str, timeout: float | None,
                       store: str | os.PathLike[str]) -> None:
    """Refuse, before the data is read (and, for a linear model, fitted in
    batches), a backend, timeout or store that ``mm.train`` would refuse
    only then: an unknown backend, a timeout that is not a positive number
    of seconds or that the backend cannot enforce, a store path that is a
    file."""
    from ..engine.backends import backend_class
    from ..engine.options import check_timeout
    from ..inputs.objectstores import is_remote

    try:
        kind = backend_class(backend)
    except (ValueError, ImportError) as exc:
        raise ArgumentError(str(exc), "--backend") from exc
    try:  # (mm.train's own check, said in the command's words)
        check_timeout(timeout, kind, backend)
    except ValueError as exc:
        text = str(exc).replace("timeout=", "--timeout").replace(
            "backend='processes'", "--backend processes")
        raise ArgumentError(text, _run_option(exc)) from exc
    if not is_remote(str(store)):
        _check_store_path(Path(store))


def _check_store_path(store: Path) -> None:
    """Refuse a store path that is a file, or under one (``afile/models``):
    the latter was found only when the store was made, after the data was
    read and, for a linear model, fitted."""
    if store.is_file():
        raise ArgumentError(f"store path {str(store)!r} is a file, not a directory", "--store")
    above = next((folder for folder in store.absolute().parents if folder.exists()), None)
    if above is not None and not above.is_dir():
        raise ArgumentError(f"store path {str(store)!r} is under {str(above)!r}, a file, not "
                            "a directory", "--store")


def _run_option(exc: Exception) -> str:
    """The option of ``manymodels train`` that ``mm.train`` refused, by what
    its message names first (a store path that is a file is ``--store``'s
    fault, not that of four options named together)."""
    from ..store import StoreError

    text = str(exc)
    if isinstance(exc, StoreError) or text.startswith("store"):
        return "--store"
    for word, option in (("timeout", "--timeout"), ("workers", "--workers")):
        if text.startswith(word):
            return option
    if "backend" in text.split(":")[0]:  # unknown backend 'x'; the threads backend cannot...
        return "--backend" + ("/--timeout" if "timeout" in text else "")
    return "--backend/--workers/--timeout/--store"


def _estimator_kinds() -> tuple[Any, Any]:
    """scikit-learn's ``is_classifier`` and ``is_regressor``, which tell the
    metrics and the splits to use. scikit-learn is no dependency of the
    package itself, so where it is missing this is an :class:`ArgumentError`
    saying how to install it, before any work, rather than an ImportError
    that the command line could only blame on some option."""
    try:
        from sklearn.base import is_classifier, is_regressor
    except ImportError as exc:
        raise ArgumentError(f"manymodels train needs scikit-learn, which cannot be imported "
                            f"({exc}): pip install 'manymodels[sklearn]'", "--model") from exc
    return is_classifier, is_regressor


def train_table(data: Any, by: str | Sequence[str], target: str, model: str, *,
                store: str | os.PathLike[str], features: Sequence[str] | None = None,
                params: Mapping[str, Any] | None = None,
                grid: Mapping[str, Sequence[Any]] | None = None,
                metrics: Sequence[str] | None = None, test_size: float | None = None,
                cv: int | None = None, fallback: bool = True, backend: str = "processes",
                workers: int | None = None, timeout: float | None = None,
                track: Any = None, warn: Callable[[str], None] | None = None) -> TableRun:
    """Train one ``model`` (an estimator class by dotted name) per ``by`` group
    of ``data`` (a CSV/Parquet path or a table) to predict ``target``, score it
    on a holdout (``test_size``, default 0.2) or by ``cv`` folds, keep each
    group's best ``grid`` setting, and record it all in ``store``.

    This is ``manymodels train`` as a function, so that the command line only
    parses and prints. Every argument that can be refused is refused before the
    data is read or the store is opened, as an :class:`ArgumentError` (a
    ValueError) naming the option at fault: a typo should cost seconds, not a
    run. ``features`` defaults to every numeric column but ``by`` and
    ``target``; ``metrics`` to r2, mae for a regressor and accuracy for a
    classifier, the first one picking the best setting. With ``fallback`` a
    global model, fitted on all rows, is attached to the run for groups that
    have none; if that fit fails the run is kept and ``fallback_error`` says why.
    A ``by`` column that is all missing, or keys unique per row, is said
    before any work (``warn``, default a ``UserWarning``), not refused.
    """
    is_classifier, is_regressor = _estimator_kinds()

    from ..api import train  # (not `import manymodels`: the layer contract sees these)
    from ..inputs.sources import groups

    params, grid = dict(params or {}), {k: list(v) for k, v in (grid or {}).items()}
    both = [name for name in grid if name in params]
    if both:
        raise ArgumentError(f"{both[0]!r} is given both as --param and as --grid",
                            "--model/--param/--grid")
    try:
        estimator = check_settings(model, params, grid)
    except ValueError as exc:
        raise ArgumentError(str(exc), "--model/--param/--grid") from exc
    classifier = is_classifier(estimator)
    metric_names = list(metrics or []) or (["accuracy"] if classifier else ["r2", "mae"])
    _check_metrics(metric_names, estimator, model)
    test_size = _check_split(test_size, cv)
    _check_run_options(backend, timeout, store)
    by_columns = [by] if isinstance(by, str) else list(by)
    try:
        table = groups(data, by=by_columns).table
    except (ValueError, TypeError) as exc:  # a --by column's fault, or the data's
        raise ArgumentError(str(exc), "--by" if str(exc).startswith("by column")
                            else "DATA") from exc
    where = repr(data) if isinstance(data, (str, os.PathLike)) else "the table"
    feature_columns = _check_columns(table, where, by_columns, target, features)
    for line in by_column_warnings(table, by_columns):
        if warn is None:
            warnings.warn(line, UserWarning, stacklevel=2)
        else:
            warn(line)
    _check_predictable(by_columns, feature_columns)
    target_type = table.schema.field(target).type
    if is_regressor(estimator) and not _is_numeric(target_type):
        raise ArgumentError(f"target column {target!r} is not numeric (its type is "
                            f"{target_type}) but {model} is a regressor", "--target")
    if classifier and not _is_numeric(target_type):
        numbers = [m for m in metric_names if m not in CLASSIFICATION_METRICS]
        if numbers:
            raise ArgumentError(f"metric {numbers[0]!r} needs a numeric target, and "
                                f"{target!r} is not: use {', '.join(CLASSIFICATION_METRICS)}",
                                "--metrics")
    task = GroupModelTask(model, target, feature_columns, params, grid, metric_names,
                          test_size, cv)
    from ..models.linear.fastpath import try_fast  # LinearRegression/Ridge: batched, same outputs

    path_note = try_fast(task, table, by_columns)
    try:
        run = train(task, groups(table, by=by_columns), store=store, backend=backend,
                       workers=workers, timeout=timeout, track=track)
    except (ValueError, TypeError) as exc:
        if getattr(exc, "run", None) is not None:  # the store failed mid-run (a full disk)
            raise
        raise ArgumentError(str(exc), _run_option(exc)) from exc
    if path_note is not None:
        path_note = _with_reuse(path_note, run.summary().reused, len(run.results))
    with run.store._one_publication():  # an object store's index: uploaded once for both
        run.store.attach(run.run_id, "train_config", {
            "by": by_columns, "target": target, "features": feature_columns, "model": model,
            "params": params, "grid": grid, "metrics": metric_names})
        fallback_error = None
        if fallback:
            global_model, fallback_error = fallback_or_error(task, table, run)
            if fallback_error is None:
                run.store.attach(run.run_id, "fallback", global_model)
    means = {m: run.results[m].mean() for m in metric_names if m in run.results}
    left_out = tuple(c for c in table.column_names
                     if c not in {*by_columns, target, *feature_columns})
    return TableRun(run, feature_columns, metric_names, means, fallback_error, path_note,
                    left_out)
