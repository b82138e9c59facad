"""Bad input fails before any work starts, naming what is wrong; every kind of
table reaches the workers the same way."""

from __future__ import annotations

import threading

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import manymodels as mm
from conftest import fit_linear, shm_files
from manymodels.inputs.tables import read_table


def test_table_files_and_directories(tmp_path, sales):
    pq.write_table(pa.Table.from_pandas(sales), tmp_path / "sales.parquet")
    sales.to_csv(tmp_path / "sales.csv", index=False)
    parts = tmp_path / "parts"
    parts.mkdir()
    for i, (_, chunk) in enumerate(sales.groupby(sales.index % 3)):
        pq.write_table(pa.Table.from_pandas(chunk, preserve_index=False),
                       parts / f"part-{i}.parquet")
    expected = mm.train(fit_linear, mm.groups(sales, by="store"), backend="serial",
                        progress=False).results
    for table in (tmp_path / "sales.parquet", str(tmp_path / "sales.csv"), parts):
        run = mm.train(fit_linear, mm.groups(table, by="store"), workers=2, progress=False)
        pd.testing.assert_series_equal(run.results["slope"], expected["slope"])


def test_missing_by_column_is_named(sales):
    with pytest.raises(ValueError, match="by column 'shop' is not in the table"):
        mm.groups(sales, by=["store", "shop"])


def test_empty_table():
    with pytest.raises(ValueError, match="empty"):
        mm.groups(pd.DataFrame({"store": [], "x": []}), by="store")


def test_unreadable_and_missing_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        mm.groups(tmp_path / "nope.parquet", by="store")
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"this is not parquet")
    with pytest.raises(ValueError, match="cannot read table file .*broken.parquet"):
        mm.groups(broken, by="store")
    odd = tmp_path / "data.xlsx"
    odd.write_bytes(b"x")
    with pytest.raises(ValueError, match="unknown file type '.xlsx'"):
        mm.groups(odd, by="store")
    with pytest.raises(ValueError, match=r"holds no \.csv, \.tsv \(tab-separated\) or Parquet"):
        mm.groups(tmp_path / "empty_dir" if (tmp_path / "empty_dir").mkdir() is None
                  else None, by="store")


@pytest.mark.parametrize(("options", "kind", "message"), [
    ({"timeout": float("nan")}, ValueError, "timeout must be a positive number"),
    ({"memory_limit": float("nan")}, ValueError, "memory_limit: .*finite"),
    ({"memory_limit": float("inf")}, ValueError, "memory_limit: .*finite"),
    ({"memory_limit": "1e400"}, ValueError, "memory_limit: .*finite"),
    ({"retry_on": ValueError()}, TypeError, "write retry_on=ValueError"),
    ({"retry_on": 5}, TypeError, "retry_on must be an exception class"),
    ({"reuse": "false"}, TypeError, "reuse must be True or False"),
])
def test_values_that_read_as_something_else_are_refused(sales, options, kind, message):
    """A NaN timeout (no timeout at all), an infinite memory limit, an
    exception instead of its class, the text "false" (true) for a switch:
    each refused by name before any work, not read as another value."""
    with pytest.raises(kind, match=message):
        mm.train(fit_linear, mm.groups(sales, by="store"), progress=False, **options)


def test_a_grid_too_large_to_plan_or_with_a_value_twice_is_refused():
    """A grid of ten billion settings was built one dict at a time until the
    memory ran out; a list given twice as a grid value was not noticed."""
    with pytest.raises(ValueError, match="makes 10,000,000,000 combinations"):
        mm.grid(a=range(100_000), b=range(100_000))
    # a hundred million settings ran out of memory before any task (a
    # million: 290 MB and a second): a grid's run plans ten million at most
    with pytest.raises(ValueError, match=r"makes 16,000,000 combinations .* \(10,000,000"):
        mm.grid(a=range(4_000), b=range(4_000))
    groups = mm.groups(pd.DataFrame({"g": range(5), "y": 1.0}), by="g")
    with pytest.raises(ValueError, match=r"5 groups or items times 2,500,000 grid settings"):
        mm.train(lambda rows, a, b: None, groups * mm.grid(a=range(2_500), b=range(1_000)),
                 backend="serial", progress=False)
    with pytest.raises(ValueError, match=r"duplicate value of grid parameter 'a': \[1, 2\]"):
        mm.grid(a=[[1, 2], [3], [1, 2]])
    assert len(mm.grid(a=[[1, 2], [2, 1]], b=[{"x": 1}, {"x": 2}])) == 4


