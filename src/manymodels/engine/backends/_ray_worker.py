"""The body of a Ray task of the Ray backend (see :mod:`.ray` for the design).

Each Ray task runs one batch with :func:`_run_batch`, a streaming generator:
the run (context, table, shared objects) is resolved from the object store
once per Ray worker process and cached, the BLAS/OpenMP limits hold for the
batch only, and what happens is yielded as messages that let the driver pin a
crash or a timeout on one task.
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback
from collections.abc import Iterator
from typing import Any

import cloudpickle

from ..execution import Executor, TaskRef
from ..gpus import prepare_worker
from ._batch_messages import batch_messages
from ._protocol import Msg

#: run id -> the Executor of that run in this worker process. A Ray worker runs
#: one task at a time and serves one job, so only the latest run is kept: an
#: older run's table and shared objects are released when a new run arrives.
_EXECUTORS: dict[str, Executor] = {}


def _load_executor(run_id: str, payload: tuple[Any, Any, Any]) -> Executor:
    """The run's Executor in this worker process, built on first use."""
    executor = _EXECUTORS.get(run_id)
    if executor is not None:
        return executor
    import ray

    _EXECUTORS.clear()
    context_ref, table_ref, shared_ref = payload
    driver_path, context_bytes = ray.get(context_ref)
    # fit's module may live where only the driver's sys.path finds it (a test
    # directory, a notebook's folder); the same paths exist on a local node.
    sys.path.extend(entry for entry in driver_path if entry not in sys.path)
    context = cloudpickle.loads(context_bytes)
    prepare_worker(context.gpu_setup)
    table = ray.get(table_ref) if table_ref is not None else None
    shared = ray.get(shared_ref) if shared_ref is not None else None
    executor = Executor(context, table=table, shared=shared)
    _EXECUTORS[run_id] = executor
    return executor


def _run_batch(
    run_id: str,
    payload: tuple[Any, Any, Any],
    tasks_blob: bytes,
    cpus_per_task: int,
    marked: bool,
) -> Iterator[tuple]:
    """The Ray task (a streaming generator): run one batch, yield what happens.

    Yields ``("start", node_id, pid, manymodels_version)``, then either ``("fatal", traceback)``
    (the run cannot be loaded here) or outcome messages: ``("run", index,
    outcomes, busy_s, prepare_s)`` before each task in marked mode, and
    the others of :func:`~._batch_messages.batch_messages`.
    """
    import ray

    from ..._version import __version__

    yield (Msg.START, ray.get_runtime_context().get_node_id(), os.getpid(), __version__)
    try:
        executor = _load_executor(run_id, payload)
        tasks: list[TaskRef] = pickle.loads(tasks_blob)
    except BaseException:
        yield (Msg.FATAL, traceback.format_exc())
        return
    yield from batch_messages(executor, tasks, marked, cpus_per_task)


_REMOTE: Any = None


def remote_function() -> Any:
    global _REMOTE
    if _REMOTE is None:
        import ray

        _REMOTE = ray.remote(num_returns="streaming", max_retries=0)(_run_batch)
    return _REMOTE
