"""Issue 37, the dashboard: a token asked on loopback too, kept in a cookie
(item 3); a silent connection closed after a read timeout (item 12); a
running run's ETA from the tasks' own clocks, and one page poll counted from
one read of the store (item 19). Real stores, real servers, real sockets."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.observe.dashboard import DashboardServer
from manymodels.observe.dashboard.queries import Queries
from manymodels.store import database, newstore, taskblocks


def request(url: str, **headers: str) -> tuple[int, dict, str]:
    """Status, headers and body of a GET."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=60) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def fit(item):
    if item == "k3":
        raise ValueError("bad item k3")
    return {"score": float(item[1:])}


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "store"
    mm.train(fit, mm.items([f"k{i}" for i in range(8)]), backend="serial", progress=False,
             store=path)
    return path


# -- item 3: a token on loopback too ------------------------------------------------------


def test_a_loopback_dashboard_asks_for_its_token_then_takes_the_cookie(store):
    with DashboardServer(store) as server:
        base = f"http://127.0.0.1:{server.port}/"
        failures = f"{base}api/run/1/failures"
        status, _, body = request(failures)  # another local account, no token
        assert status == 403 and "token is required" in body and "bad item" not in body
        status, headers, body = request(f"{failures}?token={server.token}")
        assert status == 200 and "ValueError: bad item k3" in json.loads(body)["items"][0][
            "error"]
        cookie = headers["Set-Cookie"]
        pair, *attributes = [part.strip() for part in cookie.split(";")]
        assert pair == f"manymodels-dashboard-{server.port}={server.token}"
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(attributes)
        status, headers, body = request(failures, Cookie=f"other=1; {pair}")
        assert status == 200 and "bad item k3" in body and "Set-Cookie" not in headers
        assert request(f"{failures}?token=wrong-token-value")[0] == 403
        assert request(failures, Cookie=f"manymodels-dashboard-{server.port}=wrong-token")[
            0] == 403
        # another port's dashboard's cookie (cookies are not told apart by port)
        assert request(failures, Cookie=f"manymodels-dashboard-1={server.token}")[0] == 403
        assert request(base)[0] == 403  # the page too
        assert server.url == f"{server.address}?token={server.token}" == f"{base}?token=" + (
            server.token)
        assert request(server.url)[0] == 200
        status, headers, _ = request(f"{base}static/app.js")  # no data, no token
        assert status == 200 and "Set-Cookie" not in headers


