"""Store defects found by hostile input: a full disk, stale or broken reuse, a
damaged index, a killed run, a read-only store, models that cannot be stored."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from conftest import run_cli
from manymodels.store import taskblocks

pytestmark = pytest.mark.usefixtures("no_leftovers")


@pytest.fixture
def small_disk(tmp_path):
    """A real 3 MB file system (tmpfs), grown on request: needs root."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=3m,mode=0700", "tmpfs", str(mount)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")

    def grow(size: str = "256m") -> None:
        subprocess.run(["mount", "-o", f"remount,size={size}", str(mount)], check=True)

    yield mount, grow
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fit_big(item):
    """A 400 KB model that does not compress."""
    return np.random.default_rng(item).random(50_000), {"item": item}


def test_a_store_on_a_full_disk_with_a_dead_drivers_run_still_opens(small_disk):
    """A run stopped by a disk full to the last byte left its row running
    (its end could not be written either); opening the store then tried to
    mark it interrupted, and mm.Store and every command refused the store:
    "the disk is full; the index could not be opened"."""
    import shutil
    import socket

    mount, grow = small_disk
    store = mount / "store"
    mm.train(lambda item: [item], mm.items(range(3)), store=store, backend="serial",
             progress=False)
    conn = sqlite3.connect(store / "index.sqlite")
    conn.execute("UPDATE runs SET status = 'running', driver = ?",  # (its driver gone)
                 (f"{socket.gethostname()}:999999999:1.00",))
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    fill = os.open(mount / "fill", os.O_WRONLY | os.O_CREAT)
    with pytest.raises(OSError, match="No space"):  # to the last byte
        os.write(fill, b"\0" * shutil.disk_usage(mount).free)
        while True:
            os.write(fill, b"\0" * 4096)
    os.close(fill)
    assert len(mm.Store(store).results()) == 3
    listed = run_cli("runs", store)
    assert listed.returncode == 0 and "running" in listed.stdout, listed.stderr
    grow()
    assert mm.Store(store).runs()["status"].tolist() == ["interrupted"]


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_full_disk_raises_store_error_keeps_results_and_never_records_a_missing_model(
        small_disk, backend):
    """serial: the driver pickles the models; processes: workers send them in
    packs, and the models of a hand-over that failed load from those."""
    mount, grow = small_disk
    store = mount / "store"
    with pytest.raises(mm.StoreError) as caught:
        mm.train(fit_big, mm.items(range(24)), store=store, backend=backend, workers=2,
                 progress=False)
    error = caught.value
    assert "disk is full" in str(error) and str(store) in str(error)
    run = error.run
    assert run is not None and len(run.ok) > 0  # the finished results came back
    for key, model in run.models.items():
        assert np.array_equal(model, fit_big(key)[0])
    # every task the index records ok has its model, whole
    reader = mm.Store(store)
    recorded = reader.results()
    assert reader.runs()["status"].tolist() == ["failed"]
    for item in recorded.loc[recorded["status"] == "ok", "item"]:
        assert np.array_equal(reader.load(item), fit_big(item)[0])
    reader.close()

    grow()
    again = mm.train(fit_big, mm.items(range(24)), store=store, backend=backend, workers=2,
                     progress=False)
    assert (again.results["status"] == "ok").all()
    assert again.summary().reused == int((recorded["status"] == "ok").sum())
    for item in range(24):
        assert np.array_equal(mm.Store(store).load(item), fit_big(item)[0])


def test_missing_or_corrupt_artifact_is_retrained_not_reused(tmp_path):
    store = tmp_path / "store"
    small = mm.train(fit_big, mm.items(range(3)), store=store, backend="serial",
                     progress=False)
    assert len(small.ok) == 3
    with sqlite3.connect(store / "index.sqlite") as conn:
        # small models are packed: item -> (pack, offset, size) from its locator
        located = {json.loads(key)[0]: tuple(int(p) for p in art.split("@")[1].split("/"))
                   for key, art in zip(*taskblocks.read_run(conn, 1, ["key", "artifact"])
                                       .select(["key", "artifact"]).to_pydict().values())}
        last = max(located, key=lambda item: located[item][1])  # lost: the pack cut short
        damaged = next(item for item in located if item != last)  # corrupt: bytes zeroed
        pack, offset, size = located[last]
        conn.execute("UPDATE packs SET blob = substr(blob, 1, ?) WHERE pack_id = ?",
                     (offset, pack))
        pack, offset, size = located[damaged]
        blob = bytearray(conn.execute("SELECT blob FROM packs WHERE pack_id = ?",
                                      (pack,)).fetchone()[0])
        blob[offset:offset + size] = bytes(size)
        conn.execute("UPDATE packs SET blob = ? WHERE pack_id = ?", (bytes(blob), pack))
    opened = mm.Store(store)
    with pytest.raises(mm.StoreIntegrityError, match="packed artifact"):
        opened.load(last)  # missing: beyond the pack's end
    opened.close()
    opened = mm.Store(store)
    with pytest.raises(mm.StoreIntegrityError, match="does not match"):
        opened.load(damaged)  # found corrupt when loaded
    opened.close()
    again = mm.train(fit_big, mm.items(range(3)), store=store, backend="serial",
                     progress=False)
    expected = {item: item not in (last, damaged) for item in range(3)}
    assert again.results.set_index("item")["reused"].to_dict() == expected
    for item in (last, damaged):  # not blamed on reuse=False
        assert mm.Store(store).why_not_reused(item, again.run_id) == (
            f"{item!r} was trained: its model from run {small.run_id} could no longer be "
            "loaded (missing from the store, or found corrupt)")
    for item in range(3):
        assert np.array_equal(mm.Store(store).load(item), fit_big(item)[0])


def test_large_artifact_file_removed_is_retrained(tmp_path):
    def fit_large(item):
        return np.random.default_rng(item).random(200_000)  # 1.6 MB: a file

    store = tmp_path / "store"
    mm.train(fit_large, mm.items(range(2)), store=store, backend="serial", progress=False)
    files = sorted((store / "artifacts").rglob("*"))
    files = [f for f in files if f.is_file()]
    assert len(files) == 2
    files[0].unlink()
    again = mm.train(fit_large, mm.items(range(2)), store=store, backend="serial",
                     progress=False)
    assert again.summary().reused == 1
    for item in range(2):
        assert np.array_equal(mm.Store(store).load(item), fit_large(item))


STALE_SCRIPT = """
import sys
import manymodels as mm

ALPHA = {alpha}
SETTINGS = {{"scale": {alpha} * 10}}

def helper():
    return SETTINGS["scale"]

def fit(df):
    return [ALPHA, helper()], {{"a": ALPHA}}

if __name__ == "__main__":
    run = mm.train(fit, mm.items(range(4)), store=sys.argv[1], backend="serial",
                   progress=False)
    print(int(run.summary().reused), run.results["a"].tolist())
"""


def test_editing_a_global_that_fit_reads_retrains(tmp_path):
    store = tmp_path / "store"
    script = tmp_path / "job.py"
    outputs = []
    for alpha in (1, 1, 2):
        script.write_text(STALE_SCRIPT.format(alpha=alpha))
        done = subprocess.run([sys.executable, str(script), str(store)], capture_output=True,
                              text=True, check=True, cwd=tmp_path)
        outputs.append(done.stdout.split(maxsplit=1))
    assert outputs[0] == ["0", "[1, 1, 1, 1]\n"]
    assert outputs[1] == ["4", "[1, 1, 1, 1]\n"]  # unchanged: reused
    assert outputs[2] == ["0", "[2, 2, 2, 2]\n"]  # ALPHA edited: retrained
    assert mm.Store(store).models()[0] == [2, 20]


def test_a_global_that_cannot_be_hashed_is_never_reused(tmp_path):
    lock = threading.Lock()

    def fit(item):
        with LOCKS[0]:
            return {"v": item}

    global LOCKS
    LOCKS = [lock]
    store = tmp_path / "store"
    mm.train(fit, mm.items(range(3)), store=store, backend="threads", progress=False)
    again = mm.train(fit, mm.items(range(3)), store=store, backend="threads", progress=False)
    assert again.summary().reused == 0
    assert "code" in again.why_not_reused(0)


LOCKS: list = []


def test_unpicklable_model_fails_its_task_on_threads(tmp_path):
    def fit(item):
        if item == 1:
            return threading.Lock()  # no store can keep it
        return [item]

    run = mm.train(fit, mm.items(range(3)), store=tmp_path / "store", backend="threads",
                   progress=False)
    results = run.results.set_index("item")
    assert results.loc[1, "status"] == "failed"
    assert "cannot be pickled to keep it in the store" in results.loc[1, "error"]
    assert results.loc[[0, 2], "status"].tolist() == ["ok", "ok"]
    assert 1 not in run.models
    stored = mm.Store(tmp_path / "store").results().set_index("item")
    assert stored.loc[1, "status"] == "failed"
    assert run.summary().ok == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_damaged_index_is_refused_by_name(tmp_path, damage):
    store = tmp_path / "store"
    mm.train(fit_big, mm.items(range(2)), store=store, backend="serial", progress=False)
    index = store / "index.sqlite"
    for extra in ("index.sqlite-wal", "index.sqlite-shm"):
        (store / extra).unlink(missing_ok=True)
    if damage == "garbage":
        index.write_bytes(os.urandom(8192))
    else:
        index.write_bytes(index.read_bytes()[:1000])
    with pytest.raises(mm.StoreError, match="index.sqlite"):
        mm.Store(store)
    with pytest.raises(mm.StoreError, match="index.sqlite"):
        mm.train(fit_big, mm.items(range(2)), store=store, backend="serial", progress=False)


KILLED_DRIVER = textwrap.dedent("""
    import os, signal, sys
    import manymodels as mm

    def fit(item):
        if item == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # the driver itself (serial backend)
        return [item]

    mm.train(fit, mm.items(range(10)), store=sys.argv[1], backend="serial", progress=False)
""")


