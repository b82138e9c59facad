"""Data that outgrows the driver: an engine's DataFrame grouped by its engine.

    python bench/datapath_bench.py [--rows 1000000] [--groups 10000] [--files 8]
                                   [--cases spark_own,spark_mm,dask_own,dask_mm,ray_own,
                                            ray_mm,eager_mm,read_on_workers_mm]
                                   [--out bench/results/datapath.json]

``rows`` rows in ``groups`` groups, unsorted (every file holds rows of every
group) across ``files`` Parquet files; one small least-squares model per
group. Each case runs in a fresh Python process, so that its peak RSS
(``ru_maxrss``) is the driver's alone (Spark's JVM and the Dask workers are
other processes), and its bytes read (``/proc/self/io``) are the driver's:

* ``spark_own``: ``spark.read.parquet(dir).groupBy("g").applyInPandas(fit)``,
  its results written to Parquet by the executors;
* ``spark_mm``: ``mm.train(fit, mm.groups(spark.read.parquet(dir), by="g"),
  backend="spark")`` on the same kind of session (``local[N]``);
* ``dask_own``: ``dd.read_parquet(dir).groupby("g").apply(fit)``, written to
  Parquet by the workers, on a ``LocalCluster`` of N one-thread processes;
* ``dask_mm``: ``mm.train(fit, mm.groups(dd.read_parquet(dir), by="g"),
  backend="dask")`` on the same kind of cluster;
* ``ray_own``: ``ray.data.read_parquet(dir).groupby("g").map_groups(fit)``,
  written to Parquet by Ray's workers, on a local Ray of N CPUs;
* ``ray_mm``: ``mm.train(fit, mm.groups(ray.data.read_parquet(dir), by="g"),
  backend="ray")`` on the same kind of Ray;
* ``eager_mm``: ``mm.groups(dir, by="g")`` with the processes backend: the
  driver reads and sorts the whole table (the path the others avoid);
* ``read_on_workers_mm``: ``mm.groups(dir, by="g", read_on_workers=True)``
  with the processes backend: the driver reads the key columns only (the
  rows of unsorted files are sorted once into Arrow files the workers map).

``--cases eager_mm,read_on_workers_mm`` compares the last two alone (no
engine to start).

The engine's start (session, cluster) is timed apart (``start_s``); ``wall_s``
is the job alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

SCHEMA = "g long, slope double, intercept double, n long"
CASES = ("spark_own", "spark_mm", "dask_own", "dask_mm", "ray_own", "ray_mm", "eager_mm",
         "read_on_workers_mm")


def fit(df: pd.DataFrame) -> tuple[dict, dict]:
    """One small model: a least-squares line."""
    x = df["x"].to_numpy(dtype=float)
    y = df["y"].to_numpy(dtype=float)
    slope, intercept = np.polyfit(x, y, 1)
    return {"slope": slope, "intercept": intercept}, {"slope": float(slope), "n": len(x)}


def fit_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The same model, as an engine's grouped apply returns it: one row."""
    _, metrics = fit(df)
    key = df["g"].iloc[0] if "g" in df.columns else df.name  # pandas 3: the key is apart
    return pd.DataFrame({"g": [int(key)], "slope": [metrics["slope"]],
                         "intercept": [0.0], "n": [metrics["n"]]})


def fit_series(df: pd.DataFrame) -> pd.Series:
    """The same model for Dask's grouped apply: one row, the key in the index."""
    _, metrics = fit(df)
    return pd.Series({"slope": metrics["slope"], "intercept": 0.0, "n": float(metrics["n"])})


