"""A store on an object store: ``mm.train(..., store="s3://bucket/models")``.

Its model files are objects there, under the names a local store gives its
files (``artifacts/<2 hex>/<sha256>``), uploaded by the workers that trained
them (:mod:`manymodels.engine.modelfiles`). Its index is a SQLite file, and
an object store can neither lock one nor write a page of it, so the driver
works on a local copy of the index and publishes it whole::

    s3://bucket/models/index.current              the SHA-256 of the published index
    s3://bucket/models/indexes/<sha256>.sqlite    the published index
    s3://bucket/models/artifacts/<2 hex>/<sha256> the model files

    ~/.cache/manymodels/stores/<digest of the store>/   this machine's copy:
        index.sqlite, remote.json (what it was last synced with), checkpoints/

(the store's digest is of what names it, not of the URI's text: its options'
order, its credentials and the options that only say how to reach it leave
it as it is; see :func:`~manymodels.inputs.objectstores.store_identity`)

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
  its copy, and SQLite's locks, as for a local store. A publication whose
  answer was lost (the network failed once ``index.current`` was written)
  is recorded before it is sent, and known for this machine's own when
  it is read back.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import sqlite3
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pyarrow.fs import FileType

from ..engine.modelfiles import remove_object
from ..inputs.objectstores import (
    check_location,
    child,
    redacted,
    resolve,
    shown,
    upload,
    without_secrets,
)
from .database import INDEX_NAME, StoreError
from .indexfiles import file_digest, fingerprint_of, has_runs
from .localcopy import SYNCED, adopt_older_copy, copy_folder

log = logging.getLogger("manymodels.store")

#: The object that names the published index, and the folder of indexes.
POINTER, INDEXES = "index.current", "indexes"
#: The names the store gives its published indexes (their SHA-256): gc
#: removes no other object under ``indexes/``.
_INDEX_NAMES = re.compile(r"[0-9a-f]{64}\.sqlite")
#: How old an index no pointer names must be before gc removes it.
STRAY_AGE_S = 3600.0
#: How often a run publishes the index while it runs (its end publishes too).
PUBLISH_EVERY_S = 300.0
#: How long a process waits for another process of this machine syncing the
#: same copy (an upload of a large index takes a while; one that hung does not end)
SYNC_WAIT_S = 900.0


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
        self.copy = copy_folder(location)
        adopt_older_copy(self.copy, location)
        try:
            self.copy.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot make the local copy of store {shown(location)!r} in "
                             f"{str(self.copy)!r}: {exc}") from exc

    # -- what the object store holds -----------------------------------------

    def synced_with(self) -> str | None:
        """The published index the copy was last synced with."""
        return self._synced().get("published")

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
        """One process of this machine syncs the copy at a time; one that
        waited :data:`SYNC_WAIT_S` for another is refused, naming the lock."""
        with open(self.copy / ".sync.lock", "a") as lock:
            deadline = time.monotonic() + SYNC_WAIT_S
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreError(
                            f"store {shown(self.location)!r}: another process of this machine "
                            f"has been syncing its index's copy for {SYNC_WAIT_S:g} s (it "
                            f"holds {str(self.copy / '.sync.lock')!r}): stop it, or wait "
                            "for it to end") from None
                    time.sleep(0.05)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _synced(self) -> dict:
        try:
            return json.loads((self.copy / SYNCED).read_text())
        except (OSError, ValueError):
            return {}

    def _save(self, published: str | None, snapshot: str | None, fingerprint: list,
              pending: dict | None = None) -> None:
        """Record what the copy was synced with: the published index, the
        copy's snapshot digest then, and its files' ``fingerprint`` taken
        *before* that snapshot (a write that lands after it changes them);
        ``pending``: the index a publication under way points
        ``index.current`` at, and its fingerprint (:meth:`_settled`)."""
        state = {"location": without_secrets(self.location), "published": published,
                 "snapshot": snapshot, "fingerprint": fingerprint}
        if pending is not None:
            state["pending"] = pending
        temporary = self.copy / f".{SYNCED}.tmp"
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self.copy / SYNCED)

    def _settled(self, published: str | None) -> dict:
        """The sync record, where ``published`` is the index a publication
        from here pointed ``index.current`` at without recording it (the
        network failed after the request was carried out, or the process
        ended): recorded as synced with it, the index it replaced removed.
        Else the writes made here since would read as another machine's
        publication, and be refused, never published."""
        synced = self._synced()
        pending = synced.get("pending") or {}
        if published is None or published != pending.get("index") or (
                published == synced.get("published")):
            return synced
        replaced = synced.get("published")
        self._save(published, published, pending.get("fingerprint"))
        if replaced is not None:
            remove_object(self._uri(f"{INDEXES}/{replaced}.sqlite"))
        return self._synced()

    def _keep_aside(self) -> None:
        """Move this machine's copy of an index whose store was removed from
        the object store (``index.current`` gone) aside, into a folder
        ``removed-<time>`` beside it, rather than delete it: it may be the
        last record of those runs (a pointer deleted by mistake), and a new
        store starts where it was. Logged, naming the folder."""
        names = [name for name in (INDEX_NAME, INDEX_NAME + "-wal", INDEX_NAME + "-shm")
                 if (self.copy / name).exists()]
        if not names or not (self.copy / INDEX_NAME).exists():
            for name in names:
                (self.copy / name).unlink(missing_ok=True)
            return
        aside = self.copy / f"removed-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
        aside.mkdir(mode=0o700)
        for name in names:
            os.replace(self.copy / name, aside / name)
        log.warning("the store %s was removed from its object store (no index.current): "
                    "this machine's copy of its index is kept at %s, and a new store "
                    "starts there", shown(self.location), aside)

    def _fingerprint(self) -> list:
        """What changes whenever the copy is written (:func:`.indexfiles.fingerprint_of`)."""
        return fingerprint_of(self.copy)

    def _snapshot(self, into: Path, source: Path | None = None) -> str:
        """A consistent copy of the copy's index (or of ``source``) at
        ``into``, made by this machine's SQLite; its SHA-256."""
        source_conn = sqlite3.connect(f"file:{source or self.copy / INDEX_NAME}?mode=ro",
                                      uri=True)
        target = sqlite3.connect(into)
        try:
            source_conn.backup(target)
        finally:
            target.close()
            source_conn.close()
        return file_digest(into)

    def _current(self, synced: dict, scratch: Path) -> tuple[str | None, list, bool]:
        """The copy's digest now (a snapshot in ``scratch``, taken only where
        its files changed since the sync; None where there is no index), its
        fingerprint before it, and whether it holds no run."""
        fingerprint = self._fingerprint()
        index = self.copy / INDEX_NAME
        if not index.exists():
            return None, fingerprint, True
        if synced.get("fingerprint") == fingerprint and synced.get("snapshot"):
            return synced["snapshot"], fingerprint, False
        return self._snapshot(scratch / "index"), fingerprint, not has_runs(index)

    @staticmethod
    def _unchanged(current: str | None, synced: dict) -> bool:
        """Whether the copy holds nothing the published index does not: its
        digest is the published one, or its own when it was last synced (a
        snapshot by another machine's SQLite differs in its header)."""
        return current is not None and current in (synced.get("published"),
                                                   synced.get("snapshot"))

    # -- syncing -------------------------------------------------------------

    def pull(self, read_only: bool | None = None) -> None:
        """Bring the copy to the published index (see the module docstring).
        ``read_only``: nothing published there yet is an error."""
        with self._locked(), tempfile.TemporaryDirectory(dir=self.copy) as scratch:
            for attempt in range(3):
                published = self.published()
                synced = self._settled(published)
                if published is None and read_only:
                    raise StoreError(f"store {shown(self.location)!r} does not exist: "
                                     "nothing was published there")
                index = self.copy / INDEX_NAME
                if published == synced.get("published") and (published is None
                                                              or index.exists()):
                    if published is None:
                        self._check_bucket()
                        if not synced:  # (the same as no record: the location written down,
                            # so that a run killed before the store's first publication
                            # leaves a copy that says which store's it is)
                            self._save(None, None, None)
                    return  # current (it may hold work not published yet: published next)
                current, fingerprint, empty = self._current(synced, Path(scratch))
                if current == published:  # published from here (its record was lost)
                    self._save(published, current, fingerprint)
                    return
                if not empty and not self._unchanged(current, synced):
                    raise StoreError(
                        f"store {shown(self.location)!r} was written from another machine "
                        f"since this machine's copy of its index ({str(self.copy)!r}) was "
                        "synced, and that copy holds writes not published yet (a run here "
                        "still running, or a driver here that stopped before its run ended): "
                        "the two cannot be merged. Move the "
                        "copy away to use the store as published (mm.Store opens the "
                        "moved copy by its path, for reading)")
                if published is None:  # a new store (or one removed from the object store)
                    self._check_bucket()
                    self._keep_aside()
                    self._save(None, None, self._fingerprint())
                    return
                downloaded = Path(scratch, "downloaded", INDEX_NAME)
                downloaded.parent.mkdir(exist_ok=True)
                try:
                    self._download(published, downloaded)
                except FileNotFoundError:  # replaced meanwhile: read its name again
                    if attempt == 2:
                        raise self._fail(f"its index {published} is gone", OSError(
                            "index.current names an index that is not there")) from None
                    continue
                # its digest as this machine's SQLite copies it (made from the
                # download, which nothing here writes); no fingerprint: the next
                # check takes a snapshot, and sees a write that landed meanwhile
                self._check_index(downloaded)
                mine = self._snapshot(Path(scratch, "mine"), source=downloaded)
                self._install(downloaded, index)
                self._save(published, mine, None)
                return

    def _check_index(self, downloaded: Path) -> None:
        """Refuse a downloaded index that does not open as a store's (the
        copy is kept as it is)."""
        from .database import connect

        try:
            connect(downloaded.parent, read_only=True).close()
        except (StoreError, sqlite3.Error) as exc:
            raise StoreError(f"store {shown(self.location)!r}: its published index is not "
                             f"a manymodels store's index ({exc}): it is not used") from None

    def _install(self, downloaded: Path, index: Path) -> None:
        """Put a downloaded index (checked) in place of the copy's."""
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
        """The published index ``published`` at ``into``, checked against its
        SHA-256; a ``FileNotFoundError`` where it is not there."""
        digest = hashlib.sha256()
        try:
            filesystem, path = resolve(self._uri(f"{INDEXES}/{published}.sqlite"))
            with filesystem.open_input_stream(path) as source, open(into, "wb") as out:
                while chunk := source.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
        except FileNotFoundError:
            raise
        except (OSError, ValueError) as exc:
            raise self._fail(f"cannot download its index {published}", exc) from None
        if digest.hexdigest() != published:
            raise StoreError(f"store {shown(self.location)!r}: its index {published} does "
                             "not match its SHA-256 (changed or cut short): it is not used")

    def publish(self) -> None:
        """Upload the copy's index where it holds writes not published yet."""
        with self._locked(), tempfile.TemporaryDirectory(dir=self.copy) as scratch:
            synced = self._synced()
            before = synced.get("published")
            current, fingerprint, empty = self._current(synced, Path(scratch))
            if current is None or (empty and before is None):
                return  # nothing at all (a new store nothing was written to)
            if self._unchanged(current, synced):
                self._save(before, synced.get("snapshot") or current, fingerprint)
                return  # nothing new to publish
            published = self.published()
            if published != before:
                synced = self._settled(published)
                if synced.get("published") != published:
                    raise StoreError(
                        f"store {shown(self.location)!r} was written from another machine "
                        "since this machine's copy of its index was synced: this copy's runs "
                        f"are not published, and stay in {str(self.copy)!r}")
                before = published  # (a publication from here whose end was not recorded)
                if self._unchanged(current, synced):
                    return
            snapshot = Path(scratch, "index")
            if not snapshot.exists():  # (current came from the record: take it now)
                current = self._snapshot(snapshot)
            try:
                filesystem, path = resolve(self._uri(f"{INDEXES}/{current}.sqlite"))
                with filesystem.open_output_stream(path) as out, open(snapshot, "rb") as file:
                    while chunk := file.read(1 << 22):
                        out.write(chunk)
                self._save(before, synced.get("snapshot"), synced.get("fingerprint"),
                           pending={"index": current, "fingerprint": fingerprint})
                upload(self._uri(POINTER), current.encode())
            except (OSError, ValueError) as exc:
                raise self._fail("cannot publish its index (the runs are kept in "
                                 f"{str(self.copy)!r}, published by the next writable "
                                 "open here)", exc) from None
            self._save(current, current, fingerprint)
            if before is not None:
                remove_object(self._uri(f"{INDEXES}/{before}.sqlite"))

    def collect_indexes(self) -> int:
        """Remove the published indexes ``index.current`` does not name that
        are an hour old (a publication that failed or was cut short left
        them; a younger one may be another machine's, on its way). Only
        names the store gives its indexes (:data:`_INDEX_NAMES`): another
        program's files under ``indexes/`` are kept, as ``artifacts/``'s are."""
        from pyarrow import fs

        current = self.published()
        try:
            filesystem, base = resolve(self._uri(INDEXES))
            listed = filesystem.get_file_info(fs.FileSelector(base, allow_not_found=True))
        except (OSError, ValueError) as exc:
            raise self._fail(f"gc cannot list its published indexes ({INDEXES}/)",
                             exc) from None
        removed = 0
        for entry in listed:
            name = entry.path.rsplit("/", 1)[-1]
            if (entry.type == fs.FileType.File and name != f"{current}.sqlite"
                    and _INDEX_NAMES.fullmatch(name)
                    and entry.mtime is not None
                    and entry.mtime.timestamp() < time.time() - STRAY_AGE_S):
                removed += remove_object(self._uri(f"{INDEXES}/{name}"))
        return removed
