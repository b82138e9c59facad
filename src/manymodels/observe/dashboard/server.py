"""The live dashboard's web server: the standard library's, on 127.0.0.1.

Why ``http.server``: the dashboard answers a handful of small JSON requests
every two seconds, for one or a few people; a threaded standard-library
server does that with no dependency to install, audit or keep in step (no
web framework, no ASGI server), and nothing is fetched from a CDN: the page,
its script and its style ship in the package (``static/``).

Safety: it binds to loopback unless told otherwise (a non-loopback address
needs ``allow_remote``), and asks for a token on every address, loopback
too, as Jupyter does: the store is its owner's only, and any local account
can reach a loopback port. The token is random unless given, printed in
the URL (``?token=``); the first request that carries it gets it back as a
cookie (``HttpOnly``, ``SameSite=Strict``, one name per port), so the page's
own requests and a reload need it no more. ``token=""`` serves without one,
on loopback only and with a warning. The page's script and style
(``/static/``) hold no data and need no token. On loopback it checks the
``Host`` header (no DNS rebinding). A connection that sends nothing for
:data:`READ_TIMEOUT` seconds is closed (each holds a thread). It opens the
store read-only. The page puts every key and error into the document as
text (``textContent``), never as HTML, and the Content-Security-Policy
allows only the package's own script.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import math
import re
import secrets
import socket
import threading
import warnings
from http import HTTPStatus
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from .queries import SECTIONS, Queries

STATIC = Path(__file__).with_name("static")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8"}
#: the static report has inline style and SVG, and no script at all
_REPORT_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
#: Seconds a connection may stay silent (before or within its request)
#: before it is closed: each holds one of the server's threads.
READ_TIMEOUT = 20.0


def is_loopback(host: str, resolve: bool = True) -> bool:
    """Whether ``host`` is this machine's loopback: ``localhost`` or a
    loopback address; with ``resolve``, a name that resolves to one only
    (the address to bind; never a request's Host header, whose name a page
    elsewhere can make resolve to 127.0.0.1: DNS rebinding)."""
    if host.lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        if not resolve:
            return False
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback
                       for info in socket.getaddrinfo(host, None))
        except OSError:
            return False


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: they go as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _run_id(text: str) -> bool:
    """Whether ``text`` is a run id: ASCII digits (``isdigit`` takes ``²``), at
    most 18 of them (SQLite's integers; a 5,000-digit one is no run's)."""
    return re.fullmatch(r"[0-9]{1,18}", text) is not None


def _host_name(header: str) -> str:
    """A ``Host`` header's name without its port: ``[::1]:8080`` and
    ``[::1]`` are ``::1`` (an IPv6 address without a port lost its last
    group to a cut at the last colon, and was refused), ``localhost:8080``
    is ``localhost``."""
    header = header.strip()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    return header.rpartition(":")[0] if header.count(":") == 1 else header


class _Reports:
    """The HTML reports the dashboard has made, by run (its id and start:
    a store made again at its path numbers its runs from 1 again), made
    one at a time. A report of a million tasks takes seconds and most of a
    gigabyte to make: each click made it again, and clicks at once made it
    at once. An ended run's report is kept (the last :data:`KEPT`, about
    1.3 MB each at a million tasks); a running run's is made each time."""

    KEPT = 4

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[tuple[int, float], bytes] = {}

    def get(self, run: dict[str, Any], make: Any) -> bytes:
        """``run``'s report (a row of :meth:`.Queries.run_row`), from ``make()``
        where it is not kept."""
        which = (run["run_id"], run["started_at"])
        with self._lock:
            body = self._kept.get(which)
            if body is None:
                body = make()
                if run["status"] not in ("running", "interrupted"):
                    self._kept[which] = body
                    while len(self._kept) > self.KEPT:
                        del self._kept[next(iter(self._kept))]
            return body


