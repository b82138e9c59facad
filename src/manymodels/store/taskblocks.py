"""Task rows as columnar blocks: one SQLite row per hand-over, not per task.

A run's finished tasks reach the store in hand-overs (at least one a second,
see :mod:`.writer`); each hand-over is one row of ``task_blocks`` whose
``data`` is an Arrow IPC stream (zstd) with one row per task and the columns
of :data:`COLUMNS`. A million models were a million SQLite rows, each
inserted into three B-trees keyed by random hashes (7-9 µs a row in SQLite
alone, measured, and the whole of a stored run's extra cost); as blocks they
are a few dozen rows of about 100 bytes per task, and a re-run decides reuse
with one vectorised match over the blocks that trained something, instead of
one lookup per task.

Readers never see blocks: :func:`read_run` gives a run's tasks as one Arrow
table, in task order, a later block's row winning when a task was written
twice. Stores written before blocks keep their rows in the old ``tasks``
table; :func:`read_run` reads those too, so such a store stays readable and
reusable without a migration.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..engine.messages import Status
from ..identity.hashing import TaskIdentities
from .database import (
    LOCATOR_FORMAT,
    SAME_AS_FORMAT,
    StoreIntegrityError,
    raise_layout,
    read_snapshot,
)
from .packs import LOCATOR_COLUMNS, with_locator_texts

#: The columns of a block, and their Arrow types.
COLUMNS: dict[str, pa.DataType] = {
    "task_index": pa.int64(),
    "key": pa.string(),            # JSON list of the key column values
    "identity": pa.string(),
    "code_hash": pa.string(), "params_hash": pa.string(),
    "data_hash": pa.string(), "shared_hash": pa.string(),
    "status": pa.string(),
    "attempts": pa.int64(),
    "duration_s": pa.float64(),
    "started_at": pa.float64(),
    "worker": pa.int64(),
    "metrics": pa.string(),        # JSON object
    "error": pa.string(),
    "artifact": pa.string(),       # SHA-256, or a pack locator (see .packs)
    "size": pa.int64(),
    "reused_from": pa.int64(),     # the run whose model a reused task names
}
SCHEMA = pa.schema(list(COLUMNS.items()))
#: A block with :data:`~.packs.LOCATOR_COLUMNS`: its ``artifact`` column is
#: named ``large_artifact`` (only a large model's SHA-256 is text there), so
#: that a manymodels that reads only text locators, still holding the store
#: open when its layout rose to 4, refuses such a block as damaged (no
#: ``artifact`` column) instead of taking its packed models for none (its
#: ``gc`` would remove them).
_FULL_SCHEMA = pa.schema([*((("large_artifact" if name == "artifact" else name), kind)
                            for name, kind in COLUMNS.items()), *LOCATOR_COLUMNS.items()])
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


_ONE_VALUE_KINDS = (str, int, type(None))


def table(columns: dict[str, Sequence | np.ndarray | pa.Array]) -> pa.Table:
    """A block's table from columns (lists, arrays); a column left out is all
    null. With :data:`~.packs.LOCATOR_COLUMNS` (see
    :func:`~.packs.locator_columns`), those follow."""
    length = len(next(iter(columns.values())))
    arrays = []
    located = "pack_id" in columns
    kinds = {**COLUMNS, **LOCATOR_COLUMNS} if located else COLUMNS
    for name, kind in kinds.items():
        values = columns.get(name)
        if values is None:
            arrays.append(pa.nulls(length, kind))
        elif isinstance(values, (pa.Array, pa.ChunkedArray)):
            arrays.append(values.cast(kind) if values.type != kind else values)
        elif type(values) is list and values and type(values[0]) in _ONE_VALUE_KINDS \
                and values.count(values[0]) == length:
            # one value throughout (a million "ok", 1 attempt, no error): made at once
            arrays.append(pa.repeat(pa.scalar(values[0], kind), length))
        else:
            arrays.append(pa.array(values, kind, from_pandas=True))
    return pa.Table.from_arrays(arrays, schema=_FULL_SCHEMA if located else SCHEMA)


#: A block's data ends with this mark and the CRC-32 of the Arrow IPC stream
#: before it (a reader of the stream alone stops at its end-of-stream marker):
#: a flipped bit read a status "ok" as "okok", a model's size or SHA-256 as
#: another's, or crashed the process inside Arrow (a damaged offset).
_CHECKED = b"MMc1"
_END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def encode(block: pa.Table) -> bytearray:
    """The block as an Arrow IPC stream (zstd) and its checksum, as one
    buffer SQLite binds as a BLOB without a further copy."""
    import zlib

    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, block.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_table(block)
    stream = sink.getvalue()
    data = bytearray(stream.size + 8)
    data[:stream.size] = memoryview(stream)
    data[stream.size:] = _CHECKED + zlib.crc32(memoryview(stream)).to_bytes(4, "little")
    return data


def _checked_stream(data: bytes, what: str) -> memoryview:
    """``data``'s Arrow IPC stream, its checksum checked (a block written
    before checksums, which ends with the stream's own end marker, as it is)."""
    import zlib

    view = memoryview(data)
    tail = bytes(view[-8:])
    if tail[:4] == _CHECKED:
        stream = view[:-8]
        if zlib.crc32(stream) != int.from_bytes(tail[4:], "little"):
            raise StoreIntegrityError(f"{what} of the store's index is damaged (its checksum "
                                      "does not match its bytes): its tasks cannot be read")
        return stream
    if tail != _END_OF_STREAM:
        raise StoreIntegrityError(f"{what} of the store's index is damaged (it ends with "
                                  "neither a checksum nor a stream's end): its tasks cannot "
                                  "be read")
    return view


