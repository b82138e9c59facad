"""scikit-learn estimators that fit one model per group with manymodels:
:class:`GroupedEstimator`, and :class:`GroupedRegressor` and
:class:`GroupedClassifier`, which refuse the other kind of estimator."""

from ._estimator import GroupedClassifier, GroupedEstimator, GroupedRegressor

__all__ = ["GroupedClassifier", "GroupedEstimator", "GroupedRegressor"]
