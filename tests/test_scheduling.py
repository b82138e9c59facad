from __future__ import annotations

import pickle
import time

import pandas as pd
import pytest

import manymodels as mm
from conftest import wait_for_workers
from manymodels.engine.backends.serial import SerialBackend
from manymodels.engine.batchsizing import BatchSizer
from manymodels.engine.messages import task_indices


def test_batch_sizes_ramp_then_follow_measured_times():
    sizer = BatchSizer(workers=2, target_s=0.1)
    # one task per worker while nothing is measured, then doubling
    assert [sizer.next_size(10_000) for _ in range(6)] == [1, 1, 1, 2, 4, 8]
    sizer.observe(busy_s=0.001 * 8, tasks=8)  # 1 ms per task
    assert sizer.next_size(10_000) == 100
    assert sizer.next_size(40) == 5  # near the end: spread the rest over the workers
    assert sizer.next_size(3) == 1


def test_every_worker_gets_one_unmeasured_task_before_any_gets_two():
    sizer = BatchSizer(workers=16, target_s=0.1)
    assert [sizer.next_size(1_000) for _ in range(16)] == [1] * 16
    assert sizer.next_size(1_000) == 1 and sizer.next_size(1_000) == 2  # then the ramp


def test_a_second_batch_is_queued_on_a_worker_only_while_tasks_are_short():
    sizer = BatchSizer(workers=4, target_s=0.1)
    assert sizer.batches_per_worker() == 1  # nothing measured yet
    sizer.observe(busy_s=2.0, tasks=1)
    assert sizer.batches_per_worker() == 1  # long tasks: run where a worker is free
    short = BatchSizer(workers=4, target_s=0.1)
    short.observe(busy_s=0.01, tasks=10)
    assert short.batches_per_worker() == 2  # short: the next batch waits at hand
    # one queue shared by the workers (Ray's): two once measured, long or short
    assert BatchSizer(workers=4).batches_per_worker(shared_queue=True) == 1
    assert sizer.batches_per_worker(shared_queue=True) == 2


class _RecordingBackend(SerialBackend):
    """The serial backend posing as 4 workers whose tasks each take ``seconds``;
    it records how many batches per worker the scheduler lets it take."""

    def __init__(self, seconds: float, shared_queue: bool = False) -> None:
        super().__init__(workers=4)
        self.seconds = seconds
        self.shares_one_queue = shared_queue
        self.asked: list[int] = []

    def free_slots(self, per_worker: int) -> int:
        self.asked.append(per_worker)
        return max(0, self.workers * per_worker - len(self._queue))

    def poll(self, timeout: float):
        events = super().poll(timeout)
        for event in events:
            event.busy_s = self.seconds * len(event.outcomes)
        return events


@pytest.mark.parametrize("seconds, shared_queue, expected",
                         [(2.0, False, {1}), (0.001, False, {1, 2}), (2.0, True, {1, 2})])
def test_the_scheduler_queues_a_second_batch_per_worker_only_for_short_tasks(
        seconds, shared_queue, expected):
    backend = _RecordingBackend(seconds, shared_queue)
    run = mm.train(lambda item: item, mm.items(range(40)), backend=backend, progress=False)
    assert run.summary().ok == 40
    assert backend.asked[0] == 1  # nothing measured before the first batch
    assert set(backend.asked) == expected


def _long_or_short(item, rendezvous):
    import os

    if item["s"] == "long":  # lasts until 4 workers run a long task (a minute at most)
        wait_for_workers(rendezvous, 4)
    else:
        time.sleep(0.1)
    return {"pid": os.getpid()}


def test_long_tasks_are_not_queued_behind_each_other(tmp_path):
    # 5 tasks on 4 workers: were a worker given two long ones, the run would
    # take two long tasks; each long one must start on a worker of its own.
    # A long task lasts until all four run at once (so no worker frees up
    # early and takes a second legitimately); one queued behind another
    # would leave three, and the run would end a minute later with three pids.
    seconds = ["long", "long", "long", "long", "short"]
    run = mm.train(_long_or_short, mm.items([{"s": s} for s in seconds],
                                            cost=lambda item: 1.0 if item["s"] == "long" else 0.1),
                   shared={"rendezvous": str(tmp_path)}, backend="processes", workers=4,
                   progress=False)
    results = run.results.assign(s=seconds)
    assert results[results["s"] == "long"]["pid"].nunique() == 4


