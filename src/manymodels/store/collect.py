"""Collecting a store's garbage: artifacts, packs and files no run names.

Safe beside a run that writes the store (another driver's): the blocks are
decoded before the write transaction, and inside it only the blocks not yet
read; a file no row names is left until it is an hour old.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyarrow.compute as pc

from ..engine.modelfiles import FOLDER, marker_run, model_objects, remove_object
from ..inputs.objectstores import child, is_remote, redacted, shown
from . import packs, taskblocks
from .checkpoints import collect_checkpoints
from .database import INDEX_NAME, StoreError, write_error, write_transaction
from .drivers import mark_dead_runs_interrupted

#: How old a file no row names must be before it is collected: a run's
#: worker may have written it, its row on its way (a second, usually; longer
#: while another driver holds the store's lock). A crashed run's files wait.
STRAY_AGE_S = 3600.0


def collect(conn: sqlite3.Connection, root: Path | str, folder: Path,
            before_removing: Callable[[], None] | None = None) -> int:
    """Remove artifacts and packs no run references, stray files, and the
    checkpoints no unfinished task can use (:mod:`.checkpoints`); return how
    many models (and files, and checkpoints) were removed. ``root``: where
    the model files are (the store's ``folder``, or an object store's URI);
    ``folder``: where the index and the checkpoints are; ``before_removing``:
    called once the index no longer names what goes, before any file goes
    (a store on an object store publishes its index then: where it cannot,
    another machine may name the files, and none is removed).

    The blocks are read before the write transaction (a million tasks'
    locators take seconds to decode, and a run training into the store
    meanwhile would wait for its commits); inside it, only the blocks
    written since (a block id reused after a run was deleted included).
    A file no row names is left until it is :data:`STRAY_AGE_S` old: a
    worker, or a run's writer, puts a large model's file in place before
    the row that names it (:mod:`manymodels.engine.modelfiles`). One whose
    row goes now goes at once where no run is running (unless written
    since the collection began); while one runs, it waits as a stray does:
    that run's worker may have just written it again."""
    began = time.time()
    named, read = referenced_artifacts(conn)
    with write_transaction(conn, root, "gc"):
        named |= referenced_artifacts(conn, seen=read)[0]
        named.update(a for (a,) in conn.execute(
            "SELECT DISTINCT artifact FROM tasks WHERE artifact IS NOT NULL"))
        named.update(a for (a,) in conn.execute("SELECT artifact FROM attachments"))
        dead = [(sha, path) for sha, path in conn.execute(
            "SELECT sha256, path FROM artifacts") if sha not in named]
        conn.executemany("DELETE FROM artifacts WHERE sha256 = ?", [(d,) for d, _ in dead])
        known = {p for (p,) in conn.execute(
            "SELECT path FROM artifacts WHERE path IS NOT NULL")}
        referenced = {packs.parse_locator(a)[1] for a in named if packs.is_locator(a)}
        dead_packs = [(p, n) for p, n in conn.execute("SELECT pack_id, models FROM packs")
                      if p not in referenced]
        conn.executemany("DELETE FROM packs WHERE pack_id = ?", [(p,) for p, _ in dead_packs])
        # a run whose driver was killed since the store was opened reads
        # running until it is marked: it is, as opening the store marks it,
        # so that its files wait no longer than a stray's and the index is
        # compacted (another machine's driver cannot be told, and stays running)
        mark_dead_runs_interrupted(conn)
        running = {run_id for (run_id,) in conn.execute(
            "SELECT run_id FROM runs WHERE status = 'running'")}
    # a model in a file counts once its file is removed (one that could not
    # be, or must wait, is a stray the next gc removes, and counts then)
    removed = sum(1 for _, path in dead if not path) + sum(models for _, models in dead_packs)
    _compact(conn, root, running)
    if before_removing is not None:
        before_removing()
    dead_paths = {path for _, path in dead if path}
    # a run running now may have rewritten a deleted row's file (the same
    # model, trained again), its own row on its way: such a file waits as a
    # stray does; with no run running, none is on its way
    dead_before = began - STRAY_AGE_S if running else began
    listed = set()
    for relative, modified, remove in _files(root):
        listed.add(relative)
        if marker_run(relative.rpartition("/")[2]) in running:  # its workers look for it
            continue
        if relative not in dead_paths and not _STORE_NAMES.fullmatch(relative):
            continue  # not a name the store gives its files: someone else's, kept
        old_enough = modified is not None and modified < (
            dead_before if relative in dead_paths else began - STRAY_AGE_S)
        if relative not in known and old_enough and remove():
            removed += 1
    removed += len(dead_paths - listed)  # their files gone already: they went with their rows
    return removed + collect_checkpoints(conn, folder)


