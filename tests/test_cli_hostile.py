"""The command line and the store under hostile but plausible input: another
program's SQLite file, a folder with an ``artifacts/`` of its own, run ids
that are not run ids, outputs that cannot be written, features of the wrong
type, empty or repeated lists. Each test fails before its fix."""

from __future__ import annotations

import os
import sqlite3
import sys
import time

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import LinearRegression
from typer.testing import CliRunner

import manymodels as mm
from manymodels.cli import app


def _invoke(*args: str):
    """The command's exit code and output, one line a message (a wide terminal)."""
    return CliRunner(env={"COLUMNS": "400"}).invoke(app, [str(a) for a in args])


def fit(rows):
    return LinearRegression().fit(rows[["price"]], rows["sales"])


@pytest.fixture
def trained(tmp_path):
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"store": np.repeat(["s0", "s1"], 30), "price": rng.uniform(1, 9, 60)})
    table["sales"] = 3 * table["price"] + rng.normal(size=60)
    mm.train(fit, mm.groups(table, by="store"), store=tmp_path / "models", backend="serial",
             progress=False)
    rows = tmp_path / "rows.csv"
    table.drop(columns="sales").to_csv(rows, index=False)
    return tmp_path / "models", rows, table


def test_another_programs_sqlite_file_is_refused_untouched(tmp_path):
    folder = tmp_path / "other"
    folder.mkdir()
    with sqlite3.connect(folder / "index.sqlite") as conn:
        conn.execute("CREATE TABLE runs (run_uuid TEXT, name TEXT)")
    result = _invoke("runs", folder)
    assert result.exit_code == 2 and "SQLite file of something else" in result.output
    with sqlite3.connect(folder / "index.sqlite") as conn:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master")]
        assert tables == ["runs"]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
        assert [row[1] for row in conn.execute("PRAGMA table_info(runs)")] == ["run_uuid",
                                                                               "name"]
    assert sorted(os.listdir(folder)) == ["index.sqlite"]  # no artifacts/ made
    empty = tmp_path / "empty"
    (empty / "artifacts" / "ab").mkdir(parents=True)
    (empty / "artifacts" / "ab" / ("ab" + "0" * 62)).write_bytes(b"a model")
    (empty / "index.sqlite").touch()
    old = time.time() - 3600
    os.utime(empty / "index.sqlite", (old, old))  # (a truncated index, not one being made)
    with pytest.raises(mm.StoreError, match="is empty"):
        mm.Store(empty)


def test_gc_leaves_files_the_store_did_not_write(tmp_path, trained):
    models, _, _ = trained
    theirs = models / "artifacts" / "plots" / "fig.png"
    theirs.parent.mkdir(parents=True)
    theirs.write_text("the user's own")
    ours = models / "artifacts" / "ab" / ("ab" + "0" * 62)  # a stray model file's name
    ours.parent.mkdir()
    ours.write_bytes(b"x")
    old = time.time() - 3 * 3600
    for path in (theirs, ours):
        os.utime(path, (old, old))
    mm.Store(models).gc()
    assert theirs.exists() and not ours.exists()


def test_run_ids_are_run_ids(trained):
    models, _, _ = trained
    store = mm.Store(models)
    with pytest.raises(TypeError, match="delete needs the run to forget"):
        store.delete(None)
    for run in (1.9, True, "abc"):
        with pytest.raises(TypeError, match="run must be a run id"):
            store.results(run)
    with pytest.raises(ValueError, match="has no run"):
        store.results(2**70)
    assert len(store.results(np.int64(1))) == 2
    assert len(store.runs()) == 1  # nothing was deleted


def test_a_key_of_a_zone_is_found_given_in_another(tmp_path):
    moment = pd.Timestamp("2024-01-01", tz="UTC")
    table = pd.DataFrame({"day": [moment] * 3 + [moment + pd.Timedelta(days=1)] * 3,
                          "x": np.arange(6.0)})
    mm.train(lambda rows: float(rows["x"].sum()), mm.groups(table, by="day"),
             store=tmp_path / "s", backend="serial", progress=False)
    store = mm.Store(tmp_path / "s")
    in_berlin = moment.tz_convert("Europe/Berlin")
    assert store.load(in_berlin) == store.load(moment) == 3.0
    assert "was" in store.why_not_reused(in_berlin)
    with pytest.raises(KeyError):  # a naive time is no instant
        store.load(pd.Timestamp("2024-01-01"))


def test_outputs_are_checked_before_work_and_written_whole(tmp_path, trained):
    models, rows, _ = trained
    result = _invoke("predict", models, rows, "--by", "store", "-o", tmp_path / "out.json")
    assert result.exit_code == 2 and "not .json: name a .csv" in result.output
    result = _invoke("predict", models, rows, "--by", "store", "-o", tmp_path / "plain")
    assert result.exit_code == 0 and len(pd.read_csv(tmp_path / "plain")) == 60  # as CSV
    result = _invoke("export", models, "-o", tmp_path / "out.csv")
    assert result.exit_code == 2 and ".parquet" in result.output
    for command in (["predict", models, rows, "--by", "store"], ["export", models]):
        result = _invoke(*command, "-o", tmp_path / "out.csv.gz")  # it would not be gzip
        assert result.exit_code == 2 and "not .gz" in result.output, result.output
    assert not (tmp_path / "out.csv.gz").exists()
    result = _invoke("demo", "--stores", "1", "--items", "2", "--no-serial", "--json",
                     tmp_path / "missing" / "demo.json")
    assert result.exit_code == 2 and "does not exist" in result.output
    if os.path.exists("/dev/full"):
        result = _invoke("predict", models, rows, "--by", "store", "-o", "/dev/full")
        assert result.exit_code == 1 and "cannot write --out '/dev/full'" in result.output
    kept = tmp_path / "kept.csv"
    kept.write_text("an earlier file\n")
    text_price = tmp_path / "text.csv"
    pd.read_csv(rows).assign(price="abc").to_csv(text_price, index=False)
    result = _invoke("predict", models, text_price, "--by", "store", "-o", kept)
    assert result.exit_code == 2 and "column 'price' of the table to predict holds text" \
        in result.output, result.output
    assert "Traceback" not in result.output
    assert kept.read_text() == "an earlier file\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []
    result = _invoke("predict", models, rows, "--by", "store", "-o", kept)
    assert result.exit_code == 0 and len(pd.read_csv(kept)) == 60


def test_train_refuses_empty_and_repeated_lists(tmp_path, trained):
    _, _, table = trained
    data = tmp_path / "sales.csv"
    table.to_csv(data, index=False)
    base = ["train", data, "--by", "store", "--target", "sales", "--model",
            "sklearn.linear_model.Ridge", "--store", tmp_path / "st", "--workers", "1"]
    for option, value, said in (("--features", ",,", "names no column"),
                                ("--features", "price,price", "'price' is named twice"),
                                ("--metrics", "r2,r2", "'r2' is named twice")):
        result = _invoke(*base, option, value)
        assert result.exit_code == 2 and said in result.output, result.output
    result = _invoke(*base, "--grid", "alpha=1,1")
    assert result.exit_code == 2 and "lists the value '1' twice" in result.output
    assert not (tmp_path / "st").exists()


