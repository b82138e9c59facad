"""A :class:`~._estimator.GroupedEstimator`'s fit parameters, routed as
scikit-learn's meta-estimators route metadata (``MultiOutputRegressor``).

With ``sklearn.set_config(enable_metadata_routing=True)``, ``fit``'s
``sample_weight`` and other keywords go to the estimator (and to a given
fallback) as their ``set_fit_request`` asks, through
:func:`sklearn.utils.metadata_routing.process_routing`; a parameter the
estimator has not said it wants raises scikit-learn's
``UnsetMetadataPassedError``. Without routing only ``sample_weight`` is
taken (as before), any other keyword is refused with scikit-learn's error.

A routed parameter with one value per row of X (an array of ``len(X)``)
is carried in the stacked table as a reserved column, so that each group
gets its rows' values as it gets its rows; any other goes to every fit as
it is.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.utils._param_validation import _is_arraylike_not_scalar
from sklearn.utils.metadata_routing import (
    MetadataRouter,
    MethodMapping,
    _raise_for_params,
    _routing_enabled,
    process_routing,
)

from ._levels import PARAM, W


def has_fallback_estimator(owner: Any) -> bool:
    return hasattr(owner.fallback, "fit") and not isinstance(owner.fallback, type)


def metadata_router(owner: Any) -> MetadataRouter:
    """``fit`` routed to the estimator's ``fit``, and to the fallback's when
    it is an estimator (``fallback="global"`` fits the estimator)."""
    router = MetadataRouter(owner=owner).add(
        estimator=owner.estimator, method_mapping=MethodMapping().add(caller="fit", callee="fit"))
    if has_fallback_estimator(owner):
        router.add(fallback=owner.fallback,
                   method_mapping=MethodMapping().add(caller="fit", callee="fit"))
    return router


def routed_fit_params(owner: Any, sample_weight: Any,
                      fit_params: dict[str, Any]) -> tuple[dict, dict] | None:
    """The estimator's and the fallback's fit parameters with routing on;
    None with it off (``sample_weight`` alone, as before; any other keyword
    refused with scikit-learn's message)."""
    if not _routing_enabled():
        _raise_for_params(fit_params, owner, "fit")
        return None
    params = dict(fit_params)
    if sample_weight is not None:
        params["sample_weight"] = sample_weight
    if not params:
        return {}, {}
    routed = process_routing(owner, "fit", **params)
    own = dict(routed.estimator.fit)
    return own, (dict(routed.fallback.fit) if has_fallback_estimator(owner) else own)


def split_per_row(params: dict[str, Any], n_rows: int) -> tuple[dict, dict, dict]:
    """``params`` as reserved columns (name -> values, one per row), how
    each group reads them back (name -> (column, rows stacked)), and the
    others, passed as they are. ``sample_weight`` is carried in the
    weights' column."""
    columns, per_row, constant = {}, {}, {}
    for index, (name, value) in enumerate(params.items()):
        values = np.asarray(value) if _is_arraylike_not_scalar(value) else None
        if values is None or values.ndim == 0 or len(values) != n_rows:
            constant[name] = value
            continue
        column = W if name == "sample_weight" else f"{PARAM}{index}__"
        stacked = values.ndim > 1
        if stacked:  # one array per row, stacked again in each group
            cells = np.empty(n_rows, dtype=object)
            for row, cell in enumerate(values):
                cells[row] = cell
            values = cells
        columns[column] = values
        per_row[name] = (column, stacked)
    return columns, per_row, constant
