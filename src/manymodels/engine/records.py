"""What the scheduler fills as tasks finish: :class:`TaskRecords`, per-task
columns the run layer turns into a ``Run``, and :class:`RecordingError`, the
failure of the recorder (a store) the scheduler hands its outcomes to."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


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
