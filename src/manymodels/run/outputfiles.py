"""The groups' outputs of ``mm.map_groups(fn, engine_df, ...)`` written by the
workers, so that they never pass through the driver
(:mod:`manymodels.run.engineoutputs` says how the engine reads them back).

On the worker that ran a group, :class:`WriteOutputs` turns ``fn``'s output
into an Arrow table with the group's key columns in front and holds it until
the part of the batch it belongs to leaves the worker
(:meth:`WriteOutputs.seal_part`, called by the executor just before it sends
a part): the part's outputs are then appended, per schema, to the Arrow
IPC stream file this worker keeps for that schema under the run's output
directory (opened, appended to and closed: on a shared file system, what
another machine then sees). A worker's file takes its
parts until it holds :data:`PARTS_PER_FILE` of them, so 200,000 small
groups make a few hundred files at most, not 200,000, even where each
group is a part of its own (Ray's batches under a ``timeout=`` send each
group's outcome as it ends). An output is on disk before the driver can learn of it. What
travels back to the driver as the task's "model" is a
:class:`WrittenOutput`: the file's name, where the group's rows start in it,
their count and a digest of the schema. A worker killed mid-write leaves a
torn part at its file's end, after the rows of every outcome it sent; a
task that crashed, ran past its timeout or was retried may leave rows no
outcome names: the driver reads only the rows of the outcomes it received,
and the directory goes as a whole.

Under an object store's directory (``staging="s3://..."``), where an
object cannot be appended to, each part is an object of its own per schema,
its stream made in memory and uploaded whole before the part is sent (an
object store shows an object once its upload completes: a worker killed
mid-upload leaves nothing).

The engine's workers read the files back with
:func:`manymodels.run.outputreads.read_files`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from ..inputs.objectstores import is_remote, path_in, upload
from .outputtables import output_table


@dataclass(frozen=True, slots=True)
class WrittenOutput:
    """A group's output as a worker wrote it: the file's ``name`` (None where
    ``fn`` returned None), its ``rows`` there from row ``offset``, and a
    digest of its schema."""

    name: str | None
    rows: int
    schema_digest: str | None
    offset: int = 0

    @property
    def ref(self) -> str:
        """The rows as :func:`read_files` takes them: ``name:offset:rows``."""
        return f"{self.name}:{self.offset}:{self.rows}"


#: Schemas seen and their digests: most groups' outputs share one, and
#: hashing a schema costs less than serializing it again.
_DIGESTS: dict[pa.Schema, tuple[pa.Schema, str]] = {}


def schema_digest(schema: pa.Schema) -> str:
    seen = _DIGESTS.get(schema)  # (== leaves metadata out: checked below)
    if seen is not None and seen[0].equals(schema, check_metadata=True):
        return seen[1]
    digest = hashlib.blake2b(schema.serialize().to_pybytes(), digest_size=12).hexdigest()
    if seen is None and len(_DIGESTS) < 1024:
        _DIGESTS[schema] = (schema, digest)
    return digest


class WriteOutputs:
    """``fn``, whose output is written to a file under ``directory`` on the
    worker that ran it (see the module docstring). ``key_columns``: the
    group's key columns then the grid's settings (``param_columns``), whose
    values a table lacking them gets in front."""

    #: Bytes of outputs a worker holds at most: past them, it writes them
    #: before its part ends (rows written early are on disk all the same).
    HOLD_BYTES = 64 << 20

    def __init__(self, fn: Callable[..., Any], directory: str, key_columns: list[str],
                 param_columns: list[str], passes_key: bool) -> None:
        self.fn, self.directory, self.passes_key = fn, directory, passes_key
        self.remote = is_remote(directory)
        self.key_columns, self.param_columns = key_columns, param_columns
        self._fresh_state()

    def _fresh_state(self) -> None:
        # per schema digest: the file it appends to, and the tables held for it
        self._files: dict[str, _OutputFile] = {}
        self._pending: dict[str, list[pa.Table]] = {}
        self._held = 0
        # a write inside a task failed: outputs of this part were lost with it
        self._lost = False

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        for name in ("_files", "_pending", "_held", "_lost"):
            state.pop(name)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._fresh_state()

    def worker_copy(self) -> WriteOutputs:
        """This writer for one worker (each executor takes its own): its
        files, held outputs and failures are that worker's alone, so that on
        the threads backend one thread's failed write fails no other's part."""
        copy = object.__new__(WriteOutputs)
        copy.__setstate__(self.__getstate__())
        return copy

    def __call__(self, rows: Any, key: Any = None, **kwargs: Any) -> Any:
        value = self.fn(rows, key=key, **kwargs) if self.passes_key else self.fn(rows, **kwargs)
        metrics = None
        if isinstance(value, dict):  # read by train as metrics, with no model, and
            return value  # refused or left out (``{}``) as the pandas path does
        if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], dict):
            value, metrics = value  # a fallback's output, marked with fn's error
        width = len(self.key_columns) - len(self.param_columns)
        parts = tuple(key) if width > 1 else (key,)
        parts += tuple(kwargs[name] for name in self.param_columns)
        received = getattr(rows, "index", None) if hasattr(rows, "iloc") else None
        written = self._write(output_table(value, parts, self.key_columns, received))
        return written if metrics is None else (written, metrics)

    def _write(self, table: pa.Table | None) -> WrittenOutput:
        """Hold ``table`` for the file of its schema, at the rows it will take there."""
        if table is None:
            return WrittenOutput(None, 0, None)
        digest = schema_digest(table.schema)
        file = self._files.get(digest)
        if file is None:  # a name no other worker, task or attempt draws
            file = self._files[digest] = _OutputFile(self.directory,
                                                     f"out-{os.urandom(8).hex()}.arrow")
        written = WrittenOutput(file.name, table.num_rows, digest, file.assigned)
        file.assigned += table.num_rows
        self._pending.setdefault(digest, []).append(table)
        self._held += table.nbytes
        if self._held > self.HOLD_BYTES:  # a failure fails this task, and the part as it ends
            self._seal(part_ends=False)
        return written

    def seal_part(self) -> None:
        """Write the outputs held, appended to the files of their schemas.

        Raises where this write fails, or where one failed since the last
        part (a write past :attr:`HOLD_BYTES` inside a task): the outputs
        held then, this part's among them, are lost, and the executor fails
        the part's tasks."""
        self._seal(part_ends=True)

    def _seal(self, part_ends: bool) -> None:
        if self._lost:  # the part fails as a whole: what it holds is dropped
            for digest in self._pending:  # (rows handed out there are never written)
                self._files.pop(digest, None)
            self._pending, self._held = {}, 0
            self._lost = not part_ends  # this raise fails the part
            raise OSError("outputs of this part could not be written")
        pending, self._pending, self._held = self._pending, {}, 0
        try:
            for digest, tables in pending.items():
                file = self._files[digest]
                if self.remote:  # an object a part: the next part starts another
                    _upload(file, tables)
                    del self._files[digest]
                    continue
                _append(file, tables)
                if file.parts >= PARTS_PER_FILE:
                    del self._files[digest]
        except BaseException:
            # a file written to may end in a torn part: none is written to
            # again (the rows before it, of outcomes already sent, stay readable)
            for digest in pending:
                self._files.pop(digest, None)
            self._lost = not part_ends
            raise
        if len(self._files) > OPEN_FILES:  # many schemas: the idle files left
            for digest in [d for d in self._files if d not in pending]:
                del self._files[digest]


