"""Groups read on the workers: the driver reads the key columns only, each
batch reads its own groups' rows from the Parquet files."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import manymodels as mm
from conftest import BACKENDS, collected_until

pytestmark = pytest.mark.usefixtures("no_leftovers")


def write_parts(sales: pd.DataFrame, directory) -> None:
    """Three files; every store's rows are spread over all of them."""
    directory.mkdir()
    for i, (_, chunk) in enumerate(sales.groupby(sales.index % 3)):
        pq.write_table(pa.Table.from_pandas(chunk, preserve_index=False),
                       directory / f"part-{i}.parquet")


def describe(df):
    """Order-sensitive: the first row's x shows that rows keep their order."""
    return {"rows": len(df), "first_x": float(df["x"].iloc[0]), "sum_y": float(df["y"].sum()),
            "index_is_range": bool(df.index.equals(pd.RangeIndex(len(df))))}


@pytest.mark.parametrize("backend", BACKENDS)
def test_read_on_workers_equals_reading_on_the_driver(tmp_path, sales, backend):
    write_parts(sales, tmp_path / "parts")
    eager = mm.train(describe, mm.groups(tmp_path / "parts", by=["store", "item"]),
                     backend="serial", progress=False)
    lazy = mm.train(describe, mm.groups(tmp_path / "parts", by=["store", "item"],
                                        read_on_workers=True),
                    backend=backend, workers=2, progress=False)
    assert len(lazy.results) == 60 and lazy.failed.empty
    pd.testing.assert_frame_equal(lazy.results.drop(columns=["worker", "duration_s",
                                                             "started_s", "attempts"]),
                                  eager.results.drop(columns=["worker", "duration_s",
                                                              "started_s", "attempts"]))
    assert lazy.results["index_is_range"].all()


def arrow_width(table):
    return {"columns": table.num_columns, "rows": table.num_rows}


def test_read_on_workers_in_every_format_and_with_a_grid(tmp_path, sales):
    path = tmp_path / "sales.parquet"
    pq.write_table(pa.Table.from_pandas(sales, preserve_index=False), path)
    run = mm.train(arrow_width, mm.groups(path, by="store", format="arrow",
                                          read_on_workers=True), workers=2, progress=False)
    assert (run.results["columns"] == 4).all() and (run.results["rows"] == 150).all()
    source = mm.groups(path, by="store", read_on_workers=True) * mm.grid(alpha=[0.0, 1.0])
    models = mm.train(lambda df, alpha: len(df) + alpha, source, backend="threads",
                      progress=False).models
    assert models[("s03", 1.0)] == 151.0 and len(models) == 24


def test_read_on_workers_refuses_what_it_cannot_read(tmp_path, sales):
    sales.to_csv(tmp_path / "sales.csv", index=False)
    with pytest.raises(ValueError, match=r"reads Parquet only; .*sales\.csv"):
        mm.groups(tmp_path / "sales.csv", by="store", read_on_workers=True)
    with pytest.raises(TypeError, match="needs the path of a Parquet file"):
        mm.groups(sales, by="store", read_on_workers=True)
    pq.write_table(pa.Table.from_pandas(sales, preserve_index=False), tmp_path / "s.parquet")
    with pytest.raises(ValueError, match="by column 'shop' is not in the Parquet files"):
        mm.groups(tmp_path / "s.parquet", by="shop", read_on_workers=True)
    with_nulls = sales.assign(store=sales["store"].where(sales.index != 7, None))
    pq.write_table(pa.Table.from_pandas(with_nulls, preserve_index=False),
                   tmp_path / "n.parquet")
    with pytest.raises(ValueError, match="by column 'store' has missing values"):
        mm.groups(tmp_path / "n.parquet", by="store", read_on_workers=True)


