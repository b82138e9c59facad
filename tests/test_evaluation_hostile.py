"""Evaluation under hostile but plausible input: unsorted series, models
that answer with the wrong length, missing times, candidates that fail on
all rows, odd metric functions and splitter arguments. Each test fails
before its fix."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Lasso, LinearRegression

import manymodels as mm
from manymodels.evaluation.metrics import mase


class LastValue:
    """A forecaster that depends on the rows' order: the last value seen."""

    def __init__(self, history) -> None:
        self.last = float(np.asarray(history)[-1])

    def forecast(self, h: int) -> np.ndarray:
        return np.full(h, self.last)


class Const:
    def __init__(self, c: float) -> None:
        self.c = c

    def predict(self, X) -> np.ndarray:
        return np.full(len(X), self.c)


def _series(days: int = 10) -> pd.DataFrame:
    return pd.DataFrame({"sku": "a", "day": np.arange(days), "sales": np.arange(float(days))})


@pytest.mark.parametrize("select", [None, "mae", mm.halving("mae", eta=1),
                                    mm.halving("mae", eta=2, keep="all")])
def test_the_kept_model_is_fitted_on_the_rows_sorted_by_time(tmp_path, select):
    """The final fit (all rows, a halving winner's, keep="all"'s, a group too
    short to evaluate) sees the rows in time order, as the windows do."""
    shuffled = _series(10).sample(frac=1.0, random_state=0)
    short = pd.DataFrame({"sku": "b", "day": [2, 0, 1], "sales": [2.0, 0.0, 1.0]})
    table = pd.concat([shuffled, short])
    source = mm.groups(table, by="sku")
    if select is not None:
        source = source * mm.grid(k=[1, 2])
    run = mm.train(lambda rows, k=1: LastValue(rows["sales"]), source, select=select,
                   evaluate=mm.backtest(time="day", horizon=2, windows=2, target="sales"),
                   store=tmp_path / "store", backend="serial", progress=False)
    forecast = run.forecast(1).set_index("sku")["yhat"]
    assert forecast.to_dict() == {"a": 9.0, "b": 2.0}


def test_candidates_kept_forecast_as_their_winner(tmp_path):
    """mm.halving(keep="all")'s Candidates forecast with the winner's forecast(h)."""
    table = _series(28)

    def fit(rows, step):
        return LastValue(rows["sales"].to_numpy()[:len(rows) - step + 1])

    run = mm.train(fit, mm.groups(table, by="sku") * mm.grid(step=[1, 3]),
                   evaluate=mm.backtest(time="day", horizon=2, windows=2, target="sales"),
                   select=mm.halving("mae", eta=1, keep="all"), store=tmp_path / "s",
                   backend="serial", progress=False)
    assert run.forecast(2)["yhat"].tolist() == [27.0, 27.0]


def test_predict_of_the_wrong_length_fails_its_task_naming_it():
    """Lengths that add up across windows were scored against other windows' rows."""
    table = pd.DataFrame({"sku": "a", "day": np.arange(12), "x": np.arange(12.0),
                          "sales": np.arange(12.0)})

    class Echo:
        def __init__(self, extra: int) -> None:
            self.extra = extra

        def predict(self, X):
            x = X["x"].to_numpy()
            return x[:-1] if self.extra < 0 else np.r_[x, x[:1]] if self.extra > 0 else x

    fits = iter([-1, +1, 0])
    evaluate = mm.backtest(time="day", horizon=3, windows=2, target="sales", features=["x"],
                           metrics=["mae"])
    run = mm.train(lambda rows: Echo(next(fits)), mm.groups(table, by="sku"),
                   evaluate=evaluate, backend="serial", progress=False)
    assert run.results["status"].tolist() == ["failed"]
    assert ("Echo.predict returned an array of shape (2,) for window 0's 3 test rows"
            in run.results["error"].iloc[0])
    wide = mm.train(lambda rows: type("Wide", (), {"predict": lambda s, X: np.ones((len(X), 2))})(),
                    mm.groups(table, by="sku"), evaluate=evaluate, backend="serial",
                    progress=False)
    assert "shape (3, 2) for window 0's 3 test rows" in wide.results["error"].iloc[0]
    column = mm.train(lambda rows: type("Column", (), {
        "predict": lambda s, X: X[["x"]].to_numpy()})(), mm.groups(table, by="sku"),
        evaluate=evaluate, backend="serial", progress=False)
    assert column.results["mae"].tolist() == [0.0]  # an (n, 1) array is a column


def test_missing_times_are_refused_before_any_work_or_fail_their_task():
    table = pd.DataFrame({"sku": "a", "sales": np.arange(8.0),
                          "day": pd.date_range("2024-01-01", periods=8)})
    table.loc[2, "day"] = pd.NaT
    evaluate = mm.backtest(time="day", horizon=2, windows=2, target="sales")
    calls = []

    def fit(rows):
        calls.append(1)
        return LastValue(rows["sales"])

    with pytest.raises(ValueError, match="time column 'day' has 1 missing value"):
        mm.train(fit, mm.groups(table, by="sku"), evaluate=evaluate, backend="serial",
                 progress=False)
    text = table.assign(day=table["day"].dt.strftime("%Y-%m-%d"))
    with pytest.raises(ValueError, match="time column 'day' has 1 missing value"):
        mm.train(fit, mm.groups(text, by="sku"), evaluate=evaluate, backend="serial",
                 progress=False)
    assert calls == []
    # a group read on its worker is checked there: its task fails, naming the column
    rows = {"day": np.array([0.0, np.nan, 2.0]), "sales": np.arange(3.0)}
    with pytest.raises(ValueError, match="time column 'day' has 1 missing value"):
        evaluate.prepare(rows)


def test_halving_drops_a_candidate_that_fails_on_all_rows_not_the_group():
    table = pd.DataFrame({"g": ["long"] * 12 + ["short"] * 3,
                          "t": list(range(12)) + list(range(3)), "y": np.arange(15.0)})
    evaluate = mm.backtest(time="t", horizon=2, windows=2, target="y", metrics=["mae"])

    def first_fails(rows, c):
        if c == 0:
            raise ValueError("candidate 0 always fails")
        return Const(c)

    run = mm.train(first_fails, mm.groups(table, by="g") * mm.grid(c=[0, 5, 9]),
                   evaluate=evaluate, select=mm.halving("mae", eta=2), backend="serial",
                   progress=False)
    results = run.results.set_index("g")
    assert results["status"].tolist() == ["ok", "ok"]
    assert results.loc["short", "best_c"] == 5  # the first candidate that fits

    def winner_fails_on_all_rows(rows, c):
        if c == 9 and len(rows) == 12:
            raise ValueError("fails on all rows")
        return Const(c)

    for keep in ("best", "all"):
        long = table[table["g"] == "long"]
        run = mm.train(winner_fails_on_all_rows, mm.groups(long, by="g") * mm.grid(c=[100, 9]),
                       evaluate=evaluate, select=mm.halving("mae", eta=2, keep=keep),
                       backend="serial", progress=False)
        # a candidate failing on all rows leaves, the winner too (its failing
        # failed the group under keep="best"): the best one left wins
        assert run.results["status"].tolist() == ["ok"]
        assert run.results["best_c"].tolist() == [100]
        assert run.results["candidates_failed"].tolist() == [1]
        model = run.models["long"]
        if keep == "best":
            assert model.c == 100
        else:
            assert model.models[1] is None and model.best.c == 100


