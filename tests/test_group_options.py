"""What users of the closest peers rely on: rows in time order within a group
(``order_by``), reading only the columns a fit needs (``columns``), ``fit``
told its group's key (``key=``), and failed groups named in a transform's
result, or replaced by a fallback (``map_groups(errors="skip", fallback=)``)."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sklearn.linear_model import LinearRegression

import manymodels as mm
from conftest import BACKENDS


@pytest.fixture
def series() -> pd.DataFrame:
    """Three series of 40 days each, y a random walk, rows shuffled."""
    rng = np.random.default_rng(7)
    frames = []
    for sku in ("a", "b", "c"):
        days = pd.date_range("2024-01-01", periods=40, freq="D")
        frames.append(pd.DataFrame({"sku": sku, "date": days, "promo": rng.integers(0, 2, 40),
                                    "y": np.cumsum(rng.normal(size=40)),
                                    "noise": rng.normal(size=40)}))
    ordered = pd.concat(frames, ignore_index=True)
    return ordered.sample(frac=1.0, random_state=3).reset_index(drop=True)


def last_value_forecast(df):
    """A naive forecast: order-sensitive, as every time-series model is."""
    return {"forecast": float(df["y"].iloc[-1]), "first_day": str(df["date"].iloc[0].date()),
            "days_sorted": bool(df["date"].is_monotonic_increasing)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_order_by_sorts_each_groups_rows_whatever_the_input_order(series, backend):
    run = mm.train(last_value_forecast, mm.groups(series, by="sku", order_by="date"),
                   backend=backend, workers=2, progress=False)
    assert run.results["days_sorted"].all()
    expected = series.sort_values(["sku", "date"]).groupby("sku")["y"].last()
    np.testing.assert_allclose(run.results["forecast"], expected.to_numpy())
    assert (run.results["first_day"] == "2024-01-01").all()
    # without order_by, the shuffled input order reaches fit (the old behaviour)
    unordered = mm.train(last_value_forecast, mm.groups(series, by="sku"), backend="serial",
                         progress=False)
    assert not unordered.results["days_sorted"].any()


def test_order_by_several_columns_is_stable_and_puts_missing_values_last():
    df = pd.DataFrame({"g": [1, 1, 1, 1, 1, 2, 2], "a": [2.0, 1.0, np.nan, 1.0, 2.0, 5.0, 4.0],
                       "b": [0, 9, 0, 3, 0, 0, 0], "row": range(7)})
    rows = mm.train(lambda d: {"rows": list(d["row"])}, mm.groups(df, by="g", order_by=["a", "b"]),
                    backend="serial", progress=False).results["rows"]
    # g=1: a=1 (b 3 then 9), a=2 (rows 0 and 4 tie: input order), NaN last
    assert rows.tolist() == [[3, 1, 0, 4, 2], [6, 5]]


def test_order_by_on_files_read_on_workers_and_in_map_groups(series, tmp_path):
    path = tmp_path / "series.parquet"
    pq.write_table(pa.Table.from_pandas(series, preserve_index=False), path, row_group_size=30)
    for source in (mm.groups(path, by="sku", order_by="date"),
                   mm.groups(path, by="sku", order_by="date", read_on_workers=True)):
        run = mm.train(last_value_forecast, source, workers=2, progress=False)
        assert run.results["days_sorted"].all() and len(run.results) == 3
    # a transform of ordered groups comes back in the input's row order
    running = mm.map_groups(lambda d: d.assign(total=d["y"].cumsum()),
                            mm.groups(series, by="sku", order_by="date"), backend="threads")
    expected = series.sort_values("date").groupby("sku")["y"].cumsum()
    np.testing.assert_allclose(running["total"], expected.sort_index())
    pd.testing.assert_index_equal(running.index, series.index)


def test_order_by_changes_the_data_identity_only_when_it_changes_the_rows(series, tmp_path):
    store = tmp_path / "store"
    mm.train(last_value_forecast, mm.groups(series, by="sku", order_by="date"), store=store,
             backend="serial", progress=False)
    again = mm.train(last_value_forecast, mm.groups(series, by="sku", order_by="date"),
                     store=store, backend="serial", progress=False)
    assert again.results["reused"].all()
    reshuffled = series.sample(frac=1.0, random_state=11)  # same rows, same order once sorted
    assert mm.train(last_value_forecast, mm.groups(reshuffled, by="sku", order_by="date"),
                    store=store, backend="serial", progress=False).results["reused"].all()
    unordered = mm.train(last_value_forecast, mm.groups(series, by="sku"), store=store,
                         backend="serial", progress=False)
    assert not unordered.results["reused"].any()  # fit sees other rows first: other data
    path = tmp_path / "series.parquet"  # read on workers: the files, plus how they are read
    series.to_parquet(path, index=False)
    for options in ({}, {"order_by": "date"}, {"order_by": "date", "columns": ["y"]}):
        source = mm.groups(path, by="sku", read_on_workers=True, **options)
        first = mm.train(width, source, store=store, backend="serial", progress=False)
        assert not first.results["reused"].any(), options
        again = mm.train(width, source, store=store, backend="serial", progress=False)
        assert again.results["reused"].all(), options


def test_bad_order_by_and_columns_are_named_before_work(series, tmp_path):
    with pytest.raises(ValueError, match="order_by column 'day' is not in the table"):
        mm.groups(series, by="sku", order_by="day")
    with pytest.raises(ValueError, match="order_by column 'sku' is also a by column"):
        mm.groups(series, by="sku", order_by=["date", "sku"])
    with pytest.raises(ValueError, match="column 'price' is not in the table"):
        mm.groups(series, by="sku", columns=["y", "price"])
    path = tmp_path / "s.parquet"
    series.to_parquet(path)
    with pytest.raises(ValueError, match="column 'price' is not in .*s.parquet"):
        mm.groups(path, by="sku", columns=["price"])
    with pytest.raises(ValueError, match="order_by column 'day' is not in the Parquet files"):
        mm.groups(path, by="sku", order_by="day", read_on_workers=True)


def width(df):
    return {"columns": ",".join(df.columns)}


@pytest.mark.parametrize("kind", ["parquet", "csv", "lazy", "frame", "arrow"])
def test_columns_reads_only_those_plus_the_key_and_order_columns(series, tmp_path, kind):
    table = {"frame": series, "arrow": pa.Table.from_pandas(series, preserve_index=False)}.get(
        kind, tmp_path / ("s.csv" if kind == "csv" else "s.parquet"))
    if kind == "csv":
        series.to_csv(table, index=False)
    elif kind in ("parquet", "lazy"):
        series.to_parquet(table, index=False)
    source = mm.groups(table, by="sku", order_by="date", columns=["y"],
                       read_on_workers=kind == "lazy")
    run = mm.train(width, source, backend="serial", progress=False)
    assert (run.results["columns"] == "sku,date,y").all()  # the table's order, nothing else
    if kind != "lazy":
        assert source.table.column_names == ["sku", "date", "y"]


def keyed_fit(df, key):
    return {"seen": repr(key), "rows": len(df)}


def keyed_fit_with_alpha(df, alpha, *, key):
    return {"seen": repr(key), "rows": len(df) * alpha}


@pytest.mark.parametrize("backend", BACKENDS)
def test_fit_may_ask_for_its_group_key(series, backend):
    run = mm.train(keyed_fit, mm.groups(series, by="sku"), backend=backend, workers=2,
                   progress=False)
    assert run.results["seen"].tolist() == ["'a'", "'b'", "'c'"]
    pair = mm.groups(series.assign(region=series["sku"] > "a"), by=["region", "sku"])
    run = mm.train(keyed_fit_with_alpha, pair * mm.grid(alpha=[1]), backend=backend, workers=2,
                   progress=False)
    assert run.results["seen"].tolist() == ["(False, 'a')", "(True, 'b')", "(True, 'c')"]


def test_a_key_named_by_a_grid_or_shared_is_refused_and_fit_without_key_gets_none(series):
    """A grid parameter or shared object named key beside fit's key= would
    take the task key's place: refused, by name, before any work."""
    source = mm.groups(series, by="sku")
    with pytest.raises(ValueError, match="shared name 'key' is also the keyword"):
        mm.train(keyed_fit, source, shared={"key": "mine"}, backend="serial", progress=False)
    with pytest.raises(ValueError, match="grid parameter 'key' is also the keyword"):
        mm.train(keyed_fit, source * mm.grid(key=[7]), backend="serial", progress=False)
    run = mm.train(lambda df, **kwargs: {"n": kwargs["key"]}, source * mm.grid(key=[7]),
                   backend="serial", progress=False)
    assert (run.results["n"] == 7).all()  # a **kwargs fit asks for no task key
    run = mm.train(lambda df, **kwargs: {"n": len(kwargs)}, source, backend="serial",
                   progress=False)
    assert (run.results["n"] == 0).all()  # a catch-all **kwargs is not asked for key=
    items = mm.train(lambda path, key: {"k": key}, mm.items(["x.csv", "y.csv"]),
                     backend="serial", progress=False)
    assert items.results["k"].tolist() == ["x.csv", "y.csv"]


