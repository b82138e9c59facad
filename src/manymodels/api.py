"""The public entry point :func:`train`: its arguments and their meaning.
The wiring is :mod:`manymodels.run.runner`'s; everything a user can get wrong
is checked there, before a worker starts, and the error names the argument."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .engine.backends import Backend
from .inputs.sources import Source
from .run import runner
from .run.results import Run
from .run.store import Store


def train(
    fit: Callable[..., Any],
    source: Source,
    *,
    shared: Mapping[str, Any] | None = None,
    backend: str | Backend = "processes",
    workers: int | None = None,
    cpus_per_task: int = 1,
    gpus_per_task: float = 0,
    gpus: int | list[int | str] | None = None,
    gpu_memory_limit: float | None = None,
    retries: int = 0,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
    timeout: float | None = None,
    memory_limit: int | str | None = None,
    max_failures: int | float | None = None,
    progress: bool = True,
    store: str | Path | Store | None = None,
    reuse: bool = True,
    verify: bool = False,
    setup: Callable[[], Any] | Mapping[str, Callable[[], Any]] | None = None,
    start_method: str = "auto",
    callbacks: Any = None,
    track: Any = None,
    dashboard: bool = False,
    evaluate: Any = None,
    select: Any = None,
    keep_checkpoints: bool = False,
) -> Run:
    """Train one model per task of ``source``, in parallel; return the :class:`Run`.

    ``fit(data, **params, **shared)`` receives a group's rows (or an item) first,
    unless the source is a bare grid, then the grid values and the ``shared``
    objects as keywords. It returns a model, a ``(model, metrics)`` pair, or a
    dict of metrics. An exception fails only its own task; its traceback is in
    ``run.failed``. A ``fit`` with a ``key`` parameter also gets its task's key
    as ``key=`` (a scalar for one ``by`` column, a tuple for several).

    * ``backend``: ``"processes"`` (default), ``"threads"``, ``"serial"``,
      ``"ray"`` (a Ray cluster at ``RAY_ADDRESS``, or a local Ray instance),
      ``"spark"`` (the active Spark session, else a local one) or ``"dask"``
      (the current Dask client, else a local cluster), or a backend instance such as
      ``mm.RayBackend(address="ray://head:10001")``.
    * ``workers``: default the usable cores (affinity and cgroup aware) divided
      by ``cpus_per_task``, the BLAS/OpenMP threads each task may use; on Ray,
      the cluster's CPUs divided by ``cpus_per_task``.
    * ``gpus_per_task``: GPUs each running task gets to itself, through
      ``CUDA_VISIBLE_DEVICES``; at most ``gpus // gpus_per_task`` tasks run at
      once. A fraction ``1/k`` (0.5, 0.25, ...) lets ``k`` tasks share a GPU;
      workers then default to GPUs x ``k``, at most one per usable core.
      ``gpus`` declares the GPU count or ids (default: detected from
      ``CUDA_VISIBLE_DEVICES``, else ``nvidia-smi``); it needs ``gpus_per_task``.
      ``gpu_memory_limit``: a fraction of its GPU's memory each task's PyTorch
      may allocate (see :mod:`manymodels.engine.gpus`).
    * ``retries``: how often a task whose worker crashed, timed out or ran out
      of memory, or that raised one of ``retry_on``, is tried again.
    * ``timeout`` (seconds per task) and ``memory_limit`` (per worker, bytes or
      ``"2GB"``): the worker is killed and replaced, the task recorded
      ``timeout`` or ``memory``. ``timeout`` is enforced by the processes,
      Ray, Spark and Dask backends, ``memory_limit`` by the processes
      backend; the others refuse them before any work.
    * ``max_failures``: an error budget, a count or a fraction of the tasks;
      past it the run stops and raises :class:`TooManyFailures`.
    * ``progress``: a progress bar on a terminal; where stderr is not one, a
      plain line every 30 s (``MANYMODELS_PROGRESS_INTERVAL``) and at the end.
    * ``setup``: a function run once in each worker (load a large resource
      once, not per task); its result reaches ``fit`` as ``resource=``. A dict
      of name -> function passes each result under its name.
    * ``start_method``: how the processes backend starts workers: ``"fork"``
      (milliseconds, shares the driver's memory), ``"spawn"`` (a fresh
      interpreter: slower, safe whatever the driver holds) or ``"auto"``
      (fork where that is known to be safe, else spawn).
    * ``store``: a directory (or :class:`Store`) that records every task and
      model, crash-safe; with ``reuse`` (default), a re-run reuses each
      finished model whose code, parameters and data are unchanged.
      ``verify``: read each model a re-run would reuse and check it against
      its SHA-256 first (reuse otherwise trusts the index: see
      :meth:`Store.verify`); a corrupt one is trained again, with a warning
      naming its key.
    * ``callbacks``: :class:`manymodels.Callback` objects called as the run
      goes (see :mod:`manymodels.observe.callbacks`); ``track``: one more, a tracker
      such as ``mm.MLflow(experiment="sales")`` (one MLflow run per call).
    * ``dashboard``: serve the live dashboard of ``store`` on 127.0.0.1 while
      the run lasts, and print its address.
    * ``evaluate``: ``mm.holdout(...)``, ``mm.kfold(...)`` or ``mm.backtest(...)``:
      each task scores ``fit``'s model on rows it did not see, then keeps one
      fitted on all rows (``final_model=``; see :mod:`manymodels.evaluation.splitters`);
      ``run.evaluation`` per window, ``run.forecasts`` per window and test row.
    * ``select``: a metric (``"rmse"``, ``("r2", "max")``): each group's best
      task of ``groups * grid``, shown by ``run.best()`` and recorded in the
      store as the group's model (see :mod:`manymodels.evaluation.selection`).
    * A ``fit`` with a ``checkpoint`` parameter gets a :class:`Checkpoint`:
      it saves its state as it goes, and a retry, or the next run with the
      same store, resumes the task from its last state (``run.results``'s
      ``resumed`` and ``resumed_from``). Checkpoints live in the store, keyed
      by the task's identity (without one, in a temporary directory for the
      run); a task's go once its model is committed, unless
      ``keep_checkpoints``. See the guide's checkpoints page.
    """
    return runner.train(
        fit, source, shared=shared, backend=backend, workers=workers,
        cpus_per_task=cpus_per_task, gpus_per_task=gpus_per_task, gpus=gpus,
        gpu_memory_limit=gpu_memory_limit, retries=retries, retry_on=retry_on,
        timeout=timeout, memory_limit=memory_limit, max_failures=max_failures,
        progress=progress, store=store, reuse=reuse, verify=verify, setup=setup,
        start_method=start_method, callbacks=callbacks, track=track, dashboard=dashboard,
        evaluate=evaluate, select=select, keep_checkpoints=keep_checkpoints,
        store_type=Store)
