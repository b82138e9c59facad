"""Predicting many groups as few engine tasks: chunks of consecutive groups.

A task per group costs the engine a few tens of microseconds in the driver
(planning, collecting, unpickling its answer) and as much in a worker: more
than a tiny model's whole prediction. So the rows to predict, sorted by
group, are cut into chunks of whole groups, sized from the measured cost of
a group (about :data:`TASK_SECONDS` a chunk, at least
:data:`CHUNKS_PER_WORKER` chunks a worker); each chunk is one task of
:func:`manymodels.train`'s engine, whose worker loops over its groups and
returns their predictions joined, in row order. Which model a group gets and
how it is called is the caller's (``Store.predict``: loaded from the store;
``GroupedEstimator``: its fitted models), passed in as a :class:`Groups`;
:func:`call_model` is how ``Store.predict`` calls a group's model.
"""

from __future__ import annotations

import math
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

#: The columns added to the rows to predict: each row's group number (in key
#: order) and its chunk's number. Never passed to a model.
GROUP = "__manymodels_predict_group__"
CHUNK = "__manymodels_predict_chunk__"
#: Where a group's rows got their predictions (:func:`in_row_order`).
NONE, OWN, FALLBACK = 0, 1, 2
SOURCES = np.array(["none", "group", "fallback"], dtype=object)
#: What one chunk should cost, in seconds: short enough to balance the
#: workers and show progress, long enough that a task's own cost vanishes.
TASK_SECONDS = 0.05
#: At least this many chunks a worker (when there are groups enough).
CHUNKS_PER_WORKER = 4


class Groups(Protocol):
    """Each group's model and how it predicts, for a chunk's worker."""

    def predict(self, group: int, rows: Any, resource: Any) -> Any:
        """Group ``group``'s predictions for its ``rows`` (a dict of NumPy
        columns or a DataFrame, without :data:`GROUP` and :data:`CHUNK`), or
        None when it has no model, or a :class:`GroupFailure`."""


class RefusedValueError(ValueError):
    """A value of a group's rows that its model refuses (text in a numeric
    feature, a NaN), its message naming the column: the table's fault, so
    the driver raises a ``ValueError`` of it (a server answers it 400)."""


class GroupFailure:
    """A group whose prediction failed, returned (not raised) by its chunk:
    the driver names the group as it planned it, a corrupt model stays a
    :class:`~manymodels.StoreIntegrityError`, not text, and a value the
    model refuses (``refused``: a :class:`RefusedValueError`) a ``ValueError``."""

    __slots__ = ("corrupt", "error", "group", "refused")

    def __init__(self, group: int, error: str, corrupt: bool = False,
                 refused: bool = False) -> None:
        self.group, self.error, self.corrupt, self.refused = group, error, corrupt, refused

    def __getstate__(self) -> tuple:
        return self.group, self.error, self.corrupt, self.refused

    def __setstate__(self, state: tuple) -> None:
        self.group, self.error, self.corrupt, self.refused = state


def failure_of(group: int, exc: Exception) -> GroupFailure:
    """Group ``group``'s failure by ``exc``: the error's own message first,
    which is what a reader needs (the worker's traceback follows it, for a
    model or ``fn`` whose fault it is; a refused value's message says all)."""
    if isinstance(exc, RefusedValueError):
        return GroupFailure(group, str(exc), refused=True)
    return GroupFailure(group, f"{type(exc).__name__}: {exc}\n\n{traceback.format_exc()}")


#: NumPy kinds of one family: groups whose predictions are all of one join
#: in its widest type; of several, they are objects, each value as it was.
_FAMILIES = {"i": "number", "u": "number", "f": "number", "c": "number", "U": "text",
             "S": "text"}


