"""manymodels: train many models at once, one per group, file or setting.

>>> import manymodels as mm
>>> run = mm.train(fit, mm.groups("sales.parquet", by=["store", "item"]))
>>> run.results, run.failed, run.models[("s1", "i7")]
"""

from __future__ import annotations

from ._version import __version__ as __version__
from .api import train
from .backends import Backend, RayBackend, WorkerStartupError, register_backend
from .results import Run, Summary
from .scheduling import RunInterrupted, TooManyFailures
from .sources import grid, groups, items
from .store import Store, StoreError, StoreIntegrityError
from .transforms import map_groups, map_partitions

__all__ = [
    "Backend",
    "RayBackend",
    "Run",
    "RunInterrupted",
    "Store",
    "StoreError",
    "StoreIntegrityError",
    "Summary",
    "TooManyFailures",
    "WorkerStartupError",
    "grid",
    "groups",
    "items",
    "map_groups",
    "map_partitions",
    "register_backend",
    "train",
]
