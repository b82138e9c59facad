"""Running tasks inside a worker: the one piece of code every backend shares.

A worker (the driver itself, a thread, a process or a Ray task) builds an
:class:`Executor` from the run's :class:`RunContext` once, then runs batches
with it. The executor turns a task reference into ``fit``'s arguments, calls
``fit``, normalises what it returns, and turns any exception into a failed
outcome that carries the traceback: one bad task never costs the batch.

An outcome (:class:`manymodels.engine.messages.Outcome`) travels as a plain tuple
with its status as plain text: a third of the cost of pickling the named type.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..inputs.tables import plain_scalar
from ..planning.taskdata import TaskData
from .dataplane import SPILL_MIN_BYTES, pickle_any, small_array_parts
from .gpus import gpu_failure, release_cached_memory
from .messages import Outcome, Pickled, PickledWithBuffers, Status
from .metricpacks import MetricsPack, MetricTexts
from .metrictext import metrics_json
from .partpacks import PACKED_BELOW, PartPacker

#: How often a worker sends the outcomes of a long batch so far: the driver
#: shows progress and records results without waiting for the batch to end.
FLUSH_EVERY_S = 0.25

#: ``(index, data reference, params)``: what a worker receives per task.
TaskRef = tuple[int, Any, "dict[str, Any] | None"]
_OK, _FAILED, _MEMORY = Status.OK.value, Status.FAILED.value, Status.MEMORY.value


@dataclass
class RunContext:
    """What every worker of a run needs, sent to each worker once."""

    fit: Callable[..., Any]
    data: TaskData  # what task references mean, and how a worker reads them
    table: Any = None  # data.table as shipped: the object, or its shared-memory file's path
    shared: Any = None  # the shared= dict, or the path of its shared-memory file
    cpus_per_task: int = 1
    retry_on: tuple[type[BaseException], ...] = ()
    setup: Any = None  # a callable, or a dict of name -> callable, run once per worker
    driver_pid: int = field(default_factory=os.getpid)
    #: Where models are pickled: None (they stay objects: threads, serial),
    #: "small" (in the worker, unless they hold large buffers, which take the
    #: data plane's zero-copy way back) or "all" (in the worker, with their
    #: SHA-256: a store keeps the bytes as they come).
    pickle_models: str | None = None
    #: What a GPU worker does once before its first task (:class:`manymodels.engine.gpus.GpuSetup`).
    gpu_setup: Any = None
    #: Where tasks keep their checkpoints, when ``fit`` takes a ``checkpoint``
    #: (:class:`manymodels.engine.checkpointspace.CheckpointSpace`).
    checkpoints: Any = None
    #: Where a worker writes its large models itself, for a store
    #: (:class:`manymodels.engine.modelfiles.ModelFiles`).
    model_files: Any = None


@dataclass
class BatchPart:
    """Outcomes of part of a batch, as :meth:`Executor.run_in_parts` yields them."""

    outcomes: list[Outcome]
    busy_s: float  # running these tasks
    prepare_s: float  # preparing the batch (reading its rows): in its first part only
    last: bool  # the batch's final part
    running: int | None = None  # with part_before_each: the task about to start


def split_result(value: Any) -> tuple[Any, dict[str, Any]]:
    """``fit`` returns a model, ``(model, metrics)`` or a metrics dict alone."""
    kind = type(value)
    if kind is tuple and len(value) == 2 and type(value[1]) is dict:  # the usual: quick
        return value[0], _plain_metrics(value[1])
    if kind is dict or isinstance(value, Mapping):
        return None, _plain_metrics(value)
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], Mapping):
        return value[0], _plain_metrics(value[1])
    return value, {}


_PLAIN = (float, int, str, bool, type(None))


def _plain_metrics(metrics: Mapping) -> dict[str, Any]:
    for name, value in metrics.items():
        if type(name) is not str or type(value) not in _PLAIN:
            plain = {str(name): plain_scalar(value) for name, value in metrics.items()}
            if len(plain) < len(metrics):  # 1 and "1": one column, one value lost
                seen: dict[str, Any] = {}
                for name in metrics:
                    if str(name) in seen:
                        raise ValueError(f"fit's metrics name {seen[str(name)]!r} and "
                                         f"{name!r}, which are one column, {str(name)!r}")
                    seen[str(name)] = name
            return plain
    return dict(metrics)  # already plain: a million tasks skip the conversion


def _arrays_read_only(shared: dict) -> dict:
    """``shared`` with each NumPy array as a read-only view of itself: one
    task's write would reach the tasks after it on the same worker (and the
    caller's own array, on the serial and threads backends)."""
    return {name: _read_only(value) for name, value in shared.items()}


