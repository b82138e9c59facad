"""An unchanged re-run knows its input by one digest (identity/inputdigest):
it names the earlier run without hashing a row, and any change to what the
identities are made from takes the long way, retraining exactly what it did."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import manymodels as mm
from manymodels.identity.inputdigest import add_table, new_digest
from manymodels.planning.taskdata import TableSlices


def _digest(table: pa.Table) -> str | None:
    digest = new_digest()
    return digest.hexdigest() if add_table(digest, table) else None


def _frame(groups: int = 30) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    return pd.DataFrame({"g": np.repeat(np.arange(groups), 4),
                         "name": np.repeat([f"s{i}" for i in range(groups)], 4),
                         "x": rng.normal(size=4 * groups), "y": rng.normal(size=4 * groups)})


def _fit(rows, k=0):
    return float(rows["y"].mean()), {"n": len(rows)}


@pytest.fixture
def row_hashes(monkeypatch):
    """How many times a run hashed its table's rows (made its identities)."""
    calls = []
    hash_lanes = TableSlices.hash_lanes

    def counted(self, refs):
        calls.append(len(refs))
        return hash_lanes(self, refs)

    monkeypatch.setattr(TableSlices, "hash_lanes", counted)
    return calls


def _train(frame, store, fit=_fit, **kwargs):
    return mm.train(fit, mm.groups(frame, by="g"), store=store, backend="threads",
                    workers=2, progress=False, **kwargs)


def _fit_checkpointed(rows, checkpoint=None):
    return _fit(rows)


@pytest.mark.parametrize("variant", ["plain", "a column of nulls", "a checkpointed fit"])
def test_an_unchanged_rerun_names_the_earlier_run_without_hashing_a_row(tmp_path, row_hashes,
                                                                        variant):
    frame = _frame()
    if variant == "a column of nulls":  # Arrow's null type: no buffers (a TypeError was raised)
        frame["note"] = None
    fit = _fit_checkpointed if variant == "a checkpointed fit" else _fit
    first = _train(frame, tmp_path, fit=fit)
    assert row_hashes == [30]
    # (a checkpointed fit's slots were named by the identities: made for no task to run)
    again = _train(frame, tmp_path, fit=fit)
    assert row_hashes == [30]  # not hashed again
    assert again.summary().reused == 30
    pd.testing.assert_frame_equal(again.results[["g", "n"]],
                                  first.results[["g", "n"]])
    assert again.models[7] == first.models[7]
    # what the long way names: the same
    assert (mm.Store(tmp_path).results(run=again.run_id)["reused_from"] == first.run_id).all()


@pytest.mark.parametrize("change", ["value", "row order", "new group", "column type",
                                    "code", "shared"])
def test_any_change_takes_the_long_way_and_retrains_what_changed(tmp_path, row_hashes, change):
    frame = _frame()
    _train(frame, tmp_path, shared={"k": 1})
    changed, shared, retrained = frame.copy(), {"k": 1}, 1
    if change == "value":
        changed.loc[9, "y"] += 1.0  # group 2
    elif change == "row order":
        changed.iloc[[8, 9]] = changed.iloc[[9, 8]].to_numpy()  # within group 2
    elif change == "new group":
        changed = pd.concat([changed, changed.tail(4).assign(g=99)], ignore_index=True)
    elif change == "column type":
        changed["x"] = changed["x"].astype("float32")
        retrained = 30
    elif change == "shared":
        shared, retrained = {"k": 2}, 30
    run = (mm.train(lambda rows, k=0: (float(rows["y"].mean()) + 0, {"n": len(rows)}),
                    mm.groups(changed, by="g"), store=tmp_path, backend="threads", workers=2,
                    progress=False, shared=shared) if change == "code"
           else _train(changed, tmp_path, shared=shared))
    if change == "code":
        retrained = 30
    assert len(row_hashes) == 2  # the long way
    assert run.summary().tasks - run.summary().reused == retrained


def test_a_later_run_of_other_input_is_not_skipped_over(tmp_path, row_hashes):
    """Only the latest run that trained anything is named by its digest:
    a run of the same input before it is not (the long way finds the
    latest model of each identity, as it always has)."""
    frame = _frame()
    _train(frame, tmp_path)
    changed = frame.copy()
    changed.loc[0, "y"] += 1.0  # group 0 retrained: the latest run that trained
    _train(changed, tmp_path)
    again = _train(frame, tmp_path)  # run 1's input: group 0 from run 1, by the long way
    assert len(row_hashes) == 3
    assert again.summary().reused == 30


@pytest.mark.parametrize("kind", ["int", "float with null", "bool", "text",
                                  "timestamp tz", "decimal"])
def test_equal_values_digest_alike_and_any_difference_apart(kind):
    values = {
        "int": ([1, 2, 3, 4], pa.int64()),
        "float with null": ([1.5, None, 3.0, 4.0], pa.float64()),
        "bool": ([True, False, None, True, False, True, True, False, True, None],
                        pa.bool_()),
        "text": (["a", "bb", None, "", "ccc", "d"], pa.string()),
        "timestamp tz": ([0, 10**9, None, 3], pa.timestamp("ns", tz="UTC")),
        "decimal": ([1, 2, None, 4], pa.decimal128(10, 2)),
    }[kind]
    array = pa.array(*values)
    for start in (1, 2, 3, 8):  # a slice: no digest (nulls off a byte's start), or its values'
        sliced = _digest(pa.table({"c": array.slice(start)}))
        fresh = _digest(pa.table({"c": pa.array(array.slice(start).to_pylist(), array.type)}))
        assert sliced is None or sliced == fresh
    base = _digest(pa.table({"c": array}))
    assert base is not None
    assert _digest(pa.table({"c": pa.array(array.to_pylist(), array.type)})) == base
    assert _digest(pa.table({"d": array})) != base  # the name
    changed = array.to_pylist()
    changed[-1] = changed[0] if changed[-1] != changed[0] else changed[1]
    assert _digest(pa.table({"c": pa.array(changed, array.type)})) != base
    nulled = [None] + array.to_pylist()[1:]
    if nulled != array.to_pylist():
        assert _digest(pa.table({"c": pa.array(nulled, array.type)})) != base


