"""manymodels: train many models at once, one per group, file or setting.

>>> import manymodels as mm
>>> run = mm.train(fit, mm.groups("sales.parquet", by=["store", "item"]))
>>> run.results, run.failed, run.models[("s1", "i7")]

The package's folders are its data flow, bottom to top; each imports only the
ones below it (``lint-imports`` checks it, see ``pyproject.toml``)::

    machine ──► inputs ──► identity ──► planning ──► engine ──► evaluation ──► store
    (cores,     (sources,   (code, data,  (tasks: key,  (scheduler,  (scores inside  (SQLite
     memory,     tables,     params        data ref,     data plane,  the task,       index,
     processes)  keys)       hashes)       cost)         backends)    selection)      blobs,
                                                                                      reuse)
                                                                                        │
      cli ◄── sklearn, transforms, serve ◄── api ◄── run ◄── models, observe ◄──────────┘
                                          (train)   (train's    (mm.linear; progress,
                                                     wiring,     report, dashboard,
                                                     Run, Store) MLflow)

* ``machine``: what this machine offers (usable cores, memory, processes).
* ``inputs``: task sources, the tables they read, and group keys.
* ``identity``: the hashes that make a task the same task again.
* ``planning``: a source becomes a plan of tasks, as columns.
* ``engine``: the scheduler, the data plane, execution and the backends.
* ``evaluation``: holdout, k-fold and backtests, metrics, selection.
* ``store``: the crash-safe registry of runs and models, and reuse.
* ``models``: model families fitted by manymodels itself (``mm.linear``).
* ``observe``: progress, callbacks, MLflow, the report and the dashboard.
* ``run``: what ``train`` wires, the ``Run``, prediction, ``mm.Store``.
* ``api``, ``transforms``, ``sklearn``, ``serve``, ``cli``: the faces users
  call (``transforms`` and ``sklearn`` built on ``api``'s ``train``).

The names below load on first use (PEP 562), so that a worker importing one
module of the package (a Ray worker, a spawned process) does not import all
of it, pandas and the store included.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__

#: public name -> the module that defines it
_EXPORTS = {
    "train": ".api",
    "holdout": ".evaluation.splitters",
    "kfold": ".evaluation.splitters",
    "backtest": ".evaluation.splitters",
    "halving": ".evaluation.halving",
    "Checkpoint": ".engine.checkpoints",
    "Backend": ".engine.backends",
    "DaskBackend": ".engine.backends",
    "RayBackend": ".engine.backends",
    "SparkBackend": ".engine.backends",
    "Callback": ".observe.callbacks",
    "MLflow": ".observe.tracking",
    "WorkerStartupError": ".engine.backends",
    "register_backend": ".engine.backends",
    "Run": ".run.results",
    "Summary": ".run.results",
    "RunInterrupted": ".engine.scheduling",
    "TooManyFailures": ".engine.scheduling",
    "glance": ".evaluation.fitstats",
    "grid": ".inputs.grids",
    "groups": ".inputs.sources",
    "items": ".inputs.itemsource",
    "LinearResult": ".models.linear",
    "linear": ".models.linear",
    "Store": ".run.store",
    "StoreError": ".store",
    "StoreIntegrityError": ".store",
    "map_groups": ".transforms",
    "map_partitions": ".transforms",
    "serve_app": ".serve.app",
}

__all__ = [
    "Backend",
    "Callback",
    "Checkpoint",
    "DaskBackend",
    "LinearResult",
    "MLflow",
    "RayBackend",
    "Run",
    "RunInterrupted",
    "Store",
    "StoreError",
    "StoreIntegrityError",
    "SparkBackend",
    "Summary",
    "TooManyFailures",
    "WorkerStartupError",
    "backtest",
    "glance",
    "grid",
    "groups",
    "halving",
    "holdout",
    "items",
    "kfold",
    "linear",
    "map_groups",
    "map_partitions",
    "register_backend",
    "serve_app",
    "train",
]

if TYPE_CHECKING:  # for type checkers and editors: the names as they are
    from .api import train
    from .engine.backends import (
        Backend,
        DaskBackend,
        RayBackend,
        SparkBackend,
        WorkerStartupError,
        register_backend,
    )
    from .engine.checkpoints import Checkpoint
    from .engine.scheduling import RunInterrupted, TooManyFailures
    from .evaluation.fitstats import glance
    from .evaluation.halving import halving
    from .evaluation.splitters import backtest, holdout, kfold
    from .inputs.grids import grid
    from .inputs.itemsource import items
    from .inputs.sources import groups
    from .models.linear import LinearResult, linear
    from .observe.callbacks import Callback
    from .observe.tracking import MLflow
    from .run.results import Run, Summary
    from .run.store import Store
    from .serve.app import serve_app
    from .store import StoreError, StoreIntegrityError
    from .transforms import map_groups, map_partitions


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'manymodels' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
