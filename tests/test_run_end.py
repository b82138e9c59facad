"""How a processes run ends: its workers and undertaker are gone (the
undertaker reaped by a thread, or right away when no thread can be had),
and nothing of the run's files is left."""

from __future__ import annotations

import threading

import pandas as pd

import manymodels as mm
from conftest import shm_files


def _mean(df: pd.DataFrame) -> float:
    return float(df["y"].mean())


def test_a_run_ends_cleanly_when_no_thread_can_reap_its_undertaker(monkeypatch, no_leftovers):
    start = threading.Thread.start

    def refused(self):
        if self.name == "manymodels-undertaker-reaper":
            raise RuntimeError("can't start new thread")
        return start(self)

    monkeypatch.setattr(threading.Thread, "start", refused)
    frame = pd.DataFrame({"g": ["a", "a", "b", "b"], "y": [1.0, 2.0, 3.0, 5.0]})
    run = mm.train(_mean, mm.groups(frame, by="g"), workers=2, progress=False)
    assert run.models == {"a": 1.5, "b": 4.0}
    assert not shm_files()


def test_the_pipe_a_worker_sends_its_outcomes_through_is_widened():
    import fcntl
    import os

    from manymodels.engine.backends._process_start import PIPE_BYTES, _widen_pipe

    read, write = os.pipe()
    try:
        before = fcntl.fcntl(write, getattr(fcntl, "F_GETPIPE_SZ", 1032))
        _widen_pipe(write)
        after = fcntl.fcntl(write, getattr(fcntl, "F_GETPIPE_SZ", 1032))
    finally:
        os.close(read)
        os.close(write)
    assert before == 64 * 1024 and after in (PIPE_BYTES, 256 * 1024)
