"""The kernels of :mod:`.kernels` in PyTorch, for ``mm.linear(..., device="cuda")``.

The same algebra on the same blocks, in float64 on ``device``: batched
``X'WX`` by ``bmm``, a batched Cholesky (``cholesky_ex``, which reports a
failed group instead of raising), Newton's method for logistic. A group that
the Cholesky refuses, or whose pivot is too small, is solved by the NumPy
least-norm path on the CPU (such groups are few), so both engines give the
same answers to rounding. PyTorch is optional: imported only when asked for.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from . import kernels


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ImportError("mm.linear(device=...) needs PyTorch: pip install torch") from exc
    return torch


#: The devices the kernels run on: float64 throughout (MPS has none) and a copy
#: back to NumPy at the end (a "meta" tensor holds no data).
DEVICE_TYPES = ("cpu", "cuda")


def check_device(device: Any) -> Any:
    """The ``torch.device`` for ``device``, refusing before any work one that
    the kernels cannot run on or that is not there, saying what is missing."""
    torch = _torch()
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"device must be a name such as 'cuda', 'cuda:1' or 'cpu', "
                        f"got {device!r}")
    try:
        chosen = torch.device(device)
    except RuntimeError as exc:
        raise ValueError(f"unknown device {device!r}: {exc}") from exc
    if chosen.type not in DEVICE_TYPES:
        raise ValueError(f"device {device!r}: mm.linear runs on 'cpu' or 'cuda' (or "
                         f"'cuda:N'), not on {chosen.type!r}")
    if chosen.type == "cuda":
        _check_cuda(torch, device, chosen.index)
    return chosen


def _check_cuda(torch: Any, device: Any, index: int | None) -> None:
    """Refuse a CUDA device that is not there: PyTorch built without CUDA, no
    GPU this process may use, or an index past the GPUs it sees."""
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        raise ValueError(f"device {device!r}: this PyTorch ({torch.__version__}) is built "
                         "without CUDA; install a CUDA build of PyTorch, or use device='cpu'")
    if not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: PyTorch sees no CUDA GPU here (is there a GPU "
                         "and its driver? CUDA_VISIBLE_DEVICES="
                         f"{os.environ.get('CUDA_VISIBLE_DEVICES', '(not set)')})")
    count = torch.cuda.device_count()
    if index is not None and index >= count:
        raise ValueError(f"device {device!r}: PyTorch sees {count} CUDA GPU(s) here, "
                         f"cuda:0 to cuda:{count - 1}")


def _solve(torch: Any, A: Any, b: Any, floor: Any = None) -> tuple[Any, Any]:
    """Solve each ``A x = b`` as :func:`.kernels.cholesky_solve` does, column
    by column, a pivot too small taken as 1 (so a group whose Hessian is
    nearly singular gets the same direction on either engine, not a plain
    gradient step); also whether each was safely positive definite. A pivot
    must also exceed ``floor`` where given (:func:`.kernels.pivot_floor`: a
    column that centring reduced to rounding noise passes the relative test)."""
    g, q, _ = A.shape
    L = torch.zeros_like(A)
    ok = torch.ones(g, dtype=torch.bool, device=A.device)
    for j in range(q):
        pivot = A[:, j, j] - (L[:, j, :j] * L[:, j, :j]).sum(dim=1)
        good = pivot > kernels.PIVOT_TOLERANCE * A[:, j, j].abs()
        if floor is not None:
            good &= pivot > floor
        ok &= good
        d = torch.sqrt(torch.where(good, pivot, torch.ones_like(pivot)))
        L[:, j, j] = d
        if j + 1 < q:
            L[:, j + 1:, j] = (A[:, j + 1:, j] - torch.einsum(
                "gik,gk->gi", L[:, j + 1:, :j], L[:, j, :j])) / d[:, None]
    return torch.cholesky_solve(b[:, :, None], L)[:, :, 0], ok


def _means(torch: Any, Z: Any, w: Any) -> tuple[Any, Any]:
    if w is None:
        return torch.full((Z.shape[0],), float(Z.shape[1]), dtype=Z.dtype,
                          device=Z.device), Z.mean(dim=1)
    sw = w.sum(dim=1)
    safe = torch.where(sw > 0, sw, torch.ones_like(sw))
    return sw, torch.einsum("gm,gmq->gq", w, Z) / safe[:, None]


def least_squares(Z: np.ndarray, w: np.ndarray | None, alpha: np.ndarray | float,
                  fit_intercept: bool, device: Any) -> dict[str, np.ndarray]:
    """:func:`kernels.least_squares` on ``device``."""
    torch = _torch()
    g, m, q = Z.shape
    p = q - 1
    Zt = torch.as_tensor(Z, device=device)
    wt = None if w is None else torch.as_tensor(w, device=device)
    sw, means = _means(torch, Zt, wt)
    Zc = Zt - means[:, None, :] if fit_intercept else Zt
    Zw = Zc if wt is None else Zc * wt[:, :, None]
    M = torch.bmm(Zw.transpose(1, 2), Zc)
    A, b = M[:, :p, :p].clone(), M[:, :p, p].clone()
    penalty = kernels.ridge_penalty(alpha, g, p)
    # (a copy: ridge_penalty broadcasts, a read-only view that PyTorch warns about)
    A = A + torch.diag_embed(torch.as_tensor(np.array(penalty), device=device))
    gram_trace = kernels.uncentred_trace(M[:, :p, :p], sw, means[:, :p], fit_intercept)
    floor = kernels.pivot_floor(gram_trace, m, p)
    coef, ok = _solve(torch, A, b, floor)
    ok = ok & (sw > 0)
    rank = np.full(g, p, dtype=np.int64)
    redo = np.flatnonzero(~ok.cpu().numpy())
    if len(redo):  # the few hard groups: the NumPy least-norm path, on the CPU
        Zcpu = Zc[redo].cpu().numpy()
        wr = None if w is None else w[redo]
        rows = np.full(len(redo), m) if w is None else (wr > 0).sum(axis=1)
        fixed, rank[redo] = kernels._least_norm(
            Zcpu[:, :, :p], Zcpu[:, :, p], wr, penalty[redo],
            np.sqrt(gram_trace[torch.as_tensor(redo, device=device)].cpu().numpy()),
            rows - int(fit_intercept))
        coef[torch.as_tensor(redo, device=device)] = torch.as_tensor(fixed, device=device)
    xm, ym = means[:, :p], means[:, p]
    intercept = ym - (xm * coef).sum(dim=1) if fit_intercept else torch.zeros_like(ym)
    direction = torch.cat([-coef, torch.ones((g, 1), dtype=coef.dtype, device=device)], dim=1)
    residual = torch.bmm(Zc, direction[:, :, None])[:, :, 0]
    if fit_intercept:
        sst = M[:, p, p]
    else:
        spread = Zt[:, :, p] - ym[:, None]
        sst = (spread * spread if wt is None else wt * spread * spread).sum(dim=1)
    sse = (residual * residual if wt is None else wt * residual * residual).sum(dim=1)
    sst, tss, sse = kernels.flat_target(sst, M[:, p, p], sse, sw, ym, fit_intercept,
                                        torch.where)
    out = {"coef": coef, "intercept": intercept, "sse": sse, "sst": sst, "tss": tss, "sw": sw}
    result = {name: value.cpu().numpy() for name, value in out.items()}
    result["rank_deficient"] = rank < p
    penalised = np.flatnonzero((penalty > 0).any(axis=1))
    if len(penalised):
        at = torch.as_tensor(penalised, device=device)
        rank[penalised] = kernels.design_rank(M[at, :p, :p].cpu().numpy(),
                                              floor[at].cpu().numpy())
    result["rank"] = rank
    result.update(kernels._row_counts(w, g, m))
    return result


def logistic(Z: np.ndarray, w: np.ndarray | None, C: float, fit_intercept: bool,
             max_iter: int, tol: float, device: Any) -> dict[str, np.ndarray]:
    """:func:`kernels.logistic` on ``device``: Newton's method with the same
    line search and stopping rule, all groups iterating together."""
    torch = _torch()
    g, m, q = Z.shape
    p = q - 1
    Zt = torch.as_tensor(Z, device=device)
    wt = None if w is None else torch.as_tensor(w, device=device)
    sw, means = _means(torch, Zt, wt)
    X, y, xm = Zt[:, :, :p], Zt[:, :, p], means[:, :p]
    if wt is None:
        positives = y.sum(dim=1)
        single = (positives <= 0) | (positives >= sw)
    else:  # (a sum of weights against a weighted count: an ulp apart, on padded blocks)
        weighted = wt > 0
        single = ~((weighted & (y > 0.5)).any(dim=1) & (weighted & (y < 0.5)).any(dim=1))
    if fit_intercept:
        ones = torch.ones((g, m, 1), dtype=Zt.dtype, device=device)
        design = torch.cat([X - xm[:, None, :], ones], dim=2)
    else:
        design = X
    k = design.shape[2]
    penalty = torch.zeros(k, dtype=Zt.dtype, device=device)
    penalty[:p] = 1.0

    def objective(theta: Any, eta: Any) -> Any:
        loss = torch.nn.functional.softplus(eta) - y * eta
        total = loss.sum(dim=1) if wt is None else (wt * loss).sum(dim=1)
        return C * total + 0.5 * (theta[:, :p] ** 2).sum(dim=1)

    theta = torch.zeros((g, k), dtype=Zt.dtype, device=device)
    converged = single.clone()
    iterations = torch.zeros(g, dtype=torch.int64, device=device)
    for _ in range(max_iter):
        active = ~converged
        if not bool(active.any()):
            break
        eta = torch.bmm(design, theta[:, :, None])[:, :, 0]
        mu = torch.sigmoid(eta)
        residual = mu - y if wt is None else wt * (mu - y)
        grad = C * torch.einsum("gmk,gm->gk", design, residual) + penalty * theta
        curvature = mu * (1 - mu) if wt is None else wt * mu * (1 - mu)
        H = C * torch.bmm((design * curvature[:, :, None]).transpose(1, 2), design)
        H = H + torch.diag(penalty)
        step, _ok = _solve(torch, H, grad)
        before = objective(theta, eta)
        slope = (grad * step).sum(dim=1)
        t = torch.ones(g, dtype=Zt.dtype, device=device)
        pending = active.clone()
        for _halving in range(30):
            trial = theta - t[:, None] * step
            after = objective(trial, torch.bmm(design, trial[:, :, None])[:, :, 0])
            rounding = 64 * np.finfo(np.float64).eps * before.abs()
            fine = after <= before - 1e-4 * t * slope + rounding
            pending = pending & ~fine
            if not bool(pending.any()):
                break
            t = torch.where(pending, t * 0.5, t)
        t = torch.where(pending, torch.zeros_like(t), t)  # no decrease left: the optimum
        new = theta - t[:, None] * step
        theta = torch.where(active[:, None], new, theta)
        iterations += active.to(torch.int64)
        size = (t[:, None] * step).abs().amax(dim=1)
        converged = converged | (active & (size <= tol * (1.0 + new.abs().amax(dim=1))))
    coef = theta[:, :p].clone()
    if fit_intercept:
        intercept = theta[:, p] - (xm * coef).sum(dim=1)
    else:
        intercept = torch.zeros(g, dtype=Zt.dtype, device=device)
    eta = torch.bmm(design, theta[:, :, None])[:, :, 0]
    loss = torch.nn.functional.softplus(eta) - y * eta
    hit = ((eta > 0) == (y > 0.5)).to(Zt.dtype)
    safe = torch.where(sw > 0, sw, torch.ones_like(sw))
    weight = torch.ones_like(y) if wt is None else wt
    out = {"coef": coef, "intercept": intercept, "sw": sw,
           "log_loss": (weight * loss).sum(dim=1) / safe,
           "accuracy": (weight * hit).sum(dim=1) / safe}
    result = {name: value.cpu().numpy() for name, value in out.items()}
    single_np = single.cpu().numpy()
    for name in ("coef", "intercept", "log_loss", "accuracy"):
        result[name][single_np] = np.nan
    result["single_class"] = single_np
    result["converged"] = converged.cpu().numpy() & ~single_np
    result["iterations"] = iterations.cpu().numpy()
    return result
