"""Prediction on the engine everywhere (issue 42): ``GroupedEstimator.predict``
and ``predict_proba`` run through the engine as ``Store.predict`` does, in
chunks of whole groups, and give what the serial path gives, row for row."""

from __future__ import annotations

import os
import threading
import time
import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import BaseEstimator, RegressorMixin
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge

import manymodels as mm
from manymodels.sklearn import GroupedEstimator


class WhereRegressor(RegressorMixin, BaseEstimator):
    """Predicts the process and thread that ran it (and sleeps ``sleep`` s)."""

    def __init__(self, sleep: float = 0.0) -> None:
        self.sleep = sleep

    def fit(self, X, y):
        self.n_features_in_ = np.shape(X)[1]
        return self

    def predict(self, X):
        time.sleep(self.sleep)
        return np.full(len(X), os.getpid() * 10**7 + threading.get_ident() % 10**7)


class FailingRegressor(RegressorMixin, BaseEstimator):
    """The mean of y; its predict refuses a group whose mean is above 100."""

    def fit(self, X, y):
        self.mean_ = float(np.mean(y))
        return self

    def predict(self, X):
        if self.mean_ > 100:
            raise ValueError("this group's model refuses to predict")
        return np.full(len(X), self.mean_)


def _rows(groups: int, per_group: int, seed: int) -> tuple[pd.DataFrame, np.ndarray]:
    rng = np.random.default_rng(seed)
    n = groups * per_group
    X = pd.DataFrame({"g": rng.permutation(np.repeat([f"g{i}" for i in range(groups)],
                                                     per_group)),
                      "x1": rng.normal(size=n), "x2": rng.normal(size=n)})
    slope = X["g"].str[1:].astype(int).to_numpy() / 10
    y = slope * X["x1"].to_numpy() - X["x2"].to_numpy() + rng.normal(scale=0.1, size=n)
    return X, y


@pytest.mark.parametrize("backend", ["processes", "threads"])
def test_predict_and_predict_proba_on_the_engine_equal_the_serial_path(backend):
    X, y = _rows(24, 8, 0)
    fitted = GroupedEstimator(Ridge(alpha=0.3), by="g", min_group_size=5,
                              backend="serial").fit(X, y)
    new, _ = _rows(28, 3, 1)  # g24..g27 were never seen: the fallback answers
    new.index = new.index * 3 + 1
    serial = fitted.predict(new)
    engine = fitted.set_params(backend=backend, workers=2).predict(new)
    np.testing.assert_array_equal(engine, serial)
    unseen = new["g"].isin([f"g{i}" for i in range(24, 28)]).to_numpy()
    np.testing.assert_allclose(engine[unseen], fitted.fallback_.predict(new.loc[unseen,
                                                                               ["x1", "x2"]]))
    labels = np.where(y > 0, "up", np.where(y > -1, "flat", "down"))
    labels[X["g"].to_numpy() == "g3"] = "up"  # a group that saw one class only
    classifier = GroupedEstimator(LogisticRegression(), by="g", min_group_size=5,
                                  backend="serial").fit(X, labels)
    proba = classifier.predict_proba(new)
    assert proba.shape == (len(new), 3)
    on_engine = classifier.set_params(backend=backend, workers=2)
    np.testing.assert_array_equal(on_engine.predict_proba(new), proba)
    np.testing.assert_array_equal(on_engine.predict(new),
                                  classifier.set_params(backend="serial").predict(new))


def test_array_input_on_the_engine_equals_the_serial_path():
    X, y = _rows(30, 6, 2)
    codes = X["g"].str[1:].astype(float).to_numpy()
    array = np.column_stack([X["x1"], codes, X["x2"]])  # the key in the middle column
    fitted = GroupedEstimator(LinearRegression(), by=1, backend="serial").fit(array, y)
    serial = fitted.predict(array)
    engine = fitted.set_params(backend="processes", workers=2).predict(array)
    np.testing.assert_array_equal(engine, serial)


