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
files of :attr:`Checkpoint.path`, each with its size and SHA-256), two
state files written in turn, the file snapshot it names, and ``work/`` (the
directory a library writes its own files into). A save costs one flush to
disk: it overwrites the state file the manifest does not name, which
describes itself, and the manifest written after it is a shortcut (see
:mod:`.checkpointfiles`), so a crash during a save leaves the previous
checkpoint whole; a snapshot that does not match its manifest is refused by
name and the task starts afresh.
"""

from __future__ import annotations

import json
import numbers
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .checkpointfiles import (
    MANIFEST,
    CheckpointRefused,
    copy_hashing,
    newest_named,
    newest_whole,
    next_state_file,
    pickled,
    unpickled,
    verified,
    write_atomically,
    write_manifest,
    write_state,
)

__all__ = ["ATTEMPTS", "ATTEMPTS_LOCK", "MANIFEST", "WORK", "Checkpoint", "CheckpointRefused",
           "CheckpointSuperseded"]

WORK = "work"
#: In a slot: the number of the latest attempt started with it.
ATTEMPTS = "attempts"
#: In a slot: the file locked while an attempt takes its number (two taking
#: one at the same instant each read the same count).
ATTEMPTS_LOCK = "attempts.lock"


class CheckpointSuperseded(RuntimeError):
    """A later attempt of the task has started with the slot (the driver
    gave up on this one: a timeout on an engine that cannot stop a running
    task): this one may no longer write there, or the two would remove each
    other's files."""


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
                 report: Callable[[str, dict], None] | None = None,
                 run_alive: Callable[[], bool] | None = None) -> None:
        self._slot = slot
        #: Whether the run this attempt belongs to still holds its space.
        self._run_alive = run_alive
        #: How many times this run has started this task (1 the first time; a
        #: run that resumes an earlier run's checkpoint starts at 1 again).
        self.attempt = attempt
        self._owner = owner or {}  # the run that saves: its token and store run id
        self._report = report  # told ("resumed" | "refused", details)
        self._manifest: dict[str, Any] | None = None
        self._found: dict[str, Any] | None = None  # found, not yet resumed (nor saved over)
        self._state_bytes: memoryview | None = None  # as read; None after a save
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
        if self._state_bytes is None and (self._manifest or {}).get("state"):
            try:  # saved by this attempt: read back as saved, not as changed since
                self._state_bytes = verified(self._slot, self._manifest)[1]
            except CheckpointRefused as exc:
                self._refuse(str(exc))
        if self._state_bytes is None:
            return None
        try:
            state = unpickled(self._state_bytes, self._manifest["state"])
        except Exception as exc:  # the bytes matched: the state's classes changed
            self._refuse(f"its state cannot be unpickled: {exc!r}")
            return None
        # the state's arrays are views of these bytes: a second load reads the
        # file again, not the first one's arrays as the fit changed them since
        self._state_bytes = None
        return state

    @property
    def _work(self) -> Path:
        """This attempt's folder of files (one per attempt: an attempt the
        run gave up on, still running, writes into its own, not the next's)."""
        return self._slot / f"{WORK}-{self.attempt}"

    @property
    def path(self) -> Path:
        """A private directory holding the last committed files (or nothing)."""
        self._check()
        work = self._work
        if not self._work_ready:
            self._require_latest()
            for entry in list(self._slot.iterdir()):  # attempts' uncommitted writes
                if entry.name == WORK or entry.name.startswith(f"{WORK}-"):
                    shutil.rmtree(entry, ignore_errors=True)
            work.mkdir(parents=True)
            files = (self._manifest or {}).get("files")
            if files:
                self._restore(files, work)
            self._work_ready = True
        return work

    def _restore(self, files: dict, work: Path) -> None:
        """The committed files into ``work``: each file copied, each empty
        folder and each symbolic link made again as it was."""
        for name in files["entries"]:
            target = work / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(self._slot / files["dir"] / name, target)
        for name in files.get("folders", []):
            (work / name).mkdir(parents=True, exist_ok=True)
        for name, points_to in files.get("links", {}).items():
            (work / name).parent.mkdir(parents=True, exist_ok=True)
            os.symlink(points_to, work / name)

    def _check(self, resuming: bool = True) -> None:
        """Read and verify the slot's manifest and everything it names, once;
        when ``resuming`` (a load, a first use of :attr:`path`), the task
        resumes what was found, if it has not saved over it first: a fit
        that only saves resumes nothing, and is not reported resumed. A
        save's check (not ``resuming``) reads the state's bytes only where
        the manifest alone cannot be gone by (see :func:`newest_named`):
        the save replaces that state, and a later load checks it."""
        if not self._checked and not resuming:
            named = newest_named(self._slot)
            if named is not None:
                self._checked = True
                self._manifest, self._found = named, named
        if not self._checked:
            self._checked = True
            try:
                manifest, state = newest_whole(self._slot)
            except CheckpointRefused as exc:
                self._refuse(str(exc))
                return
            if manifest is None:
                return
            self._manifest, self._state_bytes, self._found = manifest, state, manifest
        if resuming and self._found is not None:
            found, self._found = self._found, None
            self.resumed = True
            if self._report is not None:
                self._report("resumed", {"saved_at": found["saved_at"],
                                            "attempt": found["attempt"],
                                            "run_id": found.get("run_id"),
                                            "token": found.get("token")})

    def _refuse(self, reason: str) -> None:
        """Forget a checkpoint that cannot be resumed: the task starts afresh
        (its :attr:`path`, where the fit has it already, empty). An attempt
        given up on is refused first: what it cannot read is what its retry
        wrote since, which is not its to remove."""
        self._require_latest()
        self._manifest, self._state_bytes, self.resumed = None, None, False
        self._found = None
        for entry in list(self._slot.iterdir()):
            if entry.name not in (ATTEMPTS, ATTEMPTS_LOCK):
                (shutil.rmtree if entry.is_dir() else os.unlink)(entry)
        if self._work_ready:
            self._work.mkdir()
        if self._report is not None:
            self._report("refused", {"reason": reason})

    # -- saving ----------------------------------------------------------------

    def every(self, seconds: float) -> bool:
        """Whether ``seconds`` have passed since the last save (or since the
        task started): ``if checkpoint.every(60): checkpoint.save(state)``."""
        if isinstance(seconds, bool) or not isinstance(seconds, numbers.Real):
            raise TypeError(f"checkpoint.every(seconds): seconds must be a number, got "
                            f"{seconds!r}")
        if not seconds >= 0:
            raise ValueError(f"checkpoint.every(seconds): seconds must be >= 0, got {seconds!r}")
        return time.monotonic() - self._last_save >= seconds

    def save(self, state: Any) -> None:
        """Save ``state`` (anything picklable) as this task's checkpoint,
        atomically: until it is complete, the previous one stays the one
        :meth:`load` returns."""
        self._check(resuming=False)
        self._require_latest()
        parts, entry = pickled(state)
        generation = self._generation() + 1
        entry["name"] = next_state_file(self._manifest)
        manifest = self._manifest_for(generation, entry, (self._manifest or {}).get("files"))
        write_state(self._slot / entry["name"], manifest, parts)
        self._publish(manifest, durable=False)
        self._state_bytes, self._found = None, None  # (saved over: nothing to resume)

    def commit(self, state: Any = None) -> None:
        """Commit the files in :attr:`path` (and ``state``, when given) as this
        task's checkpoint, atomically."""
        work = self.path
        self._require_latest()
        _require_folder(work)
        parts = None if state is None else pickled(state)  # (refused before any file moves)
        generation = self._generation() + 1
        target = self._slot / f"files-{generation}"
        temporary = self._slot / f".tmp-files-{generation}-{os.getpid()}"
        self._clear_leftovers()
        try:
            files = _copy_committed(work, temporary)
            os.replace(temporary, target)
        except BaseException:
            shutil.rmtree(temporary, ignore_errors=True)
            raise
        files["dir"] = target.name
        kept_state = (self._manifest or {}).get("state")
        if parts is not None:
            parts, kept_state = parts
            kept_state["name"] = next_state_file(self._manifest)
            write_state(self._slot / kept_state["name"],
                        self._manifest_for(generation, kept_state, files), parts)
            self._state_bytes = None
        # The manifest is fsynced here: the state file it may name (an older
        # one) does not describe these files.
        self._publish(self._manifest_for(generation, kept_state, files), durable=True)

    def _require_latest(self) -> None:
        """Refuse to write where a later attempt of the task has started, or
        once this attempt's run has ended (:class:`CheckpointSuperseded`).
        A slot without an attempts counter (made by hand) has no later
        attempt."""
        self._require_running_run()
        try:
            latest = int((self._slot / ATTEMPTS).read_text())
        except (OSError, ValueError):
            return
        if latest > self.attempt:
            raise CheckpointSuperseded(
                f"checkpoint {str(self._slot)!r}: attempt {latest} of this task has started "
                f"since this one (attempt {self.attempt}) did, and writes there now: this "
                "attempt may no longer use it (its run gave up on it)")

    def _require_running_run(self) -> None:
        """Refuse to write once the run has ended: a fit that an engine could
        not stop at once (a forced cancel on Ray, Spark or Dask ends its
        process a moment later) saved into a slot the next run may have
        claimed, or made again the folders of a run without a store that
        had been removed. The run has ended once its driver released the
        space (see :func:`.checkpointspace.still_held`); a file system that
        cannot answer is taken for held."""
        if self._run_alive is None:
            return
        try:
            alive = self._run_alive()
        except OSError:
            return
        if not alive:
            raise CheckpointSuperseded(
                f"checkpoint {str(self._slot)!r}: the run of this attempt ({self.attempt}) "
                "has ended (stopped, or its driver is gone): it may no longer write there")

    def _clear_leftovers(self) -> None:
        """Remove the committed-files folders no manifest names: an attempt
        killed (or timed out, or failing) between putting its files in place
        and naming them left its ``files-<n>``, which the next commit of the
        same generation would have been refused to replace; the temporary
        folders of attempts killed while copying; and the temporary files
        of other processes' manifests (``.tmp-manifest.json-<pid>``): only
        this attempt writes here now (:meth:`_require_latest`), so another
        process's was left by an attempt killed mid-write, one a kill."""
        named = ((self._manifest or {}).get("files") or {}).get("dir")
        own = f"-{os.getpid()}"
        for entry in list(self._slot.iterdir()):
            if entry.is_dir() and entry.name != named and (
                    entry.name.startswith(".tmp-files-") or entry.name.startswith("files-")):
                shutil.rmtree(entry, ignore_errors=True)
            elif entry.name.startswith(f".tmp-{MANIFEST}-") and not entry.name.endswith(own):
                entry.unlink(missing_ok=True)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, kind: Any, value: Any, traceback: Any) -> None:
        if kind is None:
            self.commit()

    def _generation(self) -> int:
        return (self._manifest or {}).get("generation", 0)

    def _manifest_for(self, generation: int, state: dict | None, files: dict | None) -> dict:
        return {"generation": generation, "saved_at": time.time(), "attempt": self.attempt,
                "state": state, "files": files, **self._owner}

    def _publish(self, manifest: dict, durable: bool) -> None:
        """Replace the manifest (flushed when ``durable``), then remove the
        files that the previous one named and this one does not."""
        previous = self._manifest or {}
        if durable:
            write_atomically(self._slot / MANIFEST, json.dumps(manifest).encode())
        else:
            write_manifest(self._slot / MANIFEST, manifest)
        self._manifest = manifest
        self._last_save = time.monotonic()
        files, old_files = manifest["files"], previous.get("files")
        if old_files and (files is None or old_files["dir"] != files["dir"]):
            shutil.rmtree(self._slot / old_files["dir"], ignore_errors=True)

    def __repr__(self) -> str:
        return f"Checkpoint({str(self._slot)!r}, attempt={self.attempt})"


