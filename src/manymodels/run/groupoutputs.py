"""What map_groups and map_partitions make of their functions' outputs: one
table, of the kind the function returns (pandas, Arrow, polars), in key
order with the key columns in front, or, for a transform of pandas groups
under their rows' labels, back in the input's row order under its labels
(:func:`manymodels.map_groups` says which when)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ..inputs.grouplabels import group_labels, input_positions, is_transform
from ..inputs.sources import GroupSource
from ..planning.plan import group_layout
from .results import Run


def empty_table(format: str) -> Any:
    """An empty table of the kind a function handed ``format`` returns, for a
    run with no output to tell (every group failed): a polars or Arrow
    caller's code keeps working on it, as it would not on pandas'."""
    if format == "polars":
        import polars as pl

        return pl.DataFrame()
    if format == "arrow":
        return pa.table({})
    return pd.DataFrame()


def concat_outputs(parts: list[Any], what: str, keep_index: bool = False,
                   format: str = "pandas") -> Any:
    """Concatenate the outputs in order, keeping their kind of table or column
    (a Series stays a Series) and, with ``keep_index``, pandas' row labels;
    no outputs at all is an empty table of the kind ``format`` suggests."""
    if not parts:
        return empty_table(format)
    kinds = dict.fromkeys(_kind(part) for part in parts)
    if len(kinds) > 1:
        raise TypeError(f"{what}'s function returned {' and '.join(kinds)} for different "
                        "groups or partitions: return one kind of table")
    first = parts[0]
    module = type(first).__module__
    if module.startswith("pyarrow"):
        if isinstance(first, (pa.Array, pa.ChunkedArray)):  # a column stays a column
            return pa.chunked_array([chunk for part in parts for chunk in
                                     (part.chunks if isinstance(part, pa.ChunkedArray)
                                      else [part])], type=first.type)
        if isinstance(first, pa.RecordBatch):
            return pa.Table.from_batches(parts)
        # as pandas' concat would: an int column in one group and a float one in
        # another is a float column, a null key column a typed one, a column
        # some lack null there
        return _unified(lambda: pa.concat_tables(parts, promote_options="permissive"), what)
    if module.startswith("polars"):
        import polars as pl

        def concatenate() -> Any:
            _check_polars_types(parts)
            return pl.concat(parts, how="diagonal_relaxed")

        return _unified(concatenate, what)
    if all(isinstance(part, pd.Series) for part in parts):
        return pd.concat(parts, ignore_index=not keep_index)
    frames = []
    for part in parts:
        if isinstance(part, pd.Series):
            part = part.to_frame()
        elif not isinstance(part, pd.DataFrame):
            if not hasattr(part, "to_pandas"):
                raise TypeError(f"{what}'s function must return a table, got "
                                f"{type(part).__name__}")
            part = part.to_pandas()
        frames.append(part)
    return pd.concat(frames, ignore_index=not keep_index)


def _unified(concatenate: Callable[[], Any], what: str) -> Any:
    """``concatenate()``, or an error saying which outputs' columns could not
    be unified (types that have no common one: a text and a number)."""
    try:
        return concatenate()
    except Exception as exc:
        if "schema" not in type(exc).__name__.lower() and not isinstance(
                exc, (pa.ArrowInvalid, pa.ArrowTypeError)) and "Shape" not in type(exc).__name__:
            raise
        raise TypeError(f"{what}: the outputs' columns cannot be concatenated (a column "
                        f"whose types have no common one in different groups or partitions): "
                        f"{exc}") from exc


def _check_polars_types(parts: list[Any]) -> None:
    """Raise Arrow's error where the polars tables' columns have types that
    Arrow's permissive concatenation would refuse (a number and a text):
    polars' relaxed concat would make them text, silently. Numbers still
    widen (int and float: float) and a column some lack is null there, as
    for Arrow outputs. A categorical is read as its values (text and a
    categorical make text, as polars makes them); types with no Arrow form
    (``pl.Object``) are left to polars."""
    import polars as pl

    frames = [part for part in parts if isinstance(part, pl.DataFrame)]
    if len(frames) < 2:
        return
    try:
        schemas = [frame.head(0).to_arrow().schema for frame in frames]
    except Exception:  # noqa: BLE001 - no Arrow form to judge by: polars decides
        return
    pa.unify_schemas([pa.schema([field.with_type(field.type.value_type)
                                 if pa.types.is_dictionary(field.type) else field
                                 for field in schema]) for schema in schemas],
                     promote_options="permissive")


def _kind(output: Any) -> str:
    """What kind of table an output is, as an error names it."""
    module = type(output).__module__.split(".")[0]
    if module in ("pyarrow", "polars"):
        return f"{'an Arrow' if module == 'pyarrow' else 'a polars'} {type(output).__name__}"
    if isinstance(output, (pd.DataFrame, pd.Series)):
        return "pandas"
    return f"a {type(output).__name__}"


def check_table(output: Any, what: str) -> Any:
    """``output`` if it is a table (or a column) of pandas, Arrow or polars,
    else a TypeError naming what it is, as a split run's outputs are checked."""
    module = type(output).__module__.split(".")[0]
    if isinstance(output, (pd.DataFrame, pd.Series)) or module in ("pyarrow", "polars") or (
            hasattr(output, "to_pandas")):
        return output
    got = "a dict (read as a task's metrics, not as a table)" if isinstance(
        output, dict) else type(output).__name__
    raise TypeError(f"{what}'s function must return a table, got {got}")


