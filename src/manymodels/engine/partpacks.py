"""Packs: what one worker sends for one part of a batch, one object each.

A worker process runs a batch in parts (about 0.25 s of fits each, see
:meth:`manymodels.engine.execution.Executor.run_in_parts`). Per task it used to send
its model's pickle and its metrics dict as objects of their own, which the
driver unpickled, held and took apart one at a time: at a million tiny
models that was the driver's whole cost. Instead, during a part, a
:class:`PartPacker` gathers

- the small models' pickles into one :class:`ModelPack` (joined bytes,
  sizes, SHA-256s for a store), and
- the metrics of the tasks that report the same names with float values
  into one :class:`MetricsPack` (a float64 array, a row per task);

every outcome of the part names those same two objects (a reference, pickled
once). The driver keeps the references in its per-task lists and reads the
packs as columns: the store's writer writes a ModelPack's bytes as they came
and a MetricsPack's rows as the JSON text the worker made with Arrow
(:func:`manymodels.engine.metriccolumns.pack_texts`); a single task's model or
metrics are taken out only when someone asks (:class:`PackedModel`,
:meth:`MetricsPack.get`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .messages import Pickled
from .metricpacks import MetricsPack

#: Models pickled smaller than this travel in their part's :class:`ModelPack`,
#: and a store packs them (``store.artifacts.SMALL_ARTIFACT``).
PACKED_BELOW = 1 << 20


def distinct_objects(entries: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """The distinct objects ``entries`` holds (a hand-over's per-task slots
    name a few dozen packs, each over a run of consecutive tasks): each one's
    first position, and each entry's number among them. The runs of one
    object are found first, in one pass, and only their objects sorted:
    ``np.unique`` over a million ``id``s sorted them all (0.1 s a million)."""
    count = len(entries)
    if count == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    named = np.fromiter(map(id, entries), dtype=np.uint64, count=count)
    starts = np.flatnonzero(np.r_[True, named[1:] != named[:-1]])
    _, run_first, run_number = np.unique(named[starts], return_index=True,
                                         return_inverse=True)
    return starts[run_first], np.repeat(run_number.reshape(-1),
                                        np.diff(np.r_[starts, count]))


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
    before the store has it: :meth:`pickled`, :class:`PackedModel`).

    A pack of small arrays of one kind (:func:`manymodels.engine.dataplane.small_array_parts`)
    is *templated*: ``template`` holds the head and tail every one of its
    pickles shares, once, and ``data`` each one's own bytes between them (a
    least-squares model's 151-byte pickle is 24 bytes of coefficients).
    ``sizes`` and ``digests`` are always those of the whole pickles."""

    __slots__ = ("indices", "data", "sizes", "digests", "template", "stored", "_positions",
                 "_starts")

    def __init__(self) -> None:
        self.indices: Any = None  # np.ndarray of int64, set by seal()
        self.data, self.digests, self.sizes = b"", b"", None
        #: ``(head, tail)`` of a templated pack, else None.
        self.template: tuple[bytes, bytes] | None = None
        #: Committed to a store, its bytes let go (see :meth:`release`).
        self.stored = False
        self._positions: dict[int, int] | None = None
        self._starts: Any = None

    def seal(self, indices: list[int], models: list[bytes], hashed: bool = True,
             template: tuple[bytes, bytes] | None = None) -> ModelPack:
        """Fill the pack with ``models`` (pickled bytes; with ``template``, the
        part of each between its head and tail) of tasks ``indices``; with
        the SHA-256s of the whole pickles when ``hashed`` (a store keeps them)."""
        import hashlib

        sha256 = hashlib.sha256
        self.indices = np.array(indices, dtype=np.int64)
        self.sizes = np.fromiter(map(len, models), dtype=np.int64, count=len(models))
        self.data = b"".join(models)
        self.template = template
        if template is not None:
            head, tail = template
            self.sizes += len(head) + len(tail)
            if hashed:
                self.digests = b"".join([sha256(head + model + tail).digest()
                                         for model in models])
        elif hashed:
            self.digests = b"".join([sha256(model).digest() for model in models])
        return self

    def part_sizes(self) -> np.ndarray:
        """Each model's bytes in :attr:`data` (its whole pickle's size, less
        the template's where the pack is templated)."""
        if self.template is None:
            return self.sizes
        return self.sizes - (len(self.template[0]) + len(self.template[1]))

    def __len__(self) -> int:
        return 0 if self.indices is None else len(self.indices)

    def __reduce__(self) -> tuple:
        if self.stored:
            return (_stored_pack, ())
        return (_restore_pack, (self.indices.tobytes(), self.data, self.sizes.tobytes(),
                                self.digests, self.template))

    def release(self) -> None:
        """Mark the pack committed to a store and let go of its bytes: every
        task's slot that names it then stands for a model in the store. The
        store's writer calls this for a pack all of whose tasks it committed
        in one transaction: one call instead of a slot set per task (a
        million a run, on the writer thread, holding the GIL)."""
        self.stored = True
        self.indices = self.sizes = self._positions = self._starts = self.template = None
        self.data = self.digests = b""

    def pickled(self, index: int) -> Pickled:
        """Task ``index``'s model as :class:`Pickled` bytes, with their SHA-256
        when the pack was sealed ``hashed``."""
        if self._positions is None:  # the first of a task twice, as the store's writer
            self._positions = {}
            for at, task in enumerate(self.indices.tolist()):
                self._positions.setdefault(task, at)
            parts = self.part_sizes()
            self._starts = (parts.cumsum() - parts).tolist()
        at = self._positions[index]
        start = self._starts[at]
        digest = self.digests[32 * at:32 * at + 32].hex() if self.digests else None
        if self.template is None:
            return Pickled(self.data[start:start + int(self.sizes[at])], digest)
        head, tail = self.template
        end = start + int(self.sizes[at]) - len(head) - len(tail)
        return Pickled(b"".join((head, self.data[start:end], tail)), digest)

    def load(self, index: int) -> Any:
        return self.pickled(index).load()


