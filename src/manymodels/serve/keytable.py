"""The catalog's map of group key -> model: two Arrow string columns, not a
Python dict.

A dict of a million encoded keys to a million locators holds two million
Python strings (about 300 MB, measured); here the keys are one sorted Arrow
column (about 12 bytes a key) and the locators another (about 100 bytes a
model), and a key is found by binary search over the keys' raw bytes
(microseconds). Arrow sorts strings by their UTF-8 bytes, the order
``bytes`` compare in.

A key stored as another reader typed it (``1`` asked, ``"1"`` stored, see
:func:`~manymodels.inputs.keys.typed_otherwise`) is found as
:class:`~manymodels.inputs.keys.TypedKeys` finds it, its readings tried in
the same order; past :data:`READINGS_TRIED` readings (keys of many integer
columns) a ``TypedKeys`` is built once, on the first such miss.
"""

from __future__ import annotations

import binascii
import datetime
import itertools
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.keys import UTC_OFFSET, TypedKeys, _typings, encode_key, typed_otherwise
from ..inputs.tables import string_offsets
from ..store import packs

#: Readings of a missed key looked up one by one before a TypedKeys is built.
READINGS_TRIED = 64


class KeyTable(Mapping):
    """Encoded key -> artifact, read-only, from ``keys`` and ``artifacts``
    (Arrow string arrays of one length, nulls dropped). A key given more than
    once keeps its last artifact: the latest run's, when runs are joined
    earliest first (:meth:`joined`)."""

    def __init__(self, keys: Any, artifacts: Any) -> None:
        keys, artifacts = _strings(keys), _strings(artifacts)
        if len(keys) != len(artifacts):
            raise ValueError(f"{len(keys)} keys for {len(artifacts)} artifacts")
        valid = pc.and_(keys.is_valid(), artifacts.is_valid())
        if not pc.all(valid).as_py():
            keys, artifacts = keys.filter(valid), artifacts.filter(valid)
        order = pc.sort_indices(keys).to_numpy()  # stable: equal keys keep their order
        keys = keys.take(order)
        if len(keys) > 1:  # of equal keys, the last
            keep = np.ones(len(keys), dtype=bool)
            keep[:-1] = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1)).to_numpy(
                zero_copy_only=False)
            if not keep.all():
                keys, order = keys.filter(pa.array(keep)), order[keep]
        keys = keys.cast(pa.large_string())  # one buffer, 64-bit offsets
        self._count = len(keys)
        offsets = np.frombuffer(keys.buffers()[1], dtype=np.int64, count=self._count + 1,
                                offset=keys.offset * 8)
        # a memoryview's items are Python ints: a tenth of a NumPy scalar's cost to index with
        self._starts = memoryview(offsets.copy()).cast("B").cast("q")
        data = keys.buffers()[2]
        self._data = bytes(data) if data is not None else b""
        self._artifacts = _Artifacts(artifacts, order)
        self._typed: TypedKeys | None = None
        self._lock = threading.Lock()

    @classmethod
    def joined(cls, parts: list[tuple[Any, Any]]) -> KeyTable:
        """One table of several ``(keys, artifacts)``, a later part's artifact
        replacing an earlier one's for the same key."""
        if not parts:
            return cls(pa.array([], pa.string()), pa.array([], pa.string()))
        return cls(pa.concat_arrays([_strings(k) for k, _ in parts]),
                   pa.concat_arrays([_strings(a) for _, a in parts]))

    def _position(self, text: str) -> int | None:
        wanted, starts, data = text.encode(), self._starts, self._data
        low, high = 0, len(starts) - 1
        while low < high:
            middle = (low + high) // 2
            if data[starts[middle]:starts[middle + 1]] < wanted:
                low = middle + 1
            else:
                high = middle
        if low < len(starts) - 1 and data[starts[low]:starts[low + 1]] == wanted:
            return low
        return None

    def get(self, text: str, default: Any = None) -> Any:
        position = self._position(text)
        return default if position is None else self._artifacts.text(position)

    def __getitem__(self, text: str) -> str:
        position = self._position(text)
        if position is None:
            raise KeyError(text)
        return self._artifacts.text(position)

    def __iter__(self) -> Iterator[str]:
        starts, data = self._starts, self._data
        for position in range(self._count):
            yield data[starts[position]:starts[position + 1]].decode()

    def __len__(self) -> int:
        return self._count

    @property
    def nbytes(self) -> int:
        """The bytes its columns hold."""
        return len(self._data) + self._starts.nbytes + self._artifacts.nbytes

    def kinds(self, width: int) -> tuple[frozenset[str], ...]:
        """What each of the ``width`` key columns holds, as :func:`value_kind`
        names it: read from the keys' text at once in Arrow for one column;
        for several, only their dates are told (a JSON list says its other
        values' types, and decoding a million keys costs seconds), the other
        columns' sets left empty."""
        if width == 1:
            keys = pa.Array.from_buffers(pa.large_string(), self._count, [
                None, pa.py_buffer(self._starts), pa.py_buffer(self._data)])
            told = {kind: pc.match_substring_regex(keys, pattern)
                    for kind, pattern in _KIND_PATTERNS.items()}
            kinds = {kind for kind, found in told.items() if pc.any(found).as_py()}
            if self._count and not pc.all(_any_of(list(told.values()))).as_py():
                kinds.add("other")
            return (frozenset(kinds),)
        if b'"$date' not in self._data:
            return (frozenset(),) * width
        found: list[set[str]] = [set() for _ in range(width)]
        for text in self:
            for column, value in zip(found, json.loads(text)):
                column.add(value_kind(value))
        return tuple(frozenset(column & TEMPORAL) for column in found)

    def find(self, parts: tuple) -> str | None:
        """The artifact of ``parts``' encoded key, or else of the first of
        :func:`~manymodels.inputs.keys.typed_otherwise`'s readings of it that
        is stored (as ``TypedKeys.find``); None if none."""
        found = self.get(encode_key(parts))
        if found is not None or not len(self):
            return found
        readings = 1
        for value in parts:
            readings *= len(_typings(value))
        # a zone-aware datetime stored in another zone is found by its instant (TypedKeys)
        zoned = any(isinstance(value, datetime.datetime) and value.tzinfo is not None
                    for value in parts)
        if readings <= READINGS_TRIED and not zoned:
            for variant in itertools.islice(typed_otherwise(parts), READINGS_TRIED):
                found = self.get(encode_key(variant))
                if found is not None:
                    return found
            return None
        with self._lock:  # keys of many integer columns, or zoned: indexed once, as TypedKeys does
            if self._typed is None:
                self._typed = TypedKeys({text: self._artifacts.text(position)
                                         for position, text in enumerate(self)})
        return self._typed.find(parts)


