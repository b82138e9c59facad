"""GroupedEstimator as scikit-lego's GroupedPredictor users know it: hierarchical
groups, shrinkage (same names, same numbers), group-columns-only X,
decision_function, and GroupedRegressor/GroupedClassifier. The shrinkage
cases are scikit-lego's own, checked against the weights worked out by hand."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.dummy import DummyRegressor
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.svm import LinearSVC

from manymodels.sklearn import GroupedClassifier, GroupedEstimator, GroupedRegressor

MEANS = {"Earth": 2.5, "NL": 2, "BE": 3, "Amsterdam": 1, "Rotterdam": 3, "Antwerp": 2,
         "Brussels": 4}
CHAINS = [("Earth", "NL", "Amsterdam"), ("Earth", "NL", "Rotterdam"),
          ("Earth", "BE", "Antwerp"), ("Earth", "BE", "Brussels")]


@pytest.fixture
def places():
    X = pd.DataFrame({"Planet": ["Earth"] * 4, "Country": ["NL", "NL", "BE", "BE"],
                      "City": ["Amsterdam", "Rotterdam", "Antwerp", "Brussels"]})
    return X, np.array([1.0, 3.0, 2.0, 4.0])


def expected(weights):
    return [np.array([MEANS[name] for name in chain]) @ np.asarray(weights) for chain in CHAINS]


def shrunk(shrinkage, by=("Planet", "Country", "City"), fallback="error", **kwargs):
    return GroupedRegressor(DummyRegressor(), by=list(by), fallback=fallback,
                            shrinkage=shrinkage, shrinkage_kwargs=kwargs or None,
                            backend="serial")


@pytest.mark.parametrize("shrinkage, kwargs, weights", [
    ("constant", {"alpha": 0.1}, [0.01, 0.09, 0.9]),  # alpha^2, alpha(1-alpha), 1-alpha
    ("relative", {}, np.array([4, 2, 1]) / 7),  # the rows each level saw
    ("equal", {}, [1 / 3] * 3),
    (lambda sizes: np.repeat(1 / len(sizes), len(sizes)), {}, [1 / 3] * 3),
])
def test_shrinkage_weights_as_scikit_lego(places, shrinkage, kwargs, weights):
    X, y = places
    model = shrunk(shrinkage, **kwargs).fit(X, y)
    np.testing.assert_allclose(model.predict(X), expected(weights))
    np.testing.assert_allclose(model.shrinkage_factors_[("Earth", "NL", "Amsterdam")], weights)


def test_min_n_obs_uses_the_deepest_level_with_enough_rows(places):
    X, y = places
    model = shrunk("min_n_obs", min_n_obs=2).fit(X, y)
    assert model.predict(X).tolist() == [MEANS["NL"], MEANS["NL"], MEANS["BE"], MEANS["BE"]]
    # the same with the global model as root instead of the Planet level
    with_global = shrunk("min_n_obs", by=("Country", "City"), fallback="global", min_n_obs=2)
    np.testing.assert_allclose(with_global.fit(X.drop(columns="Planet"), y).predict(
        X.drop(columns="Planet")), model.predict(X))
    with pytest.raises(ValueError, match="no level has min_n_obs=5 rows"):
        shrunk("min_n_obs", min_n_obs=5).fit(X, y)


def test_one_level_with_the_global_model(places):
    X, y = places
    model = shrunk("constant", by=["Country"], fallback="global", alpha=0.1)
    predicted = model.fit(X[["Country"]], y).predict(X[["Country"]])
    np.testing.assert_allclose(predicted, [0.1 * 2.5 + 0.9 * 2] * 2 + [0.1 * 2.5 + 0.9 * 3] * 2)


@pytest.mark.parametrize("shrinkage, kwargs, message", [
    ("dinosaurhead", {}, "shrinkage must be None, one of"),
    (9, {}, "shrinkage must be None"),
    ("constant", {}, "needs shrinkage_kwargs={'alpha'"),
    ("constant", {"alpha": 2}, "0 <= alpha <= 1"),
    ("relative", {"alpha": 0.1}, "takes no shrinkage_kwargs"),
    (lambda sizes: sizes, {}, "must return an np.ndarray of shape"),
    (lambda sizes: np.ones(len(sizes) + 1), {}, "must return an np.ndarray of shape"),
    (lambda sizes: {}["bad"], {}, "raised while checking it.*KeyError"),
    (None, {"alpha": 0.3}, "given without shrinkage="),
])
def test_bad_shrinkage_is_refused_before_any_fit(places, shrinkage, kwargs, message):
    X, y = places
    with pytest.raises(ValueError, match=message):
        shrunk(shrinkage, **kwargs).fit(X, y)
    with pytest.raises(ValueError, match="needs predict_proba, which LinearSVC has not"):
        GroupedEstimator(LinearSVC(), by="Country", shrinkage="equal").fit(X, y > 2)


@pytest.fixture
def cities():
    """Two countries, cities with their own slope; y = slope * x."""
    rng = np.random.default_rng(0)
    slopes = {("NL", "Amsterdam"): 1.0, ("NL", "Rotterdam"): 2.0, ("BE", "Antwerp"): -1.0,
              ("BE", "Brussels"): -3.0, ("BE", "Ghent"): -2.0}
    rows = []
    for (country, city), slope in slopes.items():
        n = 2 if city == "Ghent" else 40  # Ghent: too small for its own model
        x = rng.normal(size=n)
        rows.append(pd.DataFrame({"country": country, "city": city, "x": x, "y": slope * x}))
    frame = pd.concat(rows, ignore_index=True)
    return frame[["country", "city", "x"]], frame["y"].to_numpy()


def test_hierarchical_falls_back_to_the_parent_group_then_the_global_model(cities):
    X, y = cities
    model = GroupedRegressor(LinearRegression(), by=["country", "city"], hierarchical=True,
                             min_group_size=5, backend="threads").fit(X, y)
    assert set(model.parent_models_) == {("NL",), ("BE",)}
    assert ("BE", "Ghent") not in model.models_ and len(model.models_) == 4
    new = pd.DataFrame({"country": ["BE", "NL", "FR", "NL"],
                        "city": ["Ghent", "Utrecht", "Paris", "Amsterdam"], "x": [1.0] * 4})
    predicted = model.predict(new)
    be, nl = (X["country"] == "BE").to_numpy(), (X["country"] == "NL").to_numpy()
    one = pd.DataFrame({"x": [1.0]})
    by_hand = [LinearRegression().fit(X.loc[be, ["x"]], y[be]).predict(one)[0],
               LinearRegression().fit(X.loc[nl, ["x"]], y[nl]).predict(one)[0],
               LinearRegression().fit(X[["x"]], y).predict(one)[0], 1.0]
    np.testing.assert_allclose(predicted, by_hand)
    flat = GroupedRegressor(LinearRegression(), by=["country", "city"], min_group_size=5,
                            backend="serial").fit(X, y)
    assert flat.parent_models_ == {}  # without hierarchical, straight to the global model
    np.testing.assert_allclose(flat.predict(new)[:2], [by_hand[2]] * 2)


def test_shrinkage_with_real_features_matches_the_hand_blend(cities):
    X, y = cities
    model = GroupedRegressor(Ridge(alpha=1.0), by=["country", "city"], shrinkage="relative",
                             backend="processes", workers=2).fit(X, y)
    rows = ((X["country"] == "NL") & (X["city"] == "Rotterdam")).to_numpy()
    nl = (X["country"] == "NL").to_numpy()
    point = pd.DataFrame({"x": [0.5]})
    parts = [Ridge().fit(X[["x"]], y), Ridge().fit(X.loc[nl, ["x"]], y[nl]),
             Ridge().fit(X.loc[rows, ["x"]], y[rows])]
    sizes = np.array([len(y), nl.sum(), rows.sum()], dtype=float)
    by_hand = sum(w * m.predict(point)[0] for w, m in zip(sizes / sizes.sum(), parts))
    got = model.predict(pd.DataFrame({"country": ["NL"], "city": ["Rotterdam"], "x": [0.5]}))
    np.testing.assert_allclose(got, [by_hand])
    restored = pickle.loads(pickle.dumps(model))  # its shrinkage travels with it
    np.testing.assert_allclose(restored.predict(X), model.predict(X))


def test_group_columns_only_give_one_baseline_per_group(places):
    X, y = places
    model = GroupedEstimator(DummyRegressor(), by="Country", backend="serial")
    predicted = model.fit(X[["Country"]], y).predict(pd.DataFrame({"Country": ["BE", "NL"]}))
    assert predicted.tolist() == [3.0, 2.0]
    array = GroupedEstimator(DummyRegressor(), by=0, backend="serial").fit(
        X[["Country"]].to_numpy(dtype=object), y)
    assert array.predict(np.array([["NL"]], dtype=object)).tolist() == [2.0]
    with pytest.raises(ValueError, match="1 feature\\(s\\), all of them by columns.*Ridge"):
        GroupedEstimator(Ridge(), by="Country", backend="serial").fit(X[["Country"]], y)


def test_decision_function_per_group():
    rng = np.random.default_rng(3)
    n = 300
    X = pd.DataFrame({"g": rng.choice(["a", "b"], n), "x1": rng.normal(size=n),
                      "x2": rng.normal(size=n)})
    y = np.where(X["g"] == "a", X["x1"] > 0, X["x2"] > 0).astype(int)
    model = GroupedClassifier(LogisticRegression(), by="g", backend="serial").fit(X, y)
    scores = model.decision_function(X)
    for g in "ab":
        rows = (X["g"] == g).to_numpy()
        by_hand = LogisticRegression().fit(X.loc[rows, ["x1", "x2"]], y[rows])
        np.testing.assert_allclose(scores[rows], by_hand.decision_function(
            X.loc[rows, ["x1", "x2"]]))
    assert ((scores > 0).astype(int) == model.predict(X)).all()
    three = np.where(X["g"] == "a", y, y + 1)  # group a: classes 0, 1; group b: 1, 2
    wide = GroupedClassifier(LinearSVC(), by="g", backend="serial").fit(X, three)
    assert wide.decision_function(X).shape == (n, 3)
    assert np.isneginf(wide.decision_function(X)[(X["g"] == "a").to_numpy(), 2]).all()
    assert not hasattr(GroupedRegressor(Ridge(), by="g"), "decision_function")


def test_regressor_and_classifier_refuse_the_other_kind(places):
    X, y = places
    with pytest.raises(ValueError, match="GroupedRegressor needs a regressor, got "
                                         "LogisticRegression"):
        GroupedRegressor(LogisticRegression(), by="Country").fit(X, y)
    with pytest.raises(ValueError, match="GroupedClassifier needs a classifier, got Ridge"):
        GroupedClassifier(Ridge(), by="Country").fit(X, y)
    regressor = clone(GroupedRegressor(Ridge(), by="g", shrinkage="equal"))
    assert regressor.get_params()["shrinkage"] == "equal"


def test_lightgbm_per_group_with_hierarchical_fallback(cities):
    lightgbm = pytest.importorskip("lightgbm")
    X, y = cities
    inner = lightgbm.LGBMRegressor(n_estimators=20, min_child_samples=2, verbose=-1)
    model = GroupedRegressor(inner, by=["country", "city"], hierarchical=True,
                             min_group_size=5, workers=2).fit(X, y)
    assert isinstance(model.parent_models_[("BE",)], lightgbm.LGBMRegressor)
    ghent = pd.DataFrame({"country": ["BE"], "city": ["Ghent"], "x": [1.0]})
    assert model.predict(ghent)[0] == pytest.approx(
        model.parent_models_[("BE",)].predict(ghent[["x"]])[0])
