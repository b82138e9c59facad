"""mm.linear: batched per-group linear models against scikit-learn, group by group."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.metrics import mean_squared_error, r2_score

import manymodels as mm

FEATURES = ["a", "b", "c"]


def sales(groups: int = 120, seed: int = 0, max_rows: int = 40) -> pd.DataFrame:
    """Groups of unequal sizes (1 to max_rows rows), two key columns, rows shuffled,
    features on different scales and offsets."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, max_rows, size=groups)
    group = np.repeat(np.arange(groups), sizes)
    n = len(group)
    X = rng.normal(size=(n, 3)) * [1.0, 10.0, 0.1] + [5.0, 100.0, 0.0]
    frame = pd.DataFrame({"store": [f"s{g % 7}" for g in group], "item": group // 7,
                          "a": X[:, 0], "b": X[:, 1], "c": X[:, 2]})
    coef = rng.normal(size=(groups, 3))[group]
    frame["y"] = (X * coef).sum(axis=1) + group + rng.normal(size=n)
    frame["w"] = rng.uniform(0.1, 2.0, n)
    frame["alpha"] = (group % 3 + 0.5).astype(float)
    logit = 2.0 * (X[:, 0] - 5.0) + 0.1 * (X[:, 1] - 100.0)
    frame["label"] = (rng.uniform(size=n) < 1 / (1 + np.exp(-logit))).astype(int)
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def per_group(frame: pd.DataFrame, fitted: mm.LinearResult):
    coefficients = fitted.coefficients.set_index(["store", "item"])
    metrics = fitted.metrics.set_index(["store", "item"])
    for key, rows in frame.groupby(["store", "item"]):
        yield key, rows, coefficients.loc[key], metrics.loc[key]


def close(got: np.ndarray, want: np.ndarray, rtol: float) -> bool:
    scale = max(np.max(np.abs(want)), 1e-12)
    return bool(np.max(np.abs(np.asarray(got, float) - want)) <= rtol * scale)


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("family", ["ols", "wls", "ridge", "ridge-column"])
def test_least_squares_equal_scikit_learn_per_group(family, fit_intercept):
    frame = sales()
    kwargs = {"fit_intercept": fit_intercept}
    if family == "wls":
        kwargs["weights"] = "w"
    if family.startswith("ridge"):
        kwargs["alpha"] = "alpha" if family == "ridge-column" else 2.5
    fitted = mm.linear(frame, by=["store", "item"], features=FEATURES, target="y",
                       family=family.split("-")[0], **kwargs)
    assert len(fitted) == frame.groupby(["store", "item"]).ngroups
    checked = 0
    for _, rows, coef, metrics in per_group(frame, fitted):
        X, y = rows[FEATURES].to_numpy(), rows["y"].to_numpy()
        weight = rows["w"].to_numpy() if family == "wls" else None
        if family.startswith("ridge"):
            alpha = rows["alpha"].iloc[0] if family == "ridge-column" else 2.5
            model = Ridge(alpha=alpha, fit_intercept=fit_intercept)
        else:
            model = LinearRegression(fit_intercept=fit_intercept)
        model.fit(X, y, sample_weight=weight)
        want = np.r_[model.coef_, model.intercept_]
        got = coef[FEATURES + ["intercept"]].to_numpy(float)
        assert metrics["n"] == len(rows)
        if len(rows) >= 8:  # well-conditioned
            assert close(got, want, 1e-8), (got, want)
            assert metrics["status"] == "ok"
            predicted = model.predict(X)
            assert metrics["r2"] == pytest.approx(r2_score(y, predicted, sample_weight=weight),
                                                  rel=1e-8, abs=1e-10)
            rmse = np.sqrt(mean_squared_error(y, predicted, sample_weight=weight))
            assert metrics["rmse"] == pytest.approx(rmse, rel=1e-7)
            checked += 1
        elif len(rows) > 2 + fit_intercept or family.startswith("ridge"):  # small, full rank
            assert close(got, want, 1e-6), (got, want)
        else:  # fewer rows than coefficients: the least-norm exact fit (scikit-learn's
            # answer here is rounding noise of LAPACK's, as centring leaves it)
            assert metrics["status"] == "rank_deficient"
            fitted_values = X @ got[:3] + got[3]
            np.testing.assert_allclose(fitted_values, y, rtol=1e-6, atol=1e-6)
            assert np.linalg.norm(got[:3]) <= np.linalg.norm(want[:3]) * (1 + 1e-6)
    assert checked > 80


