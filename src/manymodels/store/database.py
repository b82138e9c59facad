"""The store's files: an SQLite index (WAL mode) beside the model artifacts.

Layout of a store directory (owner-only permissions)::

    index.sqlite        runs; their tasks (key, identity, status, metrics,
                        timings, error, artifact reference) as columnar blocks,
                        one row per hand-over (see :mod:`.taskblocks`); packs
                        of small models; run attachments as BLOBs
    artifacts/ab/abcd…  models of 1 MiB or more, one file each, named by SHA-256

A model under 1 MiB that a run trains goes into a *pack* (:mod:`.packs`):
many models in one BLOB row, each task naming its model by a locator
``<sha256>@<pack>/<offset>/<size>``. Every read checks the bytes against the
SHA-256 before unpickling (:mod:`.artifacts`). Larger models are
content-addressed, one ``artifacts`` row (and file) each, so a model shared by
two runs is stored
once; a reused task names the same artifact or locator as the task it reuses.
Files are written to a temporary name and renamed, and the index row that
names them is committed after, so the index never points at a half-written
file; a file, artifact or pack that no row points at is removed by :meth:`gc`.
Only the driver writes; concurrent drivers serialise on SQLite's lock.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

from ..identity.valuehash import STORE_INDEX
from .connections import IndexConnection
from .drivers import driver_label, mark_dead_runs_interrupted
from .storeerrors import (  # noqa: F401 (offered here too: callers name database.StoreError)
    StoreError,
    StoreIntegrityError,
    busy_or_write_error,
    gone_error,
    is_disk_full,
    write_error,
)

INDEX_NAME = STORE_INDEX  # (identity hashes a store's folder by its path: it knows the name)
#: The index's layout (SQLite's ``user_version``): 2 since tasks are kept as
#: blocks; 3 once a run's block names another run's rows instead of copying
#: them (``same_as``); 4 once a block keeps its packed models' locators as
#: their parts (see :data:`.packs.LOCATOR_COLUMNS`); 5 once a pack keeps
#: the head and tail its models' pickles share once (``packs.head`` and
#: ``packs.tail``: a templated pack, see :mod:`.packs`). Each is set by the
#: first block or pack that needs it, so that a manymodels that cannot read
#: it refuses the store rather than miss those tasks or misread those models.
#: A store written by a later layout is refused, not misread.
FORMAT = 5
SAME_AS_FORMAT = 3
LOCATOR_FORMAT = 4
TEMPLATE_FORMAT = 5
#: The layout every store this manymodels opens is migrated to.
_BASE_FORMAT = 2

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
    code_detail   TEXT,                   -- JSON: hashed sources and package versions
    driver        TEXT                    -- host:pid:process start of the driver writing it
);
-- a run's finished tasks, one row per hand-over of the writer: an Arrow IPC
-- stream with a row per task and the columns of the old tasks table (see
-- taskblocks); trained counts the models its tasks hold as their own: trained
-- there (not reused), or reused from a run deleted since (see deletion.py)
CREATE TABLE IF NOT EXISTS task_blocks (
    block_id INTEGER PRIMARY KEY,
    run_id   INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    tasks    INTEGER NOT NULL,
    trained  INTEGER NOT NULL,
    data     BLOB NOT NULL,
    trained_identities BLOB,              -- sorted uint64 prefixes of what it trained
    same_as  INTEGER,                     -- the block stands for that run's trained rows
    written_packs BLOB                    -- (pack_id, size) int64 rows of the packs it wrote
);
CREATE INDEX IF NOT EXISTS task_blocks_run ON task_blocks(run_id, trained);
-- stores written before task_blocks: a row per task (read, never written)
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
-- models trained (not reused) by identity: reuse looks up only these, and a
-- re-run's million reused rows cost no entry here
CREATE INDEX IF NOT EXISTS tasks_trained_identity ON tasks(identity)
    WHERE status = 'ok' AND reused_from IS NULL;
CREATE INDEX IF NOT EXISTS tasks_key ON tasks(key, run_id);
CREATE TABLE IF NOT EXISTS attachments (   -- run-level objects: a fallback model, a config
    run_id   INTEGER NOT NULL REFERENCES runs(run_id) ON DELETE CASCADE,
    name     TEXT NOT NULL,
    artifact TEXT NOT NULL,
    PRIMARY KEY (run_id, name)
);
CREATE TABLE IF NOT EXISTS corrupt_artifacts (  -- found not to match their SHA-256
    sha256   TEXT PRIMARY KEY,
    found_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS artifacts (
    sha256 TEXT PRIMARY KEY,
    size   INTEGER NOT NULL,
    blob   BLOB,                          -- small models live here
    path   TEXT                           -- large ones in artifacts/, relative path
);
CREATE INDEX IF NOT EXISTS artifacts_files ON artifacts(path) WHERE path IS NOT NULL;
-- AUTOINCREMENT (stores created since it was added; an older store's table
-- keeps SQLite's plain rowids): a pack's id is never given again, so a
-- locator naming a deleted pack never finds another one's bytes in its place
CREATE TABLE IF NOT EXISTS packs (        -- small models, many per BLOB (see locators)
    pack_id INTEGER PRIMARY KEY AUTOINCREMENT,
    size    INTEGER NOT NULL,
    models  INTEGER NOT NULL,
    blob    BLOB NOT NULL,
    head    BLOB,                         -- a templated pack: what every model's pickle
    tail    BLOB                          -- starts and ends with (blob: the rest, joined)
);
"""