def decode(data: bytes, what: str = "a task block",
           columns: Sequence[str] | None = None) -> pa.Table:
    """A block's table (only ``columns`` decompressed, when given); a damaged
    one is refused by name (never half read). A packed model's ``artifact``
    is its locator's text, however the block keeps it."""
    names = list(columns) if columns is not None else list(COLUMNS)
    buffer = pa.py_buffer(_checked_stream(data, what))
    try:
        located = pa.ipc.open_stream(buffer).schema.names[len(COLUMNS):] == list(
            LOCATOR_COLUMNS)
        schema = _FULL_SCHEMA if located else SCHEMA
        wanted = [("large_artifact" if located and name == "artifact" else name)
                  for name in names]
        if located and "artifact" in names:
            wanted += ["size", *LOCATOR_COLUMNS]
        options = pa.ipc.IpcReadOptions(included_fields=sorted(
            {schema.get_field_index(name) for name in wanted}))
        block = pa.ipc.open_stream(buffer, options=options).read_all()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StoreIntegrityError(f"{what} of the store's index is damaged ({exc}): its "
                                  "tasks cannot be read") from exc
    missing = [name for name in wanted if name not in block.column_names]
    if missing or block.schema.names != [n for n in schema.names if n in wanted]:
        raise StoreIntegrityError(f"{what} of the store's index is damaged: it has no "
                                  f"column {(missing or names)[0]!r} where it should")
    if located and "artifact" in names:
        block = with_locator_texts(block)
    return block.select(names)


def task_columns(keys: pa.Array, identities: TaskIdentities, rows: pa.Array) -> dict:
    """The key and identity columns of the tasks ``rows`` for :func:`table`,
    taken from the run's (the code and shared hashes are the run's: left null).
    Every task in order (an unchanged re-run's reused block) takes nothing."""
    if len(rows) == len(keys) and pc.all(pc.equal(
            rows, pa.array(np.arange(len(rows)), rows.type))).as_py():
        return {"task_index": rows, "key": keys, "identity": identities.identity,
                "params_hash": identities.params, "data_hash": identities.data}
    identity, data = identities.texts_of(rows.to_numpy(zero_copy_only=False))
    return {"task_index": rows, "key": keys.take(rows), "identity": identity,
            "params_hash": identities.params.take(rows), "data_hash": data}


def trained_mask(block: pa.Table, deleted: pa.Array | None = None) -> np.ndarray:
    """Which of a block's tasks hold their model as their own: ok, and not
    reused, or reused from one of the runs ``deleted`` since (see
    :mod:`.deletion`)."""
    own = pc.is_null(block["reused_from"])
    if deleted is not None and len(deleted) and block["reused_from"].null_count < block.num_rows:
        own = pc.or_(own, pc.fill_null(pc.is_in(block["reused_from"], value_set=deleted),
                                       False))
    return pc.and_(pc.equal(block["status"], Status.OK.value), own).to_numpy(zero_copy_only=False)


