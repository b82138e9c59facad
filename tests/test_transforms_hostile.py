"""map_groups and map_partitions under outputs a hostile tester chose: Series
whose labels differ by group, polars columns whose types have no common one,
and runs in which every group or partition failed."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import manymodels as mm

SERIAL = {"backend": "serial", "progress": False}


def counts(rows: pd.DataFrame) -> pd.Series:
    return rows["c"].value_counts()


def test_series_whose_labels_differ_by_group_keep_their_groups_key():
    """Concatenated bare, x, y, x, z would not say which group a row is of:
    the key comes first in a MultiIndex, as pandas' groupby().apply puts it."""
    frame = pd.DataFrame({"g": ["a", "a", "b", "b", "b"], "c": ["x", "y", "x", "x", "z"]})
    ours = mm.map_groups(counts, mm.groups(frame, by="g"), **SERIAL)
    pd.testing.assert_series_equal(ours, frame.groupby("g")[["c"]].apply(counts))
    assert ours.loc[("b", "x")] == 2

    two = frame.assign(h=[1, 1, 1, 2, 2])  # several key columns: one level each
    ours = mm.map_groups(counts, mm.groups(two, by=["g", "h"]), **SERIAL)
    theirs = two.groupby(["g", "h"])[["c"]].apply(counts)
    pd.testing.assert_series_equal(ours, theirs, check_index_type=False)
    assert list(ours.index.names) == ["g", "h", "c"]


def test_series_of_the_same_labels_in_another_order_are_aligned_by_label():
    """The same labels in another order are the same labels: one row per
    group, each value under its own label, not a Series of labels repeated."""
    frame = pd.DataFrame({"g": ["a", "a", "a", "b", "b", "b"],
                          "c": ["x", "x", "y", "x", "y", "y"]})
    ours = mm.map_groups(counts, mm.groups(frame, by="g"), **SERIAL)
    expected = pd.DataFrame({"g": ["a", "b"], "x": [2, 1], "y": [1, 2]})
    expected.columns.name = "c"  # the labels' name, as pandas names them
    pd.testing.assert_frame_equal(ours, expected, check_dtype=False)

    def stats(rows: pd.DataFrame) -> pd.Series:  # a dict's order, by group
        n, total = len(rows), float(rows["v"].sum())
        return pd.Series({"n": n, "sum": total} if rows["g"].iloc[0] == "a"
                         else {"sum": total, "n": n})

    ours = mm.map_groups(stats, mm.groups(frame.assign(v=np.arange(6.0)), by="g"), **SERIAL)
    assert list(ours.columns) == ["g", "n", "sum"]
    assert ours["sum"].tolist() == [3.0, 12.0] and ours["n"].tolist() == [3, 3]


def test_polars_outputs_of_a_number_and_a_text_are_refused_as_arrow_ones_are():
    """polars' relaxed concat would make the number text: refused, naming the column."""
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"g": ["a", "b"], "y": [1, 2]})

    def number_or_text(rows):
        return pl.DataFrame({"p": [1]}) if rows["g"][0] == "a" else pl.DataFrame({"p": ["x"]})

    with pytest.raises(TypeError, match=r"cannot be concatenated.*Field p"):
        mm.map_groups(number_or_text, mm.groups(frame, by="g", format="polars"), **SERIAL)

    def by_partition(part):
        return part.select(p=pl.lit(1) if part["y"][0] == 1 else pl.lit("x"))

    with pytest.raises(TypeError, match=r"map_partitions.*cannot be concatenated.*Field p"):
        mm.map_partitions(by_partition, frame, partitions=2, format="polars", **SERIAL)


def test_a_polars_lazyframe_output_is_refused_as_a_lazyframe_input_is():
    """A LazyFrame output was taken for a table: the result was a lazy union
    of every group's query, without the key columns, run by no worker."""
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"g": ["a", "b"], "y": [1, 2]})
    with pytest.raises(TypeError, match="map_groups returned a polars LazyFrame.*collect"):
        mm.map_groups(lambda rows: rows.lazy(), mm.groups(frame, by="g", format="polars"),
                      **SERIAL)
    for partitions in (None, 2):  # in this process, or split
        with pytest.raises(TypeError, match="map_partitions returned a polars LazyFrame"):
            mm.map_partitions(lambda part: part.lazy(), frame, partitions, format="polars",
                              progress=False)


