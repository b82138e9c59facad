"""``mm.map_groups(fn, engine_df, by=...)`` on real engines (a local Spark
session, a Dask ``LocalCluster``, a local Ray): each group's output is written
by the worker that ran it and read back by the engine's workers
(run/engineoutputs.py), never gathered on the driver.

The result equals the pandas path's (columns whose types differ between
groups unified as pandas' ``concat`` makes them, in key order); the driver
receives only the files' names and row counts; a crash retried costs nothing;
a run that fails leaves no output files behind.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import manymodels as mm
import manymodels.transforms as transforms
from conftest import shared_ray
from manymodels.run.outputfiles import WrittenOutput

pytestmark = pytest.mark.slow

#: The suite's engines this module uses, kept up from the module before (conftest).
SHARED_ENGINES = ("ray", "dask")


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    rng = np.random.default_rng(11)
    n = 600
    return pd.DataFrame({"store": rng.integers(0, 5, n), "item": rng.choice(list("ab"), n),
                         "day": rng.permutation(n), "x": rng.normal(size=n)})


def _engine_frame(engine, frame: pd.DataFrame):
    name, handle = engine
    if name == "spark":
        return handle.createDataFrame(frame)
    import dask.dataframe as dd

    return dd.from_pandas(frame, npartitions=3)


def _collected(name: str, frame) -> pd.DataFrame:
    if name == "spark":
        return frame.toPandas()
    if name == "dask":
        return frame.compute()
    return frame.to_pandas()


def summarised(df):
    """Three rows a group, in day order; ``n`` an int in even stores and a
    float (NaN) in odd ones, ``flag`` only in store 1: the groups' schemas differ."""
    store = int(df["store"].iloc[0])
    out = pd.DataFrame({"day": df["day"].to_numpy()[:3],
                        "centred": (df["x"] - df["x"].mean()).to_numpy()[:3]})
    out["n"] = len(df) if store % 2 == 0 else np.nan
    if store == 1:
        out["flag"] = "one"
    return out


def crash_once(df, marks: str):
    """Kills its worker the first time it runs group (3, "b"): its retry succeeds."""
    if (int(df["store"].iloc[0]), df["item"].iloc[0]) == (3, "b"):
        mark = Path(marks, "crashed")
        if not mark.exists():
            mark.touch()
            os._exit(3)
    return summarised(df)


def fail_on_store_4(df):
    if df["store"].iloc[0] == 4:
        raise ValueError("store 4 is bad")
    return summarised(df)


@pytest.fixture(scope="module")
def expected(table) -> pd.DataFrame:
    """The pandas path's answer (gathered on the driver: before any test spies on that)."""
    return mm.map_groups(summarised, mm.groups(table, by=["store", "item"], order_by="day"),
                         backend="serial")


def _same(got: pd.DataFrame, expected: pd.DataFrame) -> None:
    """Equal values, columns and row order (missing text as None on both sides)."""
    got, expected = got.reset_index(drop=True), expected.reset_index(drop=True)
    assert list(got.columns) == list(expected.columns)
    pd.testing.assert_frame_equal(got.astype(object).where(got.notna(), None),
                                  expected.astype(object).where(expected.notna(), None),
                                  check_dtype=False)


@pytest.fixture
def driver_never_gathers(monkeypatch):
    """Fails a test whose outputs are assembled on the driver, and keeps the
    runs map_groups made, to look at what their workers sent back."""
    runs = []

    def gathered(*args, **kwargs):
        raise AssertionError("the groups' outputs were gathered on the driver")

    def train(*args, **kwargs):
        runs.append(mm.train(*args, **kwargs))
        return runs[-1]

    monkeypatch.setattr(transforms, "assemble", gathered)
    monkeypatch.setattr(transforms, "train", train)
    return runs


def _outputs_directories(staging: Path) -> list[Path]:
    return sorted(staging.glob("manymodels-outputs-*"))


