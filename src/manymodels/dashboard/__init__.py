"""The live dashboard: a page that follows the runs of a store as they are written.

``manymodels dashboard models/`` (or ``mm.train(..., store=..., dashboard=True)``)
serves it on 127.0.0.1: every run with its progress, rate, ETA and counts per
status; a run's worker timeline, duration histogram, metric distributions,
slowest tasks, and failures with their tracebacks, searchable by key.
:mod:`.queries` asks the store, :mod:`.server` serves, ``static/`` is the page.
"""

from __future__ import annotations

import sys
from typing import Any

from ..callbacks import Callback, RunInfo
from .server import DashboardServer

__all__ = ["DashboardServer", "LiveDashboard"]


class LiveDashboard(Callback):
    """Serves the run's store while ``train`` runs, and prints the address."""

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.server: DashboardServer | None = None

    def on_run_start(self, info: RunInfo) -> None:
        if self.server is None:
            self.server = DashboardServer(info.store.path, port=self.port).start()
            print(f"manymodels dashboard: {self.server.url}#run={info.run_id} (while this "
                  f"run lasts; after: manymodels dashboard {info.store.path})",
                  file=sys.stderr, flush=True)

    def close(self, *exc: Any) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None
