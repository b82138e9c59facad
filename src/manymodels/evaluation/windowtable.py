"""A task's evaluated windows as one table of columns.

What a task of ``train(..., evaluate=...)`` reports under
:data:`~manymodels.evaluation.splitters.WINDOWS` is a dict of equal-length
lists, one entry a window::

    {"window": [0, 1, 2], "cutoff": [...], "n_train": [...], "n_test": [...],
     "mae": [...], "rmse": [...],                 # each score (None: not given)
     "rows": {"time": ..., "actual": ..., "forecast": ...,    # a backtest's,
              "freq": "B"}}                   # and its group's time step, if dates

``rows`` holds every window's test rows end to end (window ``i`` is the
``n_test[i]`` rows after the windows before it), each column packed once
(:func:`~manymodels.evaluation.windowrows.pack_column`). One table a task,
not one dict a window with its columns packed one by one: building those
records was about 40% of a backtest task's evaluation (seasonal-naive fits,
3 windows), and their objects cost the driver to receive. Stores written
before kept a list of
one dict per window, each with its own ``rows``: :func:`as_table` reads both.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from .windowrows import STEP, pack_column

#: A windows table's mark (True a window) that its cutoffs, ISO text as they
#: travel, are of a ``datetime.date`` time column, to be read back as dates.
DATED = "cutoff_dates"
#: A windows table's mark (True a window) that its cutoffs are a text time
#: column's values, to be read back as that text (not as datetimes).
TEXT = "cutoff_text"
#: The columns of a windows table that are not scores.
FIELDS = ("window", "cutoff", "n_train", "n_test", "rows", DATED, TEXT)
#: A backtest's packed columns under ``rows``.
ROW_COLUMNS = ("time", "actual", "forecast")


def window_count(table: dict[str, Any]) -> int:
    return len(table.get("window", ()))


def mean_scores(table: Any) -> dict[str, float]:
    """Each score averaged over the windows that gave it one, as
    ``run.results`` shows it. A window whose score is undefined whatever the
    forecast (None: mase of a constant history, r2 of one row, a window with
    no actual) is left out: it would make every candidate's mean NaN, and
    select= then took the first. A NaN score (a forecast of NaN) makes the
    mean NaN: that candidate ranks last. NaN where no window gave a score."""
    table = as_table(table)
    means = {}
    for name, values in table.items():
        if name in FIELDS:
            continue
        scored = [v for v in values if v is not None]
        means[name] = sum(scored) / len(scored) if scored else float("nan")
    return means


def score_column(tables: list[dict[str, Any]], name: str) -> np.ndarray:
    """Score ``name`` of every window of ``tables`` that gave it one (None,
    undefined, left out; NaN, a failed forecast, kept)."""
    values = [v for table in tables for v in table.get(name, ()) if v is not None]
    return np.asarray(values, dtype=float)


def join(tables: list[dict[str, Any]]) -> dict[str, Any]:
    """Windows tables one after another, as one (successive halving scores
    a candidate a window at a time). A score some lack is None there; the
    forecast rows are kept when every table has them."""
    tables = [table for table in tables if window_count(table)]
    if len(tables) == 1:
        return tables[0]
    if not tables:
        return {}
    names = list(dict.fromkeys(name for table in tables for name in table if name != "rows"))
    joined: dict[str, Any] = {name: [] for name in names}
    for table in tables:
        count = window_count(table)
        for name in names:
            joined[name].extend(table.get(name, [None] * count))
    if all("rows" in table for table in tables):
        joined["rows"] = {name: _joined_column([table["rows"][name] for table in tables])
                          for name in ROW_COLUMNS}
        step = tables[0]["rows"].get(STEP)  # the group's, the same in every table
        if step is not None:
            joined["rows"][STEP] = step
    return joined


def _joined_column(packed: list[Any]) -> Any:
    """Packed columns one after another, packed as one (a zone kept)."""
    joined = pack_column(np.concatenate([unpack_column(column) for column in packed]))
    zone = time_zone(packed[0])
    if zone is not None:
        joined["tz"] = zone
    return joined


def time_zone(packed: Any) -> str | None:
    """The zone of a packed column of zone-aware times (its values are UTC)."""
    return packed.get("tz") if isinstance(packed, dict) else None


def as_table(windows: Any) -> dict[str, Any]:
    """``windows`` as a windows table: as it is, or made from the list of
    one record a window that stores written before this format kept."""
    if isinstance(windows, dict):
        return windows
    if not windows:
        return {}
    names = list(dict.fromkeys(name for record in windows for name in record if name != "rows"))
    table: dict[str, Any] = {name: [record.get(name) for record in windows] for name in names}
    rows = [record.get("rows") for record in windows]
    if all(rows):
        unpacked = {name: [unpack_column(r[name]) for r in rows] for name in ROW_COLUMNS}
        table["n_test"] = [len(values) for values in unpacked["forecast"]]
        table["rows"] = {name: np.concatenate(parts) for name, parts in unpacked.items()}
    return table


def unpack_column(packed: Any) -> np.ndarray:
    """A column :func:`~manymodels.evaluation.windowrows.pack_column` packed,
    as an array (an array already unpacked, as it is); zone-aware times as
    their UTC datetimes (:func:`time_zone` says which zone)."""
    if isinstance(packed, dict):
        values = np.frombuffer(base64.b64decode(packed["base64"]),
                               dtype=np.dtype(packed["dtype"]))
        return values.astype(object) if packed.get("dates") else values  # datetime.date
    return np.asarray(packed)


def holds_dates(packed: Any) -> bool:
    """Whether a packed column is of ``datetime.date`` values (whose cutoffs
    travel as ISO text, to be read back as dates too)."""
    return isinstance(packed, dict) and bool(packed.get("dates"))

