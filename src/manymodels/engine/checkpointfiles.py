"""The files of a checkpoint slot, and how a save stays whole through a crash
at one ``fsync`` per save.

A save writes ``state-<generation>.pkl``: a header (the manifest of that
generation, as JSON, with the payload's size and SHA-256) followed by the
pickled state, and fsyncs it. Only then is ``manifest.json`` replaced (by a
rename, without an fsync of its own) and the previous state file removed.
The manifest is a shortcut, not the only record: a state file describes
itself, so a manifest lost, stale or empty after a crash is made up for by
the newest state file that matches its own header.

Why a crash during a save leaves the previous checkpoint readable: until the
new state file is fsynced, nothing of the previous generation is touched; a
half-written state file fails its SHA-256 and is passed over. The previous
state file is removed after the new one's fsync, and a file system that
journals its metadata in order (ext4, XFS, btrfs, APFS) never keeps that
removal without the new file's creation, issued before it.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
MAGIC = b"MMCKPT1\n"
_LENGTH = 8
_CHUNK = 1 << 20
_STATE_NAME = re.compile(r"state-(\d+)\.pkl")


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
        stream = cloudpickle.dumps(state, protocol=5, buffer_callback=buffers.append)
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
    return pickle.loads(views[0], buffers=views[1:])


def write_state(path: Path, manifest: dict, parts: list[Any]) -> None:
    """Write a self-describing state file (header, then the state's
    ``parts``) and fsync it: the one fsync of a save. Its name is new to
    the slot (the next generation), so no rename is needed; a crash leaves
    a file that fails its own SHA-256."""
    header = json.dumps(manifest).encode()
    with open(path, "wb") as out:
        out.write(MAGIC + len(header).to_bytes(_LENGTH, "big") + header)
        for part in parts:
            out.write(part)
        out.flush()
        os.fsync(out.fileno())


def copy_hashing(source: Path, target: Path) -> tuple[str, int]:
    """Copy a file, hashing it on the way: (SHA-256, size)."""
    digest, size = hashlib.sha256(), 0
    with open(source, "rb") as inp, open(target, "wb") as out:
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
    :class:`CheckpointRefused` (naming the file) when a manifest names a
    checkpoint and nothing in the slot matches."""
    refusal = None
    manifest = None
    manifest_path = slot / MANIFEST
    if manifest_path.exists():
        try:
            manifest = json.loads(manifest_path.read_bytes())
            manifest["generation"], manifest["saved_at"], manifest["attempt"]  # noqa: B018
        except (ValueError, KeyError, TypeError, OSError) as exc:
            refusal = CheckpointRefused(f"{manifest_path} is not a checkpoint manifest ({exc!r})")
            manifest = None
    # A state file newer than the manifest is a save whose manifest was lost.
    floor = manifest["generation"] if manifest else 0
    for generation, path in _state_files(slot):
        if generation <= floor:
            break
        try:
            return verified(slot, _header(path))
        except CheckpointRefused:
            continue  # half-written by a crash: the manifest's is the last whole one
    if manifest is not None:
        try:
            return verified(slot, manifest)
        except CheckpointRefused as exc:
            refusal = exc
    if refusal is None:
        return None, None
    for generation, path in _state_files(slot):  # an older state file, whole?
        if generation < floor:
            try:
                return verified(slot, _header(path))
            except CheckpointRefused:
                continue
    raise refusal


def sweep_states(slot: Path, keep: str | None) -> None:
    """Remove the slot's state files but ``keep`` (saves that a crash left
    half-written, or a generation that its successor replaced)."""
    for _, path in _state_files(slot):
        if path.name != keep:
            path.unlink(missing_ok=True)


def _state_files(slot: Path) -> list[tuple[int, Path]]:
    """The slot's state files, newest generation first."""
    found = []
    for entry in os.scandir(slot):
        match = _STATE_NAME.fullmatch(entry.name)
        if match:
            found.append((int(match.group(1)), Path(entry.path)))
    return sorted(found, reverse=True)


def _header(path: Path) -> dict:
    """The manifest a state file carries in its header."""
    try:
        with open(path, "rb") as inp:
            head = inp.read(len(MAGIC) + _LENGTH)
            if not head.startswith(MAGIC):
                raise CheckpointRefused(f"{path} has no checkpoint header")
            header = json.loads(inp.read(int.from_bytes(head[len(MAGIC):], "big")))
        header["generation"], header["saved_at"], header["attempt"]  # noqa: B018
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CheckpointRefused(f"{path} has no readable checkpoint header ({exc!r})") from exc
    return header


def _read(path: Path) -> bytearray:
    """A file's bytes, writable: the arrays of a state loaded from them are
    views of them, and a training loop changes its arrays in place."""
    with open(path, "rb") as inp:
        data = bytearray(os.fstat(inp.fileno()).st_size)
        inp.readinto(data)
    return data


def _payload(data: bytearray) -> memoryview:
    """A state file's pickled state: after its header (a file with no header
    is all state); a view, not a copy."""
    view = memoryview(data)
    if not data.startswith(MAGIC):
        return view
    length = int.from_bytes(data[len(MAGIC):len(MAGIC) + _LENGTH], "big")
    return view[len(MAGIC) + _LENGTH + length:]


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
            data = _payload(_read(file))
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
