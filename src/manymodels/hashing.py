"""Task identity: a hash of a task's code, parameters and data.

A re-run with a store reuses every finished model whose identity is
unchanged, so the identity must change whenever the model could:

* **code**: ``fit``'s source (or bytecode, constants and closure values when
  the source is not available), and, followed transitively, the source files of
  the user's own modules that it uses: a helper module edited means every
  model is retrained. Installed packages (site-packages, the standard library)
  are not hashed file by file; their versions are recorded instead, so an
  upgrade of scikit-learn retrains too.
* **params**: the grid values of the task.
* **data**: the content of the group's rows (and the table's schema); an
  item's value, or the content of the file when the item is a path; the
  content of the ``shared`` objects.

Each part is kept apart so that a store can say which one changed.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import importlib.metadata
import inspect
import os
import pickle
import sys
import sysconfig
import threading
import types
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path, PurePath
from typing import Any

import cloudpickle
import numpy as np

from .rowhash import combine_lanes, lanes_bytes, lanes_hex_array, lanes_of


def digest(*parts: bytes | str) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\x1f")
    return h.hexdigest()


@functools.lru_cache(maxsize=1)
def _installed_roots() -> tuple[str, ...]:
    roots = set()
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(name)
        if path:
            roots.add(os.path.realpath(path))
    roots.add(os.path.realpath(os.path.dirname(os.__file__)))
    roots.add(os.path.realpath(os.path.dirname(__file__)))  # manymodels itself
    return tuple(sorted(roots))


def _is_user_file(filename: str | None) -> bool:
    if not filename or not filename.endswith(".py") or not os.path.exists(filename):
        return False
    real = os.path.realpath(filename)
    return not any(real.startswith(root + os.sep) for root in _installed_roots())


def _package_version(module_name: str) -> str | None:
    top = module_name.split(".")[0]
    for name in (top, top.replace("_", "-")):
        try:
            return f"{top}=={importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    module = sys.modules.get(top)
    version = getattr(module, "__version__", None)
    return f"{top}=={version}" if version else None


class _CodeWalker:
    """Collects the code a function depends on: user sources and package versions."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}  # label -> hash of source text
        self.versions: set[str] = set()
        self._seen: set[int] = set()
        self.unhashable: list[str] = []

    def visit(self, obj: Any, label: str = "fit") -> None:
        """Follow ``obj``; ``label`` names where it was found (a stable name:
        identities are compared across processes)."""
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            self._visit_module(obj)
        elif isinstance(obj, functools.partial):
            self.visit(obj.func, f"{label}.func")
            self.value(f"{label}:partial", (obj.args, obj.keywords))
        elif isinstance(obj, (types.FunctionType, types.MethodType)):
            self._visit_function(getattr(obj, "__func__", obj))
            if isinstance(obj, types.MethodType) and not isinstance(obj.__self__, type):
                self.value(f"{label}:self", obj.__self__)
        elif isinstance(obj, type):
            self._visit_defined(obj)
        elif callable(obj) and not isinstance(obj, types.BuiltinFunctionType):
            self.visit(type(obj), f"{label}:type")
            if label != "fit":  # the fit object's own state is hashed by code_identity
                self.value(f"{label}:state", obj)

    def value(self, label: str, value: Any) -> None:
        """Hash a value the code reads; one that cannot be hashed makes the
        identity unique, so that its models are never reused on a guess."""
        try:
            self.sources[label] = value_hash(value)
        except Exception as exc:
            self.sources[label] = f"unhashable:{uuid.uuid4().hex}"
            self.unhashable.append(f"{label} ({type(value).__name__}: {exc!r})")

    def _visit_module(self, module: types.ModuleType) -> None:
        filename = getattr(module, "__file__", None)
        if _is_user_file(filename):
            self.sources[f"module:{module.__name__}"] = digest(Path(filename).read_bytes())
            for value in list(vars(module).values()):
                if isinstance(value, types.ModuleType) or (
                    getattr(value, "__module__", None) not in (None, module.__name__)
                    and callable(value)
                ):
                    self.visit(value)
        elif module.__name__ not in sys.builtin_module_names:
            version = _package_version(module.__name__)
            if version:
                self.versions.add(version)

    def _visit_defined(self, obj: type) -> None:
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if module is None:
            return
        if module.__name__ == "__main__":
            try:
                self.sources[f"class:__main__.{obj.__qualname__}"] = digest(inspect.getsource(obj))
            except (OSError, TypeError):
                self.value(f"class:__main__.{obj.__qualname__}", obj)
            for member in vars(obj).values():  # its methods read globals too
                member = getattr(member, "__func__", member)
                if isinstance(member, types.FunctionType):
                    self.visit(member)
        else:
            self._visit_module(module)  # a user class: its whole module file

    def _visit_function(self, fn: types.FunctionType) -> None:
        module = sys.modules.get(fn.__module__ or "")
        if (
            module is not None
            and module.__name__ != "__main__"
            and not _is_user_file(getattr(module, "__file__", None))
        ):
            self._visit_module(module)  # an installed function: its version suffices
            return
        # A user function: its own source, then whatever it refers to, so that
        # editing a helper it calls changes the identity, and editing an
        # unrelated line of the same file does not.
        try:
            text = inspect.getsource(fn)
        except (OSError, TypeError):
            text = _code_text(fn.__code__)
        label = f"function:{fn.__module__}.{fn.__qualname__}"
        self.sources[label] = digest(text)
        self.value(f"{label}:defaults", (fn.__defaults__, fn.__kwdefaults__))
        for position, cell in enumerate(fn.__closure__ or ()):
            try:
                contents = cell.cell_contents
            except ValueError:
                continue
            self.visit(contents, f"{label}:closure{position}")
            if not callable(contents):
                self.value(f"{label}:closure{position}", contents)
        # Globals it reads: code by what they are, data by their value, so that
        # editing ALPHA = 1 to ALPHA = 2 retrains
        for name in sorted(_global_names(fn.__code__)):
            if name in fn.__globals__:
                value = fn.__globals__[name]
                if callable(value) or isinstance(value, types.ModuleType):
                    self.visit(value, f"{label}:global:{name}")
                elif not name.startswith("__"):
                    self.value(f"{label}:global:{name}", value)
            elif name in sys.modules:  # imported inside the function
                self.visit(sys.modules[name])
        # Values it reads from a module of the user's own (helpers.ALPHA): the
        # module's file covers what is written there, not what a script set
        # since (helpers.ALPHA = 50)
        for chain in sorted(_attribute_chains(fn.__code__)):
            value = fn.__globals__.get(chain[0])
            for depth, attribute in enumerate(chain[1:], start=1):
                if not isinstance(value, types.ModuleType):
                    break
                owner, value = value, getattr(value, attribute, None)
                if not isinstance(value, types.ModuleType):
                    if not callable(value) and _is_user_file(getattr(owner, "__file__", None)):
                        self.value(f"{label}:global:{'.'.join(chain[:depth + 1])}", value)
                    break


