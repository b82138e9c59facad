"""Shrinkage for hierarchical groups: how much each level's model weighs.

A row of group ``(country, city)`` has a chain of models, from the root (the
global model, when there is one) down to its own group: ``[global, country,
(country, city)]``, with the number of training rows each saw, e.g. ``[1000,
80, 12]``. A shrinkage function maps those sizes to one weight per level;
a regressor's prediction is the weighted sum of the chain's predictions, a
classifier's probabilities the weighted sum of the chain's probabilities
(scikit-lego's ``HierarchicalClassifier``), so that a small group leans on
its parents. Every chain that predict may use (a group's, a parent's for its
unseen sub-groups, the global model's alone) is weighed in ``fit``, so that a
function whose weights do not fit one is refused before any model is fitted.
The names and meanings are scikit-lego's (``GroupedPredictor(shrinkage=...,
**shrinkage_kwargs)``), so that its users get the same numbers:

* ``"constant"`` (``alpha``): the root gets ``alpha ** (n - 1)``, level ``i``
  ``alpha ** (n - 1 - i) * (1 - alpha)``, the group itself ``1 - alpha``;
* ``"relative"``: each level in proportion to its rows;
* ``"min_n_obs"`` (``min_n_obs``): all weight on the deepest level that saw
  at least ``min_n_obs`` rows;
* ``"equal"``: every level alike;
* a callable: sizes (a list of ints, root first) -> an np.ndarray of weights
  as long.

Weights must be non-negative; they are normalised to sum to 1.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np


def constant_shrinkage(sizes: np.ndarray, alpha: float) -> np.ndarray:
    n = len(sizes)
    if n == 1:
        return np.ones(1)
    return np.array([alpha ** (n - 1)]
                    + [alpha ** (n - 1 - i) * (1 - alpha) for i in range(1, n - 1)]
                    + [1 - alpha])


def relative_shrinkage(sizes: np.ndarray) -> np.ndarray:
    return np.asarray(sizes, dtype=float)


def min_n_obs_shrinkage(sizes: np.ndarray, min_n_obs: int) -> np.ndarray:
    enough = np.flatnonzero(np.asarray(sizes) >= min_n_obs)
    if not len(enough):
        raise ValueError(f"no level has min_n_obs={min_n_obs} rows or more (the largest "
                         f"has {int(np.max(sizes))})")
    weights = np.zeros(len(sizes))
    weights[enough[-1]] = 1.0
    return weights


def equal_shrinkage(sizes: np.ndarray) -> np.ndarray:
    return np.ones(len(sizes))


SHRINKAGE: dict[str, Callable[..., np.ndarray]] = {
    "constant": constant_shrinkage, "relative": relative_shrinkage,
    "min_n_obs": min_n_obs_shrinkage, "equal": equal_shrinkage}
_KEYWORDS = {"constant": {"alpha"}, "relative": set(), "min_n_obs": {"min_n_obs"},
             "equal": set()}


def shrinkage_function(shrinkage: Any, kwargs: Mapping[str, Any] | None) -> ShrinkageWeights:
    """``sizes -> normalised weights`` for ``shrinkage``, checked at once so
    that a bad setting fails in ``fit`` before any model is trained."""
    kwargs = dict(kwargs or {})
    if isinstance(shrinkage, str) and shrinkage in SHRINKAGE:
        expected = _KEYWORDS[shrinkage]
        unknown = set(kwargs) - expected
        if unknown:
            raise ValueError(f"shrinkage={shrinkage!r} takes no shrinkage_kwargs "
                             f"{sorted(unknown)}; it takes {sorted(expected) or 'none'}")
        lacking = expected - set(kwargs)
        if lacking:
            raise ValueError(f"shrinkage={shrinkage!r} needs shrinkage_kwargs="
                             f"{{{sorted(lacking)[0]!r}: ...}}")
        alpha = kwargs.get("alpha", 0.5)
        if shrinkage == "constant" and not (isinstance(alpha, (int, float)) and 0 <= alpha <= 1):
            raise ValueError(f"shrinkage 'constant' needs 0 <= alpha <= 1, got {alpha!r}")
        minimum = kwargs.get("min_n_obs", 1)
        if shrinkage == "min_n_obs" and not (isinstance(minimum, (int, np.integer))
                                             and minimum >= 1):
            raise ValueError(f"shrinkage 'min_n_obs' needs an integer min_n_obs >= 1, "
                             f"got {minimum!r}")
        raw = SHRINKAGE[shrinkage]
    elif callable(shrinkage) and not isinstance(shrinkage, type):
        raw = shrinkage
        probe = [10, 5, 2]
        try:
            result = raw(probe, **kwargs)
        except Exception as exc:
            raise ValueError(f"the shrinkage function raised while checking it on sizes "
                             f"{probe}: {exc!r}") from exc
        if not isinstance(result, np.ndarray) or result.shape != (len(probe),):
            raise ValueError(f"the shrinkage function must return an np.ndarray of shape "
                             f"({len(probe)},) for sizes {probe}, got {result!r}")
    else:
        raise ValueError(f"shrinkage must be None, one of {sorted(SHRINKAGE)} or a function "
                         f"of the levels' sizes, got {shrinkage!r}")

    return ShrinkageWeights(raw, kwargs)


class ShrinkageWeights:
    """``sizes -> normalised weights``: a plain object, so that a fitted
    estimator that holds it pickles (a closure would not)."""

    def __init__(self, function: Callable[..., np.ndarray], kwargs: dict[str, Any]) -> None:
        self.function, self.kwargs = function, kwargs

    def __call__(self, sizes: np.ndarray) -> np.ndarray:
        sizes = [int(n) for n in sizes]  # a list, root first, as scikit-lego passes them
        values = np.asarray(self.function(sizes, **self.kwargs), dtype=float)
        total = values.sum()
        if (values.shape != (len(sizes),) or not np.isfinite(total) or total <= 0
                or (values < 0).any()):
            raise ValueError(f"shrinkage weights {values!r} for sizes {list(sizes)} must be "
                             "one finite, non-negative weight per level, not all zero")
        return values / total

    def for_chain(self, sizes: Sequence[int], whose: str) -> np.ndarray:
        """The weights of one chain, or an error naming the chain: run on every
        chain that predict may use while fitting, so that predict never refuses."""
        try:
            return self(np.asarray(sizes))
        except Exception as exc:
            raise ValueError(f"shrinkage: the chain of {whose} (sizes {[int(n) for n in sizes]}, "
                             f"root first) gets no weights: {exc}") from exc


def check_chains(shrink: ShrinkageWeights, prefixes: list[tuple], level_sizes: dict,
                 n_rows: int, fallback: Any, min_group_size: int) -> None:
    """Weigh, from the row counts and before any model is fitted, every chain
    that predict may use: each prefix's (rows of its unseen sub-groups use
    it) and the root's alone (rows of unseen top-level groups). A chain is
    the root (unless fallback='error') and the prefix's levels that have
    min_group_size rows or more."""
    root = [] if fallback == "error" else [n_rows]
    for prefix in [(), *prefixes]:
        chain = root + [level_sizes[prefix[:level]] for level in range(1, len(prefix) + 1)
                        if level_sizes[prefix[:level]] >= min_group_size]
        if chain:
            shrink.for_chain(chain, whose_chain(fallback, prefix))


def whose_chain(fallback: Any, prefix: tuple) -> str:
    """A chain's name in a refusal: its group, or the root model."""
    if prefix:
        return repr(prefix)
    return "the global model" if fallback == "global" else "the fallback model"