def joined(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """Predictions of several groups as one array, of the type all of them
    fit in (object when they do not share one, as labels and numbers)."""
    if len(pieces) == 1:
        return pieces[0]
    if len({p.shape[1:] for p in pieces}) > 1:
        return _rows_as_objects(pieces)
    families = {_FAMILIES.get(p.dtype.kind, p.dtype.kind) for p in pieces}
    try:  # (NumPy 2 makes numbers and text text, and True and 7 numbers: not one type)
        kind = np.result_type(*[p.dtype for p in pieces]) if len(families) == 1 else (
            np.dtype(object))
    except TypeError:
        kind = np.dtype(object)
    if any(p.dtype.kind == "O" for p in pieces):
        kind = np.dtype(object)
    if kind.kind == "O":
        return np.concatenate([p.astype(object) for p in pieces])
    return np.concatenate(pieces).astype(kind, copy=False)


def _rows_as_objects(pieces: Sequence[np.ndarray]) -> np.ndarray:
    """Pieces of unlike widths (``predict_proba`` of groups that saw 2 and
    3 classes) as one object array, a row's answer each: NumPy cannot join
    them as a matrix."""
    rows = np.empty(sum(len(p) for p in pieces), dtype=object)
    at = 0
    for piece in pieces:
        for row in piece:
            rows[at] = row
            at += 1
    return rows


class GroupColumns(dict):
    """One group's columns (a dict of NumPy arrays, as ``fit`` gets them),
    which also hand out the group's rows of the chunk's columns stacked once
    (:meth:`stacked`): one ``column_stack`` a chunk, not one a group."""

    __slots__ = ("_bounds", "_chunk")

    def stacked(self, names: list, dtype: Any = None) -> np.ndarray:
        """``np.column_stack`` of the columns ``names`` (as ``dtype``), for
        this group's rows: a view of the chunk's matrix."""
        columns, made = self._chunk
        wanted = (tuple(names), dtype)
        matrix = made.get(wanted)
        if matrix is None:
            matrix = made[wanted] = np.column_stack(
                [np.asarray(columns[c], dtype=dtype) for c in names])
        return matrix[self._bounds[0]:self._bounds[1]]


def stacked(columns: dict, names: list, dtype: Any = None) -> np.ndarray:
    """``np.column_stack`` of a group's columns ``names`` (as ``dtype``): a
    view of its chunk's matrix when it has one (:class:`GroupColumns`)."""
    if isinstance(columns, GroupColumns):
        return columns.stacked(names, dtype)
    return np.column_stack([np.asarray(columns[c], dtype=dtype) for c in names])


def _plain_estimator(model: Any) -> bool:
    """A scikit-learn estimator that reads its features by position (not a
    pipeline or column transformer, which may select columns by name)."""
    module = type(model).__module__
    return module.startswith("sklearn.") and not module.startswith(
        ("sklearn.pipeline", "sklearn.compose"))


#: scikit-learn regressors whose ``predict`` is ``X @ coef_.T + intercept_``
#: after validation (``LinearModel.predict``; they override it for its docstring).
_LINEAR = ("LinearRegression", "Ridge", "RidgeCV", "Lasso", "LassoCV", "ElasticNet",
           "ElasticNetCV")


def _linear_predict(model: Any) -> bool:
    """Whether ``model`` is exactly one of :data:`_LINEAR` (not a subclass,
    which may predict otherwise), with dense coefficients."""
    kind = type(model)
    return (kind.__module__.startswith("sklearn.linear_model.") and kind.__name__ in _LINEAR
            and isinstance(getattr(model, "coef_", None), np.ndarray))


def _has_times(columns: Any, names: list[str]) -> bool:
    """Whether a column of ``names`` holds datetimes or durations, which a
    cast to float would make numbers (a date, its microseconds since 1970)
    where scikit-learn refuses them."""
    return any(getattr(columns[c], "dtype", None) is not None and columns[c].dtype.kind in "Mm"
               for c in names)


def call_model(model: Any, method: str, columns: dict[str, np.ndarray], names: list[str]
               ) -> Any:
    """``model.<method>`` of a group's feature columns. A model fitted on a
    DataFrame gets one, except a plain scikit-learn estimator: it gets the
    same columns, in its ``feature_names_in_`` order, as one NumPy array,
    which skips its DataFrame validation (most of a small group's cost)."""
    import warnings

    import pandas as pd

    named = hasattr(model, "feature_names_in_")
    if method == "predict" and _linear_predict(model) and (
            not named or list(model.feature_names_in_) == names) and not _has_times(
            columns, names):
        # scikit-learn's LinearModel.predict, the same product, minus ~50 us
        # of validation per call (a group of 5 rows costs ~5 us)
        X = stacked(columns, names, float)
        if np.isfinite(X).all():  # else scikit-learn's own check names the NaN or inf
            return X @ model.coef_.T + model.intercept_
    if not named:
        return getattr(model, method)(stacked(columns, names))
    if _plain_estimator(model) and list(model.feature_names_in_) == names:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="X does not have valid feature names")
            return getattr(model, method)(stacked(columns, names))
    return getattr(model, method)(pd.DataFrame({c: columns[c] for c in names}))


