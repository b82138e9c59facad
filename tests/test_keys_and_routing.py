"""Keys round-trip through the store, rows reach their group's model, and
GroupedEstimator works on arrays, object keys, polars and Arrow."""

from __future__ import annotations

import datetime as dt
import warnings
from decimal import Decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from sklearn.linear_model import LinearRegression, Ridge

import manymodels as mm
from conftest import lazy_polars as pl
from conftest import run_cli
from manymodels.inputs.keys import decode_key, encode_key
from manymodels.sklearn import GroupedEstimator

KEY_COLUMNS = {
    "string": ["a", "b", "c"],
    "integer": [3, 1, 2],
    "float": [0.5, 1.5, 2.5],
    "boolean": [True, False, True],
    "datetime": pd.to_datetime(["2024-01-01 00:00", "2024-02-01 06:00", "2024-03-01 12:30"]),
    "datetime_tz": pd.to_datetime(["2024-01-01", "2024-02-01", "2024-03-01"]).tz_localize(
        "Europe/Paris"),
    "date": [dt.date(2024, 1, 1), dt.date(2024, 2, 1), dt.date(2024, 3, 1)],
    "category": pd.Categorical(["x", "y", "z"]),
    "decimal": [Decimal("1.10"), Decimal("2.20"), Decimal("3.30")],
}


def _table(key_values, rows_per_group=20, seed=0):
    rng = np.random.default_rng(seed)
    parts = []
    for slope, key in enumerate(list(key_values)[:2], start=1):  # two groups (bool has two)
        x = rng.normal(size=rows_per_group)
        parts.append(pd.DataFrame({"k": [key] * rows_per_group, "x": x, "y": slope * x}))
    frame = pd.concat(parts, ignore_index=True)
    if isinstance(key_values, pd.Categorical):
        frame["k"] = pd.Categorical(frame["k"], categories=key_values.categories)
    return frame.sample(frac=1, random_state=seed).reset_index(drop=True)


def fit_lr(df):
    return LinearRegression().fit(df[["x"]], df["y"])


@pytest.mark.parametrize("kind", list(KEY_COLUMNS))
def test_every_key_type_round_trips_through_the_store_and_predicts(tmp_path, kind):
    frame = _table(KEY_COLUMNS[kind])
    run = mm.train(fit_lr, mm.groups(frame, by="k"), store=tmp_path / "s", backend="serial",
                   progress=False)
    assert len(run.ok) == 2
    store = mm.Store(tmp_path / "s")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no row may go without a model
        predicted = store.predict(frame, by="k", features=["x"])
    np.testing.assert_allclose(predicted.to_numpy(), frame["y"].to_numpy(), atol=1e-9)
    stored_keys = store.results()["k"].tolist()
    assert [encode_key((k,)) for k in stored_keys] == [
        encode_key((k,)) for k in run.results["k"]]
    for slope, key in enumerate(list(KEY_COLUMNS[kind])[:2], start=1):
        found = frame.loc[frame["k"] == key, "k"].iloc[0]  # a pandas scalar finds it
        assert store.load(found).coef_[0] == pytest.approx(slope)


@pytest.mark.parametrize("value", [
    "s", 7, 2.5, True, None, dt.datetime(2024, 1, 2, 3, 4, 5, 6),
    pd.Timestamp("2024-01-02", tz="UTC"), dt.date(2024, 1, 2), dt.time(1, 2, 3),
    pd.Timedelta("1h"), Decimal("1.25"), b"\x00\xff", ("a", 1)])
def test_key_encoding_round_trips(value):
    decoded = decode_key(encode_key(("x", value)))
    assert decoded[0] == "x" and decoded[1] == value
    assert encode_key(decoded) == encode_key(("x", value))


def test_one_encoding_for_equal_values_from_each_library():
    stamp = "2024-05-06 07:08:09"
    variants = [dt.datetime(2024, 5, 6, 7, 8, 9), pd.Timestamp(stamp),
                np.datetime64(stamp), pa.scalar(pd.Timestamp(stamp)).as_py()]
    assert len({encode_key((v,)) for v in variants}) == 1
    assert len({encode_key((v,)) for v in [3, np.int64(3), np.int32(3)]}) == 1


def fit_maybe_failing(df):
    if df["x"].isna().any():
        raise ValueError("no usable rows")
    return LinearRegression().fit(df[["x"]], df["y"])


