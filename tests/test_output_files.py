"""How a worker writes a group's output of ``map_groups`` on an engine, and
how the driver makes one schema and the engine's partitions of the files
(run/outputfiles.py, run/engineoutputs.py), without an engine: the engines
themselves are in tests/test_engine_outputs.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from manymodels.run import engineoutputs, outputfiles
from manymodels.run.outputfiles import WriteOutputs, WrittenOutput
from manymodels.run.outputreads import read_files


def _writer(tmp_path, fn, key_columns=("store",), params=()):
    return WriteOutputs(fn, str(tmp_path), list(key_columns), list(params), passes_key=False)


def _read_batches(path):
    """The row counts of a worker's file's record batches, as they lie there."""
    with pa.OSFile(str(path)) as source:
        return [batch.num_rows for batch in pa.ipc.open_stream(source)]


def _schema_of(path):
    with pa.OSFile(str(path)) as source:
        return pa.ipc.open_stream(source).schema


def test_each_kind_of_output_becomes_a_table_with_its_key_in_front(tmp_path):
    rows = pd.DataFrame({"x": [1.0, 2.0, 4.0], "day": [7, 8, 9]})  # as a worker has them
    cases = {
        "frame": (lambda df: df.assign(y=df["x"] * 2), ["store", "x", "day", "y"], 3),
        "mean": (lambda df: df[["x"]].mean(), ["store", "x"], 1),
        "column": (lambda df: df["x"] - 1, ["store", "x"], 3),  # labels 0, 1, 2: values
        "labelled": (lambda df: df.set_index("day")["x"], ["store", "day", "x"], 3),
        "counts": (lambda df: df["x"].value_counts(), ["store", "x", "count"], 3),
        "arrow": (lambda df: pa.table({"n": [len(df)]}), ["store", "n"], 1),
    }
    for name, (fn, columns, length) in cases.items():
        writer = _writer(tmp_path, fn)
        written = writer(rows, key="s1")
        writer.seal_part()
        table = read_files(str(tmp_path), [written.ref], _schema_of(tmp_path / written.name))
        assert table.column_names == columns and written.rows == table.num_rows == length, name
        assert table.column("store").to_pylist() == ["s1"] * length
    writer = _writer(tmp_path, lambda df: df.set_index("day")["x"])
    labelled = writer(rows, key="s1")
    writer.seal_part()
    table = read_files(str(tmp_path), [labelled.name], _schema_of(tmp_path / labelled.name))
    assert table.column("day").to_pylist() == [7, 8, 9]  # the labels are kept, as values
    assert _writer(tmp_path, lambda df: None)(rows, key="s1") == WrittenOutput(None, 0, None)
    assert not list(tmp_path.glob("*.partial"))
    with pytest.raises(TypeError, match="must return a table, got list"):
        _writer(tmp_path, lambda df: [3.0])(rows, key="s1")


def test_a_grid_setting_is_a_key_column_and_a_fallback_keeps_its_mark(tmp_path):
    rows = pd.DataFrame({"x": [1.0, 2.0]})
    writer = _writer(tmp_path, lambda df, alpha: (df * alpha, {"why": "fn failed"}),
                     key_columns=("store", "item", "alpha"), params=("alpha",))
    written, metrics = writer(rows, key=("s1", 3), alpha=0.5)
    assert metrics == {"why": "fn failed"}
    writer.seal_part()
    with pa.OSFile(str(tmp_path / written.name)) as source:
        table = pa.ipc.open_stream(source).read_all()
    assert table.to_pydict() == {"store": ["s1"] * 2, "item": [3, 3], "alpha": [0.5, 0.5],
                                 "x": [0.5, 1.0]}


def test_the_schemas_are_unified_as_pandas_concat_does(tmp_path):
    writer = _writer(tmp_path, lambda df: df)
    ints = writer(pd.DataFrame({"n": [1, 2]}), key=1)
    floats = writer(pd.DataFrame({"n": [np.nan], "flag": ["a"]}), key=2)
    writer.seal_part()
    schema = engineoutputs._unified_schema(str(tmp_path), [ints, floats], "spark")
    assert schema.names == ["store", "n", "flag"] and schema.field("n").type == pa.float64()
    table = read_files(str(tmp_path), [ints.ref, floats.ref], schema)
    assert table.column("n").to_pylist() == [1.0, 2.0, None]
    assert table.column("flag").to_pylist() == [None, None, "a"]
    # an int column some groups lack is float, as concat makes it: every partition alike
    counted = writer(pd.DataFrame({"n": [1.5], "i": [7]}), key=4)
    writer.seal_part()
    schema = engineoutputs._unified_schema(str(tmp_path), [ints, counted], "dask")
    assert schema.field("i").type == pa.float64()
    expected = pd.concat([pd.DataFrame({"n": [1, 2]}), pd.DataFrame({"n": [1.5], "i": [7]})])
    assert read_files(str(tmp_path), [counted.ref], schema).to_pandas()["i"].dtype == \
        expected["i"].dtype
    text = writer(pd.DataFrame({"n": ["x"]}), key=3)
    writer.seal_part()
    with pytest.raises(TypeError, match="Field n has incompatible types"):
        engineoutputs._unified_schema(str(tmp_path), [ints, text], "dask")
    with pytest.raises(ValueError, match="fn returned None for every group, and a Dask"):
        engineoutputs._unified_schema(str(tmp_path), [WrittenOutput(None, 0, None)], "dask")


def test_the_files_are_cut_into_runs_of_about_equal_rows(monkeypatch):
    files = [("a", 5), ("b", 5), ("c", 1), ("d", 9)]
    assert engineoutputs._chunks(files, 2) == [(["a", "b"], 0), (["c", "d"], 10)]
    assert engineoutputs._chunks(files[:1], 4) == [(["a"], 0)]
    monkeypatch.setattr(engineoutputs, "ROWS_PER_PARTITION", 6)  # 20 rows: 4 runs at most
    assert engineoutputs._chunks(files, 1) == [(["a"], 0), (["b"], 5), (["c", "d"], 10)]


def test_a_parts_outputs_make_one_file_a_schema_read_back_by_their_rows(tmp_path):
    """200,000 small groups made 200,000 files: a part's outputs are held
    until the part leaves the worker, then written as one file per schema;
    each group's rows are found by their place in it."""
    import cloudpickle

    writer = cloudpickle.loads(cloudpickle.dumps(_writer(tmp_path, lambda df: df)))  # a worker's
    outs = [writer(pd.DataFrame({"n": [key] * (key % 3 + 1)}), key=key) for key in range(50)]
    texts = [writer(pd.DataFrame({"n": ["t"]}), key=50), writer(pd.DataFrame({"n": [7]}), key=51)]
    assert not list(tmp_path.iterdir())  # nothing written before the part leaves
    writer.seal_part()
    assert len(list(tmp_path.iterdir())) == 2  # one file for the int schema, one for text
    assert len({out.name for out in outs}) == 1 and texts[1].name == outs[0].name
    # one batch a part (a reader parses every batch it passes: a batch a group
    # made 200,000 for 200,000 groups, and reading them back 15x slower)
    assert _read_batches(tmp_path / outs[0].name) == [sum(key % 3 + 1 for key in range(50)) + 1]
    assert cloudpickle.loads(cloudpickle.dumps(writer))._pending == {}  # nothing held travels
    schema = pa.schema([("store", pa.int64()), ("n", pa.int64())])
    order = [outs[3], outs[1], outs[2], texts[1], outs[40]]  # key order, not the file's
    table = read_files(str(tmp_path), [out.ref for out in order], schema).to_pandas()
    assert table["store"].tolist() == [3] + [1, 1] + [2, 2, 2] + [51] + [40, 40]
    assert table["n"].tolist() == [3] + [1, 1] + [2, 2, 2] + [7] + [40, 40]


