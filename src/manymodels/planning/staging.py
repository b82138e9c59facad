"""Groups made by an engine: a Spark or Dask DataFrame, or a Ray Dataset, given
to ``mm.groups``.

The driver never holds the rows. The engine shuffles them by key once
(Spark's ``repartition`` by the key columns, Dask's ``shuffle``, Ray Data's
hash shuffle or sort, as its ``groupby().map_groups`` does), and each
partition, on the engine's worker that holds it, is sorted by key (and
``order_by``) as the pandas path sorts a table (:func:`stage_rows`), written
once as an Arrow IPC file under the staging directory, and summed up as one
small row per group: its key, file, ``(offset, length)`` in that file, and
the hash of its rows (two 64-bit lanes, :mod:`manymodels.identity.rowhash`).
Those rows are all that comes back to the driver.

The training workers -- of any backend: Spark, Dask, processes -- then read a
group as a slice of a memory-mapped file (``TaskData`` ``StagedSlices``): no
scan, no copy until ``fit``'s format needs one. So every row crosses the
network once (the shuffle), is written once and read once.

A group's data hash does not depend on the order its rows came out of the
shuffle (its rows' hashes are sorted before they are combined), so a re-run
on the same data has the same identities and reuses its models.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import shutil
import tempfile
import uuid
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..inputs.engineframes import STAGED_INDEX_COLUMNS, TABLE_NAMES, EngineFrame, stand_ins
from ..inputs.objectstores import (
    child,
    is_remote,
    make_directory,
    path_in,
    redacted,
    remove_tree,
    shown,
    write_arrow_file,
)
from ..inputs.tables import exact_pandas, sort_order

#: The columns of a group's row after its key columns (all int64 on the wire).
INDEX_COLUMNS = STAGED_INDEX_COLUMNS
FILE, OFFSET, LENGTH, LANE_A, LANE_B = INDEX_COLUMNS


def file_name(number: int) -> str:
    """The name of a staged partition's file, from the id its worker drew."""
    return f"part-{number:016x}.arrow"


def stage_rows(table: pa.Table, by: list[str], order_by: list[str], directory: str
               ) -> pa.Table | None:
    """On an engine's worker: sort one partition's rows by key (stable; then
    by ``order_by``), write them to one Arrow IPC file under ``directory`` and
    return one row per group (see the module docstring); None for no rows."""
    from ..identity.hashing import digest
    from ..identity.rowhash import (
        arrow_row_hashes,
        categories_note,
        group_lanes,
        lanes_of,
        pandas_types_note,
        schema_text,
    )

    if table.num_rows == 0:
        return None
    types = _pandas_types(table.schema)
    table = table.replace_schema_metadata(None)
    codes = exact_pandas(table.select(by)).groupby(by, sort=True, dropna=False,
                                                   observed=True).ngroup()
    codes = codes.to_numpy()
    if order_by:
        order = sort_order(table, order_by, codes).to_numpy()
    else:
        order = np.argsort(codes, kind="stable")
    rows = table.take(pa.array(order)).combine_chunks()
    lengths = np.bincount(codes).astype(np.int64)
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    number = int.from_bytes(os.urandom(8), "little") >> 1  # an id no other worker draws
    path = path_in(directory, file_name(number))
    written = rows if types is None else rows.replace_schema_metadata(types)
    if is_remote(directory):
        write_arrow_file(path, written)
    else:
        with pa.OSFile(path + ".partial", "wb") as sink, \
                pa.ipc.new_file(sink, written.schema) as out:
            out.write_table(written)
        os.replace(path + ".partial", path)  # a file is whole, or absent
    hashes = arrow_row_hashes(rows)
    # each group's row hashes in order of value: the same lanes whatever order
    # the shuffle delivered its rows in
    hashes = hashes[np.lexsort((hashes, codes[order]))]
    lanes = group_lanes(hashes, offsets, lengths, lanes_of(digest(
        schema_text(_nullable(rows.schema)) + pandas_types_note(written.schema)
        + categories_note(rows, written.schema, keys=by))))
    index = rows.select(by).take(pa.array(offsets))
    columns = (np.full(len(offsets), number, dtype=np.int64), offsets, lengths,
               lanes[:, 0].view(np.int64), lanes[:, 1].view(np.int64))
    for name, values in zip(INDEX_COLUMNS, columns):
        index = index.append_column(name, pa.array(values, type=pa.int64()))
    return index


