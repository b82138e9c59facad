"""Checks of what a source is given, shared by every kind of source: a
``cost=`` function and its answers, and keys or grid values given twice
(two that look unlike but are one key, ``1`` and ``1.0``, included)."""

from __future__ import annotations

import math
import numbers
from typing import Any

import numpy as np


def task_cost(value: Any, whose: str) -> float:
    """A ``cost=`` function's answer for ``whose`` task as a float: a finite
    number (a NumPy one too). Text, a bool or None is refused, though
    ``float()`` would read ``"5"`` and ``True``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"cost= must return a number; for {whose} it returned {value!r}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"cost= gave {value!r} for {whose}: each task's expected cost "
                         "must be a finite number")
    return number


class CostError(ValueError):
    """A ``cost=`` function raised: the error names its source and task."""


def called_cost(cost: Any, argument: Any, source: str, whose: str) -> float:
    """``cost(argument)``, ``whose`` task's cost, checked (:func:`task_cost`).
    An error it raises names the source and the task: a bare ``KeyError:
    'n_estimators'`` said neither that ``cost=`` raised it nor for what."""
    try:
        value = cost(argument)
    except Exception as exc:
        raise CostError(f"{source}(cost=...) raised {type(exc).__name__}: {exc} for "
                         f"{whose}") from exc
    return task_cost(value, whose)


def check_cost(cost: Any, source: str, argument: str) -> None:
    """Refuse a ``cost=`` that is no function, naming the source it was given to."""
    if cost is not None and not callable(cost):
        raise TypeError(f"{source}(cost=...) is each task's expected cost, a function of "
                        f"{argument}; got {cost!r}")


def require_unique(values: list[Any], what: str, by_equality: bool = False) -> None:
    """Refuse a value given twice; ``by_equality``: unhashable ones too, each
    compared with those before (a grid's few values, not a million items'
    keys, which are positions where they cannot be hashed). Two values that
    look unlike but compare equal (1 and 1.0, True and 1) are refused saying
    why: as keys (a results column, ``run.models``, a store's) they are one."""
    seen: dict[Any, Any] = {}
    unhashable: list[Any] = []
    for value in values:
        try:
            # NaN is not equal to itself, but two are one value given twice
            as_seen = _NAN if isinstance(value, float) and value != value else value
            earlier = seen.get(as_seen, _ABSENT)
            seen.setdefault(as_seen, value)
        except TypeError:
            if not by_equality:
                continue  # (found where it is: its position)
            earlier = next((other for other in unhashable if _equal(value, other)), _ABSENT)
            unhashable.append(value)
        if earlier is _ABSENT:
            continue
        if repr(earlier) != repr(value):
            way_out = ("give each a key of its own with key=" if what == "item key" else
                       "give them distinct names (say 'one' and 'all') and map each name "
                       "to its value inside fit")
            raise ValueError(
                f"{earlier!r} and {value!r} are one {what}: Python holds them equal "
                "(1 == 1.0 == True), and a results column, run.models or a store could not "
                f"tell them apart; to train both, {way_out}")
        raise ValueError(f"duplicate {what}: {value!r}")


#: What a NaN is counted as among the values seen.
_NAN = object()
#: No value seen (None may be one).
_ABSENT = object()


def _equal(left: Any, right: Any) -> bool:
    """``left == right`` as one truth; False where it has none (arrays)."""
    if type(left) is not type(right):
        return False
    if isinstance(left, np.ndarray):
        return left.shape == right.shape and bool(np.array_equal(left, right, equal_nan=(
            left.dtype.kind in "fc")))
    try:
        return bool(left == right)
    except (TypeError, ValueError):
        return False


def named_twice(names: list[Any]) -> Any:
    """The first of ``names`` found a second time (in one pass), or None."""
    seen: set[Any] = set()
    for name in names:
        if name in seen:
            return name
        seen.add(name)
    return None


def refuse_a_name_twice(names: list[str], what: str) -> None:
    """A table whose columns name one twice (a CSV's header may): which is
    meant cannot be told, and a later step failed on it."""
    twice = named_twice(names)
    if twice is not None:
        raise ValueError(f"the table {what} has two columns named {twice!r}: rename one")
