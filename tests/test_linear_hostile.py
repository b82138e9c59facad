"""mm.linear under hostile but plausible input (each case found by a review
that compared the engines, scikit-learn and the CLI's paths by hand)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import manymodels as mm


def _logistic_objective(frame: pd.DataFrame, coefficients: pd.Series) -> float:
    X, y = frame[["a", "b", "c"]].to_numpy(), frame["yb"].to_numpy(float)
    beta = coefficients[["a", "b", "c"]].to_numpy(float)
    eta = X @ beta + coefficients["intercept"]
    return float(np.sum(np.logaddexp(0, eta) - y * eta) + 0.5 * beta @ beta)


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_pytorch_logistic_on_a_nearly_singular_hessian_agrees_with_numpy(seed):
    """Features about 1e6 with a duplicated column, classes separable: the
    PyTorch engine took a plain gradient step where the Hessian's pivot was
    refused, and then a step that raised the objective, to 1e86-1e156, and
    said ok. Both engines now reach the same optimum."""
    pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    a, b = rng.normal(0, 5e5, 25), rng.normal(0, 5e5, 25)
    frame = pd.DataFrame({"g": 0, "a": a, "b": b, "c": a, "yb": a - 0.3 * b > 0})
    objectives = []
    for device in (None, "cpu"):
        result = mm.linear(frame, "g", ["a", "b", "c"], "yb", family="logistic", device=device)
        assert result.metrics["status"].iloc[0] == "ok"
        objectives.append(_logistic_objective(frame, result.coefficients.iloc[0]))
    assert objectives[0] < 1e-5 and objectives[1] == pytest.approx(objectives[0], abs=1e-7)


@pytest.mark.parametrize("device", [None, "cpu"])
def test_weighted_logistic_groups_of_one_class_are_single_class(device):
    """Groups of unequal sizes (padded blocks), every row class 1, random
    weights: the weighted count of positives and the weights' sum differed
    by an ulp, and a fifth of the groups were fitted as two-class ones."""
    if device is not None:
        pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    sizes = rng.integers(5, 15, size=400)
    frame = pd.DataFrame({"g": np.repeat(np.arange(400), sizes), "x": rng.normal(
        size=sizes.sum()), "w": rng.uniform(0.1, 3.0, sizes.sum()), "y": 1})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = mm.linear(frame, "g", ["x"], "y", family="logistic", weights="w",
                           device=device)
    assert (result.metrics["status"] == "single_class").all()
    assert result.coefficients["x"].isna().all()


def test_the_clis_batched_path_takes_equal_groups_over_65536_rows(tmp_path):
    """Two groups of 70,000 rows: a block's slice was empty (operator
    precedence), and the run fell back to scikit-learn, with a confusing
    note."""
    from manymodels.cli.tabular import train_table

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"g": np.repeat([0, 1], 70_000), "x": rng.normal(size=140_000)})
    frame["y"] = 2 * frame["x"] + frame["g"] + rng.normal(size=140_000)
    done = train_table(frame, by="g", target="y", features=["x"],
                       model="sklearn.linear_model.LinearRegression", store=tmp_path / "s",
                       backend="serial")
    assert done.path_note.startswith("fast path: mm.linear fitted and scored 2 of 2 groups")
    assert done.run.results["r2"].notna().all()


def test_nullable_integer_keys_past_2_53_come_back_from_the_store_as_they_were(tmp_path):
    """Int64 ids above 2**53 with a missing one: read back from the store
    they were floats, two ids one value, and the store's result could not
    predict nor be re-run into again."""
    rng = np.random.default_rng(0)
    ids = pd.array(np.repeat([2**60, 2**60 + 1, None, 7], 10), dtype="Int64")
    frame = pd.DataFrame({"cust": ids, "x": rng.normal(size=40)})
    frame["y"] = np.repeat([1.0, -1.0, 0.0, 5.0], 10) * frame["x"]
    fitted = mm.linear(frame, "cust", ["x"], "y", store=tmp_path / "s", name="m")
    loaded = mm.Store(tmp_path / "s").linear("m")
    assert loaded.keys["cust"].tolist()[:3] == [7, 2**60, 2**60 + 1]
    assert pd.isna(loaded.keys["cust"].iloc[3])
    np.testing.assert_allclose(loaded.predict(frame.iloc[[0, 10, 35]]),
                               fitted.predict(frame.iloc[[0, 10, 35]]))
    again = mm.linear(frame, "cust", ["x"], "y", store=tmp_path / "s", name="m")
    assert again.reused == 4


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("level", [0.1, 7.7])
def test_a_constant_target_has_no_r_squared_and_scikit_learns_r2(device, level):
    """Its spread about its mean was the mean's rounding, a tiny positive
    TSS: r_squared 0 with a p-value of 1 (the docs: NaN), r2 0 where
    scikit-learn's is 1."""
    from sklearn.linear_model import LinearRegression
    from sklearn.metrics import r2_score

    if device is not None:
        pytest.importorskip("torch")
    x = np.random.default_rng(0).normal(size=10)
    frame = pd.DataFrame({"g": "a", "x": x, "y": level})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metrics = mm.linear(frame, "g", ["x"], "y", device=device).metrics.iloc[0]
    expected = r2_score(frame["y"], LinearRegression().fit(frame[["x"]], frame["y"]).predict(
        frame[["x"]]))
    assert metrics["r2"] == expected == 1.0
    assert np.isnan(metrics["r_squared"]) and np.isnan(metrics["p_value"])


