"""Issue 37 (items 1, 6, 7, 8): metric directions from one table, refused
when unknown; MLflow off the driver's loop; metric names MLflow refuses as
paths; MLflow's final progress."""

from __future__ import annotations

import socket
import threading
import warnings

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.evaluation.metrics import METRICS


class Constant:
    def __init__(self, q):
        self.q = q

    def predict(self, X):
        return [0.0] * len(X)


def fit_scored(df, q):
    return Constant(q), {"val_accuracy": q}


def fit_item(q):
    return Constant(q), {"val_accuracy": q}


def candidates():
    frame = pd.DataFrame({"g": ["a"] * 4, "x": range(4)})
    return mm.groups(frame, by="g") * mm.grid(q=[0.55, 0.99])


# -- item 1: one table of directions; an unknown one refused before work ----------

def test_select_with_a_metric_of_unknown_direction_is_refused_before_work():
    calls = []

    def fit(df, q):
        calls.append(q)
        return fit_scored(df, q)

    with pytest.raises(ValueError, match=r"metric 'val_accuracy'.*select=\('val_accuracy', "
                                         r"'max'\)"):
        mm.train(fit, candidates(), select="val_accuracy", backend="serial", progress=False)
    assert calls == []
    run = mm.train(fit, candidates(), select=("val_accuracy", "max"), backend="serial",
                   progress=False)
    assert run.best()["q"].tolist() == [0.99]
    run = mm.train(fit, candidates(), select=("val_accuracy", "min"), backend="serial",
                   progress=False)
    assert run.best()["q"].tolist() == [0.55]


def test_a_score_functions_metric_needs_its_direction_and_halving_too():
    frame = pd.DataFrame({"g": ["a"] * 20, "x": np.arange(20.0), "y": np.arange(20.0)})

    def auc(model, test):
        return {"auc": 0.5}

    with pytest.raises(ValueError, match=r"metric 'auc'.*select=\('auc', 'max'\)"):
        mm.train(fit_scored, mm.groups(frame, by="g") * mm.grid(q=[1, 2]),
                 evaluate=mm.holdout(0.25, target="y", metrics=[auc]), select="auc")
    with pytest.raises(ValueError, match=r"metric 'auc'.*mm\.halving\(\('auc', 'max'\)\)"):
        mm.halving("auc")
    assert mm.halving(("auc", "max")).selection.higher


@pytest.mark.parametrize("name", list(METRICS))
def test_the_built_in_table_still_gives_every_known_direction(name):
    from manymodels.evaluation.metrics import direction

    higher = METRICS[name][1]
    assert direction(name, None, "") is higher
    assert mm.halving(name).selection.higher is higher
    pytest.importorskip("mlflow")
    assert mm.MLflow(log_models=1, metric=name).greater_is_better is higher


def test_select_r2_without_a_direction_still_maximises():
    frame = pd.DataFrame({"g": ["a"] * 4, "x": range(4)})

    def fit(df, q):
        return Constant(q), {"r2": q, "rmse": q}

    source = mm.groups(frame, by="g") * mm.grid(q=[0.2, 0.9])
    assert mm.train(fit, source, select="r2", backend="serial",
                    progress=False).best()["q"].tolist() == [0.9]
    assert mm.train(fit, source, select="rmse", backend="serial",
                    progress=False).best()["q"].tolist() == [0.2]


def test_mlflow_log_models_refuses_an_unknown_direction_at_construction():
    pytest.importorskip("mlflow")
    with pytest.raises(ValueError, match=r"metric 'val_accuracy'.*greater_is_better"):
        mm.MLflow(log_models=2, metric="val_accuracy")
    with pytest.raises(ValueError, match=r"log_models=2\) needs metric="):
        mm.MLflow(log_models=2)
    with pytest.raises(ValueError, match="contradicts greater_is_better"):
        mm.MLflow(log_models=2, metric=("val_accuracy", "max"), greater_is_better=False)
    assert mm.MLflow(log_models=2, metric=("val_accuracy", "max")).greater_is_better is True
    assert mm.MLflow(log_models=2, metric="auc", greater_is_better=True).greater_is_better
    # an r2 or rmse keeps its known direction; "loss" in a name no longer guessed
    assert mm.MLflow(log_models=1, metric="r2").greater_is_better is True
    assert mm.MLflow(log_models=1, metric="rmse").greater_is_better is False
    assert mm.MLflow(metric="val_accuracy").log_models == 0  # nothing ranked: nothing asked


