"""``manymodels train --model ...LinearRegression|Ridge``, fitted in batches.

The command line trains one estimator per group, scores it on a holdout
(``mm.holdout(test_size, seed=seed)``: the split depends on the group's row
count alone) and refits it on all rows. For
``LinearRegression`` and ``Ridge`` with a holdout, no grid and metrics that are
plain formulas (r2, mae, mse, rmse, mape), all of that is a few batched
solves: :func:`fast_task` computes every group's holdout scores and final
coefficients with :mod:`.kernels`, and keeps them where the command's
task finds them: its call hands back the scikit-learn estimator built from them, with
the same metrics, instead of fitting it twice.

Nothing else changes: the run goes through ``mm.train`` and its store as
before, with the same task (the results wait in :data:`PRECOMPUTED`, outside
it, so its identity in a store is unchanged), and a group that the batched fit
flags (rank-deficient or too small, where LAPACK's answer is rounding noise;
for ``LinearRegression``, ill-conditioned, see :data:`CONDITION_FLOOR`)
is fitted by scikit-learn as before. A worker that did not inherit the
precomputed models (one started by ``spawn``) fits them itself, as before.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import numpy as np
import pandas as pd

from ...inputs.keys import encode_key
from . import kernels
from .prepare import _gather, prepare

#: dotted name -> (family, the constructor parameters the batched fit honours)
MODELS = {
    "sklearn.linear_model.LinearRegression": ("ols", {"fit_intercept"}),
    "sklearn.linear_model.Ridge": ("ridge", {"alpha", "fit_intercept"}),
}
METRICS = ("r2", "mae", "mse", "rmse", "mape")
#: linear models the batched fit solves, but not to the generic path's answer
NOT_THE_SAME = {
    "sklearn.linear_model.LogisticRegression":
        "LogisticRegression's lbfgs stops at tol=1e-4, so mm.linear's exact optimum "
        "would differ from its models in the 4th digit (use mm.linear directly for it)",
}


def why_not(task: Any) -> str | None:
    """Why ``task`` (a ``GroupModelTask``) needs the generic path, or None."""
    if task.model in NOT_THE_SAME:
        return NOT_THE_SAME[task.model]
    if task.model not in MODELS:
        return f"{task.model} has no batched kernel"
    family, allowed = MODELS[task.model]
    extra = sorted(set(task.params) - allowed)
    if extra:
        return f"parameter {extra[0]!r} is not handled by the batched fit"
    if task.grid:
        return "--grid picks a setting per group"
    if task.cv:
        return "--cv scores by cross-validation"
    unknown = [m for m in task.metrics if m not in METRICS]
    if unknown:
        return f"metric {unknown[0]!r} has no batched formula"
    alpha = task.params.get("alpha", 1.0)
    if family == "ridge" and not (isinstance(alpha, (int, float)) and alpha > 0):
        return "alpha is not one positive number"
    if not isinstance(task.params.get("fit_intercept", True), bool):
        return "fit_intercept is not True or False"
    return None


def _scores(y: np.ndarray, predicted: np.ndarray) -> dict[str, np.ndarray]:
    """scikit-learn's regression metrics of each row of ``y`` (groups x rows)."""
    error = y - predicted
    mse = (error * error).mean(axis=1)
    numerator = (error * error).sum(axis=1)
    spread = y - y.mean(axis=1, keepdims=True)
    denominator = (spread * spread).sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        r2 = np.where(denominator != 0, 1.0 - numerator / denominator,
                      np.where(numerator == 0, 1.0, 0.0))
    if y.shape[1] < 2:  # scikit-learn's r2_score: not defined on one row
        r2 = np.full(len(y), np.nan)
    eps = np.finfo(np.float64).eps
    return {"r2": r2, "mae": np.abs(error).mean(axis=1), "mse": mse, "rmse": np.sqrt(mse),
            "mape": (np.abs(error) / np.maximum(np.abs(y), eps)).mean(axis=1)}


#: The smallest ratio of a batched group's singular values (of its design as
#: scikit-learn's ``lstsq`` sees it) to its largest. ``LinearRegression``
#: (1.9 on) drops singular values below ``tol=1e-6`` of the largest, and the
#: normal equations lose ``cond ** 2 * eps`` of their digits: a group below
#: this (near-collinear features, or features of scales 1e12 apart) is left
#: to scikit-learn, whose answer the generic path would give.
CONDITION_FLOOR = 1e-4


def well_conditioned(X: np.ndarray, centred: bool) -> np.ndarray:
    """Which groups of ``X`` (groups, rows, features) have a design whose
    singular values all lie within :data:`CONDITION_FLOOR` of the largest
    (centred on the group's means when the model fits an intercept)."""
    if centred:
        X = X - X.mean(axis=1, keepdims=True)
    eig = np.linalg.eigvalsh(X.transpose(0, 2, 1) @ X)  # the singular values squared
    top = eig[:, -1]
    return (top > 0) & (eig[:, 0] > CONDITION_FLOOR ** 2 * top)


