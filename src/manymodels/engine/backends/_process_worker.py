"""The body of a worker process of the processes backend.

A worker is either spawned, as ``python -m manymodels.engine.backends._spawn_main
RX TX SLOTS SLOT CONTEXT SPILL`` with BLAS/OpenMP thread limits already in its
environment (so they hold from the first import of NumPy), or forked from the
driver (:func:`forked_main`). Either way it reads batches from pipe ``RX``,
writes outcomes to pipe ``TX``, and records the task it is running in its slot
of the ``SLOTS`` file, so that the driver knows exactly which task to blame if
this process dies or overstays, even in the middle of a batch. A worker whose
CUDA context a task broke (:mod:`manymodels.engine.gpus`) reports that task, says
``retire`` and exits: the driver hands the rest of its batches back and
starts a fresh worker.

Messages (pickled tuples)::

    driver -> worker   ("batch", batch_id, [(index, data_ref, params), ...]) | ("stop",)
    worker -> driver   ("ready", pid) | ("fatal", traceback) | ("retire", why)
                       ("unreadable", why)
                       ("part" | "done", batch_id, outcomes_pickle, busy_s, spill,
                        prepare_s)

``spill`` names the file holding the outcomes' large buffers, or is ``None``
(see :func:`manymodels.engine.dataplane.dumps_spilling`). A batch the worker
cannot unpickle (an item of a class defined in the driver's ``__main__``,
which a spawned worker cannot import) is answered ``unreadable``: the driver
sends its tasks again one a batch, and fails those that still cannot be read.
While it unpickles a batch its slot says :data:`~._protocol.LOADING`, so that
a death then (an item whose loading crashes the process) is the batch's: the
driver sends it again a task a batch, and the next death names its task.

A worker leads a session of its own. When it stops, it kills the processes
its tasks started and left running (:func:`end_own_processes`); the driver
does the same for a worker it kills. A process a task started in a session
of its own (``setsid``) is beyond both. A task that closes or redirects the
standard streams does so for itself only (:class:`StandardStreams`); one
that closes the worker's pipes to the driver (:class:`DriverPipes`) ends
the worker before it marks another task, its slot marked, so that the driver
charges that task and no other.

A worker runs :func:`~manymodels.machine.worker_niceness` steps nicer than
the driver (none unless ``MANYMODELS_WORKER_NICENESS`` asks): the driver's
one loop feeds every worker and its thread writes the store, so when the
workers fill every core of a machine left to the run, a driver that waits
for a core makes them all wait.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import signal
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

from ...machine import end_tree, worker_niceness
from ..dataplane import dump_outcomes
from ..execution import FLUSH_EVERY_S
from ..messages import OkOutcomes
from ._protocol import LOADING, READ_TIMEOUTS, SLOT, Msg, mark_pipes_closed


def lower_priority() -> None:
    """Make this worker :func:`~manymodels.machine.worker_niceness` nicer than the driver (the
    processes its tasks start inherit it). Where Linux groups each session's
    processes for the scheduler (autogroup, in the root CPU cgroup), a
    worker, which leads a session of its own, is weighed as its group: that
    group is made as much nicer."""
    try:
        niceness = worker_niceness()
    except ValueError:  # the driver refused it before starting any worker
        return
    if niceness == 0:
        return
    try:
        os.nice(niceness)
    except (OSError, AttributeError):  # no niceness here (Windows), or refused
        pass
    try:
        if os.getsid(0) == os.getpid():  # its own session's group, never the driver's
            with open("/proc/self/autogroup", "w") as group:
                group.write(str(niceness))
    except (OSError, AttributeError):  # not Linux, autogroup off, or refused
        pass


def die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphans if the driver dies
    except (OSError, AttributeError):
        pass


def end_own_processes() -> None:
    """SIGKILL what this worker's tasks started and left running (see
    :func:`end_tree`), and reap those that are its children."""
    for pid in end_tree(os.getpid(), with_root=False):
        try:
            os.waitpid(pid, 0)
        except OSError:  # not a child of this worker's
            pass


class StandardStreams:
    """Gives each task the worker's standard output and error, whatever the
    task before did with them: closed ``sys.stdout`` or ``sys.stderr`` (or
    set it to ``None``), closed file descriptor 1 or 2, or pointed it
    elsewhere with ``os.dup2``. The check before each task is quick (a
    descriptor closed, or taken again by a file that Python opened, which is
    not inheritable); the one at the end of a batch and before the outcomes
    are sent compares the descriptors with the worker's own."""

    def __init__(self) -> None:
        self.descriptors: dict[int, tuple[int, tuple[int, int]]] = {}
        for fd in (1, 2):
            try:
                stat = os.fstat(fd)
                self.descriptors[fd] = (os.dup(fd), (stat.st_dev, stat.st_ino))
            except OSError:  # not open in this worker to begin with: left alone
                continue
        self.streams = {}
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None:
                self.streams[name] = (getattr(stream, "encoding", None) or "utf-8",
                                      getattr(stream, "errors", None) or "strict",
                                      bool(getattr(stream, "line_buffering", False)))

    def repair(self, *, thorough: bool = True) -> None:
        for fd, (copy, identity) in self.descriptors.items():
            try:
                if (not thorough and os.get_inheritable(fd)) or self._same(fd, identity):
                    continue
            except OSError:  # closed
                pass
            try:
                os.dup2(copy, fd)
            except OSError:
                pass
        for name, (encoding, errors, line_buffering) in self.streams.items():
            stream = getattr(sys, name)
            if stream is not None and not _unusable(stream):
                continue
            try:
                fresh = open(1 if name == "stdout" else 2, "w", encoding=encoding,  # noqa: SIM115
                             errors=errors, closefd=False)
                fresh.reconfigure(line_buffering=line_buffering)
            except Exception:  # an encoding that cannot be had again, say
                continue
            setattr(sys, name, fresh)
            dunder = getattr(sys, f"__{name}__", None)
            if dunder is None or _unusable(dunder):
                setattr(sys, f"__{name}__", fresh)

    def check(self, _inheritable: Callable[[int], bool] = os.get_inheritable) -> None:
        """The check before each task, :meth:`repair` only when it finds a
        change: in the usual case (both descriptors as they were, both
        streams open) two system calls and two attribute reads, as a task of
        a million costs 10 µs in all."""
        try:
            if _inheritable(1) and _inheritable(2) and sys.stdout.closed is False \
                    and sys.stderr.closed is False:
                return
        except Exception:  # closed; a stream of another kind, None or detached
            pass
        self.repair(thorough=False)

    @staticmethod
    def _same(fd: int, identity: tuple[int, int]) -> bool:
        stat = os.fstat(fd)
        return (stat.st_dev, stat.st_ino) == identity