def test_outputs_past_the_held_bytes_are_written_before_the_part_ends(tmp_path, monkeypatch):
    writer = _writer(tmp_path, lambda df: df)
    monkeypatch.setattr(writer, "HOLD_BYTES", 100)
    first = writer(pd.DataFrame({"n": np.arange(20)}), key=1)  # 160 bytes: written now
    assert [path.name for path in tmp_path.iterdir()] == [first.name]
    assert _read_batches(tmp_path / first.name) == [20]
    second = writer(pd.DataFrame({"n": [1]}), key=2)  # the same file, after the first
    assert second.name == first.name and second.offset == 20


def test_a_part_whose_outputs_cannot_be_written_fails_its_tasks_not_the_run(tmp_path):
    """A disk that refuses the part's file (here: the output directory gone)
    fails the groups of that part, each with the reason, as a write inside
    ``fn`` did; the run goes on, and no outcome names a file that is not there."""
    import shutil

    import manymodels as mm
    from manymodels.run.outputfiles import WriteOutputs

    directory = tmp_path / "out"
    directory.mkdir()

    def fn(df, key):
        if key == 3:
            shutil.rmtree(directory)  # the disk fails under this group's part
        return df

    writer = WriteOutputs(fn, str(directory), ["g"], [], passes_key=True)
    frame = pd.DataFrame({"g": [1, 2, 3], "x": [1.0, 2.0, 3.0]})
    run = mm.train(writer, mm.groups(frame, by="g"), backend="serial", progress=False)
    failed = run.results.set_index("g")
    assert failed.loc[3, "status"] == "failed"
    assert "could not be written" in failed.loc[3, "error"]
    assert "FileNotFoundError" in failed.loc[3, "error"]


