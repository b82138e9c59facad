"""Groups read on the workers: ``mm.groups(path, by=..., read_on_workers=True)``.

The driver reads the key columns of the Parquet files only, to plan the
groups; each batch's worker reads its own groups' rows with one filtered
scan of the files that hold them (:class:`ParquetGroups`). The files' schemas
unify as an eager read of the directory unifies them (:mod:`.tables`), and
Hive-style partition folders are columns here too (:mod:`.partitions`).
The files may be on an object store (``s3://``, ``gs://``, ``abfs://``):
:mod:`.objectstores` lists and resolves them, on the driver and on the
workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from .filereads import present_columns
from .filetables import (
    codes_into,
    dictionaries_that_hold_all,
    first_misfit,
    index_type_for,
    is_text,
    refuse_unlike_columns,
    text_where_any_is_text,
    unsigned_beside_signed,
    unsigned_or_text,
)
from .objectstores import (
    is_remote,
    missing_path,
    object_path,
    object_versions,
    parquet_objects,
    redacted,
    resolve,
    resolve_all,
    shown,
    without_secrets,
)
from .partitions import partition_table, partitioning
from .tablefiles import PARQUET_SUFFIXES, is_parquet, table_files
from .tables import exact_pandas, plain_scalar, sort_order


def parquet_files(table: Any) -> list[str]:
    """The Parquet files behind ``table``, a path to a Parquet file or to a
    directory of them (or an object store's URI of either), in the order
    :func:`read_table` reads them."""
    if not isinstance(table, (str, Path)):
        raise TypeError("read_on_workers=True needs the path of a Parquet file or directory, "
                        f"got {type(table).__name__}")
    if is_remote(table):
        objects = parquet_objects(table, PARQUET_SUFFIXES)
        for uri in objects:
            if Path(object_path(uri)).suffix.lower() not in PARQUET_SUFFIXES:
                raise ValueError(f"read_on_workers=True reads Parquet only; {shown(uri)!r} is not "
                                 "a .parquet object")
        return objects
    path = Path(table)
    if not path.exists():
        raise missing_path(str(path))
    files = [path] if path.is_file() else table_files(path)
    if not files:
        raise ValueError(f"directory {str(path)!r} holds no .parquet files")
    for file in files:
        if not is_parquet(file):
            raise ValueError(f"read_on_workers=True reads Parquet only; {str(file)!r} is not "
                             "a .parquet file")
    return [str(file.absolute()) for file in files]  # fit may change the directory


def file_versions(files: list[str]) -> tuple:
    """Each file's (size, modification time in ns): what a rewrite changes."""
    if is_remote(files[0]):
        filesystem, paths = resolve_all(files)
        return tuple((info.size, info.mtime_ns) for info in filesystem.get_file_info(paths))
    import os

    return tuple((info.st_size, info.st_mtime_ns) for info in map(os.stat, files))


def parquet_root(table: str | Path) -> str | None:
    """The directory (or object-store prefix) ``table`` names, whose
    ``name=value`` folders are columns; None where it names one file."""
    if is_remote(table):
        from pyarrow import fs

        filesystem, path = resolve(table)
        return table if filesystem.get_file_info(path).type == fs.FileType.Directory else None
    return str(Path(table).absolute()) if Path(table).is_dir() else None


def read_rows(files: list[str], columns: list[str] | None = None, filter: Any = None,
              schema: pa.Schema | None = None, use_threads: bool = True,
              partitions: pa.Table | None = None, root: str | None = None) -> pa.Table:
    """Read ``columns`` of the rows of ``files`` that match ``filter`` (a
    ``pyarrow.compute`` expression), in file and row order; ``partitions``:
    the files' partition columns (:mod:`manymodels.inputs.partitions`), from the
    names of their folders under ``root``."""
    import pyarrow.dataset as ds

    filesystem, paths = None, files
    if is_remote(files[0]):
        filesystem, paths = resolve_all(files)
        root = None if root is None else resolve(root)[1]
    try:
        dataset = ds.dataset(paths, format="parquet", schema=schema, filesystem=filesystem,
                             partitioning=partitioning(partitions),
                             partition_base_dir=root if partitions is not None else None)
        return dataset.to_table(columns=columns, filter=filter, use_threads=use_threads)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"cannot read the Parquet files {[shown(f) for f in files[:3]]}"
                         f"{'...' if len(files) > 3 else ''}: {redacted(exc, files[0])}"
                         ) from exc


