"""Evaluation, selection and prediction on the engine, with real scikit-learn
and LightGBM models and a real SQLite store."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.linear_model import LinearRegression, Ridge

import manymodels as mm
from conftest import run_cli


def daily(groups: int = 3, days: int = 60, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frames = []
    for g in range(groups):
        x = rng.normal(size=days)
        frames.append(pd.DataFrame({
            "sku": f"s{g}", "date": pd.date_range("2024-01-01", periods=days), "x": x,
            "sales": (g + 1) * x + rng.normal(scale=0.1, size=days) + 10}))
    frame = pd.concat(frames, ignore_index=True)
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)  # unsorted


def fit_linear(df: pd.DataFrame) -> LinearRegression:
    return LinearRegression().fit(df[["x"]], df["sales"])


def fit_candidate(df: pd.DataFrame, model=None) -> object:
    return clone(model).fit(df[["x"]], df["sales"])


def test_backtest_windows_match_a_hand_computation():
    frame = daily(groups=2, days=40)
    run = mm.train(fit_linear, mm.groups(frame, by="sku"), backend="serial", progress=False,
                   evaluate=mm.backtest("date", horizon=5, windows=3, step=4, target="sales",
                                        metrics=["rmse", "mae", "mase"]))
    windows = run.evaluation
    assert len(windows) == 6 and list(windows["window"].unique()) == [0, 1, 2]
    for sku in ("s0", "s1"):
        rows = frame[frame["sku"] == sku].sort_values("date").reset_index(drop=True)
        scores = []
        for w, start in enumerate([40 - 5 - 8, 40 - 5 - 4, 40 - 5]):
            train, test = rows.iloc[:start], rows.iloc[start:start + 5]
            model = LinearRegression().fit(train[["x"]], train["sales"])
            error = test["sales"].to_numpy() - model.predict(test[["x"]])
            naive = np.mean(np.abs(np.diff(train["sales"].to_numpy())))
            got = windows[(windows["sku"] == sku) & (windows["window"] == w)].iloc[0]
            assert got["cutoff"] == train["date"].iloc[-1]
            assert (got["n_train"], got["n_test"]) == (start, 5)
            assert got["rmse"] == pytest.approx(np.sqrt(np.mean(error ** 2)), rel=1e-9)
            assert got["mae"] == pytest.approx(np.mean(np.abs(error)), rel=1e-9)
            assert got["mase"] == pytest.approx(np.mean(np.abs(error)) / naive, rel=1e-9)
            scores.append(got["rmse"])
        result = run.results.set_index("sku").loc[sku]
        assert result["rmse"] == pytest.approx(np.mean(scores), rel=1e-12)
    # refit=True: the kept model is fitted on all the group's rows
    rows = frame[frame["sku"] == "s1"]
    whole = LinearRegression().fit(rows[["x"]], rows["sales"])
    assert run.models["s1"].coef_ == pytest.approx(whole.coef_)


def test_fit_sees_only_training_rows_and_refit_false_keeps_the_last_window():
    seen: list[int] = []

    def fit(df):
        seen.append(len(df))
        return fit_linear(df)

    frame = daily(groups=1, days=30)
    run = mm.train(fit, mm.groups(frame, by="sku"), backend="serial", progress=False,
                   evaluate=mm.backtest("date", horizon=7, windows=2, target="sales",
                                        final_model="last_window"))
    assert seen == [30 - 14, 30 - 7]  # no refit on all 30 rows
    last = frame.sort_values("date").iloc[:23]
    assert run.models["s0"].coef_ == pytest.approx(fit_linear(last).coef_)


def test_holdout_kfold_and_in_sample():
    frame = daily(groups=2, days=50)
    common = {"target": "sales", "features": ["x"], "metrics": ["r2", "rmse"]}
    for splitter, windows in ((mm.holdout(0.2, **common), 1), (mm.kfold(5, **common), 5),
                              (mm.holdout(0, **common), 1)):
        run = mm.train(fit_linear, mm.groups(frame, by="sku"), backend="serial",
                       progress=False, evaluate=splitter)
        assert (run.evaluation.groupby("sku").size() == windows).all()
        assert (run.results["r2"] > 0.9).all()
        if windows == 5:  # every row is tested once
            assert (run.evaluation.groupby("sku")["n_test"].sum() == 50).all()
    # in-sample: the scores of the model fitted on all the rows
    rows = frame[frame["sku"] == "s0"]
    model = fit_linear(rows)
    expected = np.sqrt(np.mean((rows["sales"] - model.predict(rows[["x"]])) ** 2))
    assert run.results.set_index("sku").loc["s0", "rmse"] == pytest.approx(expected)


def test_a_group_too_short_is_skipped_with_the_reason_not_failed():
    frame = daily(groups=2, days=40)
    frame = frame[(frame["sku"] == "s0") | (frame["date"] < "2024-01-11")]  # s1: 10 days
    run = mm.train(fit_linear, mm.groups(frame, by="sku"), backend="serial", progress=False,
                   evaluate=mm.backtest("date", horizon=7, windows=2, target="sales"))
    results = run.results.set_index("sku")
    assert (results["status"] == "ok").all()
    assert "needs at least 15 rows, has 10" in results.loc["s1", "eval_skipped"]
    assert np.isnan(results.loc["s1", "rmse"]) and not np.isnan(results.loc["s0", "rmse"])
    assert "s1" in run.models  # fitted on its rows all the same


def test_select_estimator_candidates_with_lightgbm_and_the_store_predicts_the_winner(tmp_path):
    from lightgbm import LGBMRegressor

    frame = daily(groups=3, days=80)
    rng = np.random.default_rng(5)
    frame["x2"] = rng.normal(size=len(frame))
    frame.loc[frame["sku"] == "s2", "sales"] = np.where(frame["x2"] > 0, 50.0, 0.0)[
        frame["sku"] == "s2"]  # a step: the trees win there, the line elsewhere

    def fit(df, model=None):
        return clone(model).fit(df[["x", "x2"]], df["sales"])

    candidates = mm.grid(model=[Ridge(alpha=1e-3),
                                LGBMRegressor(n_estimators=30, min_child_samples=5,
                                              verbose=-1)])
    run = mm.train(fit, mm.groups(frame, by="sku") * candidates, workers=2, progress=False,
                   evaluate=mm.backtest("date", horizon=7, windows=2, target="sales",
                                        features=["x", "x2"]),
                   select="rmse", store=tmp_path / "store")
    best = run.best().set_index("sku")
    assert list(best.index) == ["s0", "s1", "s2"]
    names = {sku: type(model).__name__ for sku, model in best["model"].items()}
    assert names == {"s0": "Ridge", "s1": "Ridge", "s2": "LGBMRegressor"}
    for sku, row in best.iterrows():  # the winner has the group's lowest rmse
        group = run.results[run.results["sku"] == sku]
        assert row["rmse"] == group["rmse"].min()
    new = daily(groups=3, days=10, seed=9)
    new["x2"] = np.random.default_rng(1).normal(size=len(new))
    predicted = mm.Store(tmp_path / "store").predict(new, by="sku", with_source=True)
    assert (predicted["source"] == "group").all()
    for sku in ("s0", "s2"):
        rows = new["sku"] == sku
        model = run.models[(sku, best.loc[sku, "model"])]
        assert np.allclose(predicted.loc[rows, "prediction"],
                           model.predict(new.loc[rows, ["x", "x2"]]))
    assert run.predict(new, by="sku").equals(predicted["prediction"])
    stored = mm.Store(tmp_path / "store")
    assert len(stored.evaluation()) == 6 * 2 and "__windows__" not in stored.results()


def test_select_max_and_a_callable_metric():
    frame = daily(groups=2, days=40)

    def bias(model, test):
        return {"bias": float(np.mean(model.predict(test[["x"]]) - test["sales"]))}

    run = mm.train(fit_candidate, mm.groups(frame, by="sku")
                   * mm.grid(model=[Ridge(alpha=0.01), Ridge(alpha=1e4)]),
                   backend="serial", progress=False,
                   evaluate=mm.holdout(0.25, target="sales", features=["x"], metrics=["r2", bias]),
                   select=("r2", "max"))
    assert "bias" in run.results.columns
    assert [m.alpha for m in run.best()["model"]] == [0.01, 0.01]


def test_bad_input_is_refused_before_work():
    frame = daily(groups=2, days=20)
    calls = []

    def fit(df):
        calls.append(1)
        return fit_linear(df)

    source = mm.groups(frame, by="sku")
    with pytest.raises(ValueError, match="time column 'day' is not in the table"):
        mm.train(fit, source, evaluate=mm.backtest("day", horizon=3, target="sales"))
    with pytest.raises(ValueError, match="unknown metric 'rmsee'"):
        mm.backtest("date", horizon=3, target="sales", metrics=["rmsee"])
    with pytest.raises(ValueError, match="select='r2' names a metric that evaluate= does not"):
        mm.train(fit, source, select="r2",
                 evaluate=mm.holdout(0.2, target="sales", metrics=["rmse"]))
    with pytest.raises(ValueError, match="target column 'y' is not in the table"):
        mm.train(fit, source, evaluate=mm.kfold(3, target="y"))
    odd = frame.assign(date=[[1]] * len(frame))
    with pytest.raises(ValueError, match="time column 'date' cannot be sorted"):
        mm.train(fit, mm.groups(odd, by="sku"),
                 evaluate=mm.backtest("date", horizon=3, target="sales"))
    with pytest.raises(ValueError, match="horizon must be"):
        mm.backtest("date", horizon=0, target="sales")
    with pytest.raises(ValueError, match="direction must be"):
        mm.train(fit, source, select=("rmse", "lowest"))
    assert calls == []


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_store_predict_on_the_engine_aligns_rows_fallback_and_fn(tmp_path, backend):
    frame = daily(groups=4, days=20)
    store = mm.Store(tmp_path / "store")
    run = mm.train(fit_linear, mm.groups(frame, by="sku"), store=store, backend="serial",
                   progress=False)
    new = daily(groups=5, days=6, seed=3)  # s4 has no model
    new.index = new.index * 10 + 7  # labels kept
    with pytest.warns(RuntimeWarning, match="have no model"):
        got = store.predict(new, by="sku", backend=backend, workers=2, with_source=True)
    assert got.index.equals(new.index)
    for sku in ("s0", "s3"):
        rows = new["sku"] == sku
        assert np.allclose(got.loc[rows, "prediction"],
                           run.models[sku].predict(new.loc[rows, ["x"]]))
    assert got.loc[new["sku"] == "s4", "prediction"].isna().all()
    assert set(got.loc[new["sku"] == "s4", "source"]) == {"none"}
    store.attach(run.run_id, "fallback", fit_linear(frame))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        filled = store.predict(new, by="sku", backend=backend, workers=2, with_source=True)
    assert set(filled.loc[new["sku"] == "s4", "source"]) == {"fallback"}
    doubled = store.predict(new, by="sku", backend=backend, workers=2,
                            fn=lambda model, rows: 2 * model.predict(rows[["x"]]))
    assert np.allclose(doubled, 2 * filled["prediction"])


def test_cli_train_uses_the_evaluation_machinery_and_test_size_zero_scores_the_fit(tmp_path):
    from manymodels.cli.tabular import train_table

    frame = daily(groups=2, days=30).drop(columns="date")
    trained = train_table(frame, "sku", "sales", "sklearn.linear_model.Ridge",
                          store=tmp_path / "s", grid={"alpha": [0.01, 1000.0]}, test_size=0,
                          metrics=["rmse", "r2"], backend="serial")
    results = trained.run.results.set_index("sku")
    assert (results["best_alpha"] == 0.01).all()
    rows = frame[frame["sku"] == "s1"]
    model = Ridge(alpha=0.01).fit(rows[["x"]], rows["sales"])
    in_sample = np.sqrt(np.mean((rows["sales"] - model.predict(rows[["x"]])) ** 2))
    assert results.loc["s1", "rmse"] == pytest.approx(in_sample)
    assert results.loc["s1", "rows"] == 30


def test_halving_finds_the_full_evaluations_winner_with_fewer_fits(tmp_path):
    frame = daily(groups=3, days=60)
    alphas = [0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5]
    splitter = mm.backtest("date", horizon=7, windows=3, target="sales", features=["x"])
    source = mm.groups(frame, by="sku") * mm.grid(model=[Ridge(alpha=a) for a in alphas])
    full = mm.train(fit_candidate, source, backend="serial", progress=False,
                    evaluate=splitter, select="rmse")
    halved = mm.train(fit_candidate, source, backend="serial", progress=False,
                      evaluate=splitter, select=mm.halving("rmse", eta=3),
                      store=tmp_path / "store")
    best = halved.best().set_index("sku")
    assert len(halved.results) == 3  # one task per group
    assert (best["window_fits"] == 9 + 3 + 1).all()  # not 9 x 3 = 27
    scores = full.results.assign(alpha=[m.alpha for m in full.results["model"]])
    for sku, group in scores.groupby("sku"):
        # the winner's full score is the full evaluation's, and near its best
        won = group[group["alpha"] == best.loc[sku, "best_model"].alpha].iloc[0]
        assert best.loc[sku, "rmse"] == pytest.approx(won["rmse"])
        assert won["rmse"] <= group["rmse"].min() * 1.02
        assert won["rmse"] < group["rmse"].max() / 2  # the large alphas are out
    assert (halved.evaluation.groupby("sku").size() == 3).all()  # the winner's windows
    predicted = mm.Store(tmp_path / "store").predict(frame, by="sku")
    rows = frame["sku"] == "s0"
    assert np.allclose(predicted[rows], halved.models["s0"].predict(frame.loc[rows, ["x"]]))
    with pytest.raises(ValueError, match="needs groups \\* grid"):
        mm.train(fit_linear, mm.groups(frame, by="sku"), evaluate=splitter,
                 select=mm.halving("rmse"))


class _Unfittable(Ridge):
    """A candidate that always raises (too few rows for it, say)."""

    def fit(self, X, y, sample_weight=None):
        raise ValueError("this candidate cannot fit")


def test_halving_drops_a_candidate_that_raises_not_the_group():
    frame = daily(groups=2, days=60)
    splitter = mm.backtest("date", horizon=7, windows=3, target="sales", features=["x"])
    source = mm.groups(frame, by="sku") * mm.grid(model=[_Unfittable(), Ridge(alpha=0.01),
                                                         Ridge(alpha=100.0)])
    run = mm.train(fit_candidate, source, backend="serial", progress=False,
                   evaluate=splitter, select=mm.halving("rmse", eta=3))
    assert (run.results["status"] == "ok").all(), run.results["error"].tolist()
    assert [m.alpha for m in run.results["best_model"]] == [0.01, 0.01]
    assert (run.results["candidates_failed"] == 1).all()
    assert run.results["candidate_error"].str.contains("this candidate cannot fit").all()
    every = mm.grid(model=[_Unfittable(), _Unfittable(alpha=2.0)])
    failed = mm.train(fit_candidate, mm.groups(frame, by="sku") * every, backend="serial",
                      progress=False, evaluate=splitter, select=mm.halving("rmse"))
    assert (failed.results["status"] == "failed").all()
    assert failed.results["error"].str.contains("every candidate failed").all()


def test_cli_predict_runs_groups_on_worker_processes(tmp_path):

    frame = daily(groups=3, days=30).drop(columns="date")
    data, rows = tmp_path / "train.parquet", tmp_path / "new.parquet"
    frame.to_parquet(data)
    frame.iloc[:20].to_parquet(rows)
    store, out = tmp_path / "store", tmp_path / "out.csv"

    cli = run_cli

    trained = cli("train", data, "--by", "sku", "--target", "sales", "--model",
                  "sklearn.linear_model.LinearRegression", "--store", store, "--test-size", "0",
                  "--metrics", "rmse", "--backend", "serial")
    assert trained.returncode == 0, trained.stderr
    predicted = cli("predict", store, rows, "--out", out, "--workers", "2",
                    "--backend", "processes")
    assert predicted.returncode == 0, predicted.stderr
    got = pd.read_csv(out)
    model = mm.Store(store).load("s0")
    first = frame.iloc[:20]
    mine = (first["sku"] == "s0").to_numpy()
    assert np.allclose(got["prediction"][mine], model.predict(first.loc[mine, ["x"]]))
    assert (got["source"] == "group").all()


def test_a_reruns_windows_read_from_the_store_equal_the_first_runs(tmp_path):
    frame = daily(groups=3, days=30)
    splitter = mm.backtest("date", horizon=5, windows=2, target="sales")
    runs = [mm.train(fit_linear, mm.groups(frame, by="sku"), evaluate=splitter,
                     store=tmp_path / "s", backend="serial", progress=False) for _ in range(2)]
    assert runs[1].summary().reused == 3
    # the windows stay in the store's texts until asked for
    assert {type(slot).__name__ for slot in runs[1]._records.metrics} == {"MetricTexts"}
    first, again = (run.evaluation for run in runs)
    assert len(first) == 6
    pd.testing.assert_frame_equal(again, first)


def fit_candidate_unless_nan(df: pd.DataFrame, model=None) -> object:
    if df["x"].isna().any():
        raise ValueError("NaN in x")
    return clone(model).fit(df[["x"]], df["y"])


def test_predict_keeps_a_groups_earlier_winner_when_all_its_candidates_fail(tmp_path):
    """With select=, a re-run in which every candidate of a group failed
    left that group no model in Store.predict, though its earlier winner
    was in the store."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"g": ["a"] * 20 + ["b"] * 20, "x": rng.normal(size=40)})
    frame["y"] = 2 * frame["x"]
    options = dict(evaluate=mm.holdout(0.25, target="y", features=["x"], metrics=["rmse"]),
                   select="rmse", store=tmp_path / "s", backend="serial", progress=False)
    grid = mm.grid(model=[Ridge(), Ridge(alpha=10.0)])
    mm.train(fit_candidate_unless_nan, mm.groups(frame, by="g") * grid, **options)
    broken = frame.assign(x=np.where(frame["g"] == "b", np.nan, frame["x"]))
    again = mm.train(fit_candidate_unless_nan, mm.groups(broken, by="g") * grid, **options)
    assert set(again.results.loc[again.results["g"] == "b", "status"]) == {"failed"}
    new = pd.DataFrame({"g": ["a", "b"], "x": [1.0, 1.0]})
    predicted = mm.Store(tmp_path / "s").predict(new, by="g", features=["x"], with_source=True)
    assert (predicted["source"] == "group").all()
    np.testing.assert_allclose(predicted["prediction"], [2.0, 2.0], atol=0.3)


