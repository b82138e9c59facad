"""map_groups and map_partitions under outputs a hostile tester chose: Series
whose labels differ by group, polars columns whose types have no common one,
and runs in which every group or partition failed."""

from __future__ import annotations

import numpy as np
import pandas as pd

import manymodels as mm

SERIAL = {"backend": "serial", "progress": False}


def counts(rows: pd.DataFrame) -> pd.Series:
    return rows["c"].value_counts()


def test_series_whose_labels_differ_by_group_keep_their_groups_key():
    """Concatenated bare, x, y, x, z would not say which group a row is of:
    the key comes first in a MultiIndex, as pandas' groupby().apply puts it."""
    frame = pd.DataFrame({"g": ["a", "a", "b", "b", "b"], "c": ["x", "y", "x", "x", "z"]})
    ours = mm.map_groups(counts, mm.groups(frame, by="g"), **SERIAL)
    pd.testing.assert_series_equal(ours, frame.groupby("g")[["c"]].apply(counts))
    assert ours.loc[("b", "x")] == 2

    two = frame.assign(h=[1, 1, 1, 2, 2])  # several key columns: one level each
    ours = mm.map_groups(counts, mm.groups(two, by=["g", "h"]), **SERIAL)
    theirs = two.groupby(["g", "h"])[["c"]].apply(counts)
    pd.testing.assert_series_equal(ours, theirs, check_index_type=False)
    assert list(ours.index.names) == ["g", "h", "c"]


def test_series_of_the_same_labels_in_another_order_are_aligned_by_label():
    """The same labels in another order are the same labels: one row per
    group, each value under its own label, not a Series of labels repeated."""
    frame = pd.DataFrame({"g": ["a", "a", "a", "b", "b", "b"],
                          "c": ["x", "x", "y", "x", "y", "y"]})
    ours = mm.map_groups(counts, mm.groups(frame, by="g"), **SERIAL)
    expected = pd.DataFrame({"g": ["a", "b"], "x": [2, 1], "y": [1, 2]})
    expected.columns.name = "c"  # the labels' name, as pandas names them
    pd.testing.assert_frame_equal(ours, expected, check_dtype=False)

    def stats(rows: pd.DataFrame) -> pd.Series:  # a dict's order, by group
        n, total = len(rows), float(rows["v"].sum())
        return pd.Series({"n": n, "sum": total} if rows["g"].iloc[0] == "a"
                         else {"sum": total, "n": n})

    ours = mm.map_groups(stats, mm.groups(frame.assign(v=np.arange(6.0)), by="g"), **SERIAL)
    assert list(ours.columns) == ["g", "n", "sum"]
    assert ours["sum"].tolist() == [3.0, 12.0] and ours["n"].tolist() == [3, 3]