def test_predict_uses_each_groups_latest_model_after_a_failed_rerun(tmp_path):
    frame = _table(["a", "b"])
    store_path = tmp_path / "s"
    mm.train(fit_maybe_failing, mm.groups(frame, by="k"), store=store_path,
             backend="serial", progress=False)
    broken = frame.assign(x=np.nan)
    failed = mm.train(fit_maybe_failing, mm.groups(broken, by="k"), store=store_path,
                      backend="serial", progress=False)
    assert (failed.results["status"] == "failed").all()
    store = mm.Store(store_path)
    predicted = store.predict(frame, by="k", features=["x"])
    np.testing.assert_allclose(predicted.to_numpy(), frame["y"].to_numpy(), atol=1e-9)
    with pytest.raises(ValueError, match="no row of the table has a model"):
        store.predict(frame, by="k", features=["x"], run=failed.run_id)


def test_predict_warns_about_rows_without_a_model(tmp_path):
    frame = _table(["a", "b"])
    mm.train(fit_lr, mm.groups(frame, by="k"), store=tmp_path / "s", backend="serial",
             progress=False)
    new = pd.concat([frame, frame.head(3).assign(k="unseen")], ignore_index=True)
    with pytest.warns(RuntimeWarning, match="3 row"):
        predicted = mm.Store(tmp_path / "s").predict(new, by="k", features=["x"])
    assert predicted.isna().sum() == 3


def test_cli_predict_after_a_failed_rerun_uses_the_earlier_models(tmp_path):
    frame = _table(["a", "b"])
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    frame.to_parquet(good)
    frame.assign(y=np.nan).to_parquet(bad)  # every group's fit fails
    base = ["--by", "k", "--target", "y", "--features", "x", "--model",
            "sklearn.linear_model.LinearRegression", "--store", tmp_path / "s"]

    cli = run_cli

    assert cli("train", good, *base).returncode == 0
    assert cli("train", bad, *base, "--allow-failures").returncode == 0
    out = tmp_path / "p.csv"
    missing = cli("predict", tmp_path / "s", good, "--out", out, "--run", "99")
    assert missing.returncode == 2 and "Invalid value for --run" in missing.stderr
    done = cli("predict", tmp_path / "s", good, "--out", out)
    assert done.returncode == 0, done.stderr
    predicted = pd.read_csv(out)
    assert predicted["prediction"].notna().all()
    assert (predicted["source"] == "group").all()
    np.testing.assert_allclose(predicted["prediction"], frame["y"], atol=1e-6)


def test_groups_keep_a_frames_column_labels():
    frame = pd.DataFrame({0: [1, 1, 2, 2], 1: [1.0, 2.0, 3.0, 4.0], "name": list("abcd")})
    seen = {}

    def fit(df):
        seen[df[0].iloc[0]] = list(df.columns)
        return {"total": float(df[1].sum())}

    run = mm.train(fit, mm.groups(frame, by=0), backend="serial", progress=False)
    assert (run.results["status"] == "ok").all()
    assert seen == {1: [0, 1, "name"], 2: [0, 1, "name"]}
    assert run.results[0].tolist() == [1, 2]
    arrays = mm.train(lambda d: {"n": len(d[1])}, mm.groups(frame, by=0, format="numpy"),
                      backend="serial", progress=False)
    assert arrays.results["n"].tolist() == [2, 2]
    # Arrow's (and polars') column names are strings: the labels' text (docs/guide/sources.md)
    tables = mm.train(lambda t: t.column_names, mm.groups(frame, by=0, format="arrow"),
                      backend="serial", progress=False)
    assert tables.models[1] == ["0", "1", "name"]
    assert tables.results[0].tolist() == [1, 2]  # (the key column keeps its label)


def _grouped_arrays(seed=0):
    rng = np.random.default_rng(seed)
    groups = np.repeat([0, 1, 2], 40)
    x = rng.normal(size=(120, 2))
    y = x @ [1.0, -1.0] * (groups + 1) + groups
    return np.column_stack([groups, x]), y, groups


def test_grouped_estimator_on_a_numpy_array_fits_every_group():
    X, y, groups = _grouped_arrays()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        model = GroupedEstimator(LinearRegression(), by=0, backend="serial").fit(X, y)
    assert sorted(model.models_) == [0.0, 1.0, 2.0]
    assert model.failed_.empty
    np.testing.assert_allclose(model.predict(X), y, atol=1e-9)  # exact per-group fits


