"""A store's checkpoints (``checkpoints/`` beside ``artifacts/``; the layout
is :mod:`manymodels.engine.checkpointspace`'s), and collecting those no
unfinished task can use, for :meth:`Store.gc`.

A slot is kept while the run that owns it is running (its driver holds the
owner's lock), and while it may be resumed: it goes once a finished model
of its task's identity is in the store (a re-run reuses that model), once
the run that saved it was deleted, or when it holds no checkpoint at all.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import shutil
import sqlite3
import time
from pathlib import Path

import pyarrow.compute as pc

from ..engine.checkpointfiles import slot_manifest
from ..engine.checkpointspace import (
    CLAIMED,
    JOURNAL,
    OWNERS,
    drop_slot,
    identity_of,
    owner_alive,
)
from ..engine.messages import Status
from . import artifacts, taskblocks

FOLDER = "checkpoints"
#: The run attachment that keeps what each task of a run resumed from.
RESUMED = "resumed_from"


def read_resumed(conn: sqlite3.Connection, root: Path, run_id: int) -> dict[int, str]:
    """What each task of run ``run_id`` resumed from, or refused (task index ->
    text, as ``Run.results["resumed_from"]``): empty for a run that took no
    checkpoint, resumed nothing, or has not ended (it is kept at the end)."""
    row = conn.execute("SELECT artifact FROM attachments WHERE run_id = ? AND name = ?",
                       (run_id, RESUMED)).fetchone()
    if row is None:
        return {}
    kept = pickle.loads(artifacts.read_artifact(conn, root, row[0],
                                                f"attachment {RESUMED!r} of run {run_id}"))
    return {int(index): text for index, text in kept["by_index"].items() if text}


def collect_checkpoints(conn: sqlite3.Connection, root: Path) -> int:
    """Remove the checkpoint slots no unfinished task can use (see the
    module's docstring); return how many."""
    space = root / FOLDER
    if not space.is_dir():
        return 0
    began = time.time()
    slots = [slot for prefix in space.iterdir() if not prefix.name.startswith(".")
             and prefix.is_dir() for task in prefix.iterdir() if task.is_dir()
             for slot in task.iterdir() if slot.is_dir()]
    slots = [slot for slot in slots if not owner_alive(space, slot.name)]
    if not slots:
        _collect_leftovers(space, began)
        return 0
    finished = _finished_identities(conn, {identity_of(slot.parent.name) for slot in slots})
    runs = {run for (run,) in conn.execute("SELECT run_id FROM runs")}
    removed = 0
    for slot in slots:
        if identity_of(slot.parent.name) in finished or _useless(slot, runs, began):
            if not drop_slot(slot, "gc"):  # claimed meanwhile
                continue
            removed += 1
            with contextlib.suppress(OSError):
                slot.parent.rmdir()
                slot.parent.parent.rmdir()
    _collect_leftovers(space, began)
    return removed


def _useless(slot: Path, runs: set[int], began: float) -> bool:
    """A slot with no readable manifest (older than the collection), or
    whose run was deleted: the run that claimed it last (a run that resumed
    a dead run's slot and saved nothing new yet), else the run that saved it."""
    manifest = slot_manifest(slot)
    if manifest is None:
        try:
            return slot.stat().st_mtime < began
        except OSError:
            return False
    run_id = manifest.get("run_id") if isinstance(manifest, dict) else None
    with contextlib.suppress(OSError, ValueError, AttributeError):
        claimed = json.loads((slot / CLAIMED).read_text()).get("run_id")
        if isinstance(claimed, int):
            run_id = claimed
    return run_id is not None and run_id not in runs


def _finished_identities(conn: sqlite3.Connection, wanted: set[str]) -> set[str]:
    """Those of the identities ``wanted`` that some run finished ok."""
    found: set[str] = set()
    for (run_id,) in conn.execute("SELECT run_id FROM runs").fetchall():
        tasks = taskblocks.read_run(conn, run_id, ["identity", "status"], ordered=False)
        if not tasks.num_rows:
            continue
        ok = tasks.filter(pc.equal(tasks["status"], Status.OK.value))["identity"]
        found.update(i for i in pc.unique(ok.drop_null()).to_pylist() if i in wanted)
        if found >= wanted:
            break
    return found


def _collect_leftovers(space: Path, began: float) -> None:
    """Owner locks and journals of runs no longer running (a lock made in the
    last minute is left: its driver may not have locked it yet)."""
    for folder, suffix in ((space / OWNERS, ".lock"), (space / JOURNAL, "")):
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            token = entry.name.removesuffix(suffix) if suffix else entry.name
            with contextlib.suppress(OSError):
                if entry.stat().st_mtime > began - 60:
                    continue
            if not owner_alive(space, token):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
