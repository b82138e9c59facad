"""The ``manymodels`` command line."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer

from .._version import __version__
from .tables import OutputFormat, iso_times, local_time, print_frame

app = typer.Typer(
    help="Train many ML models at once: one per group, per file or per setting.",
    no_args_is_help=True,
    add_completion=False,
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"manymodels {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """manymodels: train many models at once."""


@app.command()
def demo(
    stores: int = typer.Option(48, min=1, help="Stores in the generated table."),
    items: int = typer.Option(50, min=1, help="Items per store."),
    workers: int = typer.Option(None, min=1, help="Worker processes (default: usable cores)."),
    serial: bool = typer.Option(True, help="Also run the same tasks serially to compare."),
    json_out: str = typer.Option(None, "--json", help="Also write the numbers to this file."),
) -> None:
    """Train a tuned Ridge per store x item of a generated sales table.

    Example: manymodels demo --stores 10 --items 20 --no-serial
    """
    from .demo import run_demo

    numbers = run_demo(stores, items, workers=workers, compare_serial=serial)
    if json_out:
        with open(json_out, "w") as out:
            json.dump(numbers, out, indent=2)


def _open_store(path: str):
    """The store at ``path``, or a refusal naming STORE: a missing directory, or
    an index that is not a manymodels store's (random bytes, text, another
    program's SQLite file) is told in one line, not a traceback."""
    from pathlib import Path

    from ..run.store import Store
    from ..store import StoreError

    if not Path(path).is_dir():
        raise typer.BadParameter(f"store {path!r} does not exist", param_hint="STORE")
    if not (Path(path) / "index.sqlite").is_file():  # nothing made where only reading
        raise typer.BadParameter(f"{path!r} is not a manymodels store (it has no "
                                 "index.sqlite)", param_hint="STORE")
    try:
        return Store(path)
    except StoreError as exc:
        _fail(str(exc), "STORE")


def _check_out(out: str) -> None:
    """An output file's place, checked before any work (the work was lost to a
    traceback when its directory was missing)."""
    from pathlib import Path

    target = Path(out)
    if target.is_dir():
        _fail(f"{out!r} is a directory: name a file", "--out")
    if not target.parent.is_dir():
        _fail(f"the directory of {out!r} does not exist", "--out")


_FORMAT_HELP = ("table (aligned; plain text when piped), csv or json (every column, "
                "full precision).")


@app.command()
def runs(
    store: str = typer.Argument(..., help="Store directory."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f",
                                     case_sensitive=False, help=_FORMAT_HELP),
) -> None:
    """List the runs recorded in a store.

    Example: manymodels runs models/ --format csv
    """
    frame = _open_store(store).runs()
    if fmt != OutputFormat.table:
        print_frame(iso_times(frame, ["started_at", "finished_at"]), "runs", fmt)
        return
    frame["started_at"] = [local_time(t).strftime("%Y-%m-%d %H:%M:%S")
                           for t in frame["started_at"]]
    print_frame(frame.drop(columns=["finished_at", "source"]), f"runs in {store}")


@app.command()
def show(
    store: str = typer.Argument(..., help="Store directory."),
    run: int = typer.Argument(None, help="Run id (default: the latest)."),
    limit: int = typer.Option(None, min=0, help="Rows to show (default: 20 in a table, "
                              "all in csv or json)."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f",
                                     case_sensitive=False, help=_FORMAT_HELP),
) -> None:
    """Show a run's results: status, metrics and errors per task.

    Example: manymodels show models/ 3 --limit 50
    """
    try:
        frame = _open_store(store).results(run)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="RUN") from exc
    if fmt != OutputFormat.table:  # every column, the whole traceback
        frame = iso_times(frame, ["started_at"])
        print_frame(frame if limit is None else frame.head(limit), "results", fmt)
        return
    counts = frame["status"].value_counts().to_dict()
    typer.echo(f"run {frame['run_id'].iloc[0]}: {len(frame)} tasks, "
               + ", ".join(f"{v} {k}" for k, v in counts.items()))
    keys = frame.columns.get_loc("run_id")
    frame = frame.drop(columns=["artifact", "run_id", "started_at"])
    frame["error"] = frame["error"].map(
        lambda e: e.strip().splitlines()[-1][:80] if isinstance(e, str) and e else "")
    print_frame(frame.head(20 if limit is None else limit), "results", keys=keys)


@app.command()
def export(
    store: str = typer.Argument(..., help="Store directory."),
    run: int = typer.Argument(None, help="Run id (default: the latest)."),
    out: str = typer.Option(..., "--out", "-o", help="Parquet file to write."),
) -> None:
    """Write a run's results, metrics as columns, to a Parquet file.

    Example: manymodels export models/ -o results.parquet
    """
    _check_out(out)
    try:
        path = _open_store(store).export(out, run)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="RUN") from exc
    typer.echo(f"wrote {path}")


