"""Issue 37, items 20-22: shrinkage in GroupedEstimator as scikit-lego has it.

20. A classifier's predict_proba is the shrinkage-weighted sum of its chain's
    levels' predict_proba (scikit-lego's HierarchicalClassifier); checked here
    against LogisticRegression models fitted level by level by hand.
21. Shrinkage with one level and no global model is refused.
22. A shrinkage function whose weights do not fit a chain that predict may
    use is refused at fit, not at predict.
"""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.dummy import DummyRegressor
from sklearn.linear_model import LogisticRegression, Ridge
from sklearn.svm import LinearSVC

from manymodels.sklearn import GroupedClassifier, GroupedEstimator, GroupedRegressor

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


def aligned_proba(model: LogisticRegression, X: pd.DataFrame) -> np.ndarray:
    """A hand-fitted model's probabilities over CLASSES, 0 for a class it never saw."""
    full = np.zeros((len(X), len(CLASSES)))
    for column, label in enumerate(model.classes_):
        full[:, list(CLASSES).index(label)] = model.predict_proba(X)[:, column]
    return full


def by_hand(X: pd.DataFrame, y: np.ndarray, new: pd.DataFrame, weigh) -> np.ndarray:
    """Each new row's chain (all rows, its country, its city), fitted by hand,
    its probabilities summed with the weights ``weigh(sizes)``."""
    out = np.zeros((len(new), len(CLASSES)))
    for i, (country, city) in enumerate(zip(new["country"], new["city"])):
        masks = [np.ones(len(X), dtype=bool), (X["country"] == country).to_numpy(),
                 ((X["country"] == country) & (X["city"] == city)).to_numpy()]
        masks = [m for m in masks if m.any()]  # an unseen city or country has no model
        sizes = np.array([m.sum() for m in masks], dtype=float)
        weights = weigh(sizes)
        row = new.iloc[[i]][FEATURES]
        for weight, mask in zip(weights / weights.sum(), masks):
            level = LogisticRegression().fit(X.loc[mask, FEATURES], y[mask])
            out[i] += weight * aligned_proba(level, row)[0]
    return out


def constant(alpha):
    def weigh(sizes):
        n = len(sizes)
        if n == 1:
            return np.ones(1)
        return np.array([alpha ** (n - 1)] + [alpha ** (n - 1 - i) * (1 - alpha)
                                              for i in range(1, n - 1)] + [1 - alpha])
    return weigh