def test_why_names_the_evaluation_not_the_shared_objects_when_evaluate_changed(tmp_path):
    frame = daily(groups=1, days=40)
    for test_size in (0.2, 0.3):
        run = mm.train(fit_linear, mm.groups(frame, by="sku"), store=tmp_path / "s",
                       backend="serial", progress=False,
                       evaluate=mm.holdout(test_size, target="sales", features=["x"]))
    assert run.why_not_reused("s0").endswith("since run 1, the evaluation (evaluate=) changed")


class _LastWeekMean:
    """A forecaster on arrays or frames: the mean of the last 7 training values
    plus x's coefficient, fitted by least squares (so features matter)."""

    def __init__(self, y: np.ndarray, x: np.ndarray) -> None:
        self.level = float(np.mean(y[-7:]))
        self.slope = float(np.polyfit(x, y, 1)[0]) if len(x) > 1 else 0.0

    def predict(self, X) -> np.ndarray:
        x = X["x"].to_numpy() if hasattr(X, "columns") else np.asarray(X)[:, 0]
        return self.level + self.slope * x


def fit_frame(df):
    return _LastWeekMean(df["sales"].to_numpy(), df["x"].to_numpy())


def fit_arrays(rows):
    return _LastWeekMean(rows["sales"], rows["x"])