def _pandas_types(schema: pa.Schema) -> dict[bytes, bytes] | None:
    """The pandas types of a partition that came from pandas (a Dask
    partition, a Ray Dataset's pandas block), as ``Table.from_pandas`` notes
    them: the staged file keeps them, so that ``fit`` gets a nullable
    ``Int64`` or ``boolean`` column as such, as the pandas path hands it the
    frame's own types (Arrow's ``to_pandas`` made it floats or objects in a
    group with a missing value, and ``map_groups`` gave it back so). The
    rows' data hash counts only the types ``fit`` gets otherwise than from
    Arrow's (:func:`~manymodels.identity.rowhash.pandas_types_note`): an
    ``Int64`` column that was ``int64`` is another input to ``fit``, while
    the rest of the note (its index, each partition's own) is not data."""
    kept = (schema.metadata or {}).get(b"pandas")
    return None if kept is None else {b"pandas": kept}


def _nullable(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column nullable, as a group's data hash takes it:
    Spark says a column is not nullable from its query's plan (``spark.range``,
    a filter on ``isNotNull``, a literal), not from its values, so the same
    rows from another query would read as changed and retrain."""
    return pa.schema([field.with_nullable(True) for field in schema], schema.metadata)


def stage_arrow_partition(batches: Iterator[pa.RecordBatch], by: list[str],
                          order_by: list[str], directory: str, names: list[str] | None = None,
                          keys: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """Spark's ``mapInArrow`` function: one partition's batches in, its groups'
    rows out. ``names``: the columns' own names, where the batches come with
    stand-ins' (:func:`~manymodels.inputs.engineframes.stand_ins`), and
    ``keys`` the stand-ins the groups' rows give their key columns."""
    rows = list(batches)
    if not rows:
        return
    table = pa.Table.from_batches(rows)
    index = stage_rows(table if names is None else table.rename_columns(names), by, order_by,
                       directory)
    if index is not None:
        if keys is not None:
            index = index.rename_columns([*keys, *INDEX_COLUMNS])
        yield from index.to_batches()


def stage_pandas_partition(frame: Any, by: list[str], order_by: list[str],
                           directory: str, categoricals: dict[str, Any] | None = None) -> Any:
    """Dask's ``map_partitions`` function: one partition in, its groups' rows
    out (the key columns of the partition's own types: an ``Int64`` key with
    a null stays integers). ``categoricals``: the frame's categorical columns
    (name -> dtype, or None where its categories are unknown), which a
    shuffle delivers as text where its pieces' categories differ: each is a
    categorical again, as ``fit`` would get it from the pandas path."""
    import pandas as pd

    for name, dtype in (categoricals or {}).items():
        if name in frame.columns and not isinstance(frame[name].dtype, pd.CategoricalDtype):
            frame = frame.assign(**{name: frame[name].astype(dtype or "category")})
    index = None
    if len(frame):
        index = stage_rows(pa.Table.from_pandas(frame, preserve_index=False), by, order_by,
                           directory)
    if index is None:
        columns = {name: frame[name].iloc[:0] for name in by}
        columns.update({name: pd.Series([], dtype="int64") for name in INDEX_COLUMNS})
        return pd.DataFrame(columns)
    out = index.to_pandas()
    for name in by:
        from_arrow = getattr(frame[name].dtype, "__from_arrow__", None)
        if from_arrow is not None and not isinstance(frame[name].dtype, pd.CategoricalDtype):
            out[name] = pd.Series(from_arrow(index.column(name)), index=out.index)
    return out


@dataclass(eq=False)
class StagedGroups:
    """The groups an engine staged: each group's key (``key_table``, one row a
    group, in key order), file number, offset, length and data lanes. The
    staged files are removed when this object goes (with its source)."""

    directory: str
    files: list[str]
    key_table: pa.Table
    file_numbers: np.ndarray
    offsets: np.ndarray
    lengths: np.ndarray
    lanes: np.ndarray  # (groups, 2) uint64
    _cleanup: Any = field(default=None, repr=False)

    @property
    def num_rows(self) -> int:
        return int(self.lengths.sum())


def new_directory(base: str | None, prefix: str) -> str:
    """A fresh directory for staged rows: under ``base`` (one every worker
    sees: a path, or an object store's URI), made if need be, or a temporary
    one on this machine."""
    if base is None:
        return tempfile.mkdtemp(prefix=prefix)
    if is_remote(base):
        directory = child(base, f"{prefix}{uuid.uuid4().hex[:12]}")
        try:
            make_directory(directory)
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(f"staging={shown(base)!r}: cannot write there: "
                             f"{redacted(exc, base)}") from None
        return directory
    base = os.path.expanduser(base)  # (~/stage: not a folder named "~" here)
    directory = os.path.join(base, f"{prefix}{uuid.uuid4().hex[:12]}")
    try:
        os.makedirs(base, exist_ok=True)
        os.makedirs(directory)
    except OSError as exc:  # (a file there, a folder not writable: named as the argument)
        raise ValueError(f"staging={str(base)!r}: cannot make a directory there: "
                         f"{exc}") from None
    return directory