def test_r2_of_one_row_is_undefined(tmp_path):
    """A score undefined in every window (r2 of one row, a metric function's
    None) is a float column of NaN in run.evaluation, as in run.results, not
    one of None objects (whose mean or plot fails)."""
    table = pd.DataFrame({"g": "a", "t": np.arange(10), "x": np.arange(10.0),
                          "y": np.arange(10.0) ** 2})
    run = mm.train(lambda r: LinearRegression().fit(r[["x"]], r["y"]), mm.groups(table, by="g"),
                   evaluate=mm.backtest(time="t", horizon=1, windows=3, target="y",
                                        features=["x"],
                                        metrics=["r2", "mae", lambda m, rows: {"own": None}]),
                   store=tmp_path / "s", backend="serial", progress=False)
    for evaluation in (run.evaluation, mm.Store(tmp_path / "s").evaluation()):
        assert evaluation["r2"].isna().all() and evaluation["own"].isna().all()
        assert evaluation["r2"].dtype == evaluation["own"].dtype == np.float64
        assert evaluation["mae"].notna().all()
    assert mm.evaluation.metrics.r2([81.0], [70.0]) != mm.evaluation.metrics.r2([81.0], [70.0])


@pytest.mark.parametrize("eta", [1, 2])
@pytest.mark.parametrize("reporter", ["fit", "metric"])
@pytest.mark.parametrize("name", ["window_fits", "best_k", "candidate_error"])
def test_a_metric_named_as_a_halving_column_is_refused_by_name(eta, reporter, name):
    """Under select=mm.halving(...) a metric named window_fits or best_<param>
    (reported by fit or a metric function) was silently overwritten by the
    halving's own column: the group fails, naming it."""
    table = pd.DataFrame({"g": "a", "t": np.arange(12), "y": np.arange(12.0)})

    def fit(rows, k=1):
        model = LastValue(rows["y"])
        return (model, {name: 99.0}) if reporter == "fit" else model

    metrics = ["mae"] if reporter == "fit" else ["mae", lambda model, rows: {name: 1.0}]
    run = mm.train(fit, mm.groups(table, by="g") * mm.grid(k=[1, 2]),
                   evaluate=mm.backtest(time="t", horizon=2, windows=2, target="y",
                                        metrics=metrics),
                   select=mm.halving("mae", eta=eta), backend="serial", progress=False)
    assert run.results["status"].tolist() == ["failed"]
    assert f"a metric named {name!r}, a column select=mm.halving" in run.results["error"][0]


def test_a_text_target_scored_by_numbers_is_refused_before_any_work(tmp_path):
    """A text target with the default metrics (rmse, mae) failed every task
    on "could not convert string to float", naming neither the column nor
    the metric; labels scored by accuracy are taken."""
    from sklearn.dummy import DummyClassifier

    table = pd.DataFrame({"g": "a", "t": np.arange(12), "x": np.arange(12.0),
                          "label": np.tile(["u", "v"], 6)})
    calls = []

    def fit(rows):
        calls.append(1)
        return DummyClassifier().fit(rows[["x"]], rows["label"])

    with pytest.raises(ValueError, match=r"target 'label' holds text .* metric 'rmse'"):
        mm.train(fit, mm.groups(table, by="g"),
                 evaluate=mm.backtest(time="t", horizon=2, target="label", features=["x"]),
                 backend="serial", progress=False)
    path = tmp_path / "t.parquet"
    table.astype({"label": "category"}).to_parquet(path)
    with pytest.raises(ValueError, match=r"target 'label' holds text .* metric 'mae'"):
        mm.train(fit, mm.groups(path, by="g"),
                 evaluate=mm.holdout(target="label", metrics=["accuracy", "mae"]),
                 backend="serial", progress=False)
    assert calls == []
    run = mm.train(fit, mm.groups(table, by="g"),
                   evaluate=mm.backtest(time="t", horizon=2, target="label", features=["x"],
                                        metrics=["accuracy"]),
                   backend="serial", progress=False)
    assert run.results["status"].tolist() == ["ok"]


def test_metric_functions_answer_numbers_named_apart_or_are_named():
    table = pd.DataFrame({"g": "a", "t": np.arange(12), "y": np.arange(12.0)})

    class Zero:
        def predict(self, X):
            return np.zeros(len(X))

    def run_with(metric, metrics=()):
        evaluate = mm.backtest(time="t", horizon=2, windows=2, target="y",
                               metrics=[*metrics, metric])
        return mm.train(lambda r: Zero(), mm.groups(table, by="g"), evaluate=evaluate,
                        backend="serial", progress=False)

    def none_score(model, rows):
        return {"wmape": None}

    assert run_with(none_score).evaluation["wmape"].isna().all()

    def a_float(model, rows):
        return 0.5

    assert "metric function a_float returned float" in run_with(a_float).results["error"][0]

    def an_array(model, rows):
        return {"wmape": np.array([1.0, 2.0])}

    error = run_with(an_array).results["error"][0]
    assert "metric function an_array returned 'wmape': ndarray, not a number" in error

    def named_mae(model, rows):
        return {"mae": 999.0}

    error = run_with(named_mae, ["mae"]).results["error"][0]
    assert "returned a score named 'mae', which metrics= computes itself" in error


def _pinball(q: float):
    def score(model, rows):  # (every pinball loss is a function named score)
        return {"pinball": q}
    return score


@pytest.mark.parametrize("make", [mm.holdout, mm.kfold,
                                  lambda **kw: mm.backtest(time="t", horizon=1, **kw)])
def test_a_metric_given_twice_is_refused_before_any_work_naming_it(make):
    """metrics=["mae", "mae"] (one function twice) was taken: its column
    computed twice and kept once."""
    with pytest.raises(ValueError, match="metrics= names the metric 'mae' twice"):
        make(target="y", metrics=["mae", "rmse", "mae"])
    one = _pinball(0.5)
    with pytest.raises(ValueError, match="metrics= names the metric 'score' twice"):
        make(target="y", metrics=[one, one])
    assert len(make(target="y", metrics=[_pinball(0.1), _pinball(0.9)]).metrics) == 2


def test_two_metric_functions_answering_one_score_name_fail_naming_both():
    """Two functions (one factory's, of one __name__) answering "pinball":
    the second's score replaced the first's, silently."""
    table = pd.DataFrame({"g": "a", "t": np.arange(12), "y": np.arange(12.0)})
    evaluate = mm.backtest(time="t", horizon=2, windows=2, target="y",
                           metrics=[_pinball(0.1), _pinball(0.9)])
    run = mm.train(lambda rows: Const(0.0), mm.groups(table, by="g"), evaluate=evaluate,
                   backend="serial", progress=False)
    assert "metric functions score and score both returned a score named 'pinball'" in \
        run.results["error"][0]