@pytest.mark.parametrize("values, shown", [
    ([1, 1.0, "sqrt"], "1 and 1.0"), ([True, 1], "True and 1"), ([0, False], "0 and False"),
    ([(1, "a"), (1.0, "a")], r"\(1, 'a'\) and \(1\.0, 'a'\)")])
def test_grid_values_python_holds_equal_are_refused_saying_why_and_how_to_get_both(
        values, shown):
    """max_features=[1, 1.0] (one feature, all of them) was refused as a
    "duplicate value", which neither is: the refusal says they are one key
    to Python, and how to train both."""
    with pytest.raises(ValueError, match=f"{shown} are one value of grid parameter 'm': Python "
                                         r"holds them equal .*give them distinct names"):
        mm.grid(m=values)
    with pytest.raises(ValueError, match="1 and 1.0 are one item key: .* with key="):
        mm.items([1, 1.0])
    with pytest.raises(ValueError, match="duplicate value of grid parameter 'm': 1$"):
        mm.grid(m=[1, 2, 1])


def test_a_by_column_named_twice_is_refused(sales):
    with pytest.raises(ValueError, match="by= names the column 'store' twice"):
        mm.groups(sales, by=["store", "store"])


def test_bad_arguments_name_the_argument(sales):
    source = mm.groups(sales, by="store")
    with pytest.raises(ValueError, match="unknown backend 'hadoop'"):
        mm.train(fit_linear, source, backend="hadoop")
    with pytest.raises(ValueError, match="unknown format 'excel'"):
        mm.groups(sales, by="store", format="excel")
    with pytest.raises(TypeError, match="fit must be callable"):
        mm.train("fit", source)
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        mm.train(fit_linear, source, workers=0)
    with pytest.raises(ValueError, match="cpus_per_task"):
        mm.train(fit_linear, source, cpus_per_task=0)
    with pytest.raises(ValueError, match="max_failures"):
        mm.train(fit_linear, source, max_failures=-1)
    with pytest.raises(ValueError, match="cannot enforce timeout"):
        mm.train(fit_linear, source, backend="threads", timeout=1)
    with pytest.raises(ValueError, match="memory size"):
        mm.train(fit_linear, source, memory_limit="lots")
    with pytest.raises(TypeError, match="source must be made by"):
        mm.train(fit_linear, sales)
    with pytest.raises(ValueError, match="grid parameter 'alpha' has no values"):
        mm.grid(alpha=[])
    with pytest.raises(TypeError, match="only a grid can multiply"):
        mm.groups(sales, by="store") * mm.items([1, 2])
    with pytest.raises(ValueError, match="duplicate item key: 1"):
        mm.items([1, 2, 1])
    # an item that cannot be a key is keyed by its position: one that another
    # item is said so (it was "duplicate item key: 0", a key never given)
    for items in ([None, 0], [{"cfg": 1}, 0.0, 1]):
        with pytest.raises(ValueError, match=r"item 0 \(a [a-zA-Z]+, which cannot be a key\) is "
                                             r"keyed by its position, 0, which item 1 is keyed"):
            mm.items(items)
    assert mm.items([None, 5]).keys == [0, 5]


def test_unpicklable_fit_says_why_and_suggests_threads(sales):
    lock = threading.Lock()

    def fit_with_lock(df):
        with lock:
            return len(df)

    with pytest.raises(TypeError, match="cannot be pickled.*backend='threads'"):
        mm.train(fit_with_lock, mm.groups(sales, by="store"))
    assert not shm_files()
    run = mm.train(fit_with_lock, mm.groups(sales, by="store"), backend="threads",
                   progress=False)
    assert len(run.models) == 12


def test_workers_never_exceed_tasks():
    run = mm.train(len, mm.items(["ab", "cde"]), workers=8, progress=False)
    assert run.summary().workers == 2
    assert run.models == {"ab": 2, "cde": 3}


def test_usable_cores_respects_affinity():
    import os

    from manymodels.machine import usable_cores

    assert 1 <= usable_cores() <= len(os.sched_getaffinity(0))


