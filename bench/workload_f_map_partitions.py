"""(f) map_partitions: a Python-bound function applied to row partitions of a
2,000,000 x 50 float table (a vectorised column plus a per-row Python
``Series.apply``, so the GIL is held most of the time).

Peers: pandas on the whole frame (serial), a Pool over row chunks, joblib
threads over chunks, Dask ``map_partitions`` (default threaded scheduler, and
processes). manymodels: ``mm.map_partitions(fn, table)`` when the package has
it; otherwise that row is skipped. A second manymodels row shows today's
workaround, ``mm.map_groups`` over a partition-number column.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from functools import partial

import numpy as np
import pandas as pd

import _common as c

USES_RAY = False
TITLE = "map_partitions: a Python-bound function over row partitions of a wide table"
N_COLUMNS = 50


def make_table(n_rows: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((n_rows, N_COLUMNS))
    return pd.DataFrame(values, columns=[f"c{i}" for i in range(N_COLUMNS)])


def _score(value: float) -> float:
    """Per-row Python work (a few microseconds): what keeps the GIL held."""
    total = 0.0
    for k in range(1, 6):
        total += math.sin(value * k) / k
    return total if value > 0 else -total


def transform(df: pd.DataFrame) -> pd.DataFrame:
    """The user's function: the partition with two new columns."""
    return df.assign(out=np.log1p(df["c0"].abs()) * df["c1"], score=df["c2"].apply(_score))


def _chunks(df: pd.DataFrame, n: int) -> list[pd.DataFrame]:
    size = -(-len(df) // n)
    return [df.iloc[i:i + size] for i in range(0, len(df), size)]


def from_frame(frame: pd.DataFrame) -> dict:
    return {"rows": len(frame), "out": frame["out"].to_numpy(),
            "score": frame["score"].to_numpy()}


def compare(result: dict, reference: dict) -> None:
    if result["rows"] != reference["rows"]:
        raise AssertionError(f"{result['rows']} rows, expected {reference['rows']}")
    if not np.allclose(result["out"], reference["out"], equal_nan=True):
        raise AssertionError("column 'out' differs from the serial result (or its row order)")
    if not np.allclose(result["score"], reference["score"]):
        raise AssertionError("column 'score' differs from the serial result")


def serial(df: pd.DataFrame):
    start = time.perf_counter()
    out = transform(df)
    return out, time.perf_counter() - start


def with_pool(df: pd.DataFrame, n_chunks: int) -> pd.DataFrame:
    with multiprocessing.Pool() as pool:
        return pd.concat(pool.map(transform, _chunks(df, n_chunks)))


def with_joblib_threads(df: pd.DataFrame, n_chunks: int) -> pd.DataFrame:
    from joblib import Parallel, delayed

    parts = Parallel(n_jobs=-1, prefer="threads")(
        delayed(transform)(chunk) for chunk in _chunks(df, n_chunks)
    )
    return pd.concat(parts)


def with_dask(df: pd.DataFrame, n_chunks: int, scheduler: str | None) -> pd.DataFrame:
    import dask.dataframe as dd

    meta = transform(df.iloc[:2]).iloc[:0]
    ddf = dd.from_pandas(df, npartitions=n_chunks).map_partitions(transform, meta=meta)
    return ddf.compute() if scheduler is None else ddf.compute(scheduler=scheduler)


def with_manymodels(df: pd.DataFrame) -> pd.DataFrame:
    import manymodels as mm

    return mm.map_partitions(transform, df)


def with_manymodels_map_groups(df: pd.DataFrame, n_chunks: int) -> pd.DataFrame:
    import manymodels as mm

    size = -(-len(df) // n_chunks)
    keyed = df.assign(part=np.arange(len(df)) // size)
    return mm.map_groups(transform, mm.groups(keyed, by="part"))


def run(quick: bool) -> dict:
    import manymodels as mm

    n_rows = 200_000 if quick else 2_000_000
    n_chunks = c.cores() * 4
    df = make_table(n_rows)
    has_map_partitions = hasattr(mm, "map_partitions")
    case = c.Case(
        workload="f",
        title=f"map_partitions: Python-bound function on {n_rows:,} x {N_COLUMNS} floats",
        tasks=n_chunks,
        params={"rows": n_rows, "columns": N_COLUMNS, "chunks": n_chunks},
        serial=c.Tool("pandas, whole frame (serial)", partial(serial, df), result=from_frame),
        peers=[
            c.Tool("multiprocessing.Pool.map over chunks", partial(with_pool, df, n_chunks),
                   result=from_frame),
            c.Tool("joblib threads over chunks", partial(with_joblib_threads, df, n_chunks),
                   result=from_frame, note='prefer="threads"', leaves_state=True),
            c.Tool("dask map_partitions", partial(with_dask, df, n_chunks, None),
                   result=from_frame, note="default (threaded) scheduler", leaves_state=True),
            c.Tool("dask map_partitions, processes",
                   partial(with_dask, df, n_chunks, "processes"), result=from_frame,
                   note='scheduler="processes"', leaves_state=True),
            c.Tool("manymodels mm.map_partitions", partial(with_manymodels, df),
                   result=from_frame,
                   skip=None if has_map_partitions
                   else "manymodels has no map_partitions yet"),
            c.Tool("manymodels mm.map_groups on a part column",
                   partial(with_manymodels_map_groups, df, n_chunks), result=from_frame,
                   note="workaround: adds a partition-number column"),
        ],
        compare=compare,
        notes=[f"chunked peers split the frame into {n_chunks} row chunks (4 per core); "
               "the serial task time is the whole-frame transform"],
    )
    return {"name": "map_partitions", "title": TITLE, "cases": [c.run_case(case)]}
