"""A group's output from ``map_groups``' function, as the Arrow table a
worker writes (:mod:`manymodels.run.outputfiles`): a DataFrame's rows, a
Series as a row or a column, an Arrow or polars table as it is, with the
group's key columns in front where it lacks them."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from ..inputs.grouplabels import index_as_columns


def is_value(output: Any) -> bool:
    """Whether an output is one value (a number, a text, a time), no table."""
    import pandas as pd

    return pd.api.types.is_scalar(output) and not isinstance(output, pa.Scalar)


def output_table(value: Any, parts: tuple, key_columns: list[str],
                 received: Any = None) -> pa.Table | None:
    """``fn``'s output for one group as an Arrow table, the key columns it
    lacks in front: a DataFrame's rows, an index that holds values as
    columns, one of row labels (``received``: the rows' index ``fn`` was
    handed) dropped, as the pandas path concatenates them; a Series of
    column-like text labels (``df.mean()``) as one row, under 0, 1, ... (a
    column of values) as a column, of other labels (``value_counts()``,
    dates) as two columns, its labels and its values; an Arrow or polars
    table as it is; one value (a number, a text) as a row, in column
    ``value``. None for None (no rows)."""
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
        else:  # labels that are values (value_counts, a date index): kept as a column
            value = value.to_frame(name=name).reset_index()
    elif isinstance(value, pd.DataFrame):
        value = index_as_columns(value, received)
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
    table = table.replace_schema_metadata(None)
    for position, name in enumerate(key_columns):
        if str(name) not in table.column_names:
            values = pa.repeat(pa.scalar(parts[position]), table.num_rows)
            table = table.add_column(min(position, table.num_columns), str(name), values)
    return table


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
            marked = marked.set(position, field.with_metadata(NULLABLE))
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
