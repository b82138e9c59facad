"""The workers' side of task data: turning a batch's references into ``fit``'s
argument.

Each kind of task data (:mod:`manymodels.planning.taskdata`) opens one of these
readers on a worker (:meth:`~manymodels.planning.taskdata.TaskData.open`): it
prepares a batch at once (:meth:`DataReader.begin_batch`: reads or converts
its rows) and gives each task its rows (:meth:`DataReader.rows`).
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any

from .parquetgroups import ParquetGroups


class DataReader:
    """A worker's view of one run's task data: :meth:`begin_batch` prepares a
    batch (reads or converts its rows at once), :meth:`rows` gives one task's
    argument for ``fit``."""

    def begin_batch(self, refs: list[Any]) -> None:
        """Prepare the references of the batch about to run."""

    def rows(self, ref: Any) -> Any:
        return ref


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
        return {name: _as_numpy(column)
                for name, column in zip(labels or rows.column_names, rows.columns)}
    raise ValueError(f"unknown format {format!r}")


def _integers_made_floats(table: Any, converted: Any) -> bool:
    """Whether converting ``table`` made floats of an integer column, or
    objects of a boolean column, that misses a value: converted in one go,
    every group of a batch got them, those without a missing value too
    (which, alone, keep their integers, exact past 2**53, or their booleans,
    whose ``~`` is not -1 and -2), so such a batch is converted a group at a
    time: what a group gets does not depend on the batch it lands in. (A
    pandas frame's nullable integers and booleans come back as they were.)"""
    import pyarrow as pa

    for position, column in enumerate(table.columns):
        made = ("f" if pa.types.is_integer(column.type)
                else "O" if pa.types.is_boolean(column.type) else None)
        if made is not None and column.null_count:
            values = (converted.iloc[:, position] if hasattr(converted, "iloc")
                      else list(converted.values())[position])
            if values.dtype.kind == made:
                return True
    return False


def _nested_integers_missing(table: Any) -> bool:
    """Whether a nested column of ``table`` (lists, structs, maps) holds
    integers or booleans one of which is missing, at any depth: Arrow
    converts a nested column's values at once, so in one go every group of
    the batch got floats inside its lists and dicts (``[1.0, 2.0]``, ``{"a":
    3.0}``), those without a missing value too, and what a group got changed
    with ``workers=``. Such a batch is converted a group at a time (as
    :func:`_integers_made_floats`), decided on the Arrow side: pandas holds
    the converted values as objects either way."""
    import pyarrow as pa

    return any(_missing_integers_within(chunk) for column in table.columns
               if pa.types.is_nested(column.type) for chunk in column.chunks)


def _missing_integers_within(array: Any) -> bool:
    """Whether ``array`` (a nested one's values, at any depth) holds an
    integer or boolean value that is missing."""
    import pyarrow as pa

    kind = array.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        return array.null_count > 0
    if pa.types.is_struct(kind):  # (its fields with the struct's own nulls applied)
        return any(_missing_integers_within(field) for field in array.flatten())
    if pa.types.is_map(kind):
        return _missing_integers_within(array.keys) or _missing_integers_within(array.items)
    if isinstance(kind, (pa.ListType, pa.LargeListType, pa.FixedSizeListType)) or (
            pa.types.is_list_view(kind) or pa.types.is_large_list_view(kind)):
        return _missing_integers_within(array.flatten())
    return False


def _as_numpy(column: Any) -> Any:
    """A column of a batch as ``format="numpy"`` gives it. Text becomes
    Python strings, one object a row, which costs more than the rest of a
    small group's conversion; a column that repeats its values in runs (the
    key of a batch of whole groups, one value a group) makes one string a run
    and repeats it. Equal values, whichever way they were made."""
    import pyarrow as pa

    kind, n = column.type, len(column)
    if n < 16 or column.null_count or not (pa.types.is_string(kind)
                                           or pa.types.is_large_string(kind)):
        return column.to_numpy()
    import numpy as np
    import pyarrow.compute as pc

    head = column.slice(0, 16).to_pylist()  # a look first: distinct values cost no pass
    if all(a != b for a, b in zip(head, head[1:])):
        return column.to_numpy()
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    same = pc.equal(column.slice(0, n - 1), column.slice(1)).to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(~same)
    if len(starts) > n // 4:  # few runs: row by row is as quick
        return column.to_numpy(zero_copy_only=False)
    starts = np.concatenate(([0], starts + 1))
    values = column.take(pa.array(starts)).to_numpy(zero_copy_only=False)
    return np.repeat(values, np.diff(starts, append=n))


class FrameSlices(DataReader):
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


class ArrowSlices(DataReader):
    """Slices of the sorted Arrow table (mapped from shared memory)."""

    def __init__(self, table: Any, format: str, labels: list | None,
                 positions: bool = False) -> None:
        self.table, self.format, self.labels = table, format, labels
        #: a pandas partition under its rows' positions in the table (rows
        #: 100..199: labels 100..199), as ``fn`` on the whole table in one
        #: process labels them (``map_partitions``); a group under 0, 1, ...
        self.positions = positions
        # this batch's rows converted at once: (first, end, starts, converted);
        # converted holds the table's rows first..end, or, where ``starts`` is
        # not None, the batch's groups gathered, each at starts[(offset, length)]
        self._span: tuple[int, int, dict | None, Any] | None = None

    def begin_batch(self, refs: Sequence[tuple[int, int]]) -> None:
        """Convert the rows of a batch of groups to pandas (or NumPy) in one go.

        Converting Arrow to pandas costs far more per call than per row, so
        twenty-row groups one by one spend more time converting than fitting
        (about 0.4 ms a group). So the batch's rows are converted once: the
        span of the sorted table they lie in when they are dense in it (groups
        of equal size keep key order in the longest-first queue), else just
        their slices, gathered; each task gets a slice of the result. ``refs``
        may come as columns (:class:`~manymodels.planning.taskdata.SliceRefs`: a batch
        of a table's groups), read without a tuple a group.
        """
        self._span = None
        if self.format not in ("pandas", "numpy") or len(refs) < 2:
            return
        offsets = getattr(refs, "offsets", None)
        if offsets is not None:
            first, end = int(offsets.min()), int((offsets + refs.lengths).max())
            rows, unique = int(refs.lengths.sum()), refs
        else:
            unique = dict.fromkeys(refs)  # a product source repeats groups
            first = min(offset for offset, _ in unique)
            end = max(offset + length for offset, length in unique)
            rows = sum(length for _, length in unique)
        if end - first <= 2 * rows:
            span = self.table.slice(first, end - first)
            if _nested_integers_missing(span):
                return  # (each group converted alone: see _nested_integers_missing)
            converted = _arrow_as(span, self.format, self.labels)
            if _integers_made_floats(span, converted):
                return  # (each group converted alone: see _integers_made_floats)
            self._span = (first, end, None, _locked(converted))
            return
        import pyarrow as pa

        starts, position = {}, 0
        for ref in dict.fromkeys(unique):  # columns may repeat a group too
            starts[ref] = position
            position += ref[1]
        pieces = pa.concat_tables([self.table.slice(offset, length) for offset, length in starts])
        if _nested_integers_missing(pieces):
            return
        converted = _arrow_as(pieces, self.format, self.labels)
        if not _integers_made_floats(pieces, converted):
            self._span = (first, end, starts, _locked(converted))

    def rows(self, ref: tuple[int, int]) -> Any:
        offset, length = ref
        span = self._span
        if span is not None:
            first, end, starts, converted = span
            if starts is not None:
                start = starts.get(ref)
            else:
                start = offset - first if first <= offset and offset + length <= end else None
            if start is not None:
                stop = start + length
                if self.format == "numpy":  # views of the batch's read-only arrays
                    return {name: array[start:stop] for name, array in converted.items()}
                group = converted.iloc[start:stop]
                group.index = self._index(offset, length)
                return group
        # a batch of one task, or a task not in its batch's span: rows of its own,
        # read-only too, so a fit sees the same whichever batch it lands in
        rows = _locked(_arrow_as(self.table.slice(offset, length), self.format, self.labels))
        if self.positions and self.format == "pandas":
            rows.index = self._index(offset, length)
        return rows

    def _index(self, offset: int, length: int) -> Any:
        """A pandas task's row labels: its positions, or 0, 1, ..."""
        import pandas as pd

        return pd.RangeIndex(offset, offset + length) if self.positions else _range_index(
            length)


class ParquetBatches(DataReader):
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
        value = _locked(_arrow_as(rows, self.format))  # read-only, as the other paths give it
        if self.format == "pandas":
            value.index = _range_index(len(value))  # as the eager path's groups
        return value


class StagedFiles(DataReader):
    """Groups an engine staged (:mod:`manymodels.planning.staging`): each
    file is mapped once per worker, and a batch's groups of one file are
    converted at once (:class:`ArrowSlices`). Files on an object store are
    not mapped: a batch fetches the record batches its groups lie in
    (:class:`~manymodels.inputs.objectstores.RemoteArrowFile`)."""

    def __init__(self, directory: str, files: list[str], format: str) -> None:
        from .objectstores import is_remote

        self.directory, self.files, self.format = directory, files, format
        self.remote = is_remote(directory)
        self._mapped: dict[int, Any] = {}
        self._slices: dict[int, ArrowSlices] = {}
        self._errors: dict[int, str] = {}  # this batch's files that could not be read
        self._holding: set[int] = set()  # the files whose record batches are held

    def _table(self, number: int) -> Any:
        table = self._mapped.get(number)
        if table is None:
            from .objectstores import RemoteArrowFile, path_in

            path = path_in(self.directory, self.files[number])
            if self.remote:
                table = RemoteArrowFile(path)
            else:
                import pyarrow as pa

                table = pa.ipc.open_file(pa.memory_map(path)).read_all()  # no copy
            self._mapped[number] = table
        return table

    def begin_batch(self, refs: Sequence[tuple[int, int, int]]) -> None:
        by_file: dict[int, list[tuple[int, int]]] = {}
        for number, offset, length in refs:
            by_file.setdefault(number, []).append((offset, length))
        self._slices, self._errors = {}, {}
        if self.remote:  # hold this batch's rows only: the last batch's files let go
            for number in self._holding - by_file.keys():
                self._mapped[number].keep_only(())
        for number, slices in by_file.items():
            try:  # (a file gone, an object store's error: its tasks fail with the reason)
                table = self._table(number)
                if self.remote:
                    table.keep_only(slices)
                reader = self._slices[number] = ArrowSlices(table, self.format, None)
                reader.begin_batch(slices)
            except Exception:
                self._slices.pop(number, None)
                self._errors[number] = traceback.format_exc()
        if self.remote:
            self._holding = {number for number in by_file if number in self._mapped}

    def rows(self, ref: tuple[int, int, int]) -> Any:
        number, offset, length = ref
        error = self._errors.get(number)
        if error is not None:
            raise OSError(f"the staged rows of this group, in {self.files[number]}, could "
                          f"not be read:\n{error}")
        reader = self._slices.get(number)
        if reader is None:
            reader = ArrowSlices(self._table(number), self.format, None)
        return reader.rows((offset, length))
