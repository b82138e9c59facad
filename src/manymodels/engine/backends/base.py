"""The contract between the scheduler and an execution engine: the
:class:`Backend` base class, whose docstring states it (the API reference
shows it there, as ``mm.Backend``), and the helpers backends share
(:func:`blame_lost_batch`, :class:`DeathCount`, :func:`sendable_tasks`).
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from ...machine import usable_cores
from ..execution import RunContext, TaskRef
from ..messages import Event, Finished, Lost, Outcome, Requeued, Status
from ..options import BackendOptions

__all__ = ["Backend", "DeathCount", "Event", "Finished", "Lost", "Outcome", "Requeued",
           "WorkerStartupError", "blame_lost_batch", "wall_time"]


class WorkerStartupError(RuntimeError):
    """Workers cannot start or cannot load the run (e.g. ``fit`` does not unpickle)."""


#: Worker deaths outside any task a backend tolerates before it gives up.
DEATHS_OUTSIDE_TASKS = 5


class DeathCount:
    """Worker deaths outside any task (while loading the run, between tasks):
    a few are bad luck, more mean the workers cannot run here at all, and
    the run stops with :class:`WorkerStartupError` instead of looping."""

    def __init__(self, limit: int, what: str) -> None:
        self.limit, self.what, self.deaths = limit, what, 0

    def count(self, message: str) -> None:
        self.deaths += 1
        if self.deaths > self.limit:
            raise WorkerStartupError(
                f"{self.what} ({message}); manymodels cannot go on with this backend")


def sendable_tasks(tasks: Sequence[TaskRef], dumps: Callable[[Any], bytes]
                   ) -> tuple[list[TaskRef], list[Event]]:
    """Those of ``tasks`` that ``dumps`` (a backend's pickler) can send to a
    worker, and a :class:`Lost` (failed, the reason named) for each other:
    an item or a setting that cannot be pickled fails its task alone,
    instead of the run."""
    sendable: list[TaskRef] = []
    lost: list[Event] = []
    for task in tasks:
        try:
            dumps(task)
        except Exception as exc:
            lost.append(Lost(task[0], Status.FAILED.value, "this task's item or settings "
                             f"cannot be pickled to send them to a worker ({type(exc).__name__}: "
                             f"{exc}); make them picklable, or use backend='threads'", -1))
        else:
            sendable.append(task)
    return sendable, lost


def dump_sendable(tasks: Sequence[TaskRef], dump_batch: Callable[[Sequence[TaskRef]], bytes],
                  dump_task: Callable[[TaskRef], bytes]
                  ) -> tuple[Sequence[TaskRef], bytes | None, list[Event]]:
    """``dump_batch(tasks)``, the batch as it travels, with the tasks it
    holds and no :class:`Lost`; where that fails, the batch of the tasks that
    :func:`sendable_tasks` finds sendable (``None`` if none is) and the
    others' :class:`Lost`. The whole batch is tried first: checking each task
    alone costs a pickle per task, paid only when one cannot travel."""
    try:
        return tasks, dump_batch(tasks), []
    except Exception:
        sendable, lost = sendable_tasks(tasks, dump_task)
        return sendable, dump_batch(sendable) if sendable else None, lost


def blame_lost_batch(running: int | None, unreported: list[int], status: str, message: str,
                     worker: int, deaths: DeathCount, started_at: float = math.nan
                     ) -> list[Event]:
    """The rule for a worker that died with tasks of its batches unreported:
    the task it was running (``running``, since ``started_at``) is
    :class:`Lost` with ``status``; the rest never ran and go back to the
    scheduler (:class:`Requeued`); a death with no task running counts
    towards giving up (``deaths``)."""
    unreported = list(unreported)
    events: list[Event] = []
    if running is not None and running in unreported:
        events.append(Lost(running, status, message, worker, started_at))
        unreported.remove(running)
    else:
        deaths.count(message)
    if unreported:
        events.append(Requeued(unreported))
    return events


def wall_time(monotonic: float) -> float:
    """The ``time.time()`` of a moment the driver noted on its monotonic clock."""
    return time.time() - (time.monotonic() - monotonic)


class Backend(ABC):
    """Base class of execution engines, and their contract with the scheduler.

    A backend runs batches of tasks on its workers and reports what happened.
    It knows nothing of ordering, batching, retries, error budgets or
    progress: the scheduler (:mod:`manymodels.engine.scheduling`) owns those,
    so that every backend behaves the same and a new engine is one file.

    Life cycle, always driven by the scheduler, in the thread that called
    ``train`` (the main thread, where Ctrl-C is heard, unless the caller ran it
    in another)::

        backend = SomeBackend()             # or an instance the user built
        backend.configure(options)          # the run's validated BackendOptions
        backend.start(context)              # once: start workers, ship the RunContext
        while work remains:
            for _ in range(backend.free_slots(per_worker)):
                backend.submit(batch_id, tasks)   # tasks: a sequence of (index, data_ref, params)
            for event in backend.poll(timeout=0.05):
                ...                               # Finished / Lost / Requeued
        backend.stop(force=False)           # always, in a ``finally``

    Rules every backend keeps:

    * ``submit`` never blocks on a busy worker; ``free_slots(per_worker)`` says how
      many more batches it accepts now with at most ``per_worker`` unfinished on
      any one worker. The scheduler asks for two while tasks are measured short,
      so that a worker has its next batch at hand when it finishes one, and for
      one when they are long or not yet measured: a long batch queued behind its
      worker's current one would wait there while another worker idles. A
      backend whose queued batches go to whichever worker frees first says so
      (``shares_one_queue``), and is asked for two once tasks are measured.
    * Each task submitted is reported exactly once, as an outcome inside a
      :class:`Finished` event, or as a :class:`Lost` task (its worker died, ran
      past ``timeout`` or past ``memory_limit``), or handed back unrun in a
      :class:`Requeued` event (it was queued on a worker that died).
    * ``poll`` returns within about ``timeout`` seconds, with an empty list if
      nothing happened; it may return outcomes of a batch in several parts.
    * A batch and a part's outcomes are sequences, not always lists: a table's
      groups without parameters come as a :class:`~manymodels.engine.messages.SliceBatch`
      and a worker may send a part of successes as
      :class:`~manymodels.engine.messages.OkOutcomes` (``OkOutcomes.of(outcomes)``),
      each read as the tuples it stands for and pickled as arrays. Take a
      batch's or a part's task indices with
      :func:`~manymodels.engine.messages.task_indices`.
    * Exceptions raised by ``fit`` are outcomes, never exceptions of ``poll``.
      ``poll`` raises only when the backend itself cannot go on
      (:class:`WorkerStartupError`).
    * ``stop`` leaves no worker process and no shared-memory file behind; with
      ``force=True`` it kills at once instead of letting workers finish.

    Capability flags (the class attributes below) tell
    :func:`manymodels.train` which keywords a backend can honour, so that a
    request it cannot keep fails before work starts.

    A new backend is one file: subclass :class:`Backend`, set ``name`` and
    the capability flags it honours, implement the five abstract methods
    ``start``, ``free_slots``, ``submit``, ``poll`` and ``stop`` (a worker
    runs a batch with
    :meth:`manymodels.engine.execution.Executor.run_in_parts`, so that every
    backend runs ``fit`` alike), override :meth:`Backend.default_workers` if
    it sizes itself, and make it reachable by name with
    ``mm.register_backend(name, cls)``. It must pass
    ``tests/test_backend_contract.py`` (add its name to
    ``CONTRACT_BACKENDS``) and, if it isolates crashes
    (:attr:`isolates_crashes`), the fault tests of ``tests/test_failures.py``.
    Where a worker dies mid-batch, blame only the task it was running and
    hand the rest back (:func:`blame_lost_batch`).
    """

    name: ClassVar[str] = "base"
    """The name ``train(backend=...)`` and the run's results give it."""
    requires_pickling: ClassVar[bool] = False
    """``fit``, ``shared`` and models cross a process boundary (must pickle):
    ``train`` checks they pickle before any work."""
    isolates_crashes: ClassVar[bool] = False
    """A ``fit`` that crashes its worker (a segfault, ``os._exit``) fails its
    own task, not the run: workers are processes apart from the driver."""
    enforces_timeout: ClassVar[bool] = False
    """``timeout=`` can stop a task that runs too long (else it is refused)."""
    enforces_memory_limit: ClassVar[bool] = False
    """``memory_limit=`` can stop a worker that grows too large (else it is
    refused)."""
    isolates_gpus: ClassVar[bool] = False
    """``gpus_per_task=`` can give each running task GPUs of its own (else it
    is refused)."""
    caps_gpu_memory: ClassVar[bool] = False
    """``gpu_memory_limit=`` caps each worker process's PyTorch allocator
    (else it is refused: it would cap the driver's own)."""
    worker_start_s: float = 0.0
    """Seconds a worker took to start, on average over the first ones (in
    parallel: interpreter, imports, loading the run, a CUDA context), where
    the backend measures it (processes)."""
    spawn_reason: str | None = None
    """Why the workers were spawned rather than forked, in words ("polars is
    imported (it is not fork-safe)"), where the backend chooses (processes);
    the run's summary gives it beside ``worker_start_s``."""
    schedules_gpus: ClassVar[bool] = False
    """Its engine gives each task its GPUs from its own nodes' (Ray's
    ``num_gpus``): ``gpus_per_task=`` is asked of the engine, and not
    refused where the driver's machine has no GPU (a cluster's GPU nodes
    are not the driver's); the engine refuses a task no node can run."""
    starts_local_processes: ClassVar[bool] = False
    """Its workers are processes of this machine that it starts itself, by
    ``start_method=`` (fork, forkserver, spawn; else that keyword is
    refused), at ``MANYMODELS_WORKER_NICENESS``."""
    shares_one_queue: ClassVar[bool] = False
    """A queued batch goes to whichever worker frees up first, not to one
    worker: a long batch never waits behind another while a worker idles."""
    max_workers: ClassVar[int | None] = None
    """The most workers it runs, whatever ``workers=`` asks (serial: 1, the
    driver itself); None for no bound of its own. The run is sized, and
    recorded in the store, with at most this many."""
    runs_fit_in_poll: ClassVar[bool] = False
    """``poll`` runs ``fit`` itself, in the driver (serial): a Ctrl-C must
    cut into it. Any other backend's ``poll`` only reads what its workers
    sent (within about its ``timeout``), and a Ctrl-C waits until what it
    read is recorded: raised halfway through, it lost those results (their
    tasks were trained again by the next run)."""

    def __init__(
        self,
        workers: int | None = None,
        cpus_per_task: int = 1,
        timeout: float | None = None,
        memory_limit: int | None = None,
        gpu_sets: list[list[str]] | None = None,
    ) -> None:
        #: What the backend was built with; each run's options replace
        #: :attr:`options`, and a run that names no worker count gets this one.
        self.built_options = BackendOptions(
            workers=workers, cpus_per_task=cpus_per_task, timeout=timeout,
            memory_limit=memory_limit,
            gpu_sets=None if gpu_sets is None else tuple(tuple(s) for s in gpu_sets))
        self.configure(self.built_options)

    @classmethod
    def default_workers(cls, cpus_per_task: int) -> int | None:
        """How many workers when the user names no count: the usable cores
        (affinity and cgroup aware) divided by ``cpus_per_task``; None for a
        backend that sizes itself when it starts (a cluster's CPUs). More
        CPUs a task than this machine has is said (one worker then runs,
        its thread pools sized as asked: a task of a bigger machine's size)."""
        cores = usable_cores()
        if cpus_per_task > cores:
            import warnings

            warnings.warn(f"cpus_per_task={cpus_per_task} is more than the {cores} cores "
                          "this process may use here: one worker runs, its tasks' thread "
                          f"pools (BLAS, OpenMP) sized for {cpus_per_task}",
                          RuntimeWarning, stacklevel=2)
        return max(1, cores // cpus_per_task)

    def configure(self, options: BackendOptions) -> None:
        """Take a run's validated options: the only way settings reach a backend
        (``mm.train`` calls it with each run's options, on a backend it built
        or on an instance the user built, e.g. ``mm.RayBackend(address=...)``)."""
        self.options = options
        self.workers = options.workers or self.default_workers(options.cpus_per_task) or 1
        self.cpus_per_task = options.cpus_per_task
        self.timeout = options.timeout
        self.memory_limit = options.memory_limit
        self.gpu_sets = options.gpu_sets  # per worker slot: the GPU ids it alone may use

    def worker_gpus(self) -> dict[int, str]:
        """Worker id (as in ``run.results["worker"]``) -> the GPU ids it ran on.
        Here a worker's id is its slot, which keeps its GPUs (``gpu_sets``); a
        backend whose worker ids mean something else returns ``{}``."""
        return {slot: ",".join(gpus) for slot, gpus in enumerate(self.gpu_sets or ())
                if slot < self.workers}

    @abstractmethod
    def start(self, context: RunContext) -> None:
        """Start the workers and ship them the run's context (once per run)."""

    @abstractmethod
    def free_slots(self, per_worker: int) -> int:
        """How many more batches :meth:`submit` accepts now, with at most
        ``per_worker`` unfinished on any one worker."""

    @abstractmethod
    def submit(self, batch_id: int, tasks: Sequence[TaskRef]) -> None:
        """Queue a batch (a list of task tuples, or a
        :class:`~manymodels.engine.messages.SliceBatch` read as one); never blocks
        on a busy worker."""

    @abstractmethod
    def poll(self, timeout: float) -> list[Event]:
        """What happened since the last poll, within about ``timeout`` seconds."""

    @abstractmethod
    def stop(self, *, force: bool = False) -> None:
        """End the run: no worker process or shared-memory file left behind."""
