"""Run every task in the driver, one after another: for debugging (pdb, print
and breakpoints work) and as the reference the other backends must match."""

from __future__ import annotations

import os
import sys
import warnings
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

from threadpoolctl import threadpool_limits

from ...machine import thread_limits_in_environment
from ..execution import Executor, RunContext, TaskRef
from ..options import BackendOptions
from .base import Backend, Event, Finished, WorkerStartupError


class SerialBackend(Backend):
    name = "serial"
    isolates_gpus = True  # one task at a time
    max_workers = 1  # the driver itself
    runs_fit_in_poll = True

    @classmethod
    def default_workers(cls, cpus_per_task: int) -> int:
        return 1  # the driver itself

    def configure(self, options: BackendOptions) -> None:
        super().configure(replace(options, workers=1))

    def start(self, context: RunContext) -> None:
        self._saved_cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
        self._queue: deque[list[TaskRef]] = deque()
        if self.gpu_sets:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(self.gpu_sets[0])
            _warn_if_cuda_started(self.gpu_sets[0])
        self._limits = threadpool_limits(limits=self.cpus_per_task)
        self._environment = thread_limits_in_environment(self.cpus_per_task)
        self._environment.__enter__()
        try:
            self._executor = Executor(context)  # (runs setup=, as a worker's start does)
        except KeyboardInterrupt:
            self.stop()
            raise
        except BaseException as exc:  # as the other backends say a worker's start failed
            self.stop()
            raise WorkerStartupError(f"the driver could not start as the serial backend's "
                                     f"worker: {exc!r}") from exc

    def free_slots(self, per_worker: int) -> int:
        return 0 if self._queue else 1

    def submit(self, batch_id: int, tasks: Sequence[TaskRef]) -> None:
        self._queue.append(tasks)

    def poll(self, timeout: float) -> list[Event]:
        if not self._queue:
            return []
        whole = self._executor.run_batch(self._queue.popleft())
        return [Finished(whole.outcomes, worker=0, busy_s=whole.busy_s,
                         prepare_s=whole.prepare_s)]

    def stop(self, *, force: bool = False) -> None:
        self._queue.clear()
        self._limits.restore_original_limits()
        self._environment.__exit__(None, None, None)
        if self.gpu_sets:
            if self._saved_cuda is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = self._saved_cuda


def _warn_if_cuda_started(gpus: tuple[str, ...]) -> None:
    """Say that the task's GPUs cannot be pinned where this process's CUDA
    was initialised already (by PyTorch: an earlier run's fit, the user's
    own code): CUDA reads ``CUDA_VISIBLE_DEVICES`` once, when it starts, so
    the tasks see the GPUs it saw then, not ``gpus``."""
    torch = sys.modules.get("torch")
    try:
        started = torch is not None and bool(torch.cuda.is_initialized())
    except Exception:  # a torch without CUDA's module, or broken: nothing to say
        started = False
    if started:
        warnings.warn(
            f"gpus={list(gpus)} (gpus_per_task=) is not applied: the serial backend pins "
            "a task's GPUs through CUDA_VISIBLE_DEVICES in this process, whose CUDA "
            "(PyTorch) was initialised already, and CUDA reads it once, at its start; "
            "the tasks see the GPUs this process saw then. Use backend='processes', "
            "whose workers start with their own GPUs", RuntimeWarning, stacklevel=2)
