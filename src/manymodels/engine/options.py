"""``train``'s keywords, validated once into frozen options objects.

The public face stays flat, one keyword per concern (``workers``,
``timeout``, ``memory_limit``, ...). Behind it, :meth:`RunOptions.validate`
checks every keyword before any work starts, with an error that names the
keyword at fault, and the rest of the package reads only the validated,
immutable result (as mpire's ``WorkerPoolParams``):

* :class:`BackendOptions` -- what a backend must know (workers and their
  resources), handed over through ``Backend.configure``, its only way in;
* :class:`RunOptions` -- the backend's options plus what the scheduler and the
  store use (retries, the error budget, progress, reuse).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import cloudpickle

from ..machine import (
    cuda_visible_ids,
    detect_gpus,
    parse_bytes,
    visible_gpus,
    worker_niceness,
)
from .gpus import check_gpus_per_task, check_memory_fraction, declared_gpus, place_gpus

#: How the processes backend may start its workers.
START_METHODS = ("auto", "fork", "spawn")


@dataclass(frozen=True)
class BackendOptions:
    """A run's resources, as a backend receives them in ``configure``.

    ``workers`` None lets the backend size itself (the usable cores divided by
    ``cpus_per_task``; a Ray cluster's CPUs). ``gpu_sets`` holds, per worker
    slot, the GPU ids that slot may use (:func:`manymodels.engine.gpus.place_gpus`).
    """

    workers: int | None = None
    cpus_per_task: int = 1
    timeout: float | None = None
    memory_limit: int | None = None
    gpu_sets: tuple[tuple[str, ...], ...] | None = None
    start_method: str = "auto"
    gpus_per_task: float = 0  # 2, 1, or a share 1/k of one GPU
    gpu_memory_fraction: float | None = None  # gpu_memory_limit=, per task


@dataclass(frozen=True)
class RunOptions:
    """Every keyword of one ``train`` call, checked."""

    backend: BackendOptions
    backend_name: str
    retries: int = 0
    retry_on: tuple[type[BaseException], ...] = ()
    max_failures: int | float | None = None
    progress: bool = True
    reuse: bool = True
    shared: dict[str, Any] | None = None
    setup: Any = None

    @classmethod
    def validate(cls, *, fit: Any, source: Any, backend_type: type, backend_name: str,
                 instance: Any, shared: Any, workers: Any, cpus_per_task: Any,
                 gpus_per_task: Any, gpus: Any, retries: Any, retry_on: Any, timeout: Any,
                 memory_limit: Any, max_failures: Any, progress: Any, reuse: Any,
                 setup: Any, start_method: Any, gpu_memory_limit: Any = None) -> RunOptions:
        """Check ``train``'s keywords (see its docstring) against the backend
        that will run them; raise naming the keyword at fault."""
        if not callable(fit):
            raise TypeError(f"fit must be callable, got {type(fit).__name__}")
        if instance is not None and start_method == "auto":
            start_method = instance.built_options.start_method  # as the user built it
        if start_method != "auto" and not backend_type.starts_local_processes:
            raise ValueError(f"start_method applies to backend='processes' (a backend "
                             f"that starts local processes), not {backend_name!r}")
        if backend_type.starts_local_processes:
            worker_niceness()  # MANYMODELS_WORKER_NICENESS, refused by name when wrong
        check_start_method(start_method)
        cpus = positive_int("cpus_per_task", cpus_per_task)
        if workers is not None:
            workers = positive_int("workers", workers)
        elif instance is not None:
            workers = instance.built_options.workers  # what the user built it with
        per_task, per_gpu = check_gpus_per_task(gpus_per_task)
        gpu_sets = _gpu_sets(per_task, gpus, backend_type, backend_name)
        gpu_fraction = _check_gpu_memory_limit(gpu_memory_limit, per_task, per_gpu,
                                               backend_type, backend_name)
        check_timeout(timeout, backend_type, backend_name)
        memory_bytes = None
        if memory_limit is not None:
            try:
                memory_bytes = parse_bytes(memory_limit)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"memory_limit: {exc}") from None
            if memory_bytes < 2**20:  # (0.5, read as a fraction, was 0 bytes: every task killed)
                raise ValueError(f"memory_limit={memory_limit!r} is {memory_bytes} bytes, less "
                                 "than any worker process needs: give bytes or text like "
                                 "'2GB' (it is no fraction of memory, as gpu_memory_limit is)")
            if not backend_type.enforces_memory_limit:
                raise ValueError(f"the {backend_name} backend cannot enforce memory_limit=; "
                                 "use backend='processes'")
        if shared is not None:
            check_shared(shared)
            clash = set(shared) & set(source.param_columns)
            if clash:
                raise ValueError(f"shared name {sorted(clash)[0]!r} is also a grid parameter")
            shared = dict(shared)
        setup_names = _check_setup(setup)
        clash = set(setup_names) & (set(shared or {}) | set(source.param_columns))
        if clash:
            raise ValueError(f"setup name {sorted(clash)[0]!r} is also a shared or grid name")
        _check_fit_takes(fit, source, {**dict.fromkeys(source.param_columns, "grid parameter"),
                                       **dict.fromkeys(shared or {}, "shared name"),
                                       **dict.fromkeys(setup_names, "setup name")})
        if backend_type.requires_pickling:
            _check_picklable(fit, shared, backend_name)
            if setup is not None:
                _check_picklable(setup, None, backend_name, what="setup")
        backend = BackendOptions(workers=workers, cpus_per_task=cpus, timeout=timeout,
                                 memory_limit=memory_bytes, gpu_sets=gpu_sets,
                                 start_method=start_method, gpus_per_task=per_task,
                                 gpu_memory_fraction=gpu_fraction)
        return cls(backend=backend, backend_name=backend_name,
                   retries=positive_int("retries", retries, minimum=0),
                   retry_on=_check_retry_on(retry_on),
                   max_failures=_check_max_failures(max_failures),
                   progress=check_switch("progress", progress),
                   reuse=check_switch("reuse", reuse),
                   shared=shared or None,
                   setup=setup)

    def sized_for(self, backend_type: type, tasks: int) -> BackendOptions:
        """The backend's options for a run of ``tasks`` tasks still to do: no
        more workers than tasks, or than GPU sets; None left for a backend
        that sizes itself (Ray) unless the user gave a count."""
        options = self.backend
        workers = options.workers
        if workers is None:
            workers = backend_type.default_workers(options.cpus_per_task)
        if workers is not None:
            if options.gpu_sets is not None:
                workers = min(workers, len(options.gpu_sets))
            if backend_type.max_workers is not None:
                workers = min(workers, backend_type.max_workers)
            workers = max(1, min(workers, tasks))
        return replace(options, workers=workers)


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
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


def check_start_method(start_method: Any) -> None:
    """Refuse a ``start_method=`` that is none of :data:`START_METHODS`."""
    if start_method not in START_METHODS:
        raise ValueError(f"unknown start_method {start_method!r}; choose one of "
                         f"{', '.join(START_METHODS)}")


def check_switch(name: str, value: Any) -> bool:
    """A switch: True or False (``"false"`` read as True was a full run)."""
    if not isinstance(value, (bool, int)) or value not in (0, 1):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def _check_retry_on(value: Any) -> tuple[type[BaseException], ...]:
    if value is None:
        return ()
    if isinstance(value, BaseException):
        raise TypeError(f"retry_on must hold exception classes, got the exception {value!r} "
                        f"(write retry_on={type(value).__name__})")
    try:
        types = (value,) if isinstance(value, type) else tuple(value)
    except TypeError:
        raise TypeError(f"retry_on must be an exception class or several, got {value!r}") \
            from None
    for item in types:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise TypeError(f"retry_on must hold exception classes, got {item!r}")
    return types


def _gpu_sets(per_task: float, gpus: Any, backend_type: type, backend: str
              ) -> tuple[tuple[str, ...], ...] | None:
    """Per worker slot, its GPUs (:func:`place_gpus`): disjoint sets of
    ``gpus_per_task``, or ``1/gpus_per_task`` slots on each GPU."""
    declared = declared_gpus(gpus)
    if per_task == 0:
        if declared:  # (gpus=0 or [] declares none: nothing to hand out, nothing lost)
            raise ValueError(f"gpus={gpus!r} declares the GPUs that gpus_per_task= hands "
                             "out, but gpus_per_task is 0: no task would get a GPU; give "
                             "gpus_per_task (e.g. gpus_per_task=1)")
        return None
    if not backend_type.isolates_gpus:
        raise ValueError(f"the {backend} backend cannot give each task its own GPUs; "
                         "use backend='processes'")
    if isinstance(declared, list):
        _check_declared_ids(declared, gpus)
        return place_gpus(per_task, declared)
    detected = detect_gpus(ask_nvidia_smi=declared is None)
    if declared is None and backend_type.schedules_gpus and not detected.ids:
        return None  # the engine's nodes' GPUs: it places each task (and refuses one none can run)
    if declared is None:
        return place_gpus(per_task, detected.ids, why_none=detected.found)
    if detected.limited_by_environment and declared > len(detected.ids):
        raise ValueError(
            f"gpus={declared} but {detected.found} lets this process use "
            f"{len(detected.ids)} GPU(s) ({', '.join(detected.ids)}): declare gpus="
            f"{len(detected.ids)} or fewer, or name the GPUs with gpus=[ids]")
    return place_gpus(per_task, visible_gpus(declared))


def _check_declared_ids(ids: list[str], given: Any) -> None:
    """Refuse a declared id CUDA cannot read (-1, "foo"): as a worker's
    ``CUDA_VISIBLE_DEVICES`` it would hide every GPU from the tasks, which
    would run on no GPU without a word."""
    readable = cuda_visible_ids(",".join(ids))
    if readable != ids:
        bad = ids[len(readable)]
        raise ValueError(f"gpus={given!r}: {bad!r} is no GPU id CUDA reads (a GPU number >= 0, "
                         "or a GPU-/MIG- UUID as nvidia-smi -L prints them)")


def _check_gpu_memory_limit(value: Any, per_task: float, per_gpu: int, backend_type: type,
                            backend: str) -> float | None:
    if value is None:
        return None
    if per_task == 0:
        raise ValueError("gpu_memory_limit= caps each task's share of its GPU; it needs "
                         "gpus_per_task (e.g. gpus_per_task=0.25, gpu_memory_limit=0.25)")
    if not getattr(backend_type, "caps_gpu_memory", False):
        raise ValueError(f"the {backend} backend cannot cap a task's GPU memory (it would "
                         "cap your own process); use backend='processes' or 'ray'")
    return check_memory_fraction(value, per_gpu)


def check_timeout(timeout: Any, backend_type: type, backend_name: str) -> None:
    """Refuse a ``timeout=`` that is not a positive number of seconds, or that
    the backend cannot enforce (it cannot stop a running task)."""
    if timeout is None:
        return
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real) or \
            not timeout > 0:  # NaN too
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if not backend_type.enforces_timeout:
        raise ValueError(f"the {backend_name} backend cannot stop a running task, so it cannot "
                         "enforce timeout=; use backend='processes'")


def check_shared(shared: Any) -> None:
    """Refuse a ``shared=`` that is not a dict of names (it is passed as keywords)."""
    if not isinstance(shared, Mapping) or not all(isinstance(k, str) for k in shared):
        raise TypeError("shared must be a dict of name -> object, passed to fit as keywords, "
                        f"got {type(shared).__name__}")


def check_fit_takes_shared(fit: Callable[..., Any], source: Any, shared: Any,
                           setup: Any = None) -> None:
    """:func:`_check_fit_takes` for a ``fit`` given ``shared`` (a dict, or
    None), ``setup``'s resources and ``source``'s grid parameters: what
    ``map_partitions`` checks before it decides to call its ``fn`` in this
    process, where ``train``'s checks do not run, and what ``map_groups``
    checks of its ``fn`` (and ``fallback``) before it wraps them in a
    function of any keywords, which ``train``'s check lets by."""
    if shared is not None:
        check_shared(shared)
    names = {**dict.fromkeys(getattr(source, "param_columns", ()), "grid parameter"),
             **dict.fromkeys(shared or {}, "shared name"),
             **dict.fromkeys(_check_setup(setup), "setup name")}
    _check_fit_takes(fit, source, names)


def _check_fit_takes(fit: Callable[..., Any], source: Any, names: dict[str, str]) -> None:
    """Refuse, before any work, keywords ``fit`` cannot take (``names``:
    each -> what gave it): one named like its first parameter, which gets a
    task's data (every task failed, "got multiple values"), or one it has no
    parameter for and no ``**kwargs`` (every task failed, "unexpected
    keyword"). A bare grid hands ``fit`` keywords only; a ``fit`` whose
    signature cannot be read is not checked."""
    import inspect

    from ..inputs.grids import GridSource

    try:
        parameters = list(inspect.signature(fit).parameters.values())
    except (TypeError, ValueError):
        return
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    if isinstance(source, GridSource) and "key" not in names and any(
            p.name == "key" and p.default is inspect.Parameter.empty
            and p.kind != inspect.Parameter.POSITIONAL_ONLY for p in parameters):
        raise TypeError("fit asks for key=, which a bare grid's tasks do not have (a task "
                        "is its settings, which fit gets as keywords): drop key, or give "
                        "it a default")
    if not isinstance(source, GridSource) and "key" in names and any(
            p.name == "key" and p.kind != inspect.Parameter.POSITIONAL_ONLY
            for p in parameters[1:]):
        raise ValueError(f"{names['key']} 'key' is also the keyword that fit's key= gets each "
                         "task's key by: fit would get one in place of the other; rename it")
    if not isinstance(source, GridSource) and parameters and parameters[0].kind in positional:
        first = parameters[0].name
        if first == "checkpoint":  # (the checkpoint check says what is wrong)
            return
        if first in names:
            raise ValueError(f"{names[first]} {first!r} is also the name of fit's first "
                             "parameter, which gets each task's data: rename one")
        parameters = parameters[1:]
    _check_fit_is_given(parameters, names, gets_key=not isinstance(source, GridSource))
    if any(p.kind == inspect.Parameter.VAR_KEYWORD for p in parameters):
        return
    takes = {p.name for p in parameters if p.kind != inspect.Parameter.VAR_POSITIONAL
             and p.kind != inspect.Parameter.POSITIONAL_ONLY}
    for name, what in names.items():
        if name not in takes:
            raise TypeError(f"fit has no parameter {name!r} for the {what} {name!r} (nor "
                            "**kwargs): every task would fail; add it to fit's parameters")


def _check_fit_is_given(parameters: list[Any], names: dict[str, str], gets_key: bool) -> None:
    """Refuse a parameter of ``fit`` (past the data's) that has no default and
    that no task would give it: every task failed with "missing a required
    argument", after the run had started them all. A task gives ``fit`` the
    ``names`` (grid settings, shared objects, setup resources), its
    ``checkpoint`` when ``fit`` names one, and its ``key`` unless the source
    is a bare grid."""
    import inspect

    given = set(names) | {"checkpoint"} | ({"key"} if gets_key else set())
    for parameter in parameters:
        if parameter.default is not inspect.Parameter.empty or parameter.kind in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        if parameter.kind == inspect.Parameter.POSITIONAL_ONLY or parameter.name not in given:
            raise TypeError(f"fit's parameter {parameter.name!r} has no default, and no task "
                            "gives it one (no grid parameter, shared object or setup resource "
                            "has its name): every task would fail; give it a default, or pass "
                            f"shared={{{parameter.name!r}: ...}}")


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


def _check_picklable(fit: Callable[..., Any], shared: dict | None, backend: str,
                     what: str = "fit") -> None:
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
