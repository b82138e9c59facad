"""Hostile tasks on the processes backend, done for real: memory held where RSS
minus shared pages does not see it (a shared anonymous mapping, a child
process), processes a task starts and leaves running, standard streams a task
closes. Each is one task's problem: the others finish, nothing outlives the run."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import manymodels as mm

pytestmark = pytest.mark.usefixtures("no_leftovers")

RENDEZVOUS = "MANYMODELS_TEST_RENDEZVOUS"
MB = 1 << 20
#: A process that marks itself (a file named after its pid in folder argv[1]),
#: then holds argv[2] MiB that it really wrote, and sleeps until something kills it.
SLEEPER = ("import os, sys, time\n"
           "open(os.path.join(sys.argv[1], str(os.getpid())), 'w').close()\n"
           "held = b'\\1' * (int(sys.argv[2]) << 20)\n"
           "time.sleep(3600)\n")
#: Starts a SLEEPER and exits at once (``sh -c "sleeper &"``): the sleeper is
#: orphaned, a grandchild of the worker that no longer has a parent there.
ORPHANER = ("import subprocess, sys\n"
            "subprocess.Popen([sys.executable, '-c', sys.argv[3], sys.argv[1], sys.argv[2]],\n"
            "                 stdin=subprocess.DEVNULL)\n")


@pytest.fixture
def rendezvous(tmp_path, monkeypatch):
    """A folder where the processes that tasks start mark themselves; whatever
    is still alive there at the end is killed, so that a failing test leaves
    nothing behind either."""
    monkeypatch.setenv(RENDEZVOUS, str(tmp_path))
    yield tmp_path
    for pid in marked_pids(tmp_path):
        try:
            psutil.Process(pid).kill()
        except psutil.Error:
            pass


def marked_pids(folder: Path) -> list[int]:
    return [int(p.name) for p in folder.rglob("*") if p.is_file() and p.name.isdigit()]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def survivors(pids: list[int], limit_s: float = 20.0) -> list[int]:
    """Those of ``pids`` still alive after ``limit_s`` (a SIGKILLed process
    with much memory takes a moment to go)."""
    deadline = time.monotonic() + limit_s
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def start_process(kind: str, megabytes: int = 0) -> subprocess.Popen:
    """Start a SLEEPER the way ``kind`` says and wait until it has marked itself."""
    folder = Path(os.environ[RENDEZVOUS], kind)
    folder.mkdir()
    args = [str(folder), str(megabytes)]
    if kind == "orphan":
        process = subprocess.Popen([sys.executable, "-c", ORPHANER, *args, SLEEPER])
        process.wait()
    else:
        process = subprocess.Popen([sys.executable, "-c", SLEEPER, *args],
                                   start_new_session=(kind == "session"))
    deadline = time.monotonic() + 120
    while not any(folder.iterdir()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the {kind} process did not start")
        time.sleep(0.01)
    return process


def assert_only(run, item: int, status: str) -> None:
    results = run.results.set_index("item")
    assert results.loc[item, "status"] == status, results.loc[item, "error"]
    others = results.drop(index=item)
    assert (others["status"] == "ok").all(), others[others["status"] != "ok"]


# -- memory_limit counts what RSS minus shared pages missed ---------------------------


def fill_shared_anonymous_on_1(item):
    if item == 1:
        block = mmap.mmap(-1, 600 * MB)  # MAP_SHARED | MAP_ANONYMOUS: "shared" in RSS
        chunk = b"\1" * MB
        for _ in range(600):  # written a piece at a time: no private copy of it
            block.write(chunk)
        time.sleep(3600)  # only the memory limit (or the timeout backstop) ends this
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_memory_limit_counts_a_shared_anonymous_mapping(rendezvous, start_method):
    run = mm.train(fill_shared_anonymous_on_1, mm.items(range(6)), memory_limit="300MB",
                   timeout=90, workers=2, progress=False, start_method=start_method)
    assert_only(run, 1, "memory")
    assert "memory_limit=" in run.results.set_index("item").loc[1, "error"]


def idle_then_fill_on_1(item):
    if item == 1:
        time.sleep(2)  # meanwhile the driver measures both workers, idle
        Path(os.environ[RENDEZVOUS], "filling").touch()
    return fill_shared_anonymous_on_1(item)


def test_a_forked_worker_is_not_charged_for_the_drivers_pages(rendezvous):
    # 1.2 GiB written in the driver: PSS gives each of two forked workers a
    # third of it (400 MiB), over the limit before any task has run
    ballast = np.ones(1200 * MB // 8)
    run = mm.train(idle_then_fill_on_1, mm.items(range(6)), memory_limit="300MB",
                   timeout=90, workers=2, progress=False, start_method="fork")
    assert_only(run, 1, "memory")
    assert (rendezvous / "filling").exists()  # killed for what it wrote, not while it slept
    error = run.results.set_index("item").loc[1, "error"]
    held = float(error.split("reached ")[1].split()[0])
    assert 286 < held < 700  # what the task wrote, not the driver's share besides
    assert ballast[-1] == 1.0


def hold_400_mib():
    return np.ones(400 * MB // 8)  # written: resident, the worker's own


def sleep_a_while(item, resource):
    time.sleep(5)  # killed long before it ends: it holds what setup= allocated
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_memory_that_setup_holds_counts_against_the_limit(rendezvous, start_method):
    # killed in a task (recorded "memory"), or before any (then the run gives
    # up, as it does for workers that cannot start): either way, counted
    try:
        run = mm.train(sleep_a_while, mm.items(range(4)), setup=hold_400_mib,
                       memory_limit="300MB", timeout=90, workers=2, progress=False,
                       start_method=start_method)
    except mm.WorkerStartupError as exc:
        assert "over memory_limit=" in str(exc)
    else:
        assert (run.results["status"] == "memory").all(), run.results["status"].tolist()


def child_holds_memory_on_1(item):
    if item == 1:
        start_process("child", megabytes=600).wait()  # only a kill ends it
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_memory_limit_counts_the_processes_a_task_starts(rendezvous, start_method):
    run = mm.train(child_holds_memory_on_1, mm.items(range(6)), memory_limit="300MB",
                   timeout=90, workers=2, progress=False, start_method=start_method)
    assert_only(run, 1, "memory")
    pids = marked_pids(rendezvous)
    assert len(pids) == 1 and not survivors(pids)


def sum_shared(item, X):
    return float(X.sum())  # touches every page of the mapped data plane


def test_memory_limit_does_not_count_the_mapped_data_plane(rendezvous):
    X = np.ones(400 * MB // 8)  # 400 MiB, mapped read-only by the one worker
    run = mm.train(sum_shared, mm.items(range(4)), shared={"X": X}, memory_limit="300MB",
                   workers=1, progress=False)
    assert (run.results["status"] == "ok").all(), run.results["error"].tolist()


# -- processes that a task starts end with its worker ---------------------------------

KINDS = {1: "child", 2: "session", 3: "orphan"}


def start_processes_and_return(item):
    if item in KINDS:
        start_process(KINDS[item])
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_processes_a_task_starts_end_with_the_run(rendezvous, start_method):
    run = mm.train(start_processes_and_return, mm.items(range(8)), workers=2,
                   progress=False, start_method=start_method)
    assert (run.results["status"] == "ok").all()
    pids = marked_pids(rendezvous)
    assert len(pids) == 3
    assert not survivors(pids), "processes that tasks started outlived the run"


def start_processes_and_hang_on_1(item):
    if item == 1:
        for kind in KINDS.values():
            start_process(kind)
        time.sleep(3600)  # only the timeout ends this
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_processes_a_task_starts_end_with_its_timed_out_worker(rendezvous, start_method):
    # the timeout leaves time for four interpreters to start on a loaded machine
    run = mm.train(start_processes_and_hang_on_1, mm.items(range(6)), timeout=5,
                   workers=2, progress=False, start_method=start_method)
    assert_only(run, 1, "timeout")
    pids = marked_pids(rendezvous)
    assert len(pids) == 3
    assert not survivors(pids), "processes of a killed worker outlived it"


def fork_a_sleeper_on_0_then_die_on_1(item):
    if item == 0:  # forked: the child holds the worker's ends of its pipes
        folder = Path(os.environ[RENDEZVOUS], "forked")
        folder.mkdir()
        if os.fork() == 0:
            (folder / str(os.getpid())).write_text("")
            time.sleep(120)
            os._exit(0)
        while not any(folder.iterdir()):
            time.sleep(0.01)
    if item == 1:
        os._exit(7)
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_a_worker_that_dies_while_a_process_it_forked_holds_its_pipe(rendezvous,
                                                                      start_method):
    """A worker whose task forked a process that keeps running, and which
    then dies, is replaced once its process is gone, though its pipe stays
    open (the driver waited until the forked process ended, here 120 s),
    and the forked process, left in the dead worker's session, is ended."""
    started = time.monotonic()
    run = mm.train(fork_a_sleeper_on_0_then_die_on_1, mm.items(range(4)), workers=1,
                   progress=False, start_method=start_method)
    assert time.monotonic() - started < 60, "the driver waited for the forked process"
    assert_only(run, 1, "crashed")
    pids = marked_pids(rendezvous)
    assert len(pids) == 1
    assert not survivors(pids), "the process a task forked outlived its dead worker"


