"""The bottom of the flow: what this machine offers a run and how its
processes are watched. Every layer above may use it; it imports none.

- :mod:`.capacity`: the cores this process may really use (affinity and
  cgroup quota), BLAS/OpenMP thread limits, workers' niceness, memory sizes
  as users write them (``"2GB"``), the GPUs this process may use;
- :mod:`.processtrees`: a worker's process tree, ending it, waiting for a
  child's exit, and the memory a process holds (PSS), which
  ``memory_limit`` is held to;
- :mod:`.collector`: the driver's garbage collector, paused while fits run
  in other processes.
"""

from .capacity import (
    NICENESS_VARIABLE,
    THREAD_LIMIT_VARIABLES,
    WORKER_NICENESS,
    DetectedGpus,
    cuda_visible_ids,
    detect_gpus,
    number_from_environment,
    parse_bytes,
    thread_limit_environment,
    thread_limits_in_environment,
    usable_cores,
    visible_gpus,
    worker_niceness,
)
from .collector import collector_paused
from .processtrees import (
    end_tree,
    ends_by_itself,
    memory_bound,
    memory_held,
    process_table,
    process_tree,
    wait_for_exit,
)

__all__ = [
    "NICENESS_VARIABLE",
    "THREAD_LIMIT_VARIABLES",
    "WORKER_NICENESS",
    "DetectedGpus",
    "collector_paused",
    "cuda_visible_ids",
    "detect_gpus",
    "end_tree",
    "ends_by_itself",
    "memory_bound",
    "memory_held",
    "number_from_environment",
    "parse_bytes",
    "process_table",
    "process_tree",
    "thread_limit_environment",
    "thread_limits_in_environment",
    "usable_cores",
    "visible_gpus",
    "wait_for_exit",
    "worker_niceness",
]
