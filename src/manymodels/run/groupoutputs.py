"""What map_groups makes of its function's outputs: one table, of the kind
the function returns (pandas, Arrow, polars), in key order with the key
columns in front, or, for a transform of pandas groups under their rows'
labels, back in the input's row order under its labels
(:func:`manymodels.map_groups` says which when). The outputs are
concatenated by :mod:`.outputconcat`, as map_partitions' are."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ..inputs.grouplabels import (
    FrameFacts,
    group_labels,
    indexes_as_columns,
    input_positions,
    is_transform,
)
from ..inputs.keys import key_frame
from ..inputs.sources import GroupSource
from ..planning.plan import group_layout
from .outputconcat import concat_outputs, empty_table
from .outputtables import is_value
from .results import Run


@dataclass(frozen=True)
class GroupKeys:
    """The key of each output's group: its Python values (``rows``) and,
    where the plan has them, the input table's own Arrow key columns
    (``table``, a row per output). The key columns added to the outputs are
    made from ``table`` so that they keep the input's types (``uint8``, a
    categorical's categories and their order, ``datetime64[s]``), whatever
    kind of table ``fn`` returns; Python values would make them ``int64``
    and text."""

    columns: list
    rows: list[tuple]
    table: pa.Table | None

    @classmethod
    def of_run(cls, run: Run, columns: list, rows: list[tuple]) -> GroupKeys:
        """The keys of the tasks that succeeded (``rows``, in plan order)."""
        typed = run._plan.typed_keys()
        tasks = np.flatnonzero(run._records.ok_mask())
        if typed is None or len(tasks) != len(rows) or typed.num_rows != len(run._plan):
            return cls(list(columns), list(rows), None)
        return cls(list(columns), list(rows), typed.take(pa.array(tasks)))

    def subset(self, groups: Sequence[int]) -> GroupKeys:
        """The keys of outputs ``groups`` only (the ones kept), in that order."""
        table = None if self.table is None else self.table.take(pa.array(groups, pa.int64()))
        return GroupKeys(self.columns, [self.rows[i] for i in groups], table)

    def frame(self, lengths: Sequence[int] | None = None) -> pd.DataFrame:
        """The keys as a pandas frame, a column per key column, each group's
        row repeated ``lengths[group]`` times (once without ``lengths``)."""
        # the Arrow columns are named as text: an int column name 0 is "0" there
        frame = key_frame([str(name) for name in self.columns], self.rows, self.table)
        frame.columns = pd.Index(self.columns, dtype=object)
        if lengths is not None:
            frame = frame.take(np.repeat(np.arange(len(frame)), lengths))
            frame.index = pd.RangeIndex(len(frame))
        return frame

    def arrow_column(self, position: int, group: int, length: int) -> Any:
        """Key column ``position`` of output ``group``, ``length`` rows of its value."""
        if self.table is not None and position < self.table.num_columns:
            return self.table.column(position).take(pa.array(np.full(length, group)))
        return pa.array([self.rows[group][position]] * length)

    def polars_column(self, position: int, group: int, length: int) -> Any:
        """As :meth:`arrow_column`, a polars Series named as the key column."""
        import polars as pl

        name = str(self.columns[position])
        if self.table is not None and position < self.table.num_columns:
            try:
                return pl.Series(name, pl.from_arrow(self.arrow_column(position, group, length)))
            except Exception:  # noqa: BLE001 - an Arrow type polars cannot hold: its values
                pass
        return pl.Series(name, [self.rows[group][position]] * length)


def _with_keys(output: Any, keys: GroupKeys, group: int) -> Any:
    """An Arrow or polars table ``output`` of group ``group`` with the key
    columns it lacks (by their names) added in front, its group's key value
    in every row; any other output as it is."""
    names = [str(name) for name in keys.columns]
    module = type(output).__module__
    if module.startswith("pyarrow"):
        if not isinstance(output, pa.Table):
            return output
        for position in [i for i, name in enumerate(names) if name not in output.column_names]:
            output = output.add_column(position, names[position],
                                       keys.arrow_column(position, group, output.num_rows))
        return output
    if module.startswith("polars"):
        import polars as pl

        if not isinstance(output, pl.DataFrame):
            return output
        for position in [i for i, name in enumerate(names) if name not in output.columns]:
            output = output.insert_column(position,
                                          keys.polars_column(position, group, output.height))
        return output
    return output


def _as_transform(base: GroupSource, run: Run, outputs: list[Any]) -> tuple | None:
    """When every non-empty pandas output holds exactly its group's rows,
    labelled as ``fn`` received them (a transform): the input position of each
    row of their concatenation, and which outputs they are; else None. Only
    for groups ``fn`` received under their rows' labels: one it got under a
    fresh index (an Arrow or polars group, a ``shared`` of its own named
    ``key``) may come back sorted under a fresh index too, which no label
    tells from its rows in order."""
    if not all(isinstance(out, (pd.DataFrame, pd.Series)) for out in outputs):
        return None
    layout = group_layout(base)  # the plan's layout, cached on the source
    rec = run._records
    done = np.flatnonzero(rec.ok_mask()).tolist()
    if len(done) != len(outputs) or len(run._plan.tasks) != len(layout.lengths):
        return None
    labels, offsets, lengths = group_labels(layout, base.row_index)
    kept = [i for i, out in enumerate(outputs) if len(out)]
    if not kept or not all(is_transform(outputs[i], labels[offsets[done[i]]:offsets[done[i]]
                                                          + lengths[done[i]]]) for i in kept):
        return None
    return _transform_positions(base, run, kept), kept


def _transform_positions(base: GroupSource, run: Run, kept: list[int]) -> np.ndarray:
    """The input position of each row of outputs ``kept`` (a transform's,
    of the tasks that succeeded), concatenated."""
    layout = group_layout(base)
    order = input_positions(layout)
    if len(kept) == len(layout.lengths):  # every group, in layout order
        return order
    done = np.flatnonzero(run._records.ok_mask())
    offsets, lengths = layout.offsets, layout.lengths
    return np.concatenate([order[offsets[g]:offsets[g] + lengths[g]]
                           for g in done[np.asarray(kept, dtype=np.int64)].tolist()])


def _in_input_order(result: Any, positions: np.ndarray, base: GroupSource) -> Any:
    """``result``, whose rows came from input rows ``positions``, put back in
    the input's row order under its row labels (its positions when it has none)."""
    if len(positions) > 1 and not np.all(positions[1:] > positions[:-1]):
        permutation = np.argsort(positions, kind="stable")
        result = result.take(permutation)
        positions = positions[permutation]
    total = base.table.num_rows
    labels = getattr(base, "row_index", None)
    if labels is None or len(labels) != total:
        labels = pd.RangeIndex(total)
    result.index = labels if len(positions) == total else labels[positions]
    return result


