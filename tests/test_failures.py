"""Failures really happen here: workers exit, are SIGKILLed, hang, outgrow their
memory limit; the driver is interrupted. One task pays, the others finish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import manymodels as mm
from conftest import assert_only_failed, assert_only_timed_out, shm_files

pytestmark = pytest.mark.usefixtures("no_leftovers")


def exit_on_13(item):
    if item == 13:
        os._exit(3)
    return item


def exit_on_10_raise_on_90(item):
    if item == 10:
        os._exit(3)
    if item == 90:
        raise ValueError("bad value")
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_replacement_workers_errors_carry_no_trace_of_the_crash_before(start_method):
    # the replacement was forked while the driver handled the dead worker's
    # EOFError; every error of its tasks then read "during handling of EOFError"
    run = mm.train(exit_on_10_raise_on_90, mm.items(list(range(100))), workers=1,
                   start_method=start_method, progress=False)
    results = run.results.set_index("item")
    assert results.loc[10, "status"] == "crashed" and results.loc[90, "status"] == "failed"
    error = results.loc[90, "error"]
    assert "ValueError: bad value" in error
    assert "EOFError" not in error and "During handling" not in error


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_exit_fails_only_its_task_even_inside_a_batch(start_method):
    run = mm.train(exit_on_13, mm.items(range(200)), workers=2, retries=1, progress=False,
                   start_method=start_method)
    results = run.results.set_index("item")
    assert results.loc[13, "status"] == "crashed"
    assert "exited with code 3" in results.loc[13, "error"]
    assert results.loc[13, "attempts"] == 2  # tried, retried once, then given up
    others = results.drop(index=13)
    assert (others["status"] == "ok").all() and len(others) == 199
    assert run.models[199] == 199
    assert run.summary().statuses == {"ok": 199, "crashed": 1}


def sleep_on_5_else_fast(item, pid_dir):
    if item == 5:
        Path(pid_dir, "victim").write_text(str(os.getpid()))
        time.sleep(60)
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_worker_killed_from_outside_mid_task(tmp_path, start_method):
    def killer():
        victim = tmp_path / "victim"
        deadline = time.monotonic() + 30
        while not victim.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)
        os.kill(int(victim.read_text()), signal.SIGKILL)

    thread = threading.Thread(target=killer)
    thread.start()
    run = mm.train(sleep_on_5_else_fast, mm.items(range(50)),
                   shared={"pid_dir": str(tmp_path)}, workers=2, progress=False,
                   start_method=start_method)
    thread.join()
    results = run.results.set_index("item")
    assert results.loc[5, "status"] == "crashed"
    assert "SIGKILL" in results.loc[5, "error"]
    assert (results.drop(index=5)["status"] == "ok").all()


def hang_on_2(item):
    if item == 2:
        time.sleep(3600)
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_timeout_kills_only_the_overdue_task(start_method):
    begin = time.monotonic()
    run = mm.train(hang_on_2, mm.items(range(20)), timeout=1, workers=2, progress=False,
                   start_method=start_method)
    assert time.monotonic() - begin < 240  # item 2 hangs for an hour unless killed
    assert_only_timed_out(run, 2, timeout=1)


def grow_on_1(item):
    if item == 1:
        blocks = []
        for _ in range(12):  # 600 MB, 50 MB at a time, touching every page
            blocks.append(np.ones(50_000_000 // 8))
            time.sleep(0.01)
        time.sleep(3600)  # only the memory limit ends this task
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_memory_limit_kills_the_growing_worker(start_method):
    run = mm.train(grow_on_1, mm.items(range(10)), memory_limit="400MB", workers=2,
                   progress=False, start_method=start_method)
    results = run.results.set_index("item")
    assert results.loc[1, "status"] == "memory"
    assert "memory_limit" in results.loc[1, "error"] and "MiB" in results.loc[1, "error"]
    assert (results.drop(index=1)["status"] == "ok").all()


def fail_if_even_under_100(item):
    if item < 100 and item % 2 == 0:
        raise RuntimeError(f"bad {item}")
    time.sleep(0.001)
    return item


@pytest.mark.parametrize("backend", ["serial", "threads", "processes"])
def test_error_budget_stops_early_and_keeps_results(backend):
    with pytest.raises(mm.TooManyFailures) as info:
        mm.train(fail_if_even_under_100, mm.items(range(400)), max_failures=5,
                 backend=backend, workers=2, progress=False)
    message = str(info.value)
    assert "over max_failures=5" in message and "RuntimeError: bad" in message
    run = info.value.run
    statuses = run.results["status"].value_counts()
    assert statuses["failed"] >= 6
    assert statuses.get("cancelled", 0) > 0
    ok = run.results[run.results["status"] == "ok"]
    assert all(run.models[item] == item for item in ok["item"])


def test_fraction_budget():
    with pytest.raises(mm.TooManyFailures):
        mm.train(fail_if_even_under_100, mm.items(range(400)), max_failures=0.05,
                 backend="serial", progress=False)
    run = mm.train(fail_if_even_under_100, mm.items(range(400)), max_failures=0.2,
                   backend="serial", progress=False)
    assert len(run.failed) == 50


class Flaky(ConnectionError):
    pass


def flaky_twice(item, marker_dir):
    marker = Path(marker_dir, f"{item}")
    tries = int(marker.read_text()) if marker.exists() else 0
    marker.write_text(str(tries + 1))
    if tries < 2:
        raise Flaky(f"transient {item}")
    return tries


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_retry_on_transient_errors(backend, tmp_path):
    run = mm.train(flaky_twice, mm.items(range(4)), shared={"marker_dir": str(tmp_path)},
                   retries=2, retry_on=ConnectionError, backend=backend, progress=False)
    assert (run.results["status"] == "ok").all()
    assert (run.results["attempts"] == 3).all()
    for d in tmp_path.iterdir():
        d.unlink()
    run = mm.train(flaky_twice, mm.items(range(4)), shared={"marker_dir": str(tmp_path)},
                   retries=2, backend=backend, progress=False)  # not retried by default
    assert (run.results["status"] == "failed").all()
    assert (run.results["attempts"] == 1).all()


def flaky_0_bad_1(item):
    if item == 0:
        raise Flaky("still down")
    if item == 1:
        raise ValueError("bad item")
    return item


def test_a_task_waiting_for_its_retry_when_the_run_stops_keeps_its_failure(tmp_path):
    # item 0 failed (retryable) and waits for its retry when item 1's failure
    # stops the run: it ran and failed, so it ends failed with its error, not
    # "cancelled" (which says it never ran), in the run and in the store
    with pytest.raises(mm.TooManyFailures) as stopped:
        mm.train(flaky_0_bad_1, mm.items(range(3)), retries=5, retry_on=ConnectionError,
                 max_failures=0, backend="serial", store=tmp_path, progress=False)
    results = stopped.value.run.results.set_index("item")
    assert results.loc[0, "status"] == "failed" and results.loc[0, "attempts"] == 1
    assert "Flaky: still down" in results.loc[0, "error"]
    assert 0 in stopped.value.run.failed["item"].tolist()
    assert "2 tasks failed" in str(stopped.value)
    why = mm.Store(tmp_path).why_not_reused(0, run=1)
    assert "its fit ended 'failed' (test_failures.Flaky: still down)" in why


def blas_threads(item):
    import joblib
    from threadpoolctl import threadpool_info

    blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    # joblib's cpu_count sizes LightGBM's default threads and n_jobs=-1 pools
    return {"blas": max(blas), "omp_env": int(os.environ["OMP_NUM_THREADS"]),
            "joblib_cpus": joblib.cpu_count(only_physical_cores=True)}


def _driver_blas_threads() -> list[int]:
    from threadpoolctl import threadpool_info

    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


@pytest.mark.parametrize("cpus, start_method",
                         [(1, "auto"), (2, "auto"), (1, "fork"), (2, "fork"), (1, "spawn")])
def test_workers_limit_blas_threads(cpus, start_method):
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=4):  # a driver with more BLAS threads than a task gets
        before = _driver_blas_threads()
        run = mm.train(blas_threads, mm.items(range(4)), cpus_per_task=cpus, workers=1,
                       start_method=start_method, progress=False)
        assert _driver_blas_threads() == before  # limited during the run, then restored
    assert before == [4] * len(before)
    assert (run.results["blas"] == cpus).all()
    assert (run.results["omp_env"] == cpus).all()
    assert (run.results["joblib_cpus"] <= cpus).all()


def blas_threads_or_crash(item):
    if item == 0 and not os.path.exists(os.environ["CRASH_MARKER"]):
        open(os.environ["CRASH_MARKER"], "w").close()
        os._exit(3)
    return blas_threads(item)


def test_a_replacement_worker_keeps_the_blas_limit(tmp_path, monkeypatch):
    from threadpoolctl import threadpool_limits

    monkeypatch.setenv("CRASH_MARKER", str(tmp_path / "crashed"))
    with threadpool_limits(limits=4):
        run = mm.train(blas_threads_or_crash, mm.items(range(4)), workers=1, retries=1,
                       start_method="fork", progress=False)
    assert (run.results["status"] == "ok").all()
    assert run.results["attempts"].max() == 2  # the first worker died in task 0
    assert (run.results["blas"] == 1).all()


DRIVER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    import manymodels as mm

    def slow(item, flag):
        Path(f"{flag}-{item}").touch()
        time.sleep(0.2)
        return item

    if __name__ == "__main__":
        try:
            mm.train(slow, mm.items(range(1000)), shared={"flag": sys.argv[1]},
                     workers=2, progress=False)
        except mm.RunInterrupted as exc:
            done = (exc.run.results["status"] == "ok").sum()
            print("interrupted", done, flush=True)
            sys.exit(130)
""")


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_stops_workers_and_keeps_results(tmp_path, signum):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    flag = tmp_path / "started"
    driver = subprocess.Popen([sys.executable, str(script), str(flag)],
                              stdout=subprocess.PIPE, text=True)
    # Item 5 is in the third batch or later: the driver had recorded item 0
    # (the first batch, alone on its worker) before it handed that batch out.
    started_5 = tmp_path / "started-5"
    deadline = time.monotonic() + 60
    while not started_5.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = psutil.Process(driver.pid).children(recursive=True)
    assert len(workers) == 3  # and the undertaker (backends/_undertaker.py)
    driver.send_signal(signum)
    out, _ = driver.communicate(timeout=30)
    assert driver.returncode == 130
    assert out.startswith("interrupted")
    assert int(out.split()[1]) > 0  # finished results were kept
    gone, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive
    assert not [p for p in Path("/dev/shm").glob(f"manymodels-{driver.pid}-*")]


