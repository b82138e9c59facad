"""Reading a table from a local path: a Parquet or CSV file, or a folder of
them (which of its files: :mod:`.tablefiles`; their tables made one:
:mod:`.filetables`; ``name=value`` folders as columns: :mod:`.partitions`),
a ``file:`` URI or a ``~`` path made the path it names. What
:func:`.tables.read_table` reads for a path, each file's problem (a name
given twice, text that is not UTF-8, another separator) named with its file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .filetables import (
    dictionaries_that_hold_all,
    first_misfit,
    refuse_unlike_columns,
    text_where_any_is_text,
    unsigned_where_any_is,
)
from .fileuris import local_location
from .objectstores import is_remote, missing_path
from .partitions import add_partition_columns, partition_table
from .sourcechecks import named_twice, refuse_a_name_twice
from .tablefiles import CSV_SUFFIXES, READ_FORMATS, is_parquet, table_files


def read_path(table: str | Path, columns: list[str] | None = None) -> pa.Table:
    """The table at a local path (a file, or a folder of them: :func:`read_table`'s
    for a path); with ``columns``, only those."""
    table = local_path(table)
    if is_remote(table):  # Path() would make s3://b/t "s3:/b/t"
        raise ValueError(f"{table!r} is on an object store, which this call does not "
                         "read: read it first (pyarrow.parquet.read_table, "
                         "pandas.read_parquet), or give it to mm.groups, which does")
    path = Path(table)
    if not path.exists():
        raise missing_path(str(path))
    read = _read_directory(path, columns) if path.is_dir() else _read_file(path, columns)
    refuse_a_name_twice(read.column_names, repr(str(path)))
    return read


def _read_file(path: Path, columns: list[str] | None = None) -> pa.Table:
    """The file's table; with ``columns``, only those (each checked against the
    file's own column names first, so that a missing one is named)."""
    suffix = path.suffix.lower()
    try:
        if is_parquet(path):  # (.parquet, or Hive's 000000_0)
            import pyarrow.parquet as pq

            names = pq.read_schema(path).names  # (a name twice: pyarrow's read fails on
            refuse_a_name_twice(names, repr(str(path)))  # it with a page of its schema)
            if columns is not None:
                columns = present_columns(columns, names, path)
            return pq.read_table(path, columns=columns)
        if suffix in CSV_SUFFIXES:
            import pyarrow.csv as pcsv

            parse = pcsv.ParseOptions(delimiter="\t" if suffix == ".tsv" else ",")
            # a blank text cell, "NA", "null", ... is a missing value, as in a
            # number column and in pandas' read_csv (a key of its own, "", before)
            convert = pcsv.ConvertOptions(strings_can_be_null=True)
            if columns is not None:
                with pcsv.open_csv(path, parse_options=parse) as reader:  # the header only
                    names = reader.schema.names
                convert.include_columns = present_columns(columns, names, path)
            return _codes_kept_as_text(path, parse, _utf8_only(path, pcsv.read_csv(
                path, parse_options=parse, convert_options=convert)))
    except UnicodeDecodeError as exc:  # (a header that is not UTF-8)
        raise ValueError(f"cannot read table file {str(path)!r}: its header is not UTF-8 "
                         f"text ({exc}); {_REENCODE}") from exc
    except (OSError, pa.ArrowException) as exc:
        raise ValueError(f"cannot read table file {str(path)!r}: {exc}") from exc
    raise ValueError(f"cannot read {str(path)!r}: unknown file type {suffix!r} "
                     f"(expected {READ_FORMATS})")


_REENCODE = ("save it as UTF-8 (iconv -f latin1 -t utf-8), or read it with "
             "pandas.read_csv(path, encoding=...) and give the frame")


def _utf8_only(path: Path, table: pa.Table) -> pa.Table:
    """``table`` (a CSV file's), refused where a column is not UTF-8 text:
    CSV's inference reads such a column (a Latin-1 file's accents) as
    bytes, so its keys were ``b'caf\\xe9'`` alone, and beside a UTF-8 file
    the folder failed with "Invalid UTF8 payload", naming no file."""
    for field in table.schema:
        if pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
            raise ValueError(f"column {field.name!r} of {str(path)!r} is not UTF-8 text "
                             f"(a CSV is read as UTF-8): {_REENCODE}")
    return table


