"""``manymodels serve STORE``: every group's model behind one HTTP endpoint,
under uvicorn (see :mod:`manymodels.serve`)."""

from __future__ import annotations

import ipaddress
import json
import logging
import logging.handlers
import os
import socket

import typer

from .app import app
from .arguments import store_path


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _refuse(message: str, hint: str) -> typer.BadParameter:
    return typer.BadParameter(message, param_hint=hint)


@app.command()
def serve(
    store: str = typer.Argument(
        ..., callback=store_path, help="Store directory written by manymodels train."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; any other than loopback "
                             "needs --token."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to listen on."),
    run: int = typer.Option(None, help="Serve this run's models (default: each group's "
                            "latest, swapped live when a run ends)."),
    cache_models: int = typer.Option(1000, min=1, help="Most models kept in memory."),
    cache_bytes: str = typer.Option("1GiB", help="Most bytes of models kept in memory "
                                    "(their stored sizes): 512MiB, 2GB..."),
    max_body: str = typer.Option("64MiB", help="Largest request body; larger: 413."),
    token: str = typer.Option(None, envvar="MANYMODELS_SERVE_TOKEN",
                              help="Bearer token asked on every route but /healthz "
                              "(needed off loopback)."),
    workers: int = typer.Option(1, min=1, help="Server processes (each its own cache)."),
    poll: float = typer.Option(2.0, min=0.0, help="Seconds between looks for a new run "
                               "(0: never; POST /v1/reload still works)."),
) -> None:
    """Serve every group's model over HTTP: POST /v1/predict with {"rows": [...]}
    answers each row with its group's model (or the fallback), as
    manymodels predict would, and a run that ends is served within seconds.

    Example: manymodels serve models/ --port 8000
    """
    import uvicorn

    from ..serve.app import CONFIG_VARIABLE, freeze_startup_objects, serve_app

    if not _loopback(host) and not token:
        raise _refuse(f"{host!r} is not loopback: give --token (or MANYMODELS_SERVE_TOKEN), "
                      "which every request must then carry", "--host")
    family = _address_family(host, port)  # (before the store is read)
    options = {"run": run, "cache_models": cache_models, "cache_bytes": cache_bytes,
               "max_body": max_body, "token": token or None, "poll": poll or None}
    held = _hold_logs()  # written once the port is had: a port in use is then one line
    try:  # refused here, by name, before anything listens
        application = serve_app(store, **options)
    except ValueError as exc:
        text = str(exc)
        hint = ("--run" if "has no run" in text else "--cache-bytes" if "cache_bytes" in text
                else "--max-body" if "max_body" in text
                else "--token" if text.startswith("token ") else "STORE")
        _release_logs(held)
        raise _refuse(text, hint) from exc
    # the URL is said once its port is ours (--port 0)
    listening = _listen(host, port, family, held)
    _release_logs(held)
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address, in a URL: [::1]
    typer.echo(f"manymodels serve {store}: http://{shown}:{listening.getsockname()[1]}"
               f"/v1/predict (run {application.state.served.catalog.run_id}; Ctrl-C stops it)")
    if workers == 1:
        freeze_startup_objects()
        server = uvicorn.Server(uvicorn.Config(application, log_level="warning",
                                               access_log=False))
        try:
            server.run(sockets=[listening])
        except KeyboardInterrupt:
            pass
        if not server.started:
            raise typer.Exit(3)
        return
    from uvicorn.supervisors import Multiprocess

    application.state.served.store.close()
    os.environ[CONFIG_VARIABLE] = json.dumps({"store": str(store), **options})
    config = uvicorn.Config("manymodels.serve.app:app_from_environment", factory=True,
                            workers=workers, log_level="warning", access_log=False)
    try:
        Multiprocess(config, sockets=[listening]).run()
    except KeyboardInterrupt:
        pass


def _hold_logs() -> logging.handlers.MemoryHandler | None:
    """Log lines to stderr (as ``logging.basicConfig``, where nothing has set
    logging up), held back until :func:`_release_logs`; None where logging
    was set up already."""
    import logging.handlers

    root = logging.getLogger()
    if root.handlers:
        return None
    console = logging.StreamHandler()
    from ..serve.state import LOG_FORMAT

    console.setFormatter(logging.Formatter(LOG_FORMAT))
    held = logging.handlers.MemoryHandler(1000, flushLevel=logging.CRITICAL + 1, target=console)
    root.addHandler(held)
    root.setLevel(logging.INFO)
    return held


def _release_logs(held: logging.handlers.MemoryHandler | None, drop: bool = False) -> None:
    """Write the lines ``held`` (none if ``drop``) and log straight to stderr from now."""
    if held is None:
        return
    root = logging.getLogger()
    root.removeHandler(held)
    if drop:
        held.buffer.clear()
    root.addHandler(held.target)
    held.close()  # (flushes what it holds)


def _address_family(host: str, port: int) -> socket.AddressFamily:
    """The family of the address ``host`` names (IPv4 or IPv6); one that
    names none (a typo, a name no resolver knows) is refused naming --host,
    before the store is read, not told as a port that cannot be had."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                   flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise _refuse(f"{host!r} is not an address this machine can listen on: "
                      f"{getattr(exc, 'strerror', None) or exc}", "--host") from exc
    return found[0][0]


def _listen(host: str, port: int, family: socket.AddressFamily,
            held: logging.handlers.MemoryHandler | None) -> socket.socket:
    """A socket listening on ``host``:``port`` (an address of ``family``),
    handed to uvicorn (and its workers); a port that cannot be had is
    refused in one line, exit status 1 (the log lines ``held`` dropped)."""
    sock = socket.socket(family)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(2048)  # uvicorn's backlog: a request sent once the URL is said waits
    except OSError as exc:
        sock.close()
        _release_logs(held, drop=True)
        typer.echo(f"manymodels serve: cannot listen on {host} --port {port}: "
                   f"{exc.strerror or exc}", err=True)
        raise typer.Exit(1) from exc
    sock.set_inheritable(True)
    return sock
