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

#: A DataFrame output of at most this many rows travels as :class:`FrameFacts`.
FACTS_UP_TO = 4096
#: The dtype kinds whose columns FrameFacts carries as NumPy arrays (numbers,
#: bools, datetimes): an object or extension column is left to pandas' concat.
_PLAIN_KINDS = frozenset("biufcmM")

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
    """What :class:`WithLabels` reads, as the one shared object it travels
    in: :class:`GroupLabels`."""
    labels, offsets, lengths = group_labels(layout, row_index)
    return {SHARED_NAME: GroupLabels(labels, layout.keys, offsets, lengths)}


class GroupLabels:
    """The sorted rows' labels and where each group's are (by its encoded
    key: a key that travelled no longer is the same object). A store's task
    identity counts a group's own labels alone, folded into its data hash
    (:func:`manymodels.identity.hashing.task_identities`), not the whole
    table's as a shared object's: a group appended, or another group's rows
    relabelled, ran every group again."""

    __slots__ = ("labels", "spans", "offsets", "lengths")

    def __init__(self, labels: Any, keys: Any, offsets: Any, lengths: Any) -> None:
        self.labels = labels
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.spans = {encode_key(tuple(parts)): (int(offset), int(length))
                      for parts, offset, length in zip(keys, self.offsets, self.lengths)}

    def of(self, key: Any) -> Any:
        """The labels of the group of ``key`` (as ``fit`` is handed it)."""
        offset, length = self.spans[encode_key(key if isinstance(key, tuple) else (key,))]
        return self.labels[offset:offset + length]


class WithLabels:
    """``fn`` called with its group's rows under their input labels."""

    def __init__(self, fn: Callable[..., Any], passes_key: bool, facts: bool = False) -> None:
        self.fn, self.passes_key, self.facts = fn, passes_key, facts

    def __call__(self, rows: Any, key: Any, **kwargs: Any) -> Any:
        labels = kwargs.pop(SHARED_NAME)
        received = None
        if isinstance(rows, pd.DataFrame):
            rows.index = received = labels.of(key)
        output = self.fn(rows, key=key, **kwargs) if self.passes_key else self.fn(rows, **kwargs)
        if self.facts and received is not None:
            return FrameFacts.of(output, received)
        return output


class FrameFacts:
    """A small DataFrame output with what the driver judges of it, judged in
    the worker: its columns as NumPy arrays, whether it is a transform
    (:func:`is_transform`) and whether its index holds row labels
    (:func:`holds_row_labels`) of the group's ``received`` labels. At
    20,000 tiny groups the driver spent more on unpickling each output (its
    two Indexes made anew, some 130 us a frame) than the workers on ``fn``;
    arrays (made as it is pickled) unpickle in a few microseconds, and where every output has the
    same columns and dtypes the driver concatenates them column by column
    (:mod:`manymodels.run.groupoutputs`). The frame itself travels as its
    pickle, loaded only where the driver needs it (another shape of outputs:
    pandas' concat then, as for any output)."""

    __slots__ = ("signature", "arrays", "rows", "transform", "row_labels", "_frame", "_data")

    def __init__(self, signature: tuple, arrays: tuple, rows: int, transform: bool,
                 row_labels: bool, frame: pd.DataFrame | None, data: bytes | None) -> None:
        self.signature, self.arrays, self.rows = signature, arrays, rows
        self.transform, self.row_labels = transform, row_labels
        self._frame, self._data = frame, data

    @classmethod
    def of(cls, output: Any, received: Any) -> Any:
        """``output`` with its facts, where it is a small DataFrame of
        unique plain columns and nothing pandas' concat would carry besides
        (attrs, flags); anything else as it is."""
        if type(output) is not pd.DataFrame or len(output) > FACTS_UP_TO or output.attrs or (
                not output.flags.allows_duplicate_labels):
            return output
        columns, dtypes = output.columns, output.dtypes.tolist()
        if columns.nlevels != 1 or not columns.is_unique or not all(
                isinstance(dtype, np.dtype) and dtype.kind in _PLAIN_KINDS for dtype in dtypes):
            return output
        signature = (type(columns).__name__, str(columns.dtype), tuple(columns),
                     tuple(dtype.str for dtype in dtypes))
        # a transform's index is its group's labels: row labels, no need to look
        transform = is_transform(output, received)
        return cls(signature, None, len(output), transform,
                   transform or holds_row_labels(output.index, received), output, None)

    @property
    def local(self) -> bool:
        """Whether the frame is at hand (it did not cross a process boundary):
        pandas' concat of the frames is then cheaper than their arrays."""
        return self._frame is not None

    def columns(self) -> tuple:
        """The frame's columns as NumPy arrays, made as it is pickled (by the
        worker, not the driver) or when first asked for."""
        if self.arrays is None:
            self.arrays = tuple(column.to_numpy() for _, column in self._frame.items())
        return self.arrays

    @property
    def frame(self) -> pd.DataFrame:
        """The output itself."""
        if self._frame is None:
            import pickle

            self._frame = pickle.loads(self._data)
        return self._frame

    def __reduce__(self) -> tuple:
        import pickle

        data = self._data if self._data is not None else pickle.dumps(self._frame, protocol=5)
        return (_restore_facts, (self.signature, self.columns(), self.rows, self.transform,
                                 self.row_labels, data))


