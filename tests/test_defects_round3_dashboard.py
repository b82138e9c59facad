"""Issue 37, the dashboard: a token asked on loopback too, kept in a cookie
(item 3); a silent connection closed after a read timeout (item 12); a
running run's ETA from the tasks' own clocks, and one page poll counted from
one read of the store (item 19). Real stores, real servers, real sockets."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request

import pytest

import manymodels as mm
from manymodels.dashboard import DashboardServer


def request(url: str, **headers: str) -> tuple[int, dict, str]:
    """Status, headers and body of a GET."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=60) as answer:
            return answer.status, dict(answer.headers), answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def fit(item):
    if item == "k3":
        raise ValueError("bad item k3")
    return {"score": float(item[1:])}


@pytest.fixture
def store(tmp_path):
    path = tmp_path / "store"
    mm.train(fit, mm.items([f"k{i}" for i in range(8)]), backend="serial", progress=False,
             store=path)
    return path


# -- item 3: a token on loopback too ------------------------------------------------------


def test_a_loopback_dashboard_asks_for_its_token_then_takes_the_cookie(store):
    with DashboardServer(store) as server:
        base = f"http://127.0.0.1:{server.port}/"
        failures = f"{base}api/run/1/failures"
        status, _, body = request(failures)  # another local account, no token
        assert status == 403 and "token is required" in body and "bad item" not in body
        status, headers, body = request(f"{failures}?token={server.token}")
        assert status == 200 and "ValueError: bad item k3" in json.loads(body)["items"][0][
            "error"]
        cookie = headers["Set-Cookie"]
        pair, *attributes = [part.strip() for part in cookie.split(";")]
        assert pair == f"manymodels-dashboard-{server.port}={server.token}"
        assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= set(attributes)
        status, headers, body = request(failures, Cookie=f"other=1; {pair}")
        assert status == 200 and "bad item k3" in body and "Set-Cookie" not in headers
        assert request(f"{failures}?token=wrong-token-value")[0] == 403
        assert request(failures, Cookie=f"manymodels-dashboard-{server.port}=wrong-token")[
            0] == 403
        # another port's dashboard's cookie (cookies are not told apart by port)
        assert request(failures, Cookie=f"manymodels-dashboard-1={server.token}")[0] == 403
        assert request(base)[0] == 403  # the page too
        assert server.url == f"{server.address}?token={server.token}" == f"{base}?token=" + (
            server.token)
        assert request(server.url)[0] == 200
        status, headers, _ = request(f"{base}static/app.js")  # no data, no token
        assert status == 200 and "Set-Cookie" not in headers


def test_no_token_must_be_asked_for_and_only_on_loopback(store):
    with pytest.warns(UserWarning, match="every account on this machine"):
        server = DashboardServer(store, token="")
    with server:
        assert server.url == server.address
        assert request(f"{server.address}api/run/1/failures")[0] == 200
    with pytest.raises(ValueError, match="loopback only"):
        DashboardServer(store, host="0.0.0.0", allow_remote=True, token="")
    with pytest.raises(ValueError, match="token must be 8 characters"):
        DashboardServer(store, token="a;b=cdefgh")
    for flags, warned in (([], False), (["--no-token"], True)):
        served = subprocess.Popen(
            [sys.executable, "-m", "manymodels.cli", "dashboard", str(store), *flags],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = served.stdout.readline()
            found = re.search(r"(http://127\.0\.0\.1:\d+/)(\?token=[\w-]{20,})?\s", line)
            assert found and (found.group(2) is None) == warned, line
            if warned:
                assert "every account" in served.stderr.readline()
            url = found.group(1) + "api/runs"
            assert request(url)[0] == (200 if warned else 403)
            assert request(url + (found.group(2) or ""))[0] == 200
        finally:
            served.terminate()
            served.wait(timeout=60)
    refused = subprocess.run(
        [sys.executable, "-m", "manymodels.cli", "dashboard", str(store), "--no-token",
         "--token", "abcdefgh12"], capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"})
    assert refused.returncode != 0 and "not both" in refused.stderr


# -- item 12: a silent connection holds a thread no more -----------------------------------


def test_a_silent_connection_is_closed_while_others_are_answered(store):
    with pytest.raises(ValueError, match="timeout"):
        DashboardServer(store, timeout=0)
    with DashboardServer(store, timeout=0.5) as server:
        silent = socket.create_connection(("127.0.0.1", server.port))
        half = socket.create_connection(("127.0.0.1", server.port))
        half.sendall(b"GET /api/runs HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never ends
        try:
            status, _, body = request(f"{server.url}&x=1")  # answered meanwhile
            assert status == 200 and "<html" in body
            for idle in (silent, half):
                idle.settimeout(60)
                assert idle.recv(1024) == b""  # the server hung up
        finally:
            silent.close()
            half.close()