def test_tiny_and_collinear_groups_get_the_least_norm_solution_and_a_status():
    rng = np.random.default_rng(3)
    a = rng.normal(size=30)
    frame = pd.DataFrame({
        "g": ["one"] + ["dup"] * 15 + ["ok"] * 14,
        "a": np.r_[1.0, a[1:16], a[16:]],
        "b": np.r_[2.0, 2.0 * a[1:16], rng.normal(size=14)],  # b = 2a in group 'dup'
        "c": np.r_[3.0, rng.normal(size=29)],
    })
    frame["y"] = frame["a"] - frame["c"] + rng.normal(size=30)
    fitted = mm.linear(frame, by="g", features=FEATURES, target="y")
    coefficients = fitted.coefficients.set_index("g")
    metrics = fitted.metrics.set_index("g")
    assert metrics.loc["one", "status"] == "rank_deficient"
    assert metrics.loc["dup", "status"] == "rank_deficient"
    assert metrics.loc["ok", "status"] == "ok"
    assert np.isnan(metrics.loc["one", "r2"])  # one row: no r2, as r2_score says
    assert coefficients.loc["one", FEATURES].tolist() == [0.0, 0.0, 0.0]
    assert coefficients.loc["one", "intercept"] == pytest.approx(frame["y"].iloc[0])
    for key in ("dup", "ok"):
        rows = frame[frame["g"] == key]
        model = LinearRegression().fit(rows[FEATURES].to_numpy(), rows["y"].to_numpy())
        got = coefficients.loc[key, FEATURES + ["intercept"]].to_numpy(float)
        assert close(got, np.r_[model.coef_, model.intercept_], 1e-8)
    assert not fitted.coefficients[FEATURES].isna().any().any()


@pytest.mark.parametrize("options", [{}, {"C": 0.3}, {"weights": "w"},
                                     {"fit_intercept": False}])
def test_logistic_equals_scikit_learn_per_group(options):
    frame = sales(groups=80, seed=1, max_rows=60)
    fitted = mm.linear(frame, by=["store", "item"], features=FEATURES, target="label",
                       family="logistic", **options)
    checked = 0
    for _, rows, coef, metrics in per_group(frame, fitted):
        X, y = rows[FEATURES].to_numpy(), rows["label"].to_numpy()
        if y.min() == y.max():
            assert metrics["status"] == "single_class"
            assert np.isnan(coef["intercept"]) and not metrics["converged"]
            continue
        assert metrics["status"] == "ok" and metrics["converged"]
        model = LogisticRegression(C=options.get("C", 1.0),
                                   fit_intercept=options.get("fit_intercept", True),
                                   tol=1e-12, max_iter=100_000)
        weight = rows["w"].to_numpy() if "weights" in options else None
        model.fit(X, y, sample_weight=weight)
        want = np.r_[model.coef_.ravel(), model.intercept_]
        assert close(coef[FEATURES + ["intercept"]].to_numpy(float), want, 1e-5)
        if weight is None:
            assert metrics["accuracy"] == pytest.approx(model.score(X, y))
        checked += 1
    assert checked > 40


def test_logistic_constant_target_and_separable_groups():
    frame = pd.DataFrame({"g": [1] * 5 + [2] * 6, "a": [0.0, 1, 2, 3, 4] + [0, 1, 2, 3, 4, 5],
                          "y": [1] * 5 + [0, 0, 0, 1, 1, 1]})
    fitted = mm.linear(frame, by="g", features="a", target="y", family="logistic")
    metrics = fitted.metrics.set_index("g")
    assert metrics.loc[1, "status"] == "single_class"
    assert metrics.loc[2, "status"] == "ok"  # separable, but the L2 penalty keeps it finite
    model = LogisticRegression(tol=1e-12, max_iter=10_000).fit(frame[["a"]][5:], frame.y[5:])
    got = fitted.coefficients.set_index("g").loc[2, ["a", "intercept"]].to_numpy(float)
    assert close(got, np.r_[model.coef_.ravel(), model.intercept_], 1e-5)
    assert np.isnan(fitted.predict(frame)[:5]).all()
    assert (fitted.predict(frame)[5:] == model.predict(frame[["a"]][5:])).all()


def test_predict_scores_rows_by_group_and_says_what_it_does_with_unseen_groups():
    frame = sales(groups=30, seed=2)
    fitted = mm.linear(frame, by=["store", "item"], features=FEATURES, target="y")
    new = frame.sample(frac=1.0, random_state=5).reset_index(drop=True)
    new.loc[0, "store"] = "nowhere"
    predicted = fitted.predict(new)
    assert np.isnan(predicted[0])
    for key, rows in new.iloc[1:].groupby(["store", "item"]):
        train = frame[(frame.store == key[0]) & (frame.item == key[1])]
        model = LinearRegression().fit(train[FEATURES].to_numpy(), train["y"].to_numpy())
        want = model.predict(rows[FEATURES].to_numpy())
        np.testing.assert_allclose(predicted[rows.index], want, rtol=1e-8, atol=1e-8)
    with pytest.raises(KeyError, match="nowhere"):
        fitted.predict(new, unseen="raise")
    with pytest.raises(ValueError, match="'b'"):
        fitted.predict(new.drop(columns="b"))


