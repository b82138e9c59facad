"""The data plane: data written to shared memory once, mapped by every worker.

Pickling a DataFrame per task is where hand-written pools lose their speed-up,
and copying the data into every worker is where they run out of memory. Here
the driver writes each piece of run data once under ``/dev/shm`` (a RAM-backed
file system; the temporary directory where there is none or it is too small)
and every worker memory-maps it read-only:

* the sorted group table, as an Arrow IPC file: a task is ``(offset, length)``
  and a worker slices the mapped table without copying;
* ``shared=`` objects (and a pandas table that ``map_partitions`` slices),
  pickled with protocol 5 and their large buffers (numpy arrays, DataFrame
  blocks) stored out of band, so that a worker's arrays are read-only views of
  the mapping, not copies;
* on the way back, the large buffers of what ``fit`` returned (a transformed
  partition, a forest's arrays): a worker writes them to a file once and sends
  only the small pickle through its pipe; the driver maps the file
  copy-on-write and unpickles the outcomes around the mapping
  (:func:`dumps_spilling`, :func:`loads_spilled`), instead of pushing every
  byte through a pipe and copying it four times.

Files are named ``manymodels-<driver pid>-<run>-*``; a run removes its files
when it ends, and the next run sweeps files left by drivers that died.
"""

from __future__ import annotations

import mmap
import os
import pickle
import re
import shutil
import struct
import tempfile
import uuid
from pathlib import Path
from typing import Any

import cloudpickle
import pyarrow as pa

from .messages import Status
from .metricpacks import MetricsPack
from .partpacks import ModelPack

_PREFIX = "manymodels-"
_ALIGN = 64
_HEADER = struct.Struct("QQ")  # pickle length, offset of the buffer index
_STALE = re.compile(r"^manymodels-(\d+)-")
#: Buffers at least this large travel back from a worker in a file, not the pipe.
SPILL_MIN_BYTES = 1 << 16
#: Spill files smaller than this are read into memory rather than mapped, so
#: that a long run of small models does not pile up thousands of mappings.
_MAP_MIN_BYTES = 4 << 20


def _open_private(path: str | Path) -> Any:
    """Create ``path`` for writing, readable by its owner only: run data (the
    user's table, the shared objects, the pickled ``fit``) is nobody else's,
    whatever the umask."""
    fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a file left by an earlier run keeps its mode otherwise
    return os.fdopen(fd, "wb")


def _shm_root(needed: int) -> Path:
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        try:
            if shutil.disk_usage(shm).free > needed * 1.2 + (64 << 20):
                return shm
        except OSError:
            pass
    return Path(tempfile.gettempdir())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_stale_files() -> int:
    """Remove run files left behind by drivers that are no longer alive."""
    removed = 0
    for root in _roots():
        try:
            entries = list(root.iterdir())
        except OSError:
            continue
        for entry in entries:
            match = _STALE.match(entry.name)
            if match and not _pid_alive(int(match.group(1))):
                try:
                    entry.unlink()
                    removed += 1
                except OSError:
                    pass
    return removed


class RunFiles:
    """The shared-memory files of one run; :meth:`cleanup` removes them all."""

    def __init__(self) -> None:
        self.tag = f"{_PREFIX}{os.getpid()}-{uuid.uuid4().hex[:10]}"
        self.paths: list[Path] = []

    def _new_path(self, name: str, size: int) -> Path:
        path = _shm_root(size) / f"{self.tag}-{name}"
        self.paths.append(path)
        return path

    def write_table(self, table: pa.Table) -> str:
        """Write ``table`` as an Arrow IPC file; workers map it with :func:`open_table`."""
        path = self._new_path("table.arrow", table.nbytes)
        _open_private(path).close()  # owner-only before a byte is written
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return str(path)

    def write_objects(self, obj: Any, name: str = "shared") -> str:
        """Pickle ``obj`` with its large buffers out of band; see :func:`open_objects`."""
        buffers: list[pickle.PickleBuffer] = []
        body = cloudpickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
        raws = [b.raw() for b in buffers]
        path = self._new_path(f"{name}.bin", len(body) + sum(r.nbytes for r in raws))
        with _open_private(path) as out:
            out.write(b"\0" * _HEADER.size)
            out.write(body)
            index = _write_buffers(out, raws)
            index_offset = out.tell()
            out.write(pickle.dumps(index))
            out.seek(0)
            out.write(_HEADER.pack(len(body), index_offset))
        return str(path)

    @property
    def spill_prefix(self) -> str:
        """Where workers put their spill files (:func:`dumps_spilling`):
        named after this run, so that :meth:`cleanup` and the stale sweep find
        the files of a worker that died before the driver read them."""
        return self.tag

    def write_bytes(self, name: str, data: bytes) -> str:
        path = self._new_path(name, len(data))
        with _open_private(path) as out:
            out.write(data)
        return str(path)

    def new_file(self, name: str, size: int) -> str:
        path = self._new_path(name, size)
        with _open_private(path) as out:
            out.truncate(size)
        return str(path)

    def cleanup(self) -> None:
        leftovers = [path for root in _roots() for path in root.glob(f"{self.tag}-*")]
        for path in [*self.paths, *leftovers]:
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        self.paths.clear()


