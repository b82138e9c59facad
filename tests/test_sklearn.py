"""GroupedEstimator behaves as one scikit-learn estimator."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils.estimator_checks import check_estimator

from manymodels.sklearn import GroupedEstimator


@pytest.fixture
def grouped():
    rng = np.random.default_rng(7)
    n = 600
    frame = pd.DataFrame({"store": rng.choice(["a", "b", "c", "d"], n),
                          "x1": rng.normal(size=n), "x2": rng.normal(size=n)})
    slope = frame["store"].map({"a": 1.0, "b": 2.0, "c": -1.0, "d": 5.0})
    y = slope * frame["x1"] + 0.5 * frame["x2"] + rng.normal(scale=0.01, size=n)
    return frame, y.to_numpy()


@pytest.mark.parametrize("backend", ["serial", "threads", "processes"])
def test_predictions_equal_per_group_models_fitted_by_hand(grouped, backend):
    X, y = grouped
    estimator = GroupedEstimator(Ridge(alpha=0.5), by="store", backend=backend).fit(X, y)
    assert set(estimator.models_) == {"a", "b", "c", "d"}
    predicted = estimator.predict(X)
    for store in "abcd":
        rows = (X["store"] == store).to_numpy()
        by_hand = Ridge(alpha=0.5).fit(X.loc[rows, ["x1", "x2"]], y[rows])
        np.testing.assert_allclose(predicted[rows], by_hand.predict(X.loc[rows, ["x1", "x2"]]))
        np.testing.assert_allclose(estimator.models_[store].coef_, by_hand.coef_)
    assert estimator.score(X, y) > 0.99


def test_unseen_and_small_groups_use_the_fallback(grouped):
    X, y = grouped
    estimator = GroupedEstimator(LinearRegression(), by="store", min_group_size=1000,
                                 backend="threads")
    with pytest.raises(ValueError, match="no group could be fitted"):
        clone(estimator).set_params(fallback="error").fit(X, y)
    estimator.fit(X, y)  # every group is too small: all rows use the global model
    assert estimator.models_ == {}
    global_model = LinearRegression().fit(X[["x1", "x2"]], y)
    np.testing.assert_allclose(estimator.predict(X), global_model.predict(X[["x1", "x2"]]))

    estimator = GroupedEstimator(LinearRegression(), by="store", backend="threads").fit(X, y)
    new = pd.DataFrame({"store": ["zz", "a"], "x1": [1.0, 1.0], "x2": [0.0, 0.0]})
    predicted = estimator.predict(new)
    assert predicted[0] == pytest.approx(estimator.fallback_.predict(new[["x1", "x2"]])[0])
    assert predicted[1] == pytest.approx(1.0, abs=0.05)  # store a: slope 1

    strict = GroupedEstimator(LinearRegression(), by="store", fallback="error",
                              backend="threads").fit(X, y)
    with pytest.raises(ValueError, match=r"no model for group\(s\) \['zz'\]"):
        strict.predict(new)
    custom = GroupedEstimator(LinearRegression(), by="store", fallback=Ridge(alpha=1e6),
                              backend="threads").fit(X, y)
    expected = Ridge(alpha=1e6).fit(X[["x1", "x2"]], y).predict(new[["x1", "x2"]])[0]
    assert custom.predict(new)[0] == pytest.approx(expected)  # the given fallback


def test_classifier_probabilities_cover_every_class():
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"g": np.repeat(["p", "q"], 100), "x": rng.normal(size=200)})
    y = np.where(X["g"] == "p", (X["x"] > 0).astype(int), 2 * (X["x"] > 0.5).astype(int))
    estimator = GroupedEstimator(LogisticRegression(), by="g", backend="threads").fit(X, y)
    assert list(estimator.classes_) == [0, 1, 2]
    proba = estimator.predict_proba(X)
    assert proba.shape == (200, 3)
    np.testing.assert_allclose(proba.sum(axis=1), 1.0)
    assert (proba[X["g"] == "p", 2] == 0).all() and (proba[X["g"] == "q", 1] == 0).all()
    assert estimator.score(X, y) > 0.9


@pytest.mark.parametrize("labels", [["p", "q"], ["p", "q", "r"]])
def test_a_group_of_one_class_gives_it_all_whatever_its_models_columns(labels):
    # HistGradientBoosting fits one class as a binary model: two probability
    # columns for its one class (a shape error), and a decision score whose
    # sign says the other class (a wrong answer, roc_auc ranked it wrong)
    from sklearn.ensemble import HistGradientBoostingClassifier

    X = pd.DataFrame({"g": np.repeat(["a", "b"], 30), "x": np.tile(np.arange(30.0), 2)})
    y = np.array(labels * (30 // len(labels)) + ["q"] * 30)
    model = GroupedEstimator(HistGradientBoostingClassifier(max_iter=2), by="g",
                             backend="serial").fit(X, y)
    one = X["g"] == "b"
    proba = model.predict_proba(X)
    np.testing.assert_array_equal(proba[one], np.eye(len(labels))[[1] * 30])
    decision = model.decision_function(X)[one]
    assert (decision == np.inf).all() if len(labels) == 2 else (
        (decision[:, 1] == np.inf).all() and (decision[:, [0, 2]] == -np.inf).all())
    assert (model.predict(X)[one] == "q").all()


def test_clone_pipeline_and_grid_search(grouped):
    X, y = grouped
    estimator = GroupedEstimator(Ridge(), by="store", backend="threads")
    assert clone(estimator).get_params()["estimator__alpha"] == 1.0
    pipeline = make_pipeline(
        FunctionTransformer(lambda frame: frame.assign(x1=frame["x1"] * 2)),
        estimator)
    pipeline.fit(X, y)
    assert pipeline.score(X, y) > 0.99
    search = GridSearchCV(estimator, {"estimator__alpha": [0.01, 1000.0]}, cv=3)
    search.fit(X, y)
    assert search.best_params_ == {"estimator__alpha": 0.01}
    assert isinstance(search.best_estimator_, GroupedEstimator)


def test_bad_by_column_is_named(grouped):
    X, y = grouped
    with pytest.raises(ValueError, match="by column 'shop'"):
        GroupedEstimator(Ridge(), by="shop").fit(X, y)


#: The checks GroupedEstimator cannot pass, and why.
EXPECTED_FAILURES = {
    "check_classifiers_train": (
        "the check's X has only continuous columns, so with by=0 every row is a group "
        "of its own; one-row classifiers cannot fit, every row goes to the fallback, "
        "which lacks the by column as a feature, and accuracy stays under the check's 0.83"),
}
#: For a classifier: the sample-weight checks' few rows, grouped by a continuous
#: column, make groups of a repeated row, one class each, so every group's
#: LogisticRegression fails and fit raises (as it must when every group fails).
CLASSIFIER_FAILURES = {
    **EXPECTED_FAILURES,
    **dict.fromkeys(["check_sample_weights_shape", "check_sample_weights_not_overwritten",
                     "check_sample_weight_equivalence_on_dense_data"],
                    "every group of the check's data holds one class: every group fails"),
}


@pytest.mark.parametrize("inner, min_group_size", [(Ridge(), 1), (LogisticRegression(), 2)],
                         ids=["regressor", "classifier"])
def test_scikit_learn_check_estimator(inner, min_group_size):
    # The checks' X is continuous, so by=0 makes every row a group of its own.
    # A one-row group cannot fit a classifier: with min_group_size=2 those rows
    # go to the fallback by design, instead of every group failing (which raises).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_estimator(GroupedEstimator(inner, by=0, backend="serial",
                                         min_group_size=min_group_size),
                        expected_failed_checks=EXPECTED_FAILURES if min_group_size == 1
                        else CLASSIFIER_FAILURES)


def test_a_group_key_typed_otherwise_finds_its_model_and_no_rows_are_refused():
    """Fitted on integer keys, predicted with the same keys as floats (or on
    booleans, with 1 and 0): every row went to the global fallback."""
    frame = pd.DataFrame({"g": [1, 1, 1, 2, 2, 2], "x": [0.0, 1, 2, 0, 1, 2]})
    y = np.array([0.0, 1, 2, 0, 10, 20])
    model = GroupedEstimator(LinearRegression(), by="g").fit(frame, y)
    own = model.predict(frame)
    np.testing.assert_allclose(own, y, atol=1e-9)
    np.testing.assert_allclose(model.predict(frame.astype({"g": float})), own)
    booleans = GroupedEstimator(LinearRegression(), by="g").fit(
        frame.assign(g=frame["g"] == 2), y)
    np.testing.assert_allclose(booleans.predict(frame.assign(g=(frame["g"] == 2).astype(int))),
                               own, atol=1e-9)
    with pytest.raises(ValueError, match="Found array with 0 sample"):
        model.predict(frame.iloc[:0])  # it returned None


def test_sample_weight_reaches_each_groups_fit_and_the_fallback():
    frame = pd.DataFrame({"g": ["a"] * 4 + ["b"] * 4, "x": [0.0, 1, 2, 3] * 2})
    y = np.array([0.0, 1, 2, 30, 0, 2, 4, 6])
    weight = np.array([1.0, 1, 1, 0, 1, 1, 1, 1])  # the outlier of "a" weighs nothing
    model = GroupedEstimator(LinearRegression(), by="g").fit(frame, y, sample_weight=weight)
    np.testing.assert_allclose(model.models_["a"].coef_, [1.0], atol=1e-9)
    np.testing.assert_allclose(model.models_["b"].coef_, [2.0], atol=1e-9)
    by_hand = LinearRegression().fit(frame[["x"]], y, sample_weight=weight)
    np.testing.assert_allclose(model.fallback_.coef_, by_hand.coef_)

    class NoWeights(LinearRegression):
        def fit(self, X, y):
            return super().fit(X, y)

    with pytest.raises(TypeError, match="NoWeights.fit takes no sample_weight"):
        GroupedEstimator(NoWeights(), by="g").fit(frame, y, sample_weight=weight)
    with pytest.raises(ValueError, match="by column 'g' is a name, and X is an array"):
        model.predict(frame.to_numpy(dtype=object))


@pytest.mark.parametrize("fitted, asked", [("2", 2), (2, 2.0), (np.nan, float("nan"))])
def test_shrinkage_finds_each_level_however_its_key_is_typed(fitted, asked):
    """A key typed otherwise than in fit finds its group's model with
    shrinkage as without: the blend is the same as for the key as fitted."""
    from sklearn.linear_model import LinearRegression

    from manymodels.sklearn import GroupedRegressor

    X = pd.DataFrame({"c": ["N"] * 8, "city": pd.Series([1] * 4 + [fitted] * 4, dtype=object),
                      "p": [1.0, 2, 1, 2, 1, 2, 1, 2]})
    y = np.array([1.0, 2, 1, 2, 100, 200, 100, 200])
    model = GroupedRegressor(LinearRegression(), by=["c", "city"], shrinkage="equal",
                             backend="serial").fit(X, y)
    as_fitted = model.predict(X.iloc[[4]].reset_index(drop=True))
    other = pd.DataFrame({"c": ["N"], "city": pd.Series([asked], dtype=object), "p": [1.0]})
    np.testing.assert_allclose(model.predict(other), as_fitted)
    assert as_fitted[0] > 60  # the city's own model is in the blend (its slope 100)


def test_a_refit_keeps_no_attribute_of_the_fit_before():
    """Refitted on an array without shrinkage, the estimator no longer has
    the frame's feature names or the shrinkage factors of its first fit."""
    from manymodels.sklearn import GroupedRegressor

    frame = pd.DataFrame({"g": [0, 0, 0, 1, 1, 1], "p": [1.0, 2, 3, 1, 2, 3]})
    y = np.array([1.0, 2, 3, 2, 4, 6])
    model = GroupedRegressor(Ridge(), by="g", shrinkage="equal", backend="serial").fit(frame, y)
    assert hasattr(model, "feature_names_in_") and hasattr(model, "shrinkage_factors_")
    model.set_params(shrinkage=None, by=0).fit(frame.to_numpy(), y)
    assert not hasattr(model, "feature_names_in_") and not hasattr(model, "shrinkage_factors_")
    classifier = GroupedEstimator(LogisticRegression(), by="g", backend="serial")
    classifier.fit(frame, y > 2).set_params(estimator=Ridge()).fit(frame, y)
    assert not hasattr(classifier, "classes_")  # a regressor's fit has no classes



