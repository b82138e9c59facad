"""One encoding of a task's key, for every place that stores or looks one up.

A key is a tuple of the values of the key columns (the ``by`` columns, an
item's key, grid values). The store keeps it as text, and ``Store.predict``
looks models up by the keys of the rows it is given. Those rows come from
pandas (``Timestamp``, NumPy scalars) while the stored keys came from Arrow
(``datetime``, Python scalars): so every value is first brought to one
canonical form, and the text is JSON with a tag for what JSON lacks::

    ("s1", 7, datetime(2024, 1, 31))  ->  '["s1", 7, {"$datetime": "2024-01-31T00:00:00"}]'

:func:`decode_key` gives back the values (datetimes as ``pandas.Timestamp``).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import itertools
import json
import re
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np


def canonical(value: Any) -> Any:
    """A key value in its canonical, JSON-able form."""
    if isinstance(value, np.generic) and not isinstance(value, (np.datetime64,
                                                                 np.timedelta64)):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None  # NaN: a missing key, as Arrow gives it (None)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if type(value).__name__ in ("NaTType", "NAType") or (
            isinstance(value, np.datetime64) and np.isnat(value)):
        return None  # pandas' and NumPy's missing values
    if isinstance(value, (_dt.datetime, np.datetime64)):
        import pandas as pd

        return {"$datetime": pd.Timestamp(value).isoformat()}
    if isinstance(value, _dt.date):
        return {"$date": value.isoformat()}
    if isinstance(value, (_dt.timedelta, np.timedelta64)):
        import pandas as pd

        return {"$timedelta": int(pd.Timedelta(value).value)}
    if isinstance(value, _dt.time):
        return {"$time": value.isoformat()}
    if isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if isinstance(value, bytes):
        return {"$bytes": value.hex()}
    if isinstance(value, tuple):
        return {"$tuple": [canonical(v) for v in value]}
    return {"$str": str(value)}  # a path, an enum: kept readable, matched by its text


def as_run_keys(rows: list[tuple]) -> list[tuple]:
    """Key rows with each time and duration as the store and ``run.models``
    give it back (``decode_key``): a ``pandas.Timestamp`` or ``Timedelta``.
    Arrow gives a datetime where the value has no nanoseconds and a
    ``Timestamp`` where it has, so that ``fit``'s ``key=`` changed type from
    one group to the next, and was not the key the run kept its model under."""
    import pandas as pd

    kinds = set(map(type, (value for parts in rows for value in parts)))
    if not any(issubclass(kind, (_dt.datetime, _dt.timedelta, np.datetime64, np.timedelta64))
               and kind not in (pd.Timestamp, pd.Timedelta) for kind in kinds):
        return rows
    return [tuple(map(_as_run_key, parts)) for parts in rows]


def _as_run_key(value: Any) -> Any:
    import pandas as pd

    if isinstance(value, (_dt.datetime, np.datetime64)) and not (
            isinstance(value, np.datetime64) and np.isnat(value)):
        return pd.Timestamp(value)
    if isinstance(value, (_dt.timedelta, np.timedelta64)) and not (
            isinstance(value, np.timedelta64) and np.isnat(value)):
        return pd.Timedelta(value)
    return value


def _restore(value: Any) -> Any:
    if not isinstance(value, dict):
        return value
    (tag, text), = value.items()
    if tag == "$datetime":
        import pandas as pd

        return pd.Timestamp(text)
    if tag == "$date":
        return _dt.date.fromisoformat(text)
    if tag == "$timedelta":
        import pandas as pd

        return pd.Timedelta(text)
    if tag == "$time":
        return _dt.time.fromisoformat(text)
    if tag == "$decimal":
        return decimal.Decimal(text)
    if tag == "$bytes":
        return bytes.fromhex(text)
    if tag == "$tuple":
        return tuple(_restore(v) for v in text)
    return text


def key_parts(key: Hashable) -> tuple:
    """A key as the tuple of its parts (a one-column key may be given bare)."""
    return key if isinstance(key, tuple) else (key,)


def encode_key(parts: tuple) -> str:
    """The stored text of a key's parts: equal values give equal text,
    whichever library they came from."""
    if len(parts) == 1:  # the common key, a million times: the same text, faster
        value = parts[0]
        if type(value) is int:
            return f"[{value}]"
        if type(value) is str:
            return f"[{json.dumps(value)}]"
    return json.dumps([canonical(v) for v in parts])


def encode_keys(key_rows: Sequence[tuple], key_table: Any = None) -> Any:
    """:func:`encode_key` of every row, as an Arrow string array: at once in
    Arrow for the common keys (one int column, or one column of plain ASCII
    strings: the same text), else one row at a time. ``key_table``: the same
    keys as Arrow columns, when the plan has them (no Python list to scan)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if key_table is not None and key_table.num_columns == 1 and len(key_table) == len(
            key_rows):
        column = key_table.column(0)
        if pa.types.is_integer(column.type) and not column.null_count:
            return _wrapped(pc.cast(column, pa.string()), "[", "]").combine_chunks()
    if key_rows and all(len(parts) == 1 for parts in key_rows):
        values = [parts[0] for parts in key_rows]
        kinds = set(map(type, values))
        try:
            if kinds == {int}:
                return _wrapped(pc.cast(pa.array(values, pa.int64()), pa.string()), "[", "]")
            if kinds == {str}:
                text = pa.array(values, pa.string())
                # printable ASCII but for '"' and '\\': JSON writes it as it is
                if pc.all(pc.match_substring_regex(text, r"^[ !#-\[\]-~]*$")).as_py():
                    return _wrapped(text, '["', '"]')
        except OverflowError:  # an int beyond 64 bits
            pass
    return pa.array([encode_key(parts) for parts in key_rows], pa.string())


