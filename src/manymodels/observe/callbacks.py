"""Callbacks: code of the user's that the driver calls while a run goes on.

``mm.train(..., callbacks=[MyTracker()])`` calls, on the driver::

    on_run_start(info)        once, before the first batch is sent
    on_task_finished(task)    per finished task (only if the callback defines it)
    on_batch(progress)        after each round of results (every ~50 ms or less)
    on_run_end(run)           once, with the Run, also when the run stopped early,
                              or could not go on (its workers could not start: the
                              error is raised after)

The driver handles results by batches; building a per-task object costs a
microsecond or two, so it is done only when some callback overrides
``on_task_finished``. A callback that raises is warned about (its exception
and the line of the callback's code it came from) and left out of the rest
of the run: a broken tracker must never cost the models. A method named
``on_*`` that is none of these hooks (``on_start`` for ``on_run_start``) is
warned about when the run starts: it would never be called.
:class:`manymodels.MLflow` and the live dashboard are built on this hook.
"""

from __future__ import annotations

import difflib
import inspect
import time
import traceback
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..engine.execution import metrics_dict


@dataclass
class RunInfo:
    """What is known when a run starts."""

    tasks: int  #: tasks in the plan (reused ones included)
    reused: int  #: of which the store already held a model
    key_columns: list[str]
    backend: str
    workers: int
    fit: str  #: the fit function's dotted name
    source: str  #: the task source, as repr
    options: dict[str, Any] = field(default_factory=dict)  #: train's keywords, plain
    code: dict[str, Any] = field(default_factory=dict)  #: code identity: hashes, versions
    store: Any = None  #: the Store, if any
    run_id: int | None = None  #: the run's id in the store

    @classmethod
    def describe(cls, plan: Any, fit: Any, source: Any, engine: Any, options: Any,
                 store: Any, recorder: Any) -> RunInfo:
        """The info of a run about to start (what ``train`` has checked)."""
        from dataclasses import asdict

        from ..identity.hashing import code_identity

        if recorder is not None:
            code = recorder.code_detail
        else:
            with warnings.catch_warnings():  # said once already, or said by the store
                warnings.simplefilter("ignore")
                code_hash, code = code_identity(fit)
                code = {**code, "code_hash": code_hash}
        backend_options = {k: v for k, v in asdict(options.backend).items() if k != "gpu_sets"}
        plain = {**backend_options, "workers": engine.workers, "retries": options.retries,
                 "max_failures": options.max_failures, "reuse": options.reuse,
                 "retry_on": [e.__name__ for e in options.retry_on],
                 "shared": sorted(options.shared or {})}
        name = getattr(fit, "__qualname__", None) or type(fit).__qualname__
        module = getattr(fit, "__module__", None) or type(fit).__module__
        return cls(tasks=len(plan.tasks), reused=0, key_columns=list(plan.key_columns),
                   backend=options.backend_name, workers=engine.workers,
                   fit=f"{module}.{name}", source=repr(source), options=plain, code=code,
                   store=store, run_id=recorder.run_id if recorder is not None else None)


@dataclass
class FinishedTask:
    """One task that ended (ok or not), as ``on_task_finished`` receives it."""

    index: int
    key: Any
    status: str
    duration_s: float
    worker: int
    attempts: int
    metrics: dict[str, Any] | None
    error: str | None


@dataclass
class Progress:
    """Counts so far, as ``on_batch`` receives them."""

    done: int
    ok: int
    failed: int
    total: int
    elapsed_s: float


class Callback:
    """Base class: override the methods you need; each default does nothing."""

    def on_run_start(self, info: RunInfo) -> None:
        """Before the first batch is sent."""

    def on_task_finished(self, task: FinishedTask) -> None:
        """A task ended; ``task.status`` says how."""

    def on_batch(self, progress: Progress) -> None:
        """After each round of results from the workers."""

    def on_run_end(self, run: Any) -> None:
        """The run ended (``run`` is the :class:`manymodels.Run`)."""


#: The hooks the driver calls, in the order a run calls them.
HOOKS = ("on_run_start", "on_task_finished", "on_batch", "on_run_end")


def _warn_unknown_hooks(position: int, callback: Any) -> None:
    """Warn of each public ``on_*`` method of ``callback`` that is no hook: a
    misspelled hook (``on_start``, ``on_task``, ``on_end``) is accepted by
    Python and silently never called, so the user would see nothing happen.
    The warning points at the method's definition where it can be found."""
    cls = type(callback)
    for name in sorted(n for n in dir(callback) if n.startswith("on_") and n not in HOOKS):
        method = getattr(callback, name, None)
        if not callable(method):
            continue
        close = difflib.get_close_matches(name, HOOKS, n=1, cutoff=0.5)
        message = (f"callbacks[{position}] ({cls.__name__}) has a method {name}, which no "
                   f"run calls{f' (did you mean {close[0]}?)' if close else ''}: the hooks "
                   f"are {', '.join(HOOKS)}")
        code = getattr(inspect.unwrap(method), "__code__", None)
        if code is None:  # a builtin or a callable object: no line to point at
            warnings.warn(message, UserWarning, stacklevel=5)  # at the user's mm.train(...)
        else:
            warnings.warn_explicit(message, UserWarning, code.co_filename, code.co_firstlineno)


