"""Outputs of several tasks as one table of the kind the function returned:
pandas (a Series stays a Series), Arrow (a column stays a column) or
polars, their columns' types unified as pandas' ``concat`` and Arrow's
permissive concatenation unify them, or an error naming the column whose
types have none in common. What :func:`manymodels.map_partitions` returns,
and what :mod:`.groupoutputs` builds ``map_groups``' result from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa


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
                   format: str = "pandas", names: Sequence[str] | None = None) -> Any:
    """Concatenate the outputs in order, keeping their kind of table or column
    (a Series stays a Series) and, with ``keep_index``, pandas' row labels;
    no outputs at all is an empty table of the kind ``format`` suggests.
    ``names``: each part's task as an error names it (``group 'a'``)."""
    if not parts:
        return empty_table(format)
    for part in parts:
        _refuse_query(part, what)
    kinds: dict[str, int] = {}
    for i, part in enumerate(parts):
        kinds.setdefault(_kind(part), i)
    if len(kinds) > 1:
        if names is None:
            raise TypeError(f"the function given to {what} returned {' and '.join(kinds)} "
                            "for different groups or partitions: return one kind of table")
        said = [f"{kind} for {names[i]}" for kind, i in kinds.items()]
        raise TypeError(f"the function given to {what} returned {' and '.join(said)} (the "
                        "first of each kind): return one kind of table")
    first = parts[0]
    module = type(first).__module__
    if module.startswith("pyarrow"):
        if isinstance(first, (pa.Array, pa.ChunkedArray)):  # a column stays a column
            return _unified(lambda: _arrow_column(parts), what)
        if isinstance(first, pa.RecordBatch):
            return pa.Table.from_batches(parts)
        # as pandas' concat would: an int column in one group and a float one in
        # another is a float column, a null key column a typed one, a column
        # some lack null there
        return _unified(lambda: pa.concat_tables(parts, promote_options="permissive"), what)
    if module.startswith("polars"):
        import polars as pl

        def concatenate() -> Any:
            if isinstance(first, pl.Series):  # a column stays a column, named as the first
                frames = [part.rename(first.name).to_frame() for part in parts]
                _check_polars_types(frames)
                return pl.concat(frames, how="diagonal_relaxed").to_series()
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
                raise TypeError(f"the function given to {what} must return a table, got "
                                f"{type(part).__name__}")
            part = part.to_pandas()
        frames.append(part)
    return pd.concat(frames, ignore_index=not keep_index)


def _arrow_column(parts: list[Any]) -> pa.ChunkedArray:
    """Arrow columns as one, of the type their types unify to as a table's
    columns do (int and float: float; a null column: the others' type)."""
    types = [part.type for part in parts]
    if any(kind != types[0] for kind in types[1:]):
        unified = pa.unify_schemas([pa.schema([pa.field("column", kind)]) for kind in types],
                                   promote_options="permissive")
        parts = [part.cast(unified.field(0).type) for part in parts]
    return pa.chunked_array([chunk for part in parts for chunk in
                             (part.chunks if isinstance(part, pa.ChunkedArray) else [part])],
                            type=parts[0].type)


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
    name = type(output).__name__
    return f"{'an' if name[:1].lower() in 'aeiou' else 'a'} {name}"


def _refuse_query(output: Any, what: str) -> None:
    """Refuse a polars LazyFrame: a query, not yet a table (as an input is
    refused), whose concatenation was a lazy union of every output's query,
    run by no worker and given no key columns."""
    if type(output).__name__ == "LazyFrame" and type(output).__module__.startswith("polars"):
        raise TypeError(f"the function given to {what} returned a polars LazyFrame, a query "
                        "not yet a table: return lazy_frame.collect(), run in the worker")


def check_table(output: Any, what: str) -> Any:
    """``output`` if it is a table (or a column) of pandas, Arrow or polars,
    else a TypeError naming what it is, as a split run's outputs are checked."""
    _refuse_query(output, what)
    module = type(output).__module__.split(".")[0]
    if isinstance(output, (pd.DataFrame, pd.Series)) or module in ("pyarrow", "polars") or (
            hasattr(output, "to_pandas")):
        return output
    got = "a dict (read as a task's metrics, not as a table)" if isinstance(
        output, dict) else type(output).__name__
    raise TypeError(f"the function given to {what} must return a table, got {got}")
