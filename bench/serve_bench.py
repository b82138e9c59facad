"""How fast ``manymodels serve`` answers, on this machine, load generator included.

Two stores, built once with ``mm.train`` (processes backend) and kept under
bench/results/serve-stores/ by kind and size: 1,000,000 tiny models
(``DummyRegressor``, packed) and 10,000 scikit-learn ``Ridge`` models. Keys
are drawn from a Zipf distribution (s=1.1). The client (bench/serve_client.py)
is closed-loop on raw asyncio keep-alive connections, single-row requests,
paced at 200 and 1,000 req/s and unpaced (the most the server sustains with
the client on the same cores); its own CPU per request is in the table.
Figures: p50/p99/p99.9 latency, throughput, the cache's hit ratio, the PSS of
the server's process tree (and that less the bytes its cache holds), cold
loads on a fresh server (the first request for a model, end to end, and the
server's own load time from /metrics), and the cold path in-process, stage by
stage. On the Ridge store, in the same run: Ray Serve's multiplexed
deployment (``manymodels.serve.ray``, its cache raised to ``--cache-models``)
and a plain FastAPI endpoint that unpickles the model's file per request; the
Ridge servers are also paced at 1,500 and 2,000 req/s, and the table ends
with each one's throughput at p99 <= 20 ms.

    python bench/serve_bench.py                          # the issue's sizes
    python bench/serve_bench.py --tiny 20000 --sklearn 1000 --seconds 5   # quicker

Prints a table and writes bench/results/serve.json (and a timestamped copy).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

from serve_client import first_requests, request_bytes, run_load
from serve_others import FASTAPI, RAY, export_pickles

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fit_tiny(data):
    """A group's mean as a ``DummyRegressor`` (a 316-byte pickle), set rather
    than fitted: scikit-learn's validation would be most of a million fits."""
    from sklearn.dummy import DummyRegressor

    model = DummyRegressor()
    model.constant_ = np.array([[float(data["y"].mean())]])
    model.n_outputs_ = 1
    return model


def fit_ridge(df):
    from sklearn.linear_model import Ridge

    return Ridge().fit(df[["x", "z"]], df["y"])


STORES = ROOT / "bench" / "results" / "serve-stores"  # git-ignored: kept between runs


def cached_store(kind: str, groups: int) -> Path:
    """The store of ``groups`` models of ``kind`` ("tiny" or "ridge"), built
    once with ``mm.train`` on the processes backend and kept under
    bench/results/serve-stores/ (keyed by kind and size): a re-run skips the
    build. A build that did not finish is built again."""
    import manymodels as mm

    path = STORES / f"{kind}-{groups}"
    if (path / "built.json").is_file():
        print(f"  {groups:,} {kind} models: {path} (built before)")
        return path
    if path.exists():
        shutil.rmtree(path)
    rows = 2 if kind == "tiny" else 20
    rng = np.random.default_rng(0)
    n = groups * rows
    key = np.repeat(np.arange(groups, dtype=np.int64), rows)
    x, z = rng.random(n), rng.random(n)
    columns = {"key": key, "x": x, "z": z, "y": x * (key % 7) + z + rng.random(n)}
    started = time.perf_counter()
    if kind == "tiny":
        source = mm.groups(pd.DataFrame({"key": key, "y": columns["y"]}), by="key",
                           format="numpy")
        run = mm.train(fit_tiny, source, store=path, progress=False, backend="processes")
    else:
        run = mm.train(fit_ridge, mm.groups(pd.DataFrame(columns), by="key"), store=path,
                       progress=False, backend="processes")
    took = time.perf_counter() - started
    if len(run.failed):
        raise RuntimeError(f"{len(run.failed)} of the {kind} models failed: {run.failed}")
    (path / "built.json").write_text(json.dumps({"groups": groups, "build_s": took}))
    print(f"  built {groups:,} {kind} models in {took:.1f} s: {path}")
    return path


def zipf_keys(groups: int, count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.1, count), groups) - 1
    return np.random.default_rng(99).permutation(groups)[ranks]


