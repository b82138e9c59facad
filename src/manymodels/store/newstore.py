"""A store's folder made where there is none: made owner-only before any
work starts, checked where it exists, and taken away again where making it
was refused (a full disk), so that nothing half-made is left to be taken
for a damaged store. What is inside the index is :mod:`.database`'s."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .database import INDEX_NAME, StoreError, check_existing_index


def prepare_directory(path: Path, read_only: bool | None = None) -> bool:
    """Create (or check) a store directory, owner-only, before any work starts;
    return whether it can be written. An existing store that this user may
    only read (or ``read_only``) opens for reading; anything else that cannot
    be written is refused."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise StoreError(f"store path {str(path)!r} is a file, not a directory")
    index, folder = path / INDEX_NAME, path / "artifacts"
    if read_only or (read_only is None and index.is_file() and not (
            os.access(path, os.W_OK | os.X_OK) and os.access(index, os.W_OK)
            and (not folder.exists() or os.access(folder, os.W_OK | os.X_OK)))):
        if not index.exists():
            raise StoreError(f"store index {str(index)!r} does not exist: there is no "
                             "store to read there")
        if not os.access(index, os.R_OK):
            raise StoreError(f"store index {str(index)!r} cannot be read")
        return False
    if not index.exists():
        refuse_inside_artifacts(path)
    else:  # read only, before this process writes anything here
        check_existing_index(index)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        (path / "artifacts").mkdir(mode=0o700, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create store directory {str(path)!r}: {exc}") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise StoreError(f"store directory {str(path)!r} is not writable")
    return True


class NewStore:
    """What opening a store at ``path`` will make where there is no store yet
    (its folder and the folders above it that do not exist, or its index in
    an existing folder): :meth:`remove` takes away what was made, where
    making it was refused (a full disk), so that nothing half-made is left
    to be taken for a damaged store. A store that existed is never touched."""

    def __init__(self, path: Path, folders: list[Path]) -> None:
        self.path, self.folders = path, folders
        self.index = path / INDEX_NAME
        #: the store's artifacts/ folder, where this call makes it
        self.artifacts = None if (path / "artifacts").exists() else path / "artifacts"
        #: whether this call made the index file (see :meth:`claim_index`)
        self.made_index = False

    def claim_index(self) -> None:
        """Make the index file, empty, where no process has made it yet: only
        an index this call made is removed again (another driver making the
        same store at once, or a reader's open racing a writer's, leaves the
        other's index alone)."""
        try:
            os.close(os.open(self.index, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            return
        self.made_index = True

    @classmethod
    def before(cls, path: Path) -> NewStore | None:
        """What is there before the store at ``path`` is opened; None where
        its index exists already (a store, or a file this call did not make)."""
        path = Path(path)
        index = path / INDEX_NAME
        if index.exists() or (path.exists() and not path.is_dir()):
            return None
        folders = []  # made by this call: the store's folder and missing parents
        for folder in (path, *path.parents):
            if folder.exists():
                break
            folders.append(folder)
        return cls(path, folders)

    def remove(self) -> None:
        """Remove the index this call made (with SQLite's files beside it)
        and the folders it made, each only where it holds nothing else."""
        if self.made_index:
            for name in ("", "-wal", "-shm", "-journal"):
                with contextlib.suppress(OSError):
                    self.index.with_name(INDEX_NAME + name).unlink()
        for folder in [self.artifacts, *self.folders]:  # (the innermost first)
            if folder is not None:
                with contextlib.suppress(OSError):  # (not empty: another process's now)
                    folder.rmdir()


def refuse_inside_artifacts(path: Path) -> None:
    """Refuse a new store inside another store's ``artifacts`` folder, whose
    :meth:`~manymodels.Store.gc` would remove its files as strays."""
    for parent in path.resolve().parents:
        if parent.name == "artifacts" and (parent.parent / INDEX_NAME).is_file():
            raise StoreError(f"store path {str(path)!r} is inside the artifacts folder of "
                             f"the store {str(parent.parent)!r}, whose gc would remove its "
                             "files: put it elsewhere")
