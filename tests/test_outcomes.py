"""A worker process sends a part whose every task succeeded as columns
(OkOutcomes); the driver records it at once, the same as a tuple a task."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from conftest import count_parts_as_columns
from manymodels.engine.messages import OkOutcomes, Outcome, task_indices
from manymodels.engine.metricpacks import MetricsPack
from manymodels.engine.partpacks import ModelPack

pytestmark = pytest.mark.usefixtures("no_leftovers")


def _outcomes(count: int = 4) -> tuple[list[tuple], ModelPack, MetricsPack]:
    models = ModelPack().seal(list(range(10, 10 + count)), [b"m%d" % i for i in range(count)],
                              hashed=False)
    metrics = MetricsPack(("rss",)).seal(list(range(10, 10 + count)),
                                         [0.5 * i for i in range(count)])
    return ([(10 + i, "ok", models, metrics, 0.001 * i, 1e9 + i, None, False)
             for i in range(count)], models, metrics)


def test_a_part_of_successes_travels_as_columns_and_reads_as_its_tuples():
    outcomes, models, metrics = _outcomes()
    columns = OkOutcomes.of(outcomes)
    assert type(columns) is OkOutcomes and len(columns) == 4
    assert list(columns) == outcomes and columns[2] == outcomes[2]
    assert columns[1:3] == outcomes[1:3] and columns.index(outcomes[3]) == 3
    assert Outcome(*columns[1]).duration_s == 0.001
    assert task_indices(columns) == task_indices(outcomes) == [10, 11, 12, 13]
    sent = pickle.loads(pickle.dumps([columns, models], protocol=5))
    restored = list(sent[0])
    assert all(outcome[2] is sent[1] for outcome in restored)  # the pack once, named by all
    assert sent[0]._models == (sent[1],)

    def plain(outcome):
        return (outcome[0], outcome[1], outcome[4], outcome[5], outcome[6], outcome[7],
                outcome[3].get(outcome[0]))

    assert [plain(outcome) for outcome in restored] == [plain(outcome) for outcome in outcomes]
    np.testing.assert_array_equal(sent[0].durations, columns.durations)


@pytest.mark.parametrize("change", [
    lambda o: (o[0], "failed", None, {}, o[4], o[5], "Traceback", False),  # a failure
    lambda o: (*o[:6], None, True),  # retryable
])
def test_a_part_with_a_failure_travels_as_tuples(change):
    outcomes, _, _ = _outcomes()
    outcomes[2] = change(outcomes[2])
    assert OkOutcomes.of(outcomes) is outcomes
    assert OkOutcomes.of(outcomes[:1]) == outcomes[:1]  # one task: nothing to gain


def test_models_and_metrics_of_their_own_travel_as_lists():
    outcomes, _, _ = _outcomes()
    own = [{"rss": 1.0}, '{"rss": 2.0}', None, {"rss": 4.0}]
    other = ModelPack().seal([11], [b"other"], hashed=False)
    outcomes = [(*o[:2], other if i == 1 else o[2], own[i], *o[4:])
                for i, o in enumerate(outcomes)]
    columns = OkOutcomes.of(outcomes)
    assert type(columns._models) is list and type(columns._metrics) is list
    sent = pickle.loads(pickle.dumps(columns))
    assert [o[3] for o in sent] == own and sent[3][3] == {"rss": 4.0}
    assert [type(o[2]) for o in sent] == [ModelPack] * 4
    assert sent[0][2] is sent[2][2] and sent[1][2] is not sent[0][2]


def fit(data):
    x = np.column_stack([data["x"], np.ones(len(data["x"]))])
    coef = np.linalg.lstsq(x, data["y"], rcond=None)[0]
    return coef, {"slope": float(coef[0])}


@pytest.mark.parametrize("store", [False, True])
def test_columns_record_the_same_results_as_tuples(tmp_path, monkeypatch, store):
    recorded = count_parts_as_columns(monkeypatch)
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"g": np.repeat(np.arange(3000), 4), "x": rng.normal(size=12000)})
    table["y"] = 2 * table["x"] + 1
    source = mm.groups(table, by="g", format="numpy")
    run = mm.train(fit, source, workers=2, progress=False,
                   store=tmp_path / "s" if store else None)
    assert sum(recorded) > 2000  # most parts came as columns
    reference = mm.train(fit, source, backend="serial", progress=False)
    columns = ["g", "status", "attempts", "slope", "error"]
    pd.testing.assert_frame_equal(run.results[columns], reference.results[columns])
    assert set(run.results["worker"]) <= {0, 1} and (run.results["duration_s"] > 0).all()
    assert run.summary().ok == 3000
    np.testing.assert_allclose(run.models[7], reference.models[7])
    if store:
        again = mm.train(fit, source, workers=2, progress=False, store=tmp_path / "s")
        assert again.summary().reused == 3000


class _RefusesItsState:
    """Pickles, but its ``__setstate__`` raises where it is unpickled."""

    def __init__(self):
        self.kept = 1

    def __setstate__(self, state):
        raise RuntimeError("no state here")


class _Vanishing:
    """Stands for a class the driver cannot import (removed once pickled)."""


def test_a_part_whose_values_do_not_unpickle_fails_only_their_tasks(monkeypatch):
    import sys

    from manymodels.engine.dataplane import dumps_spilling, loads_spilled
    from manymodels.engine.outcomeloads import load_outcomes

    big = np.arange(1 << 17, dtype=np.float64)  # spilled: loaded from its file's buffers
    outcomes = [
        (0, "ok", None, {"array": big}, 0.1, 1e9, None, False),
        (1, "ok", None, {"state": [_RefusesItsState()]}, 0.1, 1e9, None, False),
        (2, "ok", None, {"gone": _Vanishing()}, 0.1, 1e9, None, False),
        (3, "failed", None, {}, 0.1, 1e9, "Traceback ...", True),
    ]
    body, spill = dumps_spilling(outcomes, pickle.dumps, "mm-test-unpickle", [0])
    assert spill is not None
    monkeypatch.delattr(sys.modules[__name__], "_Vanishing")
    loaded = loads_spilled(body, spill, loads=load_outcomes)
    assert [o[1] for o in loaded] == ["ok", "failed", "failed", "failed"]
    assert np.array_equal(loaded[0][3]["array"], big)
    assert "rebuilding test_outcomes._RefusesItsState raised RuntimeError: no state" in loaded[1][6]
    assert "rebuilding test_outcomes._Vanishing raised AttributeError" in loaded[2][6]
    assert loaded[3] == outcomes[3]  # a failure of its own, kept as it was


_DRIVER = os.getpid()


class _ExitsInTheDriver:
    """Unpickles in a worker; in the driver its ``__setstate__`` raises
    what it is given (``SystemExit``, as a library that gives up does)."""

    def __init__(self, raises: type[BaseException]) -> None:
        self.raises = raises

    def __setstate__(self, state: dict) -> None:
        if os.getpid() == _DRIVER:
            raise state["raises"]("rebuilt in the driver")
        self.__dict__.update(state)


def _fit_with_a_metric_that_exits_in_the_driver(item):
    return None, {"n": item, **({"odd": _ExitsInTheDriver(SystemExit)} if item == 2 else {})}


def test_a_value_whose_unpickling_raises_system_exit_fails_its_task_not_the_driver():
    """Outcomes were unpickled catching Exception only: the SystemExit left
    the driver's loop, and the program ended with no result and no word."""
    run = mm.train(_fit_with_a_metric_that_exits_in_the_driver, mm.items(range(4)),
                   backend="processes", workers=1, progress=False)
    results = run.results.set_index("item")
    assert results["status"].tolist() == ["ok", "ok", "failed", "ok"]
    assert "raised SystemExit: rebuilt in the driver" in results.loc[2, "error"]
    from manymodels.engine.outcomeloads import load_outcomes

    interrupted = pickle.dumps([(0, "ok", None, {"m": _ExitsInTheDriver(KeyboardInterrupt)},
                                 0.1, 1e9, None, False)])
    with pytest.raises(KeyboardInterrupt):  # (in the driver, a Ctrl-C: it stops the run)
        load_outcomes(interrupted)
