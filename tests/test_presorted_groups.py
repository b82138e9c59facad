"""A table already sorted by its key (and by order_by within each group) is
laid out from where the key changes, without sorting it again; the groups,
their rows and their order are those that sorting gives."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import manymodels as mm
from manymodels.inputs.tables import presorted_group_lengths
from manymodels.planning.plan import group_layout


def series(keys: list, days: int = 6) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    return pd.DataFrame({
        "unique_id": np.repeat(keys, days),
        "ds": np.tile(pd.date_range("2024-01-01", periods=days), len(keys)),
        "y": rng.normal(size=len(keys) * days)})


@pytest.mark.parametrize("keys", [["a", "b", "c", "z", "é"], [3, 7, 10, 200, 1000]])
def test_a_presorted_table_has_the_groups_and_rows_that_sorting_gives(keys):
    ordered = series(keys)
    shuffled = ordered.sample(frac=1.0, random_state=1).reset_index(drop=True)
    table = pa.Table.from_pandas(ordered, preserve_index=False)
    assert presorted_group_lengths(table, ["unique_id"], ["ds"]).tolist() == [6] * 5
    assert presorted_group_lengths(pa.Table.from_pandas(shuffled, preserve_index=False),
                                   ["unique_id"], ["ds"]) is None
    fast = group_layout(mm.groups(ordered, by="unique_id", order_by="ds"))
    slow = group_layout(mm.groups(shuffled, by="unique_id", order_by="ds"))
    assert fast.lengths.tolist() == slow.lengths.tolist()
    assert fast.offsets.tolist() == slow.offsets.tolist()
    assert fast.table.to_pandas().equals(slow.table.to_pandas())
    assert fast.key_table.equals(slow.key_table)


def test_rows_out_of_time_order_within_a_group_are_sorted_not_taken_as_they_are():
    frame = series(["a", "b"])
    frame.loc[[1, 2], "ds"] = frame.loc[[2, 1], "ds"].to_numpy()  # two days swapped in "a"
    table = pa.Table.from_pandas(frame, preserve_index=False)
    assert presorted_group_lengths(table, ["unique_id"], ["ds"]) is None
    assert presorted_group_lengths(table, ["unique_id"]).tolist() == [6, 6]  # keys in order
    layout = group_layout(mm.groups(frame, by="unique_id", order_by="ds"))
    days = layout.table.column("ds").to_pandas()
    assert days.iloc[:6].is_monotonic_increasing and days.iloc[6:].is_monotonic_increasing


def test_ties_in_time_keep_their_rows_order_and_a_null_or_nan_is_sorted_the_usual_way():
    frame = pd.DataFrame({"unique_id": ["a"] * 4 + ["b"] * 2, "ds": [1, 1, 2, 2, 1, 2],
                          "y": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]})
    table = pa.Table.from_pandas(frame, preserve_index=False)
    assert presorted_group_lengths(table, ["unique_id"], ["ds"]).tolist() == [4, 2]
    run = mm.train(lambda df: df["y"].tolist(), mm.groups(frame, by="unique_id", order_by="ds"),
                   backend="serial", progress=False)
    assert run.models["a"] == [0.0, 1.0, 2.0, 3.0]
    with_nan = table.set_column(1, "ds", pa.array([1.0, float("nan"), 2.0, 3.0, 1.0, 2.0]))
    assert presorted_group_lengths(with_nan, ["unique_id"], ["ds"]) is None
    with_null = table.set_column(0, "unique_id", pa.array(["a", None, "a", "a", "b", "b"]))
    assert presorted_group_lengths(with_null, ["unique_id"], ["ds"]) is None
