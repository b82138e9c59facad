"""``manymodels verify STORE``: read every artifact of a store and check it
against its SHA-256, like ``git fsck`` (see :meth:`manymodels.Store.verify`)."""

from __future__ import annotations

import pandas as pd
import typer

from .app import app
from .arguments import FORMAT_HELP, open_store, store_path
from .tables import OutputFormat, print_frame


@app.command()
def verify(
    store: str = typer.Argument(..., callback=store_path, help="Store directory."),
    fmt: OutputFormat = typer.Option(OutputFormat.table, "--format", "-f",
                                     case_sensitive=False, help=FORMAT_HELP),
) -> None:
    """Check every model of a store against its SHA-256; mark the corrupt ones.

    The corrupt models are listed (run, key, artifact, problem, superseded)
    and recorded, so the next run trains them again instead of reusing them.
    Exit status 1 when one is corrupt and no later run trained its key
    again, 0 when all are whole or superseded.

    Example: manymodels verify models/
    """
    opened = open_store(store, writes=True)
    report = opened.verify()
    checked = report.attrs.get("artifacts_checked", 0)
    if fmt != OutputFormat.table:
        print_frame(report, "corrupt", fmt)
    elif report.empty:
        typer.echo(f"{store}: {checked} artifact(s) checked, each matches its SHA-256")
    else:
        typer.echo(corrupt_line(store, report, opened.read_only))
        print_frame(report, "corrupt artifacts")
    if not report.empty and not report["superseded"].all():
        raise typer.Exit(1)


def corrupt_line(store: str, report: pd.DataFrame, read_only: bool) -> str:
    """The line that sums up a report of corrupt artifacts. "The next run
    trains the others again" only where they were marked: a read-only
    store, or one whose write lock another process held past the wait, is
    not, and its next run reuses them unchecked."""
    superseded = int(report["superseded"].sum())
    marked = report.attrs.get("marked", not read_only)
    unmarked = "read-only store" if read_only else (
        "another process held the store's write lock: run verify again once it is done")
    return (f"{store}: {report.attrs.get('artifacts_checked', 0)} artifact(s) checked, "
            f"{report['artifact'].nunique()} corrupt, held by {len(report)} task(s) or "
            "attachment(s)" + ("" if marked else f" (not marked: {unmarked})")
            + (f"; {superseded} of them trained again by a later run (superseded: only that "
               "run's own models still name them)" if superseded else "")
            + ("; the next run trains the others again" if marked and superseded < len(report)
               else ""))
