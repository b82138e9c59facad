"""The files of a checkpoint slot, and how a save stays whole through a crash
at one flush to disk per save.

A slot has two state files, ``state-a.pkl`` and ``state-b.pkl``, used in
turn: a save overwrites, in place, the one that the manifest does not name,
with a header (that generation's manifest, as JSON, with the payload's size
and SHA-256, padded to a whole page) followed by the pickled state, and
flushes it (``fdatasync``). Only then is ``manifest.json`` overwritten, in
place and without a flush of its own: it is a shortcut, not the only record.
A state file describes itself, so a manifest lost, stale or torn by a crash
is made up for by the newest state file that matches its own SHA-256.

Why a crash during a save leaves the previous checkpoint readable: the save
writes only into the other state file, so the one the manifest names stays
as it was flushed by the previous save; a half-written state file fails its
SHA-256 and is passed over. Writing in place, into a file of the same size
as the last time (the header is padded), changes no metadata: the flush
writes the data and nothing else, no block is allocated or freed, no journal
commit waited for.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

MANIFEST = "manifest.json"
MAGIC = b"MMCKPT1\n"
_LENGTH = 8
_CHUNK = 1 << 20
_PAGE = 4096
#: Where a resumed state's large buffers start in memory: a multiple of any
#: dtype's alignment, and of a cache line.
_BUFFER_ALIGNMENT = 64
#: The two state files of a slot, written in turn.
STATE_FILES = ("state-a.pkl", "state-b.pkl")
_flush = getattr(os, "fdatasync", os.fsync)  # (macOS has no fdatasync)


class CheckpointRefused(Exception):
    """A slot's committed checkpoint does not match its manifest (tampered
    with, or truncated): the message names the file."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def write_atomically(path: Path, data: bytes, *, durable: bool = True) -> str:
    """Write ``data`` to ``path`` through a temporary file renamed over it
    (fsynced first when ``durable``: a node that loses power keeps the old
    file or the new one); return its SHA-256."""
    temporary = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        with open(temporary, "wb") as out:
            out.write(data)
            if durable:
                out.flush()
                os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return sha256(data)


def pickled(state: Any) -> tuple[list[Any], dict]:
    """``state`` pickled as parts (the pickle, then the large buffers it
    holds, NumPy arrays' data among them, out of band: written from where
    they are, never copied into one bytes) and the state's manifest entry
    but its name: the parts' sizes, their total and SHA-256."""
    buffers: list[pickle.PickleBuffer] = []
    try:
        stream = pickle.dumps(state, protocol=5, buffer_callback=buffers.append)
    except Exception:  # lambdas, classes defined in __main__
        import cloudpickle

        buffers = []
        try:
            stream = cloudpickle.dumps(state, protocol=5, buffer_callback=buffers.append)
        except Exception as exc:  # (a lock, an open file: the fit's error says what)
            raise TypeError(f"the checkpoint's state ({type(state).__name__}) cannot be "
                            f"pickled, so it is not saved: {exc}") from exc
    parts = [stream, *(buffer.raw() for buffer in buffers)]
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part)
    sizes = [len(part) if isinstance(part, bytes) else part.nbytes for part in parts]
    return parts, {"sha256": digest.hexdigest(), "size": sum(sizes), "parts": sizes}


def unpickled(payload: memoryview, entry: dict) -> Any:
    """The state of a payload :func:`pickled` made (or one plain pickle)."""
    sizes = entry.get("parts")
    if not sizes:
        return pickle.loads(payload)
    views, at = [], 0
    for size in sizes:
        views.append(payload[at:at + size])
        at += size
    # the first buffer is aligned where the file was read (see _read); a later
    # one that is not (after an odd-sized one) is copied to memory that is
    return pickle.loads(views[0], buffers=[views[1], *map(_aligned, views[2:])]
                        if len(views) > 1 else [])


def _address(buffer: Any) -> int:
    import numpy as np

    return np.frombuffer(buffer, np.uint8).ctypes.data if len(buffer) else 0


def _aligned(view: memoryview) -> memoryview:
    """``view``, or a writable copy of it at an address aligned for any dtype."""
    if _address(view) % _BUFFER_ALIGNMENT == 0:
        return view
    copy = bytearray(len(view) + _BUFFER_ALIGNMENT)
    shift = -_address(copy) % _BUFFER_ALIGNMENT
    aligned = memoryview(copy)[shift:shift + len(view)]
    aligned[:] = view
    return aligned


