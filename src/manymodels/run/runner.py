"""What :func:`manymodels.train` wires, for it and for the layers that run
jobs of their own on the engine (prediction, transforms): validate the
options, plan the tasks, hash their identities and open the store's run,
start the backend, hand the plan to the scheduler, and select the winners.

    options ──► plan ──► identities ──► RunRecorder.begin (reuse) ──► backend
                                                                        │
    Run ◄── selection ◄── Scheduler.run (batches, retries, budget) ◄────┘
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..engine.backends import Backend, backend_class
from ..engine.execution import RunContext
from ..engine.modelfiles import ModelFiles
from ..engine.options import RunOptions
from ..engine.scheduling import Scheduler
from ..evaluation.halving import Halving, HalvingSearch, stable_order
from ..evaluation.selection import FirstReport, Selection, refuse_a_key_named_like
from ..evaluation.splitters import EVALUATION_ATTACHMENT
from ..evaluation.windowed import prepare as prepare_evaluation
from ..identity.hashing import plain_setting, task_identities
from ..inputs.grids import GridSource, require_distinct_texts, require_picklable_values
from ..inputs.sources import Source
from ..machine import collector_paused
from ..observe.callbacks import Callbacks, RunInfo
from ..observe.progress import ProgressBar, progress_interval
from ..planning.plan import add_fit_keys
from ..planning.plan import plan as make_plan
from ..store import RunRecorder, Store, StoreError
from ..store.opening import store_to_make
from . import checkpointing
from .results import Run, check_key_names


def _callable_name(fit: Any) -> str:
    name = getattr(fit, "__qualname__", None) or type(fit).__qualname__
    return f"{getattr(fit, '__module__', None) or type(fit).__module__}.{name}"


def train(
    fit: Callable[..., Any],
    source: Source,
    *,
    shared: Mapping[str, Any] | None = None,
    backend: str | Backend = "processes",
    workers: int | None = None,
    cpus_per_task: int = 1,
    gpus_per_task: float = 0,
    gpus: int | list[int | str] | None = None,
    gpu_memory_limit: float | None = None,
    retries: int = 0,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | None = None,
    timeout: float | None = None,
    memory_limit: int | str | None = None,
    max_failures: int | float | None = None,
    progress: bool = True,
    store: str | Path | Store | None = None,
    reuse: bool = True,
    verify: bool = False,
    setup: Callable[[], Any] | Mapping[str, Callable[[], Any]] | None = None,
    start_method: str = "auto",
    callbacks: Any = None,
    track: Any = None,
    dashboard: bool = False,
    evaluate: Any = None,
    select: Any = None,
    keep_checkpoints: bool = False,
    store_type: type[Store] = Store,
) -> Run:
    """Train: see :func:`manymodels.train`, whose arguments these are;
    ``store_type`` is the class a store given as a path opens as (the public
    ``mm.Store`` for ``train``, which this layer does not import)."""
    began = (time.time(), time.perf_counter())
    _check_arguments(fit, source, store, dashboard, verify, keep_checkpoints)
    instance = backend if isinstance(backend, Backend) else None
    backend_type = type(instance) if instance is not None else backend_class(backend)
    name = instance.name if instance is not None else backend
    options = RunOptions.validate(
        fit=fit, source=source, backend_type=backend_type, backend_name=name,
        instance=instance, shared=shared, workers=workers, cpus_per_task=cpus_per_task,
        gpus_per_task=gpus_per_task, gpus=gpus, retries=retries, retry_on=retry_on,
        timeout=timeout, memory_limit=memory_limit, max_failures=max_failures,
        progress=progress, reuse=reuse, setup=setup, start_method=start_method,
        gpu_memory_limit=gpu_memory_limit)
    if options.progress:
        progress_interval()  # MANYMODELS_PROGRESS_INTERVAL, refused by name when wrong
    hooks = Callbacks.validate(callbacks) + Callbacks.validate(track)
    if store is not None or backend_type.requires_pickling:
        require_picklable_values(source, "a store (each setting's identity is its pickle's "
                                 "hash)" if store is not None else f"the {name} backend")
    source, run_fit, identity_extra, selection = _evaluation(
        fit, source, evaluate, select, options.retry_on if options.retries else ())
    checkpointed = checkpointing.wanted(fit, run_fit, {
        *(options.shared or {}), *source.key_columns,
        *(options.setup if isinstance(options.setup, Mapping) else ())}, keep_checkpoints,
        takes_data=not isinstance(source, GridSource))
    # a store not made yet (a path without an index) is made once the plan
    # and the task identities are (a refusal there, of a column that cannot
    # be hashed say, left an empty store behind); an existing one is checked
    # at once
    if store is not None:
        require_distinct_texts(source)
    new_store = store_to_make(store)
    if not new_store:
        store = _open_store(store, store_type)
    # a store on an object store is published once, at the end: the run,
    # its selection and its evaluation's record (or what the run kept, where it fails)
    with store._one_publication() if isinstance(store, Store) else contextlib.nullcontext():
        live = None
        if dashboard:
            from ..observe.dashboard import LiveDashboard

            hooks.append(live := LiveDashboard())

        # fits run in other processes: the driver's own million tuples and dicts
        # (acyclic) need no cycle collector, whose full passes over them cost
        # seconds; with threads or serial, fit runs here and it stays on
        with collector_paused(backend_type.requires_pickling):
            plan = make_plan(source)
            plan.in_key_order = getattr(run_fit, "seal_part", None) is not None
            named_setup = options.setup if isinstance(options.setup, Mapping) else ()
            add_fit_keys(plan, fit, {*(options.shared or {}), *named_setup})
            context = RunContext(fit=run_fit, data=plan.data, table=plan.data.table,
                                 shared=options.shared,
                                 cpus_per_task=options.backend.cpus_per_task,
                                 retry_on=options.retry_on, setup=options.setup,
                                 # with a store, as fit returned it (serial and threads
                                 # too: a model fit goes on changing is stored as it was)
                                 pickle_models=("all" if store is not None else "small"
                                                if backend_type.requires_pickling else None))
            recorder, to_do = None, len(plan.tasks)
            if store is not None:
                identities = _identities(plan, fit, options, identity_extra)
                if new_store:  # (only now that the identities could be made)
                    store = _open_store(store, store_type)
                if checkpointed:  # before the run's row: a refusal leaves no run behind
                    checkpointing.check_folder(store)
                recorder = RunRecorder(
                    store, plan, *identities, fit_name=_callable_name(fit), source=repr(source),
                    backend=name,
                    workers=options.sized_for(backend_type, len(plan.tasks)).workers)
            try:
                if recorder is not None:  # (its start committed, a Ctrl-C is recorded below)
                    to_do -= recorder.begin(reuse=options.reuse, verify=verify)
                run = _schedule(plan, context, recorder, store, hooks, live, began, fit=fit,
                                source=source, instance=instance, backend_type=backend_type,
                                options=options, to_do=to_do, checkpointed=checkpointed,
                                keep_checkpoints=keep_checkpoints,
                                watch_ok=None if selection is None else FirstReport(selection))
            except BaseException as exc:  # before the scheduler took the run over (a
                if recorder is not None:  # Ctrl-C, say): it does not stay "running"
                    recorder.abandon(status="interrupted" if isinstance(
                        exc, KeyboardInterrupt) else "failed")
                raise
        if selection is not None:
            if selection.metric in run.results.columns:
                run.select(selection, source)
            elif (run.results["status"] == "ok").any():  # a metric function's name is known
                # only now (the first task that trained warned already): keep the work, say so
                import warnings

                run._selection = (selection, None)  # asked for, and nothing to choose by
                warnings.warn(f"select={selection.metric!r}: no task reported that metric, so "
                              "no winner was chosen (the run is returned, and kept in its store, "
                              f"unselected); the results' columns are {list(run.results.columns)}",
                              stacklevel=3)
        if recorder is not None and evaluate is not None:
            # Store.forecast's time column, where the groups had no order_by, and
            # whether the kept models saw all of each group's rows (a holdout's or
            # k folds' last window's model did not either)
            store.attach(run.run_id, EVALUATION_ATTACHMENT,
                         {"time": evaluate.time, "final_model": evaluate.final_model})
        return run


def _check_arguments(fit: Any, source: Any, store: Any, dashboard: bool, verify: Any,
                     keep_checkpoints: Any = False) -> None:
    """Refuse, before anything is read, what no later check would name."""
    if not callable(fit):
        raise TypeError(f"fit must be callable, got {type(fit).__name__}")
    if not isinstance(source, Source):
        raise TypeError(
            "source must be made by mm.groups(), mm.items(), mm.grid() or their product, "
            f"got {type(source).__name__}"
        )
    check_key_names(source.key_columns, source.param_columns, stored=store is not None)
    if not isinstance(dashboard, bool):
        raise TypeError(f"dashboard must be True or False, got {dashboard!r}")
    if dashboard and store is None:
        raise ValueError("dashboard=True needs store=: the dashboard reads the store")
    if not isinstance(verify, bool):
        raise TypeError(f"verify must be True or False, got {verify!r}")
    if verify and store is None:
        raise ValueError("verify=True needs store=: it checks the models reused from the store")
    if keep_checkpoints is True and store is None:
        raise ValueError("keep_checkpoints=True needs store=: without a store a run's "
                         "checkpoints are in a temporary folder that goes with the run")


def _evaluation(fit: Any, source: Source, evaluate: Any, select: Any,
                retry_on: tuple[type[BaseException], ...] = ()
                ) -> tuple[Source, Any, dict[str, Any], Selection | None]:
    """What ``evaluate=`` and ``select=`` make of the job: the source (one task
    per group under halving), the function the workers call, what the tasks'
    identities add (the splitter, the halving search), and the selection;
    ``retry_on``: the errors the run retries, which a halving raises again."""
    run_fit, splitter = prepare_evaluation(fit, source, evaluate)
    identity_extra: dict[str, Any] = {} if splitter is None else {"__evaluate__": splitter}
    if isinstance(select, Halving):  # one task per group, its candidates inside
        source, run_fit = HalvingSearch.prepare(fit, source, splitter, select, retry_on)
        # (its settings in an order of their own: a grid reordered is the same search)
        identity_extra["__halving__"] = (select, stable_order(
            [plain_setting(setting) for setting in run_fit.settings], run_fit.settings))
        return source, run_fit, identity_extra, select.selection
    selection = None if select is None else Selection.parse(select, splitter)
    if selection is not None:
        refuse_a_key_named_like(selection, source.key_columns)
    return source, run_fit, identity_extra, selection


def _identities(plan: Any, fit: Any, options: RunOptions,
                identity_extra: dict[str, Any]) -> Any:
    """Each task's identity: the splitter is part of it (its metrics depend on
    it); the driver keeps no per-task identity beyond the recorder's columns."""
    return task_identities(
        plan, fit, {**(options.shared or {}), **identity_extra} if identity_extra
        else options.shared, options.setup)


