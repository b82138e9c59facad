"""Task data: what a task's data reference is, one class per kind of source.

A task carries a cheap reference to its data, not the data. Three places must
agree on what that reference means, and each kind of source answers all
three in its one class here:

* **plan** (:meth:`TaskData.task_columns`, in the driver): a key, a reference
  and a cost for each of the source's tasks, as columns (a kind with few tasks
  lists them in :meth:`TaskData.entries` and the columns are made from those);
* **hash** (:meth:`TaskData.hashes`, in the driver, with a store): the content
  hash of each task's data, part of its identity;
* **read** (:meth:`TaskData.open`, on a worker): a
  :class:`~manymodels.inputs.datareaders.DataReader` that
  turns a batch's references into ``fit``'s first argument.

=================  ============================  =================================
kind               reference                     fit's first argument
=================  ============================  =================================
``TableSlices``    ``(offset, length)`` into     the group's rows (pandas, Arrow,
                   the table sorted by key       polars or NumPy arrays)
``ParquetReads``   ``(key, file numbers)``       the group's rows, read on the worker
``StagedSlices``   ``(file, offset, length)``    the group's rows, a slice of a file
                   in an engine's staged files   an engine wrote (:mod:`.staging`)
``Items``          the item itself               the item
``SettingsOnly``   None                          none: ``fit(**params)``
=================  ============================  =================================

A new kind of source is one class here (and its source in
:mod:`manymodels.inputs.sources`); the executor only calls ``fit`` safely.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ..inputs.datareaders import (
    ArrowSlices,
    DataReader,
    FrameSlices,
    ParquetBatches,
    StagedFiles,
)
from ..inputs.parquetgroups import ParquetGroups
from ..inputs.sourcechecks import called_cost
from ..inputs.tables import is_pandas_frame

#: ``(key parts, data reference, cost)`` of a task before a grid multiplies it.
Entry = tuple[tuple, Any, float]


class TaskData:
    """One kind of task data; see the module's table."""

    #: The kind's name in plans and stores: ``"groups"``, ``"items"`` or ``"grid"``.
    kind = "groups"
    #: Whether ``fit`` receives the data as its first argument.
    passes_data = True
    #: What the backends ship to every worker once (the sorted table), or None.
    table: Any = None
    #: How ``fit`` receives a group's rows.
    format = "pandas"

    #: Attributes the driver needs and workers do not (the table travels to
    #: workers once, through the backend's data plane, never inside this object).
    _driver_only: tuple[str, ...] = ()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in self._driver_only:
            state.pop(name, None)
        return state

    def entries(self) -> list[Entry]:
        raise NotImplementedError

    def task_columns(self) -> tuple[list[tuple], Sequence, Any]:
        """The entries as columns: key parts, data references, costs (an array)."""
        import numpy as np

        entries = self.entries()
        return ([parts for parts, _, _ in entries], [ref for _, ref, _ in entries],
                np.array([cost for _, _, cost in entries], dtype=np.float64))

    def hashes(self, refs: list[Any]) -> list[str]:
        """The content hash of each reference's data (a :func:`~.hashing.digest`)."""
        raise NotImplementedError

    def input_digest(self, refs: list[Any]) -> Any:
        """A digest under way (:mod:`manymodels.identity.inputdigest`) of
        all that :meth:`hash_lanes` of ``refs`` is made from, or None (the
        kind has no such digest, or its data cannot vouch for its values)."""
        return None

    def hash_lanes(self, refs: list[Any]) -> Any:
        """The same hashes as an ``(n, 2)`` uint64 array (see
        :mod:`manymodels.identity.hashing`); a kind with many tasks computes it at once."""
        import numpy as np

        from ..identity.rowhash import lanes_of

        return np.array([lanes_of(h) for h in self.hashes(refs)], dtype=np.uint64).reshape(-1, 2)

    def open(self, table: Any) -> DataReader:
        """The reader a worker uses; ``table`` is :attr:`table` as the worker
        sees it (mapped from shared memory, or the object itself)."""
        return DataReader()


class SettingsOnly(TaskData):
    """A bare grid: ``fit`` receives the settings as keywords, no data."""

    kind = "grid"
    passes_data = False

    def entries(self) -> list[Entry]:
        return [((), None, 1.0)]

    def hashes(self, refs: list[Any]) -> list[str]:
        from ..identity.hashing import digest

        return [digest("no data")] * len(refs)


