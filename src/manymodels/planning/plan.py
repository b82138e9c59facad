"""The planner: from a source to a list of tasks.

A task is a key, a cheap reference to its data and a cost estimate. For a
group source the table is sorted by key once, and each group becomes an
``(offset, length)`` slice of the sorted table, so that a task carries two
integers instead of a DataFrame, and the sorted table can be shared with the
workers once (see :mod:`manymodels.engine.dataplane`).

The tasks are kept as columns (:class:`TaskList`): a million groups are two
arrays of offsets and lengths and one of costs, not a million objects (they
took 330 MB of the driver and 0.6 s to build); a :class:`Task` is made only
when one is asked for by position.
"""

from __future__ import annotations

import operator
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.engineframes import nested_key_error
from ..inputs.grids import MOST_SETTINGS, GridSource, ProductSource
from ..inputs.itemsource import ItemSource
from ..inputs.keys import as_run_keys
from ..inputs.sources import GroupSource, PartitionSource, Source
from ..inputs.tables import exact_pandas, presorted_group_lengths, sort_order
from .sortedreads import sort_once
from .staging import stage
from .taskdata import Items, ParquetReads, SettingsOnly, StagedSlices, TableSlices, TaskData

#: The most tasks a run without a grid plans (its keys are Arrow columns
#: where they can be; a grid's tasks are held as Python objects: see
#: :data:`~manymodels.inputs.grids.MOST_SETTINGS`).
MOST_TASKS = 100_000_000


@dataclass(slots=True)
class Task:
    """One unit of work: ``fit(data, **params, **shared)``."""

    index: int
    key: Hashable
    data: Any  # (offset, length) into the sorted table, an item, or None
    params: dict[str, Any] | None
    cost: float


def _take(refs: Sequence, positions: Sequence[int]) -> list:
    take = getattr(refs, "take", None)
    return take(positions) if take is not None else [refs[i] for i in positions]


class TaskList(Sequence):
    """A plan's tasks as columns: each task's key parts (``key_rows``), data
    reference (``refs``), parameters (``params``; None when no task has any)
    and cost (``costs``, an array: the groups' lengths themselves when the
    cost is the length, not a float copy of them, 8 bytes a task held
    through a run). Indexing makes the :class:`Task`; the scheduler and the
    hashing read the columns."""

    __slots__ = ("key_rows", "refs", "params", "costs")

    def __init__(self, key_rows: list[tuple], refs: Sequence, params: list | None,
                 costs: np.ndarray) -> None:
        self.key_rows, self.refs, self.params = key_rows, refs, params
        self.costs = costs if isinstance(costs, np.ndarray) and costs.dtype.kind in "iuf" \
            else np.asarray(costs, dtype=np.float64)

    def __len__(self) -> int:
        return len(self.costs)

    def __getitem__(self, position: Any) -> Any:
        if isinstance(position, slice):
            return [self[i] for i in range(*position.indices(len(self)))]
        index = operator.index(position)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"task {position} of {len(self)}")
        params = self.params[index] if self.params is not None else None
        return Task(index, _scalar_key(self.key_rows[index]), self.refs[index], params,
                    float(self.costs[index]))

    def __iter__(self) -> Iterator[Task]:
        return (self[index] for index in range(len(self)))

    def keys(self) -> list[Hashable]:
        """Every task's key (a scalar for one key column, else a tuple)."""
        return [_scalar_key(parts) for parts in self.key_rows]

    def batch(self, positions: list[int], fit_keys: list | None) -> Sequence[tuple]:
        """The ``(index, data reference, params)`` a worker runs, for ``positions``
        (a table's groups without parameters: as columns, a
        :class:`~manymodels.engine.messages.SliceBatch`); with ``fit_keys``, each
        task's ``key=`` joins its parameters."""
        if self.params is None and fit_keys is None:
            as_columns = getattr(self.refs, "batch", None)  # a table's groups: as arrays
            if as_columns is not None:
                return as_columns(positions)
            return list(zip(positions, _take(self.refs, positions), [None] * len(positions)))
        refs = _take(self.refs, positions)
        params = ([self.params[i] for i in positions] if self.params is not None
                  else [None] * len(positions))
        if fit_keys is not None:  # fit asked for its key (add_fit_keys)
            params = [{**p, "key": fit_keys[i]} if p else {"key": fit_keys[i]}
                      for p, i in zip(params, positions)]
        return list(zip(positions, refs, params))


