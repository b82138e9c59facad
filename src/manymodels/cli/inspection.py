"""Commands that read a store: `runs`, `show`, `export`, `why` and `report`."""

from __future__ import annotations

from typing import Any

import typer

from .app import app
from .arguments import FORMAT_HELP, fail, open_store, out_path, store_path
from .outputs import check_binary_out, check_out, check_out_of_store, out_name, said, written
from .tables import (
    OutputFormat,
    cell,
    error_line,
    iso_times,
    local_time,
    print_frame,
    texts_quoted_beside_others,
)


@app.command()
def runs(
    store: str = typer.Argument(..., callback=store_path, help="Store directory."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f",
                                     case_sensitive=False, help=FORMAT_HELP),
) -> None:
    """List the runs recorded in a store.

    Example: manymodels runs models/ --format csv
    """
    frame = open_store(store).runs()
    if fmt != OutputFormat.table:
        print_frame(iso_times(frame, ["started_at", "finished_at"]), "runs", fmt)
        return
    frame["started_at"] = [local_time(t).strftime("%Y-%m-%d %H:%M:%S %z")
                           for t in frame["started_at"]]
    print_frame(frame.drop(columns=["finished_at", "source"]), f"runs in {store}")


@app.command()
def show(
    store: str = typer.Argument(..., callback=store_path, help="Store directory."),
    run: int = typer.Argument(None, help="Run id (default: the latest)."),
    limit: int = typer.Option(None, min=0, help="Rows to show (default: 20 in a table, "
                              "all in csv or json)."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f",
                                     case_sensitive=False, help=FORMAT_HELP),
) -> None:
    """Show a run's results: status, metrics and errors per task.

    Example: manymodels show models/ 3 --limit 50
    """
    opened = open_store(store)
    try:
        frame, floats = opened._shown_results(run)  # (an r2 of 1.0 printed as 1.0)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="RUN") from exc
    if fmt != OutputFormat.table:  # every column, the whole traceback
        frame = iso_times(frame, ["started_at"])
        print_frame(frame if limit is None else frame.head(limit), "results", fmt,
                    keys=frame.columns.get_loc("run_id"), floats=floats)
        return
    counts = frame["status"].value_counts().to_dict()
    run_id = int(frame["run_id"].iloc[0]) if len(frame) else opened._run_row(run)[0]
    planned = opened.runs().set_index("run_id")["tasks"].get(run_id)
    # a run whose driver died (or one going on) has rows for the tasks done
    # only: say what it planned too, as the report does
    tasks = (f"{len(frame)} tasks" if planned is None or planned != planned
             or int(planned) == len(frame) else f"{int(planned)} tasks ({len(frame)} done)")
    typer.echo(f"run {run_id}: {tasks}, " + ", ".join(f"{v} {k}" for k, v in counts.items()))
    keys = frame.columns.get_loc("run_id")
    frame = frame.drop(columns=["artifact", "run_id", "started_at"])
    frame["error"] = frame["error"].map(lambda e: error_line(e)[:80])
    shown = 20 if limit is None else limit
    print_frame(texts_quoted_beside_others(frame.head(shown), keys), "results", keys=keys,
                floats=floats)
    if len(frame) > shown:  # (the first line counts every task: say these are not all)
        typer.echo(f"... {len(frame) - shown} more task(s) not shown (--limit N shows N; "
                   "-f csv or -f json, all)")


@app.command()
def export(
    store: str = typer.Argument(..., callback=store_path, help="Store directory."),
    run: int = typer.Argument(None, help="Run id (default: the latest)."),
    out: str = typer.Option(..., "--out", "-o", callback=out_path,
                            help="Parquet file to write (- for standard output)."),
) -> None:
    """Write a run's results, metrics as columns, to a Parquet file.

    Example: manymodels export models/ -o results.parquet
    """
    check_out(out, (".parquet", ".pq"))
    check_binary_out(out, "Parquet")
    check_out_of_store(out, store)
    opened = open_store(store)
    try:
        opened._run_row(run)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="RUN") from exc
    with written(out) as path:
        opened._export_to(path, run)
    said(f"wrote {out_name(out)}", out)


