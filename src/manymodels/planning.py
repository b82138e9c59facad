"""The planner: from a source to a list of tasks.

A task is a key, a cheap reference to its data and a cost estimate. For a
group source the table is sorted by key once, and each group becomes an
``(offset, length)`` slice of the sorted table, so that a task carries two
integers instead of a DataFrame, and the sorted table can be shared with the
workers once (see :mod:`manymodels.dataplane`).
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from .sources import (
    GridSource,
    GroupSource,
    ItemSource,
    PartitionSource,
    ProductSource,
    Source,
)
from .tables import sort_order
from .taskdata import Items, ParquetReads, SettingsOnly, TableSlices, TaskData


@dataclass(slots=True)
class Task:
    """One unit of work: ``fit(data, **params, **shared)``."""

    index: int
    key: Hashable
    data: Any  # (offset, length) into the sorted table, an item, or None
    params: dict[str, Any] | None
    cost: float


@dataclass
class Plan:
    """Everything the scheduler needs to run a source."""

    data: TaskData  # what the tasks' data references are (see manymodels.taskdata)
    tasks: list[Task]
    key_columns: list[str]
    param_columns: list[str]
    key_rows: list[tuple] = field(default_factory=list)  # key column values per task
    #: Per task, the ``key=`` keyword ``fit`` gets (None: fit does not ask for it)
    fit_keys: list[Hashable] | None = None

    @property
    def kind(self) -> str:
        return self.data.kind

    def __len__(self) -> int:
        return len(self.tasks)


@dataclass
class GroupLayout:
    """A table sorted by its key columns, and where each group lies in it."""

    table: pa.Table
    offsets: np.ndarray
    lengths: np.ndarray
    keys: list[tuple]
    #: Each sorted row's position in the input table; None when the input was
    #: in key order already (``map_groups`` puts a transform's rows back)
    input_rows: np.ndarray | None = None


def group_layout(source: GroupSource) -> GroupLayout:
    """Sort ``source``'s table by key once (stable, so rows keep their order
    within a group; with ``order_by``, one sort by key then those columns)
    and find each group's slice. Cached on the source."""
    if source._layout is not None:
        return source._layout
    keys_frame = source.table.select(source.by).to_pandas()
    codes = keys_frame.groupby(source.by, sort=True, dropna=False).ngroup().to_numpy()
    order_by = getattr(source, "order_by", None)
    if order_by and source.reader is None:  # (read on workers: each batch sorts its rows)
        order = sort_order(source.table, order_by, codes).to_numpy()
    else:
        order = np.argsort(codes, kind="stable")
    lengths = np.bincount(codes)
    offsets = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    if np.all(order[1:] > order[:-1]):
        table, order = source.table, None  # already sorted: no copy
    else:
        table = source.table.take(pa.array(order))
    table = table.combine_chunks()
    key_table = table.select(source.by).take(pa.array(offsets))
    columns = [key_table.column(c).to_pylist() for c in source.by]
    keys = list(zip(*columns))
    source._layout = GroupLayout(table, offsets, lengths, keys, order)
    return source._layout


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


def plan(source: Source) -> Plan:
    """Turn ``source`` into tasks, numbered in source order."""
    base, grid_source = source, None
    if isinstance(source, ProductSource):
        base, grid_source = source.base, source.grid
    elif isinstance(source, GridSource):
        base, grid_source = None, source
    settings: list[dict[str, Any] | None] = (
        grid_source.combinations() if grid_source is not None else [None]
    )
    param_columns = grid_source.param_columns if grid_source is not None else []

    data: TaskData
    if isinstance(base, GroupSource) and base.reader is not None:
        data = ParquetReads(group_layout(base), base.reader, base.cost, base.format)
    elif isinstance(base, GroupSource):
        data = TableSlices(group_layout(base), base.cost, base.format, base.column_labels)
    elif isinstance(base, PartitionSource):
        data = TableSlices(partition_layout(base), None, base.format)
    elif isinstance(base, ItemSource):
        data = Items(base.keys, base.items, base.cost)
    elif base is None:
        data = SettingsOnly()
    else:
        raise TypeError(
            "source must be made by mm.groups(), mm.items(), mm.grid() or their "
            f"product; got {type(source).__name__}"
        )

    tasks: list[Task] = []
    key_rows: list[tuple] = []
    if settings == [None]:  # one task per entry: built in one pass (a million of them)
        entries = data.entries()
        key_rows = [parts for parts, _, _ in entries]
        tasks = [Task(index, _scalar_key(parts), ref, None, cost)
                 for index, (parts, ref, cost) in enumerate(entries)]
        return Plan(data=data, tasks=tasks, key_columns=source.key_columns,
                    param_columns=param_columns, key_rows=key_rows)
    for key_parts, ref, cost in data.entries():
        for params in settings:
            parts = key_parts + tuple(params.values()) if params else key_parts
            tasks.append(Task(len(tasks), _scalar_key(parts), ref, params, cost))
            key_rows.append(parts)
    return Plan(data=data, tasks=tasks, key_columns=source.key_columns,
                param_columns=param_columns, key_rows=key_rows)


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
    if width == 1:
        plan.fit_keys = [parts[0] for parts in plan.key_rows]
    else:
        plan.fit_keys = [parts[:width] for parts in plan.key_rows]
