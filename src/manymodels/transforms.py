"""Dataframe transforms on the same engine: :func:`map_groups` and
:func:`map_partitions` run a function per group or per row partition in
parallel and return one concatenated table."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from ._resources import usable_cores
from .api import train
from .results import Run
from .sources import GroupSource, PartitionSource, ProductSource


def _concat(parts: list[Any], what: str, keep_index: bool = False) -> Any:
    """Concatenate the outputs in order, keeping their kind of table (and,
    with ``keep_index``, pandas' row labels)."""
    if not parts:
        return pd.DataFrame()
    first = parts[0]
    module = type(first).__module__
    if module.startswith("pyarrow"):
        import pyarrow as pa

        return pa.concat_tables(parts)
    if module.startswith("polars"):
        import polars as pl

        return pl.concat(parts)
    frames = []
    for part in parts:
        if isinstance(part, pd.Series):
            part = part.to_frame()
        elif not isinstance(part, pd.DataFrame):
            if not hasattr(part, "to_pandas"):
                raise TypeError(f"{what}'s function must return a table, got "
                                f"{type(part).__name__}")
            part = part.to_pandas()
        frames.append(part)
    return pd.concat(frames, ignore_index=not keep_index)


def _ok_outputs(run: Run, errors: str, what: str) -> tuple[list[str], list[tuple[tuple, Any]]]:
    key_columns, outputs = run._ok_outputs()
    failed = run.failed
    if errors == "raise" and len(failed):
        row = failed.iloc[0]
        key = tuple(row[c] for c in key_columns)
        raise RuntimeError(
            f"{what}: {len(failed)} task(s) failed; the first, "
            f"{key[0] if len(key) == 1 else key!r}, with:\n{row['error']}"
        )
    return key_columns, outputs


def _check_errors(errors: str) -> None:
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")


def map_groups(
    fn: Callable[..., Any],
    source: GroupSource | ProductSource,
    *,
    errors: str = "raise",
    **options: Any,
) -> pd.DataFrame:
    """Run ``fn`` on every group and return one concatenated DataFrame, groups
    in key order, rows within a group as ``fn`` returned them.

    Like ``df.groupby(by, group_keys=False).apply(fn)``, in parallel. Key
    columns missing from ``fn``'s output are added in front. With
    ``errors="raise"`` (default) a failing group raises an error naming it;
    with ``errors="skip"`` its rows are left out. Other keywords go to
    :func:`train` (``backend``, ``workers``, ``shared``, ...).
    """
    _check_errors(errors)
    base = source.base if isinstance(source, ProductSource) else source
    if not isinstance(base, GroupSource):
        raise TypeError("map_groups needs a source made by mm.groups(...)")
    options.setdefault("progress", False)
    run = train(fn, source, **options)
    key_columns, outputs = _ok_outputs(run, errors, "map_groups")
    frames = []
    for parts, output in outputs:
        frame = _concat([output], "map_groups")
        missing = [c for c in key_columns if c not in frame.columns]
        if missing:
            frame = frame.copy()
            for position, name in enumerate(key_columns):
                if name in missing:
                    frame.insert(position, name, parts[position])
        frames.append(frame)
    return _concat(frames, "map_groups")


def map_partitions(
    fn: Callable[..., Any],
    table: Any,
    partitions: int | None = None,
    *,
    format: str = "pandas",
    errors: str = "raise",
    **options: Any,
) -> Any:
    """Run ``fn`` on row partitions of one large table, in parallel, and return
    the outputs concatenated in row order.

    The table is shared with the workers once (zero-copy); each task is an
    ``(offset, length)`` slice, handed to ``fn`` as ``format`` (``"pandas"``,
    ``"arrow"``, ``"polars"`` or ``"numpy"``). A pandas table handed to a
    pandas ``fn`` stays pandas: each partition is a view of its rows (index
    included; ``fn`` must not modify it in place), and the result keeps the
    row labels ``fn`` returns. ``partitions`` defaults to four per worker.
    ``fn`` may return a pandas, polars or Arrow table (or a Series); the
    result is of the same kind. Other keywords go to :func:`train`.
    """
    _check_errors(errors)
    if partitions is None:
        workers = options.get("workers") or usable_cores()
        partitions = 4 * workers
    source = PartitionSource(table, partitions, format=format)
    options.setdefault("progress", False)
    run = train(fn, source, **options)
    return _concat([output for _, output in _ok_outputs(run, errors, "map_partitions")[1]],
                   "map_partitions", keep_index=isinstance(source.table, pd.DataFrame))
