"""A checkpoint under hostile use: what a killed commit leaves, a refused
state, a state loaded twice, arguments of the wrong type (each found by a
review that killed and fuzzed real checkpoints)."""

from __future__ import annotations

import importlib
import sys
import threading

import numpy as np
import pytest

from manymodels.engine.checkpoints import Checkpoint


def test_a_commit_cut_short_leaves_nothing_that_stops_the_next(tmp_path):
    """An attempt killed after putting its files in place but before naming
    them left files-<n>; the next attempt's commit of that generation was
    refused (directory not empty), on every retry and run. A state that
    cannot be pickled is refused before any file moves."""
    slot = tmp_path / "slot"
    slot.mkdir()
    first = Checkpoint(slot)
    (first.path / "model.txt").write_text("20 rounds")
    with pytest.raises(TypeError):
        first.commit({"lock": threading.Lock()})
    assert sorted(p.name for p in slot.iterdir()) == ["work-1"]
    (slot / "files-1").mkdir()  # what a kill between the rename and the manifest leaves
    (slot / "files-1" / "model.txt").write_text("torn")
    (slot / ".tmp-files-1-99999").mkdir()  # a kill while copying
    first.commit({"rounds": 20})
    retry = Checkpoint(slot, attempt=2)
    assert retry.load() == {"rounds": 20}
    assert (retry.path / "model.txt").read_text() == "20 rounds"
    (retry.path / "model.txt").write_text("40 rounds")
    retry.commit({"rounds": 40})
    assert sorted(p.name for p in slot.iterdir() if p.name.startswith(("files-", ".tmp"))) \
        == ["files-2"]