def _with_keys(output: Any, parts: tuple, key_columns: list) -> Any:
    """``output`` with the key columns it lacks added in front, as the values
    of its group's key (an Arrow or polars table's columns by their names)."""
    module = type(output).__module__
    if module.startswith("pyarrow"):
        if not isinstance(output, pa.Table):
            return output
        missing = [i for i, c in enumerate(key_columns) if str(c) not in output.column_names]
        for position in missing:
            output = output.add_column(position, str(key_columns[position]),
                                       pa.array([parts[position]] * output.num_rows))
        return output
    if module.startswith("polars"):
        import polars as pl

        if not isinstance(output, pl.DataFrame):
            return output
        missing = [i for i, c in enumerate(key_columns) if str(c) not in output.columns]
        for position in missing:
            output = output.insert_column(
                position, pl.Series(str(key_columns[position]),
                                    [parts[position]] * output.height))
        return output
    if not isinstance(output, pd.DataFrame):
        return output
    names = set(output.columns)
    missing = [i for i, c in enumerate(key_columns) if c not in names]
    if missing:
        output = output.copy(deep=False)  # the caller's frame keeps its columns
        for position in missing:
            output.insert(position, key_columns[position], parts[position])
    return output


def _as_transform(base: GroupSource, run: Run, outputs: list[Any]) -> tuple | None:
    """When every non-empty pandas output holds exactly its group's rows,
    labelled as ``fn`` received them (a transform): the input position of each
    row of their concatenation, and which outputs they are; else None. Only
    for groups ``fn`` received under their rows' labels: one it got under a
    fresh index (an Arrow or polars group, a ``shared`` of its own named
    ``key``) may come back sorted under a fresh index too, which no label
    tells from its rows in order."""
    if not all(isinstance(out, (pd.DataFrame, pd.Series)) for out in outputs):
        return None
    layout = group_layout(base)  # the plan's layout, cached on the source
    rec = run._records
    done = np.flatnonzero(rec.ok_mask()).tolist()
    if len(done) != len(outputs) or len(run._plan.tasks) != len(layout.lengths):
        return None
    labels, offsets, lengths = group_labels(layout, base.row_index)
    kept = [i for i, out in enumerate(outputs) if len(out)]
    if not kept or not all(is_transform(outputs[i], labels[offsets[done[i]]:offsets[done[i]]
                                                          + lengths[done[i]]]) for i in kept):
        return None
    order = input_positions(layout)
    if len(kept) == len(lengths):  # every group, in layout order
        return order, kept
    groups = [done[i] for i in kept]
    return np.concatenate([order[offsets[g]:offsets[g] + lengths[g]] for g in groups]), kept


