"""The groups' outputs of ``mm.map_groups(fn, engine_df, ...)`` read back by
the engine's workers, from the files the workers that ran the groups wrote
(:mod:`manymodels.run.outputfiles`): each worker's stream file read up to the
last row wanted, the rows named by the outcomes the driver received taken
in the order asked, each cast to the schema the driver unified from the
files' own schemas (an int column in one group and a float one in another
is a float column, as pandas' ``concat`` makes it; a column some groups lack
is null there).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from ..inputs.objectstores import is_remote, path_in, resolve
from .outputtables import nullable_columns


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` in ``schema``'s columns and types: a column it lacks is null."""
    columns = []
    for field in schema:
        if field.name in table.column_names:
            columns.append(cast_column(table.column(field.name), field.type))
        else:
            columns.append(pa.nulls(table.num_rows, field.type))
    return pa.Table.from_arrays(columns, schema=schema)


def cast_column(column: pa.ChunkedArray, kind: pa.DataType) -> pa.ChunkedArray:
    """``column`` cast to ``kind``; a plain column to a dictionary type by
    encoding its values first: Arrow casts text to a dictionary but not
    numbers (a categorical key of int categories crashed the read)."""
    if pa.types.is_dictionary(kind) and not pa.types.is_dictionary(column.type):
        column = column.cast(kind.value_type).dictionary_encode()
    return column.cast(kind)


def read_files(directory: str, refs: list[str], schema: pa.Schema,
               categories: dict[str, Any] | None = None) -> pa.Table:
    """On an engine's worker: the rows ``refs`` name (:attr:`WrittenOutput.ref`,
    or a file's name for all of it) under ``directory``, in order, as one
    table of ``schema``, the dictionary columns of ``categories`` (a
    categorical dtype each) of those categories, in every block alike."""
    table = _read_refs(directory, refs, schema)
    for name, kind in (categories or {}).items():
        column = in_categories(table.column(name), kind)
        position = table.schema.get_field_index(name)
        table = table.set_column(position, table.schema.field(position).with_type(column.type),
                                 column)
    return table


def in_categories(column: pa.ChunkedArray, kind: Any) -> pa.ChunkedArray:
    """A dictionary ``column`` re-encoded on the categories of ``kind`` (a
    pandas categorical dtype), in their order: each block of its own groups'
    values alone would hold other dictionaries, which Ray's ``to_pandas``
    gives as text, not a categorical."""
    import pyarrow.compute as pc

    values = pa.array(list(kind.categories), type=column.type.value_type)
    indices = pc.index_in(column.cast(column.type.value_type), value_set=values)
    return pa.chunked_array([pa.DictionaryArray.from_arrays(
        indices.combine_chunks().cast(column.type.index_type), values,
        ordered=bool(kind.ordered))], type=pa.dictionary(column.type.index_type,
                                                         column.type.value_type, kind.ordered))


def _read_refs(directory: str, refs: list[str], schema: pa.Schema) -> pa.Table:
    """:func:`read_files`' rows, as the files hold them (conformed to
    ``schema``). Each file is mapped once and its rows taken at once
    (neighbours in key order may lie in different files: the workers ran
    batches side by side, and a retried group's rows lie in another
    worker's file), read up to the last row wanted."""
    import numpy as np

    if not refs:
        return schema.empty_table()
    spans = []
    for ref in refs:
        name, _, span = ref.partition(":")
        offset, rows = (int(part) for part in span.split(":")) if span else (0, -1)
        spans.append((name, offset, rows))
    needed: dict[str, int] = {}  # the rows of each file read: up to the last one wanted
    for name, offset, rows in spans:
        needed[name] = -1 if rows < 0 or needed.get(name) == -1 else max(
            needed.get(name, 0), offset + rows)
    number = {name: position for position, name in enumerate(needed)}
    tables = [_read_stream(path_in(directory, name), rows)
              for name, rows in needed.items()]
    which = [number[name] for name, _, _ in spans]
    offsets = [offset for _, offset, _ in spans]
    counts = [rows if rows >= 0 else tables[number[name]].num_rows
              for name, _, rows in spans]
    file_of = np.repeat(np.asarray(which, dtype=np.int64), counts)
    starts = np.cumsum(counts) - np.asarray(counts)
    row_of = np.arange(len(file_of)) - np.repeat(starts - np.asarray(offsets), counts)
    # each file's rows that are wanted, in the order wanted, conformed once
    by_file = np.argsort(file_of, kind="stable")
    bounds = np.searchsorted(file_of[by_file], np.arange(len(tables) + 1))
    parts = []
    for position, table in enumerate(tables):
        rows = row_of[by_file[bounds[position]:bounds[position + 1]]]
        if len(rows) and bool((np.diff(rows) == 1).all()):  # one run: a slice, no copy
            table = table.slice(int(rows[0]), len(rows))
        else:
            table = table.take(pa.array(rows))
        parts.append(conform(table, schema))
    whole = pa.concat_tables(parts)
    if bool((by_file == np.arange(len(by_file))).all()):
        return whole  # already in the order wanted
    position = np.empty(len(by_file), dtype=np.int64)
    position[by_file] = np.arange(len(by_file))
    return whole.take(pa.array(position))