def test_parse_bytes():
    from manymodels.machine import parse_bytes

    assert parse_bytes("2GB") == 2_000_000_000
    assert parse_bytes("1.5 GiB") == int(1.5 * 2**30)
    assert parse_bytes(1024) == 1024
    with pytest.raises(ValueError):
        parse_bytes("-3GB")


def _writes_into_its_rows(data, alpha):
    seen = float(data["x"][0])
    try:
        data["x"][0] = 99.0
        wrote = 1.0
    except ValueError:  # read-only
        wrote = 0.0
    try:
        data["x"].flags.writeable = True
        unlocked = 1.0
    except ValueError:
        unlocked = 0.0
    return {"seen": seen, "wrote": wrote, "unlocked": unlocked}


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_numpy_rows_are_read_only_so_no_task_changes_the_next_ones(backend):
    """``format="numpy"`` gives each task read-only views of its batch's
    arrays (or read-only rows of its own, in a batch of one task), also
    where the conversion copied them (a column with nulls): a fit that
    writes into its rows, or tries to make them writeable, cannot change
    what the same group's next setting sees."""
    import pandas as pd

    frame = pd.DataFrame({"g": [1, 1, 2, 2, 3, 3], "x": [1.0, None, 3.0, 4.0, 5.0, 6.0]})
    run = mm.train(_writes_into_its_rows, mm.groups(frame, by="g", format="numpy")
                   * mm.grid(alpha=[1, 2, 3]), backend=backend, workers=1, progress=False)
    results = run.results
    assert run.summary().ok == 9
    assert sorted(results["seen"]) == [1.0] * 3 + [3.0] * 3 + [5.0] * 3
    assert (results["wrote"] == 0).all() and (results["unlocked"] == 0).all()


@pytest.mark.parametrize("format", ["numpy", "pandas"])
def test_a_batchs_groups_read_the_same_however_the_batch_was_prepared(format):
    """A worker converts a batch's rows at once: the span of the table they
    lie in (references as a list, or as columns when the batch came as
    one), or, where they are sparse in it, their slices gathered (a
    product repeats groups). Every task reads exactly its own rows either
    way, and so does a task outside its batch's rows."""
    import numpy as np

    from manymodels.inputs.datareaders import ArrowSlices
    from manymodels.planning.taskdata import SliceRefs

    table = pa.table({"g": np.repeat(np.arange(40), 3), "x": np.arange(120.0)})
    reader = ArrowSlices(table, format, None)

    def own(offset, length):
        rows = table.slice(offset, length)
        return ({name: rows[name].to_numpy() for name in rows.column_names}
                if format == "numpy" else rows.to_pandas())

    dense = [(offset, 3) for offset in range(30, 60, 3)]
    sparse = [(0, 3), (114, 3), (57, 3), (0, 3)]
    for refs in (dense, SliceRefs([o for o, _ in dense], [3] * len(dense)), sparse,
                 SliceRefs([o for o, _ in sparse], [3] * len(sparse))):
        reader.begin_batch(refs)
        for offset, length in [*refs, (90, 3), (27, 6)]:
            got, expected = reader.rows((offset, length)), own(offset, length)
            if format == "numpy":
                assert got.keys() == expected.keys()
                for name in got:
                    np.testing.assert_array_equal(got[name], expected[name])
                    assert not got[name].flags.writeable
            else:
                pd.testing.assert_frame_equal(got, expected)


def test_a_directory_of_files_with_other_columns_is_refused_naming_the_file(tmp_path):
    """Files of one directory with other columns were merged, the missing
    ones null (every group then failed); their order may differ."""
    pd.DataFrame({"g": ["a"], "x": [1.0], "y": [2.0]}).to_csv(tmp_path / "a.csv", index=False)
    pd.DataFrame({"y": [3.0], "g": ["b"], "x": [1.0]}).to_csv(tmp_path / "b.csv", index=False)
    assert len(mm.train(len, mm.groups(tmp_path, by="g"), backend="serial",
                        progress=False).ok) == 2
    pd.DataFrame({"g": ["c"], "x": [1.0], "z": [2.0]}).to_csv(tmp_path / "c.csv", index=False)
    with pytest.raises(ValueError, match=r"c\.csv' lacks the columns \['y'\], which .*a\.csv' "
                                         r"has, and has the columns \['z'\], which .*a\.csv' "
                                         r"lacks"):
        mm.groups(tmp_path, by="g")


