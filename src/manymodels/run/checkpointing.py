"""What ``train`` wires for a ``fit`` that takes a ``checkpoint``: the run's
checkpoint space (in the store, or a temporary directory), the run marked
as running while it lasts, and what each task resumed from, in the
results and kept with the run in the store.

    fit(..., checkpoint) ──► CheckpointSpace (store/checkpoints/, by identity)
                               │ in the RunContext: workers write it themselves
    Run ◄── journal (resumed / refused, per task) ◄───────┘
     └──► store attachment "resumed_from" (Store.results, the report)
"""

from __future__ import annotations

import math
import shutil
import sqlite3
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..engine.checkpointspace import OWNERS, CheckpointSpace, asks_for_checkpoint, slot_names
from ..store import StoreError
from ..store.checkpoints import RESUMED as ATTACHMENT

#: Where a store keeps checkpoints (see :mod:`manymodels.store.checkpoints`).
FOLDER = "checkpoints"


def wanted(fit: Any, run_fit: Any, passed: set[str], keep_checkpoints: Any,
           takes_data: bool = True) -> bool:
    """Whether the run's tasks get a ``checkpoint``; refuses what cannot be,
    before any work starts. ``takes_data``: whether fit's first parameter
    gets each task's data (not for a bare grid's fit, which gets keywords)."""
    if not isinstance(keep_checkpoints, bool):
        raise TypeError(f"keep_checkpoints must be True or False, got {keep_checkpoints!r}")
    if not asks_for_checkpoint(fit) or "checkpoint" in passed:
        return False
    _check_checkpoint_parameter(fit, takes_data)
    if run_fit is not fit:
        raise ValueError(
            "fit takes a checkpoint, which evaluate= and select=mm.halving() cannot give: "
            "they call fit several times per task (each window, each rung), and a "
            "checkpoint saved by one call would be resumed by the next")
    return True


def _check_checkpoint_parameter(fit: Any, takes_data: bool = True) -> None:
    """Refuse, before any work, a ``checkpoint`` that the task's rows would
    take the place of (fit's first parameter: every task failed with "got
    multiple values"), or one a ``functools.partial`` already binds (the
    run's checkpoint replaced it, silently)."""
    import functools
    import inspect

    if isinstance(fit, functools.partial) and "checkpoint" in fit.keywords:
        raise TypeError("fit is a functools.partial that binds checkpoint=: the run gives "
                        "each task its own checkpoint there; bind another name")
    try:
        parameters = list(inspect.signature(fit).parameters.values())
    except (TypeError, ValueError):
        return
    if takes_data and parameters and parameters[0].name == "checkpoint" and parameters[
            0].kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise TypeError("fit's first parameter is checkpoint, where each task's rows go: "
                        "name it after them (def fit(df, checkpoint))")


def _remove_dead_temporary_spaces(min_age_s: float = 60.0) -> None:
    """Remove the temporary checkpoint folders of runs without a store whose
    driver is gone (killed: its own clean-up never ran), so that they do not
    pile up: one whose owner lock no process holds, or that has none (its
    driver died before taking it), a minute old at least (a driver that has
    just made its folder takes the lock at once)."""
    import time

    from ..engine.checkpointspace import OWNERS, owner_alive

    for folder in Path(tempfile.gettempdir()).glob("manymodels-checkpoints-*"):
        try:
            if time.time() - folder.stat().st_mtime < min_age_s:
                continue
            tokens = [lock.stem for lock in (folder / OWNERS).glob("*.lock")]
            if not any(owner_alive(folder, token) for token in tokens):
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # another user's, or gone meanwhile
            continue


def check_folder(store: Any) -> None:
    """Refuse a store whose checkpoints' folder is no folder (a file of that
    name), naming it, before the run is recorded."""
    folder = Path(store.path) / FOLDER
    for path in (folder, folder / OWNERS):
        if path.exists() and not path.is_dir():
            raise StoreError(f"{str(path)!r} is not a directory: the store keeps its "
                             "checkpoints there; move it out of the way")


