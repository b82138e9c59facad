"""The future rows of a forecast: each group's ``h`` time stamps after its last.

Times are datetimes (the steps a pandas offset: ``"D"``, ``"MS"``, ``"h"``...)
or whole numbers (the step a number; text of digits, ``"001"``, is read as
its numbers, as a backtest sorts it). ISO week text (``"2024-W05"``, or
``"2024-W05-3"`` with the day) is read as the weeks' days and written back
as week text; decimals (``0.5``, ``2024.25``) as whole numbers of their
finest decimal place, so that the future times are the decimals, exactly,
not sums of floats. A group's step is ``freq=`` when given,
else inferred from its own times (``pandas.infer_freq`` on its last distinct
times; for numbers, the one difference between them), and a group whose
step cannot be inferred is named in the error before any model is loaded.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from ..evaluation.frequency import INFER_FROM, as_index, day_offset, inferred_step


@dataclass
class GroupTimes:
    """The groups of a history, in key order: their keys and each one's last
    :data:`INFER_FROM` distinct times, sorted, as one array cut by ``lengths``
    (datetimes with a time zone as UTC instants, the zone in ``zone``)."""

    by: list[str]
    time: str
    key_frame: pd.DataFrame
    values: np.ndarray
    lengths: np.ndarray
    dated: bool  # datetimes, else whole numbers
    zone: Any = None
    written: str | None = None  # ISO week text's layout (strftime's), to write it back
    places: int | None = None  # decimals: their places (the values: in units of the last)

    @property
    def keys(self) -> list[tuple]:
        return list(self.key_frame.itertuples(index=False, name=None))

    @property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.lengths) - self.lengths

    def group(self, position: int) -> np.ndarray:
        start = int(self.starts[position])
        return self.values[start:start + int(self.lengths[position])]

    def subset(self, positions: list[int]) -> GroupTimes:
        if len(positions) == len(self.lengths):
            return self
        owner = np.repeat(np.arange(len(self.lengths)), self.lengths)
        kept = np.zeros(len(self.lengths), dtype=bool)
        kept[positions] = True
        return replace(self, key_frame=self.key_frame.iloc[positions].reset_index(drop=True),
                       values=self.values[kept[owner]], lengths=self.lengths[positions])

    def shown(self, value: Any) -> Any:
        """A time of :attr:`values` as the column holds it (a decimal's)."""
        return plain(value if self.places is None else value / 10.0 ** self.places)

    def named(self, position: int) -> Any:
        key = tuple(plain(part) for part in self.key_frame.iloc[position])
        return key[0] if len(self.by) == 1 else key


def plain(value: Any) -> Any:
    """A value as an error message shows it: a NumPy scalar as Python's, a
    midnight time stamp as its date."""
    if isinstance(value, np.datetime64):
        value = pd.Timestamp(value)
    if isinstance(value, pd.Timestamp) and value == value.normalize():
        return value.date().isoformat()
    return value.item() if isinstance(value, np.generic) else value


def _arrow_times(table: pa.Table, time: str, what: str
                 ) -> tuple[pa.Table, bool, str | None, int | None]:
    """``table`` with its time column as Arrow timestamps or whole numbers
    (dates, text dates and ISO weeks converted; decimals in units of their
    last place); True for timestamps, ISO week text's layout, decimals' places."""
    column = table[time]
    kind = column.type
    if pa.types.is_timestamp(kind):
        return table, True, None, None
    if pa.types.is_integer(kind):
        return table, False, None, None
    index = table.schema.get_field_index(time)
    if pa.types.is_floating(kind):
        values = column.to_numpy().astype(np.float64)  # (a null: NaN)
        known = np.isfinite(values)
        places = _decimal_places(values[known], time, what)
        ticks = np.round(np.where(known, values, 0) * 10.0 ** places).astype(np.int64)
        return (table.set_column(index, time, pa.array(ticks, mask=~known)), False, None,
                places)
    if _digit_text(column):
        return table.set_column(index, time, pc.cast(column, pa.int64())), False, None, None
    written = _week_layout(column)
    if written is not None:
        text = column.to_pandas()
        try:
            weeks = pd.to_datetime(text + "-1" if written == "%G-W%V" else text,
                                   format="%G-W%V-%u")
        except ValueError:  # a week 54
            weeks = None
        if weeks is not None:
            return table.set_column(index, time, pa.array(weeks)), True, written, None
    if pa.types.is_date(kind) or _is_text(kind):
        try:
            with warnings.catch_warnings():  # ("could not infer format": it reads them)
                warnings.simplefilter("ignore", UserWarning)
                parsed = pd.to_datetime(column.to_pandas())
        except (ValueError, TypeError):
            parsed = None
        if parsed is not None:
            return table.set_column(index, time, pa.array(parsed)), True, None, None
    held = (f"text that is not dates (such as {pc.drop_null(column)[0].as_py()!r})"
            if _is_text(kind) and pc.drop_null(column).length() else f"{kind} values")
    raise ValueError(f"the time column {time!r} of {what} holds {held}: "
                     "forecast needs datetimes, whole numbers or decimals")


#: The most decimal places a time column of decimals is read to.
_MOST_PLACES = 9


def _decimal_places(values: np.ndarray, time: str, what: str) -> int:
    """The fewest decimal places that write each of ``values`` (finite
    floats) exactly, as the nearest float to its decimal (``0.1``, not a
    sum of tenths): the future times are those decimals, nothing more."""
    for places in range(_MOST_PLACES + 1):
        scale = 10.0 ** places
        scaled = np.round(values * scale)
        if (scaled / scale == values).all() and (np.abs(scaled) < 2.0 ** 53).all():
            return places
    wrong = values[np.round(values * 10.0 ** _MOST_PLACES) / 10.0 ** _MOST_PLACES != values]
    shown = wrong[0].item() if len(wrong) else values[0].item()
    raise ValueError(f"the time column {time!r} of {what} holds numbers that are no decimals of "
                     f"at most {_MOST_PLACES} places (such as {shown!r}): forecast needs "
                     "datetimes, whole numbers or decimals")


def _week_layout(column: Any) -> str | None:
    """``strftime``'s layout of a text column of ISO weeks (``"2024-W05"``, or
    ``"2024-W05-3"`` with the day), else None."""
    if not _is_text(column.type):
        return None
    given = pc.drop_null(column)
    if len(given) == 0:
        return None
    for pattern, layout in ((r"^[0-9]{4}-W[0-9]{2}$", "%G-W%V"),
                            (r"^[0-9]{4}-W[0-9]{2}-[1-7]$", "%G-W%V-%u")):
        if pc.all(pc.match_substring_regex(given, pattern)).as_py():
            return layout
    return None


def _is_text(kind: Any) -> bool:
    return pa.types.is_string(kind) or pa.types.is_large_string(kind)


def _digit_text(column: Any) -> bool:
    """Whether a text time column holds whole numbers written as text
    ("001" to "120", which a backtest sorts as time steps): read as dates,
    "001" was the year 1 and "2024" a first of January, and the future
    times were days of the year 1."""
    if not _is_text(column.type):
        return False
    given = pc.drop_null(column)
    return len(given) > 0 and bool(pc.all(pc.utf8_is_digit(given)).as_py())


def _key_changes(table: pa.Table, by: list[str]) -> np.ndarray:
    """Per row of a table sorted by ``by``: whether its key differs from the
    row before (True for the first), in Arrow (text keys never become
    Python strings)."""
    changed = np.zeros(table.num_rows, dtype=bool)
    changed[0] = True
    for name in by:
        column = table[name]
        if pa.types.is_dictionary(column.type):
            column = column.cast(column.type.value_type)
        before, after = column[:-1], column[1:]
        differs = pc.or_(pc.fill_null(pc.not_equal(after, before), False),
                         pc.xor(pc.is_null(after), pc.is_null(before)))
        changed[1:] |= differs.to_numpy(zero_copy_only=False)
    return changed


def group_times(table: pa.Table, by: list[str], time: str, what: str) -> GroupTimes:
    """Each group's last distinct times, from a table of key and time
    columns: one sort in Arrow, then NumPy (no Python step per group)."""
    from ..inputs.tables import exact_pandas

    table, dated, written, places = _arrow_times(table.select([*by, time]), time, what)
    table = table.filter(pc.is_valid(table[time]))
    if table.num_rows == 0:
        raise ValueError(f"{what} has no rows with a {time!r} time")
    # (Arrow sorts no dictionary column: a categorical key is sorted by its values)
    plain = table.select([*by, time])
    for position, name in enumerate(by):
        if pa.types.is_dictionary(plain.schema.field(name).type):
            plain = plain.set_column(position, name, plain[name].cast(
                plain.schema.field(name).type.value_type))
    table = table.take(pc.sort_indices(plain, [(name, "ascending") for name in [*by, time]]))
    zone = table[time].type.tz if dated else None
    values = table[time].to_numpy()  # a time zone's: UTC instants
    changed = _key_changes(table, by)
    repeated = np.zeros(len(values), dtype=bool)  # the same key and time as the row before
    repeated[1:] = ~changed[1:] & (values[1:] == values[:-1])
    if repeated.any():
        kept = ~repeated
        table, values, changed = table.filter(pa.array(kept)), values[kept], changed[kept]
    starts = np.flatnonzero(changed)
    ends = np.append(starts[1:], len(values))
    owner = np.cumsum(changed) - 1
    tail = ends[owner] - np.arange(len(values)) <= INFER_FROM
    lengths = np.minimum(ends - starts, INFER_FROM)
    keys = exact_pandas(table.select(by).take(pa.array(starts)))
    return GroupTimes(by, time, keys, values[tail], lengths, dated, zone, written, places)


def last_times_of_table(table: Any, by: list[str], time: str, what: str) -> GroupTimes:
    """:func:`group_times` of a table or path (``history=``, the run's own)."""
    from ..inputs.tables import read_table

    if isinstance(table, pd.DataFrame):
        missing = [c for c in [*by, time] if c not in table.columns]
        if missing:
            raise ValueError(f"column {missing[0]!r} is not in {what}")
        table = pa.Table.from_pandas(table[[*by, time]], preserve_index=False)
    else:
        try:
            table = read_table(table, columns=[*by, time])
        except KeyError as exc:
            raise ValueError(f"{what}: {exc.args[0] if exc.args else exc}") from None
    return group_times(table, by, time, what)


def last_times_of_backtest(forecasts: pd.DataFrame, by: list[str], time: str,
                           run_id: int) -> GroupTimes:
    """:func:`group_times` of a run's backtest forecasts (``Store.forecasts``):
    its last window tests each group's last rows."""
    if forecasts.empty or any(c not in forecasts.columns for c in by):
        raise ValueError(
            f"run {run_id} kept no backtest forecasts to find each group's last time in: "
            "pass history= (a table with the key columns and the time column, such as the "
            "one trained on)")
    return last_times_of_table(_consecutive_times(forecasts, by, time), by, time,
                               f"run {run_id}'s backtest forecasts")


def _consecutive_times(forecasts: pd.DataFrame, by: list[str], time: str) -> pd.DataFrame:
    """The key and time of the backtest's times that follow one another in
    each group: a window's cutoff and its test times, and the windows
    before it while each reaches the next one's cutoff (``step`` at most
    ``horizon``). Windows further apart (``step > horizon``) leave gaps
    between them, which would read as the frequency: only the last window's
    times are taken."""
    # the frame's own columns (a key column named "window" left it "metric_window")
    own = {f"metric_{name}" if f"metric_{name}" in forecasts.columns else name: f"__{name}"
           for name in ("window", "cutoff", "time")}
    forecasts = pd.concat([forecasts[by], forecasts[list(own)].rename(columns=own)], axis=1)
    windows = forecasts.groupby([*by, "__window"], sort=True, dropna=False, observed=True).agg(
        cutoff=("__cutoff", "first"), reached=("__time", "max")).reset_index()
    reached_before = windows.groupby(by, dropna=False, observed=True)["reached"].shift()
    chained = bool((reached_before.isna() | (windows["cutoff"] <= reached_before)).all())
    if not chained:
        last = windows.groupby(by, dropna=False, observed=True)["__window"].transform("max")
        windows = windows[windows["__window"] == last]
        forecasts = forecasts.merge(windows[[*by, "__window"]], on=[*by, "__window"])
    return pd.concat([forecasts[[*by, "__time"]].rename(columns={"__time": time}),
                      windows[[*by, "cutoff"]].rename(columns={"cutoff": time})],
                     ignore_index=True)


def _given_step(freq: Any, times: GroupTimes) -> Any:
    if times.dated:
        if isinstance(freq, str):
            try:
                freq = pd.tseries.frequencies.to_offset(freq)
            except ValueError:
                raise ValueError(f"freq={freq!r} is not a pandas offset alias "
                                 "('D', 'W', 'MS', 'h', ...)") from None
        if times.written == "%G-W%V":  # ISO weeks: from Monday to Monday
            if isinstance(freq, pd.offsets.Week):
                return pd.offsets.Week(freq.n, weekday=0)
            raise ValueError(f"freq={freq!r}: the time column {times.time!r} holds ISO weeks "
                             "('2024-W05'), so freq= is weekly ('W', '2W')")
        if isinstance(freq, pd.DateOffset):
            return freq
        raise ValueError(f"freq={freq!r}: the time column {times.time!r} holds datetimes, "
                         "so freq= is a pandas offset alias ('D', 'W', 'MS', 'h', ...)")
    if isinstance(freq, (int, np.integer)) and not isinstance(freq, bool) and freq > 0:
        return int(freq) * 10 ** (times.places or 0)
    if times.places is not None and isinstance(freq, (float, np.floating)) and freq > 0:
        ticks = round(float(freq) * 10.0 ** times.places)
        if ticks >= 1 and ticks / 10.0 ** times.places == freq:
            return ticks
        raise ValueError(f"freq={freq!r}: the time column {times.time!r} holds decimals of "
                         f"{times.places} place(s), so freq= is a positive number of at most "
                         f"{times.places} place(s)")
    raise ValueError(f"freq={freq!r}: the time column {times.time!r} holds whole numbers, "
                     "so freq= is the positive number between two time steps")


def _even_gaps(times: GroupTimes) -> np.ndarray:
    """Each group's one gap between its times when they are evenly spaced
    (in the time column's unit), else -1: NumPy over all groups at once."""
    count = len(times.lengths)
    ticks = times.values.view(np.int64) if times.dated else times.values
    owner = np.repeat(np.arange(count), times.lengths)
    inside = owner[1:] == owner[:-1]
    gaps, owners = np.diff(ticks)[inside], owner[1:][inside]
    low = np.full(count, np.iinfo(np.int64).max)
    high = np.full(count, -1, dtype=np.int64)
    np.minimum.at(low, owners, gaps)
    np.maximum.at(high, owners, gaps)
    enough = times.lengths >= (3 if times.dated else 2)
    return np.where(enough & (low == high), high, -1)


def steps(times: GroupTimes, freq: Any, known: list[str | None] | None = None
          ) -> tuple[np.ndarray, list[Any]]:
    """Each group's step, as a code into the distinct steps: ``freq=`` for
    all, else ``known`` (per group, a pandas alias or None: what its backtest
    read from all its times, which the store's few window times cannot tell
    apart, such as business days from days), else inferred from ``times``."""
    count = len(times.lengths)
    if freq is not None:
        return np.zeros(count, dtype=np.int64), [_given_step(freq, times)]
    offsets = [_known_offset(alias) for alias in known] if known is not None and \
        times.dated else [None] * count
    unknown = [position for position, offset in enumerate(offsets) if offset is None]
    if len(unknown) == count:
        return _inferred_steps(times)
    codes = np.zeros(count, dtype=np.int64)
    found: list[Any] = []
    if unknown:
        codes[unknown], found = _inferred_steps(times.subset(unknown))
    coded: dict[Any, int] = {}
    for position, offset in enumerate(offsets):
        if offset is not None:
            codes[position] = coded.setdefault(offset, len(found))
            if coded[offset] == len(found):
                found.append(offset)
    return codes, found


def _known_offset(alias: str | None) -> Any:
    """A stored step's alias as an offset; None when absent, or when this
    pandas does not read it (an alias of another version)."""
    if not alias:
        return None
    try:
        return pd.tseries.frequencies.to_offset(alias)
    except ValueError:
        return None


def _inferred_steps(times: GroupTimes) -> tuple[np.ndarray, list[Any]]:
    """:func:`steps` inferred per group (times evenly spaced by less than 28
    days at once; the others, such as month starts or years, by
    ``pandas.infer_freq``, once per distinct times, else by their even gap)."""
    even = _even_gaps(times)
    gaps = even.copy()
    unit = np.datetime_data(times.values.dtype)[0] if times.dated else None
    if times.dated:  # a gap of 28 days or more may be months or years, which days misplace
        gaps[gaps >= np.timedelta64(28, "D") // np.timedelta64(1, unit)] = -1
    distinct, codes = np.unique(gaps, return_inverse=True)
    found = [None if gap < 0 else day_offset(pd.Timedelta(int(gap), unit=unit)) if times.dated
             else int(gap) for gap in distinct.tolist()]
    uneven = np.flatnonzero(gaps < 0)
    seen: dict[bytes, int] = {}
    for position in uneven.tolist():
        group = times.group(position)
        signature = group.tobytes()
        if signature not in seen:
            step = inferred_step(group, times.zone) if times.dated else None
            if step is None and even[position] >= 0:  # evenly spaced, no calendar rule
                step = day_offset(pd.Timedelta(int(even[position]), unit=unit))
            if step is None:
                shown = ", ".join(str(times.shown(t)) for t in group[-4:])
                raise ValueError(
                    f"cannot infer the frequency of group {times.named(position)!r} from "
                    f"its {len(group)} distinct time(s) in {times.time!r} (the last: "
                    f"{shown}): pass freq=")
            seen[signature] = len(found)
            found.append(step)
        codes[position] = seen[signature]
    return codes, found


def future_rows(times: GroupTimes, codes: np.ndarray, found: list[Any], h: int
                ) -> pd.DataFrame:
    """The key and time columns of the ``h`` steps after each group's last
    time, group after group, in time order within each."""
    count = len(times.lengths)
    last = times.values[np.cumsum(times.lengths) - 1]
    stamps = np.empty((count, h), dtype=times.values.dtype)
    ahead = np.arange(1, h + 1)
    with warnings.catch_warnings():  # a non-fixed offset is added element-wise
        warnings.simplefilter("ignore", pd.errors.PerformanceWarning)
        for code, step in enumerate(found):
            rows = np.flatnonzero(codes == code)
            if not len(rows) or step is None:
                continue
            if times.zone is not None and isinstance(step, pd.offsets.Day):
                step = pd.DateOffset(days=step.n)  # a calendar day (pandas 2's Day is 24 h)
            if not times.dated:
                stamps[rows] = last[rows][:, None] + step * ahead
                continue
            start = as_index(last[rows], times.zone)  # a day is a calendar day there
            for k in ahead.tolist():
                moved = start + step * k
                if times.zone is not None:
                    moved = moved.tz_convert("UTC").tz_localize(None)
                stamps[rows, k - 1] = moved.to_numpy().astype(stamps.dtype)
    frame = times.key_frame.iloc[np.repeat(np.arange(count), h)].reset_index(drop=True)
    column = pd.Series(stamps.reshape(-1))
    if times.zone is not None:
        column = column.dt.tz_localize("UTC").dt.tz_convert(times.zone)
    if times.written is not None:  # ISO weeks, written as the history's were
        column = column.dt.strftime(times.written)
    if times.places is not None:  # (the nearest float to each decimal)
        column = column / 10.0 ** times.places
    frame[times.time] = column
    return frame


def with_features(future: pd.DataFrame, X_future: Any, by: list[str], time: str
                  ) -> tuple[pd.DataFrame, list[str]]:
    """The future rows with ``X_future``'s feature columns; every future row
    must have one row of ``X_future`` (a missing one is named)."""
    from ..inputs.tables import exact_pandas, read_table

    table = X_future if isinstance(X_future, pd.DataFrame) else exact_pandas(
        read_table(X_future))
    missing = [c for c in [*by, time] if c not in table.columns]
    if missing:
        raise ValueError(f"column {missing[0]!r} is not in X_future (it needs the key "
                         f"columns {by} and the time column {time!r})")
    table = table.copy()
    if pd.api.types.is_integer_dtype(future[time]) and not pd.api.types.is_numeric_dtype(
            table[time]):  # whole numbers written as text, as the history's were
        try:
            table[time] = pd.to_numeric(table[time]).astype(future[time].dtype)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"X_future's time column {time!r} cannot be read as the "
                             f"groups' whole-number times: {exc}") from None
    if pd.api.types.is_datetime64_any_dtype(future[time]):
        wanted = future[time].dtype
        try:
            table[time] = pd.to_datetime(table[time]).astype(wanted)
        except (TypeError, ValueError) as exc:  # naive against zoned times, text that is none
            zone = getattr(wanted, "tz", None)
            raise ValueError(
                f"X_future's time column {time!r} cannot be read as the groups' times "
                f"({wanted}{': give it that zone, tz_localize or tz_convert' if zone else ''}"
                f"): {exc}") from None
    doubled = table.duplicated([*by, time])
    if doubled.any():
        row = table[doubled].iloc[0]
        where = {c: plain(row[c]) for c in [*by, time]}
        raise ValueError(f"X_future has more than one row for {where}")
    features = [c for c in table.columns if c not in {*by, time}]
    try:
        joined = future.merge(table, on=[*by, time], how="left", indicator="_found")
    except (TypeError, ValueError) as exc:  # a key typed otherwise: 1 against "1"
        raise ValueError(f"X_future's key and time columns {[*by, time]} cannot be matched "
                         f"with the groups' ({exc})") from None
    absent = joined["_found"].to_numpy() == "left_only"
    if absent.any():
        row = joined[absent].iloc[0]
        key = plain(row[by[0]]) if len(by) == 1 else tuple(plain(row[c]) for c in by)
        raise ValueError(f"X_future has no row for group {key!r} at {time}={plain(row[time])} "
                         f"({int(absent.sum())} future row(s) missing in all)")
    return joined.drop(columns="_found"), features
