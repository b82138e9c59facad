"""Row hashes and the 128-bit lanes a task's data hash and identity are made of.

A table's rows are hashed once for the whole table (:func:`arrow_row_hashes`),
each group's rows then combined by position (:func:`group_lanes`), and a
task's data lanes mixed with the hash of its code and parameters
(:func:`combine_lanes`): a million groups without a Python call each. What the
identity covers, and why, is :mod:`.hashing`'s.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .nestedvalues import hashable_series

#: Rows worked through at a time: small enough for the CPU's cache.
_BLOCK = 1 << 16

# A task's data hash and identity are 128 bits, held as two uint64 lanes, so
# that a million of them are mixed by NumPy in one pass instead of a million
# blake2b calls in the driver. The mixing is splitmix64's finalizer: not a
# cryptographic hash (a store is not defended against someone forging a
# table), but every bit of each input word reaches every bit of the output.

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_HEX = np.array([f"{i:02x}" for i in range(256)], dtype="<U2")


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer, element-wise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def mix64_inplace(x: np.ndarray, scratch: np.ndarray) -> None:
    """:func:`mix64` in place on uint64 ``x``, with ``scratch`` (its shape) the
    only temporary: for chunks of a large column, hashed without allocating."""
    for multiplier, shift in ((_M1, 30), (_M2, 27)):
        np.right_shift(x, np.uint64(shift), out=scratch)
        np.bitwise_xor(x, scratch, out=x)
        np.multiply(x, multiplier, out=x)
    np.right_shift(x, np.uint64(31), out=scratch)
    np.bitwise_xor(x, scratch, out=x)


def lanes_of(text: str) -> tuple[int, int]:
    """The two lanes of a 32-hex-digit hash (a :func:`~.hashing.digest`)."""
    return int(text[:16], 16), int(text[16:32], 16)


def lanes_bytes(lanes: np.ndarray) -> np.ndarray:
    """The 16 bytes each row of an ``(n, 2)`` uint64 array stands for (each
    lane big-endian: what its 32 hex digits spell), an ``(n, 16)`` uint8 array."""
    return np.ascontiguousarray(lanes.astype(">u8")).view(np.uint8).reshape(len(lanes), 16)


def lanes_hex(lanes: np.ndarray) -> list[str]:
    """32 hex digits per row of an ``(n, 2)`` uint64 array, without a Python
    call per row."""
    return np.ascontiguousarray(_HEX[lanes_bytes(lanes)]).view("<U32").ravel().tolist()


def lanes_hex_array(lanes: np.ndarray) -> Any:
    """:func:`lanes_hex` as an Arrow string array built straight from the hex
    digits' bytes: a million identities without a Python string each (a
    quarter of a re-run's driver memory, and its time to make them)."""
    return hex_array(lanes_bytes(lanes))


def hex_array(raw: np.ndarray) -> Any:
    """Each row of a ``(n, width)`` uint8 array as ``2 * width`` hex digits, an
    Arrow string array made at once (a SHA-256's ``hexdigest`` per row, for
    ``width`` 32): the digits by :func:`binascii.hexlify`, the offsets by NumPy."""
    import binascii

    import pyarrow as pa

    count, width = raw.shape
    digits = binascii.hexlify(np.ascontiguousarray(raw).data)
    if len(digits) < 1 << 31:
        offsets = np.arange(0, 2 * width * count + 1, 2 * width, dtype=np.int32)
        return pa.Array.from_buffers(pa.string(), count,
                                     [None, pa.py_buffer(offsets), pa.py_buffer(digits)])
    offsets = np.arange(0, 2 * width * count + 1, 2 * width, dtype=np.int64)
    return pa.Array.from_buffers(pa.large_string(), count,
                                 [None, pa.py_buffer(offsets), pa.py_buffer(digits)])


def schema_text(schema: Any) -> str:
    """An Arrow schema as a group's data hash takes it: as it prints, but a
    pandas writer's note of a range index without its bounds (its stop is
    the table's row count: a group whose rows did not change read as changed
    because another group's rows were added). Any other schema prints as it
    did, so the identities of the groups of such tables stay what they were."""
    metadata = schema.metadata or {}
    noted = metadata.get(b"pandas")
    dtypes = pandas_types_note(schema)
    if noted and b'"range"' in noted:
        import json

        try:
            info = json.loads(noted)
            info["index_columns"] = [
                {"kind": "range"} if isinstance(column, dict) and column.get("kind") == "range"
                else column for column in info.get("index_columns", [])]
        except (ValueError, AttributeError, TypeError):  # not pandas' own note: as it is
            return str(schema) + dtypes
        schema = schema.with_metadata({**metadata, b"pandas": json.dumps(info).encode()})
    return str(schema) + dtypes


