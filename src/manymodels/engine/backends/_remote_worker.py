"""The worker side of the Spark and Dask backends (see :mod:`._remote_slots`).

One engine task (a Spark task, a Dask future) runs :func:`serve`: it connects
back to the driver, loads the run once from the engine's broadcast copy, then
runs the batches the driver sends until it is told to stop or the driver
hangs up. Messages, pickled, each ``conn.send_bytes``:

* worker -> driver: ``("start", launch, host, pid, version)`` first, then
  ``("fatal", traceback)`` where the run cannot be loaded, or per batch
  ``("run", index, outcomes, busy_s, prepare_s)`` before each task (marked
  batches), ``("part", ...)`` every 0.25 s and ``("done", ...)`` at its end;
  ``("timeout", index)`` just before the worker ends its own process because
  that task ran past ``timeout``.
* driver -> worker: ``("batch", tasks_blob, marked)``, ``("ack",)`` for each
  ``"run"`` marker, or ``("stop",)``.

A marked batch waits for the driver's ack of each marker before it runs the
task: a process that dies with unread bytes in its socket makes the kernel
reset the connection, and a reset discards what the driver had not yet read,
so an unacknowledged marker could be lost and the crash blamed on the task
before.

Kept free of pandas and of the engines themselves: it imports only what a
worker needs, and the engine hands it the run's payload already fetched.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import sys
import threading
import time
import traceback
from collections import deque
from typing import Any

import cloudpickle

from ..execution import Executor, TaskRef
from ._batch_messages import batch_messages
from ._protocol import Msg

#: Exit status of a worker process that ended itself: a task overstayed ``timeout``.
TIMEOUT_EXIT = 70
#: Exit status of a worker process that ended itself mid-batch: the driver
#: stopped the run (Ctrl-C, SIGTERM, an error), or is gone.
STOPPED_EXIT = 71


def dump_payload(context: Any, table: Any, shared: Any) -> bytes:
    """The run as one blob for the engine to broadcast: the driver's
    ``sys.path`` first, so that a worker can find ``fit``'s module before it
    unpickles the rest."""
    inner = cloudpickle.dumps((context, table, shared), protocol=5)
    return pickle.dumps((list(sys.path), inner), protocol=5)


def _load_executor(payload: Any) -> Executor:
    if not isinstance(payload, bytes):  # a Spark broadcast: read from the executor's copy
        payload = payload.value
    driver_path, inner = pickle.loads(payload)
    sys.path.extend(entry for entry in driver_path if entry not in sys.path)
    context, table, shared = pickle.loads(inner)
    return Executor(context, table=table, shared=shared)


class _Watchdog(threading.Thread):
    """Ends this process when the running task overstays ``timeout``: an
    engine cannot stop a running task, and a thread cannot be killed, so the
    worker process goes, after telling the driver which task it was."""

    def __init__(self, timeout: float, send: Any) -> None:
        super().__init__(daemon=True, name="manymodels-watchdog")
        self.timeout, self.send = timeout, send
        self.running: tuple[int, float] | None = None

    def run(self) -> None:
        while True:
            time.sleep(min(0.05, self.timeout / 4))
            running = self.running
            if running is not None and time.monotonic() - running[1] > self.timeout:
                try:
                    self.send((Msg.TIMEOUT, running[0]))
                finally:
                    os._exit(TIMEOUT_EXIT)


def serve(address: tuple[str, int], authkey: bytes, launch: int, payload: Any,
          cpus_per_task: int, timeout: float | None) -> int:
    """Run the driver's batches in this process until told to stop; returns
    the number of batches run (what the engine task returns)."""
    from multiprocessing.connection import Client

    from ..._version import __version__

    try:
        conn = Client(address, authkey=authkey)
    except OSError:  # the run is over (an engine re-running a finished task): nothing to do
        return 0
    lock = threading.Lock()

    def send(message: tuple) -> None:
        data = pickle.dumps(message, protocol=5)
        with lock:
            conn.send_bytes(data)

    batches = 0
    try:
        send((Msg.START, launch, socket.gethostname(), os.getpid(), __version__))
        try:
            executor = _load_executor(payload)
        except BaseException:
            send((Msg.FATAL, traceback.format_exc()))
            return 0
        watchdog = None
        if timeout is not None:
            watchdog = _Watchdog(timeout, send)
            watchdog.start()
        inbox = _Inbox(conn)
        while True:
            try:
                message = inbox.next()
            except (EOFError, OSError):  # the driver hung up: the run is over
                return batches
            if message[0] == Msg.STOP:
                return batches
            if message[0] != Msg.BATCH:
                continue
            tasks: list[TaskRef] = pickle.loads(message[1])
            inbox.busy = True
            try:
                _run(executor, tasks, message[2], cpus_per_task, send, watchdog, inbox)
            finally:
                inbox.busy = False
            batches += 1
    except (EOFError, OSError, BrokenPipeError):
        return batches
    finally:
        conn.close()


class _Inbox:
    """The driver's messages in order, read by a thread of their own; an ack
    awaited sets aside what comes first.

    While a batch runs (:attr:`busy`), a ``STOP`` or the driver hanging up
    (Ctrl-C, SIGTERM, a spent error budget, a killed driver) ends this
    process at once, as the processes backend's driver ends its workers: an
    engine cannot stop a running task (Dask's ``cancel`` leaves its thread
    running; the fit went on for minutes, holding the user's worker). A
    batch is no longer busy once its last outcomes are sent: the ``STOP``
    that ends a finished run finds it idle."""

    def __init__(self, conn: Any) -> None:
        import queue

        self.conn, self.waiting = conn, deque()
        self.arrived: queue.SimpleQueue = queue.SimpleQueue()
        self.busy = False
        threading.Thread(target=self._read, daemon=True, name="manymodels-inbox").start()

    def _read(self) -> None:
        while True:
            try:
                message = pickle.loads(self.conn.recv_bytes())
            except (EOFError, OSError) as exc:
                if self.busy:
                    os._exit(STOPPED_EXIT)
                self.arrived.put(exc)
                return
            if message[0] == Msg.STOP and self.busy:
                os._exit(STOPPED_EXIT)
            self.arrived.put(message)
            if message[0] == Msg.STOP:
                return

    def _take(self) -> tuple:
        item = self.arrived.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def next(self) -> tuple:
        if self.waiting:
            return self.waiting.popleft()
        return self._take()

    def wait_ack(self) -> None:
        while True:
            message = self._take()
            if message[0] == Msg.ACK:
                return
            self.waiting.append(message)


def _run(executor: Executor, tasks: list[TaskRef], marked: bool, cpus_per_task: int,
         send: Any, watchdog: _Watchdog | None, inbox: _Inbox) -> None:
    # closed at once, whatever happens here: its thread limits end with it
    with contextlib.closing(batch_messages(executor, tasks, marked, cpus_per_task)) as messages:
        for message in messages:
            if message[0] == Msg.RUN:
                send(message)
                inbox.wait_ack()
                if watchdog is not None:
                    watchdog.running = (message[1], time.monotonic())
            else:
                if watchdog is not None:
                    watchdog.running = None
                if message[0] == Msg.DONE:  # (a STOP after it ends a finished run)
                    inbox.busy = False
                send(message)