def _only_file_records_came_back(run, staging: Path) -> None:
    """Every group's "model" on the driver is a file's name and row count, the
    file whole under the run's output directory."""
    _, outputs = run._ok_outputs()
    assert outputs and all(isinstance(out, WrittenOutput) for _, out in outputs)
    (directory,) = _outputs_directories(staging)
    files = {path.name for path in directory.iterdir()}
    assert {out.name for _, out in outputs} <= files
    assert not [name for name in files if name.endswith(".partial")]


def test_map_groups_outputs_never_pass_through_the_driver(engine, table, expected, tmp_path,
                                                          driver_never_gathers):
    name = engine[0]
    staging = tmp_path / "stage"
    result = mm.map_groups(summarised, _engine_frame(engine, table), by=["store", "item"],
                           order_by="day", staging=str(staging), backend="processes",
                           workers=2)
    if name == "spark":
        plan = result._jdf.queryExecution().toString()
        assert "MapInArrow" in plan and "LocalTableScan [store" not in plan
    else:
        assert result.npartitions == 3 and result.known_divisions
    _only_file_records_came_back(driver_never_gathers[0], staging)
    got = _collected(name, result)
    _same(got, expected)
    assert got["n"].isna().sum() == 3 * 2 * 2  # odd stores' rows
    if name == "dask":  # the index is the rows' positions in the whole result
        assert got.index.equals(pd.RangeIndex(5 * 2 * 3))


def test_a_crash_is_retried_and_a_failed_run_leaves_no_outputs(engine, table, expected, tmp_path,
                                                               driver_never_gathers):
    name = engine[0]
    staging = tmp_path / "stage"
    result = mm.map_groups(crash_once, _engine_frame(engine, table), by=["store", "item"],
                           order_by="day", staging=str(staging), backend=name, workers=2,
                           retries=1, shared={"marks": str(tmp_path)})
    run = driver_never_gathers[0]
    assert run.results.set_index(["store", "item"]).loc[(3, "b"), "attempts"] == 2
    _same(_collected(name, result), expected)

    with pytest.warns(RuntimeWarning, match="store 4 is bad"):
        skipped = mm.map_groups(fail_on_store_4, _engine_frame(engine, table),
                                by=["store", "item"], order_by="day", errors="skip",
                                staging=str(staging), backend="serial")
    _same(_collected(name, skipped), expected[expected["store"] != 4])

    before = _outputs_directories(staging)
    with pytest.raises(RuntimeError, match="store 4 is bad"):
        mm.map_groups(fail_on_store_4, _engine_frame(engine, table), by=["store", "item"],
                      staging=str(staging), backend="serial")
    with pytest.raises(mm.TooManyFailures):  # the error budget stops the run
        mm.map_groups(fail_on_store_4, _engine_frame(engine, table), by=["store", "item"],
                      errors="skip", max_failures=0, staging=str(staging), backend="serial")
    assert _outputs_directories(staging) == before  # the failed runs' went at once


def stamped(df):
    return df.assign(z=df["x"] * 2)


def test_timestamps_come_back_as_fn_saw_them_and_a_setup_named_key_is_refused(engine,
                                                                               tmp_path):
    name = engine[0]
    frame = pd.DataFrame({
        "store": [1, 1, 2, 2, 2],
        "ts": pd.to_datetime(["2024-03-01 10:00", "2024-03-02 11:30", "2024-03-01 09:00",
                              "2024-03-05 00:00", "2024-03-09 23:59"]).tz_localize("UTC"),
        "x": [1.0, 2.0, 3.0, 4.0, 5.0]})
    source = _engine_frame(engine, frame)
    result = mm.map_groups(stamped, source, by="store", staging=str(tmp_path / "stage"),
                           backend="serial")
    got = _collected(name, result).sort_values(["store", "x"]).reset_index(drop=True)
    mine = _collected(name, source).sort_values(["store", "x"]).reset_index(drop=True)
    assert got["ts"].tolist() == mine["ts"].tolist()  # read back as the input reads back
    assert got["z"].tolist() == [2.0, 4.0, 6.0, 8.0, 10.0]
    with pytest.raises(ValueError, match="rename the setup resource 'key'"):
        mm.map_groups(stamped, source, by="store", setup={"key": lambda: "resource"},
                      backend="serial")