@app.command()
def why(
    store: str = typer.Argument(..., help="Store directory."),
    key: list[str] = typer.Argument(..., help="The task's key (one value per key column)."),
    run: int = typer.Option(None, help="Run id (default: the latest)."),
) -> None:
    """Say why a task was trained rather than reused, and what changed.

    Example: manymodels why models/ s001 i007
    """
    opened = _open_store(store)
    try:
        results = opened._key_frame(run)
    except ValueError as exc:  # no runs yet, or no such run
        _fail(str(exc), "RUN")
    key_columns = list(results.columns)
    if len(key) != len(key_columns):
        raise typer.BadParameter(
            f"this run's key has {len(key_columns)} column(s) {key_columns}, got {len(key)}",
            param_hint="KEY")
    parts = []
    for column, text in zip(key_columns, key):
        values = {str(v): v for v in results[column].drop_duplicates()}
        if text not in values:
            raise typer.BadParameter(f"no task has {column}={text!r}", param_hint="KEY")
        parts.append(values[text])
    typer.echo(opened.why_not_reused(parts[0] if len(parts) == 1 else tuple(parts), run=run))


def _split_list(text: str | None) -> list[str]:
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _fail(message: str, hint: str) -> NoReturn:
    raise typer.BadParameter(message, param_hint=hint)


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
    return params, grid_values


