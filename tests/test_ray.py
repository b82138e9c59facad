"""The Ray backend on a real local Ray instance (no mocks): the same results as
the processes backend, data put into the object store once, setup= once per
Ray worker process, crashes and timeouts pinned on exactly one task.

Every test shares one local Ray instance, the suite's (conftest.shared_ray,
started once for the modules next to each other that use it), so the
backend connects to it (and leaves it running) instead of starting its own;
tests/test_ray_cluster.py covers a backend that starts Ray itself and a
two-node cluster.
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
import manymodels._version
from conftest import (
    assert_only_failed,
    assert_only_timed_out,
    count_parts_as_columns,
    fit_linear,
    shared_ray,
)
from manymodels.engine.backends import WorkerStartupError
from manymodels.engine.backends.base import Finished
from manymodels.engine.execution import RunContext
from manymodels.planning.taskdata import Items

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

#: The suite's engines this module uses, kept up from the module before (conftest).
SHARED_ENGINES = ("ray",)

#: Columns that depend on timing or on which worker ran a task.
_TIMING = ["duration_s", "worker", "started_s"]


@pytest.fixture(scope="module", autouse=True)
def local_ray():
    shared_ray()


def _same_results(ray_run, local_run) -> None:
    left = ray_run.results.drop(columns=_TIMING).drop(columns="error")
    right = local_run.results.drop(columns=_TIMING).drop(columns="error")
    pd.testing.assert_frame_equal(left, right)
    assert ray_run.results["error"].isna().equals(local_run.results["error"].isna())


def test_groups_match_the_processes_backend(sales, monkeypatch):
    as_columns = count_parts_as_columns(monkeypatch)
    source = mm.groups(sales, by=["store", "item"])
    run = mm.train(fit_linear, source, backend="ray", workers=2, progress=False)
    assert sum(as_columns) > 0  # parts of successes came as columns (OkOutcomes)
    local = mm.train(fit_linear, source, backend="processes", workers=2, progress=False)
    assert run.summary().statuses == {"ok": 60}
    assert run.backend == "ray"
    _same_results(run, local)
    assert run.models.keys() == local.models.keys()
    for key, model in local.models.items():
        assert run.models[key]["slope"] == pytest.approx(model["slope"], rel=1e-12)
    assert ray.is_initialized()  # it connected to the running instance and left it


def test_groups_read_on_the_ray_workers_match_the_processes_backend(tmp_path, sales):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "parts").mkdir()
    for i, (_, chunk) in enumerate(sales.groupby(sales.index % 3)):
        pq.write_table(pa.Table.from_pandas(chunk, preserve_index=False),
                       tmp_path / "parts" / f"part-{i}.parquet")
    source = mm.groups(tmp_path / "parts", by="store", read_on_workers=True)
    assert source.table.column_names == ["store", "__file__"]  # keys and file numbers only
    run = mm.train(fit_linear, source, backend="ray", workers=2, progress=False)
    local = mm.train(fit_linear, source, backend="processes", workers=2, progress=False)
    assert run.summary().statuses == {"ok": 12}
    _same_results(run, local)
    for key, model in local.models.items():
        assert run.models[key]["slope"] == pytest.approx(model["slope"], rel=1e-12)


def fail_on_37(item):
    if item == 37:
        raise ValueError(f"bad item {item}")
    return item * 2, {"double": item * 2}


def test_items_with_a_failure_match_the_processes_backend():
    source = mm.items(range(100))
    run = mm.train(fail_on_37, source, backend="ray", workers=2, progress=False)
    local = mm.train(fail_on_37, source, backend="processes", workers=2, progress=False)
    assert run.summary().statuses == {"ok": 99, "failed": 1}
    _same_results(run, local)
    failed = run.failed.set_index("item")
    assert list(failed.index) == [37]
    assert "ValueError: bad item 37" in failed.loc[37, "error"]
    assert "Traceback" in failed.loc[37, "error"]
    assert run.models[99] == 198


def fit_with_shared(df, alpha, weights, offset):
    # weights comes from the object store, zero-copy: read-only in the worker
    value = float(np.asarray(df["x"]).sum() * weights.sum() * alpha + offset)
    return {"value": value, "readonly": not weights.flags.writeable}


def test_grid_times_groups_with_shared_numpy_array(sales):
    weights = np.arange(1_000, dtype=float)
    source = mm.groups(sales, by="store") * mm.grid(alpha=[0.5, 2.0])
    shared = {"weights": weights, "offset": 3.0}
    run = mm.train(fit_with_shared, source, shared=shared, backend="ray", workers=2,
                   progress=False)
    local = mm.train(fit_with_shared, source, shared=shared, backend="processes", workers=2,
                     progress=False)
    assert run.summary().statuses == {"ok": 24}
    ray_values = run.results.set_index(["store", "alpha"])["value"]
    local_values = local.results.set_index(["store", "alpha"])["value"]
    pd.testing.assert_series_equal(ray_values, local_values)
    expected = sales.groupby("store")["x"].sum() * weights.sum()
    for (store, alpha), value in ray_values.items():
        assert value == pytest.approx(expected[store] * alpha + 3.0)
    assert run.results["readonly"].all()  # mapped from the object store, not copied


def bare_grid_fit(a, b):
    return {"product": a * b}


def test_bare_grid():
    run = mm.train(bare_grid_fit, mm.grid(a=[1, 2, 3], b=[10, 20]), backend="ray", workers=2,
                   progress=False)
    assert run.summary().statuses == {"ok": 6}
    assert dict(zip(zip(run.results["a"], run.results["b"]), run.results["product"])) == {
        (a, b): a * b for a in (1, 2, 3) for b in (10, 20)}


def make_resource(setup_dir):
    def make():
        Path(setup_dir, f"setup-{os.getpid()}-{time.perf_counter_ns()}").touch()
        return os.getpid()
    return make


def report_pid(item, resource):
    time.sleep(0.002)
    return {"pid": os.getpid(), "resource": resource}


def test_setup_runs_once_per_ray_worker_process_not_per_batch(tmp_path):
    run = mm.train(report_pid, mm.items(range(400)), setup=make_resource(str(tmp_path)),
                   backend="ray", workers=2, progress=False)
    assert run.summary().statuses == {"ok": 400}
    assert run.batches > 4  # several batches per worker process...
    pids = set(run.results["pid"])
    setups = [p.name.split("-")[1] for p in tmp_path.iterdir()]
    assert sorted(setups) == sorted(str(pid) for pid in pids)  # ...and one setup each
    assert (run.results["resource"] == run.results["pid"]).all()
    assert run.results["worker"].nunique() == len(pids)


def failing_setup():
    raise RuntimeError("no resource today")


def with_resource(item, resource):
    return item


def test_failing_setup_stops_the_run():
    with pytest.raises(WorkerStartupError, match="no resource today"):
        mm.train(with_resource, mm.items(range(10)), setup=failing_setup, backend="ray",
                 workers=2, progress=False)


def exit_on_13(item):
    if item == 13:
        os._exit(3)
    return item


@pytest.mark.parametrize("retries", [0, 1])
def test_a_crash_inside_a_batch_costs_exactly_its_task(retries):
    run = mm.train(exit_on_13, mm.items(range(200)), backend="ray", workers=2,
                   retries=retries, progress=False)
    results = run.results.set_index("item")
    assert results.loc[13, "status"] == "crashed"
    assert "died" in results.loc[13, "error"]
    assert results.loc[13, "attempts"] == retries + 1
    others = results.drop(index=13)
    assert (others["status"] == "ok").all() and len(others) == 199
    assert run.summary().statuses == {"ok": 199, "crashed": 1}


def sleep_on_5(item, pid_dir, once):
    if item == 5 and not (once and any(Path(pid_dir).iterdir())):
        Path(pid_dir, f"victim-{os.getpid()}").touch()
        time.sleep(3600)  # until killed: the run cannot end otherwise
    time.sleep(0.01)
    return item


@pytest.mark.parametrize("once", [True, False], ids=["killed-once", "killed-every-time"])
def test_ray_worker_killed_from_outside_mid_run(tmp_path, once):
    done = threading.Event()

    def killer():  # SIGKILLs every Ray worker process that runs item 5
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
        run = mm.train(sleep_on_5, mm.items(range(50)),
                       shared={"pid_dir": str(tmp_path), "once": once},
                       backend="ray", workers=2, progress=False)
    finally:
        done.set()
        thread.join()
    results = run.results.set_index("item")
    assert len(results) == 50
    assert (results.drop(index=5)["status"] == "ok").all()
    if once:
        # Killed inside a batch, the batch's unreported tasks run again, marked,
        # to find the culprit: a one-off kill then costs nothing.
        assert results.loc[5, "status"] in {"crashed", "ok"}
    else:  # a task whose worker always dies is blamed, and only it
        assert results.loc[5, "status"] == "crashed"
        assert "WorkerCrashedError" in results.loc[5, "error"]
        assert results.loc[5, "attempts"] == 1


def hang_on_2(item):
    if item == 2:
        time.sleep(3600)
    time.sleep(0.01)
    return item


def test_timeout_kills_the_ray_worker_and_costs_one_task():
    start = time.monotonic()
    run = mm.train(hang_on_2, mm.items(range(20)), backend="ray", workers=2, timeout=2,
                   progress=False)
    assert time.monotonic() - start < 240  # item 2 hangs for an hour unless killed
    assert_only_timed_out(run, 2, timeout=2)
    assert run.summary().statuses == {"ok": 19, "timeout": 1}
    assert 2 <= run.results.set_index("item").loc[2, "duration_s"] < 60  # until killed


def slow_item(item):
    time.sleep(0.05)
    return {"pid": os.getpid()}


def test_a_backend_instance_maps_worker_ids_to_ray_processes_and_nodes():
    backend = mm.RayBackend()  # workers: the connected instance's CPUs
    assert backend.workers == 2 and backend.auto_workers
    run = mm.train(slow_item, mm.items(range(40)), backend=backend, progress=False)
    assert run.summary().statuses == {"ok": 40}
    assert run.workers == 2 and run.backend == "ray"
    for worker, pid in zip(run.results["worker"], run.results["pid"]):
        assert backend.worker_pids[worker] == pid
    node = ray.get_runtime_context().get_node_id()
    assert set(backend.worker_nodes.values()) == {node}
    assert not backend.started_ray and ray.is_initialized()


def test_workers_given_to_train_override_the_cluster_size():
    backend = mm.RayBackend()
    run = mm.train(slow_item, mm.items(range(6)), backend=backend, workers=1, progress=False)
    assert run.workers == 1 and backend.workers == 1 and not backend.auto_workers
    spans = sorted(zip(run.results["started_s"], run.results["started_s"]
                       + run.results["duration_s"]))
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end - 0.01  # one task at a time, though the instance has 2 CPUs


def test_two_batches_per_worker_in_flight_where_ray_caps_the_run():
    # Ray queues them at the driver, where the first worker to free up takes
    # the next: so the scheduler asks for two once tasks are measured, long
    # tasks too (tests/test_scheduling.py), and the backend takes them.
    assert mm.RayBackend.shares_one_queue
    capped = mm.RayBackend()  # as many workers as the instance's 2 CPUs
    capped.start(RunContext(fit=slow_item, data=Items([], [], None)))
    try:
        assert capped.free_slots(1) == capped.workers  # as asked before any outcome
        assert capped.free_slots(2) == 2 * capped.workers
        capped.submit(0, [(0, 0, None)])
        assert capped.free_slots(2) == 2 * capped.workers - 1
        deadline = time.monotonic() + 60
        while not any(isinstance(e, Finished) for e in capped.poll(0.05)):
            assert time.monotonic() < deadline
        assert capped.free_slots(2) == 2 * capped.workers
    finally:
        capped.stop()
    # Fewer workers than CPUs: Ray would run a queued batch at once.
    below = mm.RayBackend(workers=1)
    below.start(RunContext(fit=slow_item, data=Items([], [], None)))
    try:
        assert below.free_slots(1) == below.free_slots(2) == 1
    finally:
        below.stop()


def test_a_node_with_another_manymodels_version_fails_clearly(monkeypatch):
    monkeypatch.setattr(manymodels._version, "__version__", "0.0.0-driver")  # workers: theirs
    with pytest.raises(WorkerStartupError, match="install the same version on every node"):
        mm.train(slow_item, mm.items(range(4)), backend="ray", workers=2, progress=False)


def blas_threads(item):
    from threadpoolctl import threadpool_info  # NumPy's BLAS is loaded with this module

    blas = [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]
    return {"threads": max(blas)}


def _wait_for_free_cpus(limit_s: float = 60.0) -> None:
    """Wait until the instance's CPUs are all free again: a Ray worker that
    an earlier test's run cancelled (force=True) gives its CPU back only once
    Ray has seen its process end, and on a loaded machine that is a while;
    a task asking for both CPUs meanwhile waits, as Ray makes it."""
    deadline = time.monotonic() + limit_s
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        assert time.monotonic() < deadline, (
            f"Ray's CPUs not freed in {limit_s} s: {ray.available_resources()}")
        time.sleep(0.2)


@pytest.mark.parametrize("cpus_per_task", [1, 2])
def test_cpus_per_task_limits_blas_threads_and_concurrency(cpus_per_task):
    _wait_for_free_cpus()
    run = mm.train(blas_threads, mm.items(range(8)), backend=mm.RayBackend(),
                   cpus_per_task=cpus_per_task, progress=False)
    assert run.summary().statuses == {"ok": 8}
    assert run.workers == 2 // cpus_per_task  # the instance's 2 CPUs
    assert (run.results["threads"] == cpus_per_task).all()


def _one(item):
    return 1


def test_an_item_that_cannot_be_sent_fails_only_its_task():
    """An item Ray cannot pickle failed the run mid-way, with no ``.run``."""
    lock = threading.Lock()
    run = mm.train(_one, mm.items([1, lock, 3], key=lambda item: "lock" if item is lock
                                  else item), backend="ray", workers=2, progress=False)
    assert_only_failed(run, "lock", "cannot be pickled to send them to a worker")


def test_a_run_whose_tasks_cannot_start_says_what_ray_lacks(monkeypatch):
    """Another job holding the instance's CPUs kept every Ray task of a run
    waiting, and the run said nothing: it looked hung."""
    from manymodels.engine.backends import ray as ray_backend

    monkeypatch.setattr(ray_backend, "_NO_START_WARN_S", 0.5)
    _wait_for_free_cpus()

    @ray.remote(num_cpus=2)
    def hold_both_cpus():
        time.sleep(2)

    holder = hold_both_cpus.remote()
    while ray.available_resources().get("CPU", 0) > 0:  # until it holds them
        time.sleep(0.05)
    with pytest.warns(RuntimeWarning, match=r"no Ray task of this run has started after \d+ s: "
                      r"each asks for 1 CPU\(s\); the Ray cluster has 0 of 2 CPU\(s\)"):
        run = mm.train(_one, mm.items(range(4)), backend="ray", workers=2, progress=False)
    assert run.summary().statuses == {"ok": 4}  # it ran once the CPUs were free
    ray.get(holder)


def test_settings_that_the_ray_instance_in_use_was_not_made_with_are_refused():
    """A RayBackend's address= or ray_init_options went unheeded where this
    process was already connected to Ray: a run meant for a cluster trained
    on the local instance, and a runtime_env= never applied. They are refused
    by name before any work; the instance's own address is taken."""
    items = mm.items(range(2))
    with pytest.raises(ValueError, match=r"RayBackend\(address='ray://nowhere:1'\): this "
                                         "process is already connected to Ray"):
        mm.train(_one, items, backend=mm.RayBackend(address="ray://nowhere:1"), progress=False)
    with pytest.raises(ValueError, match=r"RayBackend\(runtime_env=\).*ray\.shutdown\(\)"):
        mm.train(_one, items, backend=mm.RayBackend(runtime_env={"env_vars": {"A": "1"}}),
                 progress=False)
    port = ray.get_runtime_context().gcs_address.rpartition(":")[2]
    run = mm.train(_one, items, backend=mm.RayBackend(address=f"127.0.0.1:{port}"),
                   workers=1, progress=False)
    assert run.summary().statuses == {"ok": 2} and ray.is_initialized()