def test_a_killed_run_is_marked_interrupted_when_the_store_is_next_opened(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(KILLED_DRIVER)
    store = tmp_path / "store"
    done = subprocess.run([sys.executable, str(script), str(store)], capture_output=True)
    assert done.returncode == -9
    runs = mm.Store(store).runs()
    assert runs["status"].tolist() == ["interrupted"]


def _large_packed(item):
    return np.random.default_rng(item).random(20_000)  # 160 KB: packed, not compressible


def test_gc_marks_a_run_whose_driver_died_since_the_store_was_opened_and_compacts(tmp_path):
    """gc skipped compacting the index beside a run that read ``running``,
    and one whose driver was killed after the Store was opened read so for
    good: gc marks it ``interrupted``, as opening the store does, and
    compacts."""
    path = tmp_path / "store"
    mm.train(_large_packed, mm.items(range(30)), store=path, backend="serial",
             progress=False)
    store = mm.Store(path)  # (a long-lived Store: a server's, a notebook's)
    script = tmp_path / "driver.py"
    script.write_text(KILLED_DRIVER)
    assert subprocess.run([sys.executable, str(script), str(path)]).returncode == -9
    store.delete(1)
    store.gc()
    assert store.runs()["status"].tolist() == ["interrupted"]
    assert store._conn.execute("PRAGMA freelist_count").fetchone()[0] == 0
    store.close()


def test_a_running_run_of_a_live_driver_stays_running(tmp_path):
    store = tmp_path / "store"
    seen = []

    def fit(item):
        seen.append(mm.Store(store).runs()["status"].tolist())  # opened mid-run
        return [item]

    mm.train(fit, mm.items(range(2)), store=store, backend="serial", progress=False)
    assert seen[0] == ["running"]
    assert mm.Store(store).runs()["status"].tolist() == ["finished"]


def test_a_store_that_does_not_exist_is_refused_by_its_readers_and_made_by_a_run(tmp_path):
    """mm.Store of a path with no store (a typo) made an empty store there,
    and its readers answered "no runs": they say the store does not exist,
    naming the path, and nothing is made; a run given that Store makes it."""
    path = tmp_path / "typo"
    store = mm.Store(path)
    frame = pd.DataFrame({"g": [1, 1, 2], "x": [1.0, 2.0, 3.0]})
    for read in (store.runs, store.results, lambda: store.load(1), store.models, store.gc,
                 store.verify, store.linear, lambda: store.why_not_reused(1),
                 lambda: store.export(path.with_suffix(".parquet")),
                 lambda: store.predict(frame, by="g"), store.evaluation, store.forecasts,
                 store.integrity_check, lambda: store.attached("fallback"),
                 lambda: store.attach(1, "fallback", 0), lambda: store.delete(1),
                 lambda: store._conn):  # (the index's connection: what every reader uses)
        with pytest.raises(mm.StoreError, match=f"the store '{re.escape(str(path))}' does "
                                                "not exist"):
            read()
    assert not path.exists()
    run = mm.train(lambda rows: len(rows), mm.groups(frame, by="g"), store=store,
                   backend="serial", progress=False)
    assert run.failed.empty and store.runs()["status"].tolist() == ["finished"]
    assert store.load(2) == 1


def test_read_only_store_can_be_read_not_trained_into(tmp_path):
    store = tmp_path / "store"
    mm.train(fit_big, mm.items(range(3)), store=store, backend="serial", progress=False)
    with pytest.raises(mm.StoreError, match="read"):
        mm.train(fit_big, mm.items(range(3)), store=mm.Store(store, read_only=True),
                 backend="serial", progress=False)
    opened = mm.Store(store, read_only=True)
    assert opened.read_only
    assert len(opened.results()) == 3
    assert np.array_equal(opened.load(2), fit_big(2)[0])


def test_store_on_a_read_only_file_system_opens_for_reading(tmp_path):
    store = tmp_path / "store"
    mm.train(fit_big, mm.items(range(3)), store=store, backend="serial", progress=False)
    view = tmp_path / "view"
    view.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "--bind", "-o", "ro", str(store), str(view)],
            capture_output=True).returncode != 0:
        pytest.skip("a read-only bind mount needs root")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True)
        opened = mm.Store(view)
        assert opened.read_only
        assert len(opened.results()) == 3
        assert np.array_equal(opened.load(1), fit_big(1)[0])
        opened.close()
        # the command line reads it too (its check of the index was refused
        # as "unable to open database file": not a store, or damaged)
        listed = run_cli("runs", view)
        assert listed.returncode == 0 and "finished" in listed.stdout, listed.stderr
        with pytest.raises(mm.StoreError, match="reading only"):
            mm.train(fit_big, mm.items(range(3)), store=view, backend="serial",
                     progress=False)
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


def test_gc_reads_blocks_before_it_locks_and_leaves_a_file_placed_meanwhile(tmp_path):
    """``Store.gc`` decodes the blocks before its write transaction and, inside
    it, only the blocks written since (a run committing meanwhile is kept
    whole); a stray file is removed, but not one under an hour old (a worker
    or a writer puts a large model's file in place before the row naming it);
    a deleted run's model file goes at once."""
    import os
    import time

    from manymodels.store import collect

    def fit_large(item):
        return np.random.default_rng(item).random(200_000)  # 1.6 MB: a file

    store = tmp_path / "store"
    mm.train(fit_large, mm.items(range(2)), store=store, backend="serial", progress=False)
    registry = mm.Store(store)
    conn = registry._conn
    named, read = collect.referenced_artifacts(conn)
    assert len(named) == 2 and read
    assert collect.referenced_artifacts(conn, seen=read) == (set(), set())
    later = mm.train(fit_large, mm.items(range(2, 4)), store=store, backend="serial",
                     progress=False)
    since, new = collect.referenced_artifacts(conn, seen=read)
    assert len(since) == 2 and new and not new & read and not since & named
    # a block id reused after its run was deleted is read again (its run's id differs)
    third = mm.train(fit_large, mm.items(range(4, 5)), store=store, backend="serial",
                     progress=False)
    snapshot = collect.referenced_artifacts(conn)[1]  # gc's read before it locks
    registry.delete(third.run_id)  # meanwhile: the newest blocks go, their ids are free
    fourth = mm.train(fit_large, mm.items(range(5, 6)), store=store, backend="serial",
                      progress=False)
    assert {block for block, run in snapshot if run == third.run_id} == {
        block for block, run in collect.referenced_artifacts(conn)[1]
        if run == fourth.run_id}  # the same block id, now another run's
    reused_id = collect.referenced_artifacts(conn, seen=snapshot)
    assert {run for _, run in reused_id[1]} == {fourth.run_id} and len(reused_id[0]) == 1

    stray = store / "artifacts" / "ab" / ("ab" + "0" * 62)
    placed = store / "artifacts" / "cd" / ("cd" + "0" * 62)
    for file in (stray, placed):
        file.parent.mkdir(exist_ok=True)
        file.write_bytes(b"x" * 10)
    os.utime(stray, (time.time() - 7200, time.time() - 7200))
    os.utime(placed, (time.time() - 60, time.time() - 60))  # its row is on its way
    assert registry.gc() == 2  # the stray file and the deleted run's model
    assert not stray.exists() and placed.exists()
    files = {p.relative_to(store).as_posix() for p in (store / "artifacts").rglob("*")
             if p.is_file()}  # the deleted run's model file went with its row
    assert files == {path for (path,) in conn.execute(
        "SELECT path FROM artifacts WHERE path IS NOT NULL")} | {"artifacts/cd/" + placed.name}
    np.testing.assert_array_equal(registry.load(5, fourth.run_id), fit_large(5))
    for item in range(4):  # every model any run names is kept
        np.testing.assert_array_equal(registry.load(item, later.run_id if item >= 2 else 1),
                                      fit_large(item))


def _rows_per_list(data):
    return len(data)


def test_list_and_struct_columns_are_hashed_so_a_changed_group_alone_retrains(tmp_path):
    """A column of lists and one of dicts (Arrow lists and structs, which
    pandas cannot hash) used to fail every stored run with pandas' bare
    "unhashable type"; their values are now hashed as canonical text."""
    import pandas as pd

    frame = pd.DataFrame({"g": [1, 1, 2, 3], "x": [[1, 2], [3], [4, 5], []],
                          "d": [{"a": 1}, {"a": 2}, {"a": 3}, {"a": None}]})
    store = tmp_path / "store"
    first = mm.train(_rows_per_list, mm.groups(frame, by="g"), store=store, workers=1,
                     progress=False)
    assert first.summary().ok == 3
    again = mm.train(_rows_per_list, mm.groups(frame, by="g"), store=store, workers=1,
                     progress=False)
    assert again.summary().reused == 3
    changed = frame.copy()
    changed.at[2, "x"] = [4, 6]  # group 2's list
    changed.at[3, "d"] = {"a": 0}  # group 3's struct
    after = mm.train(_rows_per_list, mm.groups(changed, by="g"), store=store, workers=1,
                     progress=False)
    assert after.summary().reused == 1
    assert after.results.set_index("g")["reused"].to_dict() == {1: True, 2: False, 3: False}


def _arrow_columns():
    import datetime
    import decimal

    import pyarrow as pa

    return {
        "int_nulls": pa.array([1, None, 3, 4, None, 6]),
        "large_string": pa.array(list("abcdef"), pa.large_string()),
        "binary": pa.array([b"a", b"b", b"\x00", b"d", b"e", b"f"]),
        "decimal": pa.array([decimal.Decimal(f"{i}.5") for i in range(6)], pa.decimal128(10, 2)),
        "date": pa.array([datetime.date(2020, 1, i + 1) for i in range(6)]),
        "timestamp_tz": pa.array([datetime.datetime(2020, 1, 1, i) for i in range(6)],
                                 pa.timestamp("us", tz="Europe/Paris")),
        "duration": pa.array([datetime.timedelta(seconds=i) for i in range(6)], pa.duration("s")),
        "dictionary": pa.array(list("xyxzyw")).dictionary_encode(),
        "map": pa.array([[("k", i)] for i in range(6)], pa.map_(pa.string(), pa.int64())),
    }


