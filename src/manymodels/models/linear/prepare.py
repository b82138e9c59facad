"""From a user's table to blocks of groups that the kernels fit at once.

The table is read as for ``mm.groups``, checked before any work (a missing,
non-numeric or incomplete column is refused by name), its keys coded once
(``pandas.factorize``: hashing, O(rows)) and, only when its rows are not
already in key order, sorted once. Groups are then laid out in *blocks*: each
block a dense ``(groups, rows, features)`` array. A block holds groups of
similar size (groups are taken in size order), shorter ones padded with rows
of weight zero, so that every kernel is a handful of batched array operations
with no per-group Python loop, and a block's size bounds the memory used at
any number of groups.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from ...inputs.tables import exact_pandas, read_table
from .glance import GLANCE_COLUMNS

FAMILIES = ("ols", "ridge", "wls", "logistic")
#: Padded rows in one block: small enough that a block's arrays stay in the
#: CPU's cache between the kernel's passes over them.
BLOCK_ROWS = 1 << 16


def _names(value: str | Sequence[str], argument: str) -> list[str]:
    names = [value] if isinstance(value, str) else list(value)
    if not all(isinstance(n, str) for n in names):
        raise TypeError(f"{argument}= must name columns as strings, got {value!r}")
    return names


def _is_numeric(kind: pa.DataType) -> bool:
    return (pa.types.is_integer(kind) or pa.types.is_floating(kind)
            or pa.types.is_boolean(kind) or pa.types.is_decimal(kind))


def _column(table: pa.Table, name: str, role: str) -> np.ndarray:
    """Column ``name`` as float64, refusing a non-numeric or incomplete one."""
    kind = table.schema.field(name).type
    if not _is_numeric(kind):
        raise ValueError(f"{role} column {name!r} is not numeric (its type is {kind})")
    column = table.column(name)
    if column.null_count:
        raise ValueError(f"{role} column {name!r} has {column.null_count} missing values; "
                         "drop or fill them first")
    # rounded to the nearest float64, as scikit-learn reads it: a safe cast
    # refuses an integer past 2**53 (epoch nanoseconds, an id), naming no column
    values = np.asarray(column.cast(pa.float64(), safe=False).to_numpy(), dtype=np.float64)
    bad = ~np.isfinite(values)
    if bad.any():
        raise ValueError(f"{role} column {name!r} has {int(bad.sum())} NaN or infinite "
                         f"values (first at row {int(np.flatnonzero(bad)[0])})")
    return values


@dataclass
class Prepared:
    """The checked input: key table, each group's rows and the numeric columns."""

    keys: pd.DataFrame          # one row per group, in key order
    counts: np.ndarray          # rows per group
    starts: np.ndarray          # first row of each group in sorted order
    order: np.ndarray | None    # sorted position -> table row (None: already sorted)
    columns: list[np.ndarray]   # each feature's column, then the target's; table order
    w: np.ndarray | None        # weights, or None for all ones
    alpha: np.ndarray | float   # per group, or one value

    @property
    def groups(self) -> int:
        return len(self.counts)


#: The columns a result adds beside the key columns (``.metrics``: the row
#: count, the fit statistics of every family, the status and the run reused
#: from; ``.coefficients``: the intercept): no key column may take one's name.
RESULT_COLUMNS = frozenset({"n", "status", "reused_from", "intercept", "r2", "rmse",
                            "log_loss", "accuracy", "converged", "iterations", *GLANCE_COLUMNS})


