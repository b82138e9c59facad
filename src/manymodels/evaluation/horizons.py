"""How a forecaster is asked for ``h`` steps in a backtest, read from its class.

A backtest window of ``h`` time steps asks a model without feature rows:

* ``forecast(h)``, unless ``forecast`` wants the history first
  (statsforecast's ``forecast(y, h)``: its models are fitted, then asked
  with ``predict(h)``);
* ``predict(h)`` (statsforecast, pmdarima's ``n_periods``) or sktime's
  ``predict(fh)`` (given the steps ``1..h``);
* anything else predicts from the test rows' features (``predict(X)``).

The answer depends on the class alone, so it is read once per class.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

#: The first parameter of a ``predict`` that takes a horizon.
HORIZON_PARAMETERS = ("h", "horizon", "steps", "n_periods", "fh")
#: A ``forecast`` whose first parameter is one of these wants the history first.
HISTORY_PARAMETERS = ("y", "df", "data", "X", "x")


def _first_parameter(function: Any) -> str | None:
    """The name of a method's first positional parameter after ``self``."""
    try:
        parameters = list(inspect.signature(function).parameters.values())
    except (TypeError, ValueError):  # a builtin without a signature
        return None
    positional = [p for p in parameters
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][1:]
    return positional[0].name if positional else None


@functools.lru_cache(maxsize=256)
def horizon_method(kind: type) -> tuple[str, str] | None:
    """``(method, first parameter)`` by which a model of class ``kind``
    forecasts ``h`` steps, or None when it predicts from feature rows."""
    forecast = getattr(kind, "forecast", None)
    if callable(forecast) and _first_parameter(forecast) not in HISTORY_PARAMETERS:
        return "forecast", "h"
    predict = getattr(kind, "predict", None)
    name = _first_parameter(predict) if callable(predict) else None
    return ("predict", name) if name in HORIZON_PARAMETERS else None


def horizon_call(model: Any) -> Callable[[int], Any] | None:
    """``model``'s way to forecast ``h`` steps (see :func:`horizon_method`);
    ``mm.halving(keep="all")``'s candidates forecast as their winner."""
    from .candidates import Candidates

    if isinstance(model, Candidates):
        model = model.best
    try:
        how = horizon_method(type(model))
    except TypeError:  # an unhashable class: asked as it is
        how = horizon_method.__wrapped__(type(model))
    if how is None:
        return None
    method = getattr(model, how[0])
    if how[1] == "fh":  # sktime: the steps ahead, relative to the end of training
        return lambda h: method(np.arange(1, h + 1))
    return method