def test_an_arrow_table_naming_a_column_twice_is_refused_by_name():
    import pyarrow as pa

    x = np.arange(12.0)
    table = pa.Table.from_arrays([pa.array(["a"] * 6 + ["b"] * 6), pa.array(x),
                                  pa.array(x * 0), pa.array(x + 1)], names=["g", "x", "x", "y"])
    with pytest.raises(ValueError, match="has two columns named 'x'"):
        mm.linear(table, "g", ["x"], "y")


_SCALES = [(1e160, 1.0), (1.0, 1e160), (1e160, 1e160), (1e-170, 1.0), (1.0, 1e-170)]


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("family", ["ols", "ridge"])
def test_values_whose_squares_leave_float64s_range_fit_as_scikit_learn(device, family):
    """Features or a target about 1e160 overflowed X'WX (a 0 coefficient
    marked rank_deficient, or infinite metrics with status ok), and 1e-170
    vanished in it. Such groups are solved again with their columns scaled by
    powers of two: each equals scikit-learn's fit, ridge's penalty still on
    the coefficients as given, and r2 and sigma are those of the same data
    at ordinary scale."""
    if device:
        pytest.importorskip("torch")
    from sklearn.linear_model import LinearRegression, Ridge

    rng = np.random.default_rng(0)
    x1, x2 = rng.normal(size=20), rng.normal(size=20)
    y = 2 * x1 - 3 * x2 + 0.5 + rng.normal(scale=0.1, size=20)
    frame = pd.concat([pd.DataFrame({"g": g, "x1": x1 * sx, "x2": x2 * sx, "y": y * sy})
                       for g, (sx, sy) in enumerate([(1.0, 1.0), *_SCALES])])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = mm.linear(frame, "g", ["x1", "x2"], "y", family=family, device=device)
    assert (result.metrics["status"] == "ok").all()
    assert np.isfinite(result.metrics[["r2", "rmse", "sigma", "log_lik"]].to_numpy(float)).all()
    plain = result.metrics.iloc[0]
    for g, (sx, sy) in enumerate(_SCALES, start=1):
        part = frame[frame["g"] == g]
        got = result.coefficients.iloc[g][["x1", "x2", "intercept"]].to_numpy(float)
        if family == "ols" or sx <= 1:  # scikit-learn's Ridge overflows at 1e160 itself
            reference = (Ridge(alpha=1.0) if family == "ridge" else LinearRegression()).fit(
                part[["x1", "x2"]].to_numpy(), part["y"].to_numpy())
            np.testing.assert_allclose(got, np.r_[reference.coef_, reference.intercept_],
                                       rtol=1e-7)
        metrics = result.metrics.iloc[g]
        if family == "ols":  # the same fit at another scale: the same r2, sigma scaled
            assert metrics["r2"] == pytest.approx(plain["r2"], rel=1e-9)
            assert metrics["sigma"] == pytest.approx(plain["sigma"] * sy, rel=1e-9)
            assert np.isfinite(metrics["log_lik"])