@dataclass
class Plan:
    """Everything the scheduler needs to run a source."""

    data: TaskData  # what the tasks' data references are (see manymodels.planning.taskdata)
    tasks: TaskList
    key_columns: list[str]
    param_columns: list[str]
    #: Per task, the ``key=`` keyword ``fit`` gets (None: fit does not ask for it)
    fit_keys: list[Hashable] | None = None
    #: The tasks' keys as Arrow columns, when each task is one group of a table
    #: (a store encodes a million keys from these at once)
    key_table: pa.Table | None = None
    #: A table's groups' keys as Arrow columns, a row per group, when each
    #: task is one group and one grid setting (the tasks group by group)
    group_key_table: pa.Table | None = None
    #: Hand out tasks of equal cost in key order even where the data lies
    #: otherwise (``map_groups`` of an engine's DataFrame: its outputs, read
    #: back in key order, then lie in few files, not in every one)
    in_key_order: bool = False

    @property
    def kind(self) -> str:
        return self.data.kind

    @property
    def key_rows(self) -> list[tuple]:
        """Each task's key column values (its grid settings included)."""
        return self.tasks.key_rows

    def typed_keys(self) -> pa.Table | None:
        """The first columns of each task's key as the table's own Arrow
        columns, a row per task (a group's repeated for each of its grid
        settings), or None where the tasks are not a table's groups."""
        if self.key_table is not None:
            return self.key_table
        groups = self.group_key_table
        if groups is None or not groups.num_rows or len(self) % groups.num_rows:
            return None
        settings = len(self) // groups.num_rows
        return groups.take(pa.array(np.repeat(np.arange(groups.num_rows), settings)))

    def __len__(self) -> int:
        return len(self.tasks)