#: A driver whose task 0 starts a child and an orphan (each marks itself in
#: the folder $MANYMODELS_TEST_MARKS) and hangs; the other tasks finish.
HANGING_DRIVER = f"""
import os, subprocess, sys, time
import manymodels as mm
SLEEPER = {SLEEPER!r}
ORPHANER = {ORPHANER!r}

def start_and_hang_on_0(item):
    if item == 0:
        marks = os.environ["MANYMODELS_TEST_MARKS"]
        subprocess.Popen([sys.executable, "-c", SLEEPER, marks, "0"])
        subprocess.Popen([sys.executable, "-c", ORPHANER, marks, "0", SLEEPER]).wait()
        time.sleep(3600)
    return item

mm.train(start_and_hang_on_0, mm.items(range(4)), workers=2, progress=False,
         start_method=sys.argv[1])
"""


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_processes_a_task_starts_end_with_a_killed_driver(rendezvous, start_method):
    """SIGKILL the driver while a task's processes run: its workers die with
    it, and so do the processes they started (a child, and an orphan whose
    parent has exited), which no driver is left to end."""
    script = rendezvous / "driver.py"
    script.write_text(HANGING_DRIVER)
    marks = rendezvous / "marks"
    marks.mkdir()
    driver = subprocess.Popen([sys.executable, str(script), start_method],
                              env={**os.environ, "MANYMODELS_TEST_MARKS": str(marks)})
    try:
        deadline = time.monotonic() + 120
        while len(marked_pids(marks)) < 2:
            assert time.monotonic() < deadline and driver.poll() is None, "no task started"
            time.sleep(0.05)
        workers_and_undertaker = [p.pid for p in psutil.Process(driver.pid).children()]
        assert len(workers_and_undertaker) == 3
    finally:
        driver.kill()
        driver.wait(timeout=10)
    assert not survivors(marked_pids(marks)), "a task's processes outlived the killed driver"
    assert not survivors(workers_and_undertaker), "a worker outlived the killed driver"