def test_splitter_arguments_are_read_as_given():
    assert mm.holdout(0.2, target="y", features=(c for c in ["x"])).features == ("x",)
    assert mm.backtest(time="t", horizon=np.int64(7), windows=np.int32(2), step=np.int8(1),
                       target="y").horizon == 7
    assert mm.kfold(np.int64(3), target="y").k == 3
    assert mm.halving("mae", eta=np.int64(2)).eta == 2
    with pytest.raises(ValueError, match="the time column 'y' is also the target"):
        mm.backtest(time="y", horizon=2, target="y")
    with pytest.raises(ValueError, match="seed must be an integer >= 0, got None"):
        mm.kfold(3, target="y", seed=None)
    with pytest.raises(TypeError, match="metrics must name the metrics"):
        mm.holdout(target="y", metrics=None)
    with pytest.raises(ValueError, match="horizon must be an integer >= 1, got 2.0"):
        mm.backtest(time="t", horizon=2.0, target="y")


@pytest.mark.parametrize("make", [lambda shuffle: mm.holdout(0.2, target="y", shuffle=shuffle),
                                  lambda shuffle: mm.kfold(3, target="y", shuffle=shuffle)])
def test_shuffle_is_a_flag_not_a_truthy_value(make):
    """shuffle="False" (from a config file) was bool("False"), True: a time
    series was shuffled and scored on rows mixed with its training rows."""
    for wrong in ("False", None, 0):
        with pytest.raises(TypeError, match=r"shuffle must be True or False, got"):
            make(wrong)
    assert make(np.False_).shuffle is False and make(True).shuffle is True


def test_a_select_metric_no_task_reported_keeps_the_run(tmp_path):
    """A metric function's names are known only once tasks ran: a typo in
    select= warns and returns the run unselected, its work kept."""
    table = pd.DataFrame({"g": np.repeat(["a", "b"], 10), "t": np.tile(np.arange(10), 2),
                          "y": np.arange(20.0)})

    def score(model, rows):
        return {"wmape": float(np.abs(rows["y"] - model.c).sum() / rows["y"].abs().sum())}

    with pytest.warns(UserWarning, match="select='wmap': no task reported that metric"), \
            pytest.warns(UserWarning, match="the first task that trained"):
        run = mm.train(lambda rows, c: Const(c), mm.groups(table, by="g") * mm.grid(c=[1.0, 2.0]),
                       select=("wmap", "min"), store=tmp_path / "s", backend="serial",
                       evaluate=mm.backtest(time="t", horizon=2, windows=2, target="y",
                                            metrics=[score]), progress=False)
    assert run.summary().statuses == {"ok": 4}
    assert len(mm.Store(tmp_path / "s").runs()) == 1
    # run.best() said to pass select=, which was passed
    with pytest.raises(ValueError, match=r"no task reported select='wmap'; the results' "
                                         r"columns are \[.*'wmape'"):
        run.best()


@pytest.mark.parametrize("case", ["fit", "score", "too short"])
def test_a_select_metric_the_first_task_lacks_warns_before_the_next_runs(case):
    """select= naming a metric no task reports warned only once every task
    had run (a long sweep's hours later): the first task that trains without
    it warns, once, and the run goes on; a group too short to evaluate (no
    metric function ran on it) says nothing yet."""
    n = 3 if case == "too short" else 10
    table = pd.DataFrame({"g": "a", "t": np.arange(n), "y": np.arange(n, dtype=float)})
    evaluate = None if case == "fit" else mm.backtest(
        time="t", horizon=2, windows=2, target="y",
        metrics=[lambda model, rows: {"wmape": 0.5}])
    early = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        def fit(rows, c):
            early.append(sum("the first task that trained" in str(w.message) for w in caught))
            return (Const(c), {"loss": 1.0}) if case == "fit" else Const(c)

        run = mm.train(fit, mm.groups(table, by="g") * mm.grid(c=[1.0, 2.0, 3.0]),
                       select=("wmap", "min"), evaluate=evaluate, backend="serial",
                       progress=False)
    messages = [str(w.message) for w in caught]
    assert run.summary().statuses == {"ok": 3}
    assert any("no task reported that metric" in m for m in messages)  # as before
    if case == "too short":
        assert max(early) == 0
    else:  # warned before the second task ran, once
        calls = len(early) // 3  # (a backtest calls fit once a window)
        assert early == [0] * calls + [1] * (2 * calls)
        assert sum("the first task that trained" in m for m in messages) == 1
        assert ("it reported ['loss']" if case == "fit" else "it reported ['wmape']") in "".join(
            messages)


@pytest.mark.parametrize("argument", ["time", "target"])
def test_a_key_column_as_time_or_target_is_refused_before_any_work(argument):
    """time= the key column was taken, and every group skipped as needing
    more distinct times than its one; target= the key, scored a constant."""
    table = pd.DataFrame({"g": "a", "t": np.arange(10), "y": np.arange(10.0)})
    names = {"time": "t", "target": "y", argument: "g"}
    calls = []

    def fit(rows):
        calls.append(1)
        return _Level(1.0)

    with pytest.raises(ValueError, match=rf"evaluate: {argument}='g' is a key column"):
        mm.train(fit, mm.groups(table, by="g"), evaluate=mm.backtest(
            time=names["time"], horizon=2, windows=2, target=names["target"]),
            backend="serial", progress=False)
    assert calls == []


