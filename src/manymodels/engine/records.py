"""What the scheduler fills as tasks finish: :class:`TaskRecords`, per-task
columns the run layer turns into a ``Run``, and :class:`RecordingError`, the
failure of the recorder (a store) the scheduler hands its outcomes to."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .messages import Status


class RecordingError(Exception):
    """The recorder the scheduler hands finished tasks to can take no more (a
    store whose disk is full): the run stops and keeps what finished. The
    store's own errors derive from it."""


#: A task's status as a code: its position here (``int8``); :data:`UNSET`
#: until the task ends.
STATUS_NAMES: tuple[str, ...] = tuple(status.value for status in Status)
UNSET = -1
#: Status (or its text) -> code.
STATUS_CODES: dict[str, int] = {name: code for code, name in enumerate(STATUS_NAMES)}
OK_CODE = STATUS_CODES[Status.OK.value]
FAILED_CODE = STATUS_CODES[Status.FAILED.value]
CANCELLED_CODE = STATUS_CODES[Status.CANCELLED.value]
#: The codes' names, and None last, so that ``_NAMES[codes]`` maps UNSET (-1) to None.
_NAMES = np.array([*STATUS_NAMES, None], dtype=object)
#: The most attempts an ``int16`` column counts.
_INT16_ATTEMPTS = np.iinfo(np.int16).max


@dataclass(eq=False)
class TaskRecords:
    """Per-task columns filled by the scheduler, indexed by task number.

    Typed arrays, not a Python list of objects a task: at ten million tasks
    seven lists were 560 MB of pointers, and the ints they held more. The
    status is a code (see :data:`STATUS_NAMES`), decoded where a table is
    made; a worker number is -1 for a task no worker ran; ``reused_from``
    (the run a task's model is reused from, -1 for none) is made only when
    a store reuses some; errors, rare, are a dict by task.
    ``model`` and ``metrics`` stay lists: they hold what ``fit`` returned
    (any object), though most slots name one shared object (a part's pack,
    :data:`~manymodels.store.lazymodels.IN_STORE`).

    Two records are equal only when they are the same object (comparing the
    columns field by field raised on the NumPy ones). ``retries``: the most
    retries a task may have, which sizes the ``attempts`` column."""

    size: int
    retries: int = 0
    status_code: np.ndarray = field(init=False)
    attempts: np.ndarray = field(init=False)
    model: list[Any] = field(init=False)
    metrics: list[Any] = field(init=False)
    #: Arrays (float64, NaN until set): a million Python floats were 48 MB.
    duration_s: np.ndarray = field(init=False)
    started_at: np.ndarray = field(init=False)
    worker: np.ndarray = field(init=False)
    #: None until a task is reused (a first run keeps no such column).
    reused_from: np.ndarray | None = field(init=False)
    #: Task number -> its error (a traceback, or what killed its worker).
    errors: dict[int, str] = field(init=False)

    def __post_init__(self) -> None:
        n = self.size
        self.status_code = np.full(n, UNSET, dtype=np.int8)
        self.attempts = np.zeros(n, dtype=np.int16 if self.retries < _INT16_ATTEMPTS
                                 else np.int64)
        self.model, self.metrics = [None] * n, [None] * n
        self.duration_s, self.started_at = np.full(n, np.nan), np.full(n, np.nan)
        self.worker = np.full(n, -1, dtype=np.int32)
        self.reused_from = None
        self.errors = {}

    # -- reading -----------------------------------------------------------------

    def status_of(self, index: int) -> str | None:
        """Task ``index``'s status, as text; None until it ends."""
        return _NAMES[self.status_code[index]]

    def status_names(self, codes: np.ndarray | None = None) -> np.ndarray:
        """The statuses (of ``codes``, else of every task) as text, an object
        array (None for a task not ended): the results table's column."""
        return _NAMES[self.status_code if codes is None else codes]

    def ok_mask(self) -> np.ndarray:
        """Which tasks succeeded (a bool array)."""
        return self.status_code == OK_CODE

    def ended_mask(self) -> np.ndarray:
        """Which tasks have ended, however."""
        return self.status_code != UNSET

    def reused_mask(self) -> np.ndarray:
        """Which tasks' models are reused from a store (a bool array)."""
        if self.reused_from is None:
            return np.zeros(self.size, dtype=bool)
        return self.reused_from >= 0

    def error_of(self, index: int) -> str | None:
        return self.errors.get(index)

    def error_column(self, indices: Iterable[int] | None = None) -> list[str | None] | None:
        """The errors of ``indices`` (else of every task) as a list, None
        for a task without one; None itself when no task has an error."""
        errors = self.errors
        if not errors:
            return None
        return [errors.get(index) for index in (range(self.size) if indices is None
                                                 else indices)]

    # -- writing -----------------------------------------------------------------

    def mark_reused(self, indices: np.ndarray, runs: np.ndarray) -> None:
        """Tasks ``indices`` succeeded before: their models are those of
        ``runs`` (a run each, -1 for none known) in the store."""
        if self.reused_from is None:
            self.reused_from = np.full(self.size, -1, dtype=np.int64)
        self.status_code[indices] = OK_CODE
        self.reused_from[indices] = runs

    def set_status(self, index: int, status: str) -> None:
        self.status_code[index] = STATUS_CODES[status]

    def set_error(self, index: int, error: str | None) -> None:
        if error is not None:
            self.errors[index] = error
        elif self.errors:
            self.errors.pop(index, None)

    def mark_ok(self, indices: np.ndarray, worker: int, durations: np.ndarray,
                started: np.ndarray, models: Iterable[Any], metrics: Iterable[Any]
                ) -> list[int]:
        """Record a part every task of which succeeded on ``worker``; its
        task numbers, as a list. The columns by array operations; the models
        and metrics of a part of consecutive tasks (the usual case) by
        slices, others task by task."""
        finished = indices.tolist()
        self.duration_s[indices], self.started_at[indices] = durations, started
        self.attempts[indices] += 1
        self.status_code[indices] = OK_CODE
        self.worker[indices] = worker
        if self.errors:
            for index in finished:
                self.errors.pop(index, None)
        span = _consecutive(indices)
        if span is not None:
            self.model[span], self.metrics[span] = list(models), list(metrics)
            return finished
        model_of, metrics_of = self.model, self.metrics
        for index, model, metric in zip(finished, models, metrics):
            model_of[index], metrics_of[index] = model, metric
        return finished


def _consecutive(indices: np.ndarray) -> slice | None:
    """``indices`` as the slice they fill, when they are consecutive task
    numbers in order (a part of a table's groups, usually); else None."""
    count = len(indices)
    if count < 2 or int(indices[-1]) - int(indices[0]) != count - 1 or not (
            np.diff(indices) == 1).all():
        return None
    return slice(int(indices[0]), int(indices[0]) + count)