def test_longest_tasks_start_first():
    sizes = {"small": 5, "huge": 500, "medium": 50, "tiny": 1}
    table = pd.DataFrame({"g": [g for g, n in sizes.items() for _ in range(n)], "x": 1.0})
    run = mm.train(len, mm.groups(table, by="g"), backend="serial", progress=False)
    order = run.results.sort_values("started_s")["g"].tolist()
    assert order == ["huge", "medium", "small", "tiny"]
    custom = mm.train(len, mm.groups(table, by="g", cost=lambda rows: -rows),
                      backend="serial", progress=False)
    assert custom.results.sort_values("started_s")["g"].tolist() == order[::-1]


def test_tiny_tasks_travel_in_batches():
    def noop(item):
        return item

    run = mm.train(noop, mm.items(range(20_000)), workers=2, progress=False)
    assert len(run.models) == 20_000
    assert run.summary().batches < 500  # not one round trip per task


def test_progress_counts_models_not_batches(monkeypatch):
    seen = []
    import manymodels.run.runner as runner  # it hands the scheduler its progress bar

    class Recorder:
        def __init__(self, total, enabled, description="training"):
            seen.append(("total", total))

        def update(self, done, ok, failed):
            seen.append((done, ok, failed))

        def close(self):
            pass

    monkeypatch.setattr(runner, "ProgressBar", Recorder)

    def maybe_fail(item):
        if item % 10 == 0:
            raise ValueError(item)
        time.sleep(0.0005)
        return item

    mm.train(maybe_fail, mm.items(range(300)), workers=2)
    assert seen[0] == ("total", 300)
    assert seen[-1] == (300, 270, 30)
    dones = [entry[0] for entry in seen[1:]]
    assert dones == sorted(dones)


@pytest.mark.parametrize("backend", ["serial", "threads", "processes"])
def test_summary_and_run_repr(backend):
    run = mm.train(abs, mm.items([-1, -2, 3]), backend=backend, progress=False)
    assert "3 ok, 0 failed of 3 tasks" in repr(run)


PROGRESS_SCRIPT = """
import time
import manymodels as mm

def fit(item):
    time.sleep(0.002)
    if item % 50 == 0:
        raise ValueError(item)
    return item

if __name__ == "__main__":
    mm.train(fit, mm.items(range(1000)), workers=2)
"""


def test_progress_bar_renders_on_a_terminal(tmp_path):
    import os
    import pty
    import subprocess
    import sys

    script = tmp_path / "progress.py"
    script.write_text(PROGRESS_SCRIPT)
    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm"}
    process = subprocess.Popen([sys.executable, str(script)], stdout=follower,
                               stderr=follower, env=env)
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    process.wait(timeout=60)
    os.close(leader)
    text = output.decode(errors="replace")
    assert process.returncode == 0
    assert "1000/1000" in text  # counts models, not batches
    assert "980 ok" in text and "20 failed" in text
    assert "models/s" in text


def _fail_every_tenth(item):
    if item % 10 == 0:
        raise ValueError(item)
    return item


@pytest.mark.parametrize("progress, interval, shown", [
    (True, "0", True), (False, "0", False),
    (True, None, False),  # the default 30 s: a quick run leaves no line
])
def test_progress_where_stderr_is_not_a_terminal(capfd, monkeypatch, progress, interval, shown):
    """In a CI log or a pipe the bar was off: an hour-long run showed nothing."""
    import re

    if interval is None:
        monkeypatch.delenv("MANYMODELS_PROGRESS_INTERVAL", raising=False)
    else:
        monkeypatch.setenv("MANYMODELS_PROGRESS_INTERVAL", interval)
    mm.train(_fail_every_tenth, mm.items(range(30)), backend="serial", progress=progress)
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("manymodels:")]
    if not shown:
        assert lines == []
        return
    assert "\r" not in err and "\x1b" not in err
    assert all(re.fullmatch(r"manymodels: training [\d,]+/30 models \(\d+%\), \d+ ok, \d+ "
                            r"failed, .* models/s, 0:00:00 elapsed(, eta 0:00:\d\d)?", line)
               for line in lines), lines
    assert lines[-1].startswith("manymodels: training 30/30 models (100%), 27 ok, 3 failed, ")
    assert "eta" not in lines[-1]


