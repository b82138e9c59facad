"""Commands that run a job on the engine: `train` (one model per group of a
table, no code) and `predict` (each row with its group's model)."""

from __future__ import annotations

import typer

from ..engine.scheduling import RunInterrupted
from ..inputs.filereads import separator_hint
from ..inputs.sourcechecks import named_twice
from .app import app
from .arguments import column_list, fail, open_store, out_path, split_list, store_path
from .outputs import check_out, check_out_of_store, out_name, said, written


def _parse_settings(param: list[str], grid: list[str]) -> tuple[dict, dict]:
    """The ``--param name=value`` and ``--grid name=v1,v2`` texts as dicts,
    refusing a malformed entry or a name given twice (keeping one of them
    silently would train something else than was asked)."""
    from .tabular import parse_assignment, parse_value

    params: dict = {}
    grid_values: dict = {}
    for entry in param:
        name, value = parse_assignment(entry, "--param")
        if name in params:
            raise ValueError(f"--param {name!r} is given twice")
        params[name] = parse_value(value)
    for entry in grid:
        name, values = parse_assignment(entry, "--grid")
        if name in grid_values:
            raise ValueError(f"--grid {name!r} is given twice")
        if name in params:
            raise ValueError(f"{name!r} is given both as --param and as --grid")
        grid_values[name] = [parse_value(v) for v in values.split(",")]
        twice = named_twice([v.strip() for v in values.split(",")])
        if twice is not None:
            raise ValueError(f"--grid {name!r} lists the value {twice!r} twice")
    return params, grid_values


@app.command()
def train(
    data: str = typer.Argument(..., help="CSV, TSV or Parquet file (or a directory of them)."),
    by: str = typer.Option(..., help="Group column(s), comma-separated."),
    target: str = typer.Option(..., help="The column to predict."),
    model: str = typer.Option(..., help="Estimator class by dotted name, e.g. "
                              "sklearn.linear_model.Ridge or lightgbm.LGBMRegressor."),
    store: str = typer.Option(
        ..., callback=store_path, help="Store directory for the runs and models."),
    features: str = typer.Option(None, help="Feature columns, comma-separated (default: "
                                 "every numeric column but --by and --target)."),
    param: list[str] = typer.Option([], help="A fixed estimator parameter, name=value; "
                                    "repeatable."),
    grid: list[str] = typer.Option([], help="Values to try per group, name=v1,v2,...; "
                                   "repeatable. The best per group is kept."),
    metrics: str = typer.Option(None, help="Comma-separated: r2, mae, mse, rmse, mape, "
                                "smape, mase (regression; default r2,mae), accuracy, f1, "
                                "balanced_accuracy, log_loss (classification; default accuracy). "
                                "The first one picks the best grid setting."),
    test_size: float = typer.Option(None, help="Fraction of each group held out "
                                    "(default 0.2; 0 scores the fit on its own rows)."),
    cv: int = typer.Option(None, help="Cross-validate with this many folds instead."),
    fallback: bool = typer.Option(True, help="Also fit a global model for groups that have "
                                  "none (used by predict)."),
    backend: str = typer.Option("processes", help="serial, threads, processes, ray, spark "
                                "or dask."),
    workers: int = typer.Option(None, min=1, help="Workers (default: usable cores)."),
    timeout: float = typer.Option(None, help="Seconds per group before it is stopped."),
    allow_failures: bool = typer.Option(False, help="Exit 0 even if some groups failed."),
    mlflow: str = typer.Option(None, "--mlflow", metavar="EXPERIMENT", help="Also log the "
                               "run to this MLflow experiment (at MLFLOW_TRACKING_URI)."),
) -> None:
    """Train one model per group of a table, evaluate it, keep it in a store.

    Example: manymodels train sales.parquet --by store --target sales
    --model sklearn.linear_model.Ridge --grid alpha=0.1,1,10 --store models/
    """
    from ..store import StoreError
    from .tabular import ArgumentError, train_table

    try:
        params, grid_values = _parse_settings(param, grid)
    except ValueError as exc:
        fail(str(exc), "--model/--param/--grid")
    for option, text in (("--by", by), ("--features", features), ("--metrics", metrics)):
        names = split_list(text)
        if text is not None and not names:
            fail(f"{text!r} names no column" if option != "--metrics" else
                  f"{text!r} names no metric", option)
        twice = named_twice(names)
        if twice is not None:
            fail(f"{twice!r} is named twice", option)
    try:  # every refusal comes before the data is read, naming the option at fault
        track = None
        if mlflow:
            from ..observe.tracking import MLflow

            try:  # (MLflow missing, or its file store, which MLflow refuses: before the
                track = MLflow(experiment=mlflow)  # data is read)
            except (ValueError, ImportError) as exc:
                fail(str(exc), "--mlflow")
        trained = train_table(data, split_list(by), target, model, store=store,
                              features=split_list(features) if features else None,
                              params=params, grid=grid_values, metrics=split_list(metrics),
                              test_size=test_size, cv=cv, fallback=fallback, backend=backend,
                              workers=workers, timeout=timeout, track=track,
                              warn=lambda line: typer.echo(f"warning: {line}", err=True))
    except ArgumentError as exc:
        fail(str(exc), exc.option)
    except StoreError as exc:  # mid-run: what was committed is kept; say so, exit 1
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except RunInterrupted as exc:  # Ctrl-C, SIGTERM: what finished is in the store
        counts = exc.run.summary().statuses if exc.run is not None else {}
        untrained = counts.get("cancelled", 0)
        typer.echo(f"interrupted: {counts.get('ok', 0)} model(s) kept in {store}, "
                   + (f"{untrained} group(s) not trained; the same command trains them "
                      "and reuses the rest" if untrained or not fallback else
                      "no fallback model fitted; the same command fits it and reuses "
                      "the models"), err=True)
        raise typer.Exit(130) from exc
    run = trained.run
    if not features:  # chosen here: said, so that a column read as text is seen missing
        typer.echo(f"features: {', '.join(trained.features)} (every numeric column but "
                   "--by and --target" + (f"; not numeric, left out: "
                                          f"{', '.join(trained.left_out)}"
                                          if trained.left_out else "") + ")")
    if trained.path_note:
        typer.echo(trained.path_note)
    if trained.fallback_error:
        typer.echo(f"no fallback model: {trained.fallback_error}", err=True)
    summary = run.summary()
    typer.echo(str(summary))
    typer.echo("mean " + ", ".join(f"{k} {v:.4g}" for k, v in trained.means.items()))
    results = run.results
    if "eval_skipped" in results.columns and results["eval_skipped"].notna().any():
        skipped = results["eval_skipped"].dropna()
        typer.echo(f"{len(skipped)} group(s) too short to score, fitted on all rows unscored: "
                   f"{skipped.iloc[0]}", err=True)
    typer.echo(f"run {run.run_id} in {store}; see: manymodels show {store} {run.run_id}")
    if summary.failed and not allow_failures:
        typer.echo(f"{summary.failed} group(s) failed (use --allow-failures to exit 0)",
                   err=True)
        raise typer.Exit(1)


