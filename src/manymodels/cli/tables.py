"""How ``manymodels runs`` and ``show`` print a table: csv, json, or aligned
text that is never squeezed. Kept apart from the commands so that ``cli.py``
stays a thin layer of options."""

from __future__ import annotations

import datetime
import json
import math
import re
from enum import Enum
from typing import Any

import typer


class OutputFormat(str, Enum):
    """The ``--format`` choices."""

    table = "table"
    csv = "csv"
    json = "json"


def cell(value: Any, exact: bool = False) -> str:
    """``value`` as one short line: 4 significant digits (a whole float ``1.0``), empty for missing;
    a control character (a terminal's escape sequence in a key or an error)
    shown as its escape, never sent to the terminal. ``exact`` (a key
    column's value, what ``manymodels why`` is given): a number whole
    (``0.12345`` and ``0.12346`` are two keys, not ``0.1235`` twice) and a
    line break or a tab as its escape, ``\\n`` or ``\\t`` (not a space,
    which another key may hold), so that each key prints as itself alone."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or (
            type(value).__name__ == "NAType"):  # (pandas' NA: an Int64's missing value)
        return ""
    if isinstance(value, float):
        if exact:
            return repr(float(value))
        short = f"{value:.4g}"  # a whole float as a float (an r2 of 1.0: "1.0", not "1")
        return short + ".0" if short.lstrip("-").isdigit() else short
    if exact:
        return _KEY_CONTROL.sub(_escaped, str(value))
    return _CONTROL.sub(_escaped, " ".join(str(value).splitlines()))


#: Control characters (C0, DEL, C1): what a terminal reads as commands.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
#: Those, line breaks too: a key's value printed on one line.
_KEY_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _escaped(match: re.Match) -> str:
    return match.group().encode("unicode_escape").decode("ascii")


def texts_quoted_beside_others(frame: Any, columns: int) -> Any:
    """``frame`` whose first ``columns`` columns (keys), where a text among
    one's values prints as a value of another type does (``"1"`` beside
    ``1``), show each text of that column as Python writes it, ``'1'``
    (which ``why`` takes)."""
    frame = frame.copy()
    for name in frame.columns[:columns]:
        printed: dict[bool, set[str]] = {True: set(), False: set()}
        for value in frame[name]:
            if not _missing(value):
                printed[isinstance(value, str)].add(cell(value, exact=True))
        if printed[True] & printed[False]:
            frame[name] = frame[name].map(lambda v: repr(v) if isinstance(v, str) else v)
    return frame


def whole_numbers_as_ints(frame: Any, keys: int = 0, floats: Any = ()) -> Any:
    """``frame`` whose float columns that hold missing values beside whole
    numbers alone are nullable integers (``Int64``): integers that a
    missing value (a failed task's) made floats in pandas, printed as
    ``3``, not ``3.0`` (nor ``1.235e+05`` in a table). The first ``keys``
    columns (the keys) are left as they are: a float key prints as itself
    (``0.0``, not ``0``), whatever another key is missing; so are the
    columns named in ``floats`` (a metric of floats: an ``r2`` of 1.0)."""
    import numpy as np

    converted = {}
    for index in range(keys, frame.shape[1]):
        column = frame.iloc[:, index]
        if column.dtype.kind != "f" or not column.isna().any() or column.name in floats:
            continue
        values = column.dropna().to_numpy()
        if len(values) and np.isfinite(values).all() and (values == np.round(values)).all() \
                and (np.abs(values) < 2**53).all():
            converted[index] = column.astype("Int64")
    if not converted:
        return frame
    frame = frame.copy()
    for index, column in converted.items():
        frame.isetitem(index, column)
    return frame


def _missing(value: Any) -> bool:
    """A missing key value (None, NaN, NaT, NA): neither text nor another type."""
    import pandas as pd

    return value is None or value is pd.NA or value is pd.NaT or (
        isinstance(value, float) and math.isnan(value))


def json_value(value: Any) -> Any:
    """``value`` as JSON can hold it: a plain Python scalar; None for NaN (a
    missing value); the strings ``"Infinity"`` and ``"-Infinity"`` for an
    infinite float, which JSON has no number for: written as None too, a
    metric of inf would read back as missing. (``float("Infinity")`` in
    Python and ``Number("Infinity")`` in JavaScript read them back.) A time
    is its ISO 8601 text, as the command line's other times. A list,
    tuple or dict (a key of several columns, a metric that is a list) has
    each of its values so (``json.dumps(allow_nan=False)`` refuses a NaN
    anywhere, and the whole output would be lost to it)."""
    import pandas as pd

    if isinstance(value, (list, tuple)):
        return [json_value(each) for each in value]
    if isinstance(value, dict):
        return {str(name): json_value(each) for name, each in value.items()}
    if isinstance(value, (datetime.date, datetime.time)):  # (a pandas Timestamp too)
        return None if pd.isna(value) else value.isoformat()
    if value is pd.NaT or value is pd.NA:  # a missing time, duration or Int64: missing
        return None
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a NumPy scalar
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, float) and math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return value


def exception_line(exc: BaseException) -> str:
    """``ValueError: Input X contains NaN.``: an exception's type and the
    first line of its message, as :func:`error_line` says a task's error
    (its repr put scikit-learn's paragraph of advice on one line, ``\n``
    and all)."""
    said = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


def error_line(error: Any) -> str:
    """The line that says what went wrong in a task's ``error``: of a Python
    traceback, its exception's line (type and the message's first line), not
    the traceback's last line, which for a message of several lines is only
    the message's last one, without the exception's type; of another error
    (what became of a worker), its first line. Empty for none."""
    if not isinstance(error, str) or not error.strip():
        return ""
    lines = error.strip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith('  File "')]
    if frames:  # past the last frame's indented lines (its code, the ^^^ under it)
        rest = [line for line in lines[frames[-1] + 1:] if line and not line[0].isspace()]
        if rest:
            return rest[0]
    return next(line for line in lines if line.strip())


def local_time(t: Any) -> Any:
    """``t`` (seconds since the epoch, or a timezone-aware timestamp such as
    ``Store.runs()`` gives) as a local datetime with its offset; None for none."""
    from datetime import datetime

    if t is None or t != t:  # None, NaN, NaT
        return None
    if isinstance(t, datetime):  # by its instant: a pandas Timestamp's astimezone needs a zone
        return datetime.fromtimestamp(t.timestamp()).astimezone() if t.tzinfo else t.astimezone()
    return datetime.fromtimestamp(t).astimezone()


def iso_times(frame: Any, columns: list[str]) -> Any:
    """``columns`` (seconds since the epoch, or timezone-aware timestamps) as
    ISO 8601 local times with offset."""
    frame = frame.copy()
    for column in columns:
        frame[column] = [None if t is None else t.isoformat(timespec="milliseconds")
                         for t in map(local_time, frame[column])]
    return frame


def table_chunks(widths: list[int], keys: int, room: int) -> list[list[int]]:
    """Column indices per table, each table no wider than ``room`` where it can
    be, every one repeating the first ``keys`` columns (the task's key)."""
    def width(columns: list[int]) -> int:  # a rich table: "│ x │ y │"
        return sum(widths[i] + 3 for i in columns) + 1

    keys = min(keys, len(widths) - 1) if len(widths) > 1 else 0
    if width(list(range(keys))) + 10 > room:  # the key alone fills the room: repeat nothing
        keys = 0
    chunks, current = [], list(range(keys))
    for index in range(keys, len(widths)):
        if len(current) > keys and width(current + [index]) > room:
            chunks.append(current)
            current = list(range(keys))
        current.append(index)
    chunks.append(current)
    return chunks


#: Columns a terminal needs for a bordered table; narrower, a table is plain text.
MIN_TABLE_WIDTH = 20


def print_frame(frame: Any, title: str, fmt: OutputFormat = OutputFormat.table, keys: int = 1,
                console: Any = None, floats: Any = ()) -> None:
    """Print ``frame`` as csv, json, or a table. A table is never squeezed (no
    ``0.…``): piped or redirected it is plain aligned text; on a terminal too
    narrow for it, its columns are split over several tables, each repeating
    the first ``keys`` columns, printed whole (see :func:`cell`). A column
    of whole numbers with missing values (an integer metric or ``size``,
    missing for failed tasks) prints its numbers as integers, not ``3.0``
    (the key columns and those named in ``floats`` as they are)."""
    frame = whole_numbers_as_ints(frame, keys, floats)
    if fmt == OutputFormat.csv:
        typer.echo(frame.to_csv(index=False), nl=False)
        return
    if fmt == OutputFormat.json:
        records = [{str(k): json_value(v) for k, v in row.items()}
                   for row in frame.to_dict(orient="records")]
        typer.echo(json.dumps(records, indent=2, default=str, allow_nan=False))
        return

    import pandas as pd
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    headers = [str(c) for c in frame.columns]
    rows = [[cell(v, exact=i < keys) for i, v in enumerate(row)]
            for row in frame.itertuples(index=False, name=None)]
    right = [pd.api.types.is_numeric_dtype(kind) and not pd.api.types.is_bool_dtype(kind)
             for kind in frame.dtypes]
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    if not console.is_terminal or console.width < MIN_TABLE_WIDTH:  # no room for borders
        def line(cells: list[str]) -> str:
            padded = [" " * (w - cell_len(c)) + c if r else c + " " * (w - cell_len(c))
                      for c, w, r in zip(cells, widths, right)]
            return "  ".join(padded).rstrip()

        typer.echo("\n".join([line(headers)] + [line(r) for r in rows]))
        return
    for number, columns in enumerate(table_chunks(widths, keys, console.width)):
        table = Table(title=title if number == 0 else None)
        for i in columns:
            table.add_column(Text(headers[i]), justify="right" if right[i] else "left",
                             overflow="fold")
        for row in rows:  # Text: a value is never read as rich markup ("[red]")
            table.add_row(*[Text(row[i]) for i in columns])
        console.print(table)
