"""The contract between the scheduler and an execution engine.

A backend runs batches of tasks on its workers and reports what happened. It
knows nothing of ordering, batching, retries, error budgets or progress: the
scheduler (:mod:`manymodels.scheduling`) owns those, so that every backend
behaves the same and a new engine is one file.

Life cycle, always driven by the scheduler from the driver's main thread::

    backend = SomeBackend(workers=4, cpus_per_task=1, timeout=None, memory_limit=None)
    backend.start(context)              # once: start workers, ship the RunContext
    while work remains:
        for _ in range(backend.free_slots(per_worker)):
            backend.submit(batch_id, tasks)   # tasks: [(index, data_ref, params), ...]
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
* Exceptions raised by ``fit`` are outcomes, never exceptions of ``poll``.
  ``poll`` raises only when the backend itself cannot go on
  (:class:`WorkerStartupError`).
* ``stop`` leaves no worker process and no shared-memory file behind; with
  ``force=True`` it kills at once instead of letting workers finish.

Capability flags tell :func:`manymodels.train` which keywords a backend can
honour, so that a request it cannot keep fails before work starts.
"""

from __future__ import annotations

from typing import ClassVar

from ..execution import RunContext, TaskRef
from ..messages import Event, Finished, Lost, Outcome, Requeued

__all__ = ["Backend", "Event", "Finished", "Lost", "Outcome", "Requeued",
           "WorkerStartupError"]


class WorkerStartupError(RuntimeError):
    """Workers cannot start or cannot load the run (e.g. ``fit`` does not unpickle)."""


class Backend:
    """Base class of execution engines; see the module docstring for the contract."""

    name: ClassVar[str] = "base"
    #: ``fit``, ``shared`` and models cross a process boundary (must pickle).
    requires_pickling: ClassVar[bool] = False
    #: A crash in ``fit`` (segfault, ``os._exit``) costs one task, not the run.
    isolates_crashes: ClassVar[bool] = False
    #: ``timeout=`` can stop a task that runs too long.
    enforces_timeout: ClassVar[bool] = False
    #: ``memory_limit=`` can stop a worker that grows too large.
    enforces_memory_limit: ClassVar[bool] = False
    #: ``gpus_per_task=`` can give each running task GPUs of its own.
    isolates_gpus: ClassVar[bool] = False
    #: A queued batch goes to whichever worker frees up first, not to one
    #: worker: a long batch never waits behind another while a worker idles.
    shares_one_queue: ClassVar[bool] = False

    def __init__(
        self,
        workers: int,
        cpus_per_task: int = 1,
        timeout: float | None = None,
        memory_limit: int | None = None,
        gpu_sets: list[list[str]] | None = None,
    ) -> None:
        self.workers = workers
        self.configure(cpus_per_task, timeout, memory_limit, gpu_sets)

    def configure(
        self,
        cpus_per_task: int = 1,
        timeout: float | None = None,
        memory_limit: int | None = None,
        gpu_sets: list[list[str]] | None = None,
    ) -> None:
        """Apply a run's resource keywords (``mm.train`` calls it on a backend
        instance that the user built, e.g. ``mm.RayBackend(address=...)``)."""
        self.cpus_per_task = cpus_per_task
        self.timeout = timeout
        self.memory_limit = memory_limit
        self.gpu_sets = gpu_sets  # per worker slot: the GPU ids it alone may use

    def start(self, context: RunContext) -> None:
        raise NotImplementedError

    def free_slots(self, per_worker: int) -> int:
        raise NotImplementedError

    def submit(self, batch_id: int, tasks: list[TaskRef]) -> None:
        raise NotImplementedError

    def poll(self, timeout: float) -> list[Event]:
        raise NotImplementedError

    def stop(self, *, force: bool = False) -> None:
        raise NotImplementedError
