"""The scheduler: which task runs when, in batches of what size, and what
happens when one fails.

Data flow (everything here runs in the driver, in the thread that called
``train``: the main thread, where Ctrl-C is heard, unless the caller chose
another)::

    Plan.tasks ──sorted by cost, longest first──► pending
               (equal costs: by where the data lies)
                                                     │  BatchSizer: enough tasks to keep
    retry queue (crashed / timed out / retry_on) ──► │  a worker busy ~0.1 s, fewer near
      ▲            with backoff for exceptions       │  the end so that none idles alone;
      │                                              │  a worker's next batch queued on it
      │                                              │  only while tasks are short
      │                                              ▼
      │                                  backend.submit(batch) ───► workers run fit
      │                                                                  │
      │           backend.poll() ◄─────── Finished / Lost / Requeued ◄───┘
      │                │
      └── retryable ◄──┤
                       ├──► TaskRecords (status, metrics, model, timings)
                       ├──► progress bar (counts models, not batches)
                       └──► error budget: past max_failures, stop and raise

The scheduler owns ordering, batching, retries, the error budget and
progress; backends (:mod:`manymodels.engine.backends`) only run batches. So every
backend orders, retries and counts the same way.
"""

from __future__ import annotations

import heapq
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..planning.plan import Plan
from .backends.base import Backend, WorkerStartupError
from .batchsizing import BatchSizer
from .execution import RunContext, metrics_dict
from .interrupts import RunInterrupts
from .messages import (
    FAILURE_STATUSES,
    Finished,
    Lost,
    OkOutcomes,
    Outcome,
    Requeued,
    Status,
    task_indices,
)
from .records import CANCELLED_CODE, OK_CODE, STATUS_CODES, UNSET, RecordingError, TaskRecords

_RETRY_BACKOFF_S = 0.1
#: The longest wait before a retry: doubling from 0.1 s reaches a minute by
#: the tenth retry, and would wait 29 hours before the twentieth.
_RETRY_BACKOFF_MAX_S = 30.0


class TooManyFailures(RuntimeError):
    """The run stopped early: more tasks failed than ``max_failures`` allows.
    ``.run`` holds every result finished before the stop."""

    def __init__(self, message: str, run: Any) -> None:
        super().__init__(message)
        self.run = run


class RunInterrupted(KeyboardInterrupt):
    """The run was interrupted (Ctrl-C or SIGTERM); ``.run`` holds every result
    finished before the interrupt; a task waiting for a retry ends as its last
    attempt did, the rest are ``cancelled``."""

    def __init__(self, message: str, run: Any) -> None:
        super().__init__(message)
        self.run = run


def _ended(events: list) -> Iterator[int]:
    """The task indices a round of events may have ended (a retried one has not:
    its status is still unset, and the callbacks skip it)."""
    for event in events:
        if isinstance(event, Finished):
            yield from task_indices(event.outcomes)
        elif isinstance(event, Lost):
            yield event.index


def _longest_first(todo: np.ndarray, costs: np.ndarray,
                   locality: np.ndarray | None = None) -> range | np.ndarray:
    """The task numbers ``todo`` marks (a bool a task), costliest first
    (stably; among equal costs by ``locality``, where the data has one: see
    :meth:`~manymodels.planning.taskdata.StagedRefs.locality`): a ``range``
    when that is every task in order (no task reused, costs not rising:
    groups of one size), else an array, int32 where that holds them. Held
    through the run, it was 8 bytes a task."""
    count = len(todo)
    if todo.all() and (count < 2 or bool((costs[1:] <= costs[:-1]).all())) and (
            locality is None or count < 2
            or bool(((costs[1:] < costs[:-1]) | (locality[1:] >= locality[:-1])).all())):
        return range(count)
    tasks = np.flatnonzero(todo)  # (no Python int a task: ten million were 360 MB at once)
    if locality is not None:  # by where the data lies, then (stably) by cost
        tasks = tasks[np.argsort(locality[tasks], kind="stable")]
    order = tasks[np.argsort(-costs[tasks], kind="stable")]
    return order.astype(np.int32) if count < 2**31 else order


