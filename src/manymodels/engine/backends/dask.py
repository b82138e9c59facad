"""Run batches on a Dask cluster: ``backend="dask"`` or ``DaskBackend(client=...)``.

Which cluster
    The client given (``client=``), else a client to ``address=`` (or the
    ``DASK_SCHEDULER_ADDRESS`` environment variable), else the current
    ``distributed.Client`` of this process, else a ``LocalCluster`` of
    ``workers`` processes with one thread each, started here. :meth:`stop`
    closes only what was started here: a user's client and cluster stay up.

How it runs
    ``workers`` long-lived futures, one per Dask worker process where the
    cluster has enough, each running :func:`._remote_worker.serve`: the
    driver feeds them batches over a socket (:mod:`._remote_slots` says
    why, and how a crash or a timeout costs one task). The run's payload is
    scattered once, to one worker, and fetched from it by the others as Dask
    moves any task's input. A worker process that dies (the
    nanny starts another) costs the task it was running; Dask may run the
    future again elsewhere (``allowed_failures``): that only starts a fresh
    worker loop, never a batch. Workers' threads run the loops, so fit code
    that holds the GIL wants one thread per worker process
    (``dask worker --nthreads 1 --nworkers N``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from typing import Any

from ...machine import usable_cores
from ..options import BackendOptions
from ._remote_slots import RemoteSlotsBackend, describe
from ._remote_worker import serve


def _import_distributed() -> Any:
    try:
        import distributed
    except ImportError as exc:
        raise ImportError("backend='dask' needs Dask's distributed scheduler: "
                          "pip install 'manymodels[dask]'") from exc
    return distributed


def _current_client() -> Any:
    distributed = __import__("sys").modules.get("distributed")
    if distributed is None:
        return None
    try:
        return distributed.get_client()
    except ValueError:
        return None


class DaskBackend(RemoteSlotsBackend):
    """Batches on a Dask cluster; see the module docstring.

    ``workers`` is the number of worker loops at once; ``None`` takes the
    cluster's worker processes (one loop each), or the usable cores for a
    ``LocalCluster`` started here. ``cluster_options`` go to ``LocalCluster``.
    """

    name = "dask"
    engine = "Dask"

    def __init__(
        self,
        workers: int | None = None,
        cpus_per_task: int = 1,
        timeout: float | None = None,
        memory_limit: int | None = None,
        gpu_sets: list[list[str]] | None = None,
        *,
        client: Any = None,
        address: str | None = None,
        **cluster_options: Any,
    ) -> None:
        _import_distributed()  # fail here, before any work, where Dask is not installed
        self.client = client
        self.address = address
        self.cluster_options = cluster_options
        self._own_client: Any = None
        self._own_cluster: Any = None
        self._tracker_was_running = True
        self._environ_before: dict[str, str | None] = {}
        self._relaunching = False
        super().__init__(workers, cpus_per_task, timeout=timeout, memory_limit=memory_limit,
                         gpu_sets=gpu_sets)

    @classmethod
    def default_workers(cls, cpus_per_task: int) -> int | None:
        return None  # the cluster's worker processes, counted when configured

    def configure(self, options: BackendOptions) -> None:
        super().configure(options)
        self.auto_workers = options.workers is None
        if self.auto_workers:
            client = self.client or _current_client()
            counted = len(client.scheduler_info().get("workers", {})) if client else 0
            self.workers = counted or max(1, usable_cores() // self.cpus_per_task)

    def _start_engine(self) -> str:
        distributed = _import_distributed()
        client = self.client
        address = self.address or os.environ.get("DASK_SCHEDULER_ADDRESS")
        if client is None and address:
            client = self._own_client = distributed.Client(address)
        if client is None:
            client = _current_client()
        if client is None:
            self._tracker_was_running = _tracker_running()
            options = {"n_workers": self.workers, "threads_per_worker": 1,
                       "processes": True, "dashboard_address": ":0",
                       "memory_limit": 0, "silence_logs": logging.ERROR,
                       **self.cluster_options}
            self._environ_before = _nanny_environ()
            self._own_cluster = distributed.LocalCluster(**options)
            client = self._own_client = distributed.Client(self._own_cluster)
        self._client = client
        if self.auto_workers:
            self.workers = len(client.scheduler_info().get("workers", {})) or self.workers
        self._key = f"manymodels-{uuid.uuid4().hex[:10]}"
        scheduler = client.scheduler.address or ""
        host = scheduler.split("://")[-1].rsplit(":", 1)[0].strip("[]")
        if self._own_cluster is not None or host in ("127.0.0.1", "localhost", "") or (
                scheduler.startswith("inproc")):
            return "127.0.0.1"
        return distributed.utils.get_ip(host)

    def _ship(self, payload: bytes) -> Any:
        # a worker process killed a moment ago (a crash, a timeout) leaves none
        # for a while, until its nanny starts another: scatter then finds no one
        self._wait_for_a_worker()
        # To one worker, not broadcast: the workers that run a loop fetch it
        # from a holder, as Dask moves any task's input. A broadcast waits
        # until every worker the scheduler lists holds a copy, and it never
        # ended when one of them was a process killed a moment ago (the
        # scheduler retried the dead address every 30 s). A worker still
        # listed as it goes (ended a moment ago by a stopped run: its loops
        # end their own process) closes the connection: scatter again, to
        # those that are up.
        for attempt in range(_SCATTER_TRIES):
            try:
                return self._client.scatter(payload, hash=False)
            except OSError:  # (CommClosedError is one)
                if attempt == _SCATTER_TRIES - 1:
                    raise
                time.sleep(0.5 * (attempt + 1))
                self._wait_for_a_worker()
        raise AssertionError("unreachable")  # (the last try raises)

    def _wait_for_a_worker(self) -> None:
        """Return once the cluster has a worker; refuse to go on, saying why,
        where none comes within :data:`_NO_WORKER_S`. A cluster of this
        process (a ``LocalCluster``) that closed a nanny is first brought back
        to its own spec: Dask closes the nanny of a worker found missing
        ``distributed.deploy.lost-worker-timeout`` (15 s) after one of its
        processes ended, and a worker process this run's loops ended (a
        timeout, a stopped run) may be restarting just then; the nanny is
        then gone for good, and its cluster one worker short."""
        client = self._client
        cluster = getattr(client, "cluster", None)
        spec = getattr(cluster, "worker_spec", None)
        if spec and len(getattr(cluster, "workers", spec)) < len(spec):
            with contextlib.suppress(Exception):  # (the cluster starts what it lacks)
                cluster.scale(len(spec))
        with contextlib.suppress(Exception):
            client.wait_for_workers(1, timeout=_NO_WORKER_S)
            return
        raise RuntimeError(f"the Dask cluster at {client.scheduler.address} has had no worker "
                           f"for {_NO_WORKER_S} s: its worker processes ended and none joined "
                           "again; start workers (dask worker ...) and run again")

    def _reship(self, shipped: Any, payload: bytes) -> Any:
        # The scheduler forgets scattered data whose last holder died (a
        # worker process killed with the only copy left): scatter it again.
        return shipped if shipped.status == "finished" else self._ship(payload)

    def _launch(self, launch: int, args: tuple) -> Any:
        workers = list(self._client.scheduler_info().get("workers", {}))
        options: dict[str, Any] = {}
        if workers and not self._relaunching:
            # spread the first loops over worker processes, not threads of one;
            # a replacement goes wherever the scheduler finds room
            options = {"workers": [workers[launch % len(workers)]],
                       "allow_other_workers": True}
        return self._client.submit(serve, *args, key=f"{self._key}-{launch}-{uuid.uuid4().hex[:6]}",
                                   pure=False, retries=0, **options)

    def _launch_ended(self, handle: Any) -> str | None:
        if not handle.done():
            return None
        if handle.status == "error":
            try:
                return describe(handle.exception(timeout=1))
            except Exception as exc:
                return describe(exc)
        return handle.status

    def _cancel_launches(self, handles: list[Any]) -> None:
        try:
            self._client.cancel(handles, force=True)
        except Exception:
            pass

    def _stop_engine(self) -> None:
        client, cluster = self._own_client, self._own_cluster
        self._own_client = self._own_cluster = None
        self._client = None
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
            if not self._tracker_was_running:
                _stop_tracker()
            _restore_environ(self._environ_before)


#: Scatters tried while worker processes go and their nannies start others.
_SCATTER_TRIES = 6
#: Seconds a run waits for a cluster with no worker to have one again.
_NO_WORKER_S = 60


def _nanny_environ() -> dict[str, str | None]:
    """This process's values of the variables a nanny of a ``LocalCluster``
    started here sets in it before each worker process it spawns
    (``distributed.nanny.pre-spawn-environ``: ``OMP_NUM_THREADS=1`` and
    others), to be put back once the cluster is closed: the driver's own,
    and what the processes it starts later inherit, stay the user's."""
    import dask

    names = {*(dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}),
             "PYTHONHASHSEED"}
    return {name: os.environ.get(name) for name in names}


def _restore_environ(before: dict[str, str | None]) -> None:
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _tracker_running() -> bool:
    from multiprocessing import resource_tracker

    return getattr(resource_tracker._resource_tracker, "_fd", None) is not None


def _stop_tracker() -> None:
    """The LocalCluster's nannies start Python's multiprocessing resource
    tracker, a process that otherwise outlives the run: stop it where this
    run started it (the next user of it starts it again)."""
    from multiprocessing import resource_tracker

    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None:
        with contextlib.suppress(Exception):
            stop()