def _roots() -> set[Path]:
    return {Path("/dev/shm"), Path(tempfile.gettempdir())}


def _write_buffers(out: Any, raws: list[memoryview]) -> list[tuple[int, int]]:
    """Write ``raws`` to ``out``, each 64-byte aligned; return (offset, length) of each."""
    index = []
    for raw in raws:
        out.write(b"\0" * (-out.tell() % _ALIGN))
        index.append((out.tell(), raw.nbytes))
        out.write(raw)
    return index


Spill = tuple[str, list[tuple[int, int]]]


def dumps_spilling(obj: Any, dumps: Any, spill_prefix: str | None,
                   counter: list[int]) -> tuple[bytes, Spill | None]:
    """Pickle ``obj`` with ``dumps`` (``pickle.dumps`` or ``cloudpickle.dumps``);
    buffers of :data:`SPILL_MIN_BYTES` or more go to a new file named after
    ``spill_prefix`` rather than into the pickle. Returns the pickle and
    ``(path, [(offset, length), ...])`` of the file, or ``None`` when nothing
    was large enough (most models: a few coefficients)."""
    if spill_prefix is None:
        return dumps(obj, protocol=5), None
    large: list[pickle.PickleBuffer] = []

    def route(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < SPILL_MIN_BYTES:
            return True  # a true value keeps the buffer in band
        large.append(buffer)
        return False

    body = dumps(obj, protocol=5, buffer_callback=route)
    if not large:
        return body, None
    raws = [buffer.raw() for buffer in large]
    counter[0] += 1
    name = f"{spill_prefix}-out-{os.getpid()}-{counter[0]}"
    path = _shm_root(sum(raw.nbytes for raw in raws)) / name
    try:
        with _open_private(path) as out:
            index = _write_buffers(out, raws)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return body, (str(path), index)


def loads_spilled(body: bytes, spill: Spill | None, loads: Any = pickle.loads) -> Any:
    """Unpickle what :func:`dumps_spilling` made with ``loads`` (``pickle.loads``,
    or a part's outcomes' :func:`~.outcomeloads.load_outcomes`) and remove its
    file. The arrays become views of a private copy-on-write mapping of the
    file: no copy, and writable like any unpickled array."""
    if spill is None:
        return loads(body)
    path, index = spill
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            try:
                if size < _MAP_MIN_BYTES:
                    raise OSError("small: a copy is cheaper than a mapping")
                mapping: Any = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
            except OSError:  # small, or out of mappings (vm.max_map_count): read it
                mapping = bytearray(size)
                handle.readinto(mapping)
    finally:
        os.unlink(path)
    view = memoryview(mapping)
    return loads(body, buffers=[view[offset:offset + length] for offset, length in index])


def open_table(path: str) -> pa.Table:
    """Map an Arrow IPC file written by :meth:`RunFiles.write_table`, zero-copy."""
    return pa.ipc.open_file(pa.memory_map(path, "r")).read_all()


def open_objects(path: str) -> Any:
    """Load objects written by :meth:`RunFiles.write_objects`; their arrays are
    read-only views of the mapped file."""
    with open(path, "rb") as handle:
        mapping = mmap.mmap(handle.fileno(), 0, prot=mmap.PROT_READ)
    view = memoryview(mapping)
    body_length, index_offset = _HEADER.unpack_from(mapping, 0)
    index = pickle.loads(view[index_offset:])
    buffers = [view[offset:offset + length] for offset, length in index]
    return pickle.loads(view[_HEADER.size:_HEADER.size + body_length], buffers=buffers)


#: (dtype, shape) -> the protocol-5 pickle of such an array cut around its data
#: bytes, or None where no such cut exists (see :func:`small_array_parts`).
_ARRAY_PICKLES: dict[tuple, tuple[bytes, bytes] | None] = {}
#: Kinds kept at most; past that, arrays of new kinds go through the pickler.
_MAX_ARRAY_KINDS = 1024
#: ``(ndarray, dtype, shape, read_only, head, tail)`` of the array last cut
#: (replaced whole, so that threads read one kind's parts together).
_LAST_ARRAY_KIND: tuple = (None,) * 6


def small_array_parts(array: Any) -> tuple[bytes, bytes, bytes] | None:
    """``pickle.dumps(array, protocol=5)`` of a small, C-ordered NumPy array of
    plain values (numbers, strings, dates: no objects, no fields) as its
    three parts, which joined are those bytes, byte for byte, in a fifth of
    the pickler's time; None for any other object. The head and tail are
    what every array of its kind shares (the same objects for every such
    array while its kind is the last one cut), its own data lie between
    them: a worker's pack of such models keeps the two once
    (:class:`manymodels.engine.partpacks.ModelPack`).

    A million tiny models (coefficients, say) each pickled by the pickler
    spent a third as long there as in their fits. Arrays of one dtype, shape
    and writeability pickle to the same bytes but for their data, which lie
    in one run: the first array of each kind is pickled once with a probe of
    random bytes to find where its data go, and the cut is checked by
    loading it back. The kind of the array last cut is checked first, by
    identity: a million models of one kind then skip the lookup (0.9 to 0.4
    µs each)."""
    last = _LAST_ARRAY_KIND
    if (type(array) is last[0] and array.dtype is last[1] and array.shape == last[2]
            and array.flags.c_contiguous and memoryview(array).readonly is last[3]):
        return last[4], array.tobytes(), last[5]
    import numpy as np

    if type(array) is not np.ndarray or not array.flags.c_contiguous:
        return None
    dtype = array.dtype
    if (dtype.hasobject or dtype.names is not None or dtype.metadata is not None
            or dtype.isbuiltin == 2 or not 0 < array.nbytes < SPILL_MIN_BYTES):
        return None  # objects, fields, metadata, user-defined dtypes (ml_dtypes): the pickler
    try:  # read-only as the pickler sees it (BYTES8, not BYTEARRAY8): broadcast views are
        read_only = memoryview(array).readonly
    except (TypeError, ValueError):  # no buffer (datetime64): the pickler's other way
        return None
    kind = (dtype.str, dtype.type, array.shape, read_only)
    cut = _ARRAY_PICKLES.get(kind, False)
    if cut is False:
        cut = _cut_for(array, read_only)
        if len(_ARRAY_PICKLES) < _MAX_ARRAY_KINDS:
            _ARRAY_PICKLES[kind] = cut
    if cut is None:
        return None
    _remember_kind((np.ndarray, dtype, array.shape, read_only, *cut))
    return cut[0], array.tobytes(), cut[1]


def _remember_kind(kind: tuple) -> None:
    global _LAST_ARRAY_KIND
    _LAST_ARRAY_KIND = kind


def _cut_for(array: Any, read_only: bool) -> tuple[bytes, bytes] | None:
    import numpy as np

    for _ in range(4):  # a probe whose bytes also appear in the header: another one
        probe = np.frombuffer(os.urandom(array.nbytes), dtype=np.uint8).view(array.dtype)
        probe = probe.reshape(array.shape).copy()
        probe.flags.writeable = not read_only
        data, whole = probe.tobytes(), pickle.dumps(probe, protocol=5)
        at = whole.find(data)
        if at >= 0 and whole.find(data, at + 1) < 0:
            break
    else:
        return None
    cut = (whole[:at], whole[at + len(data):])
    again = pickle.loads(cut[0] + data + cut[1])
    if (type(again) is not np.ndarray or again.dtype != probe.dtype
            or again.shape != probe.shape or again.tobytes() != data):
        return None
    return cut


def pickle_any(obj: Any) -> bytes:
    """Pickle ``obj`` with the standard pickler (fast), or with cloudpickle when
    it holds lambdas or classes defined in ``__main__``."""
    import pickle

    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:
        import cloudpickle

        return cloudpickle.dumps(obj, protocol=5)


def dump_outcomes(outcomes: list, spill_prefix: str | None = None,
                  counter: list[int] | None = None) -> tuple[bytes, Spill | None]:
    """Pickle outcomes, their large buffers spilled to a file when
    ``spill_prefix`` is given (see :func:`dataplane.dumps_spilling`); a model
    that cannot be pickled fails its own task only."""
    counter = counter if counter is not None else [0]
    try:
        return dumps_spilling(outcomes, pickle.dumps, spill_prefix, counter)
    except OSError:  # no room for the spill file: everything through the pipe
        if spill_prefix is not None:
            return dump_outcomes(outcomes, None, counter)
    except Exception:
        pass
    import cloudpickle

    safe = []
    for outcome in outcomes:
        index, status, model, metrics, *rest = outcome
        try:  # (a part's packs are bytes and arrays, named by all its outcomes: not probed)
            cloudpickle.dumps((index, status, None if type(model) is ModelPack else model,
                               None if type(metrics) is MetricsPack else metrics, *rest),
                              protocol=5)
            safe.append(outcome)
        except Exception as exc:
            index, _, _, _, duration, started_at, _, _ = outcome
            safe.append((index, Status.FAILED.value, None, {}, duration, started_at,
                         "the value returned by fit cannot be pickled to send it back "
                         f"to the driver: {exc!r}", False))
    return dumps_spilling(safe, cloudpickle.dumps, spill_prefix, counter)
