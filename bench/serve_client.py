"""The load generator of bench/serve_bench.py: a closed-loop HTTP/1.1 client
on raw asyncio streams (uvloop when installed), with keep-alive connections.

Each connection sends a request, waits for its whole answer, and (paced)
waits for its next turn: ``connections`` of them at ``interval`` seconds
apart share the asked rate. A request's latency is from its first byte sent
to its answer's last byte read; a request sent late (its connection was
still waiting) is timed from when it was sent, so the table also gives how
much of the asked rate was met. The client's own CPU per request is
measured (``client_us``): on 2 cores it is CPU the server does not get.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import numpy as np


def request_bytes(port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}",
             "Content-Type: application/json", f"Content-Length: {len(body)}",
             *(f"{name}: {value}" for name, value in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    """One response: its status and body (Content-Length or chunked)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"content-length:")
    if at >= 0:
        length = int(lower[at + 15:lower.index(b"\r\n", at)])
        return status, await reader.readexactly(length)
    body = b""
    while True:  # chunked
        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
        chunk = await reader.readexactly(size + 2)
        if size == 0:
            return status, body
        body += chunk[:-2]


async def _connection(port: int, make: Callable[[int], bytes], positions: range,
                      first_at: float, interval: float | None, stop: float,
                      latencies: list[float], statuses: list[int]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    next_at = first_at
    try:
        for position in positions:
            now = time.perf_counter()
            if now >= stop:
                break
            if interval is not None:
                if next_at > now:
                    await asyncio.sleep(next_at - now)
                next_at += interval
            payload = make(position)
            began = time.perf_counter()
            writer.write(payload)
            status, _ = await _answer(reader)
            latencies.append(time.perf_counter() - began)
            statuses.append(status)
    finally:
        writer.close()


def run_load(port: int, make: Callable[[int], bytes], rate: float | None, seconds: float,
             connections: int = 8) -> dict:
    """``connections`` closed loops for ``seconds``, paced to ``rate``
    requests a second in all (None: as fast as answered). ``make(i)`` is the
    i-th request's bytes."""
    try:
        import uvloop

        new_loop = uvloop.new_event_loop
    except ImportError:
        new_loop = asyncio.new_event_loop
    latencies: list[float] = []
    statuses: list[int] = []
    interval = None if rate is None else connections / rate

    async def main() -> None:
        start = time.perf_counter()
        stop = start + seconds
        await asyncio.gather(*(
            _connection(port, make, range(i, 10**9, connections),
                        start + (i * interval / connections if interval else 0), interval,
                        stop, latencies, statuses) for i in range(connections)))

    loop = new_loop()
    cpu, began = time.process_time(), time.perf_counter()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    ms = np.array(latencies) * 1000
    count = len(ms)
    return {"rate": rate or "max", "requests": count,
            "errors": int(sum(s != 200 for s in statuses)),
            "throughput": count / wall, "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "p999_ms": float(np.percentile(ms, 99.9)),
            "client_us": cpu / max(count, 1) * 1e6, "connections": connections}


def first_requests(port: int, make: Callable[[int], bytes], count: int) -> list[float]:
    """Milliseconds of ``count`` requests sent one after another on one
    connection (the cold loads: each for a model never asked for)."""

    async def main() -> list[float]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        times = []
        try:
            for position in range(count):
                payload = make(position)
                began = time.perf_counter()
                writer.write(payload)
                await _answer(reader)
                times.append((time.perf_counter() - began) * 1000)
        finally:
            writer.close()
        return times

    return asyncio.run(main())
