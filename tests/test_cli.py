from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

import manymodels as mm
from conftest import run_cli


def test_demo_runs_and_reports(tmp_path):
    out = tmp_path / "demo.json"
    result = subprocess.run(
        [sys.executable, "-m", "manymodels.cli", "demo", "--stores", "4", "--items", "5",
         "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "speed-up over serial" in result.stdout
    numbers = json.loads(out.read_text())
    assert numbers["groups"] == 20 and numbers["ok"] == 20 and numbers["failed"] == 0
    assert 0 < numbers["utilization"] <= 1.05
    assert numbers["serial_wall_s"] > 0


def test_help_lists_demo():
    result = subprocess.run([sys.executable, "-m", "manymodels.cli", "--help"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "demo" in result.stdout


_cli = run_cli


@pytest.fixture
def sales_files(tmp_path):
    return _write_sales(tmp_path)


def _write_sales(folder):
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(1)
    parts = []
    for s, store in enumerate(["s000", "s001", "s002"]):
        for item in ["i000", "i001", "i002", "i003"]:
            price, promo = rng.uniform(1, 10, 150), rng.integers(0, 2, 150)
            sales = 50 - (s + 1) * price + 8 * promo + rng.normal(0, 0.5, 150)
            parts.append(pd.DataFrame({"store": store, "item": item, "price": price,
                                       "promo": promo, "sales": sales}))
    table = pd.concat(parts, ignore_index=True)
    csv, parquet = folder / "sales.csv", folder / "sales.parquet"
    table.to_csv(csv, index=False)
    table.to_parquet(parquet)
    return table, csv, parquet


@pytest.mark.parametrize("kind", ["csv", "parquet"])
def test_cli_trains_and_predicts(tmp_path, sales_files, kind):
    import pandas as pd

    table, csv, parquet = sales_files
    data = csv if kind == "csv" else parquet
    store = tmp_path / "store"
    result = _cli("train", data, "--by", "store,item", "--target", "sales",
                  "--model", "sklearn.linear_model.Ridge", "--grid", "alpha=0.01,1000",
                  "--metrics", "r2,mae", "--cv", "3", "--store", store, "--workers", "2")
    assert result.returncode == 0, result.stderr
    assert "12 ok, 0 failed of 12" in result.stdout
    opened = mm.Store(store)
    results = opened.results()
    assert {"r2", "mae", "best_alpha", "rows"} <= set(results.columns)
    assert set(results["best_alpha"]) <= {0.01, 1000}
    assert (results["r2"] > 0.9).all()  # the signal is strong: the small alpha wins
    assert (results["best_alpha"] == 0.01).all()

    new = table[table["store"] == "s000"].head(30).copy()
    unseen = new.head(5).assign(store="s999")
    rows = pd.concat([new, unseen], ignore_index=True)
    rows_path = tmp_path / ("new.parquet" if kind == "parquet" else "new.csv")
    rows.to_parquet(rows_path) if kind == "parquet" else rows.to_csv(rows_path, index=False)
    out = tmp_path / "predictions.csv"
    result = _cli("predict", store, rows_path, "--out", out)
    assert result.returncode == 0, result.stderr
    predicted = pd.read_csv(out)
    assert list(predicted["source"]) == ["group"] * 30 + ["fallback"] * 5
    features = [c for c in table.columns if c not in ("store", "item", "sales")]
    first = rows.iloc[0]
    model = opened.load((first["store"], first["item"]))
    expected = model.predict(rows[features].iloc[:1])[0]  # fitted on a DataFrame
    assert predicted["prediction"].iloc[0] == pytest.approx(expected)
    if kind == "csv":  # a column the output adds is refused, not overwritten
        rows.assign(source="web").to_csv(rows_path, index=False)
        result = _cli("predict", store, rows_path, "--out", tmp_path / "again.csv")
        assert result.returncode == 2 and "column named 'source'" in result.stderr
        assert not (tmp_path / "again.csv").exists()


def test_cli_bad_column_exits_non_zero_naming_it(tmp_path, sales_files):
    _, csv, _ = sales_files
    for args, name in [(("--by", "shop", "--target", "sales"), "'shop'"),
                       (("--by", "store", "--target", "revenue"), "'revenue'"),
                       (("--by", "store", "--target", "sales", "--features", "price,colour"),
                        "'colour'")]:
        result = _cli("train", csv, *args, "--model", "sklearn.linear_model.Ridge",
                      "--store", tmp_path / "s")
        assert result.returncode != 0
        assert name in result.stderr
    result = _cli("train", csv, "--by", "store", "--target", "sales", "--model",
                  "sklearn.linear_model.Ridge", "--metrics", "r3", "--store", tmp_path / "s")
    assert result.returncode != 0 and "unknown metric 'r3'" in result.stderr


def test_cli_failed_groups_set_the_exit_code(tmp_path, sales_files):
    table, _, _ = sales_files
    broken = table.copy()
    broken.loc[broken["store"] == "s001", "price"] = float("nan")  # LinearRegression fails
    data = tmp_path / "broken.parquet"
    broken.to_parquet(data)
    args = ["train", data, "--by", "store", "--target", "sales", "--model",
            "sklearn.linear_model.LinearRegression", "--store", tmp_path / "s"]
    result = _cli(*args)
    assert result.returncode == 1 and "1 group(s) failed" in result.stderr
    assert _cli(*args, "--allow-failures").returncode == 0
    shown = _cli("show", tmp_path / "s")
    assert shown.returncode == 0 and "failed" in shown.stdout


def test_cli_report(tmp_path, sales_files):
    _, csv, _ = sales_files
    store = tmp_path / "s"
    assert _cli("train", csv, "--by", "store", "--target", "sales", "--model",
                "sklearn.linear_model.Ridge", "--store", store).returncode == 0
    out = tmp_path / "r.html"
    result = _cli("report", store, "-o", out)
    assert result.returncode == 0 and out.exists()
    assert "Worker timeline" in out.read_text()


def test_cli_trains_lightgbm_by_dotted_name(tmp_path, sales_files):
    pytest.importorskip("lightgbm")
    _, _, parquet = sales_files
    store = tmp_path / "store"
    result = _cli("train", parquet, "--by", "store", "--target", "sales", "--model",
                  "lightgbm.LGBMRegressor", "--param", "n_estimators=30", "--param",
                  "verbose=-1", "--param", "n_jobs=1", "--store", store, "--workers", "2")
    assert result.returncode == 0, result.stderr
    model = mm.Store(store).load("s001")
    assert type(model).__name__ == "LGBMRegressor" and model.n_estimators == 30
    assert (mm.Store(store).results()["r2"] > 0.5).all()


def _said(text: str) -> str:
    """An error message as one line: rich's panel borders and line breaks out."""
    return " ".join(text.replace("│", " ").replace("╭", " ").replace("╰", " ").split())


def test_version_prints_the_version_from_a_leaf_module():
    import ast
    import importlib.metadata
    import inspect

    import manymodels._version as version_module

    result = _cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"manymodels {mm.__version__}\n"
    assert mm.__version__ == version_module.__version__
    assert mm.__version__ == importlib.metadata.version("manymodels")
    tree = ast.parse(inspect.getsource(version_module))  # imports nothing: any module may use it
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


@pytest.fixture(scope="module")
def trained_store(tmp_path_factory):
    """One store for the tests that only read it (trained once: 1.4 s each)."""
    folder = tmp_path_factory.mktemp("trained")
    _, _, parquet = _write_sales(folder)
    store = folder / "store"
    result = _cli("train", parquet, "--by", "store,item", "--target", "sales", "--model",
                  "sklearn.linear_model.Ridge", "--grid", "alpha=0.01,1", "--store", store,
                  "--workers", "2")
    assert result.returncode == 0, result.stderr
    return store


def test_runs_and_show_are_readable_piped_at_80_columns(trained_store):
    import os

    results = mm.Store(trained_store).results()
    env = {**os.environ, "COLUMNS": "80"}
    for command in ("runs", "show"):
        shown = subprocess.run([sys.executable, "-m", "manymodels.cli", command,
                                str(trained_store)], capture_output=True, text=True,
                               timeout=120, env=env)
        assert shown.returncode == 0, shown.stderr
        assert "…" not in shown.stdout, shown.stdout  # no squeezed column
        if command == "runs":
            header, row = shown.stdout.splitlines()[:2]
            assert header.split()[:3] == ["run_id", "started_at", "status"]
            assert "finished" in row.split() and "12" in row.split()
        else:
            lines = shown.stdout.splitlines()
            assert lines[0] == "run 1: 12 tasks, 12 ok"
            header = lines[1].split()
            assert header[:3] == ["store", "item", "status"] and "r2" in header
            for line, (_, task) in zip(lines[2:], results.iterrows()):
                cells = line.split()
                assert cells[:3] == [task["store"], task["item"], "ok"]
                assert f"{task['r2']:.4g}" in cells and f"{task['mae']:.4g}" in cells


def _on_a_terminal(*args, columns: int, status: int = 0) -> str:
    """What the command line shows on a terminal ``columns`` wide (a
    pseudo-terminal), exiting with ``status``."""
    import os
    import pty
    import re

    master, slave = pty.openpty()
    env = {**os.environ, "COLUMNS": str(columns), "NO_COLOR": "1", "TERM": "xterm"}
    process = subprocess.Popen([sys.executable, "-m", "manymodels.cli", *map(str, args)],
                               stdin=slave, stdout=slave, stderr=slave, env=env)
    os.close(slave)
    chunks = []
    try:
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the terminal closed
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(master)
        assert process.wait(timeout=120) == status, b"".join(chunks)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)  # styles (bold) out


def test_show_on_a_narrow_terminal_splits_columns_not_values(trained_store):
    results = mm.Store(trained_store).results()
    text = _on_a_terminal("show", trained_store, columns=60)
    assert "…" not in text, text  # nothing squeezed
    assert max(len(line) for line in text.splitlines()) <= 60, text
    for value in list(results["r2"]) + list(results["mae"]):
        assert f"{value:.4g}" in text
    assert text.count("│ s001  │ i002 │") >= 2  # the key is repeated beside each part
    text = _on_a_terminal("runs", trained_store, columns=60)
    assert "…" not in text and "finished" in text, text


def test_export_to_a_terminal_is_refused_before_any_work(trained_store):
    """`export -o -` on a terminal sent Parquet's bytes to it (commands to
    the terminal, nothing saved): refused naming --out; piped, it writes."""
    text = _on_a_terminal("export", trained_store, "-o", "-", columns=200, status=2)
    assert "Invalid value for --out" in text and "is a terminal" in text, text
    assert "PAR1" not in text
    piped = subprocess.run([sys.executable, "-m", "manymodels.cli", "export",
                            str(trained_store), "-o", "-"], capture_output=True, timeout=120)
    assert piped.returncode == 0 and piped.stdout[:4] == b"PAR1", piped.stderr


@pytest.mark.parametrize("command", ["runs", "show"])
def test_runs_and_show_write_csv_and_json(trained_store, command):
    import io

    import pandas as pd

    opened = mm.Store(trained_store)
    expected = opened.runs() if command == "runs" else opened.results()
    columns = ["run_id", "tasks", "ok", "wall_s"] if command == "runs" else \
        ["store", "item", "r2", "mae", "best_alpha", "duration_s"]
    as_csv = _cli(command, trained_store, "--format", "csv")
    assert as_csv.returncode == 0, as_csv.stderr
    frame = pd.read_csv(io.StringIO(as_csv.stdout))
    assert len(frame) == len(expected) and set(expected.columns) <= set(frame.columns)
    pd.testing.assert_frame_equal(frame[columns], expected[columns], check_dtype=False)
    as_json = _cli(command, trained_store, "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    records = json.loads(as_json.stdout)
    assert len(records) == len(expected)
    pd.testing.assert_frame_equal(pd.DataFrame(records)[columns], expected[columns],
                                  check_dtype=False)
    assert all(record["started_at"].startswith("20") for record in records)  # ISO 8601


@pytest.mark.parametrize("args, named", [
    (["--param", "nosuch=1"], ["'nosuch'", "sklearn.linear_model.Ridge"]),
    (["--grid", "alhpa=0.1,1"], ["'alhpa'", "sklearn.linear_model.Ridge", "'alpha'"]),
    (["--param", "alpha=-1"], ["'alpha'", "Ridge"]),
    (["--grid", "solver=auto,nope"], ["'solver'", "'nope'"]),
    (["--param", "alpha=1", "--grid", "alpha=1,2"], ["'alpha'", "--param", "--grid"]),
    (["--features", "price,store"], ["'store'", "also a --by column"]),
    (["--features", "price,sales"], ["'sales'", "feature"]),
    (["--metrics", "accuracy"], ["'accuracy'", "regressor"]),
])
def test_train_refuses_bad_arguments_before_any_work(tmp_path, sales_files, args, named):
    from typer.testing import CliRunner

    from manymodels.cli.app import app

    _, _, parquet = sales_files
    store = tmp_path / "s"
    result = CliRunner().invoke(app, ["train", str(parquet), "--by", "store,item", "--target",
                                      "sales", "--model", "sklearn.linear_model.Ridge",
                                      "--store", str(store), *args])
    assert result.exit_code == 2, result.output
    for name in named:
        assert name in _said(result.output), result.output
    assert not store.exists()  # refused before the store was opened: no run recorded


def test_train_refuses_a_text_target_for_a_regressor(tmp_path, sales_files):
    from typer.testing import CliRunner

    from manymodels.cli.app import app

    _, _, parquet = sales_files
    for target, by, named in [("item", "store", "'item'"), ("store", "store", "--by")]:
        result = CliRunner().invoke(app, ["train", str(parquet), "--by", by, "--target",
                                          target, "--model", "sklearn.linear_model.Ridge",
                                          "--store", str(tmp_path / "s")])
        assert result.exit_code == 2 and named in _said(result.output), result.output
    assert not (tmp_path / "s").exists()


def test_output_places_and_options_are_checked_before_any_work(tmp_path, sales_files):
    """export, report and predict check where they will write, and predict its
    workers and backend, before anything runs (a missing directory was a
    traceback after the predicting; --workers 0 was blamed on DATA); why on
    a store without runs says so."""
    from typer.testing import CliRunner

    from manymodels.cli.app import app

    table, csv, _ = sales_files
    store = tmp_path / "store"
    mm.train(lambda rows: float(rows["sales"].mean()), mm.groups(table, by="store"),
             store=store, backend="serial", progress=False)
    missing = tmp_path / "missing" / "out"
    cases = [
        (["export", str(store), "-o", f"{missing}.parquet"], "--out", "does not exist"),
        (["report", str(store), "-o", str(tmp_path)], "--out", "is a directory"),
        (["predict", str(store), str(csv), "--out", f"{missing}.csv"], "--out",
         "does not exist"),
        (["predict", str(store), str(csv), "--out", str(tmp_path / "p.csv"), "--workers", "0"],
         "--workers", "at least 1"),
        (["predict", str(store), str(csv), "--out", str(tmp_path / "p.csv"), "--backend",
          "nope"], "--backend", "unknown backend 'nope'"),
    ]
    for args, hint, message in cases:
        result = CliRunner().invoke(app, args)
        said = _said(result.output)
        assert result.exit_code == 2 and hint in said and message in said, (args, said)
    assert not (tmp_path / "p.csv").exists()
    empty = tmp_path / "empty"
    mm.Store(empty, read_only=False).close()  # (open to write: an empty store made)
    result = CliRunner().invoke(app, ["why", str(empty), "s000"])
    assert result.exit_code == 2 and "holds no runs yet" in _said(result.output)


def test_store_predict_refuses_switches_and_by_of_the_wrong_kind(tmp_path, sales_files):
    table, _, _ = sales_files
    store = tmp_path / "store"
    mm.train(lambda rows: float(rows["sales"].mean()), mm.groups(table, by="store"),
             store=store, backend="serial", progress=False)
    opened = mm.Store(store)
    with pytest.raises(TypeError, match="with_source must be True or False, got 'no'"):
        opened.predict(table, by="store", with_source="no")
    with pytest.raises(TypeError, match="by must be a column name or a list of them, got 5"):
        opened.predict(table, by=5)
    with pytest.raises(ValueError, match="the table to predict has no rows"):
        opened.predict(table.iloc[:0], by="store")  # not "no groups to train"
    opened.close()


def fit_with_infinite_scores_and_a_two_line_error(item):
    if item == 3:
        raise ValueError("no model for item 3\nsee the second line")
    return {"score": {0: math.nan, 1: math.inf, 2: -math.inf}.get(item, 1.5)}


def test_show_tells_infinite_metrics_from_missing_and_names_the_exception(tmp_path):
    """``show -f json`` wrote inf and -inf as null, like NaN (a missing
    value); the table's error column showed the traceback's last line, for a
    message of two lines only its second, without the exception's type."""
    store = tmp_path / "store"
    mm.train(fit_with_infinite_scores_and_a_two_line_error, mm.items(range(5)),
             backend="serial", progress=False, store=store)
    shown = run_cli("show", store, "-f", "json")
    assert shown.returncode == 0, shown.stderr
    assert [row["score"] for row in json.loads(shown.stdout)] == [
        None, "Infinity", "-Infinity", None, 1.5]
    assert [float(v) for v in ("Infinity", "-Infinity")] == [math.inf, -math.inf]
    table = run_cli("show", store)
    assert table.returncode == 0, table.stderr
    assert "ValueError: no model for item 3" in table.stdout
    assert "see the second line" not in table.stdout


def fit_with_a_count_and_a_failure(item):
    if item == 1:
        raise ValueError("boom")
    return {"rows": 123456 + item, "score": 0.5, "r2": 1.0}


def test_show_keeps_integer_columns_integers_beside_failed_tasks(tmp_path):
    """A failed task's missing values made an integer metric (and ``size``)
    floats: ``show -f csv`` printed ``123456.0``, a table ``1.235e+05``. A
    float metric whole in every row (an ``r2`` of 1.0) stays a float: it
    was printed ``1``."""
    store = tmp_path / "store"
    mm.train(fit_with_a_count_and_a_failure, mm.items(range(3)), backend="serial",
             progress=False, store=store)
    as_csv = run_cli("show", store, "-f", "csv").stdout
    assert "123456," in as_csv and "123456.0" not in as_csv and ",0.5,1.0" in as_csv
    shown = json.loads(run_cli("show", store, "-f", "json").stdout)
    assert [row["rows"] for row in shown] == [123456, None, 123458]
    assert [repr(row["r2"]) for row in shown] == ["1.0", "None", "1.0"]
    table = run_cli("show", store).stdout
    assert "123458" in table and table.split("\n")[-2].rstrip().endswith("0.5  1.0")


def test_show_of_an_mm_linear_run_keeps_a_whole_float_metric_a_float(tmp_path):
    """An mm.linear run's r2 of 1.0 in every group that fitted, beside a
    no_weight group's blank, was printed ``1`` (the plain run's path printed
    ``1.0``)."""
    import numpy as np
    import pandas as pd

    frame = pd.DataFrame({"g": np.repeat([3, 5, 9], 4), "a": np.tile([0.0, 1, 2, 3], 3),
                          "w": np.r_[np.ones(8), np.zeros(4)]})
    frame["y"] = 2 * frame["a"] + 1
    store = tmp_path / "store"
    mm.linear(frame, by="g", features=["a"], target="y", weights="w", family="wls",
              store=store, name="exact")
    shown = json.loads(run_cli("show", store, "-f", "json").stdout)
    assert [row["status"] for row in shown] == ["ok", "ok", "no_weight"]
    assert [repr(row["r2"]) for row in shown] == ["1.0", "1.0", "None"]
    assert [row["nobs"] for row in shown] == [4, 4, 0]  # an integer metric stays one


@pytest.mark.parametrize("column, said", [("none", "missing in every row"),
                                          ("row", "a different value in every row")])
def test_train_warns_of_a_by_column_missing_or_unique_per_row(tmp_path, column, said):
    import pandas as pd

    data = tmp_path / "t.csv"
    pd.DataFrame({"none": [None] * 4, "row": range(4), "x": [1.0, 2, 3, 4],
                  "y": [1.0, 2, 3, 5]}).to_csv(data, index=False)
    done = run_cli("train", data, "--by", column, "--target", "y", "--features", "x",
                   "--model", "sklearn.linear_model.LinearRegression", "--backend", "serial",
                   "--no-fallback", "--store", tmp_path / "store")
    assert done.returncode == 0, done.stderr
    assert f"warning: --by column {column!r}" in done.stderr and said in done.stderr


@pytest.mark.parametrize("fmt, key, size", [("csv", "\n0.0,", ",1\n"),
                                            ("json", '"k": 0.0', '"size": 1\n'),
                                            ("table", "0.0", "  1\n")])
def test_whole_numbers_as_ints_leaves_key_columns_as_they_are(capsys, fmt, key, size):
    """A float key column with a missing key printed ``0.0`` as ``0``: the
    key's own value (and type) changed by the integer columns' printing."""
    import pandas as pd

    from manymodels.cli.tables import OutputFormat, print_frame

    frame = pd.DataFrame({"k": [0.0, float("nan")], "run_id": [1, 1], "size": [1.0, None]})
    print_frame(frame, "results", OutputFormat(fmt), keys=1)
    printed = capsys.readouterr().out
    assert key in printed and size in printed and "1.0" not in printed
