"""A predict request's body as columns, and the answer as a body: JSON
(``{"rows": [{...}, ...]}``) or Arrow IPC (``application/vnd.apache.arrow.stream``)
for large batches. What a request got wrong is a :class:`RequestError`
(400 or 422), said before any model runs."""

from __future__ import annotations

import itertools
import json
import math
import sys
from array import array
from collections.abc import Collection
from typing import Any

import numpy as np

from .catalog import plain
from .ipcsize import batch_sizes
from .predictor import Answer, RequestError

ARROW = "application/vnd.apache.arrow.stream"
#: The default limit of a request's body (``--max-body``).
MAX_BODY = 64 << 20

_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})


#: A JSON body may hold at most one object per this many bytes of the
#: limit (--max-body): an object costs about 50 bytes parsed, however
#: few it is on the wire (``{}`` is 2), and 64 MiB of empty objects made
#: a server's memory grow by 1.4 GB. The default limit allows 2,097,152.
BYTES_PER_OBJECT = 32


def json_columns(body: bytes, keys: Collection[str] = (),
                 limit: int | None = None) -> tuple[dict[str, Any], int]:
    """The rows of a JSON body as columns (name -> NumPy array, in the order
    the columns first appear) and their number. ``keys``: the group columns,
    whose values are kept as they came (:func:`_key_array`). ``limit``: the
    body's (--max-body); a body of more than ``limit //``
    :data:`BYTES_PER_OBJECT` objects is refused (413) as it is parsed.

    The rows are read into columns as they are parsed (:class:`_Objects`),
    never a dict per row: 64 MiB of small rows made 30 times that in dicts."""
    most = None if limit is None else max(limit // BYTES_PER_OBJECT, 1)
    objects = _Objects(most, limit)
    try:
        try:
            payload = json.loads(body, object_pairs_hook=objects)
        except ValueError as exc:
            if "integer string conversion" not in str(exc):
                raise
            # a whole number past Python's digits limit: read again, each
            # number kept as its text, to name its column and row
            objects = _Objects(most, limit)
            payload = json.loads(body, object_pairs_hook=objects, parse_int=_whole_number)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the body is not JSON: {exc}") from exc
    except RecursionError as exc:
        raise RequestError(400, "the body is JSON nested too deeply") from exc
    if not isinstance(payload, _Row):
        raise RequestError(400, 'the body must be a JSON object {"rows": [{...}, ...]}')
    top = objects.take_last()
    if "rows" not in top:
        raise RequestError(400, 'the body must be a JSON object {"rows": [{...}, ...]}')
    rows = top["rows"]
    if not isinstance(rows, list) or not rows:
        raise RequestError(400, '"rows" must be a non-empty list of objects')
    for position, row in enumerate(rows):
        if type(row) is not _Row:
            raise RequestError(400, f"row {position} is a {_json_type(row)}, not an object "
                                    "of column: value")
    return objects.columns_of(rows, keys), len(rows)


class _LongNumber(str):
    """A whole number of the body past Python's limit of digits for
    converting text to an int (``sys.get_int_max_str_digits``), as its text."""


def _whole_number(text: str) -> int | _LongNumber:
    try:
        return int(text)
    except ValueError:
        return _LongNumber(text)


def _refused(name: str, row: int, value: Any) -> RequestError:
    """The 400 for ``value`` of column ``name`` of row ``row``, not a scalar."""
    if type(value) is _LongNumber:
        return RequestError(400, f"column {name!r} of row {row} holds a whole number of "
                                 f"{len(value.lstrip('-'))} digits, past the "
                                 f"{sys.get_int_max_str_digits()} Python reads")
    return RequestError(400, f"column {name!r} of row {row} holds a {_json_type(value)}: "
                             "a value must be a number, text, true/false or null")


class _Row(int):
    """A JSON object as :class:`_Objects` returns it: its number, in the
    order the parser closed them (its values are in the columns)."""


def _json_type(value: Any) -> str:
    kind = type(value)
    return "dict" if kind is _Row else "int" if kind is _LongNumber else kind.__name__


class _Objects:
    """``json.loads``'s ``object_pairs_hook``: each object's values appended
    to columns by name, with the object's number, and the object given back
    as a :class:`_Row` of that number. Which objects are rows (and which
    are a value nested in one, refused, or stray) is told once the whole
    body is parsed (:meth:`columns_of`). ``most``: the objects allowed."""

    def __init__(self, most: int | None, cells: int | None = None) -> None:
        self.count = 0
        self.most, self.cells = most, cells
        #: name -> (each value's object number, the values, each one's place in its object)
        self.found: dict[str, tuple[array, list, array]] = {}
        self.last: list[tuple[str, Any]] = []

    def __call__(self, pairs: list[tuple[str, Any]]) -> _Row:
        number = self.count
        if self.most is not None and number >= self.most:
            raise RequestError(413, f"the JSON body holds more than {self.most} objects (rows), "
                                    f"over the limit of one per {BYTES_PER_OBJECT} bytes of "
                                    "--max-body: send a large batch as Arrow IPC")
        self.count = number + 1
        self.last = pairs
        found = self.found
        for place, (name, value) in enumerate(pairs):
            column = found.get(name)
            if column is None:
                column = found[name] = (array("q"), [], array("l"))
            numbers, values, places = column
            if numbers and numbers[-1] == number:  # a name given twice: its last value
                values[-1] = value
            else:
                numbers.append(number)
                values.append(value)
                places.append(place)
        return _Row(number)

    def take_last(self) -> dict[str, Any]:
        """The last object closed (the body's own), its values taken out of
        the columns."""
        for name in dict(self.last):
            numbers, values, places = self.found[name]
            numbers.pop()
            values.pop()
            places.pop()
            if not numbers:
                del self.found[name]
        return dict(self.last)

    def columns_of(self, rows: list[_Row], keys: Collection[str]) -> JsonColumns:
        """The columns of the objects ``rows`` (in that order); a value that
        is not a number, text, true/false or null refused by column and row."""
        n = len(rows)
        if n == 1 and self.count == 2:  # the common request: one row, no other object
            return self._one_row(keys)
        position = np.full(self.count, -1, dtype=np.int64)
        position[np.fromiter(rows, dtype=np.int64, count=n)] = np.arange(n)
        found: list[tuple[tuple[int, int], str, np.ndarray, list]] = []  # the rows' columns
        for name, (numbers, values, places) in self.found.items():
            where = position[np.frombuffer(numbers, dtype=np.int64)]
            in_rows = where >= 0
            first = 0
            if not in_rows.all():  # values of objects that are not rows
                first = int(np.argmax(in_rows))
                values = list(itertools.compress(values, in_rows.tolist()))
                where = where[in_rows]
            if values:  # where the rows first name it: (row, place in the row)
                found.append(((int(where[0]), places[first]), name, where, values))
        if self.cells is not None and n * len(found) > self.cells:
            # each column is made whole, a cell a row: a small body of rows
            # that each name columns of their own made gigabytes of them
            raise RequestError(413, f"the JSON body's {n} rows of {len(found)} distinct "
                                    f"columns are {n * len(found)} cells, over the limit "
                                    f"of {self.cells} (--max-body: a cell a byte at least)")
        # in the order the rows name them (an object beside "rows" read
        # first named its own first): rows close in their order
        found.sort(key=lambda column: column[0])
        columns = JsonColumns()
        for _, name, where, values in found:
            _check_scalars(name, values, where)
            typed = (_key_array if name in keys else _array)(values)
            if len(values) < n:  # refused only where the row's model reads it (predict_rows)
                columns.partial[name] = lacking = np.ones(n, dtype=bool)
                lacking[where] = False
                full = np.zeros(n, dtype=typed.dtype) if typed.dtype != object else (
                    np.full(n, None, dtype=object))
                full[where] = typed
                typed = full
            columns[name] = typed
        return columns

    def _one_row(self, keys: Collection[str]) -> JsonColumns:
        """The columns of the one row: each value checked by its type alone,
        without :func:`_check_scalars`' sets and arrays (the one-row request
        is the server's hot path: they doubled its parsing)."""
        columns = JsonColumns()
        for name, (_, values, _) in self.found.items():
            value = values[0]
            if type(value) not in _SCALAR_TYPES:
                raise _refused(name, 0, value)
            columns[name] = _key_array(values) if name in keys else _one_value(value)
        return columns


def _check_scalars(name: str, values: list, rows: np.ndarray) -> None:
    """Refuse (400) a value of column ``name`` that is a list or an object,
    naming its row (``rows``: each value's)."""
    if set(map(type, values)) <= _SCALAR_TYPES:
        return
    for value, row in zip(values, rows.tolist()):
        if type(value) not in _SCALAR_TYPES:
            raise _refused(name, row, value)


class JsonColumns(dict):
    """A JSON body's columns; ``partial``: a column some rows lack -> which
    (True where lacking; their cells hold a filler, never given to a model:
    a row is refused only where its own model reads the column)."""

    def __init__(self) -> None:
        super().__init__()
        self.partial: dict[str, np.ndarray] = {}


def _array(values: list) -> np.ndarray:
    """A column as pandas types a list of records: whole numbers int64, numbers
    with a null or a fraction float64, true/false bool, anything else object."""
    kinds = set(map(type, values))
    if kinds == {int}:
        try:
            return np.array(values, dtype=np.int64)
        except OverflowError:
            return np.array(values, dtype=object)
    if kinds <= {int, float, type(None)} and kinds != {type(None)}:
        try:
            return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
        except OverflowError:  # a whole number past a float's range: as it came
            pass
    if kinds == {bool}:
        return np.array(values, dtype=bool)
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def _one_value(value: Any) -> np.ndarray:
    """A column of one value, typed as :func:`_array` types it."""
    kind = type(value)
    if kind is float or kind is bool:
        return np.array([value])
    if kind is int and -(1 << 63) <= value < (1 << 63):
        return np.array([value], dtype=np.int64)
    return _array([value])


def _key_array(values: list) -> np.ndarray:
    """A group column: whole numbers int64 as :func:`_array` makes them, any
    other mix as the values came (an object array). A whole number made a
    float beside a null or a fraction would route to another group past 2**53
    (``2**53 + 1`` read as ``2**53``)."""
    if set(map(type, values)) == {int}:
        return _array(values)
    column = np.empty(len(values), dtype=object)
    column[:] = values
    return column


def arrow_columns(body: bytes, keys: Collection[str] = (),
                  limit: int | None = None) -> tuple[dict[str, Any], int]:
    """The record batches of an Arrow IPC stream as columns. ``keys``: the
    group columns, an integer one with nulls kept as exact ints (objects),
    where NumPy would make it float64. ``limit``: the body's (--max-body),
    which its columns decoded may not pass either (:func:`_check_sizes`,
    :func:`_check_dictionaries`)."""
    import pyarrow as pa

    try:
        if limit is not None:
            _check_sizes(body, limit)  # before any batch is decoded
        table = pa.ipc.open_stream(pa.BufferReader(body)).read_all()
    except (pa.ArrowInvalid, OSError, ValueError, StopIteration) as exc:
        raise RequestError(400, f"the body is not an Arrow IPC stream: {exc}") from exc
    if table.num_rows == 0:
        raise RequestError(400, "the Arrow stream holds no rows")
    if limit is not None:
        _check_dictionaries(table, limit)
    columns = {}
    for name, column in zip(table.column_names, table.columns):
        if name in columns:
            raise RequestError(400, f"the Arrow stream has two columns named {name!r}")
        if name in keys and pa.types.is_nested(column.type):
            raise RequestError(400, f"column {name!r} of the Arrow stream, a group column, is of "
                                    f"type {column.type}: a key value must be a number, text, "
                                    "true/false, a date or a datetime, or null")
        try:
            if name in keys and pa.types.is_integer(column.type) and column.null_count:
                columns[name] = np.array(column.to_pylist(), dtype=object)
                continue
            if name in keys and pa.types.is_temporal(column.type):
                columns[name] = _temporal_keys(column)
                continue
            columns[name] = column.to_numpy(zero_copy_only=False)  # text: an object array
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError, OverflowError,
                ValueError) as exc:
            raise RequestError(400, f"column {name!r} of the Arrow stream, of type "
                                    f"{column.type}, cannot be read: {exc}") from exc
    return columns, table.num_rows


