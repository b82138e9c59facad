"""Checkpoints inside tasks, with real faults: a driver SIGKILLed mid-run, a
worker SIGKILLed, a task that hangs past its timeout, a checkpoint file
tampered with, two drivers on one store. The fit is a 40-step loop whose
final value depends on every step, so a resumed task that skipped or
repeated a step would end elsewhere than an uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

import manymodels as mm
from conftest import shared_ray
from manymodels.engine.checkpoints import Checkpoint
from manymodels.engine.checkpointspace import OWNERS, owner_alive

#: The suite's engines this module uses, kept up from the module before (conftest).
SHARED_ENGINES = ("ray",)

STEPS = 40


def final_value(item: int, steps: int = STEPS) -> float:
    value = 1.0
    for step in range(steps):
        value = (value * 1.5 + item * step + 1) % 1_000_003
    return value


def stepper(item, checkpoint, log, steps=STEPS, pause=0.0, fault=None):
    """Saves every step. ``fault`` "kill:N", "hang:N" or "raise:N" strikes at
    step N of the task's first attempt; MM_CK_HOLD (not part of the task's
    identity) holds the task at step 5 while that file exists."""
    state = checkpoint.load()
    start, value = (0, 1.0) if state is None else (state["step"], state["value"])
    with open(Path(log, f"{item}.starts"), "a") as starts:
        starts.write(f"{start}\n")
    kind, _, at = (fault or "none:-1").partition(":")
    for step in range(start, steps):
        value = (value * 1.5 + item * step + 1) % 1_000_003
        checkpoint.save({"step": step + 1, "value": value})
        Path(log, f"{item}.progress").write_text(str(step + 1))
        hold = os.environ.get("MM_CK_HOLD")
        while hold and step == 5 and os.path.exists(hold):
            time.sleep(0.02)
        if step == int(at) and checkpoint.attempt == 1:
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "hang":
                time.sleep(3600)
            if kind == "raise":
                raise RuntimeError(f"failed at step {step}")
        time.sleep(pause)
    return {"final": value}


def starts(log: Path, item: int) -> list[int]:
    return [int(line) for line in Path(log, f"{item}.starts").read_text().split()]


def train(log: Path, items=(0, 1), **options):
    shared = {"log": str(log), **options.pop("shared", {})}
    options.setdefault("progress", False)
    return mm.train(stepper, mm.items(list(items)), shared=shared, **options)


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "log"
    path.mkdir()
    return path


# -- one run: retries resume ------------------------------------------------------


@pytest.mark.parametrize("store", [False, True], ids=["no-store", "store"])
def test_a_worker_sigkilled_resumes_in_its_retry(tmp_path, log, store):
    run = train(log, shared={"fault": "kill:20"}, backend="processes", workers=2, retries=1,
                store=tmp_path / "store" if store else None)
    results = run.results.set_index("item")
    assert (results["status"] == "ok").all() and (results["attempts"] == 2).all()
    for item in (0, 1):
        assert starts(log, item) == [0, 21]  # saved through step 20, then killed
        assert results.loc[item, "final"] == final_value(item)
    assert results["resumed"].all()
    assert results["resumed_from"].str.startswith("attempt 1 of this run").all()
    if store:  # committed: the task's checkpoint went with it
        assert not any(p.is_file() for p in (tmp_path / "store" / "checkpoints").rglob("*"))
        kept = mm.Store(tmp_path / "store").results()
        assert kept["resumed"].all() and kept["resumed_from"].notna().all()


def modelled(item, checkpoint):
    checkpoint.save({"step": 1})
    return [item] * 3, {"item": item}


def test_a_tasks_checkpoint_goes_once_its_model_is_committed(tmp_path):
    run = mm.train(modelled, mm.items(range(6)), store=tmp_path / "store", backend="serial",
                   progress=False)
    assert run.models[5] == [5, 5, 5]
    assert not list((tmp_path / "store" / "checkpoints").rglob("manifest.json"))


def test_a_timeout_with_a_retry_resumes(log):
    run = train(log, items=[3], shared={"fault": "hang:10"}, backend="processes", workers=1,
                timeout=2, retries=1)
    row = run.results.iloc[0]
    assert row["status"] == "ok" and row["attempts"] == 2 and row["resumed"]
    assert starts(log, 3) == [0, 11]
    assert row["final"] == final_value(3)


def test_no_checkpoint_without_the_parameter_and_a_plain_run_is_unchanged(log):
    run = train(log, items=[2], backend="serial")
    assert not run.results["resumed"].any() and run.results.iloc[0]["final"] == final_value(2)

    def plain(item):
        return {"x": item}

    results = mm.train(plain, mm.items([1]), backend="serial", progress=False).results
    assert "resumed_from" not in results and not results["resumed"].any()


# -- across runs: the store keeps them --------------------------------------------

DRIVER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[3])
    import manymodels as mm
    from test_checkpoints import stepper
    mm.train(stepper, mm.items([0, 1]), shared={"log": sys.argv[2], "pause": 0.05},
             store=sys.argv[1], workers=2, progress=False)
""")


