"""The driver's worker port: where the Spark and Dask backends' worker loops
connect back to the driver.

It listens on the address the engine's workers reach (:func:`bind_address`),
accepts connections off the driver's main thread, and shakes hands with each
(the HMAC challenge of :mod:`multiprocessing.connection`, then the worker's
greeting) on a thread of its own, under a deadline: a peer that connects and
says nothing (a port scanner, a stuck process) costs its own thread a few
seconds and holds up no worker behind it. Greeted connections wait in
:attr:`WorkerPort.greeted` for the backend (:mod:`._remote_slots`) to admit.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import socket
import struct
import threading
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

#: Seconds a connection has for each step of the handshake.
_HANDSHAKE_S = 10.0
_HELLO_WAIT_S = 30.0


class WorkerPort:
    """A listening socket, its accepting thread, and the connections that
    completed the handshake, each with its greeting, in :attr:`greeted`."""

    def __init__(self, host: str, name: str) -> None:
        self._name = name
        self.authkey = os.urandom(32)
        self.greeted: queue.SimpleQueue = queue.SimpleQueue()
        self.closing = threading.Event()
        self._server = socket.create_server((bind_address(host), 0))
        self._server.settimeout(0.2)
        #: What a worker connects to: the engine's address of the driver, this port.
        self.address = (host, self._server.getsockname()[1])
        threading.Thread(target=self._accept_loop, daemon=True,
                         name=f"manymodels-{name}-accept").start()

    def close(self) -> None:
        """Stop accepting, and close the connections no one admitted."""
        self.closing.set()
        self._server.close()
        while not self.greeted.empty():
            with contextlib.suppress(Exception):
                self.greeted.get_nowait()[0].close()

    def _accept_loop(self) -> None:
        """Accept workers' connections off the main thread, and shake hands
        with each on a thread of its own, under a deadline: a peer that
        connects and says nothing (a port scanner, a stuck process) costs its
        own thread a few seconds, and holds up no worker behind it."""
        while not self.closing.is_set():
            try:
                sock, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._greet, args=(sock,), daemon=True,
                             name=f"manymodels-{self._name}-handshake").start()

    def _greet(self, sock: socket.socket) -> None:
        """The HMAC handshake and the worker's greeting, then hand the
        connection to :meth:`_admit`; a stranger, a worker that died at once or
        a peer silent past the deadline is closed."""
        conn = None
        try:
            sock.setblocking(True)  # Connection reads the descriptor as blocking
            _io_deadline(sock, _HANDSHAKE_S)  # so a blocked read or write gives up
            conn = Connection(sock.detach())
            deliver_challenge(conn, self.authkey)
            answer_challenge(conn, self.authkey)
            if not conn.poll(_HELLO_WAIT_S):
                raise TimeoutError("no greeting")
            hello = pickle.loads(conn.recv_bytes())
            with socket.socket(fileno=os.dup(conn.fileno())) as same:
                _io_deadline(same, 0)  # batches may take long to arrive: no deadline now
            if self.closing.is_set():
                raise ConnectionAbortedError("the run is over")
            self.greeted.put((conn, hello))
        except Exception:
            with contextlib.suppress(Exception):
                (conn or sock).close()


def bind_address(host: str) -> str:
    """Where the worker port listens, given ``host``, the driver's address as
    the engine's workers reach it: loopback for a local engine; else the
    interface that has that address, as Spark binds its own driver port; every
    interface (``""``) only where none here has it (a driver behind NAT) or
    where a host name means loopback here (``127.0.1.1`` in ``/etc/hosts``)
    but, by its name, something else on the workers."""
    if host == "localhost" or host.startswith("127."):
        return "127.0.0.1" if host == "localhost" else host
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return ""
    if address.startswith("127."):
        return ""
    try:
        with socket.create_server((address, 0)):
            return address
    except OSError:
        return ""


def _io_deadline(sock: socket.socket, seconds: float) -> None:
    """A kernel deadline on each blocking read and write of ``sock`` (0:
    none). Not ``settimeout``, which makes the descriptor non-blocking: a
    :class:`~multiprocessing.connection.Connection` reads it as blocking."""
    whole = int(seconds)
    timeval = struct.pack("ll", whole, int((seconds - whole) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