def write_data(directory: Path, rows: int, groups: int, files: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    per_file = rows // files
    for number in range(files):
        g = rng.integers(0, groups, per_file)
        x = rng.normal(size=per_file)
        y = 0.001 * g * x + rng.normal(size=per_file)
        pq.write_table(pa.table({"g": g, "x": x, "y": y, "w": rng.normal(size=per_file)}),
                       directory / f"part-{number:03d}.parquet")


def _spark(workers: int) -> Any:
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (SparkSession.builder.master(f"local[{workers}]").appName("datapath-bench")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "2g")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(10).count()
    return spark


def _dask(workers: int) -> Any:
    import distributed

    cluster = distributed.LocalCluster(n_workers=workers, threads_per_worker=1,
                                       dashboard_address=":0", silence_logs=logging.ERROR)
    client = distributed.Client(cluster)
    client.run(lambda: __import__("pandas") and 0)
    return client


def _ray(workers: int) -> Any:
    import ray

    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False,
             logging_level=logging.ERROR)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    context.print_on_execution_start = False
    for name in ("ray", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return ray


def fit_batch(df: pd.DataFrame) -> pd.DataFrame:
    """The same model for Ray Data's ``map_groups`` (pandas batches): one row."""
    return fit_frame(df)


def run_case(case: str, data: Path, workers: int, out: Path) -> dict:
    """One case, in this process: returns its figures."""
    import manymodels as mm

    start = time.perf_counter()
    engine = _spark(workers) if case.startswith("spark") else (
        _dask(workers) if case.startswith("dask") else (
            _ray(workers) if case.startswith("ray") else None))
    start_s = time.perf_counter() - start
    begin = time.perf_counter()
    if case == "spark_own":
        frame = engine.read.parquet(str(data))
        frame.groupBy("g").applyInPandas(fit_frame, SCHEMA).write.parquet(str(out))
        groups = engine.read.parquet(str(out)).count()
    elif case == "dask_own":
        import dask.dataframe as dd

        meta = pd.DataFrame({name: pd.Series([], dtype="f8")
                             for name in ("slope", "intercept", "n")},
                            index=pd.Index([], dtype="int64", name="g"))
        applied = dd.read_parquet(str(data)).groupby("g").apply(fit_series, meta=meta)
        applied.to_parquet(str(out))
        groups = len(dd.read_parquet(str(out)))
    elif case == "ray_own":
        dataset = engine.data.read_parquet(str(data))
        dataset.groupby("g").map_groups(fit_batch, batch_format="pandas").write_parquet(
            str(out))
        groups = engine.data.read_parquet(str(out)).count()
    else:
        if case == "ray_mm":
            table, backend = engine.data.read_parquet(str(data)), "ray"
        elif case == "spark_mm":
            table, backend = engine.read.parquet(str(data)), "spark"
        elif case == "dask_mm":
            import dask.dataframe as dd

            table, backend = dd.read_parquet(str(data)), "dask"
        else:
            table, backend = str(data), "processes"
        source = mm.groups(table, by="g", columns=["x", "y"],
                           read_on_workers=case == "read_on_workers_mm")
        run = mm.train(fit, source, backend=backend, workers=workers, progress=False)
        groups = int((run.results["status"] == "ok").sum())
    wall_s = time.perf_counter() - begin
    read_bytes = None
    try:
        io = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        read_bytes = int(io["read_bytes"])
    except OSError:
        pass
    return {"case": case, "groups_ok": groups, "start_s": round(start_s, 2),
            "wall_s": round(wall_s, 2),
            "driver_peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                        / 1024, 1),
            "driver_read_bytes": read_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", default="bench/results/datapath.json")
    parser.add_argument("--case-timeout", type=float, default=1800,
                        help="seconds a case may take, engine start included (default 1800)")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a child: run one case
    parser.add_argument("--data", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        with tempfile.TemporaryDirectory() as scratch:
            figures = run_case(args.case, Path(args.data), args.workers, Path(scratch) / "out")
        print("RESULT " + json.dumps(figures), flush=True)
        os._exit(0)  # engines' threads do not hold the exit up
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _common

    machine = _common.machine_info()
    rows = []
    with tempfile.TemporaryDirectory(prefix="datapath-bench-") as scratch:
        data = Path(scratch) / "data"
        data.mkdir()
        write_data(data, args.rows, args.groups, args.files)
        for case in args.cases.split(","):
            load = list(os.getloadavg())
            try:
                child = subprocess.run(
                    [sys.executable, __file__, "--case", case, "--data", str(data),
                     "--workers", str(args.workers)], capture_output=True, text=True,
                    timeout=args.case_timeout)
            except subprocess.TimeoutExpired:
                print(f"{case}: over its {args.case_timeout:.0f} s", file=sys.stderr)
                rows.append({"case": case, "status": f"over {args.case_timeout:.0f} s",
                             "load_average_at_start": load})
                continue
            found = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
            if not found:
                print(f"{case} failed:\n{child.stderr[-3000:]}", file=sys.stderr)
                continue
            rows.append({**json.loads(found[-1][len("RESULT "):]), "status": "ok",
                         "load_average_at_start": load})
            print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    print(f"\n{args.rows:,} rows, {args.groups:,} groups, {args.files} files, "
          f"{args.workers} workers, {os.cpu_count()} cores\n")
    print(table.to_string(index=False))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": args.rows, "groups": args.groups,
                                          "files": args.files, "workers": args.workers,
                                          "machine": machine, "results": rows}, indent=2))


if __name__ == "__main__":
    main()
