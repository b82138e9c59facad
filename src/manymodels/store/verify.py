"""Checking a store's artifacts against their SHA-256 when asked, like
``git fsck``: ``Store.verify()``, ``manymodels verify STORE`` and
``train(verify=True)``.

Every load checks a model's bytes, but a re-run decides what it can reuse
from the index alone (a model's pack or file is there, at its size, and no
load found it corrupt): reading a million models to reuse them would cost
more than the run. A byte flipped inside a pack is then found only when the
model is loaded. These functions read the bytes: each pack once, whole, its
models' SHA-256s checked one after another, each large artifact's file and
each run-level object (an attachment: ``select=``'s winners, an
``mm.linear`` result) once however many runs name it. What does not match is
recorded in ``corrupt_artifacts``, as a failed load records it, so the next
run trains those tasks again instead of reusing them; an artifact recorded
corrupt earlier that reads back whole now (restored from a backup) is
cleared, so it may be reused again.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..engine.messages import Status
from ..inputs.keys import decode_key
from . import artifacts, database, packs, taskblocks
from .artifacts import MISSING, MODIFIED, TRUNCATED

# What can be wrong with an artifact, as ``problem`` names it: artifacts'
# MISSING, UNREADABLE, TRUNCATED and MODIFIED.

#: The columns of :func:`verify_store`'s report.
REPORT_COLUMNS = ["run_id", "key", "attachment", "artifact", "problem", "superseded"]


def check_artifacts(conn: sqlite3.Connection, root: Path, names: Iterable[str]
                    ) -> dict[str, str]:
    """``name -> problem`` for each of ``names`` (SHA-256s or pack locators)
    whose bytes do not read back as recorded; the others are whole."""
    by_pack: dict[int, list[tuple[str, str, int, int]]] = defaultdict(list)
    problems: dict[str, str] = {}
    for name in set(names):
        if not packs.is_locator(name):
            problem = artifacts.read_unpacked(conn, root, name).problem
            if problem:
                problems[name] = problem
            continue
        try:
            digest, pack, offset, size = packs.parse_locator(name)
        except ValueError:  # a damaged index row names no place at all
            problems[name] = MISSING
            continue
        by_pack[pack].append((name, digest, offset, size))
    for pack, models in by_pack.items():
        problems.update(_check_pack(conn, pack, models))
    return problems


def _check_pack(conn: sqlite3.Connection, pack: int, models: list[tuple[str, str, int, int]]
                ) -> dict[str, str]:
    """The problems of ``models`` (locator, SHA-256, offset, size) of one
    pack, read once: a model is the pack's head, its own bytes and its tail."""
    row = packs._select_packs(conn, "SELECT blob, head, tail FROM packs WHERE pack_id = ?",
                              "SELECT blob, NULL, NULL FROM packs WHERE pack_id = ?",
                              (pack,)).fetchone()
    if row is None or row[0] is None:
        return {name: MISSING for name, *_ in models}
    blob = memoryview(bytes(row[0]))
    head, tail = bytes(row[1] or b""), bytes(row[2] or b"")
    template = len(head) + len(tail)
    problems = {}
    for name, digest, offset, size in models:
        part = size - template
        if part < 0 or offset < 0 or offset + part > len(blob):
            problems[name] = TRUNCATED
            continue
        hasher = hashlib.sha256(head)
        hasher.update(blob[offset:offset + part])
        hasher.update(tail)
        if hasher.hexdigest() != digest:
            problems[name] = MODIFIED
    return problems


def record(conn: sqlite3.Connection, problems: dict[str, str], whole: Iterable[str] = ()
           ) -> bool:
    """Record ``problems``' artifacts as corrupt, and clear ``whole`` ones
    found corrupt before, in one transaction; False when the store cannot be
    written (read-only: its loads refuse those models anyway)."""
    whole = list(whole)
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error:
        return False
    try:
        now = time.time()
        conn.executemany("INSERT OR IGNORE INTO corrupt_artifacts VALUES (?, ?)",
                         [(name, now) for name in problems])
        conn.executemany("DELETE FROM corrupt_artifacts WHERE sha256 = ?",
                         [(name,) for name in whole])
        conn.execute("COMMIT")
        return True
    except sqlite3.Error:
        database.rollback_quietly(conn)
        return False