class _Artifacts:
    """Artifacts as columns: each SHA-256 as 32 bytes and each packed model's
    pack, offset and size as three ints (56 bytes a model, where its locator's
    text is about 100 and a Python string of it 150); the text is made again
    when a key is found. An artifact that would not be made again exactly as
    given is kept as its text."""

    def __init__(self, artifacts: pa.Array, order: np.ndarray) -> None:
        count = len(artifacts)
        self.digests = np.zeros((count, 32), dtype=np.uint8)
        self.places = np.full((count, 3), -1, dtype=np.int64)  # pack, offset, size; -1: bare
        self.other: dict[int, str] = {}  # given position -> text
        if count:
            self._fill(artifacts)
        self.digests, self.places = self.digests[order], self.places[order]
        if self.other:
            self.other = {new: self.other[old] for new, old in enumerate(order.tolist())
                          if old in self.other}

    def _fill(self, artifacts: pa.Array) -> None:
        starts, _ = string_offsets(artifacts)
        lengths = np.diff(starts.astype(np.int64))
        located = packs.locator_mask(artifacts)
        rows = np.flatnonzero(located | (lengths == 64))
        made = np.zeros(len(artifacts), dtype=bool)
        try:
            if rows.size:
                digits = pc.utf8_slice_codeunits(artifacts.take(pa.array(rows)), 0, 64)
                text = np.frombuffer(digits.buffers()[2], dtype=np.uint8)[:64 * rows.size]
                # lower-case hex digits, as hexdigest writes them
                lower = ((text - 48 < 10) | (text - 97 < 6)).reshape(-1, 64).all(axis=1)
                self.digests[rows] = np.frombuffer(binascii.unhexlify(text.data),
                                                   dtype=np.uint8).reshape(-1, 32)
                made[rows] = lower
            where = np.flatnonzero(located)
            if where.size:
                tails = pc.utf8_slice_codeunits(artifacts.take(pa.array(where)), 65)
                parts = pc.split_pattern(tails, "/")
                three = pc.equal(pc.list_value_length(parts), 3).to_numpy(zero_copy_only=False)
                made[where[~three]] = False
                where = where[three]
                numbers = pc.list_flatten(parts.filter(pa.array(three)))
                places = np.asarray(pc.cast(numbers, pa.int64())).reshape(-1, 3)
                self.places[where] = places
                # made again as written: no sign, no leading zero (then its length differs)
                widths = np.where(places > 0, np.floor(np.log10(np.maximum(places, 1))) + 1,
                                  np.where(places == 0, 1, -99)).sum(axis=1)
                made[where] &= lengths[where] == 64 + 3 + widths
        except (ValueError, binascii.Error, pa.ArrowInvalid):  # not as packs write them
            made[:] = False
        for position in np.flatnonzero(~made).tolist():
            self.other[position] = artifacts[position].as_py()
            self.places[position] = -1

    @property
    def nbytes(self) -> int:
        return self.digests.nbytes + self.places.nbytes + 150 * len(self.other)

    def text(self, position: int) -> str:
        given = self.other.get(position) if self.other else None
        if given is not None:
            return given
        pack, offset, size = self.places[position].tolist()
        digest = self.digests[position].tobytes().hex()
        return digest if pack < 0 else f"{digest}@{pack}/{offset}/{size}"


