"""The ``manymodels`` command line."""

from __future__ import annotations

import json

import typer

app = typer.Typer(
    help="Train many ML models at once: one per group, per file or per setting.",
    no_args_is_help=True,
    add_completion=False,
)


@app.callback()
def _main() -> None:
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


def _print_frame(frame, title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in frame.columns:
        table.add_column(str(column))
    for row in frame.itertuples(index=False):
        table.add_row(*["" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v)
                        for v in row])
    Console().print(table)


@app.command()
def runs(store: str = typer.Argument(..., help="Store directory.")) -> None:
    """List the runs recorded in a store.

    Example: manymodels runs models/
    """
    import time

    frame = _open_store(store).runs()
    frame["started_at"] = [time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
                           for t in frame["started_at"]]
    _print_frame(frame.drop(columns=["finished_at", "source"]), f"runs in {store}")


@app.command()
def show(
    store: str = typer.Argument(..., help="Store directory."),
    run: int = typer.Argument(None, help="Run id (default: the latest)."),
    limit: int = typer.Option(20, help="Rows to show."),
) -> None:
    """Show a run's results: status, metrics and errors per task.

    Example: manymodels show models/ 3 --limit 50
    """
    try:
        frame = _open_store(store).results(run)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="RUN") from exc
    counts = frame["status"].value_counts().to_dict()
    typer.echo(f"run {frame['run_id'].iloc[0]}: {len(frame)} tasks, "
               + ", ".join(f"{v} {k}" for k, v in counts.items()))
    frame = frame.drop(columns=["artifact", "run_id"])
    frame["error"] = frame["error"].map(
        lambda e: e.strip().splitlines()[-1][:80] if isinstance(e, str) and e else "")
    _print_frame(frame.head(limit), "results")


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


if __name__ == "__main__":  # pragma: no cover
    app()
