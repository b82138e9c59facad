"""Run tasks in worker processes that the driver supervises one by one.

Not a ``multiprocessing.Pool``: a pool breaks as a whole when one worker dies
(``BrokenProcessPool``) and cannot say which task killed it. Here each worker
is a plain child process with a pipe of its own and a slot in a small shared
file where it records the task it is running. So the driver can:

* blame exactly one task when a worker dies (segfault, ``os._exit``, the OOM
  killer, a SIGKILL from outside), re-queue the rest of its batches, and start
  a fresh worker in its place;
* kill a worker whose task overstays ``timeout``, or whose memory (with the
  processes it started: :class:`._process_handles.MemoryWatch`) grows past
  ``memory_limit``, and record which task it was;
* end with a worker every process that its tasks started and left running
  (save one a task detached into a session of its own, ``setsid``: it is
  beyond reach, as :mod:`._undertaker` says);
* charge a task that closed its worker's pipes to the driver, and a task
  whose item kills the worker as it is unpickled, alone (see
  :mod:`._process_worker`);
* replace a worker whose CUDA context a task broke (it reports that task and
  says ``retire``), handing the rest of its batches back unblamed.

Workers are forked from the driver where that is safe (they share its memory
copy-on-write and inherit its BLAS/OpenMP limits) and otherwise spawned as
fresh interpreters (``python -m ...``) with the limits in their environment
that map the data plane (:mod:`manymodels.engine.dataplane`); either way nothing is
pickled per task. Each runs in a session of its own, so that a Ctrl-C in the
terminal reaches only the driver and the session holds what its tasks start,
with a parent-death signal, so that none outlives a killed driver (nor, by
:mod:`._undertaker`, do the processes its tasks started). The
driver's handle on a worker is :mod:`._process_handles`, starting one (and
choosing fork or spawn) is :mod:`._process_start`, and the worker's own loop
is :mod:`._process_worker`.
"""

from __future__ import annotations

import contextlib
import functools
import io
import mmap
import os
import pickle
import signal
import subprocess
import sys
import time
import types
from collections.abc import Sequence
from dataclasses import replace
from multiprocessing.connection import wait
from typing import Any

import cloudpickle

from ...inputs.tables import is_pandas_frame
from ...machine import end_tree, process_table, thread_limit_environment
from .. import dataplane
from ..execution import RunContext, TaskRef
from ..gpus import GpuSetup
from ..messages import Status, task_indices
from ..options import check_start_method
from ..outcomeloads import load_outcomes
from ._process_handles import Batch, Worker, describe_exit, format_bytes, wait_for_pipes_to_close
from ._process_start import WorkerStarter
from ._protocol import LOADING, SLOT, Msg, read_slot, slot_allowance
from ._undertaker import Undertaker
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
    dump_sendable,
)

_CHECK_EVERY_S = 0.05
#: How long a worker's process may be gone while its pipe stays open (a
#: process it started holds it) before the driver replaces it regardless.
_GONE_GRACE_S = 0.5
_STOP_GRACE_S = 1.0
#: How long a worker whose pipe reported end-of-file while its process still
#: ran is given to end on its own (a crash not yet reaped, or a worker that
#: found its pipes closed) before the driver kills it.
_EXIT_GRACE_S = 0.25
#: What a task that closed its worker's pipes to the driver is charged with.
PIPES_CLOSED = ("its worker's pipes to the driver were closed while this task ran (did fit "
                "close inherited file descriptors, as os.closerange or a daemonizing helper "
                "does?); the worker could not report and was replaced")
