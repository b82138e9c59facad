"""The store: crash safety, reuse by task identity, integrity and the registry."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from conftest import fit_linear, run_cli
from conftest import lazy_polars as pl
from manymodels.store import keylookups, taskblocks

pytestmark = pytest.mark.usefixtures("no_leftovers")


def run_script(path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                            timeout=timeout, cwd=path.parent)
    assert result.returncode == 0, result.stderr
    return result


def committed_ok(store: Path, run_id: int) -> int:
    with sqlite3.connect(store / "index.sqlite") as conn:
        tasks = taskblocks.read_run(conn, run_id, ["status"])
        return tasks["status"].to_pylist().count("ok")


SLOW_DRIVER = textwrap.dedent("""
    import os, sys, time
    import manymodels as mm

    def fit(item, release):
        time.sleep(0.01)
        while item >= 300 and not os.path.exists(release):  # the run cannot end
            time.sleep(0.01)                                   # before the test says
        return {"double": item * 2}, {"value": item * 2}

    if __name__ == "__main__":
        mm.train(fit, mm.items(range(400)), store=sys.argv[1], workers=2, progress=False,
                 shared={"release": sys.argv[2]})
""")


def test_sigkill_of_the_driver_loses_only_the_uncommitted_tail(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(SLOW_DRIVER)
    store = tmp_path / "store"
    release = tmp_path / "release"
    driver = subprocess.Popen([sys.executable, str(script), str(store), str(release)],
                              cwd=tmp_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (store / "index.sqlite").exists():
            try:
                if committed_ok(store, 1) >= 60:
                    break
            except sqlite3.OperationalError:
                pass
        time.sleep(0.05)
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=10)
    kept = committed_ok(store, 1)
    assert 60 <= kept < 400

    opened = mm.Store(store)
    assert opened.integrity_check() == "ok"
    for key, model in opened.models(1).items():  # every indexed artifact loads
        assert model == {"double": key * 2}

    release.touch()
    rerun = run_script(script, str(store), str(release))
    assert rerun.returncode == 0
    runs = opened.runs()
    assert list(runs["status"]) == ["interrupted", "finished"]  # the killed run never finished
    assert runs["reused"].iloc[1] == kept
    results = opened.results()
    assert (results["status"] == "ok").all() and len(results) == 400
    assert results["value"].tolist() == [2 * i for i in range(400)]
    assert results["reused_from"].notna().sum() == kept
    models = opened.models()
    assert all(models[i] == {"double": 2 * i} for i in range(400))


HELPER_V1 = "def transform(x):\n    return x * 2\n"
HELPER_V2 = "def transform(x):\n    return x * 3\n"
IDENTITY_DRIVER = textwrap.dedent("""
    import json, sys
    import pandas as pd
    import manymodels as mm
    import helpers

    def fit(df, alpha=1.0):
        return {"total": float(helpers.transform(df["x"]).sum()) * alpha}  # VERSION 1

    if __name__ == "__main__":
        table = pd.read_csv(sys.argv[2])
        alphas = json.loads(sys.argv[3])
        run = mm.train(fit, mm.groups(table, by="g") * mm.grid(alpha=alphas),
                       store=sys.argv[1], progress=False, workers=2)
        trained = run.results[~run.results["reused"]]
        print(json.dumps(sorted([[g, a] for g, a in zip(trained["g"], trained["alpha"])])))
