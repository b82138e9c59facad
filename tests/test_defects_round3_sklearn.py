"""Issue 37: shrinkage in GroupedEstimator as scikit-lego has it.

21. Shrinkage with one level and no global model is refused.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from sklearn.linear_model import Ridge

from manymodels.sklearn import GroupedRegressor

CLASSES = np.array(["high", "low", "mid"])
FEATURES = ["x1", "x2"]


@pytest.fixture
def labelled():
    """Two countries, four cities; Ghent sees only two of the three classes."""
    rng = np.random.default_rng(7)
    parts = []
    for country, city, n in [("NL", "Amsterdam", 60), ("NL", "Rotterdam", 25),
                             ("BE", "Antwerp", 40), ("BE", "Ghent", 30)]:
        x = rng.normal(size=(n, 2))
        score = x[:, 0] + (0.5 if country == "NL" else -0.5) * x[:, 1]
        label = np.where(score > 0.6, "high", np.where(score < -0.6, "low", "mid"))
        if city == "Ghent":
            label = np.where(label == "high", "mid", label)
        parts.append(pd.DataFrame({"country": country, "city": city, "x1": x[:, 0],
                                   "x2": x[:, 1], "y": label}))
    frame = pd.concat(parts, ignore_index=True)
    return frame[["country", "city", *FEATURES]], frame["y"].to_numpy()


@pytest.mark.parametrize("by", ["country", ["country"], 0])
def test_shrinkage_with_one_level_and_no_global_model_is_refused(labelled, by):
    X, y = labelled
    X = X[["country", "x1"]]
    if by == 0:
        X = X.to_numpy(dtype=object)
    with pytest.raises(ValueError, match="shrinkage.*fallback='error' gives one level only"):
        GroupedRegressor(Ridge(), by=by, fallback="error", shrinkage="equal").fit(X, y == "low")
    with_global = GroupedRegressor(Ridge(), by=by, shrinkage="equal", backend="serial")
    assert len(with_global.fit(X, y == "low").predict(X)) == len(X)