def test_grouped_estimator_raises_when_every_group_fails():
    X, y, _ = _grouped_arrays()
    with pytest.raises(RuntimeError, match="every group's fit failed"):
        GroupedEstimator(Ridge(solver="cholesky", positive=True), by=0,
                         backend="serial").fit(X, y)


def test_grouped_estimator_takes_string_keys_in_an_object_array():
    X, y, groups = _grouped_arrays()
    names = np.array(["north", "south", "east"])[groups]
    X_obj = np.column_stack([X[:, 1], names, X[:, 2]]).astype(object)
    model = GroupedEstimator(LinearRegression(), by=1, backend="serial").fit(X_obj, y)
    assert sorted(model.models_) == ["east", "north", "south"]
    np.testing.assert_allclose(model.predict(X_obj), y, atol=1e-9)


@pytest.mark.parametrize("kind", ["polars", "arrow"])
def test_grouped_estimator_takes_polars_and_arrow_tables(kind):
    X, y, groups = _grouped_arrays()
    frame = pd.DataFrame({"g": groups, "a": X[:, 1], "b": X[:, 2]})
    table = pl.from_pandas(frame) if kind == "polars" else pa.Table.from_pandas(frame)
    model = GroupedEstimator(LinearRegression(), by="g", backend="serial").fit(table, y)
    assert sorted(model.models_) == [0, 1, 2]
    np.testing.assert_allclose(model.predict(table), y, atol=1e-9)


@pytest.mark.parametrize("keys, dtype", [
    ([-5, -5, 0, 0, 0, 7, 10**12], "int64"),  # sorted: found from where the key changes
    ([-5, -5, 0, 0, 7, 100], "int8"),
    ([0, 0, 7, 2**32 - 1], "uint32"),
    *[(keys, dtype) for keys in (
        [3, 3, 3],  # one group
        [4, 1, 1, 9, 4],  # not in order: pandas sorts
        [1, 2, 2, 3, 1],  # in order but for the last row
    ) for dtype in ("int8", "int64", "uint32")],
])
def test_groups_of_an_int_key_in_order_equal_pandas_groups(keys, dtype):
    from manymodels.inputs.tables import presorted_group_lengths
    from manymodels.planning.plan import group_layout

    frame = pd.DataFrame({"g": np.array(keys, dtype=dtype), "row": range(len(keys))})
    expected = frame.groupby("g", sort=True).ngroup().to_numpy()
    lengths = presorted_group_lengths(pa.Table.from_pandas(frame), ["g"])
    in_order = all(a <= b for a, b in zip(keys, keys[1:]))
    assert (lengths is not None) == in_order
    if in_order:  # the groups pandas numbers, in order, each as long
        np.testing.assert_array_equal(np.repeat(np.arange(len(lengths)), lengths), expected)
    layout = group_layout(mm.groups(frame, by="g"))
    sizes = frame.groupby("g", sort=True).size()
    assert [key[0] for key in layout.keys] == sizes.index.tolist()
    assert layout.lengths.tolist() == sizes.tolist()
    rows = layout.table.column("row").to_pylist()
    for (key,), offset, length in zip(layout.keys, layout.offsets, layout.lengths):
        assert rows[offset:offset + length] == frame.index[frame["g"] == key].tolist()


def _model_of_key(rows, key):
    return ("model", key)


def test_integer_keys_with_a_missing_one_keep_every_digit(tmp_path):
    """Integer keys with a missing value are nullable integers in the results,
    the run's and the store's: pandas made them floats, and keys past 2**53
    read the same."""
    big = 2**53
    frame = pd.DataFrame({"g": pd.array([big, big + 1, None], dtype="Int64"), "x": [1, 2, 3]})
    run = mm.train(_model_of_key, mm.groups(frame, by="g"), backend="serial",
                   store=tmp_path / "s", progress=False)
    for results in (run.results, mm.Store(tmp_path / "s").results()):
        assert str(results["g"].dtype) == "Int64"
        assert results["g"].iloc[:2].tolist() == [big, big + 1]
        assert results["g"].isna().tolist() == [False, False, True]
    assert run.models[big + 1] == ("model", big + 1)


KEY_DTYPES = {
    "int32": np.array([3, 1, 3, 1], dtype="int32"),
    "uint8": np.array([200, 1, 200, 1], dtype="uint8"),
    "float32": np.array([0.5, 1.5, 0.5, 1.5], dtype="float32"),
    "category": pd.Categorical(["x", "y", "x", "y"], categories=["z", "y", "x"]),
    "seconds": pd.to_datetime(["2024-01-01", "2024-02-01"] * 2).astype("datetime64[s]"),
    "nullable": pd.array([7, None, 7, None], dtype="Int32"),
    "boolean": pd.array([True, None, True, None], dtype="boolean"),
}


