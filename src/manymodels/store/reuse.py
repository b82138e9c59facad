"""What a run can reuse from the store: for each task, the latest task of an
earlier run that trained its identity and whose model can still be loaded.

The runs that trained something are read newest first, one columnar read and
one vectorised match each (task by task when the run had the same tasks,
else a hash join), until every identity is found: an unchanged re-run reads
one run. When every row a run trained is reused at its own task number, the
recorder names that run instead of copying its rows (``same_as``, see
:func:`.taskblocks.insert_same_as`). Stores written before task blocks are
then looked up per identity, in the old ``tasks`` table.
"""

from __future__ import annotations

import binascii
import json
import sqlite3
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..engine.metricpacks import MetricTexts
from ..identity.hashing import TaskIdentities
from ..inputs.tables import fixed_width_bytes, one_array
from . import artifacts, database, packs, taskblocks

#: What reuse reads of an earlier run's trained rows first: what matching and
#: naming that run check (identity, status, error; key), and what a reused
#: task takes of them in either case (size, metrics).
_MATCH_COLUMNS = ("identity", "status", "reused_from", "error", "size", "metrics", "key")
#: What it reads after, where it needs them: what a copied row takes (the
#: artifact is a million 82-byte locators, made as text from their parts or
#: decompressed: an unchanged re-run that names the run whose models are all
#: in packs known whole reads none of them).
_COPY_COLUMNS = ("artifact", "duration_s")


def _runs_that_trained(conn: sqlite3.Connection) -> list[int]:
    return [run_id for (run_id,) in conn.execute(
        "SELECT DISTINCT b.run_id FROM task_blocks b JOIN runs r ON r.run_id = b.run_id "
        "WHERE b.trained > 0 AND coalesce(r.backend, '') NOT LIKE 'mm.linear%' "
        "ORDER BY b.run_id DESC")]


def _trained_packs_whole(conn: sqlite3.Connection, run_id: int) -> bool:
    """Whether every pack that ``run_id``'s blocks which trained something
    wrote is whole: each locator those blocks hold then names bytes that are
    there (the models they trained are in no other packs). False for a run
    without such blocks (a store's rows written before blocks)."""
    column = taskblocks.block_column(conn, "written_packs")
    written = [blob for (blob,) in conn.execute(
        f"SELECT {column} FROM task_blocks WHERE run_id = ? AND trained > 0", (run_id,))]
    return bool(written) and packs.all_whole(conn, written)


def may_have_trained(conn: sqlite3.Connection, run_id: int, prefixes: np.ndarray) -> bool:
    """Whether ``run_id`` may have trained a task whose identity starts with
    one of ``prefixes``: False only when every block that trained something
    keeps its prefixes and none matches (then the run need not be read)."""
    def any_known(known: np.ndarray, wanted: np.ndarray) -> bool:
        at = np.minimum(np.searchsorted(known, wanted), known.size - 1)
        return bool((known[at] == wanted).any())

    # a run that trained any of them most often trained the first ones too:
    # a thousand looked up first, in each block's sorted prefixes as it is
    # read (an unchanged re-run stops at the first block), the rest in all
    # of them merged
    first, kept = prefixes[:1024], []
    for (block_id,) in conn.execute("SELECT block_id FROM task_blocks WHERE run_id = ? "
                                    "AND trained > 0 ORDER BY block_id", (run_id,)).fetchall():
        row = conn.execute("SELECT trained_identities FROM task_blocks WHERE block_id = ?",
                           (block_id,)).fetchone()
        if row is None:
            continue  # deleted meanwhile, with its run
        if row[0] is None:
            return True  # a block written without them
        kept.append(np.frombuffer(row[0], dtype=np.uint64))
        if any_known(kept[-1], first):
            return True
    rest = prefixes[1024:]
    return bool(kept and rest.size) and any_known(
        np.sort(np.concatenate(kept), kind="stable"), rest)


def _has_legacy_rows(conn: sqlite3.Connection) -> bool:
    return conn.execute("SELECT 1 FROM tasks LIMIT 1").fetchone() is not None


