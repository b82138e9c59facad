"""The public entry point :func:`train`.

Everything a user can get wrong is checked here, before a worker starts, and
the error names the argument at fault.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .engine.backends import Backend, backend_class
from .engine.execution import RunContext
from .engine.options import RunOptions
from .engine.scheduling import Scheduler
from .evaluation.selection import Halving, HalvingSearch, Selection
from .evaluation.splitters import prepare as prepare_evaluation
from .identity.hashing import task_identities
from .inputs.grids import require_distinct_texts
from .inputs.sources import Source
from .machine import collector_paused
from .observe.callbacks import Callbacks, RunInfo
from .observe.progress import ProgressBar
from .planning.plan import add_fit_keys
from .planning.plan import plan as make_plan
from .run.results import Run, check_key_names
from .store import RunRecorder, Store, StoreError


def _callable_name(fit: Any) -> str:
    name = getattr(fit, "__qualname__", None) or type(fit).__qualname__
    return f"{getattr(fit, '__module__', None) or type(fit).__module__}.{name}"


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
    setup: Callable[[], Any] | Mapping[str, Callable[[], Any]] | None = None,
    start_method: str = "auto",
    callbacks: Any = None,
    track: Any = None,
    dashboard: bool = False,
    evaluate: Any = None,
    select: Any = None,
) -> Run:
    """Train one model per task of ``source``, in parallel; return the :class:`Run`.

    ``fit(data, **params, **shared)`` receives a group's rows (or an item) first,
    unless the source is a bare grid, then the grid values and the ``shared``
    objects as keywords. It returns a model, a ``(model, metrics)`` pair, or a
    dict of metrics. An exception fails only its own task; its traceback is in
    ``run.failed``. A ``fit`` with a ``key`` parameter also gets its task's key
    as ``key=`` (a scalar for one ``by`` column, a tuple for several).

    * ``backend``: ``"processes"`` (default), ``"threads"``, ``"serial"`` or
      ``"ray"`` (a Ray cluster at ``RAY_ADDRESS``, or a local Ray instance), or
      a backend instance such as ``mm.RayBackend(address="ray://head:10001")``.
    * ``workers``: default the usable cores (affinity and cgroup aware) divided
      by ``cpus_per_task``, the BLAS/OpenMP threads each task may use; on Ray,
      the cluster's CPUs divided by ``cpus_per_task``.
    * ``gpus_per_task``: GPUs each running task gets to itself, through
      ``CUDA_VISIBLE_DEVICES``; at most ``gpus // gpus_per_task`` tasks run at
      once. A fraction ``1/k`` (0.5, 0.25, ...) lets ``k`` tasks share a GPU;
      workers then default to GPUs x ``k``, at most one per usable core.
      ``gpus`` declares the GPU count or ids (default: detected).
      ``gpu_memory_limit``: a fraction of its GPU's memory each task's PyTorch
      may allocate (see :mod:`manymodels.engine.gpus`).
    * ``retries``: how often a task whose worker crashed, timed out or ran out
      of memory, or that raised one of ``retry_on``, is tried again.
    * ``timeout`` (seconds per task) and ``memory_limit`` (per worker, bytes or
      ``"2GB"``): the worker is killed and replaced, the task recorded
      ``timeout`` or ``memory`` (processes backend).
    * ``max_failures``: an error budget, a count or a fraction of the tasks;
      past it the run stops and raises :class:`TooManyFailures`.
    * ``progress``: a progress bar on a terminal.
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
    * ``callbacks``: :class:`manymodels.Callback` objects called as the run
      goes (see :mod:`manymodels.observe.callbacks`); ``track``: one more, a tracker
      such as ``mm.MLflow(experiment="sales")`` (one MLflow run per call).
    * ``dashboard``: serve the live dashboard of ``store`` on 127.0.0.1 while
      the run lasts, and print its address.
    * ``evaluate``: ``mm.holdout(...)``, ``mm.kfold(...)`` or ``mm.backtest(...)``:
      each task scores ``fit``'s model on rows it did not see, then refits on
      all (see :mod:`manymodels.evaluation.splitters`); ``run.evaluation`` per window.
    * ``select``: a metric (``"rmse"``, ``("r2", "max")``): each group's best
      task of ``groups * grid``, shown by ``run.best()`` and recorded in the
      store as the group's model (see :mod:`manymodels.evaluation.selection`).
    """
    began = (time.time(), time.perf_counter())
    if not callable(fit):
        raise TypeError(f"fit must be callable, got {type(fit).__name__}")
    if not isinstance(source, Source):
        raise TypeError(
            "source must be made by mm.groups(), mm.items(), mm.grid() or their product, "
            f"got {type(source).__name__}"
        )
    check_key_names(source.key_columns)
    instance = backend if isinstance(backend, Backend) else None
    backend_type = type(instance) if instance is not None else backend_class(backend)
    name = instance.name if instance is not None else backend
    options = RunOptions.validate(
        fit=fit, source=source, backend_type=backend_type, backend_name=name,
        instance=instance, shared=shared, workers=workers, cpus_per_task=cpus_per_task,
        gpus_per_task=gpus_per_task, gpus=gpus, retries=retries, retry_on=retry_on,
        timeout=timeout, memory_limit=memory_limit, max_failures=max_failures,
        progress=progress, reuse=reuse, setup=setup, start_method=start_method,
        gpu_memory_limit=gpu_memory_limit)
    hooks = Callbacks.validate(callbacks) + Callbacks.validate(track)
    if dashboard and store is None:
        raise ValueError("dashboard=True needs store=: the dashboard reads the store")
    run_fit, splitter = prepare_evaluation(fit, source, evaluate)
    identity_extra: dict[str, Any] = {} if splitter is None else {"__evaluate__": splitter}
    if isinstance(select, Halving):  # one task per group, its candidates inside
        source, run_fit = HalvingSearch.prepare(fit, source, splitter, select)
        identity_extra["__halving__"] = (select, run_fit.settings)
        selection = select.selection
    else:
        selection = None if select is None else Selection.parse(select, splitter)
    # a store that does not exist yet is made once the plan and the task
    # identities are (a refusal there, of a column that cannot be hashed say,
    # left an empty store behind); an existing one is checked at once
    if store is not None:
        require_distinct_texts(source)
    new_store = isinstance(store, (str, Path)) and not Path(store).exists()
    if not new_store:
        store = _open_store(store)
    live = None
    if dashboard:
        from .observe.dashboard import LiveDashboard

        hooks.append(live := LiveDashboard())

    # fits run in other processes: the driver's own million tuples and dicts
    # (acyclic) need no cycle collector, whose full passes over them cost
    # seconds; with threads or serial, fit runs here and it stays on
    with collector_paused(backend_type.requires_pickling):
        plan = make_plan(source)
        add_fit_keys(plan, fit, {*(options.shared or {}),
                                 *(options.setup if isinstance(options.setup, Mapping) else ())})
        context = RunContext(fit=run_fit, data=plan.data, table=plan.data.table,
                             shared=options.shared, cpus_per_task=options.backend.cpus_per_task,
                             retry_on=options.retry_on, setup=options.setup,
                             # with a store, as fit returned it (serial and threads
                             # too: a model fit goes on changing is stored as it was)
                             pickle_models=("all" if store is not None else "small"
                                            if backend_type.requires_pickling else None))
        recorder, to_do = None, len(plan.tasks)
        if store is not None:
            # the splitter is part of each task's identity: its metrics depend on
            # it; the driver keeps no per-task identity beyond the recorder's columns
            identities = task_identities(
                plan, fit, {**(options.shared or {}), **identity_extra} if identity_extra
                else options.shared, options.setup)
            if new_store:
                store = _open_store(store)
            recorder = RunRecorder(store, plan, *identities, fit_name=_callable_name(fit),
                                   source=repr(source), backend=name, workers=options.sized_for(
                                       backend_type, len(plan.tasks)).workers)
            to_do -= recorder.begin(reuse=options.reuse)
        try:
            engine = instance if instance is not None else backend_type()
            engine.configure(options.sized_for(backend_type, to_do))
        except BaseException:
            if recorder is not None:
                recorder.abandon()
            raise
        scheduler = Scheduler(plan, engine, make_run=Run, retries=options.retries,
                              max_failures=options.max_failures,
                              progress=functools.partial(ProgressBar, len(plan.tasks),
                                                         options.progress),
                              recorder=recorder, callbacks=Callbacks(
                                  hooks, plan, RunInfo.describe(
                                      plan, fit, source, engine, options, store, recorder))
                              if hooks else None)
        try:
            run = scheduler.run(context, began)
        finally:
            if live is not None:
                live.close()
    if selection is not None:
        run.select(selection, source)
    return run


def _open_store(store: Any) -> Store | None:
    if store is None:
        return None
    if not isinstance(store, Store):
        if not isinstance(store, (str, Path)):
            raise TypeError(f"store must be a directory path or a Store, got {store!r}")
        store = Store(store)
    if store.read_only:
        raise StoreError(f"store {str(store.path)!r} is open for reading only (its files are "
                         "not writable here): it can be read, not trained into")
    return store
