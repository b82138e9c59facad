"""``GroupedEstimator``: one scikit-learn model per group, fitted by manymodels.

For people who think in ``fit``/``predict``: ``GroupedEstimator(Ridge(),
by="store")`` behaves as one estimator (``clone``, ``Pipeline``,
``GridSearchCV`` work) while manymodels fits a clone of ``Ridge()`` per store
in parallel. Rows of groups that were too small, that failed, or that were
never seen in ``fit`` go to their parent group's model (``hierarchical``) or
to a fallback model; ``shrinkage`` blends a group's model with its parents'
as scikit-lego's ``GroupedPredictor`` does.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
import pandas as pd
from sklearn.base import (
    BaseEstimator,
    ClassifierMixin,
    MetaEstimatorMixin,
    RegressorMixin,
    clone,
    is_classifier,
    is_regressor,
)
from sklearn.metrics import accuracy_score, r2_score
from sklearn.utils.metaestimators import available_if
from sklearn.utils.validation import check_is_fitted

from ..inputs.keys import TypedKeys, encode_key, find_typed, key_parts
from ..inputs.tables import plain_scalar
from ..run.predictchecks import check_key_types
from ._checks import check_fits_without_features, checked_data, checked_params
from ._fitparams import metadata_router, routed_fit_params, split_per_row
from ._inputs import by_list, feature_input, split_X
from ._levels import GROUP, Blend, fit_group, stack_levels
from ._routing import (
    EstimatorGroups,
    answer,
    group_positions,
    predict_backend,
    route_on_engine,
    route_rows,
)
from ._shrinkage import check_chains, whose_chain


def _models_offer(owner: GroupedEstimator, method: str) -> bool:
    """Whether every model a row may reach has ``method``: the estimator's
    clones and a given fallback (which answers rows of unseen groups)."""
    fallback = owner.fallback if hasattr(owner.fallback, "fit") else None
    return all(hasattr(model, method) for model in (owner.estimator, fallback)
               if model is not None)


def _offers_predict_proba(owner: GroupedEstimator) -> bool:
    return _models_offer(owner, "predict_proba")


def _offers_decision_function(owner: GroupedEstimator) -> bool:
    if not _models_offer(owner, "decision_function"):
        return False
    if owner.shrinkage is not None:  # the reason, as the AttributeError's __cause__
        raise AttributeError("decision_function is not offered with shrinkage: the levels' "
                             "scores are on different scales and do not add up; "
                             "use predict_proba, which is shrunk")
    return True


def joblib_worker_cores() -> int | None:
    """The cores a joblib (loky) worker may use, or None outside one: joblib
    sets its ``OMP_NUM_THREADS`` to ``cpu_count // n_jobs`` (or keeps the
    user's), which is how scikit-learn's estimators size what they nest."""
    import multiprocessing
    import os

    if not multiprocessing.current_process().name.startswith("LokyProcess"):
        return None
    try:
        return max(1, int(os.environ.get("OMP_NUM_THREADS", "1")))
    except ValueError:
        return 1


class GroupedEstimator(MetaEstimatorMixin, BaseEstimator):
    """One clone of ``estimator`` per group of rows, with a fallback model.

    Parameters
    ----------
    estimator : scikit-learn estimator
        Cloned for every group.
    by : str, int or a sequence of them
        The column(s) naming a row's group: names for a DataFrame, integer
        positions for an array; several as a list, tuple, array or Index.
        They are not passed to the per-group models; X may hold them alone
        (one baseline per group, e.g. ``DummyRegressor()``).
    fallback : "global", an estimator, or "error"
        ``"global"`` (a clone of ``estimator`` fitted on all rows), an
        estimator of the same kind (fitted on all rows; a regressor for a
        classifier, or the reverse, is refused), or ``"error"`` (predicting
        an unseen group raises). Used for unseen groups, groups smaller than
        ``min_group_size`` and groups whose fit failed (scikit-lego's
        ``use_global_model=False`` is ``fallback="error"``).
    min_group_size : int
        Groups with fewer rows use the fallback (or a parent).
    backend : str or None
        Where the groups fit and predict (as :func:`manymodels.train`'s).
        ``None``: fit on worker processes; predict as ``Store.predict`` does, in
        the caller unless the measured cost of a few groups says workers pay.
    workers : int or None
        How many workers (as :func:`manymodels.train`'s). ``None`` inside a
        joblib worker (``GridSearchCV(n_jobs=k)``): the cores joblib left it;
        one core runs the groups in that worker.
    hierarchical : bool
        With several ``by`` columns, also fit a model per prefix
        (``by=["country", "city"]``: per country, then per (country, city)), and
        send a row whose group has no model to its nearest parent that has
        one, then to the fallback.
    shrinkage : None, str or callable
        ``"constant"``, ``"relative"``, ``"min_n_obs"``, ``"equal"`` or a
        function of the levels' sizes (see
        :mod:`manymodels.sklearn._shrinkage`): blend the chain of models from
        the global one (unless ``fallback="error"``) down to the group's own.
        A regressor predicts the chain's weighted sum of predictions; a
        classifier (it needs ``predict_proba``) the weighted sum of the
        chain's class probabilities, a class a model never saw counting 0,
        and ``predict`` gives the most probable class (scikit-lego's
        ``HierarchicalClassifier``; ``decision_function`` is then not
        offered, as the levels' scores do not add up). Implies
        ``hierarchical``; needs two levels or more (several ``by`` columns, or
        the global model).
    shrinkage_kwargs : dict or None
        The shrinkage's keywords: ``{"alpha": 0.1}`` for ``"constant"``,
        ``{"min_n_obs": 50}`` for ``"min_n_obs"``; refused without ``shrinkage``.

    Attributes
    ----------
    models_ : dict
        Group key -> fitted estimator (a scalar key for one ``by`` column, a
        tuple for several).
    parent_models_ : dict
        Key prefix (a tuple) -> fitted estimator, with ``hierarchical`` or
        ``shrinkage``.
    fallback_ : estimator or None
        The fitted fallback, or None.
    group_sizes_ : dict
        Group key -> rows seen in ``fit``.
    shrinkage_factors_ : dict
        Group key -> weights of its chain of models, root first, with
        ``shrinkage``.
    failed_ : DataFrame
        The groups whose fit failed (key, error).
    classes_ : array
        For classifiers, every class seen in ``fit``.
    """

    def __init__(
        self,
        estimator: Any = None,
        by: str | int | Sequence[str] | Sequence[int] = 0,
        fallback: Any = "global",
        min_group_size: int = 1,
        backend: str | None = None,
        workers: int | None = None,
        hierarchical: bool = False,
        shrinkage: Any = None,
        shrinkage_kwargs: dict | None = None,
    ) -> None:
        self.estimator = estimator
        self.by = by
        self.fallback = fallback
        self.min_group_size = min_group_size
        self.backend = backend
        self.workers = workers
        self.hierarchical = hierarchical
        self.shrinkage = shrinkage
        self.shrinkage_kwargs = shrinkage_kwargs

    def _check_kind(self) -> None:
        """Subclasses refuse the wrong kind of estimator (called among the
        parameters' checks, :func:`._checks.checked_params`)."""

    # -- fit -----------------------------------------------------------------------

    def _forget_fit(self) -> None:
        """Drop every fitted attribute (scikit-learn's trailing underscore), so
        that a refit keeps none of the fit before, and a fit that raises
        leaves the estimator unfitted rather than half fitted."""
        for name in [n for n in vars(self) if n.endswith("_") and not n.startswith("__")]:
            del self.__dict__[name]

    def fit(self, X: Any, y: Any, sample_weight: Any = None,
            **fit_params: Any) -> GroupedEstimator:
        """Fit a model per group, and the fallback; ``sample_weight`` (one per
        row) goes to each group's fit with its rows' weights, and to the
        fallback's. With ``sklearn.set_config(enable_metadata_routing=True)``,
        it and ``fit_params`` go where the models' ``set_fit_request`` asks
        (:mod:`._fitparams`), a parameter with one value per row sliced per
        group. A fit that raises leaves the estimator unfitted."""
        self._forget_fit()
        try:
            return self._fit(X, y, sample_weight, fit_params)
        except BaseException:
            self._forget_fit()
            raise

    def get_metadata_routing(self) -> Any:
        """scikit-learn's metadata routing: ``fit`` to the estimator's ``fit``,
        and to a given fallback's."""
        return metadata_router(self)

    def _fit(self, X: Any, y: Any, sample_weight: Any, fit_params: dict) -> GroupedEstimator:
        from ..api import train  # (not `import manymodels`: the layer contract sees these)
        from ..inputs.sources import groups

        shrink = checked_params(self)
        routed = routed_fit_params(self, sample_weight, fit_params)
        keys, features, y, sample_weight = checked_data(self, X, y, sample_weight,
                                                        routing=routed is not None)
        if routed is None:  # as without routing: the weights alone, to every fit
            own = {} if sample_weight is None else {"sample_weight": sample_weight}
            global_params = own
        else:
            own, global_params = routed
            if "sample_weight" in own:  # as checked above
                own["sample_weight"] = sample_weight
            if "sample_weight" in global_params:
                global_params = {**global_params, "sample_weight": sample_weight}
        carried, per_row, constant = split_per_row(own, len(y))
        if is_classifier(self.estimator):
            from sklearn.utils.multiclass import check_classification_targets

            check_classification_targets(y)  # scikit-learn's message, before any group's fit
            self.classes_ = np.unique(y)
        X_all = feature_input(features, self._as_frame)
        if X_all.shape[1] == 0:
            check_fits_without_features(self.estimator, X_all, y, keys.shape[1])

        depth = keys.shape[1]
        hierarchical = bool(self.hierarchical) or shrink is not None
        stacked, feature_columns, key_of, sizes = stack_levels(
            keys, features, y, carried, as_frame=self._as_frame,
            levels=range(1, depth + 1) if hierarchical else [depth],
            min_group_size=self.min_group_size)

        def public(prefix: tuple) -> Hashable:
            return prefix[0] if depth == 1 else prefix

        self.n_rows_ = len(y)
        self.level_sizes_ = dict(zip(key_of, sizes))
        self.group_sizes_ = {public(k): n for k, n in self.level_sizes_.items()
                             if len(k) == depth}
        if shrink is not None:
            check_chains(shrink, key_of, self.level_sizes_, self.n_rows_, self.fallback,
                         self.min_group_size)
        self.models_, self.parent_models_, failures = {}, {}, []
        backend, workers = self._engine()
        if len(stacked):
            backend = backend or ("serial" if workers == 1 else "processes")
            run = train(
                fit_group, groups(stacked, by=GROUP),
                shared={"estimator": self.estimator, "features": feature_columns,
                        "as_frame": self._as_frame, "per_row": per_row,
                        "constant": constant},
                backend=backend, workers=workers, progress=False)
            for code, model in run.models.items():
                prefix = key_of[code]
                if len(prefix) == depth:
                    self.models_[public(prefix)] = model
                else:
                    self.parent_models_[prefix] = model
            for _, row in run.failed.iterrows():
                prefix = key_of[row[GROUP]]
                failures.append({"group": public(prefix) if len(prefix) == depth else prefix,
                                 "error": row["error"]})
        self.failed_ = pd.DataFrame(failures, columns=["group", "error"])
        if failures and not (self.models_ or self.parent_models_):
            raise RuntimeError(
                f"every group's fit failed ({len(failures)} groups); the first error:\n"
                f"{failures[0]['error']}")
        if failures:
            warnings.warn(f"{len(failures)} group(s) failed to fit and use a parent or the "
                          "fallback; see failed_", RuntimeWarning, stacklevel=2)
        # after the groups: a model fitted here first (LightGBM's OpenMP pool)
        # could deadlock the forked workers
        self.fallback_ = self._fit_global(X_all, y, global_params)
        if self.fallback_ is None and not (self.models_ or self.parent_models_):
            raise ValueError("no group could be fitted and fallback='error'")
        self.shrinkage_function_ = shrink
        if shrink is not None:  # weighed again: a failed fit shortens the chains through it
            weights = {k: self._chain(k)[1] for k in [(), *key_of]}
            self.shrinkage_factors_ = {public(k): w for k, w in weights.items()
                                       if len(k) == depth}
        return self

    def _fit_global(self, X_all: Any, y: np.ndarray, params: dict) -> Any:
        """The fallback fitted on all rows with its fit ``params`` (None with
        ``fallback="error"``)."""
        if self.fallback == "error":
            return None
        prototype = self.estimator if self.fallback == "global" else self.fallback
        return clone(prototype).fit(X_all, y, **params)

    def _engine(self) -> tuple[str | None, int | None]:
        """``backend`` and ``workers`` as the groups run on: with ``workers``
        not given inside a joblib worker, the cores joblib left that worker,
        so that ``GridSearchCV(n_jobs=k)`` does not start k times a worker
        per core (nested in its own, as scikit-learn's estimators nest)."""
        if self.workers is not None:
            return self.backend, self.workers
        return self.backend, joblib_worker_cores()

    # -- predict -------------------------------------------------------------------

    def _chain(self, key: tuple) -> tuple[list, np.ndarray]:
        """The models from the root down to ``key``'s own, skipping levels
        without one, and their shrinkage weights."""
        models, sizes = [], []
        if self.fallback_ is not None:
            models.append(self.fallback_)
            sizes.append(self.n_rows_)
        for level in range(1, len(key) + 1):
            prefix = key[:level]
            model = (self.models_.get(prefix[0] if len(key) == 1 else prefix)
                     if level == len(key) else self.parent_models_.get(prefix))
            if model is not None:
                models.append(model)
                sizes.append(self.level_sizes_[prefix])
        if not models:
            return models, np.array([])
        return models, self.shrinkage_function_.for_chain(sizes, whose_chain(self.fallback, key))

    def _route(self, X: Any, method: str) -> np.ndarray:
        check_is_fitted(self, "models_")
        keys, features = split_X(self, X, fitting=False)
        if len(keys) == 0:  # as scikit-learn's check_array says it
            raise ValueError(f"Found array with 0 sample(s) (shape={np.shape(X)}) while a "
                             f"minimum of 1 is required by {type(self).__name__}.")
        X_feat = feature_input(features, self._as_frame)
        own = {encode_key(key_parts(k)): m for k, m in self.models_.items()}
        by_code = dict(own)
        by_code.update((encode_key(k), m) for k, m in self.parent_models_.items())
        by_code = TypedKeys(by_code)  # indexed once: each lookup linear in the columns
        shrinking = (self.shrinkage_function_ is not None
                     and method in ("predict", "predict_proba"))
        # the chain's levels are found as fitted, however the key is typed
        # (2 finds "2"'s models, as without shrinkage)
        fitted = TypedKeys({encode_key(k): k for k in self.level_sizes_}) if shrinking else None

        def as_fitted(parts: tuple) -> tuple:
            for level in range(len(parts), 0, -1):
                prefix = fitted.find(parts[:level])
                if prefix is not None:
                    return tuple(prefix) + parts[level:]
            return parts
        classes = self.classes_ if is_classifier(self.estimator) else None
        depth = keys.shape[1]

        def model_of(key: Hashable) -> tuple[Any, str] | None:
            parts = key_parts(key)
            if shrinking:
                models, weights = self._chain(as_fitted(tuple(plain_scalar(v) for v in parts)))
                return (Blend(models, weights, classes), "shrunk") if models else None
            for level in range(depth, 0, -1):  # one encoding: NaN finds NaN; 1.0 finds 1
                model = find_typed(by_code, parts[:level])
                if model is not None:
                    return model, "group" if level == depth else "parent"
            return None if self.fallback_ is None else (self.fallback_, "fallback")

        def call(model: Any, rows: np.ndarray) -> np.ndarray:
            return answer(model, method, X_feat.iloc[rows] if self._as_frame else X_feat[rows],
                          getattr(self, "classes_", None))

        positions = group_positions(keys)
        # a key typed otherwise than the fitted keys (a zone-aware datetime for
        # a naive one, a date for a datetime) finds no model of its own: its
        # rows would go to a parent or the fallback silently (as Store.predict)
        planned = [key_parts(key) for key in positions]
        own = TypedKeys(own)
        check_key_types(by_list(self.by), planned,
                        [i for i, parts in enumerate(planned) if own.find(parts) is None],
                        own, f"this fitted {type(self).__name__}")
        found = [model_of(key) for key in positions]
        unseen = [key for key, model in zip(positions, found) if model is None]
        if unseen:  # before any prediction
            raise ValueError(f"no model for group(s) {unseen[:5]!r} and fallback='error'")
        backend, workers = self._engine()
        backend, seconds = predict_backend(backend, workers, positions, found, call)
        if backend == "serial":
            return route_rows(positions, len(keys), model_of, call, found).values
        groups = EstimatorGroups([], method, getattr(self, "classes_", None), self._as_frame)
        return route_on_engine(positions, found, X_feat, groups, backend=backend,
                               workers=workers, seconds_per_group=seconds).values

    def predict(self, X: Any) -> np.ndarray:
        """Each row predicted by its group's model (or a parent's, or the
        fallback); with shrinkage, the weighted sum of its chain's predictions,
        or for a classifier the class of highest blended probability."""
        check_is_fitted(self, "models_")
        if self.shrinkage_function_ is not None and is_classifier(self.estimator):
            return self.classes_[np.argmax(self._route(X, "predict_proba"), axis=1)]
        return self._route(X, "predict")

    @available_if(_offers_predict_proba)
    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities, columns in the order of ``classes_``."""
        return self._route(X, "predict_proba")

    @available_if(_offers_predict_proba)
    def predict_log_proba(self, X: Any) -> np.ndarray:
        """The log of :meth:`predict_proba` (-inf for a class the row's model
        gives no probability), as scikit-learn's meta-estimators offer it:
        ``cross_val_score(scoring="neg_log_loss")`` and stacking call it."""
        with np.errstate(divide="ignore"):
            return np.log(self.predict_proba(X))

    @available_if(_offers_decision_function)
    def decision_function(self, X: Any) -> np.ndarray:
        """Each row's decision scores from its group's model: one column for two
        classes, else one per class of ``classes_`` (-inf for a class the
        group never saw)."""
        return self._route(X, "decision_function")

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy for classifiers, R^2 for regressors."""
        prediction = self.predict(X)
        if is_classifier(self.estimator):
            return float(accuracy_score(y, prediction, sample_weight=sample_weight))
        return float(r2_score(y, prediction, sample_weight=sample_weight))

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        if self.estimator is not None:
            inner = self.estimator.__sklearn_tags__()
            tags.estimator_type = inner.estimator_type
            tags.classifier_tags = inner.classifier_tags
            tags.regressor_tags = inner.regressor_tags
            tags.target_tags.required = True
            tags.input_tags.sparse = False
            tags.input_tags.allow_nan = inner.input_tags.allow_nan
        return tags


class GroupedRegressor(RegressorMixin, GroupedEstimator):
    """A :class:`GroupedEstimator` of regressors; refuses a classifier."""

    def _check_kind(self) -> None:
        if not is_regressor(self.estimator):
            raise ValueError(f"GroupedRegressor needs a regressor, got "
                             f"{type(self.estimator).__name__}; use GroupedClassifier")


class GroupedClassifier(ClassifierMixin, GroupedEstimator):
    """A :class:`GroupedEstimator` of classifiers; refuses a regressor."""

    def _check_kind(self) -> None:
        if not is_classifier(self.estimator):
            raise ValueError(f"GroupedClassifier needs a classifier, got "
                             f"{type(self.estimator).__name__}; use GroupedRegressor")
