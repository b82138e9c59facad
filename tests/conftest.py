from __future__ import annotations

import importlib
import inspect
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pytest

from manymodels.engine.backends._process_start import FORK_UNSAFE_MODULES

BACKENDS = ["serial", "threads", "processes"]

# The command line's errors (rich boxes) wrap at the terminal's width, 80
# columns where none is known: a message naming a temporary path was split
# across two lines, where the tests look for it, or not, by the path's
# length. Tests of the layout at a width set their own.
os.environ["COLUMNS"] = "400"

# A store on an object store keeps its index's copy in this machine's cache
# folder, and so do the engines' executors that open one (they inherit this
# environment): the suite's copies go to a folder of its own, not the home
# folder of the machine that runs it. Tests of the cache's place set their own.
_CACHE = tempfile.TemporaryDirectory(prefix="manymodels-test-cache-")
os.environ["MANYMODELS_CACHE_DIR"] = _CACHE.name

# The tests of Ctrl-C send SIGINT to a run in this process or to a driver
# they start, and expect a KeyboardInterrupt. A suite started in the
# background by a non-interactive shell (``pytest &``, as a script or a
# tool runs it) has SIGINT ignored, and so has every process it starts: the
# SIGINT did nothing, and the interrupted train ran to its end (exit 0, not
# 130). Handled here, it is the default again in the processes started.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# -- the suite forks its workers ----------------------------------------------
#
# ``start_method="auto"`` (what users get) forks a run's workers unless the
# driver holds something a fork does not survive: once polars, torch (or
# mlflow, which imports polars) is imported, every later run spawns, which
# costs about a second a run and leaves the fork path, the default on Linux,
# untested by most of the suite. So the test modules import those libraries
# only where a test uses them (:data:`lazy_polars`), the tests that do run
# after all the others (:func:`pytest_collection_modifyitems`), and the
# summary names the first test that imported one (:func:`pytest_terminal_summary`)
# so that one which escaped the ordering is seen.

_NAMES_FORK_UNSAFE = re.compile(r"polars|\bpl\.|torch|mlflow|track=|tensorflow|\bjax|cupy")
_first_fork_unsafe_import: list[str] = []


class LazyModule:
    """A module imported on its first public attribute read, not at
    collection (which looks for ``__test__`` and the like on everything a
    test module holds)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attribute: str):
        if attribute.startswith("_") or attribute.startswith("pytest"):
            raise AttributeError(attribute)
        return getattr(importlib.import_module(self._name), attribute)


lazy_polars = LazyModule("polars")


def _imports_fork_unsafe(item) -> bool:
    """Whether the test names a library a fork does not survive: in its
    name or parameters (``[polars]``), its fixtures, or its own source."""
    text = " ".join([item.name, *getattr(item, "fixturenames", ())])
    function = getattr(item, "function", None)
    if function is not None:
        try:
            text += inspect.getsource(function)
        except (OSError, TypeError):
            pass
    return bool(_NAMES_FORK_UNSAFE.search(text))


def pytest_collection_modifyitems(session, config, items):
    """The tests that import a fork-unsafe library run last, each group in
    its collected order (modules stay together)."""
    loaded = [name for name in FORK_UNSAFE_MODULES if name in sys.modules]
    if loaded:
        _first_fork_unsafe_import.append(f"the collection imported {loaded[0]}")
    late = [item for item in items if _imports_fork_unsafe(item)]
    if late:
        late_ids = {id(item) for item in late}
        items[:] = [item for item in items if id(item) not in late_ids] + late


@pytest.fixture(autouse=True)
def _note_fork_unsafe_imports(request):
    yield
    if not _first_fork_unsafe_import:
        loaded = [name for name in FORK_UNSAFE_MODULES if name in sys.modules]
        if loaded:
            _first_fork_unsafe_import.append(f"{request.node.nodeid} imported {loaded[0]}")


def pytest_terminal_summary(terminalreporter):
    if _first_fork_unsafe_import:
        terminalreporter.write_line(
            "workers spawn, not fork, from the first test that imported a fork-unsafe "
            f"library on: {_first_fork_unsafe_import[0]}")


def shm_files() -> set[str]:
    """Run files of this test process under /dev/shm (or the temporary
    directory, where the data plane falls back when /dev/shm is small)."""
    roots = [Path("/dev/shm"), Path(tempfile.gettempdir())]
    prefix = f"manymodels-{os.getpid()}-"
    return {p.name for root in roots if root.is_dir()
            for p in root.iterdir() if p.name.startswith(prefix)}


def wait_for_workers(rendezvous: str, count: int, limit_s: float = 60.0,
                     name: str | None = None) -> None:
    """Mark this worker process (or ``name``: a Ray node, say) in the folder
    ``rendezvous`` and wait until ``count`` have been marked: tasks that must
    run on ``count`` workers at once do, however slowly the last one starts,
    instead of counting on timing. After ``limit_s`` the first waiter gives up
    for all (a "gave-up" mark), so that a run that never gets there ends, and
    fails its test."""
    Path(rendezvous, name or str(os.getpid())).touch()
    deadline = time.monotonic() + limit_s
    while len(os.listdir(rendezvous)) < count:
        if time.monotonic() > deadline:
            Path(rendezvous, "gave-up").touch()
        time.sleep(0.02)


@pytest.fixture
def no_leftovers():
    """Fails the test if it leaves a child process or a shared-memory file behind."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    yield
    leftover = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    gone, alive = psutil.wait_procs(leftover, timeout=15)
    assert not alive, f"worker processes left behind: {alive}"
    assert not shm_files(), f"shared-memory files left behind: {shm_files()}"


