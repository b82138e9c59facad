"""mm.glance: R's broom::glance of a linear model, checked against R's own
numbers for ``lm(mpg ~ wt, mtcars)`` and against a hand computation."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Lasso, LinearRegression, LogisticRegression

import manymodels as mm

MPG = [21.0, 21.0, 22.8, 21.4, 18.7, 18.1, 14.3, 24.4, 22.8, 19.2, 17.8, 16.4, 17.3, 15.2, 10.4,
       10.4, 14.7, 32.4, 30.4, 33.9, 21.5, 15.5, 15.2, 13.3, 19.2, 27.3, 26.0, 30.4, 15.8, 19.7,
       15.0, 21.4]
WT = [2.620, 2.875, 2.320, 3.215, 3.440, 3.460, 3.570, 3.190, 3.150, 3.440, 3.440, 4.070, 3.730,
      3.780, 5.250, 5.424, 5.345, 2.200, 1.615, 1.835, 2.465, 3.520, 3.435, 3.840, 3.845, 1.935,
      2.140, 1.513, 3.170, 2.770, 3.570, 2.780]

#: broom::glance(lm(mpg ~ wt, data = mtcars)) in R
R_GLANCE = {"r_squared": 0.7528328, "adj_r_squared": 0.7445939, "sigma": 3.045882,
            "statistic": 91.37533, "p_value": 1.293959e-10, "df": 1, "log_lik": -80.01471,
            "aic": 166.0294, "bic": 170.4266, "deviance": 278.3219, "df_residual": 30,
            "nobs": 32}


def test_glance_equals_r_for_mtcars():
    X = pd.DataFrame({"wt": WT})
    model = LinearRegression().fit(X, MPG)
    assert model.intercept_ == pytest.approx(37.2851, abs=1e-4)  # R's coef(lm(mpg ~ wt))
    got = mm.glance(model, X, MPG)
    assert set(got) == set(R_GLANCE)
    for name, value in R_GLANCE.items():
        assert got[name] == pytest.approx(value, rel=1e-6), name


def test_glance_by_hand_with_several_features_and_no_intercept():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(50, 3))
    y = X @ [1.0, -2.0, 0.5] + rng.normal(size=50)
    model = LinearRegression(fit_intercept=False).fit(X, y)
    got = mm.glance(model, X, y)
    residual = y - X @ np.linalg.lstsq(X, y, rcond=None)[0]
    rss, n, p = float(residual @ residual), 50, 3
    # TSS about 0, as R's lm(y ~ 0 + X)
    assert got["r_squared"] == pytest.approx(1 - rss / float(y @ y))
    assert got["sigma"] == pytest.approx(math.sqrt(rss / (n - p)))
    assert got["df"] == 3 and got["df_residual"] == 47
    log_lik = -n / 2 * (math.log(2 * math.pi * rss / n) + 1)
    assert got["aic"] == pytest.approx(-2 * log_lik + 2 * (p + 1))
    assert got["bic"] == pytest.approx(-2 * log_lik + math.log(n) * (p + 1))
    lasso = Lasso(alpha=0.5).fit(np.column_stack([X, rng.normal(size=50)]), y)
    assert mm.glance(lasso, np.column_stack([X, np.zeros(50)]), y)["df"] == int(
        np.count_nonzero(lasso.coef_))  # zero coefficients are not degrees of freedom


def test_glance_counts_the_rank_not_collinear_coefficients():
    """A duplicated feature: LinearRegression splits its coefficient in two
    (least norm), but the model has rank 2, as R's lm (an NA coefficient)
    and statsmodels' OLS say: df 1, df_residual n - 2 (issue 37, item 10)."""
    rng = np.random.default_rng(37)
    x = rng.normal(size=12)
    y = 0.3 * x + rng.normal(size=12)
    X = pd.DataFrame({"x": x, "x_again": x})
    model = LinearRegression().fit(X, y)
    assert np.count_nonzero(model.coef_) == 2  # the split that was counted as 3 parameters
    got = mm.glance(model, X, y)
    design = np.column_stack([np.ones(12), X.to_numpy()])
    beta = np.linalg.lstsq(design, y, rcond=None)[0]
    rank, n = int(np.linalg.matrix_rank(design)), 12
    assert rank == 2
    rss = float(np.sum((y - design @ beta) ** 2))
    tss = float(np.sum((y - y.mean()) ** 2))
    r2 = 1 - rss / tss
    log_lik = -n / 2 * (math.log(2 * math.pi * rss / n) + 1)
    assert got["df"] == 1 and got["df_residual"] == 10
    assert got["r_squared"] == pytest.approx(r2)
    assert got["adj_r_squared"] == pytest.approx(1 - (1 - r2) * (n - 1) / (n - rank))
    assert got["sigma"] == pytest.approx(math.sqrt(rss / (n - rank)))
    assert got["aic"] == pytest.approx(-2 * log_lik + 2 * (rank + 1))
    assert got["bic"] == pytest.approx(-2 * log_lik + math.log(n) * (rank + 1))
    statistic = (tss - rss) / (rss / (n - rank))
    assert got["statistic"] == pytest.approx(statistic)
    # the same numbers as the model with the feature once
    once = mm.glance(LinearRegression().fit(X[["x"]], y), X[["x"]], y)
    assert got == pytest.approx(once)
    # a feature constant in the rows is collinear with the intercept: no degree of freedom
    constant = X.assign(x_again=5.0)
    assert mm.glance(LinearRegression().fit(constant, y), constant, y)["df"] == 1


