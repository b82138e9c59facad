"""The words workers and the driver exchange: task statuses and messages.

A leaf module (it imports nothing of manymodels), so that every other module,
a backend's worker side included, can name them without pulling in the rest.

Worker -> driver, per task, an :class:`Outcome`; per batch part, the backend's
events for the scheduler: :class:`Finished` (outcomes of tasks that ran),
:class:`Lost` (a task whose worker died, timed out or outgrew its memory) and
:class:`Requeued` (tasks handed back unrun). ::

    worker:  Executor.run_one ──► Outcome ──► (pickled by the backend, as plain tuples)
    driver:  backend.poll() ──► Finished(outcomes) | Lost | Requeued ──► Scheduler
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple


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

    outcomes: list[Outcome]
    worker: int
    busy_s: float = 0.0  # running these tasks
    batch_done: bool = True
    prepare_s: float = 0.0  # preparing their batch (reading its rows), once per batch


@dataclass
class Lost:
    """A task whose worker died, timed out or outgrew its memory limit."""

    index: int
    status: Status  # CRASHED, TIMEOUT or MEMORY
    message: str
    worker: int


@dataclass
class Requeued:
    """Tasks handed back unrun because their worker went away."""

    indices: list[int] = field(default_factory=list)


Event = Finished | Lost | Requeued


class Pickled:
    """One model's pickled bytes, with their SHA-256 when a store will keep
    them: a model of a MiB or more a worker process pickled (smaller ones
    travel in their part's :class:`ModelPack`), or one the driver pickled for
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


#: Models pickled smaller than this travel in their part's :class:`ModelPack`,
#: and a store packs them (``store.artifacts.SMALL_ARTIFACT``).
PACKED_BELOW = 1 << 20


class ModelPack:
    """The small models one worker pickled during one part of a batch, as one
    buffer: their bytes joined, each one's size, its SHA-256 (32 raw bytes,
    when a store keeps them) and the task index of each. A million tiny
    models were a million :class:`Pickled` objects, each made, pickled,
    unpickled and taken apart again in the driver; as packs, a worker sends
    one object per part, every outcome of the part names that same object (a
    reference, pickled once), and the store's writer writes its bytes as they
    came (:func:`manymodels.store.packs.write_packs`). The driver takes a
    single model out of a pack only when someone asks for it (``run.models``,
    before the store has it: :meth:`pickled`, :class:`PackedModel`)."""

    __slots__ = ("indices", "data", "sizes", "digests", "_positions", "_starts")

    def __init__(self) -> None:
        self.indices: Any = None  # np.ndarray of int64, set by seal()
        self.data, self.digests, self.sizes = b"", b"", None
        self._positions: dict[int, int] | None = None
        self._starts: Any = None

    def seal(self, indices: list[int], models: list[bytes], hashed: bool = True) -> ModelPack:
        """Fill the pack with ``models`` (pickled bytes) of tasks ``indices``;
        with their SHA-256s when ``hashed`` (a store keeps them)."""
        import hashlib

        import numpy as np

        sha256 = hashlib.sha256
        self.indices = np.array(indices, dtype=np.int64)
        self.sizes = np.fromiter(map(len, models), dtype=np.int64, count=len(models))
        self.data = b"".join(models)
        if hashed:
            self.digests = b"".join([sha256(model).digest() for model in models])
        return self

    def __len__(self) -> int:
        return 0 if self.indices is None else len(self.indices)

    def __reduce__(self) -> tuple:
        return (_restore_pack, (self.indices.tobytes(), self.data, self.sizes.tobytes(),
                                self.digests))

    def pickled(self, index: int) -> Pickled:
        """Task ``index``'s model as :class:`Pickled` bytes, with their SHA-256
        when the pack was sealed ``hashed``."""
        if self._positions is None:  # the first of a task twice, as the store's writer
            self._positions = {}
            for at, task in enumerate(self.indices.tolist()):
                self._positions.setdefault(task, at)
            self._starts = (self.sizes.cumsum() - self.sizes).tolist()
        at = self._positions[index]
        start = self._starts[at]
        return Pickled(self.data[start:start + int(self.sizes[at])],
                       self.digests[32 * at:32 * at + 32].hex() if self.digests else None)

    def load(self, index: int) -> Any:
        return self.pickled(index).load()


def _restore_pack(indices: bytes, data: bytes, sizes: bytes, digests: bytes) -> ModelPack:
    import numpy as np

    pack = ModelPack()
    pack.indices = np.frombuffer(indices, dtype=np.int64)
    pack.sizes = np.frombuffer(sizes, dtype=np.int64)
    pack.data, pack.digests = data, digests
    return pack


class PackedModel:
    """Task ``index``'s model in a :class:`ModelPack`, loaded when asked for
    (``run.models`` names a million of these without copying their bytes)."""

    __slots__ = ("pack", "index")

    def __init__(self, pack: ModelPack, index: int) -> None:
        self.pack, self.index = pack, index

    def load(self) -> Any:
        return self.pack.load(self.index)


def unpacked(model: Any, index: int) -> Any:
    """What a task's slot of the results holds, with a :class:`ModelPack`
    standing for task ``index``'s model alone (:class:`PackedModel`);
    anything else as it is."""
    return PackedModel(model, index) if type(model) is ModelPack else model
