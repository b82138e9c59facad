"""The Spark and Dask backends on real engines (no mocks): a local Spark session
(``local[2]``, a real JVM and Python workers) and a real ``distributed``
LocalCluster of two worker processes. Each engine is started once (Spark's
for the suite, Dask's for the modules next to each other that use it) by the
user's way (an active session, a current client), so the
backends connect to it and must leave it running; the contract tests
(tests/test_backend_contract.py) cover a backend that starts and stops its own.

Every test runs on both engines: the same results as the processes backend,
a worker process killed mid-run costing only the task it was running,
``timeout`` ending a worker process and costing one task, and
``read_on_workers=True``.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from conftest import assert_only_timed_out, count_parts_as_columns, fit_linear

pytestmark = pytest.mark.slow

#: The suite's engines this module uses, kept up from the module before (conftest).
SHARED_ENGINES = ("dask",)

_TIMING = ["duration_s", "worker", "started_s"]


def _start_spark():
    """The suite's one local[2] Spark session, as a user's, started on first
    use and kept for every module that asks for it (a start and a stop each
    module cost 10-20 s); :func:`stop_spark`, at the session's end, stops
    it. ``close`` leaves it up."""
    pytest.importorskip("pyspark")
    import shutil

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime: Spark cannot start (make test installs one)")
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName("manymodels-tests")
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    _SPARK[:] = [spark]
    return spark, lambda: None, lambda: spark.range(3).count() == 3


#: The suite's Spark session, once one has started.
_SPARK: list = []


def stop_spark() -> None:
    """Stop the suite's Spark session and its JVM, where one started."""
    if _SPARK:
        from manymodels.engine.backends.spark import _shutdown_gateway

        _SPARK.pop().stop()
        _shutdown_gateway()


def _start_dask():
    """The suite's one LocalCluster of two worker processes and its client,
    as a user's (the current client), started on first use and kept for
    the modules next to each other that ask for it (a start and a close
    each module cost 5-10 s); :func:`stop_dask` closes it, where the next
    module does not name it in its ``SHARED_ENGINES`` (conftest). A client
    a test makes is the current one until it closes; then this one is
    again. ``close`` leaves it up."""
    distributed = pytest.importorskip("distributed")
    import logging

    if _DASK and _DASK[0].status != "running":
        stop_dask()
    if not _DASK:
        cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                           dashboard_address=":0", silence_logs=logging.ERROR)
        _DASK[:] = [distributed.Client(cluster), cluster]
    client = _DASK[0]
    return client, lambda: None, lambda: client.submit(len, [1, 2, 3]).result(timeout=60) == 3


#: The suite's Dask client and LocalCluster, once started.
_DASK: list = []


def stop_dask() -> None:
    """Close the suite's Dask client and LocalCluster, where they started."""
    if _DASK:
        client, cluster = _DASK
        _DASK.clear()
        client.close()
        try:
            cluster.close()
        except KeyError:  # distributed's own race on close: a worker's removal told
            pass          # twice (dask/distributed#5407); the cluster is closed


@pytest.fixture(scope="module", params=[
    pytest.param("spark", marks=pytest.mark.spark),
    pytest.param("dask", marks=pytest.mark.dask),
])
def engine(request):
    """The engine's name; the user's session or client is up meanwhile."""
    handle, close, alive = (_start_spark if request.param == "spark" else _start_dask)()
    yield request.param
    assert alive(), f"the user's {request.param} was stopped by manymodels"
    close()


def _same_results(run, local) -> None:
    left = run.results.drop(columns=[*_TIMING, "error"])
    right = local.results.drop(columns=[*_TIMING, "error"])
    pd.testing.assert_frame_equal(left, right)
    assert run.results["error"].isna().equals(local.results["error"].isna())