def test_tables_keys_and_costs_that_cannot_be_used_are_named(tmp_path):
    """A CSV header naming a column twice, a group key of lists or structs,
    and a cost function that returns no number were errors from pandas,
    Arrow or float() deep inside; each is named now, before any work."""
    (tmp_path / "twice.csv").write_text("g,x,x\na,1,2\n")
    with pytest.raises(ValueError, match="has two columns named 'x'"):
        mm.groups(tmp_path / "twice.csv", by="g")
    for key in ([[1], [2]], [{"a": 1}, {"a": 2}]):
        table = pa.table({"k": key, "x": [1.0, 2.0]})
        with pytest.raises(ValueError, match="by column 'k' holds .* a group key must be"):
            mm.train(len, mm.groups(table, by="k"), progress=False)
    with pytest.raises(TypeError, match=r"cost= must return a number; .* 'x'"):
        mm.train(len, mm.items([1, 2], cost=lambda item: "x"), progress=False)


def _row_count(rows):
    return len(rows)


@pytest.mark.parametrize("column, message", [
    (pd.period_range("2020-01", periods=2, freq="M").repeat(2), "pandas.period values"),
    (pd.interval_range(0, 2).repeat(2), "pandas.interval values"),
    (pa.array([1, 2, 1, 2], pa.time64("ns")), "times of day with nanoseconds"),
])
def test_keys_that_cannot_be_kept_as_they_are_are_refused_by_name(column, message):
    """Period keys became their storage integers (600, 601), Interval keys
    dicts that broke run.models, nanosecond times a deep ArrowInvalid."""
    table = (pa.table({"k": column, "x": [1.0, 2.0, 3.0, 4.0]}) if isinstance(column, pa.Array)
             else pd.DataFrame({"k": column, "x": [1.0, 2.0, 3.0, 4.0]}))
    with pytest.raises(ValueError, match=f"by column 'k' holds {message}"):
        mm.train(_row_count, mm.groups(table, by="k"), backend="serial", progress=False)


def _first_ids(rows):
    return rows["rid"].tolist()


def test_columns_named_like_manymodels_own_are_refused_or_kept_apart(tmp_path):
    pq.write_table(pa.table({"__file__": ["a", "a", "b"], "rid": [0, 1, 2]}),
                   tmp_path / "a.parquet")
    with pytest.raises(ValueError, match="by column '__file__' has the name read_on_workers"):
        mm.train(_first_ids, mm.groups(tmp_path, by="__file__", read_on_workers=True),
                 backend="serial", progress=False)
    table = pa.table({"k": ["a", "a", "b", "b"], "__group__": [2, 1, 2, 1], "rid": [0, 1, 2, 3]})
    run = mm.train(_first_ids, mm.groups(table, by="k", order_by="__group__"),
                   backend="serial", progress=False)
    assert dict(run.models) == {"a": [1, 0], "b": [3, 2]}


def _keys_and_ids(rows):
    return sorted(rows["rid"].tolist())


@pytest.mark.parametrize("lazy", [False, True])
def test_files_whose_types_widen_to_one_are_read_as_one_table(tmp_path, lazy):
    """int32 in one file and int64 in another, or a dictionary-encoded
    column beside plain text, were refused as not sharing a schema."""
    pq.write_table(pa.table({"k": pa.array([1, 2], pa.int32()), "s": pa.array(["a", "b"]).
                             dictionary_encode(), "rid": [0, 1]}), tmp_path / "1.parquet")
    pq.write_table(pa.table({"k": pa.array([1, 3], pa.int64()),
                             "s": pa.array(["a", "c"], pa.large_string()), "rid": [2, 3]}),
                   tmp_path / "2.parquet")
    for by in ("k", "s"):
        run = mm.train(_keys_and_ids, mm.groups(tmp_path, by=by, read_on_workers=lazy),
                       backend="serial", progress=False)
        assert sorted(run.models.values()) == [[0, 2], [1], [3]], by


