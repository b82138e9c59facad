"""Sources under hostile but plausible input (each case found by a review
that compared every group's rows with pandas' own groupby)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import manymodels as mm


def _id_column(rows):
    return None, {"dtype": str(rows["id"].dtype), "last": int(rows["id"].iloc[-1])}


@pytest.mark.parametrize("read_on_workers", [False, True])
def test_a_groups_integers_stay_integers_whatever_its_batch_holds(tmp_path, read_on_workers):
    """A batch converted in one go made an integer column floats for every
    group in it where one group missed a value: a group without one got
    float64, its ids past 2**53 rounded."""
    n = 200
    ids = pa.array([2**53 + i for i in range(2 * n)], pa.int64(),
                   mask=np.array([i % 4 == 0 for i in range(2 * n)]))
    pq.write_table(pa.table({"g": np.repeat(np.arange(n), 2), "id": ids}),
                   tmp_path / "ids.parquet")
    run = mm.train(_id_column, mm.groups(tmp_path / "ids.parquet", by="g",
                                         read_on_workers=read_on_workers),
                   backend="processes", workers=2, progress=False)
    clean = run.results[run.results["g"] % 2 == 1]
    assert set(clean["dtype"]) == {"int64"}
    assert clean["last"].tolist() == [2**53 + 2 * g + 1 for g in clean["g"]]


def _flag_column(rows):
    return None, {"dtype": str(rows["flag"].dtype), "not_flag": int((~rows["flag"]).sum())}


@pytest.mark.parametrize("workers", [1, 2])
def test_a_groups_booleans_stay_booleans_whatever_its_batch_holds(workers):
    """The same for a boolean column: where one group of a batch missed a
    value, every group got an object column, and ~flag gave -1 and -2 (the
    answer changed with workers=, which sizes the batches)."""
    n = 800
    flags = pa.array([None if i % 37 == 0 else bool(i % 2) for i in range(5 * n)])
    table = pa.table({"g": np.repeat(np.arange(n), 5), "flag": flags})
    run = mm.train(_flag_column, mm.groups(table, by="g"), backend="processes",
                   workers=workers, progress=False)
    whole = ~np.isin(np.arange(n), np.arange(0, 5 * n, 37) // 5)
    clean = run.results[whole]
    assert set(clean["dtype"]) == {"bool"}
    expected = [sum(not flags[i].as_py() for i in range(5 * g, 5 * g + 5)) for g in clean["g"]]
    assert clean["not_flag"].tolist() == expected


def _rows_as_lists(rows):
    return rows.to_dict("list"), {}


def test_a_file_rewritten_after_mm_groups_read_its_keys_is_refused_by_name(tmp_path):
    """Files not in key order are sorted once, each row to the group the
    plan gave its position: a file rewritten in between (the same rows in
    another order) gave groups other groups' rows, and a store kept them."""
    folder = tmp_path / "data"
    folder.mkdir()
    frame = pd.DataFrame({"g": ["a", "b", "a", "b", "c", "c"], "x": [1, 2, 3, 4, 5, 6]})
    frame.to_parquet(folder / "part-0.parquet", index=False)
    source = mm.groups(folder, by="g", read_on_workers=True)
    frame.iloc[::-1].to_parquet(folder / "part-0.parquet", index=False)
    with pytest.raises(ValueError, match=r"part-0\.parquet' changed since mm\.groups read"):
        mm.train(_rows_as_lists, source, backend="serial", progress=False,
                 store=tmp_path / "s")
    again = mm.train(_rows_as_lists, mm.groups(folder, by="g", read_on_workers=True),
                     backend="serial", progress=False, store=tmp_path / "s")
    assert again.models["a"] == {"g": ["a", "a"], "x": [3, 1]}
    assert not again.results["reused"].any()


def test_a_file_removed_after_mm_groups_read_its_keys_is_named(tmp_path):
    """A bare FileNotFoundError escaped from the sort of files not in key order."""
    frame = pd.DataFrame({"g": ["a", "b", "a", "b"], "x": [1, 2, 3, 4]})
    for part in range(2):
        frame.to_parquet(tmp_path / f"part-{part}.parquet", index=False)
    source = mm.groups(tmp_path, by="g", read_on_workers=True)
    (tmp_path / "part-1.parquet").unlink()
    with pytest.raises(ValueError, match=r"part-1\.parquet' was removed since mm\.groups read"):
        mm.train(_rows_as_lists, source, backend="serial", progress=False)


def _first_x(rows):
    return None, {"x": int(rows["x"].iloc[0])}


@pytest.mark.parametrize("read_on_workers", [False, True])
@pytest.mark.parametrize("folders", [["7", "007"], ["99999999999999999999", "1"]])
def test_partition_folders_are_integers_only_where_each_reads_back_as_one(
        tmp_path, folders, read_on_workers):
    """region=7 and region=007 were one group 7; a value past int64 raised
    OverflowError. Such a column is text, each folder a group."""
    for position, value in enumerate(folders):
        folder = tmp_path / "data" / f"region={value}"
        folder.mkdir(parents=True)
        pd.DataFrame({"x": [position]}).to_parquet(folder / "part.parquet", index=False)
    run = mm.train(_first_x, mm.groups(tmp_path / "data", by="region",
                                       read_on_workers=read_on_workers),
                   backend="serial", progress=False)
    assert dict(zip(run.results["region"], run.results["x"])) == {
        value: position for position, value in enumerate(folders)}