def pandas_types_note(schema: Any) -> str:
    """:func:`_pandas_dtypes_note` of ``schema``: the pandas types its note
    gives ``fit`` beside Arrow's own (``Int64`` for ``int64``), ``""`` where
    it has no note or none differs."""
    if not (schema.metadata or {}).get(b"pandas"):
        return ""
    return _pandas_dtypes_note(schema.serialize().to_pybytes())


def categories_note(table: Any, schema: Any = None, keys: Any = ()) -> str:
    """The categories of each column of ``table`` that was a pandas
    categorical (pandas' note in ``schema``, else in the table's own), in
    their order: ``fit`` gets a group's rows with all of them (its
    ``cat.categories``, ``cat.codes``, a one-hot encoding's width), while the
    rows hash by their values alone, so that reordered categories, or one
    added that the group does not hold, reused models fitted on the others.
    ``""`` where no column is one (such a table hashes as it did). An Arrow
    dictionary of another origin (a Parquet file's encoding) is left out:
    its dictionary follows the values, and a changed value would retrain
    every group. The ``keys`` columns (``by``'s) are left out: a group's key
    is one value, and a new group's category added to them retrained every
    other group (an incremental run's new stores, say)."""
    import pyarrow as pa

    categorical = _pandas_categoricals((schema or table.schema).metadata or {}) - set(keys)
    noted = []
    for name, column in zip(table.column_names, table.columns):
        if name not in categorical or not pa.types.is_dictionary(column.type):
            continue
        distinct: list[Any] = []
        for chunk in column.chunks:  # chunks mostly share one dictionary: listed once
            if not distinct or not chunk.dictionary.equals(distinct[-1]):
                distinct.append(chunk.dictionary)
        values = dict.fromkeys(value for dictionary in distinct
                               for value in dictionary.to_pylist())
        noted.append(f"categories of {name!r}: {list(values)!r}")
    return "\n-- categories --\n" + "\n".join(noted) if noted else ""


def _pandas_categoricals(metadata: dict) -> set[str]:
    """The columns pandas' note (``metadata``) says were categoricals."""
    import json

    noted = metadata.get(b"pandas")
    if not noted or b"categorical" not in noted:
        return set()
    try:
        columns = json.loads(noted).get("columns", [])
        return {str(column.get("name")) for column in columns
                if isinstance(column, dict) and column.get("pandas_type") == "categorical"}
    except (ValueError, AttributeError, TypeError):  # not pandas' own note
        return set()


@functools.lru_cache(maxsize=64)  # (by its bytes: equal schemas compare without metadata)
def _pandas_dtypes_note(serialized: bytes) -> str:
    """The pandas types ``fit`` gets for the columns where pandas' note in
    ``schema`` gives another than Arrow's type alone would (``Int64``,
    ``Float64``, ``string``, ``boolean``): ``""`` where there is none. A
    schema prints the note cut short, its length alone counting past its
    first 70 characters: a column made ``Int64`` from ``int64``, the same
    length, reused models that ``fit`` had computed from the other type.
    Kept per schema: each staged partition's is asked for (2 ms each)."""
    import pyarrow as pa

    schema = pa.ipc.read_schema(pa.py_buffer(serialized))
    try:
        noted = schema.empty_table().to_pandas().dtypes
        plain = schema.remove_metadata().empty_table().to_pandas().dtypes
    except Exception:  # a note pandas cannot read: the schema's text alone
        return ""
    if list(noted.index) != list(plain.index):
        return ""
    changed = [f"{name!r}: {kind}" for (name, kind), other in zip(noted.items(), plain)
               if str(kind) != str(other)]
    return f"\n-- pandas types --\n{', '.join(changed)}" if changed else ""


