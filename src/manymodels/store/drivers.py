"""Who writes a run: each run's row names its driver (host, process, and
the process's start time), so that a run whose driver is gone reads
``interrupted`` rather than ``running`` forever, and a run whose driver
is alive is not deleted under it."""

from __future__ import annotations

import os
import socket
import sqlite3


def driver_label() -> str:
    """Who is writing a run: this host, process and the process's start time
    (a pid alone is reused)."""
    import psutil

    return f"{socket.gethostname()}:{os.getpid()}:{psutil.Process().create_time():.2f}"


def driver_alive(label: str | None) -> bool:
    """Whether the driver a run's ``driver`` label names may still be
    running: True for another machine's (this one cannot tell)."""
    import psutil

    try:
        host, pid, started = (label or "").rsplit(":", 2)
        if host != socket.gethostname():
            return True  # another machine's driver: no way to tell from here
        return abs(psutil.Process(int(pid)).create_time() - float(started)) < 0.05
    except (ValueError, psutil.Error):
        return False


def mark_dead_runs_interrupted(conn: sqlite3.Connection) -> None:
    """A run whose driver was killed stays ``running``: when the store is next
    opened, a run whose driver process is gone is marked ``interrupted``."""
    running = conn.execute(
        "SELECT run_id, driver FROM runs WHERE status = 'running'").fetchall()
    dead = [(run_id,) for run_id, label in running if not driver_alive(label)]
    if dead:
        conn.executemany("UPDATE runs SET status = 'interrupted' WHERE run_id = ? "
                         "AND status = 'running'", dead)
