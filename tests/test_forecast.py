"""``run.forecast(h)`` and ``Store.forecast(h)``: the future rows made by
manymodels (each group's h time stamps after its last one), and each
group's kept model asked for them as its protocol says: ``forecast(h)``,
``predict(h)``, sktime's ``predict(fh)`` or ``predict(X)`` with ``X_future``."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression

import manymodels as mm


class SeasonalNaive:
    """statsforecast's SeasonalNaive, fitted on a history: the last season repeated."""

    def __init__(self, y, season_length: int) -> None:
        self.last = np.asarray(y, dtype=float)[-season_length:]

    def forecast(self, h: int) -> np.ndarray:
        return np.resize(self.last, h)


class HistoricAverage:
    """statsforecast's style after fit(y): ``predict(h)`` returns ``{"mean": ...}``."""

    def __init__(self, y) -> None:
        self.mean = float(np.mean(y))

    def predict(self, h: int, X=None, level=None) -> dict:
        return {"mean": np.full(h, self.mean)}


class Drift:
    """sktime's style: ``predict(fh)`` with the relative steps 1..h."""

    def __init__(self, y) -> None:
        y = np.asarray(y, dtype=float)
        self.last, self.slope = y[-1], (y[-1] - y[0]) / (len(y) - 1)

    def predict(self, fh, X=None) -> pd.Series:
        return pd.Series(self.last + self.slope * np.asarray(fh, dtype=float))


def daily_sales(groups: int = 3, days: int = 35) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    dates = pd.date_range("2024-01-01", periods=days, freq="D")
    return pd.DataFrame({"sku": np.repeat([f"s{i}" for i in range(groups)], days),
                         "date": np.tile(dates, groups),
                         "sales": rng.normal(100, 10, groups * days).round(2)})


def seasonal_fit(rows, season_length=7):
    return SeasonalNaive(rows["sales"], season_length)


def test_seasonal_naive_daily_inferred_dates_and_values(tmp_path):
    df = daily_sales()
    run = mm.train(seasonal_fit, mm.groups(df, by="sku", order_by="date"),
                   store=tmp_path / "s", backend="serial", progress=False)
    got = run.forecast(10)
    assert list(got.columns) == ["sku", "date", "yhat"]
    expected_dates = pd.date_range("2024-02-05", periods=10, freq="D")  # after Feb 4
    for sku, rows in df.groupby("sku"):
        mine = got[got["sku"] == sku]
        assert list(mine["date"]) == list(expected_dates)
        last_week = rows["sales"].to_numpy()[-7:]
        np.testing.assert_array_equal(mine["yhat"].to_numpy(), np.resize(last_week, 10))
    assert list(got["sku"]) == list(np.repeat(["s0", "s1", "s2"], 10))


def test_store_forecast_finds_the_last_times_in_the_backtest(tmp_path):
    """No table given: the run's backtest forecasts (its last window ends at
    each group's last row) give the last times; select= keeps the winner."""
    df = daily_sales(days=42)
    df.loc[df["sku"] == "s1", "sales"] = np.tile(np.arange(7.0), 6)  # weekly: season 7 wins
    run = mm.train(seasonal_fit, mm.groups(df, by="sku", order_by="date")
                   * mm.grid(season_length=[1, 7]),
                   evaluate=mm.backtest(time="date", horizon=7, windows=2, target="sales"),
                   select="mae", store=tmp_path / "s", backend="serial", progress=False)
    winner = run.best().set_index("sku")["season_length"]
    got = mm.Store(tmp_path / "s").forecast(3)
    for sku, rows in df.groupby("sku"):
        mine = got[got["sku"] == sku]
        assert list(mine["date"]) == list(pd.date_range("2024-02-12", periods=3, freq="D"))
        season = int(winner[sku])
        expected = np.resize(rows["sales"].to_numpy()[-season:], 3)
        np.testing.assert_array_equal(mine["yhat"].to_numpy(), expected)
    assert winner["s1"] == 7
    np.testing.assert_array_equal(got[got["sku"] == "s1"]["yhat"], [0.0, 1.0, 2.0])