def _progress(log: Path, item: int | str) -> int:
    try:
        name = item if isinstance(item, str) else f"{item}.progress"
        return int(Path(log, name).read_text() or 0)
    except (OSError, ValueError):
        return 0


def _start_driver(tmp_path: Path, store: Path, log: Path, env: dict | None = None):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    return subprocess.Popen([sys.executable, str(script), str(store), str(log),
                             str(Path(__file__).parent)], env={**os.environ, **(env or {})})


def _wait(condition, what: str, limit_s: float = 90) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {limit_s} s for {what}"
        time.sleep(0.02)


def _no_run_running(store: Path) -> bool:
    owners = store / "checkpoints" / OWNERS
    return not owners.is_dir() or not any(
        owner_alive(store / "checkpoints", lock.name.removesuffix(".lock"))
        for lock in owners.iterdir())


@pytest.mark.slow
def test_a_sigkilled_driver_resumes_at_the_last_saved_step(tmp_path, log):
    store = tmp_path / "store"
    driver = _start_driver(tmp_path, store, log)
    _wait(lambda: min(_progress(log, 0), _progress(log, 1)) >= 15 or driver.poll() is not None,
          "both tasks at step 15")
    driver.send_signal(signal.SIGKILL)
    driver.wait(timeout=30)
    saved = {item: _progress(log, item) for item in (0, 1)}
    assert min(saved.values()) >= 15 and max(saved.values()) < STEPS
    _wait(lambda: _no_run_running(store), "the killed run's workers to end")

    run = train(log, shared={"pause": 0.05}, store=store, backend="processes", workers=2)
    results = run.results.set_index("item")
    for item in (0, 1):
        first, resumed = starts(log, item)
        assert first == 0 and resumed >= saved[item] - 1  # at most the step being saved
        assert results.loc[item, "final"] == final_value(item)  # as if never interrupted
    assert results["resumed"].all()
    assert results["resumed_from"].str.contains("of run 1").all()


def test_a_changed_parameter_or_reuse_false_starts_afresh(tmp_path, log):
    store = tmp_path / "store"
    failed = train(log, items=[1], shared={"fault": "raise:20"}, store=store, backend="serial")
    assert failed.results.iloc[0]["status"] == "failed"  # its checkpoint is kept
    changed = train(log, items=[1], shared={"fault": "raise:20", "steps": 30}, store=store,
                    backend="serial", retries=1, retry_on=RuntimeError)
    assert starts(log, 1)[-2:] == [0, 21]  # its own first attempt and retry
    assert changed.results.iloc[0]["final"] == final_value(1, 30)
    afresh = train(log, items=[1], shared={"fault": "raise:20"}, store=store,
                   backend="serial", reuse=False, retries=1, retry_on=RuntimeError)
    assert starts(log, 1)[-2:] == [0, 21] and afresh.results.iloc[0]["attempts"] == 2
    assert afresh.results.iloc[0]["resumed_from"].startswith("attempt 1 of this run")


