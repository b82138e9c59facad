"""The local copy of a remote store's index read as files, without writing
it: what changes whenever it is written (its fingerprint), its SHA-256, and
whether it holds a run.

:mod:`.remote` asks these before it syncs or publishes the copy; they know
nothing of the object store. The fingerprint reads SQLite's shared memory
through a descriptor kept open (see :func:`_shared_memory_head`).
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from pathlib import Path

from .database import INDEX_NAME


def fingerprint_of(copy: Path) -> list:
    """What changes whenever the index in ``copy`` is written: its files'
    sizes and times, and the head of SQLite's shared-memory index of the
    log, whose change counter and last frame move with every commit (a time
    alone is as coarse as the file system's clock)."""
    marks: list = []
    for name in (INDEX_NAME, INDEX_NAME + "-wal"):
        try:
            info = os.stat(copy / name)
            marks.append([info.st_size, info.st_mtime_ns])
        except OSError:
            marks.append(None)
    head = _shared_memory_head(copy / (INDEX_NAME + "-shm"))
    marks.append(None if head is None else head.hex())
    return marks


#: Per ``-shm`` file: the descriptor this process reads its head through,
#: and the file's inode then.
_SHARED_MEMORY_READERS: dict[str, tuple[int, int]] = {}
_SHARED_MEMORY_LOCK = threading.Lock()


def _shared_memory_head(path: Path) -> bytes | None:
    """The first 48 bytes of SQLite's shared-memory file ``path`` (None
    where there is none), read through a descriptor this process keeps
    open: closing a descriptor of a file (any one) drops every POSIX lock
    the process holds on it, its SQLite connections' too, and the next
    process to open the index then takes the shared memory for unused and
    truncates it under them (a bus error killed a driver of this machine).
    A descriptor is closed only once the file is another (SQLite removed
    it and made it again): no connection of this process uses the old one."""
    try:
        inode = os.stat(path).st_ino
    except OSError:
        return None
    with _SHARED_MEMORY_LOCK:
        held = _SHARED_MEMORY_READERS.get(str(path))
        if held is None or held[1] != inode:
            try:
                descriptor = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
            if held is not None:
                os.close(held[0])
            held = _SHARED_MEMORY_READERS[str(path)] = (descriptor, os.fstat(descriptor).st_ino)
        try:
            return os.pread(held[0], 48, 0)
        except OSError:
            return None


def file_digest(path: Path) -> str:
    """The SHA-256 of the file at ``path``, read a MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def has_runs(index: Path) -> bool:
    """Whether the index at ``index`` holds a run (False where it cannot be read)."""
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.Error:
        return False
    finally:
        conn.close()
