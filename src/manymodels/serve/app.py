"""The ASGI application: ``mm.serve_app(store)``, which ``manymodels serve``
runs under uvicorn and a team may mount in its own Starlette or FastAPI
service.

Routes: ``GET /healthz``, ``POST /v1/predict`` (JSON or Arrow IPC),
``GET /v1/models/{key}``, ``POST /v1/reload``, ``GET /metrics``. With a
token, every route but ``/healthz`` asks for ``Authorization: Bearer TOKEN``.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from ..store import StoreIntegrityError
from . import requests as bodies
from .catalog import Catalog, KeyTextError, RunGone, echoed, key_parts
from .fastpath import ROUTE, PredictFirst, authorized
from .predictor import RequestError, predict_rows
from .state import ServedStore, log, parse_size

MAX_BODY = bodies.MAX_BODY


def serve_app(store: Any, *, run: int | None = None, cache_models: int = 1000,
              cache_bytes: int | str = "1GiB", token: str | None = None,
              max_body: int | str = MAX_BODY, poll: float | None = 2.0) -> Starlette:
    """An ASGI application (Starlette) that serves every group's model of
    ``store`` (a path or a :class:`manymodels.Store`).

    Each row of ``POST /v1/predict`` gets the prediction ``Store.predict``
    gives it, from ``run``'s models or by default each group's latest model
    in the runs that have ended; models load on first use, checked against
    their SHA-256, and stay in an LRU of at most ``cache_models`` models and
    ``cache_bytes`` (their stored sizes). Every ``poll`` seconds (None: never;
    ``POST /v1/reload`` any time) it looks for a run that ended since, and
    serves its models from then on without failing a request. ``token``:
    asked as ``Authorization: Bearer`` on every route but ``/healthz``.
    ``max_body``: a larger request is answered 413. A store that is not
    one, or an unknown ``run``, is refused here, by name (ValueError).
    """
    if token is not None and (not isinstance(token, str) or not token
                              or token != token.strip()):
        raise ValueError("token must be a non-empty string without surrounding spaces "
                         "(a header's value is read without them), or None for no token")
    limit = parse_size(max_body, "max_body")
    served = ServedStore(store, run, cache_models, parse_size(cache_bytes, "cache_bytes"),
                         poll)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        served.start()
        try:
            yield
        finally:
            served.stop()

    def timed(route: str, handler: Callable[[Request], Awaitable[Response]]) -> Callable:
        async def endpoint(request: Request) -> Response:
            started = time.perf_counter()
            if served.poller is None:  # mounted in another app, whose lifespan is its own
                served.start()
            if token is not None and route != "/healthz" and not _authorized(request, token):
                response: Response = JSONResponse(
                    {"error": "this server asks for a token: Authorization: Bearer TOKEN"},
                    401, headers={"WWW-Authenticate": "Bearer"})
            else:
                try:
                    response = await handler(request)
                except RequestError as exc:
                    response = JSONResponse({"error": str(exc)}, exc.status)
                except StoreIntegrityError as exc:  # this model refused; the others serve on
                    response = JSONResponse({"error": str(exc)}, 500)
                except Exception as exc:  # a model's own failure: said, counted, served on
                    log.exception("%s failed", route)
                    response = JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, 500)
            served.metrics.request(route, response.status_code, time.perf_counter() - started)
            return response

        return endpoint

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "run_id": served.catalog.run_id})

    def read(body: bytes, arrow: bool) -> Read:
        catalog = served.catalog  # this request's, whatever a reload swaps in meanwhile
        columns, n = (bodies.arrow_columns(body, catalog.by, limit) if arrow
                      else bodies.json_columns(body, catalog.by, limit))
        return Read(catalog, columns, n, arrow)

    def answer(body: bytes, arrow: bool, done: Read | None = None,
               held_only: bool = False) -> tuple[bytes, str]:
        # ``done``: the body read already (on the event loop), not read again
        done = done or read(body, arrow)
        if held_only:  # on the event loop: no load, no reload (NotHeld: in a thread)
            return answer_from(done, held_only)
        try:
            return answer_from(done)
        except StoreIntegrityError:
            # a model gone from under the catalog (its run deleted, then gc):
            # the store changed, so its current state is read now, not at the
            # next poll, and the request answered once more, whole, from the
            # catalog served then: this reload's, or one another thread (the
            # poller, another request) swapped in since this request read its
            # own (this reload then finds nothing new)
            served.reload()
            if served.catalog is not done.catalog:
                return answer_from(read(body, arrow))
            raise

    def answer_from(done: Read, held_only: bool = False) -> tuple[bytes, str]:
        result = predict_rows(done.catalog, served.cache, done.columns, done.n,
                              ordered=done.arrow, held_only=held_only)
        if done.arrow:
            return bodies.arrow_answer(result), bodies.ARROW
        return bodies.json_answer(result), "application/json"

    def describe(text: str, again: bool = True
                 ) -> tuple[Catalog, tuple, dict[str, Any] | None]:
        # in a thread: the key's kinds are read once a catalog (seconds for a
        # million keys of dates), and its run's tasks once a run
        catalog = served.catalog
        try:
            parts = key_parts(catalog, text)
        except KeyTextError as exc:
            raise RequestError(422, str(exc)) from exc
        except ValueError as exc:
            raise RequestError(400, str(exc)) from exc
        try:
            return catalog, parts, catalog.describe(catalog.store, parts)
        except RunGone as exc:
            # the run deleted under the catalog: the store is read again now,
            # as a predict whose model is gone does, not at the next poll
            served.reload()
            if again and served.catalog is not catalog:
                return describe(text, again=False)
            raise RequestError(404, str(exc)) from exc

    async def model(request: Request) -> Response:
        catalog, parts, described = await run_in_threadpool(describe,
                                                            request.path_params["key"])
        if described is None:
            return JSONResponse({"error": f"no model answers key {request.path_params['key']!r}"
                                          f" in run {catalog.run_id}"}, 404)
        # a NaN metric (r2 of a constant target): null; an infinite key part: its text
        return JSONResponse(bodies.finite({"key": [echoed(part) for part in parts],
                                           "by": catalog.by, **described}))

    async def reload(request: Request) -> Response:
        changed = await run_in_threadpool(served.reload)
        catalog = served.catalog
        return JSONResponse({"reloaded": changed, "run_id": catalog.run_id,
                             "models": catalog.models})

    async def metrics(request: Request) -> Response:
        return PlainTextResponse(served.metrics.text(served.cache.stats(), served.catalog),
                                 media_type="text/plain; version=0.0.4")

    async def predict_answered_first(request: Request) -> Response:
        # POST /v1/predict is answered by PredictFirst before routing; the
        # route is here for what routing says of it: 405 to another method,
        # a redirect from /v1/predict/
        return JSONResponse({"error": "not found"}, status_code=404)

    routes = [Route(ROUTE, predict_answered_first, methods=["POST"]),
              Route("/healthz", timed("/healthz", healthz), methods=["GET"]),
              Route("/v1/models/{key:path}", timed("/v1/models", model), methods=["GET"]),
              Route("/v1/reload", timed("/v1/reload", reload), methods=["POST"]),
              Route("/metrics", timed("/metrics", metrics), methods=["GET"])]
    fast = Middleware(PredictFirst, served=served, token=token, limit=limit, read=read,
                      answer=answer)
    app = Starlette(routes=routes, lifespan=lifespan, middleware=[fast])
    app.state.served = served
    return app


@dataclass
class Read:
    """A predict request's body read against the catalog it is answered from."""

    catalog: Catalog
    columns: Mapping[str, Any]
    n: int
    arrow: bool


