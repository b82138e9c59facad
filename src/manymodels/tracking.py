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
import re
import tempfile
import time
from pathlib import Path
from typing import Any

from .callbacks import Callback, Progress, RunInfo

_NOT_METRICS = {"status", "attempts", "duration_s", "worker", "started_s", "reused", "error",
                "run_id"}
_PROGRESS_EVERY_S = 10.0


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
      (default 0); ``metric`` picks them, lowest first unless ``greater_is_better``
      (default: the first metric ``fit`` returned, higher is better for names
      like ``r2``/``accuracy``/``score``, lower for the rest).
    * ``tags``: more tags for the MLflow run.
    """

    def __init__(self, experiment: str | None = None, *, tracking_uri: str | None = None,
                 run_name: str | None = None, log_models: int = 0, metric: str | None = None,
                 greater_is_better: bool | None = None, tags: dict[str, str] | None = None
                 ) -> None:
        if not isinstance(log_models, int) or isinstance(log_models, bool) or log_models < 0:
            raise ValueError(f"log_models must be a count >= 0, got {log_models!r}")
        _mlflow()  # refuse now, not after an hour of training
        self.experiment, self.tracking_uri, self.run_name = experiment, tracking_uri, run_name
        self.log_models, self.metric = log_models, metric
        self.greater_is_better, self.tags = greater_is_better, dict(tags or {})
        #: The MLflow run id of the last manymodels run logged.
        self.run_id: str | None = None
        self._client: Any = None
        self._info: RunInfo | None = None
        self._last_progress = 0.0

    def __repr__(self) -> str:
        return f"MLflow(experiment={self.experiment!r}, tracking_uri={self.tracking_uri!r})"

    def on_run_start(self, info: RunInfo) -> None:
        mlflow = _mlflow()
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
        self.run_id, self._info = run.info.run_id, info
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

    def on_batch(self, progress: Progress) -> None:
        now = time.monotonic()
        if self.run_id is None or now - self._last_progress < _PROGRESS_EVERY_S:
            return
        self._last_progress = now
        self._log_metrics({"progress.done": progress.done, "progress.ok": progress.ok,
                           "progress.failed": progress.failed}, step=progress.done)

    def _log_metrics(self, values: dict[str, float], step: int = 0) -> None:
        Metric = _mlflow().entities.Metric
        stamp = int(time.time() * 1000)
        metrics = [Metric(_name(k), float(v), stamp, step) for k, v in values.items()
                   if v is not None and math.isfinite(float(v))]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            self._client.log_batch(self.run_id, metrics=metrics[start:start + 1000])

    def on_run_end(self, run: Any) -> None:
        if self.run_id is None:
            return
        status = "FAILED"  # what the MLflow run ends as if logging fails: never left RUNNING
        try:
            status = self._log_run(run)
        finally:
            self._client.set_terminated(self.run_id, status)

    def _log_run(self, run: Any) -> str:
        """Log the run's summary, metrics, results and best models; its status."""
        summary, results = run.summary(), run.results
        values: dict[str, float] = {
            "tasks": summary.tasks, "ok": summary.ok, "failed": summary.failed,
            "reused": summary.reused, "wall_s": summary.wall_s,
            "task_time_s": summary.task_time_s, "utilization": summary.utilization,
            **{f"status.{k}": v for k, v in summary.statuses.items()}}
        durations = results["duration_s"][results["status"] == "ok"].dropna()
        if len(durations):
            values.update(_describe("duration_s", durations))
        for column in self._metric_columns(results):
            values.update(_describe(column, results[column].dropna().astype(float)))
        self._log_metrics(values)
        with tempfile.TemporaryDirectory(prefix="manymodels-mlflow-") as tmp:
            table = Path(tmp) / "results.parquet"
            _writable(results).to_parquet(table, index=False)
            self._client.log_artifact(self.run_id, str(table))
            self._client.log_artifact(self.run_id, str(run.report(Path(tmp) / "report.html")))
        if self.log_models:
            self._log_best_models(run, results)
        return "FINISHED" if summary.ok + summary.failed == summary.tasks else "KILLED"

    def _metric_columns(self, results: Any) -> list[str]:
        import pandas as pd

        key_columns = set(self._info.key_columns if self._info else [])
        return [c for c in results.columns if c not in _NOT_METRICS and c not in key_columns
                and pd.api.types.is_numeric_dtype(results[c])
                and not pd.api.types.is_bool_dtype(results[c])]

    def _log_best_models(self, run: Any, results: Any) -> None:
        """The best ``log_models`` models by ``metric``, each an MLflow model
        under ``models/<rank>`` with its key as a tag."""
        columns = self._metric_columns(results)
        metric = self.metric or (columns[0] if columns else None)
        if metric is None or metric not in results.columns:
            raise ValueError(f"MLflow(log_models=...) needs a metric; the results have "
                             f"{columns or 'none'}")
        higher = self.greater_is_better
        if higher is None:
            higher = any(word in metric.lower()
                         for word in ("r2", "acc", "score", "auc", "f1", "precision", "recall"))
        ok = results[(results["status"] == "ok") & results[metric].notna()]
        best = (ok.nlargest if higher else ok.nsmallest)(self.log_models, metric)
        key_columns = self._info.key_columns if self._info else []
        import mlflow.sklearn

        with tempfile.TemporaryDirectory(prefix="manymodels-mlflow-") as tmp:
            for rank, (_, row) in enumerate(best.iterrows(), 1):
                key = tuple(row[c] for c in key_columns)
                key = key[0] if len(key) == 1 else key
                try:
                    model = run.models[key]
                except KeyError:  # fit returned metrics alone
                    continue
                # saved, then logged through the client: the fluent API's global
                # tracking URI and active run are the user's, not ours to change
                folder = Path(tmp) / f"model-{rank}"
                mlflow.sklearn.save_model(
                    model, str(folder), serialization_format="cloudpickle",
                    pip_requirements=[], metadata={"manymodels_key": repr(key),
                                                   metric: float(row[metric])})
                self._client.log_artifacts(self.run_id, str(folder), f"models/model-{rank}")
                self._client.set_tag(self.run_id, f"manymodels.model-{rank}",
                                     f"{key!r}: {metric}={row[metric]:.6g}")


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