#: The page size of a new store's index (an existing one keeps its own).
PAGE_SIZE = 1 << 16
#: Seconds a read-only connection waits for a writer that holds the index
#: locked, before it says the store is busy (SQLite's own default).
READ_BUSY_S = 5.0
#: Seconds a write waits for another process's write lock (a long gc) before
#: it fails, saying the store is busy.
BUSY_S = 60.0


def connect(path: Path, read_only: bool = False, *, opened: bool = False) -> sqlite3.Connection:
    """Open (and create, or migrate) the index; a damaged one is refused by name.
    ``opened``: this process opened it for writing already (another thread's
    connection): only the connection and its settings."""
    index = Path(path) / INDEX_NAME
    try:
        if read_only:
            return _connect_read_only(index)
        existed = index.exists()
        # an index of 0 bytes with no write-ahead log is a store not made yet
        # (check_existing_index refused one beside models): made as a new one
        fresh = not existed or (index.stat().st_size == 0 and not _has_content(
            index.with_name(INDEX_NAME + "-wal")))
        conn = sqlite3.connect(index, timeout=BUSY_S, isolation_level=None,
                               check_same_thread=False, factory=IndexConnection)
        if opened:
            _configure(conn)
            _check_format(conn, index)
            return conn
        if fresh:
            if not existed:
                os.chmod(index, 0o600)
            # pages of 64 KiB (not 4): a run's packs and blocks are large BLOBs,
            # written twice (the WAL, then the checkpoint) page by page, and a
            # packed model is read by walking its pack's chain of pages
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")
        if not fresh:
            _check_is_store(conn, index)
        _switch_to_wal(conn)
        _configure(conn)
        _check_format(conn, index)
        # the tables made and the columns added since in one write transaction:
        # two drivers opening a store of an older layout at once would both
        # find a column missing, and the second to add it would fail
        try:
            conn.executescript(f"BEGIN IMMEDIATE; {SCHEMA}")
            _migrate(conn)
            conn.execute("COMMIT")
        except BaseException:
            rollback_quietly(conn)
            raise
        try:  # (a full disk: they read running until an open with room)
            mark_dead_runs_interrupted(conn)
        except sqlite3.OperationalError as exc:
            if not is_disk_full(exc):
                raise
        return conn
    except sqlite3.DatabaseError as exc:
        raise _index_error(index, exc) from exc


def _configure(conn: sqlite3.Connection) -> None:
    """A writing connection's settings (the write-ahead log is the file's)."""
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.execute(f"PRAGMA busy_timeout={int(BUSY_S * 1000)}")
    # a page cache of 16 MiB (not SQLite's 2): a second's task block and
    # packs fit in it; a larger one was held for the whole run
    conn.execute("PRAGMA cache_size=-16384")


