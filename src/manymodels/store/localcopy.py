"""This machine's copy of a remote store's index
(:mod:`~manymodels.store.remote`): the folder it is kept in, one per store
(keyed by what names the store, not by the URI's text), what it was last
synced with, and the copy an earlier version of manymodels kept under
another name, taken over where this machine has none yet."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path

from ..inputs.objectstores import shown, store_identity
from .database import INDEX_NAME

#: In the local copy's folder: what it was last synced with.
SYNCED = "remote.json"


def cache_folder() -> Path:
    """Where this machine keeps its copies of remote stores' indexes:
    ``$MANYMODELS_CACHE_DIR``, else ``$XDG_CACHE_HOME/manymodels``, else
    ``~/.cache/manymodels``."""
    given = os.environ.get("MANYMODELS_CACHE_DIR")
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "manymodels"


def copied_from(path: Path) -> str | None:
    """Where ``path`` is this machine's copy of a remote store's index, that
    store's location without its secrets (the SDK's own credentials then
    reach it: keys given in the URI are never written down); else None."""
    try:
        return json.loads((path / SYNCED).read_text())["location"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def copy_folder(location: str) -> Path:
    """This machine's copy of the store at ``location``: one per store,
    whatever keys its URI carries and in whatever order its options come
    (:func:`store_identity`), so that a re-run spelled otherwise finds a
    killed run's work, and two drivers of this machine share one copy."""
    key = hashlib.sha256(store_identity(location).encode()).hexdigest()[:32]
    return cache_folder() / "stores" / key


def older_copy_folder(location: str) -> Path:
    """Where earlier versions of manymodels kept the copy of the store at
    ``location``: named by its text as shown (the access key and the options'
    order in it), one copy per spelling."""
    key = hashlib.sha256(shown(location).rstrip("/").encode()).hexdigest()[:32]
    return cache_folder() / "stores" / key


def _last_written(folder: Path) -> int:
    """When the copy in ``folder`` was last written (its index or its log)."""
    times = [0]
    for name in (INDEX_NAME, INDEX_NAME + "-wal", SYNCED):
        with contextlib.suppress(OSError):
            times.append(os.stat(folder / name).st_mtime_ns)
    return max(times)


def adopt_older_copy(copy: Path, location: str) -> None:
    """Where this machine has no copy at ``copy`` yet, move there the one an
    earlier version made for the same store under another name (see
    :func:`older_copy_folder`): a killed run's rows in it are then
    published by this open, where a fresh copy would have been refused as
    "written from another machine". Candidates: the folder this spelling
    named before, and any copy whose recorded location is the same store
    (:func:`store_identity`); of several (the store opened spelled two ways
    before), the one written last, the others left where they are. A
    process of this machine that moved it first wins; nothing here fails an
    open."""
    if (copy / SYNCED).exists() or (copy / INDEX_NAME).exists():
        return
    stores = copy.parent
    identity = store_identity(location)
    candidates = []
    with contextlib.suppress(OSError):
        for folder in stores.iterdir():
            if folder == copy or not (folder / INDEX_NAME).exists():
                continue
            recorded = copied_from(folder)
            with contextlib.suppress(ValueError):  # (a record that is no URI: not this store)
                if folder == older_copy_folder(location) or (
                        isinstance(recorded, str) and store_identity(recorded) == identity):
                    candidates.append(folder)
    if not candidates:
        return
    with contextlib.suppress(OSError):  # (another process moved it, or made the copy)
        if copy.exists():
            copy.rmdir()  # an empty folder an earlier open made; one not empty is kept
        os.rename(max(candidates, key=_last_written), copy)