def always_fails(df):
    raise ValueError("no output for this store")


def test_every_group_failing_with_errors_skip_names_them_before_the_error(engine, table,
                                                                          tmp_path):
    source = _engine_frame(engine, table)
    with pytest.warns(RuntimeWarning, match="10 group.*no output for this store"), \
            pytest.raises(ValueError, match="for every group"):
        mm.map_groups(always_fails, source, by=["store", "item"], errors="skip",
                      staging=str(tmp_path / "stage"), backend="serial")
    assert not _outputs_directories(tmp_path / "stage")


@pytest.fixture(scope="module")
def local_ray():
    return shared_ray()


@pytest.mark.ray
def test_map_groups_of_a_ray_dataset_reads_the_outputs_on_ray(local_ray, table, expected, tmp_path,
                                                              driver_never_gathers):
    """Ray tasks read the outputs into the object store, in key order; the
    files go then. A crash on Ray's workers is retried."""
    dataset = local_ray.data.from_pandas([table.iloc[:200], table.iloc[200:]])
    staging = tmp_path / "stage"
    result = mm.map_groups(crash_once, dataset, by=["store", "item"], order_by="day",
                           staging=str(staging), backend="ray", workers=2, retries=1,
                           shared={"marks": str(tmp_path)})
    assert type(result).__name__ in ("Dataset", "MaterializedDataset")
    assert all(isinstance(out, WrittenOutput)
               for _, out in driver_never_gathers[0]._ok_outputs()[1])
    assert not _outputs_directories(staging)  # read into Ray's object store: removed
    _same(result.to_pandas(), expected)



@pytest.mark.ray
@pytest.mark.parametrize("values, categories", [(list("abab"), ["b", "a"]),
                                                ([3, 1, 3, 1], [1, 3])])
def test_a_ray_datasets_categorical_key_comes_back_categorical(local_ray, tmp_path, values,
                                                               categories):
    """Ray's own schema has no type for a pandas block's categorical (an
    error and its traceback logged at each look): the key's type read as
    none, and a categorical key came back as text. Typed from the blocks'
    dtypes, it comes back with its categories, as the pandas path gives it;
    categories of numbers too (Arrow casts no number to a dictionary: the
    read crashed)."""
    frame = pd.DataFrame({"c": pd.Categorical(values, categories=categories),
                          "x": np.arange(4.0)})
    expected = mm.map_groups(_count, mm.groups(frame, by="c"), backend="serial")
    result = mm.map_groups(_count, local_ray.data.from_pandas(frame), by="c",
                           staging=str(tmp_path / "stage"), backend="serial", progress=False)
    got = result.to_pandas()
    assert got["c"].dtype == expected["c"].dtype
    assert got["c"].tolist() == expected["c"].tolist() == categories

def _nullable_ints(df):
    """Store 2's group holds a missing count and flag (pandas' ``Int64`` and
    ``boolean``), the others none."""
    missing = int(df["store"].iloc[0]) == 2
    return pd.DataFrame({"n": pd.array([len(df), None if missing else 1], dtype="Int64"),
                         "ok": pd.array([True, None if missing else False], dtype="boolean")})


