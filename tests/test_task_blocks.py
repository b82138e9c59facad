"""A run's tasks as columnar blocks in the store (issue 15): what a reader gets
back equals what the run had, a damaged block is refused by name, and a store
written before blocks (a row per task in ``tasks``) stays readable and reusable."""

from __future__ import annotations

import hashlib
import json
import sqlite3

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import manymodels as mm
from manymodels.inputs.keys import encode_key
from manymodels.store import StoreIntegrityError, database, reuse, taskblocks


def fit_mean(frame):
    if frame["x"].iloc[0] < 0:
        raise ValueError("a negative first x")
    return float(frame["x"].mean()), {"mean": float(frame["x"].mean()), "n": len(frame)}


def table(groups: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"g": np.repeat(np.arange(groups), 4),
                          "x": rng.uniform(1.0, 2.0, size=groups * 4)})
    frame.loc[frame["g"] == 7, "x"] = -1.0  # group 7 fails
    return frame


def blocks(store) -> list[tuple[int, int, int]]:
    with sqlite3.connect(store / "index.sqlite") as conn:
        return conn.execute("SELECT run_id, tasks, trained FROM task_blocks "
                            "ORDER BY block_id").fetchall()


def test_a_run_is_written_as_blocks_and_read_back_equal(tmp_path):
    store = tmp_path / "store"
    run = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="processes",
                   workers=2, progress=False)
    written = blocks(store)
    assert written and sum(tasks for _, tasks, _ in written) == 300
    assert sum(trained for _, _, trained in written) == 299  # group 7 failed
    with sqlite3.connect(store / "index.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0
    stored = mm.Store(store).results(run.run_id).set_index("g").sort_index()
    fresh = run.results.set_index("g").sort_index()
    assert stored["status"].tolist() == fresh["status"].tolist()
    assert np.allclose(stored["mean"].dropna(), fresh["mean"].dropna())
    assert stored.loc[7, "status"] == "failed" and "negative" in stored.loc[7, "error"]
    assert mm.Store(store).load(3) == pytest.approx(run.models[3])


def test_worker_processes_send_a_stores_metrics_as_its_json(tmp_path):
    """With a store, the driver holds each task's metrics as the store's text
    (encoded on the worker), and the results read them back as numbers."""
    stored = mm.train(fit_mean, mm.groups(table(), by="g"), store=tmp_path / "store",
                      backend="processes", workers=2, progress=False)
    plain = mm.train(fit_mean, mm.groups(table(), by="g"), backend="processes", workers=2,
                     progress=False)
    metrics = stored._records.metrics
    assert all(type(m) is str for i, m in enumerate(metrics) if i != 7)
    assert json.loads(metrics[3]) == plain._records.metrics[3]
    for column in ("mean", "n"):
        assert stored.results[column].tolist() == pytest.approx(
            plain.results[column].tolist(), nan_ok=True)
    assert stored.results["n"].dropna().eq(4).all()


def test_an_unchanged_rerun_reuses_every_model_in_one_block_per_million(tmp_path):
    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="threads",
                     progress=False)
    again = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="threads",
                     progress=False)
    summary = again.summary()
    assert summary.reused == 299 and summary.failed == 1  # the failed group ran again
    reused = [b for b in blocks(store) if b[0] == again.run_id]
    assert reused[0] == (again.run_id, 299, 0)  # the reused tasks: one block
    assert again.models[5] == pytest.approx(first.models[5])
    explained = mm.Store(store).why_not_reused(5, again.run_id)
    assert explained == f"5 was reused from run {first.run_id}"


def test_a_changed_group_is_retrained_and_explained(tmp_path):
    store = tmp_path / "store"
    mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
             progress=False)
    changed = table()
    changed.loc[changed["g"] == 11, "x"] += 1.0
    again = mm.train(fit_mean, mm.groups(changed, by="g"), store=store, backend="serial",
                     progress=False)
    assert again.summary().reused == 298
    assert "its data changed" in mm.Store(store).why_not_reused(11, again.run_id)
    # not every trained row reused at its number: the 298 are copied, no run is named
    assert all(same_as is None for _, _, same_as in _same_as(store))


def test_a_damaged_block_is_refused_by_name(tmp_path):
    store = tmp_path / "store"
    run = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                   progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        block_id = conn.execute("SELECT min(block_id) FROM task_blocks").fetchone()[0]
        conn.execute("UPDATE task_blocks SET data = substr(data, 1, 100) WHERE block_id = ?",
                     (block_id,))
    with pytest.raises(StoreIntegrityError, match=f"task block {block_id} of run {run.run_id}"):
        mm.Store(store).results()


def _run_of_blocks(store: mm.Store, blocks: list[tuple[str, list[int]]]) -> int:
    """A run whose tasks are written as ``blocks`` of (status, task indices), in order."""
    from manymodels.store import database

    conn = store._conn
    conn.execute("BEGIN IMMEDIATE")
    run_id = database.insert_run(conn, backend="serial", workers=1, source="s", fit="f",
                                 tasks=6, key_columns=["k"], param_columns=[], code_detail={})
    for status, indices in blocks:
        taskblocks.insert(conn, run_id, taskblocks.table({
            "task_index": indices, "key": [encode_key((i,)) for i in indices],
            "identity": [f"id{i}" for i in indices], "status": [status] * len(indices)}))
    conn.execute("COMMIT")
    return run_id


def test_a_task_written_twice_reads_as_its_latest_row(tmp_path):
    store = mm.Store(tmp_path / "store")
    store._make()  # a new store, written to through its internals
    run_id = _run_of_blocks(store, [("failed", [0, 1, 2]), ("ok", [1])])
    tasks = taskblocks.read_run(store._conn, run_id, ["status"])
    assert tasks["task_index"].to_pylist() == [0, 1, 2]
    assert tasks["status"].to_pylist() == ["failed", "ok", "failed"]
    unordered = taskblocks.read_run(store._conn, run_id, ["status"], ordered=False)
    assert sorted(unordered.to_pylist(), key=lambda row: row["task_index"]) == tasks.to_pylist()


