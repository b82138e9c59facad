"""The dashboard's polls of a run stored in task blocks (default 1,000,000 tasks
in 30 blocks), written directly with ``taskblocks.insert`` (no fit runs).

Times, for a live (``running``) run:

* the first poll: reading and decoding every block, then each section from it;
* a repeat poll with nothing new (the blocks already decoded are kept);
* a repeat poll after one more block (1/30 of the run) was written;
* the first poll of the same tasks in a store written before blocks (a row
  per task in ``tasks``), with ``--old``.

Usage: python bench/dashboard_blocks_bench.py [--tasks 1000000] [--blocks 30] [--old]
       [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

import _common as c  # the bench directory is on sys.path: this script's own
from manymodels.observe.dashboard.queries import SECTIONS, Queries
from manymodels.store import database, newstore, taskblocks


def block(first: int, last: int) -> pa.Table:
    i = np.arange(first, last)
    failed = i % 1000 == 7
    return taskblocks.table({
        "task_index": i,
        "key": [f'["s{n // 1000:04d}", "i{n % 1000:03d}"]' for n in i],
        "identity": [f"{n:032x}" for n in i],
        "status": np.where(failed, "failed", "ok"),
        "attempts": np.ones(len(i), np.int64),
        "duration_s": 0.01 + (i % 97) / 1000,
        "started_at": 1000.0 + (i // 16) * 0.057,
        "worker": i % 16,
        "metrics": [f'{{"rmse": {(n % 89) / 10}, "r2": 0.5}}' for n in i],
        "error": [f"Traceback...\nValueError: bad group {n}" if f else None
                  for n, f in zip(i, failed)],
    })


def make_store(path: Path, tasks: int, blocks: int, old: bool = False) -> None:
    newstore.prepare_directory(path)
    conn = database.connect(path)
    conn.execute("BEGIN IMMEDIATE")
    run_id = database.insert_run(conn, backend="processes", workers=16, source="groups(...)",
                                 fit="bench.fit", tasks=tasks + tasks // blocks,
                                 key_columns=["store", "item"], param_columns=[],
                                 code_detail={})
    size = -(-tasks // blocks)
    for first in range(0, tasks, size):
        rows = block(first, min(first + size, tasks))
        if old:
            conn.executemany(
                f"INSERT INTO tasks(run_id, {', '.join(taskblocks.COLUMNS)}) "
                f"VALUES (?{', ?' * len(taskblocks.COLUMNS)})",
                [(run_id, *row.values()) for row in rows.to_pylist()])
        else:
            taskblocks.insert(conn, run_id, rows)
    conn.execute("COMMIT")
    conn.close()


def poll(queries: Queries, numbers: dict, label: str) -> None:
    """One poll: the run's tasks brought up to date, then each section."""
    memo: dict = {}
    began = time.perf_counter()
    run = memo["run"] = queries.run_row(1)
    queries._tasks(run, memo)
    numbers[f"{label}_read_s"] = round(time.perf_counter() - began, 4)
    for name in SECTIONS:
        start = time.perf_counter()
        queries.section(1, name, "", memo)
        numbers[f"{label}_{name}_s"] = round(time.perf_counter() - start, 4)
    start = time.perf_counter()
    queries.section(1, "failures", "s0420", memo)
    numbers[f"{label}_search_s"] = round(time.perf_counter() - start, 4)
    numbers[f"{label}_total_s"] = round(time.perf_counter() - began, 4)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--blocks", type=int, default=30)
    parser.add_argument("--old", action="store_true", help="also a store written before blocks")
    parser.add_argument("--out", default="bench/results/dashboard_blocks.json")
    args = parser.parse_args()
    numbers: dict = {"tasks": args.tasks, "blocks": args.blocks, "machine": platform.node(),
                     "cpus": os.cpu_count(), "load_average": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="manymodels-dashboard-blocks-") as tmp:
        path = Path(tmp) / "blocks"
        began = time.perf_counter()
        make_store(path, args.tasks, args.blocks)
        numbers["write_s"] = round(time.perf_counter() - began, 2)
        numbers["index_mb"] = round((path / database.INDEX_NAME).stat().st_size / 2**20, 1)
        queries = Queries(path)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        poll(queries, numbers, "first")
        numbers["kept_mb_about"] = round(
            (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024)
        poll(queries, numbers, "repeat")
        conn = database.connect(path)
        conn.execute("BEGIN IMMEDIATE")
        taskblocks.insert(conn, 1, block(args.tasks, args.tasks + args.tasks // args.blocks))
        conn.execute("COMMIT")
        poll(queries, numbers, "new_block")
        numbers["blocks_decoded"] = queries._cache[1].blocks_read
        if args.old:
            path = Path(tmp) / "old"
            make_store(path, args.tasks, args.blocks, old=True)
            poll(Queries(path), numbers, "old_store_first")
    c.print_and_write(numbers, Path(args.out))


if __name__ == "__main__":
    main()
