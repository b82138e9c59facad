"""NumPy kernels: one block of groups, every group's model at once.

Each function takes dense ``(groups, rows, features)`` arrays (padded rows
carry weight 0) and returns per-group arrays. The loops below run over
features or Newton iterations, never over groups.

Least squares follows scikit-learn: with an intercept the rows are centred
on their (weighted) means, the intercept is not penalised, and ridge adds
``alpha`` to the diagonal of the centred ``X'WX``. Well-conditioned groups are
solved by a batched Cholesky of the normal equations; a group whose pivot
says it is (nearly) rank-deficient, or too small, is solved again from its
rows by a batched SVD, which gives the least-norm solution as
``LinearRegression`` (LAPACK ``gelsd``) does, and the group's status says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: A Cholesky pivot below this fraction of its diagonal sends the group to the SVD.
PIVOT_TOLERANCE = 1e-8


def cholesky_solve(A: np.ndarray, b: np.ndarray, floor: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Solve ``A x = b`` for a stack ``A`` (g, q, q) of symmetric matrices;
    also return which were safely positive definite (the others' x is junk).

    A pivot must exceed :data:`PIVOT_TOLERANCE` of its diagonal and, where
    given, each group's absolute ``floor`` (see :func:`pivot_floor`): the
    relative test alone passes a column that centring reduced to rounding
    noise, whose diagonal is that noise too."""
    g, q, _ = A.shape
    L = np.zeros_like(A)
    ok = np.ones(g, dtype=bool)
    for j in range(q):
        pivot = A[:, j, j] - np.einsum("gk,gk->g", L[:, j, :j], L[:, j, :j])
        good = pivot > PIVOT_TOLERANCE * np.abs(A[:, j, j])
        if floor is not None:
            good &= pivot > floor
        ok &= good
        d = np.sqrt(np.where(good, pivot, 1.0))
        L[:, j, j] = d
        if j + 1 < q:
            L[:, j + 1:, j] = (A[:, j + 1:, j] - np.einsum("gik,gk->gi", L[:, j + 1:, :j],
                                                           L[:, j, :j])) / d[:, None]
    z = np.empty_like(b)
    for i in range(q):
        z[:, i] = (b[:, i] - np.einsum("gk,gk->g", L[:, i, :i], z[:, :i])) / L[:, i, i]
    x = np.empty_like(b)
    for i in range(q - 1, -1, -1):
        x[:, i] = (z[:, i] - np.einsum("gk,gk->g", L[:, i + 1:, i], x[:, i + 1:])) / L[:, i, i]
    return x, ok


def pivot_floor(gram_trace: np.ndarray, rows: int, features: int) -> np.ndarray:
    """Each group's absolute floor for a Cholesky pivot of its (centred)
    ``X'WX``: the square of :func:`_least_norm`'s singular-value cutoff,
    ``eps * max(rows, features)`` times the norm of the *uncentred* weighted
    features (``gram_trace``: their sum of squares). A column constant in its
    group (2.99 in every row, or 1.0 under weights) is centred to rounding
    noise of about ``eps`` times its value; its diagonal is that noise
    squared, which the relative test compares with itself and passes, and
    its coefficient came out as noise over noise. Below the floor the group
    goes to the SVD, which drops the same column by the same cutoff (a pivot
    is at least the smallest singular value squared), as scikit-learn's
    least-norm ``lstsq`` gives it 0."""
    eps = np.finfo(np.float64).eps * max(rows, features)
    return eps * eps * gram_trace


