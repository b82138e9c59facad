"""A backtest of many daily series: mm.backtest against statsforecast's
``cross_validation`` on the same series and the same two models.

The two candidates are models both libraries have and compute the same way:
a seasonal naive forecast (season 7: each day repeats the same weekday of the
last training week) and the historic average (the mean of the training
target). Both tools run 3 expanding windows of horizon 28 (step 28), with
the cores as workers (statsforecast's ``n_jobs``), start-up included; the
per-window MAE and RMSE of every series, model and cutoff, and every
forecast, are compared, to 1e-9. manymodels runs each candidate's windows in
one task per group, twice: on ``format="numpy"`` groups (arrays, as
statsforecast's models see them) and on pandas groups (a frame per group,
and the fit of the bench's first version, which sorts each window by date).

statsforecast pins pandas below 3, which the project uses, so it runs in an
environment of its own: ``bench/.venv-statsforecast`` (git-ignored), made
on first use with ``pip install statsforecast``, in a child process that
reads the same series from a Parquet file and writes its ``cross_validation``
back. ``make bench`` runs this script.

Usage: python bench/backtest_bench.py [--series 1000] [--days 365] [--formats numpy,pandas]
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
ENVIRONMENT = BENCH / ".venv-statsforecast"
sys.path.insert(0, str(BENCH))

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
    """The pandas fit (the bench's first version: it sorts each window)."""
    return MODELS[model](df.sort_values("ds")["y"].to_numpy())


def fit_arrays(rows: dict, model: str) -> object:
    """The ``format="numpy"`` fit: the window's rows come sorted by time."""
    return MODELS[model](rows["y"])


def make_series(series: int, days: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = series * days
    weekly = np.tile(np.sin(np.arange(days) * 2 * np.pi / 7), series)
    level = np.repeat(rng.uniform(5, 50, size=series), days)
    return pd.DataFrame({
        "unique_id": np.repeat([f"s{i:05d}" for i in range(series)], days),
        "ds": np.tile(pd.date_range("2023-01-01", periods=days), series),
        "y": level + 3 * weekly + rng.normal(size=n)})


def statsforecast_environment() -> Path:
    """The Python of ``bench/.venv-statsforecast``, made on first use."""
    python = ENVIRONMENT / "bin" / "python"
    if not python.exists():
        print(f"making {ENVIRONMENT} with statsforecast (first use only)...", flush=True)
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(ENVIRONMENT)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", "statsforecast"],
                       check=True)
    return python


def run_statsforecast(data: Path, out: Path, cores: int) -> None:
    """In the statsforecast environment: its cross_validation, timed."""
    from statsforecast import StatsForecast
    from statsforecast.models import HistoricAverage as SFAverage
    from statsforecast.models import SeasonalNaive as SFNaive

    frame = pd.read_parquet(data)
    begin = time.perf_counter()
    sf = StatsForecast(models=[SFNaive(season_length=SEASON), SFAverage()], freq="D",
                       n_jobs=cores)
    cv = sf.cross_validation(df=frame, h=HORIZON, n_windows=WINDOWS, step_size=HORIZON)
    seconds = time.perf_counter() - begin
    cv = cv.reset_index() if "unique_id" not in cv.columns else cv
    cv.to_parquet(out)
    print(json.dumps({"seconds": seconds}))


def time_statsforecast(frame: pd.DataFrame, cores: int) -> tuple[float, pd.DataFrame]:
    python = statsforecast_environment()
    with tempfile.TemporaryDirectory() as folder:
        data, out = Path(folder) / "series.parquet", Path(folder) / "cv.parquet"
        frame.to_parquet(data)
        done = subprocess.run([str(python), __file__, "--statsforecast", str(data), str(out),
                               "--cores", str(cores)], check=True, capture_output=True,
                              text=True, env={**os.environ, "PYTHONPATH": ""})
        seconds = json.loads(done.stdout.strip().splitlines()[-1])["seconds"]
        return seconds, pd.read_parquet(out)


def time_manymodels(frame: pd.DataFrame, format: str, cores: int) -> tuple[float, object]:
    import manymodels as mm

    # the modules behind these names load on first use (PEP 562): imported here,
    # as statsforecast's are before its clock starts
    _ = (mm.train, mm.groups, mm.grid, mm.backtest)
    begin = time.perf_counter()
    run = mm.train(fit_arrays if format == "numpy" else fit,
                   mm.groups(frame, by="unique_id", order_by="ds", format=format)
                   * mm.grid(model=list(MODELS)),
                   evaluate=mm.backtest("ds", horizon=HORIZON, windows=WINDOWS,
                                        target="y", metrics=["mae", "rmse"]),
                   select="mae", workers=cores, progress=False)
    return time.perf_counter() - begin, run


def differences(run: object, cv: pd.DataFrame, series: int) -> tuple[float, float]:
    """The largest difference of the per-window metrics and of the forecasts."""
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
    joined = ours.join(theirs.add_suffix("_sf"), how="outer")
    if joined.isna().any().any() or len(joined) != series * len(MODELS) * WINDOWS:
        raise AssertionError("the windows of the two tools differ")
    metric = float(max((joined["mae"] - joined["mae_sf"]).abs().max(),
                       (joined["rmse"] - joined["rmse_sf"]).abs().max()))
    theirs = cv.melt(id_vars=["unique_id", "ds", "cutoff"], value_vars=list(MODELS),
                     var_name="model", value_name="forecast_sf")
    got = run.forecasts.merge(theirs, left_on=["unique_id", "model", "time"],
                              right_on=["unique_id", "model", "ds"], how="outer")
    if got["forecast"].isna().any() or got["forecast_sf"].isna().any():
        raise AssertionError("the forecast rows of the two tools differ")
    return metric, float((got["forecast"] - got["forecast_sf"]).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=1000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--formats", default="numpy,pandas",
                        help="the group formats manymodels runs: numpy, pandas or both")
    parser.add_argument("--statsforecast", nargs=2, type=Path, metavar=("DATA", "OUT"),
                        help=argparse.SUPPRESS)  # the child in statsforecast's environment
    parser.add_argument("--cores", type=int, default=None)
    parser.add_argument("--out", type=Path, default=BENCH / "results" / "backtest_bench.json")
    args = parser.parse_args()
    if args.statsforecast:
        run_statsforecast(*args.statsforecast, args.cores)
        return
    import _common

    cores = args.cores or _common.cores()
    frame = make_series(args.series, args.days)
    sf_s, cv = time_statsforecast(frame, cores)
    print(f"{args.series} series x {args.days} days, {WINDOWS} windows of {HORIZON}, "
          f"2 models, {cores} workers (start-up included)")
    print(f"statsforecast cross_validation      {sf_s:7.2f} s")
    data = {"machine": _common.machine_info(), "series": args.series, "days": args.days,
            "horizon": HORIZON, "windows": WINDOWS, "workers": cores,
            "statsforecast_s": sf_s, "manymodels": {}}
    for format in [f.strip() for f in args.formats.split(",") if f.strip()]:
        seconds, run = time_manymodels(frame, format, cores)
        metric, forecast = differences(run, cv, args.series)
        worst = max(metric, forecast)
        if worst > 1e-9:
            raise AssertionError(f"format={format!r}: metrics or forecasts differ by {worst}")
        data["manymodels"][format] = {"seconds": seconds, "max_metric_difference": metric,
                                      "max_forecast_difference": forecast}
        print(f"manymodels format={format + ',':7} select {seconds:7.2f} s "
              f"({seconds / sf_s:.2f}x statsforecast; metrics within {metric:.1e}, "
              f"forecasts within {forecast:.1e})")
    _common.write_json(args.out, data)


if __name__ == "__main__":
    main()