def fast_task(task: Any, table: Any, by: list[str]) -> Any:
    """The batched stand-in for ``task`` on ``table`` (see the module's doc)."""
    from ...evaluation.splitters import TooShort

    splitter = task.splitter()
    family, _ = MODELS[task.model]
    alpha = float(task.params.get("alpha", 1.0)) if family == "ridge" else 0.0
    intercept_on = task.params.get("fit_intercept", True)
    data = prepare(table, by, task.features, task.target, None, alpha, family)
    G, p = data.groups, len(task.features)
    coef, intercept = np.full((G, p), np.nan), np.full(G, np.nan)
    scores = {name: np.full(G, np.nan) for name in task.metrics}
    good = np.zeros(G, dtype=bool)
    for n in np.unique(data.counts):
        if n < 2:
            continue  # too few rows to hold any out: the generic path says so
        try:  # the same rows as the generic path's splitter holds out
            ((train, test, _),) = splitter.windows(np.arange(n))
        except TooShort:
            continue
        groups = np.flatnonzero(data.counts == n)
        per_block = max(1, (1 << 16) // int(n))  # groups a block: about 65,536 rows
        for start in range(0, len(groups), per_block):
            block = _gather(data, groups[start:start + per_block])
            held = kernels.least_squares_in_range(kernels.least_squares, block.Z[:, train],
                                                  None, alpha, intercept_on)
            Zt = block.Z[:, test]
            predicted = (Zt[:, :, :p] @ held["coef"][:, :, None])[:, :, 0] + held[
                "intercept"][:, None]
            for name, values in _scores(Zt[:, :, p], predicted).items():
                if name in scores:
                    scores[name][block.index] = values
            full = kernels.least_squares_in_range(kernels.least_squares, block.Z, None, alpha,
                                                  intercept_on)
            coef[block.index], intercept[block.index] = full["coef"], full["intercept"]
            good[block.index] = ~held["rank_deficient"] & ~full["rank_deficient"]
            if family == "ols":  # (Ridge solves its penalised equations, no cutoff)
                good[block.index] &= (well_conditioned(block.Z[:, train, :p], intercept_on)
                                      & well_conditioned(block.Z[:, :, :p], intercept_on))
    index = {encode_key(tuple(row)): i for i, row in enumerate(
        data.keys.itertuples(index=False, name=None)) if good[i]}
    batched = Batched(by, index, coef, intercept, scores)
    PRECOMPUTED[task] = batched
    return batched


#: task -> its groups' precomputed models: consulted by ``GroupModelTask.__call__``
#: (in the driver, and in workers forked from it, which inherit this table).
PRECOMPUTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class Batched:
    """The precomputed coefficients and holdout scores of a task's groups."""

    def __init__(self, by: list[str], index: dict[str, int], coef: np.ndarray,
                 intercept: np.ndarray, scores: dict[str, np.ndarray]) -> None:
        self.by, self.index, self.coef, self.intercept, self.scores = (
            by, index, coef, intercept, scores)

    def result(self, task: Any, df: pd.DataFrame) -> tuple[Any, dict[str, Any]] | None:
        """The model and metrics the plain task would return for ``df``, or
        None for a group that was not batched."""
        if not len(df):
            return None
        found = self.index.get(encode_key(tuple(df[name].iat[0] for name in self.by)))
        if found is None:
            return None
        model = task.build({})
        model.coef_ = self.coef[found].copy()
        model.intercept_ = np.float64(self.intercept[found])
        model.n_features_in_ = len(task.features)
        if type(model).__name__ == "Ridge":
            model.n_iter_, model.solver_ = None, "cholesky"
        else:
            X = np.column_stack([df[name].to_numpy(dtype=np.float64) for name in task.features])
            if model.fit_intercept:
                X = X - X.mean(axis=0)
            model.singular_ = np.linalg.svd(X, compute_uv=False)
            model.rank_ = len(task.features)
        metrics: dict[str, Any] = {name: float(self.scores[name][found])
                                   for name in task.metrics}
        metrics["rows"] = len(df)
        return model, metrics


def precomputed(task: Any, df: pd.DataFrame) -> tuple[Any, dict[str, Any]] | None:
    """``task``'s precomputed result for the group ``df``, if it has one."""
    batched = PRECOMPUTED.get(task)
    return None if batched is None else batched.result(task, df)


def try_fast(task: Any, table: Any, by: list[str]) -> str | None:
    """Fit ``task``'s groups in batches where it can (see the module's doc);
    return the line to print about the path taken (None: not a linear model)."""
    reason = why_not(task)
    if reason is not None:
        linear = task.model in MODELS or task.model in NOT_THE_SAME
        return f"generic path: {reason}" if linear else None
    try:
        batched = fast_task(task, table, by)
    except ValueError as exc:  # e.g. missing values: each group fails as it would have
        return f"generic path: {exc}"
    return describe(len(batched.coef), len(batched.index))


def describe(groups: int, batched: int) -> str:
    """The line the command prints when it takes this path."""
    share = batched / groups if groups else 0.0
    return (f"fast path: mm.linear fitted and scored {batched:,} of {groups:,} groups in "
            f"batches ({math.floor(share * 100)}%); scikit-learn fits the rest")
