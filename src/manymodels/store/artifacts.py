"""Model artifacts in a store: written, checked against their SHA-256, read.

A model of 1 MiB or more is a file under ``artifacts/``, named by its SHA-256
(written to a temporary name and renamed); a smaller one that a run trains is
packed (see :mod:`.packs`), and a run-level object (an attachment) is a BLOB
row of ``artifacts``. Every read checks the bytes against the SHA-256 before
anything is unpickled; an artifact found not to match is remembered in
``corrupt_artifacts``, so a re-run retrains its task instead of reusing it.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from pathlib import Path
from typing import Any, NamedTuple

from ..engine.modelfiles import (
    ModelFile,
    intact_model,
    listed_models,
    read_model_bytes,
    relative_path,
    write_model_file,
)
from ..engine.partpacks import PACKED_BELOW
from ..inputs.objectstores import is_remote, shown
from . import packs
from .database import StoreIntegrityError

#: Models smaller than this are packed (see :mod:`.packs`); workers send them
#: in packs already (:class:`manymodels.engine.partpacks.ModelPack`).
SMALL_ARTIFACT = PACKED_BELOW


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_artifact(conn: sqlite3.Connection, root: Path | str, data: bytes,
                   digest: str | None = None) -> tuple[str, int]:
    """Store ``data`` (inside the caller's transaction); return (sha256, size).
    ``digest``: its SHA-256 when the caller has it already (a worker hashed
    it). An artifact found corrupt earlier is written afresh. ``root``: the
    store's folder, or its object store's URI (where a file is uploaded
    again even when there: an object's age cannot be made new otherwise,
    and gc goes by age)."""
    digest = digest or sha256(data)
    corrupt = _forget_if_corrupt(conn, digest)
    if len(data) < SMALL_ARTIFACT:
        conn.execute("INSERT OR IGNORE INTO artifacts(sha256, size, blob) VALUES (?, ?, ?)",
                     (digest, len(data), data))
        return digest, len(data)
    relative = relative_path(digest)
    if corrupt or is_remote(root) or not intact_model(root, relative, len(data)):
        write_model_file(root, data, digest)
    else:  # the same bytes are there
        _made_new(Path(root, relative))
    _insert_file_row(conn, digest, len(data), relative)
    return digest, len(data)


def record_model_file(conn: sqlite3.Connection, root: Path | str, model: ModelFile) -> str:
    """The row of a large model a worker wrote into the store itself (see
    :mod:`manymodels.engine.modelfiles`; inside the caller's transaction);
    return its SHA-256. Its file must be there, whole: a worker that saw
    the store wrote it before sending its outcome. (On an object store the
    driver asked for it as it received the outcome, :meth:`ModelFile.intact`,
    and is not asked again here: a request inside the index's write lock
    would hold every other writer of this machine for its round trip.)"""
    if not is_remote(root) and not intact_model(root, model.path, model.size):
        raise StoreIntegrityError(
            f"the model file {model.path} a worker wrote into store {shown(str(root))!r} is not "
            f"there with its {model.size} bytes: is the store on a path every worker sees "
            "as the driver does?")
    if not is_remote(root):
        _made_new(Path(root, model.path))
    _forget_if_corrupt(conn, model.sha256)  # the worker wrote it afresh
    _insert_file_row(conn, model.sha256, model.size, model.path)
    return model.sha256


def _forget_if_corrupt(conn: sqlite3.Connection, digest: str) -> bool:
    """Whether ``digest`` was found corrupt earlier: its mark and its row then
    go, for the bytes written afresh."""
    corrupt = conn.execute("SELECT 1 FROM corrupt_artifacts WHERE sha256 = ?",
                           (digest,)).fetchone() is not None
    if corrupt:
        conn.execute("DELETE FROM corrupt_artifacts WHERE sha256 = ?", (digest,))
        conn.execute("DELETE FROM artifacts WHERE sha256 = ?", (digest,))
    return corrupt


def _made_new(path: Path) -> None:
    """A model file about to be named again, made new inside the transaction
    that names it: a gc running now leaves it (:mod:`.collect`)."""
    try:
        os.utime(path)
    except OSError:
        pass


def _insert_file_row(conn: sqlite3.Connection, digest: str, size: int, relative: str) -> None:
    conn.execute("INSERT OR IGNORE INTO artifacts(sha256, size, path) VALUES (?, ?, ?)",
                 (digest, size, relative))


def loadable_artifacts(conn: sqlite3.Connection, root: Path | str, digests: set[str]
                       ) -> set[str]:
    """Those of ``digests`` (SHA-256s or pack locators) that can still be
    loaded, as far as a cheap check tells: in the index (or their pack is),
    not found corrupt, and a file artifact's file there with its size. All at
    once: a scan of the artifact names when the store holds few more than asked
    for, else one query per 5,000."""
    if not digests:
        return set()
    packed = {d for d in digests if packs.is_locator(d)}
    digests = digests - packed
    packed = packs.whole_locators(conn, packed)
    total = conn.execute("SELECT max(rowid) FROM artifacts").fetchone()[0] or 0
    if total <= 20 * len(digests):
        present = digests & {sha for (sha,) in conn.execute("SELECT sha256 FROM artifacts")}
    else:
        present, names = set(), list(digests)
        for start in range(0, len(names), 5000):
            chunk = names[start:start + 5000]
            present.update(sha for (sha,) in conn.execute(
                f"SELECT sha256 FROM artifacts WHERE sha256 IN ({','.join('?' * len(chunk))})",
                chunk))
    files = [(sha, path, size) for sha, path, size in conn.execute(
        "SELECT sha256, path, size FROM artifacts WHERE path IS NOT NULL") if sha in present]
    if files and is_remote(root):  # one listing, not a request a file
        sizes = listed_models(root)
        present.difference_update(sha for sha, path, size in files if sizes.get(path) != size)
    else:
        present.difference_update(sha for sha, path, size in files
                                  if not intact_model(root, path, size))
    present |= packed
    present.difference_update(sha for (sha,) in conn.execute(
        "SELECT sha256 FROM corrupt_artifacts"))
    return present


def loadable_mask(conn: sqlite3.Connection, root: Path | str, artifacts: Any,
                  packs_whole: bool = False) -> Any:
    """:func:`loadable_artifacts` as a mask over ``artifacts`` (a string
    array, nulls allowed: never loadable), the pack locators among them
    checked all at once, without a Python string per model; not at all
    when ``packs_whole`` (the caller knows every pack they name is whole:
    :func:`.packs.all_whole`), only against the models found corrupt."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    artifacts = pa.array(artifacts, pa.string()) if not isinstance(
        artifacts, pa.Array) else artifacts
    mask = np.zeros(len(artifacts), dtype=bool)
    packed = packs.locator_mask(artifacts)
    where = np.flatnonzero(packed)
    if where.size:
        mask[where] = True if packs_whole else packs.whole_mask(
            conn, artifacts if where.size == len(artifacts) else artifacts.take(pa.array(where)))
        corrupt = [sha for (sha,) in conn.execute("SELECT sha256 FROM corrupt_artifacts")]
        if corrupt:
            mask &= ~pc.fill_null(pc.is_in(artifacts, pa.array(corrupt, pa.string())),
                                  False).to_numpy(zero_copy_only=False)
    rest = np.flatnonzero(~packed & artifacts.is_valid().to_numpy(zero_copy_only=False))
    if rest.size:
        names = artifacts.take(pa.array(rest)).to_pylist()
        loadable = loadable_artifacts(conn, root, set(names))
        mask[rest] = [name in loadable for name in names]
    return mask


def _read_packed(conn: sqlite3.Connection, root: Path | str, locator: str, what: str
                 ) -> bytes:
    """A packed model's bytes, checked against its SHA-256 (see :mod:`.packs`)."""
    data, whole = packs.read_model(conn, locator)
    if not whole:  # read again as the pack is now: a held copy may be what failed
        data, whole = packs.read_model(conn, locator, cached=False)
    if whole:
        return data
    digest, pack, offset, size = packs.parse_locator(locator)
    place = f"packed artifact {digest} of {what} (pack {pack}, bytes {offset}-{offset + size})"
    store = f"the store {shown(str(root))!r}"
    if data is None:
        row = conn.execute("SELECT length(blob) FROM packs WHERE pack_id = ?",
                           (pack,)).fetchone()
        if row is None:  # (not marked corrupt: there is nothing left to be)
            raise StoreIntegrityError(
                f"{place} is missing from {store}: its pack is gone (its run was deleted "
                "and collected since the model was listed, or the index was damaged)")
        _mark_corrupt(conn, locator)
        raise StoreIntegrityError(f"{place} is missing from {store}: its pack holds "
                                  f"{row[0]} bytes, cut short of the model's end")
    _mark_corrupt(conn, locator)
    raise StoreIntegrityError(
        f"{place} in {store} does not match its recorded SHA-256: the pack was modified or "
        "truncated, so it is not loaded")


def _mark_corrupt(conn: sqlite3.Connection, digest: str) -> None:
    if conn.in_transaction:
        return
    try:
        conn.execute("INSERT OR IGNORE INTO corrupt_artifacts VALUES (?, ?)",
                     (digest, time.time()))
    except sqlite3.Error:  # a read-only store: it is refused on every load anyway
        pass


def read_artifact(conn: sqlite3.Connection, root: Path | str, digest: str, what: str
                  ) -> bytes:
    """The bytes of an artifact (a SHA-256 or a pack locator), checked against
    its SHA-256."""
    if packs.is_locator(digest):
        return _read_packed(conn, root, digest, what)
    read = read_unpacked(conn, root, digest)
    if read.problem is None:
        return read.data
    if not is_remote(root):  # (on an object store, verify marks: a load writes nothing
        _mark_corrupt(conn, digest)  # a machine would then have to publish)
    if read.error is not None:
        raise StoreIntegrityError(
            f"artifact file {read.relative} of {what} cannot be read: {read.error}"
        ) from read.error
    if read.size is None:
        raise StoreIntegrityError(f"artifact {digest} of {what} is missing from the store "
                                  f"{shown(str(root))!r}")
    raise StoreIntegrityError(
        f"artifact {read.relative or digest} of {what} does not match its recorded "
        f"SHA-256 ({read.length} bytes, {read.size} recorded): it was modified or truncated, "
        "so it is not loaded"
    )


#: What can be wrong with an artifact (:func:`read_unpacked`, ``Store.verify``).
MISSING = "missing"        # its index row, pack or file is gone
UNREADABLE = "unreadable"  # its file is there but cannot be read
TRUNCATED = "truncated"    # fewer (or more) bytes than recorded
MODIFIED = "modified"      # its size, but not its SHA-256


class UnpackedRead(NamedTuple):
    """An artifact of its own (a BLOB row or a file) as read: its bytes when
    whole, else what is wrong with it, and what a message about it names."""

    data: bytes | None
    problem: str | None  # MISSING, UNREADABLE, TRUNCATED, MODIFIED, or None: whole
    relative: str | None = None  # its file, when it has one
    size: int | None = None  # its recorded size (None: no index row)
    length: int = 0  # the bytes read
    error: OSError | None = None  # why its file could not be read


def read_unpacked(conn: sqlite3.Connection, root: Path | str, digest: str) -> UnpackedRead:
    """Read an artifact of its own and check it against its recorded size and
    SHA-256, marking nothing: loads (:func:`read_artifact`) and
    ``Store.verify`` each decide what a problem means."""
    row = conn.execute("SELECT size, blob, path FROM artifacts WHERE sha256 = ?",
                       (digest,)).fetchone()
    if row is None:
        return UnpackedRead(None, MISSING)
    size, blob, relative = row
    if blob is not None:
        data = bytes(blob)
    else:
        try:
            data = read_model_bytes(root, relative)
        except OSError as exc:
            problem = MISSING if isinstance(exc, FileNotFoundError) else UNREADABLE
            return UnpackedRead(None, problem, relative, size, 0, exc)
    if len(data) != size:
        return UnpackedRead(None, TRUNCATED, relative, size, len(data))
    if sha256(data) != digest:
        return UnpackedRead(None, MODIFIED, relative, size, len(data))
    return UnpackedRead(data, None, relative, size, len(data))
