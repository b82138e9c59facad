"""The code part of a task's identity: ``fit``'s source and, followed
transitively, the user's own functions, classes and modules it uses, the
values of the globals they read, and the versions of the installed packages
(see :mod:`.hashing` for the identity as a whole).

A walk (:class:`_CodeWalker`) from ``fit`` (and ``setup=``) collects a hash
per piece of the user's code it reaches, by a stable label, so that a store
can say what changed; an installed package counts by its version. A pickle
names a class or a function without its code, so :func:`user_code` walks
the user's classes and functions a value's pickle names (a global, a shared
object, a grid value): an edited method retrains.

A decorated ``fit`` counts whole: the wrapper's own code and, down the
chain, what it wraps (``__wrapped__``, a closure's cells, a
``functools.partial``'s function and arguments, a ``staticmethod`` or
``classmethod``'s function, a callable object's class and state), so that
editing the decorator retrains as editing ``fit`` does.
"""

from __future__ import annotations

import dis
import functools
import hashlib
import importlib.metadata
import inspect
import linecache
import os
import pickle
import sys
import sysconfig
import threading
import types
import uuid
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any


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
    # manymodels itself: the package above this subpackage
    roots.add(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
    return tuple(sorted(roots))


def _is_user_file(filename: str | None) -> bool:
    if not filename or not filename.endswith(".py") or not os.path.exists(filename):
        return False
    real = os.path.realpath(filename)
    return not any(real.startswith(root + os.sep) for root in _installed_roots())


def package_version(module_name: str) -> str | None:
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

    def __init__(self, value_hash: Callable[[Any], str]) -> None:
        self._value_hash = value_hash  # (valuehash.value_hash, which calls user_code back)
        self.sources: dict[str, str] = {}  # label -> hash of source text
        self.versions: set[str] = set()
        self._seen: set[int] = set()
        self._labelled: dict[str, int] = {}  # a function's label -> the function's id
        self.unhashable: list[str] = []

    def visit(self, obj: Any, label: str = "fit") -> None:
        """Follow ``obj``; ``label`` names where it was found (a stable name:
        identities are compared across processes)."""
        if id(obj) in self._seen:
            return
        self._seen.add(id(obj))
        if isinstance(obj, types.ModuleType):
            self._visit_module(obj)
            return
        if isinstance(obj, functools.partial):
            self.visit(obj.func, f"{label}.func")
            self.value(f"{label}:partial", (obj.args, obj.keywords))
        elif isinstance(obj, (staticmethod, classmethod)):
            self.visit(obj.__func__, f"{label}.func")
        elif isinstance(obj, (types.FunctionType, types.MethodType)):
            self._visit_function(getattr(obj, "__func__", obj))
            if isinstance(obj, types.MethodType):
                if isinstance(obj.__self__, type):  # a classmethod: its class's code
                    self.visit(obj.__self__, f"{label}:class")
                else:
                    self.value(f"{label}:self", obj.__self__)
        elif isinstance(obj, type):
            self._visit_defined(obj)
            return  # a class's __wrapped__ would be a class attribute's, not its own
        elif callable(obj) and not isinstance(obj, types.BuiltinFunctionType):
            self.visit(type(obj), f"{label}:type")
            if label != "fit":  # the fit object's own state is hashed by code_identity
                self.value(f"{label}:state", obj)
        # What a decorator wraps (functools.wraps and update_wrapper set
        # __wrapped__; so do lru_cache and staticmethod), down its whole chain:
        # the wrapper's code above, the wrapped one's here
        wrapped = _wrapped(obj)
        if wrapped is not None:
            self.visit(wrapped, f"{label}.__wrapped__")

    def _label(self, label: str, fn: Any) -> str:
        """``label``, or, when another function of this walk holds it (two
        wrappers made by one decorator share a qualified name), ``label#2``
        and on: a walk is made in the same order each time, so these stay put."""
        number = 1
        unique = label
        while self._labelled.setdefault(unique, id(fn)) != id(fn):
            number += 1
            unique = f"{label}#{number}"
        return unique

    def value(self, label: str, value: Any) -> None:
        """Hash a value the code reads; one that cannot be hashed makes the
        identity unique, so that its models are never reused on a guess."""
        try:
            self.sources[label] = self._value_hash(value)
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
            version = package_version(module.__name__)
            if version:
                self.versions.add(version)

    def _visit_defined(self, obj: type) -> None:
        module = sys.modules.get(getattr(obj, "__module__", "") or "")
        if module is None:
            return
        if module.__name__ == "__main__":
            try:
                self.sources[f"class:__main__.{obj.__qualname__}"] = digest(inspect.getsource(obj))
            except (OSError, TypeError):  # (a notebook's class: its methods' code is below)
                self.value(f"class:__main__.{obj.__qualname__}", _class_outline(obj))
            for member in vars(obj).values():  # its methods read globals too
                for function in _member_functions(member):
                    self.visit(function)
        else:
            self._visit_module(module)  # a user class: its whole module file

    def _visit_function(self, fn: types.FunctionType) -> None:
        # Where its code was written: functools.wraps copies the wrapped
        # function's __module__ and __qualname__ onto a wrapper, its code and
        # globals stay its own
        module_name = fn.__globals__.get("__name__") or fn.__module__ or ""
        module = sys.modules.get(module_name)
        if (
            module is not None
            and module.__name__ != "__main__"
            and not _is_user_file(getattr(module, "__file__", None))
        ):
            self._visit_module(module)  # an installed function: its version suffices
            for position, cell in enumerate(fn.__closure__ or ()):  # a user's fit it wraps
                contents = _cell_contents(cell)
                if callable(contents):
                    self.visit(contents, f"function:{module_name}:closure{position}")
            return
        # A user function: its own source, then whatever it refers to, so that
        # editing a helper it calls changes the identity, and editing an
        # unrelated line of the same file does not.
        try:
            text = _function_source(fn)
            if _shares_its_lines(fn.__code__, text):
                text += "\n" + _code_text(fn.__code__)
        except (OSError, TypeError):
            text = _code_text(fn.__code__)
        # (Python 3.10's code has no qualified name: the function's, there)
        qualname = getattr(fn.__code__, "co_qualname", fn.__qualname__)
        label = self._label(f"function:{module_name}.{qualname}", fn)
        self.sources[label] = digest(text)
        self.value(f"{label}:defaults", (fn.__defaults__, fn.__kwdefaults__))
        for position, cell in enumerate(fn.__closure__ or ()):
            contents = _cell_contents(cell)
            if contents is _EMPTY_CELL:
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
        # since (helpers.ALPHA = 50); and the functions it calls there
        # (helpers.f()), with the globals they read, which a script may set too
        for chain in sorted(_attribute_chains(fn.__code__)):
            value = fn.__globals__.get(chain[0])
            for depth, attribute in enumerate(chain[1:], start=1):
                if not isinstance(value, types.ModuleType):
                    break
                owner, value = value, getattr(value, attribute, None)
                if not isinstance(value, types.ModuleType):
                    if _is_user_file(getattr(owner, "__file__", None)):
                        name = f"{label}:global:{'.'.join(chain[:depth + 1])}"
                        if callable(value):
                            self.visit(value, name)
                        else:
                            self.value(name, value)
                    break


#: A class's attributes that are Python's own, not the user's.
_OWN_ATTRIBUTES = frozenset({"__dict__", "__weakref__", "__module__", "__qualname__"})


def _class_outline(cls: type) -> tuple:
    """A class without source (a notebook's), as its hash takes it: its
    name, its bases, and its attributes, each function by its name (the walk
    hashes its code). Hashed whole, its pickle was cloudpickle's, which
    names a class by an id made anew for each class: each run, and each
    process, hashed it anew, and its models were never reused."""
    bases = [f"{base.__module__}.{base.__qualname__}" for base in cls.__bases__]
    members = [(name, "function" if _member_functions(member) else member)
               for name, member in sorted(vars(cls).items()) if name not in _OWN_ATTRIBUTES]
    return cls.__qualname__, bases, members


def _member_functions(member: Any) -> list[types.FunctionType]:
    """The functions of a class attribute: a method's, a static or class
    method's, and a property's getter, setter and deleter (a property that
    reads a global, ``K = 2`` edited to ``K = 3``, reused the old models)."""
    if isinstance(member, property):
        candidates = [member.fget, member.fset, member.fdel]
    else:
        candidates = [getattr(member, "__func__", member)]
    return [f for f in candidates if isinstance(f, types.FunctionType)]


#: What :func:`_cell_contents` gives for a closure cell not yet assigned.
_EMPTY_CELL = object()


def _cell_contents(cell: types.CellType) -> Any:
    try:
        return cell.cell_contents
    except ValueError:
        return _EMPTY_CELL


def _wrapped(obj: Any) -> Any:
    """The callable ``obj`` wraps, by its ``__wrapped__`` (functools.wraps,
    update_wrapper, lru_cache), or None. Read without running a
    ``__getattr__``: a proxy that answers every name must not lead the walk on."""
    if isinstance(obj, (type, staticmethod, classmethod)):
        return None  # a class's is a class attribute; these two are followed by __func__
    try:
        wrapped = inspect.getattr_static(obj, "__wrapped__")
    except AttributeError:
        return None
    if inspect.ismemberdescriptor(wrapped) or inspect.isgetsetdescriptor(wrapped):
        wrapped = getattr(obj, "__wrapped__", None)
    return wrapped if callable(wrapped) else None


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
        elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and chain:  # (3.11: a call)
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


def _function_source(fn: types.FunctionType) -> str:
    """The source of ``fn``'s own code. ``inspect.getsource(fn)`` would follow
    ``__wrapped__`` and read the wrapped function's instead; given the code
    object, it finds the module by scanning every loaded one for its file
    (50 ms in a process that imported pandas, once: a tenth of an unchanged
    re-run of a million). A bare function of the same code and globals
    names its module: the same lines, found at once, where they are read
    from the code's file (or lines Python keeps for it: a notebook's cell).
    Elsewhere the module's loader would give its own lines: found as before."""
    code = fn.__code__
    if not (code.co_filename in linecache.cache or os.path.isfile(code.co_filename)):
        return inspect.getsource(code)
    bare = types.FunctionType(code, fn.__globals__, None, None, fn.__closure__)
    return inspect.getsource(bare)


def _shares_its_lines(code: types.CodeType, text: str) -> bool:
    """Whether ``text``, the source of a lambda, is another lambda's too:
    the source of a lambda is its whole lines from the one it starts on, and
    two lambdas that start on one line (``{"x1": lambda df: f(df) * 1,
    "x10": lambda df: f(df) * 10}``) read alike, so that a run of the
    second reused the first's models. Its code then counts too (a lambda
    alone on its first line hashes as it did)."""
    if code.co_name != "<lambda>" or text.count("lambda") < 2:
        return False
    return _lambdas_on_first_line(text) > 1


def _lambdas_on_first_line(text: str) -> int:
    """How many ``lambda`` keywords start on ``text``'s first line (not
    words in its strings or comments); lines that do not tokenize whole are
    read as far as they do."""
    import io
    import tokenize

    count = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.start[0] > 1:
                break
            count += token.type == tokenize.NAME and token.string == "lambda"
    except (tokenize.TokenError, SyntaxError):
        pass
    return count


def _code_text(code: types.CodeType) -> str:
    """Code without its source, as text: its bytecode, the names it reads,
    its constants, and its arguments' and locals' names and counts (the
    bytecode reads a local by its position: ``def fit(df, a=1, b=2): return
    a - b`` and ``def fit(df, b=1, a=2): return b - a`` compile alike, and a
    grid's ``a=5`` gives each another result)."""
    parts = [code.co_code.hex(), repr(code.co_names), repr(code.co_varnames),
             repr(code.co_freevars), repr(code.co_cellvars),
             repr((code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
                   code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)))]
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            parts.append(_code_text(const))
        elif isinstance(const, frozenset):  # (`x in {"a", "b"}`): its repr's order is the
            parts.append(repr(sorted(map(repr, const))))  # hash seed's
        else:
            parts.append(repr(const))
    return "|".join(parts)


