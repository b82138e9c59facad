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


@dataclass(eq=False)
class TaskRecords:
    """Per-task columns filled by the scheduler, indexed by task number. Two
    are equal only when they are the same object (comparing the columns
    field by field raised on the NumPy ones)."""

    size: int
    status: list[str | None] = field(init=False)
    attempts: list[int] = field(init=False)
    model: list[Any] = field(init=False)
    metrics: list[dict | None] = field(init=False)
    #: Arrays (float64, NaN until set): a million Python floats were 48 MB.
    duration_s: np.ndarray = field(init=False)
    started_at: np.ndarray = field(init=False)
    worker: list[int] = field(init=False)
    error: list[str | None] = field(init=False)
    reused_from: list[int | None] = field(init=False)

    def __post_init__(self) -> None:
        n = self.size
        self.status, self.attempts = [None] * n, [0] * n
        self.model, self.metrics = [None] * n, [None] * n
        self.duration_s, self.started_at = np.full(n, np.nan), np.full(n, np.nan)
        self.worker, self.error = [-1] * n, [None] * n
        self.reused_from = [None] * n

    def mark_ok(self, indices: np.ndarray, worker: int, durations: np.ndarray,
                started: np.ndarray, models: Iterable[Any], metrics: Iterable[Any]
                ) -> list[int]:
        """Record a part every task of which succeeded on ``worker``; its
        task numbers, as a list. The times go in as arrays; a part of
        consecutive tasks (the usual case) by slices, others task by task."""
        finished = indices.tolist()
        self.duration_s[indices], self.started_at[indices] = durations, started
        ok = Status.OK.value
        span = _consecutive(indices)
        if span is not None:
            count = len(finished)
            tried = self.attempts[span]
            self.attempts[span] = ([1] * count if tried.count(0) == count
                                   else [a + 1 for a in tried])
            self.status[span], self.worker[span], self.error[span] = (
                [ok] * count, [worker] * count, [None] * count)
            self.model[span], self.metrics[span] = list(models), list(metrics)
            return finished
        attempts, statuses, workers, errors = self.attempts, self.status, self.worker, self.error
        for index, model, metric in zip(finished, models, metrics):
            attempts[index] += 1
            statuses[index], workers[index], errors[index] = ok, worker, None
            self.model[index], self.metrics[index] = model, metric
        return finished


def _consecutive(indices: np.ndarray) -> slice | None:
    """``indices`` as the slice they fill, when they are consecutive task
    numbers in order (a part of a table's groups, usually); else None."""
    count = len(indices)
    if count < 2 or int(indices[-1]) - int(indices[0]) != count - 1 or not (
            np.diff(indices) == 1).all():
        return None
    return slice(int(indices[0]), int(indices[0]) + count)
