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


#: The backends whose runs' results become their engine's table.
_CLUSTER_BACKENDS = ("spark", "dask", "ray")


def results_as_engine_frame(results: Any, backend: str, session: Any = None) -> Any:
    """``run.results`` (already on the driver) as a table of the engine the run
    ran on: a Spark DataFrame in ``session`` (else the active session), a Dask
    DataFrame (on ``session``, a ``distributed.Client``, else the current
    client, when there is one), a Ray Dataset in the Ray instance this driver
    is connected to; on a local backend the engine is this machine, and the
    answer a pandas DataFrame (a copy of ``results``)."""
    if backend not in _CLUSTER_BACKENDS:
        return results.copy()
    if backend == "spark":
        return _spark_frame(results, session)
    if backend == "dask":
        return _dask_frame(results, session)
    import ray

    if not ray.is_initialized():
        raise RuntimeError("results_frame: this driver is connected to no Ray instance (the "
                           "run's own local Ray stopped at its end): call ray.init(...) "
                           "first, or use run.results")
    import ray.data

    return ray.data.from_pandas(results)


def _spark_frame(results: Any, session: Any) -> Any:
    """The results as a Spark DataFrame: through Arrow, a column with no value
    at all (``error`` in a run without failures) typed as a string."""
    import pyarrow as pa

    if session is None:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
    if session is None:
        raise RuntimeError("results_frame: no Spark session is active (the run's own "
                           "local session stopped at its end): pass session=spark, or "
                           "use run.results")
    table = pa.Table.from_pandas(results, preserve_index=False).replace_schema_metadata(None)
    for position, column in enumerate(table.schema):
        if pa.types.is_null(column.type):
            table = table.set_column(position, column.name,
                                     table.column(position).cast(pa.string()))
    import pyspark

    if int(pyspark.__version__.split(".")[0]) >= 4:  # Arrow tables are taken as they are
        return session.createDataFrame(table)
    from pyspark.sql.pandas.types import from_arrow_schema

    return session.createDataFrame(table.to_pandas(), schema=from_arrow_schema(table.schema))


def _dask_frame(results: Any, client: Any) -> Any:
    """The results as a Dask DataFrame: its partitions scattered to the
    cluster's workers when there is a client (so that a job on the frame does
    not ship them from here again), else a frame of the local scheduler."""
    import dask.dataframe as dd

    if client is None:
        try:
            from distributed import default_client

            client = default_client()
        except (ImportError, ValueError):
            client = None
    partitions = max(1, min(len(results), 8 if client is None else
                            len(client.scheduler_info().get("workers", {})) or 1))
    frame = dd.from_pandas(results, npartitions=partitions, sort=False)
    return frame if client is None else client.persist(frame)
