"""The live dashboard: its JSON endpoints, its refusals, and its page in a real
headless Chromium while a real run (another process) writes the store."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import manymodels as mm
from manymodels.observe.dashboard import DashboardServer

SCRIPT_KEY = "<script>document.title='pwned'</script>"


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("chromium is not installed (`make test` installs Debian's chromium)")
    return found


def dump_dom(url: str, tmp_path: Path, budget_ms: int = 4000) -> str:
    """The page's DOM after its scripts ran (and polled) for ``budget_ms``."""
    result = subprocess.run(
        [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
         f"--virtual-time-budget={budget_ms}", "--dump-dom", url],
        capture_output=True, text=True, timeout=180)
    assert "<body" in result.stdout, result.stderr[-2000:]
    return result.stdout


def text_of(dom: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert found, f"no #{element_id} in the page"
    return html.unescape(found.group(1))


def number(dom: str, element_id: str) -> int:
    return int(text_of(dom, element_id).replace(",", ""))


def get(url: str, **headers: str) -> tuple[int, dict]:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def at(server: DashboardServer, path: str) -> str:
    """``path`` on ``server``, with its token."""
    return f"{server.address}{path}{'&' if '?' in path else '?'}token={server.token}"


def fit_small(item):
    if item in ("k017", SCRIPT_KEY):
        raise ValueError(f"bad item {item}")
    return {"score": len(item) + int(item[1:]) / 100 if item[1:].isdigit() else 0.0}


@pytest.fixture
def finished_store(tmp_path):
    store = tmp_path / "store"
    mm.train(fit_small, mm.items([f"k{i:03d}" for i in range(60)] + [SCRIPT_KEY]),
             backend="threads", workers=2, progress=False, store=store)
    return store


def test_json_endpoints_answer_from_sql(finished_store):
    with DashboardServer(finished_store) as server:
        status, runs = get(at(server, "api/runs"))
        assert status == 200 and len(runs["runs"]) == 1
        run = runs["runs"][0]
        assert (run["status"], run["tasks"], run["done"], run["ok"], run["failed"]) == (
            "finished", 61, 61, 59, 2)
        _, summary = get(at(server, "api/run/1/summary"))
        assert summary["counts"] == {"ok": 59, "failed": 2} and summary["key_columns"] == ["item"]
        _, durations = get(at(server, "api/run/1/durations"))
        assert sum(durations["counts"]) == 61
        _, metrics = get(at(server, "api/run/1/metrics"))
        assert metrics["charts"][0]["name"] == "score" and metrics["charts"][0]["n"] == 59
        _, failures = get(at(server, "api/run/1/failures?q=k017"))
        assert failures["total"] == 2 and failures["matching"] == 1
        assert failures["items"][0]["key"] == "k017"
        assert "ValueError: bad item k017" in failures["items"][0]["error"]
        _, timeline = get(at(server, "api/run/1/timeline"))
        assert len(timeline["bars"]) == 61 and set(timeline["workers"]) <= {0, 1}
        _, slowest = get(at(server, "api/run/1/slowest"))
        assert len(slowest) == 20
        assert [s["duration_s"] for s in slowest] == sorted(
            (s["duration_s"] for s in slowest), reverse=True)
        with urllib.request.urlopen(at(server, "report/1"), timeout=60) as answer:
            report = answer.read().decode()
        assert "Worker timeline" in report and "ValueError: bad item k017" in report
        assert get(at(server, "api/run/9"))[0] == 404
        assert get(at(server, "api/run/1/nothing"))[0] == 404
        # a page elsewhere that rebinds its name to 127.0.0.1 is refused
        assert get(at(server, "api/runs"), Host="evil.example:80")[0] == 403


def test_a_non_loopback_address_needs_a_flag_and_then_a_token(finished_store):
    with pytest.raises(ValueError, match="not a loopback address.*--allow-remote"):
        DashboardServer(finished_store, host="0.0.0.0")
    with DashboardServer(finished_store, host="0.0.0.0", allow_remote=True) as server:
        assert server.token and f"?token={server.token}" in server.url
        base = f"http://127.0.0.1:{server.port}/"
        status, answer = get(base + "api/runs")
        assert status == 403 and "token is required" in answer["error"]
        assert get(base + "api/runs?token=wrong-token-value")[0] == 403
        assert get(base + f"api/runs?token={server.token}")[0] == 200
        with pytest.raises(urllib.error.HTTPError, match="403"):
            urllib.request.urlopen(base, timeout=30)  # the page itself too
    result = subprocess.run(
        [sys.executable, "-m", "manymodels.cli", "dashboard", str(finished_store),
         "--host", "0.0.0.0"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"})
    assert result.returncode != 0 and "--allow-remote" in result.stderr


def test_the_command_serves_a_store(finished_store):
    server = subprocess.Popen(
        [sys.executable, "-m", "manymodels.cli", "dashboard", str(finished_store)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = server.stdout.readline()
        url, token = re.search(r"(http://127\.0\.0\.1:\d+/)\?token=(\S+)", line).groups()
        status, runs = get(url + f"api/runs?token={token}")
        assert status == 200 and runs["runs"][0]["done"] == 61
    finally:
        server.terminate()
        server.wait(timeout=60)
    result = subprocess.run(
        [sys.executable, "-m", "manymodels.cli", "dashboard", str(finished_store.parent)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert result.returncode != 0 and "not a manymodels store" in result.stderr


def test_train_with_dashboard_serves_while_the_run_lasts(tmp_path, capsys):
    seen = {}

    class Look(mm.Callback):  # looks at the dashboard from inside the run
        def on_batch(self, progress):
            if not seen:
                printed = capsys.readouterr().err
                url, token = re.search(
                    r"dashboard: (http://127\.0\.0\.1:\d+/)\?token=([\w-]+)#run=1",
                    printed).groups()
                seen["url"] = url
                seen["runs"] = get(f"{url}api/runs?token={token}")[1]["runs"]

    mm.train(fit_small, mm.items([f"k{i:03d}" for i in range(5)]), backend="threads",
             progress=False, store=tmp_path / "store", dashboard=True, callbacks=[Look()])
    assert seen["runs"][0]["status"] == "running" and seen["runs"][0]["tasks"] == 5
    with pytest.raises(urllib.error.URLError):  # and stops with it
        urllib.request.urlopen(seen["url"] + "api/runs", timeout=10)


_LIVE_RUN = """
import os, sys, time
import manymodels as mm
GATE = sys.argv[2]
def fit(item):
    if int(item[1:4]) >= 40:  # the second part waits for the test to open the gate
        deadline = time.time() + 120
        while not os.path.exists(GATE) and time.time() < deadline:
            time.sleep(0.02)
    if item == "k017" or item.startswith("k070"):
        raise ValueError(f"bad item {item}")
    return {"score": int(item[1:4]) / 10}
items = [f"k{i:03d}" for i in range(70)] + ["k070" + %r]
mm.train(fit, mm.items(items), backend="threads", workers=2, progress=False,
         store=sys.argv[1])
"""


def test_the_page_follows_a_live_run_in_chromium(tmp_path):
    _chromium()
    store, gate = tmp_path / "store", tmp_path / "gate"
    script = tmp_path / "live_run.py"
    script.write_text(textwrap.dedent(_LIVE_RUN) % SCRIPT_KEY)
    writer = subprocess.Popen([sys.executable, str(script), str(store), str(gate)],
                              stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (store / "index.sqlite").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with DashboardServer(store) as server:
            while time.monotonic() < deadline:  # the first part committed (once a second)
                runs = get(at(server, "api/runs"))[1].get("runs")  # 503 while it is made
                if runs and runs[0]["done"] >= 20:
                    break
                time.sleep(0.1)
            during = dump_dom(server.url, tmp_path)
            assert text_of(during, "run-status") == "running"
            done_during = number(during, "done")
            assert 20 <= done_during <= 40 and number(during, "total") == 71
            gate.touch()
            assert writer.wait(timeout=120) == 0, writer.stderr.read()[-3000:]
            after = dump_dom(server.url, tmp_path)
    finally:
        gate.touch()
        writer.kill()
    assert text_of(after, "run-status") == "finished"
    assert number(after, "done") == 71 > done_during  # the counts advanced
    assert number(after, "count-failed") == 2 and number(after, "count-ok") == 69
    assert "threads, 2 workers · keys" in text_of(after, "run-detail")
    assert int(re.search(r'data-polls="(\d+)"', after).group(1)) >= 1
    # the failure with its traceback, and the <script> key shown as text, inert
    assert "ValueError: bad item k017" in html.unescape(after)
    assert html.escape(SCRIPT_KEY, quote=False) in after
    assert after.count("<script") == 1  # the page's own app.js, nothing injected
    assert "<title>manymodels dashboard</title>" in after  # the key's script never ran
    assert after.count('class="failure"') == 2 and after.count("<rect") >= 71
    with DashboardServer(store) as server:  # the search box, given in the address
        found = dump_dom(server.url + "&q=k017", tmp_path, budget_ms=2500)
    assert found.count('class="failure"') == 1 and "bad item k017" in found


def _million_store(path: Path, tasks: int) -> None:
    """A finished run of ``tasks`` tasks, its rows written in bulk through the
    store's own writer (no fit is called: the test is about reading)."""
    import pyarrow as pa

    from manymodels.identity.hashing import TaskIdentities
    from manymodels.inputs.keys import encode_keys
    from manymodels.store.writer import StoreWriter

    store = mm.Store(path)
    store._make()  # a new store, written to through its internals
    start = time.time() - 3600
    run_id = store._conn.execute(
        "INSERT INTO runs(started_at, finished_at, status, backend, workers, source, fit, "
        "tasks, ok, failed, reused, wall_s, key_columns, param_columns, code_detail) "
        "VALUES (?, ?, 'finished', 'processes', 16, 'groups(...)', 'bench.fit', ?, ?, ?, 0, "
        "3600, '[\"store\", \"item\"]', '[]', '{}')",
        (start, start + 3600, tasks, tasks - tasks // 1000, tasks // 1000)).lastrowid
    store.close()
    keys = encode_keys([(f"s{i // 1000:04d}", f"i{i % 1000:03d}") for i in range(tasks)])
    hashes = pa.array([f"{i:032x}" for i in range(tasks)], pa.string())
    nothing = pa.nulls(tasks, pa.string())
    writer = StoreWriter(path, path, run_id, keys, TaskIdentities(hashes, nothing, hashes, None))
    for first in range(0, tasks, 200_000):
        rows = range(first, min(first + 200_000, tasks))
        writer.put({
            "task_index": list(rows),
            "status": ["failed" if i % 1000 == 7 else "ok" for i in rows],
            "attempts": [1] * len(rows),
            "duration_s": [0.01 + (i % 97) / 1000 for i in rows],
            "started_at": [start + (i // 16) * 0.057 for i in rows],
            "worker": [i % 16 for i in rows],
            "metrics": [f'{{"rmse": {(i % 89) / 10}}}' for i in rows],
            "error": [f"Traceback...\nValueError: bad group {i}" if i % 1000 == 7 else None
                      for i in rows],
            "model": [None] * len(rows)})
    writer.wait()
    writer.close()
    assert writer.error is None


@pytest.mark.slow
def test_a_million_tasks_render_in_chromium(tmp_path):
    _chromium()
    tasks = 1_000_000
    began = time.perf_counter()
    _million_store(tmp_path / "store", tasks)
    print(f"\nwrote {tasks:,} task rows in {time.perf_counter() - began:.1f} s")
    with DashboardServer(tmp_path / "store") as server:  # a finished run's answers are
        began = time.perf_counter()                      # kept: each server asks afresh
        page = dump_dom(server.url, tmp_path, budget_ms=3000)
        page_s = time.perf_counter() - began
    with DashboardServer(tmp_path / "store") as server:
        began = time.perf_counter()
        status, everything = get(at(server, "api/run/1"))
        api_s = time.perf_counter() - began
        assert status == 200 and everything["summary"]["done"] == tasks
        assert len(everything["timeline"]["bars"]) <= 4100  # a sample, never a million
        assert everything["failures"]["total"] == tasks // 1000
    assert number(page, "done") == tasks and number(page, "count-failed") == tasks // 1000
    print(f"1M tasks: all sections of the run in {api_s:.2f} s (server, uncached); the page "
          f"in Chromium (start, load, two polls, render, dump) in {page_s:.2f} s")


def test_a_run_whose_driver_died_shows_interrupted(finished_store):
    import socket
    import sqlite3

    with sqlite3.connect(finished_store / "index.sqlite") as conn:  # killed mid-run
        conn.execute("UPDATE runs SET status = 'running', finished_at = NULL, ok = NULL, "
                     "driver = ?", (f"{socket.gethostname()}:1:0.0",))
    with DashboardServer(finished_store) as server:
        run = get(at(server, "api/runs"))[1]["runs"][0]
        assert run["status"] == "interrupted" and run["done"] == 61 and run["eta_s"] is None
        assert get(at(server, "api/run/1/summary"))[1]["status"] == "interrupted"


def test_a_running_runs_reused_count_is_its_tasks_so_far(finished_store):
    """/api/runs gave reused null for a running run (its row says it at the
    end), where its summary counted them."""
    import sqlite3

    from manymodels.observe.dashboard.queries import Queries
    from manymodels.store.drivers import driver_label

    mm.train(fit_small, mm.items([f"k{i:03d}" for i in range(60)] + [SCRIPT_KEY]),
             backend="threads", workers=2, progress=False, store=finished_store)
    with sqlite3.connect(finished_store / "index.sqlite") as conn:  # still being written
        conn.execute("UPDATE runs SET status = 'running', finished_at = NULL, ok = NULL, "
                     "failed = NULL, reused = NULL, driver = ? WHERE run_id = 2",
                     (driver_label(),))
    run = Queries(finished_store).runs()[0]
    assert (run["run_id"], run["status"], run["reused"]) == (2, "running", 59)


def test_a_host_name_that_resolves_to_loopback_is_refused_all_the_same(finished_store,
                                                                        monkeypatch):
    """DNS rebinding: a page elsewhere makes its own name resolve to
    127.0.0.1; the check resolved the request's Host name, and let it in."""
    import socket

    real = socket.getaddrinfo

    def rebound(host, *args, **kwargs):
        if host == "rebind.example":
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", 0))]
        return real(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebound)
    with DashboardServer(finished_store) as server:
        port = server.url.split(":")[2].split("/")[0]
        assert get(at(server, "api/runs"), Host=f"rebind.example:{port}")[0] == 403
        assert get(at(server, "api/runs"), Host=f"localhost:{port}")[0] == 200
        assert get(at(server, "api/runs"), Host=f"127.0.0.1:{port}")[0] == 200
        for host in (f"[::1]:{port}", "[::1]"):  # (without a port: it was refused)
            assert get(at(server, "api/runs"), Host=host)[0] == 200


LIVE_DRIVER = """
import sys, time
import manymodels as mm

def slow(item):
    time.sleep(0.5)
    return item

mm.train(slow, mm.items(range(200)), store=sys.argv[1], dashboard=True, workers=2,
         progress=False)
"""


def test_a_runs_dashboard_ends_with_a_killed_driver(tmp_path):
    """Its workers died with a SIGKILLed driver; its dashboard served on."""
    import psutil

    script = tmp_path / "driver.py"
    script.write_text(LIVE_DRIVER)
    driver = subprocess.Popen([sys.executable, str(script), str(tmp_path / "store")],
                              stderr=subprocess.PIPE, text=True)
    try:
        assert "manymodels dashboard: http" in driver.stderr.readline()
        boards = [p for p in psutil.Process(driver.pid).children()
                  if "dashboard" in " ".join(p.cmdline())]
        assert len(boards) == 1
    finally:
        driver.kill()
        driver.wait(timeout=30)
        driver.stderr.close()
    gone, alive = psutil.wait_procs(boards, timeout=30)
    assert not alive, "the dashboard outlived its killed driver"


def fail_all_but_every_tenth(item):
    if item % 10:
        raise ValueError(f"bad item {item}")
    return {"score": float(item)}


def test_a_page_of_many_failures_says_it_lists_the_first(tmp_path):
    """Under "Failures (72)" the page listed 50 as if they were all: the
    answer and the page now say that they are the first 50, as the HTML
    report does; a search that matches fewer says nothing."""
    from manymodels.observe.dashboard import queries

    store = tmp_path / "store"
    mm.train(fail_all_but_every_tenth, mm.items(range(80)), backend="serial", progress=False,
             store=store)
    with DashboardServer(store) as server:
        _, failures = get(at(server, "api/run/1/failures"))
        assert (failures["total"], len(failures["items"])) == (72, queries.FAILURES)
        note = (f"The first {queries.FAILURES} of 72, in task order; search keys and errors "
                "to find others, or read them all with mm.Store(path).results(run).")
        assert failures["note"] == note
        _, found = get(at(server, "api/run/1/failures?q=bad%20item%207"))  # 7, 71 to 79
        assert found["matching"] == len(found["items"]) == 10 and found["note"] == ""
        dom = dump_dom(server.url, tmp_path)  # its only run
    assert text_of(dom, "failures-count") == "(72)"
    assert text_of(dom, "failures-note") == note


def fail_old(item):
    if item.startswith("old"):
        raise ValueError(f"bad item {item}")
    return {"score": 1.0}


def test_a_store_made_again_at_its_path_is_shown_as_it_is_now(tmp_path):
    store = tmp_path / "store"
    mm.train(fail_old, mm.items(["old1", "old2", "x"]), backend="serial", progress=False,
             store=store)
    with DashboardServer(store) as server:
        for search in ("", "old"):  # kept answers, and kept tasks (a search is not kept)
            assert get(at(server, f"api/page?q={search}"))[1]["run"]["summary"]["tasks"] == 3
        shutil.rmtree(store)  # rm -rf, and a new run 1 there, while the dashboard serves
        mm.train(fail_old, mm.items(["new1", "new2", "new3", "new4", "old5"]),
                 backend="serial", progress=False, store=store)
        for search in ("", "old"):
            page = get(at(server, f"api/page?q={search}"))[1]
            assert page["runs"][0]["tasks"] == page["run"]["summary"]["tasks"] == 5
            assert page["run"]["summary"]["counts"] == {"failed": 1, "ok": 4}
            assert [item["key"] for item in page["run"]["failures"]["items"]] == ["old5"]


def fail_on_the_second_day(rows):
    if rows["day"].iloc[0].day == 2:
        raise ValueError("no model for day 2")
    return {"score": 1.0}


def test_keys_of_dates_and_missing_values_read_as_the_report_writes_them(tmp_path):
    import pandas as pd

    from manymodels.observe.dashboard.queries import Queries

    days = pd.to_datetime(["2024-01-01", "2024-01-02"]).repeat(2)
    table = pd.DataFrame({"day": days, "shop": ["a", None] * 2, "y": range(4)})
    mm.train(fail_on_the_second_day, mm.groups(table, by=["day", "shop"]),
             backend="serial", progress=False, store=tmp_path / "store")
    found = Queries(tmp_path / "store").page(search="2024-01-02 00:00:00, A")["run"]
    assert [item["key"] for item in found["failures"]["items"]] == ["2024-01-02 00:00:00, a"]
    assert sorted(key for key in found["timeline"]["keys"]) == [
        "2024-01-01 00:00:00, None", "2024-01-01 00:00:00, a",
        "2024-01-02 00:00:00, None", "2024-01-02 00:00:00, a"]


def test_a_port_in_use_is_named_with_a_way_out(finished_store):
    import socket

    from conftest import run_cli

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli("dashboard", finished_store, "--port", port)
    assert done.returncode == 2
    said = " ".join(done.stderr.replace("│", " ").split())
    assert f"cannot serve on 127.0.0.1 port {port}: Address already in use" in said
    assert "--port 0 picks a free one" in said


def test_an_ended_runs_report_is_made_once_for_every_click(finished_store, monkeypatch):
    """A report of a million tasks takes seconds and most of a gigabyte to
    make: the dashboard makes an ended run's once and answers each click
    with it (the real report, its making counted)."""
    from manymodels.observe import report

    made = []
    real = report.store_report
    monkeypatch.setattr(report, "store_report", lambda *args: made.append(1) or real(*args))
    with DashboardServer(finished_store) as server:
        bodies = []
        for _ in range(3):
            with urllib.request.urlopen(at(server, "report/1"), timeout=60) as answer:
                bodies.append(answer.read())
    assert len(made) == 1 and bodies[0] == bodies[1] == bodies[2]
    assert b"Worker timeline" in bodies[0]


def test_the_page_says_how_many_runs_the_store_holds_beyond_those_listed(tmp_path):
    """The runs table lists the newest runs (100) and said nothing of the others."""
    from manymodels.observe.dashboard.queries import Queries

    for _ in range(3):
        mm.train(fit_small, mm.items(["k001"]), backend="serial", progress=False,
                 store=tmp_path / "store", reuse=False)
    page = Queries(tmp_path / "store").page(limit=2)
    assert [run["run_id"] for run in page["runs"]] == [3, 2] and page["runs_total"] == 3


def test_a_store_held_locked_is_said_busy_never_read_stale(finished_store, monkeypatch):
    """A read-only open that found the index locked fell back to SQLite's
    ``immutable``, which reads the index file alone: the writes in the WAL
    were not seen, nor any made later, for as long as the dashboard ran.
    Where the store's folder can be written, it says the store is busy,
    and the next poll reads it as it is."""
    import gc
    import sqlite3

    from manymodels.observe.dashboard.queries import Queries
    from manymodels.store import database

    monkeypatch.setattr(database, "READ_BUSY_S", 0.1, raising=False)
    gc.collect()  # (the fixture's run's own connections, in a reference cycle)
    writer = sqlite3.connect(finished_store / "index.sqlite", isolation_level=None)
    writer.execute("PRAGMA locking_mode=EXCLUSIVE")
    writer.execute("UPDATE runs SET fit = 'written while locked'")
    queries = Queries(finished_store)
    with pytest.raises(mm.StoreError, match="index.sqlite' could not be read .*locked"):
        queries.runs()
    writer.close()
    assert queries.runs()[0]["fit"] == "written while locked"


def test_the_answers_kept_of_ended_runs_are_bounded(tmp_path, monkeypatch):
    """Each ended run's answers were kept for as long as the dashboard ran:
    a store of thousands of runs, clicked through, grew it without bound.
    The answers of the last ENDED_RUNS_KEPT runs asked about are kept."""
    from manymodels.observe.dashboard import queries as dashboard_queries

    monkeypatch.setattr(dashboard_queries, "ENDED_RUNS_KEPT", 2, raising=False)
    store = tmp_path / "store"
    for _ in range(3):
        mm.train(fit_small, mm.items(["k001", "k002"]), backend="serial", progress=False,
                 store=store, reuse=False)
    queries = dashboard_queries.Queries(store)
    for run_id in (1, 2, 3):
        assert queries.run(run_id)["summary"]["tasks"] == 2
    assert {kept[0] for kept in queries._finished} == {2, 3}
