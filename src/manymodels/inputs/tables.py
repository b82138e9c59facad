"""Turning whatever table a user has into one ``pyarrow.Table``.

Accepted: pandas and polars DataFrames, pyarrow Tables, and paths to a Parquet
or CSV file or to a directory of them (read by :mod:`.filereads`). Arrow is
the common form because it can be sorted once, sliced without copying and
memory-mapped by every worker.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .engineframes import refuse_engine_frame
from .filereads import present_columns, read_path
from .sourcechecks import refuse_a_name_twice


def _is_polars_frame(obj: Any) -> bool:
    return (type(obj).__module__.startswith("polars") and hasattr(obj, "to_arrow")
            and hasattr(obj, "columns"))  # (a Series has to_arrow, and no columns)


def one_array(column: Any) -> Any:
    """An Arrow column as one array: its only chunk as it is (pyarrow's
    ``ChunkedArray.combine_chunks`` copies even one chunk: 80 MB of pack
    locators, a fifth of a second, at a million tasks)."""
    if not isinstance(column, pa.ChunkedArray):
        return column
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def string_offsets(strings: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """A string (or large string) array's value offsets, each value's start
    and then the last one's end (``len + 1``, the array's slice applied), and
    its data bytes, as NumPy views of its buffers (no copy)."""
    _, offsets, data = strings.buffers()
    wide = pa.types.is_large_string(strings.type)
    starts = np.frombuffer(offsets, dtype=np.int64 if wide else np.int32)[
        strings.offset:strings.offset + len(strings) + 1]
    return starts, np.frombuffer(data, dtype=np.uint8) if data is not None else \
        np.zeros(0, dtype=np.uint8)


def fixed_width_bytes(strings: pa.Array) -> np.ndarray | None:
    """A string array whose values all have one width (hex digests), without
    nulls, as a ``(len, width)`` uint8 view of its bytes (no copy), or None:
    such rows are taken and compared by NumPy about ten times faster than
    Arrow compares strings."""
    count = len(strings)
    if count == 0 or strings.null_count or not pa.types.is_string(strings.type):
        return None
    ends, data = string_offsets(strings)
    width, rest = divmod(int(ends[-1] - ends[0]), count)
    if rest or width == 0 or not (np.diff(ends) == width).all():
        return None
    return data[ends[0]:ends[-1]].reshape(count, width)


def is_pandas_frame(obj: Any) -> bool:
    """Whether ``obj`` is a pandas DataFrame, without importing pandas."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(obj, pandas.DataFrame)


def _overflowing_column(frame: Any) -> Any:
    """The first column of ``frame`` that Arrow cannot convert for an
    integer too large (objects holding Python ints past 64 bits)."""
    for name, column in frame.items():
        try:
            pa.array(column, from_pandas=True)
        except OverflowError:
            return name
        except (pa.ArrowException, TypeError, ValueError):
            continue
    return None


def _unconvertible_column(frame: Any) -> str | None:
    """What is wrong with the first column of ``frame`` that Arrow cannot
    convert, naming it (Arrow's own message names it only sometimes, and
    for values of mixed types, ``1`` beside ``"1"``, says only that one
    could not be made the other); None where each converts alone."""
    for name, column in frame.items():
        try:
            pa.array(column, from_pandas=True)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            kinds = sorted({type(value).__name__ for value in column.dropna()})
            if len(kinds) > 1:
                return (f"column {name!r} holds values of types {', '.join(kinds)}, which "
                        "no one Arrow type holds: convert it to one first (.astype(str) "
                        "for text)")
            return f"column {name!r}: {exc}"
    return None