class ProcessesBackend(WorkerStarter, Backend):
    name = "processes"
    requires_pickling = True
    isolates_crashes = True
    enforces_timeout = True
    enforces_memory_limit = True
    isolates_gpus = True
    caps_gpu_memory = True
    starts_local_processes = True

    def __init__(self, *args, start_method: str = "auto", **kwargs) -> None:
        check_start_method(start_method)
        super().__init__(*args, **kwargs)
        self.built_options = replace(self.built_options, start_method=start_method)
        self.configure(self.built_options)

    def start(self, context: RunContext) -> None:
        dataplane.sweep_stale_files()
        self._files = dataplane.RunFiles()
        self._workers: list[Worker] = []
        self._driver_limits: Any = None  # the driver's BLAS/OpenMP limits, while it runs
        self._gomp_releasers: list[Any] = []
        self._controller: Any = None  # the libraries loaded now (see loaded_threadpools)
        self.start_method = self._choose_start_method()
        self._start_began, self.worker_start_s = time.perf_counter(), 0.0
        self._ready_after: dict[int, float] = {}  # slot -> seconds its first worker took
        self._first_pids: list[int] = []
        try:
            self._undertaker = Undertaker()
            if self.gpu_sets:  # PyTorch loaded here: fit uses it, warm CUDA up in the workers
                context = replace(context, gpu_setup=GpuSetup(
                    self.options.gpu_memory_fraction, warm="torch" in sys.modules))
            self._context = context
            if self.start_method == "spawn":
                remote = replace(
                    context,
                    table=self._write_table(context.table),
                    shared=self._files.write_objects(context.shared) if context.shared else None,
                )
                self._context_path = self._files.write_bytes(
                    "context.pkl", pickle.dumps((list(sys.path), cloudpickle.dumps(remote)))
                )
            self._slots_path = self._files.new_file("slots", SLOT.size * self.workers)
            with open(self._slots_path, "r+b") as handle:
                self._slots = mmap.mmap(handle.fileno(), 0)
            for slot in range(self.workers):
                SLOT.pack_into(self._slots, slot * SLOT.size, -1, 0.0, 1)
            self._limits = thread_limit_environment(self.cpus_per_task)
            self._env = {**os.environ, **self._limits}
            self._start_gate = os.pipe() if self.start_method == "fork" else None
            try:
                self._limit_driver_threads()
                self._release_openmp()
                for slot in range(self.workers):
                    self._start_worker(slot)
                self._first_pids = [w.process.pid for w in self._workers]
                if self.start_method == "fork":  # each waits at the gate: what it holds
                    for worker in self._workers:  # is its share of the driver's pages
                        if worker.memory is not None:
                            worker.memory.inherit()
            finally:
                self._open_start_gate()
        except BaseException:
            self.stop(force=True)
            raise
        self._deaths = DeathCount(DEATHS_OUTSIDE_TASKS, "a worker process died outside any task")
        self._last_check = time.monotonic()
        self._unsent: list[Event] = []  # tasks that could not be sent, told at the next poll

    def _open_start_gate(self) -> None:
        """Let the forked workers go. Each waits at the gate until every worker
        is forked: forking is several times slower while earlier children are
        already busy (their copy-on-write faults contend with the fork for the
        kernel's locks on the shared memory), so forking them all first and
        starting them together gets the last one working sooner."""
        gate, self._start_gate = self._start_gate, None
        if gate is None:
            return
        # a byte a worker, not end-of-file alone: a worker another run of this
        # program forked meanwhile (a train in another thread) holds this
        # pipe's write end too, and end-of-file would never come
        with contextlib.suppress(OSError):
            os.write(gate[1], b"\0" * len(self._workers))
        for fd in reversed(gate):
            os.close(fd)

    def _write_table(self, table: Any) -> str | None:
        if table is None:
            return None
        if is_pandas_frame(table):  # a frame that map_partitions slices
            return self._files.write_objects(table, name="table")
        return self._files.write_table(table)

    def _retire(self, worker: Worker, *, kill: bool) -> None:
        """End a worker; with ``kill``, SIGKILL it and every process it started."""
        if kill:
            end_tree(worker.process.pid, with_root=worker.process.poll() is None)
            # the processes its tasks started and left behind when it died
            # (reparented, so no longer in its tree) are still in its session
            with contextlib.suppress(OSError):
                os.killpg(worker.process.pid, signal.SIGKILL)
        worker.outbox.put(None)
        try:
            worker.process.wait(timeout=5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL is not ignorable
            pass
        self._undertaker.retired(worker.process.pid)
        worker.rx.close()
        worker.sender.join(timeout=5)
        if not worker.sender.is_alive():  # else it is stuck on a pipe that a process
            worker.tx.close()             # the worker started still holds: left open
        SLOT.pack_into(self._slots, worker.slot * SLOT.size, -1, 0.0, 1)

    def _replace(self, worker: Worker, status: str | None, message: str | None, *,
                 retiring: bool = False) -> list[Event]:
        """Account for the tasks of a worker that is gone, and start another;
        one ``retiring`` (its CUDA context broken) blames no task.

        A worker whose pipe ended (``status`` None) while its process still
        runs is given :data:`_EXIT_GRACE_S` to end first: a crash is not
        always reaped yet, and a worker whose task closed its pipes ends
        itself once that task returns, its slot naming that task (it checks
        before marking another). One still running then is running the task
        that closed them, and is killed: either way the slot, read once the
        worker can no longer change it, names the task to charge."""
        still_running = False
        if status is None and not retiring and worker.process.poll() is None:
            try:
                worker.process.wait(timeout=_EXIT_GRACE_S)
            except subprocess.TimeoutExpired:
                still_running = True
                worker.process.kill()  # (then its slot cannot change: read below)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    worker.process.wait(timeout=5)
        index, started, pipes_closed = read_slot(self._slots, worker.slot * SLOT.size)
        self._retire(worker, kill=True)
        if status is None:
            status = Status.CRASHED.value
            message = (PIPES_CLOSED if pipes_closed or still_running
                       else describe_exit(worker.process.returncode, in_task=index >= 0))
        unreported = [i for batch in worker.batches for i in batch.pending]
        loading = None
        if retiring:
            events: list[Event] = [Requeued(unreported)] if unreported else []
        elif index == LOADING and status == Status.CRASHED and worker.batches:
            loading, events = self._died_loading(worker, message, started)
        else:
            events = blame_lost_batch(index, unreported, status, message, worker.slot,
                                      self._deaths, started)
        self._release_openmp()  # in case the driver ran OpenMP since the last fork
        fresh = self._start_worker(worker.slot)
        if loading is not None:  # its tasks one a batch, first on the fresh worker
            self._send_one_by_one(fresh, loading)
        return events

    def _died_loading(self, worker: Worker, message: str, started: float
                      ) -> tuple[Batch | None, list[Event]]:
        """A worker died unpickling its next batch, the first it holds (it
        reads them in order, every one before was reported, and it ran none
        of this one): an item whose loading kills the process (a C
        extension's object that crashes on load). A batch of one task charges
        that task; a larger one goes again a task a batch (returned, for the
        fresh worker), so that the next death names its task. The worker's
        other batches go back to the scheduler."""
        batch = worker.batches.popleft()
        later = [i for other in worker.batches for i in other.pending]
        events: list[Event] = [Requeued(later)] if later else []
        if len(batch.pending) > 1:
            return batch, events
        return None, [Lost(next(iter(batch.pending)), Status.CRASHED.value,
                           f"its worker died unpickling this task's item or settings ({message})",
                           worker.slot, started), *events]

    # -- the contract ----------------------------------------------------------

    def free_slots(self, per_worker: int) -> int:
        return sum(max(0, per_worker - len(w.batches)) for w in self._workers if w.ready)

    def submit(self, batch_id: int, tasks: Sequence[TaskRef]) -> None:
        worker = min((w for w in self._workers if w.ready), key=lambda w: len(w.batches))
        # an item or a setting that cannot travel: its task fails alone; one
        # that holds a lambda travels by cloudpickle, as shared= and fit do
        # (every task of a grid's lambda setting failed)
        tasks, payload, lost = dump_sendable(
            tasks, lambda some: dataplane.pickle_any((Msg.BATCH, batch_id, some)),
            dataplane.pickle_any)
        self._unsent.extend(lost)
        if payload is None:
            return
        worker.batches.append(Batch(batch_id, dict.fromkeys(task_indices(tasks)), tasks))
        worker.outbox.put(payload)

    def poll(self, timeout: float) -> list[Event]:
        events: list[Event] = self._unsent
        self._unsent = []
        if events:
            timeout = 0.0
        by_conn = {w.rx: w for w in self._workers}
        for conn in wait(list(by_conn), timeout=min(timeout, _CHECK_EVERY_S)):
            worker = by_conn[conn]
            try:
                message = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                message = None
            if message is None:  # it died: replaced outside the except block, or
                # the forked replacement would run inside it, and every error of
                # its tasks would carry this EOFError as its context
                events.extend(self._replace(worker, None, None))
                continue
            events.extend(self._handle(worker, message))
        now = time.monotonic()
        if now - self._last_check >= _CHECK_EVERY_S:
            self._last_check = now
            events.extend(self._check_limits())
        return events

    def _handle(self, worker: Worker, message: tuple) -> list[Event]:
        kind = message[0]
        if kind == Msg.READY:
            worker.ready = True
            if worker.slot not in self._ready_after and worker.process.pid in self._first_pids:
                self._ready_after[worker.slot] = time.perf_counter() - self._start_began
            return []
        if kind == Msg.RETIRE:
            return self._replace(worker, None, None, retiring=True)
        if kind == Msg.UNREADABLE:
            return self._unreadable(worker, message[1])
        if kind == Msg.FATAL:
            raise WorkerStartupError(
                "a worker process could not start: loading fit and the data, or running "
                "setup=, failed (is fit importable in a fresh interpreter? otherwise try "
                f"backend='threads'):\n{message[1]}"
            )
        _, batch_id, payload, busy, spill, prepare = message
        # (a value the driver cannot unpickle fails its own task: load_outcomes)
        outcomes = dataplane.loads_spilled(payload, spill, loads=load_outcomes)
        pending = worker.batches[0].pending
        for index in task_indices(outcomes):
            pending.pop(index, None)
        done = kind == Msg.DONE
        if done:
            worker.batches.popleft()
        return [Finished(outcomes, worker=worker.slot, busy_s=busy, batch_done=done,
                         prepare_s=prepare)]

    def _unreadable(self, worker: Worker, error: str) -> list[Event]:
        """The worker could not unpickle its next batch (the first it holds:
        it reads them in order, and ran none of this one). A batch of one task
        fails that task, not retried (it fails the same way each time); a
        larger one is sent again a task a batch, behind what the worker holds
        already, so that only the tasks that cannot be read fail."""
        batch = worker.batches.popleft()
        tasks = list(batch.tasks)
        if len(tasks) == 1:
            return [Lost(tasks[0][0], Status.FAILED.value,
                         unreadable_message(tasks[0], error, self.start_method), worker.slot)]
        self._send_one_by_one(worker, batch)
        return []

    @staticmethod
    def _send_one_by_one(worker: Worker, batch: Batch) -> None:
        """Queue ``batch``'s tasks on ``worker`` a task a batch, behind what it holds."""
        for task in batch.tasks:
            worker.batches.append(Batch(batch.batch_id, {task[0]: None}, [task]))
            worker.outbox.put(pickle.dumps((Msg.BATCH, batch.batch_id, [task]), protocol=5))

    def _read_what_is_left(self, worker: Worker) -> list[Event]:
        """The messages a worker that is gone sent before it died and the
        driver has not read (its pipe still open: a process it started holds it)."""
        events: list[Event] = []
        while worker in self._workers and worker.rx.poll(0):
            try:
                message = pickle.loads(worker.rx.recv_bytes())
            except (EOFError, OSError):
                break  # its end closed after all: replaced by the caller
            events.extend(self._handle(worker, message))
        return events

    def _check_limits(self) -> list[Event]:
        events: list[Event] = []
        wall_now, now = time.time(), time.monotonic()
        table = functools.cache(process_table)  # one scan for all workers, if any needs it
        for worker in list(self._workers):
            if not worker.ready:
                continue
            if worker.process.poll() is not None:
                # its pipe reports EOF on the next poll, unless a process it
                # started still holds the pipe's other end: then it is
                # replaced from here, once what it sent before it died is read
                if worker.gone_since is None:
                    worker.gone_since = now
                elif now - worker.gone_since > _GONE_GRACE_S:
                    events.extend(self._read_what_is_left(worker))
                    if worker in self._workers:
                        events.extend(self._replace(worker, None, None))
                continue
            if self.timeout is not None:
                overdue = self._overdue(worker, wall_now)
                if overdue is not None:
                    events.extend(self._replace(worker, Status.TIMEOUT.value, overdue))
                    continue
            if worker.memory is not None:
                held = worker.memory.check(now, table)
                if held is not None:
                    events.extend(self._replace(
                        worker, Status.MEMORY.value,
                        f"worker reached {format_bytes(held)} with the processes it "
                        f"started, over memory_limit={format_bytes(self.memory_limit)}; "
                        "it was killed"))
        return events

    def _overdue(self, worker: Worker, wall_now: float) -> str | None:
        """Why ``worker`` is past ``timeout=``, or None: its task ran longer,
        or the rows of its batch took longer to read than its tasks'
        timeouts together. The slot is read twice, and taken only when both
        reads agree (a worker marking its next task meanwhile is not late)."""
        offset = worker.slot * SLOT.size
        index, started, pipes_closed = read_slot(self._slots, offset)
        allowance = slot_allowance(self._slots, offset)
        if index < 0 or pipes_closed or wall_now - started <= self.timeout * allowance:
            return None
        if read_slot(self._slots, offset) != (index, started, pipes_closed) or (
                slot_allowance(self._slots, offset) != allowance):
            return None
        if allowance > 1:
            return (f"reading the rows of its batch took longer than {allowance} x "
                    f"timeout={self.timeout:g}s (a read is allowed that many timeouts, "
                    "its fit one); its worker was killed")
        return f"task ran longer than timeout={self.timeout:g}s; its worker was killed"

    def stop(self, *, force: bool = False) -> None:
        if getattr(self, "_first_pids", None):  # the mean start of the first workers
            now = time.perf_counter() - self._start_began  # (one still starting: until now)
            self.worker_start_s = sum(self._ready_after.get(slot, now) for slot in range(
                len(self._first_pids))) / len(self._first_pids)
        try:
            workers = getattr(self, "_workers", [])
            try:
                if not force:
                    for worker in workers:
                        worker.outbox.put(pickle.dumps((Msg.STOP,)))
                    deadline = time.monotonic() + _STOP_GRACE_S
                    wait_for_pipes_to_close(workers, deadline)
                    for worker in workers:
                        try:
                            worker.process.wait(timeout=max(0.0, deadline - time.monotonic()))
                        except subprocess.TimeoutExpired:
                            pass
            finally:  # (interrupted too: every worker still running is killed)
                for worker in list(workers):
                    # one that stopped when told ended what its tasks left
                    self._retire(worker, kill=force or worker.process.poll() != 0)
                    workers.remove(worker)  # (stopped again after a failed start: none left)
        finally:
            limits, self._driver_limits = getattr(self, "_driver_limits", None), None
            if limits is not None:
                limits.restore_original_limits()
            if hasattr(self, "_undertaker"):
                self._undertaker.close()
            if hasattr(self, "_files"):
                self._files.cleanup()


def unreadable_message(task: TaskRef, error: str, start_method: str) -> str:
    """Why a task's item or settings cannot be unpickled in its worker
    (``error``, the worker's exception), with what to do where it holds
    classes or functions of the script run as ``__main__``: pickled by
    name, they are found in a forked worker but not in a spawned one, whose
    ``__main__`` is its own entry module."""
    message = f"this task's item or settings cannot be unpickled in its worker process ({error})"
    names = main_module_names(task)
    if names and start_method == "spawn":
        one = len(names) == 1
        message += (f": {', '.join(names)} {'is' if one else 'are'} defined in the script run "
                    "as __main__, which a spawned worker cannot import; define "
                    f"{'it' if one else 'them'} in a module that the script imports")
    return message


def main_module_names(value: Any) -> list[str]:
    """The classes and functions of ``__main__`` that ``value`` holds (itself,
    or the class of an object it holds), found by pickling it, by name."""
    names: dict[str, None] = {}

    class Finder(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            owner = obj if isinstance(obj, (type, types.FunctionType)) else type(obj)
            if getattr(owner, "__module__", None) == "__main__":
                names[getattr(owner, "__qualname__", repr(owner))] = None
            return NotImplemented

    with contextlib.suppress(Exception):  # what it found until then is still the answer
        Finder(io.BytesIO(), protocol=5).dump(value)
    return list(names)
