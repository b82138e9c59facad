"""What ``manymodels train`` says of its ``--by`` columns before any work,
without refusing them: a column with no value at all (every row in one
group, keyed by a missing value) and keys that name one row each (every
model fitted on a single row), both most often the wrong column."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def by_column_warnings(table: Any, by: Sequence[str]) -> list[str]:
    """One line per fault of the ``by`` columns of ``table`` (an Arrow
    table): a column that is all missing, or keys unique per row."""
    lines = [f"--by column {name!r} is missing in every row: all {table.num_rows} rows "
             "fall in one group (is it the column you meant?)"
             for name in by if table.num_rows and table[name].null_count == table.num_rows]
    if table.num_rows > 1 and not lines and _unique_per_row(table.select(list(by))):
        named = (f"--by column {by[0]!r} has" if len(by) == 1 else
                 f"--by columns {', '.join(map(repr, by))} have")
        lines.append(f"{named} a different value in every row: {table.num_rows} groups of "
                     "one row each, every model trained on one row (is it the column you "
                     "meant?)")
    return lines


#: Rows whose keys are grouped first: a table whose keys repeat there is not
#: unique per row, known without grouping all of it (ten million rows of
#: unique keys took 9 s to group).
_FIRST_ROWS = 100_000


def _unique_per_row(keys: Any) -> bool:
    """Whether every row of ``keys`` (the ``by`` columns) has keys of its own."""
    names = keys.column_names
    first = keys.slice(0, _FIRST_ROWS)
    if first.group_by(names).aggregate([]).num_rows < first.num_rows:
        return False
    return first.num_rows == keys.num_rows or \
        keys.group_by(names).aggregate([]).num_rows == keys.num_rows