def _exact_ridge(x: np.ndarray, y: np.ndarray, alpha: float) -> list[float]:
    """Ridge with an intercept on rows ``x`` (n, 2), in exact rationals."""
    from fractions import Fraction

    columns = [[Fraction(v) for v in x[:, j]] for j in range(2)] + [[Fraction(v) for v in y]]
    centred = [[v - sum(c) / len(c) for v in c] for c in columns]

    def dot(i: int, j: int) -> Fraction:
        return sum((a * b for a, b in zip(centred[i], centred[j])), Fraction(0))

    a11, a12, a22 = dot(0, 0) + Fraction(alpha), dot(0, 1), dot(1, 1) + Fraction(alpha)
    b1, b2 = dot(0, 2), dot(1, 2)
    det = a11 * a22 - a12 * a12
    return [float((b1 * a22 - a12 * b2) / det), float((a11 * b2 - a12 * b1) / det)]


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("scales", [(1e200, 1e-200), (1e300, 1.0)])
def test_ridge_on_a_feature_far_out_of_range_beside_another_is_exact(device, scales):
    """A feature about 1e-200 in a group rescaled for another's 1e200: its
    penalty, scaled, was alpha / 2**-1328, infinite, and NumPy's SVD 'did not
    converge', losing every group of the call; a huge column's scaled
    penalty leaked an overflow warning, and PyTorch one about a read-only
    array. Each equals ridge solved exactly."""
    if device:
        pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(15, 2))
    y = x @ [1.0, -2.0] + rng.normal(size=15)
    x = x * scales
    frame = pd.concat([pd.DataFrame({"g": g, "a": x[:, 0], "b": x[:, 1], "y": y})
                       for g in (0, 1)])
    frame.loc[frame["g"] == 1, "a"] = rng.normal(size=15)  # a plain group beside it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        result = mm.linear(frame, "g", ["a", "b"], "y", family="ridge", alpha=1.0,
                           device=device)
    assert (result.metrics["status"] == "ok").all()
    for g, rows in frame.groupby("g"):
        want = _exact_ridge(rows[["a", "b"]].to_numpy(), rows["y"].to_numpy(), 1.0)
        np.testing.assert_allclose(result.coef[g], want, rtol=1e-9)


@pytest.mark.parametrize("device", [None, "cpu"])
@pytest.mark.parametrize("weighted", [False, True])
def test_a_feature_constant_in_its_group_is_rank_deficient_as_scikit_learn(device, weighted):
    """A feature constant in a group (a price of 2.99 in every row; promo 1.0
    under weights) whose mean is not exact in float64: centred, its diagonal
    of X'WX was rounding noise (about 1e-30), which the Cholesky's pivot test,
    relative to that same diagonal, passed. The column got a coefficient of
    noise over noise (-84.8 where scikit-learn's least-norm fit gives 0), the
    intercept made up for it, status ok, and df counted it; a prediction at
    another value of that feature was far off."""
    from sklearn.linear_model import LinearRegression

    statsmodels = pytest.importorskip("statsmodels.api")
    if device is not None:
        pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    frames = []
    for g, level in enumerate([2.99, 0.1, 1.0]):
        part = pd.DataFrame({"g": g, "price": rng.uniform(1, 10, 20), "promo": level,
                             "w": rng.uniform(0.5, 2, 20) if weighted else 1.0})
        part["sales"] = 50 - 3 * part["price"] + 8 * part["promo"] + rng.normal(0, 1, 20)
        frames.append(part)
    frame = pd.concat(frames, ignore_index=True)
    result = mm.linear(frame, "g", ["price", "promo"], "sales", device=device,
                       **({"family": "wls", "weights": "w"} if weighted else {}))
    for g, part in enumerate(frames):
        X, y, w = part[["price", "promo"]].to_numpy(), part["sales"].to_numpy(), part["w"]
        reference = LinearRegression().fit(X, y, sample_weight=w)
        got = result.coefficients.iloc[g][["price", "promo", "intercept"]].to_numpy(float)
        np.testing.assert_allclose(got, np.r_[reference.coef_, reference.intercept_],
                                   rtol=1e-8, atol=1e-12)
        elsewhere = part.iloc[:3].assign(promo=0.0)
        np.testing.assert_allclose(result.predict(elsewhere),
                                   reference.predict(elsewhere[["price", "promo"]].to_numpy()),
                                   rtol=1e-8)
        with warnings.catch_warnings():  # (statsmodels says the design is rank-deficient)
            warnings.simplefilter("ignore")
            fit = statsmodels.WLS(y, statsmodels.add_constant(X, has_constant="add"),
                                  weights=w).fit()
        metrics = result.metrics.iloc[g]
        assert metrics["status"] == "rank_deficient"
        assert (metrics["df"], metrics["df_residual"]) == (fit.df_model, fit.df_resid)
        assert metrics["sigma"] == pytest.approx(np.sqrt(fit.scale), rel=1e-9)
        assert metrics["p_value"] == pytest.approx(fit.f_pvalue, rel=1e-7)


