"""``mm.map_groups(fn, spark_df, by=...)``: a transform of an engine's
DataFrame (or a Ray Dataset) that answers with the engine's own table, its
rows never on the driver.

The path the rows take:

1. The engine groups the rows (:mod:`manymodels.planning.staging`: one
   shuffle by key, each partition sorted and written once by the engine's
   workers).
2. The backend runs ``fn`` on each group with the scheduler's supervision
   (crash attribution, retries, ``timeout``, the error budget); the worker
   that ran a group writes its output, the key columns in front, as it
   sends the group's part of the batch: appended to the Arrow stream file
   it keeps for that schema under the run's output directory
   (``manymodels-outputs-*`` beside the staged rows: under ``staging=``
   where it is given, a directory every node sees), and sends the driver
   only the file's name, where the group's rows lie in it and a digest of
   their schema (:mod:`manymodels.run.outputfiles`).
3. The driver unifies the few distinct schemas (read from the files' headers:
   an int column in one group and a float one in another is a float column,
   a column some groups lack is null there, as pandas' ``concat`` makes them)
   and hands the engine the list of files, in key order, cut into about as
   many partitions as the engine has cores (more where one would hold over
   :data:`ROWS_PER_PARTITION` rows): a Spark DataFrame whose
   ``mapInArrow`` reads them on the executors, a Dask DataFrame of
   ``from_map`` partitions read on the workers (its index the rows'
   positions, its divisions known), or a Ray Dataset whose blocks Ray tasks
   read into the object store (``from_arrow_refs``).

So the result is lazy on Spark and Dask (each action reads the files again)
and the files stay until the driver process exits; a Ray Dataset's blocks
are read once, and the files removed then. A run that fails (an error with
``errors="raise"``, the error budget, Ctrl-C) removes its output directory
at once: nothing half-written is left. The rows of an attempt that crashed
or timed out are never read (only the rows of the outcomes the driver
received are), and go with the directory.

An engine's DataFrame has no row order to put a transform's rows back in,
nor row labels: ``fn`` gets a group's rows under their positions 0, 1, ...,
and the outputs come in key order (a group's rows in the order ``fn`` gave
them) under a fresh index. An output's index is judged as the pandas path
judges it (:func:`manymodels.inputs.grouplabels.indexes_as_columns`): its
levels are columns after the keys (``groupby("day").sum()``,
``describe()``, an unnamed ``index=[...]`` of values) unless every output
whose index has the same levels holds positions of its own group's rows
(a filter's, a sort's), which are dropped. The workers cannot judge that
alone (one group's positions are another's values), so each writes its
index as columns marked with what it held, and the driver drops the
columns of an index that held positions in every output
(:func:`manymodels.run.outputtables.label_columns`): every backend gives
one table. A Series ``fn`` returns is one row (its labels as columns)
where its labels are column-like text (``df[["x", "y"]].mean()``), a
column of values under 0, 1, ..., and any other Series (``value_counts()``,
a filter's) a frame of one column whose index is judged as a DataFrame's.
"""

from __future__ import annotations

import atexit
import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from ..inputs.engineframes import TABLE_NAMES, EngineFrame, engine_of
from ..inputs.grids import ProductSource
from ..inputs.objectstores import is_remote, path_in
from ..inputs.sources import GroupSource, groups
from ..planning.plan import asks_for_key
from ..planning.staging import new_directory, remove_directory
from .outputfiles import WriteOutputs, WrittenOutput
from .outputreads import (
    NULLABLE_TYPES,
    open_output,
    pandas_frame_of,
    read_dask_chunk,
    read_files,
    read_spark_chunks,
)
from .outputtables import ADDED_KEY, KEY_MARK, NULLABLE, label_columns, nullable_columns

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


def refuse_named_key(source: Any, shared: dict | None, setup: Any) -> None:
    """Refuse a grid setting, shared object or setup resource named ``key``:
    the worker that writes a group's output is handed the group's key as
    ``key=``."""
    params = list(getattr(source, "param_columns", []) or [])
    resources = setup if isinstance(setup, Mapping) else {}
    named = ("grid setting" if "key" in params else "shared object" if "key" in (
        shared or {}) else "setup resource" if "key" in resources else None)
    if named is not None:
        raise ValueError("map_groups of an engine's DataFrame passes each group's key "
                         "to the worker that writes its output as key=: rename the "
                         f"{named} 'key'")