def test_columns_whose_bytes_cannot_vouch_for_their_values_have_no_digest():
    assert _digest(pa.table({"c": pa.array(["a", "b", "a"]).dictionary_encode()})) is None
    assert _digest(pa.table({"c": pa.array([[1], [2, 3]])})) is None


def test_columns_of_missing_values_alone_digest_by_their_type_and_length():
    """A CSV column with no value (Arrow's null type) or an int column of
    nulls (no value buffer) digests, alike for alike and apart otherwise."""
    for column in (pa.nulls(3), pa.array([None, None, None], pa.int64())):
        assert _digest(pa.table({"c": column})) == _digest(pa.table({"c": column.slice(0)}))
        assert _digest(pa.table({"c": column})) != _digest(pa.table({"c": column.slice(1)}))
    assert _digest(pa.table({"c": pa.nulls(3)})) != _digest(
        pa.table({"c": pa.array([None, None, None], pa.int64())}))


def test_a_rerun_after_one_that_named_an_earlier_run_whole_is_fast_too(tmp_path, row_hashes):
    """Runs 3 and 4 go back to run 1's shared object after run 2 trained
    another: run 3 finds run 1 by the long way and names it whole; run 4,
    of run 3's digest, names run 1 without hashing a row. So does the
    second re-run of a store whose runs recorded no digest (made before)."""
    import json
    import sqlite3

    frame = _frame()
    first = _train(frame, tmp_path, shared={"k": 1})
    _train(frame, tmp_path, shared={"k": 2})
    third = _train(frame, tmp_path, shared={"k": 1})
    assert len(row_hashes) == 3 and third.summary().reused == 30
    fourth = _train(frame, tmp_path, shared={"k": 1})
    assert len(row_hashes) == 3 and fourth.summary().reused == 30
    assert (mm.Store(tmp_path).results(run=fourth.run_id)["reused_from"] == first.run_id).all()

    older = tmp_path / "older"
    _train(frame, older)
    with sqlite3.connect(older / "index.sqlite") as conn:  # as a store made before digests
        detail = json.loads(conn.execute("SELECT code_detail FROM runs").fetchone()[0])
        del detail["input_digest"]
        conn.execute("UPDATE runs SET code_detail = ?", (json.dumps(detail),))
    row_hashes.clear()
    _train(frame, older)
    assert len(row_hashes) == 1  # the long way, once
    assert _train(frame, older).summary().reused == 30 and len(row_hashes) == 1


class _Setting:
    """A grid value whose key text (its default repr, with its address)
    differs between equal copies, which hash alike."""

    def __init__(self, a):
        self.a = a


def _fit_setting(rows, setting):
    return float(rows["y"].mean()) * setting.a, {"n": len(rows)}


def test_a_rerun_whose_grid_values_key_apart_stores_its_own_keys(tmp_path, row_hashes):
    """The digest covers the grid values' key text, not their hashes alone:
    a re-run with an equal copy of an object (hashed alike, its text apart)
    named the first run, whose rows hold the first object's key, where the
    long way copies them under this run's keys."""
    def run():
        source = mm.groups(_frame(3), by="g") * mm.grid(setting=[_Setting(1)])
        return mm.train(_fit_setting, source, store=tmp_path, backend="serial",
                        progress=False)

    run()
    again = run()
    assert again.summary().reused == 3 and len(row_hashes) == 2  # the long way
    stored = mm.Store(tmp_path).results(run=again.run_id)["setting"]
    assert list(stored) == [repr(value) for value in again.results["setting"]]


def test_a_run_that_trained_while_the_namer_searched_is_not_skipped(tmp_path, monkeypatch):
    """Run 4 named run 1 whole, but run 3 trained the same input between
    run 4's search and its start (another driver): a re-run names run 3,
    as the long way does, not run 1."""
    from manymodels.store.reuse import ReuseSearch

    frame, find = _frame(3), ReuseSearch.find
    _train(frame, tmp_path, shared={"k": 1})
    _train(frame, tmp_path, shared={"k": 2})
    meanwhile = []

    def find_then_train(self):
        found = find(self)
        if not meanwhile:  # once: the run that trains meanwhile searches as always
            meanwhile.append(_train(frame, tmp_path, shared={"k": 1}, reuse=False))
        return found

    monkeypatch.setattr(ReuseSearch, "find", find_then_train)
    namer = _train(frame, tmp_path, shared={"k": 1})
    monkeypatch.setattr(ReuseSearch, "find", find)
    assert (namer.run_id, meanwhile[0].run_id) == (4, 3)
    again = _train(frame, tmp_path, shared={"k": 1})
    assert set(mm.Store(tmp_path).results(run=again.run_id)["reused_from"]) == {3}
