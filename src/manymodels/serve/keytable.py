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

import itertools
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.keys import TypedKeys, _typings, encode_key, typed_otherwise

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
        order = pc.sort_indices(keys)  # stable: equal keys stay in their given order
        keys, artifacts = keys.take(order), artifacts.take(order)
        if len(keys) > 1:  # of equal keys, the last
            last = pc.not_equal(keys.slice(0, len(keys) - 1), keys.slice(1))
            keep = pa.concat_arrays([last, pa.array([True])])
            if not pc.all(keep).as_py():
                keys, artifacts = keys.filter(keep), artifacts.filter(keep)
        self._keys = pa.array(keys, pa.large_string())  # one buffer, 64-bit offsets
        self._artifacts = artifacts
        offsets = np.frombuffer(self._keys.buffers()[1], dtype=np.int64,
                                count=len(self._keys) + 1, offset=self._keys.offset * 8)
        # a memoryview's items are Python ints: a tenth of a NumPy scalar's cost to index with
        self._starts = memoryview(np.ascontiguousarray(offsets)).cast("B").cast("q")
        data = self._keys.buffers()[2]
        self._data = bytes(data) if data is not None else b""
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
        return default if position is None else self._artifacts[position].as_py()

    def __getitem__(self, text: str) -> str:
        position = self._position(text)
        if position is None:
            raise KeyError(text)
        return self._artifacts[position].as_py()

    def __iter__(self) -> Iterator[str]:
        for chunk in range(0, len(self._keys), 65536):
            yield from self._keys.slice(chunk, 65536).to_pylist()

    def __len__(self) -> int:
        return len(self._keys)

    @property
    def nbytes(self) -> int:
        """The bytes its columns hold."""
        return self._keys.nbytes + self._artifacts.nbytes + len(self._data)

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
        if readings <= READINGS_TRIED:
            for variant in itertools.islice(typed_otherwise(parts), READINGS_TRIED):
                found = self.get(encode_key(variant))
                if found is not None:
                    return found
            return None
        with self._lock:  # keys of many integer columns: indexed once, as TypedKeys does
            if self._typed is None:
                self._typed = TypedKeys(dict(zip(self, self._artifacts.to_pylist())))
        return self._typed.find(parts)


def _strings(values: Any) -> pa.Array:
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if not isinstance(values, pa.Array):
        values = pa.array(list(values), pa.string())
    if not pa.types.is_string(values.type):
        values = values.cast(pa.string())
    return values
