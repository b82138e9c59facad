"""Batched linear models: one per group, all fitted at once.

Fitted one at a time, a per-group ``LinearRegression`` costs a Python call
into scikit-learn, some 0.4 ms for 20 rows of which about 95% is overhead
around a 20 µs solve. Fitted together, the same models are a few batched
array operations on blocks of groups: :func:`linear` does that for ordinary,
weighted and ridge least squares and for L2 logistic regression, with
scikit-learn's conventions and results.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ...inputs.engineframes import refuse_engine_frame
from . import kernels
from .fitting import STATUSES, Fitted, blank_integers, fit_groups
from .prepare import BLOCK_ROWS, FAMILIES, Prepared, check, prepare
from .result import LinearResult

__all__ = ["LinearResult", "linear"]

#: The arguments that one family alone reads, with their default there.
FAMILY_ARGUMENTS: dict[str, tuple[str, Any]] = {
    "alpha": ("ridge", 1.0), "C": ("logistic", 1.0), "max_iter": ("logistic", 100),
    "tol": ("logistic", 1e-8)}


def linear(table: Any, by: str | Sequence[str], features: str | Sequence[str], target: str,
           family: str = "ols", *, fit_intercept: bool = True, weights: str | None = None,
           alpha: float | str | None = None, C: float | None = None,
           max_iter: int | None = None, tol: float | None = None,
           workers: int = 1, block_rows: int = BLOCK_ROWS,
           device: str | None = None, store: Any = None,
           name: str | None = None) -> LinearResult:
    """Fit one linear model per ``by`` group of ``table`` (a pandas or polars
    DataFrame, an Arrow table, a Parquet/CSV path), all groups at once.

    ``family``: ``"ols"`` (scikit-learn's ``LinearRegression``), ``"wls"``
    (the same with row ``weights``, a column name), ``"ridge"`` (``Ridge``:
    ``alpha`` a number, or the name of a column constant within each group,
    default 1.0; the intercept is not penalised) or ``"logistic"``
    (``LogisticRegression`` with its L2 penalty ``C``, a positive number,
    Python's or NumPy's, not a bool, default 1.0; the intercept not
    penalised; the target holds 0 and 1; Newton's method, at most
    ``max_iter`` iterations (default 100), converged when a step is below
    ``tol`` (default 1e-8) relative to the coefficients). ``weights`` also
    applies to ridge and logistic (``sample_weight``). ``alpha`` given to a
    family other than ridge, or ``C``, ``max_iter`` or ``tol`` to one other
    than logistic, is refused, naming the argument and the family: it would
    change nothing, and a call that reads as penalised would not be.

    The work runs over blocks of at most ``block_rows`` (padded) rows, so its
    memory is bounded at any number of groups; ``workers`` threads fit
    blocks side by side (NumPy releases the GIL in its kernels). Bad input
    is refused before any work, naming the column at fault.

    ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``) runs the kernels in
    PyTorch (an optional dependency) on that device, blocks of
    ``block_rows`` at a time; results equal NumPy's to rounding.

    ``store`` (a path or a :class:`manymodels.Store`) saves the result there
    as one artifact, under ``name`` (default: the target's name), with an
    identity per group (a hash of its rows, the family, the options and the
    model code): a re-run fits only the groups whose identity changed or that
    are new, and copies the others from the latest saved result with the same
    options (see :mod:`.stored`). ``.metrics`` then says, per group, the run
    it was ``reused_from`` (``<NA>``: fitted now); ``Store(path).linear(name)``
    loads it back.
    """
    refuse_engine_frame(table, "linear's table", "mm.linear solves every group's least "
                        "squares from the table's columns on this machine")
    if not isinstance(fit_intercept, bool):
        raise TypeError(f"fit_intercept must be True or False, got {fit_intercept!r}")
    alpha, C, max_iter, tol = _family_arguments(
        family, {"alpha": alpha, "C": C, "max_iter": max_iter, "tol": tol})
    # (NumPy's numbers too, as for alpha; a bool is no penalty: True was read as 1)
    if family == "logistic" and not (_is_number(C) and 0 < C < np.inf):
        raise ValueError(f"C must be a positive number, got {C!r}")
    if not isinstance(alpha, str) and not (_is_number(alpha) and alpha < np.inf):
        raise ValueError(f"alpha must be a finite number >= 0 or a column name, got {alpha!r}")
    if not (_is_number(tol) and tol >= 0):
        raise ValueError(f"tol must be a number >= 0, got {tol!r}")
    for argument, value in (("max_iter", max_iter), ("workers", workers),
                        ("block_rows", block_rows)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{argument} must be a whole number of at least 1, got {value!r}")
    engine: Any = kernels  # (the device checked before a store is opened)
    torch_device = None
    if device is not None:
        from . import torch_kernels

        torch_device, engine = torch_kernels.check_device(device), torch_kernels
    opened = None
    result_name = name if name is not None else target
    to_make = False
    if store is not None:  # refused before any work: a file, a read-only store
        from ...store.opening import store_to_make
        from .stored import check_name, open_store

        check_name(result_name)
        # a store not made yet is made once the input is checked: a refused
        # input leaves none behind
        to_make = store_to_make(store)
        if not to_make:
            opened = open_store(store, result_name)
    on = {} if torch_device is None else {"device": torch_device}
    started = time.perf_counter()
    ridge = alpha if family == "ridge" else 0.0
    try:
        arrow, by_columns, feature_columns = check(table, by, features, target, family,
                                                   weights, ridge)
        data = prepare(arrow, by_columns, feature_columns, target, weights, ridge, family)
    except BaseException:
        if opened is not None and opened.owned:  # refused input: no run was started
            opened.store.close()
        raise
    if to_make:
        opened = open_store(store, result_name)
    prepared = time.perf_counter()
    options = {"fit_intercept": fit_intercept, "C": C, "max_iter": max_iter, "tol": tol,
               "workers": workers, "block_rows": block_rows}
    if opened is not None:
        from .stored import linear_in_store

        return linear_in_store(opened, table, data, family, by_columns, feature_columns,
                               target, weights, alpha if family == "ridge" else None, options,
                               engine=engine, on=on, started=started, prepared=prepared)
    fitted = fit_groups(data, len(feature_columns), family, engine=engine, on=on, **options)
    done = time.perf_counter()
    return assemble(family, by_columns, feature_columns, target, fit_intercept, data, fitted,
                    {"prepare_s": prepared - started, "fit_s": done - prepared})


def assemble(family: str, by: list[str], features: list[str], target: str,
             fit_intercept: bool, data: Prepared, fitted: Fitted,
             timings: dict[str, float], reused_from: Any = None) -> LinearResult:
    """The :class:`LinearResult` of ``fitted`` (every group of ``data``)."""
    metrics = data.keys.copy()
    metrics["n"] = data.counts
    for name, values in fitted.extra.items():
        metrics[name] = values
    metrics["status"] = (fitted.status if isinstance(fitted.status, pd.Categorical)
                         else pd.Categorical(fitted.status, categories=STATUSES))
    blank_integers(metrics)
    if reused_from is not None:  # as in Run.results: the run that fitted it, or <NA>
        metrics["reused_from"] = reused_from
    return LinearResult(family, by, features, target, fit_intercept, data.keys, fitted.coef,
                        fitted.intercept, metrics, timings)


def _family_arguments(family: str, given: dict[str, Any]) -> list[Any]:
    """``given``'s values in order, each absent one (None) its family's
    default; one given to a family that does not read it is refused, so that
    ``family="ols", alpha=1.0`` does not fit an unpenalised model unsaid."""
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
    values = []
    for argument, value in given.items():
        owner, default = FAMILY_ARGUMENTS[argument]
        if value is not None and family != owner:
            raise ValueError(f"{argument}= applies to family={owner!r} alone; "
                             f"family={family!r} does not use it: leave it out")
        values.append(default if value is None else value)
    return values


def _is_number(value: Any) -> bool:
    """A real number, Python's or NumPy's (``np.float32(1)`` from a grid),
    not a bool (``True`` is an int, but no penalty nor tolerance)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, bool)