def test_a_csv_column_read_as_numbers_in_one_file_and_text_in_another_is_text(tmp_path):
    """CSV's inference reads a key column as numbers in a file without a
    letter in it: the directory was refused."""
    (tmp_path / "1.csv").write_text("k,rid\n1,0\n2,1\n")
    (tmp_path / "2.csv").write_text("k,rid\nA,2\n1,3\n")
    run = mm.train(_keys_and_ids, mm.groups(tmp_path, by="k"), backend="serial",
                   progress=False)
    assert dict(run.models) == {"1": [0, 3], "2": [1], "A": [2]}
    (tmp_path / "3.csv").write_text("k,rid\n2020-01-01T00:00:00,4\n")
    (tmp_path / "1.csv").unlink()
    (tmp_path / "2.csv").write_text("k,rid\n1.5,2\n")
    with pytest.raises(ValueError, match="3.csv' does not fit the files before it"):
        mm.train(_keys_and_ids, mm.groups(tmp_path, by="k"), backend="serial", progress=False)


def _write_into_shared(item, weights):
    weights[0] = item
    return item


@pytest.mark.parametrize("backend", ["serial", "threads", "processes"])
def test_a_shared_array_reaches_fit_read_only_on_every_backend(backend):
    """A task's write reached the later tasks on its worker, and, on serial
    and threads, the caller's own array."""
    import numpy as np

    weights = np.zeros(3)
    run = mm.train(_write_into_shared, mm.items([1, 2]), shared={"weights": weights},
                   backend=backend, workers=2, progress=False)
    assert (run.results["status"] == "failed").all()
    assert run.results["error"].str.contains("read-only").all()
    assert weights.tolist() == [0.0, 0.0, 0.0] and weights.flags.writeable


def _row_ids(rows):
    return sorted(rows["rid"].tolist())


def test_csv_codes_with_leading_zeros_stay_apart_and_plain_integers_stay_integers(tmp_path):
    """CSV's inference read 001, 01 and 1 as the integer 1: three groups
    trained as one."""
    (tmp_path / "codes.csv").write_text("k,rid\n001,0\n1,1\n01,2\n007,3\n7,4\n")
    run = mm.train(_row_ids, mm.groups(tmp_path / "codes.csv", by="k"), backend="serial",
                   progress=False)
    assert dict(run.models) == {"001": [0], "01": [2], "007": [3], "1": [1], "7": [4]}
    (tmp_path / "plain.csv").write_text("k,rid\n1,0\n-2,1\n1,2\n,3\n")
    plain = mm.train(_row_ids, mm.groups(tmp_path / "plain.csv", by="k"), backend="serial",
                     progress=False)
    assert {(None if pd.isna(k) else k): v for k, v in plain.models.items()} == {
        1: [0, 2], -2: [1], None: [3]}


def test_csv_codes_with_a_plus_sign_stay_apart_and_numbers_stay_numbers(tmp_path):
    """CSV's inference reads +1 as the float 1.0 (it takes no sign in an
    integer): +1 and 1 were one group (as they are to pandas' read_csv, as
    007 and 7 are). Integers written otherwise stay text, as 007 does; a
    column of numbers with a fraction stays numbers, +1 in it too."""
    (tmp_path / "codes.csv").write_text("k,rid\n+1,0\n1,1\n+1,2\n-1,3\n")
    run = mm.train(_row_ids, mm.groups(tmp_path / "codes.csv", by="k"), backend="serial",
                   progress=False)
    assert dict(run.models) == {"+1": [0, 2], "1": [1], "-1": [3]}
    (tmp_path / "numbers.csv").write_text("k,rid\n+1,0\n1.0,1\n2.5,2\n,3\n")
    numbers = mm.train(_row_ids, mm.groups(tmp_path / "numbers.csv", by="k"),
                       backend="serial", progress=False)
    assert {(None if pd.isna(k) else k): v for k, v in numbers.models.items()} == {
        1.0: [0, 1], 2.5: [2], None: [3]}