#: Parts a worker's file takes before the next part of its schema starts a
#: new one: a reader parses every batch before the rows it wants.
PARTS_PER_FILE = 1024
#: Files of a worker's schemas it goes on appending to (one per schema its
#: groups returned); past them, the idle ones are left as they are.
OPEN_FILES = 16


class _OutputFile:
    """A worker's Arrow IPC stream file of one schema: rows handed out
    (``assigned``), parts and bytes appended, and the stream's writer, which
    writes to the file's descriptor while a part is appended: the file is
    opened and closed again for each part (on a shared file system, closing
    is what shows the rows to other machines; no descriptor is held between
    parts)."""

    __slots__ = ("name", "path", "assigned", "parts", "size", "_stream", "_sink")

    def __init__(self, directory: str, name: str) -> None:
        self.name = name
        self.path = path_in(directory, name)
        self.assigned, self.parts, self.size = 0, 0, 0
        self._stream: Any = None
        self._sink = _Sink()


class _Sink:
    """Where an IPC stream writer writes: the descriptor of the part being
    appended. The stream's small pieces (a batch's header, each buffer's
    padding) are gathered into one write; a column's buffer past
    :data:`DIRECT_BYTES` goes from the table's own memory, so that a part
    is never copied whole (a 400 MB part raised a worker's peak by 1.2 GB
    when its bytes were gathered first)."""

    closed = False

    def __init__(self) -> None:
        self.descriptor = -1
        self.written = 0
        self._small = bytearray()

    def write(self, data: Any) -> int:
        size = len(data)
        if size >= DIRECT_BYTES:
            self.drain()
            _write_all(self.descriptor, data)
        else:
            self._small += data
        self.written += size
        return size

    def flush(self) -> None:
        pass

    def drain(self) -> None:
        if self._small:
            _write_all(self.descriptor, self._small)
            self._small.clear()


