"""A value's content hash: what the identity of a task's parameters, its
item, its shared objects and its files is made of (:mod:`.hashing` puts
a task's identity together from them).

Arrays and frames hash by their data, paths by the content of their files,
anything else by its pickle, written so that the hash is the same in every
process and across manymodels' own module moves: classes named by their
pinned module names (:data:`.pickles.PINNED_MODULES`), sets whose order changes
with the hash seed in one order, and the source of the user's own classes
that a pickle names (:func:`.codehash.user_code`).
"""

from __future__ import annotations

import collections
import hashlib
import os
import pickle
import threading
from pathlib import Path, PurePath
from typing import Any

import numpy as np

from . import codehash, pickles
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
        return digest("arrow", _arrow_type_text(value), value_hash(value.to_pandas()),
                      *_float_nulls(value))
    if isinstance(value, PurePath):
        return file_hash(value)
    if isinstance(value, (list, tuple, dict, set, frozenset)):
        return _container_hash(value)
    if value is None or type(value) in (bool, int, float, str, bytes):
        return digest(pickle.dumps(value, protocol=5))
    try:
        data, named = pickles.pickled_naming(value, value_hash)
    except Exception:  # a lambda, a class made in a function: by value
        return _cloudpickle_hash(value)
    return _with_user_code(data, named)


def _cloudpickle_hash(value: Any) -> str:
    """The hash of a value only cloudpickle pickles (a lambda, an object
    array): its pickle, and the user's code it names without holding it
    (a helper of the user's package a lambda calls)."""
    data, named = pickles.cloudpickled(value, value_hash)
    return _with_user_code(data, named)


def _with_user_code(data: bytes, named: list[Any]) -> str:
    """A pickle's hash with the code of the user's classes, functions and
    modules it names (:func:`.codehash.user_code`) and the content of the
    files its paths name (a config object's path to a file ``fit`` reads:
    an edited file reused the old models); the pickle's alone where it
    names none, so that such a value hashes as it did."""
    code = codehash.user_code([obj for obj in named if not isinstance(obj, PurePath)],
                              value_hash)
    files = [f"{obj}={file_hash(obj)}" for obj in named if isinstance(obj, PurePath)]
    return digest(data, code, *files) if code or files else digest(data)


def _array_hash(value: np.ndarray) -> str:
    """A NumPy array's hash: its type, shape and bytes (an object array's, its
    values'). A subclass's own state counts too: a masked array's mask, a
    unit an array of quantities carries (its bytes alone hashed an array
    whose mask or unit changed as the old one). The shape is the array's
    own: a 0-d array is not the array of its one value."""
    array = np.ascontiguousarray(value)
    if array.dtype.hasobject:
        hashed = _cloudpickle_hash(array.tolist())
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


def _float_nulls(value: Any) -> list[str]:
    """Where an Arrow table's or array's float columns hold nulls: pandas
    reads a null and a NaN there alike, which Arrow tells apart (a sum skips
    a null, a NaN it gives back), and a null that became NaN reused the old
    models. Nothing where there is no such null, so that such a value
    hashes as it did."""
    import pyarrow as pa
    import pyarrow.compute as pc

    columns = (list(zip(value.column_names, value.columns)) if hasattr(value, "column_names")
               else [("", value)])
    noted = []
    for name, column in columns:
        if pa.types.is_floating(column.type) and column.null_count:
            rows = np.flatnonzero(np.asarray(pc.is_null(column).to_numpy(zero_copy_only=False)))
            noted.append(f"nulls of {name!r}: {digest(rows.astype(np.int64).tobytes())}")
    return noted


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
        elif type(value) is not dict:  # a Counter gives 0 for a missing key, a dict raises
            kind = type(value)
            parts.append(f"type={kind.__module__}.{kind.__qualname__}")
            if getattr(value, "__dict__", None):  # a subclass's own state
                parts.append(f"state={value_hash(value.__dict__)}")
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
        labels.extend(_string_storage(name, column.dtype))
    labels.extend(_read_beside_the_values(frame))
    return digest(type(frame).__name__, repr([name for name, _ in columns]),
                  repr([str(column.dtype) for _, column in columns]),
                  *(hashes.tobytes() for hashes in rows), *labels)


def _string_storage(name: Any, dtype: Any) -> list[str]:
    """A text column's storage where it is not Arrow's: ``string[python]``
    and ``string[pyarrow]`` print alike, and a table's groups hash them
    apart (Arrow holds them as ``string`` and ``large_string``); a shared
    frame's columns hash as its groups' would. Nothing for Arrow's, so that
    such a frame stays hashed as it was."""
    import pandas as pd

    storage = getattr(dtype, "storage", None)
    if not isinstance(dtype, pd.StringDtype) or storage in (None, "pyarrow"):
        return []
    return [f"storage of {name!r}: {storage}"]