def _weighted_means(Z: np.ndarray, w: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Each group's total weight and (weighted) column means."""
    if w is None:
        return np.full(Z.shape[0], float(Z.shape[1])), Z.mean(axis=1)
    sw = w.sum(axis=1)
    safe = np.where(sw > 0, sw, 1.0)
    return sw, np.einsum("gm,gmq->gq", w, Z) / safe[:, None]


def least_squares(Z: np.ndarray, w: np.ndarray | None, alpha: np.ndarray | float,
                  fit_intercept: bool) -> dict[str, np.ndarray]:
    """OLS, WLS or ridge for every group of a block (``Z``: the features, then
    the target): coefficients, intercept, rank-deficiency flag, and in-sample
    SSE and SST from the residuals."""
    g, m, q = Z.shape
    p = q - 1
    sw, means = _weighted_means(Z, w)
    Zc = Z - means[:, None, :] if fit_intercept else Z
    Zw = Zc if w is None else Zc * w[:, :, None]
    M = Zw.transpose(0, 2, 1) @ Zc  # X'WX, X'Wy and y'Wy of every group at once
    A, b = M[:, :p, :p].copy(), M[:, :p, p].copy()
    penalty = ridge_penalty(alpha, g, p)
    gram_trace = uncentred_trace(M[:, :p, :p], sw, means[:, :p], fit_intercept)
    A[:, np.arange(p), np.arange(p)] += penalty
    floor = pivot_floor(gram_trace, m, p)
    coef, ok = cholesky_solve(A, b, floor)
    ok &= sw > 0
    rank = np.full(g, p, dtype=np.int64)  # of the features' columns (centred, if so fitted)
    redo = np.flatnonzero(~ok)
    if len(redo):
        rows = np.full(len(redo), m) if w is None else (w[redo] > 0).sum(axis=1)
        coef[redo], rank[redo] = _least_norm(
            Zc[redo, :, :p], Zc[redo, :, p], None if w is None else w[redo], penalty[redo],
            np.sqrt(gram_trace[redo]), rows - int(fit_intercept))
    rank_deficient = rank < p  # the least-norm solution was taken (never for ridge)
    penalised = np.flatnonzero((penalty > 0).any(axis=1))
    if len(penalised):  # ridge is always solvable; glance's rank is its design's, unpenalised
        rank[penalised] = design_rank(M[penalised, :p, :p], floor[penalised])
    xm, ym = means[:, :p], means[:, p]
    intercept = ym - np.einsum("gp,gp->g", xm, coef) if fit_intercept else np.zeros(g)
    if fit_intercept:
        sst = M[:, p, p]
    else:
        spread = Z[:, :, p] - ym[:, None]
        sst = (spread * spread).sum(axis=1) if w is None else np.einsum("gm,gm,gm->g", w,
                                                                        spread, spread)
    sse = _sse(Zc, w, M, coef)
    # glance's TSS: about the mean with an intercept, about 0 without (R's)
    sst, tss, sse = flat_target(sst, M[:, p, p], sse, sw, ym, fit_intercept, np.where)
    return {"coef": coef, "intercept": intercept, "rank_deficient": rank_deficient, "rank": rank,
            "sse": sse, "sst": sst, "tss": tss, "sw": sw, **_row_counts(w, g, m)}


def uncentred_trace(gram: Any, sw: Any, feature_means: Any, fit_intercept: bool) -> Any:
    """Each group's weighted sum of squares of its *uncentred* features, from
    its ``X'WX`` (centred if ``fit_intercept``: ``sum w x^2`` is the centred
    sum plus ``sw * mean^2``), with no pass over the rows. NumPy arrays or
    PyTorch tensors."""
    trace = gram.diagonal(0, 1, 2).sum(-1)
    if fit_intercept:
        trace = trace + sw * (feature_means * feature_means).sum(-1)
    return trace


def ridge_penalty(alpha: np.ndarray | float, g: int, p: int) -> np.ndarray:
    """What ridge adds to each group's diagonal, ``(g, p)``: ``alpha`` is one
    value, one per group, or one per group and feature (a rescaled group's,
    see :func:`least_squares_in_range`)."""
    alpha = np.asarray(alpha, dtype=np.float64)
    return np.broadcast_to(alpha[:, None] if alpha.ndim == 1 else alpha, (g, p))


#: A column whose largest magnitude lies beyond ``2 ** ±SAFE_EXPONENT`` is
#: rescaled: its squares would overflow float64 (1e160 squared) or vanish
#: (1e-170 squared).
SAFE_EXPONENT = 250


def least_squares_in_range(solve: Any, Z: np.ndarray, w: np.ndarray | None,
                           alpha: np.ndarray | float, fit_intercept: bool,
                           **on: Any) -> dict[str, np.ndarray]:
    """``solve`` (an engine's ``least_squares``) on a block, with every group
    whose sums of squares overflowed or vanished solved again with its
    columns scaled by powers of two (exact: the same answer to rounding, where
    unscaled it was a 0 coefficient marked ``rank_deficient``, or infinite
    sums of squares with status ``ok``).

    Only the groups the first solve could not answer are looked at (those it
    marked rank-deficient, whose sums are not finite, or whose target's
    spread is 0): the others pay nothing. A rescaled group's ridge penalty
    is rescaled with its columns, so that it is still ``alpha`` on the
    coefficients as given. Its sums of
    squares stay in the scaled target's units: ``y_scale`` (1 elsewhere) is
    the factor that gives them back (``sse * y_scale ** 2``), which can
    overflow where a ratio of them (``r2``) does not."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # solved again below
        out = solve(Z, w, alpha, fit_intercept, **on)
    g, _, q = Z.shape
    p = q - 1
    out["y_scale"] = np.ones(g)
    suspect = np.flatnonzero(out["rank_deficient"] | ~np.isfinite(out["sse"])
                             | ~(out["sst"] > 0))
    if not len(suspect):
        return out
    peaks = np.abs(Z[suspect]).max(axis=1)  # (groups, columns)
    with np.errstate(divide="ignore"):
        exponents = np.where(peaks > 0, np.round(np.log2(np.where(peaks > 0, peaks, 1.0))), 0.0)
    redo = (np.abs(exponents) > SAFE_EXPONENT).any(axis=1) & np.isfinite(peaks).all(axis=1)
    if not redo.any():
        return out
    at, exponents = suspect[redo], exponents[redo]
    penalty = ridge_penalty(alpha, g, p)[at]
    scaled_alpha: np.ndarray | float = 0.0
    if penalty.any():
        scaled_alpha = _scaled_penalty(penalty, exponents[:, :p])
    scales = np.exp2(exponents)
    again = solve(Z[at] / scales[:, None, :], None if w is None else w[at], scaled_alpha,
                  fit_intercept, **on)
    y_scale = scales[:, p]
    again["coef"] = again["coef"] * (y_scale[:, None] / scales[:, :p])
    again["intercept"] = again["intercept"] * y_scale
    for name, values in again.items():
        out[name][at] = values
    out["y_scale"][at] = y_scale
    return out


def _scaled_penalty(penalty: np.ndarray, exponents: np.ndarray) -> np.ndarray:
    """Ridge's penalty on the coefficients of columns scaled by ``2 **
    exponents`` (``penalty / scale ** 2``, exact in powers of two), the
    exponents of a column whose scaled penalty would leave float64's range
    set to 0 in place: that column is solved as it is. Its penalty dwarfs
    its own sum of squares (a feature about 1e-170 beside ``alpha`` 1: 1e-340
    against 1), which unscaled is lost to rounding without changing the
    answer; scaled, the penalty was infinite and the solve failed (NumPy's
    SVD 'did not converge', every group of the call lost). A huge column's
    scaled penalty is a negligible 0, as it should be, without a warning."""
    with np.errstate(over="ignore", under="ignore"):
        scaled = np.ldexp(penalty, (-2 * exponents).astype(np.int32))
    unscaled = ~np.isfinite(scaled)
    exponents[unscaled] = 0.0
    return np.where(unscaled, penalty, scaled)


def flat_target(sst: Any, tss: Any, sse: Any, sw: Any, ym: Any, fit_intercept: bool,
                where: Any) -> tuple[Any, Any, Any]:
    """A constant target's sums of squares as the zeros they are: its spread
    about its mean is the mean's rounding (a tiny positive SST made r2 0
    where scikit-learn's is 1, and ``r_squared`` 0 with a p-value of 1 where
    it is undefined). ``where``: ``np.where`` or ``torch.where``."""
    rounding = sw * (64 * np.finfo(np.float64).eps * ym) ** 2
    flat = sst <= rounding
    sst = where(flat, 0.0 * sst, sst)
    if fit_intercept:  # (about 0, without an intercept, it is no rounding)
        tss = where(flat, 0.0 * tss, tss)
    sse = where(flat & (sse <= rounding), 0.0 * sse, sse)
    return sst, tss, sse


def _row_counts(w: np.ndarray | None, g: int, m: int) -> dict[str, np.ndarray]:
    """Each group's rows that weigh something (``nobs``, as R counts a
    weighted ``lm``'s) and the sum of their weights' logarithms (the
    log-likelihood's term for weights; 0 unweighted: a padded block's
    weights are 0 and 1)."""
    if w is None:
        return {"n": np.full(g, m, dtype=np.int64), "log_w": np.zeros(g)}
    positive = w > 0
    n = positive.sum(axis=1)
    if ((w == 0) | (w == 1)).all():  # weights 0 and 1 only (padding): no log needed
        return {"n": n, "log_w": np.zeros(g)}
    return {"n": n, "log_w": np.log(np.where(positive, w, 1.0)).sum(axis=1)}


def design_rank(gram: np.ndarray, floor: np.ndarray) -> np.ndarray:
    """The rank of each group's design from its ``X'WX`` (g, p, p): the
    eigenvalues of its correlation form (each column scaled to unit length)
    above :data:`PIVOT_TOLERANCE` of the largest, as the Cholesky's rule
    judges a pivot against its own diagonal. Scaled, the rank does not
    depend on the features' units: unscaled, a rate about 0.05 beside an
    income about 5e4 (eigenvalues 1e11 apart) counted for nothing, and
    ridge's ``df``, ``sigma`` and F were those of a model without it. A
    column whose diagonal is below ``floor`` (:func:`pivot_floor`: constant
    in its group, centred to rounding noise) counts for nothing."""
    if gram.shape[1] == 0:
        return np.zeros(gram.shape[0], dtype=np.int64)
    diagonal = gram.diagonal(0, 1, 2)
    kept = diagonal > np.asarray(floor)[:, None]
    scale = np.where(kept, 1.0 / np.sqrt(np.where(kept, diagonal, 1.0)), 0.0)
    eig = np.linalg.eigvalsh(gram * scale[:, :, None] * scale[:, None, :])
    top = eig[:, -1:]
    return ((eig > PIVOT_TOLERANCE * top) & (top > 0)).sum(axis=1)


#: The normal equations' SSE is kept where it is above this fraction of the
#: square of its terms' size: its rounding (``eps`` of that size) is then
#: below ``2e-11`` of it, well inside the 1e-9 the glance statistics promise.
SSE_CANCELLATION = 1e-5


def _sse(Zc: np.ndarray, w: np.ndarray | None, M: np.ndarray, coef: np.ndarray
         ) -> np.ndarray:
    """Each group's weighted sum of squared residuals. From the normal
    equations, ``y'y - 2 b'X'y + b'X'X b``, with no pass over the rows (a
    pass costs about as much as the whole solve). Its rounding is about
    ``eps`` times the size of its terms, at most ``(|y| + sum_j |b_j| |x_j|)^2``
    (Cauchy-Schwarz on each); where the sum cancels to less than
    :data:`SSE_CANCELLATION` of that, it would have few correct digits, and
    it is taken from the residuals themselves: a near-perfect fit (a small
    SSE), and a near-collinear group, whose large coefficients of opposite
    signs made terms of 1e13 for an SSE of 7.5 (its deviance 7.5515 where
    statsmodels' is 7.5460). A well-conditioned group's terms are a few times
    ``y'y``: it keeps the normal equations' value."""
    p = coef.shape[1]
    yy = M[:, p, p]
    gram = M[:, :p, :p]
    sse = yy - 2.0 * np.einsum("gp,gp->g", M[:, :p, p], coef) + np.einsum(
        "gi,gij,gj->g", coef, gram, coef)
    norms = np.sqrt(np.maximum(gram.diagonal(0, 1, 2), 0.0))
    terms = np.sqrt(np.maximum(yy, 0.0)) + np.einsum("gp,gp->g", np.abs(coef), norms)
    near = np.flatnonzero(~(sse > SSE_CANCELLATION * terms * terms))
    if len(near):
        Zn = Zc[near]
        direction = np.concatenate([-coef[near], np.ones((len(near), 1))], axis=1)
        residual = (Zn @ direction[:, :, None])[:, :, 0]
        weight = np.ones_like(residual) if w is None else w[near]
        sse[near] = np.einsum("gm,gm,gm->g", weight, residual, residual)
    return sse


def _least_norm(Xc: np.ndarray, yc: np.ndarray, w: np.ndarray | None, alpha: np.ndarray,
                scale: np.ndarray, most: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least-norm solution of each group's (weighted, ridge-augmented by
    ``alpha``, ``(g, p)``) least squares by a batched SVD, and its rank (the
    singular values kept).

    A singular value counts when it exceeds the rounding of the *uncentred*
    rows (``scale``, their norm: centring rows far from zero leaves noise of
    that size) and is among the ``most`` largest (the rank that the group's
    rows allow: one less than their number after centring). Without these two
    rules a two-row group's answer is rounding noise, as LAPACK's is."""
    g, m, p = Xc.shape
    if w is not None:
        root = np.sqrt(w)
        Xc, yc = Xc * root[:, :, None], yc * root
    ridge = (alpha > 0).any(axis=1)  # the sqrt(alpha) rows give full rank
    if ridge.any():  # ridge as least squares on rows sqrt(alpha) * I
        eye = np.sqrt(alpha)[:, :, None] * np.eye(p)[None]
        Xc = np.concatenate([Xc, eye], axis=1)
        yc = np.concatenate([yc, np.zeros((g, p))], axis=1)
    U, s, Vt = np.linalg.svd(Xc, full_matrices=False)
    eps = np.finfo(np.float64).eps * max(Xc.shape[1], p)
    cutoff = eps * np.maximum(s[:, 0], np.where(ridge, 0.0, scale))
    keep = s > cutoff[:, None]
    keep &= ridge[:, None] | (np.arange(s.shape[1])[None, :] < most[:, None])
    inverse = np.where(keep, 1.0 / np.where(keep, s, 1.0), 0.0)
    projected = np.einsum("gmk,gm->gk", U, yc) * inverse
    coef = np.einsum("gkp,gk->gp", Vt, projected)
    return coef, keep.sum(axis=1)


def _log_loss_sum(eta: np.ndarray, y: np.ndarray, w: np.ndarray | None) -> np.ndarray:
    """Each group's sum of (weighted) log-losses ``log(1 + e^eta) - y * eta``.
    Unweighted, the logarithm of a product: one ``log`` per group, not per
    row (each factor lies in (1, 2], so 1,000 rows cannot overflow)."""
    linear = np.maximum(eta, 0.0) - y * eta
    tail = 1.0 + np.exp(-np.abs(eta))
    if w is None and eta.shape[1] <= 1000:
        return linear.sum(axis=1) + np.log(tail.prod(axis=1))
    if w is None:
        return (linear + np.log(tail)).sum(axis=1)
    return np.einsum("gm,gm->g", w, linear + np.log(tail))


def _objective(eta: np.ndarray, y: np.ndarray, w: np.ndarray | None, theta: np.ndarray,
               C: float, penalised: int) -> np.ndarray:
    total = _log_loss_sum(eta, y, w)
    return C * total + 0.5 * np.einsum("gp,gp->g", theta[:, :penalised], theta[:, :penalised])


def logistic(Z: np.ndarray, w: np.ndarray | None, C: float, fit_intercept: bool,
             max_iter: int, tol: float) -> dict[str, np.ndarray]:
    """L2-penalised logistic regression for every group of a block (``Z``: the
    features, then the 0/1 target) by Newton's method with a backtracking line
    search: scikit-learn's objective ``C * sum(w * log_loss) + ||coef||^2 / 2``,
    the intercept not penalised."""
    g, m, q = Z.shape
    p = q - 1
    sw, means = _weighted_means(Z, w)
    X, y, xm = Z[:, :, :p], Z[:, :, p], means[:, :p]
    if w is None:
        positives = y.sum(axis=1)
        single = (positives <= 0) | (positives >= sw)
    else:  # which rows weigh, not sums: a weighted count and the weights' sum differ by
        # an ulp on padded blocks, and a one-class group went on as two-class
        weighted = w > 0
        single = ~((weighted & (y > 0.5)).any(axis=1) & (weighted & (y < 0.5)).any(axis=1))
    if fit_intercept:  # centred features: the same optimum, better conditioned
        design = np.concatenate([X - xm[:, None, :], np.ones((g, m, 1))], axis=2)
    else:
        design = X
    q = design.shape[2]
    theta = np.zeros((g, q))
    value = C * sw * np.log(2.0)  # the objective at theta = 0: every row's loss is log 2
    converged = single.copy()
    iterations = np.zeros(g, dtype=np.int64)
    active = np.flatnonzero(~converged)
    for _ in range(max_iter):
        if not len(active):
            break
        if len(active) == g:  # all groups still run: no copy
            D, yy, ww, th = design, y, w, theta[active]
        else:
            D, yy, ww = design[active], y[active], None if w is None else w[active]
            th = theta[active]
        eta = (D @ th[:, :, None])[:, :, 0]
        mu = 0.5 * (1.0 + np.tanh(0.5 * eta))  # the logistic function, without overflow
        residual = mu - yy if ww is None else ww * (mu - yy)
        grad = C * np.einsum("gmq,gm->gq", D, residual)
        grad[:, :p] += th[:, :p]
        curvature = mu * (1.0 - mu) if ww is None else ww * mu * (1.0 - mu)
        H = C * ((D * curvature[:, :, None]).transpose(0, 2, 1) @ D)
        H[:, np.arange(p), np.arange(p)] += 1.0
        step, _ok = cholesky_solve(H, grad)
        before = value[active]
        slope = np.einsum("gq,gq->g", grad, step)
        t = np.ones(len(active))
        accepted = before.copy()
        pending = np.arange(len(active))
        for _halving in range(30):  # Armijo: halve where the objective did not fall enough
            trial = th[pending] - t[pending, None] * step[pending]
            eta_t = (D[pending] @ trial[:, :, None])[:, :, 0]
            after = _objective(eta_t, yy[pending], None if ww is None else ww[pending], trial,
                               C, p)
            rounding = 64 * np.finfo(np.float64).eps * np.abs(before[pending])
            fine = after <= before[pending] - 1e-4 * t[pending] * slope[pending] + rounding
            accepted[pending[fine]] = after[fine]
            pending = pending[~fine]
            if not len(pending):
                break
            t[pending] *= 0.5
        t[pending] = 0.0  # no decrease left at this precision: the optimum
        new = th - t[:, None] * step
        theta[active] = new
        value[active] = accepted
        iterations[active] += 1
        size = np.abs(t[:, None] * step).max(axis=1)
        done = size <= tol * (1.0 + np.abs(new).max(axis=1))
        converged[active[done]] = True
        active = active[~done]
    coef = theta[:, :p].copy()
    intercept = theta[:, p] - np.einsum("gp,gp->g", xm, coef) if fit_intercept else np.zeros(g)
    coef[single] = np.nan
    intercept[single] = np.nan
    eta = (design @ theta[:, :, None])[:, :, 0]
    hit = ((eta > 0) == (y > 0.5)).astype(np.float64)
    safe = np.where(sw > 0, sw, 1.0)
    log_loss = _log_loss_sum(eta, y, w) / safe
    accuracy = hit.mean(axis=1) if w is None else np.einsum("gm,gm->g", w, hit) / safe
    log_loss[single], accuracy[single] = np.nan, np.nan
    return {"coef": coef, "intercept": intercept, "single_class": single,
            "converged": converged & ~single, "iterations": iterations, "log_loss": log_loss,
            "accuracy": accuracy, "sw": sw}
