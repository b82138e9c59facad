"""The Ray backend's connection to Ray, in the driver: importing it, joining a
cluster or starting a local instance, sizing the run from the cluster's
resources, and checking that every node runs this manymodels (see :mod:`.ray`
for the design)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from typing import Any

from .base import WorkerStartupError


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "backend='ray' needs Ray: pip install 'manymodels[ray]' (or 'ray')") from exc
    return ray


def cluster_workers(cpus_per_task: int) -> int | None:
    """The connected cluster's CPUs // ``cpus_per_task``; ``None`` when this
    process is not connected to Ray."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    cpus = int(ray.cluster_resources().get("CPU", 0))
    return max(1, cpus // cpus_per_task) if cpus else None


def connect(address: str | None, cpus: int, gpu_sets: list[list[str]] | None,
            init_options: dict[str, Any]) -> bool:
    """Connect to ``address`` (or ``RAY_ADDRESS``), or start a local instance
    of ``cpus`` CPUs and the GPUs of ``gpu_sets``; an instance this process is
    already connected to is used as it is. Returns whether it started Ray."""
    import ray

    if ray.is_initialized():
        _refuse_other_settings(ray, address, init_options)
        return False
    asked = address
    address = address or os.environ.get("RAY_ADDRESS") or None
    options: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING}
    if address is None:
        options.update(num_cpus=cpus, include_dashboard=False)
        if gpu_sets:
            options["num_gpus"] = len({gpu for group in gpu_sets for gpu in group})
    else:
        options["address"] = address
    options.update(init_options)
    # ray.init replaces the SIGTERM handler with sys.exit; the scheduler's
    # (SIGTERM stops the run like Ctrl-C) must stay in force.
    main = threading.current_thread() is threading.main_thread()
    previous = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(**options)
    finally:
        if main and previous is not None:
            signal.signal(signal.SIGTERM, previous)
    _JOINED[:] = [_current_address(ray), asked, dict(init_options)]
    return address is None


#: (Ray's address, ``address=``, ``ray_init_options``) of the connection
#: :func:`connect` made last: a backend of the same settings uses it again.
_JOINED: list[Any] = []


def _current_address(ray: Any) -> str | None:
    try:
        return ray.get_runtime_context().gcs_address
    except Exception:  # (a Ray Client connection has none to tell)
        return None


def _refuse_other_settings(ray: Any, address: str | None, init_options: dict[str, Any]) -> None:
    """Refuse ``address=`` or ``ray_init_options`` that the Ray instance this
    process is already connected to was not made with: they went unheeded,
    and the run ran on that instance (a cluster named by address= trained
    on the laptop's; a runtime_env= that makes fit importable was not
    there, and every worker failed to load the run)."""
    if not address and not init_options:
        return
    current = _current_address(ray)
    if [current, address, dict(init_options)] == _JOINED:
        return  # the connection an earlier run of these settings made
    if not init_options and (address == "auto" or current is None
                             or _same_place(ray, address, current)):
        return
    given = ", ".join([f"address={address!r}"] * bool(address)
                      + [f"{name}=" for name in init_options])
    raise ValueError(
        f"RayBackend({given}): this process is already connected to Ray "
        f"({current or 'a Ray Client connection'}), which backend='ray' uses as it is, "
        "so these settings would be ignored: call ray.shutdown() first, or leave them out "
        "to run on that instance")


def _same_place(ray: Any, address: str, current: str) -> bool:
    """Whether ``address`` names the GCS at ``current`` ("host:port"): the
    same port, on the same host (by name, by IP, or both on this machine)."""
    import socket

    host, _, port = address.rpartition(":")
    here, _, current_port = current.rpartition(":")
    if not host or port != current_port or address.startswith("ray://"):
        return False
    local = {"localhost", "127.0.0.1", socket.gethostname()}
    with contextlib.suppress(Exception):
        local.add(ray.util.get_node_ip_address())

    def resolved(name: str) -> str:
        try:
            return "local" if name in local else socket.gethostbyname(name)
        except OSError:
            return name

    return host == here or resolved(host) == resolved(here)


def started_in_this_process() -> bool:
    """Whether the Ray instance this process is connected to was started by
    it (a bare ``ray.init()``, the user's or ours): one node, no autoscaler,
    so a task that fits no node never runs."""
    try:
        from ray._private import worker

        node = worker._global_node
        return bool(node is not None and node.head
                    and node._ray_params.autoscaling_config is None)
    except Exception:  # (Ray's internals moved: taken as a cluster, warned about)
        return False


def check_resources(resources: dict[str, float], cpus_per_task: int, gpus_per_task: float,
                    *, fatal: bool) -> None:
    """Fail (``fatal``: a local instance started in this process, which will not grow) or warn
    (a cluster, which an autoscaler may grow) when no node can run a task."""
    missing = []
    if resources.get("CPU", 0) < cpus_per_task:
        missing.append(f"{cpus_per_task} CPU(s)")
    if gpus_per_task and resources.get("GPU", 0) < gpus_per_task:
        missing.append(f"{gpus_per_task:g} GPU(s)")
    if not missing:
        return
    message = (f"each task needs {' and '.join(missing)}, but the Ray cluster has "
               f"{resources.get('CPU', 0):g} CPU(s) and {resources.get('GPU', 0):g} GPU(s)")
    if fatal:
        raise WorkerStartupError(message)
    warnings.warn(f"{message}; tasks wait until an autoscaler adds nodes", stacklevel=2)


def check_version(start: tuple) -> None:
    """The worker's messages are read as this version writes them: a node with
    another manymodels must fail clearly, not as a tuple that will not unpack."""
    from ..._version import __version__

    theirs = start[3] if len(start) > 3 else "an older one"
    if theirs != __version__:
        raise WorkerStartupError(
            f"a Ray node ({start[1][:12]}) runs manymodels {theirs}, the driver "
            f"{__version__}: install the same version on every node")


def first_line(exc: BaseException) -> str:
    for line in str(exc).splitlines():
        if line.strip():
            return line.strip()[:300]
    return type(exc).__name__