def test_rows_added_for_a_new_group_leave_the_others_reused(tmp_path):
    """pandas writes the table's row count into the Parquet file's schema
    metadata, which the groups' data hashes took in: a group added to the
    file retrained every unchanged one. (With read_on_workers, a group's
    data is the content of its files, as the store guide says.)"""
    read_on_workers = False
    frame = pd.DataFrame({"g": list("aaabbbccc"), "x": np.arange(9)})
    path = tmp_path / "data.parquet"
    frame.to_parquet(path, index=False)
    store = tmp_path / "s"
    mm.train(_first_x, mm.groups(path, by="g", read_on_workers=read_on_workers),
             backend="serial", progress=False, store=store)
    pd.concat([frame, pd.DataFrame({"g": ["d"] * 2, "x": [9, 10]})]).to_parquet(
        path, index=False)
    again = mm.train(_first_x, mm.groups(path, by="g", read_on_workers=read_on_workers),
                     backend="serial", progress=False, store=store)
    assert dict(zip(again.results["g"], again.results["reused"])) == {
        "a": True, "b": True, "c": True, "d": False}


def _x_in_order(rows):
    return None, {"x": "".join(map(str, rows["x"]))}


@pytest.mark.parametrize("ordered", [True, False])
def test_order_by_a_categorical_sorts_by_its_categories_as_pandas_does(ordered):
    """Accepted by mm.groups, then ArrowTypeError in train (Arrow sorts no
    dictionary column)."""
    frame = pd.DataFrame({"g": ["a"] * 4, "x": [1, 2, 3, 4], "size": pd.Categorical(
        ["L", "S", None, "M"], categories=["S", "M", "L"], ordered=ordered)})
    run = mm.train(_x_in_order, mm.groups(frame, by="g", order_by="size"), backend="serial",
                   progress=False)
    expected = "".join(map(str, frame.sort_values("size", kind="stable")["x"]))
    assert run.results["x"].iloc[0] == expected == "2413"


def _columns_of(rows):
    return None, {"columns": ",".join(rows)}


def test_an_arrow_table_naming_a_column_twice_is_refused_as_a_frame_is():
    """Refused for files and pandas frames; an Arrow table was taken, and
    format="numpy" dropped one of the two columns silently."""
    table = pa.Table.from_arrays([pa.array(["a", "b"]), pa.array([1, 2]), pa.array([0.5, 1.5])],
                                 names=["g", "x", "x"])
    with pytest.raises(ValueError, match="has two columns named 'x'"):
        mm.train(_columns_of, mm.groups(table, by="g", format="numpy"), backend="serial",
                 progress=False)


def _rows_x(rows):
    return rows["x"].tolist(), {}


def test_a_missing_key_of_the_results_finds_its_model():
    """run.results shows a missing key as NaN, run.models held it as None:
    looking a model up by the results' key raised KeyError."""
    frame = pd.DataFrame({"g": [1.0, np.nan, 1.0, np.nan], "x": range(4)})
    run = mm.train(_rows_x, mm.groups(frame, by="g"), backend="serial", progress=False)
    assert [run.models[key] for key in run.results["g"]] == [[0, 2], [1, 3]]
    assert run.models[pd.NA] == run.models[None] == [1, 3]


def _key_type_and_rows(rows):
    return None, {"type": type(rows["g"].iloc[0]).__name__, "x": ",".join(map(str, rows["x"]))}


@pytest.mark.parametrize("in_key_order", [True, False])
@pytest.mark.parametrize("read_on_workers", [False, True])
def test_a_key_of_numbers_in_one_file_and_text_in_another_is_text_on_every_path(
        tmp_path, read_on_workers, in_key_order):
    """A key column of integers (or floats) in one file and text in
    another is text in all, as an eager read makes it. Read on the workers,
    the groups of the files of numbers failed: a batch's filter on the
    key's text was checked against those files' statistics of numbers."""
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(pa.table({"g": pa.array([1, 1, 2], pa.int64()), "x": [1, 2, 3]}),
                   folder / "a.parquet")
    pq.write_table(pa.table({"g": pa.array([2.5, 3.0]), "x": [4, 5]}), folder / "b.parquet")
    last = ["x", "x", "y"] if in_key_order else ["x", "1", "3"]  # else: sorted once
    pq.write_table(pa.table({"g": last, "x": [6, 7, 8]}), folder / "c.parquet")
    run = mm.train(_key_type_and_rows, mm.groups(folder, by="g",
                                                 read_on_workers=read_on_workers),
                   backend="serial", progress=False)
    assert run.failed.empty
    assert dict(zip(run.results["g"], run.results["x"])) == (
        {"1": "1,2", "2": "3", "2.5": "4", "3": "5", "x": "6,7", "y": "8"} if in_key_order
        else {"1": "1,2,7", "2": "3", "2.5": "4", "3": "5,8", "x": "6"})
    assert set(run.results["type"]) == {"str"}


