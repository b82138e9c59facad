"""Deleting a run keeps what later runs reuse of it (store/deletion.py): the
runs that reused its models take them as their own, so a re-run after the
delete still trains only what changed."""

from __future__ import annotations

import sqlite3

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from test_task_blocks import _same_as, fit_mean, table

pytestmark = pytest.mark.usefixtures("no_leftovers")


def train(frame: pd.DataFrame, store, backend: str = "serial") -> mm.Run:
    return mm.train(fit_mean, mm.groups(frame, by="g"), store=store, backend=backend,
                    workers=2, progress=False)


def prefixes_kept(store, run_id: int) -> np.ndarray:
    with sqlite3.connect(store / "index.sqlite") as conn:
        blobs = conn.execute("SELECT trained_identities FROM task_blocks WHERE run_id = ? "
                             "AND trained > 0", (run_id,)).fetchall()
    return np.sort(np.concatenate([np.frombuffer(b, dtype=np.uint64) for (b,) in blobs]))


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_a_rerun_after_the_trainer_is_deleted_reuses_from_the_run_that_named_it(
        tmp_path, backend):
    store = tmp_path / "store"
    first = train(table(), store, backend)
    second = train(table(), store, backend)  # names the first run
    assert second.summary().reused == 299
    before = mm.Store(store).results(second.run_id)
    registry = mm.Store(store)
    registry.delete(first.run_id)
    # its rows read as they did (reused from the deleted run, for the record)...
    pd.testing.assert_frame_equal(registry.results(second.run_id), before)
    # ...and its blocks count them as its own, with their identities' prefixes
    with sqlite3.connect(store / "index.sqlite") as conn:
        assert conn.execute("SELECT sum(trained) FROM task_blocks WHERE run_id = ?",
                            (second.run_id,)).fetchone()[0] == 299
    assert len(prefixes_kept(store, second.run_id)) == 299
    third = train(table(), store, backend)
    assert third.summary().reused == 299 and third.summary().ok == 299
    assert registry.why_not_reused(5, third.run_id) == f"5 was reused from run {second.run_id}"
    assert registry.gc() == 0  # every model is still named
    means = table().groupby("g")["x"].mean()
    for group in (0, 5, 299):
        assert registry.load(group, third.run_id) == pytest.approx(means[group])
    assert registry.integrity_check() == "ok"


def test_rows_copied_by_a_partial_rerun_are_taken_too(tmp_path):
    """The second run reused 290 models and retrained ten (copied rows, no
    name): deleting the first leaves all 300 reusable from the second."""
    store = tmp_path / "store"
    first = train(table(), store)
    changed = table()
    changed.loc[changed["g"] < 10, "x"] += 0.5
    changed.loc[changed["g"] == 7, "x"] = -1.0  # group 7 still fails
    second = train(changed, store)
    assert second.summary().reused == 290
    mm.Store(store).delete(first.run_id)
    third = train(changed, store)
    assert third.summary().reused == 299
    assert set(mm.Store(store).results(third.run_id)["reused_from"].dropna()) == {second.run_id}
    # and once the second is deleted too, the third holds them
    mm.Store(store).delete(second.run_id)
    assert train(changed, store).summary().reused == 299


def test_a_run_named_by_a_later_run_is_copied_before_it_takes_rows(tmp_path):
    """Group 7 failed in the first run and trained in the second; the third
    names both. Deleting the first: the second takes its 299 rows, and the
    third's block naming the second still stands for that one task (not 300)."""
    store = tmp_path / "store"
    first = train(table(), store)
    fixed = table()
    fixed.loc[fixed["g"] == 7, "x"] = 1.5
    second = train(fixed, store)
    third = train(fixed, store)
    assert [(tasks, same_as) for run, tasks, same_as in _same_as(store)
            if run == third.run_id] == [(1, second.run_id), (299, first.run_id)]
    before = mm.Store(store).results(third.run_id)
    mm.Store(store).delete(first.run_id)
    assert all(same_as is None for _, _, same_as in _same_as(store))
    after = mm.Store(store).results(third.run_id)
    assert after["g"].tolist() == list(range(300))  # each task once
    pd.testing.assert_frame_equal(after, before)
    with sqlite3.connect(store / "index.sqlite") as conn:  # the one the second trained, still
        assert conn.execute("SELECT sum(tasks) FROM task_blocks WHERE run_id = ?",
                            (third.run_id,)).fetchone()[0] == 300
    fourth = train(fixed, store)
    assert fourth.summary().reused == 300
    assert mm.Store(store).gc() == 0