def _read_only(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def metrics_dict(metrics: Mapping | str | MetricsPack | MetricTexts | None, index: int) -> Any:
    """Task ``index``'s metrics as a dict, from what its slot of the results
    holds: a dict, the store's JSON text (a reused task's, or a worker's for
    a store), its part's :class:`~manymodels.engine.metricpacks.MetricsPack`, or the
    :class:`~manymodels.engine.metricpacks.MetricTexts` of the run it was reused from."""
    if type(metrics) is MetricsPack or type(metrics) is MetricTexts:
        return metrics.get(index)
    return json.loads(metrics) if isinstance(metrics, str) else metrics


def run_setup(setup: Any) -> dict[str, Any]:
    """Build a worker's own resources: ``setup()`` is passed to ``fit`` as
    ``resource=``; a dict of name -> callable, each under its name."""
    if isinstance(setup, Mapping):
        return {name: make() for name, make in setup.items()}
    return {"resource": setup()}


class Executor:
    """Runs batches of tasks for one worker of one run."""

    def __init__(self, context: RunContext, table: Any = None, shared: dict | None = None):
        # a fit with state of its own per worker (map_groups' output writer) gives each its copy
        worker_copy = getattr(context.fit, "worker_copy", None)
        self.fit = worker_copy() if worker_copy is not None else context.fit
        self.passes_data = context.data.passes_data
        self.retry_on = tuple(context.retry_on)
        self.shared = _arrays_read_only(shared if shared is not None else (context.shared or {}))
        if context.setup is not None:
            self.shared = {**self.shared, **run_setup(context.setup)}
        self.driver_pid = context.driver_pid
        self.pickle_models = context.pickle_models
        self.data = context.data.open(table if table is not None else context.table)
        self.checkpoints = context.checkpoints
        self.model_files = context.model_files
        #: Why this worker's CUDA context is unusable, once a task broke it.
        self.broken: str | None = None
        #: Set by a worker that retires once its CUDA context is broken (the
        #: processes backend's): a batch then ends at the task that broke it.
        self.retires_when_broken = False
        #: The part being run's small pickled models and float metrics (see
        #: :mod:`manymodels.engine.partpacks`): in workers that pickle models only.
        self._packer = PartPacker(hashed=self.pickle_models == "all")
        #: A fit that holds what its tasks made until their part leaves the
        #: worker (map_groups' outputs on an engine) writes it then.
        self._seal_fit_part = getattr(self.fit, "seal_part", None)

    def begin_batch(self, tasks: list[TaskRef]) -> None:
        """Let the data reader prepare the batch (read or convert its rows at once)."""
        refs = getattr(tasks, "refs", None)  # a SliceBatch: its references as columns
        self.data.begin_batch(refs() if refs is not None else [task[1] for task in tasks])

    def run_one(self, task: TaskRef) -> Outcome:
        index, data, params = task
        started_at = time.time()
        start = time.perf_counter()
        try:
            kwargs = {**params, **self.shared} if params else self.shared
            if self.checkpoints is not None:
                kwargs = {**kwargs, "checkpoint": self.checkpoints.open(index)}
            if self.passes_data:
                value = self.fit(self.data.rows(data), **kwargs)
            else:
                value = self.fit(**kwargs)
            model, metrics = split_result(value)
        except BaseException as exc:  # a fit's own BaseException subclass too: its task alone
            if isinstance(exc, KeyboardInterrupt) and self._in_drivers_main_thread():
                if self.checkpoints is not None:  # (else its run stayed held)
                    self.checkpoints.finished(index, ok=False)
                raise  # a real Ctrl-C or SIGTERM (serial backend): it stops the run
            failed = self._failed(index, exc, start, started_at)
        else:
            failed = None
        if self.checkpoints is not None:
            self.checkpoints.finished(index, ok=failed is None)
        if failed is not None:
            if failed[1] == _MEMORY:  # the traceback's frames are gone: free their memory
                release_cached_memory()
            return failed
        if self.pickle_models is not None:
            if model is not None:
                try:
                    model = self._pickled(model, index)
                except BaseException as exc:  # a __reduce__'s SystemExit too: its task alone
                    if isinstance(exc, KeyboardInterrupt) and self._in_drivers_main_thread():
                        raise
                    return (index, _FAILED, None, {}, time.perf_counter() - start, started_at,
                            "the value returned by fit cannot be pickled to "
                            + ("keep it in the store" if self.pickle_models == "all" else
                               "send it back to the driver") + f": {exc!r}", False)
            if metrics:
                packed = self._packer.metrics(index, metrics)  # (an open pack's len is 0)
                metrics = self._encoded(metrics) if packed is None else packed
        return (index, _OK, model, metrics, time.perf_counter() - start, started_at, None, False)

    def _failed(self, index: int, exc: BaseException, start: float,
                started_at: float) -> Outcome:
        """A task that raised: ``failed``, or ``memory`` when it ran out of GPU
        memory; an error that broke the CUDA context marks the worker
        :attr:`broken` (see :mod:`manymodels.engine.gpus`)."""
        error, status = traceback.format_exc(), _FAILED
        gpu = gpu_failure(exc)
        if gpu is not None:
            error = f"{gpu.describe(replaced=self.retires_when_broken)}\n\n{error}"
            if gpu.kind == "memory":
                status = _MEMORY
            else:
                self.broken = gpu.describe(replaced=self.retires_when_broken)
        # out of GPU memory is worth another try, as a worker past memory_limit is
        return (index, status, None, {}, time.perf_counter() - start, started_at, error,
                status == _MEMORY or isinstance(exc, self.retry_on))

    def _encoded(self, metrics: dict) -> dict | str:
        """Metrics that are not in the part's pack: for a store, as its JSON
        text when they read back the same (not an array, say)."""
        if self.pickle_models == "all" and all(type(v) in _PLAIN for v in metrics.values()):
            return metrics_json(metrics)
        return metrics

    def _pickled(self, model: Any, index: int) -> Any:
        """The model's pickled bytes (see ``RunContext.pickle_models``): a
        small one joins the part's :class:`~.partpacks.ModelPack` (sealed as the part is
        sent: :meth:`_parted`), a large one goes as :class:`Pickled` (for a
        store, with its SHA-256, or written into the store where this worker
        sees it: :mod:`.modelfiles`) or, holding large buffers, as
        :class:`PickledWithBuffers` (its buffers the data plane's zero-copy
        way)."""
        parts = small_array_parts(model)
        if parts is not None:  # small: its pack keeps its kind's head and tail once
            return self._packer.model(index, parts[1], (parts[0], parts[2]))
        if self.pickle_models == "all":
            data = pickle_any(model)
            if len(data) < PACKED_BELOW:
                return self._packer.model(index, data)
            digest = hashlib.sha256(data).hexdigest()
            if self.model_files is not None and self.model_files.visible():
                try:
                    return self.model_files.write(data, digest)  # its bytes stay here
                except OSError:  # (a full or read-only disk here) the driver writes them
                    pass
            return Pickled(data, digest)
        large: list[pickle.PickleBuffer] = []

        def in_band(buffer: pickle.PickleBuffer) -> bool:
            if buffer.raw().nbytes >= SPILL_MIN_BYTES:
                large.append(buffer)
                return False  # out of band: not copied (the data plane sends it)
            return True

        try:
            data = pickle.dumps(model, protocol=5, buffer_callback=in_band)
        except Exception:
            import cloudpickle

            data = cloudpickle.dumps(model, protocol=5, buffer_callback=in_band)
        if large:
            return PickledWithBuffers(data, large)
        return self._packer.model(index, data) if len(data) < PACKED_BELOW else Pickled(data)

    def _parted(self, outcomes: list[Outcome], busy_s: float, prepare_s: float, last: bool,
                running: int | None = None) -> BatchPart:
        """A part of the batch, with what was packed since the last one sealed
        (the outcomes name the packs: they are complete before they travel)."""
        if self._seal_fit_part is not None:
            try:
                self._seal_fit_part()
            except Exception as exc:  # e.g. a full disk: the part's tasks failed, not the worker
                outcomes = self._failed_part(outcomes, exc)
        self._packer.seal()
        return BatchPart(outcomes, busy_s, prepare_s, last, running)

    def _failed_part(self, outcomes: list[Outcome], exc: Exception) -> list[Outcome]:
        """The part's outcomes where the fit could not write what its tasks
        made: each task that succeeded failed (what was packed for them dropped)."""
        self._packer.reset()
        error = ("the outputs of this part of the batch could not be written: "
                 + "".join(traceback.format_exception(exc)))
        return [(o[0], _FAILED, None, {}, o[4], o[5], error, False) if o[1] == _OK else o
                for o in outcomes]

    def _in_drivers_main_thread(self) -> bool:
        """Ctrl-C reaches only the driver's main thread: a KeyboardInterrupt
        anywhere else (a worker thread, a worker process) was raised by the
        task itself, and fails that task alone."""
        return (os.getpid() == self.driver_pid
                and threading.current_thread() is threading.main_thread())

    def run_in_parts(
        self,
        tasks: list[TaskRef],
        *,
        on_start: Callable[[int], None] | None = None,
        flush_every_s: float | None = None,
        part_before_each: bool = False,
    ) -> Iterator[BatchPart]:
        """Run a batch's ``tasks`` in order, yielding their outcomes in parts.

        Every backend runs a batch through this one loop, so that they time
        the batch's preparation and its tasks alike. A part comes every
        ``flush_every_s`` seconds of running (the driver sees progress and
        frees memory within a long batch), or with ``part_before_each`` just
        before each task, naming it (the Ray backend's marked mode); the last
        part ends the batch. ``on_start(index)`` is called as each task starts
        (and with -1 before a part whose fit writes what its tasks made:
        :meth:`~manymodels.run.outputfiles.WriteOutputs.seal_part`).
        In a worker that :attr:`retires_when_broken`, a task that breaks its
        CUDA context (:attr:`broken`) ends the batch early: the part with its
        outcome is the last yielded, not marked ``last``, and the tasks after
        it are left to the caller (the worker retires; the driver hands them
        back).
        """
        if self._seal_fit_part is not None and on_start is not None:
            def parted(*args: Any, **kwargs: Any) -> BatchPart:
                on_start(-1)  # the part's write is no task's time (nor its timeout's)
                return self._parted(*args, **kwargs)
        else:
            parted = self._parted
        start = time.perf_counter()
        # a batch left unfinished before (its worker retired) sent nothing packed since
        self._packer.reset()
        self.begin_batch(tasks)
        begin = last_flush = time.perf_counter()
        prepare = begin - start
        outcomes: list[Outcome] = []
        for position, task in enumerate(tasks):
            if part_before_each:
                now = time.perf_counter()
                yield parted(outcomes, now - begin, prepare, False, running=task[0])
                outcomes, begin, prepare = [], now, 0.0
            if on_start is not None:
                on_start(task[0])
            outcomes.append(self.run_one(task))
            if self.retires_when_broken and self.broken is not None:
                yield parted(outcomes, time.perf_counter() - begin, prepare, False)
                return
            if flush_every_s is not None and position + 1 < len(tasks):
                now = time.perf_counter()
                if now - last_flush > flush_every_s:
                    yield parted(outcomes, now - begin, prepare, False)
                    outcomes, begin, last_flush, prepare = [], now, now, 0.0
        yield parted(outcomes, time.perf_counter() - begin, prepare, True)

    def run_batch(self, tasks: list[TaskRef]) -> BatchPart:
        """Run ``tasks`` in order; all their outcomes in one part."""
        *_, whole = self.run_in_parts(tasks)
        return whole
