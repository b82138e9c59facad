"""Run batches of tasks as Ray tasks, on one machine or on a Ray cluster.

``backend="ray"`` (or ``RayBackend(address=...)``) connects to the Ray
instance given by ``address`` or ``RAY_ADDRESS``, or starts a local one, and
runs the scheduler's batches as Ray tasks. Results are those of every other
backend: each Ray task runs its batch through the same
:class:`~manymodels.engine.execution.Executor`.

Why a batch, not a task, per Ray task
    A Ray task costs about a millisecond of scheduling and two object-store
    round trips; many fits (a LinearRegression on twenty rows) cost less. The
    scheduler already sizes batches from measured busy time (~0.1 s of work
    each), so one Ray task per batch keeps Ray's overhead to a few percent.
    ``workers`` Ray tasks run at once. Where Ray's own resources already
    cap the run at ``workers`` (a local instance started with ``workers *
    cpus_per_task`` CPUs, or ``workers`` left to the cluster's size), two Ray
    tasks per worker are in flight (one running, one queued), long tasks or
    short: Ray keeps queued tasks at the driver, not on a worker, and the
    first worker to free up or to be granted, on any node, takes the next
    (reusing its lease while that is fresh, half a second). Should the
    cluster grow during the run, the queued ones run too. Where ``workers``
    asks for less than the cluster holds, exactly ``workers``.

How the data goes in once
    :meth:`RayBackend.start` puts the run into the object store once: the
    ``RunContext`` without its data (``fit``, ``setup``, ... cloudpickled with
    the driver's ``sys.path``), the sorted Arrow table and the ``shared`` dict.
    Each Ray task receives the three references *nested in a tuple*, so that
    Ray does not resolve them per call; a worker process resolves them once
    per run (``ray.get``: Arrow buffers and NumPy arrays map the node's object
    store, zero-copy) and caches the resulting ``Executor`` under the run id
    in a module-level dict. So ``setup=`` runs once per Ray worker process,
    not per batch, and tasks travel as ``(offset, length)`` references only.

How a crash or a timeout is pinned on one task
    Each Ray task is a streaming generator that reports which task it is
    running where that matters (a timeout, a single task): see
    :mod:`._ray_calls`.

What it does not do
    ``memory_limit`` is not enforced (``enforces_memory_limit = False``): a
    ``memory`` value given to the constructor is passed to Ray as a
    scheduling reservation only, and Ray's own memory monitor kills workers
    when a node runs out. GPUs are Ray resources (``num_gpus`` per task, a
    share such as 0.25 where ``gpus_per_task`` is one; Ray sets
    ``CUDA_VISIBLE_DEVICES``). A worker whose CUDA context a task broke is
    not replaced on Ray (Ray reuses its worker processes).
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import cloudpickle

from ...machine import usable_cores
from ..dataplane import pickle_any
from ..execution import RunContext, TaskRef
from ..gpus import GpuSetup
from ..messages import task_indices
from ..options import BackendOptions
from ..outcomeloads import load_outcomes
from ._protocol import Msg
from ._ray_calls import Call, CallSupervision
from ._ray_cluster import (
    check_resources,
    check_version,
    cluster_workers,
    connect,
    import_ray,
    started_in_this_process,
)
from ._ray_worker import remote_function
from .base import (
    DEATHS_OUTSIDE_TASKS,
    Backend,
    DeathCount,
    Event,
    Finished,
    Requeued,
    WorkerStartupError,
    dump_sendable,
)

_BATCHES_PER_WORKER = 2
_STOP_GRACE_S = 1.0
#: A run none of whose Ray tasks has started this long after its first was
#: sent says so once: Ray waits for resources as long as it takes (right on
#: a cluster that an autoscaler grows, or whose CPUs another job holds), and
#: the run would otherwise look hung.
_NO_START_WARN_S = 60.0

# -- in the driver ---------------------------------------------------------------


def _dump_tasks(tasks: list[TaskRef]) -> bytes:
    # Pickled here, unpickled after the worker has the driver's sys.path: an
    # item of a class from the user's own module must not fail in Ray's
    # argument deserialisation, before the worker can find that module.
    return pickle_any(tasks)


class RayBackend(CallSupervision, Backend):
    """Batches as Ray tasks; see the module docstring.

    ``workers`` is the number of Ray tasks running at once (each with
    ``cpus_per_task`` CPUs); ``None`` takes the connected cluster's CPUs //
    ``cpus_per_task``. ``address`` (default ``RAY_ADDRESS``) names a running
    Ray cluster; without one a local instance with ``workers * cpus_per_task``
    CPUs is started and shut down in :meth:`stop`. An instance already
    initialised in this process is used as it is, and left running.
    ``ray_init_options`` go to ``ray.init``.
    """

    name = "ray"
    requires_pickling = True
    isolates_crashes = True
    enforces_timeout = True
    enforces_memory_limit = False
    isolates_gpus = True
    schedules_gpus = True
    caps_gpu_memory = True
    # Ray keeps a queued Ray task at the driver (its owner), not on a worker:
    # the first worker to free up, or to be granted on a node just joining,
    # takes it. With one batch per worker for long tasks, a worker finishing
    # early took the next batch before a new node's first worker had started,
    # again and again.
    shares_one_queue = True

    def __init__(
        self,
        workers: int | None = None,
        cpus_per_task: int = 1,
        timeout: float | None = None,
        memory_limit: int | None = None,
        gpu_sets: list[list[str]] | None = None,
        *,
        address: str | None = None,
        **ray_init_options: Any,
    ) -> None:
        import_ray()  # fail here, before any work, where Ray is not installed
        self.address = address
        self.ray_init_options = ray_init_options
        #: worker id (as in ``run.results["worker"]``) -> Ray node id / process id.
        self.worker_nodes: dict[int, str] = {}
        self.worker_pids: dict[int, int] = {}
        self.started_ray = False
        self._calls: dict[Any, Call] = {}
        self._unsent: list[Event] = []  # tasks that could not be sent, told at the next poll
        self._payload: tuple[Any, Any, Any] | None = None
        self._per_worker = 1
        super().__init__(workers, cpus_per_task, timeout=timeout, memory_limit=memory_limit,
                         gpu_sets=gpu_sets)

    @classmethod
    def default_workers(cls, cpus_per_task: int) -> int | None:
        return None  # the cluster's CPUs, counted when the run starts

    def configure(self, options: BackendOptions) -> None:
        super().configure(options)
        #: ``workers`` follows the cluster's CPUs unless a count was given.
        self.auto_workers = options.workers is None
        if self.auto_workers:
            self.workers = cluster_workers(self.cpus_per_task) or max(
                1, usable_cores() // self.cpus_per_task)

    def worker_gpus(self) -> dict[int, str]:
        return {}  # Ray's worker processes, not slots: Ray picks each task's GPU

    @property
    def gpus_per_task(self) -> float:
        """Ray's ``num_gpus`` per task: whole GPUs, or a share such as 0.25."""
        return self.options.gpus_per_task

    # -- life cycle -------------------------------------------------------------

    def start(self, context: RunContext) -> None:
        import ray

        try:
            self.started_ray = connect(self.address, self.workers * self.cpus_per_task,
                                       self.gpu_sets, self.ray_init_options)
            if self.auto_workers:
                self.workers = cluster_workers(self.cpus_per_task) or self.workers
            resources = ray.cluster_resources()
            check_resources(resources, self.cpus_per_task, self.gpus_per_task,
                            fatal=self.started_ray or started_in_this_process())
            # Queue batches ahead only where Ray itself keeps to `workers` at once.
            capped = self.workers * self.cpus_per_task >= resources.get("CPU", 0) or (
                self.gpus_per_task
                and self.workers * self.gpus_per_task >= resources.get("GPU", 0))
            self._per_worker = _BATCHES_PER_WORKER if capped else 1
            self._run_id = uuid.uuid4().hex
            bare = replace(context, table=None, shared=None)
            if self.gpus_per_task:
                bare = replace(bare, gpu_setup=GpuSetup(self.options.gpu_memory_fraction))
            self._payload = (
                ray.put((list(sys.path), cloudpickle.dumps(bare))),
                ray.put(context.table) if context.table is not None else None,
                ray.put(context.shared) if context.shared else None,
            )
            options: dict[str, Any] = {"num_cpus": self.cpus_per_task,
                                       "num_gpus": self.gpus_per_task}
            if self.memory_limit is not None:
                options["memory"] = int(self.memory_limit)
            self._remote = remote_function().options(**options)
            # A marked Ray task waits until the driver has read each message
            # (see "How a crash or a timeout is pinned on one task").
            self._remote_marked = remote_function().options(
                **options, _generator_backpressure_num_objects=1)
        except BaseException:
            self.stop(force=True)
            raise
        self._calls = {}
        self._worker_ids: dict[tuple[str, int], int] = {}
        self.worker_nodes, self.worker_pids = {}, {}
        self._first_sent_at: float | None = None
        #: no more to watch for: a Ray task has started, or the warning was given
        self._start_watched = False
        # Tolerates one generation of Ray tasks in flight dying at once (a
        # lost node), not workers that die whatever they are given.
        self._deaths = DeathCount(DEATHS_OUTSIDE_TASKS + _BATCHES_PER_WORKER * self.workers,
                                  "Ray workers keep dying before running any task")

    def stop(self, *, force: bool = False) -> None:
        ray = sys.modules.get("ray")
        try:
            if ray is not None and ray.is_initialized() and self._calls:
                calls = list(self._calls)
                if not force:
                    ray.wait(calls, num_returns=len(calls), timeout=_STOP_GRACE_S)
                for gen in calls:
                    with contextlib.suppress(Exception):
                        ray.cancel(gen, force=True)
        finally:
            self._calls = {}
            self._payload = None  # the driver's references: the object store frees them
            if self.started_ray and ray is not None:
                self.started_ray = False
                ray.shutdown()

    # -- the contract -------------------------------------------------------------

    def free_slots(self, per_worker: int) -> int:
        return max(0, self.workers * min(per_worker, self._per_worker) - len(self._calls))

    def submit(self, batch_id: int, tasks: Sequence[TaskRef]) -> None:
        # an item or a setting that cannot travel: its task fails alone
        tasks, dumped, lost = dump_sendable(tasks, _dump_tasks, lambda task: _dump_tasks([task]))
        self._unsent.extend(lost)
        if dumped is None:
            return
        self._launch(batch_id, tasks, marked=self.timeout is not None or len(tasks) == 1,
                     dumped=dumped)

    def _launch(self, batch_id: int, tasks: list[TaskRef], marked: bool,
                dumped: bytes | None = None) -> None:
        remote = self._remote_marked if marked else self._remote
        gen = remote.remote(self._run_id, self._payload,
                            _dump_tasks(tasks) if dumped is None else dumped,
                            self.cpus_per_task, marked)
        self._calls[gen] = Call(batch_id, {task[0]: task for task in tasks}, marked)
        if self._first_sent_at is None:
            self._first_sent_at = time.monotonic()

    def poll(self, timeout: float) -> list[Event]:
        import ray

        events: list[Event] = self._unsent
        self._unsent = []
        if not self._calls:
            if not events:
                time.sleep(timeout)
            return events
        calls = list(self._calls)
        ready, _ = ray.wait(calls, num_returns=1, timeout=timeout)
        if ready and len(calls) > 1:
            ready, _ = ray.wait(calls, num_returns=len(calls), timeout=0)
        for gen in ready:
            events.extend(self._drain(gen))
        if self.timeout is not None:
            events.extend(self._check_timeouts())
        if not self._start_watched:
            self._warn_if_none_started()
        return events

    def _warn_if_none_started(self) -> None:
        """Say once what Ray lacks when no Ray task of the run has started
        :data:`_NO_START_WARN_S` after the first was sent."""
        import ray

        if self._first_sent_at is None:
            return
        if any(call.started for call in self._calls.values()):
            self._start_watched = True
            return
        waited = time.monotonic() - self._first_sent_at
        if waited < _NO_START_WARN_S:
            return
        self._start_watched = True  # (said once)
        free = ray.available_resources()
        total = ray.cluster_resources()
        asks = f"{self.cpus_per_task} CPU(s)" + (
            f" and {self.gpus_per_task:g} GPU(s)" if self.gpus_per_task else "")
        warnings.warn(
            f"no Ray task of this run has started after {waited:.0f} s: each asks for "
            f"{asks}; the Ray cluster has {free.get('CPU', 0):g} of {total.get('CPU', 0):g} "
            f"CPU(s) and {free.get('GPU', 0):g} of {total.get('GPU', 0):g} GPU(s) free "
            "(another job, or an earlier run's tasks, may hold them); the run waits for "
            "them", RuntimeWarning, stacklevel=2)

    def _drain(self, gen: Any) -> list[Event]:
        """Every message of one Ray task available now."""
        import ray

        events: list[Event] = []
        call = self._calls[gen]
        while True:
            try:
                message = ray.get(next(gen))
            except StopIteration:  # ended without "done" (not expected): hand back the rest
                del self._calls[gen]
                if call.tasks:
                    self._deaths.count("a Ray task ended before reporting its batch")
                    events.append(Requeued(list(call.tasks)))
                return events
            except ray.exceptions.RayError as exc:
                events.extend(self._died(gen, call, exc))
                return events
            kind = message[0]
            if kind == Msg.START:
                check_version(message)
                call.started = True
                call.worker = self._worker_id(message[1], message[2])
            elif kind == Msg.FATAL:
                raise WorkerStartupError(
                    "a Ray worker could not load the run: unpickling fit or the data, or "
                    "running setup=, failed (is fit importable on the Ray nodes?):\n"
                    f"{message[1]}")
            else:
                events.extend(self._outcomes(call, message))
                if kind == Msg.RUN:
                    call.running, call.running_since = message[1], time.monotonic()
                elif kind == Msg.DONE:
                    del self._calls[gen]
                    return events
            if not ray.wait([gen], num_returns=1, timeout=0)[0]:
                return events

    def _outcomes(self, call: Call, message: tuple) -> list[Event]:
        blob, busy, prepare_s = message[-3:]
        call.prepare_s += prepare_s
        if blob is None:  # the marker of a batch's first task: no outcome yet
            return []
        outcomes = load_outcomes(blob)  # (a value that cannot be unpickled: its task fails)
        for index in task_indices(outcomes):
            call.tasks.pop(index, None)
        prepare, call.prepare_s = call.prepare_s, 0.0
        return [Finished(outcomes, worker=call.worker, busy_s=busy,
                         batch_done=message[0] == Msg.DONE, prepare_s=prepare)]
