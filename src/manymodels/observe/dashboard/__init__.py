"""The live dashboard: a page that follows the runs of a store as they are written.

``manymodels dashboard models/`` (or ``mm.train(..., store=..., dashboard=True)``)
serves it on 127.0.0.1, behind a token printed in its URL (kept by the browser
in a cookie after the first visit; see :mod:`.server`): every run with its
progress, rate, ETA and counts per status; a run's worker timeline, duration
histogram, metric distributions, slowest tasks, and failures with their
tracebacks, searchable by key.
:mod:`.queries` asks the store, :mod:`.server` serves, ``static/`` is the page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from typing import Any

from ..callbacks import Callback, RunInfo
from .server import DashboardServer

__all__ = ["DashboardServer", "LiveDashboard"]


#: Set for a dashboard started by a run: it ends when its standard input does.
WATCH_DRIVER = "MANYMODELS_DASHBOARD_OF_A_RUN"


class LiveDashboard(Callback):
    """Serves the run's store while ``train`` runs, and prints the address,
    with its token (``?token=``): any local account can reach a loopback port.

    The server runs in a process of its own (``manymodels dashboard``), not in
    a thread of the driver: its queries and JSON would otherwise compete for
    the driver's GIL with the loop that feeds the workers, and a worker forked
    while one of its threads held an SQLite lock would inherit it locked.
    """

    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.process: subprocess.Popen | None = None
        self.url: str | None = None
        self._log: Any = None

    def on_run_start(self, info: RunInfo) -> None:
        if self.process is not None:
            return
        # its errors go to a file, never a pipe nobody reads; closed in close()
        log = self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        # its standard input is a pipe of the driver's: end-of-file there (the
        # driver killed) ends it, as its workers die with the driver
        self.process = subprocess.Popen(
            [sys.executable, "-m", "manymodels.cli", "dashboard", str(info.store.path),
             "--port", str(self.port)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=log, text=True, env={**os.environ, WATCH_DRIVER: "1"})
        line = self.process.stdout.readline()  # the address, once it listens
        found = re.search(r"http://\S+", line)
        if found is None:
            self.close()
            log.seek(0)
            raise RuntimeError(f"the dashboard did not start: {log.read()[-2000:]}")
        self.url = found.group(0)
        print(f"manymodels dashboard: {self.url}#run={info.run_id} (while this run lasts; "
              f"after it: manymodels dashboard {info.store.path})", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            self.process.stdout.close()
            self.process.stdin.close()
            self._log.close()
            self.process = None
