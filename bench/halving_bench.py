"""Successive halving against full evaluation of every candidate per group.

G daily series (``days`` each), 9 candidates (Ridge alphas from 1e-3 to 1e5),
a backtest of 3 windows of horizon 28: full evaluation fits 9 x 3 windows per
group, ``mm.halving("rmse", eta=3)`` 9 + 3 + 1. Reported: wall times, window
fits, and how close halving's winners score to the full evaluation's best.

Usage: python bench/halving_bench.py [--groups 500] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from sklearn.base import clone
from sklearn.linear_model import Ridge

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import manymodels as mm  # noqa: E402

ALPHAS = [1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0, 1e3, 1e4, 1e5]


def fit(df: pd.DataFrame, model: Ridge) -> Ridge:
    return clone(model).fit(df[["x1", "x2", "lag7"]], df["sales"])


def make_series(groups: int, days: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = groups * days
    frame = pd.DataFrame({"sku": np.repeat(np.arange(groups), days),
                          "date": np.tile(pd.date_range("2023-01-01", periods=days), groups),
                          "x1": rng.normal(size=n), "x2": rng.normal(size=n)})
    weekly = np.tile(np.sin(np.arange(days) * 2 * np.pi / 7), groups)
    frame["sales"] = 10 + 3 * weekly + frame["x1"] - 0.5 * frame["x2"] + rng.normal(size=n)
    frame["lag7"] = frame.groupby("sku")["sales"].shift(7).fillna(10.0)
    return frame


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=500)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--out", type=Path,
                        default=_common.BENCH_DIR / "results" / "halving_bench.json")
    args = parser.parse_args()
    frame = make_series(args.groups, args.days)
    source = mm.groups(frame, by="sku") * mm.grid(model=[Ridge(alpha=a) for a in ALPHAS])
    splitter = mm.backtest("date", horizon=28, windows=3, target="sales",
                           features=["x1", "x2", "lag7"])
    results = {}
    runs = {}
    for name, select in (("full", "rmse"), ("halving", mm.halving("rmse", eta=3))):
        begin = time.perf_counter()
        runs[name] = mm.train(fit, source, evaluate=splitter, select=select, progress=False)
        results[name] = {"wall_s": time.perf_counter() - begin}
    full = runs["full"].results
    results["full"]["window_fits"] = len(full) * 3
    results["halving"]["window_fits"] = int(runs["halving"].results["window_fits"].sum())
    best_full = runs["full"].best().set_index("sku")["rmse"]
    best_halving = runs["halving"].best().set_index("sku")["rmse"]
    regret = (best_halving / best_full - 1).to_numpy()
    data = {"machine": _common.machine_info(), "groups": args.groups, "days": args.days,
            "candidates": len(ALPHAS), "results": results,
            "halving_rmse_over_best_median": float(np.median(regret)),
            "halving_rmse_over_best_max": float(regret.max()),
            "same_winner_share": float(np.mean(np.isclose(regret, 0)))}
    print(f"{args.groups} series x {len(ALPHAS)} candidates, backtest 3 x 28 days")
    for name, row in results.items():
        print(f"{name:<8} {row['wall_s']:7.2f} s  {row['window_fits']:6d} window fits")
    print(f"halving's winner: same as full in {data['same_winner_share']:.0%} of groups; its "
          f"rmse exceeds the best by {data['halving_rmse_over_best_median']:.2%} (median), "
          f"{data['halving_rmse_over_best_max']:.2%} (max)")
    _common.write_json(args.out, data)


if __name__ == "__main__":
    main()