class Target:
    """A server to measure: how to start it, and the request for a key."""

    def __init__(self, name: str, command: list[str], path: str, header: bool,
                 env: dict | None = None, ready: float = 120) -> None:
        self.name, self.path, self.header = name, path, header
        self.port = free_port()
        self.process = subprocess.Popen([*command, "--port", str(self.port)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        env={**os.environ, **(env or {})}, cwd=ROOT)
        deadline = time.monotonic() + ready
        while time.monotonic() < deadline:
            try:
                if self.request(0)[0] in (200, 404, 422):
                    return
            except OSError:
                pass
            time.sleep(0.25)
        self.close()
        raise RuntimeError(f"{name} did not start")

    def request(self, key: int, conn: http.client.HTTPConnection | None = None):
        body = json.dumps({"rows": [{"key": int(key), "x": 0.5, "z": 0.25}]})
        headers = {"content-type": "application/json"}
        if self.header:
            headers["serve_multiplexed_model_id"] = str(key)
        own = conn is None
        conn = conn or http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request("POST", self.path, body, headers)
        response = conn.getresponse()
        data = response.read()
        if own:
            conn.close()
        return response.status, data

    def pss(self) -> int:
        """PSS of the server and its children (Ray: its raylet and workers)."""
        try:
            tree = [psutil.Process(self.process.pid)]
            tree += tree[0].children(recursive=True)
        except psutil.NoSuchProcess:
            return 0
        total = 0
        for process in tree:
            try:
                total += process.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        return total

    def _metrics_text(self) -> str | None:
        """The server's /metrics page, or None when it does not answer."""
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            conn.request("GET", "/metrics")
            return conn.getresponse().read().decode()
        except OSError:
            return None

    def metric(self, name: str) -> float | None:
        text = self._metrics_text()
        if text is None:
            return None
        for line in text.splitlines():
            if line.startswith(f"manymodels_serve_{name} "):
                return float(line.split()[1])
        return None

    def histogram(self, name: str) -> tuple[dict[str, float], float] | None:
        """A histogram of /metrics: its cumulative counts by ``le``, and its sum."""
        text = self._metrics_text()
        if text is None:
            return None
        prefix = f"manymodels_serve_{name}"
        buckets, total = {}, None
        for line in text.splitlines():
            if line.startswith(prefix + "_bucket{"):
                le = line.split('le="')[1].split('"')[0]
                buckets[le] = float(line.split()[-1])
            elif line.startswith(prefix + "_sum"):
                total = float(line.split()[-1])
        return (buckets, total) if buckets and total is not None else None

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def request_maker(target: Target, keys: np.ndarray):
    """The i-th request's bytes: one row of the group ``keys[i]``."""
    def make(position: int) -> bytes:
        key = int(keys[position % len(keys)])
        body = b'{"rows": [{"key": %d, "x": 0.5, "z": 0.25}]}' % key
        headers = {"serve_multiplexed_model_id": str(key)} if target.header else {}
        return request_bytes(target.port, target.path, body, headers)
    return make


def load(target: Target, keys: np.ndarray, rate: float | None, seconds: float,
         connections: int) -> dict:
    hits0, misses0 = target.metric("cache_hits_total"), target.metric("cache_misses_total")
    row = run_load(target.port, request_maker(target, keys), rate, seconds, connections)
    hits, misses = target.metric("cache_hits_total"), target.metric("cache_misses_total")
    ratio = None
    if hits is not None and hits0 is not None and (hits - hits0 + misses - misses0):
        ratio = (hits - hits0) / (hits - hits0 + misses - misses0)
    held = target.metric("bytes_held")
    pss = target.pss() / 1e6
    return {**row, "hit_ratio": ratio, "pss_mb": pss,
            "held_mb": None if held is None else held / 1e6,
            "pss_over_held_mb": None if held is None else pss - held / 1e6,
            "load_avg": os.getloadavg()[0]}


def cold(target: Target, groups: int, count: int) -> dict:
    """The first request for each of ``count`` models never asked for, on a
    fresh server: end to end (the client's clock), and the server's own time
    from the cache's miss to the model ready (its /metrics histogram)."""
    rng = np.random.default_rng(5)
    keys = rng.choice(np.arange(1, groups), size=min(count, groups - 1), replace=False)
    before = target.histogram("model_load_seconds")
    times = first_requests(target.port, request_maker(target, keys), len(keys))
    after = target.histogram("model_load_seconds")
    out = {"cold_p50_ms": float(np.percentile(times, 50)),
           "cold_p99_ms": float(np.percentile(times, 99))}
    if before is not None and after is not None:
        counts = {le: after[0][le] - before[0].get(le, 0) for le in after[0]}
        total = after[1] - before[1]
        loads = counts.get("+Inf", 0)
        bound = next((le for le in sorted(counts, key=_bucket_order)
                      if counts[le] >= 0.99 * loads), None)
        out.update({"server_cold_mean_ms": total / max(loads, 1) * 1000,
                    "server_cold_p99_at_most_ms": None if bound in (None, "+Inf")
                    else float(bound) * 1000, "server_cold_loads": loads})
    return out


def _bucket_order(le: str) -> float:
    return float("inf") if le == "+Inf" else float(le)


def cold_path_profile(store_path: Path, groups: int, count: int = 1000) -> dict:
    """The server's cold path in this process, stage by stage, for ``count``
    models never loaded: the catalog's lookup of the key, then the cache's
    load (the template held per pack, the model's byte range of its pack
    read, its SHA-256 checked, unpickled)."""
    from manymodels.serve.cache import ModelCache
    from manymodels.serve.catalog import build_catalog
    from manymodels.serve.state import open_served_store

    store = open_served_store(store_path)
    began = time.perf_counter()
    catalog = build_catalog(store)
    built = time.perf_counter() - began
    cache = ModelCache(count + 1, 1 << 40)
    keys = np.random.default_rng(7).choice(groups, size=min(count, groups), replace=False)
    lookups, loads = [], []
    for key in keys.tolist():
        began = time.perf_counter()
        digest, _ = catalog.find((key,))
        found = time.perf_counter()
        cache.get(store, digest, f"key {key}")
        lookups.append(found - began)
        loads.append(time.perf_counter() - found)
    store.close()
    both = np.array(lookups) + np.array(loads)
    us = lambda values, q: float(np.percentile(values, q) * 1e6)  # noqa: E731
    return {"models": groups, "catalog_build_s": built, "catalog_mb": catalog.keys.nbytes / 1e6,
            "lookup_p50_us": us(lookups, 50), "lookup_p99_us": us(lookups, 99),
            "load_p50_us": us(loads, 50), "load_p99_us": us(loads, 99),
            "cold_p50_us": us(both, 50), "cold_p99_us": us(both, 99)}


def measure(target: Target, groups: int, args, rates) -> list[dict]:
    out = []
    coldness = cold(target, groups, args.cold)
    keys = zipf_keys(groups, 400_000, seed=1)
    load(target, keys, None, 2.0, args.connections)  # warm up: the hot keys, the connections
    for rate in rates:
        row = {"server": target.name, "models": groups,
               **load(target, keys, rate, args.seconds, args.connections), **coldness}
        out.append(row)
        hits = row["hit_ratio"]
        print(f"  {row['server']:<28} {str(row['rate']):>5} req/s: "
              f"{row['throughput']:6.0f} req/s, p50 {row['p50_ms']:.2f} ms, "
              f"p99 {row['p99_ms']:.2f} ms, p99.9 {row['p999_ms']:.2f} ms, "
              f"hits {hits if hits is None else round(hits, 3)}, "
              f"cold p99 {row['cold_p99_ms']:.2f} ms, PSS {row['pss_mb']:.0f} MB, "
              f"client {row['client_us']:.0f} us/req, load {row['load_avg']:.1f}, "
              f"errors {row['errors']}", flush=True)
    return out


def serve_target(name: str, store: Path, args) -> Target:
    return Target(name, [sys.executable, "-m", "manymodels", "serve", str(store), "--poll", "0",
                         "--cache-models", str(args.cache_models)], "/v1/predict", False)


def measured(target: Target, groups: int, args, rates) -> list[dict]:
    try:
        return measure(target, groups, args, rates)
    finally:
        target.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", type=int, default=1_000_000, help="tiny models (0: none)")
    parser.add_argument("--sklearn", type=int, default=10_000, help="Ridge models (0: none)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per rate")
    parser.add_argument("--cache-models", type=int, default=1000,
                        help="manymodels' cache, and Ray Serve's max models per replica")
    parser.add_argument("--cold", type=int, default=500, help="cold loads measured")
    parser.add_argument("--connections", type=int, default=8, help="client connections")
    parser.add_argument("--no-ray", action="store_true")
    parser.add_argument("--no-fastapi", action="store_true")
    args = parser.parse_args()
    rates = [200, 1000, None]
    ladder = [200, 1000, 1500, 2000, None]  # the Ridge servers: throughput at equal p99
    rows: list[dict] = []
    profiles: list[dict] = []
    print(f"stores ({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}):", flush=True)
    tiny = cached_store("tiny", args.tiny) if args.tiny else None
    ridge = cached_store("ridge", args.sklearn) if args.sklearn else None
    for store, groups in ((tiny, args.tiny), (ridge, args.sklearn)):
        if store is not None:
            profiles.append(cold_path_profile(store, groups))
            print(f"  cold path in-process, {groups:,} models: " + ", ".join(
                f"{k} {v:.3g}" for k, v in profiles[-1].items() if k != "models"), flush=True)
    if tiny is not None:
        rows += measured(serve_target("manymodels/tiny", tiny, args), args.tiny, args, rates)
    if ridge is not None:
        rows += measured(serve_target("manymodels/ridge", ridge, args), args.sklearn, args,
                         ladder)
        with tempfile.TemporaryDirectory() as tmp:
            if not args.no_fastapi:
                script = Path(tmp) / "plain.py"
                script.write_text(FASTAPI)
                rows += measured(Target("fastapi-unpickle/ridge", [
                    sys.executable, str(script), str(export_pickles(ridge, STORES)), "x"],
                    "/v1/predict", False), args.sklearn, args, rates)
            if not args.no_ray:
                script = Path(tmp) / "ray_serve.py"
                script.write_text(RAY)
                rows += measured(Target("ray-serve-multiplexed/ridge", [
                    sys.executable, str(script), str(ridge), str(args.cache_models), "x"],
                    "/", True, ready=300), args.sklearn, args, ladder)
    summary = equal_p99(rows)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    result = {"cores": os.cpu_count(), "rows": rows, "cold_path": profiles,
              "equal_p99": summary, "args": vars(args), "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    for name in ("serve.json", f"serve-{time.strftime('%Y%m%d-%H%M%S')}.json"):
        (out / name).write_text(json.dumps(result, indent=2))
    print(pd.DataFrame(rows).drop(columns=["models"]).round(2).to_string(index=False))
    for line in summary:
        print(line)


def equal_p99(rows: list[dict], target_ms: float = 20.0) -> list[str]:
    """Throughput at equal p99: per server, the most it answered (at a rate
    it met, 95% of the asked, or unpaced) within a p99 of ``target_ms``, and
    within the p99 Ray Serve had unpaced (when it ran)."""
    ray = [r for r in rows if r["server"].startswith("ray") and r["rate"] == "max"]
    bars = [target_ms, *(r["p99_ms"] for r in ray[:1])]
    lines = []
    for bar in bars:
        for server in dict.fromkeys(r["server"] for r in rows):
            met = [r["throughput"] for r in rows if r["server"] == server
                   and r["p99_ms"] <= bar
                   and (r["rate"] == "max" or r["throughput"] >= 0.95 * r["rate"])]
            lines.append(f"p99 <= {bar:.1f} ms: {server} {max(met) if met else 0:.0f} req/s")
    return lines


if __name__ == "__main__":
    main()
