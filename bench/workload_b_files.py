"""(b) One model per file: 2,000 and 20,000 small CSV files (~50 rows each),
a LinearRegression on each. Every tool gets the same list of paths; the fit
reads its own file. manymodels: ``mm.train(fit_file, mm.items(paths))``.
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

import _common as c

FEATURES = ["x0", "x1", "x2"]
USES_RAY = True
TITLE = "one model per file: LinearRegression on each of many small CSV files"


def make_files(n_files: int, folder: Path, seed: int = 0) -> list[str]:
    rng = np.random.default_rng(seed)
    paths = []
    for i in range(n_files):
        n = int(rng.integers(40, 61))
        X = rng.standard_normal((n, 3))
        y = X @ rng.standard_normal(3) + 0.1 * rng.standard_normal(n) + i % 5
        path = folder / f"part-{i:06d}.csv"
        pd.DataFrame({"x0": X[:, 0], "x1": X[:, 1], "x2": X[:, 2], "y": y}).to_csv(
            path, index=False
        )
        paths.append(str(path))
    return paths


def fit_file(path: str):
    from sklearn.linear_model import LinearRegression

    df = pd.read_csv(path)
    return LinearRegression().fit(df[FEATURES], df["y"])


def _params(model) -> np.ndarray:
    return np.concatenate([[model.intercept_], model.coef_])


def from_models(models: dict) -> dict:
    return {str(k): _params(m) for k, m in models.items()}


def from_run(run) -> dict:
    c.check_run(run)
    return from_models(run.models)


def compare(result: dict, reference: dict) -> None:
    if len(result) != len(reference) or result.keys() != reference.keys():
        raise AssertionError(f"{len(result)} models, expected {len(reference)} "
                             "with the same paths")
    keys = list(reference)
    got = np.stack([result[k] for k in keys])
    want = np.stack([reference[k] for k in keys])
    if not np.allclose(got, want, rtol=1e-7, atol=1e-9):
        worst = int(np.abs(got - want).max(axis=1).argmax())
        raise AssertionError(f"coefficients of {keys[worst]} differ from serial")


def serial(paths: list[str]):
    models, task_s = {}, 0.0
    for path in paths:
        start = time.perf_counter()
        models[path] = fit_file(path)
        task_s += time.perf_counter() - start
    return models, task_s


def with_pool(paths: list[str]) -> dict:
    with multiprocessing.Pool() as pool:
        return dict(zip(paths, pool.map(fit_file, paths)))


def with_joblib(paths: list[str]) -> dict:
    from joblib import Parallel, delayed

    return dict(zip(paths, Parallel(n_jobs=-1)(delayed(fit_file)(p) for p in paths)))


def with_ray_pool(paths: list[str]) -> dict:
    with c.ray_pool() as pool:
        return dict(zip(paths, pool.map(fit_file, paths)))


def with_manymodels(paths: list[str]):
    import manymodels as mm

    return mm.train(fit_file, mm.items(paths), progress=False)


def run(quick: bool) -> dict:
    sizes = [400] if quick else [2_000, 20_000]
    if os.environ.get("BENCH_B_FILES"):  # e.g. BENCH_B_FILES=2000 for one size only
        sizes = [int(n) for n in os.environ["BENCH_B_FILES"].split(",")]
    cases = []
    for n_files in sizes:
        with tempfile.TemporaryDirectory(prefix="mm-bench-b-") as tmp:
            paths = make_files(n_files, Path(tmp))
            case = c.Case(
                workload="b",
                title=f"one model per file: {n_files:,} CSV files of ~50 rows",
                tasks=n_files,
                params={"files": n_files, "rows_per_file": "40-60"},
                serial=c.Tool("serial loop", partial(serial, paths), result=from_models),
                peers=[
                    c.Tool("multiprocessing.Pool.map", partial(with_pool, paths),
                           result=from_models),
                    c.Tool("joblib Parallel(n_jobs=-1)", partial(with_joblib, paths),
                           result=from_models, after=c.shutdown_loky, leaves_state=True),
                    c.Tool("ray.util.multiprocessing.Pool", partial(with_ray_pool, paths),
                           result=from_models, uses_ray=True),
                    c.Tool("manymodels mm.train", partial(with_manymodels, paths),
                           result=from_run, details=c.run_details),
                ],
                compare=compare,
                notes=["the fit reads its own file (pd.read_csv), so reading is task time"],
            )
            cases.append(c.run_case(case))
    return {"name": "files", "title": TITLE, "cases": cases}
