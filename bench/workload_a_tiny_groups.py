"""(a) Tiny groups: one LinearRegression per group of ~20 rows, 10,000 and
100,000 groups, all in ONE Parquet file that every tool reads itself.

This is where hand-written pools lose: a fit takes about a millisecond, so
pickling one DataFrame per task and sending it to a worker costs as much as the
work. manymodels: ``mm.train(fit, mm.groups(path, by="g"))``.
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
TITLE = "tiny groups: one LinearRegression per ~20-row group, one Parquet file"


def make_data(n_groups: int, path: Path, seed: int = 0) -> int:
    """``n_groups`` groups of 15-25 rows (~20), rows shuffled; returns the rows."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(15, 26, size=n_groups)
    g = np.repeat(np.arange(n_groups, dtype=np.int64), sizes)
    n = len(g)
    X = rng.standard_normal((n, 3))
    beta = rng.standard_normal((n_groups, 3))
    y = (X * beta[g]).sum(axis=1) + 0.1 * rng.standard_normal(n) + g % 7
    frame = pd.DataFrame({"g": g, "x0": X[:, 0], "x1": X[:, 1], "x2": X[:, 2], "y": y})
    frame = frame.iloc[rng.permutation(n)].reset_index(drop=True)
    frame.to_parquet(path, index=False)
    return n


def fit(df: pd.DataFrame):
    from sklearn.linear_model import LinearRegression

    return LinearRegression().fit(df[FEATURES], df["y"])


def fit_to_row(df: pd.DataFrame) -> pd.DataFrame:
    """Ray Data's map_groups function: the fit, returned as one row of
    coefficients (a DataFrame column cannot hold fitted models portably)."""
    model = fit(df)
    row = {"g": [df["g"].iloc[0]], "intercept": [model.intercept_]}
    for i, name in enumerate(FEATURES):
        row[f"coef_{name}"] = [model.coef_[i]]
    return pd.DataFrame(row)


# -- normalised results: key -> [intercept, coef...] -----------------------------


def _params(model) -> np.ndarray:
    return np.concatenate([[model.intercept_], model.coef_])


def from_models(models: dict) -> dict:
    return {int(k): _params(m) for k, m in models.items()}


def from_run(run) -> dict:
    c.check_run(run)
    return from_models(run.models)


def from_frame(frame: pd.DataFrame) -> dict:
    columns = ["intercept"] + [f"coef_{n}" for n in FEATURES]
    values = frame[columns].to_numpy()
    return {int(k): values[i] for i, k in enumerate(frame["g"].to_numpy())}


def compare(result: dict, reference: dict) -> None:
    if len(result) != len(reference):
        raise AssertionError(f"{len(result)} models, expected {len(reference)}")
    if result.keys() != reference.keys():
        raise AssertionError("group keys differ from the serial run's")
    keys = list(reference)
    got = np.stack([result[k] for k in keys])
    want = np.stack([reference[k] for k in keys])
    if not np.allclose(got, want, rtol=1e-7, atol=1e-9):
        worst = int(np.abs(got - want).max(axis=1).argmax())
        raise AssertionError(f"coefficients of group {keys[worst]} differ from serial")


# -- the tools -------------------------------------------------------------------


def serial(path: Path):
    df = pd.read_parquet(path)
    models, task_s = {}, 0.0
    for key, group in df.groupby("g"):
        start = time.perf_counter()
        models[key] = fit(group)
        task_s += time.perf_counter() - start
    return models, task_s


def _split(path: Path):
    df = pd.read_parquet(path)
    keys, frames = [], []
    for key, group in df.groupby("g"):
        keys.append(key)
        frames.append(group)
    return keys, frames


def with_pool(path: Path) -> dict:
    keys, frames = _split(path)
    with multiprocessing.Pool() as pool:
        return dict(zip(keys, pool.map(fit, frames)))


def with_joblib(path: Path) -> dict:
    from joblib import Parallel, delayed

    df = pd.read_parquet(path)
    keys = []

    def tasks():
        for key, group in df.groupby("g"):
            keys.append(key)
            yield delayed(fit)(group)

    models = Parallel(n_jobs=-1)(tasks())
    return dict(zip(keys, models))


def with_ray_pool(path: Path) -> dict:
    keys, frames = _split(path)
    with c.ray_pool() as pool:
        return dict(zip(keys, pool.map(fit, frames)))


def with_ray_data(path: Path) -> pd.DataFrame:
    ray = c.ray_module()
    ds = ray.data.read_parquet(str(path))
    return ds.groupby("g").map_groups(fit_to_row, batch_format="pandas").to_pandas()


def with_manymodels(path: Path):
    import manymodels as mm

    return mm.train(fit, mm.groups(str(path), by="g"), progress=False)


def run(quick: bool) -> dict:
    sizes = [1_000] if quick else [10_000, 100_000]
    if os.environ.get("BENCH_A_GROUPS"):  # e.g. BENCH_A_GROUPS=10000 for one size only
        sizes = [int(n) for n in os.environ["BENCH_A_GROUPS"].split(",")]
    cases = []
    for n_groups in sizes:
        with tempfile.TemporaryDirectory(prefix="mm-bench-a-") as tmp:
            path = Path(tmp) / "groups.parquet"
            rows = make_data(n_groups, path)
            case = c.Case(
                workload="a",
                title=f"tiny groups: {n_groups:,} groups of ~20 rows, one Parquet file",
                tasks=n_groups,
                params={"groups": n_groups, "rows": rows, "features": 3},
                serial=c.Tool("serial loop (groupby)", partial(serial, path),
                              result=from_models),
                peers=[
                    c.Tool("multiprocessing.Pool.map", partial(with_pool, path),
                           result=from_models),
                    c.Tool("joblib Parallel(n_jobs=-1)", partial(with_joblib, path),
                           result=from_models, after=c.shutdown_loky, leaves_state=True),
                    c.Tool("ray.util.multiprocessing.Pool", partial(with_ray_pool, path),
                           result=from_models, uses_ray=True),
                    c.Tool("ray.data groupby().map_groups()", partial(with_ray_data, path),
                           result=from_frame, uses_ray=True,
                           note="returns coefficients, not models"),
                    c.Tool("manymodels mm.train", partial(with_manymodels, path),
                           result=from_run, details=c.run_details),
                ],
                compare=compare,
                notes=["every tool reads the Parquet file itself; Ray's init is not timed"],
            )
            cases.append(c.run_case(case))
    return {"name": "tiny_groups", "title": TITLE, "cases": cases}
