"""In-sample fit statistics of a linear regression, as R's ``broom::glance``.

R users fitting "many models" get every fit statistic of an ``lm`` from
``broom::glance``; here ``fit`` returns them as its metrics without writing
them by hand::

    def fit(df):
        model = LinearRegression().fit(df[["year"]], df["life_exp"])
        return model, mm.glance(model, df[["year"]], df["life_exp"])

The names are broom's, in snake case, and so are the formulas (those of R's
``summary.lm``, ``logLik.lm``, ``AIC`` and ``BIC``): ``p`` coefficients
(the intercept included; a penalised model's zero coefficients left out:
the model's rank for least squares, the usual degrees of freedom for the
lasso), ``n`` rows, ``RSS`` the residual sum of squares. ``p`` is the rank of
the design matrix (the intercept's column of ones and the columns of ``X``,
centred where there is an intercept, as the model fitted them;
for a penalised model, one with an ``alpha``, those whose coefficient is
not zero), as R's ``lm`` counts it: a duplicated or otherwise collinear feature,
which ``LinearRegression`` splits into a least-norm pair of coefficients and R
reports as ``NA``, adds no degree of freedom.

==================  ===============================================================
``r_squared``       ``1 - RSS / TSS`` (TSS about the mean; about 0 without intercept)
``adj_r_squared``   ``1 - (1 - r2) (n - i) / (n - p)``, ``i`` 1 with an intercept
``sigma``           ``sqrt(RSS / (n - p))``, the residual standard error
``statistic``       the F statistic, ``((TSS - RSS) / (p - i)) / (RSS / (n - p))``
``p_value``         its upper tail probability, F(p - i, n - p)
``df``              ``p - i``, the model's degrees of freedom
``log_lik``         ``-n/2 (log(2 pi) + log(RSS / n) + 1)``, Gaussian errors
``aic``, ``bic``    ``-2 log_lik + k (p + 1)``, ``k`` 2 or ``log(n)`` (``+ 1``: sigma)
``deviance``        ``RSS``
``df_residual``     ``n - p``
``nobs``            ``n``
==================  ===============================================================

A statistic without a value is NaN: ``r_squared`` of a constant target,
``adj_r_squared``, ``sigma``, F and its p-value without residual degrees of
freedom (``n <= p``), and ``log_lik``, AIC and BIC where RSS is 0 or there are
no residual degrees of freedom, penalised or not (unpenalised, an
interpolating fit, whose RSS is rounding: its log-likelihood would be
noise), as :func:`manymodels.linear` gives them.

Given ``sample_weight`` (the fit's weights: a model does not keep them),
the statistics are those of R's ``lm(..., weights=)``: weighted sums of
squares, ``log_lik`` plus half the sum of the weights' logarithms, ``n``
the rows of weight above 0; without it they are unweighted.

For a penalised model (ridge, lasso) they are the same formulas at its
coefficients, as ``glance`` of a ``glmnet`` fit would not give: read them as
descriptive. (statsmodels' ``OLS`` AIC and BIC leave sigma out of the count:
they are 2 and ``log(n)`` lower than R's and these.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def _coefficients(model: Any) -> tuple[np.ndarray, bool]:
    """The model's coefficients, and whether it has an intercept."""
    coef = getattr(model, "coef_", None)
    if coef is None or getattr(model, "classes_", None) is not None:
        raise TypeError("glance needs a fitted linear regression (a model with coef_, such "
                        f"as LinearRegression or Ridge), got {type(model).__name__}")
    coef = np.asarray(coef, dtype=float)
    if coef.ndim > 1 and coef.shape[0] != 1:
        raise ValueError(f"glance describes one target; the model has {coef.shape[0]}")
    intercept = bool(getattr(model, "fit_intercept", True)) and (
        getattr(model, "intercept_", None) is not None)
    return coef.ravel(), intercept


def _rank(X: Any, coef: np.ndarray, intercept: bool, penalised: bool) -> int:
    """The rank of the design matrix: the columns of ``X`` (of a penalised
    model, those whose coefficient is not zero: the lasso's degrees of
    freedom), and a column of ones for the intercept. Counting coefficients
    instead would count a collinear feature's share of a split coefficient;
    an unpenalised fit counts every column, as R's ``lm`` does, even where
    its coefficients are all zero (a target of zeros). With an intercept the
    rank is 1 and that of the centred columns, as the model fitted them (and
    :func:`manymodels.linear` counts): the column of ones beside a feature
    of ``1e12 + noise``, uncentred, are parallel to rounding, and the slope
    the model fitted counted for nothing."""
    import scipy.sparse

    if not scipy.sparse.issparse(X):
        X = np.asarray(X, dtype=float)
        if X.ndim == 1:
            X = X.reshape(-1, 1)
    if X.ndim != 2 or X.shape[1] != len(coef):
        raise ValueError(f"X has {X.shape[1] if X.ndim == 2 else 'no'} columns but the model "
                         f"has {len(coef)} coefficients: pass the X it was fitted on")
    active = X[:, np.flatnonzero(coef)] if penalised else X
    active = active.toarray() if scipy.sparse.issparse(active) else active
    if intercept:
        active = active - active.mean(axis=0)
    return int(intercept) + (int(np.linalg.matrix_rank(active)) if active.size else 0)


