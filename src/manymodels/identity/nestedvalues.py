"""Columns pandas cannot hash, made hashable for a group's data hash.

pandas hashes numbers, text, dates and the like (see :mod:`.rowhash`), but
not the Python values of nested Arrow columns: a list, a struct, a map, a
tensor. A stored run over such a column failed with pandas' bare
"unhashable type". Here each such value becomes a canonical text, with
each part tagged with its kind and, for text and bytes, its length. Equal
values give equal texts, and a string never reads as the bytes or the date
it spells.
"""

from __future__ import annotations

from typing import Any


def hashable_series(column: Any) -> Any:
    """A column as a pandas Series that pandas can hash: an extension type by
    its storage, a dictionary of nested values decoded, and a nested column
    (lists, structs, maps, which pandas hashes none of) as the canonical
    text of each value. A union is refused: which of its types a value
    came from is not in its Python value."""
    import pandas as pd
    import pyarrow as pa

    kind = column.type
    if isinstance(kind, pa.BaseExtensionType) and _is_nested(kind.storage_type):
        kind = kind.storage_type  # a tensor: by the lists it stores
        column = pa.chunked_array([chunk.storage for chunk in column.chunks], kind)
    if pa.types.is_dictionary(kind) and _is_nested(kind.value_type):
        kind = kind.value_type
        column = pa.chunked_array([chunk.dictionary.take(chunk.indices)
                                   for chunk in column.chunks], kind)
    if _has_union(kind):
        raise TypeError("a union type: which of its types each value is of cannot be hashed")
    if _is_nested(kind):
        return pd.Series([None if value is None else _canonical_text(value)
                          for value in column.to_pylist()], dtype=object)
    return column.to_pandas()


def _is_nested(kind: Any) -> bool:
    import pyarrow as pa

    return (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind) or pa.types.is_struct(kind)
            or pa.types.is_map(kind)
            or getattr(pa.types, "is_list_view", lambda _: False)(kind)
            or getattr(pa.types, "is_large_list_view", lambda _: False)(kind))


def _has_union(kind: Any) -> bool:
    import pyarrow as pa

    if pa.types.is_union(kind):
        return True
    if pa.types.is_dictionary(kind):
        return _has_union(kind.value_type)
    if isinstance(kind, pa.BaseExtensionType):
        return _has_union(kind.storage_type)
    return any(_has_union(kind.field(i).type) for i in range(kind.num_fields))


def _canonical_text(value: Any) -> str:
    """A nested value (Python's form of an Arrow list, struct or map) as
    text that equal values share and different ones do not: each part
    tagged with its kind and, for text and bytes, its length (so a string
    never reads as bytes or a date, nor two strings as one). Zeros and NaNs
    as one text each, as pandas hashes them at the top level."""
    kind = type(value)
    if value is None:
        return "n"
    if kind is bool:
        return "T" if value else "F"
    if kind is int:
        return f"i{value};"
    if kind is float:
        return "f0.0;" if value == 0 else "fnan;" if value != value else f"f{value!r};"
    if kind is str:
        return f"s{len(value)}:{value}"
    if kind is bytes:
        return f"b{len(value)}:{value.hex()}"
    if kind is list or kind is tuple:
        return "[" + "".join(map(_canonical_text, value)) + "]"
    if kind is dict:  # a struct: its fields in the schema's order
        return "{" + "".join(_canonical_text(key) + _canonical_text(item)
                             for key, item in value.items()) + "}"
    text = repr(value)  # dates, times, decimals, timedeltas: their repr names their type
    return f"o{kind.__module__}.{kind.__qualname__}{len(text)}:{text}"
