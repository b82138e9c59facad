"""Tables that live in an engine: a Spark or a Dask DataFrame given to ``mm.groups``.

Such a table is never read here. The source keeps the engine's DataFrame
(its columns checked at once, before any work), and the planner has the
engine group it (:mod:`manymodels.planning.staging`): one shuffle by key on
the engine's workers, each partition sorted and written once, and only one
small row per group back to the driver.

Recognised by the class's module, so that neither PySpark nor Dask is
imported to ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: The engines whose DataFrames ``mm.groups`` takes, by the top of their module.
_ENGINE_MODULES = {"pyspark": "spark", "dask": "dask"}


def engine_of(table: Any) -> str | None:
    """``"spark"`` for a Spark DataFrame, ``"dask"`` for a Dask DataFrame, else None."""
    kind = type(table)
    engine = _ENGINE_MODULES.get(kind.__module__.split(".")[0])
    if engine is None or kind.__name__ != "DataFrame":
        return None
    return engine


@dataclass
class EngineFrame:
    """An engine's DataFrame with the columns ``fit`` will see, and where the
    engine's workers write the grouped rows (``staging``: a directory every
    node sees; None: a temporary directory on this machine, enough for a
    local engine)."""

    frame: Any
    engine: str
    staging: str | None = None

    @property
    def columns(self) -> list[str]:
        return [str(name) for name in self.frame.columns]

    @classmethod
    def of(cls, table: Any, engine: str, wanted: Sequence[str] | None,
           needed: Sequence[str], staging: str | None) -> EngineFrame:
        """Check that ``needed`` and ``wanted`` columns are in ``table`` (named
        in the error otherwise) and keep ``wanted`` only (all when None)."""
        present = [str(name) for name in table.columns]
        for name in list(needed) + list(wanted or []):
            if name not in present:
                raise ValueError(f"column {name!r} is not in the {engine.title()} DataFrame; "
                                 f"its columns are {present}")
        if wanted is not None:
            keep = [name for name in present if name in set(wanted)]
            table = table.select(*keep) if engine == "spark" else table[keep]
        if staging is not None and not isinstance(staging, str):
            staging = str(staging)
        return cls(table, engine, staging)
