"""The public entry point :func:`train`.

Everything a user can get wrong is checked here, before a worker starts, and
the error names the argument at fault.
"""

from __future__ import annotations

import numbers
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import cloudpickle

from ._resources import parse_bytes, usable_cores, visible_gpus
from .backends import Backend, backend_class
from .backends.processes import START_METHODS
from .execution import RunContext
from .hashing import task_identities
from .planning import plan as make_plan
from .results import Run
from .scheduling import Scheduler
from .sources import Source
from .store import RunRecorder, Store, StoreError


def _positive_int(name: str, value: Any, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _check_max_failures(value: Any) -> int | float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value < 0:
        raise ValueError(
            f"max_failures must be a count >= 0 or a fraction in (0, 1), got {value!r}"
        )
    if isinstance(value, numbers.Integral):
        return int(value)
    if not 0 < value < 1:
        raise ValueError(f"max_failures as a fraction must lie in (0, 1), got {value!r}")
    return float(value)


def _check_retry_on(value: Any) -> tuple[type[BaseException], ...]:
    if value is None:
        return ()
    types = (value,) if isinstance(value, type) else tuple(value)
    for item in types:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise TypeError(f"retry_on must hold exception classes, got {item!r}")
    return types


def _gpu_sets(gpus_per_task: Any, gpus: Any, backend_type: type, backend: str
              ) -> list[list[str]] | None:
    """Split the GPUs into disjoint sets of ``gpus_per_task``, one per worker."""
    per_task = _positive_int("gpus_per_task", gpus_per_task, minimum=0)
    declared = None if gpus is None else _positive_int("gpus", gpus, minimum=0)
    if per_task == 0:
        return None
    if not backend_type.isolates_gpus:
        raise ValueError(f"the {backend} backend cannot give each task its own GPUs; "
                         "use backend='processes'")
    ids = visible_gpus(declared)
    if len(ids) < per_task:
        raise ValueError(
            f"gpus_per_task={per_task} but {len(ids)} GPU(s) are available; declare the "
            "count with gpus=N if detection missed them")
    return [ids[i * per_task:(i + 1) * per_task] for i in range(len(ids) // per_task)]


def _callable_name(fit: Any) -> str:
    name = getattr(fit, "__qualname__", None) or type(fit).__qualname__
    return f"{getattr(fit, '__module__', None) or type(fit).__module__}.{name}"


def _check_setup(setup: Any) -> list[str]:
    if setup is None:
        return []
    if isinstance(setup, Mapping):
        for name, make in setup.items():
            if not isinstance(name, str) or not callable(make):
                raise TypeError("setup must be a function, or a dict of name -> function")
        return list(setup)
    if not callable(setup):
        raise TypeError(f"setup must be a function, got {type(setup).__name__}")
    return ["resource"]


def _check_picklable(fit: Any, shared: dict | None, backend: str, what: str = "fit") -> None:
    try:
        cloudpickle.dumps(fit)
    except Exception as exc:
        raise TypeError(
            f"{what} cannot be pickled to send it to the {backend} backend's worker "
            f"processes: {exc!r}. Define {what} at module level without references to "
            "open files, locks or connections, or use backend='threads'"
        ) from exc
    for name, value in (shared or {}).items():
        try:
            cloudpickle.dumps(value)
        except Exception as exc:
            raise TypeError(
                f"shared object {name!r} cannot be pickled for the {backend} backend: "
                f"{exc!r}; use backend='threads' to share it in-process"
            ) from exc


def train(
    fit: Callable[..., Any],
    source: Source,
    *,
    shared: Mapping[str, Any] | None = None,
    backend: str | Backend = "processes",
    workers: int | None = None,
    cpus_per_task: int = 1,
    gpus_per_task: int = 0,
    gpus: int | None = None,
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
) -> Run:
    """Train one model per task of ``source``, in parallel; return the :class:`Run`.

    ``fit(data, **params, **shared)`` receives a group's rows (or an item) first,
    unless the source is a bare grid, then the grid values and the ``shared``
    objects as keywords. It returns a model, a ``(model, metrics)`` pair, or a
    dict of metrics. An exception fails only its own task; its traceback is in
    ``run.failed``.

    * ``backend``: ``"processes"`` (default), ``"threads"``, ``"serial"`` or
      ``"ray"`` (a Ray cluster at ``RAY_ADDRESS``, or a local Ray instance), or
      a backend instance such as ``mm.RayBackend(address="ray://head:10001")``.
    * ``workers``: default the usable cores (affinity and cgroup aware) divided
      by ``cpus_per_task``, the BLAS/OpenMP threads each task may use; on Ray,
      the cluster's CPUs divided by ``cpus_per_task``.
    * ``gpus_per_task``: GPUs each running task gets to itself, through
      ``CUDA_VISIBLE_DEVICES``; at most ``gpus // gpus_per_task`` tasks run at
      once. ``gpus`` declares the GPU count (default: detected).
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
    """
    began = (time.time(), time.perf_counter())
    if not callable(fit):
        raise TypeError(f"fit must be callable, got {type(fit).__name__}")
    if not isinstance(source, Source):
        raise TypeError(
            "source must be made by mm.groups(), mm.items(), mm.grid() or their product, "
            f"got {type(source).__name__}"
        )
    instance = backend if isinstance(backend, Backend) else None
    if instance is not None:
        backend = instance.name
    backend_type = type(instance) if instance is not None else backend_class(backend)
    if start_method != "auto" and backend != "processes":
        raise ValueError(f"start_method applies to backend='processes', not {backend!r}")
    if start_method not in START_METHODS:
        raise ValueError(f"unknown start_method {start_method!r}; choose one of "
                         f"{', '.join(START_METHODS)}")
    cpus_per_task = _positive_int("cpus_per_task", cpus_per_task)
    explicit_workers = workers is not None
    if workers is not None:
        workers = _positive_int("workers", workers)
    elif instance is not None:
        workers = instance.workers
    elif backend != "ray":  # Ray counts its cluster's CPUs itself
        workers = max(1, usable_cores() // cpus_per_task)
    retries = _positive_int("retries", retries, minimum=0)
    gpu_sets = _gpu_sets(gpus_per_task, gpus, backend_type, backend)
    if gpu_sets is not None and workers is not None:
        workers = min(workers, len(gpu_sets))
    retry_types = _check_retry_on(retry_on)
    max_failures = _check_max_failures(max_failures)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or timeout <= 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if not backend_type.enforces_timeout:
            raise ValueError(
                f"the {backend} backend cannot stop a running task, so it cannot enforce "
                "timeout=; use backend='processes'"
            )
    memory_bytes = None
    if memory_limit is not None:
        memory_bytes = parse_bytes(memory_limit)
        if not backend_type.enforces_memory_limit:
            raise ValueError(
                f"the {backend} backend cannot enforce memory_limit=; use backend='processes'"
            )
    if shared is not None:
        if not isinstance(shared, Mapping) or not all(isinstance(k, str) for k in shared):
            raise TypeError("shared must be a dict of name -> object, passed to fit as keywords")
        clash = set(shared) & set(source.param_columns)
        if clash:
            raise ValueError(f"shared name {sorted(clash)[0]!r} is also a grid parameter")
        shared = dict(shared)
    setup_names = _check_setup(setup)
    clash = set(setup_names) & (set(shared or {}) | set(source.param_columns))
    if clash:
        raise ValueError(f"setup name {sorted(clash)[0]!r} is also a shared or grid name")
    if backend_type.requires_pickling:
        _check_picklable(fit, shared, backend)
        if setup is not None:
            _check_picklable(setup, None, backend, what="setup")
    if store is not None and not isinstance(store, Store):
        if not isinstance(store, (str, Path)):
            raise TypeError(f"store must be a directory path or a Store, got {store!r}")
        store = Store(store)
    if store is not None and store.read_only:
        raise StoreError(f"store {str(store.path)!r} is open for reading only (its files are "
                         "not writable here): it can be read, not trained into")

    plan = make_plan(source)
    if backend == "serial":
        workers = 1
    if workers is not None:
        workers = min(workers, len(plan.tasks))
    context = RunContext(
        fit=fit,
        data=plan.data,
        table=plan.data.table,
        shared=shared or None,
        cpus_per_task=cpus_per_task,
        retry_on=retry_types,
        setup=setup,
    )
    recorder, reused = None, None
    if store is not None:
        identities, code_detail = task_identities(plan, fit, shared)
        recorder = RunRecorder(
            store, plan, identities, code_detail,
            fit_name=_callable_name(fit),
            source=repr(source), backend=backend, workers=workers)
        reused = recorder.begin(reuse=bool(reuse))
        if workers is not None:
            workers = max(1, min(workers, len(plan.tasks) - len(reused)))
    if instance is not None:
        engine = instance
        engine.configure(cpus_per_task, timeout, memory_bytes, gpu_sets)
        if explicit_workers:  # the user's count wins over the backend's own sizing
            engine.workers = workers
            if hasattr(engine, "auto_workers"):
                engine.auto_workers = False
    else:
        options = {"start_method": start_method} if backend == "processes" else {}
        engine = backend_type(workers, cpus_per_task, timeout=timeout,
                              memory_limit=memory_bytes, gpu_sets=gpu_sets, **options)
    scheduler = Scheduler(plan, engine, retries=retries, max_failures=max_failures,
                          progress=progress, recorder=recorder)
    return scheduler.run(context, began)
