"""The scheduler's per-task records are typed columns (issue 43: at ten
million tasks, seven Python lists of a slot a task were most of what the
driver held beyond the table): statuses as codes, decoded where a table is
made, errors kept only for the tasks that have one, and nothing reused kept
when nothing was. Each must read as the lists did."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.engine.messages import Outcome, Status
from manymodels.engine.records import TaskRecords
from manymodels.engine.scheduling import Scheduler


def _scheduler(tasks: int, retries: int = 0) -> Scheduler:
    scheduler = Scheduler.__new__(Scheduler)  # the bookkeeping alone, no backend
    scheduler.watch_ok = None
    scheduler.records, scheduler.recorder = TaskRecords(tasks, retries), None
    scheduler.retries = retries
    scheduler._done = scheduler._ok = scheduler._failed = 0
    scheduler._last_attempt = {}
    return scheduler


def test_the_columns_are_typed_arrays_and_only_model_and_metrics_are_lists():
    records = TaskRecords(5)
    assert (records.status_code.dtype, records.attempts.dtype, records.worker.dtype) == (
        np.int8, np.int16, np.int32)
    assert records.reused_from is None and records.errors == {}
    assert isinstance(records.model, list) and isinstance(records.metrics, list)
    assert records.status_names().tolist() == [None] * 5 and records.error_column() is None
    # retries past what int16 counts widen the attempts column (never wrap)
    assert TaskRecords(2, retries=40_000).attempts.dtype == np.int64


def test_a_batch_of_tuples_records_ok_failed_and_retried_tasks():
    scheduler = _scheduler(4, retries=1)
    retry = scheduler._record_all([
        Outcome(0, Status.OK.value, "model", {"m": 1.0}, 0.5, 10.0, None, False),
        Outcome(1, Status.FAILED.value, None, None, 0.25, 11.0, "Traceback: boom", False),
        Outcome(2, Status.FAILED.value, None, None, 0.125, 12.0, "flaky", True),
    ], worker=3)
    records = scheduler.records
    assert retry == [2]  # retryable, first attempt: not recorded as ended
    assert records.status_names().tolist() == ["ok", "failed", None, None]
    assert records.attempts.tolist() == [1, 1, 1, 0]
    assert records.worker.tolist() == [3, 3, -1, -1]
    assert records.duration_s[:3].tolist() == [0.5, 0.25, 0.125]
    assert records.errors == {1: "Traceback: boom"}
    assert records.error_column([0, 1]) == [None, "Traceback: boom"]
    assert records.model[0] == "model" and records.metrics[0] == {"m": 1.0}
    assert (scheduler._done, scheduler._ok, scheduler._failed) == (2, 1, 1)
    # the retry succeeds: its second attempt, no error left
    assert scheduler._record_all([Outcome(2, Status.OK.value, "again", {}, 0.1, 13.0, None,
                                          False)], worker=0) == []
    assert records.status_of(2) == Status.OK and records.attempts[2] == 2
    assert 2 not in records.errors


def _boom_on_odd(data):
    if int(data["g"].iloc[0]) % 2:
        raise ValueError("odd group")
    return float(data["y"].mean()), {"mean": float(data["y"].mean())}


def test_results_summary_and_store_read_the_codes_as_text(tmp_path):
    frame = pd.DataFrame({"g": np.repeat(np.arange(6), 2), "y": np.arange(12.0)})
    run = mm.train(_boom_on_odd, mm.groups(frame, by="g"), backend="serial", progress=False,
                   store=tmp_path / "store")
    results = run.results
    assert results["status"].tolist() == ["ok", "failed"] * 3
    assert results["attempts"].dtype == np.int64
    assert results["worker"].dtype == np.int64 and results["reused"].dtype == bool
    assert results["error"].isna().tolist() == [True, False] * 3
    assert "odd group" in results["error"].iloc[1]
    summary = run.summary()
    assert (summary.ok, summary.failed, summary.reused) == (3, 3, 0)
    assert summary.statuses == {"ok": 3, "failed": 3}
    stored = mm.Store(tmp_path / "store").results(run=run.run_id)
    assert stored["status"].tolist() == ["ok", "failed"] * 3
    assert stored["error"].isna().tolist() == [True, False] * 3
    again = mm.train(_boom_on_odd, mm.groups(frame, by="g"), backend="serial",
                     progress=False, store=tmp_path / "store")
    assert again.results["reused"].tolist() == [True, False] * 3
    assert again._records.reused_from.tolist() == [run.run_id, -1] * 3
    assert again.summary().reused == 3 and again.results["attempts"].tolist() == [0, 1] * 3


@pytest.mark.parametrize("index", [0, 3])
def test_a_status_is_set_from_a_member_or_its_text(index):
    records = TaskRecords(4)
    records.set_status(index, Status.CRASHED)  # a Status member or its text
    assert records.status_of(index) == "crashed"
    assert records.ended_mask().sum() == 1


def test_a_metrics_pack_of_consecutive_tasks_keeps_its_first_task_not_each():
    import pickle

    from manymodels.engine.metricpacks import MetricsPack

    values = [float(v) for v in range(8)]
    consecutive = pickle.loads(pickle.dumps(MetricsPack(("a", "b")).seal(
        [10, 11, 12, 13], values, texts=True)))
    scattered = pickle.loads(pickle.dumps(MetricsPack(("a", "b")).seal(
        [13, 10, 12, 11], values, texts=True)))
    assert consecutive._indices is None and consecutive._first == 10
    assert consecutive.indices.tolist() == [10, 11, 12, 13] and len(consecutive) == 4
    assert consecutive.get(12) == {"a": 4.0, "b": 5.0} == scattered.get(12)
    wanted = np.array([12, 10])
    assert consecutive.rows_of(wanted).tolist() == [[4.0, 5.0], [0.0, 1.0]]
    assert scattered.rows_of(wanted).tolist() == [[4.0, 5.0], [2.0, 3.0]]
    assert consecutive.texts_of(wanted).to_pylist() == [consecutive.texts[2].as_py(),
                                                         consecutive.texts[0].as_py()]
    assert consecutive.texts_of(consecutive.indices) is consecutive.texts  # whole, as it came
    with pytest.raises(KeyError):
        consecutive.get(14)


def test_the_tasks_to_run_are_a_range_when_already_longest_first():
    from manymodels.engine.scheduling import _longest_first

    everything = np.ones(4, dtype=bool)
    assert _longest_first(everything, np.array([5.0, 5.0, 3.0, 1.0])) == range(4)
    rising = _longest_first(everything, np.array([1.0, 5.0, 5.0, 3.0]))
    assert rising.dtype == np.int32 and rising.tolist() == [1, 2, 3, 0]
    some = _longest_first(np.array([True, False, True, True]), np.array([5.0, 9.0, 3.0, 4.0]))
    assert some.tolist() == [0, 3, 2]


def test_tasks_of_equal_cost_go_out_in_the_order_their_data_lies():
    """An engine's staged groups lie one a partition's file in key order: a
    batch of equal-cost groups in key order took a slice of every file. Among
    equal costs the tasks go out by their place in the files."""
    from manymodels.engine.scheduling import _longest_first
    from manymodels.planning.taskdata import StagedRefs

    everything = np.ones(5, dtype=bool)
    refs = StagedRefs(np.array([1, 0, 1, 0, 0]), np.array([0, 0, 7, 3, 9]),
                      np.array([3, 3, 3, 3, 2]))
    locality = refs.locality()
    costs = refs.lengths
    assert _longest_first(everything, costs, locality).tolist() == [1, 3, 0, 2, 4]
    in_place = _longest_first(everything, np.array([3, 3, 2, 2, 2]), np.arange(5))
    assert in_place == range(5)
    some = _longest_first(np.array([True, True, False, True, True]), costs, locality)
    assert some.tolist() == [1, 3, 0, 4]


def test_the_identity_prefixes_are_a_view_of_the_identities():
    frame = pd.DataFrame({"g": np.repeat(np.arange(5), 2), "y": np.arange(10.0)})
    from manymodels.identity.hashing import task_identities
    from manymodels.planning.plan import plan

    identities, _ = task_identities(plan(mm.groups(frame, by="g")), _boom_on_odd, None)
    assert np.shares_memory(identities.prefixes, identities._identity)
    assert identities.prefixes.tolist() == identities._identity[:, 0].tolist()


def test_planning_holds_no_copy_of_the_key_column_nor_of_the_lengths_as_costs():
    import pyarrow as pa

    from manymodels.inputs.tables import _one_chunk
    from manymodels.planning.plan import plan

    chunk = pa.array(np.arange(1_000))
    assert _one_chunk(pa.chunked_array([chunk])).buffers()[1].address == \
        chunk.buffers()[1].address  # combine_chunks copied even one chunk
    assert _one_chunk(pa.chunked_array([chunk[:10], chunk[10:]])).equals(chunk)
    frame = pd.DataFrame({"g": np.repeat(np.arange(5), 3), "y": np.arange(15.0)})
    tasks = plan(mm.groups(frame, by="g")).tasks
    assert tasks.costs is tasks.refs.lengths and tasks[0].cost == 3.0


def test_the_freed_memory_goes_back_while_a_store_records(monkeypatch, tmp_path):
    from manymodels.store import recorder

    calls = []
    monkeypatch.setattr(recorder, "RETURN_FREED_EVERY_S", 0.0)
    monkeypatch.setattr(recorder, "return_freed_memory", lambda: calls.append(1))
    frame = pd.DataFrame({"g": np.repeat(np.arange(6), 2), "y": np.arange(12.0)})
    run = mm.train(_boom_on_odd, mm.groups(frame, by="g"), backend="serial", progress=False,
                   store=tmp_path / "store")
    assert run.summary().ok == 3 and calls  # after the writer's commits
    monkeypatch.undo()
    recorder.return_freed_memory()  # the real one: on any platform, it does not raise
