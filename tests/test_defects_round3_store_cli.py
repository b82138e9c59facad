"""Round 3 defects of the store, its command line and prediction (issue 37,
items 11, 13, 14 and 16)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

import manymodels as mm
from manymodels.cli.app import app


def _said(text: str) -> str:
    """An error message as one line: rich's panel borders and line breaks out."""
    return " ".join(text.replace("│", " ").replace("╭", " ").replace("╰", " ").split())


# -- 11: a garbage index.sqlite is one clear message, not a traceback ----------------------


def _garbage_stores(tmp_path):
    random_bytes = tmp_path / "random"
    random_bytes.mkdir()
    (random_bytes / "index.sqlite").write_bytes(np.random.default_rng(0).bytes(5000))
    text = tmp_path / "text"
    text.mkdir()
    (text / "index.sqlite").write_text("hello, this is not a database\n")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with sqlite3.connect(foreign / "index.sqlite") as conn:  # another program's SQLite file
        conn.execute("CREATE TABLE foo (x)")
    conn.close()
    return [random_bytes, text, foreign]


@pytest.mark.parametrize("command", ["runs", "show", "why", "export", "report", "predict"])
def test_a_garbage_store_index_is_one_message_naming_store(tmp_path, command):
    """Every store-reading command on an index.sqlite of random bytes, of text
    or of another program printed a 79-line traceback (runs, why, predict) or
    blamed RUN (show, export, report)."""
    data = tmp_path / "rows.csv"
    pd.DataFrame({"g": ["a"], "x": [1.0]}).to_csv(data, index=False)
    for store in _garbage_stores(tmp_path):
        args = {"runs": [str(store)], "show": [str(store)], "why": [str(store), "a"],
                "export": [str(store), "-o", str(tmp_path / "out.parquet")],
                "report": [str(store), "-o", str(tmp_path / "out.html")],
                "predict": [str(store), str(data), "-o", str(tmp_path / "out.csv")]}[command]
        result = CliRunner().invoke(app, [command, *args], env={"COLUMNS": "80"})
        said = _said(result.output)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert isinstance(result.exception, SystemExit), result.exception  # no other error
        assert "Invalid value for STORE" in said, said
        # rich may break the path anywhere: compared without spaces
        assert f"'{store / 'index.sqlite'}'" in said.replace(" ", ""), said
        assert "not a manymodels store index" in said, said


def test_a_garbage_store_index_prints_no_traceback_from_the_installed_command(tmp_path):
    store = _garbage_stores(tmp_path)[0]
    done = subprocess.run([sys.executable, "-m", "manymodels", "runs", str(store)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "80"})
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert "not a manymodels store index" in _said(done.stderr)


# -- 13: a key typed otherwise is found in time linear in its columns ----------------------


def _first_reading_tried_in_turn(by_text: dict, parts: tuple):
    """The lookup as it was: the key, then each reading in turn (exponential)."""
    from manymodels.inputs.keys import encode_key, typed_otherwise

    found = by_text.get(encode_key(parts))
    for variant in typed_otherwise(parts) if found is None else ():
        found = by_text.get(encode_key(variant))
        if found is not None:
            break
    return found


def test_typed_keys_find_what_trying_each_reading_in_turn_finds():
    """Stored keys whose columns are typed every way (1, 1.0, "1", True, 2**60,
    text, missing), several of them readings of one another: the index gives
    the same model as trying the readings in their order, for every query."""
    from manymodels.inputs.keys import TypedKeys, encode_key, find_typed

    values = [0, 1, 1.0, "1", True, False, "0", 7, "07", -3, "-3", 2**60, str(2**60),
              2.5, "a", None]
    rng = np.random.default_rng(1)
    stored = {encode_key(tuple(values[i] for i in rng.integers(0, len(values), 3))): n
              for n in range(400)}
    typed = TypedKeys(stored)
    queries = [tuple(values[i] for i in rng.integers(0, len(values), 3)) for _ in range(600)]
    queries += [(np.int64(1), np.float64(7.0), "-3"), (1, 1, 1), (True, "1", 1.0)]
    found_otherwise = 0
    for parts in queries:
        expected = _first_reading_tried_in_turn(stored, parts)
        assert typed.find(parts) == expected, parts
        assert find_typed(stored, parts) == expected, parts
        found_otherwise += expected is not None and encode_key(parts) not in stored
    assert found_otherwise > 20  # the readings were exercised, not only exact keys