def test_windows_of_views_equal_a_window_by_window_reference_in_both_formats(tmp_path):
    """Every window is a view of the group's rows sorted once, and the metrics
    of all windows are computed at once: the windows, cutoffs, scores and
    forecasts equal a plain loop that copies each window and scores it alone,
    for pandas and NumPy groups alike, and a store gives them back the same."""
    frame = daily(groups=3, days=45, seed=4)
    doubled = frame[frame["sku"] == "s2"].assign(x=lambda d: d["x"] + 1.0)
    frame = pd.concat([frame, doubled], ignore_index=True)  # s2: two rows a day
    frame.loc[frame.index % 11 == 0, "sales"] = 0.0  # zeros: mape's and smape's edge

    def spread(model, test):  # a callable metric, scored per window
        return {"spread": float(np.ptp(test["sales"]))}

    names = ["rmse", "mae", "mse", "mape", "smape", "mase", "r2"]
    splitter = mm.backtest("date", horizon=4, windows=3, step=5, target="sales",
                           features=["x"], metrics=[*names, spread])
    runs = {fmt: mm.train(fit_frame if fmt == "pandas" else fit_arrays,
                          mm.groups(frame, by="sku", format=fmt), evaluate=splitter,
                          backend="serial", progress=False, store=tmp_path / fmt)
            for fmt in ("pandas", "numpy")}
    expected, rows = [], []
    for sku, group in frame.groupby("sku"):
        group = group.sort_values("date", kind="stable").reset_index(drop=True)
        days = [*np.sort(group["date"].unique()), pd.Timestamp("2100-01-01")]
        for w in range(3):
            first = len(days) - 1 - 4 - (2 - w) * 5
            train = group[group["date"] < days[first]]
            test = group[(group["date"] >= days[first]) & (group["date"] < days[first + 4])]
            model = fit_frame(train.copy())
            y, p = test["sales"].to_numpy(), model.predict(test[["x"]])
            e = y - p
            scale = np.mean(np.abs(np.diff(train["sales"].to_numpy())))
            expected.append({
                "sku": sku, "window": w, "cutoff": train["date"].iloc[-1],
                "n_train": len(train), "n_test": len(test),
                "rmse": np.sqrt(np.mean(e ** 2)), "mae": np.mean(np.abs(e)),
                "mse": np.mean(e ** 2),
                "mape": np.mean(np.abs(e) / np.maximum(np.abs(y), np.finfo(float).eps)),
                "smape": np.mean([0.0 if a == b == 0 else 2 * abs(a - b) / (abs(a) + abs(b))
                                  for a, b in zip(y, p)]),
                # two rows a day (s2) are no one series to take a naive forecast of
                "mase": (np.nan if train["date"].duplicated().any()
                         else np.mean(np.abs(e)) / scale),
                "r2": 1 - np.sum(e ** 2) / np.sum((y - y.mean()) ** 2),
                "spread": float(np.ptp(y))})
            rows.append(pd.DataFrame({"sku": sku, "window": w, "time": test["date"],
                                      "actual": y, "forecast": p}))
    expected = pd.DataFrame(expected)
    reference = pd.concat(rows).sort_values(["sku", "window", "time", "actual"],
                                            ignore_index=True)
    for fmt, run in runs.items():
        for got in (run.evaluation, mm.Store(tmp_path / fmt).evaluation()):
            assert list(got[["sku", "window", "n_train", "n_test"]].itertuples(index=False)) \
                == list(expected[["sku", "window", "n_train", "n_test"]].itertuples(index=False))
            assert (got["cutoff"] == expected["cutoff"]).all()
            for name in [*names, "spread"]:
                np.testing.assert_allclose(got[name], expected[name], rtol=1e-12,
                                           err_msg=f"{fmt}: {name}")
        for got in (run.forecasts, mm.Store(tmp_path / fmt).forecasts()):
            got = got.sort_values(["sku", "window", "time", "actual"], ignore_index=True)
            assert list(got.columns) == ["sku", "window", "cutoff", "time", "actual",
                                         "forecast"]
            assert (got["time"] == reference["time"]).all()
            np.testing.assert_allclose(got["actual"], reference["actual"], rtol=0)
            np.testing.assert_allclose(got["forecast"], reference["forecast"], rtol=1e-12)
        means = run.results.set_index("sku")["rmse"]
        np.testing.assert_allclose(means.to_numpy(),
                                   expected.groupby("sku")["rmse"].mean().to_numpy(),
                                   rtol=1e-12)