def _raised_at(callback: Any, exc: BaseException) -> tuple[str, int, str] | None:
    """Where in the callback's code ``exc`` was raised: the deepest frame of
    its traceback in the file that defines the callback's class (a tracker's
    own code, not the HTTP library below it), else the deepest frame
    outside this module; ``(file, line, function)``."""
    frames = traceback.extract_tb(exc.__traceback__)
    try:
        own_file = inspect.getsourcefile(type(callback))
    except TypeError:  # a class defined in C, or at the prompt
        own_file = None
    chosen = [f for f in frames if own_file is not None and f.filename == own_file] or [
        f for f in frames if f.filename != __file__]
    if not chosen:
        return None
    frame = chosen[-1]
    return frame.filename, frame.lineno or 0, frame.name


def _overrides(callback: Any, name: str) -> bool:
    method = getattr(type(callback), name, None)
    return method is not None and method is not getattr(Callback, name, None)


class Callbacks:
    """The driver's side: calls each callback, and drops one that raised."""

    def __init__(self, callbacks: Sequence[Any], plan: Any, info: RunInfo) -> None:
        self._all = list(callbacks)
        self._plan = plan
        self.info = info
        self._start = time.perf_counter()

    @classmethod
    def validate(cls, callbacks: Any) -> list[Any]:
        """Check ``train``'s ``callbacks=`` before work starts."""
        if callbacks is None:
            return []
        if not isinstance(callbacks, Iterable) or isinstance(callbacks, (str, bytes)):
            callbacks = [callbacks]
        callbacks = list(callbacks)
        names = HOOKS
        for position, callback in enumerate(callbacks):
            if isinstance(callback, type):
                raise TypeError(f"callbacks[{position}] is the class {callback.__name__}: give "
                                f"an instance of it, {callback.__name__}()")
            if not any(callable(getattr(callback, n, None)) for n in names):
                raise TypeError(
                    f"callbacks[{position}] ({type(callback).__name__}) has none of the "
                    f"methods {', '.join(names)}; subclass mm.Callback")
            _warn_unknown_hooks(position, callback)
        return callbacks

    @property
    def wants_tasks(self) -> bool:
        return any(_overrides(c, "on_task_finished") or (
            not isinstance(c, Callback) and hasattr(c, "on_task_finished")) for c in self._all)

    def _call(self, name: str, *args: Any) -> None:
        """Call hook ``name`` of each callback. A ``SystemExit`` (``sys.exit``
        in a hook) ends the run, as the callback asked, once the other
        callbacks have heard the hook out: one after it never heard the
        run's end (a tracker's run left RUNNING). A KeyboardInterrupt is
        Ctrl-C's: raised at once."""
        exiting: BaseException | None = None
        for callback in list(self._all):
            method = getattr(callback, name, None)
            if method is None:
                continue
            try:
                method(*args)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # never the run's problem
                self._all.remove(callback)
                raised = traceback.format_exception_only(type(exc), exc)[-1].strip()
                where = _raised_at(callback, exc)
                message = (f"callback {type(callback).__name__}.{name} raised {raised}"
                           + (f" (at {where[0]}:{where[1]}, in {where[2]})" if where else "")
                           + "; it is not called again in this run")
                if where is None:
                    warnings.warn(message, RuntimeWarning, stacklevel=2)
                else:  # shown at the line that raised, not at this module
                    warnings.warn_explicit(message, RuntimeWarning, where[0], where[1])
            except BaseException as exc:  # SystemExit: raised once the others are called
                self._all.remove(callback)
                exiting = exiting or exc
        if exiting is not None:
            raise exiting

    def run_start(self, reused: int) -> None:
        self._start = time.perf_counter()
        self.info.reused = reused
        self._call("on_run_start", self.info)

    def batch(self, done: int, ok: int, failed: int) -> None:
        self._call("on_batch", Progress(done, ok, failed, len(self._plan.tasks),
                                        time.perf_counter() - self._start))

    def tasks_finished(self, indices: Iterable[int], records: Any) -> None:
        """The tasks among ``indices`` that have ended (a retried one has not)."""
        if not self.wants_tasks:
            return
        tasks = self._plan.tasks
        for index in indices:
            status = records.status_of(index)
            if status is None:
                continue
            metrics = metrics_dict(records.metrics[index], index)
            self._call("on_task_finished", FinishedTask(
                index, tasks[index].key, status, float(records.duration_s[index]),
                int(records.worker[index]), int(records.attempts[index]), metrics,
                records.error_of(index)))

    def run_end(self, run: Any) -> None:
        self._call("on_run_end", run)