def test_the_backend_runs_the_predictions_and_by_default_the_cost_decides():
    X, y = _rows(40, 3, 3)
    here = os.getpid() * 10**7 + threading.get_ident() % 10**7
    model = GroupedEstimator(WhereRegressor(), by="g", backend="serial").fit(X, y)
    assert set(model.predict(X)) == {here}
    assert os.getpid() not in {int(v) // 10**7 for v in
                               model.set_params(backend="processes", workers=2).predict(X)}
    threads = model.set_params(backend="threads", workers=2).predict(X)
    assert {int(v) // 10**7 for v in threads} == {os.getpid()} and here not in set(threads)
    cheap = model.set_params(backend=None, workers=2).predict(X)  # 40 fast groups: here
    assert set(cheap) == {here}
    slow = GroupedEstimator(WhereRegressor(sleep=0.02), by="g", backend="serial").fit(X, y)
    slow.set_params(backend=None, workers=2)  # 40 x 20 ms: worth the workers
    assert os.getpid() not in {int(v) // 10**7 for v in slow.predict(X)}
    assert set(slow.set_params(workers=1).predict(X)) == {here}


@pytest.mark.parametrize("backend", ["processes", "threads"])
def test_a_failing_predict_names_its_group(backend):
    X, y = _rows(12, 4, 4)
    y[X["g"].to_numpy() == "g7"] = 1000.0
    model = GroupedEstimator(FailingRegressor(), by="g", backend="serial").fit(X, y)
    with pytest.raises(ValueError, match="refuses to predict"):
        model.predict(X)  # the serial path: the model's own error
    model.set_params(backend=backend, workers=2)
    with pytest.raises(RuntimeError, match="predicting group 'g7' failed") as caught:
        model.predict(X)
    assert "refuses to predict" in str(caught.value)


def _line(rows):
    x = rows["x1"]
    return np.linalg.lstsq(np.column_stack([x, np.ones(len(x))]), rows["y"], rcond=None)[0]


class _Line:
    def __init__(self, coef):
        self.coef = coef

    def predict(self, X):
        return np.asarray(X, dtype=float)[:, 0] * self.coef[0] + self.coef[1]


def _fit_line(rows):
    if rows["g"][0] == 13:
        raise ValueError("no model for 13")
    return _Line(_line(rows))


def _fails_for_7(model, rows):
    if rows["g"].iloc[0] == 7:
        raise ValueError("cannot forecast 7")
    return model.predict(rows[["x1"]].to_numpy())


@pytest.mark.parametrize("backend", ["processes", "threads"])
def test_store_predict_in_chunks_equals_one_group_at_a_time(tmp_path, backend):
    """300 groups in many chunks: the same values and sources as the
    driver's serial run, in the input's row order, with the unseen and the
    failed group on the fallback."""
    rng = np.random.default_rng(5)
    train = pd.DataFrame({"g": np.repeat(np.arange(300), 6), "x1": rng.normal(size=1800)})
    train["y"] = train["g"] * train["x1"] + 1.0
    store = mm.Store(tmp_path / "s")
    run = mm.train(_fit_line, mm.groups(train, by="g", format="numpy"), store=store,
                   backend="serial", progress=False)
    store.attach(run.run_id, "fallback", _Line(np.array([0.0, -5.0])))
    new = pd.DataFrame({"g": rng.permutation(np.repeat(np.arange(310), 3)),
                        "x1": rng.normal(size=930)})
    new.index = new.index + 100
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        alone = store.predict(new, by="g", features=["x1"], workers=1, with_source=True)
        chunked = store.predict(new, by="g", features=["x1"], backend=backend, workers=2,
                                with_source=True)
    # no warning but the failed group's, once a call (the unseen ones go quietly)
    assert [str(w.message).split(": e.g.")[0].split("': ")[-1] for w in said] == [
        "1 group failed in training and is answered by the fallback model"] * 2
    pd.testing.assert_frame_equal(chunked, alone)
    assert chunked.index.equals(new.index)
    own = new["g"] < 300
    own &= new["g"] != 13
    np.testing.assert_allclose(chunked.loc[own, "prediction"],
                               new.loc[own, "g"] * new.loc[own, "x1"] + 1.0, rtol=1e-9)
    assert set(chunked.loc[~own, "source"]) == {"fallback"}
    np.testing.assert_allclose(chunked.loc[~own, "prediction"], -5.0)
    with pytest.raises(RuntimeError, match="predicting group 7 failed") as caught:
        store.predict(new, by="g", fn=_fails_for_7, backend=backend, workers=2)
    assert "cannot forecast 7" in str(caught.value)


def test_shrinkage_and_missing_keys_on_the_engine_equal_the_serial_path():
    """Blended chains (pickled to the workers) and keys that are None or NaN
    route as in the caller."""
    from manymodels.sklearn import GroupedRegressor

    rng = np.random.default_rng(6)
    X = pd.DataFrame({"country": rng.choice(["NL", "BE", None], 200),
                      "city": rng.choice([1.0, 2.0, np.nan], 200), "x": rng.normal(size=200)})
    y = 2 * X["x"].to_numpy() + rng.normal(size=200)
    model = GroupedRegressor(Ridge(), by=["country", "city"], shrinkage="relative",
                             backend="serial").fit(X, y)
    new = X.copy()
    new.loc[:9, "country"] = "DE"  # unseen: its chain is the global model alone
    serial = model.predict(new)
    np.testing.assert_array_equal(
        model.set_params(backend="processes", workers=2).predict(new), serial)


class FitPidRegressor(RegressorMixin, BaseEstimator):
    """The mean of y; remembers the process that fitted it."""

    def fit(self, X, y):
        self.pid_, self.mean_ = os.getpid(), float(np.mean(y))
        return self

    def predict(self, X):
        return np.full(len(X), self.mean_)


def test_inside_a_joblib_worker_the_groups_take_the_cores_joblib_left_it(monkeypatch):
    """cross_validate(n_jobs=2) on 2 cores leaves each worker one core (its
    OMP_NUM_THREADS): the groups fit in that worker, not in workers of its own."""
    from sklearn.model_selection import cross_validate

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    X, y = _rows(groups=4, per_group=10, seed=3)
    folds = cross_validate(GroupedEstimator(FitPidRegressor(), by="g"), X, y, cv=2,
                           n_jobs=2, return_estimator=True)
    for fitted in folds["estimator"]:
        assert {model.pid_ for model in fitted.models_.values()} == {fitted.fallback_.pid_}