def test_feature_names_are_kept_only_when_every_column_name_is_text():
    """A frame with int column names gave ``feature_names_in_`` [0, 1];
    scikit-learn keeps names only when all are text (and refuses text and
    numbers mixed), and so does a grouped estimator now, as the model it
    wraps would."""
    from manymodels.sklearn import GroupedRegressor

    y = np.array([1.0, 2, 3, 2, 4, 6])
    numbered = pd.DataFrame({0: [0, 0, 0, 1, 1, 1], 1: [1.0, 2, 3, 1, 2, 3]})
    model = GroupedRegressor(LinearRegression(), by=0, backend="serial").fit(numbered, y)
    assert not hasattr(model, "feature_names_in_")
    assert not hasattr(LinearRegression().fit(numbered, y), "feature_names_in_")
    assert model.n_features_in_ == 2
    np.testing.assert_allclose(model.predict(numbered), y)

    named = numbered.rename(columns={0: "g", 1: "p"})
    model.set_params(by="g").fit(named, y)
    assert model.feature_names_in_.tolist() == ["g", "p"]
    with pytest.raises(TypeError, match="only supported if all input features have string"):
        model.fit(named.rename(columns={"p": 1}), y)

@pytest.mark.parametrize(("estimator", "fallback", "match"), [
    (Ridge, "global", "estimator must be a scikit-learn estimator"),
    (3, "global", "estimator must be a scikit-learn estimator"),
    # a transformer fitted every group, then predict raised a bare AttributeError
    (FunctionTransformer(), "global", "estimator FunctionTransformer has no predict"),
    (Ridge(), FunctionTransformer(), "fallback FunctionTransformer has no predict")],
    ids=["a class", "a number", "a transformer", "a transformer as fallback"])