def _frames_with_keys(frames: list[pd.DataFrame], keys: GroupKeys) -> pd.DataFrame:
    """The frames concatenated, with the key columns they lack added in front,
    of the input's types. A key column only some frames have is put where it
    would be had none had it, their values and the others' keys in the key's
    type where they fit it."""
    if not frames:
        return pd.DataFrame()
    result = pd.concat(frames, ignore_index=True)
    has = [set(frame.columns) for frame in frames]
    added = [i for i, name in enumerate(keys.columns) if not all(name in names for names in has)]
    if not added:
        return result
    lengths = [len(frame) for frame in frames]
    return _add_keys(result, frames, has, added, lengths, keys)


def _add_keys(result: pd.DataFrame, frames: list[Any], has: list[set], added: list[int],
              lengths: list[int], keys: GroupKeys) -> pd.DataFrame:
    """``result`` (the frames concatenated) with key columns ``added`` (by
    position) put in front where some frames lack them."""
    typed = keys.frame(lengths)
    for position in added:
        name = keys.columns[position]
        column = typed[name]
        if any(name in names for names in has):
            column = _partly_given(frames, name, column, lengths)
            result.pop(name)
        result.insert(position, name, column.array)
    return result


def _keys_in_front(result: pd.DataFrame, keys: GroupKeys, added: list[int],
                   lengths: list[int]) -> pd.DataFrame:
    """``result`` (outputs of ``lengths`` rows each, concatenated, none of
    which has the key columns ``added``) with those columns put in front at
    their positions, each row its group's key."""
    typed = keys.frame(lengths)
    for position in added:
        name = keys.columns[position]
        result.insert(position, name, typed[name].array)
    return result


def _partly_given(frames: list[pd.DataFrame], name: Any, keys: pd.Series,
                  lengths: list[int]) -> pd.Series:
    """Key column ``name`` of the frames' concatenation: a frame's own values
    where it has the column, its group's key (``keys``, a row per row) where
    it lacks it; in the key's type unless a frame's values do not fit it."""
    ends = np.cumsum(lengths)
    pieces = [frame[name] if name in frame.columns else keys.iloc[end - length:end]
              for frame, end, length in zip(frames, ends, lengths)]
    column = pd.concat(pieces, ignore_index=True)
    if column.dtype == keys.dtype:
        return column
    try:
        typed = column.astype(keys.dtype)
    except (TypeError, ValueError, OverflowError):
        return column
    # a cast can change values silently: 300 to uint8 is 44, a value outside
    # a categorical's categories NaN
    missing = column.isna().to_numpy()
    if (typed.isna().to_numpy() != missing).any() or (
            typed.to_numpy(dtype=object)[~missing] != column.to_numpy(dtype=object)[~missing]
    ).any():
        return column
    return typed