# -- the times of a task whose worker was killed --------------------------------------


def crash_on_1_hang_on_2(item):
    if item == 1:
        time.sleep(0.3)
        os._exit(3)
    if item == 2:
        time.sleep(3600)  # only the timeout ends this
    return item


def test_a_crashed_or_timed_out_task_has_its_times(rendezvous):
    """They had no duration_s and no started_s, where a task that raised has
    both: each now runs from its start until the driver found its worker
    dead or past the timeout."""
    before = time.time()
    run = mm.train(crash_on_1_hang_on_2, mm.items(range(4)), timeout=1.5, workers=2,
                   progress=False, start_method="fork")
    results = run.results.set_index("item")
    assert results["status"].tolist() == ["ok", "crashed", "timeout", "ok"]
    assert 0.3 <= results.loc[1, "duration_s"] < 1.3
    assert 1.5 <= results.loc[2, "duration_s"] < 4.0
    assert results["started_s"].notna().all()
    started = run.started_at + results["started_s"]
    assert (started >= before - 1).all() and (started <= time.time()).all()


# -- a task that closes the standard streams ------------------------------------------


def print_then_close_streams(item):
    print(f"stdout-{item}", flush=True)
    print(f"stderr-{item}", file=sys.stderr, flush=True)
    os.write(1, f"fd1-{item}\n".encode())
    os.write(2, f"fd2-{item}\n".encode())
    sys.stdout.close()
    sys.stderr.close()
    os.close(1)
    os.close(2)
    return item


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_closed_standard_streams_do_not_break_later_tasks(capfd, start_method):
    items = range(6)
    run = mm.train(print_then_close_streams, mm.items(items), workers=1, progress=False,
                   start_method=start_method)
    assert (run.results["status"] == "ok").all(), run.results["error"].tolist()
    out, err = capfd.readouterr()
    for item in items:
        assert f"stdout-{item}" in out and f"fd1-{item}" in out
        assert f"stderr-{item}" in err and f"fd2-{item}" in err


def print_then_take_the_streams(item, spill):
    print(f"stdout-{item}", flush=True)
    if item % 3 == 0:
        sys.stdout = None  # Python's stream gone, the descriptor left
    elif item % 3 == 1:
        sys.stdout.detach()  # its buffer taken away: reading .closed raises
    else:
        os.close(1)  # the descriptor taken by a file Python opens (not inheritable)
        handle = open(os.path.join(spill, f"taken-{item}"), "w")  # noqa: SIM115
        assert handle.fileno() == 1
    return item


def test_a_task_that_took_the_streams_leaves_them_to_the_next(capfd, tmp_path):
    run = mm.train(print_then_take_the_streams, mm.items(range(9)), workers=1,
                   progress=False, start_method="fork", shared={"spill": str(tmp_path)})
    assert (run.results["status"] == "ok").all(), run.results["error"].tolist()
    out, _ = capfd.readouterr()
    assert all(f"stdout-{item}" in out for item in range(9))
    assert all("stdout" not in path.read_text() for path in tmp_path.glob("taken-*"))