@pytest.fixture
def sales() -> pd.DataFrame:
    """A small seeded table: 12 stores x 5 items, 30 rows each, y = a*x + b."""
    rng = np.random.default_rng(42)
    stores = [f"s{i:02d}" for i in range(12)]
    rows = []
    for s, store in enumerate(stores):
        for item in range(5):
            x = rng.normal(size=30)
            y = (s + 1) * x + item + rng.normal(scale=0.1, size=30)
            rows.append(pd.DataFrame({"store": store, "item": item, "x": x, "y": y}))
    frame = pd.concat(rows, ignore_index=True)
    return frame.sample(frac=1.0, random_state=0).reset_index(drop=True)  # unsorted


def fit_linear(df, alpha=0.0, **_ignored):
    """Least squares slope and intercept, with metrics; module level so it pickles."""
    x = np.asarray(df["x"], dtype=float)
    y = np.asarray(df["y"], dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    slope = slope / (1.0 + alpha)
    return {"slope": slope, "intercept": intercept}, {"slope": float(slope), "n": len(x)}


def count_parts_as_columns(monkeypatch) -> list[int]:
    """The sizes of the parts the scheduler records as columns
    (:class:`manymodels.engine.messages.OkOutcomes`) from now on in this test."""
    from manymodels.engine.scheduling import Scheduler

    sizes: list[int] = []
    record_ok = Scheduler._record_ok

    def counting(self, outcomes, worker):
        sizes.append(len(outcomes))
        return record_ok(self, outcomes, worker)

    monkeypatch.setattr(Scheduler, "_record_ok", counting)
    return sizes


def assert_only_failed(run, item, *said: str) -> None:
    """``item``'s task failed, its error saying each of ``said``; the others ok."""
    results = run.results.set_index("item")
    assert results.loc[item, "status"] == "failed"
    for text in said:
        assert text in results.loc[item, "error"]
    assert (results.drop(index=item)["status"] == "ok").all()


def assert_only_timed_out(run, item, timeout) -> None:
    """``item`` ran past ``timeout`` seconds and was recorded so; every other item is ok."""
    results = run.results.set_index("item")
    assert results.loc[item, "status"] == "timeout"
    assert f"timeout={timeout}s" in results.loc[item, "error"]
    assert (results.drop(index=item)["status"] == "ok").all()


@pytest.fixture(scope="module", params=[
    pytest.param("spark", marks=pytest.mark.spark),
    pytest.param("dask", marks=pytest.mark.dask),
])
def engine(request):
    """``(name, the user's session or client)``, up for the module's tests
    (tests/test_engines.py has its own, of the name alone)."""
    from test_engines import _start_dask, _start_spark

    handle, close, alive = (_start_spark if request.param == "spark" else _start_dask)()
    yield request.param, handle
    assert alive(), f"the user's {request.param} was stopped by manymodels"
    close()


#: The suite's local Ray, once one has started: its node id.
_RAY: list[str] = []


def shared_ray():
    """The suite's one local Ray (two CPUs), as a user's, started on first
    use and kept while the modules that run next name it in their
    ``SHARED_ENGINES`` (a start and a shutdown cost 10-20 s on a loaded
    2-core machine); returns ``ray``. Where a test shut it down, or started
    another, the next call starts a fresh one."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        if _RAY and ray.get_runtime_context().get_node_id() == _RAY[0]:
            return ray
        ray.shutdown()
    _RAY.clear()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    _RAY.append(ray.get_runtime_context().get_node_id())
    return ray


def stop_shared_ray() -> None:
    """Shut the suite's local Ray down, where it is the one connected."""
    ray = sys.modules.get("ray")
    if _RAY and ray is not None and ray.is_initialized() \
            and ray.get_runtime_context().get_node_id() == _RAY[0]:
        ray.shutdown()
    _RAY.clear()


def collected_until(condition, limit_s: float = 15.0) -> bool:
    """Whether ``condition()`` holds once garbage is collected, within
    ``limit_s``: a worker's thread may let go of a run's objects a moment
    after ``train`` returned (on a loaded machine, later)."""
    import gc
    import time

    deadline = time.monotonic() + limit_s
    while True:
        gc.collect()
        if condition():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)


