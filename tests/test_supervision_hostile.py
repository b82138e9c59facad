"""The processes backend's supervision under hostile but plausible use
(each case found by a review that hung, killed and interrupted real runs)."""

from __future__ import annotations

import threading
import time

import pytest

import manymodels as mm


def _pause(n, tag):
    time.sleep(0.02)
    return {"n": n}


def test_two_trains_at_once_in_threads_of_one_program_both_end():
    """Each run's forked workers waited at its start gate until end-of-file
    on the pipe, and a worker another run forked meanwhile held its write
    end: both runs waited for ever (2 hangs in 3 tries)."""
    for attempt in range(4):
        runs: dict[int, object] = {}

        def go(tag: int, runs: dict = runs) -> None:
            runs[tag] = mm.train(_pause, mm.items(range(12)) * mm.grid(tag=[tag]),
                                 backend="processes", workers=2, start_method="fork",
                                 progress=False)

        threads = [threading.Thread(target=go, args=(tag,), daemon=True) for tag in (0, 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(90)
        assert not any(thread.is_alive() for thread in threads), f"hung at try {attempt}"
        assert sorted(runs) == [0, 1]
        assert all((run.results["status"] == "ok").all() for run in runs.values())


def _square(value):
    return value * value


def _pool_of_its_own(item, method):
    import multiprocessing

    with multiprocessing.get_context(method).Pool(1) as pool:
        return {"total": sum(pool.map(_square, range(item + 2)))}


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_fit_with_a_spawned_pool_of_its_own_returns_on_spawned_workers(method):
    """The pool's children ran the spawned worker's entry module again as
    their __main__, unguarded: a second worker loop, and the fit never
    returned."""
    run = mm.train(_pool_of_its_own, mm.items([1, 2]) * mm.grid(method=[method]),
                   backend="processes", workers=2, start_method="spawn", timeout=120,
                   progress=False)
    assert (run.results["status"] == "ok").all(), run.results["error"].tolist()
    assert run.results["total"].tolist() == [5, 14]


def _fails(item):
    raise RuntimeError(f"item {item} is refused")


def test_the_error_budgets_message_says_the_fraction_given():
    """max_failures=0.3 of 3 tasks said "over max_failures=0", a value the
    user never wrote."""
    with pytest.raises(mm.TooManyFailures) as stopped:
        mm.train(_fails, mm.items(range(3)), max_failures=0.3, backend="serial",
                 progress=False)
    assert "over max_failures=0.3 (at most 0 of 3 tasks)" in str(stopped.value)


def _setup_fails_third(counter):
    import fcntl

    with open(counter, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        starts = len(handle.read())
        handle.write("x")
    if starts == 2:  # the replacement of the worker that crashed
        raise OSError("the licence server is busy")
    return starts


def _crash_on_5(n, resource):
    import os

    time.sleep(0.05)
    if n == 5:
        os._exit(1)
    return {"n": n}


def test_a_replacement_worker_whose_setup_fails_keeps_what_finished(tmp_path):
    """A worker's setup= that failed only in the replacement of a crashed
    worker raised WorkerStartupError with no .run: every finished result was
    lost, where an error budget's stop or Ctrl-C keep them."""
    import functools

    counter = tmp_path / "starts"
    with pytest.raises(mm.WorkerStartupError) as stopped:
        mm.train(_crash_on_5, mm.items(range(10)), backend="processes", workers=2,
                 setup=functools.partial(_setup_fails_third, str(counter)), retries=1,
                 start_method="fork", store=tmp_path / "s", progress=False)
    run = stopped.value.run
    finished = run.results[run.results["status"] == "ok"]
    assert len(finished) >= 1 and set(run.results["status"]) <= {"ok", "cancelled", "crashed"}
    assert mm.Store(tmp_path / "s").runs()["status"].iloc[-1] == "failed"
    again = mm.train(_crash_on_5, mm.items([n for n in range(10) if n != 5]),
                     backend="serial", setup=functools.partial(_setup_fails_third,
                                                               str(counter)),
                     store=tmp_path / "s", progress=False)  # (its setup now starts)
    assert again.results["reused"].sum() >= len(finished)


def _use(item):
    return {"ok": 1}


@pytest.mark.parametrize("backend", ["processes", "threads"])
def test_an_item_that_cannot_be_sent_is_not_retried(backend):
    """It fails the same way each time: retries=3 sent it four times."""
    import threading as threads_module

    items = [("a", 1), ("b", threads_module.Lock()), ("c", 3)]
    run = mm.train(_use, mm.items(items, key=lambda item: item[0]), backend=backend,
                   workers=2, retries=3, progress=False)
    failed = run.results[run.results["status"] == "failed"]
    if backend == "processes":  # (threads share the lock: nothing to send)
        assert len(failed) == 1 and failed["attempts"].iloc[0] == 1
    assert (run.results["status"] != "failed").sum() == 3 - len(failed)


def _model_of_a_module_only_the_worker_has(item, folder):
    import sys

    import numpy as np

    if folder not in sys.path:
        sys.path.insert(0, folder)
    import worker_only_models

    size = 2_000_000 if item == 1 else 4  # item 1: an array the data plane sends apart
    return worker_only_models.Box(np.full(size, float(item)))


def test_a_model_the_driver_cannot_unpickle_fails_where_it_is_asked_for(tmp_path):
    """A large model (its buffers sent apart) of a class the driver cannot
    import raised ModuleNotFoundError out of train, and every result was
    lost; it is now unpickled when asked for, as a small one is."""
    folder = tmp_path / "only-here"
    folder.mkdir()
    (folder / "worker_only_models.py").write_text(
        "class Box:\n    def __init__(self, values):\n        self.values = values\n")
    run = mm.train(_model_of_a_module_only_the_worker_has, mm.items([0, 1, 2]),
                   shared={"folder": str(folder)}, backend="processes", workers=2,
                   progress=False)
    assert (run.results["status"] == "ok").all()
    for item in (0, 1):
        with pytest.raises(ModuleNotFoundError, match="worker_only_models"):
            run.models[item]
    import sys

    sys.path.insert(0, str(folder))
    try:
        assert run.models[1].values.shape == (2_000_000,) and run.models[1].values[0] == 1.0
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop("worker_only_models", None)


#: A script whose items and grid values are of a class defined in it, run as
#: ``__main__``: a spawned worker, whose ``__main__`` is another module, cannot
#: unpickle them. It prints each run's outcome as JSON.
MAIN_CLASS_SCRIPT = """
import json, sys
import manymodels as mm

class Setting:
    def __init__(self, value):
        self.value = value

def fit(item, scale=1):
    return {"value": getattr(item, "value", item) * getattr(scale, "value", scale)}

options = dict(backend="processes", workers=2, start_method="spawn", progress=False)
items = [1, Setting(2), 3, Setting(4), 5]
run = mm.train(fit, mm.items(items, key=lambda item: getattr(item, "value", item)),
               retries=2, **options)
results = run.results.sort_values("item")
outcome = {"status": results["status"].tolist(), "attempts": results["attempts"].tolist(),
           "error": results["error"].tolist(), "value": results["value"].tolist()}
try:
    mm.train(fit, mm.items([1, 2, 3]) * mm.grid(scale=[2, Setting(3)]), max_failures=2,
             **options)
except mm.TooManyFailures as stopped:
    outcome["stopped"] = str(stopped)
print(json.dumps(outcome))
"""


def test_an_item_of_a_class_in_main_fails_its_task_alone_on_spawned_workers(tmp_path):
    """A spawned worker died unpickling a batch that held an item of a class
    defined in the user's script: WorkerStartupError, and no task named.
    Each such task now fails alone, saying why, once (retries do not send it
    again), against max_failures; the others finish."""
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "script.py"
    script.write_text(MAIN_CLASS_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["status"] == ["ok", "failed", "ok", "failed", "ok"], outcome
    assert outcome["attempts"] == [1, 1, 1, 1, 1]
    assert [outcome["value"][i] for i in (0, 2, 4)] == [1, 3, 5]
    for error in (outcome["error"][1], outcome["error"][3]):
        assert "cannot be unpickled" in error and "Setting" in error, error
        assert "__main__" in error and "module" in error, error
    assert "3 tasks failed, over max_failures=2" in outcome["stopped"], outcome["stopped"]
    assert "cannot be unpickled" in outcome["stopped"]


#: A driver that trains into a store until interrupted, then prints as JSON
#: what it caught, what it kept and what of the run is still alive in it.
INTERRUPTED_DRIVER = """
import json, signal, sys, threading, time
from pathlib import Path
import psutil
import manymodels as mm

marks = Path(sys.argv[1])

def fit(n):
    time.sleep(0.05)
    (marks / str(n)).touch()
    return {"n": n}

out = {"caught": None}
try:
    mm.train(fit, mm.items(range(400)), backend="processes", workers=2, progress=False,
             start_method="fork", store=sys.argv[2])
except mm.RunInterrupted as stopped:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a second one later is not train's)
    out["caught"] = "RunInterrupted"
    out["ok"] = int((stopped.run.results["status"] == "ok").sum())
    out["stored"] = mm.Store(sys.argv[2]).runs()["status"].iloc[-1]
except KeyboardInterrupt:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    out["caught"] = "KeyboardInterrupt"
_, alive = psutil.wait_procs(psutil.Process().children(recursive=True), timeout=5)
out["children"] = [process.pid for process in alive]
out["senders"] = [t.name for t in threading.enumerate() if t.name.startswith("manymodels-send")]
print(json.dumps(out))
"""


@pytest.mark.parametrize("gap_s", [0.0, 0.005])
def test_a_second_ctrl_c_during_the_stop_keeps_the_results_and_ends_the_workers(tmp_path,
                                                                                gap_s):
    """A second SIGINT within milliseconds of the first landed in the stop
    (killing the workers, building the run): a bare KeyboardInterrupt came
    out of train, the finished results were lost and workers and their
    sender threads were left running. The stop is now not cut short: the
    run raises RunInterrupted with the results, committed to the store."""
    import json
    import os
    import signal
    import subprocess
    import sys

    import psutil

    script, marks = tmp_path / "driver.py", tmp_path / "marks"
    script.write_text(INTERRUPTED_DRIVER)
    marks.mkdir()
    driver = subprocess.Popen([sys.executable, str(script), str(marks), str(tmp_path / "s")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        deadline = time.monotonic() + 120
        while len(os.listdir(marks)) < 4:
            assert time.monotonic() < deadline and driver.poll() is None, "no task finished"
            time.sleep(0.01)
        children = psutil.Process(driver.pid).children(recursive=True)
        os.kill(driver.pid, signal.SIGINT)
        time.sleep(gap_s)
        os.kill(driver.pid, signal.SIGINT)
        stdout, stderr = driver.communicate(timeout=60)
    finally:
        driver.kill()
    assert driver.returncode == 0, stderr[-3000:]
    outcome = json.loads(stdout.strip().splitlines()[-1])
    assert outcome["caught"] == "RunInterrupted", stderr[-3000:]
    assert outcome["ok"] >= 3 and outcome["stored"] == "interrupted"
    assert outcome["children"] == [] and outcome["senders"] == []
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive


def _closes_inherited_descriptors(n, linger_s):
    time.sleep(0.01)
    if n == 7:
        import os

        os.closerange(3, 65536)  # as daemonizing helpers do
        time.sleep(linger_s)
    return {"n": n}


@pytest.mark.parametrize(("start_method", "linger_s"),
                         [("fork", 0.0), ("fork", 0.6), ("spawn", 0.0)])
def test_a_task_that_closes_its_workers_pipes_is_charged_alone(start_method, linger_s):
    """The pipe's end-of-file was taken for the worker's death while it
    went on to its next tasks: the driver blamed whichever ran then (two
    or three innocent tasks a run) and said it was killed by SIGKILL (its
    own kill). The worker now ends before it marks another task, and only
    the task that closed the pipes is charged, saying so; one still running
    after closing them (``linger_s``) is charged too."""
    run = mm.train(_closes_inherited_descriptors, mm.items(range(24)),
                   shared={"linger_s": linger_s}, backend="processes", workers=2,
                   start_method=start_method, progress=False)
    failed = run.results[run.results["status"] != "ok"]
    assert failed["item"].tolist() == [7], failed[["item", "error"]].to_string()
    assert failed["status"].tolist() == ["crashed"]
    assert "pipes to the driver were closed while this task ran" in failed["error"].iloc[0]


POISON_MODULE = """
import os

DRIVER = os.getpid()  # (a forked worker inherits the driver's: it is not the driver)


def _load(value):
    if os.getpid() != DRIVER:
        os._exit(5)  # stands for a C extension's object that crashes on load
    return Poison(value)


class Poison:
    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        return (_load, (self.value,))
"""


def _key_of(item):
    return getattr(item, "value", item)


def test_an_item_whose_unpickling_kills_the_worker_is_charged_alone(tmp_path, monkeypatch):
    """A worker died unpickling a batch before marking any task: a death
    outside any task, an innocent task cancelled, and past five the run
    stopped with WorkerStartupError. The batch now goes again a task a
    batch, and the death charges the task whose item it was."""
    (tmp_path / "poison_items.py").write_text(POISON_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import poison_items

    items = [*range(20), poison_items.Poison(99), *range(100, 120)]
    run = mm.train(lambda item: {"ok": 1}, mm.items(items, key=_key_of), backend="processes",
                   workers=2, start_method="fork", progress=False)
    results = run.results.set_index("item")
    assert (results.drop(index=99)["status"] == "ok").all(), results["status"].value_counts()
    assert results.loc[99, "status"] == "crashed"
    assert "died unpickling this task's item" in results.loc[99, "error"]
    assert "exited with code 5" in results.loc[99, "error"]


def _exit_cleanly_on_2(item):
    if item == 2:
        import os

        os._exit(0)
    return {"n": item}


def test_a_task_that_ends_its_worker_with_code_0_is_told_why_it_has_no_result():
    """os._exit(0) in a fit read "worker process exited with code 0": an
    exit that looks like success, for a task that returned nothing."""
    run = mm.train(_exit_cleanly_on_2, mm.items(range(4)), backend="processes", workers=1,
                   start_method="fork", progress=False)
    results = run.results.set_index("item")
    assert results["status"].tolist() == ["ok", "ok", "crashed", "ok"]
    error = results.loc[2, "error"]
    assert "exited with code 0 without returning this task's result" in error
    assert "os._exit" in error


def test_a_sigint_as_the_scheduler_loop_ends_still_stops_the_workers():
    """A SIGINT handled as the stop began, before it marked the run
    stopping, raised KeyboardInterrupt out of the stop itself: no
    backend.stop (workers left running) and no RunInterrupted. Delivered
    here at that point by a tracer that raises the signal there."""
    import linecache
    import signal as signals
    import sys

    import psutil

    from manymodels.engine.scheduling import Scheduler

    state = {"loop_ended": False, "sent": False}

    def in_loop(frame, event, arg):
        if event == "return":
            state["loop_ended"] = True
        return in_loop

    def in_run(frame, event, arg):
        if event == "line" and state["loop_ended"] and not state["sent"] and linecache.getline(
                frame.f_code.co_filename, frame.f_lineno).strip() == "interrupts.stopping = True":
            state["sent"] = True
            signals.raise_signal(signals.SIGINT)  # (handled here, as the stop begins)
        return in_run

    def tracer(frame, event, arg):
        if frame.f_code is Scheduler._loop.__code__:
            return in_loop
        return in_run if frame.f_code is Scheduler.run.__code__ else None

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    sys.settrace(tracer)
    try:
        with pytest.raises(mm.RunInterrupted) as stopped:
            mm.train(_pause, mm.items(range(3)) * mm.grid(tag=[0]), backend="processes",
                     workers=1, start_method="fork", progress=False)
    finally:
        sys.settrace(None)
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        for process in left:
            process.kill()
    assert state["sent"] and not left, left
    assert (stopped.value.run.results["status"] == "ok").all()


_READS_SLOWED: list[int] = []


def test_a_slow_read_of_a_batchs_rows_is_not_charged_to_its_first_task(tmp_path, monkeypatch):
    """The first task's timeout clock started before its batch's rows were
    read: a read longer than timeout= (a slow file system) timed out every
    task whose fit takes microseconds. The read is slowed in the (forked)
    worker, each worker's first read only; a fit that hangs still times out."""
    import numpy as np
    import pandas as pd

    from manymodels.inputs import datareaders

    pd.DataFrame({"g": np.repeat(list("abcd"), 3), "x": np.arange(12.0)}).to_parquet(
        tmp_path / "part.parquet", index=False)
    read = datareaders.ParquetBatches.begin_batch

    def slowly(self, refs):
        if not _READS_SLOWED:  # (a forked worker's own list)
            _READS_SLOWED.append(1)
            time.sleep(2.5)  # a file system 2.5 timeouts slow
        return read(self, refs)

    monkeypatch.setattr(datareaders.ParquetBatches, "begin_batch", slowly)

    def fit(df):
        if df["g"].iloc[0] == "d":
            time.sleep(3600)
        return len(df)

    run = mm.train(fit, mm.groups(tmp_path, by="g", read_on_workers=True), timeout=1,
                   workers=1, backend="processes", start_method="fork", progress=False)
    status = dict(zip(run.results["g"], run.results["status"]))
    assert status == {"a": "ok", "b": "ok", "c": "ok", "d": "timeout"}, run.results


#: The fork (counted from 1) before which :func:`_ctrl_c_before_a_fork` sends
#: SIGINT, as a Ctrl-C that comes while the driver forks; 0: none.
_INTERRUPTED_FORK = {"at": 0, "forks": 0}


def _ctrl_c_before_a_fork() -> None:
    if _INTERRUPTED_FORK["at"]:
        _INTERRUPTED_FORK["forks"] += 1
        if _INTERRUPTED_FORK["forks"] == _INTERRUPTED_FORK["at"]:
            import signal

            signal.raise_signal(signal.SIGINT)


def _dies_on_1(n):
    if n == 1:
        import os

        os._exit(3)
    return {"n": n}


@pytest.mark.parametrize("fork", [1, 2], ids=["first-worker", "replacement"])
def test_a_ctrl_c_while_the_driver_forks_a_worker_stops_the_run(fork, capfd):
    """Python runs a signal's handler at its next line of Python code, which
    after a fork is an at-fork hook's (logging's, the store writer's): the
    KeyboardInterrupt was printed as "Exception ignored" and dropped, and the
    run went on to its end. The signal is now held while a worker starts and
    stops the run once the worker is in its place (ended by the stop)."""
    import os

    import psutil

    if not _INTERRUPTED_FORK.get("registered"):
        os.register_at_fork(before=_ctrl_c_before_a_fork)  # (inert once disarmed)
        _INTERRUPTED_FORK["registered"] = True
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    _INTERRUPTED_FORK.update(at=fork, forks=0)
    try:
        with pytest.raises(mm.RunInterrupted) as stopped:
            mm.train(_dies_on_1, mm.items(range(3)), backend="processes", workers=1,
                     start_method="fork", progress=False)
    finally:
        _INTERRUPTED_FORK["at"] = 0
        left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
        _, alive = psutil.wait_procs(left, timeout=5)
        for process in alive:
            process.kill()
    assert _INTERRUPTED_FORK["forks"] == fork and not alive, alive
    assert "Exception ignored" not in capfd.readouterr().err
    if fork == 1:  # (stopped as the first worker started: nothing ran)
        assert (stopped.value.run.results["status"] == "cancelled").all()


def _listed(n):
    return [n]


def _interrupted_inside(code, sends, tmp_path):
    """A run of 20 tasks into a store, a SIGINT raised (once) inside
    ``code`` where ``sends(frame, event, arg)`` says: the run it stopped,
    and whether the signal was sent."""
    import signal as signals
    import sys

    state = {"sent": False}

    def inside(frame, event, arg):
        if not state["sent"] and sends(frame, event, arg):
            state["sent"] = True
            signals.raise_signal(signals.SIGINT)  # (handled there)
        return inside

    sys.settrace(lambda frame, event, arg: inside if frame.f_code is code else None)
    try:
        with pytest.raises(mm.RunInterrupted) as stopped:
            mm.train(_listed, mm.items(range(20)), backend="processes", workers=1,
                     start_method="fork", progress=False, store=tmp_path / "s")
    finally:
        sys.settrace(None)
    return stopped.value, state["sent"]


def _ok_items(results):
    return results.loc[results["status"] == "ok", "item"].tolist()


def test_a_ctrl_c_while_the_driver_records_a_part_keeps_it_whole(tmp_path):
    """A SIGINT handled while the driver recorded a finished part (here
    after its statuses were set, before its models) left those tasks ``ok``
    in the run's results without their models, out of the store, and out of
    the count the error gave. A round's events are now recorded whole
    first: the run, its error and the store agree."""
    import linecache

    from manymodels.engine.records import TaskRecords

    models_next = "self.worker[indices] = worker"

    def before_the_models(frame, event, arg):  # statuses set, models not
        return event == "line" and linecache.getline(
            frame.f_code.co_filename, frame.f_lineno).strip() == models_next

    stopped, sent = _interrupted_inside(TaskRecords.mark_ok.__code__, before_the_models,
                                        tmp_path)
    run = stopped.run
    ok = _ok_items(run.results)
    assert sent and ok
    assert f"interrupted after {len(ok)} of 20 tasks" in str(stopped)
    assert sorted(run.models) == ok and [run.models[item] for item in ok] == [[i] for i in ok]
    assert _ok_items(mm.Store(tmp_path / "s").results()) == ok


def test_a_ctrl_c_while_the_backend_reads_its_workers_keeps_what_it_read(tmp_path):
    """A SIGINT handled inside the backend's ``poll``, after it had read a
    finished part from a worker and before it returned, lost that part: its
    tasks were ``cancelled`` in the run and out of the store (the next run
    trained them again). A poll is now read and recorded whole."""
    from manymodels.engine.backends.processes import ProcessesBackend

    def a_part_read(frame, event, arg):  # _handle returned a Finished part
        return event == "return" and bool(arg)

    stopped, sent = _interrupted_inside(ProcessesBackend._handle.__code__, a_part_read,
                                        tmp_path)
    ok = _ok_items(stopped.run.results)
    assert sent and ok
    assert sorted(stopped.run.models) == ok
    assert _ok_items(mm.Store(tmp_path / "s").results()) == ok


@pytest.mark.parametrize("where", ["the writer is made", "the scheduler is made"])
def test_a_ctrl_c_before_the_scheduler_starts_does_not_leave_the_run_running(tmp_path, where):
    """A SIGINT handled between the store recording the run's start and the
    scheduler taking the run over (here as the run's store writer is made,
    right after the run's row is committed, or as the scheduler is made)
    left the run ``running`` in the store for as long as the process lived
    (a notebook's kernel): the run's end is now recorded, ``interrupted``."""
    import signal as signals
    import sys

    from manymodels.engine.scheduling import Scheduler
    from manymodels.store.writer import StoreWriter

    code = (StoreWriter if where == "the writer is made" else Scheduler).__init__.__code__
    state = {"sent": False}

    def tracer(frame, event, arg):
        if frame.f_code is code and not state["sent"]:
            state["sent"] = True
            signals.raise_signal(signals.SIGINT)
        return None

    sys.settrace(tracer)
    try:
        with pytest.raises(KeyboardInterrupt):
            mm.train(_listed, mm.items(range(4)), backend="threads", workers=1,
                     progress=False, store=tmp_path / "s")
    finally:
        sys.settrace(None)
    assert state["sent"]
    runs = mm.Store(tmp_path / "s").runs()
    assert runs["status"].tolist() == ["interrupted"]
    assert mm.train(_listed, mm.items(range(4)), backend="threads", workers=1,
                    progress=False, store=tmp_path / "s").summary().ok == 4
