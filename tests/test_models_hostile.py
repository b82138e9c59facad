"""The grouped estimator, ``mm.linear`` and the transforms under hostile but
plausible input: columns named like the ones they add, functions that
return a dict or mixed kinds of table, keys of a zone given in another,
bad ``by=`` and targets. Each test fails before its fix."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.dummy import DummyRegressor
from sklearn.linear_model import LinearRegression, LogisticRegression

import manymodels as mm
from manymodels.sklearn import GroupedClassifier, GroupedRegressor


@pytest.mark.parametrize("name", ["__manymodels_group__", "__manymodels_target__",
                                  "__manymodels_weight__"])
def test_a_feature_named_like_the_estimators_own_columns_is_refused(name):
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"g": np.repeat(["a", "b"], 20), name: rng.normal(size=40),
                      "x": rng.normal(size=40)})
    y = 3 * X[name] + 2 * X["x"]
    with pytest.raises(ValueError, match=f"X has a column named '{name}'"):
        GroupedRegressor(LinearRegression(), by="g", backend="serial").fit(
            X, y, sample_weight=np.ones(40))


def test_bad_by_and_keys_and_targets_are_named_before_any_fit():
    X = pd.DataFrame({"g": np.repeat(["a", "b"], 5), "x": np.arange(10.0)})
    y = np.arange(10.0)
    with pytest.raises(ValueError, match="by= names no column"):
        GroupedRegressor(LinearRegression(), by=[]).fit(X, y)
    with pytest.raises(ValueError, match="by= names column 'g' twice"):
        GroupedRegressor(LinearRegression(), by=["g", "g"]).fit(X, y)
    doubled = pd.concat([X, X[["g"]]], axis=1)
    with pytest.raises(ValueError, match="X has two columns named 'g'"):
        GroupedRegressor(LinearRegression(), by="g").fit(doubled, y)
    with pytest.raises(TypeError, match="by column 'g': a group key must be a string or a "
                                        "number, got list"):
        GroupedRegressor(LinearRegression(), by="g").fit(X.assign(g=[[1]] * 10), y)
    with pytest.raises(ValueError, match=r"an estimator \(an instance: DummyRegressor\(\)\)"):
        GroupedRegressor(LinearRegression(), by="g", fallback=DummyRegressor).fit(X, y)
    for target in (np.array([1, "one"] * 5, dtype=object), np.linspace(0, 1, 10)):
        with pytest.raises(ValueError, match="Unknown label type"):
            GroupedClassifier(LogisticRegression(), by="g", backend="serial").fit(X, target)


def test_a_key_of_a_zone_finds_its_model_given_in_another_zone():
    rng = np.random.default_rng(0)
    days = pd.to_datetime(np.repeat(["2024-01-01", "2024-01-02"], 10))
    X = pd.DataFrame({"day": days.tz_localize("Europe/Amsterdam"), "x": rng.normal(size=20)})
    y = X["x"] * np.repeat([1.0, 5.0], 10)
    model = GroupedRegressor(LinearRegression(), by="day", fallback="error",
                             backend="serial").fit(X, y)
    in_utc = X.assign(day=X["day"].dt.tz_convert("UTC"))
    np.testing.assert_allclose(model.predict(in_utc), model.predict(X))
    naive = X.assign(day=days)  # a naive time is no instant: not the same key
    with pytest.raises(ValueError, match="holds naive datetimes .* keys of zone-aware "
                                         "datetimes"):
        model.predict(naive)


@pytest.mark.parametrize("name", ["n", "intercept", "status", "r2", "aic"])
def test_linear_refuses_a_by_column_named_like_a_result_column(name):
    rng = np.random.default_rng(0)
    table = pd.DataFrame({name: np.repeat(["a", "b"], 20), "x": rng.normal(size=40)})
    table["y"] = 2 * table["x"]
    with pytest.raises(ValueError, match=f"by column '{name}' has the name of a column of "
                                         "the result"):
        mm.linear(table, by=name, features=["x"], target="y")


def test_a_function_returning_a_dict_is_refused_by_name():
    frame = pd.DataFrame({"s": list("aabbc"), "v": [1.0, 2, 3, 4, 5]})
    with pytest.raises(TypeError, match="the function given to map_groups returned a dict for 'a', "
                                        "not a table"):
        mm.map_groups(lambda rows: {"total": rows["v"].sum()}, mm.groups(frame, by="s"),
                      backend="serial")
    big = pd.DataFrame({"v": np.arange(500.0)})
    with pytest.raises(TypeError, match="must return a table, got a dict"):
        mm.map_partitions(lambda part: {"total": part["v"].sum()}, big)  # in this process
    with pytest.raises(TypeError, match="returned a dict for 0, not a table"):
        mm.map_partitions(lambda part: {"total": part["v"].sum()}, big, partitions=3,
                          backend="serial")


def test_map_partitions_checks_its_outputs_on_either_path():
    """Whether fn runs once here or split must not decide what is accepted."""
    frame = pd.DataFrame({"v": np.arange(1000.0)})
    for fn in (lambda part: part["v"].sum(), lambda part: None):
        for split in ({}, {"partitions": 4, "backend": "serial"}):
            with pytest.raises(TypeError, match="must return a table"):
                mm.map_partitions(fn, frame, **split)
    pl = pytest.importorskip("polars")
    labelled = pd.DataFrame({"v": np.arange(9.0)}, index=np.arange(9) * 10)
    with pytest.raises(TypeError, match="returned pandas for partition 0 and a polars "
                                        "DataFrame for partition 1"):
        mm.map_partitions(lambda part: part if part.index[0] == 0 else pl.from_pandas(part),
                          labelled, partitions=3, backend="serial")

