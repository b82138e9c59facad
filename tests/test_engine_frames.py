"""A Spark or Dask DataFrame given to ``mm.groups``, grouped by its engine
(planning/staging.py), on real engines: a local Spark session (``local[2]``)
and a ``distributed`` LocalCluster of two worker processes, each started once
for the module as a user would (tests/test_engines.py starts them alike).

The results equal the pandas path's; supervision holds on staged groups (a
crash costs its group, a timeout one group, retries count, the error budget
stops the run, a store reuses a re-run's models); the driver gets one row per
group, never the rows; bad arguments fail before any work.
"""

from __future__ import annotations

import gc
import os
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from conftest import collected_until, fit_linear, s3_server, shared_ray

pytestmark = pytest.mark.slow

#: The suite's engines this module uses, kept up from the module before (conftest).
SHARED_ENGINES = ("ray", "dask")

_TIMING = ["duration_s", "worker", "started_s", "error"]


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    n = 900
    frame = pd.DataFrame({"store": rng.integers(0, 10, n), "item": rng.choice(list("abc"), n),
                          "day": rng.permutation(n), "x": rng.normal(size=n)})
    frame["y"] = 3 * frame["x"] + rng.normal(size=n)
    return frame


def _engine_frame(engine, frame: pd.DataFrame):
    name, handle = engine
    if name == "spark":
        return handle.createDataFrame(frame)
    import dask.dataframe as dd

    return dd.from_pandas(frame, npartitions=3)


def first_and_last(df):
    """Depends on the rows' order: order_by must have been applied."""
    return {"first_x": float(df["x"].iloc[0]), "last_day": int(df["day"].iloc[-1]),
            "n": len(df)}


@pytest.mark.parametrize("backend", ["engine", "processes"])
def test_the_engine_groups_and_results_equal_the_pandas_path(engine, table, backend):
    source = mm.groups(_engine_frame(engine, table), by=["store", "item"], order_by="day")
    assert source.table is None  # nothing was read on the driver
    run = mm.train(first_and_last, source, backend=engine[0] if backend == "engine" else backend,
                   workers=2, progress=False)
    staged = source._layout
    assert len(staged.key_table) == 30 and staged.num_rows == len(table)  # a row per group
    local = mm.train(first_and_last, mm.groups(table, by=["store", "item"], order_by="day"),
                     workers=2, progress=False)
    pd.testing.assert_frame_equal(run.results.drop(columns=_TIMING),
                                  local.results.drop(columns=_TIMING))
    directory = staged.directory
    assert os.path.isdir(directory)
    del source, staged, run
    gc.collect()
    assert not os.path.exists(directory)  # the staged files go with their source


def crash_on_store_3(df):
    if df["store"].iloc[0] == 3 and df["item"].iloc[0] == "b":
        os._exit(3)
    return fit_linear(df)


def test_a_crash_costs_exactly_its_group(engine, table, retries=1):
    source = mm.groups(_engine_frame(engine, table), by=["store", "item"])
    run = mm.train(crash_on_store_3, source, backend=engine[0], workers=2, retries=retries,
                   progress=False)
    results = run.results.set_index(["store", "item"])
    assert results.loc[(3, "b"), "status"] == "crashed"
    assert results.loc[(3, "b"), "attempts"] == retries + 1
    assert run.summary().statuses == {"ok": 29, "crashed": 1}


def hang_on_store_5(df):
    if df["store"].iloc[0] == 5 and df["item"].iloc[0] == "a":
        time.sleep(3600)
    return fit_linear(df)


def test_a_timeout_costs_one_group(engine, table):
    source = mm.groups(_engine_frame(engine, table), by=["store", "item"])
    run = mm.train(hang_on_store_5, source, backend=engine[0], workers=2, timeout=2,
                   progress=False)
    assert run.summary().statuses == {"ok": 29, "timeout": 1}
    assert run.results.set_index(["store", "item"]).loc[(5, "a"), "status"] == "timeout"


def fail_odd_stores(df):
    if df["store"].iloc[0] % 2:
        raise ValueError("odd store")
    return fit_linear(df)


def test_the_error_budget_stops_the_run(engine, table):
    source = mm.groups(_engine_frame(engine, table), by=["store", "item"])
    with pytest.raises(mm.TooManyFailures) as stopped:
        mm.train(fail_odd_stores, source, backend=engine[0], workers=2, max_failures=2,
                 progress=False)
    statuses = stopped.value.run.results["status"]
    assert (statuses == "failed").sum() >= 3


def test_a_rerun_reuses_through_the_workers_hashes(engine, table, tmp_path):
    store = tmp_path / "store"
    first = mm.train(fit_linear, mm.groups(_engine_frame(engine, table), by="store"),
                     backend=engine[0], workers=2, store=store, progress=False)
    assert not first.results["reused"].any()
    shuffled = table.sample(frac=1.0, random_state=3)  # the same rows, in another order
    again = mm.train(fit_linear, mm.groups(_engine_frame(engine, shuffled), by="store"),
                     backend=engine[0], workers=2, store=store, progress=False)
    assert again.results["reused"].all()
    changed = table.copy()
    changed.loc[changed["store"] == 4, "y"] += 1.0
    third = mm.train(fit_linear, mm.groups(_engine_frame(engine, changed), by="store"),
                     backend=engine[0], workers=2, store=store, progress=False)
    retrained = third.results.loc[~third.results["reused"], "store"].tolist()
    assert retrained == [4]
    _results_frame_is_the_engines(third, engine[0])