def _categories_and_rows(rows):
    return None, {"size": ",".join(map(str, rows["size"])), "x": ",".join(map(str, rows["x"])),
                  "categories": ",".join(rows["size"].cat.categories)}


def _read_both_ways(tmp_path, order_by, first_keys: list, second_keys: list) -> tuple:
    """Two files whose categorical ``size`` has categories of its own in each
    (``L,S,XS`` then ``S,M,L``), keyed as given, trained on as an eager read
    and read on the workers: the two runs."""
    folder = tmp_path / "data"
    folder.mkdir()
    sizes = ((["S", "L", None, "S"][:len(first_keys)], ["L", "S", "XS"]),
             (["M", "S", "L"][:len(second_keys)], ["S", "M", "L"]))
    start = 0
    for number, (keys, (values, categories)) in enumerate(zip((first_keys, second_keys), sizes)):
        pd.DataFrame({"g": keys, "x": range(start, start + len(keys)), "size": pd.Categorical(
            values, categories=categories)}).to_parquet(folder / f"part-{number}.parquet",
                                                        index=False)
        start += len(keys)
    return tuple(
        mm.train(_categories_and_rows, mm.groups(
            folder, by="g", order_by=order_by, read_on_workers=read_on_workers,
            staging=tmp_path / "stage" if read_on_workers else None),
                 backend="serial", progress=False)
        for read_on_workers in (False, True))


@pytest.mark.parametrize("order_by", [None, "size"])
def test_categoricals_whose_categories_differ_between_files_are_sorted_once(
        tmp_path, order_by):
    """Files not in key order are sorted once into Arrow files, which hold
    one dictionary a column: a categorical whose categories differ between
    files raised ArrowInvalid before any task ran. Each group gets the
    categories of all files, in the order an eager read gives them."""
    eager, staged = _read_both_ways(tmp_path, order_by, ["b", "a", "b", "a"], ["a", "b", "a"])
    assert staged.failed.empty
    assert any((tmp_path / "stage").iterdir())  # sorted once, not scanned per batch
    columns = ["g", "size", "x", "categories"]
    pd.testing.assert_frame_equal(staged.results[columns], eager.results[columns])
    assert set(staged.results["categories"]) == {"L,S,XS,M"}
    assert staged.results["x"].tolist() == (["1,3,4,6", "0,2,5"] if order_by is None
                                            else ["1,6,3,4", "0,5,2"])


@pytest.mark.parametrize("order_by", [None, "size"])
def test_categoricals_of_files_in_key_order_get_the_categories_of_all_files(tmp_path,
                                                                            order_by):
    """Files in key order are scanned per batch: each group got the
    categories of the files its batch read (``L,S,XS`` in one group, ``S,M,L``
    in another), not those of all files as an eager read gives them."""
    eager, scanned = _read_both_ways(tmp_path, order_by, ["a", "a", "b"], ["c", "d", "d"])
    assert scanned.failed.empty
    assert not (tmp_path / "stage").exists() or not any((tmp_path / "stage").iterdir())
    columns = ["g", "size", "x", "categories"]
    pd.testing.assert_frame_equal(scanned.results[columns], eager.results[columns])
    assert set(scanned.results["categories"]) == {"L,S,XS,M"}


def _categories_in_use(rows: pd.DataFrame) -> tuple[None, dict]:
    return None, {"seen": ",".join(sorted(rows["c"].astype(str).unique())),
                  "count": len(rows["c"].cat.categories)}


@pytest.mark.parametrize("read_on_workers", [False, True])
@pytest.mark.parametrize("in_key_order", [False, True])
def test_categoricals_whose_files_together_outnumber_their_index_type(
        tmp_path, read_on_workers, in_key_order):
    """Two files of 100 categories each, which pandas writes with int8
    indices: their 200 categories together overflowed the index type, and
    reading the folder raised ArrowInvalid ("requires a larger index type")
    before any task ran. The column is read with int32 indices instead."""
    for number in range(2):
        names = [f"f{number}-{i:03d}" for i in range(100)]
        keys = np.repeat(np.arange(4), 50) + (4 * number if in_key_order else 0)
        pd.DataFrame({"g": keys, "c": pd.Categorical([names[i % 100] for i in range(200)]),
                      "x": np.arange(200.0)}).to_parquet(tmp_path / f"part-{number}.parquet")
    run = mm.train(_categories_in_use, mm.groups(
        tmp_path, by="g", read_on_workers=read_on_workers,
        staging=tmp_path / "stage" if read_on_workers else None),
        backend="serial", progress=False)
    assert run.failed.empty
    frame = pd.concat([pd.read_parquet(tmp_path / f"part-{n}.parquet") for n in range(2)])
    frame["c"] = frame["c"].astype(str)
    expected = {g: ",".join(sorted(rows["c"].unique())) for g, rows in frame.groupby("g")}
    assert dict(zip(run.results["g"], run.results["seen"])) == expected


