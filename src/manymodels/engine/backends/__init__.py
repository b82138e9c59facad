"""Execution engines behind one small interface (:mod:`.base`), one file each."""

from __future__ import annotations

from .base import Backend, WorkerStartupError
from .processes import ProcessesBackend
from .ray import RayBackend
from .serial import SerialBackend
from .threads import ThreadsBackend

BACKENDS: dict[str, type[Backend]] = {
    "processes": ProcessesBackend,
    "threads": ThreadsBackend,
    "serial": SerialBackend,
    "ray": RayBackend,
}

#: Backends whose engines load only when asked for: importing manymodels must
#: not import pyspark or dask. name -> (module, class)
_LAZY = {"spark": (".spark", "SparkBackend"), "dask": (".dask", "DaskBackend")}
_BUILT_IN = frozenset(BACKENDS) | frozenset(_LAZY)


def __getattr__(name: str) -> type[Backend]:
    for module, class_name in _LAZY.values():
        if name == class_name:
            import importlib

            return getattr(importlib.import_module(module, __name__), class_name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def register_backend(name: str, backend: type[Backend], *, replace: bool = False) -> None:
    """Make ``mm.train(..., backend=name)`` run on ``backend``, a :class:`Backend`
    subclass (its contract is :class:`Backend`'s docstring).

    A built-in name (``"processes"``, ``"threads"``, ``"serial"``, ``"ray"``,
    ``"spark"``, ``"dask"``) is refused unless ``replace=True``: replacing
    one changes every run that names it, the CLI's too, unsaid. A name
    registered before is replaced (a notebook's cell run again)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a backend's name must be a non-empty string, got {name!r}")
    if not (isinstance(backend, type) and issubclass(backend, Backend)):
        raise TypeError(f"backend must be a subclass of manymodels.Backend, got {backend!r}")
    if name in _BUILT_IN and not replace:
        raise ValueError(f"backend {name!r} is a built-in one; register {backend.__name__} "
                         f"under another name, or pass replace=True to run every "
                         f"backend={name!r} on it")
    BACKENDS[name] = backend


def backend_class(name: str) -> type[Backend]:
    """The backend class registered under ``name``."""
    if isinstance(name, str) and name in _LAZY and name not in BACKENDS:
        BACKENDS[name] = __getattr__(_LAZY[name][1])
    if not isinstance(name, str) or name not in BACKENDS:
        names = list(BACKENDS) + [lazy for lazy in _LAZY if lazy not in BACKENDS]
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(names)}")
    return BACKENDS[name]


__all__ = ["BACKENDS", "Backend", "DaskBackend", "RayBackend", "SparkBackend",
           "WorkerStartupError", "backend_class", "register_backend"]