def test_a_near_collinear_groups_fit_statistics_equal_statsmodels():
    """Two features 1e-7 apart: the coefficients are about 1e6 of opposite
    signs, and the SSE from the normal equations, ``y'y - 2b'X'y + b'X'Xb``,
    cancelled terms of about 1e13 to 7.5: deviance 7.5515 where statsmodels'
    is 7.5460 (1.5% off for another draw), and r_squared, sigma, F, AIC and
    BIC with it, status ok. Such a group's SSE now comes from its residuals."""
    statsmodels = pytest.importorskip("statsmodels.api")
    rng = np.random.default_rng(0)
    frames, fits = [], []
    for g in range(4):
        X = rng.normal(size=(15, 3))
        X[:, 2] = X[:, 0] + 1e-7 * rng.normal(size=15)
        y = X @ [1.0, 2.0, 3.0] + rng.normal(size=15)
        frames.append(pd.DataFrame({"g": g, "x1": X[:, 0], "x2": X[:, 1], "x3": X[:, 2],
                                    "y": y}))
        fits.append(statsmodels.OLS(y, statsmodels.add_constant(X)).fit())
    frame = pd.concat(frames, ignore_index=True)
    result = mm.linear(frame, "g", ["x1", "x2", "x3"], "y")
    for g, fit in enumerate(fits):
        metrics = result.metrics.iloc[g]
        assert metrics["deviance"] == pytest.approx(fit.ssr, rel=1e-9)
        assert metrics["r_squared"] == pytest.approx(fit.rsquared, rel=1e-9)
        assert metrics["sigma"] == pytest.approx(np.sqrt(fit.scale), rel=1e-9)
        assert metrics["statistic"] == pytest.approx(fit.fvalue, rel=1e-9)
        assert metrics["log_lik"] == pytest.approx(fit.llf, rel=1e-9)
        residual = frames[g]["y"] - result.predict(frames[g])
        assert metrics["deviance"] == pytest.approx(float((residual ** 2).sum()), rel=1e-9)


def test_a_group_without_weight_has_no_degrees_of_freedom_fresh_or_from_the_store(tmp_path):
    """Every weight of group b 0: its float metrics were NaN, but ``df`` was 0
    and ``df_residual`` -1 (0 rows less 1 coefficient), made-up numbers the
    docs say are blank. They are <NA> now, fresh, loaded from the store and
    copied into a re-run; the other group's still equal statsmodels'."""
    statsmodels = pytest.importorskip("statsmodels.api")
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"g": np.repeat(["a", "b"], 10), "x": rng.normal(size=20),
                          "w": np.r_[rng.uniform(0.5, 2, 10), np.zeros(10)]})
    frame["y"] = 2 * frame["x"] + rng.normal(size=20)
    a = frame[frame["g"] == "a"]
    fit = statsmodels.WLS(a["y"], statsmodels.add_constant(a[["x"]]), weights=a["w"]).fit()
    fresh = mm.linear(frame, "g", ["x"], "y", family="wls", weights="w",
                      store=tmp_path / "s", name="m")
    loaded = mm.Store(tmp_path / "s").linear("m")
    again = mm.linear(frame, "g", ["x"], "y", family="wls", weights="w",
                      store=tmp_path / "s", name="m")
    assert again.reused == 2
    for result in (fresh, loaded, again):
        metrics = result.metrics.set_index("g")
        assert metrics.loc["b", "status"] == "no_weight" and metrics.loc["b", "nobs"] == 0
        assert pd.isna(metrics.loc["b", "df"]) and pd.isna(metrics.loc["b", "df_residual"])
        assert (metrics.loc["a", "df"], metrics.loc["a", "df_residual"]) == (
            fit.df_model, fit.df_resid)
        assert metrics.loc["a", "sigma"] == pytest.approx(np.sqrt(fit.scale), rel=1e-9)


_GLANCE = ["r_squared", "adj_r_squared", "sigma", "statistic", "p_value", "df", "log_lik",
           "aic", "bic", "deviance", "df_residual", "nobs"]