def _windows_fit(rows):
    return LinearRegression().fit(rows[["x"]], rows["y"])


@pytest.mark.parametrize("kind", list(KEY_DTYPES))
def test_results_keep_the_dtypes_of_the_tables_key_columns(kind):
    """run.results, run.evaluation and run.forecasts type the key columns
    as the table did, as the rows fit got them: an int32 key came back
    int64, a categorical one as text, a datetime64[s] one in microseconds."""
    frame = pd.DataFrame({"k": pd.Series(KEY_DTYPES[kind]).repeat(6).reset_index(drop=True),
                          "t": np.tile(np.arange(6), 4), "x": np.arange(24.0)})
    frame["y"] = 2 * frame["x"]
    expected = frame["k"].dtype
    run = mm.train(_windows_fit, mm.groups(frame, by="k"), backend="serial", progress=False,
                   evaluate=mm.backtest(time="t", horizon=1, windows=2, target="y"))
    assert run.results["k"].dtype == expected
    assert run.evaluation["k"].dtype == expected and len(run.evaluation) == 4
    assert run.forecasts["k"].dtype == expected
    # each group's own model, under its own key
    assert run.results["k"].tolist() == frame.groupby("k", sort=True, dropna=False,
                                                       observed=True).size().index.tolist()
    grid = mm.train(lambda rows, a: float(a), mm.groups(frame, by="k") * mm.grid(a=[1, 2]),
                    backend="serial", progress=False)
    assert grid.results["k"].dtype == expected
    assert grid.results["a"].tolist() == [1, 2, 1, 2]


@pytest.mark.parametrize("kind", ["arrow", "polars"])
def test_results_give_integer_keys_with_a_missing_one_of_a_table_their_width(kind):
    table = pa.table({"k": pa.array([1, None, 1, 300], pa.int16()), "x": [1.0, 2.0, 3.0, 4.0]})
    source = table if kind == "arrow" else pl.from_arrow(table)
    run = mm.train(lambda rows: len(rows), mm.groups(source, by="k"), backend="serial",
                   progress=False)
    assert str(run.results["k"].dtype) == "Int16"
    assert run.results["k"].tolist()[:2] == [1, 300] and run.results["k"].isna().tolist()[2]


# -- integers that a missing value made floats ------------------------------------------

BIG = 2**53  # past it, a float64 cannot tell n from n + 1


def _rows_per_key(frame):
    return frame["k"].map(lambda k: None if pd.isna(k) else k).tolist()


@pytest.mark.parametrize("values, kind", [([BIG, BIG + 1, BIG + 1, None], pa.int64()),
                                          ([2**64 - 1, 2**64 - 2, None], pa.uint64())])
def test_integer_keys_past_2_53_with_a_missing_one_stay_apart(values, kind):
    table = pa.table({"k": pa.array(values, kind), "x": np.arange(len(values), dtype=float)})
    run = mm.train(lambda rows: len(rows), mm.groups(table, by="k"), backend="serial",
                   progress=False)
    counts = {(None if pd.isna(k) else int(k)): n
              for k, n in zip(run.results["k"], run.models.values())}
    expected = {}
    for value in values:
        expected[value] = expected.get(value, 0) + 1
    assert counts == expected


def _frame_with_missing_int_keys():
    keys = pd.array([1, 1, 1, 2, 2, 2, None, None, None], dtype="Int64")
    x = np.tile([0.0, 1.0, 2.0], 3)
    return pd.DataFrame({"k": keys, "x": x, "y": x * keys.fillna(10).to_numpy(dtype=float)})


@pytest.mark.parametrize("as_table", [lambda f: f, pa.Table.from_pandas,
                                      lambda f: pl.from_pandas(f)],
                         ids=["pandas", "arrow", "polars"])
def test_predict_routes_integer_keys_with_a_missing_one(tmp_path, as_table):
    """Keys 1 and 2 beside a missing key read as 1.0 and 2.0 somewhere on
    the way, and no row found its model."""
    frame = _frame_with_missing_int_keys()
    mm.train(fit_lr, mm.groups(frame, by="k"), store=tmp_path / "s", backend="serial",
             progress=False)
    predicted = mm.Store(tmp_path / "s").predict(as_table(frame), by="k", features=["x"],
                                                 with_source=True)
    assert (predicted["source"] == "group").all()
    np.testing.assert_allclose(predicted["prediction"], frame["y"], atol=1e-9)