def _codes_kept_as_text(path: Path, parse: Any, table: pa.Table) -> pa.Table:
    """``table`` (a CSV file's) with each column of integers whose text says
    otherwise (codes such as 007 beside 7, or +1 beside 1) as the text it
    is: as numbers, 007, 07 and 7 were one group key. CSV's inference reads
    +1 as a float (an integer takes no sign there), so a float column whose
    every value is written as an integer is such a column too. So, too, is
    one of integers past int64's range, which CSV's inference reads as
    floats (where 18446744073709551614 and ...615 were one group key): it
    is ``uint64`` where each value fits one (as pandas' ``read_csv`` reads
    it), else text (longer ids, or negative ones beside them)."""
    import pyarrow.csv as pcsv

    if named_twice(table.column_names):  # (refused by read_table, naming the column;
        return table  # table.column(name) of such a name raised a KeyError here)
    numbers = [field.name for field in table.schema if pa.types.is_integer(field.type)
               or pa.types.is_floating(field.type) and _whole(table.column(field.name))]
    if not numbers:
        return table
    texts = pcsv.read_csv(path, parse_options=parse, convert_options=pcsv.ConvertOptions(
        include_columns=numbers, column_types=dict.fromkeys(numbers, pa.string()),
        strings_can_be_null=True))
    for name in numbers:
        text = texts.column(name)
        if pa.types.is_integer(table.schema.field(name).type):
            same = pc.equal(text, pc.cast(table.column(name), pa.string()))
        elif pc.all(pc.match_substring_regex(text, r"^[+-]?[0-9]+$")).as_py() is False:
            continue  # numbers with a fraction or an exponent: numbers
        else:  # integers, past int64's range (else read as int64): exact, never floats
            exact = text
            if pc.all(pc.match_substring_regex(text, r"^(0|[1-9][0-9]*)$")
                      .fill_null(True)).as_py():
                try:
                    exact = pc.cast(text, pa.uint64())
                except pa.ArrowInvalid:  # past uint64's range too: text
                    pass
            table = table.set_column(table.schema.get_field_index(name), name, exact)
            continue
        if not pc.all(same.fill_null(True)).as_py():
            table = table.set_column(table.schema.get_field_index(name), name, text)
    return table


def _whole(column: pa.ChunkedArray) -> bool:
    """Whether a float column's values are all whole numbers (or missing)."""
    return pc.all(pc.equal(pc.floor(column), column)).as_py() is not False


def present_columns(columns: list[str], names: list[str], where: Any) -> list[str]:
    """``columns`` in the order of ``names``; a missing one is named."""
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"column {missing[0]!r} is not in {str(where)!r}; "
                         f"its columns are {names}" + separator_hint(names))
    wanted = set(columns)
    return [name for name in names if name in wanted]


def _read_directory(path: Path, columns: list[str] | None = None) -> pa.Table:
    files = table_files(path)
    if not files:
        raise ValueError(f"directory {str(path)!r} holds no {READ_FORMATS} files")
    partitions = partition_table(path, files)  # name=value folders: columns of their own
    if partitions is None:
        tables = [_read_file(p, columns) for p in files]
    else:
        in_files = None if columns is None else [
            c for c in columns if c not in partitions.column_names]
        tables = [add_partition_columns(_read_file(p, in_files), partitions, row, p, columns)
                  for row, p in enumerate(files)]
    refuse_unlike_columns([str(f) for f in files], [t.column_names for t in tables],
                          f"the files under {str(path)!r}")
    tables = dictionaries_that_hold_all(text_where_any_is_text(unsigned_where_any_is(tables)))
    try:  # widened where one file's type holds another's (int32 and int64, int and float)
        return pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as exc:
        raise ValueError(f"the files under {str(path)!r} do not share one schema: "
                         f"{first_misfit(files, [t.schema for t in tables])}{exc}") from exc


def separator_hint(names: list[Any]) -> str:
    """Where a table's one column is named like several joined by ``;``,
    ``|`` or a tab (a CSV written with another separator: a European
    spreadsheet's ``;``), a note saying so, to follow the message that a
    column is not in it; else ``""``."""
    if len(names) != 1 or not isinstance(names[0], str):
        return ""
    for separator in (";", "|", "\t"):
        if separator in names[0]:
            return (f" (one column: the file looks separated by {separator!r}, and a CSV "
                    "is read comma-separated, a .tsv tab-separated: save it with commas, "
                    f"or read it with pandas.read_csv(path, sep={separator!r}) and give "
                    "the frame)")
    return ""


def local_path(table: Any) -> Any:
    """A table's path as the file system names it: a ``file:`` URI as its
    path (:mod:`.fileuris`), ``~`` expanded. Done once, where a source is
    given its path, so that every way of reading it (``read_on_workers=True``
    too, whose files were said not to exist) reads the same files. Anything
    else (a frame, an object store's URI) is returned as it is."""
    table = local_location(table, "table path")
    if isinstance(table, Path) or isinstance(table, str) and not is_remote(table):
        return _home_expanded(table) if str(table).startswith("~") else table
    return table


def _home_expanded(path: str | Path) -> str | Path:
    """``path`` with its ``~`` or ``~user`` expanded; as it is where there is
    no such user (Python's "Could not determine home directory" named no
    path), so that the path is said not to exist."""
    try:
        return Path(path).expanduser()
    except RuntimeError:
        return path