def test_logistic_predict_and_predict_proba():
    frame = sales(groups=20, seed=4, max_rows=60)
    fitted = mm.linear(frame, by=["store", "item"], features=FEATURES, target="label",
                       family="logistic")
    probability, label = fitted.predict_proba(frame), fitted.predict(frame)
    for _key, rows in frame.groupby(["store", "item"]):
        if rows["label"].nunique() < 2:
            continue
        model = LogisticRegression(tol=1e-12, max_iter=100_000).fit(rows[FEATURES].to_numpy(),
                                                                    rows["label"].to_numpy())
        np.testing.assert_allclose(probability[rows.index],
                                   model.predict_proba(rows[FEATURES].to_numpy())[:, 1],
                                   atol=1e-6)
        assert (label[rows.index] == model.predict(rows[FEATURES].to_numpy())).mean() > 0.95
    with pytest.raises(ValueError, match="logistic"):
        mm.linear(frame, by="store", features=FEATURES, target="y").predict_proba(frame)


def test_every_table_kind_gives_the_same_models(tmp_path):
    import polars as pl

    frame = sales(groups=25, seed=6)
    path = tmp_path / "sales.parquet"
    frame.to_parquet(path)
    results = [mm.linear(table, by=["store", "item"], features=FEATURES, target="y").coefficients
               for table in (frame, pa.Table.from_pandas(frame), pl.from_pandas(frame), path)]
    for other in results[1:]:
        pd.testing.assert_frame_equal(results[0], other)


def test_blocks_threads_and_row_order_do_not_change_the_answer():
    frame = sales(groups=200, seed=7, max_rows=30)
    base = mm.linear(frame, by=["store", "item"], features=FEATURES, target="y", weights="w",
                     family="wls")
    small = mm.linear(frame, by=["store", "item"], features=FEATURES, target="y", weights="w",
                      family="wls", block_rows=37, workers=2)
    ordered = mm.linear(frame.sort_values(["store", "item"]), by=["store", "item"],
                        features=FEATURES, target="y", weights="w", family="wls")
    for other in (small, ordered):
        np.testing.assert_allclose(other.coef, base.coef, rtol=1e-10, atol=1e-12)
        pd.testing.assert_frame_equal(other.metrics[["store", "item", "n", "status"]],
                                      base.metrics[["store", "item", "n", "status"]])


def test_sorted_integer_keys_and_zero_weight_groups():
    rng = np.random.default_rng(8)
    frame = pd.DataFrame({"g": np.repeat([3, 5, 9], 10), "a": rng.normal(size=30),
                          "w": np.r_[np.ones(20), np.zeros(10)]})
    frame["y"] = 2 * frame["a"] + 1
    fitted = mm.linear(frame, by="g", features=["a"], target="y", weights="w", family="wls")
    assert fitted.keys["g"].tolist() == [3, 5, 9]
    metrics = fitted.metrics.set_index("g")
    assert metrics["status"].tolist() == ["ok", "ok", "no_weight"]
    assert metrics.loc[3, "r2"] == pytest.approx(1.0)
    assert np.isnan(fitted.coefficients.set_index("g").loc[9, "a"])


@pytest.mark.parametrize("change, message", [
    ({"by": "shop"}, "by column 'shop' is not in the table"),
    ({"features": ["a", "nope"]}, "feature column 'nope'"),
    ({"features": ["a", "store"]}, "also a by column"),
    ({"features": ["a", "name"]}, "feature column 'name' is not numeric"),
    ({"target": "gap"}, "target column 'gap' has 1 missing"),
    ({"family": "poisson"}, "unknown family 'poisson'"),
    ({"family": "wls"}, "needs weights="),
    ({"family": "logistic"}, "must hold the classes 0 and 1"),
    ({"weights": "neg", "family": "wls"}, "weights column 'neg' has negative"),
    ({"family": "ridge", "alpha": -1.0}, "alpha must be >= 0"),
    ({"family": "ridge", "alpha": "a"}, "alpha column 'a' differs within a group"),
    ({"weights": ""}, "weights column '' is not in the table"),
])
def test_bad_input_is_refused_with_the_column_named(change, message):
    frame = sales(groups=10)
    frame["name"] = "x"
    frame["gap"] = frame["y"].where(frame.index != 3)
    frame["neg"] = -1.0
    arguments = {"by": ["store", "item"], "features": FEATURES, "target": "y", **change}
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        mm.linear(frame, **arguments)


