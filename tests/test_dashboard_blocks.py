"""The dashboard's answers from task blocks: the same as the SQL on the old
``tasks`` table gave for the same rows, kept between polls of a live run and
brought up to date from the blocks written since (each decoded once)."""

from __future__ import annotations

import json
import math
import sqlite3
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from manymodels.observe.dashboard import queries as dashboard
from manymodels.observe.dashboard.queries import SECTIONS, Queries
from manymodels.observe.dashboard.runtasks import RunTasks
from manymodels.store import database, newstore, taskblocks

STATUSES = np.array(["ok"] * 12 + ["failed", "timeout", "crashed", "cancelled"])
SEARCHES = ("", "s3", "ÏTEM1", "ïtem", "bad 1", "BAD", "ValueError: bad 17\n", "nowhere")
OLD_COLUMNS = ", ".join(taskblocks.COLUMNS)


def task_rows(indices, seed: int = 0) -> pa.Table:
    """Tasks ``indices`` as a block: every status, reused tasks (some with a
    duration, which the charts must leave out), keys with upper-case and
    non-ASCII letters, distinct durations (the slowest have no ties)."""
    indices = np.asarray(indices, np.int64)
    rng = np.random.default_rng(seed)
    status = STATUSES[rng.integers(0, len(STATUSES), len(indices))]
    failed = np.isin(status, ["failed", "timeout", "crashed"])
    cancelled = status == "cancelled"
    reused = (status == "ok") & (rng.random(len(indices)) < 0.15)
    duration = 0.01 + (indices * 7919 % 100_003) / 1000 + seed / 1e6
    return taskblocks.table({
        "task_index": indices,
        "key": [json.dumps([f"S{i % 7}", f"Ïtem{i}"], ensure_ascii=False) for i in indices],
        "identity": [f"{i:032x}" for i in indices],
        "status": status,
        "attempts": np.where(cancelled, 0, 1 + indices % 3),
        "duration_s": [None if c else float(d) for c, d in zip(cancelled, duration)],
        "started_at": [None if c else 1000.0 + i * 0.05 for c, i in zip(cancelled, indices)],
        "worker": [None if c else int(i % 5) for c, i in zip(cancelled, indices)],
        "metrics": [json.dumps({"rmse": (i % 89) / 10, "r2": float(i % 13), "ok": True})
                    if s == "ok" else None for s, i in zip(status, indices)],
        "error": [f"Traceback...\nValueError: bad {i}\n" if f else None
                  for f, i in zip(failed, indices)],
        "reused_from": [7 if r else None for r in reused],
    })


def make_store(path: Path, tasks: int, status: str = "finished") -> tuple[sqlite3.Connection,
                                                                          int]:
    """A store with one run of ``tasks`` tasks (its row only)."""
    newstore.prepare_directory(path)
    conn = database.connect(path)
    conn.execute("BEGIN IMMEDIATE")
    run_id = database.insert_run(conn, backend="threads", workers=5, source="items(...)",
                                 fit="tests.fit", tasks=tasks, key_columns=["store", "item"],
                                 param_columns=[], code_detail={})
    conn.execute("UPDATE runs SET started_at = 900 WHERE run_id = ?", (run_id,))  # as its twin
    if status != "running":
        conn.execute("UPDATE runs SET status = ?, finished_at = 960, wall_s = 60, "
                     "ok = 0, failed = 0 WHERE run_id = ?", (status, run_id))
    conn.execute("COMMIT")
    return conn, run_id


def write_blocks(conn: sqlite3.Connection, run_id: int, *blocks: pa.Table) -> None:
    conn.execute("BEGIN IMMEDIATE")
    for block in blocks:
        taskblocks.insert(conn, run_id, block)
    conn.execute("COMMIT")


def write_old_rows(conn: sqlite3.Connection, run_id: int, *blocks: pa.Table) -> None:
    """The rows as a store written before blocks has them: a row per task in
    ``tasks`` (a task written again replaces its row, as the old writer did)."""
    conn.execute("BEGIN IMMEDIATE")
    for block in blocks:
        conn.executemany(
            f"INSERT OR REPLACE INTO tasks(run_id, {OLD_COLUMNS}) "
            f"VALUES (?{', ?' * len(taskblocks.COLUMNS)})",
            [(run_id, *row.values()) for row in block.to_pylist()])
    conn.execute("COMMIT")


def answer(queries: Queries, run_id: int, search: str = "") -> dict:
    """Every section, as one poll of the page asks them (uncached, unthrottled)."""
    memo: dict = {}
    return {name: queries.section(run_id, name, search, memo) for name in SECTIONS}


def ran(conn: sqlite3.Connection, run_id: int) -> int:
    """A run's done tasks in the old ``tasks`` table: those not cancelled."""
    return conn.execute("SELECT count(*) FROM tasks WHERE run_id = ? AND status != 'cancelled'",
                        (run_id,)).fetchone()[0]


