"""The interpreter's thread switch interval, kept short while a run runs.

The driver runs Python on several threads at once: the scheduler's loop,
the store's writer (:mod:`manymodels.store.writer`) and the process
backend's sender threads. The helper threads spend their time in C calls
that let go of the GIL (SQLite, Arrow, pipe writes), and each time one
comes back it must wait for the GIL. While the scheduler's loop is busy in
Python, CPython hands the GIL over only when the switch interval (5 ms by
default) has passed: on 16 cores, where the loop is busy most of the time,
the writer's hundreds of C calls a commit each waited up to 5 ms, and its
second of work took several. A shorter interval bounds each wait; the cost is
more frequent switches (a few microseconds each). The interval is the
process's, so it is set for the run only and put back after the last run
that set it (and in a process forked meanwhile, a worker); one already
shorter is left alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

#: The switch interval during a run (seconds); None leaves it as it is.
SWITCH_INTERVAL_S: float | None = 0.0005

_lock = threading.Lock()
_runs = 0
_saved: float | None = None


@contextlib.contextmanager
def short_switch_interval() -> Iterator[None]:
    """While the block runs, threads hand the GIL over within
    :data:`SWITCH_INTERVAL_S`; the interval before it is restored when the
    last block open (several runs may run at once, on threads) ends."""
    global _runs, _saved
    wanted = SWITCH_INTERVAL_S
    with _lock:
        _runs += 1
        if _runs == 1:
            current = sys.getswitchinterval()
            if wanted is not None and wanted < current:
                _saved = current  # (set only when changed: setting rounds it down)
                sys.setswitchinterval(wanted)
    try:
        yield
    finally:
        with _lock:
            _runs -= 1
            if _runs == 0 and _saved is not None:
                sys.setswitchinterval(_saved)
                _saved = None


def _as_before_in_child() -> None:
    """A process forked during a run (a worker) runs no run of its own here:
    it gets the interval back as it was before the run."""
    global _runs, _saved
    _runs = 0
    if _saved is not None:
        sys.setswitchinterval(_saved)
        _saved = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_as_before_in_child)