def test_an_estimator_that_is_not_one_is_refused_by_name(estimator, fallback, match):
    frame = pd.DataFrame({"g": [0, 0, 1, 1], "p": [1.0, 2, 3, 4]})
    with pytest.raises(TypeError, match=match):
        GroupedEstimator(estimator, by="g", fallback=fallback,
                         backend="serial").fit(frame, np.arange(4.0))


def test_predict_names_the_columns_reordered_missing_or_unseen(grouped):
    """A model that reads an array (a pipeline whose first step drops the
    names) took reordered columns as they came: wrong predictions, no error;
    a missing column was refused by count, not by name."""
    X, y = grouped
    reads_an_array = make_pipeline(FunctionTransformer(lambda frame: np.asarray(frame, float)),
                                   Ridge())
    model = GroupedEstimator(reads_an_array, by="store", backend="serial").fit(X, y)
    with pytest.raises(ValueError, match="must be in the same order"):
        model.predict(X[["x2", "store", "x1"]])
    with pytest.raises(ValueError, match="seen at fit time, yet now missing:\n- x2"):
        model.predict(X[["store", "x1"]])
    with pytest.raises(ValueError, match="unseen at fit time:\n- z"):
        model.predict(X.rename(columns={"x2": "z"}))


def test_a_fallback_of_the_other_kind_is_refused_and_one_without_a_method_hides_it(grouped):
    """A regressor as a classifier's fallback gave its numbers as the classes
    of unseen groups' rows; a fallback without predict_proba let
    predict_proba fail only once a row reached it."""
    from sklearn.svm import LinearSVC

    X, y = grouped
    labels = y > 0
    with pytest.raises(ValueError, match="fallback Ridge is a regressor, and estimator "
                                         "LogisticRegression is not"):
        GroupedEstimator(LogisticRegression(), by="store", fallback=Ridge()).fit(X, labels)
    with pytest.raises(ValueError, match="fallback LogisticRegression is a classifier"):
        GroupedEstimator(Ridge(), by="store", fallback=LogisticRegression()).fit(X, y)
    model = GroupedEstimator(LogisticRegression(), by="store", fallback=LinearSVC(),
                             backend="serial").fit(X, labels)
    assert not hasattr(model, "predict_proba") and hasattr(model, "decision_function")
    unseen = X.head(2).assign(store="zz")
    assert model.predict(unseen).dtype == bool