def _schedule(plan: Any, context: RunContext, recorder: RunRecorder | None, store: Any,
              hooks: list[Any], live: Any, began: tuple[float, float], *, fit: Any,
              source: Any, instance: Backend | None, backend_type: type[Backend],
              options: RunOptions, to_do: int, checkpointed: bool, keep_checkpoints: bool,
              watch_ok: Any = None) -> Any:
    """Run the plan: the backend sized for the tasks left to do, the
    checkpoint space held, the scheduler made and run; the space, the
    model files and the dashboard are closed however it ends. An error (or
    a Ctrl-C) before the scheduler takes the run over is the caller's to
    record."""
    try:
        engine = instance if instance is not None else backend_type()
        engine.configure(options.sized_for(backend_type, to_do))
        if checkpointed:  # held from here: released in the finally below
            context.checkpoints = checkpointing.open_space(
                plan, store, recorder, options.reuse, keep_checkpoints, to_do)
        scheduler = Scheduler(plan, engine, make_run=Run if not checkpointed else
                              checkpointing.run_maker(Run, context.checkpoints, store),
                              retries=options.retries,
                              max_failures=options.max_failures,
                              progress=functools.partial(ProgressBar, len(plan.tasks),
                                                         options.progress),
                              recorder=recorder, watch_ok=watch_ok, callbacks=Callbacks(
                                  hooks, plan, RunInfo.describe(
                                      plan, fit, source, engine, options, store, recorder))
                              if hooks else None)
        if store is not None:  # workers that see the store write their large models there
            with contextlib.suppress(OSError):  # (else they send them, as they would)
                context.model_files = ModelFiles.open(store.root, recorder.run_id)
        with store._publishing() if store is not None else contextlib.nullcontext():
            return scheduler.run(context, began)
    finally:
        checkpointing.close(context.checkpoints, store)
        if context.model_files is not None:
            context.model_files.close()
        if live is not None:
            live.close()


def _open_store(store: Any, store_type: type[Store]) -> Store | None:
    if store is None:
        return None
    given = isinstance(store, Store)
    if not given:
        if not isinstance(store, (str, Path)):
            raise TypeError(f"store must be a directory path or a Store, got {store!r}")
        store = store_type(store)
    store._make()  # (where it was opened with no store there yet)
    if store.read_only:
        raise StoreError(f"store {str(store)!r} is open for reading only (its files are "
                         "not writable here): it can be read, not trained into")
    if given:  # opened a while ago, on an object store: what was published since
        store._refresh()
    return store