def test_polars_outputs_still_widen_numbers_and_fill_missing_columns():
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"g": ["a", "b", "c"], "y": [1, 2, 3]})

    def varied(rows):
        key = rows["g"][0]
        if key == "a":
            return pl.DataFrame({"p": [1], "q": ["s"]})
        if key == "b":
            return pl.DataFrame({"p": [2.5], "q": pl.Series(["t"], dtype=pl.Categorical)})
        return pl.DataFrame({"p": [None], "q": [None]})

    out = mm.map_groups(varied, mm.groups(frame, by="g", format="polars"), **SERIAL)
    assert out.schema["p"] == pl.Float64 and out.schema["q"] == pl.String
    assert out["p"].to_list() == [1.0, 2.5, None] and out["q"].to_list() == ["s", "t", None]


def fail(rows):
    raise ValueError("every one fails")


@pytest.mark.parametrize("how", ["polars", "arrow", "pandas"])
def test_a_run_whose_every_group_failed_is_an_empty_table_of_the_sources_kind(how):
    """Not a pandas DataFrame() whatever the kind: code written for the
    polars (or Arrow) tables fn returns keeps working on an empty result."""
    pl = pytest.importorskip("polars")
    kinds = {"polars": pl.DataFrame, "arrow": pa.Table, "pandas": pd.DataFrame}
    frame = pd.DataFrame({"g": ["a", "b"], "y": [1.0, 2.0]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        grouped = mm.map_groups(fail, mm.groups(frame, by="g", format=how), errors="skip",
                                **SERIAL)
        parted = mm.map_partitions(fail, frame, partitions=2, format=how, errors="skip",
                                   **SERIAL)
    for result in (grouped, parted):
        assert isinstance(result, kinds[how]) and len(result) == 0


def test_polars_outputs_and_none_from_some_groups_are_one_polars_table():
    """None is a group without rows, not a pandas frame beside polars ones."""
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"g": ["a", "b"], "y": [1, 2]})
    source = mm.groups(frame, by="g", format="polars")
    out = mm.map_groups(lambda rows: None if rows["g"][0] == "a" else rows, source, **SERIAL)
    assert isinstance(out, pl.DataFrame) and out["g"].to_list() == ["b"]
    none = mm.map_groups(lambda rows: None, source, **SERIAL)
    assert isinstance(none, pl.DataFrame) and none.height == 0


def _aggregates_but_none_for_c(rows):
    return None if rows["k"].iloc[0] == "c" else rows["x"].agg(["mean", "max"])


def _counts_but_none_for_c(rows):
    return None if rows["k"].iloc[0] == "c" else rows["x"].value_counts()


def test_series_outputs_beside_groups_that_returned_none_keep_their_labels():
    """Series from some groups and None from another: each Series became a
    frame of one column, concatenated without its labels (rows of a and b
    repeated, aggregates' names lost)."""
    frame = pd.DataFrame({"k": ["a", "a", "b", "c"], "x": [1.0, 2.0, 3.0, 4.0]})
    rows = mm.map_groups(_aggregates_but_none_for_c, mm.groups(frame, by="k"),
                         backend="serial")
    assert rows.to_dict("list") == {"k": ["a", "b"], "mean": [1.5, 3.0], "max": [2.0, 3.0]}
    counts = mm.map_groups(_counts_but_none_for_c, mm.groups(frame, by="k"), backend="serial")
    expected = frame[frame["k"] != "c"].groupby("k").apply(lambda r: r["x"].value_counts())
    pd.testing.assert_series_equal(counts, expected, check_names=False)


def test_counts_under_several_keys_one_of_them_missing():
    """concat(keys=) could not make a level of tuple keys holding a NaN."""
    frame = pd.DataFrame({"a": ["p", "p", "q"], "b": [1.0, np.nan, 1.0], "i": [1, 2, 3]})
    got = mm.map_groups(lambda rows: rows["i"].value_counts(), mm.groups(frame, by=["a", "b"]),
                        backend="serial")
    expected = frame.groupby(["a", "b"], dropna=False).apply(lambda r: r["i"].value_counts())
    pd.testing.assert_series_equal(got, expected)


