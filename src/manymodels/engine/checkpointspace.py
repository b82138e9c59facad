"""Where a run's checkpoints live, and who may resume which.

The space is a directory: a store's ``checkpoints/`` (kept across runs), or
a temporary directory of the run without a store (retries still resume).
It travels to every worker inside the :class:`~.execution.RunContext`, and
the workers read and write it themselves.

Each task has a directory named by its identity (``<identity>-<n>`` for the
n-th task of a run with the same identity: :func:`slot_names`), holding one
slot per run that worked on it (named by the run's token)::

    checkpoints/ab/ab12...ef/<token>/manifest.json, state-a.pkl, state-b.pkl, files-6/,
                                     attempts, work-<attempt>/
    checkpoints/.owners/<token>.lock      held (flock) by a running driver
    checkpoints/.journal/<token>/*.json   what the run's tasks resumed or refused

A task opens its own run's slot (a retry) or claims, by renaming it, the
newest slot of a run that is no longer running (the next run after a
crash); a slot whose run is still running, another driver's, is never
touched: two drivers on one store do not resume each other's tasks.
``reuse=False`` claims nothing of other runs: it starts afresh.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import os
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .checkpoints import ATTEMPTS, ATTEMPTS_LOCK, MANIFEST, Checkpoint

OWNERS, JOURNAL = ".owners", ".journal"
#: In a slot claimed from a run no longer running: the claiming run's id.
CLAIMED = "claimed"
#: The start of the name a stopped run's slot takes while it is removed.
_DROPPED = ".dropped-"

#: The owner locks this process holds (:meth:`CheckpointSpace.hold`): a
#: process forked from it (a ``fit`` that forks a helper outliving it) closes
#: them, or it would hold a dead run's lock, and the next run would take that
#: run for running and not resume its tasks.
_HELD_LOCKS: set[int] = set()


def _close_held_locks() -> None:
    for descriptor in list(_HELD_LOCKS):
        with contextlib.suppress(OSError):
            os.close(descriptor)
    _HELD_LOCKS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_locks)


def asks_for_checkpoint(fit: Any) -> bool:
    """Whether ``fit`` names a ``checkpoint`` parameter (not a ``**kwargs``)."""
    import inspect

    try:
        parameter = inspect.signature(fit).parameters.get("checkpoint")
    except (TypeError, ValueError):
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def slot_names(identities: list[str]) -> list[str]:
    """Each task's directory name: its identity, with ``-<n>`` after the
    n-th (n >= 2) task of the run with the same identity (items equal but
    for their position: replicas of one setting). Two such tasks sharing a
    directory resumed each other's state (every replica ended with the
    first one's random start) or, running at once, took each other for a
    later attempt and failed; numbered in task order, each replica resumes
    its own in the next run."""
    seen: dict[str, int] = {}
    names = []
    for identity in identities:
        count = seen[identity] = seen.get(identity, 0) + 1
        names.append(identity if count == 1 else f"{identity}-{count}")
    return names


def identity_of(name: str) -> str:
    """The task identity a directory of :func:`slot_names` is named by."""
    return name.partition("-")[0]


def drop_slot(slot: Path, by: str) -> bool:
    """Remove a checkpoint slot, renamed out of reach first (by ``by``'s
    name): a running run's task may claim (rename) the slot at the same
    moment, and of the two renames one wins; removed in place, it emptied
    the slot the task had just claimed. False where the other rename won."""
    doomed = slot.with_name(f"{_DROPPED}{by}-{slot.name}")
    try:
        os.rename(slot, doomed)
    except OSError:
        return False
    shutil.rmtree(doomed, ignore_errors=True)
    return True


def still_held(root: Path, token: str, host: str) -> bool:
    """Whether the driver of run ``token``, on machine ``host``, still holds
    its space: what a task's writes check. Released, its lock file is gone
    (:meth:`CheckpointSpace.release` removes it). On the driver's own
    machine the file's lock is asked too (a killed driver's lock goes with
    it, its file stays); on another machine it is not: a shared file system
    may keep each machine's locks apart, and every save of a running run
    would have read as superseded there."""
    if socket.gethostname() == host:
        return owner_alive(root, token)
    return (root / OWNERS / f"{token}.lock").exists()


def owner_alive(root: Path, token: str) -> bool:
    """Whether the run ``token`` is still running: its driver holds the lock
    of ``.owners/<token>.lock`` (the lock goes with the driver, killed or not)."""
    try:
        descriptor = os.open(root / OWNERS / f"{token}.lock", os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return True
        raise
    finally:
        os.close(descriptor)  # (releases the shared lock, if taken)
    return False


@dataclass
class CheckpointSpace:
    """A run's checkpoints: ``root`` and each task's directory name (its
    identity; by task index without a store). Made by the driver
    (:meth:`create`), pickled into every worker."""

    root: str
    names: list[str] | None  # per task index; None: "task-<index>"
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    #: The driver's machine (see :func:`still_held`).
    host: str = field(default_factory=socket.gethostname)
    run_id: int | None = None
    #: reuse=False: slots of other runs are not resumed.
    fresh: bool = False
    #: No store: a task that ends ok drops its slot at once (nothing
    #: outlives the run); with a store, the driver drops it once committed.
    drop_when_ok: bool = False
    _lock: int | None = field(default=None, repr=False, compare=False)
    #: The driver holds the space (:meth:`hold`): a task's writes stop
    #: once it no longer does (kept in the copies the workers get).
    held: bool = field(default=False, repr=False, compare=False)
    #: Tasks of this process that opened their checkpoint and have not
    #: finished (a threads-backend driver's), and the release they put off:
    #: None, or whether it removes the root (see :meth:`release`).
    _running: int = field(default=0, repr=False, compare=False)
    _ending: bool | None = field(default=None, repr=False, compare=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __getstate__(self) -> dict:
        # the driver's lock and its count of running tasks stay with it
        return {**self.__dict__, "_lock": None, "_running": 0, "_ending": None, "_guard": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _guard=threading.Lock())

    # -- the driver ------------------------------------------------------------

    def hold(self) -> None:
        """Mark this run as running (until :meth:`release` or the driver's end)."""
        owners = Path(self.root) / OWNERS
        owners.mkdir(parents=True, exist_ok=True)
        self._lock = os.open(owners / f"{self.token}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        _HELD_LOCKS.add(self._lock)
        self.held = True

    def release(self, remove: bool = False) -> None:
        """End :meth:`hold` (and remove the whole space when ``remove``: a run
        without a store). A task of this process still running puts it off
        until the last one finishes: a threads-backend fit goes on in its
        thread after a Ctrl-C ends the run (a thread cannot be stopped), and
        a run released at once let the next run take the slot that fit was
        still saving into. The owners' folder stays, empty or not: removed,
        it went from under another driver's :meth:`hold` between its
        ``mkdir`` and its ``open`` (a run starting as another ended failed
        with FileNotFoundError)."""
        with self._guard:
            if self._running:
                self._ending = remove
                return
        self._release_now(remove)

    def _release_now(self, remove: bool) -> None:
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)
        if self._lock is not None:
            (Path(self.root) / OWNERS / f"{self.token}.lock").unlink(missing_ok=True)
            _HELD_LOCKS.discard(self._lock)
            os.close(self._lock)
            self._lock = None

    def drop(self, indices: Any) -> None:
        """Remove these tasks' slots of this run (their models are kept), and
        those of runs no longer running that this run did not claim (the
        older of two stopped runs, one with ``reuse=False``): the task's
        model is committed, so no run resumes them, and they stayed until a
        ``Store.gc``."""
        for index in indices:
            base = self._task_dir(int(index))
            shutil.rmtree(base / self.token, ignore_errors=True)
            self._drop_stopped_runs_slots(base)
            with contextlib.suppress(OSError):
                base.rmdir()  # when no other run's slot is left in it
                base.parent.rmdir()

    def _drop_stopped_runs_slots(self, base: Path) -> None:
        """Remove the slots in ``base`` of runs no longer running, each first
        renamed out of reach (a running run's ``_claim`` may rename it to its
        own at the same moment: of the two renames one wins, and the loser
        leaves it alone)."""
        try:
            slots = [slot for slot in base.iterdir() if _claimable(slot, self.token)]
        except OSError:
            return
        for slot in slots:
            if owner_alive(Path(self.root), slot.name):
                continue
            drop_slot(slot, self.token)

    def journal(self) -> dict[int, list[dict]]:
        """What each task of this run resumed from, or refused, in order,
        read from the workers' journal (which is then removed)."""
        folder = Path(self.root) / JOURNAL / self.token
        events: dict[int, list[dict]] = {}
        try:
            files = sorted((f for f in folder.iterdir() if not f.name.startswith(".")),
                           key=lambda f: int(f.name.split(".")[1]))
        except OSError:  # none written (or none could be): the run's results stand
            return events
        for file in files:
            with contextlib.suppress(OSError, ValueError):
                event = json.loads(file.read_bytes())
                events.setdefault(int(event["task"]), []).append(event)
        shutil.rmtree(folder, ignore_errors=True)  # (its parent stays: as in release)
        return events

    # -- a worker --------------------------------------------------------------

    def open(self, index: int) -> Checkpoint:
        """Task ``index``'s checkpoint: this run's slot, else the newest slot
        of a run no longer running, claimed; else a new one."""
        with self._guard:  # (finished() counts it out, whether this raises or not)
            self._running += 1
        base = self._task_dir(index)
        own = base / self.token
        attempt = None  # (a claim takes its number with the slot)
        for last_try in (False, False, True):
            try:
                if not own.is_dir():
                    base.mkdir(parents=True, exist_ok=True)
                    if not self.fresh:
                        attempt = self._claim(base, own)
                    own.mkdir(exist_ok=True)
                break
            except FileNotFoundError:  # another task's drop removed the folder they share
                if last_try:
                    raise
        if attempt is None:
            attempt = _count_start(own)
        return Checkpoint(own, attempt=attempt,
                          owner={"token": self.token, "run_id": self.run_id},
                          run_alive=functools.partial(still_held, Path(self.root), self.token,
                                                      self.host)
                          if self.held else None,
                          report=_Journal(Path(self.root) / JOURNAL / self.token, index,
                                          self.token))

    def finished(self, index: int, ok: bool) -> None:
        """Task ``index``, whose :meth:`open` was called, has ended; the last
        to end after the run's :meth:`release` releases it."""
        if ok and self.drop_when_ok:
            self.drop([index])
        with self._guard:
            self._running -= 1
            ending = self._ending if self._running == 0 else None
            self._ending = None if ending is not None else self._ending
        if ending is not None:
            self._release_now(ending)

    def _task_dir(self, index: int) -> Path:
        name = self.names[index] if self.names is not None else f"task-{index}"
        return Path(self.root) / name[:2] / name

    def _claim(self, base: Path, own: Path) -> int | None:
        """Rename the newest slot of a run no longer running to ``own``; this
        start's number there (1), or None where none was claimed. The rename,
        the counter's reset and this start's count are one hold of the
        slot's counter lock (its file moves with the slot): another start
        of the task that finds ``own`` counts after them, never between
        (its count was reset, and neither start was then refused as
        superseded)."""
        root = Path(self.root)
        candidates = []
        for slot in base.iterdir():
            if not _claimable(slot, self.token) or owner_alive(root, slot.name):
                continue
            try:
                saved = (slot / MANIFEST).stat().st_mtime
            except OSError:
                saved = 0.0  # nothing committed: worth nothing, unless nothing else
            candidates.append((saved, slot))
        for _, slot in sorted(candidates, reverse=True):
            try:
                with _counting(slot):
                    try:
                        os.rename(slot, own)  # atomic: of two claimants, one wins
                    except OSError:  # another worker claimed it first
                        continue
                    # this run's attempts count from 1 (resumed_from names
                    # "attempt 1 of run 2")
                    (own / ATTEMPTS).unlink(missing_ok=True)
                    attempt = _raise_count(own)
            except FileNotFoundError:  # (its lock's file: removed meanwhile, by gc)
                continue
            # the slot is this run's now (gc keeps it while this run is in the
            # store, whichever run saved what it holds)
            if self.run_id is not None:
                temporary = own / f".tmp-{CLAIMED}-{os.getpid()}"
                temporary.write_text(json.dumps({"run_id": self.run_id, "token": self.token}))
                os.replace(temporary, own / CLAIMED)
            return attempt
        return None


def _claimable(slot: Path, token: str) -> bool:
    """Whether ``slot`` is another run's slot (not one being removed)."""
    return slot.name != token and not slot.name.startswith(".") and slot.is_dir()


#: Held while this process takes an attempt number (a file lock may not keep
#: its threads apart: on NFS it is a process's POSIX lock); made anew in a
#: forked child, which a fork while another thread held it left held.
_COUNTING = threading.Lock()


def _counting_after_fork() -> None:
    global _COUNTING
    _COUNTING = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_counting_after_fork)