def s3_server():
    """An S3 API server on loopback (moto's server mode) with an empty bucket
    named "bucket": yields the query options that reach it (endpoint, scheme,
    region: a URI with the keys ``testing:testing@`` and them needs nothing
    in a worker's environment) and a pyarrow filesystem on it, to look at
    the objects. A generator for module fixtures to yield from."""
    moto_server = pytest.importorskip("moto.server")
    from pyarrow import fs

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        filesystem = fs.S3FileSystem(access_key="testing", secret_key="testing", scheme="http",
                                     endpoint_override=f"{host}:{port}", region="us-east-1",
                                     allow_bucket_creation=True)
        filesystem.create_dir("bucket")
        yield f"endpoint_override={host}:{port}&scheme=http&region=us-east-1", filesystem
    finally:
        server.stop()


def run_cli(*args: object, cwd: object = None) -> subprocess.CompletedProcess:
    """The command line run in this process (the same typer app the
    ``manymodels`` command runs, without an interpreter's start-up a call):
    its exit status, standard output and standard error, as a process's.
    Tests of the installed command, of piped output and of terminals start
    real processes."""
    import os
    import traceback

    from typer.testing import CliRunner

    from manymodels.cli import app

    before = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = CliRunner().invoke(app, [str(arg) for arg in args])
    finally:
        os.chdir(before)
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "".join(traceback.format_exception(result.exception))  # as Python prints it
    return subprocess.CompletedProcess(args, result.exit_code, result.stdout, stderr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """At a module's end, once its fixtures are torn down, the suite's local
    Ray (:func:`shared_ray`) and Dask LocalCluster (test_engines._start_dask)
    are stopped unless the next module names them in its ``SHARED_ENGINES``:
    adjacent modules share one start, and no other module runs beside an
    idle engine (a Ray initialised in the driver is a reason to spawn, not
    fork, workers)."""
    yield
    if nextitem is not None and nextitem.module is item.module:
        return
    wanted = getattr(nextitem.module, "SHARED_ENGINES", ()) if nextitem is not None else ()
    if "ray" not in wanted:
        stop_shared_ray()
    engines = sys.modules.get("test_engines")
    if "dask" not in wanted and engines is not None:
        engines.stop_dask()


def pytest_sessionfinish(session, exitstatus):
    """The suite's Spark session, shared by the modules that use one (see
    test_engines._start_spark), its Dask LocalCluster (_start_dask) and its
    local Ray (:func:`shared_ray`) are stopped once, at the end."""
    stop_shared_ray()
    engines = sys.modules.get("test_engines")
    if engines is not None:
        engines.stop_spark()
        engines.stop_dask()