def test_categories_made_per_group_share_one_file(tmp_path):
    """An IPC file holds one dictionary a column: groups whose outputs are
    categoricals of their own values made the part's write fail."""
    writer = _writer(tmp_path, lambda df: pd.DataFrame({"c": pd.Categorical(df["c"])}))
    outs = [writer(pd.DataFrame({"c": [value, value]}), key=key)
            for key, value in enumerate(["x", "y", "z"])]
    writer.seal_part()
    schema = engineoutputs._unified_schema(str(tmp_path), outs, "dask")
    table = read_files(str(tmp_path), [outs[2].ref, outs[0].ref], schema)
    assert table.column("c").to_pylist() == ["z", "z", "x", "x"]
    assert table.column("store").to_pylist() == [2, 2, 0, 0]


def test_a_failed_write_fails_every_part_whose_outputs_it_dropped(tmp_path, monkeypatch):
    """A write past the held bytes that fails inside a task drops the part's
    earlier outputs too: the part's end must fail, so that no outcome names
    rows that are not on disk; the next part is whole again."""
    writer = _writer(tmp_path, lambda df: df)
    first = writer(pd.DataFrame({"n": [1]}), key=1)  # held
    real_write = outputfiles._append

    def full_disk(file, tables):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputfiles, "_append", full_disk)
    monkeypatch.setattr(writer, "HOLD_BYTES", 0)
    with pytest.raises(OSError, match="No space left"):
        writer(pd.DataFrame({"n": [2]}), key=2)  # this task fails
    monkeypatch.setattr(outputfiles, "_append", real_write)
    with pytest.raises(OSError, match="could not be written"):
        writer.seal_part()  # and the part with it: first's rows are gone
    assert not (tmp_path / first.name).exists()
    monkeypatch.setattr(writer, "HOLD_BYTES", 1 << 20)
    again = writer(pd.DataFrame({"n": [3]}), key=3)
    writer.seal_part()  # the next part is written, to a file of its own
    assert again.name != first.name and again.offset == 0
    assert read_files(str(tmp_path), [again.ref], _schema_of(tmp_path / again.name)
                      ).column("n").to_pylist() == [3]


