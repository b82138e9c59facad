"""Task data: what a task's data reference is, one class per kind of source.

A task carries a cheap reference to its data, not the data. Three places must
agree on what that reference means, and each kind of source answers all
three in its one class here:

* **plan** (:meth:`TaskData.task_columns`, in the driver): a key, a reference
  and a cost for each of the source's tasks, as columns (a kind with few tasks
  lists them in :meth:`TaskData.entries` and the columns are made from those);
* **hash** (:meth:`TaskData.hashes`, in the driver, with a store): the content
  hash of each task's data, part of its identity;
* **read** (:meth:`TaskData.open`, on a worker): a :class:`DataReader` that
  turns a batch's references into ``fit``'s first argument.

=================  ============================  =================================
kind               reference                     fit's first argument
=================  ============================  =================================
``TableSlices``    ``(offset, length)`` into     the group's rows (pandas, Arrow,
                   the table sorted by key       polars or NumPy arrays)
``ParquetReads``   ``(key, file numbers)``       the group's rows, read on the worker
``Items``          the item itself               the item
``SettingsOnly``   None                          none: ``fit(**params)``
=================  ============================  =================================

A new kind of source is one class here (and its source in
:mod:`manymodels.sources`); the executor only calls ``fit`` safely.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from typing import Any

from .tables import ParquetGroups, is_pandas_frame

#: ``(key parts, data reference, cost)`` of a task before a grid multiplies it.
Entry = tuple[tuple, Any, float]


class DataReader:
    """A worker's view of one run's task data: :meth:`begin_batch` prepares a
    batch (reads or converts its rows at once), :meth:`rows` gives one task's
    argument for ``fit``."""

    def begin_batch(self, refs: list[Any]) -> None:
        """Prepare the references of the batch about to run."""

    def rows(self, ref: Any) -> Any:
        return ref


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

    def hash_lanes(self, refs: list[Any]) -> Any:
        """The same hashes as an ``(n, 2)`` uint64 array (see
        :mod:`manymodels.hashing`); a kind with many tasks computes it at once."""
        import numpy as np

        from .rowhash import lanes_of

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
        from .hashing import digest

        return [digest("no data")] * len(refs)


class Items(TaskData):
    """``mm.items``: the reference is the item; a path is hashed by content."""

    kind = "items"
    _driver_only = ("_keys", "_items")

    def __init__(self, keys: list, items: list, cost: Callable[[Any], float] | None) -> None:
        self._keys, self._items, self._cost = keys, items, cost

    def entries(self) -> list[Entry]:
        cost = self._cost
        return [((key,), item, float(cost(item)) if cost else 1.0)
                for key, item in zip(self._keys, self._items)]

    def hashes(self, refs: list[Any]) -> list[str]:
        from .hashing import item_hash

        return [item_hash(item) for item in refs]


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
        them: a :class:`~manymodels.messages.SliceBatch`."""
        import numpy as np

        from .messages import SliceBatch

        chosen = np.asarray(positions, dtype=np.int64)
        return SliceBatch(chosen, self.offsets[chosen], self.lengths[chosen])


