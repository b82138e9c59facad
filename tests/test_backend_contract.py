"""The backend contract (manymodels.engine.backends.base), checked on every backend.

A new backend registered with ``mm.register_backend`` must pass this file:
add its name to ``CONTRACT_BACKENDS``. The scheduler is left out on purpose:
each test drives the backend the way the scheduler does (configure, start,
free_slots/submit, poll, stop), so a failure names the backend's own fault.
"""

from __future__ import annotations

import os
import time
from collections import deque

import pytest

import manymodels as mm
from conftest import shared_ray
from manymodels.engine.backends import BACKENDS, Backend, backend_class
from manymodels.engine.execution import Executor, RunContext
from manymodels.engine.messages import Finished, Lost, Requeued, Status
from manymodels.engine.options import BackendOptions
from manymodels.planning.taskdata import Items

pytestmark = pytest.mark.usefixtures("no_leftovers")

#: The suite's engines this module uses, kept up from the module before (conftest).
SHARED_ENGINES = ("ray",)


class InlineBackend(Backend):
    """A whole backend in a few lines: each batch runs in the driver when
    polled. What a new engine must write, and no more."""

    name = "inline"

    def start(self, context: RunContext) -> None:
        self._executor = Executor(context)
        self._queue: deque = deque()

    def free_slots(self, per_worker: int) -> int:
        return max(0, self.workers * per_worker - len(self._queue))

    def submit(self, batch_id: int, tasks: list) -> None:
        self._queue.append(tasks)

    def poll(self, timeout: float) -> list:
        if not self._queue:
            time.sleep(min(timeout, 0.01))
            return []
        part = self._executor.run_batch(self._queue.popleft())
        return [Finished(part.outcomes, worker=0, busy_s=part.busy_s, prepare_s=part.prepare_s)]

    def stop(self, *, force: bool = False) -> None:
        self._queue.clear()


mm.register_backend("inline", InlineBackend)

CONTRACT_BACKENDS = [
    "serial", "threads", "processes", "inline",
    pytest.param("ray", marks=[pytest.mark.ray, pytest.mark.slow]),
    pytest.param("spark", marks=[pytest.mark.spark, pytest.mark.slow]),
    pytest.param("dask", marks=[pytest.mark.dask, pytest.mark.slow]),
]


@pytest.fixture(scope="module")
def name(request: pytest.FixtureRequest):
    """A backend's name, for the tests that run it (``indirect``): Ray's and
    Spark's engines are started once for the module, before each test's
    count of its processes (Ray's is the suite's, conftest.shared_ray), and
    the backends join them as they join a user's (one started for each test
    cost 4-6 s); what a backend does when it starts its engine itself is
    tests/test_ray_cluster.py's and test_engines.py's."""
    close = None
    if request.param == "ray":
        shared_ray()  # the suite's, kept for the next module (conftest)
    elif request.param == "spark":
        from test_engines import _start_spark

        session, close, _ = _start_spark()
        # Spark's Python workers start with its first job and live with it
        session.sparkContext.parallelize(range(2), 2).map(abs).collect()
    yield request.param
    if close is not None:
        close()


def contract_fit(item):
    if item % 5 == 3:
        raise ValueError(f"item {item} is bad")
    return {"pid": os.getpid(), "item": item,
            "threads": (os.environ.get("OMP_NUM_THREADS"),
                        os.environ.get("LOKY_MAX_CPU_COUNT"))}


def _drive(backend: Backend, tasks: list[int], per_worker: int = 2, limit_s: float = 120):
    """Run ``tasks`` through ``backend`` as the scheduler would; return every
    report per task index."""
    reports: dict[int, list] = {i: [] for i in tasks}
    backend.start(RunContext(fit=contract_fit, data=Items([], [], None)))
    try:
        pending = deque(tasks)
        batch_id = 0
        deadline = time.monotonic() + limit_s
        done = 0
        while done < len(tasks):
            assert time.monotonic() < deadline, "the backend stopped reporting"
            free = backend.free_slots(per_worker)
            assert 0 <= free <= backend.workers * per_worker
            while free > 0 and pending:
                taken = [pending.popleft() for _ in range(min(3, len(pending)))]
                batch = [(index, index, None) for index in taken]  # (index, item, params)
                backend.submit(batch_id, batch)
                batch_id += 1
                free -= 1
            for event in backend.poll(0.05):
                if isinstance(event, Finished):
                    for outcome in event.outcomes:
                        reports[outcome[0]].append(outcome)
                        done += 1
                elif isinstance(event, Lost):
                    reports[event.index].append(event)
                    done += 1
                elif isinstance(event, Requeued):
                    pending.extendleft(reversed(event.indices))
    finally:
        backend.stop()
    return reports


