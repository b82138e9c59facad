"""Starting the processes backend's workers: forked or spawned (which, and
the driver's BLAS/OpenMP pools readied for a fork, is decided here), each
with its own pipes, a thread that writes its batches, and a memory watch.

A forked worker waits at a start gate until every worker is forked (see
``ProcessesBackend._open_start_gate``) and closes the driver's ends of every
other worker's pipes, so that a dead worker's pipe reports end-of-file. A
spawned one is a fresh interpreter (``python -m manymodels.engine.backends._spawn_main``)
that loads the run from the data plane. Mixed into
:class:`~.processes.ProcessesBackend`, whose state (``_workers``,
``_slots``, ``_context``, ``_files``, ``_limits``, ``_env``, ``_start_gate``)
these methods use.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import queue
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from ...machine import collector as _collector
from ._process_handles import ForkedProcess, MemoryWatch, Worker, send_loop
from ._process_worker import die_with_parent, forked_main

#: Libraries whose native thread pools or devices hang or fail in a forked
#: child (polars' thread pool, CUDA in torch/jax/tensorflow/cupy). An
#: initialised Ray is caught by its threads.
FORK_UNSAFE_MODULES = ("polars", "torch", "tensorflow", "jax", "cupy")
#: Libraries that import one of :data:`FORK_UNSAFE_MODULES` themselves
#: (``import mlflow`` imports polars, where it is installed, for its datasets):
#: a reason to spawn names them, for a user who never imported it.
_IMPORTED_BY = {"polars": ("mlflow",)}


def _imported_by(name: str) -> str:
    loaded = [other for other in _IMPORTED_BY.get(name, ()) if other in sys.modules]
    return f"; {', '.join(loaded)} imports it" if loaded else ""


#: ``omp_pause_hard``: ``omp_pause_resource_all`` ends the calling thread's pool.
_OMP_PAUSE_HARD = 2


def gomp_pool_releasers(controller: Any) -> list[Any] | None:
    """``omp_pause_resource_all`` of each GNU OpenMP runtime (libgomp) that
    ``controller`` (a ``threadpoolctl.ThreadpoolController``) found loaded, or
    None where one lacks it (libgomp before GCC 10).

    libgomp keeps a thread's pool of OpenMP threads after its first parallel
    region (a LightGBM or scikit-learn fit, a LightGBM model loaded) and has no
    fork handler: a child forked from that thread inherits the pool's
    bookkeeping but not its threads, and its first parallel region waits for
    them forever, even with one thread. Called in the forking thread just
    before a fork, the pause ends that thread's pool (its threads exit; the
    next parallel region starts a new one), so the child starts without one.
    LLVM's and Intel's runtimes handle a fork themselves."""
    releasers = []
    for info in controller.info():
        if (info.get("internal_api") == "openmp"
                and os.path.basename(info.get("filepath") or "").startswith("libgomp")):
            try:
                pause = ctypes.CDLL(info["filepath"]).omp_pause_resource_all
            except (OSError, AttributeError):
                return None
            pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
            releasers.append(pause)
    return releasers


#: (the loader's counts of libraries loaded and unloaded, threadpoolctl's controller)
_THREADPOOLS: tuple[tuple[int, int], Any] | None = None


def loaded_threadpools() -> Any:
    """threadpoolctl's controller of the BLAS/OpenMP libraries loaded now.
    Finding them costs milliseconds a run (it inspects each library), so the
    controller is kept while the dynamic loader has loaded and unloaded no
    library since (its own counters, :func:`_loader_changes`); the thread
    counts it reports and limits are read from the libraries live."""
    global _THREADPOOLS
    changes = _loader_changes()
    if _THREADPOOLS is None or changes is None or _THREADPOOLS[0] != changes:
        from threadpoolctl import ThreadpoolController

        _THREADPOOLS = (changes or (-1, -1), ThreadpoolController())
    return _THREADPOOLS[1]


class _LoadedObject(ctypes.Structure):
    """The head of glibc's ``struct dl_phdr_info``, up to its counters."""

    _fields_ = [("addr", ctypes.c_void_p), ("name", ctypes.c_char_p),
                ("phdr", ctypes.c_void_p), ("phnum", ctypes.c_uint16),
                ("adds", ctypes.c_ulonglong), ("subs", ctypes.c_ulonglong)]


