"""The live dashboard at scale: a store of one run of N tasks (default 1,000,000).

The task rows are written in bulk through the store's own writer (no fit runs:
this measures reading). Then, each on a fresh reader (nothing cached):

* every section's SQL alone (summary, durations, metrics, slowest, failures,
  timeline), and a failures search;
* all sections in one answer, for a finished run and for the same run marked
  ``running`` (whose answers are never kept, so every poll pays this);
* the page in headless Chromium (launch, load, polls, render, DOM dump), if
  Chromium is installed, against a 200-task store for comparison.

Usage: python bench/dashboard_bench.py [--tasks 1000000] [--out FILE]
"""

from __future__ import annotations

import argparse
import platform
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pyarrow as pa

import _common as c  # the bench directory is on sys.path: this script's own
import manymodels as mm
from manymodels.identity.hashing import TaskIdentities
from manymodels.inputs.keys import encode_keys
from manymodels.observe.dashboard import DashboardServer
from manymodels.observe.dashboard.queries import SECTIONS, Queries
from manymodels.store.writer import StoreWriter


def write_store(path: Path, tasks: int, status: str = "finished") -> None:
    store = mm.Store(path)
    start = time.time() - 3600
    run_id = store._conn.execute(
        "INSERT INTO runs(started_at, finished_at, status, backend, workers, source, fit, "
        "tasks, ok, failed, reused, wall_s, key_columns, param_columns, code_detail) "
        "VALUES (?, ?, ?, 'processes', 16, 'groups(...)', 'bench.fit', ?, ?, ?, 0, 3600, "
        "'[\"store\", \"item\"]', '[]', '{}')",
        (start, start + 3600, status, tasks, tasks - tasks // 1000, tasks // 1000)).lastrowid
    store.close()
    keys = encode_keys([(f"s{i // 1000:04d}", f"i{i % 1000:03d}") for i in range(tasks)])
    hashes = pa.array([f"{i:032x}" for i in range(tasks)], pa.string())
    nothing = pa.nulls(tasks, pa.string())
    writer = StoreWriter(path, path, run_id, keys, TaskIdentities(hashes, nothing, hashes, None))
    for first in range(0, tasks, 200_000):
        rows = range(first, min(first + 200_000, tasks))
        writer.put({
            "task_index": list(rows),
            "status": ["failed" if i % 1000 == 7 else "ok" for i in rows],
            "attempts": [1] * len(rows),
            "duration_s": [0.01 + (i % 97) / 1000 for i in rows],
            "started_at": [start + (i // 16) * 0.057 for i in rows],
            "worker": [i % 16 for i in rows],
            "metrics": [f'{{"rmse": {(i % 89) / 10}, "r2": 0.5}}' for i in rows],
            "error": [f"Traceback...\nValueError: bad group {i}" if i % 1000 == 7 else None
                      for i in rows],
            "model": [None] * len(rows)})
    writer.wait()
    writer.close()


def timed(call) -> float:
    began = time.perf_counter()
    call()
    return round(time.perf_counter() - began, 3)


def chromium_page(store: Path, profile: Path) -> float | None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return None
    with DashboardServer(store) as server:
        began = time.perf_counter()
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--no-first-run", f"--user-data-dir={profile}", "--virtual-time-budget=3000",
             "--dump-dom", server.url], capture_output=True, text=True, timeout=300).stdout
        seconds = time.perf_counter() - began
    assert 'data-polls="' in dom, "the page never rendered"
    return round(seconds, 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--out", default="bench/results/dashboard.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="manymodels-dashboard-bench-") as tmp:
        big, small = Path(tmp) / "big", Path(tmp) / "small"
        numbers: dict = {"tasks": args.tasks, "machine": platform.node(),
                         "cpus": __import__("os").cpu_count(),
                         "load_average": __import__("os").getloadavg()}
        numbers["write_s"] = timed(lambda: write_store(big, args.tasks))
        write_store(small, 200)
        run = Queries(big).run_row(1)
        for name in SECTIONS:
            numbers[f"section_{name}_s"] = timed(
                lambda name=name: getattr(Queries(big), f"_{name}")(
                    run, {}, *([""] if name == "failures" else [])))
        numbers["search_s"] = timed(lambda: Queries(big)._failures(run, {}, "s0420"))
        queries = Queries(big)
        numbers["all_sections_finished_s"] = timed(lambda: queries.run(1))
        numbers["all_sections_finished_again_s"] = timed(lambda: queries.run(1))
        with mm.Store(big)._conn as conn:
            conn.execute("UPDATE runs SET status = 'running', finished_at = NULL")
        numbers["all_sections_running_s"] = timed(lambda: Queries(big).run(1))
        numbers["chromium_page_s"] = chromium_page(big, Path(tmp) / "profile")
        numbers["chromium_page_200_tasks_s"] = chromium_page(small, Path(tmp) / "profile")
    c.print_and_write(numbers, Path(args.out))


if __name__ == "__main__":
    main()
