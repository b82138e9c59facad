"""What the Spark and Dask backends share: long-lived engine tasks that the
driver feeds with batches over a socket.

Why not one engine task per batch
    A Spark job costs tens of milliseconds to schedule, a Dask future about
    one; the scheduler's batches last about 0.1 s. And when an engine task
    dies, the engine says only that it died, not which of its batch's tasks
    was running, and may run it again behind the scheduler's back (Spark's
    ``spark.task.maxFailures``, Dask's ``allowed_failures``). So each of
    ``workers`` *launches* is one engine task that runs
    :func:`._remote_worker.serve`: it connects back to the driver (a socket
    with an HMAC handshake, :mod:`multiprocessing.connection`), loads the run
    once and runs the batches the driver sends it, one or two queued at a
    time, as the processes backend feeds its worker processes. Dispatch costs
    a socket round trip, not a job. An engine that retries a launch only
    starts a fresh worker that asks for new batches: no batch is re-run by
    anyone but the scheduler.

How the data goes in once
    The run (``fit``, the sorted table, ``shared``) is pickled once into a
    payload that the engine ships to each node once (a Spark broadcast, a
    Dask ``scatter(..., broadcast=True)``); each launch loads it once.
    Batches travel as ``(offset, length)`` references only.

How a crash or a timeout is pinned on one task
    As on Ray, a batch runs *marked* (a message before each task) when
    ``timeout`` is set or it holds one task; a worker that dies inside a
    marked batch costs the task it was running, and the rest go back to the
    scheduler (:func:`.base.blame_lost_batch`). Inside an unmarked batch, a
    single unreported task is the culprit; several are run again as one
    marked batch, which finds the culprit if it crashes again (a one-off kill
    from outside then costs nothing). Past ``timeout`` the worker's own
    watchdog reports the task and ends its process; should a task hold the
    GIL so that the watchdog cannot run, the driver kills a worker on its own
    host a few seconds later. A launch whose engine task
    ended is started again, up to a bound of deaths outside any task.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import socket
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from typing import Any

from ..execution import RunContext, TaskRef
from ..messages import Status, task_indices
from ..outcomeloads import load_outcomes
from ._protocol import Msg
from ._ray_cluster import first_line
from ._remote_worker import dump_payload
from ._worker_port import WorkerPort
from .base import (
    DEATHS_OUTSIDE_TASKS,
    Backend,
    DeathCount,
    Event,
    Finished,
    Lost,
    Requeued,
    WorkerStartupError,
    blame_lost_batch,
    wall_time,
)

#: How long a connection to the worker port may take over each step of the
#: HMAC handshake (a worker answers in milliseconds).
_ACK = pickle.dumps((Msg.ACK,))
_STOP_GRACE_S = 2.0
#: How long past ``timeout`` the driver waits for a worker's own watchdog
#: before it kills the worker itself (a task holding the GIL starves the
#: watchdog thread); only where the worker runs on the driver's host.
_WATCHDOG_GRACE_S = 3.0


@dataclass
class _Batch:
    batch_id: int
    tasks: dict[int, TaskRef]  # index -> task, of the tasks not yet reported
    marked: bool


@dataclass
class _Worker:
    conn: Connection
    number: int  # the worker id of run.results["worker"]
    launch: int
    host: str
    pid: int
    batches: deque = field(default_factory=deque)
    running: int | None = None  # marked: the task running now
    running_since: float = 0.0  # when its marker arrived (driver's monotonic clock)
    timed_out: int | None = None  # the task its watchdog reported
    reported: bool = False  # it sent anything after its greeting


class RemoteSlotsBackend(Backend):
    """Base of the engine backends; a subclass starts the engine and launches
    engine tasks (:meth:`_start_engine`, :meth:`_ship`, :meth:`_launch`,
    :meth:`_launch_ended`, :meth:`_cancel_launches`, :meth:`_stop_engine`)."""

    requires_pickling = True
    isolates_crashes = True
    enforces_timeout = True
    engine = "engine"  # in messages: "a Spark worker", "a Dask worker"

    # -- what an engine provides -------------------------------------------------

    def _start_engine(self) -> str:
        """Connect to or start the engine; returns the driver's host as workers reach it."""
        raise NotImplementedError

    def _ship(self, payload: bytes) -> Any:
        """Send ``payload`` to the nodes once; returns what a launch takes."""
        raise NotImplementedError

    def _reship(self, shipped: Any, payload: bytes) -> Any:
        return shipped  # shipped again only where the engine lost it

    def _launch(self, launch: int, args: tuple) -> Any:
        """Start an engine task running ``_remote_worker.serve(*args)``; its handle."""
        raise NotImplementedError

    def _launch_ended(self, handle: Any) -> str | None:
        """None while the engine task runs; else how it ended."""
        raise NotImplementedError

    def _cancel_launches(self, handles: list[Any]) -> None:
        """Ask the engine to end these tasks now."""

    def _stop_engine(self) -> None:
        """Stop what :meth:`_start_engine` started, and only that."""

    # -- life cycle -------------------------------------------------------------

    def start(self, context: RunContext) -> None:
        self._workers: dict[Connection, _Worker] = {}
        self._launches: dict[int, Any] = {}
        self._connected: set[int] = set()
        self._rerun: deque[_Batch] = deque()
        self._port: WorkerPort | None = None
        self._per_worker = 2
        self._numbers = 0
        self._relaunching = False  # a launch started again, after its engine task ended
        self._shipped: Any = None
        self._payload: bytes | None = None
        try:
            host = self._start_engine()
            self._port = WorkerPort(host, self.name)
            bare = replace(context, table=None, shared=None)
            self._payload = dump_payload(bare, context.table, context.shared)
            self._shipped = self._ship(self._payload)
            for launch in range(self.workers):
                self._start_launch(launch)
        except BaseException:
            self.stop(force=True)
            raise
        self._deaths = DeathCount(DEATHS_OUTSIDE_TASKS + self.workers,
                                  f"{self.engine} workers keep dying before running any task")

    def stop(self, *, force: bool = False) -> None:
        if not hasattr(self, "_port"):
            return  # never started
        if self._port is not None:
            self._port.closing.set()  # greeted from now on: closed, not queued
        try:
            for worker in list(self._workers.values()):
                with contextlib.suppress(Exception):
                    if not force:
                        worker.conn.send_bytes(pickle.dumps((Msg.STOP,)))
            handles = list(self._launches.values())
            if not force:
                deadline = time.monotonic() + _STOP_GRACE_S
                while time.monotonic() < deadline and any(
                        self._launch_ended(h) is None for h in handles):
                    time.sleep(0.02)
            pending = [h for h in handles if self._launch_ended(h) is None]
            for worker in list(self._workers.values()):
                with contextlib.suppress(Exception):
                    worker.conn.close()
            if pending:
                self._cancel_launches(pending)
        finally:
            self._workers, self._launches = {}, {}
            self._shipped = self._payload = None  # the engine frees its copies
            if self._port is not None:
                self._port.close()
                self._port = None
            self._stop_engine()

    # -- the contract -------------------------------------------------------------

    def free_slots(self, per_worker: int) -> int:
        per = min(per_worker, self._per_worker)
        free = sum(max(0, per - len(w.batches)) for w in self._workers.values())
        return max(0, free - len(self._rerun))

    def submit(self, batch_id: int, tasks: Sequence[TaskRef]) -> None:
        self._send(_Batch(batch_id, {task[0]: task for task in tasks},
                          marked=self.timeout is not None or len(tasks) == 1))

    def _send(self, batch: _Batch) -> bool:
        if not self._workers:
            self._rerun.append(batch)
            return False
        worker = min(self._workers.values(), key=lambda w: len(w.batches))
        worker.batches.append(batch)
        blob = pickle.dumps(list(batch.tasks.values()), protocol=5)
        try:
            worker.conn.send_bytes(pickle.dumps((Msg.BATCH, blob, batch.marked), protocol=5))
        except OSError:
            pass  # it died: poll finds out, and accounts for the batch
        return True

    def poll(self, timeout: float) -> list[Event]:
        events: list[Event] = []
        self._admit()
        while self._rerun and self._workers and min(
                len(w.batches) for w in self._workers.values()) < self._per_worker:
            self._send(self._rerun.popleft())
        conns = list(self._workers)
        if not conns:
            time.sleep(min(timeout, 0.05))
        else:
            for conn in wait(conns, timeout):
                events.extend(self._drain(self._workers[conn]))
        if self.timeout is not None:
            self._kill_overdue()
        self._relaunch()
        return events

    def _kill_overdue(self) -> None:
        """Kill a worker on this host whose task overstays ``timeout`` and
        whose watchdog did not end it; its death is then reported as usual."""
        now, here = time.monotonic(), socket.gethostname()
        for worker in self._workers.values():
            if (worker.running is not None and worker.host == here
                    and now - worker.running_since > self.timeout + _WATCHDOG_GRACE_S):
                worker.timed_out = worker.running
                with contextlib.suppress(OSError):
                    os.kill(worker.pid, signal.SIGKILL)

    def _admit(self) -> None:
        """Take workers that connected since the last poll."""
        while True:
            try:
                conn, hello = self._port.greeted.get_nowait()
            except queue.Empty:
                return
            if hello[0] != Msg.START:
                conn.close()
                continue
            _, launch, host, pid, version = hello
            from ..._version import __version__

            if version != __version__:
                conn.close()
                raise WorkerStartupError(
                    f"a {self.engine} worker on {host} runs manymodels {version}, the driver "
                    f"{__version__}: install the same version on every node")
            taken = any(w.launch == launch for w in self._workers.values())
            if taken or launch not in self._launches or len(self._workers) >= self.workers:
                with contextlib.suppress(OSError):
                    conn.send_bytes(pickle.dumps((Msg.STOP,)))
                conn.close()
                continue
            self._workers[conn] = _Worker(conn, self._numbers, launch, host, pid)
            self._connected.add(launch)
            self._numbers += 1

    def _drain(self, worker: _Worker) -> list[Event]:
        events: list[Event] = []
        while True:
            try:
                if not worker.conn.poll(0):
                    return events
                message = pickle.loads(worker.conn.recv_bytes())
            except (EOFError, OSError):
                return events + self._died(worker)
            kind = message[0]
            worker.reported = True
            if kind == Msg.FATAL:
                raise WorkerStartupError(
                    f"a {self.engine} worker could not load the run: unpickling fit or the "
                    "data, or running setup=, failed (is fit importable on every node?):\n"
                    f"{message[1]}")
            if kind == Msg.TIMEOUT:
                worker.timed_out = message[1]
                continue
            batch = worker.batches[0]
            events.extend(self._outcomes(worker, batch, message))
            if kind == Msg.RUN:
                worker.running, worker.running_since = message[1], time.monotonic()
                with contextlib.suppress(OSError):  # it waits for this (see _remote_worker)
                    worker.conn.send_bytes(_ACK)
            elif kind == Msg.DONE:
                worker.batches.popleft()
                worker.running = None

    def _outcomes(self, worker: _Worker, batch: _Batch, message: tuple) -> list[Event]:
        blob, busy, prepare_s = message[-3:]
        if blob is None:
            return []
        outcomes = load_outcomes(blob)  # (a value that cannot be unpickled: its task fails)
        for index in task_indices(outcomes):
            batch.tasks.pop(index, None)
        return [Finished(outcomes, worker=worker.number, busy_s=busy,
                         batch_done=message[0] == Msg.DONE, prepare_s=prepare_s)]

    def _died(self, worker: _Worker) -> list[Event]:
        """Account for the batches of a worker whose connection ended."""
        del self._workers[worker.conn]
        with contextlib.suppress(Exception):
            worker.conn.close()
        batches = [b for b in worker.batches if b.tasks]
        if not batches:
            if not worker.reported:  # died loading the run, or idle: count it
                self._deaths.count(f"a {self.engine} worker died outside any task")
            return []
        events: list[Event] = []
        later = [index for b in batches[1:] for index in b.tasks]
        if later:  # queued behind the running batch: never started
            events.append(Requeued(later))
        first = batches[0]
        where = f"{self.engine} worker process {worker.pid} on {worker.host}"
        overstayed = (self.timeout is not None and first.marked and worker.running is not None
                      and time.monotonic() - worker.running_since > self.timeout)
        if overstayed and worker.timed_out is None:  # its "timeout" message was lost
            worker.timed_out = worker.running
        if worker.timed_out is not None and worker.timed_out in first.tasks:
            events.append(Lost(worker.timed_out, Status.TIMEOUT.value,
                               f"task ran longer than timeout={self.timeout:g}s; its "
                               f"{self.engine} worker process was ended", worker.number,
                               wall_time(worker.running_since)))
            rest = [index for index in first.tasks if index != worker.timed_out]
            return events + ([Requeued(rest)] if rest else [])
        message = f"{where} died while running the task"
        if not first.marked:
            if len(first.tasks) == 1:
                return events + [Lost(next(iter(first.tasks)), Status.CRASHED.value, message,
                                      worker.number)]
            # Which one? Run them again, marked, to find out (see the docstring).
            self._rerun.append(_Batch(first.batch_id, dict(first.tasks), marked=True))
            return events
        return events + blame_lost_batch(worker.running, list(first.tasks),
                                         Status.CRASHED.value, message, worker.number,
                                         self._deaths, wall_time(worker.running_since))

    def _start_launch(self, launch: int) -> None:
        self._shipped = self._reship(self._shipped, self._payload)
        args = (self._port.address, self._port.authkey, launch, self._shipped, self.cpus_per_task,
                self.timeout)
        self._launches[launch] = self._launch(launch, args)
        self._connected.discard(launch)

    def _relaunch(self) -> None:
        """Start again each launch whose engine task ended without a worker."""
        live = {w.launch for w in self._workers.values()}
        for launch, handle in list(self._launches.items()):
            if launch in live:
                continue
            ended = self._launch_ended(handle)
            if ended is None:
                continue
            if launch not in self._connected:  # it never reached the driver
                self._deaths.count(f"a {self.engine} task ended: {ended}")
            self._relaunching = True
            self._start_launch(launch)


def describe(exc: BaseException) -> str:
    """An engine task's exception in one line, for messages."""
    return f"{type(exc).__name__}: {first_line(exc)}"
