"""Callbacks, and MLflow tracking against a real local MLflow store (SQLite)."""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.observe.callbacks import Callbacks


def fit_line(x):
    if x == 3:
        raise ValueError("three is refused")
    from sklearn.linear_model import Ridge

    features = np.arange(20.0).reshape(-1, 1)
    model = Ridge(alpha=1e-6).fit(features, features[:, 0] * x)
    return model, {"r2": 1 - 1 / (x + 2), "rmse": float(x), "r²": 0.5}


def fit_refusing_low(x):
    if x < 5:
        raise ValueError("too low")
    return {"x": x}


class Recorder(mm.Callback):
    def __init__(self):
        self.info, self.tasks, self.batches, self.end = None, [], [], None

    def on_run_start(self, info):
        self.info = info

    def on_task_finished(self, task):
        self.tasks.append(task)

    def on_batch(self, progress):
        self.batches.append(progress)

    def on_run_end(self, run):
        self.end = run


class CountsOnly(mm.Callback):
    def __init__(self):
        self.last = None

    def on_batch(self, progress):
        self.last = progress


class Broken(mm.Callback):
    calls = 0

    def on_batch(self, progress):
        Broken.calls += 1
        raise RuntimeError("tracker is down")


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_callbacks_see_every_task_each_round_and_the_end(tmp_path, backend):
    seen = Recorder()
    run = mm.train(fit_line, mm.items(range(40)), backend=backend, workers=2, progress=False,
                   store=tmp_path / "store", callbacks=[seen])
    assert seen.info.tasks == 40 and seen.info.key_columns == ["item"]
    assert seen.info.run_id == run.run_id and seen.info.code["code_hash"]
    assert sorted(t.key for t in seen.tasks) == list(range(40))  # each once
    failed = [t for t in seen.tasks if t.status != "ok"]
    assert [t.key for t in failed] == [3] and "three is refused" in failed[0].error
    assert all(t.metrics["rmse"] == t.key for t in seen.tasks if t.status == "ok")
    assert seen.batches and seen.batches[-1].done == 40 and seen.batches[-1].failed == 1
    assert [b.done for b in seen.batches] == sorted(b.done for b in seen.batches)
    assert seen.end is run


def test_the_end_is_told_when_the_error_budget_stops_the_run():
    seen = Recorder()
    with pytest.raises(mm.TooManyFailures) as stopped:
        mm.train(fit_refusing_low, mm.items(range(40)), backend="serial", max_failures=2,
                 progress=False, callbacks=[seen])
    assert seen.end is stopped.value.run
    failed = [t.key for t in seen.tasks if t.status == "failed"]
    assert len(failed) >= 3 and all(key < 5 for key in failed)


def test_no_per_task_events_unless_a_callback_wants_them():
    counts = CountsOnly()
    assert not Callbacks([counts], None, None).wants_tasks
    assert Callbacks([counts, Recorder()], None, None).wants_tasks
    mm.train(fit_line, mm.items(range(10)), backend="threads", progress=False,
             callbacks=counts)
    assert counts.last.done == 10 and counts.last.total == 10


def test_a_callback_that_raises_is_warned_about_and_the_run_goes_on():
    Broken.calls = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = mm.train(fit_line, mm.items(range(30)), backend="threads", workers=2,
                       progress=False, callbacks=[Broken()])
    assert len(run.ok) == 29 and Broken.calls == 1
    assert any("Broken.on_batch raised RuntimeError: tracker is down" in str(w.message)
               for w in caught)


def test_bad_callbacks_are_refused_before_work():
    with pytest.raises(TypeError, match=r"callbacks\[1\] \(int\)"):
        mm.train(fit_line, mm.items(range(3)), callbacks=[Recorder(), 42])
    with pytest.raises(ValueError, match="dashboard=True needs store="):
        mm.train(fit_line, mm.items(range(3)), dashboard=True)
    with pytest.raises(ValueError, match="log_models"):
        mm.MLflow(log_models=-1)


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    pytest.importorskip("mlflow")
    root = tmp_path_factory.mktemp("mlflow")
    return root, f"sqlite:///{root / 'mlflow.db'}"