def test_a_rerun_reuses_the_same_rows_of_a_query_spark_says_are_not_nullable(engine, table,
                                                                           tmp_path):
    """Spark's nullability comes from a query's plan (``coalesce`` with a
    literal, ``spark.range``), not from its values: the same rows read as
    changed, and every group retrained."""
    if engine[0] != "spark":
        pytest.skip("Spark's nullability")
    from pyspark.sql import functions

    frame = _engine_frame(engine, table)
    store = tmp_path / "store"
    mm.train(fit_linear, mm.groups(frame, by="store"), backend="serial", store=store,
             progress=False)
    not_null = frame.select(*[functions.coalesce(name, functions.lit(0.0)).alias(name)
                              if name in ("x", "y") else name for name in frame.columns])
    assert not not_null.schema["x"].nullable
    again = mm.train(fit_linear, mm.groups(not_null, by="store"), backend="serial",
                     store=store, progress=False)
    assert again.results["reused"].all()


def fit_large(df):
    """A model of 1.1 MB pickled: a file of the store's, not a pack."""
    return np.full(140_000, float(df["y"].sum()))


def _workers_wrote_the_model_files(run, store: Path, groups: int, by=("store",)) -> None:
    registry = mm.Store(store)
    rows = {path for (path,) in registry._conn.execute(
        "SELECT path FROM artifacts WHERE path IS NOT NULL")}
    files = {p.relative_to(store).as_posix() for p in (store / "artifacts").rglob("*")
             if p.is_file()}
    assert len(rows) == groups and files == rows  # no marker, no temporary left
    keys = run.results[list(by)].itertuples(index=False, name=None)
    for key, model in zip(keys, run.models.values(), strict=True):
        np.testing.assert_array_equal(registry.load(key if len(key) > 1 else key[0]), model)


def test_the_engines_workers_write_large_models_into_the_store(engine, table, tmp_path,
                                                              monkeypatch):
    """The driver receives each large model's name and writes its row only."""
    from manymodels.store import artifacts

    def refused(*args, **kwargs):
        raise AssertionError("the driver wrote a model's bytes")

    monkeypatch.setattr(artifacts, "write_artifact", refused)
    store = tmp_path / "store"
    run = mm.train(fit_large, mm.groups(_engine_frame(engine, table), by="store"),
                   backend=engine[0], workers=2, store=store, progress=False)
    assert run.summary().statuses == {"ok": 10}
    _workers_wrote_the_model_files(run, store, 10)


