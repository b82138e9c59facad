"""The Ray backend starting Ray itself, and on a two-node Ray cluster on this
machine (two ``ray start`` daemons of one CPU each, on loopback).

Not in tests/test_ray.py: that module keeps one local instance connected for
all its tests, and a process can be connected to one Ray at a time.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

import manymodels as mm
from manymodels.backends import BACKENDS
from manymodels.backends.ray import RayBackend

ray = pytest.importorskip("ray")
BACKENDS.setdefault("ray", RayBackend)  # harmless once the registry has it

pytestmark = [pytest.mark.slow]

RAY_CLI = Path(sys.executable).with_name("ray")


@pytest.fixture(autouse=True)
def disconnected(monkeypatch):
    """Each test starts with no Ray connected in this process and no RAY_ADDRESS."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    if ray.is_initialized():
        ray.shutdown()
    yield
    if ray.is_initialized():
        ray.shutdown()


def node_id_and_pid(item):
    time.sleep(0.1)
    return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


def _ray_children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_starts_a_local_ray_and_shuts_it_down():
    before = _ray_children()
    run = mm.train(node_id_and_pid, mm.items(range(8)), backend="ray", workers=2,
                   progress=False)
    assert run.summary().statuses == {"ok": 8}
    assert not ray.is_initialized()  # it started Ray, so it shut it down
    _, alive = psutil.wait_procs(
        [psutil.Process(pid) for pid in _ray_children() - before if psutil.pid_exists(pid)],
        timeout=15)
    assert not alive, f"Ray processes left behind: {alive}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _kill_cluster(port: int, temp_dir: str) -> None:
    """SIGKILL the processes of this cluster only, by pid: ``ray stop`` would
    stop every Ray on the machine."""
    marks = (f"127.0.0.1:{port}", f"gcs_server_port={port}", temp_dir)
    mine = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or ())
        if proc.pid != os.getpid() and any(mark in cmdline for mark in marks):
            mine.append(proc)
    for proc in mine:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(mine, timeout=10)


@pytest.fixture(scope="module")
def cluster():
    """A head node and a worker node of one CPU each; yields the GCS address."""
    if not RAY_CLI.exists():
        pytest.skip(f"no ray command beside {sys.executable}")
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="mmray-")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    common = ["--num-cpus=1", "--num-gpus=0", "--node-ip-address=127.0.0.1",
              "--disable-usage-stats"]
    try:
        subprocess.run([str(RAY_CLI), "start", "--head", f"--port={port}",
                        "--include-dashboard=false", f"--temp-dir={temp_dir}", *common],
                       check=True, env=env, capture_output=True, timeout=120)
        subprocess.run([str(RAY_CLI), "start", f"--address=127.0.0.1:{port}", *common],
                       check=True, env=env, capture_output=True, timeout=120)
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _kill_cluster(port, temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_two_node_cluster_runs_tasks_on_both_nodes(cluster, monkeypatch):
    made: list[RayBackend] = []

    class Recording(RayBackend):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setitem(BACKENDS, "ray", Recording)
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    deadline = time.monotonic() + 60  # the worker node may still be registering
    ray.init(address=cluster, log_to_driver=False, logging_level="ERROR")
    while len([n for n in ray.nodes() if n["Alive"]]) < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len([n for n in ray.nodes() if n["Alive"]]) == 2
    ray.shutdown()  # the backend connects by itself, through RAY_ADDRESS

    run = mm.train(node_id_and_pid, mm.items(range(24)), backend="ray", workers=2,
                   progress=False)
    assert run.summary().statuses == {"ok": 24}
    assert run.results["node"].nunique() == 2  # fit ran on both nodes
    backend = made[0]
    assert not backend.started_ray and ray.is_initialized()  # connected, left running
    assert RayBackend(None).workers == 2  # workers=None: the cluster's CPUs
    assert len(set(backend.worker_nodes.values())) == 2
    for worker, node, pid in zip(run.results["worker"], run.results["node"],
                                 run.results["pid"]):
        assert backend.worker_nodes[worker] == node
        assert backend.worker_pids[worker] == pid
