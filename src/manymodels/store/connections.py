"""The index's SQLite connections, safe to close from another thread.

A store keeps one connection per thread (:mod:`.opening`), and
``Store.close()`` closes them all, whichever thread calls it. SQLite's own
connection, closed while another thread used it, answered that thread with
sqlite3's ``ProgrammingError: Cannot operate on a closed database`` (or,
closed in the middle of a statement, could read a freed handle). Here each
call into SQLite (a statement, a fetch, a blob's read, a commit) holds the
connection's lock, and :meth:`IndexConnection.close_refusing` takes it
before it closes: a call under way ends first, and every later one raises
the store's own error (that it was closed) instead of SQLite's. A
transaction the close cuts short is rolled back by SQLite, whole.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any

_CURSOR = sqlite3.Connection.cursor
_EXECUTE = sqlite3.Cursor.execute
_EXECUTEMANY = sqlite3.Cursor.executemany
_EXECUTESCRIPT = sqlite3.Cursor.executescript


class IndexConnection(sqlite3.Connection):
    """An :class:`sqlite3.Connection` whose calls hold its lock, and that
    refuses them once :meth:`close_refusing` closed it (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Held by each call into SQLite, and by the close (re-entrant:
        #: ``execute`` opens a cursor).
        self.calling = threading.RLock()
        #: Makes the error a call gets once the store closed the connection.
        self.refusal: Callable[[], Exception] | None = None
        #: The file opened, as :func:`_file_of` names it (see :meth:`still_at`).
        self.file = _file_of(args[0] if args else kwargs.get("database"))

    def still_at(self, path: Any) -> bool:
        """Whether ``path`` is still the file this connection opened (one stat):
        not once its folder was removed (its file stays open here, unlinked),
        moved or made anew, where a write through it would be lost."""
        return self.file is not None and _file_of(path) == self.file

    def close_refusing(self, refusal: Callable[[], Exception]) -> None:
        """Close once no call is under way; every later call raises
        ``refusal()``."""
        with self.calling:
            self.refusal = refusal
            super().close()

    def _check(self) -> None:
        if self.refusal is not None:
            raise self.refusal()

    def cursor(self, factory: Any = None) -> sqlite3.Cursor:
        with self.calling:
            self._check()
            return super().cursor(factory or IndexCursor)

    def _on_own_cursor(self, run: Callable[..., Any], args: tuple) -> sqlite3.Cursor:
        """``run`` (a cursor's execute) on a new :class:`IndexCursor`: SQLite's
        own ``Connection.execute`` opens a plain cursor."""
        with self.calling:
            self._check()
            cursor = _CURSOR(self, IndexCursor)
            run(cursor, *args)
            return cursor

    def execute(self, *args: Any) -> sqlite3.Cursor:
        return self._on_own_cursor(_EXECUTE, args)

    def executemany(self, *args: Any) -> sqlite3.Cursor:
        return self._on_own_cursor(_EXECUTEMANY, args)

    def executescript(self, *args: Any) -> sqlite3.Cursor:
        return self._on_own_cursor(_EXECUTESCRIPT, args)

    def commit(self) -> None:
        with self.calling:
            self._check()
            super().commit()

    def rollback(self) -> None:
        with self.calling:
            self._check()
            super().rollback()

    @property
    def in_transaction(self) -> bool:  # (closed: none, so a rollback is not tried)
        with self.calling:
            return self.refusal is None and sqlite3.Connection.in_transaction.__get__(self)

    def blobopen(self, *args: Any, **kwargs: Any) -> _GuardedBlob:
        with self.calling:
            self._check()
            return _GuardedBlob(self, super().blobopen(*args, **kwargs))


class IndexCursor(sqlite3.Cursor):
    """A cursor of an :class:`IndexConnection`: its fetches hold the
    connection's lock, and are refused once the store closed it."""

    def _locked(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``method`` (sqlite3.Cursor's own) under the connection's lock,
        refused once the store closed it."""
        with self.connection.calling:
            self.connection._check()
            return method(self, *args, **kwargs)

    def execute(self, *args: Any) -> sqlite3.Cursor:
        return self._locked(_EXECUTE, *args)

    def executemany(self, *args: Any) -> sqlite3.Cursor:
        return self._locked(_EXECUTEMANY, *args)

    def executescript(self, *args: Any) -> sqlite3.Cursor:
        return self._locked(_EXECUTESCRIPT, *args)

    def fetchone(self) -> Any:
        return self._locked(sqlite3.Cursor.fetchone)

    def fetchmany(self, *args: Any, **kwargs: Any) -> list:
        return self._locked(sqlite3.Cursor.fetchmany, *args, **kwargs)

    def fetchall(self) -> list:
        return self._locked(sqlite3.Cursor.fetchall)

    def __next__(self) -> Any:
        return self._locked(sqlite3.Cursor.__next__)

    def __iter__(self) -> Iterator[Any]:
        """The rows, read a thousand at a time (a lock per row tripled the
        cost of a loop over a million); a loop left early leaves the rest
        of the thousand read."""
        while rows := self.fetchmany(1000):
            yield from rows

    def close(self) -> None:
        with self.connection.calling:
            if self.connection.refusal is None:  # (closed with it already)
                super().close()


class _GuardedBlob:
    """A blob handle whose reads hold its connection's lock (see the module)."""

    def __init__(self, conn: IndexConnection, blob: Any) -> None:
        self._conn, self._blob = conn, blob

    def _call(self, method: str, *args: Any) -> Any:
        with self._conn.calling:
            self._conn._check()
            return getattr(self._blob, method)(*args)

    def read(self, *args: Any) -> bytes:
        return self._call("read", *args)

    def seek(self, *args: Any) -> None:
        self._call("seek", *args)

    def tell(self) -> int:
        return self._call("tell")

    def __len__(self) -> int:
        return self._call("__len__")

    def close(self) -> None:
        with self._conn.calling:
            if self._conn.refusal is None:
                self._blob.close()

    def __enter__(self) -> _GuardedBlob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _file_of(path: Any) -> tuple[int, int] | None:
    """The file at ``path`` (its device and inode), or None where there is none."""
    try:
        info = os.stat(path)
    except (OSError, TypeError, ValueError):  # (a read-only connection's URI: none)
        return None
    return info.st_dev, info.st_ino