def _connect_read_only(index: Path) -> sqlite3.Connection:
    """A store on read-only media, or one this user may only read: SQLite's
    WAL needs to write its shared-memory file even to read, unless the index
    is opened as immutable (nothing writes it while it is read)."""
    if not index.exists():
        raise StoreError(f"store index {str(index)!r} does not exist")
    uri = f"file:{quote(str(index.resolve()))}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None,
                               timeout=READ_BUSY_S, factory=IndexConnection)
        conn.execute("SELECT count(*) FROM runs").fetchone()
    except sqlite3.OperationalError as exc:
        if _writable_beside(index):  # a live store: immutable would read it stale, forever
            busy = (f": another process held it locked for {READ_BUSY_S:g} s; try again"
                    if "locked" in str(exc) else "")
            raise StoreError(f"store index {str(index)!r} could not be read ({exc}){busy}"
                             ) from exc
        conn = sqlite3.connect(uri + "&immutable=1", uri=True, check_same_thread=False,
                               isolation_level=None, factory=IndexConnection)
        conn.execute("SELECT count(*) FROM runs").fetchone()
    _check_is_store(conn, index)
    _check_format(conn, index)
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'task_blocks'").fetchone() is None:
        # a store written before blocks, that this connection may not change:
        # an empty table of its own stands in (readers then find rows only)
        conn.execute("CREATE TEMP TABLE task_blocks (block_id INTEGER PRIMARY KEY, run_id "
                     "INTEGER, tasks INTEGER, trained INTEGER, data BLOB, "
                     "trained_identities BLOB, same_as INTEGER, written_packs BLOB)")
    return conn


def _writable_beside(index: Path) -> bool:
    """Whether SQLite could keep its WAL's shared memory beside ``index``
    (its folder writable, and that file, where it is there): a store a
    writer may be writing. Only where it could not is the index opened as
    immutable, whose reads never see a write made after it was opened."""
    shared = index.with_name(INDEX_NAME + "-shm")
    return os.access(index.parent, os.W_OK | os.X_OK) and (
        not shared.exists() or os.access(shared, os.R_OK | os.W_OK))


