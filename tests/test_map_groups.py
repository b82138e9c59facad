from __future__ import annotations

import pandas as pd
import pytest

import manymodels as mm
from conftest import BACKENDS


def standardize(df):
    return df.assign(z=(df["x"] - df["x"].mean()) / df["x"].std(), rank=df["y"].rank())


def summarize(df):
    return pd.DataFrame({"mean_x": [df["x"].mean()], "rows": [len(df)]})


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_groups_equals_pandas_groupby_apply(backend, sales):
    ours = mm.map_groups(standardize, mm.groups(sales, by="store"), backend=backend)
    theirs = (sales.groupby("store", group_keys=False)[list(sales.columns)]
              .apply(standardize).sort_values("store", kind="stable").reset_index(drop=True))
    pd.testing.assert_frame_equal(ours, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
def test_map_groups_adds_missing_key_columns(backend, sales):
    ours = mm.map_groups(summarize, mm.groups(sales, by=["store", "item"]), backend=backend)
    assert list(ours.columns) == ["store", "item", "mean_x", "rows"]
    expected = sales.groupby(["store", "item"])["x"].mean().reset_index(drop=True)
    pd.testing.assert_series_equal(ours["mean_x"], expected, check_names=False)
    assert (ours["rows"] == 30).all()


def test_map_groups_names_the_failing_group(sales):
    def boom(df):
        if df["store"].iloc[0] == "s04":
            raise KeyError("no such column")
        return df

    expected = r"the first, 's04', with:(.|\n)*KeyError: 'no such column'"
    with pytest.raises(RuntimeError, match=expected):
        mm.map_groups(boom, mm.groups(sales, by="store"), backend="threads")
    kept = mm.map_groups(boom, mm.groups(sales, by="store"), backend="threads",
                         errors="skip")
    assert "s04" not in set(kept["store"]) and len(kept) == len(sales) - 150