def check(table: Any, by: Any, features: Any, target: str, family: str,
          weights: str | None, alpha: Any) -> tuple[pa.Table, list[str], list[str]]:
    """Refuse bad arguments before reading anything large; return the table,
    the key columns and the features."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    by_columns = _names(by, "by")
    feature_columns = _names(features, "features")
    if not by_columns:
        raise ValueError("linear() needs at least one column in by=")
    if len(set(by_columns)) < len(by_columns):
        raise ValueError(f"by= names a column twice: {by_columns}")
    if not feature_columns:
        raise ValueError("linear() needs at least one column in features=")
    if not isinstance(target, str):
        raise TypeError(f"target= must name a column as a string, got {target!r}")
    if family == "wls" and weights is None:
        raise ValueError("family='wls' needs weights= (the column of row weights)")
    if "intercept" in feature_columns:
        raise ValueError("a feature column is named 'intercept', the name of the intercept "
                         "in .coefficients; rename it")
    taken = [name for name in by_columns if name in RESULT_COLUMNS]
    if taken:
        raise ValueError(f"by column {taken[0]!r} has the name of a column of the result "
                         f"(.metrics or .coefficients), which would hide the groups' keys; "
                         "rename it")
    if len(set(feature_columns)) < len(feature_columns):
        raise ValueError(f"features= names a column twice: {feature_columns}")
    table = read_table(table)
    roles = [("by", c) for c in by_columns] + [("feature", c) for c in feature_columns]
    if weights is not None and not isinstance(weights, str):
        raise TypeError(f"weights= must name a column as a string, got {weights!r}")
    # (weights='' too: a falsy name skipped this check and failed in Arrow, unnamed)
    roles += [("target", target)] + ([("weights", weights)] if weights is not None else [])
    roles += [("alpha", alpha)] if isinstance(alpha, str) else []
    for role, name in roles:
        if name not in table.column_names:
            raise ValueError(f"{role} column {name!r} is not in the table; its columns are "
                             f"{table.column_names}")
    for role, name in roles[len(by_columns):]:
        if name in by_columns:
            raise ValueError(f"{role} column {name!r} is also a by column")
    if target in feature_columns:
        raise ValueError(f"target column {target!r} is also a feature")
    if table.num_rows == 0:
        raise ValueError("the table is empty: there are no groups to fit")
    return table, by_columns, feature_columns


def group_layout(table: pa.Table) -> tuple[pd.DataFrame, np.ndarray, np.ndarray | None]:
    """The key table (groups in key order), each group's row count, and the
    permutation that sorts the rows by group (None when they are sorted)."""
    if table.num_columns == 1 and table.column(0).null_count == 0 and (
            pa.types.is_integer(table.schema.types[0])):
        values = table.column(0).to_numpy()
        if len(values) < 2 or (values[1:] >= values[:-1]).all():  # sorted already: no hashing
            starts = np.flatnonzero(np.concatenate([[True], values[1:] != values[:-1]]))
            counts = np.diff(np.append(starts, len(values)))
            return pd.DataFrame({table.column_names[0]: values[starts]}), counts, None
    # integer keys beside a missing one as Int64, not float64: as floats, two
    # keys past 2**53 would read the same and their groups be fitted as one
    frame = exact_pandas(table)
    codes = None
    uniques = []
    for name in frame.columns:  # missing keys form a group of their own, as in mm.groups
        code, unique = pd.factorize(frame[name], sort=True, use_na_sentinel=False)
        uniques.append(unique)
        code = code.astype(np.int64)
        if codes is None:
            codes = code
        elif codes.max(initial=0) < (1 << 62) // max(len(unique), 1):
            codes = codes * len(unique) + code
        else:  # a radix too wide for int64: number the pairs seen
            codes = pd.factorize(pd.MultiIndex.from_arrays([codes, code]), sort=True)[0]
    assert codes is not None
    if len(uniques) == 1:
        keys = pd.DataFrame({frame.columns[0]: uniques[0]})
    else:
        codes, combined = pd.factorize(codes, sort=True)
        first = np.full(len(combined), -1, dtype=np.int64)
        first[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)  # each group's first row
        keys = frame.iloc[first].reset_index(drop=True)
    counts = np.bincount(codes, minlength=len(keys))
    order = None
    if len(codes) > 1 and (codes[1:] < codes[:-1]).any():
        order = np.argsort(codes, kind="stable")
    return keys, counts, order


def prepare(table: pa.Table, by: list[str], features: list[str], target: str,
            weights: str | None, alpha: Any, family: str) -> Prepared:
    """Read the numeric columns and lay out the groups (see the module's doc)."""
    columns = [_column(table, c, "feature") for c in features]
    y = _column(table, target, "target")
    columns.append(y)
    if family == "logistic" and not np.isin(y, (0.0, 1.0)).all():
        bad = y[~np.isin(y, (0.0, 1.0))][0]
        raise ValueError(f"target column {target!r} must hold the classes 0 and 1 (or "
                         f"booleans) for family='logistic'; it holds {bad!r}")
    w = None
    if weights is not None:
        w = _column(table, weights, "weights")
        if (w < 0).any():
            raise ValueError(f"weights column {weights!r} has negative values")
    keys, counts, order = group_layout(table.select(by))
    starts = np.zeros(len(counts), dtype=np.int64)
    np.cumsum(counts[:-1], out=starts[1:])
    alpha_value: np.ndarray | float
    if isinstance(alpha, str):
        column = _column(table, alpha, "alpha")
        sorted_alpha = column if order is None else column[order]
        alpha_value = sorted_alpha[starts]
        spread = np.maximum.reduceat(sorted_alpha, starts) - np.minimum.reduceat(sorted_alpha,
                                                                                 starts)
        if (spread != 0).any():
            raise ValueError(f"alpha column {alpha!r} differs within a group "
                             f"({keys.iloc[int(np.flatnonzero(spread)[0])].tolist()})")
    else:
        alpha_value = float(alpha)
    if np.any(np.asarray(alpha_value) < 0):
        raise ValueError(f"alpha must be >= 0, got {alpha!r}")
    return Prepared(keys, counts, starts, order, columns, w, alpha_value)


@dataclass
class Block:
    """Groups ``index`` as dense arrays; padded rows have weight 0."""

    index: np.ndarray   # group numbers
    Z: np.ndarray       # (g, m, p + 1): the features, then the target
    w: np.ndarray | None
    alpha: np.ndarray | float


def blocks(data: Prepared, block_rows: int = BLOCK_ROWS) -> Iterator[Block]:
    """The groups in blocks of at most ``block_rows`` padded rows (or one
    group, however large), each holding groups of similar size."""
    counts = data.counts
    by_size = np.argsort(counts, kind="stable")
    sizes = counts[by_size]
    position = 0
    while position < len(by_size):
        first = sizes[position]
        # groups of this block: size at most 1.25x the first (little padding), rows in budget
        limit = np.searchsorted(sizes, max(first + 1, int(first * 1.25) + 1), side="left")
        m_cap = sizes[min(limit, len(sizes)) - 1]
        take = max(1, min(limit - position, block_rows // max(int(m_cap), 1)))
        index = by_size[position:position + take]
        position += take
        yield _gather(data, np.sort(index))


def _gather(data: Prepared, index: np.ndarray) -> Block:
    counts = data.counts[index]
    m = int(counts.max())
    alpha = data.alpha if np.ndim(data.alpha) == 0 else data.alpha[index]
    starts = data.starts[index]
    # (the groups' starts, not their numbers: a store fits some groups only)
    contiguous = (counts == m).all() and data.order is None and (
        len(index) == 1 or (np.diff(starts) == m).all())
    if contiguous:  # equal groups, in table order: a reshape, no gather
        rows = slice(int(starts[0]), int(starts[0]) + m * len(index))
        Z = np.stack([c[rows].reshape(len(index), m) for c in data.columns], axis=-1)
        w = None if data.w is None else data.w[rows].reshape(len(index), m)
        return Block(index, Z, w, alpha)
    offsets = np.arange(m)
    valid = offsets[None, :] < counts[:, None]
    rows = np.where(valid, starts[:, None] + offsets[None, :], starts[:, None])
    if data.order is not None:
        rows = data.order[rows]
    w = valid.astype(np.float64) if data.w is None else np.where(valid, data.w[rows], 0.0)
    if valid.all() and data.w is None:
        w = None
    return Block(index, np.stack([c[rows] for c in data.columns], axis=-1), w, alpha)
