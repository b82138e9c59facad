"""`manymodels train --model LinearRegression|Ridge` through mm.linear's kernels:
the same store contents as the generic path, and the command says which path it took."""

from __future__ import annotations

import pickle

import numpy as np
import pandas as pd
import pytest

import manymodels as mm
from conftest import run_cli
from manymodels.cli.tabular import GroupModelTask, train_table
from manymodels.models.linear.fastpath import fast_task


def table(seed: int = 0) -> pd.DataFrame:
    """Unequal groups, among them tiny ones (2 and 3 rows: fitted by scikit-learn)."""
    rng = np.random.default_rng(seed)
    sizes = np.r_[2, 3, rng.integers(8, 40, size=30)]
    group = np.repeat(np.arange(len(sizes)), sizes)
    n = len(group)
    frame = pd.DataFrame({"shop": [f"s{g % 4}" for g in group], "sku": group,
                          "price": rng.uniform(1, 10, n), "promo": rng.integers(0, 2, n)})
    frame["sales"] = 50 - (group % 5 + 1) * frame["price"] + 8 * frame["promo"] + rng.normal(
        0, 1, n)
    return frame


@pytest.mark.parametrize("model, params, batched", [
    ("LinearRegression", {}, 30),  # the 2- and 3-row groups have too few rows to fit 3 values
    ("Ridge", {"alpha": 3.0}, 32),  # ridge: every group
    ("LinearRegression", {"fit_intercept": False}, 31)])
def test_the_batched_path_gives_the_generic_paths_results(tmp_path, model, params, batched):
    frame = table()
    dotted = f"sklearn.linear_model.{model}"
    kwargs = {"by": ["shop", "sku"], "target": "sales", "model": dotted, "workers": 2,
              "metrics": ["r2", "mae", "rmse", "mse", "mape"]}
    fast = train_table(frame, store=tmp_path / "fast", params=params, **kwargs)
    # copy_X=True changes nothing in the model but is a parameter the batched
    # fit does not take: the generic path, for reference
    generic = train_table(frame, store=tmp_path / "generic", params={**params, "copy_X": True},
                          **kwargs)
    assert fast.path_note.startswith(f"fast path: mm.linear fitted and scored {batched} of 32 "
                                     "groups")
    assert generic.path_note == "generic path: parameter 'copy_X' is not handled by the " \
                                "batched fit"
    left, right = fast.run.results, generic.run.results
    assert (left["status"] == "ok").all()
    columns = ["r2", "mae", "rmse", "mse", "mape", "rows"]
    pd.testing.assert_frame_equal(left[["shop", "sku"] + columns],
                                  right[["shop", "sku"] + columns], rtol=1e-9)
    X = frame[["price", "promo"]].to_numpy()
    for key in [("s0", 0), ("s1", 1), ("s2", 2), ("s3", 7)]:
        a, b = fast.run.models[key], generic.run.models[key]
        assert type(a) is type(b)
        np.testing.assert_allclose(a.coef_, b.coef_, rtol=1e-9)
        assert a.intercept_ == pytest.approx(b.intercept_, rel=1e-9)
        np.testing.assert_allclose(a.predict(X), b.predict(X), rtol=1e-9)
        if model == "LinearRegression":
            np.testing.assert_allclose(a.singular_, b.singular_, rtol=1e-9)
            assert a.rank_ == b.rank_


def test_the_batched_results_live_outside_the_task_and_its_identity():
    from manymodels.identity.hashing import code_identity
    from manymodels.inputs.tables import read_table
    from manymodels.models.linear.fastpath import PRECOMPUTED

    def make():
        return GroupModelTask("sklearn.linear_model.Ridge", "sales", ["price", "promo"],
                              {"alpha": 2.0}, {}, ["r2"], 0.2, None)

    task, plain = make(), make()
    before = code_identity(task)[0]
    fast_task(task, read_table(table()), ["shop", "sku"])
    assert task in PRECOMPUTED and plain not in PRECOMPUTED
    assert code_identity(task)[0] == before == code_identity(plain)[0]
    assert pickle.loads(pickle.dumps(task)) not in PRECOMPUTED  # a spawned worker fits


