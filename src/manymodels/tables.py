"""Turning whatever table a user has into one ``pyarrow.Table``.

Accepted: pandas and polars DataFrames, pyarrow Tables, and paths to a Parquet
or CSV file or to a directory of them. Arrow is the common form because it can
be sorted once, sliced without copying and memory-mapped by every worker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

_PARQUET_SUFFIXES = {".parquet", ".pq", ".parq"}
_CSV_SUFFIXES = {".csv", ".tsv", ".txt"}


def _is_polars_frame(obj: Any) -> bool:
    return type(obj).__module__.startswith("polars") and hasattr(obj, "to_arrow")


def _read_file(path: Path) -> pa.Table:
    suffix = path.suffix.lower()
    try:
        if suffix in _PARQUET_SUFFIXES:
            import pyarrow.parquet as pq

            return pq.read_table(path)
        if suffix in _CSV_SUFFIXES:
            import pyarrow.csv as pcsv

            parse = pcsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ",")
            return pcsv.read_csv(path, parse_options=parse)
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"cannot read table file {str(path)!r}: {exc}") from exc
    raise ValueError(
        f"cannot read {str(path)!r}: unknown file type {suffix!r} "
        "(expected .parquet or .csv)"
    )


def _read_directory(path: Path) -> pa.Table:
    files = sorted(
        p for p in path.rglob("*")
        if p.is_file() and p.suffix.lower() in _PARQUET_SUFFIXES | _CSV_SUFFIXES
    )
    if not files:
        raise ValueError(f"directory {str(path)!r} holds no .parquet or .csv files")
    tables = [_read_file(p) for p in files]
    try:
        return pa.concat_tables(tables, promote_options="default")
    except pa.ArrowException as exc:
        raise ValueError(
            f"the files under {str(path)!r} do not share one schema: {exc}"
        ) from exc


def read_table(table: Any) -> pa.Table:
    """Read ``table`` (a frame, an Arrow table or a path) as a ``pyarrow.Table``."""
    if isinstance(table, pa.Table):
        return table
    if isinstance(table, pa.RecordBatch):
        return pa.Table.from_batches([table])
    if isinstance(table, (str, Path)):
        path = Path(table)
        if not path.exists():
            raise ValueError(f"table path {str(path)!r} does not exist")
        return _read_directory(path) if path.is_dir() else _read_file(path)
    if _is_polars_frame(table):
        return table.to_arrow()
    import pandas as pd

    if isinstance(table, pd.DataFrame):
        try:
            return pa.Table.from_pandas(table, preserve_index=False)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise ValueError(f"cannot convert the pandas DataFrame to Arrow: {exc}") from exc
    raise TypeError(
        "a table must be a pandas or polars DataFrame, a pyarrow Table, or a path "
        f"to a Parquet/CSV file or directory; got {type(table).__name__}"
    )