def test_no_token_must_be_asked_for_and_only_on_loopback(store):
    with pytest.warns(UserWarning, match="every account on this machine"):
        server = DashboardServer(store, token="")
    with server:
        assert server.url == server.address
        assert request(f"{server.address}api/run/1/failures")[0] == 200
    with pytest.raises(ValueError, match="loopback only"):
        DashboardServer(store, host="0.0.0.0", allow_remote=True, token="")
    with pytest.raises(ValueError, match="token must be 8 characters"):
        DashboardServer(store, token="a;b=cdefgh")
    for flags, warned in (([], False), (["--no-token"], True)):
        served = subprocess.Popen(
            [sys.executable, "-m", "manymodels.cli", "dashboard", str(store), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = served.stdout.readline()
            found = re.search(r"(http://127\.0\.0\.1:\d+/)(\?token=[\w-]{20,})?\s", line)
            assert found and (found.group(2) is None) == warned, line
            if warned:
                assert "every account" in served.stderr.readline()
            url = found.group(1) + "api/runs"
            assert request(url)[0] == (200 if warned else 403)
            assert request(url + (found.group(2) or ""))[0] == 200
        finally:
            served.terminate()
            served.wait(timeout=60)
    refused = subprocess.run(
        [sys.executable, "-m", "manymodels.cli", "dashboard", str(store), "--no-token",
         "--token", "abcdefgh12"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"})
    assert refused.returncode != 0 and "not both" in refused.stderr


# -- item 12: a silent connection holds a thread no more -----------------------------------


def test_a_silent_connection_is_closed_while_others_are_answered(store):
    with pytest.raises(ValueError, match="timeout"):
        DashboardServer(store, timeout=0)
    with DashboardServer(store, timeout=0.5) as server:
        silent = socket.create_connection(("127.0.0.1", server.port))
        half = socket.create_connection(("127.0.0.1", server.port))
        half.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
        try:
            status, _, body = request(f"{server.url}&x=1")  # answered meanwhile
            assert status == 200 and "<html" in body
            for idle in (silent, half):
                idle.settimeout(60)
                assert idle.recv(1024) == b""  # the server hung up
        finally:
            silent.close()
            half.close()


# -- item 19: the ETA, and one poll counted once -------------------------------------------


def running_run(path, tasks: int, workers: int, started_at: float) -> int:
    """A store with one running run (of this process) and no task yet."""
    newstore.prepare_directory(path)
    conn = database.connect(path)
    conn.execute("BEGIN IMMEDIATE")
    run_id = database.insert_run(conn, backend="processes", workers=workers,
                                 source="items(...)", fit="tests.fit", tasks=tasks,
                                 key_columns=["item"], param_columns=[], code_detail={})
    conn.execute("UPDATE runs SET started_at = ? WHERE run_id = ?", (started_at, run_id))
    conn.execute("COMMIT")
    conn.close()
    return run_id


def write_tasks(path, run_id: int, indices, started, duration, reused: bool = False) -> None:
    indices = np.asarray(indices)
    conn = database.connect(path)
    conn.execute("BEGIN IMMEDIATE")
    taskblocks.insert(conn, run_id, taskblocks.table({
        "task_index": indices,
        "key": [json.dumps([f"k{i}"]) for i in indices],
        "identity": [f"{i:032x}" for i in indices],
        "status": ["ok"] * len(indices),
        "attempts": [0 if reused else 1] * len(indices),
        "duration_s": [None if reused else d for d in np.broadcast_to(duration, len(indices))],
        "started_at": [None if reused else s for s in np.broadcast_to(started, len(indices))],
        "worker": [None if reused else int(i % 4) for i in indices],
        "reused_from": [1 if reused else None for _ in indices]}))
    conn.execute("COMMIT")
    conn.close()


def test_the_eta_counts_from_the_tasks_not_from_the_runs_slow_start(tmp_path):
    now = time.time()
    path = tmp_path / "store"
    # 60 s of planning and starting workers; then 4 workers, 0.1 s a task
    run_id = running_run(path, 4000, workers=4, started_at=now - 65)
    write_tasks(path, run_id, range(2), now - 5, 0.1)
    first = Queries(path).runs()[0]
    assert first["done"] == 2 and first["eta_s"] is None  # 2 tasks, 4 workers: too soon
    assert first["rate"] is None
    write_tasks(path, run_id, range(200, 400), reused=True, started=0, duration=0)
    indices = np.arange(2, 200)
    write_tasks(path, run_id, indices, now - 5 + (indices // 4) * 0.1, 0.1)
    run = Queries(path).runs()[0]
    # 200 trained in the 5 s from the first start to the last end: 40 a second
    assert run["done"] == 400 and run["rate"] == pytest.approx(40.0)
    assert run["eta_s"] == pytest.approx((4000 - 400) / 40.0)  # not 3600 / (200 / 65 s)


def test_tasks_ending_together_are_not_taken_for_a_burst(tmp_path):
    now = time.time()
    path = tmp_path / "store"
    run_id = running_run(path, 100, workers=4, started_at=now - 120)
    write_tasks(path, run_id, range(4), now - 61, 60.0)  # four 60-s tasks, ended at once
    run = Queries(path).runs()[0]
    assert run["rate"] == pytest.approx(4 / 60) and run["eta_s"] == pytest.approx(96 * 15)


def test_one_poll_of_the_page_counts_its_run_once(tmp_path):
    """The page's runs table and its run's cards come from one answer, read
    at once: the same counts, while a real run writes the store."""
    seen = []

    class Poll(mm.Callback):
        server = None

        def on_batch(self, progress):
            if self.server is None:
                self.server = DashboardServer(tmp_path / "store").start()
            status, _, body = request(f"{self.server.address}api/page?run=1&token="
                                      f"{self.server.token}")
            assert status == 200, body
            seen.append(json.loads(body))

    def slow(item):
        time.sleep(0.01)
        return {"score": float(item[1:])}

    poll = Poll()
    try:
        mm.train(slow, mm.items([f"k{i}" for i in range(600)]), backend="threads", workers=2,
                 progress=False, store=tmp_path / "store", callbacks=[poll])
        status, _, body = request(f"{poll.server.address}api/page?token={poll.server.token}")
        seen.append(json.loads(body))  # the newest run when none is named
    finally:
        if poll.server is not None:
            poll.server.close()
    assert len(seen) > 2 and seen[-1]["run"]["summary"]["done"] == 600
    for page in seen:
        row, summary = page["runs"][0], page["run"]["summary"]
        assert (row["run_id"], row["status"]) == (summary["run_id"], summary["status"])
        assert row["done"] == summary["done"]
        assert row["ok"] == summary["counts"].get("ok", 0)
        assert row["failed"] == summary["failed"]
    assert len({page["runs"][0]["done"] for page in seen}) > 1  # it was polled as it ran


def test_a_run_stopped_by_max_failures_counts_its_cancelled_tasks_nowhere_as_done(tmp_path):
    """A run stopped by ``max_failures=`` leaves the tasks it never started
    ``cancelled``: the runs table, the run's summary (its progress bar) and
    its timeline count as done only the tasks that ran, the same number."""
    frame = pd.DataFrame({"store": np.repeat([f"s{i:02d}" for i in range(20)], 3),
                          "y": np.arange(60.0)})

    def fit_failing_three(rows):
        if rows["store"].iloc[0] in ("s03", "s04", "s05"):
            raise ValueError("no model for this store")
        return {"rmse": 1.0}

    with pytest.raises(mm.TooManyFailures):
        mm.train(fit_failing_three, mm.groups(frame, by="store"), backend="serial",
                 progress=False, store=tmp_path / "store", max_failures=1)
    page = Queries(tmp_path / "store").page(None)
    row, summary = page["runs"][0], page["run"]["summary"]
    ran = summary["counts"]["ok"] + summary["failed"]
    assert summary["counts"]["cancelled"] == 20 - ran > 0
    assert row["done"] == summary["done"] == ran
    assert page["run"]["timeline"]["total"] == ran


# -- second hostile pass --------------------------------------------------------------------


def test_a_report_of_a_run_with_no_task_written_yet_is_made(tmp_path):
    """The report (``manymodels report``, the dashboard's report link) of a
    run just started, no task committed yet, raised ``IndexError``."""
    from manymodels.observe.report import store_report

    run_id = running_run(tmp_path / "s", tasks=10, workers=2, started_at=time.time())
    text = store_report(mm.Store(tmp_path / "s", read_only=True), run_id,
                        tmp_path / "r.html").read_text()
    assert "10 (0 done)" in text and "No task ran." in text


def fail_long(item):
    raise ValueError("x" * 100_000 + f" END {item}")


def test_a_polls_failures_ship_the_end_of_each_error_only(tmp_path):
    """50 failures of a 100 kB message each made every poll of the page 5 MB."""
    from manymodels.observe.dashboard import queries

    mm.train(fail_long, mm.items(range(60)), store=tmp_path / "s", backend="serial",
             progress=False)
    page = Queries(tmp_path / "s").page()
    assert len(json.dumps(page)) < 60 * (queries.ERROR_CHARACTERS + 1000)
    items = page["run"]["failures"]["items"]
    assert items[0]["error"].rstrip().endswith(" END 0")
    assert "characters are left out; mm.Store(path).results(run) holds them" in items[0]["error"]
    assert len(mm.Store(tmp_path / "s").results()["error"].iloc[0]) > 100_000  # kept whole


def fail_with_its_item(item):
    raise ValueError(f"failed {item[-3:]}")


def test_a_long_key_is_cut_in_a_poll_and_found_by_a_search_whole(tmp_path):
    """A key of a long text item shipped whole in every poll (its slowest
    tasks, failures and timeline), the charts' docstring said cut."""
    items = [("k" * 50_000) + str(i) for i in range(3)]
    mm.train(fail_with_its_item, mm.items(items), store=tmp_path / "s", backend="serial",
             progress=False)
    page = Queries(tmp_path / "s").page()
    assert len(json.dumps(page)) < 50_000
    shown = page["run"]["failures"]["items"][0]["key"]
    assert shown.startswith("k" * 200) and shown.endswith("(50,001 characters)")
    found = Queries(tmp_path / "s").page(search="k" * 1000 + "2")["run"]["failures"]
    assert found["matching"] == 1