def test_groups_in_key_order_read_back_from_files_written_out_of_it(tmp_path):
    """A batch's groups go out by where their data lies, so neighbours in key
    order sit in different output files: every one is read back, in order."""
    import cloudpickle

    writer = _writer(tmp_path, lambda df: df)
    parts = [cloudpickle.loads(cloudpickle.dumps(writer)) for _ in range(3)]  # 3 workers
    outs = {}
    for key in range(30):  # worker key % 3 ran group key, and sent a part every 4 groups
        part = parts[key % 3]
        outs[key] = part(pd.DataFrame({"n": [key] * (1 + key % 2)}), key=key)
        if key % 4 == 3:
            part.seal_part()
    for part in parts:
        part.seal_part()
    assert len({out.name for out in outs.values()}) == 3  # a file a worker, its parts appended
    schema = pa.schema([("store", pa.int64()), ("n", pa.int64())])
    table = read_files(str(tmp_path), [outs[key].ref for key in range(30)], schema)
    expected = [key for key in range(30) for _ in range(1 + key % 2)]
    assert table.column("store").to_pylist() == expected == table.column("n").to_pylist()
    assert read_files(str(tmp_path), [], schema).num_rows == 0


def test_plain_frames_become_the_table_from_pandas_makes(tmp_path):
    """Numbers and booleans skip ``from_pandas`` (a group's one-row output
    took 0.35 ms there): the same table, NaN as null; anything else takes it."""
    from manymodels.run.outputfiles import schema_digest
    from manymodels.run.outputtables import _plain_frame_table

    frames = [pd.DataFrame({"n": [3], "slope": [0.5]}),
              pd.DataFrame({"a": [1.0, np.nan], "b": [True, False],
                            "c": np.array([1, 2], dtype="int32")}, index=[7, 9]),
              pd.DataFrame({"u": np.array([1, 2], dtype="uint8")}),
              pd.DataFrame({"e": []}, dtype="float64")]
    for frame in frames:
        expected = pa.Table.from_pandas(frame, preserve_index=False).replace_schema_metadata(None)
        assert _plain_frame_table(frame, frame.columns.tolist()).equals(expected)
    assert _plain_frame_table(frames[1], ["a", "b", "c"])["a"].null_count == 1
    for other in (pd.DataFrame({"s": ["x"]}), pd.DataFrame({"n": pd.array([1, None], "Int64")}),
                  pd.DataFrame({"t": pd.to_datetime(["2026-01-01"])}),
                  pd.DataFrame([[1, 2]], columns=["d", "d"])):
        assert _plain_frame_table(other, other.columns.tolist()) is None
    # schemas equal but for a field's metadata keep digests of their own
    plain = pa.schema([pa.field("n", pa.int64())])
    marked = pa.schema([pa.field("n", pa.int64(), metadata={b"k": b"v"})])
    assert schema_digest(plain) == schema_digest(pa.schema([pa.field("n", pa.int64())]))
    assert schema_digest(plain) != schema_digest(marked)


def test_a_workers_parts_are_appended_to_one_file_until_it_is_full(tmp_path, monkeypatch):
    """A part of one group (a ``timeout=`` sends each group's outcome as it
    ends) made a file of its own: a worker's parts are appended to its file
    of their schema, until it holds PARTS_PER_FILE."""
    monkeypatch.setattr(outputfiles, "PARTS_PER_FILE", 3)
    writer = _writer(tmp_path, lambda df: df)
    outs = []
    for key in range(7):  # a part a group
        outs.append(writer(pd.DataFrame({"n": [key] * (key + 1)}), key=key))
        writer.seal_part()
    names = [out.name for out in outs]
    assert names[0] == names[1] == names[2] != names[3] == names[4] == names[5] != names[6]
    assert [out.offset for out in outs] == [0, 1, 3, 0, 4, 9, 0]
    assert _read_batches(tmp_path / names[0]) == [1, 2, 3]
    assert len(list(tmp_path.iterdir())) == 3
    schema = _schema_of(tmp_path / names[0])
    table = read_files(str(tmp_path), [out.ref for out in reversed(outs)], schema)
    assert table.column("n").to_pylist() == [key for key in reversed(range(7))
                                             for _ in range(key + 1)]


