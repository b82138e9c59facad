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

import math
import queue
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine.messages import Status
from ..inputs.objectstores import is_remote
from .callbacks import Callback, Progress, RunInfo
from .mlflow_terms import (
    check_answers,
    check_store_accepted,
    describe,
    metric_name,
    param_text,
    ranking,
    writable,
)

_NOT_METRICS = {"status", "attempts", "duration_s", "worker", "started_s", "reused", "error",
                "run_id"}
_PROGRESS_EVERY_S = 10.0


def _mlflow() -> Any:
    try:
        import mlflow
    except ImportError as exc:
        raise ImportError("mm.MLflow needs MLflow: pip install 'manymodels[mlflow]'") from exc
    return mlflow


class MLflow(Callback):
    """Log each manymodels run as one MLflow run.

    * ``experiment``: the MLflow experiment's name (created if missing).
    * ``tracking_uri``: where MLflow keeps runs (default: MLflow's own
      setting, ``MLFLOW_TRACKING_URI``), e.g. ``"sqlite:///mlflow.db"``. MLflow's
      file store (``"file:..."``, a path), which MLflow 3 refuses unless
      ``MLFLOW_ALLOW_FILE_STORE=true``, is refused here, before any work.
    * ``run_name``: the MLflow run's name (default: MLflow's).
    * ``log_models``: how many of the best models to log as MLflow models
      (default 0); ``metric`` ranks them: a name whose direction manymodels
      knows (``"rmse"``, ``"r2"``, see :data:`manymodels.evaluation.metrics.METRICS`), or
      ``(name, "min"|"max")``, or a name with ``greater_is_better``. An
      unknown direction is refused here, not guessed from the name.
    * ``tags``: more tags for the MLflow run.
    * ``timeout``: how long, in seconds, the end of ``train`` waits for MLflow
      to take the run's summary (default 60); past it, the logging goes on in
      the background and a warning says so; ``math.inf`` waits for as long as
      it takes.

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
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                timeout >= 0):  # (NaN too)
            raise ValueError(f"timeout must be a number of seconds >= 0 (math.inf: no "
                             f"limit), got {timeout!r}")
        self.metric, self.greater_is_better = ranking(log_models, metric, greater_is_better)
        for name, value in (("experiment", experiment), ("run_name", run_name)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"MLflow({name}=) must be a name (text), got {value!r}")
        tags = _tag_texts(tags)
        # refuse now, not after an hour of training: no MLflow, or a store it refuses
        check_store_accepted(tracking_uri or _mlflow().get_tracking_uri(), _mlflow())
        self.experiment, self.tracking_uri, self.run_name = experiment, tracking_uri, run_name
        self.log_models, self.tags, self.timeout = log_models, tags, timeout
        #: The latest run's MLflow state: each run has its own, so that a
        #: tracker used for a second run while the first one's logging goes on
        #: in the background keeps the two apart; and each thread's (runs that
        #: threads of one program make at once, with one tracker, each log to
        #: their own MLflow run: a run's callbacks come on the thread that
        #: called ``train``)
        self._session: _Session | None = None
        self._sessions = threading.local()

    @property
    def run_id(self) -> str | None:
        """The MLflow run id of the last manymodels run logged (set once MLflow
        has made the run, on the background thread)."""
        return None if self._session is None else self._session.run_id

    def __repr__(self) -> str:
        return f"MLflow(experiment={self.experiment!r}, tracking_uri={self.tracking_uri!r})"

    # -- the driver's side: quick, never waits on MLflow (but at the very end) --

    def _current(self) -> _Session | None:
        """This thread's run's MLflow state (the latest run's, where this
        thread started none)."""
        return getattr(self._sessions, "session", None) or self._session

    def on_run_start(self, info: RunInfo) -> None:
        # (its first round is logged at once)
        session = self._session = self._sessions.session = _Session(
            info=info, caller=self._callers_mlflow())
        session.thread = threading.Thread(target=self._work, args=(session,),
                                          name="manymodels-mlflow", daemon=True)
        session.thread.start()
        session.jobs.put(_Job(lambda: self._start(session, info)))

    def _callers_mlflow(self) -> _Caller:
        """What the caller's MLflow says, read on the caller's thread (its active
        run is that thread's) and without a call to any server: the run active
        around ``train`` and the experiment its own MLflow calls would use
        (``mlflow.set_experiment``, ``MLFLOW_EXPERIMENT_NAME`` or ``_ID``). Each
        counts only where it is of this tracker's tracking server."""
        mlflow = _mlflow()
        if self.tracking_uri is not None and self.tracking_uri != mlflow.get_tracking_uri():
            return _Caller()
        active = mlflow.active_run()
        variables = mlflow.environment_variables
        return _Caller(parent_run_id=None if active is None else active.info.run_id,
                       parent_experiment_id=None if active is None
                       else active.info.experiment_id,
                       experiment_name=variables.MLFLOW_EXPERIMENT_NAME.get(),
                       experiment_id=variables.MLFLOW_EXPERIMENT_ID.get())

    def on_batch(self, progress: Progress) -> None:
        session = self._current()
        if session is None:
            return
        self._warn_once(session)
        now = time.monotonic()
        if now - session.last_progress < _PROGRESS_EVERY_S:
            return
        session.last_progress = now
        values = {"progress.done": progress.done, "progress.ok": progress.ok,
                  "progress.failed": progress.failed}
        session.jobs.put(_Job(lambda: self._log_metrics(session, values, step=progress.done)))

    def on_run_end(self, run: Any) -> None:
        session = self._current()
        if session is None or session.thread is None:
            return
        try:
            work = tempfile.TemporaryDirectory(prefix="manymodels-mlflow-")
            end: _End | Exception
            try:  # the run is read here, on the driver (its store is the driver's)
                end = self._prepare_end(run, Path(work.name), session.info)
            except Exception as exc:  # the MLflow run is marked FAILED, and this warned
                end = exc
            session.jobs.put(_Job(lambda: self._end(session, end), always=True))
            session.jobs.put(_Job(work.cleanup, always=True))
        finally:
            session.jobs.put(None)
        # (math.inf waits for ever: a join of it overflowed, warned as a failure)
        session.thread.join(None if math.isinf(self.timeout) else self.timeout)
        if session.thread.is_alive():
            warnings.warn(f"mm.MLflow: MLflow has not taken the run's summary in "
                          f"{self.timeout:g} s; it goes on in the background (lost if Python "
                          "exits first)", RuntimeWarning, stacklevel=2)
            return
        self._warn_once(session)

    def _warn_once(self, session: _Session) -> None:
        if session.failure is not None and not session.warned:
            session.warned = True
            where = self.tracking_uri or _mlflow().get_tracking_uri()
            warnings.warn(f"mm.MLflow: logging to MLflow at {where} failed: "
                          f"{session.failure!r}; the run goes on without it", RuntimeWarning,
                          stacklevel=3)

    # -- the background thread: every MLflow call, in order ----------------------

    def _work(self, session: _Session) -> None:
        while (job := session.jobs.get()) is not None:
            if session.failure is not None and not job.always:
                continue  # MLflow refused or did not answer: the rest is skipped, not retried
            try:
                job.call()
            except Exception as exc:
                if session.failure is None:
                    session.failure = exc

    def _start(self, session: _Session, info: RunInfo) -> None:
        mlflow = _mlflow()
        check_answers(self.tracking_uri or mlflow.get_tracking_uri())
        client = session.client = mlflow.MlflowClient(self.tracking_uri)
        caller = session.caller
        experiment_id = _experiment_id(client, self.experiment, caller)
        tags = {"manymodels.fit": info.fit, "manymodels.backend": info.backend, **self.tags}
        if caller.parent_run_id is not None:  # nested in the caller's run, as MLflow nests
            tags.setdefault("mlflow.parentRunId", caller.parent_run_id)
        if info.store is not None:
            tags["manymodels.store"] = (str(info.store) if is_remote(info.store.location)
                                        else str(Path(info.store.path).resolve()))
            tags["manymodels.run_id"] = str(info.run_id)
        run = client.create_run(experiment_id, run_name=self.run_name, tags=tags)
        session.run_id = run.info.run_id
        params = {"fit": info.fit, "source": info.source, "backend": info.backend,
                  "tasks": info.tasks, "key_columns": info.key_columns,
                  **{f"option.{k}": v for k, v in info.options.items()},
                  "code_hash": info.code.get("code_hash"),
                  "code.versions": info.code.get("versions")}
        params.update({f"code.{name}": digest
                       for name, digest in list(info.code.get("sources", {}).items())[:50]})
        entries = [mlflow.entities.Param(metric_name(k), param_text(v)) for k, v in params.items()]
        for start in range(0, len(entries), 100):  # MLflow's batch limit for params
            client.log_batch(session.run_id, params=entries[start:start + 100])
        client.log_metric(session.run_id, "reused", info.reused)

    def _log_metrics(self, session: _Session, values: dict[str, float], step: int = 0) -> None:
        Metric = _mlflow().entities.Metric
        stamp = int(time.time() * 1000)
        metrics = [Metric(metric_name(k), float(v), stamp, step) for k, v in values.items()
                   if v is not None and math.isfinite(float(v))]
        for start in range(0, len(metrics), 1000):  # MLflow's batch limit
            session.client.log_batch(session.run_id, metrics=metrics[start:start + 1000])

    def _end(self, session: _Session, end: _End | Exception) -> None:
        """End the MLflow run: FAILED, never left RUNNING, if its end could not
        be read or logged, or if MLflow refused something earlier (but not
        knocked on again when its server no longer answers)."""
        if session.run_id is None:
            return
        client = session.client
        if session.failure is not None:
            check_answers(self.tracking_uri or _mlflow().get_tracking_uri())
            client.set_terminated(session.run_id, "FAILED")
            return
        status = "FAILED"
        try:
            if isinstance(end, Exception):
                raise end
            status = self._log_end(session, end)
        finally:
            client.set_terminated(session.run_id, status)

    def _log_end(self, session: _Session, end: _End) -> str:
        self._log_metrics(session, end.progress, step=int(end.progress["progress.done"]))
        self._log_metrics(session, end.values)
        client, run_id = session.client, session.run_id
        for path in end.artifacts:
            client.log_artifact(run_id, str(path))
        for rank, (folder, tag) in enumerate(end.models, 1):
            client.log_artifacts(run_id, str(folder), f"models/model-{rank}")
            client.set_tag(run_id, f"manymodels.model-{rank}", tag)
        return end.status

    # -- what the end logs, read from the run on the driver ----------------------

    def _prepare_end(self, run: Any, folder: Path, info: RunInfo | None) -> _End:
        """The run's summary, final progress, results table, report and best
        models, written under ``folder`` for the background thread to send."""
        key_columns = list(info.key_columns) if info is not None else []
        summary, results = run.summary(), run.results
        values: dict[str, float] = {
            "tasks": summary.tasks, "ok": summary.ok, "failed": summary.failed,
            "reused": summary.reused, "wall_s": summary.wall_s,
            "task_time_s": summary.task_time_s, "utilization": summary.utilization,
            **{f"status.{k}": v for k, v in summary.statuses.items()}}
        durations = results["duration_s"][results["status"] == Status.OK].dropna()
        if len(durations):
            values.update(describe("duration_s", durations))
        # Over the tasks that ended ok, NaN kept: a NaN a fit returned is
        # counted in ``.nonfinite`` (a failed or cancelled task has no metrics
        # and is left out, as is a task the results table shows no value for
        # only because it did not end ok).
        ended_ok = results["status"] == Status.OK
        for column in self._metric_columns(results, key_columns):
            values.update(describe(column, results.loc[ended_ok, column].astype(float)))
        # the last progress, whatever the throttle of on_batch skipped
        done = summary.ok + summary.failed
        progress = {"progress.done": done, "progress.ok": summary.ok,
                    "progress.failed": summary.failed}
        table = folder / "results.parquet"
        writable(results).to_parquet(table, index=False)
        artifacts = [table]
        try:  # the report is a view: a run logs its numbers without it
            artifacts.append(run.report(folder / "report.html"))
        except Exception as exc:
            warnings.warn(f"mm.MLflow: the run's HTML report could not be made ({exc!r}); "
                          "it is logged without it", RuntimeWarning, stacklevel=3)
        models = self._best_models_if_any(run, results, folder, key_columns)
        status = "FINISHED" if done == summary.tasks else "KILLED"
        if models is None:  # asked for and not logged: the MLflow run says it failed
            models, status = [], "FAILED"
        return _End(progress, values, artifacts, models, status)

    def _metric_columns(self, results: Any, key_columns: list[str]) -> list[str]:
        import pandas as pd

        return [c for c in results.columns if c not in _NOT_METRICS and c not in key_columns
                and pd.api.types.is_numeric_dtype(results[c])
                and not pd.api.types.is_bool_dtype(results[c])]

    def _best_models_if_any(self, run: Any, results: Any, folder: Path,
                            key_columns: list[str]) -> list[tuple[Path, str]] | None:
        """The best models, saved (see :meth:`_save_best_models`); none where no
        task ended ok (a run whose every task failed reports no metric, and
        its counts and report are what MLflow must show of it); ``None``,
        with a warning, where they could not be saved: the run's numbers,
        results and report are logged without them, and the MLflow run is
        marked FAILED."""
        if not self.log_models or not (results["status"] == Status.OK).any():
            return []
        try:
            return self._save_best_models(run, results, folder, key_columns)
        except Exception as exc:
            warnings.warn(f"mm.MLflow: the best models could not be logged ({exc}); the run "
                          "is logged without them", RuntimeWarning, stacklevel=4)
            return None

    def _save_best_models(self, run: Any, results: Any, folder: Path, key_columns: list[str]
                          ) -> list[tuple[Path, str]]:
        """The best ``log_models`` models by ``metric``, each saved as an MLflow
        model, with the tag naming its key: ``(folder, tag)`` by rank."""
        metric = self.metric
        if metric not in results.columns:
            raise ValueError(f"MLflow(log_models=...): metric {metric!r} is not in the "
                             "results; they have "
                             f"{self._metric_columns(results, key_columns) or 'none'}")
        ok = results[(results["status"] == Status.OK) & results[metric].notna()]
        best = (ok.nlargest if self.greater_is_better else ok.nsmallest)(self.log_models, metric)
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


def _tag_texts(tags: Any) -> dict[str, str]:
    """``tags=`` as MLflow takes them, text to text (a number or a bool as its
    text), checked when the tracker is made: MLflow refuses another value only
    when the run is made, once the models have trained, with an error of its
    database's that names no tag, and the run is logged nowhere."""
    if tags is None:
        return {}
    if not isinstance(tags, Mapping):
        raise TypeError(f"MLflow(tags=) must be a dict of tag names to values, got "
                        f"{type(tags).__name__} {tags!r:.80}")
    texts = {}
    for name, value in tags.items():
        if not isinstance(name, str):
            raise TypeError(f"MLflow(tags=): a tag's name must be text, got {name!r}")
        if not isinstance(value, (str, int, float)):  # (a bool is an int)
            raise TypeError(f"MLflow(tags=): tag {name!r} must be text or a number, got "
                            f"{type(value).__name__} {value!r:.80}")
        texts[name] = str(value)
    return texts


@dataclass
class _End:
    """What the end of a run logs to MLflow (read on the driver, sent on the thread)."""

    progress: dict[str, float]
    values: dict[str, float]
    artifacts: list[Path]
    models: list[tuple[Path, str]]
    status: str


def _experiment_id(client: Any, name: str | None, caller: _Caller) -> str:
    """The id of the MLflow experiment ``name``; without one, the caller's:
    that of the run active around ``train``, else the one the caller's MLflow
    is set to, else MLflow's ``Default`` (``"0"``): a caller who named an
    experiment through MLflow (``mlflow.set_experiment``,
    ``MLFLOW_EXPERIMENT_NAME``), or started a run, looks for the run there."""
    if not name:
        if caller.parent_experiment_id is not None:
            return caller.parent_experiment_id
        if caller.experiment_name is None:
            return caller.experiment_id or "0"
        name = caller.experiment_name
    return _named_experiment_id(client, name)


def _named_experiment_id(client: Any, name: str) -> str:
    """The id of the MLflow experiment ``name``, made where there is none
    (two runs starting at once may both find none: the second to make it is
    refused, and reads the first's)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:
        found = client.get_experiment_by_name(name)
        if found is None:
            raise
        return found.experiment_id


@dataclass
class _Caller:
    """The caller's MLflow state where ``train`` was called (see
    :meth:`MLflow._callers_mlflow`)."""

    parent_run_id: str | None = None
    parent_experiment_id: str | None = None
    experiment_name: str | None = None
    experiment_id: str | None = None


@dataclass
class _Session:
    """One manymodels run's MLflow state: its jobs' queue and the thread that
    runs them, the client and the MLflow run id (set on that thread), and the
    first failure (after which only the ``always`` jobs run)."""

    jobs: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    thread: threading.Thread | None = None
    client: Any = None
    run_id: str | None = None
    failure: BaseException | None = None
    warned: bool = False
    info: RunInfo | None = None  # the manymodels run's
    caller: _Caller = field(default_factory=_Caller)
    last_progress: float = 0.0  # when its progress was last logged (monotonic)


@dataclass
class _Job:
    """One step for the background thread; ``always``: run even after a failure."""

    call: Callable[[], Any]
    always: bool = False