@pytest.mark.parametrize("family", ["ols", "ridge"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_mm_glance_and_mm_linear_agree_on_a_fit_without_residual_degrees_of_freedom(
        family, fit_intercept):
    """Two rows, two features: an interpolating fit whose RSS is rounding.
    mm.linear's log-likelihood was NaN (as its docs say), mm.glance's a
    number made of that rounding (+67 for OLS), and AIC and BIC with it."""
    from sklearn.linear_model import LinearRegression, Ridge

    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(2, 2)), rng.normal(size=2)
    model = (LinearRegression(fit_intercept=fit_intercept) if family == "ols"
             else Ridge(alpha=1.0, fit_intercept=fit_intercept)).fit(X, y)
    single = mm.glance(model, X, y)
    frame = pd.DataFrame({"g": "a", "x1": X[:, 0], "x2": X[:, 1], "y": y})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        batched = mm.linear(frame, "g", ["x1", "x2"], "y", family=family,
                            fit_intercept=fit_intercept).metrics.iloc[0]
    assert single["df_residual"] == batched["df_residual"] == 0
    for name in _GLANCE:
        if np.isnan(batched[name]):
            assert np.isnan(single[name]), name
        else:
            assert single[name] == pytest.approx(batched[name], rel=1e-8, abs=1e-12), name
    assert np.isnan(single["log_lik"]) and np.isnan(single["aic"]) and np.isnan(single["bic"])


@pytest.mark.parametrize("C", [np.float32(0.5), np.int64(2), np.float64(1.5), 3])
def test_c_may_be_a_numpy_number_as_alpha_may(C):
    """``C=np.float32(1)`` and ``np.int64`` were refused ("C must be a positive
    number") while ``alpha`` took them and ``C=True`` passed as 1."""
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"g": "a", "x": rng.normal(size=60)})
    frame["y"] = (frame["x"] + rng.normal(size=60) > 0).astype(int)
    result = mm.linear(frame, "g", ["x"], "y", family="logistic", C=C)
    reference = LogisticRegression(C=float(C), tol=1e-10, max_iter=1000).fit(
        frame[["x"]], frame["y"])
    got = result.coefficients.iloc[0][["x", "intercept"]].to_numpy(float)
    np.testing.assert_allclose(got, np.r_[reference.coef_[0], reference.intercept_], rtol=1e-5)


@pytest.mark.parametrize("C", [True, np.bool_(True), 0, np.float32(-1), np.inf, "1"])
def test_c_that_is_a_bool_or_not_a_positive_number_is_refused(C):
    frame = pd.DataFrame({"g": "a", "x": np.arange(6.0), "y": [0, 1] * 3})
    with pytest.raises(ValueError, match="C must be a positive number"):
        mm.linear(frame, "g", ["x"], "y", family="logistic", C=C)


@pytest.mark.parametrize("by", [["k"], ["k", "j"]])
def test_integer_keys_past_2_53_beside_a_missing_one_stay_apart(by):
    """An Arrow (polars, Parquet) int64 key column with a null and no pandas
    metadata was read as float64: the keys 2**53 and 2**53 + 1 read the
    same and their groups were fitted as one. They are Int64 now, every
    digit kept, as mm.train keys them."""
    import pyarrow as pa

    big = 2**53
    table = pa.table({"k": pa.array([big] * 3 + [big + 1] * 3 + [None] * 3, pa.int64()),
                      "j": ["a"] * 9, "x": [0.0, 1, 2] * 3,
                      "y": [0.0, 1, 2, 0, 5, 10, 0, 9, 18]})
    result = mm.linear(table, by=by, features=["x"], target="y")
    assert str(result.metrics["k"].dtype) == "Int64"
    assert result.metrics["k"].tolist()[:2] == [big, big + 1]
    assert result.metrics["k"].isna().tolist() == [False, False, True]
    assert result.coefficients["x"].tolist() == pytest.approx([1.0, 5.0, 9.0])
    assert result.predict(table).tolist() == pytest.approx([0, 1, 2, 0, 5, 10, 0, 9, 18],
                                                           abs=1e-9)


