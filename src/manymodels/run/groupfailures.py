"""What ``map_groups`` does with groups that failed: a ``fallback=``
function run in the worker where ``fn`` raises (its output marked with the
reason), and, with ``errors="skip"``, the groups left out, warned about and
listed in a pandas result's ``attrs``."""

from __future__ import annotations

import inspect
import traceback
import warnings
from collections.abc import Callable
from typing import Any

import pandas as pd

from ..engine.execution import metrics_dict
from ..planning.plan import asks_for_key
from .results import Run

#: The metric a fallback's output carries: why ``fn`` failed on that group.
_FALLBACK = "__manymodels_fallback__"


class _WithFallback:
    """``fn``, or ``fallback`` on the same rows where ``fn`` raises (as
    statsforecast's ``fallback_model``): in the worker, so the fallback's
    output travels back like any other, marked with the reason."""

    def __init__(self, fn: Callable[..., Any], fallback: Callable[..., Any]) -> None:
        self.fn, self.fallback = fn, fallback
        # which of the two takes the group's key=: the wrapper asks for it (its
        # signature says so) when either does, and hands it to those that do
        self.keyed = (asks_for_key(fn), asks_for_key(fallback))

    @property
    def __signature__(self) -> inspect.Signature:
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
        parameters = [inspect.Parameter("data", kind)]
        if any(self.keyed):
            parameters.append(inspect.Parameter("key", inspect.Parameter.KEYWORD_ONLY))
        return inspect.Signature([*parameters, inspect.Parameter(
            "kwargs", inspect.Parameter.VAR_KEYWORD)])

    def __call__(self, data: Any, **kwargs: Any) -> Any:
        keyed = getattr(self, "keyed", (False, False))  # (pickled before it was kept)
        key = kwargs.pop("key", _NO_KEY) if any(keyed) else _NO_KEY
        try:
            return self.fn(data, **_with_key(kwargs, key, keyed[0]))
        except Exception:  # the fallback's own error, if any, carries fn's as its context
            reason = traceback.format_exc()
            return self.fallback(data, **_with_key(kwargs, key, keyed[1])), {_FALLBACK: reason}


_NO_KEY = object()


def _with_key(kwargs: dict[str, Any], key: Any, asks: bool) -> dict[str, Any]:
    """``kwargs``, with the group's key for a function that asks for it."""
    return {**kwargs, "key": key} if asks and key is not _NO_KEY else kwargs


def _key_of(parts: tuple) -> Any:
    return parts[0] if len(parts) == 1 else tuple(parts)


def fallen_back(run: Run) -> dict[Any, str]:
    """Key -> why ``fn`` failed, for the groups whose output is the fallback's."""
    rec = run._records
    fallen: dict[Any, str] = {}
    for index, (parts, ok, metrics) in enumerate(
            zip(run._plan.key_rows, rec.ok_mask().tolist(), rec.metrics)):
        metrics = metrics_dict(metrics, index) if ok else None
        if metrics and _FALLBACK in metrics:
            fallen[_key_of(parts)] = metrics[_FALLBACK]
    return fallen


def refuse_dict_outputs(run: Run, what: str) -> None:
    """Refuse, naming the group, a run whose function returned a dict: ``train``
    reads a dict as a task's metrics with no model, so the group would have
    no rows, silently (``map_groups``) or be called no table (``map_partitions``);
    and one that returned a table and a dict, whose dict would be dropped."""
    rec = run._records
    ok = rec.ok_mask()
    key_rows = run._plan.key_rows
    # a list's scan by identity is some 30 ns a task; only a None output is looked at
    for index in [i for i, model in enumerate(rec.model) if model is None]:
        if not ok[index]:
            continue
        parts = key_rows[index]
        named = metrics_dict(rec.metrics[index], index)
        if named and set(named) - {_FALLBACK}:
            raise TypeError(f"the function given to {what} returned a dict for "
                            f"{_key_of(tuple(parts))!r}, not a table: return a DataFrame "
                            "(pd.DataFrame([row]) for one row), a Series, or an Arrow or "
                            "polars table")
    if any(rec.metrics):  # (table, dict): train reads it as a model and its metrics
        for index, metrics in enumerate(rec.metrics):
            if metrics and ok[index] and rec.model[index] is not None and (
                    set(metrics_dict(metrics, index) or ()) - {_FALLBACK}):
                raise TypeError(
                    f"the function given to {what} returned a table and a dict for "
                    f"{_key_of(tuple(key_rows[index]))!r}: return the table alone (the dict "
                    "would be dropped)")


def failures(run: Run, key_columns: list) -> dict[Any, str]:
    """Key -> error of every task that failed (left out of the result)."""
    failed = run.failed
    return {_key_of(tuple(row[c] for c in key_columns)): row["error"]
            for _, row in failed.iterrows()}


def _reason(error: str) -> str:
    """The last line of a traceback: the exception and its message."""
    lines = [line for line in str(error).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "unknown error"


def report_failures(result: Any, failed: dict, fallback: dict | None,
                    what: str = "map_groups", unit: str = "group") -> Any:
    """Warn about the groups (or partitions) left out; on a pandas result,
    ``attrs["failed"]`` (and ``attrs["fallback"]``) map each such key to its
    traceback."""
    if failed:
        listed = "; ".join(f"{key!r} ({_reason(error)})" for key, error in
                           list(failed.items())[:5])
        more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
        warnings.warn(f"{what}: {len(failed)} {unit}(s) failed and are left out of the "
                      f"result: {listed}{more} (a pandas result lists them all in "
                      "result.attrs['failed'])", RuntimeWarning, stacklevel=3)
    if isinstance(result, (pd.DataFrame, pd.Series)):
        result.attrs["failed"] = failed
        if fallback is not None:
            result.attrs["fallback"] = fallback
    return result


#: (pickled, and so hashed, under the name it had in ``manymodels.transforms``)
WithFallback = _WithFallback
