"""Recording runs where teams already track experiments: MLflow.

``mm.train(..., track=mm.MLflow(experiment="sales"))`` makes ONE MLflow run
per manymodels run, never one per model (a million MLflow runs is what makes
an MLflow server unusable): the options and the code identity as params,
progress while it runs, the summary (ok, failed, wall, utilization, each
metric's mean and quantiles) as metrics, the results table (Parquet) and the
HTML report as artifacts, and optionally the best ``log_models`` models by
``metric`` as MLflow models. It is a :class:`manymodels.Callback`, so other
trackers are a few lines alike.
"""

from __future__ import annotations

import hashlib
import json
import math
import posixpath
import queue
import re
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..engine.messages import Status
from ..evaluation.metrics import direction
from .callbacks import Callback, Progress, RunInfo

_NOT_METRICS = {"status", "attempts", "duration_s", "worker", "started_s", "reused", "error",
                "run_id"}
_PROGRESS_EVERY_S = 10.0
_PROBE_TIMEOUT_S = 5.0


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise ImportError("mm.MLflow needs MLflow: pip install 'manymodels[mlflow]'") from exc
    return mlflow


def _name(name: str) -> str:
    """A name MLflow accepts (letters, digits, ``_ - . / :`` and spaces; 250 at most;
    a normal relative path): a metric ``r²`` is logged as ``r_`` and a few letters
    of its hash, not refused with the whole batch (the hash keeps ``r³`` apart from
    it); one MLflow refuses as a path (``a//b``, ``/abs``, ``x/``, ``./y``, ``..``)
    has its slashes and dots made ``_``, and the tag too."""
    text = str(name)
    accepted = re.sub(r"[^\w\-. /:]|[^\x00-\x7f]", "_", text)
    if accepted == text and len(text) <= 250 and not _refused_as_path(text):
        return text
    if _refused_as_path(accepted):
        accepted = re.sub(r"[/.]", "_", accepted)
    tag = hashlib.blake2b(text.encode(), digest_size=3).hexdigest()
    return f"{accepted[:243]}_{tag}"


def _refused_as_path(name: str) -> bool:
    """MLflow's test (``path_not_unique``): a name must be its own normal
    relative path, as it may become a file's path in the artifact store."""
    norm = posixpath.normpath(name)
    return norm != name or norm == "." or norm.startswith("..") or norm.startswith("/")


def _param(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=repr)
    return text if len(text) <= 6000 else text[:5997] + "..."