def test_the_next_run_resumes_a_failed_task_and_keep_checkpoints(tmp_path, log):
    store = tmp_path / "store"
    train(log, items=[2], shared={"fault": "raise:20"}, store=store, backend="serial")
    again = train(log, items=[2], shared={"fault": "raise:20"}, store=store, backend="serial",
                  keep_checkpoints=True)
    assert starts(log, 2) == [0, 21]
    row = again.results.iloc[0]
    assert row["resumed"] and "of run 1" in row["resumed_from"]
    assert row["final"] == final_value(2)
    kept = list((store / "checkpoints").rglob("manifest.json"))
    assert len(kept) == 1  # keep_checkpoints: still there after the commit
    assert mm.Store(store).gc() >= 1  # its model is in the store: no task can use it
    assert not list((store / "checkpoints").rglob("manifest.json"))


def test_keep_checkpoints_without_a_store_is_refused_before_any_work():
    """Without a store a run's checkpoints are in a temporary folder that
    goes with the run: keep_checkpoints=True kept nothing, without a word."""
    calls = []

    def fit(item, checkpoint):
        calls.append(item)
        return {"n": item}

    with pytest.raises(ValueError, match="keep_checkpoints=True needs store="):
        mm.train(fit, mm.items([1, 2]), backend="serial", progress=False,
                 keep_checkpoints=True)
    assert calls == []


def test_gc_keeps_a_checkpoint_whose_manifest_a_crash_tore(tmp_path, log):
    store = tmp_path / "store"
    train(log, items=[6], shared={"fault": "raise:20"}, store=store, backend="serial")
    (manifest,) = (store / "checkpoints").rglob("manifest.json")
    manifest.write_bytes(b'{"generation": 21, "sav')  # who saved it: read from the state files
    assert mm.Store(store).gc() == 0
    again = train(log, items=[6], shared={"fault": "raise:20"}, store=store, backend="serial")
    assert starts(log, 6) == [0, 21] and again.results.iloc[0]["resumed"]
    assert again.results.iloc[0]["final"] == final_value(6)


def test_a_tampered_checkpoint_is_refused_by_name_and_the_task_starts_afresh(tmp_path, log):
    store = tmp_path / "store"
    train(log, items=[4], shared={"fault": "raise:20"}, store=store, backend="serial")
    (manifest,) = (store / "checkpoints").rglob("manifest.json")
    state = manifest.parent / json.loads(manifest.read_bytes())["state"]["name"]
    state.write_bytes(state.read_bytes()[:-3])  # truncated (the other file is an older save)
    with pytest.warns(RuntimeWarning, match=f"refused.*{state.name}.*SHA-256"):
        again = train(log, items=[4], shared={"fault": "raise:20"}, store=store,
                      backend="serial", retries=1, retry_on=RuntimeError)
    # afresh in this run's first attempt (whose fault strikes again), resumed in its retry
    assert starts(log, 4) == [0, 0, 21]
    row = again.results.iloc[0]
    assert row["status"] == "ok" and row["resumed_from"].startswith("attempt 1 of this run")
    assert "refused:" in row["resumed_from"] and state.name in row["resumed_from"]
    assert row["final"] == final_value(4)
    report = again.report(tmp_path / "report.html").read_text()
    assert "Resumed from checkpoints" in report and state.name in report


@pytest.mark.slow
def test_two_drivers_on_one_store_do_not_resume_each_others_running_tasks(tmp_path, log):
    store, hold = tmp_path / "store", tmp_path / "hold"
    hold.touch()
    other_log = tmp_path / "other-log"
    other_log.mkdir()
    driver = _start_driver(tmp_path, store, other_log, {"MM_CK_HOLD": str(hold)})
    try:
        _wait(lambda: _progress(other_log, 0) >= 6 and _progress(other_log, 1) >= 6,
              "the other driver's tasks at step 6")
        run = train(log, shared={"pause": 0.05}, store=store, backend="serial")
        assert starts(log, 0) == [0] and starts(log, 1) == [0]  # not the other's step 6
        assert not run.results["resumed"].any()
        assert driver.poll() is None  # still running, its checkpoints untouched
        assert len(list((store / "checkpoints").rglob("manifest.json"))) == 2
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)


