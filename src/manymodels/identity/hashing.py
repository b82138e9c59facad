"""Task identity: a hash of a task's code, parameters and data.

A re-run with a store reuses every finished model whose identity is
unchanged, so the identity must change whenever the model could:

* **code**: ``fit``'s source (or bytecode, names, constants and closure values when
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
  classes their pickles name). A group's row labels, which ``map_groups``
  hands ``fn`` (:class:`~manymodels.inputs.grouplabels.GroupLabels`), count
  in its data: its own labels, not the whole table's.

Each part is kept apart so that a store can say which one changed.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from ..inputs.grouplabels import GroupLabels
from ..inputs.keys import canonical
from . import codehash
from .codehash import digest
from .inputdigest import add_array
from .rowhash import combine_lanes, lanes_bytes, lanes_hex_array, lanes_of
from .valuehash import value_hash


def code_identity(fn: Any, setup: Any = None) -> tuple[str, dict[str, Any]]:
    """The hash of ``fn``'s code (and ``setup``'s) and its parts: see
    :func:`.codehash.code_identity`; the values the code reads hash as
    :func:`value_hash` does."""
    return codehash.code_identity(fn, setup, value_hash)


def plain_setting(setting: dict[str, Any]) -> dict[str, Any]:
    """A grid setting as its identity hashes it: each NumPy scalar that
    Python's own type holds exactly (``np.int64(3)``, ``np.float64(0.5)``,
    ``np.bool_``, ``np.str_``) as that Python value, so that a grid of
    ``np.arange(1, 4)`` and one of ``[1, 2, 3]`` give the same tasks and a
    re-run with either reuses the other's models (each pickled otherwise, and
    hashed apart). ``np.float32``, ``np.int8`` and other narrower numbers
    stay apart: ``fit`` computes in their precision, and wraps around at
    their range (``np.int8(100) * 2`` is -56). Values of other kinds are
    left as they are."""
    if not any(isinstance(value, np.generic) for value in setting.values()):
        return setting
    return {name: _plain_scalar(value) for name, value in setting.items()}


#: The NumPy scalars a setting is hashed as Python's value of: those that
#: compute as Python's numbers do in NumPy (``np.arange``'s and
#: ``np.linspace``'s, and the types a Python number becomes in an array).
_AS_PYTHON = frozenset({np.int64, np.uint64, np.float64, np.bool_, np.str_, np.bytes_})


def _plain_scalar(value: Any) -> Any:
    if type(value) in _AS_PYTHON:
        return value.item()
    return value


def setting_hash(setting: dict[str, Any]) -> str:
    """The hash of a grid setting (a task's parameters): see :func:`plain_setting`."""
    return value_hash(sorted(plain_setting(setting).items()))



# -- hashes of a million tasks at once ---------------------------------------------
class TaskIdentities:
    """Each task's identity and the parts of it that are its own, as Arrow
    string arrays in task order (a million tuples of three Python strings
    were a quarter of a driver's memory). Code and shared objects are the
    same for every task: the run keeps their hashes, in its code description.

    ``identity`` and ``data`` may be given as their ``(tasks, 2)`` uint64
    lanes: their text is then made when first asked for (an unchanged re-run
    that names the run it reuses compares the identities' bytes, and writes
    neither). Or they may be deferred (:meth:`deferred`): made when first
    asked for at all, which an unchanged re-run whose :attr:`input_digest`
    an earlier run recorded never does."""

    __slots__ = ("_identity", "params", "_data", "_prefixes", "_count", "_make", "_making",
                 "input_digest")

    def __init__(self, identity: Any, params: Any, data: Any,
                 prefixes: np.ndarray | None, input_digest: str | None = None) -> None:
        self._identity = identity
        #: the hash of each task's parameters; null without a grid
        self.params = params
        self._data = data
        self._prefixes = prefixes
        self._count = len(identity)
        self._make: Any = None
        self._making: Any = None
        #: The digest of all these identities are made from
        #: (:mod:`.inputdigest`), or None: what lets a re-run of the same
        #: input know them as an earlier run's without making them.
        self.input_digest = input_digest

    @classmethod
    def deferred(cls, count: int, params: Any, make: Any, input_digest: str | None
                 ) -> TaskIdentities:
        """Identities of ``count`` tasks that ``make()`` makes, as its
        ``(identity, data, prefixes)``, when first asked for (once, whichever
        thread asks: the store's writer, or the driver)."""
        import threading

        identities = cls(np.empty((0, 2), dtype=np.uint64), params, None, None, input_digest)
        identities._count, identities._make = count, make
        identities._making = threading.Lock()
        return identities

    def _made(self) -> None:
        if self._make is None:
            return
        with self._making:
            if self._make is not None:
                self._identity, self._data, self._prefixes = self._make()
                self._make = None

    def __len__(self) -> int:
        return self._count

    @property
    def prefixes(self) -> np.ndarray | None:
        """The identity's first 64 bits (uint64): what a store's blocks keep,
        sorted, of the tasks they trained, so that reuse skips the runs that
        cannot match. None: not kept (a block then cannot be skipped)."""
        self._made()
        return self._prefixes

    @property
    def identity(self) -> Any:
        """Each task's identity, 32 hex digits (what the store keeps)."""
        self._made()
        if isinstance(self._identity, np.ndarray):
            self._identity = lanes_hex_array(self._identity)
        return self._identity

    def identity_bytes(self) -> np.ndarray | None:
        """Each task's identity as the 16 bytes its hex digits spell, a
        ``(tasks, 16)`` uint8 array; None once (or when) held as text only."""
        self._made()
        if not isinstance(self._identity, np.ndarray):
            return None
        return lanes_bytes(self._identity)

    @property
    def data(self) -> Any:
        """The hash of each task's data (its group's rows, or its item)."""
        self._made()
        if isinstance(self._data, np.ndarray):
            self._data = lanes_hex_array(self._data)
        return self._data

    def texts_of(self, rows: np.ndarray) -> tuple[Any, Any]:
        """The identity and data hash texts of the tasks ``rows`` (task
        numbers), made from their lanes alone while the whole columns are
        not held as text: a store's writer writes each hand-over's, and a
        run of ten million would otherwise keep 720 MB of hex digits."""
        self._made()
        # each column read once: the driver's thread may turn it into text
        # meanwhile (the writer's thread calls this)
        held_identity, held_data = self._identity, self._data
        identity = lanes_hex_array(held_identity[rows]) if isinstance(
            held_identity, np.ndarray) else held_identity.take(rows)
        data = lanes_hex_array(held_data[rows]) if isinstance(
            held_data, np.ndarray) else held_data.take(rows)
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
    description, with the run's ``code_hash``, ``shared_hash`` and, where
    the input has one, ``input_digest`` (:mod:`.inputdigest`). Group rows
    are hashed once for the whole table, and only when first needed: an
    unchanged re-run that names an earlier run by its input's digest never
    hashes them."""
    import pyarrow as pa

    code, detail = code_identity(fit, setup)
    shared = shared or {}
    labelled = {name: value for name, value in shared.items() if isinstance(value, GroupLabels)}
    shared_part, shared_parts = _shared_hash(
        {name: value for name, value in shared.items() if name not in labelled})
    tasks = plan.tasks
    # the parts that vary per setting, not per group: hashed once per setting
    params_of: dict[int, tuple[str, int]] = {}
    prefixes: list[tuple[int, int]] = []
    params_parts: list[str] = []
    settings: list[dict] = []  # each distinct setting (by object), in prefix order
    if tasks.params is None:  # no grid: one prefix for every task
        prefixes.append(lanes_of(digest(code, "-", shared_part)))
        which = np.zeros(len(tasks), dtype=np.int64)
    else:
        which = np.empty(len(tasks), dtype=np.int64)
        for position, task_params in enumerate(tasks.params):
            found = params_of.get(id(task_params))
            if found is None:
                params = setting_hash(task_params) if task_params else "-"
                found = params_of[id(task_params)] = (params, len(prefixes))
                prefixes.append(lanes_of(digest(code, params, shared_part)))
                settings.append(task_params)
            params_parts.append(found[0])
            which[position] = found[1]
    prefix_lanes = np.array(prefixes, dtype=np.uint64).reshape(-1, 2)[which]
    if tasks.params is None or (len(params_of) == 1 and params_parts[0] == "-"):
        params_column = pa.nulls(len(tasks), pa.string())  # no grid: no parameters
    else:
        params_column = pa.array([None if params == "-" else params
                                  for params in params_parts], pa.string())

    def make() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        data_lanes = plan.data.hash_lanes(tasks.refs)
        for labels in labelled.values():  # each group's own labels, in its data
            data_lanes = combine_lanes(data_lanes, _labels_lanes(labels, tasks.refs))
        identity_lanes = combine_lanes(data_lanes, prefix_lanes)
        # the prefixes: a view of the identities' first lane, not a copy of it
        # (8 bytes a task held through the run, 80 MB at ten million)
        return identity_lanes, data_lanes, identity_lanes[:, 0]

    whole = None if labelled or not len(tasks) else plan.data.input_digest(tasks.refs)
    if whole is not None:  # with each task's code, parameters and shared objects, and
        add_array(whole, prefix_lanes)  # the key columns' names (the keys stored, as text)
        whole.update(f"|keys {list(plan.key_columns)!r}|".encode())
        if tasks.params is not None:  # and the grid values' key text, which their hash
            add_array(whole, which)  # does not fix (an object's repr holds its address)
            whole.update(json.dumps([[canonical(value) for value in setting.values()]
                                     if setting else [] for setting in settings]).encode())
        whole = whole.hexdigest()
    identities = TaskIdentities.deferred(len(tasks), params_column, make, whole)
    if whole is None:  # nothing to name an earlier run by: made now, as errors are raised
        identities._made()
    described = {**detail, "code_hash": code, "shared_hash": shared_part,
                 "shared_parts": shared_parts}
    if whole is not None:
        described["input_digest"] = whole
    return identities, described


def _labels_lanes(labels: GroupLabels, refs: Any) -> np.ndarray:
    """The lanes of each task's group's row labels (``refs``: its slice of
    the sorted table), hashed once for the table as pandas hashes an Index
    and combined per group as its rows are (:func:`.rowhash.group_lanes`),
    the labels' type and names salted in."""
    import pandas as pd

    from .rowhash import group_lanes

    index = labels.labels
    kind = ("row labels", str(index.dtype), repr(list(index.names)))
    try:
        rows = pd.util.hash_pandas_object(index, index=False).to_numpy()
    except (TypeError, ValueError):  # labels pandas cannot hash: each group's by value
        per_group = np.array([lanes_of(digest(*kind, value_hash(index[offset:offset + length])))
                              for offset, length in zip(labels.offsets.tolist(),
                                                        labels.lengths.tolist())],
                             dtype=np.uint64).reshape(-1, 2)
    else:
        per_group = group_lanes(rows, labels.offsets, labels.lengths, lanes_of(digest(*kind)))
    starts = (refs.offsets if hasattr(refs, "offsets") else
              np.fromiter((ref[0] for ref in refs), dtype=np.int64, count=len(refs)))
    if len(starts) == len(labels.offsets) and np.array_equal(starts, labels.offsets):
        return per_group  # a task per group, in the table's order
    return per_group[np.searchsorted(labels.offsets, starts)]
