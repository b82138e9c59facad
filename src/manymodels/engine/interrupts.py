"""Ctrl-C and SIGTERM during a run: what the scheduler's loop does with
them (:class:`RunInterrupts`), so that a stop is never cut short and a
round's results are never recorded half. The scheduler
(:mod:`.scheduling`) holds one for the length of a run.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class RunInterrupts:
    """During a run, Ctrl-C and SIGTERM stop it: workers stopped, results kept.

    Both raise ``KeyboardInterrupt`` (Ctrl-C where its handler is Python's
    own) until the run is :attr:`stopping`; from then on they do not cut
    the stop short, which would leave workers running and lose the results
    (a second Ctrl-C a few milliseconds after the first did). The first to
    come then is kept as :attr:`late`: it ends a run that was stopping for
    no interrupt with one. While the results of a round are recorded
    (:meth:`held`) they wait for its end. Handlers are set in the main
    thread only (the only one a signal interrupts)."""

    def __init__(self) -> None:
        self.stopping = False
        self.late: KeyboardInterrupt | None = None
        self._holding = False
        self._held: KeyboardInterrupt | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> RunInterrupts:
        if threading.current_thread() is threading.main_thread():
            self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._interrupt)
            if _raises_keyboard_interrupt(signal.getsignal(signal.SIGINT)):
                self._previous[signal.SIGINT] = signal.signal(signal.SIGINT, self._interrupt)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _interrupt(self, signum: int, frame: Any) -> None:
        interrupt = (KeyboardInterrupt() if signum == signal.SIGINT
                     else KeyboardInterrupt(f"received {signal.Signals(signum).name}"))
        previous = self._previous.get(signum)
        if signum == signal.SIGINT and previous is not signal.default_int_handler:
            try:  # PySpark's: it cancels its jobs, then raises as Python's does
                previous(signum, frame)
            except KeyboardInterrupt:
                pass
        if self.stopping:
            if self.late is None:
                self.late = interrupt
        elif self._holding:
            self._held = self._held or interrupt
        else:
            raise interrupt

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """Ctrl-C and SIGTERM wait until the block is done, then raise. A
        round's events are recorded whole: raised halfway through a part,
        an interrupt left its tasks ``ok`` in the run without their models,
        and out of the store (the recorder was never told of them)."""
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        interrupt, self._held = self._held, None
        if interrupt is not None:
            raise interrupt


def _raises_keyboard_interrupt(handler: Any) -> bool:
    """Whether a SIGINT handler is Python's own, or PySpark's (a SparkContext
    sets one in the main thread that cancels its jobs, then raises
    KeyboardInterrupt, and leaves it set for the process's life): the run
    takes it over, and calls PySpark's first. Any other handler is the
    user's, and is left as it is."""
    return handler is signal.default_int_handler or (
        callable(handler) and (getattr(handler, "__module__", None) or "").startswith("pyspark"))