def _wrapped(texts: Any, prefix: str, suffix: str) -> Any:
    """``prefix + text + suffix`` of each text of an Arrow string array: two
    empty slices replaced, a third of the CPU of Arrow's
    ``binary_join_element_wise`` with the same (a million keys: 17 ms
    against 48 ms)."""
    import pyarrow.compute as pc

    past_the_end = 2**31 - 1  # a slice that starts past a text's end is its end
    return pc.binary_replace_slice(pc.binary_replace_slice(texts, 0, 0, prefix),
                                   past_the_end, past_the_end, suffix)


def decode_keys(texts: Any, width: int) -> list[list]:
    """:func:`decode_key` of every text of an Arrow string array, as ``width``
    columns of values: at once in Arrow for what :func:`encode_keys` makes at
    once (one int, one plain ASCII string), else one at a time."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from .tables import one_array

    texts = one_array(texts)
    if width == 1 and len(texts) and texts.null_count == 0:
        if pc.all(pc.match_substring_regex(texts, r"^\[-?[0-9]{1,18}\]$")).as_py():
            inner = pc.utf8_slice_codeunits(texts, 1, -1)
            return [pc.cast(inner, pa.int64()).to_pylist()]
        if pc.all(pc.match_substring_regex(texts, r'^\["[ !#-\[\]-~]*"\]$')).as_py():
            return [pc.utf8_slice_codeunits(texts, 2, -2).to_pylist()]
    rows = [decode_key(text) for text in texts.to_pylist()]
    return [[row[i] for row in rows] for i in range(width)]


def key_column(values: list) -> Any:
    """A key column's values as pandas should hold them: integers with a
    missing one as nullable ``Int64`` (pandas made them floats, and two keys
    past 2**53 read the same), None beside NaN as objects (pandas made both
    NaN), anything else as it is."""
    import pandas as pd

    kinds = set(map(type, values))
    if int in kinds and kinds <= {int, type(None)} and type(None) in kinds:
        try:
            return pd.array(values, dtype="Int64")
        except (OverflowError, TypeError, ValueError):  # past 64 bits: as objects
            return pd.Series(values, dtype=object)
    if type(None) in kinds and float in kinds and any(
            value != value for value in values if type(value) is float):
        return pd.Series(values, dtype=object)  # None and NaN told apart (two keys)
    return values


def key_frame(names: Sequence[str], rows: Sequence[tuple], table: Any = None) -> Any:
    """The keys as a pandas frame, one row per key, a column per name.

    ``table`` is the keys' first columns as Arrow columns, when a run's tasks are the
    groups of a table: the columns then keep the table's own types (an
    ``int32`` key stays ``int32``, a categorical one categorical, a
    ``datetime64[s]`` one in seconds: the table's pandas metadata, where it
    has any, gives back pandas' own dtypes), as the rows ``fit`` was given
    had them. The other columns (a grid's settings; all of them for items'
    keys or a bare grid) are made from the Python values of ``rows``, typed
    as :func:`key_column` says."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.compute as pc

    names = list(names)
    if table is None or table.column_names != names[:table.num_columns] or (
            table.num_rows != len(rows)):
        return pd.DataFrame({name: key_column([row[i] for row in rows])
                             for i, name in enumerate(names)})
    frame = table.to_pandas()
    frame.index = pd.RangeIndex(len(frame))  # not the input table's row labels
    for i, name in enumerate(names[table.num_columns:], start=table.num_columns):
        frame[name] = key_column([row[i] for row in rows])  # a grid's settings
    for name, column in zip(names, table.columns):
        if not column.null_count or frame[name].dtype.kind != "f":
            continue
        if pa.types.is_integer(column.type):  # a missing key: pandas' nullable ints
            nullable = pd.api.types.pandas_dtype(
                f"{'U' if pa.types.is_unsigned_integer(column.type) else ''}"
                f"Int{column.type.bit_width}")
            frame[name] = column.to_pandas(types_mapper={column.type: nullable}.get)
        elif pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py():
            frame[name] = key_column(column.to_pylist())  # None and NaN: two keys
    return frame