def test_blocks_out_of_task_order_read_in_order_or_as_they_are(tmp_path):
    store = mm.Store(tmp_path / "store")
    store._make()  # a new store, written to through its internals
    # batches finish out of order
    run_id = _run_of_blocks(store, [("ok", [3, 4, 5]), ("ok", [0, 2]), ("ok", [1])])
    in_order = taskblocks.read_run(store._conn, run_id, ["key"])
    assert in_order["task_index"].to_pylist() == list(range(6))
    as_written = taskblocks.read_run(store._conn, run_id, ["key"], ordered=False)
    assert as_written["task_index"].to_pylist() == [3, 4, 5, 0, 2, 1]


@pytest.mark.parametrize("ahead", [1, 2, 4])
def test_blocks_decoded_ahead_on_threads_come_in_order(tmp_path, monkeypatch, ahead):
    """A re-run's search decodes the earlier run's blocks on threads, a few
    ahead of the one it takes: they come in the order written, each whole,
    and a damaged one is refused by name, as one at a time."""
    store = mm.Store(tmp_path / "store")
    store._make()  # a new store, written to through its internals
    monkeypatch.setattr(taskblocks, "DECODE_AHEAD", ahead)
    written = [("ok", [3, 4]), ("failed", [0]), ("ok", [5, 1]), ("ok", [2]), ("ok", [1])]
    run_id = _run_of_blocks(store, written)
    blocks = list(taskblocks.run_blocks(store._conn, run_id, ["task_index", "status"]))
    assert [rows["task_index"].to_pylist() for _, rows in blocks] == [i for _, i in written]
    assert [set(rows["status"].to_pylist()) for _, rows in blocks] == [{s} for s, _ in written]
    block_ids = [block_id for block_id, _ in blocks]
    assert block_ids == sorted(block_ids) and len(block_ids) == len(written)
    tasks = taskblocks.read_run(store._conn, run_id, ["status"])
    assert tasks["status"].to_pylist() == ["failed", "ok", "ok", "ok", "ok", "ok"]
    conn = store._conn
    damaged = block_ids[2]
    conn.execute("UPDATE task_blocks SET data = substr(data, 1, 60) WHERE block_id = ?",
                 (damaged,))
    with pytest.raises(StoreIntegrityError, match=f"task block {damaged} of run {run_id}"):
        taskblocks.read_run(conn, run_id, ["status"])


def test_the_blocks_before_one_that_cannot_be_read_still_come(tmp_path, monkeypatch):
    """Decoding ahead must not hide the blocks before one refused on the
    reading thread (the dashboard shows what it read before the error)."""
    store = mm.Store(tmp_path / "store")
    store._make()  # a new store, written to through its internals
    monkeypatch.setattr(taskblocks, "DECODE_AHEAD", 4)
    run_id = _run_of_blocks(store, [("ok", [i]) for i in range(6)])
    conn = store._conn
    block_ids = [b for (b,) in conn.execute(
        "SELECT block_id FROM task_blocks WHERE run_id = ? ORDER BY block_id", (run_id,))]
    conn.execute("UPDATE task_blocks SET same_as = 9999 WHERE block_id = ?", (block_ids[3],))
    seen = []
    with pytest.raises(StoreIntegrityError, match="names run 9999"):
        for _, rows in taskblocks.run_blocks(conn, run_id, ["task_index"]):
            seen.append(rows["task_index"].to_pylist())
    assert seen == [[0], [1], [2]]


def _as_legacy_store(store) -> None:
    """Turn a store's blocks into the rows a store written before blocks held."""
    with sqlite3.connect(store / "index.sqlite") as conn:
        for (run_id,) in conn.execute("SELECT run_id FROM runs").fetchall():
            rows = taskblocks.read_run(conn, run_id).to_pylist()
            conn.executemany(
                f"INSERT INTO tasks(run_id, {', '.join(taskblocks.COLUMNS)}) VALUES "
                f"({', '.join('?' * (1 + len(taskblocks.COLUMNS)))})",
                [(run_id, *row.values()) for row in rows])
        conn.execute("DELETE FROM task_blocks")


def test_a_store_written_before_blocks_is_read_and_reused(tmp_path):
    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    before = mm.Store(store).results(first.run_id)
    _as_legacy_store(store)
    assert blocks(store) == []
    old = mm.Store(store)
    pd.testing.assert_frame_equal(old.results(first.run_id), before)
    assert old.load(4) == pytest.approx(first.models[4])
    again = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    assert again.summary().reused == 299
    assert again.models[4] == pytest.approx(first.models[4])
    assert old.gc() == 0  # the legacy rows still name their models


def test_gc_keeps_what_blocks_name_and_removes_what_a_deleted_run_named(tmp_path):
    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    changed = table(seed=1)
    second = mm.train(fit_mean, mm.groups(changed, by="g"), store=store, backend="serial",
                      progress=False)
    registry = mm.Store(store)
    assert registry.gc() == 0
    registry.delete(first.run_id)
    with sqlite3.connect(store / "index.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM task_blocks WHERE run_id = ?",
                            (first.run_id,)).fetchone()[0] == 0
    assert registry.gc() > 0
    assert registry.load(9) == pytest.approx(second.models[9])
    metrics = json.loads(taskblocks.read_run(registry._conn, second.run_id, ["metrics"])
                         ["metrics"][9].as_py())
    assert metrics["n"] == 4


def _same_as(store) -> list[tuple[int, int, int | None]]:
    with sqlite3.connect(store / "index.sqlite") as conn:
        return conn.execute("SELECT run_id, tasks, same_as FROM task_blocks "
                            "ORDER BY block_id").fetchall()