def test_final_model_names_what_is_kept_and_refit_is_its_deprecated_name():
    frame = daily(groups=1, days=30)
    kept = {}
    for final_model in ("all_rows", "last_window"):
        run = mm.train(fit_linear, mm.groups(frame, by="sku"), backend="serial",
                       progress=False, evaluate=mm.backtest(
                           "date", horizon=7, windows=2, target="sales",
                           final_model=final_model))
        kept[final_model] = run.models["s0"].coef_
    rows = frame.sort_values("date")
    assert kept["all_rows"] == pytest.approx(fit_linear(rows).coef_)
    assert kept["last_window"] == pytest.approx(fit_linear(rows.iloc[:23]).coef_)
    with pytest.warns(DeprecationWarning, match="final_model='last_window'"):
        old = mm.backtest("date", horizon=7, windows=2, target="sales", refit=False)
    assert old == mm.backtest("date", horizon=7, windows=2, target="sales",
                              final_model="last_window")
    with pytest.raises(ValueError, match="final_model must be 'all_rows'"):
        mm.kfold(3, target="sales", final_model="every_window")


def _slow_pid(model, rows):
    """A forecaster's expensive predict: 40 ms a group; says which process ran it."""
    import os
    import time

    time.sleep(0.04)
    return np.full(len(rows), os.getpid())