def open_output(path: str) -> Any:
    """An output file to read from start to end: mapped, or an object
    store's object read as a stream."""
    if is_remote(path):
        filesystem, where = resolve(path)
        return filesystem.open_input_stream(where)
    return pa.memory_map(path)


def _read_stream(path: str, rows: int) -> pa.Table:
    """A worker's output file's first ``rows`` rows at least (all, for -1),
    mapped, not copied: the batches after them, and a torn one a killed
    worker left at the end, are not read."""
    with open_output(path) as source:
        reader = pa.ipc.open_stream(source)
        batches, have = [], 0
        while rows < 0 or have < rows:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            batches.append(batch)
            have += batch.num_rows
        table = pa.Table.from_batches(batches, schema=reader.schema)
    if have < rows:
        raise OSError(f"the output file {os.path.basename(path.split('?')[0])} holds {have} "
                      f"rows, not the "
                      f"{rows} its groups were written to: it was changed since")
    if any(pa.types.is_dictionary(field.type) for field in table.schema):
        table = table.unify_dictionaries()  # a dictionary a batch: one, for take
    return table


def read_spark_chunks(batches: Iterator[pa.RecordBatch], directory: str,
                      schema: pa.Schema) -> Iterator[pa.RecordBatch]:
    """Spark's ``mapInArrow`` function: rows of refs (a ``files`` list each)
    in, their rows out, in order."""
    for batch in batches:
        for names in batch.column("files").to_pylist():
            yield from read_files(directory, names, schema).to_batches()


#: pandas' nullable type of an Arrow integer or boolean type (and of a float
#: type, which a nullable integer column unified with floats becomes)
NULLABLE_TYPES = {"int8": "Int8", "int16": "Int16", "int32": "Int32", "int64": "Int64",
                  "uint8": "UInt8", "uint16": "UInt16", "uint32": "UInt32",
                  "uint64": "UInt64", "bool": "boolean", "float": "Float32",
                  "double": "Float64"}


def pandas_frame_of(table: pa.Table, schema: pa.Schema,
                    categories: dict[str, Any] | None = None) -> Any:
    """``table`` as pandas, the integer and boolean columns ``schema`` marks
    nullable in pandas' nullable types: a partition with a missing value and
    one without (and the Dask result's meta) get the same type; the columns
    of ``categories`` (a key column's categorical dtype) in that dtype."""
    frame = table.to_pandas()
    for name in nullable_columns(schema):
        field = schema.field(name)
        frame[name] = table.column(name).to_pandas().astype(NULLABLE_TYPES[str(field.type)])
    for name, kind in (categories or {}).items():
        if name in frame.columns:
            frame[name] = frame[name].astype(object).astype(kind)
    return frame


def read_dask_chunk(chunk: tuple[list[str], int], directory: str, schema: pa.Schema,
                    categories: dict[str, Any] | None = None) -> Any:
    """Dask's ``from_map`` function: one partition's files as a pandas frame,
    its index the rows' positions in the whole result."""
    import pandas as pd

    names, start = chunk
    frame = pandas_frame_of(read_files(directory, names, schema), schema, categories)
    frame.index = pd.RangeIndex(start, start + len(frame))
    return frame