def _in_input_order(result: Any, positions: np.ndarray, base: GroupSource) -> Any:
    """``result``, whose rows came from input rows ``positions``, put back in
    the input's row order under its row labels (its positions when it has none)."""
    if len(positions) > 1 and not np.all(positions[1:] > positions[:-1]):
        permutation = np.argsort(positions, kind="stable")
        result = result.take(permutation)
        positions = positions[permutation]
    total = base.table.num_rows
    labels = getattr(base, "row_index", None)
    if labels is None or len(labels) != total:
        labels = pd.RangeIndex(total)
    result.index = labels if len(positions) == total else labels[positions]
    return result


def _frames_with_keys(frames: list[pd.DataFrame], parts: list[tuple],
                      key_columns: list, base: GroupSource) -> pd.DataFrame:
    """The frames concatenated, with the key columns they lack added in front.
    When all lack the same ones (the usual case) they are added once, to the
    concatenation, rather than to each frame."""
    if not frames:
        return pd.DataFrame()
    lacking = [tuple(i for i, c in enumerate(key_columns) if c not in names)
               for names in (set(frame.columns) for frame in frames)]
    if len(set(lacking)) > 1:
        frames = [_with_keys(frame, key, key_columns) for frame, key in zip(frames, parts)]
        return pd.concat(frames, ignore_index=True)
    result = pd.concat(frames, ignore_index=True)
    if lacking[0]:
        lengths = np.array([len(frame) for frame in frames])
        for position in lacking[0]:  # each group's key value, once per row of its output
            values = pd.Series([key[position] for key in parts]).repeat(lengths)
            result.insert(position, key_columns[position], values.array)
        result = _key_dtypes(base, result, [key_columns[i] for i in lacking[0]])
    return result


def _key_dtypes(base: GroupSource, frame: pd.DataFrame, key_columns: list) -> pd.DataFrame:
    """``frame`` with the key columns it was given from the groups' keys (Python
    values) in the input's pandas types, as pandas' ``groupby().apply`` keeps
    them (``uint8``, ``Int64``, ``category``...: from the types the input
    frame's Arrow copy recorded); a type the values do not fit is left."""
    metadata = getattr(base.table, "schema", None)
    metadata = metadata.pandas_metadata if metadata is not None else None
    if not metadata:
        return frame
    kinds = {column.get("name"): ("category" if column.get("pandas_type") == "categorical"
                                  else column.get("numpy_type"))
             for column in metadata.get("columns", [])}
    for name in key_columns:
        kind = kinds.get(str(name))
        if kind == "category":  # its categories and their order, as the input's
            kind = _categories_of(base.table, str(name)) or kind
        if name in frame.columns and kind and str(frame[name].dtype) != str(kind) and not str(
                kind).startswith("datetime"):
            try:
                frame[name] = frame[name].astype(kind)
            except (TypeError, ValueError):
                pass
    return frame


def _categories_of(table: pa.Table, name: str) -> Any:
    """The pandas ``CategoricalDtype`` of a dictionary column ``name`` of
    ``table``: its categories in order, ordered or not (``astype("category")``
    made them the observed values, sorted, unordered)."""
    if name not in table.column_names or not pa.types.is_dictionary(table.schema.field(
            name).type):
        return None
    column = table.select([name]).unify_dictionaries().column(0)
    if not column.num_chunks:
        return None
    return pd.CategoricalDtype(column.chunk(0).dictionary.to_pandas(),
                               ordered=table.schema.field(name).type.ordered)


