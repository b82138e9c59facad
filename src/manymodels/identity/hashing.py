"""Task identity: a hash of a task's code, parameters and data.

A re-run with a store reuses every finished model whose identity is
unchanged, so the identity must change whenever the model could:

* **code**: ``fit``'s source (or bytecode, constants and closure values when
  the source is not available), that of every decorator wrapped around it
  and of what they wrap, and, followed transitively, the source files of
  the user's own modules that it uses: a helper module edited means every
  model is retrained. Installed packages (site-packages, the standard library)
  are not hashed file by file; their versions are recorded instead, so an
  upgrade of scikit-learn retrains too (:mod:`.codehash`).
* **params**: the grid values of the task.
* **data**: the content of the group's rows (and the table's schema); an
  item's value, or the content of the file (or folder) when the item is a
  path; the content of the ``shared`` objects (and the code of the user's own
  classes their pickles name).

Each part is kept apart so that a store can say which one changed.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import types
from pathlib import Path, PurePath
from typing import Any

import cloudpickle
import numpy as np

from . import codehash
from .codehash import digest
from .rowhash import combine_lanes, lanes_bytes, lanes_hex_array, lanes_of


def value_hash(value: Any) -> str:
    """A content hash of a value: arrays and frames by their data, paths to files
    by the file's content, anything else by its pickle."""
    if isinstance(value, np.ndarray):
        array = np.ascontiguousarray(value)
        if array.dtype.hasobject:
            return digest(cloudpickle.dumps(array.tolist()))
        raw = array.view(np.uint8).reshape(-1).data  # its bytes, not a copy of them
        return digest(str(array.dtype), str(array.shape), raw)
    module = type(value).__module__
    if module.startswith("pandas"):
        import pandas as pd

        if isinstance(value, (pd.DataFrame, pd.Series)):
            rows = pd.util.hash_pandas_object(value, index=True).to_numpy()
            columns = list(value.columns) if isinstance(value, pd.DataFrame) else [value.name]
            dtypes = [str(d) for d in getattr(value, "dtypes", [value.dtype])]
            return digest(repr(columns), repr(dtypes), rows.tobytes())
    if module.startswith("pyarrow") and hasattr(value, "to_pandas"):
        return value_hash(value.to_pandas())
    if isinstance(value, PurePath):
        return file_hash(value)
    if isinstance(value, (list, tuple)):
        return digest(type(value).__name__, *(value_hash(v) for v in value))
    if isinstance(value, dict):
        return digest("dict", *(f"{k!r}={value_hash(v)}" for k, v in value.items()))
    if isinstance(value, (set, frozenset)):  # a set pickles in hash-seed order
        return digest(type(value).__name__, *sorted(value_hash(v) for v in value))
    if value is None or type(value) in (bool, int, float, str, bytes):
        return digest(pickle.dumps(value, protocol=5))
    try:
        data, named = _pickled_naming(value)
    except Exception:
        return digest(cloudpickle.dumps(value))
    code = codehash.user_code(named, value_hash)
    return digest(data, code) if code else digest(data)


