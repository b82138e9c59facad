"""``read_on_workers=True`` on Parquet files that are not in key order:
sorted once, not scanned once per batch.

Where every file holds rows of every group, a batch's filtered scan reads
every file, and a run reads the data once per batch. So, when the planner
finds the rows out of key order, it sorts them once, a bucket sort that
never holds more than one file and one bucket of rows:

1. The driver already holds each row's key (the key columns it read to plan
   the groups), hence each row's group number. The groups, in key order, are
   cut into buckets of about :data:`BUCKET_BYTES` each.
2. Each file is read once and its rows are appended to their buckets' Arrow
   IPC files, in file and row order.
3. Each bucket is mapped, sorted by group (then ``order_by``; a stable sort,
   as an eager read sorts the whole table) and written as the bucket's final
   Arrow IPC file. Where ``staging`` is an object store's, steps 2 and 3 work
   in a temporary directory here and each sorted bucket is uploaded as it is
   made.

The workers then read a group as a slice of a memory-mapped file
(:class:`~manymodels.planning.taskdata.StagedSlices`, as for an engine's
staged DataFrame). A group's data hash stays what the scans' path gives it
(its key, and the hashes of the files that hold its rows), so a store
reuses the models of either path.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import numpy as np
import pyarrow as pa

from ..inputs.filetables import codes_into, index_type_for
from ..inputs.objectstores import is_remote, path_in, shown, write_arrow_file
from ..inputs.parquetgroups import ParquetGroups, read_rows
from ..inputs.tables import sort_order
from .staging import StagedGroups, cleanup_with, new_directory, remove_directory

#: About how many bytes of rows one bucket holds: the most this sort keeps in
#: memory at once, beside one file's rows.
BUCKET_BYTES = 64 * 2**20
#: Rows a sorted bucket is written in at a time: its sorted copy is never whole.
WRITE_ROWS = 2**18


def sort_once(layout: Any, reader: ParquetGroups, lanes: np.ndarray,
              staging: str | None) -> StagedGroups:
    """The groups of ``layout`` (the key columns' layout, read on the driver)
    sorted into Arrow files under ``staging`` (a directory every worker sees;
    None: a temporary directory here); ``lanes``: each group's data hash."""
    directory = new_directory(staging, "manymodels-sorted-")
    work = tempfile.mkdtemp(prefix="manymodels-sorting-") if is_remote(directory) else directory
    try:
        buckets = _sort_into_buckets(layout, reader, work, directory)
    except BaseException:
        remove_directory(directory)
        raise
    finally:
        if work != directory:
            shutil.rmtree(work, ignore_errors=True)
    first_offset = layout.offsets[np.searchsorted(buckets, np.arange(buckets.max() + 1))]
    staged = StagedGroups(directory, [_bucket_name(b) for b in range(int(buckets.max()) + 1)],
                          layout.key_table, buckets,
                          layout.offsets - first_offset[buckets], layout.lengths, lanes)
    staged._cleanup = cleanup_with(staged, directory)
    return staged


class _Dictionaries:
    """The dictionary (categorical) columns of the files' rows as codes into
    one dictionary a column while they are sorted: an Arrow IPC file holds
    one dictionary a column, and each file (each row group) may have its
    own. A column's dictionary is the values of the files' dictionaries in
    the order first met, as an eager read's conversion to pandas unifies
    them (its categories); it only grows, so the codes written stay valid,
    and the sorted buckets all take the final one."""

    def __init__(self, schema: pa.Schema) -> None:
        self.types = {field.name: field.type for field in schema
                      if pa.types.is_dictionary(field.type)}
        self.values = {name: pa.array([], kind.value_type) for name, kind in self.types.items()}

    def as_codes(self, rows: pa.Table) -> pa.Table:
        """``rows`` with each dictionary column as int32 codes into its
        dictionary, which takes the values it did not have yet."""
        import pyarrow.compute as pc

        for name in self.types:
            position = rows.schema.get_field_index(name)
            if position < 0:  # (not among columns=)
                continue
            codes = []
            for chunk in rows.column(position).chunks:
                own = chunk.dictionary
                new = own.filter(pc.invert(pc.is_in(own, value_set=self.values[name])))
                if len(new):
                    self.values[name] = pa.concat_arrays([self.values[name], new])
                codes.append(codes_into(chunk, self.values[name]))
            rows = rows.set_column(position, name, pa.chunked_array(codes, pa.int32()))
        return rows

    def decoded(self, rows: pa.Table) -> pa.Table:
        """``rows`` (of :meth:`as_codes`) with their dictionary columns back,
        each of the final dictionary (its type's index type where that holds
        its codes, else int32)."""
        for name, kind in self.types.items():
            position = rows.schema.get_field_index(name)
            if position < 0:
                continue
            values = self.values[name]
            index_type = index_type_for(len(values), kind.index_type)
            column = pa.chunked_array(
                [pa.DictionaryArray.from_arrays(chunk.cast(index_type), values,
                                                ordered=kind.ordered)
                 for chunk in rows.column(position).chunks],
                pa.dictionary(index_type, kind.value_type, kind.ordered))
            rows = rows.set_column(position, name, column)
        return rows


def _bucket_name(number: int) -> str:
    return f"bucket-{number:06d}.arrow"


def _input_codes(layout: Any) -> np.ndarray:
    """Each row's group number, in the order the files were read."""
    sorted_codes = np.repeat(np.arange(len(layout.lengths), dtype=np.int64), layout.lengths)
    if layout.input_rows is None:
        return sorted_codes
    codes = np.empty_like(sorted_codes)
    codes[layout.input_rows] = sorted_codes
    return codes


def _sort_into_buckets(layout: Any, reader: ParquetGroups, directory: str,
                       target: str) -> np.ndarray:
    """Steps 2 and 3 of the module docstring, in ``directory``, the sorted
    buckets into ``target`` (the same, or an object store's); returns each
    group's bucket."""
    codes = _input_codes(layout)
    rows_per_file = np.bincount(layout.table.column("__file__").to_numpy(),
                                minlength=len(reader.files))
    columns = None if reader.columns is None else list(reader.columns)
    buckets: np.ndarray | None = None
    writers: list[Any] = []
    sinks: list[Any] = []
    bucket_codes: list[list[np.ndarray]] = []
    dictionaries = _Dictionaries(reader.schema)
    start = 0
    try:
        for number, file in enumerate(reader.files):
            reader.check_unchanged(number)
            rows = read_rows([file], columns=columns, schema=reader.schema,
                             partitions=reader.partitions, root=reader.root)
            if rows.num_rows != rows_per_file[number]:
                raise ValueError(f"the Parquet file {shown(file)!r} changed while it was read: "
                                 f"{rows.num_rows} rows, {rows_per_file[number]} before")
            rows = dictionaries.as_codes(rows)
            if buckets is None:  # sized by the first file's bytes a row
                buckets = _buckets(layout, rows.nbytes / max(rows.num_rows, 1))
                writers = [None] * (int(buckets.max()) + 1)
                bucket_codes = [[] for _ in writers]
            file_codes = codes[start:start + rows.num_rows]
            start += rows.num_rows
            where = buckets[file_codes]
            order = np.argsort(where, kind="stable")  # file and row order within a bucket
            rows, file_codes = rows.take(pa.array(order)), file_codes[order]
            counts = np.bincount(where, minlength=len(writers))
            position = 0
            for bucket in np.flatnonzero(counts).tolist():
                count = int(counts[bucket])
                if writers[bucket] is None:
                    path = os.path.join(directory, _bucket_name(bucket) + ".unsorted")
                    sinks.append(pa.OSFile(path, "wb"))
                    writers[bucket] = pa.ipc.new_file(sinks[-1], rows.schema)
                writers[bucket].write_table(rows.slice(position, count))
                bucket_codes[bucket].append(file_codes[position:position + count])
                position += count
    finally:
        for writer in writers:
            if writer is not None:
                writer.close()
        for sink in sinks:
            sink.close()
    assert buckets is not None
    for bucket, parts in enumerate(bucket_codes):
        name = _bucket_name(bucket)
        _sort_bucket(os.path.join(directory, name), np.concatenate(parts),
                     list(reader.order_by), dictionaries,
                     path_in(target, name) if is_remote(target) else None)
    return buckets


def _buckets(layout: Any, bytes_per_row: float) -> np.ndarray:
    """Each group's bucket: runs of groups in key order of about BUCKET_BYTES."""
    rows_per_bucket = max(1, int(BUCKET_BYTES / max(bytes_per_row, 1.0)))
    # numbered 0, 1, ... with none empty (a group larger than a bucket skips numbers)
    return np.unique(layout.offsets // rows_per_bucket, return_inverse=True)[1].astype(np.int64)


def _sort_bucket(path: str, codes: np.ndarray, order_by: list[str],
                 dictionaries: _Dictionaries, upload: str | None = None) -> None:
    """Sort a bucket's rows by group (then ``order_by``), stably, into ``path``
    (or, given ``upload``, an object store's URI, its record batches
    streamed as they are made: a bucket is about :data:`BUCKET_BYTES`),
    its dictionary columns of their final dictionaries."""
    unsorted = path + ".unsorted"
    with pa.memory_map(unsorted) as source:
        rows = dictionaries.decoded(pa.ipc.open_file(source).read_all())
        if order_by:
            order = sort_order(rows, order_by, codes)
        else:
            order = pa.array(np.argsort(codes, kind="stable"))
        if upload is not None:
            write_arrow_file(upload, rows.take(order))
        else:
            with pa.OSFile(path + ".partial", "wb") as sink, \
                    pa.ipc.new_file(sink, rows.schema) as out:
                for start in range(0, len(order), WRITE_ROWS):
                    out.write_table(rows.take(order.slice(start, WRITE_ROWS)))
            os.replace(path + ".partial", path)
    os.remove(unsorted)