def _layout(store) -> int:
    with sqlite3.connect(store / "index.sqlite") as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0]


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_an_unchanged_rerun_names_the_trained_rows_instead_of_copying_them(tmp_path, backend):
    """Every row the first run trained is reused at its own task number: the
    re-run writes one block naming that run (not 299 rows again), reads back
    as reused rows, and keeps them when the first run is deleted."""
    from manymodels.observe.dashboard.queries import SECTIONS, Queries

    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend=backend,
                     workers=2, progress=False)
    assert _layout(store) == 4  # packed models' locators kept as their parts
    again = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend=backend,
                     workers=2, progress=False)
    third = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend=backend,
                     workers=2, progress=False)
    assert again.summary().reused == third.summary().reused == 299
    blocks_of = {run: [(tasks, same_as) for r, tasks, same_as in _same_as(store) if r == run]
                 for run in (again.run_id, third.run_id)}
    # the trained run is named (not the re-run that named it); group 7 ran and failed again
    assert blocks_of[again.run_id] == [(299, first.run_id), (1, None)]
    assert blocks_of[third.run_id] == [(299, first.run_id), (1, None)]
    assert _layout(store) == 4  # (naming a run needs 3: it stays at the higher)

    registry = mm.Store(store)
    before = registry.results(again.run_id)
    trained = registry.results(first.run_id).drop(7)
    reused = before.drop(7)
    assert (reused["status"] == "ok").all() and (reused["reused_from"] == first.run_id).all()
    assert (reused["attempts"] == 0).all()
    for column in ("g", "mean", "n", "duration_s", "artifact", "size"):
        assert reused[column].tolist() == trained[column].tolist(), column
    assert before.loc[7, "status"] == "failed" and before.loc[7, "attempts"] == 1
    assert registry.load(5, again.run_id) == pytest.approx(first.models[5])
    assert again.results["mean"].tolist() == pytest.approx(first.results["mean"].tolist(),
                                                           nan_ok=True)
    assert registry.why_not_reused(5, again.run_id) == f"5 was reused from run {first.run_id}"
    memo: dict = {}
    page = {name: Queries(store).section(again.run_id, name, "", memo) for name in SECTIONS}
    assert page["summary"]["done"] == 300 and page["summary"]["reused"] == 299

    # its rows are copied into the runs that named them, which hold its models
    # as their own from now on (see test_store_deletion.py); the rows read the same
    registry.delete(first.run_id)
    assert [same_as for _, _, same_as in _same_as(store)] == [None] * 4
    after = mm.Store(store).results(again.run_id)
    pd.testing.assert_frame_equal(after, before)
    memo = {}
    assert {name: Queries(store).section(again.run_id, name, "", memo)
            for name in SECTIONS} == page
    assert mm.Store(store).gc() == 0  # the re-runs still name every model
    assert mm.Store(store).load(5, third.run_id) == pytest.approx(first.models[5])


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_each_block_lists_the_packs_it_wrote_and_a_lost_pack_is_retrained(tmp_path, backend):
    """A re-run trusts a run's locators without parsing them only while every
    pack its blocks list is whole: one pack deleted, exactly its tasks retrain."""
    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend=backend,
                     workers=2, progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        listed = np.frombuffer(b"".join(blob for (blob,) in conn.execute(
            "SELECT written_packs FROM task_blocks WHERE run_id = ? AND trained > 0",
            (first.run_id,))), dtype=np.int64).reshape(-1, 2)
        packs = conn.execute("SELECT pack_id, length(blob) FROM packs ORDER BY pack_id"
                             ).fetchall()
        assert sorted(map(tuple, listed.tolist())) == packs
        lost = packs[-1][0]
        in_lost = [json.loads(key)[0] for key, artifact in zip(*taskblocks.read_run(
            conn, first.run_id, ["key", "artifact"]).select(["key", "artifact"])
            .to_pydict().values()) if artifact and f"@{lost}/" in artifact]
        conn.execute("DELETE FROM packs WHERE pack_id = ?", (lost,))
    assert in_lost
    again = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend=backend,
                     workers=2, progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:  # the lost pack's id not given again
        assert conn.execute("SELECT min(pack_id) FROM packs WHERE pack_id > ?",
                            (packs[-2][0] if len(packs) > 1 else 0,)).fetchone()[0] > lost
    retrained = again.results.index[~again.results["reused"]].tolist()
    assert sorted(retrained) == sorted([*in_lost, 7])  # and group 7, which failed
    assert again.summary().ok == 299
    means = table().groupby("g")["x"].mean()
    for group in (in_lost[0], 3):
        assert mm.Store(store).load(group, again.run_id) == pytest.approx(means[group])


def test_a_damaged_pack_list_falls_back_to_checking_each_locator(tmp_path):
    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        conn.execute("UPDATE task_blocks SET written_packs = x'010203' WHERE run_id = ?",
                     (first.run_id,))
    again = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    assert again.summary().reused == 299


def test_a_rerun_names_every_run_whose_trained_rows_it_reuses_whole(tmp_path):
    """Group 7 failed in the first run and trained, fixed, in the second: a
    third run names both runs (one block each), not the second alone with
    the first's rows copied; its rows read back in task order."""
    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    fixed = table()
    fixed.loc[fixed["g"] == 7, "x"] = 1.5
    second = mm.train(fit_mean, mm.groups(fixed, by="g"), store=store, backend="serial",
                      progress=False)
    third = mm.train(fit_mean, mm.groups(fixed, by="g"), store=store, backend="serial",
                     progress=False)
    assert second.summary().reused == 299 and third.summary().reused == 300
    assert [(tasks, same_as) for run, tasks, same_as in _same_as(store)
            if run == third.run_id] == [(1, second.run_id), (299, first.run_id)]
    results = mm.Store(store).results(third.run_id)
    assert results["g"].tolist() == list(range(300))
    assert results["reused_from"].tolist() == [
        second.run_id if g == 7 else first.run_id for g in range(300)]
    assert third.results["mean"].tolist() == pytest.approx(
        second.results["mean"].tolist())
    assert mm.Store(store).load(7, third.run_id) == pytest.approx(1.5)