class _NamingPickler(pickle.Pickler):
    """A pickler that notes the classes of the objects it pickles and the
    classes and functions it pickles by name: its pickle is the plain one."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=5)
        self.named: dict[int, Any] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)):
            self.named.setdefault(id(obj), obj)
        else:
            self.named.setdefault(id(type(obj)), type(obj))
        return NotImplemented  # pickled as it would be


#: manymodels' modules by the names they had when the first stores were
#: written, before they moved into subpackages. A task's identity hashes the
#: pickles of its parameters and shared objects (an ``evaluate=`` splitter, a
#: ``select=`` search), and a pickle names each class's module: identities
#: hash the old names, so a store written before the move reuses its models
#: (``tests/test_premove_store.py``). A module that moves again is added here.
PINNED_MODULES = {
    "manymodels.cli.app": "manymodels.cli",
    "manymodels.cli.demo": "manymodels.demo",
    "manymodels.cli.tables": "manymodels._cli_tables",
    "manymodels.cli.tabular": "manymodels.tabular",
    "manymodels.engine.backends": "manymodels.backends",
    "manymodels.engine.backends._batch_messages": "manymodels.backends._batch_messages",
    "manymodels.engine.backends._process_handles": "manymodels.backends._process_handles",
    "manymodels.engine.backends._process_start": "manymodels.backends._process_start",
    "manymodels.engine.backends._process_worker": "manymodels.backends._process_worker",
    "manymodels.engine.backends._protocol": "manymodels.backends._protocol",
    "manymodels.engine.backends._ray_calls": "manymodels.backends._ray_calls",
    "manymodels.engine.backends._ray_cluster": "manymodels.backends._ray_cluster",
    "manymodels.engine.backends._ray_worker": "manymodels.backends._ray_worker",
    "manymodels.engine.backends._remote_slots": "manymodels.backends._remote_slots",
    "manymodels.engine.backends._remote_worker": "manymodels.backends._remote_worker",
    "manymodels.engine.backends._spawn_main": "manymodels.backends._spawn_main",
    "manymodels.engine.backends._undertaker": "manymodels.backends._undertaker",
    "manymodels.engine.backends.base": "manymodels.backends.base",
    "manymodels.engine.backends.dask": "manymodels.backends.dask",
    "manymodels.engine.backends.processes": "manymodels.backends.processes",
    "manymodels.engine.backends.ray": "manymodels.backends.ray",
    "manymodels.engine.backends.serial": "manymodels.backends.serial",
    "manymodels.engine.backends.spark": "manymodels.backends.spark",
    "manymodels.engine.backends.threads": "manymodels.backends.threads",
    "manymodels.engine.batchsizing": "manymodels.batchsizing",
    "manymodels.engine.dataplane": "manymodels.dataplane",
    "manymodels.engine.execution": "manymodels.execution",
    "manymodels.engine.gpus": "manymodels.gpus",
    "manymodels.engine.messages": "manymodels.messages",
    "manymodels.engine.metriccolumns": "manymodels.metriccolumns",
    "manymodels.engine.metricpacks": "manymodels.metricpacks",
    "manymodels.engine.options": "manymodels.options",
    "manymodels.engine.partpacks": "manymodels.partpacks",
    "manymodels.engine.scheduling": "manymodels.scheduling",
    "manymodels.evaluation.fitstats": "manymodels.fitstats",
    "manymodels.evaluation.metrics": "manymodels.metrics",
    "manymodels.evaluation.selection": "manymodels.selection",
    "manymodels.evaluation.splitters": "manymodels.evaluation",
    "manymodels.identity.codehash": "manymodels.codehash",
    "manymodels.identity.hashing": "manymodels.hashing",
    "manymodels.identity.nestedvalues": "manymodels.nestedvalues",
    "manymodels.identity.rowhash": "manymodels.rowhash",
    "manymodels.inputs.datareaders": "manymodels.datareaders",
    "manymodels.inputs.grids": "manymodels.grids",
    "manymodels.inputs.grouplabels": "manymodels.grouplabels",
    "manymodels.inputs.keys": "manymodels.keys",
    "manymodels.inputs.parquetgroups": "manymodels.parquetgroups",
    "manymodels.inputs.partitions": "manymodels.partitions",
    "manymodels.inputs.sources": "manymodels.sources",
    "manymodels.inputs.tables": "manymodels.tables",
    "manymodels.machine": "manymodels._resources",
    "manymodels.machine.capacity": "manymodels._resources",
    "manymodels.machine.collector": "manymodels._resources",
    "manymodels.machine.processtrees": "manymodels._resources",
    "manymodels.models.linear": "manymodels.linmodels",
    "manymodels.models.linear.artifact": "manymodels.linmodels.artifact",
    "manymodels.models.linear.fastpath": "manymodels.linmodels.fastpath",
    "manymodels.models.linear.fitting": "manymodels.linmodels.fitting",
    "manymodels.models.linear.identities": "manymodels.linmodels.identities",
    "manymodels.models.linear.kernels": "manymodels.linmodels.kernels",
    "manymodels.models.linear.prepare": "manymodels.linmodels.prepare",
    "manymodels.models.linear.result": "manymodels.linmodels.result",
    "manymodels.models.linear.stored": "manymodels.linmodels.stored",
    "manymodels.models.linear.torch_kernels": "manymodels.linmodels.torch_kernels",
    "manymodels.observe.callbacks": "manymodels.callbacks",
    "manymodels.observe.dashboard": "manymodels.dashboard",
    "manymodels.observe.dashboard.queries": "manymodels.dashboard.queries",
    "manymodels.observe.dashboard.runtasks": "manymodels.dashboard.runtasks",
    "manymodels.observe.dashboard.server": "manymodels.dashboard.server",
    "manymodels.observe.progress": "manymodels.progress",
    "manymodels.observe.report": "manymodels.report",
    "manymodels.observe.tracking": "manymodels.tracking",
    "manymodels.planning.plan": "manymodels.planning",
    "manymodels.planning.taskdata": "manymodels.taskdata",
    "manymodels.run.groupfailures": "manymodels.transforms",
    "manymodels.run.prediction": "manymodels.prediction",
    "manymodels.run.results": "manymodels.results",
    "manymodels.sklearn._routing": "manymodels.routing",
}


class _PinnedNamePickler(pickle._Pickler):  # the Python pickler: its save_global can be changed
    """Pickles as the C pickler does, but names manymodels' classes and
    functions by their :data:`PINNED_MODULES` names, and writes each set
    whose order changes with the hash seed in one order (see
    :func:`_canonical_set`): a frozenset of texts inside a config object
    pickles in a new order in each process, and its ``fit`` was never reused.
    (The C pickler does not ask ``reducer_override`` about a set.)"""

    def __init__(self, file: Any, protocol: int = 5) -> None:
        super().__init__(file, protocol=protocol)
        #: whether a set was written in another order than it iterates in
        self.reordered = False

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (set, frozenset)) and len(obj) > 1 and not all(
                map(_seed_free, obj)):
            self.reordered = True
            return _canonical_set(obj)
        return NotImplemented

    def save_global(self, obj: Any, name: str | None = None) -> None:
        pinned = PINNED_MODULES.get(getattr(obj, "__module__", None) or "")
        if pinned is None:
            super().save_global(obj, name)
            return
        self.save(pinned)
        self.save(name or getattr(obj, "__qualname__", None) or obj.__name__)
        self.write(pickle.STACK_GLOBAL)
        self.memoize(obj)


def code_identity(fn: Any, setup: Any = None) -> tuple[str, dict[str, Any]]:
    """The hash of ``fn``'s code (and ``setup``'s) and its parts: see
    :func:`.codehash.code_identity`; the values the code reads hash as
    :func:`value_hash` does."""
    return codehash.code_identity(fn, setup, value_hash)


def _pickled_naming(value: Any) -> tuple[bytes, list[Any]]:
    import io

    buffer = io.BytesIO()
    pickler = _NamingPickler(buffer)
    pickler.dump(value)
    named = list(pickler.named.values())
    data = buffer.getvalue()
    pinned = any(getattr(obj, "__module__", None) in PINNED_MODULES for obj in named)
    if pinned or _may_hold_a_set(data, named):
        canonical = io.BytesIO()
        rewritten = _PinnedNamePickler(canonical, protocol=5)
        rewritten.dump(value)
        if pinned or rewritten.reordered:  # (else the C pickler's bytes: the same hash as ever)
            return canonical.getvalue(), named
    return data, named


def _may_hold_a_set(data: bytes, named: list[Any]) -> bool:
    """Whether a pickle may hold a set: it has a set's opcode, or it names a
    class made from set or frozenset. The opcodes' bytes are looked for
    first, then the opcodes read where they are (a model's arrays hold those
    bytes as data: pickling it again in Python to find no set cost a fitted
    forest 47 ms, reading its opcodes 3 ms)."""
    import pickletools

    if any(isinstance(obj, type) and issubclass(obj, (set, frozenset)) for obj in named):
        return True
    if pickle.EMPTY_SET not in data and pickle.FROZENSET not in data:
        return False
    return any(opcode.name in ("EMPTY_SET", "FROZENSET")
               for opcode, _, _ in pickletools.genops(data))


def _seed_free(value: Any) -> bool:
    """Whether ``value``'s hash, so its place in a set, is the same in every
    process: numbers, None, and tuples of them (a text's, bytes', a date's
    change with ``PYTHONHASHSEED``). A set of those keeps the order it
    pickled in before, so that the identities of its tasks stay what they were."""
    if type(value) is tuple:
        return all(map(_seed_free, value))
    return type(value) in (int, float, bool, complex, type(None))


def _canonical_set(value: set | frozenset) -> tuple:
    """What a set is pickled as, for its hash: its class and its elements
    ordered by their own hashes (the state of a subclass too). Never unpickled."""
    elements = sorted(value, key=value_hash)
    state = getattr(value, "__dict__", None) or None
    return type(value), (elements,), state


#: The index file of a manymodels store (``store.database.INDEX_NAME``). A
#: store's folder is hashed by its path, not its files: they change with
#: every run, and reading the index here would drop the driver's own SQLite
#: locks on it (closing any descriptor of a file does, on POSIX), so that
#: another process opening the store could remove its write-ahead log.
STORE_INDEX = "index.sqlite"


def file_hash(path: PurePath | str) -> str:
    """The content hash of a file; of a folder, the names and contents of
    the files under it, a manymodels store's left out (a store's own folder
    is hashed by its path); else of the path itself (nothing there)."""
    path = Path(path)
    if path.is_dir():
        if (path / STORE_INDEX).is_file():
            return digest("store", str(path.resolve()))
        files = _files_under(path)
        stores = {file.parent for file in files if file.name == STORE_INDEX}
        parts = [f"{file.relative_to(path).as_posix()}={file_hash(file)}" for file in files
                 if not stores or not stores.intersection(file.parents)]
        return digest("folder", *parts)
    if not path.is_file():
        return digest("path", str(path))
    if path.name.startswith(STORE_INDEX) and (path.parent / STORE_INDEX).is_file():
        return digest("store", str(path.resolve()))  # a store's own file: see above
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files_under(path: Path) -> list[Path]:
    """The files under ``path``, sorted, through links to folders too (an
    edit under a linked folder changes the folder's hash: ``Path.rglob``
    does not follow them before Python 3.13); a folder reached twice (a link
    to one above it) is walked once."""
    files: list[Path] = []
    walked: set[str] = set()
    for root, folders, names in os.walk(path, followlinks=True):
        real = os.path.realpath(root)
        if real in walked:
            folders[:] = []
            continue
        walked.add(real)
        files.extend(file for file in map(Path(root).joinpath, names) if file.is_file())
    return sorted(files)


def item_hash(item: Any) -> str:
    """An item's identity: the content when it is a path to a file, or to a
    folder (the files under it) given as a ``Path`` or as text with a ``/``
    in it (a bare word such as "src" stays a word, whatever is in the
    current directory)."""
    if isinstance(item, PurePath) or isinstance(item, str) and (
            os.path.isfile(item) or os.sep in item and os.path.isdir(item)):
        return file_hash(item)
    return value_hash(item)


# -- hashes of a million tasks at once ---------------------------------------------
class TaskIdentities:
    """Each task's identity and the parts of it that are its own, as Arrow
    string arrays in task order (a million tuples of three Python strings
    were a quarter of a driver's memory). Code and shared objects are the
    same for every task: the run keeps their hashes, in its code description.

    ``identity`` and ``data`` may be given as their ``(tasks, 2)`` uint64
    lanes: their text is then made when first asked for (an unchanged re-run
    that names the run it reuses compares the identities' bytes, and writes
    neither)."""

    __slots__ = ("_identity", "params", "_data", "prefixes")

    def __init__(self, identity: Any, params: Any, data: Any,
                 prefixes: np.ndarray | None) -> None:
        self._identity = identity
        #: the hash of each task's parameters; null without a grid
        self.params = params
        self._data = data
        #: The identity's first 64 bits (uint64): what a store's blocks keep, sorted,
        #: of the tasks they trained, so that reuse skips the runs that cannot match.
        #: None: not kept (a block then cannot be skipped).
        self.prefixes = prefixes

    def __len__(self) -> int:
        return len(self._identity)

    @property
    def identity(self) -> Any:
        """Each task's identity, 32 hex digits (what the store keeps)."""
        if isinstance(self._identity, np.ndarray):
            self._identity = lanes_hex_array(self._identity)
        return self._identity

    def identity_bytes(self) -> np.ndarray | None:
        """Each task's identity as the 16 bytes its hex digits spell, a
        ``(tasks, 16)`` uint8 array; None once (or when) held as text only."""
        if not isinstance(self._identity, np.ndarray):
            return None
        return lanes_bytes(self._identity)

    @property
    def data(self) -> Any:
        """The hash of each task's data (its group's rows, or its item)."""
        if isinstance(self._data, np.ndarray):
            self._data = lanes_hex_array(self._data)
        return self._data

    def texts_of(self, rows: np.ndarray) -> tuple[Any, Any]:
        """The identity and data hash texts of the tasks ``rows`` (task
        numbers), made from their lanes alone while the whole columns are
        not held as text: a store's writer writes each hand-over's, and a
        run of ten million would otherwise keep 720 MB of hex digits."""
        identity = lanes_hex_array(self._identity[rows]) if isinstance(
            self._identity, np.ndarray) else self._identity.take(rows)
        data = lanes_hex_array(self._data[rows]) if isinstance(
            self._data, np.ndarray) else self._data.take(rows)
        return identity, data


def _shared_hash(shared: dict) -> tuple[str, dict[str, str]]:
    """The hash of the shared objects (:func:`value_hash` of the dict, made
    from each object's hash) and each one's, so that a store can say which
    one changed; one that cannot be hashed is named."""
    parts: dict[str, str] = {}
    for name, value in sorted(shared.items()):
        try:
            parts[name] = value_hash(value)
        except Exception as error:
            raise TypeError(
                f"the shared object {name!r} cannot be hashed ({type(error).__name__}: "
                f"{error}), and a store needs it to know when a model can be reused: "
                "pass it through setup= instead (made on each worker), or train "
                "without store=") from error
    return digest("dict", *(f"{name!r}={part}" for name, part in parts.items())), parts


def task_identities(plan: Any, fit: Any, shared: dict | None, setup: Any = None
                    ) -> tuple[TaskIdentities, dict]:
    """Every task's identity (see :class:`TaskIdentities`), and the code
    description, with the run's ``code_hash`` and ``shared_hash``. Group rows
    are hashed once for the whole table."""
    import pyarrow as pa

    code, detail = code_identity(fit, setup)
    shared_part, shared_parts = _shared_hash(shared or {})
    tasks = plan.tasks
    data_lanes = plan.data.hash_lanes(tasks.refs)
    # the parts that vary per setting, not per group: hashed once per setting
    params_of: dict[int, tuple[str, int]] = {}
    prefixes: list[tuple[int, int]] = []
    params_parts: list[str] = []
    if tasks.params is None:  # no grid: one prefix for every task
        prefixes.append(lanes_of(digest(code, "-", shared_part)))
        which = np.zeros(len(tasks), dtype=np.int64)
    else:
        which = np.empty(len(tasks), dtype=np.int64)
        for position, task_params in enumerate(tasks.params):
            found = params_of.get(id(task_params))
            if found is None:
                params = value_hash(sorted(task_params.items())) if task_params else "-"
                found = params_of[id(task_params)] = (params, len(prefixes))
                prefixes.append(lanes_of(digest(code, params, shared_part)))
            params_parts.append(found[0])
            which[position] = found[1]
    prefix_lanes = np.array(prefixes, dtype=np.uint64).reshape(-1, 2)[which]
    identity_lanes = combine_lanes(data_lanes, prefix_lanes)
    if tasks.params is None or (len(params_of) == 1 and params_parts[0] == "-"):
        params_column = pa.nulls(len(tasks), pa.string())  # no grid: no parameters
    else:
        params_column = pa.array([None if params == "-" else params
                                  for params in params_parts], pa.string())
    # the prefixes: a view of the identities' first lane, not a copy of it
    # (8 bytes a task held through the run, 80 MB at ten million)
    identities = TaskIdentities(identity_lanes, params_column, data_lanes, identity_lanes[:, 0])
    return identities, {**detail, "code_hash": code, "shared_hash": shared_part,
                        "shared_parts": shared_parts}