def decode_key(text: str) -> tuple:
    """The parts of a key stored by :func:`encode_key`."""
    return tuple(_restore(v) for v in json.loads(text))


_WHOLE_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)")


def _typings(value: Any) -> tuple:
    """The readings of one key value that a lookup accepts, in the order it
    prefers them: a whole number as ``1``, ``"1"``, ``1.0`` (and ``True``
    for 0 and 1); ``True`` as ``1`` and ``1.0``; any other value as itself."""
    if isinstance(value, np.generic):
        value = value.item()
    if type(value) is bool:
        return value, int(value), float(value)
    if type(value) is float and value.is_integer() and abs(value) <= 2**53:
        value = int(value)
    if type(value) is int:
        return ((value, str(value)) + ((float(value),) if abs(value) <= 2**53 else ())
                + ((bool(value),) if value in (0, 1) else ()))
    if type(value) is str and len(value) <= 40 and _WHOLE_NUMBER.fullmatch(value):
        whole = int(value)  # (longer text is no key's number: int() refuses past 4,300 digits)
        return (value, whole) + ((float(whole),) if abs(whole) <= 2**53 else ())
    return (value,)


def typed_otherwise(parts: tuple) -> Iterator[tuple]:
    """``parts`` with each whole number as another reader may have typed it:
    ``1``, ``1.0`` or ``"1"`` (a column with a missing value makes integers
    floats; a CSV's column is text when one of its values is), and ``True``
    as ``1`` (pandas holds them equal), each combination but ``parts``
    itself once, in the order a lookup prefers them. Their number grows
    exponentially with the columns: :class:`TypedKeys` finds the first one
    stored without listing them."""
    original = encode_key(parts)
    for variant in itertools.product(*map(_typings, parts)):
        if encode_key(variant) != original:
            yield variant


def _loose(value: Any) -> Any:
    """One canonical (JSON) key value with every typing of a whole number
    made the int itself (``1``, ``1.0``, ``"1"``, ``True`` -> ``1``): every
    reading :func:`_typings` accepts of a value has its loose form."""
    if type(value) is bool:
        return int(value)
    if type(value) is float and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if type(value) is str and _WHOLE_NUMBER.fullmatch(value):
        return int(value)
    instant = _utc_instant(value)
    return value if instant is None else instant


def _utc_instant(value: Any) -> Any:
    """A canonical zone-aware datetime as the same instant in UTC (the same
    instant in any zone is one key, as pandas holds them equal); None for
    any other value."""
    if type(value) is not dict or len(value) != 1:
        return None
    text = value.get("$datetime")
    if not isinstance(text, str) or not UTC_OFFSET.search(text):
        return None
    import pandas as pd

    return {"$datetime": pd.Timestamp(text).tz_convert("UTC").isoformat()}


#: The UTC offset that ends the ISO text of a zone-aware datetime.
UTC_OFFSET = re.compile(r"(?:[+-]\d\d:\d\d|Z)$")


def instant_text(parts: list) -> str | None:
    """An encoded key's values (canonical, as ``json.loads`` of it gives them)
    with each zone-aware datetime as its UTC instant, as text; None where no
    value is one (such a key is found as it is)."""
    instants = [_utc_instant(value) for value in parts]
    if all(instant is None for instant in instants):
        return None
    return json.dumps([value if instant is None else instant
                       for value, instant in zip(parts, instants)])


def _loose_text(canonical_parts: list) -> str:
    return json.dumps([_loose(v) for v in canonical_parts])