#: A driver that ran LightGBM (GNU OpenMP's pool started in its main thread),
#: then trains LightGBM models in forked workers.
OPENMP_THEN_FORK = """
import sys
import numpy as np, pandas as pd, lightgbm as lgb, manymodels as mm
rng = np.random.default_rng(0)
X = rng.normal(size=(200, 2)); y = X[:, 0] + rng.normal(size=200)
lgb.LGBMRegressor(n_estimators=5, verbose=-1).fit(X, y)
frame = pd.DataFrame({"g": np.repeat(list("abcd"), 50), "x": X[:, 0], "x2": X[:, 1], "y": y})

def fit(df):
    return lgb.LGBMRegressor(n_estimators=5, verbose=-1).fit(df[["x", "x2"]], df["y"])

run = mm.train(fit, mm.groups(frame, by="g"), workers=2, start_method=sys.argv[1],
               timeout=30, progress=False)
print(run.results["status"].tolist())
"""


@pytest.mark.parametrize("start_method", ["auto", "fork"])
def test_workers_forked_after_the_driver_ran_openmp_do_not_hang(start_method):
    """GNU OpenMP keeps a thread's pool after its first parallel region and
    has no fork handler: a worker forked from the driver after a LightGBM fit
    waited for the pool's threads for ever in its first fit. The driver ends
    its pool before each fork."""
    pytest.importorskip("lightgbm")
    done = subprocess.run([sys.executable, "-c", OPENMP_THEN_FORK, start_method],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == str(["ok"] * 4)


def _niceness(item):
    try:
        # Linux: "/autogroup-N nice K"; empty where the process sits in a CPU
        # cgroup of its own (a container), whose scheduler ignores autogroups
        with open("/proc/self/autogroup") as group:
            fields = group.read().split()
        autogroup = int(fields[-1]) if fields else None
    except OSError:
        autogroup = None
    return os.nice(0), autogroup


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no process niceness here")
@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_workers_run_nicer_than_the_driver_when_asked(start_method, monkeypatch):
    """By default a worker runs at the driver's priority, as any pool's does
    (a nicer one yields to every other process on the machine too); asked
    to, every worker is that much nicer than the driver (capped at 19),
    whatever the driver's own niceness, so that the driver's loop and its
    store writer never wait for a core the workers hold."""
    from manymodels.machine import WORKER_NICENESS

    assert WORKER_NICENESS == 0
    driver, driver_group = _niceness(None)
    run = mm.train(_niceness, mm.items(range(4)), workers=2, start_method=start_method,
                   progress=False)
    assert {nice for nice, _ in run.models.values()} == {driver}
    monkeypatch.setenv("MANYMODELS_WORKER_NICENESS", "5")
    run = mm.train(_niceness, mm.items(range(6)), workers=2, start_method=start_method,
                   progress=False)
    niceness = {nice for nice, _ in run.models.values()}
    assert niceness == {min(19, driver + 5)}
    # where the scheduler weighs each session's processes as one group
    # (autogroup), a worker's group is as much nicer: the driver's is untouched
    autogroups = {group for _, group in run.models.values()}
    if driver_group is not None:
        assert autogroups == {5} and _niceness(None)[1] == driver_group


@pytest.mark.skipif(not hasattr(os, "nice"), reason="no process niceness here")
def test_the_workers_niceness_is_set_by_its_environment_variable(monkeypatch, tmp_path):
    """MANYMODELS_WORKER_NICENESS=0 keeps the workers at the driver's
    priority; a value that is not a whole number from 0 to 19 is refused by
    name before any work (no store is made)."""
    driver, driver_group = _niceness(None)
    monkeypatch.setenv("MANYMODELS_WORKER_NICENESS", "0")
    run = mm.train(_niceness, mm.items(range(4)), workers=2, progress=False)
    assert {nice for nice, _ in run.models.values()} == {driver}
    if driver_group is not None:  # a new session's group, left at its default
        assert {group for _, group in run.models.values()} == {0}
    monkeypatch.setenv("MANYMODELS_WORKER_NICENESS", "2")
    run = mm.train(_niceness, mm.items(range(4)), workers=2, progress=False,
                   start_method="spawn")
    assert {nice for nice, _ in run.models.values()} == {min(19, driver + 2)}
    for wrong in ("-1", "20", "low"):
        monkeypatch.setenv("MANYMODELS_WORKER_NICENESS", wrong)
        with pytest.raises(ValueError, match=f"MANYMODELS_WORKER_NICENESS='{wrong}'"):
            mm.train(_niceness, mm.items(range(4)), workers=2, progress=False,
                     store=tmp_path / "s")
        assert not (tmp_path / "s").exists()
