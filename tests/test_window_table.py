"""A task's windows travel as one table of columns (evaluation/windowtable.py):
the evaluation and forecast tables read it, successive halving joins one a
window, and a store written with the earlier format (a list of one record a
window, each with its own packed rows) still reads the same."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from sklearn.linear_model import Ridge

import manymodels as mm
from manymodels.evaluation.splitters import WINDOWS
from manymodels.evaluation.tables import forecast_frame, window_frame
from manymodels.evaluation.windowrows import pack_column
from manymodels.evaluation.windowtable import as_table, mean_scores, unpack_column
from test_evaluation import daily, fit_candidate


def _as_earlier_format(table: dict) -> list[dict]:
    """What a task kept before: one record a window, its rows packed alone."""
    records, start = [], 0
    rows = {name: unpack_column(table["rows"][name]) for name in ("time", "actual", "forecast")}
    for i, size in enumerate(table["n_test"]):
        record = {name: values[i] for name, values in table.items() if name != "rows"}
        record["rows"] = {name: pack_column(values[start:start + size])
                          for name, values in rows.items()}
        records.append(record)
        start += size
    return records


def test_a_task_reports_its_windows_as_one_table_that_the_tables_read():
    frame = daily()
    run = mm.train(fit_candidate, mm.groups(frame, by="sku") * mm.grid(model=[Ridge(1.0)]),
                   backend="serial", progress=False,
                   evaluate=mm.backtest("date", horizon=4, windows=3, target="sales",
                                        features=["x"], metrics=["mae", "rmse"]))
    table = run._records.metrics[0][WINDOWS]  # what the task reported
    assert isinstance(table, dict) and table["window"] == [0, 1, 2]
    assert table["n_test"] == [4, 4, 4] and len(unpack_column(table["rows"]["forecast"])) == 12
    assert mean_scores(table)["mae"] == np.mean(table["mae"])
    evaluation, forecasts = run.evaluation, run.forecasts
    assert len(evaluation) == 3 * 3 and len(forecasts) == 3 * 12
    one = forecasts[(forecasts["sku"] == "s1") & (forecasts["window"] == 2)]
    errors = (one["actual"] - one["forecast"]).abs()
    scored = evaluation[(evaluation["sku"] == "s1") & (evaluation["window"] == 2)]
    assert np.isclose(errors.mean(), scored["mae"].iloc[0])


def test_a_stores_earlier_list_of_window_records_reads_the_same(tmp_path):
    frame = daily()
    run = mm.train(fit_candidate, mm.groups(frame, by="sku") * mm.grid(model=[Ridge(1.0)]),
                   backend="serial", progress=False,
                   evaluate=mm.backtest("date", horizon=4, windows=3, target="sales",
                                        features=["x"], metrics=["mae", "rmse"]))
    columns, keys = run._plan.key_columns, run._plan.key_rows
    tables = [metrics[WINDOWS] for metrics in run._records.metrics]
    now = [{WINDOWS: table} for table in tables]
    # as a reused task's store JSON holds them, in the earlier format
    before = [json.dumps({WINDOWS: _as_earlier_format(table)}) for table in tables]
    assert isinstance(as_table(json.loads(before[0])[WINDOWS]), dict)
    pd.testing.assert_frame_equal(window_frame(columns, keys, before),
                                  window_frame(columns, keys, now))
    pd.testing.assert_frame_equal(forecast_frame(columns, keys, before),
                                  forecast_frame(columns, keys, now))
    assert len(forecast_frame(columns, keys, before)) == 3 * 12


def test_halving_joins_the_winners_windows_and_forecasts_one_window_at_a_time():
    frame = daily()
    alphas = [0.01, 1.0, 1e4]
    source = mm.groups(frame, by="sku") * mm.grid(model=[Ridge(alpha=a) for a in alphas])
    splitter = mm.backtest("date", horizon=4, windows=3, target="sales", features=["x"])
    full = mm.train(fit_candidate, source, backend="serial", progress=False,
                    evaluate=splitter)
    halved = mm.train(fit_candidate, source, backend="serial", progress=False,
                      evaluate=splitter, select=mm.halving("rmse", eta=2))
    best = halved.best().set_index("sku")
    for sku in ("s0", "s1", "s2"):
        alpha = best.loc[sku, "best_model"].alpha
        alphas_run = full.results["model"].map(lambda m: m.alpha)
        won = full.results[(full.results["sku"] == sku) & (alphas_run == alpha)]
        theirs = full.forecasts[(full.forecasts["sku"] == sku)
                                & (full.forecasts["model"].map(lambda m: m.alpha) == alpha)]
        ours = halved.forecasts[halved.forecasts["sku"] == sku]
        assert len(ours) == 12 and list(ours["window"]) == [0] * 4 + [1] * 4 + [2] * 4
        assert np.allclose(ours["forecast"], theirs["forecast"])
        assert np.array_equal(ours["time"].to_numpy(), theirs["time"].to_numpy())
        assert np.isclose(best.loc[sku, "rmse"], won["rmse"].iloc[0])


def test_the_scores_come_in_the_order_the_metrics_were_asked_for():
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(5)
    frame = pd.DataFrame({"g": np.repeat(["a", "b"], 40), "x": rng.normal(size=80)})
    frame["label"] = (frame["x"] + rng.normal(scale=0.5, size=80) > 0).astype(int)
    run = mm.train(lambda df: LogisticRegression().fit(df[["x"]], df["label"]),
                   mm.groups(frame, by="g"), backend="serial", progress=False,
                   evaluate=mm.kfold(3, target="label", features=["x"],
                                     metrics=["log_loss", "accuracy"]))
    columns = list(run.evaluation.columns)
    assert columns.index("log_loss") < columns.index("accuracy")
    results = list(run.results.columns)
    assert results.index("log_loss") < results.index("accuracy")
