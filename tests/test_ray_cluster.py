"""The Ray backend starting Ray itself, and on a two-node Ray cluster on this
machine (two ``ray start`` daemons of one CPU each, on loopback).

Not in tests/test_ray.py: that module keeps one local instance connected for
all its tests, and a process can be connected to one Ray at a time.
"""

from __future__ import annotations

import contextlib
import functools
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
from conftest import wait_for_workers

ray = pytest.importorskip("ray")

pytestmark = [pytest.mark.ray, pytest.mark.slow]

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
    time.sleep(0.2)
    return {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid()}


def meet_on_two_nodes(rendezvous: str, item):
    """Each task waits until a task has started on two nodes: the run must use
    both nodes however slowly the second one's worker starts (seconds on a
    loaded 2-core machine, when the first node's worker could have run all 40
    tasks alone). A run that never uses the second node ends after a minute,
    and fails the test's node count."""
    node = ray.get_runtime_context().get_node_id()
    wait_for_workers(rendezvous, 2, name=node)
    return {"node": node, "pid": os.getpid()}


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


def _uses(pid: int, temp_dir: str) -> bool:
    """Whether a process has a file of ``temp_dir`` open (every Ray process of
    the cluster logs there; most rewrite their command line, ``ray::...``)."""
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(temp_dir):
                    return True
    except OSError:
        pass
    return False


def _cluster_processes(port: int, temp_dir: str) -> list[psutil.Process]:
    marks = (f"127.0.0.1:{port}", f"gcs_server_port={port}", temp_dir)
    found = []
    for proc in psutil.process_iter(["cmdline", "uids"]):
        if proc.pid == os.getpid() or proc.info["uids"] is None:
            continue
        if proc.info["uids"].real != os.getuid():
            continue
        cmdline = " ".join(proc.info.get("cmdline") or ())
        if any(mark in cmdline for mark in marks) or _uses(proc.pid, temp_dir):
            found.append(proc)
    return found


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _kill_cluster(port: int, temp_dir: str) -> None:
    """SIGKILL the processes of this cluster only, by pid (``ray stop`` would
    stop every Ray on the machine); again until none is left."""
    for _ in range(5):
        mine = _cluster_processes(port, temp_dir)
        if not mine:
            return
        for proc in mine:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(mine, timeout=10)


def _ray_start(arguments: list[str], env: dict[str, str]) -> None:
    done = subprocess.run([str(RAY_CLI), "start", *arguments], env=env, capture_output=True,
                          text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(arguments)} failed:\n{done.stdout}\n"
                           f"{done.stderr}")


@pytest.fixture(scope="module")
def cluster():
    """A head node and a worker node of one CPU each; yields the GCS address."""
    if not RAY_CLI.exists():
        pytest.skip(f"no ray command beside {sys.executable}")
    port = _free_port()
    temp_dir = tempfile.mkdtemp(prefix="mmray-")
    # Token authentication must be the same for both nodes and this process
    # (the owner of the tasks, which the workers call back). Recent Ray turns
    # it on by itself in a process that started a local instance (sets
    # RAY_AUTH_MODE=token, the token in ~/.ray/auth_token) and for a head node
    # where that file exists, but not for a node that joins: say it for both.
    mode = os.environ.get("RAY_AUTH_MODE", "disabled")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": mode}
    env.pop("RAY_ADDRESS", None)
    common = ["--num-cpus=1", "--num-gpus=0", "--disable-usage-stats"]
    try:
        _ray_start(["--head", f"--port={port}", "--include-dashboard=false",
                    f"--temp-dir={temp_dir}", *common], env)
        _ray_start([f"--address=127.0.0.1:{port}", *common], env)
        yield f"127.0.0.1:{port}"
    finally:
        if ray.is_initialized():
            ray.shutdown()
        _kill_cluster(port, temp_dir)
        left = [p for p in _cluster_processes(port, temp_dir) if _alive(p)]
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"cluster processes left behind: {left}"


def _wait_for_nodes(address: str, count: int) -> None:
    """Until ``count`` nodes are up with all their CPUs free: the worker node
    may still be registering, an earlier test's workers still be leaving."""
    ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    try:
        deadline = time.monotonic() + 60
        while (len([n for n in ray.nodes() if n["Alive"]]) < count
               or ray.available_resources().get("CPU", 0) < count):
            assert time.monotonic() < deadline, (
                f"cluster not ready: {ray.nodes()} {ray.available_resources()}")
            time.sleep(0.2)
    finally:
        ray.shutdown()


def test_two_node_cluster_through_ray_address(cluster, monkeypatch, tmp_path):
    _wait_for_nodes(cluster, 2)
    monkeypatch.setenv("RAY_ADDRESS", cluster)
    fit = functools.partial(meet_on_two_nodes, str(tmp_path))
    run = mm.train(fit, mm.items(range(40)), backend="ray", progress=False)
    assert run.summary().statuses == {"ok": 40}
    assert run.workers == 2  # the cluster's CPUs, not this machine's cores
    assert run.results["node"].nunique() == 2  # fit ran on both nodes
    assert ray.is_initialized()  # it connected to the cluster, and left it running


def test_two_node_cluster_through_a_backend_instance(cluster, tmp_path):
    _wait_for_nodes(cluster, 2)
    backend = mm.RayBackend(address=cluster)
    fit = functools.partial(meet_on_two_nodes, str(tmp_path))
    run = mm.train(fit, mm.items(range(40)), backend=backend, progress=False)
    assert run.summary().statuses == {"ok": 40}
    assert not backend.started_ray and ray.is_initialized()
    assert backend.workers == 2
    assert len(set(backend.worker_nodes.values())) == 2
    assert run.results["node"].nunique() == 2
    for worker, node, pid in zip(run.results["worker"], run.results["node"],
                                 run.results["pid"]):
        assert backend.worker_nodes[worker] == node
        assert backend.worker_pids[worker] == pid
