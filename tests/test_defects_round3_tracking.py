"""Issue 37 (item 1): metric directions from one table, refused when unknown."""

from __future__ import annotations

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