def _same_tasks(wanted: TaskIdentities, candidates: pa.Array, task_index: pa.ChunkedArray,
                positions: np.ndarray, open_tasks: np.ndarray | None = None) -> pa.Array | None:
    """Where each of ``wanted`` (every task's identity, in task order) is
    among ``candidates`` (an earlier run's trained tasks' identities, at
    ``positions`` of its rows, ``task_index`` their task numbers there; null
    where a task is not), when that run had the same tasks: each it trained
    then has its own identity at its own number, checked at once (a tenth of
    a hash join's time for an unchanged re-run of a million); None when not,
    or when one of those is not among ``open_tasks`` (a mask: the tasks not
    yet found in a later run)."""
    count = len(wanted)
    if len(candidates) > count or len(candidates) == 0:
        return None
    numbers = task_index.to_numpy()[positions] if len(positions) != len(task_index) \
        else task_index.to_numpy()
    if numbers.min() < 0 or numbers.max() >= count or np.bincount(numbers).max() != 1:
        return None  # not each task once
    if open_tasks is not None and not open_tasks[numbers].all():
        return None
    if not _equal_at(wanted, numbers, candidates):
        return None
    at = np.zeros(count, dtype=np.int64)
    at[numbers] = np.arange(len(numbers))
    missing = None
    if len(numbers) < count:  # tasks that run did not train
        missing = np.ones(count, dtype=bool)
        missing[numbers] = False
    return pa.array(at, mask=missing)


def _equal_at(wanted: TaskIdentities, numbers: np.ndarray,
              candidates: pa.Array | pa.ChunkedArray) -> bool:
    """Whether the identities ``wanted`` at ``numbers`` equal ``candidates``
    (stored hex identities), one by one: as rows of bytes, a block at a
    time (the stored digits turned into bytes: a million of ours never
    written out as text), else by Arrow."""
    ours = wanted.identity_bytes()
    chunks = candidates.chunks if isinstance(candidates, pa.ChunkedArray) else [candidates]
    if ours is not None:
        start = 0
        for chunk in chunks:
            if len(chunk) == 0:
                continue
            digits = fixed_width_bytes(chunk)
            if digits is None or digits.shape[1] != 2 * ours.shape[1]:
                break
            try:
                theirs = np.frombuffer(binascii.unhexlify(digits), dtype=np.uint8)
            except binascii.Error:  # not hex digits: no identity of ours
                return False
            if not (ours[numbers[start:start + len(chunk)]] == theirs.reshape(len(chunk), -1)
                    ).all():
                return False
            start += len(chunk)
        else:
            return True
    return pc.all(pc.equal(wanted.identity.take(pa.array(numbers)), candidates)).as_py()


