"""The tables of an evaluation, made in the driver from the tasks' records.

``run.evaluation`` (and ``Store.evaluation``): one row per task and window
with its scores. ``run.forecasts`` (and ``Store.forecasts``): one row per
task, window and test row of a backtest, as statsforecast's
``cross_validation`` returns them: the key columns, the time, the cutoff,
the actual value and the forecast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ..inputs.keys import UTC_OFFSET, key_frame
from .splitters import WINDOWS
from .windowrows import STEP
from .windowtable import (
    DATED,
    ROW_COLUMNS,
    TEXT,
    as_table,
    holds_dates,
    time_zone,
    unpack_column,
    window_count,
)

_WINDOW_COLUMNS = ["window", "cutoff", "n_train", "n_test"]
_FORECAST_COLUMNS = ["window", "cutoff", "time", "actual", "forecast"]


def column_name(name: str, key_columns: list) -> str:
    """The name of an evaluation table's own column ``name`` (a score, the
    window, the cutoff, a forecast's time...): ``metric_<name>`` where a key
    column (a grid parameter ``window``, say) has that name, as
    ``run.results`` names a score so: the key column is kept as it is."""
    return f"metric_{name}" if name in key_columns else name


def _task_windows(key_rows: list[tuple], metrics: list[Any]
                  ) -> Iterator[tuple[int, tuple, dict[str, Any]]]:
    """Each task's index, key and windows table, from what its metrics slot
    holds (tasks with no windows left out)."""
    from ..engine.metriccolumns import texts_taken_out
    from ..engine.metricpacks import MetricsPack

    for index, (parts, stored) in enumerate(zip(key_rows, texts_taken_out(metrics))):
        if type(stored) is MetricsPack:  # floats only: no windows
            continue
        if isinstance(stored, str):  # a reused task's: the store's JSON
            if WINDOWS not in stored:
                continue
            stored = json.loads(stored)
        table = as_table((stored or {}).get(WINDOWS))
        if window_count(table):
            yield index, parts, table


def _as_times(frame: Any, column: str, zone: str | None = None) -> None:
    """A datetime time column's values travel as ISO text: back to datetimes;
    text with UTC offsets (times of a zone: offsets differ across a change
    to or from summer time) as the instants they are, in ``zone`` where the
    forecasts' times named it, else in UTC."""
    import pandas as pd

    values = frame[column].dropna()
    if len(values) and all(isinstance(c, str) and "T" in c for c in values.iloc[:100]):
        offsets = values.iloc[:100].str.contains(UTC_OFFSET.pattern, regex=True).all()
        try:
            times = pd.to_datetime(frame[column], utc=bool(offsets or zone))
        except (ValueError, TypeError):
            return
        frame[column] = times.dt.tz_convert(zone) if zone else times


def _as_dates(values: list) -> list:
    """Cutoffs of a ``datetime.date`` time column (ISO text as they travel) as dates."""
    import datetime

    return [datetime.date.fromisoformat(v) if isinstance(v, str) else v for v in values]


def _dated(table: dict[str, Any]) -> bool:
    """Whether a windows table's cutoffs are of ``datetime.date`` values: it
    says so (:data:`DATED`), or, as stores written before the mark show it,
    its forecast times are dates."""
    if any(table.get(DATED) or ()):
        return True
    rows = table.get("rows")
    return isinstance(rows, dict) and holds_dates(rows.get("time"))


def _text(table: dict[str, Any]) -> bool:
    """Whether a windows table's cutoffs are a text time column's values (to
    stay text): it says so (:data:`TEXT`), or, as stores written before the
    mark show it, its forecast times are text."""
    if any(table.get(TEXT) or ()):
        return True
    rows = table.get("rows")
    times = rows.get("time") if isinstance(rows, dict) else None
    return times is not None and not isinstance(times, dict) and len(times) > 0 and \
        isinstance(times[0], str)


def _zone_of(table: dict[str, Any]) -> str | None:
    """The zone of a windows table's forecast times (None: naive, or none kept)."""
    rows = table.get("rows")
    return time_zone(rows.get("time")) if isinstance(rows, dict) else None


def window_frame(key_columns: list, key_rows: list[tuple], metrics: list[Any],
                 key_table: Any = None) -> Any:
    """``run.evaluation``: the windows of every task, a row each, with its key
    (typed as the table's key columns where ``key_table`` has them)."""
    import pandas as pd

    tasks: list[int] = []
    keys: list[tuple] = []
    counts: list[int] = []
    columns: dict[str, list] = {}
    done = 0  # windows so far: a column a task lacks is None there
    zone, text = None, False
    for task, parts, table in _task_windows(key_rows, metrics):
        count = window_count(table)
        zone = zone or _zone_of(table)
        text = text or _text(table)
        tasks.append(task)
        keys.append(parts)
        counts.append(count)
        for name, values in table.items():
            if name in ("rows", DATED, TEXT):
                continue
            if name == "cutoff" and _dated(table):
                values = _as_dates(values)
            column = columns.get(name)
            if column is None:
                column = columns[name] = [None] * done
            elif len(column) < done:
                column.extend([None] * (done - len(column)))
            column.extend(values)
        done += count
    if not keys:
        return pd.DataFrame(columns=[*key_columns,
                                     *(column_name(c, key_columns) for c in _WINDOW_COLUMNS)])
    frame = _key_columns(key_columns, keys, counts,
                         _typed_keys(key_columns, key_rows, key_table, tasks))
    for name, column in columns.items():
        column.extend([None] * (done - len(column)))
        frame[column_name(name, key_columns)] = (
            column if name in _WINDOW_COLUMNS else _score_values(column))
    if not text:
        _as_times(frame, column_name("cutoff", key_columns), zone)
    return frame


