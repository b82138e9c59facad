"""broom's ``glance`` row of every least-squares group at once: the fit
statistics of :func:`manymodels.glance` (and of R's ``summary.lm``,
``logLik``, ``AIC``, ``BIC``), as arrays from what the kernels return
(residual and total sums of squares, rank, rows, weights), with no Python
call per group.

``p`` is the rank of the design, the intercept's column included, as R's
``lm`` counts it (a collinear feature adds nothing); ``n`` the rows that
weigh something. Where a statistic has no value (a group without residual
degrees of freedom, a constant target, a perfect fit's log-likelihood) it is
NaN, as :func:`manymodels.glance` gives (the log-likelihood of a group
without residual degrees of freedom too: its RSS is rounding). The F test's upper tail is the
regularised incomplete beta function, computed here (NumPy only: SciPy is
not a dependency of ``mm.linear``).
"""

from __future__ import annotations

import math

import numpy as np

#: The columns added to a least-squares result's ``metrics``, in order.
GLANCE_COLUMNS = ("r_squared", "adj_r_squared", "sigma", "statistic", "p_value", "df",
                  "log_lik", "aic", "bic", "deviance", "df_residual", "nobs")


def glance_arrays(rss: np.ndarray, tss: np.ndarray, rank: np.ndarray, n: np.ndarray,
                  log_w: np.ndarray, fit_intercept: bool,
                  y_scale: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The :data:`GLANCE_COLUMNS` of each group from its residual (``rss``)
    and total (``tss``: about the mean with an intercept, else about 0)
    weighted sums of squares, its features' ``rank``, ``n`` rows that weigh
    something, and the sum of their weights' logarithms. ``y_scale``: the
    target's scale where the sums are those of a rescaled target (see
    :func:`.kernels.least_squares_in_range`): ``sigma`` and the
    log-likelihood are then taken from them without squaring the scale."""
    if y_scale is None:
        y_scale = np.ones(len(rss))
    i = int(fit_intercept)
    p = rank + i
    n = n.astype(np.int64)
    df_residual = n - p
    df_model = p - i
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        has_residual = df_residual > 0
        r2 = np.where(tss > 0, 1.0 - rss / tss, np.nan)
        adj = np.where(has_residual, 1.0 - (1.0 - r2) * (n - i) / df_residual, np.nan)
        mse = np.where(has_residual, rss / df_residual, np.nan)
        sigma = np.sqrt(mse) * y_scale
        tested = has_residual & (df_model > 0) & (rss > 0)
        statistic = np.where(tested, (tss - rss) / np.where(tested, df_model, 1) / mse, np.nan)
        # no residual degrees of freedom: a perfect fit by construction, whose
        # RSS is rounding (its log-likelihood would be noise): NaN, as for RSS 0
        log_lik = np.where((rss > 0) & has_residual,
                           -0.5 * n * (math.log(2 * math.pi) + np.log(rss / n)
                                       + 2.0 * np.log(y_scale) + 1.0)
                           + 0.5 * log_w, np.nan)
        log_n = np.log(np.where(n > 0, n, np.nan))
        # a sum of squares past float64's range (a target about 1e160) is
        # infinite, as documented: said by its value, not by a warning
        deviance = rss * y_scale * y_scale
    p_value = np.full(len(rss), np.nan)
    where = np.flatnonzero(tested & np.isfinite(statistic))
    if len(where):
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # unread elements
            p_value[where] = f_upper_tail(statistic[where], df_model[where], df_residual[where])
    return {"r_squared": r2, "adj_r_squared": adj, "sigma": sigma, "statistic": statistic,
            "p_value": p_value, "df": df_model, "log_lik": log_lik,
            "aic": -2.0 * log_lik + 2.0 * (p + 1), "bic": -2.0 * log_lik + log_n * (p + 1),
            "deviance": deviance, "df_residual": df_residual, "nobs": n}


def f_upper_tail(f: np.ndarray, d1: np.ndarray, d2: np.ndarray) -> np.ndarray:
    """``P(F > f)`` for F(``d1``, ``d2``): ``I_x(d2/2, d1/2)`` at
    ``x = d2 / (d2 + d1 f)`` (SciPy's ``stats.f.sf``). ``x`` and ``1 - x``
    are each computed from ``f`` (``1 - x`` taken from a rounded ``x`` near 1
    would keep few digits: at ``d2`` 1e7 the p-value was 1e-8 off)."""
    d1f = d1 * np.maximum(f, 0.0)
    total = d2 + d1f
    return regularized_beta(d2 / total, d2 / 2.0, d1 / 2.0, y=d1f / total)


def regularized_beta(x: np.ndarray, a: np.ndarray, b: np.ndarray,
                     y: np.ndarray | None = None) -> np.ndarray:
    """The regularised incomplete beta function ``I_x(a, b)``, element-wise:
    the continued fraction of Numerical Recipes' ``betai``, on whichever
    side converges (``x < (a + 1) / (a + b + 2)``: the small tail directly,
    to full relative precision). ``y``: ``1 - x`` where the caller has it
    to more digits than ``1 - x`` would keep. The factor in front of the
    fraction is :func:`_log_front`'s, which stays exact at any ``a``."""
    if y is None:
        y = 1.0 - np.asarray(x, dtype=np.float64)
    x, y, a, b = (np.asarray(v, dtype=np.float64)
                  for v in np.broadcast_arrays(x, y, a, b))
    out = np.where(x <= 0, 0.0, 1.0)
    inside = np.flatnonzero((x > 0) & (y > 0))
    if not len(inside):
        return out
    x, y, a, b = x[inside], y[inside], a[inside], b[inside]
    front = np.exp(_log_front(x, y, a, b))
    direct = x < (a + 1.0) / (a + b + 2.0)
    value = np.empty(len(inside))
    value[direct] = front[direct] * _in_chunks(x[direct], a[direct], b[direct]) / a[direct]
    flip = ~direct
    value[flip] = 1.0 - front[flip] * _in_chunks(y[flip], b[flip], a[flip]) / b[flip]
    out[inside] = value
    return out


def _log_front(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``log(x**a * y**b / B(a, b))`` (``y = 1 - x``), as Boost's
    ``ibeta_power_terms`` has it: with Stirling's series, the large terms
    of ``a log x`` and ``log B(a, b)`` cancel in closed form, leaving
    ``a log(x (a + b) / a)``, near 0 where the value is not negligible and
    taken there by ``log1p`` of ``(b x - a y) / a``. From ``lgamma`` the
    same sum loses ``a`` times the rounding (1e-8 relative at ``a`` 5e6)."""
    total = a + b
    return (_scaled_log(x, y, a, b) + _scaled_log(y, x, b, a)
            + 0.5 * np.log(a / total * b / (2.0 * math.pi))
            + _stirling_error(total) - _stirling_error(a) - _stirling_error(b))


def _scaled_log(x: np.ndarray, y: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a log(x (a + b) / a)``: by ``log1p`` of the difference from 1 where
    that is small (it cancels there), by ``log`` of the ratio elsewhere."""
    ratio = x * ((a + b) / a)
    near = np.abs(ratio - 1.0) < 0.5
    return a * np.where(near, np.log1p((b * x - a * y) / a), np.log(ratio))


#: Stirling's series of ``lgamma`` past its leading terms, from ``z`` = 10
#: on, where its first five terms are exact to rounding.
_STIRLING_FROM = 10.0
_STIRLING_TERMS = (1.0 / 12, -1.0 / 360, 1.0 / 1260, -1.0 / 1680, 1.0 / 1188)


def _stirling_error(z: np.ndarray) -> np.ndarray:
    """``lgamma(z) - ((z - 1/2) log z - z + log(2 pi) / 2)``: the series at
    ``z`` of 10 and more, ``lgamma`` itself below (small values: nothing
    there cancels)."""
    out = np.empty(z.shape)
    large = z >= _STIRLING_FROM
    w = 1.0 / z[large]
    w2, series = w * w, 0.0
    for term in reversed(_STIRLING_TERMS):
        series = series * w2 + term
    out[large] = series * w
    small = ~large
    if small.any():
        zs = z[small]
        out[small] = (_log_gamma(zs) - (zs - 0.5) * np.log(zs) + zs
                      - 0.5 * math.log(2.0 * math.pi))
    return out


def _log_gamma(values: np.ndarray) -> np.ndarray:
    """``math.lgamma`` of each element, called once per distinct value: a
    table of the half-integers a million groups' degrees of freedom give
    (no sort), or one sort of the values."""
    if not len(values):
        return np.empty(0)
    first = values.flat[0]
    if (values == first).all():
        return np.full(values.shape, math.lgamma(first))
    twice = values * 2.0
    if np.isfinite(twice).all() and twice.min() > 0 and twice.max() < 2e6:
        steps = twice.astype(np.int64)
        if (steps == twice).all():  # half-integers: a table from the smallest to the largest
            low = int(steps.min())
            present = np.flatnonzero(np.bincount(steps - low))
            table = np.zeros(int(steps.max()) - low + 1)
            table[present] = [math.lgamma((low + j) / 2.0) for j in present.tolist()]
            return table[steps - low]
    distinct, inverse = np.unique(values, return_inverse=True)
    return np.array([math.lgamma(v) for v in distinct.tolist()])[inverse.reshape(values.shape)]


#: Elements a continued fraction iterates together: its arrays stay in cache.
CHUNK = 16_384


def _in_chunks(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`_beta_fraction` of ``CHUNK`` elements at a time."""
    if len(x) <= CHUNK:
        return _beta_fraction(x, a, b)
    out = np.empty(len(x))
    for start in range(0, len(x), CHUNK):
        part = slice(start, start + CHUNK)
        out[part] = _beta_fraction(x[part], a[part], b[part])
    return out


def _beta_fraction(x: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The continued fraction of ``I_x(a, b)`` by the modified Lentz method,
    each element iterated until its factor is 1 to rounding (its value
    taken then). The elements still going are kept together in short arrays
    (no fancy indexing per step): an element done goes on being iterated,
    unread, until a quarter of them are done, when the arrays are cut down."""
    tiny, eps = 1e-300, 1e-15
    result = np.empty(len(x))
    where = np.arange(len(x))
    pending = np.ones(len(x), dtype=bool)  # not yet taken into result
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c = np.ones(len(x))
    d = 1.0 / _not_tiny(1.0 - qab * x / qap, tiny)
    h = d.copy()
    for m in range(1, 10_000):
        m2 = 2.0 * m
        step = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 / _not_tiny(1.0 + step * d, tiny)
        c = _not_tiny(1.0 + step / c, tiny)
        h *= d * c
        step = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 / _not_tiny(1.0 + step * d, tiny)
        c = _not_tiny(1.0 + step / c, tiny)
        delta = d * c
        h *= delta
        done = pending & (np.abs(delta - 1.0) <= eps)
        if done.any():
            result[where[done]] = h[done]
            pending &= ~done
            left = np.count_nonzero(pending)
            if not left:
                return result
            if left <= 0.75 * len(pending):
                where, x, a, b, qab, qap, qam, c, d, h = (
                    v[pending] for v in (where, x, a, b, qab, qap, qam, c, d, h))
                pending = np.ones(left, dtype=bool)
    result[where[pending]] = h[pending]
    return result


def _not_tiny(values: np.ndarray, tiny: float) -> np.ndarray:
    return np.where(np.abs(values) < tiny, tiny, values)
