"""One run's tasks, kept in memory between the dashboard's polls.

A run's tasks reach the store in blocks (:mod:`..store.taskblocks`): a row of
``task_blocks`` per hand-over of the writer, never changed once written (but
for a block naming another run's rows, which gets the same rows copied in
when that run is deleted). The
dashboard asks about a live run about once a second; decoding every block at
every poll would redo a million tasks' work each time. A :class:`RunTasks`
keeps what it decoded and, at each refresh, reads only the blocks written since
(``block_id`` above the last one seen: SQLite gives an ``INTEGER PRIMARY KEY``
in increasing order). A store written before blocks has a row per task in the
old ``tasks`` table: a run's rows there are read once through its index, and
later only those with a ``rowid`` above the last seen (a row replaced by
``INSERT OR REPLACE`` gets a new, higher one), so a run still written that way
is followed too. (Were the rows with the highest rowids deleted while a run is
watched, SQLite could hand their rowids out again and such rows be missed; a
store deletes runs only when no run is being written.)

A task written twice keeps its last row: the old table's rows first (in rowid
order), then the blocks in block order, as :func:`..store.taskblocks.read_run`
does. The answer is a :class:`Snapshot`: the few columns that are counted,
bucketed and sorted as numpy arrays in task order (one entry per task), and
the rows themselves in Arrow, from which only the rows shown (a sample, the
slowest, a page of failures) are ever turned into Python objects.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ...store import taskblocks

#: The columns the dashboard shows; the others (hashes, artifact) are not kept.
COLUMNS = ("task_index", "key", "status", "attempts", "duration_s", "started_at", "worker",
           "metrics", "error", "reused_from")
_SCHEMA = pa.schema([(name, taskblocks.COLUMNS[name]) for name in COLUMNS])
#: A run read in many small parts (an old-style run followed poll by poll) is
#: merged into one when it has more than this many: taking rows from an
#: Arrow table of thousands of chunks is slow.
_MAX_PARTS = 64


@dataclass(frozen=True)
class Snapshot:
    """A run's tasks at one moment, one entry per task, in task order."""

    rows: pa.Table               #: every row read (a task written twice, twice)
    row: np.ndarray              #: per task: its row in ``rows`` (the last written)
    task_index: np.ndarray       #: per task: its index
    status: np.ndarray           #: per task: a code into ``statuses``
    statuses: tuple              #: the status names (``None`` for a missing one)
    duration: np.ndarray         #: per task: seconds, NaN where none
    started: np.ndarray          #: per task: when it started (epoch seconds), NaN where none
    reused: np.ndarray           #: per task: whether it names another run's model

    def __len__(self) -> int:
        return len(self.task_index)

    @cached_property
    def trained(self) -> np.ndarray:
        """Positions of the tasks that trained (not reused) and have a
        duration: the summary's task time, the histogram and the slowest."""
        return np.flatnonzero(~self.reused & ~np.isnan(self.duration))

    @cached_property
    def trained_durations(self) -> np.ndarray:
        return self.duration[self.trained]

    @cached_property
    def done(self) -> int:
        """Tasks that ran or were reused: every status but ``cancelled`` (a
        task a stopped run never started). The one count of done tasks the
        runs table, the run's summary and its timeline all show."""
        return len(self) - int(self.status_in(("cancelled",)).sum())

    def counts(self) -> dict[str | None, int]:
        """Tasks per status, by status name (as SQL's ``GROUP BY status``)."""
        found = np.bincount(self.status, minlength=len(self.statuses))
        named = sorted((s for s, n in zip(self.statuses, found) if n),
                       key=lambda s: (s is not None, s or ""))
        return {s: int(found[self.statuses.index(s)]) for s in named}

    def status_in(self, names: Iterable[str]) -> np.ndarray:
        """Per task: whether its status is one of ``names``."""
        codes = [i for i, s in enumerate(self.statuses) if s in set(names)]
        return np.isin(self.status, codes)

    def column(self, name: str, tasks: np.ndarray) -> pa.Array:
        """Column ``name`` of the tasks at positions ``tasks`` (in task order)."""
        return self.rows.column(name).take(pa.array(self.row[tasks])).combine_chunks()

    def records(self, tasks: np.ndarray, columns: Sequence[str]) -> list[tuple]:
        """The tasks at positions ``tasks`` as tuples of ``columns``: what a
        few shown rows need, never the whole run."""
        if len(tasks) == 0:
            return []
        taken = self.rows.select(list(columns)).take(pa.array(self.row[tasks]))
        return list(zip(*(column.to_pylist() for column in taken.columns)))