def test_a_fit_that_raises_leaves_the_estimator_unfitted(grouped):
    """A fit that raised kept the attributes it had set (models_) and those
    of the fit before (fallback_): predict then answered from a stale
    fallback, or failed on a missing attribute."""
    from sklearn.exceptions import NotFittedError

    X, y = grouped
    model = GroupedEstimator(LinearRegression(), by="store", backend="serial").fit(X, y)
    with pytest.raises(ValueError, match="no group could be fitted"):
        model.set_params(min_group_size=10_000, fallback="error").fit(X, y)
    with pytest.raises(NotFittedError):
        model.predict(X)
    assert not [name for name in vars(model) if name.endswith("_")]
    one_class_each = np.where(X["store"] < "c", 0, 1)  # every group's fit fails
    classifier = GroupedEstimator(LogisticRegression(), by="store", backend="serial")
    with pytest.raises(RuntimeError, match="every group's fit failed"):
        classifier.fit(X, one_class_each)
    with pytest.raises(NotFittedError):
        classifier.predict(X)


def test_by_given_as_an_array_or_index_and_positions_that_are_no_integers(grouped):
    X, y = grouped
    as_list = GroupedEstimator(Ridge(), by=["store"], backend="serial").fit(X, y).predict(X)
    for by in (np.array(["store"]), pd.Index(["store"])):
        model = GroupedEstimator(Ridge(), by=by, backend="serial").fit(X, y)
        np.testing.assert_allclose(model.predict(X), as_list)
    array = X.to_numpy(dtype=object)
    for by in (True, 0.0):
        with pytest.raises(ValueError, match=f"by column {by!r} is not a column position"):
            GroupedEstimator(Ridge(), by=by, backend="serial").fit(array, y)
    with pytest.raises(ValueError, match="hierarchical must be True or False, got 'no'"):
        GroupedEstimator(Ridge(), by="store", hierarchical="no").fit(X, y)
    with pytest.raises(ValueError, match="min_group_size must be an integer >= 1, got True"):
        GroupedEstimator(Ridge(), by="store", min_group_size=True).fit(X, y)