""")


def test_reuse_retrains_exactly_what_changed(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(IDENTITY_DRIVER)
    (tmp_path / "helpers.py").write_text(HELPER_V1)
    table = pd.DataFrame({"g": np.repeat(["a", "b", "c", "d"], 5), "x": np.arange(20.0)})
    data = tmp_path / "table.csv"
    table.to_csv(data, index=False)
    store = str(tmp_path / "store")

    def trained(alphas="[1, 2]"):
        import json

        return json.loads(run_script(script, store, str(data), alphas).stdout)

    every = [[g, a] for g in "abcd" for a in (1, 2)]
    assert trained() == every  # first run trains all
    assert trained() == []  # unchanged: everything reused
    table.loc[table["g"] == "c", "x"] += 1  # one group's rows
    table.to_csv(data, index=False)
    assert trained() == [["c", 1], ["c", 2]]
    assert trained("[1, 5]") == [[g, 5] for g in "abcd"]  # a new grid value
    (tmp_path / "helpers.py").write_text(HELPER_V2)  # a helper module fit uses
    assert trained("[1, 5]") == [[g, a] for g in "abcd" for a in (1, 5)]
    script.write_text(IDENTITY_DRIVER.replace("# VERSION 1", "# VERSION 2 (same logic)")
                      .replace("* alpha}", "* alpha * 1.0}"))
    assert trained("[1, 5]") == [[g, a] for g in "abcd" for a in (1, 5)]  # fit's code
    why = run_cli("why", store, "c", "5")
    assert why.returncode == 0 and "code of fit" in why.stdout, why.stdout + why.stderr


def test_failed_tasks_are_retrained_and_reuse_can_be_turned_off(tmp_path):
    def fit(item, bad=()):
        if item in bad:
            raise ValueError(item)
        return item

    store = tmp_path / "store"
    first = mm.train(fit, mm.items(range(10)), shared={"bad": (3,)}, store=store,
                     backend="threads", progress=False)
    assert len(first.failed) == 1
    # the shared objects are part of the identity: all retrain when they change
    second = mm.train(fit, mm.items(range(10)), shared={"bad": ()}, store=store,
                      backend="threads", progress=False)
    assert second.summary().reused == 0 and len(second.ok) == 10
    assert second.why_not_reused(4).endswith("since run 1, the shared object 'bad' changed")
    third = mm.train(fit, mm.items(range(10)), shared={"bad": ()}, store=store,
                     backend="threads", progress=False)
    assert third.summary().reused == 10
    assert third.models[4] == 4
    assert "reused from run 2" in third.why_not_reused(4)
    forced = mm.train(fit, mm.items(range(10)), shared={"bad": ()}, store=store,
                      backend="threads", progress=False, reuse=False)
    assert forced.summary().reused == 0
    assert "reuse was turned off" in forced.why_not_reused(4)


def big_model(item):
    return np.full(300_000, float(item))  # 2.4 MB: stored as a file


@pytest.mark.parametrize("size", ["small", "large"])
def test_tampered_artifact_refuses_to_load(tmp_path, size):
    store = tmp_path / "store"
    fit = big_model if size == "large" else (lambda item: [item] * 3)
    mm.train(fit, mm.items([1, 2]), store=store, backend="threads", progress=False)
    opened = mm.Store(store)
    assert opened.load(1) is not None
    if size == "large":
        files = sorted((store / "artifacts").rglob("*"))
        target = [f for f in files if f.is_file()][0]
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    else:
        with sqlite3.connect(store / "index.sqlite") as conn:  # one byte of a pack flipped
            pack, blob = conn.execute("SELECT pack_id, blob FROM packs ORDER BY pack_id "
                                      "LIMIT 1").fetchone()
            blob = bytearray(blob)
            blob[len(blob) // 2] ^= 0xFF
            conn.execute("UPDATE packs SET blob = ? WHERE pack_id = ?", (bytes(blob), pack))
    errors = 0
    for key in (1, 2):
        try:
            opened.load(key)
        except mm.StoreIntegrityError as exc:
            errors += 1
            assert "SHA-256" in str(exc) and f"key {key}" in str(exc)
            if size == "small":
                assert "packed artifact" in str(exc) and f"pack {pack}," in str(exc)
    assert errors == 1  # only the model whose bytes were changed


CONCURRENT_DRIVER = textwrap.dedent("""
    import sys
    import manymodels as mm

    def fit(item, offset):
        return item + offset

    if __name__ == "__main__":
        offset = int(sys.argv[2])
        run = mm.train(fit, mm.items(range(300)), shared={"offset": offset},
                       store=sys.argv[1], workers=1, progress=False)
        assert len(run.ok) == 300
