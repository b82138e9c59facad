"""The ``manymodels`` command line: the one typer app every command module
registers on (`manymodels --help` lists them), and `manymodels demo`."""

from __future__ import annotations

import contextlib
import json

import typer

from .._version import __version__
from .arguments import OneValueGroup, out_path
from .outputs import check_out, is_device, written

app = typer.Typer(
    cls=OneValueGroup,
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
    import sys

    for stream in (sys.stdout, sys.stderr):  # keys a narrow encoding lacks: escaped, not a crash
        if (getattr(stream, "encoding", "utf-8") or "").lower().replace("-", "") != "utf8":
            with contextlib.suppress(AttributeError, ValueError):
                stream.reconfigure(errors="backslashreplace")


@app.command()
def demo(
    stores: int = typer.Option(48, min=1, help="Stores in the generated table."),
    items: int = typer.Option(50, min=1, help="Items per store."),
    workers: int = typer.Option(None, min=1, help="Worker processes (default: usable cores)."),
    serial: bool = typer.Option(True, help="Also run the same tasks serially to compare."),
    json_out: str = typer.Option(None, "--json", callback=out_path,
                                 help="Also write the numbers to this file (- for standard "
                                 "output; the table then goes to standard error)."),
) -> None:
    """Train a tuned Ridge per store x item of a generated sales table.

    Example: manymodels demo --stores 10 --items 20 --no-serial
    """
    from .demo import run_demo

    if json_out:
        check_out(json_out, (".json",), "--json")
    numbers = run_demo(stores, items, workers=workers, compare_serial=serial,
                       to_stderr=bool(json_out) and is_device(json_out))
    if json_out:
        with written(json_out, "--json") as path:
            path.write_text(json.dumps(numbers, indent=2) + "\n")


if __name__ == "__main__":  # pragma: no cover
    app()
