"""``mm.map_groups(fn, spark_df, by=...)``: a transform of an engine's
DataFrame (or a Ray Dataset) that answers with the engine's own table.

The engine groups the rows (:mod:`manymodels.planning.staging`: one shuffle
by key, each partition sorted and written once by the engine's workers), the
backend runs ``fn`` on each group with the scheduler's supervision (crash
attribution, retries, ``timeout``, the error budget), and the groups'
outputs, in key order and with their key columns, become a Spark DataFrame
(``createDataFrame``) or a Dask DataFrame (``from_pandas``) of the session
or client the input came from, or a Ray Dataset (``ray.data.from_pandas``),
so that a job writes them on from the engine's executors. The outputs
themselves still pass through the driver: they must fit in its memory (the
input rows never do).

An engine's DataFrame has no row order to put a transform's rows back in,
nor row labels: the outputs come in key order, under a fresh index.
"""

from __future__ import annotations

from typing import Any

from ..inputs.engineframes import TABLE_NAMES, EngineFrame, engine_of
from ..inputs.grids import ProductSource
from ..inputs.sources import GroupSource, groups

#: The keywords of ``mm.groups`` that ``map_groups(fn, engine_df, ...)`` takes.
GROUP_OPTIONS = ("by", "order_by", "columns", "format", "staging", "cost")


def engine_source(source: Any, options: dict[str, Any]) -> tuple[Any, EngineFrame | None]:
    """``source`` as a source of groups, and the engine's frame it groups
    (None for a table on the driver). An engine's DataFrame given as it is
    takes ``mm.groups``' keywords from ``options`` (``by=`` at least)."""
    if engine_of(source) is not None:
        asked = {name: options.pop(name) for name in GROUP_OPTIONS if name in options}
        if "by" not in asked:
            raise TypeError(f"map_groups(fn, {engine_of(source)}_df) needs by= (the key "
                            "columns), as mm.groups does")
        source = groups(source, **asked)
    base = source.base if isinstance(source, ProductSource) else source
    in_engine = base.engine_frame if isinstance(base, GroupSource) else None
    return source, in_engine


def as_engine_frame(result: Any, engine_frame: EngineFrame) -> Any:
    """The outputs gathered on the driver (pandas, a Series, Arrow or polars)
    as a DataFrame of ``engine_frame``'s engine."""
    import pandas as pd

    if hasattr(result, "to_pandas") and not isinstance(result, (pd.DataFrame, pd.Series)):
        result = result.to_pandas()  # Arrow or polars outputs
    if isinstance(result, pd.Series):
        result = result.to_frame(name=result.name if result.name is not None else "value")
    if not isinstance(result.index, pd.RangeIndex):  # labels fn gave: kept as columns
        result = result.reset_index()
    result = result.reset_index(drop=True)
    result.columns = [str(name) for name in result.columns]
    if not len(result.columns):
        raise ValueError("map_groups: fn returned no columns for any group, and a "
                         f"{TABLE_NAMES[engine_frame.engine]} needs some")
    if engine_frame.engine == "spark":
        return engine_frame.frame.sparkSession.createDataFrame(result)
    if engine_frame.engine == "ray":
        import ray.data

        return ray.data.from_pandas(result)
    import dask.dataframe as dd

    partitions = max(1, min(engine_frame.frame.npartitions, len(result)))
    return dd.from_pandas(result, npartitions=partitions, sort=False)