def next_state_file(manifest: dict | None) -> str:
    """The state file a save writes: the one the manifest does not name."""
    named = ((manifest or {}).get("state") or {}).get("name")
    return STATE_FILES[1] if named == STATE_FILES[0] else STATE_FILES[0]


def write_state(path: Path, manifest: dict, parts: list[Any]) -> None:
    """Write a self-describing state file (header, then the state's
    ``parts``) over ``path``, in place, and flush it: the one flush of a
    save. A crash leaves a file that fails its own SHA-256."""
    header = json.dumps(manifest).encode()
    header += b" " * (-(len(MAGIC) + _LENGTH + len(header)) % _PAGE)
    _write_in_place(path, [MAGIC + len(header).to_bytes(_LENGTH, "big") + header, *parts],
                    flush=True)


def write_manifest(path: Path, manifest: dict) -> None:
    """Overwrite the manifest in place, padded to a whole page, unflushed: a
    torn or lost one is made up for by the state files (see the module's
    docstring)."""
    data = json.dumps(manifest).encode()
    _write_in_place(path, [data + b" " * (-len(data) % _PAGE)], flush=False)


def _write_in_place(path: Path, parts: list[Any], flush: bool) -> None:
    """Write ``parts`` from the start of ``path`` (made if missing), cut what
    is left beyond them, and flush the data when asked."""
    with _naming(path):
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        with os.fdopen(descriptor, "wb") as out:
            for part in parts:
                out.write(part)
            end = out.tell()
            out.flush()
            if os.fstat(descriptor).st_size > end:
                os.ftruncate(descriptor, end)
            if flush:
                _flush(descriptor)


@contextlib.contextmanager
def _naming(path: Path) -> Iterator[None]:
    """Name ``path`` in an error of the write (a full disk, a file-size
    limit: ``[Errno 28] No space left on device``, which named no file, was
    all a failed ``save`` said)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, f"{exc.strerror} (writing a checkpoint: the previous "
                                 "one is kept)", str(path)) from exc


def copy_hashing(source: Path, target: Path) -> tuple[str, int]:
    """Copy a file, hashing it on the way: (SHA-256, size)."""
    digest, size = hashlib.sha256(), 0
    with _naming(target), open(source, "rb") as inp, open(target, "wb") as out:
        while chunk := inp.read(_CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest(), size


def newest_whole(slot: Path) -> tuple[dict | None, memoryview | None]:
    """The slot's newest checkpoint that matches its SHA-256s: (manifest,
    state bytes), or (None, None) when nothing was saved. Raises
    :class:`CheckpointRefused` (naming the file) when the manifest names a
    checkpoint that does not match: it was whole when the manifest named it,
    so it was tampered with, and the task starts afresh."""
    manifest, refusal = None, None
    manifest_path = slot / MANIFEST
    if manifest_path.exists():
        try:
            manifest = _checked(json.loads(manifest_path.read_bytes()))
        except (ValueError, KeyError, TypeError, OSError) as exc:  # torn by a crash?
            refusal = CheckpointRefused(f"{manifest_path} is not a checkpoint manifest ({exc!r})")
    # A state file newer than the manifest is a save whose manifest was lost.
    floor = manifest["generation"] if manifest else 0
    for header in _headers(slot):
        if header["generation"] <= floor:
            break
        try:
            return verified(slot, header)
        except CheckpointRefused:
            continue  # half-written by a crash: an older one is the last whole one
    if manifest is not None:
        return verified(slot, manifest)
    if refusal is not None:
        raise refusal
    return None, None


def newest_named(slot: Path) -> dict | None:
    """The slot's manifest where a save that read nothing may go by it
    without reading and hashing the state it names (which the save
    replaces, never keeps): the manifest readable and of the shapes
    written, no state file's header newer (a save whose manifest was lost,
    or one cut short: which is whole only its hash tells), and naming no
    committed files (those a save keeps: checked). None otherwise:
    :func:`newest_whole` decides."""
    try:
        manifest = _checked(json.loads((slot / MANIFEST).read_bytes()))
    except (ValueError, KeyError, TypeError, OSError):
        return None
    if manifest.get("files") or any(header["generation"] > manifest["generation"]
                                    for header in _headers(slot)):
        return None
    return manifest


def slot_manifest(slot: Path) -> dict | None:
    """The slot's manifest, or (lost or torn) that of its newest state
    file's header, unverified: who saved it, for :meth:`Store.gc`."""
    try:
        return _checked(json.loads((slot / MANIFEST).read_bytes()))
    except (ValueError, KeyError, TypeError, OSError):
        return next(iter(_headers(slot)), None)