def test_a_run_deleted_as_a_rerun_starts_is_searched_again(tmp_path, monkeypatch):
    """Another driver deletes the run a re-run was about to name, between the
    search and the re-run's transaction: the re-run searches again (and
    trains what it can no longer reuse) instead of failing."""
    from manymodels.store import reuse

    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    found = reuse.ReuseSearch.find
    deleted = []

    def find_then_delete(self):
        result = found(self)
        if not deleted:
            other = mm.Store(store)  # another connection, as another driver's
            other.delete(first.run_id)
            other.close()
            deleted.append(first.run_id)
        return result

    monkeypatch.setattr(reuse.ReuseSearch, "find", find_then_delete)
    again = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    assert deleted == [first.run_id]
    assert again.summary().reused == 0 and again.summary().ok == 299
    assert all(same_as is None for _, _, same_as in _same_as(store))


def test_a_block_naming_a_missing_run_is_refused_by_name(tmp_path):
    """A block whose named run is gone without its rows copied in (an older
    manymodels deleted it) is refused by name, never read as no tasks."""
    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    again = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("DELETE FROM runs WHERE run_id = ?", (first.run_id,))
    with pytest.raises(StoreIntegrityError, match=f"names run {first.run_id}"):
        mm.Store(store).results(again.run_id)


def test_a_run_still_running_is_copied_from_not_named(tmp_path):
    """A run another driver is still writing may gain rows: a re-run that
    reuses its models copies them instead of naming the run."""
    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        conn.execute("UPDATE runs SET status = 'running', driver = ? WHERE run_id = ?",
                     (database.driver_label(), first.run_id))  # this live process's
    again = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    assert again.summary().reused == 299
    assert [same_as for run, _, same_as in _same_as(store) if run == again.run_id] == \
        [None, None]
    assert _layout(store) == 4


def fit_metrics_only(frame):
    return {"mean": float(frame["x"].mean())}


def test_the_store_layout_rises_only_with_the_first_block_that_needs_it(tmp_path):
    """No model: layout 2 (a manymodels of the blocks' first layout reads
    it); a re-run that names the run: 3; a packed model: 4. A manymodels
    that reads an older layout refuses the store instead of missing rows."""
    store = tmp_path / "store"
    mm.train(fit_metrics_only, mm.groups(table(), by="g"), store=store, backend="serial",
             progress=False)
    assert _layout(store) == 2
    again = mm.train(fit_metrics_only, mm.groups(table(), by="g"), store=store,
                     backend="serial", progress=False)
    assert again.summary().reused == 300 and _layout(store) == 3  # (no group fails here)
    mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
             progress=False)
    assert _layout(store) == 4


