"""A checkpoint under hostile use: what a killed commit leaves, a refused
state, a state loaded twice, arguments of the wrong type (each found by a
review that killed and fuzzed real checkpoints)."""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import time
from pathlib import Path

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
    a file in its place is refused before the row is written; a folder that
    cannot be written fails the run, marked failed, not left running."""
    import os

    import pandas as pd

    import manymodels as mm

    store = tmp_path / "models"
    mm.train(lambda df: len(df), mm.groups(pd.DataFrame({"g": [1, 2]}), by="g"), store=store,
             backend="serial", progress=False)
    (store / "checkpoints").write_text("a file where the folder goes")

    def fit(df, checkpoint):
        return len(df)

    with pytest.raises(mm.StoreError, match="checkpoints' is not a directory: the store "
                                            "keeps its checkpoints there"):
        mm.train(fit, mm.groups(pd.DataFrame({"g": [1, 2]}), by="g"), store=store,
                 backend="serial", progress=False)
    assert list(mm.Store(store).runs()["status"]) == ["finished"]  # refused before its row
    (store / "checkpoints").unlink()
    (store / "checkpoints").mkdir(mode=0o500)  # a folder, in which no owner lock can be made
    try:
        if not os.access(store / "checkpoints", os.W_OK):  # (root writes anyway)
            with pytest.raises(OSError):
                mm.train(fit, mm.groups(pd.DataFrame({"g": [1, 2]}), by="g"), store=store,
                         backend="serial", progress=False)
            assert list(mm.Store(store).runs()["status"]) == ["finished", "failed"]
    finally:
        (store / "checkpoints").chmod(0o700)


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
    store removes such folders once their driver is gone, one whose driver
    died before it took its lock too."""
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
        before_hold = tmp_path / "manymodels-checkpoints-diedbeforehold"
        before_hold.mkdir()  # a driver killed between making its folder and locking it
        os.utime(before_hold, (0, 0))

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