def test_rows_sent_before_a_worker_was_killed_mid_write_are_read(tmp_path):
    """A worker killed while it appended leaves a torn message at its file's
    end: the rows of the parts it sent before are read all the same."""
    writer = _writer(tmp_path, lambda df: df)
    sent = [writer(pd.DataFrame({"n": [key, key]}), key=key) for key in range(2)]
    writer.seal_part()
    torn = writer(pd.DataFrame({"n": np.arange(1000)}), key=9)
    writer.seal_part()
    path = tmp_path / torn.name
    with open(path, "r+b") as file:  # the last batch cut short, as a kill leaves it
        file.truncate(path.stat().st_size - 900)
    schema = _schema_of(path)
    table = read_files(str(tmp_path), [sent[1].ref, sent[0].ref], schema)
    assert table.column("store").to_pylist() == [1, 1, 0, 0]
    with pytest.raises(OSError):  # the torn rows themselves are not there
        read_files(str(tmp_path), [torn.ref], schema)


def test_many_schemas_keep_a_few_files_open_and_categories_change_by_part(tmp_path,
                                                                          monkeypatch):
    """Groups that return a schema each keep at most OPEN_FILES files open (a
    closed one is not appended to again); a categorical column whose
    categories differ from part to part reads back in one file."""
    monkeypatch.setattr(outputfiles, "OPEN_FILES", 2)
    writer = _writer(tmp_path, lambda df: df)
    outs = []
    for key in range(6):
        outs.append(writer(pd.DataFrame({f"c{key % 3}": [float(key)]}), key=key))
        writer.seal_part()
        assert len(writer._files) <= 2
    assert len({out.name for out in outs}) > 3
    for key, out in enumerate(outs):
        table = read_files(str(tmp_path), [out.ref], _schema_of(tmp_path / out.name))
        assert table.column(f"c{key % 3}").to_pylist() == [float(key)]
    writer = _writer(tmp_path, lambda df: pd.DataFrame({"c": pd.Categorical(df["c"])}))
    cats = []
    for key, value in enumerate(["x", "y", "x"]):
        cats.append(writer(pd.DataFrame({"c": [value]}), key=key))
        writer.seal_part()
    assert len({out.name for out in cats}) == 1
    schema = engineoutputs._unified_schema(str(tmp_path), cats, "dask")
    table = read_files(str(tmp_path), [out.ref for out in cats], schema)
    assert table.column("c").to_pylist() == ["x", "y", "x"]


def test_each_worker_copy_writes_alone_so_one_failed_write_fails_no_other_part(
        tmp_path, monkeypatch):
    """On the threads backend the workers share the run's writer; each
    executor takes its own copy: a write that fails on one worker fails that
    worker's part only, and the other's outputs are written and read back."""
    shared = _writer(tmp_path, lambda df: df)
    ones, twos = shared.worker_copy(), shared.worker_copy()
    assert ones is not shared and ones._files is not twos._files
    one = ones(pd.DataFrame({"n": [1]}), key=1)
    two = twos(pd.DataFrame({"n": [2, 2]}), key=2)
    assert one.name != two.name  # a file a worker

    real_append = outputfiles._append

    def full_disk_for_ones(file, tables):
        if file.name == one.name:
            raise OSError(28, "No space left on device")
        return real_append(file, tables)

    monkeypatch.setattr(outputfiles, "_append", full_disk_for_ones)
    with pytest.raises(OSError, match="No space left"):
        ones.seal_part()
    twos.seal_part()  # not failed by the other worker's write
    schema = _schema_of(tmp_path / two.name)
    assert read_files(str(tmp_path), [two.ref], schema).column("n").to_pylist() == [2, 2]
    again = twos(pd.DataFrame({"n": [3]}), key=3)
    twos.seal_part()
    assert read_files(str(tmp_path), [again.ref], schema).column("n").to_pylist() == [3]


class _NoRows:
    """A run's data for an executor built here: its tasks take no rows."""

    passes_data = False

    def open(self, table):
        return self


def test_each_executor_takes_its_own_copy_of_the_writer(tmp_path):
    from manymodels.engine.execution import Executor, RunContext

    shared = _writer(tmp_path, lambda df: df)
    first, second = (Executor(RunContext(fit=shared, data=_NoRows())) for _ in range(2))
    assert isinstance(first.fit, WriteOutputs) and first.fit is not shared
    assert first.fit is not second.fit and first._seal_fit_part.__self__ is first.fit