def test_store_predict_routes_keys_typed_otherwise_in_several_columns(tmp_path):
    """Trained on integer keys in 6 columns, asked with them as floats, text
    and numbers mixed per column: each row reaches its own model; groups never
    trained go to the fallback model."""
    from sklearn.linear_model import LinearRegression

    columns = [f"k{i}" for i in range(6)]
    rng = np.random.default_rng(2)
    keys = pd.DataFrame(rng.integers(0, 4, (12, 6)), columns=columns).drop_duplicates()
    frame = keys.loc[keys.index.repeat(3)].reset_index(drop=True)
    frame["x"] = np.tile([0.0, 1.0, 2.0], len(keys))
    slope = np.repeat(np.arange(1.0, len(keys) + 1), 3)
    frame["y"] = frame["x"] * slope

    def fit(df):
        return LinearRegression().fit(df[["x"]], df["y"])

    store = tmp_path / "s"
    run = mm.train(fit, mm.groups(frame, by=columns), store=store, backend="serial",
                   progress=False)
    opened = mm.Store(store)
    global_model = LinearRegression().fit(frame[["x"]], frame["x"] * 0 - 100.0)
    opened.attach(run.run_id, "fallback", global_model)
    asked = frame.astype({"k0": float, "k2": float}).astype({"k1": str, "k4": str})
    unseen = pd.DataFrame({c: [9] for c in columns}).astype(asked[columns].dtypes.to_dict())
    unseen["x"] = 1.0
    predicted = opened.predict(pd.concat([asked, unseen], ignore_index=True), by=columns,
                               features=["x"], with_source=True)
    assert predicted["source"].tolist() == ["group"] * len(frame) + ["fallback"]
    np.testing.assert_allclose(predicted["prediction"][:len(frame)], frame["y"], atol=1e-9)
    assert predicted["prediction"].iloc[-1] == pytest.approx(-100.0)


def test_a_key_without_a_model_is_not_looked_up_once_per_reading():
    """8 integer columns have 4**8 readings of a key: each was looked up in
    turn (20 unseen groups of 9 columns took 2.5 s); now the stored keys are
    indexed once, and an unseen key costs one look-up whatever its columns."""
    from manymodels.inputs.keys import encode_key, find_typed

    class Counting(dict):
        lookups = 0

        def get(self, key, default=None):
            Counting.lookups += 1
            return super().get(key, default)

        def __getitem__(self, key):
            Counting.lookups += 1
            return super().__getitem__(key)

    stored = Counting({encode_key(tuple(range(n, n + 8))): n for n in range(50)})
    assert find_typed(stored, tuple(range(100, 108))) is None  # unseen
    assert find_typed(stored, tuple(float(v) for v in range(3, 11))) == 3  # typed otherwise
    assert Counting.lookups <= 4


# -- 14: a tampered model stops Store.predict with StoreIntegrityError ---------------------


def _fit_line(df):
    from sklearn.linear_model import LinearRegression

    return LinearRegression().fit(df[["x"]], df["y"])


def _store_with_one_model_flipped(tmp_path):
    """A store of groups a, b, c of which one packed model has one byte flipped,
    and that model's key (found by loading each)."""
    frame = pd.DataFrame({"g": np.repeat(["a", "b", "c"], 3), "x": [0.0, 1, 2] * 3})
    frame["y"] = frame["x"] * np.repeat([1.0, 2, 3], 3)
    store = tmp_path / "s"
    mm.train(_fit_line, mm.groups(frame, by="g"), store=store, backend="serial",
             progress=False)
    with sqlite3.connect(store / "index.sqlite") as conn:
        pack, blob = conn.execute("SELECT pack_id, blob FROM packs ORDER BY pack_id "
                                  "LIMIT 1").fetchone()
        blob = bytearray(blob)
        blob[10] ^= 0xFF
        conn.execute("UPDATE packs SET blob = ? WHERE pack_id = ?", (bytes(blob), pack))
    conn.close()
    tampered = []
    for key in "abc":
        try:
            mm.Store(store).load(key)
        except mm.StoreIntegrityError:
            tampered.append(key)
    assert len(tampered) == 1
    return store, frame, tampered[0]


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_predict_with_a_tampered_model_raises_store_integrity_error_naming_the_key(
        tmp_path, backend):
    """It raised RuntimeError holding the integrity error's traceback as text
    (the error crossed the worker boundary as text)."""
    store, frame, key = _store_with_one_model_flipped(tmp_path)
    with pytest.raises(mm.StoreIntegrityError) as caught:
        mm.Store(store).predict(frame, by="g", features=["x"], backend=backend, workers=2)
    said = str(caught.value)
    assert said.startswith(f"predicting group '{key}': ")
    assert f"key '{key}'" in said and "SHA-256" in said and "Traceback" not in said
    others = frame[frame["g"] != key]
    untouched = mm.Store(store).predict(others, by="g", features=["x"])
    np.testing.assert_allclose(untouched, others["y"], atol=1e-9)


