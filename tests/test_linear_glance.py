"""mm.linear's broom glance row per group (r_squared ... nobs), vectorised,
against statsmodels' OLS and WLS fitted group by group: random groups,
rank-deficient ones counted by their rank as R does, one-row and constant
groups."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from manymodels.models.linear.glance import f_upper_tail

COLUMNS = ["r_squared", "adj_r_squared", "sigma", "statistic", "p_value", "df", "log_lik",
           "aic", "bic", "deviance", "df_residual", "nobs"]


def random_groups(seed: int = 0, groups: int = 40) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frames = []
    for g in range(groups):
        n = int(rng.integers(4, 30))
        x1, x2 = rng.normal(size=n), rng.normal(size=n) * 3 + 10
        x3 = 2.0 * x1 if g % 5 == 0 else rng.normal(size=n)  # every fifth: collinear
        y = 1.5 * x1 - 0.3 * x2 + rng.normal(scale=0.5 + g % 3, size=n) + g
        frames.append(pd.DataFrame({"g": g, "x1": x1, "x2": x2, "x3": x3, "y": y,
                                    "w": rng.uniform(0.2, 3.0, n)}))
    return pd.concat(frames, ignore_index=True)


def statsmodels_glance(rows: pd.DataFrame, features: list[str], weighted: bool,
                       intercept: bool) -> dict:
    """broom's glance row from statsmodels (its AIC and BIC leave sigma out
    of the count: R's and broom's add 2 and log(n), as mm.glance does)."""
    from statsmodels.regression.linear_model import OLS, WLS

    X = rows[features].to_numpy()
    if intercept:
        X = np.column_stack([np.ones(len(rows)), X])
    y = rows["y"].to_numpy()
    fit = (WLS(y, X, weights=rows["w"].to_numpy()) if weighted else OLS(y, X)).fit()
    n = int(fit.nobs)
    return {"r_squared": fit.rsquared, "adj_r_squared": fit.rsquared_adj,
            "sigma": math.sqrt(fit.scale), "statistic": fit.fvalue, "p_value": fit.f_pvalue,
            "df": fit.df_model, "log_lik": fit.llf, "aic": fit.aic + 2,
            "bic": fit.bic + math.log(n), "deviance": fit.ssr, "df_residual": fit.df_resid,
            "nobs": n}


@pytest.mark.parametrize("weighted,intercept", [(False, True), (True, True), (False, False)])
@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::UserWarning")
def test_glance_equals_statsmodels_per_group(weighted, intercept):
    pytest.importorskip("statsmodels")
    frame = random_groups()
    features = ["x1", "x2", "x3"]
    result = mm.linear(frame, by="g", features=features, target="y",
                       family="wls" if weighted else "ols",
                       weights="w" if weighted else None, fit_intercept=intercept)
    metrics = result.metrics.set_index("g")
    assert (metrics.loc[::5, "status"] == "rank_deficient").all()
    for g, rows in frame.groupby("g"):
        expected = statsmodels_glance(rows, features, weighted, intercept)
        got = metrics.loc[g, COLUMNS]
        exact = expected["df_residual"] == 0  # its RSS is rounding: no log-likelihood
        for name in COLUMNS:
            if not np.isfinite(expected[name]) or (exact and name in ("log_lik", "aic", "bic")):
                assert np.isnan(got[name]), (g, name)
                continue
            assert got[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), (g, name)
        if g % 5 == 0:  # counted by its rank: x3 = 2 x1 adds no degree of freedom
            assert got["df"] == 2 and got["df_residual"] == len(rows) - 2 - int(intercept)
    # rmse stays sqrt(RSS / n) beside sigma = sqrt(RSS / (n - p)), unweighted
    if not weighted:
        assert np.allclose(metrics["rmse"], np.sqrt(metrics["deviance"] / metrics["nobs"]))
    assert metrics["df"].dtype == np.int64 and metrics["nobs"].dtype == np.int64


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_rows_of_weight_zero_are_not_observations_as_r_counts_them():
    """As docs/guide/linear.md says: nobs counts the rows that weigh
    something (R's lm), so the row equals statsmodels' WLS of those rows
    (statsmodels' WLS of every row counts the zeros, its llf -inf)."""
    pytest.importorskip("statsmodels")
    rows = random_groups(groups=1)
    rows.loc[:2, "w"] = 0.0
    got = mm.linear(rows, by="g", features=["x1", "x2"], target="y", family="wls",
                    weights="w").metrics.iloc[0]
    expected = statsmodels_glance(rows[rows["w"] > 0], ["x1", "x2"], True, True)
    assert got["nobs"] == expected["nobs"] == len(rows) - 3
    for name in COLUMNS:
        assert got[name] == pytest.approx(expected[name], rel=1e-9), name


def test_one_row_constant_and_perfect_groups_get_nan_where_r_has_no_value():
    frame = pd.DataFrame({
        "g": ["one", "const", "const", "const", "perfect", "perfect", "perfect", "two", "two"],
        "x": [1.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0],
        "y": [5.0, 7.0, 7.0, 7.0, 1.0, 3.0, 5.0, 1.0, 4.0]})
    m = mm.linear(frame, by="g", features=["x"], target="y").metrics.set_index("g")
    one = m.loc["one"]
    assert (one["nobs"], one["df"], one["df_residual"]) == (1, 0, 0)
    for name in ("r_squared", "adj_r_squared", "sigma", "statistic", "p_value", "log_lik"):
        assert np.isnan(one[name]), name
    const = m.loc["const"]  # a constant target: no variance to explain, a perfect fit
    assert np.isnan(const["r_squared"]) and np.isnan(const["statistic"])
    assert const["sigma"] == 0 and const["deviance"] == 0 and const["df_residual"] == 1
    assert np.isnan(const["log_lik"]) and np.isnan(const["aic"])
    perfect = m.loc["perfect"]
    assert perfect["r_squared"] == pytest.approx(1.0) and perfect["df"] == 1
    two = m.loc["two"]  # two rows, a line through both: no residual degrees of freedom
    assert two["df_residual"] == 0 and np.isnan(two["sigma"]) and np.isnan(two["p_value"])


def test_glance_equals_mm_glance_of_linear_regression_on_a_collinear_group():
    from sklearn.linear_model import LinearRegression

    frame = random_groups(seed=3, groups=10)
    features = ["x1", "x2", "x3"]
    batched = mm.linear(frame, by="g", features=features, target="y").metrics.set_index("g")
    for g, rows in frame.groupby("g"):
        model = LinearRegression().fit(rows[features], rows["y"])
        single = mm.glance(model, rows[features], rows["y"])
        for name in COLUMNS:
            assert batched.loc[g, name] == pytest.approx(single[name], rel=1e-8), (g, name)


def test_ridge_counts_the_rank_of_its_design_and_its_statistics_are_mm_glance_s():
    from sklearn.linear_model import Ridge

    frame = random_groups(seed=5, groups=10)
    features = ["x1", "x2", "x3"]
    batched = mm.linear(frame, by="g", features=features, target="y", family="ridge",
                        alpha=0.5).metrics.set_index("g")
    for g, rows in frame.groupby("g"):
        single = mm.glance(Ridge(alpha=0.5).fit(rows[features], rows["y"]), rows[features],
                           rows["y"])
        for name in ("df", "df_residual", "sigma", "aic", "r_squared"):
            assert batched.loc[g, name] == pytest.approx(single[name], rel=1e-8), (g, name)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_ridge_counts_a_feature_of_small_units_beside_one_of_large_units(device):
    """A rate about 0.05 beside an income about 5e4: their Gram matrix's
    eigenvalues lie 1e11 apart, and the rate counted for nothing (df 1)."""
    from sklearn.linear_model import Ridge

    if device is not None:
        pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    rows = pd.DataFrame({"g": 0, "income": rng.normal(5e4, 2e4, 30),
                         "rate": rng.normal(0.05, 0.01, 30)})
    rows["y"] = rows["income"] * 1e-3 + rows["rate"] * 100 + rng.normal(size=30)
    features = ["income", "rate"]
    batched = mm.linear(rows, by="g", features=features, target="y", family="ridge",
                        alpha=1e-3, device=device).metrics.iloc[0]
    single = mm.glance(Ridge(alpha=1e-3).fit(rows[features], rows["y"]), rows[features],
                       rows["y"])
    assert batched["df"] == single["df"] == 2
    for name in ("df_residual", "sigma", "statistic", "p_value", "aic"):
        assert batched[name] == pytest.approx(single[name], rel=1e-8), name


def test_the_f_tail_equals_scipy_far_into_the_tail():
    from scipy import stats

    rng = np.random.default_rng(1)
    f = np.concatenate([rng.uniform(0, 5, 500), rng.uniform(5, 5000, 500)])
    d1 = rng.integers(1, 12, 1000).astype(float)
    d2 = rng.integers(1, 3000, 1000).astype(float)
    expected = stats.f.sf(f, d1, d2)
    got = f_upper_tail(f, d1, d2)
    assert expected.min() < 1e-200  # the tail reaches tiny values, kept relative
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-300)  # subnormals aside


def test_glance_survives_the_store(tmp_path):
    frame = random_groups(seed=2, groups=6)
    first = mm.linear(frame, by="g", features=["x1", "x2"], target="y", store=tmp_path)
    loaded = mm.Store(tmp_path).linear()
    pd.testing.assert_frame_equal(first.metrics[COLUMNS], loaded.metrics[COLUMNS])


def test_a_deviance_past_float64_s_range_is_infinite_without_a_warning():
    """A target about 1e160: its deviance (RSS at the target's scale) is
    infinite, as documented, but numpy also warned "overflow encountered in
    multiply" from inside mm.linear. The value says it; no warning leaks."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=12)
    frame = pd.DataFrame({"g": "a", "x": x, "y": (1 + 2 * x + rng.normal(size=12)) * 1e160})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        row = mm.linear(frame, by="g", features=["x"], target="y").metrics.iloc[0]
    assert np.isinf(row["deviance"]) and np.isfinite(row["sigma"]) and row["status"] == "ok"


def test_the_f_tail_keeps_its_digits_past_a_million_residual_degrees_of_freedom():
    """A group of 1e6 rows or more: ``1 - x`` taken from a rounded ``x``
    near 1, and ``a log x`` beside ``lgamma(a)`` of a large ``a``, cost the
    p-value some 1e-8 relative where 1e-9 is documented."""
    from scipy import stats

    f = np.tile([0.5, 1.0, 1.3, 2.0, 5.0, 10.0, 30.0, 100.0], 6)
    d1 = np.repeat([1.0, 2.0, 3.0], 16)
    d2 = np.tile(np.repeat([1e6 + 3, 1.2e7], 8), 3)
    np.testing.assert_allclose(f_upper_tail(f, d1, d2), stats.f.sf(f, d1, d2), rtol=1e-9)


def test_weighted_rmse_is_scikit_learns_weighted_one():
    """The weighted rmse is the weighted RSS over the sum of the weights
    (mean_squared_error's sample_weight), as docs/guide/linear.md says."""
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import mean_squared_error

    table = random_groups(seed=3, groups=3)
    fitted = mm.linear(table, by="g", features=["x1", "x2"], target="y", family="wls",
                       weights="w").metrics.set_index("g")
    for g, rows in table.groupby("g"):
        model = LinearRegression().fit(rows[["x1", "x2"]], rows["y"], sample_weight=rows["w"])
        expected = mean_squared_error(rows["y"], model.predict(rows[["x1", "x2"]]),
                                      sample_weight=rows["w"]) ** 0.5
        assert fitted.loc[g, "rmse"] == pytest.approx(expected, rel=1e-9)
