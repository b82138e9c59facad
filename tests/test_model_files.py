"""Large models written into the store by the workers that trained them
(engine/modelfiles.py): the driver receives only their names and writes only
their rows; a worker that does not see the store sends the bytes as before.
The engines' workers do the same: tests/test_engine_frames.py."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

import manymodels as mm
from manymodels.engine.modelfiles import ModelFile
from manymodels.store import artifacts


def fit_large(item):
    """A model of 1.1 MB pickled, so a file of the store's, not a pack."""
    return np.full(140_000, float(item))


def _model_files(store: Path) -> set[str]:
    return {p.relative_to(store).as_posix() for p in (store / "artifacts").rglob("*")
            if p.is_file()}


@pytest.fixture
def driver_never_writes_model_bytes(monkeypatch):
    """The driver's own write of a model's bytes fails the test."""
    def refused(*args, **kwargs):
        raise AssertionError("the driver wrote a model's bytes")

    monkeypatch.setattr(artifacts, "write_artifact", refused)


@pytest.mark.parametrize("backend", ["processes", "threads", "serial"])
def test_workers_write_their_large_models_and_the_driver_only_their_rows(
        backend, tmp_path, driver_never_writes_model_bytes):
    store = tmp_path / "store"
    run = mm.train(fit_large, mm.items(range(6)), backend=backend, workers=2, store=store,
                   progress=False)
    assert run.summary().statuses == {"ok": 6}
    registry = mm.Store(store)
    rows = {path for (path,) in registry._conn.execute(
        "SELECT path FROM artifacts WHERE path IS NOT NULL")}
    assert len(rows) == 6 and _model_files(store) == rows  # no marker, no temporary left
    for item in range(6):
        np.testing.assert_array_equal(registry.load(item), fit_large(item))
        np.testing.assert_array_equal(run.models[item], fit_large(item))
    for path in rows:
        assert (store / path).stat().st_mode & 0o077 == 0  # owner-only, as the store
    again = mm.train(fit_large, mm.items(range(7)), backend=backend, workers=2, store=store,
                     progress=False)
    assert again.results["reused"].tolist() == [True] * 6 + [False]
    np.testing.assert_array_equal(mm.Store(store).load(6), fit_large(6))


def fit_large_unseen(item, store):
    """As a worker on a node of its own disk: the run's marker is not there."""
    for marker in Path(store, "artifacts").glob(".run-*"):
        marker.unlink(missing_ok=True)
    return fit_large(item)


def test_a_worker_that_does_not_see_the_store_sends_the_bytes(tmp_path):
    store = tmp_path / "store"
    store.mkdir()
    written = []
    real = artifacts.write_artifact

    def counted(conn, root, data, digest=None):
        written.append(digest)
        return real(conn, root, data, digest)

    artifacts.write_artifact, saved = counted, artifacts.write_artifact
    try:
        run = mm.train(fit_large_unseen, mm.items(range(4)), backend="processes", workers=2,
                       store=store / "models", shared={"store": str(store / "models")},
                       progress=False)
    finally:
        artifacts.write_artifact = saved
    assert run.summary().statuses == {"ok": 4}
    assert len(written) == 4  # the driver wrote each one's bytes
    for item in range(4):
        np.testing.assert_array_equal(mm.Store(store / "models").load(item), fit_large(item))


def test_a_model_file_not_there_is_refused_by_name_not_recorded(tmp_path):
    """The store's writer checks that the file a worker named is there,
    whole: a store that the workers see at another place than the driver
    is an error naming the file, not a row that names nothing."""
    from manymodels.store.database import StoreIntegrityError

    store = tmp_path / "store"
    mm.train(fit_large, mm.items(range(1)), backend="serial", store=store, progress=False)
    conn = mm.Store(store)._conn
    digest = "ab" * 32
    missing = ModelFile(digest, 1 << 20, f"artifacts/ab/{digest}", str(store))
    with pytest.raises(StoreIntegrityError, match=f"model file artifacts/ab/{digest} .* "
                                                  "is not there with its 1048576 bytes"):
        artifacts.record_model_file(conn, store, missing)
    (store / missing.path).parent.mkdir(exist_ok=True)
    (store / missing.path).write_bytes(b"x" * 100)  # cut short
    with pytest.raises(StoreIntegrityError, match="is not there with its"):
        artifacts.record_model_file(conn, store, missing)
    assert conn.execute("SELECT count(*) FROM artifacts WHERE sha256 = ?",
                        (digest,)).fetchone()[0] == 0