def test_groups_match_the_processes_backend(engine, sales, monkeypatch):
    as_columns = count_parts_as_columns(monkeypatch)
    source = mm.groups(sales, by=["store", "item"])
    run = mm.train(fit_linear, source, backend=engine, workers=2, progress=False)
    assert sum(as_columns) > 0  # parts of successes came as columns (OkOutcomes)
    local = mm.train(fit_linear, source, backend="processes", workers=2, progress=False)
    assert run.summary().statuses == {"ok": 60}
    assert run.backend == engine
    _same_results(run, local)
    for key, model in local.models.items():
        assert run.models[key]["slope"] == pytest.approx(model["slope"], rel=1e-12)


def test_groups_read_on_the_workers_match_the_processes_backend(engine, tmp_path, sales):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "parts").mkdir()
    for i, (_, chunk) in enumerate(sales.groupby(sales.index % 3)):
        pq.write_table(pa.Table.from_pandas(chunk, preserve_index=False),
                       tmp_path / "parts" / f"part-{i}.parquet")
    source = mm.groups(tmp_path / "parts", by="store", read_on_workers=True)
    assert source.table.column_names == ["store", "__file__"]  # keys and file numbers only
    run = mm.train(fit_linear, source, backend=engine, workers=2, progress=False)
    local = mm.train(fit_linear, source, backend="processes", workers=2, progress=False)
    assert run.summary().statuses == {"ok": 12}
    _same_results(run, local)


def fit_with_shared(item, weights, offset):
    return {"value": float(weights.sum() * item + offset)}


def test_shared_objects_and_failures_match_the_processes_backend(engine, tmp_path):
    shared = {"weights": np.arange(10_000, dtype=float), "offset": 1.5}
    source = mm.items(range(60))
    run = mm.train(fit_with_shared, source, shared=shared, backend=engine, workers=2,
                   store=tmp_path / "store", progress=False)
    local = mm.train(fit_with_shared, source, shared=shared, backend="processes", workers=2,
                     progress=False)
    _same_results(run, local)
    assert len(mm.Store(tmp_path / "store").runs()) == 1


def exit_on_13(item):
    if item == 13:
        os._exit(3)
    return item


@pytest.mark.parametrize("retries", [0, 1])
def test_a_crash_inside_a_batch_costs_exactly_its_task(engine, retries):
    run = mm.train(exit_on_13, mm.items(range(120)), backend=engine, workers=2,
                   retries=retries, progress=False)
    results = run.results.set_index("item")
    assert results.loc[13, "status"] == "crashed"
    assert "died" in results.loc[13, "error"]
    assert results.loc[13, "attempts"] == retries + 1
    assert run.summary().statuses == {"ok": 119, "crashed": 1}


def sleep_on_5(item, pid_dir, once):
    if item == 5 and not (once and any(Path(pid_dir).iterdir())):
        Path(pid_dir, f"victim-{os.getpid()}").touch()
        time.sleep(3600)  # until killed: the run cannot end otherwise
    time.sleep(0.01)
    return item


@pytest.mark.parametrize("once", [True, False], ids=["killed-once", "killed-every-time"])
def test_worker_process_killed_from_outside_mid_run(engine, tmp_path, once):
    done = threading.Event()

    def killer():  # SIGKILLs every worker process that runs item 5
        killed: set[str] = set()
        while not done.is_set():
            for victim in tmp_path.iterdir():
                if victim.name not in killed:
                    time.sleep(0.2)
                    killed.add(victim.name)
                    os.kill(int(victim.name.split("-")[1]), signal.SIGKILL)
            time.sleep(0.02)

    thread = threading.Thread(target=killer)
    thread.start()
    try:
        run = mm.train(sleep_on_5, mm.items(range(40)),
                       shared={"pid_dir": str(tmp_path), "once": once},
                       backend=engine, workers=2, progress=False)
    finally:
        done.set()
        thread.join()
    results = run.results.set_index("item")
    assert len(results) == 40
    assert (results.drop(index=5)["status"] == "ok").all()
    if once:  # the batch's unreported tasks run again, marked: a one-off kill costs nothing
        assert results.loc[5, "status"] in {"crashed", "ok"}
    else:  # a task whose worker always dies is blamed, and only it
        assert results.loc[5, "status"] == "crashed"
        assert "died" in results.loc[5, "error"]