def test_a_wrong_progress_interval_is_refused_by_name_before_any_work(monkeypatch):
    monkeypatch.setenv("MANYMODELS_PROGRESS_INTERVAL", "soon")
    with pytest.raises(ValueError, match="MANYMODELS_PROGRESS_INTERVAL='soon'"):
        mm.train(_never_called, mm.items(range(3)), backend="serial")
    assert mm.train(abs, mm.items([-1]), backend="serial", progress=False).summary().ok == 1


def _never_called(item):
    raise AssertionError("trained before the refusal")


def test_the_live_bar_shows_in_jupyter_with_ipywidgets(monkeypatch):
    """rich draws its bar in a notebook (stderr not a terminal) through ipywidgets."""
    import builtins
    import io

    from manymodels.observe import progress

    class ZMQInteractiveShell:  # ipykernel's shell, as rich's Console detects it
        pass

    assert not progress.live_bar_fits(io.StringIO())
    monkeypatch.setattr(builtins, "get_ipython", ZMQInteractiveShell, raising=False)
    for widgets in (True, False):
        monkeypatch.setattr(progress, "_has_ipywidgets", lambda widgets=widgets: widgets)
        assert progress.live_bar_fits(io.StringIO()) is widgets


# -- the plan as columns ------------------------------------------------------------


def test_a_columnar_plan_makes_the_tasks_the_rows_would():
    from manymodels.planning.plan import Task, plan

    frame = pd.DataFrame({"g": ["b", "a", "b", "c", "a", "b"], "x": range(6)})
    tasks = plan(mm.groups(frame, by="g", cost=lambda n: n * 10.0)).tasks
    assert len(tasks) == 3 and tasks.params is None
    assert list(tasks) == [Task(0, "a", (0, 2), None, 20.0), Task(1, "b", (2, 3), None, 30.0),
                           Task(2, "c", (5, 1), None, 10.0)]
    assert tasks[-1] == tasks[2] and tasks[1:] == [tasks[1], tasks[2]]
    with pytest.raises(IndexError):
        tasks[3]
    assert tasks.keys() == ["a", "b", "c"]
    columns = tasks.batch([2, 0], None)  # a table's groups: as columns (SliceBatch)
    assert list(columns) == [(2, (5, 1), None), (0, (0, 2), None)]
    assert type(columns).__name__ == "SliceBatch" and columns[1] == (0, (0, 2), None)
    sent = pickle.loads(pickle.dumps(columns))
    assert list(sent) == list(columns) and list(sent[1:]) == [(0, (0, 2), None)]
    assert task_indices(sent) == [2, 0] == task_indices(list(columns))
    assert tasks.batch([1], ["a", "b", "c"]) == [(1, (2, 3), {"key": "b"})]


def test_a_plan_of_groups_times_settings_repeats_each_group_per_setting():
    from manymodels.planning.plan import plan

    frame = pd.DataFrame({"g": [2, 1, 2], "x": range(3)})
    source = mm.groups(frame, by="g") * mm.grid(alpha=[0.1, 1.0])
    p = plan(source)
    tasks = p.tasks
    assert p.key_rows == [(1, 0.1), (1, 1.0), (2, 0.1), (2, 1.0)]
    assert [t.key for t in tasks] == [(1, 0.1), (1, 1.0), (2, 0.1), (2, 1.0)]
    assert [t.data for t in tasks] == [(0, 1), (0, 1), (1, 2), (1, 2)]
    assert [t.params for t in tasks] == [{"alpha": 0.1}, {"alpha": 1.0}] * 2
    assert list(tasks.costs) == [1.0, 1.0, 2.0, 2.0]
    assert tasks.batch([3], [1, 1, 2, 2]) == [(3, (1, 2), {"alpha": 1.0, "key": 2})]


def test_the_longest_tasks_are_planned_first_ties_in_source_order():
    frame = pd.DataFrame({"g": [1, 2, 2, 3, 4, 4], "x": range(6)})
    seen = []
    run = mm.train(lambda data, key: seen.append(key) or 0.0, mm.groups(frame, by="g"),
                   backend="serial", progress=False)
    assert run.summary().ok == 4
    assert seen == [2, 4, 1, 3]