def _restore_facts(signature: tuple, arrays: tuple, rows: int, transform: bool,
                   row_labels: bool, data: bytes) -> FrameFacts:
    return FrameFacts(signature, arrays, rows, transform, row_labels, None, data)


def is_transform(output: Any, labels: Any) -> bool:
    """Whether a pandas output holds its group's rows, in order, under the
    labels its group had (pandas' test of a transform)."""
    return len(output) == len(labels) and output.index.equals(labels)


def indexes_as_columns(outputs: list[pd.DataFrame], received: Any = None) -> list[pd.DataFrame]:
    """Each DataFrame output that is no transform, with the index levels that
    hold values (``groupby("day").sum()``, ``set_index("x")``,
    ``resample(...)``, ``describe()``) as columns in front of its own, as
    ``reset_index()`` makes them: the outputs are concatenated under a fresh
    index, which would drop them. An index of row labels is dropped: the
    default ``0, 1, ...`` or, under the names of the labels ``fn`` received,
    labels among those (a filter's). A level named like one of the output's
    columns is dropped too (``set_index("x", drop=False)``: the column holds
    it). Which it is is judged once for all the outputs whose index has the
    same level names: row labels only where every such index holds labels of its own group's
    rows. Judged output by output, an unnamed index of values that happen
    to be among one group's row labels (``index=[1, 2]`` where that group
    holds rows 0 to 3) and not another's was dropped for the first and a
    column ``index`` for the second, empty (NaN) in the first's rows.
    ``received[i]``: the labels output ``i``'s group was handed (None:
    positions)."""
    labels: dict[tuple, bool] = {}
    for i, output in enumerate(outputs):
        if not is_fresh_index(output.index):
            names = tuple(output.index.names)
            labels[names] = labels.get(names, True) and holds_row_labels(
                output.index, None if received is None else received[i])
    return [output if is_fresh_index(output.index) or labels[tuple(output.index.names)]
            else values_as_columns(output) for output in outputs]


def values_as_columns(output: pd.DataFrame) -> pd.DataFrame:
    """``output``'s index levels as columns in front of its own, as
    ``reset_index()`` makes them, but for a level named like a column."""
    index = output.index
    names = [name if name is not None else ("index" if index.nlevels == 1 else f"level_{i}")
             for i, name in enumerate(index.names)]
    columns = set(output.columns)
    kept = [level for level, name in enumerate(names) if name not in columns]
    if not kept:
        return output
    frame = output.set_axis(index.set_names(names), axis=0)
    return frame.reset_index(level=kept, drop=False)


def holds_row_labels(index: pd.Index, received: Any) -> bool:
    """Whether ``index`` labels rows rather than holding values (see
    :func:`indexes_as_columns`): the default ``0, 1, ...``, or labels among
    ``received`` under its level names (None: positions, unnamed)."""
    if is_fresh_index(index):
        return True
    if received is None:  # positions 0, 1, ... of a group handed under a fresh index
        return (index.nlevels == 1 and index.name is None and pd.api.types.is_integer_dtype(
            index.dtype) and (len(index) == 0 or index.min() >= 0))
    if list(index.names) != list(received.names):
        return False
    try:
        return bool(index.isin(received).all())
    except (TypeError, ValueError):  # labels that cannot be compared with the rows'
        return False


def is_fresh_index(index: pd.Index) -> bool:
    """Whether ``index`` is pandas' default: an unnamed ``0, 1, ...``."""
    return isinstance(index, pd.RangeIndex) and index.start == 0 and index.step == 1 and (
        index.name is None)