def group_costs(cost: Any, lengths: Any) -> Any:
    """Each group's cost: its row count (``cost`` is ``float``, the default:
    the lengths themselves, a million groups), else ``cost`` of it, checked
    (:func:`~manymodels.inputs.sourcechecks.called_cost`)."""
    import numpy as np

    if cost is float:
        return lengths
    return np.array([called_cost(cost, n, "groups", f"a group of {n} rows")
                     for n in lengths.tolist()], dtype=np.float64)


class Items(TaskData):
    """``mm.items``: the reference is the item; a path is hashed by content."""

    kind = "items"
    _driver_only = ("_keys", "_items")

    def __init__(self, keys: list, items: list, cost: Callable[[Any], float] | None) -> None:
        self._keys, self._items, self._cost = keys, items, cost

    def entries(self) -> list[Entry]:
        return [((key,), item, self._cost_of(key, item))
                for key, item in zip(self._keys, self._items)]

    def _cost_of(self, key: Any, item: Any) -> float:
        if self._cost is None:
            return 1.0
        return called_cost(self._cost, item, "items", f"the item of key {key!r}")

    def hashes(self, refs: list[Any]) -> list[str]:
        from ..identity.valuehash import item_hash

        keys = {id(item): key for key, item in zip(self._keys, self._items)}
        hashes = []
        for item in refs:
            try:
                hashes.append(item_hash(item))
            except Exception as error:  # pickle's own error names neither item nor key
                raise TypeError(
                    f"the item of key {keys.get(id(item), '?')!r} ({type(item).__name__}) cannot "
                    f"be hashed ({type(error).__name__}: {error}), and a store needs its hash "
                    "to know when its model can be reused: pass what names it (a path, a "
                    "name) as the item and build it in fit, or train without store=") from error
        return hashes


class SliceRefs(Sequence):
    """The ``(offset, length)`` references of a table's groups, kept as two
    arrays; ``refs[i]`` is the tuple a worker receives."""

    __slots__ = ("offsets", "lengths")

    def __init__(self, offsets: Any, lengths: Any) -> None:
        import numpy as np

        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, position: Any) -> Any:
        if isinstance(position, slice):
            return SliceRefs(self.offsets[position], self.lengths[position])
        return int(self.offsets[position]), int(self.lengths[position])

    def take(self, positions: Sequence[int]) -> list[tuple[int, int]]:
        """The references at ``positions``, at once."""
        import numpy as np

        chosen = np.asarray(positions, dtype=np.int64)
        return list(zip(self.offsets[chosen].tolist(), self.lengths[chosen].tolist()))

    def batch(self, positions: Sequence[int]) -> Any:
        """The tasks at ``positions``, without parameters, as a worker runs
        them: a :class:`SliceBatch`."""
        import numpy as np

        chosen = np.asarray(positions, dtype=np.int64)
        return SliceBatch(chosen, self.offsets[chosen], self.lengths[chosen])


