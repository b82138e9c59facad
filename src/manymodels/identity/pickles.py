"""A value's pickle as its identity reads it: the same in every process and
across manymodels' own module moves (:mod:`.valuehash` hashes it).

Python's pickle of the same value can differ between processes and
releases: a set of texts iterates in an order the hash seed picks, a tensor
is named by the address of its storage, cloudpickle names a class made in a
function by an id made anew in each process, and a class of manymodels is
named by the module it lives in now. Each pickler here writes those the
same way every time (sets in one order, tensors by content, classes by a
fixed name, manymodels' modules by their :data:`PINNED_MODULES` names), and
only where the plain pickle would have differed: a value whose plain pickle
was already stable keeps it, and so the identity it always had.
"""

from __future__ import annotations

import pickle
import sys
import types
import typing
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

import cloudpickle

from .codehash import digest


class NamingPickler(pickle.Pickler):
    """A pickler that notes the classes of the objects it pickles and the
    classes and functions it pickles by name: its pickle is the plain one."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=5)
        self.named: dict[int, Any] = {}

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType, PurePath)):  # a path: its file counts
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
    "manymodels.evaluation.halving": "manymodels.selection",
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
    "manymodels.run.grouppredictor": "manymodels.prediction",
    "manymodels.run.prediction": "manymodels.prediction",
    "manymodels.run.results": "manymodels.results",
    "manymodels.sklearn._routing": "manymodels.routing",
}


class PinnedNamePickler(pickle._Pickler):  # the Python pickler: its save_global can be changed
    """Pickles as the C pickler does, but names manymodels' classes and
    functions by their :data:`PINNED_MODULES` names, and writes each set
    whose order changes with the hash seed in one order (see
    :func:`_canonical_set`): a frozenset of texts inside a config object
    pickles in a new order in each process, and its ``fit`` was never reused.
    (The C pickler does not ask ``reducer_override`` about a set.)"""

    def __init__(self, file: Any, set_order: Callable[[Any], str], protocol: int = 5) -> None:
        super().__init__(file, protocol=protocol)
        self.set_order = set_order
        #: whether a set was written in another order than it iterates in
        self.reordered = False

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (set, frozenset)) and len(obj) > 1 and not all(
                map(_seed_free, obj)):
            self.reordered = True
            return _canonical_set(obj, self.set_order)
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


class _NoticingCloudPickler(cloudpickle.Pickler):
    """cloudpickle's pickler (its pickle is cloudpickle's own) that notes
    whether it wrote what differs between processes: a class pickled by
    value (cloudpickle names it by an id made anew in each process) or a
    tensor (by the address of its storage); and the classes, functions and
    modules it names without their code (see :meth:`_note_named`)."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=5)
        self.varies = False
        self.named: dict[int, Any] = {}

    def reducer_override(self, obj: Any) -> Any:
        reduced = super().reducer_override(obj)
        if (isinstance(obj, type) and _made_by_value(reduced) or _is_tensor(obj)
                or _typevar_by_value(obj) is not None):
            self.varies = True
        self._note_named(obj, reduced)
        return reduced

    def _note_named(self, obj: Any, reduced: Any) -> None:
        """Note ``obj`` where cloudpickle names it rather than writing its
        code: a class or function of an importable module (by reference)
        and a module (a lambda reading ``helpers.scale`` holds the module
        ``helpers``). A lambda's pickle holds its own code, not that of a
        helper of the user's package it calls: an edited helper left its
        hash as it was, and the old models were reused."""
        if isinstance(obj, (types.ModuleType, PurePath)) or (
                isinstance(obj, (type, types.FunctionType)) and reduced is NotImplemented):
            self.named.setdefault(id(obj), obj)


def _is_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _typevar_by_value(obj: Any) -> Any:
    """cloudpickle's reduction of ``obj`` where it is a TypeVar it makes
    anew (one made in a function, or the script's: named by an id made anew
    in each process), else None."""
    if not isinstance(obj, typing.TypeVar):
        return None
    from cloudpickle import cloudpickle as implementation

    reduced = implementation._typevar_reduce(obj)
    return reduced if reduced[0] is implementation._make_typevar else None


def _made_by_value(reduced: Any) -> bool:
    """Whether ``reduced`` (cloudpickle's reduction of a class) makes the class anew."""
    from cloudpickle import cloudpickle as implementation

    return isinstance(reduced, tuple) and reduced[0] in (
        implementation._make_skeleton_class, implementation._make_skeleton_enum)


