"""A group's output from ``map_groups``' function, as the Arrow table a
worker writes (:mod:`manymodels.run.outputfiles`): a DataFrame's rows, a
Series as a row or a column, an Arrow or polars table as it is, with the
group's key columns in front where it lacks them."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..inputs.grouplabels import holds_row_labels, is_fresh_index, values_as_columns


def is_value(output: Any) -> bool:
    """Whether an output is one value (a number, a text, a time), no table."""
    import pandas as pd

    return pd.api.types.is_scalar(output) and not isinstance(output, pa.Scalar)


def output_table(value: Any, parts: tuple, key_columns: list[str],
                 received: Any = None) -> pa.Table | None:
    """``fn``'s output for one group as an Arrow table, the key columns it
    lacks in front: a DataFrame's rows, the levels of an index other than
    pandas' default as columns (marked :data:`INDEX_MARK`: the driver drops
    them where every output's index of those levels held row labels,
    :func:`label_columns`); a Series of column-like text labels
    (``df.mean()``) as one row, under 0, 1, ... (a column of values) as a
    column, of other labels (``value_counts()``, dates, a filter's) as a
    DataFrame of one column; an Arrow or polars table as it is; one value
    (a number, a text) as a row, in column ``value``. ``received``: the
    labels of the rows ``fn`` was handed (None: positions). None for None
    (no rows)."""
    import pandas as pd

    if value is None:
        return None
    if is_value(value):
        value = pd.DataFrame({"value": [value]})  # one value: a row of its group's key
    if isinstance(value, pd.Series):
        name = value.name if value.name is not None else "value"
        index = value.index
        if len(index) == 0 or (isinstance(index, pd.RangeIndex) and index.start == 0
                               and index.step == 1):
            value = value.reset_index(drop=True).to_frame(name=name)  # a column of values
        elif index.inferred_type == "string":  # column-like labels (df.mean()): one row
            value = pd.DataFrame([value]).reset_index(drop=True)
        else:  # labels (value_counts, a date index, a filter's): judged as a frame's index
            value = value.to_frame(name=name)
    index_columns: list[str] = []
    labels, level = True, None
    if isinstance(value, pd.DataFrame) and not is_fresh_index(value.index):
        labels = holds_row_labels(value.index, received)
        level = _integer_level(value)
        if level is None:
            width = value.shape[1]
            value = values_as_columns(value)
            index_columns = [str(name) for name in value.columns[:value.shape[1] - width]]
    if isinstance(value, pd.DataFrame):
        names = value.columns.tolist()  # (iterating pandas 3's text index costs more)
        if not all(isinstance(name, str) for name in names):
            names = [str(name) for name in names]
            value = value.set_axis(names, axis=1)
        table = _plain_frame_table(value, names)
        if table is None:
            table = _marked_nullable(pa.Table.from_pandas(value, preserve_index=False),
                                     value)
    elif isinstance(value, pa.RecordBatch):
        table = pa.Table.from_batches([value])
    elif isinstance(value, (pa.Array, pa.ChunkedArray)):
        table = pa.table({"value": value})
    elif isinstance(value, pa.Table):
        table = value
    elif type(value).__module__.startswith("polars") and hasattr(value, "to_arrow"):
        table = value.to_arrow()
        if not isinstance(table, pa.Table):  # a polars Series
            table = pa.table({getattr(value, "name", None) or "value": table})
    else:
        raise TypeError(f"map_groups' function must return a table, got {type(value).__name__}")
    if not isinstance(value, pd.DataFrame):
        table = _marked_nullable(table)
    table = _marked_index(table.replace_schema_metadata(None), index_columns, labels)
    if level is not None:  # (the frame's own columns were converted without it)
        table = table.add_column(0, pa.field(level[0], level[1].type, metadata={
            INDEX_MARK: b"labels" if labels else b"values"}), level[1])
    for position, name in enumerate(key_columns):
        if str(name) not in table.column_names:
            values = pa.repeat(pa.scalar(parts[position]), table.num_rows)
            field = pa.field(str(name), values.type, metadata=ADDED_KEY)
            table = table.add_column(min(position, table.num_columns), field, values)
    return table


#: Field metadata of a key column a worker added to an output that lacked
#: it, of the group's key as a Python value (an ``int64``, a ``bool``, a
#: category's text): the driver gives it the input's type. A key column
#: ``fn`` returned itself holds what ``fn`` put there, of its type.
KEY_MARK = b"manymodels.key"
ADDED_KEY = {KEY_MARK: b"added"}


#: Field metadata of a column made of an output's index: ``labels`` where
#: that index held labels of the rows ``fn`` was handed (a filter's, a
#: sort's), ``values`` otherwise (``groupby("day").sum()``, ``describe()``).
INDEX_MARK = b"manymodels.index"


def _integer_level(frame: Any) -> tuple[str, pa.Array] | None:
    """A frame's index of one level of NumPy integers (a filter's or a
    sort's row labels, mostly) as the column :func:`values_as_columns` would
    make of it in front: its name and values, taken without ``reset_index``
    and a cast, which made a group's filtered rows cost four times as much.
    None for any other index, or one named like a column."""
    import numpy as np

    index = frame.index
    name = index.name if index.name is not None else "index"
    if (index.nlevels != 1 or not isinstance(name, str) or name in frame.columns
            or not isinstance(index.dtype, np.dtype) or index.dtype.kind not in "iu"):
        return None
    return name, pa.array(index.to_numpy())


def _marked_index(table: pa.Table, names: list[str], labels: bool) -> pa.Table:
    """``table`` with its columns ``names`` (an index's levels) marked
    :data:`INDEX_MARK`, their other marks kept."""
    if not names:
        return table
    schema = table.schema
    for name in names:
        position = schema.get_field_index(name)
        field = schema.field(position)
        mark = {**(field.metadata or {}), INDEX_MARK: b"labels" if labels else b"values"}
        schema = schema.set(position, field.with_metadata(mark))
    return table.cast(schema)


def label_columns(schemas: list[pa.Schema], keys: list[str]) -> set[str]:
    """The columns of the outputs' ``schemas`` to drop: those made of an
    index whose every output (of those whose index made the same columns)
    held row labels, as the pandas path judges them once for all outputs
    (:func:`manymodels.inputs.grouplabels.indexes_as_columns`), so that
    every backend, whichever worker wrote which output, gives one table.
    A column some output holds of its own, and a key column, are kept."""
    verdict: dict[tuple[str, ...], bool] = {}
    for schema in schemas:
        made = _index_columns(schema)
        if made:
            labelled = all(schema.field(name).metadata[INDEX_MARK] == b"labels"
                           for name in made)
            verdict[made] = verdict.get(made, True) and labelled
    dropped = {name for made, labelled in verdict.items() if labelled for name in made}
    for schema in schemas:
        made = _index_columns(schema)
        own = set(schema.names) - (set(made) if verdict.get(made) else set())
        dropped -= own
    return dropped - set(keys)


def _index_columns(schema: pa.Schema) -> tuple[str, ...]:
    return tuple(field.name for field in schema
                 if field.metadata and INDEX_MARK in field.metadata)


#: Field metadata of an integer or boolean column that holds missing values
#: (or came from pandas' ``Int64``/``boolean``): a pandas frame of the outputs
#: gives it pandas' nullable type, as ``concat`` of the groups' frames would,
#: where Arrow's ``to_pandas`` would make it floats (or objects) in the
#: partitions that hold a null and integers in the others.
NULLABLE = {b"manymodels.nullable": b"1"}


def nullable_columns(schema: pa.Schema) -> list[str]:
    """The columns of an integer or boolean type marked :data:`NULLABLE`."""
    return [field.name for field in schema
            if field.metadata and field.metadata.get(b"manymodels.nullable")]


def _marked_nullable(table: pa.Table, frame: Any = None) -> pa.Table:
    """``table`` with its integer and boolean columns that hold a null, or
    that ``frame`` holds as pandas' nullable types, marked :data:`NULLABLE`
    (a mark a part's schema, and so its file, carries)."""
    import pandas as pd

    schema = marked = table.schema
    for position, field in enumerate(schema):
        if not (pa.types.is_integer(field.type) or pa.types.is_boolean(field.type)):
            continue
        extension = (frame is not None and position < frame.shape[1]
                     and isinstance(frame.dtypes.iloc[position], pd.api.extensions.ExtensionDtype))
        if extension or table.column(position).null_count:
            marked = marked.set(position, field.with_metadata({**(field.metadata or {}),
                                                               **NULLABLE}))
    # (compared with the schema read once: table.schema is a new object each read)
    return table if marked is schema else table.cast(marked)


def _plain_frame_table(frame: Any, names: list[str]) -> pa.Table | None:
    """A frame of NumPy numbers and booleans as Arrow, column by column, as
    ``Table.from_pandas`` makes it (NaN as null), without the pandas metadata
    it builds and this module drops: a group's one-row output took 0.35 ms
    that way. None for any other frame (text, dates, categories, extension
    types, repeated names), which takes ``from_pandas``."""
    import numpy as np

    if len(set(names)) != len(names):
        return None
    columns = []
    for name in names:
        column = frame[name]
        if not isinstance(column.dtype, np.dtype) or column.dtype.kind not in "iufb":
            return None
        columns.append(pa.array(column.to_numpy(), from_pandas=True))
    return pa.Table.from_arrays(columns, names=names)
