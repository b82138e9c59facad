"""mm.linear(store=...): one artifact per result, per-group identities, re-runs
that fit only what changed (issue 21), on a real SQLite store and real files."""

from __future__ import annotations

import sqlite3
import warnings

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from test_linear import FEATURES, sales

BY = ["store", "item"]


def fit(frame, store, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning unless a test expects one
        return mm.linear(frame, by=BY, features=FEATURES, target="y", store=store, **kwargs)


def same(a: mm.LinearResult, b: mm.LinearResult, exact: bool = True) -> None:
    """Equal coefficients and metrics (whatever each group's origin)."""
    if exact:
        pd.testing.assert_frame_equal(a.coefficients, b.coefficients)
    else:
        pd.testing.assert_frame_equal(a.coefficients, b.coefficients, check_exact=False,
                                      rtol=1e-12, atol=1e-12)
    columns = [c for c in a.metrics.columns if c != "reused_from"]
    pd.testing.assert_frame_equal(a.metrics[columns], b.metrics[columns], check_exact=exact,
                                  **({} if exact else {"rtol": 1e-12, "atol": 1e-12}))


def group_mask(frame: pd.DataFrame, key: tuple) -> pd.Series:
    return (frame["store"] == key[0]) & (frame["item"] == key[1])


def artifacts(path) -> list[str]:
    with sqlite3.connect(path / "index.sqlite") as conn:
        return [a for (a,) in conn.execute("SELECT artifact FROM attachments ORDER BY run_id")]


def test_first_run_fits_all_an_unchanged_rerun_fits_none(tmp_path):
    frame = sales(150)
    first = fit(frame, tmp_path)
    assert (first.fitted, first.reused, first.run_id) == (len(first), 0, 1)
    assert first.metrics["reused_from"].isna().all()
    again = fit(frame, tmp_path)
    assert (again.fitted, again.reused, again.run_id) == (0, len(first), 2)
    assert (again.metrics["reused_from"] == 1).all()
    same(first, again)
    same(first, mm.linear(frame, by=BY, features=FEATURES, target="y"))  # as with no store
    assert again.why_not_reused(("s3", 3)) == "('s3', 3) was reused from run 1"
    # the same rows in another table order: the groups are the same, all reused
    reordered = frame.sort_values(BY, ascending=False, kind="stable")
    assert fit(reordered, tmp_path).reused == len(first)
    runs = mm.Store(tmp_path).runs()
    assert runs["status"].tolist() == ["finished"] * 3
    assert runs["reused"].tolist() == [0, len(first), len(first)]
    assert runs["tasks"].tolist() == [len(first)] * 3
    assert runs["fit"].iloc[0] == "mm.linear(ols) y"
    assert len(set(artifacts(tmp_path))) == 1  # an unchanged result is stored once


@pytest.mark.parametrize("layout", ["shuffled", "sorted-int-keys"])
def test_a_changed_group_is_refitted_alone_and_equals_a_fresh_fit(tmp_path, layout):
    frame = sales(120)
    by = BY
    if layout == "sorted-int-keys":  # the layout read without hashing the keys
        frame = frame.sort_values(BY, kind="stable").reset_index(drop=True)
        frame["g"] = frame.groupby(BY, sort=True).ngroup()
        by = ["g"]
    run = mm.linear(frame, by=by, features=FEATURES, target="y", store=tmp_path)
    changed = frame.copy()
    row = changed.index[group_mask(changed, ("s2", 9))][0]
    changed.loc[row, "y"] += 0.5
    key = ("s2", 9) if by == BY else int(frame.loc[row, "g"])
    rerun = mm.linear(changed, by=by, features=FEATURES, target="y", store=tmp_path)
    assert (rerun.fitted, rerun.reused) == (1, len(run) - 1)
    refitted = rerun.metrics[rerun.metrics["reused_from"].isna()]
    assert refitted[by].iloc[0].tolist() == list(key if by == BY else [key])
    assert "its rows changed since run 1" in rerun.why_not_reused(key)
    same(rerun, mm.linear(changed, by=by, features=FEATURES, target="y"), exact=False)
    where = rerun._key_index().get_indexer([key])[0]
    assert not np.allclose(rerun.coef[where], run.coef[where])


def test_groups_added_and_removed(tmp_path):
    frame = sales(100)
    first = fit(frame, tmp_path)
    dropped = frame[~group_mask(frame, ("s0", 0))]
    added = frame[group_mask(frame, ("s1", 1))].assign(item=999)
    changed = pd.concat([dropped, added], ignore_index=True)
    rerun = fit(changed, tmp_path)
    assert len(rerun) == len(first)  # one gone, one new
    assert (rerun.fitted, rerun.reused) == (1, len(first) - 1)
    assert ("s0", 0) not in set(map(tuple, rerun.keys.to_numpy().tolist()))
    assert rerun.why_not_reused(("s1", 999)) == "('s1', 999) was fitted: run 1 had no group " \
        "('s1', 999)"
    same(rerun, mm.linear(changed, by=BY, features=FEATURES, target="y"), exact=False)
    loaded = mm.Store(tmp_path).linear("y")
    assert len(loaded) == len(rerun) and loaded.run_id == 2
    same(loaded, rerun)


def test_an_option_change_refits_every_group_and_going_back_reuses(tmp_path):
    frame = sales(80)
    ridge = fit(frame, tmp_path, family="ridge", alpha=1.0)
    stronger = fit(frame, tmp_path, family="ridge", alpha=2.0)
    assert stronger.reused == 0
    assert "alpha (1.0 -> 2.0) changed" in stronger.why_not_reused(("s1", 1))
    back = fit(frame, tmp_path, family="ridge", alpha=1.0)  # run 1's result, by its options
    assert back.reused == len(ridge) and (back.metrics["reused_from"] == 1).all()
    same(back, ridge)
    assert fit(frame, tmp_path, family="ols").reused == 0
    assert fit(frame, tmp_path, family="ols", weights="w").reused == 0  # weighted: refitted
    assert fit(frame, tmp_path, family="ols", fit_intercept=False).reused == 0
    assert fit(frame, tmp_path, family="wls", weights="w").reused == 0
    # a per-group alpha column: a new alpha for one group refits that group alone
    column = fit(frame, tmp_path, family="ridge", alpha="alpha")
    changed = frame.copy()
    changed.loc[group_mask(changed, ("s4", 4)), "alpha"] = 7.0
    rerun = fit(changed, tmp_path, family="ridge", alpha="alpha")
    assert (rerun.fitted, rerun.reused) == (1, len(column) - 1)
    same(rerun, mm.linear(changed, by=BY, features=FEATURES, target="y", family="ridge",
                          alpha="alpha"), exact=False)


@pytest.mark.parametrize("where", ["file", "index"])
def test_a_tampered_artifact_is_refused_by_name_and_refitted(tmp_path, where):
    groups = 20_000 if where == "file" else 50  # 1 MiB or more: a file of its own
    frame = sales(groups, max_rows=6)
    first = fit(frame, tmp_path)
    (digest,) = artifacts(tmp_path)
    files = list((tmp_path / "artifacts").rglob(digest))
    assert len(files) == (1 if where == "file" else 0)
    if where == "file":
        data = bytearray(files[0].read_bytes())
        data[len(data) // 2] ^= 0xFF
        files[0].write_bytes(bytes(data))
    else:
        with sqlite3.connect(tmp_path / "index.sqlite") as conn:
            blob = bytearray(conn.execute("SELECT blob FROM artifacts WHERE sha256 = ?",
                                          (digest,)).fetchone()[0])
            blob[len(blob) // 2] ^= 0xFF
            conn.execute("UPDATE artifacts SET blob = ? WHERE sha256 = ?", (bytes(blob), digest))
    with pytest.raises(mm.StoreIntegrityError, match="mm.linear result 'y' of run 1"):
        mm.Store(tmp_path).linear("y")
    with pytest.warns(RuntimeWarning, match="does not match its recorded SHA-256.*fitted again"):
        refit = mm.linear(frame, by=BY, features=FEATURES, target="y", store=tmp_path)
    assert (refit.fitted, refit.reused) == (len(first), 0)
    assert "was refused" in refit.why_not_reused(tuple(first.keys.iloc[0]))
    same(refit, first)
    loaded = mm.Store(tmp_path).linear("y")  # the refit wrote the artifact afresh
    assert loaded.run_id == 2
    same(loaded, first)


def test_the_loaded_result_predicts_as_the_one_in_memory(tmp_path):
    frame = sales(90, seed=3)
    fitted = mm.linear(frame, by=BY, features=FEATURES, target="y", store=str(tmp_path),
                       name="sales-ols")
    logistic = mm.linear(frame, by=BY, features=FEATURES, target="label", family="logistic",
                         store=mm.Store(tmp_path))
    store = mm.Store(tmp_path)
    for name, result in (("sales-ols", fitted), ("label", logistic)):
        loaded = store.linear(name)
        assert loaded.family == result.family and loaded.features == FEATURES
        same(loaded, result)
        np.testing.assert_array_equal(loaded.predict(frame), result.predict(frame))
        assert loaded.metrics["status"].dtype == result.metrics["status"].dtype
    np.testing.assert_array_equal(store.linear("label").predict_proba(frame),
                                  logistic.predict_proba(frame))
    assert store.linear().run_id == 2  # the latest of any name
    assert store.linear(run=1).family == "ols"
    with pytest.raises(ValueError, match=r"no mm.linear result named 'sales'.*'label', "
                                         r"'sales-ols'"):
        store.linear("sales")
    assert store.gc() == 0  # the saved results are referenced: nothing is removed
    same(store.linear("sales-ols"), fitted)


def test_a_bad_store_is_refused_before_any_work(tmp_path):
    frame = sales(10)
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(mm.StoreError, match="is a file"):
        mm.linear(frame, by=BY, features=FEATURES, target="y", store=afile)
    with pytest.raises(TypeError, match="store= must be a path or a manymodels.Store"):
        mm.linear(frame, by=BY, features=FEATURES, target="y", store=3)
    with pytest.raises(TypeError, match="name= must be a non-empty string"):
        mm.linear(frame, by=BY, features=FEATURES, target="y", store=tmp_path, name="")
    mm.linear(frame, by=BY, features=FEATURES, target="y", store=tmp_path)
    with pytest.raises(mm.StoreError, match="reading only"):
        mm.linear(frame, by=BY, features=FEATURES, target="y",
                  store=mm.Store(tmp_path, read_only=True))
    with pytest.raises(ValueError, match="feature column 'nope'"):
        mm.linear(frame, by=BY, features=["nope"], target="y", store=tmp_path)
    assert mm.Store(tmp_path).runs()["status"].tolist() == ["finished"]  # no half-run


@pytest.mark.parametrize("refused", [{"features": ["nope"]}, {"family": "bogus"},
                                     {"features": ["bad"]}])
@pytest.mark.parametrize("folder_there", [False, True])
def test_a_refused_input_leaves_no_new_store_behind(tmp_path, refused, folder_there):
    """A new store was made (index.sqlite, artifacts/) before the input was
    checked, and stayed, empty, when it was refused. It is made only once
    the input passes; a folder that was there stays, with nothing added."""
    frame = pd.DataFrame({"k": ["a", "a"], "x": [1.0, 2.0], "bad": [1.0, np.nan],
                          "y": [1.0, 2.0]})
    where = tmp_path / "new" / "store"
    if folder_there:
        where.mkdir(parents=True)
    asked = {"features": ["x"], **refused}
    with pytest.raises(ValueError):
        mm.linear(frame, by="k", target="y", store=where, **asked)
    assert (list(where.iterdir()) == []) if folder_there else not (tmp_path / "new").exists()
    mm.linear(frame, by="k", features=["x"], target="y", store=where)
    assert mm.Store(where).runs()["status"].tolist() == ["finished"]


def test_load_and_models_of_a_linear_run_point_to_its_result(tmp_path):
    """results() listed the group ok, but load said the run had no task with
    its key and models() was empty: the run keeps one result, no model per
    group. Both now say so and name Store.linear, which loads it."""
    frame = pd.DataFrame({"k": ["s1"] * 3, "x": [0.0, 1, 2], "y": [0.0, 1, 2]})
    mm.linear(frame, by="k", features=["x"], target="y", store=tmp_path, name="sales")
    store = mm.Store(tmp_path)
    assert store.results()["status"].tolist() == ["ok"]
    for asked in (lambda: store.load("s1"), lambda: store.models(run=1)):
        with pytest.raises(ValueError, match=r"mm.linear run.*Store.linear\('sales', run=1\)"):
            asked()
    assert store.linear("sales", run=1).predict(frame) == pytest.approx([0.0, 1, 2])
    for name, run in ((5, None), ("sales", "1"), ("sales", 1.7), ("sales", True)):
        with pytest.raises(TypeError, match="name= must be|run must be a run id"):
            store.linear(name, run=run)  # read as run 1, or failed naming nothing


def test_identities_do_not_depend_on_chunks_or_where_the_rows_sit(monkeypatch):
    from manymodels.models.linear import identities
    from manymodels.models.linear.prepare import check, prepare

    def hashed(table):
        arrow, by, features = check(table, BY, FEATURES, "y", "ols", None, 0.0)
        data = prepare(arrow, by, features, "y", None, 0.0, "ols")
        return data, identities.group_identities(data, "0" * 32)

    shuffled = sales(60)
    in_order = shuffled.sort_values(BY, kind="stable")  # each group's rows keep their order
    data, whole = hashed(shuffled)
    sorted_data, sorted_whole = hashed(in_order)
    assert data.order is not None and sorted_data.order is None
    np.testing.assert_array_equal(sorted_whole, whole)
    monkeypatch.setattr(identities, "CHUNK", 7)  # groups span chunks
    np.testing.assert_array_equal(hashed(shuffled)[1], whole)
    np.testing.assert_array_equal(hashed(in_order)[1], whole)
    assert len(set(whole.tolist())) == len(whole)  # distinct groups, distinct identities
    swapped = shuffled.copy()  # two rows of a group trade places: a new identity
    rows = swapped.index[group_mask(swapped, ("s1", 1))][:2]
    swapped.loc[rows[0], FEATURES + ["y"]], swapped.loc[rows[1], FEATURES + ["y"]] = (
        shuffled.loc[rows[1], FEATURES + ["y"]].to_numpy(),
        shuffled.loc[rows[0], FEATURES + ["y"]].to_numpy())
    assert (hashed(swapped)[1] != whole).sum() == 1


def test_the_store_shows_and_explains_a_linear_run(tmp_path):
    frame = sales(40)
    fit(frame, tmp_path)
    changed = frame.copy()
    changed.loc[changed.index[group_mask(changed, ("s2", 2))][0], "y"] += 1.0
    rerun = fit(changed, tmp_path)
    store = mm.Store(tmp_path)
    results = store.results()
    assert results.columns[:3].tolist() == ["store", "item", "run_id"]
    assert len(results) == len(rerun) and (results["run_id"] == 2).all()
    assert results["status"].tolist() == rerun.metrics["status"].astype(str).tolist()
    np.testing.assert_array_equal(results["r2"], rerun.metrics["r2"])
    assert results["reused_from"].isna().sum() == 1
    assert store.why_not_reused(("s2", 2)) == "('s2', 2) was fitted: its rows changed since run 1"
    assert store.why_not_reused(("s1", 1)) == "('s1', 1) was reused from run 1"
    assert "no earlier mm.linear result named 'y'" in store.why_not_reused(("s1", 1), run=1)
    fit(changed, tmp_path, fit_intercept=False)
    assert "fit_intercept (True -> False) changed" in store.why_not_reused(("s1", 1))
    with pytest.raises(KeyError, match="no group"):
        store.why_not_reused(("s9", 99))


def test_store_predict_uses_the_saved_linear_result(tmp_path):
    frame = sales(30, seed=5)
    fitted = fit(frame, tmp_path)
    store = mm.Store(tmp_path)
    predicted = store.predict(frame)
    np.testing.assert_array_equal(predicted.to_numpy(), fitted.predict(frame))
    assert predicted.index.equals(frame.index)
    unseen = frame.head(3).assign(item=-1)
    with pytest.warns(RuntimeWarning, match=r"3 row\(s\) of 2 group\(s\) have no model .* 2 "
                      r"were never trained, their keys in no task of the run \(e.g. \[\("):
        sourced = store.predict(pd.concat([frame.head(2), unseen]), with_source=True)
    assert sourced["source"].tolist() == ["group"] * 2 + ["none"] * 3
    assert sourced["prediction"].iloc[2:].isna().all()


def test_store_predict_finds_integer_keys_past_2_53_beside_a_missing_one(tmp_path):
    """An Arrow (polars) table to predict, int keys with a null: Store.predict
    read them as floats, and the row of key 2**53 + 1 was predicted by the
    model of 2**53. It reads them as Int64, as the mm.train path does."""
    import pyarrow as pa

    big = 2**53
    frame = pd.DataFrame({"k": pd.array([big] * 3 + [big + 1] * 3, dtype="Int64"),
                          "x": [0.0, 1, 2] * 2, "y": [0.0, 1, 2, 0, 5, 10]})
    mm.linear(frame, by="k", features=["x"], target="y", store=tmp_path)
    new = pa.table({"k": pa.array([big + 1, big, None], pa.int64()), "x": [1.0, 1.0, 1.0]})
    with pytest.warns(RuntimeWarning, match="1 row"):
        predicted = mm.Store(tmp_path).predict(new)
    assert predicted.iloc[:2].tolist() == pytest.approx([5.0, 1.0])
    assert np.isnan(predicted.iloc[2])


@pytest.mark.parametrize("keys, asked", [([1, 2], ["1", "2"]), ([1, 2], [1.0, 2.0]),
                                         ([1, 2], [True, True]), (["1", "2"], [1, 2])])
def test_a_whole_number_key_finds_its_linear_model_however_it_is_typed(tmp_path, keys, asked):
    """As the store finds an mm.train model: "1" found the model of 1 there,
    but an mm.linear run said no row had a model (and LinearResult.predict
    gave NaN). The linear result looks keys up the same way now."""
    frame = pd.DataFrame({"k": np.repeat(keys, 3), "x": [0.0, 1, 2] * 2,
                          "y": [0.0, 1, 2, 0, 5, 10]})
    fitted = mm.linear(frame, by="k", features=["x"], target="y", store=tmp_path)
    new = pd.DataFrame({"k": asked, "x": [1.0, 1.0]})
    want = [1.0, 1.0] if asked[1] is True else [1.0, 5.0]
    assert fitted.predict(new).tolist() == pytest.approx(want)
    assert mm.Store(tmp_path).predict(new).tolist() == pytest.approx(want)


def test_store_predict_checks_by_features_and_fn_on_a_linear_run(tmp_path):
    """by=, features= and fn= were ignored for an mm.linear run: rows were
    keyed by the run's by whatever by= said (another column, or one that is
    not there). They are checked as for an mm.train run now; an empty table
    is refused by the same words."""
    frame = pd.DataFrame({"store": ["s0"] * 3 + ["s1"] * 3, "item": ["s1", "s0", "s1"] * 2,
                          "x": [0.0, 1, 2] * 2, "y": [0.0, 1, 2, 0, 10, 20]})
    mm.linear(frame, by="store", features=["x"], target="y", store=tmp_path)
    store = mm.Store(tmp_path)
    new = pd.DataFrame({"store": ["s0"], "item": ["s1"], "x": [1.0]})
    for by in ("item", "no_such_column", ["store", "item"]):
        with pytest.raises(ValueError, match="keyed by \\['store'\\]"):
            store.predict(new, by=by)
    with pytest.raises(ValueError, match="take \\['x'\\]"):
        store.predict(new, features=["item"])
    with pytest.raises(ValueError, match="fn= calls each group's model"):
        store.predict(new, fn=lambda model, rows: model.predict(rows))
    with pytest.raises(ValueError, match="the table to predict has no rows"):
        store.predict(new.iloc[:0])
    for asked in ({"by": "store", "features": ["x"]}, {"by": ["store"], "fallback": False}):
        assert store.predict(new, **asked).tolist() == pytest.approx([1.0])


def test_keys_with_missing_values_and_float_keys_are_reused(tmp_path):
    frame = sales(30)
    frame["store"] = frame["store"].where(frame["item"] != 2, None)  # a missing key part
    first = fit(frame, tmp_path)
    assert fit(frame, tmp_path).reused == len(first)
    floats = sales(20).assign(g=lambda f: f["item"] + 0.5)
    by_float = mm.linear(floats, by="g", features=FEATURES, target="y", store=tmp_path,
                         name="floats")
    again = mm.linear(floats, by="g", features=FEATURES, target="y", store=tmp_path,
                      name="floats")
    assert again.reused == len(by_float)
    loaded = mm.Store(tmp_path).linear("floats")
    assert loaded.why_not_reused(0.5) == "0.5 was reused from run 3"
    assert "fitted in run 1" in mm.Store(tmp_path).linear(run=1).why_not_reused(("s1", 1))


def test_a_boolean_key_beside_a_missing_one_is_reused(tmp_path):
    """Fitted, the missing key was NaN in an object column; saved, <NA> in a
    nullable boolean one: neither found the other, and its group was fitted
    again on every re-run (why_not_reused: the earlier run had no group)."""
    frame = pd.DataFrame({"k": [True] * 3 + [False] * 3 + [None] * 3,
                          "x": [0.0, 1, 2] * 3, "y": [0.0, 1, 3, 1, 0, 2, 5, 1, 0]})
    first = mm.linear(frame, by="k", features=["x"], target="y", store=tmp_path)
    again = mm.linear(frame, by="k", features=["x"], target="y", store=tmp_path)
    assert again.reused == len(first) == 3
    np.testing.assert_array_equal(again.coef, first.coef)


def test_a_run_that_fails_is_marked_and_the_saved_result_stays(tmp_path, monkeypatch):
    from manymodels.models.linear import stored

    frame = sales(40)
    first = fit(frame, tmp_path)
    changed = frame.assign(y=frame["y"] + 1.0)

    def broken(*args, **kwargs):  # a fit that dies half-way (a kill, a full device)
        raise MemoryError("out of memory in the kernels")

    monkeypatch.setattr(stored, "fit_groups", broken)
    with pytest.raises(MemoryError):
        fit(changed, tmp_path)
    monkeypatch.undo()
    store = mm.Store(tmp_path)
    assert store.runs()["status"].tolist() == ["finished", "failed"]
    same(store.linear("y"), first)  # the failed run saved nothing
    assert fit(frame, tmp_path).reused == len(first)  # and is never a source
    store.delete(1)
    assert fit(frame, tmp_path).reused == len(first)  # run 3's copy is the source now


def test_the_command_line_shows_explains_reports_and_predicts_a_linear_run(tmp_path):
    from typer.testing import CliRunner

    from manymodels.cli.app import app

    frame = sales(30)
    store = tmp_path / "store"
    fit(frame, store)
    changed = frame.copy()
    changed.loc[changed.index[group_mask(changed, ("s1", 1))][0], "y"] += 1.0
    fitted = fit(changed, store)
    runner = CliRunner()
    shown = runner.invoke(app, ["show", str(store)])
    assert shown.exit_code == 0, shown.output
    assert f"run 2: {len(fitted)} tasks" in shown.output
    why = runner.invoke(app, ["why", str(store), "s1", "1"])
    assert why.exit_code == 0 and "its rows changed since run 1" in why.output
    report = runner.invoke(app, ["report", str(store), "-o", str(tmp_path / "r.html")])
    assert report.exit_code == 0, report.output
    frame.to_parquet(tmp_path / "rows.parquet")
    predicted = runner.invoke(app, ["predict", str(store), str(tmp_path / "rows.parquet"),
                                    "-o", str(tmp_path / "out.parquet")])
    assert predicted.exit_code == 0, predicted.output
    out = pd.read_parquet(tmp_path / "out.parquet")
    np.testing.assert_allclose(out["prediction"], fitted.predict(frame), rtol=0, atol=0)