def test_why_names_a_key_whose_combination_no_task_has(tmp_path):
    table = pd.DataFrame({"a": ["x", "x", "y"], "b": ["p", "q", "p"], "v": [1.0, 2.0, 3.0]})
    mm.train(lambda rows: float(rows["v"].sum()), mm.groups(table, by=["a", "b"]),
             store=tmp_path / "s", backend="serial", progress=False)
    result = _invoke("why", tmp_path / "s", "y", "q")
    assert result.exit_code == 2 and "has no task with key" in result.output
    assert "Traceback" not in result.output


def test_why_finds_a_key_as_show_prints_it(tmp_path):
    """A time key printed by `show -f csv` (2024-01-01) or `-f json`
    (2024-01-01T00:00:00), a whole-number float typed 2, a missing value
    typed nan: each names its task, as Python's own spelling does."""
    table = pd.DataFrame({"day": pd.to_datetime(["2024-01-01", "2024-01-02", None]),
                          "width": [1.5, 2.0, float("nan")], "v": [1.0, 2.0, 3.0]})
    mm.train(lambda rows: float(rows["v"].sum()), mm.groups(table, by=["day", "width"]),
             store=tmp_path / "s", backend="serial", progress=False)
    for day, size in (("2024-01-01", "1.5"), ("2024-01-02T00:00:00", "2"),
                      ("2024-01-02 00:00:00", "2.0"), ("", "nan")):
        result = _invoke("why", tmp_path / "s", day, size)
        assert result.exit_code == 0 and "was trained" in result.output, (day, result.output)
    result = _invoke("why", tmp_path / "s", "2024-01-05", "1.5")
    assert result.exit_code == 2 and "its values include" in result.output, result.output


def test_predict_with_no_ended_run_names_run_before_reading_data(tmp_path, trained):
    """A store whose only run is still being written (by a driver elsewhere):
    predict said DATA was at fault, after reading it, and told of run=."""
    models, rows, _ = trained
    with sqlite3.connect(models / "index.sqlite") as conn:
        conn.execute("UPDATE runs SET status = 'running', driver = 'elsewhere:1:1.0'")
    result = _invoke("predict", models, tmp_path / "no-such.csv", "-o", tmp_path / "p.csv")
    assert result.exit_code == 2, result.output
    assert "Invalid value for --run" in result.output and "give --run" in result.output
    result = _invoke("predict", models, rows, "-o", tmp_path / "p.csv", "--run", "1")
    assert result.exit_code == 0 and len(pd.read_csv(tmp_path / "p.csv")) == 60


def test_runs_counts_a_running_run_in_whole_numbers(tmp_path, trained):
    import json

    models, _, table = trained
    mm.train(fit, mm.groups(table.assign(store="s9"), by="store"), store=models,
             backend="serial", progress=False)
    with sqlite3.connect(models / "index.sqlite") as conn:  # run 2 still being written
        conn.execute("UPDATE runs SET status = 'running', ok = NULL, failed = NULL, "
                     "reused = NULL, driver = 'elsewhere:1:1.0' WHERE run_id = 2")
    records = json.loads(_invoke("runs", models, "-f", "json").output)
    assert [(r["ok"], r["failed"], r["reused"]) for r in records] == [(2, 0, 0), (1, 0, 0)]
    assert all(isinstance(r["ok"], int) for r in records)
    assert _invoke("runs", models, "-f", "csv").output.splitlines()[2].count(",1,0,0,") == 1


def test_show_says_a_table_leaves_tasks_out(trained):
    models, _, _ = trained
    cut = _invoke("show", models, "--limit", "1")
    assert cut.exit_code == 0 and "1 more task(s) not shown" in cut.output, cut.output
    assert "not shown" not in _invoke("show", models).output  # (2 tasks: all shown)


def test_dashboard_of_a_file_says_it_is_a_file(tmp_path):
    (tmp_path / "sales.csv").write_text("a,b\n1,2\n")
    result = _invoke("dashboard", tmp_path / "sales.csv")
    assert result.exit_code == 2 and "is a file, not a store's directory" in result.output


def test_an_interrupted_run_counts_the_tasks_it_committed(tmp_path):
    """runs() (and `manymodels runs`) showed no counts for a run whose driver died."""
    from test_observe_hostile import killed_run

    killed_run(tmp_path / "s")
    runs = mm.Store(tmp_path / "s").runs()
    assert runs["status"].tolist() == ["interrupted"]
    assert 0 < runs["ok"].iloc[0] < 400 and runs["failed"].iloc[0] == 0
    assert runs["reused"].iloc[0] == 0


def test_a_device_out_is_written_through_a_pipe_and_a_redirect(tmp_path, trained):
    """--out /dev/stdout resolved to /proc/PID/fd/pipe:[N] under a pipe (no
    such file: nothing written, exit 1); under a redirect its file was
    replaced, and the summary line went over the CSV's first bytes; export's
    Parquet could not be written to a pipe at all. A device is written
    through its name, the summary goes to standard error."""
    import io
    import subprocess
    import sys

    store, rows, table = trained
    command = [sys.executable, "-m", "manymodels", "predict", str(store), str(rows), "--out",
               "/dev/stdout"]
    piped = subprocess.run(command, capture_output=True, timeout=120)
    assert piped.returncode == 0, piped.stderr
    answer = pd.read_csv(io.BytesIO(piped.stdout))
    assert len(answer) == len(table) and (answer["source"] == "group").all()
    assert b"wrote 60 predictions" in piped.stderr
    redirected = tmp_path / "answer.csv"
    with open(redirected, "wb") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 0, done.stderr
    assert pd.read_csv(redirected).equals(answer)
    exported = subprocess.run([sys.executable, "-m", "manymodels", "export", str(store), "-o",
                               "/dev/stdout"], capture_output=True, timeout=120)
    assert exported.returncode == 0, exported.stderr
    assert pd.read_parquet(io.BytesIO(exported.stdout))["store"].tolist() == ["s0", "s1"]


@pytest.mark.parametrize("index", ["empty", "foreign"])
def test_every_command_refuses_an_index_that_is_not_a_stores(tmp_path, index):
    """`manymodels dashboard` served a folder whose index.sqlite was another
    program's (503s for every page), and an empty index.sqlite was taken by
    `runs` and `verify` (exit 0), which wrote a new store's tables and
    artifacts/ into the folder. Both are refused naming STORE, exit 2, and
    the folder is left as it was."""
    folder = tmp_path / "folder"
    folder.mkdir()
    path = folder / "index.sqlite"
    if index == "empty":
        path.touch()
    else:
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE notes (text TEXT)")
    before = path.read_bytes()
    for command in (["runs"], ["verify"], ["show"], ["dashboard", "--port", "0",
                                                      "--token", "abcdefgh"]):
        result = _invoke(command[0], folder, *command[1:])
        assert result.exit_code == 2, (command, result.output)
        assert "STORE" in result.output
    assert sorted(p.name for p in folder.iterdir()) == ["index.sqlite"]
    assert path.read_bytes() == before