def _loader_changes() -> tuple[int, int] | None:
    """How many shared objects the dynamic loader has loaded and unloaded so
    far (``dl_iterate_phdr``'s ``dlpi_adds`` and ``dlpi_subs``: one library
    unloaded and another loaded changes them, where the number loaded would
    not), or None where that cannot be asked (not glibc, say)."""
    try:
        iterate = ctypes.CDLL(None).dl_iterate_phdr
    except (OSError, AttributeError, TypeError):  # (TypeError: Windows has no CDLL(None))
        return None
    seen: list[tuple[int, int]] = []

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_LoadedObject), ctypes.c_size_t,
                      ctypes.c_void_p)
    def first(info: Any, size: int, data: Any) -> int:
        if size >= ctypes.sizeof(_LoadedObject):
            seen.append((info.contents.adds, info.contents.subs))
        return 1  # the counters are the same in every entry: one is enough

    iterate(first, None)
    return seen[0] if seen else None


#: The size asked for the pipe a worker sends its outcomes through. A part of
#: a backtest's outcomes is megabytes; through the default 64 KiB the worker
#: and the driver took turns, a context switch each way every 64 KiB.
PIPE_BYTES = 1 << 20


def _widen_pipe(fd: int) -> None:
    """Give the pipe of ``fd`` :data:`PIPE_BYTES` (Linux's ``F_SETPIPE_SZ``),
    or as much as the system lets a process have; left as it is elsewhere."""
    import fcntl

    setting = getattr(fcntl, "F_SETPIPE_SZ", 1031)
    for size in (PIPE_BYTES, 256 << 10):
        try:
            fcntl.fcntl(fd, setting, size)
            return
        except OSError:  # over /proc/sys/fs/pipe-max-size, or not Linux
            continue