class EngineOutputs:
    """The output directory of one ``map_groups`` run on an engine's frame:
    ``fn`` wrapped to write there (:attr:`fn`), the engine's table of what
    was written (:meth:`frame`), and the directory removed where the run
    fails (a context manager: an exception inside removes it)."""

    def __init__(self, engine_frame: EngineFrame, source: Any, fn: Any,
                 shared: dict | None, setup: Any = None) -> None:
        refuse_named_key(source, shared, setup)
        params = list(getattr(source, "param_columns", []) or [])
        self.engine_frame = engine_frame
        self.directory = new_directory(engine_frame.staging, "manymodels-outputs-")
        if not is_remote(self.directory):
            self.directory = os.path.abspath(self.directory)
        self.fn = WriteOutputs(fn, self.directory, [str(c) for c in source.key_columns],
                               params, asks_for_key(fn))

    def __enter__(self) -> EngineOutputs:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is not None:
            self.discard()

    def discard(self) -> None:
        remove_directory(self.directory)

    def frame(self, outputs: list[WrittenOutput]) -> Any:
        """The outputs (in key order) as the engine's table, read by its workers."""
        try:
            schema = _unified_schema(self.directory, outputs, self.engine_frame.engine,
                                     _key_types(self.engine_frame, self.fn.key_columns))
            files = [(out.ref, out.rows) for out in outputs if out.name and out.rows]
            engine = self.engine_frame.engine
            if engine == "spark":
                result = _spark_frame_of(self.engine_frame.frame, self.directory, files, schema)
            elif engine == "dask":
                result = _dask_frame_of(self.engine_frame.frame, self.directory, files, schema,
                                        self.fn.key_columns)
            else:
                result = _ray_dataset_of(self.directory, files, schema, _ray_key_categories(
                    self.engine_frame.frame, _dictionary_keys(schema, self.fn.key_columns)))
        except BaseException:
            self.discard()
            raise
        if engine == "ray":  # its blocks are in Ray's object store now
            self.discard()
        else:  # read again by each action on the frame
            atexit.register(remove_directory, self.directory)
        return result


def _key_types(engine_frame: EngineFrame, names: list[str]) -> dict[str, tuple[pa.DataType, bool]]:
    """The input's Arrow type of each key column whose values a worker adds
    as Python values (an integer, a boolean, a category, a float32, a
    datetime of seconds: an ``int64``, a ``bool``, a text, a ``double``, a
    ``timestamp[us]`` there, and a missing key a null of no type), and
    whether the Dask frame holds it as pandas' nullable type (``Int64``,
    ``boolean``). A Dask column of Python objects is left out: its schema
    (a sample's) does not know its values' type. From the engine's schema:
    no job runs."""
    schema = engine_frame.schema
    dask = engine_frame.engine == "dask"
    types = {}
    for name in names:
        if name not in schema.names:  # a grid's setting
            continue
        kind = schema.field(name).type
        dtype = engine_frame.frame._meta[name].dtype if dask else None
        if pa.types.is_dictionary(kind):  # categories a chunk: more than an int8 holds
            kind = pa.dictionary(pa.int32(), kind.value_type, kind.ordered)
        elif pa.types.is_nested(kind) or pa.types.is_null(kind) or (
                isinstance(dtype, np.dtype) and dtype.kind == "O"):
            continue
        extension = dask and not isinstance(dtype, np.dtype) and (
            pa.types.is_integer(kind) or pa.types.is_boolean(kind))
        types[name] = (kind, extension)
    return types


def _typed_keys(schema: pa.Schema, schemas: list[pa.Schema],
                key_types: dict[str, tuple[pa.DataType, bool]]) -> tuple[pa.Schema, set[str]]:
    """``schema`` with its key columns in the input's types (``key_types``),
    and the integer and boolean keys to give pandas' nullable type: those
    the input holds so, or whose key is missing in some group (a column of
    nulls there), which a Dask partition would make floats and another ints."""
    nullable = set()
    for name, (kind, extension) in key_types.items():
        position = schema.get_field_index(name)
        if position < 0 or not all(_input_key(one, name, kind) for one in schemas):
            continue  # fn's own values there (a relabelled key): of their own type
        if schema.field(name).type != kind:
            schema = schema.set(position, pa.field(name, kind))
        missing = any(name in one.names and pa.types.is_null(one.field(name).type)
                      for one in schemas)
        if (pa.types.is_integer(kind) or pa.types.is_boolean(kind)) and (extension or missing):
            nullable.add(name)
    return schema, nullable


def _input_key(schema: pa.Schema, name: str, kind: pa.DataType) -> bool:
    """Whether ``schema``'s key column ``name``, if it has one, holds the
    input's keys: a worker added it (:data:`ADDED_KEY`), or ``fn`` returned
    the input's column as it came (a filter's rows: of the input's type)."""
    if name not in schema.names:
        return True
    field = schema.field(name)
    if field.metadata and field.metadata.get(KEY_MARK) == ADDED_KEY[KEY_MARK]:
        return True
    if pa.types.is_dictionary(kind) and pa.types.is_dictionary(field.type):
        return field.type.value_type == kind.value_type
    return field.type == kind