def _rows_per_group(outputs: list[pd.Series], keys: GroupKeys) -> pd.DataFrame:
    """Series of the same labels, one per group, as rows of one frame with the
    key columns in front (pandas' ``groupby(..., as_index=False).apply``)."""
    labels = outputs[0].index
    if labels.is_unique:
        frame = pd.DataFrame(outputs).reset_index(drop=True)
    else:  # a label repeated (in every output, in one order) is a column per place
        frame = pd.DataFrame([out.set_axis(pd.RangeIndex(len(out))) for out in outputs])
        frame = frame.reset_index(drop=True).set_axis(labels, axis=1)
    typed = keys.frame()
    for position, name in enumerate(keys.columns):
        if name not in frame.columns:
            frame.insert(position, name, typed[name].array)
    return frame


def _same_labels(indexes: list[pd.Index]) -> pd.Index | None:
    """The first index when every index has its labels, in any order (a dict
    built by group may order its keys by group), so that each output's values
    line up by label; else None. Labels repeated within an index align with no
    one order, so those must come in the same order."""
    first = indexes[0]
    if all(index.equals(first) for index in indexes[1:]):
        return first
    if not first.is_unique or not all(len(index) == len(first) and index.is_unique
                                      for index in indexes[1:]):
        return None
    if all((first.get_indexer(index) >= 0).all() for index in indexes[1:]):
        return first
    return None


def _values_under_keys(values: list, keys: GroupKeys) -> pd.Series:
    """One value per group as a Series under the key columns, as pandas'
    ``df.groupby(by).apply(lambda rows: rows["x"].sum())`` makes it."""
    typed = keys.frame()
    levels = [pd.Index(typed[name], name=name) for name in keys.columns]
    index = levels[0] if len(levels) == 1 else pd.MultiIndex.from_arrays(levels)
    return pd.Series(values, index=index)


def _series_under_keys(outputs: list[pd.Series], keys: GroupKeys) -> pd.Series:
    """Series whose labels differ by group (``value_counts``) concatenated
    under a MultiIndex of the key columns and their labels, as pandas'
    ``groupby().apply`` makes it: bare, their labels would not say which group
    a row is of (x, y, x, z)."""
    values = pd.concat(outputs, ignore_index=True)
    typed = keys.frame([len(out) for out in outputs])
    # the levels built from arrays: concat(keys=) cannot make a level of
    # tuple keys that hold a NaN ("Key nan not in level")
    levels = [pd.Index(typed[name]) for name in keys.columns]
    inner = outputs[0].index.append([out.index for out in outputs[1:]])
    levels += [inner.get_level_values(level) for level in range(inner.nlevels)]
    values.index = pd.MultiIndex.from_arrays(levels, names=[*keys.columns,
                                                            *outputs[0].index.names])
    return values


class _ReceivedLabels:
    """The labels each output's group was handed under (its rows' in the
    input frame), an output per task that succeeded, sliced only for the
    outputs asked about (most have a fresh index, and need none)."""

    def __init__(self, run: Run, base: GroupSource) -> None:
        self.labels, self.offsets, self.lengths = group_labels(group_layout(base),
                                                               base.row_index)
        self.tasks = np.flatnonzero(run._records.ok_mask())

    @classmethod
    def of_run(cls, run: Run, base: GroupSource, outputs: int) -> _ReceivedLabels | None:
        """None where the labels are not known (the plan's tasks are not the
        layout's groups)."""
        if len(run._plan.tasks) != len(group_layout(base).lengths) or (
                int(run._records.ok_mask().sum()) != outputs):
            return None
        return cls(run, base)

    def subset(self, outputs: Sequence[int]) -> _ReceivedLabels:
        """The labels of outputs ``outputs`` only, in that order."""
        self.tasks = self.tasks[np.asarray(outputs, dtype=np.int64)]
        return self

    def __getitem__(self, output: int) -> Any:
        task = self.tasks[output]
        return self.labels[self.offsets[task]:self.offsets[task] + self.lengths[task]]


