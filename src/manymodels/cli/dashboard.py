"""`manymodels dashboard`: serve a store's live dashboard until Ctrl-C."""

from __future__ import annotations

import errno
import sys
from pathlib import Path
from typing import Any

import typer

from .app import app
from .arguments import check_store_index, fail, store_path


@app.command()
def dashboard(
    store: str = typer.Argument(..., callback=store_path, help="Store directory."),
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
        fail("give --token or --no-token, not both", "--token/--no-token")
    if Path(store).is_dir():  # another program's index, or an empty one: refused as by all
        check_store_index(store)
    elif Path(store).exists():  # (told, as by the other commands, not "has no index")
        fail(f"store {store!r} is a file, not a store's directory", "STORE")
    try:  # read-only: opening it as a Store would write (migrations)
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            server = DashboardServer(store, host, port, token="" if no_token else token,
                                     allow_remote=allow_remote)
    except FileNotFoundError as exc:
        fail(str(exc), "STORE")
    except ValueError as exc:
        fail(str(exc), "--host/--port/--token")
    except OSError as exc:  # "[Errno 98] Address already in use" named neither
        fail(f"cannot serve on {host} port {port}: {exc.strerror or exc}"
             + (" (another program listens there; --port 0 picks a free one)"
                if exc.errno == errno.EADDRINUSE else ""),
             "--host/--port")
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
