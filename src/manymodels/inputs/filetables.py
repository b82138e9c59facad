"""Several files' tables as one table: their columns checked alike, and the
types their files' readers gave one column brought to one (text where any
file's is text, ``uint64`` or text where one file's ids need it, one
dictionary wide enough for every file's categories), the file that does
not fit named where none can be."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .objectstores import shown


def refuse_unlike_columns(files: list[str], names: list[list[str]], what: str) -> None:
    """Refuse files (``what``: where they are) whose columns differ from the
    first file's: merged, the missing ones would be all null."""
    first = set(names[0])
    files = [shown(file) for file in files]  # (an object's URI: its keys as ***)
    for file, own in zip(files[1:], names[1:]):
        if set(own) != first:
            lacks, extra = sorted(first - set(own)), sorted(set(own) - first)
            differences = ([f"lacks the columns {lacks}, which {files[0]!r} has"] if lacks
                           else []) + ([f"has the columns {extra}, which {files[0]!r} lacks"]
                                       if extra else [])
            raise ValueError(f"{what} do not share their columns: {file!r} "
                             + ", and ".join(differences)
                             + "; every file must hold the same columns")


def index_type_for(categories: int, index: pa.DataType) -> pa.DataType:
    """``index`` where its codes reach ``categories`` categories, else int32."""
    return index if categories <= np.iinfo(index.to_pandas_dtype()).max + 1 else pa.int32()


def codes_into(chunk: pa.DictionaryArray, values: pa.Array) -> pa.Array:
    """``chunk``'s rows as int32 codes into ``values``, a dictionary that
    holds every value of its own (files' dictionaries unified into one)."""
    return pc.index_in(chunk.dictionary, value_set=values).take(chunk.indices)


def dictionaries_that_hold_all(tables: list[pa.Table]) -> list[pa.Table]:
    """``tables`` (one a file, or one of a chunk a file) with each dictionary
    (categorical) column whose files' categories together outnumber its index
    type (100 in each of two
    files, an int8 index) as a dictionary of int32 indices in every table:
    the unified categories of a ``take`` or of pandas' conversion otherwise
    fail ("requires a larger index type"). Columns that fit are left as they
    are (their type is part of a group's data hash)."""
    if not tables:
        return tables
    names = [field.name for field in tables[0].schema if pa.types.is_dictionary(field.type)]
    for name in names:
        kinds = [t.schema.field(name).type for t in tables if name in t.column_names]
        if not all(pa.types.is_dictionary(kind) for kind in kinds):
            continue
        index = min((kind.index_type for kind in kinds), key=lambda k: k.bit_width)
        if index.bit_width >= 32:
            continue
        values = [chunk.dictionary for t in tables for chunk in t.column(name).chunks]
        try:
            distinct = len(pc.unique(pa.concat_arrays(values))) if values else 0
        except pa.ArrowException:  # of unlike values: the concatenation says so, by file
            continue
        if index_type_for(distinct, index) == index:
            continue
        wider = pa.dictionary(pa.int32(), kinds[0].value_type, kinds[0].ordered)
        tables = [t.set_column(t.schema.get_field_index(name), name, t.column(name).cast(wider))
                  if name in t.column_names else t for t in tables]
    return tables


def is_text(kind: pa.DataType) -> bool:
    """Whether ``kind`` is text (a string type, or a dictionary of one)."""
    if pa.types.is_dictionary(kind):
        kind = kind.value_type
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def text_where_any_is_text(tables: list[pa.Table]) -> list[pa.Table]:
    """The files' tables with a column that is text in one file and of
    another type in another (CSV's inference reads "7" as a number in a file
    that has no "A", a writer dictionary-encodes some files) as text in all."""
    mixed = [name for name, types in _types_by_column([t.schema for t in tables]).items()
             if len(types) > 1 and any(is_text(kind) for kind in types)]
    return _cast_columns(tables, dict.fromkeys(mixed, pa.string()))


def unsigned_where_any_is(tables: list[pa.Table]) -> list[pa.Table]:
    """The files' tables with an integer column that is ``uint64`` in one
    file (CSV's reading of ids past int64) and signed in another as
    ``uint64`` in all where no value is negative, else as text in all (no
    integer type holds both): Arrow's concatenation refused them, naming no
    file."""
    targets = {}
    for name in unsigned_beside_signed([table.schema for table in tables]):
        targets[name] = unsigned_or_text([pc.min(table.column(name)).as_py() for table in tables
                                          if name in table.column_names and
                                          pa.types.is_signed_integer(table.schema.field(name).type)])
    return _cast_columns(tables, targets)


def unsigned_beside_signed(schemas: list[pa.Schema]) -> list[str]:
    """The integer columns that are ``uint64`` in one schema and signed in
    another (Arrow's permissive unification makes them int64, where the
    unsigned file's ids past int64's range do not fit)."""
    return [name for name, types in _types_by_column(schemas).items()
            if pa.uint64() in types and any(pa.types.is_signed_integer(kind) for kind in types)
            and all(pa.types.is_integer(kind) for kind in types)]


def unsigned_or_text(lowest: list[Any]) -> pa.DataType:
    """The one type of a column ``uint64`` in some files, given the lowest
    value of each file where it is signed: ``uint64`` where none is
    negative, else text (no integer type holds both)."""
    return pa.string() if any(v is not None and v < 0 for v in lowest) else pa.uint64()


def _types_by_column(schemas: list[pa.Schema]) -> dict[str, set[pa.DataType]]:
    """Each column's types across the files' schemas."""
    kinds: dict[str, set[pa.DataType]] = {}
    for schema in schemas:
        for field in schema:
            kinds.setdefault(field.name, set()).add(field.type)
    return kinds


def _cast_columns(tables: list[pa.Table], targets: dict[str, pa.DataType]) -> list[pa.Table]:
    """``tables`` with each column named in ``targets`` cast to its type
    where a table has it of another."""
    if not targets:
        return tables
    retyped = []
    for table in tables:
        for name, kind in targets.items():
            position = table.schema.get_field_index(name)
            if position >= 0 and table.schema.field(position).type != kind:
                table = table.set_column(position, name, table.column(position).cast(kind))
        retyped.append(table)
    return retyped


def first_misfit(files: list[Any], schemas: list[pa.Schema]) -> str:
    """"FILE does not fit those before it: " for the first file whose schema
    does not unify with the files' before it, or "" (none alone)."""
    unified = schemas[0]
    for file, schema in zip(files[1:], schemas[1:]):
        try:
            unified = pa.unify_schemas([unified, schema], promote_options="permissive")
        except pa.ArrowException:
            return f"{shown(file)!r} does not fit the files before it: "
    return ""