def _facts_table(run: Run, base: GroupSource, outputs: list[Any], keys: GroupKeys,
                 received: _ReceivedLabels | None) -> pd.DataFrame | None:
    """The table of outputs that are all :class:`FrameFacts` of the same
    columns and dtypes, a transform or each under row labels (the index
    dropped), their columns concatenated as NumPy arrays: what pandas'
    concat of the frames makes, without a frame made per output. None for
    any other outputs (they are then loaded, and judged one by one)."""
    if received is None or not outputs or not all(type(out) is FrameFacts for out in outputs):
        return None
    signature = outputs[0].signature
    if not all(out.signature == signature for out in outputs):
        return None
    kept = [i for i, out in enumerate(outputs) if out.rows]
    transform = bool(kept) and all(outputs[i].transform for i in kept)
    if not transform and not all(out.row_labels for out in outputs):
        return None  # an index of values: columns of some outputs only
    chosen = kept if transform else list(range(len(outputs)))
    result = _concatenated([outputs[i] for i in chosen], outputs[0].frame)
    if result is None:
        return None
    first = outputs[0].frame
    columns = set(first.columns)
    added = [i for i, name in enumerate(keys.columns) if name not in columns]
    if added:
        if transform:
            keys = keys.subset(kept)
        result = _keys_in_front(result, keys, added, [outputs[i].rows for i in chosen])
    if transform:
        return _in_input_order(result, _transform_positions(base, run, kept), base)
    return result


def _concatenated(outputs: list[FrameFacts], first: pd.DataFrame) -> pd.DataFrame | None:
    """Outputs of ``first``'s columns and dtypes concatenated under a fresh
    index: by pandas where their frames are at hand (the serial and thread
    backends), else column by column from their arrays; None where the
    arrays would not make ``first``'s dtypes."""
    if all(out.local for out in outputs):
        return pd.concat([out.frame for out in outputs], ignore_index=True)
    arrays = {position: np.concatenate([out.columns()[position] for out in outputs])
              for position in range(len(first.columns))}
    result = pd.DataFrame(arrays, copy=False)
    result.columns = first.columns  # as pandas made them
    return result if result.dtypes.tolist() == first.dtypes.tolist() else None


def _named(key: tuple) -> Any:
    """A group's key as an error names it: one value for one key column, as
    Python holds it (not NumPy's ``np.int64(2)``)."""
    parts = tuple(part.item() if isinstance(part, np.generic) else part for part in key)
    return parts[0] if len(parts) == 1 else parts


def assemble(run: Run, base: GroupSource, source: Any, key_columns: list,
             ok: list[tuple[tuple, Any]], labelled: bool = True) -> Any:
    """The outputs of the groups that succeeded as one table (see map_groups)."""
    keys = GroupKeys.of_run(run, key_columns, [key for key, _ in ok])
    received = (_ReceivedLabels.of_run(run, base, len(ok)) if source is base and labelled
                else None)
    table = _facts_table(run, base, [output for _, output in ok], keys, received)
    if table is not None:
        return table
    ok = [(key, output.frame if type(output) is FrameFacts else output) for key, output in ok]
    present = [i for i, (_, output) in enumerate(ok) if output is not None]
    if not present and (not ok or base.format in ("arrow", "polars")):
        return empty_table(base.format)
    if present and all(is_value(ok[i][1]) for i in present):
        return _values_under_keys([ok[i][1] for i in present], keys.subset(present))
    if not all(isinstance(ok[i][1], (pd.DataFrame, pd.Series)) for i in present) or (
            present and all(isinstance(ok[i][1], pd.Series) for i in present)):
        # a pandas stand-in for None would be a second kind of table, or make
        # Series (value_counts, a row of aggregates) frames that lose their labels
        ok, keys = [ok[i] for i in present], keys.subset(present)
        received = None if received is None else received.subset(present)
    # a group whose fn returned None has no rows, as in pandas' apply
    outputs = [pd.DataFrame() if output is None else output for _, output in ok]
    series = bool(outputs) and all(isinstance(out, pd.Series) for out in outputs)
    if not series:
        outputs = [out.to_frame() if isinstance(out, pd.Series) else out for out in outputs]
    transform = _as_transform(base, run, outputs) if source is base and labelled else None
    if transform is not None:
        positions, kept = transform
        outputs, keys = [outputs[i] for i in kept], keys.subset(kept)
    if series:
        if transform is not None:
            return _in_input_order(pd.concat(outputs, ignore_index=True), positions, base)
        labels = _same_labels([out.index for out in outputs])
        if labels is not None:  # (labels repeated come in one order: nothing to align)
            return _rows_per_group([out if out.index.equals(labels) else out.reindex(labels)
                                    for out in outputs], keys)
        return _series_under_keys(outputs, keys)
    if all(isinstance(out, pd.DataFrame) for out in outputs):
        if transform is None:  # under a fresh index: the values an index holds as columns
            outputs = indexes_as_columns(outputs, received)
        result = _frames_with_keys(outputs, keys)
    else:
        result = concat_outputs([_with_keys(out, keys, group)
                                 for group, out in enumerate(outputs)], "map_groups",
                                names=[f"group {_named(key)!r}" for key, _ in ok])
    return _in_input_order(result, positions, base) if transform is not None else result
