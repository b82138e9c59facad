"""(d) BLAS-heavy tasks: 40 tasks, each a Ridge(solver="cholesky") on a
3000 x 400 random matrix plus np.linalg.svd of a 400 x 400 matrix.

A process pool whose workers each start a full BLAS thread pool runs
workers x cores threads on cores cores (oversubscription). The peers: a Pool
left with its default threads, a Pool whose workers a user limited to one BLAS
thread by hand (threadpoolctl in an initializer), joblib (which limits BLAS
threads in its workers itself), Ray's Pool, and manymodels with no settings.
"""

from __future__ import annotations

import multiprocessing
import time
from functools import partial

import numpy as np

import _common as c

USES_RAY = True
TITLE = "BLAS-heavy: Ridge(cholesky) + SVD per task"

_limits = None  # keeps the threadpoolctl limits of a hand-limited Pool worker alive


def blas_task(seed: int, rows: int = 3000, cols: int = 400) -> np.ndarray:
    from sklearn.linear_model import Ridge

    rng = np.random.default_rng(seed)
    A = rng.standard_normal((rows, cols))
    b = A[:, :5].sum(axis=1) + rng.standard_normal(rows)
    model = Ridge(alpha=1.0, solver="cholesky").fit(A, b)
    _, s, _ = np.linalg.svd(rng.standard_normal((cols, cols)))
    return np.concatenate([model.coef_[:8], [model.intercept_], s[:8]])


def one_blas_thread() -> None:
    """Pool initializer: one BLAS/OpenMP thread in this worker."""
    global _limits
    from threadpoolctl import threadpool_limits

    _limits = threadpool_limits(limits=1)


def from_run(run) -> dict:
    c.check_run(run)
    return {int(k): v for k, v in run.models.items()}


def compare(result: dict, reference: dict) -> None:
    if result.keys() != reference.keys():
        raise AssertionError(f"{len(result)} results, expected {len(reference)}")
    for key, want in reference.items():
        # BLAS thread counts change summation order: equal to rounding only
        if not np.allclose(result[key], want, rtol=1e-6, atol=1e-8):
            raise AssertionError(f"task {key} differs from serial")


def serial(task, seeds: list[int]):
    out, task_s = {}, 0.0
    for seed in seeds:
        start = time.perf_counter()
        out[seed] = task(seed)
        task_s += time.perf_counter() - start
    return out, task_s


def with_pool(task, seeds: list[int]) -> dict:
    with multiprocessing.Pool() as pool:
        return dict(zip(seeds, pool.map(task, seeds)))


def with_pool_one_thread(task, seeds: list[int]) -> dict:
    with multiprocessing.Pool(initializer=one_blas_thread) as pool:
        return dict(zip(seeds, pool.map(task, seeds)))


def with_joblib(task, seeds: list[int]) -> dict:
    from joblib import Parallel, delayed

    return dict(zip(seeds, Parallel(n_jobs=-1)(delayed(task)(s) for s in seeds)))


def with_ray_pool(task, seeds: list[int]) -> dict:
    with c.ray_pool() as pool:
        return dict(zip(seeds, pool.map(task, seeds)))


def with_manymodels(task, seeds: list[int]):
    import manymodels as mm

    return mm.train(task, mm.items(seeds), progress=False)


def run(quick: bool) -> dict:
    n_tasks, rows, cols = (8, 1500, 300) if quick else (40, 3000, 400)
    task = partial(blas_task, rows=rows, cols=cols)
    seeds = list(range(n_tasks))
    args = (task, seeds)
    case = c.Case(
        workload="d",
        title=f"BLAS-heavy: {n_tasks} x (Ridge cholesky on {rows} x {cols} + SVD {cols} x {cols})",
        tasks=n_tasks,
        params={"tasks": n_tasks, "rows": rows, "cols": cols},
        serial=c.Tool("serial loop", partial(serial, *args), note="BLAS on all cores"),
        peers=[
            c.Tool("multiprocessing.Pool.map", partial(with_pool, *args),
                   note="default BLAS threads"),
            c.Tool("Pool + threadpoolctl(1)", partial(with_pool_one_thread, *args),
                   note="1 BLAS thread per worker, by hand"),
            c.Tool("joblib Parallel(n_jobs=-1)", partial(with_joblib, *args),
                   after=c.shutdown_loky, leaves_state=True),
            c.Tool("ray.util.multiprocessing.Pool", partial(with_ray_pool, *args),
                   uses_ray=True),
            c.Tool("manymodels mm.train", partial(with_manymodels, *args), result=from_run,
                   details=c.run_details, note="no settings"),
        ],
        compare=compare,
        notes=["the serial run already uses every core through BLAS threads, so its "
               "task time (and limit_wall) is below one core's"],
    )
    return {"name": "blas", "title": TITLE, "cases": [c.run_case(case)]}