def _cheap_pid(model, rows):
    import os

    return np.full(len(rows), os.getpid())


def test_store_predict_chooses_workers_by_the_measured_cost_of_a_prediction(tmp_path):
    """An expensive predict goes to worker processes with few groups; a cheap
    one stays in the driver even with many groups (the cost decides, not
    the count of groups); a backend given is used as given."""
    import os

    frame = pd.DataFrame({"g": np.repeat(np.arange(600), 2), "x": np.tile([0.0, 1.0], 600)})
    frame["y"] = 2 * frame["x"]
    store = mm.Store(tmp_path / "s")
    mm.train(lambda rows: float(rows["y"].mean()), mm.groups(frame, by="g", format="numpy"),
             store=store, backend="serial", progress=False)  # models fn reads nothing of
    few = frame[frame["g"] < 30]
    slow = store.predict(few, by="g", fn=_slow_pid, workers=2)
    assert set(slow) and os.getpid() not in set(slow)  # on workers
    cheap = store.predict(frame, by="g", fn=_cheap_pid, workers=2)
    assert set(cheap) == {os.getpid()}  # 600 groups, in the driver
    forced = store.predict(few, by="g", fn=_cheap_pid, workers=2, backend="processes")
    assert os.getpid() not in set(forced)
    serial = store.predict(few, by="g", fn=_slow_pid, workers=1)
    assert set(serial) == {os.getpid()}  # one worker: the driver


