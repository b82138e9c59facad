"""The store's files: an SQLite index (WAL mode) beside the model artifacts.

Layout of a store directory (owner-only permissions)::

    index.sqlite        runs, tasks (key, identity, status, metrics, timings,
                        error, artifact reference) and small artifacts as BLOBs
    artifacts/ab/abcd…  models of 1 MiB or more, one file each, named by SHA-256

Artifacts are content-addressed, so a model shared by two runs (a reused one)
is stored once. Files are written to a temporary name and renamed, and the
index row that names them is committed after, so the index never points at a
half-written file; a file no row points at is removed by :meth:`gc`.
Only the driver writes; concurrent drivers serialise on SQLite's lock.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import tempfile
import time
from pathlib import Path

SMALL_ARTIFACT = 1 << 20
INDEX_NAME = "index.sqlite"

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id        INTEGER PRIMARY KEY AUTOINCREMENT,
    started_at    REAL NOT NULL,
    finished_at   REAL,
    status        TEXT NOT NULL,          -- running, finished, interrupted, stopped
    backend       TEXT,
    workers       INTEGER,
    source        TEXT,
    fit           TEXT,
    tasks         INTEGER,
    ok            INTEGER,
    failed        INTEGER,
    reused        INTEGER,
    wall_s        REAL,
    key_columns   TEXT,                   -- JSON list
    param_columns TEXT,                   -- JSON list
    code_detail   TEXT                    -- JSON: hashed sources and package versions
);
CREATE TABLE IF NOT EXISTS tasks (
    run_id       INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    task_index   INTEGER NOT NULL,
    key          TEXT NOT NULL,           -- JSON list of the key column values
    identity     TEXT NOT NULL,
    code_hash    TEXT, params_hash TEXT, data_hash TEXT, shared_hash TEXT,
    status       TEXT NOT NULL,
    attempts     INTEGER,
    duration_s   REAL,
    started_at   REAL,
    worker       INTEGER,
    metrics      TEXT,                    -- JSON object
    error        TEXT,
    artifact     TEXT,                    -- SHA-256 of the pickled model
    size         INTEGER,
    reused_from  INTEGER,
    PRIMARY KEY (run_id, task_index)
);
CREATE INDEX IF NOT EXISTS tasks_ok_identity ON tasks(identity) WHERE status = 'ok';
CREATE INDEX IF NOT EXISTS tasks_key ON tasks(key, run_id);
CREATE TABLE IF NOT EXISTS attachments (   -- run-level objects: a fallback model, a config
    run_id   INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    name     TEXT NOT NULL,
    artifact TEXT NOT NULL,
    PRIMARY KEY (run_id, name)
);
CREATE TABLE IF NOT EXISTS artifacts (
    sha256 TEXT PRIMARY KEY,
    size   INTEGER NOT NULL,
    blob   BLOB,                          -- small models live here
    path   TEXT                           -- large ones in artifacts/, relative path
);
"""


class StoreError(ValueError):
    """The store path cannot be used (it is a file, or not writable)."""


class StoreIntegrityError(RuntimeError):
    """An artifact's content does not match its recorded SHA-256 (tampered,
    truncated or missing); it is refused, never unpickled."""


def prepare_directory(path: Path) -> Path:
    """Create (or check) a store directory, owner-only, before any work starts."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise StoreError(f"store path {str(path)!r} is a file, not a directory")
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        (path / "artifacts").mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create store directory {str(path)!r}: {exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreError(f"store directory {str(path)!r} is not writable")
    index = path / INDEX_NAME
    if index.exists() and not os.access(index, os.R_OK | os.W_OK):
        raise StoreError(f"store index {str(index)!r} is not writable")
    return path


def connect(path: Path) -> sqlite3.Connection:
    index = Path(path) / INDEX_NAME
    fresh = not index.exists()
    conn = sqlite3.connect(index, timeout=60, isolation_level=None, check_same_thread=False)
    if fresh:
        os.chmod(index, 0o600)
    _switch_to_wal(conn)
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute("PRAGMA busy_timeout=60000")
    conn.executescript(f"BEGIN IMMEDIATE; {SCHEMA} COMMIT;")
    return conn


def _switch_to_wal(conn: sqlite3.Connection, timeout_s: float = 60.0) -> None:
    """``PRAGMA journal_mode=WAL``, waiting out other connections: the switch
    needs an exclusive lock, and SQLite answers "database is locked" at once
    instead of calling the busy handler (two drivers opening a new store at
    the same moment did, one open in eight)."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(2 * delay, 0.1)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_artifact(conn: sqlite3.Connection, root: Path, data: bytes) -> tuple[str, int]:
    """Store ``data`` (inside the caller's transaction); return (sha256, size)."""
    digest = sha256(data)
    if len(data) < SMALL_ARTIFACT:
        conn.execute("INSERT OR IGNORE INTO artifacts(sha256, size, blob) VALUES (?, ?, ?)",
                     (digest, len(data), data))
        return digest, len(data)
    relative = f"artifacts/{digest[:2]}/{digest}"
    target = root / relative
    if not target.exists():
        target.parent.mkdir(mode=0o700, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.chmod(temporary, 0o600)
            os.replace(temporary, target)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    conn.execute("INSERT OR IGNORE INTO artifacts(sha256, size, path) VALUES (?, ?, ?)",
                 (digest, len(data), relative))
    return digest, len(data)


def read_artifact(conn: sqlite3.Connection, root: Path, digest: str, what: str) -> bytes:
    """The bytes of an artifact, checked against its SHA-256."""
    row = conn.execute("SELECT size, blob, path FROM artifacts WHERE sha256 = ?",
                       (digest,)).fetchone()
    if row is None:
        raise StoreIntegrityError(f"artifact {digest} of {what} is missing from the store")
    size, blob, relative = row
    if blob is not None:
        data = bytes(blob)
    else:
        try:
            data = (root / relative).read_bytes()
        except OSError as exc:
            raise StoreIntegrityError(
                f"artifact file {relative} of {what} cannot be read: {exc}") from exc
    if len(data) != size or sha256(data) != digest:
        raise StoreIntegrityError(
            f"artifact {relative or digest} of {what} does not match its recorded "
            f"SHA-256 ({len(data)} bytes, {size} recorded): it was modified or truncated, "
            "so it is not loaded"
        )
    return data
