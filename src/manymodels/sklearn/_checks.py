"""What :class:`~._estimator.GroupedEstimator` refuses before any group
fits: its parameters (the estimator, the fallback, ``min_group_size``,
``hierarchical``, the shrinkage) and its ``y`` and ``sample_weight``, each
with scikit-learn's message where it has one.

The estimator's ``fit`` calls these first; they read its parameters and
call only its ``_check_kind`` hook (a regressor or classifier subclass
refusing the other kind), never its fit. Splitting X is :mod:`._inputs`'.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.utils.validation import (
    _check_sample_weight,
    check_array,
    column_or_1d,
    has_fit_parameter,
)

from ._inputs import by_list, split_X
from ._shrinkage import shrinkage_function


def checked_params(owner: Any) -> Any:
    """Refuse ``owner``'s parameters that cannot fit, naming the one at
    fault; the shrinkage function its ``shrinkage`` names, or None."""
    if owner.estimator is None:
        raise ValueError(f"{type(owner).__name__} needs an estimator, e.g. "
                         f"{type(owner).__name__}(Ridge(), by='store')")
    if isinstance(owner.estimator, type) or not hasattr(owner.estimator, "fit"):
        hint = (f" (an instance: {owner.estimator.__name__}())"
                if isinstance(owner.estimator, type) else "")
        raise TypeError(f"estimator must be a scikit-learn estimator{hint}, "
                        f"got {owner.estimator!r}")
    for role, model in (("estimator", owner.estimator), ("fallback", owner.fallback)):
        if hasattr(model, "fit") and not hasattr(model, "predict"):
            raise TypeError(f"{role} {type(model).__name__} has no predict (a transformer?): "
                            f"{type(owner).__name__} predicts with a model per group; "
                            "per-group transforms are not offered")
    owner._check_kind()
    if (not isinstance(owner.min_group_size, (int, np.integer))
            or isinstance(owner.min_group_size, (bool, np.bool_)) or owner.min_group_size < 1):
        raise ValueError(f"min_group_size must be an integer >= 1, "
                         f"got {owner.min_group_size!r}")
    if not (owner.fallback in ("global", "error") or (
            hasattr(owner.fallback, "fit") and not isinstance(owner.fallback, type))):
        hint = (f" (an instance: {owner.fallback.__name__}())"
                if isinstance(owner.fallback, type) else "")
        raise ValueError(f"fallback must be 'global', 'error' or an estimator{hint}, "
                         f"got {owner.fallback!r}")
    check_fallback_kind(owner.estimator, owner.fallback)
    if not (isinstance(owner.hierarchical, (bool, np.bool_, int, np.integer))
            and owner.hierarchical in (0, 1)):
        raise ValueError(f"hierarchical must be True or False, got {owner.hierarchical!r}")
    if owner.shrinkage is None:
        if owner.shrinkage_kwargs:  # else they would be ignored without a word
            raise ValueError(f"shrinkage_kwargs={owner.shrinkage_kwargs!r} is given without "
                             "shrinkage=: name the shrinkage they are for "
                             "(shrinkage='constant', 'min_n_obs', ...)")
        return None
    if owner.fallback == "error" and len(by_list(owner.by)) == 1:
        raise ValueError(
            f"shrinkage={owner.shrinkage!r} blends each group's model with its parents', "
            f"but by={owner.by!r} with fallback='error' gives one level only: add a parent "
            "by column (by=['country', 'city']) or keep the global model as the root "
            "(fallback='global')")
    if is_classifier(owner.estimator):
        for role, estimator in (("estimator", owner.estimator), ("fallback", owner.fallback)):
            if hasattr(estimator, "fit") and not hasattr(estimator, "predict_proba"):
                raise ValueError(
                    "shrinkage blends the class probabilities of a group's models, so the "
                    f"{role} needs predict_proba, which {type(estimator).__name__} has not")
    elif not is_regressor(owner.estimator):
        raise ValueError("shrinkage blends the predictions of a group's models, so it "
                         "needs a regressor or a classifier with predict_proba; "
                         f"{type(owner.estimator).__name__} is neither")
    return shrinkage_function(owner.shrinkage, owner.shrinkage_kwargs)


def check_fallback_kind(estimator: Any, fallback: Any) -> None:
    """A classifier's fallback must give classes, a regressor's numbers:
    a regressor answering a classifier's unseen groups would put its
    numbers among the predicted classes."""
    if not hasattr(fallback, "fit"):
        return
    for kind, other in ((is_classifier, is_regressor), (is_regressor, is_classifier)):
        if kind(estimator) and other(fallback):
            raise ValueError(
                f"fallback {type(fallback).__name__} is a "
                f"{'regressor' if other is is_regressor else 'classifier'}, and estimator "
                f"{type(estimator).__name__} is not: the fallback answers the rows "
                "of unseen groups, so it must be an estimator of the same kind")


def checked_data(owner: Any, X: Any, y: Any, sample_weight: Any, routing: bool = False) -> tuple:
    """The key columns, the features, ``y`` and the weights, each checked
    as scikit-learn checks them, before any model is fitted. With metadata
    ``routing``, whether the models take the weights is theirs to say
    (``set_fit_request``), not their signature's."""
    if y is None:
        raise ValueError(f"{type(owner).__name__} requires y to be passed, but the target "
                         "y is None")
    keys, features = split_X(owner, X, fitting=True)
    y = column_or_1d(y, warn=True)
    if y.dtype.kind in "fc":  # scikit-learn's message for NaN or inf in y
        check_array(y, ensure_2d=False, dtype=None, input_name="y")
    if len(y) != len(features):
        raise ValueError(f"X has {len(features)} rows but y has {len(y)}")
    if len(y) == 0:
        raise ValueError("cannot fit on 0 samples")
    if sample_weight is not None:
        for estimator in () if routing else (owner.estimator, owner.fallback):
            if hasattr(estimator, "fit") and not has_fit_parameter(estimator,
                                                                   "sample_weight"):
                raise TypeError(f"{type(estimator).__name__}.fit takes no sample_weight")
        sample_weight = _check_sample_weight(sample_weight, features)
    return keys, features, y, sample_weight


def check_fits_without_features(estimator: Any, X_all: Any, y: np.ndarray, depth: int) -> None:
    """With the key columns alone as X, make sure ``estimator`` fits on no
    feature at all, before any group is fitted, with scikit-learn's message."""
    try:
        clone(estimator).fit(X_all, y)
    except ValueError as exc:
        raise ValueError(f"X has {depth} feature(s), all of them by columns, and "
                         f"{type(estimator).__name__} cannot fit without a "
                         f"feature: {exc}") from exc