@pytest.mark.parametrize("read_on_workers", [False, True])
@pytest.mark.parametrize("order_by", [["t"], ["t", "u"]])
def test_order_by_sorts_nan_and_null_together_last_as_pandas_does(tmp_path, order_by,
                                                                    read_on_workers):
    """Arrow sorts NaN before null: a column with both put every NaN
    before every null, where pandas (to which both are missing) keeps them
    together, last, in the order of the rows (or of order_by's next column)."""
    in_a = [np.nan, None, 1.0, np.nan, None, 0.5]
    in_b = [None, np.nan, np.nan, 2.0, None, np.nan]
    table = pa.table({"g": ["a", "b"] * 6, "x": range(12), "u": [5, 1, 4, 2, 3, 0] * 2,
                      "t": pa.array([t for pair in zip(in_a, in_b) for t in pair])})
    pq.write_table(table, tmp_path / "rows.parquet")  # not in key order: sorted once
    source = mm.groups(tmp_path / "rows.parquet" if read_on_workers else table, by="g",
                       order_by=order_by, read_on_workers=read_on_workers)
    run = mm.train(_x_in_order, source, backend="serial", progress=False)
    frame = table.to_pandas().sort_values(["g", *order_by], kind="stable")
    expected = {g: "".join(map(str, rows["x"])) for g, rows in frame.groupby("g")}
    assert dict(zip(run.results["g"], run.results["x"])) == expected


def _writeable_columns(rows, alpha):
    unlocked = []
    for name, array in rows.items():
        try:
            array.flags.writeable = True
            unlocked.append(name)
        except ValueError:
            pass
    return None, {"writeable": ",".join(name for name, array in rows.items()
                                        if array.flags.writeable),
                  "unlocked": ",".join(unlocked)}


@pytest.mark.parametrize("in_key_order", [True, False])
@pytest.mark.parametrize("read_on_workers", [False, True])
def test_numpy_rows_are_read_only_on_every_path_text_too(tmp_path, read_on_workers,
                                                         in_key_order):
    """format="numpy" gives read-only arrays, so that a fit cannot change the
    rows the next task (the same group's next setting) sees; read on the
    workers from files in key order, a text column came writeable."""
    frame = pd.DataFrame({"g": ["a", "a", "b", "b"], "s": ["p", "q", "r", "s"],
                          "x": [1.0, 2.0, 3.0, 4.0]})
    (frame if in_key_order else frame.iloc[[0, 2, 1, 3]]).to_parquet(
        tmp_path / "rows.parquet", index=False)
    run = mm.train(_writeable_columns, mm.groups(tmp_path / "rows.parquet", by="g",
                                                 format="numpy",
                                                 read_on_workers=read_on_workers)
                   * mm.grid(alpha=[1, 2]), backend="serial", progress=False)
    assert run.failed.empty and len(run.results) == 4
    assert run.results["writeable"].tolist() == [""] * 4
    assert run.results["unlocked"].tolist() == [""] * 4


def _mean_x(rows: pd.DataFrame) -> tuple[None, dict]:
    return None, {"x": float(rows["x"].mean())}


@pytest.mark.parametrize("kind", ["Int64", "boolean", "UInt8"])
def test_a_missing_value_in_one_group_retrains_that_group_alone(tmp_path, kind):
    """pandas hashes an integer or boolean column with a missing value as
    floats or objects, whole: a null in one group's column changed every
    group's data hash (per table, and per staged partition of an engine),
    and a store trained them all again. Each row is now hashed by its own
    values; an unchanged group is reused."""
    values = [1, 0, 1, 1, 0, 1] if kind == "boolean" else [3, 2**53 + 1, 7, 1, 0, 5]
    if kind == "UInt8":
        values = [3, 255, 7, 1, 0, 5]
    frame = pd.DataFrame({"g": np.repeat(np.arange(6), 5), "x": np.arange(30.0),
                          "i": pd.array(np.repeat(values, 5), dtype=kind)})
    store = tmp_path / "store"
    mm.train(_mean_x, mm.groups(frame, by="g"), store=store, backend="serial", progress=False)
    holed = frame.copy()
    holed.loc[holed["g"] == 0, "i"] = pd.NA
    run = mm.train(_mean_x, mm.groups(holed, by="g"), store=store, backend="serial",
                   progress=False)
    assert run.results.loc[~run.results["reused"], "g"].tolist() == [0]
    again = mm.train(_mean_x, mm.groups(holed.iloc[5:], by="g"), store=store, backend="serial",
                     progress=False)
    assert again.results["reused"].all()  # the null's group gone: the others still reused


def _row_count(rows):
    return None, {"n": len(rows)}


@pytest.mark.parametrize("read_on_workers", [False, True])
def test_a_folders_hidden_and_underscored_copies_are_not_read(tmp_path, read_on_workers):
    """Every .parquet under a folder was read, a Spark job's _temporary/
    and a notebook's .ipynb_checkpoints/ included: each group's rows came
    two and three times. Names and folders that start with . or _ are left
    out, as pyarrow's datasets and pandas leave them."""
    table = pd.DataFrame({"k": ["a", "b"], "v": [1.0, 2.0]})
    folder = tmp_path / "sales"
    for where in ("", "_temporary/0", ".ipynb_checkpoints"):
        (folder / where).mkdir(parents=True, exist_ok=True)
        table.to_parquet(folder / where / "part-0.parquet", index=False)
    table.to_parquet(folder / "_part-copy.parquet", index=False)
    run = mm.train(_row_count, mm.groups(folder, by="k", read_on_workers=read_on_workers),
                   backend="serial", progress=False)
    assert run.results["n"].tolist() == [1, 1] == [
        len(rows) for _, rows in pd.read_parquet(folder).groupby("k")]


