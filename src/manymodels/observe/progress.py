"""The progress bar: it counts models, not batches, and shows ok/failed counts,
the rate in models per second and the time left. Off when stderr is not a
terminal (CI logs, pipes) or when ``progress=False``."""

from __future__ import annotations

import sys

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


def rate_text(speed: float | None) -> str:
    """Models per second as the bar shows it: two significant digits below
    10, so that models of seconds each read ``0.25 models/s``, not ``0``."""
    if speed is None:
        return ""
    return f"{speed:,.0f} models/s" if speed >= 10 else f"{speed:.2g} models/s"


class _RateColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        return Text(rate_text(task.finished_speed or task.speed), style="cyan")


class ProgressBar:
    """A rich progress bar, or nothing when disabled."""

    def __init__(self, total: int, enabled: bool, description: str = "training") -> None:
        self.enabled = bool(enabled) and sys.stderr.isatty()
        self._progress: Progress | None = None
        if not self.enabled:
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

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