def _index_descriptors(store) -> int:
    import os

    index = os.path.realpath(store / "index.sqlite")
    names = (os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd"))
    return sum(name == index for name in names)


def test_an_unknown_device_is_refused_before_the_store_is_opened(tmp_path):
    """A store given to mm.linear was opened (an index connection held for
    good) before device= was refused."""
    pytest.importorskip("torch")
    frame = pd.DataFrame({"g": [1, 1, 1], "x": [1.0, 2.0, 3.0], "y": [2.0, 4.0, 6.5]})
    mm.linear(frame, "g", ["x"], "y", store=tmp_path / "s", name="m")
    before = _index_descriptors(tmp_path / "s")
    with pytest.raises(ValueError, match="unknown device 'nowhere'"):
        mm.linear(frame, "g", ["x"], "y", store=tmp_path / "s", name="m", device="nowhere")
    assert _index_descriptors(tmp_path / "s") == before


@pytest.mark.parametrize("device", ["meta", "mps", "xpu"])
def test_a_device_the_kernels_cannot_run_on_is_refused_before_a_store_is_made(tmp_path,
                                                                                device):
    """device='meta' (or 'mps', 'xpu') was accepted, failed in the fit with
    PyTorch's own error ("Cannot copy out of meta tensor"), after the store
    was made and a run begun in it."""
    pytest.importorskip("torch")
    frame = pd.DataFrame({"g": [1, 1, 1], "x": [1.0, 2.0, 3.0], "y": [2.0, 4.0, 6.5]})
    with pytest.raises(ValueError, match=f"device '{device}': mm.linear runs on 'cpu' or "
                                         f"'cuda'"):
        mm.linear(frame, "g", ["x"], "y", store=tmp_path / "s", device=device)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("device", [0, True, 1.5])
def test_a_device_that_is_no_name_is_refused_naming_the_argument(device):
    pytest.importorskip("torch")
    frame = pd.DataFrame({"g": [1, 1, 1], "x": [1.0, 2.0, 3.0], "y": [2.0, 4.0, 6.5]})
    with pytest.raises(TypeError, match="device must be a name such as 'cuda'"):
        mm.linear(frame, "g", ["x"], "y", device=device)


def test_cuda_on_a_pytorch_built_without_cuda_says_so():
    torch = pytest.importorskip("torch")
    if torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None:
        pytest.skip("this PyTorch is built with CUDA")
    frame = pd.DataFrame({"g": [1, 1, 1], "x": [1.0, 2.0, 3.0], "y": [2.0, 4.0, 6.5]})
    for device in ("cuda", "cuda:1"):
        with pytest.raises(ValueError, match=rf"device '{device}': this PyTorch \(.*\) is "
                                             "built without CUDA"):
            mm.linear(frame, "g", ["x"], "y", device=device)


def test_the_device_checks_linear_step_on_the_cpu_compares_pytorch_with_numpy(tmp_path):
    """``bench/device_check.py linear --device cpu`` (the smoke run's) keyed
    both fits by device name, "cpu": PyTorch's result replaced NumPy's and was
    compared with itself (walls equal, difference 0). Here, where PyTorch is
    loaded already: in test_device_check.py it would make later workers spawn."""
    pytest.importorskip("torch")
    import importlib.util
    import json
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "bench" / "device_check.py"
    spec = importlib.util.spec_from_file_location("device_check_under_test", script)
    device_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(device_check)
    out = tmp_path / "linear.json"
    assert device_check.main(["linear", "--groups", "50", "--device", "cpu",
                              "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [row["family"] for row in rows] == ["ols", "logistic"]
    for row in rows:  # two fits, each timed on its own
        assert row["reference"] == "numpy" and row["engine"] == "torch"
        assert row["cpu_s"] != row["device_s"]
        assert row["max_rel_diff"] < 1e-6 and row["compared_groups"] == 50


@pytest.mark.parametrize("family, argument", [("ols", {"alpha": 1.0}), ("wls", {"C": 0.5}),
                                              ("ridge", {"max_iter": 5}),
                                              ("logistic", {"alpha": "a"}),
                                              ("ols", {"tol": 1e-3})])
def test_an_argument_the_family_does_not_use_is_refused_by_name(family, argument, tmp_path):
    """``family="ols", alpha=1.0`` fitted an unpenalised model and said
    nothing: an argument a family does not read is refused before any work
    (no store is made), naming it and the family."""
    frame = pd.DataFrame({"g": "a", "x": np.arange(6.0), "y": [0, 1] * 3, "w": 1.0,
                          "a": 1.0})
    (name,) = argument
    with pytest.raises(ValueError, match=rf"^{name}= applies to family=.* "
                                         rf"family='{family}' does not use it"):
        mm.linear(frame, "g", ["x"], "y", family=family, weights="w",
                  store=tmp_path / "models", **argument)
    assert not (tmp_path / "models").exists()