def test_a_categorical_key_keeps_its_categories_and_their_order():
    """The key column came back categorical of the observed values, sorted
    and unordered: sorting by it afterwards gave x, y, z, not z, y, x."""
    frame = pd.DataFrame({"k": pd.Categorical(["x", "z", "y"], categories=["z", "y", "w", "x"],
                                              ordered=True), "v": [1, 2, 3]})
    got = mm.map_groups(lambda rows: pd.DataFrame({"s": [rows["v"].sum()]}),
                        mm.groups(frame, by="k"), backend="serial")
    assert got["k"].dtype == frame["k"].dtype
    assert got.sort_values("k")["k"].tolist() == ["z", "y", "x"]


def test_a_transform_lacking_the_key_columns_is_given_them_under_the_input_labels():
    """A transform's rows come back under the input's labels with the key
    columns in front, as every other output (and as an engine's DataFrame
    gives them, which has no labels to put rows back under): pandas'
    group_keys=False gives fn's columns alone."""
    frame = pd.DataFrame({"k": ["a", "a", "b", "c"], "x": [1.0, 2.0, 3.0, 4.0]},
                         index=[10, 11, 12, 13])
    got = mm.map_groups(lambda rows: rows[["x"]].cumsum(), mm.groups(frame, by="k"),
                        backend="serial")
    expected = frame.groupby("k", group_keys=False).apply(lambda r: r[["x"]].cumsum())
    pd.testing.assert_frame_equal(got, frame[["k"]].join(expected))


def _polars_keys() -> tuple:
    import polars as pl

    return pl, pl.DataFrame({"k": pl.Series([1, 2, 1, 2], dtype=pl.UInt8),
                             "c": pl.Series(["x", "y", "x", "y"], dtype=pl.Categorical),
                             "v": [1.0, 2.0, 3.0, 4.0]})


@pytest.mark.parametrize("by", ["k", "c"])
def test_keys_added_to_outputs_of_a_polars_input_keep_its_types(by):
    """A UInt8 key came back Int64 and a categorical one as text, whatever
    kind of table fn returned: each output kind now has the input's type in
    its own form, as fn's rows had it."""
    pl, frame = _polars_keys()
    pandas_out = mm.map_groups(lambda rows: pd.DataFrame({"s": [rows["v"].sum()]}),
                               mm.groups(frame, by=by), **SERIAL)
    assert pandas_out[by].dtype == frame.to_pandas()[by].dtype
    assert pandas_out[by].tolist() == (["x", "y"] if by == "c" else [1, 2])

    polars_out = mm.map_groups(lambda rows: rows.select(pl.col("v").sum()),
                               mm.groups(frame, by=by, format="polars"), **SERIAL)
    assert polars_out.schema[by] == frame.schema[by]
    assert polars_out.columns == [by, "v"]

    table = frame.to_arrow()
    arrow_out = mm.map_groups(lambda rows: pa.table({"s": [len(rows)]}),
                              mm.groups(table, by=by, format="arrow"), **SERIAL)
    assert arrow_out.schema.field(by).type == table.schema.field(by).type
    assert arrow_out.column(by).to_pylist() == (["x", "y"] if by == "c" else [1, 2])


def test_keys_added_to_arrow_outputs_of_a_pandas_input_keep_its_categories():
    """An Arrow output of a pandas input's groups got its categorical key as
    text; it is now Arrow's dictionary of the input's categories, in order."""
    frame = pd.DataFrame({"k": pd.Categorical(["x", "z", "y"], categories=["z", "y", "w", "x"],
                                              ordered=True), "v": [1, 2, 3]})
    got = mm.map_groups(lambda rows: pa.table({"s": [len(rows)]}), mm.groups(frame, by="k"),
                        **SERIAL)
    assert got.column("k").to_pandas().dtype == frame["k"].dtype


