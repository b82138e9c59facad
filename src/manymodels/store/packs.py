"""Packs: many small models in one BLOB row of the store's index.

A model under 1 MiB that a run trains is not an ``artifacts`` row of its own:
the writer thread writes each pack a worker sent (the models it pickled in
one part of a batch) as it came, as a row of ``packs`` (or more, past
:data:`PACK_BYTES`), the models pickled in the driver joined into one, and
each task row names its model by a *locator*, ``<sha256>@<pack>/<offset>/<size>``
(kept in a block as its parts, see :data:`LOCATOR_COLUMNS`).
A million tiny models are then a few hundred rows, not a million inserts into a
table keyed by random hashes (a third of a stored run's cost, measured), and
about 200 bytes less per model on disk.

A pack of small arrays of one kind is *templated* (store layout 5): the
head and tail every one of its models' pickles shares are kept once, in the
row's ``head`` and ``tail``, and its BLOB holds only what lies between them,
each model's own bytes (a least-squares model's 151-byte pickle is 24 bytes
of coefficients: a sixth of the bytes to carry from the workers, to write
twice through SQLite's write-ahead log, and to keep). A locator is the same
either way: its offset is in the BLOB, its size the whole pickle's, and a
model is read back as head, its bytes and tail, byte for byte, then checked
against its SHA-256 like any other.

This module is the layout and its I/O, a model read back checked against
its SHA-256 (:func:`read_model`) included; what to do when it does not
match (mark the model corrupt, refuse it by name) is :mod:`.artifacts`'s.
"""

from __future__ import annotations

import hashlib
import sqlite3
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.tables import one_array

#: A pack holds at most this many bytes; a larger hand-over makes several.
PACK_BYTES = 32 << 20

#: A packed model's locator as its parts: the columns after
#: :data:`.taskblocks.COLUMNS` in the blocks written since store layout 4
#: (``artifact`` is then null): 32 bytes of SHA-256 and two ints, not 82 hex
#: and decimal digits made into text for each of a million models as they
#: are written (0.13-0.16 s of the writer's CPU a million, measured) and
#: taken apart again when read. The locator's text is made when a reader
#: asks for ``artifact`` (:func:`.taskblocks.decode`); readers never see
#: these columns.
LOCATOR_COLUMNS: dict[str, pa.DataType] = {
    "model_sha256": pa.binary(32),  # zeros where not packed
    "pack_id": pa.int64(),          # null where not packed
    "pack_offset": pa.int64(),
}


def is_locator(artifact: str) -> bool:
    """Whether ``artifact`` names a packed model (else it is a bare SHA-256)."""
    return "@" in artifact


def locator_mask(artifacts: pa.Array) -> np.ndarray:
    """Which of ``artifacts`` (a string array, nulls allowed) are locators:
    longer than a SHA-256's 64 hex digits, with ``@`` after them (the digits
    themselves are checked when a model is loaded). Read from the array's
    buffers: a substring search took 0.1 s a million, a tenth of an unchanged
    re-run."""
    from ..inputs.tables import string_offsets

    starts, data = string_offsets(artifacts)
    long = (np.diff(starts) > 64) & artifacts.is_valid().to_numpy(zero_copy_only=False)
    mask = np.zeros(len(artifacts), dtype=bool)
    where = np.flatnonzero(long)
    if where.size:
        mask[where] = data[starts[where] + 64] == ord("@")
    return mask


def parse_locator(locator: str) -> tuple[str, int, int, int]:
    """``(sha256, pack, offset, size)`` of a packed model's locator."""
    digest, _, place = locator.partition("@")
    pack, offset, size = place.split("/")
    return digest, int(pack), int(offset), int(size)


def _parsed_or_none(locator: str) -> tuple[str, int, int, int] | None:
    try:
        return parse_locator(locator)
    except ValueError:
        return None