def _failure_budget(max_failures: int | float | None, total: int) -> int | None:
    if max_failures is None:
        return None
    if isinstance(max_failures, float) and 0 < max_failures < 1:
        return int(max_failures * total)
    return int(max_failures)


class Scheduler:
    """Runs one plan on one backend; :meth:`run` returns what ``make_run``
    makes of the records (the run layer's ``Run``).

    ``progress`` makes the progress display once the workers are up (an
    object with ``update(done, ok, failed)`` and ``close()``), or is None;
    ``recorder`` (a store's) takes finished tasks and may raise
    :class:`RecordingError`; ``callbacks`` hears of the run's start and end;
    ``watch_ok(key, metrics)`` is called with each task that ends ok, until
    it returns True (``select=``'s check that its metric is reported).
    """

    def __init__(
        self,
        plan: Plan,
        backend: Backend,
        *,
        make_run: Callable[..., Any],
        retries: int = 0,
        max_failures: int | float | None = None,
        progress: Callable[[], Any] | None = None,
        recorder: Any = None,
        callbacks: Any = None,
        watch_ok: Callable[[Any, Any], bool] | None = None,
    ) -> None:
        self.plan = plan
        self.backend = backend
        self.retries = retries
        self.budget = _failure_budget(max_failures, len(plan.tasks))
        self._budget_given = max_failures  # (a fraction: said as given, with its count)
        self.records = TaskRecords(len(plan.tasks), retries)
        self.make_run = make_run
        self._make_progress = progress
        self.progress: Any = None
        self.sizer = BatchSizer(backend.workers)
        self.recorder = recorder
        self.callbacks = callbacks  # a callbacks.Callbacks, or None
        self.watch_ok = watch_ok
        self._done = self._ok = self._failed = self._batches = 0
        #: Task -> (status, error, worker) of its last attempt, while it waits
        #: for a retry or runs it: what it ended with if the run stops first
        #: (it ran and failed; "cancelled" would say it never ran).
        self._last_attempt: dict[int, tuple[str, str | None, int]] = {}
        if recorder is not None:  # models the store already holds: done before we start
            self._done = self._ok = recorder.fill_reused(self.records)

    # -- bookkeeping -----------------------------------------------------------

    def _finish(self, index: int, status: str, worker: int, error: str | None) -> None:
        if self._last_attempt:
            self._last_attempt.pop(index, None)
        self.records.set_status(index, status)
        self.records.worker[index] = worker
        self.records.set_error(index, error)
        self._done += 1
        if status == Status.OK:
            self._ok += 1
        elif status in FAILURE_STATUSES:
            self._failed += 1
        if self.recorder is not None:
            self.recorder.task_finished(index)

    def _record_all(self, outcomes: list[Outcome], worker: int) -> list[int]:
        """Record a batch's outcomes: each one's attempt and times (as array
        operations), its model and metrics when ok, then :meth:`_finish`'s
        bookkeeping unless it goes back for a retry; the rest in one loop over
        local names (a million tasks paid more for a method call each than
        for the work). Returns the tasks to retry."""
        if type(outcomes) is OkOutcomes:
            return self._record_ok(outcomes, worker)
        rec, ok_status, retries = self.records, Status.OK.value, self.retries
        outcomes = list(outcomes)
        ran = np.fromiter((outcome[0] for outcome in outcomes), dtype=np.int64,
                          count=len(outcomes))
        rec.attempts[ran] += 1  # (a batch names a task once)
        rec.duration_s[ran] = [outcome[4] for outcome in outcomes]
        rec.started_at[ran] = [outcome[5] for outcome in outcomes]
        models, metrics_of = rec.model, rec.metrics
        retry: list[int] = []
        finished: list[int] = []
        codes: list[int] = []
        ok = failed = 0
        for (index, status, model, metrics, _, _, error, retryable), attempt in zip(
                outcomes, rec.attempts[ran].tolist()):
            if status == ok_status:
                models[index], metrics_of[index] = model, metrics
                ok += 1
            elif retryable and attempt <= retries:
                retry.append(index)
                self._last_attempt[index] = (status, error, worker)
                continue
            elif status in FAILURE_STATUSES:
                failed += 1
            rec.set_error(index, error)
            finished.append(index)
            codes.append(STATUS_CODES[status])
        rec.status_code[finished] = codes
        rec.worker[finished] = worker
        if self._last_attempt:
            self._forget_last_attempts(finished)
        self._done += len(finished)
        self._ok += ok
        self._failed += failed
        if self.recorder is not None:
            self.recorder.tasks_finished(finished)
        if ok and self.watch_ok is not None:
            self._watch(finished)
        return retry

    def _record_ok(self, outcomes: OkOutcomes, worker: int) -> list[int]:
        """:meth:`_record_all` of a part every task of which succeeded
        (:meth:`TaskRecords.mark_ok`), counted and handed to the recorder:
        nothing to unpack or compare per task."""
        finished = self.records.mark_ok(outcomes.indices, worker, outcomes.durations,
                                        outcomes.started, outcomes.models(),
                                        outcomes.metrics())
        if self._last_attempt:
            self._forget_last_attempts(finished)
        self._done += len(finished)
        self._ok += len(finished)
        if self.recorder is not None:
            self.recorder.tasks_finished(finished)
        if self.watch_ok is not None:
            self._watch(finished)
        return []

    def _watch(self, finished: list[int]) -> None:
        records, tasks = self.records, self.plan.tasks
        for index in finished:
            if records.status_code[index] == OK_CODE and self.watch_ok(
                    tasks[index].key, metrics_dict(records.metrics[index], index)):
                self.watch_ok = None
                return

    def _forget_last_attempts(self, finished: list[int]) -> None:
        pop = self._last_attempt.pop
        for index in finished:
            pop(index, None)

    def _keep_last_attempts(self) -> None:
        """As the run stops: each task that was waiting for a retry (or
        running one) ends as its last attempt did, with its error (a
        ``retry_on`` exception, a crash), not ``cancelled``."""
        codes = self.records.status_code
        for index, (status, error, worker) in list(self._last_attempt.items()):
            if codes[index] == UNSET:
                self._finish(index, status, worker, error)
        self._last_attempt.clear()

    def _over_budget(self) -> bool:
        return self.budget is not None and self._failed > self.budget

    def _build_run(self, wall_s: float, started_at: float) -> Any:
        recorder = self.recorder
        return self.make_run(self.plan, self.records, wall_s=wall_s, workers=self.backend.workers,
                   backend=self.backend.name, started_at=started_at,
                   store=recorder.store if recorder else None,
                   run_id=recorder.run_id if recorder else None, batches=self._batches,
                   worker_gpus=self.backend.worker_gpus(),
                   worker_start_s=self.backend.worker_start_s,
                   spawn_reason=self.backend.spawn_reason)

    # -- the loop --------------------------------------------------------------

    def run(self, context: RunContext, began: tuple[float, float] | None = None) -> Any:
        """Run every task not already finished; ``began`` is ``(time.time(),
        time.perf_counter())`` when the caller's work started (planning, hashing),
        so that the wall time covers it."""
        started_at, start = began or (time.time(), time.perf_counter())
        stopped_by: BaseException | None = None
        store_error: RecordingError | None = None
        workers_gone: WorkerStartupError | None = None  # (mid-run, after tasks finished)
        broken: BaseException | None = None  # the backend cannot go on: raised, once stopped
        with RunInterrupts() as interrupts:
            started = False
            try:
                if self.callbacks is not None:
                    self.callbacks.run_start(self._done)
                if self._done < len(self.plan.tasks):
                    started = True
                    self.backend.start(context)
                    if self._make_progress is not None:
                        self.progress = self._make_progress()
                    self._loop(interrupts)
            except KeyboardInterrupt as exc:
                stopped_by = exc
            except RecordingError as exc:  # the store cannot take more: stop, keep the results
                store_error = exc
            except WorkerStartupError as exc:
                if not self._done:
                    broken = exc
                    if self.recorder is not None:
                        self.recorder.abandon(self.records)
                else:
                    workers_gone = exc  # a replacement could not start: stop, keep the results
            except BaseException as exc:  # the backend cannot go on: keep what finished
                broken = exc
                if self.recorder is not None:
                    self.recorder.abandon(self.records)
            finally:
                try:
                    interrupts.stopping = True
                except KeyboardInterrupt as exc:  # came as the loop ended: the stop goes on
                    interrupts.stopping = True
                    stopped_by = stopped_by or exc
                clean = (stopped_by is None and store_error is None and workers_gone is None
                         and broken is None and not self._over_budget())
                try:
                    if started:
                        self.backend.stop(force=not clean)
                finally:
                    if self.progress is not None:
                        self.progress.close()
            if broken is not None:
                self._end_broken(interrupts, start, started_at)
                raise broken
            self._keep_last_attempts()
            codes = self.records.status_code
            codes[codes == UNSET] = CANCELLED_CODE
            run = self._build_run(time.perf_counter() - start, started_at)
            if self.recorder is not None and store_error is None:
                state = ("interrupted" if stopped_by is not None
                         else "failed" if workers_gone is not None  # (the backend broke down)
                         else "stopped" if self._over_budget() else "finished")
                try:
                    self.recorder.finish(self.records, state, run)
                except RecordingError as exc:
                    store_error = exc
            if self.callbacks is not None:
                interrupts.stopping = False  # (the callbacks' code can be interrupted)
                try:
                    self.callbacks.run_end(run)
                except KeyboardInterrupt as exc:  # raised below, with the run
                    interrupts.late = interrupts.late or exc
                interrupts.stopping = True
            if store_error is not None:
                self.recorder.abandon()
                store_error.run = run
                raise store_error
            if workers_gone is not None:
                workers_gone.run = run  # (the rest are cancelled: a re-run resumes them)
                raise workers_gone
        if stopped_by is None and interrupts.late is not None and not self._over_budget():
            stopped_by = interrupts.late  # (while a run that had ended stopped its workers)
        if stopped_by is not None:
            resume = (" Run the same call again with the same store to resume: finished "
                      "models are reused." if self.recorder is not None else
                      " Pass store= to keep results across runs and resume.")
            raise RunInterrupted(
                f"interrupted after {self._done} of {len(self.plan.tasks)} tasks; the "
                f"finished results are in the exception's .run.{resume}", run) from stopped_by
        if self._over_budget():
            raise TooManyFailures(self._budget_message(run), run)
        return run

    def _end_broken(self, interrupts: RunInterrupts, start: float, started_at: float) -> None:
        """Tell the callbacks that a run the backend could not go on with
        (its workers could not start, say) ended, with what it got done, the
        rest ``cancelled``: a tracker's run would otherwise be left open (an
        MLflow run RUNNING for ever). Whatever fails here gives way to the
        error that stopped the run, which is raised next."""
        if self.callbacks is None:
            return
        try:
            self._keep_last_attempts()
            codes = self.records.status_code
            codes[codes == UNSET] = CANCELLED_CODE
            run = self._build_run(time.perf_counter() - start, started_at)
        except Exception:
            return
        interrupts.stopping = False  # (the callbacks' code can be interrupted)
        try:
            self.callbacks.run_end(run)
        except KeyboardInterrupt:  # the run is ending with its error anyway
            pass
        finally:
            interrupts.stopping = True

    def _loop(self, interrupts: RunInterrupts) -> None:
        tasks, backend, fit_keys = self.plan.tasks, self.backend, self.plan.fit_keys
        # longest first, and how far it is taken (a deque of a million Python
        # ints held 36 MB through the run)
        locality = None if self.plan.in_key_order else getattr(tasks.refs, "locality", None)
        pending = _longest_first(self.records.status_code == UNSET, tasks.costs,
                                 None if locality is None else locality())
        taken = 0
        retry_now: deque[int] = deque()  # crashed or requeued: before anything else
        retry_later: list[tuple[float, int]] = []  # (due time, index): backoff
        # how many tasks the workers hold (a count, not a set of a million ints to update)
        in_flight = 0
        batch_id = 0
        callbacks = self.callbacks
        per_task = callbacks is not None and callbacks.wants_tasks
        polls_fits = getattr(backend, "runs_fit_in_poll", False)
        while self._done < len(tasks) and not self._over_budget():
            now = time.monotonic()
            while retry_later and retry_later[0][0] <= now:
                retry_now.append(heapq.heappop(retry_later)[1])
            free = backend.free_slots(self.sizer.batches_per_worker(backend.shares_one_queue))
            while free > 0 and (retry_now or taken < len(pending)):
                size = self.sizer.next_size(len(pending) - taken + len(retry_now))
                positions = [retry_now.popleft() for _ in range(min(size, len(retry_now)))]
                if len(positions) < size and taken < len(pending):
                    more = min(size - len(positions), len(pending) - taken)
                    chunk = pending[taken:taken + more]
                    positions += chunk.tolist() if type(chunk) is np.ndarray else list(chunk)
                    taken += more
                in_flight += len(positions)
                backend.submit(batch_id, tasks.batch(positions, fit_keys))
                batch_id += 1
                self._batches += 1
                free -= 1
            wait = 0.05
            if retry_later and in_flight <= 0:
                wait = max(0.0, min(wait, retry_later[0][0] - now))
            # the round's events read and recorded whole: a Ctrl-C waits for
            # the end of the block (serial's poll runs fit, which it may cut)
            events = backend.poll(wait) if polls_fits else []
            with interrupts.held():
                if not polls_fits:
                    events = backend.poll(wait)
                if per_task:
                    events = list(events)
                for event in events:
                    if isinstance(event, Finished):
                        self.sizer.observe(event.busy_s, len(event.outcomes), event.prepare_s)
                        in_flight -= len(event.outcomes)
                        for index in self._record_all(event.outcomes, event.worker):
                            attempt = int(self.records.attempts[index])
                            due = time.monotonic() + min(
                                _RETRY_BACKOFF_S * 2 ** min(attempt - 1, 30), _RETRY_BACKOFF_MAX_S)
                            heapq.heappush(retry_later, (due, index))
                    elif isinstance(event, Lost):
                        in_flight -= 1
                        self.records.attempts[event.index] += 1
                        self.records.duration_s[event.index] = event.duration_s
                        self.records.started_at[event.index] = event.started_at
                        # (a task that could not be sent, "failed", fails the same way again)
                        if (self.records.attempts[event.index] <= self.retries
                                and event.status != Status.FAILED):
                            retry_now.append(event.index)
                            self._last_attempt[event.index] = (event.status, event.message,
                                                               event.worker)
                        else:
                            self._finish(event.index, event.status, event.worker, event.message)
                    elif isinstance(event, Requeued):
                        in_flight -= len(event.indices)
                        retry_now.extendleft(reversed(event.indices))
            if self.progress is not None:
                self.progress.update(self._done, self._ok, self._failed)
            if self.recorder is not None:
                self.recorder.flush(self.records, tail=taken == len(pending) and not (
                    retry_now or retry_later))
            if callbacks is not None:
                if per_task:
                    callbacks.tasks_finished(_ended(events), self.records)
                callbacks.batch(self._done, self._ok, self._failed)

    def _budget_message(self, run: Any) -> str:
        failed = run.failed
        given = f"{self._budget_given!r}" + (
            f" (at most {self.budget} of {len(run.results)} tasks)"
            if self._budget_given != self.budget else "")
        cancelled = int((run.results["status"] == Status.CANCELLED).sum())
        lines = [
            f"stopped early: {len(failed)} tasks failed, over max_failures={given} "
            f"({self._ok} finished ok, {cancelled} cancelled); the finished results are in "
            "the exception's .run. First failures:"
        ]
        key_columns = self.plan.key_columns
        for _, row in failed.head(3).iterrows():
            key = tuple(row[c] for c in key_columns)
            last_line = (row["error"] or "").strip().splitlines()[-1:] or [""]
            last = last_line[0] if len(last_line[0]) <= 500 else last_line[0][:500] + " ..."
            lines.append(f"  {key if len(key) != 1 else key[0]!r}: {row['status']}: {last}")
        return "\n".join(lines)
