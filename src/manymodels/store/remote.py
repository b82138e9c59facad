"""A store on an object store: ``mm.train(..., store="s3://bucket/models")``.

Its model files are objects there, under the names a local store gives its
files (``artifacts/<2 hex>/<sha256>``), uploaded by the workers that trained
them (:mod:`manymodels.engine.modelfiles`). Its index is a SQLite file, and
an object store can neither lock one nor write a page of it, so the driver
works on a local copy of the index and publishes it whole::

    s3://bucket/models/index.current              the SHA-256 of the published index
    s3://bucket/models/indexes/<sha256>.sqlite    the published index
    s3://bucket/models/artifacts/<2 hex>/<sha256> the model files

    ~/.cache/manymodels/stores/<digest of the location>/   this machine's copy:
        index.sqlite, remote.json (what it was last synced with), checkpoints/

- **Opening** reads ``index.current`` (one small request). Where it names
  what the copy was last synced with, the copy is used as it is; else the
  published index is downloaded, checked against its SHA-256, and put in
  place with SQLite's backup (a process of this machine reading the copy
  meanwhile sees the old index or the new one, never a mix).
- **Publishing** (the end of each ``train``, whether it succeeded or not, and
  each of a writable ``Store``'s writes: ``attach``, ``delete``, ``gc``,
  ``close``) uploads a snapshot of the copy (SQLite's backup: one
  consistent state, its write-ahead log included) under its SHA-256, then
  points ``index.current`` at it, then removes the index it replaces. A
  reader on another machine sees the old index or the new one, whole.
- **What is not lost.** Every task's row is committed to the local copy as
  it is for a local store (at most the last second); it reaches the object
  store within :data:`PUBLISH_EVERY_S` while the run runs, and when it ends.
  A driver killed mid-run leaves its rows in this machine's copy, published
  by the next writable open of the store here.
- **One machine writes at a time.** Before publishing, ``index.current`` is
  read again: where another machine published since this copy was synced,
  publishing is refused, the copy kept (the error names it). That check and
  the upload are two requests, not one atomic one: two machines publishing
  in the same moment can lose one's runs. Two drivers of one machine share
  its copy, and SQLite's locks, as for a local store.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path

from pyarrow.fs import FileType

from ..inputs.objectstores import check_location, child, redacted, resolve, shown, upload
from .database import INDEX_NAME, StoreError

#: The object that names the published index, and the folder of indexes.
POINTER, INDEXES = "index.current", "indexes"
#: In the local copy's folder: what it was last synced with.
SYNCED = "remote.json"
#: How often a run publishes the index while it runs (its end publishes too).
PUBLISH_EVERY_S = 300.0


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
    store's location as shown (without its secrets: the SDK's own
    credentials then reach it); else None."""
    try:
        return json.loads((path / SYNCED).read_text())["location"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def remote_store_exists(location: str) -> bool:
    """Whether a store was published at ``location`` (one small request)."""
    return RemoteIndex(location).published() is not None


class RemoteIndex:
    """The index of the store at ``location`` (an object store's URI) and
    this machine's copy of it (see the module docstring)."""

    def __init__(self, location: str) -> None:
        try:
            check_location(location, "store")
        except ValueError as exc:
            raise StoreError(str(exc)) from None
        self.location = location
        key = hashlib.sha256(shown(location).rstrip("/").encode()).hexdigest()[:32]
        self.copy = cache_folder() / "stores" / key
        try:
            self.copy.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot make the local copy of store {shown(location)!r} in "
                             f"{str(self.copy)!r}: {exc}") from exc

    # -- what the object store holds -----------------------------------------

    def _uri(self, name: str) -> str:
        return child(self.location, name)

    def _fail(self, what: str, exc: BaseException) -> StoreError:
        return StoreError(f"store {shown(self.location)!r}: {what}: "
                          f"{redacted(exc, self.location)}")

    def published(self) -> str | None:
        """The SHA-256 of the published index; None where none is."""
        try:
            filesystem, path = resolve(self._uri(POINTER))
            with filesystem.open_input_stream(path) as source:
                text = source.read().decode("ascii", "replace").strip()
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise self._fail("cannot read its index's name", exc) from None
        if len(text) != 64 or any(c not in "0123456789abcdef" for c in text):
            raise StoreError(f"store {shown(self.location)!r}: {POINTER} does not name an "
                             f"index ({text[:80]!r}): is this location a manymodels store?")
        return text

    # -- this machine's copy ---------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """One process of this machine syncs the copy at a time."""
        with open(self.copy / ".sync.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _synced(self) -> dict:
        try:
            return json.loads((self.copy / SYNCED).read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, published: str | None, snapshot: str | None) -> None:
        state = {"location": shown(self.location), "published": published,
                 "snapshot": snapshot, "fingerprint": self._fingerprint()}
        temporary = self.copy / f".{SYNCED}.tmp"
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self.copy / SYNCED)

    def _fingerprint(self) -> list:
        """The copy's files' sizes and times: unchanged, nothing was written."""
        marks = []
        for name in (INDEX_NAME, INDEX_NAME + "-wal"):
            try:
                info = os.stat(self.copy / name)
                marks.append([info.st_size, info.st_mtime_ns])
            except OSError:
                marks.append(None)
        return marks

    def _snapshot(self, into: Path) -> str:
        """A consistent copy of the copy's index at ``into``; its SHA-256."""
        source = sqlite3.connect(f"file:{self.copy / INDEX_NAME}?mode=ro", uri=True)
        target = sqlite3.connect(into)
        try:
            source.backup(target)
        finally:
            target.close()
            source.close()
        digest = hashlib.sha256()
        with open(into, "rb") as file:
            while chunk := file.read(1 << 20):
                digest.update(chunk)
        return digest.hexdigest()

    def _unpublished(self, synced: dict) -> bool:
        """Whether the copy holds writes its last sync did not see."""
        if not (self.copy / INDEX_NAME).exists():
            return False
        if synced.get("fingerprint") == self._fingerprint():
            return False
        with tempfile.TemporaryDirectory(dir=self.copy) as scratch:
            changed = self._snapshot(Path(scratch, "index")) != synced.get("snapshot")
        if not changed:  # only checkpointed: remember the files as they are now
            self._save(synced.get("published"), synced.get("snapshot"))
        return changed

    # -- syncing -------------------------------------------------------------

    def pull(self, read_only: bool | None = None) -> None:
        """Bring the copy to the published index (see the module docstring).
        ``read_only``: nothing is published there yet is an error."""
        with self._locked():
            published, synced = self.published(), self._synced()
            if published is None and read_only:
                raise StoreError(f"store {shown(self.location)!r} does not exist: nothing "
                                 "was published there")
            if published is None:
                self._check_bucket()
            index = self.copy / INDEX_NAME
            if published == synced.get("published") and (published is None or index.exists()):
                return  # current (it may hold work not published yet: published next)
            if index.exists() and self._unpublished(synced):
                raise StoreError(
                    f"store {shown(self.location)!r} was written from another machine since "
                    f"this machine's copy of its index ({str(self.copy)!r}) was synced, and "
                    "that copy holds runs not published yet (a driver here stopped before "
                    "its run ended): the two cannot be merged. Move the copy away to use "
                    "the store as published (the copy is a store: mm.Store cannot open it "
                    "as it is, but its runs can be read with sqlite3)")
            if published is None:  # a new store (or one removed from the object store)
                for name in (INDEX_NAME, INDEX_NAME + "-wal", INDEX_NAME + "-shm"):
                    (self.copy / name).unlink(missing_ok=True)
                self._save(None, None)
                return
            with tempfile.TemporaryDirectory(dir=self.copy) as scratch:
                downloaded = Path(scratch, "index")
                self._download(published, downloaded)
                if index.exists():  # readers here see the old index or the new, whole
                    source, target = sqlite3.connect(downloaded), sqlite3.connect(index)
                    try:
                        source.backup(target)
                    finally:
                        target.close()
                        source.close()
                else:
                    os.chmod(downloaded, 0o600)
                    os.replace(downloaded, index)
            with tempfile.TemporaryDirectory(dir=self.copy) as scratch:
                self._save(published, self._snapshot(Path(scratch, "index")))

    def _check_bucket(self) -> None:
        """Refuse a new store in a bucket (a container) that is not there,
        before any work (its index could not be published at the run's end)."""
        try:
            filesystem, path = resolve(self.location)
            bucket = path.strip("/").split("/", 1)[0]
            missing = bucket and filesystem.get_file_info(bucket).type == FileType.NotFound
        except (OSError, ValueError) as exc:
            raise self._fail("cannot reach it", exc) from None
        if missing:
            raise StoreError(f"store {shown(self.location)!r}: its bucket {bucket!r} does "
                             "not exist")

    def _download(self, published: str, into: Path) -> None:
        digest = hashlib.sha256()
        try:
            filesystem, path = resolve(self._uri(f"{INDEXES}/{published}.sqlite"))
            with filesystem.open_input_stream(path) as source, open(into, "wb") as out:
                while chunk := source.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
        except (OSError, ValueError) as exc:
            raise self._fail(f"cannot download its index {published}", exc) from None
        if digest.hexdigest() != published:
            raise StoreError(f"store {shown(self.location)!r}: its index {published} does "
                             "not match its SHA-256 (changed or cut short): it is not used")

    def publish(self) -> None:
        """Upload the copy's index where it holds writes not published yet."""
        with self._locked():
            synced = self._synced()
            index = self.copy / INDEX_NAME
            if not index.exists() or (synced.get("published") is not None
                                      and not self._unpublished(synced)):
                return
            if synced.get("published") is None and not _has_runs(index):
                return  # a new store nothing was written to: nothing to publish
            with tempfile.TemporaryDirectory(dir=self.copy) as scratch:
                snapshot = Path(scratch, "index")
                digest = self._snapshot(snapshot)
                before = synced.get("published")
                if digest == before:
                    self._save(before, digest)
                    return
                if self.published() != before:
                    raise StoreError(
                        f"store {shown(self.location)!r} was written from another machine "
                        "since this machine's copy of its index was synced: this copy's "
                        f"runs are not published, and stay in {str(self.copy)!r}")
                try:
                    filesystem, path = resolve(self._uri(f"{INDEXES}/{digest}.sqlite"))
                    with filesystem.open_output_stream(path) as out, open(snapshot, "rb") as f:
                        while chunk := f.read(1 << 22):
                            out.write(chunk)
                    upload(self._uri(POINTER), digest.encode())
                except (OSError, ValueError) as exc:
                    raise self._fail("cannot publish its index (the runs are kept in "
                                     f"{str(self.copy)!r}, published by the next writable "
                                     "open)", exc) from None
            self._save(digest, digest)
            if before is not None:
                with contextlib.suppress(Exception):
                    filesystem, path = resolve(self._uri(f"{INDEXES}/{before}.sqlite"))
                    filesystem.delete_file(path)


def _has_runs(index: Path) -> bool:
    conn = sqlite3.connect(f"file:{index}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.Error:
        return False
    finally:
        conn.close()