#: The signals that stop a run (the scheduler's ``RunInterrupts``).
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stopping_signals_held() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM while a worker starts, and hand each to its
    handler once the block is done (in the main thread; elsewhere no
    handler of Python's runs).

    Python runs a signal's handler at the next line of Python code, and the
    first after a fork is an at-fork hook's (logging's, the store writer's),
    whose exception Python prints as "Exception ignored" and drops: a Ctrl-C
    that came while the driver forked a worker was lost (the run went on to
    its end), and one that came while the store writer's hook waited for its
    lock left that lock to the writer's next commit, which then failed.
    Raised later in the block, it would leave a worker started and not yet
    in its place, which the stop does not end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous: dict[int, Any] = {}
    try:
        for signum in STOPPING_SIGNALS:
            handler = signal.getsignal(signum)
            if callable(handler):  # (one ignored, or the default, is left as it is)
                previous[signum] = signal.signal(signum, lambda got, _: held.append(got))
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in held:
            previous[signum](signum, None)


class WorkerStarter:
    """Starts one worker of the processes backend in a given slot: chooses
    how (forked or spawned), and readies the driver's thread pools for a
    fork."""

    def _choose_start_method(self) -> str:
        """``fork`` starts a worker in milliseconds and shares the driver's memory;
        ``spawn`` starts a fresh interpreter, which is slower but safe whatever
        the driver holds. ``auto`` forks where forking is known to be safe
        (:meth:`_spawn_reasons` finds none). Sets ``spawn_reason`` (see
        :class:`~.base.Backend`): a spawn costs about a second a run, which the
        run's summary explains."""
        method = self.options.start_method
        if method == "auto":
            reasons = self._spawn_reasons()
            method = "spawn" if reasons else "fork"
        else:
            reasons = [f"start_method={method!r} was asked for"] if method == "spawn" else []
        self.spawn_reason = "; ".join(reasons) or None
        return method

    def _spawn_reasons(self) -> list[str]:
        """Why forking is not known to be safe here, each in words; none on
        Linux, with one BLAS/OpenMP thread per task (an OpenMP pool does not
        survive a fork, a single thread needs none), no GPU (CUDA does not), no
        memory limit (a forked worker's share of the driver's pages is left out
        of its memory, but the pages the driver then copies become the worker's
        alone and would count), none of the libraries whose own thread pools or
        devices do not survive a fork imported (:data:`FORK_UNSAFE_MODULES`), no
        Ray initialised in the driver and every GNU OpenMP runtime loaded able
        to end the driver's pool before a fork (:func:`gomp_pool_releasers`).
        The worker only runs ``fit``; CPython re-initialises its own locks
        (import, logging) in a forked child."""
        reasons = []
        if not sys.platform.startswith("linux"):
            reasons.append(f"workers are forked on Linux only, this is {sys.platform}")
        if self.cpus_per_task != 1:
            reasons.append(f"cpus_per_task={self.cpus_per_task} (an OpenMP thread pool does "
                           "not survive a fork)")
        if self.gpu_sets:
            reasons.append("tasks are given GPUs (CUDA does not survive a fork)")
        if self.memory_limit is not None:
            reasons.append("memory_limit is set (a forked worker's memory is not its own "
                           "alone)")
        reasons += [f"{name} is imported (it is not fork-safe{_imported_by(name)})"
                    for name in FORK_UNSAFE_MODULES if name in sys.modules]
        ray = sys.modules.get("ray")
        if ray is not None and getattr(ray, "is_initialized", lambda: False)():
            reasons.append("Ray is initialised here (its threads do not survive a fork)")
        if not reasons and gomp_pool_releasers(self._threadpools()) is None:
            reasons.append("a GNU OpenMP runtime older than GCC 10 is loaded (its thread "
                           "pool cannot be ended before a fork)")
        return reasons

    def _threadpools(self) -> Any:
        """threadpoolctl's controller of the BLAS/OpenMP libraries loaded, found once a run."""
        if self._controller is None:
            self._controller = loaded_threadpools()
        return self._controller

    def _release_openmp(self) -> None:
        """End the driver's GNU OpenMP pool before a fork (see :func:`gomp_pool_releasers`)."""
        for pause in self._gomp_releasers:
            pause(_OMP_PAUSE_HARD)

    def _limit_driver_threads(self) -> None:
        """Limit the driver's BLAS/OpenMP pools to ``cpus_per_task`` threads for
        the whole run, so that every forked worker (replacements too) inherits
        the limit; the driver itself computes nothing meanwhile.

        Setting the limit in each worker instead costs every worker a scan of
        its libraries, and slows its first thousands of small BLAS calls
        (pools whose threads did not survive the fork): on 16 cores, 0.4 s
        more per run. Restoring the driver's limits right after forking is no
        better: OpenBLAS then starts its threads again in the driver, and they
        spin for a while on the cores the workers need (small SciPy calls in
        the workers took 1.8x as long). So the limits are restored in
        :meth:`stop`. Spawned workers set the limits themselves, and find them
        in their environment. Before forking, the driver's GNU OpenMP pool is
        ended (:meth:`_release_openmp`)."""
        if self.start_method == "fork":
            controller = self._threadpools()
            self._driver_limits = controller.limit(limits=self.cpus_per_task)
            self._gomp_releasers = gomp_pool_releasers(controller) or []

    def _start_worker(self, slot: int) -> Worker:
        """Start the worker of ``slot`` and put it in its place in
        ``_workers``, with the signals that stop a run held meanwhile
        (:func:`stopping_signals_held`)."""
        with stopping_signals_held():
            worker = self._spawn(slot)
            if slot < len(self._workers):
                self._workers[slot] = worker
            else:
                self._workers.append(worker)
        return worker

    def _spawn(self, slot: int) -> Worker:
        env = dict(self._limits)
        if self.gpu_sets:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_sets[slot])
        to_worker_r, to_worker_w = os.pipe()
        from_worker_r, from_worker_w = os.pipe()
        _widen_pipe(from_worker_w)
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
                    [sys.executable, "-m", "manymodels.engine.backends._spawn_main",
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
        self._undertaker.started(process.pid)
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
            with contextlib.suppress(OSError):
                os.write(own_gate[1], b"\0")  # the gate opens (see _open_start_gate)
            os.close(own_gate[0])
            os.close(own_gate[1])
        return Worker(slot, process, Connection(from_worker_r, writable=False), outbox,
                      sender, tx, memory=memory)

    def _fork(self, slot: int, env: dict[str, str], rx_fd: int, tx_fd: int,
              own_driver_fds: tuple[int, int],
              own_gate: tuple[int, int] | None = None) -> ForkedProcess:
        # The child must not keep the driver's ends of any worker's pipes open,
        # or a dead worker's pipe would never report end-of-file.
        driver_fds = [*own_driver_fds, self._undertaker.fd]
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
            # the driver's handlers (or stopping_signals_held's) are not the worker's
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            # The objects inherited from the driver are never walked by this
            # worker's collector: a full pass would write to each one's header
            # and copy every page of the driver's heap into the worker.
            gc.freeze()
            if _collector.COLLECTOR_PAUSED:  # the driver's pause: fits run here
                gc.enable()
            os.setsid()
            stdin = os.open(os.devnull, os.O_RDONLY)  # as a spawned worker's: a fit that
            os.dup2(stdin, 0)                          # reads stdin takes nothing of the driver's
            os.close(stdin)
            for fd in driver_fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            die_with_parent()
            if os.getppid() != driver_pid:  # the driver died before that took hold
                code = 0
                return
            if gate is not None:  # wait until the driver has forked every worker
                os.close(gate[1])
                os.read(gate[0], 1)  # a byte (or end-of-file) once the driver opens it
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

