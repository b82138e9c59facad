"""A backtest of many daily series: mm.backtest against statsforecast's
``cross_validation`` on the same series and the same models.

Two jobs (``--model``):

* ``naive`` (the default): two candidates both libraries have and compute
  the same way: a seasonal naive forecast (season 7: each day repeats the
  same weekday of the last training week) and the historic average (the
  mean of the training target); manymodels selects the better per series.
* ``autoets``: statsforecast's ``AutoETS(season_length=7)`` called inside
  manymodels' ``fit`` (one series a group; the fitted model returned as it
  is, which a backtest asks for ``predict(h)``), against statsforecast's
  own ``cross_validation`` with that model. It runs in statsforecast's
  environment, where manymodels is installed too (editable, from this
  checkout).

Both tools run 3 expanding windows of horizon 28 (step 28), with the cores
as workers (statsforecast's ``n_jobs``), start-up included, and fit each
window once: manymodels with ``final_model="last_window"``, as
statsforecast's ``cross_validation`` makes no fit on all rows after the
windows (``--final-model all_rows`` adds that fit, a fourth per series).
Each run is a child process of its own that reads the same series from a
Parquet file and times its job after its imports; it reports the wall
time, the CPU time of the job (its process and its workers) and the peak
PSS of its process tree
(psutil's ``memory_full_info().pss`` summed over the tree, sampled during
the job: ``_common.PeakRSS``). The runs alternate, ``--repeat`` times, and
the table gives the minimum and median of each. The per-window MAE and
RMSE of every series, model and cutoff are compared, to 1e-9, and so is
every forecast up to 20,000 series (above that the metrics alone: the
forecast tables would hold tens of millions of rows).

manymodels' runs are timed twice over: ``train`` (what the targets name),
and with ``run.forecasts`` made after it (statsforecast's
``cross_validation`` returns its forecasts as a frame).

statsforecast pins pandas below 3, which the project uses, so it runs in an
environment of its own: ``bench/.venv-statsforecast`` (git-ignored), made
on first use with ``pip install statsforecast`` and this checkout. Where it
cannot be made (no statsforecast to install) or ``--no-statsforecast`` is
given, the naive job times manymodels alone and says so: nothing is
compared. ``make bench`` runs this script.

Usage: python bench/backtest_bench.py [--series 1000] [--days 365] [--formats numpy,pandas]
                                      [--model naive|autoets] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

BENCH = Path(__file__).resolve().parent
ENVIRONMENT = BENCH / ".venv-statsforecast"
sys.path.insert(0, str(BENCH))

HORIZON, WINDOWS, SEASON = 28, 3, 7
#: Above this many series, forecasts are not compared row by row (metrics are).
COMPARE_FORECASTS_UP_TO = 20_000


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


def fit_autoets(rows: Any) -> Any:
    """statsforecast's AutoETS fitted on the window's history, returned as it
    is: a backtest asks it for ``predict(h)``."""
    from statsforecast.models import AutoETS

    y = rows["y"] if isinstance(rows, dict) else rows.sort_values("ds")["y"].to_numpy()
    return AutoETS(season_length=SEASON).fit(np.asarray(y, dtype=np.float64))


def model_names(model: str) -> list[str]:
    return ["AutoETS"] if model == "autoets" else list(MODELS)


def make_series(series: int, days: int) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    n = series * days
    weekly = np.tile(np.sin(np.arange(days) * 2 * np.pi / 7), series)
    level = np.repeat(rng.uniform(5, 50, size=series), days)
    return pd.DataFrame({
        "unique_id": np.repeat([f"s{i:06d}" for i in range(series)], days),
        "ds": np.tile(pd.date_range("2023-01-01", periods=days), series),
        "y": level + 3 * weekly + rng.normal(size=n)})


def statsforecast_environment() -> Path | None:
    """The Python of ``bench/.venv-statsforecast``, made on first use, with
    statsforecast and this checkout of manymodels (editable); None, said,
    where it cannot be made (no statsforecast to install: offline, say)."""
    python = ENVIRONMENT / "bin" / "python"
    try:
        if not _has(python, "statsforecast"):
            print(f"making {ENVIRONMENT} with statsforecast (first use only)...", flush=True)
            base = getattr(sys, "_base_executable", sys.executable)
            subprocess.run([base, "-m", "venv", str(ENVIRONMENT)], check=True)
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", "statsforecast"],
                           check=True)
        if not _has(python, "manymodels"):
            subprocess.run([str(python), "-m", "pip", "install", "--quiet", "-e",
                            str(BENCH.parent)], check=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        print(f"statsforecast is not installed and {ENVIRONMENT} could not be made with it "
              f"({exc})", flush=True)
        return None
    return python


def _has(python: Path, module: str) -> bool:
    """Whether ``python`` exists and imports ``module``."""
    return python.exists() and subprocess.run(
        [str(python), "-c", f"import {module}"], capture_output=True,
        env=_child_environment()).returncode == 0


def _child_environment(source: Path | None = None) -> dict[str, str]:
    """A child's environment: manymodels from ``source`` (a ``src`` folder)
    where given, else as installed; statsforecast's numba functions cached
    on disk (compiled once, not per run)."""
    return {**os.environ, "PYTHONPATH": str(source or ""), "NIXTLA_NUMBA_CACHE": "1"}


def warm_up(model: str) -> None:
    """AutoETS once on a short series before the clock, in both tools'
    processes: numba compiles its functions at their first call (seconds),
    and the workers, forked after, start with them compiled."""
    if model == "autoets":
        fit_autoets({"y": make_series(1, 100)["y"].to_numpy()}).predict(HORIZON)


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(
        resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _measured(job: Any) -> tuple[Any, dict[str, float]]:
    """``job()`` timed: its wall and CPU seconds (this process and the
    workers it started and waited for) and the peak PSS of the tree."""
    import _common

    cpu = _cpu_seconds()
    with _common.PeakRSS() as peak:
        begin = time.perf_counter()
        value = job()
        seconds = time.perf_counter() - begin
    return value, {"seconds": seconds, "cpu_s": _cpu_seconds() - cpu,
                   "peak_pss_mb": peak.peak_pss_mb}


def run_statsforecast(data: Path, out: Path, cores: int, model: str) -> None:
    """In the statsforecast environment: its cross_validation, measured."""
    from statsforecast import StatsForecast
    from statsforecast.models import AutoETS
    from statsforecast.models import HistoricAverage as SFAverage
    from statsforecast.models import SeasonalNaive as SFNaive

    frame = pd.read_parquet(data)
    warm_up(model)
    models = ([AutoETS(season_length=SEASON)] if model == "autoets"
              else [SFNaive(season_length=SEASON), SFAverage()])

    def job() -> pd.DataFrame:
        sf = StatsForecast(models=models, freq="D", n_jobs=cores)
        return sf.cross_validation(df=frame, h=HORIZON, n_windows=WINDOWS, step_size=HORIZON)

    cv, measured = _measured(job)
    cv = cv.reset_index() if "unique_id" not in cv.columns else cv
    cv.to_parquet(out)
    print(json.dumps(measured))


def run_manymodels(data: Path, out: Path, cores: int, model: str, format: str,
                   final_model: str) -> None:
    """manymodels' backtest (and, for the naive job, selection), measured;
    its evaluation (and forecasts, where compared) written to ``out``."""
    import manymodels as mm

    frame = pd.read_parquet(data)
    warm_up(model)
    # the modules behind these names load on first use (PEP 562): imported here,
    # as statsforecast's are before its clock starts
    _ = (mm.train, mm.groups, mm.grid, mm.backtest)

    def job() -> Any:  # the groups made inside the clock: statsforecast groups its frame in it
        groups = mm.groups(frame, by="unique_id", order_by="ds", format=format)
        evaluate = mm.backtest("ds", horizon=HORIZON, windows=WINDOWS, target="y",
                               metrics=["mae", "rmse"], final_model=final_model)
        if model == "autoets":
            return mm.train(fit_autoets, groups, evaluate=evaluate, workers=cores,
                            progress=False)
        return mm.train(fit_arrays if format == "numpy" else fit,
                        groups * mm.grid(model=list(MODELS)), evaluate=evaluate,
                        select="mae", workers=cores, progress=False)

    run, measured = _measured(job)
    series = frame["unique_id"].nunique()
    begin = time.perf_counter()
    evaluation = run.evaluation
    forecasts = run.forecasts if series <= COMPARE_FORECASTS_UP_TO else None
    measured["tables_s"] = time.perf_counter() - begin
    if model == "autoets":
        evaluation = evaluation.assign(model="AutoETS")
        forecasts = forecasts.assign(model="AutoETS") if forecasts is not None else None
    evaluation.to_parquet(out)
    if forecasts is not None:
        forecasts.to_parquet(out.with_suffix(".forecasts.parquet"))
    print(json.dumps(measured))


def _child(python: Path, tool: str, data: Path, out: Path, cores: int, model: str,
           format: str = "numpy", source: Path | None = None,
           final_model: str = "last_window") -> dict[str, float]:
    done = subprocess.run([str(python), __file__, "--child", tool, str(data), str(out),
                           "--cores", str(cores), "--model", model, "--formats", format,
                           "--final-model", final_model],
                          capture_output=True, text=True, env=_child_environment(source))
    if done.returncode != 0:
        raise RuntimeError(f"the {tool} run failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def differences(evaluation: pd.DataFrame, forecasts: pd.DataFrame | None, cv: pd.DataFrame,
                series: int, names: list[str]) -> tuple[float, float | None]:
    """The largest difference of the per-window metrics and of the forecasts
    (None where the forecasts are not compared)."""
    rows = []
    for name in names:
        error = cv["y"] - cv[name]
        scored = pd.DataFrame({"unique_id": cv["unique_id"], "cutoff": cv["cutoff"],
                               "abs": error.abs(), "sq": error ** 2})
        grouped = scored.groupby(["unique_id", "cutoff"])
        rows.append(pd.DataFrame({"mae": grouped["abs"].mean(),
                                  "rmse": np.sqrt(grouped["sq"].mean())}).assign(model=name))
    theirs = pd.concat(rows).reset_index().set_index(["unique_id", "model", "cutoff"])
    ours = evaluation.set_index(["unique_id", "model", "cutoff"])[["mae", "rmse"]]
    joined = ours.join(theirs.add_suffix("_sf"), how="outer")
    if joined.isna().any().any() or len(joined) != series * len(names) * WINDOWS:
        raise AssertionError("the windows of the two tools differ")
    metric = float(max((joined["mae"] - joined["mae_sf"]).abs().max(),
                       (joined["rmse"] - joined["rmse_sf"]).abs().max()))
    if forecasts is None:
        return metric, None
    theirs = cv.melt(id_vars=["unique_id", "ds", "cutoff"], value_vars=names,
                     var_name="model", value_name="forecast_sf")
    got = forecasts.merge(theirs, left_on=["unique_id", "model", "time"],
                          right_on=["unique_id", "model", "ds"], how="outer")
    if got["forecast"].isna().any() or got["forecast_sf"].isna().any():
        raise AssertionError("the forecast rows of the two tools differ")
    return metric, float((got["forecast"] - got["forecast_sf"]).abs().max())


def _summary(runs: list[dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"runs": runs}
    for name in runs[0]:
        values = [r[name] for r in runs]
        out[f"{name}_min"], out[f"{name}_median"] = min(values), statistics.median(values)
    return out


def _line(label: str, summary: dict[str, Any], against: dict[str, Any] | None) -> str:
    text = (f"{label:34} {summary['seconds_min']:7.2f} {summary['seconds_median']:7.2f} s"
            f"   cpu {summary['cpu_s_median']:6.2f} s   peak PSS "
            f"{summary['peak_pss_mb_median']:7.0f} MB")
    if against is not None:
        text += (f"   ({summary['seconds_median'] / against['seconds_median']:.2f}x time, "
                 f"{summary['peak_pss_mb_median'] / against['peak_pss_mb_median']:.2f}x PSS)")
    return text


def compare(args: argparse.Namespace, cores: int) -> dict[str, Any]:
    """Both tools, alternated ``args.repeat`` times, and their results compared."""
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    sf_python = None if args.no_statsforecast else statsforecast_environment()
    if sf_python is None:
        if args.model == "autoets":  # (its fit is statsforecast's AutoETS)
            raise SystemExit("--model autoets needs statsforecast (its AutoETS is fitted "
                             "inside manymodels' fit too); run --model naive without it")
        print("statsforecast is left out: manymodels runs alone, its results compared "
              "with nothing", flush=True)
    frame = make_series(args.series, args.days)
    mm_python = sf_python if args.model == "autoets" else Path(sys.executable)
    names = model_names(args.model)
    load = [os.getloadavg()]
    runs: dict[str, list[dict[str, float]]] = {"statsforecast": [],
                                               **{f: [] for f in formats}}
    with tempfile.TemporaryDirectory() as folder:
        data, cv_out = Path(folder) / "series.parquet", Path(folder) / "cv.parquet"
        frame.to_parquet(data)
        del frame
        outs = {f: Path(folder) / f"mm-{f}.parquet" for f in formats}
        for _ in range(args.repeat):
            if sf_python is not None:
                runs["statsforecast"].append(_child(sf_python, "statsforecast", data, cv_out,
                                                    cores, args.model))
            for format in formats:
                runs[format].append(_child(mm_python, "manymodels", data, outs[format], cores,
                                           args.model, format, args.manymodels_src,
                                           args.final_model))
        load.append(os.getloadavg())
        checks: dict[str, dict[str, float | None]] = {
            f: {"max_metric_difference": None, "max_forecast_difference": None}
            for f in formats}
        cv = pd.read_parquet(cv_out) if sf_python is not None else None
        for format in (formats if cv is not None else []):
            forecast_file = outs[format].with_suffix(".forecasts.parquet")
            forecasts = pd.read_parquet(forecast_file) if forecast_file.exists() else None
            metric, forecast = differences(pd.read_parquet(outs[format]), forecasts, cv,
                                           args.series, names)
            worst = max(metric, forecast or 0.0)
            if worst > 1e-9:
                raise AssertionError(f"format={format!r}: metrics or forecasts differ by "
                                     f"{worst}")
            checks[format] = {"max_metric_difference": metric,
                              "max_forecast_difference": forecast}
    sf = _summary(runs["statsforecast"]) if sf_python is not None else None
    out = {"statsforecast": sf, "manymodels": {}, "load_average": load}
    print(f"{args.series:,} series x {args.days} days, {WINDOWS} windows of {HORIZON}, "
          f"{' and '.join(names)}, final_model={args.final_model!r}, "
          f"{cores} workers (start-up included), {args.repeat} runs "
          f"alternated; load average {load[0][0]:.2f} -> {load[-1][0]:.2f}")
    print(f"{'':34} {'min':>7} {'median':>7}")
    if sf is not None:
        print(_line("statsforecast cross_validation", sf, None))
    for format in formats:
        mine = _summary(runs[format])
        out["manymodels"][format] = {**mine, **checks[format]}
        print(_line(f"manymodels format={format}", mine, sf))
        metric = checks[format]["max_metric_difference"]
        forecast = checks[format]["max_forecast_difference"]
        print(f"{'':34} + run.forecasts {mine['tables_s_median']:.2f} s; "
              + ("not compared (no statsforecast)" if metric is None else
                 f"metrics within {metric:.1e}, forecasts "
                 + (f"within {forecast:.1e}" if forecast is not None else "not compared")))
    return out


def main() -> None:
    first = __doc__.split("\n\n")[0].replace("\n", " ").replace("``", "").rstrip(".")
    parser = argparse.ArgumentParser(description=(
        f"{first}: {WINDOWS} windows of horizon {HORIZON}. statsforecast runs in "
        f"{ENVIRONMENT.relative_to(BENCH.parent)}, made on first use where it can be; "
        "without it (or with --no-statsforecast) manymodels runs alone, compared with "
        "nothing."))
    parser.add_argument("--series", type=int, default=1000, help="how many daily series")
    parser.add_argument("--days", type=int, default=365, help="days in each series")
    parser.add_argument("--formats", default="numpy,pandas",
                        help="the group formats manymodels runs: numpy, pandas or both")
    parser.add_argument("--model", choices=["naive", "autoets"], default="naive")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs of each tool, alternated")
    parser.add_argument("--no-statsforecast", action="store_true",
                        help="time manymodels alone (naive job): neither make nor run "
                             "statsforecast's environment")
    parser.add_argument("--final-model", choices=["last_window", "all_rows"],
                        default="last_window",
                        help="manymodels' final_model= (all_rows: one more fit per series)")
    parser.add_argument("--child", nargs=3, metavar=("TOOL", "DATA", "OUT"),
                        help=argparse.SUPPRESS)  # one measured run, in a process of its own
    parser.add_argument("--cores", type=int, default=None,
                        help="workers of each tool (default: the machine's cores)")
    parser.add_argument("--manymodels-src", type=Path, default=None,
                        help="run manymodels from this src folder (e.g. an older commit's, "
                             "from git archive) instead of the installed one")
    parser.add_argument("--out", type=Path, default=None,
                        help="the JSON results file (default: bench/results/"
                             "backtest_bench-MODEL-SERIES.json)")
    args = parser.parse_args()
    if args.child:
        tool, data, out = args.child
        if tool == "statsforecast":
            run_statsforecast(Path(data), Path(out), args.cores, args.model)
        else:
            run_manymodels(Path(data), Path(out), args.cores, args.model, args.formats,
                           args.final_model)
        return
    import _common

    cores = args.cores or _common.cores()
    data = {"machine": _common.machine_info(), "manymodels_src": args.manymodels_src,
            "series": args.series, "days": args.days,
            "model": args.model, "final_model": args.final_model, "horizon": HORIZON,
            "windows": WINDOWS, "workers": cores,
            "repeat": args.repeat, **compare(args, cores)}
    name = f"backtest_bench-{args.model}-{args.series}.json"
    _common.write_json(args.out or BENCH / "results" / name, data)


if __name__ == "__main__":
    main()
