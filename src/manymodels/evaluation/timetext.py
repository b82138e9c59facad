"""Which text time columns a backtest can sort: those whose text order is time order.

A backtest sorts each group by its time column. Text sorts character by
character, which is time order only for text of one fixed layout whose
fields run from the largest unit to the smallest: ISO 8601 dates and
times ("2024-01-05", "2024-01", "2024-01-05T10:00:00", with one UTC
offset throughout) and whole numbers of one width ("007", "012"). Any
other text ("11/01/2023", "Jan 2024", "-3", weeks "1" to "12") would sort
out of time order, and a backtest would train on rows later than those it
tests: it is refused, naming the column, before any work.
"""

from __future__ import annotations

import re
from typing import Any

#: The layouts of ISO 8601 text (each digit written ``9``, a fraction of a
#: second left out) that sort as their times: a date, a month, a week, or a
#: date and time (``T`` or a space between, seconds optional) with an
#: optional UTC offset (``Z``, ``+01:00``).
_ISO_LAYOUT = re.compile(
    r"9999-99(-99)?"
    r"|9999-W99(-9)?"
    r"|9999-99-99[T ]99:99(:99)?(Z|[+-]99:?99)?")
#: A fraction of a second: text order compares fractions of any length as
#: numbers ("00.25" before "00.5"), so their length is left out of a layout.
_FRACTION = re.compile(r"\.[0-9]+")
#: Where a fraction of a second may stand: after a date and time's seconds.
_SECONDS = len("9999-99-99T99:99:99")
_OFFSET = re.compile(r"[+-]99:?99$")
_HOW = "convert it with pandas.to_datetime (or to numbers) first"


def _layout(text: str) -> str:
    return re.sub("[0-9]", "9", _FRACTION.sub("", text))


def _pattern(first: str) -> str | None:
    """A regular expression that text of ``first``'s layout matches (and its
    UTC offset, where it has one), when that layout sorts as time; else None."""
    layout = _layout(first)
    if not (layout == "9" * len(layout) or _ISO_LAYOUT.fullmatch(layout)):
        return None
    offset = _OFFSET.search(layout)
    body = layout[:offset.start()] if offset else layout
    parts = ["[0-9]" if char == "9" else re.escape(char) for char in body]
    if len(body) >= _SECONDS and body[_SECONDS - 3] == ":":
        # a fraction or none sort in time order before "+" and at the end,
        # not before "Z" ("00.5Z" before "00Z"): there, all or none have one
        fraction = _FRACTION.search(first) is not None
        parts.insert(_SECONDS, r"\.[0-9]+" if fraction and body.endswith("Z")
                     else "" if body.endswith("Z") else r"(?:\.[0-9]+)?")
    if offset:
        parts.append(re.escape(first[len(first) - len(offset.group()):]))
    return "^" + "".join(parts) + "$"


def check_text_times(times: Any, name: str) -> None:
    """Refuse the text time column ``times`` (an Arrow array or chunked
    array; any other type passes) unless its text order is its time order:
    every value of one layout that sorts as time (one regular expression
    over the column, made from its first value's layout)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = times.type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        return
    times = pc.drop_null(times)
    if len(times) == 0:
        return
    pattern = _pattern(times[0].as_py())
    if pattern is not None and pc.all(pc.match_substring_regex(times, pattern)).as_py():
        return
    raise ValueError(f"evaluate: time column {name!r} holds {_what_is_wrong(times)}, which "
                     f"sorts as text, not in time order: {_HOW}")


def _what_is_wrong(times: Any) -> str:
    """What a refused text time column holds, with examples (its values
    looked at one by one: this is the refusal's path only)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if pc.all(pc.utf8_is_digit(times)).as_py():
        numbers = pc.cast(times, pa.float64())
        lowest = times[pc.index(numbers, pc.min(numbers)).as_py()].as_py()
        highest = times[pc.index(numbers, pc.max(numbers)).as_py()].as_py()
        return (f"whole numbers as text of different lengths ({lowest!r} to {highest!r}: "
                "\"10\" before \"2\")")
    texts = pc.unique(times).to_pylist()
    for text in texts:
        if _pattern(text) is None:
            return f"text that is not ISO 8601 dates or times (such as {text!r})"
    first = texts[0]
    other = next(text for text in texts if _layout(text) != _layout(first)
                 or not re.fullmatch(_pattern(first) or "", text))
    zones = [re.search(r"(Z|[+-][0-9]{2}:?[0-9]{2})?$", text).group() for text in (first, other)]
    if _layout(other) == _layout(first) and zones[0] != zones[1]:
        return f"times of different UTC offsets ({first!r} and {other!r})"
    return f"times written in different layouts ({first!r} and {other!r})"


def check_text_time_values(values: Any, name: str) -> None:
    """:func:`check_text_times` of one group's time values (a NumPy array),
    for rows read on the workers, which the driver never saw."""
    if values.dtype.kind not in "OUT" or not len(values) or not isinstance(values[0], str):
        return
    import pyarrow as pa

    try:
        times = pa.array(values, type=pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # text mixed with other values
        raise ValueError(f"evaluate: time column {name!r} mixes text with other values, "
                         f"which cannot be sorted in time order: {_HOW}") from None
    check_text_times(times, name)
