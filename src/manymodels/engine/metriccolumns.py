"""Tasks' metrics read as columns: for the results table and the store.

A run's per-task metrics slots hold, task by task, a dict (what ``fit``
returned, in the driver's own workers), the store's JSON text (a reused
task's, or a worker's for a store when its metrics did not fit a pack), or
the :class:`~manymodels.engine.partpacks.MetricsPack` of the part the task ran in
(worker processes: every task of a part that reports the same float metrics).
The two readers here take each pack once, as an array, and the rest one at a
time: a million tasks in a few dozen packs cost a few array operations, not
a million dicts.

The store keeps metrics as JSON objects. For a pack's rows the text is made
by Arrow (:func:`float_texts`), in the worker that made the pack when a store
will keep it (else here, when asked): the shortest decimal that reads back as the
same float, as ``repr`` writes it, though not always in the same notation
(``0.00001`` where ``repr`` says ``1e-05``); ``json.loads`` and Arrow's JSON
reader give back the very same floats.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..inputs.tables import one_array
from .metricpacks import MetricsPack, MetricTexts
from .metrictext import metrics_json, pack_texts
from .partpacks import distinct_objects


def _by_object(entries: Sequence[Any], kind: type = MetricsPack
               ) -> tuple[list[tuple[Any, np.ndarray]], np.ndarray]:
    """The objects of type ``kind`` (:class:`MetricsPack`) ``entries`` name,
    in order of their first positions, each with the positions that name it;
    and, apart, the positions whose entry is anything else (a dict, text,
    None)."""
    first, inverse = distinct_objects(entries)
    is_pack = np.fromiter((type(entries[at]) is kind for at in first.tolist()),
                          dtype=bool, count=len(first))
    in_pack = is_pack[inverse]
    rest = np.flatnonzero(~in_pack)
    if not is_pack.any():
        return [], rest
    rows = np.flatnonzero(in_pack)
    order = rows[np.argsort(inverse[rows], kind="stable")]  # grouped by object
    distinct = np.flatnonzero(is_pack)  # in the order of ``order``
    counts = np.bincount(inverse[rows], minlength=len(first))[distinct]
    groups = np.split(order, np.cumsum(counts)[:-1])
    packs = [(entries[int(first[d])], group) for d, group in zip(distinct, groups)]
    packs.sort(key=lambda pack: int(pack[1][0]))
    return packs, rest


def _text(entry: Any, task: int) -> str | None:
    """One task's slot as the store's JSON text (None: no metrics)."""
    if entry is None or type(entry) is str:
        return entry
    return entry.text(task) if type(entry) is MetricTexts else metrics_json(entry)


def metrics_texts(entries: Sequence[Any], task_index: Sequence[int] | np.ndarray,
                  packs_used: list[MetricsPack] | None = None) -> pa.Array:
    """The store's ``metrics`` column for tasks ``task_index``, whose slots
    are ``entries``: JSON text, null where a task has none. The packs the
    slots name are added to ``packs_used``, when given."""
    count = len(entries)
    packs, rest = _by_object(entries)
    if packs_used is not None:
        packs_used.extend(pack for pack, _ in packs)
    if not packs:
        return pa.array(list(map(_text, entries, task_index)), pa.string())
    tasks = np.asarray(task_index, dtype=np.int64)
    pieces, positions = [], []
    for pack, where in packs:
        wanted = tasks[where]
        texts = pack.texts_of(wanted)  # made by the worker, or here
        pieces.append(pack_texts(pack.names, pack.rows_of(wanted)) if texts is None else texts)
        positions.append(where)
    if len(rest):
        pieces.append(pa.array([_text(entries[i], tasks[i]) for i in rest.tolist()],
                               pa.string()))
        positions.append(rest)
    # back into the rows' order: row r's text is at place[r] of the joined pieces
    order = np.concatenate(positions)
    joined = pa.concat_arrays([p.cast(pa.string()) for p in pieces])
    if (order == np.arange(count)).all():  # the packs' rows in order (the usual case)
        return joined
    place = np.empty(count, dtype=np.int64)
    place[order] = np.arange(count)
    return joined.take(pa.array(place))


def metric_columns(entries: Sequence[Any]) -> dict[str, Any]:
    """Each metric's values by name, in order of first appearance, for tasks
    ``0..n-1`` whose slots are ``entries``: an array of floats (NaN where a
    task has not that metric) for a metric only packs hold, else a list
    (None where a task has it not)."""
    count = len(entries)
    packs, rest = _by_object(entries)
    columns: dict[str, Any] = {}
    first_seen: dict[str, int] = {}  # the first task that has each metric
    for pack, where in packs:
        rows = pack.rows_of(where)
        for position, name in enumerate(pack.names):
            if name not in columns:
                columns[name] = np.full(count, np.nan)
                first_seen[name] = int(where[0])
            columns[name][where] = rows[:, position]
    if not len(rest):
        return columns
    others = texts_taken_out([entries[i] for i in rest.tolist()], rest)
    if all(m is None or type(m) is str for m in others):
        # a store's JSON text (reused tasks): Arrow's JSON reader parses it at once
        parsed = text_columns(pa.array(others, pa.string()))
        has = {name: next((at for at, v in enumerate(values) if v is not None), 0)
               for name, values in parsed.items()}
    else:
        dicts = [json.loads(m) if type(m) is str else m for m in others]
        has = {}
        for at, m in enumerate(dicts):
            for name in m or ():
                has.setdefault(name, at)
        parsed = {name: [m.get(name) if m else None for m in dicts] for name in has}
    for name, at in has.items():
        seen = int(rest[at])
        first_seen[name] = min(first_seen.get(name, seen), seen)
    columns = _in_order_of(columns, first_seen)
    for name, values in parsed.items():
        column = columns.get(name)
        if column is None:
            filled: list[Any] = [None] * count
        else:  # a metric packs hold too: as a list, None where no task has it
            covered = np.zeros(count, dtype=bool)
            for pack, where in packs:
                if name in pack.names:
                    covered[where] = True
            filled = [v if c else None for v, c in zip(column.tolist(), covered.tolist())]
        for i, value in zip(rest.tolist(), values):
            filled[i] = value
        columns[name] = filled
    return _in_order_of(columns, first_seen)


def text_columns(texts: pa.ChunkedArray | pa.Array) -> dict[str, list]:
    """Each metric's values, by name in order of first appearance, from the
    tasks' metrics as JSON objects (None where a task has not that metric):
    parsed at once by Arrow's JSON reader when every value is a plain
    number, string or bool, else one object at a time with ``json``."""
    import io

    import pyarrow.json as pajson

    texts = one_array(texts)
    if len(texts) and texts.null_count < len(texts):
        lines = pc.fill_null(texts, "{}")
        try:
            if pc.any(pc.match_substring_regex(lines, "\n|[0-9]{19}")).as_py():
                # one object per line below; an int past 64 bits would turn float
                raise ValueError("a line break or a large int in a metric")
            parsed = pajson.read_json(io.BytesIO("\n".join(lines.to_pylist()).encode()),
                                      read_options=pajson.ReadOptions(block_size=1 << 26))
            if parsed.num_rows == len(texts) and all(
                    pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
                    or pa.types.is_boolean(f.type) or pa.types.is_string(f.type)
                    or pa.types.is_null(f.type) for f in parsed.schema):
                return {name: parsed[name].to_pylist() for name in parsed.column_names}
        except (pa.ArrowException, ValueError):  # NaN, a nested value: as json reads it
            pass
    metrics = [json.loads(m) if m else {} for m in texts.to_pylist()]
    names: dict[str, None] = {}
    for m in metrics:
        names.update(dict.fromkeys(m))
    return {name: [m.get(name) for m in metrics] for name in names}


def texts_taken_out(entries: Sequence[Any], tasks: np.ndarray | None = None
                    ) -> Sequence[Any]:
    """``entries`` (the slots of tasks ``tasks``, default ``0..n-1``) with
    each slot that names a :class:`MetricTexts` holding its task's text
    instead (all of one object's taken at once)."""
    stored, _ = _by_object(entries, MetricTexts)
    if not stored:
        return entries
    entries = list(entries)
    for texts, where in stored:
        numbers = where if tasks is None else tasks[where]
        for index, text in zip(where.tolist(), texts.texts_of(numbers).to_pylist()):
            entries[index] = text
    return entries


def _in_order_of(columns: dict[str, Any], first_seen: dict[str, int]) -> dict[str, Any]:
    """``columns`` by the first task that has each (then by name's arrival)."""
    names = sorted(first_seen, key=first_seen.__getitem__)  # (stable: ties keep order)
    return {name: columns[name] for name in names if name in columns} | {
        name: column for name, column in columns.items() if name not in first_seen}


def metric_column_names(names: Iterable[str], taken: Collection[str]) -> dict[str, str]:
    """Metric name -> the column it gets in a results table whose own columns
    are ``taken`` (keys, ``status``...): its name, or, where the table has a
    column of that name, ``metric_<name>``, prefixed again while that too is
    a column or another metric's name. A metric is never written over: a fit
    returning ``status`` and ``metric_status`` keeps both, its own
    ``metric_status`` under that name (the names kept as they are are
    placed first) and ``status`` as ``metric_metric_status``. What
    ``Run.results`` and ``Store.results`` both name their columns by."""
    names = list(names)
    kept = [name for name in names if name not in taken]
    used = {*taken, *kept}
    columns: dict[str, str] = {}
    for name in names:
        column = name
        if name in taken:
            column = f"metric_{name}"
            while column in used:
                column = f"metric_{column}"
            used.add(column)
        columns[name] = column
    return columns
