"""manymodels: train many models at once, one per group, file or setting.

>>> import manymodels as mm
>>> run = mm.train(fit, mm.groups("sales.parquet", by=["store", "item"]))
>>> run.results, run.failed, run.models[("s1", "i7")]

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
    "holdout": ".evaluation",
    "kfold": ".evaluation",
    "backtest": ".evaluation",
    "halving": ".selection",
    "Backend": ".backends",
    "DaskBackend": ".backends",
    "RayBackend": ".backends",
    "SparkBackend": ".backends",
    "Callback": ".callbacks",
    "MLflow": ".tracking",
    "WorkerStartupError": ".backends",
    "register_backend": ".backends",
    "Run": ".results",
    "Summary": ".results",
    "RunInterrupted": ".scheduling",
    "TooManyFailures": ".scheduling",
    "glance": ".fitstats",
    "grid": ".grids",
    "groups": ".sources",
    "items": ".sources",
    "LinearResult": ".linmodels",
    "linear": ".linmodels",
    "Store": ".store",
    "StoreError": ".store",
    "StoreIntegrityError": ".store",
    "map_groups": ".transforms",
    "map_partitions": ".transforms",
}

__all__ = [
    "Backend",
    "Callback",
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
    "train",
]

if TYPE_CHECKING:  # for type checkers and editors: the names as they are
    from .api import train
    from .backends import (
        Backend,
        DaskBackend,
        RayBackend,
        SparkBackend,
        WorkerStartupError,
        register_backend,
    )
    from .callbacks import Callback
    from .evaluation import backtest, holdout, kfold
    from .fitstats import glance
    from .grids import grid
    from .linmodels import LinearResult, linear
    from .results import Run, Summary
    from .scheduling import RunInterrupted, TooManyFailures
    from .selection import halving
    from .sources import groups, items
    from .store import Store, StoreError, StoreIntegrityError
    from .tracking import MLflow
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
