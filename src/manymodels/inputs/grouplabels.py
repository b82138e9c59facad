"""A group's rows under their input labels, for :func:`manymodels.map_groups`.

``mm.train`` hands ``fit`` a pandas group under a fresh index 0, 1, ...;
pandas' ``groupby().apply`` hands it the rows' own labels, and takes an
output under those labels, in order, for a transform. Under a fresh index a
function that sorts its rows and resets the index looked exactly like one
that keeps them, and its rows came back under other rows' labels. So
``map_groups`` runs a pandas ``fn`` through :class:`WithLabels`: each group
under its rows' labels in the input frame (their positions, for an Arrow or
polars table or a file), and :func:`is_transform` compares an output's
labels with those.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from .keys import encode_key

#: The shared object that carries the labels to the workers.
SHARED_NAME = "__manymodels_group_labels__"


def input_positions(layout: Any) -> np.ndarray:
    """Each sorted row's position in the input table."""
    order = layout.input_rows  # the planner's sort; None: the input was in key order
    return np.arange(int(layout.lengths.sum())) if order is None else order


def group_labels(layout: Any, row_index: Any) -> tuple[Any, np.ndarray, np.ndarray]:
    """Each sorted row's input label (``row_index``, or its position), and
    each group's offset and length among them."""
    positions = input_positions(layout)
    total = len(positions)
    labels = (pd.Index(positions) if row_index is None or len(row_index) != total
              else row_index[positions])
    return labels, layout.offsets, layout.lengths


def shared_labels(layout: Any, row_index: Any) -> dict[str, Any]:
    """What :class:`WithLabels` reads: the labels, and where each group's are
    (by its encoded key: a key that travelled no longer is the same object)."""
    labels, offsets, lengths = group_labels(layout, row_index)
    spans = {encode_key(tuple(parts)): (int(offset), int(length))
             for parts, offset, length in zip(layout.keys, offsets, lengths)}
    return {SHARED_NAME: (labels, spans)}


class WithLabels:
    """``fn`` called with its group's rows under their input labels."""

    def __init__(self, fn: Callable[..., Any], passes_key: bool) -> None:
        self.fn, self.passes_key = fn, passes_key

    def __call__(self, rows: Any, key: Any, **kwargs: Any) -> Any:
        labels, spans = kwargs.pop(SHARED_NAME)
        if isinstance(rows, pd.DataFrame):
            offset, length = spans[encode_key(key if isinstance(key, tuple) else (key,))]
            rows.index = labels[offset:offset + length]
        return self.fn(rows, key=key, **kwargs) if self.passes_key else self.fn(rows, **kwargs)


def is_transform(output: Any, labels: Any) -> bool:
    """Whether a pandas output holds its group's rows, in order, under the
    labels its group had (pandas' test of a transform)."""
    return len(output) == len(labels) and output.index.equals(labels)