def _rows_per_group(outputs: list[pd.Series], parts: list[tuple],
                    key_columns: list, base: GroupSource) -> pd.DataFrame:
    """Series of the same labels, one per group, as rows of one frame with the
    key columns in front (pandas' ``groupby(..., as_index=False).apply``)."""
    frame = pd.DataFrame(outputs).reset_index(drop=True)
    added = []
    for position, name in enumerate(key_columns):
        if name not in frame.columns:
            frame.insert(position, name, [p[position] for p in parts])
            added.append(name)
    return _key_dtypes(base, frame, added)


def _same_labels(indexes: list[pd.Index]) -> pd.Index | None:
    """The first index when every index has its labels, in any order (a dict
    built by group may order its keys by group), so that each output's values
    line up by label; else None. Labels repeated within an index align with no
    one order, so those must come in the same order."""
    first = indexes[0]
    if all(index.equals(first) for index in indexes[1:]):
        return first
    if not first.is_unique or not all(len(index) == len(first) and index.is_unique
                                      for index in indexes[1:]):
        return None
    if all((first.get_indexer(index) >= 0).all() for index in indexes[1:]):
        return first
    return None


def _series_under_keys(outputs: list[pd.Series], parts: list[tuple],
                       key_columns: list) -> pd.Series:
    """Series whose labels differ by group (``value_counts``) concatenated
    under a MultiIndex of the key columns and their labels, as pandas'
    ``groupby().apply`` makes it: bare, their labels would not say which group
    a row is of (x, y, x, z)."""
    from ..inputs.keys import key_column

    values = pd.concat(outputs, ignore_index=True)
    lengths = [len(out) for out in outputs]
    # the levels built from arrays: concat(keys=) cannot make a level of
    # tuple keys that hold a NaN ("Key nan not in level")
    levels = [pd.Index(key_column([key[position] for key in parts])).repeat(lengths)
              for position in range(len(key_columns))]
    inner = outputs[0].index.append([out.index for out in outputs[1:]])
    levels += [inner.get_level_values(level) for level in range(inner.nlevels)]
    values.index = pd.MultiIndex.from_arrays(levels, names=[*key_columns,
                                                            *outputs[0].index.names])
    return values


def assemble(run: Run, base: GroupSource, source: Any, key_columns: list,
              ok: list[tuple[tuple, Any]], labelled: bool = True) -> Any:
    """The outputs of the groups that succeeded as one table (see map_groups)."""
    present = [(key, output) for key, output in ok if output is not None]
    if not present and (not ok or base.format in ("arrow", "polars")):
        return empty_table(base.format)
    if not all(isinstance(output, (pd.DataFrame, pd.Series)) for _, output in present) or (
            present and all(isinstance(output, pd.Series) for _, output in present)):
        # a pandas stand-in for None would be a second kind of table, or make
        # Series (value_counts, a row of aggregates) frames that lose their labels
        ok = present
    parts = [key for key, _ in ok]
    # a group whose fn returned None has no rows, as in pandas' apply
    outputs = [pd.DataFrame() if output is None else output for _, output in ok]
    series = bool(outputs) and all(isinstance(out, pd.Series) for out in outputs)
    if not series:
        outputs = [out.to_frame() if isinstance(out, pd.Series) else out for out in outputs]
    transform = _as_transform(base, run, outputs) if source is base and labelled else None
    if transform is not None:
        positions, kept = transform
        outputs, parts = [outputs[i] for i in kept], [parts[i] for i in kept]
    if series:
        if transform is not None:
            return _in_input_order(pd.concat(outputs, ignore_index=True), positions, base)
        labels = _same_labels([out.index for out in outputs])
        if labels is not None:
            return _rows_per_group([out.reindex(labels) for out in outputs], parts,
                                   key_columns, base)
        return _series_under_keys(outputs, parts, key_columns)
    if all(isinstance(out, pd.DataFrame) for out in outputs):
        result = _frames_with_keys(outputs, parts, key_columns, base)
    else:
        result = concat_outputs([_with_keys(out, key, key_columns)
                                 for key, out in zip(parts, outputs)], "map_groups")
    return _in_input_order(result, positions, base) if transform is not None else result
