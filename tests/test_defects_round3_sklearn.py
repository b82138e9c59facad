"""Issue 37: shrinkage in GroupedEstimator as scikit-lego has it.

21. Shrinkage with one level and no global model is refused.
22. A shrinkage function whose weights do not fit a chain that predict may
    use is refused at fit, not at predict.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.dummy import DummyRegressor
from sklearn.linear_model import Ridge

from manymodels.sklearn import GroupedRegressor

CLASSES = np.array(["high", "low", "mid"])
FEATURES = ["x1", "x2"]


@pytest.fixture
def labelled():
    """Two countries, four cities; Ghent sees only two of the three classes."""
    rng = np.random.default_rng(7)
    parts = []
    for country, city, n in [("NL", "Amsterdam", 60), ("NL", "Rotterdam", 25),
                             ("BE", "Antwerp", 40), ("BE", "Ghent", 30)]:
        x = rng.normal(size=(n, 2))
        score = x[:, 0] + (0.5 if country == "NL" else -0.5) * x[:, 1]
        label = np.where(score > 0.6, "high", np.where(score < -0.6, "low", "mid"))
        if city == "Ghent":
            label = np.where(label == "high", "mid", label)
        parts.append(pd.DataFrame({"country": country, "city": city, "x1": x[:, 0],
                                   "x2": x[:, 1], "y": label}))
    frame = pd.concat(parts, ignore_index=True)
    return frame[["country", "city", *FEATURES]], frame["y"].to_numpy()


@pytest.mark.parametrize("by", ["country", ["country"], 0])
def test_shrinkage_with_one_level_and_no_global_model_is_refused(labelled, by):
    X, y = labelled
    X = X[["country", "x1"]]
    if by == 0:
        X = X.to_numpy(dtype=object)
    with pytest.raises(ValueError, match="shrinkage.*fallback='error' gives one level only"):
        GroupedRegressor(Ridge(), by=by, fallback="error", shrinkage="equal").fit(X, y == "low")
    with_global = GroupedRegressor(Ridge(), by=by, shrinkage="equal", backend="serial")
    assert len(with_global.fit(X, y == "low").predict(X)) == len(X)


class CountingRegressor(RegressorMixin, BaseEstimator):
    """A mean per group that counts its fits (serial backend: same process)."""

    fits = 0

    def fit(self, X, y):
        type(self).fits += 1
        self.mean_ = float(np.mean(y))
        return self

    def predict(self, X):
        return np.full(len(X), self.mean_)


def three_levels(sizes):
    """Passes the probe (three sizes) and the groups' own chains (three levels),
    but not the chains that rows of unseen groups use."""
    return np.array([0.2, 0.3, 0.5])


def three_unless_one(sizes):
    return np.ones(3 if len(sizes) > 1 else 1)


def test_shrinkage_weights_that_miss_a_chain_are_refused_at_fit(labelled):
    X, y = labelled
    target = (y == "low").astype(float)
    CountingRegressor.fits = 0
    model = GroupedRegressor(CountingRegressor(), by=["country", "city"],
                             shrinkage=three_levels, backend="serial")
    with pytest.raises(ValueError, match=r"shrinkage.*chain of the global model.*\[155\]"):
        model.fit(X, target)
    assert CountingRegressor.fits == 0  # refused before any model was fitted
    parents = GroupedRegressor(CountingRegressor(), by=["country", "city"],
                               shrinkage=three_unless_one, backend="serial")
    with pytest.raises(ValueError, match=r"shrinkage.*chain of \('NL',\).*\[155, 85\]"):
        parents.fit(X, target)
    assert CountingRegressor.fits == 0


def test_negative_shrinkage_weights_are_refused(labelled):
    X, y = labelled
    model = GroupedRegressor(DummyRegressor(), by=["country", "city"], backend="serial",
                             shrinkage=lambda sizes: np.array([-1.0] + [2.0] * (len(sizes) - 1))
                             if len(sizes) > 1 else np.ones(1))
    with pytest.raises(ValueError, match=r"array\(\[-1\..*non-negative"):
        model.fit(X, (y == "low").astype(float))