@pytest.mark.parametrize("shrinkage, kwargs, weigh", [
    ("relative", None, lambda sizes: sizes),
    ("constant", {"alpha": 0.3}, constant(0.3)),
    ("equal", None, lambda sizes: np.ones(len(sizes))),
])
def test_classifier_shrinkage_blends_the_chain_probabilities(labelled, shrinkage, kwargs,
                                                            weigh):
    X, y = labelled
    model = GroupedClassifier(LogisticRegression(), by=["country", "city"],
                              shrinkage=shrinkage, shrinkage_kwargs=kwargs,
                              backend="serial").fit(X, y)
    new = pd.concat([X.iloc[[0, 70, 100, 140]],  # Amsterdam, Rotterdam, Antwerp, Ghent
                     pd.DataFrame({"country": ["BE", "FR"], "city": ["Liege", "Paris"],
                                   "x1": [1.5, -0.2], "x2": [0.3, 0.9]})],
                    ignore_index=True)
    expected = by_hand(X, y, new, weigh)
    proba = model.predict_proba(new)
    assert model.classes_.tolist() == CLASSES.tolist()
    np.testing.assert_allclose(proba, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert model.predict(new).tolist() == CLASSES[expected.argmax(axis=1)].tolist()
    assert model.score(X, y) == np.mean(model.predict(X) == y)
    restored = pickle.loads(pickle.dumps(model))
    np.testing.assert_array_equal(restored.predict_proba(new), proba)


def test_classifier_shrinkage_without_a_global_model(labelled):
    X, y = labelled
    model = GroupedEstimator(LogisticRegression(), by=["country", "city"], fallback="error",
                             shrinkage="equal", backend="serial").fit(X, y)
    ghent = X.iloc[[140]]
    be = (X["country"] == "BE").to_numpy()
    city = be & (X["city"] == "Ghent").to_numpy()
    expected = 0.5 * (aligned_proba(LogisticRegression().fit(X.loc[be, FEATURES], y[be]),
                                    ghent[FEATURES])
                      + aligned_proba(LogisticRegression().fit(X.loc[city, FEATURES],
                                                               y[city]), ghent[FEATURES]))
    np.testing.assert_allclose(model.predict_proba(ghent), expected, rtol=0, atol=1e-12)
    assert expected[0, list(CLASSES).index("high")] > 0  # the country's model gives "high"
    with pytest.raises(ValueError, match="no model for group"):
        model.predict(pd.DataFrame({"country": ["FR"], "city": ["Paris"], "x1": [0.0],
                                    "x2": [0.0]}))


def test_classifier_shrinkage_needs_probabilities(labelled):
    X, y = labelled
    with pytest.raises(ValueError, match="predict_proba.*LinearSVC"):
        GroupedClassifier(LinearSVC(), by=["country", "city"], shrinkage="equal").fit(X, y)
    with pytest.raises(ValueError, match="fallback.*predict_proba.*LinearSVC"):
        GroupedClassifier(LogisticRegression(), by=["country", "city"], fallback=LinearSVC(),
                          shrinkage="equal").fit(X, y)
    shrunk = GroupedClassifier(LogisticRegression(), by=["country", "city"],
                               shrinkage="equal", backend="serial").fit(X, y)
    assert not hasattr(shrunk, "decision_function")  # scorers then use predict_proba
    with pytest.raises(AttributeError) as refused:
        shrunk.decision_function(X)
    assert "shrinkage" in str(refused.value.__cause__)
    assert "predict_proba" in str(refused.value.__cause__)


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


def test_shrinkage_with_a_missing_float_key_part_predicts_as_any_other_key():
    """A float key column holding NaN: each level's prefix held its own NaN
    object, and the chains' lookups (NaN != NaN) raised KeyError: (nan,)."""
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"country": np.r_[np.ones(20), np.full(20, np.nan)],
                      "city": np.tile(np.repeat(["a", "b"], 10), 2), "x": rng.normal(size=40)})
    y = X["x"] * np.r_[np.full(20, 1.0), np.full(20, 3.0)] + rng.normal(size=40)
    stand_in = X.assign(country=X["country"].fillna(2.0))
    unseen = pd.DataFrame({"country": [np.nan, 1.0], "city": ["zz", "a"], "x": [1.0, 0.5]})
    for shrinkage in ("relative", "equal"):
        model = GroupedRegressor(Ridge(), by=["country", "city"], shrinkage=shrinkage,
                                 backend="serial").fit(X, y)
        twin = GroupedRegressor(Ridge(), by=["country", "city"], shrinkage=shrinkage,
                                backend="serial").fit(stand_in, y)
        np.testing.assert_allclose(model.predict(X), twin.predict(stand_in))
        np.testing.assert_allclose(model.predict(unseen),
                                   twin.predict(unseen.fillna({"country": 2.0})))


@pytest.mark.parametrize("by", [-2, 3])
def test_a_key_position_outside_the_array_is_named(by):
    """by=-2 on an array of text keys said "could not convert string to
    float: 'a'" (its key column was checked as a feature first)."""
    X = np.array([["a", 1.0, 2.0], ["b", 2.0, 3.0], ["a", 3.0, 1.0]], dtype=object)
    with pytest.raises(ValueError, match=rf"by column {by} is not among X's 3 column "
                                         r"positions \(0 to 2; a negative one"):
        GroupedRegressor(Ridge(), by=by, backend="serial").fit(X, [1.0, 2.0, 3.0])