@pytest.mark.parametrize("column", list(_arrow_columns()))
def test_each_arrow_type_is_hashed_so_a_changed_value_alone_retrains(tmp_path, column):
    """Groups of an Arrow table with a column of each kind users bring
    (nulls, decimals, dates, time zones, dictionaries, maps): a re-run reuses
    every model, and a changed value in one group retrains that group alone."""
    import pyarrow as pa

    values = _arrow_columns()[column]
    groups = pa.array([1, 1, 2, 2, 3, 3])
    store = tmp_path / "store"

    def train(table):
        return mm.train(_rows_per_list, mm.groups(table, by="g"), store=store,
                        backend="threads", workers=1, progress=False)

    assert train(pa.table({"g": groups, column: values})).summary().ok == 3
    assert train(pa.table({"g": groups, column: values})).summary().reused == 3
    changed = values.to_pylist()
    changed[5] = changed[0]  # group 3's last row
    after = train(pa.table({"g": groups, column: pa.array(changed, values.type)}))
    assert after.results.set_index("g")["reused"].to_dict() == {1: True, 2: True, 3: False}


def test_nested_values_of_different_kinds_never_hash_alike():
    """A nested value's text tags each part with its kind: a string never
    reads as the bytes or the date it spells, 1 is not 1.0, and the order of
    a list counts; a zero and a NaN are one value each, as at the top level."""
    import datetime

    import pyarrow as pa

    from manymodels.identity.rowhash import arrow_row_hashes

    def hashes(values, kind):
        return arrow_row_hashes(pa.table({"c": pa.array(values, kind)})).tolist()

    strings = hashes([["b'abc'"], ["datetime.date(2020, 1, 1)"], ["ab", "c"], ["a", "bc"]],
                     pa.list_(pa.string()))
    assert len(set(strings)) == 4
    assert hashes([[b"abc"]], pa.list_(pa.binary()))[0] != strings[0]
    assert hashes([[datetime.date(2020, 1, 1)]], pa.list_(pa.date32()))[0] != strings[1]
    assert len(set(hashes([[1, 2], [2, 1]], pa.list_(pa.int64())))) == 2
    assert hashes([[1]], pa.list_(pa.int64())) != hashes([[1.0]], pa.list_(pa.float64()))
    zeros = hashes([[0.0], [-0.0], [float("nan")], [-float("nan")]], pa.list_(pa.float64()))
    assert zeros[0] == zeros[1] and zeros[2] == zeros[3] and zeros[0] != zeros[2]


def test_dictionary_encoded_lists_and_tensors_are_hashed_by_their_values():
    import numpy as np
    import pyarrow as pa

    from manymodels.identity.rowhash import arrow_row_hashes

    encoded = pa.DictionaryArray.from_arrays(pa.array([0, 1, 0]), pa.array([[1, 2], [3]]))
    plain = pa.array([[1, 2], [3], [1, 2]])
    assert (arrow_row_hashes(pa.table({"c": encoded})).tolist()
            == arrow_row_hashes(pa.table({"c": plain})).tolist())
    tensors = pa.FixedShapeTensorArray.from_numpy_ndarray(
        np.array([[[1, 2], [3, 4]], [[1, 2], [3, 5]], [[1, 2], [3, 4]]]))
    first, second, third = arrow_row_hashes(pa.table({"c": tensors})).tolist()
    assert first == third != second


@pytest.mark.parametrize("kind", ["union", "struct with a repeated field name"])
def test_a_column_no_value_of_which_can_be_told_apart_is_refused_by_name(tmp_path, kind):
    """A union (which of its types a value is of is lost in Python) and a
    struct whose fields share a name are refused, naming the column, before
    any work."""
    import pyarrow as pa

    payload = (pa.UnionArray.from_dense(pa.array([0, 1, 0, 1], pa.int8()),
                                        pa.array([0, 0, 1, 1], pa.int32()),
                                        [pa.array([5, 6]), pa.array([5.0, 6.0])])
               if kind == "union" else
               pa.StructArray.from_arrays([pa.array([1, 2, 3, 4]), pa.array([5, 6, 7, 8])],
                                          names=["a", "a"]))
    table = pa.table({"g": [1, 1, 2, 2], "payload": payload})
    with pytest.raises(TypeError, match="column 'payload' holds values that cannot be hashed"):
        mm.train(_rows_per_list, mm.groups(table, by="g"), store=tmp_path / "store",
                 backend="threads", workers=1, progress=False)
    assert not (tmp_path / "store").exists()  # refused before the store was made


@pytest.mark.parametrize("make", [
    lambda frame: mm.groups(frame.rename(columns={"g": "status"}), by="status"),
    lambda frame: mm.grid(error=[1, 2]),
    lambda frame: mm.items(["a", "b"]) * mm.grid(run_id=[1]),
])
def test_a_key_named_as_a_results_column_is_refused_before_any_work(tmp_path, make):
    """A key column (``by=``, a grid's parameter) named as a column the
    results add (status, error, run_id, ...) would show in ``run.results``
    as that column's values: refused by name before the store is made."""
    frame = pd.DataFrame({"g": ["a", "b"], "x": [1.0, 2.0]})
    store = tmp_path / "store"
    with pytest.raises(ValueError, match="(key column|grid parameter) '(status|error|run_id)' "
                                         "has the name"):
        mm.train(lambda *args, **kwargs: 1, make(frame), store=store, progress=False)
    assert not store.exists()


def test_an_empty_store_path_or_another_programs_sqlite_file_is_refused(tmp_path,
                                                                         monkeypatch):
    """An empty path would make the current directory a store; a SQLite file
    of something else as the index would get a store's tables beside its
    own: both are refused, and nothing is written."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(mm.StoreError, match="store path is empty"):
        mm.train(lambda item: item, mm.items([1, 2]), store="", progress=False)
    assert list(tmp_path.iterdir()) == []
    foreign = tmp_path / "theirs"
    foreign.mkdir()
    with sqlite3.connect(foreign / "index.sqlite") as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
        conn.execute("INSERT INTO users VALUES ('ada')")
    before = (foreign / "index.sqlite").read_bytes()
    with pytest.raises(mm.StoreError, match="SQLite file of something else.*users"):
        mm.train(lambda item: item, mm.items([1, 2]), store=foreign, progress=False)
    assert (foreign / "index.sqlite").read_bytes() == before
    with sqlite3.connect(foreign / "index.sqlite") as conn:
        assert [name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")] == ["users"]


def test_the_cli_reads_only_a_store_and_makes_none(tmp_path):
    from typer.testing import CliRunner

    from manymodels.cli.app import app

    plain = tmp_path / "plain"
    plain.mkdir()
    for command in (["runs", str(plain)], ["show", str(plain), "1"]):
        result = CliRunner().invoke(app, command)
        assert result.exit_code == 2, (command, result.output)
        assert "not a manymodels store" in message_words(result.output), command
    assert list(plain.iterdir()) == []


def message_words(output: str) -> str:
    """The words of a CLI message, whatever the terminal's width: rich draws an
    error in a box and wraps it at the width (80 columns by default, or
    COLUMNS), so a phrase may be split across lines between the box's borders."""
    without_box = re.sub("[\u2500-\u257f]", " ", output)  # box-drawing characters
    return " ".join(without_box.split())


def test_a_refused_run_leaves_an_existing_empty_folder_empty(tmp_path):
    """A store folder made beforehand (``mkdir models``) held an index once
    a run on it was refused at its plan (a Parquet key column of lists):
    only a path that did not exist was left alone."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = tmp_path / "lists.parquet"
    pq.write_table(pa.table({"g": [[1], [2]], "x": [1.0, 2.0]}), table)
    store = tmp_path / "models"
    store.mkdir()
    with pytest.raises(ValueError, match="by column 'g' holds list"):
        mm.train(lambda rows: 1, mm.groups(str(table), by="g"), store=store,
                 backend="serial", progress=False)
    assert list(store.iterdir()) == []
    (store / "notes.txt").write_text("kept")  # a folder of other files: as it was too
    with pytest.raises(ValueError, match="by column 'g' holds list"):
        mm.train(lambda rows: 1, mm.groups(str(table), by="g"), store=store,
                 backend="serial", progress=False)
    assert [path.name for path in store.iterdir()] == ["notes.txt"]
    run = mm.train(lambda n: 1, mm.grid(n=[1]), store=store, backend="serial",
                   progress=False)
    assert mm.Store(store).runs()["run_id"].tolist() == [run.run_id]


def _with_lock(n, lock):
    return {"n": n}


def test_a_run_refused_at_its_task_identities_leaves_no_store_behind(tmp_path):
    """A shared object that cannot be hashed (a store needs its hash) is named
    in the error, and a store that did not exist is not made (an empty one
    was left behind); an existing store gains no run."""
    import threading

    store = tmp_path / "store"
    with pytest.raises(TypeError, match="shared object 'lock' cannot be hashed"):
        mm.train(_with_lock, mm.grid(n=[1, 2]), shared={"lock": threading.Lock()},
                 backend="threads", store=store, progress=False)
    assert not store.exists()
    mm.train(lambda n: {"n": n}, mm.grid(n=[1, 2]), backend="threads", store=store,
             progress=False)
    with pytest.raises(TypeError, match="shared object 'lock'"):
        mm.train(_with_lock, mm.grid(n=[1, 2]), shared={"lock": threading.Lock()},
                 backend="threads", store=store, progress=False)
    assert mm.Store(store).runs()["run_id"].tolist() == [1]


def run_edited_job(tmp_path, job: str, edits: list[dict]) -> list[str]:
    """Write the script ``job`` with each of ``edits`` (its format values) in
    turn and run it, the store ``tmp_path / "store"`` as its argument: each
    run's standard output, stripped."""
    script = tmp_path / "job.py"
    outputs = []
    for values in edits:
        script.write_text(job.format(**values))
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "store")],
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout.strip())
    return outputs


