"""The thread switch interval is short while a run runs, and put back after."""

from __future__ import annotations

import sys
import threading

import pandas as pd
import pytest

import manymodels as mm
from manymodels import _switching


def fit_reporting_interval(data):
    return None, {"switch_interval": sys.getswitchinterval()}


@pytest.fixture
def default_interval():
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(before)


def _frame(groups: int = 4) -> pd.DataFrame:
    return pd.DataFrame({"g": [g for g in range(groups) for _ in range(3)],
                         "x": range(groups * 3)})


@pytest.mark.parametrize("backend", ["serial", "threads"])
def test_a_run_shortens_the_interval_and_restores_it(default_interval, backend, tmp_path):
    run = mm.train(fit_reporting_interval, mm.groups(_frame(), by="g"), backend=backend,
                   store=tmp_path / "store", progress=False)
    seen = run.results["switch_interval"]
    assert (seen == _switching.SWITCH_INTERVAL_S).all()
    assert sys.getswitchinterval() == 0.005


def test_a_shorter_interval_of_the_users_is_kept(default_interval):
    sys.setswitchinterval(0.0001)
    users = sys.getswitchinterval()  # (as the interpreter rounds it)
    run = mm.train(fit_reporting_interval, mm.groups(_frame(), by="g"), backend="serial",
                   progress=False)
    assert (run.results["switch_interval"] == users).all()
    assert sys.getswitchinterval() == users


def test_restored_after_a_failed_run(default_interval):
    def broken(data):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mm.train(broken, mm.groups(_frame(), by="g"), backend="serial", progress=False)
    assert sys.getswitchinterval() == 0.005


def test_runs_on_two_threads_restore_it_when_the_last_ends(default_interval):
    first_inside, release = threading.Event(), threading.Event()

    def waiting(data):
        first_inside.set()
        release.wait(10)
        return None, {"switch_interval": sys.getswitchinterval()}

    results = {}
    slow = threading.Thread(target=lambda: results.setdefault("slow", mm.train(
        waiting, mm.groups(_frame(1), by="g"), backend="serial", progress=False)))
    slow.start()
    assert first_inside.wait(10)
    quick = mm.train(fit_reporting_interval, mm.groups(_frame(), by="g"), backend="serial",
                     progress=False)
    # the quick run ended while the slow one still runs: still short
    assert sys.getswitchinterval() == _switching.SWITCH_INTERVAL_S
    release.set()
    slow.join(10)
    assert sys.getswitchinterval() == 0.005
    assert (quick.results["switch_interval"] == _switching.SWITCH_INTERVAL_S).all()
    assert (results["slow"].results["switch_interval"] == _switching.SWITCH_INTERVAL_S).all()


def test_forked_workers_get_the_interval_as_it_was(default_interval):
    run = mm.train(fit_reporting_interval, mm.groups(_frame(), by="g"),
                   backend="processes", start_method="fork", workers=2, progress=False)
    assert (run.results["switch_interval"] == 0.005).all()