#: Callables the walk hashes whole; any other is an object whose state counts too.
_CODE_TYPES = (types.FunctionType, types.MethodType, type, functools.partial,
               staticmethod, classmethod)


def code_identity(fn: Any, setup: Any, value_hash: Callable[[Any], str]
                  ) -> tuple[str, dict[str, Any]]:
    """The hash of ``fn``'s code and what it depends on, and a description of
    its parts (for saying what changed); with ``setup=`` (what makes each
    worker's resources, which ``fn`` computes with), its code too. The values
    the code reads are hashed by ``value_hash``."""
    walker = _CodeWalker(value_hash)
    walker.visit(fn)
    for name, maker in (setup.items() if isinstance(setup, Mapping) else [("", setup)]):
        if maker is not None:
            walker.visit(maker, f"setup{':' if name else ''}{name}")
            if not isinstance(maker, _CODE_TYPES):
                walker.value(f"setup{':' if name else ''}{name}:state", maker)
    if not isinstance(fn, _CODE_TYPES):
        walker.value("callable_state", fn)  # a configured callable object
    if walker.unhashable:
        warnings.warn(
            "fit reads values that cannot be hashed, so a store never reuses its models: "
            + "; ".join(walker.unhashable[:3]), RuntimeWarning, stacklevel=3)
    versions = sorted(walker.versions | {f"python=={sys.version.split()[0]}"})
    detail = {"sources": dict(sorted(walker.sources.items())), "versions": versions}
    return digest(pickle.dumps(detail["sources"]), "\n".join(versions)), detail


def user_code(named: list[Any], value_hash: Callable[[Any], str]) -> str:
    """The hash of the user's own code among ``named`` (classes, functions
    and modules a pickle names; see :class:`_CodeWalker`), or "" when there is
    none: a pickle names a class or a function, it does not hold its code,
    so an edited method would otherwise leave an instance's hash as it was.
    Installed code is left to its version, as the pickle's names are."""
    walker = _CodeWalker(value_hash)
    visiting = _VISITING.__dict__.setdefault("ids", set())
    for obj in named:
        module = obj if isinstance(obj, types.ModuleType) else sys.modules.get(
            getattr(obj, "__module__", None) or "")
        if id(obj) not in visiting and module is not None and (
                module.__name__ == "__main__" or _is_user_file(getattr(module, "__file__", None))):
            visiting.add(id(obj))  # a class without source is hashed by value: not again
            try:
                walker.visit(obj, f"named:{getattr(obj, '__qualname__', '')}")
            finally:
                visiting.discard(id(obj))
    return digest(pickle.dumps(sorted(walker.sources.items()))) if walker.sources else ""


#: Per thread, the classes and functions whose code :func:`user_code` is walking.
_VISITING = threading.local()