class PipesClosed(Exception):
    """A task closed this worker's pipes to the driver (``os.closerange``, as
    daemonizing helpers do): the worker can neither report nor be told, and ends."""


class DriverPipes:
    """Watches the worker's two pipes to the driver, so that a task that
    closes them is found before the worker runs another: the slot still
    names that task when the worker marks it (:func:`mark_pipes_closed`) and
    ends, and the driver charges it, not the task after it. The check before
    each task is quick (each descriptor's close-on-exec flag as it was: a
    system call each, raising once it is closed); the one before outcomes
    are sent compares the descriptors with the pipes (a descriptor closed
    and taken again by a file that the task opened)."""

    def __init__(self, rx: Any, tx: Any) -> None:
        self.fds = (rx.fileno(), tx.fileno())
        self.inheritable = [os.get_inheritable(fd) for fd in self.fds]
        self.identities = [self._identity(fd) for fd in self.fds]

    def check(self, _inheritable: Callable[[int], bool] = os.get_inheritable) -> bool:
        rx, tx = self.fds
        try:
            return [_inheritable(rx), _inheritable(tx)] == self.inheritable
        except OSError:  # closed
            return False

    def intact(self) -> bool:
        try:
            return [self._identity(fd) for fd in self.fds] == self.identities
        except OSError:
            return False

    @staticmethod
    def _identity(fd: int) -> tuple[int, int]:
        stat = os.fstat(fd)
        return (stat.st_dev, stat.st_ino)


def _unusable(stream: Any) -> bool:
    """A stream closed, or detached from its buffer (whose ``closed`` raises)."""
    try:
        return getattr(stream, "closed", False) is True
    except Exception:
        return True


def _serve(rx: Any, tx: Any, slots: mmap.mmap, slot: int, load: Callable[[], Any],
           spill_prefix: str) -> int:
    """Build the executor with ``load()``, report ready, then run batches until
    told to stop or until the driver goes away; then end what the tasks
    started and left running."""
    slot_offset = slot * SLOT.size
    try:
        return _loop(rx, tx, slots, slot_offset, load, spill_prefix)
    except PipesClosed:  # (its slot says so, and names the task that closed them)
        end_own_processes()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        # not a return: the pipes' descriptors are closed, or another file's
        # now, and the connections would close them again as they are collected
        os._exit(1)
    finally:
        end_own_processes()