def remove_directory(directory: str) -> None:
    """Remove a staging directory and what is in it (errors ignored: a clean-up)."""
    if is_remote(directory):
        remove_tree(directory)
        _REMOTE_LEFT.pop(directory, None)
    else:
        shutil.rmtree(directory, ignore_errors=True)


#: Object stores' staging directories not removed yet: the exit hook's list.
_REMOTE_LEFT: dict[str, None] = {}
_exit_hook: list[bool] = []  # registered once (a flag a function can set)


def _remove_remote_left() -> None:
    for directory in list(_REMOTE_LEFT):
        remove_directory(directory)


def stage(engine_frame: EngineFrame, by: list[str], order_by: list[str]) -> StagedGroups:
    """Have the engine group ``engine_frame`` (see the module docstring)."""
    directory = new_directory(engine_frame.staging, "manymodels-staged-")
    if not is_remote(directory):
        directory = os.path.abspath(directory)
    try:
        run = {"spark": _stage_spark, "dask": _stage_dask, "ray": _stage_ray}[engine_frame.engine]
        index = run(engine_frame.frame, by, order_by, directory)
        staged = _index_to_groups(index, by, directory, TABLE_NAMES[engine_frame.engine])
    except BaseException:
        remove_directory(directory)
        raise
    staged._cleanup = cleanup_with(staged, directory)
    return staged


def cleanup_with(owner: Any, directory: str) -> weakref.finalize:
    """Remove ``directory`` when ``owner`` goes, or when the interpreter exits.
    An object store's directory is also removed by an exit hook of this
    module's, registered once, after pyarrow's filesystems: exit hooks run
    last first, and weakref's, registered by whichever finalizer came first
    in the process, may come after pyarrow's, which shuts the S3 client down."""
    finalizer = weakref.finalize(owner, remove_directory, directory)
    if is_remote(directory):
        _REMOTE_LEFT[directory] = None
        if not _exit_hook:  # one hook for all, registered after pyarrow.fs was imported
            atexit.register(_remove_remote_left)
            _exit_hook.append(True)
    return finalizer


def _index_to_groups(index: pa.Table, by: list[str], directory: str,
                     table_name: str = "DataFrame") -> StagedGroups:
    """The groups' rows from the workers, in the key order of the pandas path."""
    if index.num_rows == 0:
        raise ValueError(f"the {table_name} is empty: there are no groups to train")
    index = index.combine_chunks()
    codes = exact_pandas(index.select(by)).groupby(by, sort=True, dropna=False,
                                                   observed=True).ngroup()
    order = np.argsort(codes.to_numpy(), kind="stable")
    if len(np.unique(codes)) != index.num_rows:
        raise RuntimeError("the engine split a group over two partitions")
    index = index.take(pa.array(order))
    ids = index.column(FILE).to_numpy()
    unique_ids, numbers = np.unique(ids, return_inverse=True)
    lanes = np.stack([index.column(LANE_A).to_numpy().view(np.uint64),
                      index.column(LANE_B).to_numpy().view(np.uint64)], axis=1)
    keys = _key_types(index.select(by))
    return StagedGroups(directory, [file_name(int(i)) for i in unique_ids],
                        keys, numbers.astype(np.int64),
                        index.column(OFFSET).to_numpy(), index.column(LENGTH).to_numpy(),
                        lanes)


def _key_types(keys: pa.Table) -> pa.Table:
    """The key columns with the pandas metadata of an engine's partitions for
    all but text: a Dask ``boolean`` key with a missing value stays
    ``boolean`` (Arrow alone makes it objects), as the pandas path keeps it;
    a text key is typed as Arrow holds it, ``str`` (Dask makes every text
    column ``string[pyarrow]``, where the pandas path gives ``str``)."""
    raw = (keys.schema.metadata or {}).get(b"pandas")
    keys = keys.replace_schema_metadata(None)
    if raw is None:
        return keys
    pandas = json.loads(raw)
    kept = [column for column in pandas.get("columns", ())
            if column.get("name") in keys.column_names
            and not pa.types.is_string(keys.schema.field(column["name"]).type)
            and not pa.types.is_large_string(keys.schema.field(column["name"]).type)]
    if not kept:
        return keys
    pandas.update(columns=kept, index_columns=[], column_indexes=[])
    return keys.replace_schema_metadata({b"pandas": json.dumps(pandas).encode()})


