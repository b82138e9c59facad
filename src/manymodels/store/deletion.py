"""Deleting a run without taking from later runs what they reuse of it.

A later run can hold a deleted run's models in two ways, and keeps them both:

- **It names the run** (a ``same_as`` block, see :mod:`.taskblocks`): the
  named run's trained rows are copied into the naming block first
  (:func:`copy_out_references`), as they were when it named them.
- **It reused some of its models** (rows whose ``reused_from`` is the
  deleted run): those rows keep what they say (reused from that run, for
  the record) and become the models the run holding them owns: its blocks
  count them as trained and keep their identities' prefixes, and reuse
  takes a row reused from a run no longer in the store as that run's own
  (:func:`.taskblocks.trained_rows`). Before, only rows that trained were
  looked up, so deleting the run that trained a million models made the
  next re-run train all of them again, though every model was still in the
  store. A run that takes rows in this way is first copied into the blocks
  that name it, so that a block naming it stands for what it held when it
  was named, not more. (A store written before blocks keeps its rows as
  they were: there, such models are trained again.)

Everything happens in the caller's transaction: a delete is whole or not at
all. It reads the ``reused_from`` column of every other run's blocks once (a
second or so for a store of several million-task runs): deletes are rare, and
a re-run that trains a million models again is not.
"""

from __future__ import annotations

import sqlite3

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.tables import fixed_width_bytes, one_array
from . import taskblocks
from .taskblocks import COLUMNS, REUSED_ROWS_PER_BLOCK, block_column, block_data, decode, encode


def delete_run(conn: sqlite3.Connection, run_id: int) -> None:
    """Delete run ``run_id`` and its rows (inside the caller's transaction),
    its models handed to the runs that reuse them (see the module's docstring)."""
    copy_out_references(conn, run_id)
    holding = _blocks_reusing(conn, run_id)
    for adopter in sorted({run for _, run, _ in holding}):
        copy_out_references(conn, adopter)  # (adds no row reused from run_id)
    conn.execute("DELETE FROM attachments WHERE run_id = ?", (run_id,))
    conn.execute("DELETE FROM tasks WHERE run_id = ?", (run_id,))
    conn.execute("DELETE FROM task_blocks WHERE run_id = ?", (run_id,))
    conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
    _adopt(conn, holding)  # run_id is now among the runs its rows name as deleted


def copy_out_references(conn: sqlite3.Connection, source: int) -> None:
    """Each block that names run ``source``'s rows gets them copied in: the
    rows made once, the block's first piece written in its place and the
    rest as blocks after."""
    naming = conn.execute(f"SELECT block_id, run_id FROM task_blocks "
                          f"WHERE {block_column(conn, 'same_as')} = ?", (source,)).fetchall()
    if not naming:
        return
    rows = taskblocks.rows_reused_from(conn, source, list(COLUMNS))
    size = REUSED_ROWS_PER_BLOCK
    pieces = [encode(rows.slice(start, size)) for start in range(0, max(rows.num_rows, 1), size)]
    for block_id, run_id in naming:
        conn.execute("UPDATE task_blocks SET data = ?, tasks = ?, same_as = NULL "
                     "WHERE block_id = ?", (pieces[0], min(rows.num_rows, size), block_id))
        for number, piece in enumerate(pieces[1:], start=1):
            count = min(size, rows.num_rows - number * size)
            conn.execute("INSERT INTO task_blocks(run_id, tasks, trained, data) "
                         "VALUES (?, ?, 0, ?)", (run_id, count, piece))


def _blocks_reusing(conn: sqlite3.Connection, source: int
                    ) -> list[tuple[int, int, pa.Table]]:
    """``(block, run, its identity, status and reused_from columns)`` of each
    block of another run that holds a row reused from ``source`` (blocks
    that name a run hold no rows of their own): each block read once."""
    found = []
    for block_id, run_id in conn.execute(
            f"SELECT block_id, run_id FROM task_blocks WHERE run_id != ? AND "
            f"{block_column(conn, 'same_as')} IS NULL", (source,)).fetchall():
        data = block_data(conn, block_id)
        what = f"task block {block_id} of run {run_id}"
        if pc.any(pc.equal(decode(data, what, ["reused_from"])["reused_from"], source)).as_py():
            found.append((block_id, run_id, decode(data, what,
                                                   ["identity", "status", "reused_from"])))
    return found


def _adopt(conn: sqlite3.Connection, holding: list[tuple[int, int, pa.Table]]) -> None:
    """The blocks ``holding`` rows reused from a run deleted (in this
    transaction) count them as their run's own: their ``trained`` and
    ``trained_identities`` (the rows stay)."""
    for block_id, _, block in holding:
        owned = taskblocks.trained_mask(block, taskblocks.deleted_sources(conn, block))
        prefixes = _identity_prefixes(block["identity"])
        conn.execute("UPDATE task_blocks SET trained = ?, trained_identities = ? "
                     "WHERE block_id = ?",
                     (int(owned.sum()), taskblocks.trained_prefixes(prefixes, owned), block_id))


def _identity_prefixes(identities: pa.ChunkedArray) -> np.ndarray | None:
    """Each identity's first 64 bits (its first 16 hex digits), as a block
    keeps those of its trained tasks; None when they are not all such text
    (the block then keeps none, and reuse reads it whatever it looks for)."""
    identities = one_array(identities)
    if identities.null_count:
        return None
    digits = fixed_width_bytes(identities)
    if digits is None or digits.shape[1] < 16:
        return None
    try:
        raw = bytes.fromhex(np.ascontiguousarray(digits[:, :16]).tobytes().decode("ascii"))
    except ValueError:
        return None
    return np.frombuffer(raw, dtype=">u8").astype(np.uint64)