def test_store_forecast_reads_the_last_times_of_the_run_whose_models_it_uses(tmp_path):
    """A run still being written (another driver's, a week later) gave the
    last times, while the models were the last ended run's: its forecast
    started a week late."""
    import sqlite3

    df = daily_sales(days=21)
    backtest = mm.backtest(time="date", horizon=7, windows=2, target="sales")
    mm.train(seasonal_fit, mm.groups(df, by="sku", order_by="date"), evaluate=backtest,
             store=tmp_path / "s", backend="serial", progress=False)
    later = daily_sales(days=28)
    mm.train(seasonal_fit, mm.groups(later, by="sku", order_by="date"), evaluate=backtest,
             store=tmp_path / "s", backend="serial", progress=False)
    with sqlite3.connect(tmp_path / "s" / "index.sqlite") as conn:  # run 2 still running
        conn.execute("UPDATE runs SET status = 'running', ok = NULL, failed = NULL, "
                     "reused = NULL, driver = 'elsewhere:1:1.0' WHERE run_id = 2")
    got = mm.Store(tmp_path / "s").forecast(2)
    assert list(got["date"].iloc[:2]) == list(pd.date_range("2024-01-22", periods=2))
    np.testing.assert_array_equal(got["yhat"].iloc[:2], df["sales"].iloc[14:16])


@pytest.mark.parametrize("horizon, step", [(3, 7), (1, 7), (2, 1)])
def test_store_forecast_reads_the_frequency_within_a_window_not_across_windows(
        tmp_path, horizon, step):
    """Windows step days apart: their test days, 7 apart, read as weekly
    (March 7, 14 and 21 for daily sales). The step each task read from all
    its group's days is kept with its forecasts, so even one day a window,
    the windows apart, forecasts the next days; freq= overrides it."""
    df = daily_sales(groups=1, days=60)
    store = tmp_path / "s"
    mm.train(seasonal_fit, mm.groups(df, by="sku", order_by="date"),
             evaluate=mm.backtest(time="date", horizon=horizon, windows=4, step=step,
                                  target="sales"),
             store=store, backend="serial", progress=False)
    got = mm.Store(store).forecast(3)
    assert list(got["date"]) == list(pd.date_range("2024-03-01", periods=3, freq="D"))
    weekly = mm.Store(store).forecast(2, freq="W-THU")
    assert list(weekly["date"]) == list(pd.date_range("2024-03-07", periods=2, freq="W-THU"))


@pytest.mark.parametrize("how", ["datetime64", "date", "text", "zone"])
def test_store_forecast_keeps_business_days_that_a_short_backtest_reads_as_days(
        tmp_path, how):
    """Business days backtested one day a window: the store's window times
    (Wednesday to Friday) read as days, and the forecast went on Saturday.
    The backtest keeps the step it read from all the group's days."""
    dates = pd.bdate_range("2024-01-01", periods=30)  # ends on Friday Feb 9
    times = {"datetime64": dates, "date": [d.date() for d in dates],
             "text": list(dates.strftime("%Y-%m-%d")),
             "zone": dates.tz_localize("Europe/Paris")}[how]
    df = pd.DataFrame({"sku": "a", "date": times, "sales": np.arange(30.0)})
    mm.train(seasonal_fit, mm.groups(df, by="sku"), store=tmp_path / "s",
             evaluate=mm.backtest(time="date", horizon=1, windows=2, target="sales"),
             backend="serial", progress=False)
    got = mm.Store(tmp_path / "s").forecast(3)
    assert [pd.Timestamp(t).strftime("%a %d") for t in got["date"]] == [
        "Mon 12", "Tue 13", "Wed 14"]