def _stage_spark(frame: Any, by: list[str], order_by: list[str], directory: str) -> pa.Table:
    """One shuffle by key (``repartition``), then :func:`stage_rows` in each partition."""
    from pyspark.sql import types

    names = list(frame.columns)
    stand = stand_ins(len(names))
    keys = [stand[names.index(name)] for name in by]
    fields = [types.StructField(key, frame.schema[name].dataType, frame.schema[name].nullable)
              for key, name in zip(keys, by)]
    fields += [types.StructField(name, types.LongType(), False) for name in INDEX_COLUMNS]
    job = functools.partial(stage_arrow_partition, by=by, order_by=order_by,
                            directory=directory, names=names, keys=keys)
    carried = frame.toDF(*stand)
    index = carried.repartition(*_spark_partitions(frame), *_spark_partition_keys(carried, keys)
                                ).mapInArrow(job, types.StructType(fields))
    return index.toArrow().rename_columns([*by, *INDEX_COLUMNS])


def _spark_partitions(frame: Any) -> tuple[int, ...]:
    """How many partitions the shuffle makes: none named where Spark's
    adaptive execution coalesces a shuffle's partitions (its default), so
    that Spark sizes them from the data, as its own ``groupBy().applyInPandas``
    does; a number named is never coalesced, and a frame of 200 partitions
    holding 5 groups ran 200 Python tasks (20-40 s on 2 cores, where 0.3 s
    does). Without adaptive execution, one partition a core of the cluster,
    or the frame's own count where it has more (a large frame's partitions
    stay about as large as they were)."""
    session = frame.sparkSession
    with contextlib.suppress(Exception):  # a conf that cannot be read: as if off
        adaptive = ("spark.sql.adaptive.enabled", "spark.sql.adaptive.coalescePartitions.enabled")
        if all(str(session.conf.get(name, "true")).lower() == "true" for name in adaptive):
            return ()
    partitions = session.sparkContext.defaultParallelism
    with contextlib.suppress(Exception):  # a Spark Connect frame has no RDD to ask
        partitions = max(partitions, frame.rdd.getNumPartitions())
    return (partitions,)


def _spark_partition_keys(frame: Any, keys: list[str]) -> list[Any]:
    """The key columns as the shuffle hashes them: a float key's -0.0 as 0.0
    and its NaN as null, which the workers group as one key each, as the
    pandas path does (Spark's hash of the values as they are would send
    each of the two to its own partition: one group split over two)."""
    from pyspark.sql import functions, types

    columns = []
    for key in keys:
        column = frame[key]
        if isinstance(frame.schema[key].dataType, (types.FloatType, types.DoubleType)):
            column = (functions.when(functions.isnan(column), functions.lit(None))
                      .when(column == 0, functions.lit(0.0)).otherwise(column))
        columns.append(column)
    return columns


def _stage_dask(frame: Any, by: list[str], order_by: list[str], directory: str) -> pa.Table:
    """One shuffle by key (``shuffle(on=by)``), then :func:`stage_rows` in each partition."""
    import pandas as pd
    from dask.dataframe.utils import has_known_categories

    meta = {name: frame._meta[name].iloc[:0] for name in by}
    meta.update({name: pd.Series([], dtype="int64") for name in INDEX_COLUMNS})
    categoricals = {name: (dtype if has_known_categories(frame._meta[name]) else None)
                    for name, dtype in frame._meta.dtypes.items()
                    if isinstance(dtype, pd.CategoricalDtype)}
    index = frame.shuffle(on=by).map_partitions(
        stage_pandas_partition, by, order_by, directory, categoricals,
        meta=pd.DataFrame(meta))
    return pa.Table.from_pandas(index.compute(), preserve_index=False)


def stage_ray_block(block: pa.Table, by: list[str], order_by: list[str],
                    directory: str, added: tuple[str, ...] = ()) -> pa.Table:
    """Ray Data's ``map_batches`` function: one whole block in, its groups' rows out
    (an empty table of the same columns for an empty block: Ray wants a table).
    ``added``: the shuffle's own key columns (:func:`ray_shuffle_keys`), dropped."""
    block = block.drop_columns([name for name in added if name in block.column_names])
    index = stage_rows(block, by, order_by, directory)
    if index is not None:
        return index
    fields = [block.schema.field(name) for name in by]
    fields += [pa.field(name, pa.int64()) for name in INDEX_COLUMNS]
    return pa.schema(fields).empty_table()