def test_nullable_integers_keep_one_type_in_every_partition(engine, table, tmp_path):
    """An ``Int64`` column with a missing value in one group: the pandas path
    gives ``Int64``; a Dask result gave int64 in its meta and floats in the
    partition that held the null (Arrow's ``to_pandas``). (Spark keeps its
    own types: the Dask result's pandas types are at stake.)"""
    name = engine[0]
    if name != "dask":
        pytest.skip("a Dask result's pandas types")
    source = mm.groups(table, by=["store", "item"])
    expected = mm.map_groups(_nullable_ints, source, backend="serial")
    result = mm.map_groups(_nullable_ints, _engine_frame(engine, table), by=["store", "item"],
                           staging=str(tmp_path / "stage"), backend="serial")
    got = _collected(name, result).reset_index(drop=True)
    _same(got, expected)
    assert got["n"].isna().sum() == 2 and got["ok"].isna().sum() == 2
    if name == "dask":
        assert (str(result.dtypes["n"]), str(result.dtypes["ok"])) == ("Int64", "boolean")
        assert got.dtypes.equals(result.dtypes)
        assert got.dtypes[["n", "ok"]].equals(expected.dtypes[["n", "ok"]])


def _int_float_or_missing(df):
    """``n`` is an int in store 0, a float in store 1, pandas' ``Int64`` with a
    missing value elsewhere: pandas' concat makes it a ``Float64`` column."""
    store = int(df["store"].iloc[0])
    n = ([len(df)] if store == 0 else [len(df) + 0.5] if store == 1
         else pd.array([None], dtype="Int64"))
    return pd.DataFrame({"n": n})


def test_a_column_int_in_some_groups_and_float_in_others_is_float64(engine, table, tmp_path):
    """The nullable mark of the groups whose ``n`` is ``Int64`` was kept on the
    unified float column: the Dask result's meta failed with KeyError 'double'."""
    name = engine[0]
    if name != "dask":
        pytest.skip("a Dask result's pandas types")
    expected = mm.map_groups(_int_float_or_missing, mm.groups(table, by="store"),
                             backend="serial")
    result = mm.map_groups(_int_float_or_missing, _engine_frame(engine, table), by="store",
                           staging=str(tmp_path / "stage"), backend="serial")
    got = _collected(name, result)
    assert str(result.dtypes["n"]) == str(got.dtypes["n"]) == str(expected.dtypes["n"])
    assert got["n"].isna().sum() == 3


def _one_row(df):
    return pd.DataFrame({"n": [len(df)]})


def test_many_small_groups_make_a_few_files_not_one_a_group(engine, tmp_path,
                                                            driver_never_gathers):
    """200,000 groups made 200,000 files: a worker appends its parts to its file."""
    name = engine[0]
    rng = np.random.default_rng(5)
    frame = pd.DataFrame({"g": rng.permutation(np.repeat(np.arange(2000), 3)),
                          "x": rng.normal(size=6000)})
    staging = tmp_path / "stage"
    result = mm.map_groups(_one_row, _engine_frame(engine, frame), by="g",
                           staging=str(staging), backend="processes", workers=2)
    (directory,) = _outputs_directories(staging)
    files = list(directory.iterdir())
    assert 1 <= len(files) <= 4  # a file a worker (a replaced worker's is its own)
    batches = 0
    for path in files:
        with pa.OSFile(str(path)) as source:
            batches += sum(1 for _ in pa.ipc.open_stream(source))
    assert batches >= 2  # a part a batch
    # the groups went out in key order (not by where the engine staged them),
    # so that reading them back in key order runs through each part once
    _, outputs = driver_never_gathers[0]._ok_outputs()
    changes = sum((a.name, a.offset + a.rows) != (b.name, b.offset)
                  for (_, a), (_, b) in zip(outputs, outputs[1:]))
    assert changes < 2 * batches
    got = _collected(name, result).sort_values("g")
    assert got["g"].tolist() == list(range(2000)) and (got["n"] == 3).all()


@pytest.mark.ray
def test_a_part_a_group_on_ray_appends_to_a_few_files(local_ray, tmp_path,
                                                       driver_never_gathers):
    """With ``timeout=``, Ray's batches send each group's outcome as it ends,
    a part a group: each made a file of its own, now appended to its worker's."""
    rng = np.random.default_rng(6)
    frame = pd.DataFrame({"g": rng.permutation(np.repeat(np.arange(300), 2)),
                          "x": rng.normal(size=600)})
    result = mm.map_groups(_one_row, local_ray.data.from_pandas(frame), by="g",
                           staging=str(tmp_path / "stage"), backend="ray", workers=2,
                           timeout=60)
    _, outputs = driver_never_gathers[0]._ok_outputs()
    assert len(outputs) == 300 and len({out.name for _, out in outputs}) <= 4
    got = result.to_pandas().sort_values("g")
    assert got["g"].tolist() == list(range(300)) and (got["n"] == 2).all()