def _count_starts(slot: str, threads: int, times: int) -> list[int]:
    """Attempt numbers taken in ``slot`` by ``threads`` threads at once."""
    from manymodels.engine.checkpointspace import _count_start

    taken: list[int] = []
    start = threading.Barrier(threads)

    def take() -> None:
        start.wait()
        taken.extend(_count_start(Path(slot)) for _ in range(times))

    workers = [threading.Thread(target=take) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return taken


def test_attempts_opening_one_slot_at_once_get_numbers_of_their_own(tmp_path):
    """Two attempts of a task opening its slot at one instant read the same
    count and took the same number (neither then refused as superseded:
    both wrote there), or one failed on the other's temporary file. Threads
    and processes each take a number of their own."""
    import multiprocessing

    with multiprocessing.get_context("fork").Pool(2) as pool:
        taken = pool.starmap(_count_starts, [(str(tmp_path), 3, 100)] * 2)
    assert sorted(taken[0] + taken[1]) == list(range(1, 601))


def test_a_process_forked_while_a_thread_takes_a_number_neither_hangs_nor_blocks(tmp_path):
    """A fork while another thread held the attempt counter left the child
    its lock held (its next count hung) and its copy of the slot's file
    lock (every other process's count in that slot waited for the child)."""
    import multiprocessing

    from manymodels.engine.checkpointspace import _count_start, _counting

    slot, other = tmp_path / "slot", tmp_path / "other"
    slot.mkdir()
    other.mkdir()
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:
        with _counting(slot):
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    child = multiprocessing.get_context("fork").Process(
        target=lambda: (_count_start(other), time.sleep(1.2)))
    child.start()  # forked while the counter is held
    release.set()
    holder.join()
    try:
        with multiprocessing.get_context("fork").Pool(1) as pool:  # another process, now
            assert pool.apply_async(_count_start, (slot,)).get(timeout=1) == 1
        child.join(5)
        assert child.exitcode == 0  # its own count did not hang
    finally:
        child.kill()


def test_a_start_during_a_claim_counts_after_it(tmp_path, monkeypatch):
    """A claim renamed a stopped run's slot to its own, then reset its
    attempt counter: another start of the task (a retry) that found the slot
    between the two counted on the old counter (4), which the claim then
    reset, and the claim counted 1: the attempt the run gave up on was
    never refused as superseded. The rename, the reset and the claim's own
    count are one hold of the slot's lock: the retry counts 2 after them."""
    import os

    from manymodels.engine.checkpoints import CheckpointSuperseded
    from manymodels.engine.checkpointspace import CheckpointSpace

    stopped = CheckpointSpace(str(tmp_path), ["ab" * 32])
    for _ in range(3):
        stopped.open(0)
    stopped.open(0).save({"step": 1})
    space = CheckpointSpace(str(tmp_path), ["ab" * 32])
    rename, retries = os.rename, []

    def rename_then_retry(source, target):  # the retry starts right after the rename
        rename(source, target)
        if not retries:
            retry = threading.Thread(target=lambda: retries.append(space.open(0)))
            retries.append(retry)
            retry.start()
            retry.join(timeout=0.2)  # (returns at once where it does not wait for the claim)

    monkeypatch.setattr(os, "rename", rename_then_retry)
    first = space.open(0)
    retries[0].join()
    assert (first.attempt, retries[1].attempt) == (1, 2)
    with pytest.raises(CheckpointSuperseded):
        first.save({"step": 2})
    retries[1].save({"step": 2})


def test_a_superseded_attempt_that_reads_again_leaves_the_retrys_checkpoint(tmp_path):
    """The attempt given up on read its slot again after the retry had saved
    over the state file its manifest named: its check failed, and it emptied
    the slot, the retry's progress with it."""
    from manymodels.engine.checkpoints import CheckpointSuperseded
    from manymodels.engine.checkpointspace import CheckpointSpace

    space = CheckpointSpace(str(tmp_path / "space"), ["ab" + "0" * 30])
    space.hold()
    try:
        first = space.open(0)
        first.save({"step": 1})
        first.save({"step": 2})
        retry = space.open(0)
        assert retry.load() == {"step": 2}
        retry.save({"step": 3})
        retry.save({"step": 4})
        with pytest.raises(CheckpointSuperseded, match="attempt 2 of this task has started"):
            first.load()
        assert space.open(0).load() == {"step": 4}
    finally:
        space.release()


def test_a_file_name_with_a_backslash_is_committed_and_resumed(tmp_path):
    """A backslash is a character of a POSIX file name: the commit took it and
    every resume refused it as "a path outside its folder"."""
    slot = tmp_path / "slot"
    slot.mkdir()
    first = Checkpoint(slot)
    (first.path / "a\\b.txt").write_text("kept")
    first.commit({"n": 1})
    again = Checkpoint(slot, attempt=2)
    assert again.load() == {"n": 1} and again.resumed
    assert (again.path / "a\\b.txt").read_text() == "kept"


def test_a_commit_killed_writing_its_manifest_leaves_no_temporary_file_for_good(tmp_path):
    """An attempt killed between writing its manifest's temporary file and
    renaming it left ``.tmp-manifest.json-<pid>`` in the slot, one a kill,
    for as long as the task's checkpoints lived."""
    import os
    import signal
    import time

    from manymodels.engine import checkpointfiles

    slot = tmp_path / "slot"
    slot.mkdir()
    Checkpoint(slot).commit({"n": 1})
    pid = os.fork()
    if pid == 0:  # written, then held before the rename until the kill
        try:
            os.fsync = lambda descriptor: time.sleep(3600)
            checkpointfiles.write_atomically(slot / "manifest.json", b"{}")
        finally:
            os._exit(0)
    deadline = time.monotonic() + 30
    while not list(slot.glob(".tmp-manifest.json-*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert [p.name for p in slot.glob(".tmp-*")] == [f".tmp-manifest.json-{pid}"]
    again = Checkpoint(slot, attempt=2)
    assert again.load() == {"n": 1}
    again.commit({"n": 2})
    assert not list(slot.glob(".tmp-*"))
    assert Checkpoint(slot, attempt=3).load() == {"n": 2}


_FORKING_FIT = """
import os, signal, sys, time
import pandas as pd
import manymodels as mm

def fit(rows, checkpoint):
    state = checkpoint.load() or {"step": 0}
    if state["step"] == 0 and os.fork() == 0:  # a helper outliving the fit and the driver
        time.sleep(60)
        os._exit(0)
    for step in range(state["step"], 100):
        state["step"] = step + 1
        checkpoint.save(state)
        if step == 5:
            os.kill(os.getpid(), signal.SIGKILL)  # the driver: fit runs in it
    return {"step": state["step"]}

mm.train(fit, mm.groups(pd.DataFrame({"g": ["a"]}), by="g"), store=sys.argv[1],
         backend=sys.argv[2], progress=False)
"""


@pytest.mark.parametrize("backend", ["threads"])  # (fit runs in the driver: serial alike)
def test_a_process_the_fit_forked_does_not_keep_a_killed_run_running(tmp_path, backend):
    """A process forked from the driver inherited its owner lock: after a
    SIGKILL of the driver, the orphan kept the dead run "running", and the
    next run of the same task started afresh instead of resuming it."""
    import os
    import signal
    import subprocess
    import sys

    import manymodels as mm

    script = tmp_path / "driver.py"
    script.write_text(_FORKING_FIT)
    store = tmp_path / "store"
    first = subprocess.Popen([sys.executable, str(script), str(store), backend],
                             env=os.environ.copy(), start_new_session=True)
    try:
        assert first.wait(timeout=120) == -signal.SIGKILL
        again = subprocess.run([sys.executable, str(script), str(store), backend],
                               timeout=120, env=os.environ.copy())
        assert again.returncode == 0
        results = mm.Store(store).results(2)
        assert results["resumed"].tolist() == [True] and results["step"].tolist() == [100]
        assert results["resumed_from"].str.startswith("attempt 1 of run 1").all()
    finally:  # the orphan (in a session of its own, with the driver it outlived)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)


def saves_then_dies(rows, checkpoint):
    """Saves every MM_EVERY seconds; the driver dies at step 5 (and 40) while
    MM_DIE is set."""
    import os
    import signal

    state = checkpoint.load() or {"step": 0}
    for step in range(state["step"], 50):
        state["step"] = step + 1
        if checkpoint.every(float(os.environ["MM_EVERY"])):
            checkpoint.save(state)
        if step in (5, 40) and os.environ.get("MM_DIE"):
            os.kill(os.getpid(), signal.SIGKILL)
    return {"step": state["step"]}


_RUN_TILL_KILLED = """
import sys
import pandas as pd
import manymodels as mm
sys.path.insert(0, sys.argv[2])
from test_checkpoints_hostile import saves_then_dies

mm.train(saves_then_dies, mm.groups(pd.DataFrame({"g": ["a"]}), by="g"), store=sys.argv[1],
         backend="serial", progress=False)
"""


def test_gc_keeps_a_checkpoint_a_later_run_took_over_when_the_first_is_deleted(tmp_path,
                                                                               monkeypatch):
    """Run 2 resumed run 1's checkpoint and was killed before it saved again:
    deleting run 1 made gc remove the checkpoint (judged by the run that saved
    it, not by the run that holds it), and run 3 started from nothing."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import pandas as pd

    import manymodels as mm

    store = tmp_path / "store"
    tests = str(Path(__file__).parent)
    for every in ("0", "3600"):  # run 1 saves each step; run 2 resumes and saves nothing
        done = subprocess.run([sys.executable, "-c", _RUN_TILL_KILLED, str(store), tests],
                              timeout=120, env={**os.environ, "MM_EVERY": every, "MM_DIE": "1"})
        assert done.returncode == -9
    kept = mm.Store(store)
    assert kept.runs()["status"].tolist() == ["interrupted", "interrupted"]
    kept.delete(1)
    assert kept.gc() == 0
    monkeypatch.setenv("MM_EVERY", "3600")
    monkeypatch.delenv("MM_DIE", raising=False)
    run = mm.train(saves_then_dies, mm.groups(pd.DataFrame({"g": ["a"]}), by="g"),
                   store=store, backend="serial", progress=False)
    assert run.results["resumed_from"].str.startswith("attempt 1 of run 1,").all()
    assert run.results["step"].tolist() == [50]


def _checkpoint_first(checkpoint, alpha):
    step = (checkpoint.load() or 0) + 1
    checkpoint.save(step)
    return {"step": step, "alpha": alpha}


def test_a_bare_grids_fit_may_take_its_checkpoint_first():
    """A bare grid gives fit keywords only: no rows take a first parameter's
    place, yet def fit(checkpoint, alpha) was refused as if they did."""
    import manymodels as mm

    run = mm.train(_checkpoint_first, mm.grid(alpha=[1, 2]), backend="serial", progress=False)
    assert run.results["status"].tolist() == ["ok", "ok"]
    assert run.results["metric_alpha"].tolist() == [1, 2]
    with pytest.raises(TypeError, match="fit's first parameter is checkpoint"):
        mm.train(_checkpoint_first, mm.items([1]) * mm.grid(alpha=[1]), backend="serial",
                 progress=False)


def _numbered_replica(item, checkpoint, counter, fail):
    """Takes the next number from ``counter`` when it starts afresh; fails
    after saving it while ``fail`` exists (neither is in the identity)."""
    from pathlib import Path

    number = checkpoint.load()
    if number is None:
        number = int(Path(counter).read_text() or 0) + 1
        Path(counter).write_text(str(number))
        checkpoint.save(number)
    if Path(fail).exists():
        raise RuntimeError("flagged")
    return {"number": number}


def test_replicas_of_one_setting_keep_checkpoints_of_their_own(tmp_path):
    """Items equal but for their position have one identity: their tasks
    shared one checkpoint, and each replica resumed the first one's state
    (every seed the same), or, at once, failed as a superseded attempt."""
    import manymodels as mm

    counter, fail, store = tmp_path / "counter", tmp_path / "fail", tmp_path / "store"
    counter.write_text("")
    fail.touch()
    shared = {"counter": str(counter), "fail": str(fail)}
    replicas = mm.items([{"seed": "random"}] * 3)
    failed = mm.train(_numbered_replica, replicas, shared=shared, store=store,
                      backend="serial", progress=False)
    assert failed.results["status"].tolist() == ["failed"] * 3
    assert counter.read_text() == "3"  # each started afresh, none resumed another's
    fail.unlink()
    run = mm.train(_numbered_replica, replicas, shared=shared, store=store,
                   backend="serial", progress=False, keep_checkpoints=True)
    assert run.results["number"].tolist() == [1, 2, 3]  # each its own, resumed
    assert run.results["resumed"].all()
    assert mm.Store(store).gc() == 3  # their models are in the store: none can be used
    assert not list((store / "checkpoints").rglob("manifest.json"))


@pytest.mark.parametrize("name_length", range(8))
def test_a_resumed_states_arrays_are_aligned(tmp_path, name_length):
    """The arrays came back at the offsets their bytes had in the state file,
    after a pickle of any length: unaligned for their dtype, each in-place
    operation of the resumed training loop several times slower."""
    state = {"name": "x" * name_length, "odd": np.arange(3, dtype=np.float32),
             "w": np.linspace(0, 1, 1000), "i": np.arange(5, dtype=np.int8),
             "z": np.full(7, 1 + 2j)}
    Checkpoint(tmp_path).save(state)
    resumed = Checkpoint(tmp_path, attempt=2).load()
    for key in ("odd", "w", "i", "z"):
        array = resumed[key]
        assert array.flags.aligned and array.flags.writeable, key
        assert np.array_equal(array, state[key]) and array.dtype == state[key].dtype
    resumed["w"] += 1  # in place, as a training loop does
    assert np.array_equal(resumed["w"], state["w"] + 1)


def test_a_task_that_saves_without_loading_is_not_reported_resumed(tmp_path):
    """save() read the slot to know where to write, and took what it found
    for a resume: a fit that always starts afresh was reported resumed."""
    Checkpoint(tmp_path).save({"step": 5})
    events = []
    fresh = Checkpoint(tmp_path, attempt=2, report=lambda kind, _: events.append(kind))
    fresh.save({"step": 1})
    assert fresh.load() == {"step": 1} and not fresh.resumed and events == []
    resuming = Checkpoint(tmp_path, attempt=3, report=lambda kind, _: events.append(kind))
    assert resuming.load() == {"step": 1} and resuming.resumed and events == ["resumed"]
    resuming.save({"step": 2})  # after its load: it resumed, once
    assert resuming.resumed and events == ["resumed"]


def test_a_save_that_read_nothing_does_not_read_the_state_it_replaces(tmp_path):
    """A fit's first save read and hashed the whole previous state (a GB
    state: a GB read) that it was about to replace, and refused it when it
    did not match. The manifest tells the save where to write; a load
    checks the state it reads."""
    Checkpoint(tmp_path).save({"step": 1})
    with open(tmp_path / "state-a.pkl", "r+b") as state:  # its last byte changed
        state.seek(-1, 2)
        last = state.read(1)
        state.seek(-1, 2)
        state.write(bytes([last[0] ^ 1]))
    events = []
    fresh = Checkpoint(tmp_path, attempt=2, report=lambda kind, _: events.append(kind))
    fresh.save({"step": 2})
    assert events == [] and fresh._manifest["generation"] == 2
    assert Checkpoint(tmp_path, attempt=3).load() == {"step": 2}


def test_an_unpicklable_state_is_refused_saying_so_and_the_last_save_stays(tmp_path):
    checkpoint = Checkpoint(tmp_path)
    checkpoint.save({"step": 1})
    with pytest.raises(TypeError, match=r"checkpoint's state \(dict\) cannot be pickled.*lock"):
        checkpoint.save({"step": 2, "lock": threading.Lock()})
    assert Checkpoint(tmp_path, attempt=2).load() == {"step": 1}


_GATE, _SAVED = threading.Event(), threading.Event()


def _interrupts_then_saves(item, checkpoint):
    """Stops the driver (a Ctrl-C), then saves once told to, as a fit that
    a thread still runs goes on after the run has ended."""
    import _thread

    _thread.interrupt_main()
    _GATE.wait(60)
    checkpoint.save({"step": 1})
    _SAVED.set()


@pytest.mark.filterwarnings("ignore:fit reads values that cannot be hashed")
def test_a_threads_fit_that_outlives_a_ctrl_c_keeps_its_run_held(tmp_path):
    """A Ctrl-C ends a threads-backend run while its fits go on in their
    threads (a thread cannot be stopped): the run's lock was released at
    once, and a next run took the slot a fit was still saving into. The run
    stays held until its last fit ends."""
    import manymodels as mm
    from manymodels.engine.checkpointspace import OWNERS, owner_alive

    root = tmp_path / "store" / "checkpoints"
    with pytest.raises(KeyboardInterrupt):
        mm.train(_interrupts_then_saves, mm.items([1]), store=tmp_path / "store",
                 backend="threads", workers=1, progress=False)
    tokens = [lock.stem for lock in (root / OWNERS).glob("*.lock")]
    try:
        assert len(tokens) == 1 and owner_alive(root, tokens[0])
    finally:
        _GATE.set()
    assert _SAVED.wait(60)
    for _ in range(6000):  # (the thread releases it once its fit has returned)
        if not owner_alive(root, tokens[0]):
            break
        threading.Event().wait(0.01)
    assert not owner_alive(root, tokens[0])


def _interrupts(item, checkpoint):
    import _thread

    checkpoint.save({"step": 1})
    _thread.interrupt_main()
    threading.Event().wait(60)  # (the Ctrl-C ends this wait, on the driver's main thread)


def test_a_serial_run_stopped_by_ctrl_c_is_released_at_once(tmp_path):
    """A Ctrl-C in a serial fit stops the run from the fit's own frame: the
    run is no longer held, and the next run resumes its task."""
    import manymodels as mm
    from manymodels.engine.checkpointspace import OWNERS

    with pytest.raises(KeyboardInterrupt):
        mm.train(_interrupts, mm.items([1]), store=tmp_path / "store", backend="serial",
                 progress=False)
    assert list((tmp_path / "store" / "checkpoints" / OWNERS).glob("*.lock")) == []


def test_a_journal_that_cannot_be_written_does_not_stop_a_load(tmp_path):
    """load() wrote the run's record of the resume first, and failed with it
    (a full disk): reading a checkpoint needs no write. The record is left out."""
    from manymodels.engine.checkpointspace import JOURNAL, CheckpointSpace

    first = CheckpointSpace(str(tmp_path), ["ab" * 32])
    first.open(0).save({"step": 3})
    second = CheckpointSpace(str(tmp_path), ["ab" * 32])
    (tmp_path / JOURNAL).write_text("")  # (no folder can be made there: as a full disk)
    checkpoint = second.open(0)
    assert checkpoint.load() == {"step": 3} and checkpoint.resumed
    assert second.journal() == {} and list(tmp_path.glob(f"{JOURNAL}*")) == [tmp_path / JOURNAL]


def test_the_slots_of_two_stopped_runs_go_once_the_task_is_committed(tmp_path, monkeypatch):
    """A run claims the newest slot of a stopped run; an older one (here of a
    run before a reuse=False run) was never resumed nor removed with the
    task's: it stayed until a Store.gc."""
    import manymodels as mm

    store = tmp_path / "store"

    def run(fail_at: str | None, **options):
        if fail_at is None:
            monkeypatch.delenv("MM_CK_FAIL_AT", raising=False)
        else:
            monkeypatch.setenv("MM_CK_FAIL_AT", fail_at)
        return mm.train(_fails_where_told, mm.items([7]), store=store, backend="serial",
                        progress=False, **options).results.iloc[0]

    assert run("3")["status"] == "failed"
    assert run("1", reuse=False)["status"] == "failed"
    slots = [p for p in (store / "checkpoints").glob("*/*/*") if p.is_dir()]
    assert len(slots) == 2
    last = run(None)
    assert last["status"] == "ok" and last["resumed_from"].startswith("attempt 1 of run 2")
    assert [p for p in (store / "checkpoints").glob("*/*/*") if p.is_dir()] == []


def _a_task_at_round_2(tmp_path: Path) -> tuple[Checkpoint, Path]:
    """A task's first checkpoint, its ``path`` holding ``round-2/model.txt``."""
    slot = tmp_path / "slot"
    slot.mkdir()
    first = Checkpoint(slot)
    (first.path / "round-2").mkdir()
    (first.path / "round-2" / "model.txt").write_text("2 rounds")
    return first, first.path


def test_a_commit_keeps_empty_folders_and_links_as_they_are(tmp_path):
    """What checkpoint.path holds is what a resumed task finds: an empty
    folder was dropped, a link to a folder dropped, a link to a file made a
    copy of it (another file, no longer following the latest round)."""
    import os

    first, work = _a_task_at_round_2(tmp_path)
    (work / "logs" / "events").mkdir(parents=True)
    os.symlink("round-2", work / "latest")
    os.symlink("round-2/model.txt", work / "model.txt")
    os.symlink(tmp_path / "nowhere", work / "dangling")
    first.commit({"rounds": 2})
    retry = Checkpoint(tmp_path / "slot", attempt=2)
    assert retry.load() == {"rounds": 2}
    found = retry.path
    assert (found / "logs" / "events").is_dir() and not any((found / "logs" / "events").iterdir())
    assert os.readlink(found / "latest") == "round-2"
    assert os.readlink(found / "model.txt") == "round-2/model.txt"
    assert os.readlink(found / "dangling") == str(tmp_path / "nowhere")
    assert (found / "latest" / "model.txt").read_text() == "2 rounds"
    assert not (found / "round-2" / "model.txt").is_symlink()


def test_a_manifest_naming_a_path_under_a_link_is_refused(tmp_path):
    """A manifest edited to put a link to another folder and a name under it
    would have the resume write there: it is refused, the task starts afresh."""
    import json

    slot = tmp_path / "slot"
    slot.mkdir()
    first = Checkpoint(slot)
    (first.path / "model.txt").write_text("1 round")
    first.commit()  # files only: the manifest is all there is to read
    manifest = json.loads((slot / "manifest.json").read_text())
    manifest["files"]["links"] = {"out": str(tmp_path / "outside")}
    manifest["files"]["links"]["out/made"] = "x"
    (slot / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "outside").mkdir()
    retry = Checkpoint(slot, attempt=2)
    assert list(retry.path.iterdir()) == [] and not retry.resumed
    assert list((tmp_path / "outside").iterdir()) == []


@pytest.mark.parametrize("store", [True, False], ids=["store", "no-store"])
def test_a_fit_still_running_after_its_run_ended_writes_no_checkpoint(tmp_path, store):
    """A fit that its engine could not stop at once (a forced cancel on
    Ray, Spark or Dask ends its process a moment later) went on saving
    after the run had released its space: into a slot the next run could
    claim, or, without a store, into folders it made again where the run
    had removed its space. Each write now checks that the run still holds
    the space."""
    import pickle

    from manymodels.engine.checkpoints import CheckpointSuperseded
    from manymodels.engine.checkpointspace import CheckpointSpace

    root = tmp_path / "space"
    space = CheckpointSpace(str(root), ["ab" + "0" * 30])
    space.hold()
    checkpoint = pickle.loads(pickle.dumps(space)).open(0)  # a worker's copy, as sent
    checkpoint.save({"step": 1})
    space.release(remove=not store)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(CheckpointSuperseded, match="has ended"):
        checkpoint.save({"step": 2})
    with pytest.raises(CheckpointSuperseded, match="has ended"):
        checkpoint.path  # noqa: B018
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
    if store:
        assert CheckpointSpace(str(root), ["ab" + "0" * 30]).open(0).load() == {"step": 1}


_HOLDS_A_SPACE = """
import pickle, sys, time
from manymodels.engine.checkpointspace import CheckpointSpace
space = CheckpointSpace(sys.argv[1], ["cd" + "0" * 30, "ce" + "0" * 30])
space.hold()
print(pickle.dumps(space).hex(), flush=True)
time.sleep(60)
"""


def test_a_task_of_a_killed_driver_stops_saving_on_its_machine_alone(tmp_path):
    """A driver killed (SIGKILL) leaves its space's lock file, not its lock:
    a task of its run still going on this machine stops saving, as it does
    once a run is released; a task on another machine, which may not see
    this machine's locks on a shared file system, goes by the file alone
    (asking the lock there superseded every save of a running run)."""
    import dataclasses
    import pickle
    import subprocess

    from manymodels.engine.checkpoints import CheckpointSuperseded

    root = tmp_path / "space"
    driver = subprocess.Popen([sys.executable, "-c", _HOLDS_A_SPACE, str(root)],
                              stdout=subprocess.PIPE)
    try:
        space = pickle.loads(bytes.fromhex(driver.stdout.readline().decode()))
        here = space.open(0)
        elsewhere = dataclasses.replace(space, host="another-machine").open(1)
        here.save({"step": 1})  # the driver holds it: saved
        elsewhere.save({"step": 1})
    finally:
        driver.kill()
        driver.wait()
    with pytest.raises(CheckpointSuperseded, match="has ended"):
        here.save({"step": 2})
    elsewhere.save({"step": 2})  # its lock file is there: taken for held


def test_a_link_made_by_its_absolute_path_into_the_folder_leads_there_on_resume(tmp_path):
    """``(path / "latest").symlink_to(path / "round-2")`` names the attempt's
    own folder by its absolute path; the retry resumes in a folder of its
    own, where that link dangled. Committed relative, it leads to the
    round the retry has. A link out of the folder is committed as it reads."""
    import os

    first, work = _a_task_at_round_2(tmp_path)
    (work / "latest").symlink_to(work / "round-2")
    (work / "round-2" / "top").symlink_to(work)
    (work / "outside").symlink_to(tmp_path / "elsewhere")
    first.commit({"rounds": 2})
    retry = Checkpoint(tmp_path / "slot", attempt=2)
    found = retry.path
    assert found != work and not work.exists()
    assert os.readlink(found / "latest") == "round-2"
    assert (found / "latest" / "model.txt").read_text() == "2 rounds"
    assert (found / "round-2" / "top" / "round-2").samefile(found / "round-2")
    assert os.readlink(found / "outside") == str(tmp_path / "elsewhere")


def test_a_save_or_commit_the_disk_refuses_names_the_file_and_keeps_the_last(tmp_path):
    """A full disk (here a file-size limit: the same error at the same
    write) failed ``save`` with ``[Errno 27] File too large`` alone; the
    error names the checkpoint's file, and the last checkpoint stays."""
    import resource
    import signal

    slot = tmp_path / "slot"
    slot.mkdir()
    checkpoint = Checkpoint(slot)
    checkpoint.save({"values": np.ones(10)})
    (checkpoint.path / "model.bin").write_bytes(b"x" * 300_000)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, limits[1]))
    try:
        with pytest.raises(OSError, match="state-b.pkl") as save:
            checkpoint.save({"values": np.ones(100_000)})
        with pytest.raises(OSError, match="model.bin") as commit:
            checkpoint.commit()
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, handler)
    assert "previous one is kept" in str(save.value) and commit.value.errno == save.value.errno
    resumed = Checkpoint(slot, attempt=2)
    assert resumed.load()["values"].tolist() == [1.0] * 10
    assert list(resumed.path.iterdir()) == []
    assert sorted(p.name for p in slot.iterdir() if p.name.startswith(("files", ".tmp"))) == []


def test_a_commit_of_a_path_the_fit_removed_is_refused_and_the_last_one_kept(tmp_path):
    """A library that clears its folder to write it again, failing before it
    did: committing the folder that was gone replaced the committed files
    with none, silently, and the state committed with them named files the
    resumed task did not find."""
    import shutil

    slot = tmp_path / "slot"
    slot.mkdir()
    checkpoint = Checkpoint(slot)
    (checkpoint.path / "model.txt").write_text("5 rounds")
    checkpoint.commit(5)
    shutil.rmtree(checkpoint.path)
    with pytest.raises(FileNotFoundError, match="work-1.*no longer a folder"):
        checkpoint.commit(6)
    resumed = Checkpoint(slot, attempt=2)
    assert resumed.load() == 5
    assert (resumed.path / "model.txt").read_text() == "5 rounds"