def open_space(plan: Any, store: Any, recorder: Any, reuse: bool, keep: bool,
               to_do: int = 1) -> CheckpointSpace:
    """The run's checkpoint space, held (marked running) until :func:`close`.
    ``to_do``: how many tasks will run; with none (every model reused) no
    slot is ever named, and the task identities are not asked for (an
    unchanged re-run named by its input's digest never makes them)."""
    if store is None:
        _remove_dead_temporary_spaces()
        root = tempfile.mkdtemp(prefix="manymodels-checkpoints-")
        space = CheckpointSpace(root, None, fresh=True, drop_when_ok=True)
    else:
        names: list[str] = []  # (a slot asked for then: an IndexError, not another's slot)
        if to_do:
            names = recorder.identities.identity
            names = names.to_pylist() if hasattr(names, "to_pylist") else list(names)
        space = CheckpointSpace(str(Path(store.path) / FOLDER), slot_names(names),
                                run_id=recorder.run_id,
                                fresh=not reuse)
        if not keep:  # each task's slot goes once its model is committed
            recorder.checkpoints = space
    space.hold()
    return space


def close(space: CheckpointSpace | None, store: Any) -> None:
    """The run has ended: it is no longer running (its slots can be resumed
    by the next run) once no fit of it runs on in this process; without a
    store, its checkpoints go with it."""
    if space is None:
        return
    space.release(remove=store is None)


def run_maker(make_run: Callable[..., Any], space: CheckpointSpace, store: Any
              ) -> Callable[..., Any]:
    """``make_run`` that gives the run what its tasks resumed from (and keeps
    it in the store), and warns of each checkpoint refused."""

    def make(plan: Any, records: Any, **options: Any) -> Any:
        run = make_run(plan, records, **options)
        events = space.journal()
        run._resumed_from = {index: describe(found) for index, found in events.items()}
        refused = [(index, e["reason"]) for index, found in events.items()
                   for e in found if e["kind"] == "refused"]
        if refused:
            keys = plan.tasks.keys()
            named = "; ".join(f"{keys[index]!r}: {reason}" for index, reason in refused[:5])
            warnings.warn(f"{len(refused)} task checkpoint(s) refused, those tasks started "
                          f"afresh: {named}", RuntimeWarning, stacklevel=2)
        if store is not None and run.run_id is not None and run._resumed_from:
            try:
                store.attach(run.run_id, ATTACHMENT, {"tasks": len(plan.tasks),
                                                      "by_index": run._resumed_from})
            except (StoreError, sqlite3.Error, OSError) as exc:
                warnings.warn(f"what the tasks resumed from could not be kept in the store: "
                              f"{exc}", RuntimeWarning, stacklevel=2)
        return run

    return make


def describe(events: list[dict]) -> str:
    """A task's journal as the ``resumed_from`` text: the last state it
    resumed from (its age and the attempt that saved it), and any refusal."""
    parts = []
    resumed = [i for i, e in enumerate(events) if e["kind"] == "resumed"]
    refused = [i for i, e in enumerate(events) if e["kind"] == "refused"]
    if resumed and (not refused or resumed[-1] > refused[-1]):  # (refused since: afresh)
        last = events[resumed[-1]]
        where = ("this run" if last.get("same_run") else
                 f"run {last['run_id']}" if last.get("run_id") is not None else "an earlier run")
        parts.append(f"attempt {last['attempt']} of {where}, saved "
                     f"{max(0.0, last['at'] - last['saved_at']):.1f} s before the resume")
    parts += [f"refused: {e['reason']}; started afresh" for e in events
              if e["kind"] == "refused"]
    return "; ".join(parts)


def resumed_column(resumed_from: dict[int, str] | None, size: int
                   ) -> tuple[list, np.ndarray | None]:
    """``resumed`` (bool per task) and ``resumed_from`` (text, or NaN for a
    task that neither resumed nor refused a checkpoint: the missing value
    pandas gives the rows of a run without the column, where the results of
    several runs are concatenated; None for the whole column when the run
    took no checkpoints)."""
    if resumed_from is None:
        return [False] * size, None
    texts = np.array([resumed_from.get(index) or math.nan for index in range(size)], dtype=object)
    return [isinstance(t, str) and t.startswith("attempt") for t in texts], texts


def with_resumed(store: Any, frame: Any) -> Any:
    """A store's results of one run with ``resumed`` (and ``resumed_from``,
    when its tasks resumed or refused a checkpoint), as ``Run.results`` has them."""
    if frame.empty:
        frame["resumed"] = []
        return frame
    run_id = int(frame["run_id"].iloc[0])
    kept = store.attached(ATTACHMENT, run_id, default=None)
    if kept is None or kept.get("tasks") != len(frame):  # (rows are in task order)
        resumed, texts = resumed_column(None, len(frame))
    else:
        resumed, texts = resumed_column(kept["by_index"], len(frame))
    at = frame.columns.get_loc("error") if "error" in frame.columns else len(frame.columns)
    frame.insert(at, "resumed", resumed)
    if texts is not None:
        frame.insert(at + 1, "resumed_from", texts)
    return frame