class TableSlices(TaskData):
    """Groups (or partitions) of a table sorted by key: ``(offset, length)``."""

    _driver_only = ("layout", "table")

    def __init__(self, layout: Any, cost: Callable[[int], float] | None, format: str,
                 labels: list | None = None) -> None:
        self.layout = layout
        self.table = layout.table
        self.format = format
        self.labels = labels  # a pandas frame's column labels, when not all strings
        self._cost = cost or float

    def task_columns(self) -> tuple[list[tuple], Sequence, Any]:
        import numpy as np

        layout, cost = self.layout, self._cost
        if cost is float:  # the default, its length: all at once (a million groups)
            costs = layout.lengths.astype(np.float64)
        else:
            costs = np.array([float(cost(length)) for length in layout.lengths.tolist()],
                             dtype=np.float64)
        return layout.keys, SliceRefs(layout.offsets, layout.lengths), costs

    def hashes(self, refs: list[tuple[int, int]]) -> list[str]:
        from .rowhash import lanes_hex

        return lanes_hex(self.hash_lanes(refs))

    def hash_lanes(self, refs: list[tuple[int, int]]) -> Any:
        """Rows hashed once for the whole table (pandas' vectorised row hash),
        combined per group by NumPy (:func:`~.rowhash.group_lanes`): a million
        groups without a Python call each."""
        import numpy as np
        import pandas as pd

        from .hashing import digest
        from .rowhash import RowHashes, group_lanes, lanes_of

        table, layout = self.table, self.layout
        if is_pandas_frame(table):  # map_partitions keeps the index
            rows = pd.util.hash_pandas_object(table, index=True).to_numpy()
            schema = f"{table.dtypes.to_dict()}|{list(table.columns)}"
        else:
            rows = RowHashes(table)  # each block's made as group_lanes comes to it
            schema = str(table.schema)
        offsets = np.asarray(layout.offsets, dtype=np.int64)
        lengths = np.asarray(layout.lengths, dtype=np.int64)
        per_group = group_lanes(rows, offsets, lengths, lanes_of(digest(schema)))
        starts = (refs.offsets if hasattr(refs, "offsets") else
                  np.fromiter((ref[0] for ref in refs), dtype=np.int64, count=len(refs)))
        if len(starts) == len(offsets) and np.array_equal(starts, offsets):
            return per_group  # a task per group, in the table's order
        found = np.searchsorted(offsets, starts)
        return per_group[found]

    def open(self, table: Any) -> DataReader:
        if is_pandas_frame(table):
            return _FrameSlices(table)
        return _ArrowSlices(table, self.format, self.labels)


class ParquetReads(TaskData):
    """``read_on_workers=True``: ``(key, file numbers)``; each batch reads its
    own groups' rows from the Parquet files, on its worker."""

    _driver_only = ("_entries",)

    def __init__(self, layout: Any, reader: ParquetGroups, cost: Callable[[int], float] | None,
                 format: str) -> None:
        import numpy as np

        self.reader = reader
        self.format = format
        cost = cost or float
        file_numbers = layout.table.column("__file__").to_numpy()
        self._entries = [
            (key, (key, tuple(np.unique(file_numbers[off:off + n]).tolist())),
             float(cost(int(n))))
            for key, off, n in zip(layout.keys, layout.offsets, layout.lengths)]

    def entries(self) -> list[Entry]:
        return self._entries

    def hashes(self, refs: list[tuple[tuple, tuple[int, ...]]]) -> list[str]:
        """A group's data is the content of the files that hold its rows (and,
        when given, the columns read and the order of its rows)."""
        from .hashing import digest, file_hash

        file_hashes = [file_hash(path) for path in self.reader.files]
        reader = self.reader
        how = ([f"order_by={list(reader.order_by)}"] if reader.order_by else []) + (
            [f"columns={list(reader.columns)}"] if reader.columns is not None else [])
        return [digest(repr(key), *how, *(file_hashes[n] for n in files)) for key, files in refs]

    def open(self, table: Any) -> DataReader:
        return _ParquetBatches(self.reader, self.format)


# -- the workers' side ----------------------------------------------------------------


def _range_index(length: int) -> Any:
    import pandas as pd

    return pd.RangeIndex(length)


def _arrow_as(rows: Any, format: str, labels: list | None = None) -> Any:
    """Arrow rows in the format ``fit`` asked for."""
    if format == "arrow":
        return rows
    if format == "pandas":
        frame = rows.to_pandas()
        if labels is not None:
            frame.columns = labels
        return frame
    if format == "polars":
        import polars as pl

        return pl.from_arrow(rows)
    if format == "numpy":
        return {name: column.to_numpy()
                for name, column in zip(labels or rows.column_names, rows.columns)}
    raise ValueError(f"unknown format {format!r}")


class _FrameSlices(DataReader):
    """``map_partitions`` over a pandas frame: partitions are views of it."""

    def __init__(self, frame: Any) -> None:
        import pandas as pd

        self.frame = frame
        # without copy-on-write (pandas < 3), fn could write through a view
        # into the caller's frame
        self.copy = int(pd.__version__.split(".")[0]) < 3

    def rows(self, ref: tuple[int, int]) -> Any:
        part = self.frame.iloc[ref[0]:ref[0] + ref[1]]
        return part.copy() if self.copy else part


