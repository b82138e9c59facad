"""The driver's unpickling of a part's outcomes, so that a value it cannot
unpickle fails its own task, not the run.

A worker pickles a part's outcomes as one object (a list of tuples, or
:class:`~.messages.OkOutcomes`), and the driver unpickles them with one
``pickle.loads``: the cheap way, and the only one taken while every value
loads. But a value can pickle in the worker and still not unpickle in the
driver: an exception class whose ``__init__`` takes other arguments than it
hands to ``Exception.__init__`` (unpickling calls it with ``args`` alone and
it raises ``TypeError``), a ``__reduce__`` whose loader raises there, a class
the driver cannot import. One ``pickle.loads`` then fails for the whole part,
and with it every task the part holds.

So when it fails, :func:`load_outcomes` loads the part again with
:class:`TolerantUnpickler`, which puts an :class:`Unloadable` (what could not
be rebuilt, and why) where an object failed to be rebuilt and goes on; the
tasks whose model or metrics hold one fail, with the reason, and the others
keep their results. That pure-Python unpickler is slow, and only a part that
failed pays for it.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

from .messages import OkOutcomes, Status


class Unloadable:
    """Stands where the driver could not rebuild an object (``what``, the
    class or loader that failed; ``error``, its exception's text). Loading
    goes on around it: called (a class that could not be found, used as its
    own loader), filled (a container it stands for) or given its state, it
    stays itself."""

    __slots__ = ("what", "error")

    def __init__(self, what: str, error: BaseException) -> None:
        self.what = what
        self.error = f"{type(error).__name__}: {error}"

    def __call__(self, *args: Any, **kwargs: Any) -> Unloadable:
        return self

    def __setstate__(self, state: Any) -> None:
        pass

    def append(self, item: Any) -> None:
        pass

    def extend(self, items: Any) -> None:
        pass

    def add(self, item: Any) -> None:
        pass

    def __setitem__(self, key: Any, value: Any) -> None:
        pass

    def __repr__(self) -> str:
        return f"<{self.what} that could not be unpickled: {self.error}>"


def _named(maker: Any) -> str:
    """``module.qualname`` of the class or function that rebuilds an object."""
    if isinstance(maker, Unloadable):
        return maker.what
    owner = maker if hasattr(maker, "__qualname__") else type(maker)
    return f"{getattr(owner, '__module__', '?')}.{owner.__qualname__}"


_Base: Any = pickle._Unpickler  # the pure-Python unpickler: its steps can be replaced


class TolerantUnpickler(_Base):
    """Python's own unpickler, with each step that builds an object (finding
    a class or loader, calling it, ``__new__``, setting the state) putting an
    :class:`Unloadable` on the stack where it raises. A failure whose
    arguments hold one already passes that one on: the root cause is what
    the task's error names."""

    dispatch = dict(_Base.dispatch)

    def find_class(self, module: str, name: str) -> Any:
        try:
            return super().find_class(module, name)
        except BaseException as exc:  # a loader's SystemExit too (not a Ctrl-C)
            _interrupt_passes(exc)
            return Unloadable(f"{module}.{name}", exc)

    def _load_reduce(self) -> None:
        stack = self.stack
        args = stack.pop()
        maker = stack[-1]
        try:
            stack[-1] = maker(*args)
        except BaseException as exc:  # a loader's SystemExit too (not a Ctrl-C)
            _interrupt_passes(exc)
            stack[-1] = _passed_on(args) or Unloadable(_named(maker), exc)

    def _load_newobj(self) -> None:
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, {}))

    def _load_newobj_ex(self) -> None:
        kwargs = self.stack.pop()
        args = self.stack.pop()
        cls = self.stack.pop()
        self.append(self._new(cls, args, kwargs))

    @staticmethod
    def _new(cls: Any, args: tuple, kwargs: dict) -> Any:
        if isinstance(cls, Unloadable):
            return cls
        try:
            return cls.__new__(cls, *args, **kwargs)
        except BaseException as exc:  # a loader's SystemExit too (not a Ctrl-C)
            _interrupt_passes(exc)
            return _passed_on(args) or Unloadable(_named(cls), exc)

    def _load_build(self) -> None:
        built = self.stack[-2]
        try:
            _Base.dispatch[pickle.BUILD[0]](self)
        except BaseException as exc:  # (the state was taken off: the object is on top)
            _interrupt_passes(exc)
            self.stack[-1] = Unloadable(_named(type(built)), exc)

    dispatch[pickle.REDUCE[0]] = _load_reduce
    dispatch[pickle.NEWOBJ[0]] = _load_newobj
    dispatch[pickle.NEWOBJ_EX[0]] = _load_newobj_ex
    dispatch[pickle.BUILD[0]] = _load_build