def kept(queries: Queries, run_id: int) -> RunTasks:
    """The tasks ``queries`` keeps of run ``run_id``."""
    (tasks,) = [tasks for (kept_id, _), tasks in queries._cache.items() if kept_id == run_id]
    return tasks


def without_clock(answer: dict) -> dict:
    """A running run's answer less what depends on the time it is asked."""
    summary = {k: v for k, v in answer["summary"].items() if k not in ("wall_s", "utilization")}
    return {**answer, "summary": summary}


def old_sql(conn: sqlite3.Connection, run_id: int, tasks: int, search: str) -> dict:
    """The statements the dashboard ran on the ``tasks`` table before blocks."""
    failed = ("failed", "crashed", "timeout", "memory")
    marks = ",".join("?" * len(failed))
    groups = conn.execute(
        "SELECT status, count(*), sum(CASE WHEN reused_from IS NULL THEN duration_s END), "
        "count(reused_from), min(CASE WHEN reused_from IS NULL THEN duration_s END), "
        "max(CASE WHEN reused_from IS NULL THEN duration_s END) "
        "FROM tasks WHERE run_id = ? GROUP BY status", (run_id,)).fetchall()
    low = min(g[4] for g in groups if g[4] is not None)
    high = max(g[5] for g in groups if g[5] is not None)
    width = (high - low) / dashboard.BINS or 1.0
    buckets = [0] * dashboard.BINS
    for bucket, n in conn.execute(
            f"SELECT min(CAST((duration_s - ?) / ? AS INTEGER), {dashboard.BINS - 1}), "
            "count(*) FROM tasks WHERE run_id = ? AND duration_s IS NOT NULL AND "
            "reused_from IS NULL GROUP BY 1", (low, width, run_id)):
        buckets[bucket] = n
    where, args = f"run_id = ? AND status IN ({marks})", [run_id, *failed]
    total = conn.execute(f"SELECT count(*) FROM tasks WHERE {where}", args).fetchone()[0]
    if search:  # the key as the page shows it, in any case (Ï and ï alike)
        conn.create_function("shown_key_has", 2, lambda key, text: text.casefold() in (
            dashboard.key_label(key).casefold()), deterministic=True)
        where += " AND (shown_key_has(key, ?) OR instr(error, ?) > 0)"
        args += [search, search]
    return {
        "counts": {g[0]: g[1] for g in groups}, "task_time_s": sum(g[2] or 0.0 for g in groups),
        "reused": sum(g[3] for g in groups), "range": (low, high), "buckets": buckets,
        "running": conn.execute(
            "SELECT coalesce(sum(status != 'cancelled'), 0), coalesce(sum(status = 'ok'), 0), "
            "coalesce(sum(status IN "
            f"({marks})), 0) FROM tasks WHERE run_id = ?", (*failed, run_id)).fetchone(),
        "sample": conn.execute(
            "SELECT task_index, key, status, started_at, duration_s, worker, metrics "
            "FROM tasks WHERE run_id = ? AND (task_index * 2654435761) % 4294967291 % ? = 0 "
            "LIMIT ?", (run_id, max(1, math.ceil(tasks / dashboard.SAMPLE)),
                        dashboard.SAMPLE)).fetchall(),
        "slowest": conn.execute(
            "SELECT task_index, key, status, started_at, duration_s, worker, attempts "
            "FROM tasks WHERE run_id = ? AND duration_s IS NOT NULL AND reused_from IS NULL "
            "ORDER BY duration_s DESC LIMIT ?", (run_id, dashboard.SLOWEST)).fetchall(),
        "failures": (total, conn.execute(f"SELECT count(*) FROM tasks WHERE {where}",
                                         args).fetchone()[0],
                     conn.execute(f"SELECT key, status, attempts, worker, error FROM tasks "
                                  f"WHERE {where} ORDER BY task_index LIMIT ?",
                                  (*args, dashboard.FAILURES)).fetchall()),
    }


def assert_as_old_sql(queries: Queries, run_id: int, conn: sqlite3.Connection,
                      tasks: int) -> None:
    for search in SEARCHES:
        old = old_sql(conn, run_id, tasks, search)
        memo: dict = {}
        run = memo["run"] = queries.run_row(run_id)
        summary = queries._summary(run, memo)
        assert summary["counts"] == old["counts"] and summary["reused"] == old["reused"]
        # done: the tasks that ran, not those cancelled (never started)
        assert summary["done"] == sum(old["counts"].values()) - old["counts"].get("cancelled", 0)
        assert summary["task_time_s"] == pytest.approx(old["task_time_s"], rel=1e-12)
        assert memo["range"] == old["range"]
        assert queries._durations(run, memo)["counts"] == old["buckets"]
        assert queries._sample(run, memo) == old["sample"]
        assert queries._slowest_rows(run, memo) == old["slowest"]
        failures = queries._failures(run, memo, search)
        total, matching, items = old["failures"]
        assert (failures["total"], failures["matching"]) == (total, matching)
        assert [(dashboard.key_label(k), s, a, w, e or "") for k, s, a, w, e in items] == [
            tuple(item[name] for name in ("key", "status", "attempts", "worker", "error"))
            for item in failures["items"]]
        # no task of these runs resumed from a checkpoint (the old SQL had no such column)
        assert all(item["resumed_from"] == "" for item in failures["items"])


