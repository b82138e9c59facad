from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from conftest import BACKENDS


def standardize(df):
    return df.assign(z=(df["x"] - df["x"].mean()) / df["x"].std(), rank=df["y"].rank())


def summarize(df):
    return pd.DataFrame({"mean_x": [df["x"].mean()], "rows": [len(df)]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_groups_equals_pandas_groupby_apply(backend, sales):
    ours = mm.map_groups(standardize, mm.groups(sales, by="store"), backend=backend)
    theirs = (sales.groupby("store", group_keys=False)[list(sales.columns)]
              .apply(standardize).sort_values("store", kind="stable").reset_index(drop=True))
    pd.testing.assert_frame_equal(ours, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_groups_adds_missing_key_columns(backend, sales):
    ours = mm.map_groups(summarize, mm.groups(sales, by=["store", "item"]), backend=backend)
    assert list(ours.columns) == ["store", "item", "mean_x", "rows"]
    expected = sales.groupby(["store", "item"])["x"].mean().reset_index(drop=True)
    pd.testing.assert_series_equal(ours["mean_x"], expected, check_names=False)
    assert (ours["rows"] == 30).all()


def test_map_groups_names_the_failing_group(sales):
    def boom(df):
        if df["store"].iloc[0] == "s04":
            raise KeyError("no such column")
        return df

    expected = r"the first, 's04', with:(.|\n)*KeyError: 'no such column'"
    with pytest.raises(RuntimeError, match=expected):
        mm.map_groups(boom, mm.groups(sales, by="store"), backend="threads")
    kept = mm.map_groups(boom, mm.groups(sales, by="store"), backend="threads",
                         errors="skip")
    assert "s04" not in set(kept["store"]) and len(kept) == len(sales) - 150


def add_features(df):
    out = df.copy()
    out["out"] = np.log1p(df["c0"].abs()) * df["c1"]
    out["label"] = df["c2"].apply(lambda v: "hi" if v > 0 else "lo")
    return out


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_partitions_equals_pandas(backend):
    rng = np.random.default_rng(3)
    table = pd.DataFrame(rng.normal(size=(10_001, 4)), columns=["c0", "c1", "c2", "c3"])
    ours = mm.map_partitions(add_features, table, backend=backend, workers=2)
    pd.testing.assert_frame_equal(ours, add_features(table))
    ours_odd = mm.map_partitions(add_features, table, partitions=7, backend=backend)
    pd.testing.assert_frame_equal(ours_odd, add_features(table))


@pytest.mark.parametrize("start_method", ["fork", "spawn"])
def test_map_partitions_of_a_pandas_frame_keep_its_index(start_method, no_leftovers):
    rng = np.random.default_rng(5)
    table = pd.DataFrame(rng.normal(size=(50_000, 6)), columns=[f"c{i}" for i in range(6)],
                         index=pd.date_range("2020-01-01", periods=50_000, freq="min"))
    table["tag"] = np.where(table["c3"] > 0, "up", "down")
    ours = mm.map_partitions(add_features, table, partitions=6, start_method=start_method)
    pd.testing.assert_frame_equal(ours, add_features(table))  # the outputs came back spilled
    assert table.shape == (50_000, 7)  # the caller's frame is untouched


def drop_negative(df):
    return df[df["c0"] > 0]


def test_map_partitions_output_may_change_the_row_count():
    table = pd.DataFrame({"c0": np.linspace(-1, 1, 1001), "c1": np.arange(1001)})
    ours = mm.map_partitions(drop_negative, table, partitions=4, workers=2)
    pd.testing.assert_frame_equal(ours, drop_negative(table))


def arrow_double(batch):
    import pyarrow.compute as pc

    return batch.set_column(0, "c0", pc.multiply(batch["c0"], 2))


def test_map_partitions_keeps_the_kind_of_table():
    import pyarrow as pa

    table = pa.table({"c0": np.arange(1000.0), "c1": np.ones(1000)})
    out = mm.map_partitions(arrow_double, table, partitions=5, format="arrow")
    assert isinstance(out, pa.Table)
    assert out["c0"].to_pylist() == [2.0 * i for i in range(1000)]


def test_map_partitions_bad_input():
    with pytest.raises(ValueError, match="partitions must be an integer >= 1"):
        mm.map_partitions(add_features, pd.DataFrame({"c0": [1.0]}), partitions=0)
    with pytest.raises(ValueError, match="empty"):
        mm.map_partitions(add_features, pd.DataFrame({"c0": []}))