def _unified_schema(directory: str, outputs: list[WrittenOutput], engine: str,
                    key_types: dict[str, tuple[pa.DataType, bool]] | None = None) -> pa.Schema:
    """One schema for every group's output: each distinct schema read once,
    from the header of the first file written with it, unified as pandas'
    ``concat`` would (an integer column that some groups lack: floats),
    without the columns of an index that held row labels in every output
    (:func:`label_columns`: judged once, as the pandas path judges it), its
    key columns of the input's types (:func:`_typed_keys`)."""
    schemas: dict[str, pa.Schema] = {}
    for out in outputs:
        if out.name is not None and out.schema_digest not in schemas:
            with open_output(path_in(directory, out.name)) as source:
                schemas[out.schema_digest] = pa.ipc.open_stream(source).schema
    if not schemas:
        raise ValueError("map_groups: fn returned None for every group, and a "
                         f"{TABLE_NAMES[engine]} needs columns")
    key_types = key_types or {}
    dropped = label_columns(list(schemas.values()), list(key_types))
    if dropped:
        schemas = {digest: pa.schema([field for field in one if field.name not in dropped])
                   for digest, one in schemas.items()}
    try:
        schema = pa.unify_schemas(list(schemas.values()), promote_options="permissive")
    except (pa.ArrowTypeError, pa.ArrowInvalid) as exc:
        raise TypeError(f"map_groups: the groups' outputs do not agree on a column's type, "
                        f"so they make no one table: {exc}") from None
    if not len(schema):
        raise ValueError("map_groups: fn returned no columns for any group, and a "
                         f"{TABLE_NAMES[engine]} needs some")
    schema, nullable = _typed_keys(schema, list(schemas.values()), key_types)
    # an integer column some groups lack is missing values there: floats, as
    # pandas' concat makes it (and every partition of a Dask result the same)
    nullable |= {name for one in schemas.values() for name in nullable_columns(one)}
    for position, field in enumerate(schema):
        if pa.types.is_integer(field.type) and field.name not in key_types and any(
                field.name not in one.names for one in schemas.values()):
            schema = schema.set(position, pa.field(field.name, pa.float64()))
        else:  # pandas' nullable type in every partition of a Dask result alike (an
            # Int64 column that is floats in another group: Float64, as concat makes it)
            mark = NULLABLE if engine == "dask" and field.name in nullable and (
                str(field.type) in NULLABLE_TYPES) else None
            schema = schema.set(position, field.with_metadata(mark))
    return schema


#: Rows of outputs a partition of the result holds at most, where the engine's
#: cores would make fewer, larger partitions.
ROWS_PER_PARTITION = 1_000_000