def deleted_sources(conn: sqlite3.Connection, table: pa.Table) -> pa.Array:
    """The runs ``table``'s rows were reused from that are no longer in the store."""
    sources = pc.unique(table["reused_from"]).drop_null()
    if not len(sources):
        return sources
    live = pa.array([run for (run,) in conn.execute("SELECT run_id FROM runs")], pa.int64())
    return sources.filter(pc.invert(pc.is_in(sources, value_set=live)))


def insert(conn: sqlite3.Connection, run_id: int, block: pa.Table,
           prefixes: np.ndarray | None = None, written_packs: np.ndarray | None = None) -> None:
    """One block of ``run_id``'s tasks (inside the caller's transaction).
    ``prefixes``: the block's tasks' identity prefixes (uint64, see
    :class:`~manymodels.identity.hashing.TaskIdentities`); those of the tasks it
    trained are kept (:func:`trained_prefixes`). ``written_packs``: the
    packs its models were written to (see :func:`.packs.all_whole`)."""
    if block.num_rows == 0:
        return
    if "pack_id" in block.column_names:  # a manymodels that reads only text locators
        raise_layout(conn, LOCATOR_FORMAT)  # would find no model
    trained = trained_mask(block)
    kept = trained_prefixes(prefixes, trained)
    conn.execute("INSERT INTO task_blocks(run_id, tasks, trained, data, trained_identities, "
                 "written_packs) VALUES (?,?,?,?,?,?)",
                 (run_id, block.num_rows, int(trained.sum()), encode(block), kept,
                  None if written_packs is None else written_packs.astype(np.int64).tobytes()))


def trained_prefixes(prefixes: np.ndarray | None, trained: np.ndarray) -> bytes | None:
    """What a block keeps of the identity prefixes ``prefixes`` of its
    tasks that hold a model of their own (the mask ``trained``), for
    :func:`.reuse.may_have_trained`: sorted; None when not known or none trained."""
    if prefixes is None or not trained.any():
        return None
    return np.sort(np.asarray(prefixes, dtype=np.uint64)[trained]).tobytes()


def _legacy_rows(conn: sqlite3.Connection, run_id: int) -> pa.Table | None:
    """The run's rows in the ``tasks`` table of a store written before blocks."""
    cursor = conn.execute(f"SELECT {', '.join(COLUMNS)} FROM tasks WHERE run_id = ?",
                          (run_id,))
    rows = cursor.fetchall()
    if not rows:
        return None
    return table({name: list(values) for name, values in zip(COLUMNS, zip(*rows))})


def read_run(conn: sqlite3.Connection, run_id: int, columns: Iterable[str] | None = None,
             *, trained_only: bool = False, ordered: bool = True) -> pa.Table:
    """The tasks of ``run_id``, one row per task (the latest written), with
    ``columns`` (default all; ``task_index`` always), in task order unless
    not ``ordered`` (reuse only matches rows: a million-row sort saved; its
    blocks are then left as the table's chunks).
    ``trained_only``: only blocks that trained a model are read (the rows of
    the others are left out: what reuse looks for is in the former)."""
    names = list(dict.fromkeys(["task_index", *(columns or COLUMNS)]))
    parts = [rows for _, rows in run_blocks(conn, run_id, names, trained_only=trained_only)]
    legacy = _legacy_rows(conn, run_id)
    if legacy is not None:
        parts.insert(0, legacy.select(names))
    if not parts:
        return pa.Table.from_arrays([pa.array([], COLUMNS[n]) for n in names], names=names)
    result = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    index = result["task_index"].to_numpy()
    if index.size > 1 and np.any(np.diff(index) <= 0):  # not in task order as written
        if not ordered and index.min() >= 0 and np.bincount(index).max() == 1:
            return result  # each task once: nothing to drop (and its chunks not copied)
        # stable sort by task index, then keep each index's last row
        order = np.argsort(index, kind="stable")
        index = index[order]
        last = np.ones(index.size, dtype=bool)
        last[:-1] = index[1:] != index[:-1]
        result = result.take(pa.array(order[last]))
    return result.combine_chunks()