@pytest.fixture
def twin_stores(tmp_path, monkeypatch):
    """The same finished run's tasks in blocks (three blocks, some tasks
    written twice) and as old ``tasks`` rows; SAMPLE small enough to bind."""
    monkeypatch.setattr(dashboard, "SAMPLE", 150)
    first, second, third = (task_rows(range(0, 1200), 1), task_rows(range(1200, 2500), 2),
                            task_rows(np.r_[100:160, 2500:3000], 3))  # 100-159 rewritten
    blocks, run_id = make_store(tmp_path / "blocks", 3000)
    write_blocks(blocks, run_id, first, second, third)
    old, old_run = make_store(tmp_path / "old", 3000)
    write_old_rows(old, old_run, first, second, third)
    return (tmp_path / "blocks", tmp_path / "old", old, run_id)


def test_answers_from_blocks_are_the_old_sqls(twin_stores):
    blocks, old_store, old_conn, run_id = twin_stores
    from_blocks, from_old = Queries(blocks), Queries(old_store)
    assert old_conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 3000
    assert old_conn.execute("SELECT status FROM tasks WHERE task_index = 130").fetchone()[0] \
        == task_rows(np.r_[100:160, 2500:3000], 3)["status"][30].as_py()  # the later row
    assert_as_old_sql(from_blocks, run_id, old_conn, 3000)
    assert_as_old_sql(from_old, run_id, old_conn, 3000)  # a store written before blocks
    for search in SEARCHES:
        assert answer(from_blocks, run_id, search) == answer(from_old, run_id, search)
    everything = answer(from_blocks, run_id, "s3")
    counts = everything["summary"]["counts"]
    assert everything["summary"]["done"] == 3000 - counts["cancelled"] < 3000
    assert len(everything["slowest"]) == 20
    assert 0 < everything["metrics"]["sampled"] <= 150
    assert [c["name"] for c in everything["metrics"]["charts"]] == ["rmse", "r2"]
    assert everything["failures"]["matching"] < everything["failures"]["total"]
    assert kept(from_blocks, run_id).blocks_read == 3  # each decoded once, then kept
    answer(from_blocks, run_id)
    assert kept(from_blocks, run_id).blocks_read == 3


def test_a_live_run_polled_picks_up_the_new_blocks(tmp_path):
    conn, run_id = make_store(tmp_path / "blocks", 4000, status="running")
    old, old_run = make_store(tmp_path / "old", 4000, status="running")
    written = [task_rows(range(0, 1000), 1), task_rows(range(1000, 1700), 2)]
    write_blocks(conn, run_id, *written)
    write_old_rows(old, old_run, *written)
    live = Queries(tmp_path / "blocks")
    polls = []
    for more in ([task_rows(np.r_[500:600, 1700:2600], 3)],   # 500-599 written again
                 [task_rows(range(2600, 3000), 4), task_rows(range(3000, 3100), 5)], []):
        run = live._runs(10)[0]
        expected = old_sql(old, old_run, 4000, "bad 1")
        assert run["status"] == "running"
        assert (run["done"], run["ok"], run["failed"]) == expected["running"]
        assert without_clock(answer(live, run_id, "bad 1")) == without_clock(
            answer(Queries(tmp_path / "blocks"), run_id, "bad 1"))  # as asked afresh
        assert_as_old_sql(live, run_id, old, 4000)
        polls.append((run["done"], kept(live, run_id).blocks_read))
        write_blocks(conn, run_id, *more)
        write_old_rows(old, old_run, *more)
    assert [blocks for _, blocks in polls] == [2, 3, 5]  # only the new blocks decoded
    assert polls[0][0] < polls[1][0] < polls[2][0]  # each the old SQL's count, as checked
    conn.execute("UPDATE runs SET status = 'finished', finished_at = ?, wall_s = 9 "
                 "WHERE run_id = ?", (time.time(), run_id))
    old.execute("UPDATE runs SET status = 'finished', finished_at = ?, wall_s = 9 "
                "WHERE run_id = ?", (time.time(), old_run))
    assert answer(live, run_id) == answer(Queries(tmp_path / "old"), old_run)
    write_blocks(conn, run_id, task_rows(range(3100, 3200), 6))  # (a finished run's
    assert answer(live, run_id)["summary"]["done"] == polls[-1][0]  # answers are kept)


