"""The driver at scale: models pickled by workers and loaded lazily, the store
written by its own thread, identities computed for all groups at once."""

from __future__ import annotations

import hashlib
import pickle
import signal
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
from manymodels.engine.messages import Pickled
from manymodels.engine.partpacks import ModelPack
from manymodels.identity.hashing import task_identities
from manymodels.planning.plan import plan
from manymodels.store import taskblocks
from manymodels.store.lazymodels import IN_STORE

pytestmark = pytest.mark.usefixtures("no_leftovers")


def fit_small(data):
    x = np.column_stack([data["x"], np.ones(len(data["x"]))])
    coef = np.linalg.lstsq(x, data["y"], rcond=None)[0]
    return coef, {"slope": float(coef[0])}


def _table(groups: int, rows: int = 5, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    g = np.repeat(np.arange(groups), rows)
    x = rng.normal(size=groups * rows)
    return pd.DataFrame({"g": g, "x": x, "y": (g % 7 + 1) * x + rng.normal(size=len(g)) * 0.01})


@pytest.mark.parametrize("store", [False, True])
def test_models_pickled_by_workers_load_lazily_and_equal_eager_ones(tmp_path, store):
    table = _table(300)
    run = mm.train(fit_small, mm.groups(table, by="g", format="numpy"), workers=2,
                   progress=False, store=tmp_path / "s" if store else None)
    eager = mm.train(fit_small, mm.groups(table, by="g", format="numpy"), backend="serial",
                     progress=False)
    held = [run._records.model[i] for i in range(len(run._plan.tasks))]
    if store:  # committed: the driver keeps no copy, run.models loads from the store
        # (a pack whose every task was committed at once let go of its bytes)
        assert all(model is IN_STORE or type(model) is ModelPack and model.stored
                   and model.data == b"" and model.indices is None for model in held)
        assert any(type(model) is ModelPack for model in held)
    else:  # bytes until asked for, a part's models in one pack, hashed only for a store
        assert all(type(model) is ModelPack for model in held)
        assert all(model.pickled(i).sha256 is None for i, model in enumerate(held))
        assert len({id(model) for model in held}) < 300
    assert len(run.models) == 300
    for key, model in eager.models.items():
        np.testing.assert_array_equal(run.models[key], model)
    pd.testing.assert_series_equal(run.results["slope"], eager.results["slope"])
    if store:
        stored = mm.Store(tmp_path / "s")
        assert stored.results()["slope"].tolist() == eager.results["slope"].tolist()
        np.testing.assert_array_equal(stored.load(17), eager.models[17])


def test_a_model_pack_travels_whole_and_gives_each_model_with_its_sha256():
    """Workers send a part's small models as one ModelPack: pickled once
    however many outcomes name it, each model back as Pickled bytes with the
    SHA-256 a store checks."""
    import hashlib
    import pickle

    from manymodels.engine.partpacks import unpacked

    models = [pickle.dumps(np.arange(i)) for i in range(5)]
    pack = ModelPack().seal([40, 7, 12, 3, 99], models)
    outcomes = [(index, "ok", pack, None) for index in (40, 7, 12, 3, 99)]
    sent = pickle.loads(pickle.dumps(outcomes))
    assert len({id(outcome[2]) for outcome in sent}) == 1  # one pack, not five
    for (index, _, received, _), data in zip(sent, models):
        one = received.pickled(index)
        assert isinstance(one, Pickled) and one.data == data
        assert one.sha256 == hashlib.sha256(data).hexdigest()
        np.testing.assert_array_equal(received.load(index), pickle.loads(data))
        np.testing.assert_array_equal(unpacked(received, index).load(), pickle.loads(data))
    assert unpacked("as it is", 3) == "as it is"
    twice = ModelPack().seal([5, 5], [b"first", b"second"])  # as the store's writer: the first
    assert twice.pickled(5).data == b"first"


def test_every_row_naming_a_model_gets_its_artifact(tmp_path):
    """The writer sorts a hand-over's rows by the objects they name: a task
    listed twice (the same model object) is stored twice, packed or not."""
    import types

    from manymodels.store import artifacts
    from manymodels.store.writer import StoreWriter

    store = mm.Store(tmp_path / "s")
    store._make()  # a new store, written to through its internals
    conn = store._conn
    small, large = Pickled(b"s" * 20), Pickled(b"L" * (artifacts.SMALL_ARTIFACT + 5))
    pack = ModelPack().seal([7, 8], [b"seven", b"eight!"])
    conn.execute("BEGIN IMMEDIATE")
    tasks = [1, 1, 2, 2, 7, 8, 8, 9]
    artifact, sizes, written, located, whole = StoreWriter._write_models(
        types.SimpleNamespace(files=store.root), conn, tasks,
        [small, small, large, large, pack, pack, pack, None])
    conn.execute("COMMIT")
    assert whole == []  # task 8 named twice: the pack's slots are set one by one
    # two packs: the worker's two models as they came, and the one pickled in the driver
    assert written.tolist() == [[written[0, 0], 5 + 6], [written[0, 0] + 1, 20]]
    # the packed ones' locators are kept as their parts, read back as text
    assert artifact.to_pylist()[2:4] == [hashlib.sha256(large.data).hexdigest()] * 2
    assert artifact.null_count == 6
    block = taskblocks.table({"task_index": tasks, "artifact": artifact, "size": sizes,
                              **located})
    names = taskblocks.decode(taskblocks.encode(block), columns=["artifact"])["artifact"]
    names, sizes = names.to_pylist(), sizes.to_pylist()
    assert names[0] == names[1] and names[2] == names[3] and names[5] == names[6]
    assert names[7] is None and sizes[7] is None
    assert sizes == [20, 20, artifacts.SMALL_ARTIFACT + 5, artifacts.SMALL_ARTIFACT + 5,
                     5, 6, 6, None]
    loaded = [artifacts.read_artifact(conn, store.path, name, "t") for name in names[:7]]
    assert loaded == [small.data, small.data, large.data, large.data, b"seven", b"eight!",
                      b"eight!"]
    # a pack every task of which is in the hand-over, once each: committed whole
    other = ModelPack().seal([3, 4], [b"three", b"four"])
    conn.execute("BEGIN IMMEDIATE")
    *_, whole = StoreWriter._write_models(types.SimpleNamespace(files=store.root), conn,
                                          [4, 5, 3], [other, None, other])
    conn.execute("COMMIT")
    assert [(pack, rows.tolist()) for pack, rows in whole] == [(other, [0, 2])]
    store.close()


def fit_mixed(item):
    """Small models (packed), one over a MiB (an artifact of its own), and
    metrics without a model, mixed within each batch."""
    if item % 7 == 3:
        return {"item": item}
    if item % 11 == 5:
        return np.random.default_rng(item).random(140_000), {"item": item}
    return np.full(3, float(item)), {"item": item}


@pytest.mark.parametrize("backend", ["processes", "threads"])
def test_packed_large_and_absent_models_are_each_stored_under_their_task(tmp_path, backend):
    run = mm.train(fit_mixed, mm.items(range(60)), store=tmp_path / "s", backend=backend,
                   workers=2, progress=False)
    assert (run.results["status"] == "ok").all()
    expected = {item: fit_mixed(item)[0] for item in range(60) if item % 7 != 3}
    assert sorted(run.models) == sorted(expected)
    store = mm.Store(tmp_path / "s")
    store._make()  # a new store, written to through its internals
    for item, model in expected.items():
        np.testing.assert_array_equal(run.models[item], model)
        np.testing.assert_array_equal(store.load(item), model)
    results = store.results().set_index("item")
    assert results.loc[3, "artifact"] is None or pd.isna(results.loc[3, "artifact"])
    assert "@" not in results.loc[5, "artifact"]  # large: its own artifact, not packed
    assert "@" in results.loc[1, "artifact"]
    store.close()


class Unpicklable:
    def __reduce__(self):
        raise TypeError("this model refuses to be pickled")


def fit_unpicklable(item):
    return Unpicklable() if item == 2 else [item]


@pytest.mark.parametrize("store", [False, True])
def test_a_model_a_worker_cannot_pickle_fails_its_task_only(tmp_path, store):
    run = mm.train(fit_unpicklable, mm.items(range(5)), workers=2, progress=False,
                   store=tmp_path / "s" if store else None)
    results = run.results.set_index("item")
    assert results.loc[2, "status"] == "failed"
    assert "cannot be pickled" in results.loc[2, "error"]
    assert (results.drop(index=2)["status"] == "ok").all()


def test_group_identities_follow_each_groups_content_and_order():
    table = _table(50)

    def identities(frame):
        return task_identities(plan(mm.groups(frame, by="g")), fit_small,
                               None)[0].identity.to_pylist()

    before = identities(table)
    assert len(set(before)) == 50
    interleaved = table.iloc[np.argsort(np.arange(len(table)) % 5, kind="stable")]
    assert identities(interleaved) == before  # groups interleaved, each in its own order
    changed = table.copy()
    changed.loc[changed.index[changed["g"] == 7][2], "x"] += 1e-9  # one value of group 7
    after = identities(changed)
    assert [i for i, (a, b) in enumerate(zip(before, after)) if a != b] == [7]
    swapped = table.copy()
    rows = swapped.index[swapped["g"] == 9][:2]
    swapped.loc[rows, "x"] = swapped.loc[rows[::-1], "x"].to_numpy()  # order within group 9
    assert [i for i, (a, b) in enumerate(zip(before, identities(swapped))) if a != b] == [9]
    grid = task_identities(plan(mm.groups(table, by="g") * mm.grid(a=[1, 2])), fit_small,
                           None)[0]
    assert len(set(grid.identity.to_pylist())) == 100


def test_a_hand_over_holds_about_handover_tasks_and_each_pack_once(tmp_path, monkeypatch):
    """Many tasks finishing within a second go to the writer in hand-overs of
    about HANDOVER_TASKS (the driver holds up to three, with their models):
    one task block each, every task recorded once, and a worker's pack never
    cut in two (its bytes would be written by both hand-overs)."""
    from manymodels.store import recorder

    table = pd.DataFrame({"g": np.repeat(np.arange(400), 2), "x": np.tile([0.0, 1.0], 400)})
    table["y"] = table["x"] * table["g"]

    def stored(limit: int, path: Path) -> tuple[list[list[int]], int]:
        monkeypatch.setattr(recorder, "HANDOVER_TASKS", limit)
        run = mm.train(fit_small, mm.groups(table, by="g", format="numpy"), workers=2,
                       progress=False, store=path)
        assert len(run.ok) == 400
        with sqlite3.connect(path / "index.sqlite") as conn:
            blocks = [taskblocks.decode(data)["task_index"].to_pylist() for (data,) in
                      conn.execute("SELECT data FROM task_blocks ORDER BY rowid")]
            pack_bytes = conn.execute("SELECT sum(length(blob)) FROM packs").fetchone()[0]
        models = mm.Store(path).models()
        assert all(np.allclose(models[g], [g, 0.0]) for g in range(400))
        return blocks, pack_bytes

    blocks, pack_bytes = stored(16, tmp_path / "small")
    assert len(blocks) >= 400 // 64
    assert sorted(sum(blocks, [])) == list(range(400))
    whole_blocks, whole_pack_bytes = stored(10**9, tmp_path / "whole")
    assert len(whole_blocks) < len(blocks)
    assert pack_bytes == whole_pack_bytes  # no pack written twice


def test_the_store_is_written_off_the_drivers_thread(tmp_path):
    writers = []

    def fit(item):
        writers.extend(t.name for t in threading.enumerate() if "store-writer" in t.name)
        return [item]

    mm.train(fit, mm.items(range(20)), backend="serial", progress=False, store=tmp_path / "s")
    assert writers and set(writers) == {"manymodels-store-writer"}
    assert not [t for t in threading.enumerate() if "store-writer" in t.name]  # joined
    assert len(mm.Store(tmp_path / "s").results()) == 20


MANY_DRIVER = textwrap.dedent("""
    import sys, time
    import numpy as np, pandas as pd
    import manymodels as mm

    def fit(data):
        if int(data["g"][0]) >= 15_000:
            time.sleep(0.002)  # the tail is slow: the test kills the driver in it
        return data["x"].sum(), {"total": float(data["x"].sum())}

    g = np.repeat(np.arange(20_000), 3)
    table = pd.DataFrame({"g": g, "x": np.arange(len(g), dtype=float)})
    run = mm.train(fit, mm.groups(table, by="g", format="numpy"), store=sys.argv[1],
                   workers=2, progress=False)
    print(run.summary().reused)
""")


def test_a_driver_killed_mid_run_loses_at_most_the_last_second_and_resumes(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(MANY_DRIVER)
    store = tmp_path / "store"
    driver = subprocess.Popen([sys.executable, str(script), str(store)], cwd=tmp_path)
    deadline = time.monotonic() + 120

    def committed() -> int:
        try:
            with sqlite3.connect(store / "index.sqlite", timeout=5) as conn:
                return sum(
                    taskblocks.decode(data)["status"].to_pylist().count("ok")
                    for (data,) in conn.execute("SELECT data FROM task_blocks"))
        except sqlite3.Error:
            return 0

    while committed() < 5_000 and time.monotonic() < deadline and driver.poll() is None:
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    kept = committed()
    assert 5_000 <= kept < 20_000
    opened = mm.Store(store)
    assert opened.integrity_check() == "ok"
    assert opened.runs()["status"].tolist() == ["interrupted"]
    again = subprocess.run([sys.executable, str(script), str(store)], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert int(again.stdout.split()[-1]) == kept  # every committed model reused
    results = opened.results()
    assert len(results) == 20_000 and (results["status"] == "ok").all()
    expected = [float(3 * (3 * i) + 3) for i in range(20_000)]  # x = 3i, 3i+1, 3i+2
    assert results["total"].tolist() == expected


def fit_setting(alpha):
    return [alpha], {"alpha": alpha}


def test_a_bare_grid_with_a_store_trains_and_is_reused(tmp_path):
    first = mm.train(fit_setting, mm.grid(alpha=[1, 2, 3]), store=tmp_path / "s",
                     backend="serial", progress=False)
    assert (first.results["status"] == "ok").all()
    again = mm.train(fit_setting, mm.grid(alpha=[1, 2, 3, 4]), store=tmp_path / "s",
                     backend="serial", progress=False)
    assert again.results["reused"].tolist() == [True, True, True, False]


SET_SCRIPT = """
import sys
import pandas as pd
import hashlib

import manymodels as mm

COLUMNS = {"alpha", "beta", "gamma", "delta", "epsilon"}
sales = pd.DataFrame({"v": [%s]})  # a global table named like a column fit reads

def fit(df):
    return {"n": len(COLUMNS & set(df.columns)) + float(df.sales.sum())}

if __name__ == "__main__":
    table = pd.DataFrame({"g": [1, 1, 2], "sales": [1.0, 2.0, 3.0], "alpha": [0, 0, 0]})
    run = mm.train(fit, mm.groups(table, by="g"), store=sys.argv[1], backend="serial",
                   progress=False)
    print(run.summary().reused)
"""


def test_globals_hash_the_same_in_every_process_and_attributes_are_not_globals(tmp_path):
    script = tmp_path / "job.py"
    reused = []
    for seed, sales in (("1", "1"), ("2", "1"), ("3", "2")):
        script.write_text(SET_SCRIPT % sales)  # the global `sales` changes last: unread
        done = subprocess.run([sys.executable, str(script), str(tmp_path / "s")],
                              capture_output=True, text=True, cwd=tmp_path,
                              env={**__import__("os").environ, "PYTHONHASHSEED": seed})
        assert done.returncode == 0, done.stderr
        reused.append(int(done.stdout.split()[-1]))
    assert reused == [0, 2, 2]


def fit_array_metric(item):
    return [item], {"coef": np.array([1.5, 2.0]) * item, "pair": (item, 2)}


def test_metrics_are_the_same_whatever_the_backend_and_store(tmp_path):
    with_store = mm.train(fit_array_metric, mm.items(range(3)), workers=2, progress=False,
                          store=tmp_path / "s")
    reference = mm.train(fit_array_metric, mm.items(range(3)), backend="serial",
                         progress=False)
    for mine, theirs in zip(with_store.results["coef"], reference.results["coef"]):
        np.testing.assert_array_equal(mine, theirs)
    assert with_store.results["pair"].tolist() == reference.results["pair"].tolist()


def fit_writes_its_rows(data, alpha):
    before = float(data["x"][0])
    try:
        data["x"][0] = 1e9  # a fresh copy, or refused (a view the next task shares)
    except ValueError:
        pass
    return {"before": before}


def test_a_groups_rows_are_not_changed_by_an_earlier_setting_of_it():
    table = pd.DataFrame({"g": [1, 1, 2, 2], "x": [1.0, None, 3.0, 4.0]})  # a null: a copy
    for rows in (table, table.fillna(2.0)):  # with and without a copy from Arrow
        run = mm.train(fit_writes_its_rows, mm.groups(rows, by="g", format="numpy")
                       * mm.grid(alpha=list(range(6))), backend="serial", progress=False)
        assert (run.results["status"] == "ok").all()
        assert run.results.groupby("g")["before"].unique().to_dict() == {1: [1.0], 2: [3.0]}


class FailingBackend(mm.Backend):
    """Runs batches in the driver, then breaks down as an engine can."""

    name = "breaks"

    def start(self, context):
        from manymodels.engine.execution import Executor

        self._executor, self._queue, self._batches = Executor(context), [], 0

    def free_slots(self, per_worker):
        return 0 if self._queue else 1

    def submit(self, batch_id, tasks):
        self._queue.append(tasks)

    def poll(self, timeout):
        from manymodels.engine.messages import Finished

        if not self._queue:
            return []
        self._batches += 1
        if self._batches == 4:
            raise mm.WorkerStartupError("the engine went away")
        part = self._executor.run_batch(self._queue.pop())
        return [Finished(part.outcomes, worker=0, busy_s=part.busy_s)]

    def stop(self, *, force=False):
        self._queue = []


def test_a_backend_that_breaks_down_leaves_the_run_failed_and_what_finished_kept(tmp_path):
    with pytest.raises(mm.WorkerStartupError):
        mm.train(fit_setting, mm.grid(alpha=list(range(20))), backend=FailingBackend(),
                 store=tmp_path / "s", progress=False)
    assert not [t for t in threading.enumerate() if "store-writer" in t.name]
    store = mm.Store(tmp_path / "s")
    store._make()  # a new store, written to through its internals
    assert store.runs()["status"].tolist() == ["failed"]
    ok = store.results().query("status == 'ok'")
    assert len(ok) >= 3  # the first three batches, committed
    assert store.load(ok["alpha"].iloc[0]) == [ok["alpha"].iloc[0]]


def fit_lr_rows(df):
    from sklearn.linear_model import LinearRegression

    return LinearRegression().fit(df[["x"]], df["y"])


def test_a_group_with_a_missing_key_finds_its_model(tmp_path):
    table = pd.DataFrame({"k": ["a", "a", None, None], "x": [1.0, 2.0, 1.0, 2.0],
                          "y": [1.0, 2.0, 3.0, 6.0]})
    mm.train(fit_lr_rows, mm.groups(table, by="k"), store=tmp_path / "s", backend="serial",
             progress=False)
    predicted = mm.Store(tmp_path / "s").predict(table, by="k", features=["x"],
                                                 with_source=True)
    assert (predicted["source"] == "group").all()
    np.testing.assert_allclose(predicted["prediction"], table["y"])


def test_a_fork_waits_for_the_store_writer_to_leave_sqlite():
    import os

    from manymodels.store.writer import WRITING

    released = threading.Event()

    def commit_for_a_while():
        with WRITING:  # as the writer thread holds it around each transaction
            time.sleep(0.5)
            released.set()

    writer = threading.Thread(target=commit_for_a_while)
    writer.start()
    time.sleep(0.1)
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    forked_after_release = released.is_set()
    os.waitpid(pid, 0)
    writer.join()
    assert forked_after_release
    assert not WRITING.locked()


def test_an_earlier_run_with_the_same_tasks_is_matched_task_by_task():
    """The re-run's shortcut finds each task at its own number, as a hash join
    would, and gives way to the join whenever the earlier run differs."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from manymodels.identity.hashing import TaskIdentities
    from manymodels.store.reuse import _same_tasks

    def held(identities: pa.Array) -> TaskIdentities:
        return TaskIdentities(identities, None, None, None)

    wanted = pa.array([f"id{i}" for i in range(6)])
    numbers = np.array([3, 0, 5, 1, 4, 2])
    candidates = wanted.take(pa.array(numbers))
    task_index = pa.chunked_array([numbers[:2], numbers[2:]])
    everything = np.arange(6)
    at = _same_tasks(held(wanted), candidates, task_index, everything)
    assert at.to_pylist() == pc.index_in(wanted, value_set=candidates).to_pylist()
    # a trained task left out (failed there): the positions say which rows count
    kept = candidates.filter(pa.array(numbers != 5))
    at = _same_tasks(held(wanted.slice(0, 5)), kept, task_index, np.flatnonzero(numbers != 5))
    assert at.to_pylist() == pc.index_in(wanted.slice(0, 5), value_set=kept).to_pylist()
    changed = pa.array(["id0", "id1", "other", "id3", "id4", "id5"])
    assert _same_tasks(held(changed), candidates, task_index, everything) is None  # one changed
    # a task that run did not train (failed there): not found, the others are
    at = _same_tasks(held(wanted), candidates.slice(1), task_index, everything[1:])
    assert at.to_pylist() == pc.index_in(wanted, value_set=candidates.slice(1)).to_pylist()
    assert at.null_count == 1
    twice = pa.chunked_array([np.array([3, 0, 5, 1, 4, 4])])  # not each task once
    assert _same_tasks(held(wanted), wanted.take(pa.array([3, 0, 5, 1, 4, 4])), twice,
                       everything) is None
    beyond = pa.chunked_array([np.array([3, 0, 5, 1, 4, 6])])
    assert _same_tasks(held(wanted), candidates, beyond, everything) is None


def test_a_released_pack_keeps_no_bytes_and_stays_released_when_pickled():
    """The writer lets a committed pack go: its bytes and task lists are
    dropped, every slot naming it reads as a model in the store, and a run
    pickled with it still does."""
    import pickle

    from manymodels.run.results import _in_store

    pack = ModelPack().seal([1, 2], [b"one", b"two"])
    assert not _in_store(pack)
    pack.release()
    assert _in_store(pack) and pack.data == b"" and pack.indices is None
    again = pickle.loads(pickle.dumps(pack))
    assert type(again) is ModelPack and _in_store(again) and len(again) == 0


def _coefficients(item):
    return np.arange(3.0) * item  # a least-squares model's kind: 24 bytes in a 151-byte pickle


def test_small_arrays_of_one_kind_are_packed_as_a_template_once(tmp_path):
    """Worker processes pack a part's small arrays of one kind as the head and
    tail their pickles share, once, and each one's own bytes: the store
    keeps a sixth of the bytes (layout 5), and every model reads back byte
    for byte, checked by its SHA-256, now and in a re-run."""
    store = tmp_path / "s"
    run = mm.train(_coefficients, mm.items(range(200)), store=store, workers=2,
                   progress=False)
    assert run.summary().ok == 200
    with sqlite3.connect(store / "index.sqlite") as conn:
        rows = conn.execute("SELECT length(blob), head IS NOT NULL AND tail IS NOT NULL "
                            "FROM packs").fetchall()
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 5
    assert rows and all(templated for _, templated in rows)
    assert sum(length for length, _ in rows) == 200 * 24
    opened = mm.Store(store)
    for item in range(200):
        np.testing.assert_array_equal(opened.load(item), _coefficients(item))
    opened.close()
    again = mm.train(_coefficients, mm.items(range(200)), store=store, workers=2,
                     progress=False)
    assert again.summary().reused == 200
    np.testing.assert_array_equal(again.models[7], _coefficients(7))


def test_a_templated_pack_tampered_or_cut_short_is_refused_by_name(tmp_path):
    store = tmp_path / "s"
    mm.train(_coefficients, mm.items(range(40)), store=store, workers=2, progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        packs = conn.execute("SELECT pack_id, models, head FROM packs ORDER BY pack_id").fetchall()
        pack, models, head = packs[0]
        head = bytearray(head)
        head[-1] ^= 0xFF  # one byte of what every model of the pack starts with
        conn.execute("UPDATE packs SET head = ? WHERE pack_id = ?", (bytes(head), pack))
    opened = mm.Store(store)
    refused = []
    for item in range(40):
        try:
            np.testing.assert_array_equal(opened.load(item), _coefficients(item))
        except mm.StoreIntegrityError as exc:
            message = str(exc)
            assert "SHA-256" in message and f"key {item}" in message and f"pack {pack}" in message
            refused.append(item)
    assert len(refused) == models  # exactly that pack's models, each by name
    opened.close()
    if len(packs) > 1:  # another pack cut one byte short: its last model is gone, not misread
        other = packs[1][0]
        with sqlite3.connect(store / "index.sqlite") as conn:
            conn.execute("UPDATE packs SET blob = substr(blob, 1, length(blob) - 1) "
                         "WHERE pack_id = ?", (other,))
        again = mm.train(_coefficients, mm.items(range(40)), store=store, workers=2,
                         progress=False)
        # the models found corrupt are trained again, and the one cut short
        assert again.summary().reused == 40 - len(refused) - 1
        for item in range(40):
            if item not in refused:
                np.testing.assert_array_equal(mm.Store(store).load(item), _coefficients(item))


@pytest.mark.parametrize("cut", ["head", "tail"])
def test_a_templated_pack_whose_template_was_cut_is_not_reused(tmp_path, cut):
    """A pack's size is its whole length, template included: a re-run finds
    that a pack is shorter than written, and that no model of it reads back
    whole (its head or tail was cut: every model would fail its SHA-256
    when loaded), and trains that pack's models again instead of naming
    them as reused; a pack whose BLOB alone was cut loses only the models
    past the cut."""
    store = tmp_path / "s"
    mm.train(_coefficients, mm.items(range(40)), store=store, workers=2, progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        packs = conn.execute("SELECT pack_id, models, size, length(blob) + length(head) + "
                             "length(tail) FROM packs WHERE models > 1 ORDER BY pack_id"
                             ).fetchall()
        assert len(packs) >= 2 and all(size == whole for _, _, size, whole in packs)
        (cut_template, models, _, _), (cut_blob, *_) = packs[:2]
        conn.execute(f"UPDATE packs SET {cut} = substr({cut}, 1, length({cut}) - 1) "
                     "WHERE pack_id = ?", (cut_template,))
        conn.execute("UPDATE packs SET blob = substr(blob, 1, length(blob) - 1) "
                     "WHERE pack_id = ?", (cut_blob,))
    again = mm.train(_coefficients, mm.items(range(40)), store=store, workers=2,
                     progress=False)
    assert again.summary().ok == 40
    assert again.summary().reused == 40 - models - 1
    opened = mm.Store(store)
    for item in range(40):  # each read from this run's model, reused or new
        np.testing.assert_array_equal(opened.load(item), _coefficients(item))


def test_a_pack_written_when_its_size_was_its_blobs_is_checked_model_by_model(tmp_path):
    """A templated pack written before its size took in its template records
    its BLOB's length: such a pack is whole at that length (an unchanged
    re-run reuses every model), and one cut a byte short loses only its
    last model."""
    store = tmp_path / "s"
    mm.train(_coefficients, mm.items(range(40)), store=store, workers=2, progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:  # as that manymodels wrote it
        conn.execute("UPDATE packs SET size = length(blob)")
        lengths = dict(conn.execute("SELECT pack_id, length(blob) FROM packs").fetchall())
        for block, listed in conn.execute("SELECT block_id, written_packs FROM task_blocks "
                                          "WHERE written_packs IS NOT NULL").fetchall():
            rows = np.frombuffer(listed, dtype=np.int64).reshape(-1, 2).copy()
            rows[:, 1] = [lengths[pack] for pack in rows[:, 0].tolist()]
            conn.execute("UPDATE task_blocks SET written_packs = ? WHERE block_id = ?",
                         (rows.tobytes(), block))
    assert mm.train(_coefficients, mm.items(range(40)), store=store, workers=2,
                    progress=False).summary().reused == 40
    with sqlite3.connect(store / "index.sqlite") as conn:
        (pack,) = conn.execute("SELECT pack_id FROM packs WHERE models > 1 "
                               "ORDER BY pack_id").fetchone()
        conn.execute("UPDATE packs SET blob = substr(blob, 1, length(blob) - 1) "
                     "WHERE pack_id = ?", (pack,))
    again = mm.train(_coefficients, mm.items(range(40)), store=store, workers=2,
                     progress=False)
    assert again.summary().reused == 39
    opened = mm.Store(store)
    for item in range(40):
        np.testing.assert_array_equal(opened.load(item), _coefficients(item))


def test_models_loaded_one_after_another_read_each_pack_once(tmp_path):
    """Loading a run's models in order reads a pack whole at its second model
    in a row and serves the rest from it (a query or two a pack, not two a
    model); each model is still checked against its SHA-256, and a held
    pack whose bytes are wrong (another store's, say) is read again from the
    store: the model loads, and nothing is called corrupt."""
    from manymodels.store import packs as store_packs

    store = tmp_path / "s"
    mm.train(_coefficients, mm.items(range(300)), store=store, workers=2, progress=False)
    opened = mm.Store(store)
    queries: list[str] = []
    opened._conn.set_trace_callback(queries.append)
    models = opened.models()
    for item in range(300):
        np.testing.assert_array_equal(models[item], _coefficients(item))
    templates = [q for q in queries if q.startswith("SELECT head, tail FROM packs")]
    packs_read = opened._conn.execute("SELECT count(*) FROM packs").fetchone()[0]
    assert len(templates) <= 2 * packs_read < 300
    held = store_packs._LastPack.held
    assert held is not None and held[0][0] == id(opened._conn)
    # the held pack's bytes spoiled: its models are read again from the store
    place, head, whole, tail = held
    store_packs._LastPack.held = (place, head, bytes(len(whole)), tail)
    with sqlite3.connect(store / "index.sqlite") as conn:
        located = taskblocks.read_run(conn, 1, ["key", "artifact"])
    in_held = [key for key, artifact in zip(located["key"].to_pylist(),
                                            located["artifact"].to_pylist())
               if int(artifact.split("@")[1].split("/")[0]) == place[1]]
    assert in_held
    fresh = opened.models()
    for key in in_held:
        item = int(key.strip("[]"))
        np.testing.assert_array_equal(fresh[item], _coefficients(item))
    assert opened._conn.execute("SELECT count(*) FROM corrupt_artifacts").fetchone()[0] == 0
    assert store_packs._LastPack.held[2] == whole  # read again, and held again
    opened.close()


def test_a_part_of_models_of_several_kinds_packs_whole_pickles():
    """A part's pack is templated while every model shares one template; the
    first that does not (another kind, or a model the pickler made) makes
    the pack one of whole pickles, the ones before included."""
    from manymodels.engine.dataplane import small_array_parts
    from manymodels.engine.partpacks import PartPacker

    models = [np.arange(3.0), np.arange(3.0) + 1, np.arange(4.0), {"not": "an array"},
              np.arange(3.0) * 2]
    for order in (models, models[::-1], [models[3], models[0]]):
        packer = PartPacker(hashed=True)
        for index, model in enumerate(order):
            parts = small_array_parts(model)
            pack = (packer.model(index, pickle.dumps(model, protocol=5)) if parts is None
                    else packer.model(index, parts[1], (parts[0], parts[2])))
        packer.seal()
        assert pack.template is None
        for each in (pack, pickle.loads(pickle.dumps(pack))):
            for index, model in enumerate(order):
                one = each.pickled(index)
                assert one.data == pickle.dumps(model, protocol=5)
                assert one.sha256 == hashlib.sha256(one.data).hexdigest()
    packer = PartPacker(hashed=True)
    for index in range(5):
        head, body, tail = small_array_parts(np.arange(3.0) * index)
        pack = packer.model(index, body, (head, tail))
    packer.seal()
    assert pack.template is not None and len(pack.data) == 5 * 24
    for each in (pack, pickle.loads(pickle.dumps(pack))):
        one = each.pickled(3)
        assert one.data == pickle.dumps(np.arange(3.0) * 3, protocol=5)
        assert one.sha256 == hashlib.sha256(one.data).hexdigest()


def _layout_4_store(store):
    """A store of five items' models as a manymodels of layout 4 left it:
    ``packs`` without ``head`` and ``tail``."""
    mm.train(lambda item: [item] * 3, mm.items(range(5)), store=store, backend="threads",
             progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        conn.execute("ALTER TABLE packs DROP COLUMN head")
        conn.execute("ALTER TABLE packs DROP COLUMN tail")
        conn.execute("PRAGMA user_version = 4")
    return store


def _open_at_barrier(path, barrier, answers):
    from manymodels.store import database

    barrier.wait()
    try:
        database.connect(path).close()
        answers.put("ok")
    except Exception as exc:  # noqa: BLE001 - the test reports what it was
        answers.put(repr(exc))


def test_drivers_opening_an_older_store_at_once_all_migrate_it(tmp_path):
    """Two drivers that open a store of layout 4 at the same instant both
    find ``packs`` without ``head``: each adds the columns inside its own
    write transaction, so the second finds them there instead of failing
    with 'duplicate column name' (it did in about one try in five)."""
    import multiprocessing
    import shutil

    base = _layout_4_store(tmp_path / "base")
    context = multiprocessing.get_context("fork")
    for attempt in range(20):
        store = tmp_path / f"s{attempt}"
        shutil.copytree(base, store)
        barrier, answers = context.Barrier(6), context.Queue()
        openers = [context.Process(target=_open_at_barrier, args=(store, barrier, answers))
                   for _ in range(6)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(60)
        assert [answers.get(timeout=10) for _ in openers] == ["ok"] * 6, attempt
        with sqlite3.connect(store / "index.sqlite") as conn:
            assert {"head", "tail"} <= {row[1] for row in conn.execute(
                "PRAGMA table_info(packs)")}
        assert mm.Store(store).load(3) == [3] * 3


def test_a_store_from_before_templates_is_read_and_migrated(tmp_path):
    """A store of layout 4 has no ``head`` or ``tail`` in ``packs``: a reader
    that cannot add them reads its packs as whole pickles, and one that opens
    it for writing adds them (its layout rises to 5 only once a templated
    pack is written)."""
    from manymodels.store import packs as store_packs

    store = _layout_4_store(tmp_path / "s")
    with sqlite3.connect(store / "index.sqlite") as conn:
        (pack,) = conn.execute("SELECT pack_id FROM packs").fetchone()
        assert store_packs.pack_template(conn, pack) == (b"", b"")
        assert store_packs._pack_lengths(conn)[0][0] == pack
    opened = mm.Store(store)
    assert [opened.load(item) for item in range(5)] == [[item] * 3 for item in range(5)]
    opened.close()
    with sqlite3.connect(store / "index.sqlite") as conn:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(packs)")}
        assert {"head", "tail"} <= columns
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 4
    mm.train(_coefficients, mm.items(range(10, 20)), store=store, workers=2, progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 5
    opened = mm.Store(store)
    assert opened.load(2, run=1) == [2] * 3
    np.testing.assert_array_equal(opened.load(12), _coefficients(12))
