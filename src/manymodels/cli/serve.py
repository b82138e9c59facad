"""``manymodels serve STORE``: every group's model behind one HTTP endpoint,
under uvicorn (see :mod:`manymodels.serve`)."""

from __future__ import annotations

import ipaddress
import json
import logging
import os

import typer

from .app import app


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
    store: str = typer.Argument(..., help="Store directory written by manymodels train."),
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
    options = {"run": run, "cache_models": cache_models, "cache_bytes": cache_bytes,
               "max_body": max_body, "token": token or None, "poll": poll or None}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s manymodels serve: %(message)s")
    try:  # refused here, by name, before anything listens
        application = serve_app(store, **options)
    except ValueError as exc:
        text = str(exc)
        hint = ("--run" if "has no run" in text else "--cache-bytes" if "cache_bytes" in text
                else "--max-body" if "max_body" in text else "STORE")
        raise _refuse(text, hint) from exc
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address, in a URL: [::1]
    typer.echo(f"manymodels serve {store}: http://{shown}:{port}/v1/predict "
               f"(run {application.state.served.catalog.run_id}; Ctrl-C stops it)")
    if workers == 1:
        freeze_startup_objects()
        uvicorn.run(application, host=host, port=port, log_level="warning", access_log=False)
        return
    application.state.served.store.close()
    os.environ[CONFIG_VARIABLE] = json.dumps({"store": str(store), **options})
    uvicorn.run("manymodels.serve.app:app_from_environment", factory=True, host=host,
                port=port, workers=workers, log_level="warning", access_log=False)