def test_a_model_file_loads_checked_against_its_sha256(tmp_path):
    import hashlib
    import pickle

    from manymodels.engine.modelfiles import write_model_file

    data = pickle.dumps(fit_large(3))
    digest = hashlib.sha256(data).hexdigest()
    path = write_model_file(tmp_path, data, digest)
    model = ModelFile(digest, len(data), path, str(tmp_path))
    np.testing.assert_array_equal(model.load(), fit_large(3))
    with open(tmp_path / path, "r+b") as file:
        file.seek(len(data) // 2)
        file.write(b"\x00\x01")
    with pytest.raises(OSError, match="does not hold the bytes"):
        model.load()
    assert not [name for name in os.listdir(tmp_path / os.path.dirname(path))
                if name.startswith(".tmp-")]


def test_a_file_the_driver_cannot_see_fails_its_task_alone(tmp_path, monkeypatch):
    """A worker that wrote its model where the driver does not look (a disk
    of its own under the same path): its task fails, saying so, and the
    others are stored; a re-run trains it again."""
    import hashlib

    from manymodels.engine import modelfiles
    from manymodels.engine.dataplane import pickle_any

    lost = hashlib.sha256(pickle_any(fit_large(2))).hexdigest()
    elsewhere = tmp_path / "the worker's own disk"
    real_write = modelfiles.ModelFiles.write

    def write(self, data, digest):
        if digest != lost:
            return real_write(self, data, digest)
        path = modelfiles.write_model_file(elsewhere, data, digest)
        return ModelFile(digest, len(data), path, self.root)

    monkeypatch.setattr(modelfiles.ModelFiles, "write", write)
    store = tmp_path / "store"
    run = mm.train(fit_large, mm.items(range(4)), backend="threads", workers=2, store=store,
                   progress=False)
    assert run.summary().statuses == {"ok": 3, "failed": 1}
    results = run.results.set_index("item")
    assert results.loc[2, "status"] == "failed"
    assert "the store is not on a path every worker sees" in results.loc[2, "error"]
    registry = mm.Store(store)
    np.testing.assert_array_equal(registry.load(3), fit_large(3))
    with pytest.raises(KeyError):
        registry.load(2)
    monkeypatch.setattr(modelfiles.ModelFiles, "write", real_write)
    again = mm.train(fit_large, mm.items(range(4)), backend="threads", workers=2, store=store,
                     progress=False)
    assert again.results["reused"].tolist() == [True, True, False, True]
    np.testing.assert_array_equal(mm.Store(store).load(2), fit_large(2))


def test_recording_a_model_file_makes_it_new_so_a_gc_then_leaves_it(tmp_path):
    """A worker's file written before a gc began, its row committed after the
    gc deleted the old row of the same model: the row's write makes the file
    new, so the gc's removal of the deleted row's file leaves it."""
    import time

    store = tmp_path / "store"
    mm.train(fit_large, mm.items(range(1)), backend="serial", store=store, progress=False)
    conn = mm.Store(store)._conn
    ((digest, size, path),) = conn.execute("SELECT sha256, size, path FROM artifacts")
    old = time.time() - 600
    os.utime(store / path, (old, old))
    conn.execute("BEGIN IMMEDIATE")
    artifacts.record_model_file(conn, store, ModelFile(digest, size, path, str(store)))
    conn.execute("COMMIT")
    assert (store / path).stat().st_mtime > old + 500


def keeps_its_marker_through_a_gc(item, store):
    """gc from inside a running run, its marker an hour and more old."""
    from manymodels.engine.modelfiles import marker_run

    folder = Path(store, "artifacts")
    crashed = folder / ".run-999999-left"  # a marker a crashed run left
    crashed.touch()
    old = os.path.getmtime(crashed) - 7200
    markers = [m for m in folder.glob(".run-*") if marker_run(m.name) != 999999]
    for marker in [*markers, crashed]:
        os.utime(marker, (old, old))
    mm.Store(store).gc()
    return {"kept": all(m.exists() for m in markers) and len(markers) == 1,
            "crashed_gone": not crashed.exists()}


def test_gc_leaves_a_running_runs_marker_and_collects_a_crashed_ones(tmp_path):
    store = tmp_path / "store"
    mm.train(fit_large, mm.items(range(1)), backend="serial", store=store, progress=False)
    run = mm.train(keeps_its_marker_through_a_gc, mm.items(range(1)), backend="serial",
                   store=store, shared={"store": str(store)}, progress=False)
    assert run.results[["kept", "crashed_gone"]].values.tolist() == [[True, True]]
    assert not list((store / "artifacts").glob(".run-*"))


def fit_then_gc_elsewhere(item, store):
    """Item 1 runs a gc from another process while item 0's file waits for its row."""
    import subprocess
    import sys

    if item == 1:
        subprocess.run([sys.executable, "-c", "import manymodels as mm, sys; "
                        "mm.Store(sys.argv[1]).gc()", store], check=True)
    return fit_large(item)


def test_a_gc_while_a_run_runs_leaves_a_deleted_models_file_written_again(tmp_path):
    """A run deleted, then the same model trained again: its worker rewrites
    the file, and a gc from another process before the row is written must
    leave it (the deleted row's file goes at once only where no run runs)."""
    store = tmp_path / "store"
    first = mm.train(fit_large, mm.items([0]), backend="serial", store=store, progress=False)
    mm.Store(store).delete(first.run_id)
    run = mm.train(fit_then_gc_elsewhere, mm.items([0, 1]), backend="serial", store=store,
                   shared={"store": str(store)}, progress=False)
    assert run.summary().statuses == {"ok": 2}
    for item in (0, 1):
        np.testing.assert_array_equal(mm.Store(store).load(item), fit_large(item))


def leaves_a_torn_temporary(item, store):
    """As a worker killed while writing its model file leaves one."""
    from manymodels.engine.modelfiles import marker_run

    folder = Path(store, "artifacts")
    (marker,) = folder.glob(".run-*")
    (folder / "ab").mkdir(exist_ok=True)
    (folder / "ab" / f".tmp-{marker_run(marker.name)}-torn").write_bytes(b"x" * 100)
    return fit_large(item)


def test_a_runs_torn_temporary_files_go_when_it_ends(tmp_path):
    store = tmp_path / "store"
    mm.train(fit_large, mm.items([0]), backend="serial", store=store, progress=False)
    others = store / "artifacts" / "ab" / ".tmp-999999-another-runs"
    others.parent.mkdir(exist_ok=True)
    others.write_bytes(b"y")
    mm.train(leaves_a_torn_temporary, mm.items([1]), backend="processes", workers=1,
             store=store, shared={"store": str(store)}, progress=False)
    assert [p.name for p in (store / "artifacts").rglob(".tmp-*")] == [others.name]


def fit_opening_the_store_elsewhere(item, data):
    """Item 0 has another process open the store, as `manymodels show` would."""
    import subprocess
    import sys

    if item == 0:
        subprocess.run([sys.executable, "-c", "import manymodels as mm, sys; "
                        "mm.Store(sys.argv[1]).runs()", str(data / "models")], check=True)
    return np.zeros(3) + item


def test_a_folder_holding_the_store_is_hashed_without_reading_the_store(tmp_path):
    """A Path among the shared objects whose folder holds the store: hashing
    read the store's index and so dropped the driver's SQLite locks on it
    (another process opening the store then removed its write-ahead log,
    and the run's rows with it); the store's files also made the identity
    change with every run."""
    from manymodels.identity.valuehash import file_hash

    project = tmp_path / "project"
    (project / "inputs").mkdir(parents=True)
    (project / "inputs" / "a.csv").write_text("x\n1\n")
    store = project / "models"
    before = file_hash(project)
    for count in (1, 30):
        run = mm.train(fit_opening_the_store_elsewhere, mm.items(range(count)),
                       shared={"data": project}, backend="serial", store=store,
                       progress=False)
        assert run.summary().statuses == {"ok": count}
    runs = mm.Store(store).runs()
    assert runs["status"].tolist() == ["finished", "finished"]
    assert runs["ok"].tolist() == [1, 30]
    assert file_hash(project) == before  # the store in it does not count
    assert run.results["reused"].tolist() == [True] + [False] * 29  # as its identity held
    (project / "inputs" / "a.csv").write_text("x\n2\n")
    assert mm.train(fit_opening_the_store_elsewhere, mm.items(range(2)),
                    shared={"data": project}, backend="serial", store=store,
                    progress=False).results["reused"].tolist() == [False, False]


def test_an_edit_under_a_linked_folder_changes_the_folders_hash(tmp_path):
    """A folder item whose data sits under a link to another folder: an edit
    there left its hash, and its model was reused, stale."""
    from manymodels.identity.valuehash import file_hash

    data = tmp_path / "shared-data"
    data.mkdir()
    (data / "a.csv").write_text("x\n1\n")
    item = tmp_path / "item"
    item.mkdir()
    (item / "data").symlink_to(data, target_is_directory=True)
    (item / "loop").symlink_to(item, target_is_directory=True)  # walked once, not for ever
    before = file_hash(item)
    (data / "a.csv").write_text("x\n2\n")
    assert file_hash(item) != before