def _score_values(values: list) -> Any:
    """A score's values as floats, None (undefined there) as NaN: a score
    undefined in every window (r2 of one test row) is a float column of
    NaN, as ``run.results`` has it, not one of None objects."""
    import numpy as np

    try:
        return np.asarray(values, dtype=float)
    except (TypeError, ValueError):  # (a store's score of another kind): as it is
        return values


def _typed_keys(key_columns: list, key_rows: list[tuple], key_table: Any,
                tasks: list[int]) -> Any:
    """The keys of ``tasks`` typed as the table's key columns, or None where
    the tasks are not a table's groups."""
    if key_table is None:
        return None
    return key_frame(key_columns, key_rows, key_table).take(tasks)


def _key_columns(key_columns: list, keys: list[tuple], counts: Any, typed: Any = None) -> Any:
    """A frame of the key columns, task ``i``'s key repeated ``counts[i]`` times:
    ``typed``'s rows where given, else each column typed from the tasks'
    keys, then repeated (not a Python object a row to type)."""
    import numpy as np
    import pandas as pd

    counts = np.asarray(counts)
    if typed is not None:
        return typed.take(np.repeat(np.arange(len(counts)), counts)).reset_index(drop=True)
    if not counts.all():  # a task with no rows: its key types nothing
        keys = [parts for parts, count in zip(keys, counts) if count]
        counts = counts[counts > 0]
    rows = np.repeat(np.arange(len(keys)), counts)
    frame = pd.DataFrame(index=pd.RangeIndex(len(rows)))
    for i, name in enumerate(key_columns):
        values = np.empty(len(keys), dtype=object)
        for j, parts in enumerate(keys):
            values[j] = parts[i]  # one by one: a key part may be a tuple
        frame[name] = pd.Series(values).infer_objects().array.take(rows)
    return frame


def _repeated_times(values: list, counts: list[int], zone: str | None, text: bool) -> Any:
    """Per-window times (a cutoff each, ISO text when they are datetimes,
    unless ``text``: a text time column's own), each repeated for its
    window's rows, converted once a window; numbers typed as numbers."""
    import numpy as np
    import pandas as pd

    column = np.empty(len(values), dtype=object)
    column[:] = values
    frame = pd.DataFrame({"time": column})
    if not text:
        _as_times(frame, "time", zone)
    times = frame["time"]
    if times.dtype == object:  # whole numbers or floats: int64 or float64, as the times
        times = times.infer_objects()
    return times.array.take(np.repeat(np.arange(len(values)), counts))


def forecast_frame(key_columns: list, key_rows: list[tuple], metrics: list[Any],
                   key_table: Any = None) -> Any:
    """``run.forecasts``: every backtest window's test rows with their time,
    cutoff, actual value and forecast, in the tasks' and windows' order (the
    keys typed as the table's key columns where ``key_table`` has them)."""
    import numpy as np
    import pandas as pd

    tasks, keys, totals, windows, cutoffs, sizes = [], [], [], [], [], []
    zone, text = None, False
    columns: dict[str, list] = {name: [] for name in ROW_COLUMNS}
    shared: dict[int, Any] = {}  # a group's times and actuals, the same for its candidates
    for task, parts, table in _task_windows(key_rows, metrics):
        rows = table.get("rows")
        if not rows:
            continue
        for name in ROW_COLUMNS:
            packed = rows[name]
            if name == "forecast":  # each task's own
                columns[name].append(unpack_column(packed))
                continue
            values = shared.get(id(packed))
            if values is None or values[0] is not packed:  # (kept: its id is not reused)
                values = shared[id(packed)] = (packed, unpack_column(packed))
            columns[name].append(values[1])
        zone = zone or time_zone(rows["time"])
        text = text or _text(table)
        tasks.append(task)
        keys.append(parts)
        totals.append(len(columns["forecast"][-1]))
        windows.extend(table["window"])
        cutoffs.extend(_as_dates(table["cutoff"]) if _dated(table) else table["cutoff"])
        sizes.extend(table["n_test"])
    named = {name: column_name(name, key_columns) for name in _FORECAST_COLUMNS}
    if not keys:
        return pd.DataFrame(columns=[*key_columns, *named.values()])
    frame = _key_columns(key_columns, keys, totals,
                         _typed_keys(key_columns, key_rows, key_table, tasks))
    frame[named["window"]] = np.repeat(np.array(windows), sizes)
    frame[named["cutoff"]] = _repeated_times(cutoffs, sizes, zone, text)
    for name, pieces in columns.items():
        frame[named[name]] = np.concatenate(pieces)
    if zone is not None:  # the times of a zone travelled as UTC
        time = named["time"]
        frame[time] = frame[time].dt.tz_localize("UTC").dt.tz_convert(zone)
    return frame


def forecast_steps(key_columns: list, key_rows: list[tuple], metrics: list[Any],
                   by: list[str]) -> dict[str, str]:
    """Each group's time step as its backtest read it from all its times
    (:func:`.frequency.time_step`), by the encoded key of its ``by``
    columns: a store's window times alone are too few to tell some steps
    apart. Stores written before kept none: empty."""
    from ..inputs.keys import encode_key

    if any(name not in key_columns for name in by):
        return {}
    positions = [key_columns.index(name) for name in by]
    found: dict[str, str] = {}
    for _, parts, table in _task_windows(key_rows, metrics):
        rows = table.get("rows")
        step = rows.get(STEP) if isinstance(rows, dict) else None
        if step:
            found.setdefault(encode_key(tuple(parts[p] for p in positions)), step)
    return found