def group_lanes(row_hashes: np.ndarray | RowHashes, offsets: np.ndarray, lengths: np.ndarray,
                salt: tuple[int, int]) -> np.ndarray:
    """The ``(groups, 2)`` lanes of consecutive runs of rows: each row's hash
    mixed with its position in its group (order matters), summed per group,
    then mixed with the group's length and ``salt`` (the schema's lanes).

    Worked through in blocks of whole groups (about :data:`_BLOCK` rows), in
    place: ten million rows made a dozen temporaries of 80 MB each. A large
    table's groups are split into contiguous ranges worked through on
    threads at once (NumPy lets go of the GIL in each step): this runs
    before any worker has started, on cores that are otherwise idle."""
    salt_a, salt_b = (np.uint64(v) for v in salt)
    if isinstance(row_hashes, RowHashes):
        rows_of, total = row_hashes.rows, row_hashes.count
    else:
        rows = row_hashes.astype(np.uint64, copy=False)
        rows_of, total = (lambda start, stop, _=None: rows[start:stop]), len(rows)
    offsets = np.asarray(offsets, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if lengths.size and lengths.min() < 1:
        raise ValueError("every group has at least one row")
    groups = len(offsets)
    a = np.empty(groups, dtype=np.uint64)
    b = np.empty(groups, dtype=np.uint64)
    ends = offsets + lengths
    longest = int(lengths.max()) if groups else 0
    with np.errstate(over="ignore"):
        # a row's position is mixed alike in every group: each position's
        # two words made once, then looked up
        every_position = np.arange(longest, dtype=np.uint64)
        position_a = mix64(every_position + salt_a)
        position_b = mix64(every_position ^ salt_b) + _GOLDEN

    def lanes_of_range(first: int, stop: int) -> None:
        """Fill ``a`` and ``b`` for groups ``first`` to ``stop``."""
        if first >= stop:
            return
        # the block's buffers made once: fresh ones each block were fresh pages
        # each block (a page fault per 4 KiB), more than the arithmetic
        capacity = max(min(_BLOCK, int(ends[stop - 1] - offsets[first])), longest)
        position = np.empty(capacity, dtype=np.int64)
        mixed, scratch = np.empty(capacity, dtype=np.uint64), np.empty(capacity, dtype=np.uint64)
        row_buffers = np.empty((3, capacity), dtype=np.uint64)
        with np.errstate(over="ignore"):
            while first < stop:
                # the groups whose rows end within a block from here (at least one)
                last = min(stop, max(first + 1, int(np.searchsorted(
                    ends, offsets[first] + _BLOCK, side="right"))))
                start = int(offsets[first])
                local = offsets[first:last] - start
                count = int(ends[last - 1]) - start
                # each row's place in its group: ones, a group's start stepping
                # back by the length of the group before it, summed
                at, word, spare = position[:count], mixed[:count], scratch[:count]
                at.fill(1)
                at[0] = 0
                at[local[1:]] = 1 - lengths[first:last - 1]
                np.cumsum(at, out=at)
                block = rows_of(start, start + count, row_buffers)
                np.take(position_a, at, out=word)
                np.bitwise_xor(word, block, out=word)
                mix64_inplace(word, spare)
                a[first:last] = np.add.reduceat(word, local)
                np.take(position_b, at, out=word)
                word += block
                mix64_inplace(word, spare)
                b[first:last] = np.add.reduceat(word, local)
                first = last

    threads = min(_hashing_threads(), total // (4 * _BLOCK))
    if threads > 1 and groups > threads:
        from concurrent.futures import ThreadPoolExecutor

        # ranges of about equal rows, each starting where a group starts
        bounds = np.searchsorted(offsets, np.linspace(0, total, threads + 1)[1:-1])
        bounds = [0, *bounds.tolist(), groups]
        with ThreadPoolExecutor(threads, thread_name_prefix="manymodels-hash") as pool:
            list(pool.map(lanes_of_range, bounds[:-1], bounds[1:]))
    else:
        lanes_of_range(0, groups)
    with np.errstate(over="ignore"):
        size = lengths.astype(np.uint64)
        a = mix64(a ^ mix64(size + salt_a))
        b = mix64(b + mix64(size ^ salt_b) ^ a)
    return np.stack([a, b], axis=1)


def _hashing_threads() -> int:
    """Threads for :func:`group_lanes`: the usable cores (affinity and cgroup
    aware), at most 8 (past that, memory bandwidth, not arithmetic, limits
    these passes)."""
    from ..machine import usable_cores

    return min(usable_cores(), 8)


def combine_lanes(data: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    """Per row, the lanes of (data, prefix): the identity of a task from its
    data hash and the hash of its code, parameters and shared objects."""
    with np.errstate(over="ignore"):
        a = mix64(data[:, 0] + mix64(prefix[:, 0] ^ data[:, 1]))
        b = mix64(data[:, 1] ^ mix64(prefix[:, 1] + a))
    return np.stack([a, b], axis=1)


def arrow_row_hashes(table: Any) -> np.ndarray:
    """``pd.util.hash_pandas_object(table.to_pandas(), index=False)`` of an
    Arrow table: the same uint64 per row, so that the identities of stores
    written before stay the same, but for the rows pandas hashes by their
    neighbours too (see :class:`RowHashes`)."""
    hashes = RowHashes(table)
    combined = np.empty(hashes.count, dtype=np.uint64)
    for start in range(0, hashes.count, _BLOCK):
        stop = min(start + _BLOCK, hashes.count)
        combined[start:stop] = hashes.rows(start, stop)
    return combined


class RowHashes:
    """An Arrow table's row hashes as pandas makes them
    (``pd.util.hash_pandas_object(table.to_pandas(), index=False)``), made a
    range of rows at a time (:meth:`rows`) into one buffer used again:
    :func:`group_lanes` takes each block's as it goes, so that ten million
    rows' hashes are never held at once (80 MB of fresh pages, a fifth of an
    unchanged re-run's page faults).

    Columns of numbers or booleans are hashed here as pandas hashes them
    (each value's bits as uint64, then splitmix64's finalizer), all columns
    of a block of rows at once and in place: a fifth of pandas' time for ten
    million rows of four columns, without its temporaries. Any other column
    (text, dates) is converted and hashed by pandas, whole, on a thread of
    its own. The columns are combined as pandas combines them.

    Where pandas would not hash a row by its own value alone, a row is
    hashed as it would be without the others: a missing value in an
    integer or boolean column is hashed as pandas hashes a float NaN, each
    other value by its own bits. (pandas converts such a column whole, to
    floats or to objects, because of any one missing value: a group's data
    hash, hashed per table or per staged partition, then changed with its
    neighbours' values, and an unchanged group was trained again.)"""

    def __init__(self, table: Any) -> None:
        from concurrent.futures import ThreadPoolExecutor

        import pandas as pd
        import pyarrow as pa

        columns = table.num_columns
        self.count = table.num_rows
        own = [_plain_numbers(table.column(position)) for position in range(columns)]
        self._own = [None if found is None else found[0] for found in own]
        self._missing = [None if found is None else found[1] for found in own]
        by_pandas = [position for position in range(columns) if self._own[position] is None]

        def pandas_hashes(position: int) -> np.ndarray:
            try:
                series = hashable_series(table.column(position))
                return pd.util.hash_pandas_object(series, index=False).to_numpy()
            except (TypeError, ValueError, pa.ArrowException) as exc:
                raise TypeError(
                    f"column {table.column_names[position]!r} holds values that cannot be "
                    f"hashed ({exc}), and a store needs each group's data hash to know when "
                    "its model can be reused: drop or convert the column, or train without "
                    "store=") from exc

        self._hashed: dict[int, np.ndarray] = {}
        if by_pandas:
            with ThreadPoolExecutor(min(len(by_pandas), _hashing_threads())) as pool:
                self._hashed = dict(zip(by_pandas, pool.map(pandas_hashes, by_pandas)))
        # pandas' combine_hash_arrays (private there): its constants, in its order
        self._multipliers, multiplier = [], 1000003
        for position in range(columns):
            self._multipliers.append(np.uint64(multiplier))
            multiplier = (multiplier + 82520 + 2 * (columns - position)) % (1 << 64)
        self._buffers = np.empty((3, 0), dtype=np.uint64)

    def rows(self, start: int, stop: int, buffers: np.ndarray | None = None) -> np.ndarray:
        """The hashes of rows ``start`` to ``stop``: a view of ``buffers`` (a
        ``(3, n)`` uint64 array of the caller's, one per thread), else of
        this object's own buffer, good until the next call."""
        count = stop - start
        if buffers is None or buffers.shape[1] < count:
            if self._buffers.shape[1] < count:
                self._buffers = np.empty((3, count), dtype=np.uint64)
            buffers = self._buffers
        out, word, spare = (buffer[:count] for buffer in buffers)
        out.fill(0x345678)
        with np.errstate(over="ignore"):
            for position, values in enumerate(self._own):
                if values is None:
                    np.bitwise_xor(out, self._hashed[position][start:stop], out=out)
                else:
                    piece = values[start:stop]
                    if piece.dtype == np.bool_:
                        word[...] = piece
                    else:  # its bits, widened as pandas widens them (unsigned)
                        word[...] = piece.view(f"u{piece.dtype.itemsize}")
                        if piece.dtype.kind == "f":
                            _as_pandas_floats(piece, word)
                    mix64_inplace(word, spare)
                    missing = self._missing[position]
                    if missing is not None:
                        word[missing[start:stop]] = _missing_value_hash()
                    np.bitwise_xor(out, word, out=out)
                np.multiply(out, self._multipliers[position], out=out)
            out += np.uint64(97531)
        return out


def _as_pandas_floats(values: np.ndarray, bits: np.ndarray) -> None:
    """Give the widened ``bits`` of float ``values`` the one pattern pandas
    hashes for each NaN and for -0.0, where the installed pandas does (since
    3.1 it hashes equal floats alike; 3.0 hashed their bits as they were)."""
    nan_bits, negative_zero_bits = _pandas_float_patterns(values.dtype.str)
    if nan_bits is not None:
        nan = np.isnan(values)
        if nan.any():
            bits[nan] = nan_bits
    if negative_zero_bits is not None:
        bits[bits == negative_zero_bits] = 0


@functools.lru_cache(maxsize=8)
def _pandas_float_patterns(dtype: str) -> tuple[np.uint64 | None, np.uint64 | None]:
    """For floats of ``dtype``: the bits pandas hashes every NaN as, and those
    of -0.0 (hashed as 0.0), or None where the installed pandas hashes the
    value's own bits; found by asking pandas once."""
    import pandas as pd

    kind = np.dtype(dtype)
    unsigned = f"u{kind.itemsize}"
    negative_nan = np.array([np.nan, -np.nan], dtype=kind)
    negative_nan.view(unsigned)[1] |= np.array(1, dtype=unsigned)  # another payload
    nans = pd.util.hash_array(negative_nan)
    zeros = pd.util.hash_array(np.array([0.0, -0.0], dtype=kind))
    nan_bits = np.uint64(np.array(np.nan, dtype=kind).view(unsigned)) if nans[0] == nans[1] \
        else None
    zero_bits = np.uint64(np.array(-0.0, dtype=kind).view(unsigned)) if zeros[0] == zeros[1] \
        else None
    return nan_bits, zero_bits


def _plain_numbers(column: Any) -> tuple[np.ndarray, np.ndarray | None] | None:
    """A column of integers, floats or booleans as one NumPy array (what
    pandas would hash by its bits), and which of its values are missing (an
    integer or boolean column's, there 0: None where none is); None for a
    float column with nulls (pandas hashes it by its bits already) and for
    any other column."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = column.type
    exact = pa.types.is_integer(kind) or pa.types.is_boolean(kind)
    if not exact and not (pa.types.is_floating(kind) and kind.bit_width > 16
                          and not column.null_count):
        return None
    missing = None
    if column.null_count:
        missing = np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False))
        column = pc.fill_null(column, pa.scalar(0 if not pa.types.is_boolean(kind) else False,
                                                kind))
    chunks = [chunk.to_numpy(zero_copy_only=False) for chunk in column.chunks]
    if not chunks:
        return np.empty(0, dtype=kind.to_pandas_dtype()), missing
    return (chunks[0] if len(chunks) == 1 else np.concatenate(chunks)), missing


@functools.lru_cache(maxsize=1)
def _missing_value_hash() -> np.uint64:
    """What pandas hashes a float NaN to: a missing value of an integer or
    boolean column (whose rows pandas hashed as floats, where it hashed them)."""
    import pandas as pd

    return np.uint64(pd.util.hash_array(np.array([np.nan]))[0])
