"""One batch run on an engine's worker (a Ray task, a Spark or Dask worker
loop), as the messages its driver reads: shared by :mod:`._ray_worker` and
:mod:`._remote_worker`, which differ only in how a message travels.

The processes backend's workers have a loop of their own
(:mod:`._process_worker`): they record the running task in a shared slot
instead of sending a marker, and their thread limits are set once per
process.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

from ...machine import thread_limits_in_environment
from ..dataplane import dump_outcomes
from ..execution import FLUSH_EVERY_S, Executor, TaskRef
from ..messages import OkOutcomes
from ._protocol import Msg

_CONTROLLER: list[Any] = [0, None]  # [len(sys.modules) when built, ThreadpoolController]


def _thread_limiter() -> Any:
    """This process's threadpoolctl controller. Finding the BLAS/OpenMP
    libraries costs milliseconds, limiting them microseconds: the controller
    is built again only when modules were imported since (a new library)."""
    if _CONTROLLER[1] is None or _CONTROLLER[0] != len(sys.modules):
        from threadpoolctl import ThreadpoolController

        _CONTROLLER[:] = [len(sys.modules), ThreadpoolController()]
    return _CONTROLLER[1]


def batch_messages(executor: Executor, tasks: list[TaskRef], marked: bool,
                   cpus_per_task: int) -> Iterator[tuple]:
    """Run ``tasks`` and yield what happens: ``("run", index, outcomes,
    busy_s, prepare_s)`` just before each task when ``marked`` (so that the
    driver can pin a crash or a timeout on it), ``("part", outcomes, busy_s,
    prepare_s)`` every :data:`~manymodels.engine.execution.FLUSH_EVERY_S`
    otherwise, and ``("done", outcomes, busy_s, prepare_s)`` last. Outcomes
    travel pickled (:func:`~manymodels.engine.dataplane.dump_outcomes`), ``None``
    where there are none yet; ``prepare_s``, the time reading the batch's
    rows, is in the first only.

    The BLAS/OpenMP pools are limited to ``cpus_per_task`` threads for the
    batch only, and so are the environment's limits (``LOKY_MAX_CPU_COUNT``
    among them): an engine's worker process also runs other work, which the
    limits must not reach."""
    with _thread_limiter().limit(limits=cpus_per_task), thread_limits_in_environment(
            cpus_per_task):
        parts = executor.run_in_parts(
            tasks, flush_every_s=None if marked else FLUSH_EVERY_S, part_before_each=marked)
        for part in parts:
            blob = (dump_outcomes(OkOutcomes.of(part.outcomes))[0]
                    if part.outcomes or part.last else None)
            if part.running is not None:
                yield (Msg.RUN, part.running, blob, part.busy_s, part.prepare_s)
            else:
                yield (Msg.DONE if part.last else Msg.PART, blob, part.busy_s, part.prepare_s)