def _loop(rx: Any, tx: Any, slots: mmap.mmap, slot_offset: int, load: Callable[[], Any],
          spill_prefix: str) -> int:
    try:
        executor = load()
    except BaseException:
        tx.send((Msg.FATAL, traceback.format_exc()))
        return 1
    streams = StandardStreams()  # as they are once setup= has run
    pipes = DriverPipes(rx, tx)
    executor.retires_when_broken = True  # a broken CUDA context: a fresh worker
    spilled = [0]

    def closed() -> PipesClosed:
        mark_pipes_closed(slots, slot_offset)
        return PipesClosed()

    def send(kind: str, batch_id: int, outcomes: list, busy_s: float,
             prepare_s: float) -> None:
        if not pipes.intact():  # (before a spill file takes a descriptor a task freed)
            raise closed()
        streams.repair()  # before any file is opened: fd 1 or 2 may be free
        payload, spill = dump_outcomes(OkOutcomes.of(outcomes), spill_prefix, spilled)
        tx.send((kind, batch_id, payload, busy_s, spill, prepare_s))

    check, repair, pack_into, now = streams.check, streams.repair, SLOT.pack_into, time.time
    pipes_open, pipes_intact = pipes.check, pipes.intact

    def mark(index: int, allowance: int = 1) -> None:
        # as each task starts, with -1 as a batch ends, and with the batch's
        # first task and its task count while the batch's rows are read
        if index < 0:
            repair()
            if not pipes_intact():
                raise closed()
        else:
            check()
            if not pipes_open():  # the task before closed them: the slot names it still
                raise closed()
        pack_into(slots, slot_offset, index, now(), allowance)

    tx.send((Msg.READY, os.getpid()))

    while True:
        try:
            data = rx.recv_bytes()
        except EOFError:
            return 0
        # a death while unpickling is the batch's (an item whose loading kills
        # the process): the driver finds which task's by sending them one a batch
        pack_into(slots, slot_offset, LOADING, now(), 1)
        try:
            message = pickle.loads(data)
        except BaseException as exc:  # an item of a class this process cannot import, say
            pack_into(slots, slot_offset, -1, now(), 1)
            tx.send((Msg.UNREADABLE, f"{type(exc).__name__}: {exc}"))
            continue
        if message[0] == Msg.STOP:
            return 0
        _, batch_id, tasks = message
        # a death while the batch's rows are read is blamed on its first task;
        # the read is no task's own time (a slow file system, an object store):
        # it may take READ_TIMEOUTS timeouts, or its tasks' together, and the
        # first task's own clock starts after it
        mark(tasks[0][0], max(READ_TIMEOUTS, len(tasks)))
        for part in executor.run_in_parts(tasks, on_start=mark, flush_every_s=FLUSH_EVERY_S):
            if part.last or executor.broken is not None:
                mark(-1)
            send(Msg.DONE if part.last else Msg.PART, batch_id, part.outcomes, part.busy_s,
                 part.prepare_s)
        if executor.broken is not None:  # its CUDA context is unusable: a fresh worker
            tx.send((Msg.RETIRE, executor.broken))
            return 0


def main(argv: list[str]) -> int:
    """A spawned worker: a fresh interpreter that loads the run from the data plane."""
    die_with_parent()
    lower_priority()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the driver decides when to stop
    from multiprocessing.connection import Connection

    rx = Connection(int(argv[1]), writable=False)
    tx = Connection(int(argv[2]), readable=False)
    with open(argv[3], "r+b") as handle:
        slots = mmap.mmap(handle.fileno(), 0)

    def load() -> Any:
        with open(argv[5], "rb") as handle:
            sys_path, context_bytes = pickle.load(handle)
        sys.path[:] = sys_path
        import cloudpickle
        from threadpoolctl import threadpool_limits

        from .. import dataplane
        from ..execution import Executor
        from ..gpus import prepare_worker

        context = cloudpickle.loads(context_bytes)
        threadpool_limits(limits=context.cpus_per_task)
        prepare_worker(context.gpu_setup)
        table = None
        if isinstance(context.table, str):
            table = (dataplane.open_table(context.table) if context.table.endswith(".arrow")
                     else dataplane.open_objects(context.table))
        shared = dataplane.open_objects(context.shared) if isinstance(context.shared, str) else None
        return Executor(context, table=table, shared=shared)

    return _serve(rx, tx, slots, int(argv[4]), load, spill_prefix=argv[6])


def fresh_random_state() -> None:
    """Give a forked worker NumPy global random state of its own, from fresh
    entropy, as a spawned worker has: forked, every worker would draw what
    the others draw, so that models with ``random_state=None`` (a random
    forest's bootstraps) fitted on different workers got the same random
    numbers. (Python's ``random`` reseeds itself after a fork.)"""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()


def forked_main(rx: Any, tx: Any, slots: mmap.mmap, slot: int, context: Any,
                environment: dict[str, str], spill_prefix: str) -> int:
    """A forked worker: it shares the driver's memory (the table and the shared
    objects, copy-on-write), so it loads nothing. Its thread pools are already
    limited (the driver forks it under the limits); the environment's limits
    reach libraries that ``fit`` loads later."""
    die_with_parent()
    lower_priority()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the driver's handler
    os.environ.update(environment)
    fresh_random_state()

    def load() -> Any:
        from ..execution import Executor
        from ..gpus import prepare_worker

        prepare_worker(context.gpu_setup)
        return Executor(context)

    return _serve(rx, tx, slots, slot, load, spill_prefix)

