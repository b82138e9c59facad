"""``mm.linear(..., store=)`` (issue 21): a re-run that reuses unchanged groups.

    python bench/linear_store_bench.py [--groups 1000000] [--changed 0.01]
                                       [--families ols,logistic] [--out FILE]

Workload: the table of ``linear_bench.py`` (N groups of 20 seeded rows, 3
features, targets ``y`` and ``label``, an in-memory Arrow table sorted by the
integer group ``g``). Per family, in a fresh store directory on local disk:

* ``no store``: ``mm.linear`` alone, nothing saved;
* ``first run``: every group fitted, the result saved as one artifact;
* ``unchanged re-run``: the same table: every group's identity hashed, the
  saved result loaded (its SHA-256 checked) and every group reused;
* ``changed re-run``: the target of one row changed in ``--changed`` of the
  groups (spread over the table): only those groups fitted.

Each is one run (the re-runs' results are checked: equal to the first, and
only the changed groups fitted); the JSON (``bench/results/linear_store.json``)
holds each call's ``timings`` (prepare, hash, load, fit, save) and the
artifact's size.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

import _common as c  # the bench directory is on sys.path: this script's own
from linear_bench import FEATURES, ROWS, make_table

BENCH_DIR = Path(__file__).resolve().parent


def call(table: pa.Table, family: str, store: Any) -> tuple[Any, float]:
    import manymodels as mm

    target = "label" if family == "logistic" else "y"
    start = time.perf_counter()
    result = mm.linear(table, by="g", features=FEATURES, target=target, family=family,
                       store=store)
    return result, time.perf_counter() - start


def changed_table(table: pa.Table, fraction: float) -> tuple[pa.Table, int]:
    """The table with one row's targets changed in every 1/fraction-th group."""
    groups = table.num_rows // ROWS
    step = max(1, round(1 / fraction))
    rows = np.arange(0, groups, step) * ROWS
    y, label = table.column("y").to_numpy().copy(), table.column("label").to_numpy().copy()
    y[rows] += 1.0
    label[rows] = 1 - label[rows]
    table = table.set_column(table.schema.get_field_index("y"), "y", pa.array(y))
    table = table.set_column(table.schema.get_field_index("label"), "label", pa.array(label))
    return table, len(rows)


def artifact_size(store: Path) -> int:
    with sqlite3.connect(store / "index.sqlite") as conn:
        return int(conn.execute("SELECT max(size) FROM artifacts").fetchone()[0])


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=1_000_000)
    parser.add_argument("--changed", type=float, default=0.01)
    parser.add_argument("--families", default="ols,logistic")
    parser.add_argument("--out", type=Path, default=BENCH_DIR / "results" / "linear_store.json")
    args = parser.parse_args(argv)
    machine = c.machine_info()
    table = make_table(args.groups)
    changed, n_changed = changed_table(table, args.changed)
    rows: list[dict[str, Any]] = []
    for family in args.families.split(","):
        _, plain = call(table, family, None)
        rows.append({"family": family, "case": "no store", "wall_s": plain, "fitted":
                     args.groups, "reused": 0, "timings": {}})
        with tempfile.TemporaryDirectory(dir=BENCH_DIR / "results") as directory:
            store = Path(directory)
            first, wall = call(table, family, store)
            rows.append({"family": family, "case": "first run", "wall_s": wall,
                         "fitted": first.fitted, "reused": first.reused,
                         "timings": first.timings, "artifact_bytes": artifact_size(store)})
            again, wall = call(table, family, store)
            if again.reused != args.groups or not np.array_equal(again.coef, first.coef,
                                                                 equal_nan=True):
                raise AssertionError("the unchanged re-run did not reuse every group")
            rows.append({"family": family, "case": "unchanged re-run", "wall_s": wall,
                         "fitted": again.fitted, "reused": again.reused,
                         "timings": again.timings})
            del again
            some, wall = call(changed, family, store)
            if some.fitted != n_changed:
                raise AssertionError(f"{some.fitted} groups fitted, {n_changed} changed")
            rows.append({"family": family, "case": f"{n_changed:,} groups changed",
                         "wall_s": wall, "fitted": some.fitted, "reused": some.reused,
                         "timings": some.timings})
            del first, some
    print(f"mm.linear with a store: {args.groups:,} groups x {ROWS} rows, "
          f"{len(FEATURES)} features ({machine['cores']} cores, load "
          f"{machine['load_average_at_start'][0]:.1f} at start)")
    print("| family | case | wall s | fitted | reused | hash s | load s | fit s | save s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        t = row["timings"]
        cells = [f"{t[k]:.2f}" if k in t else "" for k in ("hash_s", "load_s", "fit_s",
                                                            "save_s")]
        print(f"| {row['family']} | {row['case']} | {row['wall_s']:.2f} | {row['fitted']:,} | "
              f"{row['reused']:,} | " + " | ".join(cells) + " |")
    out = {"benchmark": "linear_store", "command": "bench/linear_store_bench.py",
           "machine": machine, "groups": args.groups, "rows_per_group": ROWS,
           "changed_groups": n_changed, "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