class TableSlices(TaskData):
    """Groups (or partitions) of a table sorted by key: ``(offset, length)``."""

    _driver_only = ("layout", "table")

    def __init__(self, layout: Any, cost: Callable[[int], float] | None, format: str,
                 labels: list | None = None, positions: bool = False) -> None:
        self.layout = layout
        self.table = layout.table
        self.format = format
        self.labels = labels  # a pandas frame's column labels, when not all strings
        self.positions = positions  # partitions under their rows' positions
        self._cost = cost or float

    def task_columns(self) -> tuple[list[tuple], Sequence, Any]:
        layout, cost = self.layout, self._cost
        costs = group_costs(cost, layout.lengths)
        return layout.keys, SliceRefs(layout.offsets, layout.lengths), costs

    def hashes(self, refs: list[tuple[int, int]]) -> list[str]:
        from ..identity.rowhash import lanes_hex

        return lanes_hex(self.hash_lanes(refs))

    def hash_lanes(self, refs: list[tuple[int, int]]) -> Any:
        """Rows hashed once for the whole table (pandas' vectorised row hash),
        combined per group by NumPy (:func:`~.rowhash.group_lanes`): a million
        groups without a Python call each."""
        import numpy as np

        from ..identity.hashing import digest
        from ..identity.rowhash import RowHashes, group_lanes, lanes_of
        from ..identity.valuehash import pandas_row_hashes

        table, layout = self.table, self.layout
        if is_pandas_frame(table):  # map_partitions keeps the index
            rows, noted = pandas_row_hashes(table)
            schema = f"{table.dtypes.to_dict()}|{list(table.columns)}{noted}"
        else:
            rows = RowHashes(table)  # each block's made as group_lanes comes to it
            schema = self._schema_text()
        offsets = np.asarray(layout.offsets, dtype=np.int64)
        lengths = np.asarray(layout.lengths, dtype=np.int64)
        per_group = group_lanes(rows, offsets, lengths, lanes_of(digest(schema)))
        starts = _starts(refs)
        if len(starts) == len(offsets) and np.array_equal(starts, offsets):
            return per_group  # a task per group, in the table's order
        found = np.searchsorted(offsets, starts)
        return per_group[found]

    def _schema_text(self) -> str:
        """The Arrow table's schema as its groups' data hashes take it."""
        from ..identity.rowhash import categories_note, schema_text

        by = [] if self.layout.key_table is None else self.layout.key_table.column_names
        return schema_text(self.table.schema) + categories_note(self.table, keys=by)

    def input_digest(self, refs: list[Any]) -> Any:
        """The table's bytes, its schema as :meth:`hash_lanes` reads it, and
        where each group and each task's rows are; None for a pandas frame
        (``map_partitions``) and for columns whose bytes cannot vouch for
        their values (see :mod:`manymodels.identity.inputdigest`)."""
        import numpy as np

        from ..identity.inputdigest import add_array, add_table, new_digest

        if is_pandas_frame(self.table):
            return None
        digest = new_digest()
        if not add_table(digest, self.table):
            return None
        by = [] if self.layout.key_table is None else self.layout.key_table.column_names
        # (the key columns too: the keys a run stores are then the same text)
        digest.update(f"{self._schema_text()}|keys {by!r}|".encode())
        for part in (self.layout.offsets, self.layout.lengths, _starts(refs)):
            add_array(digest, np.asarray(part, dtype=np.int64))
        return digest

    def open(self, table: Any) -> DataReader:
        if is_pandas_frame(table):
            return FrameSlices(table)
        return ArrowSlices(table, self.format, self.labels, self.positions)


def _starts(refs: Any) -> Any:
    """Where each task's rows start (``refs``: its ``(offset, length)``
    slices of the table, or their columns)."""
    import numpy as np

    return (refs.offsets if hasattr(refs, "offsets") else
            np.fromiter((ref[0] for ref in refs), dtype=np.int64, count=len(refs)))


class ParquetReads(TaskData):
    """``read_on_workers=True``: ``(key, file numbers)``; each batch reads its
    own groups' rows from the Parquet files, on its worker."""

    _driver_only = ("_entries", "layout")

    def __init__(self, layout: Any, reader: ParquetGroups, cost: Callable[[int], float] | None,
                 format: str) -> None:
        import numpy as np

        self.reader = reader
        self.format = format
        # (its key_table: the results' key columns keep the files' types, an
        # int8 key int8, as an eager read's do)
        self.layout = layout
        cost = cost or float
        file_numbers = layout.table.column("__file__").to_numpy()
        self._entries = [
            (key, (key, tuple(np.unique(file_numbers[off:off + n]).tolist())),
             float(n) if cost is float else called_cost(cost, int(n), "groups",
                                                        f"a group of {n} rows"))
            for key, off, n in zip(layout.keys, layout.offsets, layout.lengths)]

    def entries(self) -> list[Entry]:
        return self._entries

    def hashes(self, refs: list[tuple[tuple, tuple[int, ...]]]) -> list[str]:
        """A group's data is the content of the files that hold its rows (and,
        when given, the columns read and the order of its rows)."""
        from ..identity.valuehash import digest, file_hash

        file_hashes = self.reader.file_identities(file_hash)
        reader = self.reader
        how = ([f"order_by={list(reader.order_by)}"] if reader.order_by else []) + (
            [f"columns={list(reader.columns)}"] if reader.columns is not None else [])
        return [digest(repr(key), *how, *(file_hashes[n] for n in files)) for key, files in refs]

    def open(self, table: Any) -> DataReader:
        return ParquetBatches(self.reader, self.format)