def run_blocks(conn: sqlite3.Connection, run_id: int, columns: Sequence[str], *,
               after: int = 0, trained_only: bool = False) -> Iterator[tuple[int, pa.Table]]:
    """``run_id``'s blocks after block ``after``, in order, each as its
    rows with ``columns``: decoded, or, for a block that names another run's
    rows (see :func:`insert_same_as`), made from them. Each block is fetched
    on its own (a million tasks' blocks are not all held at once), after the
    list of them: no statement is open while a named run is read. All in
    one read transaction (unless the caller's): a run deleted meanwhile
    changes what the runs that reused it hold (see :mod:`.deletion`), and a
    reader must see the runs it names as they were when it listed them."""
    with read_snapshot(conn):
        yield from _run_blocks(conn, run_id, columns, after, trained_only)


#: Blocks decoded at once, ahead of the one the reader takes: zstd and Arrow
#: decode without the GIL, so a re-run of a million tasks reads its earlier
#: run's blocks on every core, holding a few decoded blocks at a time.
DECODE_AHEAD = 4
#: Blocks a run has from which they are decoded on threads: below, starting
#: the pool costs more than it saves (a small read took twice as long).
POOLED_FROM_BLOCKS = 4


def _run_blocks(conn: sqlite3.Connection, run_id: int, columns: Sequence[str], after: int,
                trained_only: bool) -> Iterator[tuple[int, pa.Table]]:
    condition = " AND trained > 0" if trained_only else ""
    same_as_of = block_column(conn, "same_as")
    blocks = conn.execute(f"SELECT block_id, {same_as_of} FROM task_blocks "
                          f"WHERE run_id = ? AND block_id > ?{condition} ORDER BY block_id",
                          (run_id, after)).fetchall()
    if len(blocks) < POOLED_FROM_BLOCKS:
        yield from _blocks_in_order(conn, run_id, columns, blocks, same_as_of, None)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=DECODE_AHEAD,
                            thread_name_prefix="manymodels-decode") as pool:
        yield from _blocks_in_order(conn, run_id, columns, blocks, same_as_of, pool)


def _blocks_in_order(conn: sqlite3.Connection, run_id: int, columns: Sequence[str],
                     blocks: list, same_as_of: str, pool: Any) -> Iterator[tuple[int, pa.Table]]:
    """The blocks' rows in order; with ``pool``, each block's data fetched
    here (SQLite's connection stays on this thread) and decoded there, up to
    :data:`DECODE_AHEAD` at a time."""
    from collections import deque

    ahead: deque = deque()

    def decoded() -> Iterator[tuple[int, pa.Table]]:
        while ahead:
            done_id, decoding = ahead.popleft()
            yield done_id, decoding.result()

    for block_id, same_as in blocks:
        try:
            if same_as is not None and conn.execute(
                    "SELECT 1 FROM runs WHERE run_id = ?", (same_as,)).fetchone() is not None:
                yield from decoded()
                yield block_id, rows_reused_from(conn, same_as, columns)
                continue
            # a block whose named run was deleted meanwhile has its rows copied in by now
            row = conn.execute(f"SELECT {same_as_of} FROM task_blocks WHERE block_id = ?",
                               (block_id,)).fetchone()
            if row is None:
                continue  # deleted meanwhile, with its run
            if row[0] is not None:
                raise StoreIntegrityError(
                    f"task block {block_id} of run {run_id} names run {row[0]}, whose "
                    "models it reuses, but that run is missing from the store's index")
            what = f"task block {block_id} of run {run_id}"
            data = block_data(conn, block_id)
        except Exception:
            yield from decoded()  # the blocks before this one first, as one at a time
            raise
        if pool is None:
            yield block_id, decode(data, what, columns)
            continue
        ahead.append((block_id, pool.submit(decode, data, what, columns)))
        if len(ahead) >= DECODE_AHEAD:
            done_id, decoding = ahead.popleft()
            yield done_id, decoding.result()
    yield from decoded()


def block_data(conn: sqlite3.Connection, block_id: int) -> bytes:
    """Block ``block_id``'s data, which the caller's transaction holds.

    Read through a blob handle where Python has one (3.11): a ``SELECT``
    copies a block's 10 MB twice, into SQLite's value and then into fresh
    Python bytes, and was two thirds of an unchanged re-run's read of a
    million rows (70 ms against 15 ms, measured)."""
    if hasattr(conn, "blobopen"):
        try:
            with conn.blobopen("task_blocks", "data", block_id, readonly=True) as blob:
                return blob.read()
        except sqlite3.OperationalError:  # no such table in main: a temporary one
            pass
    (data,) = conn.execute("SELECT data FROM task_blocks WHERE block_id = ?",
                           (block_id,)).fetchone()
    return data