def test_predict_finds_a_whole_number_key_typed_otherwise(tmp_path):
    """A key trained as text "1" (a CSV column with a letter in it) and
    asked for as the number 1, or trained as 1.0 and asked for as 1."""
    for trained, asked in ((["1", "22"], [1, 22]), ([1.0, 22.0], [1, 22]), ([1, 22], ["1", "22"])):
        path = tmp_path / f"s-{type(trained[0]).__name__}-{type(asked[0]).__name__}"
        frame = _table(trained)
        mm.train(fit_lr, mm.groups(frame, by="k"), store=path, backend="serial",
                 progress=False)
        new = frame.assign(k=frame["k"].map(dict(zip(trained, asked))))
        predicted = mm.Store(path).predict(new, by="k", features=["x"], with_source=True)
        assert (predicted["source"] == "group").all(), (trained, asked)
        np.testing.assert_allclose(predicted["prediction"], frame["y"], atol=1e-9)


def test_changing_an_integer_past_2_53_beside_a_missing_one_retrains(tmp_path):
    """As floats, 2**53 + 1 and 2**53 hashed the same: the group kept its
    stale model."""
    def fit_values(rows):
        return rows["v"].tolist()

    frame = pd.DataFrame({"k": ["a", "a", "b", "b"],
                          "v": pd.array([1, None, 1, BIG + 1], dtype="Int64")})
    mm.train(fit_values, mm.groups(frame, by="k"), store=tmp_path / "s", backend="serial",
             progress=False)
    changed = frame.assign(v=pd.array([1, None, 1, BIG], dtype="Int64"))
    run = mm.train(fit_values, mm.groups(changed, by="k"), store=tmp_path / "s",
                   backend="serial", progress=False)
    assert run.results.set_index("k")["reused"].to_dict() == {"a": True, "b": False}
    assert run.models["b"] == [1, BIG]


def _echo(item, params=None):
    return item


def test_the_store_finds_a_tuple_item_key_and_a_key_with_a_grid_dict(tmp_path):
    """A one-column key whose values are tuples was read as a key of several
    columns; a dict of settings, stored as its text, was not found by the
    text the store gives back (manymodels why showed a traceback)."""
    mm.train(_echo, mm.items([("a", 1), ("b", 2)]), store=tmp_path / "tuples",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "tuples")
    assert store.load(("a", 1)) == ("a", 1)
    assert "no earlier run" in store.why_not_reused(("b", 2))
    mm.train(_echo, mm.items([1]) * mm.grid(params=[{"a": 10}]), store=tmp_path / "dicts",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "dicts")
    (key,) = store.models()  # as the store gives it back: the dict as text
    assert store.load(key) == 1 and store.load((1, {"a": 10})) == 1
    done = run_cli("why", tmp_path / "dicts", "1", "{'a': 10}")
    assert done.returncode == 0 and "was trained" in done.stdout, done.stderr


def test_predict_by_columns_the_run_was_not_keyed_by_is_refused(tmp_path):
    """Every row went to the fallback, quietly (exit 0 in the CLI)."""
    frame = _table(["a", "b"])
    good = tmp_path / "rows.csv"
    frame.to_csv(good, index=False)
    done = run_cli("train", good, "--by", "k", "--target", "y", "--features", "x", "--model",
                   "sklearn.linear_model.LinearRegression", "--store", tmp_path / "s")
    assert done.returncode == 0, done.stderr
    with pytest.raises(ValueError, match=r"by='x', but the models of run 1 are keyed by \['k'\]"):
        mm.Store(tmp_path / "s").predict(frame, by="x")
    np.testing.assert_allclose(mm.Store(tmp_path / "s").predict(frame, by="k"), frame["y"],
                               atol=1e-6)


class _Offset:
    def __init__(self, value: float) -> None:
        self.value = value

    def predict(self, rows):
        return np.full(len(rows), self.value)


def _fit_offset(rows, key=None):
    parts = key if isinstance(key, tuple) else (key,)
    return _Offset(float(sum(hash(str(p)) % 1000 for p in parts)))


