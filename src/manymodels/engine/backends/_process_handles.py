"""The driver's handle on one worker process of the processes backend: the
process (a ``Popen``, or a forked child behind the same small interface), its
pipes, the thread that feeds its pipe, the batches it holds, and what watches
its memory."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

from ...machine import memory_bound, memory_held, process_tree, wait_for_exit


@dataclass
class Batch:
    batch_id: int
    pending: dict[int, None]  # task indices not yet reported, in run order
    #: The batch as submitted: sent again a task a batch if the worker cannot
    #: unpickle it (see ``ProcessesBackend._unreadable``).
    tasks: Sequence[Any] = ()


class ForkedProcess:
    """What the supervisor needs of ``subprocess.Popen``, for a forked child."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.returncode is None and self.poll() is None:
            wait_for_exit(self.pid, 3600.0 if timeout is None else timeout)
        delay = 0.0005  # short first: a worker that was told to stop is usually gone
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout)
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


class MemoryWatch:
    """Measures the memory that a worker holds with the processes it started
    (its descendants and its session: :func:`process_tree`), against a limit.

    The measure that counts is :func:`memory_held` (PSS of anonymous and
    shared memory, the run's data plane left out), summed over the tree; it
    costs milliseconds a process. So each poll first sums the cheap
    :func:`memory_bound` (tens of microseconds a process), an upper bound of
    it, and measures only when that bound is over the limit *and*, less what
    the bound held beyond the measure last time (the data plane the worker
    mapped, pages shared with others), it still is: when the worker has
    grown since. It also measures every ``REMEASURE_S`` while the bound is
    over the limit, in case what the bound held beyond it shrank.

    A forked worker starts out holding a share of the driver's pages (PSS
    splits them between the driver and its children): a driver of 1.3 GB
    made each of two idle workers hold 476 MiB. That is not the worker's
    doing, so :meth:`inherit` measures it while the worker waits at its
    start gate, before it runs ``setup=`` or any task, and :meth:`check`
    leaves it out."""

    TREE_EVERY_S = 0.5  # how often the tree is looked up again (a scan of /proc)
    REMEASURE_S = 10.0
    MIN_GAP_S = 0.25  # between two measurements of one worker, at least

    def __init__(self, pid: int, limit: int, exclude: str | None) -> None:
        self.pid, self.limit, self.exclude = pid, limit, exclude
        self.tree: list[int] = []
        self.tree_at = -float("inf")
        self.beyond = 0  # what the bound held beyond the measure, last measured
        self.measured_at = -float("inf")
        self.measure_s = 0.0  # what the last measurement cost
        self.inherited = 0  # what a forked worker held at its start gate

    def inherit(self) -> None:
        """Measure what the worker holds now, before any task, and leave it out
        from now on (a forked worker's share of the driver's pages)."""
        with contextlib.suppress(OSError):
            self.inherited = memory_held(self.pid, self.exclude)

    def check(self, now: float, table: Callable[[], dict]) -> int | None:
        """The bytes held, when over the limit; else ``None``. ``table()``
        gives the process table, scanned once for all workers."""
        if now - self.tree_at >= self.TREE_EVERY_S:
            self.tree, self.tree_at = process_tree(self.pid, table()), now
        processes = [self.pid, *self.tree]
        bound = 0
        for pid in processes:
            with contextlib.suppress(OSError):
                bound += memory_bound(pid)
        if bound <= self.limit:
            return None
        since = now - self.measured_at
        if since < max(self.MIN_GAP_S, 20 * self.measure_s) or (
                bound - self.beyond <= self.limit and since < self.REMEASURE_S):
            return None
        begin = time.perf_counter()
        held = 0
        for pid in processes:
            with contextlib.suppress(OSError):
                held += memory_held(pid, self.exclude)
        held = max(0, held - self.inherited)
        self.measure_s = time.perf_counter() - begin
        self.measured_at, self.beyond = now, max(0, bound - held)
        return held if held > self.limit else None


@dataclass
class Worker:
    slot: int
    process: subprocess.Popen | ForkedProcess
    rx: Connection
    outbox: queue.SimpleQueue
    sender: threading.Thread
    tx: Connection  # the driver's end of the pipe to the worker; only the sender writes
    ready: bool = False
    batches: deque[Batch] = field(default_factory=deque)
    memory: MemoryWatch | None = None
    #: When the driver first found its process gone with its pipe still open
    #: (a process it started holds the pipe's other end)
    gone_since: float | None = None


def send_loop(conn: Connection, outbox: queue.SimpleQueue) -> None:
    """One thread per worker feeds its pipe, so that a full pipe never blocks
    the driver loop. It never closes the pipe: the driver does, once this
    thread has ended, so that the descriptor's number cannot be reused while
    the driver still counts it as this worker's (a worker forked meanwhile
    would close it as 'the driver's end of another worker's pipe')."""
    while True:
        data = outbox.get()
        if data is None:
            break
        try:
            conn.send_bytes(data)
        except OSError:
            break  # the worker is gone; the driver sees EOF on its other pipe


def wait_for_pipes_to_close(workers: list[Worker], deadline: float) -> None:
    """Wait until every worker has exited (its pipe reports end-of-file, or its
    process is gone while a process it started still holds the pipe) or the
    deadline passes: one wait for all, not one poll loop per worker."""
    open_pipes = {w.rx: w for w in workers if w.process.poll() is None}
    while open_pipes and (left := deadline - time.monotonic()) > 0:
        for conn in wait(list(open_pipes), timeout=min(left, 0.01)):
            try:
                conn.recv_bytes()  # a last message of a stopping worker: dropped
            except (EOFError, OSError):
                del open_pipes[conn]
        for conn in [c for c, w in open_pipes.items() if w.process.poll() is not None]:
            del open_pipes[conn]


def describe_exit(code: int | None, *, in_task: bool = False) -> str:
    """Why a worker process that ended unasked is gone, from its exit code
    (a signal's, negated); ``in_task``: it was running a task, which ended
    it (a worker exits of itself only when told to stop)."""
    if code is not None and code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"worker process was killed by {name} (signal {-code})"
    if not in_task:
        return f"worker process exited with code {code}"
    return (f"worker process exited with code {code} without returning this task's result: "
            "fit, or a library it called, ended the process (os._exit, or C's exit(); "
            "sys.exit raises SystemExit, which fails its task alone)")


def format_bytes(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"  # pragma: no cover