class ChunkPredictor:
    """The task run per chunk: each of its groups' rows through
    ``groups.predict``; their answers joined in row order (an empty array
    when no group had a model), or the first :class:`GroupFailure`."""

    def __call__(self, rows: Any, groups: Groups, resource: Any = None) -> Any:
        numpy = isinstance(rows, dict)
        numbers = np.asarray(rows[GROUP])
        cuts = np.flatnonzero(numbers[1:] != numbers[:-1]) + 1
        starts = [0, *cuts.tolist()]
        ends = [*cuts.tolist(), len(numbers)]
        if numpy:
            names = [c for c in rows if c not in (GROUP, CHUNK)]
            chunk = ({c: rows[c] for c in names}, {})
        else:
            rows = rows.drop(columns=[GROUP, CHUNK])
        pieces = []
        for start, end in zip(starts, ends):
            group = int(numbers[start])
            if numpy:
                part = GroupColumns({c: rows[c][start:end] for c in names})
                part._chunk, part._bounds = chunk, (start, end)
            else:
                part = rows.iloc[start:end].reset_index(drop=True)
            try:
                values = groups.predict(group, part, resource)
            except Exception as exc:
                return failure_of(group, exc)
            if values is None:
                continue
            if isinstance(values, GroupFailure):
                return values
            pieces.append(values)
        return joined(pieces) if pieces else np.empty(0)


def chunk_size(groups: int, seconds_per_group: float, workers: int) -> int:
    """Groups a chunk: about :data:`TASK_SECONDS` of work, and at least
    :data:`CHUNKS_PER_WORKER` chunks a worker."""
    by_time = TASK_SECONDS / max(seconds_per_group, 1e-7)
    by_balance = groups / max(1, workers * CHUNKS_PER_WORKER)
    return max(1, int(min(by_time, math.ceil(by_balance))))


def measure(groups: Groups, table: pa.Table, offsets: np.ndarray, lengths: np.ndarray,
            as_rows: Callable[[pa.Table, int, int], Any], resource: Any, probes: int) -> float:
    """Seconds a group takes to predict here: the first group alone warms
    imports and caches (and counts only when alone); the next ``probes``
    run as one chunk, as the engine runs them (``as_rows(table, first,
    last)``: the rows of groups ``first`` to ``last - 1`` as the chunk's
    task gets them). An exception propagates: the caller leaves it to the
    run, which names the group. The chunk runs twice and the quicker time
    counts: a busy machine that takes the core away once does not send
    cheap predictions to workers."""
    task = ChunkPredictor()
    end = min(len(lengths), 1 + probes)
    timings = []
    for first, last in [(0, 1)] + [(1, end)] * (2 if end > 1 else 0):
        begin_row = int(offsets[first])
        rows = as_rows(table.slice(begin_row, int(offsets[last - 1] + lengths[last - 1])
                                   - begin_row), first, last)
        begin = time.perf_counter()
        done = task(rows, groups, resource)
        timings.append((time.perf_counter() - begin) / (last - first))
        if isinstance(done, GroupFailure):
            raise FailedProbe(done)
    return timings[0] if len(timings) == 1 else min(timings[1:])