@pytest.mark.parametrize("key", [
    pd.Categorical(["a", "b", "a", "c"], categories=["c", "b", "a"]),
    pd.array([1, 2, 1, 3], dtype="Int64"),
    np.array([1, 2, 1, 3], dtype="uint8"),
])
def test_a_key_only_some_outputs_include_keeps_its_type_and_place(key):
    """Where some groups' outputs had the key column and others not, it came
    back as text or object, behind fn's columns: it now has the input's
    type, in front as when no output has it, each output's own values kept."""
    frame = pd.DataFrame({"g": key, "v": [1.0, 2.0, 3.0, 4.0]})

    def total(rows: pd.DataFrame) -> pd.DataFrame:
        out = pd.DataFrame({"s": [rows["v"].sum()]})
        if rows["v"].iloc[0] == 2.0:  # one group names its key, as a Python value
            out["g"] = rows["g"].iloc[0]
            out["g"] = out["g"].astype(object)
        return out

    got = mm.map_groups(total, mm.groups(frame, by="g"), **SERIAL)
    expected = frame.groupby("g", sort=True, observed=True)["v"].sum().rename("s").reset_index()
    assert list(got.columns) == ["g", "s"]
    assert got["g"].dtype == frame["g"].dtype
    pd.testing.assert_frame_equal(got, expected, check_categorical=False)


def test_a_key_value_an_output_gives_that_does_not_fit_the_keys_type_is_kept():
    """An output's own key value outside the key's type (300 for a uint8 key)
    keeps the column in a type that holds it rather than wrapping to 44."""
    frame = pd.DataFrame({"g": np.array([1, 2, 1, 3], dtype="uint8"), "v": [1.0, 2.0, 3.0, 4.0]})

    def total(rows: pd.DataFrame) -> pd.DataFrame:
        out = pd.DataFrame({"s": [rows["v"].sum()]})
        if rows["v"].iloc[0] == 2.0:
            out["g"] = 300
        return out

    got = mm.map_groups(total, mm.groups(frame, by="g"), **SERIAL)
    assert got["g"].tolist() == [1, 300, 3]


def test_a_frames_index_that_holds_values_comes_back_as_columns():
    """An aggregation by day, a set_index, a describe(): the index holds the
    values that say what each row is; under the fresh index it was dropped
    (the days gone). Row labels (a filter's) are still dropped."""
    frame = pd.DataFrame({"g": ["b", "a", "b", "a"], "day": [1, 1, 2, 2], "x": [1.0, 2, 3, 4]},
                         index=pd.Index(list("pqrs"), name="i"))
    daily = mm.map_groups(lambda rows: rows.groupby("day")[["x"]].sum(),
                          mm.groups(frame, by="g"), **SERIAL)
    expected = frame.groupby(["g", "day"])[["x"]].sum().reset_index()
    pd.testing.assert_frame_equal(daily, expected, check_dtype=False)

    stats = mm.map_groups(lambda rows: rows[["x"]].describe().iloc[:2],
                          mm.groups(frame, by="g"), **SERIAL)
    assert stats.columns.tolist() == ["g", "index", "x"]
    assert stats["index"].tolist() == ["count", "mean"] * 2

    kept = mm.map_groups(lambda rows: rows[rows["x"] > 2], mm.groups(frame, by="g"), **SERIAL)
    assert kept.columns.tolist() == ["g", "day", "x"] and kept.index.tolist() == [0, 1]
    graded = mm.map_groups(lambda rows, a: rows.set_index("day")[["x"]] * a,
                           mm.groups(frame, by="g") * mm.grid(a=[1, 2]), **SERIAL)
    assert graded.columns.tolist() == ["g", "a", "day", "x"]
    assert graded["day"].tolist() == [1, 2] * 4


def test_columns_of_polars_or_arrow_and_series_of_repeated_labels_are_concatenated():
    """A polars Series failed in polars' diagonal concat, Arrow columns of an
    int and a float in chunked_array, Series of a label repeated in reindex:
    each is one column (the types unified) or one row per group."""
    pl = pytest.importorskip("polars")
    table = pa.table({"g": ["b", "a"], "x": [1, 2]})
    ours = mm.map_groups(lambda rows: rows["x"] * (1.5 if rows["g"][0] == "b" else 1),
                         mm.groups(pl.from_arrow(table), by="g", format="polars"), **SERIAL)
    assert isinstance(ours, pl.Series) and ours.name == "x" and ours.to_list() == [2.0, 1.5]

    def column(rows: pa.Table) -> pa.ChunkedArray:
        x = rows["x"]
        return x if rows["g"][0].as_py() == "a" else x.cast(pa.float64())

    ours = mm.map_groups(column, mm.groups(table, by="g", format="arrow"), **SERIAL)
    assert ours.type == pa.float64() and ours.to_pylist() == [2.0, 1.0]

    frame = table.to_pandas()
    ours = mm.map_groups(lambda rows: pd.Series([1, 2], index=["u", "u"]),
                         mm.groups(frame, by="g"), **SERIAL)
    assert ours.columns.tolist() == ["g", "u", "u"] and ours.iloc[:, 2].tolist() == [2, 2]


