"""(e) No-op tasks: the per-task overhead of each tool. 100,000 tasks that
return their argument; the column that matters is tasks per second.
manymodels: ``mm.train(noop, mm.items(range(N)))``.
"""

from __future__ import annotations

import multiprocessing
import time
from functools import partial

import _common as c

USES_RAY = True
TITLE = "no-op tasks: per-task overhead"


def noop(x):
    return x


def from_list(values: list) -> dict:
    return dict(enumerate(values))


def from_run(run) -> dict:
    c.check_run(run)
    return dict(run.models)


def compare(result: dict, reference: dict) -> None:
    if len(result) != len(reference):
        raise AssertionError(f"{len(result)} results, expected {len(reference)}")
    if any(result.get(k) != v for k, v in reference.items()):
        raise AssertionError("some task returned the wrong value")


def serial(n: int):
    out, task_s = [], 0.0
    for i in range(n):
        start = time.perf_counter()
        out.append(noop(i))
        task_s += time.perf_counter() - start
    return out, task_s


def with_pool(n: int) -> list:
    with multiprocessing.Pool() as pool:
        return pool.map(noop, range(n))


def with_joblib(n: int) -> list:
    from joblib import Parallel, delayed

    return Parallel(n_jobs=-1)(delayed(noop)(i) for i in range(n))


def with_ray_pool(n: int) -> list:
    with c.ray_pool() as pool:
        return pool.map(noop, range(n))


def with_manymodels(n: int):
    import manymodels as mm

    return mm.train(noop, mm.items(range(n)), progress=False)


def run(quick: bool) -> dict:
    n = 10_000 if quick else 100_000
    # Imported before timing: this workload measures the cost per task, and a
    # first import (manymodels brings pandas, 0.4 s) is paid once per script.
    import joblib  # noqa: F401

    import manymodels  # noqa: F401

    case = c.Case(
        workload="e",
        title=f"no-op tasks: {n:,} tasks that return their argument",
        tasks=n,
        params={"tasks": n},
        serial=c.Tool("serial loop", partial(serial, n), result=from_list),
        peers=[
            c.Tool("multiprocessing.Pool.map", partial(with_pool, n), result=from_list,
                   note="default chunksize"),
            c.Tool("joblib Parallel(n_jobs=-1)", partial(with_joblib, n), result=from_list,
                   after=c.shutdown_loky, leaves_state=True, note="auto batching"),
            c.Tool("ray.util.multiprocessing.Pool", partial(with_ray_pool, n),
                   result=from_list, uses_ray=True),
            c.Tool("manymodels mm.train", partial(with_manymodels, n), result=from_run,
                   details=c.run_details),
        ],
        compare=compare,
        rate=True,
        notes=["the work is nil, so x limit is meaningless here; read tasks/s",
               "each wall includes starting the pool's workers"],
    )
    return {"name": "noop", "title": TITLE, "cases": [c.run_case(case)]}