#: A job whose class and setup function are edited between runs:
#: ``{factor}`` is in the class's method, ``{scale}`` the setup's value.
#: Prints each run's reused count and models per way of use.
EDITED_JOB = """
import sys
import manymodels as mm

class Scaler:
    def __init__(self, c):
        self.c = c
    def apply(self, v):
        return v * self.c * {factor}

GLOBAL = Scaler(1)

def make_scale():
    return {scale}

def fit_global(item):
    return GLOBAL.apply(item)

def fit_shared(item, scaler):
    return scaler.apply(item)

def fit_grid(item, scaler):
    return scaler.apply(item)

def fit_setup(item, scale):
    return item * scale

store = sys.argv[1]
out = []
for name, fit, source, extra in (
        ("global", fit_global, mm.items([1, 2]), {{}}),
        ("shared", fit_shared, mm.items([1, 2]), {{"shared": {{"scaler": Scaler(1)}}}}),
        ("grid", fit_grid, mm.items([1, 2]) * mm.grid(scaler=[Scaler(1)]), {{}}),
        ("setup", fit_setup, mm.items([1, 2]), {{"setup": {{"scale": make_scale}}}})):
    run = mm.train(fit, source, store=f"{{store}}/{{name}}", backend="serial",
                   progress=False, **extra)
    values = ",".join(map(str, sorted(run.models.values())))
    out.append(f"{{name}}={{run.summary().reused}}:{{values}}")
print(" ".join(out))
"""


def test_editing_the_code_behind_an_object_or_setup_retrains(tmp_path):
    """A class whose instance fit reads (a global, a shared object, a grid
    value) and a setup= function were hashed by their names alone: edited,
    their stale models were reused."""
    edits = [{"factor": 1, "scale": 1}, {"factor": 1, "scale": 1}, {"factor": 10, "scale": 3}]
    first, again, edited = (dict(part.split("=") for part in out.split())
                            for out in run_edited_job(tmp_path, EDITED_JOB, edits))
    assert first == {"global": "0:1,2", "shared": "0:1,2", "grid": "0:1,2", "setup": "0:1,2"}
    assert again == {"global": "2:1,2", "shared": "2:1,2", "grid": "2:1,2",
                     "setup": "2:1,2"}  # unchanged: reused
    assert edited == {"global": "0:10,20", "shared": "0:10,20", "grid": "0:10,20",
                      "setup": "0:3,6"}  # edited: retrained
    assert "code" in mm.Store(tmp_path / "store" / "setup").why_not_reused(1)


METRIC_JOB = """
import sys
import numpy as np, pandas as pd
import manymodels as mm
from sklearn.linear_model import LinearRegression

def bonus(model, test):
    return {{"bonus": {bonus}}}

def fit(rows):
    return LinearRegression().fit(rows[["x"]], rows["y"])

frame = pd.DataFrame({{"g": ["a"] * 20, "x": np.arange(20.0)}}).assign(y=lambda f: 2 * f.x)
run = mm.train(fit, mm.groups(frame, by="g"), store=sys.argv[1], backend="serial",
               progress=False, evaluate=mm.holdout(target="y", features=["x"],
                                                   metrics=["rmse", bonus]))
print(run.summary().reused, run.results["bonus"].tolist())
"""


def test_editing_a_metric_function_retrains(tmp_path):
    outputs = run_edited_job(tmp_path, METRIC_JOB, [{"bonus": 1.0}, {"bonus": 1.0},
                                                   {"bonus": 7.0}])
    assert outputs == ["0 [1.0]", "1 [1.0]", "0 [7.0]"]


class _SameText:
    def __init__(self, value):
        self.value = value

    def __repr__(self):
        return "SameText(...)"

    def __eq__(self, other):
        return isinstance(other, _SameText) and other.value == self.value

    def __hash__(self):
        return hash(self.value)


def _value_of(item, option):
    return option.value


def test_grid_values_that_read_the_same_are_refused_with_a_store(tmp_path):
    """The store names a model by its grid values' text: two estimators
    whose shortened reprs read the same shared one stored model."""
    source = mm.items([1]) * mm.grid(option=[_SameText(1), _SameText(2)])
    with pytest.raises(ValueError, match="values 0 and 1 of grid parameter 'option' differ "
                                         "but read the same"):
        mm.train(_value_of, source, store=tmp_path / "s", backend="serial", progress=False)
    assert not (tmp_path / "s").exists()
    run = mm.train(_value_of, source, backend="serial", progress=False)  # no store: fine
    assert sorted(run.models.values()) == [1, 2]


def _double(item):
    return item * 2


def test_a_read_only_store_refuses_gc_delete_and_attach_by_name(tmp_path):
    mm.train(_double, mm.items([1, 2]), store=tmp_path / "s", backend="serial", progress=False)
    reader = mm.Store(tmp_path / "s", read_only=True)
    for what, call in (("gc", reader.gc), ("delete", lambda: reader.delete(1)),
                       ("attach", lambda: reader.attach(1, "note", {"a": 1}))):
        with pytest.raises(mm.StoreError, match=f"open for reading only .*: {what} writes"):
            call()  # was sqlite3.OperationalError: attempt to write a readonly database
    assert dict(mm.Store(tmp_path / "s").models()) == {1: 2, 2: 4}


def test_a_store_inside_another_stores_artifacts_is_refused_and_left_alone_by_gc(tmp_path):
    """The outer store's gc deleted the inner store's files as strays."""
    outer = tmp_path / "outer"
    mm.train(_double, mm.items([1]), store=outer, backend="serial", progress=False)
    with pytest.raises(mm.StoreError, match="inside the artifacts folder of the store"):
        mm.Store(outer / "artifacts" / "inner")
    mm.train(_double, mm.items([3]), store=tmp_path / "inner", backend="serial",
             progress=False)
    os.rename(tmp_path / "inner", outer / "artifacts" / "inner")  # put there by hand
    mm.Store(outer).gc()
    assert dict(mm.Store(outer / "artifacts" / "inner").models()) == {3: 6}
    assert dict(mm.Store(outer).models()) == {1: 2}


def test_a_store_path_with_a_tilde_is_under_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    store = mm.Store("~/models", read_only=False)  # (open to write: made at once)
    assert store.path == tmp_path / "home" / "models"
    assert (tmp_path / "home" / "models" / "index.sqlite").is_file()
    assert not (tmp_path / "~").exists()


def _csv_files_in(folder):
    return len(list(Path(folder).glob("*.csv")))


def test_a_folder_item_retrains_when_its_files_change(tmp_path):
    """A folder given as an item was hashed by its path: files added to it
    left its stale model reused."""
    folder = tmp_path / "data" / "a"
    folder.mkdir(parents=True)
    (folder / "1.csv").write_text("x\n1\n")

    def run(item):
        return mm.train(_csv_files_in, mm.items([item]), store=tmp_path / "s",
                        backend="serial", progress=False)

    assert run(folder).summary().reused == 0
    assert run(str(folder)).summary().reused == 1  # unchanged, as a Path or as text
    (folder / "2.csv").write_text("x\n2\n")
    again = run(folder)
    assert again.summary().reused == 0 and list(again.models.values()) == [2]
    (folder / "2.csv").write_text("x\n3\n")  # a file's content changed
    assert run(folder).summary().reused == 0


RUNTIME_ATTRIBUTE_JOB = """
import sys
import helpers
import manymodels as mm

helpers.ALPHA = {alpha}  # set by the script, not in helpers.py

def fit(item):
    return item * helpers.ALPHA

run = mm.train(fit, mm.items([1, 2]), store=sys.argv[1], backend="serial", progress=False)
print(run.summary().reused, sorted(run.models.values()))
"""


def test_a_module_value_a_script_sets_is_part_of_the_identity(tmp_path):
    """helpers.ALPHA = 50 in the script, read by fit as helpers.ALPHA: the
    module's file was hashed, its value was not, and the stale models stayed."""
    (tmp_path / "helpers.py").write_text("ALPHA = 0\n")
    outputs = run_edited_job(tmp_path, RUNTIME_ATTRIBUTE_JOB, [{"alpha": 1}, {"alpha": 1},
                                                               {"alpha": 50}])
    assert outputs == ["0 [1, 2]", "2 [1, 2]", "0 [50, 100]"]


def _circular_metric_on_3(item):
    info: dict = {"n": item}
    if item == 3:
        info["self"] = info  # JSON cannot hold it
    return item, {"info": info, "r2": 0.5}


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_a_metric_json_cannot_hold_is_kept_as_why_not_the_whole_run_lost(tmp_path, backend):
    """One task's self-referring metric made the store's writer fail and
    every finished task of the run unrecorded (StoreError, run failed)."""
    run = mm.train(_circular_metric_on_3, mm.items(range(6)), store=tmp_path / "s",
                   backend=backend, workers=2, progress=False)
    assert (run.results["status"] == "ok").all()
    stored = mm.Store(tmp_path / "s").results().set_index("item")
    assert (stored["status"] == "ok").all() and (stored["r2"] == 0.5).all()
    assert stored.loc[3, "info"].startswith("<not stored: ValueError: Circular reference")
    assert stored.loc[2, "info"] == {"n": 2}


def _with_a_run_id_metric(item):
    return item, {"run_id": 99}


def test_a_metric_named_run_id_does_not_break_reading_the_store(tmp_path):
    mm.train(_with_a_run_id_metric, mm.items([1, 2]), store=tmp_path / "s",
             backend="serial", progress=False)
    results = mm.Store(tmp_path / "s").results()  # raised: cannot insert run_id
    assert results["run_id"].tolist() == [1, 1] and results["metric_run_id"].tolist() == [99, 99]


def _change_directory(item, elsewhere):
    os.chdir(elsewhere)
    return item


def test_a_relative_store_path_survives_a_fit_that_changes_directory(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path)
    run = mm.train(_change_directory, mm.items([1, 2]), store="models", backend="serial",
                   shared={"elsewhere": str(tmp_path / "elsewhere")}, progress=False)
    assert sorted(run.models.values()) == [1, 2]  # StoreError: models/artifacts/... not found
    assert dict(mm.Store(tmp_path / "models").models()) == {1: 1, 2: 2}


class _ExitsWhenPickled:
    def __reduce__(self):
        raise SystemExit(7)


def _exits_when_pickled_on_1(item):
    return _ExitsWhenPickled() if item == 1 else item


@pytest.mark.parametrize("backend", ["serial", "threads", "processes"])
def test_a_model_whose_pickling_raises_system_exit_fails_alone(tmp_path, backend):
    """serial and threads: train raised SystemExit with no .run, the store's
    run left running; processes: the task crashed its worker."""
    run = mm.train(_exits_when_pickled_on_1, mm.items(range(4)), store=tmp_path / "s",
                   backend=backend, workers=2, progress=False)
    results = run.results.set_index("item")
    assert results["status"].to_dict() == {0: "ok", 1: "failed", 2: "ok", 3: "ok"}
    assert "SystemExit(7)" in results.loc[1, "error"]
    assert mm.Store(tmp_path / "s").runs()["status"].tolist() == ["finished"]