@pytest.mark.skipif(not hasattr(Exception, "add_note"), reason="exception notes: Python 3.11")
def test_a_group_whose_predict_raises_in_the_caller_is_named(grouped):
    """Predicted in the caller, a group's failing model raised its own error
    with no word of which group's rows it was given."""
    X, y = grouped
    broken = X.assign(x1=np.where(X["store"] == "c", np.nan, X["x1"]))
    for backend in ("serial", None):  # None: a few groups are timed in the caller first
        model = GroupedEstimator(Ridge(), by="store", backend=backend).fit(X, y)
        with pytest.raises(ValueError, match="contains NaN") as raised:
            model.predict(broken)
        assert "(predicting the rows of group 'c')" in raised.value.__notes__


def test_predict_log_proba_is_offered_with_predict_proba():
    rng = np.random.default_rng(0)
    X = pd.DataFrame({"g": np.repeat(["p", "q"], 50), "x": rng.normal(size=100)})
    y = np.where(X["g"] == "p", (X["x"] > 0).astype(int), 2 * (X["x"] > 0).astype(int))
    estimator = GroupedEstimator(LogisticRegression(), by="g", backend="serial").fit(X, y)
    with np.errstate(divide="ignore"):
        np.testing.assert_allclose(estimator.predict_log_proba(X),
                                   np.log(estimator.predict_proba(X)))
    assert np.isneginf(estimator.predict_log_proba(X)[X["g"] == "p", 2]).all()
    assert not hasattr(GroupedEstimator(Ridge(), by="g"), "predict_log_proba")


