"""One digest of all that a run's task identities are made from: what lets
an unchanged re-run skip making them.

Making the identities of a million groups hashes every row of the table and
combines them per group (a fifth of a second on two cores), and the store's
reuse search then compares them, task by task, with the earlier run's (as
long again). When a run's whole input hashes to the digest an earlier run
recorded, its identities are that run's, task by task: the search may name
that run without making or comparing a single one
(:meth:`manymodels.store.reuse.ReuseSearch.find`).

The digest covers, with xxHash's 128-bit XXH3 (a tenth of the row hashes'
time): the bytes of every column of the table as Arrow lays them out, its
schema as the identities read it, where each group's rows are, each task's
hash of its code, parameters and shared objects (the identities' other
half), the key columns' names, a grid's values as the stored keys write
them (an object's text may differ where its hash does not), the versions of the libraries the row
hashes come from, and :data:`VERSION`. Equal digests then mean equal
identities and equal keys, task by task. A digest is made only where equal bytes surely mean equal
values: columns of numbers, booleans, times and text, a chunk whose null
bits start on a byte, a column of nulls alone. Anything else (a dictionary, a list, a pandas
extension type) gives no digest: the run makes its identities as it always
does. Equal inputs laid out otherwise (chunked apart, different bytes under
a null) digest apart: such a re-run takes the long way, never a wrong one.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Part of every digest: raised whenever the identities or the stored keys
#: of equal inputs change (how rows are hashed or combined, :mod:`.rowhash`;
#: how keys are encoded, :mod:`manymodels.inputs.keys`), so that a digest an
#: earlier version recorded no longer vouches for what this version would
#: make otherwise.
VERSION = b"manymodels input digest 1"


def new_digest() -> Any:
    """A digest under way, with :data:`VERSION` and the versions of the
    libraries the row hashes come from (pandas hashes text and NaN its
    own way, and its way changes between versions) in it."""
    import pandas as pd
    import pyarrow as pa
    import xxhash

    digest = xxhash.xxh3_128()
    digest.update(VERSION)
    digest.update(f"|pandas {pd.__version__}|pyarrow {pa.__version__}|numpy "
                  f"{np.__version__}|".encode())
    return digest


def add_array(digest: Any, values: np.ndarray) -> None:
    """``values`` (a NumPy array), its type and shape included."""
    values = np.ascontiguousarray(values)
    digest.update(f"{values.dtype.str}{values.shape}".encode())
    digest.update(values.view(np.uint8).reshape(-1) if values.size else b"")


def add_table(digest: Any, table: Any) -> bool:
    """Every column of the Arrow ``table``, its name and type included;
    False (the digest then unusable) where a column's bytes cannot vouch
    for its values (see the module)."""
    for name, column in zip(table.column_names, table.columns):
        digest.update(f"|column {name!r} of {column.num_chunks} chunks|".encode())
        for chunk in column.chunks:
            try:
                if not _add_chunk(digest, chunk):
                    return False
            except (TypeError, ValueError, IndexError):  # a layout not foreseen: no digest,
                return False  # and the identities made as always
    return True


def _fixed_width(kind: Any) -> bool:
    import pyarrow as pa

    types = pa.types
    return (types.is_integer(kind) or types.is_floating(kind) or types.is_timestamp(kind)
            or types.is_date(kind) or types.is_time(kind) or types.is_duration(kind)
            or types.is_decimal(kind) or types.is_fixed_size_binary(kind))


def _bits(digest: Any, buffer: Any, offset: int, count: int) -> bool:
    """The ``count`` bits from bit ``offset`` of ``buffer``, the last byte's
    bits past them (not the array's) left out; False off a byte's start."""
    if offset % 8:
        return False
    whole, rest = divmod(count, 8)
    bits = np.frombuffer(buffer, dtype=np.uint8, count=whole + bool(rest), offset=offset // 8)
    digest.update(bits[:whole])
    if rest:
        digest.update(bytes([int(bits[whole]) & ((1 << rest) - 1)]))
    return True


def _add_chunk(digest: Any, chunk: Any) -> bool:
    import pyarrow as pa

    kind, count, offset = chunk.type, len(chunk), chunk.offset
    digest.update(f"{kind}|{count}|{chunk.null_count}|".encode())
    if count == 0 or pa.types.is_null(kind):  # (a column of no values, all missing)
        return True
    buffers = chunk.buffers()
    if chunk.null_count and (buffers[0] is None or not _bits(digest, buffers[0], offset,
                                                             count)):
        return False  # (nulls without a validity bitmap: a union's, say)
    if len(buffers) < 2 or buffers[1] is None:  # no values: all missing (bits hashed)
        return chunk.null_count == count and len(buffers) <= 2
    if pa.types.is_boolean(kind):
        return _bits(digest, buffers[1], offset, count)
    if _fixed_width(kind) and not isinstance(kind, pa.ExtensionType):
        width = kind.bit_width // 8
        digest.update(memoryview(buffers[1])[offset * width:(offset + count) * width])
        return True
    if pa.types.is_string(kind) or pa.types.is_binary(kind) or \
            pa.types.is_large_string(kind) or pa.types.is_large_binary(kind):
        wide = pa.types.is_large_string(kind) or pa.types.is_large_binary(kind)
        ends = np.frombuffer(buffers[1], dtype=np.int64 if wide else np.int32,
                             count=count + 1, offset=offset * (8 if wide else 4))
        first, last = int(ends[0]), int(ends[-1])
        add_array(digest, ends - ends[0])  # each value's place, wherever the slice starts
        if last > first:
            digest.update(memoryview(buffers[2])[first:last])
        return True
    return False
