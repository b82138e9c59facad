"""What the dashboard shows: small answers computed from a run's task blocks.

The dashboard reads the SQLite index on read-only connections while a driver
writes it (WAL lets readers and the one writer go on at once). A run's tasks
are in blocks (:mod:`..store.taskblocks`), immutable once written, so each
run's decoded tasks are kept between polls and a poll reads only the blocks
written since (:mod:`.runtasks`); a poll of a live run costs what its new
blocks cost to decode plus a few vectorised passes over the run (numpy and
Arrow, no Python loop per task). Every answer is small whatever the run's
size: counts per status are a ``bincount``, the duration histogram buckets
counted in numpy, the slowest tasks a partition, and what must be drawn task
by task (the worker timeline, metric distributions) comes from a systematic
sample of at most :data:`SAMPLE` tasks. The answers are those the SQL on the
old ``tasks`` table gave (stores written before blocks are read from it). A
finished run cannot change, so its answers are computed once and kept.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ...engine.messages import FAILURE_STATUSES, Status
from ...store import checkpoints, database, drivers
from ...store.database import read_snapshot
from ..report import clipped_error
from .charts import BINS, finite, histogram, key_label, mean, quantile
from .runtasks import RunTasks, Snapshot

SAMPLE = 4000  #: tasks drawn at most, per run, in the timeline and metric charts
SLOWEST = 20
FAILURES = 50
#: The last characters of each failure's error that a poll ships: 50
#: failures of a 1 MB message each made every poll 50 MB.
ERROR_CHARACTERS = 5000
METRICS = 8
_FAILED = tuple(str(getattr(s, "value", s)) for s in FAILURE_STATUSES)
#: Runs whose decoded tasks are kept (the most recently asked about): a run
#: of a million tasks takes about 150 MB (measured: 100 MB of Arrow rows, 50 MB
#: of numpy columns), and several live runs polled in turn must not evict
#: each other (each would be decoded whole again at every poll).
RUNS_KEPT = 4
#: Ended runs whose answers (one per section) are kept, the most recently
#: asked about: a dashboard left open on a store of thousands of runs, each
#: clicked in turn, kept every one's answers (their slowest tasks, failures
#: and timelines) for as long as it ran.
ENDED_RUNS_KEPT = 64
#: A running run's answer is kept for this many times what it cost (at least
#: a second), so that the dashboard takes at most a fifth of a core from the
#: training it watches; at a million tasks a poll costs about 0.1 s (the new
#: blocks and a few vectorised passes), so the second is what applies.
KEEP_FOR_COST = 4.0
SECTIONS = ("summary", "durations", "metrics", "slowest", "failures", "timeline")
#: A running run's rate is measured over the tasks that ended in the last
#: this many seconds (of the tasks' own clock), or over three times the
#: median task's duration where that is longer (a window shorter than a
#: task would count a batch of tasks ending together as a burst).
RATE_WINDOW_S = 30.0
#: No rate or ETA is given before this many tasks have trained, nor before
#: every worker has finished one: the first ones include a worker's start.
MIN_TASKS_FOR_ETA = 3


def _alive(run: dict[str, Any]) -> dict[str, Any]:
    """A run still ``running`` whose driver process is gone shows as
    ``interrupted``, as the store marks it when next opened for writing."""
    driver = run.pop("driver")
    if run["status"] == "running" and not drivers.driver_alive(driver):
        run["status"] = "interrupted"
    return run


def _identity(run: dict[str, Any]) -> tuple[int, float]:
    """What tells a run apart from every other the store's path has held: its
    id and when it started. A store deleted and made again at the same path
    (``rm -rf models/`` and a new run, while the dashboard serves) numbers its
    runs from 1 again; keyed by id alone, the kept answers and tasks of the
    deleted store's run 1 were shown as the new run 1's."""
    return run["run_id"], run["started_at"]


def _ended_at(run: dict[str, Any], tasks: Any) -> float:
    """When a run ended: its recorded end; now, while it runs; for a run
    whose driver died (no end recorded), its last task's end, so that its
    rate and wall time stay what they were, not drift with the clock."""
    if run["finished_at"]:
        return run["finished_at"]
    if run.get("ended_at"):
        return run["ended_at"]
    if run["status"] == "running" or tasks is None or not len(tasks):
        return time.time()
    ends = tasks.started + tasks.duration
    ends = ends[~np.isnan(ends)]
    return float(ends.max()) if ends.size else run["started_at"]


class Queries:
    """The dashboard's questions to one store, safe to ask from many threads."""

    def __init__(self, store: str | Path) -> None:
        self.root = Path(store)
        index = self.root / database.INDEX_NAME
        if not index.is_file():
            raise FileNotFoundError(f"{str(self.root)!r} is not a manymodels store: it has "
                                    f"no {database.INDEX_NAME}")
        self._local = threading.local()
        self._lock = threading.Lock()
        self._finished: dict[tuple, Any] = {}  # (run identity, section) of finished runs
        self._recent: dict[tuple, tuple[float, Any]] = {}  # key -> (keep until, answer)
        #: run identity (:func:`_identity`) -> its tasks, least recently used first
        self._cache: dict[tuple, RunTasks] = {}

    def _throttled(self, key: tuple, compute: Any) -> Any:
        """``compute()``, or its last answer while that is fresh enough (see
        :data:`KEEP_FOR_COST`) and no run has started or ended since."""
        key = (*key, *self._rows("SELECT count(*), max(run_id), max(finished_at), "
                                 "group_concat(status) FROM runs")[0])
        now = time.monotonic()
        with self._lock:
            hit = self._recent.get(key)
        if hit is not None and now < hit[0]:
            return hit[1]
        value = compute()
        cost = time.monotonic() - now
        with self._lock:
            if len(self._recent) > 64:
                self._recent.clear()
            self._recent[key] = (time.monotonic() + max(1.0, KEEP_FOR_COST * cost), value)
        return value

    def _conn(self) -> Any:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = database._connect_read_only(
                self.root / database.INDEX_NAME)
            conn.execute("PRAGMA query_only=ON")
        return conn

    def _rows(self, sql: str, *args: Any) -> list[tuple]:
        return self._conn().execute(sql, args).fetchall()

    # -- runs ------------------------------------------------------------------------

    def runs(self, limit: int = 100) -> list[dict[str, Any]]:
        """The latest runs, newest first; a running one with its progress."""
        return self._throttled(("runs", limit), lambda: self._runs(limit))

    def page(self, run_id: int | None = None, search: str = "",
             limit: int = 100) -> dict[str, Any]:
        """What one poll of the page shows, in one answer: ``runs`` (as
        :meth:`runs`; ``runs_total``: how many the store holds) and ``run``,
        every section of run ``run_id`` (the newest when ``None``; ``None``
        in a store with no run), read in one read
        transaction, the run's line in ``runs`` from the same tasks as its
        sections. Asked apart, the two answers were read (and kept, see
        :meth:`_throttled`) at different moments, and one page showed two
        different counts of done tasks for the same run."""
        def compute() -> dict[str, Any]:
            with read_snapshot(self._conn()):
                chosen = run_id
                if chosen is None:
                    chosen = self._rows("SELECT max(run_id) FROM runs")[0][0]
                memo: dict[str, Any] = {}
                run = None if chosen is None else {
                    name: self.section(chosen, name, search, memo) for name in SECTIONS}
                total = self._rows("SELECT count(*) FROM runs")[0][0]
                return {"runs": self._runs(limit, {chosen: memo}), "runs_total": total,
                        "run": run}

        return self._throttled(("page", run_id, search, limit), compute)

    def _runs(self, limit: int, memos: dict[int, dict] | None = None) -> list[dict[str, Any]]:
        """The runs; a run in ``memos`` counted from the tasks its memo holds."""
        rows = self._rows(
            "SELECT run_id, started_at, finished_at, status, backend, workers, fit, tasks, "
            "ok, failed, reused, wall_s, driver FROM runs ORDER BY run_id DESC LIMIT ?", limit)
        names = ("run_id", "started_at", "finished_at", "status", "backend", "workers", "fit",
                 "tasks", "ok", "failed", "reused", "wall_s", "driver")
        runs = [_alive(dict(zip(names, row))) for row in rows]
        memos = memos or {}
        for run in runs:
            tasks = None
            if run["status"] == "running":
                tasks = self._tasks(run, memos.get(run["run_id"]))
                done = tasks.done
                run.update(ok=int(tasks.status_in((Status.OK.value,)).sum()),
                           failed=int(tasks.status_in(_FAILED).sum()),
                           reused=int(tasks.reused.sum()))  # (its row says so at its end)
            elif run["ok"] is not None:  # recorded when it ended
                done = run["ok"] + (run["failed"] or 0)
            else:  # its driver died: count what it committed (once: it cannot change)
                done, ended = (self._finished.get((*_identity(run), name))
                               for name in ("done", "ended"))
                if done is None or ended is None:
                    tasks = self._tasks(run, memos.get(run["run_id"]))
                    done, ended = tasks.done, _ended_at(run, tasks)
                    self._keep_ended((*_identity(run), "done"), done)
                    self._keep_ended((*_identity(run), "ended"), ended)
                run["ended_at"] = ended
            run["done"] = done
            run.update(self._pace(run, tasks if run["status"] == "running" else None))
        return runs

    def _pace(self, run: dict[str, Any], tasks: Snapshot | None) -> dict[str, Any]:
        """Models trained per second, and, while it runs, the time left.

        An ended run: its trained tasks over its wall time. A running one:
        from the tasks' own clocks, the tasks that ended in the last
        :data:`RATE_WINDOW_S` over the time from the window's start (at the
        earliest, when the first task started) to the last end seen. Not
        over the time since the run started, whose first seconds (planning,
        hashing, starting the workers) train nothing: a 7-second run's first
        ETA was 111 s. Neither is given before :data:`MIN_TASKS_FOR_ETA`
        tasks, and one per worker, have trained."""
        elapsed = max(_ended_at(run, tasks) - run["started_at"], 1e-9)
        if tasks is None:
            rate = (run["done"] - (run["reused"] or 0)) / elapsed
            return {"rate": rate, "eta_s": None, "elapsed_s": elapsed}
        trained = ~tasks.reused & ~np.isnan(tasks.duration) & ~np.isnan(tasks.started)
        started, ended = tasks.started[trained], (tasks.started + tasks.duration)[trained]
        rate = eta = None
        if ended.size >= max(MIN_TASKS_FOR_ETA, run["workers"] or 1):
            last = float(ended.max())
            window = max(RATE_WINDOW_S, 3 * float(np.median(tasks.duration[trained])))
            since = max(float(started.min()), last - window)
            span = last - since
            if span > 0:
                rate = int((ended > since).sum()) / span
                eta = max(run["tasks"] - run["done"], 0) / rate
        return {"rate": rate, "eta_s": eta, "elapsed_s": elapsed}

    def run_row(self, run_id: int) -> dict[str, Any]:
        rows = self._rows("SELECT run_id, status, tasks, started_at, finished_at, workers, "
                          "wall_s, key_columns, fit, source, backend, driver FROM runs "
                          "WHERE run_id = ?", run_id)
        if not rows:
            raise KeyError(f"the store has no run {run_id}")
        names = ("run_id", "status", "tasks", "started_at", "finished_at", "workers", "wall_s",
                 "key_columns", "fit", "source", "backend", "driver")
        row = _alive(dict(zip(names, rows[0])))
        row["key_columns"] = json.loads(row["key_columns"] or "[]")
        return row

    # -- one run ---------------------------------------------------------------------

    def section(self, run_id: int, name: str, search: str = "",
                memo: dict | None = None) -> Any:
        """One section of a run's page (see :data:`SECTIONS`). ``memo`` shares
        the scans that several sections use (the sample, the summary) between
        the sections of one answer."""
        if name not in SECTIONS:
            raise KeyError(f"no section {name!r}; choose one of {', '.join(SECTIONS)}")
        memo = {} if memo is None else memo
        run = memo.get("run") or memo.setdefault("run", self.run_row(run_id))
        cacheable = run["status"] != "running" and not search
        kept = (*_identity(run), name)
        if cacheable:
            with self._lock:
                if kept in self._finished:  # most recently used last
                    self._finished[kept] = value = self._finished.pop(kept)
                    return value
        method = getattr(self, f"_{name}")
        value = method(run, memo, search) if name == "failures" else method(run, memo)
        if cacheable:
            self._keep_ended(kept, value)
        return value

    def _keep_ended(self, kept: tuple, value: Any) -> None:
        """Keep an ended run's section's answer; past :data:`ENDED_RUNS_KEPT`
        runs' answers, the least recently asked for go."""
        with self._lock:
            self._finished[kept] = value
            while len(self._finished) > ENDED_RUNS_KEPT * len(SECTIONS):
                self._finished.pop(next(iter(self._finished)))

    def run(self, run_id: int, search: str = "") -> dict[str, Any]:
        """Every section of a run's page, in one answer."""
        def compute() -> dict[str, Any]:
            memo: dict[str, Any] = {}
            return {name: self.section(run_id, name, search, memo) for name in SECTIONS}

        return self._throttled(("run", run_id, search), compute)

    def _tasks(self, run: dict[str, Any], memo: dict | None = None) -> Snapshot:
        """The run's tasks, read incrementally (see :mod:`.runtasks`); one
        refresh per answer, shared by its sections through ``memo``."""
        if memo is not None and "tasks" in memo:
            return memo["tasks"]
        with self._lock:
            tasks = (self._cache.pop(_identity(run), None)
                     or RunTasks(run["run_id"], run["tasks"] or 0))
            self._cache[_identity(run)] = tasks  # most recently used last
            while len(self._cache) > RUNS_KEPT:
                self._cache.pop(next(iter(self._cache)))
        snapshot = tasks.refresh(self._conn(), live=run["status"] == "running")
        if memo is not None:
            memo["tasks"] = snapshot
        return snapshot

    def _summary(self, run: dict[str, Any], memo: dict) -> dict[str, Any]:
        tasks = self._tasks(run, memo)
        counts = tasks.counts()
        durations = tasks.trained_durations
        task_time = float(durations.sum())
        reused = int(tasks.reused.sum())
        memo["range"] = ((float(durations.min()), float(durations.max())) if durations.size
                         else None)
        done = tasks.done  # as the runs table counts it: cancelled tasks never ran
        wall = run["wall_s"] or (_ended_at(run, tasks) - run["started_at"])
        workers = run["workers"] or 1
        shown = ("run_id", "status", "tasks", "workers", "fit", "source", "backend",
                 "key_columns", "started_at")
        memo["summary_value"] = {**{k: run[k] for k in shown},
                "counts": counts, "done": done, "reused": reused, "task_time_s": task_time,
                "wall_s": wall, "utilization": task_time / (wall * workers) if wall else 0.0,
                "failed": sum(counts.get(s, 0) for s in _FAILED),
                "resumed": sum(t.startswith("attempt") for t in self._resumed(run, memo).values())}
        return memo["summary_value"]

    def _resumed(self, run: dict[str, Any], memo: dict) -> dict[int, str]:
        """Task index -> what it resumed from (or refused); kept with a run at its end."""
        if "resumed" not in memo:
            memo["resumed"] = checkpoints.read_resumed(self._conn(), self.root, run["run_id"])
        return memo["resumed"]

    def _durations(self, run: dict[str, Any], memo: dict) -> dict[str, Any]:
        """Trained tasks' durations in :data:`BINS` buckets over the range the
        summary found (a bucket is what SQL's ``CAST(... AS INTEGER)`` gave)."""
        if "range" not in memo:
            self._summary(run, memo)
        if memo["range"] is None:
            return {"low": None, "high": None, "counts": []}
        low, high = memo["range"]
        width = (high - low) / BINS or 1.0
        durations = self._tasks(run, memo).trained_durations
        buckets = np.minimum(((durations - low) / width).astype(np.int64), BINS - 1)
        return {"low": low, "high": high,
                "counts": np.bincount(buckets, minlength=BINS).tolist()}

    def _sample(self, run: dict[str, Any], memo: dict) -> list[tuple]:
        """About :data:`SAMPLE` finished tasks at most: those whose scrambled task
        number falls in one k-th of the range, the first in task order. Scrambled
        (a multiplicative hash modulo a prime), not every k-th: a plan's order can
        repeat with a period (a worker every 16th task, a grid value every 3rd)
        and every k-th task would then draw one part of it only. The same tasks
        every poll."""
        if "sample" in memo:
            return memo["sample"]
        step = max(1, math.ceil((run["tasks"] or 0) / SAMPLE))
        tasks = self._tasks(run, memo)
        drawn = np.flatnonzero(tasks.task_index * 2654435761 % 4294967291 % step == 0)
        memo["sample"] = tasks.records(drawn[:SAMPLE], (
            "task_index", "key", "status", "started_at", "duration_s", "worker", "metrics"))
        return memo["sample"]

    def _metrics(self, run: dict[str, Any], memo: dict) -> dict[str, Any]:
        values: dict[str, list[float]] = {}
        sample = self._sample(run, memo)
        for *_, status, _, _, _, metrics in sample:
            if status != Status.OK or not metrics:
                continue
            for name, value in json.loads(metrics).items():
                if (finite(value) is not None and not isinstance(value, bool)
                        and (name in values or len(values) < METRICS)):
                    values.setdefault(name, []).append(float(value))
        charts = []
        for name, found in values.items():
            ordered = sorted(found)
            charts.append({"name": name, "n": len(found), "mean": mean(found),
                           **{f"p{round(q * 100):02d}": quantile(ordered, q)
                              for q in (0.05, 0.5, 0.95)},
                           **histogram(found)})
        return {"sampled": len(sample), "charts": charts}

    def _slowest_rows(self, run: dict[str, Any], memo: dict) -> list[tuple]:
        """The :data:`SLOWEST` longest trained tasks, longest first (ties in task
        order): a partition finds the cut, only those above it are sorted."""
        if "slowest" not in memo:
            tasks = self._tasks(run, memo)
            chosen, durations = tasks.trained, tasks.trained_durations
            if durations.size > SLOWEST:
                cut = np.partition(durations, durations.size - SLOWEST)[-SLOWEST]
                chosen, durations = chosen[durations >= cut], durations[durations >= cut]
            order = np.lexsort((chosen, -durations))[:SLOWEST]
            memo["slowest"] = tasks.records(chosen[order], (
                "task_index", "key", "status", "started_at", "duration_s", "worker",
                "attempts"))
        return memo["slowest"]

    def _slowest(self, run: dict[str, Any], memo: dict) -> list[dict[str, Any]]:
        resumed = self._resumed(run, memo)
        return [{"key": key_label(k), "status": s, "duration_s": d, "worker": w, "attempts": a,
                 "resumed_from": resumed.get(i, "")}
                for i, k, s, _, d, w, a in self._slowest_rows(run, memo)]

    def _failures(self, run: dict[str, Any], memo: dict, search: str = "") -> dict[str, Any]:
        """The first :data:`FAILURES` failed tasks in task order; ``search``
        matches the key as the page shows it (``s1, i7``: its text as
        written, not JSON's escapes of ``Zürich`` or a quote), ignoring case,
        or the error as written. ``note`` says when more match than are
        listed, as the HTML report does: under "Failures (310)" a list of 50
        read as if it were all of them."""
        tasks = self._tasks(run, memo)
        failed = np.flatnonzero(tasks.status_in(_FAILED))
        total = len(failed)
        if search and total:
            folded = search.casefold()
            keys = tasks.column("key", failed).to_pylist()
            errors = tasks.column("error", failed).to_pylist()
            failed = failed[np.fromiter(
                (folded in key_label(key, whole=True).casefold()
                 or (error is not None and search in error)
                 for key, error in zip(keys, errors)), dtype=bool, count=len(failed))]
        rows = tasks.records(failed[:FAILURES], ("task_index", "key", "status", "attempts",
                                                 "worker", "error"))
        resumed = self._resumed(run, memo)
        note = ""
        if len(failed) > len(rows):
            note = (f"The first {len(rows)} of {len(failed)}{' matching' if search else ''}, "
                    "in task order; search keys and errors to find others, or read them all "
                    "with mm.Store(path).results(run).")
        return {"total": total, "matching": len(failed), "search": search, "note": note,
                "items": [{"key": key_label(k), "status": s, "attempts": a, "worker": w,
                           "error": clipped_error(
                               e, "mm.Store(path).results(run)", ERROR_CHARACTERS),
                           "resumed_from": resumed.get(i, "")}
                          for i, k, s, a, w, e in rows]}

    def _timeline(self, run: dict[str, Any], memo: dict) -> dict[str, Any]:
        """Bars ``[start_s, duration_s, worker, status]`` of the sampled tasks and
        the slowest ones, with their keys; times from the run's start."""
        origin = run["started_at"]
        seen, bars, keys = set(), [], []
        for index, key, status, started, duration, worker, _ in (
                self._sample(run, memo) + self._slowest_rows(run, memo)):
            if index in seen or started is None or duration is None or worker is None:
                continue
            seen.add(index)
            bars.append([round(started - origin, 6), round(duration, 6), worker, status])
            keys.append(key_label(key))
        summary = memo.get("summary_value")
        total = len(bars) if summary is None else summary["done"] - summary["reused"]
        return {"bars": bars, "keys": keys, "total": max(total, len(bars)),
                "workers": sorted({bar[2] for bar in bars})}
