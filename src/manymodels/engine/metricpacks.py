"""Metrics as columns: a part's metrics as one array (:class:`MetricsPack`,
made by a worker's :class:`~manymodels.engine.partpacks.PartPacker`), and the
metrics of the tasks a re-run reuses as the store's texts
(:class:`MetricTexts`). Each stands for many tasks' metrics at once; one
task's are taken out only when asked for, and the results table reads them
as columns (:mod:`manymodels.engine.metriccolumns`)."""

from __future__ import annotations

from typing import Any

import numpy as np


def first_positions(indices: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """Where each of ``wanted`` first appears in ``indices`` (all must)."""
    order = np.argsort(indices, kind="stable")
    return order[np.searchsorted(indices, wanted, sorter=order)]


class MetricsPack:
    """The metrics of a part's tasks that all report ``names``, each a float,
    as one array: ``values[row]`` are task ``indices[row]``'s. A million
    ``{"rss": ...}`` dicts were a million objects to pickle, unpickle, hold
    (200 bytes each) and encode as JSON one at a time, 3 µs a task in the
    workers alone (measured); a pack is one array.

    For a store, the worker also makes the rows' JSON text (``texts``, see
    :func:`manymodels.engine.metrictext.pack_texts`): the store keeps that text,
    and made in the driver it was a quarter of the store writer's time, on
    the one thread that many busy workers wait on. The writer lets go of
    the text once it is committed (:meth:`drop_texts`).

    A pack of consecutive tasks (a part of a table's groups, the usual case)
    keeps its first task, not their indices (8 bytes a task the driver held
    through a run); :attr:`indices` makes them when asked."""

    __slots__ = ("names", "_indices", "_first", "values", "texts", "_positions")

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self._indices: Any = None  # np.ndarray of int64, set by seal()
        self._first: int | None = None  # instead, when the tasks are consecutive
        self.values: Any = None  # np.ndarray of float64, (tasks, names)
        #: each row's JSON object as a pyarrow string Array, or None (not made)
        self.texts: Any = None
        self._positions: dict[int, int] | None = None

    def seal(self, indices: list[int], values: list[float], texts: bool = False
             ) -> MetricsPack:
        """Fill the pack: ``values`` holds each task's values in ``names``
        order, one task after the other; ``texts``: make the rows' JSON text."""
        self.indices = np.array(indices, dtype=np.int64)
        self.values = np.array(values, dtype=np.float64).reshape(len(indices), len(self.names))
        if texts:
            from .metrictext import pack_texts

            try:
                self.texts = pack_texts(self.names, self.values)
            except Exception:  # (out of memory, say) the writer makes them, as before
                self.texts = None
        return self

    @property
    def indices(self) -> Any:
        """The tasks, in the pack's order (an int64 array; None before seal())."""
        if self._first is not None:
            return np.arange(self._first, self._first + len(self.values), dtype=np.int64)
        return self._indices

    @indices.setter
    def indices(self, indices: Any) -> None:
        self._indices, self._first = indices, None

    def __len__(self) -> int:
        return 0 if self.values is None else len(self.values)

    def _rows(self, indices: np.ndarray) -> np.ndarray:
        """The rows of tasks ``indices`` (each in the pack)."""
        if self._first is not None:
            rows = np.asarray(indices, dtype=np.int64) - self._first
            if len(rows) and (rows.min() < 0 or rows.max() >= len(self.values)):
                raise KeyError("a task that is not one of this pack's")
            return rows
        return first_positions(self._indices, indices)

    def __reduce__(self) -> tuple:
        texts = self.texts
        if texts is not None and not texts.offset and not texts.null_count:
            _, offsets, data = texts.buffers()  # the pack's own: its two buffers as bytes
            texts = (offsets.to_pybytes(), data.to_pybytes())
        return (_restore_metrics, (self.names, self.indices.tobytes(), self.values.tobytes(),
                                   texts))

    def get(self, index: int) -> dict[str, float]:
        """Task ``index``'s metrics as the dict ``fit`` returned (a new one)."""
        if self._first is not None:
            row = index - self._first
            if not 0 <= row < len(self.values):
                raise KeyError(index)
            return dict(zip(self.names, self.values[row].tolist()))
        if self._positions is None:
            self._positions = {}
            for at, task in enumerate(self.indices.tolist()):
                self._positions.setdefault(task, at)
        return dict(zip(self.names, self.values[self._positions[index]].tolist()))

    def rows_of(self, indices: np.ndarray) -> np.ndarray:
        """The values of tasks ``indices`` (each in the pack), a row each."""
        return self.values[self._rows(indices)]

    def texts_of(self, indices: np.ndarray) -> Any:
        """The JSON text of tasks ``indices`` (each in the pack), or None
        when the pack has no text (then it is made from :meth:`rows_of`)."""
        texts = self.texts
        if texts is None:
            return None
        rows = self._rows(indices)
        if len(rows) == len(self) and (rows == np.arange(len(rows))).all():
            return texts  # the whole pack, in order: as it came
        import pyarrow as pa

        return texts.take(pa.array(rows))

    def drop_texts(self) -> None:
        """Let go of the text (committed to the store: not needed again)."""
        self.texts = None


def _restore_metrics(names: tuple[str, ...], indices: bytes, values: bytes,
                     texts: Any = None) -> MetricsPack:
    pack = MetricsPack(names)
    tasks = np.frombuffer(indices, dtype=np.int64)
    count = len(tasks)
    if count and int(tasks[-1]) - int(tasks[0]) == count - 1 and (
            count == 1 or (np.diff(tasks) == 1).all()):
        pack._first = int(tasks[0])  # consecutive: the bytes go
    else:
        pack._indices = tasks
    pack.values = np.frombuffer(values, dtype=np.float64).reshape(count, len(names))
    if type(texts) is tuple:  # (offsets, data) of a string array of one per task
        import pyarrow as pa

        texts = pa.StringArray.from_buffers(count, pa.py_buffer(texts[0]),
                                            pa.py_buffer(texts[1]))
    pack.texts = texts
    return pack


class MetricTexts:
    """The metrics of the tasks a re-run reuses from one stored run, as that
    run's JSON texts in the order the store read them, and each task's row
    among them (``rows[task]``, -1 where the task is not one of them): the
    one object every such task's slot names. An unchanged re-run of a
    million took the texts into task order and made a million Python
    strings (0.2 s, a fifth of its time) for results not yet asked for; a
    task's text is now taken out when asked, all of them when the results
    table is made (:func:`manymodels.engine.metriccolumns.metric_columns`)."""

    __slots__ = ("texts", "rows")

    def __init__(self, texts: Any, rows: np.ndarray) -> None:
        self.texts = texts  # a pyarrow string Array or ChunkedArray
        self.rows = rows

    def __reduce__(self) -> tuple:
        return (MetricTexts, (self.texts, self.rows))

    def text(self, index: int) -> str | None:
        """Task ``index``'s metrics as the store's JSON text."""
        row = int(self.rows[index])
        if row < 0:
            raise KeyError(f"task {index} is not one of the tasks these metrics are of")
        return self.texts[row].as_py()

    def get(self, index: int) -> dict | None:
        """Task ``index``'s metrics as a dict (a new one)."""
        import json

        text = self.text(index)
        return None if text is None else json.loads(text)

    def texts_of(self, indices: np.ndarray) -> Any:
        """The texts of tasks ``indices`` (each one of them), as an Arrow array."""
        import pyarrow as pa

        from ..inputs.tables import one_array

        rows = self.rows[indices]
        if len(rows) and rows.min() < 0:
            raise KeyError("a task that is not one of the tasks these metrics are of")
        return one_array(self.texts.take(pa.array(rows)))
