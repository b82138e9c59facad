"""Round 3 defects of the engine backends, the workers' reading and backtest
windows (issue 37, items 4, 5 and 9)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import manymodels as mm
from manymodels.engine.backends import _worker_port
from manymodels.engine.backends._remote_slots import RemoteSlotsBackend
from manymodels.engine.backends._remote_worker import serve
from manymodels.engine.backends._worker_port import bind_address

# -- item 5: one silent connection must not stall the workers' handshakes --------


class _ThreadEngine(RemoteSlotsBackend):
    """The smallest engine: each launch is a thread running the real worker
    loop (``_remote_worker.serve``) in this process, over a real socket. Before
    any launch it opens a connection to the worker port and says nothing, as a
    port scanner or a stuck peer would."""

    name = "thread-engine"
    engine = "test"

    def _start_engine(self) -> str:
        self.silent: list[socket.socket] = []
        return "127.0.0.1"

    def _ship(self, payload: bytes) -> Any:
        self.silent.append(socket.create_connection(self._port.address))
        return payload

    def _launch(self, launch: int, args: tuple) -> Any:
        thread = threading.Thread(target=serve, args=args, daemon=True)
        thread.start()
        return thread

    def _launch_ended(self, handle: Any) -> str | None:
        return None if handle.is_alive() else "ended"


def double(item):
    return item * 2, {"value": item * 2}


def test_a_silent_connection_does_not_stall_the_workers_handshake(monkeypatch):
    monkeypatch.setattr(_worker_port, "_HANDSHAKE_S", 1.0)
    backend = _ThreadEngine(workers=2)
    runs: list[Any] = []
    trainer = threading.Thread(
        target=lambda: runs.append(mm.train(double, mm.items(list(range(6))), backend=backend,
                                            progress=False)),
        daemon=True)
    trainer.start()
    try:
        trainer.join(60)  # a guard against a hang, not a timing: the peer never speaks
        assert not trainer.is_alive(), "the run stalled behind a connection that said nothing"
        # and the silent peer itself is dropped once its handshake's deadline passes
        silent = backend.silent[0]
        silent.settimeout(60)
        while silent.recv(4096):  # the driver's challenge, then the end of the stream
            pass
    finally:
        for sock in getattr(backend, "silent", []):
            sock.close()
        trainer.join(60)
    run = runs[0]
    assert (run.results["status"] == "ok").all()
    assert sorted(run.results["value"]) == [0, 2, 4, 6, 8, 10]


def test_the_worker_port_binds_to_the_address_the_engine_uses():
    assert bind_address("127.0.0.1") == "127.0.0.1"
    assert bind_address("localhost") == "127.0.0.1"
    # an address of this host: that interface only, not every interface
    here = _an_address_of_this_host()
    if here is not None:
        assert bind_address(here) == here
    # an address no interface here has (behind NAT): every interface, as before
    assert bind_address("192.0.2.254") == ""


def _an_address_of_this_host() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: only picks the route
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "192.0.2.254" else address


# -- item 9: evaluate= checked against the files' columns before work ------------


def _never_called(df):
    raise AssertionError("fit ran: evaluate= was not checked before work")


@pytest.mark.parametrize("evaluate, columns, culprit", [
    (lambda: mm.holdout(target="nope"), None, "target column 'nope'"),
    (lambda: mm.kfold(target="y", features=["x", "nope"]), None, "feature column 'nope'"),
    (lambda: mm.backtest(time="nope", horizon=2, target="y"), None, "time column 'nope'"),
    (lambda: mm.holdout(target="y"), ["x"], "target column 'y'"),  # y is not read
])
def test_read_on_workers_checks_evaluate_columns_before_work(tmp_path, sales, evaluate,
                                                            columns, culprit):
    path = tmp_path / "sales.parquet"
    pq.write_table(pa.Table.from_pandas(sales, preserve_index=False), path)
    messages = []
    for lazy in (False, True):
        source = mm.groups(path, by="store", columns=columns, read_on_workers=lazy)
        with pytest.raises(ValueError, match=f"evaluate: {culprit} is not in the table") as err:
            mm.train(_never_called, source, evaluate=evaluate(), backend="serial",
                     progress=False)
        messages.append(str(err.value))
    assert messages[0] == messages[1]  # the same message as reading on the driver


def test_read_on_workers_refuses_an_unsortable_time_column_before_work(tmp_path):
    frame = pd.DataFrame({"g": ["a"] * 6, "t": [[i] for i in range(6)], "y": range(6)})
    path = tmp_path / "lists.parquet"
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    with pytest.raises(ValueError, match="time column 't' cannot be sorted"):
        mm.train(_never_called, mm.groups(path, by="g", read_on_workers=True),
                 evaluate=mm.backtest(time="t", horizon=2, target="y"), backend="serial",
                 progress=False)


# -- item 4: backtest windows cut on time boundaries -----------------------------


def test_backtest_never_trains_on_a_day_it_tests_with_several_rows_a_day():
    days = pd.date_range("2024-01-01", periods=20)
    frame = pd.DataFrame({"g": "a", "date": days.repeat(2), "x": np.arange(40.0),
                          "y": np.arange(40.0) * 2})
    frame = frame.sample(frac=1.0, random_state=1).reset_index(drop=True)  # unsorted
    trained: list[set] = []
    tested: list[set] = []

    def fit(df):
        trained.append(set(df["date"]))
        return _Mean(float(df["y"].mean()))

    def test_days(model, test):
        tested.append(set(test["date"]))
        return {}

    run = mm.train(fit, mm.groups(frame, by="g"), backend="serial", progress=False,
                   evaluate=mm.backtest("date", horizon=5, windows=3, step=3, target="y",
                                        metrics=["mae", test_days]))
    assert len(tested) == 3 and len(trained) == 4  # three windows, then the refit
    for w, (train, test) in enumerate(zip(trained, tested)):
        assert not train & test, f"window {w} trains on a day it tests"
        assert max(train) < min(test)
        start = 20 - 5 - (2 - w) * 3  # in days, as for one row a day
        assert test == set(days[start:start + 5]) and train == set(days[:start])
    windows = run.evaluation
    assert list(windows["n_test"]) == [10, 10, 10]  # both rows of each of 5 days
    assert list(windows["n_train"]) == [18, 24, 30]
    assert list(windows["cutoff"]) == [days[start - 1] for start in (9, 12, 15)]


def test_backtest_too_few_days_is_skipped_naming_the_times():
    frame = pd.DataFrame({"g": "a", "date": pd.date_range("2024-01-01", periods=6).repeat(3),
                          "x": np.arange(18.0), "y": np.arange(18.0)})
    run = mm.train(lambda df: _Mean(float(df["y"].mean())), mm.groups(frame, by="g"),
                   backend="serial", progress=False,
                   evaluate=mm.backtest("date", horizon=3, windows=2, target="y"))
    # 18 rows would do by row count; 6 days do not
    assert "needs at least 7 distinct 'date' values, has 6 (in 18 rows)" in \
        run.results.loc[0, "eval_skipped"]


class _Mean:
    def __init__(self, value: float) -> None:
        self.value = value

    def predict(self, X):
        return np.full(len(X), self.value)
