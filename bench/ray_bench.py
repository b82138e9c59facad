"""manymodels' Ray backend against Ray Data on the tiny-groups workload.

    python bench/ray_bench.py [--quick] [--out bench/results/ray.json]

100,000 groups of ~20 rows (``--quick``: 10,000), 3 features, one
LinearRegression per group, all in one Parquet file that every tool reads
itself (the data and the fit of workload (a), bench/workload_a_tiny_groups.py):

* a serial ``groupby`` loop (the reference result and the serial wall time);
* manymodels ``backend="processes"`` (the default engine);
* Ray Data: ``ray.data.read_parquet(path).groupby("g").map_groups(fn)``, where
  ``fn`` fits one LinearRegression per group and returns its coefficients;
* manymodels ``backend="ray"`` on the same Ray instance.

Every result is checked against the serial loop's. Each Ray row gets a fresh
Ray instance whose workers have imported pandas and scikit-learn (untimed:
``ray.init`` is timed apart, as ``ray_init_s``), so that neither Ray tool pays
for the other's worker start-up or leftovers. The processes row runs before
Ray starts, as in a script that does not use Ray.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from functools import partial
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _common as c  # noqa: E402  (needs the bench directory on sys.path)
import workload_a_tiny_groups as a  # noqa: E402

RAY_DATA = "ray.data groupby().map_groups()"
MM_RAY = "manymodels backend='ray'"


def _warm_ray_workers() -> None:
    """Import the fit's libraries in every Ray worker process, untimed."""
    ray = c.ray_module()

    @ray.remote
    def warm() -> int:
        import os

        import pandas  # noqa: F401
        import sklearn.linear_model  # noqa: F401

        return os.getpid()

    ray.get([warm.remote() for _ in range(2 * c.cores())])


def with_manymodels(path: Path, backend: str) -> Any:
    import manymodels as mm
    from manymodels.engine.backends import BACKENDS

    if backend == "ray" and "ray" not in BACKENDS:  # before the registry has it
        from manymodels.engine.backends.ray import RayBackend

        BACKENDS["ray"] = RayBackend
    if backend == "ray":
        c.ray_module()  # connected before timing: the backend uses this instance
    return mm.train(a.fit, mm.groups(str(path), by="g"), backend=backend, progress=False)


def run(quick: bool) -> dict[str, Any]:
    n_groups = 10_000 if quick else 100_000
    with tempfile.TemporaryDirectory(prefix="mm-bench-ray-") as tmp:
        path = Path(tmp) / "groups.parquet"
        rows = a.make_data(n_groups, path)
        case = c.Case(
            workload="ray",
            title=f"tiny groups on Ray: {n_groups:,} groups of ~20 rows, one Parquet file",
            tasks=n_groups,
            params={"groups": n_groups, "rows": rows, "features": 3},
            serial=c.Tool("serial loop (groupby)", partial(a.serial, path),
                          result=a.from_models),
            peers=[
                c.Tool("manymodels backend='processes'",
                       partial(with_manymodels, path, "processes"),
                       result=a.from_run, details=c.run_details),
                c.Tool(RAY_DATA, partial(a.with_ray_data, path), result=a.from_frame,
                       uses_ray=True, note="returns coefficients, not models",
                       after=_restart_and_warm),
                c.Tool(MM_RAY, partial(with_manymodels, path, "ray"), result=a.from_run,
                       uses_ray=True, details=c.run_details),
            ],
            compare=a.compare,
            notes=["every tool reads the Parquet file itself; ray.init and the Ray "
                   "workers' first imports are not timed"],
        )
        # run_case times Ray rows last; start and warm Ray just before them by
        # hooking the clean-up (untimed) of the row before each.
        case.peers[0].after = _start_and_warm
        result = c.run_case(case)
    walls = {row["tool"]: row["wall_s"] for row in result["rows"]}
    ratio = (walls[RAY_DATA] / walls[MM_RAY]
             if walls.get(RAY_DATA) and walls.get(MM_RAY) else None)
    result["ray_backend_speedup_over_ray_data"] = ratio
    print(f"manymodels backend='ray' vs Ray Data: "
          f"{'-' if ratio is None else f'{ratio:.2f}x'} "
          "(Ray Data wall / Ray backend wall; > 1: the Ray backend is faster)")
    return result


def _start_and_warm() -> None:
    began = time.perf_counter()
    c.start_ray()
    _warm_ray_workers()
    print(f"ray.init + worker warm-up (untimed): {time.perf_counter() - began:.1f} s")


def _restart_and_warm() -> None:
    """A fresh Ray instance for the next Ray row: Ray Data leaves worker
    processes, threads and objects behind that would slow the next tool."""
    init_s = c._RAY["init_s"]
    c.stop_ray()
    c._RAY.update(module=None, error=None, init_s=None)
    _start_and_warm()
    c._RAY["init_s"] = init_s


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="10,000 groups, not 100,000")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "ray.json")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    machine = c.machine_info()
    print(f"manymodels Ray bench: {machine['cores']} cores ({machine['cpu_model']}), "
          f"{'quick' if args.quick else 'full'} size")
    try:
        result = run(args.quick)
    finally:
        c.stop_ray()
    c.write_json(args.out, {"machine": machine, "quick": args.quick,
                            "ray_init_s": result.get("ray_init_s"), "workload": result})
    print(f"results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
