"""The progress display: it counts models, not batches, and shows ok/failed
counts, the rate in models per second and the time left.

* On a terminal (or in a Jupyter notebook with ipywidgets, where rich draws
  its live bar in the cell's output) a rich progress bar.
* Elsewhere (CI logs, ``nohup``, ``2>&1 | tee log``, a notebook without
  ipywidgets) a plain line on stderr every :data:`PLAIN_INTERVAL_S` seconds
  (:data:`INTERVAL_VARIABLE` sets it) and one at the end, no carriage
  returns, no colour. A run shorter than the interval prints nothing, so
  that many small runs leave no lines behind.
* Nothing with ``progress=False``.
"""

from __future__ import annotations

import datetime
import importlib.util
import math
import sys
import time
from typing import Any, TextIO

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text

from ..machine import number_from_environment

#: Seconds between two plain progress lines where stderr is not a terminal.
PLAIN_INTERVAL_S = 30.0
#: The environment variable that sets those seconds (a number >= 0).
INTERVAL_VARIABLE = "MANYMODELS_PROGRESS_INTERVAL"


def progress_interval() -> float:
    """Seconds between plain progress lines: :data:`INTERVAL_VARIABLE` when
    set (a number of seconds >= 0, else a ValueError naming it), else
    :data:`PLAIN_INTERVAL_S`. The run reads it before any work starts."""
    return number_from_environment(
        INTERVAL_VARIABLE, float, lambda value: math.isfinite(value) and value >= 0,
        PLAIN_INTERVAL_S, "the seconds between two progress lines where stderr is not a "
        "terminal, a number >= 0")


def rate_text(speed: float | None) -> str:
    """Models per second as the bar shows it: two significant digits below
    10, so that models of seconds each read ``0.25 models/s``, not ``0``."""
    if speed is None:
        return ""
    return f"{speed:,.0f} models/s" if speed >= 10 else f"{speed:.2g} models/s"


def _is_terminal(stream: Any) -> bool:
    try:
        return stream is not None and bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or closed
        return False


def _has_ipywidgets() -> bool:
    return importlib.util.find_spec("ipywidgets") is not None


def live_bar_fits(stream: Any) -> bool:
    """Whether rich's live bar shows on ``stream``: a terminal, or a Jupyter
    notebook (rich's ``Console.is_jupyter``: ipykernel, Colab, Databricks)
    with ipywidgets, which rich draws the bar in (without it rich only warns)."""
    if _is_terminal(stream):
        return True
    return bool(Console(stderr=True).is_jupyter) and _has_ipywidgets()


def _clock(seconds: float | None) -> str:
    """Seconds as the bar shows them: ``0:01:05``."""
    return str(datetime.timedelta(seconds=max(0, int(seconds or 0))))


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(rate_text(task.finished_speed or task.speed), style="cyan")


class ProgressBar:
    """The progress display of one run (see the module's docstring)."""

    def __init__(self, total: int, enabled: bool, description: str = "training") -> None:
        self.enabled = bool(enabled)
        self._progress: Progress | None = None
        self._lines: _PlainLines | None = None
        if not self.enabled:
            return
        if not live_bar_fits(sys.stderr):
            if sys.stderr is not None:
                self._lines = _PlainLines(sys.stderr, total, description, progress_interval())
            return
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[green]{task.fields[ok]} ok[/] [red]{task.fields[failed]} failed[/]"),
            _RateColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._progress.add_task(description, total=total, ok=0, failed=0)
        self._progress.start()

    def update(self, done: int, ok: int, failed: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=done, ok=ok, failed=failed)
        elif self._lines is not None:
            self._lines.update(done, ok, failed)

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        elif self._lines is not None:
            self._lines.close()
            self._lines = None


class _PlainLines:
    """The bar as a plain line every ``interval`` seconds and one at the end
    (none for a run shorter than the interval): for logs and pipes."""

    def __init__(self, stream: TextIO, total: int, description: str, interval: float) -> None:
        self.stream, self.total, self.description = stream, total, description
        self.interval = interval
        self.started = self.last_time = time.monotonic()
        self.first_done: int | None = None  # (a resumed run starts with some done)
        self.last_done = 0
        self.counts = (0, 0, 0)

    def update(self, done: int, ok: int, failed: int) -> None:
        if self.first_done is None:
            self.first_done = self.last_done = done
        self.counts = (done, ok, failed)
        now = time.monotonic()
        if done < self.total and now - self.last_time >= self.interval:  # (the end: close's)
            speed = (done - self.last_done) / (now - self.last_time) if now > self.last_time \
                else None
            self.last_time, self.last_done = now, done
            self._write(now, speed, finished=False)

    def close(self) -> None:
        now = time.monotonic()
        if now - self.started >= self.interval:  # a quick run: no line
            done = self.counts[0]
            speed = (done - (self.first_done or 0)) / (now - self.started)
            self._write(now, speed, finished=True)

    def _write(self, now: float, speed: float | None, finished: bool) -> None:
        done, ok, failed = self.counts
        total = self.total
        parts = [f"manymodels: {self.description} {done:,}/{total:,} models"
                 f" ({100 * done // total if total else 100}%)", f"{ok:,} ok", f"{failed:,} failed"]
        if speed is not None:
            parts.append(rate_text(speed))
        parts.append(f"{_clock(now - self.started)} elapsed")
        if not finished and speed:
            parts.append(f"eta {_clock((total - done) / speed)}")
        try:
            self.stream.write(", ".join(parts) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr: the run goes on
            pass