def test_a_large_part_goes_to_its_file_without_being_copied_whole(tmp_path):
    """A large output is written from its own memory, beside small ones of
    the same part (combined apart): appending a 200 MB part raises the
    worker's peak memory by far less than the part (gathering its bytes
    first raised it by three times the part; combining it with a 10-row
    output, by the part)."""
    import subprocess
    import sys

    script = f"""
import resource, numpy as np, pandas as pd
from manymodels.run.outputfiles import WriteOutputs
from manymodels.run.outputreads import read_files
writer = WriteOutputs(lambda df: df, {str(tmp_path)!r}, ["store"], [], passes_key=False)
frame = pd.DataFrame({{"x": np.arange(25_000_000, dtype=np.float64)}})  # 200 MB
writer.HOLD_BYTES = 1 << 40
small = writer(pd.DataFrame({{"x": np.arange(10.0)}}), key=0)
out = writer(frame, key=1)
last = writer(pd.DataFrame({{"x": [7.0]}}), key=2)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
writer.seal_part()
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print((after - before) // 1024, out.rows)
import pyarrow as pa
with pa.OSFile({str(tmp_path)!r} + "/" + out.name) as source:
    schema = pa.ipc.open_stream(source).schema
back = read_files({str(tmp_path)!r}, [small.ref, last.ref], schema).column("x").to_pylist()
assert back == [*range(10), 7.0], back
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True)
    grown_mb, rows = map(int, done.stdout.split())
    assert rows == 25_000_000
    assert grown_mb < 50, f"appending a 200 MB part raised the peak by {grown_mb} MB"
    files = list(tmp_path.glob("out-*.arrow"))
    assert len(files) == 1 and files[0].stat().st_size > 400_000_000  # key and x columns


def test_an_empty_output_is_a_file_with_its_schema_and_a_changed_file_fails_its_part(
        tmp_path):
    """A schema whose outputs are all empty still makes a readable file (the
    driver reads each schema from a file's head); a file another process
    removed or cut short fails the next part, never takes rows elsewhere,
    and a read of rows it no longer holds says so."""
    writer = _writer(tmp_path, lambda df: df)
    empty = writer(pd.DataFrame({"x": pd.Series([], dtype=float)}), key=1)
    writer.seal_part()
    assert empty.rows == 0
    schema = engineoutputs._unified_schema(str(tmp_path), [empty], "dask")
    assert schema.names == ["store", "x"]
    assert read_files(str(tmp_path), [empty.ref], schema).num_rows == 0
    first = writer(pd.DataFrame({"x": [1.0, 2.0]}), key=2)
    writer.seal_part()
    path = tmp_path / first.name
    size = path.stat().st_size
    with open(path, "r+b") as file:
        file.truncate(size - 10)
    writer(pd.DataFrame({"x": [3.0]}), key=3)
    with pytest.raises(OSError, match="changed by another process"):
        writer.seal_part()
    assert path.stat().st_size == size - 10
    with pytest.raises(OSError):
        read_files(str(tmp_path), [first.ref], schema)
    again = writer(pd.DataFrame({"x": [4.0]}), key=4)
    writer.seal_part()  # a file of its own
    assert again.name != first.name
    assert read_files(str(tmp_path), [again.ref], schema).column("x").to_pylist() == [4.0]
    with pytest.raises(OSError, match="holds 1 rows, not the 5"):
        read_files(str(tmp_path), [f"{again.name}:0:5"], schema)


def test_categories_past_127_in_a_part_or_across_a_files_parts_read_back(tmp_path):
    """pandas codes a few categories in 8 bits: a part whose groups, or a
    file whose parts, hold more than 127 between them could be neither
    written nor read back as one dictionary."""
    writer = _writer(tmp_path, lambda df: pd.DataFrame(
        {"c": pd.Categorical([f"{df['k'].iloc[0]}-{i}" for i in range(5)])}))
    outs = []
    for key in range(60):  # 300 categories: 30 groups a part, then a part a group
        outs.append(writer(pd.DataFrame({"k": [key]}), key=key))
        if key < 30 and key % 30 == 29 or key >= 30:
            writer.seal_part()
    assert len({out.name for out in outs}) == 1
    schema = engineoutputs._unified_schema(str(tmp_path), outs, "dask")
    table = read_files(str(tmp_path), [out.ref for out in reversed(outs)], schema)
    assert table.column("c").to_pylist() == [f"{key}-{i}" for key in reversed(range(60))
                                             for i in range(5)]
    assert table.column("store").to_pylist()[:5] == [59] * 5


def test_a_part_of_small_and_large_categorical_outputs_reads_back(tmp_path, monkeypatch):
    """A large output is a batch of its own between the combined small ones:
    each batch has its own dictionary, and every row reads back as it was."""
    monkeypatch.setattr(outputfiles, "COMBINE_BYTES", 1000)
    writer = _writer(tmp_path, lambda df: pd.DataFrame(
        {"c": pd.Categorical([f"{df['k'].iloc[0]}-{i % 7}" for i in range(df['n'].iloc[0])])}))
    sizes = [3, 2, 500, 4, 900, 1, 2]  # 500 and 900 rows: past 1,000 bytes each
    outs = [writer(pd.DataFrame({"k": [key], "n": [n]}), key=key)
            for key, n in enumerate(sizes)]
    writer.seal_part()
    assert _read_batches(tmp_path / outs[0].name) == [5, 500, 4, 900, 3]
    schema = engineoutputs._unified_schema(str(tmp_path), outs, "dask")
    table = read_files(str(tmp_path), [out.ref for out in reversed(outs)], schema)
    assert table.column("c").to_pylist() == [f"{key}-{i % 7}" for key in reversed(range(7))
                                             for i in range(sizes[key])]


def test_a_frames_index_that_holds_values_is_written_as_columns(tmp_path):
    """As the pandas path makes it: an aggregation's days kept, a filter's row
    labels not (written as a column marked so, which the driver's schema drops)."""
    rows = pd.DataFrame({"x": [1.0, 2.0, 4.0], "day": [7, 7, 9]})  # as a worker has them
    for fn, columns in ((lambda df: df.groupby("day")[["x"]].sum(), ["store", "day", "x"]),
                        (lambda df: df[df["x"] > 1], ["store", "x", "day"])):
        writer = _writer(tmp_path, fn)
        written = writer(rows, key="s1")
        writer.seal_part()
        schema = engineoutputs._unified_schema(str(tmp_path), [written], "dask")
        table = read_files(str(tmp_path), [written.ref], schema)
        assert table.column_names == columns
    assert table.column("x").to_pylist() == [2.0, 4.0]


def test_one_value_is_a_row_of_its_groups_key(tmp_path):
    writer = _writer(tmp_path, lambda df: float(df["x"].sum()))
    written = writer(pd.DataFrame({"x": [1.0, 2.0]}), key="s1")
    writer.seal_part()
    table = read_files(str(tmp_path), [written.ref], _schema_of(tmp_path / written.name))
    assert table.to_pylist() == [{"store": "s1", "value": 3.0}]


def _under_the_largest_h(df):
    return pd.DataFrame({"v": [df["x"].sum()]}, index=[df["h"].max()])


def test_an_index_is_judged_once_for_all_the_outputs_whichever_worker_wrote_them(tmp_path):
    """Two workers, a group each: ``[2]`` is a position among the first's
    rows (0 to 2), ``[70]`` none of the second's. Judged by each worker, the
    first's was dropped and the second's a column ``index``, null in the
    first's row; the driver judges both: a column ``index`` of 2 and 70."""
    first, second = (_writer(tmp_path, _under_the_largest_h).worker_copy() for _ in range(2))
    one = first(pd.DataFrame({"x": [1.0, 2.0, 3.0], "h": [0, 1, 2]}), key="s1")
    two = second(pd.DataFrame({"x": [4.0, 5.0], "h": [50, 70]}), key="s2")
    first.seal_part()
    second.seal_part()
    schema = engineoutputs._unified_schema(str(tmp_path), [one, two], "dask")
    table = read_files(str(tmp_path), [one.ref, two.ref], schema)
    assert table.to_pylist() == [{"store": "s1", "index": 2, "v": 6.0},
                                 {"store": "s2", "index": 70, "v": 9.0}]