def _restore_pack(indices: bytes, data: bytes, sizes: bytes, digests: bytes,
                  template: tuple[bytes, bytes] | None = None) -> ModelPack:
    pack = ModelPack()
    pack.indices = np.frombuffer(indices, dtype=np.int64)
    pack.sizes = np.frombuffer(sizes, dtype=np.int64)
    pack.data, pack.digests, pack.template = data, digests, template
    return pack


def _stored_pack() -> ModelPack:
    pack = ModelPack()
    pack.stored = True
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


class PartPacker:
    """A worker's packs for the part of a batch being run. ``model`` and
    ``metrics`` add a task's and return the pack its outcome names; ``seal``
    completes both as the part is sent (they travel complete) and starts
    new ones; ``hashed``: keep each model's SHA-256 and the metrics' JSON
    text (a store will)."""

    __slots__ = ("hashed", "_models", "_model_indices", "_model_bytes", "_template",
                 "_metrics", "_metric_indices", "_metric_values")

    def __init__(self, hashed: bool) -> None:
        self.hashed = hashed
        self.reset()

    def reset(self) -> None:
        """Start a new part (what was gathered and not sealed is dropped)."""
        self._models: ModelPack | None = None
        self._model_indices: list[int] = []
        self._model_bytes: list[bytes] = []
        self._template: tuple[bytes, bytes] | None = None
        self._metrics: MetricsPack | None = None
        self._metric_indices: list[int] = []
        self._metric_values: list[float] = []

    def model(self, index: int, data: bytes,
              template: tuple[bytes, bytes] | None = None) -> ModelPack:
        """Add task ``index``'s pickled model (with ``template``, the head and
        tail of its pickle, ``data`` being what lies between them); return
        the part's model pack. The pack is templated while every model added
        shares one template; the first that does not makes it a pack of
        whole pickles (the ones before made whole too)."""
        if self._models is None:
            self._models = ModelPack()
            self._template = template
        elif template is not self._template and template != self._template:
            if self._template is not None:
                head, tail = self._template
                self._model_bytes = [b"".join((head, body, tail)) for body in self._model_bytes]
                self._template = None
            if template is not None:
                data = b"".join((template[0], data, template[1]))
        self._model_indices.append(index)
        self._model_bytes.append(data)
        return self._models

    def metrics(self, index: int, metrics: dict) -> MetricsPack | None:
        """Add task ``index``'s metrics and return the part's metrics pack, or
        None when they do not fit it (a value that is not a float, names
        other than the pack's first task's): they then travel as they are."""
        pack = self._metrics
        if pack is not None and tuple(metrics) != pack.names:
            return None
        values = metrics.values()
        for value in values:
            if type(value) is not float:
                return None
        if pack is None:
            names = tuple(metrics)
            if not all(type(name) is str for name in names):
                return None
            pack = self._metrics = MetricsPack(names)
        self._metric_indices.append(index)
        self._metric_values.extend(values)
        return pack

    def seal(self) -> None:
        if self._models is not None:
            self._models.seal(self._model_indices, self._model_bytes, hashed=self.hashed,
                              template=self._template)
        if self._metrics is not None:
            self._metrics.seal(self._metric_indices, self._metric_values, texts=self.hashed)
        self.reset()