def _read_beside_the_values(frame: Any) -> list[str]:
    """What a model can read of a frame beside its values, its columns' and
    its index's names and types: its ``attrs`` (a unit, a source a ``fit``
    reads from them) and the names of its columns' levels. Each is noted
    only where there is one, so that a frame without stays hashed as it was."""
    noted = []
    if frame.attrs:
        noted.append(f"attrs {value_hash(dict(frame.attrs))}")
    names = list(getattr(frame, "columns", None) is not None and frame.columns.names or [])
    if any(name is not None for name in names):
        noted.append(f"column level names {names!r}")
    return noted


def pandas_row_hashes(frame: Any) -> tuple[np.ndarray, str]:
    """Each row's hash of a pandas frame, its index in (the data hash of
    ``map_partitions``' partitions, which keep the index), and a note of
    its object columns' kinds for its schema's text (``""`` where there is
    nothing to note). pandas' ``hash_pandas_object(frame, index=True)``
    hashes ``1`` as ``"1"``, bytes as the text they spell and None as NaN
    in an object column: a partition so changed reused the old output.
    Each column and index level is hashed here as a shared frame's is
    (:func:`_column_hashes`), and combined as pandas combines them: a frame
    whose object columns hold texts and NaNs hashes as it did."""
    import pandas as pd

    labels: list[str] = []
    hashes = [_column_hashes(frame.iloc[:, position], frame.columns[position], labels)
              for position in range(frame.shape[1])]
    hashes.append(_index_hashes(frame.index, labels))
    noted = [label for label in labels if label.rsplit(": ", 1)[-1] not in ("string", "empty")]
    if not len(frame):
        return pd.util.hash_pandas_object(frame, index=True).to_numpy(), ""
    return _combined_as_pandas(hashes), "".join(f"|{label}" for label in noted)


def _index_hashes(index: Any, labels: list[str]) -> np.ndarray:
    """An index's hash of each row: pandas' own, but for an index level of
    object values hashed as :func:`_column_hashes` hashes them."""
    import pandas as pd

    if index.nlevels == 1:
        return _column_hashes(index, "the index", labels)
    own = pd.util.hash_pandas_object(index, index=False).to_numpy()
    levels = [index.get_level_values(level) for level in range(index.nlevels)]
    hashed = [_column_hashes(values, f"index level {level}", labels)
              for level, values in enumerate(levels)]
    if all(np.array_equal(found, pd.util.hash_pandas_object(values, index=False).to_numpy())
           for found, values in zip(hashed, levels)):
        return own
    return _combined_as_pandas(hashed)


def _combined_as_pandas(arrays: list[np.ndarray]) -> np.ndarray:
    """Row hashes of several columns combined as pandas' private
    ``combine_hash_arrays`` combines them (its constants, in its order)."""
    out = np.full(len(arrays[0]), 0x345678, dtype=np.uint64)
    multiplier = np.uint64(1000003)
    with np.errstate(over="ignore"):
        for position, array in enumerate(arrays):
            inverse = len(arrays) - position
            out ^= array.astype(np.uint64, copy=False)
            out *= multiplier
            multiplier += np.uint64(82520 + inverse + inverse)
        out += np.uint64(97531)
    return out


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
        hashes = pd.util.hash_pandas_object(values, index=False).to_numpy()
    except TypeError:  # values pandas cannot hash (an Arrow list column's)
        labels.append(f"values of {name!r} each by its own hash")
        return _each_value_hashed(values)
    return _missing_told_apart(values, hashes) if values.dtype == object else hashes


def _missing_told_apart(values: Any, hashes: np.ndarray) -> np.ndarray:
    """``hashes`` (pandas' of an object column) with each missing value that
    is not a float NaN (None, ``pd.NA``) hashed by :func:`value_hash`:
    pandas hashes them all as NaN, and a column whose None became NaN (a
    ``fit`` that tells them apart: ``x is None``) reused the old model. A
    NaN keeps pandas' hash, so that a column of texts with NaNs, pandas'
    own missing text, stays hashed as it was."""
    import pandas as pd

    array = np.asarray(values, dtype=object)
    missing = np.flatnonzero(pd.isna(array))
    odd = [row for row in missing.tolist() if not _is_float_nan(array[row])]
    if not odd:
        return hashes
    hashes = np.array(hashes, dtype=np.uint64)
    hashes[odd] = _each_value_hashed(array[odd])
    return hashes


def _is_float_nan(value: Any) -> bool:
    return isinstance(value, float) and value != value


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