def _chunks(files: list[tuple[str, int]], cores: int) -> list[tuple[list[str], int]]:
    """``files`` (name, rows), in order, cut into runs of about equal rows, one
    a core or more (:data:`ROWS_PER_PARTITION`): each run's names and the
    position of its first row."""
    if not files:
        return []
    rows = np.array([r for _, r in files], dtype=np.int64)
    count = max(1, cores, -(-int(rows.sum()) // ROWS_PER_PARTITION))
    before = np.concatenate([[0], np.cumsum(rows)[:-1]])
    which = np.minimum(before * count // max(1, int(rows.sum())), count - 1)
    chunks: list[tuple[list[str], int]] = []
    for position, (name, _) in enumerate(files):
        if position == 0 or which[position] != which[position - 1]:
            chunks.append(([], int(before[position])))
        chunks[-1][0].append(name)
    return chunks


def _spark_schema(schema: pa.Schema) -> Any:
    """The Spark schema of the outputs: Arrow types Spark lacks as the nearest
    it has (no type: a string; unsigned: a long; a dictionary: its values)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    fields = []
    for field in schema:
        kind = field.type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        if pa.types.is_null(kind):
            kind = pa.string()
        elif pa.types.is_unsigned_integer(kind):
            kind = pa.int64()
        fields.append(pa.field(field.name, kind))
    try:
        return from_arrow_schema(pa.schema(fields))
    except (TypeError, NotImplementedError) as exc:
        raise TypeError(f"map_groups: an output column has no Spark type: {exc}") from None


def _spark_frame_of(frame: Any, directory: str, files: list, schema: pa.Schema) -> Any:
    """A Spark DataFrame whose executors read the files (``mapInArrow`` over
    one row of file names a partition, in key order)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    session = frame.sparkSession
    cores = 2
    try:
        cores = session.sparkContext.defaultParallelism
    except Exception:  # a Spark Connect session has no context to ask
        pass
    spark_schema = _spark_schema(schema)
    names = session.createDataFrame([(names,) for names, _ in _chunks(files, cores)],
                                    "files array<string>")
    try:  # Spark's timestamps are UTC instants (as fit saw them: engineframes.py)
        arrow_schema = to_arrow_schema(spark_schema, timezone="UTC")
    except TypeError:  # pyspark 3.5 has no timezone=: its timestamps are UTC already
        arrow_schema = to_arrow_schema(spark_schema)
    read = functools.partial(read_spark_chunks, directory=directory, schema=arrow_schema)
    return names.mapInArrow(read, spark_schema)


def _dask_frame_of(frame: Any, directory: str, files: list, schema: pa.Schema,
                   keys: list[str] = ()) -> Any:
    """A Dask DataFrame of one partition per run of files, read on the workers."""
    import dask.dataframe as dd

    chunks = _chunks(files, max(1, frame.npartitions)) or [([], 0)]
    total = sum(rows for _, rows in files)
    divisions = None
    if total:
        divisions = tuple(start for _, start in chunks) + (total - 1,)
    categories = _key_categories(frame, _dictionary_keys(schema, keys))
    meta = pandas_frame_of(schema.empty_table(), schema, categories)
    return dd.from_map(read_dask_chunk, chunks, meta=meta,
                       divisions=divisions, label="manymodels-outputs",
                       directory=directory, schema=schema, categories=categories)


def _dictionary_keys(schema: pa.Schema, keys: list[str]) -> list[str]:
    """The key columns the unified ``schema`` holds as dictionaries: the
    input's categorical keys (a key ``fn`` returned of its own, relabelled,
    is not the input's, and is left as it is)."""
    return [name for name in keys
            if name in schema.names and pa.types.is_dictionary(schema.field(name).type)]


def _ray_key_categories(dataset: Any, keys: list[str]) -> dict[str, Any]:
    """The categorical dtype of each key column of a Ray Dataset of pandas
    blocks: every block of the result takes its categories (a block of
    each group's own ones made Ray's ``to_pandas`` give the key as text)."""
    import pandas as pd

    base = getattr(dataset.schema(), "base_schema", None)
    dtypes = dict(zip(base.names, base.types)) if hasattr(base, "types") else {}
    return {name: dtypes[name] for name in keys
            if isinstance(dtypes.get(name), pd.CategoricalDtype)}


def _key_categories(frame: Any, keys: list[str]) -> dict[str, Any]:
    """The categorical dtype of each key column the Dask frame knows the
    categories of: every partition of the result takes it (each would hold
    only its own groups' keys as categories otherwise, and Dask cannot
    concatenate ordered categoricals of different categories)."""
    import pandas as pd
    from dask.dataframe.utils import UNKNOWN_CATEGORIES

    categories = {}
    for name in keys:
        kind = frame._meta[name].dtype if name in frame._meta.columns else None
        if isinstance(kind, pd.CategoricalDtype) and UNKNOWN_CATEGORIES not in kind.categories:
            categories[name] = kind
    return categories


def _ray_dataset_of(directory: str, files: list, schema: pa.Schema,
                    categories: dict[str, Any] | None = None) -> Any:
    """A Ray Dataset whose blocks, in key order, Ray tasks read into the object
    store, each categorical key (``categories``) of the input's categories."""
    import ray
    import ray.data

    if not files:
        return ray.data.from_arrow(schema.empty_table())
    read = ray.remote(read_files)
    cores = max(1, int(ray.cluster_resources().get("CPU", 1)))
    blocks = [read.remote(directory, names, schema, categories)
              for names, _ in _chunks(files, cores)]
    ray.wait(blocks, num_returns=len(blocks), fetch_local=False)
    return ray.data.from_arrow_refs(blocks)


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

    return ray.data.from_arrow(_arrow_results(results))


def _arrow_results(results: Any) -> Any:
    """The results as an Arrow table, as a cluster engine's table holds
    them: a column with no value at all (``error`` in a run without
    failures) typed as a string, and a column of values Arrow has no type
    for (a grid's estimators, ``Ridge()``) as their text, as the results
    print them: Arrow refused the whole table for it. Ray Data given the
    pandas frame keeps its blocks in pandas, and has no type for a
    timezone-aware key there (its schema says None, an error logged)."""
    import pyarrow as pa

    return pa.table({str(name): _arrow_column(results[name]) for name in results.columns})


def _arrow_column(column: Any) -> Any:
    """One column of the results as :func:`_arrow_results` holds it."""
    import pyarrow as pa

    try:
        array = pa.Array.from_pandas(column)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pa.array([None if value is None else str(value) for value in column],
                        type=pa.string())
    return array.cast(pa.string()) if pa.types.is_null(array.type) else array


def _spark_frame(results: Any, session: Any) -> Any:
    """The results as a Spark DataFrame: through Arrow (:func:`_arrow_results`)."""
    if session is None:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
    if session is None:
        raise RuntimeError("results_frame: no Spark session is active (the run's own "
                           "local session stopped at its end): pass session=spark, or "
                           "use run.results")
    table = _arrow_results(results)
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