def test_one_value_per_group_is_a_series_under_the_keys_as_pandas_makes_it():
    """rows["x"].sum() is pandas' commonest apply: it was refused once every
    group had run ('must return a table, got float64')."""
    frame = pd.DataFrame({"g": ["b", "a", "b", "a"], "h": [1, 1, 2, 1], "x": [1.0, 2, 3, 4]})
    for by in ("g", ["g", "h"]):
        ours = mm.map_groups(lambda rows: rows["x"].sum(), mm.groups(frame, by=by), **SERIAL)
        pd.testing.assert_series_equal(ours, frame.groupby(by).apply(lambda rows: rows["x"].sum()))
    counted = mm.map_groups(lambda rows: None if rows["g"].iloc[0] == "a" else len(rows),
                            mm.groups(frame, by="g"), **SERIAL)
    assert counted.to_dict() == {"b": 2}


def _values_under_labels(rows: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"v": [10, 20]}, index=[1, 2])


def test_an_index_of_values_is_one_column_for_every_group_whatever_their_row_labels():
    """Labels 1 and 2 are among group a's rows (0 to 3) and not group b's
    (4 to 7): judged group by group, a's index was dropped as a filter's and
    b's a column, NaN in a's rows. One judgement for both: a column of each."""
    frame = pd.DataFrame({"g": ["a"] * 4 + ["b"] * 4, "x": range(8)})
    ours = mm.map_groups(_values_under_labels, mm.groups(frame, by="g"), **SERIAL)
    assert list(ours.columns) == ["g", "index", "v"]
    assert ours["index"].tolist() == [1, 2, 1, 2]


def _one_for_the_first_partition(part: pd.DataFrame) -> object:
    return 1 if part.index[0] == 0 else part


def _a_value_but_for_a(rows: pd.DataFrame) -> object:
    return rows if rows["g"].iloc[0] == "a" else rows["x"].sum()


def test_a_split_and_a_mixed_output_are_worded_as_they_are():
    """An empty table asked for 3 partitions said "split into 1 partitions,
    as the call asked"; a number beside a table was "a int"; outputs of two
    kinds named no group (or partition) of either."""
    ours = mm.map_partitions(lambda part: part, pd.DataFrame({"x": []}), 3, **SERIAL)
    assert ours.attrs["summary"].split == (
        "split into 1 partition: the call asked for 3, and the table has 0 rows")
    with pytest.raises(TypeError, match="returned an int for partition 0 and pandas for "
                                        "partition 1 "):
        mm.map_partitions(_one_for_the_first_partition, pd.DataFrame({"x": range(4)}), 2,
                          **SERIAL)
    frame = pd.DataFrame({"g": ["a", "b", "c"], "x": [1, 2, 3]})
    with pytest.raises(TypeError, match="returned pandas for group 'a' and an int64 for "
                                        "group 'b' "):
        mm.map_groups(_a_value_but_for_a, mm.groups(frame, by="g"), **SERIAL)


@pytest.mark.parametrize(("call", "said"), [
    (lambda frame: mm.map_partitions(len, frame, fallback=len),
     r"map_partitions\(\) got an unexpected keyword argument 'fallback' \(map_groups "),
    (lambda frame: mm.map_groups(len, mm.groups(frame, by="g"), format="arrow"),
     r"map_groups\(\) got an unexpected keyword argument 'format' \(mm.groups"),
    (lambda frame: mm.map_groups(len, mm.groups(frame, by="g"), wokers=2),
     r"map_groups\(\) got an unexpected keyword argument 'wokers'$"),
])
def test_a_keyword_neither_takes_is_refused_in_the_callers_name(call, said):
    """train() refused it, in its own name, after the table was grouped."""
    with pytest.raises(TypeError, match=said):
        call(pd.DataFrame({"g": ["a"], "x": [1]}))