def test_stale_files_of_dead_drivers_are_swept():
    stale = Path("/dev/shm") / "manymodels-999999999-deadbeef-table.arrow"
    stale.write_bytes(b"x")
    mm.train(exit_on_13, mm.items(range(3)), workers=1, progress=False)
    assert not stale.exists()
    assert not shm_files()


def raise_keyboard_interrupt(item):
    if item == 2:
        raise KeyboardInterrupt("raised by the task itself, not Ctrl-C")
    return {"item": item}


@pytest.mark.parametrize("backend", ["threads", "processes"])
def test_keyboard_interrupt_raised_by_a_task_fails_only_that_task(backend):
    run = mm.train(raise_keyboard_interrupt, mm.items(range(6)), backend=backend, workers=2,
                   progress=False)
    assert_only_failed(run, 2, "KeyboardInterrupt")



def _one(item):
    return 1


def test_an_item_that_cannot_be_sent_to_a_worker_fails_only_its_task():
    """An item the processes backend cannot pickle failed the whole run
    mid-way, with a bare pickling error and no ``.run``."""
    lock = threading.Lock()
    run = mm.train(_one, mm.items([1, lock, 3], key=lambda item: "lock" if item is lock
                                  else item), workers=2, retries=1, progress=False)
    assert_only_failed(run, "lock", "cannot be pickled to send them to a worker",
                       "_thread.lock")


