from __future__ import annotations

import os
import time

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import manymodels as mm
from conftest import BACKENDS


def standardize(df):
    return df.assign(z=(df["x"] - df["x"].mean()) / df["x"].std(), rank=df["y"].rank())


def summarize(df):
    return pd.DataFrame({"mean_x": [df["x"].mean()], "rows": [len(df)]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_groups_equals_pandas_groupby_apply(backend, sales):
    # a transform: the rows come back in the frame's order, under its row labels
    ours = mm.map_groups(standardize, mm.groups(sales, by="store"), backend=backend)
    theirs = sales.groupby("store", group_keys=False)[list(sales.columns)].apply(standardize)
    pd.testing.assert_frame_equal(ours, theirs)


def zscore(x):
    return (x - x.mean()) / x.std()


def test_map_groups_result_assigns_back_to_the_frame(sales):
    # sales is not sorted by store: a result in key order under a fresh
    # RangeIndex would put each z on another row
    expected = sales.groupby("store")["x"].transform(zscore)
    sales["z"] = mm.map_groups(standardize, mm.groups(sales, by="store"), backend="threads")["z"]
    pd.testing.assert_series_equal(sales["z"], expected, check_names=False)

    def boom(df):
        if df["store"].iloc[0] == "s04":
            raise KeyError("no such column")
        return standardize(df)

    kept = mm.map_groups(boom, mm.groups(sales, by="store"), backend="threads", errors="skip")
    rest = sales[sales["store"] != "s04"]
    pd.testing.assert_index_equal(kept.index, rest.index)  # the others' rows, in order
    sales["z"] = kept["z"]
    assert sales.loc[sales["store"] == "s04", "z"].isna().all()
    pd.testing.assert_series_equal(sales.loc[rest.index, "z"], expected[rest.index],
                                   check_names=False)


def test_map_groups_of_a_transform_that_drops_whole_groups(sales):
    def six_stores_only(df):  # a group's rows as they are, or none of them
        return standardize(df) if df["store"].iloc[0] < "s06" else df.iloc[:0]

    ours = mm.map_groups(six_stores_only, mm.groups(sales, by="store"), backend="serial")
    theirs = sales.groupby("store", group_keys=False)[list(sales.columns)].apply(six_stores_only)
    pd.testing.assert_frame_equal(ours, theirs.sort_index())


def test_map_groups_of_a_frame_with_its_own_row_labels(sales):
    frame = sales.set_axis([f"row{i}" for i in range(len(sales))][::-1])
    frame["z"] = mm.map_groups(standardize, mm.groups(frame, by="store"), backend="serial")["z"]
    expected = frame.groupby("store")["x"].transform(zscore)
    pd.testing.assert_series_equal(frame["z"], expected, check_names=False)


def test_map_groups_of_an_arrow_table_or_a_file_labels_rows_by_position(sales, tmp_path):
    # no row labels: the result is labelled, and ordered, by the input's row positions,
    # as pandas would do on the table converted to pandas
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    shuffled = sales.iloc[::-1].reset_index(drop=True)
    table = pa.Table.from_pandas(shuffled, preserve_index=False)
    pq.write_table(table, tmp_path / "sales.parquet")
    theirs = shuffled.groupby("store", group_keys=False)[list(sales.columns)].apply(standardize)
    for data in (table, pl.from_arrow(table), tmp_path / "sales.parquet"):
        ours = mm.map_groups(standardize, mm.groups(data, by="store"), backend="serial")
        pd.testing.assert_frame_equal(ours, theirs)
    ours = mm.map_groups(standardize, mm.groups(tmp_path / "sales.parquet", by="store",
                                                read_on_workers=True), backend="serial")
    pd.testing.assert_frame_equal(ours, theirs)


def test_map_groups_with_a_grid_keeps_key_order(sales):
    def scaled(df, factor):
        return df.assign(x=df["x"] * factor)

    ours = mm.map_groups(scaled, mm.groups(sales, by="store") * mm.grid(factor=[1, 2]),
                         backend="serial")
    assert list(ours.columns) == ["store", "factor", "item", "x", "y"]
    assert len(ours) == 2 * len(sales) and ours["store"].is_monotonic_increasing
    pd.testing.assert_index_equal(ours.index, pd.RangeIndex(2 * len(sales)))


def centered_x(df):
    return df["x"] - df["x"].mean()


def x_and_y_means(df):
    return df[["x", "y"]].mean()


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_map_groups_of_a_series(backend, sales):
    # a Series indexed like its group: one Series, under the frame's row labels
    ours = mm.map_groups(centered_x, mm.groups(sales, by="store"), backend=backend)
    assert isinstance(ours, pd.Series)
    expected = sales.groupby("store")["x"].transform(lambda x: x - x.mean())
    pd.testing.assert_series_equal(ours, expected)
    # one Series of the same labels per group: a row per group, as pandas makes it
    ours = mm.map_groups(x_and_y_means, mm.groups(sales, by=["store", "item"]), backend=backend)
    theirs = (sales.groupby(["store", "item"], as_index=False)[list(sales.columns)]
              .apply(x_and_y_means))
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


def with_pid(df):
    return df.assign(out=df["c0"] * 2, pid=os.getpid())


def slow_with_pid(df):
    time.sleep(0.001 * len(df))  # a millisecond a row, off the CPU: load-proof
    return df.assign(out=df["c0"] * 2, pid=os.getpid())


def test_map_partitions_runs_a_fast_function_in_process_and_says_why(no_leftovers):
    rng = np.random.default_rng(7)
    table = pd.DataFrame(rng.normal(size=(200_000, 4)), columns=["c0", "c1", "c2", "c3"])
    ours = mm.map_partitions(with_pid, table, workers=2)
    pd.testing.assert_frame_equal(ours, with_pid(table))
    assert (ours["pid"] == os.getpid()).all()  # no worker: this process, one call
    summary = ours.attrs["summary"]
    assert (summary.tasks, summary.workers, summary.ok) == (1, 1, 1)
    assert summary.split.startswith("in-process, not split: splitting cannot pay")
    assert "in-process, not split" in str(summary)
    same = mm.map_partitions(lambda df: df, table)  # fn's own frame back: attrs on a copy
    assert "summary" in same.attrs and "summary" not in table.attrs
    arrow = pa.table({"c0": np.arange(1000.0), "c1": np.ones(1000)})
    out = mm.map_partitions(arrow_double, arrow, format="arrow")
    assert out["c0"].to_pylist() == [2.0 * i for i in range(1000)]


def test_map_partitions_still_splits_a_slow_function(no_leftovers):
    table = pd.DataFrame({"c0": np.arange(4000.0)})
    # forked, as they are unless polars or torch is imported (another test may have):
    # spawned workers take a second or more to start, which 2 s of work may not repay
    ours = mm.map_partitions(slow_with_pid, table, workers=4, start_method="fork")
    assert ours["out"].tolist() == (table["c0"] * 2).tolist()
    assert os.getpid() not in set(ours["pid"])
    summary = ours.attrs["summary"]
    assert summary.tasks == 16 and summary.workers == 4
    assert summary.split.startswith("split into 16 partitions: the function takes about")
    asked = mm.map_partitions(with_pid, table, partitions=3, workers=2)  # told how: split
    assert asked.attrs["summary"].split == "split into 3 partitions, as the call asked"
    assert os.getpid() not in set(asked["pid"])


def test_map_partitions_in_process_failure_raises_as_a_split_one():
    def fails_on_the_whole(df):
        if len(df) > 100:
            raise ValueError("too many rows")
        return df

    table = pd.DataFrame({"c0": np.arange(10_000.0)})
    with pytest.raises(RuntimeError, match="(?s)map_partitions: 1 task.*too many rows"):
        mm.map_partitions(fails_on_the_whole, table, workers=2)


def test_map_partitions_checks_fn_as_train_does_and_gives_its_key_in_process():
    """A fast fn run in this process: a parameter no call gives is refused
    before fn is called (as train refuses it), and ``key`` is the one
    partition's, 0, as a split run gives each partition its number."""
    table = pd.DataFrame({"c0": np.arange(10_000.0)})
    calls = []

    def needs_extra(df, extra):
        calls.append(len(df))
        return df

    with pytest.raises(TypeError, match="parameter 'extra' has no default"):
        mm.map_partitions(needs_extra, table, workers=2)
    assert calls == []  # not even timed

    def with_key(df, key):
        return df.assign(part=key)

    out = mm.map_partitions(with_key, table, workers=2)
    assert out.attrs["summary"].split.startswith("in-process, not split")
    assert set(out["part"]) == {0}


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


def doubled_c0(df):
    return df["c0"] * 2


def test_map_partitions_of_a_series_returns_a_series():
    import pyarrow as pa

    table = pd.DataFrame({"c0": np.arange(1000.0), "c1": np.ones(1000)},
                         index=pd.RangeIndex(5000, 6000))
    ours = mm.map_partitions(doubled_c0, table, partitions=4, workers=2)
    pd.testing.assert_series_equal(ours, doubled_c0(table))
    ours = mm.map_partitions(doubled_c0, pa.Table.from_pandas(table, preserve_index=False),
                             partitions=3, format="pandas", backend="threads")
    pd.testing.assert_series_equal(ours, doubled_c0(table.reset_index(drop=True)))


def arrow_c0_doubled(batch):
    import pyarrow.compute as pc

    return pc.multiply(batch["c0"], 2)


def test_map_partitions_of_an_arrow_array_returns_one_array():
    import pyarrow as pa

    table = pa.table({"c0": np.arange(1000.0)})
    out = mm.map_partitions(arrow_c0_doubled, table, partitions=5, format="arrow",
                            backend="threads")
    assert isinstance(out, pa.ChunkedArray)
    assert out.to_pylist() == [2.0 * i for i in range(1000)]


def test_map_groups_of_arrow_and_polars_outputs_adds_missing_key_columns(sales):
    import polars as pl
    import pyarrow as pa
    import pyarrow.compute as pc

    def arrow_mean(table):
        return pa.table({"mean_x": [pc.mean(table["x"]).as_py()]})

    def polars_mean(frame):
        return pl.DataFrame({"mean_x": [frame["x"].mean()]})

    expected = sales.groupby("store", as_index=False)["x"].mean().rename(columns={"x": "mean_x"})
    ours = mm.map_groups(arrow_mean, mm.groups(sales, by="store", format="arrow"),
                         backend="serial")
    assert isinstance(ours, pa.Table)
    pd.testing.assert_frame_equal(ours.to_pandas(), expected)
    kept = mm.map_groups(lambda table: table, mm.groups(sales, by="store", format="arrow"),
                         backend="serial")  # key columns already there: kept as they are
    assert kept.column_names == list(sales.columns) and kept.num_rows == len(sales)
    ours = mm.map_groups(polars_mean, mm.groups(sales, by="store", format="polars"),
                         backend="serial")
    assert isinstance(ours, pl.DataFrame)
    pd.testing.assert_frame_equal(ours.to_pandas(), expected)


def sorted_and_renumbered(df):
    return df.sort_values("x", ascending=False).reset_index(drop=True)


def labels_seen(df, key):
    return pd.DataFrame({"key": [key] * len(df), "label": list(df.index)})


def test_map_groups_hands_each_group_its_labels_and_tells_a_reorder_from_a_transform():
    """Under a fresh index 0, 1, ... a group sorted and renumbered looked
    like a transform, and its rows came back under other rows' labels."""
    frame = pd.DataFrame({"g": ["b", "a", "b", "a"], "x": [10.0, 20, 30, 40]},
                         index=[100, 101, 102, 103])
    ours = mm.map_groups(sorted_and_renumbered, mm.groups(frame, by="g"), backend="threads")
    assert ours["x"].tolist() == [40.0, 20.0, 30.0, 10.0]  # key order, as pandas gives
    pd.testing.assert_index_equal(ours.index, pd.RangeIndex(4))
    seen = mm.map_groups(labels_seen, mm.groups(frame, by="g"), backend="processes",
                         workers=2)
    assert seen.groupby("key")["label"].apply(list).to_dict() == {"a": [101, 103],
                                                                  "b": [100, 102]}
    one_row = pd.DataFrame({"g": ["z", "y"], "x": [1.0, 2.0]}, index=[7, 8])
    means = mm.map_groups(lambda df: pd.DataFrame({"m": [df["x"].mean()]}),
                          mm.groups(one_row, by="g"), backend="serial")
    assert means["g"].tolist() == ["y", "z"]  # an aggregation: key order, not input order


def mean_unless_3(df):
    return None if df["x"].iloc[0] == 3 else pd.DataFrame({"m": [df["x"].mean()]})


def test_map_groups_leaves_out_a_group_whose_fn_returned_none():
    """As pandas' apply does; it raised 'must return a table, got NoneType'
    without naming the group."""
    frame = pd.DataFrame({"g": ["a", "a", "b", "c"], "x": [1.0, 2, 3, 4]})
    ours = mm.map_groups(mean_unless_3, mm.groups(frame, by="g"), backend="serial")
    assert ours.to_dict("list") == {"g": ["a", "c"], "m": [1.5, 4.0]}


def add_shared_key(df, **shared):
    return df.assign(k=shared["key"])


def sorted_and_ranked(rows, **shared):
    """Sorts its group and numbers it under a fresh index: what a transform of
    rows without labels looks like, rows in another order."""
    rows = rows.to_pandas() if hasattr(rows, "to_pandas") and not isinstance(
        rows, pd.DataFrame) else rows
    return rows.sort_values("x").reset_index(drop=True).assign(rank=lambda d: range(len(d)))


@pytest.mark.parametrize("how", ["shared key", "arrow"])
def test_groups_without_their_labels_come_back_in_key_order_never_under_other_rows(how):
    """fn gets a group under a fresh index where its labels cannot reach it
    (a shared object named key reaches its **shared; an Arrow group
    has none): a sorted group under a fresh index looks like a transform, so
    no output of such groups is put back under the input's labels. The
    outputs come in key order under a fresh index, each row with its own
    values."""
    frame = pd.DataFrame({"g": ["b", "a", "b", "a"], "x": [3.0, 2, 1, 0]},
                         index=[10, 11, 12, 13])
    if how == "shared key":
        ours = mm.map_groups(add_shared_key, mm.groups(frame, by="g"), backend="serial",
                             shared={"key": 5})
        expected = frame.assign(k=5).sort_values("g", kind="stable").reset_index(drop=True)
        pd.testing.assert_frame_equal(ours, expected)
        with pytest.raises(ValueError, match="shared name 'key' is also the keyword"):
            mm.map_groups(lambda df, key: df, mm.groups(frame, by="g"), backend="serial",
                          shared={"key": 5})
    ours = mm.map_groups(sorted_and_ranked, mm.groups(
        frame, by="g", **({"format": "arrow"} if how == "arrow" else {})), backend="serial",
        **({"shared": {"key": 5}} if how == "shared key" else {}))
    assert ours.index.equals(pd.RangeIndex(4))
    assert list(zip(ours["g"], ours["x"], ours["rank"])) == [
        ("a", 0.0, 0), ("a", 2.0, 1), ("b", 1.0, 0), ("b", 3.0, 1)]


def test_map_partitions_skip_warns_and_lists_the_partitions_left_out():
    """errors="skip" leaves failing partitions out as map_groups leaves
    groups: with a warning naming them, and attrs["failed"] on pandas."""
    frame = pd.DataFrame({"x": np.arange(100.0)})

    def fragile(part):
        if part["x"].iloc[0] == 0:
            raise ZeroDivisionError("the first partition")
        return part

    with pytest.warns(RuntimeWarning, match=r"map_partitions: 1 partition\(s\) failed"):
        kept = mm.map_partitions(fragile, frame, partitions=4, backend="serial",
                                 errors="skip")
    assert len(kept) == 75 and list(kept.attrs["failed"]) == [0]


def test_arrow_and_polars_outputs_are_unified_as_pandas_outputs_are():
    """Different types or columns per group, and a group whose key is null
    (its key column a null column), concatenate as pandas' concat would."""
    import polars as pl

    frame = pd.DataFrame({"k": ["a", "b", None], "x": [1.0, 2.0, 3.0]})
    source = mm.groups(frame, by="k")  # (a null key is a group of its own)
    arrow = mm.map_groups(lambda rows: pa.table({"s": [1] if rows.x.iloc[0] == 1 else [1.5]}),
                          source, backend="serial")
    assert arrow.schema.field("s").type == pa.float64() and arrow.num_rows == 3
    assert arrow.column("k").to_pylist() == ["a", "b", None]
    polars = mm.map_groups(lambda rows: pl.DataFrame({str(rows.k.iloc[0]): [1.0]}), source,
                           backend="serial")
    assert polars.shape == (3, 4) and polars["k"].to_list() == ["a", "b", None]


def test_a_function_that_cannot_be_called_is_refused_before_any_work():
    frame = pd.DataFrame({"g": [1, 2], "x": [1.0, 2.0]})
    with pytest.raises(TypeError, match="fn must be a function"):
        mm.map_groups(3, mm.groups(frame, by="g"), backend="serial")
    with pytest.raises(TypeError, match="fn must be a function"):
        mm.map_partitions("not a function", frame)


def test_a_function_that_needs_a_checkpoint_is_refused_before_any_work():
    """A transform gives no checkpoint: a fn that needs one failed on every
    group; one with a default, or given checkpoint= as a shared object, runs."""
    frame = pd.DataFrame({"g": [1, 2, 2], "x": [1.0, 2.0, 3.0]})
    calls = []

    def needs(rows, checkpoint):
        calls.append(1)
        return rows

    for call in (lambda: mm.map_groups(needs, mm.groups(frame, by="g"), backend="serial"),
                 lambda: mm.map_partitions(needs, frame, backend="serial")):
        with pytest.raises(TypeError, match="fn takes a checkpoint, which map_groups"):
            call()
    assert not calls

    def optional(rows, checkpoint=None):
        return rows.assign(y=rows.x * 2)

    assert mm.map_groups(optional, mm.groups(frame, by="g"), backend="serial")["y"].tolist() \
        == [2.0, 4.0, 6.0]
    shared = mm.map_groups(needs, mm.groups(frame, by="g"), backend="serial",
                           shared={"checkpoint": 1})
    assert len(shared) == 3


@pytest.mark.parametrize("keys", [
    np.array([1, 2, 1], dtype=np.uint8), pd.array([1, None, 1], dtype="Int64"),
    pd.array([True, None, True], dtype="boolean"), pd.Categorical(["b", "a", "b"]),
    np.array([1.5, 2, 1.5], dtype=np.float32)], ids=str)
def test_an_aggregations_key_column_keeps_the_inputs_type(keys):
    """As pandas' groupby().apply keeps it: the key values came back as
    Python values in int64, float64 or object columns."""
    frame = pd.DataFrame({"k": keys, "x": [1.0, 2.0, 3.0]})
    ours = mm.map_groups(lambda rows: pd.DataFrame({"n": [len(rows)]}),
                         mm.groups(frame, by="k"), backend="serial")
    assert ours["k"].dtype == frame["k"].dtype
    series = mm.map_groups(lambda rows: rows[["x"]].sum(), mm.groups(frame, by="k"),
                           backend="serial")
    assert series["k"].dtype == frame["k"].dtype


@pytest.mark.parametrize("workers", [-1, 1.5, 0])
def test_map_partitions_names_a_bad_workers(workers):
    """It was reported as partitions (four per worker: "got -4")."""
    with pytest.raises(ValueError, match=r"workers must be an integer >= 1, got"):
        mm.map_partitions(lambda part: part, pd.DataFrame({"x": range(10)}), workers=workers)


def test_a_table_and_a_dict_are_refused_not_the_dict_dropped():
    """train reads (table, dict) as a model and its metrics: map_groups and a
    split map_partitions kept the table and dropped the dict, silently."""
    frame = pd.DataFrame({"g": [1, 1, 2], "x": [1.0, 2.0, 3.0]})
    with pytest.raises(TypeError, match="returned a table and a dict for 1"):
        mm.map_groups(lambda rows: (rows, {"n": len(rows)}), mm.groups(frame, by="g"),
                      backend="serial")
    with pytest.raises(TypeError, match="returned a table and a dict"):
        mm.map_partitions(lambda part: (part, {"n": len(part)}), frame, partitions=2,
                          backend="serial")


@pytest.mark.parametrize("how", [{}, {"partitions": 3, "backend": "processes"},
                                 {"partitions": 2, "backend": "threads", "format": "arrow"},
                                 {"format": "polars"}])
def test_map_partitions_of_an_empty_table_is_the_functions_output_on_it(how):
    """An empty table was refused ("nothing to transform"); it is one empty
    partition, and the result is what fn makes of it (its columns, its
    types), as fn(table) would be: a pipeline's quiet day is not an error."""
    frame = pd.DataFrame({"g": pd.Series([], dtype="int64"), "x": pd.Series([], dtype=float)})
    fmt = how.get("format", "pandas")

    def double(part):
        if fmt == "pandas":
            return part.assign(z=part["x"] * 2)
        if fmt == "arrow":
            return part.append_column("z", pc.multiply(part["x"], 2))
        return part.with_columns(z=part["x"] * 2)

    import pyarrow.compute as pc

    table = {"pandas": frame, "arrow": pa.Table.from_pandas(frame, preserve_index=False),
             "polars": pytest.importorskip("polars").from_pandas(frame)}[fmt]
    result = mm.map_partitions(double, table, **how)
    shown = result if fmt == "pandas" else result.to_pandas()
    assert list(shown.columns) == ["g", "x", "z"] and len(shown) == 0
    assert str(shown["z"].dtype) == "float64"


@pytest.mark.parametrize("change", ["a group appended", "a group relabelled"])
def test_a_store_runs_again_only_the_groups_whose_rows_or_labels_changed(tmp_path, change):
    """The rows' labels travelled as one shared object of the whole table,
    part of every group's identity: any change ran every group again."""
    ran = []

    def demean(rows, key):
        ran.append(key)
        return rows.assign(z=rows["x"] - rows["x"].mean())

    frame = pd.DataFrame({"g": ["a", "a", "b", "b"], "x": [1.0, 2.0, 3.0, 5.0]},
                         index=[10, 11, 12, 13])
    options = {"store": tmp_path / "store", "backend": "serial", "progress": False}
    mm.map_groups(demean, mm.groups(frame, by="g"), **options)
    if change == "a group appended":
        frame = pd.concat([frame, pd.DataFrame({"g": ["c"], "x": [7.0]}, index=[14])])
    else:
        frame.index = [20, 21, 12, 13]
    ran.clear()
    ours = mm.map_groups(demean, mm.groups(frame, by="g"), **options)
    assert ran == ["c" if change == "a group appended" else "a"]
    assert ours.index.equals(frame.index)
    assert ours["z"].tolist() == (frame["x"] - frame.groupby("g")["x"].transform("mean")).tolist()
