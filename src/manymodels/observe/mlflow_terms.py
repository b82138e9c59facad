"""What the MLflow tracker logs, in MLflow's terms: metric and param names
MLflow accepts (kept apart by a hash where they had to change), a param's
text, a metric's summary statistics, a results table Parquet can write, the
ranking of the models to log, and the probe of a tracking server. The
tracker's lifecycle (a background thread, one MLflow run per run) is
:mod:`.tracking`'s."""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from ..evaluation.metrics import direction

PROBE_TIMEOUT_S = 5.0


def metric_name(name: str, limit: int = 250) -> str:
    """A name MLflow accepts (letters, digits, ``_ - . / :`` and spaces; 250 at most;
    a normal relative path): a metric ``r²`` is logged as ``r_`` and a few letters
    of its hash, not refused with the whole batch (the hash keeps ``r³`` apart from
    it); one MLflow refuses as a path (``a//b``, ``/abs``, ``x/``, ``./y``, ``..``)
    has its slashes and dots made ``_``, and the tag too."""
    text = str(name)
    accepted = re.sub(r"[^\w\-. /:]|[^\x00-\x7f]", "_", text)
    if accepted == text and len(text) <= limit and not refused_as_path(text):
        return text
    if refused_as_path(accepted):
        accepted = re.sub(r"[/.]", "_", accepted)
    tag = hashlib.blake2b(text.encode(), digest_size=3).hexdigest()
    return f"{accepted[:limit - 7]}_{tag}"


def refused_as_path(name: str) -> bool:
    """MLflow's test (``path_not_unique``): a name must be its own normal
    relative path, as it may become a file's path in the artifact store."""
    norm = posixpath.normpath(name)
    return norm != name or norm == "." or norm.startswith("..") or norm.startswith("/")


def param_text(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= 6000 else text[:5997] + "..."


def ranking(log_models: int, metric: Any, greater_is_better: bool | None
             ) -> tuple[str | None, bool | None]:
    """``(metric, higher is better)`` for ranking the models ``log_models``
    logs; a metric whose direction is unknown is refused, not guessed."""
    if metric is None:
        if log_models:
            raise ValueError(f"MLflow(log_models={log_models}) needs metric=, the metric that "
                             "ranks the models: e.g. metric='rmse', or "
                             "metric=('val_accuracy', 'max')")
        return None, greater_is_better
    given = None
    if isinstance(metric, tuple) and len(metric) == 2 and isinstance(metric[0], str):
        metric, given = metric
    elif not isinstance(metric, str):
        raise TypeError(f"MLflow(metric=) must be a metric name or (name, 'min'|'max'), "
                        f"got {metric!r}")
    if greater_is_better is not None:
        if not isinstance(greater_is_better, bool):
            raise TypeError(f"greater_is_better must be True or False, got "
                            f"{greater_is_better!r}")
        said = "max" if greater_is_better else "min"
        if given is not None and given != said:
            raise ValueError(f"MLflow(metric=({metric!r}, {given!r})) contradicts "
                             f"greater_is_better={greater_is_better}")
        given = said
    if not log_models:  # nothing is ranked: no direction needed
        return metric, None if given is None else given == "max"
    return metric, direction(metric, given, f"metric=({metric!r}, 'max') or "
                                            "greater_is_better=True")


def check_answers(uri: str, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Refuse, within ``timeout_s`` and without retries, an HTTP tracking server
    that does not answer (any HTTP answer will do, an error status too): MLflow's
    own client retries each call for minutes (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``,
    ``MLFLOW_HTTP_REQUEST_TIMEOUT``). Other stores (files, databases) are local."""
    if urllib.parse.urlsplit(uri).scheme not in ("http", "https"):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s):
            pass
    except urllib.error.HTTPError:
        return  # it answered
    except (OSError, ValueError) as exc:
        raise ConnectionError(f"the MLflow tracking server {uri} does not answer "
                              f"({exc})") from None


def check_store_accepted(uri: str, mlflow: Any) -> None:
    """Refuse, before any work, a tracking URI naming MLflow's file store (a
    ``file:`` URI or a plain path) where this MLflow refuses that store (its
    ``MLFLOW_ALLOW_FILE_STORE`` is off): MLflow itself refuses it only once
    the run has made its first MLflow call, when all the run could do is
    warn and go on unlogged."""
    scheme = urllib.parse.urlsplit(uri).scheme
    if scheme not in ("", "file") and len(scheme) != 1:  # (one letter: a Windows drive)
        return
    allowed = getattr(getattr(mlflow, "environment_variables", None),
                      "MLFLOW_ALLOW_FILE_STORE", None)
    if allowed is None or allowed.get():  # an MLflow that takes it, or told to
        return
    raise ValueError(f"mm.MLflow: the tracking URI {uri!r} is MLflow's file store, which "
                     f"MLflow {getattr(mlflow, '__version__', '')} refuses; give a database, "
                     "e.g. tracking_uri='sqlite:///mlflow.db', or set "
                     "MLFLOW_ALLOW_FILE_STORE=true to keep the file store")


def describe(name: str, values: Any) -> dict[str, float]:
    """A metric's summary over its finite values (one infinite value made
    the mean, std, p95 and max infinite or NaN, which MLflow cannot take),
    with ``.nonfinite``, the count of the others, where there are any."""
    import numpy as np

    if not len(values):
        return {}
    # r² and r³ apart (each with its tag) before the suffixes, with room for them
    name = metric_name(name, limit=250 - len(".nonfinite"))
    finite = values[np.isfinite(values.to_numpy(dtype=float))]
    described: dict[str, float] = {}
    if len(finite):
        quantiles = finite.quantile([0.05, 0.5, 0.95])
        described = {f"{name}.mean": finite.mean(), f"{name}.std": finite.std(ddof=0),
                     f"{name}.min": finite.min(), f"{name}.p05": quantiles[0.05],
                     f"{name}.p50": quantiles[0.5], f"{name}.p95": quantiles[0.95],
                     f"{name}.max": finite.max()}
    described[f"{name}.count"] = len(finite)
    if len(finite) < len(values):
        described[f"{name}.nonfinite"] = len(values) - len(finite)
    return described


def writable(results: Any) -> Any:
    """The results with mixed object columns (a key of ints and strings, a
    metric that is a list) as text, so that Parquet takes them."""
    frame = results.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            values = frame[column].dropna()
            if len(values) and not values.map(lambda v: isinstance(v, str)).all():
                frame[column] = frame[column].map(lambda v: None if v is None else str(v))
    return frame