def _configured(name: str, workers: int = 2) -> Backend:
    backend = backend_class(name)()
    backend.configure(BackendOptions(workers=workers))
    return backend


@pytest.mark.parametrize("name", CONTRACT_BACKENDS, indirect=True)
def test_every_task_is_reported_exactly_once_and_exceptions_are_outcomes(name):
    backend = _configured(name)
    reports = _drive(backend, list(range(20)))
    for index, seen in reports.items():
        assert len(seen) == 1, f"task {index} reported {len(seen)} times"
        outcome = seen[0]
        expected = Status.FAILED if index % 5 == 3 else Status.OK
        assert outcome[1] == expected
        if expected == Status.FAILED:
            assert f"item {index} is bad" in outcome[6]
        else:
            assert outcome[2] is None and outcome[3]["item"] == index  # metrics alone


@pytest.mark.parametrize("name", CONTRACT_BACKENDS, indirect=True)
def test_free_slots_are_bounded_by_workers_and_refill(name):
    backend = _configured(name, workers=1)
    backend.start(RunContext(fit=contract_fit, data=Items([], [], None)))
    try:
        deadline = time.monotonic() + 60
        while backend.free_slots(1) == 0 and time.monotonic() < deadline:
            assert backend.poll(0.05) == []  # workers still starting: nothing to report
        assert backend.free_slots(1) == 1
        backend.submit(0, [(0, 0, None)])
        assert backend.free_slots(1) == 0  # one batch in flight on the one worker
        deadline = time.monotonic() + 60
        finished = []
        while not finished and time.monotonic() < deadline:
            finished = [e for e in backend.poll(0.05) if isinstance(e, Finished)]
        assert finished and backend.free_slots(1) == 1
    finally:
        backend.stop()


@pytest.mark.parametrize("name", CONTRACT_BACKENDS)
def test_configure_is_how_settings_reach_a_backend(name):
    backend = backend_class(name)()
    backend.configure(BackendOptions(workers=3, cpus_per_task=2))
    assert backend.cpus_per_task == 2 and backend.options.cpus_per_task == 2
    assert backend.workers == (1 if name == "serial" else 3)


@pytest.mark.parametrize("name", CONTRACT_BACKENDS, indirect=True)
def test_train_runs_on_it_like_on_serial(name):
    before, loky_before = os.environ.get("OMP_NUM_THREADS"), os.environ.get("LOKY_MAX_CPU_COUNT")
    kwargs = {} if name == "serial" else {"workers": 2}
    run = mm.train(contract_fit, mm.items(range(12)), backend=name, progress=False, **kwargs)
    reference = mm.train(contract_fit, mm.items(range(12)), backend="serial", progress=False)
    assert run.results["status"].tolist() == reference.results["status"].tolist()
    assert run.results["item"].tolist() == reference.results["item"].tolist()
    if name != "inline":  # (a backend of this test's own, which sets nothing)
        # each task's thread limits, in its environment too (joblib's cpu_count,
        # the processes a fit starts): only the processes backend set them
        assert set(run.ok["threads"].map(tuple)) == {("1", "1")}
        # and this process's as they were (a LocalCluster's nannies set
        # OMP_NUM_THREADS=1 here for the workers they spawn: put back)
        assert os.environ.get("LOKY_MAX_CPU_COUNT") == loky_before
        assert os.environ.get("OMP_NUM_THREADS") == before


class TwoArgumentWarning(Exception):
    """Pickles (as its class and ``args``) but does not unpickle: its
    ``__init__`` needs an argument that ``args`` does not hold."""

    def __init__(self, message, code):
        super().__init__(message)
        self.code = code


def fit_with_an_unpicklable_metric(item):
    if item == 4:
        return None, {"r2": 0.5, "warning": TwoArgumentWarning("slow convergence", 3)}
    return None, {"r2": 0.5, "item": item}