def _flat_target(rss: float, tss: float, spread: float, n: float, mean: float,
                 intercept: bool) -> tuple[float, float]:
    """A constant target's sums of squares as the zeros they are, by
    :func:`manymodels.linear`'s rule (``n``: the rows' total weight): its
    spread about its mean is the mean's rounding (0.1 seven times: 1e-33),
    which made ``r_squared`` 0, the p-value 1 and the log-likelihood +262
    where they have no value."""
    rounding = n * (64 * np.finfo(np.float64).eps * mean) ** 2
    if spread > rounding:
        return rss, tss
    return (0.0 if rss <= rounding else rss), (0.0 if intercept else tss)


def _weights(sample_weight: Any, n: int) -> np.ndarray | None:
    """``sample_weight`` checked (one finite weight >= 0 a row, not all 0),
    naming the argument; None for none."""
    if sample_weight is None:
        return None
    weights = np.asarray(sample_weight, dtype=float).ravel()
    if len(weights) != n:
        raise ValueError(f"glance: sample_weight has {len(weights)} values but y has {n} rows")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError("glance: sample_weight must be finite and >= 0 (the weights the "
                         "model was fitted with)")
    if not np.any(weights > 0):
        raise ValueError("glance: every sample_weight is 0: no row weighs anything")
    return weights


def _weighed_rows(X: Any, weights: np.ndarray | None) -> Any:
    """``X``'s rows that weigh something, as the rank counts them (R's ``lm``
    drops a row of weight 0)."""
    if weights is None or np.all(weights > 0):
        return X
    import scipy.sparse

    kept = weights > 0
    return X[kept] if scipy.sparse.issparse(X) else np.asarray(X, dtype=float)[kept]


def glance(model: Any, X: Any, y: Any, sample_weight: Any = None) -> dict[str, float]:
    """broom's ``glance`` of a fitted linear regression on the rows ``X, y`` it
    was fitted on: a dict of plain floats (``nobs``, ``df``, ``df_residual``
    ints), ready to be ``fit``'s metrics. See the module's table.

    ``sample_weight``: the weights the model was fitted with (a model does
    not keep them): the statistics are then R's ``lm(..., weights=)`` ones
    (weighted sums of squares, the weights' log-likelihood term, rows of
    weight 0 left out of ``nobs``). Without it they are unweighted, whatever
    the fit was."""
    from scipy import stats

    coef, intercept = _coefficients(model)
    y = np.asarray(y, dtype=float).ravel()
    if len(y) == 0:
        raise ValueError("glance needs at least one row")
    unusable = int(np.count_nonzero(~np.isfinite(y)))
    if unusable:  # (every statistic came back NaN, beside nobs and df counting those rows)
        raise ValueError(f"glance: y has {unusable} missing or infinite value(s): pass the "
                         "rows the model was fitted on")
    weights = _weights(sample_weight, len(y))
    fitted = np.asarray(model.predict(X), dtype=float).ravel()
    if len(fitted) != len(y):
        raise ValueError(f"X has {len(fitted)} rows but y has {len(y)}")
    penalised = any(hasattr(model, name) for name in ("alpha", "alpha_", "C", "l1_ratio",
                                                      "n_nonzero_coefs"))
    p = _rank(_weighed_rows(X, weights), coef, intercept, penalised)
    if weights is not None:  # (a row of weight 0 is no observation: R's nobs)
        kept = weights > 0
        y, fitted, weights = y[kept], fitted[kept], weights[kept]
    w = np.ones(len(y)) if weights is None else weights
    n = len(y)
    i = int(intercept)
    mean = float(np.sum(w * y) / np.sum(w))
    rss = float(np.sum(w * (y - fitted) ** 2))
    spread = float(np.sum(w * (y - mean) ** 2))
    tss = spread if intercept else float(np.sum(w * y ** 2))
    rss, tss = _flat_target(rss, tss, spread, float(np.sum(w)), mean, intercept)
    df_residual = n - p
    r2 = 1.0 - rss / tss if tss > 0 else math.nan
    nan = math.nan
    adj = 1.0 - (1.0 - r2) * (n - i) / df_residual if df_residual > 0 else nan
    sigma = math.sqrt(rss / df_residual) if df_residual > 0 else nan
    df_model = p - i
    if df_model > 0 and df_residual > 0 and rss > 0:
        statistic = ((tss - rss) / df_model) / (rss / df_residual)
        p_value = float(stats.f.sf(statistic, df_model, df_residual))
    else:
        statistic = p_value = nan
    # no residual degrees of freedom: a perfect fit by construction whose RSS is
    # rounding (1e-31: a log-likelihood of +67 from noise), as mm.linear has it
    # (R's logLik.lm: the weights add half their logarithms' sum)
    log_lik = (-0.5 * n * (math.log(2 * math.pi) + math.log(rss / n) + 1)
               + 0.5 * float(np.sum(np.log(w)))
               if rss > 0 and df_residual > 0 else nan)
    return {"r_squared": r2, "adj_r_squared": adj, "sigma": sigma, "statistic": statistic,
            "p_value": p_value, "df": df_model, "log_lik": log_lik,
            "aic": -2 * log_lik + 2 * (p + 1), "bic": -2 * log_lik + math.log(n) * (p + 1),
            "deviance": rss, "df_residual": df_residual, "nobs": n}
