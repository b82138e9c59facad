"""The ``manymodels`` command line."""

from __future__ import annotations

import json
import math
from enum import Enum
from typing import Any

import typer

from ._version import __version__

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
    from pathlib import Path

    from .store import Store

    if not Path(path).is_dir():
        raise typer.BadParameter(f"store {path!r} does not exist", param_hint="STORE")
    return Store(path)


class OutputFormat(str, Enum):
    table = "table"
    csv = "csv"
    json = "json"


_FORMAT_HELP = ("table (aligned; plain text when piped), csv or json (every column, "
                "full precision).")


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.4g}" if isinstance(value, float) else " ".join(str(value).splitlines())


def _json_value(value: Any) -> Any:
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # a NumPy scalar
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _iso_times(frame, columns: list[str]):
    """``columns`` (seconds since the epoch) as ISO 8601 local times with offset."""
    from datetime import datetime

    frame = frame.copy()
    for column in columns:
        frame[column] = [None if t is None or t != t else
                         datetime.fromtimestamp(t).astimezone().isoformat(timespec="milliseconds")
                         for t in frame[column]]
    return frame


def _table_chunks(widths: list[int], keys: int, room: int) -> list[list[int]]:
    """Column indices per table, each table no wider than ``room`` where it can
    be, every one repeating the first ``keys`` columns (the task's key)."""
    def width(columns: list[int]) -> int:  # a rich table: "│ x │ y │"
        return sum(widths[i] + 3 for i in columns) + 1

    keys = min(keys, len(widths) - 1) if len(widths) > 1 else 0
    if width(list(range(keys))) + 10 > room:  # the key alone fills the room: repeat nothing
        keys = 0
    chunks, current = [], list(range(keys))
    for index in range(keys, len(widths)):
        if len(current) > keys and width(current + [index]) > room:
            chunks.append(current)
            current = list(range(keys))
        current.append(index)
    chunks.append(current)
    return chunks