def _run_models(conn: sqlite3.Connection, run_id: int) -> pa.Table:
    """``key`` and ``artifact`` of each task of ``run_id`` that has a model."""
    tasks = taskblocks.read_run(conn, run_id, ["key", "status", "artifact"])
    return tasks.filter(pc.and_(pc.equal(tasks["status"], Status.OK.value),
                                pc.is_valid(tasks["artifact"]))).select(["key", "artifact"])


def _latest_models(models: dict[int, pa.Table]) -> dict[str, tuple[int, str]]:
    """Each key's latest run with a model for it, and that model's artifact."""
    latest: dict[str, tuple[int, str]] = {}
    for run_id in sorted(models):
        table = models[run_id]
        for key, artifact in zip(table["key"].to_pylist(), table["artifact"].to_pylist()):
            latest[key] = (run_id, artifact)
    return latest


def verify_store(conn: sqlite3.Connection, root: Path) -> pd.DataFrame:
    """Read every artifact the store's runs name, check it against its
    SHA-256, record what does not match (see the module's docstring), and
    return one row per task or attachment whose artifact is corrupt:
    :data:`REPORT_COLUMNS` (``key`` None for an attachment, ``attachment``
    None for a task's model; ``superseded`` true where a later run holds a
    whole model for the key, which ``Store.predict`` uses instead).
    ``attrs["artifacts_checked"]``: how many distinct artifacts were read;
    ``attrs["marked"]``: whether the findings were recorded (not where the
    store is read-only, or another process held its write lock too long)."""
    with database.read_snapshot(conn):
        runs = [run_id for (run_id,) in conn.execute("SELECT run_id FROM runs ORDER BY run_id")]
        models = {run_id: _run_models(conn, run_id) for run_id in runs}
        attached = conn.execute("SELECT run_id, name, artifact FROM attachments "
                                "ORDER BY run_id, name").fetchall()
        names = {artifact for _, _, artifact in attached}
        for table in models.values():
            names.update(pc.unique(table["artifact"]).to_pylist())
        problems = check_artifacts(conn, root, names)
        marked = {name for (name,) in conn.execute("SELECT sha256 FROM corrupt_artifacts")}
    recorded = record(conn, problems, (marked & names) - set(problems))
    rows: list[tuple[Any, ...]] = []
    if problems:
        bad = pa.array(list(problems), pa.string())
        latest = _latest_models(models)
        for run_id, table in models.items():
            hit = table.filter(pc.is_in(table["artifact"], value_set=bad))
            for key, artifact in zip(hit["key"].to_pylist(), hit["artifact"].to_pylist()):
                parts = decode_key(key)
                newer = latest[key]
                rows.append((run_id, parts[0] if len(parts) == 1 else parts, None, artifact,
                             problems[artifact], newer[0] > run_id and newer[1] not in problems))
        rows += [(run_id, None, name, artifact, problems[artifact], False)
                 for run_id, name, artifact in attached if artifact in problems]
    frame = pd.DataFrame(rows, columns=REPORT_COLUMNS)
    frame.attrs["artifacts_checked"] = len(names)
    frame.attrs["marked"] = recorded
    return frame


def reused_models(conn: sqlite3.Connection, reused: pa.Table | None,
                  same_as: Iterable[tuple[int, int, int]]) -> tuple[np.ndarray, list[str]]:
    """The task numbers and artifacts of the models a run reuses: the rows
    :meth:`.reuse.ReuseSearch.find` copies, and those of each run it names
    (``same_as``: each trained row of it is the task of its own number)."""
    tasks: list[np.ndarray] = []
    names: list[str] = []
    if reused is not None:
        copied = reused.filter(pc.and_(pc.invert(reused["by_reference"]),
                                       pc.is_valid(reused["artifact"])))
        tasks.append(copied["task_index"].to_numpy())
        names += copied["artifact"].to_pylist()
    for run_id, _, _ in same_as:
        trained = taskblocks.read_run(conn, run_id, ["artifact"], trained_only=True,
                                      ordered=False)
        trained = trained.filter(pc.is_valid(trained["artifact"]))
        tasks.append(trained["task_index"].to_numpy())
        names += trained["artifact"].to_pylist()
    return (np.concatenate(tasks) if tasks else np.zeros(0, np.int64)), names


def describe_corrupt(keys: list[Any], problems: list[str], shown: int = 10) -> str:
    """``key 'a' (modified), key 'b' (missing) and 3 more``."""
    named = [f"key {key!r} ({problem})" for key, problem in zip(keys[:shown], problems)]
    more = f" and {len(keys) - shown} more" if len(keys) > shown else ""
    return ", ".join(named) + more