def test_packed_models_locators_are_kept_as_their_parts_and_read_as_text(tmp_path):
    """A block keeps a packed model's SHA-256, pack and offset as binary and
    ints (its artifact text null); readers get the locator text from them,
    and the models load by it; a large model keeps its SHA-256 as text."""
    import pyarrow.ipc as ipc

    from manymodels.store import artifacts, packs

    store = tmp_path / "store"
    frame = table(groups=40)

    def fit(rows):
        size = 2 * artifacts.SMALL_ARTIFACT if rows["g"].iloc[0] == 3 else 10
        return b"m" * size + bytes([int(rows["g"].iloc[0])])

    run = mm.train(fit, mm.groups(frame, by="g"), store=store, backend="serial",
                   progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        (data,) = conn.execute("SELECT data FROM task_blocks WHERE run_id = ?",
                               (run.run_id,)).fetchone()
    raw = ipc.open_stream(data).read_all()
    assert raw.column_names == [*(("large_artifact" if name == "artifact" else name)
                                  for name in taskblocks.COLUMNS), *packs.LOCATOR_COLUMNS]
    # a manymodels that reads text locators only, and opened the store before
    # its layout rose, finds no artifact column there: it refuses the block
    old_reader = ipc.IpcReadOptions(included_fields=[taskblocks.SCHEMA.get_field_index(
        "artifact")])
    assert ipc.open_stream(data, options=old_reader).read_all().column_names == [
        "large_artifact"]
    index = raw["task_index"].to_pylist()
    row3 = index.index(3)
    assert raw["large_artifact"].null_count == raw.num_rows - 1  # only the large one's text
    assert raw["pack_id"][row3].as_py() is None and raw["pack_id"].null_count == 1
    registry = mm.Store(store)
    results = registry.results(run.run_id)
    for g in range(40):
        artifact = results.loc[g, "artifact"]
        model = b"m" * (2 * artifacts.SMALL_ARTIFACT if g == 3 else 10) + bytes([g])
        if g == 3:
            assert len(artifact) == 64 and not packs.is_locator(artifact)
        else:
            row = index.index(g)
            assert packs.parse_locator(artifact) == (
                raw["model_sha256"][row].as_py().hex(), raw["pack_id"][row].as_py(),
                raw["pack_offset"][row].as_py(), results.loc[g, "size"])
        assert registry.load(g, run.run_id) == model  # its bytes checked by the SHA-256
    assert taskblocks.decode(data, columns=["task_index", "size"]).column_names == [
        "task_index", "size"]


def test_a_corrupt_model_of_the_latest_run_is_reused_from_an_earlier_one(tmp_path):
    """Two runs trained the same tasks; the later one's model of group 5 is
    found corrupt: a re-run reuses that group's model from the earlier run,
    the rest from the later one (which it then cannot name whole: it copies)."""
    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    second = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                      progress=False, reuse=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        rows = taskblocks.read_run(conn, second.run_id, ["key", "artifact"])
        locator = rows["artifact"][5].as_py()
        assert json.loads(rows["key"][5].as_py()) == [5]
        _, pack, offset, size = taskblocks_locator(locator)
        blob = bytearray(conn.execute("SELECT blob FROM packs WHERE pack_id = ?",
                                      (pack,)).fetchone()[0])
        blob[offset:offset + size] = bytes(size)
        conn.execute("UPDATE packs SET blob = ? WHERE pack_id = ?", (bytes(blob), pack))
    with pytest.raises(StoreIntegrityError, match="does not match"):
        mm.Store(store).load(5, second.run_id)  # found corrupt, and remembered
    again = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    results = mm.Store(store).results(again.run_id).set_index("g")
    assert again.summary().reused == 299
    assert results.loc[5, "reused_from"] == first.run_id
    assert (results.drop([5, 7])["reused_from"] == second.run_id).all()
    assert all(same_as is None for _, _, same_as in _same_as(store))
    assert mm.Store(store).load(5, again.run_id) == pytest.approx(first.models[5])


def taskblocks_locator(locator: str) -> tuple[str, int, int, int]:
    from manymodels.store.packs import parse_locator

    return parse_locator(locator)


# -- the vectorised helpers give what their one-at-a-time originals give -----------


@pytest.mark.parametrize("rows", [
    [(1,), (2,), (-5,), (10**15,)],                 # ints: Arrow's text
    [("a",), ("b c",), ("~[]{}",), ("",)],           # plain ASCII strings: wrapped as they are
    [("x\"y",), ("a\\b",), ("tab\t",), ("é",)],       # JSON escapes: one at a time
    [(1,), ("a",)], [(True,), (False,)], [(2**70,), (1,)], [(1, "a"), (2, "b")],
    [(np.int64(3),), (4,)], [],
])
def test_keys_encoded_at_once_equal_one_at_a_time(rows):
    from manymodels.inputs.keys import encode_keys

    assert encode_keys(rows).to_pylist() == [encode_key(parts) for parts in rows]


def test_keys_encoded_from_a_key_table_equal_one_at_a_time():
    """A plan's int key column (chunked, negative, 64-bit extremes) encoded
    at once in Arrow, as one array, reads as each key encoded alone."""
    import pyarrow as pa

    from manymodels.inputs.keys import encode_keys

    chunks = [np.array([0, -1, 9, 10, -10]), np.array([2**63 - 1, -2**63, 10**18])]
    table = pa.table({"g": pa.chunked_array(chunks)})
    rows = [(int(v),) for chunk in chunks for v in chunk]
    encoded = encode_keys(rows, table)
    assert isinstance(encoded, pa.Array)
    assert encoded.to_pylist() == [encode_key(parts) for parts in rows]


@pytest.mark.parametrize("metrics", [
    {"rss": 0.1}, {"rss": np.float64(0.123456789)}, {"rss": float("nan")},
    {"rss": float("-inf")}, {"a": 1, "b": 2.0}, {"a%": 1.5, "b": 2.5e-7}, {"x": True},
    {"rss": 1e300, "r2": -0.0}, {}, None, '{"k": 1}', {1: 2.0}, {"q": np.float32(0.1)},
    {"e\u00e9": 2.5}, {"n": [1, 2]}, {"s": "text"},
])
def test_metrics_encoded_by_template_equal_json(metrics):
    import json

    from manymodels.engine.metriccolumns import metrics_texts
    from manymodels.engine.metrictext import metrics_json

    expected = (metrics if isinstance(metrics, str) else
                json.dumps(metrics, default=repr) if metrics else None)
    # twice in one call: the second use of a template too
    assert metrics_texts([metrics, metrics], [0, 1]).to_pylist() == [expected] * 2
    if not isinstance(metrics, str):
        assert metrics_json(metrics) == expected


def test_identities_as_arrow_equal_their_python_strings():
    from manymodels.identity.rowhash import lanes_hex, lanes_hex_array

    lanes = np.random.default_rng(3).integers(0, 2**63, size=(500, 2), dtype=np.uint64) * 3
    assert lanes_hex_array(lanes).to_pylist() == lanes_hex(lanes)
    assert lanes_hex_array(lanes[:0]).to_pylist() == []


def test_loadable_mask_equals_the_set_check(tmp_path):
    """Packed models (whole, cut short, in a pack that is gone, found corrupt),
    a damaged locator, a file artifact and its deleted twin, and no artifact."""
    from manymodels.store import artifacts, packs

    store = mm.Store(tmp_path / "store")
    store._make()  # a new store, written to through its internals
    conn = store._conn
    conn.execute("BEGIN IMMEDIATE")
    small = [bytes([i]) * 10 for i in range(4)]
    sizes = np.array([len(m) for m in small])
    pack_of, offsets, written = packs.write_packs(conn, b"".join(small), sizes)
    locators = packs.locators(b"".join(hashlib.sha256(m).digest() for m in small),
                              pack_of, offsets, sizes).to_pylist()
    assert written.tolist() == [[written[0, 0], 40]]  # one pack of the four
    big = b"x" * (artifacts.SMALL_ARTIFACT + 1)
    kept, _ = artifacts.write_artifact(conn, store.path, big)
    gone, _ = artifacts.write_artifact(conn, store.path, big + b"y")
    conn.execute("COMMIT")
    (store.path / "artifacts" / gone[:2] / gone).unlink()
    conn.execute("INSERT INTO corrupt_artifacts VALUES (?, 0)", (locators[1],))
    digest, pack, offset, size = packs.parse_locator(locators[3])
    names = [*locators, f"{digest}@{pack}/{offset}/{size + 99}",  # past the pack's end
             f"{digest}@{pack + 7}/0/10", "abc@not/a/locator", kept, gone, None]
    mask = artifacts.loadable_mask(conn, store.path, names)
    named = {a for a in names if a is not None}
    expected = artifacts.loadable_artifacts(conn, store.path, named)
    assert mask.tolist() == [a in expected for a in names]
    assert mask.tolist() == [True, False, True, True, False, False, False, True, False, False]


@pytest.mark.parametrize("rows", [
    [(1,), (-22,), (10**17,)], [("a",), ("b c",), ("",)], [("x\"y",), ("é",)],
    [(10**19,), (1,)], [(1, "a"), (2, "b")], [(True,), (False,)], [(1.5,), (2.0,)],
    [(pd.Timestamp("2024-01-02"),)],
])
def test_keys_decoded_at_once_equal_one_at_a_time(rows):
    from manymodels.inputs.keys import decode_key, decode_keys, encode_keys

    texts = encode_keys(rows)
    width = len(rows[0])
    expected = [[decode_key(text)[i] for text in texts.to_pylist()] for i in range(width)]
    got = decode_keys(texts, width)
    assert got == expected
    assert [[type(v) for v in column] for column in got] == [
        [type(v) for v in column] for column in expected]


@pytest.mark.parametrize("values, kind", [
    ([3, -7, 0, 10**17], "int64"), ([1, -128, 127], "int8"), ([2**64 - 1, 0], "uint64"),
    ([5, 6], "int32"), (["a", "b"], "string"), ([1.5, 2.0], "float64"),
])
def test_keys_encoded_from_arrow_columns_equal_one_at_a_time(values, kind):
    """A plan of one group per task hands its keys as Arrow columns: encoded
    at once, the same text as encode_key of each."""
    import pyarrow as pa

    from manymodels.inputs.keys import encode_keys

    rows = [(value,) for value in values]
    table = pa.table({"g": pa.array(values, kind)})
    assert encode_keys(rows, table).to_pylist() == [encode_key(row) for row in rows]
    assert encode_keys(rows, table.slice(0, 1)).to_pylist() == [encode_key(r) for r in rows]


@pytest.mark.parametrize("texts", [
    ['{"rss": 0.5}', '{"rss": 1.25, "r2": -0.5}', None, '{"r2": 3}'],
    ['{"a": 1}', '{"a": 2}'], ['{"a": [1, 2]}', '{"b": "x"}'],
    ['{"a": true, "s": "t\\u00e9"}', '{"a": false}'], ['{"big": 123456789012345678901234}'],
    ['{"n": null}', '{"n": 1}'], [None, None], ['{"a": 1}', '{"a": "x"}'],
    ['{"x": 1e300, "y": -0.0}'], ['{"__windows__": [{"fold": 0}], "rmse": 1.0}'],
])
def test_metric_columns_equal_json_one_object_at_a_time(texts):
    import pyarrow as pa

    from manymodels.engine.metriccolumns import text_columns

    objects = [json.loads(t) if t else {} for t in texts]
    names = list(dict.fromkeys(name for m in objects for name in m))
    expected = {name: [m.get(name) for m in objects] for name in names}
    got = text_columns(pa.array(texts, pa.string()))
    assert list(got) == names and got == expected
    # as results columns: the same dtypes (an int among floats is a float there)
    pd.testing.assert_frame_equal(pd.DataFrame(got, index=range(len(texts))),
                                  pd.DataFrame(expected, index=range(len(texts))))


def test_a_store_written_before_blocks_reads_on_a_read_only_connection(tmp_path):
    """Read-only (and the dashboard's) connections cannot add task_blocks to
    an older index: they read its rows all the same."""
    from manymodels.observe.dashboard.queries import Queries

    store = tmp_path / "store"
    first = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                     progress=False)
    model = first.models[4]
    first.store.close()
    _as_legacy_store(store)
    with sqlite3.connect(store / "index.sqlite") as conn:
        conn.execute("DROP TABLE task_blocks")
    before = (store / "index.sqlite").read_bytes()
    old = mm.Store(store, read_only=True)
    assert old.results()["status"].value_counts().to_dict() == {"ok": 299, "failed": 1}
    assert old.load(4) == pytest.approx(model)
    assert len(old.models()) == 299
    assert "reused" not in old.why_not_reused(4)
    summary = Queries(store).run(first.run_id)["summary"]
    assert summary["counts"] == {"failed": 1, "ok": 299}
    assert (store / "index.sqlite").read_bytes() == before