class TypedKeys(Mapping):
    """A read-only mapping of encoded key -> value that also finds a key typed
    otherwise (:meth:`find`), in time linear in the key's columns.

    Trying each of :func:`typed_otherwise`'s readings costs 3 to 4 lookups
    per integer column, multiplied across columns (9 columns: 4**9 for each
    key without a model). Here each stored key is filed once under its loose
    form (:func:`_loose`), which every reading of it shares: a key is looked
    up once, and the few stored keys found there are checked column by column
    against its readings, the earliest in :func:`typed_otherwise`'s order
    kept (the same answer as trying them in turn)."""

    def __init__(self, by_text: Mapping[str, Any]) -> None:
        self._by_text = dict(by_text)
        self._loose_index: dict[str, list[tuple[str, list]]] | None = None

    def __getitem__(self, text: str) -> Any:
        return self._by_text[text]

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_text)

    def __len__(self) -> int:
        return len(self._by_text)

    def find(self, parts: tuple) -> Any:
        """The value of ``parts``' encoded key, or else of the first of
        :func:`typed_otherwise`'s readings of it that is stored; None if none."""
        found = self._by_text.get(encode_key(parts))
        if found is not None:
            return found
        if self._loose_index is None:  # built at the first key not found as it is
            self._loose_index = {}
            for text in self._by_text:
                try:
                    stored = json.loads(text)
                except ValueError:  # not an encoded key: found only as it is
                    continue
                if isinstance(stored, list):
                    self._loose_index.setdefault(_loose_text(stored), []).append(
                        (text, stored))
        canonical_parts = [canonical(v) for v in parts]
        candidates = self._loose_index.get(_loose_text(canonical_parts))
        if not candidates:
            return None
        readings = [[json.dumps(canonical(t)) for t in _typings(v)] for v in parts]
        instants = [_utc_instant(v) for v in canonical_parts]
        best, best_rank = None, None
        for text, stored in candidates:
            if len(stored) != len(readings):
                continue
            rank = []
            for value, accepted, instant in zip(stored, readings, instants):
                encoded = json.dumps(value)
                if encoded in accepted:
                    rank.append(accepted.index(encoded))
                elif instant is not None and _utc_instant(value) == instant:
                    rank.append(len(accepted))  # the same instant, in another zone
                else:
                    break
            else:
                value = self._by_text[text]
                if value is not None and (best_rank is None or rank < best_rank):
                    best, best_rank = value, rank
        return best


#: Encoded keys whose loose form may differ from their text: a float, a
#: boolean, a whole number as text, a zone-aware datetime (and some others,
#: which cost a parse for nothing).
_MAYBE_LOOSE = re.compile(r'\.0|true|false|"-?[0-9]+"|\$datetime')


def _loose_key(text: str) -> str:
    """An encoded key's loose form (:func:`_loose`), as text; the text
    itself where it is no encoded key."""
    try:
        parts = json.loads(text)
    except ValueError:
        return text
    return _loose_text(parts) if isinstance(parts, list) else text


def latest_per_group(layers: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Merge ``layers`` (encoded key -> value, the earliest first, as runs
    follow each other): each group's value from the latest layer that holds
    it, a group typed otherwise there included (a key ``1`` of an earlier
    run and ``"1"`` of a later one, the same instant in two zones: one
    group, the later run's). Keys that are in each later layer as they are
    (a re-run's) cost no parse."""
    merged: dict[str, Any] = {}
    for layer in layers:
        stale = [text for text in merged if text not in layer] if layer else []
        if stale:
            loose_later = {_loose_key(text) for text in layer if _MAYBE_LOOSE.search(text)}
            for text in stale:
                loose = _loose_key(text)
                if loose in layer or loose in loose_later:
                    del merged[text]
        merged.update(layer)
    return merged


def find_typed(by_text: Mapping[str, Any], parts: tuple) -> Any:
    """What ``by_text`` (encoded key -> value) holds for ``parts``, or else
    for the first of :func:`typed_otherwise`'s readings of it; None if none.
    Give it a :class:`TypedKeys` to look up many keys (its index is built
    once); any other mapping is indexed for this one call."""
    if isinstance(by_text, TypedKeys):
        return by_text.find(parts)
    found = by_text.get(encode_key(parts))
    return found if found is not None else TypedKeys(by_text).find(parts)


def stored_object_texts(parts: tuple) -> list[str]:
    """Encodings of ``parts`` with its texts as the stored text of an object
    (a dict of settings, an estimator: ``{"$str": ...}``, which the store's
    keys read back as plain text): a key read from a run finds its task."""
    texts = [i for i, part in enumerate(parts) if isinstance(part, str)]
    found = []
    for chosen in itertools.product((False, True), repeat=len(texts)):
        if any(chosen):
            wrapped = dict(zip(texts, chosen))
            found.append(json.dumps([{"$str": part} if wrapped.get(i) else canonical(part)
                                     for i, part in enumerate(parts)]))
    return found