def hang_on_2(item):
    if item == 2:
        time.sleep(3600)
    time.sleep(0.01)
    return item


def test_timeout_ends_the_worker_process_and_costs_one_task(engine):
    run = mm.train(hang_on_2, mm.items(range(20)), backend=engine, workers=2, timeout=2,
                   progress=False)
    assert_only_timed_out(run, 2, timeout=2)
    assert run.summary().statuses == {"ok": 19, "timeout": 1}
    # (from when the driver heard it start: a little after it did)
    assert 1 < run.results.set_index("item").loc[2, "duration_s"] < 60


def hold_the_gil_on_3(item):
    if item == 3:  # catastrophic backtracking: C code that never releases the GIL
        import re

        re.match(r"(a+)+$", "a" * 64 + "b")
    return item


def test_timeout_holds_when_the_task_starves_the_watchdog_of_the_gil(engine):
    run = mm.train(hold_the_gil_on_3, mm.items(range(10)), backend=engine, workers=2,
                   timeout=1, progress=False)
    assert_only_timed_out(run, 3, timeout=1)
    assert run.summary().statuses == {"ok": 9, "timeout": 1}


def test_a_backend_instance_given_the_users_engine(engine):
    if engine == "spark":
        from pyspark.sql import SparkSession

        backend = mm.SparkBackend(session=SparkSession.getActiveSession())
    else:
        import distributed

        backend = mm.DaskBackend(client=distributed.get_client())
    run = mm.train(fail_on_7, mm.items(range(30)), backend=backend, progress=False)
    assert run.summary().statuses == {"ok": 29, "failed": 1}
    assert run.results["worker"].nunique() <= 2  # the engine's two cores, counted
    assert "ValueError: bad item 7" in run.failed.set_index("item").loc[7, "error"]


def fail_on_7(item):
    if item == 7:
        raise ValueError(f"bad item {item}")
    return item


def fail_odd(item):
    if item % 2:
        raise ValueError(f"odd item {item}")
    return item


def long_item(item, flag_dir):
    Path(flag_dir, f"started-{item}").touch()
    time.sleep(60)
    Path(flag_dir, f"ended-{item}").touch()
    return item


def test_ctrl_c_ends_the_fits_that_are_running(engine, tmp_path):
    """Dask cannot stop a running task: after Ctrl-C its fits ran on to their
    end, holding the user's workers (the next run waited for them). (Spark's
    own cancel ends its Python workers: Dask's case is the one at stake.)"""
    if engine != "dask":
        pytest.skip("Dask's running fits")
    def interrupt():  # Ctrl-C, once both workers are in a long fit
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("started-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    thread.start()
    try:
        with pytest.raises(mm.RunInterrupted):
            mm.train(long_item, mm.items(range(4)), shared={"flag_dir": str(tmp_path)},
                     backend=engine, workers=2, progress=False)
    finally:
        thread.join()
    run = mm.train(fail_on_7, mm.items(range(10)), backend=engine, workers=2, progress=False)
    assert run.summary().statuses == {"ok": 9, "failed": 1}  # the engine serves again
    assert list(tmp_path.glob("ended-*")) == []  # the long fits were ended, not waited for


def test_the_error_budget_stops_the_run_and_keeps_what_finished(engine):
    with pytest.raises(mm.TooManyFailures) as stopped:
        mm.train(fail_odd, mm.items(range(400)), backend=engine, workers=2, max_failures=3,
                 progress=False)
    statuses = stopped.value.run.results["status"]
    assert (statuses == "failed").sum() >= 4 and (statuses == "ok").sum() >= 1
    assert (statuses == "cancelled").any()  # the rest never ran


def slow_item(item, flag_dir):
    Path(flag_dir, f"started-{item}").touch()
    time.sleep(0.1)
    return item


def test_ctrl_c_stops_the_run_keeps_results_and_leaves_the_engine_up(engine, tmp_path):
    def interrupt():  # Ctrl-C, once a few tasks have run
        deadline = time.monotonic() + 120
        while not Path(tmp_path, "started-6").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=interrupt)
    thread.start()
    try:
        with pytest.raises(mm.RunInterrupted) as stopped:
            mm.train(slow_item, mm.items(range(1000)), shared={"flag_dir": str(tmp_path)},
                     backend=engine, workers=2, progress=False)
    finally:
        thread.join()
    done = (stopped.value.run.results["status"] == "ok").sum()
    assert 0 < done < 1000
    run = mm.train(fail_on_7, mm.items(range(10)), backend=engine, workers=2, progress=False)
    assert run.summary().statuses == {"ok": 9, "failed": 1}  # the engine still serves