def test_a_refused_state_leaves_the_path_the_fit_holds(tmp_path, monkeypatch):
    """A state whose class was renamed since is refused by load(); the folder
    checkpoint.path handed out before stays, empty, for the fit to write."""
    module = tmp_path / "renamed_state.py"
    module.write_text("class State:\n    step = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import renamed_state

    slot = tmp_path / "slot"
    slot.mkdir()
    first = Checkpoint(slot)
    (first.path / "model.txt").write_text("3 rounds")
    first.commit(renamed_state.State())
    module.write_text("class TrainingState:\n    step = 3\n")
    del sys.modules["renamed_state"]
    importlib.invalidate_caches()
    second = Checkpoint(slot, attempt=2)
    directory = second.path
    assert second.load() is None
    assert directory.is_dir() and list(directory.iterdir()) == []
    (directory / "model.txt").write_text("0 rounds")
    second.commit({"step": 0})
    assert Checkpoint(slot, attempt=3).load() == {"step": 0}


def test_each_load_is_the_state_as_saved(tmp_path):
    """A second load() gave the first one's arrays as the fit had changed
    them (views of one buffer)."""
    slot = tmp_path / "slot"
    slot.mkdir()
    Checkpoint(slot).save({"w": np.zeros(4)})
    resumed = Checkpoint(slot, attempt=2)
    first = resumed.load()
    first["w"] += 7
    again = resumed.load()
    assert again["w"].tolist() == [0.0] * 4 and not np.shares_memory(first["w"], again["w"])


@pytest.mark.parametrize("seconds", ["5", None, True])
def test_every_names_a_seconds_that_is_not_a_number(tmp_path, seconds):
    slot = tmp_path / "slot"
    slot.mkdir()
    with pytest.raises(TypeError, match=r"checkpoint.every\(seconds\): seconds must be a number"):
        Checkpoint(slot).every(seconds)


def test_a_checkpoints_folder_that_cannot_be_made_leaves_no_run_open(tmp_path):
    """The run's row was written before its checkpoints' folder was opened:
    where that fails, the run is marked failed, not left running."""
    import pandas as pd

    import manymodels as mm

    store = tmp_path / "models"
    mm.train(lambda df: len(df), mm.groups(pd.DataFrame({"g": [1, 2]}), by="g"), store=store,
             backend="serial", progress=False)
    (store / "checkpoints").write_text("a file where the folder goes")

    def fit(df, checkpoint):
        return len(df)

    with pytest.raises(OSError):
        mm.train(fit, mm.groups(pd.DataFrame({"g": [1, 2]}), by="g"), store=store,
                 backend="serial", progress=False)
    assert list(mm.Store(store).runs()["status"]) == ["finished", "failed"]


def test_every_takes_any_real_number(tmp_path):
    from fractions import Fraction

    slot = tmp_path / "slot"
    slot.mkdir()
    checkpoint = Checkpoint(slot)
    assert checkpoint.every(np.int64(0)) and checkpoint.every(Fraction(0))
    assert not checkpoint.every(np.float32(3600))


def test_a_state_resumed_then_refused_is_not_reported_resumed():
    """The journal says a task found a checkpoint, then refused its state
    (it no longer unpickles): the task started afresh, so resumed is False,
    and resumed_from says why."""
    from manymodels.run.checkpointing import describe, resumed_column

    events = [{"kind": "resumed", "attempt": 1, "run_id": 1, "at": 10.0, "saved_at": 9.0},
              {"kind": "refused", "reason": "its state cannot be unpickled"}]
    text = describe(events)
    assert resumed_column({0: text}, 1)[0] == [False]
    assert text.startswith("refused: its state cannot be unpickled")
    again = describe([*events, {"kind": "resumed", "attempt": 2, "run_id": 2, "at": 20.0,
                                "saved_at": 19.0, "same_run": True}])
    assert resumed_column({0: again}, 1)[0] == [True]


def test_a_checkpoint_the_rows_or_a_partial_would_take_is_refused_before_work():
    """def fit(checkpoint, df) failed every task ("got multiple values"); a
    partial binding checkpoint= had its value silently replaced."""
    import functools

    import pandas as pd

    import manymodels as mm

    calls = []

    def first(checkpoint, df):
        calls.append(1)

    def second(df, checkpoint):
        calls.append(1)

    source = mm.groups(pd.DataFrame({"g": [1, 2]}), by="g")
    with pytest.raises(TypeError, match="first parameter is checkpoint"):
        mm.train(first, source, backend="serial", progress=False)
    with pytest.raises(TypeError, match="binds checkpoint="):
        mm.train(functools.partial(second, checkpoint="mine"), source, backend="serial",
                 progress=False)
    assert calls == []


def test_a_killed_drivers_temporary_checkpoints_go_with_the_next_run(tmp_path, monkeypatch):
    """Without a store, a run's checkpoints live in a temporary folder its
    end removes; a SIGKILLed driver left it for good. The next run without a
    store removes such folders once their driver is gone."""
    import os
    import subprocess
    import sys
    import tempfile

    import pandas as pd

    import manymodels as mm

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # (read TMPDIR again, here and in the child)
    try:
        script = ("import os, signal, pandas as pd, manymodels as mm\n"
                  "def fit(df, checkpoint):\n"
                  "    checkpoint.save({'step': 1})\n"
                  "    os.kill(os.getpid(), signal.SIGKILL)\n"
                  "mm.train(fit, mm.groups(pd.DataFrame({'g': [1]}), by='g'),\n"
                  "         backend='serial', progress=False)\n")
        done = subprocess.run([sys.executable, "-c", script], timeout=120, env=os.environ.copy())
        assert done.returncode == -9
        left = list(tmp_path.glob("manymodels-checkpoints-*"))
        assert len(left) == 1
        os.utime(left[0], (0, 0))  # (a minute old at least)

        def fit(df, checkpoint):
            return len(df)

        mm.train(fit, mm.groups(pd.DataFrame({"g": [1]}), by="g"), backend="serial",
                 progress=False)
        assert list(tmp_path.glob("manymodels-checkpoints-*")) == []
    finally:
        tempfile.tempdir = None


def _escape(manifest: dict, victim) -> None:
    """A files folder outside the slot, naming no file (so nothing fails its check)."""
    manifest["files"].update(dir="../../victim", entries={})


def _escaping_entry(manifest: dict, victim) -> None:
    import hashlib

    data = (victim / "kept.txt").read_bytes()
    manifest["files"]["entries"] = {"../../../victim/kept.txt": [
        hashlib.sha256(data).hexdigest(), len(data)]}


@pytest.mark.parametrize("tamper", [
    _escape, _escaping_entry,
    lambda m, _: m.update(generation="2"),
    lambda m, _: m.update(attempt=True),
    lambda m, _: m["state"].update(name="../../victim/kept.txt"),
    lambda m, _: m["state"].update(sha256=7),
    lambda m, _: m.update(files=["files-1"]),
], ids=["files-dir", "entry-name", "generation", "attempt", "state-name", "sha256", "files"])
def test_a_manifest_with_fields_of_another_shape_is_refused_not_followed(tmp_path, tamper):
    """A manifest edited by hand or written by another version: its names
    are paths the slot's later commits remove, so a files folder outside the
    slot (``../../victim``) was removed by the next commit. Such a manifest
    is refused: the task resumes from the last state file whose own copy of
    the manifest is whole, or starts afresh; nothing outside the slot is
    read or removed, and no field of another type fails the task."""
    import json

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "kept.txt").write_text("the user's")
    slot = tmp_path / "checkpoints" / "slot"
    slot.mkdir(parents=True)
    first = Checkpoint(slot)
    (first.path / "model.txt").write_text("3 rounds")
    first.commit({"rounds": 3})
    manifest = json.loads((slot / "manifest.json").read_text())
    tamper(manifest, victim)
    (slot / "manifest.json").write_text(json.dumps(manifest))
    second = Checkpoint(slot, attempt=2)
    assert second.load() in (None, {"rounds": 3})
    assert not (second.path / "kept.txt").exists()
    (second.path / "model.txt").write_text("6 rounds")
    second.commit({"rounds": 6})
    assert (victim / "kept.txt").read_text() == "the user's"
    third = Checkpoint(slot, attempt=3)
    assert third.load() == {"rounds": 6}
    assert sorted(p.relative_to(third.path).as_posix() for p in third.path.rglob("*")) == [
        "model.txt"]