class KeyRows(Sequence):
    """Each group's key as a tuple of Python values, made from the groups'
    Arrow key columns when first asked for. A million keys as tuples are
    about 85 MB that a run does not need (a store encodes its keys from the
    columns, the scheduler names tasks by index): the results table, a
    failure's message or ``run.models`` make them after."""

    __slots__ = ("_table", "_rows")

    def __init__(self, table: pa.Table) -> None:
        self._table = table
        self._rows: list[tuple] | None = None

    def _list(self) -> list[tuple]:
        if self._rows is None:
            self._rows = list(zip(*(column.to_pylist() for column in self._table.columns)))
        return self._rows

    def __len__(self) -> int:
        return self._table.num_rows

    def __getitem__(self, position: Any) -> Any:
        return self._list()[position]

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._list())

    def __eq__(self, other: object) -> bool:
        return self._list() == (list(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple:
        return (KeyRows, (self._table,))


@dataclass
class GroupLayout:
    """A table sorted by its key columns, and where each group lies in it."""

    table: pa.Table
    offsets: np.ndarray
    lengths: np.ndarray
    keys: Sequence[tuple]  # a list, or KeyRows
    #: Each sorted row's position in the input table; None when the input was
    #: in key order already (``map_groups`` puts a transform's rows back)
    input_rows: np.ndarray | None = None
    #: The groups' keys as Arrow columns (one row per group), when grouped by columns
    key_table: pa.Table | None = None


def group_layout(source: GroupSource) -> GroupLayout:
    """Sort ``source``'s table by key once (stable, so rows keep their order
    within a group; with ``order_by``, one sort by key then those columns)
    and find each group's slice. Cached on the source."""
    if source._layout is not None:
        return source._layout
    for name in source.by:
        _check_key_type(name, source.table.column(name))
    order_by = getattr(source, "order_by", None)
    # (read on workers: each batch sorts its rows by order_by, which the driver has not)
    lengths = presorted_group_lengths(source.table, source.by,
                                      order_by if source.reader is None else None)
    order: np.ndarray | None = None  # None: the table is in key order already
    if lengths is None:
        keys_frame = exact_pandas(source.table.select(source.by))
        codes = keys_frame.groupby(source.by, sort=True, dropna=False,
                                   observed=True).ngroup().to_numpy()
        if order_by and source.reader is None:  # (read on workers: each batch sorts its rows)
            order = sort_order(source.table, order_by, codes).to_numpy()
        else:
            order = np.argsort(codes, kind="stable")
        lengths = np.bincount(codes)
        if np.all(order[1:] > order[:-1]):
            order = None  # already sorted: no copy
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    table = source.table if order is None else source.table.take(pa.array(order))
    table = table.combine_chunks()
    key_table = table.select(source.by).take(pa.array(offsets))
    source._layout = GroupLayout(table, offsets, lengths, KeyRows(key_table), order, key_table)
    return source._layout


def staged_layout(source: GroupSource) -> tuple[Any, KeyRows]:
    """A Spark or Dask DataFrame's groups, made by its engine once
    (:mod:`.staging`), and their keys. Cached on the source, as a table's
    layout is: the engine's job runs once for the source."""
    if source._layout is None:
        staged = stage(source.engine_frame, source.by, source.order_by)
        for name in source.by:
            _check_key_type(name, staged.key_table.column(name))
        source._layout = staged
    return source._layout, KeyRows(source._layout.key_table)


def _parquet_reads(source: GroupSource) -> TaskData:
    """``read_on_workers``: each batch scans the files for its groups where
    the files are in key order; otherwise their rows are sorted once into
    files the workers map (:mod:`.sortedreads`), cached on the source."""
    layout = group_layout(source)
    scans = ParquetReads(layout, source.reader, source.cost, source.format)
    if layout.input_rows is None:
        return scans
    sorted_groups = getattr(source, "_sorted_groups", None)
    if sorted_groups is None:
        from ..identity.rowhash import lanes_of

        refs = [ref for _, ref, _ in scans.entries()]
        lanes = np.array([lanes_of(h) for h in scans.hashes(refs)],
                         dtype=np.uint64).reshape(-1, 2)
        sorted_groups = sort_once(layout, source.reader, lanes, source.staging)
        source._sorted_groups = sorted_groups
    return StagedSlices(sorted_groups, layout.keys, source.cost, source.format)


def _check_key_type(name: str, column: Any) -> None:
    """Refuse a ``by`` column whose values cannot be keys as they are."""
    kind = column.type
    if pa.types.is_nested(kind) or pa.types.is_dictionary(kind) and pa.types.is_nested(
            kind.value_type):
        raise nested_key_error(name, kind)
    if isinstance(kind, pa.BaseExtensionType):  # pandas' Period and Interval, say
        raise ValueError(f"by column {name!r} holds {kind.extension_name} values, which "
                         f"become their storage ({kind.storage_type}) as keys: convert the "
                         "column to text or to timestamps first (.astype(str), "
                         ".dt.to_timestamp())")
    if pa.types.is_float16(kind) or pa.types.is_dictionary(kind) and pa.types.is_float16(
            kind.value_type):
        raise ValueError(f"by column {name!r} holds half-precision floats (float16), which "
                         "cannot be grouped: cast it to float32 or float64 first")
    if pa.types.is_time64(kind) and kind.unit == "ns":
        try:
            pc.cast(column, pa.time64("us"))
        except pa.ArrowInvalid:
            raise ValueError(f"by column {name!r} holds times of day with nanoseconds, which "
                             "a Python time (a key's value) cannot hold: cast it to "
                             "time64('us') or to text first") from None


def partition_layout(source: PartitionSource) -> GroupLayout:
    """Split a table into ``source.partitions`` runs of rows of near-equal size."""
    table = source.table
    if isinstance(table, pa.Table):
        table = table.combine_chunks()
    bounds = np.linspace(0, source.num_rows, source.partitions + 1).astype(np.int64)
    offsets, lengths = bounds[:-1], np.diff(bounds)
    return GroupLayout(table, offsets, lengths, [(i,) for i in range(len(offsets))])


def _scalar_key(parts: tuple) -> Hashable:
    return parts[0] if len(parts) == 1 else parts


def _check_task_count(entries: int, grid_source: GridSource | None) -> None:
    """Refuse, before the settings are made, more tasks than a run plans:
    :data:`~manymodels.inputs.grids.MOST_SETTINGS` where a grid makes them
    (each task's setting and key are Python objects, about 300 bytes a
    task while planned), :data:`MOST_TASKS` without one."""
    if grid_source is None:
        if entries > MOST_TASKS:
            raise ValueError(f"{entries:,} groups or items make more tasks than a run "
                             f"plans ({MOST_TASKS:,}): run them in parts")
        return
    if entries * len(grid_source) > MOST_SETTINGS:
        raise ValueError(f"{entries:,} groups or items times {len(grid_source):,} grid "
                         f"settings make more tasks than a run of a grid plans "
                         f"({MOST_SETTINGS:,}): narrow the grid, or run it in parts")


def plan(source: Source) -> Plan:
    """Turn ``source`` into tasks, numbered in source order."""
    base, grid_source = source, None
    if isinstance(source, ProductSource):
        base, grid_source = source.base, source.grid
    elif isinstance(source, GridSource):
        base, grid_source = None, source
    param_columns = grid_source.param_columns if grid_source is not None else []

    data: TaskData
    if isinstance(base, GroupSource) and base.engine_frame is not None:
        data = StagedSlices(*staged_layout(base), base.cost, base.format)
    elif isinstance(base, GroupSource) and base.reader is not None:
        data = _parquet_reads(base)
    elif isinstance(base, GroupSource):
        data = TableSlices(group_layout(base), base.cost, base.format, base.column_labels)
    elif isinstance(base, PartitionSource):
        data = TableSlices(partition_layout(base), None, base.format, positions=True)
    elif isinstance(base, ItemSource):
        data = Items(base.keys, base.items, base.cost)
    elif base is None:
        data = SettingsOnly()
    else:
        raise TypeError(
            "source must be made by mm.groups(), mm.items(), mm.grid() or their "
            f"product; got {type(source).__name__}"
        )

    cost = getattr(base, "cost", None)
    try:
        key_rows, refs, costs = data.task_columns()
    except (TypeError, ValueError) as exc:
        if cost is None or "cost=" in str(exc):  # (not a cost's error, or named already)
            raise
        raise ValueError(f"cost= (each task's expected cost, a number) failed: "
                         f"{exc}") from exc
    _check_task_count(len(key_rows), grid_source)
    settings: list[dict[str, Any] | None] = (  # (once their number is known to fit)
        grid_source.combinations() if grid_source is not None else [None]
    )
    if settings == [None]:  # one task per entry, as columns (a million of them)
        tasks = TaskList(key_rows, refs, None, costs)
        layout = getattr(data, "layout", None)
        return Plan(data=data, tasks=tasks, key_columns=source.key_columns,
                    param_columns=param_columns,
                    key_table=getattr(layout, "key_table", None))
    count = len(settings)
    task_costs = np.repeat(costs, count)
    setting_costs = grid_source.costs(settings) if grid_source is not None else None
    if setting_costs is not None:  # a group's (or item's) cost times its setting's
        task_costs = task_costs * np.tile(np.asarray(setting_costs, dtype=float),
                                          len(key_rows))
    rows: list[tuple] = []
    for key_parts in key_rows:
        for params in settings:
            rows.append(key_parts + tuple(params.values()) if params else key_parts)
    entry_of = np.repeat(np.arange(len(key_rows), dtype=np.int64), count)
    tasks = TaskList(rows, _take(refs, entry_of.tolist()), settings * len(key_rows),
                     task_costs)
    return Plan(data=data, tasks=tasks, key_columns=source.key_columns,
                param_columns=param_columns,
                group_key_table=getattr(getattr(data, "layout", None), "key_table", None))


def asks_for_key(fit: Any) -> bool:
    """Whether ``fit`` names a ``key`` parameter (looked at once, on the driver;
    a ``**kwargs`` catch-all does not count: ``key=`` would surprise it)."""
    import inspect

    try:
        parameter = inspect.signature(fit).parameters.get("key")
    except (TypeError, ValueError):  # a builtin or an object with no signature
        return False
    return parameter is not None and parameter.kind in (
        inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def add_fit_keys(plan: Plan, fit: Any, passed: set[str]) -> None:
    """Give each task its ``key=`` keyword when ``fit`` asks for one: the
    group's key (a scalar for one ``by`` column, a tuple for several; an
    item's key), without the grid's settings, which ``fit`` gets anyway. Not
    when a grid setting, a shared object or a setup resource is named ``key`` (that one is
    passed), nor for a bare grid (its tasks have no key besides the settings).
    ``passed``: the names of the shared objects and setup resources."""
    if plan.kind == "grid" or not asks_for_key(fit):
        return
    if "key" in plan.param_columns or "key" in passed:
        return
    width = len(plan.key_columns) - len(plan.param_columns)
    rows = as_run_keys(plan.key_rows)  # (a time as a Timestamp, whatever Arrow gave)
    if width == 1:
        plan.fit_keys = [parts[0] for parts in rows]
    else:
        plan.fit_keys = [parts[:width] for parts in rows]