def _key_kind(rows, key):
    return pd.DataFrame({"kind": [type(key).__name__], "same": [key == rows["d"].iloc[0]]})


def test_a_time_key_reaches_fn_as_a_timestamp_whatever_its_precision():
    """A time key reached ``fn`` as a datetime, and as a Timestamp where it
    had nanoseconds (Arrow's choice, value by value): it is a Timestamp, as
    run.models holds it, and in every group, for train and map_groups."""
    frame = pd.DataFrame({"d": pd.to_datetime(["2024-01-01", "2024-01-01 00:00:00.000000002",
                                               "2024-01-02"], format="ISO8601").tz_localize(
        "Europe/Paris"), "w": pd.to_timedelta([1, 2, 3], unit="s")})
    out = mm.map_groups(_key_kind, mm.groups(frame, by="d"), backend="serial")
    assert out["kind"].tolist() == ["Timestamp"] * 3 and out["same"].all()
    run = mm.train(lambda rows, key: {"kind": type(key[1]).__name__},
                   mm.groups(frame, by=["d", "w"]), backend="serial", progress=False)
    assert run.results["kind"].tolist() == ["Timedelta"] * 3


def _fails_on_the_third_row(part: pd.DataFrame) -> pd.DataFrame:
    if 2 in part.index:
        raise ValueError("third row")
    return part


def test_a_failing_partition_or_group_is_named_by_its_plain_number():
    """The error named partition 2 ``np.int64(2)`` (and group 2 ``np.int64(2)``)."""
    frame = pd.DataFrame({"g": [1, 1, 2, 2], "x": range(4)})
    with pytest.raises(RuntimeError, match=r"the first, 2, with"):
        mm.map_partitions(_fails_on_the_third_row, frame, 4, **SERIAL)
    with pytest.raises(RuntimeError, match=r"the first, \(2, 'a'\), with"):
        mm.map_groups(_fails_on_the_third_row, mm.groups(frame.assign(h="a"), by=["g", "h"]),
                      **SERIAL)


def test_partitions_is_any_integer_and_nothing_else():
    """A NumPy integer (``np.int64(2)``, from a computation) was refused as
    "partitions must be an integer"; a float or a bool still is."""
    frame = pd.DataFrame({"x": range(6)})
    ours = mm.map_partitions(lambda part: part, frame, np.int64(2), **SERIAL)
    assert ours.attrs["summary"].split == "split into 2 partitions, as the call asked"
    for bad in (2.0, True, 0, "2"):
        with pytest.raises(ValueError, match=f"partitions must be an integer >= 1, got {bad!r}"):
            mm.map_partitions(lambda part: part, frame, bad, **SERIAL)


def test_a_split_the_call_did_not_ask_for_names_the_keywords_that_made_it(tmp_path):
    """Without ``partitions=``, a ``store=`` or ``backend=`` splits the table
    untimed; the summary said "as the call asked", which it had not."""
    frame = pd.DataFrame({"x": range(6)})
    ours = mm.map_partitions(lambda part: part, frame, store=tmp_path / "store", workers=1,
                             **SERIAL)
    assert ours.attrs["summary"].split == (
        "split into 4 partitions (four per worker, at most one per row), not timed: the call "
        "gave backend=, store=, which only a split run takes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        skipped = mm.map_partitions(lambda part: part, frame, errors="skip", workers=1,
                                    progress=False)
    assert skipped.attrs["summary"].split.endswith("the call gave errors='skip', which only "
                                                   "a split run takes")


def test_bad_keywords_of_a_run_in_process_are_refused_before_fn_runs():
    """A run left to the cost model never reaches train, which checks its
    keywords: an unknown ``start_method`` or a ``progress="yes"`` was
    accepted, silently, where the table was not split."""
    called = []
    frame = pd.DataFrame({"x": range(10)})
    with pytest.raises(ValueError, match="unknown start_method 'Fork'"):
        mm.map_partitions(called.append, frame, start_method="Fork")
    with pytest.raises(TypeError, match="progress must be True or False, got 'yes'"):
        mm.map_partitions(called.append, frame, progress="yes")
    assert called == []