class RunTasks:
    """One run's tasks, read incrementally; :meth:`refresh` from any thread."""

    def __init__(self, run_id: int, tasks: int = 0) -> None:
        self.run_id = run_id
        self.blocks_read = 0  #: blocks decoded so far (each exactly once)
        self._lock = threading.Lock()
        self._parts: list[pa.Table] = []
        self._rows = 0
        self._block = 0          # last block_id read
        self._rowid: int | None = None  # last rowid of the old tasks table read
        self._complete = False   # read after the run stopped: nothing more comes
        self._position = np.full(tasks, -1, np.int64)  # task_index -> row, -1: none yet
        self._statuses: list[str | None] = []
        self._status: list[np.ndarray] = []  # per row, codes into _statuses
        self._duration: list[np.ndarray] = []
        self._started: list[np.ndarray] = []
        self._reused: list[np.ndarray] = []
        self._snapshot: Snapshot | None = None

    def refresh(self, conn: sqlite3.Connection, live: bool) -> Snapshot:
        """The run's tasks, reading from ``conn`` only what was written since
        the last refresh. ``live``: the run may still write; once refreshed
        with it false, the store is not asked again."""
        with self._lock:
            if not self._complete:
                self._read_old_rows(conn)
                self._read_blocks(conn)
                self._complete = not live
            if self._snapshot is None:
                self._snapshot = self._make_snapshot()
            return self._snapshot

    def _read_old_rows(self, conn: sqlite3.Connection) -> None:
        names = ", ".join(COLUMNS)
        if self._rowid is None:  # the run's rows, by the (run_id, task_index) index:
            rows = conn.execute(  # one per task there, no order needed
                f"SELECT rowid, {names} FROM tasks WHERE run_id = ?", (self.run_id,)
            ).fetchall()
        else:  # rows added since: a range of rowids (``+`` keeps SQLite off the index)
            rows = conn.execute(f"SELECT rowid, {names} FROM tasks WHERE rowid > ? AND "
                                "+run_id = ? ORDER BY rowid", (self._rowid, self.run_id)
                                ).fetchall()
        if rows:
            rowids, *columns = zip(*rows)
            self._rowid = max(rowids)
            self._append(pa.Table.from_arrays(
                [pa.array(values, kind) for values, kind in zip(columns, _SCHEMA.types)],
                schema=_SCHEMA))

    def _read_blocks(self, conn: sqlite3.Connection) -> None:
        # only the shown columns are decompressed: the identity and hashes
        # are half a block's decoding time and never shown
        for block_id, rows in taskblocks.run_blocks(conn, self.run_id, COLUMNS,
                                                    after=self._block):
            self._append(rows)
            self._block = block_id
            self.blocks_read += 1

    def _append(self, part: pa.Table) -> None:
        """Rows read: kept, their vectorised columns extracted, and each task's
        position moved to its last row."""
        if part.num_rows == 0:
            return
        index = part.column("task_index").to_numpy()
        if index.min() < 0:
            raise ValueError(f"run {self.run_id} has a task with a negative task_index")
        count = len(index)
        if count > 1 and np.any(np.diff(index) <= 0):  # a task twice in the part
            _, first_of_reversed = np.unique(index[::-1], return_index=True)
            last = count - 1 - first_of_reversed
        else:
            last = np.arange(count)
        top = int(index.max()) + 1
        if top > len(self._position):
            grown = np.full(max(top, 2 * len(self._position)), -1, np.int64)
            grown[:len(self._position)] = self._position
            self._position = grown
        self._position[index[last]] = self._rows + last
        self._rows += count
        self._parts.append(part)
        if len(self._parts) > _MAX_PARTS:
            self._parts = [pa.concat_tables(self._parts).combine_chunks()]
        encoded = pc.dictionary_encode(part.column("status")).combine_chunks()
        codes = np.array([self._code(s) for s in encoded.dictionary.to_pylist()]
                         + [self._code(None)], np.int16)
        missing = len(codes) - 1  # a null status
        self._status.append(codes[pc.fill_null(encoded.indices, missing).to_numpy()])
        self._duration.append(pc.fill_null(part.column("duration_s"), np.nan)
                              .to_numpy().astype(np.float64, copy=False))
        self._started.append(pc.fill_null(part.column("started_at"), np.nan)
                             .to_numpy().astype(np.float64, copy=False))
        self._reused.append(pc.is_valid(part.column("reused_from")).to_numpy())
        self._snapshot = None

    def _code(self, status: str | None) -> int:
        if status not in self._statuses:
            self._statuses.append(status)
        return self._statuses.index(status)

    def _make_snapshot(self) -> Snapshot:
        tasks = np.flatnonzero(self._position >= 0)
        row = self._position[tasks]

        def per_task(parts: list[np.ndarray], kind: type) -> np.ndarray:
            if len(parts) > 1:  # keep them joined: the next refresh adds to one array
                parts[:] = [np.concatenate(parts)]
            return parts[0][row] if parts else np.zeros(0, kind)

        rows = (pa.concat_tables(self._parts) if self._parts
                else _SCHEMA.empty_table())
        return Snapshot(rows=rows, row=row, task_index=tasks,
                        status=per_task(self._status, np.int16),
                        statuses=tuple(self._statuses),
                        duration=per_task(self._duration, np.float64),
                        started=per_task(self._started, np.float64),
                        reused=per_task(self._reused, bool))
