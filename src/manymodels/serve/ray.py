"""For teams on Ray Serve: a deployment whose models come from a manymodels
store through Ray Serve's model multiplexing (``@serve.multiplexed``: an LRU
of models per replica, and requests routed to a replica that holds theirs).

A request is ``POST`` ``{"rows": [...]}`` with the header
``serve_multiplexed_model_id`` naming its group's key (as ``GET
/v1/models/{key}`` names it); its rows are answered as ``POST /v1/predict``
answers them, by :func:`manymodels.serve.predictor.predict_rows`, the model
coming from Ray Serve's multiplexed cache. Needs ``pip install "ray[serve]"``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePath
from typing import Any

from ..store import StoreIntegrityError
from .cache import ModelCache, ModelLoadError
from .catalog import key_parts
from .predictor import RequestError, predict_rows
from .requests import MAX_BODY, json_answer, json_columns
from .state import ServedStore, check_run_and_poll, log, open_served_store, parse_size

#: The header naming a request's group key (Ray Serve's multiplexed model id).
MODEL_ID_HEADER = "serve_multiplexed_model_id"


class _Multiplexed:
    """The cache ``predict_rows`` reads: the multiplexed model for its digest,
    any other (the fallback, or a group's model swapped in since) from a
    small cache of the replica's own."""

    def __init__(self, digest: str | None, model: Any, others: ModelCache) -> None:
        self.digest, self.model, self.others = digest, model, others

    def get(self, store: Any, digest: str, what: str) -> Any:
        if digest == self.digest:
            return self.model
        return self.others.get(store, digest, what)

    def timed(self, digest: str, seconds: float) -> None:
        """A prediction's time (:meth:`ModelCache.timed`): noted where the
        replica's own cache holds the model; Ray Serve's holds the rest."""
        self.others.timed(digest, seconds)


class StoreModels:
    """The body of the deployment (see :func:`deployment`): one per replica."""

    def __init__(self, store: str, run: int | None = None, poll: float | None = 2.0,
                 max_body: int = MAX_BODY) -> None:
        self.served = ServedStore(store, run, cache_models=4, cache_bytes=1 << 30, poll=poll)
        self.max_body = max_body
        self.served.start()

    async def load(self, model_id: str) -> tuple[str | None, Any]:
        """(digest, model) of the group ``model_id`` names (wrapped in
        ``@serve.multiplexed`` by :func:`deployment`). A key that cannot be
        read as its column holds keys is the request's fault (400, as
        ``GET /v1/models/{key}`` answers it), not the server's. Read in a
        thread: a cold model's read and unpickling (seconds for a large
        one), and the catalog's key kinds, would hold up every other request
        of the replica on its event loop."""
        return await asyncio.to_thread(self._load, model_id)

    def _load(self, model_id: str) -> tuple[str | None, Any]:
        catalog = self.served.catalog
        try:
            parts = key_parts(catalog, model_id)
        except ValueError as exc:  # (KeyTextError too)
            raise RequestError(400, f"header {MODEL_ID_HEADER}: {exc}") from exc
        digest, source = catalog.find(parts)
        if digest is None:
            return None, None
        return digest, self.served.cache.get(catalog.store, digest, f"key {model_id}")

    async def respond(self, request: Any, model_id: str,
                      get_model: Callable[[str], Awaitable[tuple[str | None, Any]]]) -> Any:
        """The answer to ``request``, whose header named ``model_id``, the
        model coming from ``get_model`` (Ray Serve's multiplexed
        :meth:`load`). Without the header, its rows are answered from the
        replica's own cache (Ray Serve refuses an empty id, a 500)."""
        from starlette.responses import JSONResponse

        loaded: tuple[str | None, Any] = (None, None)
        if model_id:
            try:
                _refuse_declared_size(request, self.max_body)  # before the model's load
                loaded = await get_model(model_id)
            except RequestError as exc:
                return JSONResponse({"error": str(exc)}, exc.status)
            except (StoreIntegrityError, ModelLoadError) as exc:  # named: key and why
                return JSONResponse({"error": str(exc)}, 500)
        return await self.answer(request, loaded)

    async def answer(self, request: Any, loaded: tuple[str | None, Any]) -> Any:
        """The rows of ``request`` answered in a thread, as the Starlette
        server answers a request that needs a load or a slow model: a model
        of another group loaded meanwhile, or any model's prediction, would
        hold up the replica's event loop."""
        from starlette.responses import JSONResponse, Response

        try:
            body = await _limited_body(request, self.max_body)
            result = await asyncio.to_thread(self._predict, body, loaded)
        except RequestError as exc:
            return JSONResponse({"error": str(exc)}, exc.status)
        except StoreIntegrityError as exc:
            return JSONResponse({"error": str(exc)}, 500)
        except Exception as exc:  # a model's own failure: said, and answered as serve's
            log.exception("a Ray Serve request failed")
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, 500)
        return Response(json_answer(result), media_type="application/json")

    def _predict(self, body: bytes, loaded: tuple[str | None, Any]) -> Any:
        catalog = self.served.catalog  # (and its store: one state of the store)
        columns, n = json_columns(body, catalog.by, self.max_body)
        return predict_rows(catalog, _Multiplexed(*loaded, self.served.cache),
                            columns, n, ordered=False)  # JSON rows