@app.command()
def why(
    store: str = typer.Argument(..., callback=store_path, help="Store directory."),
    key: list[str] = typer.Argument(..., help="The task's key (one value per key column)."),
    run: int = typer.Option(None, help="Run id (default: the latest)."),
) -> None:
    """Say why a task was trained rather than reused, and what changed.

    Example: manymodels why models/ s001 i007
    """
    opened = open_store(store)
    try:
        results = opened._key_frame(run)
    except ValueError as exc:  # no runs yet, or no such run
        fail(str(exc), "RUN")
    key_columns = list(results.columns)
    if len(key) != len(key_columns):
        raise typer.BadParameter(
            f"this run's key has {len(key_columns)} column(s) {key_columns}, got {len(key)}",
            param_hint="KEY")
    parts = [key_value(column, list(results[column].drop_duplicates()), text)
             for column, text in zip(key_columns, key)]
    try:
        answer = opened.why_not_reused(parts[0] if len(parts) == 1 else tuple(parts), run=run)
    except KeyError as exc:  # each value is some task's, but not this combination
        fail(str(exc.args[0]) if exc.args else str(exc), "KEY")
    typer.echo(answer)


@app.command()
def report(
    store: str = typer.Argument(..., callback=store_path, help="Store directory."),
    run: int = typer.Argument(None, help="Run id (default: the latest)."),
    out: str = typer.Option("report.html", "--out", "-o", callback=out_path,
                            help="HTML file to write (- for standard output)."),
) -> None:
    """Write a self-contained HTML report of a run: summary, worker timeline,
    durations, metrics, slowest tasks and failures.

    Example: manymodels report models/ -o report.html
    """
    from ..observe.report import store_report

    check_out(out, (".html", ".htm"))
    check_out_of_store(out, store)
    opened = open_store(store)
    try:
        opened._run_row(run)
    except ValueError as exc:
        fail(str(exc), "RUN")
    with written(out) as path:
        store_report(opened, run, path)
    said(f"wrote {out_name(out)}", out)


def key_value(column: str, values: list, text: str) -> Any:
    """The value of the key column ``column`` (of ``values``) that ``text``
    gives: the one it spells as Python prints it (or, where two print
    alike, ``1`` and ``"1"``, as Python writes it: ``1`` or ``'1'``), or as
    ``show``'s table prints it (a line break as ``\\n``), else the one it reads as
    (a time as ``show -f csv`` and ``-f json`` print it, ``2024-01-01`` or
    ``2024-01-01T00:00:00``; a whole number ``1`` for ``1.0``; ``nan`` or
    nothing for a missing value), so that a key copied from the command
    line's own outputs is found. Refused naming KEY when none is, or when
    it reads as several."""
    spelled = [v for v in values if str(v) == text]
    if len(spelled) != 1:  # 1 and "1" print alike: Python's own spelling tells them apart
        spelled = [v for v in values if repr(v) == text] or spelled
    found = (spelled or [v for v in values if cell(v, exact=True) == text]
             or [v for v in values if _reads_as(v, text)])
    if len(found) == 1:
        return found[0]
    if found:
        raise typer.BadParameter(f"{column}={text!r} could be any of "
                                 f"{', '.join(map(repr, found[:5]))}: give it as Python "
                                 "writes it there (a text in quotes)", param_hint="KEY")
    shown = ", ".join(repr(str(v)) for v in values[:5]) + (" ..." if len(values) > 5 else "")
    raise typer.BadParameter(f"no task has {column}={text!r} (its values include {shown})",
                             param_hint="KEY")


def _reads_as(value: Any, text: str) -> bool:
    """Whether ``text`` reads as ``value``, a key column's value, in its own type."""
    import datetime
    import numbers

    import pandas as pd

    if value is None or value is pd.NaT or (isinstance(value, float) and value != value):
        return text.strip().lower() in ("", "nan", "nat", "none", "null")
    try:
        if isinstance(value, (datetime.datetime, datetime.date)):
            return bool(pd.Timestamp(text) == pd.Timestamp(value))
        if isinstance(value, (datetime.timedelta, pd.Timedelta)):
            return bool(pd.Timedelta(text) == value)
        if isinstance(value, numbers.Number) and not isinstance(value, bool):
            return float(text) == value
    except (ValueError, TypeError, OverflowError):  # not a time, or of another zone
        return False
    return False
