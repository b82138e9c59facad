"""The Ray backend's Ray tasks in flight, and how a crash or a timeout is
pinned on one task of a batch (see :mod:`.ray` for the rest of the design).

How a crash or a timeout is pinned on one task
    The remote function is a Ray *streaming generator*: it yields
    ``("start", node_id, pid, version)`` before it loads the run, then outcomes in
    parts (every 0.25 s) and ``("done", ...)``. In *marked* mode it also
    yields ``("run", index, ...)`` just before each task (carrying the
    previous task's outcome), so the driver knows which task the worker is
    running and since when. Batches run marked when ``timeout`` is set, and
    single-task batches always do. A marked Ray task waits until the driver
    has read each message before it goes on (Ray's generator backpressure of
    one object, about half a millisecond a task): Ray sends yielded items
    asynchronously, and a worker that dies right after yielding a marker took
    it down with it two times in three, so the crash was blamed on the task
    before.

    * A worker that dies (``WorkerCrashedError``, a dead node, Ray's OOM
      killer) inside a marked batch costs exactly the running task: it is
      reported :class:`~.base.Lost` (``crashed``, or ``memory`` for Ray's
      memory monitor) and the tasks not yet run are handed back
      (:class:`~.base.Requeued`). Inside an unmarked batch the driver does
      not know which task it was: if one task was left unreported it is
      that one; otherwise the unreported tasks are run again, internally, as
      one marked batch, which finds the culprit if it crashes again (a
      one-off kill from outside then costs nothing). Each marked crash
      reports one task, so a task that always crashes cannot loop forever;
      ``max_retries=0`` stops Ray from retrying behind the scheduler's back.
    * Ray has no task timeout. With ``timeout`` every batch runs marked and
      the driver times the running task from the moment its marker arrives
      (queueing and loading the run do not count); past ``timeout`` it
      ``ray.cancel(..., force=True)``\\ s the Ray task, which kills its
      worker process, reports the task ``timeout`` and requeues the rest.

Mixed into :class:`~.ray.RayBackend`, whose state (``_calls``, ``_deaths``,
``_worker_ids``, ``worker_nodes``, ``worker_pids``, ``timeout``) and
``_launch`` these methods use.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any

from ..execution import TaskRef
from ..messages import Status
from ._ray_cluster import first_line
from .base import Event, Lost, Requeued, WorkerStartupError, blame_lost_batch, wall_time


@dataclass
class Call:
    """One Ray task in flight: a batch, or the internal re-run of a crashed one."""

    batch_id: int
    tasks: dict[int, TaskRef]  # index -> task, of the tasks not yet reported
    marked: bool
    started: bool = False  # its "start" message arrived
    prepare_s: float = 0.0  # reported before any outcome (marked mode), until one carries it
    worker: int = -1
    running: int | None = None  # marked: the index of the task running now
    running_since: float = 0.0  # driver's monotonic clock when its marker arrived


class CallSupervision:
    """Which worker a Ray task ran on, and what its death or overstay costs."""

    def _worker_id(self, node_id: str, pid: int) -> int:
        key = (node_id, pid)
        if key not in self._worker_ids:
            number = self._worker_ids[key] = len(self._worker_ids)
            self.worker_nodes[number] = node_id
            self.worker_pids[number] = pid
        return self._worker_ids[key]

    def _where(self, call: Call) -> str:
        if call.worker < 0:
            return "a Ray worker"
        node = self.worker_nodes[call.worker]
        return f"Ray worker process {self.worker_pids[call.worker]} on node {node[:12]}"

    def _died(self, gen: Any, call: Call, exc: BaseException) -> list[Event]:
        """Account for the tasks of a Ray task whose worker died."""
        import ray

        del self._calls[gen]
        if isinstance(exc, ray.exceptions.RayTaskError) and not call.started:
            # Python raised before our code ran: the remote function itself
            # cannot load on that node (manymodels missing, another version).
            raise WorkerStartupError(f"a Ray worker could not run manymodels' task: {exc}")
        unreported = list(call.tasks)
        if not unreported:
            return []
        if isinstance(exc, ray.exceptions.OutOfMemoryError):
            status = Status.MEMORY.value
            message = f"{self._where(call)} was killed by Ray's memory monitor: {first_line(exc)}"
        else:
            status = Status.CRASHED.value
            message = f"{self._where(call)} died ({type(exc).__name__}): {first_line(exc)}"
        if not call.marked:
            if len(unreported) == 1:  # the others of its batch were reported
                return [Lost(unreported[0], status, message, call.worker)]
            # Which one? Run them again, marked, to find out (see the docstring).
            self._launch(call.batch_id, list(call.tasks.values()), marked=True)
            return []
        # a death before its first task (loading the run) counts towards giving up
        return blame_lost_batch(call.running, unreported, status, message, call.worker,
                                self._deaths, wall_time(call.running_since))

    def _check_timeouts(self) -> list[Event]:
        import ray

        events: list[Event] = []
        now = time.monotonic()
        for gen, call in list(self._calls.items()):
            if call.running is None or call.running not in call.tasks:
                continue
            if now - call.running_since <= self.timeout:
                continue
            with contextlib.suppress(Exception):
                ray.cancel(gen, force=True)
            del self._calls[gen]  # whatever it sends from now on is dropped
            events.append(Lost(
                call.running, Status.TIMEOUT.value,
                f"task ran longer than timeout={self.timeout:g}s; its Ray worker was killed",
                call.worker, wall_time(call.running_since)))
            rest = [index for index in call.tasks if index != call.running]
            if rest:
                events.append(Requeued(rest))
        return events