class _NaiveForecaster:
    """A forecaster: fitted on a history, asked for h steps (no feature rows)."""

    def __init__(self, history: np.ndarray) -> None:
        self.last = float(history[-1])

    def forecast(self, h: int) -> dict:
        return {"mean": np.full(h, self.last)}  # statsforecast's shape


def test_a_forecaster_is_scored_on_forecast_h_per_time_step():
    frame = daily(groups=2, days=30)
    frame = pd.concat([frame, frame[frame["sku"] == "s1"]], ignore_index=True)  # 2 rows a day
    run = mm.train(lambda rows: _NaiveForecaster(rows["sales"]),
                   mm.groups(frame, by="sku", format="numpy", order_by="date"),
                   evaluate=mm.backtest("date", horizon=5, windows=2, target="sales",
                                        metrics=["mae"]),
                   backend="serial", progress=False)
    forecasts = run.forecasts
    assert len(forecasts) == 2 * 5 + 2 * 5 * 2  # s1 has two rows a day
    for (sku, window), rows in forecasts.groupby(["sku", "window"]):
        group = frame[frame["sku"] == sku].sort_values("date", kind="stable")
        last = group[group["date"] <= rows["cutoff"].iloc[0]]["sales"].iloc[-1]
        assert (rows["forecast"] == last).all()
        got = run.evaluation.set_index(["sku", "window"]).loc[(sku, window), "mae"]
        assert got == pytest.approx(np.mean(np.abs(rows["actual"] - last)), rel=1e-12)