#: A stream's piece that the sink writes on its own rather than gathers.
DIRECT_BYTES = 256 << 10


def _write_all(descriptor: int, data: Any) -> None:
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(descriptor, view):]


def _part_batches(tables: list[pa.Table]) -> list[pa.RecordBatch]:
    """A part's outputs as record batches (see :func:`_runs`); one empty batch
    for none (a file always begins with its schema)."""
    batches: list[pa.RecordBatch] = []
    for run in _runs(tables):
        table = _combined(run)
        batches += table.to_batches()
    if not batches:
        batches = [pa.RecordBatch.from_pylist([], schema=table.schema)]
    return batches


def _upload(file: _OutputFile, tables: list[pa.Table]) -> None:
    """``tables`` as the one part of an object store's object, uploaded whole."""
    batches = _part_batches(tables)
    buffer = pa.BufferOutputStream()
    with pa.ipc.new_stream(buffer, batches[0].schema) as stream:
        for batch in batches:
            stream.write_batch(batch)
    data = buffer.getvalue()
    upload(file.path, data)
    file.size, file.parts = data.size, 1


def _append(file: _OutputFile, tables: list[pa.Table]) -> None:
    """``tables`` (of the file's schema) appended to ``file`` as its next
    part, their rows in order, before the part is sent (an empty output
    too: a file always begins with its schema): small outputs combined into
    one batch, a large one as it is (:func:`_runs`). A file that is not as
    this worker left it (removed, cut short) fails the part instead of
    taking rows at other places."""
    batches = _part_batches(tables)
    flags = os.O_WRONLY | os.O_APPEND | (os.O_CREAT | os.O_EXCL if file.size == 0 else 0)
    descriptor = os.open(file.path, flags, 0o666)
    sink = file._sink
    try:
        if os.fstat(descriptor).st_size != file.size:
            raise OSError(f"the output file {file.name} was changed by another process: "
                          "its part is not appended")
        sink.descriptor, sink.written = descriptor, 0
        if file._stream is None:
            file._stream = pa.ipc.new_stream(sink, batches[0].schema)
        for batch in batches:
            file._stream.write_batch(batch)
        sink.drain()
    finally:
        sink.descriptor = -1
        os.close(descriptor)
    file.size += sink.written
    file.parts += 1


#: A part's outputs are combined into one record batch up to this size (a
#: reader parses each batch it passes); an output this large is a batch of
#: its own, written from its own memory (combining copies).
COMBINE_BYTES = 8 << 20


def _runs(tables: list[pa.Table]) -> list[list[pa.Table]]:
    """``tables`` in order, cut into runs to combine: small ones together up
    to :data:`COMBINE_BYTES`, each large one alone."""
    runs: list[list[pa.Table]] = []
    run: list[pa.Table] = []
    held = 0
    for table in tables:
        size = table.nbytes
        if size >= COMBINE_BYTES:
            if run:
                runs.append(run)
                run, held = [], 0
            runs.append([table])
            continue
        run.append(table)
        held += size
        if held >= COMBINE_BYTES:
            runs.append(run)
            run, held = [], 0
    if run:
        runs.append(run)
    return runs


def _combined(tables: list[pa.Table]) -> pa.Table:
    """A run of outputs as one table of one chunk a column where it can be:
    categories made per group become one dictionary (a batch holds one a
    column), the rows where they were."""
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    if any(pa.types.is_dictionary(field.type) for field in table.schema):
        table = _wide_dictionaries(table).unify_dictionaries()
    try:
        return table.combine_chunks()
    except (pa.ArrowInvalid, pa.ArrowCapacityError):  # a text column past 2 GiB: as it came
        return table


def _wide_dictionaries(table: pa.Table) -> pa.Table:
    """``table`` with each categorical column's codes 32 bits wide: pandas
    makes them 8 bits for a few categories, and the groups of a part, or
    the parts of a file a reader unifies, may hold more than 127 between them."""
    schema = table.schema
    for position, field in enumerate(schema):
        kind = field.type
        if pa.types.is_dictionary(kind) and kind.index_type.bit_width < 32:
            schema = schema.set(position, field.with_type(
                pa.dictionary(pa.int32(), kind.value_type, kind.ordered)))
    return table if schema is table.schema else table.cast(schema)