class _StableCloudPickler(PinnedNamePickler):
    """cloudpickle's pickle written the same in every process, for a hash
    only (never unpickled): a class pickled by value named by a fixed text
    in place of cloudpickle's id for it (made anew in each process), each
    set in one order, a tensor by its content."""

    dispatch_table = cloudpickle.Pickler.dispatch_table
    # cloudpickle's reducers of functions, which read these two attributes
    _function_reduce = cloudpickle.Pickler._function_reduce
    _dynamic_function_reduce = cloudpickle.Pickler._dynamic_function_reduce
    _function_getnewargs = cloudpickle.Pickler._function_getnewargs

    def __init__(self, file: Any, set_order: Callable[[Any], str]) -> None:
        super().__init__(file, set_order, protocol=5)
        self.globals_ref: dict[int, dict] = {}
        self.proto = 5

    def reducer_override(self, obj: Any) -> Any:
        reduced = super().reducer_override(obj)  # a set in order, a tensor
        if reduced is not NotImplemented:
            return reduced
        if isinstance(obj, type):
            return _with_fixed_tracker(obj, cloudpickle.cloudpickle._class_reduce(obj))
        if isinstance(obj, types.FunctionType):
            return self._function_reduce(obj)
        typevar = _typevar_by_value(obj)
        if typevar is not None:  # its tracker id (the last argument) by its name
            return typevar[0], (*typevar[1][:-1], f"typevar:{obj.__name__}")
        return NotImplemented


def _with_fixed_tracker(cls: type, reduced: Any) -> Any:
    """cloudpickle's reduction of ``cls``, its tracker id (a random id)
    replaced by the class's qualified name."""
    if not _made_by_value(reduced):
        return reduced
    tracker = cloudpickle.cloudpickle._get_or_create_tracker_id(cls)
    fixed = f"{cls.__module__}.{cls.__qualname__}"
    arguments = tuple(fixed if part == tracker else part for part in reduced[1])
    return (reduced[0], arguments, _without_made_doc(cls, reduced[2]), *reduced[3:])


def _without_made_doc(cls: type, state: Any) -> Any:
    """A class's pickled state, the ``__doc__`` a dataclass writes for
    itself (its signature, defaults' reprs in: a frozenset of texts in the
    hash seed's order) replaced by a fixed text; its fields and their
    defaults count where they are kept (``__dataclass_fields__``)."""
    import dataclasses
    import inspect

    if not (dataclasses.is_dataclass(cls) and isinstance(state, tuple) and state
            and isinstance(state[0], dict) and "__doc__" in state[0]):
        return state
    try:
        made = cls.__name__ + str(inspect.signature(cls)).replace(" -> None", "")
    except (TypeError, ValueError):
        return state
    if state[0]["__doc__"] != made:
        return state
    return ({**state[0], "__doc__": "<a dataclass's signature>"}, *state[1:])


def cloudpickled(value: Any, set_order: Callable[[Any], str]) -> tuple[bytes, list[Any]]:
    """cloudpickle's pickle of ``value`` where it is the same in every
    process, else the one :class:`_StableCloudPickler` writes: a class made
    in a function, a set of texts, a tensor made cloudpickle's pickle of an
    object array (and of a value the plain pickler refuses) differ in each
    process, and its models were never reused. With it, the classes,
    functions and modules the pickle names without their code."""
    import io

    buffer = io.BytesIO()
    noticing = _NoticingCloudPickler(buffer)
    noticing.dump(value)
    data = buffer.getvalue()
    named = list(noticing.named.values())
    if not noticing.varies and not _may_hold_a_set(data, []):
        return data, named
    stable = io.BytesIO()
    rewritten = _StableCloudPickler(stable, set_order)
    rewritten.dump(value)
    if noticing.varies or rewritten.reordered:
        return stable.getvalue(), named
    return data, named


def pickled_naming(value: Any, set_order: Callable[[Any], str]) -> tuple[bytes, list[Any]]:
    import io

    buffer = io.BytesIO()
    pickler = NamingPickler(buffer)
    pickler.dump(value)
    named = list(pickler.named.values())
    data = buffer.getvalue()
    pinned = any(getattr(obj, "__module__", None) in PINNED_MODULES for obj in named)
    if pinned or _may_hold_a_set(data, named):
        canonical = io.BytesIO()
        rewritten = PinnedNamePickler(canonical, set_order, protocol=5)
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


def _canonical_set(value: set | frozenset, order: Callable[[Any], str]) -> tuple:
    """What a set is pickled as, for its hash: its class and its elements
    ordered by their own hashes (``order``, :func:`.valuehash.value_hash`;
    the state of a subclass too). Never unpickled."""
    elements = sorted(value, key=order)
    state = getattr(value, "__dict__", None) or None
    return type(value), (elements,), state