def read_objects(location: str, columns: list[str] | None = None) -> pa.Table:
    """Parquet on an object store read here, whole, as :func:`read_table`
    reads a local file or directory: the object, or the objects under the
    prefix in key order, ``name=value`` folders as columns; with
    ``columns``, only those (a missing one named)."""
    files = parquet_files(location)
    root = parquet_root(location)
    partitions = None if root is None else partition_table(*_folder_paths(root, files))
    schema, schemas = files_schema(files, partitions, root)
    refuse_unlike_columns(files, [s.names for s in schemas],
                          f"the objects under {shown(location)!r}")
    if columns is not None:
        columns = present_columns(columns, schema.names, location)
    rows = read_rows(files, columns, partitions=partitions, root=root, schema=schema)
    return dictionaries_that_hold_all([rows])[0]


def _folder_paths(root: str, files: list[str]) -> tuple[str, list[str]]:
    """The objects' paths under ``root`` whose folders name their partition
    columns, as :func:`partition_table` reads them: without the URIs'
    keys, which its errors would show (an access key and secret in
    ``s3://KEY:SECRET@bucket``, keys in the query), and as text (a
    ``Path`` shows ``s3://bucket`` as ``s3:/bucket``). A local path is
    taken as it is: a ``?`` or ``%`` in a folder's name is part of it."""
    if not is_remote(root):
        return root, files
    return (object_path(without_secrets(root)),
            [object_path(without_secrets(file)) for file in files])


def files_schema(files: list[str], partitions: pa.Table | None, root: str | None
                 ) -> tuple[pa.Schema, list[pa.Schema]]:
    """The Parquet files' one schema, as an eager read of a folder unifies
    them (a column text in any file is text in all, types widened), with
    their folders' partition columns after it; and each file's own."""
    import pyarrow.parquet as pq

    filesystem, paths = resolve_all(files) if is_remote(files[0]) else (None, files)
    schemas = []
    for file, path in zip(files, paths):
        try:
            schemas.append(pq.read_schema(path, filesystem=filesystem))
        except (OSError, pa.ArrowException) as exc:
            raise ValueError(f"cannot read table file {shown(file)!r}: {exc}") from exc
    widened = _unsigned_where_any_is(paths, schemas, filesystem)
    mixed = [table.schema for table in text_where_any_is_text(
        [schema.empty_table() for schema in widened])]  # a column text anywhere: everywhere
    try:
        schema = pa.unify_schemas(mixed, promote_options="permissive")
    except pa.ArrowException as exc:
        raise ValueError(f"the Parquet files under {shown(files[0])!r}... do not share one "
                         f"schema: {first_misfit(files, mixed)}{exc}") from exc
    return _with_partitions(schema, partitions, root), schemas