def fit_shifted(rows, shift=0.0):
    model = fit_arrays(rows)
    model.level += shift
    return model


def test_the_candidates_of_a_group_share_its_windows_and_score_as_if_alone():
    """A group's windows are made once for its candidates (same arrays on
    the same worker): each candidate scores as it does in a run of its own."""
    frame = daily(groups=3, days=40, seed=2)
    splitter = mm.backtest("date", horizon=5, windows=2, target="sales", features=["x"],
                           metrics=["rmse", "mae"])
    together = mm.train(fit_shifted, mm.groups(frame, by="sku", format="numpy")
                        * mm.grid(shift=[0.0, 5.0, -3.0]), evaluate=splitter,
                        backend="serial", progress=False).evaluation
    for shift in (0.0, 5.0, -3.0):
        alone = mm.train(fit_shifted, mm.groups(frame, by="sku", format="numpy"),
                         evaluate=splitter, backend="serial", progress=False,
                         shared={"shift": shift}).evaluation
        mine = together[together["shift"] == shift].drop(columns="shift")
        pd.testing.assert_frame_equal(mine.reset_index(drop=True), alone[mine.columns])


def _ridge_candidates() -> tuple[pd.DataFrame, Any, list[float], Any]:
    """Three skus, a 3-window backtest and three Ridge settings a group."""
    frame = daily(groups=3, days=40, seed=6)
    splitter = mm.backtest("date", horizon=5, windows=3, target="sales", features=["x"])
    alphas = [0.01, 10.0, 1e4]
    source = mm.groups(frame, by="sku") * mm.grid(model=[Ridge(alpha=a) for a in alphas])
    return frame, splitter, alphas, source


def test_halving_with_eta_1_is_the_full_evaluation_keeping_only_the_winner(tmp_path):
    _, splitter, _, source = _ridge_candidates()
    full = mm.train(fit_candidate, source, backend="serial", progress=False,
                    evaluate=splitter, select="rmse").best().set_index("sku")
    fits = []

    def counted(df, model=None):
        fits.append(len(df))
        return fit_candidate(df, model)

    one = mm.train(counted, source, backend="serial", progress=False, evaluate=splitter,
                   select=mm.halving("rmse", eta=1), store=tmp_path / "s")
    best = one.results.set_index("sku")
    assert (best["window_fits"] == 3 * 3).all()  # every candidate on every window
    assert fits.count(40) == 3  # one fit on all rows a group: the winner's
    for sku in best.index:
        assert best.loc[sku, "best_model"].alpha == full.loc[sku, "model"].alpha
        assert best.loc[sku, "rmse"] == pytest.approx(full.loc[sku, "rmse"], rel=1e-12)
    with pytest.raises(ValueError, match="eta must be an integer >= 1"):
        mm.halving("rmse", eta=0)