def saves_then_fails_while_flagged(item, checkpoint, flags):
    resumed = checkpoint.load()
    checkpoint.save({"step": 1})
    if Path(flags, str(item)).exists():  # (not part of the task's identity)
        raise RuntimeError(f"flagged, resumed={resumed is not None}")
    return {"resumed": resumed is not None}


def test_the_dashboard_shows_which_tasks_resumed(tmp_path):
    from manymodels.observe.dashboard import DashboardServer
    from test_dashboard import at, get

    store, flags = tmp_path / "store", tmp_path / "flags"
    flags.mkdir()
    (flags / "0").touch()
    (flags / "1").touch()
    options = {"shared": {"flags": str(flags)}, "store": store, "backend": "serial",
               "progress": False}
    mm.train(saves_then_fails_while_flagged, mm.items([0, 1, 2]), **options)
    (flags / "0").unlink()  # the next run: task 0 resumes and ends, task 1 resumes and fails
    mm.train(saves_then_fails_while_flagged, mm.items([0, 1, 2]), **options)
    with DashboardServer(store) as server:
        _, first = get(at(server, "api/run/1"))
        _, second = get(at(server, "api/run/2"))
    assert first["summary"]["resumed"] == 0 and second["summary"]["resumed"] == 2
    assert all(task["resumed_from"] == "" for task in first["slowest"])
    slowest = {task["key"]: task["resumed_from"] for task in second["slowest"]}
    assert slowest.keys() == {"0", "1"}  # task 2's model was reused
    assert all(text.startswith("attempt 1 of run 1") for text in slowest.values())
    (failed,) = second["failures"]["items"]
    assert failed["key"] == "1" and "resumed=True" in failed["error"]
    assert failed["resumed_from"].startswith("attempt 1 of run 1")


# -- the Checkpoint itself ---------------------------------------------------------


def test_path_files_are_committed_atomically_and_tampering_is_refused(tmp_path):
    slot = tmp_path / "slot"
    slot.mkdir()
    events = []
    first = Checkpoint(slot, report=lambda kind, details: events.append((kind, details)))
    assert first.load() is None and list(first.path.iterdir()) == []
    with first as directory:
        (directory / "model.txt").write_text("round 10")
    (first.path / "model.txt").write_text("round 20, never committed")
    first.save({"round": 10})
    assert first.every(3600) is False and first.every(0) is True

    second = Checkpoint(slot, attempt=2, report=lambda kind, details: events.append(kind))
    assert second.load() == {"round": 10} and second.resumed
    assert (second.path / "model.txt").read_text() == "round 10"
    assert events[-1] == "resumed"
    (files,) = slot.glob("files-*")
    (files / "model.txt").write_text("round 99")  # the committed copy, tampered with
    third = Checkpoint(slot, attempt=3, report=lambda kind, details: events.append(details))
    assert third.load() is None and not third.resumed
    assert "model.txt does not match its SHA-256" in events[-1]["reason"]
    assert list(third.path.iterdir()) == []
    with pytest.raises(ValueError, match="seconds"):
        third.every(-1)


def test_a_save_interrupted_before_its_manifest_leaves_the_previous_state(tmp_path):
    slot = tmp_path / "slot"
    slot.mkdir()
    Checkpoint(slot).save({"step": 1})
    (slot / "state-b.pkl").write_bytes(b"half a pickle")  # the next save, cut short
    assert Checkpoint(slot).load() == {"step": 1}