def test_groups_fitted_on_forked_workers_draw_different_random_numbers():
    """random_state=None draws from NumPy's global state: each worker has its own."""
    from sklearn.ensemble import RandomForestRegressor

    X = pd.DataFrame({"g": np.repeat(np.arange(8), 5), "x": np.arange(40.0)})
    estimator = GroupedEstimator(RandomForestRegressor(n_estimators=1), by="g", workers=2,
                                 backend="processes").fit(X, np.arange(40.0))
    seeds = [model.estimators_[0].random_state for model in estimator.models_.values()]
    assert len(set(seeds)) == len(seeds)


class _Records(LinearRegression):
    """Records the fit parameters each clone got."""

    def fit(self, X, y, sample_weight=None, offset=None, tag=None):
        self.got_ = {"sample_weight": sample_weight, "offset": offset, "tag": tag}
        return super().fit(X, y, sample_weight=sample_weight)


@pytest.mark.parametrize("requested", [False, True])
def test_metadata_routing_honours_the_inner_fit_request(requested):
    """With routing on, the weights reached every group whatever the inner
    estimator's set_fit_request said, and a Pipeline was refused them. Not
    requested by the groups' estimator, they reach a fallback that asks."""
    import sklearn
    from sklearn.exceptions import UnsetMetadataPassedError

    frame = pd.DataFrame({"g": ["a"] * 4 + ["b"] * 4, "x": [0.0, 1, 2, 3] * 2})
    y = np.array([0.0, 1, 2, 30, 0, 2, 4, 6])
    weight = np.array([1.0, 1, 1, 0, 1, 1, 1, 1])
    offset = np.arange(8.0)
    with sklearn.config_context(enable_metadata_routing=True):
        inner = _Records().set_fit_request(sample_weight=requested, offset=True, tag=True)
        fallback = "global" if requested else _Records().set_fit_request(
            sample_weight=True, offset=True, tag=True)
        model = GroupedEstimator(inner, by="g", backend="serial", fallback=fallback).fit(
            frame, y, sample_weight=weight, offset=offset, tag="t")
        for key, rows in (("a", slice(0, 4)), ("b", slice(4, 8))):
            got = model.models_[key].got_
            np.testing.assert_array_equal(got["offset"], offset[rows])  # its own rows'
            assert got["tag"] == "t"
            if requested:
                np.testing.assert_array_equal(got["sample_weight"], weight[rows])
            else:
                assert got["sample_weight"] is None
        np.testing.assert_array_equal(model.fallback_.got_["offset"], offset)
        np.testing.assert_array_equal(model.fallback_.got_["sample_weight"], weight)
        piped = GroupedEstimator(make_pipeline(FunctionTransformer(), LinearRegression()
                                               .set_fit_request(sample_weight=requested)),
                                 by="g", backend="serial")
        if requested:
            piped.fit(frame, y, sample_weight=weight)
            np.testing.assert_allclose(piped.models_["a"][-1].coef_, [1.0], atol=1e-9)
        else:  # requested by none: scikit-learn's refusal, as its meta-estimators'
            with pytest.raises(TypeError, match="not routed to any object"):
                piped.fit(frame, y, sample_weight=weight)
        with pytest.raises(UnsetMetadataPassedError, match="offset"):
            GroupedEstimator(_Records(), by="g", backend="serial").fit(frame, y, offset=offset)
    with pytest.raises(ValueError, match="enable_metadata_routing=True.*offset"):
        GroupedEstimator(_Records(), by="g", backend="serial").fit(frame, y, offset=offset)