_FILES_DIR = re.compile(r"files-[0-9]+")


def _checked(manifest: Any) -> dict:
    """``manifest`` where it is one this module writes, field by field;
    else a ``TypeError`` or ``ValueError`` naming the field (a manifest of
    another version, or one edited by hand, is refused, not followed: its
    names are paths inside the slot, removed when a later commit replaces
    them, and one such as ``../..`` would lead out of it)."""
    def integer(value: Any, field: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise TypeError(f"{field} is not a count: {value!r}")
        return value

    if not isinstance(manifest, dict):
        raise TypeError(f"a manifest is a JSON object, not {type(manifest).__name__}")
    integer(manifest["generation"], "generation")
    integer(manifest["attempt"], "attempt")
    if isinstance(manifest["saved_at"], bool) or not isinstance(manifest["saved_at"],
                                                                 (int, float)):
        raise TypeError(f"saved_at is not a time: {manifest['saved_at']!r}")
    state, files = manifest.get("state"), manifest.get("files")
    if state is not None:
        if not isinstance(state, dict) or state.get("name") not in STATE_FILES:
            raise ValueError(f"state does not name a state file: {state!r:.200}")
        integer(state["size"], "state.size")
        _digest(state["sha256"], "state.sha256")
        parts = state.get("parts")
        if parts is not None and (not isinstance(parts, list) or sum(
                integer(size, "state.parts") for size in parts) != state["size"]):
            raise ValueError(f"state.parts do not add up to state.size: {parts!r:.200}")
    if files is not None:
        if not isinstance(files, dict) or not isinstance(files.get("dir"), str) or (
                not _FILES_DIR.fullmatch(files["dir"])):
            raise ValueError(f"files does not name a files folder: {files!r:.200}")
        entries = files.get("entries")
        if not isinstance(entries, dict):
            raise TypeError(f"files.entries is not a mapping: {entries!r:.200}")
        for name, entry in entries.items():
            _inside(name, "files.entries")
            if not isinstance(entry, list) or len(entry) != 2:
                raise TypeError(f"files.entries[{name!r}] is not [sha256, size]: {entry!r}")
            _digest(entry[0], f"files.entries[{name!r}]")
            integer(entry[1], f"files.entries[{name!r}] size")
        folders, links = files.get("folders", []), files.get("links", {})
        if not isinstance(folders, list) or not isinstance(links, dict):
            raise TypeError(f"files.folders is not a list, or files.links not a mapping: "
                            f"{folders!r:.100}, {links!r:.100}")
        for name in folders:
            _inside(name, "files.folders")
        for name, points_to in links.items():
            _inside(name, "files.links")
            if not isinstance(points_to, str) or not points_to or "\0" in points_to:
                raise TypeError(f"files.links[{name!r}] is not a link's target: "
                                f"{points_to!r:.200}")
        _refuse_names_under_links([*entries, *folders, *links], links)
    return manifest


def _refuse_names_under_links(names: list[str], links: dict) -> None:
    """A commit never goes into a linked folder: a name under a link's (a
    manifest edited by hand) would be made wherever the link points."""
    if len(set(names)) != len(names):
        raise ValueError("files names one path twice (a file, a folder or a link)")
    for name in names:
        parts = PurePosixPath(name).parts
        for depth in range(1, len(parts)):
            link = PurePosixPath(*parts[:depth]).as_posix()
            if link in links:
                raise ValueError(f"files names {name!r} under the link {link!r}")


def _inside(name: Any, field: str) -> None:
    """Refuse a name in a manifest that leads out of its folder (a manifest
    edited by hand: nothing outside the task's folder is written)."""
    if not isinstance(name, str):
        raise TypeError(f"{field} names a path that is not text: {name!r:.200}")
    parts = PurePosixPath(name).parts
    # (a backslash is a name's own character on POSIX, a separator on Windows)
    if not name or name.startswith("/") or ".." in parts or "\0" in name or (
            os.sep == "\\" and "\\" in name):
        raise ValueError(f"{field} names a path outside its folder: {name!r}")


def _digest(value: Any, field: str) -> None:
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{64}", value):
        raise ValueError(f"{field} is not a SHA-256: {value!r:.80}")


def _headers(slot: Path) -> list[dict]:
    """The headers of the slot's state files that can be read, newest first."""
    found = []
    for name in STATE_FILES:
        try:
            found.append(_header(slot / name))
        except CheckpointRefused:
            continue
    return sorted(found, key=lambda header: header["generation"], reverse=True)


def _header(path: Path) -> dict:
    """The manifest a state file carries in its header."""
    if not path.exists():
        raise CheckpointRefused(f"{path} is missing")
    try:
        with open(path, "rb") as inp:
            head = inp.read(len(MAGIC) + _LENGTH)
            if not head.startswith(MAGIC):
                raise CheckpointRefused(f"{path} has no checkpoint header")
            header = _checked(json.loads(inp.read(int.from_bytes(head[len(MAGIC):], "big"))))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointRefused(f"{path} has no readable checkpoint header ({exc!r})") from exc
    return header


def _read(path: Path, pickle_size: int) -> memoryview:
    """A state file's bytes, writable (the arrays of a state loaded from them
    are views of them, and a training loop changes its arrays in place), in
    memory placed so that the state's first large buffer, ``pickle_size``
    bytes after its header, starts on a 64-byte boundary: an array at an
    address its dtype does not divide is flagged unaligned, and each
    in-place operation on it is several times slower."""
    with open(path, "rb") as inp:
        size = os.fstat(inp.fileno()).st_size
        head = os.pread(inp.fileno(), len(MAGIC) + _LENGTH, 0)
        start = _payload_start(head)
        data = bytearray(size + _BUFFER_ALIGNMENT)
        shift = -(_address(data) + start + pickle_size) % _BUFFER_ALIGNMENT
        view = memoryview(data)[shift:shift + size]
        inp.readinto(view)
    return view


def _payload_start(head: bytes) -> int:
    """Where a state file's pickled state starts, from its first bytes: after
    its header (a file with no header is all state)."""
    if not head.startswith(MAGIC) or len(head) < len(MAGIC) + _LENGTH:
        return 0
    return len(MAGIC) + _LENGTH + int.from_bytes(head[len(MAGIC):], "big")


def _payload(data: memoryview) -> memoryview:
    """A state file's pickled state: a view, not a copy."""
    return data[min(_payload_start(bytes(data[:len(MAGIC) + _LENGTH])), len(data)):]


def verified(slot: Path, manifest: dict) -> tuple[dict, memoryview | None]:
    """A manifest and its state's bytes, each file it names checked against
    the size and SHA-256 the manifest gives it."""
    try:
        state, files = manifest.get("state"), manifest.get("files")
        entries = (files or {}).get("entries") or {}
        if state:
            state["name"], state["size"], state["sha256"]  # noqa: B018
    except (AttributeError, TypeError, KeyError) as exc:
        raise CheckpointRefused(f"{slot / MANIFEST} is not a checkpoint manifest "
                                f"({exc!r})") from exc
    data = None
    if state:
        file = slot / state["name"]
        try:
            data = _payload(_read(file, (state.get("parts") or [0])[0]))
        except OSError as exc:
            raise CheckpointRefused(f"{file} cannot be read ({exc.strerror})") from exc
        if len(data) != state["size"] or sha256(data) != state["sha256"]:
            raise CheckpointRefused(f"{file} does not match its SHA-256 "
                                    f"({len(data)} bytes, {state['size']} saved)")
    for name, (digest, size) in entries.items():
        file = slot / files["dir"] / name
        try:
            found = _file_sha256(file)
        except OSError as exc:
            raise CheckpointRefused(f"{file} cannot be read ({exc.strerror})") from exc
        if found != (digest, size):
            raise CheckpointRefused(f"{file} does not match its SHA-256 "
                                    f"({found[1]} bytes, {size} saved)")
    return manifest, data


def _file_sha256(path: Path) -> tuple[str, int]:
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as inp:
        while chunk := inp.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return digest.hexdigest(), size
