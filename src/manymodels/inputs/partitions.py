"""Hive-style partition folders: ``sales/year=2024/month=01/part-0.parquet``.

A directory written by ``pyarrow.parquet.write_to_dataset(partition_cols=...)``,
Spark or Hive keeps a column's value in the folder names, not in its files.
Read file by file, those columns were lost, and ``by=`` could not name them.
Here each file's folder names give its partition columns (one value per
file), typed as pandas and pyarrow read them: integers where every value is
one, else text; ``__HIVE_DEFAULT_PARTITION__`` is a missing value, and a
value is URL-decoded.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa

#: The folder name a Hive writer gives a missing value.
NULL_FOLDER = "__HIVE_DEFAULT_PARTITION__"
_INTEGER = re.compile(r"-?[0-9]+")


def _segments(root: str | Path, file: str | Path) -> list[tuple[str, str]]:
    # (parts only: a path made of a URI, s3://b/t, reads as "s3:/b/t", which
    # no error shows; both sides read alike)
    return [tuple(part.split("=", 1)) for part in Path(file).relative_to(root).parent.parts
            if "=" in part]


def partition_table(root: str | Path, files: list[str] | list[Path]) -> pa.Table | None:
    """A row per file of ``files`` (under ``root``: local paths, or object
    stores' URIs as errors may show them) with its partition columns, or
    None when no file lies in a ``name=value`` folder. Files whose folders
    name other columns are refused by name, as given."""
    rows = [_segments(root, file) for file in files]
    if not any(rows):
        return None
    names = [name for name, _ in rows[0]]
    for file, row in zip(files, rows):
        if [name for name, _ in row] != names:
            raise ValueError(
                f"the files under {str(root)!r} are not partitioned alike: {str(file)!r} "
                f"lies in folders of {[name for name, _ in row]}, {str(files[0])!r} in "
                f"folders of {names}")
    columns = {}
    for position, name in enumerate(names):
        values = [None if row[position][1] == NULL_FOLDER else unquote(row[position][1])
                  for row in rows]
        # integers where every folder writes one as Python does, in int64's range: "007"
        # beside "7" stays text (two folders, two groups), as a CSV's codes do
        whole = all(v is None or (_INTEGER.fullmatch(v) and str(int(v)) == v
                                  and -2**63 <= int(v) < 2**63) for v in values)
        columns[name] = pa.array([None if v is None else int(v) for v in values], pa.int64()
                                 ) if whole else pa.array(values, pa.string())
    return pa.table(columns)


def add_partition_columns(table: pa.Table, partitions: pa.Table, row: int, file: Path,
                          columns: list[str] | None = None) -> pa.Table:
    """``table`` (the rows of file number ``row``) with its partition columns
    (those of ``columns``, when given) as constant columns."""
    for name in partitions.column_names:
        if columns is not None and name not in columns:
            continue
        if name in table.column_names:
            raise ValueError(f"column {name!r} is both in {str(file)!r} and in the name "
                             "of its folder: rename one")
        value = partitions.column(name)[row]
        table = table.append_column(name, pa.array([value.as_py()] * table.num_rows,
                                                   partitions.schema.field(name).type))
    return table


def partitioning(partitions: pa.Table | None) -> object | None:
    """The ``pyarrow.dataset`` partitioning that reads the same columns."""
    if partitions is None:
        return None
    import pyarrow.dataset as ds

    return ds.partitioning(partitions.schema, flavor="hive")