def write_packs(conn: sqlite3.Connection, data: bytes | memoryview, sizes: np.ndarray,
                template: tuple[bytes, bytes] | None = None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Store small models as packs (inside the caller's transaction); return
    each one's pack and offset in it (int64 arrays, in order: with its size
    and SHA-256, what its locator says, see :func:`locators`), and the
    packs written, as ``(pack_id, size)`` int64 rows (what a block keeps,
    for :func:`all_whole`). ``data``: the models' pickles joined, ``sizes``
    each one's length: the bytes go to SQLite as they came. With
    ``template`` (a templated pack's head and tail), ``data`` and ``sizes``
    are what lies between them, and each pack written keeps the template."""
    head, tail = template if template is not None else (None, None)
    template_length = 0
    if template is not None:
        template_length = len(head) + len(tail)
        from .database import TEMPLATE_FORMAT, raise_layout

        raise_layout(conn, TEMPLATE_FORMAT)  # an older reader would misread these packs
    count = len(sizes)
    ends = np.cumsum(sizes, dtype=np.int64)
    view = memoryview(data)
    pack_of = np.empty(count, dtype=np.int64)
    base_of = np.empty(count, dtype=np.int64)  # where each model's pack starts in data
    written: list[tuple[int, int]] = []
    start = 0
    while start < count:
        base = int(ends[start - 1]) if start else 0
        # the models up to PACK_BYTES from here (always at least one)
        stop = max(start + 1, int(np.searchsorted(ends, base + PACK_BYTES, side="right")))
        end = int(ends[stop - 1])
        # a pack's size: its whole length, its template's included (a pack
        # whose head or tail was cut short is then known so at once)
        size = end - base + template_length
        pack_of[start:stop] = conn.execute(
            "INSERT INTO packs(size, models, blob, head, tail) VALUES (?, ?, ?, ?, ?)",
            (size, stop - start, view[base:end], head, tail)).lastrowid
        base_of[start:stop] = base
        written.append((int(pack_of[start]), size))
        start = stop
    return (pack_of, ends - sizes - base_of,
            np.array(written, dtype=np.int64).reshape(-1, 2))


def all_whole(conn: sqlite3.Connection, written: list[bytes | None]) -> bool:
    """Whether every pack that blocks wrote (each block's ``written_packs``:
    ``(pack_id, size)`` int64 rows, see :func:`write_packs`) is still there
    at its size (True when they wrote none); False when a block's list is
    not known (None: written before blocks kept it) or damaged. Then each
    locator those blocks hold names bytes that are there, without parsing a
    million of them (:func:`whole_mask`: a quarter of an unchanged re-run's
    time); whether the bytes are right is checked by their SHA-256 when a
    model is loaded, as always."""
    if any(blob is None or len(blob) % 16 for blob in written):
        return False  # then each locator is checked on its own
    wanted = np.frombuffer(b"".join(written), dtype=np.int64).reshape(-1, 2)
    if not len(wanted):
        return True
    # each at its size exactly (a pack cut short is checked model by model,
    # by whole_mask): its whole length, or, for a templated pack written
    # when its size was its BLOB's length, that (its template unchecked)
    known = {pack: (length, blob) for pack, length, _, blob in _pack_lengths(
        conn, (int(wanted[:, 0].min()), int(wanted[:, 0].max())))}
    return all(size in known.get(pack, ()) for pack, size in wanted.tolist())


def locators(digests: bytes | np.ndarray, pack: Any, offset: Any, size: Any) -> pa.Array:
    """``<sha256>@<pack>/<offset>/<size>`` for each model, made at once:
    ``digests`` their SHA-256s, 32 raw bytes each (or a ``(n, 32)`` uint8
    array); the numbers as NumPy or Arrow arrays (a null one gives a null
    locator)."""
    from ..identity.rowhash import hex_array

    def text(numbers: Any) -> pa.Array:
        return pc.cast(numbers if isinstance(numbers, (pa.Array, pa.ChunkedArray))
                       else pa.array(numbers, pa.int64()), pa.string())

    raw = digests if isinstance(digests, np.ndarray) else \
        np.frombuffer(digests, dtype=np.uint8).reshape(len(size), 32)
    return pc.binary_join_element_wise(hex_array(raw), "@", text(pack), "/", text(offset), "/",
                                       text(size), "")


#: A pack read whole once a second model is read from it in a row, when it
#: is no larger than this: loading a run's models one after another
#: (``run.models``, predicting) then reads each pack once, not each model
#: with two queries of its own (15.8 µs a model, against about 8).
READ_AHEAD_BYTES = 4 << 20


class _LastPack:
    """The pack a process last read a model from, and the one it holds
    whole (one of each: a pack is at most :data:`READ_AHEAD_BYTES`). A
    model served from it is still checked against its SHA-256 by the
    caller, which reads it again with ``cached=False`` before it calls the
    model corrupt: a held pack is never what refuses a model."""

    read: tuple[int, int] | None = None  # (id of the connection, pack)
    held: tuple[tuple[int, int], bytes, bytes, bytes] | None = None  # and head, BLOB, tail


def read_slice(conn: sqlite3.Connection, pack: int, offset: int, size: int, *,
               cached: bool = True) -> bytes | None:
    """The bytes a locator names (a templated pack's model with its head and
    tail), or None when its pack is gone or too short; ``cached``: from the
    pack held whole, if it is this one (see :class:`_LastPack`)."""
    place = (id(conn), pack)
    held = _LastPack.held
    if held is not None and held[0] == place:
        if cached:
            _, head, whole, tail = held
            part = size - len(head) - len(tail)
            if part >= 0 and offset + part <= len(whole):
                return b"".join((head, whole[offset:offset + part], tail))
        else:  # read as it is now: the held copy may be what failed
            _LastPack.held = None
    head, tail = pack_template(conn, pack)
    part = size - len(head) - len(tail)
    if part < 0:
        return None
    if hasattr(conn, "blobopen"):  # Python 3.11: read the slice, not the whole pack
        try:
            with conn.blobopen("packs", "blob", pack, readonly=True) as blob:
                length = len(blob)
                if offset + part > length:
                    return None
                if cached and _LastPack.read == place and length <= READ_AHEAD_BYTES:
                    whole = blob.read()  # its second model in a row: the rest follow
                    _LastPack.held = (place, head, whole, tail)
                    data = whole[offset:offset + part]
                else:
                    blob.seek(offset)
                    data = blob.read(part)
            _LastPack.read = place
        except sqlite3.OperationalError:  # no such row
            return None
    else:
        row = conn.execute("SELECT substr(blob, ?, ?), length(blob) FROM packs "
                           "WHERE pack_id = ?", (offset + 1, part, pack)).fetchone()
        if row is None or row[1] < offset + part:
            return None
        data = bytes(row[0])
    return b"".join((head, data, tail)) if head or tail else data


def read_model(conn: sqlite3.Connection, locator: str, *, cached: bool = True
               ) -> tuple[bytes | None, bool]:
    """The bytes ``locator`` names (:func:`read_slice`), and whether they are
    the model it names: there, of its size, and of its SHA-256."""
    digest, pack, offset, size = parse_locator(locator)
    data = read_slice(conn, pack, offset, size, cached=cached)
    return data, (data is not None and len(data) == size
                  and hashlib.sha256(data).hexdigest() == digest)


def pack_template(conn: sqlite3.Connection, pack: int) -> tuple[bytes, bytes]:
    """A pack's head and tail (empty unless it is templated)."""
    row = _select_packs(conn, "SELECT head, tail FROM packs WHERE pack_id = ?",
                        "SELECT NULL, NULL FROM packs WHERE pack_id = ?", (pack,)).fetchone()
    if row is None:
        return b"", b""
    return bytes(row[0] or b""), bytes(row[1] or b"")


def _pack_lengths(conn: sqlite3.Connection, between: tuple[int, int] | None = None
                  ) -> list[tuple[int, int, int, int]]:
    """Each pack's id (those ``between`` two, inclusive, if given), the
    longest a model it holds may say it ends at: its BLOB's length, plus its
    template's where it is templated (read from the records' headers, not
    the content), the size it was written at (its whole length; a templated
    pack an earlier manymodels wrote has its BLOB's), and its BLOB's length."""
    where = "" if between is None else "WHERE pack_id BETWEEN ? AND ? "
    return _select_packs(
        conn, "SELECT pack_id, length(blob) + coalesce(length(head), 0) + "
              f"coalesce(length(tail), 0), size, length(blob) FROM packs {where}"
              "ORDER BY pack_id",
        f"SELECT pack_id, length(blob), size, length(blob) FROM packs {where}"
        "ORDER BY pack_id", between or ()).fetchall()


def _select_packs(conn: sqlite3.Connection, query: str, before_templates: str,
                  parameters: tuple = ()) -> sqlite3.Cursor:
    """``query``, or ``before_templates`` in a store read-only at a layout
    before templates (its ``packs`` has no ``head`` or ``tail``). Any other
    error (a busy index, say) is raised: never a model read without its
    template."""
    try:
        return conn.execute(query, parameters)
    except sqlite3.OperationalError as exc:
        if "no such column" not in str(exc):
            raise
        return conn.execute(before_templates, parameters)


def whole_locators(conn: sqlite3.Connection, locators: set[str]) -> set[str]:
    """Those of ``locators`` whose pack is there and long enough."""
    names = list(locators)
    whole = whole_mask(conn, pa.array(names, pa.string())).tolist()
    return {name for name, ok in zip(names, whole) if ok}


def whole_mask(conn: sqlite3.Connection, locators: pa.Array) -> np.ndarray:
    """For each of ``locators``, whether its pack is there and long enough (a
    cheap check: SQLite reads a BLOB's ``length()`` from its record header,
    not its content); parsed all at once: a re-run checks a million. A
    templated pack's model is whole when its offset and size, less the
    template, lie within the BLOB, and, where its pack is shorter than it
    was written, its template is whole (:func:`_template_whole`)."""
    known = _pack_lengths(conn)
    if not known or len(locators) == 0:
        return np.zeros(len(locators), dtype=bool)
    pack_ids, lengths, written, _ = np.array(known, dtype=np.int64).T
    try:
        places = pc.list_element(pc.split_pattern(locators, "@", max_splits=1), 1)
        parts = pc.split_pattern(places, "/")
        if not pc.all(pc.equal(pc.list_value_length(parts), 3)).as_py():
            raise ValueError("a locator without three numbers")
        numbers = pc.list_flatten(parts).cast(pa.int64()).to_numpy()
        if numbers.size and not (numbers.min() >= 0 and numbers.max() < 1 << 48):
            raise ValueError("a number out of range")
    except (pa.ArrowException, ValueError):  # a damaged index row: one at a time, as ints
        sizes = dict(zip(pack_ids.tolist(), lengths.tolist()))
        return np.array([parsed is not None and min(parsed[1:]) >= 0
                         and parsed[2] + parsed[3] <= sizes.get(parsed[1], -1)
                         for parsed in map(_parsed_or_none, locators.to_pylist())], dtype=bool)
    pack, offset, size = numbers.reshape(len(locators), 3).T
    at = np.minimum(np.searchsorted(pack_ids, pack), len(pack_ids) - 1)
    whole = (pack_ids[at] == pack) & (offset + size <= lengths[at])
    cut = whole & (lengths < written)[at]
    for damaged in np.unique(pack[cut]).tolist():
        rows = np.flatnonzero(cut & (pack == damaged))
        if not _template_whole(conn, locators, rows[np.argsort(offset[rows])]):
            whole[rows] = False
    return whole


def _template_whole(conn: sqlite3.Connection, locators: pa.Array, rows: np.ndarray) -> bool:
    """Whether the pack of ``locators[rows]`` (one pack, shorter than it was
    written: cut in its BLOB, head or tail) still has the template its
    models were written with: some model of it reads back whole (its
    SHA-256 checked). Its lengths alone cannot tell: a head cut by a byte
    is as short as a BLOB; but a cut template fails every model of the
    pack, a cut BLOB only those past the cut (their offsets say which)."""
    return any(read_model(conn, locator, cached=False)[1]
               for locator in locators.take(pa.array(rows)).to_pylist())


def locator_columns(digests: np.ndarray, pack: np.ndarray, offset: np.ndarray,
                    at: np.ndarray, in_pack: np.ndarray) -> dict[str, pa.Array]:
    """:data:`LOCATOR_COLUMNS` of a block's rows: row ``r`` names the packed
    model ``at[r]`` (of ``digests``, an ``(n, 32)`` uint8 array, ``pack`` and
    ``offset``) where ``in_pack[r]``."""
    count = len(at)
    where = at[in_pack]
    sha = np.zeros((count, 32), dtype=np.uint8)
    sha[in_pack] = digests[where]
    packs_of = np.zeros(count, dtype=np.int64)
    packs_of[in_pack] = pack[where]
    offsets = np.zeros(count, dtype=np.int64)
    offsets[in_pack] = offset[where]
    outside = None if in_pack.all() else ~in_pack
    return {"model_sha256": pa.Array.from_buffers(pa.binary(32), count,
                                                  [None, pa.py_buffer(sha)]),
            "pack_id": pa.array(packs_of, pa.int64(), mask=outside),
            "pack_offset": pa.array(offsets, pa.int64(), mask=outside)}


def with_locator_texts(block: pa.Table) -> pa.Table:
    """``block`` (a block decoded with :data:`LOCATOR_COLUMNS` and its
    ``large_artifact``) with each model's artifact in ``artifact``: a packed
    one's locator text, a large one's SHA-256; those columns gone."""
    pack, artifact = block["pack_id"], block["large_artifact"]
    if pack.null_count < len(pack):
        sha = one_array(block["model_sha256"])
        raw = np.frombuffer(sha.buffers()[1], dtype=np.uint8)[
            sha.offset * 32:(sha.offset + len(sha)) * 32].reshape(len(sha), 32)
        artifact = pc.coalesce(artifact, locators(raw, pack, block["pack_offset"],
                                                  block["size"]))
    return block.set_column(block.schema.get_field_index("large_artifact"), "artifact",
                            artifact).drop_columns(list(LOCATOR_COLUMNS))
