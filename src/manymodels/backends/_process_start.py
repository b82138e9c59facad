"""Starting the processes backend's workers: forked or spawned, each with its
own pipes, a thread that writes its batches, and a memory watch.

A forked worker waits at a start gate until every worker is forked (see
``ProcessesBackend._open_start_gate``) and closes the driver's ends of every
other worker's pipes, so that a dead worker's pipe reports end-of-file. A
spawned one is a fresh interpreter (``python -m manymodels.backends._spawn_main``)
that loads the run from the data plane. Mixed into
:class:`~.processes.ProcessesBackend`, whose state (``_workers``,
``_slots``, ``_context``, ``_files``, ``_limits``, ``_env``, ``_start_gate``)
these methods use.
"""

from __future__ import annotations

import contextlib
import gc
import os
import queue
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection

from .. import _resources
from ._process_handles import ForkedProcess, MemoryWatch, Worker, send_loop
from ._process_worker import die_with_parent, forked_main


class WorkerStarter:
    """Starts one worker of the processes backend in a given slot."""

    def _spawn(self, slot: int) -> Worker:
        env = dict(self._limits)
        if self.gpu_sets:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_sets[slot])
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        # A worker forked mid-run waits at a gate of its own while its memory is
        # measured (its share of the driver's pages, see MemoryWatch): the
        # first ones wait at the shared gate, measured before it opens.
        own_gate = (os.pipe() if self.start_method == "fork" and self._start_gate is None
                    and self.memory_limit is not None else None)
        try:
            if self.start_method == "fork":
                process = self._fork(slot, env, to_worker_r, from_worker_w,
                                     (to_worker_w, from_worker_r), own_gate)
            else:
                process = subprocess.Popen(
                    [sys.executable, "-m", "manymodels.backends._spawn_main",
                     str(to_worker_r), str(from_worker_w), self._slots_path, str(slot),
                     self._context_path, self._files.spill_prefix],
                    pass_fds=(to_worker_r, from_worker_w),
                    env={**self._env, **env},
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        except BaseException:
            os.close(to_worker_w)
            os.close(from_worker_r)
            if own_gate is not None:
                os.close(own_gate[0])
                os.close(own_gate[1])
            raise
        finally:
            os.close(to_worker_r)
            os.close(from_worker_w)
        outbox: queue.SimpleQueue = queue.SimpleQueue()
        tx = Connection(to_worker_w, readable=False)
        sender = threading.Thread(target=send_loop, args=(tx, outbox), daemon=True,
                                  name=f"manymodels-send-{slot}")
        sender.start()
        memory = None
        if self.memory_limit is not None:  # the data plane's files are not the worker's
            memory = MemoryWatch(process.pid, self.memory_limit, self._files.tag)
        if own_gate is not None:
            memory.inherit()  # before it runs setup= or any task
            os.close(own_gate[0])
            os.close(own_gate[1])  # the gate opens
        return Worker(slot, process, Connection(from_worker_r, writable=False), outbox,
                      sender, tx, memory=memory)

    def _fork(self, slot: int, env: dict[str, str], rx_fd: int, tx_fd: int,
              own_driver_fds: tuple[int, int],
              own_gate: tuple[int, int] | None = None) -> ForkedProcess:
        # The child must not keep the driver's ends of any worker's pipes open,
        # or a dead worker's pipe would never report end-of-file.
        driver_fds = list(own_driver_fds)
        for worker in self._workers:
            if worker.slot != slot:
                driver_fds += [worker.rx.fileno(), worker.tx.fileno()]
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        gate, driver_pid = own_gate or self._start_gate, os.getpid()
        pid = os.fork()
        if pid:
            return ForkedProcess(pid)
        code = 1
        try:
            # The objects inherited from the driver are never walked by this
            # worker's collector: a full pass would write to each one's header
            # and copy every page of the driver's heap into the worker.
            gc.freeze()
            if _resources.COLLECTOR_PAUSED:  # the driver's pause: fits run here
                gc.enable()
            os.setsid()
            for fd in driver_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            die_with_parent()
            if os.getppid() != driver_pid:  # the driver died before that took hold
                code = 0
                return
            if gate is not None:  # wait until the driver has forked every worker
                os.close(gate[1])
                os.read(gate[0], 1)  # end-of-file once the driver closes its end
                os.close(gate[0])
            code = forked_main(Connection(rx_fd, writable=False),
                               Connection(tx_fd, readable=False),
                               self._slots, slot, self._context, env,
                               self._files.spill_prefix)
        except BaseException:
            with contextlib.suppress(Exception):
                traceback.print_exc()
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(code)