def _authorized(request: Request, token: str) -> bool:
    """As the predict route checks it (:func:`.fastpath.authorized`): the
    header's bytes as they came (Starlette reads them as Latin-1)."""
    return authorized(request.headers.get("authorization", "").encode("latin-1"), token)


#: The environment variable ``manymodels serve --workers`` hands its options in.
CONFIG_VARIABLE = "MANYMODELS_SERVE_CONFIG"


def app_from_environment() -> Starlette:
    """The app of each uvicorn worker process (``--workers W``), built from the
    options ``manymodels serve`` put in :data:`CONFIG_VARIABLE`."""
    import json
    import logging

    from .state import LOG_FORMAT

    if not logging.getLogger().handlers:  # a spawned worker: its reloads and errors said too
        logging.basicConfig(level=logging.INFO, format=LOG_FORMAT)
    options = json.loads(os.environ[CONFIG_VARIABLE])
    store = options.pop("store")
    application = serve_app(store, **options)
    freeze_startup_objects()
    return application


def freeze_startup_objects() -> None:
    """Move what the server process made to start (its imports, about 70,000
    objects) out of the garbage collector's sight: a full collection of them
    took 40-120 ms, paid by whichever request triggered it. For
    ``manymodels serve``'s own processes only: an app mounted in another
    service leaves that service's collector as it is."""
    import gc

    gc.collect()
    gc.freeze()