def _print_frame(frame, title: str, fmt: OutputFormat = OutputFormat.table, keys: int = 1,
                 console=None) -> None:
    """Print ``frame`` as csv, json, or a table. A table is never squeezed (no
    ``0.…``): piped or redirected it is plain aligned text; on a terminal too
    narrow for it, its columns are split over several tables, each repeating
    the first ``keys`` columns."""
    if fmt == OutputFormat.csv:
        typer.echo(frame.to_csv(index=False), nl=False)
        return
    if fmt == OutputFormat.json:
        records = [{str(k): _json_value(v) for k, v in row.items()}
                   for row in frame.to_dict(orient="records")]
        typer.echo(json.dumps(records, indent=2, default=str, allow_nan=False))
        return

    import pandas as pd
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console()
    headers = [str(c) for c in frame.columns]
    rows = [[_cell(v) for v in row] for row in frame.itertuples(index=False, name=None)]
    right = [pd.api.types.is_numeric_dtype(kind) and not pd.api.types.is_bool_dtype(kind)
             for kind in frame.dtypes]
    widths = [max([cell_len(h)] + [cell_len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    if not console.is_terminal:
        def line(cells: list[str]) -> str:
            padded = [" " * (w - cell_len(c)) + c if r else c + " " * (w - cell_len(c))
                      for c, w, r in zip(cells, widths, right)]
            return "  ".join(padded).rstrip()

        typer.echo("\n".join([line(headers)] + [line(r) for r in rows]))
        return
    for number, columns in enumerate(_table_chunks(widths, keys, console.width)):
        table = Table(title=title if number == 0 else None)
        for i in columns:
            table.add_column(Text(headers[i]), justify="right" if right[i] else "left",
                             overflow="fold")
        for row in rows:  # Text: a value is never read as rich markup ("[red]")
            table.add_row(*[Text(row[i]) for i in columns])
        console.print(table)


@app.command()
def runs(
    store: str = typer.Argument(..., help="Store directory."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f",
                                     case_sensitive=False, help=_FORMAT_HELP),
) -> None:
    """List the runs recorded in a store.

    Example: manymodels runs models/ --format csv
    """
    import time

    frame = _open_store(store).runs()
    if fmt != OutputFormat.table:
        _print_frame(_iso_times(frame, ["started_at", "finished_at"]), "runs", fmt)
        return
    frame["started_at"] = [time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
                           for t in frame["started_at"]]
    _print_frame(frame.drop(columns=["finished_at", "source"]), f"runs in {store}")


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
        frame = _iso_times(frame, ["started_at"])
        _print_frame(frame if limit is None else frame.head(limit), "results", fmt)
        return
    counts = frame["status"].value_counts().to_dict()
    typer.echo(f"run {frame['run_id'].iloc[0]}: {len(frame)} tasks, "
               + ", ".join(f"{v} {k}" for k, v in counts.items()))
    keys = frame.columns.get_loc("run_id")
    frame = frame.drop(columns=["artifact", "run_id", "started_at"])
    frame["error"] = frame["error"].map(
        lambda e: e.strip().splitlines()[-1][:80] if isinstance(e, str) and e else "")
    _print_frame(frame.head(20 if limit is None else limit), "results", keys=keys)


@app.command()
def export(
    store: str = typer.Argument(..., help="Store directory."),
    run: int = typer.Argument(None, help="Run id (default: the latest)."),
    out: str = typer.Option(..., "--out", "-o", help="Parquet file to write."),
) -> None:
    """Write a run's results, metrics as columns, to a Parquet file.

    Example: manymodels export models/ -o results.parquet
    """
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
    results = opened.results(run)
    key_columns = list(results.columns[:results.columns.get_loc("run_id")])
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


def _fail(message: str, hint: str) -> None:
    raise typer.BadParameter(message, param_hint=hint)


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
                                "balanced_accuracy (classification; default accuracy). "
                                "The first one picks the best grid setting."),
    test_size: float = typer.Option(None, help="Fraction of each group held out "
                                    "(default 0.2)."),
    cv: int = typer.Option(None, help="Cross-validate with this many folds instead."),
    fallback: bool = typer.Option(True, help="Also fit a global model for groups that have "
                                  "none (used by predict)."),
    backend: str = typer.Option("processes", help="processes, threads or serial."),
    workers: int = typer.Option(None, min=1, help="Workers (default: usable cores)."),
    timeout: float = typer.Option(None, help="Seconds per group before it is stopped."),
    allow_failures: bool = typer.Option(False, help="Exit 0 even if some groups failed."),
) -> None:
    """Train one model per group of a table, evaluate it, keep it in a store.

    Example: manymodels train sales.parquet --by store --target sales
    --model sklearn.linear_model.Ridge --grid alpha=0.1,1,10 --store models/
    """
    import manymodels as mm

    from .tabular import (
        CLASSIFICATION_METRICS,
        GroupModelTask,
        _metrics,
        check_settings,
        parse_assignment,
    )
    from .tabular import parse_value as value_of

    # Everything that can be refused is refused here, before the data is read
    # and long before any group is trained, with the option and name at fault.
    params: dict = {}
    grid_values: dict = {}
    try:
        for entry in param:
            name, value = parse_assignment(entry, "--param")
            if name in params:
                raise ValueError(f"--param {name!r} is given twice")
            params[name] = value_of(value)
        for entry in grid:
            name, values = parse_assignment(entry, "--grid")
            if name in grid_values:
                raise ValueError(f"--grid {name!r} is given twice")
            if name in params:
                raise ValueError(f"{name!r} is given both as --param and as --grid")
            grid_values[name] = [value_of(v) for v in values.split(",")]
        estimator = check_settings(model, params, grid_values)
    except ValueError as exc:
        _fail(str(exc), "--model/--param/--grid")
    from sklearn.base import is_classifier, is_regressor

    classifier = is_classifier(estimator)
    metric_names = _split_list(metrics) or (["accuracy"] if classifier else ["r2", "mae"])
    unknown = [m for m in metric_names if m not in _metrics()]
    if unknown:
        _fail(f"unknown metric {unknown[0]!r}; choose from {', '.join(_metrics())}",
              "--metrics")
    if is_regressor(estimator):
        labels = [m for m in metric_names if m in CLASSIFICATION_METRICS]
        if labels:
            _fail(f"metric {labels[0]!r} compares class labels, but {model} is a regressor; "
                  "use r2, mae, mse, rmse or mape", "--metrics")
    if test_size is not None and cv is not None:
        _fail("give --test-size or --cv, not both", "--test-size/--cv")
    if cv is not None and cv < 2:
        _fail(f"--cv needs at least 2 folds, got {cv}", "--cv")
    if cv is None:
        test_size = 0.2 if test_size is None else test_size
        if not 0 < test_size < 1:
            _fail(f"--test-size must lie in (0, 1), got {test_size}", "--test-size")
    by_columns = _split_list(by)
    try:
        table = mm.groups(data, by=by_columns).table
    except (ValueError, TypeError) as exc:
        _fail(str(exc), "DATA/--by")
    import pyarrow.types as pat

    columns = table.column_names
    types = {f.name: f.type for f in table.schema}

    def numeric(column: str) -> bool:
        kind = types[column]
        return (pat.is_integer(kind) or pat.is_floating(kind) or pat.is_boolean(kind)
                or pat.is_decimal(kind))

    if target not in columns:
        _fail(f"target column {target!r} is not in {data!r}; its columns are {columns}",
              "--target")
    if target in by_columns:
        _fail(f"target column {target!r} is also a --by column", "--target")
    if features:
        feature_columns = _split_list(features)
        missing = [c for c in feature_columns if c not in columns]
        if missing:
            _fail(f"feature column {missing[0]!r} is not in {data!r}; its columns are "
                  f"{columns}", "--features")
        if target in feature_columns:
            _fail(f"--target {target!r} is also a feature column", "--features")
        text = [c for c in feature_columns if not numeric(c)]
        if text:
            _fail(f"feature column {text[0]!r} is not numeric (its type is {types[text[0]]})",
                  "--features")
    else:
        feature_columns = [c for c in columns if c not in by_columns + [target] and numeric(c)]
        if not feature_columns:
            _fail("no numeric feature columns besides --by and --target", "--features")
    if is_regressor(estimator) and not numeric(target):
        _fail(f"target column {target!r} is not numeric (its type is {types[target]}) but "
              f"{model} is a regressor", "--target")
    if classifier and not numeric(target):
        numbers = [m for m in metric_names if m not in CLASSIFICATION_METRICS]
        if numbers:
            _fail(f"metric {numbers[0]!r} needs a numeric target, and {target!r} is not: "
                  f"use {', '.join(CLASSIFICATION_METRICS)}", "--metrics")
    task = GroupModelTask(model, target, feature_columns, params, grid_values, metric_names,
                          test_size, cv)
    try:
        run = mm.train(task, mm.groups(table, by=by_columns), store=store, backend=backend,
                       workers=workers, timeout=timeout)
    except (ValueError, TypeError) as exc:
        _fail(str(exc), "--backend/--workers/--timeout/--store")
    opened = run.store
    opened.attach(run.run_id, "train_config", {
        "by": by_columns, "target": target, "features": feature_columns, "model": model,
        "params": params, "grid": grid_values, "metrics": metric_names})
    if fallback:
        frame = table.select(feature_columns + [target]).to_pandas()
        best = run.results[[c for c in run.results if c.startswith("best_")]]
        setting = {c[5:]: best[c].mode().iloc[0] for c in best} if len(best.columns) else {}
        try:
            global_model = task.build(setting).fit(frame[feature_columns].to_numpy(),
                                                   frame[target].to_numpy())
        except Exception as exc:  # e.g. the rows of a failed group poison the whole table
            typer.echo(f"no fallback model: fitting it on all rows failed: {exc!r}", err=True)
        else:
            opened.attach(run.run_id, "fallback", global_model)
    summary = run.summary()
    typer.echo(str(summary))
    means = {m: run.results[m].mean() for m in metric_names if m in run.results}
    typer.echo("mean " + ", ".join(f"{k} {v:.4g}" for k, v in means.items()))
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
) -> None:
    """Predict each row with its group's model; rows of unseen groups get the
    global fallback (column source = fallback) or none (prediction empty).

    Example: manymodels predict models/ new.csv --out predictions.parquet
    """
    from pathlib import Path

    from .tables import read_table

    opened = _open_store(store)
    try:
        frame = read_table(data).to_pandas()
        predicted = opened.predict(frame, by=_split_list(by) or None, run=run,
                                   with_source=True)
    except (ValueError, TypeError) as exc:
        _fail(str(exc), "DATA")
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
    from .report import store_report

    try:
        path = store_report(_open_store(store), run, out)
    except ValueError as exc:
        _fail(str(exc), "RUN")
    typer.echo(f"wrote {path}")


if __name__ == "__main__":  # pragma: no cover
    app()
