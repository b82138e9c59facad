"""The store's cost: recording many small results, and re-running unchanged.

Two measurements, each with its own ratio (issue targets in brackets):

* record: the same tiny-groups job (LinearRegression per group) with and
  without ``store=``: wall(store) / wall(no store)  [<= 1.10]
* rerun: an unchanged re-run with the same store, hashing included:
  wall(rerun) / wall(first run)  [<= 0.05]
* large models: models of 4 MB each (above the 1 MiB a model is a file of
  the store's), with and without ``store=``: the wall ratio, and the
  driver's own CPU (all its threads) per model, which the workers' writing
  of their model files keeps off the driver.

Usage: python bench/store_bench.py [--groups 100000] [--rerun-groups 10000]
       [--large 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.linear_model import LinearRegression

import manymodels as mm


def fit(df):
    model = LinearRegression().fit(df[["x1", "x2", "x3"]], df["y"])
    return model, {"r2": model.score(df[["x1", "x2", "x3"]], df["y"])}


def make_table(groups: int, rows: int, path: Path) -> Path:
    rng = np.random.default_rng(0)
    n = groups * rows
    frame = pd.DataFrame({
        "g": np.repeat(np.arange(groups), rows),
        "x1": rng.normal(size=n), "x2": rng.normal(size=n), "x3": rng.normal(size=n),
    })
    frame["y"] = frame["x1"] * 2 - frame["x2"] + rng.normal(size=n)
    frame.to_parquet(path)
    return path


def fit_large(item):
    """40 ms of work, then a model of 4 MB (its values do not compress)."""
    deadline = time.process_time() + 0.04
    while time.process_time() < deadline:
        pass
    return np.random.default_rng(item).random(500_000)


def timed(fit_fn=fit, **kwargs) -> tuple[float, mm.Run]:
    begin = time.perf_counter()
    run = mm.train(fit_fn, progress=False, **kwargs)
    return time.perf_counter() - begin, run


def driver_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--groups", type=int, default=100_000)
    parser.add_argument("--rerun-groups", type=int, default=10_000)
    parser.add_argument("--large", type=int, default=200)
    parser.add_argument("--out", default="bench/results/store.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="mm-store-bench-"))
    rows_out = []
    try:
        table = make_table(args.groups, 20, work / "big.parquet")
        plain, run = timed(source=mm.groups(table, by="g"))
        assert len(run.models) == args.groups
        stored, run = timed(source=mm.groups(table, by="g"), store=work / "store-a")
        assert len(run.models) == args.groups
        rows_out.append({"measure": f"record {args.groups:,} results",
                         "without_store_s": plain, "with_store_s": stored,
                         "ratio": stored / plain, "target": "<= 1.10"})

        small = make_table(args.rerun_groups, 20, work / "small.parquet")
        first, run = timed(source=mm.groups(small, by="g"), store=work / "store-b")
        again, rerun = timed(source=mm.groups(small, by="g"), store=work / "store-b")
        assert rerun.summary().reused == args.rerun_groups
        rows_out.append({"measure": f"unchanged re-run of {args.rerun_groups:,} models",
                         "first_run_s": first, "rerun_s": again, "ratio": again / first,
                         "target": "<= 0.05"})

        if args.large:
            times, cpus = {}, {}
            for case, store in (("without", None), ("with", work / "store-c")):
                cpu = driver_cpu_s()
                times[case], run = timed(fit_large, source=mm.items(range(args.large)),
                                         store=store, workers=2)
                cpus[case] = (driver_cpu_s() - cpu) / args.large * 1e3
                assert len(run.models) == args.large
            rows_out.append({"measure": f"record {args.large:,} models of 4 MB",
                             "without_store_s": times["without"],
                             "with_store_s": times["with"],
                             "ratio": times["with"] / times["without"],
                             "driver_cpu_ms_a_model_without": cpus["without"],
                             "driver_cpu_ms_a_model_with": cpus["with"],
                             "target": "as the first"})
    finally:
        shutil.rmtree(work, ignore_errors=True)

    print(f"{'measure':40} {'base s':>9} {'store s':>9} {'ratio':>7}  target")
    for row in rows_out:
        base = row.get("without_store_s", row.get("first_run_s"))
        other = row.get("with_store_s", row.get("rerun_s"))
        print(f"{row['measure']:40} {base:9.2f} {other:9.2f} {row['ratio']:7.3f}  {row['target']}")
        if "driver_cpu_ms_a_model_with" in row:
            print(f"{'  driver CPU a model, ms':40} {row['driver_cpu_ms_a_model_without']:9.2f} "
                  f"{row['driver_cpu_ms_a_model_with']:9.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "machine": {"cores": len(os.sched_getaffinity(0)), "cpu": platform.processor(),
                    "python": sys.version.split()[0]},
        "rows": rows_out,
    }, indent=2))


if __name__ == "__main__":
    main()
