"""The steps of ``bench/device_check.sh`` that no other bench script does, and
its one table against the targets of issue 43.

    python bench/device_check.py files-sweep --out FILE [--files N] [--sweep 10,12,...]
    python bench/device_check.py linear --out FILE [--groups N] [--device cuda]
    python bench/device_check.py table DIR [--smoke]

``files-sweep``: one model per file (workload b) and the RandomForest sweep
(workload c), each against a ``multiprocessing.Pool`` of as many workers as
manymodels' (one per core), start-up included; the serial loop of the sweep
times each setting, so that the longest-first (LPT) schedule of those times on
the workers gives the bound a sweep's wall can approach.

``linear``: ``mm.linear(device=...)`` against the CPU (NumPy) at ``--groups``
groups, OLS and logistic: the walls (a warm-up call on a small table first,
untimed, so that CUDA's start is not in them) and the largest difference of
the coefficients.

``table``: reads the JSON the steps wrote into DIR, prints one table against
the targets and writes ``DIR/device-check.json``.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import json
import multiprocessing
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
if str(BENCH_DIR) not in sys.path:
    sys.path.insert(0, str(BENCH_DIR))

import _common as c  # noqa: E402  (needs the bench directory on sys.path)

# -- files and sweep against a Pool ---------------------------------------------------


def longest_first_makespan(task_times: list[float], workers: int) -> float:
    """The wall of the longest-first schedule: each task, longest first, to the
    worker that frees up first (what a sweep's wall can approach)."""
    loads = [0.0] * max(1, workers)
    for seconds in sorted(task_times, reverse=True):
        heapq.heapreplace(loads, loads[0] + seconds)
    return max(loads)


def _files_case(n_files: int, workers: int, folder: Path) -> dict[str, Any]:
    import workload_b_files as b

    paths = b.make_files(n_files, folder)

    def with_pool() -> dict:
        with multiprocessing.Pool(workers) as pool:
            return dict(zip(paths, pool.map(b.fit_file, paths)))

    def with_manymodels() -> Any:
        import manymodels as mm

        return mm.train(b.fit_file, mm.items(paths), workers=workers, progress=False)

    case = c.Case(
        workload="b", title=f"one model per file: {n_files:,} CSV files of ~50 rows",
        tasks=n_files, params={"files": n_files, "workers": workers},
        serial=c.Tool("serial loop", functools.partial(b.serial, paths),
                      result=b.from_models),
        peers=[c.Tool(f"multiprocessing.Pool({workers}).map", with_pool,
                      result=b.from_models),
               c.Tool("manymodels mm.train", with_manymodels, result=b.from_run,
                      details=c.run_details)],
        compare=b.compare)
    return c.run_case(case)


def _sweep_case(values: list[int], workers: int) -> dict[str, Any]:
    import workload_c_sweep as sweep

    X, y = sweep.make_data()
    task_times: list[float] = []

    def serial() -> tuple[dict, float]:
        models = {}
        for n in values:
            start = time.perf_counter()
            models[n] = sweep.fit_rf(n, X=X, y=y)
            task_times.append(time.perf_counter() - start)
        return models, sum(task_times)

    def with_pool() -> dict:
        with multiprocessing.Pool(workers) as pool:
            return dict(zip(values, pool.map(functools.partial(sweep.fit_rf, X=X, y=y),
                                             values)))

    def with_manymodels() -> Any:
        import manymodels as mm

        # the settings' cost, so that the largest start first (the Pool's come as given)
        settings = mm.grid(n_estimators=values, cost=lambda setting: setting["n_estimators"])
        return mm.train(sweep.fit_rf, settings, shared={"X": X, "y": y},
                        workers=workers, progress=False)

    predict = functools.partial(sweep._predictions, X=X)
    case = c.Case(
        workload="c", title=f"sweep: {len(values)} RandomForest settings "
                           f"(n_estimators {values[0]}..{values[-1]})",
        tasks=len(values), params={"n_estimators": values, "workers": workers},
        serial=c.Tool("serial loop", serial, result=predict),
        peers=[c.Tool(f"multiprocessing.Pool({workers}).map", with_pool, result=predict),
               c.Tool("manymodels mm.train", with_manymodels,
                      result=functools.partial(sweep.from_run, X=X), details=c.run_details)],
        compare=sweep.compare)
    out = c.run_case(case)
    out["task_times_s"] = task_times
    out["longest_first_bound_s"] = (longest_first_makespan(task_times, workers)
                                    if len(task_times) == len(values) else None)
    return out


def files_sweep(args: argparse.Namespace) -> int:
    values = [int(v) for v in args.sweep.split(",")]
    result: dict[str, Any] = {"machine": c.machine_info(), "workers": args.workers}
    folder = Path(tempfile.mkdtemp(prefix="mm-device-files-"))
    try:
        result["files"] = _files_case(args.files, args.workers, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    result["sweep"] = _sweep_case(values, args.workers)
    print(f"longest-first bound of the sweep on {args.workers} workers: "
          f"{result['sweep']['longest_first_bound_s']:.2f} s")
    c.write_json(args.out, result)
    return 0


# -- mm.linear on a device against the CPU ---------------------------------------------


def linear(args: argparse.Namespace) -> int:
    import numpy as np

    import linear_bench
    import manymodels as mm

    table = linear_bench.make_table(args.groups)
    features = linear_bench.FEATURES
    mm.linear(linear_bench.make_table(1_000), by="g", features=features, target="y",
              device=args.device)  # the device's start (a CUDA context): untimed
    rows = []
    for family, target in (("ols", "y"), ("logistic", "label")):
        # NumPy's kernels (device=None) against PyTorch's on the device: keyed by
        # engine, not by device name, so that --device cpu compares the two
        timed = {}
        for engine, device in (("numpy", None), ("torch", args.device)):
            start = time.perf_counter()
            fitted = mm.linear(table, by="g", features=features, target=target,
                               family=family, device=device, workers=c.cores())
            timed[engine] = (time.perf_counter() - start, fitted)
        (cpu_s, cpu), (device_s, on_device) = timed["numpy"], timed["torch"]
        want = np.column_stack([cpu.coef, cpu.intercept])
        got = np.column_stack([on_device.coef, on_device.intercept])
        both = ~(np.isnan(want).any(axis=1) | np.isnan(got).any(axis=1))
        difference = np.abs(got[both] - want[both]) / np.maximum(np.abs(want[both]), 1.0)
        rows.append({"family": family, "groups": args.groups, "cpu_s": cpu_s,
                     "device_s": device_s, "device": args.device,
                     "speedup": cpu_s / device_s if device_s else None,
                     "reference": "numpy", "engine": "torch",
                     "max_rel_diff": float(difference.max()) if difference.size else None,
                     "compared_groups": int(both.sum())})
        print(f"{family}: NumPy {cpu_s:.2f} s, PyTorch on {args.device} {device_s:.2f} s, largest "
              f"difference {rows[-1]['max_rel_diff']:.2e}", flush=True)
    c.write_json(args.out, {"machine": c.machine_info(), "device": args.device, "rows": rows})
    return 0


# -- the table against the targets ----------------------------------------------------


def _load(folder: Path, name: str) -> dict[str, Any] | None:
    try:
        return json.loads((folder / name).read_text())
    except (OSError, ValueError):
        return None


def _target(name: str, value: float | None, limit: float, kind: str, shown: str,
            why_missing: str) -> dict[str, Any]:
    """One line of the table: ``kind`` "max" (value at most limit), "min" or
    "info" (a figure shown with no verdict)."""
    if value is None:
        return {"target": name, "value": None, "limit": limit, "met": None,
                "shown": "-", "status": why_missing}
    if kind == "info":
        return {"target": name, "value": value, "limit": limit, "met": None, "shown": shown,
                "status": "information"}
    met = value <= limit if kind == "max" else value >= limit
    return {"target": name, "value": value, "limit": limit, "met": met, "shown": shown,
            "status": "met" if met else "NOT met"}


def _million_targets(data: dict | None, why: str) -> list[dict[str, Any]]:
    rows = (data or {}).get("cases", {})
    store, again, bare = rows.get("mm+store", {}), rows.get("mm rerun", {}), rows.get("mm", {})
    ratio, rerun = store.get("ratio"), again.get("ratio")
    utilization, driver = bare.get("utilization"), store.get("driver_peak_rss_train_mb")
    cpu = store.get("driver_cpu_us_per_task")
    out = [
        _target("million: with a store / without <= 1.15x", ratio, 1.15, "max",
                f"{ratio:.2f}x" if ratio else "", why),
        _target("million: unchanged re-run / first run <= 5%", rerun, 0.05, "max",
                f"{rerun:.1%}" if rerun else "", why),
        _target("million: without a store >= 0.6 of the physical limit", utilization, 0.6,
                "min", f"{utilization:.2f}" if utilization else "", why),
        _target("million: driver during train <= 1 GB (1000 MB)", driver, 1000, "max",
                f"{driver:.0f} MB" if driver else "", why),
    ]
    if cpu is not None:
        out.append(_target("million: driver CPU per task with a store (2-core target 1.5)",
                           cpu, 1.5, "info", f"{cpu:.2f} us", why))
    return out


def _nice_target(data: dict | None, default: dict | None, why: str) -> dict[str, Any]:
    """The store's cost with the workers 5 steps nicer (opt-in), beside the default's."""
    rows = (data or {}).get("cases", {})
    ratio, wall = rows.get("mm+store", {}).get("ratio"), rows.get("mm+store", {}).get("wall_s")
    plain = (default or {}).get("cases", {}).get("mm+store", {}).get("wall_s")
    shown = (f"{ratio:.2f}x ({wall:.2f} s; at the default {plain:.2f} s)" if ratio and wall
             and plain else f"{ratio:.2f}x" if ratio else "")
    return _target("million, workers nice +5: with a store / without", ratio, 1.15, "info",
                   shown, why)


def _wall(case: dict | None, prefix: str) -> float | None:
    for row in (case or {}).get("rows", []):
        if row["tool"].startswith(prefix) and str(row["status"]).startswith("ok"):
            return row["wall_s"]
    return None


def _files_sweep_targets(data: dict | None, why: str) -> list[dict[str, Any]]:
    out = []
    for key, label in (("files", "per file"), ("sweep", "sweep")):
        case = (data or {}).get(key)
        pool, mine = _wall(case, "multiprocessing.Pool"), _wall(case, "manymodels")
        ratio = pool / mine if pool and mine else None
        out.append(_target(f"{label}: Pool wall / manymodels wall >= 1", ratio, 1.0, "min",
                           f"{ratio:.2f} (Pool {pool:.2f} s, mm {mine:.2f} s)" if ratio else "",
                           why))
    sweep = (data or {}).get("sweep") or {}
    bound, mine = sweep.get("longest_first_bound_s"), _wall(sweep, "manymodels")
    ratio = mine / bound if mine and bound else None
    out.append(_target("sweep: manymodels wall / longest-first bound <= 1.10", ratio, 1.10,
                       "max", f"{ratio:.2f} (bound {bound:.2f} s)" if ratio else "", why))
    return out


def _gpu_targets(data: dict | None, tests: dict | None, linear_data: dict | None,
                 why: str) -> list[dict[str, Any]]:
    rows = (data or {}).get("rows", [])
    pool = next((r for r in rows if r["tool"].startswith("spawn Pool")), None)
    ours = [r for r in rows if r["tool"].startswith("manymodels") and r["losses_match"]]
    best = min(ours, key=lambda r: r["wall_s"]) if ours else None
    name = best["tool"].split()[-1] if best else ""
    vs_pool = best["wall_s"] / pool["wall_s"] if best and pool else None
    tasks, processes = (data or {}).get("tasks", 32), (data or {}).get("pool", 8)  # as run
    out = [_target(f"GPU: {tasks} networks, best manymodels wall / {processes}-process Pool <= 1",
                   vs_pool,
                   1.0, "max", f"{vs_pool:.2f} ({name})" if vs_pool else "", why),
           _target("GPU: best manymodels x serial >= 5", best and best["ratio_to_serial"], 5.0,
                   "min", f"{best['ratio_to_serial']:.1f}x ({name})" if best else "", why)]
    counts = tests or {}
    ran = counts.get("tests", 0) - counts.get("skipped", 0)
    bad = counts.get("failures", 0) + counts.get("errors", 0)
    out.append(_target("GPU tests (tests/test_gpu.py): failed <= 0",
                       bad if ran > 0 else None, 0, "max",
                       f"{ran - bad} passed, {bad} failed" if ran > 0 else "", why))
    worst = max((r["max_rel_diff"] for r in (linear_data or {}).get("rows", [])
                 if r.get("max_rel_diff") is not None), default=None)
    on_cuda = (linear_data or {}).get("device", "").startswith("cuda")
    out.append(_target("mm.linear(device='cuda') equal to the CPU to 1e-6",
                       worst if on_cuda else None, 1e-6, "max",
                       f"{worst:.1e}" if worst is not None else "", why))
    return out


def _junit_counts(path: Path) -> dict[str, int] | None:
    import xml.etree.ElementTree as ET

    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        return None
    return {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}


def _gpu_present() -> bool:
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=30,
                              text=True).stdout.strip().startswith("GPU")
    except (OSError, subprocess.SubprocessError):
        return False


def table(args: argparse.Namespace) -> int:
    folder = args.folder
    steps = {}
    if args.steps is not None:  # lines "name<TAB>status<TAB>seconds", as the script writes
        for line in args.steps.read_text().splitlines():
            name, status, seconds = line.split("\t")
            steps[name] = {"status": status, "seconds": float(seconds)}
    gpu = _gpu_present()
    no_gpu = "skipped: no GPU"

    def why(step: str, needs_gpu: bool = False) -> str:
        if needs_gpu and not gpu:
            return no_gpu
        record = steps.get(step)
        return "not run" if record is None else f"step {step}: {record['status']}"

    targets = (_million_targets(_load(folder, "million.json"), why("million"))
               + [_nice_target(_load(folder, "million-nice.json"),
                               _load(folder, "million.json"), why("million-nice"))]
               + _files_sweep_targets(_load(folder, "files-sweep.json"), why("files-sweep"))
               + _gpu_targets(_load(folder, "gpu.json") if gpu else None,
                              _junit_counts(folder / "gpu-tests.xml") if gpu else None,
                              _load(folder, "linear.json"), why("gpu", True)))
    if gpu:  # a missing figure of a GPU step says which step and why
        for line, step in zip(targets[-4:], ("gpu", "gpu", "gpu-tests", "linear")):
            if line["value"] is None:
                line["status"] = why(step)
        counts = _junit_counts(folder / "gpu-tests.xml")
        if counts and counts["tests"] and counts["skipped"] == counts["tests"]:
            # (a GPU nvidia-smi lists, which the tests' PyTorch cannot use)
            targets[-2]["status"] = (f"step gpu-tests: all {counts['tests']} tests skipped "
                                     "(see device-check.log)")
    summary = {"smoke": args.smoke, "gpu": gpu, "machine": c.machine_info(),
               "steps": steps, "targets": targets}
    c.write_json(folder / "device-check.json", summary)
    width = max(len(line["target"]) for line in targets)
    print(f"\ndevice check{' (smoke sizes: not a measurement)' if args.smoke else ''}: "
          f"{summary['machine']['cores']} cores, {'a GPU' if gpu else 'no GPU'}")
    for name, record in steps.items():
        print(f"  step {name:<12} {record['status']:<24} {record['seconds']:>6.1f} s")
    print(f"{'target':<{width}}  {'measured':<34}  status")
    for line in targets:
        print(f"{line['target']:<{width}}  {line['shown']:<34}  {line['status']}")
    print(f"JSON in {folder}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    files = commands.add_parser("files-sweep")
    files.add_argument("--files", type=int, default=2_000)
    files.add_argument("--sweep", default=",".join(str(n) for n in range(10, 50, 2)))
    files.add_argument("--workers", type=int, default=c.cores())
    files.add_argument("--out", type=Path, required=True)
    lin = commands.add_parser("linear")
    lin.add_argument("--groups", type=int, default=1_000_000)
    lin.add_argument("--device", default="cuda")
    lin.add_argument("--out", type=Path, required=True)
    tab = commands.add_parser("table")
    tab.add_argument("folder", type=Path)
    tab.add_argument("--steps", type=Path, default=None)
    tab.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    return {"files-sweep": files_sweep, "linear": linear, "table": table}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
