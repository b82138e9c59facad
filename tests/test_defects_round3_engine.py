"""Round 3 defects of the engine backends, the workers' reading and backtest
windows (issue 37, items 4, 5 and 9)."""

from __future__ import annotations

import socket
import threading
from typing import Any

import manymodels as mm
from manymodels.backends import _remote_slots
from manymodels.backends._remote_slots import RemoteSlotsBackend, bind_address
from manymodels.backends._remote_worker import serve

# -- item 5: one silent connection must not stall the workers' handshakes --------


class _ThreadEngine(RemoteSlotsBackend):
    """The smallest engine: each launch is a thread running the real worker
    loop (``_remote_worker.serve``) in this process, over a real socket. Before
    any launch it opens a connection to the worker port and says nothing, as a
    port scanner or a stuck peer would."""

    name = "thread-engine"
    engine = "test"

    def _start_engine(self) -> str:
        self.silent: list[socket.socket] = []
        return "127.0.0.1"

    def _ship(self, payload: bytes) -> Any:
        self.silent.append(socket.create_connection(self._server.getsockname()[:2]))
        return payload

    def _launch(self, launch: int, args: tuple) -> Any:
        thread = threading.Thread(target=serve, args=args, daemon=True)
        thread.start()
        return thread

    def _launch_ended(self, handle: Any) -> str | None:
        return None if handle.is_alive() else "ended"


def double(item):
    return item * 2, {"value": item * 2}


def test_a_silent_connection_does_not_stall_the_workers_handshake(monkeypatch):
    monkeypatch.setattr(_remote_slots, "_HANDSHAKE_S", 1.0)
    backend = _ThreadEngine(workers=2)
    runs: list[Any] = []
    trainer = threading.Thread(
        target=lambda: runs.append(mm.train(double, mm.items(list(range(6))), backend=backend,
                                            progress=False)),
        daemon=True)
    trainer.start()
    try:
        trainer.join(60)  # a guard against a hang, not a timing: the peer never speaks
        assert not trainer.is_alive(), "the run stalled behind a connection that said nothing"
        # and the silent peer itself is dropped once its handshake's deadline passes
        silent = backend.silent[0]
        silent.settimeout(60)
        while silent.recv(4096):  # the driver's challenge, then the end of the stream
            pass
    finally:
        for sock in getattr(backend, "silent", []):
            sock.close()
        trainer.join(60)
    run = runs[0]
    assert (run.results["status"] == "ok").all()
    assert sorted(run.results["value"]) == [0, 2, 4, 6, 8, 10]


def test_the_worker_port_binds_to_the_address_the_engine_uses():
    assert bind_address("127.0.0.1") == "127.0.0.1"
    assert bind_address("localhost") == "127.0.0.1"
    # an address of this host: that interface only, not every interface
    here = _an_address_of_this_host()
    if here is not None:
        assert bind_address(here) == here
    # an address no interface here has (behind NAT): every interface, as before
    assert bind_address("192.0.2.254") == ""


def _an_address_of_this_host() -> str | None:
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # no packet is sent: only picks the route
        address = probe.getsockname()[0]
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "192.0.2.254" else address