def test_predict_by_is_checked_against_the_runs_own_key_columns(tmp_path):
    """A store written by mm.train (no train_config): by= in another order
    than the run's key columns took each row to another group's model, and
    by= naming an earlier run's key column to the latest run's models."""
    store = tmp_path / "s"
    frame = pd.DataFrame({"a": [1, 2], "b": [2, 1], "x": [0.0, 0.0]})
    first = mm.train(_fit_offset, mm.groups(frame, by=["a", "b"]), store=store,
                     backend="serial", progress=False)
    registry = mm.Store(store)
    by_hand = [registry.load((1, 2)).value, registry.load((2, 1)).value]
    assert list(registry.predict(frame, by=["b", "a"])) == by_hand  # (the run's order)
    assert list(registry.predict(frame)) == by_hand  # by= left out: the run's key columns
    assert list(first.predict(frame)) == by_hand
    regions = pd.DataFrame({"region": [1, 2], "x": [0.0, 0.0]})
    mm.train(_fit_offset, mm.groups(regions, by="region"), store=store, backend="serial",
             progress=False)
    with pytest.raises(ValueError, match=r"by=\['a', 'b'\], but the models of run 2 are keyed "
                                         r"by \['region'\].*run="):
        registry.predict(frame, by=["a", "b"])
    assert list(registry.predict(frame, by=["a", "b"], run=1)) == by_hand


def _fit_level(rows):
    return _Offset(float(rows["x"].iloc[0]))


@pytest.mark.parametrize("first, later", [
    ([1, 2], ["1", "2"]),
    ([1.0, 2.0], [1, 2]),
    (pd.to_datetime(["2024-01-01 10:00", "2024-01-02 10:00"]).tz_localize("Europe/Amsterdam"),
     pd.to_datetime(["2024-01-01 09:00", "2024-01-02 09:00"]).tz_localize("UTC")),
], ids=["int-then-text", "float-then-int", "zone-then-utc"])
def test_the_latest_run_replaces_a_group_typed_otherwise_in_an_earlier_run(
        tmp_path, first, later):
    """One group, its key typed otherwise in the re-run (a CSV read as text,
    another zone): predict used the earlier run's model for rows typed as
    it was."""
    store = tmp_path / "s"
    for keys, level in ((first, 0.0), (later, 1000.0)):
        frame = pd.DataFrame({"k": keys, "x": [level + 10, level + 20]})
        mm.train(_fit_level, mm.groups(frame, by="k"), store=store, backend="serial",
                 progress=False)
    registry = mm.Store(store)
    for keys in (first, later):
        rows = pd.DataFrame({"k": keys, "x": [0.0, 0.0]})
        assert list(registry.predict(rows, by="k")) == [1010.0, 1020.0]


def _fit_line_y(rows):
    from sklearn.linear_model import LinearRegression

    return LinearRegression().fit(rows[["x"]], rows[["y"]])  # (a one-column y: (n, 1) out)


def test_predictions_in_other_shapes_are_one_value_a_row_in_the_rows_order(tmp_path):
    """A Series under the rows' labels in another order is aligned by label;
    a model fitted on a one-column y answers (n, 1): a column; a scalar is
    refused naming the group."""
    frame = pd.DataFrame({"g": ["a"] * 3 + ["b"] * 3, "x": [1.0, 2.0, 3.0] * 2,
                          "y": [2.0, 4.0, 6.0, 3.0, 6.0, 9.0]})
    mm.train(_fit_line_y, mm.groups(frame, by="g"), store=tmp_path / "s", backend="serial",
             progress=False)
    store = mm.Store(tmp_path / "s")
    rows = pd.DataFrame({"g": ["b", "a", "a"], "x": [1.0, 3.0, 2.0]}, index=[7, 7, 3])
    plain = store.predict(rows, by="g")
    assert plain.dtype == float and plain.round(9).tolist() == [3.0, 6.0, 4.0]
    assert list(plain.index) == [7, 7, 3]

    def sorted_first(model, part):  # a forecaster that sorts its rows by time
        ordered = part.sort_values("x", ascending=False)
        return pd.Series(model.predict(ordered[["x"]])[:, 0], index=ordered.index)

    assert store.predict(rows, by="g", fn=sorted_first).round(9).tolist() == [3.0, 6.0, 4.0]
    with pytest.raises(RuntimeError, match=r"group 'a' failed(.|\n)*is one value .*not one for "
                                           r"each of its 2 rows"):
        store.predict(rows, by="g", fn=lambda model, part: 1.0)


def _fit_key_number(rows, key=None):
    return _Offset(float(key))