def test_models_of_the_last_window_are_not_forecast_from_the_last_time(tmp_path):
    """final_model="last_window" keeps models fitted up to each group's last
    cutoff: their forecasts were labelled as starting after its last time,
    horizon steps late. Refused, naming final_model, before any model is
    loaded; the models of all rows forecast."""
    df = daily_sales(groups=1, days=20)
    for final_model in ("last_window", "all_rows"):
        run = mm.train(seasonal_fit, mm.groups(df, by="sku", order_by="date"),
                       evaluate=mm.backtest(time="date", horizon=5, windows=2, target="sales",
                                            final_model=final_model),
                       store=tmp_path / final_model, backend="serial", progress=False)
        if final_model == "last_window":
            for forecaster in (run, mm.Store(tmp_path / final_model)):
                with pytest.raises(ValueError, match=r"final_model='last_window'.*last cutoff"
                                                     r".*final_model='all_rows'"):
                    forecaster.forecast(3)
        else:
            assert run.forecast(3)["date"].tolist() == list(
                pd.date_range("2024-01-21", periods=3))


class LastSeen:
    """The last value it was fitted on, for test rows (predict) or steps (forecast)."""

    def __init__(self, y) -> None:
        self.last = float(np.asarray(y, dtype=float)[-1])

    def predict(self, X) -> np.ndarray:
        return np.full(len(X), self.last)

    def forecast(self, h: int) -> np.ndarray:
        return np.full(h, self.last)


@pytest.mark.parametrize("evaluate", [
    mm.holdout(0.25, shuffle=False, target="sales", final_model="last_window"),
    mm.kfold(3, target="sales", final_model="last_window")])
def test_a_holdouts_or_k_folds_last_window_model_is_not_forecast_either(tmp_path, evaluate):
    """An unshuffled holdout's last window's model has not seen the group's
    last quarter: it forecast its day 15's value, labelled as after day 20.
    Refused, as a backtest's is; a holdout of nothing (its model saw all
    rows) forecasts."""
    df = daily_sales(groups=1, days=20)
    run = mm.train(lambda rows: LastSeen(rows["sales"]),
                   mm.groups(df, by="sku", order_by="date"), evaluate=evaluate,
                   store=tmp_path / "s", backend="serial", progress=False)
    with pytest.raises(ValueError, match=r"final_model='last_window'.*final_model='all_rows'"):
        run.forecast(3)
    in_sample = mm.holdout(0, target="sales", final_model="last_window")
    run = mm.train(lambda rows: LastSeen(rows["sales"]),
                   mm.groups(df, by="sku", order_by="date"), evaluate=in_sample,
                   store=tmp_path / "in-sample", backend="serial", progress=False)
    assert run.forecast(3)["yhat"].tolist() == [df["sales"].iloc[-1]] * 3


def monthly_sales() -> pd.DataFrame:
    months = pd.date_range("2021-01-01", periods=24, freq="MS")
    return pd.DataFrame({"region": np.repeat(["north", "south"], 24),
                         "month": np.tile(months, 2),
                         "sales": np.concatenate([np.arange(24.0), 100 + np.arange(24.0)])})


def test_monthly_inferred_and_given_freq_and_other_protocols(tmp_path):
    df = monthly_sales()
    run = mm.train(lambda rows: HistoricAverage(rows["sales"]),
                   mm.groups(df, by="region", order_by="month"),
                   store=tmp_path / "avg", backend="serial", progress=False)
    got = run.forecast(4)  # inferred: month starts
    assert list(got["month"][:4]) == list(pd.date_range("2023-01-01", periods=4, freq="MS"))
    np.testing.assert_allclose(got["yhat"], np.repeat([11.5, 111.5], 4))
    quarterly = run.forecast(2, freq="QS")  # given: quarter starts after Dec 2022
    assert list(quarterly["month"][:2]) == [pd.Timestamp("2023-01-01"),
                                            pd.Timestamp("2023-04-01")]
    drift = mm.train(lambda rows: Drift(rows["sales"]),
                     mm.groups(df, by="region", order_by="month"),
                     store=tmp_path / "drift", backend="serial", progress=False)
    np.testing.assert_allclose(drift.forecast(3)["yhat"], [24, 25, 26, 124, 125, 126])