def test_csv_integers_past_int64_stay_distinct_keys(tmp_path):
    """CSV's inference reads integers past int64's range as floats: ids
    18446744073709551614 and ...615 (or 2**63 and 2**63 + 1) were one float
    key, two customers' rows one model's. They are uint64 where they fit
    (as pandas' read_csv reads them), else text; other numbers stay floats."""
    (tmp_path / "big.csv").write_text(
        "id,v,rid\n18446744073709551614,1.5,0\n18446744073709551615,2.5,1\n"
        "9223372036854775808,3.5,2\n9223372036854775809,4.5,3\n18446744073709551615,5.5,4\n")
    run = mm.train(_row_ids, mm.groups(tmp_path / "big.csv", by="id"), backend="serial",
                   progress=False)
    assert dict(run.models) == {18446744073709551614: [0], 18446744073709551615: [1, 4],
                                9223372036854775808: [2], 9223372036854775809: [3]}
    assert run.results["id"].dtype == "uint64"
    (tmp_path / "longer.csv").write_text(
        "id,rid\n123456789012345678901234,0\n123456789012345678901235,1\n-1,2\n")
    (tmp_path / "signed.csv").write_text("id,rid\n18446744073709551615,0\n-1,1\n-1,2\n")
    for name, expected in (("longer.csv", {"123456789012345678901234": [0],
                                           "123456789012345678901235": [1], "-1": [2]}),
                           ("signed.csv", {"18446744073709551615": [0], "-1": [1, 2]})):
        assert dict(mm.train(_row_ids, mm.groups(tmp_path / name, by="id"), backend="serial",
                             progress=False).models) == expected
    assert read_table(tmp_path / "big.csv").schema.field("v").type == pa.float64()


def test_a_csv_folder_whose_ids_need_uint64_in_one_file_reads_them_all(tmp_path):
    """One file's ids fit int64, another's need uint64: Arrow refused to
    put them together ("not in range"), naming no file. They are uint64 in
    every file where none is negative, else text in every file."""
    folder = tmp_path / "ids"
    folder.mkdir()
    (folder / "a.csv").write_text("id,rid\n1,0\n2,1\n")
    (folder / "b.csv").write_text("id,rid\n18446744073709551615,2\n1,3\n")
    run = mm.train(_row_ids, mm.groups(folder, by="id"), backend="serial", progress=False)
    assert run.results["id"].dtype == "uint64"
    assert dict(run.models) == {1: [0, 3], 2: [1], 18446744073709551615: [2]}
    (folder / "c.csv").write_text("id,rid\n-1,4\n")
    run = mm.train(_row_ids, mm.groups(folder, by="id"), backend="serial", progress=False)
    assert dict(run.models) == {"1": [0, 3], "2": [1], "18446744073709551615": [2],
                                "-1": [4]}


@pytest.mark.parametrize("lazy", [False, True])
def test_files_under_a_linked_folder_are_read_and_bad_links_are_named(tmp_path, lazy):
    """Path.rglob does not follow links to folders (before Python 3.13): the
    files under one were left out, their groups missing unsaid, where
    pyarrow's dataset reads them. A link to a folder above (followed, it
    never ends), one to a folder read already, and a link named as a table
    whose target is gone are each refused, naming it, before any work."""
    data, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    (data / "region=north").mkdir(parents=True)
    (elsewhere / "region=south").mkdir(parents=True)
    pq.write_table(pa.table({"k": [1, 1], "rid": [0, 1]}), data / "region=north" / "a.parquet")
    pq.write_table(pa.table({"k": [2, 1], "rid": [2, 3]}),
                   elsewhere / "region=south" / "b.parquet")
    (data / "more").symlink_to(elsewhere, target_is_directory=True)
    (data / "_skipped").symlink_to(tmp_path, target_is_directory=True)  # hidden: not entered

    def ids(by):
        return dict(mm.train(_row_ids, mm.groups(data, by=by, read_on_workers=lazy),
                             backend="serial", progress=False).models)

    assert ids("k") == {1: [0, 1, 3], 2: [2]}
    assert ids(["k", "region"]) == {(1, "north"): [0, 1], (1, "south"): [3], (2, "south"): [2]}
    (elsewhere / "up").symlink_to(data, target_is_directory=True)  # data/more/up -> data
    with pytest.raises(ValueError, match=r"reaches the folder .*data' twice.* the link "
                                         r".*more/up'"):
        mm.groups(data, by="k", read_on_workers=lazy)
    (elsewhere / "up").unlink()
    (data / "gone.parquet").symlink_to(tmp_path / "nothing.parquet")
    with pytest.raises(ValueError, match=r"holds 'gone\.parquet', a link to .*nothing\.parquet'"
                                         r", which does not exist"):
        mm.groups(data, by="k", read_on_workers=lazy)


def _first_x(rows):
    return (list(rows.columns), float(rows["x"].iloc[0]))