def test_load_and_models_find_a_whole_number_key_however_it_is_typed(tmp_path):
    """predict found 2.0 and "2" for the key 2; Store.load, store.models()
    and run.models did not."""
    frame = pd.DataFrame({"k": [1, 2, 2], "x": [0.0, 0.0, 0.0]})
    run = mm.train(_fit_key_number, mm.groups(frame, by="k"), store=tmp_path / "s",
                   backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    for key in (2, 2.0, np.float64(2.0), "2", np.int32(2)):
        assert store.load(key).value == 2.0
        assert store.models()[key].value == 2.0 and run.models[key].value == 2.0
    with pytest.raises(KeyError):
        store.load("2.5")
    assert "3" not in run.models


def test_a_grid_of_none_and_nan_finds_each_ones_model():
    """Two settings, None and NaN: run.models[nan] gave None's model (a new
    NaN equals no key, and a missing key was then looked up as None)."""
    run = mm.train(lambda a: f"model of {a!r}", mm.grid(a=[None, float("nan")]),
                   backend="serial", progress=False)
    assert run.models[None] == "model of None"
    assert run.models[float("nan")] == run.models[np.float64("nan")] == "model of nan"
    grouped = mm.train(lambda rows: len(rows), mm.groups(pd.DataFrame(
        {"g": [1.0, np.nan, np.nan]}), by="g"), backend="serial", progress=False)
    assert grouped.models[float("nan")] == 2  # a missing group key, held as None: found


def _fit_classes(rows):
    from sklearn.linear_model import LogisticRegression

    return LogisticRegression().fit(rows[["x"]], rows["label"])


def test_predict_proba_of_groups_that_saw_different_classes_is_each_rows_own(tmp_path):
    """Group 'a' saw 3 classes and 'b' 2: their predict_proba rows are 3 and
    2 wide. Joining them as one matrix raised NumPy's concatenation error
    after every group had run; each row gets its own model's probabilities."""
    frame = pd.DataFrame({"g": ["a"] * 6 + ["b"] * 4, "x": np.arange(10.0),
                          "label": [0, 0, 1, 1, 2, 2, 0, 0, 1, 1]})
    mm.train(_fit_classes, mm.groups(frame, by="g"), store=tmp_path / "s", backend="serial",
             progress=False)
    store = mm.Store(tmp_path / "s")
    rows = pd.DataFrame({"g": ["b", "a", "zz", "a"], "x": [1.0, 3.0, 2.0, 5.0]},
                        index=[4, 4, 9, 0])
    with pytest.warns(RuntimeWarning, match="zz"):
        got = store.predict(rows, by="g", method="predict_proba")
    assert list(got.index) == [4, 4, 9, 0]
    for position, key in [(0, "b"), (1, "a"), (3, "a")]:
        expected = store.load(key).predict_proba(rows.iloc[[position]][["x"]])[0]
        assert np.array_equal(got.iloc[position], expected)
    assert np.isnan(got.iloc[2]).all()


def _fit_on_arrays(rows):
    return LinearRegression().fit(np.column_stack([rows["x1"], rows["x2"]]), rows["y"])


def test_a_model_fitted_on_arrays_is_refused_more_columns_than_it_read(tmp_path):
    """A model with n_features_in_ but no names reads columns by position:
    the target left in the table made every group fail on a matrix product
    (the linear shortcut) deep in a traceback. It is refused before any
    group runs, naming the columns; features= picks the model's own."""
    frame = pd.DataFrame({"g": ["a", "b"] * 4, "x1": np.arange(8.0), "x2": np.arange(8.0) ** 2,
                          "y": np.arange(8.0) * 3})
    mm.train(_fit_on_arrays, mm.groups(frame, by="g", format="numpy"), store=tmp_path / "s",
             backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    with pytest.raises(ValueError, match=r"group 'a' was fitted on 2 unnamed feature column"
                                         r".*gives 3: \['x1', 'x2', 'y'\]"):
        store.predict(frame, by="g")
    got = store.predict(frame, by="g", features=["x1", "x2"])
    expected = [store.load(g).predict(frame.loc[[i], ["x1", "x2"]].to_numpy())[0]
                for i, g in frame["g"].items()]
    np.testing.assert_allclose(got.to_numpy(), expected, rtol=0, atol=1e-9)


@pytest.mark.parametrize("retyped", ["zone-aware", "date", "text"])
def test_a_key_column_typed_otherwise_than_the_stored_keys_is_refused_naming_both(
        tmp_path, retyped):
    """Naive datetime keys asked for as zone-aware ones, dates or text match
    no stored key: every row came back NaN (or went to the fallback model,
    silently). The error names the key column and both types."""
    frame = _table(KEY_COLUMNS["datetime"])
    run = mm.train(fit_lr, mm.groups(frame, by="k"), store=tmp_path / "s", backend="serial",
                   progress=False)
    store = mm.Store(tmp_path / "s")
    store.attach(run.run_id, "fallback", LinearRegression().fit(frame[["x"]], frame["y"]))
    keys = {"zone-aware": frame["k"].dt.tz_localize("UTC"), "date": frame["k"].dt.date,
            "text": frame["k"].astype(str)}[retyped]
    said = {"zone-aware": "zone-aware datetimes", "date": "dates", "text": "texts"}[retyped]
    with pytest.raises(ValueError, match=f"key column 'k' of the table to predict holds "
                                         f"{said}.*stored under keys of naive datetimes"):
        store.predict(frame.assign(k=keys), by="k", features=["x"])
    assert store.predict(frame, by="k", features=["x"]).notna().all()  # as trained: found


@pytest.mark.parametrize("kind", ["durations", "datetimes"])
def test_new_groups_of_the_stored_keys_kind_go_to_the_fallback(tmp_path, kind):
    """Keys of the stored keys' own kind that no group was trained on go to
    the fallback model: durations were said to be of another kind than the
    stored ``Timedelta`` keys (Arrow gives ``datetime.timedelta``), and
    refused; NumPy's nanosecond datetimes and durations read as numbers."""
    keys = (pd.to_timedelta([1, 2, 3], unit="D") if kind == "durations"
            else pd.to_datetime(["2024-01-01", "2024-02-01", "2024-03-01"]))
    frame = _table(keys)
    run = mm.train(fit_lr, mm.groups(frame, by="k"), store=tmp_path / "s", backend="serial",
                   progress=False)
    store = mm.Store(tmp_path / "s")
    store.attach(run.run_id, "fallback", LinearRegression().fit(frame[["x"]], frame["y"]))
    new = frame.assign(k=frame["k"] + pd.Timedelta("100D"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        predicted = store.predict(new, by="k", features=["x"])
    assert predicted.notna().all()
    from manymodels.run.predictchecks import key_type

    assert key_type(np.asarray(new["k"].astype(f"{new['k'].dtype.kind}8[ns]"))[0]) == key_type(
        decode_key(encode_key((frame["k"].iloc[0],)))[0])  # (.item() of ns: an int)


def test_a_key_with_no_model_but_for_its_spaces_is_said(tmp_path):
    """``"b "`` (a CSV's padding) matched no stored key, silently but for the
    usual no-model warning: it names the stored key it is but for spaces."""
    frame = pd.DataFrame({"k": ["a"] * 5 + ["b"] * 5, "x": np.arange(10.0),
                          "y": np.arange(10.0)})
    mm.train(fit_lr, mm.groups(frame, by="k"), store=tmp_path / "s", backend="serial",
             progress=False)
    asked = pd.DataFrame({"k": ["a", "b "], "x": [1.0, 2.0]})
    with pytest.warns(RuntimeWarning, match=r"'b ' has no model, and 'b', which it is but "
                                            r"for spaces, has"):
        mm.Store(tmp_path / "s").predict(asked, by="k", features=["x"])


@pytest.mark.parametrize("convert, said", [
    (lambda days: days.tz_localize("UTC"), "zone-aware datetimes"),
    (lambda days: [day.date() for day in days], "dates")])
def test_grouped_estimator_refuses_keys_typed_otherwise_than_fitted(convert, said):
    """GroupedEstimator.predict sent a zone-aware datetime or a date key,
    fitted on naive datetimes, to the fallback without a word (Store.predict
    refuses it): refused when no key has its model, warned of when some do."""
    from manymodels.sklearn import GroupedRegressor

    days = pd.to_datetime(["2024-01-01", "2024-01-02"])
    fitted = GroupedRegressor(LinearRegression(), by="day", backend="serial").fit(
        pd.DataFrame({"day": np.repeat(days, 3), "x": np.arange(6.0)}), np.arange(6.0))
    other = list(convert(days))
    with pytest.raises(ValueError, match=f"key column 'day' .* holds {said}"):
        fitted.predict(pd.DataFrame({"day": other, "x": [1.0, 2.0]}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fitted.predict(pd.DataFrame({"day": [days[0], other[1]], "x": [1.0, 2.0]}))
    assert any(said in str(w.message) and "naive datetimes" in str(w.message)
               for w in caught)