class _Counter:
    def __init__(self):
        self.calls = 0


def _count_and_return(item, counter):
    counter.calls += 1
    return counter  # the same object, changed by every later task


def test_serial_and_threads_store_a_model_as_fit_returned_it(tmp_path):
    """The store pickled each model when it committed, after later tasks had
    changed it: every stored model read the last task's state."""
    run = mm.train(_count_and_return, mm.items(range(4)), shared={"counter": _Counter()},
                   store=tmp_path / "s", backend="serial", progress=False)
    assert [run.models[i].calls for i in range(4)] == [1, 2, 3, 4]


def _small_model(item):
    return item


def test_gc_counts_only_the_files_it_removed(tmp_path, monkeypatch):
    """A stray gc could not remove (not removable by this user) is not
    counted as removed; it is left for the next gc, which counts it."""
    import time

    store = tmp_path / "store"
    mm.train(_small_model, mm.items(range(2)), store=store, backend="serial", progress=False)
    strays = [store / "artifacts" / "ab" / (c * 2 + "0" * 62) for c in "ab"]
    for stray in strays:
        stray.parent.mkdir(exist_ok=True)
        stray.write_bytes(b"x" * 10)
        os.utime(stray, (time.time() - 7200, time.time() - 7200))
    real_unlink = Path.unlink

    def unlink(self, *args, **kwargs):
        if self == strays[0]:
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink)
    registry = mm.Store(store)
    assert registry.gc() == 1
    assert strays[0].exists() and not strays[1].exists()
    monkeypatch.setattr(Path, "unlink", real_unlink)
    assert registry.gc() == 1 and not strays[0].exists()


def _large_or_small(item):
    return np.zeros(200_000 if item else 4)  # item 1: a model file of its own


def test_gc_counts_a_deleted_model_once_whatever_became_of_its_file(tmp_path, monkeypatch):
    """A deleted run's model in a file counts when its file is removed: one
    that could not be is counted by the gc that removes it, not twice."""
    import time

    from manymodels.store import collect

    store = tmp_path / "store"
    run = mm.train(_large_or_small, mm.items(range(2)), store=store, backend="serial",
                   progress=False)
    (model_file,) = [f for f in (store / "artifacts").rglob("*")
                     if f.is_file() and len(f.name) == 64]
    registry = mm.Store(store)
    registry.delete(run.run_id)
    real_unlink = Path.unlink

    def unlink(self, *args, **kwargs):
        if self == model_file:
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink)
    assert registry.gc() == 1 and model_file.exists()  # the packed model
    monkeypatch.setattr(Path, "unlink", real_unlink)
    old = time.time() - 2 * collect.STRAY_AGE_S  # (an hour later: a stray now)
    os.utime(model_file, (old, old))
    assert registry.gc() == 1 and not model_file.exists()


class _Constant:
    def __init__(self, value):
        self.value = value

    def predict(self, X):
        return np.full(len(X), self.value)


def _constant_of_group(rows):
    return _Constant({"a": 1, "b": "bbbbb", "c": True, "d": 7}[rows["g"].iloc[0]])