def test_a_function_every_group_would_fail_to_call_is_refused_before_any_runs():
    """``map_groups`` hands ``train`` its ``fn`` wrapped in a function of any
    keywords, whose signature ``train`` checks: a ``fn`` (or ``fallback``)
    missing a keyword, a ``shared=`` that is no dict and a ``fn`` taking no
    rows ran every group, each failing alike (a list ``shared`` was "'list'
    object is not a mapping"); ``map_partitions`` ran such a ``fn`` too."""
    called = []
    frame = pd.DataFrame({"g": ["a", "b", "a"], "x": [1.0, 2.0, 3.0]})
    source = mm.groups(frame, by="g")

    def needs_m(rows, m):
        called.append(m)
        return rows

    with pytest.raises(TypeError, match="map_groups: fn's parameter 'm' has no default"):
        mm.map_groups(needs_m, source, **SERIAL)
    with pytest.raises(TypeError, match="map_groups: fallback's parameter 'm'"):
        mm.map_groups(lambda rows: rows, source, fallback=needs_m, **SERIAL)
    with pytest.raises(TypeError, match="map_groups: fn has no parameter 'm' for the "
                                        "shared name 'm'"):
        mm.map_groups(lambda rows: rows, source, shared={"m": 1}, **SERIAL)
    for run in (lambda **kw: mm.map_groups(needs_m, source, **kw, **SERIAL),
                lambda **kw: mm.map_partitions(needs_m, frame, **kw, progress=False)):
        with pytest.raises(TypeError, match="shared must be a dict of name -> object.*got list"):
            run(shared=[1])
    with pytest.raises(TypeError, match="fn takes no parameter for its rows"):
        mm.map_groups(lambda: called.append(1), source, **SERIAL)
    with pytest.raises(TypeError, match="fn takes no parameter for its rows"):
        mm.map_partitions(lambda: called.append(1), frame, progress=False)
    with pytest.raises(TypeError, match=r"^fn's parameter 'm' has no default"):
        mm.map_partitions(needs_m, frame, progress=False)
    assert called == []
    # given what it needs, it runs
    assert mm.map_groups(needs_m, source, shared={"m": 2}, **SERIAL)["x"].tolist() == [1, 2, 3]


def _writes_in_place(part: pd.DataFrame) -> pd.DataFrame:
    part.iloc[0, 0] = -1
    return part


@pytest.mark.skipif(int(pd.__version__.split(".")[0]) >= 3,
                    reason="copy-on-write: pandas 3 copies a view on its first write")
def test_fn_writing_into_its_partition_leaves_the_callers_frame_as_it_was():
    """Without copy-on-write, the run on the whole table (and each trial)
    handed ``fn`` a view of the caller's frame: a write in place changed it,
    where a split run's partitions are copies."""
    frame = pd.DataFrame({"x": np.arange(10)})
    mm.map_partitions(_writes_in_place, frame, progress=False)
    assert frame["x"].tolist() == list(range(10))


def _multiples_of_three(part: pd.DataFrame) -> pd.DataFrame:
    return part[part["x"] % 3 == 0]


@pytest.mark.parametrize("kind", ["arrow", "polars"])
def test_partitions_of_an_arrow_or_polars_table_are_labelled_by_position(kind):
    """Each partition came to a pandas ``fn`` under 0, 1, ... and the outputs
    were renumbered, so a filter's rows were labelled 0..3 split and 0, 3, 6,
    9 (their positions) where the table ran in this process: the result hung
    on the cost model. Both are ``fn(table.to_pandas())`` now."""
    table = pa.table({"x": np.arange(10)})
    if kind == "polars":
        table = pytest.importorskip("polars").from_arrow(table)
    expected = _multiples_of_three(table.to_pandas())
    whole = mm.map_partitions(_multiples_of_three, table, progress=False)
    assert whole.attrs["summary"].split.startswith("in-process")
    pd.testing.assert_frame_equal(whole, expected)
    pd.testing.assert_frame_equal(mm.map_partitions(_multiples_of_three, table, 3, **SERIAL),
                                  expected)
    assert mm.map_partitions(lambda part: part.index.to_series(), table, 3,
                             **SERIAL).tolist() == list(range(10))