def test_cli_predict_with_a_tampered_model_says_so_in_one_line(tmp_path):
    store, frame, key = _store_with_one_model_flipped(tmp_path)
    data = tmp_path / "rows.csv"
    frame.to_csv(data, index=False)
    result = CliRunner().invoke(app, ["predict", str(store), str(data), "--by", "g", "-o",
                                      str(tmp_path / "out.csv")], env={"COLUMNS": "80"})
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    said = _said(result.output)
    assert f"Error: predicting group '{key}':" in said and "SHA-256" in said, said
    assert not (tmp_path / "out.csv").exists()


# -- 16: the summary says why workers were spawned, and CUDA only with a GPU ---------------

SPAWN_SCRIPT = """
import sys
{imports}
import manymodels as mm

def fit(item):
    return item

run = mm.train(fit, mm.items(range(4)), backend="processes", workers=2, progress=False)
print(run.summary())
"""


def _summary_after(imports: str) -> str:
    done = subprocess.run([sys.executable, "-c", SPAWN_SCRIPT.format(imports=imports)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_summary_says_an_imported_polars_made_the_workers_spawn():
    """Importing polars (statsmodels does, through formulaic) made every run
    spawn its workers, silently, and the summary blamed a CUDA context on a
    machine without a GPU."""
    summary = _summary_after("import polars")
    assert "spawned, not forked: polars is imported (it is not fork-safe)" in summary, summary
    assert "to start a worker, in parallel (interpreter, imports); not task time" in summary
    assert "CUDA" not in summary
    pytest.importorskip("mlflow")
    summary = _summary_after("import mlflow")  # which imports polars for its datasets
    assert "polars is imported (it is not fork-safe; mlflow imports it)" in summary, summary


def test_the_summary_of_forked_workers_gives_no_spawn_reason():
    summary = _summary_after("")
    assert "spawned" not in summary and "CUDA" not in summary, summary


def test_a_summary_mentions_a_cuda_context_only_for_workers_given_gpus():
    from manymodels.run.results import Summary

    def text(**given):
        return str(Summary(tasks=1, ok=1, failed=0, statuses={}, wall_s=3.0, task_time_s=1.0,
                           workers=2, backend="processes", utilization=0.2,
                           worker_start_s=1.5, **given))

    assert "(interpreter, imports, CUDA context)" in text(
        gpus=True, spawn_reason="tasks are given GPUs (CUDA does not survive a fork)")
    assert "CUDA" not in text(spawn_reason="memory_limit is set")
    assert "spawned, not forked: memory_limit is set" in text(spawn_reason="memory_limit is set")


def test_an_asked_for_spawn_says_so():
    run = mm.train(_fit_line, mm.groups(pd.DataFrame({"g": ["a"] * 3, "x": [0.0, 1, 2],
                                                      "y": [0.0, 1, 2]}), by="g"),
                   backend="processes", workers=1, start_method="spawn", progress=False)
    assert run.spawn_reason == "start_method='spawn' was asked for"
    assert "spawned, not forked: start_method='spawn' was asked for" in str(run.summary())


def _gpu_ids(item):
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def test_workers_given_gpus_are_spawned_for_them_and_the_summary_says_so(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    run = mm.train(_gpu_ids, mm.items(range(4)), gpus=[0, 1], gpus_per_task=1, workers=2,
                   progress=False)
    # (with "; polars is imported ..." after it where another test imported polars)
    assert run.spawn_reason.startswith("tasks are given GPUs (CUDA does not survive a fork)")
    summary = run.summary()
    assert summary.gpus and "spawned, not forked: tasks are given GPUs" in str(summary)
    assert "(interpreter, imports, CUDA context)" in str(summary)