def _refuse_naive_beside_aware(frame: Any, converted: pa.Table) -> None:
    """Refuse a pandas column of objects that holds datetimes with a time
    zone and without one: Arrow gives them all the first one's (a naive
    ``2024-01-01`` read as UTC midnight, one group with ``2024-01-01Z``),
    where pandas cannot compare them. Only object columns read as
    timestamps are looked at."""
    for position, field in enumerate(converted.schema):
        column = frame.iloc[:, position]
        if not pa.types.is_timestamp(field.type) or column.dtype != object:
            continue
        zones = {getattr(value, "tzinfo", None) is None for value in column.dropna()}
        if len(zones) > 1:
            raise ValueError(f"column {field.name!r} holds datetimes with a time zone beside "
                             "datetimes without one, which are not comparable (Arrow would "
                             "read them all in one zone): give them all one (Series.dt."
                             "tz_localize, or pd.to_datetime(..., utc=True))")


def _refuse_polars_objects(frame: Any) -> None:
    """Refuse a polars frame's column of Python objects (``pl.Object``):
    its Arrow form is each object's memory address as 8 bytes, so its
    values became keys (and rows) of pointers, a group per object."""
    import polars as pl

    for name, kind in zip(frame.columns, frame.dtypes):
        if kind == pl.Object:
            raise ValueError(f"column {name!r} of the polars DataFrame holds Python objects "
                             "(pl.Object), which Arrow cannot hold (it gets their memory "
                             "addresses): convert it to a polars type first (text, a number, "
                             "a struct), or leave it out with columns=")


#: Arrow's view types and the type each is read as: Arrow's ``take`` (each
#: group's rows) has no kernel for them, so a table holding one (polars'
#: ``to_arrow(compat_level=pl.CompatLevel.newest())``, DuckDB's) failed when
#: its groups were taken ("Function 'array_take' has no kernel"), naming no column.
_VIEWS = ({pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}
          if hasattr(pa, "string_view") else {})  # (pyarrow 16 and later)


def without_views(table: pa.Table) -> pa.Table:
    """``table`` with each string or binary view column as large text or
    bytes (the same values)."""
    for position, field in enumerate(table.schema):
        plain = _VIEWS.get(field.type)
        if plain is not None:
            table = table.set_column(position, field.name, table.column(position).cast(plain))
    return table


def read_table(table: Any, columns: list[str] | None = None) -> pa.Table:
    """Read ``table`` (a frame, an Arrow table or a path) as a ``pyarrow.Table``;
    with ``columns``, only those columns (a file's others are never read), in
    the table's order; a column the table lacks is named in the error."""
    if is_pandas_frame(table):  # before the conversion, whose error names no column
        names = [str(c) for c in table.columns]
        refuse_a_name_twice(names if columns is None else [
            name for name in names if name in set(map(str, columns))], "given")
    if columns is not None and not isinstance(table, (str, Path)):
        names = ([str(c) for c in table.columns] if is_pandas_frame(table)
                 else list(table.columns) if _is_polars_frame(table) else table.column_names)
        columns = present_columns(columns, names, "the table")
        if is_pandas_frame(table):  # before the conversion: the others are never converted
            table = table.iloc[:, [names.index(c) for c in columns]]
        else:
            table = table.select(columns)
    if isinstance(table, (pa.Table, pa.RecordBatch)):
        refuse_a_name_twice(table.column_names, "given")  # (Arrow allows two)
        return without_views(table if isinstance(table, pa.Table)
                             else pa.Table.from_batches([table]))
    if isinstance(table, (str, Path)):
        return read_path(table, columns)
    if _is_polars_frame(table):
        _refuse_polars_objects(table)
        try:
            return without_views(table.to_arrow())
        except (pa.ArrowException, TypeError, ValueError) as exc:  # (Int128: no Arrow type)
            kinds = dict(zip(table.columns, map(str, table.dtypes)))
            raise ValueError(f"cannot convert the polars DataFrame to Arrow: {exc}; its "
                             f"columns' types are {kinds}") from exc
    if type(table).__module__.startswith("polars") and hasattr(table, "collect"):
        raise TypeError("a polars LazyFrame is a query, not yet a table: give its rows, "
                        "lazy_frame.collect() (or a Parquet file's path, which "
                        "read_on_workers=True reads on the workers)")
    import pandas as pd

    if isinstance(table, (pd.Series, pd.Index)) or type(table).__module__.startswith(
            "polars") and hasattr(table, "to_frame"):
        raise TypeError(f"a table must be a DataFrame, not a {type(table).__name__} (one "
                        "column): give it as one, series.to_frame()")
    if isinstance(table, pd.DataFrame):
        if isinstance(table.columns, pd.MultiIndex):
            raise ValueError("the pandas DataFrame's columns have several levels "
                             f"(e.g. {table.columns[0]!r}): flatten them to names first "
                             "(df.columns = ['_'.join(map(str, c)) for c in df.columns])")
        try:
            if not all(isinstance(c, str) for c in table.columns):  # labels 0, 1, ...
                table = table.set_axis([str(c) for c in table.columns], axis=1)
            converted = pa.Table.from_pandas(table, preserve_index=False)
        except OverflowError as exc:  # (Arrow's error names no column)
            raise ValueError(f"cannot convert the pandas DataFrame to Arrow: column "
                             f"{_overflowing_column(table)!r} holds Python integers outside "
                             "int64's range: convert the column first, to uint64 where every "
                             "value fits one (.astype('uint64')), else to text "
                             "(.astype(str))") from exc
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise ValueError(f"cannot convert the pandas DataFrame to Arrow: "
                             f"{_unconvertible_column(table) or exc}") from exc
        _refuse_naive_beside_aware(table, converted)
        return converted
    refuse_engine_frame(table, "the table", "this call reads its rows on the driver",
                        "mm.groups(df, by=...) is what takes an engine's DataFrame as it is")
    raise TypeError(
        "a table must be a pandas or polars DataFrame, a pyarrow Table, or a path "
        f"to a Parquet/CSV file or directory; got {type(table).__name__}"
    )