# -- a run that reuses another run's trained rows, all of them, as they are ----------
#
# An unchanged re-run of a million models reused each of them and wrote a
# million rows (the other run's columns, taken and encoded again: a third of
# its time and 170 bytes a model on disk). When every task that another,
# ended run trained is reused from it at its own task number with its own key,
# the re-run writes one block that names that run instead (``same_as``); its
# readers make the rows from that run's trained ones: reused from it, no
# attempt of their own. A run so named is copied into its readers' blocks
# before it is deleted (:func:`.deletion.copy_out_references`).

#: A reused task's columns that are not the trained row's own.
_REUSED_VALUES = {"attempts": 0, "started_at": None, "worker": None}
#: Rows per block of reused tasks written out (a million as one block held
#: 540 MB while it was made and encoded).
REUSED_ROWS_PER_BLOCK = 1 << 18


def run_has_ended(conn: sqlite3.Connection, run_id: int) -> bool:
    """Whether run ``run_id`` is there and no longer running: no row of it
    will change, so a later run may name its rows."""
    status = conn.execute("SELECT status FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    return status is not None and status[0] != "running"


def held_count(conn: sqlite3.Connection, run_id: int) -> int:
    """How many models run ``run_id``'s blocks count as its own (trained, or
    taken from a deleted run): a re-run that names the run checks it again
    as it starts, since a delete may have added to them meanwhile."""
    return conn.execute("SELECT coalesce(sum(trained), 0) FROM task_blocks WHERE run_id = ?",
                        (run_id,)).fetchone()[0]


def block_column(conn: sqlite3.Connection, name: str) -> str:
    """``task_blocks``' column ``name`` where the index has it, else ``NULL``
    (a store written before it, opened read-only, has not)."""
    has = any(row[1] == name for row in conn.execute("PRAGMA table_info(task_blocks)"))
    return name if has else "NULL"


def trained_rows(conn: sqlite3.Connection, table: pa.Table) -> np.ndarray:
    """The positions of ``table``'s rows (a run's, as :func:`read_run` gives
    them) that trained a model without an error, or hold one reused from a
    run since deleted: what reuse takes, and what a block naming the run
    stands for."""
    no_error = table["error"].is_null().to_numpy(zero_copy_only=False)
    return np.flatnonzero(trained_mask(table, deleted_sources(conn, table)) & no_error)


def rows_reused_from(conn: sqlite3.Connection, source: int, columns: Sequence[str]
                     ) -> pa.Table:
    """Run ``source``'s trained rows (see :func:`trained_rows`) as a block
    naming it stands for them: ``columns``, reused from ``source``, no
    attempt of their own."""
    wanted = list(dict.fromkeys([*columns, "status", "reused_from", "error"]))
    rows = read_run(conn, source, wanted, trained_only=True, ordered=False)
    positions = trained_rows(conn, rows)
    if len(positions) != rows.num_rows:
        rows = rows.take(pa.array(positions))
    count = rows.num_rows
    made = []
    for name in columns:
        if name == "reused_from":
            made.append(pa.repeat(pa.scalar(source, pa.int64()), count))
        elif name in _REUSED_VALUES:
            made.append(pa.repeat(pa.scalar(_REUSED_VALUES[name], COLUMNS[name]), count))
        else:
            made.append(rows[name])
    return pa.Table.from_arrays(made, names=list(columns))


def insert_same_as(conn: sqlite3.Connection, run_id: int, source: int, tasks: int) -> None:
    """A block of ``run_id`` that stands for every row ``source`` trained
    (``tasks`` of them), reused as they are (inside the caller's transaction,
    which has checked that ``source`` has ended and trained just those)."""
    raise_layout(conn, SAME_AS_FORMAT)  # an older reader would miss them
    conn.execute("INSERT INTO task_blocks(run_id, tasks, trained, data, same_as) "
                 "VALUES (?, ?, 0, ?, ?)", (run_id, tasks, encode(table({"task_index": []})),
                                           source))