#: The kinds of key value a lookup tells apart when it reads a key's text.
TEMPORAL = frozenset({"datetime", "zoned", "date"})

#: Each kind of one-column key, by the text :func:`encode_key` gives it (an
#: infinite float's is ``[Infinity]``, a number's).
_KIND_PATTERNS = {"text": r'^\["', "number": r"^\[-?([0-9]|Infinity\])",
                  "bool": r"^\[(true|false)\]$",
                  "null": r"^\[null\]$", "date": r'^\[\{"\$date": ',
                  "datetime": r'^\[\{"\$datetime": "[0-9-]+T[0-9:.]+"\}\]$',
                  "zoned": r'^\[\{"\$datetime": "[^"]*(Z|[+-][0-9][0-9]:[0-9][0-9])"\}\]$'}


def value_kind(value: Any) -> str:
    """The kind of one canonical (JSON) key value: ``text``, ``number``,
    ``bool``, ``null``, ``datetime`` (without a time zone), ``zoned`` (with
    one), ``date``, or ``other``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, dict) and len(value) == 1:
        (tag, text), = value.items()
        if tag == "$date":
            return "date"
        if tag == "$datetime" and isinstance(text, str):
            return "zoned" if UTC_OFFSET.search(text) else "datetime"
    return "other"


def _any_of(masks: list) -> Any:
    found = masks[0]
    for mask in masks[1:]:
        found = pc.or_(found, mask)
    return found


def _strings(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(list(values), pa.string())
    if not pa.types.is_string(values.type):
        values = values.cast(pa.string())
    return values
