"""How many tasks a batch holds: sized from measured task times.

The scheduler (:mod:`manymodels.engine.scheduling`) asks a :class:`BatchSizer` how
large the next batch should be and how many batches a worker may hold; the
sizer learns from each finished part how long its tasks took.
"""

from __future__ import annotations

_TARGET_BATCH_S = 0.1
_MAX_BATCH = 20_000


class BatchSizer:
    """Adaptive batch size from measured task times (like joblib's auto batching).

    Until a batch has been measured, each worker gets one task, then sizes
    double from 1. Then a batch holds
    ``target_s`` worth of tasks at the running average time per task, capped so
    that the remaining tasks still spread over every worker a few times. When
    preparing a batch costs time of its own (reading its groups' rows from
    Parquet files), a batch holds at least four times that much work, so that
    the preparation stays a small part of it.
    """

    def __init__(self, workers: int, target_s: float = _TARGET_BATCH_S) -> None:
        self.workers = workers
        self.target_s = target_s
        self.seconds_per_task: float | None = None
        self.prepare_s: float | None = None  # per batch, when preparing one takes time
        self._ramp = 1
        self._blind = 0  # batches handed out before any was measured

    def observe(self, busy_s: float, tasks: int, prepare_s: float = 0.0) -> None:
        if prepare_s > 0:
            self.prepare_s = _running_average(self.prepare_s, prepare_s)
        if tasks > 0:
            self.seconds_per_task = _running_average(self.seconds_per_task, busy_s / tasks)

    def next_size(self, remaining: int) -> int:
        if self.seconds_per_task is None and self._blind < self.workers:
            self._blind += 1  # one task for each worker before any is measured: a worker
            return 1          # never waits while another holds two unmeasured tasks
        if self.seconds_per_task is None:
            size, self._ramp = self._ramp, min(self._ramp * 2, 64)
        else:
            work_s = max(self.target_s, 4 * (self.prepare_s or 0.0))
            size = int(work_s / max(self.seconds_per_task, 1e-7))
        tail_cap = remaining // (self.workers * 4)
        return max(1, min(size, tail_cap, _MAX_BATCH))

    def batches_per_worker(self, shared_queue: bool = False) -> int:
        """Two batches per worker while tasks are measured short, so that a worker
        finds its next batch at hand; otherwise one, as a pool's shared queue
        would: a long task queued behind another on a busy worker would wait
        there while an idle worker has nothing (20 tasks on 16 workers: the
        run would last two long tasks instead of one). A backend whose queue
        is shared by its workers (``shared_queue``) has no such risk, and gets
        two once tasks are measured, long or short; until then batch sizes
        double blind, so one."""
        if self.seconds_per_task is None:
            return 1
        return 2 if shared_queue or self.seconds_per_task < self.target_s else 1


def _running_average(average: float | None, sample: float) -> float:
    """An exponential moving average that follows drift but not one outlier."""
    return sample if average is None else 0.7 * average + 0.3 * sample
