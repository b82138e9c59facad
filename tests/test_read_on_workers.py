"""Groups read on the workers: the driver reads the key columns only, each
batch reads its own groups' rows from the Parquet files."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import manymodels as mm
from conftest import BACKENDS

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


def test_a_file_that_changes_before_the_sort_is_named_and_nothing_is_left(tmp_path, sales):
    write_parts(sales, tmp_path / "parts")
    source = mm.groups(tmp_path / "parts", by="store", read_on_workers=True,
                       staging=tmp_path / "stage")  # the key columns are read now
    grown = pd.concat([pq.read_table(tmp_path / "parts" / "part-1.parquet").to_pandas(),
                       sales.head(2)])
    pq.write_table(pa.Table.from_pandas(grown, preserve_index=False),
                   tmp_path / "parts" / "part-1.parquet")
    with pytest.raises(ValueError, match="part-1.parquet' changed while it was read"):
        mm.train(count_rows, source, backend="serial", progress=False)
    assert list((tmp_path / "stage").iterdir()) == []