def _global_names(code: types.CodeType) -> set[str]:
    """The global names ``code`` (and the code nested in it) reads: not the
    attribute names it uses (``df.sales`` must not hash a global ``sales``)."""
    names = {instruction.argval for instruction in dis.get_instructions(code)
             if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL")}
    names |= {name for name in code.co_names if name in sys.modules}  # imported inside
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _attribute_chains(code: types.CodeType) -> set[tuple[str, ...]]:
    """The dotted names ``code`` (and the code nested in it) reads from a
    global: ``("helpers", "ALPHA")`` for ``helpers.ALPHA``."""
    chains: set[tuple[str, ...]] = set()
    chain: list[str] = []
    for instruction in dis.get_instructions(code):
        if instruction.opname == "LOAD_GLOBAL":
            if len(chain) > 1:
                chains.add(tuple(chain))
            chain = [instruction.argval]
        elif instruction.opname == "LOAD_ATTR" and chain:
            chain.append(instruction.argval)
        else:
            if len(chain) > 1:
                chains.add(tuple(chain))
            chain = []
    if len(chain) > 1:
        chains.add(tuple(chain))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            chains |= _attribute_chains(const)
    return chains


def _code_text(code: types.CodeType) -> str:
    parts = [code.co_code.hex(), repr(code.co_names)]
    for const in code.co_consts:
        parts.append(_code_text(const) if isinstance(const, types.CodeType) else repr(const))
    return "|".join(parts)


def code_identity(fn: Any, setup: Any = None) -> tuple[str, dict[str, Any]]:
    """The hash of ``fn``'s code and what it depends on, and a description of
    its parts (for saying what changed); with ``setup=`` (what makes each
    worker's resources, which ``fn`` computes with), its code too."""
    walker = _CodeWalker()
    walker.visit(fn)
    for name, maker in (setup.items() if isinstance(setup, Mapping) else [("", setup)]):
        if maker is not None:
            walker.visit(maker, f"setup{':' if name else ''}{name}")
            if not isinstance(maker, (types.FunctionType, types.MethodType, type,
                                      functools.partial)):
                walker.value(f"setup{':' if name else ''}{name}:state", maker)
    if not isinstance(fn, (types.FunctionType, types.MethodType, type, functools.partial)):
        walker.value("callable_state", fn)  # a configured callable object
    if walker.unhashable:
        warnings.warn(
            "fit reads values that cannot be hashed, so a store never reuses its models: "
            + "; ".join(walker.unhashable[:3]), RuntimeWarning, stacklevel=3)
    versions = sorted(walker.versions | {f"python=={sys.version.split()[0]}"})
    detail = {"sources": dict(sorted(walker.sources.items())), "versions": versions}
    return digest(pickle.dumps(detail["sources"]), "\n".join(versions)), detail


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
    code = _user_code(named)
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


def _pickled_naming(value: Any) -> tuple[bytes, list[Any]]:
    import io

    buffer = io.BytesIO()
    pickler = _NamingPickler(buffer)
    pickler.dump(value)
    return buffer.getvalue(), list(pickler.named.values())


def _user_code(named: list[Any]) -> str:
    """The hash of the user's own code among ``named`` (classes and
    functions a pickle names; see :class:`_CodeWalker`), or "" when there is
    none: a pickle names a class or a function, it does not hold its code,
    so an edited method would otherwise leave an instance's hash as it was.
    Installed code is left to its version, as the pickle's names are."""
    walker = _CodeWalker()
    visiting = _VISITING.__dict__.setdefault("ids", set())
    for obj in named:
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        if id(obj) not in visiting and module is not None and (
                module.__name__ == "__main__" or _is_user_file(getattr(module, "__file__", None))):
            visiting.add(id(obj))  # a class without source is hashed by value: not again
            try:
                walker.visit(obj, f"named:{getattr(obj, '__qualname__', '')}")
            finally:
                visiting.discard(id(obj))
    return digest(pickle.dumps(sorted(walker.sources.items()))) if walker.sources else ""


#: Per thread, the classes and functions whose code :func:`_user_code` is walking.
_VISITING = threading.local()


def file_hash(path: PurePath | str) -> str:
    """The content hash of a file; of a folder, the names and contents of
    the files under it; else of the path itself (nothing there)."""
    path = Path(path)
    if path.is_dir():
        parts = [f"{file.relative_to(path).as_posix()}={file_hash(file)}"
                 for file in sorted(path.rglob("*")) if file.is_file()]
        return digest("folder", *parts)
    if not path.is_file():
        return digest("path", str(path))
    h = hashlib.blake2b(digest_size=16)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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
    identities = TaskIdentities(identity_lanes, params_column, data_lanes,
                                np.ascontiguousarray(identity_lanes[:, 0]))
    return identities, {**detail, "code_hash": code, "shared_hash": shared_part,
                        "shared_parts": shared_parts}
