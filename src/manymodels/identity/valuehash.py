"""A value's content hash: what the identity of a task's parameters, its
item, its shared objects and its files is made of (:mod:`.hashing` puts
a task's identity together from them).

Arrays and frames hash by their data, paths by the content of their files,
anything else by its pickle, written so that the hash is the same in every
process and across manymodels' own module moves: classes named by their
pinned module names (:data:`PINNED_MODULES`), sets whose order changes
with the hash seed in one order, and the source of the user's own classes
that a pickle names (:func:`.codehash.user_code`).
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import sys
import threading
import types
from pathlib import Path, PurePath
from typing import Any

import cloudpickle
import numpy as np

from . import codehash
from .codehash import digest


def value_hash(value: Any) -> str:
    """A content hash of a value: arrays and frames by their data, paths to files
    by the file's content, anything else by its pickle."""
    if isinstance(value, np.ndarray):
        return _array_hash(value)
    module = type(value).__module__
    if module.startswith("pandas"):
        import pandas as pd

        if isinstance(value, (pd.DataFrame, pd.Series)):
            return _frame_hash(value)
    if module.startswith("pyarrow") and hasattr(value, "to_pandas"):
        return digest("arrow", _arrow_type_text(value), value_hash(value.to_pandas()))
    if isinstance(value, PurePath):
        return file_hash(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return _container_hash(value)
    if value is None or type(value) in (bool, int, float, str, bytes):
        return digest(pickle.dumps(value, protocol=5))
    try:
        data, named = _pickled_naming(value)
    except Exception:
        return digest(cloudpickle.dumps(value))
    code = codehash.user_code(named, value_hash)
    return digest(data, code) if code else digest(data)


def _array_hash(value: np.ndarray) -> str:
    """A NumPy array's hash: its type, shape and bytes (an object array's, its
    values'). A subclass's own state counts too: a masked array's mask, a
    unit an array of quantities carries (its bytes alone hashed an array
    whose mask or unit changed as the old one). The shape is the array's
    own: a 0-d array is not the array of its one value."""
    array = np.ascontiguousarray(value)
    if array.dtype.hasobject:
        hashed = digest(cloudpickle.dumps(array.tolist()))
    else:
        raw = array.view(np.uint8).reshape(-1).data  # its bytes, not a copy of them
        hashed = digest(str(array.dtype), str(value.shape), raw)
    if type(value) is np.ndarray:
        return hashed
    kind = type(value)
    return digest(f"{kind.__module__}.{kind.__qualname__}", hashed,
                  value_hash(getattr(value, "__dict__", None)))


def _arrow_type_text(value: Any) -> str:
    """An Arrow table's schema (without its metadata: a pandas writer's
    version) or an array's type: converted to pandas, ``int64`` with a null
    and ``double`` with a NaN read alike, as do a text and a dictionary."""
    schema = getattr(value, "schema", None)
    if schema is not None:
        return str(schema.remove_metadata())
    return str(getattr(value, "type", ""))


#: Per thread, the containers :func:`value_hash` is inside, outermost first.
_ENTERED = threading.local()


def _container_hash(value: list | tuple | dict | set | frozenset) -> str:
    """A list's, tuple's, dict's or set's hash, from its elements'. One that
    holds itself (``a.append(a)``) hashes that element as a reference to
    the container it is (by how far out it is), not by recursing until
    Python's stack runs out."""
    inside = _ENTERED.__dict__.setdefault("ids", [])
    if id(value) in inside:
        return digest("itself", str(len(inside) - inside.index(id(value))))
    inside.append(id(value))
    try:
        return _elements_hash(value)
    finally:
        inside.pop()


def _elements_hash(value: list | tuple | dict | set | frozenset) -> str:
    if isinstance(value, (list, tuple)):
        return digest(type(value).__name__, *(value_hash(v) for v in value))
    if isinstance(value, dict):
        parts = [f"{_key_text(k)}={value_hash(v)}" for k, v in value.items()]
        if isinstance(value, collections.defaultdict):  # what it gives for a missing key
            parts.append(f"default_factory={value_hash(value.default_factory)}")
        return digest("dict", *parts)
    # a set pickles in hash-seed order
    return digest(type(value).__name__, *sorted(value_hash(v) for v in value))


def _key_text(key: Any) -> str:
    """A dict key as its hash takes it: its repr where that is the same in
    every process (texts, numbers, None, tuples of them), else its
    :func:`value_hash` (a frozenset's repr follows the hash seed, an
    object's may hold its address: such a dict hashed anew in each process)."""
    if _repr_is_stable(key):
        return repr(key)
    return f"<key {value_hash(key)}>"


def _repr_is_stable(key: Any) -> bool:
    if type(key) is tuple:
        return all(map(_repr_is_stable, key))
    return type(key) in (str, bytes, int, float, bool, complex, type(None))


def _frame_hash(frame: Any) -> str:
    """A pandas frame's or series' hash: each column's and each index
    level's values row by row (see :func:`_column_hashes`), its columns'
    names and types, and what those leave out that a model can read: the
    index's names and types, and the order of a categorical's categories
    (its codes)."""
    import pandas as pd

    columns = (list(frame.items()) if isinstance(frame, pd.DataFrame)
               else [(frame.name, frame)])
    index = frame.index
    levels = [(f"index level {level}", index.get_level_values(level))
              for level in range(index.nlevels)]
    labels = [f"index names {list(index.names)!r}",
              f"index types {[str(values.dtype) for _, values in levels]!r}"]
    rows = [_column_hashes(values, name, labels) for name, values in [*columns, *levels]]
    for name, column in [*columns, ("the index", index)]:
        if isinstance(column.dtype, pd.CategoricalDtype):
            labels.append(f"categories of {name!r}: {list(column.dtype.categories)!r}, "
                          f"ordered {column.dtype.ordered}")
    return digest(type(frame).__name__, repr([name for name, _ in columns]),
                  repr([str(column.dtype) for _, column in columns]),
                  *(hashes.tobytes() for hashes in rows), *labels)


#: What pandas hashes an object column of by its values' text alone, and
#: tells apart within it: a column of one of these kinds (missing values
#: aside) is hashed by pandas. In any other (``1`` beside ``"x"``, bytes
#: beside text, decimals, tuples), pandas hashed ``1`` as ``"1"``, ``b"a"``
#: as ``"a"`` and ``Decimal("1.0")`` as ``"1.0"``: a changed value reused the
#: old model.
_KINDS_PANDAS_TELLS_APART = frozenset({"empty", "string", "bytes", "integer", "floating",
                                       "boolean"})


def _column_hashes(values: Any, name: Any, labels: list[str]) -> Any:
    """A column's (or an index level's) hash of each row, as uint64. An
    object column notes its values' kind in ``labels`` (a column of texts
    and one of the bytes they spell hash alike in pandas), and one of
    values pandas hashes by their text (see :data:`_KINDS_PANDAS_TELLS_APART`)
    or cannot hash (lists, dicts, Arrow lists) is hashed value by value."""
    import pandas as pd

    if values.dtype == object:
        kind = pd.api.types.infer_dtype(values, skipna=True)
        labels.append(f"values of {name!r}: {kind}")
        if kind not in _KINDS_PANDAS_TELLS_APART:
            return _each_value_hashed(values)
    try:
        return pd.util.hash_pandas_object(values, index=False).to_numpy()
    except TypeError:  # values pandas cannot hash (an Arrow list column's)
        labels.append(f"values of {name!r} each by its own hash")
        return _each_value_hashed(values)


def _each_value_hashed(values: Any) -> Any:
    """Each of ``values`` hashed by :func:`value_hash`, as uint64 per row; a
    text, number or bytes that repeats hashed once (a million rows of a few
    labels and numbers took 1.5 s, each value pickled)."""
    import pandas as pd

    known: dict[tuple[type, Any], str] = {}
    texts = np.empty(len(values), dtype=object)
    for position, value in enumerate(values):
        plain = type(value) in _EQUAL_IS_SAME
        hashed = known.get((type(value), value)) if plain else None
        if hashed is None:
            hashed = value_hash(value)
            if plain:
                known[type(value), value] = hashed
        texts[position] = hashed
    return pd.util.hash_array(texts, categorize=False)


#: Types whose equal values are the same value (not ``0.0`` and ``-0.0``,
#: nor ``Decimal("1.0")`` and ``Decimal("1.00")``).
_EQUAL_IS_SAME = frozenset({str, int, bool, bytes, type(None)})


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
        return _tensor_by_content(obj)  # else NotImplemented: pickled as it would be


def _tensor_by_content(obj: Any) -> Any:
    """What a PyTorch tensor (a module's parameter too) is pickled as for its
    hash: its class, type, shape, whether it takes gradients, and its bytes'
    hash. Its own pickle names its storage by the storage's address in
    memory: each process, and each copy, hashed another, and a run whose
    ``fit`` read a tensor or a module (a global, a shared object) was never
    reused. NotImplemented for anything else, and for a tensor whose bytes
    cannot be read as such (sparse, quantized): pickled as it would be."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(obj, torch.Tensor):
        return NotImplemented
    try:
        flat = obj.detach().cpu().resolve_conj().resolve_neg().contiguous().reshape(-1)
        raw = flat.view(torch.uint8).numpy().data
    except Exception:
        return NotImplemented
    kind = type(obj)
    return tuple, ((f"{kind.__module__}.{kind.__qualname__}", str(obj.dtype),
                    tuple(obj.shape), bool(obj.requires_grad), digest(raw)),)


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
    "manymodels.identity.valuehash": "manymodels.hashing",
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
        return _tensor_by_content(obj)

    def save_global(self, obj: Any, name: str | None = None) -> None:
        pinned = PINNED_MODULES.get(getattr(obj, "__module__", None) or "")
        if pinned is None:
            super().save_global(obj, name)
            return
        self.save(pinned)
        self.save(name or getattr(obj, "__qualname__", None) or obj.__name__)
        self.write(pickle.STACK_GLOBAL)
        self.memoize(obj)


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