def test_halving_keep_all_stores_every_candidates_model_and_predicts_as_the_winner(tmp_path):
    frame, splitter, alphas, source = _ridge_candidates()
    full = mm.train(fit_candidate, source, backend="serial", progress=False,
                    evaluate=splitter, select="rmse")
    per_candidate = full.results.set_index(["sku", full.results["model"].map(
        lambda m: m.alpha)])["rmse"]
    kept = mm.train(fit_candidate, source, workers=2, progress=False, evaluate=splitter,
                    select=mm.halving("rmse", eta=1, keep="all"), store=tmp_path / "s")
    store = mm.Store(tmp_path / "s")
    for sku, rows in frame.groupby("sku"):
        candidates = store.load((sku,))
        assert [s["model"].alpha for s in candidates.settings] == alphas
        for setting, model in zip(candidates.settings, candidates.models):  # on all rows
            alone = clone(setting["model"]).fit(rows[["x"]], rows["sales"])
            np.testing.assert_allclose(model.coef_, alone.coef_, rtol=1e-12)
        assert candidates.model(model=candidates.settings[1]["model"]) is candidates.models[1]
        scores = [per_candidate[(sku, a)] for a in alphas]
        np.testing.assert_allclose(candidates.scores, scores, rtol=1e-12)
        assert candidates.winner == int(np.argmin(scores))
        assert kept.results.set_index("sku").loc[sku, "best_model"].alpha == \
            alphas[candidates.winner]
    new_rows = frame.groupby("sku").tail(3)
    got = store.predict(new_rows, by="sku", backend="serial")
    best = mm.Store(tmp_path / "s").load(("s0",)).best
    mine = new_rows["sku"] == "s0"
    np.testing.assert_allclose(np.asarray(got)[mine.to_numpy()],
                               best.predict(new_rows.loc[mine, ["x"]]), rtol=1e-12)
    with pytest.raises(ValueError, match="keep must be 'best'.*got 'every'"):
        mm.halving("rmse", keep="every")


def test_halving_eta_1_scores_each_candidates_windows_at_once_and_drops_one_that_raises():
    frame = daily(groups=2, days=60)
    splitter = mm.backtest("date", horizon=7, windows=3, target="sales", features=["x"])
    grid = mm.grid(model=[_Unfittable(), Ridge(alpha=0.01), Ridge(alpha=100.0)])
    race = mm.train(fit_candidate, mm.groups(frame, by="sku") * grid, backend="serial",
                    progress=False, evaluate=splitter,
                    select=mm.halving("rmse", eta=1, keep="all")).results
    assert [m.alpha for m in race["best_model"]] == [0.01, 0.01]
    assert (race["candidates_failed"] == 1).all()
    assert (race["window_fits"] == 1 + 2 * 3).all()  # the failed one's first fit counts
    every = mm.grid(model=[_Unfittable(), _Unfittable(alpha=2.0)])
    failed = mm.train(fit_candidate, mm.groups(frame, by="sku") * every, backend="serial",
                      progress=False, evaluate=splitter, select=mm.halving("rmse", eta=1))
    assert failed.results["error"].str.contains("every candidate failed").all()


class _StatsforecastStyle:
    """statsforecast's interface: fit(y), predict(h) -> {"mean": ...}, and a
    forecast(y, h) that wants the history first (not a forecaster of h)."""

    def fit(self, y):
        self.last = np.asarray(y, dtype=float)[-7:]
        return self

    def predict(self, h, X=None, level=None):
        return {"mean": np.resize(self.last, h)}

    def forecast(self, y, h, X=None):
        raise AssertionError("a backtest must not call forecast(y, h)")


class _SktimeStyle:
    """sktime's interface: predict(fh) of the steps ahead, 1..h."""

    def __init__(self, history):
        self.last = float(history[-1])

    def predict(self, fh):
        return pd.Series(self.last + np.asarray(fh, dtype=float))


@pytest.mark.parametrize("style", ["statsforecast", "sktime"])
def test_a_forecaster_with_predict_h_is_scored_on_its_h_steps(style):
    frame = daily(groups=2, days=40)
    if style == "statsforecast":
        def fit(rows):
            return _StatsforecastStyle().fit(rows["sales"])
    else:
        def fit(rows):
            return _SktimeStyle(rows["sales"])
    run = mm.train(fit, mm.groups(frame[["sku", "date", "sales"]], by="sku", format="numpy",
                                  order_by="date"),
                   evaluate=mm.backtest("date", horizon=7, windows=2, target="sales"),
                   backend="serial", progress=False)
    for (sku, _), rows in run.forecasts.groupby(["sku", "window"]):
        history = frame[(frame["sku"] == sku) & (frame["date"] <= rows["cutoff"].iloc[0])]
        history = history.sort_values("date")["sales"].to_numpy()
        expected = (np.resize(history[-7:], 7) if style == "statsforecast"
                    else history[-1] + np.arange(1, 8))
        np.testing.assert_array_equal(rows["forecast"].to_numpy(), expected)