def test_integer_time_steps(tmp_path):
    df = pd.DataFrame({"sku": np.repeat(["a", "b"], 10),
                       "week": np.concatenate([np.arange(0, 20, 2), np.arange(5, 15)]),
                       "sales": np.arange(20.0)})
    run = mm.train(lambda rows: SeasonalNaive(rows["sales"], 1),
                   mm.groups(df, by="sku", order_by="week"), store=tmp_path / "s",
                   backend="serial", progress=False)
    got = run.forecast(3)
    assert list(got["week"]) == [20, 22, 24, 15, 16, 17]  # each group its own step
    assert list(mm.Store(tmp_path / "s").forecast(2, freq=5, history=df)["week"]) == [
        23, 28, 19, 24]


def fit_promo(rows):
    X = pd.DataFrame({"promo": rows["promo"], "trend": np.arange(len(rows), dtype=float)})
    return LinearRegression().fit(X, rows["sales"])


def promo_sales() -> tuple[pd.DataFrame, pd.DataFrame]:
    rng = np.random.default_rng(3)
    dates = pd.date_range("2024-03-01", periods=20, freq="D")
    df = pd.DataFrame({"store": np.repeat([1, 2], 20), "date": np.tile(dates, 2),
                       "promo": rng.integers(0, 2, 40).astype(float)})
    df["sales"] = 10 + 5 * df["promo"] + np.tile(np.arange(20.0), 2) + rng.normal(0, 1, 40)
    future_dates = pd.date_range("2024-03-21", periods=4, freq="D")
    X_future = pd.DataFrame({"store": np.repeat([2, 1], 4),  # any row order
                             "date": np.tile(future_dates, 2),
                             "promo": [1.0, 0, 0, 1, 0, 0, 1, 1],
                             "trend": np.tile(np.arange(20.0, 24.0), 2)})
    return df, X_future


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_sklearn_predict_x_with_x_future(tmp_path, backend):
    df, X_future = promo_sales()
    run = mm.train(fit_promo, mm.groups(df, by="store", order_by="date"),
                   store=tmp_path / "s", backend="serial", progress=False)
    got = run.forecast(4, X_future=X_future, backend=backend, workers=2)
    assert list(got.columns) == ["store", "date", "yhat"]
    for store in (1, 2):
        model = run.models[store]
        rows = X_future[X_future["store"] == store]
        mine = got[got["store"] == store]
        assert list(mine["date"]) == list(rows["date"])
        np.testing.assert_allclose(mine["yhat"], model.predict(rows[["promo", "trend"]]))


def fit_promo_arrays(rows):  # format="numpy": fitted on arrays, so no feature names
    return LinearRegression().fit(np.column_stack([rows["promo"],
                                                   np.arange(len(rows["promo"]), dtype=float)]),
                                  rows["sales"])


def test_a_model_fitted_on_unnamed_columns_is_refused_the_key_and_time_columns(tmp_path):
    # its two features by position: the store number and the day would have
    # been predicted from, silently, where no X_future gives them
    df, X_future = promo_sales()
    run = mm.train(fit_promo_arrays, mm.groups(df, by="store", order_by="date",
                                               format="numpy"),
                   store=tmp_path / "s", backend="serial", progress=False)
    with pytest.raises(ValueError, match=r"group 1 \(LinearRegression\) was fitted on 2 "
                                         r"unnamed feature column.*pass X_future="):
        run.forecast(4)
    with pytest.raises(ValueError, match=r"X_future gives 1: \['promo'\]"):
        run.forecast(4, X_future=X_future.drop(columns="trend"))
    got = run.forecast(4, X_future=X_future)
    for store in (1, 2):
        rows = X_future[X_future["store"] == store]
        np.testing.assert_allclose(got.loc[got["store"] == store, "yhat"],
                                   run.models[store].predict(rows[["promo", "trend"]].to_numpy()))