def _check_sizes(body: bytes, limit: int) -> None:
    """Refuse (413) a stream that a small body makes large once decoded,
    from its messages' metadata (:mod:`.ipcsize`), before any batch is
    decoded: a compressed batch (zstd, lz4) decompresses whole as it is
    read, and a column of type null, or run-end encoded, holds any number
    of rows in no bytes. Up to ``limit`` bytes decoded, and ``limit`` cells
    (rows times columns: a cell of 8 bytes, or of 1, on the wire), pass."""
    import pyarrow as pa

    messages = pa.ipc.MessageReader.open_stream(pa.BufferReader(body))
    columns = len(pa.ipc.read_schema(messages.read_next_message()))
    rows = decoded = 0
    for size in batch_sizes(messages):
        rows, decoded = rows + size.rows, decoded + size.decoded
        cells = rows * max(columns, 1)
        if cells > limit:
            raise RequestError(413, f"the Arrow stream's {rows} rows of {columns} columns "
                                    f"are {cells} cells, over the limit of {limit} "
                                    "(--max-body: a cell a byte at least)")
        if decoded > limit:
            raise RequestError(413, f"the Arrow stream is {decoded} bytes decoded (or more), "
                                    f"over the limit of {limit} (--max-body)")


def _check_dictionaries(table: Any, limit: int) -> None:
    """Refuse (413) a dictionary-encoded column of text whose rows hold more
    than ``limit`` bytes: a dictionary's long text is copied into each of
    its rows (a few MB of body made a server's memory run out)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    for name, column in zip(table.column_names, table.columns):
        kind = column.type
        if not (pa.types.is_dictionary(kind) and (
                pa.types.is_string(kind.value_type) or pa.types.is_large_string(kind.value_type)
                or pa.types.is_binary(kind.value_type)
                or pa.types.is_large_binary(kind.value_type))):
            continue
        decoded = sum(pc.sum(pc.take(pc.binary_length(chunk.dictionary), chunk.indices)).as_py()
                      or 0 for chunk in column.chunks)
        if decoded > limit:
            raise RequestError(413, f"column {name!r} of the Arrow stream, dictionary-encoded, "
                                    f"is {decoded} bytes decoded, over the limit of {limit} "
                                    "(--max-body)")


def _temporal_keys(column: Any) -> np.ndarray:
    """A group column of datetimes, dates, times or durations as the values
    its keys were stored from (Arrow's, ``as_py``): a time zone kept, and
    nanoseconds a ``pandas.Timestamp``, never NumPy's ``datetime64`` (whose
    ``tolist()`` of nanoseconds gives ints, matching integer keys, and which
    has no time zone). Each distinct value is made once."""
    import pyarrow as pa

    encoded = (column.combine_chunks() if isinstance(column, pa.ChunkedArray)
               else column).dictionary_encode()
    distinct = np.empty(len(encoded.dictionary) + 1, dtype=object)  # the last: null
    distinct[:-1] = encoded.dictionary.to_pylist()
    return distinct[encoded.indices.fill_null(len(encoded.dictionary)).to_numpy()]


def json_answer(answer: Answer) -> bytes:
    """The answer as JSON: an infinite prediction is null there, as NaN is
    (JSON has neither; an Arrow answer keeps them), and a prediction of a
    type JSON has not (a datetime, a date, a Decimal) is its text
    (:func:`~.catalog.plain`: ISO-8601 for the first two), as Store.predict
    gives it, not a failed request."""
    payload = {"predictions": answer.predictions, "source": answer.source,
               "run_id": answer.run_id}
    try:
        return json.dumps(payload, allow_nan=False, default=plain).encode()
    except ValueError:  # rare: checked per value only then
        payload["predictions"] = [finite(v) for v in answer.predictions]
        return json.dumps(payload, allow_nan=False, default=plain).encode()


def finite(value: Any) -> Any:
    """``value`` (JSON-able: lists, dicts, scalars) with each NaN and infinite
    float made null, which JSON has for them: Starlette's JSONResponse
    refuses them, and a NaN metric made ``GET /v1/models/{key}`` a 500."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, list):
        return [finite(v) for v in value]
    if isinstance(value, dict):
        return {name: finite(v) for name, v in value.items()}
    return value


def arrow_answer(answer: Answer) -> bytes:
    """The answer as an Arrow IPC stream: columns ``prediction`` and ``source``,
    the run served in the schema's metadata (``run_id``)."""
    import pyarrow as pa

    try:
        prediction = pa.array(answer.predictions)
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed kinds: as text
        prediction = pa.array([None if v is None else str(v) for v in answer.predictions])
    table = pa.table({"prediction": prediction, "source": pa.array(answer.source)})
    table = table.replace_schema_metadata({"run_id": str(answer.run_id)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()