class MLflow(Callback):
    """Log each manymodels run as one MLflow run.

    * ``experiment``: the MLflow experiment's name (created if missing).
    * ``tracking_uri``: where MLflow keeps runs (default: MLflow's own
      setting, ``MLFLOW_TRACKING_URI``), e.g. ``"sqlite:///mlflow.db"``.
    * ``run_name``: the MLflow run's name (default: MLflow's).
    * ``log_models``: how many of the best models to log as MLflow models
      (default 0); ``metric`` ranks them: a name whose direction manymodels
      knows (``"rmse"``, ``"r2"``, see :data:`manymodels.evaluation.metrics.METRICS`), or
      ``(name, "min"|"max")``, or a name with ``greater_is_better``. An
      unknown direction is refused here, not guessed from the name.
    * ``tags``: more tags for the MLflow run.
    * ``timeout``: how long, in seconds, the end of ``train`` waits for MLflow
      to take the run's summary (default 60); past it, the logging goes on in
      the background and a warning says so.

    MLflow is never waited on while the models train: every MLflow call runs on
    a background thread, in order, and a tracking server that does not answer
    (checked once, within a few seconds) costs one warning, not the retries
    MLflow's client would spend on each call.
    """

    def __init__(self, experiment: str | None = None, *, tracking_uri: str | None = None,
                 run_name: str | None = None, log_models: int = 0,
                 metric: str | tuple[str, str] | None = None,
                 greater_is_better: bool | None = None, tags: dict[str, str] | None = None,
                 timeout: float = 60.0) -> None:
        if not isinstance(log_models, int) or isinstance(log_models, bool) or log_models < 0:
            raise ValueError(f"log_models must be a count >= 0, got {log_models!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
        self.metric, self.greater_is_better = _ranking(log_models, metric, greater_is_better)
        _mlflow()  # refuse now, not after an hour of training
        self.experiment, self.tracking_uri, self.run_name = experiment, tracking_uri, run_name
        self.log_models, self.tags, self.timeout = log_models, dict(tags or {}), timeout
        #: The MLflow run id of the last manymodels run logged (set once MLflow
        #: has made the run, on the background thread).
        self.run_id: str | None = None
        self._client: Any = None
        self._info: RunInfo | None = None
        self._last_progress = 0.0
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None
        self._warned = False

    def __repr__(self) -> str:
        return f"MLflow(experiment={self.experiment!r}, tracking_uri={self.tracking_uri!r})"

    # -- the driver's side: quick, never waits on MLflow (but at the very end) --

    def on_run_start(self, info: RunInfo) -> None:
        self.run_id, self._info, self._failure, self._warned = None, info, None, False
        self._last_progress = 0.0  # the first round is logged at once
        self._jobs = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, args=(self._jobs,),
                                        name="manymodels-mlflow", daemon=True)
        self._thread.start()
        self._jobs.put(_Job(lambda: self._start(info)))

    def on_batch(self, progress: Progress) -> None:
        self._warn_once()
        now = time.monotonic()
        if now - self._last_progress < _PROGRESS_EVERY_S:
            return
        self._last_progress = now
        values = {"progress.done": progress.done, "progress.ok": progress.ok,
                  "progress.failed": progress.failed}
        self._jobs.put(_Job(lambda: self._log_metrics(values, step=progress.done)))

    def on_run_end(self, run: Any) -> None:
        if self._thread is None:
            return
        try:
            work = tempfile.TemporaryDirectory(prefix="manymodels-mlflow-")
            end: _End | Exception
            try:  # the run is read here, on the driver (its store is the driver's)
                end = self._prepare_end(run, Path(work.name))
            except Exception as exc:  # the MLflow run is marked FAILED, and this warned
                end = exc
            self._jobs.put(_Job(lambda: self._end(end), always=True))
            self._jobs.put(_Job(work.cleanup, always=True))
        finally:
            self._jobs.put(None)
        self._thread.join(self.timeout)
        if self._thread.is_alive():
            warnings.warn(f"mm.MLflow: MLflow has not taken the run's summary in "
                          f"{self.timeout:g} s; it goes on in the background (lost if Python "
                          "exits first)", RuntimeWarning, stacklevel=2)
            return
        self._warn_once()

    def _warn_once(self) -> None:
        if self._failure is not None and not self._warned:
            self._warned = True
            where = self.tracking_uri or _mlflow().get_tracking_uri()
            warnings.warn(f"mm.MLflow: logging to MLflow at {where} failed: {self._failure!r}; "
                          "the run goes on without it", RuntimeWarning, stacklevel=3)

    # -- the background thread: every MLflow call, in order ----------------------

    def _work(self, jobs: queue.SimpleQueue[_Job | None]) -> None:
        while (job := jobs.get()) is not None:
            if self._failure is not None and not job.always:
                continue  # MLflow refused or did not answer: the rest is skipped, not retried
            try:
                job.call()
            except Exception as exc:
                if self._failure is None:
                    self._failure = exc

    def _start(self, info: RunInfo) -> None:
        mlflow = _mlflow()
        _check_answers(self.tracking_uri or mlflow.get_tracking_uri())
        client = self._client = mlflow.MlflowClient(self.tracking_uri)
        experiment_id = "0"
        if self.experiment:
            found = client.get_experiment_by_name(self.experiment)
            experiment_id = (found.experiment_id if found is not None
                             else client.create_experiment(self.experiment))
        tags = {"manymodels.fit": info.fit, "manymodels.backend": info.backend, **self.tags}
        if info.store is not None:
            tags["manymodels.store"] = str(Path(info.store.path).resolve())
            tags["manymodels.run_id"] = str(info.run_id)
        run = client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        self.run_id = run.info.run_id
        params = {"fit": info.fit, "source": info.source, "backend": info.backend,
                  "tasks": info.tasks, "key_columns": info.key_columns,
                  **{f"option.{k}": v for k, v in info.options.items()},
                  "code_hash": info.code.get("code_hash"),
                  "code.versions": info.code.get("versions")}
        params.update({f"code.{name}": digest
                       for name, digest in list(info.code.get("sources", {}).items())[:50]})
        entries = [mlflow.entities.Param(_name(k), _param(v)) for k, v in params.items()]
        for start in range(0, len(entries), 100):  # MLflow's batch limit for params
            client.log_batch(self.run_id, params=entries[start:start + 100])
        client.log_metric(self.run_id, "reused", info.reused)

    def _log_metrics(self, values: dict[str, float], step: int = 0) -> None:
        Metric = _mlflow().entities.Metric
        stamp = int(time.time() * 1000)
        metrics = [Metric(_name(k), float(v), stamp, step) for k, v in values.items()
                   if v is not None and math.isfinite(float(v))]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self._client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def _end(self, end: _End | Exception) -> None:
        """End the MLflow run: FAILED, never left RUNNING, if its end could not
        be read or logged, or if MLflow refused something earlier (but not
        knocked on again when its server no longer answers)."""
        if self.run_id is None:
            return
        if self._failure is not None:
            _check_answers(self.tracking_uri or _mlflow().get_tracking_uri())
            self._client.set_terminated(self.run_id, "FAILED")
            return
        status = "FAILED"
        try:
            if isinstance(end, Exception):
                raise end
            status = self._log_end(end)
        finally:
            self._client.set_terminated(self.run_id, status)

    def _log_end(self, end: _End) -> str:
        self._log_metrics(end.progress, step=int(end.progress["progress.done"]))
        self._log_metrics(end.values)
        for path in end.artifacts:
            self._client.log_artifact(self.run_id, str(path))
        for rank, (folder, tag) in enumerate(end.models, 1):
            self._client.log_artifacts(self.run_id, str(folder), f"models/model-{rank}")
            self._client.set_tag(self.run_id, f"manymodels.model-{rank}", tag)
        return end.status

    # -- what the end logs, read from the run on the driver ----------------------

    def _prepare_end(self, run: Any, folder: Path) -> _End:
        """The run's summary, final progress, results table, report and best
        models, written under ``folder`` for the background thread to send."""
        summary, results = run.summary(), run.results
        values: dict[str, float] = {
            "tasks": summary.tasks, "ok": summary.ok, "failed": summary.failed,
            "reused": summary.reused, "wall_s": summary.wall_s,
            "task_time_s": summary.task_time_s, "utilization": summary.utilization,
            **{f"status.{k}": v for k, v in summary.statuses.items()}}
        durations = results["duration_s"][results["status"] == Status.OK].dropna()
        if len(durations):
            values.update(_describe("duration_s", durations))
        for column in self._metric_columns(results):
            values.update(_describe(column, results[column].dropna().astype(float)))
        # the last progress, whatever the throttle of on_batch skipped
        done = summary.ok + summary.failed
        progress = {"progress.done": done, "progress.ok": summary.ok,
                    "progress.failed": summary.failed}
        table = folder / "results.parquet"
        _writable(results).to_parquet(table, index=False)
        artifacts = [table, run.report(folder / "report.html")]
        models = self._save_best_models(run, results, folder) if self.log_models else []
        status = "FINISHED" if done == summary.tasks else "KILLED"
        return _End(progress, values, artifacts, models, status)

    def _metric_columns(self, results: Any) -> list[str]:
        import pandas as pd

        key_columns = set(self._info.key_columns if self._info else [])
        return [c for c in results.columns if c not in _NOT_METRICS and c not in key_columns
                and pd.api.types.is_numeric_dtype(results[c])
                and not pd.api.types.is_bool_dtype(results[c])]

    def _save_best_models(self, run: Any, results: Any, folder: Path
                          ) -> list[tuple[Path, str]]:
        """The best ``log_models`` models by ``metric``, each saved as an MLflow
        model, with the tag naming its key: ``(folder, tag)`` by rank."""
        metric = self.metric
        if metric not in results.columns:
            raise ValueError(f"MLflow(log_models=...): metric {metric!r} is not in the "
                             f"results; they have {self._metric_columns(results) or 'none'}")
        ok = results[(results["status"] == Status.OK) & results[metric].notna()]
        best = (ok.nlargest if self.greater_is_better else ok.nsmallest)(self.log_models, metric)
        key_columns = self._info.key_columns if self._info else []
        import mlflow.sklearn

        saved = []
        for rank, (_, row) in enumerate(best.iterrows(), 1):
            key = tuple(row[c] for c in key_columns)
            key = key[0] if len(key) == 1 else key
            try:
                model = run.models[key]
            except KeyError:  # fit returned metrics alone
                continue
            # saved, then logged through the client: the fluent API's global
            # tracking URI and active run are the user's, not ours to change
            target = folder / f"model-{rank}"
            mlflow.sklearn.save_model(
                model, str(target), serialization_format="cloudpickle",
                pip_requirements=[], metadata={"manymodels_key": repr(key),
                                               metric: float(row[metric])})
            saved.append((target, f"{key!r}: {metric}={row[metric]:.6g}"))
        return saved