def test_refusals_name_what_is_wrong(tmp_path):
    df, X_future = promo_sales()
    run = mm.train(fit_promo, mm.groups(df, by="store", order_by="date"),
                   store=tmp_path / "s", backend="serial", progress=False)
    with pytest.raises(ValueError, match="feature column 'promo'.*X_future="):
        run.forecast(4)
    with pytest.raises(ValueError, match="X_future has no row for group 1 at date=2024-03-24"):
        run.forecast(4, X_future=X_future[~((X_future["store"] == 1)
                                            & (X_future["date"] == "2024-03-24"))])
    with pytest.raises(ValueError, match="column 'date' is not in X_future"):
        run.forecast(4, X_future=X_future.drop(columns="date"))
    with pytest.raises(ValueError, match=r"X_future's key and time columns \['store', 'date'\]"):
        run.forecast(4, X_future=X_future.astype({"store": str}))
    with pytest.raises(ValueError, match="more than one row"):
        run.forecast(4, X_future=pd.concat([X_future, X_future.iloc[:1]]))
    with pytest.raises(ValueError, match="h must be a positive whole number"):
        run.forecast(0)
    with pytest.raises(ValueError, match="freq='fortnightly' is not a pandas offset alias"):
        run.forecast(2, freq="fortnightly", X_future=X_future)
    with pytest.raises(ValueError, match="freq=3: the time column 'date' holds datetimes"):
        run.forecast(2, freq=3, X_future=X_future)
    store = mm.Store(tmp_path / "s")
    with pytest.raises(ValueError, match="column 'date' is not in history"):
        store.forecast(2, history=df.drop(columns="date"))
    with pytest.raises(ValueError, match="run 1 kept no backtest forecasts.*history="):
        store.forecast(2)  # no table: nothing says where each store's series ends


def test_irregular_group_is_named_and_time_is_asked_for(tmp_path):
    df = daily_sales(groups=2, days=10)
    gaps = df.index[(df["sku"] == "s1") & (df.index % 3 == 0)]
    df = df.drop(gaps)
    run = mm.train(seasonal_fit, mm.groups(df, by="sku", order_by="date"),
                   store=tmp_path / "s", backend="serial", progress=False)
    with pytest.raises(ValueError, match="cannot infer the frequency of group 's1'.*freq="):
        run.forecast(3)
    assert len(run.forecast(3, freq="D")) == 6  # given, it needs no inference
    unsorted = mm.train(seasonal_fit, mm.groups(df, by="sku"), store=tmp_path / "u",
                        backend="serial", progress=False)
    with pytest.raises(ValueError, match="pass time="):
        unsorted.forecast(3, freq="D")
    got = unsorted.forecast(3, freq="D", time="date")
    assert list(got["date"][:3]) == list(pd.date_range("2024-01-11", periods=3, freq="D"))


def test_forecast_needs_a_store():
    run = mm.train(seasonal_fit, mm.groups(daily_sales(), by="sku", order_by="date"),
                   backend="serial", progress=False)
    with pytest.raises(ValueError, match="needs a run trained with store="):
        run.forecast(3)


@pytest.mark.skipif(importlib.util.find_spec("statsforecast") is None,
                    reason="statsforecast pins pandas<3: not in the project's environment")
def test_statsforecast_model_predicts_h(tmp_path):  # pragma: no cover - needs statsforecast
    from statsforecast.models import SeasonalNaive as StatsSeasonalNaive

    df = daily_sales()

    def fit(rows):
        return StatsSeasonalNaive(season_length=7).fit(rows["sales"].to_numpy())

    run = mm.train(fit, mm.groups(df, by="sku", order_by="date"), store=tmp_path / "s",
                   backend="serial", progress=False)
    got = run.forecast(10)
    for sku, rows in df.groupby("sku"):
        expected = np.resize(rows["sales"].to_numpy()[-7:], 10)
        np.testing.assert_allclose(got[got["sku"] == sku]["yhat"], expected)


def fit_or_fail(rows):
    if rows["sku"].iloc[0] == "s1":
        raise RuntimeError("no model for s1")
    return SeasonalNaive(rows["sales"], 7)


