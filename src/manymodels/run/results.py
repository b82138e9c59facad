"""What a run produced: :class:`Run`, its results table, and its summary."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..engine.messages import FAILURE_STATUSES, Pickled, Status
from ..engine.metriccolumns import metric_column_names, metric_columns
from ..engine.modelfiles import ModelFile
from ..engine.partpacks import ModelPack, PackedModel, unpacked
from ..engine.records import STATUS_NAMES, TaskRecords
from ..evaluation.splitters import WINDOWS
from ..inputs.keys import key_frame
from ..planning.plan import Plan
from ..store.database import StoreError
from ..store.lazymodels import IN_STORE, ModelMap, StoredModel, hashable_key
from ..store.registry import STORE_RESULT_COLUMNS
from .checkpointing import resumed_column

OK, CANCELLED = Status.OK, Status.CANCELLED
_RESERVED = {"status", "attempts", "duration_s", "worker", "started_s", "reused", "resumed",
             "resumed_from", "error"}
#: The columns a run's results add beside its keys (``gpu`` with GPUs;
#: ``run_id`` in :meth:`Store.results`).
RESULT_COLUMNS = frozenset({*_RESERVED, "gpu", "run_id"})


def check_key_names(names: list[Any], params: list[Any] = (), stored: bool = False) -> None:
    """Refuse key columns (``by=``, a grid's parameters: ``params``) named as
    a column the results add: the results would show one where the other
    belongs. Of a run kept in a store (``stored``), those the store's
    results add too (``artifact``, ``size``, ``started_at``...): a key
    column so named was replaced in ``Store.results``, ``manymodels show``
    and ``export`` by the store's column, its values lost there."""
    taken = RESULT_COLUMNS | STORE_RESULT_COLUMNS if stored else RESULT_COLUMNS
    clash = [name for name in names if name in taken]
    if clash:
        what = (f"the grid parameter {clash[0]!r}" if clash[0] in params
                else f"the key column {clash[0]!r}")
        raise ValueError(
            f"{what} has the name of a column that "
            f"{'the store' if clash[0] not in RESULT_COLUMNS else 'run'}.results adds "
            f"({', '.join(sorted(taken))}): rename "
            f"{'that parameter' if clash[0] in params else 'that column of the table'}")


def _in_store(model: Any) -> bool:
    """Whether a task's slot stands for a model the store holds: the store's
    mark, or a pack the store's writer committed and let go of."""
    return model is IN_STORE or (type(model) is ModelPack and model.stored)


def _loaded(model: Any, index: int) -> Any:
    """Task ``index``'s model itself, where a worker sent it pickled (alone or
    in a :class:`~manymodels.engine.partpacks.ModelPack`)."""
    model = unpacked(model, index)
    return model.load() if isinstance(model, (Pickled, PackedModel, ModelFile)) else model


#: A backend's workers, as a sentence names them ("2 process workers").
_WORKER_NOUNS = {"processes": "process", "threads": "thread", "ray": "Ray", "spark": "Spark",
                 "dask": "Dask"}


def _workers_text(workers: int, backend: str) -> str:
    """``2 process workers``, ``1 thread worker``, ``8 Ray workers``: the
    summary's words for a run's workers (a backend's name is a plural noun)."""
    noun = _WORKER_NOUNS.get(backend, backend)
    return f"{workers} {noun} worker{'' if workers == 1 else 's'}"


@dataclass
class Summary:
    """Counts and timings of a run; ``utilization`` compares the work done with
    what the workers could have done in the wall time (1.0 is the physical limit)."""

    tasks: int
    """Every task of the run, reused ones included."""
    ok: int
    """Tasks that ended ``ok``, reused ones included."""
    failed: int
    """Tasks that failed: an exception, a crash, a timeout, a memory limit."""
    statuses: dict[str, int]
    """Tasks per status, the statuses with none left out."""
    wall_s: float
    """Seconds from the call to its end: planning, hashing and starting the
    workers included."""
    task_time_s: float
    """The sum of the tasks' fit times, in seconds."""
    workers: int
    """How many workers ran the tasks."""
    backend: str
    """The backend's name."""
    utilization: float
    """``task_time_s / (wall_s x workers)``: 1.0 is the physical limit."""
    reused: int = 0
    """Tasks whose model the store already held (not trained again)."""
    batches: int = 0
    """How many batches the scheduler sent to the workers."""
    worker_start_s: float = 0.0
    """Seconds a worker took to start, on average over the first ones (they
    start in parallel: interpreter, imports, loading the run, a CUDA
    context), before its first task: inside ``wall_s``, not ``task_time_s``."""
    spawn_reason: str | None = None
    """Why the workers were spawned, not forked (a module imported that is
    not fork-safe, a memory limit...): see ``start_method`` of ``train``."""
    gpus: bool = False
    """Tasks were given GPUs: a worker's start includes a CUDA context."""

    @property
    def utilization_after_start(self) -> float:
        """Task time / ((wall - worker start) x workers): how busy the workers
        were once they had started."""
        capacity = (self.wall_s - self.worker_start_s) * self.workers
        return self.task_time_s / capacity if capacity > 0 else 0.0

    def __str__(self) -> str:
        # the statuses besides ok, in parentheses: the failures by kind, and
        # those never run; not "failed N" where that is every failure, which
        # "N failed" has said already ("4 failed of 40 (failed 4)")
        only_fit_errors = self.statuses.get(Status.FAILED.value, 0) == self.failed
        others = ", ".join(f"{k} {v}" for k, v in self.statuses.items()
                           if k != OK and not (k == Status.FAILED and only_fit_errors))
        lines = [
            f"models      {self.ok} ok, {self.failed} failed of {self.tasks}"
            + (f" ({others})" if others else "")
            + (f"; {self.reused} reused from the store" if self.reused else ""),
            f"wall time   {self.wall_s:.2f} s on {_workers_text(self.workers, self.backend)}, "
            f"{self.batches} {'batch' if self.batches == 1 else 'batches'}",
            f"task time   {self.task_time_s:.2f} s (sum of fit times)",
            f"utilization {self.utilization:.2f} (task time / (wall x workers))",
        ]
        if self.worker_start_s >= 0.1 or self.spawn_reason:  # a fork takes milliseconds
            cuda = ", CUDA context" if self.gpus else ""  # none is made without a GPU
            start = [f"start       {self.worker_start_s:.2f} s to start a worker, in "
                     f"parallel (interpreter, imports{cuda}); not task time"]
            if self.spawn_reason:  # a spawn costs about a second: say what caused it
                start.append(f"            spawned, not forked: {self.spawn_reason}")
            lines[2:2] = start
            lines[-1] += f"; {self.utilization_after_start:.2f} once started"
        return "\n".join(lines)


class Run:
    """The outcome of :func:`manymodels.train`: results, models and failures."""

    def __init__(
        self,
        plan: Plan,
        records: TaskRecords,
        *,
        wall_s: float,
        workers: int,
        backend: str,
        started_at: float,
        store: Any = None,
        run_id: int | None = None,
        batches: int = 0,
        worker_gpus: dict[int, str] | None = None,
        worker_start_s: float = 0.0,
        spawn_reason: str | None = None,
    ) -> None:
        self._plan = plan
        self._records = records
        self.wall_s = wall_s
        self.workers = workers
        self.backend = backend
        self.started_at = started_at
        self.store = store
        self.run_id = run_id
        self.batches = batches
        #: worker id -> the GPU ids it ran on (processes and serial backends)
        self.worker_gpus = worker_gpus or {}
        self.worker_start_s = worker_start_s
        self.spawn_reason = spawn_reason
        self._selection: Any = None  # (Selection, group columns) with select=
        #: Task index -> what it resumed from (see run.checkpointing); None
        #: when fit took no checkpoint.
        self._resumed_from: dict[int, str] | None = None

    @cached_property
    def results(self) -> pd.DataFrame:
        """One row per task: key columns, status, attempts, duration_s, worker,
        started_s (seconds after the run started), reused (from a store),
        resumed (from a checkpoint; with ``resumed_from`` saying from what,
        NaN where nothing, when fit takes a checkpoint), one column per metric, error."""
        plan, rec = self._plan, self._records
        frame = key_frame(plan.key_columns, plan.key_rows, plan.typed_keys())
        frame["status"] = rec.status_names()  # the codes' text (None: not ended)
        frame["attempts"] = rec.attempts.astype(np.int64)
        frame["duration_s"] = rec.duration_s
        frame["worker"] = rec.worker.astype(np.int64)
        if self.worker_gpus:  # which GPU(s) each task ran on
            frame["gpu"] = [self.worker_gpus.get(w) for w in rec.worker.tolist()]
        frame["started_s"] = rec.started_at - self.started_at
        frame["reused"] = rec.reused_mask()
        frame["resumed"], resumed_from = resumed_column(self._resumed_from, len(frame))
        if resumed_from is not None:  # fit took a checkpoint
            frame["resumed_from"] = resumed_from
        metrics = {name: values for name, values in metric_columns(rec.metrics).items()
                   if name != WINDOWS}  # per-window scores: run.evaluation
        names = metric_column_names(metrics, {*_RESERVED, *frame.columns})
        for name, values in metrics.items():
            frame[names[name]] = values
        frame["error"] = rec.error_column() or [None] * len(frame)
        return frame

    @property
    def ok(self) -> pd.DataFrame:
        """The rows of tasks that produced a model."""
        return self.results[self.results["status"] == OK]

    @property
    def failed(self) -> pd.DataFrame:
        """The rows of tasks that failed, crashed, timed out or ran out of memory,
        each with its error (the traceback, or what killed the worker)."""
        return self.results[self.results["status"].isin(FAILURE_STATUSES)]

    def results_frame(self, session: Any = None) -> Any:
        """:attr:`results` as the engine's own table, for a job that writes it
        on from the engine's executors: a Spark DataFrame for a run on
        ``backend="spark"`` (in ``session``, else the active session), a Dask
        DataFrame for ``"dask"`` (persisted on ``session``, a client, else the
        current one), a Ray Dataset for ``"ray"``, and a pandas DataFrame (a
        copy of ``results``) for the local backends. These are the small
        per-task rows the driver holds already: nothing more is collected."""
        from .engineoutputs import results_as_engine_frame

        return results_as_engine_frame(self.results, self.backend, session)

    @cached_property
    def models(self) -> ModelMap:
        """Key -> model of every task that succeeded and returned a model (a fit
        that returns a metrics dict alone has metrics but no model). Models
        reused from a store are loaded when first asked for."""
        rec = self._records
        in_store = self._stored_artifacts()
        return ModelMap({
            hashable_key(key): (StoredModel(self.store, in_store[index], key) if _in_store(model)
                  else unpacked(model, index))
            for index, (key, ok, model) in enumerate(zip(
                self._plan.tasks.keys(), rec.ok_mask().tolist(), rec.model))
            if ok and model is not None
        })

    def _stored_artifacts(self) -> dict[int, str]:
        """Task index -> artifact of the models the driver left in the store."""
        if self.store is None or not any(map(_in_store, self._records.model)):
            return {}
        artifacts = self.store._run_artifacts(self.run_id)
        if not artifacts and self.store._conn.execute(
                "SELECT 1 FROM runs WHERE run_id = ?", (self.run_id,)).fetchone() is None:
            raise StoreError(
                f"run {self.run_id} was deleted from the store {str(self.store)!r} "
                "after it ran, and its models with it: those a later run reused are that "
                "run's (mm.Store(path).models(run=...)); train again for the others")
        return artifacts

    def _ok_outputs(self) -> tuple[list[str], list[tuple[tuple, Any]]]:
        """The key columns, and (key values, what ``fit`` returned) of every task
        that succeeded, in plan order: what the transforms assemble."""
        rec = self._records
        in_store = self._stored_artifacts()
        return self._plan.key_columns, [
            (parts, StoredModel(self.store, in_store[index], key).load()
             if _in_store(model) else _loaded(model, index))
            for index, (key, parts, ok, model) in enumerate(zip(
                self._plan.tasks.keys(), self._plan.key_rows, rec.ok_mask().tolist(),
                rec.model))
            if ok
        ]

    @cached_property
    def evaluation(self) -> pd.DataFrame:
        """One row per task and window of ``evaluate=``: key columns, window,
        cutoff, n_train, n_test and each metric (empty without evaluation)."""
        from ..evaluation.tables import window_frame

        return window_frame(self._plan.key_columns, self._plan.key_rows, self._records.metrics,
                            self._plan.typed_keys())

    @cached_property
    def forecasts(self) -> pd.DataFrame:
        """One row per task, window and test row of a backtest, as
        statsforecast's ``cross_validation``: key columns, window, cutoff,
        time, actual and forecast (empty without a backtest, or with
        ``mm.backtest(..., forecasts=False)``)."""
        from ..evaluation.tables import forecast_frame

        return forecast_frame(self._plan.key_columns, self._plan.key_rows, self._records.metrics,
                              self._plan.typed_keys())

    def select(self, selection: Any, source: Any) -> None:
        """Mark each group's best task (``train(select=...)`` calls this); with
        a store, record the winners as the groups' models."""
        from ..evaluation.selection import record_winners

        params = set(self._plan.param_columns)
        groups = [c for c in self._plan.key_columns if c not in params]
        self._selection = (selection, groups)
        best = self.best()  # (made now, with or without a store: a group with no scored
        if self.store is not None and self.run_id is not None:  # candidate is warned of)
            record_winners(self.store, self.run_id, best, self._plan.key_rows, groups,
                           selection)

    def best(self) -> pd.DataFrame:
        """One row per group: its winning task's key, setting and scores (the
        rows of ``results``), by the metric of ``train(select=...)``."""
        from ..evaluation.selection import best_rows

        if self._selection is None:
            raise ValueError("this run selected nothing: pass select= (a metric) to mm.train")
        selection, groups = self._selection
        if groups is None:  # select= named a metric no task reported
            raise ValueError(f"this run selected nothing: no task reported select="
                             f"{selection.metric!r}; the results' columns are "
                             f"{list(self.results.columns)}")
        return best_rows(self.results, groups, selection)

    def predict(self, table: Any, **options: Any) -> pd.Series | pd.DataFrame:
        """Predict ``table``'s rows with this run's models (each group's
        winner with ``select=``), on the engine: see :meth:`Store.predict`."""
        if self.store is None or self.run_id is None:
            raise ValueError("run.predict needs a run trained with store=; or use "
                             "run.models[key].predict")
        return self.store.predict(table, run=self.run_id, **options)

    def forecast(self, h: int, freq: Any = None, **options: Any) -> pd.DataFrame:
        """Forecast every group ``h`` steps after its last time with this
        run's models, the future rows made from the run's own table (when
        the driver holds it): see :meth:`Store.forecast`."""
        if self.store is None or self.run_id is None:
            raise ValueError("run.forecast needs a run trained with store=")
        import pyarrow as pa

        table = self._plan.data.table  # the table trained on, when the driver holds it
        if options.get("history") is None and isinstance(table, pa.Table) and (
                options.get("time") in (None, *table.column_names)):
            options["history"] = table
        return self.store.forecast(h, freq=freq, run=self.run_id, **options)

    def report(self, path: str | Path) -> Path:
        """Write this run's self-contained HTML report (see :mod:`manymodels.observe.report`)."""
        from ..inputs.fileuris import local_location
        from ..observe.report import render_report, summary_facts, write_whole

        path = local_location(path, "report's path")  # (file:///tmp/r.html: /tmp/r.html)
        results = self.results
        facts = summary_facts(results, results["reused"], wall_s=self.wall_s,
                              workers=self.workers, backend=self.backend, batches=self.batches,
                              worker_start_s=self.worker_start_s)
        # the run's own columns, by what it added (a metric named like one of
        # them is metric_<name> in results): the rest are metrics, whatever
        # their names (rows, size, gpu on a run without GPUs)
        own = {*self._plan.key_columns, *_RESERVED, *(["gpu"] if self.worker_gpus else [])}
        metrics = [c for c in results.columns if c not in own]
        return write_whole(path, render_report(results, facts, "manymodels run",
                                               self._plan.key_columns, metrics,
                                               gpus=bool(self.worker_gpus)))

    def why_not_reused(self, key: Hashable) -> str:
        """Why the task ``key`` was trained rather than reused from the store."""
        if self.store is None:
            raise ValueError("this run used no store: pass store= to mm.train")
        return self.store.why_not_reused(key, run=self.run_id)

    def summary(self) -> Summary:
        """The run's counts and timings (what its end prints): tasks by
        status, wall and task time, and ``utilization`` against the physical
        limit (the sum of fit times over the workers' wall time)."""
        rec = self._records
        # each status code counted at once; the first count: tasks not ended
        counts = np.bincount(rec.status_code + 1, minlength=len(STATUS_NAMES) + 1).tolist()
        statuses = {name: count for name, count in zip(STATUS_NAMES, counts[1:]) if count}
        durations = rec.duration_s
        if counts[0]:  # mid-run (a callback's view): only the tasks that have ended
            durations = durations[rec.ended_mask()]
        task_time = float(np.nansum(durations))
        capacity = self.wall_s * self.workers
        return Summary(
            tasks=len(self._plan.tasks),
            ok=statuses.get(OK, 0),
            failed=sum(statuses.get(s, 0) for s in FAILURE_STATUSES),
            statuses=dict(statuses),
            wall_s=self.wall_s,
            task_time_s=task_time,
            workers=self.workers,
            backend=self.backend,
            utilization=task_time / capacity if capacity > 0 else 0.0,
            reused=int(np.count_nonzero(rec.reused_mask())),
            batches=self.batches,
            worker_start_s=self.worker_start_s,
            spawn_reason=self.spawn_reason,
            gpus=bool(self.worker_gpus),
        )

    def __repr__(self) -> str:
        s = self.summary()
        return f"<Run {s.ok} ok, {s.failed} failed of {s.tasks} tasks in {s.wall_s:.2f} s>"