""")


def test_two_runs_write_one_store_at_once(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(CONCURRENT_DRIVER)
    store = tmp_path / "store"
    drivers = [subprocess.Popen([sys.executable, str(script), str(store), str(n)],
                                cwd=tmp_path, stderr=subprocess.PIPE, text=True)
               for n in (1000, 2000)]
    for driver in drivers:
        _, err = driver.communicate(timeout=120)
        assert driver.returncode == 0, err
    opened = mm.Store(store)
    assert opened.integrity_check() == "ok"
    runs = opened.runs()
    assert list(runs["status"]) == ["finished", "finished"] and list(runs["ok"]) == [300, 300]
    values = {int(r): set(opened.models(int(r)).values()) for r in runs["run_id"]}
    assert sorted(min(v) for v in values.values()) == [1000, 2000]


def _open_and_write(path: str, barrier, errors) -> None:
    from manymodels.store.database import connect
    from manymodels.store.newstore import prepare_directory

    barrier.wait()
    try:
        prepare_directory(Path(path))
        conn = connect(Path(path))
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO runs(started_at, status) VALUES (0, 'running')")
        conn.execute("COMMIT")
        conn.close()
    except Exception as exc:
        errors.put(repr(exc))


def test_drivers_opening_a_new_store_at_the_same_moment(tmp_path):
    # Switching a new index to WAL answered "database is locked" to one
    # opener in eight, without waiting for the other.
    import multiprocessing

    context = multiprocessing.get_context("fork")
    errors = context.Queue()
    for trial in range(15):
        barrier = context.Barrier(3)
        store = tmp_path / f"store-{trial}"
        openers = [context.Process(target=_open_and_write, args=(str(store), barrier, errors))
                   for _ in range(3)]
        for opener in openers:
            opener.start()
        for opener in openers:
            opener.join(timeout=120)
        assert [opener.exitcode for opener in openers] == [0, 0, 0]
        assert errors.empty(), errors.get()
        with sqlite3.connect(store / "index.sqlite") as conn:
            assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 3


def test_bad_store_paths_fail_before_work(tmp_path):
    file = tmp_path / "a_file"
    file.write_text("x")
    with pytest.raises(mm.StoreError, match="is a file"):
        mm.train(abs, mm.items([1]), store=file, progress=False)
    with pytest.raises(mm.StoreError, match="cannot create store directory"):
        mm.train(abs, mm.items([1]), store="/proc/manymodels-store", progress=False)


def test_registry_api(tmp_path, sales):
    from sklearn.linear_model import LinearRegression

    def fit(df):
        model = LinearRegression().fit(df[["x"]], df["y"])
        return model, {"r2": model.score(df[["x"]], df["y"])}

    store = tmp_path / "store"
    run = mm.train(fit, mm.groups(sales, by="store"), store=store, progress=False)
    opened = mm.Store(store)
    mode = stat.S_IMODE(os.stat(store).st_mode)
    assert mode == 0o700 and stat.S_IMODE(os.stat(store / "index.sqlite").st_mode) == 0o600
    assert list(opened.runs()["run_id"]) == [run.run_id]
    results = opened.results()
    assert set(results["store"]) == set(sales["store"]) and "r2" in results

    new_rows = sales.sample(40, random_state=1).reset_index(drop=True)
    new_rows.loc[0, "store"] = "unseen"
    predictions = opened.predict(new_rows, by="store")
    assert len(predictions) == 40 and np.isnan(predictions.iloc[0])
    row = new_rows.iloc[1]
    expected = run.models[row["store"]].predict(pd.DataFrame({"x": [row["x"]]}))[0]
    assert predictions.iloc[1] == pytest.approx(expected)

    out = opened.export(tmp_path / "results.parquet")
    assert len(pd.read_parquet(out)) == 12 and len(pl.read_parquet(out)) == 12

    mm.train(fit, mm.groups(sales.assign(y=sales["y"] * 2), by="store"), store=store,
             progress=False)
    assert opened.gc() == 0  # both runs' artifacts are referenced
    opened.delete(run.run_id)
    assert opened.gc() == 12
    assert len(opened.runs()) == 1 and len(opened.models()) == 12


def test_interrupted_run_tells_how_to_resume(tmp_path):
    from manymodels.engine.scheduling import RunInterrupted

    def fit(item):
        if item == 5:
            raise KeyboardInterrupt
        return item

    with pytest.raises(RunInterrupted, match="same store to resume"):
        mm.train(fit, mm.items(range(10)), store=tmp_path / "s", backend="serial",
                 progress=False)
    runs = mm.Store(tmp_path / "s").runs()
    assert runs["status"].tolist() == ["interrupted"]
    assert runs["ok"].iloc[0] >= 1


def test_fit_linear_models_round_trip(tmp_path, sales):
    run = mm.train(fit_linear, mm.groups(sales, by=["store", "item"]), store=tmp_path / "s",
                   progress=False)
    stored = mm.Store(tmp_path / "s")
    assert stored.load(("s03", 2))["slope"] == run.models[("s03", 2)]["slope"]


def test_a_hand_over_larger_than_a_pack_is_split_and_every_model_reads_back(tmp_path,
                                                                             monkeypatch):
    from manymodels.store import packs

    monkeypatch.setattr(packs, "PACK_BYTES", 200)  # a few models per pack
    store = tmp_path / "store"
    mm.train(lambda item: [item] * 10, mm.items(range(30)), store=store, backend="threads",
             progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        sizes = [size for (size,) in conn.execute("SELECT size FROM packs")]
    assert len(sizes) > 1 and max(sizes) <= 200
    opened = mm.Store(store)
    assert [opened.load(item) for item in range(30)] == [[item] * 10 for item in range(30)]


def square_of(item):
    return {"square": item * item}, {"square": item * item}


def test_reuse_across_runs_points_at_the_run_that_trained_each_model(tmp_path):
    """A re-run finds its models in the runs that trained them: most in the
    first run, the ones trained later in the later run, and new items trained."""
    store = tmp_path / "store"
    first = mm.train(square_of, mm.items(range(300)), store=store, workers=2, progress=False)
    assert first.summary().reused == 0
    second = mm.train(square_of, mm.items(range(290, 320)), store=store, workers=2,
                      progress=False)  # 10 reused from run 1, 20 new
    assert second.summary().reused == 10
    third = mm.train(square_of, mm.items(range(330)), store=store, workers=2, progress=False)
    assert third.summary().reused == 320
    results = mm.Store(store).results(run=3).set_index("item")
    assert (results.loc[list(range(290)), "reused_from"] == 1).all()
    assert (results.loc[list(range(290, 300)), "reused_from"] == 1).all()
    assert (results.loc[list(range(300, 320)), "reused_from"] == 2).all()
    assert results.loc[list(range(320, 330)), "reused_from"].isna().all()
    assert third.models[317] == {"square": 317 * 317}
    assert (results["square"] == results.index ** 2).all()


def test_reuse_takes_the_latest_model_even_when_a_small_run_retrained_it(tmp_path):
    """Models retrained on purpose (reuse=False) in a small later run replace
    the earlier ones for the next re-run, wherever they fall among the keys."""
    store = tmp_path / "store"
    mm.train(square_of, mm.items(range(1000)), store=store, workers=1, progress=False)
    mm.train(square_of, mm.items([6, 7, 8]), store=store, workers=1, progress=False,
             reuse=False)
    mm.train(square_of, mm.items(range(1000)), store=store, workers=1, progress=False)
    results = mm.Store(store).results(run=3).set_index("item")["reused_from"]
    assert results.loc[[6, 7, 8]].tolist() == [2, 2, 2]
    assert (results.drop([6, 7, 8]) == 1).all()


def test_pack_locators_damaged_in_the_index_are_not_whole(tmp_path):
    from manymodels.store import packs

    conn = sqlite3.connect(tmp_path / "packs.sqlite")
    conn.execute("CREATE TABLE packs(pack_id INTEGER PRIMARY KEY, size INT, models INT, "
                 "blob BLOB)")
    conn.execute("INSERT INTO packs VALUES (1, 10, 2, zeroblob(10))")
    conn.execute("INSERT INTO packs VALUES (3, 5, 1, zeroblob(5))")
    good = {"a@1/0/5", "b@1/5/5", "e@3/0/5"}
    bad = {"c@1/6/5", "d@2/0/1", "f@4/0/1", "x@1/0", "y@7/0/10/999", f"z@1/{2**62}/{2**62}",
           "h@1/99999999999999999999999/1", "n@1/-1/2", "q@1/a/2"}
    assert packs.whole_locators(conn, good | bad) == good
    assert packs.whole_locators(conn, good) == good


def test_a_new_index_has_large_pages_and_an_old_one_keeps_its_own(tmp_path):
    df = pd.DataFrame({"g": np.repeat(np.arange(30), 5), "x": np.arange(150.0),
                       "y": np.arange(150.0) * 2})

    def page_size(store: Path) -> int:
        with sqlite3.connect(store / "index.sqlite") as conn:
            return conn.execute("PRAGMA page_size").fetchone()[0]

    new = tmp_path / "new"
    mm.train(fit_linear, mm.groups(df, by="g"), store=new, progress=False, workers=1)
    assert page_size(new) == 1 << 16
    old = tmp_path / "old"  # an index made with SQLite's 4 KiB pages, as earlier stores were
    old.mkdir()
    sqlite3.connect(old / "index.sqlite").execute("PRAGMA journal_mode=WAL").close()
    first = mm.train(fit_linear, mm.groups(df, by="g"), store=old, progress=False, workers=1)
    again = mm.train(fit_linear, mm.groups(df, by="g"), store=old, progress=False, workers=1)
    assert page_size(old) == 4096
    assert again.summary().reused == 30 and mm.Store(old).integrity_check() == "ok"
    assert first.results["status"].eq("ok").all()
    empty = tmp_path / "empty"  # a folder with an index of 0 bytes (touched, or cut short
    empty.mkdir()               # while being made): a store not made yet, made as new
    (empty / "index.sqlite").touch()
    made = mm.train(fit_linear, mm.groups(df, by="g"), store=empty, progress=False, workers=1)
    assert page_size(empty) == 1 << 16 and made.results["status"].eq("ok").all()


def _coefficients(item):
    return np.arange(3.0) * item


def test_one_store_used_from_several_threads(tmp_path):
    """A Store shared by threads gives each its own connection: one thread
    loading a run's models and reading results while another deletes other
    runs and collects garbage, and a third trains into it, each gets what it
    would alone (one connection shared, a delete's BEGIN failed inside
    another thread's read)."""
    import threading

    path = tmp_path / "store"
    mm.train(_coefficients, mm.items(range(2000)), store=path, workers=2, progress=False)
    for start in range(4):
        mm.train(_coefficients, mm.items(range(10_000 + 200 * start, 10_200 + 200 * start)),
                 store=path, backend="serial", progress=False)
    store = mm.Store(path)
    errors: list[BaseException] = []
    stop = threading.Event()
    trained: list[mm.Run] = []

    def loader():
        rng = np.random.default_rng(0)
        while not stop.is_set():
            key = int(rng.integers(0, 2000))
            np.testing.assert_array_equal(store.load(key, run=1), _coefficients(key))
            assert len(store.results(1)) == 2000

    def deleter():
        for run_id in range(2, 6):
            store.delete(run_id)
            store.gc()

    def trainer():
        trained.append(mm.train(_coefficients, mm.items(range(2000)), store=store,
                                backend="serial", progress=False))

    def guarded(work):
        def run():
            try:
                work()
            except BaseException as exc:  # noqa: BLE001 - reported by the test
                errors.append(exc)
                stop.set()
        return run

    threads = [threading.Thread(target=guarded(work)) for work in (loader, deleter, trainer)]
    for thread in threads:
        thread.start()
    for thread in threads[1:]:
        thread.join(120)
    stop.set()
    threads[0].join(120)
    assert not errors, errors
    assert trained[0].summary().reused == 2000
    assert store.runs()["run_id"].tolist() == [1, trained[0].run_id]
    store.close()


def _identity(item):
    return item


def test_threads_loading_from_one_store_share_its_key_lookups_safely(tmp_path, monkeypatch):
    """The sorted keys a Store keeps of the runs last asked about are shared
    by its threads under one lock: threads asking about a run at once read
    its keys once (each read them, a million keys each), and keeping only
    two runs' never races (an eviction raised KeyError, or "dictionary
    changed size during iteration")."""
    import threading

    path = tmp_path / "store"
    for _ in range(3):
        mm.train(_identity, mm.items(range(1000)), store=path, backend="serial",
                 reuse=False, progress=False)
    store = mm.Store(path)
    made: list[int] = []
    real = keylookups.KeyLookup

    class CountedLookup(real):
        def __init__(self, version, tasks):
            made.append(version[0])
            super().__init__(version, tasks)

    monkeypatch.setattr(keylookups, "KeyLookup", CountedLookup)
    threads, errors, first = 8, [], []
    together = threading.Barrier(threads)
    then = threading.Barrier(threads, action=lambda: first.extend(made))

    def load(seed: int) -> None:
        try:
            together.wait()
            assert store.load(seed, run=1) == seed  # all at once: run 1 read once
            then.wait()
            for turn in range(60):  # three runs through a cache of two
                run = (seed + turn) % 3 + 1
                assert store.load(turn, run=run) == turn
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes
    try:
        workers = [threading.Thread(target=load, args=(seed,)) for seed in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
    finally:
        sys.setswitchinterval(switch)
    assert not errors, errors
    assert first == [1]
    store.close()


def test_why_not_reused_names_a_model_found_corrupt_that_training_made_whole_again(tmp_path):
    """A model found corrupt is trained again; when the fit is deterministic
    its bytes are the same, the artifact whole once more, and why_not_reused
    said "reuse was turned off (reuse=False)", which it never was. It says
    the model could not be loaded when the run began; reuse=False is named
    only where the run was started so."""
    store = tmp_path / "store"
    mm.train(big_model, mm.items(range(3)), store=store, backend="serial", progress=False)
    opened = mm.Store(store)
    artifact = opened.results().set_index("item").loc[1, "artifact"][:64]
    (path,) = (store / "artifacts").glob(f"*/{artifact}")
    with open(path, "r+b") as handle:
        handle.seek(1000)
        handle.write(b"XXXX")
    assert len(opened.verify()) == 1
    again = mm.train(big_model, mm.items(range(3)), store=store, backend="serial",
                     progress=False)
    assert again.results["reused"].tolist() == [True, False, True]
    assert again.why_not_reused(1) == (
        "1 was trained: its model from run 1 could not be loaded when run 2 began (missing "
        "from the store, or found corrupt)")


class _Constant:
    def __init__(self, value: float) -> None:
        self.value = value

    def predict(self, X) -> np.ndarray:
        return np.full(len(X), self.value)


@contextlib.contextmanager
def _a_run_held_midway(store, frame, model, on_group=None):
    """A second run into ``store`` on a thread, held in ``fit`` (of group
    ``on_group``, or the first it reaches) until the block ends: the block
    sees the store while that run is still being written."""
    import threading

    release, reached = threading.Event(), threading.Event()

    def slow(rows):
        if on_group is None or rows["g"].iloc[0] == on_group:
            reached.set()
            release.wait(30)
        return model

    second = threading.Thread(target=mm.train, args=(slow, mm.groups(frame, by="g")),
                              kwargs={"store": store, "backend": "serial",
                                      "progress": False})
    second.start()
    try:
        assert reached.wait(30)
        yield
    finally:
        release.set()
        second.join(60)


def test_the_readers_of_models_leave_out_a_run_still_being_written(tmp_path):
    """Store.predict, load and models with no run= read the latest run,
    though it was still being written: predictions mixed its groups with
    an earlier run's, load(key) of a group it had not reached raised
    KeyError. They read the latest run that has ended, as serve does."""
    store = tmp_path / "store"
    frame = pd.DataFrame({"g": np.repeat(np.arange(4), 2), "x": np.arange(8.0)})
    mm.train(lambda rows: _Constant(1.0), mm.groups(frame, by="g"), store=store,
             backend="serial", progress=False)
    rows = pd.DataFrame({"g": [0, 3], "x": [0.0, 0.0]})
    with _a_run_held_midway(store, frame, _Constant(2.0), on_group=1):
        opened = mm.Store(store)
        assert opened.runs()["status"].tolist() == ["finished", "running"]
        assert opened.predict(rows, by="g").tolist() == [1.0, 1.0]
        assert opened.load(3).value == 1.0 and opened.models()[0].value == 1.0
    assert mm.Store(store).predict(rows, by="g").tolist() == [2.0, 2.0]


class _Width:
    """A model that answers how many feature columns it was given."""

    def predict(self, X) -> np.ndarray:
        return np.full(len(X), float(X.shape[1]))


def test_predict_takes_its_recorded_features_from_the_run_whose_models_it_reads(tmp_path):
    """Store.predict with no run= reads the models of the runs that have
    ended; the features and by= the command line recorded come from those
    runs too, not from a run still being written (which has none yet: the
    model was given every column but the key)."""
    store = tmp_path / "store"
    frame = pd.DataFrame({"g": [0, 0, 1, 1], "x": [1.0, 2, 3, 4], "z": [0.0] * 4})
    mm.train(lambda rows: _Width(), mm.groups(frame, by="g"), store=store,
             backend="serial", progress=False)
    mm.Store(store).attach(1, "train_config", {"by": ["g"], "features": ["x"]})
    with _a_run_held_midway(store, frame, _Width()):
        assert mm.Store(store).predict(frame).tolist() == [1.0] * 4


def test_a_run_deleted_while_it_runs_says_so(tmp_path):
    """Store.delete(run, force=True) of a run that is still running made its
    driver fail with "FOREIGN KEY constraint failed ... What was committed
    before stays usable, and a re-run with the same store reuses it", of a
    run of which nothing is left. It says the run was deleted."""
    import threading

    store = tmp_path / "store"
    frame = pd.DataFrame({"g": np.repeat(np.arange(3), 2), "x": np.arange(6.0)})
    release, reached = threading.Event(), threading.Event()
    raised: list[BaseException] = []

    def slow(rows):
        if rows["g"].iloc[0] == 1:
            reached.set()
            release.wait(30)
        return _Constant(1.0)

    def train() -> None:
        try:
            mm.train(slow, mm.groups(frame, by="g"), store=store, backend="serial",
                     progress=False)
        except BaseException as exc:  # what the run raised, looked at below
            raised.append(exc)

    running = threading.Thread(target=train)
    running.start()
    try:
        assert reached.wait(30)
        mm.Store(store).delete(1, force=True)
    finally:
        release.set()
        running.join(60)
    assert len(raised) == 1 and isinstance(raised[0], mm.StoreError)
    assert "run 1 was deleted from the store" in str(raised[0])
    assert "reuses it" not in str(raised[0])


def test_a_serial_run_records_the_one_worker_it_runs_whatever_workers_says(tmp_path):
    """``backend="serial", workers=4`` ran one worker (the driver) but the
    store recorded as many as tasks allowed (3 of 3 tasks)."""
    run = mm.train(_identity, mm.items(range(3)), backend="serial", workers=4,
                   store=tmp_path / "s", progress=False)
    assert run.summary().workers == 1
    assert mm.Store(tmp_path / "s").runs()["workers"].tolist() == [1]


def fit_failing_b(rows):
    from sklearn.linear_model import LinearRegression

    if rows["g"].iloc[0] == "b":
        raise ValueError("boom")
    return LinearRegression().fit(rows[["x"]], rows["y"])


def test_predict_says_which_groups_failed_in_training_and_which_were_never_trained(tmp_path):
    """Rows of groups with no model came back NaN with one warning for both a
    group whose fit failed and a key no task of the run had."""
    import warnings

    import pandas as pd

    df = pd.DataFrame({"g": list("aabb"), "x": [0.0, 1, 2, 3], "y": [0.0, 1, 2, 3]})
    mm.train(fit_failing_b, mm.groups(df, by="g"), store=tmp_path / "s", backend="serial",
             progress=False)
    store = mm.Store(tmp_path / "s")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        store.predict(pd.DataFrame({"g": list("abzy"), "x": [1.0] * 4}), workers=1)
    said = " ".join(str(w.message) for w in caught)
    assert "1 failed in training (e.g. ['b'], status failed" in said
    assert "2 were never trained" in said and "['y', 'z']" in said
    with pytest.raises(ValueError, match=r"1 failed in training .* 1 was never trained"):
        store.predict(pd.DataFrame({"g": ["b", "z"], "x": [1.0, 1.0]}), workers=1)


def test_predict_warns_once_of_failed_groups_the_fallback_answered(tmp_path):
    """Rows of a group whose fit failed went to the fallback model silently,
    as those of a group never trained (what a fallback is for) do; the CLI
    printed Python's warning with its file and line, if any."""
    import warnings

    import pandas as pd
    from sklearn.linear_model import LinearRegression
    from typer.testing import CliRunner

    from manymodels.cli import app

    df = pd.DataFrame({"g": list("aabb"), "x": [0.0, 1, 2, 3], "y": [0.0, 1, 2, 3]})
    run = mm.train(fit_failing_b, mm.groups(df, by="g"), store=tmp_path / "s",
                   backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    store.attach(run.run_id, "fallback", LinearRegression().fit(df[["x"]], df["y"]))
    new = pd.DataFrame({"g": list("abbz"), "x": [1.0] * 4})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert store.predict(new, workers=1, with_source=True)["source"].tolist() == [
            "group", "fallback", "fallback", "fallback"]
        store.predict(new[new["g"] != "b"], workers=1)  # never trained: not said
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "1 group failed in training and is answered by the fallback " \
        "model: e.g. ['b'], status failed" in said[0] and "'z'" not in said[0], said
    new.to_csv(tmp_path / "new.csv", index=False)
    done = CliRunner().invoke(app, ["predict", str(tmp_path / "s"), str(tmp_path / "new.csv"),
                                    "--out", str(tmp_path / "out.csv"), "--workers", "1"])
    assert done.exit_code == 0, done.output
    assert f"warning: {said[0]}\n" in done.stderr