def _index_of_values(df):
    """One row under the group's largest ``h``: 2 is a position among store
    1's rows (0 to 2), 70 none of store 2's."""
    return pd.DataFrame({"v": [df["x"].sum()]}, index=[df["h"].max()])


def _filtered_series(df):
    return df["x"][df["x"] > 3]


def test_an_index_is_judged_once_for_every_group_not_output_by_output(engine, tmp_path):
    """Each worker judged its own output's index: store 1's ``[2]`` was
    dropped as a position among its rows, store 2's ``[70]`` a column
    ``index``, NaN in store 1's row (and the column after ``v``). Judged
    once, as the pandas path judges it: a column for both. A filter's
    Series, whose labels are its rows' positions, keeps none of them
    (a group that kept every row has no labels to add)."""
    name = engine[0]
    frame = pd.DataFrame({"store": [1, 1, 1, 2, 2, 2, 2], "h": [0, 1, 2, 50, 60, 70, 5],
                          "x": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})
    source = _engine_frame(engine, frame)
    got = _collected(name, mm.map_groups(_index_of_values, source, by="store",
                                         staging=str(tmp_path / "stage"), backend="serial"))
    expected = mm.map_groups(_index_of_values, mm.groups(frame, by="store"), backend="serial")
    assert list(got.columns) == list(expected.columns) == ["store", "index", "v"]
    assert got["index"].tolist() == expected["index"].tolist() == [2, 70]
    kept = _collected(name, mm.map_groups(_filtered_series, source, by="store",
                                          staging=str(tmp_path / "stage"), backend="serial"))
    assert list(kept.columns) == ["store", "x"]
    assert kept["x"].tolist() == [4.0, 5.0, 6.0]


def _count(df):
    return pd.DataFrame({"n": [len(df)]})


def test_key_columns_keep_the_input_types(engine, tmp_path):
    """The workers add a group's key as Python values: a nullable ``Int64``
    key came back float64 (1.0, NaN), a ``uint8`` one int64 and a categorical
    one text (or failed Dask's concat of ordered categoricals made per
    partition). They are of the input's types, as the pandas path gives them."""
    name = engine[0]
    if name != "dask":
        pytest.skip("a Dask result's pandas types (Spark has none of these)")
    frame = pd.DataFrame({
        "k": pd.array([1, 1, None, None, 3, 3, 3, 1], dtype="Int64"),
        "u": np.array([1, 1, 2, 2, 3, 3, 3, 1], dtype="uint8"),
        "c": pd.Categorical(list("bbzzaaab"), categories=["b", "a", "z"], ordered=True),
        # categories of numbers: Arrow casts no number to a dictionary (the read crashed)
        "i": pd.Categorical([5, 5, 7, 7, 2, 2, 2, 5], categories=[7, 5, 2]),
        "f": np.array([1, 1, 2, 2, 3, 3, 3, 1], dtype="float32") / 2,  # float64 came back,
        "t": pd.to_datetime(np.array([1, 1, 2, 2, 3, 3, 3, 1]), unit="D").as_unit("s"),  # [us]
        "x": np.arange(8.0)})
    for key in ("k", "u", "c", "i", "f", "t"):
        expected = mm.map_groups(_count, mm.groups(frame, by=key), backend="serial")
        result = mm.map_groups(_count, _engine_frame(engine, frame), by=key,
                               staging=str(tmp_path / "stage"), backend="serial")
        got = _collected(name, result).reset_index(drop=True)
        assert result.dtypes[key] == got.dtypes[key] == expected.dtypes[key], key
        pd.testing.assert_frame_equal(got, expected, check_index_type=False)