def test_groups_without_a_model_are_named_and_left_out(tmp_path):
    df = daily_sales()
    run = mm.train(fit_or_fail, mm.groups(df, by="sku", order_by="date"),
                   store=tmp_path / "s", backend="serial", progress=False)
    with pytest.warns(RuntimeWarning, match=r"1 group\(s\) have no model .*: they are not "
                      r"forecast; 1 failed in training \(e.g. \['s1'\], status failed"):
        got = run.forecast(2)
    assert list(got["sku"]) == ["s0", "s0", "s2", "s2"]
    grid = mm.train(seasonal_fit, mm.groups(df, by="sku", order_by="date")
                    * mm.grid(season_length=[1, 7]), store=tmp_path / "g",
                    backend="serial", progress=False)
    with pytest.raises(ValueError, match=r"a model per group and setting of \['season_length'\]"):
        grid.forecast(2)


@pytest.mark.parametrize(("dates", "expected"), [
    (pd.bdate_range("2024-01-01", periods=20),  # ends on Friday Jan 26
     pd.DatetimeIndex(["2024-01-29", "2024-01-30", "2024-01-31"])),
    (pd.date_range("2024-03-30 20:00", periods=30, freq="h", tz="Europe/Paris"),  # over DST
     pd.date_range("2024-04-01 03:00", periods=3, freq="h", tz="Europe/Paris")),
    (pd.date_range("2023-03-24", periods=6, freq="D", tz="Europe/Paris"),  # days over DST
     pd.date_range("2023-03-30", periods=3, freq="D", tz="Europe/Paris")),
])
def test_business_days_and_time_zones(tmp_path, dates, expected):
    df = pd.DataFrame({"g": np.repeat([1, 2], len(dates)), "t": list(dates) * 2,
                       "sales": np.arange(2.0 * len(dates))})
    assert df["t"].dt.tz == dates.tz
    got = mm.Store(tmp_path / "s")
    mm.train(lambda rows: SeasonalNaive(rows["sales"], 1), mm.groups(df, by="g", order_by="t"),
             store=got, backend="serial", progress=False)
    future = got.forecast(3, history=df)
    assert list(future["t"][:3]) == list(expected)
    assert list(future["t"][3:]) == list(expected)


def test_the_backtests_time_column_is_the_forecasts_without_order_by(tmp_path):
    """A run evaluated by mm.backtest(time=...) keeps its time column in the
    store: forecast needs no time= where the groups had no order_by."""
    df = daily_sales(days=42)
    mm.train(seasonal_fit, mm.groups(df, by="sku"),
             evaluate=mm.backtest(time="date", horizon=7, windows=2, target="sales"),
             store=tmp_path / "s", backend="serial", progress=False)
    got = mm.Store(tmp_path / "s").forecast(3)
    assert list(got.columns) == ["sku", "date", "yhat"]
    for sku in df["sku"].unique():
        assert list(got.loc[got["sku"] == sku, "date"]) == list(
            pd.date_range("2024-02-12", periods=3, freq="D"))


@pytest.mark.parametrize(("history", "expected"), [
    (["2021-01-01", "2022-01-01", "2023-01-01"], ["2024-01-01", "2025-01-01"]),  # years
    (["2024-07-01", "2024-08-01", "2024-09-01"], ["2024-10-01", "2024-11-01"]),  # month starts
    (["2024-06-30", "2024-07-31", "2024-08-31"], ["2024-09-30", "2024-10-31"]),  # month ends
    (["2024-01-01", "2024-01-31", "2024-03-01"], ["2024-03-31", "2024-04-30"]),  # 30 days apart
])
def test_short_histories_evenly_spaced_by_a_month_or_more_keep_their_calendar(history,
                                                                               expected):
    """Three month starts 31 days apart are months, not '31 days': a gap of
    28 days or more is asked of pandas.infer_freq before it counts as days."""
    import pyarrow as pa

    from manymodels.run.futurerows import future_rows, group_times, steps

    frame = pd.DataFrame({"g": "a", "t": pd.to_datetime(history)})
    times = group_times(pa.Table.from_pandas(frame, preserve_index=False), ["g"], "t", "x")
    codes, found = steps(times, None)
    assert list(future_rows(times, codes, found, 2)["t"]) == list(pd.to_datetime(expected))