def test_glance_counts_the_rank_of_a_far_from_zero_feature_as_mm_linear():
    """A feature of 1e12 + noise: its uncentred column and the intercept's
    ones are parallel to rounding, so glance counted rank 1 (df 0, no F)
    for a slope LinearRegression fitted (r2 0.93); mm.linear counts df 1."""
    rng = np.random.default_rng(0)
    noise = rng.normal(size=20)
    table = pd.DataFrame({"g": "a", "x": 1e12 + noise, "y": 3 * noise + rng.normal(size=20)})
    model = LinearRegression().fit(table[["x"]], table["y"])
    got = mm.glance(model, table[["x"]], table["y"])
    linear = mm.linear(table, by="g", features=["x"], target="y").metrics.iloc[0]
    assert got["df"] == linear["df"] == 1 and got["df_residual"] == 18
    for name in ("r_squared", "adj_r_squared", "sigma", "statistic", "aic"):
        assert got[name] == pytest.approx(linear[name], rel=1e-4), name  # (x to 1e-4)


def test_glance_refuses_what_it_cannot_describe():
    X = np.arange(10.0).reshape(-1, 1)
    with pytest.raises(TypeError, match="linear regression.*LogisticRegression"):
        mm.glance(LogisticRegression().fit(X, [0, 1] * 5), X, [0, 1] * 5)
    with pytest.raises(ValueError, match="one target"):
        mm.glance(LinearRegression().fit(X, np.column_stack([X[:, 0], -X[:, 0]])), X, X)
    with pytest.raises(ValueError, match="X has 2"):
        mm.glance(LinearRegression().fit(X, X[:, 0]), np.column_stack([X, X]), X[:, 0])
    # a y with missing values (not what the model was fitted on) made every
    # statistic NaN, with nobs and df_residual counting those rows
    missing = np.where(X[:, 0] > 2, X[:, 0], np.nan)
    with pytest.raises(ValueError, match=r"y has 3 missing or infinite value\(s\)"):
        mm.glance(LinearRegression().fit(X, X[:, 0]), X, missing)


def gapminder_like_fit(df):
    model = LinearRegression().fit(df[["year"]], df["life_exp"])
    return model, mm.glance(model, df[["year"]], df["life_exp"])


def test_glance_as_the_metrics_of_many_models():
    rng = np.random.default_rng(5)
    years = np.arange(1952, 2008, 5)
    frame = pd.concat([pd.DataFrame({"country": c, "year": years,
                                     "life_exp": 40 + slope * (years - 1952)
                                     + rng.normal(scale=noise, size=len(years))})
                       for c, slope, noise in [("A", 0.3, 0.5), ("B", 0.1, 3.0)]])
    run = mm.train(gapminder_like_fit, mm.groups(frame, by="country", order_by="year"),
                   backend="serial", progress=False)
    results = run.results.set_index("country")
    assert results.loc["A", "r_squared"] > 0.9 > results.loc["B", "r_squared"]
    assert (results["nobs"] == len(years)).all() and (results["df"] == 1).all()


def test_a_constant_target_has_no_r_squared_as_in_mm_linear():
    """0.1 seven times spreads about its mean by rounding (1e-33): no
    r_squared, p-value nor log-likelihood, as mm.linear's metrics say."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(7, 1)), np.full(7, 0.1)
    row = mm.glance(LinearRegression().fit(X, y), X, y)
    frame = pd.DataFrame({"g": 0, "x": X[:, 0], "y": y})
    batched = mm.linear(frame, by="g", features="x", target="y").metrics.iloc[0]
    for name in ("r_squared", "adj_r_squared", "statistic", "p_value", "log_lik", "aic"):
        assert np.isnan(row[name]) and np.isnan(batched[name]), name
    assert row["deviance"] == batched["deviance"] == 0.0


@pytest.mark.parametrize("intercept", [True, False])
def test_glance_of_a_weighted_fit_is_weighted_as_r_s_lm_and_mm_linear(intercept):
    """A fit with sample_weight was glanced unweighted (r_squared, sigma, F,
    log_lik of another model than the one fitted): given its weights, the
    row is mm.linear's family="wls" row, rows of weight 0 left out as R's
    lm leaves them."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 2))
    y = X @ [1.0, -2.0] + rng.normal(size=40)
    w = rng.uniform(0.2, 3.0, size=40)
    w[:3] = 0.0
    model = LinearRegression(fit_intercept=intercept).fit(X, y, sample_weight=w)
    got = mm.glance(model, X, y, sample_weight=w)
    frame = pd.DataFrame({"g": 0, "x1": X[:, 0], "x2": X[:, 1], "y": y, "w": w})
    expected = mm.linear(frame, by="g", features=["x1", "x2"], target="y", family="wls",
                         weights="w", fit_intercept=intercept).metrics.iloc[0]
    assert got["nobs"] == 37 and got["df_residual"] == 37 - 2 - int(intercept)
    for name, value in got.items():
        assert value == pytest.approx(expected[name], rel=1e-8), name
    unweighted = mm.glance(model, X, y)
    assert unweighted["nobs"] == 40 and unweighted["sigma"] != pytest.approx(got["sigma"])
    with pytest.raises(ValueError, match="sample_weight has 39 values but y has 40 rows"):
        mm.glance(model, X, y, sample_weight=w[1:])
    with pytest.raises(ValueError, match="sample_weight must be finite and >= 0"):
        mm.glance(model, X, y, sample_weight=-w)