def _rows_and_type(df):
    return df.assign(seen=str(df["v"].dtype))


def test_a_nullable_column_reaches_fn_and_comes_back_as_the_dask_frame_holds_it(engine,
                                                                                tmp_path):
    """A Dask ``Int64`` column other than a key reached ``fn`` as ``float64``
    in a group with a missing value (``int64`` in the others), and came back
    so, where the pandas path hands ``fn`` and gives back ``Int64``."""
    name = engine[0]
    if name != "dask":
        pytest.skip("a Dask frame's pandas types (Spark has none)")
    frame = pd.DataFrame({"k": [1, 1, 2, 2], "v": pd.array([1, None, 2, 3], dtype="Int64"),
                          "b": pd.array([True, None, False, True], dtype="boolean")})
    expected = mm.map_groups(_rows_and_type, mm.groups(frame, by="k"), backend="serial")
    result = mm.map_groups(_rows_and_type, _engine_frame(engine, frame), by="k",
                           staging=str(tmp_path / "stage"), backend="serial")
    got = _collected(name, result).reset_index(drop=True)
    assert got["seen"].tolist() == ["Int64"] * 4
    assert got.dtypes[["v", "b"]].equals(expected.dtypes[["v", "b"]])
    assert result.dtypes[["v", "b"]].equals(expected.dtypes[["v", "b"]])

def _relabelled(df):
    """The group's rows with the key column replaced by fn's own text."""
    return df.assign(**{df.columns[0]: "group " + df.iloc[:, 0].astype(str)})


def test_a_key_column_fn_returns_of_its_own_keeps_fn_s_values(engine, tmp_path):
    """The key columns were cast to the input's types whatever their
    values: a ``uint8`` key fn had relabelled as text failed the read with
    Arrow's bare 'Failed to parse string', and a categorical one read every
    value as NaN (not among the categories). Only the keys the workers add,
    or fn returned as it got them, take the input's type; fn's own stay fn's,
    as the pandas path gives them."""
    name = engine[0]
    if name != "dask":
        pytest.skip("a Dask result's pandas types (Spark has none of these)")
    frame = pd.DataFrame({
        "u": np.array([1, 1, 2, 3], dtype="uint8"), "x": np.arange(4.0),
        "c": pd.Categorical(list("bbaz"), categories=["b", "a", "z"], ordered=True)})
    for key in ("u", "c"):
        rows = frame[[key] + [c for c in frame.columns if c != key]]
        expected = mm.map_groups(_relabelled, mm.groups(rows, by=key), backend="serial")
        result = mm.map_groups(_relabelled, _engine_frame(engine, rows), by=key,
                               staging=str(tmp_path / key), backend="serial")
        got = _collected(name, result).reset_index(drop=True)
        assert got[key].tolist() == expected[key].tolist(), key
        assert got[key].tolist()[0] == "group " + str(rows[key].iloc[0]), key


def _empty_dict_for_store_1(df):
    return {} if int(df["store"].iloc[0]) == 1 else _count(df)


def _a_dict(df):
    return {"n": len(df)}


def test_a_dict_is_refused_naming_its_group_and_an_empty_one_left_out(engine, table, tmp_path):
    """The workers' writer called a dict no table: every group failed, each
    with a traceback, where the pandas path refuses a dict naming its group
    and leaves out a group whose ``fn`` returned ``{}`` (no rows, as None)."""
    name = engine[0]
    source = _engine_frame(engine, table)
    got = _collected(name, mm.map_groups(_empty_dict_for_store_1, source, by="store",
                                         staging=str(tmp_path / "stage"), backend="serial"))
    assert sorted(got["store"]) == [0, 2, 3, 4]
    with pytest.raises(TypeError, match="returned a dict for 0, not a table"):
        mm.map_groups(_a_dict, source, by="store", staging=str(tmp_path / "refused"),
                      backend="serial")
    assert not _outputs_directories(tmp_path / "refused")
