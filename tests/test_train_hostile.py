"""``mm.train`` and its sources under hostile but plausible input: a setup=
that fails on the serial backend, item keys that cannot be hashed or are
NumPy numbers, a product of more tasks than a run plans, costs that are no
numbers, switches that are no switches. Each test fails before its fix."""

from __future__ import annotations

import os
import re

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.engine import scheduling


def _table() -> pd.DataFrame:
    return pd.DataFrame({"g": ["a", "b"], "y": [1.0, 2.0]})


def test_a_failing_setup_on_serial_is_a_worker_start_error_that_leaves_nothing(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def fit(rows, resource):
        return {"m": 1.0}

    def setup():
        raise RuntimeError("cannot load the resource")

    with pytest.raises(mm.WorkerStartupError, match="cannot load the resource"):
        mm.train(fit, mm.groups(_table(), by="g"), backend="serial", setup=setup,
                 progress=False, gpus=[0], gpus_per_task=1)
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_item_keys_are_checked_and_numpy_numbers_are_their_own_keys():
    keys = {1: (0,), 2: "dup", 3: "dup"}
    with pytest.raises(ValueError, match="duplicate item key: 'dup'"):
        mm.items([1, 2, 3], key=lambda x: keys[x])
    run = mm.train(lambda x: int(x) * 2, mm.items(np.array([10, 20, 30])), backend="serial",
                   progress=False)
    assert run.results["item"].tolist() == [10, 20, 30]
    assert run.models[20] == 40


def test_grid_values_and_names_are_checked():
    with pytest.raises(ValueError, match="duplicate value of grid parameter 'a': nan"):
        mm.grid(a=[float("nan"), float("nan")])
    with pytest.raises(ValueError, match="duplicate value of grid parameter 'a'"):
        mm.grid(a=[np.array([1, 2]), np.array([1, 2])])
    assert len(mm.grid(a=[np.array([1, 2]), np.array([3, 4])]).combinations()) == 2
    with pytest.raises(TypeError, match="grid parameter names are fit's keyword names"):
        mm.grid({1: [1]})


def test_a_product_of_too_many_tasks_is_refused_before_it_is_made():
    source = mm.items(range(2000)) * mm.grid(a=range(60_000))
    with pytest.raises(ValueError, match="2,000 groups or items times 60,000 grid settings"):
        mm.train(lambda n, a: None, source, backend="serial", progress=False)


def test_costs_are_functions_of_finite_numbers():
    with pytest.raises(TypeError, match=r"groups\(cost=...\) is each task's expected cost"):
        mm.groups(_table(), by="g", cost=5)
    with pytest.raises(TypeError, match=r"items\(cost=...\)"):
        mm.items([1, 2], cost="big")
    # text, a bool or None is no number, though float() reads "5" and True
    for source in (lambda cost: mm.groups(_table(), by="g", cost=cost),
                   lambda cost: mm.items([1, 2], cost=cost),
                   lambda cost: mm.grid(a=[1, 2], cost=cost)):
        for returned in ("x", "5", True, None, np.bool_(True)):
            with pytest.raises(TypeError, match=f"cost= must return a number; for .* it "
                                                f"returned {re.escape(repr(returned))}"):
                mm.train(lambda *args, **kwargs: None, source(lambda _, v=returned: v),
                         backend="serial", progress=False)
        for returned, said in ((float("nan"), "nan"), (float("inf"), "inf"),
                               (10**400, "1000")):
            with pytest.raises(ValueError, match=f"cost= gave {said}"):
                mm.train(lambda *args, **kwargs: None, source(lambda _, v=returned: v),
                         backend="serial", progress=False)
        run = mm.train(lambda *args, **kwargs: None, source(lambda _: np.int64(3)),
                       backend="serial", progress=False)
        assert run.failed.empty


def test_a_cost_function_that_raises_is_named_with_its_source_and_task():
    """grid(cost=lambda s: s["n_estimators"]) of a grid without that
    parameter said a bare KeyError: 'n_estimators' (not that cost= raised
    it, nor for which setting); items' and groups' said neither the task."""
    def missing(_):
        return {}["n_estimators"]

    for source, said in ((lambda cost: mm.grid(a=[1, 2], cost=cost),
                          r"grid\(cost=...\) raised KeyError: 'n_estimators' for the setting "
                          r"\{'a': 1\}"),
                         (lambda cost: mm.grid(a=[1], cost=cost) * mm.grid(b=[2]),
                          r"^grid\(cost=...\) raised KeyError: 'n_estimators' for the "
                          r"setting \{'a': 1\}$"),
                         (lambda cost: mm.items(["x", "y"], cost=cost),
                          r"items\(cost=...\) raised KeyError: 'n_estimators' for the item "
                          r"of key 'x'"),
                         (lambda cost: mm.groups(_table(), by="g", cost=cost),
                          r"groups\(cost=...\) raised KeyError: 'n_estimators' for a group "
                          r"of \d+ rows")):
        with pytest.raises(ValueError, match=said):
            mm.train(lambda *args, **kwargs: None, source(missing), backend="serial",
                     progress=False)


def test_the_retry_wait_is_bounded(monkeypatch):
    import time

    monkeypatch.setattr(scheduling, "_RETRY_BACKOFF_S", 1.0)
    monkeypatch.setattr(scheduling, "_RETRY_BACKOFF_MAX_S", 0.05)

    def flaky(n):
        raise ConnectionError("down")

    began = time.perf_counter()
    run = mm.train(flaky, mm.items([1]), backend="threads", retries=6, retry_on=ConnectionError,
                   progress=False)
    assert run.results["attempts"].tolist() == [7]
    assert time.perf_counter() - began < 5  # 1+2+...+32 s unbounded: 63 s


def test_switches_sizes_and_callbacks_are_what_they_say():
    source = mm.groups(_table(), by="g")
    for name in ("progress", "dashboard"):
        with pytest.raises(TypeError, match=f"{name} must be True or False, got 'no'"):
            mm.train(lambda rows: None, source, backend="serial", **{name: "no"})
    run = mm.train(lambda rows: None, source, backend="processes", workers=1, progress=False,
                   memory_limit=np.int64(10**10))
    assert run.summary().statuses == {"ok": 2}
    for limit, bytes_ in ((0.5, 0), (2, 2), ("100KB", 100_000)):  # (0.5 killed every task)
        with pytest.raises(ValueError, match=rf"memory_limit={limit!r} is {bytes_} bytes, less "
                                             "than any worker process needs"):
            mm.train(lambda rows: None, source, backend="processes", memory_limit=limit)

    class Counting(mm.Callback):
        pass

    with pytest.raises(TypeError, match=r"callbacks\[0\] is the class Counting: give an "
                                        r"instance of it, Counting\(\)"):
        mm.train(lambda rows: None, source, backend="serial", progress=False,
                 callbacks=[Counting])
    with pytest.raises(ValueError, match="order_by= names the column 'y' twice"):
        mm.groups(_table(), by="g", order_by=["y", "y"])
    with pytest.raises(TypeError, match="columns= must be a column name or a list"):
        mm.groups(_table(), by="g", columns={"y"})


def test_metric_names_that_would_be_one_column_fail_their_task():
    """{1: ..., "1": ...} are one column: the second value would silently
    replace the first. The task fails, naming both; other names still work."""
    frame = pd.DataFrame({"g": [1, 1, 2], "x": [1.0, 2.0, 3.0]})
    run = mm.train(lambda df: (1, {1: 1.0, "1": 2.0} if df.g.iloc[0] == 1 else {2: 3.0}),
                   mm.groups(frame, by="g"), backend="serial", progress=False)
    results = run.results.set_index("g")
    assert results.loc[1, "status"] == "failed"
    assert "metrics name 1 and '1', which are one column" in results.loc[1, "error"]
    assert results.loc[2, "status"] == "ok" and results.loc[2, "2"] == 3.0


def test_keywords_fit_cannot_take_are_refused_before_any_work():
    """A grid parameter named like fit's first parameter (which gets the
    task's data), or a grid, shared or setup name fit has no parameter for,
    failed every task ("got multiple values", "unexpected keyword argument"),
    and so did a bare grid's fit that asks for key= (a grid's tasks have
    none); each is refused by name before any work. A bare grid gives fit
    keywords only; **kwargs takes any."""
    def by_data(data, **options):
        return {}

    with pytest.raises(ValueError, match="grid parameter 'data' is also the name of fit's "
                                         "first parameter"):
        mm.train(by_data, mm.items([1, 2]) * mm.grid(data=[1]), backend="serial",
                 progress=False)
    with pytest.raises(TypeError, match="fit has no parameter 'resource' for the setup name"):
        mm.train(lambda data: {}, mm.items([1, 2]), setup=lambda: 1, backend="serial",
                 progress=False)
    with pytest.raises(TypeError, match="fit has no parameter 'X' for the shared name"):
        mm.train(lambda data, alpha: {}, mm.items([1]) * mm.grid(alpha=[1]),
                 shared={"X": 1}, backend="serial", progress=False)
    with pytest.raises(TypeError, match="fit asks for key=, which a bare grid's tasks do "
                                        "not have"):
        mm.train(lambda a, key: {}, mm.grid(a=[1, 2]), backend="serial", progress=False)
    # a grid parameter or shared name "key" took the place of the task's key, silently
    def keyed(data, key, **options):
        return {"key_seen": str(key)}

    for source, shared, what in ((mm.items([1, 2]) * mm.grid(key=["G"]), None, "grid parameter"),
                                 (mm.items([1, 2]), {"key": 5}, "shared name")):
        with pytest.raises(ValueError, match=f"{what} 'key' is also the keyword that fit's "
                                             "key= gets each task's key by"):
            mm.train(keyed, source, shared=shared, backend="serial", progress=False)
    assert mm.train(lambda key: {}, mm.grid(key=[1, 2]), backend="serial",
                    progress=False).results["key"].tolist() == [1, 2]
    run = mm.train(lambda a, X: {"a": a}, mm.grid(a=[1, 2]), shared={"X": 0},
                   backend="serial", progress=False)
    assert run.results["metric_a"].tolist() == [1, 2]
    assert mm.train(by_data, mm.items([1]) * mm.grid(alpha=[1]), backend="serial",
                    progress=False).results["status"].tolist() == ["ok"]


def test_a_fit_parameter_no_task_gives_is_refused_before_any_work():
    """fit(df, alpha) with nothing named alpha failed every task ("missing a
    required positional argument") after the run had started them all."""
    frame = pd.DataFrame({"g": [1, 1, 2], "x": [1.0, 2.0, 3.0]})
    serial = {"backend": "serial", "progress": False}
    with pytest.raises(TypeError, match="fit's parameter 'alpha' has no default, and no task "
                                        "gives it one"):
        mm.train(lambda rows, alpha: {}, mm.groups(frame, by="g"), backend="serial",
                 progress=False)
    with pytest.raises(TypeError, match="fit's parameter 'b' has no default"):
        mm.train(lambda a, b: {}, mm.grid(a=[1, 2]), backend="serial", progress=False)
    given = [mm.train(lambda rows, alpha: {}, mm.groups(frame, by="g") * mm.grid(alpha=[1]),
                      **serial),
             mm.train(lambda rows, alpha, key, checkpoint: {}, mm.groups(frame, by="g"),
                      shared={"alpha": 1}, **serial),
             mm.train(lambda rows, resource: {}, mm.groups(frame, by="g"), setup=lambda: 1,
                      **serial),
             mm.train(lambda rows, alpha=1: {}, mm.groups(frame, by="g"), **serial)]
    for run in given:
        assert run.results["status"].tolist() == ["ok"] * len(run.results)


def test_a_grid_parameter_named_as_a_results_column_is_named_as_a_parameter():
    """It was called a key column, with 'rename that column of the table'."""
    with pytest.raises(ValueError, match="the grid parameter 'status' has the name of a "
                                         "column that run.results adds.*rename that "
                                         "parameter"):
        mm.train(lambda status: 1, mm.grid(status=[1, 2]), backend="serial", progress=False)


def test_a_key_not_among_the_models_is_shown_beside_one_that_is():
    """run.models[("a", {"alpha": 0.1})] raised a bare KeyError: a grid's
    key ends with each setting's value, which the error now shows."""
    frame = pd.DataFrame({"s": ["a", "a", "b", "b"], "x": [1.0, 2, 3, 4]})
    run = mm.train(lambda rows, alpha: alpha, mm.groups(frame, by="s") * mm.grid(
        alpha=[0.1, 1.0]), backend="serial", progress=False)
    assert run.models[("a", 0.1)] == 0.1
    for wrong in [("a", {"alpha": 0.1}), ("c", 0.1)]:
        with pytest.raises(KeyError, match=r"is not a key of these models; a key looks like "
                                           r"\('a', 0.1\)"):
            run.models[wrong]
        assert wrong not in run.models
