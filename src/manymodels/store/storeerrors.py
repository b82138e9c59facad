"""The store's own errors, and the words for a failed write: a full disk,
another process's write lock held past the busy timeout, a store whose
folder is gone. Every caller names the store as the user named it (an
object store's URI shown without its secret), never SQLite's bare text
alone. :mod:`.database` offers them under its name too."""

from __future__ import annotations

import errno
import sqlite3
from pathlib import Path

from ..engine.records import RecordingError
from ..inputs.objectstores import shown


class StoreError(RecordingError, ValueError):
    """The store cannot be used: its path is a file or not writable, its index
    is damaged, or a write failed (a full disk). When a write fails during a
    run, ``.run`` holds every result finished before it (the ones recorded
    stay usable in the store)."""

    def __init__(self, message: str, run: object = None) -> None:
        super().__init__(message)
        self.run = run


class StoreIntegrityError(RuntimeError):
    """An artifact's content does not match its recorded SHA-256 (tampered,
    truncated or missing); it is refused, never unpickled."""


def gone_error(folder: Path, cause: str = "") -> StoreError:
    return StoreError(f"the store {str(folder)!r} is gone: its folder was removed or moved "
                      f"since it was opened{cause}; open it where it is now")


def is_disk_full(exc: BaseException) -> bool:
    if isinstance(exc, OSError):
        return exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or (
        "disk is full" in str(exc))


def write_error(root: Path | str, exc: BaseException, what: str) -> StoreError:
    """The :class:`StoreError` for a failed write, naming the store and the
    cause. ``root``: the store as the user named it, its folder or its
    object store's URI (shown without its secret), not this machine's copy
    of its index, a folder the user never named."""
    cause = (f"the disk is full ({exc})" if is_disk_full(exc)
             else f"{type(exc).__name__}: {exc}")  # (the error's text once)
    return StoreError(
        f"cannot write to the store {shown(str(root))!r}: {cause}; {what}. What was "
        "committed before stays usable, and a re-run with the same store reuses it")


def busy_or_write_error(root: Path | str, exc: BaseException, what: str) -> StoreError:
    """:func:`write_error`, or where another process held the index's write
    lock past the busy timeout (a run's commit, another gc), a
    :class:`StoreError` that says so, naming the store: not SQLite's bare
    "database is locked", which names neither."""
    if isinstance(exc, sqlite3.OperationalError) and (
            "locked" in str(exc) or "busy" in str(exc)):
        return StoreError(f"the store {shown(str(root))!r} is busy: another process held its "
                          f"index's write lock for a minute ({exc}); {what}: try again when "
                          "it is done")
    return write_error(root, exc, what)