def _compact(conn: sqlite3.Connection, root: Path | str, running: set[int]) -> None:
    """Hand the pages the deleted rows held back to the disk (``VACUUM``),
    only where no run was running: ``VACUUM`` holds the index's write lock
    while it copies the whole index (minutes, for an index of many GB), and
    a run's writer waits a minute for its commit before its run fails. Beside
    a run, the freed pages are reused by the index's next writes instead. A
    ``VACUUM`` another process's lock keeps out is left to the next gc: what
    this one removed from the index is committed already."""
    if running:
        return
    try:
        conn.execute("VACUUM")
    except sqlite3.Error as exc:
        if "locked" in str(exc) or "busy" in str(exc):
            return
        raise write_error(root, exc, "gc could not compact the index (what it removed from "
                          "it is removed)") from exc


#: The names the store gives the files it writes under ``artifacts/``: a
#: model's (its SHA-256 under its first two digits), a temporary one beside
#: it, a run's marker. A stray of another name is not the store's, and gc
#: leaves it (a store made in a folder that had an ``artifacts/`` of its own).
_STORE_NAMES = re.compile(r"artifacts/(?:[0-9a-f]{2}/(?:[0-9a-f]{64}|\.tmp-[^/]*)|\.run-[^/]*)")


def _files(root: Path | str) -> Iterator[tuple[str, float | None, Callable[[], bool]]]:
    """The files under the store's ``artifacts/``: each one's name under
    ``root``, its modification time (None: gone meanwhile), and what removes
    it. A local store's files of another store nested in its folder are not
    its own, and are left out."""
    if is_remote(root):
        for name, _, modified in _listed_objects(str(root)):
            yield name, modified, functools.partial(remove_object, child(str(root), name))
        return
    root = Path(root)
    nested = [index.parent for index in (root / FOLDER).rglob(INDEX_NAME)]
    for file in (root / FOLDER).rglob("*"):
        if any(folder in file.parents for folder in nested) or not file.is_file():
            continue
        try:
            modified: float | None = file.stat().st_mtime
        except OSError:  # gone meanwhile
            modified = None
        yield file.relative_to(root).as_posix(), modified, functools.partial(_unlink, file)


def _listed_objects(root: str) -> list[tuple[str, int, float | None]]:
    """The model objects of the store at ``root`` (an object store's URI);
    a listing the object store refuses (no permission, the network) is a
    :class:`StoreError` naming the store, not the SDK's bare error. The
    index no longer names what gc dropped by then: their files are strays
    the next gc removes."""
    try:
        return model_objects(root)
    except (OSError, ValueError) as exc:
        raise StoreError(f"store {shown(root)!r}: gc cannot list its model files: "
                         f"{redacted(exc, root)} (the models it dropped from the index "
                         "are gone from it; their files are removed by the next gc)"
                         ) from None


def _unlink(file: Path) -> bool:
    """Remove ``file``; whether it was removed (not: gone meanwhile, or not
    removable by this user)."""
    try:
        file.unlink()
    except OSError:
        return False
    return True


def referenced_artifacts(conn: sqlite3.Connection, seen: set[tuple[int, int]] | None = None
                         ) -> tuple[set[str], set[tuple[int, int]]]:
    """Every artifact (SHA-256 or pack locator) the blocks name but those
    already ``seen`` (``(block_id, run_id)`` pairs: a block's id is reused
    after its run is deleted, a run's id never is), and the blocks read: what
    :meth:`Store.gc` keeps. A block that names another run's rows adds
    nothing: that run's own blocks name its models."""
    names: set[str] = set()
    read: set[tuple[int, int]] = set()
    for pair in conn.execute("SELECT block_id, run_id FROM task_blocks").fetchall():
        if seen and pair in seen:
            continue
        row = conn.execute("SELECT data FROM task_blocks WHERE block_id = ? AND run_id = ?",
                           pair).fetchone()
        if row is None:
            continue  # deleted meanwhile, with its run
        column = taskblocks.decode(row[0], f"task block {pair[0]} of run {pair[1]}",
                                   ["artifact"])["artifact"].drop_null()
        names.update(pc.unique(column).to_pylist())
        read.add(pair)
    return names, read
