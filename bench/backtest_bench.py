"""A backtest of many daily series: mm.backtest against statsforecast's
``cross_validation`` on the same series and the same two models.

The two candidates are models both libraries have and compute the same way:
a seasonal naive forecast (season 7: each day repeats the same weekday of the
last training week) and the historic average (the mean of the training
target). Both tools run 3 expanding windows of horizon 28 (step 28); the
per-window MAE and RMSE of every series, model and cutoff are compared, to
1e-6. Wall times of both are reported (statsforecast with ``n_jobs`` = the
cores; manymodels on as many worker processes).

statsforecast is not in the ``bench`` extra: its dependencies (fugue, triad)
install pandas < 3 over the pandas 3 the rest of the project uses, so run
this script in an environment of its own (``pip install statsforecast``).

Usage: python bench/backtest_bench.py [--series 1000] [--days 365] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common  # noqa: E402
import manymodels as mm  # noqa: E402

HORIZON, WINDOWS, SEASON = 28, 3, 7


class SeasonalNaive:
    """The last ``SEASON`` training values, repeated over the horizon."""

    def __init__(self, history: np.ndarray) -> None:
        self.last = history[-SEASON:]

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return np.resize(self.last, len(X))


class HistoricAverage:
    def __init__(self, history: np.ndarray) -> None:
        self.mean = float(np.mean(history))

    def predict(self, X: pd.DataFrame) -> np.ndarray:
        return np.full(len(X), self.mean)


MODELS = {"SeasonalNaive": SeasonalNaive, "HistoricAverage": HistoricAverage}


def fit(df: pd.DataFrame, model: str) -> object:
    return MODELS[model](df.sort_values("ds")["y"].to_numpy())


def make_series(series: int, days: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = series * days
    weekly = np.tile(np.sin(np.arange(days) * 2 * np.pi / 7), series)
    level = np.repeat(rng.uniform(5, 50, size=series), days)
    return pd.DataFrame({
        "unique_id": np.repeat([f"s{i:05d}" for i in range(series)], days),
        "ds": np.tile(pd.date_range("2023-01-01", periods=days), series),
        "y": level + 3 * weekly + rng.normal(size=n)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--out", type=Path,
                        default=_common.BENCH_DIR / "results" / "backtest_bench.json")
    args = parser.parse_args()
    from statsforecast import StatsForecast
    from statsforecast.models import HistoricAverage as SFAverage
    from statsforecast.models import SeasonalNaive as SFNaive

    frame = make_series(args.series, args.days)
    cores = _common.cores()
    begin = time.perf_counter()
    run = mm.train(fit, mm.groups(frame, by="unique_id") * mm.grid(model=list(MODELS)),
                   evaluate=mm.backtest("ds", horizon=HORIZON, windows=WINDOWS,
                                        target="y", metrics=["mae", "rmse"]),
                   select="mae", workers=cores, progress=False)
    mm_s = time.perf_counter() - begin

    begin = time.perf_counter()
    sf = StatsForecast(models=[SFNaive(season_length=SEASON), SFAverage()], freq="D",
                       n_jobs=cores)
    cv = sf.cross_validation(df=frame, h=HORIZON, n_windows=WINDOWS, step_size=HORIZON)
    sf_s = time.perf_counter() - begin

    cv = cv.reset_index() if "unique_id" not in cv.columns else cv
    rows = []
    for name in MODELS:
        error = cv["y"] - cv[name]
        scored = pd.DataFrame({"unique_id": cv["unique_id"], "cutoff": cv["cutoff"],
                               "abs": error.abs(), "sq": error ** 2})
        grouped = scored.groupby(["unique_id", "cutoff"])
        rows.append(pd.DataFrame({"mae": grouped["abs"].mean(),
                                  "rmse": np.sqrt(grouped["sq"].mean())}).assign(model=name))
    theirs = pd.concat(rows).reset_index().set_index(["unique_id", "model", "cutoff"])
    ours = run.evaluation.set_index(["unique_id", "model", "cutoff"])[["mae", "rmse"]]
    joined = ours.join(theirs, rsuffix="_sf", how="outer")
    if joined.isna().any().any() or len(joined) != args.series * len(MODELS) * WINDOWS:
        raise AssertionError("the windows of the two tools differ")
    worst = float(max((joined["mae"] - joined["mae_sf"]).abs().max(),
                      (joined["rmse"] - joined["rmse_sf"]).abs().max()))
    if worst > 1e-6:
        raise AssertionError(f"metrics differ by up to {worst}")
    data = {"machine": _common.machine_info(), "series": args.series, "days": args.days,
            "horizon": HORIZON, "windows": WINDOWS, "workers": cores,
            "manymodels_s": mm_s, "statsforecast_s": sf_s, "max_metric_difference": worst,
            "window_rows_compared": len(joined)}
    print(f"{args.series} series x {args.days} days, {WINDOWS} windows of {HORIZON}, "
          f"2 models, {cores} cores")
    print(f"manymodels backtest      {mm_s:7.2f} s (with refits and selection)")
    print(f"statsforecast cross_val  {sf_s:7.2f} s")
    print(f"per-window mae/rmse agree on {len(joined)} windows, max difference {worst:.2e}")
    _common.write_json(args.out, data)


if __name__ == "__main__":
    main()