def _locked(converted: Any) -> Any:
    """Rows as ``format="numpy"`` made them (a batch's, or a task's own),
    with every array made read-only (as those of a zero-copy conversion
    already are), once: each task's views of them then are too, and ``fit``
    cannot write through one into the next task's rows (a group repeated by
    a grid shares them), nor make it writeable again. Other formats are
    returned as they are."""
    import numpy as np

    if type(converted) is dict:
        for array in converted.values():
            while isinstance(array, np.ndarray):  # and the arrays it views: NumPy asks
                array.flags.writeable = False      # those when a view is made writeable
                array = array.base
    return converted


class _ArrowSlices(DataReader):
    """Slices of the sorted Arrow table (mapped from shared memory)."""

    def __init__(self, table: Any, format: str, labels: list | None) -> None:
        self.table, self.format, self.labels = table, format, labels
        # this batch's rows as one DataFrame, and where each group starts in it
        self._span: tuple[dict[tuple[int, int], int], Any] | None = None

    def begin_batch(self, refs: list[tuple[int, int]]) -> None:
        """Convert the rows of a batch of groups to pandas (or NumPy) in one go.

        Converting Arrow to pandas costs far more per call than per row, so
        twenty-row groups one by one spend more time converting than fitting
        (about 0.4 ms a group). So the batch's rows are converted once: the
        span of the sorted table they lie in when they are dense in it (groups
        of equal size keep key order in the longest-first queue), else just
        their slices, gathered; each task gets a slice of the result.
        """
        self._span = None
        if self.format not in ("pandas", "numpy") or len(refs) < 2:
            return
        unique = dict.fromkeys(refs)  # a product source repeats groups
        first = min(offset for offset, _ in unique)
        end = max(offset + length for offset, length in unique)
        rows = sum(length for _, length in unique)
        if end - first <= 2 * rows:
            converted = _arrow_as(self.table.slice(first, end - first), self.format, self.labels)
            self._span = ({ref: ref[0] - first for ref in unique}, _locked(converted))
            return
        import pyarrow as pa

        starts, position = {}, 0
        for ref in unique:
            starts[ref] = position
            position += ref[1]
        pieces = pa.concat_tables([self.table.slice(offset, length) for offset, length in unique])
        self._span = (starts, _locked(_arrow_as(pieces, self.format, self.labels)))

    def rows(self, ref: tuple[int, int]) -> Any:
        if self._span is not None:
            starts, converted = self._span
            start = starts.get(ref)
            if start is not None:
                stop = start + ref[1]
                if self.format == "numpy":  # views of the batch's read-only arrays
                    return {name: array[start:stop] for name, array in converted.items()}
                group = converted.iloc[start:stop]
                group.index = _range_index(ref[1])
                return group
        # a batch of one task, or a task not in its batch's span: rows of its own,
        # read-only too, so a fit sees the same whichever batch it lands in
        return _locked(_arrow_as(self.table.slice(ref[0], ref[1]), self.format, self.labels))


class _ParquetBatches(DataReader):
    """A batch's groups read from the Parquet files in one filtered scan."""

    def __init__(self, reader: ParquetGroups, format: str) -> None:
        self.reader, self.format = reader, format
        self._read: dict[tuple, Any] = {}
        self._error: str | None = None

    def begin_batch(self, refs: list[tuple[tuple, tuple[int, ...]]]) -> None:
        self._error = None
        try:
            self._read = self.reader.read(refs)
        except Exception:  # each task fails with the reason when it looks for its rows
            self._read = {}
            self._error = traceback.format_exc()

    def rows(self, ref: tuple[tuple, tuple[int, ...]]) -> Any:
        key = ref[0]
        rows = self._read.get(key)
        if rows is None:
            raise LookupError(f"the rows of group {key!r} could not be read"
                              + (f":\n{self._error}" if self._error
                                 else " (none match it any more)"))
        value = _arrow_as(rows, self.format)
        if self.format == "pandas":
            value.index = _range_index(len(value))  # as the eager path's groups
        return value