def test_column_names_given_as_an_array_or_an_index_are_a_list_of_names(sales):
    """by=np.array([...]) or by=df.columns[:1] failed with "unhashable type"
    naming no argument: any list-like of names is a list of names now, and
    what cannot be a name is refused naming the argument."""
    assert list(sales.columns[[0, 1]]) == ["store", "item"]
    expected = dict(mm.train(_first_x, mm.groups(sales, by=["store", "item"], order_by="x"),
                             backend="serial", progress=False).models)
    for by in (np.array(["store", "item"]), sales.columns[[0, 1]], pd.Series(["store", "item"]),
               ("store", "item")):
        run = mm.train(_first_x, mm.groups(sales, by=by, order_by=np.array(["x"]),
                                           columns=pd.Index(["y"])), backend="serial",
                       progress=False)
        assert dict(run.models) == expected and list(run.results.columns[:2]) == ["store", "item"]
    for by, what in ((["store", ["item"]], "holds \\['item'\\], a list"),
                     ({"store": 1}, "not a dict")):
        with pytest.raises(TypeError, match=f"by= must be a column name or a list of them.*{what}"):
            mm.groups(sales, by=by)
    with pytest.raises(TypeError, match="order_by= must be .* holds array"):
        mm.groups(sales, by="store", order_by=[np.array(["x"])])


def _setting_value(n):
    return {"n": n}


def _group_and_setting(rows, alpha):
    return {"group": int(rows["g"].iloc[0]), "alpha": alpha}


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_a_grid_with_a_cost_starts_its_most_costly_settings_first(backend):
    """A sweep whose largest settings come last ended with them running
    alone (16 workers, 20 RandomForest settings: 1.6x the longest-first
    bound); ``grid(cost=...)`` puts them first. Times groups, a task's cost
    is its group's rows times its setting's."""
    import pandas as pd

    run = mm.train(_setting_value, mm.grid(n=[1, 2, 3, 4, 5, 6], cost=lambda s: s["n"]),
                   backend=backend, workers=1, progress=False)
    assert run.summary().ok == 6
    started = run.results.sort_values("started_s")["n"].tolist()
    assert started == [6, 5, 4, 3, 2, 1]
    assert run.results["n"].tolist() == [1, 2, 3, 4, 5, 6]  # results keep the grid's order

    frame = pd.DataFrame({"g": [1] * 2 + [2] * 5, "x": range(7)})
    run = mm.train(_group_and_setting,
                   mm.groups(frame, by="g") * mm.grid(alpha=[1, 10], cost=lambda s: s["alpha"]),
                   backend=backend, workers=1, progress=False)
    started = run.results.sort_values("started_s")[["group", "alpha"]]
    assert list(map(tuple, started.to_numpy())) == [(2, 10), (1, 10), (2, 1), (1, 1)]


def test_a_grid_cost_that_cannot_be_used_is_named_before_any_task_runs():
    with pytest.raises(TypeError, match=r"give the values as a mapping: mm.grid\(\{'cost'"):
        mm.grid(cost=[1, 2])
    with pytest.raises(TypeError, match=r"for the setting \{'n': 1\} it returned 'x'"):
        mm.train(_setting_value, mm.grid(n=[1, 2], cost=lambda s: "x"), backend="serial",
                 progress=False)
    with pytest.raises(ValueError, match="at least 0; for the setting"):
        mm.train(_setting_value, mm.grid(n=[1, 2], cost=lambda s: -1.0), backend="serial",
                 progress=False)
    with pytest.raises(ValueError, match="grid parameter 'a' is given twice"):
        mm.grid({"a": [1]}, a=[2])
    assert mm.grid({"cost": [1, 2]}).values == {"cost": [1, 2]}
    both = mm.grid(a=[1, 2], cost=lambda s: s["a"]) * mm.grid(b=[10, 20], cost=lambda s: s["b"])
    assert both.costs(both.combinations()) == [10.0, 20.0, 20.0, 40.0]
    assert (mm.grid(a=[1, 2]) * mm.grid(b=[3], cost=lambda s: 2)).costs(
        [{"a": 1, "b": 3}]) == [2.0]


