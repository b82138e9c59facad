"""The words workers and the driver exchange: task statuses and messages.

A leaf module (it imports nothing of manymodels), so that every other module,
a backend's worker side included, can name them without pulling in the rest.

Worker -> driver, per task, an :class:`Outcome`; per batch part, the backend's
events for the scheduler: :class:`Finished` (outcomes of tasks that ran),
:class:`Lost` (a task whose worker died, timed out or outgrew its memory) and
:class:`Requeued` (tasks handed back unrun). ::

    worker:  Executor.run_one ──► Outcome ──► (pickled by the backend, as plain tuples,
                                              or a part's as columns: OkOutcomes)
    driver:  backend.poll() ──► Finished(outcomes) | Lost | Requeued ──► Scheduler
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from ..planning.taskdata import SliceBatch


class Status(str, Enum):
    """What became of a task. The members are strings (``Status.OK == "ok"``),
    so results tables, the store and user code compare them as text."""

    OK = "ok"
    FAILED = "failed"  # fit raised
    CRASHED = "crashed"  # its worker died
    TIMEOUT = "timeout"  # it ran past timeout= and its worker was killed
    MEMORY = "memory"  # its worker outgrew memory_limit= and was killed, or out of GPU memory
    CANCELLED = "cancelled"  # never ran: the run was interrupted or stopped early

    def __str__(self) -> str:
        return self.value


#: Statuses of tasks that ran and did not produce a model.
FAILURE_STATUSES = (Status.FAILED, Status.CRASHED, Status.TIMEOUT, Status.MEMORY)


class Outcome(NamedTuple):
    """One task's result, as the executor reports it. It travels between
    processes as a plain tuple (a third of the pickling cost): unpack it by
    position, or name it with ``Outcome(*values)``."""

    index: int
    status: Status
    model: Any
    metrics: dict
    duration_s: float
    started_at: float  # time.time() when it started
    error: str | None  # the traceback
    retryable: bool  # the exception is one of the run's retry_on types


@dataclass
class Finished:
    """Outcomes of tasks that ran; ``batch_done`` when their batch is complete."""

    outcomes: list[Outcome] | OkOutcomes
    worker: int
    busy_s: float = 0.0  # running these tasks
    batch_done: bool = True
    prepare_s: float = 0.0  # preparing their batch (reading its rows), once per batch


@dataclass
class Lost:
    """A task whose worker died, timed out or outgrew its memory limit."""

    index: int
    status: Status  # CRASHED, TIMEOUT or MEMORY (retried); FAILED: it cannot be sent
    message: str
    worker: int
    #: When the task started (``time.time()``), where known (NaN: it never ran).
    started_at: float = math.nan
    #: From its start until now, when the driver found its worker dead, past
    #: ``timeout`` or over ``memory_limit``: a task that ran has a time, as
    #: one that raised has.
    duration_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.duration_s = time.time() - self.started_at


@dataclass
class Requeued:
    """Tasks handed back unrun because their worker went away."""

    indices: list[int] = field(default_factory=list)


Event = Finished | Lost | Requeued


class OkOutcomes(Sequence):
    """The outcomes of a part of a batch whose every task succeeded (``ok``,
    no error, nothing to retry), as columns: task indices, durations and
    start times as NumPy arrays, and the models and the metrics each as one
    object that every task names (the part's packs, or None) or a list.

    A worker process sends a part so (:meth:`of`) instead of a tuple a task:
    at a million tiny tasks the driver's loop spent more on recording each
    tuple than on anything else, and the scheduler records such a part with
    a few array operations. Anyone else reads it as the sequence of
    :class:`Outcome` tuples it stands for (iteration, ``len``, indexing and
    slicing; ``list(part)`` for a list)."""

    __slots__ = ("indices", "durations", "started", "_models", "_metrics")

    def __init__(self, indices: Any, durations: Any, started: Any, models: tuple | list,
                 metrics: tuple | list) -> None:
        self.indices, self.durations, self.started = indices, durations, started
        #: a one-tuple (the object every task names) or a list (each task's)
        self._models, self._metrics = models, metrics

    @classmethod
    def of(cls, outcomes: list) -> OkOutcomes | list:
        """``outcomes`` as columns when they qualify, else as they are."""
        if len(outcomes) < 2:
            return outcomes
        index, status, model, metrics, duration, started, error, retryable = zip(*outcomes)
        count = len(outcomes)
        if (status.count(Status.OK.value) != count or error.count(None) != count
                or retryable.count(False) != count):
            return outcomes
        import numpy as np

        return cls(np.array(index, dtype=np.int64), np.array(duration, dtype=np.float64),
                   np.array(started, dtype=np.float64), _one_or_each(model),
                   _one_or_each(metrics))

    def models(self) -> Any:
        """Each task's model, in order (an iterable)."""
        return _each(self._models, len(self.indices))

    def metrics(self) -> Any:
        """Each task's metrics, in order (an iterable)."""
        return _each(self._metrics, len(self.indices))

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Any:
        ok = Status.OK.value
        for index, model, metrics, duration, started in zip(
                self.indices.tolist(), self.models(), self.metrics(), self.durations.tolist(),
                self.started.tolist()):
            yield (index, ok, model, metrics, duration, started, None, False)

    def __getitem__(self, position: Any) -> Any:
        if isinstance(position, slice):
            return list(self)[position]
        models, metrics = self._models, self._metrics
        return (int(self.indices[position]), Status.OK.value,
                models[0 if type(models) is tuple else position],
                metrics[0 if type(metrics) is tuple else position],
                float(self.durations[position]), float(self.started[position]), None, False)

    def __reduce__(self) -> tuple:
        return (_restore_ok, (self.indices.tobytes(), self.durations.tobytes(),
                              self.started.tobytes(), self._models, self._metrics))


def _one_or_each(values: tuple) -> tuple | list:
    """``(object,)`` when every one of ``values`` is that object, else a list."""
    first = values[0]
    for value in values:
        if value is not first:
            return list(values)
    return (first,)


def _each(values: tuple | list, count: int) -> Any:
    return itertools.repeat(values[0], count) if type(values) is tuple else values


def _restore_ok(indices: bytes, durations: bytes, started: bytes, models: tuple | list,
                metrics: tuple | list) -> OkOutcomes:
    import numpy as np

    return OkOutcomes(np.frombuffer(indices, dtype=np.int64),
                      np.frombuffer(durations, dtype=np.float64),
                      np.frombuffer(started, dtype=np.float64), models, metrics)


def task_indices(items: Sequence) -> list[int]:
    """The task index of each of a batch's tasks or a part's outcomes, in
    order: a column's, when they come as columns (:class:`SliceBatch`,
    :class:`OkOutcomes`), else each tuple's first item."""
    if type(items) is SliceBatch or type(items) is OkOutcomes:
        return items.indices.tolist()
    return [item[0] for item in items]


class Pickled:
    """One model's pickled bytes, with their SHA-256 when a store will keep
    them: a model of a MiB or more a worker process pickled (smaller ones
    travel in their part's :class:`~.partpacks.ModelPack`), or one the driver pickled for
    its store. The driver writes the bytes as they are and unpickles them
    only when someone asks for the model (``run.models[key]``)."""

    __slots__ = ("data", "sha256")

    def __init__(self, data: bytes, sha256: str | None = None) -> None:
        self.data, self.sha256 = data, sha256

    def __reduce__(self) -> tuple:
        return (Pickled, (self.data, self.sha256))

    def load(self) -> Any:
        import pickle

        return pickle.loads(self.data)


class PickledWithBuffers(Pickled):
    """A model holding large buffers (arrays), pickled in the worker with
    its buffers apart: they travel out of band (the data plane's zero-copy
    way), and the driver unpickles the model only when someone asks for it.
    So a model whose class the driver cannot import fails where it is asked
    for, not the whole part's hand-over with every model in it."""

    __slots__ = ("buffers",)

    def __init__(self, data: bytes, buffers: list) -> None:
        super().__init__(data)
        self.buffers = buffers

    def __reduce__(self) -> tuple:
        return (PickledWithBuffers, (self.data, self.buffers))

    def load(self) -> Any:
        import pickle

        return pickle.loads(self.data, buffers=self.buffers)