def test_a_task_no_node_of_the_users_own_local_ray_can_run_fails_before_any_work():
    """The user's ray.init() of 2 CPUs, and cpus_per_task=4: it only warned
    that an autoscaler might add nodes, and waited for ever (there is none)."""
    with pytest.raises(WorkerStartupError, match=r"each task needs 4 CPU\(s\), but the Ray "
                                                 r"cluster has 2 CPU\(s\)"):
        mm.train(_one, mm.items(range(2)), backend="ray", cpus_per_task=4, progress=False)
    assert ray.is_initialized()  # left as found


def test_results_frame_types_a_timezone_aware_key_as_the_results_do():
    """run.results_frame() of a Ray run was Ray Data's Dataset of the pandas
    frame, whose schema had no type for a timezone-aware key (None, and an
    error logged): the key's type is Arrow's timestamp in its zone, and the
    rows are run.results' rows."""
    import pyarrow as pa

    days = pd.date_range("2024-03-30", periods=2, freq="D", tz="Europe/Paris")
    frame = pd.DataFrame({"day": np.repeat(days, 3), "x": np.arange(6.0), "y": np.arange(6.0)})
    run = mm.train(fit_linear_xy, mm.groups(frame, by="day"), backend="ray", workers=2,
                   progress=False)
    dataset = run.results_frame()
    schema = dataset.schema()
    day = schema.types[schema.names.index("day")]
    assert pa.types.is_timestamp(day) and day.tz == "Europe/Paris", day
    assert schema.types[schema.names.index("error")] == pa.string()
    got = dataset.to_pandas()
    assert got["day"].tolist() == run.results["day"].tolist() == list(days)


def _fit_estimator(df, model):
    return model.fit(df[["x"]], df["y"])


def test_results_frame_of_a_grid_of_estimators_holds_their_text():
    """run.results_frame() of a Ray run over a grid of estimators failed with
    Arrow's bare 'Could not convert Ridge()' (the results went to Ray
    through Arrow, which has no type for them): that column holds each
    value's text, as the results print it."""
    from sklearn.linear_model import Lasso, Ridge

    frame = pd.DataFrame({"g": [1, 1, 1, 2, 2, 2], "x": np.arange(6.0), "y": np.arange(6.0)})
    run = mm.train(_fit_estimator, mm.groups(frame, by="g") * mm.grid(model=[Ridge(), Lasso()]),
                   backend="ray", workers=2, progress=False)
    got = run.results_frame().to_pandas()
    assert sorted(got["model"]) == sorted(str(m) for m in run.results["model"])
    assert sorted(got["g"]) == sorted(run.results["g"])


def fit_linear_xy(df):
    return {"slope": float(np.polyfit(df["x"], df["y"], 1)[0])}
