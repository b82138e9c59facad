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


if __name__ == "__main__":  # pragma: no cover
    app()