async def _limited_body(request: Any, limit: int) -> bytes:
    """A request's body, refused (413) once it passes ``limit`` bytes, by its
    Content-Length or as it streams in (``manymodels serve``'s rule): read
    whole, any size was held before a row of it was looked at."""
    _refuse_declared_size(request, limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over the limit of {limit} bytes (max_body)")
        chunks.append(chunk)
    return b"".join(chunks)


def _refuse_declared_size(request: Any, limit: int) -> None:
    """Refuse (413) a request whose Content-Length passes ``limit``: said
    before the model its header names is loaded (seconds for a cold one),
    not after."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body is {int(declared)} bytes, over the limit of "
                                f"{limit} (max_body)")


def deployment(store: str, *, run: int | None = None, max_models_per_replica: int = 3,
               num_replicas: int = 1, poll: float | None = 2.0,
               max_body: int | str = MAX_BODY, **options: Any) -> Any:
    """A Ray Serve deployment of ``store``'s models: bind it and run it
    (``serve.run(deployment("models/").bind())``). ``max_models_per_replica``
    is ``@serve.multiplexed``'s ``max_num_models_per_replica``; ``max_body``
    (bytes, or text like ``"64MiB"``) bounds a request's body as
    ``manymodels serve --max-body`` does; ``options`` go to
    ``@serve.deployment``."""
    from ray import serve

    limit = parse_size(max_body, "max_body")
    store = _served_location(store, run, poll)

    @serve.deployment(num_replicas=num_replicas, **options)
    class ManyModels(StoreModels):
        def __init__(self) -> None:
            super().__init__(store, run, poll, limit)

        @serve.multiplexed(max_num_models_per_replica=max_models_per_replica)
        async def get_model(self, model_id: str) -> tuple[str | None, Any]:
            return await self.load(model_id)

        async def __call__(self, request: Any) -> Any:
            return await self.respond(request, serve.get_multiplexed_model_id(),
                                      self.get_model)

    return ManyModels


def _served_location(store: Any, run: int | None, poll: float | None) -> str:
    """``store`` as each replica opens it, checked here first: a store that
    is not one, an unknown ``run``, no run ended, a bad ``poll`` are refused
    by name now, not by each replica's constructor once Ray Serve has
    started them (an error wrapped in Ray's, after its retries). A local
    path is made absolute: a replica's working directory is Ray's, not this
    process's."""
    from ..inputs.fileuris import local_location
    from ..inputs.objectstores import is_remote
    from .catalog import ended_runs

    check_run_and_poll(run, poll)
    opened = open_served_store(store)
    try:
        if run is not None:
            opened._run_row(run)  # "has no run N"
        elif not ended_runs(opened):
            raise ValueError(f"store {str(opened)!r} holds no run that has ended yet")
        root = str(opened.root)
    finally:
        if opened is not store:  # opened here, closed here: not left to a finaliser
            opened.close()
    store = local_location(store, "store")  # (checked by open_served_store)
    if isinstance(store, (str, PurePath)) and not is_remote(store):
        return str(Path(store).expanduser().absolute())
    return root