def test_load_after_save_gives_what_was_saved_and_commit_keeps_a_state_with_files(tmp_path):
    slot = tmp_path / "slot"
    slot.mkdir()
    checkpoint = Checkpoint(slot)
    weights = np.arange(4.0)
    checkpoint.save({"weights": weights})
    weights += 10  # changed after the save (the save wrote the array's buffer as it was)
    assert checkpoint.load()["weights"].tolist() == [0.0, 1.0, 2.0, 3.0]
    (checkpoint.path / "booster.txt").write_text("tree 7")
    checkpoint.commit({"rounds": 7})
    checkpoint.save({"rounds": 8})  # over the other state file: the files stay committed
    resumed = Checkpoint(slot, attempt=2)
    assert resumed.load() == {"rounds": 8}
    assert (resumed.path / "booster.txt").read_text() == "tree 7"


SAVER = textwrap.dedent("""
    import os
    import sys
    from pathlib import Path
    import numpy as np
    from manymodels.engine.checkpoints import Checkpoint
    checkpoint = Checkpoint(Path(sys.argv[1]))
    step = (checkpoint.load() or {"step": 0})["step"]
    while True:  # back to back: a kill lands inside a save most of the time
        step += 1
        checkpoint.save({"step": step, "values": np.full(1 << 20, float(step))})
        Path(sys.argv[1], "saved.tmp").write_text(str(step))  # (a kill never tears it)
        os.replace(Path(sys.argv[1], "saved.tmp"), Path(sys.argv[1], "saved"))
""")


def test_a_save_killed_midway_leaves_the_previous_checkpoint_whole(tmp_path):
    slot = tmp_path / "slot"
    slot.mkdir()
    rng = np.random.default_rng(0)
    last, events = 0, []
    for _ in range(6):
        saver = subprocess.Popen([sys.executable, "-c", SAVER, str(slot)])
        _wait(lambda last=last: _progress(slot, "saved") > last, "a save")
        time.sleep(rng.uniform(0, 0.05))
        saver.send_signal(signal.SIGKILL)
        saver.wait(timeout=30)
        events.clear()
        state = Checkpoint(slot, report=lambda kind, details: events.append(kind)).load()
        assert events == ["resumed"]
        assert state["step"] >= int((slot / "saved").read_text())  # nothing reported is lost
        assert (state["values"] == state["step"]).all()  # and what is read is whole
        state["values"][0] += 1  # (a view of the file's bytes, writable: read out of band)
        last = state["step"]


def test_a_lost_or_stale_manifest_is_made_up_for_by_the_state_files(tmp_path):
    """What a power cut may leave of a manifest written without its fsync."""
    slot = tmp_path / "slot"
    slot.mkdir()
    checkpoint = Checkpoint(slot)
    checkpoint.save({"step": 1})
    stale = (slot / "manifest.json").read_bytes()
    checkpoint.save({"step": 2})
    assert sorted(p.name for p in slot.glob("state-*")) == ["state-a.pkl", "state-b.pkl"]
    (slot / "manifest.json").write_bytes(b"")  # empty
    assert Checkpoint(slot).load() == {"step": 2}
    (slot / "manifest.json").write_bytes(b'{"generation": 2, "sav')  # torn
    assert Checkpoint(slot).load() == {"step": 2}
    (slot / "manifest.json").write_bytes(stale)  # names state-a.pkl, the older save
    assert Checkpoint(slot).load() == {"step": 2}
    (slot / "manifest.json").unlink()
    resumed = Checkpoint(slot)
    assert resumed.load() == {"step": 2} and resumed.resumed
    resumed.save({"step": 3})  # over state-a.pkl
    whole = (slot / "state-a.pkl").read_bytes()
    (slot / "state-a.pkl").write_bytes(whole[:-2])  # the next save cut short, no manifest
    (slot / "manifest.json").write_bytes(b"")
    assert Checkpoint(slot).load() == {"step": 2}
    (slot / "state-a.pkl").write_bytes(whole)
    again = Checkpoint(slot)
    assert again.load() == {"step": 3}
    again.save({"step": 4})  # into the other file: step 3 stays whole meanwhile
    assert Checkpoint(slot).load() == {"step": 4}


