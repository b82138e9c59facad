"""Issue 37, items 17 and 18: ``Store.runs()`` gives its times as timestamps
(UTC), as the command line shows them (local time); the run summary names
its workers in words."""

from __future__ import annotations

import json
from datetime import datetime

import pandas as pd
import pytest

import manymodels as mm
from conftest import run_cli


def fit(item):
    return item, {"value": float(item)}


def test_store_runs_gives_utc_timestamps_and_the_command_line_the_same_instants(tmp_path):
    store = tmp_path / "s"
    before = pd.Timestamp.now(tz="UTC").floor("s")
    mm.train(fit, mm.items(range(3)), store=store, backend="serial", progress=False)
    after = pd.Timestamp.now(tz="UTC").ceil("s")
    runs = mm.Store(store).runs()
    for column in ("started_at", "finished_at"):
        assert isinstance(runs[column].dtype, pd.DatetimeTZDtype), runs.dtypes
        assert str(runs[column].dt.tz) == "UTC"
        assert before <= runs[column].iloc[0] <= after
    assert runs["started_at"].iloc[0] <= runs["finished_at"].iloc[0]

    listed = run_cli("runs", store, "--format", "json")
    assert listed.returncode == 0, listed.stderr
    shown = datetime.fromisoformat(json.loads(listed.stdout)[0]["started_at"])
    assert shown.utcoffset() is not None  # local time with its offset
    assert abs(pd.Timestamp(shown) - runs["started_at"].iloc[0]) < pd.Timedelta("1ms")
    table = run_cli("runs", store)
    assert table.returncode == 0, table.stderr
    local = runs["started_at"].iloc[0].to_pydatetime().astimezone()
    assert local.strftime("%Y-%m-%d %H:%M:%S %z") in table.stdout  # with its offset

    report = run_cli("report", store, "--out", tmp_path / "r.html")
    assert report.returncode == 0, report.stderr
    assert local.strftime("%Y-%m-%d %H:%M:%S") in (tmp_path / "r.html").read_text()


def test_a_store_with_no_runs_still_has_timestamp_columns(tmp_path):
    mm.Store(tmp_path / "empty", read_only=False)  # (open to write: an empty store made)
    runs = mm.Store(tmp_path / "empty").runs()
    assert runs.empty and isinstance(runs["started_at"].dtype, pd.DatetimeTZDtype)


@pytest.mark.parametrize(("backend", "workers", "words"), [
    ("serial", 1, "on 1 serial worker,"),
    ("threads", 2, "on 2 thread workers,"),
    ("processes", 1, "on 1 process worker,"),
    ("processes", 2, "on 2 process workers,"),
])
def test_the_summary_names_its_workers_in_words(backend, workers, words):
    run = mm.train(fit, mm.items(range(4)), backend=backend, workers=workers, progress=False)
    text = str(run.summary())
    assert words in text, text
    assert "(s)" not in text and "(es)" not in text


def test_a_summary_of_ray_workers_and_one_batch_reads_naturally():
    from manymodels.run.results import Summary

    summary = Summary(tasks=1, ok=1, failed=0, statuses={}, wall_s=1.0, task_time_s=0.5,
                      workers=8, backend="ray", utilization=0.1, batches=3)
    assert "on 8 Ray workers, 3 batches" in str(summary)
    one = Summary(tasks=1, ok=1, failed=0, statuses={}, wall_s=1.0, task_time_s=0.5,
                  workers=1, backend="threads", utilization=0.5, batches=1)
    assert "on 1 thread worker, 1 batch\n" in str(one)