def test_a_store_of_a_later_layout_is_refused_by_name(tmp_path):
    from manymodels.store import StoreError, database

    store = tmp_path / "store"
    mm.Store(store, read_only=False).close()  # (open to write: an empty store made)
    with sqlite3.connect(store / "index.sqlite") as conn:
        conn.execute(f"PRAGMA user_version = {database.FORMAT + 1}")
    for read_only in (False, True):
        with pytest.raises(StoreError, match="newer than this manymodels reads"):
            mm.Store(store, read_only=read_only)


def test_reuse_skips_the_runs_that_cannot_have_trained_an_identity(tmp_path, monkeypatch):
    """A new group must not make a re-run read every earlier run: a run whose
    blocks' identity prefixes hold none of those left is not read."""
    store = tmp_path / "store"
    for seed in range(3):  # three runs training different data
        mm.train(fit_mean, mm.groups(table(seed=seed), by="g"), store=store,
                 backend="serial", progress=False)
    read: list[int] = []
    original = taskblocks.read_run

    def counting(conn, run_id, *args, **kwargs):
        read.append(run_id)
        return original(conn, run_id, *args, **kwargs)

    monkeypatch.setattr(taskblocks, "read_run", counting)
    grown = pd.concat([table(seed=0), pd.DataFrame({"g": [10_000] * 4, "x": 1.5})])
    again = mm.train(fit_mean, mm.groups(grown, by="g"), store=store, backend="serial",
                     progress=False)
    assert again.summary().reused == 299
    assert read[:1] == [1]  # runs 3 and 2 trained none of these: never read


def test_a_loop_of_loads_finds_each_key_in_the_run_read_once(tmp_path, monkeypatch):
    store = tmp_path / "store"
    run = mm.train(fit_mean, mm.groups(table(), by="g"), store=store, backend="serial",
                   progress=False)
    registry = mm.Store(store)
    expected = {key: run.models[key] for key in (0, 299, 150, 1, 298)}
    reads: list[int] = []
    original = taskblocks.read_run
    monkeypatch.setattr(taskblocks, "read_run", lambda conn, run_id, *a, **k: (
        reads.append(run_id), original(conn, run_id, *a, **k))[1])
    for key, model in expected.items():
        assert registry.load(key) == pytest.approx(model)
    with pytest.raises(KeyError, match="no task with key 300"):
        registry.load(300)
    with pytest.raises(KeyError, match="has no model"):
        registry.load(7)  # failed
    assert reads == [run.run_id]


