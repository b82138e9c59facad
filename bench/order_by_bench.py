"""What ``mm.groups(..., order_by=...)`` costs the planner: the layout of a
shuffled table sorted by key alone, and by key then a date column (one sort
either way), at a modest size. Prints a table and writes bench/results/order_by.json.

    python bench/order_by_bench.py [rows] [groups]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

import manymodels as mm
from manymodels.planning.plan import group_layout


def layout_seconds(frame: pd.DataFrame, **options) -> float:
    best = float("inf")
    for _ in range(3):
        source = mm.groups(frame, by="sku", **options)
        start = time.perf_counter()
        group_layout(source)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000
    groups = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"sku": rng.integers(0, groups, rows),
                          "date": pd.Timestamp("2020-01-01")
                          + pd.to_timedelta(rng.integers(0, 1000, rows), unit="D"),
                          "y": rng.normal(size=rows)})
    cases = {"by key": {}, "by key, then date": {"order_by": "date"}}
    results = {name: layout_seconds(frame, **options) for name, options in cases.items()}
    print(f"{rows} shuffled rows, {groups} groups: planner layout (best of 3)")
    for name, seconds in results.items():
        print(f"  {name:<20} {seconds * 1000:8.1f} ms")
    out = Path(__file__).parent / "results" / "order_by.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "groups": groups,
                               "layout_ms": {k: v * 1000 for k, v in results.items()}},
                              indent=2))


if __name__ == "__main__":
    main()