def test_a_file_that_lacks_a_column_is_refused_as_an_eager_read_refuses_it(tmp_path):
    """The workers' read filled the column one file lacks with NaN, and every
    model trained on it, where an eager read of the folder refuses it: both
    refuse it now, naming both files and the column, before any task runs."""
    pq.write_table(pa.table({"k": [1, 2], "x": [10.0, 20.0], "y": [1.0, 2.0]}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": [2, 1], "y": [3.0, 4.0]}), tmp_path / "b.parquet")
    for lazy in (False, True):
        with pytest.raises(ValueError, match=r"do not share their columns: .*b\.parquet' lacks "
                                             r"the columns \['x'\], which .*a\.parquet' has"):
            mm.groups(tmp_path, by="k", read_on_workers=lazy)
    pq.write_table(pa.table({"k": [3], "x": [1.0], "y": [1.0], "z": [0]}), tmp_path / "c.parquet")
    (tmp_path / "b.parquet").unlink()
    with pytest.raises(ValueError, match=r"c\.parquet' has the columns \['z'\], which"):
        mm.groups(tmp_path, by="k", read_on_workers=True)


def test_a_file_that_cannot_be_read_is_the_one_named(tmp_path):
    """The workers' read named the folder's first file (a good one) when
    another could not be read; the eager read names the bad one, and so
    does the workers' read now."""
    pq.write_table(pa.table({"k": [1], "y": [1.0]}), tmp_path / "a_good.parquet")
    (tmp_path / "b_bad.parquet").write_bytes(b"garbage")
    for lazy in (False, True):
        with pytest.raises(ValueError, match=r"cannot read table file '[^']*b_bad\.parquet'"):
            mm.groups(tmp_path, by="k", read_on_workers=lazy)


def count_rows(df):
    return len(df)


def test_read_on_workers_reuses_until_a_file_changes(tmp_path, sales):
    write_parts(sales, tmp_path / "parts")
    source = mm.groups(tmp_path / "parts", by="store", read_on_workers=True)
    first = mm.train(count_rows, source, store=tmp_path / "store", progress=False)
    again = mm.train(count_rows, source, store=tmp_path / "store", progress=False)
    assert first.summary().reused == 0 and again.summary().reused == 12
    extra = sales.head(3).assign(x=np.arange(3.0))
    pq.write_table(pa.Table.from_pandas(extra, preserve_index=False),
                   tmp_path / "parts" / "part-9.parquet")
    changed = mm.train(count_rows, mm.groups(tmp_path / "parts", by="store",
                                             read_on_workers=True),
                       store=tmp_path / "store", progress=False)
    touched = set(extra["store"])  # only the groups with rows in the new file retrain
    assert changed.summary().reused == 12 - len(touched)
    assert sum(changed.models.values()) == len(sales) + 3


def first_value(df):
    return float(df["v"].iloc[0]), len(df)


def test_read_on_workers_with_int_bool_and_timestamp_keys(tmp_path):
    n = 600
    frame = pd.DataFrame({
        "shop": np.arange(n) % 7,
        "open": (np.arange(n) // 7) % 2 == 0,
        "day": pd.to_datetime("2024-01-01") + pd.to_timedelta(np.arange(n) % 3, unit="D"),
        "v": np.arange(n, dtype=float),
    }).sample(frac=1.0, random_state=1)
    (tmp_path / "parts").mkdir()
    for i in range(3):
        pq.write_table(pa.Table.from_pandas(frame.iloc[i::3], preserve_index=False),
                       tmp_path / "parts" / f"p{i}.parquet")
    by = ["shop", "open", "day"]
    eager = mm.train(first_value, mm.groups(tmp_path / "parts", by=by), backend="serial",
                     progress=False)
    lazy = mm.train(first_value, mm.groups(tmp_path / "parts", by=by, read_on_workers=True),
                    workers=2, progress=False)
    assert lazy.failed.empty and len(lazy.models) == len(eager.models) == 42
    assert lazy.models == eager.models


def row_ids(df):
    return sorted(df["rid"].tolist())


def test_read_on_workers_keeps_the_rows_of_a_zero_key_of_either_sign(tmp_path):
    """-0.0 and 0.0 are one group (as pandas groups them), but Arrow's
    is_in told them apart: the rows of the sign the group's first row did
    not have were silently dropped."""
    pq.write_table(pa.table({"k": [-0.0, 1.0, 0.0, 0.0], "rid": [0, 1, 2, 3]}),
                   tmp_path / "a.parquet")
    eager, lazy = (mm.train(row_ids, mm.groups(tmp_path, by="k", read_on_workers=lazy),
                            backend="serial", progress=False) for lazy in (False, True))
    assert sorted(eager.models.values()) == [[0, 2, 3], [1]]
    assert sorted(lazy.models.values()) == [[0, 2, 3], [1]]


def sorted_x(df):
    return sorted(df["x"].tolist())


@pytest.mark.parametrize("lazy", [False, True])
def test_hive_partition_folders_are_columns(tmp_path, lazy):
    """A directory written with partition_cols= keeps those columns in its
    folder names (year=2020/): they were dropped, and by= could not name them."""
    pq.write_to_dataset(pa.table({"store": ["a", "a", "b", "b"], "year": [2020, 2021, 2020, 2021],
                                  "region": ["n s", "n s", "s", "s"], "x": [1.0, 2.0, 3.0, 4.0]}),
                        tmp_path, partition_cols=["year", "region"])
    by_year = mm.train(sorted_x, mm.groups(tmp_path, by="year", read_on_workers=lazy),
                       backend="serial", progress=False)
    assert dict(by_year.models) == {2020: [1.0, 3.0], 2021: [2.0, 4.0]}
    by_both = mm.train(sorted_x, mm.groups(tmp_path, by=["store", "region"],
                                           read_on_workers=lazy),
                       backend="serial", progress=False)  # "n s": URL-decoded from n%20s
    assert dict(by_both.models) == {("a", "n s"): [1.0, 2.0], ("b", "s"): [3.0, 4.0]}
    seen = mm.train(lambda df: sorted(df.columns), mm.groups(tmp_path, by="store",
                                                             read_on_workers=lazy),
                    backend="serial", progress=False)
    assert seen.models["a"] == ["region", "store", "x", "year"]


@pytest.mark.parametrize("lazy", [False, True])
def test_partition_folders_under_a_folder_named_with_a_question_mark_are_columns(
        tmp_path, lazy):
    """A local folder's '?' or '%' is part of its name, not a URI's query or
    escape: read on the workers, its partition columns were dropped."""
    folder = tmp_path / "da?ta%41"
    pq.write_to_dataset(pa.table({"store": ["a", "b"], "year": [2020, 2021], "x": [1.0, 2.0]}),
                        folder, partition_cols=["year"])
    run = mm.train(sorted_x, mm.groups(folder, by=["store", "year"], read_on_workers=lazy),
                   backend="serial", progress=False)
    assert dict(run.models) == {("a", 2020): [1.0], ("b", 2021): [2.0]}


def test_files_partitioned_differently_are_refused_by_name(tmp_path):
    (tmp_path / "year=2020").mkdir()
    pq.write_table(pa.table({"x": [1.0]}), tmp_path / "year=2020" / "a.parquet")
    pq.write_table(pa.table({"x": [2.0]}), tmp_path / "b.parquet")
    with pytest.raises(ValueError, match="are not partitioned alike"):
        mm.train(sorted_x, mm.groups(tmp_path, by="x"), backend="serial", progress=False)


def ordered_rows(df):
    """Order-sensitive: the rows' x in the order fit receives them."""
    return [round(v, 12) for v in df["x"].tolist()]


def test_unsorted_files_are_sorted_once_into_files_the_workers_map(tmp_path, sales, monkeypatch):
    """Every file holds rows of every store: the rows are sorted once, in
    several buckets here, into staging=, and fit gets each group's rows in the
    order an eager read gives them (order_by too); the files go with the source."""
    import gc

    from manymodels.planning import sortedreads

    monkeypatch.setattr(sortedreads, "BUCKET_BYTES", 3000)  # a few groups a bucket
    monkeypatch.setattr(sortedreads, "WRITE_ROWS", 7)  # a group over two of its writes
    write_parts(sales.assign(day=np.arange(len(sales)) % 7), tmp_path / "parts")
    eager = mm.train(ordered_rows, mm.groups(tmp_path / "parts", by="store", order_by="day"),
                     backend="serial", progress=False)
    source = mm.groups(tmp_path / "parts", by="store", order_by="day", read_on_workers=True,
                       staging=tmp_path / "stage")
    lazy = mm.train(ordered_rows, source, backend="processes", workers=2, progress=False)
    assert dict(lazy.models) == dict(eager.models)
    (sorted_dir,) = (tmp_path / "stage").iterdir()
    buckets = sorted(path.name for path in sorted_dir.iterdir())
    assert len(buckets) > 2 and all(name.endswith(".arrow") for name in buckets)
    again = mm.train(ordered_rows, source, backend="serial", progress=False)  # sorted once
    assert dict(again.models) == dict(eager.models)
    assert sorted(path.name for path in sorted_dir.iterdir()) == buckets
    del source, lazy, again  # (a run keeps its plan)
    gc.collect()
    assert not sorted_dir.exists()


def test_files_in_key_order_are_scanned_per_batch_unsorted(tmp_path, sales):
    """Files written group by group need no sort: nothing is staged."""
    ordered = sales.sort_values(["store", "item"], kind="stable")
    (tmp_path / "parts").mkdir()
    for i, stores in enumerate(np.array_split(ordered["store"].unique(), 3)):
        chunk = ordered[ordered["store"].isin(stores)]
        pq.write_table(pa.Table.from_pandas(chunk, preserve_index=False),
                       tmp_path / "parts" / f"part-{i}.parquet")
    lazy = mm.train(ordered_rows, mm.groups(tmp_path / "parts", by="store",
                                            read_on_workers=True, staging=tmp_path / "stage"),
                    backend="serial", progress=False)
    eager = mm.train(ordered_rows, mm.groups(tmp_path / "parts", by="store"),
                     backend="serial", progress=False)
    assert dict(lazy.models) == dict(eager.models)
    assert not (tmp_path / "stage").exists()


def test_keys_of_files_in_key_order_keep_their_types_in_the_results(tmp_path):
    """Files scanned per batch (in key order): the results' key columns have
    the files' types, as an eager read's have (an int8 key was int64, a
    float32 one float64, a categorical one objects)."""
    pq.write_table(pa.table({"small": pa.array([-1, -1, 3], pa.int8()),
                             "ratio": pa.array([0.5, 0.5, 0.25], pa.float32()),
                             "shop": pa.array(["b", "b", "a"]).dictionary_encode(),
                             "v": [1.0, 2.0, 3.0]}), tmp_path / "a.parquet")
    for by in ("small", "ratio", "shop"):
        eager, lazy = (mm.train(len, mm.groups(tmp_path, by=by, read_on_workers=lazy),
                                backend="serial", progress=False) for lazy in (False, True))
        assert lazy.results[by].dtype == eager.results[by].dtype != object, by
        assert lazy.results[by].tolist() == eager.results[by].tolist()


def test_a_staging_that_is_a_file_unwritable_or_under_home_is_taken_as_meant(
        tmp_path, monkeypatch):
    """staging= a file was a bare FileExistsError at train time, and
    staging='~/stage' made a folder named '~' in the working directory."""
    frame = pd.DataFrame({"g": ["a", "b", "a", "b"], "x": [1, 2, 3, 4]})
    for part in range(2):
        frame.to_parquet(tmp_path / f"part-{part}.parquet", index=False)
    (tmp_path / "a-file").write_text("")
    with pytest.raises(ValueError, match=r"staging='.*a-file' is a file"):
        mm.groups(tmp_path, by="g", read_on_workers=True, staging=tmp_path / "a-file")
    # staging=True made a folder named "True" in the working directory
    for wrong in (True, 1):
        with pytest.raises(TypeError, match=r"staging= must be a directory's path"):
            mm.groups(tmp_path, by="g", read_on_workers=True, staging=wrong)
    (tmp_path / "locked").mkdir(mode=0o500)
    source = mm.groups(tmp_path, by="g", read_on_workers=True,
                       staging=tmp_path / "locked" / "stage")
    if os.geteuid() != 0:  # (root writes anywhere)
        with pytest.raises(ValueError, match=r"staging='.*locked/stage': cannot make a "
                                             "directory there"):
            mm.train(len, source, backend="serial", progress=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    source = mm.groups(tmp_path, by="g", read_on_workers=True, staging="~/stage")
    assert mm.train(len, source, backend="serial", progress=False).models == {"a": 4, "b": 4}
    assert (tmp_path / "home" / "stage").is_dir() and not (tmp_path / "~").exists()


def test_a_file_that_changes_before_the_sort_is_named_and_nothing_is_left(tmp_path, sales):
    write_parts(sales, tmp_path / "parts")
    source = mm.groups(tmp_path / "parts", by="store", read_on_workers=True,
                       staging=tmp_path / "stage")  # the key columns are read now
    grown = pd.concat([pq.read_table(tmp_path / "parts" / "part-1.parquet").to_pandas(),
                       sales.head(2)])
    pq.write_table(pa.Table.from_pandas(grown, preserve_index=False),
                   tmp_path / "parts" / "part-1.parquet")
    with pytest.raises(ValueError, match="part-1.parquet' changed since mm.groups read its keys"):
        mm.train(count_rows, source, backend="serial", progress=False)
    assert list((tmp_path / "stage").iterdir()) == []


@pytest.fixture(scope="module")
def s3():
    """An S3 API server on loopback (moto's server mode), found by the
    driver and by every worker through the AWS SDK's own variables; yields a
    pyarrow filesystem on it with an empty bucket named "bucket"."""
    moto_server = pytest.importorskip("moto.server")
    boto3 = pytest.importorskip("boto3")
    from pyarrow import fs

    from manymodels.inputs import objectstores

    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    with pytest.MonkeyPatch.context() as env:
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
                            "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():
            env.setenv(name, value)
        objectstores._filesystem.cache_clear()  # one made for another endpoint
        boto3.client("s3").create_bucket(Bucket="bucket")
        yield fs.S3FileSystem(endpoint_override=f"http://{host}:{port}", region="us-east-1")
        objectstores._filesystem.cache_clear()
    server.stop()


def _write_both(s3, tmp_path, prefix: str, parts: dict[str, pd.DataFrame]) -> str:
    """The same files on the object store and in a local folder (for an eager
    read to compare with); the location of the first."""
    for name, chunk in parts.items():
        table = pa.Table.from_pandas(chunk, preserve_index=False)
        pq.write_table(table, f"bucket/{prefix}/{name}", filesystem=s3)
        (tmp_path / prefix / name).parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, tmp_path / prefix / name)
    return f"s3://bucket/{prefix}"


_UNTIMED = ["worker", "duration_s", "started_s", "attempts"]


def test_unsorted_parquet_on_an_object_store_is_sorted_once_and_read(s3, tmp_path, sales):
    """Every object holds rows of every store, under name=value folders: the
    driver lists the objects and reads their key columns, the rows are sorted
    once (an object at a time) into staging=, and fit gets what an eager read
    of the same files gives, folder columns included."""
    parts = {f"region={'north' if i < 2 else 'south'}/part-{i}.parquet": chunk
             for i, (_, chunk) in enumerate(sales.groupby(sales.index % 3))}
    location = _write_both(s3, tmp_path, "unsorted", parts)
    source = mm.groups(location, by=["store", "item"], read_on_workers=True,
                       staging=tmp_path / "stage")
    assert source.reader.files[0] == f"{location}/region=north/part-0.parquet"
    lazy = mm.train(describe, source, backend="processes", workers=2, progress=False)
    eager = mm.train(describe, mm.groups(tmp_path / "unsorted", by=["store", "item"]),
                     backend="serial", progress=False)
    assert lazy.failed.empty and len(lazy.results) == 60
    pd.testing.assert_frame_equal(lazy.results.drop(columns=_UNTIMED),
                                  eager.results.drop(columns=_UNTIMED))
    assert source._sorted_groups is not None  # sorted once, not scanned per batch
    regions = mm.train(lambda df: {"regions": ",".join(sorted(set(df["region"])))},
                       mm.groups(location, by="store", read_on_workers=True),
                       backend="serial", progress=False)
    assert set(regions.results["regions"]) == {"north,south"}

    # read here, whole (no read_on_workers), as the local folder is read
    here = mm.train(describe, mm.groups(location, by=["store", "item"]), backend="serial",
                    progress=False, store=tmp_path / "here")
    pd.testing.assert_frame_equal(here.results.drop(columns=_UNTIMED + ["reused"]),
                                  eager.results.drop(columns=_UNTIMED + ["reused"]))
    with pytest.raises(ValueError, match="column 'price' is not in 's3://bucket/unsorted'"):
        mm.groups(location, by="store", columns=["store", "price"])
    with pytest.raises(ValueError, match="is on an object store, which this call does not"):
        mm.map_partitions(lambda df: df, location)
    for name, table in (("a", pa.table({"store": [1], "y": [1.0]})),
                        ("b", pa.table({"store": [2], "y": [2.0], "price": [9.0]}))):
        pq.write_table(table, f"bucket/mixed/{name}.parquet", filesystem=s3)
    with pytest.raises(ValueError, match=r"do not share their columns: .*b\.parquet' has "
                                         r"the columns \['price'\], which .*a\.parquet' lacks"):
        mm.groups("s3://bucket/mixed", by="store")  # as a local folder is refused
    odd = {"part #1.parquet": sales.iloc[:50], "what?100%.parquet": sales.iloc[50:]}
    for name, chunk in odd.items():  # keys a URI must quote: '#', '?', '%', a space
        pq.write_table(pa.Table.from_pandas(chunk, preserve_index=False),
                       f"bucket/odd/{name}", filesystem=s3)
    counts = [mm.train(lambda df: {"n": len(df)}, mm.groups(
        "s3://bucket/odd", by="store", read_on_workers=lazy), backend="serial",
        progress=False).results.set_index("store")["n"] for lazy in (False, True)]
    pd.testing.assert_series_equal(counts[0], counts[1])
    assert counts[0].sum() == len(sales)


def test_objects_partitioned_unlike_are_named_by_their_uris(s3):
    """Folders of other columns under one prefix were refused naming
    's3:/bucket/...' (a Path of the URI folds its '//')."""
    table = pa.table({"store": [1], "y": [1.0]})
    for folder in ("region=a", "store=b"):
        pq.write_table(table, f"bucket/folders/{folder}/part-0.parquet", filesystem=s3)
    for lazy in (False, True):
        with pytest.raises(ValueError, match="are not partitioned alike") as refused:
            mm.groups("s3://bucket/folders", by="y", read_on_workers=lazy)
        assert "'s3://bucket/folders/store=b/part-0.parquet'" in str(refused.value)
        assert "s3:/bucket" not in str(refused.value)


def test_objects_in_key_order_are_read_by_the_workers_and_reused_until_one_changes(
        s3, tmp_path, sales):
    """Objects written group by group are scanned by the workers (nothing
    staged); a re-run reuses every model, and rewriting one object retrains
    its groups only. A location that names nothing is refused by name."""
    ordered = sales.sort_values(["store", "item"], kind="stable")
    chunks = np.array_split(ordered["store"].unique(), 3)
    parts = {f"part-{i}.parquet": ordered[ordered["store"].isin(stores)]
             for i, stores in enumerate(chunks)}
    location = _write_both(s3, tmp_path, "ordered", parts)
    store = tmp_path / "store"
    first = mm.train(fit_rows, mm.groups(location, by="store", read_on_workers=True,
                                         staging=tmp_path / "stage"),
                     backend="processes", workers=2, store=store, progress=False)
    eager = mm.train(fit_rows, mm.groups(tmp_path / "ordered", by="store"),
                     backend="serial", progress=False)
    pd.testing.assert_frame_equal(first.results.drop(columns=[*_UNTIMED, "reused"]),
                                  eager.results.drop(columns=[*_UNTIMED, "reused"]))
    assert not (tmp_path / "stage").exists()
    again = mm.train(fit_rows, mm.groups(location, by="store", read_on_workers=True),
                     backend="processes", workers=2, store=store, progress=False)
    assert again.results["reused"].all()
    grown = pd.concat([parts["part-1.parquet"], parts["part-1.parquet"].head(3)])
    pq.write_table(pa.Table.from_pandas(grown, preserve_index=False),
                   "bucket/ordered/part-1.parquet", filesystem=s3)
    third = mm.train(fit_rows, mm.groups(location, by="store", read_on_workers=True),
                     backend="processes", workers=2, store=store, progress=False)
    retrained = third.results.loc[~third.results["reused"], "store"].tolist()
    assert retrained == sorted(chunks[1])
    assert third.results.set_index("store").loc[grown["store"].iloc[0], "rows"] > 5 * 30 - 1
    with pytest.raises(ValueError, match="'s3://bucket/nothing' does not exist"):
        mm.groups("s3://bucket/nothing", by="store", read_on_workers=True)
    with pytest.raises(ValueError, match="cannot open 'http://host/sales' with pyarrow's"):
        mm.groups("http://host/sales", by="store", read_on_workers=True)


def fit_rows(df):
    return {"rows": len(df), "sum_y": float(df["y"].sum())}


def _staged_objects(s3) -> list[str]:
    from pyarrow import fs

    found = s3.get_file_info(fs.FileSelector("bucket/stage", recursive=True,
                                             allow_not_found=True))
    return [entry.path for entry in found if entry.type == fs.FileType.File]


def test_unsorted_files_are_sorted_once_into_an_object_store(s3, tmp_path, sales):
    """staging= may be an object store's: the sorted buckets are uploaded (the
    sort itself works in a temporary directory here, left empty), the workers
    fetch their groups' rows from them, and the objects go with the source."""
    import tempfile

    write_parts(sales, tmp_path / "parts")
    before = set(os.listdir(tempfile.gettempdir()))
    # (moto's servers share one in-memory store: another module's objects may
    # be there still, going with their own sources)
    others = set(_staged_objects(s3))
    source = mm.groups(tmp_path / "parts", by=["store", "item"], read_on_workers=True,
                       staging="s3://bucket/stage")
    lazy = mm.train(describe, source, backend="processes", workers=2, progress=False)
    eager = mm.train(describe, mm.groups(tmp_path / "parts", by=["store", "item"]),
                     backend="serial", progress=False)
    pd.testing.assert_frame_equal(lazy.results.drop(columns=_UNTIMED),
                                  eager.results.drop(columns=_UNTIMED))
    staged = set(_staged_objects(s3)) - others
    assert staged and all(path.endswith(".arrow") for path in staged)
    assert {name for name in set(os.listdir(tempfile.gettempdir())) - before
            if name.startswith("manymodels-sorting-")} == set()
    del source, lazy
    assert collected_until(lambda: not staged & set(_staged_objects(s3))), _staged_objects(s3)
    with pytest.raises(ValueError, match="staging='nosuch://x/y' cannot be opened"):
        mm.groups(tmp_path / "parts", by="store", read_on_workers=True, staging="nosuch://x/y")
    elsewhere = mm.groups(tmp_path / "parts", by="store", read_on_workers=True,
                          staging="s3://no-such-bucket/stage")
    with pytest.raises(ValueError, match="staging='s3://no-such-bucket/stage': cannot write"):
        mm.train(describe, elsewhere, backend="serial", progress=False)


def test_a_staged_object_is_read_a_record_batch_at_a_time(s3, monkeypatch):
    """A worker fetches the record batches its groups lie in, and holds only
    those of its current batch."""
    from manymodels.inputs import objectstores

    monkeypatch.setattr(objectstores, "STAGED_BATCH_BYTES", 800)  # 100 rows of int64
    table = pa.table({"v": np.arange(1_050, dtype=np.int64)})
    uri = objectstores.child("s3://bucket/stage", "one file.arrow")
    objectstores.write_arrow_file(uri, table)
    remote = objectstores.RemoteArrowFile(uri)
    assert remote._reader.num_record_batches == 11
    for offset, length in [(0, 1), (95, 10), (100, 100), (199, 2), (1_000, 50), (0, 1_050)]:
        assert remote.slice(offset, length).equals(table.slice(offset, length))
    remote.keep_only([(250, 10), (420, 90)])
    assert sorted(remote._batches) == [2, 4, 5]
    objectstores.remove_tree("s3://bucket/stage")
    assert _staged_objects(s3) == []


def test_object_store_locations_are_checked_and_their_keys_never_shown(s3, tmp_path, sales):
    """A '#' the URI does not quote would make every object under it one
    (and a clean-up remove the user's own prefix); a key in the URI is
    shown as ***; a staged object that cannot be read fails its groups'
    tasks, with the reason, not the run."""
    import gc

    from manymodels.inputs import objectstores

    write_parts(sales, tmp_path / "parts")
    with s3.open_output_stream("bucket/data/keep-me.csv") as out:
        out.write(b"the user's own object")
    with pytest.raises(ValueError, match="has a '#', which ends a URI's path: write it as %23"):
        mm.groups(tmp_path / "parts", by="store", read_on_workers=True,
                  staging="s3://bucket/data#run1")
    with pytest.raises(ValueError, match="has a '#'"):
        mm.groups("s3://bucket/data#run1", by="store", read_on_workers=True)
    assert objectstores.shown("s3://AKIA:wJalr%2FK@bucket/s?secret_key=abc&region=x") == (
        "s3://AKIA:***@bucket/s?secret_key=***&region=x")
    assert objectstores.redacted("cannot open 's3://b/s?secret_key=abc'", "s3://b/s") == (
        "cannot open 's3://b/s?secret_key=***'")  # an option first in the query too
    with pytest.raises(ValueError) as refused:
        mm.groups(tmp_path / "parts", by="store", read_on_workers=True,
                  staging="s3://AKIA:wJalr@bucket/s?no_such_option=1")
    assert "wJalr" not in str(refused.value) and "AKIA:***@bucket" in str(refused.value)
    assert [entry.path for entry in s3.get_file_info(
        fs_selector("bucket/data"))] == ["bucket/data/keep-me.csv"]

    source = mm.groups(tmp_path / "parts", by=["store", "item"], read_on_workers=True,
                       staging="s3://bucket/stage")
    mm.train(describe, source, backend="serial", progress=False)  # sorted and staged
    staged = _staged_objects(s3)
    s3.delete_file(staged[0])  # (an object store's read error, as a worker meets it)
    for backend in ("serial", "threads"):
        run = mm.train(describe, source, backend=backend, workers=2, progress=False)
        assert set(run.results["status"]) == {"failed"}
        assert "the staged rows of this group" in run.results["error"].iloc[0]
    del source, run
    gc.collect()


def test_errors_about_the_objects_under_a_location_never_show_its_keys(s3):
    """Objects that do not share their columns or types, or whose folders
    name a column they hold, are refused naming them with the URI's
    secret as ***, read here or on the workers."""
    for folder, tables in {"unlike": [{"g": [1], "x": [1.0]}, {"g": [1], "y": [1.0]}],
                           "untyped": [{"g": [1], "x": [1.0]}, {"g": [1], "x": [[1.0]]}],
                           "hive/g=1": [{"g": [1], "x": [1.0]}]}.items():
        for number, columns in enumerate(tables):
            pq.write_table(pa.table(columns), f"bucket/{folder}/{number}.parquet",
                           filesystem=s3)
        for lazy in (True, False):
            with pytest.raises(ValueError) as refused:
                mm.groups(f"s3://AKIA:wJalr@bucket/{folder.split('/')[0]}", by="g",
                          read_on_workers=lazy)
            assert "wJalr" not in str(refused.value), str(refused.value)
            assert "AKIA:***@bucket" in str(refused.value)


def fs_selector(path: str):
    from pyarrow import fs

    return fs.FileSelector(path, recursive=True, allow_not_found=True)


def test_a_table_of_several_chunks_is_staged_in_even_batches(s3, monkeypatch):
    from manymodels.inputs import objectstores

    monkeypatch.setattr(objectstores, "STAGED_BATCH_BYTES", 800)
    table = pa.concat_tables([pa.table({"v": np.arange(150, dtype=np.int64)}),
                              pa.table({"v": np.arange(150, 300, dtype=np.int64)})])
    uri = "s3://bucket/stage/chunks.arrow"
    objectstores.write_arrow_file(uri, table)
    assert objectstores.RemoteArrowFile(uri).slice(200, 3).column("v").to_pylist() == [
        200, 201, 202]
    objectstores.remove_tree("s3://bucket/stage")


def test_a_staged_table_streams_whole_or_leaves_no_arrow_file(s3, monkeypatch):
    """Chunks with dictionaries of their own are written as one dictionary a
    column; a write that fails midway, whose clean-up fails too (the network
    gone), leaves no Arrow file a reader could take part of the rows from."""
    from pyarrow import ipc

    from manymodels.inputs import objectstores

    monkeypatch.setattr(objectstores, "STAGED_BATCH_BYTES", 800)
    words = pa.concat_tables([
        pa.table({"c": pa.array(["u", "v"] * 60).dictionary_encode()}),
        pa.table({"c": pa.array(["w", "u"] * 60).dictionary_encode()})])
    objectstores.write_arrow_file("s3://bucket/stage/words.arrow", words)
    back = objectstores.RemoteArrowFile("s3://bucket/stage/words.arrow")
    assert back.slice(0, 240).column("c").to_pylist() == words.column("c").to_pylist()

    table = pa.table({"v": np.arange(1_000, dtype=np.int64)})
    real_slice, sliced = pa.Table.slice, []

    class Midway(Exception):
        pass

    class Failing:  # the table, whose third batch cannot be made
        nbytes, num_rows, schema = table.nbytes, table.num_rows, table.schema

        def unify_dictionaries(self):
            return self

        def slice(self, *where):
            sliced.append(where)
            if len(sliced) == 3:
                raise Midway("the third batch")
            return real_slice(table, *where)

    real_resolve = objectstores.resolve

    class Unreachable:  # deletes fail, as they would with the network gone
        def __init__(self, filesystem):
            self.filesystem = filesystem

        def open_output_stream(self, path):
            return self.filesystem.open_output_stream(path)

        def delete_file(self, path):
            raise OSError("the object store cannot be reached")

    monkeypatch.setattr(objectstores, "resolve", lambda uri: (
        Unreachable(real_resolve(uri)[0]), real_resolve(uri)[1]))
    with pytest.raises(Midway):
        objectstores.write_arrow_file("s3://bucket/stage/cut.arrow", Failing())
    monkeypatch.setattr(objectstores, "resolve", real_resolve)
    left = s3.get_file_info("bucket/stage/cut.arrow")
    if left.size is not None:  # (sent, and not removed) but no Arrow file
        with pytest.raises(pa.ArrowInvalid):
            ipc.open_file(s3.open_input_file("bucket/stage/cut.arrow"))
    objectstores.remove_tree("s3://bucket/stage")


def test_staged_objects_go_at_exit_whatever_was_imported_first(s3, tmp_path, sales):
    """weakref's exit hook may run after pyarrow's has shut S3 down (when a
    finalizer was made before pyarrow.fs was imported): the objects are
    removed by an exit hook of their own."""
    import subprocess
    import sys

    write_parts(sales, tmp_path / "parts")
    others = set(_staged_objects(s3))  # (another module's, in moto's shared store)
    script = (
        "import tempfile, weakref\n"
        "class Early: pass\n"
        "early = Early(); weakref.finalize(early, print)  # weakref's hook comes first\n"
        "import manymodels as mm\n"
        f"source = mm.groups({str(tmp_path / 'parts')!r}, by=['store', 'item'],\n"
        "                   read_on_workers=True, staging='s3://bucket/stage')\n"
        "run = mm.train(lambda df: {'n': len(df)}, source, backend='serial', progress=False)\n"
        "print(len(run.results))\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.split()[-1] == "60", done.stderr[-2000:]
    assert set(_staged_objects(s3)) <= others