def _results_frame_is_the_engines(run, engine_name: str) -> None:
    """run.results_frame() is the engine's own table of run.results' rows."""
    frame = run.results_frame()
    module = {"spark": "pyspark", "dask": "dask", "ray": "ray"}[engine_name]
    assert type(frame).__module__.split(".")[0] == module
    got = _ray_rows(frame) if engine_name == "ray" else _collected(engine_name, frame)
    expected = run.results
    assert list(got.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(got.drop(columns="error"), expected.drop(columns="error"),
                                  check_dtype=False)
    assert got["error"].isna().tolist() == expected["error"].isna().tolist()


def _ray_rows(dataset) -> pd.DataFrame:
    """A Ray Dataset of Arrow blocks as a pandas frame of NumPy columns (its
    own to_pandas gives Arrow-backed ones, whose missing values are NA)."""
    import pyarrow as pa
    import ray

    return pa.concat_tables(ray.get(dataset.to_arrow_refs())).to_pandas()


def test_bad_arguments_fail_before_any_work(engine, table, tmp_path):
    frame = _engine_frame(engine, table)
    with pytest.raises(ValueError, match="column 'shop' is not in the"):
        mm.groups(frame, by="shop")
    with pytest.raises(ValueError, match="column 'when'"):
        mm.groups(frame, by="store", order_by="when")
    with pytest.raises(ValueError, match="read_on_workers"):
        mm.groups(frame, by="store", read_on_workers=True)
    with pytest.raises(ValueError, match="staging="):
        mm.groups(table, by="store", staging=str(tmp_path))
    with pytest.raises(TypeError, match="staging= must be a directory's path.* got True"):
        mm.groups(frame, by="store", staging=True)
    twice = _engine_frame(engine, table.set_axis(["store", "item", "day", "x", "x"], axis=1))
    with pytest.raises(ValueError, match="has two columns named 'x'.* rename or drop one"):
        mm.groups(twice, by="store")
    assert mm.groups(twice, by="store", columns=["day"]).engine_frame.columns == ["store", "day"]
    source = mm.groups(frame, by="store", columns=["x"], staging=str(tmp_path / "stage"))
    run = mm.train(lambda df: {"columns": ",".join(df.columns)}, source, backend="serial",
                   progress=False)
    assert set(run.results["columns"]) == {"store,x"}
    local_frame = run.results_frame()  # a local backend's engine is this machine
    pd.testing.assert_frame_equal(local_frame, run.results)
    assert local_frame is not run.results
    assert Path(source._layout.directory).parent == tmp_path / "stage"


def test_evaluate_and_select_score_the_staged_groups_as_the_pandas_path(engine, table):
    """evaluate= binds its splitter to the engine's schema (no job runs for
    it), and a holdout with select= scores and picks as on a pandas table."""
    splitter = mm.holdout(0.25, target="y", features=["x"])
    candidates = mm.grid(alpha=[0.0, 10.0])
    staged = mm.train(fit_linear, mm.groups(_engine_frame(engine, table), by="store")
                      * candidates, evaluate=splitter, select="rmse", backend="serial",
                      progress=False)
    local = mm.train(fit_linear, mm.groups(table, by="store") * candidates,
                     evaluate=splitter, select="rmse", backend="serial", progress=False)
    pd.testing.assert_frame_equal(staged.results.drop(columns=_TIMING),
                                  local.results.drop(columns=_TIMING))
    with pytest.raises(ValueError, match="'when'"):
        mm.train(fit_linear, mm.groups(_engine_frame(engine, table), by="store"),
                 evaluate=mm.backtest("when", 2, target="y"), progress=False)


def test_calls_that_need_the_rows_here_refuse_an_engine_frame_first(engine, table, tmp_path):
    """Each names its argument and says how to collect the rows, before any work."""
    frame = _engine_frame(engine, table)
    collect = r"collect it first \((spark_df\.toPandas|dask_df\.compute)\(\)\)"
    with pytest.raises(TypeError, match=f"map_partitions' table is a .*{collect}"):
        mm.map_partitions(lambda df: df, frame)
    with pytest.raises(TypeError, match=f"linear's table is a .*{collect}"):
        mm.linear(frame, by="store", features="x", target="y", store=tmp_path / "linear")
    assert not (tmp_path / "linear").exists()
    fitted = mm.linear(table, by="store", features="x", target="y")
    with pytest.raises(TypeError, match=f"the table is a .*{collect}.*mm.groups"):
        fitted.predict(frame)
    mm.linear(table, by="store", features="x", target="y", store=tmp_path / "lin")
    with pytest.raises(TypeError, match=f"predict's table is a .*{collect}"):
        mm.Store(tmp_path / "lin").predict(frame)
    from sklearn.linear_model import LinearRegression

    from manymodels.sklearn import GroupedEstimator

    grouped = GroupedEstimator(LinearRegression(), by="store")
    with pytest.raises(TypeError, match=f"X is a .*{collect}"):
        grouped.fit(frame, table["y"])
    with pytest.raises(ValueError, match="column '__offset__' has a name the engine's staging"):
        mm.groups(_engine_frame(engine, table.rename(columns={"store": "__offset__"})),
                  by="__offset__")


def test_store_predict_of_an_engine_frame_is_the_engines_frame(engine, table, tmp_path):
    """The engine groups the new rows and its workers predict them from the
    store: the same numbers as Store.predict of the pandas table, a group
    with no model gets the fallback (or null and "none"), nothing collected;
    the groups that failed in training and go to the fallback are said, as
    the pandas path says them (silent, before)."""
    from sklearn.linear_model import LinearRegression

    name = engine[0]
    seen = table[table["store"] != 9]
    mm.train(fit_linear_but_store_8, mm.groups(seen, by="store"), store=tmp_path / "store",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "store")
    rows = table.assign(row=np.arange(len(table)))
    with pytest.warns(RuntimeWarning, match="no model"):
        expected = store.predict(rows, by="store", features=["x"], with_source=True)
    answer = store.predict(_engine_frame(engine, rows), by="store", features=["x"],
                           with_source=True)
    assert type(answer).__module__.split(".")[0] == ("pyspark" if name == "spark" else "dask")
    got = _collected(name, answer).sort_values("row").reset_index(drop=True)
    assert list(got.columns) == [*rows.columns, "prediction", "source"]
    np.testing.assert_allclose(got["prediction"], expected["prediction"])  # NaN for store 9
    assert list(got["source"]) == list(expected["source"])
    assert set(got.loc[got["store"] == 9, "source"]) == {"none"}

    store.attach(store.runs()["run_id"].max(), "fallback", LinearRegression().fit(
        table[["x"]], table["y"]))
    fell = r"1 group failed in training and is answered by the fallback model.*\[8\]"
    with pytest.warns(RuntimeWarning, match=fell):
        store.predict(rows, by="store", features=["x"])
    with pytest.warns(RuntimeWarning, match=fell):  # on the driver, once, nothing run yet
        answer = store.predict(_engine_frame(engine, rows), by="store", features=["x"],
                               with_source=True)
    with_fallback = _collected(name, answer)
    assert set(with_fallback.loc[with_fallback["store"] == 9, "source"]) == {"fallback"}
    assert with_fallback["prediction"].notna().all()

    with pytest.raises(ValueError, match="column 'price' is not in the"):
        store.predict(_engine_frame(engine, rows), by="store", features=["price"])
    dated = rows.assign(store=pd.Timestamp("2024-01-01") + pd.to_timedelta(rows["store"], "D"))
    with pytest.raises(ValueError, match="key column 'store' of the table to predict holds "
                       ".*datetimes .*stored under keys of numbers"):  # every row null, unsaid
        store.predict(_engine_frame(engine, dated), by="store", features=["x"])
    with pytest.raises(ValueError, match="column 'x' is not in the table to predict: the "
                       "model of group .* was fitted with it"):  # its feature_names_in_
        store.predict(_engine_frame(engine, rows.drop(columns="x")), by="store")
    labelled = table.assign(up=np.where(table["y"] > 0, "up", "down"))
    mm.train(fit_classifier, mm.groups(labelled, by="store"), store=tmp_path / "labels",
             backend="serial", progress=False)
    labels = _collected(name, mm.Store(tmp_path / "labels").predict(
        _engine_frame(engine, labelled), by="store", features=["x"]))
    assert set(labels["prediction"]) <= {"up", "down"} and labels["prediction"].notna().all()


def fit_sklearn_linear(df):
    from sklearn.linear_model import LinearRegression

    return LinearRegression().fit(df[["x"]], df["y"])


def fit_linear_but_store_8(df):
    if df["store"].iloc[0] == 8:
        raise ValueError("store 8 is bad")
    return fit_sklearn_linear(df)


def fit_classifier(df):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression().fit(df[["x"]], df["up"])


def centred(df):
    return df.assign(centred=df["x"] - df["x"].mean())[["day", "centred"]]


def fail_on_store_2(df):
    if df["store"].iloc[0] == 2:
        raise ValueError("store 2 is bad")
    return df[["x", "y"]].mean()


def _collected(engine_name, frame) -> pd.DataFrame:
    return frame.toPandas() if engine_name == "spark" else frame.compute().reset_index(drop=True)


def test_map_groups_of_an_engine_frame_answers_with_the_engines_frame(engine, table):
    """The engine groups, the backend supervises fn, and the outputs (in key
    order, with their keys) come back as the engine's DataFrame."""
    name = engine[0]
    transformed = mm.map_groups(centred, _engine_frame(engine, table), by="store",
                                order_by="day", backend="processes", workers=2)
    assert type(transformed).__module__.split(".")[0] == ("pyspark" if name == "spark"
                                                          else "dask")
    local = mm.map_groups(centred, mm.groups(table, by="store", order_by="day"),
                          backend="serial")
    expected = local.sort_values(["store", "day"]).reset_index(drop=True)
    got = _collected(name, transformed)
    assert list(got.columns) == ["store", "day", "centred"]
    pd.testing.assert_frame_equal(got, expected, check_dtype=False)

    with pytest.warns(RuntimeWarning, match="store 2 is bad"):
        means = mm.map_groups(fail_on_store_2, mm.groups(_engine_frame(engine, table),
                                                         by="store"), errors="skip",
                              backend="serial")
    means = _collected(name, means)
    assert sorted(means["store"]) == [s for s in range(10) if s != 2]
    expected_means = table[table["store"] != 2].groupby("store")[["x", "y"]].mean()
    np.testing.assert_allclose(means.set_index("store")[["x", "y"]], expected_means)
    with pytest.raises(TypeError, match="needs by="):
        mm.map_groups(centred, _engine_frame(engine, table))


def _spark_only(engine) -> None:
    if engine[0] != "spark":
        pytest.skip("a Spark DataFrame's own types and settings")


def mean_x(df):
    return df[["x"]].mean()


@pytest.mark.parametrize("zone", ["UTC", "America/New_York"])
def test_spark_timestamp_keys_find_their_models_in_any_session_time_zone(engine, tmp_path,
                                                                         zone):
    """Spark hands a group's timestamps to Python as wall-clock times of the
    session's zone, the store holds its keys as UTC instants: each group
    finds its own model all the same, the two instants that a clock turned
    back shows alike (01:30 twice in New York) each their own, and the
    answer's timestamps are the input's. map_groups' keys are the pandas
    path's; a timestamp_ntz key stays a wall-clock time, found as it is."""
    _spark_only(engine)
    from pyspark.sql import functions as F

    spark = engine[1]
    before = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", zone)
    try:
        instants = pd.to_datetime(["2020-01-01 00:00", "2020-06-01 12:00", "2024-11-03 05:30",
                                   "2024-11-03 06:30"], utc=True)
        rows = pd.DataFrame({"t": np.repeat(instants, 6), "x": np.tile(np.arange(6.0), 4),
                             "row": np.arange(24)})
        rows["y"] = rows["x"] * np.repeat(np.arange(1.0, 5.0), 6)
        frame = spark.createDataFrame(rows)
        mm.train(fit_sklearn_linear, mm.groups(frame, by="t"), store=tmp_path / "store",
                 backend="serial", progress=False)
        store = mm.Store(tmp_path / "store")
        expected = store.predict(rows, by="t", features=["x"], with_source=True)
        answer = store.predict(frame, by="t", features=["x"], with_source=True)
        got = answer.orderBy("row").select("source", "prediction",
                                           F.unix_micros("t").alias("t")).toPandas()
        assert list(got["source"]) == ["group"] * len(rows)
        np.testing.assert_allclose(got["prediction"], expected["prediction"])
        np.testing.assert_array_equal(got["t"], rows["t"].dt.as_unit("us").astype("int64"))

        means = mm.map_groups(mean_x, frame, by="t", backend="serial")
        local = mm.map_groups(mean_x, mm.groups(rows, by="t"), backend="serial")
        means = means.orderBy("t").select(F.unix_micros("t").alias("t"), "x").toPandas()
        np.testing.assert_array_equal(means["t"], local["t"].dt.as_unit("us").astype("int64"))
        np.testing.assert_allclose(means["x"], local["x"])

        wall = frame.withColumn("t", F.col("t").cast("timestamp_ntz"))
        mm.train(fit_sklearn_linear, mm.groups(wall, by="t"), store=tmp_path / "wall",
                 backend="serial", progress=False)
        found = mm.Store(tmp_path / "wall").predict(wall, by="t", features=["x"],
                                                    with_source=True).toPandas()
        assert set(found["source"]) == {"group"} and found["prediction"].notna().all()
    finally:
        spark.conf.set("spark.sql.session.timeZone", before)


def test_store_predict_on_the_engine_reads_a_store_made_afresh_at_its_path(engine, table,
                                                                           tmp_path):
    """An engine's workers keep the stores they opened: one removed and made
    again at the same path (other models) is read as it is now, not as the
    worker first saw it."""
    import shutil

    path = tmp_path / "store"

    def train_and_predict_on_the_engine(rows: pd.DataFrame) -> None:
        mm.train(fit_sklearn_linear, mm.groups(rows, by="store"), store=path,
                 backend="serial", progress=False)
        answer = _collected(engine[0], mm.Store(path).predict(_engine_frame(engine, rows),
                                                              by="store", features=["x"]))
        np.testing.assert_allclose(answer.sort_values("row")["prediction"],
                                   mm.Store(path).predict(rows, by="store", features=["x"]))

    rows = table.assign(row=np.arange(len(table)))
    train_and_predict_on_the_engine(rows)
    shutil.rmtree(path)
    train_and_predict_on_the_engine(rows.assign(y=rows["y"] * 100))  # other models, same path


@pytest.mark.parametrize("name", ["store.id", "the `store`"])
def test_key_columns_named_with_dots_or_backticks(engine, table, tmp_path, name):
    """A column's name is a name, not an expression of the engine's: training,
    map_groups and Store.predict group by it (and order by one, and carry
    one) as the pandas path does."""
    renamed = table.rename(columns={"store": name, "day": "the.day"})
    renamed["row"] = np.arange(len(table))
    frame = _engine_frame(engine, renamed)
    run = mm.train(fit_linear, mm.groups(frame, by=name, order_by="the.day"),
                   backend="serial", progress=False)
    local = mm.train(fit_linear, mm.groups(renamed, by=name, order_by="the.day"),
                     backend="serial", progress=False)
    pd.testing.assert_frame_equal(run.results.drop(columns=_TIMING),
                                  local.results.drop(columns=_TIMING))
    means = _collected(engine[0], mm.map_groups(mean_x, frame, by=name, backend="serial"))
    pd.testing.assert_frame_equal(means, mm.map_groups(mean_x, mm.groups(renamed, by=name),
                                                       backend="serial"), check_dtype=False)
    mm.train(fit_sklearn_linear, mm.groups(frame, by=name), store=tmp_path / "store",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "store")
    got = _collected(engine[0], store.predict(frame, by=name, features=["x"]))
    np.testing.assert_allclose(got.sort_values("row")["prediction"],
                               store.predict(renamed, by=name, features=["x"]))


def _nested_keys(engine):
    """An engine's DataFrame with a list, a map and a struct column (Dask's of
    pandas' Arrow types: a column of Python lists is an object column, whose
    type Dask's schema does not know), and each one's type as it is named."""
    if engine[0] == "spark":
        frame = engine[1].createDataFrame(
            [(1, [1.0], {"a": 1}, (1, "x"), 1.0), (2, [2.0], {"b": 2}, (2, "y"), 2.0)],
            "k int, arr array<double>, m map<string,int>, st struct<i:int,s:string>, "
            "x double")
        return frame, {"arr": "array<double>", "m": "map<string,int>",
                       "st": "struct<i:int,s:string>"}
    import dask.dataframe as dd
    import pyarrow as pa

    kinds = {"arr": pa.list_(pa.float64()), "m": pa.map_(pa.string(), pa.int32()),
             "st": pa.struct([("i", pa.int32()), ("s", pa.string())])}
    values = {"arr": [[1.0], [2.0]], "m": [[("a", 1)], [("b", 2)]],
              "st": [{"i": 1, "s": "x"}, {"i": 2, "s": "y"}]}
    rows = pd.DataFrame({"k": [1, 2], **{name: pd.Series(values[name],
                                                          dtype=pd.ArrowDtype(kind))
                                         for name, kind in kinds.items()}, "x": [1.0, 2.0]})
    return dd.from_pandas(rows, npartitions=1), {name: str(kind) for name, kind in kinds.items()}


def test_a_list_map_or_struct_key_column_is_refused_before_any_work(engine, tmp_path):
    """As the pandas path refuses it, from the DataFrame's schema: no job runs."""
    frame, kinds = _nested_keys(engine)
    for name, kind in kinds.items():
        refused = re.escape(f"by column '{name}' holds {kind} values: a group key must be "
                            "a plain value")
        with pytest.raises(ValueError, match=refused):
            mm.groups(frame, by=["k", name])
        with pytest.raises(ValueError, match=refused):
            mm.map_groups(mean_x, frame, by=name)
    keyed = frame[["k", "x"]].assign(y=frame["x"]) if engine[0] == "dask" else frame.select(
        "k", "x", frame["x"].alias("y"))
    mm.train(fit_linear, mm.groups(keyed, by="k"), store=tmp_path / "store",
             backend="serial", progress=False)
    lists = frame[["arr", "x"]].rename(columns={"arr": "k"}) if engine[0] == "dask" else (
        frame.select(frame["arr"].alias("k"), "x"))
    with pytest.raises(ValueError, match=re.escape(f"by column 'k' holds {kinds['arr']}")):
        mm.Store(tmp_path / "store").predict(lists, by="k", features=["x"])



def _count_rows(df):
    return pd.DataFrame({"n": [len(df)]})


def test_a_float_key_of_zero_and_minus_zero_or_nan_and_null_is_one_group(engine, tmp_path):
    """pandas groups 0.0 with -0.0, and NaN with a missing value; Spark's
    shuffle hashed each apart, to two partitions: "the engine split a group
    over two partitions" (a RuntimeError after the engine's job)."""
    values = [0.0, -0.0, float("nan"), None, 1.0] * 8
    if engine[0] == "spark":
        frame = engine[1].createDataFrame([(v, float(i)) for i, v in enumerate(values)],
                                          "k double, x double")
    else:
        import dask.dataframe as dd

        frame = dd.from_pandas(pd.DataFrame({"k": values, "x": np.arange(40.0)}),
                               npartitions=3)
    counts = _collected_frame(engine[0], mm.map_groups(_count_rows, frame, by="k",
                                                       backend="serial"))
    assert sorted(counts["n"].tolist()) == [8, 16, 16]
    run = mm.train(fit_linear, mm.groups(frame.select("k", "x", frame["x"].alias("y"))
                                         if engine[0] == "spark" else frame.assign(y=frame["x"]),
                                         by="k"),
                   backend="serial", store=tmp_path / "store", progress=False)
    assert run.summary().statuses == {"ok": 3}


def _collected_frame(name: str, frame) -> pd.DataFrame:
    return frame.toPandas() if name == "spark" else frame.compute()


@pytest.fixture(scope="module")
def object_store():
    """An S3 API server on loopback (moto's server mode) with an empty bucket:
    the staging URI names its endpoint and keys itself, so that the engines'
    workers, started before it, need nothing in their environment; and a
    pyarrow filesystem on it, to list what is there."""
    for options, filesystem in s3_server():
        yield f"s3://testing:testing@bucket/stage?{options}", filesystem


def test_staging_on_an_object_store(engine, table, object_store, tmp_path):
    """staging= may be an object store's URI: the engine's workers upload each
    partition's sorted rows, the training workers (the engine's, or this
    machine's processes) fetch the record batches their groups lie in, and
    the objects go with their source. map_groups writes its outputs there
    too, an object a part, read back by the engine's workers; a map_groups
    that fails removes its objects."""
    from pyarrow import fs

    location, filesystem = object_store

    def objects() -> list[str]:
        found = filesystem.get_file_info(fs.FileSelector("bucket/stage", recursive=True,
                                                         allow_not_found=True))
        return [entry.path for entry in found if entry.type == fs.FileType.File]

    source = mm.groups(_engine_frame(engine, table), by=["store", "item"], order_by="day",
                       staging=location)
    local = mm.train(first_and_last, mm.groups(table, by=["store", "item"], order_by="day"),
                     workers=2, progress=False)
    for backend in (engine[0], "processes"):
        run = mm.train(first_and_last, source, backend=backend, workers=2, progress=False)
        pd.testing.assert_frame_equal(run.results.drop(columns=_TIMING),
                                      local.results.drop(columns=_TIMING))
    staged = objects()
    assert staged and all(path.endswith(".arrow") for path in staged)
    assert source._layout.directory.startswith("s3://testing:testing@bucket/stage/")
    del source, run
    assert collected_until(lambda: objects() == []), objects()
    transformed = mm.map_groups(centred, _engine_frame(engine, table), by="store",
                                order_by="day", staging=location, backend="processes",
                                workers=2)
    expected = mm.map_groups(centred, mm.groups(table, by="store", order_by="day"),
                             backend="serial")
    expected = expected.sort_values(["store", "day"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(_collected(engine[0], transformed), expected,
                                  check_dtype=False)
    outputs = [path for path in objects() if "/manymodels-outputs-" in path]
    assert outputs and all(path.endswith(".arrow") for path in outputs)
    for path in outputs:
        filesystem.delete_file(path)  # (they live until this process exits)
    with pytest.raises(RuntimeError, match="store 2 is bad"):
        mm.map_groups(fail_on_store_2, _engine_frame(engine, table), by="store",
                      staging=location, backend="serial")
    assert objects() == []
    with pytest.raises(ValueError, match="staging='nosuch://x/y' cannot be opened"):
        mm.groups(_engine_frame(engine, table), by="store", staging="nosuch://x/y")


@pytest.fixture(scope="module")
def local_ray():
    """The suite's local Ray of two CPUs, started as a user would (conftest.shared_ray)."""
    return shared_ray()


def _ray_dataset(ray, frame: pd.DataFrame):
    """Three blocks, as a read of three files would give."""
    return ray.data.from_pandas([frame.iloc[:300], frame.iloc[300:600], frame.iloc[600:]])


@pytest.mark.ray
def test_a_ray_dataset_is_grouped_by_ray_data_and_trained_on_ray(local_ray, table):
    """Ray Data's default shuffle (a hash shuffle into sorted blocks) groups
    the rows; the results equal the pandas path's; map_groups answers with a
    Ray Dataset."""
    source = mm.groups(_ray_dataset(local_ray, table), by=["store", "item"], order_by="day")
    assert source.table is None  # nothing was read on the driver
    run = mm.train(first_and_last, source, backend="ray", workers=2, progress=False)
    assert len(source._layout.key_table) == 30 and source._layout.num_rows == len(table)
    local = mm.train(first_and_last, mm.groups(table, by=["store", "item"], order_by="day"),
                     backend="serial", progress=False)
    pd.testing.assert_frame_equal(run.results.drop(columns=_TIMING),
                                  local.results.drop(columns=_TIMING))
    transformed = mm.map_groups(centred, source, backend="serial")
    assert type(transformed).__name__ in ("Dataset", "MaterializedDataset")
    expected = mm.map_groups(centred, mm.groups(table, by=["store", "item"], order_by="day"),
                             backend="serial")
    expected = expected.sort_values(["store", "item", "day"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(transformed.to_pandas(), expected, check_dtype=False)
    with pytest.raises(ValueError, match="column 'shop' is not in the Ray Dataset"):
        mm.groups(_ray_dataset(local_ray, table), by="shop")
    # a list, map or struct key is refused from the Dataset's schema, as on Spark and Dask
    import pyarrow as pa

    nested = local_ray.data.from_arrow(pa.table({
        "k": [1, 2], "arr": pa.array([[1.0], [2.0]]),
        "st": pa.array([{"i": 1}, {"i": 2}]), "x": [1.0, 2.0]}))
    for name, kind in (("arr", "list<item: double>"), ("st", "struct<i: int64>")):
        refused = f"by column '{name}' holds {kind} values: a group key must be a plain value"
        with pytest.raises(ValueError, match=re.escape(refused)):
            mm.groups(nested, by=["k", name])
        with pytest.raises(ValueError, match=re.escape(refused)):
            mm.map_groups(centred, nested, by=name)


@pytest.mark.ray
def test_an_empty_ray_dataset_is_refused_as_the_pandas_path_refuses_an_empty_frame(
        local_ray, table):
    """A Dataset whose filter kept no row failed inside Ray's shuffle
    (ArrowInvalid: no key column to sort by): it is refused by name."""
    empty = _ray_dataset(local_ray, table).filter(lambda row: False)
    with pytest.raises(ValueError, match="the Ray Dataset is empty: there are no groups"):
        mm.train(first_and_last, mm.groups(empty, by="store"), backend="serial",
                 progress=False)


def key_and_count(df):
    return {"n": len(df), "key_dtype": str(df["k"].dtype)}


@pytest.mark.ray
def test_a_ray_datasets_categorical_or_float_key_is_one_group_a_key(local_ray, tmp_path):
    """A categorical key failed inside Ray's shuffle (it cannot sort a
    dictionary), in mm.groups and Store.predict; a float key's NaN and null
    (and -0.0 and 0.0), one group to pandas, were hashed apart by Ray's
    shuffle, and the group split over two partitions on a cluster of more
    than two CPUs: the shuffle keys hold one value a key, and the key
    columns keep their own types."""
    frame = pd.DataFrame({"k": pd.Categorical(list("abcab") * 4, categories=["c", "b", "a"]),
                          "x": np.arange(20.0)})
    frame["y"] = 2 * frame["x"]
    dataset = local_ray.data.from_pandas([frame.iloc[:7], frame.iloc[7:]])
    run = mm.train(key_and_count, mm.groups(dataset, by="k"), backend="serial", progress=False)
    local = mm.train(key_and_count, mm.groups(frame, by="k"), backend="serial", progress=False)
    pd.testing.assert_frame_equal(run.results.drop(columns=_TIMING),
                                  local.results.drop(columns=_TIMING))
    mm.train(fit_sklearn_linear, mm.groups(frame, by="k"), store=tmp_path / "store",
             backend="serial", progress=False)
    answer = mm.Store(tmp_path / "store").predict(dataset, by="k", features=["x"]).to_pandas()
    assert list(answer.columns) == ["k", "x", "y", "prediction"]
    np.testing.assert_allclose(answer["prediction"], answer["y"], atol=1e-9)

    import pyarrow as pa

    from manymodels.planning.staging import ray_shuffle_keys, shuffle_key_values

    values = pa.array([0.0, -0.0, float("nan"), None, 1.5], type=pa.float64())
    floats = local_ray.data.from_arrow(pa.table({"k": values, "x": np.arange(5.0)}))
    assert ray_shuffle_keys(floats, ["k"])[1:] == (["__manymodels_key_0__"],
                                                  ("__manymodels_key_0__",))
    shuffled = shuffle_key_values(pa.chunked_array([values])).to_pylist()
    assert [str(value) for value in shuffled] == ["0.0", "0.0", "None", "None", "1.5"]


@pytest.mark.ray
def test_store_predict_of_a_ray_dataset_is_a_ray_dataset(local_ray, table, tmp_path):
    mm.train(fit_sklearn_linear, mm.groups(table, by="store"), store=tmp_path / "store",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "store")
    rows = table.assign(row=np.arange(len(table)))
    answer = store.predict(_ray_dataset(local_ray, rows), by="store", features=["x"])
    assert type(answer).__name__ in ("Dataset", "MaterializedDataset")
    got = answer.to_pandas().sort_values("row")
    np.testing.assert_allclose(got["prediction"], store.predict(rows, by="store",
                                                                features=["x"]))
    with pytest.raises(TypeError, match=r"collect it first \(ray_dataset\.to_pandas\(\)\)"):
        mm.map_partitions(lambda df: df, _ray_dataset(local_ray, table))


@pytest.fixture
def ray_sorts_to_shuffle(local_ray):
    """Ray Data's sort-based shuffle (its older strategy), for this test only."""
    from ray.data.context import DataContext, ShuffleStrategy

    context = DataContext.get_current()
    before = context.shuffle_strategy
    context.shuffle_strategy = ShuffleStrategy.SORT_SHUFFLE_PULL_BASED
    yield local_ray
    context.shuffle_strategy = before


def crash_or_hang(df):
    key = (int(df["store"].iloc[0]), df["item"].iloc[0])
    if key == (3, "b"):
        os._exit(3)
    if key == (5, "a"):
        time.sleep(3600)
    return fit_linear(df)


@pytest.mark.ray
def test_ray_supervises_a_ray_datasets_groups(ray_sorts_to_shuffle, table, tmp_path,
                                              monkeypatch, object_store):
    """Grouped by a sort this time (once for the first two runs: the source
    keeps its staged rows): a crash costs its group (retried), a hang one
    timeout; a re-run on the same rows in another order, one group changed,
    staged on an object store, reuses every other model through the hashes
    Ray's workers made."""
    ray = ray_sorts_to_shuffle
    source = mm.groups(_ray_dataset(ray, table), by=["store", "item"])
    run = mm.train(crash_or_hang, source, backend="ray", workers=2, retries=1, timeout=2,
                   progress=False)
    assert run.summary().statuses == {"ok": 28, "crashed": 1, "timeout": 1}
    results = run.results.set_index(["store", "item"])
    assert results.loc[(3, "b"), "attempts"] == 2
    store = tmp_path / "store"
    first = mm.train(fit_linear, source, backend="ray", workers=2, store=store, progress=False)
    assert not first.results["reused"].any()
    changed = table.sample(frac=1.0, random_state=3)  # the same rows, in another order
    changed.loc[(changed["store"] == 4) & (changed["item"] == "c"), "y"] += 1.0
    elsewhere = mm.groups(_ray_dataset(ray, changed), by=["store", "item"],
                          staging=object_store[0])
    again = mm.train(fit_linear, elsewhere, backend="ray", workers=2, store=store,
                     progress=False)
    assert elsewhere._layout.directory.startswith("s3://")
    transformed = mm.map_groups(centred, elsewhere, backend="serial")  # outputs there too
    expected = mm.map_groups(centred, mm.groups(changed, by=["store", "item"]),
                             backend="serial")
    pd.testing.assert_frame_equal(
        transformed.to_pandas().sort_values(["store", "item", "day"]).reset_index(drop=True),
        expected.sort_values(["store", "item", "day"]).reset_index(drop=True),
        check_dtype=False)
    retrained = again.results.loc[~again.results["reused"], ["store", "item"]]
    assert retrained.values.tolist() == [[4, "c"]]
    _results_frame_is_the_engines(again, "ray")

    # Ray's workers write large models into the store: the driver only their rows
    from manymodels.store import artifacts

    def refused(*args, **kwargs):
        raise AssertionError("the driver wrote a model's bytes")

    monkeypatch.setattr(artifacts, "write_artifact", refused)
    large = mm.train(fit_large, source, backend="ray", workers=2, store=tmp_path / "large",
                     progress=False)
    assert large.summary().statuses == {"ok": 30}
    _workers_wrote_the_model_files(large, tmp_path / "large", 30, by=["store", "item"])


class _ClassOf:
    """A classifier of integer classes: each row's class is its group's key."""

    def __init__(self, key: int) -> None:
        self.classes_ = np.array([key])

    def predict(self, X) -> np.ndarray:
        return np.full(len(X), self.classes_[0])


def _types_seen(df):
    return None, {"c": str(df["c"].dtype), "n": len(df)}


def test_dask_keeps_its_columns_types_through_the_shuffle(engine, tmp_path):
    """Dask's shuffle gave a nullable Int64 key back as floats (run.results
    and map_groups' keys), a categorical of unknown categories as text in
    most groups (fit got str where the pandas path gives a category, and a
    re-run on another partitioning retrained them), and Store.predict's meta
    said int64 where its partitions held floats (a group without a model).
    Each keeps the pandas path's type."""
    if engine[0] != "dask":
        pytest.skip("Dask's shuffle and meta")
    import dask.dataframe as dd

    frame = pd.DataFrame({"k": pd.array([1, 2, None, 4] * 50, dtype="Int64"),
                          "x": np.arange(200.0)})
    frame["c"] = frame["k"].astype(str)
    local = mm.train(_types_seen, mm.groups(frame.astype({"c": "category"}), by="k"),
                     backend="serial", progress=False).results
    store = tmp_path / "store"
    runs = []
    for partitions in (4, 1):
        lazy = dd.from_pandas(frame, npartitions=partitions, sort=False)
        lazy["c"] = lazy["c"].astype("category")  # categories unknown to Dask
        runs.append(mm.train(_types_seen, mm.groups(lazy, by="k"), store=store,
                             backend="serial", progress=False).results)
    assert str(runs[0]["k"].dtype) == "Int64"
    pd.testing.assert_frame_equal(runs[0][["k", "c", "n"]], local[["k", "c", "n"]])
    assert runs[1]["reused"].all()  # another partitioning, the same data hashes
    classes = tmp_path / "classes"
    mm.train(lambda df: _ClassOf(int(df["k"].iloc[0])),
             mm.groups(frame.dropna(subset=["k"]).iloc[:100], by="k"), store=classes,
             backend="serial", progress=False)
    answer = mm.Store(classes).predict(
        dd.from_pandas(pd.DataFrame({"k": [1, 2, 7], "x": [0.0, 1.0, 2.0]}), npartitions=2),
        by="k")
    assert str(answer.dtypes["prediction"]) == "Int64"
    computed = answer.compute().sort_values("k")
    assert str(computed["prediction"].dtype) == "Int64"
    assert computed["prediction"].tolist()[:2] == [1, 2] and computed["prediction"].isna().iloc[2]


def _n_rows(df):
    return {"n": len(df)}


def test_dask_boolean_keys_and_labels_not_text_as_the_pandas_path(engine, tmp_path):
    """A Dask ``boolean`` key with a missing value came back in run.results
    as objects (the pandas path: ``boolean``); a column labelled ``1`` (not
    text) failed in Dask's shuffle with its own traceback once the job had
    started, in mm.groups and in Store.predict: refused first, by name."""
    if engine[0] != "dask":
        pytest.skip("Dask's pandas types and column labels")
    import dask.dataframe as dd

    frame = pd.DataFrame({"k": pd.array([True, None, False] * 4, dtype="boolean"),
                          "x": np.arange(12.0)})
    local = mm.train(_n_rows, mm.groups(frame, by="k"), backend="serial", progress=False)
    run = mm.train(_n_rows, mm.groups(dd.from_pandas(frame, npartitions=3), by="k"),
                   backend="serial", progress=False)
    pd.testing.assert_frame_equal(run.results[["k", "n"]], local.results[["k", "n"]])
    labelled = dd.from_pandas(frame.assign(**{"k": frame["k"].fillna(True)}).rename(
        columns={"x": 1}), npartitions=2)
    with pytest.raises(ValueError, match=r"column 1 of the Dask DataFrame .*rename"):
        mm.groups(labelled, by="k")
    mm.train(_n_rows, mm.groups(frame, by="k"), store=tmp_path, backend="serial",
             progress=False)
    with pytest.raises(ValueError, match=r"column 1 of the Dask DataFrame .*rename"):
        mm.Store(tmp_path).predict(labelled, by="k")


def test_a_spark_frame_of_many_partitions_is_staged_in_as_few_as_its_rows_need(engine):
    """A frame of many small partitions (24 here; 200, read from 200 files,
    ran 200 Python tasks for 5 groups: 20-40 s on 2 cores) is shuffled into
    partitions that Spark's adaptive execution sizes from the data, as its
    own grouped apply's are: the staging stage runs fewer tasks than the
    frame has partitions, and every group is whole."""
    _spark_only(engine)
    from pyspark.sql import functions as F

    spark = engine[1]
    frame = (spark.range(0, 48, numPartitions=24).withColumn("g", F.col("id") % 4)
             .withColumn("x", F.col("id") * 1.0))
    context = spark.sparkContext
    context.setJobGroup("manymodels-test-staging", "staging a frame of many partitions")
    try:
        run = mm.train(mean_of_x, mm.groups(frame, by="g"), backend="serial", progress=False)
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    tracker = context.statusTracker()
    tasks = [tracker.getStageInfo(stage).numTasks
             for job in tracker.getJobIdsForGroup("manymodels-test-staging")
             for stage in tracker.getJobInfo(job).stageIds]
    assert min(tasks) < 24, tasks
    assert {int(key): model for key, model in run.models.items()} == {
        0: 22.0, 1: 23.0, 2: 24.0, 3: 25.0}


def mean_of_x(df):
    return float(df["x"].mean())
