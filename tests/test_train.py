"""Behaviour that must match across the serial, threads and processes backends."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import manymodels as mm
from conftest import BACKENDS, fit_linear, wait_for_workers
from conftest import lazy_polars as pl

pytestmark = pytest.mark.usefixtures("no_leftovers")


def fail_on_one(item):
    if item == 37:
        raise ValueError(f"bad item {item}")
    return item * 2, {"double": item * 2}


@pytest.mark.parametrize("backend", [*BACKENDS, "processes-fork", "processes-spawn"])
def test_same_results_as_serial(backend, sales):
    source = mm.groups(sales, by=["store", "item"])
    reference = mm.train(fit_linear, source, backend="serial", progress=False)
    backend, _, start = backend.partition("-")
    options = {"start_method": start} if start else {}
    run = mm.train(fit_linear, source, backend=backend, workers=2, progress=False, **options)
    assert (run.results["status"] == "ok").all()
    assert len(run.results) == 60
    columns = ["store", "item", "slope", "n"]
    pd.testing.assert_frame_equal(run.results[columns], reference.results[columns])
    assert run.models.keys() == reference.models.keys()
    for key, model in run.models.items():
        assert model["slope"] == pytest.approx(reference.models[key]["slope"])
    # the model of store s03, item 2 fits y = 4x + 2
    assert run.models[("s03", 2)]["slope"] == pytest.approx(4.0, abs=0.1)
    assert run.models[("s03", 2)]["intercept"] == pytest.approx(2.0, abs=0.1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_exception_fails_only_its_task(backend):
    run = mm.train(fail_on_one, mm.items(range(100)), backend=backend, workers=2,
                   progress=False)
    assert len(run.ok) == 99
    assert len(run.models) == 99 and 37 not in run.models
    failed = run.failed
    assert list(failed["item"]) == [37]
    assert failed["status"].iloc[0] == "failed"
    error = failed["error"].iloc[0]
    assert "Traceback" in error and "ValueError: bad item 37" in error
    assert "fail_on_one" in error
    assert run.models[10] == 20
    assert run.summary().failed == 1 and run.summary().ok == 99


@pytest.mark.parametrize("backend", BACKENDS)
def test_groups_times_grid_yields_every_combination_once(backend, sales):
    source = mm.groups(sales, by="store") * mm.grid(alpha=[0.0, 1.0, 3.0], tag=["a", "b"])
    run = mm.train(fit_linear, source, backend=backend, workers=2, progress=False)
    results = run.results
    assert len(results) == 12 * 3 * 2
    assert not results.duplicated(["store", "alpha", "tag"]).any()
    assert set(results["alpha"]) == {0.0, 1.0, 3.0} and set(results["tag"]) == {"a", "b"}
    assert set(results["store"]) == set(sales["store"])
    # the grid value reached fit: the slope shrinks by 1 + alpha
    plain = run.models[("s00", 0.0, "a")]["slope"]
    assert run.models[("s00", 3.0, "b")]["slope"] == pytest.approx(plain / 4)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("by", ["store", "item", ["store", "item"]])
def test_keys_round_trip(backend, by, sales):
    run = mm.train(fit_linear, mm.groups(sales, by=by), backend=backend, progress=False)
    if isinstance(by, str):
        expected = set(sales[by].tolist())
        assert set(run.models) == expected
        assert all(type(k) is type(next(iter(expected))) for k in run.models)
        counts = sales[by].value_counts()
        for key, n in run.results[[by, "n"]].itertuples(index=False):
            assert counts[key] == n
    else:
        expected = set(map(tuple, sales[by].drop_duplicates().itertuples(index=False)))
        assert set(run.models) == expected
        assert ("s05", 4) in run.models


@pytest.mark.parametrize("backend", BACKENDS)
def test_grid_alone_and_shared_objects(backend):
    X = np.arange(1000, dtype=float)

    def score(power, offset, data, scale):
        return {"value": float((data ** power).sum() * scale + offset)}

    run = mm.train(score, mm.grid(power=[1, 2], offset=[0, 10]),
                   shared={"data": X, "scale": 0.5}, backend=backend, progress=False)
    results = run.results.set_index(["power", "offset"])
    assert results.loc[(1, 10), "value"] == pytest.approx(X.sum() * 0.5 + 10)
    assert results.loc[(2, 0), "value"] == pytest.approx((X ** 2).sum() * 0.5)
    assert run.models == {}  # a metrics dict alone is not a model


def _describe(data):
    if isinstance(data, pa.Table):
        kind, n, total = "arrow", data.num_rows, pa.compute.sum(data["x"]).as_py()
    elif isinstance(data, pl.DataFrame):
        kind, n, total = "polars", data.height, data["x"].sum()
    elif isinstance(data, dict):
        kind, n, total = "numpy", len(data["x"]), float(np.sum(data["x"]))
    else:
        kind, n, total = "pandas", len(data), float(data["x"].sum())
    return {"kind": kind, "rows": n, "total": total}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fmt", ["pandas", "arrow", "polars", "numpy"])
def test_formats(backend, fmt, sales):
    run = mm.train(_describe, mm.groups(sales, by="store", format=fmt), backend=backend,
                   progress=False)
    results = run.results.set_index("store")
    assert (results["kind"] == fmt).all()
    expected = sales.groupby("store")["x"].sum()
    for store, total in expected.items():
        assert results.loc[store, "total"] == pytest.approx(total)
        assert results.loc[store, "rows"] == 150


@pytest.mark.parametrize("backend", BACKENDS)
def test_items_of_paths(backend, tmp_path):
    paths = []
    for i in range(6):
        path = tmp_path / f"part{i}.csv"
        pd.DataFrame({"x": np.arange(i + 1)}).to_csv(path, index=False)
        paths.append(path)

    def count_rows(path):
        return {"rows": len(pd.read_csv(path))}

    run = mm.train(count_rows, mm.items(paths), backend=backend, progress=False)
    assert dict(zip(run.results["item"], run.results["rows"])) == {
        p: i + 1 for i, p in enumerate(paths)
    }


@pytest.mark.parametrize("backend", BACKENDS)
def test_return_shapes(backend):
    def shapes(item):
        if item == 0:
            return "a model"
        if item == 1:
            return "a model", {"m": 1.5}
        return {"m": np.float64(2.5)}

    run = mm.train(shapes, mm.items([0, 1, 2]), backend=backend, progress=False)
    assert run.models == {0: "a model", 1: "a model"}
    assert run.results["m"].tolist()[1:] == [1.5, 2.5]
    assert type(run.results["m"].iloc[2]) is not np.ndarray


def test_summary_counts_and_utilization(sales):
    run = mm.train(fit_linear, mm.groups(sales, by="store"), backend="serial", progress=False)
    summary = run.summary()
    assert summary.tasks == 12 and summary.ok == 12 and summary.failed == 0
    assert summary.task_time_s == pytest.approx(run.results["duration_s"].sum())
    assert 0 < summary.utilization <= 1.05
    assert "12 ok" in str(summary) and "utilization" in str(summary)


@pytest.mark.parametrize("backend", BACKENDS)
def test_polars_and_arrow_tables_as_input(backend, sales):
    for table in (pl.from_pandas(sales), pa.Table.from_pandas(sales)):
        run = mm.train(fit_linear, mm.groups(table, by="store"), backend=backend,
                       progress=False)
        assert len(run.ok) == 12


def _cuda_devices(item, rendezvous=None):
    import os

    if rendezvous is not None:  # both workers run tasks, however slowly one starts
        wait_for_workers(rendezvous, 2)
    return {"devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}


def test_gpus_per_task_gives_each_worker_its_own_gpus(no_leftovers, monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = mm.train(_cuda_devices, mm.items(range(40)), gpus=4, gpus_per_task=2, workers=8,
                   shared={"rendezvous": str(tmp_path)}, progress=False)
    assert run.summary().workers == 2  # 4 GPUs / 2 per task
    by_worker = run.results.groupby("worker")["devices"].agg(set)
    assert sorted(next(iter(s)) for s in by_worker) == ["0,1", "2,3"]
    assert all(len(s) == 1 for s in by_worker)  # a worker keeps its own GPUs
    with pytest.raises(ValueError, match="gpus_per_task=3 but 2 GPU"):
        mm.train(_cuda_devices, mm.items(range(4)), gpus=2, gpus_per_task=3)
    with pytest.raises(ValueError, match="threads backend cannot give each task its own GPU"):
        mm.train(_cuda_devices, mm.items(range(4)), gpus=2, gpus_per_task=1, backend="threads")


def _load_resource():
    import os

    return {"pid": os.getpid(), "table": list(range(1000))}


def _use_resource(item, resource):
    return {"pid": resource["pid"], "size": len(resource["table"]), "id": id(resource)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_setup_runs_once_per_worker(backend, no_leftovers):
    run = mm.train(_use_resource, mm.items(range(200)), setup=_load_resource, backend=backend,
                   workers=2, progress=False)
    results = run.results
    assert (results["size"] == 1000).all()
    # one resource per worker, reused by all of that worker's tasks
    assert results.groupby("worker")["id"].nunique().max() == 1
    assert results["id"].nunique() == results["worker"].nunique()


def test_setup_failure_is_reported_before_tasks(no_leftovers):
    def broken():
        raise OSError("model file missing")

    with pytest.raises(mm.WorkerStartupError, match="model file missing"):
        mm.train(_use_resource, mm.items(range(5)), setup=broken, workers=1, progress=False)


def _collector_on(_item):
    import gc

    return gc.isenabled()


def _failing(_item):
    raise ValueError("no model")


def _frozen_objects(_item):
    import gc

    return gc.get_freeze_count()


def test_a_forked_worker_leaves_the_drivers_objects_out_of_its_collections():
    """Its collector never walks (and so never copies the pages of) the
    objects it inherited: they are frozen as it starts."""
    import gc

    inherited = [(i, str(i)) for i in range(100_000)]  # the driver's own objects
    run = mm.train(_frozen_objects, mm.items(range(4)), backend="processes", workers=2,
                   progress=False, start_method="fork")
    assert all(count >= len(inherited) for count in run.models.values())
    assert gc.get_freeze_count() == 0  # the driver's own collector is untouched


def test_the_cycle_collector_is_paused_only_while_fits_run_elsewhere():
    """Processes: the driver's collector is off during the run and back on
    after (a run that failed too); threads and serial: fit runs in the driver,
    so it stays on; a collector the user turned off stays off."""
    import gc

    seen = []

    class Watch(mm.Callback):
        def on_batch(self, progress):
            seen.append(gc.isenabled())

    assert gc.isenabled()
    mm.train(_collector_on, mm.items(range(20)), backend="processes", workers=2,
             progress=False, callbacks=[Watch()])
    assert seen and not any(seen) and gc.isenabled()
    workers_on = mm.train(_collector_on, mm.items(range(6)), backend="processes", workers=2,
                          progress=False, start_method="fork")
    assert all(workers_on.models.values())  # forked mid-pause, a worker's own is on
    with pytest.raises(mm.TooManyFailures):  # raised from inside the run
        mm.train(_failing, mm.items(range(3)), backend="processes", workers=2,
                 progress=False, max_failures=0)
    assert gc.isenabled()
    for backend in ("threads", "serial"):
        run = mm.train(_collector_on, mm.items(range(4)), backend=backend, progress=False)
        assert all(run.models.values()), backend
    gc.disable()
    try:
        mm.train(_collector_on, mm.items(range(4)), backend="processes", workers=2,
                 progress=False)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_runs_records_compare_by_identity_without_raising():
    from manymodels.engine.records import TaskRecords

    first, second = TaskRecords(3), TaskRecords(3)
    assert first == first and first != second  # field by field, the NumPy columns raised
    run = mm.train(fit_linear, mm.groups(pd.DataFrame({"g": [1, 1, 2, 2], "x": [0., 1., 0., 1.],
                                                       "y": [1., 2., 3., 5.]}), by="g"),
                   backend="serial", progress=False)
    assert run._records == run._records and run._records in [second, run._records]


def _setting_a(item, params):
    return item * params["a"]


def test_models_of_a_grid_of_dicts_are_found_by_their_keys():
    """A grid of settings dicts made keys Python cannot hash: ``run.models``
    raised TypeError."""
    run = mm.train(_setting_a, mm.items([1, 2]) * mm.grid(params=[{"a": 1}, {"a": 10}]),
                   backend="serial", progress=False)
    models = run.models
    assert len(models) == 4
    assert models[(2, {"a": 10})] == 20
    assert (1, {"a": 10}) in models and (1, {"a": 5}) not in models
    assert sorted(models.values()) == [1, 2, 10, 20]
    assert [key for key in models] == [(1, {"a": 1}), (1, {"a": 10}), (2, {"a": 1}),
                                       (2, {"a": 10})]
