"""Run tasks on a pool of threads in the driver process: no start-up cost and
no pickling, and real parallelism for ``fit`` code that releases the GIL
(NumPy, LightGBM, XGBoost, most of scikit-learn's compiled parts)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence

from threadpoolctl import threadpool_limits

from ...machine import thread_limits_in_environment
from ..execution import Executor, RunContext, TaskRef
from .base import Backend, Event, Finished, WorkerStartupError


class ThreadsBackend(Backend):
    name = "threads"

    def start(self, context: RunContext) -> None:
        self._context = context
        self._done: queue.SimpleQueue[Event | BaseException] = queue.SimpleQueue()
        self._in_flight = 0
        self._local = threading.local()
        self._next_worker = iter(range(self.workers))
        self._worker_lock = threading.Lock()
        # BLAS pools are process-wide: cap them at cpus_per_task for the run.
        self._limits = threadpool_limits(limits=self.cpus_per_task)
        self._environment = thread_limits_in_environment(self.cpus_per_task)
        self._environment.__enter__()
        # Daemon threads, not a ThreadPoolExecutor, whose threads the interpreter
        # joins at exit: after a Ctrl-C a fit still running (a thread cannot be
        # stopped) kept the interpreter from exiting until it ended.
        self._inbox: queue.SimpleQueue[list[TaskRef] | None] = queue.SimpleQueue()
        self._threads = [threading.Thread(target=self._serve, daemon=True,
                                          name=f"manymodels-{number}")
                         for number in range(self.workers)]
        for thread in self._threads:
            thread.start()

    def _serve(self) -> None:
        while (tasks := self._inbox.get()) is not None:
            self._run(tasks)

    def _worker_id(self) -> int:
        if not hasattr(self._local, "worker"):
            with self._worker_lock:
                self._local.worker = next(self._next_worker)
        return self._local.worker

    def _run(self, tasks: list[TaskRef]) -> None:
        try:
            if not hasattr(self._local, "executor"):  # one per thread: setup= runs per worker
                self._local.executor = Executor(self._context)
            whole = self._local.executor.run_batch(tasks)
            self._done.put(Finished(whole.outcomes, worker=self._worker_id(),
                                    busy_s=whole.busy_s, prepare_s=whole.prepare_s))
        except BaseException as exc:  # setup= failed: run_batch catches fit's errors
            self._done.put(WorkerStartupError(f"a worker thread could not start: {exc!r}"))

    def free_slots(self, per_worker: int) -> int:
        return max(0, self.workers * per_worker - self._in_flight)

    def submit(self, batch_id: int, tasks: Sequence[TaskRef]) -> None:
        self._in_flight += 1
        self._inbox.put(list(tasks))

    def poll(self, timeout: float) -> list[Event]:
        events: list[Event] = []
        try:
            item = self._done.get(timeout=timeout)
            while True:
                if isinstance(item, BaseException):
                    raise item
                events.append(item)
                self._in_flight -= 1
                item = self._done.get_nowait()
        except queue.Empty:
            pass
        return events

    def stop(self, *, force: bool = False) -> None:
        try:
            while True:  # the batches not started are dropped
                self._inbox.get_nowait()
        except queue.Empty:
            pass
        for _ in self._threads:
            self._inbox.put(None)
        if not force:
            for thread in self._threads:
                thread.join()
        self._limits.restore_original_limits()
        self._environment.__exit__(None, None, None)
