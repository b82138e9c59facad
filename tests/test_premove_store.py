"""A store written by manymodels before its modules moved into subpackages
(``tests/fixtures/premove_store``, made by ``tests/fixtures/premove_jobs.py``)
still opens, loads, predicts and is reused: task identities hash pickles that
name module paths, so a move must keep them."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import manymodels as mm

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def jobs():
    sys.path.insert(0, str(FIXTURES))
    try:
        import premove_jobs

        yield premove_jobs
    finally:
        sys.path.remove(str(FIXTURES))


@pytest.fixture
def store_path(tmp_path):
    path = tmp_path / "premove_store"
    shutil.copytree(FIXTURES / "premove_store", path)
    return path


def test_an_old_store_opens_loads_and_predicts(store_path, jobs):
    store = mm.Store(store_path)
    runs = store.runs()
    assert runs["run_id"].tolist() == [1, 2, 3, 4, 5]
    frame = jobs.sales()
    model = store.load("s1", run=1)
    rows = frame[frame["store"] == "s1"]
    assert np.allclose(model.predict(rows[["price", "promo"]]),
                       jobs.fit(rows)[0].predict(rows[["price", "promo"]]))
    predicted = store.predict(frame, by="store", run=1, features=["price", "promo"])
    assert len(predicted) == len(frame) and predicted.notna().all()
    best = store.results(run=2)
    assert set(best["store"]) == {"s0", "s1", "s2"} and "rmse" in best.columns
    linear = store.linear("ols")
    assert np.isfinite(linear.predict(frame)).all()


def test_an_old_store_reuses_every_model(store_path, jobs):
    """Every model but the backtest's: a backtest's kept model is now fitted on
    the rows in time order (it was fitted in the input's order), so its
    identity changed on purpose and it is trained once more."""
    runs = jobs.run_all(store_path)
    for number, run in enumerate(runs):
        summary = run.summary()
        expected = 0 if number == 1 else summary.tasks
        assert summary.reused == expected, (run, summary)
    again = jobs.run_all(store_path)[1].summary()
    assert again.reused == again.tasks  # and reused from then on