class ReuseSearch:
    """One run's search for what it can reuse: its tasks' ``identities`` and
    encoded ``keys``, looked up in the store at ``root`` on ``conn``."""

    def __init__(self, conn: sqlite3.Connection, root: Path, identities: TaskIdentities,
                 keys: pa.Array | Callable[[], pa.Array]) -> None:
        self.conn, self.root = conn, root
        self.identities, self._keys = identities, keys
        #: (run, tasks, its held count) of each run every row of which that
        #: trained is reused (the count as :func:`.taskblocks.held_count`
        #: gave it before the run's rows were read)
        self.same_as: list[tuple[int, int, int]] = []
        #: The metrics of the tasks reused from each run in ``same_as``, by run
        #: (their rows in :meth:`find`'s table have none: see :class:`MetricTexts`)
        self.metric_texts: dict[int, MetricTexts] = {}

    @property
    def keys(self) -> pa.Array:
        """The run's encoded keys (given as an array, or as the function that
        makes them: a search that names a run by its input's digest needs none)."""
        if callable(self._keys):
            self._keys = self._keys()
        return self._keys

    def find(self) -> pa.Table | None:
        """For each task, the latest task that trained its identity, if its
        model can still be loaded (its artifact is in the index, its file or
        pack there and whole, and no load found it corrupt), as a table:
        ``task_index`` (this run's), ``reused_from`` (the run that trained
        it), ``has_model``, and, unless ``by_reference`` (see
        :meth:`_names_every_trained_row`), ``metrics``, ``artifact``, ``size``
        and ``duration_s`` (the metrics of the others are in
        :attr:`metric_texts`, by the run they are reused from).

        None when nothing is reused (see the module's docstring for how).
        All read in one read transaction: a run's columns read apart match."""
        with database.read_snapshot(self.conn):
            return self._find()

    def _find(self) -> pa.Table | None:
        self.same_as, self.metric_texts = [], {}
        runs = _runs_that_trained(self.conn)
        if runs and self.identities.input_digest is not None:
            same = self._run_of_same_input(runs)
            named = None if same is None else self._same_input(same)
            if named is not None:
                return named
        identities, prefixes = self.identities, self.identities.prefixes
        left = np.arange(len(identities))
        found: list[pa.Table] = []
        for run_id in runs:
            if left.size == 0:
                break
            if not may_have_trained(self.conn, run_id, prefixes[left]):
                continue  # none of these identities is among what it trained
            held = taskblocks.held_count(self.conn, run_id)  # before its rows are read
            trained = taskblocks.read_run(self.conn, run_id, _MATCH_COLUMNS,
                                          trained_only=True, ordered=False)
            positions = taskblocks.trained_rows(self.conn, trained)
            if positions.size == 0:
                continue
            # only the identities are matched; the rest is taken for the matches alone
            candidates = trained["identity"] if positions.size == trained.num_rows else \
                trained["identity"].take(pa.array(positions))
            every = left.size == len(identities)
            open_tasks = None
            if not every:
                open_tasks = np.zeros(len(identities), dtype=bool)
                open_tasks[left] = True
            at = _same_tasks(identities, candidates, trained["task_index"], positions,
                             open_tasks)
            packs_whole = _trained_packs_whole(self.conn, run_id)
            sure = False  # every model those rows name can be loaded, known without artifacts
            if at is not None:
                sure = packs_whole and self._all_in_packs(trained, positions)
                if not sure:
                    trained = self._with_copy_columns(run_id, trained)
                if self._names_every_trained_row(run_id, trained, positions, packs_whole,
                                                 sure):
                    found.append(self._reused_by_reference(run_id, trained, positions, at,
                                                           held))
                    left = left[~at.is_valid().to_numpy(zero_copy_only=False)[left]]
                    continue
            if "artifact" not in trained.column_names:
                trained = self._with_copy_columns(run_id, trained)
            if at is not None and not every:  # by task number: by place in ``left``
                at = at.take(pa.array(left))
            if at is None:  # another plan: a hash join
                names = identities.identity
                at = pc.index_in(names if every else names.take(pa.array(left)),
                                 value_set=candidates)
            hit = at.is_valid().to_numpy(zero_copy_only=False)
            if not hit.any():
                continue
            rows = trained.select(["artifact", "size", "metrics", "duration_s"]).take(
                pa.array(positions[at.drop_null().to_numpy()]))
            del trained
            loadable = self._loadable_mask(rows, packs_whole)
            matched = left[hit][loadable]
            if not loadable.all():
                rows = rows.filter(pa.array(loadable))
            found.append(pa.table({
                "task_index": pa.array(matched, pa.int64()),
                "reused_from": pa.repeat(pa.scalar(run_id, pa.int64()), len(matched)),
                "has_model": rows["artifact"].is_valid(),
                "by_reference": pa.repeat(pa.scalar(False), len(matched)),
                "artifact": rows["artifact"], "size": rows["size"],
                "metrics": rows["metrics"], "duration_s": rows["duration_s"]}))
            keep = np.ones(left.size, dtype=bool)
            keep[np.flatnonzero(hit)[loadable]] = False
            left = left[keep]
        if left.size and _has_legacy_rows(self.conn):
            found.append(self._legacy_reusable(left))
        found = [part for part in found if part.num_rows]
        if not found:
            return None
        reused = pa.concat_tables(found, promote_options="default").combine_chunks()
        if len(found) > 1:  # in task order, as the results are filled fastest
            reused = reused.take(pc.sort_indices(reused["task_index"]))
        return reused

    def _run_of_same_input(self, runs: list[int]) -> int | None:
        """The run whose trained rows this run's input trained, known by the
        input's digest (:mod:`manymodels.identity.inputdigest`) without an
        identity made: the latest run that trained anything (``runs[0]``;
        ``runs``: those runs, latest first) where it recorded this digest;
        else the run that the latest run of this digest named whole, where
        that run came after every run that trained anything had ended (the
        runs since trained nothing: the search would name the same run
        again; a store's first run after an upgrade, say, named the run
        before it by the long way). None otherwise."""
        conn, digest = self.conn, self.identities.input_digest
        for run_id, started, detail in conn.execute(
                "SELECT run_id, started_at, code_detail FROM runs WHERE run_id >= ? "
                "ORDER BY run_id DESC", (runs[0],)).fetchall():
            if not detail or json.loads(detail).get("input_digest") != digest:
                continue
            if run_id == runs[0]:
                return run_id
            blocks = conn.execute("SELECT same_as, tasks FROM task_blocks WHERE run_id = ?",
                                  (run_id,)).fetchall()
            if len(blocks) != 1 or blocks[0][0] is None or blocks[0][1] != len(
                    self.identities) or not taskblocks.run_has_ended(conn, run_id):
                return None
            (late,) = conn.execute(  # a run that trained on after this one began
                "SELECT COUNT(*) FROM runs WHERE run_id IN (SELECT run_id FROM task_blocks "
                "WHERE trained > 0) AND (status = 'running' OR finished_at IS NULL "
                "OR finished_at > ?)", (started,)).fetchone()
            return int(blocks[0][0]) if late == 0 else None
        return None

    def _same_input(self, run_id: int) -> pa.Table | None:
        """Every task reused from ``run_id`` by reference, found without
        making or comparing an identity, where that run's identities are
        this run's, task by task (:meth:`_run_of_same_input`), it trained
        each of this run's tasks once, and it may be named
        (:meth:`_names_every_trained_row`); None otherwise, and the search
        goes on as it always does. What it finds is what that search would."""
        count = len(self.identities)
        held = taskblocks.held_count(self.conn, run_id)  # before its rows are read
        trained = taskblocks.read_run(self.conn, run_id, _MATCH_COLUMNS[1:],
                                      trained_only=True, ordered=False)
        positions = taskblocks.trained_rows(self.conn, trained)
        if positions.size != count or count == 0:
            return None
        numbers = trained["task_index"].to_numpy()
        numbers = numbers if positions.size == len(numbers) else numbers[positions]
        if numbers.min() < 0 or numbers.max() >= count or np.bincount(numbers).max() != 1:
            return None  # not each task once
        at = np.empty(count, dtype=np.int64)
        at[numbers] = np.arange(count)
        packs_whole = _trained_packs_whole(self.conn, run_id)
        sure = packs_whole and self._all_in_packs(trained, positions)
        if not sure:
            trained = self._with_copy_columns(run_id, trained)
        if not self._names_every_trained_row(run_id, trained, positions, packs_whole, sure,
                                             keys_known=True):
            return None
        return self._reused_by_reference(run_id, trained, positions, pa.array(at),
                                         held).combine_chunks()

    def _with_copy_columns(self, run_id: int, trained: pa.Table) -> pa.Table:
        """``trained`` (``run_id``'s rows as :func:`.taskblocks.read_run` read
        them, in :meth:`find`'s read transaction) with :data:`_COPY_COLUMNS`."""
        extra = taskblocks.read_run(self.conn, run_id, _COPY_COLUMNS, trained_only=True,
                                    ordered=False)
        if not np.array_equal(extra["task_index"].to_numpy(), trained["task_index"].to_numpy()):
            raise RuntimeError(f"run {run_id}'s rows read twice in one transaction differ")
        for name in _COPY_COLUMNS:
            trained = trained.append_column(name, extra[name])
        return trained

    def _all_in_packs(self, trained: pa.Table, positions: np.ndarray) -> bool:
        """Whether every model the rows at ``positions`` name is packed (a
        block the writer listed its packs in packs every model under
        :data:`~.artifacts.SMALL_ARTIFACT`, and only those) and none was
        found corrupt: with the run's packs whole, each can then be loaded."""
        if self.conn.execute("SELECT 1 FROM corrupt_artifacts LIMIT 1").fetchone():
            return False
        sizes = trained["size"] if positions.size == trained.num_rows else \
            trained["size"].take(pa.array(positions))
        largest = pc.max(sizes).as_py()
        return largest is None or largest < artifacts.SMALL_ARTIFACT

    def _names_every_trained_row(self, run_id: int, trained: pa.Table,
                                 positions: np.ndarray, packs_whole: bool,
                                 sure: bool = False, keys_known: bool = False) -> bool:
        """Whether this run may name ``run_id``'s trained rows instead of
        copying them (:func:`.taskblocks.insert_same_as`): each of them is
        one of this run's tasks at its own number (as :func:`_same_tasks`
        found) with its own key, every one's model can be loaded (``sure``:
        known so, see :meth:`_all_in_packs`), and that run has ended (no row
        of it will change). ``keys_known``: the keys are known equal (that
        run's input digest, which covers the key columns and their values,
        is this run's: :meth:`_same_input`), not compared."""
        if not taskblocks.run_has_ended(self.conn, run_id):
            return False
        rows = trained.select(["key", "size" if sure else "artifact", "metrics"])
        if positions.size != trained.num_rows:
            rows = rows.take(pa.array(positions))
        if not keys_known:
            numbers = trained["task_index"].to_numpy()[positions]
            if not pc.all(pc.equal(self.keys.take(pa.array(numbers)), rows["key"])).as_py():
                return False
        if sure:  # a model in a whole pack, or none (fit returned metrics alone, or None)
            return True
        return bool(self._loadable_mask(rows, packs_whole).all())

    def _reused_by_reference(self, run_id: int, trained: pa.Table, positions: np.ndarray,
                             at: pa.Array, held: int) -> pa.Table:
        """The tasks reused from each row ``run_id`` trained, for the results
        of this run (its store names them: see :meth:`begin`)."""
        hit = at.is_valid().to_numpy(zero_copy_only=False)
        tasks = np.flatnonzero(hit)
        rows = positions[at.drop_null().to_numpy()]
        count = len(rows)
        self.same_as.append((run_id, count, held))
        row_of = np.full(len(at), -1, dtype=np.int64)
        row_of[tasks] = rows
        self.metric_texts[run_id] = MetricTexts(trained["metrics"], row_of)
        return pa.table({
            "task_index": pa.array(tasks, pa.int64()),
            "reused_from": pa.repeat(pa.scalar(run_id, pa.int64()), count),
            # the writer's size is null exactly where the artifact is
            "has_model": trained["artifact" if "artifact" in trained.column_names
                                 else "size"].is_valid().take(pa.array(rows)),
            "by_reference": pa.repeat(pa.scalar(True), count),
            # nothing is copied from these rows: columns of no type, no buffers
            # (typed where another run's copied rows join them: see _find)
            "artifact": pa.nulls(count), "size": pa.nulls(count),
            "metrics": pa.nulls(count), "duration_s": pa.nulls(count)})

    def _loadable_mask(self, rows: pa.Table, packs_whole: bool) -> np.ndarray:
        """Which of ``rows`` (a run's trained rows) left a model that can
        still be loaded, or none (metrics alone, or nothing); ``packs_whole``: every
        pack that run wrote is whole (see :func:`_trained_packs_whole`)."""
        artifact = rows["artifact"]
        if isinstance(artifact, pa.ChunkedArray) and artifact.num_chunks > 1:
            # a run's rows as read, a chunk a block: checked chunk by chunk, not copied
            loadable = np.concatenate([artifacts.loadable_mask(
                self.conn, self.root, chunk, packs_whole) for chunk in artifact.chunks])
        else:
            loadable = artifacts.loadable_mask(self.conn, self.root, one_array(artifact),
                                               packs_whole)
        # an ok row without a model: fit returned metrics alone, or None
        loadable |= ~artifact.is_valid().to_numpy(zero_copy_only=False)
        return loadable

    def _legacy_reusable(self, left: np.ndarray) -> pa.Table:
        """What tasks ``left`` find in a store's rows written before blocks:
        the latest trained task per identity, one grouped query per 5,000."""
        by_identity: dict[str, list[int]] = {}
        for index, name in zip(left.tolist(),
                               self.identities.identity.take(pa.array(left)).to_pylist()):
            by_identity.setdefault(name, []).append(index)
        names = list(by_identity)
        rows: list[tuple] = []
        for start in range(0, len(names), 5000):  # SQLite takes 32766 parameters
            chunk = names[start:start + 5000]
            rows += self.conn.execute(
                "SELECT identity, MAX(run_id), artifact, size, metrics, duration_s FROM tasks "
                "WHERE status = 'ok' AND reused_from IS NULL AND error IS NULL AND identity IN "
                f"({','.join('?' * len(chunk))}) GROUP BY identity", chunk).fetchall()
        loadable = artifacts.loadable_artifacts(
            self.conn, self.root, {row[2] for row in rows if row[2] is not None})
        hits = [(index, *row[1:]) for row in rows
                if (row[2] in loadable if row[2] is not None else row[4] is not None)
                for index in by_identity[row[0]]]
        columns = list(zip(*hits)) if hits else [[]] * 6
        return pa.table({
            "task_index": pa.array(columns[0], pa.int64()),
            "reused_from": pa.array(columns[1], pa.int64()),
            "has_model": pa.array([artifact is not None for artifact in columns[2]], pa.bool_()),
            "by_reference": pa.repeat(pa.scalar(False), len(columns[0])),
            "artifact": pa.array(columns[2], pa.string()),
            "size": pa.array(columns[3], pa.int64()),
            "metrics": pa.array(columns[4], pa.string()),
            "duration_s": pa.array(columns[5], pa.float64())})