@dataclass
class _End:
    """What the end of a run logs to MLflow (read on the driver, sent on the thread)."""

    progress: dict[str, float]
    values: dict[str, float]
    artifacts: list[Path]
    models: list[tuple[Path, str]]
    status: str


@dataclass
class _Job:
    """One step for the background thread; ``always``: run even after a failure."""

    call: Callable[[], Any]
    always: bool = False


def _ranking(log_models: int, metric: Any, greater_is_better: bool | None
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


def _check_answers(uri: str, timeout_s: float = _PROBE_TIMEOUT_S) -> None:
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


def _describe(name: str, values: Any) -> dict[str, float]:
    if not len(values):
        return {}
    name = _name(name)  # r² and r³ apart (each with its tag) before the suffixes
    quantiles = values.quantile([0.05, 0.5, 0.95])
    return {f"{name}.mean": values.mean(), f"{name}.std": values.std(ddof=0),
            f"{name}.min": values.min(), f"{name}.p05": quantiles[0.05],
            f"{name}.p50": quantiles[0.5], f"{name}.p95": quantiles[0.95],
            f"{name}.max": values.max(), f"{name}.count": len(values)}


def _writable(results: Any) -> Any:
    """The results with mixed object columns (a key of ints and strings, a
    metric that is a list) as text, so that Parquet takes them."""
    frame = results.copy()
    for column in frame.columns:
        if frame[column].dtype == object:
            values = frame[column].dropna()
            if len(values) and not values.map(lambda v: isinstance(v, str)).all():
                frame[column] = frame[column].map(lambda v: None if v is None else str(v))
    return frame