def test_mlflow_gets_one_run_with_params_metrics_artifacts_and_best_models(
        tracking, tmp_path, monkeypatch):
    import mlflow
    import mlflow.sklearn

    root, uri = tracking
    monkeypatch.chdir(root)  # MLflow's default artifact root is ./mlruns
    tracker = mm.MLflow(experiment="lines", tracking_uri=uri, log_models=2, metric="rmse",
                        tags={"team": "forecasting"})
    run = mm.train(fit_line, mm.items(range(25)), workers=2, progress=False,
                   store=tmp_path / "store", track=tracker)
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("lines")
    logged = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in logged] == [tracker.run_id]  # one run, not one per model
    got = logged[0]
    assert got.info.status == "FINISHED"
    params, metrics, tags = got.data.params, got.data.metrics, got.data.tags
    assert params["fit"].endswith("fit_line") and params["option.workers"] == "2"
    assert params["code_hash"] == run.store._conn.execute(
        "SELECT json_extract(code_detail, '$.code_hash') FROM runs").fetchone()[0]
    assert tags["team"] == "forecasting" and tags["manymodels.run_id"] == str(run.run_id)
    assert metrics["ok"] == 24 and metrics["failed"] == 1 and metrics["tasks"] == 25
    assert metrics["wall_s"] == pytest.approx(run.wall_s)
    rmse = run.ok["rmse"]
    assert metrics["rmse.mean"] == pytest.approx(rmse.mean())
    assert metrics["rmse.p50"] == pytest.approx(rmse.median())
    assert metrics["r2.p95"] == pytest.approx(run.ok["r2"].quantile(0.95))
    assert 0 < metrics["utilization"] <= 1.05
    # a name MLflow refuses, made one it takes, told apart from r³'s by a tag
    (r2_mean,) = [name for name in metrics if re.fullmatch(r"r__[0-9a-f]{6}\.mean", name)]
    assert metrics[r2_mean] == 0.5
    names = {a.path for a in client.list_artifacts(tracker.run_id)}
    assert {"results.parquet", "report.html", "models"} <= names
    table = pd.read_parquet(client.download_artifacts(tracker.run_id, "results.parquet",
                                                      str(tmp_path)))
    assert len(table) == 25 and set(table["status"]) == {"ok", "failed"}
    report = client.download_artifacts(tracker.run_id, "report.html", str(tmp_path))
    assert "three is refused" in Path(report).read_text()
    # the two best by rmse (lowest): items 0 and 1, loadable as MLflow models
    assert tags["manymodels.model-1"].startswith("0: rmse=")
    assert tags["manymodels.model-2"].startswith("1: rmse=")
    mlflow.set_tracking_uri(uri)
    best = mlflow.sklearn.load_model(f"runs:/{tracker.run_id}/models/model-2")
    assert best.coef_[0] == pytest.approx(1.0, abs=1e-3)  # item 1's slope


def test_cli_train_logs_to_mlflow(tracking, tmp_path):
    import mlflow

    root, uri = tracking
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"store": np.repeat(["a", "b", "c"], 60),
                          "price": rng.uniform(1, 9, 180)})
    frame["sales"] = 30 - 2 * frame["price"] + rng.normal(0, 0.3, 180)
    frame.to_csv(tmp_path / "sales.csv", index=False)
    result = subprocess.run(
        [sys.executable, "-m", "manymodels.cli", "train", str(tmp_path / "sales.csv"),
         "--by", "store", "--target", "sales", "--model", "sklearn.linear_model.Ridge",
         "--store", str(tmp_path / "store"), "--workers", "2", "--mlflow", "cli-runs"],
        capture_output=True, text=True, timeout=300, cwd=root,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri})
    assert result.returncode == 0, result.stderr[-3000:]
    client = mlflow.MlflowClient(uri)
    logged = client.search_runs([client.get_experiment_by_name("cli-runs").experiment_id])
    assert len(logged) == 1
    assert logged[0].data.metrics["ok"] == 3 and "r2.mean" in logged[0].data.metrics


def model_only(x):
    return x * 2.0


def two_metrics(x):
    return x, {"rmse": float(x), "n": 3}


@pytest.mark.parametrize("fit, metrics", [(model_only, {}), (two_metrics, {"n": 3})])
def test_a_stores_tasks_reach_callbacks_with_their_metrics_as_a_dict(tmp_path, fit, metrics):
    """With a store, worker processes send metrics as JSON text: a callback
    still gets a dict (an empty one for a fit that returns a model alone)."""
    seen = Recorder()
    mm.train(fit, mm.items(range(6)), store=tmp_path / "s", backend="processes", workers=2,
             progress=False, callbacks=[seen])
    assert len(seen.tasks) == 6
    for task in seen.tasks:
        assert isinstance(task.metrics, dict)
        assert {k: v for k, v in task.metrics.items() if k != "rmse"} == metrics


