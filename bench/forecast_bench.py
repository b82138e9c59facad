"""Forecasting h steps ahead: ``run.forecast(h)`` against statsforecast's
``StatsForecast.forecast`` on the same daily series and the same two models.

statsforecast fits each series and forecasts it in one call, with the future
dates made from ``freq="D"``. manymodels trains one model per series into a
store (timed apart), then ``run.forecast(h)`` makes each series' future dates
itself (its frequency inferred from its own dates) and asks each stored
model for ``forecast(h)`` on the engine. The dates and values of both are
compared exactly: the same series, dates and forecasts, to the last bit.
statsforecast runs in ``bench/.venv-statsforecast`` (see backtest_bench.py).

Usage: python bench/forecast_bench.py [--series 1000] [--days 365] [--horizon 28]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

SEASON = 7
MODELS = {"SeasonalNaive": "naive", "HistoricAverage": "average"}


class SeasonalNaive:
    """statsforecast's SeasonalNaive, fitted: the last season, repeated."""

    def __init__(self, history: np.ndarray) -> None:
        self.last = np.asarray(history, dtype=float)[-SEASON:]

    def forecast(self, h: int) -> np.ndarray:
        return np.resize(self.last, h)


class HistoricAverage:
    def __init__(self, history: np.ndarray) -> None:
        self.mean = float(np.mean(history))

    def forecast(self, h: int) -> np.ndarray:
        return np.full(h, self.mean)


def fit_naive(rows: dict) -> SeasonalNaive:
    return SeasonalNaive(rows["y"])


def fit_average(rows: dict) -> HistoricAverage:
    return HistoricAverage(rows["y"])


def run_statsforecast(data: Path, out: Path, cores: int, horizon: int) -> None:
    """In the statsforecast environment: its fit-and-forecast, timed."""
    from statsforecast import StatsForecast
    from statsforecast.models import HistoricAverage as SFAverage
    from statsforecast.models import SeasonalNaive as SFNaive

    frame = pd.read_parquet(data)
    begin = time.perf_counter()
    sf = StatsForecast(models=[SFNaive(season_length=SEASON), SFAverage()], freq="D",
                       n_jobs=cores)
    forecasts = sf.forecast(df=frame, h=horizon)
    seconds = time.perf_counter() - begin
    forecasts = forecasts.reset_index() if "unique_id" not in forecasts.columns else forecasts
    forecasts.to_parquet(out)
    print(json.dumps({"seconds": seconds}))


def time_statsforecast(frame: pd.DataFrame, cores: int, horizon: int
                       ) -> tuple[float, pd.DataFrame]:
    from backtest_bench import statsforecast_environment

    python = statsforecast_environment()
    with tempfile.TemporaryDirectory() as folder:
        data, out = Path(folder) / "series.parquet", Path(folder) / "forecast.parquet"
        frame.to_parquet(data)
        done = subprocess.run([str(python), __file__, "--statsforecast", str(data), str(out),
                               "--cores", str(cores), "--horizon", str(horizon)], check=True,
                              capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
        seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
        return seconds, pd.read_parquet(out)


def time_manymodels(frame: pd.DataFrame, model: str, cores: int, horizon: int,
                    store: Path) -> tuple[float, float, pd.DataFrame]:
    """(train seconds, forecast seconds, forecasts) of one model per series."""
    import manymodels as mm

    _ = (mm.train, mm.groups)  # loaded before the clock starts
    begin = time.perf_counter()
    run = mm.train(fit_naive if model == "naive" else fit_average,
                   mm.groups(frame, by="unique_id", order_by="ds", format="numpy"),
                   store=store, workers=cores, progress=False)
    trained = time.perf_counter() - begin
    begin = time.perf_counter()
    forecasts = run.forecast(horizon, workers=cores)
    return trained, time.perf_counter() - begin, forecasts


def compare(ours: pd.DataFrame, theirs: pd.DataFrame, column: str) -> float:
    """The largest difference of the forecasts, after checking that both
    have the same series and dates in the same order."""
    if len(ours) != len(theirs) or not (
            (ours["unique_id"].to_numpy() == theirs["unique_id"].to_numpy()).all()
            and (ours["ds"].to_numpy() == theirs["ds"].to_numpy()).all()):
        raise AssertionError("the future rows of the two tools differ")
    return float(np.abs(ours["yhat"].to_numpy() - theirs[column].to_numpy()).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--horizon", type=int, default=28)
    parser.add_argument("--statsforecast", nargs=2, type=Path, metavar=("DATA", "OUT"),
                        help=argparse.SUPPRESS)  # the child in statsforecast's environment
    parser.add_argument("--cores", type=int, default=None)
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "forecast_bench.json")
    args = parser.parse_args()
    if args.statsforecast:
        run_statsforecast(*args.statsforecast, args.cores, args.horizon)
        return
    import _common
    from backtest_bench import make_series

    cores = args.cores or _common.cores()
    frame = make_series(args.series, args.days)
    sf_s, theirs = time_statsforecast(frame, cores, args.horizon)
    print(f"{args.series} series x {args.days} days, h={args.horizon}, {cores} workers, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"statsforecast fit + forecast, 2 models        {sf_s:7.2f} s")
    data = {"machine": _common.machine_info(), "series": args.series, "days": args.days,
            "horizon": args.horizon, "workers": cores, "statsforecast_s": sf_s,
            "manymodels": {}}
    with tempfile.TemporaryDirectory() as folder:
        for column, model in MODELS.items():
            trained, forecast_s, ours = time_manymodels(frame, model, cores, args.horizon,
                                                        Path(folder) / model)
            difference = compare(ours, theirs, column)
            if difference != 0.0:
                raise AssertionError(f"{column}: the forecasts differ by {difference}")
            data["manymodels"][column] = {"train_s": trained, "forecast_s": forecast_s,
                                          "max_difference": difference}
            print(f"manymodels {column:15} train {trained:6.2f} s, forecast {forecast_s:6.2f} s "
                  "(same dates and values)")
    _common.write_json(args.out, data)


if __name__ == "__main__":
    main()