def test_an_old_style_run_is_followed_by_rowid(tmp_path):
    """A run still written a row per task (by a writer before blocks) is
    followed too: only the rows added since the last poll are read."""
    conn, run_id = make_store(tmp_path / "old", 2000, status="running")
    other, _ = make_store(tmp_path / "old", 50, status="running")  # a second run beside it
    write_old_rows(conn, run_id, task_rows(range(0, 800), 1))
    live = Queries(tmp_path / "old")
    assert live._runs(10)[1]["done"] == ran(conn, run_id) < 800
    write_old_rows(conn, run_id + 1, task_rows(range(50), 9))
    write_old_rows(conn, run_id, task_rows(np.r_[10:20, 800:1500], 2))  # 10-19 replaced
    assert without_clock(answer(live, run_id, "s3")) == without_clock(
        answer(Queries(tmp_path / "old"), run_id, "s3"))
    assert_as_old_sql(live, run_id, conn, 2000)
    assert live._runs(10)[1]["done"] == ran(conn, run_id) > 800
    assert live._runs(10)[0]["done"] == ran(conn, run_id + 1) < 50


def test_a_run_with_old_rows_and_blocks_reads_both(tmp_path):
    """Old rows first, then the blocks: a task in both shows its block row
    (as ``taskblocks.read_run``)."""
    conn, run_id = make_store(tmp_path / "store", 1500)
    write_old_rows(conn, run_id, task_rows(range(0, 1000), 1))
    write_blocks(conn, run_id, task_rows(range(900, 1500), 2))
    queries = Queries(tmp_path / "store")
    tasks = taskblocks.read_run(conn, run_id)
    summary = queries.section(run_id, "summary")
    expected = {v["values"]: v["counts"] for v in pc.value_counts(tasks["status"]).to_pylist()}
    assert summary["counts"] == dict(sorted(expected.items()))
    assert summary["done"] == 1500 - expected["cancelled"]
    failures = queries.section(run_id, "failures")
    failed = tasks.filter(pc.is_in(tasks["status"], pa.array(["failed", "timeout",
                                                              "crashed"])))
    assert failures["total"] == failed.num_rows
    assert [f["error"] for f in failures["items"]] == failed["error"].to_pylist()[:50]
    old_rows, new_rows = task_rows(range(0, 1000), 1), task_rows(range(900, 1500), 2)
    was_failed = set(pc.filter(old_rows["task_index"], pc.is_valid(old_rows["error"])).to_pylist())
    now_failed = set(pc.filter(new_rows["task_index"], pc.is_valid(new_rows["error"])).to_pylist())
    for task in sorted((was_failed ^ now_failed) & set(range(900, 1000)))[:6]:
        found = queries.section(run_id, "failures", f"bad {task}\n")
        assert found["matching"] == (task in now_failed), task


def test_an_empty_run_answers(tmp_path):
    make_store(tmp_path / "store", 10, status="running")
    everything = answer(Queries(tmp_path / "store"), 1, "x")
    assert everything["summary"]["done"] == 0 and everything["summary"]["counts"] == {}
    assert everything["durations"]["counts"] == [] and everything["slowest"] == []
    assert everything["failures"]["total"] == 0 and everything["timeline"]["bars"] == []


def _always_fails(rows):
    raise ValueError("no model")


def test_failures_are_found_by_the_key_the_page_shows(tmp_path):
    """The store keeps keys as JSON (``Z\\u00fcrich``, ``a\\"b``): a search
    for ``Zürich``, ``a"b`` or the label ``plain, i3`` found nothing."""
    import pandas as pd

    import manymodels as mm

    frame = pd.DataFrame({"store": ["Zürich", "KÖLN", 'a"b', "plain"],
                          "item": ["i0", "i1", "i2", "i3"], "y": [1.0, 2.0, 3.0, 4.0]})
    run = mm.train(_always_fails, mm.groups(frame, by=["store", "item"]), backend="serial",
                   progress=False, store=tmp_path / "store")
    queries = Queries(tmp_path / "store")
    for search, keys in (("Zürich", ["Zürich, i0"]), ("zürich", ["Zürich, i0"]),
                         ("köln", ["KÖLN, i1"]), ('a"b', ['a"b, i2']),
                         ("plain, i3", ["plain, i3"]), ("no model", None), ("\\u00fc", [])):
        found = queries.section(run.run_id, "failures", search)
        want = keys if keys is not None else ["KÖLN, i1", "Zürich, i0", 'a"b, i2', "plain, i3"]
        assert [item["key"] for item in found["items"]] == want, search
        assert found["matching"] == len(want) and found["total"] == 4
