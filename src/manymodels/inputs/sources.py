"""Task sources: what to train one model for.

A source is a declaration, cheap to build and checked at once, so that bad
input fails before any work starts:

* :func:`groups` -- one task per group of a table's rows;
* :func:`items` -- one task per element of an iterable (files, ids, ...);
* :func:`grid` -- one task per combination of parameter values;
* ``source * grid`` -- every task of ``source`` with every setting.

The planner (:mod:`manymodels.planning.plan`) turns a source into tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .engineframes import EngineFrame, engine_of, staging_location
from .filereads import local_path, separator_hint
from .objectstores import is_remote
from .parquetgroups import ParquetGroups, parquet_files, parquet_root, read_objects
from .sourcechecks import check_cost, named_twice
from .tables import is_pandas_frame, plain_scalar, read_table, refuse_unsortable

#: How ``fit`` may receive a group's rows.
FORMATS = ("pandas", "arrow", "polars", "numpy")


class Source:
    """Base of all task sources; ``a * b`` combines a source with a grid.

    A grid (:mod:`.grids`) does the combining, as the operand Python asks
    second: a source leaves ``*`` to it, and refuses two sources neither of
    which is a grid."""

    #: True for a source that ``*`` combines with others (a grid).
    combines = False

    def __mul__(self, other: Any) -> Any:
        return self._refuse(self, other)

    def __rmul__(self, other: Any) -> Any:
        return self._refuse(other, self)

    @staticmethod
    def _refuse(left: Any, right: Any) -> Any:
        if not isinstance(left, Source) or not isinstance(right, Source) or right.combines \
                or left.combines:
            return NotImplemented  # the grid's own __mul__/__rmul__ answers
        raise TypeError(f"cannot combine {left!r} with {right!r}: only a grid can multiply "
                        "groups, items or another grid")

    @property
    def key_columns(self) -> list[str]:
        raise NotImplementedError

    @property
    def param_columns(self) -> list[str]:
        return []


class GroupSource(Source):
    """One task per distinct value of the ``by`` columns of a table."""

    def __init__(
        self,
        table: Any,
        by: str | Sequence[str],
        *,
        format: str = "pandas",
        cost: Callable[[int], float] | None = None,
        read_on_workers: bool = False,
        order_by: str | Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
        staging: str | None = None,
    ) -> None:
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
        check_cost(cost, "groups", "its row count")
        table = local_path(table)  # (~, file://: read_on_workers reads the same files)
        by_columns, order_columns, table, wanted = _named_columns(table, by, order_by, columns)
        #: The engine's DataFrame (Spark, Dask) that its engine groups, or None
        self.engine_frame: EngineFrame | None = None
        engine = engine_of(table)
        if engine is not None:
            self._keep_in_engine(table, engine, by_columns, order_columns, wanted,
                                 read_on_workers, staging)
            self.format, self.cost = format, cost
            return
        if staging is not None and not read_on_workers:
            raise ValueError("staging= is where a Spark or Dask DataFrame's grouped rows, or "
                             "read_on_workers' sorted rows, are written; this table is "
                             "neither: leave staging out")
        #: Where read_on_workers sorts files not in key order (None: a temporary directory)
        self.staging = staging_location(staging)
        if not is_remote(self.staging) and self.staging is not None and Path(
                self.staging).expanduser().is_file():
            raise ValueError(f"staging={self.staging!r} is a file; it names the directory "
                             "read_on_workers writes its sorted rows under")
        #: A pandas frame's column labels when some are not strings (Arrow
        #: names columns by strings): ``fit`` gets its frame with these labels.
        self.column_labels: list | None = None
        if is_pandas_frame(table) and not all(isinstance(c, str) for c in table.columns):
            by_columns, order_columns = self._label_columns(table, by_columns, order_columns)
        if not all(isinstance(c, str) for c in by_columns):
            raise TypeError(f"by= must name columns as strings, got {by!r}")
        if not all(isinstance(c, str) for c in order_columns):
            raise TypeError(f"order_by= must name columns as strings, got {order_by!r}")
        clash = set(by_columns) & set(order_columns)
        if clash:
            raise ValueError(f"order_by column {sorted(clash)[0]!r} is also a by column: "
                             "within a group it has one value, so it orders nothing")
        #: A pandas frame's row labels (None for other tables): map_groups labels
        #: the rows of a transform's result with them.
        self.row_index = table.index if is_pandas_frame(table) else None
        #: Reads each batch's groups from the Parquet files on the workers, or
        #: None when the whole table is read here (then ``table`` holds every
        #: column; with a reader, the key columns and each row's file number).
        self.reader: ParquetGroups | None = None
        if read_on_workers:
            self._plan_reads_on_workers(table, by_columns, order_columns, wanted)
        elif is_remote(table):  # an object store's Parquet, read here
            self.table = read_objects(table, wanted)
        else:
            self.table = read_table(table, wanted)
        checked = (("by", by_columns),) + (() if self.reader else (("order_by", order_columns),))
        for what, names in checked:
            missing = [c for c in names if c not in self.table.column_names]
            if missing:
                raise ValueError(
                    f"{what} column {missing[0]!r} is not in the table; "
                    f"its columns are {self.table.column_names}"
                    + _index_hint(self.row_index, missing[0])
                    + separator_hint(self.table.column_names))
        refuse_unsortable(self.reader.schema if self.reader else self.table.schema,
                          order_columns)
        if self.table.num_rows == 0:
            raise ValueError("the table is empty: there are no groups to train")
        self.by = by_columns
        self.order_by = order_columns
        self.format = format
        self.cost = cost
        self._layout = None  # filled once by planning.group_layout

    def _label_columns(self, table: Any, by_columns: list, order_columns: list
                       ) -> tuple[list, list]:
        """A pandas frame whose column labels are not all strings: keep its
        labels for ``fit``, and name the key and order columns by their text."""
        self.column_labels = list(table.columns)
        names = [str(c) for c in self.column_labels]
        if len(set(names)) < len(names):
            raise ValueError(f"the frame's column labels {self.column_labels} are not "
                             "distinct as strings; rename the columns")
        by_columns = [str(c) if c in self.column_labels else c for c in by_columns]
        order_columns = [str(c) if c in self.column_labels else c for c in order_columns]
        self.key_labels = [self.column_labels[names.index(c)] if c in names else c
                           for c in by_columns]
        return by_columns, order_columns

    def _plan_reads_on_workers(self, table: Any, by_columns: list, order_columns: list,
                               wanted: list | None) -> None:
        """Read only the key columns here; each batch reads its groups' rows
        from the Parquet files on its worker."""
        if "__file__" in by_columns:
            raise ValueError("by column '__file__' has the name read_on_workers gives "
                             "each row's file number: rename it, or read on the driver")
        self.reader, self.table = ParquetGroups.plan(
            parquet_files(table), by_columns, order_columns, wanted,
            root=parquet_root(table))
        for name in by_columns:
            column = self.table.column(name)
            nan = pa.types.is_floating(column.type) and pc.any(pc.is_nan(column)).as_py()
            if column.null_count or nan:
                raise ValueError(f"by column {name!r} has missing values; "
                                 "read_on_workers needs a value in every key column")

    def _keep_in_engine(self, table: Any, engine: str, by: list, order_by: list,
                        wanted: list | None, read_on_workers: bool, staging: Any) -> None:
        """An engine's DataFrame: its columns checked, nothing read (see
        :mod:`.engineframes`)."""
        if read_on_workers:
            raise ValueError(f"read_on_workers=True reads Parquet files; a {engine.title()} "
                             "DataFrame is read by its engine's workers anyway: leave "
                             "read_on_workers out")
        for what, names in (("by", by), ("order_by", order_by)):
            for name in names:
                if not isinstance(name, str):
                    raise TypeError(f"{what}= must name columns as strings, got {name!r}")
        clash = set(by) & set(order_by)
        if clash:
            raise ValueError(f"order_by column {sorted(clash)[0]!r} is also a by column: "
                             "within a group it has one value, so it orders nothing")
        self.engine_frame = EngineFrame.of(table, engine, wanted, by + order_by, staging,
                                            keys=by)
        self.column_labels, self.row_index, self.reader, self.table = None, None, None, None
        self.by, self.order_by = by, order_by
        self._layout = None  # filled once by planning.staging, on the engine

    @property
    def key_columns(self) -> list:
        return list(self.key_labels) if self.column_labels else list(self.by)

    def __repr__(self) -> str:
        order = f", order_by={self.order_by}" if self.order_by else ""
        if self.engine_frame is not None:
            return f"groups({self.engine_frame.engine} DataFrame, by={self.by}{order})"
        return f"groups({self.table.num_rows} rows, by={self.by}{order})"


class PartitionSource(Source):
    """One task per contiguous run of rows of a table (no grouping, no sort)."""

    def __init__(self, table: Any, partitions: int, *, format: str = "pandas") -> None:
        if format not in FORMATS:
            raise ValueError(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise ValueError(f"partitions must be an integer >= 1, got {partitions!r}")
        if format == "pandas" and is_pandas_frame(table):
            # Kept as it is: partitions are views of it, and under fork the
            # workers share it without a copy or a conversion.
            self.table: Any = table
        else:
            self.table = read_table(table)
        # an empty table is one empty partition: fn says what its output is
        # (its columns), as fn(table) would
        self.partitions = max(1, min(partitions, self.num_rows))
        self.format = format
        self.cost = None

    @property
    def num_rows(self) -> int:
        return len(self.table) if is_pandas_frame(self.table) else self.table.num_rows

    @property
    def key_columns(self) -> list[str]:
        return ["partition"]

    def __repr__(self) -> str:
        return f"partitions({self.num_rows} rows, {self.partitions})"


def _index_hint(row_index: Any, name: Any) -> str:
    """Where a pandas frame's row index is named ``name``: say so (pandas'
    groupby takes an index level's name; here the rows' labels are not read)."""
    names = [] if row_index is None else [str(n) for n in row_index.names if n is not None]
    if str(name) not in names:
        return ""
    return (f" ({name!r} names a level of the frame's index, which is not read as a "
            "column: give df.reset_index())")


def _named_columns(table: Any, by: Any, order_by: Any, columns: Any
                   ) -> tuple[list, list, Any, list | None]:
    """``by``, ``order_by`` and ``columns`` as lists, checked; a pandas frame
    cut to ``columns`` by label before anything converts it (then no column
    list is left to read), else the columns to read."""
    by_columns = _column_list(by, "by")
    if not by_columns:
        raise ValueError("groups() needs at least one column in by=")
    twice = named_twice(by_columns)
    if twice is not None:
        raise ValueError(f"by= names the column {twice!r} twice")
    order_columns = _column_list(order_by, "order_by") if order_by is not None else []
    twice = named_twice(order_columns)
    if twice is not None:
        raise ValueError(f"order_by= names the column {twice!r} twice")
    if columns is None:
        return by_columns, order_columns, table, None
    wanted = _column_list(columns, "columns")
    if not wanted:
        raise ValueError("columns= names no column; leave it out to read them all")
    wanted = list(dict.fromkeys(by_columns + order_columns + wanted))
    if is_pandas_frame(table):  # select by label, before anything is converted
        absent = [c for c in wanted if c not in table.columns]
        if absent:
            raise ValueError(f"column {absent[0]!r} is not in the table; "
                             f"its columns are {list(table.columns)}")
        return by_columns, order_columns, table.loc[:, [c for c in table.columns
                                                         if c in wanted]], None
    return by_columns, order_columns, table, wanted


def _column_list(names: Any, what: str) -> list:
    """A column name or a sequence of them (a list, a tuple, a NumPy array,
    a pandas Index such as ``df.columns[:2]``), as a list of Python values
    (a set has no order to read the columns in, a dict is no list of names,
    and a name must be hashable: each refused, naming ``what``)."""
    if isinstance(names, (set, frozenset, Mapping)):
        raise TypeError(f"{what}= must be a column name or a list of them, not a "
                        f"{type(names).__name__}" + (" (which has no order)"
                                                     if not isinstance(names, Mapping) else ""))
    if isinstance(names, str) or getattr(names, "ndim", None) == 0:  # (a 0-d array: its value)
        values = [names]
    elif isinstance(names, Sequence) or isinstance(names, Iterable) and hasattr(names, "ndim"):
        values = list(names)  # (an array, an Index, a Series: their values)
    else:
        values = [names]
    values = [plain_scalar(value) for value in values]
    for value in values:
        if not isinstance(value, Hashable) or isinstance(value, tuple) and not all(
                isinstance(part, Hashable) for part in value):
            raise TypeError(f"{what}= must be a column name or a list of them; it holds "
                            f"{value!r}, a {type(value).__name__}")
    return values


def groups(
    table: Any,
    by: str | Sequence[str],
    *,
    format: str = "pandas",
    cost: Callable[[int], float] | None = None,
    read_on_workers: bool = False,
    order_by: str | Sequence[str] | None = None,
    columns: Sequence[str] | None = None,
    staging: str | None = None,
) -> GroupSource:
    """One task per group of ``table``'s rows, keyed by the ``by`` columns.

    ``table`` is a pandas or polars DataFrame, a pyarrow Table, or a path to a
    Parquet/CSV file or a directory of them. ``fit`` receives each group's rows
    as ``format``: ``"pandas"`` (default), ``"arrow"``, ``"polars"``, or
    ``"numpy"`` (a dict of column name to array). ``cost`` maps a group's row
    count to its expected cost (default: the row count) for longest-first
    scheduling.

    ``read_on_workers=True`` (a Parquet file or directory only): the driver
    reads just the ``by`` columns to plan the groups, and each batch of tasks
    reads its own groups' rows on its worker, so the driver never holds a
    table larger than its memory (on Ray, every node must see the same path).
    Files not in key order are sorted once, one file and one bucket of rows
    at a time, into Arrow files under ``staging`` that the workers map (give
    a directory every node sees on a cluster of several machines, or an
    object store's URI, ``"s3://bucket/staging"``, whose objects the workers
    read a record batch at a time).

    ``order_by`` (a column or a list of them): each group's rows reach ``fit``
    sorted by it (ascending, stable, missing values last), as a time series
    needs them, whatever the input's row order; without it they keep the
    input's order. ``columns``: read only these columns (plus the ``by`` and
    ``order_by`` ones) -- from a Parquet or CSV file the others are never
    read; a column the table lacks is named in the error.

    ``table`` may also be a Spark or a Dask DataFrame, or a Ray Dataset: its
    engine groups it (one shuffle by key), its workers sort and write each
    partition once, and the driver gets one small row per group, never the
    rows. ``staging``: the directory the engine's workers write to and the
    training workers read from -- one every node sees on a cluster of
    several machines, or an object store's URI (default: a temporary
    directory here, removed with the source).
    """
    return GroupSource(table, by, format=format, cost=cost,
                       read_on_workers=read_on_workers, order_by=order_by, columns=columns,
                       staging=staging)
