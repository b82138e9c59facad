"""The numbers the dashboard's charts are drawn from: histograms and
quantiles of finite values, and key labels cut to a readable length. Pure
functions of lists: the queries (:mod:`.queries`) read the store."""

from __future__ import annotations

import math
from typing import Any

from ...inputs.keys import decode_key

BINS = 30


#: The characters of a key the dashboard shows: a key of megabytes (a long
#: text item) shipped whole in every poll's slowest tasks, failures and timeline.
KEY_CHARACTERS = 200


def key_label(text: str, whole: bool = False) -> str:
    """A stored key (JSON list) as the dashboard shows it: ``s1, i7``, a time
    ``2024-01-31 00:00:00`` (not its stored tag, ``{"$datetime": ...}``), cut to
    :data:`KEY_CHARACTERS` with its length said, unless ``whole`` (what a
    search matches)."""
    try:
        parts = decode_key(text)
    except (ValueError, TypeError, KeyError):  # no key manymodels wrote: shown as stored
        label = text
    else:  # as Python prints each value, as the report and the command line do
        label = ", ".join(map(str, parts))
    if whole or len(label) <= KEY_CHARACTERS:
        return label
    return f"{label[:KEY_CHARACTERS]}... ({len(label):,} characters)"


def finite(value: Any) -> float | None:
    """``value`` where it is a finite number; None otherwise (NaN, infinity,
    text, or a whole number past a float's range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return value if math.isfinite(value) else None
    except OverflowError:  # an int of 2**1024 or more
        return None


def histogram(values: list[float], bins: int = BINS) -> dict[str, Any]:
    """``values`` counted in ``bins`` buckets from their least to their
    greatest. Distances are taken in halves: finite values a float's range
    apart (-1e308 and 1e308) have a difference that overflows to infinity,
    and the bucket of inf / inf (NaN) failed the whole page's answer."""
    if not values:
        return {"low": None, "high": None, "counts": []}
    low, high = min(values), max(values)
    half_width = (high / 2 - low / 2) / bins or 1.0
    counts = [0] * bins
    for value in values:
        counts[min(int((value / 2 - low / 2) / half_width), bins - 1)] += 1
    return {"low": low, "high": high, "counts": counts}


def mean(values: list[float]) -> float:
    """The mean of finite ``values``, finite too: their sum can overflow."""
    return sum(value / len(values) for value in values)


def quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of ``ordered``, between its two nearest values as a
    weighted sum (their difference can overflow: see :func:`histogram`)."""
    position = q * (len(ordered) - 1)
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    share = position - below
    return ordered[below] * (1 - share) + ordered[above] * share