class _LibrarysOwnStop(BaseException):
    """What a library may raise that is not an Exception (a greenlet's exit, say)."""


def raise_base_exception(item):
    if item == 2:
        raise _LibrarysOwnStop("a BaseException of the task's own")
    return {"item": item}


@pytest.mark.parametrize("backend", ["serial", "threads", "processes"])
def test_a_base_exception_of_a_tasks_own_fails_only_that_task(backend):
    """It failed the whole run (serial), read as a worker that could not
    start (threads), or as a crash without its traceback (processes)."""
    run = mm.train(raise_base_exception, mm.items(range(6)), backend=backend, workers=2,
                   progress=False)
    assert_only_failed(run, 2, "_LibrarysOwnStop: a BaseException of the task's own")


def test_keyboard_interrupt_on_the_serial_backend_still_stops_the_run():
    with pytest.raises(mm.RunInterrupted) as stopped:
        mm.train(raise_keyboard_interrupt, mm.items(range(6)), backend="serial",
                 progress=False)
    assert stopped.value.run.results["status"].tolist()[:2] == ["ok", "ok"]


STDIN_DRIVER = """
import sys
import manymodels as mm

def read_stdin(item):
    return sys.stdin.read()

run = mm.train(read_stdin, mm.items([1]), backend="processes", workers=1, progress=False,
               start_method=sys.argv[1])
print(repr(run.models[1]), repr(sys.stdin.read()))
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_worker_reads_nothing_of_the_drivers_standard_input(tmp_path, start_method):
    """A forked worker shared the driver's stdin: a fit that read it took the
    driver's input (or blocked on a terminal)."""
    script = tmp_path / "driver.py"
    script.write_text(STDIN_DRIVER)
    done = subprocess.run([sys.executable, str(script), start_method], input="for the driver\n",
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "'' 'for the driver\\n'"


def _fail_loudly(item):
    raise ValueError("x" * 100_000)


def test_too_many_failures_names_them_in_a_message_of_reasonable_size():
    with pytest.raises(mm.TooManyFailures) as caught:
        mm.train(_fail_loudly, mm.items(range(5)), max_failures=1, backend="serial",
                 progress=False)
    assert len(str(caught.value)) < 5_000 and "ValueError: xxx" in str(caught.value)


THREADS_DRIVER = """
import time
import manymodels as mm

def sleep_on_2_and_3(item):
    if item >= 2:
        time.sleep(600)
    return item

try:
    mm.train(sleep_on_2_and_3, mm.items(range(4)), backend="threads", workers=2,
             progress=False)
except mm.RunInterrupted as exc:
    print("interrupted", len(exc.run.ok), flush=True)
"""


def test_after_ctrl_c_a_fit_still_running_on_a_thread_does_not_keep_python_alive(tmp_path):
    """A thread cannot be stopped; the pool's threads were joined at exit, so
    the interpreter waited for the running fits (here ten minutes)."""
    script = tmp_path / "driver.py"
    script.write_text(THREADS_DRIVER)
    driver = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    time.sleep(3)  # items 0 and 1 done, 2 and 3 asleep
    driver.send_signal(signal.SIGINT)
    out, _ = driver.communicate(timeout=60)
    assert out.strip() == "interrupted 2"


def test_more_cpus_a_task_than_the_machine_has_is_said():
    """cpus_per_task above the usable cores was taken without a word (one
    worker, thread pools sized for a bigger machine). It is warned of."""
    from manymodels.machine import usable_cores

    cores = usable_cores()
    with pytest.warns(RuntimeWarning, match=f"cpus_per_task={cores + 1} is more than the "
                                            f"{cores} cores"):
        run = mm.train(lambda item: item, mm.items(range(2)), backend="threads",
                       cpus_per_task=cores + 1, progress=False)
    assert run.results["status"].eq("ok").all()
