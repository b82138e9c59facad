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
    return keys.groupby(grouper, sort=False, dropna=False, observed=True).indices


@dataclass
class Routed:
    """Per row: the answer (NaN where no model answered), where it came from
    (``"group"``, ``"fallback"`` or ``"none"``); and the keys without a model."""

    values: np.ndarray | None
    source: np.ndarray
    unseen: list[Hashable] = field(default_factory=list)


def route_rows(positions: dict[Hashable, np.ndarray], rows: int, model_of: ModelOf,
               call: Callable[[Any, np.ndarray], Any], found: list | None = None) -> Routed:
    """``call(model, positions)`` for each key's model; answers in row order.
    ``found``: each key's ``model_of``, when the caller has it already."""
    out: np.ndarray | None = None
    source = np.full(rows, "none", dtype=object)
    unseen = []
    for index, (key, where) in enumerate(positions.items()):
        found_here = model_of(key) if found is None else found[index]
        if found_here is None:
            unseen.append(key)
            continue
        model, origin = found_here
        try:
            values = np.asarray(call(model, where))
        except Exception as exc:
            _name_the_group(exc, key)
            raise
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


def _name_the_group(exc: Exception, key: Hashable) -> None:
    """Say which group's model raised (as the engine's error does), keeping
    the model's own exception and type (Python 3.11's notes; 3.10 has none)."""
    if hasattr(exc, "add_note"):
        exc.add_note(f"(predicting the rows of group {key!r})")


def predict_backend(backend: str | None, workers: int | None,
                    positions: dict[Hashable, np.ndarray], found: list,
                    call: Callable[[Any, np.ndarray], Any]) -> tuple[str, float | None]:
    """Where a ``GroupedEstimator``'s groups predict, and what one costs (None:
    not measured). ``backend=None``: a few groups are predicted here first
    (``call`` with their ``found`` models), and when all groups at that cost
    would take more than ``Store.predict``'s half a second they go to worker
    processes, else they run here (:func:`route_rows`); ``"serial"`` or
    ``workers=1``: here; another backend: that one, as given."""
    import time

    from ..run.prediction import PARALLEL_ABOVE_S, PROBE_GROUPS

    if backend == "serial" or workers == 1 or len(positions) < 2:
        return "serial", None
    if backend is not None:
        return backend, None
    probed = list(zip(positions.items(), found))[:1 + PROBE_GROUPS]
    begin = time.perf_counter()
    for index, ((key, rows), (model, _)) in enumerate(probed):
        try:
            call(model, rows)
        except Exception as exc:
            _name_the_group(exc, key)
            raise
        if index == 0:  # the first warms imports and caches: it is not timed
            begin = time.perf_counter()
    each = (time.perf_counter() - begin) / max(1, len(probed) - 1)
    return ("processes" if each * len(positions) > PARALLEL_ABOVE_S else "serial"), each


class EstimatorGroups:
    """A fitted ``GroupedEstimator``'s models by group number, for a chunk's
    worker (:class:`manymodels.run.predictchunks.Groups`): each group's rows
    reach its model as they reached it in ``fit`` (``fit_group``: the
    feature columns, as a frame or as its array), and its answer is aligned
    on ``classes_`` as :meth:`GroupedEstimator._route` aligns it."""

    def __init__(self, models: list, method: str, classes: np.ndarray | None,
                 as_frame: bool) -> None:
        self.models, self.method, self.classes = models, method, classes
        self.as_frame, self.features = as_frame, []

    def predict(self, group: int, rows: pd.DataFrame, resource: Any = None) -> np.ndarray:
        # an array as X[rows] gives it in the caller (row-major): BLAS may
        # round a column-major product otherwise, in the last bit
        part = rows[self.features] if self.as_frame else np.ascontiguousarray(
            rows[self.features].to_numpy())
        return answer(self.models[group], self.method, part, self.classes)


def answer(model: Any, method: str, part: Any, classes: np.ndarray | None) -> np.ndarray:
    """``model.<method>(part)``, a classifier's columns placed among ``classes``
    (a group may have seen fewer)."""
    from ._levels import aligned

    values = np.asarray(getattr(model, method)(part))
    if method == "predict_proba":
        return aligned(classes, model, values, 0.0)
    if method == "decision_function" and len(classes) > 2:
        return aligned(classes, model, values, -np.inf)
    if method == "decision_function" and len(model.classes_) == 1 < len(classes):  # its scores mean
        # nothing: the side of the class it saw, as predict says
        return np.where(model.classes_[0] == classes[1], np.inf, -np.inf) * np.ones(len(values))
    return values


def route_on_engine(positions: dict[Hashable, np.ndarray], found: list, features: Any,
                    groups: EstimatorGroups, *, backend: str, workers: int | None,
                    seconds_per_group: float | None) -> Routed:
    """:func:`route_rows` on :func:`manymodels.train`'s engine: the rows of
    the keys whose ``found`` (``(model, origin)`` or None, in ``positions``'
    order) has a model go, sorted by key, in chunks of whole groups to
    ``backend``'s workers (:mod:`manymodels.run.predictchunks`, as
    ``Store.predict``); ``features``: what the models read (a frame, or
    its array), one row per row of X. A group whose prediction fails
    raises, naming it."""
    import os

    from ..run.predictchunks import (
        NONE,
        OWN,
        GroupFailure,
        chunk_size,
        in_row_order,
        run_chunks,
    )

    features = features if isinstance(features, pd.DataFrame) else pd.DataFrame(features)
    groups.features = list(features.columns)
    keys = list(positions)
    answered = [i for i, model in enumerate(found) if model is not None]
    unseen = [keys[i] for i, model in enumerate(found) if model is None]
    groups.models = [found[i][0] for i in answered]
    order = np.concatenate([positions[keys[i]] for i in answered] + [
        positions[key] for key in unseen]).astype(np.int64)
    lengths = np.array([len(positions[keys[i]]) for i in answered], dtype=np.int64)
    table = features.iloc[order[:int(lengths.sum())]].reset_index(drop=True)
    width = workers or os.cpu_count() or 1
    per_chunk = chunk_size(len(answered), seconds_per_group, width) if seconds_per_group \
        else max(1, -(-len(answered) // (width * 16)))
    answers = run_chunks(table, lengths, groups, fmt="pandas", per_chunk=per_chunk,
                         labels=None, backend=backend, workers=workers, setup=None,
                         progress=False, describe=lambda group: repr(keys[answered[group]]))
    failed = next((a for a in answers if isinstance(a, GroupFailure)), None)
    if failed is not None:
        raise RuntimeError(f"predicting group {keys[answered[failed.group]]!r} failed:\n"
                           f"{failed.error}")
    origin = np.array([OWN] * len(answered) + [NONE] * len(unseen), dtype=np.int8)
    all_lengths = np.concatenate([lengths, np.array(
        [len(positions[key]) for key in unseen], dtype=np.int64)])
    values, _ = in_row_order(answers, origin, all_lengths, order)
    source = np.full(len(order), "none", dtype=object)
    for i in answered:
        source[positions[keys[i]]] = found[i][1]
    return Routed(values, source, unseen)