@pytest.mark.parametrize("name", CONTRACT_BACKENDS, indirect=True)
def test_a_metric_the_driver_cannot_unpickle_fails_its_own_task_only(name):
    # a backend that pickles outcomes fails that task, with the reason; one that
    # does not (fit runs in the driver) keeps the value; the others are ok either way
    kwargs = {} if name == "serial" else {"workers": 2}
    run = mm.train(fit_with_an_unpicklable_metric, mm.items(range(12)), backend=name,
                   progress=False, **kwargs)
    results = run.results.set_index("item")
    assert (results.drop(index=4)["status"] == "ok").all()
    if backend_class(name).requires_pickling:
        assert results.loc[4, "status"] == "failed"
        assert "cannot be unpickled in the driver" in results.loc[4, "error"]
        assert "TwoArgumentWarning" in results.loc[4, "error"]
    else:
        assert results.loc[4, "status"] == "ok"


def test_register_backend_refuses_what_is_not_a_backend():
    with pytest.raises(TypeError, match="subclass of manymodels.Backend"):
        mm.register_backend("bad", object)
    with pytest.raises(ValueError, match="non-empty string"):
        mm.register_backend("", InlineBackend)
    assert BACKENDS["inline"] is InlineBackend


@pytest.mark.parametrize("name", ["processes", "serial", "spark"])
def test_register_backend_replaces_a_built_in_only_when_told(name):
    """``register_backend("processes", X)`` replaced the built-in for every
    run (the CLI's too) and said nothing."""
    before = dict(BACKENDS)
    with pytest.raises(ValueError, match=f"backend '{name}' is a built-in one.*replace=True"):
        mm.register_backend(name, InlineBackend)
    assert before == BACKENDS
    try:
        mm.register_backend(name, InlineBackend, replace=True)
        assert backend_class(name) is InlineBackend
    finally:
        BACKENDS.clear()
        BACKENDS.update(before)
    mm.register_backend("inline", InlineBackend)  # a name of the user's: registered again


def test_a_backends_worker_side_does_not_import_the_whole_package():
    import subprocess
    import sys

    code = ("import sys, manymodels.engine.backends._ray_worker, manymodels._version, "
            "manymodels.engine.backends._remote_worker; "
            "print(sorted(m for m in ('pandas', 'manymodels.store', 'manymodels.api', "
            "'manymodels.transforms') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
    assert mm.train is __import__("manymodels.api", fromlist=["train"]).train  # still there


def test_no_module_reaches_the_package_through_its_top_level():
    """``import manymodels as mm`` inside the package (the CLI's train, the
    estimator's fit) reached ``train`` around the layer contract, which
    lint-imports cannot see: each module imports from the one that defines
    what it uses."""
    import ast
    from pathlib import Path

    package = Path(mm.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom)
                     and node.level == 0 else [])
            if "manymodels" in names:
                found.append(f"{path.relative_to(package)}:{node.lineno}")
    assert found == []


def test_the_engines_load_only_when_asked_for():
    import subprocess
    import sys

    code = ("import sys, manymodels as mm, manymodels.engine.backends as b; mm.SparkBackend; "
            "mm.DaskBackend; b.backend_class('spark'); b.backend_class('dask'); "
            "print(sorted(m for m in ('pyspark', 'distributed', 'dask') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "[]"
    with pytest.raises(ValueError, match="unknown backend 'nope'") as error:
        backend_class("nope")
    assert "spark" in str(error.value) and "dask" in str(error.value)


@pytest.mark.parametrize("name", ["serial", "threads", "processes", "ray", "spark", "dask"])
def test_every_capability_flag_a_backend_sets_is_declared_by_the_contract(name):
    # a flag the base class does not declare is read by nothing and documented
    # nowhere; the contract, with its flags, is mm.Backend's own docstring,
    # which the API reference shows
    flags = {attribute for attribute, value in vars(backend_class(name)).items()
             if isinstance(value, bool) and not attribute.startswith("_")}
    assert flags <= set(vars(Backend)), flags - set(vars(Backend))
    assert "Each task submitted is reported exactly once" in Backend.__doc__


def test_a_processes_backend_registered_under_its_own_name_takes_start_method():
    """start_method= was refused for any backend not named "processes",
    a subclass of it registered under another name among them."""
    from manymodels.engine.backends.processes import ProcessesBackend

    class Spawning(ProcessesBackend):
        pass

    mm.register_backend("spawning-processes", Spawning)
    try:
        run = mm.train(_square, mm.items([1, 2, 3]), backend="spawning-processes",
                       workers=1, start_method="spawn", progress=False)
    finally:
        BACKENDS.pop("spawning-processes")
    assert sorted(run.models.values()) == [1, 4, 9]
    with pytest.raises(ValueError, match="start_method applies to backend='processes'"):
        mm.train(_square, mm.items([1]), backend="threads", start_method="spawn",
                 progress=False)


def _square(item):
    return item * item
