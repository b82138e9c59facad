"""The fit of a set of groups: every block through the kernels, then each
group's coefficients, metrics and status as arrays.

Apart from :func:`manymodels.linear` so that a store can fit only the groups
that changed (a :class:`~.prepare.Prepared` of some groups) and so that the
store's model-code version covers exactly the code that computes a result
(this module, the kernels and the layout).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from .glance import GLANCE_COLUMNS, glance_arrays
from .kernels import least_squares_in_range
from .prepare import Block, Prepared, blocks

STATUSES = ["ok", "rank_deficient", "not_converged", "single_class", "no_weight"]
LOGISTIC_METRICS = ("log_loss", "accuracy", "converged", "iterations")
#: ``r2`` and ``rmse`` (``sqrt(RSS / n)``, beside broom's ``sigma``), then broom's glance row
LEAST_SQUARES_METRICS = ("r2", "rmse", *GLANCE_COLUMNS)
_INTEGER_METRICS = ("df", "df_residual", "nobs")
#: Integer metrics with no meaning for a ``no_weight`` group (no rows: no
#: model, so no degrees of freedom; ``nobs`` is its count of rows, 0).
BLANK_WITHOUT_WEIGHT = ("df", "df_residual")


def blank_integers(metrics: pd.DataFrame) -> None:
    """Blank, in place, the integer metrics without meaning for a
    ``no_weight`` group as pandas' ``<NA>`` (the columns become nullable
    ``Int64``; they stay ``int64`` where every group has its value). The
    float metrics are NaN there already; these were ``df`` 0 and
    ``df_residual`` -1, made-up numbers that a sum or a filter would read."""
    if "status" not in metrics:
        return
    missing = np.asarray(metrics["status"] == "no_weight")
    for name in BLANK_WITHOUT_WEIGHT:
        if name in metrics and missing.any():
            values = plain_values(metrics[name], np.dtype(np.int64))
            metrics[name] = pd.arrays.IntegerArray(values, missing.copy())


def plain_values(column: pd.Series, dtype: np.dtype) -> np.ndarray:
    """A metric column as a NumPy array of ``dtype``: a blank (``<NA>``) as 0
    for integers (its value is read from the status again), NaN for floats."""
    if isinstance(column.dtype, np.dtype):
        return column.to_numpy().astype(dtype, copy=False)
    fill = 0 if dtype.kind in "iu" else np.nan
    return column.to_numpy(dtype=dtype, na_value=fill)


@dataclass
class Fitted:
    """Per group: coefficients, intercept, status and the family's metrics."""

    coef: np.ndarray             # (groups, features)
    intercept: np.ndarray        # (groups,)
    status: Any                  # (groups,) object array of STATUSES, or a Categorical
    extra: dict[str, np.ndarray]


def empty(family: str, groups: int, features: int) -> Fitted:
    if family == "logistic":
        extra = {"log_loss": np.empty(groups), "accuracy": np.empty(groups),
                 "converged": np.empty(groups, dtype=bool),
                 "iterations": np.empty(groups, dtype=np.int64)}
    else:
        extra = {name: np.empty(groups, dtype=np.int64 if name in _INTEGER_METRICS else None)
                 for name in LEAST_SQUARES_METRICS}
    return Fitted(np.empty((groups, features)), np.empty(groups),
                  np.full(groups, "ok", dtype=object), extra)


def fit_groups(data: Prepared, features: int, family: str, *, engine: Any, on: dict,
               fit_intercept: bool, C: float, max_iter: int, tol: float, workers: int,
               block_rows: int) -> Fitted:
    """Fit every group of ``data`` (blocks on ``workers`` threads); for least
    squares, the glance statistics of all groups at once after the blocks
    (their p-values iterate a few times for most groups and up to twenty
    for some: per block, those last steps would cost a NumPy call each on a
    handful of groups, block after block)."""
    out_all = empty(family, data.groups, features)
    coef, intercept, status, extra = (out_all.coef, out_all.intercept, out_all.status,
                                      out_all.extra)
    sums = None if family == "logistic" else {
        "sse": np.empty(data.groups), "tss": np.empty(data.groups),
        "rank": np.empty(data.groups, dtype=np.int64), "n": np.empty(data.groups, dtype=np.int64),
        "log_w": np.empty(data.groups), "y_scale": np.empty(data.groups),
        "no_weight": np.empty(data.groups, dtype=bool)}

    def fit(block: Block) -> None:
        i = block.index
        if family == "logistic":
            out = engine.logistic(block.Z, block.w, float(C), fit_intercept, int(max_iter),
                                  float(tol), **on)
            for name in LOGISTIC_METRICS:
                extra[name][i] = out[name]
            status[i[~out["converged"]]] = "not_converged"
            status[i[out["single_class"]]] = "single_class"
        else:
            out = least_squares_in_range(engine.least_squares, block.Z, block.w, block.alpha,
                                         fit_intercept, **on)
            sse, sst, n = out["sse"], out["sst"], data.counts[i]
            with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
                r2 = np.where(sst > 0, 1.0 - sse / sst, np.where(sse == 0, 1.0, 0.0))
                extra["rmse"][i] = np.sqrt(sse / out["sw"]) * out["y_scale"]
            extra["r2"][i] = np.where(n >= 2, r2, np.nan)
            for name in ("sse", "tss", "rank", "n", "log_w", "y_scale"):
                sums[name][i] = out[name]
            sums["no_weight"][i] = out["sw"] <= 0
            status[i[out["rank_deficient"]]] = "rank_deficient"
        no_weight = out["sw"] <= 0
        out["coef"][no_weight], out["intercept"][no_weight] = np.nan, np.nan
        status[i[no_weight]] = "no_weight"
        for values in extra.values():  # no rows weigh anything: nothing was scored
            if values.dtype.kind == "f":
                values[i[no_weight]] = np.nan
        coef[i], intercept[i] = out["coef"], out["intercept"]

    if data.groups == 0:
        return out_all
    if int(workers) == 1:
        for block in blocks(data, int(block_rows)):
            fit(block)
    else:
        with ThreadPoolExecutor(int(workers)) as pool:
            list(pool.map(fit, blocks(data, int(block_rows))))
    if sums is not None:
        glanced = glance_arrays(sums["sse"], sums["tss"], sums["rank"], sums["n"],
                                sums["log_w"], fit_intercept, sums["y_scale"])
        for name, values in glanced.items():
            extra[name][:] = values
            if values.dtype.kind == "f":  # no rows weigh anything: nothing was scored
                extra[name][sums["no_weight"]] = np.nan
    return out_all