def _no_metrics(item):
    return item


def test_an_mlflow_run_whose_end_fails_is_marked_failed_not_left_running(
        tracking, tmp_path, monkeypatch):
    """The best models ranked by a metric fit never reports: the error came
    after training, and the MLflow run stayed RUNNING for ever."""
    import mlflow

    root, uri = tracking
    monkeypatch.chdir(root)
    tracker = mm.MLflow(experiment="ends", tracking_uri=uri, log_models=1, metric="rmse")
    with pytest.warns(RuntimeWarning):  # a callback's failure is warned about, the run kept
        run = mm.train(_no_metrics, mm.items(range(3)), backend="serial", progress=False,
                       track=tracker)
    assert run.summary().ok == 3
    got = mlflow.MlflowClient(uri).get_run(tracker.run_id)
    assert got.info.status == "FAILED"


def _slow_item(x):
    import time

    time.sleep(0.05)
    return None, {"rmse": float(x)}


def test_one_tracker_shared_by_two_threads_logs_each_run_to_its_own_mlflow_run(
        tracking, tmp_path, monkeypatch):
    """Two threads of one program train at once with one mm.MLflow: each
    manymodels run's progress and end go to its own MLflow run, and both end
    FINISHED (the second run's start took over the first's before)."""
    import threading

    import mlflow

    root, uri = tracking
    monkeypatch.chdir(root)
    tracker = mm.MLflow(experiment="shared-by-threads", tracking_uri=uri, timeout=20)
    started, runs, errors = threading.Barrier(2), {}, []

    def train(count: int) -> None:
        try:
            started.wait()
            runs[count] = mm.train(_slow_item, mm.items(range(count)), backend="serial",
                                   progress=False, track=tracker)
        except BaseException as exc:  # (reported below: a thread's exception is lost)
            errors.append(exc)

    threads = [threading.Thread(target=train, args=(count,)) for count in (6, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and sorted(runs) == [6, 9]
    client = mlflow.MlflowClient(uri)
    experiment = client.get_experiment_by_name("shared-by-threads")
    logged = client.search_runs([experiment.experiment_id])
    assert len(logged) == 2 and {r.info.status for r in logged} == {"FINISHED"}
    tasks = sorted(r.data.metrics["tasks"] for r in logged)
    assert tasks == [6, 9]
    for r in logged:  # each run's own progress, to its own end
        assert r.data.metrics["progress.done"] == r.data.metrics["tasks"]
        assert r.data.metrics["rmse.mean"] == pytest.approx(
            np.mean(range(int(r.data.metrics["tasks"]))))


def fit_with_an_infinite_score(x):
    return {"score": math.inf if x == 2 else float(x)}


def test_an_infinite_metric_value_leaves_the_others_summary_whole(tracking):
    """One task's score of inf: its mean, std, p95 and max were infinite or
    NaN and dropped, silently, with NumPy's warning."""
    import warnings

    import mlflow

    _, uri = tracking
    tracker = mm.MLflow(experiment="scores", tracking_uri=uri)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        mm.train(fit_with_an_infinite_score, mm.items(range(8)), backend="serial",
                 progress=False, track=tracker)
    metrics = mlflow.MlflowClient(uri).get_run(tracker.run_id).data.metrics
    finite = np.array([0.0, 1, 3, 4, 5, 6, 7])
    assert metrics["score.mean"] == pytest.approx(finite.mean())
    assert metrics["score.std"] == pytest.approx(finite.std())
    assert metrics["score.p95"] == pytest.approx(np.quantile(finite, 0.95))
    assert metrics["score.max"] == 7 and metrics["score.count"] == 7
    assert metrics["score.nonfinite"] == 1


def fit_with_a_nan_an_infinite_score_and_a_failure(x):
    if x == 5:
        raise ValueError("no score for 5")
    return {"score": math.nan if x == 2 else math.inf if x == 3 else float(x)}


def test_a_nan_metric_value_is_counted_as_nonfinite_but_a_failed_task_is_not(tracking):
    """A NaN a fit returned was dropped with the failed tasks' empty cells,
    so ``.nonfinite`` counted the infinite values only."""
    import mlflow

    _, uri = tracking
    tracker = mm.MLflow(experiment="nan-scores", tracking_uri=uri)
    mm.train(fit_with_a_nan_an_infinite_score_and_a_failure, mm.items(range(8)),
             backend="serial", progress=False, track=tracker)
    metrics = mlflow.MlflowClient(uri).get_run(tracker.run_id).data.metrics
    assert metrics["score.count"] == 5 and metrics["score.max"] == 7  # 0, 1, 4, 6, 7
    assert metrics["score.nonfinite"] == 2  # the NaN and the inf; not the failed task


class RaisesBelowItsHook(mm.Callback):
    def on_batch(self, progress):
        self.send(progress)

    def send(self, progress):
        raise ConnectionError("tracker is down\nretry later")  # the line the warning names


def test_a_raising_callbacks_warning_names_the_exception_and_the_line_that_raised():
    """The warning gave only ``repr(exc)`` and pointed at observe/callbacks.py:
    now the exception's line (type and message) and the file:line, in the
    callback's own code, that raised; the warning is shown at that line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mm.train(fit_line, mm.items(range(3)), backend="serial", progress=False,
                 callbacks=[RaisesBelowItsHook()])
    raised = [w for w in caught if "RaisesBelowItsHook.on_batch raised" in str(w.message)]
    assert len(raised) == 1
    line = next(number for number, text in enumerate(Path(__file__).read_text().splitlines(), 1)
                if "the line the warning names" in text)
    message = str(raised[0].message)
    assert "raised ConnectionError: tracker is down\nretry later" in message
    assert f"(at {__file__}:{line}, in send)" in message
    assert (raised[0].filename, raised[0].lineno) == (__file__, line)


class MisspelledHooks(mm.Callback):
    def __init__(self):
        self.calls = 0

    def on_start(self, info):
        self.calls += 1

    def on_task(self, task):
        self.calls += 1

    def on_end(self, run):
        self.calls += 1


def test_misspelled_hooks_are_warned_about_when_the_run_starts():
    """``on_start``, ``on_task``, ``on_end``: accepted and never called, in
    silence. Each is now named in a warning, with the hook it resembles and
    the hooks that exist."""
    callback = MisspelledHooks()
    with pytest.warns(UserWarning) as caught:
        mm.train(fit_line, mm.items(range(3)), backend="serial", progress=False,
                 callbacks=[callback])
    messages = sorted(str(w.message) for w in caught if "which no run calls" in str(w.message))
    hooks = "the hooks are on_run_start, on_task_finished, on_batch, on_run_end"
    assert messages == [
        f"callbacks[0] (MisspelledHooks) has a method {name}, which no run calls (did you "
        f"mean {hook}?): {hooks}" for name, hook in (("on_end", "on_run_end"),
                                                      ("on_start", "on_run_start"),
                                                      ("on_task", "on_task_finished"))]
    assert callback.calls == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the real hooks, mm.MLflow's too: no warning
        Callbacks.validate([Recorder(), Broken()])


def _refuse_all(x):
    raise ValueError(f"no model for {x}")


def test_a_run_whose_every_task_failed_is_logged_whole(tracking, tmp_path, monkeypatch):
    """With ``log_models=``, a run whose every task failed (no metric to rank
    by) was logged as FAILED with no counts, results or report: the run an
    MLflow user most needs to see. Where ranked models cannot be saved the
    numbers are logged all the same, the MLflow run marked FAILED."""
    import mlflow

    root, uri = tracking
    monkeypatch.chdir(root)
    tracker = mm.MLflow(experiment="all-failed", tracking_uri=uri, log_models=2, metric="rmse")
    mm.train(_refuse_all, mm.items(range(4)), backend="serial", progress=False, track=tracker)
    client = mlflow.MlflowClient(uri)
    got = client.get_run(tracker.run_id)
    assert got.info.status == "FINISHED"
    assert got.data.metrics["failed"] == 4 and got.data.metrics["ok"] == 0
    assert {a.path for a in client.list_artifacts(tracker.run_id)} == {
        "results.parquet", "report.html"}
    tracker = mm.MLflow(experiment="all-failed", tracking_uri=uri, log_models=1, metric="rmse")
    with pytest.warns(RuntimeWarning, match="best models could not be logged"):
        mm.train(_no_metrics, mm.items(range(3)), backend="serial", progress=False,
                 track=tracker)
    got = client.get_run(tracker.run_id)
    assert got.info.status == "FAILED" and got.data.metrics["ok"] == 3


def _fit_with_a_resource(item, resource):
    return {"n": item}


def _setup_that_fails():
    raise RuntimeError("no licence server")


def test_a_run_whose_workers_cannot_start_still_ends_its_callbacks_and_mlflow_run(
        tracking, monkeypatch):
    """The scheduler re-raised the backend's error before telling the
    callbacks: on_run_end never came, and the MLflow run stayed RUNNING."""
    import mlflow

    root, uri = tracking
    monkeypatch.chdir(root)  # MLflow's default artifact root is ./mlruns

    class Ends(mm.Callback):
        def __init__(self):
            self.runs = []

        def on_run_end(self, run):
            self.runs.append(run)

    ends, tracker = Ends(), mm.MLflow(experiment="broken", tracking_uri=uri)
    with pytest.raises(mm.WorkerStartupError, match="no licence server"):
        mm.train(_fit_with_a_resource, mm.items(range(3)), backend="processes", workers=1,
                 start_method="fork", setup=_setup_that_fails, progress=False,
                 callbacks=[ends], track=tracker)
    assert len(ends.runs) == 1
    assert (ends.runs[0].results["status"] == "cancelled").all()
    assert mlflow.MlflowClient(uri).get_run(tracker.run_id).info.status == "KILLED"


def test_an_mlflow_timeout_of_inf_waits_for_the_summary(tracking, monkeypatch):
    """timeout=math.inf overflowed the thread's join: the end was warned
    about as the tracker's failure and not waited for; NaN was taken."""
    import mlflow

    root, uri = tracking
    monkeypatch.chdir(root)
    with pytest.raises(ValueError, match="math.inf: no limit"):
        mm.MLflow(tracking_uri=uri, timeout=math.nan)
    tracker = mm.MLflow(experiment="no-limit", tracking_uri=uri, timeout=math.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        mm.train(fit_line, mm.items([1.0, 2.0]), backend="serial", progress=False,
                 track=tracker)
    assert mlflow.MlflowClient(uri).get_run(tracker.run_id).info.status == "FINISHED"


def test_an_mlflow_run_goes_where_the_callers_mlflow_points_and_nests_in_its_run(
        tracking, monkeypatch):
    """Without experiment=, the run went to MLflow's Default experiment
    whatever the caller had set (mlflow.set_experiment, MLFLOW_EXPERIMENT_NAME),
    and beside, not in, the run the caller had started around train."""
    import mlflow

    root, uri = tracking
    monkeypatch.chdir(root)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "the-callers")
    client = mlflow.MlflowClient(uri)
    tracker = mm.MLflow(tracking_uri=uri)
    mm.train(fit_line, mm.items([1.0, 2.0]), backend="serial", progress=False, track=tracker)
    logged = client.get_run(tracker.run_id)
    assert client.get_experiment(logged.info.experiment_id).name == "the-callers"
    with mlflow.start_run() as outer:
        mm.train(fit_line, mm.items([1.0, 2.0]), backend="serial", progress=False,
                 track=tracker)
    nested = client.get_run(tracker.run_id)
    assert nested.data.tags["mlflow.parentRunId"] == outer.info.run_id
    assert nested.info.experiment_id == outer.info.experiment_id
    assert nested.info.status == "FINISHED"


@pytest.mark.parametrize("given, named", [
    ({"experiment": 5}, "experiment="), ({"run_name": ["a"]}, "run_name="),
    ({"tags": [("team", "a")]}, "tags="), ({"tags": {"team": {"a": 1}}}, "tag 'team'"),
    ({"tags": {1: "a"}}, "tag's name")])
def test_mlflow_names_and_tags_mlflow_refuses_are_refused_when_the_tracker_is_made(
        tracking, given, named):
    """They were taken, the models trained, and the run was logged nowhere,
    with a warning of MLflow's database that named no argument."""
    with pytest.raises(TypeError, match=re.escape(named)):
        mm.MLflow(tracking_uri=tracking[1], **given)
    assert mm.MLflow(tracking_uri=tracking[1], tags={"n": 1}).tags == {"n": "1"}
