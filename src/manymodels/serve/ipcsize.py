"""How large an Arrow IPC stream is once decoded, read from its messages'
metadata before any batch is decoded.

A compressed (zstd, lz4) stream's batch is decompressed whole as it is read:
a small body could decode to gigabytes (zstd packs a column of zeros a
thousand to one), so the decoded size must be known before decoding. Each
record batch's metadata (a FlatBuffer, ``Message.fbs`` of the Arrow format)
says its rows and where its buffers lie in its body; a compressed buffer
begins with its decompressed length (an int64, -1 where it was left
uncompressed). pyarrow checks a message's FlatBuffer as it reads it, but
exposes none of these numbers, so they are read here: a few fields of two
tables.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

#: ``MessageHeader``'s members that hold a record batch.
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3


@dataclass
class BatchSize:
    """One batch message's ``rows`` (0 for a dictionary's) and ``decoded``
    bytes (its buffers decompressed; a body's own length uncompressed)."""

    rows: int
    decoded: int


def batch_sizes(messages: Any) -> Iterator[BatchSize]:
    """The size of each batch (record or dictionary) of ``messages`` (a
    ``pyarrow.ipc.MessageReader``), read from its metadata; nothing is
    decoded. Raises ValueError where the metadata is not as the format says."""
    for message in messages:
        if message.type not in ("record batch", "dictionary"):
            continue
        metadata = message.metadata.to_pybytes()
        body = message.body
        try:
            yield _batch_size(metadata, body)
        except (struct.error, IndexError) as exc:
            raise ValueError(f"a {message.type} message's metadata cannot be read") from exc


def _batch_size(metadata: bytes, body: Any) -> BatchSize:
    message = _Table.root(metadata)
    kind = message.scalar(1, "<B", 0)
    batch = message.table(2)
    if batch is None or kind not in (_DICTIONARY_BATCH, _RECORD_BATCH):
        return BatchSize(0, 0)
    if kind == _DICTIONARY_BATCH:
        batch = batch.table(1)  # DictionaryBatch.data
        if batch is None:
            return BatchSize(0, 0)
    rows = batch.scalar(0, "<q", 0) if kind == _RECORD_BATCH else 0
    compressed = batch.table(3) is not None  # RecordBatch.compression
    size = body.size if body is not None else 0
    if not compressed:
        return BatchSize(rows, size)
    data = memoryview(body) if body is not None else b""
    decoded = 0
    for offset, length in batch.structs(2, "<qq"):  # RecordBatch.buffers
        if length <= 0:
            continue
        if length < 8 or offset < 0 or offset + length > size:
            raise ValueError("a compressed buffer lies outside its body")
        given = struct.unpack_from("<q", data, offset)[0]
        decoded += given if given >= 0 else length - 8
    return BatchSize(rows, decoded)


class _Table:
    """A FlatBuffers table: its fields found through its vtable."""

    def __init__(self, data: bytes, position: int) -> None:
        self.data, self.position = data, position
        vtable = position - struct.unpack_from("<i", data, position)[0]
        size = struct.unpack_from("<H", data, vtable)[0]
        self.fields = [struct.unpack_from("<H", data, vtable + 4 + 2 * i)[0]
                       for i in range((size - 4) // 2)]

    @classmethod
    def root(cls, data: bytes) -> _Table:
        return cls(data, struct.unpack_from("<I", data, 0)[0])

    def _field(self, index: int) -> int | None:
        offset = self.fields[index] if index < len(self.fields) else 0
        return self.position + offset if offset else None

    def scalar(self, index: int, kind: str, default: int) -> int:
        where = self._field(index)
        return default if where is None else struct.unpack_from(kind, self.data, where)[0]

    def _target(self, index: int) -> int | None:
        where = self._field(index)
        return None if where is None else where + struct.unpack_from("<I", self.data, where)[0]

    def table(self, index: int) -> _Table | None:
        target = self._target(index)
        return None if target is None else _Table(self.data, target)

    def structs(self, index: int, kind: str) -> list[tuple]:
        target = self._target(index)
        if target is None:
            return []
        count = struct.unpack_from("<I", self.data, target)[0]
        width = struct.calcsize(kind)
        if target + 4 + count * width > len(self.data):
            raise IndexError("a vector past its buffer's end")
        return [struct.unpack_from(kind, self.data, target + 4 + i * width) for i in range(count)]