def test_predictions_of_several_kinds_across_groups_keep_their_own(tmp_path):
    """With NumPy 2, the predictions of a group of numbers and one of text
    were joined as text (1 became "1"), and True beside 7 became 1."""
    frame = pd.DataFrame({"g": list("abcd"), "x": [0.0, 1.0, 2.0, 3.0]})
    mm.train(_constant_of_group, mm.groups(frame, by="g"), store=tmp_path / "s",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    got = store.predict(frame, by="g")
    assert got.tolist() == [1, "bbbbb", True, 7]
    assert [type(v) for v in got] == [int, str, bool, int]
    numbers = store.predict(frame[frame["g"].isin(["a", "d"])], by="g")
    assert numbers.dtype == np.int64 and numbers.tolist() == [1, 7]


def test_a_flipped_bit_in_a_task_block_is_refused_never_read_as_other_values(tmp_path):
    """A bit flipped in a block was read back silently changed (status "ok"
    as "okok", a model's size or SHA-256 as another's), or crashed the
    process inside Arrow; each block now carries a CRC-32."""
    frame = pd.DataFrame({"g": np.repeat(np.arange(100), 3), "x": np.arange(300.0)})
    mm.train(lambda rows: float(rows["x"].sum()), mm.groups(frame, by="g"),
             store=tmp_path / "s", backend="serial", progress=False)
    index = tmp_path / "s" / "index.sqlite"
    with sqlite3.connect(index) as conn:
        block_id, data = conn.execute("SELECT block_id, data FROM task_blocks").fetchone()
    assert bytes(data[-8:-4]) == b"MMc1"
    expected = mm.Store(tmp_path / "s").results()
    positions = np.unique(np.linspace(0, len(data) - 1, 60).astype(int))
    for position in positions.tolist():
        damaged = bytearray(data)
        damaged[position] ^= 0x10
        with sqlite3.connect(index) as conn:
            conn.execute("UPDATE task_blocks SET data = ? WHERE block_id = ?",
                         (bytes(damaged), block_id))
        with pytest.raises(mm.StoreIntegrityError, match=f"task block {block_id} of run 1 .* "
                                                         "is damaged"):
            mm.Store(tmp_path / "s", read_only=True).results()
    with sqlite3.connect(index) as conn:
        conn.execute("UPDATE task_blocks SET data = ? WHERE block_id = ?", (data, block_id))
    pd.testing.assert_frame_equal(mm.Store(tmp_path / "s").results(), expected)
    # a block written before checksums (the stream alone) is read as it is
    with sqlite3.connect(index) as conn:
        conn.execute("UPDATE task_blocks SET data = ? WHERE block_id = ?",
                     (bytes(data[:-8]), block_id))
    pd.testing.assert_frame_equal(mm.Store(tmp_path / "s").results(), expected)


def test_a_store_whose_making_was_killed_opens_after_its_journal_is_rolled_back(tmp_path):
    """A driver killed while it made a new store's index left a hot rollback
    journal: the index's read-only check could not roll it back, and every
    later open called the store damaged ("attempt to write a readonly
    database"), for good."""
    import struct

    store = tmp_path / "new"
    (store / "artifacts").mkdir(parents=True)
    with sqlite3.connect(store / "index.sqlite") as conn:  # as the killed driver left it
        conn.execute("PRAGMA page_size=65536")
        conn.execute("PRAGMA journal_mode=WAL")
    header = bytes.fromhex("d9d505f920a163d7") + struct.pack(">IIIII", 0, 0x1234, 0, 512, 65536)
    (store / "index.sqlite-journal").write_bytes(header + bytes(512 - len(header)))
    run = mm.train(lambda rows: len(rows), mm.groups(pd.DataFrame({"g": [1, 2]}), by="g"),
                   store=store, backend="serial", progress=False)
    assert run.failed.empty and not (store / "index.sqlite-journal").exists()
    assert mm.Store(store).runs()["status"].tolist() == ["finished"]


def test_a_packed_model_gone_with_its_run_or_cut_short_is_said_to_be(tmp_path):
    """Models listed before their run was deleted and collected were each
    called "missing" (and recorded corrupt), naming no store; a pack cut
    short was "missing" too, where verify says truncated."""
    frame = pd.DataFrame({"g": [1, 2, 3], "x": [1.0, 2.0, 3.0]})
    for changed in (0.0, 1.0):  # run 2 retrains every group: run 1's models are its own
        mm.train(lambda rows: [float(rows["x"].sum())], mm.groups(frame.assign(
            x=frame["x"] + changed), by="g"), store=tmp_path / "s", backend="serial",
            progress=False)
    held = mm.Store(tmp_path / "s").models(run=1)
    other = mm.Store(tmp_path / "s")
    other.delete(1)
    other.gc()
    with pytest.raises(mm.StoreIntegrityError, match=r"of key 1 \(pack \d+, bytes [-\d]+\) is "
                       f"missing from the store {re.escape(repr(str(tmp_path / 's')))}: its "
                       r"pack is gone \(its run was deleted"):
        held[1]
    with sqlite3.connect(tmp_path / "s" / "index.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM corrupt_artifacts").fetchone()[0] == 0
        conn.execute("UPDATE packs SET blob = substr(blob, 1, 10)")
    with pytest.raises(mm.StoreIntegrityError, match="its pack holds 10 bytes, cut short"):
        mm.Store(tmp_path / "s").load(3)


def _none_for_c(rows):
    return None if rows["g"].iloc[0] == "c" else {"m": 1.0}


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_a_fit_that_returned_none_is_reused_not_retrained(tmp_path, backend):
    """A task whose fit returned None (ok, no model, no metrics) was trained
    again on every run, and why_not_reused blamed a model that "could not be
    loaded (missing from the store, or found corrupt)"."""
    frame = pd.DataFrame({"g": np.repeat(["a", "c"], 5), "y": np.arange(10.0)})
    runs = [mm.train(_none_for_c, mm.groups(frame, by="g"), store=tmp_path / "s",
                     backend=backend, workers=1, progress=False) for _ in range(2)]
    assert runs[0].results["reused"].tolist() == [False, False]
    assert runs[1].results["reused"].tolist() == [True, True]
    assert runs[1].results["status"].tolist() == ["ok", "ok"]
    changed = mm.train(_none_for_c, mm.groups(frame.assign(y=frame["y"] + 1), by="g"),
                       store=tmp_path / "s", backend=backend, workers=1, progress=False)
    assert changed.results["reused"].tolist() == [False, False]


def _ridge_of_group(rows):
    from sklearn.linear_model import Ridge

    return Ridge().fit(rows[["x"]], rows["y"])


def test_a_linear_models_row_with_a_missing_feature_is_refused_as_scikit_learn_does(tmp_path):
    """The linear fast path (X @ coef_) answered NaN or -inf for a row with a
    NaN or infinite feature, source "group", where scikit-learn's predict
    (and every other model) refuses it."""
    frame = pd.DataFrame({"g": ["a"] * 5 + ["b"] * 5, "x": np.arange(10.0), "y": np.arange(10.0)})
    mm.train(_ridge_of_group, mm.groups(frame, by="g"), store=tmp_path / "s", backend="serial",
             progress=False)
    store = mm.Store(tmp_path / "s")
    fine = store.predict(pd.DataFrame({"g": ["a", "b"], "x": [1.0, 2.0]}), by="g",
                         backend="serial")
    assert np.isfinite(fine).all()
    for bad in (np.nan, np.inf):
        with pytest.raises(ValueError, match=r"(?s)predicting group 'a': column 'x' holds "
                                             r"(NaN|infinity).*Input X contains (NaN|infinity)"):
            store.predict(pd.DataFrame({"g": ["a", "b"], "x": [bad, 2.0]}), by="g",
                          backend="serial")


@pytest.mark.parametrize("where", ["new folder", "new folders", "empty folder"])
def test_a_new_store_refused_by_a_full_disk_leaves_nothing_and_is_made_once_there_is_room(
        small_disk, where):
    """A real full disk (a tmpfs filled up) while a store's index is made: the
    refusal removes what that call made (the index, artifacts/, the folders
    it created; a folder that was there stays, empty), so that a second try
    while the disk is still full is refused the same way (not called a
    damaged store), and a try once there is room makes the store."""
    mount, _ = small_disk
    filler = mount / "filler"
    fill(filler)  # the disk full, to the last block
    store = {"new folder": mount / "store", "new folders": mount / "a" / "b" / "store",
             "empty folder": mount / "store"}[where]
    if where == "empty folder":
        filler.write_bytes(b"")  # (room for the folder itself)
        store.mkdir()
        fill(filler)
    for _ in range(2):
        with pytest.raises(mm.StoreError, match="disk is full") as caught:
            mm.train(fit_big, mm.items(range(2)), store=store, backend="serial",
                     progress=False)
        left = sorted(p.name for p in mount.iterdir())
        assert left == (["filler", "store"] if where == "empty folder" else ["filler"])
        if where == "empty folder":
            assert list(store.iterdir()) == []
        assert "could not be made, and nothing of it is left" in str(caught.value)
    filler.unlink()
    run = mm.train(fit_big, mm.items(range(2)), store=store, backend="serial", progress=False)
    assert (run.results["status"] == "ok").all()
    assert mm.Store(store).runs()["status"].tolist() == ["finished"]


def fill(file: Path) -> None:
    """Write ``file`` until its file system is full (a real ENOSPC)."""
    with open(file, "wb") as out, pytest.raises(OSError):
        while True:
            out.write(b"x" * 65536)
            out.flush()


def _ridge_of_price_and_promo(rows):
    from sklearn.linear_model import Ridge

    return Ridge().fit(rows[["price", "promo"]], rows["sales"])


@pytest.mark.parametrize("backend", [None, "threads"])
def test_predict_names_a_feature_column_the_table_lacks_before_any_group_runs(tmp_path,
                                                                              backend):
    """A table without one of the models' features (by feature_names_in_)
    failed group by group with the model's KeyError deep in a traceback
    ('predicting group 's0' failed: Traceback ... KeyError: 'promo'); a
    method the models lack, likewise; features= as one name was read letter
    by letter (column 'p')."""
    frame = pd.DataFrame({"store": np.repeat(["s0", "s1"], 10), "price": np.arange(20.0),
                          "promo": np.tile([0, 1], 10), "sales": np.arange(20.0) * 2})
    mm.train(_ridge_of_price_and_promo, mm.groups(frame, by="store"), store=tmp_path / "s",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    with pytest.raises(ValueError, match=r"^column 'promo' is not in the table to predict: "
                       r"the model of group 's0' was fitted with it"):
        store.predict(frame.drop(columns="promo"), by="store", backend=backend)
    with pytest.raises(ValueError, match=r"^method='predict_proba', but the model of group "
                       r"'s0' \(Ridge\) has no method"):
        store.predict(frame, by="store", method="predict_proba", backend=backend)
    with pytest.raises(TypeError, match="method must be the name"):
        store.predict(frame, by="store", method=None)
    with pytest.raises(TypeError, match="features must be a column name or a list"):
        store.predict(frame, by="store", features={"price"})
    got = store.predict(frame.drop(columns="sales"), by="store", features="price",
                        fn=lambda model, rows: model.predict(
                            rows.assign(promo=0)[["price", "promo"]]))
    assert len(got) == 20  # (features as one name: that column)


def test_a_linear_model_given_a_date_for_a_number_is_refused_not_answered(tmp_path):
    """scikit-learn's linear regressors, applied as X @ coef_ + intercept_,
    cast a datetime feature column to float: a date became its microseconds
    since 1970 and the prediction -4.6e15, where scikit-learn refuses it."""
    frame = pd.DataFrame({"store": np.repeat(["s0", "s1"], 10), "price": np.arange(20.0),
                          "promo": np.tile([0, 1], 10), "sales": np.arange(20.0) * 2})
    mm.train(_ridge_of_price_and_promo, mm.groups(frame, by="store"), store=tmp_path / "s",
             backend="serial", progress=False)
    dated = frame.drop(columns="sales").assign(price=pd.Timestamp("2020-01-01"))
    with pytest.raises(ValueError, match=r"(?s)^predicting group 's0': column 'price' holds "
                                         "datetimes.*DateTime64DType"):
        mm.Store(tmp_path / "s").predict(dated, by="store", backend="serial")


def test_an_export_cut_short_by_a_full_disk_leaves_no_half_file(tmp_path, small_disk):
    """Store.export wrote its Parquet file in place: a full disk left a
    half file (8 KB of a 14 KB export, unreadable) at the path, and one cut
    short over an earlier export destroyed it."""
    mount, _ = small_disk
    frame = pd.DataFrame({"g": np.repeat(np.arange(300), 2), "x": np.arange(600.0)})
    mm.train(lambda rows: (None, {"m": float(rows["x"].sum())}), mm.groups(frame, by="g"),
             store=tmp_path / "s", backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    earlier = store.export(mount / "results.parquet")
    size = earlier.stat().st_size
    import shutil

    (mount / "fill").write_bytes(b"\0" * (shutil.disk_usage(mount).free - size // 2))
    for name in ("new.parquet", "results.parquet"):
        with pytest.raises(OSError, match=f"cannot write the export '.*{name}'"):
            store.export(mount / name)
    assert sorted(p.name for p in mount.iterdir()) == ["fill", "results.parquet"]
    assert len(pd.read_parquet(earlier)) == 300


def _remove_on_second_item(item, folder):
    import shutil

    if item == 1:  # (the first item's task committed: COMMIT_EVERY_S is 0)
        shutil.rmtree(folder)
    return [item]


_GONE_WRITES = {
    "gc": lambda store, folder: store.gc(),
    "delete": lambda store, folder: store.delete(1),
    "attach": lambda store, folder: store.attach(1, "x", 1),
    "verify": lambda store, folder: store.verify(),
    "train": lambda store, folder: mm.train(lambda item: [item], mm.items(range(2)),
                                            store=store, backend="serial", progress=False),
    "linear": lambda store, folder: mm.linear(
        pd.DataFrame({"g": [0, 0, 1, 1], "x": [0.0, 1, 0, 1], "y": [1.0, 2, 3, 5]}), by="g",
        features=["x"], target="y", store=store),
    "train, removed mid-run": lambda store, folder: mm.train(
        _remove_on_second_item, mm.items(range(3)), store=store, backend="serial",
        progress=False, shared={"folder": folder}),
}


@pytest.mark.parametrize("write", list(_GONE_WRITES))
def test_a_write_to_a_store_removed_while_open_says_it_is_gone(tmp_path, monkeypatch, write):
    """A Store opened, its folder then removed (rm -rf by another hand): a
    run into it was refused as "not a manymodels store index, or damaged",
    and gc, delete, attach, verify, mm.linear and a run in the Store's own
    thread "succeeded" into the removed files, lost without a word. Each
    says the store is gone, naming it, and writes nothing (the folder is not
    made again)."""
    import shutil

    from manymodels.store import recorder

    monkeypatch.setattr(recorder, "COMMIT_EVERY_S", 0.0)  # (mid-run: a commit per task)
    folder = tmp_path / "s"
    mm.train(lambda item: [item], mm.items(range(2)), store=folder, backend="serial",
             progress=False)
    store = mm.Store(folder)
    if write != "train, removed mid-run":
        shutil.rmtree(folder)
    with pytest.raises(mm.StoreError, match=f"{re.escape(repr(str(folder)))} is gone: its "
                                            "folder was removed"):
        _GONE_WRITES[write](store, folder)
    assert not folder.exists()


def test_a_closed_store_is_refused_by_name_in_every_thread(tmp_path):
    """A store used after ``close()`` raised sqlite3's 'Cannot operate on a
    closed database' in the thread that closed it, and in another thread
    opened a new connection as if it had never been closed. ``with`` closes
    it at the block's end."""
    mm.train(lambda item: {"score": float(item)}, mm.items([1, 2]), backend="serial",
             store=tmp_path / "store", progress=False)
    with mm.Store(tmp_path / "store") as store:
        assert len(store.runs()) == 1
    with pytest.raises(mm.StoreError, match="was closed: open it again"):
        store.runs()
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_error_of(store.runs)))
    thread.start()
    thread.join()
    assert "was closed" in errors[0]
    store.close()  # again: nothing to do


def test_a_close_while_another_thread_opens_its_connection_leaves_nothing_open(
        tmp_path, monkeypatch):
    """A thread's first use opened its connection outside the lock ``close``
    takes: a close at that moment closed the others, and the new one was
    kept, the store usable in that thread after close. It is closed and the
    use refused by name."""
    from manymodels.store import database

    mm.train(lambda item: {"score": float(item)}, mm.items([1]), backend="serial",
             store=tmp_path / "store", progress=False)
    store = mm.Store(tmp_path / "store")
    opened, connect = [], database.connect

    def connect_then_close(*args, **kwargs):  # another thread's close, at that instant
        opened.append(connect(*args, **kwargs))
        closer = threading.Thread(target=store.close)
        closer.start()
        closer.join()
        return opened[-1]

    monkeypatch.setattr(database, "connect", connect_then_close)
    errors = []
    thread = threading.Thread(target=lambda: errors.append(_error_of(store.runs)))
    thread.start()
    thread.join()
    assert "was closed" in errors[0]
    with pytest.raises(sqlite3.ProgrammingError, match="closed"):
        opened[0].execute("SELECT 1")


@pytest.mark.parametrize("call", ["fetch", "blob", "write"])
def test_a_close_by_another_thread_mid_call_is_refused_by_name(tmp_path, call):
    """A thread in the middle of a call on the store (a cursor being read,
    a block's blob, a write's transaction) when another thread closed it got
    sqlite3's own error ("Cannot operate on a closed database", "bad
    parameter or other API misuse"), or the process crashed. It gets the
    store's error that it was closed, and what the write began is rolled
    back whole."""
    from manymodels.store import database

    path = tmp_path / "store"
    mm.train(lambda item: [item], mm.items(range(3)), backend="serial", store=path,
             progress=False)
    store = mm.Store(path)
    midway, closed, errors = threading.Event(), threading.Event(), []

    def use() -> None:
        conn = store._conn
        try:
            if call == "fetch":
                rows = conn.execute("SELECT run_id FROM runs")
                midway.set()
                closed.wait()
                rows.fetchall()
            elif call == "blob":
                (block,) = conn.execute("SELECT min(block_id) FROM task_blocks").fetchone()
                with conn.blobopen("task_blocks", "data", block, readonly=True) as blob:
                    midway.set()
                    closed.wait()
                    blob.read()
            else:
                with database.write_transaction(conn, path, "the test's write"):
                    conn.execute("INSERT INTO attachments VALUES (1, 'half', 'x')")
                    midway.set()
                    closed.wait()
                    conn.execute("INSERT INTO attachments VALUES (1, 'rest', 'x')")
        except Exception as exc:
            errors.append(exc)
        finally:
            midway.set()

    thread = threading.Thread(target=use)
    thread.start()
    midway.wait()
    store.close()
    closed.set()
    thread.join()
    assert [type(e) for e in errors] == [mm.StoreError], errors
    assert "was closed: open it again" in str(errors[0])
    with sqlite3.connect(path / "index.sqlite") as conn:
        assert conn.execute("SELECT count(*) FROM attachments").fetchone() == (0,)


def test_the_counts_of_runs_deleted_or_ended_are_not_kept(tmp_path):
    """``Store.runs`` kept each unfinished run's counts forever: a server's
    store whose runs were deleted and collected grew by every run it had
    counted. Only the runs unfinished at the last read are kept."""
    path = tmp_path / "store"
    for _ in range(3):
        mm.train(lambda item: {"score": float(item)}, mm.items([1, 2]), backend="serial",
                 store=path, progress=False)
    with sqlite3.connect(path / "index.sqlite") as conn:  # their drivers died
        conn.execute("UPDATE runs SET status = 'interrupted', ok = NULL, failed = NULL, "
                     "reused = NULL")
    with mm.Store(path) as store:
        assert store.runs()["ok"].tolist() == [2, 2, 2]
        assert sorted(store._counts) == [1, 2, 3]
        store.delete(1)
        store.delete(2)
        store.gc()
        with sqlite3.connect(path / "index.sqlite") as conn:  # ended since (as counted)
            conn.execute("UPDATE runs SET ok = 0, failed = 0, reused = 2")
        assert store.runs()["run_id"].tolist() == [3]
        assert store._counts == {}


def _error_of(call) -> str:
    try:
        call()
    except Exception as exc:
        return str(exc)
    return "no error"


def test_a_store_opened_for_reading_where_there_is_none_is_said_not_to_exist(tmp_path):
    """It said the index 'cannot be read', as of a file without permission."""
    with pytest.raises(mm.StoreError, match="does not exist: there is no store to read"):
        mm.Store(tmp_path / "typo", read_only=True)
    assert not (tmp_path / "typo").exists()


@pytest.mark.parametrize("path, refused", [
    ("results.csv", "export writes Parquet, not '.csv'"),
    ("s3://bucket/results.parquet", "export writes a file on this machine"),
])
def test_an_export_to_a_csv_name_or_an_object_store_is_refused_before_any_read(
        tmp_path, path, refused):
    """A .csv name got Parquet's bytes; an s3:// URI failed as a missing
    local folder."""
    mm.train(lambda item: {"m": float(item)}, mm.items([1, 2]), store=tmp_path / "s",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    with pytest.raises(ValueError, match=re.escape(refused)):
        store.export(path if "://" in path else tmp_path / path)
    assert not (tmp_path / "results.csv").exists()
    assert len(pd.read_parquet(store.export(tmp_path / "results.parquet"))) == 2


#: An export killed (SIGKILL) once its temporary file is written, before
#: it is renamed into place.
_KILLED_EXPORT = textwrap.dedent("""
    import os, signal, sys
    import pandas as pd
    import manymodels as mm

    write = pd.DataFrame.to_parquet
    def write_then_die(frame, path, **options):
        write(frame, path, **options)
        os.kill(os.getpid(), signal.SIGKILL)
    pd.DataFrame.to_parquet = write_then_die
    mm.Store(sys.argv[1]).export(sys.argv[2])
""")


def test_a_temporary_file_a_killed_export_left_is_removed_by_the_next_export(tmp_path):
    """A SIGKILL during export left its ``.NAME.xxxx.tmp`` beside the output
    for good: the next export (the command line's too) removes one whose
    process is gone and that no one wrote to for a minute; a live
    process's, or a fresh one, stays."""
    mm.train(lambda item: {"m": float(item)}, mm.items([1, 2]), store=tmp_path / "s",
             backend="serial", progress=False)
    out = tmp_path / "results.parquet"
    killed = subprocess.run([sys.executable, "-c", _KILLED_EXPORT, str(tmp_path / "s"),
                             str(out)], capture_output=True)
    assert killed.returncode == -9, killed.stderr
    (left,) = tmp_path.glob(".results.parquet.*.tmp")
    fresh = tmp_path / f".results.parquet.{killed.returncode + 2**22 + 7}.tmp"  # (no such pid)
    live = tmp_path / f".results.parquet.{os.getppid()}.tmp"  # (a process that runs)
    for file in (fresh, live):
        file.write_bytes(b"part")
    an_hour_ago = time.time() - 3600
    for file in (left, live):
        os.utime(file, (an_hour_ago, an_hour_ago))
    assert len(pd.read_parquet(mm.Store(tmp_path / "s").export(out))) == 2
    assert not left.exists() and fresh.exists() and live.exists()
    os.utime(fresh, (an_hour_ago, an_hour_ago))
    done = run_cli("export", tmp_path / "s", "-o", out)
    assert done.returncode == 0, done.stderr
    assert sorted(tmp_path.glob(".results.parquet.*")) == [live]


#: Holds a store's index's write lock until its standard input closes (another
#: driver committing, another gc): a process of its own.
_LOCK_HOLDER = textwrap.dedent("""
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    print("held", flush=True)
    sys.stdin.read()
    conn.execute("COMMIT")
""")


def _train_twice(store: Path) -> mm.Store:
    for base in (0, 1):
        mm.train(lambda item, base: item + base, mm.items(range(3)), store=store,
                 backend="serial", progress=False, shared={"base": base})
    return mm.Store(store)


def test_gc_delete_and_attach_beside_a_held_lock_name_the_store(tmp_path):
    """A write another process keeps waiting past the busy timeout raised
    SQLite's bare "database is locked" (gc, delete, attach, a run's start),
    naming no store; it is a StoreError naming the store, and the store is
    as it was."""
    store = tmp_path / "store"
    opened = _train_twice(store)
    opened._conn.execute("PRAGMA busy_timeout=20")  # (a minute, as opened)
    holder = subprocess.Popen([sys.executable, "-c", _LOCK_HOLDER, str(store / "index.sqlite")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        for what, call in (("gc", opened.gc), ("deleting run 1", lambda: opened.delete(1)),
                           ("attaching 'x' to run 1", lambda: opened.attach(1, "x", 1)),
                           ("the run could not start", lambda: mm.train(
                               lambda item: [item], mm.items(range(2)), store=opened,
                               backend="serial", progress=False))):
            with pytest.raises(mm.StoreError, match=re.escape(f"the store {str(store)!r} is "
                                                              "busy")) as caught:
                call()
            assert what in str(caught.value) and not opened._conn.in_transaction
    finally:
        holder.communicate("")
    assert list(opened.runs()["run_id"]) == [1, 2] and opened.attached("x", 1) is None
    opened.delete(1)
    assert opened.gc() == 3


def test_a_run_whose_commit_waits_past_the_busy_timeout_names_the_store(tmp_path,
                                                                        monkeypatch):
    """Another connection holding the write lock past the busy timeout (a
    long gc) while a run's writer commits: the run ended on SQLite's bare
    "OperationalError: database is locked". It says the store is busy,
    naming it; what was committed before stays, and a re-run reuses it."""
    from manymodels.store import database, recorder, writer

    monkeypatch.setattr(database, "BUSY_S", 0.05)
    monkeypatch.setattr(recorder, "COMMIT_EVERY_S", 0.0)  # (a commit per task)
    store, held, commits = tmp_path / "store", [], []
    commit = writer.StoreWriter._commit

    def locked_before_the_second(self, conn, handover):
        commits.append(handover["task_index"])
        if len(commits) == 2:  # the first task's committed: another connection takes the lock
            held.append(sqlite3.connect(store / "index.sqlite", isolation_level=None,
                                        check_same_thread=False))
            held[0].execute("BEGIN IMMEDIATE")
        return commit(self, conn, handover)

    monkeypatch.setattr(writer.StoreWriter, "_commit", locked_before_the_second)
    fit = lambda item: [item]  # noqa: E731  (the same code in both runs)
    try:
        with pytest.raises(mm.StoreError, match=re.escape(
                f"the store {str(store)!r} is busy: another process held")) as caught:
            mm.train(fit, mm.items(range(3)), store=store, backend="serial", progress=False)
        assert "finished task(s) could not be recorded" in str(caught.value)
    finally:
        for conn in held:
            conn.execute("COMMIT")
            conn.close()
    again = mm.train(fit, mm.items(range(3)), store=store, backend="serial", progress=False)
    assert again.summary().reused == 1 and again.summary().ok == 3


def test_a_run_deleted_by_another_process_meanwhile_is_refused_by_name(tmp_path, monkeypatch):
    """Another process deleting the run between a call's look-up of it and
    its write transaction (two deleting one run at once): delete failed with
    a TypeError (unpacking None), attach on SQLite's foreign key. Both say
    the store has no such run, and change nothing."""
    store = tmp_path / "store"
    first = _train_twice(store)
    other = mm.Store(store)
    looked_up = first._run_row

    def deleted_after_the_look_up(run, *args):
        found = looked_up(run, *args)
        other.delete(run)  # (its own connection: the index as another process sees it)
        return found

    monkeypatch.setattr(first, "_run_row", deleted_after_the_look_up)
    for run, call in ((1, lambda: first.delete(1)), (2, lambda: first.attach(2, "x", 1))):
        with pytest.raises(ValueError, match=rf"has no run {run} \(deleted meanwhile"):
            call()
    assert other.runs().empty and first.gc() == 6


def _gc_beside_own_run(item, store):
    """A fit that collects the store's garbage while its own run (threads:
    this driver's) is being written; its metrics: what it removed, and the
    index's free pages after."""
    if item == 0:
        with mm.Store(store) as opened:
            removed = opened.gc()
            (free,) = opened._conn.execute("PRAGMA freelist_count").fetchone()
        return np.zeros(1), {"removed": removed, "free": free}
    return np.full(20_000, float(item)), {}


def test_gc_beside_a_running_run_leaves_the_index_uncompacted(tmp_path):
    """gc compacted the index (VACUUM) while another driver's run was being
    written: VACUUM holds the write lock while it copies the whole index,
    and that run's writer waits a minute at most for its commit before the
    run fails. Beside a run, the freed pages stay for the index's next
    writes; a gc with no run running hands them back."""
    store = tmp_path / "store"
    old = mm.train(lambda item: np.full(20_000, float(item)), mm.items(range(20)), store=store,
                   backend="serial", progress=False)
    mm.Store(store).delete(old.run_id)
    run = mm.train(_gc_beside_own_run, mm.items(range(3)), shared={"store": str(store)},
                   store=store, backend="threads", progress=False)
    assert run.summary().ok == 3
    beside = run.results.set_index("item").loc[0]
    assert beside["removed"] == 20 and beside["free"] > 0
    with mm.Store(store) as opened:
        assert opened.gc() == 0
        assert opened._conn.execute("PRAGMA freelist_count").fetchone() == (0,)
        assert float(opened.load(2)[0]) == 2.0


class _Picky:
    """A model that refuses a row for a reason no column explains."""

    def predict(self, X):
        raise ArithmeticError("the moon is in the wrong phase")


def test_a_value_the_model_refuses_is_said_naming_its_column_and_group(tmp_path):
    """Text in a numeric feature (refused before any group runs), a NaN
    (said with the group, the column and the model's own message, as a
    ValueError: the table's fault), and any other error of a model (its
    message first, not the worker's traceback)."""
    frame = pd.DataFrame({"g": ["a"] * 5 + ["b"] * 5, "x": np.arange(10.0), "y": np.arange(10.0)})
    mm.train(_ridge_of_group, mm.groups(frame, by="g"), store=tmp_path / "s", backend="serial",
             progress=False)
    store = mm.Store(tmp_path / "s")
    text = pd.DataFrame({"g": ["a", "b"], "x": ["2.5", "hello"]})
    for backend in (None, "threads"):
        with pytest.raises(ValueError, match=r"^column 'x' of the table to predict holds text "
                                             r"\('hello'\), but the model of group 'a' \(Ridge\)"):
            store.predict(text, by="g", backend=backend)
        with pytest.raises(ValueError, match=r"^predicting group 'b': column 'x' holds NaN "
                                             r"\(1 of its 1 row\(s\)\), which its model \(Ridge\) "
                                             r"refuses: ValueError: Input X contains NaN"):
            store.predict(pd.DataFrame({"g": ["a", "b"], "x": [1.0, np.nan]}), by="g",
                          backend=backend, workers=2)
    picky = mm.train(lambda rows: _Picky(), mm.groups(frame, by="g"), store=tmp_path / "p",
                     backend="serial", progress=False)
    with pytest.raises(RuntimeError, match=r"^predicting group 'a' failed: ArithmeticError: "
                                           r"the moon is in the wrong phase\n") as caught:
        picky.store.predict(frame, by="g", features=["x"])
    assert "Traceback" in str(caught.value)  # after the message, for the model's author


def _encoded_ridge(rows):
    from sklearn.compose import make_column_transformer
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import OneHotEncoder

    encode = make_column_transformer((OneHotEncoder(handle_unknown="error"), ["a", "b"]))
    return make_pipeline(encode, Ridge()).fit(rows[["a", "b"]], rows["y"])


def test_a_pipelines_refusal_does_not_blame_the_text_it_encodes(tmp_path):
    """A pipeline that one-hot encodes text refusing an unknown category of
    column b was said as "column 'a' holds text" (the first column of text,
    which it reads): the model's own message is said first instead."""
    frame = pd.DataFrame({"g": ["k"] * 4, "a": ["p", "q", "p", "q"], "b": ["u", "v", "v", "u"],
                          "y": np.arange(4.0)})
    mm.train(_encoded_ridge, mm.groups(frame, by="g"), store=tmp_path / "s", backend="serial",
             progress=False)
    unknown = pd.DataFrame({"g": ["k"], "a": ["p"], "b": ["zzz"]})
    with pytest.raises(ValueError, match=r"^predicting group 'k': column 'b' holds text "
                                         r"\('zzz'\).*Found unknown categories") as caught:
        mm.Store(tmp_path / "s").predict(unknown, by="g", backend="serial")
    assert "column 'a'" not in str(caught.value).split("Traceback")[0]


def _scaled_ridge(rows):
    from sklearn.linear_model import Ridge
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    return make_pipeline(StandardScaler(), Ridge()).fit(rows[["a", "b"]], rows["y"])


def test_a_pipelines_refusal_of_text_it_quotes_names_the_column(tmp_path):
    """A pipeline that reads numbers (a scaler) refusing text, its message
    quoting the text, names the column that holds it: not blaming text a
    pipeline may read had dropped the column from every pipeline's refusal."""
    frame = pd.DataFrame({"g": ["k"] * 4, "a": np.arange(4.0), "b": np.arange(4.0),
                          "y": np.arange(4.0)})
    mm.train(_scaled_ridge, mm.groups(frame, by="g"), store=tmp_path / "s", backend="serial",
             progress=False)
    text = pd.DataFrame({"g": ["k"], "a": [1.0], "b": ["abc"]})
    with pytest.raises(ValueError, match=r"^predicting group 'k': column 'b' holds text "
                                         r"\('abc'\), which its model \(Pipeline\) refuses"):
        mm.Store(tmp_path / "s").predict(text, by="g", backend="serial")


def _ridge_of_two(rows):
    from sklearn.linear_model import Ridge

    return Ridge().fit(rows[["x", "z"]], rows["y"])


def test_features_other_than_the_models_are_refused_naming_both(tmp_path):
    """features= in another order, a subset, or with the key in it, failed in
    every group with scikit-learn's message about feature names (a wall of
    traceback), not naming features=."""
    frame = pd.DataFrame({"g": ["a"] * 5 + ["b"] * 5, "x": np.arange(10.0),
                          "z": np.ones(10), "y": np.arange(10.0)})
    mm.train(_ridge_of_two, mm.groups(frame, by="g"), store=tmp_path / "s", backend="serial",
             progress=False)
    store = mm.Store(tmp_path / "s")
    for features, why in [(["z", "x"], "in another order, or repeated"), (["x"], "it lacks 'z'"),
                          (["g", "x", "z"], "'g' is not one of them")]:
        said = f"features={features!r}, but the model of group 'a' (Ridge) was fitted on " \
               f"['x', 'z'] ({why})"
        with pytest.raises(ValueError, match="^" + re.escape(said)):
            store.predict(frame, by="g", features=features)


def _boosting_of_categories(rows):
    from sklearn.ensemble import HistGradientBoostingRegressor

    return HistGradientBoostingRegressor(max_iter=3, min_samples_leaf=1,
                                         categorical_features=["c"]).fit(rows[["x", "c"]],
                                                                         rows["y"])


def _tree_of_floats(rows):
    from sklearn.tree import DecisionTreeRegressor

    return DecisionTreeRegressor().fit(rows[["x"]].astype(float), rows["y"])


def test_text_a_numeric_model_reads_is_not_refused_before_it_runs(tmp_path):
    """Boosting's categorical features take text (a categorical column, or
    one named in ``categorical_features``), and a tree reads ``"nan"`` as a
    missing value: predict refused them up front as text that is no number."""
    frame = pd.DataFrame({"g": ["a"] * 4 + ["b"] * 4, "x": np.arange(8.0),
                          "c": ["u", "v"] * 4, "y": np.arange(8.0)})
    for fit, table in ((_boosting_of_categories, frame),
                       (_boosting_of_categories, frame.astype({"c": "category"})),
                       (_tree_of_floats, frame.assign(x=["1", "nan"] * 4))):
        run = mm.train(fit, mm.groups(frame, by="g"), backend="serial", progress=False,
                       store=tmp_path / fit.__name__)
        assert len(run.store.predict(table, by="g")) == len(table)
    with pytest.raises(ValueError, match=r"holds text \('hello'\)"):  # still refused
        run.store.predict(frame.assign(x=["1", "hello"] * 4), by="g")
    # a categorical of text that the model does not read as categories: refused
    # before any group runs, as the same text is, not by each group's predict
    with pytest.raises(ValueError, match=r"^column 'x' of the table to predict holds text"):
        run.store.predict(frame.assign(x=pd.Categorical(["1", "hello"] * 4)), by="g")