def test_a_delete_that_fails_changes_nothing(tmp_path, monkeypatch):
    from manymodels.store import deletion

    store = tmp_path / "store"
    first = train(table(), store)
    second = train(table(), store)
    before = mm.Store(store).results(second.run_id)

    def broken(conn, holding):
        raise RuntimeError("the disk went away")

    monkeypatch.setattr(deletion, "_adopt", broken)
    with pytest.raises(RuntimeError, match="disk went away"):
        mm.Store(store).delete(first.run_id)
    registry = mm.Store(store)
    assert list(registry.runs()["run_id"]) == [first.run_id, second.run_id]
    pd.testing.assert_frame_equal(registry.results(second.run_id), before)
    assert [same_as for _, _, same_as in _same_as(store)][-2] == first.run_id


# -- another driver deletes while a run starts or a reader reads -------------------


def delete_once_after_the_search(monkeypatch, store, run_id: int) -> None:
    """Another driver deletes ``run_id`` right after this run's first search
    for what it can reuse, before the run starts (its own connection)."""
    from manymodels.store import reuse

    search = reuse.ReuseSearch.find
    done = []

    def then_delete(self):
        found = search(self)
        if not done:
            done.append(True)
            mm.Store(store).delete(run_id)
        return found

    monkeypatch.setattr(reuse.ReuseSearch, "find", then_delete)


def test_a_run_named_as_a_delete_adds_to_it_is_searched_again(tmp_path, monkeypatch):
    """The third run (groups 0-9) would name the second, which trained those
    ten; the first is deleted meanwhile and the second takes 289 more models:
    the third searches again rather than name a run that now stands for 299."""
    store = tmp_path / "store"
    train(table(), store)
    changed = table()
    changed.loc[changed["g"] < 10, "x"] += 0.5
    changed.loc[changed["g"] == 7, "x"] = -1.0
    second = train(changed, store)
    delete_once_after_the_search(monkeypatch, store, 1)
    third = train(changed[changed["g"] < 10], store)
    monkeypatch.undo()
    assert third.summary().reused == 9
    assert len(mm.Store(store).results(third.run_id)) == 10
    assert set(mm.Store(store).results(third.run_id)["reused_from"].dropna()) == {
        second.run_id}
    assert len(train(changed, store).results) == 300


def test_rows_copied_from_a_run_deleted_as_the_rerun_starts_are_not_written(
        tmp_path, monkeypatch):
    """The second run found 290 models of the first to copy; the first is
    deleted before it starts, and nothing holds those models any more (a gc
    would remove them): it searches again and trains them, and the run after
    reuses every one."""
    store = tmp_path / "store"
    train(table(), store)
    changed = table()
    changed.loc[changed["g"] < 10, "x"] += 0.5
    changed.loc[changed["g"] == 7, "x"] = -1.0
    delete_once_after_the_search(monkeypatch, store, 1)
    second = train(changed, store)
    monkeypatch.undo()
    assert second.summary().reused == 0 and second.summary().ok == 299
    mm.Store(store).gc()
    third = train(changed, store)
    assert third.summary().reused == 299


def test_a_reader_sees_the_runs_it_names_as_they_were_when_it_listed_them(tmp_path):
    """Run 3 names run 2 (ten models); run 1 is deleted by another driver
    between the reader's listing of run 3's blocks and its reading of run 2:
    the reader still gets run 3's ten tasks (one snapshot), not 299."""
    from manymodels.store import taskblocks

    store = tmp_path / "store"
    first = train(table(), store)
    changed = table()
    changed.loc[changed["g"] < 10, "x"] += 0.5
    changed.loc[changed["g"] == 7, "x"] = -1.0
    train(changed, store)
    third = train(changed[changed["g"] < 10], store)
    assert [same_as for run, _, same_as in _same_as(store) if run == third.run_id][0] == 2
    conn = sqlite3.connect(store / "index.sqlite", isolation_level=None)

    class DeletesMidRead:
        fired = False

        @property
        def in_transaction(self):
            return conn.in_transaction

        def execute(self, sql, *args):
            if sql.startswith("SELECT 1 FROM runs WHERE run_id") and not self.fired:
                DeletesMidRead.fired = True
                mm.Store(store).delete(first.run_id)  # another driver, mid-read
            return conn.execute(sql, *args)

    rows = taskblocks.read_run(DeletesMidRead(), third.run_id, ["key", "reused_from"])
    assert DeletesMidRead.fired and rows.num_rows == 10
    assert len(mm.Store(store).results(third.run_id)) == 10
    conn.close()