class StagedRefs(Sequence):
    """The ``(file, offset, length)`` references of an engine's staged groups, as arrays."""

    __slots__ = ("files", "offsets", "lengths")

    def __init__(self, files: Any, offsets: Any, lengths: Any) -> None:
        self.files, self.offsets, self.lengths = files, offsets, lengths

    def __len__(self) -> int:
        return len(self.offsets)

    def __getitem__(self, position: Any) -> Any:
        if isinstance(position, slice):
            return [self[i] for i in range(*position.indices(len(self)))]
        return int(self.files[position]), int(self.offsets[position]), int(self.lengths[position])

    def take(self, positions: Sequence[int]) -> list[tuple[int, int, int]]:
        import numpy as np

        chosen = np.asarray(positions, dtype=np.int64)
        return list(zip(self.files[chosen].tolist(), self.offsets[chosen].tolist(),
                        self.lengths[chosen].tolist()))

    def locality(self) -> Any:
        """Each group's staged file: among tasks of equal cost, the scheduler
        hands them out file by file (within a file, task order is its offset
        order: both are key order), so that a batch's groups lie together in
        one file (in key order they lie in every file, one group in each
        partition's turn). Small ints, which NumPy sorts by radix."""
        import numpy as np

        files = np.asarray(self.files)
        return files.astype(np.int16 if len(files) == 0 or files.max() < 2**15 else np.int32)


class StagedSlices(TaskData):
    """A Spark or Dask DataFrame's groups, staged by its engine
    (:mod:`manymodels.planning.staging`): ``(file, offset, length)``; the
    workers map the files and slice them. The data hashes were made by the
    engine's workers, as they wrote the files."""

    _driver_only = ("layout", "_keys")

    def __init__(self, layout: Any, keys: Sequence[tuple], cost: Callable[[int], float] | None,
                 format: str) -> None:
        self.layout, self._keys = layout, keys
        self.directory, self.files = layout.directory, layout.files
        self.format = format
        self._cost = cost or float

    def task_columns(self) -> tuple[list[tuple], Sequence, Any]:
        layout, cost = self.layout, self._cost
        costs = group_costs(cost, layout.lengths)
        return self._keys, StagedRefs(layout.file_numbers, layout.offsets, layout.lengths), costs

    def hash_lanes(self, refs: Sequence[tuple[int, int, int]]) -> Any:
        layout = self.layout
        if isinstance(refs, StagedRefs) and refs.offsets is layout.offsets:
            return layout.lanes  # a task per group, in the plan's order
        where = {(int(f), int(o)): i for i, (f, o) in enumerate(zip(layout.file_numbers,
                                                                   layout.offsets))}
        return layout.lanes[[where[(ref[0], ref[1])] for ref in refs]]

    def hashes(self, refs: Sequence[tuple[int, int, int]]) -> list[str]:
        from ..identity.rowhash import lanes_hex

        return lanes_hex(self.hash_lanes(refs))

    def open(self, table: Any) -> DataReader:
        return StagedFiles(self.directory, self.files, self.format)


class SliceBatch(Sequence):
    """A batch of tasks that are slices of one table (its groups) with no
    parameters, as three int64 arrays: each task reads as the
    ``(index, (offset, length), None)`` a worker runs. It pickles as the
    arrays' bytes: the driver builds and pickles no tuple a task (at a
    million tiny tasks, part of what the loop that feeds many workers
    spends), and the worker reads it as the tuples it stands for."""

    __slots__ = ("indices", "offsets", "lengths")

    def __init__(self, indices: Any, offsets: Any, lengths: Any) -> None:
        self.indices, self.offsets, self.lengths = indices, offsets, lengths

    def __len__(self) -> int:
        return len(self.indices)

    def __iter__(self) -> Any:
        for index, offset, length in zip(self.indices.tolist(), self.offsets.tolist(),
                                         self.lengths.tolist()):
            yield (index, (offset, length), None)

    def __getitem__(self, position: Any) -> Any:
        if isinstance(position, slice):
            return SliceBatch(self.indices[position], self.offsets[position],
                              self.lengths[position])
        return (int(self.indices[position]),
                (int(self.offsets[position]), int(self.lengths[position])), None)

    def refs(self) -> Any:
        """The tasks' ``(offset, length)`` as columns (a :class:`SliceRefs`),
        for the worker's reader."""
        return SliceRefs(self.offsets, self.lengths)

    def __reduce__(self) -> tuple:
        return (_restore_slices, (self.indices.tobytes(), self.offsets.tobytes(),
                                  self.lengths.tobytes()))


def _restore_slices(indices: bytes, offsets: bytes, lengths: bytes) -> SliceBatch:
    import numpy as np

    return SliceBatch(*(np.frombuffer(column, dtype=np.int64)
                        for column in (indices, offsets, lengths)))