def test_integer_features_and_targets_past_2_53_are_read_as_scikit_learn_reads_them():
    """Epoch nanoseconds as a feature, ids as a target: Arrow's safe cast
    refused an integer past 2**53 with its own error, naming no column."""
    rng = np.random.default_rng(0)
    stamps = 1_700_000_000_000_000_000 + rng.integers(0, 10**12, size=12)
    frame = pd.DataFrame({"g": np.repeat([1, 2], 6), "t": stamps,
                          "y": rng.normal(size=12), "id": stamps + 7})
    for feature, target in (("t", "y"), ("y", "id")):
        fitted = mm.linear(frame, "g", feature, target)
        for i, (_, rows) in enumerate(frame.groupby("g")):
            model = LinearRegression().fit(rows[[feature]].astype(float), rows[target])
            assert close(fitted.coef[i], model.coef_, 1e-6)
            assert close(fitted.predict(rows), model.predict(rows[[feature]].astype(float)),
                         1e-9)


@pytest.mark.parametrize("family", ["ols", "wls", "ridge", "logistic"])
def test_torch_engine_equals_numpy(family):
    torch = pytest.importorskip("torch")
    frame = sales(groups=60, seed=9)
    target = "label" if family == "logistic" else "y"
    options = {"weights": "w"} if family == "wls" else {}
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    numpy_result = mm.linear(frame, by=["store", "item"], features=FEATURES, target=target,
                             family=family, **options)
    for device in devices:
        torch_result = mm.linear(frame, by=["store", "item"], features=FEATURES, target=target,
                                 family=family, device=device, block_rows=300, **options)
        np.testing.assert_allclose(torch_result.coef, numpy_result.coef, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(torch_result.intercept, numpy_result.intercept, rtol=1e-7,
                                   atol=1e-9)
        pd.testing.assert_frame_equal(torch_result.metrics, numpy_result.metrics, rtol=1e-7)


def test_an_unknown_device_is_refused_before_work():
    pytest.importorskip("torch")
    with pytest.raises(ValueError, match="device 'tpu9'|unknown device"):
        mm.linear(sales(groups=3), by="store", features=FEATURES, target="y", device="tpu9")


def test_logistic_past_max_iter_says_not_converged():
    frame = sales(groups=10, seed=10, max_rows=60)
    fitted = mm.linear(frame, by=["store", "item"], features=FEATURES, target="label",
                       family="logistic", max_iter=1)
    metrics = fitted.metrics
    two_classes = metrics["status"] != "single_class"
    assert (metrics.loc[two_classes, "status"] == "not_converged").all()
    assert not metrics.loc[two_classes, "converged"].any()
    assert (metrics.loc[two_classes, "iterations"] == 1).all()
    assert not fitted.coefficients.loc[two_classes, FEATURES].isna().any().any()


def test_float_keys_find_the_integer_group_they_equal_exactly():
    """2**53 as a float equals the integer key 2**53, but pandas compared the
    keys as floats, and the rows of 2**53 found group 2**53 + 1's model."""
    frame = pd.DataFrame({"g": [2**53] * 3 + [2**53 + 1] * 3, "x": [0.0, 1, 2] * 2,
                          "y": [0.0, 1, 2, 0, 10, 20]})
    result = mm.linear(frame, by="g", features=["x"], target="y")
    np.testing.assert_allclose(result.predict(frame), frame["y"], atol=1e-9)
    as_floats = frame.head(3).astype({"g": float}).assign(z=0)
    np.testing.assert_allclose(result.predict(as_floats), [0.0, 1, 2], atol=1e-9)
    assert np.isnan(result.predict(frame.head(1).assign(g=0.5))).all()  # no whole number


def test_a_group_without_weight_has_no_scores_and_bad_arguments_are_named():
    frame = pd.DataFrame({"g": ["a"] * 3 + ["b"] * 3, "x": [0.0, 1, 2] * 2,
                          "y": [1.0, 0, 3, 0, 1, 3], "w": [0.0, 0, 0, 1, 1, 1]})
    metrics = mm.linear(frame, by="g", features=["x"], target="y", family="wls",
                        weights="w").metrics.set_index("g")
    assert metrics.loc["a", "status"] == "no_weight"
    assert np.isnan(metrics.loc["a", "r2"]) and np.isnan(metrics.loc["a", "rmse"])  # r2 was 1
    for arguments, message in (({"by": ["g", "g"]}, "by= names a column twice"),
                               ({"family": "ridge", "alpha": [1.0]}, "alpha must be"),
                               ({"family": "logistic", "max_iter": 2.5},
                                "max_iter must be a whole number"),
                               ({"workers": 0}, "workers must be a whole number")):
        options = {"by": "g", **arguments}
        with pytest.raises(ValueError, match=message):
            mm.linear(frame, features=["x"], target="y", **options)