def _require_folder(work: Path) -> None:
    """Refuse to commit a ``path`` the fit removed (a library that clears its
    folder to write it again, failing before it did): committed, the empty
    set of files replaced the last ones, and the state committed with them
    (how many rounds they hold) named files that were gone."""
    if not work.is_dir() or work.is_symlink():
        raise FileNotFoundError(
            f"checkpoint.commit: checkpoint.path {str(work)!r} is no longer a folder (removed "
            "or replaced since): nothing was committed, the last checkpoint is kept; write "
            "the files into that folder (make it again if it was removed)")


def _copy_committed(work: Path, temporary: Path) -> dict[str, Any]:
    """Copy what ``work`` holds into ``temporary``, and say it as a manifest's
    ``files``: ``entries`` (each file's SHA-256 and size), and, where there
    are any, ``folders`` (the empty ones) and ``links`` (each symbolic link's
    target, as it reads: a link is committed as a link, never as a copy of
    what it points to, a folder of another checkpoint or a file outside).
    Libraries expect both again on resume (a ``latest`` link to the last
    round's folder, a ``logs/`` folder made up front)."""
    entries: dict[str, list] = {}
    folders: list[str] = []
    links: dict[str, str] = {}
    temporary.mkdir(exist_ok=True)
    for item in sorted(work.rglob("*")):  # (never into a linked folder)
        name = item.relative_to(work).as_posix()
        if item.is_symlink():
            links[name] = _link_target(item, work)
        elif item.is_file():
            (temporary / name).parent.mkdir(parents=True, exist_ok=True)
            entries[name] = list(copy_hashing(item, temporary / name))
        elif item.is_dir() and not any(item.iterdir()):
            folders.append(name)
    files: dict[str, Any] = {"entries": entries}
    if folders:
        files["folders"] = folders
    if links:
        files["links"] = links
    return files


def _link_target(link: Path, work: Path) -> str:
    """The target of ``link`` (in ``work``) as committed: as it reads, but
    for an absolute one that leads into ``work`` itself (``latest`` made by
    ``(path / "latest").symlink_to(path / "round-5")``), made relative to the
    link. Each attempt and each run resumes in a folder of its own
    (``work-<attempt>`` of the run's slot), so an absolute target into the
    old folder dangled once the task resumed; relative, it leads to the
    same file in the new one."""
    target = os.readlink(link)
    if not os.path.isabs(target):
        return target
    normal = os.path.normpath(target)
    for root in {str(work), os.path.realpath(work)}:
        if normal == root or normal.startswith(root + os.sep):
            return os.path.relpath(os.path.join(work, os.path.relpath(normal, root)),
                                   link.parent)
    return target
