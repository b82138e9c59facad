"""Store.verify(), `manymodels verify STORE` and train(verify=True): bytes
flipped in real stores (packed models, a large model's file, an mm.linear
result) are found, named by run and key, and recorded so that the next run
trains them again, where a plain re-run reused them unchecked."""

from __future__ import annotations

import json
import sqlite3
import warnings

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import manymodels as mm
from manymodels.cli import app
from manymodels.store import taskblocks

pytestmark = pytest.mark.usefixtures("no_leftovers")


def fit_small(item):
    return [item] * 3  # a packed model


def fit_large(item):
    return np.random.default_rng(item).random(200_000)  # 1.6 MB: a file of its own


def train(fit, store, items=range(4), **options):
    return mm.train(fit, mm.items(list(items)), store=store, backend="serial", progress=False,
                    **options)


def _locators(store, run=1) -> dict:
    """item -> (pack, offset, size) of each packed model of ``run``."""
    with sqlite3.connect(store / "index.sqlite") as conn:
        rows = taskblocks.read_run(conn, run, ["key", "artifact"]).to_pydict()
    return {json.loads(key)[0]: tuple(int(p) for p in artifact.split("@")[1].split("/"))
            for key, artifact in zip(rows["key"], rows["artifact"])}


def flip_packed(store, item, run=1) -> None:
    """Flip one byte in the middle of ``item``'s packed model (its pack's BLOB)."""
    pack, offset, size = _locators(store, run)[item]
    with sqlite3.connect(store / "index.sqlite") as conn:
        head = conn.execute("SELECT coalesce(length(head), 0) FROM packs WHERE pack_id = ?",
                            (pack,)).fetchone()[0]
        tail = conn.execute("SELECT coalesce(length(tail), 0) FROM packs WHERE pack_id = ?",
                            (pack,)).fetchone()[0]
        own = size - head - tail  # the model's own bytes in a templated pack's BLOB
        blob = bytearray(conn.execute("SELECT blob FROM packs WHERE pack_id = ?",
                                      (pack,)).fetchone()[0])
        blob[offset + own // 2] ^= 0xFF
        conn.execute("UPDATE packs SET blob = ? WHERE pack_id = ?", (bytes(blob), pack))


def flip_file(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_flipped_packed_byte_is_reused_unchecked_until_verify_marks_it(tmp_path):
    store = tmp_path / "store"
    train(fit_small, store)
    flip_packed(store, 2)
    # the documented trade-off: a plain re-run reuses it from the index alone
    assert train(fit_small, store).summary().reused == 4

    report = mm.Store(store).verify()
    assert list(report.columns) == ["run_id", "key", "attachment", "artifact", "problem",
                                    "superseded"]
    assert report[["run_id", "key", "problem", "superseded"]].values.tolist() == [
        [1, 2, "modified", False], [2, 2, "modified", False]]  # run 2 reused run 1's model
    assert report["attachment"].isna().all()
    assert report.attrs["artifacts_checked"] == 4

    again = train(fit_small, store)  # the corrupt model is trained again, not reused
    assert again.results.set_index("item")["reused"].to_dict() == {
        0: True, 1: True, 2: False, 3: True}
    assert mm.Store(store).load(2) == [2, 2, 2]
    assert "could no longer be loaded" in mm.Store(store).why_not_reused(2, again.run_id)


def test_verify_finds_large_files_cut_packs_and_missing_rows(tmp_path):
    store = tmp_path / "store"
    train(fit_large, store, items=range(3))
    files = sorted(p for p in (store / "artifacts").rglob("*") if p.is_file())
    sizes = {p: p.stat().st_size for p in files}
    flip_file(files[0])
    files[1].write_bytes(files[1].read_bytes()[:-10])
    files[2].unlink()
    by_file = {p.name: p for p in files}

    report = mm.Store(store).verify()
    problems = {by_file[artifact]: problem
                for artifact, problem in zip(report["artifact"], report["problem"])}
    assert problems == {files[0]: "modified", files[1]: "truncated", files[2]: "missing"}
    assert sorted(report["key"]) == [0, 1, 2]
    assert all(sizes[p] > 1 << 20 for p in files)

    small = tmp_path / "small"
    train(fit_small, small)
    last = max(_locators(small).items(), key=lambda item: item[1][1])[0]
    pack, offset, _ = _locators(small)[last]
    with sqlite3.connect(small / "index.sqlite") as conn:  # the pack cut before its last model
        conn.execute("UPDATE packs SET blob = substr(blob, 1, ?) WHERE pack_id = ?",
                     (offset, pack))
    report = mm.Store(small).verify()
    assert report[["key", "problem"]].values.tolist() == [[last, "truncated"]]


def test_verify_checks_attachments_and_mm_linear_results(tmp_path):
    store = tmp_path / "store"
    frame = pd.DataFrame({"g": np.repeat(["a", "b"], 6), "x": np.arange(12.0),
                          "y": np.arange(12.0) * 2 + 1})
    mm.linear(frame, by="g", features=["x"], target="y", store=store, name="sales")
    assert mm.Store(store).verify().empty
    with sqlite3.connect(store / "index.sqlite") as conn:
        digest, blob = conn.execute(
            "SELECT a.sha256, a.blob FROM artifacts a JOIN attachments t ON "
            "t.artifact = a.sha256 WHERE t.name = 'linear:sales'").fetchone()
        if blob is None:
            flip_file(store / conn.execute("SELECT path FROM artifacts WHERE sha256 = ?",
                                           (digest,)).fetchone()[0])
        else:
            blob = bytearray(blob)
            blob[len(blob) // 2] ^= 0xFF
            conn.execute("UPDATE artifacts SET blob = ? WHERE sha256 = ?", (bytes(blob), digest))
    report = mm.Store(store).verify()
    assert report[["run_id", "key", "attachment", "artifact", "problem"]].values.tolist() == [
        [1, None, "linear:sales", digest, "modified"]]


def test_train_verify_retrains_a_corrupt_reused_model_with_a_warning(tmp_path):
    store = tmp_path / "store"
    train(fit_small, store, items=range(6))
    flip_packed(store, 4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = train(fit_small, store, items=range(6), verify=True)
    messages = [str(w.message) for w in caught if "verify=True" in str(w.message)]
    assert len(messages) == 1 and "key 4 (modified)" in messages[0]
    assert run.summary().reused == 5
    assert run.results.set_index("item")["reused"].to_dict() == {
        item: item != 4 for item in range(6)}
    assert mm.Store(store).load(4) == [4, 4, 4]
    # the store now knows: a plain re-run reuses the retrained model, not the corrupt one
    later = train(fit_small, store, items=range(6))
    assert later.summary().reused == 6
    assert mm.Store(store).load(4, run=later.run_id) == [4, 4, 4]


def test_train_verify_on_a_whole_store_warns_nothing_and_reuses_all(tmp_path):
    store = tmp_path / "store"
    train(fit_large, store, items=range(2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert train(fit_large, store, items=range(2), verify=True).summary().reused == 2


def test_train_verify_needs_a_store_and_a_bool(tmp_path):
    with pytest.raises(ValueError, match="verify=True needs store="):
        mm.train(fit_small, mm.items([1]), backend="serial", progress=False, verify=True)
    with pytest.raises(TypeError, match="verify must be True or False"):
        train(fit_small, tmp_path / "store", verify="yes")
    assert not (tmp_path / "store").exists()  # refused before any work


def test_a_restored_model_is_cleared_and_reused_again(tmp_path):
    store = tmp_path / "store"
    train(fit_small, store)
    flip_packed(store, 1)
    assert len(mm.Store(store).verify()) == 1
    flip_packed(store, 1)  # flipped back: as a backup restores it
    assert mm.Store(store).verify().empty
    assert train(fit_small, store).summary().reused == 4


def test_cli_verify_exits_1_naming_the_corrupt_key(tmp_path):
    store = tmp_path / "store"
    train(fit_small, store)
    runner = CliRunner()
    whole = runner.invoke(app, ["verify", str(store)])
    assert whole.exit_code == 0, whole.output
    assert "4 artifact(s) checked, each matches its SHA-256" in whole.output

    flip_packed(store, 3)
    broken = runner.invoke(app, ["verify", str(store)])
    assert broken.exit_code == 1, broken.output
    assert "1 corrupt" in broken.output and "modified" in broken.output
    as_json = runner.invoke(app, ["verify", str(store), "--format", "json"])
    assert as_json.exit_code == 1
    assert [(row["run_id"], row["key"], row["problem"]) for row in json.loads(
        as_json.output)] == [(1, 3, "modified")]
    missing = runner.invoke(app, ["verify", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "does not exist" in missing.output

    train(fit_small, store)  # key 3 trained again: run 1's corrupt copy is superseded
    after = runner.invoke(app, ["verify", str(store), "--format", "json"])
    assert after.exit_code == 0, after.output
    assert [(row["run_id"], row["key"], row["superseded"]) for row in json.loads(
        after.output)] == [(1, 3, True)]
    told = runner.invoke(app, ["verify", str(store)])
    assert told.exit_code == 0 and "1 of them trained again by a later run" in told.output


def test_verify_that_could_not_mark_says_so_not_that_the_next_run_retrains(tmp_path):
    """Another process held the write lock: nothing was marked, and the next
    run reuses the corrupt model unchecked, but the command said "the next
    run trains the others again"."""
    from manymodels.cli.verify import corrupt_line

    store = tmp_path / "store"
    train(fit_small, store)
    flip_packed(store, 3)
    opened = mm.Store(store)
    opened._conn.execute("PRAGMA busy_timeout=0")  # (not the 60 s wait for the lock)
    holder = sqlite3.connect(store / "index.sqlite", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, taken after the store opened
    try:
        report = opened.verify()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert report.attrs["marked"] is False and len(report) == 1
    line = corrupt_line(str(store), report, read_only=False)
    assert "not marked: another process held the store's write lock" in line
    assert "next run" not in line
    opened.close()
    assert mm.Store(store).verify().attrs["marked"] is True
