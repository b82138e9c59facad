"""What the windows of one group are, shared by all its candidates.

A backtest's candidates (``groups * grid``) are scored on the same windows
of the same group: their test rows, actuals and times end to end, and the
times and actuals packed for ``run.forecasts``, are made once, for the
first (:class:`WindowLayout`), and each candidate adds its predictions.
The windows' columns travel packed end to end (:func:`pack_column`): one
base64 string of their bytes, where a list would cost an object a value.
"""

from __future__ import annotations

from binascii import b2a_base64
from collections.abc import Mapping
from functools import cached_property
from typing import Any

import numpy as np

from ..engine.execution import split_result
from .frequency import time_step
from .splitters import column, plain_time

#: The key of a windows table's ``rows`` under which the group's time step
#: travels (:func:`.frequency.time_step`).
STEP = "freq"


def window_length(positions: Any, n: int) -> int:
    """How many of ``n`` rows ``positions`` (a slice or indices) takes."""
    return len(range(n)[positions]) if isinstance(positions, slice) else len(positions)


#: Types ``fit`` returned that are a model alone (neither a tuple nor a
#: mapping): their values skip ``split_result``'s abstract-class check.
_MODEL_TYPES: set[type] = set()


def model_and_metrics(value: Any) -> tuple[Any, dict[str, Any]]:
    """:func:`~manymodels.engine.execution.split_result`, with a model's type
    checked once, not once a window."""
    kind = type(value)
    if kind in _MODEL_TYPES:
        return value, {}
    if kind is not tuple and kind is not dict and not isinstance(value, (Mapping, tuple)):
        _MODEL_TYPES.add(kind)
    return split_result(value)


class WindowLayout:
    """The test rows of some windows of one group, end to end: window ``i``
    at ``bounds[i]:bounds[i + 1]`` of ``y`` (the actuals); the same for
    every candidate, so made once per group."""

    def __init__(self, group: Any, numbers: tuple[int, ...]) -> None:
        windows = [group.windows[w] for w in numbers]
        tests = [test for _, test, _ in windows]
        self.group, self.tests = group, tests
        self.sizes = [window_length(test, group.n) for test in tests]
        self.n_train = [window_length(train, group.n) for train, _, _ in windows]
        self.cutoffs = [cutoff for _, _, cutoff in windows]
        ends = [0]
        for size in self.sizes:
            ends.append(ends[-1] + size)
        self.ends, self.bounds = ends, np.array(ends)
        self.y = (np.concatenate([group.y[test] for test in tests])
                  if group.vectorised or group.forecasts else None)
        self._trains = [train for train, _, _ in windows]
        self._packed: dict[str, Any] | None = None

    @cached_property
    def trains(self) -> list[np.ndarray]:
        """Each window's training target (``mase`` scales by it), in time
        order; none (``mase`` NaN) where a time holds several of its rows: the
        rows of a step are no one series, and the naive one-step differences
        ran across them (one store's sales from another's), in whichever
        order the step's rows came. Made once, for every candidate."""
        time = getattr(self.group.splitter, "time", None)
        times = None if time is None else column(self.group.rows, time)
        trains = []
        for train in self._trains:
            target = self.group.y[train]
            if times is not None and len(target) > 1:
                steps = times[train]
                if not bool((steps[1:] != steps[:-1]).all()):
                    target = target[:0]
            trains.append(target)
        return trains

    @cached_property
    def dated_cutoffs(self) -> bool:
        """Whether the windows' cutoffs are ``datetime.date`` values (sent as
        ISO text, which a text time column's cutoffs are too: the windows
        table marks them, :data:`~manymodels.evaluation.windowtable.DATED`,
        so that they come back as dates with or without the forecast rows)."""
        time = getattr(self.group.splitter, "time", None)
        if time is None:
            return False
        times = column(self.group.rows, time)
        if getattr(times, "dtype", None) is None or times.dtype.kind != "O":
            return False
        last_trained = [train.stop - 1 for train in self._trains
                        if isinstance(train, slice) and train.stop]
        return len(last_trained) == len(self._trains) and _all_dates(times[last_trained])

    @cached_property
    def text_cutoffs(self) -> bool:
        """Whether the windows' cutoffs are a text time column's own values,
        which look like a datetime column's cutoffs (ISO text as they
        travel): the windows table marks them,
        :data:`~manymodels.evaluation.windowtable.TEXT`, so that they come
        back as the text of the ``time`` column, not as datetimes."""
        time = getattr(self.group.splitter, "time", None)
        if time is None:
            return False
        times = column(self.group.rows, time)
        return times.dtype.kind in "OU" and len(times) > 0 and isinstance(times[0], str)

    def forecast_rows(self, predicted: Any) -> dict[str, Any] | None:
        """The windows' forecasts row by row, end to end (window ``i``'s at
        ``bounds[i]:bounds[i + 1]``): their times, actuals and forecasts,
        each column packed as :func:`pack_column` does, the times and
        actuals once for all candidates, and the step of the group's times
        (``"freq"``, a pandas alias: :func:`.frequency.time_step`) where they
        are dates. None when a row has several outputs."""
        if predicted is None or len(predicted) != len(self.y):  # several outputs a row
            return None
        if self._packed is None:
            every = column(self.group.rows, self.group.splitter.time)
            times = (every[self.tests[0]] if len(self.tests) == 1
                     else np.concatenate([every[test] for test in self.tests]))
            shared = {"time": pack_column(times), "actual": pack_column(self.y)}
            step = time_step(every)
            if step is not None:
                shared[STEP] = step
            self._packed = shared
        return {**self._packed, "forecast": pack_column(predicted)}


def pack_column(values: np.ndarray) -> Any:
    """A window's column as JSON keeps it cheaply and exactly: numbers and
    datetimes as their bytes in base64 with their dtype (one string, where a
    list costs an object a value to make, send and store), anything else as
    a list (:func:`~manymodels.evaluation.windowtable.unpack_column` reads both)."""
    values = np.ascontiguousarray(values)
    if values.dtype.kind in "biufcMm":
        return {"dtype": values.dtype.str,
                "base64": b2a_base64(values, newline=False).decode("ascii")}
    if values.dtype.kind == "O":
        if _all_dates(values):  # datetime.date values: days, and a mark to give dates back
            return {**pack_column(values.astype("datetime64[D]")), "dates": True}
        zoned = _zoned_times(values)
        if zoned is not None:  # times of one zone: as UTC datetimes, and the zone's name
            return {**pack_column(zoned.tz_convert("UTC").tz_localize(None).to_numpy()),
                    "tz": str(zoned.tz)}
        return [plain_time(v) for v in values]
    return values.tolist()


def _all_dates(values: np.ndarray) -> bool:
    """Whether a column holds ``datetime.date`` values alone (not datetimes)."""
    import datetime

    return bool(len(values)) and type(values[0]) is datetime.date and all(
        type(value) is datetime.date for value in values)


def _zoned_times(values: np.ndarray) -> Any:
    """A column of timestamps of one zone (a pandas frame's datetime column
    with a zone) as a ``DatetimeIndex``; None for any other column."""
    import datetime

    first = values[0] if len(values) else None
    if not isinstance(first, datetime.datetime) or first.tzinfo is None:
        return None
    import pandas as pd

    try:
        zoned = pd.DatetimeIndex(values)
    except (ValueError, TypeError):  # zones mixed, or not all times
        return None
    return zoned if zoned.tz is not None else None
