"""The driver's cyclic garbage collector, paused while a run's fits run in
other processes (:func:`collector_paused`)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

#: Whether :func:`collector_paused` has the collector off now: a worker forked
#: meanwhile turns its own back on (it runs user code).
COLLECTOR_PAUSED = False


@contextlib.contextmanager
def collector_paused(pause: bool) -> Iterator[None]:
    """Python's cyclic garbage collector off while a run plans and drives its
    tasks, when ``pause`` (its fits run in other processes), and as it was
    after. Each full pass walks every container object, and a million tasks'
    plan, results and outcomes are millions of them, all acyclic: a stored run
    of a million models made passes worth 4 s of its 27 (measured). Memory
    held in a cycle made meanwhile is freed by the first pass after the run.
    With threads or serial, ``fit`` runs in this process, so it stays on."""
    global COLLECTOR_PAUSED
    if not pause or not gc.isenabled():
        yield
        return
    gc.disable()
    COLLECTOR_PAUSED = True
    try:
        yield
    finally:
        COLLECTOR_PAUSED = False
        gc.enable()