class _SeasonalNaive:
    def __init__(self, y, season: int = 7) -> None:
        self.last = np.asarray(y, dtype=float)[-season:]

    def forecast(self, h: int):
        return np.resize(self.last, h)


def test_a_categorical_key_forecasts_as_a_text_one(tmp_path):
    """Arrow sorts no dictionary column: run.forecast and Store.forecast of
    groups keyed by a pandas Categorical raised ArrowTypeError."""
    daily = pd.DataFrame({"sku": pd.Categorical(np.repeat(["b", "a"], 28)),
                          "date": np.tile(pd.date_range("2024-01-01", periods=28), 2),
                          "sales": np.arange(56.0)})
    run = mm.train(lambda rows: _SeasonalNaive(rows["sales"]),
                   mm.groups(daily, by="sku", order_by="date"), store=tmp_path / "s",
                   progress=False, backend="serial")
    for forecast in (run.forecast(3), mm.Store(tmp_path / "s").forecast(3, history=daily)):
        by_sku = forecast.groupby("sku", observed=True)["yhat"].apply(list).to_dict()
        assert by_sku == {"a": [49.0, 50.0, 51.0], "b": [21.0, 22.0, 23.0]}
        assert forecast["date"].min() == pd.Timestamp("2024-01-29")


class LastValue:
    def __init__(self, y):
        self.last = float(np.asarray(y)[-1])

    def forecast(self, h):
        return np.full(h, self.last)


def last_value(rows):
    return LastValue(rows["y"])


def test_a_group_with_a_model_but_no_backtest_rows_is_named_not_dropped_silently(tmp_path):
    """Group b trained ok but was too short to backtest: Store.forecast
    without history= left it out with no word (its last time is unknown)."""
    df = pd.DataFrame({"sku": ["a"] * 30 + ["b"] * 5,
                       "day": list(range(30)) + list(range(5)), "y": np.arange(35.0)})
    run = mm.train(last_value, mm.groups(df, by="sku", format="numpy", order_by="day"),
                   evaluate=mm.backtest(time="day", horizon=3, windows=2, target="y"),
                   store=tmp_path / "s", backend="serial", progress=False)
    assert run.results["status"].tolist() == ["ok", "ok"]
    store = mm.Store(tmp_path / "s")
    with pytest.warns(RuntimeWarning, match=r"1 group\(s\) with a model \(e.g. \['b'\]\) have "
                                            r"no rows in run 1's backtest forecasts"):
        got = store.forecast(2)
    assert got["sku"].tolist() == ["a", "a"]
    whole = store.forecast(2, history=df)
    assert whole["sku"].tolist() == ["a", "a", "b", "b"]
    assert whole["yhat"].tolist() == [29.0, 29.0, 34.0, 34.0]


def fit_x(rows):
    return LinearRegression().fit(rows[["x"]], rows["y"])


def test_x_future_of_naive_times_for_zoned_groups_is_named(tmp_path):
    """A raw pandas TypeError ("Cannot use .astype to convert from
    timezone-naive ...") named neither X_future nor its time column."""
    times = pd.date_range("2024-01-01", periods=20, freq="D", tz="UTC")
    df = pd.DataFrame({"g": "a", "t": times, "x": np.arange(20.0), "y": 2 * np.arange(20.0)})
    run = mm.train(fit_x, mm.groups(df, by="g", order_by="t"), store=tmp_path / "s",
                   backend="serial", progress=False)
    future = pd.DataFrame({"g": "a", "t": pd.date_range("2024-01-21", periods=2, tz="UTC"),
                           "x": [20.0, 21.0]})
    assert run.forecast(2, X_future=future)["yhat"].tolist() == pytest.approx([40.0, 42.0])
    with pytest.raises(ValueError, match=r"X_future's time column 't' cannot be read as the "
                                         r"groups' times \(datetime64\[.*, UTC\]: give it "
                                         "that zone"):
        run.forecast(2, X_future=future.assign(t=future["t"].dt.tz_localize(None)))


