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

from .splitters import WINDOWS

_WINDOW_COLUMNS = ["window", "cutoff", "n_train", "n_test"]
_FORECAST_COLUMNS = ["window", "cutoff", "time", "actual", "forecast"]


def _task_records(key_rows: list[tuple], metrics: list[Any]
                  ) -> Iterator[tuple[tuple, list[dict[str, Any]]]]:
    """Each task's key and window records, from what its metrics slot holds."""
    from ..engine.metriccolumns import texts_taken_out
    from ..engine.metricpacks import MetricsPack

    for parts, stored in zip(key_rows, texts_taken_out(metrics)):
        if type(stored) is MetricsPack:  # floats only: no windows
            continue
        if isinstance(stored, str):  # a reused task's: the store's JSON
            if WINDOWS not in stored:
                continue
            stored = json.loads(stored)
        records = (stored or {}).get(WINDOWS)
        if records:
            yield parts, records


def _as_times(frame: Any, column: str) -> None:
    """A datetime time column's values travel as ISO text: back to datetimes."""
    import pandas as pd

    values = frame[column].dropna()
    if len(values) and all(isinstance(c, str) and "T" in c for c in values.iloc[:100]):
        try:
            frame[column] = pd.to_datetime(frame[column])
        except (ValueError, TypeError):
            pass


def window_frame(key_columns: list, key_rows: list[tuple], metrics: list[Any]) -> Any:
    """``run.evaluation``: the per-window records of every task, with its key."""
    import pandas as pd

    rows = []
    for parts, records in _task_records(key_rows, metrics):
        key = dict(zip(key_columns, parts))
        for record in records:
            rows.append({**key, **{k: v for k, v in record.items() if k != "rows"}})
    if not rows:
        return pd.DataFrame(columns=[*key_columns, *_WINDOW_COLUMNS])
    frame = pd.DataFrame(rows)
    _as_times(frame, "cutoff")
    return frame


def unpack_column(packed: Any) -> Any:
    """A column :func:`~manymodels.evaluation.windowrows.pack_column` packed, as an array."""
    import base64

    import numpy as np

    if isinstance(packed, dict):
        return np.frombuffer(base64.b64decode(packed["base64"]), dtype=np.dtype(packed["dtype"]))
    return np.asarray(packed)


def forecast_frame(key_columns: list, key_rows: list[tuple], metrics: list[Any]) -> Any:
    """``run.forecasts``: every backtest window's test rows with their time,
    cutoff, actual value and forecast, in the tasks' and windows' order."""
    import numpy as np
    import pandas as pd

    keys, windows, cutoffs = [], [], []
    columns: dict[str, list] = {"time": [], "actual": [], "forecast": []}
    for parts, records in _task_records(key_rows, metrics):
        for record in records:
            rows = record.get("rows")
            if not rows:
                continue
            unpacked = {name: unpack_column(rows[name]) for name in columns}
            count = len(unpacked["forecast"])
            keys.append((parts, count))
            windows.append(record["window"])
            cutoffs.append(record["cutoff"])
            for name, values in unpacked.items():
                columns[name].append(values)
    if not keys:
        return pd.DataFrame(columns=[*key_columns, *_FORECAST_COLUMNS])
    counts = np.array([count for _, count in keys])
    frame = pd.DataFrame(index=pd.RangeIndex(int(counts.sum())))
    for i, name in enumerate(key_columns):
        values = np.empty(len(keys), dtype=object)
        for j, (parts, _) in enumerate(keys):
            values[j] = parts[i]  # one by one: a key part may be a tuple
        frame[name] = pd.Series(np.repeat(values, counts)).infer_objects()
    frame["window"] = np.repeat(np.array(windows), counts)
    cutoff = np.empty(len(cutoffs), dtype=object)
    cutoff[:] = cutoffs
    frame["cutoff"] = np.repeat(cutoff, counts)
    for name, pieces in columns.items():
        frame[name] = np.concatenate(pieces)
    _as_times(frame, "cutoff")
    return frame