def test_an_attempt_the_run_gave_up_on_cannot_write_over_the_next_one(tmp_path):
    """On an engine that cannot stop a running task (a timeout on Spark or
    Dask), the attempt given up on runs on beside its retry, in one slot:
    its saves, commits and first use of ``path`` are refused once the retry
    has started, and they leave the retry's files and checkpoint alone."""
    from manymodels.engine.checkpoints import CheckpointSuperseded
    from manymodels.engine.checkpointspace import _count_start

    slot = tmp_path / "slot"
    slot.mkdir()
    first = Checkpoint(slot, attempt=_count_start(slot))
    late = Checkpoint(slot, attempt=first.attempt)  # (its path not used yet)
    (first.path / "model.txt").write_text("1 round")
    first.commit({"rounds": 1})
    retry = Checkpoint(slot, attempt=_count_start(slot))  # the driver gave up on the first
    assert retry.attempt == 2 and retry.load() == {"rounds": 1}
    (retry.path / "model.txt").write_text("2 rounds")
    for write in (lambda: first.save({"rounds": 99}), lambda: first.commit({"rounds": 99}),
                  lambda: late.path):
        with pytest.raises(CheckpointSuperseded, match="attempt 2 of this task has started"):
            write()
    with pytest.raises(FileNotFoundError):  # its own folder, which the retry removed
        (first.path / "model.txt").write_text("99 rounds")
    assert (retry.path / "model.txt").read_text() == "2 rounds"
    retry.commit({"rounds": 2})
    after = Checkpoint(slot, attempt=_count_start(slot))
    assert after.load() == {"rounds": 2}
    assert (after.path / "model.txt").read_text() == "2 rounds"


def _fails_where_told(item, checkpoint):
    """Saves each of 10 steps; fails after step MM_CK_FAIL_AT (the
    environment is not part of the task's identity: a re-run resumes)."""
    import os

    state = checkpoint.load()
    for step in range(0 if state is None else state, 10):
        checkpoint.save(step + 1)
        if str(step) == os.environ.get("MM_CK_FAIL_AT"):
            raise RuntimeError(f"failed after step {step}")
    return None, {"attempt": checkpoint.attempt}


def test_each_run_counts_its_own_attempts_in_resumed_from(tmp_path, monkeypatch):
    """A run that resumes another's checkpoint starts at attempt 1: what a
    third run resumed from is "attempt 1 of run 2", not the attempts of
    every run added up."""
    import manymodels as mm

    store = tmp_path / "store"

    def run(fail_at: str | None):
        if fail_at is None:
            monkeypatch.delenv("MM_CK_FAIL_AT", raising=False)
        else:
            monkeypatch.setenv("MM_CK_FAIL_AT", fail_at)
        return mm.train(_fails_where_told, mm.items([7]), store=store, backend="serial",
                        progress=False).results.iloc[0]

    assert run("3")["status"] == "failed"
    second = run("6")
    assert second["status"] == "failed" and second["resumed_from"].startswith(
        "attempt 1 of run 1")
    third = run(None)
    assert third["status"] == "ok" and third["attempt"] == 1
    assert third["resumed_from"].startswith("attempt 1 of run 2")


def _hold_and_release(root: str, times: int) -> int:
    from manymodels.engine.checkpointspace import CheckpointSpace

    failed = 0
    for _ in range(times):
        space = CheckpointSpace(root, ["ab" * 32])
        try:
            space.hold()
        except OSError:
            failed += 1
        space.release()
    return failed


def test_a_run_that_starts_as_another_ends_holds_its_checkpoints(tmp_path):
    """A run ending removed the owners' folder when it held no other lock:
    a run starting in another process at that moment failed between making
    the folder and opening its lock in it (FileNotFoundError, a run in ten
    when two processes start and end runs on one store). The folder stays."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:
        failed = pool.starmap(_hold_and_release, [(str(tmp_path), 3000)] * 2)
    assert failed == [0, 0]
