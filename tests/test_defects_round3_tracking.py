"""Issue 37 (items 1, 7): metric directions from one table, refused when unknown;
metric names MLflow refuses as paths."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.metrics import METRICS


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
    from manymodels.metrics import direction

    higher = METRICS[name][1]
    assert direction(name, None, "") is higher
    assert mm.halving(name).selection.higher is higher


def test_select_r2_without_a_direction_still_maximises():
    frame = pd.DataFrame({"g": ["a"] * 4, "x": range(4)})

    def fit(df, q):
        return Constant(q), {"r2": q, "rmse": q}

    source = mm.groups(frame, by="g") * mm.grid(q=[0.2, 0.9])
    assert mm.train(fit, source, select="r2", backend="serial",
                    progress=False).best()["q"].tolist() == [0.9]
    assert mm.train(fit, source, select="rmse", backend="serial",
                    progress=False).best()["q"].tolist() == [0.2]


@pytest.fixture()
def tracking(tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root is ./mlruns
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


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