def refuse_unsortable(schema: pa.Schema, columns: list[str]) -> None:
    """Refuse an ``order_by`` column whose type Arrow cannot sort (lists,
    maps, half floats, a struct holding a list), naming it: the sort failed
    when the run planned its tasks (or on each worker, reading on workers)
    with Arrow's "Unsupported type for RecordBatch sorting", naming no
    column. Asked of Arrow itself, on two missing values of the type (a
    dictionary is sorted by its codes, a pandas Period or Interval by
    its storage: :func:`sort_order`)."""
    for name in columns:
        kind = schema.field(name).type
        if pa.types.is_dictionary(kind) or _pandas_extension(kind):
            continue
        try:
            pc.sort_indices(pa.table({"probe": pa.nulls(2, kind)}),
                            sort_keys=[("probe", "ascending")])
        except (pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise ValueError(f"order_by column {name!r} holds {kind} values, which cannot "
                             "be sorted: order by a column of numbers, times or text") from exc


#: pandas' Arrow types that sort by their storage: a Period by its ordinal
#: (its frequency is the type's, one per column), an Interval by (left,
#: right), as pandas sorts them (its ``closed`` side is the type's too).
_SORTED_BY_STORAGE = ("pandas.period", "pandas.interval")


def _pandas_extension(kind: pa.DataType) -> bool:
    return getattr(kind, "extension_name", None) in _SORTED_BY_STORAGE


def _sort_keys(column: pa.ChunkedArray) -> list[pa.ChunkedArray]:
    """The columns Arrow sorts ``column`` by: a pandas Period's ordinals, an
    Interval's left then right ends (Arrow sorts neither type itself, nor
    a struct before pyarrow 16); a float's NaN as null, as pandas sorts
    them together (Arrow puts NaN before null); else ``column``."""
    if _pandas_extension(column.type):
        storage = pa.chunked_array([chunk.storage for chunk in column.chunks],
                                   column.type.storage_type)
        if not pa.types.is_struct(storage.type):
            return _sort_keys(storage)
        return [key for index in range(storage.type.num_fields)  # (a missing interval's
                for key in _sort_keys(pc.struct_field(storage, [index]))]  # ends are null)
    if pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
        return [pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)]
    return [column]