def test_the_command_says_which_path_it_took(tmp_path):
    path = tmp_path / "sales.parquet"
    table().to_parquet(path)
    common = ["--by", "shop,sku", "--workers", "1"]

    def train(*extra, target="sales"):  # (an option given twice is refused)
        return run_cli("train", path, *common, "--target", target, *extra)

    fast = train("--model", "sklearn.linear_model.LinearRegression", "--store", tmp_path / "a")
    assert fast.returncode == 0, fast.stderr
    assert "fast path: mm.linear fitted and scored 30 of 32 groups" in fast.stdout
    grid = train("--model", "sklearn.linear_model.Ridge", "--grid", "alpha=0.1,1",
                 "--store", tmp_path / "b")
    assert grid.returncode == 0, grid.stderr
    assert "generic path: --grid picks a setting per group" in grid.stdout
    logistic = train("--model", "sklearn.linear_model.LogisticRegression", "--features",
                     "price", "--allow-failures", "--store", tmp_path / "d", target="promo")
    assert logistic.returncode == 0, logistic.stderr  # (tiny one-class groups fail)
    assert "generic path: LogisticRegression's lbfgs stops at tol=1e-4" in logistic.stdout
    other = train("--model", "sklearn.tree.DecisionTreeRegressor", "--store", tmp_path / "c")
    assert other.returncode == 0 and "path:" not in other.stdout
    assert len(mm.Store(tmp_path / "a").results()) == 32


def test_an_unchanged_rerun_says_its_models_were_reused_not_fitted(tmp_path):
    """The batched fit runs before the store says what it holds: an unchanged
    re-run printed "fast path: mm.linear fitted and scored 32 of 32" beside
    32 reused models."""
    kwargs = {"by": ["shop", "sku"], "target": "sales",
              "model": "sklearn.linear_model.Ridge", "backend": "serial",
              "store": tmp_path / "s", "fallback": False}
    first = train_table(table(), **kwargs)
    assert first.path_note.startswith("fast path: mm.linear fitted and scored 32 of 32")
    again = train_table(table(), **kwargs)
    assert again.run.summary().reused == 32
    assert again.path_note == "every group's model reused from the store: none fitted"
    changed = table()
    changed.loc[0, "sales"] += 1  # one group's rows: the other 31 reused
    third = train_table(changed, **kwargs)
    assert third.run.summary().reused == 31
    assert third.path_note.startswith("fast path: mm.linear fitted and scored 32 of 32")
    assert third.path_note.endswith("; the store's models kept for 31 unchanged groups")


@pytest.mark.parametrize("second", ["near_copy", "tiny_scale"])
def test_an_ill_conditioned_group_is_left_to_scikit_learn(tmp_path, second):
    """LinearRegression drops singular values below tol=1e-6 of the largest:
    near-collinear features, or one 1e9 times smaller than the other, give
    its truncated answer, which the batched exact one (coefficients of 1e8)
    is not; such a group is fitted by scikit-learn, the others in batches."""
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"g": np.repeat([0, 1], 20), "a": rng.normal(size=40),
                          "noise": rng.normal(size=40)})
    frame["b"] = (frame["a"] + 1e-7 * frame["noise"] if second == "near_copy"
                  else 1e-9 * frame["noise"])
    frame.loc[frame["g"] == 1, "b"] = rng.normal(size=20)  # group 1: well-conditioned
    frame["y"] = frame["a"] + rng.normal(size=40)
    kwargs = {"by": ["g"], "target": "y", "features": ["a", "b"], "metrics": ["r2"],
              "model": "sklearn.linear_model.LinearRegression", "backend": "serial"}
    fast = train_table(frame, store=tmp_path / "fast", params={}, **kwargs)
    generic = train_table(frame, store=tmp_path / "generic", params={"copy_X": True}, **kwargs)
    assert fast.path_note.startswith("fast path: mm.linear fitted and scored 1 of 2 groups")
    for key in (0, 1):
        np.testing.assert_allclose(fast.run.models[key].coef_, generic.run.models[key].coef_,
                                   rtol=1e-9)
    np.testing.assert_allclose(fast.run.results["r2"], generic.run.results["r2"], rtol=1e-9)