def test_each_grid_of_a_product_gets_its_own_values_and_its_cost_is_checked():
    seen = []
    left = mm.grid(a=[1, 2], cost=lambda s: seen.append(dict(s)) or s["a"])
    both = left * mm.grid(b=[3])
    assert both.costs(both.combinations()) == [1.0, 2.0]
    assert seen == [{"a": 1}, {"a": 2}]  # its own values, not the merged setting
    negative = mm.grid(a=[1], cost=lambda s: -1) * mm.grid(b=[3], cost=lambda s: -2)
    with pytest.raises(ValueError, match=r"for the setting \{'a': 1\} it returned -1"):
        negative.costs(negative.combinations())
    flagged = mm.grid(a=[1]) * mm.grid(b=[3], cost=lambda s: True)
    with pytest.raises(TypeError, match=r"for the setting \{'b': 3\} it returned True"):
        flagged.costs(flagged.combinations())


def _setting_text(a):
    return {"seen": repr(a)}


def test_a_grids_none_and_nan_stay_two_values_in_the_results():
    """Two settings, None and NaN, read alike (NaN, NaN) in run.results."""
    run = mm.train(_setting_text, mm.grid(a=[None, float("nan"), 1.0]), backend="serial",
                   progress=False)
    values = run.results["a"].tolist()
    assert values[0] is None and values[1] != values[1] and values[2] == 1.0
    assert run.results["seen"].tolist() == ["None", "nan", "1.0"]
    plain = mm.train(_setting_text, mm.grid(a=[float("nan"), 1.0]), backend="serial",
                     progress=False)
    assert plain.results["a"].dtype == "float64"


def _constant(rows, c):
    return ("model", c)


def test_numpy_scalars_in_a_grid_are_the_same_tasks_as_pythons_equal_values(tmp_path, sales):
    """np.int64(3) and 3, np.float64(0.5) and 0.5 pickle apart, so a grid of
    NumPy values (np.arange, np.linspace) and one of the same Python values
    had other identities: a re-run with the other kind retrained every task.
    np.float32 and np.int8 stay apart (fit computes in their precision)."""
    source = mm.groups(sales, by="store")
    numpy_grid = mm.grid(c=[np.float64(0.5), np.int64(3), np.bool_(True), np.str_("x")])
    first = mm.train(_constant, source * numpy_grid, store=tmp_path / "s", backend="serial",
                     progress=False)
    again = mm.train(_constant, source * mm.grid(c=[0.5, 3, True, "x"]), store=tmp_path / "s",
                     backend="serial", progress=False)
    assert not first.results["reused"].any() and again.results["reused"].all()
    for narrow in (np.float32(0.5), np.int8(3)):  # fit computes (and wraps) in their range
        single = mm.train(_constant, source * mm.grid(c=[narrow]), store=tmp_path / "s",
                          backend="serial", progress=False)
        assert not single.results["reused"].any()


def test_a_bare_grids_tuple_of_one_value_is_found_by_itself(tmp_path):
    """Store.load((3,)) read the key as the value 3 and found no task of a
    grid whose values are tuples; (4, 5) was found. Both are now."""
    mm.train(lambda shape: ("model", shape), mm.grid(shape=[(3,), (4, 5)]),
             store=tmp_path / "s", backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    assert store.load((3,)) == ("model", (3,))
    assert store.load(((3,),)) == ("model", (3,))
    assert store.load((4, 5)) == ("model", (4, 5))
    with pytest.raises(KeyError, match=r"no task with key \(6,\)"):
        store.load((6,))


def _apply(f):
    return ("model", f(2))


def test_a_grid_value_that_cannot_be_pickled_is_named_before_any_work(tmp_path):
    """A lock among a grid's values: with a store, the identities' hashing
    raised the pickler's bare "cannot pickle '_thread.lock' object", naming
    no parameter; on worker processes each of its tasks failed after the run
    had started. A lambda, which cloudpickle sends (as it sends fit and
    shared=), failed every task of its setting on worker processes."""
    lock = threading.Lock()
    said = r"value 1 of grid parameter 'f' .* cannot be pickled \(TypeError: cannot pickle"
    with pytest.raises(TypeError, match=said + ".*a store"):
        mm.train(_apply, mm.grid(f=[abs, lock]), store=tmp_path / "s", backend="serial",
                 progress=False)
    assert not (tmp_path / "s").exists()
    with pytest.raises(TypeError, match=said + ".*the processes backend"):
        mm.train(_apply, mm.grid(f=[abs, lock]), workers=1, progress=False)
    run = mm.train(_apply, mm.grid(f=[abs, lambda x: x * 10]), workers=1, progress=False)
    assert run.failed.empty and sorted(model[1] for model in run.models.values()) == [2, 20]