def _interrupt_passes(exc: BaseException) -> None:
    """Raise ``exc`` again where it is a ``KeyboardInterrupt``: in the driver
    that is most likely the user's Ctrl-C, which stops the run; any other
    exception a loader raises (``SystemExit`` from a ``__setstate__``, a
    module's ``sys.exit`` as it is imported) is that value's failure."""
    if isinstance(exc, KeyboardInterrupt):
        raise exc


def _passed_on(args: Any) -> Unloadable | None:
    for arg in args if isinstance(args, tuple) else ():
        if type(arg) is Unloadable:
            return arg
    return None


class _Finder(pickle.Pickler):
    """Finds the :class:`Unloadable` objects a value holds, at any depth, by
    pickling it (to nowhere) and noting each one pickle meets."""

    def __init__(self) -> None:
        super().__init__(_Nowhere(), protocol=pickle.HIGHEST_PROTOCOL)
        self.found: list[Unloadable] = []

    def persistent_id(self, obj: Any) -> Any:
        if type(obj) is Unloadable:
            self.found.append(obj)
            return len(self.found)
        return None


class _Nowhere:
    def write(self, data: Any) -> None:
        pass


def unloadable_in(value: Any) -> list[Unloadable]:
    """The :class:`Unloadable` objects ``value`` holds (none in a value that
    cannot be pickled again: it was rebuilt, then)."""
    if value is None or type(value) in (int, float, str, bytes, bool):
        return []
    finder = _Finder()
    try:
        finder.dump(value)
    except BaseException as exc:  # (what it found until then is still the answer)
        _interrupt_passes(exc)
    return finder.found


def unloadable_message(found: list[Unloadable]) -> str:
    causes = "; ".join(dict.fromkeys(f"rebuilding {u.what} raised {u.error}" for u in found))
    return ("the value returned by fit (its metrics or its model) was pickled in the worker "
            f"but cannot be unpickled in the driver: {causes}. Return values that unpickle "
            "anywhere (numbers, strings; an exception's text rather than the exception), "
            "give the class a __reduce__ that rebuilds it, or use backend='threads'")


def load_outcomes(body: Any, *, buffers: Any = None) -> Any:
    """A part's outcomes from their pickle; where a task's model or metrics
    cannot be unpickled, that task's outcome is ``failed`` with the reason
    (see the module's docstring) and the others are as they were."""
    try:
        return pickle.loads(body, buffers=buffers)
    except KeyboardInterrupt:  # Ctrl-C: the run stops, its results kept
        raise
    except BaseException:  # a __setstate__'s SystemExit too: its task fails, not the driver
        loader = TolerantUnpickler(io.BytesIO(body), buffers=buffers)
        outcomes = loader.load()
    if isinstance(outcomes, Unloadable) or not isinstance(outcomes, (list, OkOutcomes)):
        raise pickle.UnpicklingError(f"a part's outcomes cannot be unpickled: {outcomes!r}")
    checked: dict[int, list[Unloadable]] = {}  # a part's pack, named by each of its tasks
    repaired = []
    for outcome in outcomes:
        index, status, model, metrics, duration, started_at, error, retryable = outcome
        found = []
        for value in (model, metrics):
            if id(value) not in checked:
                checked[id(value)] = unloadable_in(value)
            found += checked[id(value)]
        if found:
            outcome = (index, Status.FAILED.value, None, {}, duration, started_at,
                       unloadable_message(found), False)
        repaired.append(outcome)
    return repaired