def test_a_checkpoint_with_evaluate_is_refused_before_work(tmp_path):
    import pandas as pd

    def fit(df, checkpoint):
        return None

    table = pd.DataFrame({"g": [1] * 6, "x": range(6), "y": range(6)})
    with pytest.raises(ValueError, match="checkpoint"):
        mm.train(fit, mm.groups(table, by="g"), evaluate=mm.holdout(target="y", test_size=0.5),
                 backend="serial", progress=False)
    with pytest.raises(TypeError, match="keep_checkpoints"):
        mm.train(fit, mm.groups(table, by="g"), keep_checkpoints="yes", backend="serial")
    warnings.simplefilter("ignore")


# -- engines ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.dask
def test_on_dask_a_killed_workers_task_resumes(tmp_path, log):
    distributed = pytest.importorskip("distributed")
    import logging

    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                       dashboard_address=":0", silence_logs=logging.ERROR)
    client = distributed.Client(cluster)
    try:
        run = train(log, items=[5], shared={"fault": "kill:20"}, backend="dask", retries=1,
                    store=tmp_path / "store")
    finally:
        client.close()
        cluster.close()
    row = run.results.iloc[0]
    assert row["status"] == "ok" and row["resumed"], run.results.to_dict("records")
    assert starts(log, 5)[-1] == 21 and row["final"] == final_value(5)


@pytest.mark.slow
@pytest.mark.spark
def test_on_spark_a_killed_workers_task_resumes(tmp_path, log):
    from test_engines import _start_spark

    _, close, _ = _start_spark()  # a local[2] session, as a user's
    try:
        run = train(log, items=[5], shared={"fault": "kill:20"}, backend="spark", retries=1,
                    store=tmp_path / "store")
    finally:
        close()
    row = run.results.iloc[0]
    assert row["status"] == "ok" and row["resumed"], run.results.to_dict("records")
    assert starts(log, 5) == [0, 21] and row["final"] == final_value(5)


@pytest.mark.slow
@pytest.mark.ray
def test_on_ray_a_killed_workers_task_resumes(tmp_path, log):
    shared_ray()  # a local Ray of two CPUs, as a user's
    run = train(log, items=[5], shared={"fault": "kill:20"}, backend="ray", retries=1,
                store=tmp_path / "store")
    row = run.results.iloc[0]
    assert row["status"] == "ok" and row["resumed"], run.results.to_dict("records")
    assert starts(log, 5) == [0, 21] and row["final"] == final_value(5)


def test_resumed_from_is_nan_where_a_task_resumed_nothing_in_every_run(tmp_path, log):
    """A run whose tasks took checkpoints but resumed none, a run where one
    task resumed, and a run that took none: concatenated, every task that
    resumed nothing has NaN (what pandas fills a run without the column
    with), never None beside NaN."""
    import pandas as pd

    store = tmp_path / "store"
    quiet = train(log, items=[0, 1], store=store, backend="serial")
    one = train(log, items=[2, 3], shared={"fault": "raise:20"}, store=store, backend="serial",
                retries=1, retry_on=RuntimeError)
    plain = mm.train(modelled_plain, mm.items([4]), store=store, backend="serial",
                     progress=False)
    frames = [quiet.results, one.results, plain.results]
    opened = mm.Store(store)
    frames += [opened.results(run) for run in (quiet.run_id, one.run_id, plain.run_id)]
    opened.close()
    for frame in frames:
        if "resumed_from" in frame.columns:
            missing = frame.loc[~frame["resumed"], "resumed_from"].tolist()
            assert all(isinstance(v, float) and np.isnan(v) for v in missing), missing
    together = pd.concat(frames[:3], ignore_index=True)
    missing = together.loc[~together["resumed"], "resumed_from"].tolist()
    assert len(missing) == 3 and all(isinstance(v, float) and np.isnan(v) for v in missing)
    assert together.loc[together["resumed"], "resumed_from"].str.startswith("attempt 1").all()


def modelled_plain(item):
    return item