@pytest.mark.dask
@pytest.mark.timeout(180)
def test_a_run_brings_back_the_workers_a_local_cluster_closed():
    """A LocalCluster closes the nanny of a worker it finds missing
    ``lost-worker-timeout`` after a worker process ended; a worker process
    that manymodels ended (a timeout, a stopped run) and that was restarting
    just then left the cluster with no worker for good, and the next run
    waited on it for minutes before failing with "No valid workers found".
    Here the timeout is 0, so that the cluster closes the nanny every time."""
    distributed = pytest.importorskip("distributed")
    import logging

    import dask

    with dask.config.set({"distributed.deploy.lost-worker-timeout": "0s"}):
        cluster = distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                           dashboard_address=":0", silence_logs=logging.CRITICAL)
        client = distributed.Client(cluster)
        try:
            pid = next(iter(client.run(os.getpid).values()))
            os.kill(pid, signal.SIGKILL)  # as a run's timeout ends it
            deadline = time.monotonic() + 30
            while cluster.workers and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not cluster.workers  # the cluster closed its nanny: no worker will come
            run = mm.train(fail_on_7, mm.items(range(10)),
                           backend=mm.DaskBackend(client=client), progress=False)
            assert run.summary().statuses == {"ok": 9, "failed": 1}
            assert len(client.scheduler_info()["workers"]) == 1  # the cluster as it was made
        finally:
            client.close()
            cluster.close()


@pytest.mark.dask
@pytest.mark.timeout(120)
def test_a_cluster_with_no_worker_is_refused_saying_so(monkeypatch):
    """A cluster none of whose workers is up: the run waited minutes on
    scatter's retries, then failed with Dask's "No valid workers found"."""
    distributed = pytest.importorskip("distributed")
    import logging

    from manymodels.engine.backends import dask as dask_backend

    monkeypatch.setattr(dask_backend, "_NO_WORKER_S", 3)  # (60 s in use)
    cluster = distributed.LocalCluster(n_workers=0, processes=True, dashboard_address=":0",
                                       silence_logs=logging.CRITICAL)
    client = distributed.Client(cluster)
    try:
        with pytest.raises(RuntimeError, match=r"the Dask cluster at tcp://\S+ has had no "
                                               r"worker for 3 s"):
            mm.train(fail_on_7, mm.items(range(10)), backend=mm.DaskBackend(client=client),
                     progress=False)
    finally:
        client.close()
        cluster.close()


@pytest.mark.spark
def test_a_ctrl_c_where_pyspark_set_its_sigint_handler_still_keeps_a_part_whole(tmp_path):
    """A SparkContext sets a SIGINT handler of its own (cancel its jobs, then
    raise) and leaves it for the process's life: the run left it as a
    user's, so none of its Ctrl-C protections held (a part recorded half
    when the interrupt came). It takes PySpark's over, calling it first."""
    import signal

    from test_supervision_hostile import (
        test_a_ctrl_c_while_the_driver_records_a_part_keeps_it_whole as records_a_part,
    )

    _start_spark()
    handler = signal.getsignal(signal.SIGINT)
    assert handler.__module__.startswith("pyspark"), handler
    records_a_part(tmp_path)
    assert signal.getsignal(signal.SIGINT) is handler  # (given back as it was)
