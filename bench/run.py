"""Benchmark suite of manymodels against the tools a user would otherwise use.

    python bench/run.py [--quick] [--only a,b,...] [--out bench/results/results.json]

Each workload runs a serial loop, multiprocessing.Pool, joblib, Ray (and Dask
for map_partitions) and manymodels on the same generated data, checks every
result against the serial one, prints one table per case and writes JSON.
See bench/README.md.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import time
import traceback
import warnings
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _common as c  # noqa: E402  (needs the bench directory on sys.path)

WORKLOADS = {
    "a": "workload_a_tiny_groups",
    "b": "workload_b_files",
    "c": "workload_c_sweep",
    "d": "workload_d_blas",
    "e": "workload_e_noop",
    "f": "workload_f_map_partitions",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small sizes: the whole suite in a few minutes (a smoke test)")
    parser.add_argument("--only", default="",
                        help=f"comma-separated workload letters ({','.join(WORKLOADS)})")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "results.json",
                        help="where to write the JSON results")
    parser.add_argument("--in-process", action="store_true",
                        help="run the workloads in this process (default: each in a fresh "
                        "child process, as a user's script would run)")
    args = parser.parse_args(argv)
    letters = [x.strip().lower() for x in args.only.split(",") if x.strip()] or list(WORKLOADS)
    unknown = [x for x in letters if x not in WORKLOADS]
    if unknown:
        parser.error(f"unknown workload(s) {unknown}; choose from {','.join(WORKLOADS)}")
    args.letters = letters
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    modules = {letter: importlib.import_module(WORKLOADS[letter]) for letter in args.letters}
    results: dict = {
        "machine": c.machine_info(),
        "quick": args.quick,
        "workloads_run": args.letters,
        "notes": [
            "each workload runs in a fresh interpreter; Ray's rows run last in it, and "
            "ray.init (ray_init_s, timed apart) is not in any wall; nor is data generation",
            "ratio_to_serial = serial wall / wall; ratio_to_physical_limit = "
            "(sum of serial task times / cores) / wall",
            "peak_rss_mb: peak of the summed RSS of the driver and all its descendants; "
            "Ray's daemons count only in Ray rows",
        ],
        "workloads": {},
    }
    machine = results["machine"]
    print(f"manymodels bench: {machine['cores']} cores ({machine['cpu_model']}), "
          f"Python {machine['python']}, {'quick' if args.quick else 'full'} sizes, "
          f"workloads {','.join(args.letters)}")
    status = 0
    start = time.perf_counter()
    if not args.in_process:
        for letter in args.letters:  # each workload in a clean interpreter
            child_out = args.out.with_name(f".{args.out.stem}-{letter}.json")
            command = [sys.executable, str(Path(__file__).resolve()), "--in-process",
                       "--only", letter, "--out", str(child_out)]
            if args.quick:
                command.append("--quick")
            code = subprocess.call(command)
            status = status or code
            if child_out.exists():
                child = json.loads(child_out.read_text())
                results["workloads"].update(child["workloads"])
                if child.get("ray_init_s") is not None:
                    results.setdefault("ray_init_s", {})[letter] = child["ray_init_s"]
                child_out.unlink()
            results["elapsed_s"] = time.perf_counter() - start
            c.write_json(args.out, results)
        print(f"suite took {time.perf_counter() - start:.1f} s; results in {args.out}")
        return status
    try:
        for letter, module in modules.items():
            began = time.perf_counter()
            try:
                outcome = module.run(args.quick)
            except Exception as exc:  # set-up failed: record it, go on with the rest
                traceback.print_exc()
                outcome = {"name": WORKLOADS[letter], "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc(), "cases": []}
                status = 1
            outcome["elapsed_s"] = time.perf_counter() - began
            results["workloads"][letter] = outcome
            results["elapsed_s"] = time.perf_counter() - start
            results["ray_init_s"] = c._RAY["init_s"]
            c.write_json(args.out, results)
    finally:
        c.stop_ray()
    print(f"suite took {time.perf_counter() - start:.1f} s; results in {args.out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