@pytest.fixture()
def tracking(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def test_mlflow_logs_the_best_models_by_a_direction_given_with_the_metric(tracking):
    import mlflow

    tracker = mm.MLflow(experiment="dir", tracking_uri=tracking, log_models=1,
                        metric=("val_accuracy", "max"))
    mm.train(fit_item, mm.items([0.55, 0.99, 0.7]), backend="serial",
             progress=False, track=tracker)
    got = mlflow.MlflowClient(tracking).get_run(tracker.run_id)
    assert got.info.status == "FINISHED"
    assert got.data.tags["manymodels.model-1"].startswith("0.99: val_accuracy=0.99")


# -- item 6: a tracking server that is down never holds up training ---------------

def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _count(x):
    return {"x": x}


def test_a_tracking_server_where_nothing_listens_costs_one_warning():
    pytest.importorskip("mlflow")
    tracker = mm.MLflow(experiment="down", tracking_uri=f"http://127.0.0.1:{free_port()}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = mm.train(_count, mm.items(range(20)), backend="serial", progress=False,
                       track=tracker)
    assert run.summary().ok == 20
    said = [str(w.message) for w in caught if "MLflow" in str(w.message)]
    assert len(said) == 1 and "does not answer" in said[0], said
    assert tracker.run_id is None


class SilentServer:
    """A tracking server that takes connections and answers none until
    ``release`` is set, then hangs up."""

    def __init__(self):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.release, self.stop, self.requests = threading.Event(), threading.Event(), 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except OSError:
                continue
            with connection:
                connection.settimeout(5)
                try:
                    if connection.recv(4096):
                        self.requests += 1
                except OSError:
                    pass
                self.release.wait(60)

    def close(self):
        self.release.set()
        self.stop.set()
        self.thread.join(5)
        self.listener.close()


def test_the_first_task_does_not_wait_for_a_tracking_server_that_does_not_answer(
        monkeypatch):
    """The first fit runs while MLflow's first request is still unanswered: its
    HTTP work is off the driver's loop (before, the driver waited on it, for
    minutes with MLflow's retries; here bounded so that it fails quickly)."""
    pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    server = SilentServer()
    seen_at_first_fit = []

    def fit(x):
        if not seen_at_first_fit:
            seen_at_first_fit.append(len(caught))  # the tracker has not given up yet
            server.release.set()  # ... and now it may
        return {"x": x}

    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            tracker = mm.MLflow(experiment="silent",
                                tracking_uri=f"http://127.0.0.1:{server.port}")
            run = mm.train(fit, mm.items(range(20)), backend="serial", progress=False,
                           track=tracker)
    finally:
        server.close()
    assert run.summary().ok == 20
    assert seen_at_first_fit == [0]
    assert server.requests >= 1  # it was asked
    said = [str(w.message) for w in caught if "MLflow" in str(w.message)]
    assert len(said) == 1, said


# -- item 7: metric names MLflow refuses as paths ------------------------------------

PATHS = ["a//b", "/abs", "x/", "./y", "..", "a/b", "a__b", "_abs"]


def fit_path_metrics(x):
    return {name: float(x + i) for i, name in enumerate(PATHS)}


def test_metric_names_mlflow_refuses_as_paths_are_cleaned_and_kept_apart(tracking, tmp_path):
    import mlflow

    tracker = mm.MLflow(experiment="paths", tracking_uri=tracking)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no callback failure
        mm.train(fit_path_metrics, mm.items(range(4)), backend="serial", progress=False,
                 track=tracker)
    client = mlflow.MlflowClient(tracking)
    got = client.get_run(tracker.run_id)
    assert got.info.status == "FINISHED"
    means = {name: value for name, value in got.data.metrics.items() if name.endswith(".mean")
             and not name.startswith("duration_s")}
    assert sorted(means.values()) == [1.5 + i for i in range(len(PATHS))]  # 8 names, 8 kept
    assert means["a/b.mean"] == 1.5 + 5 and means["a__b.mean"] == 1.5 + 6
    assert got.data.metrics["ok"] == 4
    assert {"results.parquet", "report.html"} <= {a.path for a in
                                                  client.list_artifacts(tracker.run_id)}


# -- item 8: the final progress ------------------------------------------------------

def test_mlflow_progress_ends_at_the_total(tracking):
    import mlflow

    tracker = mm.MLflow(experiment="progress", tracking_uri=tracking)
    mm.train(_count, mm.items(range(100)), backend="threads", workers=2, progress=False,
             track=tracker)
    client = mlflow.MlflowClient(tracking)
    history = client.get_metric_history(tracker.run_id, "progress.done")
    last = max(history, key=lambda m: (m.step, m.timestamp))
    assert last.value == 100 and last.step == 100
    assert client.get_run(tracker.run_id).data.metrics["progress.done"] == 100