@app.command()
def predict(
    store: str = typer.Argument(
        ..., callback=store_path, help="Store directory written by manymodels train."),
    data: str = typer.Argument(..., help="CSV, TSV or Parquet file of rows to predict "
                              "(or a directory of them)."),
    out: str = typer.Option(..., "--out", "-o", callback=out_path,
                            help="Output file (.csv or .parquet; - for standard output, "
                            "as CSV)."),
    run: int = typer.Option(None, help="Run id (default: the latest)."),
    by: str = typer.Option(None, help="Group column(s) (default: as trained)."),
    workers: int = typer.Option(None, help="Worker processes (default: the usable cores)."),
    backend: str = typer.Option(None, help="serial, threads, processes, ray, spark or dask "
                                "(default: serial when a few groups' measured cost says all "
                                "would take under 0.5 s, else processes)."),
) -> None:
    """Predict each row with its group's model, groups in parallel; rows of unseen groups get the
    global fallback (column source = fallback) or none (prediction empty).

    Example: manymodels predict models/ new.csv --out predictions.parquet
    """
    import warnings
    from pathlib import Path

    from ..engine.backends import backend_class
    from ..inputs.tables import exact_pandas, read_table
    from ..store import StoreIntegrityError
    from .tabular import PREDICTION_COLUMNS

    check_out(out, (".csv", ".txt", ".parquet", ".pq"))
    check_out_of_store(out, store)
    if workers is not None and workers < 1:
        fail(f"workers must be at least 1, got {workers}", "--workers")
    if backend is not None:
        try:
            backend_class(backend)
        except ValueError as exc:
            fail(str(exc), "--backend")
    opened = open_store(store)
    try:  # (without --run, the latest run that has ended: what predict reads)
        opened._run_row(run, ended=run is None)
    except ValueError as exc:  # no runs yet, none ended yet, or no such run
        fail(str(exc).replace("give run=", "give --run"), "--run")
    try:
        frame = exact_pandas(read_table(data))
        taken = [name for name in PREDICTION_COLUMNS if name in frame.columns]
        if taken:  # (the output would replace it)
            fail(f"DATA has a column named {taken[0]!r}, a column the output adds: "
                  "rename it", "DATA")
        by_columns = column_list(by or "", list(frame.columns), "--by")
        absent = [name for name in by_columns if name not in frame.columns]
        if absent:
            fail(f"column {absent[0]!r} is not in DATA; its columns are "
                  f"{[str(c) for c in frame.columns]}" + separator_hint(list(frame.columns)),
                 "--by")
        with warnings.catch_warnings(record=True) as warned:  # said as the other commands do
            warnings.simplefilter("always")
            try:
                predicted = opened.predict(frame, by=by_columns or None, run=run,
                                           with_source=True, workers=workers,
                                           backend=backend, progress=True)
            finally:  # (a group's rows with no model, failed ones the fallback answered)
                for line in dict.fromkeys(str(warning.message) for warning in warned):
                    typer.echo(f"warning: {line}", err=True)
    except (ValueError, TypeError) as exc:  # --by other than the run's keys: its fault
        fail(str(exc), "--by" if by and str(exc).startswith("by=") else "DATA")
    except StoreIntegrityError as exc:  # a tampered model: refused, said in one line
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from exc
    except RuntimeError as exc:
        text = str(exc)
        if not text.startswith("predicting group"):  # (a worker that could not start...)
            typer.echo(f"Error: {text}", err=True)
            raise typer.Exit(1) from exc
        # a group's model could not predict its rows: the cause, in one line
        lines = [line for line in text.splitlines() if line.strip()]
        fail(f"{text.split(' failed:', 1)[0]} failed: {lines[-1].strip()} (are the DATA's "
              "feature columns those the models were trained on, of the same types?)", "DATA")
    frame["prediction"] = predicted["prediction"].to_numpy()
    frame["source"] = predicted["source"].to_numpy()
    target = Path(out)
    with written(out) as path:
        if target.suffix.lower() in (".parquet", ".pq"):
            frame.to_parquet(path, index=False)
        else:
            frame.to_csv(path, index=False)
    counts = frame["source"].value_counts().to_dict()
    said(f"wrote {len(frame)} predictions to {out_name(out)} ("
         + ", ".join(f"{v} by {k}" for k, v in counts.items()) + ")", out)
