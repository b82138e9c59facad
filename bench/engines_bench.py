"""manymodels on Spark and Dask against each engine's own grouped apply.

    python bench/engines_bench.py [--groups 10000,100000] [--out bench/results/engines.json]

The tiny-groups workload (bench/workload_a_tiny_groups.py): groups of ~20 rows,
3 features, one LinearRegression per group, all in one Parquet file that every
tool reads itself. On one machine, with as many workers as cores:

* manymodels ``backend="processes"`` (the default engine, no cluster): the
  reference result every other row is checked against;
* a local Spark session (``local[N]``): Spark's own
  ``spark.read.parquet(path).groupBy("g").applyInPandas(fn, schema)`` and
  manymodels ``backend="spark"`` on the same session;
* a ``distributed.LocalCluster`` (N processes, one thread each): Dask's own
  ``dd.read_parquet(path).groupby("g").apply(fn)`` and manymodels
  ``backend="dask"`` on the same cluster.

Engine start-up (the session or the cluster, and the workers' first import of
pandas and scikit-learn) is timed apart, as ``start_s``, not in the rows.
The engines' own applies return coefficients (a DataFrame column cannot hold
fitted models portably); manymodels returns the models.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _common as c  # noqa: E402  (needs the bench directory on sys.path)
import workload_a_tiny_groups as a  # noqa: E402

SCHEMA = "g long, intercept double, coef_x0 double, coef_x1 double, coef_x2 double"


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def _manymodels(path: Path, backend: str, workers: int) -> Any:
    import manymodels as mm

    return mm.train(a.fit, mm.groups(str(path), by="g"), backend=backend, workers=workers,
                    progress=False)


def _warm(_: Any = None) -> int:
    import pandas  # noqa: F401
    import sklearn.linear_model  # noqa: F401

    return os.getpid()


def fit_to_named_row(df: Any) -> Any:
    """Dask's (pandas') grouped apply passes a group without its key column
    (pandas 3), its key as ``df.name``: the same row as ``a.fit_to_row``."""
    import pandas as pd

    model = a.fit(df)
    row = {"g": [df.name], "intercept": [model.intercept_]}
    for i, name in enumerate(a.FEATURES):
        row[f"coef_{name}"] = [model.coef_[i]]
    return pd.DataFrame(row)


def spark_rows(path: Path, workers: int, reference: dict) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # Spark's Python workers find the bench's modules (Spark's own apply
    # pickles a.fit_to_row by reference) as the driver does.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(BENCH_DIR), *filter(None, [os.environ.get("PYTHONPATH")])])

    def start() -> Any:
        spark = (SparkSession.builder.master(f"local[{workers}]").appName("engines-bench")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        spark.sparkContext.parallelize(range(4 * workers), 4 * workers).map(_warm).collect()
        return spark

    spark, start_s = _timed(start)
    try:
        def own() -> Any:
            frame = spark.read.parquet(str(path))
            return frame.groupBy("g").applyInPandas(a.fit_to_row, schema=SCHEMA).toPandas()

        native, native_s = _timed(own)
        a.compare(a.from_frame(native), reference)
        run, mm_s = _timed(lambda: _manymodels(path, "spark", workers))
        a.compare(a.from_run(run), reference)
    finally:
        spark.stop()
    return {"engine": "spark", "start_s": start_s,
            "own": {"tool": "Spark groupBy().applyInPandas()", "wall_s": native_s},
            "manymodels": {"tool": "manymodels backend='spark'", "wall_s": mm_s,
                           **c.run_details(run)}}


def dask_rows(path: Path, workers: int, reference: dict) -> dict[str, Any]:
    import dask.dataframe as dd
    import distributed

    def start() -> Any:
        cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                           processes=True, dashboard_address=":0",
                                           silence_logs=logging.ERROR)
        client = distributed.Client(cluster)
        client.run(_warm)
        return cluster, client

    (cluster, client), start_s = _timed(start)
    try:
        def own() -> Any:
            frame = dd.read_parquet(str(path))
            meta = {"g": "int64", "intercept": "f8", "coef_x0": "f8", "coef_x1": "f8",
                    "coef_x2": "f8"}
            return frame.groupby("g").apply(fit_to_named_row, meta=meta).compute()

        native, native_s = _timed(own)
        a.compare(a.from_frame(native.reset_index(drop=True)), reference)
        run, mm_s = _timed(lambda: _manymodels(path, "dask", workers))
        a.compare(a.from_run(run), reference)
    finally:
        client.close()
        cluster.close()
    return {"engine": "dask", "start_s": start_s,
            "own": {"tool": "dask.dataframe groupby().apply()", "wall_s": native_s},
            "manymodels": {"tool": "manymodels backend='dask'", "wall_s": mm_s,
                           **c.run_details(run)}}


def run_size(n_groups: int, workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="mm-bench-engines-") as tmp:
        path = Path(tmp) / "groups.parquet"
        rows = a.make_data(n_groups, path)
        local, processes_s = _timed(lambda: _manymodels(path, "processes", workers))
        reference = a.from_run(local)
        engines = [spark_rows(path, workers, reference), dask_rows(path, workers, reference)]
    for engine in engines:
        engine["own_over_manymodels"] = engine["own"]["wall_s"] / engine["manymodels"]["wall_s"]
        engine["manymodels_over_processes"] = engine["manymodels"]["wall_s"] / processes_s
    return {"groups": n_groups, "rows": rows, "workers": workers,
            "processes": {"tool": "manymodels backend='processes'", "wall_s": processes_s,
                          **c.run_details(local)},
            "engines": engines}


def print_size(result: dict[str, Any]) -> None:
    print(f"\n{result['groups']:,} groups of ~20 rows ({result['rows']:,} rows), "
          f"{result['workers']} workers")
    print(f"  {'tool':<38} {'wall s':>8}  vs own apply  vs processes  engine start s")
    processes = result["processes"]["wall_s"]
    print(f"  {result['processes']['tool']:<38} {processes:>8.2f}")
    for engine in result["engines"]:
        own, mine = engine["own"], engine["manymodels"]
        print(f"  {own['tool']:<38} {own['wall_s']:>8.2f}  {'1.00x':>12}  "
              f"{own['wall_s'] / processes:>11.2f}x  {engine['start_s']:>14.1f}")
        print(f"  {mine['tool']:<38} {mine['wall_s']:>8.2f}  "
              f"{engine['own_over_manymodels']:>11.2f}x  "
              f"{engine['manymodels_over_processes']:>11.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--groups", default="10000",
                        help="comma-separated group counts (default 10000)")
    parser.add_argument("--workers", type=int, default=c.cores())
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "engines.json")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    machine = c.machine_info()
    print(f"manymodels engines bench: {machine['cores']} cores ({machine['cpu_model']}), "
          f"load average {os.getloadavg()[0]:.1f}")
    sizes = [run_size(int(n), args.workers) for n in args.groups.split(",")]
    for size in sizes:
        print_size(size)
    print("\nvs own apply: the engine's grouped apply wall / manymodels' (> 1: manymodels "
          "faster); vs processes: wall / backend='processes' wall")
    c.write_json(args.out, {"machine": machine, "load_average": os.getloadavg(),
                            "sizes": sizes})
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