def _has_content(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


def _check_is_store(conn: sqlite3.Connection, index: Path) -> None:
    """Refuse an existing SQLite file that is not a store's index (tables, but
    not a ``runs`` table of a store's columns) before anything is written to
    it: its tables were someone else's, and a store's would have been added
    beside them."""
    tables = {name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return
    columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if not columns >= _RUNS_COLUMNS:
        conn.close()
        raise StoreError(f"store index {str(index)!r} is a SQLite file of something else "
                         f"(its tables: {', '.join(sorted(tables)[:5])}): not a manymodels "
                         "store index; give the store a directory of its own")


#: Columns every store's ``runs`` table has had, in every layout.
_RUNS_COLUMNS = frozenset({"run_id", "started_at", "status"})


def check_existing_index(index: Path) -> None:
    """An existing index checked by a read-only connection before this
    process writes anything to it or beside it (``artifacts/``, the
    write-ahead log, a migration): another program's SQLite file, a layout
    newer than this manymodels, or an index left empty (a truncated one),
    each refused by name."""
    try:
        size = index.stat().st_size
    except OSError:
        return
    if size == 0:
        folder = index.parent / "artifacts"
        held = folder.is_dir() and any(folder.iterdir())
        if held and time.time() - index.stat().st_mtime > 10:  # (not one being made now)
            # a store whose index was cut to nothing: made anew, it would name
            # none of its models, and gc would remove them as strays
            raise StoreError(f"store index {str(index)!r} is empty (0 bytes) beside the "
                             "models of its artifacts/: it was truncated; restore it, or "
                             "give the store a directory of its own")
        return
    uri = f"file:{quote(str(index.resolve()))}?mode=ro"
    for last_try in (False, True):
        try:
            conn = sqlite3.connect(uri, uri=True, timeout=60, isolation_level=None)
        except sqlite3.Error as exc:
            raise _index_error(index, exc) from exc
        try:
            _check_is_store(conn, index)
            _check_format(conn, index)
            return
        except sqlite3.DatabaseError as exc:
            if not last_try and not _writable_beside(index):  # a read-only file system:
                uri += "&immutable=1"  # read as _connect_read_only reads it
                continue
            if last_try or not _rolled_back(index, exc):
                raise _index_error(index, exc) from exc
        finally:
            conn.close()


def _rolled_back(index: Path, exc: sqlite3.DatabaseError) -> bool:
    """Roll back the hot journal a driver killed mid-write left (creating
    the index, say), which a read-only connection cannot ("attempt to write
    a readonly database"): SQLite does it on a writable connection's first
    read, as any program opening the file would. Whether it did."""
    journal = index.with_name(index.name + "-journal")
    if "readonly" not in str(exc).replace(" ", "").lower() or not journal.exists():
        return False
    try:
        conn = sqlite3.connect(index, timeout=60, isolation_level=None)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return True


def _check_format(conn: sqlite3.Connection, index: Path) -> None:
    (version,) = conn.execute("PRAGMA user_version").fetchone()
    if version > FORMAT:
        raise StoreError(f"store index {str(index)!r} has layout {version}, newer than this "
                         f"manymodels reads ({FORMAT}): upgrade manymodels to use it")


def _index_error(index: Path, exc: sqlite3.Error) -> StoreError:
    if is_disk_full(exc):
        return write_error(index.parent, exc, "the index could not be opened")
    if "locked" in str(exc) or "busy" in str(exc):
        return StoreError(f"store index {str(index)!r} is busy: another process has held "
                          f"its write lock for a minute ({exc}); try again when it is done")
    if not index.parent.is_dir():  # (a Store opened before: its new thread's connection)
        return gone_error(index.parent, f" ({exc})")
    return StoreError(f"store index {str(index)!r} cannot be read: {exc}. It is not a "
                      "manymodels store index, or it is damaged (truncated or overwritten)")


def refuse_gone(conn: IndexConnection, folder: Path) -> None:
    """Refuse a write through ``conn`` where the store's folder was removed or
    moved since it opened the index (one stat: :meth:`IndexConnection.still_at`)."""
    if not conn.still_at(Path(folder) / INDEX_NAME):
        raise gone_error(folder)


def _migrate(conn: sqlite3.Connection) -> None:
    """Columns added since a store was created."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(runs)")}
    if "driver" not in columns:
        conn.execute("ALTER TABLE runs ADD COLUMN driver TEXT")
    conn.execute("DROP INDEX IF EXISTS tasks_ok_identity")  # now tasks_trained_identity
    block_columns = {row[1] for row in conn.execute("PRAGMA table_info(task_blocks)")}
    for name, kind in (("trained_identities", "BLOB"), ("same_as", "INTEGER"),
                       ("written_packs", "BLOB")):
        if name not in block_columns:
            conn.execute(f"ALTER TABLE task_blocks ADD COLUMN {name} {kind}")
    pack_columns = {row[1] for row in conn.execute("PRAGMA table_info(packs)")}
    for name in ("head", "tail"):
        if name not in pack_columns:
            conn.execute(f"ALTER TABLE packs ADD COLUMN {name} BLOB")
    raise_layout(conn, _BASE_FORMAT)


def raise_layout(conn: sqlite3.Connection, layout: int) -> None:
    """The index's layout (see :data:`FORMAT`) at least ``layout``: a store
    keeps the highest any of its blocks needs."""
    if conn.execute("PRAGMA user_version").fetchone()[0] < layout:
        conn.execute(f"PRAGMA user_version = {layout}")


def insert_run(conn: sqlite3.Connection, *, backend: str, workers: int, source: str,
               fit: str, tasks: int, key_columns: list, param_columns: list,
               code_detail: dict, started_at: float | None = None) -> int:
    """A new run's row, ``running`` and owned by this driver (inside the
    caller's transaction); its ``run_id``. ``started_at``: when it began
    (``time.time()``), now if not given."""
    return int(conn.execute(
        "INSERT INTO runs(started_at, status, backend, workers, source, fit, tasks, "
        "key_columns, param_columns, code_detail, driver) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (time.time() if started_at is None else started_at, "running", backend, workers,
         source, fit, tasks, json.dumps(key_columns), json.dumps(param_columns),
         json.dumps(code_detail), driver_label())).lastrowid)


@contextlib.contextmanager
def write_transaction(conn: sqlite3.Connection, root: Path | str, what: str
                      ) -> Iterator[None]:
    """One write transaction (``BEGIN IMMEDIATE`` ... ``COMMIT``), rolled back
    whole where the block fails; an SQLite error is a :class:`StoreError`
    naming the store (``root``) and saying that ``what`` was not done."""
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        raise busy_or_write_error(root, exc, f"{what} was not done") from exc
    try:
        yield
        conn.execute("COMMIT")
    except BaseException as exc:
        rollback_quietly(conn)  # (SQLite rolled back by itself already on some errors)
        if isinstance(exc, sqlite3.Error):
            raise busy_or_write_error(root, exc, f"{what} was not done") from exc
        raise


@contextlib.contextmanager
def read_snapshot(conn: sqlite3.Connection) -> Iterator[None]:
    """Reads that must see the index as of one moment (a run's blocks and
    the runs they name; a run's columns read apart): one read transaction,
    unless the caller's is open already."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        yield
    finally:
        if own and conn.in_transaction:
            conn.execute("COMMIT")


def rollback_quietly(conn: sqlite3.Connection) -> None:
    """Roll back if a transaction is still open (SQLite rolls back by itself on
    some errors, a full disk among them, and a second rollback would raise)."""
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass


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
