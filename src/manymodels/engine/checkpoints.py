"""Checkpoints inside a task: a long ``fit`` saves its state as it goes, and
a retry or a re-run of the same task resumes from the last state saved
instead of from zero.

A ``fit`` that names a ``checkpoint`` parameter gets a :class:`Checkpoint`.
Its slot is a directory of the run's checkpoint space (see
:mod:`.checkpointspace`), named by the task's identity: a task whose code,
parameters or data changed has another identity, so a stale state is never
resumed. The worker writes the slot itself; nothing of it passes through the
driver.

A slot holds ``manifest.json`` (what is committed: the state file and the
files of :attr:`Checkpoint.path`, each with its size and SHA-256), the state
and file snapshots it names, and ``work/`` (the directory a library writes
its own files into). Every write goes to a temporary name first and the
manifest is replaced last, so a crash during a save leaves the previous
checkpoint whole; a snapshot that does not match its manifest is refused by
name and the task starts afresh.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .dataplane import pickle_any

MANIFEST = "manifest.json"
WORK = "work"
_CHUNK = 1 << 20


def write_atomically(path: Path, data: bytes) -> str:
    """Write ``data`` to ``path`` through a temporary file renamed over it
    (fsynced first: a node that loses power keeps the old file or the new
    one); return its SHA-256."""
    temporary = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        with open(temporary, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return hashlib.sha256(data).hexdigest()


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


class CheckpointRefused(Exception):
    """A slot's committed checkpoint does not match its manifest (tampered
    with, or truncated): the message names the file."""


class Checkpoint:
    """The checkpoint of one task, as ``fit(..., checkpoint)`` receives it.

    ``load()`` returns the last state this task saved (in an earlier attempt
    or an earlier run of the same task), or None; ``save(state)`` saves any
    picklable state atomically; ``every(seconds)`` says when a save is due.
    ``path`` is a private directory for libraries that write their own files
    (``torch.save``, a LightGBM model file): what is in it is committed by
    :meth:`commit`, or at the end of a ``with checkpoint as directory:`` block,
    and a resumed task finds the last committed files there again."""

    def __init__(self, slot: Path, *, attempt: int = 1, owner: dict | None = None,
                 report: Callable[[str, dict], None] | None = None) -> None:
        self._slot = slot
        #: How many times this task has started with this slot (1 the first time).
        self.attempt = attempt
        self._owner = owner or {}  # the run that saves: its token and store run id
        self._report = report  # told ("resumed" | "refused", details)
        self._manifest: dict[str, Any] | None = None
        self._state_bytes: bytes | None = None
        self._checked = False
        self._work_ready = False
        self._last_save = time.monotonic()
        #: Whether this task resumed from a checkpoint (known once load() or path ran).
        self.resumed = False

    # -- reading what was saved ------------------------------------------------

    def load(self) -> Any:
        """The last state this task saved, or None (nothing saved yet, or what
        was saved was refused: see the run's ``resumed_from``)."""
        self._check()
        if self._state_bytes is None:
            return None
        try:
            return pickle.loads(self._state_bytes)
        except Exception as exc:  # the bytes matched: the state's classes changed
            self._refuse(f"its state cannot be unpickled: {exc!r}")
            return None

    @property
    def path(self) -> Path:
        """A private directory holding the last committed files (or nothing)."""
        self._check()
        work = self._slot / WORK
        if not self._work_ready:
            shutil.rmtree(work, ignore_errors=True)  # an attempt's uncommitted writes
            work.mkdir(parents=True)
            files = (self._manifest or {}).get("files")
            if files:
                for name in files["entries"]:
                    target = work / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(self._slot / files["dir"] / name, target)
            self._work_ready = True
        return work

    def _check(self) -> None:
        """Read and verify the slot's manifest and everything it names, once."""
        if self._checked:
            return
        self._checked = True
        manifest_path = self._slot / MANIFEST
        if not manifest_path.exists():
            return
        try:
            manifest, state = _verified(self._slot, manifest_path)
        except CheckpointRefused as exc:
            self._refuse(str(exc))
            return
        self._manifest, self._state_bytes = manifest, state
        self.resumed = True
        if self._report is not None:
            self._report("resumed", {"saved_at": manifest["saved_at"],
                                        "attempt": manifest["attempt"],
                                        "run_id": manifest.get("run_id"),
                                        "token": manifest.get("token")})

    def _refuse(self, reason: str) -> None:
        """Forget a checkpoint that cannot be resumed: the task starts afresh."""
        self._manifest, self._state_bytes, self.resumed = None, None, False
        for entry in list(self._slot.iterdir()):
            if entry.name != "attempts":
                (shutil.rmtree if entry.is_dir() else os.unlink)(entry)
        if self._report is not None:
            self._report("refused", {"reason": reason})

    # -- saving ----------------------------------------------------------------

    def every(self, seconds: float) -> bool:
        """Whether ``seconds`` have passed since the last save (or since the
        task started): ``if checkpoint.every(60): checkpoint.save(state)``."""
        if not seconds >= 0:
            raise ValueError(f"checkpoint.every(seconds): seconds must be >= 0, got {seconds!r}")
        return time.monotonic() - self._last_save >= seconds

    def save(self, state: Any) -> None:
        """Save ``state`` (anything picklable) as this task's checkpoint,
        atomically: until it is complete, the previous one stays the one
        :meth:`load` returns."""
        self._check()
        data = pickle_any(state)
        generation = self._generation() + 1
        name = f"state-{generation}.pkl"
        digest = write_atomically(self._slot / name, data)
        self._publish(generation, state={"name": name, "sha256": digest, "size": len(data)},
                      files=(self._manifest or {}).get("files"))
        self._state_bytes = data

    def commit(self, state: Any = None) -> None:
        """Commit the files in :attr:`path` (and ``state``, when given) as this
        task's checkpoint, atomically."""
        work = self.path
        generation = self._generation() + 1
        target = self._slot / f"files-{generation}"
        temporary = self._slot / f".tmp-files-{generation}-{os.getpid()}"
        shutil.rmtree(temporary, ignore_errors=True)
        entries: dict[str, list] = {}
        try:
            for file in sorted(p for p in work.rglob("*") if p.is_file()):
                name = file.relative_to(work).as_posix()
                (temporary / name).parent.mkdir(parents=True, exist_ok=True)
                entries[name] = list(copy_hashing(file, temporary / name))
            temporary.mkdir(exist_ok=True)
            os.replace(temporary, target)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        previous = self._manifest or {}
        kept_state = previous.get("state")
        if state is not None:
            data = pickle_any(state)
            name = f"state-{generation}.pkl"
            kept_state = {"name": name, "size": len(data),
                          "sha256": write_atomically(self._slot / name, data)}
            self._state_bytes = data
        self._publish(generation, state=kept_state,
                      files={"dir": target.name, "entries": entries})

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is None:
            self.commit()

    def _generation(self) -> int:
        return (self._manifest or {}).get("generation", 0)

    def _publish(self, generation: int, state: dict | None, files: dict | None) -> None:
        """Replace the manifest, then remove what the previous one named."""
        previous = self._manifest or {}
        manifest = {"generation": generation, "saved_at": time.time(), "attempt": self.attempt,
                    "state": state, "files": files, **self._owner}
        write_atomically(self._slot / MANIFEST, json.dumps(manifest).encode())
        self._manifest = manifest
        self._last_save = time.monotonic()
        old_state, old_files = previous.get("state"), previous.get("files")
        if old_state and (state is None or old_state["name"] != state["name"]):
            (self._slot / old_state["name"]).unlink(missing_ok=True)
        if old_files and (files is None or old_files["dir"] != files["dir"]):
            shutil.rmtree(self._slot / old_files["dir"], ignore_errors=True)

    def __repr__(self) -> str:
        return f"Checkpoint({str(self._slot)!r}, attempt={self.attempt})"


def _verified(slot: Path, manifest_path: Path) -> tuple[dict, bytes | None]:
    """A slot's manifest and its state's bytes, each file checked against
    the size and SHA-256 the manifest gives it."""
    try:
        manifest = json.loads(manifest_path.read_bytes())
        state, files = manifest.get("state"), manifest.get("files")
        manifest["saved_at"], manifest["attempt"]  # noqa: B018 (both must be there)
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
        raise CheckpointRefused(f"{manifest_path} is not a checkpoint manifest ({exc!r})") \
            from exc
    data = None
    if state:
        file = slot / state["name"]
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise CheckpointRefused(f"{file} cannot be read ({exc.strerror})") from exc
        if len(data) != state["size"] or hashlib.sha256(data).hexdigest() != state["sha256"]:
            raise CheckpointRefused(f"{file} does not match its SHA-256 "
                                    f"({len(data)} bytes, {state['size']} saved)")
    for name, (digest, size) in ((files or {}).get("entries") or {}).items():
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
