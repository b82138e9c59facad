"""A group's time step, read from its times: what ``Store.forecast`` steps by.

A backtest task sees all of its group's times; the store keeps only its
windows' times, which a short horizon leaves too few to tell business days
from days (Tuesday to Friday is four days in a row). So the task reads the
step from its group's last :data:`INFER_FROM` distinct times, as
``Store.forecast(history=...)`` reads it from a history, and keeps its
pandas alias (``"B"``, ``"D"``, ``"MS"``) with the windows' forecasts.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

#: How many of a group's last distinct times its frequency is inferred from:
#: enough for ``infer_freq`` to tell business days or month ends, few enough
#: that a gap early in a long history does not stop the inference.
INFER_FROM = 64


def as_index(times: np.ndarray, zone: Any) -> Any:
    """Datetimes as stored (UTC instants when they have a zone) as an index
    in their own zone."""
    import pandas as pd

    index = pd.DatetimeIndex(times)
    return index.tz_localize("UTC").tz_convert(zone) if zone is not None else index


def inferred_step(times: np.ndarray, zone: Any) -> Any:
    """A group's offset from its distinct sorted datetimes, or None."""
    import pandas as pd

    if len(times) < 3:
        return None
    try:
        with warnings.catch_warnings():  # pandas 3 warns it will return an offset
            warnings.simplefilter("ignore")
            alias = pd.infer_freq(as_index(times, zone))
    except (TypeError, ValueError):
        return None
    if alias is None:
        return None
    return alias if not isinstance(alias, str) else pd.tseries.frequencies.to_offset(alias)


def day_offset(gap: Any) -> Any:
    """An even gap (a ``Timedelta``) as an offset: whole days as days
    (calendar days in a time zone), else the fixed length."""
    import pandas as pd

    if gap % pd.Timedelta(days=1) == pd.Timedelta(0):
        return pd.offsets.Day(gap.days)
    return pd.tseries.frequencies.to_offset(gap)


def _datetimes(times: np.ndarray) -> tuple[np.ndarray | None, Any]:
    """Sorted distinct time values as naive datetimes (UTC instants for times
    of a zone) and the zone; ``(None, None)`` for times that are not dates."""
    import datetime

    import pandas as pd

    if times.dtype.kind == "M":
        return times, None
    if times.dtype.kind not in "OU" or not len(times):
        return None, None
    first = times[0]
    if isinstance(first, str) and all(isinstance(t, str) and t.isdigit() for t in times):
        return None, None  # whole numbers as text ("001"): time steps, not dates
    if isinstance(first, (datetime.date, str)):
        try:
            with warnings.catch_warnings():  # ("could not infer format": it reads them)
                warnings.simplefilter("ignore", UserWarning)
                index = pd.DatetimeIndex(pd.to_datetime(list(times)))
        except (ValueError, TypeError, OverflowError):
            return None, None
        if index.tz is not None:
            return index.tz_convert("UTC").tz_localize(None).to_numpy(), str(index.tz)
        return index.to_numpy(), None
    return None, None


def time_step(times: np.ndarray) -> str | None:
    """The pandas alias of the step between a group's time-sorted values
    (``times``: a column of the rows, several rows a time allowed), read
    from its last :data:`INFER_FROM` distinct times; None for times that
    are not dates, or too few or too irregular to tell."""
    if len(times) < 3:
        return None
    distinct = times[np.append(times[1:] != times[:-1], True)][-INFER_FROM:]
    if len(distinct) < 3 or distinct.dtype.kind not in "MOU":
        return None
    if distinct.dtype.kind == "M":  # evenly spaced by under 28 days (most series):
        gaps = np.diff(distinct.view(np.int64))  # by the gap alone, whatever the dates
        unit = np.datetime_data(distinct.dtype)[0]
        if gaps.min() == gaps.max() and np.timedelta64(int(gaps[0]), unit) < _FOUR_WEEKS:
            even = (distinct.dtype.str, int(gaps[0]))
            if even not in _EVEN_STEPS:
                _EVEN_STEPS[even] = _step_of(distinct[:3], None)
            return _EVEN_STEPS[even]
    key = ((distinct.dtype.str, distinct.tobytes()) if distinct.dtype.kind != "O"
           else tuple(distinct))
    if key in _STEPS:  # series share calendars: each is read once
        return _STEPS[key]
    stamps, zone = _datetimes(distinct)
    step = None if stamps is None or len(stamps) < 3 else _step_of(stamps, zone)
    if len(_STEPS) >= 4096:
        _STEPS.clear()
    _STEPS[key] = step
    return step


def _step_of(stamps: np.ndarray, zone: Any) -> str | None:
    """:func:`time_step` of distinct sorted datetimes: evenly spaced by less
    than 28 days (NumPy alone), else ``pandas.infer_freq``."""
    import pandas as pd

    unit = np.datetime_data(stamps.dtype)[0]
    gaps = np.diff(stamps.view(np.int64))
    if gaps.min() == gaps.max() and zone is None:
        gap = pd.Timedelta(int(gaps[0]), unit=unit)
        if gap < pd.Timedelta(days=28):
            return day_offset(gap).freqstr
    step = inferred_step(stamps, zone)
    return None if step is None else step.freqstr


#: Steps read by :func:`time_step`, by the times' dtype and bytes (or the
#: values themselves, for dates, text or times of a zone).
_STEPS: dict[tuple, str | None] = {}

#: Steps of evenly spaced datetimes, by their dtype and gap: series of one
#: step that end on different days (each its own calendar in :data:`_STEPS`)
#: read their step once, not once each (65 microseconds a group).
_EVEN_STEPS: dict[tuple[str, int], str | None] = {}
_FOUR_WEEKS = np.timedelta64(28, "D")  # (longer even gaps: infer_freq anchors on a weekday)