def fit_or_fail(df):
    if df["sku"].iloc[0] == "b":
        raise ValueError("too short a series for sku b")
    return pd.DataFrame({"forecast": [df["y"].iloc[-1]]})


def mean_forecast(df):
    return pd.DataFrame({"forecast": [df["y"].mean()]})


def test_map_groups_skip_names_the_failed_groups_and_why(series):
    with pytest.warns(RuntimeWarning, match=r"1 group\(s\) failed.*'b'.*too short a series"):
        result = mm.map_groups(fit_or_fail, mm.groups(series, by="sku", order_by="date"),
                               errors="skip", backend="serial")
    assert result["sku"].tolist() == ["a", "c"]
    assert list(result.attrs["failed"]) == ["b"]
    assert "ValueError: too short a series for sku b" in result.attrs["failed"]["b"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_groups_fallback_replaces_a_failed_groups_output(series, backend):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every group has an output: no warning
        result = mm.map_groups(fit_or_fail, mm.groups(series, by="sku", order_by="date"),
                               fallback=mean_forecast, backend=backend, workers=2)
    ordered = series.sort_values("date")
    assert result["sku"].tolist() == ["a", "b", "c"]
    assert result["forecast"].iloc[1] == pytest.approx(ordered[ordered.sku == "b"]["y"].mean())
    assert result["forecast"].iloc[0] == pytest.approx(ordered[ordered.sku == "a"]["y"].iloc[-1])
    assert list(result.attrs["fallback"]) == ["b"]
    assert "too short a series" in result.attrs["fallback"]["b"]
    assert result.attrs["failed"] == {}


def test_map_groups_fallback_that_fails_too_follows_errors(series):
    def broken(df):
        raise KeyError("no fallback either")

    with pytest.raises(RuntimeError,
                       match="(?s)map_groups: 1 task.*'b'.*too short.*no fallback either"):
        mm.map_groups(fit_or_fail, mm.groups(series, by="sku"), fallback=broken,
                      backend="serial")
    with pytest.raises(TypeError, match="fallback must be a function"):
        mm.map_groups(fit_or_fail, mm.groups(series, by="sku"), fallback="mean")


def test_fit_with_key_on_lightgbm_per_group(series):
    lightgbm = pytest.importorskip("lightgbm")

    def fit(df, key):
        model = lightgbm.LGBMRegressor(n_estimators=5, min_child_samples=2, verbose=-1)
        model.fit(df[["promo", "noise"]], df["y"])
        return model, {"key": key}

    run = mm.train(fit, mm.groups(series, by="sku", columns=["promo", "noise", "y"]),
                   workers=2, progress=False)
    assert run.results["key"].tolist() == ["a", "b", "c"] and run.failed.empty
    assert isinstance(run.models["a"], lightgbm.LGBMRegressor)
    linear = mm.train(lambda df, key: LinearRegression().fit(df[["promo"]], df["y"]),
                      mm.groups(series, by="sku"), backend="serial", progress=False)
    assert set(linear.models) == {"a", "b", "c"}


def _named_unless_b(df, key):
    if key == "b":
        raise ValueError("b has no model")
    return pd.DataFrame({"n": [len(df)], "who": [key]})


def _fallback_naming(df, key):
    return pd.DataFrame({"n": [-1], "who": [f"fallback for {key}"]})


@pytest.mark.parametrize("fmt", ["pandas", "numpy"])
def test_a_fn_that_takes_its_key_gets_it_with_a_fallback_and_so_does_the_fallback(series, fmt):
    """fallback= hid fn's key parameter: fn always raised (no key given) and
    every group took the fallback."""
    result = mm.map_groups(_named_unless_b, mm.groups(series, by="sku", format=fmt),
                           fallback=_fallback_naming, backend="serial")
    assert result["who"].tolist() == ["a", "fallback for b", "c"]
    assert list(result.attrs["fallback"]) == ["b"]