@contextlib.contextmanager
def _counting(slot: Path) -> Iterator[None]:
    """Hold the slot's attempt counter: this process's threads, and (a lock
    on :data:`ATTEMPTS_LOCK`) other processes. A file system without locks
    counts unlocked, as before."""
    with _COUNTING:
        descriptor = os.open(slot / ATTEMPTS_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        _HELD_LOCKS.add(descriptor)  # (a child forked meanwhile closes its copy)
        try:
            with contextlib.suppress(OSError):  # (ENOLCK: no locks there)
                fcntl.flock(descriptor, fcntl.LOCK_EX)
            yield
        finally:
            _HELD_LOCKS.discard(descriptor)
            os.close(descriptor)  # (releases the lock)


def _count_start(slot: Path) -> int:
    """This start's number in the slot (1, 2, ...), kept in its ``attempts``
    file: read and raised under :func:`_counting`, so that two attempts
    opening the slot at once get two numbers (they got one, and neither
    was refused as superseded)."""
    with _counting(slot):
        return _raise_count(slot)


def _raise_count(slot: Path) -> int:
    """Raise the slot's counter by one (held by :func:`_counting`); the new count."""
    counter = slot / ATTEMPTS
    try:
        count = int(counter.read_text()) + 1
    except (OSError, ValueError):
        count = 1
    temporary = slot / f".tmp-attempts-{os.getpid()}-{threading.get_ident()}"
    temporary.write_text(str(count))
    os.replace(temporary, counter)
    return count


class _Journal:
    """Writes a task's resume or refusal where the driver reads it at the end
    of the run (one small file per event: no message to the driver). A
    record that cannot be written (a full disk) is left out: it only says
    what the task resumed from, and ``load()`` failed for want of it."""

    def __init__(self, folder: Path, index: int, token: str) -> None:
        self.folder, self.index, self.token = folder, index, token

    def __call__(self, kind: str, details: dict) -> None:
        event = {"task": self.index, "kind": kind, "at": time.time(), **details,
                 "same_run": details.get("token") == self.token}
        name = f"{self.index}.{time.time_ns()}.{os.getpid()}.json"
        temporary = self.folder / f".tmp-{name}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            temporary.write_text(json.dumps(event))
            os.replace(temporary, self.folder / name)
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
