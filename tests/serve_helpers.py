"""A real ``manymodels serve`` process on loopback, and plain HTTP calls to it
(for tests/test_serve*.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Answer:
    status: int
    body: bytes
    headers: dict = field(default_factory=dict)

    def json(self) -> Any:
        return json.loads(self.body)


def call(url: str, method: str = "GET", body: Any = None, *, raw: bytes | None = None,
         headers: dict | None = None, timeout: float = 30) -> Answer:
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url, data=data, method=method, headers={
        "content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return Answer(response.status, response.read(), dict(response.headers))
    except urllib.error.HTTPError as error:
        return Answer(error.code, error.read(), dict(error.headers))


class Server:
    """``manymodels serve STORE ARGS...`` in its own process, ready once its
    /healthz answers 200; stopped (and its output kept) on ``close``."""

    def __init__(self, store: Any, *args: str, log: Any = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.process = subprocess.Popen(
            [sys.executable, "-m", "manymodels", "serve", str(store), "--port", str(self.port),
             *args], stdout=log or subprocess.DEVNULL, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"manymodels serve exited with {self.process.returncode}")
            try:
                if call(self.url + "/healthz", timeout=2).status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.close()
                raise RuntimeError("manymodels serve did not answer /healthz within 60 s")
            time.sleep(0.1)

    def predict(self, rows: list[dict], **kwargs: Any) -> Answer:
        return call(self.url + "/v1/predict", "POST", {"rows": rows}, **kwargs)

    def metric(self, name: str, **kwargs: Any) -> float:
        text = call(self.url + "/metrics", **kwargs).body.decode()
        for line in text.splitlines():
            if line.startswith(f"manymodels_serve_{name} "):
                return float(line.split()[1])
        raise KeyError(name)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
