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
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .database import StoreIntegrityError

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
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def table(columns: dict[str, Sequence | np.ndarray | pa.Array]) -> pa.Table:
    """A block's table from columns (lists, arrays); a column left out is all null."""
    length = len(next(iter(columns.values())))
    arrays = []
    for name, kind in COLUMNS.items():
        values = columns.get(name)
        if values is None:
            arrays.append(pa.nulls(length, kind))
        elif isinstance(values, (pa.Array, pa.ChunkedArray)):
            arrays.append(values.cast(kind) if values.type != kind else values)
        else:
            arrays.append(pa.array(values, kind, from_pandas=True))
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def encode(block: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, block.schema, options=_WRITE_OPTIONS) as writer:
        writer.write_table(block)
    return sink.getvalue().to_pybytes()


def decode(data: bytes, what: str = "a task block") -> pa.Table:
    """A block's table; a damaged one is refused by name (never half read)."""
    try:
        block = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise StoreIntegrityError(f"{what} of the store's index is damaged ({exc}): its "
                                  "tasks cannot be read") from exc
    missing = [name for name in COLUMNS if name not in block.column_names]
    if missing:
        raise StoreIntegrityError(f"{what} of the store's index is damaged: it has no "
                                  f"column {missing[0]!r}")
    return block


def insert(conn: sqlite3.Connection, run_id: int, block: pa.Table) -> None:
    """One block of ``run_id``'s tasks (inside the caller's transaction)."""
    if block.num_rows == 0:
        return
    trained = pc.sum(pc.and_(pc.equal(block["status"], "ok"),
                             pc.is_null(block["reused_from"]))).as_py() or 0
    conn.execute("INSERT INTO task_blocks(run_id, tasks, trained, data) VALUES (?,?,?,?)",
                 (run_id, block.num_rows, trained, encode(block)))


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
    not ``ordered`` (reuse only matches rows: a million-row sort saved).
    ``trained_only``: only blocks that trained a model are read (the rows of
    the others are left out: what reuse looks for is in the former)."""
    names = list(dict.fromkeys(["task_index", *(columns or COLUMNS)]))
    condition = " AND trained > 0" if trained_only else ""
    parts = [decode(data, f"task block {block_id} of run {run_id}").select(names)
             for block_id, data in conn.execute(
                 f"SELECT block_id, data FROM task_blocks WHERE run_id = ?{condition} "
                 "ORDER BY block_id", (run_id,))]
    legacy = _legacy_rows(conn, run_id)
    if legacy is not None:
        parts.insert(0, legacy.select(names))
    if not parts:
        return pa.Table.from_arrays([pa.array([], COLUMNS[n]) for n in names], names=names)
    result = pa.concat_tables(parts) if len(parts) > 1 else parts[0]
    index = result["task_index"].to_numpy()
    if index.size > 1 and np.any(np.diff(index) <= 0):  # not in task order as written
        if not ordered and index.min() >= 0 and np.bincount(index).max() == 1:
            return result.combine_chunks()  # each task once: nothing to drop
        # stable sort by task index, then keep each index's last row
        order = np.argsort(index, kind="stable")
        index = index[order]
        last = np.ones(index.size, dtype=bool)
        last[:-1] = index[1:] != index[:-1]
        result = result.take(pa.array(order[last]))
    return result.combine_chunks()


def run_ids_with_blocks(conn: sqlite3.Connection) -> list[int]:
    return [run_id for (run_id,) in conn.execute(
        "SELECT DISTINCT run_id FROM task_blocks UNION SELECT DISTINCT run_id FROM tasks "
        "ORDER BY 1")]


def referenced_artifacts(conn: sqlite3.Connection) -> set[str]:
    """Every artifact (SHA-256 or pack locator) some task of any run names:
    what :meth:`Store.gc` keeps."""
    names: set[str] = {a for (a,) in conn.execute(
        "SELECT DISTINCT artifact FROM tasks WHERE artifact IS NOT NULL")}
    for block_id, run_id, data in conn.execute(
            "SELECT block_id, run_id, data FROM task_blocks"):
        column = decode(data, f"task block {block_id} of run {run_id}")["artifact"].drop_null()
        names.update(pc.unique(column).to_pylist())
    return names