def test_arrow_row_hashes_equal_pandas_hash_of_the_whole_frame():
    """Identities are hashed column by column on threads: the same values as
    pandas' row hash of the whole frame, for every kind of column, but for
    the missing values pandas hashes by their neighbours too."""
    import datetime as dt
    import decimal

    import pyarrow as pa

    from manymodels.identity.rowhash import arrow_row_hashes

    n = 1_000
    rng = np.random.default_rng(5)
    table = pa.table({
        "g": pa.array(rng.integers(0, 50, n)),
        "x": pa.array(rng.normal(size=n)),
        "with_nulls": pa.array([None if i % 7 == 0 else float(i) for i in range(n)]),
        "ints_with_nulls": pa.array([None if i % 5 == 0 else i for i in range(n)]),
        "s": pa.array([f"s{i % 13}" for i in range(n)]),
        "cat": pa.array([f"c{i % 3}" for i in range(n)]).dictionary_encode(),
        "when": pa.array([dt.datetime(2024, 1, 1) + dt.timedelta(hours=i) for i in range(n)]),
        "flag": pa.array([i % 2 == 0 for i in range(n)]),
        "dec": pa.array([decimal.Decimal(i) / 4 for i in range(n)], pa.decimal128(10, 2)),
    })
    # pandas hashes an integer column with a null as floats: each row here
    # is hashed by its own value (an integer's, a null's NaN), as the rows
    # of a column without nulls are (see test_inputs_hostile.py)
    from pandas.core.util.hashing import combine_hash_arrays

    frame = table.to_pandas()
    columns = []
    for name in frame.columns:
        hashed = pd.util.hash_pandas_object(frame[name], index=False).to_numpy()
        if name == "ints_with_nulls":
            ints = pd.Series(table[name].fill_null(0).to_numpy())
            hashed = np.where(frame[name].isna(), hashed,
                              pd.util.hash_pandas_object(ints, index=False).to_numpy())
        columns.append(hashed)
    expected = combine_hash_arrays(iter(columns), len(columns))
    assert np.array_equal(arrow_row_hashes(table), expected)
    plain = table.drop_columns(["ints_with_nulls"])
    assert np.array_equal(arrow_row_hashes(plain), pd.util.hash_pandas_object(
        plain.to_pandas(), index=False).to_numpy())
    one = table.select(["x"])
    assert np.array_equal(arrow_row_hashes(one),
                          pd.util.hash_pandas_object(one.to_pandas(), index=False).to_numpy())


def test_numbers_hashed_in_blocks_equal_pandas_hash():
    """Columns of numbers and booleans are hashed in blocks of rows, not by
    pandas: the same values, for every width and sign, across blocks and
    chunks, with NaN, -0.0 and extremes."""
    import pyarrow as pa

    from manymodels.identity.rowhash import _BLOCK, arrow_row_hashes

    n = 2 * _BLOCK + 123
    rng = np.random.default_rng(8)
    floats = rng.normal(size=n)
    floats[:4] = [np.nan, -0.0, np.inf, -np.inf]
    floats.view(np.uint64)[4] = np.array(np.nan).view(np.uint64) | np.uint64(1 << 63 | 5)
    floats[5] = -0.0  # (a NaN of another sign and payload above: pandas 3.1 hashes NaNs alike)
    ints = rng.integers(-2**62, 2**62, n)
    ints[:2] = [np.iinfo(np.int64).min, np.iinfo(np.int64).max]
    table = pa.table({
        "f64": floats, "f32": floats.astype(np.float32),
        "i64": ints, "i32": ints.astype(np.int32), "i8": ints.astype(np.int8),
        "u64": ints.view(np.uint64), "u16": ints.astype(np.uint16),
        "flag": ints % 3 == 0,
        "chunked": pa.chunked_array([floats[:1000], floats[1000:_BLOCK + 7], floats[_BLOCK + 7:]]),
    })
    expected = pd.util.hash_pandas_object(table.to_pandas(), index=False).to_numpy()
    assert np.array_equal(arrow_row_hashes(table), expected)
    assert len(arrow_row_hashes(table.slice(0, 0))) == 0


@pytest.fixture(params=["one thread", "three threads"])
def hashing_threads(request, monkeypatch):
    """Small blocks, and one thread or ranges of groups on three (as a large
    table on three cores), for group_lanes."""
    from manymodels.identity import rowhash

    monkeypatch.setattr(rowhash, "_BLOCK", 1000)
    cores = 1 if request.param == "one thread" else 3
    monkeypatch.setattr(rowhash, "_hashing_threads", lambda: cores)
    return cores


def test_group_lanes_in_blocks_equal_the_whole_arrays_formula(hashing_threads):
    """Groups combined block by block (whole groups per block, a group longer
    than a block alone), on one thread or several, equal the formula on
    whole arrays."""
    from manymodels.identity.rowhash import _BLOCK, _GOLDEN, group_lanes, mix64

    rng = np.random.default_rng(4)
    lengths = np.concatenate([rng.integers(1, 40, 5000), [_BLOCK * 2 + 5], [1, 3]])
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rows = rng.integers(0, 2**63, int(lengths.sum()), dtype=np.uint64) * 3
    salt_a, salt_b = np.uint64(12345), np.uint64(987654321)
    with np.errstate(over="ignore"):
        position = (np.arange(len(rows), dtype=np.uint64)
                    - np.repeat(offsets.astype(np.uint64), lengths))
        a = np.add.reduceat(mix64(rows ^ mix64(position + salt_a)), offsets)
        b = np.add.reduceat(mix64(rows + mix64(position ^ salt_b) + _GOLDEN), offsets)
        size = lengths.astype(np.uint64)
        a = mix64(a ^ mix64(size + salt_a))
        b = mix64(b + mix64(size ^ salt_b) ^ a)
    expected = np.stack([a, b], axis=1)
    assert np.array_equal(group_lanes(rows, offsets, lengths, (12345, 987654321)), expected)


