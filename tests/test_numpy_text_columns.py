"""format="numpy" gives text columns as Python strings however they are
made (a column of runs, a group's key, is made a string a run): the values a
fit sees equal pandas' row by row, nulls included."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa

import manymodels as mm
from manymodels.inputs.datareaders import _as_numpy


def _text_columns(rows):
    return [(name, list(rows[name])) for name in ("store", "note", "label")]


def test_text_columns_reach_fit_as_pandas_has_them():
    rng = np.random.default_rng(0)
    stores = np.repeat([f"store-{i:03d}" for i in range(40)], 30)
    frame = pd.DataFrame({
        "store": stores,
        "note": [f"n{i}" for i in range(len(stores))],  # every value its own
        "label": rng.choice(["a", "b", None], size=len(stores)),  # with nulls
        "y": rng.normal(size=len(stores))})
    run = mm.train(_text_columns, mm.groups(frame, by="store", format="numpy"), workers=2,
                   progress=False)
    for store, rows in frame.groupby("store"):
        got = dict(run.models[store])
        assert got["store"] == [store] * 30
        assert got["note"] == rows["note"].tolist()
        assert got["label"] == [None if v is None or v != v else v for v in rows["label"]]


def test_a_column_of_runs_converts_to_the_same_strings_row_by_row():
    runs = pa.chunked_array([pa.array(["x"] * 20 + ["y"] * 5 + ["x"] * 30, pa.large_string())])
    mixed = pa.chunked_array([pa.array(["a"] * 17 + [f"u{i}" for i in range(100)])])
    for column in (runs, mixed):
        made = _as_numpy(column)
        assert made.dtype == object and made.tolist() == column.to_pylist()