def test_an_items_key_function_that_returns_a_list_is_refused():
    """A key= function returning a list skipped the check for duplicates
    (keys that cannot be hashed were taken for positions): two items keyed
    [s1, 1] both trained, and one model was lost from run.models."""
    records = [{"store": "s1", "sku": 1}, {"store": "s1", "sku": 2}, {"store": "s1", "sku": 1}]
    with pytest.raises(TypeError, match=r"gave item 0 the key \['s1', 1\], a list"):
        mm.items(records, key=lambda r: [r["store"], r["sku"]])
    with pytest.raises(ValueError, match="duplicate item key"):
        mm.items(records, key=lambda r: (r["store"], r["sku"]))


def test_tables_that_are_no_table_or_keys_that_cannot_be_grouped_are_named(tmp_path):
    """Each was a bare AttributeError, NotImplementedError or ArrowInvalid
    from deep inside, or a path said not to exist."""
    pl = pytest.importorskip("polars")
    with pytest.raises(TypeError, match="not a Series .*to_frame"):
        mm.groups(pl.Series("k", [1, 2]), by="k")
    with pytest.raises(TypeError, match="not a Series .*to_frame"):
        mm.groups(pd.Series([1, 2], name="k"), by="k")
    with pytest.raises(TypeError, match=r"LazyFrame .*\.collect\(\)"):
        mm.groups(pl.DataFrame({"k": [1, 2]}).lazy(), by="k")
    with pytest.raises(ValueError, match="by column 'k' holds half-precision floats"):
        mm.train(lambda rows: len(rows), mm.groups(pa.table(
            {"k": pa.array(np.array([1, 2], np.float16)), "v": [1, 2]}), by="k"),
            backend="serial", progress=False)
    with pytest.raises(ValueError, match=r"cannot convert the polars DataFrame.*'k': 'Int128'"):
        mm.groups(pl.DataFrame({"k": pl.Series([1, 2], dtype=pl.Int128), "v": [1, 2]}), by="k")
    with pytest.raises(ValueError, match="columns have several levels .*flatten"):
        mm.groups(pd.DataFrame([[1, 2]], columns=pd.MultiIndex.from_tuples(
            [("a", "k"), ("a", "v")])), by="k")
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"k": [1, 1, 2], "v": [1.0, 2.0, 3.0]}), path)
    run = mm.train(lambda rows: len(rows), mm.groups(path.as_uri(), by="k"),
                   backend="serial", progress=False)  # file:///...: a local file's URI
    assert run.results["status"].eq("ok").all() and len(run.results) == 2


def test_a_blank_or_na_text_cell_of_a_csv_is_a_missing_key_as_in_pandas(tmp_path):
    """A blank cell and "NA" were keys of their own ('' and 'NA') in a text
    column, where pandas' read_csv and a number column read them missing."""
    path = tmp_path / "t.csv"
    path.write_text("k,v\na,1\n,2\nNA,3\nb,4\n")
    run = mm.train(lambda rows: sorted(rows["v"]), mm.groups(path, by="k"),
                   backend="serial", progress=False)
    expected = pd.read_csv(path).groupby("k", dropna=False)["v"].apply(sorted)
    assert len(run.results) == len(expected) == 3
    assert run.models[None] == expected[expected.index.isna()].item() == [2, 3]
    assert run.models["a"] == [1] and run.models["b"] == [4]