class FailedProbe(RuntimeError):
    """A group of :func:`measure`'s probe failed (``failure``, as the run
    would return it)."""

    def __init__(self, failure: GroupFailure) -> None:
        super().__init__(failure.error)
        self.failure = failure


def numbered(table: Any, lengths: np.ndarray, per_chunk: int) -> Any:
    """``table`` (an Arrow table or a DataFrame, sorted by group, ``lengths``
    rows each) with :data:`GROUP` and :data:`CHUNK` columns."""
    numbers = np.arange(len(lengths), dtype=np.int64)
    group, chunk = np.repeat(numbers, lengths), np.repeat(numbers // per_chunk, lengths)
    if not isinstance(table, pa.Table):
        return table.assign(**{GROUP: group, CHUNK: chunk})
    return table.append_column(GROUP, pa.array(group)).append_column(CHUNK, pa.array(chunk))


def run_chunks(table: Any, lengths: np.ndarray, groups: Groups, *, fmt: str,
               per_chunk: int, labels: list | None, backend: str, workers: int | None,
               setup: Callable[[], Any] | None, progress: bool,
               describe: Callable[[int], str]) -> list[Any]:
    """Each chunk's answer (see :class:`ChunkPredictor`), in order, from the
    engine. A chunk whose task failed (its worker died, say) raises, naming
    its groups with ``describe(group number)``."""
    from ..inputs.sources import groups as group_source
    from .results import _loaded
    from .runner import train

    source = group_source(numbered(table, lengths, per_chunk), by=CHUNK, format=fmt)
    if labels is not None:  # the caller's column labels (numbers, say), as fn reads them
        source.column_labels = [*labels, GROUP, CHUNK]
    run = train(ChunkPredictor(), source, shared={"groups": groups}, setup=setup,
                backend=backend, workers=workers, progress=progress)
    records = run._records
    failed = np.flatnonzero(~records.ok_mask())
    if len(failed):
        index = int(failed[0])
        first = index * per_chunk
        last = min(len(lengths), first + per_chunk) - 1
        named = describe(first) if first == last else \
            f"{describe(first)} to {describe(last)}"
        raise RuntimeError(f"predicting group {named} failed: {records.error_of(index)}")
    return [_loaded(records.model[i], i) for i in range(records.size)]


def in_row_order(answers: list[np.ndarray], origin: np.ndarray, lengths: np.ndarray,
                 input_rows: np.ndarray | None) -> tuple[np.ndarray | None, np.ndarray]:
    """The chunks' answers (for the groups whose ``origin`` is not
    :data:`NONE`, in group order) laid back in the input's row order
    (``input_rows``: the input row of each sorted row, None when the same),
    NaN for the rest (in a type that holds it); and each row's origin."""
    rows_origin = np.repeat(origin, lengths)
    answered = rows_origin != NONE
    pieces = [a for a in answers if len(a)]
    out: np.ndarray | None = None
    if pieces:
        values = joined(pieces)
        kind = values.dtype
        unanswered = not answered.all()
        if unanswered and kind.kind in "iub":
            kind = np.dtype(float)
        elif unanswered and kind.kind not in "fcO":
            kind = np.dtype(object)
        out = np.empty((len(rows_origin), *values.shape[1:]), dtype=kind)
        if unanswered:
            out[~answered] = np.nan
        out[answered] = values
    if input_rows is not None:  # back from key order to the input's row order
        inverse = np.empty_like(input_rows)
        inverse[input_rows] = np.arange(len(input_rows))
        rows_origin = rows_origin[inverse]
        out = out[inverse] if out is not None else None
    return out, rows_origin
