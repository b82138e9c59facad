"""Sending each row to its group's model: the one loop behind
``Store.predict`` and ``GroupedEstimator.predict``.

Rows are grouped by key once (pandas' hash grouping, not a Python loop over
rows); each group's rows go to its model in one call; the answers are put back
in row order. Which model a key gets (a group's own, a fallback, none) is the
caller's rule, passed in as ``model_of``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

#: ``model_of(key)``: ``(model, origin)`` with origin ``"group"`` or
#: ``"fallback"``, or None when the key has no model.
ModelOf = Callable[[Hashable], "tuple[Any, str] | None"]


def group_positions(keys: pd.DataFrame) -> dict[Hashable, np.ndarray]:
    """The row positions of each distinct key of ``keys`` (a scalar key for one
    column, a tuple for several; missing values are keys too)."""
    columns = list(keys.columns)
    grouper = columns[0] if len(columns) == 1 else columns
    return keys.groupby(grouper, sort=False, dropna=False).indices


@dataclass
class Routed:
    """Per row: the answer (NaN where no model answered), where it came from
    (``"group"``, ``"fallback"`` or ``"none"``); and the keys without a model."""

    values: np.ndarray | None
    source: np.ndarray
    unseen: list[Hashable] = field(default_factory=list)


def route_rows(positions: dict[Hashable, np.ndarray], rows: int, model_of: ModelOf,
               call: Callable[[Any, np.ndarray], Any]) -> Routed:
    """``call(model, positions)`` for each key's model; answers in row order."""
    out: np.ndarray | None = None
    source = np.full(rows, "none", dtype=object)
    unseen = []
    for key, where in positions.items():
        found = model_of(key)
        if found is None:
            unseen.append(key)
            continue
        model, origin = found
        values = np.asarray(call(model, where))
        if out is None:
            out = np.empty((rows, *values.shape[1:]), dtype=values.dtype)
        elif out.dtype != values.dtype and out.dtype.kind != "O":
            out = out.astype(np.result_type(out.dtype, values.dtype))
        out[where] = values
        source[where] = origin
    if out is not None and unseen:
        if out.dtype.kind in "iub":
            out = out.astype(float)
        elif out.dtype.kind not in "fcO":
            out = out.astype(object)
        out[source == "none"] = np.nan
    return Routed(out, source, unseen)