def ray_shuffle_keys(dataset: Any, by: list[str]) -> tuple[Any, list[str], tuple[str, ...]]:
    """What a Ray Dataset is shuffled (and Ray Data's ``groupby``) by: its key
    columns, but for a float or categorical key a column of its own
    (:func:`shuffle_key_values`), added here. Ray's hash shuffle hashes a
    NaN and a null apart, and -0.0 and 0.0 by their bits, where pandas groups
    each pair as one key: the group went to two partitions ("the engine
    split a group over two partitions", on a cluster of more than two
    CPUs), and a sort may cut between them; and it cannot sort a dictionary
    (a pandas categorical): it failed deep in Ray. The key columns
    themselves travel as they are, so ``fit`` and the results get their
    own types. Returns the dataset, its shuffle keys (in ``by``'s order)
    and the names of the columns added."""
    from ..inputs.engineframes import _ray_schema

    schema = _ray_schema(dataset)
    taken = set(schema.names)
    added: dict[str, str] = {}
    for position, name in enumerate(by):
        kind = schema.field(name).type
        if pa.types.is_dictionary(kind):
            kind = kind.value_type
        # (a null type: one Ray could not name, as a pandas categorical's)
        if pa.types.is_floating(kind) or pa.types.is_null(kind) or (
                kind != schema.field(name).type):
            alias = f"__manymodels_key_{position}__"
            while alias in taken:
                alias = f"_{alias}"
            added[name] = alias
    if not added:
        return dataset, list(by), ()
    job = functools.partial(add_shuffle_keys, keys=added)
    dataset = dataset.map_batches(job, batch_size=None, batch_format="pyarrow",
                                  zero_copy_batch=True)
    return dataset, [added.get(name, name) for name in by], tuple(added.values())


def add_shuffle_keys(block: pa.Table, keys: dict[str, str]) -> pa.Table:
    """Ray Data's ``map_batches`` function: ``block`` with each key column's
    shuffle key (``keys``: key column -> the added column's name)."""
    for name, alias in keys.items():
        if name in block.column_names:  # (a block of no rows may have no columns)
            block = block.append_column(alias, shuffle_key_values(block.column(name)))
    return block


def shuffle_key_values(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A key column's values as one value a key: a categorical's values, a
    float's NaN as null and -0.0 as 0.0 (one group each, as pandas groups them)."""
    import pyarrow.compute as pc

    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if pa.types.is_floating(column.type):
        column = pc.if_else(pc.is_nan(column), pa.scalar(None, column.type), column)
        column = pc.if_else(pc.equal(column, 0), pa.scalar(0, column.type), column)
    return column


def _stage_ray(dataset: Any, by: list[str], order_by: list[str], directory: str) -> pa.Table:
    """One shuffle by key as Ray Data's own ``groupby().map_groups`` makes it (a
    hash shuffle into one sorted block a partition, or a sort by key under the
    older shuffle strategies: either way a group is in one block), then
    :func:`stage_rows` on each whole block; only the groups' rows are fetched."""
    import ray

    empty = pa.schema([(name, pa.int64()) for name in by + list(INDEX_COLUMNS)]).empty_table()
    keyed, keys, added = ray_shuffle_keys(dataset, by)
    hashed = {"hash_shuffle", "shuffle_v2", "gpu_shuffle"}
    if str(getattr(dataset.context.shuffle_strategy, "value", "")) in hashed:
        partitions = max(1, int(ray.cluster_resources().get("CPU", 1)))
        shuffled = keyed.repartition(partitions, keys=keys, sort=True)
    else:
        shuffled = keyed.sort(keys)
    job = functools.partial(stage_ray_block, by=by, order_by=order_by, directory=directory,
                            added=added)
    index = shuffled.map_batches(job, batch_size=None, batch_format="pyarrow",
                                 zero_copy_batch=True)
    try:
        tables = [table for table in ray.get(index.to_arrow_refs()) if table.num_rows]
    except Exception:
        # Ray's hash shuffle fails on a Dataset whose blocks are all empty (a
        # filter that kept no row leaves blocks without columns): sorting
        # them, it finds no key column. Such a Dataset is refused as empty.
        if _ray_dataset_is_empty(dataset):
            return empty
        raise
    return pa.concat_tables(tables) if tables else empty


def _ray_dataset_is_empty(dataset: Any) -> bool:
    """Whether ``dataset`` has no row (it runs again to count them: asked
    only once its shuffle has failed)."""
    try:
        return dataset.count() == 0
    except Exception:
        return False
