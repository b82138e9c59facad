"""What the driver keeps and does per task while a store records a run
(issue 43): finished parts recorded by slices, hand-overs gathered by runs of
consecutive tasks, and each hand-over's identity texts made from its rows'
lanes (the whole columns are never held as text). Each shortcut must give
what the general path gives."""

from __future__ import annotations

import operator

import numpy as np
import pandas as pd
import pyarrow as pa

import manymodels as mm
from manymodels.engine.messages import OkOutcomes, Status
from manymodels.engine.records import TaskRecords, _consecutive
from manymodels.engine.scheduling import Scheduler
from manymodels.identity.hashing import task_identities
from manymodels.planning.plan import plan
from manymodels.store import taskblocks
from manymodels.store.recorder import _runs, _taken


def _scheduler(tasks: int) -> Scheduler:
    scheduler = Scheduler.__new__(Scheduler)  # the bookkeeping alone, no backend
    scheduler.watch_ok = None
    scheduler.records, scheduler.recorder = TaskRecords(tasks), None
    scheduler._done = scheduler._ok = scheduler._failed = 0
    scheduler._last_attempt = {}
    return scheduler


def _part(indices: list[int], pack: object, metrics: object) -> OkOutcomes:
    count = len(indices)
    return OkOutcomes(np.array(indices, dtype=np.int64), np.full(count, 0.5),
                      np.full(count, 7.0), (pack,), (metrics,))


def test_a_part_of_consecutive_tasks_is_recorded_as_one_of_scattered_tasks_is():
    assert _consecutive(np.array([4, 5, 6])) == slice(4, 7)
    assert _consecutive(np.array([4, 6, 5])) is None and _consecutive(np.array([3])) is None
    by_slices, one_by_one = _scheduler(10), _scheduler(10)
    for scheduler, order in ((by_slices, [2, 3, 4, 5]), (one_by_one, [5, 3, 2, 4])):
        scheduler.records.attempts[3] = 1  # tried once before (a retry)
        scheduler._record_ok(_part(order, "pack", "metrics"), worker=1)
    for name in ("status_code", "attempts", "worker"):
        assert (getattr(by_slices.records, name) == getattr(one_by_one.records, name)).all()
    for name in ("model", "metrics", "errors"):
        assert getattr(by_slices.records, name) == getattr(one_by_one.records, name), name
    records = by_slices.records
    assert records.attempts[2:6].tolist() == [1, 2, 1, 1] and records.attempts[6] == 0
    assert records.status_names()[2:6].tolist() == [Status.OK.value] * 4
    assert records.status_of(1) is None and records.status_of(2) == Status.OK
    assert records.model[2:6] == ["pack"] * 4 and records.worker[2:6].tolist() == [1] * 4
    assert records.reused_from is None and not records.reused_mask().any()
    assert by_slices._done == by_slices._ok == 4


def test_a_hand_over_is_gathered_by_runs_as_by_indices():
    column = [f"task {i}" for i in range(1_000)]
    parts = [*range(100, 300), *range(0, 100), *range(600, 1_000), 450]
    runs = _runs(np.array(parts))
    assert runs == [(100, 300), (0, 100), (600, 1_000), (450, 451)]
    assert _taken(column, parts, runs) == list(operator.itemgetter(*parts)(column))
    scattered = list(range(0, 1_000, 3))  # no runs worth slicing
    assert _runs(np.array(scattered)) is None and _runs(np.arange(10)) is None


def test_a_hand_overs_identity_texts_are_made_from_its_rows_alone():
    frame = pd.DataFrame({"g": np.repeat(np.arange(50), 3), "x": np.arange(150.0)})
    identities, _ = task_identities(plan(mm.groups(frame, by="g")), lambda data: 1, None)
    keys = pa.array([str(i) for i in range(50)])
    rows = pa.array(np.array([7, 3, 40, 41], dtype=np.int64))
    columns = taskblocks.task_columns(keys, identities, rows)
    assert isinstance(identities._identity, np.ndarray)  # not made whole as text
    assert isinstance(identities._data, np.ndarray)
    assert columns["identity"].equals(identities.identity.take(rows))
    assert columns["data_hash"].equals(identities.data.take(rows))
    # once held as text, the text is taken
    again = taskblocks.task_columns(keys, identities, rows)
    assert again["identity"].equals(columns["identity"])
    assert again["data_hash"].equals(columns["data_hash"])