class _IPv6Server(ThreadingHTTPServer):
    """The dashboard's server on an IPv6 address (``::1``)."""

    address_family = socket.AF_INET6


class DashboardServer:
    """Serves one store's dashboard from a thread; :attr:`url` is its address,
    with the token.

    ``port`` 0 picks a free one. ``host`` other than loopback is refused unless
    ``allow_remote``. ``token``: the token every request must carry (in the
    URL, or in the cookie the first one gets); ``None`` makes a random one,
    ``""`` asks for none (loopback only: it lets every local account read the
    store, so it warns). ``timeout``: seconds a silent connection is kept.
    """

    def __init__(self, store: str | Path, host: str = "127.0.0.1", port: int = 0, *,
                 token: str | None = None, allow_remote: bool = False,
                 timeout: float = READ_TIMEOUT) -> None:
        if not isinstance(port, int) or not 0 <= port < 65536:
            raise ValueError(f"port must be 0 (any free port) to 65535, got {port!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                0 < timeout < math.inf):
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        loopback = is_loopback(host)
        if not loopback and not allow_remote:
            raise ValueError(
                f"host {host!r} is not a loopback address: the dashboard would show the "
                "store's keys, metrics and tracebacks to the network. Pass --allow-remote "
                "(allow_remote=True) to do so; a token is then required in the URL")
        if token is not None and not isinstance(token, str):
            raise ValueError(f"token must be a string, got {type(token).__name__}")
        if token == "":
            if not loopback:
                raise ValueError(f"token='' (--no-token) serves without a token, which is "
                                 f"allowed on loopback only, not on host {host!r}")
            warnings.warn("the dashboard asks for no token: every account on this machine "
                          "can read the store's keys, metrics and tracebacks through it",
                          UserWarning, stacklevel=2)
        elif token is not None and not re.fullmatch(r"[A-Za-z0-9._~-]{8,}", token):
            raise ValueError("token must be 8 characters or more, each a letter, digit or "
                             "one of . _ ~ - (it goes in a URL and a cookie as it is)")
        self.token = secrets.token_urlsafe(18) if token is None else token
        self.timeout = float(timeout)
        self.queries = Queries(store)
        self.reports = _Reports()
        self.host, self.loopback = host, loopback
        server = _IPv6Server if ":" in host else ThreadingHTTPServer
        self.httpd = server((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.dashboard = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        #: cookies are not told apart by port: each dashboard names its own
        self.cookie_name = f"manymodels-dashboard-{self.port}"
        self._thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        """The URL without the token."""
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}/"

    @property
    def url(self) -> str:
        """The URL to open: with ``?token=`` unless the token is ``""``."""
        return self.address + (f"?token={self.token}" if self.token else "")

    def start(self) -> DashboardServer:
        """Serve from a daemon thread; return self."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                        name="manymodels-dashboard")
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join()
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Handler(BaseHTTPRequestHandler):
    server_version = "manymodels-dashboard"
    _cookie: str | None = None  # a Set-Cookie to send with this answer

    @property  # read by StreamRequestHandler.setup: the socket's timeout
    def timeout(self) -> float:  # type: ignore[override]
        return self.server.dashboard.timeout  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # quiet: it polls
        pass

    @property
    def board(self) -> DashboardServer:
        return self.server.dashboard  # type: ignore[attr-defined]

    def _send(self, status: int, body: bytes, kind: str, policy: str = _CSP) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", policy)
        self.send_header("Referrer-Policy", "no-referrer")
        if self._cookie is not None:
            self.send_header("Set-Cookie", self._cookie)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, value: Any, status: int = 200) -> None:
        body = json.dumps(_clean(value), separators=(",", ":")).encode()
        self._send(status, body, "application/json")

    def _error(self, status: HTTPStatus, message: str) -> None:
        self._json({"error": message}, status)

    def _allowed(self, query: dict[str, list[str]]) -> bool:
        board = self.board
        if board.loopback:  # DNS rebinding: a page elsewhere naming our port
            host = _host_name(self.headers.get("Host") or "")
            if host and not is_loopback(host, resolve=False):
                self._error(HTTPStatus.FORBIDDEN, f"Host {host!r} is not this machine")
                return False
        if not board.token:  # token="": asked for none, explicitly
            return True
        expected = board.token.encode()
        given = (query.get("token") or [""])[0]
        if hmac.compare_digest(given.encode(), expected):
            # kept by the browser: the page's own requests need it no more
            self._cookie = (f"{board.cookie_name}={board.token}; HttpOnly; "
                            "SameSite=Strict; Path=/")
            return True
        if hmac.compare_digest(self._cookie_token().encode(), expected):
            return True
        self._error(HTTPStatus.FORBIDDEN, "a token is required: open the address that "
                    "`manymodels dashboard` printed, with its ?token=")
        return False

    def _cookie_token(self) -> str:
        """The token in this dashboard's cookie, or ``""``."""
        try:
            cookies = SimpleCookie(self.headers.get("Cookie") or "")
        except CookieError:
            return ""
        found = cookies.get(self.board.cookie_name)
        return found.value if found is not None else ""

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self._cookie = None
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        path = parts.path
        if path.startswith("/static/"):  # the page's own code: no data, no token
            name = path.removeprefix("/static/")
            file = STATIC / name
            if "/" in name or name.startswith(".") or not file.is_file():
                return self._error(HTTPStatus.NOT_FOUND, "no such file")
            return self._send(200, file.read_bytes(), _TYPES.get(file.suffix, "text/plain"))
        if not self._allowed(query):
            return None
        if path == "/":
            return self._send(200, (STATIC / "index.html").read_bytes(), _TYPES[".html"])
        try:
            if path.startswith("/report/") and _run_id(path.removeprefix("/report/")):
                return self._report(int(path.removeprefix("/report/")))
            return self._api(path, query)
        except KeyError as exc:
            return self._error(HTTPStatus.NOT_FOUND, str(exc.args[0]))
        except Exception as exc:  # the store is being written, or damaged: say so
            return self._error(HTTPStatus.SERVICE_UNAVAILABLE, f"{type(exc).__name__}: {exc}")

    def _report(self, run_id: int) -> None:
        """The run's static HTML report (:mod:`manymodels.observe.report`), made on demand."""
        import tempfile

        from ...store import Store
        from ..report import store_report

        run = self.board.queries.run_row(run_id)  # KeyError: no such run

        def make() -> bytes:
            store = Store(self.board.queries.root, read_only=True)
            try:
                with tempfile.TemporaryDirectory(prefix="manymodels-report-") as tmp:
                    return store_report(store, run_id, f"{tmp}/report.html").read_bytes()
            finally:
                store.close()

        self._send(200, self.board.reports.get(run, make), _TYPES[".html"], _REPORT_CSP)

    def _api(self, path: str, query: dict[str, list[str]]) -> None:
        queries = self.board.queries
        parts = [p for p in path.split("/") if p]
        search = (query.get("q") or [""])[0][:200]
        if parts == ["api", "runs"]:
            return self._json({"runs": queries.runs()})
        if parts == ["api", "page"]:  # what the page polls: runs and one run, together
            chosen = (query.get("run") or [""])[0]
            if chosen and not _run_id(chosen):
                raise KeyError(f"run must be a run id, got {chosen[:20]!r}")
            return self._json(queries.page(int(chosen) if chosen else None, search))
        if len(parts) in (3, 4) and parts[:2] == ["api", "run"] and _run_id(parts[2]):
            run_id = int(parts[2])
            if len(parts) == 3:
                return self._json(queries.run(run_id, search))
            if parts[3] in SECTIONS:
                return self._json(queries.section(run_id, parts[3], search))
        raise KeyError(f"no such page {path!r}")