def sort_order(table: pa.Table, columns: list[str], codes: Any = None) -> pa.Array:
    """The stable sort of ``table``'s rows by ``columns`` (ascending, missing
    values last), after ``codes`` (a group number per row) when given."""
    sortable = table.select(columns)
    if any(pa.types.is_dictionary(kind) for kind in sortable.schema.types):
        # Arrow sorts no dictionary column: a categorical sorts by its
        # categories' order, as pandas sorts it (one dictionary for all chunks)
        sortable = sortable.unify_dictionaries()
        for position, name in enumerate(columns):
            column = sortable.column(position)
            if pa.types.is_dictionary(column.type):
                sortable = sortable.set_column(position, name, pa.chunked_array(
                    [chunk.indices for chunk in column.chunks], column.type.index_type))
    keys = ([pa.chunked_array([pa.array(codes)])] if codes is not None else []) + [
        key for column in sortable.columns for key in _sort_keys(column)]
    names = [f"k{position}" for position in range(len(keys))]  # (the user's may repeat)
    return pc.sort_indices(pa.table(keys, names=names),  # nulls last
                           sort_keys=[(name, "ascending") for name in names])


def _one_chunk(column: pa.ChunkedArray) -> pa.Array:
    """``column`` as one array: its chunk itself when it has one
    (``combine_chunks`` copies even that: 800 MB of keys at ten million
    groups of ten rows, held by Arrow's pool after)."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def presorted_group_lengths(table: pa.Table, by: list[str], order_by: list[str] | None = None
                            ) -> np.ndarray | None:
    """Each group's number of rows, in key order, when ``table`` is already
    sorted by one integer or text key column (without nulls) and, within a
    group, by ``order_by`` (one integer, float or time column without
    nulls or NaN): as tables written series by series come (statsforecast's
    input, say). From where the key changes, in a few vectorised passes,
    without numbering or sorting the rows. None otherwise: the caller sorts.
    The order is the one the sort would give (text compares by code point
    in both), so the groups and their rows are the same either way."""
    if len(by) != 1 or len(order_by or ()) > 1 or table.num_rows < 2:
        return None
    keys = table.column(by[0])
    if keys.null_count or not (pa.types.is_integer(keys.type) or pa.types.is_string(keys.type)
                               or pa.types.is_large_string(keys.type)):
        return None
    keys = _one_chunk(keys)
    before, after = keys.slice(0, len(keys) - 1), keys.slice(1)
    if not pc.all(pc.less_equal(before, after)).as_py():
        return None
    same = pc.equal(before, after)
    if order_by:
        times = table.column(order_by[0])
        kind = times.type
        if times.null_count or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)
                                    or pa.types.is_temporal(kind)):
            return None
        times = _one_chunk(times)
        if pa.types.is_floating(kind) and pc.any(pc.is_nan(times)).as_py():
            return None
        ordered = pc.less_equal(times.slice(0, len(times) - 1), times.slice(1))
        if not pc.all(pc.or_(pc.invert(same), ordered)).as_py():
            return None
    changes = np.flatnonzero(~same.to_numpy(zero_copy_only=False)) + 1
    return np.diff(changes, prepend=0, append=len(keys))


def plain_scalar(value: Any) -> Any:
    """A NumPy scalar as its Python value (keys and metrics hold Python values);
    anything else unchanged."""
    item = getattr(value, "item", None)
    return item() if callable(item) and getattr(value, "ndim", None) == 0 else value


def _nullable_integer(kind: pa.DataType) -> Any:
    import pandas as pd

    if pa.types.is_integer(kind):
        return pd.api.types.pandas_dtype(str(kind).replace("int", "Int").replace("uInt", "UInt"))
    return None


def exact_pandas(table: pa.Table) -> Any:
    """``table.to_pandas()``, but an integer column with a missing value
    becomes a nullable ``Int64`` (``UInt64``, ...) column, not ``float64``:
    as floats two integers past 2**53 read the same, and 1 reads 1.0."""
    frame = table.to_pandas()
    for position, name in enumerate(table.column_names):
        column = table.column(position)
        if pa.types.is_integer(column.type) and column.null_count:
            frame[name] = column.to_pandas(types_mapper=_nullable_integer).array
    return frame
