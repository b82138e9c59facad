"""``POST /v1/predict`` answered in raw ASGI, ahead of Starlette's routing.

A single-row prediction costs the models tens of microseconds; Starlette's
router, its ``Request`` and ``Response`` objects and the body's streaming
cost about as much again (measured: a third of the server's CPU per request
on a 2-core machine). This middleware answers the predict route itself, with
the same checks in the same order (the token, the body's limit, the
request's refusals) and the same metrics; every other route goes on to
Starlette.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.concurrency import run_in_threadpool

from ..store import StoreIntegrityError
from .cache import NotHeld
from .predictor import RequestError
from .state import log

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]

ROUTE = "/v1/predict"
ARROW = b"application/vnd.apache.arrow.stream"

#: JSON bodies shorter than this (a few rows) are read on the event loop, and
#: answered there where the cache holds their models and they predict
#: quickly: a hop to a thread costs more than they do. Longer ones, Arrow,
#: and any whose model must be loaded first (a large one's unpickling,
#: seconds, held up every request, /healthz too) or is slow to predict, in a
#: thread, the loop left free (a body read on the loop is not read again).
INLINE_BELOW = 64 * 200


class PredictFirst:
    """ASGI middleware: ``POST /v1/predict`` here, the rest to ``app``.
    ``read(body, arrow)`` reads a body (raising :class:`RequestError`);
    ``answer(body, arrow, read, held_only)`` gives the answer's bytes and
    media type (reading the body where ``read`` is None), or raises
    :class:`RequestError` (or a model's own error), or with ``held_only``
    :class:`~.cache.NotHeld` where a model is not loaded yet or is slow."""

    def __init__(self, app: Any, *, served: Any, token: str | None, limit: int,
                 read: Callable[[bytes, bool], Any],
                 answer: Callable[[bytes, bool, Any, bool], tuple[bytes, str]]) -> None:
        self.app, self.served, self.token, self.limit = app, served, token, limit
        self.read, self.answer = read, answer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or _route(scope) != ROUTE:
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        served = self.served
        if served.poller is None:  # mounted in another app, whose lifespan is its own
            served.start()
        status, body, media, extra = await self._respond(scope, receive)
        if status == 0:  # the client went away
            return
        headers = [(b"content-type", media), (b"content-length", str(len(body)).encode()),
                   *extra]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        served.metrics.request(ROUTE, status, time.perf_counter() - started)

    async def _respond(self, scope: Scope, receive: Receive
                       ) -> tuple[int, bytes, bytes, list[tuple[bytes, bytes]]]:
        authorization = declared = b""
        content_type = b""
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                declared = value
            elif name == b"content-type":
                content_type = value
        if self.token is not None and not authorized(authorization, self.token):
            return (401, _error("this server asks for a token: Authorization: Bearer TOKEN"),
                    b"application/json", [(b"www-authenticate", b"Bearer")])
        try:
            body = await _body(receive, declared, self.limit)
            if body is None:
                return 0, b"", b"", []
            arrow = content_type.lower().startswith(ARROW)  # (media types: any case)
            answered = done = None
            if not arrow and len(body) < INLINE_BELOW:
                done = self.read(body, arrow)
                with contextlib.suppress(NotHeld):
                    answered = self.answer(body, arrow, done, True)
            if answered is None:
                answered = await run_in_threadpool(self.answer, body, arrow, done, False)
            content, media = answered
            return 200, content, media.encode(), []
        except RequestError as exc:
            return exc.status, _error(str(exc)), b"application/json", []
        except StoreIntegrityError as exc:  # this model refused; the others serve on
            return 500, _error(str(exc)), b"application/json", []
        except Exception as exc:  # a model's own failure: said, counted, served on
            log.exception("%s failed", ROUTE)
            return 500, _error(f"{type(exc).__name__}: {exc}"), b"application/json", []


def _route(scope: Scope) -> str:
    """The path within the app (a mounted app's path less its mount's), as
    Starlette's routing reads it: the root path counts only as whole segments."""
    path, root = scope["path"], scope.get("root_path", "")
    if not root or not path.startswith(root):
        return path
    return "" if path == root else path[len(root):] if path[len(root)] == "/" else path


def authorized(header: bytes, token: str) -> bool:
    """Whether an ``Authorization`` header's bytes carry ``token`` (UTF-8)."""
    scheme, _, given = header.partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token.encode())


async def _body(receive: Receive, declared: bytes, limit: int) -> bytes | None:
    """The body, refused (413) once it passes ``limit`` bytes, by its
    Content-Length or as it streams in; None when the client disconnected."""
    if declared.isdigit() and int(declared) > limit:
        raise RequestError(413, f"the body is {int(declared)} bytes, over the limit of "
                                f"{limit} (--max-body)")
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise RequestError(413, f"the body is over the limit of {limit} bytes (--max-body)")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _error(message: str) -> bytes:
    return json.dumps({"error": message}).encode()
