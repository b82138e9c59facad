"""Which files a directory table is read from: the table files under it
(through links to folders), in the order they are read, and the refusal of
a file named as a table in a format not read (a ``.txt``, a ``.json``) or of
a link that would read a folder twice or names nothing."""

from __future__ import annotations

import os
from pathlib import Path

from .objectstores import hidden

PARQUET_SUFFIXES = {".parquet", ".pq", ".parq"}
CSV_SUFFIXES = {".csv", ".tsv"}  # (.tsv: tab-separated)
#: Suffixes of tables in formats not read (a ``.txt`` may hold prose or any
#: separator): a file so named is refused, not read as CSV nor left out.
_UNREAD_TABLE_SUFFIXES = frozenset({
    ".txt", ".dat", ".json", ".jsonl", ".ndjson", ".xlsx", ".xls", ".ods", ".feather",
    ".arrow", ".ipc", ".orc", ".avro", ".gz", ".bz2", ".xz", ".zst", ".zip"})
#: Every suffix that names a table, read or not (``rows.csv.gz`` among them).
_TABLE_SUFFIXES = PARQUET_SUFFIXES | CSV_SUFFIXES | _UNREAD_TABLE_SUFFIXES
#: The formats read, as said when a file is refused.
READ_FORMATS = ".csv, .tsv (tab-separated) or Parquet (.parquet, .pq, .parq)"


def table_files(path: Path) -> list[Path]:
    """The table files under a directory, in the order they are read, but
    those :func:`~.objectstores.hidden` there. A file named as a table in
    a format not read (``notes.txt``, ``more.tsv.gz``, ``rows.json``) is
    refused, naming it: read as CSV it was read wrongly, left out its rows
    would be missing unsaid. A Parquet file named otherwise (Hive's and
    Impala's ``000000_0``: :func:`is_parquet`) is read, as pyarrow's
    datasets read it. Other files (``README.md``) are left out.
    Links to folders are followed, as pyarrow's datasets follow them; see
    :func:`_files_under` for the links that are refused."""
    files = []
    for file in _files_under(path):  # (hidden ones not among them)
        if file.suffix.lower() in PARQUET_SUFFIXES | CSV_SUFFIXES or is_parquet(file):
            files.append(file)
        elif _named_as_a_table(file):
            raise ValueError(f"directory {str(path)!r} holds {str(file.relative_to(path))!r}, "
                             f"a file it does not read: a directory is read as {READ_FORMATS} "
                             "files; move it out, or start its name with '_' or '.' to have "
                             "it left out")
    return files


def _files_under(path: Path) -> list[Path]:
    """The files under ``path`` (through links to folders too: ``Path.rglob``
    does not follow them before Python 3.13, and their rows were left out),
    sorted, hidden folders not entered. A link whose target is missing,
    named as a table file, is refused, naming it; a link to a folder read
    already (one above it: without end) too, its rows read twice."""
    files: list[Path] = []
    seen = {os.path.realpath(path): path}
    folders = [path]
    while folders:
        folder = folders.pop()
        for entry in sorted(folder.iterdir()):
            if hidden(entry.relative_to(path).parts):
                continue
            if entry.is_dir():
                real = os.path.realpath(entry)
                if real in seen:
                    raise ValueError(
                        f"directory {str(path)!r} reaches the folder {real!r} twice, as "
                        f"{str(seen[real])!r} and through the link {str(entry)!r}: its rows "
                        "would be read twice (or without end); remove the link, or start its "
                        "name with '_' or '.' to have it left out")
                seen[real] = entry
                folders.append(entry)
            elif entry.is_file():
                files.append(entry)
            elif entry.is_symlink() and not entry.exists() and _named_as_a_table(entry):
                raise ValueError(f"directory {str(path)!r} holds {str(entry.relative_to(path))!r}"
                                 f", a link to {os.readlink(entry)!r}, which does not exist")
    return sorted(files)


def is_parquet(path: Path) -> bool:
    """Whether ``path`` is a Parquet file: named so (``.parquet``, ``.pq``,
    ``.parq``), or named as no table (``000000_0``, as Hive and Impala
    write them; ``part-0.snappy``) and starting with Parquet's magic
    bytes. pyarrow's datasets read every file of a folder as Parquet, and
    such a file's rows were left out unsaid."""
    if path.suffix.lower() in PARQUET_SUFFIXES:
        return True
    if _named_as_a_table(path):
        return False
    try:
        with open(path, "rb") as file:
            return file.read(4) == b"PAR1"
    except OSError:
        return False


def _named_as_a_table(path: Path) -> bool:
    return any(suffix.lower() in _TABLE_SUFFIXES for suffix in path.suffixes)