def _manymodels(*args: object, **kwargs):
    """``python -m manymodels ARGS`` in a process of its own (its file
    descriptors are what the test is about)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "manymodels", *map(str, args)], timeout=120,
                          **kwargs)


def test_a_device_out_keeps_what_its_redirect_held(tmp_path, trained):
    """--out /dev/stdout reopened the redirected file by its name, which
    truncated it: `>> file` lost the earlier lines, and `{ echo HEADER;
    manymodels export ... -o /dev/stdout; } > f` lost HEADER. The inherited
    descriptor is written at its own offset (/dev/fd/N and /proc/self/fd/N
    too)."""
    import shlex
    import subprocess
    import sys

    store, rows, table = trained
    appended = tmp_path / "app.csv"
    appended.write_bytes(b"EXISTING LINE\n")
    with open(appended, "ab") as sink:
        done = _manymodels("predict", store, rows, "-o", "/dev/stdout", stdout=sink,
                           stderr=subprocess.PIPE)
    assert done.returncode == 0, done.stderr
    lines = appended.read_text().splitlines()
    assert lines[0] == "EXISTING LINE" and lines[1].startswith("store,price")
    assert len(lines) == 2 + len(table)
    grouped = tmp_path / "grp.out"
    command = (f"{{ echo HEADER; {shlex.quote(sys.executable)} -m manymodels export "
               f"{shlex.quote(str(store))} -o /dev/stdout; }} > {shlex.quote(str(grouped))}")
    done = subprocess.run(command, shell=True, stderr=subprocess.PIPE, timeout=120)
    assert done.returncode == 0, done.stderr
    assert grouped.read_bytes().startswith(b"HEADER\nPAR1")
    for name in ("/dev/fd/{}", "/proc/self/fd/{}"):
        other = tmp_path / "fd.csv"
        other.write_bytes(b"EARLIER\n")
        with open(other, "ab") as sink:
            out = name.format(sink.fileno())
            done = _manymodels("predict", store, rows, "-o", out, pass_fds=(sink.fileno(),),
                               capture_output=True)
        assert done.returncode == 0, done.stderr
        assert done.stdout == b"" and b"wrote 60 predictions" in done.stderr
        assert other.read_text().splitlines()[:2] == ["EARLIER", lines[1]]


def test_a_dash_out_is_standard_output(tmp_path, trained):
    """`-o -` wrote a file named `-`, and nothing to standard output."""
    import io

    store, rows, table = trained
    done = _manymodels("predict", store, rows, "-o", "-", cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert len(pd.read_csv(io.BytesIO(done.stdout))) == len(table)
    assert b"wrote 60 predictions to standard output" in done.stderr
    done = _manymodels("export", store, "-o", "-", cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert pd.read_parquet(io.BytesIO(done.stdout))["store"].tolist() == ["s0", "s1"]
    result = _invoke("report", store, "-o", "-")  # (in this process: sys.stdout)
    assert result.exit_code == 0 and "<html" in result.stdout.lower()
    assert "wrote standard output" in result.stderr
    assert not (tmp_path / "-").exists() and not os.path.exists("-")


@pytest.mark.parametrize("code, raised", [("raise RuntimeError('boom on import')\n",
                                            "RuntimeError: boom on import"),
                                           ("def (\n", "SyntaxError")])
def test_a_model_module_that_raises_on_import_is_one_line(tmp_path, trained, code, raised,
                                                          monkeypatch):
    """A --model module raising anything but ImportError on import printed a
    75-line traceback, exit 1: now one line naming it, exit 2, as a missing
    module."""
    _, _, table = trained
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "badmod_under_test.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    data = tmp_path / "sales.csv"
    table.to_csv(data, index=False)
    result = _invoke("train", data, "--by", "store", "--target", "sales", "--model",
                     "badmod_under_test.Model", "--store", tmp_path / "st")
    assert result.exit_code == 2, result.output
    assert "cannot import module 'badmod_under_test' for --model" in result.output
    assert raised in result.output and "Traceback" not in result.output
    assert not (tmp_path / "st").exists()


def test_an_option_given_twice_is_refused(tmp_path, trained):
    """The last of an option given twice was kept silently: `--by store --by
    item` trained by item alone. One that takes one value is refused, naming
    it, before any work; --param and --grid still repeat."""
    models, rows, table = trained
    data = tmp_path / "sales.csv"
    table.assign(item=np.tile(["i0", "i1"], 30)).to_csv(data, index=False)
    base = ["train", data, "--target", "sales", "--model", "sklearn.linear_model.Ridge",
            "--store", tmp_path / "st", "--backend", "serial"]
    for args, option, said in (
            (["--by", "store", "--by", "item"], "--by", "'--by store', then '--by item'"),
            (["--by", "store", "--target", "price"], "--target",
             "'--target sales', then '--target price'"),
            (["--by", "store", "--backend", "threads"], "--backend", "'--backend threads'"),
            (["--by=store", "--metrics", "r2", "--metrics=mae"], "--metrics", "'--metrics mae'")):
        result = _invoke(*base, *args)
        assert result.exit_code == 2, result.output
        assert f"Invalid value for {option}" in result.output and said in result.output
        assert "given twice" in result.output
    assert not (tmp_path / "st").exists()
    out = tmp_path / "a.csv"
    result = _invoke("predict", models, rows, "-o", out, "--out", tmp_path / "b.csv")
    assert result.exit_code == 2 and "--out/-o: given twice" in result.output
    assert not out.exists() and not (tmp_path / "b.csv").exists()
    result = _invoke("show", models, "-f", "csv", "--format=json")
    assert result.exit_code == 2 and "'-f csv', then '--format json'" in result.output
    result = _invoke(*base, "--by", "store", "--param", "alpha=2", "--param",
                     "fit_intercept=false", "--grid", "tol=0.001,0.01", "--no-fallback")
    assert result.exit_code == 0, result.output
    config = mm.Store(tmp_path / "st").attached("train_config", 1)
    assert config["by"] == ["store"] and config["params"] == {"alpha": 2,
                                                              "fit_intercept": False}


def test_a_reader_closing_the_pipe_early_ends_the_command_quietly(tmp_path, trained):
    """`predict ... -o - | head -c 10` ended with "Error: cannot write --out
    '-': Broken pipe". A reader that closes the pipe early (a real pipe,
    read a few bytes then closed) ends the command quietly: no error line,
    no traceback, exit status 1 (as typer ends any command so)."""
    import subprocess
    import sys

    store, _, table = trained
    rows = tmp_path / "many_rows.csv"  # megabytes of CSV: far more than a pipe holds
    pd.concat([table.drop(columns="sales")] * 500).to_csv(rows, index=False)
    for out in ("-", "/dev/stdout"):
        process = subprocess.Popen([sys.executable, "-m", "manymodels", "predict", str(store),
                                    str(rows), "-o", out], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)
        assert process.stdout.read(10) == b"store,pric"
        process.stdout.close()
        error = process.stderr.read()
        assert process.wait(timeout=120) == 1, error
        assert error == b"", error


def test_a_directory_data_reads_csv_tsv_and_parquet_and_refuses_other_tables(tmp_path,
                                                                             trained):
    """A directory DATA read a README.txt in it as CSV (a parse error of the
    note) and a .txt of rows as more rows, though the docs say CSV or
    Parquet. It reads .csv, .tsv (tab-separated) and Parquet files; one
    named as another table format (.txt, .json, .csv.gz) is refused by
    name, before any work; hidden ones and other files are left out."""
    store, _, table = trained
    rows = table.drop(columns="sales")
    folder = tmp_path / "rows"
    folder.mkdir()
    rows.to_csv(folder / "a.csv", index=False)
    rows.to_csv(folder / "b.tsv", sep="\t", index=False)
    rows.to_parquet(folder / "c.parquet")
    (folder / "README.md").write_text("Rows of March.\n")
    (folder / "_notes.txt").write_text("hidden, left out\n")
    out = tmp_path / "answer.csv"
    result = _invoke("predict", store, folder, "-o", out)
    assert result.exit_code == 0, result.output
    answer = pd.read_csv(out)
    assert len(answer) == 3 * len(rows) and (answer["source"] == "group").all()
    for name, write in (("README.txt", lambda p: p.write_text("Rows of March.\nSee wiki.\n")),
                        ("more.txt", lambda p: rows.to_csv(p, index=False)),
                        ("more.json", lambda p: rows.to_json(p)),
                        ("more.csv.gz", lambda p: rows.to_csv(p, index=False))):
        write(folder / name)
        result = _invoke("predict", store, folder, "-o", tmp_path / "no.csv")
        assert result.exit_code == 2, result.output
        assert f"holds '{name}', a file it does not read" in result.output
        assert "Traceback" not in result.output and not (tmp_path / "no.csv").exists()
        result = _invoke("train", folder, "--by", "store", "--target", "price", "--model",
                         "sklearn.linear_model.Ridge", "--store", tmp_path / "st")
        assert result.exit_code == 2 and f"holds '{name}'" in result.output, result.output
        assert not (tmp_path / "st").exists()
        (folder / name).unlink()
    rows.to_csv(tmp_path / "rows.txt", index=False)
    result = _invoke("predict", store, tmp_path / "rows.txt", "-o", tmp_path / "no.csv")
    assert result.exit_code == 2 and "unknown file type '.txt'" in result.output


def test_a_column_missing_from_the_data_is_the_fault_of_the_option_naming_it(tmp_path,
                                                                             trained):
    """`predict --by <a column not in DATA>`, and a --by other than the
    columns the run was keyed by, were said to be DATA's fault; `train
    --by <missing>` named 'DATA/--by'. Each names the option that named the
    column; a column the run needs that DATA lacks is still DATA's."""
    store, rows, table = trained
    data = tmp_path / "sales.csv"
    table.assign(item=np.tile(["i0", "i1"], 30)).to_csv(data, index=False)
    base = ["train", data, "--model", "sklearn.linear_model.Ridge", "--store", tmp_path / "st",
            "--backend", "serial"]
    for args, option, said in (
            (["--by", "shop", "--target", "sales"], "--by",
             "by column 'shop' is not in the table"),
            (["--by", "store", "--target", "profit"], "--target", "'profit' is not in"),
            (["--by", "store", "--target", "sales", "--features", "price,cost"], "--features",
             "'cost' is not in")):
        result = _invoke(*base, *args)
        assert result.exit_code == 2, result.output
        assert f"Invalid value for {option}:" in result.output and said in result.output
    assert not (tmp_path / "st").exists()
    out = tmp_path / "answer.csv"
    for by, said in (("shop", "column 'shop' is not in DATA"),
                     ("item", "the models of run 1 are keyed by ['store']")):
        result = _invoke("predict", store, data, "--by", by, "-o", out)
        assert result.exit_code == 2, result.output
        assert "Invalid value for --by:" in result.output and said in result.output
    no_key = tmp_path / "no_key.csv"
    table.drop(columns=["sales", "store"]).to_csv(no_key, index=False)
    result = _invoke("predict", store, no_key, "--by", "store", "-o", out)
    assert result.exit_code == 2 and "Invalid value for --by:" in result.output
    result = _invoke("predict", store, no_key, "-o", out)  # the run's key: DATA lacks it
    assert result.exit_code == 2 and "Invalid value for DATA:" in result.output
    assert "'store' is not in the table to predict" in result.output
    assert not out.exists()


def test_serve_writes_an_ipv6_host_in_brackets_in_its_url(trained):
    """`serve --host ::1` printed http://::1:8000/v1/predict, a URL no
    client parses: an IPv6 address in a URL is written [::1]."""
    import select
    import socket
    import subprocess
    import sys

    store, _, _ = trained
    with socket.socket() as probe:  # a port free now
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "manymodels", "serve", str(store),
                                "--host", "::1", "--port", str(port)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        line = process.stdout.readline().decode() if ready else ""
    finally:
        process.terminate()
        process.wait(timeout=30)
    assert f": http://[::1]:{port}/v1/predict (run 1;" in line, line


def test_a_flag_given_both_ways_is_refused(tmp_path, trained):
    """`--fallback --no-fallback` kept the last one silently (trained with no
    fallback). A flag given both ways is refused, naming it, exit status 2,
    before any work; given twice the same way it is still taken."""
    _, _, table = trained
    data = tmp_path / "sales.csv"
    table.to_csv(data, index=False)
    base = ["train", data, "--by", "store", "--target", "sales", "--model",
            "sklearn.linear_model.Ridge", "--store", tmp_path / "st", "--backend", "serial"]
    for flags, said in ((["--fallback", "--no-fallback"], "'--fallback', then '--no-fallback'"),
                        (["--no-fallback", "--timeout", "9", "--fallback"],
                         "'--no-fallback', then '--fallback'")):
        result = _invoke(*base, *flags)
        assert result.exit_code == 2, result.output
        assert "Invalid value for --fallback/--no-fallback: given both ways" in result.output
        assert said in result.output and "Traceback" not in result.output
    result = _invoke(*base, "--allow-failures", "--no-allow-failures")
    assert result.exit_code == 2 and "--allow-failures/--no-allow-failures" in result.output
    assert not (tmp_path / "st").exists()
    result = _invoke("demo", "--stores", "1", "--items", "1", "--no-serial", "--serial")
    assert result.exit_code == 2 and "--serial/--no-serial: given both ways" in result.output
    result = _invoke("dashboard", tmp_path / "none", "--allow-remote", "--no-allow-remote")
    assert result.exit_code == 2 and "--allow-remote/--no-allow-remote" in result.output
    result = _invoke(*base, "--no-fallback", "--no-fallback")  # the same way twice: taken
    assert result.exit_code == 0, result.output


def _fails_on_zero(item):
    if item == 0:
        raise ValueError("zero is refused")
    return item


def test_why_says_a_task_that_did_not_end_ok_was_not_trained(tmp_path):
    """`why` (and Store.why_not_reused) said "was trained" of a task that was
    cancelled (it never ran) or failed: each says what became of it."""
    with pytest.raises(mm.TooManyFailures):
        mm.train(_fails_on_zero, mm.items(range(4)), store=tmp_path / "s", backend="serial",
                 max_failures=0, progress=False)
    store = mm.Store(tmp_path / "s")
    assert store.results()["status"].tolist() == ["failed"] + ["cancelled"] * 3
    failed, cancelled = store.why_not_reused(0), store.why_not_reused(2)
    assert "was trained" not in failed and "was trained" not in cancelled
    assert failed.startswith("0 was not trained in run 1: its fit ended 'failed' "
                             "(ValueError: zero is refused)")
    assert cancelled.startswith("2 never ran in run 1: cancelled")
    assert "no earlier run in this store has this key" in cancelled
    mm.train(_fails_on_zero, mm.items(range(1, 4)), store=tmp_path / "s", backend="serial",
             progress=False)
    assert store.why_not_reused(2) == ("2 was trained: in run 1 it ended 'cancelled'")
    for key, said in (("0", "its fit ended 'failed' (ValueError: zero is refused)"),
                      ("3", "3 never ran in run 1: cancelled")):
        result = _invoke("why", tmp_path / "s", key, "--run", "1")
        assert result.exit_code == 0 and said in result.output, result.output
        assert "was trained" not in result.output


def test_the_metrics_help_and_error_list_every_regression_metric(tmp_path, trained):
    """`train --help` and the error for a classification metric with a
    regressor left out smape and mase, which work."""
    _, _, table = trained
    data = tmp_path / "sales.csv"
    table.to_csv(data, index=False)
    helped = " ".join(_invoke("train", "--help").output.split())
    assert "r2, mae, mse, rmse, mape, smape, mase (regression" in helped
    result = _invoke("train", data, "--by", "store", "--target", "sales", "--model",
                     "sklearn.linear_model.Ridge", "--store", tmp_path / "st", "--metrics",
                     "accuracy")
    assert result.exit_code == 2
    assert "use rmse, mse, mae, mape, smape, mase or r2" in " ".join(result.output.split())


def test_train_says_which_features_it_chose_and_which_it_left_out(tmp_path):
    """One '?' in a price column read it as text: the price was dropped from
    every model, silently (the r2 fell from 0.96 to -0.45)."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"store": rng.choice(["a", "b"], 40), "price": rng.random(40),
                          "promo": rng.integers(0, 2, 40), "note": "x"})
    frame["sales"] = 3 * frame["price"] + frame["promo"]
    dirty = frame.astype({"price": str})
    dirty.loc[3, "price"] = "?"
    dirty.to_csv(tmp_path / "dirty.csv", index=False)
    result = _invoke("train", tmp_path / "dirty.csv", "--by", "store", "--target", "sales",
                  "--model", "sklearn.linear_model.Ridge", "--store", tmp_path / "st")
    assert result.exit_code == 0, result.output
    assert ("features: promo (every numeric column but --by and --target; not numeric, "
            "left out: price, note)") in result.output
    given = _invoke("train", tmp_path / "dirty.csv", "--by", "store", "--target", "sales",
                 "--model", "sklearn.linear_model.Ridge", "--store", tmp_path / "st2",
                 "--features", "promo")
    assert given.exit_code == 0 and "features:" not in given.output


_SLOW_MODEL = '''
import time
from pathlib import Path
from sklearn.linear_model import LinearRegression

class Slow(LinearRegression):
    def fit(self, X, y, sample_weight=None):
        Path(__file__).with_name("started").touch()
        time.sleep(0.3)
        return super().fit(X, y, sample_weight)
'''


def test_ctrl_c_of_train_says_what_is_kept_and_exits_130(tmp_path):
    """Ctrl-C of train exited 130 with no word of what was kept."""
    import signal
    import subprocess
    import sys

    (tmp_path / "slowmodel.py").write_text(_SLOW_MODEL)
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"store": np.repeat(np.arange(60), 5), "price": rng.random(300)})
    frame["sales"] = 2 * frame["price"]
    frame.to_csv(tmp_path / "sales.csv", index=False)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [sys.executable, "-m", "manymodels", "train", str(tmp_path / "sales.csv"), "--by",
         "store", "--target", "sales", "--model", "slowmodel.Slow", "--store",
         str(tmp_path / "st"), "--workers", "2", "--no-fallback", "--metrics", "rmse"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert "interrupted: " in err and f"kept in {tmp_path / 'st'}" in err
    assert mm.Store(tmp_path / "st").runs()["status"].tolist() == ["interrupted"]


def fit_with_nested_scores(rows):
    return float(rows["x"].sum()), {"scores": [1.0, float("nan"), float("inf")],
                                    "by_fold": {"a": float("-inf")}}


def test_json_outputs_hold_no_nan_or_nat_inside_keys_lists_and_times(tmp_path):
    import json

    table = pd.DataFrame({"name": ["a", "b", "c"], "limit": [1.5, float("inf"), 2.0],
                          "day": pd.to_datetime(["2024-01-01", None, "2024-01-03"]),
                          "x": [1.0, 2.0, 3.0]})
    store = tmp_path / "s"
    mm.train(fit_with_nested_scores, mm.groups(table, by=["name", "limit", "day"]),
             store=store, backend="serial", progress=False)
    shown = _invoke("show", store, "-f", "json")
    assert shown.exit_code == 0, shown.output
    records = {r["name"]: r for r in json.loads(shown.output)}  # strict JSON: no NaN
    assert records["a"]["scores"] == [1.0, None, "Infinity"]
    assert records["a"]["by_fold"] == {"a": "-Infinity"}
    assert records["a"]["day"] == "2024-01-01T00:00:00" and records["b"]["day"] is None
    with sqlite3.connect(store / "index.sqlite") as conn:  # every model's pack gone
        conn.execute("DELETE FROM packs")
    checked = _invoke("verify", store, "-f", "json")
    assert checked.exit_code == 1, checked.output
    keys = [r["key"] for r in json.loads(checked.output)]
    assert ["b", "Infinity", None] in keys and len(keys) == 3


def test_train_refuses_a_bad_backend_timeout_or_store_before_reading_data(tmp_path):
    """Each is refused naming its own option, before DATA is read (a DATA that
    does not exist is not what is said) or a linear model fitted in batches."""
    (tmp_path / "a-file").write_text("not a folder")
    base = ["train", tmp_path / "no-such.csv", "--by", "store", "--target", "sales",
            "--model", "sklearn.linear_model.Ridge"]
    for extra, option, said in (
            (["--store", tmp_path / "a-file"], "--store", "is a file"),
            (["--store", tmp_path / "a-file" / "models"], "--store", "a file, not a directory"),
            (["--store", tmp_path / "st", "--timeout", "-5"], "--timeout", "positive"),
            (["--store", tmp_path / "st", "--backend", "bogus"], "--backend",
             "unknown backend"),
            (["--store", tmp_path / "st", "--backend", "threads", "--timeout", "3"],
             "--backend/--timeout", "cannot stop")):
        result = _invoke(*base, *extra)
        assert result.exit_code == 2, result.output
        assert f"Invalid value for {option}:" in result.output and said in result.output, \
            result.output
    assert not (tmp_path / "st").exists()


def _total(item):
    return float(len(str(item)))


def test_a_negative_run_id_or_key_is_an_argument_not_an_unknown_option(tmp_path):
    """`show STORE -1` and `why STORE -1` said "No such option: -1": a key
    -1 could be named only after `--`. An option's value stays its own."""
    mm.train(_total, mm.items([-1, 2]), store=tmp_path / "s", backend="serial", progress=False)
    shown = _invoke("show", tmp_path / "s", "-1")
    assert shown.exit_code == 2 and "has no run -1" in shown.output, shown.output
    why = _invoke("why", tmp_path / "s", "-1", "--run", "1")
    assert why.exit_code == 0 and "-1 was trained" in why.output, why.output
    limited = _invoke("show", tmp_path / "s", "--limit", "-1")
    assert limited.exit_code == 2 and "--limit" in limited.output
    unknown = _invoke("show", tmp_path / "s", "-1", "--limt", "3")
    assert unknown.exit_code == 2 and "No such option: --limt" in unknown.output


def test_why_tells_a_key_1_from_a_key_1_as_text_as_python_writes_them(tmp_path):
    """Both print 1: `why STORE 1` said "could be any of 1, 1: give it as shown"."""
    mm.train(_total, mm.items([1, "1"]), store=tmp_path / "s", backend="serial", progress=False)
    number = _invoke("why", tmp_path / "s", "1")
    assert number.exit_code == 0 and number.output.startswith("1 was trained"), number.output
    text = _invoke("why", tmp_path / "s", "'1'")
    assert text.exit_code == 0 and text.output.startswith("'1' was trained"), text.output


def test_show_tells_a_key_1_from_a_key_1_as_text(tmp_path):
    """`show`'s table printed the keys 1 and "1" alike, two rows of 1: where
    a text prints as a value of another type does, the column's texts are
    shown as Python writes them, as `why` takes them."""
    mm.train(_total, mm.items([1, "1", 2.5]), store=tmp_path / "s", backend="serial",
             progress=False)
    shown = _invoke("show", tmp_path / "s")
    assert shown.exit_code == 0, shown.output
    keys = [line.split()[0] for line in shown.output.splitlines()[2:]]
    assert keys == ["1", "'1'", "2.5"]


def test_train_without_scikit_learn_names_model_not_mlflow(tmp_path, trained, monkeypatch):
    """scikit-learn is no dependency of the package: without it, `manymodels
    train` said "Invalid value for --mlflow: No module named 'sklearn'", an
    option the command was not given. It says what is missing, blaming
    --model, before any work."""
    _, _, table = trained
    data = tmp_path / "sales.csv"
    table.to_csv(data, index=False)
    for name in [name for name in sys.modules if name.split(".")[0] == "sklearn"]:
        monkeypatch.setitem(sys.modules, name, None)  # (import raises ImportError)
    monkeypatch.setitem(sys.modules, "sklearn", None)
    result = _invoke("train", data, "--by", "store", "--target", "sales", "--model",
                     "sklearn.linear_model.Ridge", "--store", tmp_path / "st",
                     "--backend", "serial")
    assert result.exit_code == 2, result.output
    assert "--mlflow" not in result.output and "Invalid value for --model" in result.output
    assert "needs scikit-learn" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "st").exists()


def test_demo_json_to_standard_output_is_json_alone(tmp_path):
    """`demo --json -` printed the summary table on standard output before
    the JSON, so `demo --json - | jq` could not read it; the table goes to
    standard error then."""
    import json

    done = _manymodels("demo", "--stores", "1", "--items", "2", "--workers", "1",
                       "--no-serial", "--json", "-", cwd=tmp_path, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["groups"] == 2
    assert b"models ok / failed" in done.stderr


def test_sigterm_while_an_output_is_written_leaves_no_temporary_file(tmp_path):
    """SIGTERM (a scheduler's kill) while a command wrote its output killed
    it outright, its temporary file (`.out.csv.PID.tmp`) left beside the
    output; the signal ends it as an exit, status 143, the file removed."""
    import subprocess

    script = ("import os, signal\n"
              "from manymodels.cli.outputs import written\n"
              "with written('out.csv') as path:\n"
              "    path.write_text('half')\n"
              "    os.kill(os.getpid(), signal.SIGTERM)\n"
              "    path.write_text('whole')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, timeout=60)
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    assert done.returncode == 143


def test_show_prints_each_key_whole_and_why_takes_it_so(tmp_path):
    """show's table printed keys at 4 significant digits (0.12345 and
    0.12346 both as 0.1235, 1234567.8 as 1.235e+06), a line break in a key
    as a space and a tab as it is, and `why` refused each key as the table
    printed it. Keys print whole, a line break and a tab as their escapes,
    and `why` takes them as printed."""
    keys = [0.12345, 0.12346, 1234567.8, "c\nd", "e\tf"]
    mm.train(_total, mm.items(keys), store=tmp_path / "s", backend="serial", progress=False)
    shown = _invoke("show", tmp_path / "s")
    assert shown.exit_code == 0, shown.output
    printed = [line.split()[0] for line in shown.output.splitlines()[2:]]
    assert sorted(printed) == sorted(["0.12345", "0.12346", "1234567.8", "c\\nd", "e\\tf"])
    for key in printed:
        why = _invoke("why", tmp_path / "s", key)
        assert why.exit_code == 0 and "was trained" in why.output, (key, why.output)


@pytest.mark.parametrize("name", ["artifact", "size", "started_at", "reused_from"])
def test_a_key_column_named_as_a_store_column_is_refused_with_a_store(tmp_path, name):
    """A key column named `size` (or `artifact`, ...) was replaced in
    Store.results, `show` and `export` by the store's column of that name:
    its values lost there. With a store it is refused, before any work;
    without one (whose results add no such column) it is a key as any."""
    table = pd.DataFrame({name: [1, 1, 2, 2], "x": [1.0, 2.0, 3.0, 4.0]})
    with pytest.raises(ValueError, match=f"key column '{name}'.*store.results adds"):
        mm.train(_total, mm.groups(table, by=name), store=tmp_path / "s",
                 backend="serial", progress=False)
    assert not (tmp_path / "s").exists()
    run = mm.train(_total, mm.groups(table, by=name), backend="serial", progress=False)
    assert run.results[name].tolist() == [1, 2]


def test_an_output_that_would_replace_a_file_of_the_store_is_refused(tmp_path, trained):
    """`export models/ -o models/index.sqlite` replaced the store's index
    with a Parquet file: the store was lost. An output that names the
    store's index or a file in its folders is refused before any work; one
    beside the index is written."""
    store, rows, _ = trained
    index = store / "index.sqlite"
    before = mm.Store(store).results()[["store", "artifact"]]
    artifact = store / "artifacts" / "packed"  # (a folder of the store's)
    for command in (["export", store], ["report", store], ["predict", store, rows]):
        for out in (index, store / "index.sqlite-wal", artifact):
            result = _invoke(*command, "-o", out)
            assert result.exit_code == 2, (command, out, result.output)
            assert "is a file of the store" in result.output and "--out" in result.output
    assert _invoke("report", store, "-o", store / "report.html").exit_code == 0
    assert mm.Store(store).results()[["store", "artifact"]].equals(before)


def test_predict_by_names_a_column_holding_a_comma(tmp_path):
    """`predict --by 'store,region'` was split at its comma: a column so
    named could not be given. The text names it whole where the table has
    it; `a\\,b` names it where the table has a, b and 'a,b'; `train --by`
    takes `\\,` too."""
    rng = np.random.default_rng(0)
    table = pd.DataFrame({"store,region": np.repeat(["s0", "s1"], 20),
                          "price": rng.uniform(1, 9, 40)})
    table["sales"] = 3 * table["price"]
    data = tmp_path / "sales.csv"
    table.to_csv(data, index=False)
    trained = _invoke("train", data, "--by", "store\\,region", "--target", "sales", "--model",
                      "sklearn.linear_model.LinearRegression", "--store", tmp_path / "s",
                      "--backend", "serial", "--no-fallback")
    assert trained.exit_code == 0, trained.output
    rows = tmp_path / "rows.csv"
    table.drop(columns="sales").to_csv(rows, index=False)
    out = tmp_path / "out.csv"
    predicted = _invoke("predict", tmp_path / "s", rows, "--by", "store,region", "-o", out)
    assert predicted.exit_code == 0, predicted.output
    assert (pd.read_csv(out)["source"] == "group").all()
    table.assign(store=1, region=2).drop(columns="sales").to_csv(rows, index=False)
    both = _invoke("predict", tmp_path / "s", rows, "--by", "store,region", "-o", out)
    assert both.exit_code == 2 and "write 'store\\,region' for the one column" in both.output
    escaped = _invoke("predict", tmp_path / "s", rows, "--by", "store\\,region", "-o", out)
    assert escaped.exit_code == 0, escaped.output


def _sales_csv(path, rows=40):
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"store": np.repeat(["s0", "s1"], rows // 2),
                          "price": rng.uniform(1, 9, rows), "promo": rng.integers(0, 2, rows)})
    frame["sales"] = 3 * frame["price"] + frame["promo"] + rng.normal(size=rows)
    frame.to_csv(path, index=False)
    return path


def test_a_csv_naming_a_column_twice_is_refused_naming_it(tmp_path):
    """A header naming `price` twice ended train in a KeyError traceback of
    pyarrow ('Field "price" exists 2 times in schema')."""
    lines = _sales_csv(tmp_path / "ok.csv").read_text().splitlines()
    (tmp_path / "dup.csv").write_text("\n".join(
        [lines[0] + ",price"] + [f"{line},{line.split(',')[1]}" for line in lines[1:]]) + "\n")
    result = _invoke("train", tmp_path / "dup.csv", "--by", "store", "--target", "sales",
                     "--model", "sklearn.linear_model.Ridge", "--store", tmp_path / "st")
    assert result.exit_code == 2, result.output
    assert "has two columns named 'price'" in result.output
    assert not (tmp_path / "st").exists()


def test_a_parquet_file_naming_a_column_twice_is_refused_naming_it(tmp_path):
    """pyarrow's read of it failed with a page of its schema ('Multiple
    matches for FieldRef.Name(x) in g: string ... __filename: string')."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table([["a", "a", "b", "b"], [1.0, 2, 3, 4], [1.0, 2, 3, 5],
                             [1.0, 2, 3, 4]], names=["g", "x", "x", "y"]),
                   tmp_path / "dup.parquet")
    result = _invoke("train", tmp_path / "dup.parquet", "--by", "g", "--target", "y",
                     "--model", "sklearn.linear_model.Ridge", "--store", tmp_path / "st")
    assert result.exit_code == 2, result.output
    assert "the table " in result.output and "has two columns named 'x'" in result.output
    assert "FieldRef" not in result.output


@pytest.mark.parametrize("grid", ["None,3", "None"])
def test_the_fallback_takes_a_grid_value_as_given(tmp_path, grid):
    """With ``--grid max_depth=None,3`` the results column holds NaN and
    3.0: the fallback was fitted with max_depth=3.0, which the tree refuses,
    or, every group choosing None, failed on a mode of nothing
    (IndexError); either way the run had no fallback."""
    data = _sales_csv(tmp_path / "sales.csv")
    result = _invoke("train", data, "--by", "store", "--target", "sales", "--model",
                     "sklearn.tree.DecisionTreeRegressor", "--param", "random_state=0",
                     "--grid", f"max_depth={grid}", "--backend", "serial",
                     "--store", tmp_path / "st")
    assert result.exit_code == 0, result.output
    assert "no fallback model" not in result.output
    fallback = mm.Store(tmp_path / "st").attached("fallback", run=1)
    assert fallback.max_depth in (None, 3) and type(fallback.max_depth) is not float


def test_a_by_column_as_a_feature_is_refused(tmp_path):
    """``--by promo --features promo,price`` trained each group on a column
    of one value, silently."""
    data = _sales_csv(tmp_path / "sales.csv")
    result = _invoke("train", data, "--by", "promo", "--target", "sales", "--model",
                     "sklearn.linear_model.Ridge", "--features", "promo,price",
                     "--store", tmp_path / "st")
    assert result.exit_code == 2, result.output
    assert "--features" in result.output and "'promo' is also a --by column" in result.output
    assert not (tmp_path / "st").exists()


_SLOW_FALLBACK = '''
import time
from pathlib import Path
from sklearn.linear_model import LinearRegression

class SlowOnAll(LinearRegression):
    def fit(self, X, y, sample_weight=None):
        if len(X) > 20:  # every row: the fallback
            Path(__file__).with_name("fallback").touch()
            time.sleep(60)
        return super().fit(X, y, sample_weight)
'''


def test_a_stop_while_the_fallback_is_fitted_says_what_is_kept(tmp_path):
    """SIGTERM while the fallback model was fitted (after the run) killed
    train (status 143), Ctrl-C ended it with no line at all: as though
    nothing was kept, though every group's model was. (Both stop it alike,
    by the run's own handlers: SIGTERM is the one tested, one process.)"""
    import signal
    import subprocess

    (tmp_path / "slowfallback.py").write_text(_SLOW_FALLBACK)
    data = _sales_csv(tmp_path / "sales.csv")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    process = subprocess.Popen(
        [sys.executable, "-m", "manymodels", "train", str(data), "--by", "store", "--target",
         "sales", "--model", "slowfallback.SlowOnAll", "--store", str(tmp_path / "st"),
         "--backend", "serial"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "fallback").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 130, err
    assert f"2 model(s) kept in {tmp_path / 'st'}, no fallback model fitted" in err
    assert mm.Store(tmp_path / "st").runs()["status"].tolist() == ["finished"]


def test_a_fallback_that_cannot_be_fitted_is_said_in_one_line(tmp_path):
    """Its reason was the exception's repr: scikit-learn's paragraph of
    advice about NaN, with its line breaks as ``\\n``, on one line."""
    data = _sales_csv(tmp_path / "sales.csv")
    frame = pd.read_csv(data)
    frame.loc[frame["store"] == "s1", "price"] = np.nan
    frame.to_csv(data, index=False)
    result = _invoke("train", data, "--by", "store", "--target", "sales", "--model",
                     "sklearn.linear_model.Ridge", "--store", tmp_path / "st",
                     "--backend", "serial", "--allow-failures")
    assert result.exit_code == 0, result.output
    said = [line for line in result.output.splitlines() if "no fallback model" in line]
    assert said == ["no fallback model: fitting it on all rows failed: ValueError: Input X "
                    "contains NaN."], result.output


def test_a_csv_separated_by_semicolons_is_said_so(tmp_path, trained):
    """A ';'-separated CSV (a European spreadsheet's) reads as one column
    named 'store;price;...': train and predict said a column was missing,
    with no word of why."""
    models, rows, table = trained
    semi = tmp_path / "semi.csv"
    table.to_csv(semi, index=False, sep=";")
    for command in (["train", semi, "--by", "store", "--target", "sales", "--model",
                     "sklearn.linear_model.Ridge", "--store", tmp_path / "st"],
                    ["predict", models, semi, "-o", tmp_path / "out.csv"],
                    ["predict", models, semi, "--by", "store", "-o", tmp_path / "out.csv"]):
        result = _invoke(*command)
        assert result.exit_code == 2, result.output
        assert "the file looks separated by ';'" in result.output, result.output


def test_train_refuses_a_column_predict_could_not_read(tmp_path):
    """A feature named `source` (or a key named `prediction`) was trained on,
    and then `manymodels predict` refused every DATA holding it: models no
    row could be predicted with, found out after the training."""
    data = _sales_csv(tmp_path / "sales.csv")
    pd.read_csv(data).rename(columns={"promo": "source"}).to_csv(data, index=False)
    result = _invoke("train", data, "--by", "store", "--target", "sales", "--model",
                     "sklearn.linear_model.Ridge", "--store", tmp_path / "st")
    assert result.exit_code == 2, result.output
    assert "--features" in result.output
    assert "'source' is a column manymodels predict" in result.output
    assert not (tmp_path / "st").exists()


def test_the_fallback_takes_the_setting_of_the_groups_that_were_fitted(tmp_path):
    """A failed group chose no setting: its empty ``best_`` cell counted as a
    choice of None, so three groups of one class (which LogisticRegression
    refuses) outvoted the two that chose ``class_weight=balanced``."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=100)
    frame = pd.DataFrame({"g": np.repeat(list("abcde"), 20), "x": x,
                          "y": np.where((x > 0) | (np.arange(100) >= 40), "yes", "no")})
    frame.to_csv(tmp_path / "classes.csv", index=False)
    result = _invoke("train", tmp_path / "classes.csv", "--by", "g", "--target", "y",
                     "--model", "sklearn.linear_model.LogisticRegression", "--grid",
                     "class_weight=balanced,None", "--backend", "serial", "--allow-failures",
                     "--store", tmp_path / "st")
    assert result.exit_code == 0, result.output
    store = mm.Store(tmp_path / "st")
    assert list(store.results(run=1)["status"]) == ["ok"] * 2 + ["failed"] * 3
    assert store.attached("fallback", run=1).class_weight == "balanced"


def _alpha(alpha):
    return alpha


def test_a_store_given_as_a_file_uri_is_the_local_store_at_its_path(tmp_path, monkeypatch):
    """``store="file:///tmp/s"`` (mm.train, mm.Store, the CLI's STORE) was a
    new store in a folder named ``file:`` under the current directory, not
    the one at ``/tmp/s``: nothing of a run to ``/tmp/s`` was reused."""
    monkeypatch.chdir(tmp_path)
    store = tmp_path / "my store"
    runs = [mm.train(_alpha, mm.grid(alpha=[1, 2]), store=given, backend="serial",
                     progress=False) for given in (str(store), store.as_uri())]
    assert runs[1].summary().reused == 2
    assert len(mm.Store("file:" + store.as_uri()[7:]).runs()) == 2
    code = _invoke("runs", store.as_uri())
    assert code.exit_code == 0 and code.output.count("finished") == 2, code.output
    code = _invoke("runs", "file:models")
    assert code.exit_code == 2 and "store 'file:models' names no absolute" in code.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["my store"]  # no "file:" folder


_WRITERS = {  # how each way of writing a file is given its path
    "Store.export": lambda store, rows, out: mm.Store(store).export(out),
    "Run.report": lambda store, rows, out: mm.train(
        _alpha, mm.grid(alpha=[1]), backend="serial", progress=False).report(out),
    "predict -o": lambda store, rows, out: _invoke("predict", store, rows, "-o", out),
    "export -o": lambda store, rows, out: _invoke("export", store, "-o", out),
    "report -o": lambda store, rows, out: _invoke("report", store, "-o", out),
}


@pytest.mark.parametrize("writer, name, refused", [
    ("Store.export", "r.parquet", "export's path"), ("Run.report", "r.html", "report's path"),
    ("predict -o", "p.csv", "output"), ("export -o", "r.pq", "output"),
    ("report -o", "r.html", "output")])
def test_an_output_given_as_a_file_uri_is_written_at_its_path(trained, tmp_path, monkeypatch,
                                                              writer, name, refused):
    """``-o file:///tmp/x.parquet``, ``Store.export`` and ``Run.report`` given
    one wrote under a folder named ``file:`` in the current directory (or
    said that folder did not exist); now the file at the path it names, and
    one naming no absolute path is refused naming the argument, nothing
    written."""
    store, rows, _ = trained
    (tmp_path / "out dir").mkdir()
    monkeypatch.chdir(tmp_path / "out dir")
    target = tmp_path / "out dir" / name
    done = _WRITERS[writer](store, rows, target.as_uri())  # file:///.../out%20dir/r.parquet
    assert getattr(done, "exit_code", 0) == 0, done.output
    assert target.is_file() and target.stat().st_size > 0
    target.unlink()
    if writer.endswith("-o"):
        code = _WRITERS[writer](store, rows, "file:" + name)
        assert code.exit_code == 2 and f"{refused} 'file:{name}' names no absolute" in \
            code.output, code.output
    else:
        with pytest.raises(ValueError, match=f"{refused} 'file:{name}' names no absolute"):
            _WRITERS[writer](store, rows, "file:" + name)
    assert os.listdir(tmp_path / "out dir") == []  # no "file:" folder, no file


@pytest.mark.parametrize("opening", [
    lambda: mm.Store("file:models"),
    lambda: mm.train(_alpha, mm.grid(alpha=[1]), store="file:models", backend="serial",
                     progress=False),
    lambda: mm.train(_alpha, mm.grid(alpha=[1]), store="file://host/models",
                     backend="serial", progress=False),
    lambda: mm.linear(pd.DataFrame({"g": ["a"], "x": [1.0], "y": [2.0]}), by="g",
                      target="y", features=["x"], store="file:models")],
    ids=["Store", "train", "train-host", "linear"])
def test_a_bad_file_uri_store_is_a_store_error(tmp_path, monkeypatch, opening):
    """A ``file:`` store naming no absolute path or a host raised a plain
    ValueError, where any other bad store location raises ``mm.StoreError``."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(mm.StoreError, match=r"store 'file:(//host/)?models' names (no "
                                            r"absolute path|the host 'host')"):
        opening()
    assert os.listdir(tmp_path) == []