def test_whole_numbers_written_as_text_are_forecast_as_numbers(tmp_path):
    """Text time steps "001" to "014", which a backtest sorts as numbers, are
    numbers to forecast too: read as dates they were the year 1 ("001") and
    the future times days of it."""
    df = pd.DataFrame({"g": "a", "t": [f"{i:03d}" for i in range(1, 15)],
                       "y": np.arange(14.0)})
    run = mm.train(last_value, mm.groups(df, by="g"),
                   evaluate=mm.backtest(time="t", horizon=2, windows=2, target="y"),
                   store=tmp_path / "s", backend="serial", progress=False)
    for future in (run.forecast(3), mm.Store(tmp_path / "s").forecast(3)):
        assert list(future["t"]) == [15, 16, 17]
        assert list(future["yhat"]) == [13.0, 13.0, 13.0]


@pytest.mark.parametrize("times, freq, expected", [
    # tenths, not sums of floats (1.2 + 0.1 is 1.3000000000000003)
    (np.round(np.arange(3, 17) / 10, 1), None, [1.7, 1.8, 1.9]),
    (np.round(np.arange(3, 17) / 10, 1), 0.2, [1.8, 2.0, 2.2]),
    # ISO weeks, over a year of 53 of them, written back as weeks
    ([f"2020-W{w:02d}" for w in range(40, 54)], None, ["2021-W01", "2021-W02", "2021-W03"]),
    ([f"2020-W{w:02d}" for w in range(40, 54)], "W", ["2021-W01", "2021-W02", "2021-W03"]),
    ([f"2024-W0{4 + i // 7}-{i % 7 + 1}" for i in range(14)], None,
     ["2024-W06-1", "2024-W06-2", "2024-W06-3"]),
])
def test_decimal_and_iso_week_times_that_backtest_are_forecast(tmp_path, times, freq, expected):
    """A time column of decimals or ISO week text passed the backtest, and
    then run.forecast and Store.forecast refused it: the future times are
    the next decimals (exactly) and the next weeks, written as the history's."""
    df = pd.DataFrame({"g": "a", "t": times, "y": np.arange(14.0)})
    run = mm.train(last_value, mm.groups(df, by="g"),
                   evaluate=mm.backtest(time="t", horizon=2, windows=2, target="y"),
                   store=tmp_path / "s", backend="serial", progress=False)
    for future in (run.forecast(3, freq=freq), mm.Store(tmp_path / "s").forecast(3, freq=freq)):
        assert future["t"].tolist() == expected
        assert list(future["yhat"]) == [13.0, 13.0, 13.0]
    if freq == "W":  # a day later is the same week
        with pytest.raises(ValueError, match="holds ISO weeks .* so freq= is weekly"):
            run.forecast(3, freq="D")


def test_store_forecast_refuses_another_by_time_or_freq_by_its_own_name(tmp_path):
    """A by= or time= of other columns than the run's is refused naming it
    (they read the backtest's forecasts by the wrong columns: "kept no
    backtest forecasts", or the backtest's times given back under time='s
    name); a freq= refused says so alone, not that inference failed."""
    df = daily_sales(groups=2, days=21)
    mm.train(seasonal_fit, mm.groups(df, by="sku"),
             evaluate=mm.backtest(time="date", horizon=7, windows=2, target="sales"),
             store=tmp_path / "s", backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    with pytest.raises(ValueError, match=r"by=\['shop'\], but the run's models are keyed by "
                                         r"\['sku'\]"):
        store.forecast(2, by="shop")
    with pytest.raises(ValueError, match="time='day', but run 1's backtest.*'date'"):
        store.forecast(2, time="day")
    with pytest.raises(ValueError, match=r"^freq='fortnightly' is not a pandas offset alias "
                                         r"\('D', 'W', 'MS', 'h', \.\.\.\)$"):
        store.forecast(2, freq="fortnightly")
    assert len(store.forecast(2, by="sku", time="date")) == 4