def test_a_csv_that_is_not_utf8_is_refused_naming_the_file_and_column(tmp_path):
    """A Latin-1 file's accents were read as bytes (keys such as b'caf\\xe9');
    beside a UTF-8 file the folder failed with "Invalid UTF8 payload", and
    a header that was not UTF-8 with a bare UnicodeDecodeError."""
    (tmp_path / "a.csv").write_bytes("k,v\ncafé,1\n".encode("latin-1"))
    (tmp_path / "b.csv").write_bytes("k,v\ncafé,2\n".encode())
    with pytest.raises(ValueError, match=r"column 'k' of '.*a\.csv' is not UTF-8 text"):
        mm.groups(tmp_path / "a.csv", by="k")
    with pytest.raises(ValueError, match=r"column 'k' of '.*a\.csv' is not UTF-8 text"):
        mm.groups(tmp_path, by="k")
    header = tmp_path / "header" / "h.csv"
    header.parent.mkdir()
    header.write_bytes("ké,v\nx,1\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"'.*h\.csv': its header is not UTF-8"):
        mm.groups(header, by="v")
    run = mm.train(len, mm.groups(tmp_path / "b.csv", by="k"), backend="serial",
                   progress=False)
    assert run.models["café"] == 1


def test_a_polars_column_of_python_objects_is_refused_by_name():
    """pl.Object becomes each object's memory address in Arrow: its values
    were keys of pointer bytes, a group per object."""
    pl = pytest.importorskip("polars")
    frame = pl.DataFrame({"k": [1, 1], "o": pl.Series([{1}, {1}], dtype=pl.Object),
                          "v": [1.0, 2.0]})
    with pytest.raises(ValueError, match=r"column 'o' of the polars DataFrame holds Python "
                                         r"objects .*columns="):
        mm.groups(frame, by="o")
    run = mm.train(len, mm.groups(frame, by="k", columns=["v"]), backend="serial",
                   progress=False)
    assert run.models[1] == 2


def test_a_by_column_that_names_the_frames_index_says_so():
    frame = pd.DataFrame({"v": [1.0, 2.0]}, index=pd.Index([1, 1], name="shop"))
    with pytest.raises(ValueError, match=r"by column 'shop' is not in the table.*a level of "
                                         r"the frame's index.*reset_index"):
        mm.groups(frame, by="shop")
    assert len(mm.groups(frame.reset_index(), by="shop").table) == 2


def test_item_keys_that_a_store_would_hold_as_one_are_refused(tmp_path):
    """(1, None) and (1, nan) differ in Python but are one key to a store:
    it kept one model for both, the first one's lost."""
    for keys in ([(1, None), (1, float("nan"))], [(1, float("nan")), (1, float("nan"))]):
        with pytest.raises(ValueError, match=r"item keys \(1, \w+\) and \(1, nan\) differ but "
                                             r"are stored as one key"):
            mm.items(keys)
    run = mm.train(repr, mm.items([(1, None), (2, float("nan"))]), backend="serial",
                   progress=False, store=str(tmp_path / "store"))
    assert sorted(mm.Store(tmp_path / "store").models().values()) == ["(1, None)", "(2, nan)"]
    assert run.failed.empty


def test_an_object_column_of_aware_and_naive_datetimes_is_refused_by_name():
    """Arrow read them all in the first one's zone: a naive and a UTC
    midnight were one group, where pandas cannot compare them."""
    stamps = [pd.Timestamp("2024-01-01", tz="UTC"), pd.Timestamp("2024-01-01")]
    for order in (stamps, stamps[::-1]):
        frame = pd.DataFrame({"day": pd.Series(order, dtype=object), "v": [1.0, 2.0]})
        with pytest.raises(ValueError, match="column 'day' holds datetimes with a time zone "
                                             "beside datetimes without one"):
            mm.groups(frame, by="day")
    zones = pd.Series([pd.Timestamp("2024-01-01 01:00", tz="Europe/Paris"),
                       pd.Timestamp("2024-01-01", tz="UTC")], dtype=object)
    source = mm.groups(pd.DataFrame({"day": zones, "v": [1.0, 2.0]}), by="day")
    assert len(mm.train(len, source, backend="serial", progress=False).results) == 1


def test_a_frame_column_of_integers_past_64_bits_is_refused_by_name():
    """Arrow's OverflowError named no column and escaped as it was."""
    frame = pd.DataFrame({"v": [1.0, 2.0], "id": pd.Series([2**70, 1], dtype=object)})
    with pytest.raises(ValueError, match="column 'id' holds Python integers outside "
                                         "int64's range"):
        mm.groups(frame, by="id")
    frame["id"] = pd.Series([2**63, 1], dtype=object)
    with pytest.raises(ValueError, match=r"column 'id' .*\.astype\('uint64'\)"):
        mm.groups(frame, by="id")
    run = mm.train(len, mm.groups(frame.astype({"id": "uint64"}), by="id"),
                   backend="serial", progress=False)
    assert run.models[2**63] == 1


def test_a_pandas_frame_naming_a_column_twice_is_refused_by_name_before_any_work():
    """Arrow's message listed every column; with columns= the first of the
    two was taken and the other dropped silently."""
    frame = pd.DataFrame([["a", 1, 2]], columns=["g", "x", "x"])
    with pytest.raises(ValueError, match="has two columns named 'x'"):
        mm.groups(frame, by="g")
    with pytest.raises(ValueError, match="has two columns named 'x'"):
        mm.groups(frame, by="g", columns=["x"])
    assert mm.groups(frame.set_axis(["g", "x", "y"], axis=1), by="g", columns=["x"])


@pytest.mark.parametrize("column", ["g", "x"])
def test_a_column_of_numbers_beside_texts_is_refused_naming_it_and_its_types(column):
    """Arrow's message said only that "1" could not be made an int64."""
    frame = pd.DataFrame({"g": [1, 2, 2], "x": [1, 2, 3]}).astype(object)
    frame.loc[1, column] = "1"
    with pytest.raises(ValueError, match=f"column '{column}' holds values of types int, str"):
        mm.groups(frame, by="g")


def test_a_glob_pattern_is_named_as_a_pattern_that_is_not_expanded(tmp_path):
    pd.DataFrame({"g": ["a"], "x": [1]}).to_parquet(tmp_path / "a.parquet")
    pattern = str(tmp_path / "*.parquet")
    for options in ({}, {"read_on_workers": True}):
        with pytest.raises(ValueError, match="a glob pattern is not expanded"):
            mm.groups(pattern, by="g", **options)


def _ids_and_rows(rows):
    return None, {"x": ",".join(map(str, rows["x"])), "id": ",".join(map(str, rows["id"]))}


@pytest.mark.parametrize("negative", [False, True])
@pytest.mark.parametrize("in_key_order", [True, False])
def test_ids_unsigned_in_one_parquet_file_and_signed_in_another_read_on_workers_as_eagerly(
        tmp_path, negative, in_key_order):
    """A column ``uint64`` in one file and int64 in another is ``uint64``
    (text where a signed file holds a negative value) read on the workers
    too, as an eager read makes it. Arrow's unification made it int64 there:
    a worker's read failed on the first id past int64's range ("Integer
    value ... not in range", naming no column)."""
    folder = tmp_path / "data"
    folder.mkdir()
    signed = [-1, -1, 1] if negative else [1, 1, 2]
    unsigned = [2**64 - 1, 2**63, 2**63 + 1] if in_key_order else [2**64 - 1, 1, 2**63]
    pq.write_table(pa.table({"g": pa.array(signed, pa.int64()), "x": [0, 1, 2],
                             "id": pa.array([7, 8, 9], pa.int64())}), folder / "a.parquet")
    pq.write_table(pa.table({"g": pa.array(unsigned, pa.uint64()), "x": [3, 4, 5],
                             "id": pa.array([2**64 - 1, 5, 6], pa.uint64())}),
                   folder / "b.parquet")
    eager, on_workers = (mm.train(_ids_and_rows, mm.groups(folder, by="g",
                                                           read_on_workers=read_on_workers),
                                  backend="serial", progress=False)
                         for read_on_workers in (False, True))
    assert on_workers.failed.empty
    assert on_workers.results["g"].dtype == eager.results["g"].dtype
    assert negative or eager.results["g"].dtype == np.uint64
    columns = ["g", "x", "id"]
    assert on_workers.results[columns].values.tolist() == eager.results[columns].values.tolist()
    assert str(2**64 - 1) in on_workers.results["id"].tolist()


def _nested_value_types(rows):
    first_list, first_struct = rows["scores"][0], rows["info"][0]
    return None, {"list": str(first_list.dtype), "struct": type(first_struct["n"]).__name__}


@pytest.mark.parametrize("format", ["pandas", "numpy"])
def test_integers_inside_lists_and_structs_stay_integers_whatever_its_batch_holds(format):
    """A list or struct column whose integers miss a value in one group:
    converted in one go, every group of the batch got floats inside its
    lists and dicts, and which groups did changed with workers= (a batch's
    size)."""
    n = 200
    scores = [[i, None] if i % 50 == 0 else [i, i + 1] for i in range(n)]
    info = [{"n": None if i % 50 == 0 else i} for i in range(n)]
    table = pa.table({"g": np.arange(n), "scores": pa.array(scores), "info": pa.array(info)})
    run = mm.train(_nested_value_types, mm.groups(table, by="g", format=format),
                   backend="serial", progress=False)
    clean = run.results[run.results["g"] % 50 != 0]
    assert set(clean["list"]) == {"int64"}
    assert set(clean["struct"]) == {"int"}


@pytest.mark.parametrize("given", ["path", "text"])
def test_a_folder_given_to_items_is_refused_with_how_to_list_its_files(tmp_path, given):
    """``mm.items(Path("data"))``: a path is iterable to no one (and a text
    is its characters): the error says how to have a task per file."""
    folder = tmp_path / "data"
    folder.mkdir()
    with pytest.raises(TypeError, match=r"one path, not items.*glob\('\*'\)"):
        mm.items(folder if given == "path" else str(folder))


def test_a_home_relative_path_or_file_uri_is_read_on_workers_as_eagerly(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = tmp_path / "sales data"
    folder.mkdir()
    pd.DataFrame({"g": ["a", "b", "a"], "x": [1.0, 2.0, 3.0]}).to_parquet(folder / "a b.parquet")
    for given in ("~/sales data", "file://" + str(folder).replace(" ", "%20")):
        source = mm.groups(given, by="g", read_on_workers=True)
        run = mm.train(lambda rows: (None, {"n": len(rows)}), source, progress=False,
                       backend="serial")
        assert run.results.set_index("g")["n"].to_dict() == {"a": 2, "b": 1}, given


def test_an_order_by_column_that_cannot_be_sorted_is_refused_by_name(tmp_path):
    table = pa.table({"g": [1, 1, 2], "k": [[2], [1], [3]], "x": [1.0, 2.0, 3.0]})
    pq.write_table(table, tmp_path / "a.parquet")
    for given, options in ((table, {}), (tmp_path / "a.parquet", {"read_on_workers": True})):
        with pytest.raises(ValueError, match="order_by column 'k' holds list<"):
            mm.groups(given, by="g", order_by="k", **options)


@pytest.mark.skipif(not hasattr(pa, "string_view"), reason="pyarrow < 16 has no view types")
def test_string_and_binary_view_columns_are_grouped_as_text_and_bytes():
    table = pa.table({"g": pa.array(["b", "a", "b"]).cast(pa.string_view()),
                      "raw": pa.array([b"x", b"y", b"z"]).cast(pa.binary_view())})
    run = mm.train(lambda rows: (None, {"raw": b"".join(rows["raw"]).decode()}),
                   mm.groups(table, by="g"), progress=False, backend="serial")
    assert run.results.set_index("g")["raw"].to_dict() == {"a": "y", "b": "xz"}


def test_a_file_uri_naming_a_host_or_a_path_of_no_user_is_refused_by_name(tmp_path):
    """``file://data/t.parquet`` (a relative path as a URI) read ``/t.parquet``,
    its "host" dropped, and ``~nosuchuser/t`` failed with Python's "Could not
    determine home directory", naming no path."""
    with pytest.raises(ValueError, match=r"'file://data/t.parquet' names the host 'data'"):
        mm.groups("file://data/t.parquet", by="g")
    for options in ({}, {"read_on_workers": True}):
        with pytest.raises(ValueError, match=r"'~no-such-user-r6/t.parquet' does not exist"):
            mm.groups("~no-such-user-r6/t.parquet", by="g", **options)


@pytest.mark.parametrize("scheme", ["file://", "FILE://"])
def test_a_file_uri_in_any_case_keeps_a_hash_in_its_path(tmp_path, scheme):
    """``FILE:///...`` was taken for an object store's URI (a scheme is
    case-insensitive), and a ``#`` in a ``file://`` path was dropped as a
    URL fragment (``.../run#2/t.parquet`` read ``.../run``); fsspec keeps it."""
    folder = tmp_path / "run#2"
    folder.mkdir()
    pq.write_table(pa.table({"g": ["a", "b", "a"]}), folder / "t.parquet")
    run = mm.train(len, mm.groups(scheme + str(folder / "t.parquet"), by="g"),
                   backend="serial", progress=False)
    assert run.models == {"a": 2, "b": 1}


@pytest.mark.parametrize("column", ["period", "interval"])
def test_an_order_by_period_or_interval_column_sorts_as_pandas_sorts_it(column):
    """Both were refused as "cannot be sorted" (Arrow sorts neither pandas
    type): a Period sorts by its ordinal, an Interval by (left, right), a
    missing one last."""
    frame = pd.DataFrame({
        "g": [1, 1, 1, 1],
        "period": pd.PeriodIndex(["2024-03", None, "2023-12", "2024-01"], freq="M"),
        "interval": pd.IntervalIndex.from_tuples([(2, 3), None, (0, 5), (0, 1)]),
        "x": [0, 1, 2, 3]})
    run = mm.train(lambda rows: list(rows["x"]), mm.groups(frame, by="g", order_by=column),
                   backend="serial", progress=False)
    assert run.models[1] == frame.sort_values(column)["x"].tolist() == (
        [2, 3, 0, 1] if column == "period" else [3, 2, 0, 1])


@pytest.mark.parametrize("read_on_workers", [False, True])
def test_a_parquet_file_named_without_a_suffix_is_read_as_pyarrow_reads_it(tmp_path,
                                                                           read_on_workers):
    """Hive's and Impala's ``000000_0`` beside ``a.parquet`` was left out,
    its rows missing unsaid; pyarrow.dataset reads it. A README stays out."""
    pq.write_table(pa.table({"g": ["a", "b"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"g": ["a"]}), tmp_path / "000000_0")
    (tmp_path / "README").write_text("not a table")
    run = mm.train(len, mm.groups(tmp_path, by="g", read_on_workers=read_on_workers),
                   backend="serial", progress=False)
    assert run.models == {"a": 2, "b": 1}


@pytest.mark.parametrize("uri", [lambda p: p.as_uri(),  # file:///.../sales%20100%25.parquet
                                 lambda p: "File:" + p.as_uri()[7:]],  # file:/..., no //
                         ids=["file:///", "File:/"])
def test_a_file_uri_with_one_slash_or_escapes_is_the_local_file_it_names(tmp_path, uri):
    """``file:/abs/t`` was read as a relative path under a folder named
    ``file:``, where urllib, pyarrow and fsspec read ``/abs/t``; a name with
    a space and a ``%`` is read through the escapes ``Path.as_uri`` writes."""
    path = tmp_path / "sales 100%.parquet"
    pq.write_table(pa.table({"g": ["a", "b", "a"]}), path)
    for options in ({}, {"read_on_workers": True}):
        run = mm.train(len, mm.groups(uri(path), by="g", **options), backend="serial",
                       progress=False)
        assert run.models == {"a": 2, "b": 1}, options


def test_a_file_uri_that_names_no_absolute_path_is_refused_naming_the_argument(tmp_path):
    """``file:t.parquet`` (fsspec: from the current directory; pyarrow:
    refused) and a store or staging folder given so were read as paths under
    a folder named ``file:``; an escape that reads another name than the one
    that exists is said so."""
    (tmp_path / "a%20b.csv").write_text("g\na\n")
    with pytest.raises(ValueError, match=r"table path 'file:t.parquet' names no absolute"):
        mm.groups("file:t.parquet", by="g")
    with pytest.raises(ValueError, match=r"staging= 'file:stage' names no absolute path"):
        mm.groups(tmp_path / "a%20b.csv", by="g", read_on_workers=True, staging="file:stage")
    with pytest.raises(ValueError, match=r"store 'file:models' names no absolute path"):
        mm.Store("file:models")
    with pytest.raises(ValueError, match=r"does not exist, where '.*a%20b.csv' does: write "
                                         r"its '%' as '%25'"):
        mm.groups("file://" + str(tmp_path / "a%20b.csv"), by="g")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a%20b.csv"]
