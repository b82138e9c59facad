"""How fast ``manymodels serve`` answers, on this machine, load generator included.

Two stores: many tiny models (``DummyRegressor``, packed) and fewer
scikit-learn ``Ridge`` models. Keys are drawn from a Zipf distribution; a
closed-loop client (threads with keep-alive connections, each waiting for its
answer before its next request) sends single-row requests paced at 200 req/s,
at 1,000 req/s, and unpaced (the most the server sustains with the client on
the same cores). Figures: p50/p99/p99.9 latency, throughput, the cache's hit
ratio, cold loads (the first request for a model, on a fresh server), and the
server's PSS. On the Ridge store, in the same run: Ray Serve's multiplexed
deployment (``manymodels.serve.ray``, its cache raised to match) and a plain
FastAPI endpoint that unpickles the model's file for each request.

    python bench/serve_bench.py                  # a few minutes on 2 cores
    python bench/serve_bench.py --tiny 1000000 --sklearn 10000 --seconds 20   # the issue's sizes

Prints a table and writes bench/results/serve.json.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def fit_dummy(df):
    from sklearn.dummy import DummyRegressor

    return DummyRegressor().fit(df[["x"]], df["y"])


def fit_ridge(df):
    from sklearn.linear_model import Ridge

    return Ridge().fit(df[["x", "z"]], df["y"])


def build(path: Path, groups: int, rows_per_group: int, fit) -> None:
    import manymodels as mm

    rng = np.random.default_rng(0)
    n = groups * rows_per_group
    frame = pd.DataFrame({"key": np.repeat(np.arange(groups), rows_per_group),
                          "x": rng.random(n), "z": rng.random(n)})
    frame["y"] = frame.x * (frame.key % 7) + frame.z + rng.random(n)
    started = time.perf_counter()
    mm.train(fit, mm.groups(frame, by="key"), store=path, progress=False)
    print(f"  built {groups:,} models in {time.perf_counter() - started:.1f} s: {path}")


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

    def metric(self, name: str) -> float | None:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            conn.request("GET", "/metrics")
            text = conn.getresponse().read().decode()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith(f"manymodels_serve_{name} "):
                return float(line.split()[1])
        return None

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def load(target: Target, keys: np.ndarray, rate: float | None, seconds: float,
         threads: int = 4) -> dict:
    """Closed loop: ``threads`` clients, each its next request when its
    previous answered and (paced) its turn has come."""
    latencies: list[list[float]] = [[] for _ in range(threads)]
    errors = [0] * threads
    stop = time.perf_counter() + seconds
    interval = None if rate is None else threads / rate

    def client(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
        next_at, position = time.perf_counter() + index * (interval or 0) / threads, index
        while True:
            now = time.perf_counter()
            if now >= stop:
                break
            if interval is not None and next_at > now:
                time.sleep(next_at - now)
            began = time.perf_counter()
            status, _ = target.request(keys[position % len(keys)], conn)
            latencies[index].append(time.perf_counter() - began)
            errors[index] += status != 200
            position += threads
            if interval is not None:
                next_at += interval
        conn.close()

    hits0, misses0 = target.metric("cache_hits_total"), target.metric("cache_misses_total")
    workers = [threading.Thread(target=client, args=(i,)) for i in range(threads)]
    began = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    wall = time.perf_counter() - began
    flat = np.array([x for part in latencies for x in part]) * 1000
    hits, misses = target.metric("cache_hits_total"), target.metric("cache_misses_total")
    ratio = None
    if hits is not None and hits0 is not None and (hits - hits0 + misses - misses0):
        ratio = (hits - hits0) / (hits - hits0 + misses - misses0)
    return {"rate": rate or "max", "requests": len(flat), "errors": int(sum(errors)),
            "throughput": len(flat) / wall, "p50_ms": float(np.percentile(flat, 50)),
            "p99_ms": float(np.percentile(flat, 99)),
            "p999_ms": float(np.percentile(flat, 99.9)), "hit_ratio": ratio,
            "pss_mb": target.pss() / 1e6}


def cold(target: Target, groups: int, count: int) -> dict:
    """The first request for each of ``count`` models never asked for."""
    keys = np.random.default_rng(5).choice(groups, size=min(count, groups), replace=False)
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=60)
    times = []
    for key in keys:
        began = time.perf_counter()
        target.request(key, conn)
        times.append((time.perf_counter() - began) * 1000)
    conn.close()
    return {"cold_p50_ms": float(np.percentile(times, 50)),
            "cold_p99_ms": float(np.percentile(times, 99))}


def measure(target: Target, groups: int, args, rates) -> list[dict]:
    out = []
    coldness = cold(target, groups, args.cold)
    keys = zipf_keys(groups, 200_000, seed=1)
    load(target, keys, None, 2.0)  # warm up: the hot keys, the connections
    for rate in rates:
        row = {"server": target.name, "models": groups, **load(target, keys, rate, args.seconds),
               **coldness}
        out.append(row)
        print(f"  {row['server']:<22} {str(row['rate']):>5} req/s: "
              f"{row['throughput']:7.0f} req/s, p50 {row['p50_ms']:.2f} ms, "
              f"p99 {row['p99_ms']:.2f} ms, p99.9 {row['p999_ms']:.2f} ms, "
              f"hits {row['hit_ratio'] if row['hit_ratio'] is None else round(row['hit_ratio'], 3)}"
              f", cold p99 {row['cold_p99_ms']:.2f} ms, PSS {row['pss_mb']:.0f} MB, "
              f"errors {row['errors']}")
    return out


def export_pickles(store_path: Path, out: Path) -> None:
    """Each model of the store as its own pickle file (the plain endpoint's)."""
    import manymodels as mm

    store = mm.Store(store_path)
    out.mkdir()
    for key, model in store.models().items():
        (out / f"{key}.pkl").write_bytes(pickle.dumps(model))


FASTAPI = """
import pickle, sys
import numpy as np, uvicorn
from fastapi import FastAPI, Request
app = FastAPI()
folder = sys.argv[1]
@app.post("/v1/predict")
async def predict(request: Request):
    rows = (await request.json())["rows"]
    out = []
    for row in rows:
        with open(f"{folder}/{row['key']}.pkl", "rb") as f:
            model = pickle.load(f)  # unverified bytes, every request
        out.append(float(model.predict(np.array([[row["x"], row["z"]]]))[0]))
    return {"predictions": out}
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[-1]), log_level="warning")
"""

RAY = """
import sys, time
import ray
from ray import serve
from manymodels.serve.ray import deployment
ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
serve.start(http_options={"host": "127.0.0.1", "port": int(sys.argv[-1])})
serve.run(deployment(sys.argv[1], max_models_per_replica=int(sys.argv[2]), poll=None,
                     ray_actor_options={"num_cpus": 0}).bind(), route_prefix="/")
while True:
    time.sleep(3600)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", type=int, default=20_000, help="tiny models")
    parser.add_argument("--sklearn", type=int, default=1_000, help="Ridge models")
    parser.add_argument("--seconds", type=float, default=5.0, help="per rate")
    parser.add_argument("--cache-models", type=int, default=1000)
    parser.add_argument("--cold", type=int, default=200, help="cold loads measured")
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    rates = [200, 1000, None]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        tiny, ridge = Path(tmp) / "tiny", Path(tmp) / "ridge"
        print(f"stores ({os.cpu_count()} cores):")
        build(tiny, args.tiny, 4, fit_dummy)
        build(ridge, args.sklearn, 20, fit_ridge)
        serve_cmd = [sys.executable, "-m", "manymodels", "serve", "--poll", "0",
                     "--cache-models", str(args.cache_models)]
        for store, groups in ((tiny, args.tiny), (ridge, args.sklearn)):
            target = Target(f"manymodels/{store.name}", [*serve_cmd, str(store)],
                            "/v1/predict", False)
            try:
                rows += measure(target, groups, args, rates)
            finally:
                target.close()
        files = Path(tmp) / "pickles"
        export_pickles(ridge, files)
        script = Path(tmp) / "plain.py"
        script.write_text(FASTAPI)
        target = Target("fastapi-unpickle/ridge", [sys.executable, str(script), str(files),
                                                   "x"], "/v1/predict", False)
        try:
            rows += measure(target, args.sklearn, args, rates)
        finally:
            target.close()
        if not args.no_ray:
            script = Path(tmp) / "ray_serve.py"
            script.write_text(RAY)
            target = Target("ray-serve-multiplexed/ridge",
                            [sys.executable, str(script), str(ridge), str(args.cache_models),
                             "x"], "/", True, ready=300)
            try:
                rows += measure(target, args.sklearn, args, rates)
            finally:
                target.close()
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "serve.json").write_text(json.dumps({"cores": os.cpu_count(), "rows": rows,
                                                "args": vars(args)}, indent=2))
    print(pd.DataFrame(rows).round(3).to_string(index=False))


if __name__ == "__main__":
    main()