@app.command()
def train(
    data: str = typer.Argument(..., help="CSV or Parquet file (or a directory of them)."),
    by: str = typer.Option(..., help="Group column(s), comma-separated."),
    target: str = typer.Option(..., help="The column to predict."),
    model: str = typer.Option(..., help="Estimator class by dotted name, e.g. "
                              "sklearn.linear_model.Ridge or lightgbm.LGBMRegressor."),
    store: str = typer.Option(..., help="Store directory for the runs and models."),
    features: str = typer.Option(None, help="Feature columns, comma-separated (default: "
                                 "every numeric column but --by and --target)."),
    param: list[str] = typer.Option([], help="A fixed estimator parameter, name=value; "
                                    "repeatable."),
    grid: list[str] = typer.Option([], help="Values to try per group, name=v1,v2,...; "
                                   "repeatable. The best per group is kept."),
    metrics: str = typer.Option(None, help="Comma-separated: r2, mae, mse, rmse, mape "
                                "(regression; default r2,mae), accuracy, f1, "
                                "balanced_accuracy, log_loss (classification; default accuracy). "
                                "The first one picks the best grid setting."),
    test_size: float = typer.Option(None, help="Fraction of each group held out "
                                    "(default 0.2; 0 scores the fit on its own rows)."),
    cv: int = typer.Option(None, help="Cross-validate with this many folds instead."),
    fallback: bool = typer.Option(True, help="Also fit a global model for groups that have "
                                  "none (used by predict)."),
    backend: str = typer.Option("processes", help="processes, threads or serial."),
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
        _fail(str(exc), "--model/--param/--grid")
    try:  # every refusal comes before the data is read, naming the option at fault
        track = None
        if mlflow:
            from ..observe.tracking import MLflow

            track = MLflow(experiment=mlflow)
        trained = train_table(data, _split_list(by), target, model, store=store,
                              features=_split_list(features) if features else None,
                              params=params, grid=grid_values, metrics=_split_list(metrics),
                              test_size=test_size, cv=cv, fallback=fallback, backend=backend,
                              workers=workers, timeout=timeout, track=track)
    except ImportError as exc:
        _fail(str(exc), "--mlflow")
    except ArgumentError as exc:
        _fail(str(exc), exc.option)
    except StoreError as exc:  # mid-run: what was committed is kept; say so, exit 1
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from exc
    run = trained.run
    if trained.path_note:
        typer.echo(trained.path_note)
    if trained.fallback_error:
        typer.echo(f"no fallback model: {trained.fallback_error}", err=True)
    summary = run.summary()
    typer.echo(str(summary))
    typer.echo("mean " + ", ".join(f"{k} {v:.4g}" for k, v in trained.means.items()))
    typer.echo(f"run {run.run_id} in {store}; see: manymodels show {store} {run.run_id}")
    if summary.failed and not allow_failures:
        typer.echo(f"{summary.failed} group(s) failed (use --allow-failures to exit 0)",
                   err=True)
        raise typer.Exit(1)


@app.command()
def predict(
    store: str = typer.Argument(..., help="Store directory written by manymodels train."),
    data: str = typer.Argument(..., help="CSV or Parquet file of rows to predict."),
    out: str = typer.Option(..., "--out", "-o", help="Output file (.csv or .parquet)."),
    run: int = typer.Option(None, help="Run id (default: the latest)."),
    by: str = typer.Option(None, help="Group column(s) (default: as trained)."),
    workers: int = typer.Option(None, help="Worker processes (default: the usable cores)."),
    backend: str = typer.Option(None, help="processes, threads, serial or ray "
                                "(default: serial below 500 groups, else processes)."),
) -> None:
    """Predict each row with its group's model, groups in parallel; rows of unseen groups get the
    global fallback (column source = fallback) or none (prediction empty).

    Example: manymodels predict models/ new.csv --out predictions.parquet
    """
    from pathlib import Path

    from ..engine.backends import backend_class
    from ..inputs.tables import exact_pandas, read_table
    from ..store import StoreIntegrityError

    _check_out(out)
    if workers is not None and workers < 1:
        _fail(f"workers must be at least 1, got {workers}", "--workers")
    if backend is not None:
        try:
            backend_class(backend)
        except ValueError as exc:
            _fail(str(exc), "--backend")
    opened = _open_store(store)
    try:
        opened._run_row(run)
    except ValueError as exc:  # no runs yet, or no such run
        _fail(str(exc), "--run")
    try:
        frame = exact_pandas(read_table(data))
        predicted = opened.predict(frame, by=_split_list(by) or None, run=run,
                                   with_source=True, workers=workers, backend=backend,
                                   progress=True)
    except (ValueError, TypeError) as exc:
        _fail(str(exc), "DATA")
    except StoreIntegrityError as exc:  # a tampered model: refused, said in one line
        typer.echo(f"Error: {exc}", err=True)
        raise typer.Exit(1) from exc
    frame["prediction"] = predicted["prediction"].to_numpy()
    frame["source"] = predicted["source"].to_numpy()
    target = Path(out)
    if target.suffix.lower() in (".parquet", ".pq"):
        frame.to_parquet(target, index=False)
    else:
        frame.to_csv(target, index=False)
    counts = frame["source"].value_counts().to_dict()
    typer.echo(f"wrote {len(frame)} predictions to {target} ("
               + ", ".join(f"{v} by {k}" for k, v in counts.items()) + ")")


@app.command()
def report(
    store: str = typer.Argument(..., help="Store directory."),
    run: int = typer.Argument(None, help="Run id (default: the latest)."),
    out: str = typer.Option("report.html", "--out", "-o", help="HTML file to write."),
) -> None:
    """Write a self-contained HTML report of a run: summary, worker timeline,
    durations, metrics, slowest tasks and failures.

    Example: manymodels report models/ -o report.html
    """
    from ..observe.report import store_report

    _check_out(out)
    try:
        path = store_report(_open_store(store), run, out)
    except ValueError as exc:
        _fail(str(exc), "RUN")
    typer.echo(f"wrote {path}")


@app.command()
def dashboard(
    store: str = typer.Argument(..., help="Store directory."),
    port: int = typer.Option(0, min=0, max=65535, help="Port (default: a free one)."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; another than loopback "
                             "needs --allow-remote."),
    allow_remote: bool = typer.Option(False, help="Allow a non-loopback --host (the "
                                      "network can then reach it, token in hand)."),
    token: str = typer.Option(None, help="The token to require (default: a random one). "
                              "It is printed in the URL; the browser keeps it in a cookie."),
    no_token: bool = typer.Option(False, "--no-token", help="Ask for no token (loopback "
                                  "only): every account on this machine can read the "
                                  "store through it."),
) -> None:
    """Serve a live dashboard of a store's runs, updated while they are written.

    Open the URL it prints: it carries a token (?token=...), asked on loopback
    too, since any local account can reach the port.

    Example: manymodels dashboard models/ --port 8050
    """
    import os
    import threading
    import warnings

    from ..observe.dashboard import WATCH_DRIVER, DashboardServer

    if no_token and token is not None:
        _fail("give --token or --no-token, not both", "--token/--no-token")
    try:  # read-only: opening it as a Store would write (migrations)
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            server = DashboardServer(store, host, port, token="" if no_token else token,
                                     allow_remote=allow_remote)
    except FileNotFoundError as exc:
        _fail(str(exc), "STORE")
    except (ValueError, OSError) as exc:
        _fail(str(exc), "--host/--port/--token")
    for warning in warned:
        typer.echo(f"warning: {warning.message}", err=True)
    typer.echo(f"manymodels dashboard of {store}: {server.url}  (Ctrl-C stops it)")
    if os.environ.get(WATCH_DRIVER) == "1":  # a run's: it ends with its driver
        threading.Thread(target=_end_with_stdin, args=(server,), daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()


def _end_with_stdin(server: Any) -> None:
    """Stop ``server`` once standard input ends: the run's driver is gone."""
    sys.stdin.buffer.read()
    server.httpd.shutdown()


if __name__ == "__main__":  # pragma: no cover
    app()
