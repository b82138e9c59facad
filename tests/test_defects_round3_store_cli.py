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

from manymodels.cli import app


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