def _unsigned_where_any_is(paths: list[Any], schemas: list[pa.Schema], filesystem: Any
                           ) -> list[pa.Schema]:
    """The files' schemas with an integer column that is ``uint64`` in one
    file and signed in another as an eager read makes it
    (:func:`~.filetables.unsigned_where_any_is`): ``uint64`` where no signed
    file holds a negative value, else text. Arrow's own unification made it
    int64, so a worker's read failed on the first id past int64's range
    ("Integer value ... not in range", naming no column), and the key was
    int64 where an eager read's is uint64. The signed files' column is read
    to know (such files are few: ids written by two writers)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    targets = {}
    for name in unsigned_beside_signed(schemas):
        lowest = [pc.min(pq.read_table(path, columns=[name], filesystem=filesystem)
                         .column(0)).as_py()
                  for path, schema in zip(paths, schemas)
                  if name in schema.names and pa.types.is_signed_integer(
                      schema.field(name).type)]
        targets[name] = unsigned_or_text(lowest)
    return [_retyped(schema, targets) for schema in schemas]


def _retyped(schema: pa.Schema, targets: dict[str, pa.DataType]) -> pa.Schema:
    """``schema`` with each column named in ``targets`` of that type."""
    for name, kind in targets.items():
        position = schema.get_field_index(name)
        if position >= 0:
            schema = schema.set(position, schema.field(position).with_type(kind))
    return schema


def _with_partitions(schema: pa.Schema, partitions: pa.Table | None,
                     root: str | None) -> pa.Schema:
    """The files' schema and their folders' partition columns after it."""
    for field in () if partitions is None else partitions.schema:
        if field.name in schema.names:
            raise ValueError(f"column {field.name!r} is both in the Parquet files under "
                             f"{shown(root)!r} and in the names of their folders: rename one")
        schema = schema.append(field)
    return schema


@dataclass(frozen=True)
class ParquetGroups:
    """Groups whose rows stay in Parquet files until a worker needs them:
    ``mm.groups(path, by=..., read_on_workers=True)``. A task's data reference
    is ``(key, file numbers)``: its ``by`` values and the files that hold its
    rows; :meth:`read` fetches a batch's groups with one filtered scan of
    those files only."""

    files: list[str]
    by: list[str]
    schema: pa.Schema  # of all files, unified as an eager read unifies them
    order_by: tuple[str, ...] = ()  # each group's rows sorted by these
    columns: tuple[str, ...] | None = None  # the columns read (None: all)
    partitions: pa.Table | None = None  # each file's partition columns (name=value folders)
    root: str | None = None  # the directory the files are under
    versions: tuple | None = None  # each file's (size, modification time) when planned
    #: The ``by`` columns that are text in ``schema`` but not in some file (a
    #: file of numbers beside one of text): filtered on their text, see :meth:`read`
    retyped_keys: tuple[str, ...] = ()
    #: Each dictionary (categorical) column read -> its categories in all
    #: files, in the order first met, as an eager read's conversion to pandas
    #: unifies them: a batch's rows take them, whichever files it scans
    dictionaries: dict[str, pa.Array] | None = None

    def check_unchanged(self, number: int) -> None:
        """Refuse file ``number`` where it changed since the plan read its
        keys: its rows' groups were decided from the keys read then."""
        if self.versions is None:
            return
        try:
            now = file_versions([self.files[number]])[0]
        except FileNotFoundError:
            raise ValueError(f"the Parquet file {shown(self.files[number])!r} was removed "
                             "since mm.groups read its keys: make the source again with "
                             "mm.groups") from None
        if now != self.versions[number]:
            raise ValueError(f"the Parquet file {shown(self.files[number])!r} changed since "
                             "mm.groups read its keys (its size or modification time "
                             "differ): make the source again with mm.groups")

    @classmethod
    def plan(cls, files: list[str], by: list[str], order_by: list[str] | None = None,
             columns: list[str] | None = None, root: str | None = None
             ) -> tuple[ParquetGroups, pa.Table]:
        """Read the key columns only; return the reader and the key table with
        a ``__file__`` column (the number of the file each row came from).
        ``root``: the directory the files are under (its ``name=value``
        folders are columns, :mod:`manymodels.inputs.partitions`)."""

        partitions = None if root is None else partition_table(*_folder_paths(root, files))
        schema, own_schemas = files_schema(files, partitions, root)
        refuse_unlike_columns([shown(f) for f in files], [own.names for own in own_schemas],
                              f"the files under {shown(root or files[0])!r}")
        for what, names in (("by", by), ("order_by", order_by or []), ("", columns or [])):
            missing = [c for c in names if c not in schema.names]
            if missing:
                raise ValueError(f"{what + ' ' if what else ''}column {missing[0]!r} is not in "
                                 f"the Parquet files; their columns are {schema.names}")
        if columns is not None:
            columns = present_columns(columns, schema.names, files[0])
        parts = []
        categorical = [field.name for field in schema if pa.types.is_dictionary(field.type)
                       and field.name not in by and (columns is None or field.name in columns)
                       and (partitions is None or field.name not in partitions.column_names)]
        categories: dict[str, list[pa.Array]] = {name: [] for name in categorical}
        versions = file_versions(files)  # (before the keys are read: a change after shows)
        for number, file in enumerate(files):
            keys = read_rows([file], columns=[*by, *categorical], schema=schema,
                             partitions=partitions, root=root)
            for name in categorical:  # (a few dictionaries a file; the codes are dropped)
                categories[name] += [chunk.dictionary for chunk in keys.column(name).chunks]
            keys = keys.select(by)
            parts.append(keys.append_column("__file__", pa.array(
                [number] * keys.num_rows, type=pa.int32())))
        dictionaries = {name: _first_met(values, schema.field(name).type.value_type)
                        for name, values in categories.items()}
        retyped = tuple(name for name in by if is_text(schema.field(name).type) and any(
            name in own.names and not is_text(own.field(name).type) for own in own_schemas))
        return (cls(files, by, schema, tuple(order_by or ()),
                    None if columns is None else tuple(columns), partitions, root,
                    versions, retyped, dictionaries or None),
                pa.concat_tables(parts))

    def file_identities(self, content_hash: Callable[[str], str]) -> list[str]:
        """Each file's identity: ``content_hash`` of a local file; of an
        object, its URI, size and modification time (no byte read here, see
        :mod:`.objectstores`)."""
        if self.files and is_remote(self.files[0]):
            return object_versions(self.files)
        return [content_hash(path) for path in self.files]

    def read(self, refs: list[tuple[tuple, tuple[int, ...]]]) -> dict[tuple, pa.Table]:
        """Key -> that group's rows, in file and row order (as an eager read
        and its stable sort by key would give them)."""
        import pyarrow.compute as pc

        keys = dict.fromkeys(key for key, _ in refs)
        numbers = sorted({number for _, files in refs for number in files})
        condition = None
        for position, column in enumerate(self.by):  # a superset: each column's values
            kind = self.schema.field(column).type
            if pa.types.is_dictionary(kind):
                kind = kind.value_type
            wanted = list(dict.fromkeys(key[position] for key in keys))
            if pa.types.is_floating(kind) and any(v == 0 for v in wanted if v is not None):
                wanted += [0.0, -0.0]  # one key to pandas' grouping, two to Arrow's is_in
            field = pc.field(column)
            if column in self.retyped_keys:
                # Arrow checks a filter on the column itself against each row
                # group's statistics in the file's own type, and cannot compare
                # text with numbers: a filter on its text is not checked so
                field = field.cast(kind)
            term = field.isin(pa.array(wanted, type=kind))
            condition = term if condition is None else condition & term
        # one thread: a worker stays within its cpus_per_task
        rows = read_rows([self.files[n] for n in numbers],
                         columns=None if self.columns is None else list(self.columns),
                         filter=condition, schema=self.schema, use_threads=False,
                         partitions=self.partitions, root=self.root)
        if self.dictionaries:
            rows = self._with_all_categories(rows)
        if self.order_by:  # one stable sort for the batch: each group's rows in order
            rows = rows.take(sort_order(rows, list(self.order_by)))
        key_frame = exact_pandas(rows.select(self.by))
        positions = key_frame.groupby(self.by, sort=False).indices
        groups = {}
        for key, where in positions.items():
            key = tuple(plain_scalar(v) for v in (key if isinstance(key, tuple) else (key,)))
            if key in keys:
                groups[key] = rows.take(where)
        return groups

    def _with_all_categories(self, rows: pa.Table) -> pa.Table:
        """``rows`` with each dictionary column's codes into the categories of
        all files (:attr:`dictionaries`), not only those of the files read."""
        for name, values in (self.dictionaries or {}).items():
            position = rows.schema.get_field_index(name)
            if position < 0:
                continue
            kind = self.schema.field(name).type
            wanted = pa.dictionary(index_type_for(len(values), kind.index_type),
                                   kind.value_type, kind.ordered)
            chunks = [pa.DictionaryArray.from_arrays(codes_into(chunk, values).cast(
                wanted.index_type), values, ordered=kind.ordered)
                for chunk in rows.column(position).chunks]
            rows = rows.set_column(position, name, pa.chunked_array(chunks, wanted))
        return rows


def _first_met(dictionaries: list[pa.Array], kind: pa.DataType) -> pa.Array:
    """The values of ``dictionaries`` once each, in the order first met."""
    import pyarrow.compute as pc

    values = [d.cast(kind) for d in dictionaries]
    return pc.unique(pa.concat_arrays(values)) if values else pa.array([], kind)