def test_glance_counts_every_column_of_an_unpenalised_fit_of_zeros():
    X = pd.DataFrame(np.random.default_rng(0).normal(size=(30, 2)), columns=["a", "b"])
    stats = mm.glance(LinearRegression().fit(X, np.zeros(30)), X, np.zeros(30))
    assert (stats["df"], stats["df_residual"]) == (2, 27)  # as R's lm
    y = X["a"].to_numpy() + np.random.default_rng(1).normal(scale=0.1, size=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lasso = Lasso(alpha=10.0).fit(X, y)  # every coefficient zero: the lasso's df is 0
    assert mm.glance(lasso, X, y)["df"] == 0


def test_times_of_a_zone_keep_their_zone_across_summer_time(tmp_path):
    """run.forecasts' times and cutoffs, and run.evaluation's cutoffs, are
    datetimes of the column's zone (they were text, or a fixed offset), also
    as a store reads them back and where halving joins windows."""
    table = pd.DataFrame({"sku": "a", "sales": np.arange(20.0),
                          "day": pd.date_range("2024-03-20", periods=20, tz="Europe/Amsterdam")})
    for select in (None, mm.halving("mae", eta=2)):
        source = mm.groups(table, by="sku")
        if select is not None:
            source = source * mm.grid(k=[1, 2])
        run = mm.train(lambda rows, k=1: LastValue(rows["sales"]), source, select=select,
                       evaluate=mm.backtest(time="day", horizon=3, windows=4, target="sales"),
                       store=tmp_path / f"s{select is None}", backend="serial", progress=False)
        store = mm.Store(tmp_path / f"s{select is None}")
        for forecasts in (run.forecasts, store.forecasts()):
            assert str(forecasts["time"].dtype.tz) == "Europe/Amsterdam"
            assert str(forecasts["cutoff"].dtype.tz) == "Europe/Amsterdam"
            expected = table["day"].iloc[8:].reset_index(drop=True)
            assert forecasts["time"].drop_duplicates().reset_index(drop=True).equals(
                expected.astype(forecasts["time"].dtype))
        cutoffs = run.evaluation["cutoff"]
        assert str(cutoffs.dtype.tz) == "Europe/Amsterdam"
        assert cutoffs.iloc[-1] == pd.Timestamp("2024-04-05", tz="Europe/Amsterdam")


class _Seen:
    """A model that remembers the times it was fitted on."""

    def __init__(self, times) -> None:
        self.times = list(times)

    def predict(self, X) -> np.ndarray:
        return np.zeros(len(X))


def _where_it_was_tested(model, rows) -> dict:
    return {"first_test_t": float(rows["t"].min()), "last_train_t": float(max(model.times))}


def test_an_unshuffled_holdout_tests_the_last_rows_as_scikit_learn_does():
    """holdout(shuffle=False) tested the first rows and trained on the later
    ones (on time-ordered rows: trained on the future), where scikit-learn's
    train_test_split(shuffle=False) holds out the last."""
    from sklearn.model_selection import train_test_split

    frame = pd.DataFrame({"g": "a", "t": np.arange(10), "y": np.arange(10.0)})
    splitter = mm.holdout(0.3, target="y", features=["t"], shuffle=False,
                          metrics=[_where_it_was_tested])
    run = mm.train(lambda rows: _Seen(rows["t"]), mm.groups(frame, by="g"),
                   evaluate=splitter, backend="serial", progress=False)
    train, test = train_test_split(frame["t"].to_numpy(), test_size=0.3, shuffle=False)
    row = run.evaluation.iloc[0]
    assert (row["first_test_t"], row["last_train_t"]) == (test.min(), train.max()) == (7, 6)


def test_a_score_named_like_a_key_or_a_window_column_is_kept_apart_or_refused():
    """A metric function's score named like the key column was written over
    it in run.evaluation (which window was whose was lost); one named
    n_test, window, cutoff or n_train vanished; a text score was read as a
    number. The first is renamed as run.results renames it, the others fail
    their task naming the function."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"g": ["a"] * 10 + ["c"] * 10, "x": rng.normal(size=20),
                          "y": rng.normal(size=20)})

    def named_g(model, rows):
        return {"g": float(rows["x"].mean())}

    def fit(rows):
        return LinearRegression().fit(rows[["x"]], rows["y"])

    run = mm.train(fit, mm.groups(frame, by="g"), backend="serial", progress=False,
                   evaluate=mm.kfold(2, target="y", features=["x"], metrics=["rmse", named_g]))
    assert run.evaluation["g"].tolist() == ["a", "a", "c", "c"]
    assert run.evaluation["metric_g"].notna().all() and "metric_g" in run.results
    for answer in ({"n_test": 99.0}, {"window": 1.0}, {"share": "0.5"}):
        def odd(model, rows, answer=answer):
            return answer

        run = mm.train(fit, mm.groups(frame, by="g"), backend="serial", progress=False,
                       evaluate=mm.kfold(2, target="y", features=["x"], metrics=[odd]))
        assert len(run.failed) == 2
        assert "metric function odd returned" in run.failed["error"].iloc[0]


class _MovingAverage:
    def __init__(self, history, window: int) -> None:
        self.level = float(np.asarray(history, dtype=float)[-window:].mean())

    def forecast(self, h: int) -> np.ndarray:
        return np.full(h, self.level)


@pytest.mark.parametrize("parameter", ["window", "cutoff", "time", "actual", "forecast"])
def test_a_grid_parameter_named_like_a_forecasts_column_is_kept_apart(tmp_path, parameter):
    """A grid parameter named window (a moving average's) was written over
    by the window number in run.forecasts, so its candidates could not be
    told apart, where run.evaluation named the window metric_window. Both
    keep the key column and name their own clashing column metric_<name>."""
    def fit(rows, **setting):
        return _MovingAverage(rows["y"], setting[parameter])

    run = mm.train(fit, mm.groups(_series(20).rename(columns={"sku": "g", "sales": "y"}),
                                  by="g", order_by="day") * mm.grid(**{parameter: [2, 8]}),
                   evaluate=mm.backtest(time="day", horizon=2, windows=2, target="y"),
                   select="mae", store=tmp_path / "s", backend="serial", progress=False)
    forecasts, evaluation = run.forecasts, run.evaluation
    assert forecasts[parameter].tolist() == [2] * 4 + [8] * 4
    own = {name: f"metric_{name}" if name == parameter else name
           for name in ("window", "cutoff", "time", "actual", "forecast")}
    assert forecasts[own["window"]].tolist() == [0, 0, 1, 1] * 2
    assert forecasts[own["time"]].tolist() == [16, 17, 18, 19] * 2
    assert forecasts[own["actual"]].tolist() == [16.0, 17.0, 18.0, 19.0] * 2
    assert forecasts[own["forecast"]].tolist() == [14.5, 14.5, 16.5, 16.5,
                                                   11.5, 11.5, 13.5, 13.5]
    assert forecasts[own["cutoff"]].tolist() == [15, 15, 17, 17] * 2
    if parameter in ("window", "cutoff"):
        assert evaluation[parameter].tolist() == [2, 2, 8, 8]
        assert evaluation[own[parameter]].tolist() == ([0, 1] if parameter == "window"
                                                       else [15, 17]) * 2
    assert mm.Store(tmp_path / "s").forecasts().equals(forecasts)
    assert mm.Store(tmp_path / "s").forecast(2)["day"].tolist() == [20, 21]


def _breaks_on_long_history(rows, c):
    if c == 0 and 15 <= len(rows["y"]) < 20:  # c=0 leads after window 0, then raises
        raise ValueError("c=0 breaks on long history")
    return Const(c)


@pytest.mark.parametrize("eta", [1, 2, 3])
def test_halving_brings_back_the_candidates_it_cut_when_every_survivor_raises(eta):
    """The docs say a candidate that raises leaves the race, not the group,
    which fails only when every candidate has. With eta > 1, a group whose
    one survivor raised in a later window failed, though the candidates cut
    earlier never raised. They come back, catch up on the windows they
    missed, and the race goes on: every eta picks the same winner."""
    frame = pd.DataFrame({"g": "a", "t": np.arange(20),
                          "y": np.random.default_rng(0).normal(size=20)})
    run = mm.train(_breaks_on_long_history, mm.groups(frame, by="g") * mm.grid(c=[0, 5, 10]),
                   evaluate=mm.backtest(time="t", horizon=3, windows=3, target="y",
                                        metrics=["mae"]),
                   select=mm.halving("mae", eta=eta), backend="serial", progress=False)
    assert run.results["status"].tolist() == ["ok"]
    assert run.results["best_c"].tolist() == [5]


def test_a_decimal_time_columns_cutoffs_and_forecast_times_are_numbers(tmp_path):
    """A backtest on an Arrow decimal time column kept Decimal objects in
    run.evaluation and gave the store's forecasts their repr as text
    ("Decimal('8.00')"); both are the numbers now."""
    import decimal

    import pyarrow as pa

    table = pa.table({"g": ["a"] * 12, "y": np.arange(12.0), "t": pa.array(
        [decimal.Decimal(i) for i in range(12)], pa.decimal128(10, 2))})
    run = mm.train(lambda rows: LastValue(rows["y"]), mm.groups(table, by="g"),
                   evaluate=mm.backtest(time="t", horizon=2, windows=2, target="y",
                                        metrics=["mae"]),
                   store=tmp_path / "s", backend="serial", progress=False)
    assert run.evaluation["cutoff"].tolist() == [7.0, 9.0]
    assert mm.Store(tmp_path / "s").forecasts()["time"].tolist() == [8.0, 9.0, 10.0, 11.0]


def test_a_fit_that_returns_no_model_under_evaluate_says_so():
    """A fit returning None under evaluate= failed its task with a bare
    AttributeError ('NoneType' object has no attribute 'predict')."""
    frame = pd.DataFrame({"g": "a", "x": np.arange(10.0), "y": np.arange(10.0)})
    run = mm.train(lambda rows: None, mm.groups(frame, by="g"), backend="serial",
                   evaluate=mm.kfold(2, target="y", features=["x"]), progress=False)
    assert "fit returned no model for window 0" in run.failed["error"].iloc[0]


class _Level:
    def __init__(self, c):
        self.c = c

    def forecast(self, h):
        return np.full(h, self.c)


def test_a_window_with_no_score_leaves_the_others_to_choose_by():
    """Intermittent demand with ten leading zeros: the first windows' mase is
    undefined (a constant history), and one NaN window made every
    candidate's mean NaN: select= kept the first candidate (c=100, mae 97)
    over c=3 (mae 1.8)."""
    y = np.r_[np.zeros(10), [5, 0, 3, 4, 0, 6, 2, 5, 1, 4]]
    frame = pd.DataFrame({"g": "a", "t": np.arange(20), "y": y})
    backtest = mm.backtest(time="t", horizon=1, windows=10, target="y", metrics=["mase", "mae"])
    chosen = mm.train(lambda rows, c: _Level(c), mm.groups(frame, by="g")
                      * mm.grid(c=[100.0, 3.0]), evaluate=backtest, select="mase",
                      backend="serial", progress=False)
    assert chosen.best()["c"].tolist() == [3.0]
    halved = mm.train(lambda rows, c: _Level(c), mm.groups(frame, by="g")
                      * mm.grid(c=[100.0, 3.0]), evaluate=backtest,
                      select=mm.halving("mase", eta=2), backend="serial", progress=False)
    assert halved.results["best_c"].tolist() == [3.0]
    run = mm.train(lambda rows, c: _Level(c), mm.groups(frame, by="g") * mm.grid(c=[100.0, 3.0]),
                   evaluate=backtest, backend="serial", progress=False)
    windows = run.evaluation[run.evaluation["c"] == 3.0]
    assert windows["mase"].isna().sum() == 1  # the window whose history is all zeros
    assert run.results.loc[run.results["c"] == 3.0, "mase"].item() == pytest.approx(
        windows["mase"].mean())  # (pandas' mean skips NaN, as the run's does now)


class _Scaled:
    def __init__(self, c):
        self.c = c

    def predict(self, X):
        return self.c * np.asarray(X["x"])


def test_select_by_a_score_no_window_has_says_it_chose_nothing():
    """r2 of one-row windows is undefined everywhere: select="r2" kept the
    first candidate (rmse 3.4 over 0), silently."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"g": "a", "t": np.arange(30), "x": rng.normal(size=30)})
    frame["y"] = 2 * frame["x"]
    said = r"select='r2': no candidate of 1 group\(s\) \(e.g. 'a'\) has a r2 score"
    with pytest.warns(RuntimeWarning, match=said):  # said by train, store or none
        run = mm.train(lambda rows, c: _Scaled(c), mm.groups(frame, by="g")
                       * mm.grid(c=[-5.0, 2.0]),
                       evaluate=mm.backtest(time="t", horizon=1, windows=5, target="y",
                                            features=["x"], metrics=["r2", "rmse"]),
                       select="r2", backend="serial", progress=False)
    with pytest.warns(RuntimeWarning, match=said):
        assert len(run.best()) == 1


def test_halving_by_a_score_no_window_has_says_it_chose_nothing():
    """The same under successive halving (one task a group, its candidates
    raced inside): the race kept the first candidate, and train said
    nothing (select= said it only when asked for run.best())."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"g": "a", "t": np.arange(30), "x": rng.normal(size=30)})
    frame["y"] = 2 * frame["x"]
    with pytest.warns(RuntimeWarning, match=r"select='r2': no candidate of 1 group\(s\) "):
        run = mm.train(lambda rows, c: _Scaled(c), mm.groups(frame, by="g")
                       * mm.grid(c=[-5.0, 2.0]),
                       evaluate=mm.backtest(time="t", horizon=1, windows=5, target="y",
                                            features=["x"], metrics=["r2", "rmse"]),
                       select=mm.halving("r2", eta=2), backend="serial", progress=False)
    assert run.results["best_c"].tolist() == [-5.0]  # the first: nothing chose it


def test_mase_of_a_group_with_several_rows_a_step_is_undefined_not_order_dependent():
    """Two stores' rows a day in one group: the naive differences ran from one
    store to the other (a scale of 100 where each store's is 1), and the
    score changed with the rows' order within a day."""
    days = np.repeat(np.arange(10), 2)
    frame = pd.DataFrame({"g": "a", "day": days, "store": np.tile([0, 1], 10),
                          "y": np.tile([100.0, 0.0], 10) + days})
    backtest = mm.backtest(time="day", horizon=2, windows=2, target="y",
                           metrics=["mase", "mae"])
    scores = []
    for frame_in_order in (frame, frame.sort_values(["day", "store"], ascending=[True, False])):
        run = mm.train(lambda rows: _Level(rows["y"].mean()), mm.groups(frame_in_order, by="g"),
                       evaluate=backtest, backend="serial", progress=False)
        scores.append((run.results["mase"].item(), run.results["mae"].item()))
    assert np.isnan(scores[0][0]) and np.isnan(scores[1][0])
    assert scores[0][1] == pytest.approx(scores[1][1])
    one_row_a_day = frame[frame["store"] == 0]
    run = mm.train(lambda rows: _Level(rows["y"].mean()), mm.groups(one_row_a_day, by="g"),
                   evaluate=backtest, backend="serial", progress=False)
    assert run.results["mase"].notna().all()


@pytest.mark.parametrize("times, refusal", [
    ([str(i) for i in range(1, 13)], r"whole numbers as text of different lengths \('1' to '12'"),
    (pd.date_range("2023-11-01", periods=12, freq="MS").strftime("%m/%d/%Y").tolist(),
     r"not ISO 8601 dates or times \(such as '11/01/2023'\)"),
    (pd.date_range("2023-11-01", periods=12, freq="MS").strftime("%b %Y").tolist(),
     r"not ISO 8601 dates or times \(such as 'Nov 2023'\)"),
    ([str(i) for i in range(-12, 0)], r"not ISO 8601 dates or times \(such as '-12'\)"),
    (["2024-01-05 10:00"] * 6 + ["2024-01-05T11:00"] * 6, r"different layouts"),
    (["2024-01-05T10:00+01:00"] * 6 + ["2024-01-05T10:30+02:00"] * 6, r"different UTC offsets"),
])
def test_text_times_that_sort_out_of_time_order_are_refused_before_any_work(times, refusal):
    """Text sorted as text: US dates, month names, negative numbers or weeks
    "1" to "12" trained on rows later than those they tested. Text is taken
    only where its text order is its time order (ISO 8601, one layout)."""
    table = pd.DataFrame({"g": "a", "when": times, "y": np.arange(12.0)})
    evaluate = mm.backtest(time="when", horizon=2, windows=2, target="y")
    calls = []

    def fit(rows):
        calls.append(1)
        return _Level(1.0)

    with pytest.raises(ValueError, match=rf"time column 'when' holds .*{refusal}.*to_datetime"):
        mm.train(fit, mm.groups(table, by="g"), evaluate=evaluate, backend="serial",
                 progress=False)
    assert calls == []
    # a group read on its worker is checked there: its task fails, naming the column
    with pytest.raises(ValueError, match=rf"time column 'when' holds .*{refusal}"):
        evaluate.prepare({"when": np.array(times, dtype=object), "y": np.arange(12.0)})


@pytest.mark.parametrize("times", [
    pd.date_range("2024-01-01", periods=12).strftime("%Y-%m-%d").tolist(),
    pd.date_range("2024-01-01", periods=12, freq="h").strftime("%Y-%m-%dT%H:%M:%S").tolist(),
    pd.date_range("2024-01", periods=12, freq="MS").strftime("%Y-%m").tolist(),
    [f"{i:03d}" for i in range(1, 13)],
])
def test_text_times_whose_text_order_is_time_order_are_taken(times):
    frame = pd.DataFrame({"g": "a", "when": times, "y": np.arange(12.0)})
    run = mm.train(lambda rows: _Level(1.0), mm.groups(frame, by="g"),
                   evaluate=mm.backtest(time="when", horizon=2, windows=2, target="y"),
                   backend="serial", progress=False)
    cutoffs = [str(cutoff).replace(" ", "T") for cutoff in run.evaluation["cutoff"]]
    assert cutoffs == [times[7], times[9]]


def test_a_time_column_of_dates_comes_back_as_dates(tmp_path):
    """datetime.date times came back as ISO text in run.forecasts (time and
    cutoff) and run.evaluation (cutoff): merging back on the input matched
    no row."""
    import datetime

    days = [datetime.date(2024, 1, day) for day in range(1, 11)]
    frame = pd.DataFrame({"g": "a", "d": days, "y": np.arange(10.0)})
    run = mm.train(lambda rows: LastValue(rows["y"]), mm.groups(frame, by="g"),
                   evaluate=mm.backtest(time="d", horizon=2, windows=2, target="y"),
                   store=tmp_path / "s", backend="serial", progress=False)
    for forecasts in (run.forecasts, mm.Store(tmp_path / "s").forecasts()):
        assert forecasts["time"].tolist() == days[6:]
        assert forecasts["cutoff"].tolist() == [days[5]] * 2 + [days[7]] * 2
        assert len(forecasts.merge(frame, left_on=["g", "time"], right_on=["g", "d"])) == 4
    assert run.evaluation["cutoff"].tolist() == [days[5], days[7]]
    assert mm.Store(tmp_path / "s").forecast(2)["d"].dt.date.tolist() == [
        datetime.date(2024, 1, 11), datetime.date(2024, 1, 12)]


def test_date_cutoffs_are_dates_without_the_forecasts_too(tmp_path):
    """With forecasts=False (no forecast rows to tell the times' type by), a
    date column's cutoffs came back as ISO text in run.evaluation and
    Store.evaluation; a text time column's stay text."""
    import datetime

    days = [datetime.date(2024, 1, day) for day in range(1, 11)]
    for times, cutoffs in ((days, [days[5], days[7]]),
                           ([day.isoformat() for day in days], ["2024-01-06", "2024-01-08"])):
        frame = pd.DataFrame({"g": "a", "d": times, "y": np.arange(10.0)})
        store = tmp_path / str(type(times[0]).__name__)
        run = mm.train(lambda rows: LastValue(rows["y"]), mm.groups(frame, by="g"),
                       evaluate=mm.backtest(time="d", horizon=2, windows=2, target="y",
                                            forecasts=False),
                       store=store, backend="serial", progress=False)
        for evaluation in (run.evaluation, mm.Store(store).evaluation()):
            assert evaluation["cutoff"].tolist() == cutoffs
            assert "cutoff_dates" not in evaluation.columns


@pytest.mark.parametrize("times", [
    pd.date_range("2024-01-01", periods=10, freq="h").strftime("%Y-%m-%dT%H:%M:%S").tolist(),
    list(range(10)), [float(i) for i in range(10)]])
@pytest.mark.parametrize("forecasts", [True, False])
def test_cutoffs_are_of_the_time_columns_type(tmp_path, times, forecasts):
    """ISO date-and-time text cutoffs came back as Timestamps while the time
    column stayed text (a merge on time = cutoff matched nothing); whole
    number cutoffs were of object dtype in run.forecasts."""
    frame = pd.DataFrame({"g": "a", "t": times, "y": np.arange(10.0)})
    store = tmp_path / "s"
    run = mm.train(lambda rows: LastValue(rows["y"]), mm.groups(frame, by="g"),
                   evaluate=mm.backtest(time="t", horizon=2, windows=2, target="y",
                                        forecasts=forecasts),
                   store=store, backend="serial", progress=False)
    kind = pd.Series(times).dtype
    for evaluation in (run.evaluation, mm.Store(store).evaluation()):
        assert evaluation["cutoff"].tolist() == [times[5], times[7]]
        assert evaluation["cutoff"].dtype == kind
    for table in (run.forecasts, mm.Store(store).forecasts()) if forecasts else ():
        assert table["cutoff"].tolist() == [times[5]] * 2 + [times[7]] * 2
        assert table["cutoff"].dtype == table["time"].dtype == kind
        assert len(table.merge(frame, left_on="cutoff", right_on="t")) == 4


def test_a_holdout_that_leaves_no_training_row_says_so():
    """holdout(0.9) of 9 rows said it "needs at least 2 rows, has 9"."""
    run = mm.train(lambda rows: _Level(1.0), mm.groups(pd.DataFrame(
        {"g": "a", "y": np.arange(9.0), "x": 1.0}), by="g"),
        evaluate=mm.holdout(0.9, target="y"), backend="serial", progress=False)
    assert run.results["eval_skipped"].tolist() == [
        "a holdout of 0.9 of 9 rows tests 9 (rounded up) and leaves 0 to train on"]


class FailsLast:
    """Perfect on every window but the last, where it forecasts NaN and then 1e6."""

    def __init__(self, history) -> None:
        self.last, self.seen = float(np.asarray(history)[-1]), len(history)

    def forecast(self, h: int) -> np.ndarray:
        if self.seen == 10:
            return np.array([np.nan, 1e6])
        return self.last + np.arange(1.0, h + 1)


@pytest.mark.parametrize("select", ["rmse", ("r2", "max")])
def test_a_candidate_that_forecasts_nan_on_a_window_ranks_last(select):
    """A NaN forecast left that window out of the candidate's mean, which
    then scored 0 and won over the one that forecast every window."""
    frame = pd.DataFrame({"g": "a", "t": np.arange(12), "y": np.arange(12.0)})
    run = mm.train(lambda rows, model: model(rows["y"].to_numpy()),
                   mm.groups(frame, by="g") * mm.grid(model=[LastValue, FailsLast]),
                   evaluate=mm.backtest(time="t", horizon=2, windows=3, target="y",
                                        metrics=["rmse", "r2"]),
                   select=select, backend="serial", progress=False)
    assert run.best()["model"].tolist() == [LastValue]
    failed = run.results[run.results["model"] == FailsLast].iloc[0]
    assert np.isnan(failed["rmse"]) and np.isnan(failed["r2"])
    windows = run.evaluation[run.evaluation["model"] == FailsLast]
    assert windows["rmse"].tolist()[:2] == [0.0, 0.0] and np.isnan(windows["rmse"].iloc[2])


def test_a_test_row_whose_actual_is_missing_is_not_scored():
    """One missing actual made its whole window's scores NaN, left out of the
    mean: the window's other rows counted for nothing."""
    frame = _series(12)
    frame.loc[10, "sales"] = np.nan
    run = mm.train(lambda rows: LastValue(rows["sales"]), mm.groups(frame, by="sku"),
                   evaluate=mm.backtest(time="day", horizon=2, windows=3, target="sales",
                                        metrics=["mae", "r2"]),
                   backend="serial", progress=False)
    # windows test days 6-7, 8-9, 10-11 after last values 5, 7 and 9; day 10 has no actual
    assert run.evaluation["mae"].tolist() == [1.5, 1.5, 2.0]
    assert run.evaluation["r2"].iloc[:2].tolist() == [-9.0, -9.0]
    assert np.isnan(run.evaluation["r2"].iloc[2])  # r2 of one row: undefined, left out
    assert run.results["mae"].iloc[0] == pytest.approx(5 / 3)
    assert run.results["r2"].iloc[0] == -9.0


def test_a_gap_in_the_training_target_leaves_mase_its_other_steps():
    """One missing value in a history made its naive scale NaN, so every
    later window's mase was undefined and select='mase' chose nothing."""
    frame = _series(12)
    frame["sales"] = [1.0, 3, 4, np.nan, 8, 9, 11, 12, 14, 15, 17, 18]
    history = frame["sales"]
    run = mm.train(lambda rows: Const(10.0), mm.groups(frame, by="sku"),
                   evaluate=mm.backtest(time="day", horizon=2, windows=2, target="sales",
                                        metrics=["mae", "mase"]),
                   backend="serial", progress=False)
    for window, cutoff in enumerate((7, 9)):  # pandas' mean skips the gap's differences
        scale = history[:cutoff + 1].diff().abs().mean()
        test = history[cutoff + 1:cutoff + 3]
        expected = (test - 10.0).abs().mean() / scale
        assert run.evaluation["mase"].iloc[window] == pytest.approx(expected)
    assert np.isnan(mase([1.0], [2.0], [np.nan, 1.0, np.nan]))  # no pair of neighbours known
    assert mase([1.0], [2.0], [1.0, np.nan, 2.0, 4.0]) == 0.5


@pytest.mark.parametrize("order", [["A", "B", "C"], ["C", "B", "A"]])
def test_halving_breaks_a_tie_by_a_fixed_order_of_the_settings_not_the_grids(order):
    """A tie went to the grid's first setting, so the same grid reordered
    chose another winner (and a store retrained every group). It goes to
    the setting whose values sort first, not to the one ranked first at the
    cut before (B, better on the first window)."""
    errors = {"A": (2.0, 0.0), "B": (1.0, 1.0), "C": (3.0, 3.0)}  # A and B: a mean of 1

    def fit(rows, v):
        return Const(10.0 + errors[v][0 if len(rows) == 8 else 1])

    frame = _series(12).assign(sales=10.0)
    run = mm.train(fit, mm.groups(frame, by="sku") * mm.grid(v=order),
                   evaluate=mm.backtest(time="day", horizon=2, windows=2, target="sales",
                                        metrics=["mae"]),
                   select=mm.halving("mae", eta=2), backend="serial", progress=False)
    assert run.results["best_v"].tolist() == ["A"]  # (its values sort first)
    assert run.results["mae"].tolist() == [1.0]


@pytest.mark.parametrize("values", [["A", "B", "C"], [0.5, 2, float("nan")],
                                    [("x", 1), None, Lasso(alpha=2.0)]])
def test_halving_of_a_reordered_grid_reuses_every_group(tmp_path, values):
    """The search's identity hashed its settings in the grid's order: the
    same grid reordered retrained every group (and could choose another
    winner in a tie). Now it reuses them, with the same winners."""
    calls: list[str] = []

    def fit(rows, v):
        calls.append(v)
        return Const(10.0)

    frame = _series(12).assign(sales=10.0)
    evaluate = mm.backtest(time="day", horizon=2, windows=2, target="sales", metrics=["mae"])
    winners = []
    for order in (values, values[::-1]):
        calls.clear()
        run = mm.train(fit, mm.groups(frame, by="sku") * mm.grid(v=order), evaluate=evaluate,
                       select=mm.halving("mae", eta=2), store=tmp_path / "s",
                       backend="serial", progress=False)
        winners.append([str(v) for v in run.results["best_v"]])  # (reused: its text)
    assert calls == [] and run.results["reused"].tolist() == [True]
    assert winners[0] == winners[1]


def test_a_grid_cost_under_halving_is_refused_naming_it():
    """grid(cost=) was silently ignored (even one that raises): a halving
    runs a group's candidates in one task, which no setting's cost orders."""
    fitted = []
    with pytest.raises(ValueError, match=r"grid\(cost=...\) .* select=mm.halving"):
        mm.train(lambda rows, v: fitted.append(v) or Const(v),
                 mm.groups(_series(12), by="sku") * mm.grid(v=[1.0, 2.0], cost=lambda s: 1 / 0),
                 evaluate=mm.backtest(time="day", horizon=2, windows=2, target="sales"),
                 select=mm.halving("mae"), backend="serial", progress=False)
    assert fitted == []


@pytest.mark.parametrize("clash", ["parameter", "by"])
def test_select_naming_a_key_column_is_refused_before_any_work(tmp_path, clash):
    """A grid parameter named rmse with select="rmse": run.results kept the
    parameter under "rmse" and the score as metric_rmse, and the winners
    were chosen by the parameter's values (or none, for text ones, with a
    warning that no candidate had a score). Refused before any work."""
    frame = _series(12).rename(columns={"sku": "g", "sales": "y"})
    fitted = []

    def fit(rows, rmse):
        fitted.append(rmse)
        return Const(rmse)

    if clash == "parameter":
        source = mm.groups(frame, by="g") * mm.grid(rmse=[0.0, 100.0])
    else:
        source = mm.groups(frame.rename(columns={"g": "rmse"}), by="rmse") * mm.grid(c=[1.0])
        fit = lambda rows, c: Const(c)  # noqa: E731
    with pytest.raises(ValueError, match=r"select='rmse' names a key column too"):
        mm.train(fit, source, evaluate=mm.backtest(time="day", horizon=2, windows=2, target="y"),
                 select="rmse", store=tmp_path / "s", backend="serial", progress=False)
    assert fitted == [] and not (tmp_path / "s").exists()


@pytest.mark.parametrize("eta", [1, 2])
def test_halving_retries_a_candidates_transient_error_as_retry_on_says(eta):
    """retries= with retry_on=ConnectionError: under halving, the best
    candidate's one passing ConnectionError dropped it from the race (a
    candidate's failure), and the worse one won, never retried. The
    group's task is retried, as select="mae"'s task is."""
    calls: list[float] = []

    def flaky_best(rows, c):
        calls.append(c)
        if c == 9.0 and calls.count(c) == 1:
            raise ConnectionError("a passing fault")
        return Const(c)

    frame = _series(12).rename(columns={"sku": "g", "sales": "y"})
    frame["y"] = 9.0
    run = mm.train(flaky_best, mm.groups(frame, by="g") * mm.grid(c=[0.0, 9.0]),
                   evaluate=mm.backtest(time="day", horizon=2, windows=2, target="y",
                                        metrics=["mae"]),
                   select=mm.halving("mae", eta=eta), retries=1, retry_on=ConnectionError,
                   backend="serial", progress=False)
    assert run.results["best_c"].tolist() == [9.0]
    assert run.results["attempts"].tolist() == [2]
    assert "candidates_failed" not in run.results


@pytest.mark.parametrize("splitter", [
    lambda **kw: mm.holdout(0.25, **kw), lambda **kw: mm.kfold(3, **kw),
    lambda **kw: mm.backtest("t", horizon=1, windows=2, **kw)])
def test_features_naming_a_column_twice_or_the_target_are_refused_when_made(splitter):
    """Both were accepted: a column twice went to the model twice, and the
    target among the features gave the model the answer it was scored on
    (a perfect score, no word)."""
    with pytest.raises(ValueError, match="features names the column 'x' twice"):
        splitter(target="y", features=["x", "x"])
    with pytest.raises(ValueError, match="features names the target 'y'"):
        splitter(target="y", features=["x", "y"])


def test_features_naming_a_key_column_is_refused_before_any_work():
    """features= naming a by column was accepted (the splitter is made before
    it knows the groups): one value a group, which no model learns from."""
    frame = _series(12).assign(region="n", x=1.0)
    fitted = []
    with pytest.raises(ValueError, match=r"features names 'region', a key column of the "
                                         r"groups \(by=\['sku', 'region'\]\)"):
        mm.train(lambda rows: fitted.append(1) or Const(1.0),
                 mm.groups(frame, by=["sku", "region"]),
                 evaluate=mm.holdout(0.25, target="sales", features=["x", "region"]),
                 backend="serial", progress=False)
    assert fitted == []


@pytest.mark.parametrize("fmt", ["pandas", "numpy"])
def test_a_model_that_needs_features_given_none_says_features(fmt):
    """features=[] with a model fitted on a column: each task failed with
    scikit-learn's "at least one array or dtype is required", naming
    neither features= nor the way out. A model that predicts from no
    column (a constant) still scores."""
    frame = _series(12).assign(x=np.arange(12.0))

    def fit(rows):
        return LinearRegression().fit(np.column_stack([rows["x"]]), rows["sales"])

    for splitter in (mm.holdout(0.25, target="sales", features=[]),
                     mm.backtest("day", horizon=2, windows=2, target="sales", features=[])):
        run = mm.train(fit, mm.groups(frame, by="sku", format=fmt), evaluate=splitter,
                       backend="serial", progress=False)
        assert run.results["status"].tolist() == ["failed"]
        assert "given no feature column: evaluate= has none (features=[])" in \
            run.results["error"].iloc[0]
    run = mm.train(lambda rows: Const(5.0), mm.groups(frame, by="sku", format=fmt),
                   evaluate=mm.holdout(0.25, target="sales", features=[]), backend="serial",
                   progress=False)
    assert run.results["status"].tolist() == ["ok"]


class Labels:
    """A classifier of a fixed probability of class 1, whatever the rows."""

    classes_ = np.array([0.0, 1.0])

    def predict(self, X) -> np.ndarray:
        return np.ones(len(X))

    def predict_proba(self, X) -> np.ndarray:
        return np.tile([0.2, 0.8], (len(X), 1))


def test_log_loss_leaves_out_a_test_row_whose_actual_is_missing():
    """A missing actual matched none of the model's classes: it was scored as
    probability 1e-15, a loss of 34.5 in the window's mean (14 for 2 of 5
    rows), where every other metric leaves the row out."""
    frame = pd.DataFrame({"g": "a", "t": np.arange(12), "x": 0.0,
                          "y": [0.0, 1.0] * 4 + [1.0, np.nan, 0.0, np.nan]})
    run = mm.train(lambda rows: Labels(), mm.groups(frame, by="g"),
                   evaluate=mm.backtest(time="t", horizon=2, windows=2, target="y",
                                        metrics=["log_loss", "accuracy"]),
                   backend="serial", progress=False)
    # window 0 tests days 8-9 (actuals 1, missing), window 1 days 10-11 (0, missing)
    assert run.evaluation["log_loss"].tolist() == pytest.approx([-np.log(0.8), -np.log(0.2)])
    assert run.evaluation["accuracy"].tolist() == [1.0, 0.0]
    assert run.results["log_loss"].iloc[0] == pytest.approx(-(np.log(0.8) + np.log(0.2)) / 2)
    frame["y"] = [0.0, 1.0] * 4 + [np.nan] * 4  # no actual at all: undefined, left out
    run = mm.train(lambda rows: Labels(), mm.groups(frame, by="g"),
                   evaluate=mm.backtest(time="t", horizon=2, windows=2, target="y",
                                        metrics=["log_loss"]),
                   backend="serial", progress=False)
    assert run.evaluation["log_loss"].isna().all() and np.isnan(run.results["log_loss"].iloc[0])


class _NoAnswer:
    def predict(self, X) -> np.ndarray:
        return np.full(len(X), np.nan)


def test_a_nan_prediction_scores_nan_by_f1_as_by_every_metric():
    """f1 and balanced_accuracy (scikit-learn's) raised "Input y_pred contains
    NaN": the group failed, where rmse or accuracy score the window."""
    table = pd.DataFrame({"g": "a", "x": np.arange(12.0), "y": np.arange(12) % 2})
    run = mm.train(lambda rows: _NoAnswer(), mm.groups(table, by="g"),
                   evaluate=mm.kfold(3, target="y", metrics=["f1", "balanced_accuracy",
                                                            "accuracy"]),
                   backend="serial", progress=False)
    assert run.results["status"].tolist() == ["ok"]
    assert run.evaluation[["f1", "balanced_accuracy", "accuracy"]].isna().all().all()


def test_the_backtest_bench_times_manymodels_alone_without_statsforecast(tmp_path):
    """``bench/backtest_bench.py`` without statsforecast (``--no-statsforecast``,
    or an environment that cannot be made: offline) runs manymodels alone and
    says so; it stopped on a pip traceback, with nothing timed."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, str(root / "bench" / "backtest_bench.py"), "--no-statsforecast",
         "--series", "2", "--days", "90", "--repeat", "1", "--cores", "1",
         "--formats", "numpy", "--manymodels-src", str(root / "src"), "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "not compared (no statsforecast)" in done.stdout
    results = json.loads(out.read_text())
    assert results["statsforecast"] is None
    assert results["manymodels"]["numpy"]["max_metric_difference"] is None