@pytest.mark.parametrize("seed", range(6))
def test_random_histories_of_reruns_and_deletes(tmp_path, seed):
    """Seeded histories of runs (some groups changed, some left out) and
    deletes (of any run), with gc between: every run left reads back as it
    was written, every model it names loads as its group's mean, and a run
    of the latest run's data again reuses every model that run has."""
    rng = np.random.default_rng(seed)
    store = tmp_path / "store"
    frames: dict[int, pd.DataFrame] = {}  # run -> the table it was trained on
    written: dict[int, pd.DataFrame] = {}  # run -> its results as first read back
    frame = table(groups=40, seed=seed)
    for _ in range(9):
        registry = mm.Store(store)
        if written and rng.random() < 0.35:
            gone = int(rng.choice(sorted(written)))
            registry.delete(gone)
            del written[gone], frames[gone]
            if rng.random() < 0.5:
                registry.gc()
        else:
            frame = frame.copy()
            changed = rng.choice(40, size=int(rng.integers(0, 6)), replace=False)
            frame.loc[frame["g"].isin(changed), "x"] += 0.25
            part = frame[frame["g"] < rng.integers(10, 41)] if rng.random() < 0.3 else frame
            run = train(part, store)
            frames[run.run_id] = part
            written[run.run_id] = mm.Store(store).results(run.run_id)
        registry = mm.Store(store)
        for run_id, results in written.items():
            pd.testing.assert_frame_equal(registry.results(run_id), results)
            means = frames[run_id].groupby("g")["x"].mean()
            for group in results.loc[results["status"] == "ok", "g"]:
                assert registry.load(group, run_id) == pytest.approx(means[group])
    if written:
        latest = max(written)
        again = train(frames[latest], store)
        assert again.summary().reused == int((written[latest]["status"] == "ok").sum())


def _delete_own_run(item, store):
    """A fit that deletes the run it is part of (threads: this driver's)."""
    if item == 0:
        opened = mm.Store(store)
        try:
            opened.delete(int(opened.runs()["run_id"].max()))
        except mm.StoreError as exc:
            return str(exc)  # the model: what the refusal said
        finally:
            opened.close()
        return "deleted"
    return float(item)


def test_a_run_still_being_written_is_not_deleted(tmp_path):
    """``Store.delete`` refuses a run whose driver is alive and writing it (its
    committed models would be lost to the next gc, its driver fail); a run
    of a driver on another machine, which this one cannot tell from a live
    one, is refused unless ``force``."""
    store = tmp_path / "store"
    run = mm.train(_delete_own_run, mm.items(range(3)), shared={"store": str(store)},
                   store=store, backend="threads", progress=False)
    refused = run.models[0]
    assert f"run {run.run_id} of the store" in refused and "still being written" in refused
    assert run.summary().ok == 3
    opened = mm.Store(store)
    assert opened.runs()["status"].tolist() == ["finished"]
    opened.delete(run.run_id)  # ended: deleted
    assert opened.runs().empty
    again = mm.train(_delete_own_run, mm.items(range(1, 3)), shared={"store": str(store)},
                     store=store, backend="threads", progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:  # as another machine's live driver
        conn.execute("UPDATE runs SET status = 'running', driver = 'elsewhere:1:1.0' "
                     "WHERE run_id = ?", (again.run_id,))
    with pytest.raises(mm.StoreError, match="elsewhere:1:1.0"):
        opened.delete(again.run_id)
    opened.delete(again.run_id, force=True)
    assert opened.runs().empty
    opened.close()


def test_models_of_a_run_deleted_after_it_ran_are_refused_by_name(tmp_path):
    """A run whose models stayed in the store (a worker sent them there) and
    that another driver deleted since says so when its models are asked
    for, instead of a bare KeyError; the run that reused them keeps them."""
    store = tmp_path / "store"
    first = mm.train(_square, mm.items(range(50)), store=store, workers=2, progress=False)
    second = mm.train(_square, mm.items(range(50)), store=store, workers=2, progress=False)
    assert second.summary().reused == 50
    mm.Store(store).delete(first.run_id)
    with pytest.raises(mm.StoreError, match=f"run {first.run_id} was deleted"):
        first.models  # noqa: B018 - the property is what is tested
    assert second.models[7] == 49
    assert mm.Store(store).models(run=second.run_id)[7] == 49


def _square(item):
    return item * item