@pytest.mark.parametrize("where", ["none", "first", "late", "last"])
def test_may_have_trained_finds_a_prefix_wherever_it_lies(tmp_path, where):
    rng = np.random.default_rng(9)
    kept = [np.unique(rng.integers(1, 2**63, size=n, dtype=np.uint64)) for n in (500, 3000)]
    wanted = rng.integers(2**63, 2**64 - 1, size=5000, dtype=np.uint64)  # none kept
    if where != "none":
        wanted[{"first": 0, "late": 2500, "last": 4999}[where]] = kept[1][1234]
    conn = sqlite3.connect(tmp_path / "t.sqlite")
    conn.execute("CREATE TABLE task_blocks (block_id INTEGER PRIMARY KEY, run_id, trained, "
                 "trained_identities)")
    conn.executemany("INSERT INTO task_blocks(run_id, trained, trained_identities) "
                     "VALUES (1, ?, ?)",
                     [(len(k), k.tobytes()) for k in kept])
    assert reuse.may_have_trained(conn, 1, wanted) == (where != "none")
    assert reuse.may_have_trained(conn, 2, wanted) is False  # trained nothing


def test_the_template_cache_keeps_at_most_64_sets_of_names():
    import json

    from manymodels.engine import metrictext

    for i in range(200):  # names that differ per task
        metrics = {f"coef_{i}": 0.5 + i, "n": 1.0}
        assert metrictext.metrics_json(metrics) == json.dumps(metrics, default=repr)
    assert len(metrictext._TEMPLATES) <= 64


def test_locators_are_told_from_bare_digests_at_any_slice():
    from manymodels.store import packs

    digest = "ab" * 32
    names = [f"{digest}@1/0/10", digest, None, f"{digest}x@1/0/1", "short@1/2/3",
             f"{digest}@22/300/4000", ""]
    expected = [True, False, False, False, False, True, False]
    for kind in (pa.string(), pa.large_string()):
        array = pa.array(["pad", *names], kind)
        assert packs.locator_mask(array.slice(1)).tolist() == expected
        assert [packs.is_locator(n) and n.index("@") == 64 if n else False
                for n in names] == expected


def test_identities_compared_as_bytes_equal_arrows_comparison():
    """Identities held as lanes (their bytes compared with the stored digits
    turned into bytes) or as text (rows of digits) compare as Arrow does."""
    from manymodels.identity.hashing import TaskIdentities
    from manymodels.identity.rowhash import lanes_hex
    from manymodels.inputs.tables import fixed_width_bytes
    from manymodels.store.reuse import _equal_at

    rng = np.random.default_rng(3)
    lanes = rng.integers(0, 2**63, size=(500, 2), dtype=np.uint64) * np.uint64(3)
    names = lanes_hex(lanes)
    wanted = pa.array(names)
    numbers = rng.permutation(500)[:300]
    same = [names[n] for n in numbers]
    cases = {
        "equal, one chunk": (pa.array(same), True),
        "equal, blocks": (pa.chunked_array([same[:100], [], same[100:]], pa.string()), True),
        "one differs in a later block": (pa.chunked_array(
            [same[:100], [*same[100:299], "f" * 32]], pa.string()), False),
        "not hex digits, the same width": (pa.array([*same[:-1], "g" * 32]), False),
        "another width": (pa.array([*same[:-1], "abc"]), False),
        "a null (Arrow's all() skips it)": (pa.array([*same[:-1], None]), True),
    }
    for name, (candidates, expected) in cases.items():
        arrow = pc.all(pc.equal(wanted.take(pa.array(numbers)), candidates)).as_py()
        assert arrow == expected, name
        for held in (TaskIdentities(lanes, None, None, None),
                     TaskIdentities(wanted, None, None, None)):
            assert _equal_at(held, numbers, candidates) == expected, name
    assert TaskIdentities(lanes, None, None, None).identity.to_pylist() == names
    assert fixed_width_bytes(pa.array(["ab", "cd"]).slice(1)).tolist() == [[ord("c"), ord("d")]]
    assert fixed_width_bytes(pa.array(["ab", "c"])) is None


def test_why_not_reused_looks_past_runs_without_the_key(tmp_path):
    """The latest earlier run that has the key explains it; runs without it are
    skipped (their keys read, nothing more); a key no run had says so."""
    store = tmp_path / "store"
    frame = table(groups=20)
    kwargs = {"store": store, "backend": "serial", "progress": False}
    mm.train(fit_mean, mm.groups(frame[frame["g"] < 10], by="g"), **kwargs)
    mm.train(fit_mean, mm.groups(frame[frame["g"] >= 10], by="g"), **kwargs)
    changed = frame[frame["g"] < 10].copy()
    changed.loc[changed["g"] == 3, "x"] += 1.0
    third = mm.train(fit_mean, mm.groups(changed, by="g"), **kwargs)
    registry = mm.Store(store)
    assert registry.why_not_reused(3, third.run_id) == \
        "3 was trained: since run 1, its data changed"
    assert registry.why_not_reused(7, third.run_id) == (  # (it failed again)
        "7 was not trained in run 3: its fit ended 'failed' (ValueError: a negative first "
        "x); it was not reused: in run 1 it ended 'failed'")
    wider = table(groups=25)
    fourth = mm.train(fit_mean, mm.groups(wider[wider["g"] >= 20], by="g"), **kwargs)
    assert registry.why_not_reused(22, fourth.run_id) == \
        "22 was trained: no earlier run in this store has this key"


def test_group_lanes_from_row_hashes_made_block_by_block_equal_those_from_all_rows(
        hashing_threads):
    """Row hashes made a block at a time as group_lanes reaches each block
    (a text column hashed by pandas, a group longer than a block), on one
    thread or several, give the lanes that the whole table's row hashes
    give."""
    from manymodels.identity.rowhash import _BLOCK, RowHashes, arrow_row_hashes, group_lanes

    rng = np.random.default_rng(11)
    lengths = np.concatenate([rng.integers(1, 30, 4000), [_BLOCK + 17], [2, 1]])
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    rows = int(lengths.sum())
    table = pa.table({"g": np.repeat(np.arange(len(lengths)), lengths),
                      "x": rng.normal(size=rows),
                      "label": pa.array([f"r{i % 97}" for i in range(rows)]),
                      "flag": rng.integers(0, 2, rows).astype(bool)})
    whole = group_lanes(arrow_row_hashes(table), offsets, lengths, (5, 7))
    assert np.array_equal(group_lanes(RowHashes(table), offsets, lengths, (5, 7)), whole)
