"""``manymodels verify STORE``: read every artifact of a store and check it
against its SHA-256, like ``git fsck`` (see :meth:`manymodels.Store.verify`)."""

from __future__ import annotations

import typer

from .app import app
from .arguments import FORMAT_HELP, open_store
from .tables import OutputFormat, print_frame


@app.command()
def verify(
    store: str = typer.Argument(..., help="Store directory."),
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
        superseded = int(report["superseded"].sum())
        typer.echo(f"{store}: {checked} artifact(s) checked, {report['artifact'].nunique()} "
                   f"corrupt, held by {len(report)} task(s) or attachment(s)"
                   + ("" if not opened.read_only else " (read-only store: not marked)")
                   + (f"; {superseded} of them trained again by a later run (superseded: "
                      "only that run's own models still name them)" if superseded else "")
                   + ("; the next run trains the others again" if superseded < len(report)
                      else ""))
        print_frame(report, "corrupt artifacts")
    if not report.empty and not report["superseded"].all():
        raise typer.Exit(1)
